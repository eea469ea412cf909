//! The `mps` compute mode: before the driver initialises, the MPS client variables are set from
//! the limits, so that the MPS server enforces them (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`: the
//! share of SMs; `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`: the memory of each device).
//!
//! MPS holds one percentage per client: with different per-device limits the largest is used
//! and the devices whose limit it cannot hold are paced by the `duty` pacer (`state::compute`). A percentage already in
//! the environment that is lower is kept (a client can only lower its own). The memory pairs
//! speak the driver's ordinals after the shim's device view (`CUDA_VISIBLE_DEVICES`, which the
//! shim rewrites before this), in whole MiB rounded down; a lower value already set for a
//! device is kept. While devices are split the program's ordinals are not the driver's: the
//! memory pairs are left to the shim's own accounting then.

use gpushim_common::config::Settings;
use gpushim_common::units::Limit;

use crate::platform::log::{log, Level};

pub const ENV_PERCENTAGE: &str = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";
pub const ENV_PINNED_MEM_LIMIT: &str = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT";

/// What the variables are set to (`None`: left as they are).
#[derive(Debug, PartialEq, Eq)]
pub struct Plan {
    pub percentage: Option<String>,
    pub pinned_mem_limit: Option<String>,
    /// Devices whose compute limit is below the percentage MPS is given.
    pub unheld: Vec<u32>,
}

/// An integer percent of a share, rounded up, 1..=100 (a hair of float error is not a percent).
fn percent(share: f64) -> u32 {
    ((share * 100.0 - 1e-9).ceil() as i64).clamp(1, 100) as u32
}

/// The plan for `settings`. `totals`: the memory of each device the driver will show, in its
/// order, when known (NVML); `None`: only per-device limits in bytes can be given.
/// `existing_*`: the variables as the environment has them.
pub fn plan(settings: &Settings, totals: Option<&[u64]>, split: bool, existing_percentage: Option<&str>, existing_mem: Option<&str>) -> Plan {
    let count = match totals {
        Some(t) => t.len() as u32,
        None => settings.compute_limits.keys().chain(settings.device_limits.keys()).max().map_or(1, |&m| m + 1),
    };
    let percents: Vec<u32> = (0..count).map(|i| settings.compute_limit_for(i).map_or(100, percent)).collect();
    let top = percents.iter().copied().max().unwrap_or(100);
    let unheld = (0..count).filter(|&i| percents[i as usize] < top).collect();
    let existing = existing_percentage.and_then(|v| v.trim().parse::<u32>().ok());
    let percentage = match existing {
        _ if top >= 100 => None,
        Some(e) if e <= top => None,
        _ => Some(top.to_string()),
    };
    let pinned_mem_limit = if split { None } else { mem_pairs(settings, totals, count, existing_mem) };
    Plan { percentage, pinned_mem_limit, unheld }
}

/// `<ordinal>=<MiB>M,…` for the devices with a memory limit, the lower of it and what is set.
fn mem_pairs(settings: &Settings, totals: Option<&[u64]>, count: u32, existing: Option<&str>) -> Option<String> {
    let mut pairs: std::collections::BTreeMap<u32, u64> = existing.map(parse_pairs).unwrap_or_default();
    let mut changed = false;
    for i in 0..count {
        let bytes = match (settings.limit_for(i), totals.and_then(|t| t.get(i as usize))) {
            (Limit::Unlimited, _) => continue,
            (Limit::Bytes(b), Some(&total)) => b.min(total),
            (Limit::Bytes(b), None) => b,
            (l @ Limit::Fraction(_), Some(&total)) => l.resolve(total),
            (Limit::Fraction(_), None) => continue,
        };
        let mib = bytes >> 20;
        if pairs.get(&i).is_none_or(|&e| mib < e) {
            pairs.insert(i, mib);
            changed = true;
        }
    }
    changed.then(|| pairs.iter().map(|(i, m)| format!("{i}={m}M")).collect::<Vec<_>>().join(","))
}

/// MPS's own syntax, read leniently: `0=1G,1=512M` (K, M, G, T; no unit: bytes), in MiB.
fn parse_pairs(s: &str) -> std::collections::BTreeMap<u32, u64> {
    s.split(',')
        .filter_map(|p| {
            let (i, v) = p.split_once('=')?;
            let v = v.trim();
            let (num, shift) = match v.chars().last()?.to_ascii_uppercase() {
                'K' => (&v[..v.len() - 1], 10),
                'M' => (&v[..v.len() - 1], 20),
                'G' => (&v[..v.len() - 1], 30),
                'T' => (&v[..v.len() - 1], 40),
                _ => (v, 0),
            };
            let bytes = num.trim().parse::<u64>().ok()?.checked_shl(shift)?;
            Some((i.trim().parse().ok()?, bytes >> 20))
        })
        .collect()
}

/// Sets the variables (before the driver's `cuInit`; the first call only).
pub fn apply(settings: &Settings, totals: Option<&[u64]>, split: bool) {
    static DONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if DONE.swap(true, std::sync::atomic::Ordering::AcqRel) {
        return;
    }
    let existing_percentage = gpushim_common::unforked::var(ENV_PERCENTAGE).ok();
    let existing_mem = gpushim_common::unforked::var(ENV_PINNED_MEM_LIMIT).ok();
    let plan = plan(settings, totals, split, existing_percentage.as_deref(), existing_mem.as_deref());
    if !plan.unheld.is_empty() {
        let names: Vec<String> = plan.unheld.iter().map(|d| format!("device {d}")).collect();
        log!(
            Level::Info,
            "GPUSHIM_COMPUTE_MODE=mps: MPS gives a process one share of every device; the largest compute limit is used, and the lower limit of {} is held by gpushim's duty pacer",
            names.join(", ")
        );
    }
    for (name, value) in [(ENV_PERCENTAGE, &plan.percentage), (ENV_PINNED_MEM_LIMIT, &plan.pinned_mem_limit)] {
        if let Some(v) = value {
            log!(Level::Debug, "{name}={v}");
            gpushim_common::unforked::set_var(name, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(compute: &[(Option<u32>, f64)], memory: &[(Option<u32>, Limit)]) -> Settings {
        let mut s = Settings::default();
        for &(d, share) in compute {
            match d {
                Some(d) => { s.compute_limits.insert(d, share); }
                None => s.compute_limit = Some(share),
            }
        }
        for &(d, l) in memory {
            match d {
                Some(d) => { s.device_limits.insert(d, l); }
                None => s.memory_limit = l,
            }
        }
        s
    }

    #[test]
    fn the_percentage_is_the_largest_limit_rounded_up() {
        let s = settings(&[(None, 0.3)], &[]);
        assert_eq!(plan(&s, Some(&[1 << 34, 1 << 34]), false, None, None).percentage.as_deref(), Some("30"));
        let s = settings(&[(None, 0.001)], &[]);
        assert_eq!(plan(&s, Some(&[1 << 34]), false, None, None).percentage.as_deref(), Some("1"));
        let s = settings(&[(None, 0.255)], &[]);
        assert_eq!(plan(&s, Some(&[1 << 34]), false, None, None).percentage.as_deref(), Some("26"));
        // a lower one already set is kept; a higher one is lowered
        assert_eq!(plan(&s, Some(&[1 << 34]), false, Some("20"), None).percentage, None);
        assert_eq!(plan(&s, Some(&[1 << 34]), false, Some("50"), None).percentage.as_deref(), Some("26"));
        // per device: the largest, the others named
        let s = settings(&[(Some(0), 0.3), (Some(1), 0.6)], &[]);
        let p = plan(&s, Some(&[1 << 34, 1 << 34]), false, None, None);
        assert_eq!((p.percentage.as_deref(), p.unheld), (Some("60"), vec![0]));
        // a device without a limit: MPS cannot limit the others
        let s = settings(&[(Some(0), 0.3)], &[]);
        let p = plan(&s, Some(&[1 << 34, 1 << 34]), false, None, None);
        assert_eq!((p.percentage, p.unheld), (None, vec![0]));
    }

    #[test]
    fn memory_pairs_in_mib_rounded_down() {
        let s = settings(&[(None, 0.5)], &[(None, Limit::Bytes(3 << 30)), (Some(1), Limit::Bytes((1 << 30) + (1 << 20) - 1))]);
        let p = plan(&s, Some(&[1 << 34, 1 << 34]), false, None, None);
        assert_eq!(p.pinned_mem_limit.as_deref(), Some("0=3072M,1=1024M"));
        let s = settings(&[(None, 0.5)], &[(Some(1), Limit::Fraction(0.25))]);
        assert_eq!(plan(&s, Some(&[1 << 34, 1 << 34]), false, None, None).pinned_mem_limit.as_deref(), Some("1=4096M"));
        // lower existing values stay, higher ones go
        assert_eq!(plan(&s, Some(&[1 << 34, 1 << 34]), false, None, Some("0=1G,1=8G")).pinned_mem_limit.as_deref(), Some("0=1024M,1=4096M"));
        assert_eq!(plan(&s, Some(&[1 << 34, 1 << 34]), false, None, Some("1=2G")).pinned_mem_limit, None);
        // split devices: left to the shim
        assert_eq!(plan(&s, Some(&[1 << 34, 1 << 34]), true, None, None).pinned_mem_limit, None);
    }
}
