//! The state's side of splits: program devices, their contexts and UUIDs, worked out from the split and the driver.


use std::sync::atomic::Ordering;
use gpushim_common::config;
use crate::devices::{Devices, DriverDevice};
use crate::driver;
use crate::driver::ffi::{CUcontext, CUdevice, CUresult, CUDA_ERROR_INVALID_DEVICE, CUDA_SUCCESS};

use crate::devices::split::*;
use crate::state::State;

impl State {
    /// The list NVML shows while devices are split: each part of a split GPU, in the program's
    /// order. `None` when nothing is split or NVML cannot list the devices. Built from NVML's
    /// inventory (a program may use NVML without CUDA); the sizes were checked against NVML's
    /// totals, and selectors that name no device leave the list `None` (CUDA reports the error).
    pub fn nvml_parts(&self) -> Option<&Vec<NvmlPart>> {
        self.nvml_parts
            .get_or_init(|| {
                if !self.split_configured() {
                    return None;
                }
                let inventory = self.inventory()?;
                let base: Vec<usize> = match self.view().or_else(|| self.cuda_ordinals()) {
                    Some(v) => v.devices.clone(),
                    None => (0..inventory.len()).collect(),
                };
                let driver: Vec<DriverDevice> = base
                    .iter()
                    .map(|&p| DriverDevice { uuid: inventory[p].uuid.clone(), pci: inventory[p].pci.clone(), total: inventory[p].total })
                    .collect();
                let devices = match self.expand_split(&driver) {
                    Ok(devices) => devices,
                    Err(reason) => {
                        // The error CUDA reports at initialisation: NVML refuses as CUDA does.
                        crate::state::report_config_error(&self.virtual_devices_error(reason));
                        NVML_SPLIT_FAILED.store(true, Ordering::Relaxed);
                        return None;
                    }
                };
                Some(
                    devices
                        .list
                        .iter()
                        .map(|d| {
                            let physical = base[d.driver as usize];
                            let uuid = match (d.part, crate::devices::parse_uuid(&inventory[physical].uuid)) {
                                (Some(part), Some(bytes)) => driver::uuid_string(&crate::devices::part_uuid(&bytes, part.index)),
                                _ => inventory[physical].uuid.clone(),
                            };
                            NvmlPart { physical, part: d.part, uuid }
                        })
                        .collect(),
                )
            })
            .as_ref()
    }

    /// Whether `GPUSHIM_VIRTUAL_DEVICES` cannot split the devices NVML lists (parts larger than
    /// the device, a selector naming no device): a configuration error, and NVML then fails as
    /// CUDA initialisation does.
    #[inline]
    pub fn nvml_split_failed(&self) -> bool {
        self.split_configured() && {
            let _ = self.nvml_parts();
            NVML_SPLIT_FAILED.load(Ordering::Relaxed)
        }
    }

    /// The program's devices: `driver` split as configured. An empty view (a scheduler that gave
    /// the process no GPU) has nothing to split: no devices, and no error for selectors that
    /// name none.
    fn expand_split(&self, driver: &[DriverDevice]) -> Result<Devices, String> {
        if driver.is_empty() {
            return Ok(Devices::default());
        }
        crate::devices::expand(&self.settings.virtual_devices, driver)
    }

    /// The configuration error line for a `GPUSHIM_VIRTUAL_DEVICES` that cannot split the devices.
    fn virtual_devices_error(&self, reason: String) -> String {
        let (setting, value) = match self.settings.source_of("virtual_devices") {
            config::Source::Env(var) => (var.clone(), gpushim_common::unforked::var(var).unwrap_or_default()),
            other => (format!("virtual_devices ({other})"), String::new()),
        };
        config::ConfigError::new(setting, value, reason).to_string()
    }

    /// Splits the driver's devices once it initialised (`GPUSHIM_VIRTUAL_DEVICES`). An error is
    /// a configuration error, reported once; CUDA initialisation then fails.
    pub(crate) fn build_split(&self) -> Result<(), String> {
        if !self.split_configured() || self.split.get().is_some() {
            return Ok(());
        }
        let api = self.api();
        let driver: Vec<(DriverDevice, [u8; 16], [i32; 3])> = api
            .devices()
            .into_iter()
            .enumerate()
            .map(|(d, (_, uuid))| {
                let d = d as CUdevice;
                let pci = [50, 33, 34].map(|a| api.attribute(a, d).unwrap_or(0));
                let dev = DriverDevice {
                    uuid: driver::uuid_string(&uuid),
                    pci: format!("{:04x}:{:02x}:{:02x}.0", pci[0], pci[1], pci[2]),
                    total: api.physical_total(d).unwrap_or(0),
                };
                (dev, uuid, pci)
            })
            .collect();
        let list: Vec<DriverDevice> = driver.iter().map(|(d, _, _)| d.clone()).collect();
        let devices = self.expand_split(&list).map_err(|reason| self.virtual_devices_error(reason))?;
        let facts = devices
            .list
            .iter()
            .map(|d| {
                let (_, uuid, pci) = &driver[d.driver as usize];
                let uuid = d.part.map_or(*uuid, |p| crate::devices::part_uuid(uuid, p.index));
                (uuid, pci[0], pci[1], pci[2])
            })
            .collect();
        let primaries = devices.list.iter().map(|_| PartPrimary::default()).collect();
        let _ = self.split.set(Split { devices, facts, primaries, contexts: gpushim_common::bounded::Bounded::new("gpushim's list of contexts on parts", Vec::new()) });
        Ok(())
    }

    /// The program's devices, when split (else program ordinals are the driver's).
    #[inline]
    pub fn program_devices(&self) -> Option<&Devices> {
        self.split.get().map(|s| &s.devices)
    }

    /// The driver ordinal of program device `dev` (itself when nothing is split); `None`: no
    /// such device.
    #[inline]
    pub fn driver_of(&self, dev: CUdevice) -> Option<CUdevice> {
        match self.program_devices() {
            None => Some(dev),
            Some(d) => d.get(dev).map(|p| p.driver),
        }
    }

    /// The program device the driver's device `driver` is reported as (its first part).
    pub fn program_of(&self, driver: CUdevice) -> CUdevice {
        self.program_devices().and_then(|d| d.first_of(driver)).unwrap_or(driver)
    }

    /// Per program device: UUID, PCI domain, bus, device (for the runtime's integrity check).
    pub fn program_devices_facts(&self) -> Option<Vec<DeviceFacts>> {
        self.split.get().map(|s| s.facts.clone())
    }

    /// The UUID of a part (derived), `None` for a whole device or when nothing is split.
    pub fn part_uuid(&self, dev: CUdevice) -> Option<[u8; 16]> {
        let s = self.split.get()?;
        s.devices.get(dev)?.part?;
        s.facts.get(dev as usize).map(|f| f.0)
    }

    /// The part a context belongs to: one the shim created for a part, or one the program
    /// created on a part; `None` for the driver's own (primary) contexts. `Err`: the list of
    /// contexts cannot be had (`bounded`): the context's device is then unknown (its
    /// allocations are refused while limits apply, `State::counted`).
    pub fn part_of_context(&self, ctx: CUcontext) -> Result<Option<CUdevice>, gpushim_common::bounded::Stuck> {
        let Some(s) = self.split.get() else { return Ok(None) };
        if let Some(i) = s.primaries.iter().position(|p| !ctx.is_null() && p.ctx.load(Ordering::Acquire) == ctx as usize) {
            return Ok(Some(i as CUdevice));
        }
        let contexts = s.contexts.lock()?;
        Ok(contexts.iter().find(|(c, _)| *c == ctx as usize).map(|&(_, d)| d))
    }

    /// The program device an allocation starting at `ptr` was counted on.
    pub fn live_device(&self, ptr: crate::driver::ffi::CUdeviceptr) -> Option<CUdevice> {
        self.live.get(crate::accounting::memory::Kind::DevicePtr, ptr).ok().flatten().map(|l| l.device as CUdevice)
    }

    /// Remembers `ctx` as a context on part `dev` (replacing what a handle the driver hands
    /// out again was before). `Err`: not remembered (the caller undoes the creation).
    pub fn remember_context(&self, ctx: CUcontext, dev: CUdevice) -> Result<(), gpushim_common::bounded::Stuck> {
        if let Some(s) = self.split.get() {
            let mut contexts = s.contexts.lock()?;
            contexts.retain(|(c, _)| *c != ctx as usize);
            contexts.push((ctx as usize, dev));
        }
        Ok(())
    }

    /// (If the list cannot be had, the entry stays until the handle is remembered again.)
    pub fn forget_context(&self, ctx: CUcontext) {
        if let Some(s) = self.split.get() {
            if let Ok(mut contexts) = s.contexts.lock() {
                contexts.retain(|(c, _)| *c != ctx as usize);
            }
        }
    }

    /// The program device of the current context.
    #[inline]
    pub fn current_device(&self) -> Option<CUdevice> {
        if self.only_device() {
            return Some(0);
        }
        if self.split.get().is_none() {
            return self.api().current_device();
        }
        let mut ctx: CUcontext = std::ptr::null_mut();
        if let Some(get) = self.api().ctx_get_current {
            // SAFETY: valid out-pointer.
            unsafe { get(&mut ctx) };
        }
        self.context_device(ctx)
    }

    /// The program device of context `ctx`, which is current.
    fn context_device(&self, ctx: CUcontext) -> Option<CUdevice> {
        self.part_of_context(ctx).ok()?.or_else(|| Some(self.program_of(self.api().current_device()?)))
    }

    /// The program device a stream's work runs on.
    pub fn stream_device(&self, stream: crate::driver::ffi::CUstream) -> Option<CUdevice> {
        if self.only_device() {
            return Some(0);
        }
        if self.split.get().is_none() {
            return self.api().stream_device(stream);
        }
        if crate::driver::ffi::is_default_stream(stream) {
            return self.current_device();
        }
        let mut ctx: CUcontext = std::ptr::null_mut();
        let get = self.api().stream_get_ctx?;
        // SAFETY: valid out-pointer; the stream is the program's own.
        if unsafe { get(stream, &mut ctx) } != CUDA_SUCCESS {
            return self.current_device();
        }
        self.part_of_context(ctx).ok()?.or_else(|| Some(self.program_of(self.api().stream_device(stream)?)))
    }

    /// Retains the primary context of program device `dev`: the driver's for a whole device and
    /// a GPU's first part, the shim's own for the other parts.
    pub fn retain_primary(&self, dev: CUdevice, out: *mut CUcontext) -> CUresult {
        let api = self.api();
        let Some(driver) = self.driver_of(dev) else { return CUDA_ERROR_INVALID_DEVICE };
        let part = self.program_devices().and_then(|d| d.get(dev)).and_then(|d| d.part);
        let (Some(split), Some(part)) = (self.split.get(), part.filter(|p| p.index > 0)) else {
            return match api.primary_ctx_retain {
                // SAFETY: the caller's out-pointer, checked by the driver.
                Some(f) => unsafe { f(out, driver) },
                None => crate::driver::ffi::CUDA_ERROR_NOT_INITIALIZED,
            };
        };
        let _ = part;
        if out.is_null() {
            return crate::driver::ffi::CUDA_ERROR_INVALID_VALUE;
        }
        let primary = &split.primaries[dev as usize];
        let mut ctx = primary.ctx.load(Ordering::Acquire);
        if ctx == 0 {
            let (Some(create), Some(pop), Some(destroy)) = (api.ctx_create, api.ctx_pop_current, api.ctx_destroy) else {
                return crate::driver::ffi::CUDA_ERROR_NOT_INITIALIZED;
            };
            let mut made: CUcontext = std::ptr::null_mut();
            // SAFETY: valid out-pointers; the new context is pushed by the driver and popped
            // again at once, so the caller's current context is unchanged. No lock is held.
            let r = unsafe { create(&mut made, primary.flags.load(Ordering::Relaxed), driver) };
            if r != CUDA_SUCCESS {
                return r;
            }
            let mut popped: CUcontext = std::ptr::null_mut();
            // SAFETY: as above.
            unsafe { pop(&mut popped) };
            ctx = match primary.ctx.compare_exchange(0, made as usize, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => made as usize,
                Err(winner) => {
                    // Another thread's first retain finished first: keep its context.
                    // SAFETY: `made` was created above and never handed out.
                    unsafe { destroy(made) };
                    winner
                }
            };
        }
        primary.refs.fetch_add(1, Ordering::Relaxed);
        // SAFETY: checked non-NULL above.
        unsafe { *out = ctx as CUcontext };
        CUDA_SUCCESS
    }

    /// The state of a part's own primary context: `Some((flags, active))`; `None` when `dev` is
    /// not a part the shim keeps a primary context for (the driver answers).
    pub fn part_primary_state(&self, dev: CUdevice) -> Option<(u32, bool)> {
        let p = self.part_primary(dev)?;
        Some((p.flags.load(Ordering::Relaxed), p.refs.load(Ordering::Relaxed) > 0))
    }

    pub fn part_primary_release(&self, dev: CUdevice) -> Option<CUresult> {
        let p = self.part_primary(dev)?;
        let released = p.refs.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| r.checked_sub(1)).is_ok();
        Some(if released { CUDA_SUCCESS } else { crate::driver::ffi::CUDA_ERROR_INVALID_CONTEXT })
    }

    pub fn part_primary_set_flags(&self, dev: CUdevice, flags: u32) -> Option<CUresult> {
        self.part_primary(dev)?.flags.store(flags, Ordering::Relaxed);
        Some(CUDA_SUCCESS)
    }

    fn part_primary(&self, dev: CUdevice) -> Option<&PartPrimary> {
        let s = self.split.get()?;
        s.devices.get(dev)?.part.filter(|p| p.index > 0)?;
        s.primaries.get(dev as usize)
    }
}
