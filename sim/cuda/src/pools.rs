//! Stream-ordered allocation and memory pools.
//!
//! As on the real driver, a pool keeps the memory of what is freed into it (`cuMemFreeAsync` or
//! plain `cuMemFree` of a pool allocation): it stays resident on the device (counted in the
//! device's `used`) and is reused by the pool's next allocations, until a synchronisation
//! (`cuStreamSynchronize`, `cuCtxSynchronize`, `cuEventSynchronize`) releases what the pool
//! holds above its release threshold (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`, default 0),
//! `cuMemPoolTrimTo` releases down to its argument, or the pool is destroyed. The pool's
//! reserved memory (`RESERVED_MEM_CURRENT`) is what it hands out plus what it keeps; frees are
//! complete when called (nothing here is asynchronous).

use crate::context::{self, Ctx};
use crate::devices::{self, phys_of};
use crate::memory::{self, Kind};
use crate::streams;
use crate::types::*;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, RwLock};

pub struct Pool {
    pub ordinal: CUdevice,
    pub physical: usize,
    pub is_default: bool,
    used: AtomicU64,
    /// Freed into the pool and kept: resident on the device, reusable.
    cached: AtomicU64,
    /// Serialises giving kept memory back (`trim`, `reuse`): the device stops counting it
    /// first, and only then does `cached` (so `RESERVED_MEM_CURRENT`) drop — the pool's figures
    /// never show memory as given back while the device still holds it.
    giving_back: Mutex<()>,
    high: AtomicU64,
    /// `CUmemPool_attribute` 1..=4: three reuse flags (int) and the release threshold.
    attrs: Mutex<[u64; 5]>,
}

static LIVE: OnceLock<RwLock<HashSet<usize>>> = OnceLock::new();

struct DevicePools {
    defaults: Vec<&'static Pool>,
    current: Vec<AtomicUsize>,
}
static DEVICE_POOLS: OnceLock<DevicePools> = OnceLock::new();

fn live() -> &'static RwLock<HashSet<usize>> {
    LIVE.get_or_init(|| RwLock::new(HashSet::new()))
}

fn new_pool(ordinal: CUdevice, physical: usize, is_default: bool) -> &'static Pool {
    let p: &'static Pool = Box::leak(Box::new(Pool {
        ordinal,
        physical,
        is_default,
        used: AtomicU64::new(0),
        cached: AtomicU64::new(0),
        giving_back: Mutex::new(()),
        high: AtomicU64::new(0),
        attrs: Mutex::new([0, 1, 1, 1, 0]),
    }));
    live()
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .insert(p.handle() as usize);
    p
}

impl Pool {
    pub fn handle(&'static self) -> CUmemoryPool {
        self as *const Pool as CUmemoryPool
    }
}

fn device_pools() -> Res<&'static DevicePools> {
    let vis = devices::visible()?;
    Ok(DEVICE_POOLS.get_or_init(|| {
        let defaults: Vec<&'static Pool> = vis
            .iter()
            .enumerate()
            .map(|(o, &p)| new_pool(o as CUdevice, p, true))
            .collect();
        let current = defaults
            .iter()
            .map(|p| AtomicUsize::new(p.handle() as usize))
            .collect();
        DevicePools { defaults, current }
    }))
}

fn from_handle(h: CUmemoryPool) -> Res<&'static Pool> {
    devices::visible()?;
    if h.is_null()
        || !live()
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&(h as usize))
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(unsafe { &*(h as *const Pool) })
}

/// Called by `memory::free` when a pool allocation goes away: the pool keeps its bytes.
pub fn released(pool: usize, size: u64) {
    if pool != 0 {
        // SAFETY: pools are leaked, never freed; `pool` was a live pool when allocated from.
        let p = unsafe { &*(pool as *const Pool) };
        // kept first, then no longer used: reserved (used + kept) never dips meanwhile
        p.cached.fetch_add(size, Ordering::AcqRel);
        let _ = p
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |u| {
                Some(u.saturating_sub(size))
            });
    }
}

impl Pool {
    /// Gives back to the device what the pool keeps beyond `keep` bytes of reserved memory
    /// (reserved = used + kept).
    fn trim(&self, keep: u64) {
        let _g = self.giving_back.lock().unwrap_or_else(|e| e.into_inner());
        let target = keep.saturating_sub(self.used.load(Ordering::Acquire));
        let kept = self.cached.load(Ordering::Acquire);
        if kept > target {
            // (only `released` changes `cached` meanwhile, and only upwards)
            crate::stats::release_bytes(self.physical, kept - target);
            self.cached.fetch_sub(kept - target, Ordering::AcqRel);
        }
    }

    /// Takes up to `size` kept bytes for a new allocation: they leave the device's count here
    /// and are counted again by the allocation (reused memory, not more).
    fn reuse(&self, size: u64) -> u64 {
        let _g = self.giving_back.lock().unwrap_or_else(|e| e.into_inner());
        let taken = self.cached.load(Ordering::Acquire).min(size);
        if taken > 0 {
            crate::stats::release_bytes(self.physical, taken);
            self.cached.fetch_sub(taken, Ordering::AcqRel);
        }
        taken
    }

    fn threshold(&self) -> u64 {
        self.attrs.lock().unwrap_or_else(|e| e.into_inner())[4]
    }
}

/// A synchronisation point: every pool gives back what it keeps above its release threshold.
pub fn synchronised() {
    let pools: Vec<usize> = live().read().unwrap_or_else(|e| e.into_inner()).iter().copied().collect();
    for h in pools {
        // SAFETY: pools are leaked, never freed.
        let p = unsafe { &*(h as *const Pool) };
        p.trim(p.threshold());
    }
}

unsafe fn alloc_from(
    pool: &'static Pool,
    ctx: &'static Ctx,
    dptr: *mut CUdeviceptr,
    size: usize,
) -> Res {
    if dptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // The memory lands on the pool's device; record it against a context of that device.
    let ctx = if ctx.physical == pool.physical {
        ctx
    } else {
        context::primary(pool.ordinal)?.ctx
    };
    pool.reuse(size as u64);
    let p = memory::alloc(
        size,
        Some(ctx),
        Kind::Pool,
        pool as *const Pool as usize,
        false,
    )?;
    let now = pool.used.fetch_add(size as u64, Ordering::AcqRel) + size as u64;
    pool.high.fetch_max(now, Ordering::AcqRel);
    put(dptr, p as CUdeviceptr)
}

unsafe fn alloc_async(dptr: *mut CUdeviceptr, size: usize, s: CUstream) -> Res {
    let ctx = streams::ctx_of(s)?;
    if let Some(g) = crate::graphs::capturing(s) {
        if dptr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        return put(dptr, crate::graphs::capture_alloc(g, ctx.ordinal, size)?);
    }
    let dp = device_pools()?;
    let cur = dp.current[ctx.ordinal as usize].load(Ordering::Acquire);
    let pool = from_handle(cur as CUmemoryPool)?;
    alloc_from(pool, ctx, dptr, size)
}

unsafe fn alloc_from_pool(
    dptr: *mut CUdeviceptr,
    size: usize,
    h: CUmemoryPool,
    s: CUstream,
) -> Res {
    let ctx = streams::ctx_of(s)?;
    let pool = from_handle(h)?;
    if let Some(g) = crate::graphs::capturing(s) {
        if dptr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        return put(dptr, crate::graphs::capture_alloc(g, pool.ordinal, size)?);
    }
    alloc_from(pool, ctx, dptr, size)
}

fn free_async(dptr: CUdeviceptr, s: CUstream) -> Res {
    streams::lookup(s)?;
    if let Some(g) = crate::graphs::capturing(s) {
        return crate::graphs::capture_free(g, dptr);
    }
    memory::free(dptr as usize, memory::is_device_kind).map(|_| ())
}

cu_api! {
    fn cuMemAllocAsync(dptr: *mut CUdeviceptr, size: usize, s: CUstream) { alloc_async(dptr, size, s) }
    fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, size: usize, s: CUstream) { alloc_async(dptr, size, s) }
    fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, size: usize, pool: CUmemoryPool, s: CUstream) {
        alloc_from_pool(dptr, size, pool, s)
    }
    fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, size: usize, pool: CUmemoryPool, s: CUstream) {
        alloc_from_pool(dptr, size, pool, s)
    }
    fn cuMemFreeAsync(dptr: CUdeviceptr, s: CUstream) { free_async(dptr, s) }
    fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, s: CUstream) { free_async(dptr, s) }

    /// Device pools only (`allocType` 1 = pinned, `location.type` 1 = device); host pools are
    /// CUDA_ERROR_NOT_SUPPORTED.
    fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const CUmemPoolProps) {
        devices::visible()?;
        let pr = get(props)?;
        if pool.is_null() || pr.alloc_type != 1 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if pr.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        let ph = phys_of(pr.location.id).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        let p = new_pool(pr.location.id, ph.index, false);
        put(pool, p.handle())
    }

    /// Outstanding allocations stay valid and counted until freed, as on the real driver.
    fn cuMemPoolDestroy(pool: CUmemoryPool) {
        let p = from_handle(pool)?;
        if p.is_default {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        live().write().unwrap_or_else(|e| e.into_inner()).remove(&(pool as usize));
        p.trim(0);
        let dp = device_pools()?;
        let _ = dp.current[p.ordinal as usize].compare_exchange(
            pool as usize,
            dp.defaults[p.ordinal as usize].handle() as usize,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        Ok(())
    }

    fn cuMemPoolTrimTo(pool: CUmemoryPool, min_bytes: usize) {
        from_handle(pool)?.trim(min_bytes as u64);
        Ok(())
    }

    fn cuMemPoolSetAttribute(pool: CUmemoryPool, attr: i32, value: *mut std::ffi::c_void) {
        let p = from_handle(pool)?;
        if value.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        match attr {
            1..=3 => p.attrs.lock().unwrap_or_else(|e| e.into_inner())[attr as usize] = get(value as *const i32)? as u64,
            4 => p.attrs.lock().unwrap_or_else(|e| e.into_inner())[4] = get(value as *const u64)?,
            // RESERVED_MEM_HIGH / USED_MEM_HIGH: only a reset to 0 is allowed.
            6 | 8 => {
                if get(value as *const u64)? != 0 {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                p.high.store(p.used.load(Ordering::Acquire), Ordering::Release);
            }
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        Ok(())
    }

    fn cuMemPoolGetAttribute(pool: CUmemoryPool, attr: i32, value: *mut std::ffi::c_void) {
        let p = from_handle(pool)?;
        match attr {
            1..=3 => put(value as *mut i32, p.attrs.lock().unwrap_or_else(|e| e.into_inner())[attr as usize] as i32),
            4 => put(value as *mut u64, p.attrs.lock().unwrap_or_else(|e| e.into_inner())[4]),
            5 => put(value as *mut u64, p.used.load(Ordering::Acquire) + p.cached.load(Ordering::Acquire)),
            7 => put(value as *mut u64, p.used.load(Ordering::Acquire)),
            6 | 8 => put(value as *mut u64, p.high.load(Ordering::Acquire)),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    fn cuMemPoolSetAccess(pool: CUmemoryPool, desc: *const CUmemAccessDesc, count: usize) {
        from_handle(pool)?;
        if count > 0 && desc.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        Ok(())
    }

    fn cuMemPoolGetAccess(flags: *mut u32, pool: CUmemoryPool, location: *const CUmemLocation) {
        from_handle(pool)?;
        let loc = get(location)?;
        // CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3 for devices, NONE for anything else.
        put(flags, if loc.type_ == CU_MEM_LOCATION_TYPE_DEVICE { 3 } else { 0 })
    }

    fn cuDeviceGetDefaultMemPool(pool: *mut CUmemoryPool, dev: CUdevice) {
        phys_of(dev)?;
        put(pool, device_pools()?.defaults[dev as usize].handle())
    }

    fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice) {
        phys_of(dev)?;
        put(pool, device_pools()?.current[dev as usize].load(Ordering::Acquire) as CUmemoryPool)
    }

    fn cuDeviceSetMemPool(dev: CUdevice, pool: CUmemoryPool) {
        phys_of(dev)?;
        let p = from_handle(pool)?;
        if p.ordinal != dev {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        device_pools()?.current[dev as usize].store(pool as usize, Ordering::Release);
        Ok(())
    }
}
