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
//!
//! The program itself starts with a `CUDA_VISIBLE_DEVICES` that indexes the list NVML shows it
//! (`0,…,m-1`, also the parts of split devices), for programs that count devices through NVML
//! (PyTorch); what the driver must read is kept in markers and put back at first CUDA or NVML use
//! ([`load_time_changes`], [`first_use_changes`]).

use gpushim_common::config::Selector;

/// Set to the value the shim gave `CUDA_VISIBLE_DEVICES`.
pub const APPLIED_MARKER: &str = gpushim_common::config::ENV_VIEW_APPLIED;
pub const CUDA_VISIBLE_DEVICES: &str = "CUDA_VISIBLE_DEVICES";

pub use crate::driver::Physical;

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
        Some(c) => format!("{uuid} is hidden by CUDA_VISIBLE_DEVICES={}", c.escape_debug()),
        None => format!("{uuid} is not visible to this process"),
    };
    let mut devices = Vec::with_capacity(selectors.len());
    for sel in selectors {
        let p = match sel {
            Selector::Ordinal(i) => *visible.devices.get(*i as usize).ok_or_else(|| {
                let n = visible.devices.len();
                let devs = if n == 1 { "device is" } else { "devices are" };
                match cvd {
                    Some(c) => format!("there is no device {i}: {n} {devs} visible (CUDA_VISIBLE_DEVICES={})", c.escape_debug()),
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
                format!("there is no device {i}: {} visible (CUDA_VISIBLE_DEVICES={})", base.len(), cvd.unwrap_or("").escape_debug())
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
pub const PENDING_MARKER: &str = gpushim_common::config::ENV_VIEW_PENDING;
/// Set at load time: the `CUDA_VISIBLE_DEVICES` the process started with (absent: unset).
pub const ORIGINAL_CVD: &str = gpushim_common::config::ENV_ORIGINAL_CUDA_VISIBLE_DEVICES;

/// `0,1,…,n-1`: the `CUDA_VISIBLE_DEVICES` that indexes a narrowed list of `n` devices.
fn indices(n: usize) -> String {
    (0..n).map(|i| i.to_string()).collect::<Vec<_>>().join(",")
}

/// How many entries a comma-separated list has.
fn count(list: &str) -> usize {
    list.split(',').filter(|e| !e.is_empty()).count()
}

/// How many devices splitting adds (`GPUSHIM_VIRTUAL_DEVICES` in the environment: a GPU split
/// in `k` parts adds `k - 1`); `None`: nothing is split (unset, bad, or the shim disabled).
fn split_extras(env: &impl Fn(&str) -> Option<String>) -> Option<usize> {
    use gpushim_common::config::{parse_disable, parse_virtual_devices, ENV_DISABLE, ENV_VIRTUAL_DEVICES};
    if env(ENV_DISABLE).as_deref().is_some_and(parse_disable) {
        return None;
    }
    let splits = parse_virtual_devices(&env(ENV_VIRTUAL_DEVICES)?).ok()?;
    Some(splits.iter().fold(0usize, |a, s| a.saturating_add(s.sizes.len().saturating_sub(1))))
}

/// The `CUDA_VISIBLE_DEVICES` a program reads for a view of `n` devices before splitting:
/// `0,…,m-1`, one entry per device NVML shows it, `m` being `n` plus what splitting adds
/// (nothing in an empty view; at most the shim's number of devices).
fn written(n: usize, extras: Option<usize>) -> String {
    let m = if n == 0 { 0 } else { n.saturating_add(extras.unwrap_or(0)) };
    indices(m.min(crate::devices::MAX_DEVICES))
}

/// Whether `cvd` is what a rewrite wrote for a view of `n` devices: `0,…,k-1` with `k` at least
/// `n` (`n` plus what splitting adds, in this process or its parent's). Within such a view
/// these entries select all of it, as narrowing would.
fn written_for(cvd: Option<&str>, n: usize) -> bool {
    cvd.is_some_and(|c| {
        let k = count(c);
        k >= n && c == indices(k)
    })
}

/// How many devices `CUDA_VISIBLE_DEVICES` shows at most, read without NVML: its entries up to
/// the first malformed or repeated one (where the driver ends the list; it also ends it at an
/// entry naming no device, which only NVML's inventory tells).
pub fn entry_count(cvd: &str) -> usize {
    let mut seen: Vec<&str> = Vec::new();
    for e in cvd.split(',').map(str::trim) {
        let mig = e.len() > 4 && e.as_bytes()[..4].eq_ignore_ascii_case(b"MIG-");
        let well_formed = (!e.is_empty() && e.bytes().all(|b| b.is_ascii_digit())) || uuid_rest(e).is_some() || mig;
        if !well_formed || seen.contains(&e) {
            break;
        }
        seen.push(e);
    }
    seen.len()
}

/// The variables of the load-time rewrite.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Vars {
    original: Option<String>,
    applied: Option<String>,
    pending: Option<String>,
    cvd: Option<String>,
}

impl Vars {
    fn read(env: &impl Fn(&str) -> Option<String>) -> Vars {
        Vars { original: env(ORIGINAL_CVD), applied: env(APPLIED_MARKER), pending: env(PENDING_MARKER), cvd: env(CUDA_VISIBLE_DEVICES) }
    }

    fn named(self) -> [(&'static str, Option<String>); 4] {
        [(ORIGINAL_CVD, self.original), (APPLIED_MARKER, self.applied), (PENDING_MARKER, self.pending), (CUDA_VISIBLE_DEVICES, self.cvd)]
    }

    /// What to set or remove to go from `self` to `to`.
    fn changes_to(self, to: Vars) -> Vec<(&'static str, Option<String>)> {
        self.named().into_iter().zip(to.named()).filter(|(a, b)| a.1 != b.1).map(|(_, b)| b).collect()
    }
}

/// What the load-time rewrite changes in the environment: `(name, Some(value))` to set,
/// `(name, None)` to remove. `env` reads a variable. String work only (no driver, NVML or
/// file): it runs in every process the library is loaded into.
///
/// Programs that count devices through NVML themselves (PyTorch's `_device_count_nvml`) apply
/// the `CUDA_VISIBLE_DEVICES` they read at start to NVML's list, which the shim narrows to the
/// view and splits. So `CUDA_VISIBLE_DEVICES` is rewritten before the program starts to the
/// entries that index NVML's list, `0,…,m-1` (one per selector, plus the parts splitting adds):
///
/// - when `GPUSHIM_VISIBLE_DEVICES` asks for a view: the original is kept in [`ORIGINAL_CVD`]
///   for the resolution at first CUDA or NVML use ([`pending`]), and [`PENDING_MARKER`] holds
///   the view as indices into the list the selectors give. A child given its own
///   `CUDA_VISIBLE_DEVICES` narrows its parent's view (pending or applied) here, so that it,
///   too, starts with entries that match its NVML list;
/// - when `GPUSHIM_VIRTUAL_DEVICES` alone splits the scheduler's view: the scheduler's value is
///   kept in [`ORIGINAL_CVD`] (no [`PENDING_MARKER`]); and under a split, a view a parent
///   applied keeps its UUIDs in [`APPLIED_MARKER`]. [`first_use_changes`] puts back what the
///   driver must read.
pub fn load_time_changes(env: impl Fn(&str) -> Option<String>) -> Vec<(&'static str, Option<String>)> {
    use gpushim_common::config::{parse_disable, parse_visible_devices, ENV_DISABLE, ENV_VISIBLE_DEVICES};
    let now = Vars::read(&env);
    let selected = match env(ENV_VISIBLE_DEVICES) {
        Some(s) if !env(ENV_DISABLE).as_deref().is_some_and(parse_disable) => parse_visible_devices(&s).ok().map(|s| s.len()),
        _ => None,
    };
    let to = load_time_view(&now, selected, split_extras(&env));
    now.changes_to(to)
}

/// The scheduler's `CUDA_VISIBLE_DEVICES`: a split-only rewrite inherited from a parent undone.
fn scheduler_value(now: &Vars) -> Option<String> {
    match &now.original {
        Some(o) if now.pending.is_none() && now.applied.is_none() && written_for(now.cvd.as_deref(), entry_count(o)) => {
            Some(o.clone())
        }
        _ => now.cvd.clone(),
    }
}

/// With a split and no view asked for: the scheduler's value `s` rewritten to index NVML's
/// list, kept in [`ORIGINAL_CVD`]; else `s` as it is.
fn split_only(s: Option<String>, split: Option<usize>) -> Vars {
    match (s, split) {
        (Some(s), Some(_)) if written(entry_count(&s), split) != s => {
            Vars { cvd: Some(written(entry_count(&s), split)), original: Some(s), ..Vars::default() }
        }
        (s, _) => Vars { cvd: s, ..Vars::default() },
    }
}

/// The variables [`load_time_changes`] leaves, for `selected` selectors (`None`: no view asked
/// for, or a bad setting, reported at first use) and `split` ([`split_extras`]).
fn load_time_view(now: &Vars, selected: Option<usize>, split: Option<usize>) -> Vars {
    let c = now.cvd.as_deref();
    // A view a parent applied (its UUIDs) as this process starts with it: a split rewrites it
    // to index NVML's list (the UUIDs stay in the marker, put back at first use).
    let applied_view = |a: String| Vars {
        cvd: Some(if split.is_some() { written(count(&a), split) } else { a.clone() }),
        applied: Some(a),
        ..Vars::default()
    };
    let Some(n) = selected else {
        // No view asked for: undo a pending rewrite inherited from a parent (the original
        // back), keep a view a parent applied; a split alone rewrites the scheduler's value.
        if now.pending.is_some() {
            return split_only(now.original.clone(), split);
        }
        return match (&now.applied, c) {
            (Some(a), Some(c)) if c == a || written_for(Some(c), count(a)) => applied_view(a.clone()),
            (Some(_), Some(_)) if split.is_none() => now.clone(),
            _ => split_only(scheduler_value(now), split),
        };
    };
    match (&now.pending, &now.applied, c) {
        // A parent's rewrite, still pending: unchanged, or the child's entries index it.
        (Some(pick), _, Some(c)) => {
            let pick = if written_for(Some(c), count(pick)) { pick.clone() } else { narrow(pick, c).join(",") };
            Vars { cvd: Some(written(count(&pick), split)), pending: Some(pick), ..now.clone() }
        }
        // A parent applied the view (UUIDs): unchanged, or narrowed.
        (None, Some(a), Some(c)) => {
            let entries = if c == a || written_for(Some(c), count(a)) { a.clone() } else { narrow(a, c).join(",") };
            applied_view(entries)
        }
        // Afresh: the selectors index the devices the scheduler's value shows (all devices
        // when a child's environment dropped CUDA_VISIBLE_DEVICES).
        _ => Vars { original: scheduler_value(now), applied: None, pending: Some(indices(n)), cvd: Some(written(n, split)) },
    }
}

/// What to change at first CUDA or NVML use, before the view is resolved, so that the driver
/// reads what it must: a split's rewrite of a view a parent applied, or of the scheduler's
/// value, put back; with the shim disabled (`disabled`: by the config file, which the
/// load-time rewrite does not read) a pending rewrite undone. A `CUDA_VISIBLE_DEVICES` the
/// program set itself since is kept.
pub fn first_use_changes(env: impl Fn(&str) -> Option<String>, disabled: bool) -> Vec<(&'static str, Option<String>)> {
    let now = Vars::read(&env);
    let c = now.cvd.as_deref();
    match (&now.pending, &now.applied, &now.original) {
        (Some(_), _, _) if disabled => undo_pending(now.original.clone()),
        (Some(_), _, _) => Vec::new(),
        (None, Some(a), _) if c != Some(a.as_str()) && written_for(c, count(a)) => vec![(CUDA_VISIBLE_DEVICES, Some(a.clone()))],
        (None, None, Some(_)) => vec![(CUDA_VISIBLE_DEVICES, scheduler_value(&now)), (ORIGINAL_CVD, None)],
        _ => Vec::new(),
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
    match env(CUDA_VISIBLE_DEVICES) {
        Some(c) if written_for(Some(&c), count(&pick)) => Some((env(ORIGINAL_CVD), Some(pick))),
        other => Some((other, None)),
    }
}

/// Applies [`load_time_changes`] to the process environment. In a secure-execution process
/// (`secure`) no setting comes from the environment, so there is nothing to rewrite, and what
/// the caller could re-aim the view with is removed ([`gpushim_common::secure::scrub_environment`]).
fn rewrite_environment() {
    if gpushim_common::secure::secure_execution() {
        gpushim_common::secure::scrub_environment();
        return;
    }
    let changes = load_time_changes(env_lossy);
    apply_changes(&changes);
}

/// A variable as text; bytes that are not UTF-8 become U+FFFD, so that an entry holding them is
/// malformed (the driver ends `CUDA_VISIBLE_DEVICES` there) rather than the variable unset.
pub fn env_lossy(name: &str) -> Option<String> {
    gpushim_common::unforked::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

/// Sets or removes each variable.
pub fn apply_changes(changes: &[(&'static str, Option<String>)]) {
    for (name, value) in changes {
        match value {
            Some(v) => gpushim_common::unforked::set_var(name, v),
            None => gpushim_common::unforked::remove_var(name),
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

    fn unset(name: &'static str) -> (&'static str, Option<String>) {
        (name, None)
    }

    #[test]
    fn load_time_rewrite() {
        let gvd = gpushim_common::config::ENV_VISIBLE_DEVICES;
        // Nothing asked for: nothing changed.
        assert_eq!(changes(&[]), vec![]);
        assert_eq!(changes(&[("CUDA_VISIBLE_DEVICES", "1,2")]), vec![]);
        assert_eq!(changes(&[(gvd, "1"), ("GPUSHIM_DISABLE", "1"), ("CUDA_VISIBLE_DEVICES", "1,2")]), vec![]);
        // A bad setting: left for the error at first use.
        assert_eq!(changes(&[(gvd, "1,,2")]), vec![]);
        // Afresh: one entry per selector, the original kept (or its absence).
        let fresh = |orig: Option<&str>, written: &str| {
            let mut v = orig.map(|o| vec![set(ORIGINAL_CVD, o)]).unwrap_or_default();
            v.extend([set(PENDING_MARKER, written), set(CUDA_VISIBLE_DEVICES, written)]);
            v
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
        assert_eq!(changes(&pending), vec![unset(ORIGINAL_CVD), set(CUDA_VISIBLE_DEVICES, "0,1,2")]);
        // A child of a parent that applied the view (UUIDs): unchanged, or narrowed.
        let applied = [(gvd, "1,0"), (APPLIED_MARKER, "GPU-b,GPU-a")];
        assert_eq!(changes(&[applied[0], applied[1], ("CUDA_VISIBLE_DEVICES", "GPU-b,GPU-a")]), vec![]);
        assert_eq!(
            changes(&[applied[0], applied[1], ("CUDA_VISIBLE_DEVICES", "1")]),
            vec![set(APPLIED_MARKER, "GPU-a"), set(CUDA_VISIBLE_DEVICES, "GPU-a")]
        );
        // The shim's setting removed under a pending parent: the original put back.
        assert_eq!(
            changes(&[(PENDING_MARKER, "0"), (ORIGINAL_CVD, "1,2"), ("CUDA_VISIBLE_DEVICES", "0")]),
            vec![unset(ORIGINAL_CVD), unset(PENDING_MARKER), set(CUDA_VISIBLE_DEVICES, "1,2")]
        );
    }

    #[test]
    fn load_time_rewrite_of_a_split_view() {
        let (gvd, virt) = (gpushim_common::config::ENV_VISIBLE_DEVICES, gpushim_common::config::ENV_VIRTUAL_DEVICES);
        // One device selected, split in two: two entries, as NVML shows two devices.
        assert_eq!(
            changes(&[(gvd, "0"), (virt, "0:2x4GiB")]),
            vec![set(PENDING_MARKER, "0"), set(CUDA_VISIBLE_DEVICES, "0,1")]
        );
        assert_eq!(
            changes(&[(gvd, "1,0"), (virt, "0:2x4GiB;GPU-3:3x1GiB"), ("CUDA_VISIBLE_DEVICES", "GPU-3,2")]),
            vec![set(ORIGINAL_CVD, "GPU-3,2"), set(PENDING_MARKER, "0,1"), set(CUDA_VISIBLE_DEVICES, "0,1,2,3,4")]
        );
        // Nothing to split in an empty view; disabled: nothing split.
        assert_eq!(changes(&[(gvd, "none"), (virt, "0:2x4GiB")]), vec![set(PENDING_MARKER, ""), set(CUDA_VISIBLE_DEVICES, "")]);
        assert_eq!(changes(&[(virt, "0:2x4GiB"), ("CUDA_VISIBLE_DEVICES", "1"), ("GPUSHIM_DISABLE", "yes")]), vec![]);
        // A split alone: the scheduler's value rewritten and kept (upper bound of its devices:
        // its well-formed entries); unset, or already of that form: left alone.
        assert_eq!(
            changes(&[(virt, "0:2x4GiB"), ("CUDA_VISIBLE_DEVICES", "2,0,x,1")]),
            vec![set(ORIGINAL_CVD, "2,0,x,1"), set(CUDA_VISIBLE_DEVICES, "0,1,2")]
        );
        assert_eq!(changes(&[(virt, "0:2x4GiB"), ("CUDA_VISIBLE_DEVICES", "-1")]), vec![set(ORIGINAL_CVD, "-1"), set(CUDA_VISIBLE_DEVICES, "")]);
        assert_eq!(changes(&[(virt, "0:2x4GiB")]), vec![]);
        assert_eq!(changes(&[(virt, "0:4GiB"), ("CUDA_VISIBLE_DEVICES", "0,1")]), vec![]);
        assert_eq!(changes(&[(virt, "0:2x4GiB"), ("CUDA_VISIBLE_DEVICES", "")]), vec![]);
        // Its child: unchanged; given its own value, that one rewritten; without the split,
        // the original back.
        let parent = [(virt, "0:2x4GiB"), (ORIGINAL_CVD, "2,0"), ("CUDA_VISIBLE_DEVICES", "0,1,2")];
        assert_eq!(changes(&parent), vec![]);
        assert_eq!(
            changes(&[parent[0], parent[1], ("CUDA_VISIBLE_DEVICES", "1")]),
            vec![set(ORIGINAL_CVD, "1"), set(CUDA_VISIBLE_DEVICES, "0,1")]
        );
        assert_eq!(changes(&parent[1..]), vec![unset(ORIGINAL_CVD), set(CUDA_VISIBLE_DEVICES, "2,0")]);
        // A child of a pending split view: unchanged (its parent's entries), or narrowed.
        let pending = [(gvd, "2,0"), (virt, "0:2x4GiB"), (PENDING_MARKER, "0,1"), (ORIGINAL_CVD, "1,2,3")];
        assert_eq!(changes(&[pending[0], pending[1], pending[2], pending[3], ("CUDA_VISIBLE_DEVICES", "0,1,2")]), vec![]);
        assert_eq!(
            changes(&[pending[0], pending[1], pending[2], pending[3], ("CUDA_VISIBLE_DEVICES", "1")]),
            vec![set(PENDING_MARKER, "1"), set(CUDA_VISIBLE_DEVICES, "0,1")]
        );
        // Without the split, the child's entries index the view unsplit.
        assert_eq!(
            changes(&[pending[0], pending[2], pending[3], ("CUDA_VISIBLE_DEVICES", "0,1,2")]),
            vec![set(CUDA_VISIBLE_DEVICES, "0,1")]
        );
        // A child of a parent that applied a split view (C environment: its UUIDs): rewritten
        // to index NVML's list, the UUIDs kept in the marker; a grandchild: unchanged.
        let applied = [(gvd, "1,0"), (virt, "0:2x4GiB"), (APPLIED_MARKER, "GPU-b,GPU-a")];
        assert_eq!(
            changes(&[applied[0], applied[1], applied[2], ("CUDA_VISIBLE_DEVICES", "GPU-b,GPU-a")]),
            vec![set(CUDA_VISIBLE_DEVICES, "0,1,2")]
        );
        assert_eq!(changes(&[applied[0], applied[1], applied[2], ("CUDA_VISIBLE_DEVICES", "0,1,2")]), vec![]);
        assert_eq!(changes(&[applied[1], applied[2], ("CUDA_VISIBLE_DEVICES", "0,1,2")]), vec![]);
        assert_eq!(
            changes(&[applied[0], applied[1], applied[2], ("CUDA_VISIBLE_DEVICES", "GPU-a")]),
            vec![set(APPLIED_MARKER, "GPU-a"), set(CUDA_VISIBLE_DEVICES, "0,1")]
        );
    }

    #[test]
    fn first_use_puts_back_what_the_driver_reads() {
        let first = |vars: &[(&str, &str)], disabled: bool| {
            first_use_changes(|name| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string()), disabled)
        };
        // A split alone: the scheduler's value back, unless the program set its own.
        assert_eq!(
            first(&[(ORIGINAL_CVD, "2,0"), ("CUDA_VISIBLE_DEVICES", "0,1,2")], false),
            vec![set(CUDA_VISIBLE_DEVICES, "2,0"), unset(ORIGINAL_CVD)]
        );
        assert_eq!(
            first(&[(ORIGINAL_CVD, "2,0"), ("CUDA_VISIBLE_DEVICES", "1")], false),
            vec![set(CUDA_VISIBLE_DEVICES, "1"), unset(ORIGINAL_CVD)]
        );
        // A split view a parent applied: its UUIDs back.
        assert_eq!(
            first(&[(APPLIED_MARKER, "GPU-b,GPU-a"), ("CUDA_VISIBLE_DEVICES", "0,1,2")], false),
            vec![set(CUDA_VISIBLE_DEVICES, "GPU-b,GPU-a")]
        );
        assert_eq!(first(&[(APPLIED_MARKER, "GPU-b,GPU-a"), ("CUDA_VISIBLE_DEVICES", "GPU-b,GPU-a")], false), vec![]);
        // Pending: resolved by the view; disabled, undone.
        let pending = [(PENDING_MARKER, "0"), (ORIGINAL_CVD, "1,2"), ("CUDA_VISIBLE_DEVICES", "0")];
        assert_eq!(first(&pending, false), vec![]);
        assert_eq!(first(&pending, true), undo_pending(Some("1,2".into())));
        assert_eq!(first(&[("CUDA_VISIBLE_DEVICES", "1")], false), vec![]);
    }

    #[test]
    fn entries_counted_without_nvml() {
        assert_eq!(entry_count(""), 0);
        assert_eq!(entry_count("-1"), 0);
        assert_eq!(entry_count("2, 0,1"), 3);
        assert_eq!(entry_count("GPU-3031,gpu-10,MIG-1,5"), 4);
        assert_eq!(entry_count("1,x,2"), 1);
        assert_eq!(entry_count("1,1,2"), 1);
        assert_eq!(entry_count("GPU-"), 0);
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
        // Split: the entries written for the parts are unchanged too.
        assert_eq!(
            get(&[(PENDING_MARKER, "1"), (ORIGINAL_CVD, "2,3"), ("CUDA_VISIBLE_DEVICES", "0,1")]),
            Some((Some("2,3".into()), Some("1".into())))
        );
    }
}
