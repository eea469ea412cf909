//! The state's side of the budgets: counting each allocation against its device's limit, crediting what the driver freed, and what the program reads of its memory.

use gpushim_common::bounded::Stuck;
use crate::accounting::memory::Kind;
use crate::driver::ffi::{CUdeviceptr, CUresult, CUDA_ERROR_NOT_PERMITTED, CUDA_ERROR_OUT_OF_MEMORY};
use crate::driver::{self};
use crate::driver::ffi::CUdevice;
use crate::platform::log::{self, log, Level};
use crate::accounting::memory::{DeviceBudget, MAX_DEVICES};

use crate::state::{Mode, State};

impl State {
    /// The budget of a device ordinal, if it is one the shim accounts for.
    #[inline]
    pub fn budget(&self, dev: CUdevice) -> Option<&DeviceBudget> {
        usize::try_from(dev).ok().and_then(|d| self.budgets.get(d))
    }

    /// The budget of an ordinal already checked (a live entry's device).
    pub(crate) fn budgets_of(&self, dev: usize) -> &DeviceBudget {
        &self.budgets[dev.min(MAX_DEVICES - 1)]
    }

    /// The effective limit of `dev`: min(configured limit, physical memory), resolved on first
    /// use (fractions need the device's size).
    #[inline]
    pub fn limit(&self, dev: CUdevice) -> Option<u64> {
        match self.budget(dev)?.limit() {
            Some(l) => Some(l),
            None => self.resolve_limit(dev),
        }
    }

    /// [`State::limit`] the first time: works it out, joins the shared quota and the registry.
    #[cold]
    #[inline(never)]
    fn resolve_limit(&self, dev: CUdevice) -> Option<u64> {
        let budget = self.budget(dev)?;
        if let Some(l) = budget.limit() {
            return Some(l);
        }
        let part = self.program_devices().and_then(|d| d.get(dev)).and_then(|d| d.part);
        let physical = match part {
            Some(p) => p.size,
            None => self.api().physical_total(self.driver_of(dev)?)?,
        };
        // (a HAMi-core region file's stored limit wins over HAMi's variables, as in HAMi-core)
        let configured = crate::sharing::hami::stored_limit(&self.settings, dev as u32).unwrap_or_else(|| self.settings.limit_for(dev as u32));
        let limit = configured.resolve(physical);
        let limited = !matches!(configured, gpushim_common::units::Limit::Unlimited);
        if crate::sharing::quota().is_some() || limited {
            // a quota's device, and the registry's, is keyed by its UUID (the part's, when split)
            let uuid = self.part_uuid(dev).or_else(|| self.api().device_uuid(self.driver_of(dev)?));
            let uuid = uuid.map(|u| driver::uuid_string(&u));
            match crate::sharing::attach_device(&self.settings, dev, uuid.as_deref(), physical, limit, limited) {
                Ok(Some((q, index))) => budget.share(q, index),
                Ok(None) => {}
                Err(e) => {
                    let name = crate::sharing::quota().map_or("", |q| q.name.as_str());
                    log!(Level::Error, "device {dev}: cannot take part in shared quota {name}: {e}; its allocations are refused");
                    budget.set_limit(0);
                    return Some(0);
                }
            }
        }
        budget.set_limit(limit);
        log!(Level::Debug, "device {dev}: {physical} bytes, limit {limit} bytes");
        Some(limit)
    }

    /// Reserves `bytes` on `dev`, runs `alloc` (which returns the driver's result and the key
    /// of what it allocated), and records the allocation or rolls the reservation back.
    ///
    /// While any limit is set, nothing passes uncounted: a device the caller could not tell
    /// (`None`: no stream context, a driver that lacks a function or refused a query) is the
    /// current context's; if even that is unknown, or the device is one the shim cannot account
    /// for (beyond [`MAX_DEVICES`], or its size unknown), the request is refused. Without any
    /// limit such a request goes to the driver, which answers for it.
    pub fn counted(
        &self,
        what: &'static str,
        dev: Option<CUdevice>,
        bytes: u64,
        kind: crate::accounting::memory::Kind,
        stream: Option<crate::driver::ffi::CUstream>,
        alloc: impl FnOnce() -> (crate::driver::ffi::CUresult, u64),
    ) -> crate::driver::ffi::CUresult {
        let dev = dev.or_else(|| self.current_device());
        let Some((dev, budget, limit)) = dev.and_then(|d| Some((d, self.budget(d)?, self.limit(d)?))) else {
            if !self.limits_apply() {
                let result = alloc().0;
                if result == crate::driver::ffi::CUDA_SUCCESS {
                    self.place_allocation(what, dev, bytes, stream);
                }
                return result;
            }
            return self.refuse_unaccountable(what, dev, bytes);
        };
        if budget.try_reserve(bytes, limit).is_err() {
            // What pools keep after frees counts until they give it back: make them give back
            // what they do not use, then try once more.
            // Then, with GPUSHIM_OOM_WAIT, wait for room in a full shared quota.
            if (budget.pool_kept() == 0 || !self.trim_pools(dev) || budget.try_reserve(bytes, limit).is_err()) && !self.wait_for_room(what, dev, bytes, limit) {
                self.report_refusal(what, dev, bytes);
                return crate::driver::ffi::CUDA_ERROR_OUT_OF_MEMORY;
            }
        }
        let (result, key) = alloc();
        if result == crate::driver::ffi::CUDA_SUCCESS {
            budget.take(bytes);
            // arrays remember their context: the driver destroys them with it (`teardown`)
            let ctx = match kind {
                crate::accounting::memory::Kind::Array | crate::accounting::memory::Kind::MipmappedArray => self.current_context_handle(),
                _ => 0,
            };
            // (stream-ordered allocations come from a pool, which may keep them after the free)
            let pool = stream.is_some();
            let id = crate::accounting::memory::entry_id();
            if let Err(stuck) = self.record(kind, key, crate::accounting::memory::Live { device: dev as usize, bytes, served: false, pool, ctx, id }) {
                return self.unrecorded(what, kind, key, budget, bytes, pool, stuck);
            }
            self.place_allocation(what, Some(dev), bytes, stream);
        } else {
            budget.release(bytes);
        }
        result
    }

    /// Records a counted allocation in the live map, crediting an entry it replaces (one the
    /// driver freed behind the shim's back). `Err`: not recorded (`bounded`).
    #[inline]
    pub(crate) fn record(&self, kind: crate::accounting::memory::Kind, key: u64, live: crate::accounting::memory::Live) -> Result<(), gpushim_common::bounded::Stuck> {
        self.live.insert_then(kind, key, live, |stale| self.credit_stale(stale))
    }

    /// Whether any device of the program can have a limit: a memory limit (global or per
    /// device), virtual devices (each part is limited to its size), a shared quota, or a memory
    /// mode that serves from a reserve. Then every allocation must be counted or refused.
    pub fn limits_apply(&self) -> bool {
        self.mode == Mode::Active && self.settings.limits_anything()
    }

    /// Refuses a request the shim cannot count while limits are set (fail closed), with one
    /// rate-limited `warn` line saying why.
    #[cold]
    fn refuse_unaccountable(&self, what: &str, dev: Option<CUdevice>, bytes: u64) -> crate::driver::ffi::CUresult {
        let (result, why) = match dev {
            None => (crate::driver::ffi::CUDA_ERROR_INVALID_CONTEXT, "no current context tells which device it is for".to_string()),
            Some(d) if self.budget(d).is_none() => (
                crate::driver::ffi::CUDA_ERROR_OUT_OF_MEMORY,
                format!("device {d} is beyond the {MAX_DEVICES} devices gpushim can account for"),
            ),
            Some(d) => (crate::driver::ffi::CUDA_ERROR_OUT_OF_MEMORY, format!("the memory size of device {d} cannot be read from the driver")),
        };
        if let Some(b) = dev.and_then(|d| self.budget(d)) {
            b.count_refusal();
        }
        if log::enabled(Level::Warn) && self.refusal_log.admit().is_some() {
            log::emit(Level::Warn, format_args!("{what} of {bytes} bytes refused: {why}, and limits are set (refused rather than left uncounted)"));
        }
        result
    }

    /// An entry the driver freed without the shim seeing it (its pointer or handle was handed
    /// out again): credits what it held.
    #[cold]
    pub(crate) fn credit_stale(&self, stale: crate::accounting::memory::Live) {
        if stale.served {
            return; // the reserve's blocks are the shim's own; never handed out twice
        }
        // (the driver may still be giving the old memory back: see `teardown`)
        self.credit_freed(stale.device, stale.bytes, stale.bytes);
        log!(Level::Debug, "device {}: {} bytes freed by the driver behind gpushim's back credited", stale.device, stale.bytes);
    }

    /// Forgets the allocation `key`, runs `free`, and credits its bytes once the driver freed
    /// it (or restores the entry if the driver refused). Unknown keys are passed through,
    /// except addresses inside a reserve (`modes`). Memory served from a reserve goes back to
    /// it (after synchronising `stream` if given, else the context) without `free`.
    pub fn uncounted(
        &self,
        kind: crate::accounting::memory::Kind,
        key: u64,
        stream: Option<crate::driver::ffi::CUstream>,
        free: impl FnOnce() -> crate::driver::ffi::CUresult,
    ) -> crate::driver::ffi::CUresult {
        if kind == crate::accounting::memory::Kind::DevicePtr {
            // A table entry read as its two words: building and copying an entry costs ~17
            // instructions a free here (the lane, `lane`, does the same for one device).
            match self.live.remove_packed(key) {
                Ok(Some(p)) if !p.served() => return self.free_counted(kind, key, p.device(), p.bytes(), p.pool(), || p.live(), free),
                Ok(Some(p)) => return self.free_taken(kind, key, p.live(), stream, free),
                Ok(None) => return self.free_unrecorded(kind, key, free),
                Err(()) => {}
            }
        }
        match self.live.remove(kind, key) {
            Ok(Some(live)) => self.free_taken(kind, key, live, stream, free),
            Ok(None) => self.free_unrecorded(kind, key, free),
            // (before the driver's free: the memory stays the program's, recorded and counted)
            Err(stuck) => refuse_free(kind, stuck),
        }
    }

    /// [`State::uncounted`] of a key with no entry: passed to the driver, except addresses
    /// inside a reserve.
    #[inline(always)]
    fn free_unrecorded(&self, kind: crate::accounting::memory::Kind, key: u64, free: impl FnOnce() -> crate::driver::ffi::CUresult) -> crate::driver::ffi::CUresult {
        if kind == crate::accounting::memory::Kind::DevicePtr {
            if let Some(refused) = self.refuse_unknown_free(key) {
                return refused;
            }
        }
        free()
    }

    /// [`State::uncounted`] once the entry `live` of `key` was taken out of the live map.
    pub(crate) fn free_taken(
        &self,
        kind: crate::accounting::memory::Kind,
        key: u64,
        live: crate::accounting::memory::Live,
        stream: Option<crate::driver::ffi::CUstream>,
        free: impl FnOnce() -> crate::driver::ffi::CUresult,
    ) -> crate::driver::ffi::CUresult {
        if live.served {
            return self.release_served(key, live, stream);
        }
        self.free_counted(kind, key, live.device, live.bytes, live.pool, || live, free)
    }

    /// The free of a counted (not served) entry taken out of the live map: credited once the
    /// driver freed it, restored (`entry`) if the driver refused.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn free_counted(
        &self,
        kind: crate::accounting::memory::Kind,
        key: u64,
        device: usize,
        bytes: u64,
        pool: bool,
        entry: impl FnOnce() -> crate::accounting::memory::Live,
        free: impl FnOnce() -> crate::driver::ffi::CUresult,
    ) -> crate::driver::ffi::CUresult {
        let result = free();
        if result == crate::driver::ffi::CUDA_SUCCESS {
            self.credit_free(device, bytes, pool);
        } else if let Err(stuck) = self.record(kind, key, entry()) {
            crate::platform::log::stuck("restoring the record of a free the driver refused (its bytes stay counted)", stuck);
        }
        result
    }

    /// The driver freed an allocation of `bytes` on `device`: the program holds it no more;
    /// unless its pool may keep it, it is no longer reserved either.
    #[inline(always)]
    fn credit_free(&self, device: usize, bytes: u64, pool: bool) {
        let budget = self.budgets_of(device);
        if pool {
            budget.keep_in_pool(bytes);
        } else {
            budget.freed(bytes);
        }
    }

    /// A reservation of `bytes` on `dev` that was refused, tried again while waiting for room
    /// (`GPUSHIM_OOM_WAIT`) when a full shared quota refused it and this process is under its
    /// own `limit` (see `DeviceBudget::reserve_waiting`): whether it is reserved now. Every
    /// refusal point of the allocation paths calls this before refusing; the wait is counted
    /// (the budget, the published figures) and logged at `info`.
    pub fn wait_for_room(&self, what: &str, dev: CUdevice, bytes: u64, limit: u64) -> bool {
        let Some(wait) = self.settings.oom_wait.filter(|w| !w.is_zero()) else { return false };
        let Some(budget) = self.budget(dev) else { return false };
        let Some(w) = budget.reserve_waiting(bytes, limit, wait) else { return false };
        if let Some(entry) = crate::sharing::publisher().and_then(|p| p.device(dev as usize)) {
            entry.waits.waits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            entry.waits.waited_ns.fetch_add(w.waited.as_nanos().min(u64::MAX as u128) as u64, std::sync::atomic::Ordering::Relaxed);
        }
        use gpushim_common::oom_wait::End;
        let how = match w.end {
            End::Reserved => "then got it",
            End::TimedOut => "for room in the shared quota, in vain (GPUSHIM_OOM_WAIT)",
            End::AllWaiting => "and was refused: every process of the shared quota is waiting (the newest waiter fails)",
            End::Failed => "and was refused: the shared quota's queue of waiters is full or unusable",
        };
        log!(Level::Info, "device {dev}: {what} of {bytes} bytes waited {:.3} s {how}", w.waited.as_secs_f64());
        w.end == End::Reserved
    }

    /// Counts a refused request and says so in one `warn` line (rate-limited): the device, the
    /// request, what is in use (and reserved, when a reserve is in play) and the limit.
    pub fn report_refusal(&self, what: &str, dev: CUdevice, bytes: u64) {
        let Some(budget) = self.budget(dev) else { return };
        budget.count_refusal();
        if !log::enabled(Level::Warn) {
            return;
        }
        if let Some(suppressed) = self.refusal_log.admit() {
            let more = if suppressed > 0 { format!(" ({suppressed} similar lines suppressed)") } else { String::new() };
            let mut reserved = if self.pooled() { format!(", {} bytes reserved", budget.reserved()) } else { String::new() };
            if let Some((q, _)) = budget.shared() {
                reserved.push_str(&format!(", {} bytes held by all processes of shared quota {}", budget.held(), q.name));
            }
            log::emit(
                Level::Warn,
                format_args!(
                    "device {dev}: {what} of {bytes} bytes refused: {} bytes in use{reserved}, limit {} bytes{more}",
                    budget.in_use(),
                    self.limit(dev).unwrap_or(0)
                ),
            );
        }
    }

    /// (free, total) as the program may see them on `dev`, from the driver's answer: total is
    /// the limit; free is what the limit still allows and the driver has, plus what the
    /// reserve has free (`grow`/`preallocate`; nothing in `passthrough`).
    pub fn clamp_mem_info(&self, dev: CUdevice, driver_free: u64, driver_total: u64) -> (u64, u64) {
        if self.budget(dev).is_some_and(|b| b.pool_kept() > 0) {
            self.reconcile_pools(dev);
        }
        match (self.budget(dev), self.limit(dev)) {
            (Some(b), Some(limit)) => {
                // `held`: what counts against the limit (with a shared quota, every member's)
                // `kept`: what stream-ordered pools may still hold after frees (`pools`): neither
                // the program's nor free
                let (reserved, in_use, held, kept) = (b.reserved(), b.in_use(), b.held(), b.pool_kept());
                let others = held.saturating_sub(reserved);
                let headroom = limit.saturating_sub(held).min(driver_free);
                let cap = limit.saturating_sub(others).saturating_sub(in_use).saturating_sub(kept);
                let reserve_free = reserved.saturating_sub(in_use).saturating_sub(kept);
                (headroom.saturating_add(reserve_free).min(cap), limit)
            }
            _ => (driver_free, driver_total),
        }
    }
}

/// Gives an allocation the driver just made back to it (its own `cuMemFree_v2`), when what
/// should follow cannot be done.
pub(crate) fn free_driver_ptr(ptr: CUdeviceptr) {
    let real = crate::driver::table::resolved(c"cuMemFree_v2").map_or(0, |p| p as usize);
    if real != 0 {
        // SAFETY: the slot holds the driver's cuMemFree_v2; `ptr` is an allocation it just made.
        unsafe { std::mem::transmute::<usize, unsafe extern "C" fn(CUdeviceptr) -> CUresult>(real)(ptr) };
    }
}

/// Refuses a free whose entry cannot be taken out of the live map (`bounded`), before the
/// driver frees anything: the memory stays the program's, recorded and counted, and a later
/// free (outside the signal handler) frees it.
#[cold]
pub(crate) fn refuse_free(kind: Kind, stuck: Stuck) -> CUresult {
    let call = match kind {
        Kind::DevicePtr => "cuMemFree",
        Kind::VmmHandle => "cuMemRelease",
        Kind::Array => "cuArrayDestroy",
        Kind::MipmappedArray => "cuMipmappedArrayDestroy",
    };
    crate::platform::log::refuse(call, stuck, CUDA_ERROR_NOT_PERMITTED)
}

/// The fast lane's rare outcomes take the state's general path (`accounting::lane`).
impl crate::accounting::lane::General for State {
    fn record(&self, key: u64, entry: crate::accounting::memory::Live) -> Result<(), gpushim_common::bounded::Stuck> {
        State::record(self, crate::accounting::memory::Kind::DevicePtr, key, entry)
    }

    fn credit_stale(&self, entry: crate::accounting::memory::Live) {
        State::credit_stale(self, entry)
    }

    fn free_taken(&self, dptr: crate::driver::ffi::CUdeviceptr, entry: crate::accounting::memory::Live, real: crate::accounting::lane::RealFree) -> crate::driver::ffi::CUresult {
        // SAFETY: the program's argument, passed on unchanged to the driver's own cuMemFree_v2.
        State::free_taken(self, crate::accounting::memory::Kind::DevicePtr, dptr, entry, None, || unsafe { real(dptr) })
    }
}

impl State {
    /// An allocation the driver made whose record cannot be made (`bounded`): given back to
    /// the driver, uncounted again (`bytes` were reserved and taken; a stream-ordered one's
    /// pool may keep them: counted as kept), refused.
    #[cold]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn unrecorded(&self, what: &str, kind: Kind, key: u64, budget: &crate::accounting::memory::DeviceBudget, bytes: u64, pool: bool, stuck: Stuck) -> CUresult {
        undo_allocation(kind, key);
        if pool {
            budget.keep_in_pool(bytes);
        } else {
            budget.freed(bytes);
        }
        budget.count_refusal();
        crate::platform::log::refuse(what, stuck, CUDA_ERROR_OUT_OF_MEMORY)
    }
}

/// Gives back to the driver what it just allocated under `key` (an allocation whose record
/// could not be made: refused rather than left uncounted). A device pointer (of any
/// allocation function, stream-ordered ones included: `cuMemFree` frees them too), a VMM
/// handle, an array or a mipmapped array.
pub(crate) fn undo_allocation(kind: Kind, key: u64) {
    let name = match kind {
        Kind::DevicePtr => return free_driver_ptr(key),
        Kind::VmmHandle => c"cuMemRelease",
        Kind::Array => c"cuArrayDestroy",
        Kind::MipmappedArray => c"cuMipmappedArrayDestroy",
    };
    let real = crate::driver::table::resolved(name).map_or(0, |p| p as usize);
    if real != 0 {
        // SAFETY: the slot holds the driver's function of that name, which takes the handle or
        // array (a pointer-sized value) the driver just made.
        unsafe { std::mem::transmute::<usize, unsafe extern "C" fn(u64) -> CUresult>(real)(key) };
    }
}
