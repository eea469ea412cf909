//! Simulated time: when each stream operation starts and ends, per stream and per physical
//! device (a device executes this process' work serially, in submission order), the
//! queue-depth limit, the waits of synchronisation calls, and this process' busy record
//! (README "Time").
//!
//! Times are this process' *solo* clock of the device (`clock(p)`): CLOCK_MONOTONIC
//! nanoseconds, less the time the process has waited while other processes had the device
//! (`arbiter`; without node state the two are the same). An operation submitted at solo time
//! `now` on stream `s` of physical device `p` starts at `max(now, tail(s), busy_until(p), deps)`
//! and ends at start + duration; then `tail(s) = end` and, for a kernel, `busy_until(p) = end`
//! (this process' own lane of the device). All state is behind one mutex that is never held
//! while sleeping.

use crate::context::Ctx;
use crate::types::*;
use gpusim_common::busy;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// The longest a kernel takes (`GPUSIM_KERNEL_NS` and `gpusim_busy` durations are capped).
pub const MAX_KERNEL_NS: u64 = 60_000_000_000;
/// The longest one synchronisation call waits (then it returns as if done).
const MAX_WAIT_NS: u64 = 600_000_000_000;
/// Step of every sleep.
const STEP_NS: u64 = 2_000_000;
/// Size of a bucket of the per-process busy timeline, and the timeline's cap (1 hour).
pub const BUCKET_NS: u64 = 10_000_000;
const MAX_BUCKETS: usize = 360_000;

/// CLOCK_MONOTONIC, ns.
pub fn now() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid out-pointer; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// This process' solo clock of physical device `p`, and whether it is waiting for the device
/// (another process has it while this one's next kernel is due): CLOCK_MONOTONIC less the
/// time waited (`arbiter`), or CLOCK_MONOTONIC itself when the device is not arbitrated.
pub fn clock_full(p: usize) -> (u64, bool) {
    // (a device shared with others whose schedule cannot be read now, its lock held for 10 s
    // or all its entries taken: the last known wait, so that the clock never jumps)
    crate::arbiter::clock(p).unwrap_or_else(|| (now().saturating_sub(crate::arbiter::waited(p)), false))
}

/// This process' solo clock of physical device `p` (see `clock_full`).
pub fn clock(p: usize) -> u64 {
    clock_full(p).0
}

/// Sleeps until device `p`'s solo clock reaches `t` and `done` says so (polled every
/// `STEP_NS / 4` from `t` on), at most `MAX_WAIT_NS`.
pub fn sleep_until(p: usize, t: u64, mut done: impl FnMut() -> bool) {
    let deadline = now().saturating_add(MAX_WAIT_NS);
    let arbitrated = crate::arbiter::on(p);
    loop {
        let (n, c) = (now(), clock(p));
        if (c >= t && done()) || n >= deadline {
            return;
        }
        // (before `t` nothing can end the wait: one sleep to `t`, as the real driver's
        // blocking wait wakes once the work completes; after it, `done` is polled; a device
        // shared with other processes may make this one wait longer: looked at every step)
        let mut left = if c >= t { STEP_NS / 4 } else { (t - c).min(deadline - n) };
        if arbitrated {
            left = left.min(STEP_NS);
        }
        std::thread::sleep(std::time::Duration::from_nanos(left));
    }
}

/// An event's stamp: the physical device, the solo time the stream reached it, and, for an
/// event submitted right before a kernel of its stream (nothing else between them), that
/// kernel's solo start (0: none): such an event is reached when its context gets the device for
/// that kernel, after any wait of the kernel's for the device (README "Time").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub p: usize,
    pub t: u64,
    pub with: u64,
}

const STAMP_TIME: u64 = (1 << 56) - 1;

impl Stamp {
    /// The word of device and time.
    pub fn pack(self) -> u64 {
        ((self.p.min(255) as u64) << 56) | (self.t.max(1) & STAMP_TIME)
    }
    pub fn unpack(w: u64, with: u64) -> Option<Stamp> {
        (w != 0).then_some(Stamp { p: (w >> 56) as usize, t: w & STAMP_TIME, with })
    }
    /// Whether the device has reached it (one that goes with a kernel on a device shared with
    /// other processes: once that kernel has started, its wait for the device over).
    pub fn reached(self) -> bool {
        let (c, waiting) = clock_full(self.p);
        if self.with != 0 && crate::arbiter::on(self.p) {
            c > self.with || (c == self.with && !waiting)
        } else {
            c >= self.t
        }
    }
    /// Its real time (CLOCK_MONOTONIC ns).
    pub fn real(self) -> u64 {
        if crate::arbiter::on(self.p) {
            crate::arbiter::real(self.p, self.t, self.with)
        } else {
            self.t
        }
    }
    /// Its time on device `p`'s solo clock (approximate for another device's stamp not
    /// reached yet).
    pub fn on(self, p: usize) -> u64 {
        if self.p == p {
            self.t
        } else {
            self.real().saturating_sub(crate::arbiter::waited(p))
        }
    }
}

fn env_u64(name: &str, default: u64, max: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => match v.trim().parse::<u64>() {
            Ok(n) => n.min(max),
            Err(_) => {
                crate::ffi::trace_line(&format!("{}: {name}={v:?} is not a number; using {default}\n", crate::config::PREFIX));
                default
            }
        },
        _ => default,
    }
}

/// `GPUSIM_KERNEL_NS`: the duration of every kernel not named `gpusim_busy*` (default 0).
pub fn kernel_ns() -> u64 {
    static V: OnceLock<u64> = OnceLock::new();
    *V.get_or_init(|| env_u64("GPUSIM_KERNEL_NS", 0, MAX_KERNEL_NS))
}

/// `GPUSIM_QUEUE_DEPTH`: the most uncompleted operations a stream holds (default 1024, ≥ 1).
pub fn queue_depth() -> usize {
    let d = DEPTH.load(Ordering::Relaxed);
    if d != 0 {
        return d;
    }
    let d = env_u64("GPUSIM_QUEUE_DEPTH", 1024, 1 << 20).max(1) as usize;
    let _ = DEPTH.compare_exchange(0, d, Ordering::Relaxed, Ordering::Relaxed);
    DEPTH.load(Ordering::Relaxed)
}

/// `GPUSIM_TIMESLICE_NS`: how far ahead of the device one process' work may be queued while
/// another process has work on the same device (default 2 ms; see `submit`).
pub fn timeslice_ns() -> u64 {
    static V: OnceLock<u64> = OnceLock::new();
    *V.get_or_init(|| env_u64("GPUSIM_TIMESLICE_NS", 2_000_000, MAX_KERNEL_NS).max(1))
}

/// `GPUSIM_SWITCH_NS`: what a switch between two processes' work costs the device when the
/// process it leaves still has work due (a time slice ended): default 200 µs, so that two
/// processes running 1 ms kernels flat out with the default 2 ms slice do 91 % of one process'
/// work together, as two did on an H100 (README "Time").
pub fn switch_ns() -> u64 {
    static V: OnceLock<u64> = OnceLock::new();
    *V.get_or_init(|| env_u64("GPUSIM_SWITCH_NS", 200_000, MAX_KERNEL_NS))
}

/// `GPUSIM_QUEUE_DEPTH` once read (0: not yet); tests set it.
static DEPTH: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

#[cfg(test)]
pub fn set_queue_depth(d: usize) {
    DEPTH.store(d, Ordering::Relaxed);
}

/// A stream as time sees it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Key {
    /// The legacy default stream (NULL, `0x1`) of a context.
    Legacy(u64),
    /// The per-thread default stream (`0x2`, NULL in `_ptsz` calls) of (context, thread).
    PerThread(u64, u64),
    /// A created stream (its handle).
    Created(usize),
}

/// Where an operation goes: the stream, its context, whether it synchronises with the legacy
/// stream (blocking).
#[derive(Clone, Copy)]
pub struct Target {
    pub key: Key,
    pub ctx: &'static Ctx,
    pub blocking: bool,
}

fn thread_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local!(static ID: u64 = NEXT.fetch_add(1, Ordering::Relaxed));
    ID.with(|i| *i)
}

/// The stream `s` names; `ptsz`: the call is a `_ptsz` variant (NULL = per-thread stream).
pub fn target(s: CUstream, ptsz: bool) -> Res<Target> {
    match crate::streams::lookup(s)? {
        Some(st) if st.ctx.is_alive() => Ok(Target { key: Key::Created(s as usize), ctx: st.ctx, blocking: st.flags & 1 == 0 }),
        Some(_) => Err(CUDA_ERROR_INVALID_CONTEXT),
        None => {
            let ctx = crate::context::current()?;
            let per_thread = s as usize == crate::streams::STREAM_PER_THREAD || (s.is_null() && ptsz);
            let key = if per_thread { Key::PerThread(ctx.id, thread_id()) } else { Key::Legacy(ctx.id) };
            Ok(Target { key, ctx, blocking: true })
        }
    }
}

#[derive(Default)]
struct StreamTime {
    tail: u64,
    ctx: u64,
    blocking: bool,
    /// End times of operations not completed when submitted (oldest first).
    pending: VecDeque<u64>,
    /// Host functions submitted, not returned yet.
    host_pending: u32,
    /// Events recorded since the stream's last operation (their stamp word, its value, their
    /// `with` word): if the next operation is a kernel, they go with it (`Stamp::with`).
    floating: Vec<(&'static AtomicU64, u64, &'static AtomicU64, u64)>,
}

#[derive(Default)]
struct CtxTime {
    legacy_tail: u64,
    /// Latest end on a blocking stream (created blocking streams, per-thread streams).
    blocking_tail: u64,
    /// Latest end on any stream of the context.
    max_end: u64,
    host_pending: u32,
}

#[derive(Default)]
struct State {
    streams: HashMap<Key, StreamTime>,
    ctxs: HashMap<u64, CtxTime>,
}

fn state() -> MutexGuard<'static, State> {
    static S: OnceLock<Mutex<State>> = OnceLock::new();
    S.get_or_init(|| Mutex::new(State::default())).lock().unwrap_or_else(|e| e.into_inner())
}


/// Operations this process submitted per physical device (events go with a kernel only when
/// nothing else was submitted between them).
static OPS: [AtomicU64; busy::MAX_DEVICES] = [const { AtomicU64::new(0) }; busy::MAX_DEVICES];

/// `busy_until` per physical device: when this process' kernels on it end (solo time).
static LOCAL_BUSY: [AtomicU64; busy::MAX_DEVICES] = [const { AtomicU64::new(0) }; busy::MAX_DEVICES];

fn busy_cell(p: usize) -> &'static AtomicU64 {
    &LOCAL_BUSY[p.min(busy::MAX_DEVICES - 1)]
}

/// The device's start for an operation ready at `ready`: for a kernel of `dur` > 0 the device
/// is reserved (`busy_until` = its end) by compare-and-swap.
fn device_start(p: usize, ready: u64, dur: u64, kernel: bool) -> u64 {
    let cell = busy_cell(p);
    let mut bu = cell.load(Ordering::Acquire);
    loop {
        let start = ready.max(bu);
        if !kernel || dur == 0 {
            return start;
        }
        match cell.compare_exchange_weak(bu, start + dur, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return start,
            Err(cur) => bu = cur,
        }
    }
}

/// What an operation is.
#[derive(Clone, Copy)]
pub struct Op {
    pub dur: u64,
    pub kernel: bool,
    /// Earliest start besides the stream and the device (`cuStreamWaitEvent`'s event).
    pub after: u64,
    /// A launch: waits while the stream holds `GPUSIM_QUEUE_DEPTH` uncompleted operations.
    pub launch: bool,
    /// A host function: counted pending until `host_done`.
    pub host: bool,
}

impl Op {
    pub fn kernel(dur: u64) -> Op {
        Op { dur, kernel: true, after: 0, launch: true, host: false }
    }
    pub fn mark() -> Op {
        Op { dur: 0, kernel: false, after: 0, launch: false, host: false }
    }
}

fn schedule_locked(st: &mut State, t: &Target, op: Op, now: u64) -> (u64, u64) {
    let ct = st.ctxs.entry(t.ctx.id).or_default();
    let (legacy_tail, blocking_tail) = (ct.legacy_tail, ct.blocking_tail);
    let s = st.streams.entry(t.key).or_default();
    s.ctx = t.ctx.id;
    s.blocking = t.blocking;
    let mut ready = now.max(s.tail).max(op.after);
    match t.key {
        Key::Legacy(_) => ready = ready.max(blocking_tail),
        _ if t.blocking => ready = ready.max(legacy_tail),
        _ => {}
    }
    // A host function runs when its stream reaches it, whatever the device does for others.
    let start = if op.host { ready } else { device_start(t.ctx.physical, ready, op.dur, op.kernel) };
    let end = start + op.dur;
    // Events submitted right before a kernel of their stream go with it.
    // (only with nothing else submitted to the device in between: the kernel then starts
    // where the device reached the event, give or take the time between the two calls)
    let ops = OPS[t.ctx.physical.min(busy::MAX_DEVICES - 1)].fetch_add(1, Ordering::Relaxed);
    for (cell, was, with, after) in std::mem::take(&mut s.floating) {
        if op.kernel && op.dur > 0 && ops == after && cell.load(Ordering::Acquire) == was {
            with.store(start.max(1), Ordering::Release);
        }
    }
    s.tail = s.tail.max(end);
    if end > now {
        s.pending.push_back(end);
    }
    if op.host {
        s.host_pending += 1;
    }
    let ct = st.ctxs.entry(t.ctx.id).or_default();
    match t.key {
        Key::Legacy(_) => ct.legacy_tail = ct.legacy_tail.max(end),
        _ if t.blocking => ct.blocking_tail = ct.blocking_tail.max(end),
        _ => {}
    }
    ct.max_end = ct.max_end.max(end);
    if op.host {
        ct.host_pending += 1;
    }
    (start, end)
}

/// Submits `op` to `t`: returns its (start, end), solo times of the stream's device. A launch
/// first waits (sleeping, no lock held) while the stream holds `GPUSIM_QUEUE_DEPTH`
/// uncompleted operations, or while this process' queue of kernels on a device shared with
/// other processes is full (`arbiter::RING`).
pub fn submit(t: &Target, op: Op) -> (u64, u64) {
    let depth = queue_depth();
    let p = t.ctx.physical;
    let deadline = now().saturating_add(MAX_WAIT_NS);
    let timed = op.kernel && op.dur > 0;
    loop {
        let n = clock(p);
        let wait_for = {
            let mut st = state();
            let s = st.streams.entry(t.key).or_default();
            while s.pending.front().is_some_and(|&e| e <= n) {
                s.pending.pop_front();
            }
            let late = now() >= deadline;
            if !op.launch || s.pending.len() < depth || late {
                if timed {
                    // (on a device shared with other processes: timed from the solo clock read
                    // under the arbitration lock, and published under the same hold)
                    match crate::arbiter::publish_with(p, |solo| schedule_locked(&mut st, t, op, solo)) {
                        Some(Some(r)) => return r,
                        Some(None) if !late => {
                            // (this process' queue of kernels on the device is full)
                            drop(st);
                            std::thread::sleep(std::time::Duration::from_nanos(STEP_NS / 4));
                            continue;
                        }
                        _ => {}
                    }
                    let r = schedule_locked(&mut st, t, op, n);
                    record_local(p, r.0, r.1);
                    return r;
                }
                return schedule_locked(&mut st, t, op, n);
            }
            s.pending[s.pending.len() - depth]
        };
        sleep_until(p, wait_for, || true);
    }
}

/// `cuEventRecord`: stamps `cell` with the time the stream reaches the event (when the
/// stream's own earlier work ends; at once on an idle stream), and `with` with 0 until a kernel
/// is submitted right after it on the stream (see `Stamp`).
pub fn submit_event(t: &Target, cell: &'static AtomicU64, with: &'static AtomicU64) {
    let p = t.ctx.physical;
    let n = clock(p);
    let tail = state().streams.get(&t.key).map_or(0, |s| s.tail);
    let (at, _) = submit(t, Op::mark());
    let at = if tail > n { tail.max(n).min(at) } else { at };
    let word = Stamp { p, t: at, with: 0 }.pack();
    with.store(0, Ordering::Release);
    cell.store(word, Ordering::Release);
    let mut st = state();
    if let Some(s) = st.streams.get_mut(&t.key) {
        s.floating.push((cell, word, with, OPS[p.min(busy::MAX_DEVICES - 1)].load(Ordering::Relaxed)));
    }
}

/// A host function submitted to `key` has returned at `at`: later work waits for it.
pub fn host_done(key: Key, ctx: u64, at: u64) {
    let mut st = state();
    let mut blocking = false;
    if let Some(s) = st.streams.get_mut(&key) {
        s.host_pending = s.host_pending.saturating_sub(1);
        s.tail = s.tail.max(at);
        blocking = s.blocking;
    }
    if let Some(c) = st.ctxs.get_mut(&ctx) {
        c.host_pending = c.host_pending.saturating_sub(1);
        c.max_end = c.max_end.max(at);
        match key {
            Key::Legacy(_) => c.legacy_tail = c.legacy_tail.max(at),
            _ if blocking => c.blocking_tail = c.blocking_tail.max(at),
            _ => {}
        }
    }
}

/// When stream `t` is done (the legacy stream: with every blocking stream of its context), and
/// whether host functions are pending on it.
fn stream_done_at(t: &Target) -> (u64, bool) {
    let st = state();
    let s = st.streams.get(&t.key);
    let mut tail = s.map_or(0, |s| s.tail);
    let mut host = s.is_some_and(|s| s.host_pending > 0);
    if let Key::Legacy(c) = t.key {
        if let Some(ct) = st.ctxs.get(&c) {
            tail = tail.max(ct.blocking_tail);
            host |= ct.host_pending > 0 && st.streams.values().any(|s| s.host_pending > 0 && s.blocking && s.ctx == c);
        }
    }
    (tail, host)
}

/// `cuStreamQuery`: done?
pub fn stream_query(t: &Target) -> bool {
    let (tail, host) = stream_done_at(t);
    !host && clock(t.ctx.physical) >= tail
}

/// `cuStreamSynchronize`: sleeps until the stream is done.
pub fn stream_sync(t: &Target) {
    let (tail, _) = stream_done_at(t);
    let p = t.ctx.physical;
    sleep_until(p, tail, || {
        let (tail, host) = stream_done_at(t);
        !host && clock(p) >= tail
    });
}

fn ctx_done_at(ctx: u64, legacy_only: bool) -> (u64, bool) {
    let st = state();
    st.ctxs.get(&ctx).map_or((0, false), |c| {
        if legacy_only {
            (c.legacy_tail.max(c.blocking_tail), false)
        } else {
            (c.max_end, c.host_pending > 0)
        }
    })
}

/// `cuCtxSynchronize`: sleeps until every stream of the context is done.
pub fn ctx_sync(ctx: &Ctx) {
    let (id, p) = (ctx.id, ctx.physical);
    let (end, _) = ctx_done_at(id, false);
    sleep_until(p, end, || {
        let (end, host) = ctx_done_at(id, false);
        !host && clock(p) >= end
    });
}

/// Synchronous copies and memsets: wait for the current context's legacy stream and blocking
/// streams (as a legacy-stream operation followed by a wait).
pub fn sync_copy() {
    let Ok(ctx) = crate::context::current() else { return };
    let (end, _) = ctx_done_at(ctx.id, true);
    if end > clock(ctx.physical) {
        sleep_until(ctx.physical, end, || true);
    }
}

/// An asynchronous copy or memset: a zero-duration operation of its stream (an unknown stream
/// is `CUDA_ERROR_INVALID_HANDLE`; a default stream without a current context takes no time).
pub fn async_op(s: CUstream, ptsz: bool) -> Res {
    crate::streams::lookup(s)?;
    if let Ok(t) = target(s, ptsz) {
        submit(&t, Op::mark());
    }
    Ok(())
}

// ---- the busy record ---------------------------------------------------------------------------

#[derive(Default)]
struct DevBusy {
    used: bool,
    busy_ns: u64,
    buckets: Vec<u64>,
}

fn busy_record() -> MutexGuard<'static, Vec<DevBusy>> {
    static B: OnceLock<Mutex<Vec<DevBusy>>> = OnceLock::new();
    B.get_or_init(|| Mutex::new((0..busy::MAX_DEVICES).map(|_| DevBusy::default()).collect())).lock().unwrap_or_else(|e| e.into_inner())
}

static ORIGIN: OnceLock<u64> = OnceLock::new();

/// The origin of the busy timeline: the process' first `cuInit`.
pub fn origin() -> u64 {
    *ORIGIN.get_or_init(now)
}

/// Adds the kernel `[start, end)` (real times) to this process' record of device `p`: at
/// submission on a device of its own, when it starts on one shared with other processes
/// (`arbiter`, which also adds it to the node's record).
pub fn record_local(p: usize, start: u64, end: u64) {
    let o = origin();
    let mut r = busy_record();
    if let Some(d) = r.get_mut(p) {
        d.used = true;
        d.busy_ns += end - start;
        let mut t = start.max(o);
        while t < end {
            let i = ((t - o) / BUCKET_NS) as usize;
            if i >= MAX_BUCKETS {
                break;
            }
            let b_end = o + (i as u64 + 1) * BUCKET_NS;
            let piece = end.min(b_end) - t;
            if d.buckets.len() <= i {
                d.buckets.resize(i + 1, 0);
            }
            d.buckets[i] += piece;
            t += piece;
        }
    }
}

/// Marks device `p` used by this process (a kernel of zero duration).
pub fn mark_used(p: usize) {
    if let Some(d) = busy_record().get_mut(p) {
        d.used = true;
    }
}

/// Adds the kernel `[start, end)` (real times) to entry `e` of device `p` in the node state
/// (the arbiter, when the kernel starts).
pub fn node_record(node: &crate::node::Node, p: usize, e: usize, start: u64, end: u64, now: u64) {
    let base = (busy::DEV_HEADER + e * busy::ENTRY_SIZE) / 8;
    for (ep, ns) in busy::split(start, end, now) {
        let Some(cell) = node.time_word(p, base + 2 + (ep as usize % busy::NBUCKETS)) else { return };
        let mut w = cell.load(Ordering::Acquire);
        while let Some(new) = busy::add(w, ep, ns) {
            match cell.compare_exchange_weak(w, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(x) => w = x,
            }
        }
        if let Some(last) = node.time_word(p, base + 1) {
            last.fetch_max(ep, Ordering::AcqRel);
        }
    }
}

/// The report's `"busy"` array: devices this process launched kernels on.
pub fn busy_json() -> String {
    // (the starts of kernels on shared devices not read back yet)
    let used: Vec<usize> = busy_record().iter().enumerate().filter(|(_, d)| d.used).map(|(p, _)| p).collect();
    for p in used {
        if crate::arbiter::on(p) {
            crate::arbiter::clock(p);
        }
    }
    let o = ORIGIN.get().copied().unwrap_or(0);
    let r = busy_record();
    let items: Vec<String> = r
        .iter()
        .enumerate()
        .filter(|(_, d)| d.used)
        .map(|(p, d)| {
            let b: Vec<String> = d.buckets.iter().map(|n| n.to_string()).collect();
            format!("{{\"device\":{p},\"busy_ns\":{},\"origin_ns\":{o},\"bucket_ns\":{BUCKET_NS},\"buckets\":[{}]}}", d.busy_ns, b.join(","))
        })
        .collect();
    format!("[{}]", items.join(","))
}

#[cfg(test)]
#[path = "timeline_tests.rs"]
mod tests;
