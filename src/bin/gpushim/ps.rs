//! `gpushim ps [--quota NAME | --hami FILE]`: the processes under the shim, the shared quotas of
//! this user, their budgets per device and the processes in them (or one line saying nothing
//! runs), or one HAMi-core shared region file. Reads the files without joining or changing them;
//! what they hold (names, UUIDs) is printed through `figures::printable`.

use crate::quota::{self, Quota};
use crate::Failure;

pub fn main(only: Option<&str>) -> Result<(), Failure> {
    let only = only.map(str::to_string);
    // the state directory is a setting like any other (GPUSHIM_STATE_DIR, or the file's key)
    let settings = crate::config::load().map_err(|e| Failure::plain(e.to_string()))?;
    let dir = quota::state_dir(settings.state_dir.as_deref());
    let f = match only {
        None => Some(crate::figures::collect(false).map_err(|e| Failure::setup("ps", e))?),
        Some(_) => None,
    };
    let names = match &only {
        Some(n) => vec![n.clone()],
        None => quota::names_in(&dir),
    };
    // the registry of processes with limits of their own (absent until one runs)
    let registry = if only.is_none() { Quota::open_registry(&dir, false).ok() } else { None };
    if let Some(f) = &f {
        let registered = registry.as_ref().is_some_and(|r| r.snapshot().1.iter().any(|m| m.alive));
        if f.processes.is_empty() && names.is_empty() && !registered {
            println!("nothing runs under gpushim: no process and no shared quota in {}", printable(&dir.display().to_string()));
            return Ok(());
        }
        print!("{}", processes_text(f));
    }
    if names.is_empty() {
        println!("no shared quota in {}", printable(&dir.display().to_string()));
    }
    if let Some(r) = &registry {
        print_registry(r);
    }
    let mut failed = false;
    for name in names {
        match Quota::open(&dir, &name, false) {
            Ok(q) => print_quota(&q),
            Err(e) => {
                eprintln!("gpushim ps: {}", printable(&e.to_string()));
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
    // (allocations waiting for room, GPUSHIM_OOM_WAIT: said only when there are some)
    let waiting = match q.waiting() {
        0 => String::new(),
        n => format!(", {n} allocations waiting for room"),
    };
    println!("shared quota {} ({}): {live} processes{waiting}", printable(&q.name), printable(&q.path.display().to_string()));
    for (d, dev) in devices.iter().enumerate() {
        let limit = members.iter().filter(|m| m.alive).filter_map(|m| m.devices.iter().find(|x| x.0 == d)).map(|x| x.1).max();
        println!(
            "  {}: {} held (peak {}), limit {}, device memory {}",
            printable(&dev.uuid),
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
                format!("{} {} of {}", printable(uuid), human(used), human(limit))
            })
            .collect();
        let state = if m.alive { "" } else { " (exited: given back when another process next needs room)" };
        println!("  pid {} {}{state}: {}", m.pid, printable(&m.comm), if usage.is_empty() { "no device yet".into() } else { usage.join(", ") });
    }
}

/// The live processes with limits of their own (no quota), for the oversubscription picture.
fn print_registry(r: &Quota) {
    let (devices, members) = r.snapshot();
    let live: Vec<_> = members.iter().filter(|m| m.alive).collect();
    if live.is_empty() {
        return;
    }
    println!("processes with limits of their own ({}): {}", printable(&r.path.display().to_string()), live.len());
    for m in live {
        let limits: Vec<String> = m
            .devices
            .iter()
            .map(|&(d, limit, _)| format!("{} limit {}", printable(devices.get(d).map_or("?", |x| x.uuid.as_str())), human(limit)))
            .collect();
        println!("  pid {} {}: {}", m.pid, printable(&m.comm), if limits.is_empty() { "no device yet".into() } else { limits.join(", ") });
    }
}

/// The processes under the shim, one line per device of each (`gpushim ps`, and `top` when
/// not on a terminal). A device's compute share: its limit and the mode in use, the share
/// achieved (the GPU time the process' work took on the device over the wall time since the
/// process started publishing, in whole percent) and the time its launches waited.
pub fn processes_text(f: &crate::figures::Figures) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    if f.processes.is_empty() {
        return out; // (like the registry's section: absent when empty)
    }
    let dirs: Vec<String> = f.dirs.iter().filter(|d| d.exists()).map(|d| printable(&d.display().to_string())).collect();
    let live = f.processes.iter().filter(|p| p.alive).count();
    let now = crate::figures::now_secs();
    let _ = writeln!(out, "processes under gpushim ({}): {live}", if dirs.is_empty() { "no state directory yet".into() } else { dirs.join(", ") });
    for p in &f.processes {
        let user = crate::figures::user_name(p.uid);
        let quota = p.quota.as_ref().map_or(String::new(), |q| format!(", shared quota {q}"));
        let state = if p.alive { String::new() } else { " (exited without leaving: shown until the next process of the user removes it)".into() };
        let _ = writeln!(out, "  pid {} {} ({user}{quota}): {} devices{state}", p.pid, p.comm, p.view_len);
        if !p.alive {
            continue;
        }
        for d in &p.devices {
            let part = d.part.as_ref().map_or(String::new(), |(i, n, u)| format!(" part {i}/{n} ({u})"));
            let limit = d.limit.map_or("not yet resolved".to_string(), human);
            let _ = writeln!(
                out,
                "    device {} {}{part}: {} in use (peak {}), {} reserved, limit {limit}, {} refused, {}",
                d.ordinal,
                d.uuid,
                human(d.in_use),
                human(d.peak_in_use),
                human(d.reserved),
                d.refused,
                crate::figures::compute_text(p.compute_mode, d, p.started, now)
            );
        }
    }
    out
}

use crate::figures::{human, printable};

/// `gpushim ps --hami FILE`: a HAMi-core shared region, read without changing it: its version,
/// the monitor's switches, each device's UUID, limit and SM limit, and each process slot (pid,
/// host pid, status, alive or dead, bytes used per device).
pub fn hami(file: &std::path::Path) -> Result<(), Failure> {
    let shown = printable(&file.display().to_string());
    let v = gpushim_common::hami::read(file).map_err(|e| Failure::setup("ps", format!("{shown}: {e}")))?;
    println!("HAMi-core shared region {shown}: version {}.{}, {} devices, {} process slots, utilization_switch {}, recent_kernel {}, priority {}",
        v.version.0, v.version.1, v.device_num, v.slots.len(), v.utilization_switch, v.recent_kernel, v.priority);
    let devices = (v.device_num as usize).min(v.limit.len());
    for d in 0..devices {
        println!("device {d} {} limit {} sm_limit {}", printable(if v.uuids[d].is_empty() { "-" } else { &v.uuids[d] }), v.limit[d], v.sm_limit[d]);
    }
    for s in &v.slots {
        let used: Vec<String> = s.used.iter().enumerate().filter(|(_, &u)| u != 0).map(|(d, u)| format!("{d}:{u}")).collect();
        println!("slot pid {} hostpid {} status {} {} used {}", s.pid, s.hostpid, s.status, if s.alive { "alive" } else { "dead" },
            if used.is_empty() { "-".to_string() } else { used.join(" ") });
    }
    Ok(())
}
