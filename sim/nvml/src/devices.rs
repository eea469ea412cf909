//! The physical devices as NVML shows them, and the handle (`nvmlDevice_t`) of each.
//!
//! Identities are `gpusim_common::identity`'s, the same as `sim/cuda`'s: physical device `p` is
//! named `gpusim device <p>`, has UUID bytes `0x10*(p+1) + i`, PCI domain 0, bus `0x10*(p+1)`,
//! device 0 and serial `GPUSIM-<p>`; NVML adds the minor number `p`.
//! NVML ignores `CUDA_VISIBLE_DEVICES` (as the real one does): index = physical index, always
//! every device.
//!
//! A handle is the address of the device's record in a static list built once, so the same
//! device always has the same handle; a handle is only ever compared with those addresses,
//! never dereferenced before it is found among them.

use crate::config;
use crate::types::*;
use gpusim_common::identity::Identity;
use std::ffi::c_void;
use std::sync::OnceLock;

pub use gpusim_common::identity::{PCI_DEVICE_ID, PCI_SUBSYSTEM_ID};

#[derive(Debug, Clone)]
pub struct Device {
    pub index: usize,
    pub name: String,
    pub uuid: [u8; 16],
    pub uuid_str: String,
    pub serial: String,
    pub pci_domain: u32,
    pub pci_bus: u32,
    pub pci_device: u32,
    pub total: u64,
}

impl Device {
    /// Physical device `index` with the identity of `gpusim_common::identity` (as `Phys::new`
    /// in `sim/cuda/src/devices.rs`).
    pub fn new(index: usize, total: u64) -> Device {
        let id = Identity::of(index);
        Device {
            index,
            uuid_str: id.uuid_string(),
            name: id.name,
            uuid: id.uuid,
            serial: id.serial,
            pci_domain: id.pci_domain,
            pci_bus: id.pci_bus,
            pci_device: id.pci_device,
            total,
        }
    }

    /// `00000000:10:00.0` (`NVML_DEVICE_PCI_BUS_ID_FMT`, `%08X:%02X:%02X.0`: upper case, as the
    /// real NVML writes it; `cuDeviceGetPCIBusId` writes lower case).
    pub fn bus_id(&self) -> String {
        format!(
            "{:08X}:{:02X}:{:02X}.0",
            self.pci_domain, self.pci_bus, self.pci_device
        )
    }

    /// `0000:10:00.0` (`NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT`, `%04X:%02X:%02X.0`).
    pub fn bus_id_legacy(&self) -> String {
        format!(
            "{:04X}:{:02X}:{:02X}.0",
            self.pci_domain, self.pci_bus, self.pci_device
        )
    }

    pub fn handle(&'static self) -> nvmlDevice_t {
        self as *const Device as *mut c_void
    }
}

static DEVICES: OnceLock<Vec<Device>> = OnceLock::new();

/// Every physical device, from `GPUSIM_DEVICES` / `GPUSIM_MEMORY`, in physical order.
pub fn all() -> &'static [Device] {
    DEVICES.get_or_init(|| {
        let c = config::get();
        (0..c.devices)
            .map(|i| Device::new(i, c.memory[i]))
            .collect()
    })
}

/// The device a handle names; NULL or any other pointer is `NVML_ERROR_INVALID_ARGUMENT`.
pub fn from_handle(h: nvmlDevice_t) -> Res<&'static Device> {
    all()
        .iter()
        .find(|d| std::ptr::eq(*d as *const Device, h as *const Device))
        .ok_or(NVML_ERROR_INVALID_ARGUMENT)
}

/// `NVML_ERROR_GPU_IS_LOST` when the device is listed in the file named by `GPUSIM_LOST`
/// (physical indices, separated by commas or white space; read at every call, so a test can
/// make a GPU fall off the bus while a process runs). An absent or unreadable file: none lost.
pub fn check_lost(d: &Device) -> Res<()> {
    let Some(path) = std::env::var_os("GPUSIM_LOST") else { return Ok(()) };
    let Ok(text) = std::fs::read_to_string(path) else { return Ok(()) };
    let lost = text.split([',', ' ', '\n', '\t']).filter_map(|t| t.trim().parse::<usize>().ok()).any(|i| i == d.index);
    if lost {
        Err(NVML_ERROR_GPU_IS_LOST)
    } else {
        Ok(())
    }
}

/// The device whose UUID is exactly `s` (any case).
pub fn by_uuid(devs: &'static [Device], s: &str) -> Option<&'static Device> {
    devs.iter()
        .find(|d| d.uuid_str.eq_ignore_ascii_case(s.trim()))
}

/// A PCI bus id in one of the forms `nvmlDeviceGetHandleByPciBusId` accepts (all numbers hex,
/// any case, any width): `domain:bus:device.function`, `domain:bus:device`,
/// `bus:device.function`. Returns (domain, bus, device, function); `None` if malformed.
pub fn parse_bus_id(s: &str) -> Option<(u32, u32, u32, u32)> {
    fn hex(s: &str) -> Option<u32> {
        if s.is_empty() || s.len() > 8 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u32::from_str_radix(s, 16).ok()
    }
    let parts: Vec<&str> = s.trim().split(':').collect();
    let (domain, bus, last, need_function) = match parts.as_slice() {
        [d, b, rest] => (hex(d)?, hex(b)?, *rest, false),
        [b, rest] => (0, hex(b)?, *rest, true),
        _ => return None,
    };
    let (device, function) = match last.split_once('.') {
        Some((dev, f)) => (hex(dev)?, hex(f)?),
        None if !need_function => (hex(last)?, 0),
        None => return None,
    };
    // No range checks: sim/cuda gives device 15 bus 0x100.
    Some((domain, bus, device, function))
}

/// The device at that PCI address (function 0 only).
pub fn by_bus_id(devs: &'static [Device], s: &str) -> Res<&'static Device> {
    let (domain, bus, device, function) = parse_bus_id(s).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    devs.iter()
        .find(|d| {
            function == 0 && d.pci_domain == domain && d.pci_bus == bus && d.pci_device == device
        })
        .ok_or(NVML_ERROR_NOT_FOUND)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leak(n: usize) -> &'static [Device] {
        Box::leak(
            (0..n)
                .map(|i| Device::new(i, 1 << 30))
                .collect::<Vec<_>>()
                .into_boxed_slice(),
        )
    }

    #[test]
    fn identities() {
        let d = Device::new(0, 1);
        assert_eq!(d.name, "gpusim device 0");
        assert_eq!(d.uuid_str, "GPU-10111213-1415-1617-1819-1a1b1c1d1e1f");
        assert_eq!(d.serial, "GPUSIM-0");
        assert_eq!(d.bus_id(), "00000000:10:00.0");
        assert_eq!(d.bus_id_legacy(), "0000:10:00.0");
        let d = Device::new(1, 1);
        assert_eq!(d.name, "gpusim device 1");
        assert_eq!(d.uuid_str, "GPU-20212223-2425-2627-2829-2a2b2c2d2e2f");
        assert_eq!(d.serial, "GPUSIM-1");
        assert_eq!((d.pci_domain, d.pci_bus, d.pci_device), (0, 0x20, 0));
        let d = Device::new(9, 1);
        assert_eq!(d.bus_id(), "00000000:A0:00.0");
        let d = Device::new(15, 1);
        assert_eq!(d.uuid_str, "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f");
        assert_eq!(d.pci_bus, 0x100); // as sim/cuda: p = 15 is bus 0x100
        assert_eq!(d.bus_id(), "00000000:100:00.0");
    }

    #[test]
    fn bus_ids() {
        assert_eq!(parse_bus_id("0000:10:00.0"), Some((0, 0x10, 0, 0)));
        assert_eq!(parse_bus_id("00000000:2A:00.0"), Some((0, 0x2a, 0, 0)));
        assert_eq!(parse_bus_id("00000000:2a:00.0"), Some((0, 0x2a, 0, 0)));
        assert_eq!(parse_bus_id("0:10:0"), Some((0, 0x10, 0, 0)));
        assert_eq!(parse_bus_id("20:00.0"), Some((0, 0x20, 0, 0)));
        assert_eq!(parse_bus_id("0001:20:00.1"), Some((1, 0x20, 0, 1)));
        assert_eq!(parse_bus_id(" 0000:10:00.0 "), Some((0, 0x10, 0, 0)));
        assert_eq!(parse_bus_id("20:00"), None);
        assert_eq!(parse_bus_id("nonsense"), None);
        assert_eq!(parse_bus_id("0000:zz:00.0"), None);
        assert_eq!(parse_bus_id("0000:100:00.0"), Some((0, 0x100, 0, 0)));
        assert_eq!(parse_bus_id("000000000:10:00.0"), None);
        assert_eq!(parse_bus_id("0000:10:00.0.0"), None);
        assert_eq!(parse_bus_id("0:0:10:00.0"), None);
        assert_eq!(parse_bus_id(""), None);

        let devs = leak(3);
        assert_eq!(by_bus_id(devs, "0000:20:00.0").map(|d| d.index), Ok(1));
        assert_eq!(by_bus_id(devs, "00000000:30:00.0").map(|d| d.index), Ok(2));
        assert_eq!(by_bus_id(devs, "10:00.0").map(|d| d.index), Ok(0));
        assert_eq!(
            by_bus_id(devs, "0000:40:00.0").map(|d| d.index),
            Err(NVML_ERROR_NOT_FOUND)
        );
        assert_eq!(
            by_bus_id(devs, "0000:10:00.1").map(|d| d.index),
            Err(NVML_ERROR_NOT_FOUND)
        );
        assert_eq!(
            by_bus_id(devs, "0001:10:00.0").map(|d| d.index),
            Err(NVML_ERROR_NOT_FOUND)
        );
        assert_eq!(
            by_bus_id(devs, "bogus").map(|d| d.index),
            Err(NVML_ERROR_INVALID_ARGUMENT)
        );
    }

    #[test]
    fn uuids() {
        let devs = leak(2);
        let u = "GPU-20212223-2425-2627-2829-2a2b2c2d2e2f";
        assert_eq!(by_uuid(devs, u).map(|d| d.index), Some(1));
        assert_eq!(by_uuid(devs, &u.to_uppercase()).map(|d| d.index), Some(1));
        assert_eq!(
            by_uuid(devs, "gpu-10111213-1415-1617-1819-1a1b1c1d1e1f").map(|d| d.index),
            Some(0)
        );
        // only the exact full UUID: no prefixes, unlike CUDA_VISIBLE_DEVICES
        assert!(by_uuid(devs, "GPU-2021").is_none());
        assert!(by_uuid(devs, "GPU-20212223-2425-2627-2829-2a2b2c2d2e2").is_none());
        assert!(by_uuid(devs, "").is_none());
    }
}
