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

/// Sleeps until `now() >= t` and `done` says so (polled every `STEP_NS / 4` from `t` on), at
/// most `MAX_WAIT_NS`.
pub fn sleep_until(t: u64, mut done: impl FnMut() -> bool) {
    let deadline = now().saturating_add(MAX_WAIT_NS);
    loop {
        let n = now();
        if (n >= t && done()) || n >= deadline {
            return;
        }
        // (before `t` nothing can end the wait: one sleep to `t`, as the real driver's
        // blocking wait wakes once the work completes; after it, `done` is polled)
        let left = if n >= t { STEP_NS / 4 } else { (t - n).min(deadline - n) };
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

/// `GPUSIM_TIMESLICE_NS`: how far ahead of the device one process' work may be queued while
/// another process has work on the same device (default 2 ms; see `submit`).
pub fn timeslice_ns() -> u64 {
    static V: OnceLock<u64> = OnceLock::new();
    *V.get_or_init(|| env_u64("GPUSIM_TIMESLICE_NS", 2_000_000, MAX_KERNEL_NS).max(1))
}

/// Whether a process other than this one submitted kernels to physical device `p` in the last
/// two 100 ms epochs of the node state (never without node state).
fn others_active(p: usize, now: u64) -> bool {
    let Some(node) = crate::node::active() else { return false };
    let me = std::process::id() as u64;
    let cur = busy::epoch(now);
    (0..busy::NPIDS).any(|e| {
        let base = (busy::DEV_HEADER + e * busy::ENTRY_SIZE) / 8;
        let (Some(pid), Some(last)) = (node.time_word(p, base), node.time_word(p, base + 1)) else { return false };
        let pid = pid.load(Ordering::Acquire);
        // (`last`: the latest epoch the process wrote busy time in)
        pid != 0 && pid != me && last.load(Ordering::Acquire) + 2 > cur
    })
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
    /// Events recorded while the device worked for others (their stamp provisional): the
    /// stream's next work, if submitted before that time, moves them to its start.
    floating: Vec<(&'static AtomicU64, u64)>,
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

/// How soon after an event recorded on an idle stream the stream's next work must be submitted
/// to run right behind it (the two submitted back to back).
const FLOAT_GRACE_NS: u64 = 30_000;

/// When this process' own kernels on each physical device end (for the time slice).
static OWN_TAIL: [AtomicU64; busy::MAX_DEVICES] = [const { AtomicU64::new(0) }; busy::MAX_DEVICES];

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

/// `called`: when the program made the call (before any wait of the queue or time slice).
fn schedule_locked(st: &mut State, t: &Target, op: Op, now: u64, called: u64) -> (u64, u64) {
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
    // Events recorded on an idle stream while the device worked for another process are
    // written when this process' context next runs: right before its next work, if that comes
    // before the device would have reached them.
    for (cell, provisional) in std::mem::take(&mut s.floating) {
        if provisional.saturating_add(FLOAT_GRACE_NS) > called && cell.load(Ordering::Acquire) == provisional {
            cell.store(start.max(provisional), Ordering::Release);
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

/// Submits `op` to `t`: returns its (start, end). A launch first waits (sleeping, no lock held)
/// while the stream holds `GPUSIM_QUEUE_DEPTH` uncompleted operations.
pub fn submit(t: &Target, op: Op) -> (u64, u64) {
    let depth = queue_depth();
    let called = now();
    let deadline = called.saturating_add(MAX_WAIT_NS);
    loop {
        let n = now();
        let wait_for = {
            let mut st = state();
            let s = st.streams.entry(t.key).or_default();
            while s.pending.front().is_some_and(|&e| e <= n) {
                s.pending.pop_front();
            }
            // Time-slicing between processes: a GPU shared by several processes switches
            // between their contexts every time slice, so one process' queued work never holds
            // another's back for long. Modelled at submission (times are fixed then): while
            // another process has work on the device, a launch waits until this process' own
            // work queued on the device ends within one time slice (README "Time").
            // ... and a context keeps the device for its time slice: the kernels one process
            // submits back to back run back to back, the others' launches waiting meanwhile
            // (without it, another process' kernel could slip between two of them).
            if op.launch && op.kernel && n < deadline {
                if let Some(until) = held_by_other(t.ctx.physical, n) {
                    drop(st);
                    mark_active(t.ctx.physical, n);
                    // (to the microsecond: the device idles until then; the last 100 µs yielding)
                    sleep_until(until.saturating_sub(100_000).min(deadline), || true);
                    while now() < until.min(deadline) {
                        std::thread::yield_now();
                    }
                    continue;
                }
            }
            let slice_wait = if op.launch && op.kernel && n < deadline {
                let own = OWN_TAIL[t.ctx.physical.min(busy::MAX_DEVICES - 1)].load(Ordering::Acquire);
                (own > n.saturating_add(timeslice_ns()) && others_active(t.ctx.physical, n)).then(|| own - timeslice_ns())
            } else {
                None
            };
            if let Some(at) = slice_wait {
                drop(st);
                mark_active(t.ctx.physical, n);
                sleep_until(at.min(deadline), || true);
                continue;
            }
            if !op.launch || s.pending.len() < depth || n >= deadline {
                let r = schedule_locked(&mut st, t, op, n, called);
                if op.kernel && op.dur > 0 {
                    hold(t.ctx.physical, n, r.1);
                    OWN_TAIL[t.ctx.physical.min(busy::MAX_DEVICES - 1)].fetch_max(r.1, Ordering::AcqRel);
                    record_busy(t.ctx.physical, r.0, r.1, n);
                }
                return r;
            }
            s.pending[s.pending.len() - depth]
        };
        sleep_until(wait_for.min(deadline), || true);
    }
}

/// `cuEventRecord`: stamps `cell` with the time the stream reaches the event. An event that
/// follows the stream's own unfinished work is reached when that work ends (a time-sliced GPU
/// runs a context's commands back to back, whatever other processes queued meanwhile). One
/// recorded on an idle stream while another process' work occupies the device is written
/// when this process' context gets the device: provisionally when the device is free, moved to
/// the start of the stream's next work if that is submitted before then.
pub fn submit_event(t: &Target, cell: &'static AtomicU64) {
    let n = now();
    let tail = state().streams.get(&t.key).map_or(0, |s| s.tail);
    let (at, _) = submit(t, Op::mark());
    let at = if tail > n { tail.max(n).min(at) } else { at };
    cell.store(at.max(1), Ordering::Release);
    if tail <= n {
        let mut st = state();
        if let Some(s) = st.streams.get_mut(&t.key) {
            s.floating.push((cell, at));
        }
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
fn node_entry(node: &crate::node::Node, p: usize, now: u64) -> Option<usize> {
    let pid = std::process::id() as u64;
    let cur = busy::epoch(now);
    for e in 0..busy::NPIDS {
        let base = (busy::DEV_HEADER + e * busy::ENTRY_SIZE) / 8;
        if node.time_word(p, base)?.load(Ordering::Acquire) == pid {
            return Some(base);
        }
    }
    for e in 0..busy::NPIDS {
        let base = (busy::DEV_HEADER + e * busy::ENTRY_SIZE) / 8;
        let (w, last) = (node.time_word(p, base)?, node.time_word(p, base + 1)?);
        let old = w.load(Ordering::Acquire);
        let stale = old == 0 || last.load(Ordering::Acquire) + (busy::NBUCKETS as u64) < cur;
        if stale && w.compare_exchange(old, pid, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            return Some(base);
        }
    }
    None
}

/// The time slice's hold of device `p` in the node state: (holder pid, held until, held since).
fn hold_words(p: usize) -> Option<(&'static AtomicU64, &'static AtomicU64, &'static AtomicU64)> {
    let node = crate::node::active()?;
    Some((node.time_word(p, 2)?, node.time_word(p, 3)?, node.time_word(p, 4)?))
}

/// Until when another process holds device `p` (its time slice), if it does.
fn held_by_other(p: usize, now: u64) -> Option<u64> {
    let (holder, until, _) = hold_words(p)?;
    let until = until.load(Ordering::Acquire);
    (holder.load(Ordering::Acquire) != std::process::id() as u64 && until > now).then_some(until)
}

/// A kernel of this process on device `p` ends at `end`: it holds the device until then (and
/// a moment more, for its next launch), for at most one time slice in a row while another
/// process waits; then it lets the others have the device. (Three words written one after the
/// other: two processes taking the hold at the same instant may both run; a simulation's
/// approximation.)
fn hold(p: usize, now: u64, end: u64) {
    let Some((holder, until, since)) = hold_words(p) else { return };
    let me = std::process::id() as u64;
    if holder.load(Ordering::Acquire) == me {
        if now.saturating_sub(since.load(Ordering::Acquire)) >= timeslice_ns() && others_active(p, now) {
            until.store(0, Ordering::Release);
            return;
        }
    } else {
        holder.store(me, Ordering::Release);
        since.store(now, Ordering::Release);
    }
    until.store(end.saturating_add(FLOAT_GRACE_NS), Ordering::Release);
}

/// This process has work for device `p` now (a launch waiting for its turn): other processes
/// see it active (`others_active`) before its first kernel is recorded.
fn mark_active(p: usize, now: u64) {
    let Some(node) = crate::node::active() else { return };
    if let Some(last) = node_entry(node, p, now).and_then(|base| node.time_word(p, base + 1)) {
        last.fetch_max(busy::epoch(now), Ordering::AcqRel);
    }
}

/// Adds `[start, end)` to this process' entry of device `p` in the node state.
fn node_record(p: usize, start: u64, end: u64, now: u64) {
    let Some(node) = crate::node::active() else { return };
    let entry = node_entry(node, p, now);
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
