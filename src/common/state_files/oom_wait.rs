//! Waiting instead of failing (`GPUSHIM_OOM_WAIT`): the loop in which an allocating thread,
//! refused by a full *shared* budget, waits for another member to free, for any budget that
//! implements [`SharedRoom`] (the shared quota today; a HAMi-core shared region may later).
//!
//! # How it waits
//!
//! In the allocating thread, never in a thread of the shim's own. The thread takes a ticket in
//! the budget's queue of waiters ([`SharedRoom::enqueue`]), then alternates one try under the
//! budget's lock ([`SharedRoom::attempt`]) with a sleep on a futex word of the shared mapped file
//! ([`SharedRoom::wake_word`]): `FUTEX_WAIT` with a timeout, without `FUTEX_PRIVATE_FLAG`, since
//! the waker is another process. Every release, departure, reclaimed member and change of the
//! queue bumps the word and wakes its sleepers (`FUTEX_WAKE`), so a waiter retries as soon as
//! room may have appeared. A futex rather than sleeps with backoff: a waiter proceeds within
//! microseconds of a free (a backoff would add up to its longest step), and sleeps cost nothing
//! meanwhile. The word is read under the lock in the same try that found no room: a release
//! after that try bumps it, so the sleep returns at once (no lost wake-up).
//!
//! Each sleep lasts at most [`POLL`]: a member killed with `SIGKILL` wakes nobody, and its
//! memory is found (and handed on) by the next try, within that time. `EINTR` (a signal) ends a
//! sleep early; the loop tries again. The whole wait is bounded by its deadline, after which one
//! last try is made and the allocation fails with out-of-memory. No lock is held while
//! sleeping, nor across a call into the driver (the loop makes none).
//!
//! # Order and deadlock
//!
//! Tickets are handed out in order; a try reserves only for the oldest live waiter of the
//! device (FIFO across processes: a later, smaller request does not pass an earlier one). A
//! request that fits without waiting is not queued. If every live member of the group is
//! waiting, nobody can free: the newest waiter fails at once (`Attempt::AllWaiting`).
//!
//! This module uses only `libc`: the `gpushim` command compiles it too.

use std::sync::atomic::AtomicU32;
use std::time::{Duration, Instant};

/// The longest sleep between two tries: how soon a waiter notices a member killed without
/// waking it (`SIGKILL`).
pub const POLL: Duration = Duration::from_millis(100);

/// What one try under the budget's lock found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// Reserved; the waiter has left the queue.
    Reserved,
    /// No room yet (or another waiter is first): sleep while the wake word holds this value.
    Wait(u32),
    /// Every live member is waiting and this is the newest waiter: fail now (it has left the
    /// queue). The group's total on the device.
    AllWaiting(u64),
    /// The budget cannot be used (its lock is unusable, this member's place is gone): fail now.
    /// The group's total as far as known.
    Failed(u64),
}

/// A budget shared by processes that refused allocations can wait on. Implemented by the shared
/// quota (`quota::Quota`); a shared region keeping its own queue and futex word can implement it
/// the same way and reuse [`wait_for_room`].
pub trait SharedRoom {
    /// Takes a ticket in the queue of waiters for the budget's device `d`; `None` when the
    /// thread cannot wait (the queue is full, the lock is unusable): it fails at once.
    fn enqueue(&self, d: usize) -> Option<u64>;
    /// One try, under the budget's lock: reclaims dead members' memory; reserves `bytes` for this
    /// member if `ticket` is the oldest live waiter of `d` and the group's total stays within
    /// `limit`; otherwise says whether to wait or fail.
    fn attempt(&self, d: usize, ticket: u64, bytes: u64, limit: u64) -> Attempt;
    /// Leaves the queue (a wait that timed out); nothing if `ticket` left already. Wakes the
    /// other waiters (the first may have changed).
    fn dequeue(&self, ticket: u64);
    /// The futex word waiters sleep on (in the shared mapping).
    fn wake_word(&self) -> &AtomicU32;
}

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Reserved,
    /// The deadline passed.
    TimedOut,
    /// Every live member was waiting; this was the newest waiter.
    AllWaiting,
    /// No place in the queue, or the budget unusable.
    Failed,
}

/// A wait's outcome: how it ended, how long it took, and the group's total last seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waited {
    pub end: End,
    pub waited: Duration,
    pub total: u64,
}

/// Waits up to `wait` for `bytes` to fit within `limit` on device `d` of `room`, reserving them
/// when they do (see the module docs).
pub fn wait_for_room(room: &dyn SharedRoom, d: usize, bytes: u64, limit: u64, wait: Duration) -> Waited {
    let start = Instant::now();
    let deadline = start + wait;
    let done = |end, total| Waited { end, waited: start.elapsed(), total };
    let Some(ticket) = room.enqueue(d) else { return done(End::Failed, 0) };
    loop {
        match room.attempt(d, ticket, bytes, limit) {
            Attempt::Reserved => return done(End::Reserved, 0),
            Attempt::AllWaiting(total) => return done(End::AllWaiting, total),
            Attempt::Failed(total) => {
                room.dequeue(ticket);
                return done(End::Failed, total);
            }
            Attempt::Wait(seen) => {
                let now = Instant::now();
                if now >= deadline {
                    room.dequeue(ticket);
                    return done(End::TimedOut, 0);
                }
                crate::platform::sys::futex_wait(room.wake_word(), seen, (deadline - now).min(POLL));
            }
        }
    }
}
