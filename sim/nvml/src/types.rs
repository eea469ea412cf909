//! The C types of `nvml.h` (NVML API 12, from the `nvidia-nvml-dev-cu12` 12.9.79 wheel) that the
//! simulator reads or writes, the return codes and the enum values it uses. C enums are passed
//! as plain integers (`c_uint`/`c_int`), never as Rust enums, so any value is safe to receive.
//! `tests` checks every size and offset against the header.

#![allow(non_camel_case_types, non_snake_case, dead_code)]

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

pub type nvmlReturn_t = c_int;
/// `struct nvmlDevice_st *`: the address of one of `devices::all()`'s records.
pub type nvmlDevice_t = *mut c_void;
pub type Res<T = ()> = Result<T, nvmlReturn_t>;

pub const NVML_SUCCESS: nvmlReturn_t = 0;
pub const NVML_ERROR_UNINITIALIZED: nvmlReturn_t = 1;
pub const NVML_ERROR_INVALID_ARGUMENT: nvmlReturn_t = 2;
pub const NVML_ERROR_NOT_SUPPORTED: nvmlReturn_t = 3;
pub const NVML_ERROR_TIMEOUT: nvmlReturn_t = 10;
pub const NVML_ERROR_NOT_FOUND: nvmlReturn_t = 6;
pub const NVML_ERROR_INSUFFICIENT_SIZE: nvmlReturn_t = 7;
pub const NVML_ERROR_FUNCTION_NOT_FOUND: nvmlReturn_t = 13;
pub const NVML_ERROR_GPU_IS_LOST: nvmlReturn_t = 15;
pub const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: nvmlReturn_t = 25;
pub const NVML_ERROR_UNKNOWN: nvmlReturn_t = 999;

/// `NVML_STRUCT_VERSION(data, ver)`: `sizeof(struct) | ver << 24`.
pub const fn struct_version<T>(ver: u32) -> c_uint {
    (std::mem::size_of::<T>() as u32) | (ver << 24)
}

pub const NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE: usize = 32;
pub const NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE: usize = 16;
pub const NVML_DEVICE_UUID_ASCII_LEN: usize = 41;
pub const NVML_DEVICE_UUID_BINARY_LEN: usize = 16;

pub const NVML_UUID_TYPE_ASCII: c_uint = 1;
pub const NVML_UUID_TYPE_BINARY: c_uint = 2;

pub const NVML_TEMPERATURE_GPU: c_uint = 0;
pub const NVML_FEATURE_DISABLED: c_uint = 0;
pub const NVML_COMPUTEMODE_DEFAULT: c_uint = 0;
pub const NVML_BRAND_NVIDIA: c_uint = 14;
pub const NVML_DEVICE_ARCH_HOPPER: c_uint = 9;

pub const NVML_TOPOLOGY_INTERNAL: c_uint = 0;
pub const NVML_TOPOLOGY_HOSTBRIDGE: c_uint = 30;

pub const NVML_P2P_STATUS_OK: c_uint = 0;
pub const NVML_P2P_STATUS_NOT_SUPPORTED: c_uint = 5;
/// `NVML_P2P_CAPS_INDEX_READ` (0) … `NVML_P2P_CAPS_INDEX_PCI` (4); 5 is `_UNKNOWN`.
pub const NVML_P2P_CAPS_INDEX_LAST: c_uint = 4;

/// `NVML_CLOCK_GRAPHICS` (0), `_SM` (1), `_MEM` (2), `_VIDEO` (3).
pub const NVML_CLOCK_COUNT: c_uint = 4;

/// `nvmlPciInfo_t`, as `nvmlDeviceGetPciInfo_v3` writes it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nvmlPciInfo_t {
    pub busIdLegacy: [c_char; NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pciDeviceId: c_uint,
    pub pciSubSystemId: c_uint,
    pub busId: [c_char; NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE],
}

/// The legacy layout `nvmlDeviceGetPciInfo` (v1) and `_v2` write (pynvml's `nvmlPciInfo_v2_t`):
/// the first 36 bytes match `nvmlPciInfo_t`, then four reserved words instead of `busId`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nvmlPciInfoLegacy_t {
    pub busId: [c_char; NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pciDeviceId: c_uint,
    pub pciSubSystemId: c_uint,
    pub reserved: [c_uint; 4],
}

/// `nvmlPciInfoExt_v1_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nvmlPciInfoExt_v1_t {
    pub version: c_uint,
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pciDeviceId: c_uint,
    pub pciSubSystemId: c_uint,
    pub baseClass: c_uint,
    pub subClass: c_uint,
    pub busId: [c_char; NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE],
}
pub const NVML_PCI_INFO_EXT_V1: c_uint = struct_version::<nvmlPciInfoExt_v1_t>(1);

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct nvmlMemory_t {
    pub total: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct nvmlMemory_v2_t {
    pub version: c_uint,
    pub total: c_ulonglong,
    pub reserved: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}
/// `nvmlMemory_v2` = `0x02000028`.
pub const NVML_MEMORY_V2: c_uint = struct_version::<nvmlMemory_v2_t>(2);

/// `nvmlBAR1Memory_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct nvmlBAR1Memory_t {
    pub bar1Total: c_ulonglong,
    pub bar1Free: c_ulonglong,
    pub bar1Used: c_ulonglong,
}

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct nvmlProcessUtilizationSample_t {
    pub pid: c_uint,
    pub timeStamp: u64,
    pub smUtil: c_uint,
    pub memUtil: c_uint,
    pub encUtil: c_uint,
    pub decUtil: c_uint,
}

/// `nvmlUtilization_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct nvmlUtilization_t {
    pub gpu: c_uint,
    pub memory: c_uint,
}

/// `nvmlUUIDValue_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union nvmlUUIDValue_t {
    pub str_: [c_char; NVML_DEVICE_UUID_ASCII_LEN],
    pub bytes: [u8; NVML_DEVICE_UUID_BINARY_LEN],
}

/// `nvmlUUID_v1_t` (for `nvmlDeviceGetHandleByUUIDV`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlUUID_v1_t {
    pub version: c_uint,
    pub type_: c_uint,
    pub value: nvmlUUIDValue_t,
}
/// `nvmlUUID_v1` = `0x01000034`.
pub const NVML_UUID_V1: c_uint = struct_version::<nvmlUUID_v1_t>(1);

/// `nvmlProcessInfo_v1_t`.
#[repr(C)]
pub struct nvmlProcessInfo_v1_t {
    pub pid: c_uint,
    pub usedGpuMemory: c_ulonglong,
}

/// `nvmlProcessInfo_v2_t` = `nvmlProcessInfo_t` (used by `_v2` and `_v3`).
#[repr(C)]
pub struct nvmlProcessInfo_v2_t {
    pub pid: c_uint,
    pub usedGpuMemory: c_ulonglong,
    pub gpuInstanceId: c_uint,
    pub computeInstanceId: c_uint,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// Sizes and offsets as nvml.h (NVML API 12) lays them out on x86_64 / aarch64 Linux.
    #[test]
    fn layouts_match_nvml_h() {
        assert_eq!(size_of::<nvmlPciInfo_t>(), 68);
        assert_eq!(offset_of!(nvmlPciInfo_t, domain), 16);
        assert_eq!(offset_of!(nvmlPciInfo_t, bus), 20);
        assert_eq!(offset_of!(nvmlPciInfo_t, device), 24);
        assert_eq!(offset_of!(nvmlPciInfo_t, pciDeviceId), 28);
        assert_eq!(offset_of!(nvmlPciInfo_t, pciSubSystemId), 32);
        assert_eq!(offset_of!(nvmlPciInfo_t, busId), 36);

        assert_eq!(size_of::<nvmlPciInfoLegacy_t>(), 52);
        assert_eq!(offset_of!(nvmlPciInfoLegacy_t, pciSubSystemId), 32);

        assert_eq!(size_of::<nvmlPciInfoExt_v1_t>(), 64);
        assert_eq!(offset_of!(nvmlPciInfoExt_v1_t, busId), 32);
        assert_eq!(NVML_PCI_INFO_EXT_V1, 0x0100_0040);

        assert_eq!(size_of::<nvmlMemory_t>(), 24);
        assert_eq!(offset_of!(nvmlMemory_t, free), 8);
        assert_eq!(offset_of!(nvmlMemory_t, used), 16);

        assert_eq!(size_of::<nvmlMemory_v2_t>(), 40);
        assert_eq!(offset_of!(nvmlMemory_v2_t, total), 8);
        assert_eq!(offset_of!(nvmlMemory_v2_t, reserved), 16);
        assert_eq!(offset_of!(nvmlMemory_v2_t, free), 24);
        assert_eq!(offset_of!(nvmlMemory_v2_t, used), 32);
        assert_eq!(NVML_MEMORY_V2, 0x0200_0028);

        assert_eq!(size_of::<nvmlBAR1Memory_t>(), 24);
        assert_eq!(size_of::<nvmlUtilization_t>(), 8);
        assert_eq!(size_of::<nvmlProcessUtilizationSample_t>(), 32);
        assert_eq!(offset_of!(nvmlProcessUtilizationSample_t, timeStamp), 8);
        assert_eq!(offset_of!(nvmlProcessUtilizationSample_t, decUtil), 28);

        assert_eq!(size_of::<nvmlUUID_v1_t>(), 52);
        assert_eq!(offset_of!(nvmlUUID_v1_t, value), 8);
        assert_eq!(NVML_UUID_V1, 0x0100_0034);

        assert_eq!(size_of::<nvmlProcessInfo_v1_t>(), 16);
        assert_eq!(size_of::<nvmlProcessInfo_v2_t>(), 24);
        assert_eq!(offset_of!(nvmlProcessInfo_v2_t, gpuInstanceId), 16);
    }
}
