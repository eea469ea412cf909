//! The live map: for every pointer or handle the program holds, the device and size it was counted with (the lock-free table for device pointers, a sharded map for the rest).

#[allow(unused_imports)]
use super::*;

/// What kind of object a live entry is: the key spaces differ (a VMM handle is an opaque
/// number that could equal some device pointer).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Kind {
    DevicePtr = 0,
    VmmHandle = 1,
    Array = 2,
    MipmappedArray = 3,
}

pub(crate) const KINDS: usize = 4;

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
    pub(crate) static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Relaxed)
}

pub(crate) const SHARDS: usize = 64;

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

pub(crate) type ShardMap = HashMap<u64, Live, BuildHasherDefault<FastHasher>>;
pub(crate) type Shard = Bounded<ShardMap>;

/// What the live map is called in messages.
pub(crate) const LIVE_WHAT: &str = "gpushim's map of live allocations";

/// The mutex map: `SHARDS` shards for each kind of key. Holds every entry of the kinds other
/// than device pointers, and the device pointers the table has no room for ([`LiveMap`]).
pub(crate) struct Shards {
    pub(crate) shards: Box<[Shard]>,
    /// Entries of each kind (changed under the shard's lock): a kind with none is listed
    /// without taking its 64 locks (context teardown lists arrays at every context release).
    pub(crate) counts: [AtomicU64; KINDS],
}

impl Shards {
    pub(crate) fn new() -> Self {
        Shards { shards: (0..SHARDS * KINDS).map(|_| Bounded::new(LIVE_WHAT, HashMap::default())).collect(), counts: [const { AtomicU64::new(0) }; KINDS] }
    }

    /// One entry of `kind` more (under its shard's lock).
    pub(crate) fn one_more(&self, kind: Kind) {
        self.counts[kind as usize].fetch_add(1, Relaxed);
    }

    /// One entry of `kind` fewer (under its shard's lock).
    pub(crate) fn one_fewer(&self, kind: Kind) {
        self.counts[kind as usize].fetch_sub(1, Relaxed);
    }

    /// The shard of `key`, locked (bounded: `Err` when it cannot be had).
    pub(crate) fn shard(&self, kind: Kind, key: u64) -> Result<bounded::Guard<'_, ShardMap>, Stuck> {
        // Device pointers are at least 256-byte aligned: mix the bits that vary.
        let h = ((key >> 8).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize % SHARDS;
        self.shards[kind as usize * SHARDS + h].lock()
    }

    /// Inserts into `shard` (`key`'s, locked).
    pub(crate) fn insert_in(&self, shard: &mut ShardMap, kind: Kind, key: u64, live: Live) -> Option<Live> {
        let replaced = shard.insert(key, live);
        if replaced.is_none() {
            self.one_more(kind);
        }
        replaced
    }

    /// Removes `key` from `shard` (its, locked), if it holds `expected` when given.
    pub(crate) fn remove_in(&self, shard: &mut ShardMap, kind: Kind, key: u64, expected: Option<&Live>) -> Option<Live> {
        if expected.is_some_and(|e| shard.get(&key) != Some(e)) {
            return None;
        }
        let removed = shard.remove(&key);
        if removed.is_some() {
            self.one_fewer(kind);
        }
        removed
    }

    pub(crate) fn insert(&self, kind: Kind, key: u64, live: Live) -> Result<Option<Live>, Stuck> {
        Ok(self.insert_in(&mut *self.shard(kind, key)?, kind, key, live))
    }

    pub(crate) fn get(&self, kind: Kind, key: u64) -> Result<Option<Live>, Stuck> {
        Ok(self.shard(kind, key)?.get(&key).copied())
    }

    pub(crate) fn remove(&self, kind: Kind, key: u64, expected: Option<&Live>) -> Result<Option<Live>, Stuck> {
        Ok(self.remove_in(&mut *self.shard(kind, key)?, kind, key, expected))
    }

    /// Copies the entries of `kind` into `all`; a shard that cannot be locked is left out
    /// (`Err` says so, after the others were copied).
    pub(crate) fn entries_into(&self, kind: Kind, all: &mut Vec<(u64, Live)>) -> Result<(), Stuck> {
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

    pub(crate) fn hold_for_fork(&'static self) {
        for shard in self.shards.iter() {
            crate::platform::fork::hold(shard);
        }
    }

    pub(crate) fn reset_after_fork(&self) {
        for shard in self.shards.iter() {
            shard.reset_after_fork(HashMap::default());
        }
        for c in &self.counts {
            c.store(0, Relaxed);
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().map_or(0, |m| m.len())).sum()
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
    pub(crate) table: Table,
    /// 32 − log2(buckets): see `ptr_bucket`.
    pub(crate) shift: u32,
    pub(crate) shards: Shards,
}

impl LiveMap {
    pub fn new() -> Self {
        Self::with_buckets(BUCKETS)
    }

    /// A map whose table has `buckets` buckets (a power of two; none: every key in the
    /// mutex map, which is also what happens if the table cannot be allocated).
    pub(crate) fn with_buckets(buckets: usize) -> Self {
        let table = zeroed_table(buckets);
        // a key's bucket is its hash's top log2(buckets) bits: shifted right by 32, then by
        // this (a table of 1 bucket: 32 and 32)
        let shift = 32 - table.len().max(1).trailing_zeros();
        LiveMap { table, shift, shards: Shards::new() }
    }

    /// The bucket of a device pointer's key, if the table has any.
    #[inline(always)]
    pub(crate) fn bucket(&self, kind: Kind, key: u64) -> Option<&Bucket> {
        if kind != Kind::DevicePtr || self.table.is_empty() {
            return None;
        }
        self.ptr_bucket(key)
    }

    /// The bucket of a device pointer, if the table has any.
    #[inline(always)]
    pub(crate) fn ptr_bucket(&self, key: u64) -> Option<&Bucket> {
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
    pub(crate) fn insert_spilling(&self, b: &Bucket, before: u64, kind: Kind, key: u64, live: Live) -> Result<Option<Live>, Stuck> {
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
    pub(crate) fn take(&self, kind: Kind, key: u64, expected: Option<&Live>) -> Result<Option<Live>, Stuck> {
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
    pub(crate) fn take_spilled(&self, b: &Bucket, before: u64, kind: Kind, key: u64, expected: Option<&Live>) -> Result<Option<Live>, Stuck> {
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
