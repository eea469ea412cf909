//! Simulated time: when each stream operation starts and ends, per stream and per physical
//! device (a device executes work serially, in submission order), the queue-depth limit, the
//! waits of synchronisation calls, and this process' busy record (README "Time").
//!
//! Times are CLOCK_MONOTONIC nanoseconds. An operation submitted at `now` on stream `s` of
//! physical device `p` starts at `max(now, tail(s), busy_until(p), deps)` and ends at start +
//! duration; then `tail(s) = end` and, for a kernel, `busy_until(p) = end`. `busy_until` lives
//! in the node state file when `GPUSIM_NODE_STATE` is on (compare-and-swap, shared by every
//! process), else in this process. All state is behind one mutex that is never held while
//! sleeping.

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

/// Sleeps until `now() >= t` (in steps), at most `MAX_WAIT_NS`; `also` is polled after each
/// step and ends the wait early when it says so.
pub fn sleep_until(t: u64, mut done: impl FnMut() -> bool) {
    let deadline = now().saturating_add(MAX_WAIT_NS);
    loop {
        let n = now();
        if (n >= t && done()) || n >= deadline {
            return;
        }
        let left = if n >= t { STEP_NS / 4 } else { (t - n).min(STEP_NS) };
        std::thread::sleep(std::time::Duration::from_nanos(left));
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

/// Process-local `busy_until` per physical device (without node state).
static LOCAL_BUSY: [AtomicU64; busy::MAX_DEVICES] = [const { AtomicU64::new(0) }; busy::MAX_DEVICES];

fn busy_cell(p: usize) -> &'static AtomicU64 {
    if let Some(w) = crate::node::active().and_then(|n| n.time_word(p, 0)) {
        return w;
    }
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

/// Submits `op` to `t`: returns its (start, end). A launch first waits (sleeping, no lock held)
/// while the stream holds `GPUSIM_QUEUE_DEPTH` uncompleted operations.
pub fn submit(t: &Target, op: Op) -> (u64, u64) {
    let depth = queue_depth();
    let deadline = now().saturating_add(MAX_WAIT_NS);
    loop {
        let n = now();
        let wait_for = {
            let mut st = state();
            let s = st.streams.entry(t.key).or_default();
            while s.pending.front().is_some_and(|&e| e <= n) {
                s.pending.pop_front();
            }
            if !op.launch || s.pending.len() < depth || n >= deadline {
                let r = schedule_locked(&mut st, t, op, n);
                if op.kernel && op.dur > 0 {
                    record_busy(t.ctx.physical, r.0, r.1, n);
                }
                return r;
            }
            s.pending[s.pending.len() - depth]
        };
        sleep_until(wait_for.min(deadline), || true);
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
    !host && now() >= tail
}

/// `cuStreamSynchronize`: sleeps until the stream is done.
pub fn stream_sync(t: &Target) {
    let (tail, _) = stream_done_at(t);
    sleep_until(tail, || {
        let (tail, host) = stream_done_at(t);
        !host && now() >= tail
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
    let id = ctx.id;
    let (end, _) = ctx_done_at(id, false);
    sleep_until(end, || {
        let (end, host) = ctx_done_at(id, false);
        !host && now() >= end
    });
}

/// Synchronous copies and memsets: wait for the current context's legacy stream and blocking
/// streams (as a legacy-stream operation followed by a wait).
pub fn sync_copy() {
    let Ok(ctx) = crate::context::current() else { return };
    let (end, _) = ctx_done_at(ctx.id, true);
    if end > now() {
        sleep_until(end, || true);
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

/// Adds the kernel `[start, end)` to this process' record of device `p` and to the node's.
fn record_busy(p: usize, start: u64, end: u64, now: u64) {
    let o = origin();
    {
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
    node_record(p, start, end, now);
}

/// Marks device `p` used by this process (a kernel of zero duration).
pub fn mark_used(p: usize) {
    if let Some(d) = busy_record().get_mut(p) {
        d.used = true;
    }
}

/// The node's entry of this process on device `p` (claimed at first use): word index of its
/// pid. Entries of processes idle for the ring's whole span are taken over.
fn node_record(p: usize, start: u64, end: u64, now: u64) {
    let Some(node) = crate::node::active() else { return };
    let pid = std::process::id() as u64;
    let cur = busy::epoch(now);
    let mut entry = None;
    for e in 0..busy::NPIDS {
        let base = (busy::DEV_HEADER + e * busy::ENTRY_SIZE) / 8;
        let Some(w) = node.time_word(p, base) else { return };
        if w.load(Ordering::Acquire) == pid {
            entry = Some(base);
            break;
        }
    }
    if entry.is_none() {
        for e in 0..busy::NPIDS {
            let base = (busy::DEV_HEADER + e * busy::ENTRY_SIZE) / 8;
            let (Some(w), Some(last)) = (node.time_word(p, base), node.time_word(p, base + 1)) else { return };
            let old = w.load(Ordering::Acquire);
            let stale = old == 0 || last.load(Ordering::Acquire) + (busy::NBUCKETS as u64) < cur;
            if stale && w.compare_exchange(old, pid, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                entry = Some(base);
                break;
            }
        }
    }
    let Some(base) = entry else { return };
    for (e, ns) in busy::split(start, end, now) {
        let Some(cell) = node.time_word(p, base + 2 + (e as usize % busy::NBUCKETS)) else { return };
        let mut w = cell.load(Ordering::Acquire);
        while let Some(new) = busy::add(w, e, ns) {
            match cell.compare_exchange_weak(w, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(x) => w = x,
            }
        }
        if let Some(last) = node.time_word(p, base + 1) {
            last.fetch_max(e, Ordering::AcqRel);
        }
    }
}

/// The report's `"busy"` array: devices this process launched kernels on.
pub fn busy_json() -> String {
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
