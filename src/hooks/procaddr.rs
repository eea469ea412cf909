//! `cuGetProcAddress`: ask the driver with the caller's exact arguments, then hand back the
//! hook of the variant it chose (see `intercept::substitute`).

use std::ffi::{c_char, c_int, c_void, CStr};

use crate::driver::ffi::*;
use crate::hooks::intercept::substitute;
use crate::state::State;

type V1 = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> CUresult;
type V2 = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CUresult;

pub unsafe fn get_proc_address(st: &State, real: V1, symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) -> CUresult {
    let result = real(symbol, pfn, version, flags);
    finish(st, result, symbol, pfn, version, flags)
}

pub unsafe fn get_proc_address_v2(
    st: &State,
    real: V2,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    let result = real(symbol, pfn, version, flags, status);
    finish(st, result, symbol, pfn, version, flags)
}

/// # Safety
/// `pfn` and `symbol` are what the driver just accepted (checked for NULL here).
unsafe fn finish(st: &State, result: CUresult, symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) -> CUresult {
    if result == CUDA_SUCCESS && !pfn.is_null() && !symbol.is_null() {
        // SAFETY: `symbol` is the NUL-terminated name the driver just accepted.
        *pfn = substitute(st, &|| unsafe { CStr::from_ptr(symbol) }, version, flags, *pfn);
    }
    result
}
