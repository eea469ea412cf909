//! Physical devices, `CUDA_VISIBLE_DEVICES`, `cuInit` and the device queries.
//!
//! Identity of physical device `p` (independent of `CUDA_VISIBLE_DEVICES`):
//! name `gpusim device <p>`, UUID bytes `0x10*(p+1) + i`, PCI `0000:<0x10*(p+1)>:00.0`
//! (`gpusim_common::identity`, the same for `sim/nvml`).
//! The `CUdevice` handles are the visible ordinals `0..n`.

use crate::config;
use crate::types::*;
pub use gpusim_common::identity::uuid_string;
use gpusim_common::identity::Identity;
use std::ffi::c_char;
use std::sync::OnceLock;

#[derive(Debug, Clone)]
pub struct Phys {
    pub index: usize,
    pub name: String,
    pub uuid: [u8; 16],
    pub pci_domain: i32,
    pub pci_bus: i32,
    pub pci_device: i32,
    pub total: u64,
}

impl Phys {
    /// Physical device `index` with the identity of `gpusim_common::identity` (shared with
    /// `sim/nvml`).
    pub fn new(index: usize, total: u64) -> Phys {
        let id = Identity::of(index);
        Phys {
            index,
            name: id.name,
            uuid: id.uuid,
            pci_domain: id.pci_domain as i32,
            pci_bus: id.pci_bus as i32,
            pci_device: id.pci_device as i32,
            total,
        }
    }

    /// `GPU-10111213-1415-1617-1819-1a1b1c1d1e1f`
    pub fn uuid_string(&self) -> String {
        uuid_string(&self.uuid)
    }

    /// `0000:10:00.0`, as `cuDeviceGetPCIBusId` writes it.
    pub fn bus_id(&self) -> String {
        format!(
            "{:04x}:{:02x}:{:02x}.0",
            self.pci_domain, self.pci_bus, self.pci_device
        )
    }
}

static PHYSICAL: OnceLock<Vec<Phys>> = OnceLock::new();

/// All physical devices, from `GPUSIM_DEVICES` / `GPUSIM_MEMORY`.
pub fn physical() -> &'static [Phys] {
    PHYSICAL.get_or_init(|| {
        let c = config::get();
        (0..c.devices).map(|i| Phys::new(i, c.memory[i])).collect()
    })
}

/// `CUDA_VISIBLE_DEVICES` as the real driver reads it: unset = all devices; otherwise a comma
/// list of physical indices or UUIDs (`GPU-` + a unique prefix), which stops at the first
/// invalid, unknown, ambiguous or duplicate entry. Returns the physical indices in ordinal order.
pub fn parse_visible(spec: Option<&str>, phys: &[Phys]) -> Vec<usize> {
    let Some(spec) = spec else {
        return (0..phys.len()).collect();
    };
    let mut out: Vec<usize> = Vec::new();
    for entry in spec.split(',') {
        let e = entry.trim();
        let found = if !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit()) {
            e.parse::<usize>().ok().filter(|&i| i < phys.len())
        } else if e.len() > 4 && e.as_bytes()[..4].eq_ignore_ascii_case(b"GPU-") {
            let want = e.to_ascii_lowercase();
            let mut hits = phys
                .iter()
                .filter(|p| p.uuid_string().to_ascii_lowercase().starts_with(&want));
            match (hits.next(), hits.next()) {
                (Some(p), None) => Some(p.index),
                _ => None,
            }
        } else {
            None
        };
        match found {
            Some(i) if !out.contains(&i) => out.push(i),
            _ => break,
        }
    }
    out
}

static VISIBLE: OnceLock<Vec<usize>> = OnceLock::new();

/// The visible devices (physical indices by ordinal), or `CUDA_ERROR_NOT_INITIALIZED` before `cuInit`.
#[inline]
pub fn visible() -> Res<&'static [usize]> {
    VISIBLE
        .get()
        .map(|v| v.as_slice())
        .ok_or(CUDA_ERROR_NOT_INITIALIZED)
}

/// The physical device of visible ordinal `dev`.
#[inline]
pub fn phys_of(dev: CUdevice) -> Res<&'static Phys> {
    let v = visible()?;
    if dev < 0 || dev as usize >= v.len() {
        return Err(CUDA_ERROR_INVALID_DEVICE);
    }
    Ok(&physical()[v[dev as usize]])
}

/// Attribute values, by `CUdevice_attribute` number; everything not listed is 0.
pub fn attribute(attr: i32, p: &Phys) -> i32 {
    match attr {
        1 => 1024,          // MAX_THREADS_PER_BLOCK
        2 | 3 => 1024,      // MAX_BLOCK_DIM_X, _Y
        4 => 64,            // MAX_BLOCK_DIM_Z
        5 => i32::MAX,      // MAX_GRID_DIM_X
        6 | 7 => 65535,     // MAX_GRID_DIM_Y, _Z
        8 => 49152,         // MAX_SHARED_MEMORY_PER_BLOCK
        10 => 32,           // WARP_SIZE
        12 => 65536,        // MAX_REGISTERS_PER_BLOCK
        39 => 2048,         // MAX_THREADS_PER_MULTIPROCESSOR
        106 => 32,          // MAX_BLOCKS_PER_MULTIPROCESSOR
        16 => 132,          // MULTIPROCESSOR_COUNT
        18 => 0,            // INTEGRATED
        33 => p.pci_bus,    // PCI_BUS_ID
        34 => p.pci_device, // PCI_DEVICE_ID
        41 => 1,            // UNIFIED_ADDRESSING
        50 => p.pci_domain, // PCI_DOMAIN_ID
        75 => 9,            // COMPUTE_CAPABILITY_MAJOR
        76 => 0,            // COMPUTE_CAPABILITY_MINOR
        83 => 1,            // MANAGED_MEMORY
        89 => 1,            // CONCURRENT_MANAGED_ACCESS
        102 => 1,           // VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
        115 => 1,           // MEMORY_POOLS_SUPPORTED
        _ => 0,
    }
}

/// Parses `[domain:]bus:device.function` (hex, any case, domain of any width).
pub fn parse_bus_id(s: &str) -> Option<(i32, i32, i32)> {
    let s = s.trim();
    let (rest, func) = s.rsplit_once('.')?;
    let parts: Vec<&str> = rest.split(':').collect();
    let (dom, bus, dev) = match parts.as_slice() {
        [d, b, v] => (*d, *b, *v),
        [b, v] => ("0", *b, *v),
        _ => return None,
    };
    let hex = |x: &str| -> Option<i64> {
        if x.is_empty() || x.len() > 8 {
            return None;
        }
        i64::from_str_radix(x, 16).ok()
    };
    hex(func)?;
    Some((hex(dom)? as i32, hex(bus)? as i32, hex(dev)? as i32))
}

cu_api! {
    fn cuInit(flags: u32) {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let phys = physical();
        // Attaches to the node-wide state (GPUSIM_NODE_STATE), reclaiming dead processes'
        // memory, if it is on and not attached yet.
        let _ = crate::node::active();
        // The origin of this process' busy timeline (the first cuInit).
        crate::timeline::origin();
        let vis = VISIBLE.get_or_init(|| {
            let spec = std::env::var("CUDA_VISIBLE_DEVICES").ok();
            parse_visible(spec.as_deref(), phys)
        });
        // As the real driver: no visible device is CUDA_ERROR_NO_DEVICE (the driver is still
        // initialised: cuDeviceGetCount then reports 0).
        if vis.is_empty() {
            return Err(CUDA_ERROR_NO_DEVICE);
        }
        Ok(())
    }

    fn cuDriverGetVersion(version: *mut i32) {
        put(version, config::get().driver_version)
    }

    fn cuDeviceGetCount(count: *mut i32) {
        put(count, visible()?.len() as i32)
    }

    fn cuDeviceGet(device: *mut CUdevice, ordinal: i32) {
        phys_of(ordinal)?;
        put(device, ordinal)
    }

    fn cuDeviceGetName(name: *mut c_char, len: i32, dev: CUdevice) {
        let p = phys_of(dev)?;
        put_cstr(name, len, &p.name)
    }

    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) {
        let p = phys_of(dev)?;
        put(bytes, p.total as usize)
    }

    /// v1 ABI: 32-bit result, clamped.
    fn cuDeviceTotalMem(bytes: *mut u32, dev: CUdevice) {
        let p = phys_of(dev)?;
        put(bytes, p.total.min(u32::MAX as u64) as u32)
    }

    fn cuDeviceGetAttribute(value: *mut i32, attrib: i32, dev: CUdevice) {
        let p = phys_of(dev)?;
        put(value, attribute(attrib, p))
    }

    fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) {
        let p = phys_of(dev)?;
        put(uuid, CUuuid { bytes: p.uuid })
    }

    fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) {
        let p = phys_of(dev)?;
        put(uuid, CUuuid { bytes: p.uuid })
    }

    fn cuDeviceGetLuid(luid: *mut c_char, mask: *mut u32, dev: CUdevice) {
        let _ = (luid, mask);
        phys_of(dev)?;
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }

    fn cuDeviceGetPCIBusId(bus_id: *mut c_char, len: i32, dev: CUdevice) {
        let p = phys_of(dev)?;
        put_cstr(bus_id, len, &p.bus_id())
    }

    fn cuDeviceGetByPCIBusId(dev: *mut CUdevice, bus_id: *const c_char) {
        let v = visible()?;
        let s = cstr(bus_id)?;
        let (d, b, f) = parse_bus_id(&s).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let phys = physical();
        let ord = v
            .iter()
            .position(|&i| (phys[i].pci_domain, phys[i].pci_bus, phys[i].pci_device) == (d, b, f))
            .ok_or(CUDA_ERROR_INVALID_DEVICE)?;
        put(dev, ord as CUdevice)
    }

    fn cuDeviceComputeCapability(major: *mut i32, minor: *mut i32, dev: CUdevice) {
        phys_of(dev)?;
        if major.is_null() || minor.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        put(major, 9)?;
        put(minor, 0)
    }

    fn cuDeviceGetProperties(prop: *mut CUdevprop, dev: CUdevice) {
        phys_of(dev)?;
        put(prop, CUdevprop {
            max_threads_per_block: 1024,
            max_threads_dim: [1024, 1024, 64],
            max_grid_size: [i32::MAX, 65535, 65535],
            shared_mem_per_block: 48 << 10,
            total_constant_memory: 64 << 10,
            simd_width: 32,
            mem_pitch: i32::MAX,
            regs_per_block: 65536,
            clock_rate: 1_980_000,
            texture_align: 512,
        })
    }

    fn cuDeviceCanAccessPeer(can: *mut i32, dev: CUdevice, peer: CUdevice) {
        phys_of(dev)?;
        phys_of(peer)?;
        put(can, (dev != peer) as i32)
    }

    fn cuDeviceGetP2PAttribute(value: *mut i32, attrib: i32, src: CUdevice, dst: CUdevice) {
        phys_of(src)?;
        phys_of(dst)?;
        if src == dst {
            return Err(CUDA_ERROR_INVALID_DEVICE);
        }
        // PERFORMANCE_RANK(1) = 0; ACCESS_SUPPORTED(2), NATIVE_ATOMIC_SUPPORTED(3),
        // CUDA_ARRAY_ACCESS_SUPPORTED(4) = 1.
        put(value, matches!(attrib, 2..=4) as i32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn four() -> Vec<Phys> {
        (0..4).map(|i| Phys::new(i, 1 << 30)).collect()
    }

    #[test]
    fn identities() {
        let p = Phys::new(0, 1);
        assert_eq!(p.uuid_string(), "GPU-10111213-1415-1617-1819-1a1b1c1d1e1f");
        assert_eq!(p.bus_id(), "0000:10:00.0");
        assert_eq!(p.name, "gpusim device 0");
        let p = Phys::new(1, 1);
        assert_eq!(p.uuid_string(), "GPU-20212223-2425-2627-2829-2a2b2c2d2e2f");
        assert_eq!(p.bus_id(), "0000:20:00.0");
        // p = 15: the UUID bytes wrap (u8), the bus is 0x100
        assert_eq!(Phys::new(15, 1).bus_id(), "0000:100:00.0");
    }

    #[test]
    fn visible_devices() {
        let p = four();
        assert_eq!(parse_visible(None, &p), vec![0, 1, 2, 3]);
        assert_eq!(parse_visible(Some(""), &p), Vec::<usize>::new());
        assert_eq!(parse_visible(Some("1"), &p), vec![1]);
        assert_eq!(parse_visible(Some("3,1"), &p), vec![3, 1]);
        assert_eq!(parse_visible(Some(" 2 , 0 "), &p), vec![2, 0]);
        // stops at the first invalid / unknown / duplicate entry
        assert_eq!(parse_visible(Some("2,9,0"), &p), vec![2]);
        assert_eq!(parse_visible(Some("0,x,1"), &p), vec![0]);
        assert_eq!(parse_visible(Some("1,1,2"), &p), vec![1]);
        assert_eq!(parse_visible(Some("-1"), &p), Vec::<usize>::new());
        assert_eq!(parse_visible(Some("0,-1,1"), &p), vec![0]);
        assert_eq!(parse_visible(Some(","), &p), Vec::<usize>::new());
        // UUIDs, full and unique prefixes, any case
        assert_eq!(
            parse_visible(Some("GPU-20212223-2425-2627-2829-2a2b2c2d2e2f"), &p),
            vec![1]
        );
        assert_eq!(parse_visible(Some("GPU-3"), &p), vec![2]);
        assert_eq!(parse_visible(Some("gpu-4041,0"), &p), vec![3, 0]);
        assert_eq!(parse_visible(Some("GPU-2021222,GPU-1"), &p), vec![1, 0]);
        assert_eq!(parse_visible(Some("1,GPU-2"), &p), vec![1]); // duplicate by UUID
        assert_eq!(parse_visible(Some("GPU-99"), &p), Vec::<usize>::new());
        assert_eq!(parse_visible(Some("GPU-"), &p), Vec::<usize>::new());
        // a prefix matching several devices is ambiguous
        let many: Vec<Phys> = (0..16).map(|i| Phys::new(i, 1)).collect();
        assert_eq!(
            many[15].uuid_string(),
            "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
        );
        assert_eq!(parse_visible(Some("GPU-0"), &many), vec![15]);
        let mut twins = four();
        twins[2].uuid = twins[1].uuid;
        twins[2].uuid[15] = 0xff;
        assert_eq!(parse_visible(Some("GPU-2021"), &twins), Vec::<usize>::new());
        assert_eq!(parse_visible(Some("0,GPU-2021,1"), &twins), vec![0]);
        assert_eq!(
            parse_visible(Some("GPU-20212223-2425-2627-2829-2a2b2c2d2eff"), &twins),
            vec![2]
        );
        assert_eq!(parse_visible(Some("15,0"), &many), vec![15, 0]);
    }

    #[test]
    fn bus_ids() {
        assert_eq!(parse_bus_id("0000:10:00.0"), Some((0, 0x10, 0)));
        assert_eq!(parse_bus_id("00000000:2A:00.0"), Some((0, 0x2a, 0)));
        assert_eq!(parse_bus_id("20:00.0"), Some((0, 0x20, 0)));
        assert_eq!(parse_bus_id("nonsense"), None);
        assert_eq!(parse_bus_id("0000:zz:00.0"), None);
    }

    #[test]
    fn attributes() {
        let p = Phys::new(1, 1);
        assert_eq!(attribute(33, &p), 0x20);
        assert_eq!(attribute(75, &p), 9);
        assert_eq!(attribute(16, &p), 132);
        assert_eq!((attribute(2, &p), attribute(4, &p), attribute(5, &p), attribute(39, &p)), (1024, 64, i32::MAX, 2048));
        assert_eq!(attribute(9999, &p), 0);
    }
}
