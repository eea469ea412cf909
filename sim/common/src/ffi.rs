//! The exported-function wrapper both libraries are written with.
//!
//! A library defines its own one-line macro (`cu_api!`, `nvml_api!`) that fills in its types and
//! paths and hands the functions to [`exported_fns!`]:
//!
//! ```ignore
//! macro_rules! cu_api {
//!     ($($fns:tt)*) => {
//!         gpusim_common::exported_fns! {
//!             returns $crate::types::CUresult, result $crate::types::Res, guard $crate::ffi::guard,
//!             id $crate::registry::Id, count $crate::registry::hit,
//!             trace_if $crate::config::trace_enabled, prefix "gpusim";
//!             $($fns)*
//!         }
//!     };
//! }
//! ```
//!
//! Each `fn name(args) { body }` becomes `#[no_mangle] pub unsafe extern "C" fn name(args) ->
//! <returns>` that counts the call (`count(Id::name)`, so every name must be in the library's
//! `exports!` list), runs the body (an `unsafe` block returning `result`) through `guard`
//! (the library's wrapper of [`guard`]: `catch_unwind`, `Ok` is its success code, `Err(e)` is
//! `e`, a panic is its "unknown error" code, never an unwind across the C boundary) and, when `trace_if()` is true, writes one stderr line
//! `<prefix>: name(arg, arg) = rc`.

use std::fmt::{Debug, Display};
use std::io::Write;

#[macro_export]
macro_rules! exported_fns {
    (
        returns $ret:ty, result $res:ty, guard $guard:path,
        id $id:ty, count $hit:path,
        trace_if $trace_enabled:path, prefix $prefix:expr;
        $(
            $(#[$meta:meta])*
            fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) $body:block
        )*
    ) => {$(
        $(#[$meta])*
        #[no_mangle]
        // macro_metavars_in_unsafe: the bodies are the library's own code, written to run in
        // `unsafe extern "C"` functions.
        #[allow(
            clippy::missing_safety_doc,
            clippy::too_many_arguments,
            clippy::macro_metavars_in_unsafe
        )]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            $hit(<$id>::$name);
            if let Some(code) = $crate::faults::injected(stringify!($name)) {
                return code as $ret;
            }
            #[allow(unused_unsafe)]
            let r = $guard(move || -> $res { unsafe { $body } });
            if $trace_enabled() {
                $crate::ffi::trace($prefix, stringify!($name), &[$(&$arg as &dyn ::std::fmt::Debug),*], r);
            }
            r
        }
    )*};
}

/// `at_load!(path::to::f)`, at a library's top level: a load-time constructor (an
/// `.init_array` entry of the library itself) that calls `f()` under `guard_value` when the
/// library is loaded, whether or not it is ever called.
#[macro_export]
macro_rules! at_load {
    ($f:path) => {
        extern "C" fn on_load() {
            $crate::ffi::guard_value((), || {
                $f();
            })
        }

        #[used]
        #[link_section = ".init_array"]
        static ON_LOAD: extern "C" fn() = on_load;
    };
}

/// Runs `f`, mapping `Ok` to `success`, `Err(e)` to `e` and a panic to `panic`.
#[inline]
pub fn guard<R, F: FnOnce() -> Result<(), R>>(success: R, panic: R, f: F) -> R {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => success,
        Ok(Err(e)) => e,
        Err(_) => panic,
    }
}

/// Runs `f` for an entry point that does not return a status code; a panic gives `fallback`.
#[inline]
pub fn guard_value<T, F: FnOnce() -> T>(fallback: T, f: F) -> T {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(fallback)
}

/// `<prefix>: name(arg, arg) = rc` and a newline.
pub fn trace_text(prefix: &str, name: &str, args: &[&dyn Debug], rc: impl Display) -> String {
    let mut line = format!("{prefix}: {name}(");
    for (i, a) in args.iter().enumerate() {
        if i > 0 {
            line.push_str(", ");
        }
        line.push_str(&format!("{a:?}"));
    }
    line.push_str(&format!(") = {rc}\n"));
    line
}

/// One trace line (`trace_text`), written with a single `write(2)`.
pub fn trace(prefix: &str, name: &str, args: &[&dyn Debug], rc: impl Display) {
    trace_line(&trace_text(prefix, name, args, rc));
}

/// Writes `line` to stderr in one piece.
pub fn trace_line(line: &str) {
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards() {
        assert_eq!(guard(0, 999, || panic!("boom")), 999);
        assert_eq!(guard(0, 999, || Err(6)), 6);
        assert_eq!(guard(0, 999, || Ok(())), 0);
        assert_eq!(guard_value(7, || -> i32 { panic!("boom") }), 7);
        assert_eq!(guard_value(7, || 8), 8);
    }

    #[test]
    fn trace_lines() {
        let p = 0x10usize as *const u8;
        assert_eq!(
            trace_text("gpusim", "cuFoo", &[&1i32, &p, &"s"], 3),
            "gpusim: cuFoo(1, 0x10, \"s\") = 3\n"
        );
        assert_eq!(
            trace_text("gpusim-nvml", "nvmlInit", &[], 0),
            "gpusim-nvml: nvmlInit() = 0\n"
        );
    }

    mod wrapped {
        pub type Res = Result<(), i32>;
        pub static HITS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        #[allow(non_camel_case_types, dead_code)]
        pub enum Id {
            gpusim_common_test_twice,
            gpusim_common_test_panics,
        }
        pub fn hit(_: Id) {
            HITS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        pub fn guard(f: impl FnOnce() -> Res) -> i32 {
            super::guard(0, 999, f)
        }
        pub fn tracing() -> bool {
            false
        }
        crate::exported_fns! {
            returns i32, result Res, guard guard,
            id Id, count hit, trace_if tracing, prefix "gpusim-test";
            /// Doubles into `out`.
            fn gpusim_common_test_twice(x: i32, out: *mut i32) {
                if out.is_null() {
                    return Err(1);
                }
                *out = 2 * x;
                Ok(())
            }
            fn gpusim_common_test_panics() {
                panic!("inside")
            }
        }
    }

    #[test]
    fn wrapper() {
        use wrapped::*;
        let mut v = 0;
        unsafe {
            assert_eq!(gpusim_common_test_twice(21, &mut v), 0);
            assert_eq!(gpusim_common_test_twice(1, std::ptr::null_mut()), 1);
            assert_eq!(gpusim_common_test_panics(), 999);
        }
        assert_eq!(v, 42);
        assert_eq!(HITS.load(std::sync::atomic::Ordering::Relaxed), 3);
    }
}
