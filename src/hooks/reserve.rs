//! Pointer queries about memory served from a reserve (`grow`/`preallocate`, see `modes`):
//! the driver only knows the reserve's chunks, so these answer for the sub-allocation the
//! program holds. Handed out only in those modes (`pool` in the table).

use std::ffi::{c_int, c_uint, c_void};

use crate::driver::ffi::*;
use crate::platform::log::{log, Level};
use crate::accounting::reserve::Lookup;
use crate::state::State;

const POINTER_ATTRIBUTE_BUFFER_ID: c_int = 7;
const POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: c_int = 10;
pub(crate) const POINTER_ATTRIBUTE_RANGE_START_ADDR: c_int = 11;
const POINTER_ATTRIBUTE_RANGE_SIZE: c_int = 12;

/// `cuMemGetAddressRange_v2`: the sub-allocation containing `ptr` (start, bytes requested);
/// `CUDA_ERROR_NOT_FOUND` for a reserve address no live sub-allocation covers.
pub unsafe fn address_range(st: &State, real: unsafe extern "C" fn(*mut CUdeviceptr, *mut usize, CUdeviceptr) -> CUresult, base: *mut CUdeviceptr, size: *mut usize, ptr: CUdeviceptr) -> CUresult {
    let found = match st.reserve_lookup(ptr) {
        Ok(found) => found.map(|(_, l)| l),
        Err(stuck) => return crate::platform::log::refuse("cuMemGetAddressRange", stuck, CUDA_ERROR_NOT_PERMITTED),
    };
    match found {
        Some(Lookup::Live(f)) => {
            write(base, f.base);
            write(size, f.requested as usize);
            CUDA_SUCCESS
        }
        Some(Lookup::Inside) => CUDA_ERROR_NOT_FOUND,
        _ => real(base, size, ptr),
    }
}

/// The 32-bit `cuMemGetAddressRange` (v1 ABI): as above, for addresses it can express.
pub unsafe fn address_range_v1(st: &State, real: unsafe extern "C" fn(*mut CUdeviceptr_v1, *mut c_uint, CUdeviceptr_v1) -> CUresult, base: *mut CUdeviceptr_v1, size: *mut c_uint, ptr: CUdeviceptr_v1) -> CUresult {
    let found = match st.reserve_lookup(ptr as u64) {
        Ok(found) => found.map(|(_, l)| l),
        Err(stuck) => return crate::platform::log::refuse("cuMemGetAddressRange", stuck, CUDA_ERROR_NOT_PERMITTED),
    };
    match found {
        Some(Lookup::Live(f)) if f.base <= u32::MAX as u64 && f.requested <= u32::MAX as u64 => {
            write(base, f.base as CUdeviceptr_v1);
            write(size, f.requested as c_uint);
            CUDA_SUCCESS
        }
        Some(Lookup::Live(_)) => CUDA_ERROR_INVALID_VALUE,
        Some(Lookup::Inside) => CUDA_ERROR_NOT_FOUND,
        _ => real(base, size, ptr),
    }
}

/// `cuIpcGetMemHandle`: the driver's handle would name the whole chunk, and the process that
/// opens it would see the chunk's start, not the sub-allocation: silently wrong offsets. So
/// memory served from a reserve is refused with `CUDA_ERROR_NOT_SUPPORTED` and a warning.
pub unsafe fn ipc_get_mem_handle(st: &State, real: unsafe extern "C" fn(*mut c_void, CUdeviceptr) -> CUresult, handle: *mut c_void, ptr: CUdeviceptr) -> CUresult {
    let found = match st.reserve_lookup(ptr) {
        Ok(found) => found.map(|(_, l)| l),
        Err(stuck) => return crate::platform::log::refuse("cuIpcGetMemHandle", stuck, CUDA_ERROR_NOT_PERMITTED),
    };
    match found {
        Some(Lookup::Outside) | None => real(handle, ptr),
        Some(_) => {
            log!(
                Level::Warn,
                "cuIpcGetMemHandle({ptr:#x}) refused: the memory comes from gpushim's {} reserve, which cannot be shared \
                 between processes; use GPUSHIM_MEMORY_MODE=passthrough for programs that share device memory",
                st.settings.memory_mode
            );
            CUDA_ERROR_NOT_SUPPORTED
        }
    }
}

/// Corrects one attribute the driver answered for `ptr` (`data` holds the driver's answer).
/// Returns an error to report instead, for a reserve address no live sub-allocation covers
/// (`strict`: `cuPointerGetAttribute`; `cuPointerGetAttributes` answers such addresses with
/// the unknown-pointer defaults instead).
pub unsafe fn patch_attribute(st: &State, attr: c_int, data: *mut c_void, ptr: CUdeviceptr, strict: bool) -> Option<CUresult> {
    if data.is_null() || !matches!(attr, POINTER_ATTRIBUTE_BUFFER_ID | POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE | POINTER_ATTRIBUTE_RANGE_START_ADDR | POINTER_ATTRIBUTE_RANGE_SIZE) {
        return None;
    }
    let looked = match st.reserve_lookup(ptr) {
        Ok(looked) => looked,
        Err(stuck) => return Some(crate::platform::log::refuse("cuPointerGetAttribute", stuck, CUDA_ERROR_NOT_PERMITTED)),
    };
    let found = match looked?.1 {
        Lookup::Outside => return None,
        Lookup::Inside if strict => return Some(CUDA_ERROR_INVALID_VALUE),
        Lookup::Inside => None,
        Lookup::Live(f) => Some(f),
    };
    match attr {
        POINTER_ATTRIBUTE_BUFFER_ID => *data.cast::<u64>() = found.map_or(0, |f| f.buffer_id),
        POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE => *data.cast::<u8>() = 0,
        POINTER_ATTRIBUTE_RANGE_START_ADDR => *data.cast::<u64>() = found.map_or(0, |f| f.base),
        _ => *data.cast::<usize>() = found.map_or(0, |f| f.requested as usize),
    }
    None
}

unsafe fn write<T>(out: *mut T, value: T) {
    if !out.is_null() {
        *out = value;
    }
}
