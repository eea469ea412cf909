//! The allocation pair's fast lane: `cuMemAlloc_v2` and `cuMemFree_v2` in the commonest
//! configuration, without the general path's look-ups.
//!
//! **When it is open.** Once, at `cuInit`, if the program sees one device, not split, with
//! memory counted as the driver gives it (no reserve: `passthrough`), no placement log, no
//! shared quota, and the shim active. None of these changes afterwards (the quota is joined
//! before the state is published), so the lane never closes (a forked child keeps it: the
//! budgets and the live map it works on are the state's own, emptied there).
//!
//! **What it does.** Exactly what the general path does for that configuration (`State::counted`
//! and `State::uncounted` on device 0), on the same budget and live map: reserve, call the
//! driver, take or roll back; on free, forget, call the driver, credit or restore. Whatever it
//! does not handle it declines *before* any effect, and the hook then takes the general path:
//! a limit not yet resolved, a reservation refused (the general path retries after trimming
//! pools, and reports), a NULL out-pointer, a pointer whose bucket has keys in the mutex map,
//! figures not yet moved to the published file (never, once open: they move before).
//! The rare outcomes after an effect (an entry that does not fit the table, one the driver
//! freed behind the shim's back, a failed free, an entry of another kind) are handed to the
//! state's own functions. The lane never waits for a bucket another writer is inside: a free
//! declines (the general path waits, bounded by `bounded::WAIT_BOUND`, and refuses before the
//! driver's free if it gives up), an allocation hands its entry to the state's `record` (which
//! waits; if it gives up, the allocation goes back to the driver and is refused).
//!
//! **Why.** The general path costs ~360 instructions a pair (the hook's checks, the device
//! and its budget looked up, entries built and copied); the lane ~150 (callgrind: the
//! driver's own pointers kept in the lane, the budget's figures updated once where they are
//! published, the live map's table reached without the map). Its path has no allocation,
//! lock, system call or formatting, and no panic it can reach (the only indexing, of a
//! bucket's 10 slots, is by a slot number below 10); the state's functions it hands the rare
//! outcomes to run under `catch_unwind`, as hooks do.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicPtr, Ordering::*};


use crate::driver::ffi::{CUdeviceptr, CUresult, CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_UNKNOWN, CUDA_SUCCESS};
use crate::accounting::memory::{entry_id, DeviceBudget, Live, LiveMap, Packed, PtrTable};

/// What the lane works on: device 0's budget and the live map's table, and the state for the
/// rare outcomes. Made once, never freed.
pub struct Lane {
    state: &'static dyn General,
    budget: &'static DeviceBudget,
    table: PtrTable<'static>,
    /// The driver's own `cuMemAlloc_v2` and `cuMemFree_v2` (resolved before the lane opens;
    /// the driver is never unloaded).
    real_alloc: RealAlloc,
    real_free: RealFree,
}

type RealAlloc = unsafe extern "C" fn(*mut CUdeviceptr, usize) -> CUresult;
pub type RealFree = unsafe extern "C" fn(CUdeviceptr) -> CUresult;

/// The general path, for the lane's rare outcomes (the state implements it): what the lane
/// cannot do on its own, reached through one indirect call off the fast path.
pub trait General: Sync {
    /// Records the entry of device memory at `key` (the state's `record`).
    fn record(&self, key: u64, entry: Live) -> Result<(), gpushim_common::bounded::Stuck>;
    /// Credits an entry the driver freed behind the shim's back (its pointer handed out again).
    fn credit_stale(&self, entry: Live);
    /// The free of an entry already taken out of the map, by the general path, with the
    /// driver's own `cuMemFree_v2`.
    fn free_taken(&self, dptr: CUdeviceptr, entry: Live, real: RealFree) -> CUresult;
}

/// The open lane (null: closed).
static LANE: AtomicPtr<Lane> = AtomicPtr::new(std::ptr::null_mut());

/// Opens the lane on `budget` (device 0's) and `live` (the state checks its configuration:
/// see the module documentation), with the driver's own `cuMemAlloc_v2` and `cuMemFree_v2`
/// (`alloc`, `free`: 0 when not resolved). Once: whether this call opened it (not if the map
/// has no table of two buckets or more: the general path then keeps the pair).
pub fn open(state: &'static dyn General, budget: &'static DeviceBudget, live: &'static LiveMap, alloc: usize, free: usize) -> bool {
    if !LANE.load(Acquire).is_null() {
        return false;
    }
    let Some(table) = live.ptr_table() else { return false };
    if alloc == 0 || free == 0 {
        return false;
    }
    // SAFETY: the driver's own functions of these exact names, whose C signatures these are.
    let (real_alloc, real_free) = unsafe { (std::mem::transmute::<usize, RealAlloc>(alloc), std::mem::transmute::<usize, RealFree>(free)) };
    let lane = Box::into_raw(Box::new(Lane { state, budget, table, real_alloc, real_free }));
    if LANE.compare_exchange(std::ptr::null_mut(), lane, AcqRel, Acquire).is_err() {
        // SAFETY: `lane` came from Box::into_raw above and was never shared.
        drop(unsafe { Box::from_raw(lane) });
        return false;
    }
    true
}

#[inline(always)]
fn lane() -> Option<&'static Lane> {
    let p = LANE.load(Acquire);
    // SAFETY: a non-null lane was leaked by `open` and is never freed or changed.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// `cuMemAlloc_v2` through the lane; `None`: declined before any effect (take the general path).
///
/// # Safety
/// `dptr` is the program's out-pointer.
#[inline(always)]
pub unsafe fn alloc(dptr: *mut CUdeviceptr, bytes: usize) -> Option<CUresult> {
    let lane = lane()?;
    let real = lane.real_alloc;
    if dptr.is_null() {
        return None;
    }
    let budget = lane.budget;
    let bytes = bytes as u64;
    // (the figures stay where they are across the driver's call: `Moved`)
    let figures = budget.moved()?;
    if !figures.try_reserve_within(budget, bytes) {
        return None;
    }
    // SAFETY: the program's arguments, passed on unchanged.
    let result = unsafe { real(dptr, bytes as usize) };
    if result != CUDA_SUCCESS {
        figures.release(bytes);
        return Some(result);
    }
    figures.take(bytes);
    // SAFETY: the driver succeeded, so it wrote the pointer through the non-null `dptr`.
    let key = unsafe { *dptr };
    let id = entry_id();
    match Packed::of(&entry(bytes, id)).map(|p| lane.table.insert_packed(key, p)) {
        Some(Ok(None)) => {}
        Some(Ok(Some(stale))) => credit_stale(lane.state, stale),
        _ => return Some(record_new(lane, key, bytes, id)),
    }
    Some(CUDA_SUCCESS)
}

/// `cuMemFree_v2` through the lane; `None`: declined before any effect (take the general path).
///
/// # Safety
/// None beyond the driver's own.
#[inline(always)]
pub unsafe fn free(dptr: CUdeviceptr) -> Option<CUresult> {
    let lane = lane()?;
    let real = lane.real_free;
    let entry = match lane.table.remove_packed(dptr) {
        Ok(Some(entry)) => entry,
        // not recorded (nothing is served from a reserve here): the driver answers for it
        // SAFETY: the program's argument, passed on unchanged.
        Ok(None) => return Some(unsafe { real(dptr) }),
        Err(()) => return None,
    };
    if entry.served() || entry.pool() || entry.device() != 0 {
        return Some(free_other(lane.state, real, dptr, entry));
    }
    // SAFETY: the program's argument, passed on unchanged.
    let result = unsafe { real(dptr) };
    if result == CUDA_SUCCESS {
        match lane.budget.moved() {
            Some(figures) => figures.freed(entry.bytes()),
            None => lane.budget.freed(entry.bytes()),
        }
    } else {
        restore(lane.state, dptr, entry.bytes(), entry.id());
    }
    Some(result)
}

/// The entry of `bytes` of device memory counted on device 0 as the driver gave it.
#[inline(always)]
fn entry(bytes: u64, id: u64) -> Live {
    Live { device: 0, bytes, served: false, pool: false, ctx: 0, id }
}

/// Records an entry the table could not take here (the state's general `record`). (Its
/// fields passed rather than a `Live`, which would be built on the stack of the lane's frame.)
#[cold]
#[inline(never)]
fn record(state: &'static dyn General, key: u64, bytes: u64, id: u64) -> Result<(), gpushim_common::bounded::Stuck> {
    catch_unwind(AssertUnwindSafe(|| state.record(key, entry(bytes, id)))).unwrap_or(Ok(()))
}

/// Restores the entry of a free the driver refused (if even that gives up, its bytes stay
/// counted: closed).
#[cold]
#[inline(never)]
fn restore(state: &'static dyn General, key: u64, bytes: u64, id: u64) {
    if let Err(stuck) = record(state, key, bytes, id) {
        crate::platform::log::stuck("restoring the record of a free the driver refused (its bytes stay counted)", stuck);
    }
}

/// Records a new allocation the table could not take here; if even the state's `record` gives
/// up, the allocation goes back to the driver, uncounted, and is refused.
#[cold]
#[inline(never)]
fn record_new(lane: &Lane, key: u64, bytes: u64, id: u64) -> CUresult {
    let Err(stuck) = record(lane.state, key, bytes, id) else { return CUDA_SUCCESS };
    // SAFETY: the driver's own cuMemFree_v2 of the pointer it just allocated.
    unsafe { (lane.real_free)(key) };
    match lane.budget.moved() {
        Some(figures) => figures.freed(bytes),
        None => lane.budget.freed(bytes),
    }
    lane.budget.count_refusal();
    crate::platform::log::refuse("cuMemAlloc", stuck, CUDA_ERROR_OUT_OF_MEMORY)
}

/// Credits an entry the driver freed behind the shim's back (its pointer was handed out again).
#[cold]
#[inline(never)]
fn credit_stale(state: &'static dyn General, stale: Packed) {
    let _ = catch_unwind(AssertUnwindSafe(|| state.credit_stale(stale.live())));
}

/// The free of an entry the lane does not credit itself (served from a reserve, from a pool,
/// another device's): the state's general path for it, the entry already taken out.
#[cold]
#[inline(never)]
fn free_other(state: &'static dyn General, real: RealFree, dptr: CUdeviceptr, entry: Packed) -> CUresult {
    catch_unwind(AssertUnwindSafe(|| state.free_taken(dptr, entry.live(), real))).unwrap_or(CUDA_ERROR_UNKNOWN)
}
