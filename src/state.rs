//! The shim's life cycle: nothing happens until the program first asks for a CUDA or NVML
//! function; then the settings are read, the device view applied and the budgets set up, once.
//! That state is published with one atomic pointer, so every later call costs a single load to
//! find it. The libraries themselves (`libcuda.so.1`, `libnvidia-ml.so.1`) are opened when the
//! first function of each is needed, so `nvidia-smi` never loads the CUDA driver.
//!
//! A library that cannot be opened is not remembered: the next call tries again. A broken
//! configuration is remembered (it is what the environment says), reported once, and makes
//! CUDA initialisation fail: the program never runs unconstrained.


// Where the parts meet: the state's methods that need more than one part (src/state/).
mod accounting;
mod compute;
pub(crate) use accounting::{free_driver_ptr, undo_allocation};
mod graphs;
mod modes;
mod placement;
mod pools;
pub mod report;
mod split;
mod teardown;

use std::cell::Cell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use gpushim_common::once::ForkOnce;


use gpushim_common::config::{self, Settings};
use crate::driver::{self, Api, Lib, NvmlApi};
use crate::driver::ffi::CUdevice;
use crate::platform::log::{self, log, Level};
use crate::accounting::memory::{LiveMap, MAX_DEVICES};
use crate::devices::split::{NvmlPart, Split};
use crate::devices::view::{self, Physical, View};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    /// Limits and views apply.
    Active,
    /// `GPUSHIM_DISABLE`: every call goes straight to the driver.
    Disabled,
    /// A configuration error: CUDA initialisation fails.
    Broken,
}

pub struct State {
    pub mode: Mode,
    pub settings: Settings,
    cuda: ForkOnce<Api>,
    nvml: ForkOnce<NvmlApi>,
    /// NVML's list of physical devices, when it could be read.
    inventory: ForkOnce<Option<Vec<Physical>>>,
    /// The list NVML shows (see [`State::view`]).
    view: ForkOnce<Option<View>>,
    /// What `CUDA_VISIBLE_DEVICES` makes of NVML's devices (see [`State::cuda_ordinals`]).
    cuda_ordinals: ForkOnce<Option<View>>,
    /// The list NVML shows while devices are split (see [`State::nvml_parts`]).
    pub(crate) nvml_parts: ForkOnce<Option<Vec<NvmlPart>>>,
    /// The program's devices while split, built when the driver initialised (`split`).
    pub(crate) split: ForkOnce<Split>,
    /// How many devices the driver must show once initialised, when the shim set the view.
    expected_devices: Option<usize>,
    announced: AtomicBool,
    /// One per device (`MAX_DEVICES`), on the heap: a `State` built by value would be copied
    /// several times on its way into its box (150,000 instructions of `memcpy` at start-up).
    budgets: crate::accounting::memory::Budgets,
    pub live: LiveMap,
    pub refusal_log: log::RateLimit,
    /// Pools the program created, with the device each one allocates on.
    pub pools: gpushim_common::bounded::Bounded<Vec<(usize, CUdevice)>>,
    /// The reserves of the `grow` and `preallocate` memory modes (`modes`).
    pub(crate) reserves: crate::accounting::modes::Reserves,
    /// What CUDA graphs' memory nodes hold (`graphs`).
    pub(crate) graphs: crate::accounting::graphs::Graphs,
    /// Context teardowns under way and the credits waiting for them (`teardown`).
    pub(crate) teardowns: crate::accounting::teardown::Teardowns,
    /// The placement log, while `GPUSHIM_LOG_PLACEMENT` is on (`placement`).
    pub(crate) placement: Option<crate::placement::Placement>,
    /// The `duty` pacers, one per program device, made at the device's first launch.
    pub(crate) pacers: crate::compute::Pacers,
    /// [`State::needs`], once worked out (`NEEDS_KNOWN` set).
    needs_cache: std::sync::atomic::AtomicU8,
    /// The driver shows one device and it is not split: every context, stream and allocation
    /// is device 0's, which is then not asked of the driver (`State::only_device`).
    only_device: AtomicBool,
}

static STATE: AtomicPtr<State> = AtomicPtr::new(std::ptr::null_mut());
static CONFIG_ERROR_REPORTED: AtomicBool = AtomicBool::new(false);
static LIBRARY_ERROR_REPORTED: [AtomicBool; 2] = [AtomicBool::new(false), AtomicBool::new(false)];

thread_local! {
    /// Set while this thread initialises: lookups made meanwhile (by a library's own start-up)
    /// are answered without the shim instead of recursing into it.
    static INITIALISING: Cell<bool> = const { Cell::new(false) };
}

/// The shim's state, initialising it on first use.
#[inline]
pub fn get() -> Option<&'static State> {
    let p = STATE.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: once published, the state is never freed or changed.
        return Some(unsafe { &*p });
    }
    init()
}

/// The state if it was already initialised (never initialises: for the exit report).
pub fn get_if_ready() -> Option<&'static State> {
    let p = STATE.load(Ordering::Acquire);
    // SAFETY: once published, the state is never freed or changed.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// Set while one thread builds the state: the others wait for it (one state, one NVML
/// initialisation, one quota place, one `setenv`).
static BUILDING: AtomicBool = AtomicBool::new(false);

// Which conditional hooks a configuration needs (`State::needs`; the hook table's `split`,
// `pool`, `limit` and `place` marks, `hooks::intercept::HookInfo::wanted`).
/// `split` in the hook table: needed while devices are split (`GPUSHIM_VIRTUAL_DEVICES`).
pub const NEEDS_SPLIT: u8 = 1;
/// `pool` in the hook table: needed in the `grow` and `preallocate` memory modes.
pub const NEEDS_POOL: u8 = 2;
/// `limit` in the hook table: needed while any limit applies (context teardown credits what
/// the driver freed).
pub const NEEDS_LIMIT: u8 = 4;
/// `place` in the hook table: needed while the placement log is on (`GPUSHIM_LOG_PLACEMENT`).
pub const NEEDS_PLACE: u8 = 8;
/// `compute` in the hook table: needed while the `duty` pacer enforces a compute limit.
pub const NEEDS_COMPUTE: u8 = 16;

/// `green` in the hook table: needed in the `green` compute mode (`compute::green`).
pub const NEEDS_GREEN: u8 = 32;

/// `State::needs_cache`: the figure is known.
const NEEDS_KNOWN: u8 = 0x80;

/// How long a thread waits for another one's start-up before it gives up (fail closed: its
/// hooks refuse). Start-up takes milliseconds; this only bounds a pathological wait, e.g. on a
/// loader lock the waiting thread itself holds.
const START_UP_WAIT: std::time::Duration = gpushim_common::bounded::WAIT_BOUND;

/// Whether this thread is building the state (its lookups are the start-up's own).
pub fn initialising_here() -> bool {
    INITIALISING.try_with(Cell::get).unwrap_or(false)
}

#[cold]
fn init() -> Option<&'static State> {
    if initialising_here() {
        // a library's own start-up (NVML's, the driver's) looking functions up: not the program's
        return None;
    }
    // (the fork handlers first: they make forks wait for the panic hook's registration)
    crate::platform::fork::register(hold_for_fork, in_forked_child);
    quiet_panics();
    if BUILDING.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire).is_err() {
        return wait_for_start_up();
    }
    if let Some(state) = get_if_ready() {
        return Some(state); // published between our first look and the claim
    }
    /// Clears this thread's flag however `build` ends.
    struct Done;
    impl Drop for Done {
        fn drop(&mut self) {
            let _ = INITIALISING.try_with(|f| f.set(false));
        }
    }
    let _done = Done;
    let _ = INITIALISING.try_with(|f| f.set(true));
    // Any failure inside start-up (a bug) publishes a broken state: CUDA initialisation fails
    // with a message, and the program never runs without its limits.
    let state = std::panic::catch_unwind(build).unwrap_or_else(|_| {
        let mut state = boxed_empty();
        state.fail_internal("an internal error stopped gpushim's start-up");
        state
    });
    Some(publish(state))
}

/// A panic inside the shim (a bug; every entry point catches it) prints one `error` line, not
/// Rust's default message and backtrace into the program's stderr. The hook is the shim's own:
/// the library has its own copy of the standard library.
fn quiet_panics() {
    static ONCE: ForkOnce<()> = ForkOnce::new();
    // (the standard library's lock of the hook, left held in a child forked in the middle)
    ONCE.call_once(|| gpushim_common::unforked::unforked(|| {
        std::panic::set_hook(Box::new(|info| {
            let place = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
            log::emit_plain(&format!("gpushim: error: internal error{place} (a bug; please report it)"));
        }))
    }));
}

/// The prepare handler of `fork`: takes every lock of the state, in nesting order.
pub fn hold_for_fork() {
    let Some(st) = get_if_ready() else { return };
    st.reserves.hold_for_fork();
    // (taken under a reserve's lock when a stale chunk is credited: after the reserves)
    st.teardowns.hold_for_fork();
    st.live.hold_for_fork();
    if let Some(p) = &st.placement {
        p.hold_for_fork();
    }
    crate::platform::fork::hold(&st.pools);
    st.graphs.hold_for_fork();
    crate::accounting::vmm::hold_for_fork();
    if let Some(split) = st.split.get() {
        split.hold_for_fork();
    }
}

/// In a forked child (`fork`): a start-up another parent thread had under way will never end
/// here, so it is started afresh; a built state is emptied of what the parent held.
/// What a forked child does after the fork handlers let the locks go (`platform::fork`): it
/// writes no exit report, and empties the state it inherited.
fn in_forked_child() {
    crate::state::report::disarm();
    after_fork_in_child();
}

pub fn after_fork_in_child() {
    match get_if_ready() {
        None => BUILDING.store(false, Ordering::Release),
        Some(state) => state.reset_after_fork(),
    }
}

/// Another thread builds the state: wait for it, a bounded time.
#[cold]
fn wait_for_start_up() -> Option<&'static State> {
    let start = std::time::Instant::now();
    let mut spins = 0u32;
    loop {
        if let Some(state) = get_if_ready() {
            return Some(state);
        }
        if start.elapsed() > START_UP_WAIT {
            return None;
        }
        spins += 1;
        if spins < 100 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }
}

/// An empty state on the heap, built in a frame of its own: not under start-up's deeper calls,
/// which may run on a small stack (README: stack use).
#[inline(never)]
fn boxed_empty() -> Box<State> {
    Box::new(State::empty())
}

fn build() -> Box<State> {
    // (again: a library's constructor may reach CUDA before the shim's own ran)
    gpushim_common::secure::scrub_environment();
    let mut state = boxed_empty();
    match config::load() {
        Ok(s) => {
            state.mode = if s.disable { Mode::Disabled } else { Mode::Active };
            state.settings = s;
        }
        Err(e) => state.fail(e),
    }
    log::configure(state.settings.log_level, state.settings.log_file.as_deref());
    // What the driver must read: a split's load-time rewrite put back; disabled by the config
    // file (which the load-time rewrite does not read), a pending rewrite undone.
    view::apply_changes(&view::first_use_changes(view::env_lossy, state.mode == Mode::Disabled));
    if state.mode == Mode::Active {
        if let Err(e) = state.apply_view().and_then(|_| crate::sharing::join_quota(&state.settings)) {
            state.fail(e);
        }
    }
    if state.mode == Mode::Active && state.settings.log_placement {
        state.placement = Some(crate::placement::Placement::new());
        // (read now, at start-up, so that no launch or allocation ever initialises NVML)
        let _ = state.inventory();
    }
    if state.mode == Mode::Active && (state.settings.report.is_some() || state.placement.is_some()) {
        crate::state::report::arm(state.settings.report.as_ref());
    }
    for warning in &state.settings.warnings {
        log!(Level::Warn, "{warning}");
    }
    log!(Level::Debug, "initialised; mode {:?}", state.mode);
    state
}

/// Prints a configuration error, once per process (the first one found).
pub(crate) fn report_config_error(message: &str) {
    if !CONFIG_ERROR_REPORTED.swap(true, Ordering::Relaxed) {
        log::emit_plain(message);
    }
}

fn publish(state: Box<State>) -> &'static State {
    let fresh = Box::into_raw(state);
    match STATE.compare_exchange(std::ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
        // SAFETY: just published; never freed.
        Ok(_) => unsafe { &*fresh },
        Err(winner) => {
            // Another thread finished first: keep its state, drop ours (nothing of ours was
            // handed out yet).
            // SAFETY: `fresh` came from Box::into_raw above and was never shared.
            drop(unsafe { Box::from_raw(fresh) });
            // SAFETY: published states are never freed.
            unsafe { &*winner }
        }
    }
}

impl State {
    #[inline(never)] // a start-up step scripts/bench.sh counts by name
    fn empty() -> State {
        State {
            mode: Mode::Active,
            settings: Settings::default(),
            cuda: ForkOnce::new(),
            nvml: ForkOnce::new(),
            inventory: ForkOnce::new(),
            view: ForkOnce::new(),
            cuda_ordinals: ForkOnce::new(),
            nvml_parts: ForkOnce::new(),
            split: ForkOnce::new(),
            expected_devices: None,
            announced: AtomicBool::new(false),
            budgets: crate::accounting::memory::Budgets::new(MAX_DEVICES),
            live: LiveMap::new(),
            refusal_log: log::RateLimit::new(),
            pools: gpushim_common::bounded::Bounded::new("gpushim's list of memory pools", Vec::new()),
            reserves: crate::accounting::modes::Reserves::new(),
            graphs: crate::accounting::graphs::Graphs::new(),
            teardowns: crate::accounting::teardown::Teardowns::new(),
            placement: None,
            pacers: crate::compute::Pacers::new(),
            needs_cache: std::sync::atomic::AtomicU8::new(0),
            only_device: AtomicBool::new(false),
        }
    }

    /// A state with default settings and no library, for unit tests.
    #[cfg(test)]
    pub fn for_tests() -> State {
        State::empty()
    }

    /// Whether devices are split (`GPUSHIM_VIRTUAL_DEVICES`): the device-translating hooks are
    /// handed out only then.
    #[inline]
    pub fn split_configured(&self) -> bool {
        self.mode == Mode::Active && !self.settings.virtual_devices.is_empty()
    }

    /// Whether device 0 is the only device there is (known after `cuInit`): the device of the
    /// current context, of any stream and of any pool, without asking the driver. (Were it
    /// wrong, it would count an allocation against device 0: never leave one uncounted.)
    #[inline]
    pub fn only_device(&self) -> bool {
        self.only_device.load(Ordering::Relaxed)
    }

    /// Which conditional hooks the configuration needs (`intercept::NEEDS_*`): worked out at
    /// the first call (`cuGetProcAddress` asks for every function it is asked for) and kept,
    /// the configuration of a published state never changing.
    #[inline]
    pub fn needs(&self) -> u8 {
        let cached = self.needs_cache.load(Ordering::Relaxed);
        if cached & NEEDS_KNOWN != 0 {
            return cached & !NEEDS_KNOWN;
        }
        let needs = self.work_out_needs();
        self.needs_cache.store(needs | NEEDS_KNOWN, Ordering::Relaxed);
        needs
    }

    fn work_out_needs(&self) -> u8 {
        let split = if self.split_configured() { NEEDS_SPLIT } else { 0 };
        let limit = if self.limits_apply() { NEEDS_LIMIT } else { 0 };
        let place = if self.placement.is_some() { NEEDS_PLACE } else { 0 };
        let compute = if self.compute_paced() { NEEDS_COMPUTE } else { 0 };
        let green = if self.mode == Mode::Active && crate::compute::mode::resolve(&self.settings) == crate::compute::mode::Mode::Green { NEEDS_GREEN } else { 0 };
        split | limit | place | compute | green | if self.pooled() { NEEDS_POOL } else { 0 }
    }

    /// A forked child holds nothing as far as the shim knows (`fork`).
    fn reset_after_fork(&self) {
        crate::accounting::memory::reset_gate_after_fork();
        for b in self.budgets.iter() {
            b.reset_after_fork();
        }
        crate::sharing::after_fork_in_child();
        self.live.reset_after_fork();
        self.reserves.reset_after_fork();
        self.graphs.reset_after_fork();
        self.teardowns.reset_after_fork();
        if let Some(p) = &self.placement {
            p.reset_after_fork();
        }
        self.pools.reset_after_fork(Vec::new());
        crate::accounting::vmm::reset_after_fork();
        crate::compute::green::reset_after_fork();
        if let Some(split) = self.split.get() {
            split.reset_after_fork();
        }
        self.pacers.reset_after_fork();
    }

    /// Records an internal failure: reported once, and CUDA initialisation will fail.
    fn fail_internal(&mut self, what: &str) {
        report_config_error(&format!(
            "gpushim: {what} (a bug; please report it); CUDA initialisation fails, so that the program never runs without its limits"
        ));
        self.mode = Mode::Broken;
    }

    /// Records a configuration error: reported once, and CUDA initialisation will fail.
    fn fail(&mut self, e: config::ConfigError) {
        report_config_error(&e.to_string());
        self.mode = Mode::Broken;
    }

    /// Applies `GPUSHIM_VISIBLE_DEVICES` (see `view`): resolves the selectors against NVML's
    /// inventory and what `CUDA_VISIBLE_DEVICES` already shows, then sets `CUDA_VISIBLE_DEVICES`
    /// to the UUIDs of the view, before the driver initialises.
    #[inline(never)] // a start-up step scripts/bench.sh counts by name
    fn apply_view(&mut self) -> Result<(), config::ConfigError> {
        let Some(selectors) = self.settings.visible_devices.clone() else { return Ok(()) };
        // A load-time rewrite (view::load_time_changes) kept the original CUDA_VISIBLE_DEVICES,
        // which the selectors compose with, and the view as indices into what they select.
        let pending = view::pending(view::env_lossy);
        let cvd = match &pending {
            Some((original, _)) => original.clone(),
            None => view::env_lossy(view::CUDA_VISIBLE_DEVICES),
        };
        let parent = if pending.is_some() { None } else { view::env_lossy(view::APPLIED_MARKER) };
        let entries: Vec<String> = match (&parent, &cvd) {
            (Some(p), Some(c)) if p == c => {
                log!(Level::Debug, "device view already applied by a parent process: CUDA_VISIBLE_DEVICES={c}");
                self.expected_devices = Some(view::narrow(p, c).len());
                return Ok(());
            }
            (Some(p), Some(c)) => view::narrow(p, c),
            _ => {
                let error = |reason: String| {
                    let written = || selectors.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(",");
                    let (setting, value) = match self.settings.source_of("visible_devices") {
                        config::Source::Env(var) => (var.clone(), gpushim_common::unforked::var(var).unwrap_or_else(|_| written())),
                        other => (format!("visible_devices ({other})"), written()),
                    };
                    config::ConfigError::new(setting, value, reason)
                };
                match self.inventory() {
                    Some(inventory) => {
                        view::select(&selectors, cvd.as_deref(), inventory).map_err(error)?.uuids(inventory)
                    }
                    None => view::select_without_inventory(&selectors, cvd.as_deref()).map_err(error)?,
                }
            }
        };
        let entries = match &pending {
            Some((_, Some(pick))) => view::narrow(&entries.join(","), pick),
            _ => entries,
        };
        if pending.is_some() {
            view::apply_changes(&[(view::PENDING_MARKER, None), (view::ORIGINAL_CVD, None)]);
        }
        let value = entries.join(",");
        log!(Level::Debug, "CUDA_VISIBLE_DEVICES={value} (was {cvd:?})");
        gpushim_common::unforked::set_var(view::CUDA_VISIBLE_DEVICES, &value);
        gpushim_common::unforked::set_var(view::APPLIED_MARKER, &value);
        self.expected_devices = Some(entries.len());
        Ok(())
    }

    /// NVML's inventory if it was already read (never reads it).
    pub fn inventory_if_read(&self) -> Option<&Vec<Physical>> {
        self.inventory.get()?.as_ref()
    }

    /// NVML's inventory of physical devices (read once). A missing NVML is not logged here:
    /// without it the view is applied by position, and what needs NVML says so itself.
    pub fn inventory(&self) -> Option<&Vec<Physical>> {
        self.inventory
            .get_or_init(|| {
                if self.nvml.get().is_none() {
                    self.load(Lib::Nvml, None, false);
                }
                let nvml = self.nvml.get()?;
                nvml.inventory()
                    .map_err(|e| {
                        let level = if e == NvmlApi::NO_DRIVER { Level::Debug } else { Level::Warn };
                        log!(level, "cannot list the devices through NVML: {e}")
                    })
                    .ok()
            })
            .as_ref()
    }

    /// The list NVML shows: the view the shim applied (its `CUDA_VISIBLE_DEVICES`, also when a
    /// parent applied it). `None`: NVML's own list, as without the shim — a plain
    /// `CUDA_VISIBLE_DEVICES` is not applied to NVML, because programs that use both (PyTorch's
    /// NVML-based device count) apply it to NVML themselves.
    pub fn view(&self) -> Option<&View> {
        self.view
            .get_or_init(|| {
                let cvd = view::env_lossy(view::CUDA_VISIBLE_DEVICES)?;
                if view::env_lossy(view::APPLIED_MARKER).as_ref() != Some(&cvd) {
                    return None;
                }
                Some(view::driver_view(Some(&cvd), self.inventory()?))
            })
            .as_ref()
    }

    /// The CUDA ordinals of NVML's devices (inventory index → CUDA ordinal), for the limits
    /// NVML reports: under any `CUDA_VISIBLE_DEVICES`, a GPU's limit is that of its CUDA ordinal.
    pub fn cuda_ordinals(&self) -> Option<&View> {
        self.cuda_ordinals
            .get_or_init(|| {
                let cvd = view::env_lossy(view::CUDA_VISIBLE_DEVICES);
                Some(view::driver_view(cvd.as_deref(), self.inventory()?))
            })
            .as_ref()
    }

    /// The driver functions the shim calls itself (none until the driver is opened).
    pub fn api(&self) -> &Api {
        static NONE: Api = Api::NONE;
        self.cuda.get().unwrap_or(&NONE)
    }

    /// Whether `lib` has been opened.
    pub fn opened(&self, lib: Lib) -> bool {
        match lib {
            Lib::Cuda => self.cuda.get().is_some(),
            Lib::Nvml => self.nvml.get().is_some(),
        }
    }

    pub fn nvml_api(&self) -> Option<&NvmlApi> {
        if self.nvml.get().is_none() {
            self.load(Lib::Nvml, None, true);
        }
        self.nvml.get()
    }

    /// Opens `lib` (if not yet open) and fills its hooks' driver pointers. `hint`: an address
    /// inside the copy the program uses. A failure is logged once (if `report`) and not
    /// remembered.
    #[inline(never)] // a start-up step scripts/bench.sh counts by name
    pub fn load(&self, lib: Lib, hint: Option<*const c_void>, report: bool) {
        let opened = match lib {
            Lib::Cuda => self.cuda.get().is_some(),
            Lib::Nvml => self.nvml.get().is_some(),
        };
        if opened {
            return;
        }
        let explicit = match lib {
            Lib::Cuda => self.settings.driver_path.as_deref(),
            Lib::Nvml => self.settings.nvml_path.as_deref(),
        };
        match driver::open(lib, explicit, hint) {
            Ok(library) => {
                crate::driver::table::resolve(&library, lib);
                log!(Level::Debug, "{} opened", library.path);
                match lib {
                    Lib::Cuda => drop(self.cuda.set(Api::load(&library, &crate::driver::table::resolved))),
                    Lib::Nvml => drop(self.nvml.set(NvmlApi::load(&library, &crate::driver::table::resolved))),
                }
            }
            Err(e) => {
                if report && !LIBRARY_ERROR_REPORTED[lib as usize].swap(true, Ordering::Relaxed) {
                    let what = if lib == Lib::Cuda { "the CUDA driver" } else { "NVML" };
                    // A machine without the driver (a CPU node with gpushim in
                    // /etc/ld.so.preload) is no error: the program finds no device. A path the
                    // user named that cannot be opened is.
                    let level = if explicit.is_some() { Level::Error } else { Level::Debug };
                    log!(level, "cannot load {what}: {e}");
                }
            }
        }
    }

    /// After the driver initialised: checks that it shows the view the shim asked for, and
    /// says at `info` level which devices the program sees. An error means the view could not
    /// be applied (the driver read `CUDA_VISIBLE_DEVICES` before the shim set it).
    #[inline(never)] // a start-up step scripts/bench.sh counts by name
    pub fn after_cuda_init(&'static self) -> Result<(), String> {
        if let Err(message) = self.build_split() {
            report_config_error(&message);
            return Err(String::new());
        }
        let devices = self.api().devices();
        if let Some(expected) = self.expected_devices {
            let shown: Vec<String> = devices.iter().map(|(_, u)| driver::uuid_string(u)).collect();
            let wanted = gpushim_common::unforked::var(view::APPLIED_MARKER).unwrap_or_default();
            let same_uuids = match self.view() {
                Some(view) => self.inventory().is_some_and(|inv| view.devices.iter().map(|&p| &inv[p].uuid).eq(shown.iter())),
                None => true,
            };
            if shown.len() != expected || !same_uuids {
                return Err(format!(
                    "the driver shows {shown:?}, not the devices gpushim selected (CUDA_VISIBLE_DEVICES={wanted}): \
                     CUDA_VISIBLE_DEVICES was changed after gpushim applied GPUSHIM_VISIBLE_DEVICES, or CUDA was \
                     initialised before gpushim was loaded"
                ));
            }
        }
        if self.mode == Mode::Active {
            self.start_publishing(&devices);
        }
        if devices.len() == 1 && self.split.get().is_none() {
            self.only_device.store(true, Ordering::Relaxed);
            // The allocation pair's fast lane (`lane`), for what it covers: one device, counted
            // as the driver gives it, nothing else to do per allocation. (Not with a shared
            // quota, joined before this or never: its reservations take a lock shared between
            // processes and may have to join it again, on the general path.)
            if self.mode == Mode::Active && !self.pooled() && self.placement.is_none() && crate::sharing::quota().is_none() {
                if let Some(budget) = self.budget(0) {
                    let real = |name: &std::ffi::CStr| crate::driver::table::resolved(name).map_or(0, |p| p as usize);
                    if crate::accounting::lane::open(self, budget, &self.live, real(c"cuMemAlloc_v2"), real(c"cuMemFree_v2")) {
                        log!(Level::Debug, "cuMemAlloc_v2 and cuMemFree_v2 take the fast lane (one device, counted as the driver gives it)");
                    }
                }
            }
        }
        if !self.announced.swap(true, Ordering::Relaxed) && log::enabled(Level::Info) {
            let count = self.program_devices().map_or(devices.len(), |d| d.list.len());
            for i in 0..count {
                let Some((name, uuid)) = self.driver_of(i as CUdevice).and_then(|d| devices.get(d as usize)) else { continue };
                let uuid = self.part_uuid(i as CUdevice).unwrap_or(*uuid);
                let limit = self.limit(i as CUdevice).map_or("unknown".into(), |l| format!("{l} bytes"));
                log!(Level::Info, "device {i}: {name} ({}), limit {limit}", driver::uuid_string(&uuid));
            }
            for (setting, source) in &self.settings.sources {
                log!(Level::Info, "{setting}: from {source}");
            }
        }
        Ok(())
    }

    /// Publishes the program's view and, from now on, every budget's figures (`live`): the
    /// budgets' figures move into the published file (`memory::publish_budgets`; they stay the
    /// budgets' own where nothing is published). Once; a thread that comes meanwhile (its own
    /// `cuInit`) waits until every budget's figures have moved.
    #[inline(never)] // a start-up step scripts/bench.sh counts by name
    fn start_publishing(&'static self, devices: &[(String, [u8; 16])]) {
        // (fork-aware: a child forked in the middle of the move runs it again, on its own
        // budgets, which its fork handler pointed back at their own figures)
        static ONCE: ForkOnce<()> = ForkOnce::new();
        ONCE.call_once(|| {
            let publisher = self.publish_now(devices);
            if let Some(p) = publisher {
                self.publish_compute(p, devices.len());
            }
            // (the program's devices only: the others' budgets, if ever used, keep the gate)
            let count = self.program_devices().map_or(devices.len(), |d| d.list.len()).min(self.budgets.len());
            let budgets: &'static [crate::accounting::memory::DeviceBudget] = &self.budgets;
            crate::accounting::memory::publish_budgets(&budgets[..count], |i| publisher.and_then(|p| p.device(i)).map(|d| &d.figures));
        });
    }

    fn publish_now(&self, devices: &[(String, [u8; 16])]) -> Option<&'static gpushim_common::live::Publisher> {
        let count = self.program_devices().map_or(devices.len(), |d| d.list.len());
        let view: Vec<gpushim_common::live::ViewEntry> = (0..count)
            .map(|i| {
                let uuid = self.driver_of(i as CUdevice).and_then(|d| devices.get(d as usize)).map(|(_, u)| driver::uuid_string(u)).unwrap_or_default();
                let part = self.program_devices().and_then(|d| d.get(i as CUdevice)).and_then(|d| d.part).map(|p| {
                    let derived = self.part_uuid(i as CUdevice).map(|u| driver::uuid_string(&u)).unwrap_or_default();
                    (p.index + 1, p.count, derived)
                });
                gpushim_common::live::ViewEntry { uuid, part }
            })
            .collect();
        crate::sharing::publish(&self.settings, &view)
    }

    /// Figures of every device the program touched, for the report.
    pub fn usage_rows(&self) -> Vec<crate::state::report::Row> {
        self.budgets
            .iter()
            .enumerate()
            .filter_map(|(ordinal, b)| {
                let limit = b.limit()?;
                let quota = b.shared().map(|(q, d)| (q.name.clone(), q.peak(d)));
                let waits = self.settings.oom_wait.is_some_and(|w| !w.is_zero()).then(|| b.waits());
                Some(crate::state::report::Row { ordinal, peak_in_use: b.peak_in_use(), peak_reserved: b.peak_reserved(), refused: b.refused(), limit, quota, waits })
            })
            .collect()
    }

    #[inline]
    pub fn passthrough(&self) -> bool {
        self.mode == Mode::Disabled
    }

    #[inline]
    pub fn broken(&self) -> bool {
        self.mode == Mode::Broken
    }

}
