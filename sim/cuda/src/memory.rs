//! Linear memory: device, pitched, managed and host allocations, copies, memsets, pointer
//! attributes and `cuMemGetInfo`.
//!
//! A device pointer is a real host address from an anonymous `MAP_NORESERVE` mapping, so copies
//! and memsets are plain `memmove`/`memset` and untouched memory costs nothing. Live
//! allocations are kept in 16 mutex-sharded ordered maps keyed by base address; accounting
//! (see `stats::reserve`) counts the requested size on the physical device of the context.

use crate::context::{self, Ctx};
use crate::stats;
use crate::types::*;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `cuMemAlloc*`, `cuMemAllocPitch*`
    Device,
    /// `cuMemAllocManaged`
    Managed,
    /// `cuMemAllocAsync`, `cuMemAllocFromPoolAsync` (`pool` says which)
    Pool,
    /// `cuMemAllocHost`, `cuMemHostAlloc`: not counted
    Host,
    /// `cuMemHostRegister`: the caller's memory, not counted, never unmapped by us
    Registered,
}

#[derive(Clone, Copy, Debug)]
pub struct Alloc {
    /// Bytes the caller asked for (pitch × height for pitched allocations).
    pub size: usize,
    /// Length of the host mapping behind it.
    len: usize,
    /// Bytes counted on `physical` (0 for host memory).
    pub counted: u64,
    pub physical: usize,
    pub ordinal: CUdevice,
    pub ctx: usize,
    pub kind: Kind,
    pub pool: usize,
    pub id: u64,
}

const SHARDS: usize = 16;
static MAP: [Mutex<BTreeMap<usize, Alloc>>; SHARDS] =
    [const { Mutex::new(BTreeMap::new()) }; SHARDS];
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

#[inline]
fn shard(base: usize) -> &'static Mutex<BTreeMap<usize, Alloc>> {
    &MAP[(base >> 12) % SHARDS]
}

fn lock(
    m: &'static Mutex<BTreeMap<usize, Alloc>>,
) -> std::sync::MutexGuard<'static, BTreeMap<usize, Alloc>> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub const PAGE: usize = 4096;

/// An anonymous read-write `MAP_NORESERVE` mapping of `len` bytes (below 2 GiB with `low32`).
pub fn map_anon(len: usize, low32: bool) -> Option<usize> {
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
    if low32 {
        return map_low(len, flags);
    }
    mmap_at(0, len, flags)
}

/// `mmap(hint, len, read-write, flags)`; `None` on failure.
fn mmap_at(hint: usize, len: usize, flags: libc::c_int) -> Option<usize> {
    // SAFETY: a fresh anonymous mapping (never MAP_FIXED); no existing memory is touched.
    let p = unsafe {
        libc::mmap(
            hint as *mut c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p as usize)
}

/// Below 2 GiB: x86-64's `MAP_32BIT` (the kernel picks the place in the low 2 GiB).
#[cfg(target_arch = "x86_64")]
fn map_low(len: usize, flags: libc::c_int) -> Option<usize> {
    mmap_at(0, len, flags | libc::MAP_32BIT)
}

/// Below 2 GiB elsewhere (aarch64 has no `MAP_32BIT`): the kernel is given address hints from
/// 256 MiB up, in steps of at least 16 MiB; it honours a hint whose range is free and otherwise
/// maps elsewhere, so every answer is checked (and unmapped if it is not wholly below 2 GiB).
/// Never `MAP_FIXED`: nothing already mapped can be replaced. `None` when no hint is honoured.
#[cfg(not(target_arch = "x86_64"))]
fn map_low(len: usize, flags: libc::c_int) -> Option<usize> {
    const LIMIT: usize = 1 << 31;
    const STEP: usize = 1 << 24;
    let step = len.div_ceil(STEP).max(1) * STEP;
    let mut hint = 1usize << 28;
    while hint.checked_add(len)? <= LIMIT {
        let p = mmap_at(hint, len, flags)?;
        if p + len <= LIMIT {
            return Some(p);
        }
        unmap(p, len);
        hint += step;
    }
    None
}

pub fn unmap(base: usize, len: usize) {
    // SAFETY: only ever called on mappings this crate created and no longer hands out.
    unsafe { libc::munmap(base as *mut c_void, len) };
}

/// Allocates `size` bytes, counted on the device of `ctx` unless `kind` is `Host`.
pub fn alloc(
    size: usize,
    ctx: Option<&'static Ctx>,
    kind: Kind,
    pool: usize,
    low32: bool,
) -> Res<usize> {
    if size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let len = size.checked_add(PAGE - 1).ok_or(CUDA_ERROR_OUT_OF_MEMORY)? & !(PAGE - 1);
    let (physical, ordinal) = ctx.map_or((usize::MAX, -1), |c| (c.physical, c.ordinal));
    let counted = if matches!(kind, Kind::Host | Kind::Registered) {
        0
    } else {
        size as u64
    };
    if counted > 0 {
        // Refuse before mapping anything: the check and the count are one atomic step.
        stats::reserve(physical, counted)?;
    }
    let Some(base) = map_anon(len, low32) else {
        if counted > 0 {
            stats::unreserve(physical, counted);
        }
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    };
    let a = Alloc {
        size,
        len,
        counted,
        physical,
        ordinal,
        ctx: ctx.map_or(0, |c| c as *const Ctx as usize),
        kind,
        pool,
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
    };
    lock(shard(base)).insert(base, a);
    Ok(base)
}

/// Frees the allocation starting exactly at `base` if `ok(kind)`; anything else is
/// `CUDA_ERROR_INVALID_VALUE`.
pub fn free(base: usize, ok: impl Fn(Kind) -> bool) -> Res<Alloc> {
    free_then(base, ok, || {})
}

/// `free`, running `unmapped` after the address range is released (another thread may be
/// handed it from then on) and before the memory stops being counted on its device.
fn free_then(base: usize, ok: impl Fn(Kind) -> bool, unmapped: impl FnOnce()) -> Res<Alloc> {
    let a = {
        let mut m = lock(shard(base));
        match m.get(&base) {
            Some(a) if ok(a.kind) => m.remove(&base).ok_or(CUDA_ERROR_INVALID_VALUE)?,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
    };
    if a.kind != Kind::Registered {
        unmap(base, a.len);
    }
    unmapped();
    if a.kind == Kind::Pool {
        // The pool keeps the memory (resident, still counted on the device) until a
        // synchronisation or cuMemPoolTrimTo releases it (`pools`).
        stats::count_free(a.physical);
        crate::pools::released(a.pool, a.counted);
    } else if a.counted > 0 {
        stats::release(a.physical, a.counted);
    }
    Ok(a)
}

/// `cuMemFree`: it synchronises, as on the real driver, so memory freed into a pool (stream-
/// ordered memory may be freed this way) is given back as far as the pool's release threshold
/// says at once.
fn plain_free(base: usize) -> Res {
    let a = free(base, is_device_kind)?;
    if a.kind == Kind::Pool {
        crate::pools::synchronised();
    }
    Ok(())
}

/// Frees every `cuMemAlloc*`/`cuMemAllocPitch*`/`cuMemAllocManaged` allocation made in the
/// context at address `ctx` (its destruction or primary-context reset, as the real driver
/// does); returns how many allocations and bytes went. Stream-ordered (pool) allocations belong
/// to their pool and host memory stays mapped: neither is touched.
///
/// Each allocation's addresses are released before its memory stops being counted (as in any
/// free): a driver may reuse a torn-down context's addresses before it has given all of its
/// memory back. `GPUSIM_TEARDOWN_DELAY_MS` widens that window (a pause after each allocation's
/// addresses are released), so that a test can make another thread be handed them in it.
pub fn free_context(ctx: usize) -> (u64, u64) {
    let mine: Vec<usize> = MAP
        .iter()
        .flat_map(|m| {
            lock(m)
                .iter()
                .filter(|(_, a)| a.ctx == ctx && matches!(a.kind, Kind::Device | Kind::Managed))
                .map(|(&b, _)| b)
                .collect::<Vec<_>>()
        })
        .collect();
    let (mut n, mut bytes) = (0, 0);
    for base in mine {
        let pause = || {
            if let Some(delay) = teardown_delay() {
                std::thread::sleep(delay);
            }
        };
        if let Ok(a) = free_then(base, |k| matches!(k, Kind::Device | Kind::Managed), pause) {
            n += 1;
            bytes += a.counted;
        }
    }
    (n, bytes)
}

/// `GPUSIM_TEARDOWN_DELAY_MS`: the pause in a context teardown between releasing an
/// allocation's addresses and uncounting its memory (see `free_context`); unset, 0 or invalid:
/// none.
fn teardown_delay() -> Option<std::time::Duration> {
    static DELAY: std::sync::OnceLock<Option<std::time::Duration>> = std::sync::OnceLock::new();
    *DELAY.get_or_init(|| {
        let ms = std::env::var("GPUSIM_TEARDOWN_DELAY_MS").ok()?.trim().parse::<u64>().ok()?;
        (ms > 0).then(|| std::time::Duration::from_millis(ms.min(60_000)))
    })
}

pub fn is_device_kind(k: Kind) -> bool {
    !matches!(k, Kind::Host | Kind::Registered)
}

/// Records the caller's `[base, base+size)` as registered host memory.
fn register(base: usize, size: usize, ctx: Option<&'static Ctx>) -> Res {
    if base == 0 || size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if find(base).is_some() || find(base + size - 1).is_some() {
        return Err(712); // CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
    }
    let a = Alloc {
        size,
        len: 0,
        counted: 0,
        physical: ctx.map_or(usize::MAX, |c| c.physical),
        ordinal: ctx.map_or(-1, |c| c.ordinal),
        ctx: ctx.map_or(0, |c| c as *const Ctx as usize),
        kind: Kind::Registered,
        pool: 0,
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
    };
    lock(shard(base)).insert(base, a);
    Ok(())
}

/// The allocation containing `addr`, with its base.
pub fn find(addr: usize) -> Option<(usize, Alloc)> {
    MAP.iter().find_map(|m| {
        let m = m.lock().unwrap_or_else(|e| e.into_inner());
        m.range(..=addr)
            .next_back()
            .filter(|(&b, a)| addr < b + a.size.max(1))
            .map(|(&b, a)| (b, *a))
    })
}

/// What `cuPointerGetAttribute` and `cuMemGetAddressRange` know about an address.
#[derive(Clone, Copy, Debug)]
pub struct PtrInfo {
    pub base: usize,
    pub size: usize,
    /// `CUmemorytype`: 1 host, 2 device.
    pub memtype: u32,
    pub ctx: usize,
    pub ordinal: CUdevice,
    pub managed: bool,
    pub legacy_ipc: bool,
    pub id: u64,
    pub pool: usize,
}

pub fn ptr_info(addr: usize) -> Option<PtrInfo> {
    if let Some((base, a)) = find(addr) {
        return Some(PtrInfo {
            base,
            size: a.size,
            memtype: if is_device_kind(a.kind) { 2 } else { 1 },
            ctx: a.ctx,
            ordinal: a.ordinal,
            managed: a.kind == Kind::Managed,
            legacy_ipc: a.kind == Kind::Device,
            id: a.id,
            pool: a.pool,
        });
    }
    crate::vmm::ptr_info(addr)
}

/// `[addr, addr+len)` lies in one allocation (or VMM reservation) this driver handed out.
fn check_range(addr: u64, len: usize) -> Res {
    if len == 0 {
        return Ok(());
    }
    let addr = addr as usize;
    let end = addr.checked_add(len).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if let Some((b, a)) = find(addr) {
        return if end <= b + a.size {
            Ok(())
        } else {
            Err(CUDA_ERROR_INVALID_VALUE)
        };
    }
    if crate::vmm::contains(addr, len) {
        return Ok(());
    }
    Err(CUDA_ERROR_INVALID_VALUE)
}

fn check_host(p: *const c_void, len: usize) -> Res {
    if len > 0 && p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

unsafe fn copy(dst: usize, src: usize, n: usize) {
    if n > 0 {
        std::ptr::copy(src as *const u8, dst as *mut u8, n);
    }
}

unsafe fn htod(dst: CUdeviceptr, src: *const c_void, n: usize) -> Res {
    check_range(dst, n)?;
    check_host(src, n)?;
    unsafe { copy(dst as usize, src as usize, n) };
    Ok(())
}

unsafe fn dtoh(dst: *mut c_void, src: CUdeviceptr, n: usize) -> Res {
    check_range(src, n)?;
    check_host(dst, n)?;
    unsafe { copy(dst as usize, src as usize, n) };
    Ok(())
}

unsafe fn dtod(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> Res {
    check_range(dst, n)?;
    check_range(src, n)?;
    unsafe { copy(dst as usize, src as usize, n) };
    Ok(())
}

/// Unified-addressing copy: either side may be host or device memory.
unsafe fn generic(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> Res {
    if n > 0 && (dst == 0 || src == 0) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    unsafe { copy(dst as usize, src as usize, n) };
    Ok(())
}

unsafe fn peer(
    dst: CUdeviceptr,
    dst_ctx: CUcontext,
    src: CUdeviceptr,
    src_ctx: CUcontext,
    n: usize,
) -> Res {
    context::from_handle(dst_ctx)?;
    context::from_handle(src_ctx)?;
    dtod(dst, src, n)
}

unsafe fn memset8(dst: CUdeviceptr, v: u8, n: usize) -> Res {
    check_range(dst, n)?;
    if n > 0 {
        unsafe { std::ptr::write_bytes(dst as *mut u8, v, n) };
    }
    Ok(())
}

unsafe fn memset32(dst: CUdeviceptr, v: u32, n: usize) -> Res {
    if !dst.is_multiple_of(4) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    check_range(dst, n.checked_mul(4).ok_or(CUDA_ERROR_INVALID_VALUE)?)?;
    let p = dst as *mut u32;
    for i in 0..n {
        unsafe { p.add(i).write(v) };
    }
    Ok(())
}

unsafe fn device_alloc(dptr: *mut CUdeviceptr, size: usize, kind: Kind) -> Res {
    if dptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let c = context::current()?;
    let p = alloc(size, Some(c), kind, 0, false)?;
    put(dptr, p as CUdeviceptr)
}

fn pitch_of(width: usize, height: usize, elem: u32) -> Res<(usize, usize)> {
    if width == 0 || height == 0 || !matches!(elem, 4 | 8 | 16) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let pitch = width.checked_add(511).ok_or(CUDA_ERROR_INVALID_VALUE)? & !511;
    let size = pitch.checked_mul(height).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    Ok((pitch, size))
}

fn mem_info() -> Res<(u64, u64)> {
    let c = context::current()?;
    let total = crate::devices::physical()[c.physical].total;
    Ok((total.saturating_sub(stats::occupied(c.physical)), total))
}

unsafe fn host_alloc(pp: *mut *mut c_void, size: usize) -> Res {
    if pp.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let p = alloc(size, context::current_opt(), Kind::Host, 0, false)?;
    put(pp, p as *mut c_void)
}

/// Writes one pointer attribute. `info` None: the pointer is unknown (`strict`: error; else
/// the attribute's "NULL" default, as `cuPointerGetAttributes` documents).
unsafe fn write_attr(
    data: *mut c_void,
    attr: i32,
    ptr: CUdeviceptr,
    info: Option<&PtrInfo>,
    strict: bool,
) -> Res {
    if data.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let Some(i) = info else {
        if strict {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        return match attr {
            1 | 3 | 4 | 7 | 11 | 12 | 14 | 17 | 18 | 19 | 20 => put(data as *mut u64, 0),
            2 | 16 => put(data as *mut u32, 0),
            9 => put(data as *mut i32, -2),
            22 => put(data as *mut i32, -1),
            6 | 8 | 10 | 13 | 15 | 21 => put(data as *mut u8, 0),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        };
    };
    match attr {
        1 => put(data as *mut usize, i.ctx),
        2 => put(data as *mut u32, i.memtype),
        3 => put(data as *mut u64, ptr),
        4 => {
            if i.memtype == 1 || i.managed {
                put(data as *mut u64, ptr)
            } else if strict {
                Err(CUDA_ERROR_INVALID_VALUE)
            } else {
                put(data as *mut u64, 0)
            }
        }
        5 => Err(CUDA_ERROR_NOT_SUPPORTED),
        6 | 15 | 21 => put(data as *mut u8, 0),
        7 | 20 => put(data as *mut u64, i.id),
        8 => put(data as *mut u8, i.managed as u8),
        9 => put(data as *mut i32, i.ordinal),
        10 => put(data as *mut u8, i.legacy_ipc as u8),
        11 | 19 => put(data as *mut u64, i.base as u64),
        12 | 18 => put(data as *mut usize, i.size),
        13 => put(data as *mut u8, 1),
        14 => put(data as *mut u64, 0),
        16 => put(data as *mut u32, 3),
        17 => put(data as *mut usize, i.pool),
        22 => put(data as *mut i32, -1),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

cu_api! {
    fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) {
        device_alloc(dptr, bytesize, Kind::Device)
    }

    /// v1 ABI: 32-bit pointer and size; mapped below 2 GiB.
    fn cuMemAlloc(dptr: *mut u32, bytesize: u32) {
        if dptr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let c = context::current()?;
        let p = alloc(bytesize as usize, Some(c), Kind::Device, 0, true)?;
        if p > u32::MAX as usize {
            free(p, |_| true)?;
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        put(dptr, p as u32)
    }

    /// No current context needed: the pointer says where the memory is.
    /// Freeing NULL is a no-op, as on the real driver (`cudaFree(NULL)` relies on it).
    fn cuMemFree_v2(dptr: CUdeviceptr) {
        crate::devices::visible()?;
        if dptr == 0 {
            return Ok(());
        }
        plain_free(dptr as usize)
    }

    fn cuMemFree(dptr: u32) {
        crate::devices::visible()?;
        if dptr == 0 {
            return Ok(());
        }
        plain_free(dptr as usize)
    }

    fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: u32) {
        if dptr.is_null() || pitch.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (p, size) = pitch_of(width, height, elem)?;
        device_alloc(dptr, size, Kind::Device)?;
        put(pitch, p)
    }

    fn cuMemAllocPitch(dptr: *mut u32, pitch: *mut u32, width: u32, height: u32, elem: u32) {
        if dptr.is_null() || pitch.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (p, size) = pitch_of(width as usize, height as usize, elem)?;
        if p > u32::MAX as usize {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let c = context::current()?;
        let base = alloc(size, Some(c), Kind::Device, 0, true)?;
        if base > u32::MAX as usize {
            free(base, |_| true)?;
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        put(dptr, base as u32)?;
        put(pitch, p as u32)
    }

    fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: u32) {
        // CU_MEM_ATTACH_GLOBAL = 1, CU_MEM_ATTACH_HOST = 2
        if !matches!(flags, 1 | 2) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        device_alloc(dptr, bytesize, Kind::Managed)
    }

    /// NULL out-pointers are tolerated (programs such as OptiX pass one).
    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) {
        let (f, t) = mem_info()?;
        put_opt(free, f as usize);
        put_opt(total, t as usize);
        Ok(())
    }

    /// v1 ABI: 32-bit values, clamped.
    fn cuMemGetInfo(free: *mut u32, total: *mut u32) {
        let (f, t) = mem_info()?;
        put_opt(free, f.min(u32::MAX as u64) as u32);
        put_opt(total, t.min(u32::MAX as u64) as u32);
        Ok(())
    }

    /// Both out-pointers are optional, as documented; an unknown address is CUDA_ERROR_NOT_FOUND.
    fn cuMemGetAddressRange_v2(pbase: *mut CUdeviceptr, psize: *mut usize, dptr: CUdeviceptr) {
        crate::devices::visible()?;
        let i = ptr_info(dptr as usize).ok_or(CUDA_ERROR_NOT_FOUND)?;
        put_opt(pbase, i.base as CUdeviceptr);
        put_opt(psize, i.size);
        Ok(())
    }

    /// v1 ABI: 32-bit address and size (a base or size that does not fit is CUDA_ERROR_INVALID_VALUE).
    fn cuMemGetAddressRange(pbase: *mut u32, psize: *mut u32, dptr: u32) {
        crate::devices::visible()?;
        let i = ptr_info(dptr as usize).ok_or(CUDA_ERROR_NOT_FOUND)?;
        let base = u32::try_from(i.base).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        let size = u32::try_from(i.size).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        put_opt(pbase, base);
        put_opt(psize, size);
        Ok(())
    }

    fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize) { host_alloc(pp, bytesize) }
    fn cuMemAllocHost(pp: *mut *mut c_void, bytesize: u32) { host_alloc(pp, bytesize as usize) }
    fn cuMemHostAlloc(pp: *mut *mut c_void, bytesize: usize, flags: u32) {
        let _ = flags;
        host_alloc(pp, bytesize)
    }

    fn cuMemFreeHost(p: *mut c_void) {
        crate::devices::visible()?;
        free(p as usize, |k| k == Kind::Host).map(|_| ())
    }

    fn cuMemHostRegister(p: *mut c_void, bytesize: usize, flags: u32) {
        let _ = flags;
        register(p as usize, bytesize, Some(context::current()?))
    }
    fn cuMemHostRegister_v2(p: *mut c_void, bytesize: usize, flags: u32) {
        let _ = flags;
        register(p as usize, bytesize, Some(context::current()?))
    }
    fn cuMemHostUnregister(p: *mut c_void) {
        crate::devices::visible()?;
        free(p as usize, |k| k == Kind::Registered).map(|_| ()).map_err(|_| 713) // HOST_MEMORY_NOT_REGISTERED
    }

    fn cuMemHostGetDevicePointer_v2(dptr: *mut CUdeviceptr, p: *mut c_void, flags: u32) {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        match find(p as usize) {
            Some((_, a)) if !is_device_kind(a.kind) => put(dptr, p as CUdeviceptr),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) { crate::timeline::sync_copy(); generic(dst, src, n) }
    fn cuMemcpy_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize) { crate::timeline::sync_copy(); generic(dst, src, n) }
    fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, n: usize) { crate::timeline::sync_copy(); htod(dst, src, n) }
    fn cuMemcpyHtoD_v2_ptds(dst: CUdeviceptr, src: *const c_void, n: usize) { crate::timeline::sync_copy(); htod(dst, src, n) }
    fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) { crate::timeline::sync_copy(); dtoh(dst, src, n) }
    fn cuMemcpyDtoH_v2_ptds(dst: *mut c_void, src: CUdeviceptr, n: usize) { crate::timeline::sync_copy(); dtoh(dst, src, n) }
    fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) { crate::timeline::sync_copy(); dtod(dst, src, n) }
    fn cuMemcpyDtoD_v2_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize) { crate::timeline::sync_copy(); dtod(dst, src, n) }

    fn cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) {
        crate::timeline::async_op(s, false)?;
        generic(dst, src, n)
    }
    fn cuMemcpyAsync_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) {
        crate::timeline::async_op(s, true)?;
        generic(dst, src, n)
    }
    fn cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, n: usize, s: CUstream) {
        crate::timeline::async_op(s, false)?;
        htod(dst, src, n)
    }
    fn cuMemcpyHtoDAsync_v2_ptsz(dst: CUdeviceptr, src: *const c_void, n: usize, s: CUstream) {
        crate::timeline::async_op(s, true)?;
        htod(dst, src, n)
    }
    fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, n: usize, s: CUstream) {
        crate::timeline::async_op(s, false)?;
        dtoh(dst, src, n)
    }
    fn cuMemcpyDtoHAsync_v2_ptsz(dst: *mut c_void, src: CUdeviceptr, n: usize, s: CUstream) {
        crate::timeline::async_op(s, true)?;
        dtoh(dst, src, n)
    }
    fn cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) {
        crate::timeline::async_op(s, false)?;
        dtod(dst, src, n)
    }
    fn cuMemcpyDtoDAsync_v2_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) {
        crate::timeline::async_op(s, true)?;
        dtod(dst, src, n)
    }

    fn cuMemcpyPeer(dst: CUdeviceptr, dst_ctx: CUcontext, src: CUdeviceptr, src_ctx: CUcontext, n: usize) {
        crate::timeline::sync_copy();
        peer(dst, dst_ctx, src, src_ctx, n)
    }
    fn cuMemcpyPeer_ptds(dst: CUdeviceptr, dst_ctx: CUcontext, src: CUdeviceptr, src_ctx: CUcontext, n: usize) {
        crate::timeline::sync_copy();
        peer(dst, dst_ctx, src, src_ctx, n)
    }
    fn cuMemcpyPeerAsync(dst: CUdeviceptr, dst_ctx: CUcontext, src: CUdeviceptr, src_ctx: CUcontext, n: usize, s: CUstream) {
        crate::timeline::async_op(s, false)?;
        peer(dst, dst_ctx, src, src_ctx, n)
    }
    fn cuMemcpyPeerAsync_ptsz(dst: CUdeviceptr, dst_ctx: CUcontext, src: CUdeviceptr, src_ctx: CUcontext, n: usize, s: CUstream) {
        crate::timeline::async_op(s, true)?;
        peer(dst, dst_ctx, src, src_ctx, n)
    }

    fn cuMemsetD8_v2(dst: CUdeviceptr, v: u8, n: usize) { crate::timeline::sync_copy(); memset8(dst, v, n) }
    fn cuMemsetD8_v2_ptds(dst: CUdeviceptr, v: u8, n: usize) { crate::timeline::sync_copy(); memset8(dst, v, n) }
    fn cuMemsetD32_v2(dst: CUdeviceptr, v: u32, n: usize) { crate::timeline::sync_copy(); memset32(dst, v, n) }
    fn cuMemsetD32_v2_ptds(dst: CUdeviceptr, v: u32, n: usize) { crate::timeline::sync_copy(); memset32(dst, v, n) }
    fn cuMemsetD8Async(dst: CUdeviceptr, v: u8, n: usize, s: CUstream) {
        crate::timeline::async_op(s, false)?;
        memset8(dst, v, n)
    }
    fn cuMemsetD8Async_ptsz(dst: CUdeviceptr, v: u8, n: usize, s: CUstream) {
        crate::timeline::async_op(s, true)?;
        memset8(dst, v, n)
    }
    fn cuMemsetD32Async(dst: CUdeviceptr, v: u32, n: usize, s: CUstream) {
        crate::timeline::async_op(s, false)?;
        memset32(dst, v, n)
    }
    fn cuMemsetD32Async_ptsz(dst: CUdeviceptr, v: u32, n: usize, s: CUstream) {
        crate::timeline::async_op(s, true)?;
        memset32(dst, v, n)
    }

    /// Unknown pointers are CUDA_ERROR_INVALID_VALUE.
    fn cuPointerGetAttribute(data: *mut c_void, attribute: i32, ptr: CUdeviceptr) {
        crate::devices::visible()?;
        let info = ptr_info(ptr as usize);
        write_attr(data, attribute, ptr, info.as_ref(), true)
    }

    /// Unknown pointers get the attributes' NULL defaults and CUDA_SUCCESS, as documented.
    fn cuPointerGetAttributes(num: u32, attributes: *const i32, data: *mut *mut c_void, ptr: CUdeviceptr) {
        crate::devices::visible()?;
        if num == 0 || attributes.is_null() || data.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let info = ptr_info(ptr as usize);
        for k in 0..num as usize {
            write_attr(*data.add(k), *attributes.add(k), ptr, info.as_ref(), false)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pitch() {
        assert_eq!(pitch_of(1, 10, 4), Ok((512, 5120)));
        assert_eq!(pitch_of(512, 2, 8), Ok((512, 1024)));
        assert_eq!(pitch_of(513, 2, 16), Ok((1024, 2048)));
        assert_eq!(pitch_of(0, 2, 4), Err(CUDA_ERROR_INVALID_VALUE));
        assert_eq!(pitch_of(4, 2, 3), Err(CUDA_ERROR_INVALID_VALUE));
    }

    #[test]
    fn address_ranges_v1_and_v2() {
        use crate::context::*;
        let _g = crate::DRIVER_TESTS
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        unsafe {
            assert_eq!(crate::devices::cuInit(0), CUDA_SUCCESS);
            let mut ctx: CUcontext = std::ptr::null_mut();
            assert_eq!(cuCtxCreate_v2(&mut ctx, 0, 0), CUDA_SUCCESS);
            let mut p: u32 = 0;
            assert_eq!(cuMemAlloc(&mut p, 1000), CUDA_SUCCESS);
            let (mut base, mut size) = (0u32, 0u32);
            assert_eq!(
                cuMemGetAddressRange(&mut base, &mut size, p + 999),
                CUDA_SUCCESS
            );
            assert_eq!((base, size), (p, 1000));
            assert_eq!(
                cuMemGetAddressRange(&mut base, &mut size, p + 1000),
                CUDA_ERROR_NOT_FOUND
            );
            let (mut b2, mut s2) = (0u64, 0usize);
            assert_eq!(
                cuMemGetAddressRange_v2(&mut b2, &mut s2, p as u64 + 10),
                CUDA_SUCCESS
            );
            assert_eq!((b2, s2), (p as u64, 1000));
            assert_eq!(cuMemFree(p), CUDA_SUCCESS);
            assert_eq!(
                cuMemGetAddressRange(&mut base, &mut size, p),
                CUDA_ERROR_NOT_FOUND
            );
            assert_eq!(cuCtxDestroy_v2(ctx), CUDA_SUCCESS);
        }
    }
}
