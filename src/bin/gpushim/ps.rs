//! `gpushim ps [--quota NAME]`: the shared quotas of this user, their budgets per device and
//! the processes in them. Reads the quota files without joining or changing them.

use std::ffi::OsString;

use crate::quota::{self, Quota};
use crate::Failure;

pub fn main(args: &[OsString]) -> Result<(), Failure> {
    let mut only: Option<String> = None;
    let mut i = 0;
    while i < args.len() {
        let a = args[i].to_string_lossy();
        i += 1;
        match a.as_ref() {
            "--help" | "-h" => {
                print!("{}", crate::help::PS);
                return Ok(());
            }
            "--quota" => {
                let v = args.get(i).map(|v| v.to_string_lossy().into_owned());
                i += 1;
                only = Some(v.ok_or_else(|| Failure::usage("ps", "--quota needs a value, like --quota job42"))?);
            }
            other if other.starts_with("--quota=") => only = Some(other["--quota=".len()..].to_string()),
            other => return Err(Failure::usage("ps", format!("unexpected argument {other:?}; see gpushim ps --help"))),
        }
    }
    // the state directory is a setting like any other (GPUSHIM_STATE_DIR, or the file's key)
    let settings = crate::config::load().map_err(|e| Failure::plain(e.to_string()))?;
    let dir = quota::state_dir(settings.state_dir.as_deref());
    let names = match &only {
        Some(n) => vec![n.clone()],
        None => quota::names_in(&dir),
    };
    // the registry of processes with limits of their own (absent until one runs)
    let registry = if only.is_none() { Quota::open_registry(&dir, false).ok() } else { None };
    if names.is_empty() {
        println!("no shared quota in {}", dir.display());
    }
    if let Some(r) = &registry {
        print_registry(r);
    }
    let mut failed = false;
    for name in names {
        match Quota::open(&dir, &name, false) {
            Ok(q) => print_quota(&q),
            Err(e) => {
                eprintln!("gpushim ps: {e}");
                failed = true;
            }
        }
    }
    if failed {
        return Err(Failure::status(crate::EXIT_CHECK_FAILED));
    }
    Ok(())
}

fn print_quota(q: &Quota) {
    let (devices, members) = q.snapshot();
    let live = members.iter().filter(|m| m.alive).count();
    println!("shared quota {} ({}): {live} processes", q.name, q.path.display());
    for (d, dev) in devices.iter().enumerate() {
        let limit = members.iter().filter(|m| m.alive).filter_map(|m| m.devices.iter().find(|x| x.0 == d)).map(|x| x.1).max();
        println!(
            "  {}: {} held (peak {}), limit {}, device memory {}",
            dev.uuid,
            human(dev.reserved),
            human(dev.peak),
            limit.map_or("-".to_string(), human),
            human(dev.size)
        );
    }
    for m in &members {
        let usage: Vec<String> = m
            .devices
            .iter()
            .map(|&(d, limit, used)| {
                let uuid = devices.get(d).map_or("?", |x| x.uuid.as_str());
                format!("{uuid} {} of {}", human(used), human(limit))
            })
            .collect();
        let state = if m.alive { "" } else { " (exited: given back when another process next needs room)" };
        println!("  pid {} {}{state}: {}", m.pid, m.comm, if usage.is_empty() { "no device yet".into() } else { usage.join(", ") });
    }
}

/// The live processes with limits of their own (no quota), for the oversubscription picture.
fn print_registry(r: &Quota) {
    let (devices, members) = r.snapshot();
    let live: Vec<_> = members.iter().filter(|m| m.alive).collect();
    if live.is_empty() {
        return;
    }
    println!("processes with limits of their own ({}): {}", r.path.display(), live.len());
    for m in live {
        let limits: Vec<String> = m
            .devices
            .iter()
            .map(|&(d, limit, _)| format!("{} limit {}", devices.get(d).map_or("?", |x| x.uuid.as_str()), human(limit)))
            .collect();
        println!("  pid {} {}: {}", m.pid, m.comm, if limits.is_empty() { "no device yet".into() } else { limits.join(", ") });
    }
}

/// Bytes for people: `1.50 GiB`, `512 MiB`, `0 B`.
fn human(b: u64) -> String {
    const UNITS: [(u64, &str); 4] = [(1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (size, unit) in UNITS {
        if b >= size {
            let v = b as f64 / size as f64;
            return if b.is_multiple_of(size) { format!("{} {unit}", b / size) } else { format!("{v:.2} {unit}") };
        }
    }
    format!("{b} B")
}
