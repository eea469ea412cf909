//! The reserve of the `grow` and `preallocate` memory modes: device memory the shim took from
//! the driver in large chunks and hands out in pieces.
//!
//! **Why this design.** The reserve is a best-fit allocator over plain `cuMemAlloc_v2` chunks,
//! with blocks split on allocation and coalesced with free neighbours on free. The alternatives:
//! - *Driver blocks kept in size classes* (free = keep the block for a later request of the
//!   same class) cannot preallocate at all, and wastes up to a class step per allocation.
//! - *Virtual memory mapping* (`cuMemAddressReserve` + `cuMemCreate` + `cuMemMap`) would give
//!   one contiguous range per device, but VMM memory cannot be shared with the legacy IPC
//!   calls or registered with some libraries, needs 2 MiB granularity, and is not available
//!   under every virtualisation layer; a program that never used VMM would suddenly depend on it.
//!
//! Best fit with coalescing keeps fragmentation bounded in practice (the benchmark measures
//! it); the chunk sizes of `grow` (see `modes`) keep small requests out of large chunks' way.
//!
//! Every block is a multiple of [`GRANULE`] bytes and starts on a multiple of it (chunks from
//! the driver are at least that aligned), so every pointer handed out is 512-byte aligned —
//! more than the 256 bytes the driver guarantees, and what pitched rows need.
//!
//! One [`Arena`] per device of the program, behind its own lock, taken only for map updates:
//! no call into the driver is ever made while it is held. Chunks are tagged with the context
//! they were allocated in (its unique id), and a block is only handed to a program whose current
//! context is that one: memory of one context is not usable from another, and a context's
//! chunks vanish with it (see [`Arena::drop_context`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Size and alignment unit of the reserve's blocks.
pub const GRANULE: u64 = 512;

/// `bytes` rounded up to the granule; `None` on overflow.
pub fn rounded(bytes: u64) -> Option<u64> {
    bytes.checked_add(GRANULE - 1).map(|b| b & !(GRANULE - 1))
}

/// Buffer ids of sub-allocations (`CU_POINTER_ATTRIBUTE_BUFFER_ID`): unique per allocation, in
/// a range the driver's own ids (a counter from 1) do not reach.
static NEXT_BUFFER_ID: AtomicU64 = AtomicU64::new(1 << 56);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Chunk {
    size: u64,
    /// The unique id of the context the chunk was allocated in.
    ctx: u64,
    /// That context's handle (to make it current for synchronising).
    handle: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Block {
    size: u64,
    /// Base address of the chunk the block lies in (blocks never span chunks).
    chunk: u64,
    live: Option<Live>,
}

/// What the program holds in a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Live {
    /// The bytes asked for (≤ the block's size).
    requested: u64,
    buffer_id: u64,
}

/// A live sub-allocation, as pointer queries describe it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Found {
    pub base: u64,
    pub requested: u64,
    pub buffer_id: u64,
    /// The handle of the context it belongs to.
    pub ctx_handle: usize,
}

/// Where an address lies relative to the reserve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// Within the requested bytes of a live sub-allocation.
    Live(Found),
    /// In a chunk of the reserve, but not in what a live sub-allocation asked for.
    Inside,
    /// Not the reserve's memory.
    Outside,
}

/// What a free gave back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Freed {
    /// The block's size (what was counted in use).
    pub size: u64,
    pub ctx_handle: usize,
}

/// What forgetting a context's chunks took away.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dropped {
    /// Bytes of the chunks (reserved).
    pub reserved: u64,
    /// Live sub-allocations that were in them: (address, block size).
    pub live: Vec<(u64, u64)>,
}

/// Where the preallocation of a context stands (see [`Arena::claim_preallocation`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preallocation {
    /// The caller must take the chunk now, then call [`Arena::finish_preallocation`].
    Claimed,
    /// Another thread is taking it.
    Pending,
    Done,
}

/// The reserve of one device.
#[derive(Default, Debug)]
pub struct Arena {
    chunks: BTreeMap<u64, Chunk>,
    blocks: BTreeMap<u64, Block>,
    /// Free blocks as (context id, size, address): best fit is the first entry at or after
    /// (ctx, size, 0) that still has the same context.
    free: BTreeSet<(u64, u64, u64)>,
    reserved: u64,
    in_use: u64,
    /// Contexts for which `preallocate` took (or tried to take) its chunk: (id, finished).
    preallocated: Vec<(u64, bool)>,
}

impl Arena {
    pub const fn new() -> Self {
        Arena {
            chunks: BTreeMap::new(),
            blocks: BTreeMap::new(),
            free: BTreeSet::new(),
            reserved: 0,
            in_use: 0,
            preallocated: Vec::new(),
        }
    }

    /// Bytes of chunks held.
    #[cfg(test)]
    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    /// Bytes of live blocks.
    #[cfg(test)]
    pub fn in_use(&self) -> u64 {
        self.in_use
    }

    /// Claims the preallocation of context `ctx` for the caller if nobody did yet.
    pub fn claim_preallocation(&mut self, ctx: u64) -> Preallocation {
        match self.preallocated.iter().find(|&&(c, _)| c == ctx) {
            Some(&(_, true)) => Preallocation::Done,
            Some(_) => Preallocation::Pending,
            None => {
                self.preallocated.push((ctx, false));
                Preallocation::Claimed
            }
        }
    }

    /// The claimed preallocation of `ctx` is over (whether it took memory or not).
    pub fn finish_preallocation(&mut self, ctx: u64) {
        for entry in self.preallocated.iter_mut().filter(|(c, _)| *c == ctx) {
            entry.1 = true;
        }
    }

    /// Whether the preallocation of `ctx` is over (or was never claimed).
    pub fn preallocation_done(&self, ctx: u64) -> bool {
        self.preallocated.iter().all(|&(c, done)| c != ctx || done)
    }

    /// Adds a chunk the driver gave (`base` 512-aligned, `size` a multiple of the granule).
    pub fn add_chunk(&mut self, ctx: u64, handle: usize, base: u64, size: u64) {
        debug_assert!(base.is_multiple_of(GRANULE) && size.is_multiple_of(GRANULE) && size > 0);
        self.chunks.insert(base, Chunk { size, ctx, handle });
        self.blocks.insert(base, Block { size, chunk: base, live: None });
        self.free.insert((ctx, size, base));
        self.reserved += size;
    }

    /// A block of `size` bytes (a multiple of the granule) for `requested` bytes in context
    /// `ctx`: the smallest free block that fits, lowest address first, split if larger.
    pub fn alloc(&mut self, ctx: u64, size: u64, requested: u64) -> Option<u64> {
        let &(c, block_size, addr) = self.free.range((ctx, size, 0)..).next()?;
        if c != ctx {
            return None;
        }
        self.free.remove(&(c, block_size, addr));
        let chunk = self.blocks.get(&addr)?.chunk;
        if block_size > size {
            let rest = (addr + size, block_size - size);
            self.blocks.insert(rest.0, Block { size: rest.1, chunk, live: None });
            self.free.insert((ctx, rest.1, rest.0));
        }
        let buffer_id = NEXT_BUFFER_ID.fetch_add(1, Relaxed);
        self.blocks.insert(addr, Block { size, chunk, live: Some(Live { requested, buffer_id }) });
        self.in_use += size;
        Some(addr)
    }

    /// Frees the live block starting at `addr`, merging it with free neighbours of its chunk.
    /// `None`: no live block starts there.
    pub fn free(&mut self, addr: u64) -> Option<Freed> {
        let block = *self.blocks.get(&addr)?;
        block.live?;
        let chunk = *self.chunks.get(&block.chunk)?;
        self.in_use -= block.size;
        let (mut start, mut size) = (addr, block.size);
        // The next block, if free and in the same chunk.
        if let Some(next) = self.blocks.get(&(addr + block.size)).copied() {
            if next.live.is_none() && next.chunk == block.chunk {
                self.blocks.remove(&(addr + block.size));
                self.free.remove(&(chunk.ctx, next.size, addr + block.size));
                size += next.size;
            }
        }
        // The previous block, if free, in the same chunk, and ending here.
        if let Some((&p, &prev)) = self.blocks.range(..addr).next_back() {
            if prev.live.is_none() && prev.chunk == block.chunk && p + prev.size == addr {
                self.blocks.remove(&addr);
                self.free.remove(&(chunk.ctx, prev.size, p));
                start = p;
                size += prev.size;
            }
        }
        self.blocks.insert(start, Block { size, chunk: block.chunk, live: None });
        self.free.insert((chunk.ctx, size, start));
        Some(Freed { size: block.size, ctx_handle: chunk.handle })
    }

    /// Where `addr` lies.
    pub fn lookup(&self, addr: u64) -> Lookup {
        let Some((&cbase, chunk)) = self.chunks.range(..=addr).next_back() else { return Lookup::Outside };
        if addr - cbase >= chunk.size {
            return Lookup::Outside;
        }
        let Some((&base, block)) = self.blocks.range(..=addr).next_back() else { return Lookup::Inside };
        match block.live {
            Some(l) if addr - base < l.requested => {
                Lookup::Live(Found { base, requested: l.requested, buffer_id: l.buffer_id, ctx_handle: chunk.handle })
            }
            _ => Lookup::Inside,
        }
    }

    /// Forgets every chunk of context `ctx` (destroyed: the driver freed its memory).
    pub fn drop_context(&mut self, ctx: u64) -> Dropped {
        let mut dropped = Dropped::default();
        let bases: Vec<u64> = self.chunks.iter().filter(|(_, c)| c.ctx == ctx).map(|(&b, _)| b).collect();
        for base in bases {
            self.drop_chunk(base, &mut dropped);
        }
        self.preallocated.retain(|&(c, _)| c != ctx);
        dropped
    }

    /// Drops the chunks that overlap `[base, base + size)`: the driver has just handed out that
    /// memory again, which proves it freed them (their context was destroyed, and the shim has
    /// not yet heard of it).
    pub fn drop_overlapping(&mut self, base: u64, size: u64) -> Dropped {
        let mut dropped = Dropped::default();
        let end = base.saturating_add(size);
        let bases: Vec<u64> = self
            .chunks
            .range(..end)
            .rev()
            .take_while(|(&b, c)| b.saturating_add(c.size) > base)
            .map(|(&b, _)| b)
            .collect();
        for b in bases {
            self.drop_chunk(b, &mut dropped);
        }
        dropped
    }

    fn drop_chunk(&mut self, base: u64, dropped: &mut Dropped) {
        let Some(chunk) = self.chunks.remove(&base) else { return };
        let blocks: Vec<(u64, Block)> = self.blocks.range(base..base + chunk.size).map(|(&a, &b)| (a, b)).collect();
        for (addr, block) in blocks {
            self.blocks.remove(&addr);
            match block.live {
                Some(_) => {
                    self.in_use -= block.size;
                    dropped.live.push((addr, block.size));
                }
                None => {
                    self.free.remove(&(chunk.ctx, block.size, addr));
                }
            }
        }
        self.reserved -= chunk.size;
        dropped.reserved += chunk.size;
    }

    /// Checks the arena's invariants; `Err` says which one broke. Blocks tile every chunk
    /// exactly, no two free blocks of a chunk touch, the free index lists exactly the free
    /// blocks, and the totals add up.
    #[cfg(test)]
    pub fn check(&self) -> Result<(), String> {
        let mut reserved = 0;
        let mut in_use = 0;
        let mut free_blocks = BTreeSet::new();
        for (&base, chunk) in &self.chunks {
            reserved += chunk.size;
            let mut at = base;
            let mut prev_free = false;
            for (&addr, block) in self.blocks.range(base..base + chunk.size) {
                if addr != at {
                    return Err(format!("chunk {base:#x}: gap or overlap at {at:#x} (next block {addr:#x})"));
                }
                if block.chunk != base || block.size == 0 || block.size % GRANULE != 0 || addr % GRANULE != 0 {
                    return Err(format!("block {addr:#x}: bad size {} or chunk {:#x}", block.size, block.chunk));
                }
                match block.live {
                    Some(l) => {
                        if l.requested > block.size {
                            return Err(format!("block {addr:#x}: {} requested in {} bytes", l.requested, block.size));
                        }
                        in_use += block.size;
                        prev_free = false;
                    }
                    None => {
                        if prev_free {
                            return Err(format!("block {addr:#x}: free next to a free block"));
                        }
                        free_blocks.insert((chunk.ctx, block.size, addr));
                        prev_free = true;
                    }
                }
                at = addr + block.size;
            }
            if at != base + chunk.size {
                return Err(format!("chunk {base:#x}: blocks end at {at:#x}, chunk at {:#x}", base + chunk.size));
            }
        }
        if self.blocks.len() != self.blocks.iter().filter(|(&a, _)| self.chunks.range(..=a).next_back().is_some_and(|(&b, c)| a < b + c.size)).count() {
            return Err("a block outside every chunk".into());
        }
        if free_blocks != self.free {
            return Err("the free index differs from the free blocks".into());
        }
        if reserved != self.reserved || in_use != self.in_use {
            return Err(format!("totals {}/{} != {reserved}/{in_use}", self.reserved, self.in_use));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_the_driver_hands_out_again_drop_the_stale_ones() {
        let mut a = Arena::new();
        a.add_chunk(1, 0x10, 0x100000, 0x4000);
        a.add_chunk(2, 0x20, 0x200000, 0x4000);
        let p = a.alloc(1, 0x1000, 0x1000).unwrap();
        // a new chunk of context 3 where context 1's was: context 1's memory is gone
        let stale = a.drop_overlapping(0x102000, 0x8000);
        assert_eq!(stale.reserved, 0x4000);
        assert_eq!(stale.live, vec![(p, 0x1000)]);
        a.add_chunk(3, 0x30, 0x102000, 0x8000);
        assert_eq!((a.reserved(), a.in_use()), (0xC000, 0));
        assert_eq!(a.drop_overlapping(0x300000, 0x1000).reserved, 0);
        assert_eq!(a.drop_context(1).reserved, 0, "already dropped");
        assert_eq!(a.drop_context(3).reserved, 0x8000);
        assert_eq!(a.drop_context(2).reserved, 0x4000);
        assert_eq!(a.reserved(), 0);
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn split_reuse_and_coalesce() {
        let mut a = Arena::new();
        a.add_chunk(1, 0, 0x10_0000, 2 * MIB);
        let p = a.alloc(1, 1024, 1000).unwrap();
        let q = a.alloc(1, 4096, 4096).unwrap();
        assert_eq!((p, q), (0x10_0000, 0x10_0400));
        assert_eq!(a.in_use(), 5120);
        assert_eq!(a.lookup(p + 999), Lookup::Live(Found { base: p, requested: 1000, buffer_id: match a.lookup(p) { Lookup::Live(f) => f.buffer_id, _ => 0 }, ctx_handle: 0 }));
        assert_eq!(a.lookup(p + 1000), Lookup::Inside, "rounding slack");
        assert_eq!(a.lookup(0x10_0000 + 2 * MIB), Lookup::Outside);
        assert_eq!(a.free(p + 16), None, "interior");
        assert_eq!(a.free(p).map(|f| f.size), Some(1024));
        assert_eq!(a.free(p), None, "double free");
        a.check().unwrap();
        // Best fit: the 1 KiB hole is reused before the tail.
        assert_eq!(a.alloc(1, 512, 512), Some(p));
        assert_eq!(a.alloc(1, 512, 512), Some(p + 512));
        a.free(p).unwrap();
        a.free(p + 512).unwrap();
        a.free(q).unwrap();
        a.check().unwrap();
        assert_eq!(a.blocks.len(), 1, "everything merged back into one block");
        assert_eq!(a.in_use(), 0);
        assert_eq!(a.reserved(), 2 * MIB);
    }

    #[test]
    fn contexts_and_chunks_stay_apart() {
        let mut a = Arena::new();
        // Two chunks adjacent in address space, then one of another context.
        a.add_chunk(1, 0, 0x100_0000, MIB);
        a.add_chunk(1, 0, 0x110_0000, MIB);
        a.add_chunk(2, 0, 0x200_0000, MIB);
        let x = a.alloc(1, MIB, MIB).unwrap();
        let y = a.alloc(1, MIB, MIB).unwrap();
        assert_eq!(a.alloc(1, 512, 512), None, "context 1 is full; context 2's chunk is not used");
        a.free(x).unwrap();
        a.free(y).unwrap();
        a.check().unwrap();
        assert_eq!(a.alloc(1, 2 * MIB, 2 * MIB), None, "never merged across chunks");
        let z = a.alloc(2, 512, 100).unwrap();
        let dropped = a.drop_context(2);
        assert_eq!(dropped, Dropped { reserved: MIB, live: vec![(z, 512)] });
        assert_eq!(a.lookup(z), Lookup::Outside);
        a.check().unwrap();
        assert_eq!((a.reserved(), a.in_use()), (2 * MIB, 0));
    }

    #[test]
    fn buffer_ids_differ_for_a_reused_address() {
        let mut a = Arena::new();
        a.add_chunk(7, 0, 0x4000_0000, MIB);
        let id = |a: &Arena, p| match a.lookup(p) {
            Lookup::Live(f) => f.buffer_id,
            other => panic!("{other:?}"),
        };
        let p = a.alloc(7, 512, 8).unwrap();
        let first = id(&a, p);
        a.free(p).unwrap();
        let p2 = a.alloc(7, 512, 8).unwrap();
        assert_eq!(p, p2);
        assert_ne!(first, id(&a, p2));
    }

    /// A randomised workload: every live range distinct and inside a chunk, the invariants
    /// checked after every step, and the totals exact.
    #[test]
    fn randomized_workload_keeps_invariants() {
        let mut a = Arena::new();
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let chunk_base = |i: u64| 0x7000_0000_0000 + i * 64 * MIB;
        a.add_chunk(1, 0, chunk_base(0), 16 * MIB);
        a.add_chunk(1, 0, chunk_base(1), 8 * MIB);
        let mut live: Vec<(u64, u64, u64)> = Vec::new(); // (addr, requested, size)
        let (mut ok, mut full) = (0, 0);
        for step in 0..5000 {
            if live.is_empty() || next() % 10 < 6 {
                let requested = 1 + (next() % (1 << (next() % 22)));
                let size = rounded(requested).unwrap();
                match a.alloc(1, size, requested) {
                    Some(p) => {
                        ok += 1;
                        assert_eq!(p % GRANULE, 0);
                        for &(q, _, qs) in &live {
                            assert!(p + size <= q || q + qs <= p, "step {step}: [{p:#x},+{size}) overlaps [{q:#x},+{qs})");
                        }
                        live.push((p, requested, size));
                    }
                    None => full += 1,
                }
            } else {
                let i = (next() % live.len() as u64) as usize;
                let (p, _, size) = live.swap_remove(i);
                assert_eq!(a.free(p).map(|f| f.size), Some(size));
            }
            a.check().unwrap_or_else(|e| panic!("step {step}: {e}"));
            assert_eq!(a.in_use(), live.iter().map(|l| l.2).sum::<u64>());
            for &(p, requested, _) in live.iter().take(4) {
                assert!(matches!(a.lookup(p + requested - 1), Lookup::Live(f) if f.base == p && f.requested == requested));
            }
        }
        assert!(ok > 1000 && full > 0, "{ok} served, {full} did not fit");
        for (p, _, _) in live.drain(..) {
            a.free(p).unwrap();
        }
        a.check().unwrap();
        assert_eq!(a.blocks.len(), 2, "one free block per chunk at the end");
    }
}
