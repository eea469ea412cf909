//! The shim's life cycle: nothing happens until the program first asks for a CUDA function;
//! then the settings are read, the real driver opened and the budgets set up, once. That state
//! is published with one atomic pointer, so every later call costs a single load to find it.
//!
//! A driver that cannot be opened is not remembered: the next call tries again. A broken
//! configuration is remembered (it is what the environment says), reported once, and makes
//! CUDA initialisation fail: the program never runs unconstrained.

use std::cell::Cell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

use crate::config::{self, Settings};
use crate::driver::{self, Api};
use crate::ffi::CUdevice;
use crate::log::{self, log, Level};
use crate::memory::{DeviceBudget, LiveMap, Refused, MAX_DEVICES};

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
    pub api: Api,
    budgets: [DeviceBudget; MAX_DEVICES],
    pub live: LiveMap,
    pub refusal_log: log::RateLimit,
    /// Pools the program created, with the device each one allocates on.
    pub pools: std::sync::Mutex<Vec<(usize, CUdevice)>>,
}

static STATE: AtomicPtr<State> = AtomicPtr::new(std::ptr::null_mut());
static CONFIG_ERROR_REPORTED: AtomicBool = AtomicBool::new(false);
static DRIVER_ERROR_REPORTED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Set while this thread initialises: lookups the driver's own start-up makes are answered
    /// without the shim instead of recursing into it.
    static INITIALISING: Cell<bool> = const { Cell::new(false) };
}

/// The shim's state, initialising it on first use.
#[inline]
pub fn get() -> Option<&'static State> {
    get_with_hint(std::ptr::null())
}

/// As [`get`]; `hint` is an address inside the driver the program already uses, to open that
/// very library.
#[inline]
pub fn get_with_hint(hint: *const c_void) -> Option<&'static State> {
    let p = STATE.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: once published, the state is never freed or changed.
        return Some(unsafe { &*p });
    }
    init(hint)
}

#[cold]
fn init(hint: *const c_void) -> Option<&'static State> {
    if INITIALISING.with(|f| f.replace(true)) {
        return None;
    }
    let result = build((!hint.is_null()).then_some(hint)).map(publish);
    INITIALISING.with(|f| f.set(false));
    result
}

fn build(hint: Option<*const c_void>) -> Option<Box<State>> {
    let (mode, settings) = match config::load().and_then(supported) {
        Ok(s) => (if s.disable { Mode::Disabled } else { Mode::Active }, s),
        Err(e) => {
            if !CONFIG_ERROR_REPORTED.swap(true, Ordering::Relaxed) {
                log::emit_plain(&e.to_string());
            }
            (Mode::Broken, Settings::default())
        }
    };
    log::configure(settings.log_level, settings.log_file.as_deref());
    let cuda = match driver::open(settings.driver_path.as_deref(), hint, c"libcuda.so.1") {
        Ok(lib) => lib,
        Err(e) => {
            if !DRIVER_ERROR_REPORTED.swap(true, Ordering::Relaxed) {
                log!(Level::Error, "cannot load the CUDA driver: {e}");
            }
            return None;
        }
    };
    crate::intercept::resolve_real(&cuda);
    let api = Api::load(&cuda);
    if let (Mode::Active, Some(target)) = (mode, &settings.report) {
        crate::report::arm(target);
    }
    for warning in &settings.warnings {
        log!(Level::Warn, "{warning}");
    }
    log!(Level::Debug, "driver {} opened; mode {:?}", cuda.path, mode);
    Some(Box::new(State {
        mode,
        settings,
        api,
        budgets: [const { DeviceBudget::new() }; MAX_DEVICES],
        live: LiveMap::new(),
        refusal_log: log::RateLimit::new(),
        pools: std::sync::Mutex::new(Vec::new()),
    }))
}

/// Settings this version cannot honour yet are configuration errors: running without them
/// would silently give the program another view than the one asked for.
fn supported(s: Settings) -> Result<Settings, config::ConfigError> {
    if s.disable {
        return Ok(s);
    }
    let missing = |setting: &str, what: &str| {
        let name = match s.source_of(setting) {
            config::Source::Env(var) => var.clone(),
            other => format!("{setting} ({other})"),
        };
        let value = match setting {
            "visible_devices" => std::env::var(config::ENV_VISIBLE_DEVICES).unwrap_or_default(),
            "virtual_devices" => std::env::var(config::ENV_VIRTUAL_DEVICES).unwrap_or_default(),
            "memory_mode" => s.memory_mode.to_string(),
            _ => s.shared_quota.clone().unwrap_or_default(),
        };
        Err(config::ConfigError::new(name, value, format!("{what} is not available in this version of gpushim; unset it")))
    };
    if s.visible_devices.is_some() {
        return missing("visible_devices", "hiding and reordering devices");
    }
    if !s.virtual_devices.is_empty() {
        return missing("virtual_devices", "splitting devices");
    }
    if s.memory_mode != config::MemoryMode::Passthrough {
        return missing("memory_mode", "this memory mode");
    }
    if s.shared_quota.is_some() {
        return missing("shared_quota", "a shared quota");
    }
    Ok(s)
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

/// The state if it was already initialised (never initialises: for the exit report).
pub fn get_if_ready() -> Option<&'static State> {
    let p = STATE.load(Ordering::Acquire);
    // SAFETY: once published, the state is never freed or changed.
    (!p.is_null()).then(|| unsafe { &*p })
}

impl State {
    /// Figures of every device the program touched, for the report.
    pub fn usage_rows(&self) -> Vec<crate::report::Row> {
        self.budgets
            .iter()
            .enumerate()
            .filter_map(|(ordinal, b)| {
                let limit = b.limit()?;
                Some(crate::report::Row { ordinal, peak_in_use: b.peak(), peak_reserved: b.peak(), refused: b.refused(), limit })
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

    /// The budget of a device ordinal, if it is one the shim accounts for.
    pub fn budget(&self, dev: CUdevice) -> Option<&DeviceBudget> {
        usize::try_from(dev).ok().and_then(|d| self.budgets.get(d))
    }

    /// The effective limit of `dev`: min(configured limit, physical memory), resolved on first
    /// use (fractions need the device's size).
    pub fn limit(&self, dev: CUdevice) -> Option<u64> {
        let budget = self.budget(dev)?;
        if let Some(l) = budget.limit() {
            return Some(l);
        }
        let physical = self.api.physical_total(dev)?;
        let configured = self.settings.limit_for(dev as u32);
        let limit = configured.resolve(physical);
        budget.set_limit(limit);
        log!(Level::Debug, "device {dev}: {physical} bytes, limit {limit} bytes");
        Some(limit)
    }

    /// Reserves `bytes` on `dev`, runs `alloc` (which returns the driver's result and the key
    /// of what it allocated), and records the allocation or rolls the reservation back.
    /// A device the shim cannot account for (no context, ordinal out of range) is passed
    /// through: the driver answers for it.
    pub fn counted(
        &self,
        what: &str,
        dev: Option<CUdevice>,
        bytes: u64,
        kind: crate::memory::Kind,
        alloc: impl FnOnce() -> (crate::ffi::CUresult, u64),
    ) -> crate::ffi::CUresult {
        let Some((dev, budget, limit)) = dev.and_then(|d| Some((d, self.budget(d)?, self.limit(d)?))) else {
            return alloc().0;
        };
        if let Err(refused) = budget.try_reserve(bytes, limit) {
            self.report_refusal(what, dev, bytes, refused);
            return crate::ffi::CUDA_ERROR_OUT_OF_MEMORY;
        }
        let (result, key) = alloc();
        if result == crate::ffi::CUDA_SUCCESS {
            self.live.insert(kind, key, crate::memory::Live { device: dev as usize, bytes });
        } else {
            budget.release(bytes);
        }
        result
    }

    /// Forgets the allocation `key`, runs `free`, and credits its bytes once the driver freed
    /// it (or restores the entry if the driver refused). Unknown keys are passed through.
    pub fn uncounted(
        &self,
        kind: crate::memory::Kind,
        key: u64,
        free: impl FnOnce() -> crate::ffi::CUresult,
    ) -> crate::ffi::CUresult {
        let entry = self.live.remove(kind, key);
        let result = free();
        if let Some(live) = entry {
            if result == crate::ffi::CUDA_SUCCESS {
                self.budgets[live.device].release(live.bytes);
            } else {
                self.live.insert(kind, key, live);
            }
        }
        result
    }

    pub fn report_refusal(&self, what: &str, dev: CUdevice, bytes: u64, r: Refused) {
        if !log::enabled(Level::Warn) {
            return;
        }
        if let Some(suppressed) = self.refusal_log.admit() {
            let more = if suppressed > 0 { format!(" ({suppressed} similar lines suppressed)") } else { String::new() };
            log::emit(
                Level::Warn,
                format_args!(
                    "device {dev}: {what} of {bytes} bytes refused: {} bytes in use, limit {} bytes{more}",
                    r.used, r.limit
                ),
            );
        }
    }

    /// (free, total) as the program may see them on `dev`, from the driver's answer.
    pub fn clamp_mem_info(&self, dev: CUdevice, driver_free: u64, driver_total: u64) -> (u64, u64) {
        match (self.budget(dev), self.limit(dev)) {
            (Some(b), Some(limit)) => (limit.saturating_sub(b.used()).min(driver_free), limit),
            _ => (driver_free, driver_total),
        }
    }
}
