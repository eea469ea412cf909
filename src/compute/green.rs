//! The `green` compute mode (experimental): each limited device's primary context, as the
//! program gets it, is a green context holding the limit's share of the device's SMs.
//!
//! The chain, per driver device, on the first retain: `cuDeviceGetDevResource(SM)` →
//! `cuDevSmResourceSplitByCount` (one group of the share of SMs, rounded down to the
//! architecture's partition granularity — 1 SM on compute capability 6.x, 2 on 7.x, 4 on 8.x,
//! 8 on 9.0 and later — and at least one partition) → `cuDevResourceGenerateDesc` →
//! `cuGreenCtxCreate(CU_GREEN_CTX_DEFAULT_STREAM)` → `cuCtxFromGreenCtx`. The green context is
//! counted like a primary context (retains and releases); the last release destroys it, which
//! releases the driver's primary context it holds.
//!
//! Green contexts separate SMs within the process only: other processes' work still runs on
//! every SM (across processes that takes MPS). A green context is current to one thread at a
//! time, like any context. Needs a driver of CUDA 12.4 or later with every function of the
//! chain ([`check`]); otherwise CUDA initialisation fails.

use std::ffi::{c_uint, c_void};

use gpushim_common::bounded::{Bounded, Stuck};

use crate::devices::MAX_DEVICES;
use crate::driver::ffi::*;
use crate::driver::Api;

/// `CU_DEV_RESOURCE_TYPE_SM`.
const RESOURCE_TYPE_SM: i32 = 1;
/// `CU_GREEN_CTX_DEFAULT_STREAM`.
const GREEN_CTX_DEFAULT_STREAM: c_uint = 1;
/// The first driver with green contexts (`cuDriverGetVersion`).
pub const FIRST_DRIVER_VERSION: i32 = 12040;
/// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR`.
const ATTRIBUTE_CC_MAJOR: i32 = 75;

/// `CUdevResource` (cuda.h, `RESOURCE_ABI_VERSION` 1; the same 144 bytes in CUDA 12.4+): the
/// type, 92 internal bytes, a 40-byte union whose SM member starts with `smCount`, and
/// `nextResource`. Written by the driver only; the shim reads `type_` and `sm_count`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUdevResource {
    pub type_: i32,
    internal: [u8; 92],
    pub sm_count: c_uint,
    rest: [u8; 36],
    next: *mut c_void,
}

impl CUdevResource {
    fn zeroed() -> CUdevResource {
        CUdevResource { type_: 0, internal: [0; 92], sm_count: 0, rest: [0; 36], next: std::ptr::null_mut() }
    }
}

/// Why the driver cannot give green contexts, `None` when it can.
pub fn check(api: &Api) -> Option<String> {
    let mut version = 0;
    if let Some(f) = api.driver_get_version {
        // SAFETY: valid out-pointer.
        unsafe { f(&mut version) };
    }
    if version < FIRST_DRIVER_VERSION {
        return Some(format!("green contexts need a driver of CUDA 12.4 or later, this one is {}.{}", version / 1000, version % 1000 / 10));
    }
    let missing: Vec<&str> = [
        ("cuDeviceGetDevResource", api.device_get_dev_resource.is_none()),
        ("cuDevSmResourceSplitByCount", api.dev_sm_resource_split_by_count.is_none()),
        ("cuDevResourceGenerateDesc", api.dev_resource_generate_desc.is_none()),
        ("cuGreenCtxCreate", api.green_ctx_create.is_none()),
        ("cuGreenCtxDestroy", api.green_ctx_destroy.is_none()),
        ("cuCtxFromGreenCtx", api.ctx_from_green_ctx.is_none()),
    ]
    .into_iter()
    .filter_map(|(name, absent)| absent.then_some(name))
    .collect();
    (!missing.is_empty()).then(|| format!("the driver lacks {}", missing.join(", ")))
}

/// The partition granularity of a compute capability (major version).
pub fn granularity(cc_major: i32) -> u32 {
    match cc_major {
        ..=6 => 1,
        7 => 2,
        8 => 4,
        _ => 8,
    }
}

/// The SMs of a green context for `share` of `total` SMs: rounded down to a multiple of
/// `gran`, at least one partition, at most every SM.
pub fn sms_for(share: f64, total: u32, gran: u32) -> u32 {
    let gran = gran.max(1);
    let want = (share * total as f64 + 1e-9).floor() as u32;
    (want / gran * gran).max(gran).min(total)
}

/// One device's green context, shared by its retains.
#[derive(Clone, Copy, Default)]
struct Slot {
    green: usize,
    ctx: usize,
    refs: u32,
}

static SLOTS: Bounded<[Slot; MAX_DEVICES]> = Bounded::new("the green contexts", [Slot { green: 0, ctx: 0, refs: 0 }; MAX_DEVICES]);

/// A failure of the chain: the driver's result and which step.
pub struct Failed {
    pub result: CUresult,
    pub step: &'static str,
}

impl From<Stuck> for Failed {
    fn from(_: Stuck) -> Failed {
        Failed { result: CUDA_ERROR_NOT_PERMITTED, step: "the shim's table of green contexts (busy)" }
    }
}

/// Creates the green context of driver device `dev` for `share`: (green context, its
/// `CUcontext`, SMs). No lock is held.
fn create(api: &Api, dev: CUdevice, share: f64) -> Result<(usize, usize, u32), Failed> {
    let fail = |result, step| Err(Failed { result, step });
    let (Some(get), Some(split), Some(desc_of), Some(make), Some(destroy), Some(to_ctx)) = (
        api.device_get_dev_resource,
        api.dev_sm_resource_split_by_count,
        api.dev_resource_generate_desc,
        api.green_ctx_create,
        api.green_ctx_destroy,
        api.ctx_from_green_ctx,
    ) else {
        return fail(CUDA_ERROR_NOT_SUPPORTED, "the driver's green-context functions");
    };
    let mut all = CUdevResource::zeroed();
    // SAFETY: a 144-byte CUdevResource the driver writes.
    let r = unsafe { get(dev, &mut all as *mut CUdevResource as *mut c_void, RESOURCE_TYPE_SM) };
    if r != CUDA_SUCCESS {
        return fail(r, "cuDeviceGetDevResource");
    }
    if all.type_ != RESOURCE_TYPE_SM || all.sm_count == 0 {
        return fail(CUDA_ERROR_NOT_SUPPORTED, "cuDeviceGetDevResource (no SMs)");
    }
    let gran = granularity(api.attribute(ATTRIBUTE_CC_MAJOR, dev).unwrap_or(9));
    let want = sms_for(share, all.sm_count, gran);
    let (mut part, mut rest) = (CUdevResource::zeroed(), CUdevResource::zeroed());
    let mut groups: c_uint = 1;
    // SAFETY: one result slot, as `groups` says; valid input and remainder.
    let r = unsafe {
        split(
            &mut part as *mut CUdevResource as *mut c_void,
            &mut groups,
            &all as *const CUdevResource as *const c_void,
            &mut rest as *mut CUdevResource as *mut c_void,
            0,
            want,
        )
    };
    if r != CUDA_SUCCESS {
        return fail(r, "cuDevSmResourceSplitByCount");
    }
    if groups != 1 || part.sm_count == 0 {
        return fail(CUDA_ERROR_NOT_SUPPORTED, "cuDevSmResourceSplitByCount (no group)");
    }
    let mut desc: *mut c_void = std::ptr::null_mut();
    // SAFETY: one resource the driver wrote.
    let r = unsafe { desc_of(&mut desc, &mut part as *mut CUdevResource as *mut c_void, 1) };
    if r != CUDA_SUCCESS {
        return fail(r, "cuDevResourceGenerateDesc");
    }
    let mut green: *mut c_void = std::ptr::null_mut();
    // SAFETY: the descriptor the driver just made.
    let r = unsafe { make(&mut green, desc, dev, GREEN_CTX_DEFAULT_STREAM) };
    if r != CUDA_SUCCESS || green.is_null() {
        return fail(if r == CUDA_SUCCESS { CUDA_ERROR_UNKNOWN } else { r }, "cuGreenCtxCreate");
    }
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: the green context the driver just made.
    let r = unsafe { to_ctx(&mut ctx, green) };
    if r != CUDA_SUCCESS || ctx.is_null() {
        // SAFETY: ours, never handed out.
        unsafe { destroy(green) };
        return fail(if r == CUDA_SUCCESS { CUDA_ERROR_UNKNOWN } else { r }, "cuCtxFromGreenCtx");
    }
    Ok((green as usize, ctx as usize, part.sm_count))
}

/// Retains driver device `dev`'s green context (made on the first retain): its `CUcontext`,
/// and the SMs when this call made it.
pub fn retain(api: &Api, dev: CUdevice, share: f64) -> Result<(CUcontext, Option<u32>), Failed> {
    let index = usize::try_from(dev).ok().filter(|&i| i < MAX_DEVICES).ok_or(Failed { result: CUDA_ERROR_INVALID_DEVICE, step: "the device" })?;
    {
        let mut slots = SLOTS.lock()?;
        let s = &mut slots[index];
        if s.ctx != 0 {
            s.refs += 1;
            return Ok((s.ctx as CUcontext, None));
        }
    }
    let (green, ctx, sms) = create(api, dev, share)?;
    let mut slots = match SLOTS.lock() {
        Ok(s) => s,
        Err(stuck) => {
            destroy(api, green);
            return Err(stuck.into());
        }
    };
    let s = &mut slots[index];
    if s.ctx != 0 {
        // another thread's first retain finished first: keep its context
        s.refs += 1;
        let kept = s.ctx;
        drop(slots);
        destroy(api, green);
        return Ok((kept as CUcontext, None));
    }
    *s = Slot { green, ctx, refs: 1 };
    Ok((ctx as CUcontext, Some(sms)))
}

fn destroy(api: &Api, green: usize) -> CUresult {
    match api.green_ctx_destroy {
        // SAFETY: a green context the driver made for the shim, destroyed once.
        Some(f) => unsafe { f(green as *mut c_void) },
        None => CUDA_ERROR_NOT_SUPPORTED,
    }
}

/// Releases one retain of `dev`'s green context, destroying it with the last one: the
/// driver's result, `None` when the device has none (the caller asks the driver).
pub fn release(api: &Api, dev: CUdevice) -> Result<Option<CUresult>, Stuck> {
    let Some(index) = usize::try_from(dev).ok().filter(|&i| i < MAX_DEVICES) else { return Ok(None) };
    let doomed = {
        let mut slots = SLOTS.lock()?;
        let s = &mut slots[index];
        if s.ctx == 0 {
            return Ok(None);
        }
        s.refs = s.refs.saturating_sub(1);
        if s.refs > 0 {
            return Ok(Some(CUDA_SUCCESS));
        }
        std::mem::take(s).green
    };
    Ok(Some(destroy(api, doomed)))
}

/// Destroys `dev`'s green context whatever its count (`cuDevicePrimaryCtxReset`): the
/// driver's result, `None` when there is none.
pub fn reset(api: &Api, dev: CUdevice) -> Result<Option<CUresult>, Stuck> {
    let Some(index) = usize::try_from(dev).ok().filter(|&i| i < MAX_DEVICES) else { return Ok(None) };
    let doomed = std::mem::take(&mut SLOTS.lock()?[index]).green;
    Ok((doomed != 0).then(|| destroy(api, doomed)))
}

/// `dev`'s green context's `CUcontext` and retain count, if it has one.
pub fn current(dev: CUdevice) -> Result<Option<(CUcontext, u32)>, Stuck> {
    let Some(index) = usize::try_from(dev).ok().filter(|&i| i < MAX_DEVICES) else { return Ok(None) };
    let s = SLOTS.lock()?[index];
    Ok((s.ctx != 0).then_some((s.ctx as CUcontext, s.refs)))
}

/// A forked child has no green contexts (its driver state is not the parent's).
pub fn reset_after_fork() {
    if let Ok(mut slots) = SLOTS.lock() {
        *slots = [Slot::default(); MAX_DEVICES];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_resource_is_the_header_size() {
        assert_eq!(std::mem::size_of::<CUdevResource>(), 144);
        assert_eq!(std::mem::offset_of!(CUdevResource, sm_count), 96);
    }

    #[test]
    fn shares_round_down_to_partitions() {
        assert_eq!(sms_for(0.3, 132, 8), 32); // 39.6 → 32
        assert_eq!(sms_for(0.05, 132, 8), 8); // at least one partition
        assert_eq!(sms_for(0.5, 132, 8), 64);
        assert_eq!(sms_for(0.999, 132, 8), 128);
        assert_eq!(sms_for(0.3, 108, 4), 32); // 32.4
        assert_eq!(sms_for(0.3, 80, 2), 24);
        assert_eq!(sms_for(0.3, 10, 1), 3);
        assert_eq!(sms_for(0.5, 4, 8), 4, "never more than the device has");
        assert_eq!([6, 7, 8, 9, 10].map(granularity), [1, 2, 4, 8, 8]);
    }

    #[test]
    fn a_driver_without_the_chain_is_refused() {
        let api = Api::NONE;
        assert!(check(&api).unwrap().contains("CUDA 12.4"));
    }
}
