//! The state's side of context teardown: crediting what the driver freed with a destroyed or reset context.


use std::ffi::{c_int, c_uint, c_void};
use gpushim_common::bounded::Stuck;
use crate::driver::ffi::*;
use crate::accounting::memory::{Kind, Live};

use crate::accounting::teardown::*;
use crate::state::State;

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

    pub(crate) fn credit_now(&self, device: usize, reserved: u64, in_use: u64) {
        let budget = self.budgets_of(device);
        // (held first: in use never passes what is reserved, even for a moment)
        budget.give(in_use);
        budget.release(reserved);
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

/// One teardown under way: ends (and applies the credits that waited only for it and older
/// ones) when dropped, so a teardown hook that unwinds still ends it.
pub struct Teardown<'a> {
    pub(crate) state: &'a State,
    pub(crate) number: u64,
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
