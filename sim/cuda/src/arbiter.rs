//! The device's time slices between processes (node state only): each process times its own
//! work on a *solo* timeline, as if it had the device to itself; the arbiter interleaves those
//! timelines on the physical device, lazily, from a node-wide record of every process' queued
//! kernels, so that a process' queued work runs when its turn comes whether or not the process
//! is on a processor then (README "Time").
//!
//! # The model
//!
//! A process `X` sees the device through its solo clock `σ_X = now − d_X`, where `d_X` is the
//! time it has waited for the device so far. Its kernels are published here as solo intervals
//! `[s, e)`, in its order. At real time `τ` the head kernel of `X` is *due* when
//! `s + d_X ≤ τ`; while it is due and does not run, `X`'s solo clock stands still at `s` (its
//! later work, its events, its host functions wait with it). The device runs one kernel at a
//! time. When it is free at `τ`:
//! - the process holding it goes on with its next kernel if that is due, unless it has held
//!   the device for a time slice (`GPUSIM_TIMESLICE_NS`) and another process' kernel is due
//!   (then the switch costs `GPUSIM_SWITCH_NS`, the device idle meanwhile);
//! - otherwise the due kernel that has waited longest starts (its process now holds the device,
//!   `d_X` grows by what it waited);
//! - otherwise the device idles until the next kernel falls due.
//!
//! A kernel runs to its end once started (the switch happens between kernels, as a context
//! switch between kernels would). Nothing is decided ahead of the present: every call advances
//! the schedule from where it was left (`t`) to now, under the device's arbitration lock, and
//! a kernel is timed from the solo clock read under the same hold of the lock that publishes
//! it, so it is never due before the schedule was decided: what was decided stays right.
//!
//! # Layout (per physical device, up to 16, at [`OFF`] + [`DEV_SIZE`]·d)
//!
//! | word | what |
//! |---|---|
//! | 0 | `t`: the schedule is decided up to this time (0: never advanced) |
//! | 1 | the holder: entry + 1 (0: none) |
//! | 2 | since when it holds the device |
//! | 3 | the lock: its holder (`Node::arb_id` << 32 \| thread id), 0 when free (`Node::arb_lock`) |
//! | 8 + [`ENTRY_WORDS`]·e | entry `e` (16, the same index as the process' entry of the time region): its owner (`Node::arb_id` << 32 \| pid), `d`, head, tail, collected, 3 reserved, then [`RING`] kernels of 3 words: `s`, `e`, real start (0: not started) |
//!
//! `head`, `tail` and `collected` count kernels since the entry was claimed: `head` is the
//! first not finished, `tail` the next to publish, `collected` the first whose start the owner
//! has not read back yet (for its busy record and its map of solo to real time).

use crate::node::Node;
use gpusim_common::busy;
use std::sync::atomic::{AtomicU64, Ordering::Acquire, Ordering::Release};
use std::sync::Mutex;

/// Kernels a process holds per device, from the oldest not finished or not read back to the
/// newest (a launch that finds them waits).
pub const RING: usize = 1024;
const ENTRY_HEADER: usize = 8;
pub const ENTRY_WORDS: usize = ENTRY_HEADER + 3 * RING;
const DEV_HEADER: usize = 8;
pub const DEV_SIZE: usize = 8 * (DEV_HEADER + busy::NPIDS * ENTRY_WORDS);
/// Where the region starts in the node state file (after the time region).
pub const OFF: usize = busy::TIME_OFF + busy::TIME_SIZE;
pub const SIZE: usize = busy::MAX_DEVICES * DEV_SIZE;

const T: usize = 0;
const HOLDER: usize = 1;
const SINCE: usize = 2;
const LOCK: usize = 3;
const PID: usize = 0;
const D: usize = 1;
const HEAD: usize = 2;
const TAIL: usize = 3;
const COLLECTED: usize = 4;

/// One device's block, under its lock.
struct Dev<'a> {
    node: &'a Node,
    p: usize,
}

impl Dev<'_> {
    fn w(&self, i: usize) -> &AtomicU64 {
        // (indices are within the block by construction; the block exists: checked in `with`)
        self.node.arb_word(self.p, i).expect("arbitration word")
    }
    fn get(&self, i: usize) -> u64 {
        self.w(i).load(Acquire)
    }
    fn set(&self, i: usize, v: u64) {
        self.w(i).store(v, Release)
    }
    fn ew(&self, e: usize, i: usize) -> usize {
        DEV_HEADER + e * ENTRY_WORDS + i
    }
    fn eget(&self, e: usize, i: usize) -> u64 {
        self.get(self.ew(e, i))
    }
    fn eset(&self, e: usize, i: usize, v: u64) {
        self.set(self.ew(e, i), v)
    }
    /// Word `k` (0 = s, 1 = e, 2 = real start) of kernel `idx` of entry `e`.
    fn item(&self, e: usize, idx: u64, k: usize) -> usize {
        self.ew(e, ENTRY_HEADER + 3 * (idx as usize % RING) + k)
    }
    fn iget(&self, e: usize, idx: u64, k: usize) -> u64 {
        self.get(self.item(e, idx, k))
    }
    fn pending(&self, e: usize) -> bool {
        self.eget(e, HEAD) < self.eget(e, TAIL)
    }

    /// Decides the device's use from `t` to `now`.
    fn advance(&self, now: u64, slice: u64, switch: u64) {
        let t = self.get(T);
        if t >= now {
            return;
        }
        let mut tau = if t == 0 { now } else { t };
        // (bounded: every turn finishes or starts a kernel, or moves to the next due time)
        for _ in 0..4 * busy::NPIDS * RING + 16 {
            let holder = self.get(HOLDER).checked_sub(1).map(|h| h as usize).filter(|&h| h < busy::NPIDS);
            if let Some(h) = holder {
                let head = self.eget(h, HEAD);
                if head < self.eget(h, TAIL) {
                    let real = self.iget(h, head, 2);
                    if real != 0 {
                        let end = real + (self.iget(h, head, 1) - self.iget(h, head, 0));
                        if end > now {
                            break;
                        }
                        tau = tau.max(end);
                        self.eset(h, HEAD, head + 1);
                        continue;
                    }
                }
            }
            // The device is free at `tau`: who goes next.
            let mut holder_due = false;
            let mut best: Option<(usize, u64)> = None;
            let mut next_due = u64::MAX;
            for e in 0..busy::NPIDS {
                if !self.pending(e) {
                    continue;
                }
                let due = self.iget(e, self.eget(e, HEAD), 0).saturating_add(self.eget(e, D));
                if due > tau {
                    next_due = next_due.min(due);
                } else if Some(e) == holder {
                    holder_due = true;
                } else if best.is_none_or(|(_, b)| due < b) {
                    best = Some((e, due));
                }
            }
            let since = self.get(SINCE);
            let go = match (holder, best) {
                (Some(h), None) if holder_due => h,
                (Some(h), Some(_)) if holder_due && tau.saturating_sub(since) < slice => h,
                (_, Some((e, _))) => {
                    // (a switch away from a holder whose work is still due, at the end of its
                    // slice, costs `switch`: the device does nothing meanwhile)
                    let cost = if holder.is_some() && holder_due { switch } else { 0 };
                    self.set(HOLDER, e as u64 + 1);
                    self.set(SINCE, tau.saturating_add(cost));
                    e
                }
                _ => {
                    if next_due > now {
                        break;
                    }
                    tau = next_due;
                    continue;
                }
            };
            // (a switch under way: the holder's kernel starts once it is done, decided only
            // when that is not ahead of the present)
            let at = tau.max(self.get(SINCE));
            if at > now {
                break;
            }
            self.start(go, at);
        }
        self.set(T, now);
    }

    /// The head kernel of entry `e` starts at `tau`.
    fn start(&self, e: usize, tau: u64) {
        let head = self.eget(e, HEAD);
        let (s, end) = (self.iget(e, head, 0), self.iget(e, head, 1));
        // (its solo clock stood at `s` since it fell due: `d` grows by the wait)
        self.eset(e, D, tau - s);
        self.set(self.item(e, head, 2), tau.max(1));
        crate::timeline::node_record(self.node, self.p, e, tau, tau + (end - s), tau);
    }

    /// This process' entry: found, or claimed (one drained whose attachment is gone; its
    /// buckets of the time region cleared, so that the new owner is not shown the old one's
    /// utilisation).
    fn entry(&self, now: u64) -> Option<usize> {
        let pid = crate::node::my_pid();
        let me = self.node.arb_id() << 32 | pid;
        if let Some(e) = (0..busy::NPIDS).find(|&e| self.eget(e, PID) == me) {
            return Some(e);
        }
        for e in 0..busy::NPIDS {
            let owner = self.eget(e, PID);
            let free = owner == 0 || !self.node.arb_alive(owner >> 32, Some(owner & 0xffff_ffff));
            if !free || self.pending(e) {
                continue;
            }
            let base = (busy::DEV_HEADER + e * busy::ENTRY_SIZE) / 8;
            for i in 0..2 + busy::NBUCKETS {
                if let Some(w) = self.node.time_word(self.p, base + i) {
                    w.store(0, Release);
                }
            }
            if let (Some(w), Some(last)) = (self.node.time_word(self.p, base), self.node.time_word(self.p, base + 1)) {
                last.store(busy::epoch(now), Release);
                w.store(pid, Release);
            }
            self.eset(e, PID, me);
            self.eset(e, D, 0);
            let tail = self.eget(e, TAIL);
            self.eset(e, HEAD, tail);
            self.eset(e, COLLECTED, tail);
            if self.get(HOLDER) == e as u64 + 1 {
                self.set(HOLDER, 0);
            }
            return Some(e);
        }
        None
    }

    /// Whether entry `e` has room for another kernel: its ring holds the kernels from the
    /// first not finished or not read back (whichever is older) to the last published.
    fn room(&self, e: usize) -> bool {
        let oldest = self.eget(e, HEAD).min(self.eget(e, COLLECTED));
        self.eget(e, TAIL) - oldest < RING as u64
    }
}

/// What this process knows of its own entry on one device.
#[derive(Default)]
struct Own {
    /// `d` as of the last kernel collected.
    d: u64,
    /// Where `d` grew: (solo start of the kernel that waited, `d` from then on), oldest first.
    steps: std::collections::VecDeque<(u64, u64)>,
    /// Whether old steps were dropped ([`MAX_STEPS`]).
    dropped: bool,
}

/// The most steps of `d` kept per device (older event stamps map with the oldest kept).
const MAX_STEPS: usize = 1 << 16;

/// This process' `Own` per device. A forked child starts afresh (its entries are its own),
/// with a mutex of its own: one a parent's thread held at the fork would never be released.
struct Mine {
    pid: u64,
    own: Mutex<Vec<Own>>,
}

static MINE: std::sync::atomic::AtomicPtr<Mine> = std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

/// Forgets this process' `Own` (a test installs another node state: its entries are new).
#[cfg(test)]
pub fn forget() {
    MINE.store(std::ptr::null_mut(), std::sync::atomic::Ordering::Release);
}

fn own() -> std::sync::MutexGuard<'static, Vec<Own>> {
    let pid = crate::node::my_pid();
    let mut cur = MINE.load(Acquire);
    // SAFETY: a published `Mine` is leaked, never freed.
    if cur.is_null() || unsafe { (*cur).pid } != pid {
        let fresh = Box::into_raw(Box::new(Mine { pid, own: Mutex::new((0..busy::MAX_DEVICES).map(|_| Own::default()).collect()) }));
        match MINE.compare_exchange(cur, fresh, std::sync::atomic::Ordering::AcqRel, Acquire) {
            Ok(_) => cur = fresh,
            Err(other) => {
                // SAFETY: ours, never published.
                drop(unsafe { Box::from_raw(fresh) });
                cur = other;
            }
        }
    }
    // SAFETY: as above; leaked, so 'static.
    let mine: &'static Mine = unsafe { &*cur };
    mine.own.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `f` on device `p`'s block, locked and advanced to now, with this process' entry
/// (claimed at first use); `None` without node state, for a device without a block, or when no
/// entry is free (then the process runs on its own clock).
fn with<R>(p: usize, f: impl FnOnce(&Dev, usize, u64) -> R) -> Option<R> {
    let node = crate::node::active()?;
    node.arb_word(p, 0)?;
    let _lock = node.arb_lock(p, LOCK)?;
    let dev = Dev { node, p };
    let now = crate::timeline::now();
    dev.advance(now, crate::timeline::timeslice_ns(), crate::timeline::switch_ns());
    let e = dev.entry(now)?;
    collect(&dev, e);
    Some(f(&dev, e, now))
}

/// Reads back the starts of this process' kernels: its busy record, the steps of `d`.
fn collect(dev: &Dev, e: usize) {
    let (mut idx, head, tail) = (dev.eget(e, COLLECTED), dev.eget(e, HEAD), dev.eget(e, TAIL));
    let mut own = own();
    let Some(o) = own.get_mut(dev.p) else { return };
    while idx < tail {
        let real = dev.iget(e, idx, 2);
        if real == 0 && idx >= head {
            break;
        }
        let (s, end) = (dev.iget(e, idx, 0), dev.iget(e, idx, 1));
        let d = real.saturating_sub(s);
        if d != o.d {
            o.d = d;
            if o.steps.len() == MAX_STEPS {
                o.steps.pop_front();
                o.dropped = true;
            }
            o.steps.push_back((s, d));
        }
        crate::timeline::record_local(dev.p, real, real + (end - s));
        idx += 1;
    }
    dev.eset(e, COLLECTED, idx);
}

/// Whether device `p` is arbitrated (node state on, the device has a block).
pub fn on(p: usize) -> bool {
    crate::node::active().is_some_and(|n| n.arb_word(p, 0).is_some())
}

/// Entry `e`'s solo clock at `now`, and whether it waits for the device (its head kernel due
/// and not started: the clock stands still at its start).
fn solo(dev: &Dev, e: usize, now: u64) -> (u64, bool) {
    let solo = now.saturating_sub(dev.eget(e, D));
    if dev.pending(e) {
        let head = dev.eget(e, HEAD);
        let s = dev.iget(e, head, 0);
        if dev.iget(e, head, 2) == 0 && solo > s {
            return (s, true);
        }
    }
    (solo, false)
}

/// This process' solo clock on device `p`, and whether it waits for the device (its head
/// kernel due and not started); `None` when `p` is not arbitrated.
pub fn clock(p: usize) -> Option<(u64, bool)> {
    with(p, |dev, e, now| solo(dev, e, now))
}

/// Times and publishes one kernel of this process on device `p`, with the clock read and the
/// kernel published under one hold of the lock (so that it is never due before the schedule
/// has been decided past it): `time(solo now)` gives its solo `[s, e)`. `Some(Some(r))` done;
/// `Some(None)` no room (its queue is full: `time` was not called; wait and try again);
/// `None` not arbitrated.
pub fn publish_with(p: usize, time: impl FnOnce(u64) -> (u64, u64)) -> Option<Option<(u64, u64)>> {
    with(p, |dev, e, now| {
        if !dev.room(e) {
            return None;
        }
        let (s, end) = time(solo(dev, e, now).0);
        let tail = dev.eget(e, TAIL);
        dev.set(dev.item(e, tail, 0), s);
        dev.set(dev.item(e, tail, 1), end.max(s));
        dev.set(dev.item(e, tail, 2), 0);
        dev.eset(e, TAIL, tail + 1);
        Some((s, end))
    })
}

/// The real time of solo time `t` on device `p`: `t` plus what this process had waited for
/// the device by then; `with` (not 0): the solo start of the kernel the time goes with, whose
/// real start it is.
pub fn real(p: usize, t: u64, with: u64) -> u64 {
    let own = own();
    let Some(o) = own.get(p) else { return t };
    let (at, i) = if with != 0 { (with, o.steps.partition_point(|&(s, _)| s <= with)) } else { (t, o.steps.partition_point(|&(s, _)| s < t)) };
    let d = match i.checked_sub(1) {
        Some(j) => o.steps[j].1,
        // (before the first step kept: 0, or the oldest kept once older ones were dropped)
        None if o.dropped => o.steps.front().map_or(0, |s| s.1),
        None => 0,
    };
    at + d
}

/// What this process has waited for device `p` so far (0 when not arbitrated).
pub fn waited(p: usize) -> u64 {
    own().get(p).map_or(0, |o| o.d)
}
