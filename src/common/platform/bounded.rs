//! Every wait a hook can make, bounded: [`Bounded`], the shim's mutex, whose `lock` refuses at
//! once when this very thread holds it and after [`WAIT_BOUND`] otherwise, [`Backoff`], the
//! steps of every other wait (spin, yield, short sleeps) with the same bound, and [`BitWait`],
//! a wait for a one-bit lock.
//!
//! Why: a program may call CUDA from a signal handler. A handler that interrupted its thread
//! inside one of the shim's critical sections and then waited for that section's lock (or
//! bucket, or gate) would wait for itself, for ever. No wait of the shim is unbounded now: a
//! lock held by the waiting thread itself is refused at once ([`Stuck::Reentered`]); any other
//! wait gives up after [`WAIT_BOUND`] ([`Stuck::TimedOut`]), and the hook refuses its call
//! instead of hanging the program, with one line (`log::refuse`). (No dependency on the rest of
//! the library: the `gpushim` command compiles it too, with `once.rs`.)

use std::cell::UnsafeCell;
use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};
use std::time::{Duration, Instant};

/// How long any wait of the shim lasts at most (one bound for all: start-up, locks, buckets,
/// the figures' move, one-time steps, a preallocation). The shim's critical sections take
/// microseconds; this only ends a wait that would otherwise never end.
pub const WAIT_BOUND: Duration = Duration::from_secs(10);

/// Why a wait gave up: what it waited for, and whether this very thread holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stuck {
    /// Held by this thread: a signal handler interrupted it inside the shim (refused at once).
    Reentered(&'static str),
    /// Not free within [`WAIT_BOUND`] (held by this thread where that cannot be told, or by a
    /// thread that does not go on).
    TimedOut(&'static str),
}

impl fmt::Display for Stuck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stuck::Reentered(what) => write!(
                f,
                "{what} is held by this very thread (CUDA called from a signal handler that interrupted gpushim); call it outside the handler"
            ),
            Stuck::TimedOut(what) => write!(
                f,
                "{what} was not free within {} s (CUDA called from a signal handler that interrupted gpushim, or a thread stopped inside it)",
                WAIT_BOUND.as_secs()
            ),
        }
    }
}

/// This thread's mark: its `pthread_t` (the address of its control block: never 0, unique
/// among live threads; async-signal-safe to read).
#[inline]
pub fn this_thread() -> usize {
    // SAFETY: no preconditions.
    unsafe { libc::pthread_self() as usize }
}

/// The steps of one wait: spins, then yields, then sleeps of 50 µs growing to 1 ms, until the
/// bound has passed since the first yield.
pub struct Backoff {
    steps: u32,
    since: Option<Instant>,
    bound: Duration,
}

impl Backoff {
    pub const fn new() -> Backoff {
        Backoff::within(WAIT_BOUND)
    }

    pub const fn within(bound: Duration) -> Backoff {
        Backoff { steps: 0, since: None, bound }
    }

    /// Waits one step; `false` once the bound has passed (the caller gives up).
    #[cold]
    pub fn wait(&mut self) -> bool {
        self.steps = self.steps.saturating_add(1);
        if self.steps <= 64 {
            std::hint::spin_loop();
            return true;
        }
        let since = *self.since.get_or_insert_with(Instant::now);
        if since.elapsed() > self.bound {
            return false;
        }
        if self.steps <= 128 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50u64 << ((self.steps - 129) / 64).min(4)).min(Duration::from_millis(1)));
        }
        true
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

/// A mutex whose lock is bounded (see the module documentation). The lock word is the
/// holder's mark (0: free), so a thread that finds the lock held by itself knows it at once.
/// Not poisoned by a panic: a guard dropped while unwinding lets go, as the shim's std mutexes
/// were used (`unwrap_or_else(into_inner)`).
pub struct Bounded<T> {
    holder: AtomicUsize,
    what: &'static str,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a guard, which exists for one thread at a time
// (the holder word, taken with Acquire and given back with Release, orders the accesses).
unsafe impl<T: Send> Sync for Bounded<T> {}
unsafe impl<T: Send> Send for Bounded<T> {}

/// The lock held; let go when dropped. Not `Send`: it belongs to the thread that took it.
#[must_use = "the lock is let go as soon as this is dropped"]
pub struct Guard<'a, T> {
    lock: &'a Bounded<T>,
    _thread: PhantomData<*const ()>,
}

impl<T> Bounded<T> {
    /// `what` names it in messages ("the live map", "device 0's reserve"...).
    pub const fn new(what: &'static str, value: T) -> Bounded<T> {
        Bounded { holder: AtomicUsize::new(0), what, value: UnsafeCell::new(value) }
    }

    /// Takes the lock, waiting at most [`WAIT_BOUND`]; refused at once if this thread holds it.
    #[inline]
    pub fn lock(&self) -> Result<Guard<'_, T>, Stuck> {
        self.lock_within(WAIT_BOUND)
    }

    /// [`Bounded::lock`] with another bound (tests).
    #[inline]
    pub fn lock_within(&self, bound: Duration) -> Result<Guard<'_, T>, Stuck> {
        let me = this_thread();
        match self.holder.compare_exchange(0, me, Acquire, Relaxed) {
            Ok(_) => Ok(Guard { lock: self, _thread: PhantomData }),
            Err(holder) => self.lock_waiting(me, holder, bound),
        }
    }

    #[cold]
    #[inline(never)]
    fn lock_waiting(&self, me: usize, mut holder: usize, bound: Duration) -> Result<Guard<'_, T>, Stuck> {
        let mut backoff = Backoff::within(bound);
        loop {
            // (only this thread ever stores its own mark, and it clears it before letting go:
            // seeing it means this thread holds the lock, below us on its own stack)
            if holder == me {
                return Err(Stuck::Reentered(self.what));
            }
            if holder == 0 {
                match self.holder.compare_exchange(0, me, Acquire, Relaxed) {
                    Ok(_) => return Ok(Guard { lock: self, _thread: PhantomData }),
                    Err(now) => holder = now,
                }
                continue;
            }
            if !backoff.wait() {
                return Err(Stuck::TimedOut(self.what));
            }
            holder = self.holder.load(Relaxed);
        }
    }

    /// In a forked child, whose only thread is the one that forked: the lock free (whoever
    /// held it in the parent is not here) and the value `fresh`.
    pub fn reset_after_fork(&self, fresh: T) {
        self.holder.store(0, Release);
        if let Ok(mut g) = self.lock() {
            *g = fresh;
        }
    }

    /// Whether this thread holds the lock (tests, debug checks).
    #[cfg(test)]
    pub fn held_here(&self) -> bool {
        self.holder.load(Relaxed) == this_thread()
    }
}

impl<T> std::ops::Deref for Guard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock: no other reference to the value exists.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> std::ops::DerefMut for Guard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and the guard is borrowed mutably.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for Guard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.lock.holder.store(0, Release);
    }
}

/// A wait for a lock that is one bit of a word (a live-map bucket's writer bit), with the
/// steps of [`Backoff`]. The bit cannot say whose it is, so a thread that holds it itself (a
/// signal handler that interrupted it inside) waits out the bound once; the word's address, its
/// value and the thread are then remembered, and a later wait of the same thread for the same
/// word still holding that value gives up at once.
pub struct BitWait<'a> {
    word: &'a AtomicU64,
    what: &'static str,
    backoff: Backoff,
    first: bool,
}

/// The last [`BitWait`] that reached its bound: the word's address, its value, the thread.
static STUCK_AT: [AtomicU64; 3] = [const { AtomicU64::new(0) }; 3];

impl<'a> BitWait<'a> {
    #[inline]
    pub fn new(word: &'a AtomicU64, what: &'static str) -> Self {
        BitWait::within(word, what, WAIT_BOUND)
    }

    #[inline]
    pub fn within(word: &'a AtomicU64, what: &'static str, bound: Duration) -> Self {
        BitWait { word, what, backoff: Backoff::within(bound), first: true }
    }

    /// One step of the wait; `Err` once it gives up.
    #[cold]
    pub fn step(&mut self) -> Result<(), Stuck> {
        let at = || [self.word as *const AtomicU64 as u64, self.word.load(Relaxed), this_thread() as u64];
        if std::mem::take(&mut self.first) && STUCK_AT.iter().zip(at()).all(|(s, v)| s.load(Relaxed) == v) {
            return Err(Stuck::TimedOut(self.what));
        }
        if self.backoff.wait() {
            return Ok(());
        }
        for (s, v) in STUCK_AT.iter().zip(at()) {
            s.store(v, Relaxed);
        }
        Err(Stuck::TimedOut(self.what))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    const SHORT: Duration = Duration::from_millis(200);

    #[test]
    fn a_lock_held_by_this_thread_is_refused_at_once() {
        let m = Bounded::new("the test lock", 1u32);
        let g = m.lock().expect("free");
        assert!(m.held_here());
        let start = Instant::now();
        assert_eq!(m.lock().err(), Some(Stuck::Reentered("the test lock")));
        assert!(start.elapsed() < Duration::from_millis(50), "refused after {:?}", start.elapsed());
        drop(g);
        assert!(!m.held_here());
        assert_eq!(*m.lock().expect("free again"), 1);
    }

    #[test]
    fn a_lock_held_elsewhere_is_waited_for_until_the_bound_then_refused() {
        let m = Arc::new(Bounded::new("the test lock", 0u32));
        let (held, go) = (Arc::new(std::sync::Barrier::new(2)), Arc::new(std::sync::Barrier::new(2)));
        let holder = {
            let (m, held, go) = (m.clone(), held.clone(), go.clone());
            std::thread::spawn(move || {
                let _g = m.lock().expect("free");
                held.wait();
                go.wait();
            })
        };
        held.wait();
        let start = Instant::now();
        assert_eq!(m.lock_within(SHORT).err(), Some(Stuck::TimedOut("the test lock")));
        let waited = start.elapsed();
        assert!(waited >= SHORT && waited < SHORT * 10, "gave up after {waited:?}");
        go.wait();
        holder.join().unwrap();
        *m.lock_within(SHORT).expect("let go") += 1;
        assert_eq!(*m.lock().unwrap(), 1);
    }

    #[test]
    fn a_waiter_gets_the_lock_once_it_is_let_go() {
        let m = Arc::new(Bounded::new("the test lock", 0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        *m.lock().expect("never stuck here") += 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*m.lock().unwrap(), 40_000);
    }

    #[test]
    fn a_backoff_ends_after_its_bound() {
        let mut b = Backoff::within(SHORT);
        let start = Instant::now();
        while b.wait() {}
        let waited = start.elapsed();
        assert!(waited >= SHORT && waited < SHORT * 10, "ended after {waited:?}");
    }

    /// A one-bit lock this thread holds (as a live-map bucket's writer bit under a signal
    /// handler): waited for until the bound, then, while it is held the same way, refused at
    /// once; another word, or the same one changed, is waited for again.
    #[test]
    fn a_bit_lock_that_stays_held_is_waited_for_once() {
        let (word, other) = (AtomicU64::new(1), AtomicU64::new(1));
        let wait_out = |w: &AtomicU64| {
            let start = Instant::now();
            let mut wait = BitWait::within(w, "the test bit", SHORT);
            let stuck = loop {
                if let Err(e) = wait.step() {
                    break e;
                }
            };
            (stuck, start.elapsed())
        };
        let (stuck, waited) = wait_out(&word);
        assert_eq!(stuck, Stuck::TimedOut("the test bit"));
        assert!(waited >= SHORT && waited < SHORT * 10, "gave up after {waited:?}");
        let (_, again) = wait_out(&word);
        assert!(again < SHORT / 2, "waited {again:?} again for the same held word");
        let (_, elsewhere) = wait_out(&other);
        assert!(elsewhere >= SHORT, "another word: waited {elsewhere:?}");
        word.store(3, Relaxed); // (let go and taken again: another holder)
        let (_, changed) = wait_out(&word);
        assert!(changed >= SHORT, "a word that changed: waited {changed:?}");
    }

    #[test]
    fn a_forked_childs_reset_frees_a_lock_held_in_the_parent() {
        let m = Bounded::new("the test lock", 5u32);
        let g = m.lock().unwrap();
        std::mem::forget(g); // (as a parent thread that is not in the child)
        m.reset_after_fork(7);
        assert_eq!(*m.lock().expect("free after the reset"), 7);
    }
}
