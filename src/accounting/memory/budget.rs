//! The per-device budgets: reserving before the driver allocates, crediting what it freed, and the gate that moves the figures into the published file.

#[allow(unused_imports)]
use super::*;

/// The published limit of a device not yet resolved (`live`).
pub(crate) const UNRESOLVED: u64 = u64::MAX;

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
    pub(crate) limit_plus_one: AtomicU64,
    /// Where the figures are: null until publication ([`DeviceBudget::own`], through the gate),
    /// then the published entry's or `own`. Changes only then and in a forked child.
    pub(crate) figures: AtomicPtr<Figures>,
    /// The figures before publication (and after, if they are not published); their `limit`
    /// is unused (the limit is `limit_plus_one`). `reserved` is what the limit bounds: bytes
    /// taken from the driver for the program; `in_use` what the program holds (≤ `reserved`,
    /// up to a moment's lag between the two).
    pub(crate) own: Figures,
    /// Bytes freed into stream-ordered pools that the driver may still hold (pools keep freed
    /// memory until a synchronisation or a trim releases it): still in `reserved`, no longer in
    /// `in_use`, credited once the driver shows the pools gave them back (`pools`).
    pub(crate) pool_kept: AtomicU64,
    /// Bumped by every free into a pool (after the driver's free, before `pool_kept` grows): a
    /// reconciliation whose driver figures may predate a free credits nothing.
    pub(crate) pool_epoch: AtomicU64,
    /// The device's entry in a shared quota (`quota`): reservations are then checked against
    /// what every member holds. Set once (null: none), never freed.
    pub(crate) shared: AtomicPtr<(&'static Quota, usize)>,
    /// Allocations that waited for room in the shared quota (`GPUSHIM_OOM_WAIT`), and the time
    /// they waited (nanoseconds), whatever the outcome.
    pub(crate) waits: AtomicU64,
    pub(crate) waited_ns: AtomicU64,
}

/// The gate of updates to figures not yet moved ([`DeviceBudget::update`]), which the move
/// ([`publish_budgets`]) closes: updates inside, whether it is closed, and by which thread. An
/// update inside only loads and stores atomics (it never waits for anything), so the move's
/// wait is short. Both waits are bounded (`bounded`): an update from a signal handler that
/// interrupted the moving thread finds the gate closed by its own thread and does not wait
/// ([`DeviceBudget::update_gated`]); a move from a signal handler that interrupted an update
/// inside gives up after the bound (the figures then stay where they are, unpublished).
pub(crate) struct Gate {
    pub(crate) inside: AtomicU64,
    pub(crate) closed: AtomicBool,
    /// The closing thread's mark (`bounded::this_thread`; 0: none).
    pub(crate) closer: AtomicUsize,
}

/// What the gate is called in messages.
pub(crate) const GATE_WHAT: &str = "the move of the memory figures into the published file";

/// The process' gate.
pub(crate) static GATE: Gate = Gate::new();

/// Inside a gate: entered once it is open, left when dropped.
#[must_use = "the gate is left as soon as this is dropped"]
pub(crate) struct Inside<'a>(&'a Gate);

impl Gate {
    pub(crate) const fn new() -> Gate {
        Gate { inside: AtomicU64::new(0), closed: AtomicBool::new(false), closer: AtomicUsize::new(0) }
    }

    /// Enters once the gate is open; refused at once if this thread closed it, and after the
    /// bound (`bounded::WAIT_BOUND`) if it stays closed.
    pub(crate) fn enter(&self) -> Result<Inside<'_>, Stuck> {
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
    pub(crate) fn closed_for<R>(&self, f: impl FnOnce() -> R) -> Result<R, Stuck> {
        self.closed_for_within(bounded::WAIT_BOUND, f)
    }

    pub(crate) fn closed_for_within<R>(&self, bound: std::time::Duration, f: impl FnOnce() -> R) -> Result<R, Stuck> {
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
    pub(crate) fn reset_after_fork(&self) {
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
pub(crate) fn saturating_sub(counter: &AtomicU64, bytes: u64) -> u64 {
    // Release: pairs with the reservation's Acquire (`reserve_within`): a `give` (in use)
    // made before a `release` (reserved) is seen by whoever reserves the bytes released.
    let before = counter.fetch_sub(bytes, Release);
    if before >= bytes {
        return bytes;
    }
    counter.fetch_add(bytes - before, Relaxed);
    before
}

/// Raises `peak` to `now` if that is higher: a plain load in the steady state, where the peak
/// is already higher (`fetch_max` always writes, a locked instruction on every call).
#[inline]
pub(crate) fn raise_peak(peak: &AtomicU64, now: u64) {
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
            waits: AtomicU64::new(0),
            waited_ns: AtomicU64::new(0),
        }
    }

    /// The figures, to read (no gate: a read during the move sees them before or after it).
    #[inline]
    pub(crate) fn figures(&self) -> &Figures {
        let p = self.figures.load(Acquire);
        // SAFETY: a non-null pointer is this budget's `own` or a published entry, whose
        // mapping is never unmapped (`publish_budgets`).
        if p.is_null() { &self.own } else { unsafe { &*p } }
    }

    /// Runs `op`, an update, on the figures: where they are, or, before they were moved
    /// ([`publish_budgets`]), inside the gate. `op` only loads and stores atomics.
    #[inline(always)]
    pub(crate) fn update<R>(&self, op: impl FnOnce(&Figures) -> R) -> R {
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
    pub(crate) fn update_gated<R>(&self, op: impl FnOnce(&Figures) -> R) -> R {
        let _inside = GATE.enter();
        // (moved meanwhile, before the gate closed behind us: there)
        op(self.figures())
    }

    /// [`DeviceBudget::update`], refused (`Err`) where `update_gated` would go on without
    /// the gate.
    #[inline(always)]
    pub(crate) fn try_update<R>(&self, op: impl FnOnce(&Figures) -> R) -> Result<R, Stuck> {
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
    pub(crate) fn gate_passable(&self) -> Result<(), Stuck> {
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

    /// The shared budget this budget draws on, as something a refused reservation can wait on
    /// (`oom_wait::SharedRoom`), and its device index there: the shared quota today. (A
    /// shared region implementing `SharedRoom` is returned here too.)
    #[inline]
    pub fn shared_room(&self) -> Option<(&'static dyn gpushim_common::oom_wait::SharedRoom, usize)> {
        self.shared().map(|(q, d)| (q as &'static dyn gpushim_common::oom_wait::SharedRoom, d))
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
    pub(crate) fn try_reserve_shared(&self, quota: &Quota, d: usize, bytes: u64, limit: u64) -> Result<(), Refused> {
        // the quota's total bounds ours (ours is part of it)
        quota.reserve(d, bytes, limit).map_err(|total| Refused { reserved: total, limit })?;
        self.update(move |f| {
            // (Acquire: pairs with `freed_in`'s Release, as `reserve_within`'s does)
            let now = f.reserved.fetch_add(bytes, Acquire).saturating_add(bytes);
            raise_peak(&f.peak_reserved, now);
        });
        Ok(())
    }

    /// A reservation [`DeviceBudget::try_reserve`] refused, tried again while waiting up to
    /// `wait` for room in the shared quota (`oom_wait`): only when the quota's total is what
    /// refused it, never when this process' own reservations would pass `limit` (a program
    /// refused by its own limit must see the out-of-memory at once: PyTorch's caching allocator
    /// frees its cache only then). `None`: it did not wait (no quota, its own limit, the gate
    /// stuck); otherwise how the wait ended, counted in [`DeviceBudget::waits`].
    pub fn reserve_waiting(&self, bytes: u64, limit: u64, wait: std::time::Duration) -> Option<Waited> {
        let (room, d) = self.shared_room()?;
        if self.reserved().checked_add(bytes).is_none_or(|n| n > limit) {
            return None;
        }
        self.gate_passable().ok()?;
        let w = gpushim_common::oom_wait::wait_for_room(room, d, bytes, limit, wait);
        if w.end == WaitEnd::Reserved {
            self.update(move |f| {
                // (Acquire: pairs with `freed_in`'s Release, as `reserve_within`'s does)
                let now = f.reserved.fetch_add(bytes, Acquire).saturating_add(bytes);
                raise_peak(&f.peak_reserved, now);
            });
        }
        self.waits.fetch_add(1, Relaxed);
        self.waited_ns.fetch_add(w.waited.as_nanos().min(u64::MAX as u128) as u64, Relaxed);
        Some(w)
    }

    /// (allocations that waited for room, nanoseconds they waited) (`reserve_waiting`).
    pub fn waits(&self) -> (u64, u64) {
        (self.waits.load(Relaxed), self.waited_ns.load(Relaxed))
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
        for a in [&own.reserved, &own.peak_reserved, &own.in_use, &own.peak_in_use, &own.refused, &self.pool_kept, &self.waits, &self.waited_ns] {
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
pub(crate) fn reserve_in(f: &Figures, bytes: u64, limit: u64) -> Result<(), Refused> {
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
pub(crate) fn reserve_within(f: &Figures, bytes: u64, room: u64) -> Result<(), u64> {
    let mut reserved = f.reserved.load(Relaxed);
    loop {
        if reserved > room {
            return Err(reserved);
        }
        let next = reserved + bytes; // ≤ room + bytes
        match f.reserved.compare_exchange_weak(reserved, next, Acquire, Relaxed) {
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
pub(crate) fn take_in(f: &Figures, bytes: u64) {
    // (wrapping: the counter itself would have wrapped)
    let now = f.in_use.fetch_add(bytes, Relaxed).wrapping_add(bytes);
    raise_peak(&f.peak_in_use, now);
}

/// `bytes` fewer reserved and held, each never below zero ([`DeviceBudget::freed`]):
/// `saturating_sub` of both, their common case tested once.
#[inline(always)]
pub(crate) fn freed_in(f: &Figures, bytes: u64) {
    // (held first: in use never passes what is reserved, even for a moment, as the peaks see
    // it; Release, with the reservation's Acquire, keeps that order on weakly ordered CPUs)
    let in_use = f.in_use.fetch_sub(bytes, Relaxed);
    let reserved = f.reserved.fetch_sub(bytes, Release);
    if reserved < bytes || in_use < bytes {
        freed_short(f, reserved, in_use, bytes);
    }
}

/// `freed_in`'s subtractions when a counter held less than `bytes` (a bug): the excess
/// added back, as `saturating_sub` does.
#[cold]
#[inline(never)]
pub(crate) fn freed_short(f: &Figures, reserved: u64, in_use: u64, bytes: u64) {
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
