//! The program's view of the devices: which physical devices it sees, in which order.
//!
//! Hiding and reordering are realised by the driver itself: before the driver initialises, the
//! shim sets `CUDA_VISIBLE_DEVICES` to the UUIDs of the selected devices, in the program's
//! order. The driver then applies the view on every path — public functions, the runtime's
//! private tables and its device-integrity check — so the view is consistent by construction.
//! NVML ignores `CUDA_VISIBLE_DEVICES`, so the NVML hooks apply the same list themselves.
//!
//! Selectors are resolved against the devices the driver would show the process (so they compose
//! with a `CUDA_VISIBLE_DEVICES` already set), using NVML's inventory of physical devices (UUID,
//! PCI bus id). Ordinals — the program's, and indices in `CUDA_VISIBLE_DEVICES` — are read in
//! NVML's order (PCI bus order), which is CUDA's order when `CUDA_DEVICE_ORDER=PCI_BUS_ID` or when
//! the GPUs are all of one model (the driver's "fastest first" then falls back to bus order).
//!
//! Children inherit the rewritten `CUDA_VISIBLE_DEVICES`; the shim also sets
//! `GPUSHIM_VIEW_APPLIED` to the same value, and a shim that finds the two equal knows the view is
//! already applied and does not apply `GPUSHIM_VISIBLE_DEVICES` a second time. A child started
//! with the original environment (neither variable changed) applies it afresh, to the same result.

use crate::config::Selector;

/// Set to the value the shim gave `CUDA_VISIBLE_DEVICES`.
pub const APPLIED_MARKER: &str = crate::config::ENV_VIEW_APPLIED;
pub const CUDA_VISIBLE_DEVICES: &str = "CUDA_VISIBLE_DEVICES";

/// One physical device as NVML lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Physical {
    /// `GPU-…`, lower case.
    pub uuid: String,
    /// `0000:3b:00.0`, lower case.
    pub pci: String,
    /// Memory in bytes, as NVML counts it.
    pub total: u64,
}

/// The devices of the program's view, in its order, as indices into the inventory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    pub devices: Vec<usize>,
}

impl View {
    /// The UUIDs of the view, in order: the entries of the `CUDA_VISIBLE_DEVICES` that gives it.
    pub fn uuids(&self, inventory: &[Physical]) -> Vec<String> {
        self.devices.iter().map(|&p| inventory[p].uuid.clone()).collect()
    }
}

/// The devices the driver shows the process, given `CUDA_VISIBLE_DEVICES` (`None`: unset).
/// Parsed the way the driver does: entries are indices or UUID prefixes, and the list ends at the
/// first entry that is malformed, unknown, ambiguous or a repeat.
pub fn driver_view(cvd: Option<&str>, inventory: &[Physical]) -> View {
    let Some(cvd) = cvd else { return View { devices: (0..inventory.len()).collect() } };
    let mut devices = Vec::new();
    for entry in cvd.split(',').map(str::trim) {
        let found = if !entry.is_empty() && entry.bytes().all(|b| b.is_ascii_digit()) {
            entry.parse::<usize>().ok().filter(|&i| i < inventory.len())
        } else if entry.len() > 4 && entry[..4].eq_ignore_ascii_case("GPU-") {
            let prefix = format!("GPU-{}", entry[4..].to_ascii_lowercase());
            unique(inventory, |p| p.uuid.starts_with(&prefix)).ok()
        } else {
            None
        };
        match found {
            Some(p) if !devices.contains(&p) => devices.push(p),
            _ => break,
        }
    }
    View { devices }
}

fn unique(inventory: &[Physical], pred: impl Fn(&Physical) -> bool) -> Result<usize, usize> {
    let mut hits = inventory.iter().enumerate().filter(|(_, p)| pred(p)).map(|(i, _)| i);
    match (hits.next(), hits.next()) {
        (Some(i), None) => Ok(i),
        (None, _) => Err(0),
        (Some(_), Some(_)) => Err(2),
    }
}

/// Resolves the selectors against the driver's view. The error is the reason, for a message
/// naming the setting.
pub fn select(selectors: &[Selector], cvd: Option<&str>, inventory: &[Physical]) -> Result<View, String> {
    let visible = driver_view(cvd, inventory);
    let hidden_note = |uuid: &str| match cvd {
        Some(c) => format!("{uuid} is hidden by CUDA_VISIBLE_DEVICES={c}"),
        None => format!("{uuid} is not visible to this process"),
    };
    let mut devices = Vec::with_capacity(selectors.len());
    for sel in selectors {
        let p = match sel {
            Selector::Ordinal(i) => *visible.devices.get(*i as usize).ok_or_else(|| {
                let n = visible.devices.len();
                let devs = if n == 1 { "device is" } else { "devices are" };
                match cvd {
                    Some(c) => format!("there is no device {i}: {n} {devs} visible (CUDA_VISIBLE_DEVICES={c})"),
                    None => format!("there is no device {i}: {n} {devs} visible"),
                }
            })?,
            Selector::Uuid(prefix) => unique(inventory, |p| p.uuid.starts_with(prefix.as_str())).map_err(|n| match n {
                0 => format!("no device has a UUID starting with {prefix}"),
                _ => format!("{prefix} matches several devices: give more of the UUID"),
            })?,
            Selector::PciBusId(id) => {
                unique(inventory, |p| p.pci == *id).map_err(|_| format!("no device has PCI bus id {id}"))?
            }
        };
        if !visible.devices.contains(&p) {
            return Err(hidden_note(&inventory[p].uuid));
        }
        if devices.contains(&p) {
            return Err(format!("{} is selected twice", inventory[p].uuid));
        }
        devices.push(p);
    }
    Ok(View { devices })
}

/// Without NVML's inventory (a container given only the driver's compute libraries): ordinals
/// compose with `CUDA_VISIBLE_DEVICES` by position, UUIDs pass through to the driver when
/// nothing else hides devices; PCI bus ids cannot be resolved. Returns the entries of the new
/// `CUDA_VISIBLE_DEVICES`.
pub fn select_without_inventory(selectors: &[Selector], cvd: Option<&str>) -> Result<Vec<String>, String> {
    let base: Option<Vec<&str>> = cvd.map(|c| c.split(',').map(str::trim).take_while(|e| !e.is_empty()).collect());
    let mut out: Vec<String> = Vec::with_capacity(selectors.len());
    for sel in selectors {
        let entry = match (sel, &base) {
            (Selector::Ordinal(i), Some(base)) => base.get(*i as usize).map(|e| e.to_string()).ok_or_else(|| {
                format!("there is no device {i}: {} visible (CUDA_VISIBLE_DEVICES={})", base.len(), cvd.unwrap_or(""))
            })?,
            (Selector::Ordinal(i), None) => i.to_string(),
            (Selector::Uuid(u), None) => u.clone(),
            (Selector::Uuid(_), Some(_)) => {
                return Err("selecting by UUID together with CUDA_VISIBLE_DEVICES needs NVML (libnvidia-ml.so.1), which is not available".into())
            }
            (Selector::PciBusId(_), _) => return Err("selecting by PCI bus id needs NVML (libnvidia-ml.so.1), which is not available".into()),
        };
        if out.contains(&entry) {
            return Err(format!("{entry} is selected twice"));
        }
        out.push(entry);
    }
    Ok(out)
}

/// A child given its own `CUDA_VISIBLE_DEVICES` under a view its parent applied: its entries
/// (indices or UUID prefixes) are read within the parent's view, as the driver reads them
/// within all devices — so a launcher that gives each worker `CUDA_VISIBLE_DEVICES=<i>` hands it
/// device `<i>` of the view it was given itself.
pub fn narrow(parent: &str, cvd: &str) -> Vec<String> {
    let parent: Vec<&str> = parent.split(',').filter(|e| !e.is_empty()).collect();
    let mut out: Vec<String> = Vec::new();
    for entry in cvd.split(',').map(str::trim) {
        let found = if !entry.is_empty() && entry.bytes().all(|b| b.is_ascii_digit()) {
            entry.parse::<usize>().ok().and_then(|i| parent.get(i))
        } else if entry.len() > 4 && entry[..4].eq_ignore_ascii_case("GPU-") {
            let prefix = format!("GPU-{}", entry[4..].to_ascii_lowercase());
            let mut hits = parent.iter().filter(|p| p.to_ascii_lowercase().replacen("gpu-", "GPU-", 1).starts_with(&prefix));
            match (hits.next(), hits.next()) {
                (Some(p), None) => Some(p),
                _ => None,
            }
        } else {
            None
        };
        match found {
            Some(p) if !out.iter().any(|o| o == p) => out.push(p.to_string()),
            _ => break,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inv() -> Vec<Physical> {
        (0..3)
            .map(|p| Physical { uuid: format!("gpu-{}{}aa-{p}", p + 1, p), pci: format!("0000:{}0:00.0", p + 1), total: 1 << 34 })
            .map(|mut d| {
                d.uuid = d.uuid.replacen("gpu-", "GPU-", 1);
                d
            })
            .collect()
    }

    fn sel(list: &[&str]) -> Vec<Selector> {
        list.iter()
            .map(|s| match s {
                s if s.starts_with("GPU-") => Selector::Uuid(s.to_string()),
                s if s.contains(':') => Selector::PciBusId(s.to_string()),
                s => Selector::Ordinal(s.parse().unwrap()),
            })
            .collect()
    }

    #[test]
    fn driver_view_follows_cuda_visible_devices() {
        let inv = inv();
        assert_eq!(driver_view(None, &inv).devices, vec![0, 1, 2]);
        assert_eq!(driver_view(Some("2,0"), &inv).devices, vec![2, 0]);
        assert_eq!(driver_view(Some("GPU-2"), &inv).devices, vec![1]);
        assert_eq!(driver_view(Some("1,7,0"), &inv).devices, vec![1]);
        assert_eq!(driver_view(Some("1,1,0"), &inv).devices, vec![1]);
        assert_eq!(driver_view(Some(""), &inv).devices, Vec::<usize>::new());
        assert_eq!(driver_view(Some("x,0"), &inv).devices, Vec::<usize>::new());
    }

    #[test]
    fn selectors_resolve_in_order() {
        let inv = inv();
        assert_eq!(select(&sel(&["2", "0"]), None, &inv).unwrap().devices, vec![2, 0]);
        assert_eq!(select(&sel(&["GPU-3", "0"]), None, &inv).unwrap().devices, vec![2, 0]);
        assert_eq!(select(&sel(&["0000:20:00.0"]), None, &inv).unwrap().devices, vec![1]);
        assert_eq!(select(&[], None, &inv).unwrap().devices, Vec::<usize>::new());
        let v = select(&sel(&["2", "0"]), None, &inv).unwrap();
        assert_eq!(v.uuids(&inv).join(","), "GPU-32aa-2,GPU-10aa-0");
    }

    #[test]
    fn selectors_compose_with_cuda_visible_devices() {
        let inv = inv();
        assert_eq!(select(&sel(&["1"]), Some("2,1"), &inv).unwrap().devices, vec![1]);
        assert_eq!(select(&sel(&["1", "0"]), Some("1,2"), &inv).unwrap().devices, vec![2, 1]);
        assert_eq!(select(&sel(&["GPU-1"]), Some("1,2"), &inv).unwrap_err(), "GPU-10aa-0 is hidden by CUDA_VISIBLE_DEVICES=1,2");
        assert_eq!(
            select(&sel(&["2"]), Some("1,2"), &inv).unwrap_err(),
            "there is no device 2: 2 devices are visible (CUDA_VISIBLE_DEVICES=1,2)"
        );
    }

    #[test]
    fn without_inventory() {
        assert_eq!(select_without_inventory(&sel(&["2", "0"]), None).unwrap(), vec!["2", "0"]);
        assert_eq!(select_without_inventory(&sel(&["1"]), Some("2,1")).unwrap(), vec!["1"]);
        assert_eq!(select_without_inventory(&sel(&["GPU-3"]), None).unwrap(), vec!["GPU-3"]);
        assert!(select_without_inventory(&sel(&["GPU-3"]), Some("0")).is_err());
        assert!(select_without_inventory(&sel(&["0000:10:00.0"]), None).is_err());
        assert_eq!(select_without_inventory(&sel(&["3"]), Some("2,1")).unwrap_err(), "there is no device 3: 2 visible (CUDA_VISIBLE_DEVICES=2,1)");
        assert_eq!(select_without_inventory(&sel(&["0", "0"]), None).unwrap_err(), "0 is selected twice");
    }

    #[test]
    fn children_narrow_the_parents_view() {
        let parent = "GPU-32aa-2,GPU-10aa-0";
        assert_eq!(narrow(parent, "1"), vec!["GPU-10aa-0"]);
        assert_eq!(narrow(parent, "1,0"), vec!["GPU-10aa-0", "GPU-32aa-2"]);
        assert_eq!(narrow(parent, "GPU-3"), vec!["GPU-32aa-2"]);
        assert_eq!(narrow(parent, "GPU-2"), Vec::<String>::new());
        assert_eq!(narrow(parent, "2"), Vec::<String>::new());
        assert_eq!(narrow(parent, ""), Vec::<String>::new());
    }

    #[test]
    fn bad_selectors() {
        let inv = inv();
        assert_eq!(select(&sel(&["5"]), None, &inv).unwrap_err(), "there is no device 5: 3 devices are visible");
        assert_eq!(select(&sel(&["GPU-ff"]), None, &inv).unwrap_err(), "no device has a UUID starting with GPU-ff");
        assert_eq!(select(&sel(&["GPU-"]), None, &inv).unwrap_err(), "GPU- matches several devices: give more of the UUID");
        assert_eq!(select(&sel(&["0000:99:00.0"]), None, &inv).unwrap_err(), "no device has PCI bus id 0000:99:00.0");
        assert_eq!(select(&sel(&["0", "GPU-1"]), None, &inv).unwrap_err(), "GPU-10aa-0 is selected twice");
    }
}
