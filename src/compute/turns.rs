//! Turns on one GPU among the paced processes that share it: a process launches only while no
//! other paced process' work is in the device, so that the hardware never time-slices two
//! paced processes' work and each one's events measure its own work alone.
//!
//! # Why
//!
//! When two processes both have work queued, the GPU alternates between their contexts in time
//! slices, preempting kernels in mid-run. The events that bracket a launch (`duty`) then also
//! measure the other process' slices and the switches between them: on an H100, two
//! processes paced at 30 % and 70 % each measured its share of the device, yet the 70 % one
//! did only 58 % of its work alone, and two unpaced processes together did 91 % of the work of
//! one (a tenth of the device went to switching). Taking turns removes both: the device runs one
//! process' burst, then the next one's.
//!
//! # The claim
//!
//! One 64-bit word per GPU (in the user's registry file, keyed by the GPU's UUID: every paced
//! process of the user that runs on that GPU shares it) holds the current claim: who (a 24-bit
//! id drawn per pacer) and until when (the machine's monotonic clock, in units of 4.096 µs, 40
//! bits, compared modulo 2⁴⁰). A pacer that launches extends its claim to the end of its queued
//! work (the end it had, or now, plus the launch's estimate), by compare-and-swap: a claim of
//! another pacer that has not ended makes it wait (in steps; at most [`MAX_WAIT`] in all for one
//! launch). The holder's last launch to be measured lets go of its claim.
//!
//! # Bounded, and only ever a matter of accuracy
//!
//! The word decides only *when* a launch goes within what the pacer's own clock allows: the
//! clock alone bounds each process' share, whatever the word says. A claim further ahead than
//! twice [`MAX_CLAIM`] (a corrupt word, or one written by someone else) counts as no claim; a holder
//! that dies leaves a claim that ends by itself; a launch waits for others' claims at most
//! [`MAX_WAIT`], then goes.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed, Ordering::SeqCst};

/// The unit of the claim's end: 2¹² ns.
const SHIFT: u32 = 12;
/// Bits of the claim's end.
const BITS: u32 = 40;
const MASK: u64 = (1 << BITS) - 1;
/// The longest claim made (ns ahead of now): one second of queued work.
pub const MAX_CLAIM: u64 = 1_000_000_000;
/// The longest one launch waits for other processes' claims.
pub const MAX_WAIT: u64 = 1_000_000_000;
/// How long a pacer takes no turns after a launch waited [`MAX_WAIT`] for them.
pub const PAUSE: u64 = 10_000_000_000;
/// What a launch claims before anything is known of its kernels.
const FIRST_CLAIM: u64 = 1_000_000;

/// One pacer's side of a GPU's turns.
pub struct Turns {
    word: &'static AtomicU64,
    /// This pacer's id (24 bits, never 0).
    me: AtomicU64,
}

/// Packs a claim: `who` until `until` (ns).
fn pack(who: u64, until: u64) -> u64 {
    (who << BITS) | ((until >> SHIFT) & MASK)
}

/// The claim in `word` if it has not ended at `now` (and is not implausibly far ahead): its
/// holder and its end (ns).
fn active(word: u64, now: u64) -> Option<(u64, u64)> {
    let who = word >> BITS;
    let ahead = ((word & MASK).wrapping_sub(now >> SHIFT) & MASK) << SHIFT;
    // (claims are made at most MAX_CLAIM ahead, of another's clock read a moment earlier or
    // later: only twice that is implausible)
    (who != 0 && ahead != 0 && ahead <= 2 * MAX_CLAIM).then_some((who, now.saturating_add(ahead)))
}

/// A fresh 24-bit id, never 0: from the pid, the clock and a count of the ids drawn (two
/// pacers of one process differ; two processes with one pid, in two pid namespaces, almost
/// surely do).
fn fresh_id() -> u64 {
    static DRAWN: AtomicU64 = AtomicU64::new(0);
    let mut x = u64::from(std::process::id()) ^ crate::compute::duty::now_ns().rotate_left(29) ^ DRAWN.fetch_add(1, Relaxed).rotate_left(47);
    // (splitmix64's finaliser)
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    (x & 0xff_ffff).max(1)
}

impl Turns {
    pub fn new(word: &'static AtomicU64) -> Turns {
        Turns { word, me: AtomicU64::new(fresh_id()) }
    }

    /// Until when (ns) another pacer's claim holds the GPU at `now`; `None`: the GPU is free
    /// to this one.
    #[inline]
    pub fn others_until(&self, now: u64) -> Option<u64> {
        let me = self.me.load(Relaxed);
        active(self.word.load(Relaxed), now).filter(|(who, _)| *who != me).map(|(_, until)| until)
    }

    /// Extends this pacer's claim by `estimate` ns of work launched at `now` (the first
    /// launches, `estimate` 0, claim a millisecond); `false` when another pacer's claim holds.
    #[inline]
    pub fn claim(&self, now: u64, estimate: u64) -> bool {
        let me = self.me.load(Relaxed);
        let add = if estimate == 0 { FIRST_CLAIM } else { estimate };
        self.word
            .fetch_update(Relaxed, Relaxed, |w| match active(w, now) {
                Some((who, _)) if who != me => None,
                Some((_, until)) => Some(pack(me, until.saturating_add(add).min(now + MAX_CLAIM))),
                None => Some(pack(me, now.saturating_add(add).min(now + MAX_CLAIM))),
            })
            .is_ok()
    }

    /// Lets go of this pacer's claim if `idle()` says its work has all completed: checked after
    /// the word is read, and the word cleared only if unchanged since, so that a launch of
    /// another thread, admitted and claiming meanwhile, keeps its claim.
    pub fn release_if(&self, idle: impl Fn() -> bool) {
        let me = self.me.load(Relaxed);
        let w = self.word.load(SeqCst);
        if w >> BITS == me && idle() {
            let _ = self.word.compare_exchange(w, 0, SeqCst, Relaxed);
        }
    }

    /// In a forked child: a new id (the parent's claims are the parent's).
    pub fn reset_after_fork(&self) {
        self.me.store(fresh_id(), Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn word() -> &'static AtomicU64 {
        Box::leak(Box::new(AtomicU64::new(0)))
    }

    #[test]
    fn a_claim_holds_others_off_until_it_ends() {
        let w = word();
        let (a, b) = (Turns::new(w), Turns::new(w));
        assert_ne!(a.me.load(Relaxed), b.me.load(Relaxed));
        let now = 5_000_000_000_000;
        assert!(a.claim(now, 300_000));
        assert!(a.others_until(now).is_none());
        let until = b.others_until(now).expect("a's claim");
        // (the end is kept in 4.096 µs units)
        assert!(until.abs_diff(now + 300_000) <= 4096, "{until}");
        assert!(!b.claim(now + 100_000, 300_000));
        // a extends its own claim from its end
        assert!(a.claim(now + 100_000, 300_000));
        let until = b.others_until(now + 100_000).unwrap();
        assert!(until.abs_diff(now + 600_000) <= 2 * 4096, "{until}");
        // ended: b takes it
        assert!(b.others_until(now + 610_000).is_none());
        assert!(b.claim(now + 610_000, 10_000));
        assert!(a.others_until(now + 610_000).is_some());
        b.release_if(|| false);
        assert!(a.others_until(now + 610_000).is_some(), "released while busy");
        b.release_if(|| true);
        assert!(a.others_until(now + 610_000).is_none());
        // a release by a pacer that does not hold the claim changes nothing
        assert!(a.claim(now + 700_000, 10_000));
        b.release_if(|| true);
        assert!(b.others_until(now + 700_000).is_some());
    }

    #[test]
    fn claims_far_ahead_or_corrupt_count_as_none() {
        let w = word();
        let a = Turns::new(w);
        let now = 123_456_789_000;
        // far ahead (a corrupt word, or one written by someone else)
        w.store(pack(0x123, now + 2 * MAX_CLAIM + 10_000), Relaxed);
        assert!(a.others_until(now).is_none());
        // a claim of MAX_CLAIM, of a clock read a little later than ours, counts
        w.store(pack(0x123, now + MAX_CLAIM + 50_000), Relaxed);
        assert!(a.others_until(now).is_some());
        w.store(0, Relaxed);
        assert!(a.others_until(now).is_none());
        assert!(a.claim(now, 1_000));
        // all ones
        w.store(u64::MAX, Relaxed);
        assert!(a.others_until(now).is_none_or(|until| until <= now + 2 * MAX_CLAIM));
        // a claim is never made longer than MAX_CLAIM
        w.store(0, Relaxed);
        assert!(a.claim(now, 10 * MAX_CLAIM));
        let b = Turns::new(w);
        assert!(b.others_until(now).unwrap() <= now + MAX_CLAIM + 4096);
    }

    #[test]
    fn the_end_compares_across_the_wrap_of_its_bits() {
        let w = word();
        let (a, b) = (Turns::new(w), Turns::new(w));
        // just before the 40-bit end wraps
        let now = ((1u64 << (BITS + SHIFT)) - 1000) | (7 << 60);
        assert!(a.claim(now, 100_000));
        let until = b.others_until(now).unwrap();
        assert!(until.abs_diff(now + 100_000) <= 4096, "{until}");
        assert!(b.others_until(now + 105_000).is_none());
    }
}
