//! Context teardown: what the driver frees with a context (`cuCtxDestroy`, the last
//! `cuDevicePrimaryCtxRelease`, `cuDevicePrimaryCtxReset`, so `cudaDeviceReset`).
//!
//! The driver frees a context's device memory, managed memory and arrays with it, without the
//! program freeing each. The shim must then stop counting them, or a program that resets its
//! device could never allocate again. After a teardown that destroyed a context, the shim asks
//! the driver about every live device allocation it counts (`cuPointerGetAttribute` of
//! `RANGE_START_ADDR`): one the driver no longer knows (`CUDA_ERROR_INVALID_VALUE`, or an
//! address now inside another allocation) was freed with the context and is credited; any other
//! answer, an error included, leaves it counted (fail closed). Arrays remember the context they
//! were created in and are credited when it goes. Memory served from a reserve is the reserve's
//! (`modes::forget_context_reserve`).
//!
//! The teardown hooks are handed out whenever limits apply (`limit` in the hook table): they
//! are not on the allocation path, and a release that does not destroy the context costs one
//! state query. No lock is held across a driver call: the live map is copied first, then the
//! driver is asked about each entry.
//!
//! **Credits wait for the teardowns in flight.** A driver may make a torn-down context's
//! addresses reusable before it has given back all of its memory (the simulated driver does:
//! it unmaps an allocation before it stops counting it), so another thread can be handed the
//! same address while the old memory is still held. The shim takes such a reuse as proof that
//! the old entry is gone (`State::credit_stale`, a stale reserve chunk in `modes`), and the
//! teardown itself credits what it freed; either credit made while a teardown is under way is
//! applied only once every teardown that was in flight at that moment has returned
//! ([`Teardowns`]). Until then the bytes stay counted: the limit errs towards refusing.
//!
//! The lock of the teardowns is bounded (`bounded`): a teardown that cannot start is refused
//! before the driver is called (`CUDA_ERROR_NOT_PERMITTED`, `stuck`); a credit that cannot be
//! queued is not made (the bytes stay counted: closed), with one line.

use std::ffi::c_int;

use gpushim_common::bounded::{Bounded, Stuck};

use crate::accounting::memory::{Kind, Live};

/// `CU_POINTER_ATTRIBUTE_RANGE_START_ADDR`
pub(crate) const POINTER_ATTRIBUTE_RANGE_START_ADDR: c_int = 11;

/// Context teardowns under way, and the credits waiting for them (see the module
/// documentation).
pub struct Teardowns(Bounded<Pending>);

#[derive(Default)]
pub(crate) struct Pending {
    /// The number the next teardown gets.
    pub(crate) next: u64,
    /// The numbers of the teardowns under way.
    pub(crate) in_flight: Vec<u64>,
    /// Credits to apply once no teardown numbered below `.0` is under way:
    /// (that number, device, bytes reserved, bytes in use).
    pub(crate) credits: Vec<(u64, usize, u64, u64)>,
}

impl Teardowns {
    pub const fn new() -> Self {
        Teardowns(Bounded::new("gpushim's list of context teardowns", Pending { next: 0, in_flight: Vec::new(), credits: Vec::new() }))
    }

    pub(crate) fn lock(&self) -> Result<gpushim_common::bounded::Guard<'_, Pending>, Stuck> {
        self.0.lock()
    }

    /// Takes the lock for a fork (`fork`).
    pub fn hold_for_fork(&'static self) {
        crate::platform::fork::hold(&self.0);
    }

    /// A forked child has no teardown under way and nothing to credit.
    pub fn reset_after_fork(&self) {
        self.0.reset_after_fork(Pending::default());
    }
}

/// The arrays a context takes with it when it is destroyed.
pub struct Doomed(pub(crate) Vec<(Kind, u64, Live)>);
