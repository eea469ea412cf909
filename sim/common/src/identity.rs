//! The identity of physical device `p`, the same in both simulated libraries and whatever
//! `CUDA_VISIBLE_DEVICES` says:
//!
//! | what | value | p = 0 | p = 1 |
//! |---|---|---|---|
//! | name | `gpusim device <p>` | `gpusim device 0` | `gpusim device 1` |
//! | UUID bytes | `0x10*(p+1) + i` (as `u8`: p = 15 wraps to `00 01 02 …`) | `GPU-10111213-1415-1617-1819-1a1b1c1d1e1f` | `GPU-20212223-…` |
//! | PCI domain / bus / device | `0` / `0x10*(p+1)` / `0` (p = 15: bus `0x100`) | `0:0x10:0` | `0:0x20:0` |
//! | serial (NVML) | `GPUSIM-<p>` | `GPUSIM-0` | `GPUSIM-1` |
//! | PCI device id / subsystem id (NVML) | [`PCI_DEVICE_ID`] / [`PCI_SUBSYSTEM_ID`] | | |
//!
//! How a bus id is written differs by library (`cuDeviceGetPCIBusId`: `%04x:%02x:%02x.0`;
//! NVML: upper case, 8 or 4 domain digits), so the formatting stays with each library.

/// PCI vendor 0x10de (NVIDIA), device 0x2330 (an H100 SXM5's id).
pub const PCI_DEVICE_ID: u32 = 0x2330_10de;
pub const PCI_SUBSYSTEM_ID: u32 = 0x16c1_10de;

/// Who physical device `index` is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub index: usize,
    pub name: String,
    pub uuid: [u8; 16],
    pub serial: String,
    pub pci_domain: u32,
    pub pci_bus: u32,
    pub pci_device: u32,
}

impl Identity {
    pub fn of(index: usize) -> Identity {
        Identity {
            index,
            name: format!("gpusim device {index}"),
            uuid: uuid(index),
            serial: format!("GPUSIM-{index}"),
            pci_domain: 0,
            pci_bus: 0x10 * (index as u32 + 1),
            pci_device: 0,
        }
    }

    /// `GPU-10111213-1415-1617-1819-1a1b1c1d1e1f`
    pub fn uuid_string(&self) -> String {
        uuid_string(&self.uuid)
    }
}

/// UUID bytes of physical device `index`: `0x10*(index+1) + i`, as `u8`.
pub fn uuid(index: usize) -> [u8; 16] {
    let base = (0x10 * (index + 1)) as u8;
    let mut uuid = [0u8; 16];
    for (i, b) in uuid.iter_mut().enumerate() {
        *b = base.wrapping_add(i as u8);
    }
    uuid
}

/// `GPU-10111213-1415-1617-1819-1a1b1c1d1e1f`: `GPU-` and the bytes in lower-case hex, grouped
/// 4-2-2-2-6.
pub fn uuid_string(u: &[u8; 16]) -> String {
    let h: Vec<String> = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities() {
        let d = Identity::of(0);
        assert_eq!(d.name, "gpusim device 0");
        assert_eq!(d.uuid_string(), "GPU-10111213-1415-1617-1819-1a1b1c1d1e1f");
        assert_eq!(d.serial, "GPUSIM-0");
        assert_eq!((d.pci_domain, d.pci_bus, d.pci_device), (0, 0x10, 0));
        let d = Identity::of(1);
        assert_eq!(d.name, "gpusim device 1");
        assert_eq!(d.uuid_string(), "GPU-20212223-2425-2627-2829-2a2b2c2d2e2f");
        assert_eq!(d.serial, "GPUSIM-1");
        assert_eq!((d.pci_domain, d.pci_bus, d.pci_device), (0, 0x20, 0));
        let d = Identity::of(15);
        assert_eq!(d.uuid_string(), "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f");
        assert_eq!(d.pci_bus, 0x100);
        assert_eq!(d.uuid, uuid(15));
    }
}
