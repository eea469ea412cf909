//! The primary contexts of the `green` compute mode: on a device with a compute limit, the
//! program's primary context (`cuDevicePrimaryCtxRetain`, and the runtime's private retain in
//! `private.rs`) is the shim's green context with the limit's share of SMs (`compute::green`);
//! release and reset count and destroy it. Devices without a limit, and every other mode, get
//! the bodies of `devices.rs`.

use crate::compute;
use crate::driver::ffi::*;
use crate::hooks::intercept::NEEDS_GREEN;
use crate::platform::log::{self, log, Level};
use crate::state::State;

use super::devices;

/// The compute share of program device `dev` when its primary context is a green context.
#[inline]
pub fn green_share(st: &State, dev: CUdevice) -> Option<f64> {
    if st.needs() & NEEDS_GREEN == 0 {
        return None;
    }
    st.settings.compute_limit_for(u32::try_from(dev).ok()?)
}

/// Retains program device `dev`'s green context into `out` (checked non-NULL by the caller).
pub fn retain(st: &State, dev: CUdevice, share: f64, out: *mut CUcontext) -> CUresult {
    let Some(driver) = st.driver_of(dev) else { return CUDA_ERROR_INVALID_DEVICE };
    match compute::green::retain(st.api(), driver, share) {
        Ok((ctx, made)) => {
            if let Some(sms) = made {
                log!(Level::Info, "device {dev}: green context with {sms} SMs (compute limit {:.0}%)", share * 100.0);
            }
            // SAFETY: the caller checked `out`.
            unsafe { *out = ctx };
            st.context_created(dev, ctx);
            CUDA_SUCCESS
        }
        Err(f) => {
            log!(
                Level::Error,
                "GPUSHIM_COMPUTE_MODE=green: device {dev}: {} failed (CUDA error {}); its primary context is refused",
                f.step,
                f.result
            );
            f.result
        }
    }
}

pub unsafe fn primary_retain(st: &State, real: unsafe extern "C" fn(*mut CUcontext, CUdevice) -> CUresult, ctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    match green_share(st, dev) {
        None => devices::primary_retain(st, real, ctx, dev),
        Some(_) if ctx.is_null() => CUDA_ERROR_INVALID_VALUE,
        Some(share) => retain(st, dev, share, ctx),
    }
}

/// Runs `teardown` (the green context's release or reset) and credits the memory of its
/// context when that destroyed it (the driver's primary context goes with it).
fn teardown(st: &State, dev: CUdevice, what: &str, teardown: impl FnOnce(CUdevice) -> Result<Option<CUresult>, gpushim_common::bounded::Stuck>, otherwise: impl FnOnce() -> CUresult) -> CUresult {
    let Some(driver) = st.driver_of(dev) else { return CUDA_ERROR_INVALID_DEVICE };
    let _teardown = match st.limits_apply().then(|| st.teardown_begins()).transpose() {
        Ok(t) => t,
        Err(stuck) => return log::refuse(what, stuck, CUDA_ERROR_NOT_PERMITTED),
    };
    let ctx = match compute::green::current(driver) {
        Ok(c) => c.map(|(ctx, _)| ctx),
        Err(stuck) => return log::refuse(what, stuck, CUDA_ERROR_NOT_PERMITTED),
    };
    let doomed = ctx.map(|c| st.context_allocations(c));
    match teardown(driver) {
        Err(stuck) => log::refuse(what, stuck, CUDA_ERROR_NOT_PERMITTED),
        Ok(None) => otherwise(),
        Ok(Some(result)) => {
            let gone = matches!(compute::green::current(driver), Ok(None));
            if result == CUDA_SUCCESS && gone {
                if let Some(doomed) = doomed {
                    st.credit_context(doomed);
                }
            }
            result
        }
    }
}

pub unsafe fn primary_release(st: &State, real: unsafe extern "C" fn(CUdevice) -> CUresult, dev: CUdevice) -> CUresult {
    if green_share(st, dev).is_none() {
        return devices::primary_release(st, real, dev);
    }
    let api = st.api();
    // (no green context: the driver says what it says of an unretained primary context)
    teardown(st, dev, "cuDevicePrimaryCtxRelease", |d| compute::green::release(api, d), || devices::primary_release(st, real, dev))
}

pub unsafe fn primary_reset(st: &State, real: unsafe extern "C" fn(CUdevice) -> CUresult, dev: CUdevice) -> CUresult {
    if green_share(st, dev).is_none() {
        return devices::primary_reset(st, real, dev);
    }
    let api = st.api();
    let result = teardown(st, dev, "cuDevicePrimaryCtxReset", |d| compute::green::reset(api, d), || CUDA_SUCCESS);
    if result != CUDA_SUCCESS {
        return result;
    }
    // and the driver's own primary context, as a reset does
    devices::primary_reset(st, real, dev)
}
