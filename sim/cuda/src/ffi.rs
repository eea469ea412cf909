//! The one way an exported driver function is written.
//!
//! ```ignore
//! cu_api! {
//!     fn cuFoo(out: *mut i32, dev: CUdevice) {
//!         put(out, 1)?;
//!         Ok(())
//!     }
//! }
//! ```
//! expands (through `gpusim_common::exported_fns!`, shared with `sim/nvml`) to
//! `#[no_mangle] pub unsafe extern "C" fn cuFoo(..) -> CUresult` that counts the call (see
//! `registry`), runs the body under `catch_unwind` (a panic becomes `CUDA_ERROR_UNKNOWN`, never
//! an unwind across the C boundary), turns the body's `Res` into a `CUresult` and, with
//! `GPUSIM_TRACE=1`, prints one line `gpusim: cuFoo(args) = rc` to stderr. Every name used here
//! must be listed in `registry.rs`, or the build fails.

use crate::types::*;
pub use gpusim_common::ffi::{guard_value, trace_line};

macro_rules! cu_api {
    ($($fns:tt)*) => {
        gpusim_common::exported_fns! {
            returns $crate::types::CUresult, result $crate::types::Res, guard $crate::ffi::guard,
            id $crate::registry::Id, count $crate::registry::hit,
            trace_if $crate::config::trace_enabled, prefix $crate::config::PREFIX;
            $($fns)*
        }
    };
}

/// Runs `f`, mapping `Ok` to `CUDA_SUCCESS`, `Err(e)` to `e` and a panic to `CUDA_ERROR_UNKNOWN`.
#[inline]
pub fn guard<F: FnOnce() -> Res>(f: F) -> CUresult {
    gpusim_common::ffi::guard(CUDA_SUCCESS, CUDA_ERROR_UNKNOWN, f)
}
