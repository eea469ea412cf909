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
use gpushim_common::oom_wait::{End as WaitEnd, Waited};
use gpushim_common::quota::Quota;

pub use crate::devices::MAX_DEVICES;

mod budget;
mod live;
mod table;
mod zeroed;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod live_map_tests;

pub use budget::*;
pub use live::*;
pub use table::*;
pub use zeroed::*;
