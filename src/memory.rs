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
//! was counted with, so the free gives back exactly what the allocation took. It is sharded by
//! key so threads allocating at once rarely meet on a lock, and no lock is ever held across a
//! call into the driver.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release, Ordering::SeqCst};
use std::sync::{Mutex, OnceLock};

use crate::quota::Quota;

/// Device ordinals the shim accounts for (the program's, after hiding and splitting). A
/// configuration that makes more devices is an error; an allocation on a device beyond this
/// (a driver showing more GPUs) is refused while any limit is set, never passed uncounted.
pub const MAX_DEVICES: usize = 256;

const UNRESOLVED: u64 = u64::MAX;

/// The budget of one device in the program's view.
pub struct DeviceBudget {
    /// The effective limit in bytes, `UNRESOLVED` until the device's physical size is known.
    limit: AtomicU64,
    /// Bytes taken from the driver for the program: what the limit bounds.
    reserved: AtomicU64,
    peak_reserved: AtomicU64,
    /// Bytes the program holds (≤ `reserved`, up to a moment's lag between the two counters).
    in_use: AtomicU64,
    peak_in_use: AtomicU64,
    refused: AtomicU64,
    /// Bytes freed into stream-ordered pools that the driver may still hold (pools keep freed
    /// memory until a synchronisation or a trim releases it): still in `reserved`, no longer in
    /// `in_use`, credited once the driver shows the pools gave them back (`pools`).
    pool_kept: AtomicU64,
    /// Bumped by every free into a pool (after the driver's free, before `pool_kept` grows): a
    /// reconciliation whose driver figures may predate a free credits nothing.
    pool_epoch: AtomicU64,
    /// The device's entry in a shared quota (`quota`): reservations are then checked against
    /// what every member holds.
    shared: OnceLock<(&'static Quota, usize)>,
    /// This device's entry in the process' published figures (`live`); null: not published
    /// (not yet, beyond `live::DEVICES`, or a forked child).
    mirror: AtomicPtr<crate::live::Dev>,
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
            limit: AtomicU64::new(UNRESOLVED),
            reserved: AtomicU64::new(0),
            peak_reserved: AtomicU64::new(0),
            in_use: AtomicU64::new(0),
            peak_in_use: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            pool_kept: AtomicU64::new(0),
            pool_epoch: AtomicU64::new(0),
            shared: OnceLock::new(),
            mirror: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// Publishes this budget's figures in `dev` from now on (`live`): copies them, then every
    /// change is applied to the copy as the same atomic step (an addition, a subtraction of
    /// what was actually subtracted, a maximum), so concurrent changes never leave a stale
    /// figure behind. Called once, before the program allocates (at `cuInit`, which other
    /// threads wait for).
    pub fn mirror_to(&self, dev: &'static crate::live::Dev) {
        dev.limit.store(self.limit.load(Relaxed), Relaxed);
        dev.in_use.store(self.in_use.load(Relaxed), Relaxed);
        dev.peak_in_use.store(self.peak_in_use.load(Relaxed), Relaxed);
        dev.reserved.store(self.reserved.load(Relaxed), Relaxed);
        dev.peak_reserved.store(self.peak_reserved.load(Relaxed), Relaxed);
        dev.refused.store(self.refused.load(Relaxed), Relaxed);
        self.mirror.store(dev as *const _ as *mut _, Release);
    }

    /// Stops publishing (a forked child: the file is its parent's).
    pub fn unmirror(&self) {
        self.mirror.store(std::ptr::null_mut(), Release);
    }

    /// The published entry, if any (one load; no system call, no lock).
    #[inline]
    fn mirror(&self) -> Option<&crate::live::Dev> {
        let m = self.mirror.load(Acquire);
        // SAFETY: a non-null mirror points into the process' published mapping, never unmapped.
        (!m.is_null()).then(|| unsafe { &*m })
    }

    /// Makes reservations on this device count in `quota`'s device `index`.
    pub fn share(&self, quota: &'static Quota, index: usize) {
        let _ = self.shared.set((quota, index));
    }

    /// The shared quota's device this budget draws on, if any.
    pub fn shared(&self) -> Option<(&'static Quota, usize)> {
        self.shared.get().copied()
    }

    /// What counts against the limit: this process' reservations, or with a shared quota what
    /// all its members hold.
    pub fn held(&self) -> u64 {
        match self.shared.get() {
            Some((q, d)) => q.reserved(*d),
            None => self.reserved(),
        }
    }

    pub fn limit(&self) -> Option<u64> {
        let l = self.limit.load(Relaxed);
        (l != UNRESOLVED).then_some(l)
    }

    pub fn set_limit(&self, limit: u64) {
        self.limit.store(limit.min(UNRESOLVED - 1), Relaxed);
        if let Some(m) = self.mirror() {
            m.limit.store(limit.min(UNRESOLVED - 1), Relaxed);
        }
    }

    pub fn reserved(&self) -> u64 {
        self.reserved.load(Relaxed)
    }

    pub fn peak_reserved(&self) -> u64 {
        self.peak_reserved.load(Relaxed)
    }

    pub fn in_use(&self) -> u64 {
        self.in_use.load(Relaxed)
    }

    pub fn peak_in_use(&self) -> u64 {
        self.peak_in_use.load(Relaxed)
    }

    pub fn refused(&self) -> u64 {
        self.refused.load(Relaxed)
    }

    /// Adds `bytes` to what is reserved if that stays within `limit` (not counted as a
    /// refusal: the caller decides whether the program's request is refused).
    pub fn try_reserve(&self, bytes: u64, limit: u64) -> Result<(), Refused> {
        if let Some((quota, d)) = self.shared.get() {
            // the quota's total bounds ours (ours is part of it)
            quota.reserve(*d, bytes, limit).map_err(|total| Refused { reserved: total, limit })?;
            let now = self.reserved.fetch_add(bytes, Relaxed).saturating_add(bytes);
            self.peak_reserved.fetch_max(now, Relaxed);
            if let Some(m) = self.mirror() {
                m.reserved.fetch_add(bytes, Relaxed);
                m.peak_reserved.fetch_max(now, Relaxed);
            }
            return Ok(());
        }
        let mut reserved = self.reserved.load(Relaxed);
        loop {
            let next = match reserved.checked_add(bytes) {
                Some(n) if n <= limit => n,
                _ => return Err(Refused { reserved, limit }),
            };
            match self.reserved.compare_exchange_weak(reserved, next, Relaxed, Relaxed) {
                Ok(_) => {
                    self.peak_reserved.fetch_max(next, Relaxed);
                    if let Some(m) = self.mirror() {
                        m.reserved.fetch_add(bytes, Relaxed);
                        m.peak_reserved.fetch_max(next, Relaxed);
                    }
                    return Ok(());
                }
                Err(now) => reserved = now,
            }
        }
    }

    /// Gives back `bytes` of the reservation (never below zero).
    pub fn release(&self, bytes: u64) {
        let before = self.reserved.fetch_update(Relaxed, Relaxed, |u| Some(u.saturating_sub(bytes))).unwrap_or(0);
        if let Some(m) = self.mirror() {
            m.reserved.fetch_sub(before.min(bytes), Relaxed);
        }
        if let Some((quota, d)) = self.shared.get() {
            quota.release(*d, bytes);
        }
    }

    /// The program now holds `bytes` more.
    pub fn take(&self, bytes: u64) {
        let now = self.in_use.fetch_add(bytes, Relaxed).saturating_add(bytes);
        self.peak_in_use.fetch_max(now, Relaxed);
        if let Some(m) = self.mirror() {
            m.in_use.fetch_add(bytes, Relaxed);
            m.peak_in_use.fetch_max(now, Relaxed);
        }
    }

    /// The program gave `bytes` back (never below zero).
    pub fn give(&self, bytes: u64) {
        let before = self.in_use.fetch_update(Relaxed, Relaxed, |u| Some(u.saturating_sub(bytes))).unwrap_or(0);
        if let Some(m) = self.mirror() {
            m.in_use.fetch_sub(before.min(bytes), Relaxed);
        }
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

    /// A forked child holds nothing (`fork`): every figure back to zero, the limit kept.
    pub fn reset_after_fork(&self) {
        self.unmirror();
        for a in [&self.reserved, &self.peak_reserved, &self.in_use, &self.peak_in_use, &self.refused, &self.pool_kept] {
            a.store(0, SeqCst);
        }
        self.pool_epoch.fetch_add(1, SeqCst);
    }

    /// Counts one of the program's requests as refused.
    pub fn count_refusal(&self) {
        self.refused.fetch_add(1, Relaxed);
        if let Some(m) = self.mirror() {
            m.refused.fetch_add(1, Relaxed);
        }
    }
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

type Shard = Mutex<HashMap<u64, Live, BuildHasherDefault<FastHasher>>>;

/// `SHARDS` shards for each kind of key.
pub struct LiveMap {
    shards: Box<[Shard]>,
}

impl LiveMap {
    pub fn new() -> Self {
        LiveMap { shards: (0..SHARDS * KINDS).map(|_| Mutex::new(HashMap::default())).collect() }
    }

    fn shard(&self, kind: Kind, key: u64) -> &Shard {
        // Device pointers are at least 256-byte aligned: mix the bits that vary.
        let h = ((key >> 8).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize % SHARDS;
        &self.shards[kind as usize * SHARDS + h]
    }

    /// Records `live` under `key`; returns the entry it replaces. The driver never hands out a
    /// pointer or handle that is still allocated, so a replaced entry is one the driver freed
    /// behind the shim's back (e.g. with a context the shim did not see destroyed): the caller
    /// credits it.
    pub fn insert(&self, kind: Kind, key: u64, live: Live) -> Option<Live> {
        let mut shard = self.shard(kind, key).lock().unwrap_or_else(|e| e.into_inner());
        shard.insert(key, live)
    }

    /// Removes `key` only if it still holds `expected` (not an entry recorded since).
    pub fn remove_if(&self, kind: Kind, key: u64, expected: &Live) -> Option<Live> {
        let mut shard = self.shard(kind, key).lock().unwrap_or_else(|e| e.into_inner());
        if shard.get(&key) == Some(expected) {
            return shard.remove(&key);
        }
        None
    }

    /// A copy of every entry of `kind` (slow: for context teardown, never on the allocation
    /// path). Each shard is locked only while it is copied.
    pub fn entries(&self, kind: Kind) -> Vec<(u64, Live)> {
        let mut all = Vec::new();
        for shard in &self.shards[kind as usize * SHARDS..(kind as usize + 1) * SHARDS] {
            let shard = shard.lock().unwrap_or_else(|e| e.into_inner());
            all.extend(shard.iter().map(|(&k, &v)| (k, v)));
        }
        all
    }

    pub fn get(&self, kind: Kind, key: u64) -> Option<Live> {
        let shard = self.shard(kind, key).lock().unwrap_or_else(|e| e.into_inner());
        shard.get(&key).copied()
    }

    pub fn remove(&self, kind: Kind, key: u64) -> Option<Live> {
        let mut shard = self.shard(kind, key).lock().unwrap_or_else(|e| e.into_inner());
        shard.remove(&key)
    }

    /// Takes every shard's lock for a fork (`fork`).
    pub fn hold_for_fork(&'static self) {
        for shard in self.shards.iter() {
            crate::fork::hold(shard);
        }
    }

    /// A forked child holds nothing (`fork`).
    pub fn reset_after_fork(&self) {
        for shard in self.shards.iter() {
            crate::fork::reset(shard, HashMap::default);
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().unwrap().len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

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

    #[test]
    fn the_published_copy_follows_concurrent_changes_exactly() {
        // SAFETY: a Dev is atomics only: all-zero is a valid value.
        let dev: &'static crate::live::Dev = Box::leak(Box::new(unsafe { std::mem::zeroed() }));
        let b = Arc::new(DeviceBudget::new());
        b.set_limit(5_000);
        b.try_reserve(100, 5_000).unwrap();
        b.take(100);
        b.mirror_to(dev);
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                let b = b.clone();
                std::thread::spawn(move || {
                    for i in 0..20_000u64 {
                        let size = 1 + (i * 7919 + t * 104_729) % 300;
                        if b.try_reserve(size, 5_000).is_ok() {
                            b.take(size);
                            if i % 2 == 0 {
                                b.give(size);
                                b.release(size);
                            }
                        } else {
                            b.count_refusal();
                            b.give(400); // (more than some hold: saturates at zero)
                            b.release(400);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let published = [&dev.in_use, &dev.peak_in_use, &dev.reserved, &dev.peak_reserved, &dev.refused, &dev.limit].map(|a| a.load(SeqCst));
        assert_eq!(published, [b.in_use(), b.peak_in_use(), b.reserved(), b.peak_reserved(), b.refused(), 5_000]);
        assert!(b.refused() > 0);
        b.unmirror();
        b.take(1);
        assert_eq!(dev.in_use.load(SeqCst) + 1, b.in_use());
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
        m.insert(Kind::DevicePtr, 0x1000, Live { device: 0, bytes: 5, served: false, pool: false, ctx: 0, id: 1 });
        m.insert(Kind::VmmHandle, 0x1000, Live { device: 1, bytes: 7, served: false, pool: false, ctx: 0, id: 2 });
        assert_eq!(m.remove(Kind::DevicePtr, 0x1000), Some(Live { device: 0, bytes: 5, served: false, pool: false, ctx: 0, id: 1 }));
        assert_eq!(m.remove(Kind::DevicePtr, 0x1000), None);
        assert_eq!(m.len(), 1);
        assert_eq!(m.remove(Kind::VmmHandle, 0x1000), Some(Live { device: 1, bytes: 7, served: false, pool: false, ctx: 0, id: 2 }));
    }
}
