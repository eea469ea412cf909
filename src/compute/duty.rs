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
//! can be launched and unmeasured (at the running mean's estimate), so the share holds at
//! sub-second scale even when the program queues work far ahead; and at most
//! [`MAX_IN_FLIGHT`] launches are in flight, which bounds what a program whose kernels suddenly
//! grow can queue before the first of the new ones is measured (the debt is paid afterwards).
//! Before the first measurement nothing is known of the kernels' length: one launch at a time
//! until the first has completed. A launch is admitted by two compare-and-swaps (the count in
//! flight, then the estimate against the clock), so threads launching at once cannot all pass
//! on the same room.
//!
//! # Waiting
//!
//! In the launching thread, never a thread of the pacer's own; in steps of at most
//! [`STEP`], measuring between steps. A wait for the clock lasts what the share demands (the
//! work measured divided by the share; a clock more than [`MAX_LEAD`] ahead, which no real
//! history gives, is taken as corrupt and reset, with a warning). A wait for earlier work to
//! complete lasts at most [`MAX_WAIT`] (a GPU whose work never completes does not hang the
//! program in the shim; the launch then goes, with one warning). No lock is held across a call
//! into the driver: the queue of unmeasured work is taken out of its lock entry by entry, and
//! the queries run with the thread's capture mode relaxed (a global-mode stream capture on
//! another thread is not invalidated by them).
//!
//! # Contexts
//!
//! Events belong to a context. When the program destroys one, the pacer forgets its events
//! first (destroying them while the context lives) after the measurements under way have ended
//! (a bounded wait), so that the driver never sees the pacer use a destroyed context's events.
//!
//! # Turns
//!
//! With other paced processes on the GPU (`turns`), a launch admitted by the clock also claims
//! the GPU for its estimate, and waits while another's claim holds (in steps, at most
//! `turns::MAX_WAIT` in all, after which the pacer takes no turns for `turns::PAUSE`); the last
//! launch of the flight to leave it lets the claim go.
//!
//! # A group
//!
//! With a shared quota the clock lives in the quota's file, one per device, advanced by every
//! member's measurements with compare-and-swap: the group's processes together get the share.

use std::collections::VecDeque;
use std::ffi::{c_float, c_uint};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::Acquire, Ordering::Relaxed, Ordering::Release, Ordering::SeqCst};
use std::time::Duration;

use gpushim_common::bounded::Bounded;
use gpushim_common::state_files::live;

use crate::driver::ffi::*;
use crate::driver::Api;
use crate::compute::turns::{self, Turns};
use crate::platform::log::{log, Level};

/// How far past now the clock may be when a launch goes.
pub const AHEAD: u64 = 1_000_000;
/// How much of the clock a waiting thread lets pass before launching again.
pub const BURST: u64 = 4_000_000;
/// The most catching up idle time earns.
pub const CREDIT: u64 = 50_000_000;
/// The longest single sleep between two measurements.
pub const STEP: u64 = 2_000_000;
/// The longest a launch waits for earlier work to complete (not for the clock).
pub const MAX_WAIT: Duration = Duration::from_secs(60);
/// The longest sleep of a launch waiting for earlier work to complete.
const ROOM_SLEEP: u64 = 200_000;
/// How much longer than asked a sleep of the launching thread lasts, about (Linux's default
/// timer slack, 50 µs, plus waking).
const SLACK: u64 = 60_000;
/// A clock further ahead than this is corrupt (a day).
pub const MAX_LEAD: u64 = 86_400_000_000_000;
/// The most launches in flight (unmeasured) per device: the bound on what a program whose
/// kernels suddenly grow can queue before the first of the new ones is measured.
pub const MAX_IN_FLIGHT: usize = 16;
/// The most events kept per context for reuse.
const POOL_PER_CONTEXT: usize = 4 * MAX_IN_FLIGHT;

/// `CU_STREAM_CAPTURE_MODE_RELAXED`.
const CAPTURE_MODE_RELAXED: u32 = 2;
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

/// A share as the live file publishes it: millionths, at least 1 (0 means no limit).
pub fn ppm(share: f64) -> u64 {
    (share * 1e6).round().max(1.0) as u64
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
    /// `cuThreadExchangeStreamCaptureMode` (CUDA 10.1+), when the driver has it.
    pub capture_mode: Option<unsafe extern "C" fn(*mut u32) -> CUresult>,
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
            capture_mode: api.thread_exchange_capture_mode,
        })
    }
}

/// Work launched and not measured yet.
struct Pending {
    /// Its number in the queue (which entry a measurement looked at).
    seq: u64,
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
    /// 1 / share in 32.32 fixed point: what [`Pacer::pay`] multiplies by (a float division and
    /// the conversions around it cost ~20 instructions each, and it runs three times a launch).
    inverse: u64,
    /// The clock: the process' own, or the group's in the quota file.
    clock: &'static AtomicU64,
    /// Estimated nanoseconds of the work launched and not measured yet.
    outstanding: AtomicU64,
    /// Launches admitted and not settled (measured or charged).
    in_flight: AtomicUsize,
    /// Entries in `pending` (a measurement with nothing queued takes no lock).
    queued: AtomicUsize,
    /// The next entry's `seq`.
    next_seq: AtomicU64,
    /// Measurements under way (an entry out of the queue, its events being queried).
    measuring: AtomicUsize,
    /// A running mean of the measured work's nanoseconds per launch (0: nothing measured yet).
    estimate: AtomicU64,
    pending: Bounded<VecDeque<Pending>>,
    /// Events to reuse, by context.
    pool: Bounded<Vec<(usize, Vec<usize>)>>,
    /// Where the figures are published: the live file's entry, or (null) `own`. A forked
    /// child's are its own (the entry is its parent's).
    published: AtomicPtr<live::Compute>,
    own: live::Compute,
    warned: AtomicBool,
    /// Turns with the other paced processes on the GPU (`None`: none to take).
    turns: Option<Turns>,
    /// No turns before this time (after a launch waited `turns::MAX_WAIT` for them).
    turns_off_until: AtomicU64,
    warned_turns: AtomicBool,
}

/// What [`Pacer::before_launch`] hands to [`Pacer::after_launch`].
pub struct Ticket {
    ctx: usize,
    events: Option<(usize, usize)>,
    estimate: u64,
}

impl Pacer {
    /// A pacer for `share` of the device (0 < share < 1), with `clock` (the group's, or a fresh
    /// one) and its figures' published entry (`None`: its own).
    /// `turn`: the GPU's claim word shared with the other paced processes on it, if any.
    pub fn new(share: f64, clock: &'static AtomicU64, published: Option<&'static live::Compute>, turn: Option<&'static AtomicU64>) -> Pacer {
        let own = live::Compute::new();
        for f in [Some(&own), published].into_iter().flatten() {
            f.limit_ppm.store(ppm(share), Relaxed);
        }
        Pacer {
            share,
            inverse: ((1u64 << 32) as f64 / share).round() as u64,
            clock,
            outstanding: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            queued: AtomicUsize::new(0),
            next_seq: AtomicU64::new(0),
            measuring: AtomicUsize::new(0),
            estimate: AtomicU64::new(0),
            pending: Bounded::new("gpushim's queue of unmeasured launches", VecDeque::new()),
            pool: Bounded::new("gpushim's pool of pacing events", Vec::new()),
            published: AtomicPtr::new(published.map_or(std::ptr::null_mut(), |p| p as *const live::Compute as *mut live::Compute)),
            own,
            warned: AtomicBool::new(false),
            turns: turn.map(Turns::new),
            turns_off_until: AtomicU64::new(0),
            warned_turns: AtomicBool::new(false),
        }
    }

    pub fn share(&self) -> f64 {
        self.share
    }

    /// The figures: measured busy time, time waited, launches measured.
    #[inline]
    pub fn figures(&self) -> &live::Compute {
        let p = self.published.load(Relaxed);
        // SAFETY: null or the live file's entry, mapped for the life of the process.
        if p.is_null() { &self.own } else { unsafe { &*p } }
    }

    /// Pay-time of `ns` of device work.
    #[inline]
    fn pay(&self, ns: u64) -> u64 {
        let pay = (u128::from(ns) * u128::from(self.inverse)) >> 32;
        u64::try_from(pay).unwrap_or(u64::MAX)
    }

    /// Waits until a launch may go, then records the `before` event on `stream` (the stream
    /// the launch's events go on: the per-thread default stream written as
    /// `CU_STREAM_PER_THREAD`). To be followed by [`Pacer::after_launch`].
    pub fn before_launch(&self, api: &EventApi, stream: CUstream) -> Ticket {
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        let ctx = if unsafe { (api.current)(&mut ctx) } == CUDA_SUCCESS { ctx as usize } else { 0 };
        let mut reuse = None;
        let estimate = self.wait_turn(api, ctx, &mut reuse);
        if ctx == 0 {
            return Ticket { ctx: 0, events: None, estimate };
        }
        let Some((before, after)) = reuse.or_else(|| self.take_events(api, ctx)) else { return Ticket { ctx, events: None, estimate } };
        // SAFETY: our event, of the current context; the program's stream passed as given.
        if unsafe { (api.record)(before as CUevent, stream) } != CUDA_SUCCESS {
            self.give_back(ctx, &[before, after]);
            return Ticket { ctx, events: None, estimate };
        }
        Ticket { ctx, events: Some((before, after)), estimate }
    }

    /// A launch leaves the flight (measured, or charged without measuring); the last one lets
    /// go of the GPU's turn.
    fn leave_flight(&self, estimate: u64) {
        let _ = self.outstanding.fetch_update(Relaxed, Relaxed, |o| Some(o.saturating_sub(estimate)));
        if let Ok(1) = self.in_flight.fetch_update(SeqCst, Relaxed, |n| Some(n.saturating_sub(1))) {
            if let Some(t) = &self.turns {
                t.release_if(|| self.in_flight.load(SeqCst) == 0);
            }
        }
    }

    /// After the launch: records `after` and queues the work for measuring; a launch the
    /// driver refused costs nothing.
    pub fn after_launch(&self, api: &EventApi, stream: CUstream, ticket: Ticket, launched: bool) {
        let unmeasured = |this: &Pacer| {
            this.leave_flight(ticket.estimate);
            if launched {
                // (not measurable: charged the estimate, or a millisecond before any is known)
                this.charge(if ticket.estimate == 0 { 1_000_000 } else { ticket.estimate }, now_ns());
            }
        };
        let Some((before, after)) = ticket.events else { return unmeasured(self) };
        // SAFETY: our event; the stream as above.
        if !launched || unsafe { (api.record)(after as CUevent, stream) } != CUDA_SUCCESS {
            self.give_back(ticket.ctx, &[before, after]);
            return unmeasured(self);
        }
        let entry = Pending { seq: self.next_seq.fetch_add(1, Relaxed), ctx: ticket.ctx, before, after, estimate: ticket.estimate };
        if let Ok(mut q) = self.pending.lock() {
            q.push_back(entry);
            self.queued.fetch_add(1, Relaxed);
            return;
        }
        // (the queue's lock is stuck: charged at once, the events given back)
        self.give_back(ticket.ctx, &[before, after]);
        unmeasured(self);
    }

    /// Adds `ns` of device work that ended about `end` to the clock and the figures.
    fn charge(&self, ns: u64, end: u64) {
        let start = end.saturating_sub(ns);
        let pay = self.pay(ns);
        // (a debt is kept at most half a day ahead, so that only a clock written from outside
        // is ever past `MAX_LEAD` and reset: 864 s kernels at 1 % wait half a day, never none)
        let most = end.saturating_add(MAX_LEAD / 2);
        let _ = self.clock.fetch_update(Relaxed, Relaxed, |c| Some(c.max(start.saturating_sub(CREDIT)).saturating_add(pay).min(most.max(c))));
        let figures = self.figures();
        figures.busy_ns.fetch_add(ns, Relaxed);
        figures.launches.fetch_add(1, Relaxed);
    }

    /// Measures what has completed, oldest first, stopping at the first not complete. The
    /// events of one measured launch of context `ctx` go to `reuse` when it is empty (the
    /// launch about to go takes them: no trip through the pool); the others to the pool.
    fn measure(&self, api: &EventApi, now: u64, ctx: usize, reuse: &mut Option<(usize, usize)>) {
        // (queries run with this thread's capture mode relaxed: a global-mode capture on
        // another thread is not invalidated by them)
        let mut relaxed: Option<u32> = None;
        while self.queued.load(Relaxed) != 0 {
            self.measuring.fetch_add(1, Relaxed);
            // the oldest is looked at, and taken out only once complete (work not complete
            // yet, the common case at the queue's head, costs one lock)
            let front = self.pending.lock().map(|q| q.front().map(|p| (p.seq, p.after)));
            let Ok(Some((seq, after))) = front else {
                self.measuring.fetch_sub(1, Release);
                break;
            };
            if relaxed.is_none() {
                if let Some(exchange) = api.capture_mode {
                    let mut mode = CAPTURE_MODE_RELAXED;
                    // SAFETY: valid in-out pointer; the thread's own mode, restored below.
                    if unsafe { exchange(&mut mode) } == CUDA_SUCCESS {
                        relaxed = Some(mode);
                    }
                }
            }
            // SAFETY: our event (its context not forgotten: `forget_context` waits for the
            // measurements under way before the context goes).
            let state = unsafe { (api.query)(after as CUevent) };
            if state == CUDA_ERROR_NOT_READY {
                self.measuring.fetch_sub(1, Release);
                break;
            }
            // (another thread may have taken it meanwhile: then on to the next)
            let taken = self.pending.lock().map(|mut q| {
                let ours = q.front().is_some_and(|p| p.seq == seq);
                ours.then(|| q.pop_front()).flatten().inspect(|_| {
                    self.queued.fetch_sub(1, Relaxed);
                })
            });
            let Ok(Some(entry)) = taken else {
                self.measuring.fetch_sub(1, Release);
                continue;
            };
            let mut ms: c_float = 0.0;
            // SAFETY: our events, both recorded; valid out-pointer.
            let took = (state == CUDA_SUCCESS && unsafe { (api.elapsed)(&mut ms, entry.before as CUevent, entry.after as CUevent) } == CUDA_SUCCESS)
                .then(|| (f64::from(ms.max(0.0)) * 1e6) as u64);
            let events = self.settle(&entry, took, now);
            if reuse.is_none() && entry.ctx == ctx {
                *reuse = Some(events);
            } else {
                self.give_back(entry.ctx, &[events.0, events.1]);
            }
            // (only now: `forget_context` waits for this before it clears the pool, so that
            // the events are found there, not put back after it; Release: pairs with its
            // Acquire load, so the pool's lock is taken there after `give_back` let it go)
            self.measuring.fetch_sub(1, Release);
        }
        if let (Some(exchange), Some(mut mode)) = (api.capture_mode, relaxed) {
            // SAFETY: restores the thread's mode exchanged above.
            unsafe { exchange(&mut mode) };
        }
    }

    /// Moves a measured launch from the estimate to the clock (`None`: its events failed, it is
    /// charged its estimate); returns its events, free again.
    fn settle(&self, entry: &Pending, took: Option<u64>, now: u64) -> (usize, usize) {
        self.leave_flight(entry.estimate);
        let ns = took.unwrap_or(entry.estimate.max(1));
        if took.is_some() {
            let old = self.estimate.load(Relaxed);
            let new = if old == 0 { ns.max(1) } else { (old - old / 8 + ns / 8).max(1) };
            self.estimate.store(new, Relaxed);
        }
        self.charge(ns, now);
        (entry.before, entry.after)
    }

    /// Sleeps until the clock allows a launch, then admits it (counts it in flight, its
    /// estimate outstanding, in one step each, so that threads launching at once cannot all
    /// pass on the same room): returns its estimate.
    fn wait_turn(&self, api: &EventApi, ctx: usize, reuse: &mut Option<(usize, usize)>) -> u64 {
        let first = now_ns();
        let mut now = first;
        // once the clock made this thread wait: the time it waits for (a burst's worth paid)
        let mut resume = 0u64;
        // looks in a row that found the most launches in flight
        let mut room_waits = 0u32;
        // time slept for other processes' turns
        let mut turn_waited = 0u64;
        loop {
            self.measure(api, now, ctx, reuse);
            if self.clock.load(Relaxed) > now.saturating_add(MAX_LEAD) {
                self.clock.store(now, Relaxed);
                log!(Level::Warn, "compute limit: the pacing clock was more than a day ahead (a corrupt shared quota file?); reset");
            }
            let estimate = self.estimate.load(Relaxed);
            // (before the first measurement nothing is known of the kernels: one at a time)
            let cap = if estimate != 0 { MAX_IN_FLIGHT } else { 1 };
            let room = self.in_flight.load(Relaxed) < cap;
            let due = self.clock.load(Relaxed).saturating_add(self.pay(self.outstanding.load(Relaxed)));
            let paid = due <= now.saturating_add(AHEAD);
            // (the GPU's turns: waited for while another paced process' work is in the GPU,
            // at most `turns::MAX_WAIT` in all; after such a wait, none for `turns::PAUSE`)
            if turn_waited >= turns::MAX_WAIT {
                self.give_up_turns(now);
            }
            let turns = self.turns.as_ref().filter(|_| turn_waited < turns::MAX_WAIT && now >= self.turns_off_until.load(Relaxed));
            // (when another's claim holds: until when)
            let mut others = None;
            if room && paid && now >= resume {
                // admitted if the room and the clock still hold once counted, and this process
                // can claim the GPU
                if self.in_flight.fetch_update(SeqCst, Relaxed, |n| (n < cap).then_some(n + 1)).is_ok() {
                    let clock = self.clock.load(Relaxed);
                    let counted = self.outstanding.fetch_update(Relaxed, Relaxed, |o| {
                        (clock.saturating_add(self.pay(o)) <= now.saturating_add(AHEAD)).then_some(o.saturating_add(estimate))
                    });
                    if counted.is_ok() {
                        match turns {
                            Some(t) if !t.claim(now, estimate) => others = t.others_until(now),
                            _ => {
                                self.count_wait(now - first);
                                return estimate;
                            }
                        }
                        let _ = self.outstanding.fetch_update(Relaxed, Relaxed, |o| Some(o.saturating_sub(estimate)));
                    }
                    let _ = self.in_flight.fetch_update(Relaxed, Relaxed, |n| Some(n.saturating_sub(1)));
                }
                if others.is_none() {
                    continue;
                }
            }
            if !room && now.saturating_sub(first) >= MAX_WAIT.as_nanos() as u64 {
                if !self.warned.swap(true, Relaxed) {
                    log!(Level::Warn, "compute limit: a launch waited {} s for the device's earlier work to complete; letting it go", MAX_WAIT.as_secs());
                }
                self.in_flight.fetch_add(1, Relaxed);
                self.outstanding.fetch_add(estimate, Relaxed);
                self.count_wait(now - first);
                return estimate;
            }
            let sleep = if !room {
                // earlier work still running: look again once about half of it may be done,
                // less the ~50 µs a sleep overshoots by (the kernel's timer slack): kernels of
                // 10 µs drain sixteen launches in 160 µs, and a fixed 200 µs would leave the
                // device idle; doubled at each look that found nothing done (kernels that
                // grew), and 200 µs before anything is known of them
                let half = if estimate == 0 { ROOM_SLEEP } else { (estimate.saturating_mul(cap as u64) / 2).saturating_sub(SLACK) };
                let sleep = half.clamp(10_000, ROOM_SLEEP).saturating_mul(1 << room_waits.min(5)).min(ROOM_SLEEP);
                room_waits += 1;
                sleep
            } else if !paid || now < resume {
                if !paid {
                    resume = due.saturating_sub(AHEAD).saturating_add(BURST);
                }
                resume.saturating_sub(now).min(STEP)
            } else {
                // another process' turn: until its claim ends
                let sleep = others.map_or(0, |until| until.saturating_sub(now)).clamp(10_000, STEP);
                turn_waited += sleep;
                sleep
            };
            if let Some((before, after)) = reuse.take() {
                // (not held across a sleep: a context forgotten meanwhile finds them in the pool)
                self.give_back(ctx, &[before, after]);
            }
            std::thread::sleep(Duration::from_nanos(sleep.max(10_000)));
            now = now_ns();
        }
    }

    /// A launch waited `turns::MAX_WAIT` for other processes' claims (a stuck or hostile claim
    /// word): turns are off for `turns::PAUSE`, with one warning.
    #[cold]
    fn give_up_turns(&self, now: u64) {
        self.turns_off_until.store(now.saturating_add(turns::PAUSE), Relaxed);
        if !self.warned_turns.swap(true, Relaxed) {
            log!(Level::Warn, "compute limit: a launch waited {} s for other processes' turns on the GPU; taking no turns for {} s (is a claim in the registry file stuck?)", turns::MAX_WAIT / 1_000_000_000, turns::PAUSE / 1_000_000_000);
        }
    }

    fn count_wait(&self, waited: u64) {
        if waited > 50_000 {
            self.figures().throttled_ns.fetch_add(waited, Relaxed);
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
        let gone: Vec<Pending> = match self.pending.lock() {
            Ok(mut q) => {
                let (gone, kept): (Vec<Pending>, Vec<Pending>) = q.drain(..).partition(|p| p.ctx == ctx);
                q.extend(kept);
                self.queued.store(q.len(), Relaxed);
                gone
            }
            Err(_) => Vec::new(),
        };
        // (a measurement that took one of its entries out before: a bounded wait for it)
        let mut backoff = gpushim_common::bounded::Backoff::within(Duration::from_millis(200));
        // (Acquire: pairs with `measure`'s Release decrement, after its events went back)
        while self.measuring.load(Acquire) != 0 && backoff.wait() {}
        // (after the wait: a measurement under way puts its events back in the pool)
        if let Ok(mut pool) = self.pool.lock() {
            pool.retain_mut(|(c, free)| {
                if *c == ctx {
                    events.append(free);
                }
                *c != ctx
            });
        }
        for p in gone {
            self.leave_flight(p.estimate);
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

    /// In a forked child: the parent's events and queue mean nothing here, and its published
    /// figures are the parent's: the child counts its own, from zero.
    pub fn reset_after_fork(&self) {
        self.published.store(std::ptr::null_mut(), Relaxed);
        for f in [&self.own.busy_ns, &self.own.throttled_ns, &self.own.launches] {
            f.store(0, Relaxed);
        }
        self.pending.reset_after_fork(VecDeque::new());
        self.pool.reset_after_fork(Vec::new());
        self.outstanding.store(0, Relaxed);
        self.in_flight.store(0, Relaxed);
        self.queued.store(0, Relaxed);
        self.measuring.store(0, Relaxed);
        if let Some(t) = &self.turns {
            t.reset_after_fork();
        }
    }
}
