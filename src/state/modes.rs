//! The state's side of the grow and preallocate memory modes: serving allocations from a device's reserve, and giving chunks back.


use std::ffi::c_uint;
use std::sync::atomic::Ordering::Relaxed;
use gpushim_common::bounded::{Backoff, Guard, Stuck};
use gpushim_common::config::MemoryMode;
use crate::driver::ffi::*;
use crate::platform::log::{log, Level};
use crate::accounting::memory::{Kind, Live};
use crate::accounting::reserve::{self, Arena, Lookup, Preallocation, GRANULE};

use crate::accounting::modes::*;
use crate::state::{Mode, State};

impl State {
    /// Whether allocations are served from a reserve (`grow` or `preallocate`).
    #[inline]
    pub fn pooled(&self) -> bool {
        self.mode == Mode::Active && self.settings.memory_mode != MemoryMode::Passthrough
    }

    fn preallocating(&self) -> bool {
        self.mode == Mode::Active && self.settings.memory_mode == MemoryMode::Preallocate
    }

    /// The unique id of context `ctx` (`cuCtxGetId`, CUDA 12.0+; the handle itself on older
    /// drivers, which may reuse it after a destroy).
    pub fn context_id(&self, ctx: CUcontext) -> u64 {
        let mut id = 0u64;
        match self.api().ctx_get_id {
            // SAFETY: valid out-pointer; `ctx` is a context handle the program or driver gave.
            Some(f) if unsafe { f(ctx, &mut id) } == CUDA_SUCCESS => id,
            _ => ctx as u64,
        }
    }

    pub(crate) fn current_context(&self) -> Option<CUcontext> {
        let get = self.api().ctx_get_current?;
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        (unsafe { get(&mut ctx) } == CUDA_SUCCESS && !ctx.is_null()).then_some(ctx)
    }

    /// Runs `f` with `ctx` current on this thread (pushing and popping it if it is not).
    fn with_context<T>(&self, ctx: CUcontext, f: impl FnOnce() -> T) -> Option<T> {
        if self.current_context() == Some(ctx) {
            return Some(f());
        }
        let api = self.api();
        let (push, pop) = (api.ctx_push_current?, api.ctx_pop_current?);
        // SAFETY: `ctx` is a live context handle; it is popped again below on this thread.
        if unsafe { push(ctx) } != CUDA_SUCCESS {
            return None;
        }
        let value = f();
        let mut popped: CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer; pops what was pushed above.
        unsafe { pop(&mut popped) };
        Some(value)
    }

    /// Serves `requested` bytes on the current context's device from its reserve. `None`: not
    /// for the reserve (no current context, a device the shim does not account for): the
    /// caller passes the call to the driver. `Some(Err)`: refused.
    pub fn serve(&self, what: &'static str, requested: u64) -> Option<Result<CUdeviceptr, CUresult>> {
        let ctx = self.current_context()?;
        let dev = self.current_device()?;
        let budget = self.budget(dev)?;
        let limit = self.limit(dev)?;
        let Some(size) = reserve::rounded(requested) else {
            self.report_refusal(what, dev, requested);
            return Some(Err(CUDA_ERROR_OUT_OF_MEMORY));
        };
        let index = dev as usize;
        let id = self.context_id(ctx);
        if self.preallocating() {
            self.preallocate(dev, ctx, id);
        }
        let served = match self.reserves.arena(index) {
            Ok(mut arena) => arena.alloc(id, size, requested),
            Err(stuck) => {
                budget.count_refusal();
                return Some(Err(crate::platform::log::refuse(what, stuck, CUDA_ERROR_OUT_OF_MEMORY)));
            }
        };
        let ptr = match served {
            Some(p) => p,
            None if self.preallocating() => {
                self.report_refusal(what, dev, requested);
                return Some(Err(CUDA_ERROR_OUT_OF_MEMORY));
            }
            None => match self.grow(dev, ctx, id, size, requested, limit) {
                Ok(p) => p,
                Err(e) => {
                    if e == CUDA_ERROR_OUT_OF_MEMORY {
                        self.report_refusal(what, dev, requested);
                    }
                    return Some(Err(e));
                }
            },
        };
        // (recorded before it counts as in use: nobody else has the pointer yet)
        if let Err(stuck) = self.live.insert(Kind::DevicePtr, ptr, Live { device: index, bytes: size, served: true, pool: false, ctx: 0, id: crate::accounting::memory::entry_id() }) {
            // back to the reserve (the lock was had a moment ago: it is not this thread's)
            if let Ok(mut arena) = self.reserves.arena(index) {
                arena.free(ptr);
            }
            budget.count_refusal();
            return Some(Err(crate::platform::log::refuse(what, stuck, CUDA_ERROR_OUT_OF_MEMORY)));
        }
        budget.take(size);
        self.place_allocation(what, Some(dev), requested, None);
        Some(Ok(ptr))
    }

    /// Takes a chunk from the driver for a `size`-byte block (see [`grow_chunk`]) and carves the
    /// block from it. If the driver has less than the chunk, tries the block alone.
    fn grow(&self, dev: CUdevice, ctx: CUcontext, id: u64, size: u64, requested: u64, limit: u64) -> Result<u64, CUresult> {
        let budget = self.budget(dev).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        if budget.pool_kept() > 0 {
            // What stream-ordered pools keep after frees counts until they give it back
            // (`pools`): settle it before sizing the chunk (taking a chunk is rare), and make
            // the pools give back what they do not use if the block would not fit otherwise.
            if limit.saturating_sub(budget.held()) < size {
                self.trim_pools(dev);
            } else {
                self.reconcile_pools(dev);
            }
        }
        // (no room even for the block: it alone is tried, and refused, or waits for room in a
        // full shared quota)
        let chunk = grow_chunk(size, limit.saturating_sub(budget.held())).unwrap_or(size);
        let mut last = CUDA_ERROR_OUT_OF_MEMORY;
        let tries = if chunk > size { 2 } else { 1 };
        for (n, bytes) in [chunk, size].into_iter().take(tries).enumerate() {
            // (the last try, the block alone, may wait for room in a shared quota)
            match self.take_chunk(dev, ctx, id, bytes, limit, n + 1 == tries) {
                // Carved under the lock the chunk was added with: no other thread takes it first.
                Ok(mut arena) => return arena.alloc(id, size, requested).ok_or(CUDA_ERROR_OUT_OF_MEMORY),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Reserves `bytes` in the budget, allocates them from the driver in context `ctx` (current),
    /// and adds them to the arena as a chunk; returns the arena, still locked. If the arena
    /// cannot be had, the chunk goes back to the driver and the reservation with it.
    /// With `wait`, a reservation a full shared quota refuses waits for room (`oom_wait`).
    fn take_chunk(&self, dev: CUdevice, ctx: CUcontext, id: u64, bytes: u64, limit: u64, wait: bool) -> Result<Guard<'_, Arena>, CUresult> {
        let budget = self.budget(dev).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        let alloc = self.api().mem_alloc.ok_or(CUDA_ERROR_NOT_INITIALIZED)?;
        if budget.try_reserve(bytes, limit).is_err() && !(wait && self.wait_for_room("a reserve's chunk", dev, bytes, limit)) {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: valid out-pointer; the driver's own cuMemAlloc_v2.
        let result = unsafe { alloc(&mut ptr, bytes as usize) };
        if result != CUDA_SUCCESS {
            budget.release(bytes);
            return Err(result);
        }
        // The driver aligns to at least 256 bytes (in practice 512 or more); if a chunk were
        // less aligned than the granule, its first bytes are left unused (and stay counted).
        let base = ptr.next_multiple_of(GRANULE);
        let usable = (bytes - (base - ptr)) & !(GRANULE - 1);
        let mut arena = match self.reserves.arena(dev as usize) {
            Ok(arena) => arena,
            Err(stuck) => {
                crate::state::free_driver_ptr(ptr);
                budget.release(bytes);
                return Err(crate::platform::log::refuse("a reserve's chunk", stuck, CUDA_ERROR_OUT_OF_MEMORY));
            }
        };
        // Memory of a destroyed context the shim has not yet forgotten (another thread is between
        // the driver's destroy and `forget_context_reserve`): the driver handing it out again
        // proves it is gone.
        let stale = arena.drop_overlapping(base, usable);
        if stale.reserved > 0 {
            self.credit_dropped(dev as usize, &stale);
        }
        arena.add_chunk(id, ctx as usize, base, usable);
        let d = dev as usize;
        self.reserves.present[d / 64].fetch_or(1 << (d % 64), Relaxed);
        log!(
            Level::Debug,
            "device {dev}: reserve took {bytes} bytes from the driver ({} reserved, {} in use, limit {limit})",
            budget.reserved(),
            budget.in_use()
        );
        Ok(arena)
    }

    /// `preallocate`: takes the whole limit (what is left of it) for context `ctx` on `dev`,
    /// once per context. A thread that finds another one doing it waits for it.
    fn preallocate(&self, dev: CUdevice, ctx: CUcontext, id: u64) {
        let index = dev as usize;
        // The claim is read into a local first: a guard kept alive across the `match` (as a
        // temporary of its scrutinee) would still be held in the `Pending` arm, which locks
        // the same arena again while waiting: a deadlock for any two threads meeting here.
        // (a claim that cannot be made leaves the request to the reserve as it is: `serve`)
        let Ok(claim) = self.reserves.arena(index).map(|mut a| a.claim_preallocation(id)) else { return };
        match claim {
            Preallocation::Done => return,
            Preallocation::Pending => {
                // (bounded: a claimer that never finishes, e.g. this thread interrupted by a
                // signal handler, is waited for `bounded::WAIT_BOUND` at most)
                let mut backoff = Backoff::new();
                while self.reserves.arena(index).is_ok_and(|a| !a.preallocation_done(id)) && backoff.wait() {}
                return;
            }
            Preallocation::Claimed => {}
        }
        let (Some(budget), Some(limit)) = (self.budget(dev), self.limit(dev)) else {
            self.finish_preallocation(index, id);
            return;
        };
        let wanted = limit.saturating_sub(budget.held()) & !(GRANULE - 1);
        let mut taken = None;
        if wanted > 0 {
            taken = self.take_chunk(dev, ctx, id, wanted, limit, false).ok().map(|_| wanted);
            if taken.is_none() {
                // The device has less free than the limit: take what it has, in 2 MiB pages.
                let free = self.driver_free().unwrap_or(0) & !(2 * MIB - 1);
                let smaller = wanted.min(free);
                if smaller > 0 {
                    taken = self.take_chunk(dev, ctx, id, smaller, limit, false).ok().map(|_| smaller);
                }
                log!(
                    Level::Warn,
                    "device {dev}: preallocate could not take the whole limit ({wanted} bytes); reserved {} bytes",
                    taken.unwrap_or(0)
                );
            }
        }
        if let Some(bytes) = taken {
            log!(Level::Info, "device {dev}: preallocated {bytes} bytes (limit {limit} bytes)");
        }
        self.finish_preallocation(index, id);
    }

    /// Marks context `id`'s preallocation done (if its arena cannot be had, the others waiting
    /// for it give up after the bound).
    fn finish_preallocation(&self, index: usize, id: u64) {
        match self.reserves.arena(index) {
            Ok(mut arena) => arena.finish_preallocation(id),
            Err(stuck) => crate::platform::log::stuck("the end of a preallocation", stuck),
        }
    }

    /// `preallocate` at context creation: `ctx` was just created (or retained) on `dev`.
    pub fn context_created(&self, dev: CUdevice, ctx: CUcontext) {
        if !self.preallocating() || ctx.is_null() || self.budget(dev).is_none() {
            return;
        }
        let id = self.context_id(ctx);
        self.with_context(ctx, || self.preallocate(dev, ctx, id));
    }

    /// What the driver reports free on the current context's device.
    fn driver_free(&self) -> Option<u64> {
        let f = self.api().mem_get_info?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers.
        (unsafe { f(&mut free, &mut total) } == CUDA_SUCCESS).then_some(free as u64)
    }

    /// Gives a served allocation back to its reserve. The context (or, for `cuMemFreeAsync`,
    /// the stream) is synchronised first, as the driver's free may do: the block can be handed
    /// out again at once, so no earlier work may still use it. If synchronising fails, the
    /// block is not given back: it stays held (and counted) until a later free succeeds or its
    /// context is destroyed.
    ///
    /// If the arena cannot be had (`bounded`), the free is refused (`CUDA_ERROR_NOT_PERMITTED`)
    /// and the block stays the program's, recorded and counted, as before the call.
    pub fn release_served(&self, ptr: CUdeviceptr, live: Live, stream: Option<CUstream>) -> CUresult {
        let found = match self.reserves.arena(live.device).map(|a| a.lookup(ptr)) {
            Ok(Lookup::Live(f)) => f,
            Ok(_) => return CUDA_ERROR_INVALID_VALUE,
            Err(stuck) => return self.refuse_served_free(ptr, live, stuck),
        };
        let api = self.api();
        let synced = match (stream, api.stream_synchronize, api.ctx_synchronize) {
            // SAFETY: the program's own stream handle, passed on as given.
            (Some(s), Some(sync), _) => unsafe { sync(s) },
            // SAFETY: no arguments; synchronises the context made current around it.
            (None, _, Some(sync)) => self.with_context(found.ctx_handle as CUcontext, || unsafe { sync() }).unwrap_or(CUDA_SUCCESS),
            _ => CUDA_SUCCESS,
        };
        if synced != CUDA_SUCCESS {
            // Earlier work on the block may still be running (or failed): it must not be
            // handed out again. It stays the program's (and counted) until a later free
            // synchronises successfully or the context is destroyed; the error of that earlier
            // asynchronous work is reported, as the driver's free would.
            self.keep_served(ptr, live);
            log!(Level::Debug, "free of {ptr:#x}: synchronising failed ({synced}); the block stays held");
            return synced;
        }
        // Given back while the arena's lock is still held: once the block can be carved again,
        // it no longer counts as in use (in use never passes what is reserved, even for a moment).
        let budget = self.budgets_of(live.device);
        let freed = self.reserves.arena(live.device).map(|mut a| a.free(ptr).map(|f| budget.give(f.size)));
        if let Err(stuck) = freed {
            return self.refuse_served_free(ptr, live, stuck);
        }
        CUDA_SUCCESS
    }

    /// A served block whose free is not done stays the program's: its entry back in the live
    /// map (whose bucket was had a moment ago; if not now, the entry is lost and the block stays
    /// counted until its context goes: closed).
    fn keep_served(&self, ptr: CUdeviceptr, live: Live) {
        if let Err(stuck) = self.live.insert(Kind::DevicePtr, ptr, live) {
            crate::platform::log::stuck("restoring a block's record (it stays counted)", stuck);
        }
    }

    #[cold]
    fn refuse_served_free(&self, ptr: CUdeviceptr, live: Live, stuck: Stuck) -> CUresult {
        self.keep_served(ptr, live);
        crate::platform::log::refuse("cuMemFree", stuck, CUDA_ERROR_NOT_PERMITTED)
    }

    /// A free of `ptr` the live map does not know: inside a reserve it is an interior pointer or
    /// a double free (refused here: the driver would free a whole chunk); `None`: not ours.
    /// When the reserves cannot be looked at (`bounded`) it is refused too, for the same reason.
    pub fn refuse_unknown_free(&self, ptr: CUdeviceptr) -> Option<CUresult> {
        if !self.pooled() || ptr == 0 {
            return None;
        }
        match self.reserve_lookup(ptr) {
            Ok(found) => match found?.1 {
                Lookup::Outside => None,
                _ => Some(CUDA_ERROR_INVALID_VALUE),
            },
            Err(stuck) => Some(crate::platform::log::refuse("cuMemFree", stuck, CUDA_ERROR_NOT_PERMITTED)),
        }
    }

    /// Where `ptr` lies among the reserves: (device, lookup); `None` when nothing is pooled;
    /// `Err` when a reserve that may hold it cannot be had.
    pub fn reserve_lookup(&self, ptr: CUdeviceptr) -> Result<Option<(usize, Lookup)>, Stuck> {
        if !self.pooled() {
            return Ok(None);
        }
        for dev in self.reserves.devices() {
            match self.reserves.arena(dev)?.lookup(ptr) {
                Lookup::Outside => continue,
                found => return Ok(Some((dev, found))),
            }
        }
        Ok(Some((0, Lookup::Outside)))
    }

    /// Context `id` was destroyed (the driver freed its memory): forgets its chunks, credits
    /// the budgets, and drops the live entries of what the program still held in them.
    pub fn forget_context_reserve(&self, id: u64) {
        if !self.pooled() {
            return;
        }
        for dev in self.reserves.devices() {
            // (a reserve that cannot be had keeps the context's chunks, counted: closed; they are
            // never served again, their context's id being gone, and a driver that hands their
            // addresses out again credits them, `take_chunk`)
            let mut arena = match self.reserves.arena(dev) {
                Ok(arena) => arena,
                Err(stuck) => {
                    crate::platform::log::stuck("forgetting a destroyed context's reserve (it stays counted)", stuck);
                    continue;
                }
            };
            let dropped = arena.drop_context(id);
            if dropped.reserved == 0 && dropped.live.is_empty() {
                continue;
            }
            // (under the arena's lock: no chunk can be added at these addresses, and no block of
            // one served, before their live entries are gone)
            self.credit_dropped(dev, &dropped);
            drop(arena);
            log!(Level::Debug, "device {dev}: context destroyed; its {} reserved bytes are gone", dropped.reserved);
        }
    }

    /// Credits chunks the driver freed and forgets what the program held in them. Called with
    /// the device's arena locked (the live map's locks are never held while taking it).
    fn credit_dropped(&self, dev: usize, dropped: &crate::accounting::reserve::Dropped) {
        let mut in_use = 0u64;
        for (ptr, size) in &dropped.live {
            // (an entry whose bucket cannot be had stays: a free of it then finds no block,
            // `CUDA_ERROR_INVALID_VALUE`, as for any block of a destroyed context)
            if self.live.get(Kind::DevicePtr, *ptr).is_ok_and(|l| l.is_some_and(|l| l.served)) {
                let _ = self.live.remove(Kind::DevicePtr, *ptr);
            }
            in_use = in_use.saturating_add(*size);
        }
        // (waits for the teardowns under way: the driver may still hold the chunks, `teardown`)
        self.credit_freed(dev, dropped.reserved, in_use);
    }

    /// Whether the primary context of driver device `driver` is still active.
    pub fn primary_active(&self, driver: CUdevice) -> bool {
        let Some(state) = self.api().primary_ctx_get_state else { return true };
        let (mut flags, mut active): (c_uint, std::ffi::c_int) = (0, 0);
        // SAFETY: valid out-pointers.
        (unsafe { state(driver, &mut flags, &mut active) }) != CUDA_SUCCESS || active != 0
    }

    /// In `preallocate` mode, says once per process why a stream-ordered or VMM allocation
    /// (`what`, refused out of memory) got nothing: they are not served from the reserve.
    pub fn explain_unserved_refusal(&self, what: &str) {
        static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if !self.preallocating() || SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        log!(
            Level::Warn,
            "{what} refused: GPUSHIM_MEMORY_MODE=preallocate reserved the whole limit for cuMemAlloc/cudaMalloc-style allocations, and stream-ordered pools (cuMemAllocAsync, cuMemAllocFromPoolAsync) and virtual memory (cuMemCreate) are not served from that reserve; use GPUSHIM_MEMORY_MODE=grow for programs using them (PyTorch backend:cudaMallocAsync or expandable_segments, CuPy MemoryAsyncPool)"
        );
    }
}
