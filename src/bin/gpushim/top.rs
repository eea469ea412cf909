//! `gpushim top [--interval SECONDS]`: the figures of `gpushim ps`, live in the terminal (raw
//! mode, the alternate screen), refreshed every interval: per GPU its memory (NVML) and the
//! processes on it with a bar of what each holds against its limit; then the shared quotas and
//! the processes that died. Keys: `q` / Ctrl-C quit, `s` changes the order, `r` refreshes.
//! Not on a terminal: one snapshot (`gpushim ps`).

use std::ffi::OsString;
use std::fmt::Write as _;
use std::io::Write;
use std::time::{Duration, Instant};

use crate::figures::{self, human, Figures};
use crate::Failure;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Order {
    Memory,
    Pid,
    Refused,
    Name,
}

impl Order {
    fn next(self) -> Order {
        match self {
            Order::Memory => Order::Pid,
            Order::Pid => Order::Refused,
            Order::Refused => Order::Name,
            Order::Name => Order::Memory,
        }
    }
    fn label(self) -> &'static str {
        match self {
            Order::Memory => "memory in use",
            Order::Pid => "pid",
            Order::Refused => "refusals",
            Order::Name => "name",
        }
    }
}

pub fn main(args: &[OsString]) -> Result<(), Failure> {
    let mut interval = Duration::from_secs(1);
    let mut i = 0;
    while i < args.len() {
        let a = args[i].to_string_lossy().into_owned();
        i += 1;
        let value = match a.as_str() {
            "--help" | "-h" => {
                print!("{}", crate::help::TOP);
                return Ok(());
            }
            "--interval" | "-d" => {
                i += 1;
                args.get(i - 1).map(|v| v.to_string_lossy().into_owned())
            }
            other if other.starts_with("--interval=") => Some(other["--interval=".len()..].to_string()),
            other => return Err(Failure::usage("top", format!("unexpected argument {other:?}; see gpushim top --help"))),
        };
        let secs: f64 = value
            .as_deref()
            .and_then(|v| v.parse().ok())
            .filter(|s: &f64| s.is_finite() && *s >= 0.1 && *s <= 3600.0)
            .ok_or_else(|| Failure::usage("top", "--interval needs seconds between 0.1 and 3600, like --interval 2"))?;
        interval = Duration::from_secs_f64(secs);
    }
    // SAFETY: isatty on the standard descriptors.
    let tty = unsafe { libc::isatty(0) == 1 && libc::isatty(1) == 1 };
    if !tty {
        return crate::ps::main(&[]);
    }
    let _raw = Raw::enter().map_err(|e| Failure::setup("top", format!("cannot set up the terminal: {e}")))?;
    let mut order = Order::Memory;
    let mut out = std::io::stdout();
    loop {
        let (cols, rows) = size();
        let screen = match figures::collect(true) {
            Ok(f) => render(&f, order, cols, rows, interval),
            Err(e) => format!("gpushim top: {}\r\n", figures::printable(&e)),
        };
        let _ = out.write_all(format!("\x1b[H\x1b[2J{screen}").as_bytes());
        let _ = out.flush();
        let deadline = Instant::now() + interval;
        let mut redraw = false;
        while !redraw {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match key(left) {
                Some(b'q') | Some(b'Q') | Some(3) | Some(4) => return Ok(()),
                Some(b's') | Some(b'S') => {
                    order = order.next();
                    redraw = true;
                }
                Some(b'r') | Some(b'R') | Some(12) => redraw = true,
                Some(_) | None => {}
            }
        }
    }
}

/// The terminal in raw mode on the alternate screen, restored when dropped.
struct Raw(libc::termios);

impl Raw {
    fn enter() -> std::io::Result<Raw> {
        // SAFETY: tcgetattr/tcsetattr on stdin with a termios they fill.
        unsafe {
            let mut t: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(0, &mut t) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let saved = t;
            t.c_lflag &= !(libc::ICANON | libc::ECHO | libc::ISIG);
            t.c_cc[libc::VMIN] = 0;
            t.c_cc[libc::VTIME] = 0;
            if libc::tcsetattr(0, libc::TCSANOW, &t) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            print!("\x1b[?1049h\x1b[?25l");
            let _ = std::io::stdout().flush();
            Ok(Raw(saved))
        }
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        print!("\x1b[?25h\x1b[?1049l");
        let _ = std::io::stdout().flush();
        // SAFETY: restoring the settings read in `enter`.
        unsafe { libc::tcsetattr(0, libc::TCSANOW, &self.0) };
    }
}

/// A key pressed within `wait`, if any.
fn key(wait: Duration) -> Option<u8> {
    let mut p = libc::pollfd { fd: 0, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd; read into a one-byte buffer.
    unsafe {
        if libc::poll(&mut p, 1, wait.as_millis().min(i32::MAX as u128) as i32) <= 0 {
            return None;
        }
        let mut b = 0u8;
        (libc::read(0, (&mut b as *mut u8).cast(), 1) == 1).then_some(b)
    }
}

/// (columns, rows) of the terminal.
fn size() -> (usize, usize) {
    // SAFETY: TIOCGWINSZ fills a winsize.
    unsafe {
        let mut w: libc::winsize = std::mem::zeroed();
        if libc::ioctl(1, libc::TIOCGWINSZ, &mut w) == 0 && w.ws_col > 0 {
            return (w.ws_col as usize, w.ws_row.max(5) as usize);
        }
    }
    (80, 24)
}

fn bar(used: u64, limit: Option<u64>, width: usize) -> String {
    let filled = match limit {
        Some(l) if l > 0 => ((used as f64 / l as f64) * width as f64).round().min(width as f64) as usize,
        _ => 0,
    };
    format!("[{}{}]", "#".repeat(filled), ".".repeat(width - filled))
}

/// One screen (lines end in `\r\n`: the terminal is raw).
fn render(f: &Figures, order: Order, cols: usize, rows: usize, interval: Duration) -> String {
    let mut lines: Vec<String> = Vec::new();
    let live: Vec<_> = f.processes.iter().filter(|p| p.alive).collect();
    let quotas: std::collections::BTreeSet<&str> = f.quotas.iter().map(|q| q.quota.as_str()).collect();
    lines.push(format!(
        "gpushim top - {} processes, {} shared quotas - order: {} - every {:.1}s - keys: q quit, s order, r refresh",
        live.len(),
        quotas.len(),
        order.label(),
        interval.as_secs_f64()
    ));
    // every (process, device) row, grouped by GPU
    struct Row<'a> {
        p: &'a crate::live::Process,
        d: &'a crate::live::DeviceFigures,
    }
    let mut rows_all: Vec<Row> = live.iter().flat_map(|p| p.devices.iter().map(move |d| Row { p, d })).collect();
    rows_all.sort_by(|a, b| match order {
        Order::Memory => b.d.in_use.cmp(&a.d.in_use).then(a.p.pid.cmp(&b.p.pid)),
        Order::Pid => a.p.pid.cmp(&b.p.pid).then(a.d.ordinal.cmp(&b.d.ordinal)),
        Order::Refused => b.d.refused.cmp(&a.d.refused).then(a.p.pid.cmp(&b.p.pid)),
        Order::Name => a.p.comm.cmp(&b.p.comm).then(a.p.pid.cmp(&b.p.pid)),
    });
    let mut gpus: Vec<(String, String)> = f.gpus.iter().map(|g| (g.uuid.clone(), format!("GPU {} {} {}: {} used of {} (NVML)", g.index, g.name, g.uuid, human(g.used), human(g.total)))).collect();
    for r in &rows_all {
        if !gpus.iter().any(|(u, _)| *u == r.d.uuid) {
            gpus.push((r.d.uuid.clone(), format!("GPU {} (not listed by NVML)", r.d.uuid)));
        }
    }
    if let Some(e) = &f.nvml_error {
        lines.push(format!("NVML: {e}"));
    }
    let barw = 20;
    for (uuid, title) in &gpus {
        lines.push(String::new());
        lines.push(title.clone());
        let mine: Vec<&Row> = rows_all.iter().filter(|r| r.d.uuid == *uuid).collect();
        if mine.is_empty() {
            lines.push("  no process under gpushim".into());
            continue;
        }
        lines.push(format!("  {:>7} {:<8} {:<15} {:>3} {:<5} {:<22} {:>10} {:>10} {:>10} {:>7} {}", "PID", "USER", "NAME", "DEV", "PART", "IN USE / LIMIT", "IN USE", "PEAK", "LIMIT", "REFUSED", "QUOTA"));
        for r in mine {
            let part = r.d.part.as_ref().map_or(String::new(), |(i, n, _)| format!("{i}/{n}"));
            lines.push(format!(
                "  {:>7} {:<8} {:<15} {:>3} {:<5} {:<22} {:>10} {:>10} {:>10} {:>7} {}",
                r.p.pid,
                figures::user_name(r.p.uid),
                r.p.comm,
                r.d.ordinal,
                part,
                bar(r.d.in_use, r.d.limit, barw),
                human(r.d.in_use),
                human(r.d.peak_in_use),
                r.d.limit.map_or("-".into(), human),
                r.d.refused,
                r.p.quota.as_deref().unwrap_or("-")
            ));
        }
    }
    if !f.quotas.is_empty() {
        lines.push(String::new());
        lines.push("shared quotas".into());
        for q in &f.quotas {
            let limit = (q.limit > 0).then_some(q.limit);
            lines.push(format!(
                "  {} ({}) {}: {} {} held of {} (peak {}), device memory {}",
                q.quota,
                figures::user_name(q.uid),
                q.uuid,
                bar(q.held, limit, barw),
                human(q.held),
                limit.map_or("-".into(), human),
                human(q.peak),
                human(q.size)
            ));
        }
    }
    let dead: Vec<_> = f.processes.iter().filter(|p| !p.alive).collect();
    if !dead.is_empty() {
        lines.push(String::new());
        for p in dead {
            lines.push(format!("  pid {} {} ({}): exited without leaving (killed); removed when the next process starts", p.pid, p.comm, figures::user_name(p.uid)));
        }
    }
    let mut out = String::new();
    for l in lines.into_iter().take(rows.saturating_sub(1)) {
        let l: String = l.chars().take(cols).collect();
        let _ = write!(out, "{l}\r\n");
    }
    out
}
