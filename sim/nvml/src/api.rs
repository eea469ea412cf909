//! The exported NVML entry points. Every one but `nvmlErrorString` is written with `nvml_api!`
//! (counting, `catch_unwind`, tracing). Argument checks follow nvml.h: `NVML_ERROR_UNINITIALIZED`
//! first (where the real NVML needs `nvmlInit`), then an invalid handle or a NULL out-pointer is
//! `NVML_ERROR_INVALID_ARGUMENT`.

#![allow(non_snake_case)]

use crate::cuda_link;
use crate::processes;
use crate::devices::{self, Device};
use crate::ffi::*;
use crate::types::*;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

/// What `nvmlSystemGetDriverVersion` reports.
pub const DRIVER_VERSION: &str = "565.00.sim";
/// What `nvmlSystemGetNVMLVersion` reports: `<NVML API version>.<driver version>`.
pub const NVML_VERSION: &str = "12.565.00.sim";

/// BAR1 aperture reported for every device (nothing is ever mapped through it).
pub const BAR1_TOTAL: u64 = 256 << 20;
pub const TEMPERATURE_C: c_uint = 40;
pub const POWER_MW: c_uint = 75_000;
/// Clocks in MHz by `nvmlClockType_t`: graphics, SM, memory, video.
pub const CLOCKS_MHZ: [c_uint; NVML_CLOCK_COUNT as usize] = [1980, 1980, 2619, 1755];

unsafe fn handle_out(out: *mut nvmlDevice_t, d: &'static Device) -> Res {
    devices::check_lost(d)?;
    put(out, d.handle())
}

/// The device of an argument handle, after the init check.
fn device_arg(h: nvmlDevice_t) -> Res<&'static Device> {
    need_init()?;
    let d = devices::from_handle(h)?;
    devices::check_lost(d)?;
    Ok(d)
}

/// (total, used) of a device: used is what the simulated CUDA driver in this process holds.
fn memory(d: &Device) -> (u64, u64) {
    (d.total, cuda_link::used(d.index).min(d.total))
}

unsafe fn pci_info_v3(d: &Device) -> nvmlPciInfo_t {
    nvmlPciInfo_t {
        busIdLegacy: fixed_str(&d.bus_id_legacy()),
        domain: d.pci_domain,
        bus: d.pci_bus,
        device: d.pci_device,
        pciDeviceId: devices::PCI_DEVICE_ID,
        pciSubSystemId: devices::PCI_SUBSYSTEM_ID,
        busId: fixed_str(&d.bus_id()),
    }
}

unsafe fn pci_info_legacy(d: &Device) -> nvmlPciInfoLegacy_t {
    nvmlPciInfoLegacy_t {
        busId: fixed_str(&d.bus_id_legacy()),
        domain: d.pci_domain,
        bus: d.pci_bus,
        device: d.pci_device,
        pciDeviceId: devices::PCI_DEVICE_ID,
        pciSubSystemId: devices::PCI_SUBSYSTEM_ID,
        reserved: [0; 4],
    }
}

/// The running-process queries: never any process.
/// The compute processes of `device` ([`processes::own`]); `infos` NULL with room for them is
/// `NVML_ERROR_INVALID_ARGUMENT`.
unsafe fn compute_processes(device: nvmlDevice_t, count: *mut c_uint, infos_null: bool) -> Res<Vec<(u32, u64)>> {
    let d = device_arg(device)?;
    let list: Vec<(u32, u64)> = processes::own(d.index).into_iter().collect();
    // SAFETY: `count` is checked for NULL first; otherwise the caller's count.
    if infos_null && !count.is_null() && !list.is_empty() && unsafe { *count } as usize >= list.len() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    Ok(list)
}

/// A `nvmlProcessInfo_v2_t` without MIG instances (`0xFFFFFFFF`, as the real NVML outside MIG).
fn process_v2((pid, used): (u32, u64)) -> nvmlProcessInfo_v2_t {
    nvmlProcessInfo_v2_t { pid, usedGpuMemory: used, gpuInstanceId: u32::MAX, computeInstanceId: u32::MAX }
}

unsafe fn no_processes(device: nvmlDevice_t, count: *mut c_uint) -> Res {
    device_arg(device)?;
    put(count, 0)
}

/// A query the simulated devices do not support: a valid handle and out-pointer, then
/// `NVML_ERROR_NOT_SUPPORTED` (nvidia-smi prints `N/A`).
fn not_supported<T>(device: nvmlDevice_t, out: *mut T) -> Res {
    device_arg(device)?;
    non_null(out)?;
    Err(NVML_ERROR_NOT_SUPPORTED)
}

/// Two distinct-or-equal devices, both valid.
fn two_devices(a: nvmlDevice_t, b: nvmlDevice_t) -> Res<(&'static Device, &'static Device)> {
    need_init()?;
    Ok((devices::from_handle(a)?, devices::from_handle(b)?))
}

nvml_api! {
    // ---- init and system -------------------------------------------------------------------

    /// Both call `nvmlInitWithFlags(0)` through the dynamic linker, as the real ones do.
    fn nvmlInit() {
        crate::ffi::init_through_export()
    }

    fn nvmlInit_v2() {
        crate::ffi::init_through_export()
    }

    /// Any flags (`NVML_INIT_FLAG_NO_GPUS`, `NVML_INIT_FLAG_NO_ATTACH`) are accepted.
    fn nvmlInitWithFlags(flags: c_uint) {
        let _ = flags;
        init();
        Ok(())
    }

    fn nvmlShutdown() {
        shutdown()
    }

    fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) {
        need_init()?;
        put_str(version, length, DRIVER_VERSION)
    }

    /// Needs no `nvmlInit` (nvml.h lists no `NVML_ERROR_UNINITIALIZED` for it).
    fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) {
        put_str(version, length, NVML_VERSION)
    }

    /// `GPUSIM_DRIVER_VERSION` (default 13050), as the simulated `cuDriverGetVersion`. Needs no
    /// `nvmlInit`.
    fn nvmlSystemGetCudaDriverVersion(cudaDriverVersion: *mut c_int) {
        put(cudaDriverVersion, crate::config::get().driver_version)
    }

    fn nvmlSystemGetCudaDriverVersion_v2(cudaDriverVersion: *mut c_int) {
        put(cudaDriverVersion, crate::config::get().driver_version)
    }

    // ---- queries nvidia-smi makes that the simulated devices do not support -----------------

    fn nvmlDeviceGetDisplayActive(device: nvmlDevice_t, isActive: *mut c_uint) {
        not_supported(device, isActive)
    }
    fn nvmlDeviceGetEccMode(device: nvmlDevice_t, current: *mut c_uint, pending: *mut c_uint) {
        let _ = pending;
        not_supported(device, current)
    }
    fn nvmlDeviceGetFanSpeed(device: nvmlDevice_t, speed: *mut c_uint) {
        not_supported(device, speed)
    }
    fn nvmlDeviceGetPerformanceState(device: nvmlDevice_t, pState: *mut c_uint) {
        not_supported(device, pState)
    }
    fn nvmlDeviceGetEnforcedPowerLimit(device: nvmlDevice_t, limit: *mut c_uint) {
        not_supported(device, limit)
    }
    fn nvmlDeviceGetVirtualizationMode(device: nvmlDevice_t, pVirtualMode: *mut c_uint) {
        not_supported(device, pVirtualMode)
    }
    fn nvmlDeviceGetMaxMigDeviceCount(device: nvmlDevice_t, count: *mut c_uint) {
        not_supported(device, count)
    }
    fn nvmlDeviceValidateInforom(device: nvmlDevice_t) {
        device_arg(device)?;
        Err(NVML_ERROR_NOT_SUPPORTED)
    }

    /// A simulated handle is always a whole GPU: 0.
    fn nvmlDeviceIsMigDeviceHandle(device: nvmlDevice_t, isMigDevice: *mut c_uint) {
        device_arg(device)?;
        put(isMigDevice, 0)
    }

    // ---- events: sets can be made and freed; no device has any event type --------------------

    /// A new, empty event set (freed by `nvmlEventSetFree`).
    fn nvmlEventSetCreate(set: *mut *mut c_void) {
        need_init()?;
        non_null(set)?;
        put(set, events::create())
    }

    fn nvmlEventSetFree(set: *mut c_void) {
        need_init()?;
        events::free(set)
    }

    /// No simulated device supports any event type: 0.
    fn nvmlDeviceGetSupportedEventTypes(device: nvmlDevice_t, eventTypes: *mut u64) {
        device_arg(device)?;
        put(eventTypes, 0)
    }

    /// `NOT_SUPPORTED` for any non-empty mask (as the real NVML for unsupported types).
    fn nvmlDeviceRegisterEvents(device: nvmlDevice_t, eventTypes: u64, set: *mut c_void) {
        device_arg(device)?;
        events::check(set)?;
        if eventTypes == 0 { Ok(()) } else { Err(NVML_ERROR_NOT_SUPPORTED) }
    }

    /// No event ever arrives: `NVML_ERROR_TIMEOUT` at once (without waiting the timeout).
    fn nvmlEventSetWait_v2(set: *mut c_void, data: *mut c_void, timeoutms: c_uint) {
        need_init()?;
        events::check(set)?;
        non_null(data)?;
        let _ = timeoutms;
        Err(NVML_ERROR_TIMEOUT)
    }

    /// NVML's private table of internal entry points (see `internal.rs`); needs no `nvmlInit`.
    fn nvmlInternalGetExportTable(ppExportTable: *mut *const c_void, pExportTableId: *const c_void) {
        crate::internal::get_export_table(ppExportTable, pExportTableId)
    }

    // ---- enumeration and handles -------------------------------------------------------------

    fn nvmlDeviceGetCount(deviceCount: *mut c_uint) {
        need_init()?;
        put(deviceCount, devices::all().len() as c_uint)
    }

    fn nvmlDeviceGetCount_v2(deviceCount: *mut c_uint) {
        need_init()?;
        put(deviceCount, devices::all().len() as c_uint)
    }

    fn nvmlDeviceGetHandleByIndex(index: c_uint, device: *mut nvmlDevice_t) {
        need_init()?;
        let d = devices::all().get(index as usize).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        handle_out(device, d)
    }

    fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut nvmlDevice_t) {
        need_init()?;
        let d = devices::all().get(index as usize).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        handle_out(device, d)
    }

    /// The exact full UUID string, any case; anything else is `NVML_ERROR_NOT_FOUND`.
    fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, device: *mut nvmlDevice_t) {
        need_init()?;
        let s = c_str(uuid)?;
        non_null(device)?;
        let d = devices::by_uuid(devices::all(), &s).ok_or(NVML_ERROR_NOT_FOUND)?;
        handle_out(device, d)
    }

    /// `nvmlUUID_v1_t`: ASCII (type 1, as `nvmlDeviceGetHandleByUUID`) or the 16 bytes (type 2).
    fn nvmlDeviceGetHandleByUUIDV(uuid: *const nvmlUUID_v1_t, device: *mut nvmlDevice_t) {
        need_init()?;
        non_null(uuid)?;
        non_null(device)?;
        let u = uuid.read();
        if u.version != NVML_UUID_V1 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let devs = devices::all();
        let d = match u.type_ {
            NVML_UUID_TYPE_ASCII => {
                let raw: Vec<u8> = u.value.str_.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
                devices::by_uuid(devs, &String::from_utf8_lossy(&raw))
            }
            NVML_UUID_TYPE_BINARY => devs.iter().find(|d| d.uuid == u.value.bytes),
            _ => return Err(NVML_ERROR_INVALID_ARGUMENT),
        };
        handle_out(device, d.ok_or(NVML_ERROR_NOT_FOUND)?)
    }

    /// `domain:bus:device.function`, `domain:bus:device` or `bus:device.function`, hex, any
    /// case and width (`0000:10:00.0`, `00000000:10:00.0`). Malformed: `INVALID_ARGUMENT`.
    fn nvmlDeviceGetHandleByPciBusId(pciBusId: *const c_char, device: *mut nvmlDevice_t) {
        need_init()?;
        let s = c_str(pciBusId)?;
        non_null(device)?;
        handle_out(device, devices::by_bus_id(devices::all(), &s)?)
    }

    fn nvmlDeviceGetHandleByPciBusId_v2(pciBusId: *const c_char, device: *mut nvmlDevice_t) {
        need_init()?;
        let s = c_str(pciBusId)?;
        non_null(device)?;
        handle_out(device, devices::by_bus_id(devices::all(), &s)?)
    }

    /// `GPUSIM-<p>`, exactly.
    fn nvmlDeviceGetHandleBySerial(serial: *const c_char, device: *mut nvmlDevice_t) {
        need_init()?;
        let s = c_str(serial)?;
        non_null(device)?;
        let d = devices::all().iter().find(|d| d.serial == s).ok_or(NVML_ERROR_NOT_FOUND)?;
        handle_out(device, d)
    }

    // ---- identity ----------------------------------------------------------------------------

    fn nvmlDeviceGetIndex(device: nvmlDevice_t, index: *mut c_uint) {
        let d = device_arg(device)?;
        put(index, d.index as c_uint)
    }

    fn nvmlDeviceGetName(device: nvmlDevice_t, name: *mut c_char, length: c_uint) {
        let d = device_arg(device)?;
        put_str(name, length, &d.name)
    }

    fn nvmlDeviceGetUUID(device: nvmlDevice_t, uuid: *mut c_char, length: c_uint) {
        let d = device_arg(device)?;
        put_str(uuid, length, &d.uuid_str)
    }

    fn nvmlDeviceGetSerial(device: nvmlDevice_t, serial: *mut c_char, length: c_uint) {
        let d = device_arg(device)?;
        put_str(serial, length, &d.serial)
    }

    fn nvmlDeviceGetMinorNumber(device: nvmlDevice_t, minorNumber: *mut c_uint) {
        let d = device_arg(device)?;
        put(minorNumber, d.index as c_uint)
    }

    /// v1: the legacy 52-byte layout (`busId` in the `%04X:%02X:%02X.0` form, reserved words 0).
    fn nvmlDeviceGetPciInfo(device: nvmlDevice_t, pci: *mut nvmlPciInfo_t) {
        let d = device_arg(device)?;
        put(pci.cast::<nvmlPciInfoLegacy_t>(), pci_info_legacy(d))
    }

    /// v2: the same legacy layout as v1.
    fn nvmlDeviceGetPciInfo_v2(device: nvmlDevice_t, pci: *mut nvmlPciInfo_t) {
        let d = device_arg(device)?;
        put(pci.cast::<nvmlPciInfoLegacy_t>(), pci_info_legacy(d))
    }

    fn nvmlDeviceGetPciInfo_v3(device: nvmlDevice_t, pci: *mut nvmlPciInfo_t) {
        let d = device_arg(device)?;
        put(pci, pci_info_v3(d))
    }

    /// `version` must be `nvmlPciInfoExt_v1`; class 3 (display controller), subclass 2 (3D).
    fn nvmlDeviceGetPciInfoExt(device: nvmlDevice_t, pci: *mut nvmlPciInfoExt_v1_t) {
        let d = device_arg(device)?;
        non_null(pci)?;
        if (*pci).version != NVML_PCI_INFO_EXT_V1 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        put(pci, nvmlPciInfoExt_v1_t {
            version: NVML_PCI_INFO_EXT_V1,
            domain: d.pci_domain,
            bus: d.pci_bus,
            device: d.pci_device,
            pciDeviceId: devices::PCI_DEVICE_ID,
            pciSubSystemId: devices::PCI_SUBSYSTEM_ID,
            baseClass: 3,
            subClass: 2,
            busId: fixed_str(&d.bus_id()),
        })
    }

    fn nvmlDeviceGetCudaComputeCapability(device: nvmlDevice_t, major: *mut c_int, minor: *mut c_int) {
        device_arg(device)?;
        non_null(major)?;
        non_null(minor)?;
        put(major, 9)?;
        put(minor, 0)
    }

    fn nvmlDeviceGetBrand(device: nvmlDevice_t, type_: *mut c_uint) {
        device_arg(device)?;
        put(type_, NVML_BRAND_NVIDIA)
    }

    fn nvmlDeviceGetArchitecture(device: nvmlDevice_t, arch: *mut c_uint) {
        device_arg(device)?;
        put(arch, NVML_DEVICE_ARCH_HOPPER)
    }

    // ---- memory ------------------------------------------------------------------------------

    fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory_: *mut nvmlMemory_t) {
        let d = device_arg(device)?;
        let (total, used) = memory(d);
        put(memory_, nvmlMemory_t { total, free: total - used, used })
    }

    /// `version` must be `nvmlMemory_v2` (`sizeof(nvmlMemory_v2_t) | 2 << 24` = 0x02000028).
    fn nvmlDeviceGetMemoryInfo_v2(device: nvmlDevice_t, memory_: *mut nvmlMemory_v2_t) {
        let d = device_arg(device)?;
        non_null(memory_)?;
        if (*memory_).version != NVML_MEMORY_V2 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let (total, used) = memory(d);
        put(memory_, nvmlMemory_v2_t {
            version: NVML_MEMORY_V2,
            total,
            reserved: 0,
            free: total - used,
            used,
        })
    }

    fn nvmlDeviceGetBAR1MemoryInfo(device: nvmlDevice_t, bar1Memory: *mut nvmlBAR1Memory_t) {
        device_arg(device)?;
        put(bar1Memory, nvmlBAR1Memory_t { bar1Total: BAR1_TOTAL, bar1Free: BAR1_TOTAL, bar1Used: 0 })
    }

    // ---- state -------------------------------------------------------------------------------

    fn nvmlDeviceGetComputeMode(device: nvmlDevice_t, mode: *mut c_uint) {
        device_arg(device)?;
        put(mode, NVML_COMPUTEMODE_DEFAULT)
    }

    fn nvmlDeviceGetPersistenceMode(device: nvmlDevice_t, mode: *mut c_uint) {
        device_arg(device)?;
        put(mode, NVML_FEATURE_DISABLED)
    }

    /// `gpu`: % of the last second the device was busy (any process of the node, from the node
    /// state's time region; 0 without `GPUSIM_NODE_STATE`); `memory`: 0.
    fn nvmlDeviceGetUtilizationRates(device: nvmlDevice_t, utilization: *mut nvmlUtilization_t) {
        let d = device_arg(device)?;
        if utilization.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let (gpu, _) = cuda_link::utilisation(d.index);
        put(utilization, nvmlUtilization_t { gpu, memory: 0 })
    }

    /// One sample per process with busy time in the last second: `pid`, `timeStamp` (now, µs,
    /// CLOCK_REALTIME), `smUtil` (its % of the last second), the rest 0. `utilization` NULL:
    /// `NVML_ERROR_INSUFFICIENT_SIZE` with the count; a count too small: the same; no process:
    /// `NVML_ERROR_NOT_FOUND` (count 0). Samples not newer than `lastSeenTimeStamp` are left out.
    fn nvmlDeviceGetProcessUtilization(device: nvmlDevice_t, utilization: *mut nvmlProcessUtilizationSample_t,
                                       processSamplesCount: *mut c_uint, lastSeenTimeStamp: u64) {
        let d = device_arg(device)?;
        if processSamplesCount.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |t| t.as_micros() as u64);
        let (_, procs) = cuda_link::utilisation(d.index);
        let procs: Vec<(u32, u32)> = if stamp > lastSeenTimeStamp { procs } else { Vec::new() };
        let room = *processSamplesCount as usize;
        *processSamplesCount = procs.len() as c_uint;
        if procs.is_empty() {
            return Err(NVML_ERROR_NOT_FOUND);
        }
        if utilization.is_null() || room < procs.len() {
            return Err(NVML_ERROR_INSUFFICIENT_SIZE);
        }
        for (i, &(pid, sm)) in procs.iter().enumerate() {
            *utilization.add(i) = nvmlProcessUtilizationSample_t { pid, timeStamp: stamp, smUtil: sm, memUtil: 0, encUtil: 0, decUtil: 0 };
        }
        Ok(())
    }

    /// Only `NVML_TEMPERATURE_GPU` (0): 40 °C.
    fn nvmlDeviceGetTemperature(device: nvmlDevice_t, sensorType: c_uint, temp: *mut c_uint) {
        device_arg(device)?;
        if sensorType != NVML_TEMPERATURE_GPU {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        put(temp, TEMPERATURE_C)
    }

    /// Milliwatts.
    fn nvmlDeviceGetPowerUsage(device: nvmlDevice_t, power: *mut c_uint) {
        device_arg(device)?;
        put(power, POWER_MW)
    }

    fn nvmlDeviceGetClockInfo(device: nvmlDevice_t, type_: c_uint, clock: *mut c_uint) {
        device_arg(device)?;
        let mhz = *CLOCKS_MHZ.get(type_ as usize).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        put(clock, mhz)
    }

    fn nvmlDeviceGetMaxClockInfo(device: nvmlDevice_t, type_: c_uint, clock: *mut c_uint) {
        device_arg(device)?;
        let mhz = *CLOCKS_MHZ.get(type_ as usize).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        put(clock, mhz)
    }

    /// No device supports MIG.
    fn nvmlDeviceGetMigMode(device: nvmlDevice_t, currentMode: *mut c_uint, pendingMode: *mut c_uint) {
        device_arg(device)?;
        non_null(currentMode)?;
        non_null(pendingMode)?;
        Err(NVML_ERROR_NOT_SUPPORTED)
    }

    // ---- processes: this one, with a context on the device (`processes`); no graphics ----------

    fn nvmlDeviceGetComputeRunningProcesses(device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t) {
        let list = compute_processes(device, infoCount, infos.is_null())?;
        processes::answer(&list, infoCount, |i, (pid, used)| {
            *infos.add(i) = nvmlProcessInfo_v1_t { pid, usedGpuMemory: used };
        })
    }

    fn nvmlDeviceGetComputeRunningProcesses_v2(device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_v2_t) {
        let list = compute_processes(device, infoCount, infos.is_null())?;
        processes::answer(&list, infoCount, |i, e| *infos.add(i) = process_v2(e))
    }

    fn nvmlDeviceGetComputeRunningProcesses_v3(device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_v2_t) {
        let list = compute_processes(device, infoCount, infos.is_null())?;
        processes::answer(&list, infoCount, |i, e| *infos.add(i) = process_v2(e))
    }

    fn nvmlDeviceGetGraphicsRunningProcesses(device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t) {
        let _ = infos;
        no_processes(device, infoCount)
    }

    fn nvmlDeviceGetGraphicsRunningProcesses_v2(device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_v2_t) {
        let _ = infos;
        no_processes(device, infoCount)
    }

    fn nvmlDeviceGetGraphicsRunningProcesses_v3(device: nvmlDevice_t, infoCount: *mut c_uint, infos: *mut nvmlProcessInfo_v2_t) {
        let _ = infos;
        no_processes(device, infoCount)
    }

    // ---- topology ----------------------------------------------------------------------------

    /// `NVML_P2P_STATUS_OK` between distinct devices for every capability (read, write,
    /// NVLink, atomics, PCI); `NVML_P2P_STATUS_NOT_SUPPORTED` from a device to itself (as
    /// `cuDeviceCanAccessPeer`); an index outside 0..=4 is `INVALID_ARGUMENT`.
    fn nvmlDeviceGetP2PStatus(device1: nvmlDevice_t, device2: nvmlDevice_t, p2pIndex: c_uint, p2pStatus: *mut c_uint) {
        let (a, b) = two_devices(device1, device2)?;
        if p2pIndex > NVML_P2P_CAPS_INDEX_LAST {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        put(p2pStatus, if a.index == b.index { NVML_P2P_STATUS_NOT_SUPPORTED } else { NVML_P2P_STATUS_OK })
    }

    /// `NVML_TOPOLOGY_HOSTBRIDGE` between distinct devices, `NVML_TOPOLOGY_INTERNAL` for one.
    fn nvmlDeviceGetTopologyCommonAncestor(device1: nvmlDevice_t, device2: nvmlDevice_t, pathInfo: *mut c_uint) {
        let (a, b) = two_devices(device1, device2)?;
        put(pathInfo, if a.index == b.index { NVML_TOPOLOGY_INTERNAL } else { NVML_TOPOLOGY_HOSTBRIDGE })
    }

    /// 0 between distinct devices (one GPU per board), 1 for a device and itself.
    fn nvmlDeviceOnSameBoard(device1: nvmlDevice_t, device2: nvmlDevice_t, onSameBoard: *mut c_int) {
        let (a, b) = two_devices(device1, device2)?;
        put(onSameBoard, (a.index == b.index) as c_int)
    }

    // ---- NVLink and fabric: not modelled (PCIe devices, not in an NVLink fabric) --------------
    // PyTorch's c10::cuda::DriverAPI resolves these three with dlsym and asserts that they
    // exist; the real NVML answers NOT_SUPPORTED for them on a GPU without NVLink / fabric.

    fn nvmlDeviceGetNvLinkRemoteDeviceType(device: nvmlDevice_t, link: c_uint, pNvLinkDeviceType: *mut c_uint) {
        device_arg(device)?;
        let _ = link;
        non_null(pNvLinkDeviceType)?;
        Err(NVML_ERROR_NOT_SUPPORTED)
    }

    fn nvmlDeviceGetNvLinkRemotePciInfo_v2(device: nvmlDevice_t, link: c_uint, pci: *mut nvmlPciInfo_t) {
        device_arg(device)?;
        let _ = link;
        non_null(pci)?;
        Err(NVML_ERROR_NOT_SUPPORTED)
    }

    fn nvmlDeviceGetGpuFabricInfoV(device: nvmlDevice_t, gpuFabricInfo: *mut c_void) {
        device_arg(device)?;
        non_null(gpuFabricInfo)?;
        Err(NVML_ERROR_NOT_SUPPORTED)
    }
}

/// The message of each return code (the real NVML's wording).
pub fn error_string(result: nvmlReturn_t) -> &'static CStr {
    match result {
        0 => c"Success",
        1 => c"Uninitialized",
        2 => c"Invalid Argument",
        3 => c"Not Supported",
        4 => c"Insufficient Permissions",
        5 => c"Already Initialized",
        6 => c"Not Found",
        7 => c"Insufficient Size",
        8 => c"Insufficient External Power",
        9 => c"Driver Not Loaded",
        10 => c"Timeout",
        11 => c"Interrupt Request Issue",
        12 => c"NVML Shared Library Not Found",
        13 => c"Function Not Found",
        14 => c"Corrupted infoROM",
        15 => c"GPU is lost",
        16 => c"GPU requires restart",
        17 => c"The operating system has blocked the request.",
        18 => c"RM has detected an NVML/RM version mismatch.",
        19 => c"In use by another client",
        20 => c"Insufficient Memory",
        21 => c"No data",
        22 => c"The requested vgpu operation is not available on target device, becasue ECC is enabled",
        23 => c"Insufficient resources",
        24 => c"Frequency not supported",
        25 => c"Argument version mismatch",
        26 => c"Deprecated",
        27 => c"Not ready",
        28 => c"GPU not found",
        29 => c"Invalid state",
        _ => c"Unknown Error",
    }
}

/// `const char *nvmlErrorString(nvmlReturn_t)`: a static string for any code; needs no init.
#[no_mangle]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    crate::registry::hit(crate::registry::Id::nvmlErrorString);
    let s = guard_value(c"Unknown Error".as_ptr(), || error_string(result).as_ptr());
    if crate::config::trace_enabled() {
        trace_line(&format!("gpusim-nvml: nvmlErrorString({result})\n"));
    }
    s
}

/// Event sets: each `nvmlEventSetCreate` leaks one small allocation whose address is the handle;
/// the live ones are remembered so that a stale or made-up handle is `INVALID_ARGUMENT`.
mod events {
    use crate::types::*;
    use std::collections::HashSet;
    use std::ffi::c_void;
    use std::sync::Mutex;

    static LIVE: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

    pub fn create() -> *mut c_void {
        let p = Box::into_raw(Box::new(0u64)) as usize;
        LIVE.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(HashSet::new).insert(p);
        p as *mut c_void
    }

    pub fn check(set: *mut c_void) -> Res {
        let live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
        match live.as_ref() {
            Some(l) if l.contains(&(set as usize)) => Ok(()),
            _ => Err(NVML_ERROR_INVALID_ARGUMENT),
        }
    }

    pub fn free(set: *mut c_void) -> Res {
        let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
        if !live.as_mut().is_some_and(|l| l.remove(&(set as usize))) {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: `set` came from `create` (Box::into_raw) and was live until just now.
        drop(unsafe { Box::from_raw(set.cast::<u64>()) });
        Ok(())
    }
}
