//! The hooked driver functions: one table, the bodies grouped by family.
//!
//! To hook another function, add one line here and write its body; the export, the `dlsym` and
//! `cuGetProcAddress` paths and the driver-pointer slot follow from the line. A hook marked
//! `split`, `pool`, `limit`, `place` and/or `compute` is handed out only while devices are
//! split, a memory mode serves allocations from a reserve, any limit applies
//! (`State::limits_apply`), the placement log is on, or the `duty` pacer paces launches; `green`
//! marks those also needed in the `green` compute mode (`compute::green`); otherwise
//! the program gets the driver's own function. `, lane path` after the body names a fast lane
//! the export tries first (`src/lane.rs`). Keep the `since`
//! column equal to the version in `cudaTypedefs.h` (`PFN_<base>_v<since>`): it is what
//! `cuGetProcAddress` callers ask with.

pub mod api;
mod devices;
mod graph;
mod green;
mod info;
pub mod intercept;
mod launch;
mod memory;
mod nvml;
pub mod nvml_virtual;
pub mod private;
mod procaddr;
mod reserve;

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::driver::NvmlDevice;
use crate::driver::ffi::*;
use crate::hooks::intercept::hook_table;
use devices::CUmemAccessDesc;
use launch::CUlaunchConfigHead;
use nvml::{NvmlMemory, NvmlMemoryV2};


/// The shim's state, initialising it on first use (`state::get`), the hook table registered
/// with the driver layer first: the state opens the driver through it (`driver::table`). The
/// way in for every hook, `dlsym` and the API; the same single atomic load once the state is
/// there.
#[inline]
pub fn state() -> Option<&'static crate::state::State> {
    match crate::state::get_if_ready() {
        Some(st) => Some(st),
        None => first_state(),
    }
}

#[cold]
#[inline(never)]
fn first_state() -> Option<&'static crate::state::State> {
    crate::driver::table::register(&intercept::REALS);
    crate::state::get()
}

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
    cuMemAlloc_v2             = "cuMemAlloc"            @ 3020  (dptr: *mut CUdeviceptr, bytes: usize)                                       => memory::alloc, lane crate::accounting::lane::alloc;
    cuMemAllocPitch           = "cuMemAllocPitch"       @ 2000  (dptr: *mut CUdeviceptr_v1, pitch: *mut c_uint, width: c_uint, height: c_uint, elem: c_uint) => memory::alloc_pitch_v1;
    cuMemAllocPitch_v2        = "cuMemAllocPitch"       @ 3020  (dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: c_uint) => memory::alloc_pitch;
    cuMemAllocManaged         = "cuMemAllocManaged"     @ 6000  (dptr: *mut CUdeviceptr, bytes: usize, flags: c_uint)                        => memory::alloc_managed;
    cuMemFree                 = "cuMemFree"             @ 2000  (dptr: CUdeviceptr_v1)                                                       => memory::free_v1;
    cuMemFree_v2              = "cuMemFree"             @ 3020  (dptr: CUdeviceptr)                                                          => memory::free, lane crate::accounting::lane::free;

    // Stream-ordered allocation and pools.
    cuMemAllocAsync           = "cuMemAllocAsync"       @ 11020      (dptr: *mut CUdeviceptr, bytes: usize, stream: CUstream)                => memory::alloc_async;
    cuMemAllocAsync_ptsz      = "cuMemAllocAsync"       @ 11020 ptsz (dptr: *mut CUdeviceptr, bytes: usize, stream: CUstream)                => memory::alloc_async;
    cuMemAllocFromPoolAsync   = "cuMemAllocFromPoolAsync" @ 11020      (dptr: *mut CUdeviceptr, bytes: usize, pool: CUmemoryPool, stream: CUstream) => memory::alloc_from_pool_async;
    cuMemAllocFromPoolAsync_ptsz = "cuMemAllocFromPoolAsync" @ 11020 ptsz (dptr: *mut CUdeviceptr, bytes: usize, pool: CUmemoryPool, stream: CUstream) => memory::alloc_from_pool_async;
    cuMemFreeAsync            = "cuMemFreeAsync"        @ 11020      (dptr: CUdeviceptr, stream: CUstream)                                   => memory::free_async;
    cuMemFreeAsync_ptsz       = "cuMemFreeAsync"        @ 11020 ptsz (dptr: CUdeviceptr, stream: CUstream)                                   => memory::free_async;
    cuMemPoolCreate           = "cuMemPoolCreate"       @ 11020 (pool: *mut CUmemoryPool, props: *const CUmemPoolPropsPrefix)                => memory::pool_create;
    cuMemPoolDestroy          = "cuMemPoolDestroy"      @ 11020 (pool: CUmemoryPool)                                                         => memory::pool_destroy;

    // Virtual memory management: physical memory is counted from create until released...
    cuMemCreate               = "cuMemCreate"           @ 10020 (handle: *mut CUmemGenericAllocationHandle, bytes: usize, prop: *const CUmemAllocationProp, flags: u64) => memory::vmm_create;
    cuMemRelease              = "cuMemRelease"          @ 10020 (handle: CUmemGenericAllocationHandle)                                       => memory::vmm_release;
    cuMemExportToShareableHandle = "cuMemExportToShareableHandle" @ 10020 (shareable: *mut c_void, handle: CUmemGenericAllocationHandle, kind: c_int, flags: u64) => memory::vmm_export;
    // ... and stays counted while mapped (src/vmm.rs): released *and* unmapped frees it.
    cuMemMap                  = "cuMemMap"              @ 10020 (ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64) => memory::vmm_map;
    cuMemUnmap                = "cuMemUnmap"            @ 10020 (ptr: CUdeviceptr, size: usize)                                              => memory::vmm_unmap;
    cuMemRetainAllocationHandle = "cuMemRetainAllocationHandle" @ 11000 (handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void)    => memory::vmm_retain;

    // Pointer queries about memory served from a reserve (grow/preallocate; hooks/reserve.rs).
    cuMemGetAddressRange      = "cuMemGetAddressRange"  @ 2000 pool (base: *mut CUdeviceptr_v1, size: *mut c_uint, ptr: CUdeviceptr_v1)  => reserve::address_range_v1;
    cuMemGetAddressRange_v2   = "cuMemGetAddressRange"  @ 3020 pool (base: *mut CUdeviceptr, size: *mut usize, ptr: CUdeviceptr)        => reserve::address_range;
    cuIpcGetMemHandle         = "cuIpcGetMemHandle"     @ 4010 pool (handle: *mut c_void, ptr: CUdeviceptr)                              => reserve::ipc_get_mem_handle;

    // CUDA arrays.
    cuArrayCreate_v2          = "cuArrayCreate"         @ 3020  (array: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR)                    => memory::array_create;
    cuArray3DCreate_v2        = "cuArray3DCreate"       @ 3020  (array: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR)                  => memory::array3d_create;
    cuArrayDestroy            = "cuArrayDestroy"        @ 2000  (array: CUarray)                                                             => memory::array_destroy;
    cuMipmappedArrayCreate    = "cuMipmappedArrayCreate" @ 5000 (array: *mut CUmipmappedArray, desc: *const CUDA_ARRAY3D_DESCRIPTOR, levels: c_uint) => memory::mipmapped_create;
    cuMipmappedArrayDestroy   = "cuMipmappedArrayDestroy" @ 5000 (array: CUmipmappedArray)                                               => memory::mipmapped_destroy;

    // Device ordinals while devices are split (`split`: handed out only then; hooks/devices.rs).
    cuDeviceGetCount          = "cuDeviceGetCount"      @ 2000 split  (count: *mut c_int)                                                   => devices::get_count;
    cuDeviceGet               = "cuDeviceGet"           @ 2000 split  (dev: *mut CUdevice, ordinal: c_int)                                  => devices::get;
    cuDeviceGetName           = "cuDeviceGetName"       @ 2000 split  (name: *mut c_char, len: c_int, dev: CUdevice)                        => devices::get_name;
    cuDeviceGetUuid           = "cuDeviceGetUuid"       @ 9020 split  (uuid: *mut [u8; 16], dev: CUdevice)                                  => devices::get_uuid;
    cuDeviceGetUuid_v2        = "cuDeviceGetUuid"       @ 11040 split (uuid: *mut [u8; 16], dev: CUdevice)                                  => devices::get_uuid;
    cuDeviceGetAttribute      = "cuDeviceGetAttribute"  @ 2000 split  (value: *mut c_int, attr: c_int, dev: CUdevice)                       => devices::get_attribute;
    cuDeviceGetPCIBusId       = "cuDeviceGetPCIBusId"   @ 4010 split  (id: *mut c_char, len: c_int, dev: CUdevice)                          => devices::get_pci_bus_id;
    cuDeviceGetByPCIBusId     = "cuDeviceGetByPCIBusId" @ 4010 split  (dev: *mut CUdevice, id: *const c_char)                              => devices::get_by_pci_bus_id;
    cuDeviceCanAccessPeer     = "cuDeviceCanAccessPeer" @ 4000 split  (can: *mut c_int, dev: CUdevice, peer: CUdevice)                      => devices::can_access_peer;
    cuDeviceGetP2PAttribute   = "cuDeviceGetP2PAttribute" @ 8000 split (value: *mut c_int, attr: c_int, src: CUdevice, dst: CUdevice)      => devices::get_p2p_attribute;
    cuDeviceComputeCapability = "cuDeviceComputeCapability" @ 2000 split (major: *mut c_int, minor: *mut c_int, dev: CUdevice)              => devices::compute_capability;
    cuDeviceGetLuid           = "cuDeviceGetLuid"       @ 10000 split (luid: *mut c_char, mask: *mut c_uint, dev: CUdevice)                 => devices::get_luid;
    cuDeviceGetDefaultMemPool = "cuDeviceGetDefaultMemPool" @ 11020 split (pool: *mut CUmemoryPool, dev: CUdevice)                          => devices::get_mem_pool;
    cuDeviceGetMemPool        = "cuDeviceGetMemPool"    @ 11020 split (pool: *mut CUmemoryPool, dev: CUdevice)                              => devices::get_mem_pool;
    cuDeviceSetMemPool        = "cuDeviceSetMemPool"    @ 11020 split (dev: CUdevice, pool: CUmemoryPool)                                   => devices::set_mem_pool;
    cuDeviceGetTexture1DLinearMaxWidth = "cuDeviceGetTexture1DLinearMaxWidth" @ 11010 split (max: *mut usize, format: c_int, channels: c_uint, dev: CUdevice) => devices::texture_1d_max_width;
    cuDeviceGetExecAffinitySupport = "cuDeviceGetExecAffinitySupport" @ 11040 split (pi: *mut c_int, kind: c_int, dev: CUdevice)           => devices::exec_affinity_support;
    cuDeviceGraphMemTrim      = "cuDeviceGraphMemTrim"  @ 11040 split limit (dev: CUdevice)                                                  => devices::graph_mem_trim;
    cuDeviceGetGraphMemAttribute = "cuDeviceGetGraphMemAttribute" @ 11040 split (dev: CUdevice, attr: c_int, value: *mut c_void)           => devices::graph_mem_attribute;
    cuDeviceSetGraphMemAttribute = "cuDeviceSetGraphMemAttribute" @ 11040 split (dev: CUdevice, attr: c_int, value: *mut c_void)           => devices::graph_mem_attribute;
    // (`green`: the green compute mode's primary contexts, hooks/green.rs; else as devices.rs)
    cuDevicePrimaryCtxRetain  = "cuDevicePrimaryCtxRetain" @ 7000 split pool green (ctx: *mut CUcontext, dev: CUdevice)                          => green::primary_retain;
    cuDevicePrimaryCtxRelease = "cuDevicePrimaryCtxRelease" @ 7000 split pool limit compute green (dev: CUdevice)                                        => green::primary_release;
    cuDevicePrimaryCtxRelease_v2 = "cuDevicePrimaryCtxRelease" @ 11000 split pool limit compute green (dev: CUdevice)                                    => green::primary_release;
    cuDevicePrimaryCtxReset   = "cuDevicePrimaryCtxReset" @ 7000 split pool limit compute green (dev: CUdevice)                                          => green::primary_reset;
    cuDevicePrimaryCtxReset_v2 = "cuDevicePrimaryCtxReset" @ 11000 split pool limit compute green (dev: CUdevice)                                        => green::primary_reset;
    cuDevicePrimaryCtxGetState = "cuDevicePrimaryCtxGetState" @ 7000 split (dev: CUdevice, flags: *mut c_uint, active: *mut c_int)          => devices::primary_get_state;
    cuDevicePrimaryCtxSetFlags = "cuDevicePrimaryCtxSetFlags" @ 7000 split (dev: CUdevice, flags: c_uint)                                   => devices::primary_set_flags;
    cuDevicePrimaryCtxSetFlags_v2 = "cuDevicePrimaryCtxSetFlags" @ 11000 split (dev: CUdevice, flags: c_uint)                               => devices::primary_set_flags;
    cuCtxCreate_v2            = "cuCtxCreate"           @ 3020 split pool  (ctx: *mut CUcontext, flags: c_uint, dev: CUdevice)                   => devices::ctx_create_v2;
    cuCtxCreate_v3            = "cuCtxCreate"           @ 11040 split pool (ctx: *mut CUcontext, params: *mut c_void, n: c_int, flags: c_uint, dev: CUdevice) => devices::ctx_create_v3;
    cuCtxCreate_v4            = "cuCtxCreate"           @ 12050 split pool (ctx: *mut CUcontext, params: *mut c_void, flags: c_uint, dev: CUdevice) => devices::ctx_create_v4;
    cuCtxDestroy              = "cuCtxDestroy"          @ 2000 split pool limit compute  (ctx: CUcontext)                                                      => devices::ctx_destroy;
    cuCtxDestroy_v2           = "cuCtxDestroy"          @ 4000 split pool limit compute  (ctx: CUcontext)                                                      => devices::ctx_destroy;
    cuCtxGetDevice            = "cuCtxGetDevice"        @ 2000 split  (dev: *mut CUdevice)                                                  => devices::ctx_get_device;
    cuCtxGetDevice_v2         = "cuCtxGetDevice"        @ 13000 split (dev: *mut CUdevice, ctx: CUcontext)                                  => devices::ctx_get_device_v2;
    cuMemGetAllocationGranularity = "cuMemGetAllocationGranularity" @ 10020 split (gran: *mut usize, prop: *const CUmemAllocationProp, option: c_int) => devices::allocation_granularity;
    cuMemSetAccess            = "cuMemSetAccess"        @ 10020 split (ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize) => devices::set_access;
    cuMemGetAccess            = "cuMemGetAccess"        @ 10020 split (flags: *mut u64, location: *const CUmemLocation, ptr: CUdeviceptr)   => devices::get_access;
    cuMemPoolSetAccess        = "cuMemPoolSetAccess"    @ 11020 split (pool: CUmemoryPool, desc: *const CUmemAccessDesc, count: usize)      => devices::pool_set_access;
    cuMemPoolGetAccess        = "cuMemPoolGetAccess"    @ 11020 split (flags: *mut c_int, pool: CUmemoryPool, location: *const CUmemLocation) => devices::pool_get_access;
    cuMemAdvise               = "cuMemAdvise"           @ 8000 split  (ptr: CUdeviceptr, count: usize, advice: c_int, dev: CUdevice)        => devices::advise;
    cuMemAdvise_v2            = "cuMemAdvise"           @ 12020 split (ptr: CUdeviceptr, count: usize, advice: c_int, location: CUmemLocation) => devices::advise_v2;
    cuMemPrefetchAsync        = "cuMemPrefetchAsync"    @ 8000 split  (ptr: CUdeviceptr, count: usize, dev: CUdevice, stream: CUstream)     => devices::prefetch;
    cuMemPrefetchAsync_ptsz   = "cuMemPrefetchAsync"    @ 8000 ptsz split (ptr: CUdeviceptr, count: usize, dev: CUdevice, stream: CUstream) => devices::prefetch;
    cuMemPrefetchAsync_v2     = "cuMemPrefetchAsync"    @ 12020 split (ptr: CUdeviceptr, count: usize, location: CUmemLocation, flags: c_uint, stream: CUstream) => devices::prefetch_v2;
    cuMemPrefetchAsync_v2_ptsz = "cuMemPrefetchAsync"   @ 12020 ptsz split (ptr: CUdeviceptr, count: usize, location: CUmemLocation, flags: c_uint, stream: CUstream) => devices::prefetch_v2;
    cuPointerGetAttribute     = "cuPointerGetAttribute" @ 4000 split pool  (data: *mut c_void, attr: c_int, ptr: CUdeviceptr)                   => devices::pointer_get_attribute;
    // The runtime's private tables (src/private.rs): wrapped while splitting.
    cuGetExportTable          = "cuGetExportTable"      @ 3000 split green (table: *mut *const c_void, id: *const [u8; 16])                      => crate::hooks::private::get_export_table;
    cuPointerGetAttributes    = "cuPointerGetAttributes" @ 7000 split pool (n: c_uint, attrs: *const c_int, data: *mut *mut c_void, ptr: CUdeviceptr) => devices::pointer_get_attributes;

    // Graph memory (src/graphs.rs): handed out while a limit applies.
    cuGraphInstantiate        = "cuGraphInstantiate"    @ 10000 limit (exec: *mut *mut c_void, graph: *mut c_void, node: *mut c_void, log: *mut c_char, size: usize) => graph::instantiate_v1;
    cuGraphInstantiate_v2     = "cuGraphInstantiate"    @ 11000 limit (exec: *mut *mut c_void, graph: *mut c_void, node: *mut c_void, log: *mut c_char, size: usize) => graph::instantiate_v1;
    cuGraphInstantiateWithFlags = "cuGraphInstantiateWithFlags" @ 11040 limit (exec: *mut *mut c_void, graph: *mut c_void, flags: u64)        => graph::instantiate_with_flags;
    cuGraphInstantiateWithParams = "cuGraphInstantiateWithParams" @ 12000 limit (exec: *mut *mut c_void, graph: *mut c_void, params: *mut c_void) => graph::instantiate_with_params;
    cuGraphInstantiateWithParams_ptsz = "cuGraphInstantiateWithParams" @ 12000 ptsz limit (exec: *mut *mut c_void, graph: *mut c_void, params: *mut c_void) => graph::instantiate_with_params;
    cuGraphLaunch             = "cuGraphLaunch"         @ 10000 limit place compute (exec: *mut c_void, stream: CUstream)                            => graph::launch;
    cuGraphLaunch_ptsz        = "cuGraphLaunch"         @ 10000 ptsz limit place compute (exec: *mut c_void, stream: CUstream)                       => graph::launch_ptsz;
    cuGraphUpload             = "cuGraphUpload"         @ 11010 limit (exec: *mut c_void, stream: CUstream)                                  => graph::upload;
    cuGraphUpload_ptsz        = "cuGraphUpload"         @ 11010 ptsz limit (exec: *mut c_void, stream: CUstream)                             => graph::upload;
    cuGraphExecDestroy        = "cuGraphExecDestroy"    @ 10000 limit place (exec: *mut c_void)                                                    => graph::exec_destroy;

    // The placement log (src/placement.rs; hooks/launch.rs): handed out only while it is on.
    cuLaunchKernel            = "cuLaunchKernel"        @ 4000 place compute (f: *mut c_void, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) => launch::launch_kernel, lane launch::kernel_lane;
    cuLaunchKernel_ptsz       = "cuLaunchKernel"        @ 7000 ptsz place compute (f: *mut c_void, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) => launch::launch_kernel_ptsz, lane launch::kernel_ptsz_lane;
    cuLaunchKernelEx          = "cuLaunchKernelEx"      @ 11060 place compute (config: *const CUlaunchConfigHead, f: *mut c_void, params: *mut *mut c_void, extra: *mut *mut c_void) => launch::launch_kernel_ex, lane launch::kernel_ex_lane;
    cuLaunchKernelEx_ptsz     = "cuLaunchKernelEx"      @ 11060 ptsz place compute (config: *const CUlaunchConfigHead, f: *mut c_void, params: *mut *mut c_void, extra: *mut *mut c_void) => launch::launch_kernel_ex_ptsz, lane launch::kernel_ex_ptsz_lane;
    cuLaunchCooperativeKernel = "cuLaunchCooperativeKernel" @ 9000 place compute (f: *mut c_void, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void) => launch::launch_cooperative, lane launch::cooperative_lane;
    cuLaunchCooperativeKernel_ptsz = "cuLaunchCooperativeKernel" @ 9000 ptsz place compute (f: *mut c_void, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void) => launch::launch_cooperative_ptsz, lane launch::cooperative_ptsz_lane;
    // The deprecated launches (still in cuda.h 12.x and the driver): refused while the duty
    // pacer paces launches (they would pass it), the driver's own otherwise.
    cuLaunch                  = "cuLaunch"              @ 2000 compute (f: *mut c_void)                                                       => launch::legacy_launch;
    cuLaunchGrid              = "cuLaunchGrid"          @ 2000 compute (f: *mut c_void, w: c_int, h: c_int)                                   => launch::legacy_launch_grid;
    cuLaunchGridAsync         = "cuLaunchGridAsync"     @ 2000 compute (f: *mut c_void, w: c_int, h: c_int, stream: CUstream)                 => launch::legacy_launch_grid_async;
    cuLaunchCooperativeKernelMultiDevice = "cuLaunchCooperativeKernelMultiDevice" @ 9000 compute (params: *mut c_void, n: c_uint, flags: c_uint) => launch::legacy_multi_device;
    cuModuleGetFunction       = "cuModuleGetFunction"   @ 2000 place (f: *mut *mut c_void, module: *mut c_void, name: *const c_char)         => launch::module_get_function;
    cuLibraryGetKernel        = "cuLibraryGetKernel"    @ 12000 place (kernel: *mut *mut c_void, library: *mut c_void, name: *const c_char)  => launch::library_get_kernel;
    cuKernelGetFunction       = "cuKernelGetFunction"   @ 12000 place (f: *mut *mut c_void, kernel: *mut c_void)                             => launch::kernel_get_function;
    cuModuleUnload            = "cuModuleUnload"        @ 2000 place (module: *mut c_void)                                                    => launch::unload;
    cuLibraryUnload           = "cuLibraryUnload"       @ 12000 place (library: *mut c_void)                                                  => launch::unload;

    // NVML (the base and version columns only matter for cuGetProcAddress). Its initialisation
    // starts the shim first (`first`: `intercept::enter_first` says why) and is NVML's own.
    nvmlInit                  = "nvmlInit"              @ 0 first ()                                                                         => nvml::init;
    nvmlInit_v2               = "nvmlInit"              @ 0 first ()                                                                         => nvml::init;
    nvmlInitWithFlags         = "nvmlInitWithFlags"     @ 0 first (flags: c_uint)                                                            => nvml::init_with_flags;
    nvmlDeviceGetCount        = "nvmlDeviceGetCount"    @ 0 (count: *mut c_uint)                                                             => nvml::get_count;
    nvmlDeviceGetCount_v2     = "nvmlDeviceGetCount"    @ 0 (count: *mut c_uint)                                                             => nvml::get_count;
    nvmlDeviceGetHandleByIndex = "nvmlDeviceGetHandleByIndex" @ 0 (index: c_uint, dev: *mut NvmlDevice)                                  => nvml::handle_by_index;
    nvmlDeviceGetHandleByIndex_v2 = "nvmlDeviceGetHandleByIndex" @ 0 (index: c_uint, dev: *mut NvmlDevice)                               => nvml::handle_by_index;
    nvmlDeviceGetHandleByUUID = "nvmlDeviceGetHandleByUUID" @ 0 (uuid: *const c_char, dev: *mut NvmlDevice)                              => nvml::handle_by_uuid;
    // (nvmlUUID_t is passed by pointer: the same ABI as a string.)
    nvmlDeviceGetHandleByUUIDV = "nvmlDeviceGetHandleByUUIDV" @ 0 (uuid: *const c_char, dev: *mut NvmlDevice)                           => nvml::handle_by_uuidv;
    nvmlDeviceGetHandleByPciBusId = "nvmlDeviceGetHandleByPciBusId" @ 0 (pci: *const c_char, dev: *mut NvmlDevice)                       => nvml::handle_by_key;
    nvmlDeviceGetHandleByPciBusId_v2 = "nvmlDeviceGetHandleByPciBusId" @ 0 (pci: *const c_char, dev: *mut NvmlDevice)                    => nvml::handle_by_key;
    nvmlDeviceGetHandleBySerial = "nvmlDeviceGetHandleBySerial" @ 0 (serial: *const c_char, dev: *mut NvmlDevice)                        => nvml::handle_by_key;
    nvmlDeviceGetIndex        = "nvmlDeviceGetIndex"    @ 0 (dev: NvmlDevice, index: *mut c_uint)                                            => nvml::get_index;
    nvmlDeviceGetMemoryInfo   = "nvmlDeviceGetMemoryInfo" @ 0 (dev: NvmlDevice, memory: *mut NvmlMemory)                                 => nvml::memory_info;
    nvmlDeviceGetMemoryInfo_v2 = "nvmlDeviceGetMemoryInfo" @ 0 (dev: NvmlDevice, memory: *mut NvmlMemoryV2)                              => nvml::memory_info_v2;
    // Virtual devices (src/nvml_virtual.rs): a part's derived UUID. Every other function taking a
    // device handle reaches the program through nvml_virtual's trampolines while splitting.
    nvmlDeviceGetUUID         = "nvmlDeviceGetUUID"     @ 0 split (dev: NvmlDevice, uuid: *mut c_char, length: c_uint)                   => nvml::get_uuid;
}
