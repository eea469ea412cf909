//! Per-device budgets and the map of live allocations.
//!
//! The limit is enforced by reserving before allocating: [`DeviceBudget::try_reserve`] adds the
//! request to `reserved` with a compare-and-swap that fails if the sum would pass the limit,
//! the driver is called only after that succeeded, and the reservation is rolled back if the
//! driver refuses. A free is credited only after the driver freed. So at every instant the
//! memory the driver holds for the program is at most `reserved`, and `reserved` is at most the
//! limit, whatever the threads do.
//!
//! `in_use` is what the program holds. In `passthrough` mode it equals `reserved`; in `grow`
//! and `preallocate` modes `reserved` also holds the reserve's free blocks (see `reserve`).
//!
//! The live map remembers, for each pointer or handle the program got, the device and size it
//! was counted with, so the free gives back exactly what the allocation took. Device pointers
//! (the allocation path) are kept in a fixed lock-free table ([`LiveMap`]): recording and
//! forgetting one takes no lock, allocates nothing and makes no system call; the rest (other
//! kinds of keys, and what the table has no room for) in a map sharded by key so threads rarely
//! meet on a lock. No lock is ever held across a call into the driver.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::Acquire, Ordering::Relaxed, Ordering::Release, Ordering::SeqCst};

use gpushim_common::bounded::{self, Backoff, BitWait, Bounded, Stuck};
use gpushim_common::live::Figures;
use gpushim_common::quota::Quota;

pub use crate::devices::MAX_DEVICES;

/// The published limit of a device not yet resolved (`live`).
const UNRESOLVED: u64 = u64::MAX;

/// The budget of one device in the program's view. All-zero bytes are a valid budget, the one
/// [`DeviceBudget::new`] makes (every field is an atomic integer or pointer whose zero means
/// "nothing yet"): [`zeroed_budgets`] makes them all at once without writing them.
///
/// **Where its figures are.** In the budget itself until the process publishes its figures
/// (`live`, at `cuInit`); from then on in the published file's entry for the device, which
/// *are* the counters (one update per change, not a copy kept beside them). The move happens
/// once ([`publish_budgets`]), while no update is under way: until then every update passes a
/// gate ([`DeviceBudget::update`]) that the move closes, so none lands in the old place after
/// it was copied. A budget whose figures stay its own (not published: beyond `live::DEVICES`,
/// or no file) points at them from then on and updates them without the gate.
pub struct DeviceBudget {
    /// The effective limit in bytes plus one; 0 until the device's physical size is known.
    limit_plus_one: AtomicU64,
    /// Where the figures are: null until publication ([`DeviceBudget::own`], through the gate),
    /// then the published entry's or `own`. Changes only then and in a forked child.
    figures: AtomicPtr<Figures>,
    /// The figures before publication (and after, if they are not published); their `limit`
    /// is unused (the limit is `limit_plus_one`). `reserved` is what the limit bounds: bytes
    /// taken from the driver for the program; `in_use` what the program holds (≤ `reserved`,
    /// up to a moment's lag between the two).
    own: Figures,
    /// Bytes freed into stream-ordered pools that the driver may still hold (pools keep freed
    /// memory until a synchronisation or a trim releases it): still in `reserved`, no longer in
    /// `in_use`, credited once the driver shows the pools gave them back (`pools`).
    pool_kept: AtomicU64,
    /// Bumped by every free into a pool (after the driver's free, before `pool_kept` grows): a
    /// reconciliation whose driver figures may predate a free credits nothing.
    pool_epoch: AtomicU64,
    /// The device's entry in a shared quota (`quota`): reservations are then checked against
    /// what every member holds. Set once (null: none), never freed.
    shared: AtomicPtr<(&'static Quota, usize)>,
}

/// The gate of updates to figures not yet moved ([`DeviceBudget::update`]), which the move
/// ([`publish_budgets`]) closes: updates inside, whether it is closed, and by which thread. An
/// update inside only loads and stores atomics (it never waits for anything), so the move's
/// wait is short. Both waits are bounded (`bounded`): an update from a signal handler that
/// interrupted the moving thread finds the gate closed by its own thread and does not wait
/// ([`DeviceBudget::update_gated`]); a move from a signal handler that interrupted an update
/// inside gives up after the bound (the figures then stay where they are, unpublished).
struct Gate {
    inside: AtomicU64,
    closed: AtomicBool,
    /// The closing thread's mark (`bounded::this_thread`; 0: none).
    closer: AtomicUsize,
}

/// What the gate is called in messages.
const GATE_WHAT: &str = "the move of the memory figures into the published file";

/// The process' gate.
static GATE: Gate = Gate::new();

/// Inside a gate: entered once it is open, left when dropped.
#[must_use = "the gate is left as soon as this is dropped"]
struct Inside<'a>(&'a Gate);

impl Gate {
    const fn new() -> Gate {
        Gate { inside: AtomicU64::new(0), closed: AtomicBool::new(false), closer: AtomicUsize::new(0) }
    }

    /// Enters once the gate is open; refused at once if this thread closed it, and after the
    /// bound (`bounded::WAIT_BOUND`) if it stays closed.
    fn enter(&self) -> Result<Inside<'_>, Stuck> {
        let mut backoff = Backoff::new();
        loop {
            // (SeqCst, with the move's: an update that entered is waited for, or sees the gate
            // closed and waits itself)
            self.inside.fetch_add(1, SeqCst);
            if !self.closed.load(SeqCst) {
                return Ok(Inside(self));
            }
            self.inside.fetch_sub(1, SeqCst);
            while self.closed.load(SeqCst) {
                if self.closer.load(SeqCst) == bounded::this_thread() {
                    return Err(Stuck::Reentered(GATE_WHAT));
                }
                if !backoff.wait() {
                    return Err(Stuck::TimedOut(GATE_WHAT));
                }
            }
        }
    }

    /// Closes the gate and waits until no update is inside; runs `f`; opens it again (also
    /// if `f` unwound: a gate left closed would hold every later update forever). One closer
    /// at a time: another waits until it is opened (or it would open it under the first).
    /// Both waits are bounded: `Err` (and `f` not run) when one gave up.
    fn closed_for<R>(&self, f: impl FnOnce() -> R) -> Result<R, Stuck> {
        self.closed_for_within(bounded::WAIT_BOUND, f)
    }

    fn closed_for_within<R>(&self, bound: std::time::Duration, f: impl FnOnce() -> R) -> Result<R, Stuck> {
        struct Open<'a>(&'a Gate);
        impl Drop for Open<'_> {
            fn drop(&mut self) {
                self.0.closer.store(0, SeqCst);
                self.0.closed.store(false, SeqCst);
            }
        }
        let me = bounded::this_thread();
        let mut backoff = Backoff::within(bound);
        while self.closed.compare_exchange_weak(false, true, SeqCst, SeqCst).is_err() {
            if self.closer.load(SeqCst) == me {
                return Err(Stuck::Reentered(GATE_WHAT));
            }
            if !backoff.wait() {
                return Err(Stuck::TimedOut(GATE_WHAT));
            }
        }
        self.closer.store(me, SeqCst);
        let _open = Open(self);
        let mut backoff = Backoff::within(bound);
        while self.inside.load(SeqCst) != 0 {
            if !backoff.wait() {
                return Err(Stuck::TimedOut(GATE_WHAT));
            }
        }
        Ok(f())
    }

    /// In a forked child: open and empty. The parent's threads that were inside, or closing
    /// it, are not in the child; left as copied, the child's own move would wait for them
    /// forever.
    fn reset_after_fork(&self) {
        self.inside.store(0, SeqCst);
        self.closer.store(0, SeqCst);
        self.closed.store(false, SeqCst);
    }
}

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.0.inside.fetch_sub(1, SeqCst);
    }
}

/// Moves each budget's figures to `place(i)`, budget `i`'s published entry (`None`: they stay
/// its own): copied while the gate holds every update out, then pointed at. Once per process,
/// when it starts publishing (or finds it will not: every `place` `None`); later updates pass
/// no gate. If the gate cannot be closed within the bound (`bounded`), nothing moves: the
/// figures stay the budgets' own (unpublished; limits hold on them as before), with one line.
pub fn publish_budgets(budgets: &'static [DeviceBudget], place: impl Fn(usize) -> Option<&'static Figures>) {
    let moved = GATE.closed_for(|| {
        for (i, b) in budgets.iter().enumerate() {
            if !b.figures.load(Acquire).is_null() {
                continue; // (moved already: never twice)
            }
            let to = match place(i) {
                Some(f) => {
                    let own = &b.own;
                    f.limit.store(b.limit().unwrap_or(UNRESOLVED), Relaxed);
                    for (from, to) in [(&own.in_use, &f.in_use), (&own.peak_in_use, &f.peak_in_use), (&own.reserved, &f.reserved), (&own.peak_reserved, &f.peak_reserved), (&own.refused, &f.refused)] {
                        to.store(from.load(Relaxed), Relaxed);
                    }
                    f
                }
                None => &b.own,
            };
            b.figures.store(to as *const Figures as *mut Figures, Release);
        }
    });
    if let Err(stuck) = moved {
        crate::platform::log::stuck("publishing the memory figures", stuck);
    }
}

/// The budgets of `n` devices: all zero, as [`DeviceBudget::new`] makes them ([`Zeroed`]);
/// if that cannot be mapped, made one by one.
pub enum Budgets {
    Mapped(Zeroed<DeviceBudget>),
    Boxed(Box<[DeviceBudget]>),
}

impl Budgets {
    pub fn new(n: usize) -> Budgets {
        let mapped = Zeroed::new(n);
        if mapped.len() == n {
            return Budgets::Mapped(mapped);
        }
        Budgets::Boxed((0..n).map(|_| DeviceBudget::new()).collect())
    }
}

impl std::ops::Deref for Budgets {
    type Target = [DeviceBudget];
    #[inline]
    fn deref(&self) -> &[DeviceBudget] {
        match self {
            Budgets::Mapped(z) => z,
            Budgets::Boxed(b) => b,
        }
    }
}

/// Subtracts `bytes` from `counter`, never below zero; returns what was subtracted. One
/// `fetch_sub` (a compare-and-swap loop costs more on every free); should the counter have
/// held less (a bug), the excess is added back. Meanwhile the counter reads as a huge
/// number: a reservation is then refused, never admitted beyond the limit.
#[inline]
fn saturating_sub(counter: &AtomicU64, bytes: u64) -> u64 {
    let before = counter.fetch_sub(bytes, Relaxed);
    if before >= bytes {
        return bytes;
    }
    counter.fetch_add(bytes - before, Relaxed);
    before
}

/// Raises `peak` to `now` if that is higher: a plain load in the steady state, where the peak
/// is already higher (`fetch_max` always writes, a locked instruction on every call).
#[inline]
fn raise_peak(peak: &AtomicU64, now: u64) {
    if now > peak.load(Relaxed) {
        peak.fetch_max(now, Relaxed);
    }
}

/// Why a reservation failed: what was reserved against which limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    pub reserved: u64,
    pub limit: u64,
}

impl DeviceBudget {
    pub const fn new() -> Self {
        DeviceBudget {
            limit_plus_one: AtomicU64::new(0),
            figures: AtomicPtr::new(std::ptr::null_mut()),
            own: Figures::new(),
            pool_kept: AtomicU64::new(0),
            pool_epoch: AtomicU64::new(0),
            shared: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// The figures, to read (no gate: a read during the move sees them before or after it).
    #[inline]
    fn figures(&self) -> &Figures {
        let p = self.figures.load(Acquire);
        // SAFETY: a non-null pointer is this budget's `own` or a published entry, whose
        // mapping is never unmapped (`publish_budgets`).
        if p.is_null() { &self.own } else { unsafe { &*p } }
    }

    /// Runs `op`, an update, on the figures: where they are, or, before they were moved
    /// ([`publish_budgets`]), inside the gate. `op` only loads and stores atomics.
    #[inline(always)]
    fn update<R>(&self, op: impl FnOnce(&Figures) -> R) -> R {
        let p = self.figures.load(Acquire);
        if !p.is_null() {
            // SAFETY: as in `figures`.
            return op(unsafe { &*p });
        }
        self.update_gated(op)
    }

    /// [`DeviceBudget::update`] before the move. If the gate cannot be entered (a signal
    /// handler that interrupted the move on its own thread, or a move stuck past the bound),
    /// `op` runs on the figures where they are now. Only the reservation decides anything, and
    /// it is refused instead ([`DeviceBudget::try_reserve`]); any other update lost to a copy
    /// made meanwhile errs closed (a credit or a release not made leaves more counted; a `take`
    /// not made shows less in use, while `reserved`, which the limit bounds, holds it).
    #[cold]
    #[inline(never)]
    fn update_gated<R>(&self, op: impl FnOnce(&Figures) -> R) -> R {
        let _inside = GATE.enter();
        // (moved meanwhile, before the gate closed behind us: there)
        op(self.figures())
    }

    /// [`DeviceBudget::update`], refused (`Err`) where `update_gated` would go on without
    /// the gate.
    #[inline(always)]
    fn try_update<R>(&self, op: impl FnOnce(&Figures) -> R) -> Result<R, Stuck> {
        let p = self.figures.load(Acquire);
        if !p.is_null() {
            // SAFETY: as in `figures`.
            return Ok(op(unsafe { &*p }));
        }
        let _inside = GATE.enter()?;
        Ok(op(self.figures()))
    }

    /// Whether an update now would pass the gate: `Err` when it cannot be entered (checked
    /// before a shared quota's reservation, whose own update comes after it).
    #[inline]
    fn gate_passable(&self) -> Result<(), Stuck> {
        self.try_update(|_| ())
    }

    /// Makes reservations on this device count in `quota`'s device `index`.
    /// (The first call wins, as the first resolution of the device's limit does.)
    pub fn share(&self, quota: &'static Quota, index: usize) {
        let entry = Box::into_raw(Box::new((quota, index)));
        if self.shared.compare_exchange(std::ptr::null_mut(), entry, Release, Relaxed).is_err() {
            // SAFETY: `entry` came from Box::into_raw above and was never shared.
            drop(unsafe { Box::from_raw(entry) });
        }
    }

    /// The shared quota's device this budget draws on, if any.
    #[inline]
    pub fn shared(&self) -> Option<(&'static Quota, usize)> {
        let p = self.shared.load(Acquire);
        // SAFETY: a non-null entry was leaked by `share` and is never freed or changed.
        (!p.is_null()).then(|| unsafe { *p })
    }

    /// What counts against the limit: this process' reservations, or with a shared quota what
    /// all its members hold.
    pub fn held(&self) -> u64 {
        match self.shared() {
            Some((q, d)) => q.reserved(d),
            None => self.reserved(),
        }
    }

    /// (Acquire: a limit seen resolved comes with the shared quota `share` set before it.)
    #[inline]
    pub fn limit(&self) -> Option<u64> {
        self.limit_plus_one.load(Acquire).checked_sub(1)
    }

    pub fn set_limit(&self, limit: u64) {
        // (inside the gate: the move copies the limit, or this stores it in the moved figures)
        self.update(move |f| {
            self.limit_plus_one.store(limit.min(UNRESOLVED - 1) + 1, SeqCst);
            // the figures show the limit in force: of two set at once, the one stored last
            // (SeqCst: whichever stores the figures' last sees the last limit, and stores it)
            loop {
                let now = self.limit_plus_one.load(SeqCst) - 1;
                f.limit.store(now, SeqCst);
                if self.limit_plus_one.load(SeqCst) - 1 == now {
                    return;
                }
            }
        });
    }

    pub fn reserved(&self) -> u64 {
        self.figures().reserved.load(Relaxed)
    }

    pub fn peak_reserved(&self) -> u64 {
        self.figures().peak_reserved.load(Relaxed)
    }

    pub fn in_use(&self) -> u64 {
        self.figures().in_use.load(Relaxed)
    }

    pub fn peak_in_use(&self) -> u64 {
        self.figures().peak_in_use.load(Relaxed)
    }

    pub fn refused(&self) -> u64 {
        self.figures().refused.load(Relaxed)
    }

    /// Adds `bytes` to what is reserved if that stays within `limit` (not counted as a
    /// refusal: the caller decides whether the program's request is refused).
    /// Before the figures moved, a reservation whose gate cannot be entered (`update_gated`)
    /// is refused too, with one line saying why.
    #[inline]
    pub fn try_reserve(&self, bytes: u64, limit: u64) -> Result<(), Refused> {
        let checked = match self.shared() {
            Some((quota, d)) => self.gate_passable().map(|()| self.try_reserve_shared(quota, d, bytes, limit)),
            None => self.try_update(move |f| reserve_in(f, bytes, limit)),
        };
        checked.unwrap_or_else(|stuck| {
            crate::platform::log::stuck("a reservation", stuck);
            Err(Refused { reserved: self.reserved(), limit })
        })
    }

    /// [`DeviceBudget::try_reserve`] in a shared quota.
    #[inline(never)]
    fn try_reserve_shared(&self, quota: &Quota, d: usize, bytes: u64, limit: u64) -> Result<(), Refused> {
        // the quota's total bounds ours (ours is part of it)
        quota.reserve(d, bytes, limit).map_err(|total| Refused { reserved: total, limit })?;
        self.update(move |f| {
            let now = f.reserved.fetch_add(bytes, Relaxed).saturating_add(bytes);
            raise_peak(&f.peak_reserved, now);
        });
        Ok(())
    }

    /// Gives back `bytes` of the reservation (never below zero).
    #[inline]
    pub fn release(&self, bytes: u64) {
        self.update(move |f| saturating_sub(&f.reserved, bytes));
        if let Some((quota, d)) = self.shared() {
            quota.release(d, bytes);
        }
    }

    /// The program now holds `bytes` more.
    #[inline]
    pub fn take(&self, bytes: u64) {
        self.update(move |f| take_in(f, bytes));
    }

    /// The driver freed `bytes` the program held: [`DeviceBudget::release`] and
    /// [`DeviceBudget::give`] in one (the free path's; the quota is looked at once).
    #[inline]
    pub fn freed(&self, bytes: u64) {
        self.update(move |f| freed_in(f, bytes));
        if let Some((quota, d)) = self.shared() {
            quota.release(d, bytes);
        }
    }

    /// The figures once moved ([`publish_budgets`]), for updates without the gate (the fast
    /// lane's: [`Moved`]); `None` before.
    #[inline(always)]
    pub fn moved(&self) -> Option<Moved<'_>> {
        let p = self.figures.load(Acquire);
        // SAFETY: as in `figures`.
        (!p.is_null()).then(|| Moved(unsafe { &*p }))
    }

    /// The program gave `bytes` back (never below zero).
    #[inline]
    pub fn give(&self, bytes: u64) {
        self.update(move |f| saturating_sub(&f.in_use, bytes));
    }

    /// Bytes freed into stream-ordered pools and possibly still held by them.
    pub fn pool_kept(&self) -> u64 {
        self.pool_kept.load(Relaxed)
    }

    /// A pool allocation of `bytes` was freed: the program holds it no more, but its pool may
    /// keep it, so it stays reserved.
    pub fn keep_in_pool(&self, bytes: u64) {
        self.give(bytes);
        self.pool_epoch.fetch_add(1, SeqCst);
        self.pool_kept.fetch_add(bytes, SeqCst);
    }

    /// Read before asking the driver what the pools keep (see [`DeviceBudget::pools_keep`]).
    pub fn pool_epoch(&self) -> u64 {
        self.pool_epoch.load(SeqCst)
    }

    /// The pools keep at most `kept` bytes, by driver figures read after `epoch` was: credits
    /// what they gave back (never more than was counted as kept). Nothing is credited if a
    /// pool free happened since `epoch` (its bytes may be missing from the figures).
    pub fn pools_keep(&self, kept: u64, epoch: u64) {
        loop {
            // `before` is read first: a free counted in it bumped the epoch before adding to
            // it, so the epoch check below sees that free (whose bytes the figures may miss)
            let before = self.pool_kept.load(SeqCst);
            if self.pool_epoch.load(SeqCst) != epoch {
                return;
            }
            if before <= kept {
                return;
            }
            if self.pool_kept.compare_exchange(before, kept, SeqCst, SeqCst).is_ok() {
                self.release(before - kept);
                return;
            }
        }
    }

    /// A forked child holds nothing (`fork`): every figure back to zero, the limit kept. Its
    /// figures are its own again (a published entry is its parent's); moved or not, as they
    /// were (a child of a process that had not published yet may publish).
    pub fn reset_after_fork(&self) {
        if !self.figures.load(Relaxed).is_null() {
            self.figures.store(&self.own as *const Figures as *mut Figures, SeqCst);
        }
        let own = &self.own;
        for a in [&own.reserved, &own.peak_reserved, &own.in_use, &own.peak_in_use, &own.refused, &self.pool_kept] {
            a.store(0, SeqCst);
        }
        self.pool_epoch.fetch_add(1, SeqCst);
    }

    /// Counts one of the program's requests as refused.
    pub fn count_refusal(&self) {
        self.update(move |f| f.refused.fetch_add(1, Relaxed));
    }
}

/// A budget's figures after the move ([`DeviceBudget::moved`]), updated as the budget's own
/// methods do (`try_reserve`, `take`, `freed` and `release` without a shared quota: the fast
/// lane never has one). They stay where they are while the process lives, but in a forked
/// child, whose only thread is the one that forked: a handle may be kept across a call into
/// the driver. (A `fork` from a signal handler that interrupted that call is not supported:
/// the shim's fork handlers take locks, as glibc's own do.)
#[derive(Clone, Copy)]
pub struct Moved<'a>(&'a Figures);

impl Moved<'_> {
    /// [`DeviceBudget::try_reserve`] against `budget`'s limit (whose figures these are):
    /// whether `bytes` were reserved; `false` also when the limit is not resolved yet.
    #[inline(always)]
    pub fn try_reserve_within(self, budget: &DeviceBudget, bytes: u64) -> bool {
        let limit_plus_one = budget.limit_plus_one.load(Acquire);
        // (one test for both: a limit not resolved is 0 here)
        if limit_plus_one <= bytes {
            return false; // not resolved, or `bytes` alone beyond the limit
        }
        reserve_within(self.0, bytes, limit_plus_one - 1 - bytes).is_ok()
    }

    #[inline(always)]
    pub fn take(self, bytes: u64) {
        take_in(self.0, bytes)
    }

    #[inline(always)]
    pub fn freed(self, bytes: u64) {
        freed_in(self.0, bytes)
    }

    #[inline(always)]
    pub fn release(self, bytes: u64) {
        saturating_sub(&self.0.reserved, bytes);
    }
}

/// Adds `bytes` to `f`'s reservations if that stays within `limit` ([`DeviceBudget::try_reserve`]).
#[inline(always)]
fn reserve_in(f: &Figures, bytes: u64, limit: u64) -> Result<(), Refused> {
    // what may be reserved already for `bytes` to fit (none: `bytes` alone is too many)
    let refused = |reserved| Refused { reserved, limit };
    match limit.checked_sub(bytes) {
        Some(room) => reserve_within(f, bytes, room).map_err(refused),
        None => Err(refused(f.reserved.load(Relaxed))),
    }
}

/// Adds `bytes` to `f`'s reservations if at most `room` is reserved (`room + bytes` does not
/// overflow); `Err`: what was reserved.
#[inline(always)]
fn reserve_within(f: &Figures, bytes: u64, room: u64) -> Result<(), u64> {
    let mut reserved = f.reserved.load(Relaxed);
    loop {
        if reserved > room {
            return Err(reserved);
        }
        let next = reserved + bytes; // ≤ room + bytes
        match f.reserved.compare_exchange_weak(reserved, next, Relaxed, Relaxed) {
            Ok(_) => {
                raise_peak(&f.peak_reserved, next);
                return Ok(());
            }
            Err(now) => reserved = now,
        }
    }
}

/// The program now holds `bytes` more ([`DeviceBudget::take`]).
#[inline(always)]
fn take_in(f: &Figures, bytes: u64) {
    // (wrapping: the counter itself would have wrapped)
    let now = f.in_use.fetch_add(bytes, Relaxed).wrapping_add(bytes);
    raise_peak(&f.peak_in_use, now);
}

/// `bytes` fewer reserved and held, each never below zero ([`DeviceBudget::freed`]):
/// `saturating_sub` of both, their common case tested once.
#[inline(always)]
fn freed_in(f: &Figures, bytes: u64) {
    let reserved = f.reserved.fetch_sub(bytes, Relaxed);
    let in_use = f.in_use.fetch_sub(bytes, Relaxed);
    if reserved < bytes || in_use < bytes {
        freed_short(f, reserved, in_use, bytes);
    }
}

/// `freed_in`'s subtractions when a counter held less than `bytes` (a bug): the excess
/// added back, as `saturating_sub` does.
#[cold]
#[inline(never)]
fn freed_short(f: &Figures, reserved: u64, in_use: u64, bytes: u64) {
    for (counter, before) in [(&f.reserved, reserved), (&f.in_use, in_use)] {
        if before < bytes {
            counter.fetch_add(bytes - before, Relaxed);
        }
    }
}

/// In a forked child (`fork`), before its budgets are used: the gate open and empty (the
/// parent's threads that were inside are not here).
pub fn reset_gate_after_fork() {
    GATE.reset_after_fork();
}

/// What kind of object a live entry is: the key spaces differ (a VMM handle is an opaque
/// number that could equal some device pointer).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Kind {
    DevicePtr = 0,
    VmmHandle = 1,
    Array = 2,
    MipmappedArray = 3,
}

const KINDS: usize = 4;

/// One live allocation: where it was counted and how much.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Live {
    pub device: usize,
    pub bytes: u64,
    /// Served from the device's reserve (`grow`/`preallocate`), not by the driver.
    pub served: bool,
    /// Allocated from a stream-ordered pool: its pool may keep the memory after the free.
    pub pool: bool,
    /// The context an array was created in (0: not recorded; device memory's context is asked
    /// of the driver when a context is torn down, see `teardown`).
    pub ctx: usize,
    /// Unique to this entry ([`entry_id`]): a later entry under the same key (the driver handed
    /// the pointer out again) never compares equal to it.
    pub id: u64,
}

/// A process-unique entry id: one relaxed increment of a counter (cheaper than a thread-local
/// counter in a preloaded library, whose every thread-local access calls `__tls_get_addr`; the
/// allocation path already updates shared counters, so the shared cache line costs nothing new).
#[inline]
pub fn entry_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Relaxed)
}

const SHARDS: usize = 64;

/// A multiply-shift hasher: keys are pointers and handles, already well spread; SipHash would
/// cost more than the rest of an allocation's bookkeeping.
#[derive(Default)]
pub(crate) struct FastHasher(u64);

impl Hasher for FastHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(26);
    }
    fn write_u8(&mut self, v: u8) {
        self.write_u64(v as u64)
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64)
    }
    fn write_isize(&mut self, v: isize) {
        self.write_u64(v as u64)
    }
}

type ShardMap = HashMap<u64, Live, BuildHasherDefault<FastHasher>>;
type Shard = Bounded<ShardMap>;

/// What the live map is called in messages.
const LIVE_WHAT: &str = "gpushim's map of live allocations";

/// The mutex map: `SHARDS` shards for each kind of key. Holds every entry of the kinds other
/// than device pointers, and the device pointers the table has no room for ([`LiveMap`]).
struct Shards {
    shards: Box<[Shard]>,
    /// Entries of each kind (changed under the shard's lock): a kind with none is listed
    /// without taking its 64 locks (context teardown lists arrays at every context release).
    counts: [AtomicU64; KINDS],
}

impl Shards {
    fn new() -> Self {
        Shards { shards: (0..SHARDS * KINDS).map(|_| Bounded::new(LIVE_WHAT, HashMap::default())).collect(), counts: [const { AtomicU64::new(0) }; KINDS] }
    }

    /// One entry of `kind` more (under its shard's lock).
    fn one_more(&self, kind: Kind) {
        self.counts[kind as usize].fetch_add(1, Relaxed);
    }

    /// One entry of `kind` fewer (under its shard's lock).
    fn one_fewer(&self, kind: Kind) {
        self.counts[kind as usize].fetch_sub(1, Relaxed);
    }

    /// The shard of `key`, locked (bounded: `Err` when it cannot be had).
    fn shard(&self, kind: Kind, key: u64) -> Result<bounded::Guard<'_, ShardMap>, Stuck> {
        // Device pointers are at least 256-byte aligned: mix the bits that vary.
        let h = ((key >> 8).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize % SHARDS;
        self.shards[kind as usize * SHARDS + h].lock()
    }

    /// Inserts into `shard` (`key`'s, locked).
    fn insert_in(&self, shard: &mut ShardMap, kind: Kind, key: u64, live: Live) -> Option<Live> {
        let replaced = shard.insert(key, live);
        if replaced.is_none() {
            self.one_more(kind);
        }
        replaced
    }

    /// Removes `key` from `shard` (its, locked), if it holds `expected` when given.
    fn remove_in(&self, shard: &mut ShardMap, kind: Kind, key: u64, expected: Option<&Live>) -> Option<Live> {
        if expected.is_some_and(|e| shard.get(&key) != Some(e)) {
            return None;
        }
        let removed = shard.remove(&key);
        if removed.is_some() {
            self.one_fewer(kind);
        }
        removed
    }

    fn insert(&self, kind: Kind, key: u64, live: Live) -> Result<Option<Live>, Stuck> {
        Ok(self.insert_in(&mut *self.shard(kind, key)?, kind, key, live))
    }

    fn get(&self, kind: Kind, key: u64) -> Result<Option<Live>, Stuck> {
        Ok(self.shard(kind, key)?.get(&key).copied())
    }

    fn remove(&self, kind: Kind, key: u64, expected: Option<&Live>) -> Result<Option<Live>, Stuck> {
        Ok(self.remove_in(&mut *self.shard(kind, key)?, kind, key, expected))
    }

    /// Copies the entries of `kind` into `all`; a shard that cannot be locked is left out
    /// (`Err` says so, after the others were copied).
    fn entries_into(&self, kind: Kind, all: &mut Vec<(u64, Live)>) -> Result<(), Stuck> {
        if self.counts[kind as usize].load(Relaxed) == 0 {
            return Ok(()); // (an entry added meanwhile may be missed, as by the sweep below)
        }
        let mut stuck = Ok(());
        for shard in &self.shards[kind as usize * SHARDS..(kind as usize + 1) * SHARDS] {
            match shard.lock() {
                Ok(shard) => all.extend(shard.iter().map(|(&k, &v)| (k, v))),
                Err(e) => stuck = Err(e),
            }
        }
        stuck
    }

    fn hold_for_fork(&'static self) {
        for shard in self.shards.iter() {
            crate::platform::fork::hold(shard);
        }
    }

    fn reset_after_fork(&self) {
        for shard in self.shards.iter() {
            shard.reset_after_fork(HashMap::default());
        }
        for c in &self.counts {
            c.store(0, Relaxed);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().map_or(0, |m| m.len())).sum()
    }
}

/// Slots per bucket of the table (a bucket is 32 words: four cache lines).
const SLOTS: usize = 10;
/// Buckets of the table: 81,920 slots in 2 MiB of address space, pages committed as they are
/// first written (the table is zeroed memory from the allocator, i.e. fresh anonymous pages).
const BUCKETS: usize = 8192;

/// `Bucket::meta`, from its lowest bit: the occupied slots (one bit each, from bit 0: a slot's
/// number is its bit's, with no shift), `SPILLED` (above them: "not spilled and not full" is
/// one comparison), `BUSY`, then the sequence.
const OCC_SHIFT: u32 = 0;
const OCC_MASK: u64 = ((1 << SLOTS) - 1) << OCC_SHIFT;
/// `Bucket::meta`: some device pointer of this bucket is in the mutex map (`Bucket::spilled`).
const SPILLED: u64 = 1 << (OCC_SHIFT + SLOTS as u32);
/// `Bucket::meta`: a writer is inside (the bucket's other words may be half-written).
const BUSY: u64 = SPILLED << 1;
/// The sequence part of `Bucket::meta`: bumped by every write, so a reader that saw the same
/// word before and after its reads saw no write in between (a seqlock).
const SEQ_ONE: u64 = BUSY << 1;

/// What a slot's packed word holds: bytes (52 bits) | device (10 bits) | pool | served.
const PACK_DEVICES: usize = 1 << 10;
const PACK_BYTES: u64 = 1 << 52;

/// One bucket of the lock-free table: up to `SLOTS` device pointers whose hash picks it.
#[repr(C, align(64))]
struct Bucket {
    /// Occupied slots (one bit each) | `SPILLED` | `BUSY` | sequence.
    meta: AtomicU64,
    /// How many device pointers of this bucket are in the mutex map; written only by the writer
    /// that holds `BUSY`. `SPILLED` is set in `meta` while it is not zero.
    spilled: AtomicU64,
    /// Per slot: key, packed entry, entry id.
    slots: [[AtomicU64; 3]; SLOTS],
}

impl Bucket {
    /// Waits until no other writer is inside, then enters: returns the word as it now holds it
    /// (`BUSY` set; the word does not change until this writer leaves, as only the writer
    /// inside writes it). A writer stays inside only for a few loads and stores (never across
    /// a driver call, an allocation or a lock other than the mutex map's), so this almost
    /// never waits. (One bit test-and-set and a load: a compare-and-swap would need the word
    /// first and costs ~5 instructions more on the allocation path.) The wait is bounded
    /// (`bounded::BitWait`: the writer bit cannot say whose it is, so a signal handler that
    /// interrupted its own thread inside waits out the bound once): `None` when it gave up
    /// (`Stuck::TimedOut`; an `Option`, returned in registers: the allocation pair's path
    /// pays nothing for it).
    #[inline(always)]
    fn enter(&self) -> Option<u64> {
        if self.meta.fetch_or(BUSY, Acquire) & BUSY == 0 {
            // The data stores that follow are ordered after BUSY (see `read`).
            fence(Release);
            return Some(self.meta.load(Relaxed));
        }
        // (tested here, before the paths meet: the path that did not wait tests nothing)
        match self.enter_waiting() {
            0 => None,
            before => Some(before),
        }
    }

    /// [`Bucket::enter`] without waiting: `None` if another writer is inside (the fast lane
    /// then declines, before any effect, or hands the entry to the state's `record`: the
    /// general path waits, bounded; the lane's own path has no wait to bound).
    #[inline(always)]
    fn try_enter(&self) -> Option<u64> {
        if self.meta.fetch_or(BUSY, Acquire) & BUSY == 0 {
            // (as in `enter`)
            fence(Release);
            return Some(self.meta.load(Relaxed));
        }
        None
    }

    /// [`Bucket::enter`], its failure said (`?` in the general paths).
    #[inline(always)]
    fn enter_or_stuck(&self) -> Result<u64, Stuck> {
        self.enter().ok_or(Stuck::TimedOut(LIVE_WHAT))
    }

    /// The wait of [`Bucket::enter`]: the word as entered (`BUSY` set: never 0), or 0 when it
    /// gave up (a plain integer, returned in a register).
    #[cold]
    #[inline(never)]
    fn enter_waiting(&self) -> u64 {
        let mut wait = BitWait::new(&self.meta, LIVE_WHAT);
        loop {
            if wait.step().is_err() {
                return 0;
            }
            // (read until free, then try: trying writes the line, waiting only reads it)
            if self.meta.load(Relaxed) & BUSY == 0 && self.meta.fetch_or(BUSY, Acquire) & BUSY == 0 {
                fence(Release);
                return self.meta.load(Relaxed);
            }
        }
    }

    /// Leaves, publishing `occ` and `spilled` (`held`: what `enter` returned).
    #[inline]
    fn leave(&self, held: u64, occ: u64, spilled: bool) {
        let seq = (held & !(SEQ_ONE - 1)).wrapping_add(SEQ_ONE);
        self.meta.store(seq | occ | if spilled { SPILLED } else { 0 }, Release);
    }

    /// Leaves with nothing changed: the word as it was before `enter` (`held` without `BUSY`;
    /// no sequence step, as no slot was written).
    #[inline]
    fn leave_unchanged(&self, held: u64) {
        self.meta.store(held & !BUSY, Release);
    }

    /// Leaves with slot `j` now occupied (`occupied`) or free, `SPILLED` as it was: `leave`
    /// for the packed operations, in two instructions (`held`, what `enter` returned, has
    /// `BUSY` set, the bit below the sequence: adding `BUSY` clears it and carries one
    /// sequence step).
    #[inline(always)]
    fn leave_slot(&self, held: u64, j: usize, occupied: bool) {
        let bit = 1 << (j as u32 + OCC_SHIFT);
        let word = if occupied { held | bit } else { held & !bit };
        self.meta.store(word.wrapping_add(SEQ_ONE - BUSY), Release);
    }

    /// Slot `j`'s words (key, packed entry, id).
    ///
    /// # Safety
    /// `j < SLOTS`.
    #[inline(always)]
    unsafe fn slot(&self, j: usize) -> &[AtomicU64; 3] {
        debug_assert!(j < SLOTS, "slot {j}");
        // SAFETY: the caller's word.
        unsafe { self.slots.get_unchecked(j) }
    }

    /// The slot holding `key` among those `meta` says are occupied.
    #[inline]
    fn find(&self, meta: u64, key: u64) -> Option<usize> {
        let mut occ = (meta & OCC_MASK) >> OCC_SHIFT;
        while occ != 0 {
            let j = occ.trailing_zeros() as usize;
            if self.slots[j][0].load(Relaxed) == key {
                return Some(j);
            }
            occ &= occ - 1;
        }
        None
    }

    #[inline]
    fn load(&self, j: usize) -> Live {
        unpack(self.slots[j][1].load(Relaxed), self.slots[j][2].load(Relaxed))
    }

    #[inline]
    fn load_packed(&self, j: usize) -> Packed {
        Packed { word: self.slots[j][1].load(Relaxed), id: self.slots[j][2].load(Relaxed) }
    }

    #[inline]
    fn store(&self, j: usize, key: u64, packed: u64, id: u64) {
        self.slots[j][0].store(key, Relaxed);
        self.slots[j][1].store(packed, Relaxed);
        self.slots[j][2].store(id, Relaxed);
    }

    /// `LiveMap::insert_packed` in this bucket (its key's).
    #[inline(always)]
    fn insert_packed(&self, key: u64, entry: Packed) -> Result<Option<Packed>, Packed> {
        let Some(before) = self.enter() else { return Err(entry) };
        self.insert_entered(before, key, entry)
    }

    /// `insert_packed` once entered (`before`: the word as entered).
    #[inline(always)]
    fn insert_entered(&self, before: u64, key: u64, entry: Packed) -> Result<Option<Packed>, Packed> {
        // nothing in the mutex map and a slot free: below "every slot occupied", SPILLED clear
        if before & (SPILLED | OCC_MASK) < OCC_MASK {
            let (j, replaced) = match self.find(before, key) {
                // SAFETY: not zero: some slot is free (the test above)
                None => (unsafe { std::num::NonZeroU64::new_unchecked(!before & OCC_MASK) }.trailing_zeros() - OCC_SHIFT, None),
                Some(j) => (j as u32, Some(self.load_packed(j))),
            };
            let j = j as usize;
            // SAFETY: `j` is an occupied slot (`find`) or the lowest free one, below SLOTS
            // (`OCC_MASK` has SLOTS bits and some of them are clear in `before`).
            let slot = unsafe { self.slot(j) };
            slot[0].store(key, Relaxed);
            slot[1].store(entry.word, Relaxed);
            slot[2].store(entry.id, Relaxed);
            self.leave_slot(before, j, true);
            return Ok(replaced);
        }
        self.leave_unchanged(before);
        Err(entry)
    }

    /// `LiveMap::remove_packed` in this bucket (its key's).
    #[inline(always)]
    fn remove_packed(&self, key: u64) -> Result<Option<Packed>, ()> {
        let Some(before) = self.enter() else { return Err(()) };
        self.remove_entered(before, key)
    }

    /// `remove_packed` once entered (`before`: the word as entered).
    #[inline(always)]
    fn remove_entered(&self, before: u64, key: u64) -> Result<Option<Packed>, ()> {
        if let Some(j) = self.find(before, key) {
            let entry = self.load_packed(j);
            self.leave_slot(before, j, false);
            return Ok(Some(entry));
        }
        self.leave_unchanged(before);
        if before & SPILLED == 0 {
            return Ok(None);
        }
        Err(())
    }

    /// Runs `f` on a consistent view of the bucket (the meta word it saw, and reads of the
    /// slots through it) and returns its result: retried while a writer is inside or wrote
    /// meanwhile (bounded: `Err` when the wait gave up). `f` only loads.
    #[inline]
    fn read<R>(&self, mut f: impl FnMut(u64) -> R) -> Result<R, Stuck> {
        let mut wait = BitWait::new(&self.meta, LIVE_WHAT);
        loop {
            let m = self.meta.load(Acquire);
            if m & BUSY == 0 {
                let r = f(m);
                // Pairs with the writer's fence after BUSY: had a load above seen a store of a
                // writer that entered since, this load sees BUSY or a later sequence.
                fence(Acquire);
                if self.meta.load(Relaxed) == m {
                    return Ok(r);
                }
            }
            wait.step()?;
        }
    }
}

/// The packed form of `live`, if it fits a slot (no context, a device and a size in range).
#[inline]
fn pack(live: &Live) -> Option<u64> {
    (live.ctx == 0 && live.device < PACK_DEVICES && live.bytes < PACK_BYTES)
        .then_some(live.served as u64 | (live.pool as u64) << 1 | (live.device as u64) << 2 | live.bytes << 12)
}

/// A device pointer's entry as a table slot holds it: the packed word ([`pack`]) and the id.
/// Two plain integers: the allocation path passes them in registers, where a [`Live`] (whose
/// flags give `Option<Live>` a niche) is built and copied through the stack.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Packed {
    word: u64,
    id: u64,
}

impl Packed {
    /// The packed form of `live`, if it fits a slot ([`pack`]).
    #[inline(always)]
    pub fn of(live: &Live) -> Option<Packed> {
        pack(live).map(|word| Packed { word, id: live.id })
    }

    #[inline(always)]
    pub fn device(self) -> usize {
        ((self.word >> 2) as usize) & (PACK_DEVICES - 1)
    }

    #[inline(always)]
    pub fn bytes(self) -> u64 {
        self.word >> 12
    }

    #[inline(always)]
    pub fn served(self) -> bool {
        self.word & 1 != 0
    }

    #[inline(always)]
    pub fn pool(self) -> bool {
        self.word & 2 != 0
    }

    #[inline(always)]
    pub fn id(self) -> u64 {
        self.id
    }

    #[inline]
    pub fn live(self) -> Live {
        unpack(self.word, self.id)
    }
}

#[inline]
fn unpack(packed: u64, id: u64) -> Live {
    Live {
        device: ((packed >> 2) as usize) & (PACK_DEVICES - 1),
        bytes: packed >> 12,
        served: packed & 1 != 0,
        pool: packed & 2 != 0,
        ctx: 0,
        id,
    }
}

/// The live map. Device pointers (the allocation path's keys) live in a fixed table of
/// buckets, without allocation, lock or system call: a writer enters its key's bucket with one
/// compare-and-swap (a bit the writer holds for a handful of stores), readers never write and
/// retry if a writer was inside (a seqlock). A device pointer whose bucket is full, or whose
/// entry does not fit a slot (a context recorded, a device or size out of range), goes to the
/// sharded mutex map, which also holds every key of the other kinds; its bucket counts it
/// (`SPILLED`), so the mutex map is consulted for a device pointer only when its bucket has
/// some there. Every change to a device pointer's entry, in the table or in the mutex map, is
/// made by the writer inside its bucket: a key is never in both, and the operations on one key
/// are atomic with respect to each other as they were with one lock.
pub struct LiveMap {
    table: Table,
    /// 32 − log2(buckets): see `ptr_bucket`.
    shift: u32,
    shards: Shards,
}

/// A live map's table as the fast lane (`lane`) holds it: where its buckets are and the shift
/// that picks a key's, copied once, so that the pair's path reaches a bucket without looking
/// at the map. Its operations are the map's packed ones ([`LiveMap::insert_packed`],
/// [`LiveMap::remove_packed`]), on the same buckets.
#[derive(Clone, Copy)]
pub struct PtrTable<'a> {
    buckets: *mut Bucket,
    /// 64 − log2(buckets): a key's bucket is its hash's top bits (as `LiveMap::ptr_bucket`
    /// picks it, in one shift: there are at least two buckets, so the shift is below 64).
    shift: u32,
    _map: std::marker::PhantomData<&'a LiveMap>,
}

// SAFETY: a view of the map's buckets (atomics only), which the map shares between threads.
unsafe impl Send for PtrTable<'_> {}
unsafe impl Sync for PtrTable<'_> {}

impl PtrTable<'_> {
    #[inline(always)]
    fn bucket(&self, key: u64) -> &Bucket {
        let h = key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift;
        // SAFETY: the map's table has 2^(64 − shift) buckets (`LiveMap::ptr_table`), live as
        // long as the map, and `h` has 64 − shift bits.
        unsafe { &*self.buckets.add(h as usize) }
    }

    /// [`LiveMap::insert_packed`], except that a bucket another writer is inside is not
    /// waited for (`Err`: the caller's general path records it, waiting there).
    #[inline(always)]
    pub fn insert_packed(&self, key: u64, entry: Packed) -> Result<Option<Packed>, Packed> {
        let b = self.bucket(key);
        let Some(before) = b.try_enter() else { return Err(entry) };
        b.insert_entered(before, key, entry)
    }

    /// [`LiveMap::remove_packed`], except that a bucket another writer is inside is not
    /// waited for (`Err`: the caller takes the general path, which waits).
    #[inline(always)]
    pub fn remove_packed(&self, key: u64) -> Result<Option<Packed>, ()> {
        let b = self.bucket(key);
        let Some(before) = b.try_enter() else { return Err(()) };
        b.remove_entered(before, key)
    }
}

impl LiveMap {
    pub fn new() -> Self {
        Self::with_buckets(BUCKETS)
    }

    /// A map whose table has `buckets` buckets (a power of two; none: every key in the
    /// mutex map, which is also what happens if the table cannot be allocated).
    fn with_buckets(buckets: usize) -> Self {
        let table = zeroed_table(buckets);
        // a key's bucket is its hash's top log2(buckets) bits: shifted right by 32, then by
        // this (a table of 1 bucket: 32 and 32)
        let shift = 32 - table.len().max(1).trailing_zeros();
        LiveMap { table, shift, shards: Shards::new() }
    }

    /// The bucket of a device pointer's key, if the table has any.
    #[inline(always)]
    fn bucket(&self, kind: Kind, key: u64) -> Option<&Bucket> {
        if kind != Kind::DevicePtr || self.table.is_empty() {
            return None;
        }
        self.ptr_bucket(key)
    }

    /// The bucket of a device pointer, if the table has any.
    #[inline(always)]
    fn ptr_bucket(&self, key: u64) -> Option<&Bucket> {
        // Fibonacci hashing: the top bits of the product spread pointers that differ in any bit.
        let h = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) >> self.shift;
        // SAFETY: the table's length is 0 or a power of two, 2^(32 − shift) (`zeroed_table`:
        // at most 2^32 buckets, so 0 ≤ shift ≤ 32), and `h` has 32 − shift bits.
        unsafe { self.table.get_below_len(h as usize) }
    }

    /// [`LiveMap::insert`] of a device pointer whose entry fits a slot, the entry given
    /// packed ([`Packed`]): `insert`'s common case, and what the allocation path records. `Err`
    /// hands the entry back when the table cannot take it here (no table, or the bucket has
    /// keys in the mutex map, or is full): `insert` then enters the bucket again.
    #[inline(always)]
    pub fn insert_packed(&self, key: u64, entry: Packed) -> Result<Option<Packed>, Packed> {
        match self.ptr_bucket(key) {
            Some(b) => b.insert_packed(key, entry),
            None => Err(entry),
        }
    }

    /// [`LiveMap::remove`] of a device pointer found in the table, its entry left packed (the
    /// free path reads two of its fields; building a [`Live`] costs it ~20 instructions of
    /// copies). `Ok(None)`: not recorded. `Err(())`: the key may be in the mutex map (or there
    /// is no table): the caller then uses `remove`.
    #[inline(always)]
    pub fn remove_packed(&self, key: u64) -> Result<Option<Packed>, ()> {
        match self.ptr_bucket(key) {
            Some(b) => b.remove_packed(key),
            None => Err(()),
        }
    }

    /// The table as the fast lane holds it ([`PtrTable`]), if it has at least two buckets.
    pub fn ptr_table(&self) -> Option<PtrTable<'_>> {
        let log2 = self.table.len().trailing_zeros();
        (self.table.len() >= 2).then(|| PtrTable { buckets: self.table.ptr, shift: 64 - log2, _map: std::marker::PhantomData })
    }

    /// Records `live` under `key`; returns the entry it replaces. The driver never hands out a
    /// pointer or handle that is still allocated, so a replaced entry is one the driver freed
    /// behind the shim's back (e.g. with a context the shim did not see destroyed): the caller
    /// credits it. `Err`: nothing recorded (a wait for the key's bucket or shard gave up).
    #[inline(always)]
    pub fn insert(&self, kind: Kind, key: u64, live: Live) -> Result<Option<Live>, Stuck> {
        let mut replaced = None;
        self.insert_then(kind, key, live, |old| replaced = Some(old))?;
        Ok(replaced)
    }

    /// [`LiveMap::insert`], the entry it replaces handed to `replaced` rather than returned
    /// (the allocation path: no `Option<Live>` built and copied in the common case).
    #[inline(always)]
    pub fn insert_then(&self, kind: Kind, key: u64, live: Live, replaced: impl FnOnce(Live)) -> Result<(), Stuck> {
        // The common case: a device pointer whose entry fits, its bucket with room and nothing
        // in the mutex map.
        if kind == Kind::DevicePtr {
            if let Some(packed) = Packed::of(&live) {
                match self.insert_packed(key, packed) {
                    Ok(None) => return Ok(()),
                    Ok(Some(old)) => {
                        replaced(old.live());
                        return Ok(());
                    }
                    Err(_) => {}
                }
            }
        }
        let old = match self.bucket(kind, key) {
            Some(b) => {
                let before = b.enter_or_stuck()?;
                self.insert_spilling(b, before, kind, key, live)?
            }
            None => self.shards.insert(kind, key, live)?,
        };
        if let Some(old) = old {
            replaced(old);
        }
        Ok(())
    }

    /// `insert` inside bucket `b` (entered: `before`) when the mutex map is involved. The
    /// key's shard is locked first when it is needed: if it cannot be had, the bucket is left
    /// unchanged.
    #[cold]
    #[inline(never)]
    fn insert_spilling(&self, b: &Bucket, before: u64, kind: Kind, key: u64, live: Live) -> Result<Option<Live>, Stuck> {
        let mut occ = before & OCC_MASK;
        let mut spilled = b.spilled.load(Relaxed);
        let found = b.find(before, key);
        let mut replaced = found.map(|j| b.load(j));
        let free = found.or_else(|| {
            let empty = !occ & OCC_MASK;
            (empty != 0).then(|| (empty.trailing_zeros() - OCC_SHIFT) as usize)
        });
        let packed = pack(&live);
        let needs_shard = (replaced.is_none() && spilled != 0) || packed.is_none() || free.is_none();
        let mut shard = match needs_shard.then(|| self.shards.shard(kind, key)).transpose() {
            Ok(shard) => shard,
            Err(stuck) => {
                b.leave_unchanged(before);
                return Err(stuck);
            }
        };
        if let (None, true, Some(shard)) = (replaced, spilled != 0, shard.as_mut()) {
            if let Some(old) = self.shards.remove_in(shard, kind, key, None) {
                replaced = Some(old);
                spilled -= 1;
            }
        }
        match (packed, free, shard.as_mut()) {
            (Some(packed), Some(j), _) => {
                b.store(j, key, packed, live.id);
                occ |= 1 << (j as u32 + OCC_SHIFT);
            }
            (_, _, Some(shard)) => {
                if let Some(j) = found {
                    occ &= !(1 << (j as u32 + OCC_SHIFT));
                }
                match self.shards.insert_in(shard, kind, key, live) {
                    // (never: a key is in one place; kept exact if it were)
                    Some(old) => replaced = replaced.or(Some(old)),
                    None => spilled += 1,
                }
            }
            // (never: the shard is locked whenever the entry does not go into a slot)
            (_, _, None) => {}
        }
        drop(shard);
        b.spilled.store(spilled, Relaxed);
        b.leave(before, occ, spilled != 0);
        Ok(replaced)
    }

    /// Removes `key` only if it still holds `expected` (not an entry recorded since).
    pub fn remove_if(&self, kind: Kind, key: u64, expected: &Live) -> Result<Option<Live>, Stuck> {
        self.take(kind, key, Some(expected))
    }

    #[inline(always)]
    pub fn remove(&self, kind: Kind, key: u64) -> Result<Option<Live>, Stuck> {
        self.take(kind, key, None)
    }

    /// Removes `key` (if it holds `expected`, when given). `Err`: nothing removed.
    #[inline(always)]
    fn take(&self, kind: Kind, key: u64, expected: Option<&Live>) -> Result<Option<Live>, Stuck> {
        let Some(b) = self.bucket(kind, key) else { return self.shards.remove(kind, key, expected) };
        let before = b.enter_or_stuck()?;
        if let Some(j) = b.find(before, key) {
            let live = b.load(j);
            if expected.is_some_and(|e| *e != live) {
                b.leave_unchanged(before);
                return Ok(None);
            }
            b.leave(before, before & OCC_MASK & !(1 << (j as u32 + OCC_SHIFT)), before & SPILLED != 0);
            return Ok(Some(live));
        }
        if before & SPILLED == 0 {
            b.leave_unchanged(before);
            return Ok(None);
        }
        self.take_spilled(b, before, kind, key, expected)
    }

    /// `take` inside bucket `b` (entered: `before`) of a key not in the table, when some of
    /// the bucket's keys are in the mutex map.
    #[cold]
    #[inline(never)]
    fn take_spilled(&self, b: &Bucket, before: u64, kind: Kind, key: u64, expected: Option<&Live>) -> Result<Option<Live>, Stuck> {
        let removed = self.shards.remove(kind, key, expected);
        match removed {
            Ok(Some(_)) => {
                let spilled = b.spilled.load(Relaxed).saturating_sub(1);
                b.spilled.store(spilled, Relaxed);
                b.leave(before, before & OCC_MASK, spilled != 0);
            }
            _ => b.leave_unchanged(before),
        }
        removed
    }

    /// A copy of every entry of `kind` (slow: for context teardown, never on the allocation
    /// path). Each bucket is read consistently and each shard locked only while it is copied:
    /// an entry present for the whole call is in the copy, unless a wait for its bucket or
    /// shard gave up (`bounded`): the callers credit what they find, so an entry left out
    /// stays counted (closed), and one line says so.
    pub fn entries(&self, kind: Kind) -> Vec<(u64, Live)> {
        let mut all = Vec::new();
        let mut stuck = None;
        if kind == Kind::DevicePtr {
            let mut seen = [(0u64, 0u64, 0u64); SLOTS];
            for b in self.table.iter() {
                if b.meta.load(Relaxed) & (OCC_MASK | BUSY) == 0 {
                    continue; // (an entry present since before the call would show here)
                }
                let read = b.read(|m| {
                    let mut n = 0;
                    let mut occ = (m & OCC_MASK) >> OCC_SHIFT;
                    while occ != 0 {
                        let j = occ.trailing_zeros() as usize;
                        seen[n] = (b.slots[j][0].load(Relaxed), b.slots[j][1].load(Relaxed), b.slots[j][2].load(Relaxed));
                        n += 1;
                        occ &= occ - 1;
                    }
                    n
                });
                match read {
                    Ok(n) => all.extend(seen[..n].iter().map(|&(k, packed, id)| (k, unpack(packed, id)))),
                    Err(e) => stuck = Some(e),
                }
            }
        }
        if let Err(e) = self.shards.entries_into(kind, &mut all) {
            stuck = Some(e);
        }
        if let Some(e) = stuck {
            crate::platform::log::stuck("listing live allocations (some stay counted)", e);
        }
        all
    }

    pub fn get(&self, kind: Kind, key: u64) -> Result<Option<Live>, Stuck> {
        let Some(b) = self.bucket(kind, key) else { return self.shards.get(kind, key) };
        // (the mutex map's look-up runs inside the bucket's consistent view: a writer moving
        // the key between the two in the meantime makes the read start again)
        b.read(|m| match b.find(m, key) {
            Some(j) => Ok(Some(b.load(j))),
            None if m & SPILLED != 0 => self.shards.get(kind, key),
            None => Ok(None),
        })?
    }

    /// Takes every shard's lock for a fork (`fork`). The table needs nothing: the child
    /// empties it whole, whatever writers were inside at the fork.
    pub fn hold_for_fork(&'static self) {
        self.shards.hold_for_fork();
    }

    /// A forked child holds nothing (`fork`). The only thread there is the forking one, which
    /// was inside no bucket: every word is rewritten, a bucket a parent's writer was inside
    /// included. (Only words not already zero are written: buckets the parent never used stay
    /// shared with it.)
    pub fn reset_after_fork(&self) {
        self.shards.reset_after_fork();
        for b in self.table.iter() {
            for w in std::iter::once(&b.meta).chain(std::iter::once(&b.spilled)).chain(b.slots.iter().flatten()) {
                if w.load(Relaxed) != 0 {
                    w.store(0, Relaxed);
                }
            }
        }
        fence(SeqCst);
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        let in_table: usize = self.table.iter().map(|b| b.read(|m| (m & OCC_MASK).count_ones() as usize).unwrap_or(0)).sum();
        in_table + self.shards.len()
    }
}

/// The buckets, in an anonymous mapping of their own: zero pages the kernel commits only as
/// buckets are first written. (The allocator's zeroed memory would not do: for the buckets'
/// 64-byte alignment it allocates aligned and then writes 2 MiB of zeros, two million
/// instructions at every start-up.)
/// Types for which all-zero bytes are a valid value (atomic integers and pointers only).
///
/// # Safety
/// All-zero bytes must be a valid value of the type.
pub unsafe trait ZeroValid: Sync {}

// SAFETY: atomics only; all zero is an empty bucket.
unsafe impl ZeroValid for Bucket {}
// SAFETY: atomics only; all zero is `DeviceBudget::new()` (checked by a test).
unsafe impl ZeroValid for DeviceBudget {}

/// `len` values of `T`, all zero, in a private anonymous mapping: zero-filled pages the kernel
/// provides as they are first touched, without the process writing them (zeroing 256 budgets
/// with `memset` costs ~20,000 instructions at start-up, writing them one by one ~11,000).
pub struct Zeroed<T: ZeroValid> {
    ptr: *mut T,
    len: usize,
}

// SAFETY: the values are `Sync` (atomics) and the mapping is owned by this value.
unsafe impl<T: ZeroValid> Send for Zeroed<T> {}
unsafe impl<T: ZeroValid> Sync for Zeroed<T> {}

impl<T: ZeroValid> Zeroed<T> {
    /// `len` zeroed values; none (empty) if that cannot be mapped.
    pub fn new(len: usize) -> Self {
        let none = Zeroed { ptr: std::ptr::null_mut(), len: 0 };
        let Some(bytes) = len.checked_mul(std::mem::size_of::<T>()) else { return none };
        if bytes == 0 || std::mem::align_of::<T>() > 4096 {
            return none;
        }
        // SAFETY: a fresh private anonymous mapping (page-aligned, zero-filled); checked below.
        let p = unsafe {
            gpushim_common::sys::mmap(std::ptr::null_mut(), bytes, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        if p == libc::MAP_FAILED {
            return none;
        }
        Zeroed { ptr: p.cast(), len }
    }
}

impl<T: ZeroValid> Zeroed<T> {
    /// Value `i`, or `None` if there are none.
    ///
    /// # Safety
    /// `i` is below the length if there are any values.
    #[inline(always)]
    unsafe fn get_below_len(&self, i: usize) -> Option<&T> {
        debug_assert!(self.len == 0 || i < self.len, "index {i} of {}", self.len);
        // SAFETY: `ptr` is a live mapping of `len` values and `i < len` (the caller's word).
        (self.len != 0).then(|| unsafe { &*self.ptr.add(i) })
    }
}

impl<T: ZeroValid> std::ops::Deref for Zeroed<T> {
    type Target = [T];
    #[inline]
    fn deref(&self) -> &[T] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `ptr` is a live mapping of `len` values, all valid (zero, or changed since
        // only through the atomics' shared references).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl<T: ZeroValid> Drop for Zeroed<T> {
    fn drop(&mut self) {
        if self.len != 0 {
            // SAFETY: the mapping made in `new`, of this size, no longer referenced.
            unsafe { gpushim_common::sys::munmap(self.ptr.cast(), self.len * std::mem::size_of::<T>()) };
        }
    }
}

/// The lock-free table's buckets.
type Table = Zeroed<Bucket>;

/// A table of `buckets` zeroed buckets (all-zero atomics: empty buckets). Empty if `buckets` is
/// not a power of two or the memory cannot be mapped (the map then keeps everything in its
/// mutex map).
fn zeroed_table(buckets: usize) -> Table {
    if !buckets.is_power_of_two() || buckets as u64 > 1 << 32 {
        return Zeroed::new(0);
    }
    Zeroed::new(buckets)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_new_budget_is_all_zero_bytes_and_zeroed_budgets_work() {
        let b = DeviceBudget::new();
        // SAFETY: reads the bytes of a live value (no padding: every field is 8 bytes).
        let bytes = unsafe { std::slice::from_raw_parts(&b as *const DeviceBudget as *const u8, std::mem::size_of::<DeviceBudget>()) };
        assert!(bytes.iter().all(|&x| x == 0));
        let all = Budgets::new(MAX_DEVICES);
        assert!(matches!(all, Budgets::Mapped(_)));
        assert_eq!(all.len(), MAX_DEVICES);
        let last = &all[MAX_DEVICES - 1];
        assert_eq!((last.limit(), last.reserved(), last.in_use(), last.shared().is_none()), (None, 0, 0, true));
        last.set_limit(1000);
        assert_eq!(last.limit(), Some(1000));
        last.set_limit(0);
        assert_eq!(last.limit(), Some(0));
        last.set_limit(u64::MAX);
        assert_eq!(last.limit(), Some(u64::MAX - 1));
        assert_eq!(last.try_reserve(600, 1000), Ok(()));
        assert_eq!(all[0].reserved(), 0);
    }

    #[test]
    fn the_mutex_map_counts_its_entries_per_kind() {
        let map = LiveMap::new();
        let live = |bytes| Live { device: 0, bytes, served: false, pool: false, ctx: 7, id: entry_id() };
        assert!(map.entries(Kind::Array).is_empty());
        assert_eq!(map.insert(Kind::Array, 0x1000, live(1)).unwrap(), None);
        assert!(map.insert(Kind::Array, 0x1000, live(2)).unwrap().is_some()); // replaced: still one
        assert_eq!(map.insert(Kind::Array, 0x2000, live(3)).unwrap(), None);
        // (a device pointer with a context recorded goes to the mutex map too)
        assert_eq!(map.insert(Kind::DevicePtr, 0x3000, live(4)).unwrap(), None);
        assert_eq!(map.shards.counts.iter().map(|c| c.load(Relaxed)).collect::<Vec<_>>(), [1, 0, 2, 0]);
        assert_eq!(map.entries(Kind::Array).len(), 2);
        assert!(map.entries(Kind::MipmappedArray).is_empty());
        assert!(map.remove(Kind::Array, 0x1000).unwrap().is_some());
        assert!(map.remove(Kind::Array, 0x1000).unwrap().is_none());
        let e = map.get(Kind::Array, 0x2000).unwrap().unwrap();
        assert!(map.remove_if(Kind::Array, 0x2000, &live(9)).unwrap().is_none()); // not that entry
        assert!(map.remove_if(Kind::Array, 0x2000, &e).unwrap().is_some());
        assert!(map.remove(Kind::DevicePtr, 0x3000).unwrap().is_some());
        assert_eq!(map.shards.counts.iter().map(|c| c.load(Relaxed)).collect::<Vec<_>>(), [0, 0, 0, 0]);
        assert!(map.entries(Kind::Array).is_empty());
    }

    #[test]
    fn reserve_respects_limit_exactly() {
        let b = DeviceBudget::new();
        assert_eq!(b.try_reserve(600, 1000), Ok(()));
        assert_eq!(b.try_reserve(400, 1000), Ok(()));
        assert_eq!(b.try_reserve(1, 1000), Err(Refused { reserved: 1000, limit: 1000 }));
        b.release(400);
        assert_eq!(b.reserved(), 600);
        assert_eq!(b.peak_reserved(), 1000);
        assert_eq!(b.try_reserve(u64::MAX, u64::MAX), Err(Refused { reserved: 600, limit: u64::MAX }));
        b.release(10_000);
        assert_eq!(b.reserved(), 0);
        b.take(300);
        b.give(100);
        b.take(50);
        assert_eq!((b.in_use(), b.peak_in_use()), (250, 300));
        b.give(1000);
        assert_eq!(b.in_use(), 0);
        // `bytes` alone beyond the limit: refused, whatever is reserved
        assert_eq!(b.try_reserve(1001, 1000), Err(Refused { reserved: 0, limit: 1000 }));
        assert_eq!(b.try_reserve(1000, 1000), Ok(()));
        b.take(400);
        // freed: both counters, each never below zero
        b.freed(300);
        assert_eq!((b.reserved(), b.in_use()), (700, 100));
        b.freed(500);
        assert_eq!((b.reserved(), b.in_use()), (200, 0));
        b.take(50);
        b.freed(250);
        assert_eq!((b.reserved(), b.in_use(), b.peak_reserved(), b.peak_in_use()), (0, 0, 1000, 400));
    }

    #[test]
    fn concurrent_reservations_never_pass_the_limit() {
        let b = Arc::new(DeviceBudget::new());
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let b = b.clone();
                std::thread::spawn(move || {
                    let mut held = Vec::new();
                    for i in 0..20_000u64 {
                        let size = 1 + (i * 7919 + t * 104_729) % 300;
                        if b.try_reserve(size, 10_000).is_ok() {
                            held.push(size);
                        }
                        assert!(b.reserved() <= 10_000);
                        if i % 3 == 0 {
                            if let Some(s) = held.pop() {
                                b.release(s);
                            }
                        }
                    }
                    for s in held {
                        b.release(s);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(b.reserved(), 0);
        assert!(b.peak_reserved() <= 10_000 && b.peak_reserved() > 9_000);
    }

    /// Budgets whose figures move to published entries ([`publish_budgets`]) while 6 threads
    /// update them: no update is lost (each thread's own net figures add up exactly), the limit
    /// set meanwhile is published, a budget not published keeps its own, and a forked child's
    /// reset leaves the published entry alone.
    #[test]
    fn figures_move_to_their_published_entries_without_losing_an_update() {
        const LIMIT: u64 = 1 << 40;
        for round in 0..60u64 {
            let budgets: &'static [DeviceBudget] = Box::leak((0..3).map(|_| DeviceBudget::new()).collect::<Vec<_>>().into_boxed_slice());
            let entries: &'static [Figures] = Box::leak((0..3).map(|_| Figures::new()).collect::<Vec<_>>().into_boxed_slice());
            budgets[0].set_limit(LIMIT);
            budgets[2].set_limit(LIMIT);
            let go = Arc::new(std::sync::Barrier::new(8));
            // device 2's limit set over and over until its figures have moved: the last one
            // set (before the move, or across it) is the one published
            let setter = {
                let go = go.clone();
                std::thread::spawn(move || {
                    go.wait();
                    let mut n = 0u64;
                    while budgets[2].moved().is_none() {
                        n += 1;
                        budgets[2].set_limit(LIMIT + n);
                    }
                    n
                })
            };
            let threads: Vec<_> = (0..6u64)
                .map(|t| {
                    let go = go.clone();
                    std::thread::spawn(move || {
                        go.wait();
                        // (reserved, in use, refusals) this thread leaves on each budget
                        let mut net = [(0u64, 0u64, 0u64); 3];
                        for i in 0..3_000u64 {
                            let d = ((i + t) % 3) as usize;
                            let b = &budgets[d];
                            let size = 1 + (i * 7919 + t * 104_729 + round) % 5_000;
                            if t == 5 && i == 1_000 {
                                b.set_limit(LIMIT - 1); // (the limit set while the figures move)
                            }
                            if i % 7 == 3 {
                                b.count_refusal();
                                net[d].2 += 1;
                            } else if b.try_reserve(size, LIMIT).is_ok() {
                                b.take(size);
                                match i % 3 {
                                    0 => b.freed(size),
                                    1 => {
                                        b.give(size);
                                        b.release(size);
                                    }
                                    _ => {
                                        net[d].0 += size;
                                        net[d].1 += size;
                                    }
                                }
                            }
                        }
                        net
                    })
                })
                .collect();
            go.wait();
            for _ in 0..(round % 8) * 200 {
                std::hint::spin_loop();
            }
            publish_budgets(budgets, |i| (i != 1).then(|| &entries[i]));
            let mut want = [(0u64, 0u64, 0u64); 3];
            for t in threads {
                for (w, n) in want.iter_mut().zip(t.join().unwrap()) {
                    *w = (w.0 + n.0, w.1 + n.1, w.2 + n.2);
                }
            }
            for (d, b) in budgets.iter().enumerate() {
                let got = (b.reserved(), b.in_use(), b.refused());
                assert_eq!(got, want[d], "round {round}, device {d}");
                assert!(b.peak_reserved() >= want[d].0 && b.peak_in_use() >= want[d].1);
                let f = &entries[d];
                let published = (f.reserved.load(SeqCst), f.in_use.load(SeqCst), f.refused.load(SeqCst));
                assert_eq!(published, if d == 1 { (0, 0, 0) } else { want[d] }, "round {round}, device {d}");
                assert!(b.moved().is_some());
            }
            // the limit set meanwhile (device 0's: thread 5's step 1,000) was published
            assert_eq!((entries[0].limit.load(SeqCst), budgets[0].limit()), (LIMIT - 1, Some(LIMIT - 1)));
            let last = LIMIT + setter.join().unwrap();
            assert_eq!((entries[2].limit.load(SeqCst), budgets[2].limit()), (last, Some(last)), "round {round}");
            // a forked child's budget lets go of the published entry
            budgets[0].reset_after_fork();
            budgets[0].take(5);
            assert_eq!((budgets[0].in_use(), entries[0].in_use.load(SeqCst)), (5, want[0].1));
        }
    }

    /// The lane's reservation ([`Moved::try_reserve_within`]) against the budget's limit: none
    /// while it is not resolved, exact at its edges (the largest limit included).
    #[test]
    fn moved_figures_reserve_within_the_limit_exactly() {
        let b: &'static [DeviceBudget] = Box::leak(vec![DeviceBudget::new()].into_boxed_slice());
        let entry: &'static Figures = Box::leak(Box::new(Figures::new()));
        publish_budgets(b, |_| Some(entry));
        let (b, m) = (&b[0], b[0].moved().unwrap());
        assert!(!m.try_reserve_within(b, 0) && !m.try_reserve_within(b, 1)); // not resolved
        b.set_limit(1000);
        assert!(!m.try_reserve_within(b, 1001) && !m.try_reserve_within(b, u64::MAX));
        assert_eq!(b.reserved(), 0);
        assert!(m.try_reserve_within(b, 1000));
        assert!(!m.try_reserve_within(b, 1));
        assert!(m.try_reserve_within(b, 0));
        assert_eq!((b.reserved(), entry.reserved.load(SeqCst)), (1000, 1000));
        m.release(600);
        assert!(m.try_reserve_within(b, 600) && !m.try_reserve_within(b, 1));
        m.release(1000);
        b.set_limit(u64::MAX); // (held as u64::MAX - 1)
        assert!(!m.try_reserve_within(b, u64::MAX));
        assert!(m.try_reserve_within(b, u64::MAX - 1 - 1000));
        assert!(m.try_reserve_within(b, 1000));
        assert!(!m.try_reserve_within(b, 1));
        assert_eq!((b.reserved(), b.peak_reserved()), (u64::MAX - 1, u64::MAX - 1));
    }

    /// A gate: closed, it waits for the update inside and holds new ones out; reopened after
    /// its closure unwound; open and empty after a fork whatever it was left as.
    #[test]
    fn the_gate_waits_for_updates_inside_and_reopens() {
        let gate: &'static Gate = Box::leak(Box::new(Gate::new()));
        let inside = gate.enter().unwrap();
        let step = Arc::new(AtomicU64::new(0));
        let closer = {
            let step = step.clone();
            std::thread::spawn(move || gate.closed_for(|| step.fetch_add(1, SeqCst)).unwrap())
        };
        while !gate.closed.load(SeqCst) {
            std::hint::spin_loop();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(step.load(SeqCst), 0); // (waiting for the update inside)
        // an update that comes while it is closed is held out until the closure has run
        let trying = Arc::new(AtomicBool::new(false));
        let late = {
            let (step, trying) = (step.clone(), trying.clone());
            std::thread::spawn(move || {
                trying.store(true, SeqCst);
                let _in = gate.enter().unwrap();
                step.fetch_add(10, SeqCst)
            })
        };
        while !trying.load(SeqCst) {
            std::hint::spin_loop();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!((step.load(SeqCst), gate.inside.load(SeqCst)), (0, 1));
        drop(inside);
        assert_eq!(closer.join().unwrap(), 0); // the closure ran before the late update
        assert_eq!(late.join().unwrap(), 1);
        assert_eq!((gate.inside.load(SeqCst), gate.closed.load(SeqCst)), (0, false));
        // a second closer waits for the first to open it: its closure runs after the first's
        // returned
        let first_done = Arc::new(AtomicBool::new(false));
        let (second, trying) = gate.closed_for(|| {
            let trying = Arc::new(AtomicBool::new(false));
            let other = {
                let (first_done, trying) = (first_done.clone(), trying.clone());
                std::thread::spawn(move || {
                    trying.store(true, SeqCst);
                    gate.closed_for(|| first_done.load(SeqCst)).unwrap()
                })
            };
            while !trying.load(SeqCst) {
                std::hint::spin_loop();
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            first_done.store(true, SeqCst);
            (other, trying)
        })
        .unwrap();
        assert!(trying.load(SeqCst));
        assert!(second.join().unwrap());
        assert!(!gate.closed.load(SeqCst));
        // unwound: open again
        assert!(std::panic::catch_unwind(|| gate.closed_for(|| panic!("unwinds"))).is_err());
        assert!(!gate.closed.load(SeqCst));
        drop(gate.enter().unwrap());
        // left as a forked child finds it: open and empty
        std::mem::forget(gate.enter().unwrap());
        gate.closed.store(true, SeqCst);
        gate.reset_after_fork();
        assert_eq!((gate.inside.load(SeqCst), gate.closed.load(SeqCst)), (0, false));
        gate.closed_for(|| ()).unwrap();
    }

    /// The moving thread re-entered (as a signal handler that interrupted the move would,
    /// here the move's own closure): an update or a second move finds the gate closed by its
    /// own thread and is refused at once (it waited for ever); a reservation then is refused.
    /// A move that waits for an update inside that never leaves gives up after the bound.
    #[test]
    fn the_gate_refuses_its_own_thread_at_once_and_bounds_the_move() {
        let gate: &'static Gate = Box::leak(Box::new(Gate::new()));
        let start = std::time::Instant::now();
        let inner = gate.closed_for(|| (gate.enter().err(), gate.closed_for(|| ()).err())).unwrap();
        assert_eq!(inner, (Some(Stuck::Reentered(GATE_WHAT)), Some(Stuck::Reentered(GATE_WHAT))));
        let b: &'static [DeviceBudget] = Box::leak(vec![DeviceBudget::new()].into_boxed_slice());
        let refused = GATE.closed_for(|| b[0].try_reserve(1, 10)).unwrap();
        assert_eq!(refused, Err(Refused { reserved: 0, limit: 10 }));
        assert!(start.elapsed() < std::time::Duration::from_secs(1), "{:?}", start.elapsed());
        let inside = gate.enter().unwrap();
        let short = std::time::Duration::from_millis(200);
        assert_eq!(gate.closed_for_within(short, || ()).err(), Some(Stuck::TimedOut(GATE_WHAT)));
        drop(inside);
        assert!(!gate.closed.load(SeqCst));
        gate.closed_for(|| ()).unwrap();
    }

    /// Limits set at once by several threads on moved figures: the figures show the limit in
    /// force, the last stored, whatever the interleaving.
    #[test]
    fn limits_set_at_once_publish_the_one_in_force() {
        for round in 0..200u64 {
            let b: &'static [DeviceBudget] = Box::leak(vec![DeviceBudget::new()].into_boxed_slice());
            let entry: &'static Figures = Box::leak(Box::new(Figures::new()));
            publish_budgets(b, |_| Some(entry));
            let go = Arc::new(std::sync::Barrier::new(4));
            let threads: Vec<_> = (0..4u64)
                .map(|t| {
                    let go = go.clone();
                    std::thread::spawn(move || {
                        go.wait();
                        for i in 0..50u64 {
                            b[0].set_limit(round * 1_000 + t * 100 + i);
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            assert_eq!(Some(entry.limit.load(SeqCst)), b[0].limit(), "round {round}");
        }
    }

    #[test]
    fn pool_credits_wait_for_figures_taken_after_the_last_free() {
        let b = DeviceBudget::new();
        b.try_reserve(300, 1000).unwrap();
        b.take(300);
        let stale = b.pool_epoch();
        b.keep_in_pool(100);
        assert_eq!((b.in_use(), b.reserved(), b.pool_kept()), (200, 300, 100));
        b.pools_keep(0, stale); // figures read before that free: nothing credited
        assert_eq!((b.reserved(), b.pool_kept()), (300, 100));
        b.pools_keep(40, b.pool_epoch());
        assert_eq!((b.reserved(), b.pool_kept()), (240, 40));
        b.pools_keep(500, b.pool_epoch()); // never more than was counted
        assert_eq!((b.reserved(), b.pool_kept()), (240, 40));
    }

    #[test]
    fn live_map_keys_are_per_kind() {
        let m = LiveMap::new();
        m.insert(Kind::DevicePtr, 0x1000, Live { device: 0, bytes: 5, served: false, pool: false, ctx: 0, id: 1 }).unwrap();
        m.insert(Kind::VmmHandle, 0x1000, Live { device: 1, bytes: 7, served: false, pool: false, ctx: 0, id: 2 }).unwrap();
        assert_eq!(m.remove(Kind::DevicePtr, 0x1000).unwrap(), Some(Live { device: 0, bytes: 5, served: false, pool: false, ctx: 0, id: 1 }));
        assert_eq!(m.remove(Kind::DevicePtr, 0x1000).unwrap(), None);
        assert_eq!(m.len(), 1);
        assert_eq!(m.remove(Kind::VmmHandle, 0x1000).unwrap(), Some(Live { device: 1, bytes: 7, served: false, pool: false, ctx: 0, id: 2 }));
    }
}

#[cfg(test)]
mod live_map_tests {
    use super::*;
    use std::collections::HashMap as Model;
    use std::sync::Arc;

    fn live(device: usize, bytes: u64, id: u64) -> Live {
        Live { device, bytes, served: id % 3 == 0, pool: id % 5 == 0, ctx: 0, id }
    }

    /// An entry that does not fit a slot (kept in the mutex map), per `which`.
    fn unfit(which: u64, id: u64) -> Live {
        match which % 3 {
            0 => Live { ctx: 0xC0, ..live(1, 4096, id) },
            1 => live(PACK_DEVICES, 4096, id),
            _ => live(2, PACK_BYTES, id),
        }
    }

    /// `insert` of a device pointer as the lane (`lane`) makes it: packed first, the general
    /// `insert` where the table declines.
    fn insert_packed_first(m: &LiveMap, k: u64, l: Live) -> Option<Live> {
        insert_packed_via(m, k, l, false)
    }

    /// `insert_packed_first`, through the lane's view of the table (`PtrTable`) if `lane` and
    /// the map has one.
    fn insert_packed_via(m: &LiveMap, k: u64, l: Live, lane: bool) -> Option<Live> {
        if l.ctx == 0 && !l.served {
            if let Some(p) = Packed::of(&l) {
                assert_eq!(p.live(), l);
                let packed = match m.ptr_table().filter(|_| lane) {
                    Some(t) => t.insert_packed(k, p),
                    None => m.insert_packed(k, p),
                };
                if let Ok(replaced) = packed {
                    return replaced.map(Packed::live);
                }
            }
        }
        m.insert(Kind::DevicePtr, k, l).unwrap()
    }

    /// `remove` of a device pointer as the free paths make it (`State::uncounted`, `lane`).
    fn remove_packed_first(m: &LiveMap, k: u64) -> Option<Live> {
        remove_packed_via(m, k, false)
    }

    fn remove_packed_via(m: &LiveMap, k: u64, lane: bool) -> Option<Live> {
        let packed = match m.ptr_table().filter(|_| lane) {
            Some(t) => t.remove_packed(k),
            None => m.remove_packed(k),
        };
        match packed {
            Ok(found) => found.map(Packed::live),
            Err(()) => m.remove(Kind::DevicePtr, k).unwrap(),
        }
    }

    #[test]
    fn the_lanes_view_of_the_table_picks_the_maps_buckets() {
        for buckets in [0, 1] {
            assert!(LiveMap::with_buckets(buckets).ptr_table().is_none(), "{buckets} buckets");
        }
        for buckets in [2, 4, 64, BUCKETS] {
            let m = LiveMap::with_buckets(buckets);
            let t = m.ptr_table().unwrap();
            let mut rng = 0x9E37_79B9_7F4A_7C15u64;
            let mut used = std::collections::HashSet::new();
            for _ in 0..50_000 {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                for k in [rng, rng & !0xFFF, 0x7f00_0000_0000 + (rng & 0xFFFF_F000)] {
                    let b = m.ptr_bucket(k).unwrap() as *const Bucket;
                    assert!(std::ptr::eq(t.bucket(k), b), "{buckets} buckets, key {k:#x}");
                    used.insert(b as usize);
                }
            }
            assert_eq!(used.len(), buckets, "every bucket picked");
        }
    }

    #[test]
    fn packed_entries_read_as_their_fields() {
        for (device, bytes, served, pool) in [(0, 0, false, false), (PACK_DEVICES - 1, PACK_BYTES - 1, true, true), (3, 4096, false, false), (255, 1 << 40, false, true)] {
            let l = Live { device, bytes, served, pool, ctx: 0, id: 77 };
            let p = Packed::of(&l).unwrap();
            assert_eq!((p.device(), p.bytes(), p.served(), p.pool()), (device, bytes, served, pool));
            assert_eq!(p.live(), l);
        }
        let fits = Live { device: 0, bytes: 1, served: false, pool: false, ctx: 0, id: 1 };
        for unfit in [Live { device: PACK_DEVICES, ..fits }, Live { bytes: PACK_BYTES, ..fits }, Live { ctx: 1, ..fits }] {
            assert_eq!(Packed::of(&unfit), None);
        }
    }

    /// Each table size (none, one bucket, a few, the real one): the packed operations, falling
    /// back to the general ones where they decline, agree with a model, wherever the entries
    /// are (a full bucket spills into the mutex map; entries that do not fit go there).
    #[test]
    fn packed_operations_agree_with_the_general_ones() {
        for buckets in [0, 1, 2, BUCKETS] {
            let m = LiveMap::with_buckets(buckets);
            let mut model: Model<u64, Live> = Model::new();
            let mut rng = 0x2545_F491_4F6C_DD1Du64;
            for step in 0..40_000u64 {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let k = 0x7f00_0000_0000 + (rng >> 40) % 48 * 0x200;
                let fresh = if rng % 11 == 0 { unfit(rng >> 8, step) } else { live((rng >> 4) as usize % 8, rng >> 24, step) };
                let lane = rng & (1 << 33) != 0;
                match rng % 8 {
                    0..=2 => assert_eq!(insert_packed_via(&m, k, fresh, lane), model.insert(k, fresh), "{buckets} buckets, step {step}"),
                    3 => assert_eq!(m.insert(Kind::DevicePtr, k, fresh).unwrap(), model.insert(k, fresh)),
                    4..=6 => assert_eq!(remove_packed_via(&m, k, lane), model.remove(&k), "{buckets} buckets, step {step}"),
                    _ => assert_eq!(m.remove(Kind::DevicePtr, k).unwrap(), model.remove(&k)),
                }
                assert_eq!(m.get(Kind::DevicePtr, k).unwrap(), model.get(&k).copied());
            }
            assert_eq!(m.len(), model.len());
            let listed: Model<u64, Live> = m.entries(Kind::DevicePtr).into_iter().collect();
            assert_eq!(listed, model);
            // a key of a bucket with spilled keys is declined by the packed removal, not missed
            if buckets == 1 {
                for i in 0..=SLOTS as u64 {
                    m.insert(Kind::DevicePtr, 0x1000_0000 + i * 0x100, live(0, i, 1)).unwrap();
                }
                assert_eq!(m.remove_packed(0x2000_0000), Err(()));
                let p = Packed::of(&live(0, 1, 1)).unwrap();
                assert_eq!(m.insert_packed(0x2000_0000, p), Err(p));
            }
        }
    }

    #[test]
    fn packing_round_trips_and_refuses_what_does_not_fit() {
        for l in [live(0, 0, 1), live(PACK_DEVICES - 1, PACK_BYTES - 1, u64::MAX), live(255, 1 << 40, 15), live(3, 4096, 0)] {
            assert_eq!(unpack(pack(&l).unwrap(), l.id), l);
        }
        for w in 0..3 {
            assert_eq!(pack(&unfit(w, 7)), None);
        }
    }

    #[test]
    fn insert_returns_the_replaced_entry_wherever_it_was() {
        for buckets in [BUCKETS, 1, 0] {
            let m = LiveMap::with_buckets(buckets);
            let k = 0x7f00_0000_1000;
            assert_eq!(m.insert(Kind::DevicePtr, k, live(0, 10, 1)).unwrap(), None);
            assert_eq!(m.insert(Kind::DevicePtr, k, live(1, 20, 2)).unwrap(), Some(live(0, 10, 1))); // table -> table
            assert_eq!(m.insert(Kind::DevicePtr, k, unfit(0, 3)).unwrap(), Some(live(1, 20, 2))); // table -> mutex map
            assert_eq!(m.get(Kind::DevicePtr, k).unwrap(), Some(unfit(0, 3)));
            assert_eq!(m.len(), 1);
            assert_eq!(m.insert(Kind::DevicePtr, k, unfit(1, 4)).unwrap(), Some(unfit(0, 3))); // mutex map -> mutex map
            assert_eq!(m.insert(Kind::DevicePtr, k, live(2, 30, 5)).unwrap(), Some(unfit(1, 4))); // mutex map -> table
            assert_eq!(m.len(), 1);
            assert_eq!(m.get(Kind::DevicePtr, k).unwrap(), Some(live(2, 30, 5)));
            assert_eq!(m.entries(Kind::DevicePtr), vec![(k, live(2, 30, 5))]);
            assert_eq!(m.remove(Kind::DevicePtr, k).unwrap(), Some(live(2, 30, 5)));
            assert_eq!((m.remove(Kind::DevicePtr, k).unwrap(), m.get(Kind::DevicePtr, k).unwrap(), m.len()), (None, None, 0));
            if let Some(b) = m.bucket(Kind::DevicePtr, k) {
                assert_eq!((b.meta.load(SeqCst) & (BUSY | OCC_MASK | SPILLED), b.spilled.load(SeqCst)), (0, 0));
            }
        }
    }

    #[test]
    fn remove_if_leaves_an_entry_recorded_since() {
        for (buckets, second) in [(BUCKETS, live(0, 10, 2)), (BUCKETS, unfit(2, 2)), (1, live(0, 10, 2)), (0, live(0, 10, 2))] {
            let m = LiveMap::with_buckets(buckets);
            let k = 0x7f00_0000_2000;
            let first = live(0, 10, 1);
            m.insert(Kind::DevicePtr, k, first).unwrap();
            assert_eq!(m.insert(Kind::DevicePtr, k, second).unwrap(), Some(first));
            // the same key, the same size and device: only the id differs
            assert_eq!(m.remove_if(Kind::DevicePtr, k, &first).unwrap(), None);
            assert_eq!(m.get(Kind::DevicePtr, k).unwrap(), Some(second));
            assert_eq!(m.remove_if(Kind::DevicePtr, k + 0x100, &second).unwrap(), None);
            assert_eq!(m.remove_if(Kind::DevicePtr, k, &second).unwrap(), Some(second));
            assert_eq!((m.get(Kind::DevicePtr, k).unwrap(), m.len()), (None, 0));
        }
    }

    #[test]
    fn a_full_bucket_spills_into_the_mutex_map_and_back() {
        let m = LiveMap::with_buckets(1);
        let keys: Vec<u64> = (1..=3 * SLOTS as u64).map(|i| 0x7f00_0000_0000 + i * 0x1000).collect();
        for (i, &k) in keys.iter().enumerate() {
            assert_eq!(m.insert(Kind::DevicePtr, k, live(0, i as u64, i as u64)).unwrap(), None);
        }
        let b = &m.table[0];
        assert_eq!((m.len(), m.shards.len(), b.spilled.load(SeqCst)), (keys.len(), 2 * SLOTS, 2 * SLOTS as u64));
        let mut all = m.entries(Kind::DevicePtr);
        all.sort_by_key(|e| e.1.id);
        assert_eq!(all, keys.iter().enumerate().map(|(i, &k)| (k, live(0, i as u64, i as u64))).collect::<Vec<_>>());
        // free slots, then a spilled key comes back to the table when recorded again
        for &k in &keys[..3] {
            assert!(m.remove(Kind::DevicePtr, k).unwrap().is_some());
        }
        let last = *keys.last().unwrap();
        assert_eq!(m.insert(Kind::DevicePtr, last, live(1, 1, 1000)).unwrap(), Some(live(0, keys.len() as u64 - 1, keys.len() as u64 - 1)));
        assert_eq!((m.shards.len(), b.spilled.load(SeqCst)), (2 * SLOTS - 1, 2 * SLOTS as u64 - 1));
        for (i, &k) in keys.iter().enumerate().skip(3).take(keys.len() - 4) {
            assert_eq!(m.get(Kind::DevicePtr, k).unwrap(), Some(live(0, i as u64, i as u64)));
            assert_eq!(m.remove(Kind::DevicePtr, k).unwrap(), Some(live(0, i as u64, i as u64)));
        }
        assert_eq!(m.remove(Kind::DevicePtr, last).unwrap(), Some(live(1, 1, 1000)));
        assert_eq!((m.len(), b.spilled.load(SeqCst), b.meta.load(SeqCst) & (BUSY | OCC_MASK | SPILLED)), (0, 0, 0));
        // other kinds never use the table
        m.insert(Kind::VmmHandle, keys[0], live(0, 1, 1)).unwrap();
        assert_eq!((m.shards.len(), b.meta.load(SeqCst) & OCC_MASK), (1, 0));
    }

    #[test]
    fn a_forked_child_starts_with_an_empty_table_even_mid_write() {
        let m = LiveMap::new();
        for i in 0..1000u64 {
            m.insert(Kind::DevicePtr, 0x7f00_0000_0000 + i * 0x200, live(0, i, i)).unwrap();
        }
        m.insert(Kind::DevicePtr, 1, unfit(0, 1)).unwrap();
        // a parent's writer was inside this bucket at the fork
        let b = m.bucket(Kind::DevicePtr, 0x7f00_0000_0000).unwrap();
        b.enter().unwrap();
        m.reset_after_fork();
        assert_eq!((m.len(), m.entries(Kind::DevicePtr).len()), (0, 0));
        assert_eq!(m.insert(Kind::DevicePtr, 0x7f00_0000_0000, live(0, 1, 1)).unwrap(), None);
        assert_eq!(m.remove(Kind::DevicePtr, 0x7f00_0000_0000).unwrap(), Some(live(0, 1, 1)));
    }

    /// 8 threads on small and full-size tables: each owns some keys (checked against its own
    /// model after every step), all contend on shared keys (every entry ever recorded must be
    /// handed back exactly once: replaced, removed, or left at the end), and some keys are
    /// recorded before and never touched (always found, whatever moves around them).
    #[test]
    fn concurrent_writers_and_readers_agree_with_a_model() {
        const THREADS: u64 = 8;
        const STEPS: u64 = 30_000;
        for buckets in [1, 4, 64, BUCKETS] {
            let m = Arc::new(LiveMap::with_buckets(buckets));
            let fixed: Vec<(u64, Live)> = (0..16u64).map(|i| (0x5000_0000 + i * 0x100, if i % 4 == 0 { unfit(i, 1 << 40 | i) } else { live(7, i, 1 << 40 | i) })).collect();
            for &(k, l) in &fixed {
                m.insert(Kind::DevicePtr, k, l).unwrap();
            }
            let shared: Vec<u64> = (0..4u64).map(|i| 0x6000_0000 + i * 0x100).collect();
            let threads: Vec<_> = (0..THREADS)
                .map(|t| {
                    let (m, fixed, shared) = (m.clone(), fixed.clone(), shared.clone());
                    std::thread::spawn(move || {
                        let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (t + 1).wrapping_mul(0xD1B5_4A32_D192_ED03);
                        let mut next = move || {
                            rng ^= rng << 13;
                            rng ^= rng >> 7;
                            rng ^= rng << 17;
                            rng
                        };
                        let mut model: Model<u64, Live> = Model::new();
                        let mut recorded = Vec::new(); // ids recorded under shared keys
                        let mut handed_back = Vec::new(); // ids handed back from shared keys
                        for step in 0..STEPS {
                            let id = (t + 1) << 32 | step;
                            let r = next();
                            let fresh = if r % 7 == 0 { unfit(r >> 8, id) } else { live((r >> 4) as usize % 8, r >> 20, id) };
                            match r % 10 {
                                0..=5 => {
                                    let k = 0x7000_0000 + (t * 24 + (r >> 32) % 24) * 0x100;
                                    match (r >> 12) % 4 {
                                        0 if r & (1 << 41) != 0 => assert_eq!(insert_packed_via(&m, k, fresh, r & (1 << 42) != 0), model.insert(k, fresh)),
                                        0 | 1 => assert_eq!(m.insert(Kind::DevicePtr, k, fresh).unwrap(), model.insert(k, fresh)),
                                        2 if r & (1 << 41) != 0 => assert_eq!(remove_packed_via(&m, k, r & (1 << 42) != 0), model.remove(&k)),
                                        2 => assert_eq!(m.remove(Kind::DevicePtr, k).unwrap(), model.remove(&k)),
                                        _ => {
                                            // remove_if with the current entry or a stale one
                                            let expected = if r & (1 << 40) != 0 { model.get(&k).copied().unwrap_or(fresh) } else { fresh };
                                            let want = (model.get(&k) == Some(&expected)).then(|| model.remove(&k)).flatten();
                                            assert_eq!(m.remove_if(Kind::DevicePtr, k, &expected).unwrap(), want);
                                        }
                                    }
                                    assert_eq!(m.get(Kind::DevicePtr, k).unwrap(), model.get(&k).copied());
                                }
                                6..=8 => {
                                    let k = shared[(r >> 32) as usize % shared.len()];
                                    // (an entry's fields follow from its id and key: a torn read shows)
                                    let base = live((id % 8) as usize, (id ^ k) & (PACK_BYTES - 1), id);
                                    let fresh = if r % 4 == 0 { Live { ctx: 0xC0, ..base } } else { base };
                                    let packed = r & (1 << 41) != 0;
                                    if r % 3 == 0 {
                                        handed_back.extend(if packed { remove_packed_first(&m, k) } else { m.remove(Kind::DevicePtr, k).unwrap() }.map(|l| l.id));
                                    } else {
                                        recorded.push(id);
                                        handed_back.extend(if packed { insert_packed_first(&m, k, fresh) } else { m.insert(Kind::DevicePtr, k, fresh).unwrap() }.map(|l| l.id));
                                    }
                                    if let Some(l) = m.get(Kind::DevicePtr, k).unwrap() {
                                        assert!(l.id >> 32 >= 1 && l.id >> 32 <= THREADS, "{l:?}");
                                        assert_eq!((l.device as u64, l.bytes, l.ctx == 0 || l.ctx == 0xC0), (l.id % 8, (l.id ^ k) & (PACK_BYTES - 1), true));
                                    }
                                }
                                _ => {
                                    let (k, l) = fixed[(r >> 32) as usize % fixed.len()];
                                    assert_eq!(m.get(Kind::DevicePtr, k).unwrap(), Some(l));
                                }
                            }
                        }
                        (model, recorded, handed_back)
                    })
                })
                .collect();
            let mut all_owned = Model::new();
            let (mut recorded, mut handed_back) = (Vec::new(), Vec::new());
            for t in threads {
                let (model, r, h) = t.join().unwrap();
                all_owned.extend(model);
                recorded.extend(r);
                handed_back.extend(h);
            }
            for &k in &shared {
                handed_back.extend(m.remove(Kind::DevicePtr, k).unwrap().map(|l| l.id));
            }
            recorded.sort_unstable();
            handed_back.sort_unstable();
            assert_eq!(recorded, handed_back, "{buckets} buckets: shared keys lost or duplicated an entry");
            let mut entries: Model<u64, Live> = m.entries(Kind::DevicePtr).into_iter().collect();
            assert_eq!(entries.len(), m.len());
            for (k, l) in &fixed {
                assert_eq!(entries.remove(k), Some(*l));
            }
            assert_eq!(entries, all_owned, "{buckets} buckets");
            // the bucket counts of spilled keys are exact
            let spilled: u64 = m.table.iter().map(|b| b.spilled.load(SeqCst)).sum();
            assert_eq!(spilled as usize, m.shards.len());
            assert!(m.table.iter().all(|b| b.meta.load(SeqCst) & BUSY == 0 && (b.spilled.load(SeqCst) != 0) == (b.meta.load(SeqCst) & SPILLED != 0)));
        }
    }
}
