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
//! expands to `#[no_mangle] pub unsafe extern "C" fn cuFoo(..) -> CUresult` that counts the call
//! (see `registry`), runs the body under `catch_unwind` (a panic becomes `CUDA_ERROR_UNKNOWN`,
//! never an unwind across the C boundary), turns the body's `Res` into a `CUresult` and, with
//! `GPUSIM_TRACE=1`, prints one line to stderr. Every name used here must be listed in
//! `registry.rs`, or the build fails.

use crate::types::*;
use std::fmt::Debug;
use std::io::Write;

macro_rules! cu_api {
    ($(
        $(#[$meta:meta])*
        fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) $body:block
    )*) => {$(
        $(#[$meta])*
        #[no_mangle]
        #[allow(clippy::missing_safety_doc, clippy::too_many_arguments)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $crate::types::CUresult {
            $crate::registry::hit($crate::registry::Id::$name);
            #[allow(unused_unsafe)]
            let r = $crate::ffi::guard(move || -> $crate::types::Res { unsafe { $body } });
            if $crate::config::trace_enabled() {
                $crate::ffi::trace(stringify!($name), &[$(&$arg as &dyn ::std::fmt::Debug),*], r);
            }
            r
        }
    )*};
}

/// Runs `f`, mapping `Ok` to `CUDA_SUCCESS`, `Err(e)` to `e` and a panic to `CUDA_ERROR_UNKNOWN`.
#[inline]
pub fn guard<F: FnOnce() -> Res>(f: F) -> CUresult {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => CUDA_SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => CUDA_ERROR_UNKNOWN,
    }
}

/// Runs `f` for an entry point that does not return a `CUresult`; a panic gives `fallback`.
#[inline]
pub fn guard_value<T, F: FnOnce() -> T>(fallback: T, f: F) -> T {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(fallback)
}

/// One trace line: `gpusim: cuName(arg, arg) = rc`, written with a single `write(2)`.
pub fn trace(name: &str, args: &[&dyn Debug], rc: CUresult) {
    let mut line = format!("gpusim: {name}(");
    for (i, a) in args.iter().enumerate() {
        if i > 0 {
            line.push_str(", ");
        }
        line.push_str(&format!("{a:?}"));
    }
    line.push_str(&format!(") = {rc}\n"));
    trace_line(&line);
}

pub fn trace_line(line: &str) {
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}
