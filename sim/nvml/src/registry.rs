//! Every exported NVML entry point, in one list: it gives each a call counter (for
//! `gpusim_nvml_call_count` and the exit report). `nvml_api!` refers to `Id::<name>`, so a
//! function missing here does not compile, and `addresses` refers to every name here, so a
//! name without a function does not compile either. `gpusim_common::exports!` (shared with
//! `sim/cuda`) defines `Id`, `NAMES`, `COUNTS`, `addresses` and `hit` from the list.
//!
//! Test hooks (not counted):
//! ```c
//! uint64_t gpusim_nvml_call_count(const char *name); /* calls of that nvml* entry point; 0 if unknown */
//! ```
//! Exit report: with `GPUSIM_NVML_REPORT=path`, `{"calls":{"nvmlInitWithFlags":1,…}}` (every
//! entry point called at least once) is written there at exit.

#![allow(non_camel_case_types)]

use crate::api::*;
use gpusim_common::counters;
use std::ffi::c_char;

gpusim_common::exports! {
    // init and system
    nvmlInit, nvmlInit_v2, nvmlInitWithFlags, nvmlShutdown, nvmlErrorString,
    nvmlSystemGetDriverVersion, nvmlSystemGetNVMLVersion, nvmlSystemGetCudaDriverVersion,
    nvmlSystemGetCudaDriverVersion_v2, nvmlInternalGetExportTable,
    // enumeration and handles
    nvmlDeviceGetCount, nvmlDeviceGetCount_v2, nvmlDeviceGetHandleByIndex,
    nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetHandleByUUID, nvmlDeviceGetHandleByUUIDV,
    nvmlDeviceGetHandleByPciBusId, nvmlDeviceGetHandleByPciBusId_v2, nvmlDeviceGetHandleBySerial,
    // identity
    nvmlDeviceGetIndex, nvmlDeviceGetName, nvmlDeviceGetUUID, nvmlDeviceGetSerial,
    nvmlDeviceGetMinorNumber, nvmlDeviceGetPciInfo, nvmlDeviceGetPciInfo_v2,
    nvmlDeviceGetPciInfo_v3, nvmlDeviceGetPciInfoExt, nvmlDeviceGetCudaComputeCapability,
    nvmlDeviceGetBrand, nvmlDeviceGetArchitecture,
    // memory
    nvmlDeviceGetMemoryInfo, nvmlDeviceGetMemoryInfo_v2, nvmlDeviceGetBAR1MemoryInfo,
    // state
    nvmlDeviceGetComputeMode, nvmlDeviceGetPersistenceMode, nvmlDeviceGetUtilizationRates, nvmlDeviceGetProcessUtilization,
    nvmlDeviceGetTemperature, nvmlDeviceGetPowerUsage, nvmlDeviceGetClockInfo,
    nvmlDeviceGetMaxClockInfo, nvmlDeviceGetMigMode,
    // processes
    nvmlDeviceGetComputeRunningProcesses, nvmlDeviceGetComputeRunningProcesses_v2,
    nvmlDeviceGetComputeRunningProcesses_v3, nvmlDeviceGetGraphicsRunningProcesses,
    nvmlDeviceGetGraphicsRunningProcesses_v2, nvmlDeviceGetGraphicsRunningProcesses_v3,
    // topology
    nvmlDeviceGetP2PStatus, nvmlDeviceGetTopologyCommonAncestor, nvmlDeviceOnSameBoard,
    // NVLink, fabric (NOT_SUPPORTED)
    nvmlDeviceGetNvLinkRemoteDeviceType, nvmlDeviceGetNvLinkRemotePciInfo_v2,
    nvmlDeviceGetGpuFabricInfoV,
    // not supported by the simulated devices
    nvmlDeviceGetDisplayActive, nvmlDeviceGetEccMode, nvmlDeviceGetFanSpeed,
    nvmlDeviceGetPerformanceState, nvmlDeviceGetEnforcedPowerLimit, nvmlDeviceGetVirtualizationMode,
    nvmlDeviceGetMaxMigDeviceCount, nvmlDeviceValidateInforom, nvmlDeviceIsMigDeviceHandle,
    // events
    nvmlEventSetCreate, nvmlEventSetFree, nvmlDeviceGetSupportedEventTypes,
    nvmlDeviceRegisterEvents, nvmlEventSetWait_v2,
}

#[cfg(test)]
pub fn count_of(name: &str) -> u64 {
    counters::count_of(NAMES, &COUNTS, name)
}

/// `uint64_t gpusim_nvml_call_count(const char *name)`: calls of that exported entry point so
/// far (0 for NULL or an unknown name).
///
/// # Safety
/// A non-NULL `name` must be a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn gpusim_nvml_call_count(name: *const c_char) -> u64 {
    crate::ffi::guard_value(0, || {
        // SAFETY: the caller passes NULL or a NUL-terminated string.
        unsafe { counters::count_of_c(NAMES, &COUNTS, name) }
    })
}

// ---- the report ------------------------------------------------------------------------------

/// `{"calls":{"nvmlInitWithFlags":1,…}}`: every entry point called at least once, in
/// registry order. Written at exit to `GPUSIM_NVML_REPORT` by `gpusim_common::config::Settings`
/// (see `config.rs`).
pub fn report_json() -> String {
    format!(
        "{{\"calls\":{{{}}}}}\n",
        counters::calls_json(NAMES, &COUNTS)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_nvml() {
        let mut seen = std::collections::HashSet::new();
        for n in NAMES {
            assert!(n.starts_with("nvml"), "{n}");
            assert!(seen.insert(*n), "duplicate {n}");
        }
        let a = addresses();
        assert_eq!(a.len(), NAMES.len());
        assert!(a.iter().all(|&x| x != 0));
    }

    #[test]
    fn report_shape() {
        hit(Id::nvmlDeviceGetMaxClockInfo);
        let r = report_json();
        assert!(r.starts_with("{\"calls\":{"), "{r}");
        assert!(r.contains("\"nvmlDeviceGetMaxClockInfo\":"), "{r}");
        assert!(count_of("nvmlDeviceGetMaxClockInfo") >= 1);
        assert_eq!(count_of("cuInit"), 0);
        assert_eq!(unsafe { gpusim_nvml_call_count(std::ptr::null()) }, 0);
        assert!(unsafe { gpusim_nvml_call_count(c"nvmlDeviceGetMaxClockInfo".as_ptr()) } >= 1);
    }
}
