//! The quota's queue of threads waiting for room (`GPUSHIM_OOM_WAIT`, see `oom_wait`): tickets in the file's header, the futex word, and the quota as a [`SharedRoom`].

#[allow(unused_imports)]
use super::*;
use crate::state_files::oom_wait::{Attempt, SharedRoom};

impl Quota {
    /// Removes slot `i`'s waiters from the queue (the mutex is held: a dead member's, or a
    /// slot being reused).
    pub(crate) fn drop_waiters_of(&self, i: usize) {
        let h = self.h();
        for w in &h.waiter {
            if w.ticket.load(Relaxed) != 0 && w.slot.load(Relaxed) as usize == i {
                Self::free_waiter(h, w);
            }
        }
    }

    fn free_waiter(h: &Header, w: &Waiter) {
        w.ticket.store(0, Relaxed);
        w.slot.store(0, Relaxed);
        w.dev.store(0, Relaxed);
        let _ = h.waiting.fetch_update(Relaxed, Relaxed, |n| Some(n.saturating_sub(1)));
    }

    /// Whether slot `i` has a thread in the queue.
    pub(crate) fn has_waiter(&self, i: usize) -> bool {
        self.h().waiter.iter().any(|w| w.ticket.load(Relaxed) != 0 && w.slot.load(Relaxed) as usize == i)
    }

    /// Bumps the wake word and wakes every sleeper: room may have appeared, or the queue changed.
    pub(crate) fn bump(&self) {
        let word = &self.h().wake;
        word.fetch_add(1, Release);
        crate::platform::sys::futex_wake_all(word);
    }

    /// [`Quota::bump`] if anyone waits (a release's cost without waiters: one load).
    pub(crate) fn wake_waiters(&self) {
        if self.h().waiting.load(Acquire) != 0 {
            self.bump();
        }
    }

    /// Threads waiting now, in all members (`gpushim ps`, tests).
    pub fn waiting(&self) -> u32 {
        self.h().waiting.load(Relaxed)
    }

    /// Whether every live member has a thread in the queue (the mutex is held, dead members
    /// reaped): then nobody can free.
    fn all_waiting(&self) -> bool {
        let h = self.h();
        (0..SLOTS).filter(|&i| h.slot[i].used.load(Relaxed) != 0).all(|i| self.has_waiter(i))
    }
}

impl SharedRoom for Quota {
    fn enqueue(&self, d: usize) -> Option<u64> {
        let me = whoami();
        let i = self.slot_of(me).or_else(|| self.rejoin(me))?;
        let _g = self.lock().map_err(|e| report_error(&e)).ok()?;
        let h = self.h();
        let w = h.waiter.iter().find(|w| w.ticket.load(Relaxed) == 0)?;
        let ticket = h.tickets.load(Relaxed).wrapping_add(1).max(1);
        h.tickets.store(ticket, Relaxed);
        w.slot.store(i as u32, Relaxed);
        w.dev.store(d as u32, Relaxed);
        w.ticket.store(ticket, Relaxed);
        h.waiting.fetch_add(1, Relaxed);
        Some(ticket)
    }

    fn attempt(&self, d: usize, ticket: u64, bytes: u64, limit: u64) -> Attempt {
        let me = whoami();
        let Some(i) = self.slot_of(me) else { return Attempt::Failed(0) };
        let g = match self.lock() {
            Ok(g) => g,
            Err(e) => {
                report_error(&e);
                return Attempt::Failed(u64::MAX);
            }
        };
        let reaped = self.reap(me);
        let h = self.h();
        let dev = &h.devices[d];
        let total = dev.reserved.load(Relaxed);
        let live = |w: &&Waiter| w.ticket.load(Relaxed) != 0;
        let outcome = match h.waiter.iter().find(|w| w.ticket.load(Relaxed) == ticket) {
            // (our entry is gone: the file was repaired under us)
            None => Attempt::Failed(total),
            Some(mine) => {
                let first = h.waiter.iter().filter(live).filter(|w| w.dev.load(Relaxed) as usize == d).map(|w| w.ticket.load(Relaxed)).min();
                let newest = h.waiter.iter().filter(live).map(|w| w.ticket.load(Relaxed)).max();
                if first == Some(ticket) && total.checked_add(bytes).is_some_and(|n| n <= limit) {
                    let now = total + bytes;
                    dev.reserved.store(now, Relaxed);
                    dev.peak.fetch_max(now, Relaxed);
                    let usage = h.slot[i].usage[d].fetch_add(bytes, Relaxed).saturating_add(bytes);
                    // (as `reserve` does: a HAMi region's slot shows it)
                    report_usage(self, d, usage);
                    Self::free_waiter(h, mine);
                    Attempt::Reserved
                } else if newest == Some(ticket) && self.all_waiting() {
                    Self::free_waiter(h, mine);
                    Attempt::AllWaiting(total)
                } else {
                    Attempt::Wait(h.wake.load(Acquire))
                }
            }
        };
        drop(g);
        // the first waiter changed, or a dead member's memory came back: the others look again
        if reaped > 0 {
            self.bump();
        } else if !matches!(outcome, Attempt::Wait(_)) {
            self.wake_waiters();
        }
        outcome
    }

    fn dequeue(&self, ticket: u64) {
        let Ok(g) = self.lock() else { return };
        let h = self.h();
        if let Some(w) = h.waiter.iter().find(|w| w.ticket.load(Relaxed) == ticket) {
            Self::free_waiter(h, w);
        }
        drop(g);
        self.wake_waiters();
    }

    fn wake_word(&self) -> &AtomicU32 {
        &self.h().wake
    }
}
