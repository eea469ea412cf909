//! The public C API (`include/gpushim.h`): lets a program find out whether it runs under the
//! shim and what its budgets are. Programs look these up with `dlsym(RTLD_DEFAULT, …)` so that
//! they also run without the shim.

use std::ffi::{c_char, c_int};

use crate::state;

/// The shim's version, a static NUL-terminated string.
#[no_mangle]
pub extern "C" fn gpushim_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// Memory of device `ordinal` (the program's ordinal): bytes in use, the peak, and the
/// effective limit. Any out-pointer may be NULL. Returns 0, or -1 when the shim is not active
/// (disabled, broken configuration, no driver) or the ordinal is not a device it accounts for.
#[no_mangle]
pub extern "C" fn gpushim_memory_usage(ordinal: c_int, in_use: *mut u64, peak: *mut u64, limit: *mut u64) -> c_int {
    let answer = std::panic::catch_unwind(|| {
        let st = crate::hooks::state().filter(|s| s.mode == state::Mode::Active)?;
        let budget = st.budget(ordinal)?;
        Some((budget.in_use(), budget.peak_in_use(), st.limit(ordinal)?))
    });
    let Ok(Some((u, p, l))) = answer else { return -1 };
    for (out, value) in [(in_use, u), (peak, p), (limit, l)] {
        if !out.is_null() {
            // SAFETY: the caller passes NULL or a pointer to a writable u64.
            unsafe { *out = value };
        }
    }
    0
}

/// Checks that the library's own failure handling works in this process: raises an internal
/// failure (without the panic message) and catches it, as every entry point catches one.
/// Returns 0 when it was caught; an uncaught one would have ended the process (an unwinder
/// that cannot find the library's unwind tables). Does not start the shim.
#[no_mangle]
pub extern "C" fn gpushim_self_check() -> c_int {
    match std::panic::catch_unwind(|| std::panic::resume_unwind(Box::new(0u8))) {
        Err(_) => 0,
        Ok(()) => 1,
    }
}
