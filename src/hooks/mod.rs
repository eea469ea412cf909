//! The hooked driver functions: one table, the bodies grouped by family.
//!
//! To hook another function, add one line here and write its body; the export, the `dlsym` and
//! `cuGetProcAddress` paths and the driver-pointer slot follow from the line. Keep the `since`
//! column equal to the version in `cudaTypedefs.h` (`PFN_<base>_v<since>`): it is what
//! `cuGetProcAddress` callers ask with.

mod info;
mod memory;
mod nvml;
mod procaddr;

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::driver::NvmlDevice;
use crate::ffi::*;
use crate::intercept::hook_table;
use nvml::{NvmlMemory, NvmlMemoryV2};

hook_table! {
    // exported symbol        = base name               @ since  [ptsz] (C arguments)                                                          => body
    cuInit                    = "cuInit"                @ 2000  (flags: c_uint)                                                              => info::init;
    cuGetProcAddress          = "cuGetProcAddress"      @ 11030 (symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64)  => procaddr::get_proc_address;
    cuGetProcAddress_v2       = "cuGetProcAddress"      @ 12000 (symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int) => procaddr::get_proc_address_v2;

    // What the program can read about memory.
    cuDeviceTotalMem          = "cuDeviceTotalMem"      @ 2000  (bytes: *mut c_uint, dev: CUdevice)                                          => info::device_total_mem_v1;
    cuDeviceTotalMem_v2       = "cuDeviceTotalMem"      @ 3020  (bytes: *mut usize, dev: CUdevice)                                           => info::device_total_mem;
    cuMemGetInfo              = "cuMemGetInfo"          @ 2000  (free: *mut c_uint, total: *mut c_uint)                                      => info::mem_get_info_v1;
    cuMemGetInfo_v2           = "cuMemGetInfo"          @ 3020  (free: *mut usize, total: *mut usize)                                        => info::mem_get_info;

    // Linear device memory.
    cuMemAlloc                = "cuMemAlloc"            @ 2000  (dptr: *mut CUdeviceptr_v1, bytes: c_uint)                                   => memory::alloc_v1;
    cuMemAlloc_v2             = "cuMemAlloc"            @ 3020  (dptr: *mut CUdeviceptr, bytes: usize)                                       => memory::alloc;
    cuMemAllocPitch           = "cuMemAllocPitch"       @ 2000  (dptr: *mut CUdeviceptr_v1, pitch: *mut c_uint, width: c_uint, height: c_uint, elem: c_uint) => memory::alloc_pitch_v1;
    cuMemAllocPitch_v2        = "cuMemAllocPitch"       @ 3020  (dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: c_uint) => memory::alloc_pitch;
    cuMemAllocManaged         = "cuMemAllocManaged"     @ 6000  (dptr: *mut CUdeviceptr, bytes: usize, flags: c_uint)                        => memory::alloc_managed;
    cuMemFree                 = "cuMemFree"             @ 2000  (dptr: CUdeviceptr_v1)                                                       => memory::free_v1;
    cuMemFree_v2              = "cuMemFree"             @ 3020  (dptr: CUdeviceptr)                                                          => memory::free;

    // Stream-ordered allocation and pools.
    cuMemAllocAsync           = "cuMemAllocAsync"       @ 11020      (dptr: *mut CUdeviceptr, bytes: usize, stream: CUstream)                => memory::alloc_async;
    cuMemAllocAsync_ptsz      = "cuMemAllocAsync"       @ 11020 ptsz (dptr: *mut CUdeviceptr, bytes: usize, stream: CUstream)                => memory::alloc_async;
    cuMemAllocFromPoolAsync   = "cuMemAllocFromPoolAsync" @ 11020      (dptr: *mut CUdeviceptr, bytes: usize, pool: CUmemoryPool, stream: CUstream) => memory::alloc_from_pool_async;
    cuMemAllocFromPoolAsync_ptsz = "cuMemAllocFromPoolAsync" @ 11020 ptsz (dptr: *mut CUdeviceptr, bytes: usize, pool: CUmemoryPool, stream: CUstream) => memory::alloc_from_pool_async;
    cuMemFreeAsync            = "cuMemFreeAsync"        @ 11020      (dptr: CUdeviceptr, stream: CUstream)                                   => memory::free_async;
    cuMemFreeAsync_ptsz       = "cuMemFreeAsync"        @ 11020 ptsz (dptr: CUdeviceptr, stream: CUstream)                                   => memory::free_async;
    cuMemPoolCreate           = "cuMemPoolCreate"       @ 11020 (pool: *mut CUmemoryPool, props: *const CUmemPoolPropsPrefix)                => memory::pool_create;
    cuMemPoolDestroy          = "cuMemPoolDestroy"      @ 11020 (pool: CUmemoryPool)                                                         => memory::pool_destroy;

    // Virtual memory management: physical memory is counted from create to release.
    cuMemCreate               = "cuMemCreate"           @ 10020 (handle: *mut CUmemGenericAllocationHandle, bytes: usize, prop: *const CUmemAllocationProp, flags: u64) => memory::vmm_create;
    cuMemRelease              = "cuMemRelease"          @ 10020 (handle: CUmemGenericAllocationHandle)                                       => memory::vmm_release;

    // CUDA arrays.
    cuArrayCreate_v2          = "cuArrayCreate"         @ 3020  (array: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR)                    => memory::array_create;
    cuArray3DCreate_v2        = "cuArray3DCreate"       @ 3020  (array: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR)                  => memory::array3d_create;
    cuArrayDestroy            = "cuArrayDestroy"        @ 2000  (array: CUarray)                                                             => memory::array_destroy;
    cuMipmappedArrayCreate    = "cuMipmappedArrayCreate" @ 5000 (array: *mut CUmipmappedArray, desc: *const CUDA_ARRAY3D_DESCRIPTOR, levels: c_uint) => memory::mipmapped_create;
    cuMipmappedArrayDestroy   = "cuMipmappedArrayDestroy" @ 5000 (array: CUmipmappedArray)                                               => memory::mipmapped_destroy;

    // NVML (the base and version columns only matter for cuGetProcAddress).
    nvmlDeviceGetCount        = "nvmlDeviceGetCount"    @ 0 (count: *mut c_uint)                                                             => nvml::get_count;
    nvmlDeviceGetCount_v2     = "nvmlDeviceGetCount"    @ 0 (count: *mut c_uint)                                                             => nvml::get_count;
    nvmlDeviceGetHandleByIndex = "nvmlDeviceGetHandleByIndex" @ 0 (index: c_uint, dev: *mut NvmlDevice)                                  => nvml::handle_by_index;
    nvmlDeviceGetHandleByIndex_v2 = "nvmlDeviceGetHandleByIndex" @ 0 (index: c_uint, dev: *mut NvmlDevice)                               => nvml::handle_by_index;
    nvmlDeviceGetHandleByUUID = "nvmlDeviceGetHandleByUUID" @ 0 (uuid: *const c_char, dev: *mut NvmlDevice)                              => nvml::handle_by_key;
    // (nvmlUUID_t is passed by pointer: the same ABI as a string.)
    nvmlDeviceGetHandleByUUIDV = "nvmlDeviceGetHandleByUUIDV" @ 0 (uuid: *const c_char, dev: *mut NvmlDevice)                           => nvml::handle_by_key;
    nvmlDeviceGetHandleByPciBusId = "nvmlDeviceGetHandleByPciBusId" @ 0 (pci: *const c_char, dev: *mut NvmlDevice)                       => nvml::handle_by_key;
    nvmlDeviceGetHandleByPciBusId_v2 = "nvmlDeviceGetHandleByPciBusId" @ 0 (pci: *const c_char, dev: *mut NvmlDevice)                    => nvml::handle_by_key;
    nvmlDeviceGetHandleBySerial = "nvmlDeviceGetHandleBySerial" @ 0 (serial: *const c_char, dev: *mut NvmlDevice)                        => nvml::handle_by_key;
    nvmlDeviceGetIndex        = "nvmlDeviceGetIndex"    @ 0 (dev: NvmlDevice, index: *mut c_uint)                                            => nvml::get_index;
    nvmlDeviceGetMemoryInfo   = "nvmlDeviceGetMemoryInfo" @ 0 (dev: NvmlDevice, memory: *mut NvmlMemory)                                 => nvml::memory_info;
    nvmlDeviceGetMemoryInfo_v2 = "nvmlDeviceGetMemoryInfo" @ 0 (dev: NvmlDevice, memory: *mut NvmlMemoryV2)                              => nvml::memory_info_v2;
}
