//! Memory that stream-ordered pools keep after a free.
//!
//! A pool (`cuMemAllocAsync`, `cuMemAllocFromPoolAsync`) does not give freed memory back to the
//! device at the free: it keeps it for its next allocations until a synchronisation releases
//! what it holds above its release threshold, `cuMemPoolTrimTo` trims it, or the pool is
//! destroyed. The shim credits a pool allocation's free only once the driver shows its pools
//! gave the memory back: until then the bytes stay reserved against the limit
//! ([`DeviceBudget::pool_kept`](crate::accounting::memory::DeviceBudget::pool_kept)), so a program cannot
//! hold more than its limit through a pool's cache (e.g. a release threshold of `UINT64_MAX`).
//!
//! The figures are asked of the driver only off the allocation path: when an allocation would
//! be refused (then the device's pools are first trimmed of what they do not use, and the
//! request is tried once more) and when the program reads its free memory (`cuMemGetInfo`).
//! What the pools keep is the sum over the device's pools — its default pool, its current pool
//! and the pools the program created on it — of reserved minus used memory; only up to what
//! was counted as kept is credited (the driver's own rounding is not counted, as elsewhere).

use std::ffi::c_int;


/// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`, `CU_MEMPOOL_ATTR_USED_MEM_CURRENT`.
pub(crate) const RESERVED_MEM_CURRENT: c_int = 5;
pub(crate) const USED_MEM_CURRENT: c_int = 7;

