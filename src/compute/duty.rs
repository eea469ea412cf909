//! The `duty` pacer of one device: it measures the GPU time the process' work took and makes
//! the process' launches wait so that this time stays within the device's share.
//!
//! # Measuring
//!
//! Every gated launch is bracketed by two events recorded on its stream, `before` and `after`
//! (the pacer's own, from a pool per context). Once `after` has completed,
//! `cuEventElapsedTime(before, after)` is the time the device spent on that work: the events
//! stand right before and right after it in the stream, so time the work spent queued behind
//! earlier work is not counted, nor time the device gave other processes before it began. Not
//! grid sizes (a grid says nothing of how long it runs), not NVML's samples (one-second
//! windows). A launch that cannot be bracketed (events exhausted, a driver error) is charged
//! the running estimate instead: never nothing.
//!
//! # Pacing
//!
//! One figure holds the whole history, `clock` (nanoseconds of `CLOCK_MONOTONIC`): the time at
//! which the work measured so far is paid for. Work that took `d` moves it by `d / share`
//! (`clock = max(clock, start − CREDIT) + d / share`, `start` ≈ when that work began, so idle
//! time earns at most [`CREDIT`] of catching up). A launch may go while the clock, plus the
//! estimate of the work launched but not measured yet divided by the share, is at most
//! [`AHEAD`] past now; otherwise its thread sleeps, and wakes once [`BURST`] of the clock is
//! paid, so that launches go in bursts (the device then runs the burst back to back and the
//! events of a burst's launches measure no gaps between them). Over any window the device time
//! is `share × window` give or take one burst and one kernel.
//!
//! The bound on what is queued ahead is the same rule: at most `AHEAD + BURST` of the clock
//! can be launched and unmeasured, so the share holds at sub-second scale even when the
//! program queues work far ahead. Before the first measurement nothing is known of the
//! kernels' length: one launch at a time until the first has completed.
//!
//! # Waiting
//!
//! In the launching thread, never a thread of the pacer's own; in steps of at most
//! [`STEP`], measuring between steps; never more than [`MAX_WAIT`] for one launch (a GPU
//! whose work never completes does not hang the program in the shim; the launch then goes, with
//! one warning). No lock is held across a call into the driver: the queue of unmeasured work
//! is taken out of its lock entry by entry.
//!
//! # A group
//!
//! With a shared quota the clock lives in the quota's file, one per device, advanced by every
//! member's measurements with compare-and-swap: the group's processes together get the share.

use std::collections::VecDeque;
use std::ffi::{c_float, c_uint};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use gpushim_common::bounded::Bounded;
use gpushim_common::state_files::live;

use crate::driver::ffi::*;
use crate::driver::Api;
use crate::platform::log::{log, Level};

/// How far past now the clock may be when a launch goes.
pub const AHEAD: u64 = 1_000_000;
/// How much of the clock a waiting thread lets pass before launching again.
pub const BURST: u64 = 4_000_000;
/// The most catching up idle time earns.
pub const CREDIT: u64 = 10_000_000;
/// The longest single sleep between two measurements.
pub const STEP: u64 = 2_000_000;
/// The longest a launch waits.
pub const MAX_WAIT: Duration = Duration::from_secs(60);
/// The most launches in flight (unmeasured) per device.
pub const MAX_PENDING: usize = 4096;
/// The most events kept per context for reuse.
const POOL_PER_CONTEXT: usize = 2 * MAX_PENDING;

/// `CUDA_ERROR_NOT_READY`: an event not reached yet.
const CUDA_ERROR_NOT_READY: CUresult = 600;

/// The monotonic clock, in nanoseconds (the same clock in every process of the machine).
#[inline]
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out-pointer; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The driver functions the pacer records and reads its events with.
#[derive(Clone, Copy)]
pub struct EventApi {
    pub create: unsafe extern "C" fn(*mut CUevent, c_uint) -> CUresult,
    pub record: unsafe extern "C" fn(CUevent, CUstream) -> CUresult,
    pub query: unsafe extern "C" fn(CUevent) -> CUresult,
    pub elapsed: unsafe extern "C" fn(*mut c_float, CUevent, CUevent) -> CUresult,
    pub destroy: unsafe extern "C" fn(CUevent) -> CUresult,
    pub current: unsafe extern "C" fn(*mut CUcontext) -> CUresult,
}

impl EventApi {
    /// The functions from the driver's table; `None` when one is missing.
    pub fn from(api: &Api) -> Option<EventApi> {
        Some(EventApi {
            create: api.event_create?,
            record: api.event_record?,
            query: api.event_query?,
            elapsed: api.event_elapsed?,
            destroy: api.event_destroy?,
            current: api.ctx_get_current?,
        })
    }
}

/// Work launched and not measured yet.
struct Pending {
    ctx: usize,
    before: usize,
    after: usize,
    /// What it was counted as meanwhile (in `Pacer::outstanding`).
    estimate: u64,
}

/// The pacer of one program device.
pub struct Pacer {
    /// The share, in (0, 1).
    share: f64,
    /// The clock: the process' own, or the group's in the quota file.
    clock: &'static AtomicU64,
    /// Estimated nanoseconds of the work launched and not measured yet.
    outstanding: AtomicU64,
    /// A running mean of the measured work's nanoseconds per launch (0: nothing measured yet).
    estimate: AtomicU64,
    pending: Bounded<VecDeque<Pending>>,
    /// Events to reuse, by context.
    pool: Bounded<Vec<(usize, Vec<usize>)>>,
    /// Where the figures are published (the live file's entry, or the pacer's own).
    figures: &'static live::Compute,
    warned: AtomicBool,
}

/// What [`Pacer::before_launch`] hands to [`Pacer::after_launch`].
pub struct Ticket {
    ctx: usize,
    events: Option<(usize, usize)>,
    estimate: u64,
}

impl Pacer {
    /// A pacer for `share` of the device (0 < share < 1), with `clock` (the group's, or a fresh
    /// one) and `figures`.
    pub fn new(share: f64, clock: &'static AtomicU64, figures: &'static live::Compute) -> Pacer {
        figures.limit_ppm.store((share * 1e6).round().max(1.0) as u64, Relaxed);
        Pacer {
            share,
            clock,
            outstanding: AtomicU64::new(0),
            estimate: AtomicU64::new(0),
            pending: Bounded::new("gpushim's queue of unmeasured launches", VecDeque::new()),
            pool: Bounded::new("gpushim's pool of pacing events", Vec::new()),
            figures,
            warned: AtomicBool::new(false),
        }
    }

    pub fn share(&self) -> f64 {
        self.share
    }

    /// The figures: measured busy time, time waited, launches measured.
    pub fn figures(&self) -> &live::Compute {
        self.figures
    }

    /// Pay-time of `ns` of device work.
    fn pay(&self, ns: u64) -> u64 {
        (ns as f64 / self.share) as u64
    }

    /// Waits until a launch may go, then records the `before` event on `stream` (the stream
    /// the launch's events go on: the per-thread default stream written as
    /// `CU_STREAM_PER_THREAD`). To be followed by [`Pacer::after_launch`].
    pub fn before_launch(&self, api: &EventApi, stream: CUstream) -> Ticket {
        self.wait_turn(api);
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        if unsafe { (api.current)(&mut ctx) } != CUDA_SUCCESS || ctx.is_null() {
            return self.unmeasured(0);
        }
        let ctx = ctx as usize;
        let Some((before, after)) = self.take_events(api, ctx) else { return self.unmeasured(ctx) };
        // SAFETY: our event, of the current context; the program's stream passed as given.
        if unsafe { (api.record)(before as CUevent, stream) } != CUDA_SUCCESS {
            self.give_back(ctx, &[before, after]);
            return self.unmeasured(ctx);
        }
        let estimate = self.estimate.load(Relaxed);
        self.outstanding.fetch_add(estimate, Relaxed);
        Ticket { ctx, events: Some((before, after)), estimate }
    }

    fn unmeasured(&self, ctx: usize) -> Ticket {
        Ticket { ctx, events: None, estimate: self.estimate.load(Relaxed) }
    }

    /// After the launch: records `after` and queues the work for measuring; a launch the
    /// driver refused costs nothing.
    pub fn after_launch(&self, api: &EventApi, stream: CUstream, ticket: Ticket, launched: bool) {
        let Some((before, after)) = ticket.events else {
            if launched {
                // (not measurable: charged the estimate, or a millisecond before any is known)
                let charge = if ticket.estimate == 0 { 1_000_000 } else { ticket.estimate };
                self.charge(charge, now_ns());
            }
            return;
        };
        // SAFETY: our event; the stream as above.
        let recorded = launched && unsafe { (api.record)(after as CUevent, stream) } == CUDA_SUCCESS;
        if !recorded {
            self.outstanding.fetch_sub(ticket.estimate.min(self.outstanding.load(Relaxed)), Relaxed);
            self.give_back(ticket.ctx, &[before, after]);
            if launched {
                self.charge(ticket.estimate.max(1), now_ns());
            }
            return;
        }
        let entry = Pending { ctx: ticket.ctx, before, after, estimate: ticket.estimate };
        match self.pending.lock() {
            Ok(mut q) if q.len() < MAX_PENDING => q.push_back(entry),
            _ => {
                // (cannot be queued: charged its estimate at once)
                self.outstanding.fetch_sub(ticket.estimate.min(self.outstanding.load(Relaxed)), Relaxed);
                self.charge(ticket.estimate.max(1), now_ns());
            }
        }
    }

    /// Adds `ns` of device work that ended about `end` to the clock and the figures.
    fn charge(&self, ns: u64, end: u64) {
        let start = end.saturating_sub(ns);
        let pay = self.pay(ns);
        let _ = self.clock.fetch_update(Relaxed, Relaxed, |c| Some(c.max(start.saturating_sub(CREDIT)).saturating_add(pay)));
        self.figures.busy_ns.fetch_add(ns, Relaxed);
        self.figures.launches.fetch_add(1, Relaxed);
    }

    /// Measures what has completed, oldest first, stopping at the first not complete.
    /// Returns how many launches are still unmeasured.
    fn measure(&self, api: &EventApi) -> usize {
        loop {
            let Ok(entry) = self.pending.lock().map(|mut q| q.pop_front()) else { return MAX_PENDING };
            let Some(entry) = entry else { return 0 };
            // SAFETY: our event.
            let state = unsafe { (api.query)(entry.after as CUevent) };
            if state == CUDA_ERROR_NOT_READY {
                return match self.pending.lock() {
                    Ok(mut q) => {
                        q.push_front(entry);
                        q.len()
                    }
                    Err(_) => {
                        self.settle(entry, None);
                        0
                    }
                };
            }
            let mut ms: c_float = 0.0;
            // SAFETY: our events, both recorded; valid out-pointer.
            let took = (state == CUDA_SUCCESS && unsafe { (api.elapsed)(&mut ms, entry.before as CUevent, entry.after as CUevent) } == CUDA_SUCCESS)
                .then(|| (f64::from(ms.max(0.0)) * 1e6) as u64);
            self.settle(entry, took);
        }
    }

    /// Moves a measured launch from the estimate to the clock (`None`: its events failed, it is
    /// charged its estimate) and gives its events back.
    fn settle(&self, entry: Pending, took: Option<u64>) {
        self.outstanding.fetch_sub(entry.estimate.min(self.outstanding.load(Relaxed)), Relaxed);
        let ns = took.unwrap_or(entry.estimate.max(1));
        if took.is_some() {
            let old = self.estimate.load(Relaxed);
            let new = if old == 0 { ns.max(1) } else { (old - old / 8 + ns / 8).max(1) };
            self.estimate.store(new, Relaxed);
        }
        self.charge(ns, now_ns());
        self.give_back(entry.ctx, &[entry.before, entry.after]);
    }

    /// Sleeps until the clock allows a launch (bounded by [`MAX_WAIT`]).
    fn wait_turn(&self, api: &EventApi) {
        let first = now_ns();
        // once the clock made this thread wait: the time it waits for (a burst's worth paid)
        let mut resume = 0u64;
        loop {
            let unmeasured = self.measure(api);
            let now = now_ns();
            let due = self.clock.load(Relaxed).saturating_add(self.pay(self.outstanding.load(Relaxed)));
            // (before the first measurement nothing is known of the kernels: one at a time)
            let room = if self.estimate.load(Relaxed) != 0 { unmeasured < MAX_PENDING } else { unmeasured == 0 };
            let paid = due <= now.saturating_add(AHEAD);
            if room && paid && now >= resume {
                break;
            }
            if now.saturating_sub(first) >= MAX_WAIT.as_nanos() as u64 {
                if !self.warned.swap(true, Relaxed) {
                    log!(Level::Warn, "compute limit: a launch waited {} s for the device's earlier work to be measured; letting it go", MAX_WAIT.as_secs());
                }
                break;
            }
            let sleep = if !room {
                // earlier work still running: look again soon
                200_000
            } else {
                if !paid {
                    resume = due.saturating_sub(AHEAD).saturating_add(BURST);
                }
                resume.saturating_sub(now).min(STEP)
            };
            std::thread::sleep(Duration::from_nanos(sleep.max(20_000)));
        }
        let waited = now_ns().saturating_sub(first);
        if waited > 50_000 {
            self.figures.throttled_ns.fetch_add(waited, Relaxed);
        }
    }

    /// Two events of context `ctx`: from the pool, else new ones (made in the current context,
    /// which is `ctx`).
    fn take_events(&self, api: &EventApi, ctx: usize) -> Option<(usize, usize)> {
        if let Ok(mut pool) = self.pool.lock() {
            if let Some((_, free)) = pool.iter_mut().find(|(c, _)| *c == ctx) {
                if free.len() >= 2 {
                    let a = free.pop()?;
                    let b = free.pop()?;
                    return Some((a, b));
                }
            }
        }
        let make = || {
            let mut e: CUevent = std::ptr::null_mut();
            // SAFETY: valid out-pointer; flags 0 (timing on: elapsed time is what is read).
            (unsafe { (api.create)(&mut e, 0) } == CUDA_SUCCESS && !e.is_null()).then_some(e as usize)
        };
        let a = make()?;
        match make() {
            Some(b) => Some((a, b)),
            None => {
                // SAFETY: our event, just made.
                unsafe { (api.destroy)(a as CUevent) };
                None
            }
        }
    }

    fn give_back(&self, ctx: usize, events: &[usize]) {
        if let Ok(mut pool) = self.pool.lock() {
            let free = match pool.iter().position(|(c, _)| *c == ctx) {
                Some(i) => &mut pool[i].1,
                None => {
                    pool.push((ctx, Vec::new()));
                    &mut pool.last_mut().expect("just pushed").1
                }
            };
            if free.len() + events.len() <= POOL_PER_CONTEXT {
                free.extend_from_slice(events);
            }
        }
    }

    /// Context `ctx` goes away: its events go with it, and the driver may hand their handles
    /// out again (to the program), so the pacer forgets them; `destroy`, while the context still
    /// lives, destroys them first. Its unmeasured work is charged its estimate.
    pub fn forget_context(&self, ctx: usize, destroy: Option<unsafe extern "C" fn(CUevent) -> CUresult>) {
        let mut events: Vec<usize> = Vec::new();
        if let Ok(mut pool) = self.pool.lock() {
            pool.retain_mut(|(c, free)| {
                if *c == ctx {
                    events.append(free);
                }
                *c != ctx
            });
        }
        let gone: Vec<Pending> = match self.pending.lock() {
            Ok(mut q) => {
                let (gone, kept): (Vec<Pending>, Vec<Pending>) = q.drain(..).partition(|p| p.ctx == ctx);
                q.extend(kept);
                gone
            }
            Err(_) => Vec::new(),
        };
        for p in gone {
            self.outstanding.fetch_sub(p.estimate.min(self.outstanding.load(Relaxed)), Relaxed);
            self.charge(p.estimate.max(1), now_ns());
            events.extend([p.before, p.after]);
        }
        if let Some(destroy) = destroy {
            for e in events {
                // SAFETY: our event, of a context that still lives.
                unsafe { destroy(e as CUevent) };
            }
        }
    }

    /// In a forked child: the parent's events and queue mean nothing here.
    pub fn reset_after_fork(&self) {
        self.pending.reset_after_fork(VecDeque::new());
        self.pool.reset_after_fork(Vec::new());
        self.outstanding.store(0, Relaxed);
    }
}
