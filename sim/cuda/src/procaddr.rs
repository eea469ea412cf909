//! `cuGetProcAddress[_v2]`: resolution by base name + CUDA version + flags, from one
//! declarative table.
//!
//! Each base name lists the variants this driver exports: (exported symbol, the first
//! `cudaVersion` it answers, whether it is the per-thread-default-stream form `_ptsz`/`_ptds`).
//! The versions are those of the `PFN_<base>_v<version>[_ptsz|_ptds]` typedefs in
//! cudaTypedefs.h. Resolution:
//! 1. the ABI variant is the default-stream variant with the highest version <= `cudaVersion`
//!    (none: "version not sufficient");
//! 2. with flag 2 (`CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`), a per-thread variant with
//!    version <= `cudaVersion` and >= the ABI variant's version replaces it (the per-thread form
//!    of that same ABI); flags 0 and 1 (legacy stream) keep the default-stream variant.
//!
//! The address handed out is the symbol's own address in this library, so it equals
//! `dlsym(handle, symbol)` (-Bsymbolic keeps that true under a preloaded shim).

use crate::registry;
use crate::types::*;
use std::ffi::{c_char, c_void};

const D: bool = false; // default-stream form
const T: bool = true; // per-thread form (_ptsz / _ptds)

pub type Variant = (&'static str, i32, bool);

pub static PROCS: &[(&str, &[Variant])] = &[
    // init, version, errors, loading, private tables
    ("cuInit", &[("cuInit", 2000, D)]),
    ("cuDriverGetVersion", &[("cuDriverGetVersion", 2020, D)]),
    ("cuGetErrorName", &[("cuGetErrorName", 6000, D)]),
    ("cuGetErrorString", &[("cuGetErrorString", 6000, D)]),
    (
        "cuModuleGetLoadingMode",
        &[("cuModuleGetLoadingMode", 11070, D)],
    ),
    (
        "cuGetProcAddress",
        &[
            ("cuGetProcAddress", 11030, D),
            ("cuGetProcAddress_v2", 12000, D),
        ],
    ),
    ("cuGetExportTable", &[("cuGetExportTable", 3000, D)]),
    // devices
    ("cuDeviceGetCount", &[("cuDeviceGetCount", 2000, D)]),
    ("cuDeviceGet", &[("cuDeviceGet", 2000, D)]),
    ("cuDeviceGetName", &[("cuDeviceGetName", 2000, D)]),
    (
        "cuDeviceTotalMem",
        &[
            ("cuDeviceTotalMem", 2000, D),
            ("cuDeviceTotalMem_v2", 3020, D),
        ],
    ),
    ("cuDeviceGetAttribute", &[("cuDeviceGetAttribute", 2000, D)]),
    (
        "cuDeviceGetUuid",
        &[
            ("cuDeviceGetUuid", 9020, D),
            ("cuDeviceGetUuid_v2", 11040, D),
        ],
    ),
    ("cuDeviceGetLuid", &[("cuDeviceGetLuid", 10000, D)]),
    ("cuDeviceGetPCIBusId", &[("cuDeviceGetPCIBusId", 4010, D)]),
    (
        "cuDeviceGetByPCIBusId",
        &[("cuDeviceGetByPCIBusId", 4010, D)],
    ),
    (
        "cuDeviceComputeCapability",
        &[("cuDeviceComputeCapability", 2000, D)],
    ),
    (
        "cuDeviceGetProperties",
        &[("cuDeviceGetProperties", 2000, D)],
    ),
    (
        "cuDeviceCanAccessPeer",
        &[("cuDeviceCanAccessPeer", 4000, D)],
    ),
    (
        "cuDeviceGetP2PAttribute",
        &[("cuDeviceGetP2PAttribute", 8000, D)],
    ),
    (
        "cuDeviceGetDefaultMemPool",
        &[("cuDeviceGetDefaultMemPool", 11020, D)],
    ),
    ("cuDeviceGetMemPool", &[("cuDeviceGetMemPool", 11020, D)]),
    ("cuDeviceSetMemPool", &[("cuDeviceSetMemPool", 11020, D)]),
    // contexts
    (
        "cuDevicePrimaryCtxRetain",
        &[("cuDevicePrimaryCtxRetain", 7000, D)],
    ),
    (
        "cuDevicePrimaryCtxRelease",
        &[
            ("cuDevicePrimaryCtxRelease", 7000, D),
            ("cuDevicePrimaryCtxRelease_v2", 11000, D),
        ],
    ),
    (
        "cuDevicePrimaryCtxReset",
        &[
            ("cuDevicePrimaryCtxReset", 7000, D),
            ("cuDevicePrimaryCtxReset_v2", 11000, D),
        ],
    ),
    (
        "cuDevicePrimaryCtxSetFlags",
        &[
            ("cuDevicePrimaryCtxSetFlags", 7000, D),
            ("cuDevicePrimaryCtxSetFlags_v2", 11000, D),
        ],
    ),
    (
        "cuDevicePrimaryCtxGetState",
        &[("cuDevicePrimaryCtxGetState", 7000, D)],
    ),
    (
        "cuCtxCreate",
        &[
            ("cuCtxCreate", 2000, D),
            ("cuCtxCreate_v2", 3020, D),
            ("cuCtxCreate_v3", 11040, D),
            ("cuCtxCreate_v4", 12050, D),
        ],
    ),
    (
        "cuCtxDestroy",
        &[("cuCtxDestroy", 2000, D), ("cuCtxDestroy_v2", 4000, D)],
    ),
    ("cuCtxGetCurrent", &[("cuCtxGetCurrent", 4000, D)]),
    ("cuCtxSetCurrent", &[("cuCtxSetCurrent", 4000, D)]),
    (
        "cuCtxPushCurrent",
        &[
            ("cuCtxPushCurrent", 2000, D),
            ("cuCtxPushCurrent_v2", 4000, D),
        ],
    ),
    (
        "cuCtxPopCurrent",
        &[
            ("cuCtxPopCurrent", 2000, D),
            ("cuCtxPopCurrent_v2", 4000, D),
        ],
    ),
    (
        "cuCtxGetDevice",
        &[("cuCtxGetDevice", 2000, D), ("cuCtxGetDevice_v2", 13000, D)],
    ),
    (
        "cuCtxSynchronize",
        &[
            ("cuCtxSynchronize", 2000, D),
            ("cuCtxSynchronize_v2", 13000, D),
        ],
    ),
    ("cuCtxGetApiVersion", &[("cuCtxGetApiVersion", 3020, D)]),
    ("cuCtxGetFlags", &[("cuCtxGetFlags", 7000, D)]),
    ("cuCtxSetFlags", &[("cuCtxSetFlags", 12010, D)]),
    ("cuCtxGetId", &[("cuCtxGetId", 12000, D)]),
    ("cuCtxGetLimit", &[("cuCtxGetLimit", 3010, D)]),
    ("cuCtxSetLimit", &[("cuCtxSetLimit", 3010, D)]),
    (
        "cuCtxGetStreamPriorityRange",
        &[("cuCtxGetStreamPriorityRange", 5050, D)],
    ),
    (
        "cuCtxEnablePeerAccess",
        &[("cuCtxEnablePeerAccess", 4000, D)],
    ),
    (
        "cuCtxDisablePeerAccess",
        &[("cuCtxDisablePeerAccess", 4000, D)],
    ),
    // green contexts
    ("cuDeviceGetDevResource", &[("cuDeviceGetDevResource", 12040, D)]),
    ("cuCtxGetDevResource", &[("cuCtxGetDevResource", 12040, D)]),
    ("cuGreenCtxGetDevResource", &[("cuGreenCtxGetDevResource", 12040, D)]),
    ("cuDevSmResourceSplitByCount", &[("cuDevSmResourceSplitByCount", 12040, D)]),
    ("cuDevResourceGenerateDesc", &[("cuDevResourceGenerateDesc", 12040, D)]),
    ("cuGreenCtxCreate", &[("cuGreenCtxCreate", 12040, D)]),
    ("cuCtxFromGreenCtx", &[("cuCtxFromGreenCtx", 12040, D)]),
    ("cuGreenCtxDestroy", &[("cuGreenCtxDestroy", 12040, D)]),
    // linear memory
    (
        "cuMemAlloc",
        &[("cuMemAlloc", 2000, D), ("cuMemAlloc_v2", 3020, D)],
    ),
    (
        "cuMemFree",
        &[("cuMemFree", 2000, D), ("cuMemFree_v2", 3020, D)],
    ),
    (
        "cuMemAllocPitch",
        &[
            ("cuMemAllocPitch", 2000, D),
            ("cuMemAllocPitch_v2", 3020, D),
        ],
    ),
    ("cuMemAllocManaged", &[("cuMemAllocManaged", 6000, D)]),
    (
        "cuMemGetInfo",
        &[("cuMemGetInfo", 2000, D), ("cuMemGetInfo_v2", 3020, D)],
    ),
    (
        "cuMemGetAddressRange",
        &[
            ("cuMemGetAddressRange", 2000, D),
            ("cuMemGetAddressRange_v2", 3020, D),
        ],
    ),
    (
        "cuMemAllocHost",
        &[("cuMemAllocHost", 2000, D), ("cuMemAllocHost_v2", 3020, D)],
    ),
    ("cuMemHostAlloc", &[("cuMemHostAlloc", 2020, D)]),
    ("cuMemFreeHost", &[("cuMemFreeHost", 2000, D)]),
    (
        "cuMemHostRegister",
        &[
            ("cuMemHostRegister", 4000, D),
            ("cuMemHostRegister_v2", 6050, D),
        ],
    ),
    ("cuMemHostUnregister", &[("cuMemHostUnregister", 4000, D)]),
    (
        "cuMemHostGetDevicePointer",
        &[("cuMemHostGetDevicePointer_v2", 3020, D)],
    ),
    (
        "cuMemcpy",
        &[("cuMemcpy", 4000, D), ("cuMemcpy_ptds", 7000, T)],
    ),
    (
        "cuMemcpyHtoD",
        &[
            ("cuMemcpyHtoD_v2", 3020, D),
            ("cuMemcpyHtoD_v2_ptds", 7000, T),
        ],
    ),
    (
        "cuMemcpyDtoH",
        &[
            ("cuMemcpyDtoH_v2", 3020, D),
            ("cuMemcpyDtoH_v2_ptds", 7000, T),
        ],
    ),
    (
        "cuMemcpyDtoD",
        &[
            ("cuMemcpyDtoD_v2", 3020, D),
            ("cuMemcpyDtoD_v2_ptds", 7000, T),
        ],
    ),
    (
        "cuMemcpyAsync",
        &[("cuMemcpyAsync", 4000, D), ("cuMemcpyAsync_ptsz", 7000, T)],
    ),
    (
        "cuMemcpyHtoDAsync",
        &[
            ("cuMemcpyHtoDAsync_v2", 3020, D),
            ("cuMemcpyHtoDAsync_v2_ptsz", 7000, T),
        ],
    ),
    (
        "cuMemcpyDtoHAsync",
        &[
            ("cuMemcpyDtoHAsync_v2", 3020, D),
            ("cuMemcpyDtoHAsync_v2_ptsz", 7000, T),
        ],
    ),
    (
        "cuMemcpyDtoDAsync",
        &[
            ("cuMemcpyDtoDAsync_v2", 3020, D),
            ("cuMemcpyDtoDAsync_v2_ptsz", 7000, T),
        ],
    ),
    (
        "cuMemcpyPeer",
        &[("cuMemcpyPeer", 4000, D), ("cuMemcpyPeer_ptds", 7000, T)],
    ),
    (
        "cuMemcpyPeerAsync",
        &[
            ("cuMemcpyPeerAsync", 4000, D),
            ("cuMemcpyPeerAsync_ptsz", 7000, T),
        ],
    ),
    (
        "cuMemsetD8",
        &[("cuMemsetD8_v2", 3020, D), ("cuMemsetD8_v2_ptds", 7000, T)],
    ),
    (
        "cuMemsetD32",
        &[
            ("cuMemsetD32_v2", 3020, D),
            ("cuMemsetD32_v2_ptds", 7000, T),
        ],
    ),
    (
        "cuMemsetD8Async",
        &[
            ("cuMemsetD8Async", 3020, D),
            ("cuMemsetD8Async_ptsz", 7000, T),
        ],
    ),
    (
        "cuMemsetD32Async",
        &[
            ("cuMemsetD32Async", 3020, D),
            ("cuMemsetD32Async_ptsz", 7000, T),
        ],
    ),
    (
        "cuPointerGetAttribute",
        &[("cuPointerGetAttribute", 4000, D)],
    ),
    (
        "cuPointerGetAttributes",
        &[("cuPointerGetAttributes", 7000, D)],
    ),
    // legacy IPC (cudaTypedefs.h: PFN_cuIpcGetMemHandle_v4010, PFN_cuIpcOpenMemHandle_v4010 /
    // _v11000, PFN_cuIpcCloseMemHandle_v4010)
    ("cuIpcGetMemHandle", &[("cuIpcGetMemHandle", 4010, D)]),
    (
        "cuIpcOpenMemHandle",
        &[
            ("cuIpcOpenMemHandle", 4010, D),
            ("cuIpcOpenMemHandle_v2", 11000, D),
        ],
    ),
    ("cuIpcCloseMemHandle", &[("cuIpcCloseMemHandle", 4010, D)]),
    // stream-ordered allocation, pools
    (
        "cuMemAllocAsync",
        &[
            ("cuMemAllocAsync", 11020, D),
            ("cuMemAllocAsync_ptsz", 11020, T),
        ],
    ),
    (
        "cuMemFreeAsync",
        &[
            ("cuMemFreeAsync", 11020, D),
            ("cuMemFreeAsync_ptsz", 11020, T),
        ],
    ),
    (
        "cuMemAllocFromPoolAsync",
        &[
            ("cuMemAllocFromPoolAsync", 11020, D),
            ("cuMemAllocFromPoolAsync_ptsz", 11020, T),
        ],
    ),
    ("cuMemPoolCreate", &[("cuMemPoolCreate", 11020, D)]),
    ("cuMemPoolDestroy", &[("cuMemPoolDestroy", 11020, D)]),
    ("cuMemPoolTrimTo", &[("cuMemPoolTrimTo", 11020, D)]),
    ("cuGraphCreate", &[("cuGraphCreate", 10000, D)]),
    ("cuGraphDestroy", &[("cuGraphDestroy", 10000, D)]),
    ("cuGraphAddMemAllocNode", &[("cuGraphAddMemAllocNode", 11040, D)]),
    ("cuGraphAddMemFreeNode", &[("cuGraphAddMemFreeNode", 11040, D)]),
    ("cuGraphAddKernelNode", &[("cuGraphAddKernelNode", 10000, D), ("cuGraphAddKernelNode_v2", 12000, D)]),
    ("cuGraphMemAllocNodeGetParams", &[("cuGraphMemAllocNodeGetParams", 11040, D)]),
    ("cuGraphNodeGetType", &[("cuGraphNodeGetType", 10000, D)]),
    ("cuGraphGetNodes", &[("cuGraphGetNodes", 10000, D)]),
    ("cuGraphInstantiateWithFlags", &[("cuGraphInstantiateWithFlags", 11040, D)]),
    (
        "cuGraphInstantiateWithParams",
        &[("cuGraphInstantiateWithParams", 12000, D), ("cuGraphInstantiateWithParams_ptsz", 12000, T)],
    ),
    ("cuGraphExecDestroy", &[("cuGraphExecDestroy", 10000, D)]),
    ("cuGraphUpload", &[("cuGraphUpload", 11010, D), ("cuGraphUpload_ptsz", 11010, T)]),
    ("cuGraphLaunch", &[("cuGraphLaunch", 10000, D), ("cuGraphLaunch_ptsz", 10000, T)]),
    ("cuDeviceGraphMemTrim", &[("cuDeviceGraphMemTrim", 11040, D)]),
    ("cuDeviceGetGraphMemAttribute", &[("cuDeviceGetGraphMemAttribute", 11040, D)]),
    ("cuDeviceSetGraphMemAttribute", &[("cuDeviceSetGraphMemAttribute", 11040, D)]),
    (
        "cuStreamBeginCapture",
        &[("cuStreamBeginCapture_v2", 10010, D), ("cuStreamBeginCapture_v2_ptsz", 10010, T)],
    ),
    ("cuStreamEndCapture", &[("cuStreamEndCapture", 10000, D), ("cuStreamEndCapture_ptsz", 10000, T)]),
    (
        "cuStreamGetCaptureInfo",
        &[
            ("cuStreamGetCaptureInfo", 10010, D),
            ("cuStreamGetCaptureInfo_ptsz", 10010, T),
            ("cuStreamGetCaptureInfo_v2", 11030, D),
            ("cuStreamGetCaptureInfo_v2_ptsz", 11030, T),
            ("cuStreamGetCaptureInfo_v3", 12030, D),
            ("cuStreamGetCaptureInfo_v3_ptsz", 12030, T),
        ],
    ),
    (
        "cuThreadExchangeStreamCaptureMode",
        &[("cuThreadExchangeStreamCaptureMode", 10010, D)],
    ),
    // stream memory operations (cudaTypedefs.h: PFN_cuStreamWriteValue32_v8000[_ptsz], _v11070[_ptsz])
    (
        "cuStreamWriteValue32",
        &[
            ("cuStreamWriteValue32", 8000, D),
            ("cuStreamWriteValue32_ptsz", 8000, T),
            ("cuStreamWriteValue32_v2", 11070, D),
            ("cuStreamWriteValue32_v2_ptsz", 11070, T),
        ],
    ),
    (
        "cuStreamWaitValue32",
        &[
            ("cuStreamWaitValue32", 8000, D),
            ("cuStreamWaitValue32_ptsz", 8000, T),
            ("cuStreamWaitValue32_v2", 11070, D),
            ("cuStreamWaitValue32_v2_ptsz", 11070, T),
        ],
    ),
    (
        "cuMemPoolSetAttribute",
        &[("cuMemPoolSetAttribute", 11020, D)],
    ),
    (
        "cuMemPoolGetAttribute",
        &[("cuMemPoolGetAttribute", 11020, D)],
    ),
    ("cuMemPoolSetAccess", &[("cuMemPoolSetAccess", 11020, D)]),
    ("cuMemPoolGetAccess", &[("cuMemPoolGetAccess", 11020, D)]),
    // streams, events
    ("cuStreamCreate", &[("cuStreamCreate", 2000, D)]),
    (
        "cuStreamCreateWithPriority",
        &[("cuStreamCreateWithPriority", 5050, D)],
    ),
    (
        "cuStreamDestroy",
        &[
            ("cuStreamDestroy", 2000, D),
            ("cuStreamDestroy_v2", 4000, D),
        ],
    ),
    (
        "cuStreamSynchronize",
        &[
            ("cuStreamSynchronize", 2000, D),
            ("cuStreamSynchronize_ptsz", 7000, T),
        ],
    ),
    (
        "cuStreamQuery",
        &[("cuStreamQuery", 2000, D), ("cuStreamQuery_ptsz", 7000, T)],
    ),
    (
        "cuStreamGetCtx",
        &[
            ("cuStreamGetCtx", 9020, D),
            ("cuStreamGetCtx_ptsz", 9020, T),
            ("cuStreamGetCtx_v2", 12050, D),
            ("cuStreamGetCtx_v2_ptsz", 12050, T),
        ],
    ),
    (
        "cuStreamWaitEvent",
        &[
            ("cuStreamWaitEvent", 3020, D),
            ("cuStreamWaitEvent_ptsz", 7000, T),
        ],
    ),
    (
        "cuStreamGetFlags",
        &[
            ("cuStreamGetFlags", 5050, D),
            ("cuStreamGetFlags_ptsz", 7000, T),
        ],
    ),
    (
        "cuStreamGetPriority",
        &[
            ("cuStreamGetPriority", 5050, D),
            ("cuStreamGetPriority_ptsz", 7000, T),
        ],
    ),
    (
        "cuStreamIsCapturing",
        &[
            ("cuStreamIsCapturing", 10000, D),
            ("cuStreamIsCapturing_ptsz", 10000, T),
        ],
    ),
    (
        "cuStreamGetId",
        &[
            ("cuStreamGetId", 12000, D),
            ("cuStreamGetId_ptsz", 12000, T),
        ],
    ),
    (
        "cuStreamAddCallback",
        &[
            ("cuStreamAddCallback", 5000, D),
            ("cuStreamAddCallback_ptsz", 7000, T),
        ],
    ),
    (
        "cuLaunchHostFunc",
        &[
            ("cuLaunchHostFunc", 10000, D),
            ("cuLaunchHostFunc_ptsz", 10000, T),
            ("cuLaunchHostFunc_v2", 13010, D),
            ("cuLaunchHostFunc_v2_ptsz", 13010, T),
        ],
    ),
    ("cuEventCreate", &[("cuEventCreate", 2000, D)]),
    (
        "cuEventRecord",
        &[("cuEventRecord", 2000, D), ("cuEventRecord_ptsz", 7000, T)],
    ),
    (
        "cuEventRecordWithFlags",
        &[("cuEventRecordWithFlags", 11010, D), ("cuEventRecordWithFlags_ptsz", 11010, T)],
    ),
    ("cuEventSynchronize", &[("cuEventSynchronize", 2000, D)]),
    ("cuEventQuery", &[("cuEventQuery", 2000, D)]),
    (
        "cuEventDestroy",
        &[("cuEventDestroy", 2000, D), ("cuEventDestroy_v2", 4000, D)],
    ),
    (
        "cuEventElapsedTime",
        &[
            ("cuEventElapsedTime", 2000, D),
            ("cuEventElapsedTime_v2", 12080, D),
        ],
    ),
    // virtual memory management
    (
        "cuMemGetAllocationGranularity",
        &[("cuMemGetAllocationGranularity", 10020, D)],
    ),
    ("cuMemCreate", &[("cuMemCreate", 10020, D)]),
    ("cuMemRelease", &[("cuMemRelease", 10020, D)]),
    ("cuMemAddressReserve", &[("cuMemAddressReserve", 10020, D)]),
    ("cuMemAddressFree", &[("cuMemAddressFree", 10020, D)]),
    ("cuMemMap", &[("cuMemMap", 10020, D)]),
    ("cuMemUnmap", &[("cuMemUnmap", 10020, D)]),
    ("cuMemSetAccess", &[("cuMemSetAccess", 10020, D)]),
    ("cuMemGetAccess", &[("cuMemGetAccess", 10020, D)]),
    (
        "cuMemExportToShareableHandle",
        &[("cuMemExportToShareableHandle", 10020, D)],
    ),
    (
        "cuMemImportFromShareableHandle",
        &[("cuMemImportFromShareableHandle", 10020, D)],
    ),
    (
        "cuMemGetAllocationPropertiesFromHandle",
        &[("cuMemGetAllocationPropertiesFromHandle", 10020, D)],
    ),
    (
        "cuMemRetainAllocationHandle",
        &[("cuMemRetainAllocationHandle", 11000, D)],
    ),
    // arrays
    ("cuArrayCreate", &[("cuArrayCreate_v2", 3020, D)]),
    ("cuArray3DCreate", &[("cuArray3DCreate_v2", 3020, D)]),
    ("cuArrayDestroy", &[("cuArrayDestroy", 2000, D)]),
    (
        "cuArrayGetDescriptor",
        &[("cuArrayGetDescriptor_v2", 3020, D)],
    ),
    (
        "cuArray3DGetDescriptor",
        &[("cuArray3DGetDescriptor_v2", 3020, D)],
    ),
    (
        "cuMipmappedArrayCreate",
        &[("cuMipmappedArrayCreate", 5000, D)],
    ),
    (
        "cuMipmappedArrayDestroy",
        &[("cuMipmappedArrayDestroy", 5000, D)],
    ),
    (
        "cuMipmappedArrayGetLevel",
        &[("cuMipmappedArrayGetLevel", 5000, D)],
    ),
    // modules, kernels
    ("cuModuleLoadData", &[("cuModuleLoadData", 2000, D)]),
    ("cuModuleLoadDataEx", &[("cuModuleLoadDataEx", 2010, D)]),
    ("cuModuleLoadFatBinary", &[("cuModuleLoadFatBinary", 2000, D)]),
    ("cuModuleLoad", &[("cuModuleLoad", 2000, D)]),
    ("cuModuleUnload", &[("cuModuleUnload", 2000, D)]),
    ("cuModuleGetFunction", &[("cuModuleGetFunction", 2000, D)]),
    ("cuFuncGetName", &[("cuFuncGetName", 12030, D)]),
    ("cuLibraryLoadData", &[("cuLibraryLoadData", 12000, D)]),
    ("cuLibraryUnload", &[("cuLibraryUnload", 12000, D)]),
    ("cuLibraryGetKernel", &[("cuLibraryGetKernel", 12000, D)]),
    ("cuKernelGetName", &[("cuKernelGetName", 12030, D)]),
    ("cuKernelGetFunction", &[("cuKernelGetFunction", 12000, D)]),
    ("cuFuncGetAttribute", &[("cuFuncGetAttribute", 2020, D)]),
    ("cuKernelGetAttribute", &[("cuKernelGetAttribute", 12000, D)]),
    ("cuFuncSetAttribute", &[("cuFuncSetAttribute", 9000, D)]),
    ("cuKernelSetAttribute", &[("cuKernelSetAttribute", 12000, D)]),
    ("cuFuncSetCacheConfig", &[("cuFuncSetCacheConfig", 3000, D)]),
    ("cuKernelSetCacheConfig", &[("cuKernelSetCacheConfig", 12000, D)]),
    ("cuFuncGetParamInfo", &[("cuFuncGetParamInfo", 12040, D)]),
    ("cuKernelGetParamInfo", &[("cuKernelGetParamInfo", 12040, D)]),
    ("cuFuncIsLoaded", &[("cuFuncIsLoaded", 12040, D)]),
    ("cuOccupancyMaxActiveBlocksPerMultiprocessor", &[("cuOccupancyMaxActiveBlocksPerMultiprocessor", 6050, D)]),
    ("cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", &[("cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", 7000, D)]),
    ("cuOccupancyMaxPotentialBlockSize", &[("cuOccupancyMaxPotentialBlockSize", 6050, D)]),
    ("cuOccupancyMaxPotentialBlockSizeWithFlags", &[("cuOccupancyMaxPotentialBlockSizeWithFlags", 7000, D)]),
    ("cuOccupancyAvailableDynamicSMemPerBlock", &[("cuOccupancyAvailableDynamicSMemPerBlock", 10020, D)]),
    ("cuFuncGetParamCount", &[("cuFuncGetParamCount", 13020, D)]),
    ("cuKernelGetParamCount", &[("cuKernelGetParamCount", 13020, D)]),
    ("cuFuncLoad", &[("cuFuncLoad", 12040, D)]),
    ("cuLibraryGetKernelCount", &[("cuLibraryGetKernelCount", 12040, D)]),
    ("cuLibraryEnumerateKernels", &[("cuLibraryEnumerateKernels", 12040, D)]),
    ("cuKernelGetLibrary", &[("cuKernelGetLibrary", 12050, D)]),
    ("cuLibraryGetModule", &[("cuLibraryGetModule", 12000, D)]),
    (
        "cuLaunchKernel",
        &[
            ("cuLaunchKernel", 4000, D),
            ("cuLaunchKernel_ptsz", 7000, T),
        ],
    ),
    (
        "cuLaunchKernelEx",
        &[
            ("cuLaunchKernelEx", 11060, D),
            ("cuLaunchKernelEx_ptsz", 11060, T),
        ],
    ),
    (
        "cuLaunchCooperativeKernel",
        &[
            ("cuLaunchCooperativeKernel", 9000, D),
            ("cuLaunchCooperativeKernel_ptsz", 9000, T),
        ],
    ),
];

/// `CUdriverProcAddressQueryResult`
pub const SYMBOL_SUCCESS: i32 = 0;
pub const SYMBOL_NOT_FOUND: i32 = 1;
pub const VERSION_NOT_SUFFICIENT: i32 = 2;

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`
pub const PER_THREAD: u64 = 2;

/// The exported symbol for (`base`, `version`, `flags`), or the query status explaining why none.
pub fn resolve(base: &str, version: i32, flags: u64) -> Result<&'static str, i32> {
    let (_, variants) = PROCS
        .iter()
        .find(|(b, _)| *b == base)
        .ok_or(SYMBOL_NOT_FOUND)?;
    let abi = variants
        .iter()
        .filter(|v| !v.2 && v.1 <= version)
        .max_by_key(|v| v.1)
        .ok_or(VERSION_NOT_SUFFICIENT)?;
    if flags & PER_THREAD != 0 {
        if let Some(pt) = variants
            .iter()
            .filter(|v| v.2 && v.1 <= version && v.1 >= abi.1)
            .max_by_key(|v| v.1)
        {
            return Ok(pt.0);
        }
    }
    Ok(abi.0)
}

unsafe fn get_proc(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
    status: *mut i32,
) -> Res {
    if symbol.is_null() || pfn.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let name = std::ffi::CStr::from_ptr(symbol).to_string_lossy();
    let found = resolve(&name, version, flags)
        .and_then(|e| registry::address_of(e).ok_or(SYMBOL_NOT_FOUND));
    if crate::config::trace_enabled() {
        let what = match found {
            Ok(_) => resolve(&name, version, flags).unwrap_or("?").to_string(),
            Err(s) => format!("NULL (status {s})"),
        };
        crate::ffi::trace_line(&format!(
            "gpusim:   cuGetProcAddress({name:?}, {version}, {flags}) -> {what}\n"
        ));
    }
    match found {
        Ok(addr) => {
            put(pfn, addr as *mut c_void)?;
            put_opt(status, SYMBOL_SUCCESS);
        }
        Err(s) => {
            put(pfn, std::ptr::null_mut())?;
            put_opt(status, s);
        }
    }
    Ok(())
}

cu_api! {
    fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: i32, flags: u64) {
        get_proc(symbol, pfn, cuda_version, flags, std::ptr::null_mut())
    }

    fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: i32, flags: u64, status: *mut i32) {
        get_proc(symbol, pfn, cuda_version, flags, status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_pick_the_abi() {
        assert_eq!(resolve("cuMemAlloc", 3020, 0), Ok("cuMemAlloc_v2"));
        assert_eq!(resolve("cuMemAlloc", 12090, 0), Ok("cuMemAlloc_v2"));
        assert_eq!(resolve("cuMemAlloc", 2000, 0), Ok("cuMemAlloc"));
        assert_eq!(resolve("cuMemAlloc", 1000, 0), Err(VERSION_NOT_SUFFICIENT));
        assert_eq!(resolve("cuMemGetInfo", 2000, 0), Ok("cuMemGetInfo"));
        assert_eq!(
            resolve("cuMemGetAddressRange", 2000, 0),
            Ok("cuMemGetAddressRange")
        );
        assert_eq!(
            resolve("cuMemGetAddressRange", 3020, 0),
            Ok("cuMemGetAddressRange_v2")
        );
        assert_eq!(resolve("cuCtxCreate", 11040, 0), Ok("cuCtxCreate_v3"));
        assert_eq!(resolve("cuCtxCreate", 12050, 0), Ok("cuCtxCreate_v4"));
        assert_eq!(resolve("cuCtxCreate", 12040, 0), Ok("cuCtxCreate_v3"));
        assert_eq!(resolve("cuCtxCreate", 4000, 0), Ok("cuCtxCreate_v2"));
        assert_eq!(
            resolve("cuDeviceGetUuid", 11040, 0),
            Ok("cuDeviceGetUuid_v2")
        );
        assert_eq!(resolve("cuDeviceGetUuid", 11030, 0), Ok("cuDeviceGetUuid"));
        assert_eq!(
            resolve("cuDevicePrimaryCtxRelease", 11000, 0),
            Ok("cuDevicePrimaryCtxRelease_v2")
        );
        assert_eq!(
            resolve("cuDevicePrimaryCtxRelease", 10020, 0),
            Ok("cuDevicePrimaryCtxRelease")
        );
        assert_eq!(
            resolve("cuGetProcAddress", 12000, 0),
            Ok("cuGetProcAddress_v2")
        );
        assert_eq!(
            resolve("cuGetProcAddress", 11080, 0),
            Ok("cuGetProcAddress")
        );
        assert_eq!(resolve("cuCtxGetDevice", 12090, 0), Ok("cuCtxGetDevice"));
        assert_eq!(resolve("cuCtxGetDevice", 13050, 0), Ok("cuCtxGetDevice_v2"));
        assert_eq!(
            resolve("cuStreamDestroy", 4000, 0),
            Ok("cuStreamDestroy_v2")
        );
        assert_eq!(
            resolve("cuMemcpyHtoD", 2000, 0),
            Err(VERSION_NOT_SUFFICIENT)
        );
        assert_eq!(
            resolve("cuIpcOpenMemHandle", 11000, 0),
            Ok("cuIpcOpenMemHandle_v2")
        );
        assert_eq!(
            resolve("cuIpcOpenMemHandle", 10020, 0),
            Ok("cuIpcOpenMemHandle")
        );
        assert_eq!(
            resolve("cuIpcGetMemHandle", 13050, 0),
            Ok("cuIpcGetMemHandle")
        );
        assert_eq!(
            resolve("cuIpcCloseMemHandle", 12090, 2),
            Ok("cuIpcCloseMemHandle")
        );
        assert_eq!(resolve("", 0, 0), Err(SYMBOL_NOT_FOUND));
        assert_eq!(resolve("cuNoSuchThing", 13000, 0), Err(SYMBOL_NOT_FOUND));
    }

    #[test]
    fn capture_info_variants() {
        assert_eq!(resolve("cuStreamGetCaptureInfo", 10010, 0), Ok("cuStreamGetCaptureInfo"));
        assert_eq!(resolve("cuStreamGetCaptureInfo", 11030, 0), Ok("cuStreamGetCaptureInfo_v2"));
        assert_eq!(resolve("cuStreamGetCaptureInfo", 13000, 0), Ok("cuStreamGetCaptureInfo_v3"));
        assert_eq!(resolve("cuStreamGetCaptureInfo", 12090, 2), Ok("cuStreamGetCaptureInfo_v3_ptsz"));
        assert_eq!(resolve("cuStreamGetCaptureInfo", 12000, 2), Ok("cuStreamGetCaptureInfo_v2_ptsz"));
        assert_eq!(resolve("cuStreamWriteValue32", 12090, 0), Ok("cuStreamWriteValue32_v2"));
        assert_eq!(resolve("cuStreamWriteValue32", 11000, 2), Ok("cuStreamWriteValue32_ptsz"));
        assert_eq!(resolve("cuThreadExchangeStreamCaptureMode", 13000, 2), Ok("cuThreadExchangeStreamCaptureMode"));
    }

    #[test]
    fn per_thread_flag_picks_ptsz() {
        assert_eq!(
            resolve("cuMemAllocAsync", 11020, 2),
            Ok("cuMemAllocAsync_ptsz")
        );
        assert_eq!(resolve("cuMemAllocAsync", 11020, 0), Ok("cuMemAllocAsync"));
        assert_eq!(resolve("cuMemAllocAsync", 11020, 1), Ok("cuMemAllocAsync"));
        assert_eq!(
            resolve("cuMemcpyHtoD", 12000, 2),
            Ok("cuMemcpyHtoD_v2_ptds")
        );
        assert_eq!(resolve("cuMemcpyHtoD", 6050, 2), Ok("cuMemcpyHtoD_v2"));
        assert_eq!(
            resolve("cuLaunchKernel", 12000, 2),
            Ok("cuLaunchKernel_ptsz")
        );
        assert_eq!(
            resolve("cuStreamGetCtx", 12090, 2),
            Ok("cuStreamGetCtx_v2_ptsz")
        );
        assert_eq!(
            resolve("cuStreamGetCtx", 12000, 2),
            Ok("cuStreamGetCtx_ptsz")
        );
        // no per-thread form: the plain one
        assert_eq!(resolve("cuMemAlloc", 12000, 2), Ok("cuMemAlloc_v2"));
        assert_eq!(resolve("cuInit", 12000, 2), Ok("cuInit"));
    }

    #[test]
    fn table_is_consistent_with_the_exports() {
        let mut seen = std::collections::HashSet::new();
        for (base, variants) in PROCS {
            assert!(!variants.is_empty(), "{base}");
            assert!(
                variants.iter().any(|v| !v.2),
                "{base} has no default-stream variant"
            );
            for (export, since, pt) in variants.iter() {
                assert!(
                    registry::address_of(export).is_some(),
                    "{export} is in PROCS but not exported"
                );
                assert!(
                    export.starts_with(base),
                    "{export} is not a variant of {base}"
                );
                assert_eq!(
                    *pt,
                    export.ends_with("_ptsz") || export.ends_with("_ptds"),
                    "{export}"
                );
                assert!(*since >= 2000, "{export}");
                assert!(seen.insert(*export), "{export} listed twice");
            }
        }
        // every exported driver function is reachable through cuGetProcAddress
        for name in registry::NAMES {
            assert!(seen.contains(name), "{name} is exported but not in PROCS");
        }
    }
}
