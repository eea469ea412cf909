//! The program's devices after splitting (`GPUSHIM_VIRTUAL_DEVICES`).
//!
//! Hiding and reordering are done by the driver (`view`); what it then shows are the *driver
//! devices*, ordinals 0..n. Splitting maps them to the *program devices*: a split driver device
//! appears as several consecutive program devices (in its place in the order), each with its own
//! ordinal, UUID (derived from the physical one), memory size and contexts; devices not named
//! stay whole. Program ordinals are what every hooked function speaks; `CUdevice` handles equal
//! program ordinals, as the CUDA runtime requires.
//!
//! With no split, program devices are the driver devices and nothing is translated.

use gpushim_common::config::{Selector, VirtualSplit};

/// What the shim knows of one driver device when splitting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverDevice {
    /// `GPU-…`, lower case.
    pub uuid: String,
    /// `0000:3b:00.0`, lower case.
    pub pci: String,
    /// Physical memory in bytes (`cuDeviceTotalMem`, or NVML's total).
    pub total: u64,
}

/// One device of the program's view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProgramDevice {
    /// Its ordinal in the driver's view.
    pub driver: i32,
    /// For a virtual device: its index among the devices its GPU is split into, and its size.
    pub part: Option<Part>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Part {
    pub index: u32,
    pub count: u32,
    pub size: u64,
}

/// The program's devices, in order.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Devices {
    pub list: Vec<ProgramDevice>,
}

impl Devices {
    /// The program device `ordinal`.
    pub fn get(&self, ordinal: i32) -> Option<&ProgramDevice> {
        usize::try_from(ordinal).ok().and_then(|i| self.list.get(i))
    }

    /// The first program device on driver device `driver` (the one a driver answer about that
    /// GPU is reported as, when nothing says which of its parts).
    pub fn first_of(&self, driver: i32) -> Option<i32> {
        self.list.iter().position(|d| d.driver == driver).map(|i| i as i32)
    }
}

/// Splits the driver devices as `splits` says. Selectors name driver devices (the devices the
/// program would see unsplit): by ordinal, UUID prefix or PCI bus id.
pub fn expand(splits: &[VirtualSplit], driver: &[DriverDevice]) -> Result<Devices, String> {
    let mut parts: Vec<Option<&VirtualSplit>> = vec![None; driver.len()];
    for split in splits {
        let d = find(&split.selector, driver)?;
        if parts[d].is_some() {
            return Err(format!("device {} is split twice", split.selector));
        }
        let sum = split.sizes.iter().fold(0u64, |a, &s| a.saturating_add(s));
        if sum > driver[d].total {
            return Err(format!(
                "the sizes of device {} add up to {sum} bytes, more than its {} bytes",
                split.selector, driver[d].total
            ));
        }
        parts[d] = Some(split);
    }
    let mut list = Vec::new();
    for (d, split) in parts.iter().enumerate() {
        match split {
            None => list.push(ProgramDevice { driver: d as i32, part: None }),
            Some(s) => list.extend(s.sizes.iter().enumerate().map(|(i, &size)| ProgramDevice {
                driver: d as i32,
                part: Some(Part { index: i as u32, count: s.sizes.len() as u32, size }),
            })),
        }
    }
    if list.len() > crate::devices::MAX_DEVICES {
        return Err(format!(
            "this makes {} devices; gpushim accounts for at most {} (fewer virtual devices, or hide some GPUs)",
            list.len(),
            crate::devices::MAX_DEVICES
        ));
    }
    Ok(Devices { list })
}

fn find(sel: &Selector, driver: &[DriverDevice]) -> Result<usize, String> {
    let hits: Vec<usize> = (0..driver.len())
        .filter(|&i| match sel {
            Selector::Ordinal(n) => i == *n as usize,
            Selector::Uuid(prefix) => driver[i].uuid.starts_with(prefix.as_str()),
            Selector::PciBusId(id) => driver[i].pci == *id,
        })
        .collect();
    match hits[..] {
        [i] => Ok(i),
        [] => Err(format!("there is no visible device {sel} ({} visible)", driver.len())),
        _ => Err(format!("{sel} matches several devices: give more of the UUID")),
    }
}

/// The UUID of part `index` of a device: stable, distinct for each part and from the physical
/// UUID (an RFC 9562 version-8 UUID whose last 8 bytes hash the physical UUID and the index).
pub fn part_uuid(physical: &[u8; 16], index: u32) -> [u8; 16] {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in physical.iter().chain(index.to_le_bytes().iter()).chain(b"gpushim".iter()) {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    let mut u = *physical;
    u[8..16].copy_from_slice(&h.to_be_bytes());
    u[6] = (u[6] & 0x0f) | 0x80;
    u[8] = (u[8] & 0x3f) | 0x80;
    u
}

/// Parses `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` into 16 bytes.
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let hex: String = s.strip_prefix("GPU-").or_else(|| s.strip_prefix("gpu-"))?.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn two() -> Vec<DriverDevice> {
        (0..2).map(|i| DriverDevice { uuid: format!("GPU-{i}{i}aa"), pci: format!("0000:{i}0:00.0"), total: 16 * GIB }).collect()
    }

    fn split(sel: Selector, sizes: &[u64]) -> VirtualSplit {
        VirtualSplit { selector: sel, sizes: sizes.to_vec() }
    }

    #[test]
    fn splits_in_place() {
        let d = expand(&[split(Selector::Ordinal(0), &[4 * GIB, 4 * GIB])], &two()).unwrap();
        let part = |index, size| Some(Part { index, count: 2, size });
        assert_eq!(
            d.list,
            vec![
                ProgramDevice { driver: 0, part: part(0, 4 * GIB) },
                ProgramDevice { driver: 0, part: part(1, 4 * GIB) },
                ProgramDevice { driver: 1, part: None },
            ]
        );
        assert_eq!(d.first_of(1), Some(2));
        assert_eq!(d.first_of(0), Some(0));
        let d = expand(&[split(Selector::Uuid("GPU-11".into()), &[GIB])], &two()).unwrap();
        assert_eq!(d.list.len(), 2);
        assert_eq!(d.list[1].part.map(|p| p.size), Some(GIB));
        assert!(expand(&[], &two()).unwrap().list.iter().all(|d| d.part.is_none()));
    }

    #[test]
    fn errors() {
        assert_eq!(
            expand(&[split(Selector::Ordinal(0), &[10 * GIB, 7 * GIB])], &two()).unwrap_err(),
            "the sizes of device 0 add up to 18253611008 bytes, more than its 17179869184 bytes"
        );
        assert_eq!(expand(&[split(Selector::Ordinal(2), &[GIB])], &two()).unwrap_err(), "there is no visible device 2 (2 visible)");
        assert!(expand(&[split(Selector::PciBusId("0000:99:00.0".into()), &[GIB])], &two()).is_err());
        assert!(expand(&[split(Selector::Ordinal(0), &[GIB]), split(Selector::Uuid("GPU-0".into()), &[GIB])], &two()).is_err());
    }

    #[test]
    fn part_uuids_are_distinct_and_stable() {
        let p = parse_uuid("GPU-10111213-1415-1617-1819-1a1b1c1d1e1f").unwrap();
        assert_eq!(p[0], 0x10);
        assert_eq!(p[15], 0x1f);
        let (a, b) = (part_uuid(&p, 0), part_uuid(&p, 1));
        assert_ne!(a, b);
        assert_ne!(a, p);
        assert_eq!(a, part_uuid(&p, 0));
        assert_eq!(a[..6], p[..6]);
        assert_eq!(a[6] >> 4, 8);
    }
}
