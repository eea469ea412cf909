//! Every exported driver entry point, in one list: it gives each a call counter (for
//! `gpusim_call_count` and the report), its name and its address (for `cuGetProcAddress` and
//! `gpusim_symbol`). `cu_api!` refers to `Id::<name>`, so a function missing here does not
//! compile; `procaddr`'s tests check that every name here is reachable by `cuGetProcAddress`.
//! `gpusim_common::exports!` (shared with `sim/nvml`) defines `Id`, `NAMES`, `COUNTS`,
//! `addresses` and `hit` from the list.

#![allow(non_camel_case_types)]

use crate::arrays::*;
use crate::context::*;
use crate::devices::*;
use crate::errors::*;
use crate::export_tables::*;
use crate::graphs::*;
use crate::green::*;
use crate::ipc::*;
use crate::kernels::*;
use crate::memory::*;
use crate::occupancy::*;
use crate::pools::*;
use crate::procaddr::*;
use crate::streams::*;
use crate::vmm::*;
use std::collections::HashMap;
use std::sync::OnceLock;

gpusim_common::exports! {
    // devices
    cuInit, cuDriverGetVersion, cuDeviceGetCount, cuDeviceGet, cuDeviceGetName, cuDeviceTotalMem_v2,
    cuDeviceTotalMem, cuDeviceGetAttribute, cuDeviceGetUuid, cuDeviceGetUuid_v2, cuDeviceGetLuid,
    cuDeviceGetPCIBusId, cuDeviceGetByPCIBusId, cuDeviceComputeCapability, cuDeviceGetProperties,
    cuDeviceCanAccessPeer, cuDeviceGetP2PAttribute,
    // context
    cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2,
    cuDevicePrimaryCtxReset, cuDevicePrimaryCtxReset_v2, cuDevicePrimaryCtxSetFlags,
    cuDevicePrimaryCtxSetFlags_v2, cuDevicePrimaryCtxGetState, cuCtxCreate, cuCtxCreate_v2,
    cuCtxCreate_v3, cuCtxCreate_v4, cuCtxDestroy, cuCtxDestroy_v2, cuCtxGetCurrent, cuCtxSetCurrent,
    cuCtxPushCurrent, cuCtxPushCurrent_v2, cuCtxPopCurrent, cuCtxPopCurrent_v2, cuCtxGetDevice,
    cuCtxGetDevice_v2, cuCtxSynchronize, cuCtxSynchronize_v2, cuCtxGetApiVersion, cuCtxGetFlags,
    cuCtxSetFlags, cuCtxGetId, cuCtxGetLimit, cuCtxSetLimit, cuCtxGetStreamPriorityRange,
    cuCtxEnablePeerAccess, cuCtxDisablePeerAccess,
    // green contexts
    cuDeviceGetDevResource, cuCtxGetDevResource, cuGreenCtxGetDevResource,
    cuDevSmResourceSplitByCount, cuDevResourceGenerateDesc, cuGreenCtxCreate, cuCtxFromGreenCtx,
    cuGreenCtxDestroy,
    // memory
    cuMemAlloc_v2, cuMemAlloc, cuMemFree_v2, cuMemFree, cuMemAllocPitch_v2, cuMemAllocPitch,
    cuMemAllocManaged, cuMemGetInfo_v2, cuMemGetInfo, cuMemGetAddressRange_v2,
    cuMemGetAddressRange, cuMemAllocHost_v2,
    cuMemAllocHost, cuMemHostAlloc, cuMemFreeHost, cuMemHostRegister, cuMemHostRegister_v2,
    cuMemHostUnregister, cuMemHostGetDevicePointer_v2, cuMemcpy,
    cuMemcpy_ptds, cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds, cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds,
    cuMemcpyDtoD_v2, cuMemcpyDtoD_v2_ptds, cuMemcpyAsync, cuMemcpyAsync_ptsz, cuMemcpyHtoDAsync_v2,
    cuMemcpyHtoDAsync_v2_ptsz, cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz,
    cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2_ptsz, cuMemcpyPeer, cuMemcpyPeer_ptds,
    cuMemcpyPeerAsync, cuMemcpyPeerAsync_ptsz, cuMemsetD8_v2, cuMemsetD8_v2_ptds, cuMemsetD32_v2,
    cuMemsetD32_v2_ptds, cuMemsetD8Async, cuMemsetD8Async_ptsz, cuMemsetD32Async,
    cuMemsetD32Async_ptsz, cuPointerGetAttribute, cuPointerGetAttributes,
    // ipc
    cuIpcGetMemHandle, cuIpcOpenMemHandle, cuIpcOpenMemHandle_v2, cuIpcCloseMemHandle,
    // pools
    cuMemAllocAsync, cuMemAllocAsync_ptsz, cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz,
    cuMemFreeAsync, cuMemFreeAsync_ptsz, cuMemPoolCreate, cuMemPoolDestroy, cuMemPoolTrimTo,
    cuMemPoolSetAttribute, cuMemPoolGetAttribute, cuMemPoolSetAccess, cuMemPoolGetAccess,
    cuDeviceGetDefaultMemPool, cuDeviceGetMemPool, cuDeviceSetMemPool,
    // streams
    cuStreamIsCapturing, cuStreamIsCapturing_ptsz, cuStreamGetId, cuStreamGetId_ptsz,
    cuLaunchHostFunc, cuLaunchHostFunc_ptsz, cuLaunchHostFunc_v2, cuLaunchHostFunc_v2_ptsz,
    cuStreamAddCallback, cuStreamAddCallback_ptsz,
    cuStreamCreate, cuStreamCreateWithPriority, cuStreamDestroy, cuStreamDestroy_v2,
    cuStreamSynchronize, cuStreamSynchronize_ptsz, cuStreamQuery, cuStreamQuery_ptsz,
    cuStreamGetCtx, cuStreamGetCtx_ptsz, cuStreamGetCtx_v2, cuStreamGetCtx_v2_ptsz,
    cuStreamWaitEvent, cuStreamWaitEvent_ptsz, cuStreamGetFlags, cuStreamGetFlags_ptsz,
    cuStreamGetPriority, cuStreamGetPriority_ptsz, cuEventCreate, cuEventRecord, cuEventRecord_ptsz, cuEventRecordWithFlags, cuEventRecordWithFlags_ptsz,
    cuEventSynchronize, cuEventQuery, cuEventDestroy, cuEventDestroy_v2, cuEventElapsedTime,
    cuEventElapsedTime_v2,
    // vmm
    cuMemGetAllocationGranularity, cuMemCreate, cuMemRelease, cuMemRetainAllocationHandle,
    cuMemGetAllocationPropertiesFromHandle, cuMemAddressReserve, cuMemAddressFree, cuMemMap,
    cuMemUnmap, cuMemSetAccess, cuMemGetAccess,
    // arrays
    cuArrayCreate_v2, cuArray3DCreate_v2, cuArrayDestroy, cuArrayGetDescriptor_v2,
    cuArray3DGetDescriptor_v2, cuMipmappedArrayCreate, cuMipmappedArrayDestroy,
    cuMipmappedArrayGetLevel,
    // errors
    cuGetErrorName, cuGetErrorString,
    // kernels
    cuModuleGetLoadingMode, cuModuleLoadData, cuLaunchKernel, cuLaunchKernel_ptsz,
    cuModuleLoadDataEx, cuModuleLoadFatBinary, cuModuleLoad, cuModuleUnload, cuModuleGetFunction, cuFuncGetName,
    cuLibraryLoadData, cuLibraryUnload, cuLibraryGetKernel, cuKernelGetName, cuKernelGetFunction,
    cuLaunchKernelEx, cuLaunchKernelEx_ptsz, cuLaunchCooperativeKernel, cuLaunchCooperativeKernel_ptsz,
    cuFuncGetAttribute, cuKernelGetAttribute, cuFuncSetAttribute, cuKernelSetAttribute, cuFuncSetCacheConfig,
    cuKernelSetCacheConfig, cuFuncGetParamInfo, cuKernelGetParamInfo, cuFuncIsLoaded, cuFuncLoad,
    cuLibraryGetKernelCount, cuLibraryEnumerateKernels, cuKernelGetLibrary, cuLibraryGetModule,
    // occupancy
    cuOccupancyMaxActiveBlocksPerMultiprocessor, cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags,
    cuOccupancyMaxPotentialBlockSize, cuOccupancyMaxPotentialBlockSizeWithFlags, cuOccupancyAvailableDynamicSMemPerBlock,
    cuFuncGetParamCount, cuKernelGetParamCount,
    // export_tables
    cuGetExportTable,
    // graphs
    cuGraphCreate, cuGraphDestroy, cuGraphAddMemAllocNode, cuGraphAddMemFreeNode, cuGraphAddKernelNode, cuGraphAddKernelNode_v2,
    cuGraphMemAllocNodeGetParams, cuGraphNodeGetType, cuGraphGetNodes, cuGraphInstantiateWithFlags,
    cuGraphInstantiateWithParams, cuGraphInstantiateWithParams_ptsz, cuGraphExecDestroy, cuGraphUpload,
    cuGraphUpload_ptsz, cuGraphLaunch, cuGraphLaunch_ptsz, cuDeviceGraphMemTrim,
    cuDeviceGetGraphMemAttribute, cuDeviceSetGraphMemAttribute, cuStreamBeginCapture_v2,
    cuStreamBeginCapture_v2_ptsz, cuStreamEndCapture, cuStreamEndCapture_ptsz,
    cuStreamGetCaptureInfo, cuStreamGetCaptureInfo_ptsz, cuStreamGetCaptureInfo_v2,
    cuStreamGetCaptureInfo_v2_ptsz, cuStreamGetCaptureInfo_v3, cuStreamGetCaptureInfo_v3_ptsz,
    cuThreadExchangeStreamCaptureMode,
    // stream memory operations
    cuStreamWriteValue32, cuStreamWriteValue32_ptsz, cuStreamWriteValue32_v2,
    cuStreamWriteValue32_v2_ptsz, cuStreamWaitValue32, cuStreamWaitValue32_ptsz,
    cuStreamWaitValue32_v2, cuStreamWaitValue32_v2_ptsz,
    // shareable handles
    cuMemExportToShareableHandle, cuMemImportFromShareableHandle,
    // procaddr
    cuGetProcAddress, cuGetProcAddress_v2
}

fn index() -> &'static HashMap<&'static str, usize> {
    static INDEX: OnceLock<HashMap<&'static str, usize>> = OnceLock::new();
    INDEX.get_or_init(|| NAMES.iter().copied().zip(addresses()).collect())
}

/// The address of an exported name, as `dlsym` gives it.
pub fn address_of(name: &str) -> Option<usize> {
    index().get(name).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_addresses_distinct() {
        let mut names: Vec<&str> = NAMES.to_vec();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), NAMES.len());
        assert_eq!(index().len(), NAMES.len());
        // every entry point is its own function (counters differ), so no two share an address
        let mut addrs = addresses();
        addrs.sort();
        addrs.dedup();
        assert_eq!(addrs.len(), NAMES.len());
        assert_eq!(
            address_of("cuMemAlloc_v2"),
            Some(cuMemAlloc_v2 as *const () as usize)
        );
        assert_eq!(NAMES[Id::cuInit as usize], "cuInit");
    }
}
