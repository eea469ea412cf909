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

use std::ffi::{c_int, c_uint, c_void};

use crate::ffi::*;
use crate::memory::{Kind, Live};
use crate::state::State;

/// `CU_POINTER_ATTRIBUTE_RANGE_START_ADDR`
const POINTER_ATTRIBUTE_RANGE_START_ADDR: c_int = 11;

/// The arrays a context takes with it when it is destroyed.
pub struct Doomed(Vec<(Kind, u64, Live)>);

impl State {
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
            if self.live.remove_if(kind, key, &live).is_some() {
                let budget = self.budgets_of(live.device);
                budget.release(live.bytes);
                budget.give(live.bytes);
                credited = credited.saturating_add(live.bytes);
            }
        }
        if credited > 0 {
            crate::log::log!(crate::log::Level::Debug, "context destroyed: {credited} bytes the driver freed with it credited");
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
