//! The `grow` and `preallocate` memory modes (`GPUSHIM_MEMORY_MODE`): how allocations are
//! served from each device's reserve (`reserve`), when the reserve takes memory from the
//! driver, and what frees, pointer queries and context teardown do with it.
//!
//! | | `grow` | `preallocate` |
//! |---|---|---|
//! | reserve taken | lazily, in chunks, when nothing free fits | once per context: the whole limit, when the context is created (or at its first allocation) |
//! | chunk size for a request of r bytes | r ≤ 1 MiB: 2 MiB; r ≤ 10 MiB: 20 MiB; else r rounded up to 2 MiB — never more than the limit still allows | the limit minus what is already reserved |
//! | given back to the driver | never (only when the context is destroyed) | never (idem) |
//!
//! Served: `cuMemAlloc_v2` and `cuMemAllocPitch_v2` (what the CUDA runtime's `cudaMalloc`
//! and `cudaMallocPitch` use). Everything else passes through and is counted as in
//! `passthrough` (see the README for why).
//!
//! No lock is held across a call into the driver: a chunk is reserved in the budget, allocated
//! from the driver, and only then added to the arena under its lock. The arenas' locks are
//! bounded (`bounded`): a request whose arena cannot be had is refused before anything is
//! served; a chunk taken from the driver that cannot be added is given back to it; a free
//! whose block cannot be given back is refused, the block still held and counted.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use gpushim_common::bounded::{Bounded, Guard, Stuck};

use crate::accounting::memory::MAX_DEVICES;
use crate::accounting::reserve::{Arena, GRANULE};

pub(crate) const MIB: u64 = 1 << 20;

/// The reserves of every device, and which devices have one.
pub struct Reserves {
    /// One per device, on the heap, made at first use (only the `grow` and `preallocate`
    /// modes have reserves: start-up does not pay for 256 empty arenas).
    pub(crate) arenas: gpushim_common::once::ForkOnce<Box<[Bounded<Arena>]>>,
    /// Bit d % 64 of word d / 64: device d's arena has (or had) chunks.
    pub(crate) present: [AtomicU64; MAX_DEVICES / 64],
}

impl Reserves {
    pub fn new() -> Self {
        Reserves { arenas: gpushim_common::once::ForkOnce::new(), present: [const { AtomicU64::new(0) }; MAX_DEVICES / 64] }
    }

    fn arenas(&self) -> Result<&[Bounded<Arena>], Stuck> {
        self.arenas.try_get_or_init(|| (0..MAX_DEVICES).map(|_| Bounded::new("gpushim's reserve", Arena::new())).collect()).map(|a| &a[..])
    }

    /// Device `dev`'s arena, locked (bounded).
    pub(crate) fn arena(&self, dev: usize) -> Result<Guard<'_, Arena>, Stuck> {
        self.arenas()?[dev].lock()
    }

    /// Takes every device's reserve lock for a fork (`fork`). (Made now if not yet: another
    /// thread making them and taking a lock after a look that found none would leave the child
    /// a lock held forever.)
    pub fn hold_for_fork(&'static self) {
        for arena in self.arenas().unwrap_or_default() {
            crate::platform::fork::hold(arena);
        }
    }

    /// A forked child holds nothing (`fork`): no chunk is its own.
    pub fn reset_after_fork(&self) {
        for arena in self.arenas().unwrap_or_default() {
            arena.reset_after_fork(Arena::new());
        }
        for word in &self.present {
            word.store(0, Relaxed);
        }
    }

    /// Devices whose arena may hold chunks.
    pub(crate) fn devices(&self) -> impl Iterator<Item = usize> + '_ {
        let present: [u64; MAX_DEVICES / 64] = std::array::from_fn(|w| self.present[w].load(Relaxed));
        (0..MAX_DEVICES).filter(move |d| present[d / 64] & (1 << (d % 64)) != 0)
    }
}

/// The chunk `grow` takes for a block of `size` bytes when `headroom` bytes are left under the
/// limit; `None` if even the block does not fit.
pub fn grow_chunk(size: u64, headroom: u64) -> Option<u64> {
    let headroom = headroom & !(GRANULE - 1);
    if size > headroom {
        return None;
    }
    let wanted = match size {
        s if s <= MIB => 2 * MIB,
        s if s <= 10 * MIB => 20 * MIB,
        s => s.div_ceil(2 * MIB).saturating_mul(2 * MIB),
    };
    Some(wanted.min(headroom).max(size))
}


#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grow_chunks() {
        const GIB: u64 = 1 << 30;
        assert_eq!(grow_chunk(512, GIB), Some(2 * MIB));
        assert_eq!(grow_chunk(MIB, GIB), Some(2 * MIB));
        assert_eq!(grow_chunk(MIB + 512, GIB), Some(20 * MIB));
        assert_eq!(grow_chunk(10 * MIB, GIB), Some(20 * MIB));
        assert_eq!(grow_chunk(10 * MIB + 512, GIB), Some(12 * MIB));
        assert_eq!(grow_chunk(600 * MIB, GIB), Some(600 * MIB));
        // Capped by what the limit allows, never below the block.
        assert_eq!(grow_chunk(512, MIB + 100), Some(MIB));
        assert_eq!(grow_chunk(MIB, MIB), Some(MIB));
        assert_eq!(grow_chunk(MIB, MIB - 512), None);
        assert_eq!(grow_chunk(1024, 1000), None);
    }
}
