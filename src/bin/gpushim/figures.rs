//! What `gpushim ps`, `top` and `metrics` show: the processes under the shim (their published
//! files, `live`), the shared quotas, and the physical GPUs (NVML, through `gpushim __probe`
//! with the shim disabled). Every string read is made printable here ([`printable`]): the
//! files are written by the processes they describe, and root's terminal shows them.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;

use crate::live::{self, Process};
use crate::quota::{self, Quota};

/// A shared quota's figures on one device.
#[derive(Debug, Clone)]
pub struct QuotaDevice {
    pub quota: String,
    pub uid: u32,
    pub uuid: String,
    pub held: u64,
    pub peak: u64,
    /// The budget: the largest limit of a live member (0: no live member has one).
    pub limit: u64,
    pub size: u64,
}

/// A physical GPU as NVML shows it.
#[derive(Debug, Clone)]
pub struct Gpu {
    pub index: usize,
    pub name: String,
    pub uuid: String,
    pub total: u64,
    pub used: u64,
}

#[derive(Debug, Clone, Default)]
pub struct Figures {
    pub dirs: Vec<PathBuf>,
    pub processes: Vec<Process>,
    pub quotas: Vec<QuotaDevice>,
    pub gpus: Vec<Gpu>,
    /// Why NVML could not be read (no GPU listing then).
    pub nvml_error: Option<String>,
}

/// Reads everything; `with_gpus`: also ask NVML (a child process).
pub fn collect(with_gpus: bool) -> Result<Figures, String> {
    let settings = crate::config::load().map_err(|e| e.to_string())?;
    let dirs = live::dirs(settings.state_dir.as_deref());
    let mut f = Figures { dirs: dirs.clone(), ..Figures::default() };
    for (k, dir) in dirs.iter().enumerate() {
        match live::read_dir(dir) {
            Ok(p) => f.processes.extend(p),
            // the user's own directory may not exist yet; others' are skipped quietly
            Err(_) if k > 0 || !dir.exists() => {}
            Err(e) => return Err(e),
        }
        // SAFETY: getuid cannot fail.
        let uid = owner_of(dir).unwrap_or(unsafe { libc::getuid() });
        for name in quota::names_in(dir) {
            let Ok(q) = Quota::open(dir, &name, false) else { continue };
            let (devices, members) = q.snapshot();
            for (d, dev) in devices.iter().enumerate() {
                let limit = members.iter().filter(|m| m.alive).filter_map(|m| m.devices.iter().find(|x| x.0 == d)).map(|x| x.1).max().unwrap_or(0);
                f.quotas.push(QuotaDevice { quota: name.clone(), uid, uuid: dev.uuid.clone(), held: dev.reserved, peak: dev.peak, limit, size: dev.size });
            }
        }
    }
    if with_gpus {
        match gpus() {
            Ok(g) => f.gpus = g,
            Err(e) => f.nvml_error = Some(e),
        }
    }
    make_printable(&mut f);
    Ok(f)
}

/// Every string of `f` made [`printable`].
fn make_printable(f: &mut Figures) {
    let fix = |s: &mut String| *s = printable(s);
    for p in &mut f.processes {
        fix(&mut p.comm);
        if let Some(q) = &mut p.quota {
            fix(q);
        }
        for d in &mut p.devices {
            fix(&mut d.uuid);
            if let Some((_, _, u)) = &mut d.part {
                fix(u);
            }
        }
    }
    for q in &mut f.quotas {
        fix(&mut q.quota);
        fix(&mut q.uuid);
    }
    for g in &mut f.gpus {
        fix(&mut g.name);
        fix(&mut g.uuid);
    }
    if let Some(e) = &mut f.nvml_error {
        fix(e);
    }
}

/// `s` as it may be shown on a terminal: every control character (C0 controls, DEL and C1
/// controls U+0080–U+009F: escape sequences, bells, new lines, carriage returns, backspaces)
/// replaced by `?`, as procps' `ps` does. (Bytes that are not UTF-8 were read as U+FFFD.)
pub fn printable(s: &str) -> String {
    s.chars().map(|c| if c.is_control() || reorders_text(c) { '?' } else { c }).collect()
}

/// Characters that are no controls but change how a terminal lays the line out: the
/// bidirectional marks, embeddings, overrides and isolates, zero-width ones, the line and
/// paragraph separators (a name could make a row read as another).
fn reorders_text(c: char) -> bool {
    matches!(c, '\u{200B}'..='\u{200F}' | '\u{2028}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{FEFF}' | '\u{061C}')
}

fn owner_of(dir: &std::path::Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(dir).ok().map(|m| m.uid())
}

/// The physical GPUs, from NVML with the shim disabled.
fn gpus() -> Result<Vec<Gpu>, String> {
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os().collect();
    env.retain(|(k, _)| k != "GPUSHIM_DISABLE");
    env.push(("GPUSHIM_DISABLE".into(), "1".into()));
    let p = crate::check::probe(&env, &["nvml"])?;
    let v: &BTreeMap<String, String> = &p.values;
    if let Some(e) = v.get("nvml.error") {
        return Err(e.clone());
    }
    let n: usize = v.get("nvml.count").and_then(|c| c.parse().ok()).unwrap_or(0);
    Ok((0..n)
        .filter_map(|i| {
            let get = |k: &str| v.get(&format!("nvml.{i}.{k}")).cloned();
            Some(Gpu {
                index: i,
                name: get("name").unwrap_or_default(),
                uuid: get("uuid")?,
                total: get("total").and_then(|t| t.parse().ok()).unwrap_or(0),
                used: get("used").and_then(|t| t.parse().ok()).unwrap_or(0),
            })
        })
        .collect())
}

/// The name of user `uid` (its number when it has none).
pub fn user_name(uid: u32) -> String {
    // SAFETY: getpwuid_r writes into `pw` and `buf` (sized), `result` points at `pw` or is null.
    unsafe {
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut buf = vec![0 as libc::c_char; 4096];
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        if libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut result) == 0 && !result.is_null() && !pw.pw_name.is_null() {
            return printable(&std::ffi::CStr::from_ptr(pw.pw_name).to_string_lossy());
        }
    }
    uid.to_string()
}

/// Bytes for people: `1.50 GiB`, `512 MiB`, `0 B`.
pub fn human(b: u64) -> String {
    const UNITS: [(u64, &str); 4] = [(1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (size, unit) in UNITS {
        if b >= size {
            let v = b as f64 / size as f64;
            return if b.is_multiple_of(size) { format!("{} {unit}", b / size) } else { format!("{v:.2} {unit}") };
        }
    }
    format!("{b} B")
}

/// A share (0..1) as people read it, in percent with at most two decimals: `30%`, `12.5%`,
/// `0.05%`.
pub fn percent(share: f64) -> String {
    let p = format!("{:.2}", share * 100.0);
    let p = p.trim_end_matches('0').trim_end_matches('.');
    format!("{p}%")
}

/// Seconds since the epoch, with fractions.
pub fn now_secs() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// The compute share a process achieved on a device since it started publishing: the GPU time
/// its work took there (`busy_ns`) over the wall time since `started` (whole seconds since the
/// epoch, as published); `None` before a second has passed.
pub fn achieved_since_start(started: u64, busy_ns: u64, now: f64) -> Option<f64> {
    let wall = now - started as f64;
    (wall >= 1.0).then(|| busy_ns as f64 / 1e9 / wall)
}

/// How a device's compute share reads in `ps`: `compute limit 30% (duty), 30% achieved`;
/// `compute limit -` without a limit and without measured work.
pub fn compute_text(mode: &str, d: &live::DeviceFigures, started: u64, now: f64) -> String {
    let limit = d.compute_limit.map_or("-".to_string(), |l| format!("{} ({mode})", percent(l)));
    if d.compute_limit.is_none() && d.busy_ns == 0 {
        return format!("compute limit {limit}");
    }
    let achieved = achieved_since_start(started, d.busy_ns, now).map_or("-".to_string(), |a| format!("{:.0}%", a * 100.0));
    format!("compute limit {limit}, {achieved} achieved, {:.1} s throttled", d.throttled_ns as f64 / 1e9)
}
