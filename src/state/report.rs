//! The exit report (`GPUSHIM_REPORT=stderr|PATH`): per device the program used, the peak in
//! use, the peak reserved, the allocations refused and the limit; JSON when PATH ends in
//! `.json`, one line per device otherwise. Written by an `atexit` handler registered when the
//! shim initialises, so a process that never touches CUDA writes nothing. With the placement
//! log on (`placement`), the report gains a placement summary per device (the `placement` field
//! in JSON); without a report target, that summary alone goes to the log (stderr by default).

use std::fmt::Write as _;
use gpushim_common::once::ForkOnce;

use gpushim_common::config::ReportTarget;
use crate::state;

/// Where the report goes; `None`: only the placement summary, to the log.
static TARGET: ForkOnce<Option<ReportTarget>> = ForkOnce::new();

/// Set in a forked child: the report is the parent's (`fork`).
static DISARMED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// The process that armed the report: a child made without `fork()` (raw `clone`, `_Fork`,
/// `vfork`) inherits the handler without the fork handler's `disarm`; its pid tells it apart.
static ARMED_BY: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// A forked child writes no report.
pub fn disarm() {
    DISARMED.store(true, std::sync::atomic::Ordering::Release);
}

/// Remembers where to write (a relative path is taken relative to the directory the process
/// is in now, not at exit) and registers the handler, once.
pub fn arm(target: Option<&ReportTarget>) {
    let target = target.map(|t| match t {
        ReportTarget::Path(p) if p.is_relative() => {
            ReportTarget::Path(std::env::current_dir().map(|d| d.join(p)).unwrap_or_else(|_| p.clone()))
        }
        other => other.clone(),
    });
    if TARGET.set(target).is_ok() {
        ARMED_BY.store(gpushim_common::sys::getpid() as u32, std::sync::atomic::Ordering::Release);
        gpushim_common::unforked::at_exit(write_at_exit);
    }
}

extern "C" fn write_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        // (the pid asked of the kernel: the C library caches none, a raw clone has a new one)
        if DISARMED.load(std::sync::atomic::Ordering::Acquire) || ARMED_BY.load(std::sync::atomic::Ordering::Acquire) != gpushim_common::sys::getpid() as u32 {
            return;
        }
        let (Some(target), Some(st)) = (TARGET.get(), state::get_if_ready()) else { return };
        let rows = st.usage_rows();
        let compute = st.compute_rows();
        let placement = st.placement_summary();
        let placement_text = placement.as_ref().map_or(String::new(), |p| crate::placement::text(p));
        match target {
            // (the placement summary alone is part of the log: silent with GPUSHIM_LOG=off)
            // (a process that only used NVML, like nvidia-smi, has nothing to say)
            None if crate::platform::log::enabled(crate::platform::log::Level::Error) && placement.as_ref().is_some_and(|p| !p.is_empty()) => {
                crate::platform::log::emit_plain(placement_text.trim_end())
            }
            None => {}
            Some(ReportTarget::Stderr) => crate::platform::log::emit_plain((text(&rows) + &compute_text(&compute) + &placement_text).trim_end()),
            Some(target @ ReportTarget::Path(path)) => {
                let body = if target.is_json() {
                    json(&rows, &compute, placement.as_deref().map(crate::placement::json).as_deref())
                } else {
                    text(&rows) + &compute_text(&compute) + &placement_text
                };
                // (a report longer than the file size limit would raise SIGXFSZ: not written)
                let limit = gpushim_common::sys::file_size_limit().unwrap_or(0);
                if body.len() as u64 > limit {
                    crate::platform::log::log!(crate::platform::log::Level::Warn, "cannot write the report to {}: its {} bytes would pass this process' file size limit ({limit} bytes, ulimit -f)", path.display(), body.len());
                } else if let Err(e) = write_file(path, &body) {
                    crate::platform::log::log!(crate::platform::log::Level::Warn, "cannot write the report to {}: {e}", path.display());
                }
            }
        }
    });
}

/// One device's figures.
pub struct Row {
    pub ordinal: usize,
    pub peak_in_use: u64,
    pub peak_reserved: u64,
    pub refused: u64,
    pub limit: u64,
    /// With a shared quota: its name and the most its members held on the device together.
    pub quota: Option<(String, u64)>,
    /// With `GPUSHIM_OOM_WAIT`: the allocations that waited for room in the shared quota and
    /// the nanoseconds they waited.
    pub waits: Option<(u64, u64)>,
}

fn text(rows: &[Row]) -> String {
    let mut s = format!("gpushim report (pid {}):\n", std::process::id());
    if rows.is_empty() {
        s.push_str("  no device was used\n");
    }
    for r in rows {
        let quota = r.quota.as_ref().map_or(String::new(), |(name, peak)| {
            format!(" (shared quota {name}: peak {peak} bytes held by all its processes)")
        });
        let waits = r.waits.map_or(String::new(), |(n, ns)| format!(", {n} allocations waited ({:.3} s)", ns as f64 / 1e9));
        let _ = writeln!(
            s,
            "  device {}: peak in use {} bytes, peak reserved {} bytes, {} allocations refused{waits}, limit {} bytes{quota}",
            r.ordinal, r.peak_in_use, r.peak_reserved, r.refused, r.limit
        );
    }
    s
}

/// A device's compute share, as its pacer measured it.
pub struct ComputeRow {
    pub ordinal: usize,
    pub limit: f64,
    pub busy_ns: u64,
    pub throttled_ns: u64,
    pub launches: u64,
}

fn compute_text(rows: &[ComputeRow]) -> String {
    let mut s = String::new();
    for r in rows {
        let _ = writeln!(
            s,
            "  device {}: compute limit {:.1}%, GPU busy {:.3} s, launches waited {:.3} s, {} launches measured",
            r.ordinal,
            r.limit * 100.0,
            r.busy_ns as f64 / 1e9,
            r.throttled_ns as f64 / 1e9,
            r.launches
        );
    }
    s
}

fn json(rows: &[Row], compute: &[ComputeRow], placement: Option<&str>) -> String {
    let devices: Vec<String> = rows
        .iter()
        .map(|r| {
            // quota names are `A-Z a-z 0-9 . _ -` (config): nothing to escape
            let quota = r.quota.as_ref().map_or(String::new(), |(name, peak)| {
                format!(",\"shared_quota\":\"{name}\",\"quota_peak_reserved\":{peak}")
            });
            let waits = r.waits.map_or(String::new(), |(n, ns)| format!(",\"waits\":{n},\"waited_ns\":{ns}"));
            format!(
                "{{\"ordinal\":{},\"peak_in_use\":{},\"peak_reserved\":{},\"refused\":{}{waits},\"limit\":{}{quota}}}",
                r.ordinal, r.peak_in_use, r.peak_reserved, r.refused, r.limit
            )
        })
        .collect();
    let placement = placement.map_or(String::new(), |p| format!(",\"placement\":{p}"));
    let compute: Vec<String> = compute
        .iter()
        .map(|r| {
            format!(
                "{{\"ordinal\":{},\"limit\":{},\"busy_ns\":{},\"throttled_ns\":{},\"launches\":{}}}",
                r.ordinal, r.limit, r.busy_ns, r.throttled_ns, r.launches
            )
        })
        .collect();
    let compute = if compute.is_empty() { String::new() } else { format!(",\"compute\":[{}]", compute.join(",")) };
    format!("{{\"pid\":{},\"devices\":[{}]{compute}{placement}}}\n", std::process::id(), devices.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        let rows = [Row { ordinal: 1, peak_in_use: 10, peak_reserved: 10, refused: 2, limit: 20, quota: None, waits: None }];
        let j = json(&rows, &[], None);
        assert!(json(&rows, &[], Some("[]")).ends_with("],\"placement\":[]}\n"));
        let c = [ComputeRow { ordinal: 0, limit: 0.3, busy_ns: 1_500_000_000, throttled_ns: 2_000_000_000, launches: 7 }];
        assert!(json(&rows, &c, None).contains("],\"compute\":[{\"ordinal\":0,\"limit\":0.3,\"busy_ns\":1500000000,\"throttled_ns\":2000000000,\"launches\":7}]}"));
        assert_eq!(compute_text(&c), "  device 0: compute limit 30.0%, GPU busy 1.500 s, launches waited 2.000 s, 7 launches measured\n");
        assert!(j.contains("\"devices\":[{\"ordinal\":1,\"peak_in_use\":10,\"peak_reserved\":10,\"refused\":2,\"limit\":20}]"), "{j}");
        assert!(text(&rows).contains("device 1: peak in use 10 bytes, peak reserved 10 bytes, 2 allocations refused, limit 20 bytes"));
        let waited = [Row { waits: Some((3, 1_250_000_000)), ..Row { quota: None, ..rows[0] } }];
        assert!(text(&waited).contains("2 allocations refused, 3 allocations waited (1.250 s), limit 20 bytes"), "{}", text(&waited));
        assert!(json(&waited, &[], None).contains("\"refused\":2,\"waits\":3,\"waited_ns\":1250000000,\"limit\":20}"));
    }
}

/// Writes the report to `path`: a regular file (created, or emptied first) or a device; a FIFO
/// or socket there is refused rather than waited on at exit.
fn write_file(path: &std::path::Path, body: &str) -> std::io::Result<()> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let kind = f.metadata()?.file_type();
    if kind.is_file() {
        f.set_len(0)?;
    } else if !kind.is_char_device() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file"));
    }
    std::io::Write::write_all(&mut f, body.as_bytes())
}
