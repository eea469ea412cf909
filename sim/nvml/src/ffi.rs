//! The one way an exported NVML function is written, and the helpers its bodies use.
//!
//! ```ignore
//! nvml_api! {
//!     fn nvmlDeviceGetFoo(device: nvmlDevice_t, out: *mut c_uint) {
//!         let d = device_arg(device)?;   // after need_init()?, where the real NVML needs it
//!         put(out, 1)?;
//!         Ok(())
//!     }
//! }
//! ```
//! expands (through `gpusim_common::exported_fns!`, shared with `sim/cuda`) to
//! `#[no_mangle] pub unsafe extern "C" fn nvmlDeviceGetFoo(..) -> nvmlReturn_t` that counts the call (see `registry`), runs the body under `catch_unwind` (a panic becomes
//! `NVML_ERROR_UNKNOWN`, never an unwind across the C boundary), turns the body's `Res` into an
//! `nvmlReturn_t` and, with `GPUSIM_TRACE=1`, prints one line
//! `gpusim-nvml: nvmlDeviceGetFoo(args) = rc` to stderr. Every name used here
//! must be listed in `registry.rs`, or the build fails.

use crate::types::*;
pub use gpusim_common::ffi::{guard_value, trace_line};
use std::ffi::{c_char, c_uint, CStr};
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::Mutex;

macro_rules! nvml_api {
    ($($fns:tt)*) => {
        gpusim_common::exported_fns! {
            returns $crate::types::nvmlReturn_t, result $crate::types::Res, guard $crate::ffi::guard,
            id $crate::registry::Id, count $crate::registry::hit,
            trace_if $crate::config::trace_enabled, prefix $crate::config::PREFIX;
            $($fns)*
        }
    };
}

/// Runs `f`, mapping `Ok` to `NVML_SUCCESS`, `Err(e)` to `e` and a panic to `NVML_ERROR_UNKNOWN`.
#[inline]
pub fn guard<F: FnOnce() -> Res>(f: F) -> nvmlReturn_t {
    gpusim_common::ffi::guard(NVML_SUCCESS, NVML_ERROR_UNKNOWN, f)
}

// ---- initialisation --------------------------------------------------------------------------

/// The `nvmlInit*` reference count: every successful init adds one, `nvmlShutdown` takes one.
static INIT: Mutex<u64> = Mutex::new(0);

fn init_count() -> std::sync::MutexGuard<'static, u64> {
    INIT.lock().unwrap_or_else(|e| e.into_inner())
}

/// Serialises initialisations, as the real NVML's lock does.
static INIT_WORK: Mutex<()> = Mutex::new(());
/// The thread (`gettid`) inside an initialisation, 0 when none.
static INIT_OWNER: AtomicI64 = AtomicI64::new(0);

/// One `nvmlInit*`, as the real NVML does it (driver 580, seen on an H100): under a lock, it
/// loads the CUDA driver (`dlopen("libcuda.so.1")`) and looks `cuGetExportTable` up with the
/// process' `dlsym` (whatever interposes it). Whatever that look-up reaches runs under the
/// lock: another `nvmlInit*` there, on the same thread, deadlocks the real NVML. The simulator
/// says so and aborts rather than hang the test; another thread waits, as with the real one.
pub fn init() {
    // SAFETY: a plain system call.
    let me = unsafe { libc::gettid() } as i64;
    if INIT_OWNER.load(Ordering::Acquire) == me {
        eprintln!("gpusim-nvml: nvmlInit called again while this thread initialises NVML: the real NVML deadlocks here");
        std::process::abort();
    }
    let _work = INIT_WORK.lock().unwrap_or_else(|e| e.into_inner());
    INIT_OWNER.store(me, Ordering::Release);
    load_cuda();
    INIT_OWNER.store(0, Ordering::Release);
    *init_count() += 1;
}

/// The CUDA driver's `cuGetExportTable`, looked up as the real NVML does at initialisation; the
/// library stays loaded. No `libcuda.so.1` on the search path: nothing.
fn load_cuda() {
    // SAFETY: plain libdl calls with NUL-terminated names; the handle is kept, never closed.
    unsafe {
        let h = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW);
        if !h.is_null() {
            libc::dlsym(h, c"cuGetExportTable".as_ptr());
        }
    }
}

/// `nvmlInitWithFlags` as the real `nvmlInit` and `nvmlInit_v2` call it: through the dynamic
/// linker (the real library calls its own export through its PLT), so a preloaded library
/// exporting the name gets the call. Looked up once (`RTLD_DEFAULT`: the scope a PLT entry of
/// this library is bound in).
pub fn init_through_export() -> Res {
    type InitWithFlags = unsafe extern "C" fn(c_uint) -> nvmlReturn_t;
    static FOUND: AtomicUsize = AtomicUsize::new(0);
    let mut f = FOUND.load(Ordering::Acquire);
    if f == 0 {
        // SAFETY: a plain look-up of a NUL-terminated name.
        f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"nvmlInitWithFlags".as_ptr()) } as usize;
        if f == 0 {
            f = crate::api::nvmlInitWithFlags as InitWithFlags as usize;
        }
        FOUND.store(f, Ordering::Release);
    }
    // SAFETY: `f` is an `nvmlInitWithFlags`: this library's own, or an interposer's with its
    // signature (nvml.h).
    match unsafe { std::mem::transmute::<usize, InitWithFlags>(f)(0) } {
        NVML_SUCCESS => Ok(()),
        e => Err(e),
    }
}

/// `Err(NVML_ERROR_UNINITIALIZED)` when the count is already 0.
pub fn shutdown() -> Res {
    let mut n = init_count();
    if *n == 0 {
        return Err(NVML_ERROR_UNINITIALIZED);
    }
    *n -= 1;
    Ok(())
}

/// `NVML_ERROR_UNINITIALIZED` unless `nvmlInit*` has been called more often than `nvmlShutdown`.
pub fn need_init() -> Res {
    if *init_count() == 0 {
        Err(NVML_ERROR_UNINITIALIZED)
    } else {
        Ok(())
    }
}

// ---- arguments -------------------------------------------------------------------------------

/// Writes `v` to the caller's out-pointer; NULL is `NVML_ERROR_INVALID_ARGUMENT`.
///
/// # Safety
/// A non-NULL `p` must be valid for a write of `T`.
#[inline]
pub unsafe fn put<T>(p: *mut T, v: T) -> Res {
    if p.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    p.write(v);
    Ok(())
}

/// Fails with `NVML_ERROR_INVALID_ARGUMENT` if `p` is NULL.
#[inline]
pub fn non_null<T>(p: *const T) -> Res {
    if p.is_null() {
        Err(NVML_ERROR_INVALID_ARGUMENT)
    } else {
        Ok(())
    }
}

/// Copies `s` and a NUL into the caller's `buf` of `length` bytes: NULL is
/// `NVML_ERROR_INVALID_ARGUMENT`, fewer than `s.len() + 1` bytes `NVML_ERROR_INSUFFICIENT_SIZE`.
///
/// # Safety
/// A non-NULL `buf` must be valid for `length` bytes.
pub unsafe fn put_str(buf: *mut c_char, length: c_uint, s: &str) -> Res {
    non_null(buf)?;
    if (length as usize) < s.len() + 1 {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    std::ptr::copy_nonoverlapping(s.as_ptr().cast::<c_char>(), buf, s.len());
    *buf.add(s.len()) = 0;
    Ok(())
}

/// `s` and a NUL in a fixed `char[N]` field (cut to `N - 1` bytes).
pub fn fixed_str<const N: usize>(s: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (o, b) in out.iter_mut().zip(s.bytes().take(N.saturating_sub(1))) {
        *o = b as c_char;
    }
    out
}

/// The caller's NUL-terminated string (lossy UTF-8); NULL is `NVML_ERROR_INVALID_ARGUMENT`.
///
/// # Safety
/// A non-NULL `p` must point to a NUL-terminated string.
pub unsafe fn c_str(p: *const c_char) -> Res<String> {
    non_null(p)?;
    Ok(CStr::from_ptr(p).to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_into_buffers() {
        let mut buf = [0x7f as c_char; 8];
        unsafe {
            assert_eq!(
                put_str(buf.as_mut_ptr(), 8, "abcdefgh"),
                Err(NVML_ERROR_INSUFFICIENT_SIZE)
            );
            assert_eq!(
                put_str(std::ptr::null_mut(), 8, "a"),
                Err(NVML_ERROR_INVALID_ARGUMENT)
            );
            assert_eq!(put_str(buf.as_mut_ptr(), 8, "abcdefg"), Ok(()));
            assert_eq!(CStr::from_ptr(buf.as_ptr()).to_str().unwrap(), "abcdefg");
        }
        let f: [c_char; 4] = fixed_str("abcdef");
        assert_eq!(f, [b'a' as c_char, b'b' as c_char, b'c' as c_char, 0]);
    }

    #[test]
    fn panics_become_unknown() {
        assert_eq!(guard(|| panic!("boom")), NVML_ERROR_UNKNOWN);
        assert_eq!(guard(|| Err(NVML_ERROR_NOT_FOUND)), NVML_ERROR_NOT_FOUND);
        assert_eq!(guard_value(7, || -> i32 { panic!("boom") }), 7);
    }
}
