//! The live map's lock-free table of device pointers: buckets entered with one compare-and-swap, read as a seqlock, entries packed in one word.

#[allow(unused_imports)]
use super::*;

/// Slots per bucket of the table (a bucket is 32 words: four cache lines).
pub(crate) const SLOTS: usize = 10;
/// Buckets of the table: 81,920 slots in 2 MiB of address space, pages committed as they are
/// first written (the table is zeroed memory from the allocator, i.e. fresh anonymous pages).
pub(crate) const BUCKETS: usize = 8192;

/// `Bucket::meta`, from its lowest bit: the occupied slots (one bit each, from bit 0: a slot's
/// number is its bit's, with no shift), `SPILLED` (above them: "not spilled and not full" is
/// one comparison), `BUSY`, then the sequence.
pub(crate) const OCC_SHIFT: u32 = 0;
pub(crate) const OCC_MASK: u64 = ((1 << SLOTS) - 1) << OCC_SHIFT;
/// `Bucket::meta`: some device pointer of this bucket is in the mutex map (`Bucket::spilled`).
pub(crate) const SPILLED: u64 = 1 << (OCC_SHIFT + SLOTS as u32);
/// `Bucket::meta`: a writer is inside (the bucket's other words may be half-written).
pub(crate) const BUSY: u64 = SPILLED << 1;
/// The sequence part of `Bucket::meta`: bumped by every write, so a reader that saw the same
/// word before and after its reads saw no write in between (a seqlock).
pub(crate) const SEQ_ONE: u64 = BUSY << 1;

/// What a slot's packed word holds: bytes (52 bits) | device (10 bits) | pool | served.
pub(crate) const PACK_DEVICES: usize = 1 << 10;
pub(crate) const PACK_BYTES: u64 = 1 << 52;

/// One bucket of the lock-free table: up to `SLOTS` device pointers whose hash picks it.
#[repr(C, align(64))]
pub(crate) struct Bucket {
    /// Occupied slots (one bit each) | `SPILLED` | `BUSY` | sequence.
    pub(crate) meta: AtomicU64,
    /// How many device pointers of this bucket are in the mutex map; written only by the writer
    /// that holds `BUSY`. `SPILLED` is set in `meta` while it is not zero.
    pub(crate) spilled: AtomicU64,
    /// Per slot: key, packed entry, entry id.
    pub(crate) slots: [[AtomicU64; 3]; SLOTS],
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
    pub(crate) fn enter(&self) -> Option<u64> {
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
    pub(crate) fn try_enter(&self) -> Option<u64> {
        if self.meta.fetch_or(BUSY, Acquire) & BUSY == 0 {
            // (as in `enter`)
            fence(Release);
            return Some(self.meta.load(Relaxed));
        }
        None
    }

    /// [`Bucket::enter`], its failure said (`?` in the general paths).
    #[inline(always)]
    pub(crate) fn enter_or_stuck(&self) -> Result<u64, Stuck> {
        self.enter().ok_or(Stuck::TimedOut(LIVE_WHAT))
    }

    /// The wait of [`Bucket::enter`]: the word as entered (`BUSY` set: never 0), or 0 when it
    /// gave up (a plain integer, returned in a register).
    #[cold]
    #[inline(never)]
    pub(crate) fn enter_waiting(&self) -> u64 {
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
    pub(crate) fn leave(&self, held: u64, occ: u64, spilled: bool) {
        let seq = (held & !(SEQ_ONE - 1)).wrapping_add(SEQ_ONE);
        self.meta.store(seq | occ | if spilled { SPILLED } else { 0 }, Release);
    }

    /// Leaves with nothing changed: the word as it was before `enter` (`held` without `BUSY`;
    /// no sequence step, as no slot was written).
    #[inline]
    pub(crate) fn leave_unchanged(&self, held: u64) {
        self.meta.store(held & !BUSY, Release);
    }

    /// Leaves with slot `j` now occupied (`occupied`) or free, `SPILLED` as it was: `leave`
    /// for the packed operations, in two instructions (`held`, what `enter` returned, has
    /// `BUSY` set, the bit below the sequence: adding `BUSY` clears it and carries one
    /// sequence step).
    #[inline(always)]
    pub(crate) fn leave_slot(&self, held: u64, j: usize, occupied: bool) {
        let bit = 1 << (j as u32 + OCC_SHIFT);
        let word = if occupied { held | bit } else { held & !bit };
        self.meta.store(word.wrapping_add(SEQ_ONE - BUSY), Release);
    }

    /// Slot `j`'s words (key, packed entry, id).
    ///
    /// # Safety
    /// `j < SLOTS`.
    #[inline(always)]
    pub(crate) unsafe fn slot(&self, j: usize) -> &[AtomicU64; 3] {
        debug_assert!(j < SLOTS, "slot {j}");
        // SAFETY: the caller's word.
        unsafe { self.slots.get_unchecked(j) }
    }

    /// The slot holding `key` among those `meta` says are occupied.
    #[inline]
    pub(crate) fn find(&self, meta: u64, key: u64) -> Option<usize> {
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
    pub(crate) fn load(&self, j: usize) -> Live {
        unpack(self.slots[j][1].load(Relaxed), self.slots[j][2].load(Relaxed))
    }

    #[inline]
    pub(crate) fn load_packed(&self, j: usize) -> Packed {
        Packed { word: self.slots[j][1].load(Relaxed), id: self.slots[j][2].load(Relaxed) }
    }

    #[inline]
    pub(crate) fn store(&self, j: usize, key: u64, packed: u64, id: u64) {
        self.slots[j][0].store(key, Relaxed);
        self.slots[j][1].store(packed, Relaxed);
        self.slots[j][2].store(id, Relaxed);
    }

    /// `LiveMap::insert_packed` in this bucket (its key's).
    #[inline(always)]
    pub(crate) fn insert_packed(&self, key: u64, entry: Packed) -> Result<Option<Packed>, Packed> {
        let Some(before) = self.enter() else { return Err(entry) };
        self.insert_entered(before, key, entry)
    }

    /// `insert_packed` once entered (`before`: the word as entered).
    #[inline(always)]
    pub(crate) fn insert_entered(&self, before: u64, key: u64, entry: Packed) -> Result<Option<Packed>, Packed> {
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
    pub(crate) fn remove_packed(&self, key: u64) -> Result<Option<Packed>, ()> {
        let Some(before) = self.enter() else { return Err(()) };
        self.remove_entered(before, key)
    }

    /// `remove_packed` once entered (`before`: the word as entered).
    #[inline(always)]
    pub(crate) fn remove_entered(&self, before: u64, key: u64) -> Result<Option<Packed>, ()> {
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
    pub(crate) fn read<R>(&self, mut f: impl FnMut(u64) -> R) -> Result<R, Stuck> {
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
pub(crate) fn pack(live: &Live) -> Option<u64> {
    (live.ctx == 0 && live.device < PACK_DEVICES && live.bytes < PACK_BYTES)
        .then_some(live.served as u64 | (live.pool as u64) << 1 | (live.device as u64) << 2 | live.bytes << 12)
}

/// A device pointer's entry as a table slot holds it: the packed word ([`pack`]) and the id.
/// Two plain integers: the allocation path passes them in registers, where a [`Live`] (whose
/// flags give `Option<Live>` a niche) is built and copied through the stack.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Packed {
    pub(crate) word: u64,
    pub(crate) id: u64,
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
pub(crate) fn unpack(packed: u64, id: u64) -> Live {
    Live {
        device: ((packed >> 2) as usize) & (PACK_DEVICES - 1),
        bytes: packed >> 12,
        served: packed & 1 != 0,
        pool: packed & 2 != 0,
        ctx: 0,
        id,
    }
}

/// A live map's table as the fast lane (`lane`) holds it: where its buckets are and the shift
/// that picks a key's, copied once, so that the pair's path reaches a bucket without looking
/// at the map. Its operations are the map's packed ones ([`LiveMap::insert_packed`],
/// [`LiveMap::remove_packed`]), on the same buckets.
#[derive(Clone, Copy)]
pub struct PtrTable<'a> {
    pub(crate) buckets: *mut Bucket,
    /// 64 − log2(buckets): a key's bucket is its hash's top bits (as `LiveMap::ptr_bucket`
    /// picks it, in one shift: there are at least two buckets, so the shift is below 64).
    pub(crate) shift: u32,
    pub(crate) _map: std::marker::PhantomData<&'a LiveMap>,
}

// SAFETY: a view of the map's buckets (atomics only), which the map shares between threads.
unsafe impl Send for PtrTable<'_> {}
unsafe impl Sync for PtrTable<'_> {}

impl PtrTable<'_> {
    #[inline(always)]
    pub(crate) fn bucket(&self, key: u64) -> &Bucket {
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
