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

use std::ffi::{c_int, c_uint, c_void};

use gpushim_common::bounded::{Bounded, Stuck};

use crate::driver::ffi::*;
use crate::accounting::memory::{Kind, Live};
use crate::state::State;

/// `CU_POINTER_ATTRIBUTE_RANGE_START_ADDR`
const POINTER_ATTRIBUTE_RANGE_START_ADDR: c_int = 11;

/// Context teardowns under way, and the credits waiting for them (see the module
/// documentation).
pub struct Teardowns(Bounded<Pending>);

#[derive(Default)]
struct Pending {
    /// The number the next teardown gets.
    next: u64,
    /// The numbers of the teardowns under way.
    in_flight: Vec<u64>,
    /// Credits to apply once no teardown numbered below `.0` is under way:
    /// (that number, device, bytes reserved, bytes in use).
    credits: Vec<(u64, usize, u64, u64)>,
}

/// One teardown under way: ends (and applies the credits that waited only for it and older
/// ones) when dropped, so a teardown hook that unwinds still ends it.
pub struct Teardown<'a> {
    state: &'a State,
    number: u64,
}

impl Teardowns {
    pub const fn new() -> Self {
        Teardowns(Bounded::new("gpushim's list of context teardowns", Pending { next: 0, in_flight: Vec::new(), credits: Vec::new() }))
    }

    fn lock(&self) -> Result<gpushim_common::bounded::Guard<'_, Pending>, Stuck> {
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

impl Drop for Teardown<'_> {
    /// (If the lock cannot be had, the teardown stays "under way": later credits wait for ever,
    /// the bytes stay counted: closed. Only a thread stopped inside the lock for the whole
    /// bound can cause it: a signal handler that interrupted its holder cannot have started
    /// this teardown.)
    fn drop(&mut self) {
        let due: Vec<(u64, usize, u64, u64)> = {
            let Ok(mut p) = self.state.teardowns.lock() else { return };
            p.in_flight.retain(|&n| n != self.number);
            let oldest = p.in_flight.iter().copied().min().unwrap_or(u64::MAX);
            let (due, waiting) = std::mem::take(&mut p.credits).into_iter().partition(|c| c.0 <= oldest);
            p.credits = waiting;
            due
        };
        for (_, device, reserved, in_use) in due {
            self.state.credit_now(device, reserved, in_use);
        }
    }
}

/// The arrays a context takes with it when it is destroyed.
pub struct Doomed(Vec<(Kind, u64, Live)>);

impl State {
    /// Starts a teardown (before the driver's destroy, release or reset is called); it ends
    /// when the returned guard is dropped, after its own credits were made. `Err`: not
    /// started (the caller refuses its call before the driver's).
    pub fn teardown_begins(&self) -> Result<Teardown<'_>, Stuck> {
        let mut p = self.teardowns.lock()?;
        let number = p.next;
        p.next += 1;
        p.in_flight.push(number);
        Ok(Teardown { state: self, number })
    }

    /// Credits memory the driver freed without a free call (a torn-down context's, or one whose
    /// address the driver handed out again): at once if no teardown is under way, else once
    /// every teardown under way now has returned.
    pub fn credit_freed(&self, device: usize, reserved: u64, in_use: u64) {
        {
            let mut p = match self.teardowns.lock() {
                Ok(p) => p,
                Err(stuck) => return crate::platform::log::stuck("a credit of memory the driver freed (it stays counted)", stuck),
            };
            if !p.in_flight.is_empty() {
                let after = p.next;
                p.credits.push((after, device, reserved, in_use));
                return;
            }
        }
        self.credit_now(device, reserved, in_use);
    }

    fn credit_now(&self, device: usize, reserved: u64, in_use: u64) {
        let budget = self.budgets_of(device);
        budget.release(reserved);
        budget.give(in_use);
    }

    /// The current context's handle (0: none).
    pub(crate) fn current_context_handle(&self) -> usize {
        self.current_context().map_or(0, |c| c as usize)
    }

    /// The arrays of context `ctx` (before it is torn down; no driver call).
    pub fn context_allocations(&self, ctx: CUcontext) -> Doomed {
        if ctx.is_null() || !self.limits_apply() {
            return Doomed(Vec::new());
        }
        let of_ctx = |kind| self.live.entries(kind).into_iter().filter(|(_, l)| l.ctx == ctx as usize).map(move |(k, l)| (kind, k, l));
        Doomed(of_ctx(Kind::Array).chain(of_ctx(Kind::MipmappedArray)).collect())
    }

    /// The driver destroyed the context `doomed` was taken from: credits its arrays and every
    /// device allocation the driver no longer knows. An entry freed or replaced meanwhile
    /// (another thread) is left alone.
    pub fn credit_context(&self, doomed: Doomed) {
        if !self.limits_apply() {
            return;
        }
        let mut gone: Vec<(Kind, u64, Live)> = doomed.0;
        if let Some(get) = self.api().pointer_get_attribute {
            for (ptr, live) in self.live.entries(Kind::DevicePtr) {
                if live.served {
                    continue;
                }
                let mut start: CUdeviceptr = 0;
                // SAFETY: a valid out-pointer of the attribute's size (a CUdeviceptr); `ptr` is
                // an address the driver handed out (it answers an error if it is gone).
                let r = unsafe { get((&mut start as *mut CUdeviceptr).cast::<c_void>(), POINTER_ATTRIBUTE_RANGE_START_ADDR, ptr) };
                // (a pool allocation's range may be reported as its pool's: only "unknown
                // pointer" proves it gone; pools are the device's, not the context's)
                if r == CUDA_ERROR_INVALID_VALUE || (r == CUDA_SUCCESS && start != ptr && !live.pool) {
                    gone.push((Kind::DevicePtr, ptr, live));
                }
            }
        }
        let mut credited = 0u64;
        for (kind, key, live) in gone {
            // (an entry whose bucket or shard cannot be had stays counted: closed)
            if self.live.remove_if(kind, key, &live).is_ok_and(|r| r.is_some()) {
                self.credit_freed(live.device, live.bytes, live.bytes);
                credited = credited.saturating_add(live.bytes);
            }
        }
        if credited > 0 {
            crate::platform::log::log!(crate::platform::log::Level::Debug, "context destroyed: {credited} bytes the driver freed with it credited");
        }
    }

    /// The primary context of driver device `driver`, if it is active.
    pub fn active_primary(&self, driver: CUdevice) -> Option<CUcontext> {
        let api = self.api();
        let (state, retain, release) = (api.primary_ctx_get_state?, api.primary_ctx_retain?, api.primary_ctx_release?);
        let (mut flags, mut active): (c_uint, c_int) = (0, 0);
        // SAFETY: valid out-pointers.
        if unsafe { state(driver, &mut flags, &mut active) } != CUDA_SUCCESS || active == 0 {
            return None;
        }
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: the primary context is active: retaining and releasing it again only moves its
        // reference count up and back.
        if unsafe { retain(&mut ctx, driver) } != CUDA_SUCCESS {
            return None;
        }
        // SAFETY: releases the reference taken just above.
        unsafe { release(driver) };
        Some(ctx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Credits made while teardowns are under way wait for exactly those teardowns; later
    /// teardowns do not hold them back.
    #[test]
    fn credits_wait_for_the_teardowns_under_way() {
        let st = State::for_tests();
        let budget = st.budgets_of(3);
        budget.try_reserve(100, 1000).unwrap();
        budget.take(100);
        st.credit_freed(3, 10, 10); // nothing under way: at once
        assert_eq!((budget.reserved(), budget.in_use()), (90, 90));

        let a = st.teardown_begins().unwrap();
        st.credit_freed(3, 20, 5); // waits for a
        let b = st.teardown_begins().unwrap();
        st.credit_freed(3, 30, 0); // waits for a and b
        assert_eq!(budget.reserved(), 90);
        drop(a);
        assert_eq!((budget.reserved(), budget.in_use()), (70, 85), "the first credit waited for a only");
        let c = st.teardown_begins().unwrap();
        drop(b);
        assert_eq!(budget.reserved(), 40, "c began after the second credit: it does not hold it back");
        st.credit_freed(3, 40, 0);
        assert_eq!(budget.reserved(), 40);
        drop(c);
        assert_eq!(budget.reserved(), 0);
    }
}
