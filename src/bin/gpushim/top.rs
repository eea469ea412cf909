//! `gpushim top [--interval SECONDS]`: the figures of `gpushim ps`, live in the terminal
//! (ratatui on crossterm: raw mode, the alternate screen, redrawn on every resize), refreshed
//! every interval: per GPU its memory (NVML) and the processes on it with a bar of what each
//! holds against its limit and its compute share (the limit, the share achieved over the last
//! interval: the GPU time its work took there over the wall time between two readings, and
//! the share of that time its launches waited); then the shared quotas and the processes that died. Keys: `q` /
//! Ctrl-C quit, `s` changes the order, `r` refreshes; SIGTERM, SIGHUP, SIGINT and SIGQUIT quit
//! too, the terminal restored (exit status 128 + the signal). Not on a terminal: one snapshot (`ps`).
//!
//! Every string shown comes through `figures` (made printable there: the state files are
//! written by the processes they describe).

use std::io::IsTerminal;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use ratatui::backend::CrosstermBackend;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::crossterm::terminal::{self, EnterAlternateScreen, LeaveAlternateScreen};
use ratatui::crossterm::{cursor, execute};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Terminal;

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

/// What a key asks for.
enum Key {
    Quit,
    Order,
    Refresh,
    Other,
}

pub fn main(interval: Duration) -> Result<(), Failure> {
    if !(std::io::stdin().is_terminal() && std::io::stdout().is_terminal()) {
        return crate::ps::main(None);
    }
    let setup = |e: std::io::Error| Failure::setup("top", format!("cannot set up the terminal: {e}"));
    catch_stop_signals();
    let _screen = Screen::enter().map_err(setup)?;
    let mut terminal = Terminal::new(CrosstermBackend::new(std::io::stdout())).map_err(setup)?;
    let mut order = Order::Memory;
    let mut figures = figures::collect(true);
    let mut reading = Reading::of(&figures);
    let mut rates = Rates::new();
    let mut next_reading = Instant::now() + interval;
    loop {
        let stopped = STOPPED_BY.load(Ordering::SeqCst);
        if stopped != 0 {
            // the screen is restored as `_screen` is dropped
            return Err(Failure::status((128 + stopped).clamp(0, 255) as u8));
        }
        let lines = match &figures {
            Ok(f) => render(f, &rates, order, interval),
            Err(e) => vec![Line::from(format!("gpushim top: {}", figures::printable(e)))],
        };
        // (a resize is seen here: draw fits the screen to the terminal's size first)
        terminal
            .draw(|frame| frame.render_widget(Paragraph::new(lines), frame.area()))
            .map_err(|e| Failure::setup("top", format!("cannot draw: {e}")))?;
        // (in slices, to see a signal soon)
        let left = next_reading.saturating_duration_since(Instant::now());
        let key = if STOPPED_BY.load(Ordering::SeqCst) != 0 {
            Key::Other
        } else if event::poll(left.min(SIGNAL_CHECK)).unwrap_or(false) {
            match event::read() {
                Ok(Event::Key(k)) if k.kind != KeyEventKind::Release => key(k.code, k.modifiers),
                // a new size: drawn again at once with the figures read
                Ok(_) | Err(_) => Key::Other,
            }
        } else if left > SIGNAL_CHECK {
            Key::Other
        } else {
            Key::Refresh
        };
        match key {
            Key::Quit => return Ok(()),
            Key::Order => order = order.next(),
            Key::Refresh => {
                figures = figures::collect(true);
                let next = Reading::of(&figures);
                rates = next.rates_since(&reading);
                reading = next;
                next_reading = Instant::now() + interval;
            }
            Key::Other => {}
        }
    }
}

/// Each (process file, device)'s compute share over the last interval: (achieved, throttled),
/// shares of the wall time between two readings.
type Rates = std::collections::HashMap<(std::path::PathBuf, usize), (f64, f64)>;

/// The compute counters of one reading, with its time.
struct Reading {
    at: Instant,
    counters: std::collections::HashMap<(std::path::PathBuf, usize), (u64, u64)>,
}

impl Reading {
    fn of(f: &Result<Figures, String>) -> Reading {
        let counters = f
            .iter()
            .flat_map(|f| f.processes.iter().filter(|p| p.alive))
            .flat_map(|p| p.devices.iter().map(move |d| ((p.path.clone(), d.ordinal), (d.busy_ns, d.throttled_ns))))
            .collect();
        Reading { at: Instant::now(), counters }
    }

    /// The shares between `before` and this reading (devices seen in both).
    fn rates_since(&self, before: &Reading) -> Rates {
        let wall = self.at.saturating_duration_since(before.at).as_nanos() as f64;
        if wall <= 0.0 {
            return Rates::new();
        }
        self.counters
            .iter()
            .filter_map(|(k, &(busy, throttled))| {
                let &(b0, t0) = before.counters.get(k)?;
                Some((k.clone(), (busy.saturating_sub(b0) as f64 / wall, throttled.saturating_sub(t0) as f64 / wall)))
            })
            .collect()
    }
}

/// How long `top` may take to see a signal that stops it.
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

/// The signal that stops `top` (0: none yet), set by [`stop`].
static STOPPED_BY: AtomicI32 = AtomicI32::new(0);

extern "C" fn stop(signal: libc::c_int) {
    STOPPED_BY.store(signal, Ordering::SeqCst);
}

/// SIGTERM, SIGHUP, SIGINT and SIGQUIT end `top` through its loop, which restores the terminal
/// (their default would leave it raw, on the alternate screen, the cursor hidden).
fn catch_stop_signals() {
    for signal in [libc::SIGTERM, libc::SIGHUP, libc::SIGINT, libc::SIGQUIT] {
        // SAFETY: `stop` only stores into an atomic, which is async-signal-safe.
        unsafe { libc::signal(signal, stop as extern "C" fn(libc::c_int) as libc::sighandler_t) };
    }
}

fn key(code: KeyCode, modifiers: KeyModifiers) -> Key {
    let ctrl = modifiers.contains(KeyModifiers::CONTROL);
    match code {
        KeyCode::Char('c' | 'd') if ctrl => Key::Quit,
        KeyCode::Char('l') if ctrl => Key::Refresh,
        KeyCode::Char('q' | 'Q') | KeyCode::Esc => Key::Quit,
        KeyCode::Char('s' | 'S') => Key::Order,
        KeyCode::Char('r' | 'R') => Key::Refresh,
        _ => Key::Other,
    }
}

/// The terminal in raw mode on the alternate screen, the cursor hidden; restored when dropped
/// (also when a panic unwinds).
struct Screen;

impl Screen {
    fn enter() -> std::io::Result<Screen> {
        terminal::enable_raw_mode()?;
        let screen = Screen;
        execute!(std::io::stdout(), EnterAlternateScreen, cursor::Hide)?;
        Ok(screen)
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = execute!(std::io::stdout(), cursor::Show, LeaveAlternateScreen);
        let _ = terminal::disable_raw_mode();
    }
}

const BAR_WIDTH: usize = 20;

/// `[#####.....]` of `used` against `limit`, coloured by how full: green, yellow from 75%,
/// magenta when full.
fn bar(used: u64, limit: Option<u64>) -> Span<'static> {
    let share = match limit {
        Some(l) if l > 0 => (used as f64 / l as f64).min(1.0),
        _ => 0.0,
    };
    let filled = (share * BAR_WIDTH as f64).round() as usize;
    let colour = if share >= 1.0 {
        Color::Magenta
    } else if share >= 0.75 {
        Color::Yellow
    } else {
        Color::Green
    };
    Span::styled(format!("[{}{}]", "#".repeat(filled), ".".repeat(BAR_WIDTH - filled)), Style::default().fg(colour))
}

/// One screen's lines.
fn render(f: &Figures, rates: &Rates, order: Order, interval: Duration) -> Vec<Line<'static>> {
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let dim = Style::default().add_modifier(Modifier::DIM);
    let mut lines: Vec<Line> = Vec::new();
    let live: Vec<_> = f.processes.iter().filter(|p| p.alive).collect();
    let quotas: std::collections::BTreeSet<&str> = f.quotas.iter().map(|q| q.quota.as_str()).collect();
    lines.push(Line::styled(
        format!(
            "gpushim top - {} processes, {} shared quotas - order: {} - every {:.1}s - keys: q quit, s order, r refresh",
            live.len(),
            quotas.len(),
            order.label(),
            interval.as_secs_f64()
        ),
        Style::default().add_modifier(Modifier::REVERSED),
    ));
    // every (process, device) row, grouped by GPU
    struct Row<'a> {
        p: &'a crate::live::Process,
        d: &'a crate::live::DeviceFigures,
    }
    let mut rows: Vec<Row> = live.iter().flat_map(|p| p.devices.iter().map(move |d| Row { p, d })).collect();
    rows.sort_by(|a, b| match order {
        Order::Memory => b.d.in_use.cmp(&a.d.in_use).then(a.p.pid.cmp(&b.p.pid)),
        Order::Pid => a.p.pid.cmp(&b.p.pid).then(a.d.ordinal.cmp(&b.d.ordinal)),
        Order::Refused => b.d.refused.cmp(&a.d.refused).then(a.p.pid.cmp(&b.p.pid)),
        Order::Name => a.p.comm.cmp(&b.p.comm).then(a.p.pid.cmp(&b.p.pid)),
    });
    let mut gpus: Vec<(String, String)> = f
        .gpus
        .iter()
        .map(|g| (g.uuid.clone(), format!("GPU {} {} {}: {} used of {} (NVML)", g.index, g.name, g.uuid, human(g.used), human(g.total))))
        .collect();
    for r in &rows {
        if !gpus.iter().any(|(u, _)| *u == r.d.uuid) {
            gpus.push((r.d.uuid.clone(), format!("GPU {} (not listed by NVML)", r.d.uuid)));
        }
    }
    if let Some(e) = &f.nvml_error {
        lines.push(Line::from(format!("NVML: {e}")));
    }
    for (uuid, title) in &gpus {
        lines.push(Line::default());
        lines.push(Line::styled(title.clone(), bold));
        let mine: Vec<&Row> = rows.iter().filter(|r| r.d.uuid == *uuid).collect();
        if mine.is_empty() {
            lines.push(Line::styled("  no process under gpushim", dim));
            continue;
        }
        lines.push(Line::styled(
            format!(
                "  {:>7} {:<8} {:<15} {:>3} {:<5} {:<22} {:>10} {:>10} {:>10} {:>13} {:>6} {:>6} {:>7} {}",
                "PID", "USER", "NAME", "DEV", "PART", "IN USE / LIMIT", "IN USE", "PEAK", "LIMIT", "COMPUTE LIMIT", "SHARE", "WAITED", "REFUSED", "QUOTA"
            ),
            Style::default().add_modifier(Modifier::UNDERLINED),
        ));
        for r in mine {
            let part = r.d.part.as_ref().map_or(String::new(), |(i, n, _)| format!("{i}/{n}"));
            let refused = format!("{:>7}", r.d.refused);
            let climit = r.d.compute_limit.map_or("-".to_string(), |l| format!("{} {}", figures::percent(l), r.p.compute_mode));
            let (share, waited) = match rates.get(&(r.p.path.clone(), r.d.ordinal)) {
                Some(&(s, w)) if r.d.compute_limit.is_some() || s > 0.0 => (format!("{:.0}%", s * 100.0), format!("{:.0}%", w * 100.0)),
                _ => ("-".into(), "-".into()),
            };
            lines.push(Line::from(vec![
                Span::raw(format!(
                    "  {:>7} {:<8} {:<15} {:>3} {:<5} ",
                    r.p.pid,
                    figures::user_name(r.p.uid),
                    r.p.comm,
                    r.d.ordinal,
                    part
                )),
                bar(r.d.in_use, r.d.limit),
                Span::raw(format!(
                    " {:>10} {:>10} {:>10} {climit:>13} {share:>6} {waited:>6} ",
                    human(r.d.in_use),
                    human(r.d.peak_in_use),
                    r.d.limit.map_or("-".into(), human)
                )),
                if r.d.refused > 0 { Span::styled(refused, Style::default().fg(Color::Yellow).add_modifier(Modifier::BOLD)) } else { Span::raw(refused) },
                Span::raw(format!(" {}", r.p.quota.as_deref().unwrap_or("-"))),
            ]));
        }
    }
    if !f.quotas.is_empty() {
        lines.push(Line::default());
        lines.push(Line::styled("shared quotas", bold));
        for q in &f.quotas {
            let limit = (q.limit > 0).then_some(q.limit);
            lines.push(Line::from(vec![
                Span::raw(format!("  {} ({}) {}: ", q.quota, figures::user_name(q.uid), q.uuid)),
                bar(q.held, limit),
                Span::raw(format!(
                    " {} held of {} (peak {}), device memory {}",
                    human(q.held),
                    limit.map_or("-".into(), human),
                    human(q.peak),
                    human(q.size)
                )),
            ]));
        }
    }
    let dead: Vec<_> = f.processes.iter().filter(|p| !p.alive).collect();
    if !dead.is_empty() {
        lines.push(Line::default());
        for p in dead {
            lines.push(Line::styled(
                format!("  pid {} {} ({}): exited without leaving (killed); removed when the next process starts", p.pid, p.comm, figures::user_name(p.uid)),
                dim,
            ));
        }
    }
    lines
}
