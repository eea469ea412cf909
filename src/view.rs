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
        } else if let Some(rest) = uuid_rest(entry) {
            let prefix = format!("GPU-{}", rest.to_ascii_lowercase());
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

/// What follows `GPU-` (any case) in a `CUDA_VISIBLE_DEVICES` entry, if anything does. Byte
/// by byte: an entry may hold any UTF-8 (the first four bytes, when they are `GPU-`, are ASCII,
/// so what follows starts on a character boundary).
fn uuid_rest(entry: &str) -> Option<&str> {
    let b = entry.as_bytes();
    (b.len() > 4 && b[..4].eq_ignore_ascii_case(b"GPU-")).then(|| &entry[4..])
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
        } else if let Some(rest) = uuid_rest(entry) {
            let prefix = format!("GPU-{}", rest.to_ascii_lowercase());
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

/// Set at load time: the view's devices still to be resolved, as indices into the list the
/// selectors give (see [`at_load`]).
pub const PENDING_MARKER: &str = crate::config::ENV_VIEW_PENDING;
/// Set at load time: the `CUDA_VISIBLE_DEVICES` the process started with (absent: unset).
pub const ORIGINAL_CVD: &str = crate::config::ENV_ORIGINAL_CUDA_VISIBLE_DEVICES;

/// `0,1,…,n-1`: the `CUDA_VISIBLE_DEVICES` that indexes a narrowed list of `n` devices.
fn indices(n: usize) -> String {
    (0..n).map(|i| i.to_string()).collect::<Vec<_>>().join(",")
}

/// What the load-time rewrite changes in the environment: `(name, Some(value))` to set,
/// `(name, None)` to remove. `env` reads a variable. String work only (no driver, NVML or
/// file): it runs in every process the library is loaded into.
///
/// Programs that count devices through NVML themselves (PyTorch's `_device_count_nvml`) apply
/// the `CUDA_VISIBLE_DEVICES` they read at start to NVML's list, which the shim narrows to the
/// view. So when `GPUSHIM_VISIBLE_DEVICES` asks for a view, `CUDA_VISIBLE_DEVICES` is rewritten
/// before the program starts to the entries that index the narrowed list (`0,…,n-1`, one per
/// selector), the original is kept in [`ORIGINAL_CVD`] for the resolution at first CUDA or NVML
/// use ([`resolve_pending`]), and [`PENDING_MARKER`] holds the view as indices into the list the
/// selectors give. A child given its own `CUDA_VISIBLE_DEVICES` narrows its parent's view
/// (pending or applied) here, so that it, too, starts with entries that match its NVML list.
pub fn load_time_changes(env: impl Fn(&str) -> Option<String>) -> Vec<(&'static str, Option<String>)> {
    use crate::config::{parse_disable, parse_visible_devices, ENV_DISABLE, ENV_VISIBLE_DEVICES};
    let cvd = env(CUDA_VISIBLE_DEVICES);
    let pending = env(PENDING_MARKER);
    let selectors = match env(ENV_VISIBLE_DEVICES) {
        Some(s) if !env(ENV_DISABLE).as_deref().is_some_and(parse_disable) => parse_visible_devices(&s).ok(),
        _ => None,
    };
    let Some(selectors) = selectors else {
        // No view asked for (or a bad setting, reported at first use): undo a rewrite inherited
        // from a parent, so the driver and the program read the original.
        return match pending {
            Some(_) => undo_pending(env(ORIGINAL_CVD)),
            None => Vec::new(),
        };
    };
    match (pending, env(APPLIED_MARKER), cvd) {
        // A parent's rewrite, still pending: the child's entries index it.
        (Some(pick), _, Some(c)) => {
            if c == indices(pick.split(',').filter(|e| !e.is_empty()).count()) {
                return Vec::new();
            }
            let pick = narrow(&pick, &c);
            vec![(PENDING_MARKER, Some(pick.join(","))), (CUDA_VISIBLE_DEVICES, Some(indices(pick.len())))]
        }
        // A parent applied the view (UUIDs): the program reads them, NVML shows them.
        (None, Some(applied), Some(c)) => {
            if applied == c {
                return Vec::new();
            }
            let entries = narrow(&applied, &c).join(",");
            vec![(CUDA_VISIBLE_DEVICES, Some(entries.clone())), (APPLIED_MARKER, Some(entries))]
        }
        // Afresh: the selectors index the devices the original CUDA_VISIBLE_DEVICES shows.
        (_, _, cvd) => {
            let written = indices(selectors.len());
            vec![
                (ORIGINAL_CVD, cvd),
                (APPLIED_MARKER, None),
                (PENDING_MARKER, Some(written.clone())),
                (CUDA_VISIBLE_DEVICES, Some(written)),
            ]
        }
    }
}

/// Puts back the `CUDA_VISIBLE_DEVICES` a load-time rewrite replaced (`original`: its value,
/// `None`: it was unset) and removes the rewrite's markers.
pub fn undo_pending(original: Option<String>) -> Vec<(&'static str, Option<String>)> {
    vec![(CUDA_VISIBLE_DEVICES, original), (PENDING_MARKER, None), (ORIGINAL_CVD, None)]
}

/// A pending load-time rewrite, for the resolution at first use: the `CUDA_VISIBLE_DEVICES` the
/// selectors compose with, and the view as indices into the list they give (`None`: all of it).
/// `None`: nothing pending. A `CUDA_VISIBLE_DEVICES` the program set (or removed) itself
/// before using CUDA replaces the original: the selectors compose with it, as in a program
/// started with it.
pub fn pending(env: impl Fn(&str) -> Option<String>) -> Option<(Option<String>, Option<String>)> {
    let pick = env(PENDING_MARKER)?;
    let written = indices(pick.split(',').filter(|e| !e.is_empty()).count());
    match env(CUDA_VISIBLE_DEVICES) {
        Some(c) if c == written => Some((env(ORIGINAL_CVD), Some(pick))),
        other => Some((other, None)),
    }
}

/// Applies [`load_time_changes`] to the process environment. In a secure-execution process
/// (`secure`) no setting comes from the environment, so there is nothing to rewrite, and the
/// markers a parent would pass are removed: the caller set them, not a parent under the shim.
fn rewrite_environment() {
    if crate::secure::secure_execution() {
        for marker in [PENDING_MARKER, ORIGINAL_CVD, APPLIED_MARKER] {
            if std::env::var_os(marker).is_some() {
                std::env::remove_var(marker);
            }
        }
        return;
    }
    let changes = load_time_changes(env_lossy);
    apply_changes(&changes);
}

/// A variable as text; bytes that are not UTF-8 become U+FFFD, so that an entry holding them is
/// malformed (the driver ends `CUDA_VISIBLE_DEVICES` there) rather than the variable unset.
pub fn env_lossy(name: &str) -> Option<String> {
    std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

/// Sets or removes each variable.
pub fn apply_changes(changes: &[(&'static str, Option<String>)]) {
    for (name, value) in changes {
        match value {
            Some(v) => std::env::set_var(name, v),
            None => std::env::remove_var(name),
        }
    }
}

/// The library's constructor: runs when the library is loaded (with `LD_PRELOAD`, before the
/// program's `main` and before an interpreter copies the environment).
extern "C" fn at_load() {
    let _ = std::panic::catch_unwind(rewrite_environment);
}

#[used]
#[link_section = ".init_array"]
static AT_LOAD: extern "C" fn() = at_load;

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

    fn changes(vars: &[(&str, &str)]) -> Vec<(&'static str, Option<String>)> {
        load_time_changes(|name| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string()))
    }

    fn set(name: &'static str, v: &str) -> (&'static str, Option<String>) {
        (name, Some(v.to_string()))
    }

    #[test]
    fn load_time_rewrite() {
        let gvd = crate::config::ENV_VISIBLE_DEVICES;
        // Nothing asked for: nothing changed.
        assert_eq!(changes(&[]), vec![]);
        assert_eq!(changes(&[("CUDA_VISIBLE_DEVICES", "1,2")]), vec![]);
        assert_eq!(changes(&[(gvd, "1"), ("GPUSHIM_DISABLE", "1"), ("CUDA_VISIBLE_DEVICES", "1,2")]), vec![]);
        // A bad setting: left for the error at first use.
        assert_eq!(changes(&[(gvd, "1,,2")]), vec![]);
        // Afresh: one entry per selector, the original kept (or its absence).
        let fresh = |orig: Option<&str>, written: &str| {
            vec![
                (ORIGINAL_CVD, orig.map(str::to_string)),
                (APPLIED_MARKER, None),
                set(PENDING_MARKER, written),
                set(CUDA_VISIBLE_DEVICES, written),
            ]
        };
        assert_eq!(changes(&[(gvd, "1"), ("CUDA_VISIBLE_DEVICES", "1,2")]), fresh(Some("1,2"), "0"));
        assert_eq!(changes(&[(gvd, "2, GPU-3")]), fresh(None, "0,1"));
        assert_eq!(changes(&[(gvd, "none"), ("CUDA_VISIBLE_DEVICES", "0")]), fresh(Some("0"), ""));
        // A child of a pending parent: unchanged, or its entries index the parent's view.
        let pending = [(gvd, "2,0,1"), (PENDING_MARKER, "0,1,2"), (ORIGINAL_CVD, "1,2,3")];
        assert_eq!(changes(&[pending[0], pending[1], pending[2], ("CUDA_VISIBLE_DEVICES", "0,1,2")]), vec![]);
        assert_eq!(
            changes(&[pending[0], pending[1], pending[2], ("CUDA_VISIBLE_DEVICES", "2,0")]),
            vec![set(PENDING_MARKER, "2,0"), set(CUDA_VISIBLE_DEVICES, "0,1")]
        );
        let grandchild = [(gvd, "2,0,1"), (PENDING_MARKER, "2,0"), (ORIGINAL_CVD, "1,2,3"), ("CUDA_VISIBLE_DEVICES", "1")];
        assert_eq!(changes(&grandchild), vec![set(PENDING_MARKER, "0"), set(CUDA_VISIBLE_DEVICES, "0")]);
        // CUDA_VISIBLE_DEVICES removed: afresh, against all devices.
        assert_eq!(changes(&pending), fresh(None, "0,1,2"));
        // A child of a parent that applied the view (UUIDs): unchanged, or narrowed.
        let applied = [(gvd, "1,0"), (APPLIED_MARKER, "GPU-b,GPU-a")];
        assert_eq!(changes(&[applied[0], applied[1], ("CUDA_VISIBLE_DEVICES", "GPU-b,GPU-a")]), vec![]);
        assert_eq!(
            changes(&[applied[0], applied[1], ("CUDA_VISIBLE_DEVICES", "1")]),
            vec![set(CUDA_VISIBLE_DEVICES, "GPU-a"), set(APPLIED_MARKER, "GPU-a")]
        );
        // The shim's setting removed under a pending parent: the original put back.
        assert_eq!(
            changes(&[(PENDING_MARKER, "0"), (ORIGINAL_CVD, "1,2"), ("CUDA_VISIBLE_DEVICES", "0")]),
            undo_pending(Some("1,2".into()))
        );
    }

    #[test]
    fn pending_view_at_first_use() {
        let get = |vars: &'static [(&'static str, &'static str)]| {
            pending(move |name| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string()))
        };
        assert_eq!(get(&[("CUDA_VISIBLE_DEVICES", "0")]), None);
        assert_eq!(
            get(&[(PENDING_MARKER, "1"), (ORIGINAL_CVD, "2,3"), ("CUDA_VISIBLE_DEVICES", "0")]),
            Some((Some("2,3".into()), Some("1".into())))
        );
        assert_eq!(get(&[(PENDING_MARKER, ""), ("CUDA_VISIBLE_DEVICES", "")]), Some((None, Some("".into()))));
        // Set by the program itself before using CUDA: the selectors compose with it.
        assert_eq!(
            get(&[(PENDING_MARKER, "0,1"), (ORIGINAL_CVD, "2,3"), ("CUDA_VISIBLE_DEVICES", "1,2")]),
            Some((Some("1,2".into()), None))
        );
        assert_eq!(get(&[(PENDING_MARKER, "0,1"), (ORIGINAL_CVD, "2,3")]), Some((None, None)));
    }
}
