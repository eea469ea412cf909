//! The few C types of the CUDA driver API the shim reads or writes.
//!
//! Everything that comes from C as an enum (`CUresult`, location types, array formats) is a plain
//! integer here, so an unknown value is just a number, never undefined behaviour.
#![allow(non_camel_case_types, non_snake_case, dead_code)]

use std::ffi::{c_int, c_uint, c_void};

pub type CUresult = c_int;
pub type CUdevice = c_int;
pub type CUdeviceptr = u64;
pub type CUdeviceptr_v1 = c_uint;
pub type CUcontext = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUevent = *mut c_void;
pub type CUmemoryPool = *mut c_void;
pub type CUarray = *mut c_void;
pub type CUmipmappedArray = *mut c_void;
pub type CUmemGenericAllocationHandle = u64;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_NO_DEVICE: CUresult = 100;
pub const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
pub const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
/// What a call other than an allocation answers when gpushim refuses it because a wait of its
/// own gave up (`bounded`).
pub const CUDA_ERROR_NOT_PERMITTED: CUresult = 800;
pub const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
pub const PROC_ADDRESS_PER_THREAD: u64 = 2;
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
pub const MEM_LOCATION_TYPE_DEVICE: c_int = 1;
/// `CU_ARRAY3D_LAYERED`, `CU_ARRAY3D_CUBEMAP`.
pub const ARRAY3D_LAYERED: c_uint = 0x01;
pub const ARRAY3D_CUBEMAP: c_uint = 0x04;

/// The legacy and per-thread default stream handles (`CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`).
pub const STREAM_LEGACY: usize = 0x1;
pub const STREAM_PER_THREAD: usize = 0x2;

/// Whether `stream` is one of the default streams (NULL, legacy, per-thread), whose work runs
/// on the current context's device.
pub fn is_default_stream(stream: CUstream) -> bool {
    matches!(stream as usize, 0 | STREAM_LEGACY | STREAM_PER_THREAD)
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemLocation {
    pub type_: c_int,
    pub id: c_int,
}

/// `CUmemAllocationProp`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUmemAllocationProp {
    pub type_: c_int,
    pub requestedHandleTypes: c_int,
    pub location: CUmemLocation,
    pub win32HandleMetaData: *mut c_void,
    pub allocFlags: [u8; 8],
}

/// The leading fields of `CUmemPoolProps` (the shim only reads the location; the rest of the
/// struct differs between CUDA versions and is never touched).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUmemPoolPropsPrefix {
    pub allocType: c_int,
    pub handleTypes: c_int,
    pub location: CUmemLocation,
}

/// `CUDA_ARRAY_DESCRIPTOR` (the `_v2` layout).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_ARRAY_DESCRIPTOR {
    pub Width: usize,
    pub Height: usize,
    pub Format: c_uint,
    pub NumChannels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (the `_v2` layout).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_ARRAY3D_DESCRIPTOR {
    pub Width: usize,
    pub Height: usize,
    pub Depth: usize,
    pub Format: c_uint,
    pub NumChannels: c_uint,
    pub Flags: c_uint,
}
