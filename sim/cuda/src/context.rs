//! Contexts: primary contexts (one per visible ordinal, never freed), created contexts, the
//! per-thread current-context stack, and the context-local storage the runtime keeps through
//! the private `c693336e` table.
//!
//! A `CUcontext` is the address of a leaked `Ctx`. Handles are validated against the set of
//! live contexts; destroyed contexts stay allocated (marked dead) so a stale handle is an error,
//! never a use-after-free.

use crate::devices::{self, phys_of};
use crate::types::*;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, RwLock};

pub struct Ctx {
    pub ordinal: CUdevice,
    pub physical: usize,
    pub primary: bool,
    pub id: u64,
    pub flags: AtomicU32,
    alive: AtomicBool,
    limits: Mutex<[usize; 8]>,
    peers: Mutex<Vec<usize>>,
}

impl Ctx {
    pub fn handle(&'static self) -> CUcontext {
        self as *const Ctx as CUcontext
    }
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }
}

/// Default values of `CUlimit` 0..=6.
const DEFAULT_LIMITS: [usize; 8] = [1024, 1 << 20, 8 << 20, 2, 2048, 32, 0, 0];

static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static LIVE: OnceLock<RwLock<HashSet<usize>>> = OnceLock::new();

fn live() -> &'static RwLock<HashSet<usize>> {
    LIVE.get_or_init(|| RwLock::new(HashSet::new()))
}

fn new_ctx(ordinal: CUdevice, physical: usize, primary: bool, flags: u32) -> &'static Ctx {
    let c: &'static Ctx = Box::leak(Box::new(Ctx {
        ordinal,
        physical,
        primary,
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        flags: AtomicU32::new(flags),
        alive: AtomicBool::new(true),
        limits: Mutex::new(DEFAULT_LIMITS),
        peers: Mutex::new(Vec::new()),
    }));
    live()
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .insert(c as *const Ctx as usize);
    c
}

/// A live context from its handle; NULL or unknown is `CUDA_ERROR_INVALID_CONTEXT`.
pub fn from_handle(h: CUcontext) -> Res<&'static Ctx> {
    devices::visible()?;
    if h.is_null()
        || !live()
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&(h as usize))
    {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    // SAFETY: in the live set, so it is a leaked `Ctx`.
    Ok(unsafe { &*(h as *const Ctx) })
}

/// `h`, or the current context when `h` is NULL.
pub fn or_current(h: CUcontext) -> Res<&'static Ctx> {
    if h.is_null() {
        current()
    } else {
        from_handle(h)
    }
}

// ---- primary contexts ----------------------------------------------------------------------

pub struct Primary {
    pub ctx: &'static Ctx,
    pub refs: AtomicU32,
}

static PRIMARIES: OnceLock<Vec<Primary>> = OnceLock::new();

/// The primary context of visible ordinal `dev` (created on first use, never freed).
pub fn primary(dev: CUdevice) -> Res<&'static Primary> {
    phys_of(dev)?;
    let all = PRIMARIES.get_or_init(|| {
        let vis = devices::visible().unwrap_or(&[]);
        vis.iter()
            .enumerate()
            .map(|(o, &p)| Primary {
                ctx: new_ctx(o as CUdevice, p, true, 0),
                refs: AtomicU32::new(0),
            })
            .collect()
    });
    all.get(dev as usize).ok_or(CUDA_ERROR_INVALID_DEVICE)
}

/// Retain of the primary context (also private table `6bd5fb6c` slot 2).
pub fn primary_retain(dev: CUdevice) -> Res<&'static Ctx> {
    let p = primary(dev)?;
    p.refs.fetch_add(1, Ordering::AcqRel);
    Ok(p.ctx)
}

/// The last release destroys the primary context on the real driver: its memory goes (as on
/// `cuDevicePrimaryCtxReset`); the context-local storage and the handle stay (see README).
fn primary_release(dev: CUdevice) -> Res {
    let p = primary(dev)?;
    let before = p
        .refs
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| r.checked_sub(1))
        .map_err(|_| CUDA_ERROR_INVALID_CONTEXT)?;
    if before == 1 {
        free_memory_of(p.ctx);
    }
    Ok(())
}

fn primary_reset(dev: CUdevice) -> Res {
    let p = primary(dev)?;
    p.refs.store(0, Ordering::Release);
    p.ctx.flags.store(0, Ordering::Release);
    storage_destroy(p.ctx);
    free_memory_of(p.ctx);
    Ok(())
}

/// What the real driver does when a context is destroyed (or a primary context reset): every
/// allocation made in it is gone (`cuMemAlloc*`, `cuMemAllocPitch*`, `cuMemAllocManaged`,
/// arrays, mipmapped arrays), its bytes no longer used on the device.
fn free_memory_of(c: &'static Ctx) {
    let me = c as *const Ctx as usize;
    crate::memory::free_context(me);
    crate::arrays::free_context(me);
    if c.primary {
        // memory made in a green context of the device is the primary context's (`green`)
        for g in crate::green::contexts_of(c.ordinal) {
            crate::memory::free_context(g as *const Ctx as usize);
            crate::arrays::free_context(g as *const Ctx as usize);
        }
    }
}

/// The primary context's release, for a green context's destruction (`green`).
pub(crate) fn primary_release_of(dev: CUdevice) -> Res {
    primary_release(dev)
}

/// A context that is not primary, for a green context (`green`): not made current.
pub(crate) fn new_context(dev: CUdevice, flags: u32) -> Res<&'static Ctx> {
    let p = phys_of(dev)?;
    Ok(new_ctx(dev, p.index, false, flags))
}

/// Makes `c` a stale handle (not current on this thread any more) and drops its storage; its
/// memory is left to the caller.
pub(crate) fn retire(c: &'static Ctx) {
    live()
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&(c as *const Ctx as usize));
    c.alive.store(false, Ordering::Release);
    let _ = with_stack(|s| s.retain(|x| !std::ptr::eq(*x, c)));
    storage_destroy(c);
}

fn primary_set_flags(dev: CUdevice, flags: u32) -> Res {
    let p = primary(dev)?;
    p.ctx.flags.store(flags, Ordering::Release);
    Ok(())
}

/// Whether this process has a context on physical device `p`: a retained primary context or a
/// live created one (a process the real NVML lists among a device's compute processes).
pub fn has_context(p: usize) -> bool {
    let primary_active = PRIMARIES
        .get()
        .is_some_and(|all| all.iter().any(|x| x.ctx.physical == p && x.refs.load(Ordering::Acquire) > 0));
    primary_active
        || live().read().unwrap_or_else(|e| e.into_inner()).iter().any(|&h| {
            // SAFETY: handles in the live set are leaked `Ctx`s, never freed.
            let c = unsafe { &*(h as *const Ctx) };
            !c.primary && c.physical == p && c.is_alive()
        })
}

/// `int gpusim_has_context(int physical)`: 1 if this process has a context on that physical
/// device ([`has_context`]), 0 if not, -1 for an unknown device. For the simulated NVML's
/// process lists.
#[no_mangle]
pub extern "C" fn gpusim_has_context(p: std::ffi::c_int) -> std::ffi::c_int {
    crate::ffi::guard_value(-1, || {
        if p < 0 || p as usize >= devices::physical().len() {
            return -1;
        }
        has_context(p as usize) as std::ffi::c_int
    })
}

// ---- the current-context stack ---------------------------------------------------------------

thread_local! {
    static STACK: RefCell<Vec<&'static Ctx>> = const { RefCell::new(Vec::new()) };
}

fn with_stack<R>(f: impl FnOnce(&mut Vec<&'static Ctx>) -> R) -> Res<R> {
    STACK
        .try_with(|s| f(&mut s.borrow_mut()))
        .map_err(|_| CUDA_ERROR_UNKNOWN)
}

/// The calling thread's current context; none (or a destroyed one) is `CUDA_ERROR_INVALID_CONTEXT`.
#[inline]
pub fn current() -> Res<&'static Ctx> {
    devices::visible()?;
    match with_stack(|s| s.last().copied())? {
        Some(c) if c.is_alive() => Ok(c),
        _ => Err(CUDA_ERROR_INVALID_CONTEXT),
    }
}

/// The current context if there is one (no error otherwise).
pub fn current_opt() -> Option<&'static Ctx> {
    current().ok()
}

unsafe fn create(pctx: *mut CUcontext, flags: u32, dev: CUdevice) -> Res {
    if pctx.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let p = phys_of(dev)?;
    let c = new_ctx(dev, p.index, false, flags);
    with_stack(|s| s.push(c))?;
    put(pctx, c.handle())
}

// ---- context-local storage (private table c693336e) --------------------------------------------

pub type StorageDtor = Option<unsafe extern "C" fn(CUcontext, *mut c_void, *mut c_void)>;

type StorageMap = HashMap<(usize, usize), (usize, StorageDtor)>;
static STORAGE: OnceLock<RwLock<StorageMap>> = OnceLock::new();

fn storage() -> &'static RwLock<StorageMap> {
    STORAGE.get_or_init(|| RwLock::new(HashMap::new()))
}

pub fn storage_put(ctx: CUcontext, key: *mut c_void, value: *mut c_void, dtor: StorageDtor) -> Res {
    let c = or_current(ctx)?;
    storage().write().unwrap_or_else(|e| e.into_inner()).insert(
        (c as *const Ctx as usize, key as usize),
        (value as usize, dtor),
    );
    Ok(())
}

pub fn storage_delete(ctx: CUcontext, key: *mut c_void) -> Res {
    let c = or_current(ctx)?;
    let removed = storage()
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&(c as *const Ctx as usize, key as usize));
    removed.map(|_| ()).ok_or(CUDA_ERROR_INVALID_HANDLE)
}

pub fn storage_get(ctx: CUcontext, key: *mut c_void) -> Res<*mut c_void> {
    let c = or_current(ctx)?;
    storage()
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(&(c as *const Ctx as usize, key as usize))
        .map(|&(v, _)| v as *mut c_void)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)
}

/// Drops every entry of `c`, calling the destructors outside the lock.
fn storage_destroy(c: &'static Ctx) {
    let me = c as *const Ctx as usize;
    let gone: Vec<((usize, usize), (usize, StorageDtor))> = {
        let mut m = storage().write().unwrap_or_else(|e| e.into_inner());
        let keys: Vec<(usize, usize)> = m.keys().filter(|k| k.0 == me).copied().collect();
        keys.into_iter()
            .filter_map(|k| m.remove(&k).map(|v| (k, v)))
            .collect()
    };
    for ((_, key), (value, dtor)) in gone {
        if let Some(d) = dtor {
            // SAFETY: the destructor the runtime registered, called as the real driver does.
            unsafe { d(c.handle(), key as *mut c_void, value as *mut c_void) };
        }
    }
}

cu_api! {
    fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) {
        if pctx.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let c = primary_retain(dev)?;
        put(pctx, c.handle())
    }

    fn cuDevicePrimaryCtxRelease(dev: CUdevice) { primary_release(dev) }
    fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) { primary_release(dev) }
    fn cuDevicePrimaryCtxReset(dev: CUdevice) { primary_reset(dev) }
    fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) { primary_reset(dev) }
    fn cuDevicePrimaryCtxSetFlags(dev: CUdevice, flags: u32) { primary_set_flags(dev, flags) }
    fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: u32) { primary_set_flags(dev, flags) }

    fn cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut u32, active: *mut i32) {
        let p = primary(dev)?;
        if flags.is_null() || active.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        put(flags, p.ctx.flags.load(Ordering::Acquire))?;
        put(active, (p.refs.load(Ordering::Acquire) > 0) as i32)
    }

    fn cuCtxCreate(pctx: *mut CUcontext, flags: u32, dev: CUdevice) { create(pctx, flags, dev) }
    fn cuCtxCreate_v2(pctx: *mut CUcontext, flags: u32, dev: CUdevice) { create(pctx, flags, dev) }

    fn cuCtxCreate_v3(pctx: *mut CUcontext, params: *mut c_void, num_params: i32, flags: u32, dev: CUdevice) {
        if num_params < 0 || (num_params > 0 && params.is_null()) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        create(pctx, flags, dev)
    }

    fn cuCtxCreate_v4(pctx: *mut CUcontext, params: *mut CUctxCreateParams, flags: u32, dev: CUdevice) {
        if !params.is_null() {
            let p = get(params)?;
            if p.num_exec_affinity_params < 0 || (p.num_exec_affinity_params > 0 && p.exec_affinity_params.is_null()) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
        }
        create(pctx, flags, dev)
    }

    fn cuCtxDestroy(ctx: CUcontext) { cuCtxDestroy_v2_impl(ctx) }
    fn cuCtxDestroy_v2(ctx: CUcontext) { cuCtxDestroy_v2_impl(ctx) }

    fn cuCtxGetCurrent(pctx: *mut CUcontext) {
        devices::visible()?;
        let top = with_stack(|s| s.last().copied())?;
        put(pctx, top.map_or(std::ptr::null_mut(), |c| c.handle()))
    }

    fn cuCtxSetCurrent(ctx: CUcontext) {
        devices::visible()?;
        if ctx.is_null() {
            with_stack(|s| { s.pop(); })?;
            return Ok(());
        }
        let c = from_handle(ctx)?;
        with_stack(|s| match s.last_mut() {
            Some(top) => *top = c,
            None => s.push(c),
        })
    }

    fn cuCtxPushCurrent(ctx: CUcontext) { push(ctx) }
    fn cuCtxPushCurrent_v2(ctx: CUcontext) { push(ctx) }
    fn cuCtxPopCurrent(pctx: *mut CUcontext) { pop(pctx) }
    fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) { pop(pctx) }

    fn cuCtxGetDevice(dev: *mut CUdevice) {
        let c = current()?;
        put(dev, c.ordinal)
    }

    fn cuCtxGetDevice_v2(dev: *mut CUdevice, ctx: CUcontext) {
        let c = or_current(ctx)?;
        put(dev, c.ordinal)
    }

    fn cuCtxSynchronize() {
        crate::timeline::ctx_sync(current()?);
        crate::pools::synchronised();
        Ok(())
    }
    fn cuCtxSynchronize_v2(ctx: CUcontext) {
        crate::timeline::ctx_sync(or_current(ctx)?);
        crate::pools::synchronised();
        Ok(())
    }

    fn cuCtxGetApiVersion(ctx: CUcontext, version: *mut u32) {
        or_current(ctx)?;
        put(version, 3020)
    }

    fn cuCtxGetFlags(flags: *mut u32) {
        let c = current()?;
        put(flags, c.flags.load(Ordering::Acquire))
    }

    fn cuCtxSetFlags(flags: u32) {
        let c = current()?;
        c.flags.store(flags, Ordering::Release);
        Ok(())
    }

    fn cuCtxGetId(ctx: CUcontext, id: *mut u64) {
        let c = or_current(ctx)?;
        put(id, c.id)
    }

    fn cuCtxGetLimit(value: *mut usize, limit: i32) {
        let c = current()?;
        if !(0..=6).contains(&limit) {
            return Err(CUDA_ERROR_UNSUPPORTED_LIMIT);
        }
        let v = c.limits.lock().unwrap_or_else(|e| e.into_inner())[limit as usize];
        put(value, v)
    }

    fn cuCtxSetLimit(limit: i32, value: usize) {
        let c = current()?;
        if !(0..=6).contains(&limit) {
            return Err(CUDA_ERROR_UNSUPPORTED_LIMIT);
        }
        c.limits.lock().unwrap_or_else(|e| e.into_inner())[limit as usize] = value;
        Ok(())
    }

    /// Both pointers are optional, as documented.
    fn cuCtxGetStreamPriorityRange(least: *mut i32, greatest: *mut i32) {
        current()?;
        put_opt(least, 0);
        put_opt(greatest, -5);
        Ok(())
    }

    fn cuCtxEnablePeerAccess(peer: CUcontext, flags: u32) {
        let c = current()?;
        let p = from_handle(peer)?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // (two contexts of one GPU: the real driver refuses, as an H100 with driver 580 did for
        // PyTorch's cudaDeviceEnablePeerAccess between them; a context and itself: invalid)
        if peer == c.handle() {
            return Err(CUDA_ERROR_INVALID_DEVICE);
        }
        if p.ordinal == c.ordinal {
            return Err(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
        }
        let mut peers = c.peers.lock().unwrap_or_else(|e| e.into_inner());
        if peers.contains(&(peer as usize)) {
            return Err(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
        }
        peers.push(peer as usize);
        Ok(())
    }

    fn cuCtxDisablePeerAccess(peer: CUcontext) {
        let c = current()?;
        from_handle(peer)?;
        let mut peers = c.peers.lock().unwrap_or_else(|e| e.into_inner());
        let i = peers.iter().position(|&p| p == peer as usize).ok_or(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED)?;
        peers.remove(i);
        Ok(())
    }
}

#[allow(non_snake_case)]
fn cuCtxDestroy_v2_impl(ctx: CUcontext) -> Res {
    let c = from_handle(ctx)?;
    if c.primary || crate::green::is_green(c) {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    retire(c);
    free_memory_of(c);
    Ok(())
}

fn push(ctx: CUcontext) -> Res {
    let c = from_handle(ctx)?;
    with_stack(|s| s.push(c))
}

unsafe fn pop(pctx: *mut CUcontext) -> Res {
    devices::visible()?;
    let c = with_stack(|s| s.pop())?.ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    put_opt(pctx, c.handle());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arrays::*;
    use crate::memory::*;
    use crate::stats;

    fn lock() -> std::sync::MutexGuard<'static, ()> {
        crate::DRIVER_TESTS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The last visible ordinal and its physical device, after cuInit.
    unsafe fn last_device() -> (CUdevice, usize) {
        assert_eq!(crate::devices::cuInit(0), CUDA_SUCCESS);
        let v = crate::devices::visible().unwrap();
        ((v.len() - 1) as CUdevice, v[v.len() - 1])
    }

    unsafe fn alloc_mem(bytes: usize) -> CUdeviceptr {
        let mut p: CUdeviceptr = 0;
        assert_eq!(cuMemAlloc_v2(&mut p, bytes), CUDA_SUCCESS);
        p
    }

    #[test]
    fn destroying_a_context_frees_its_memory() {
        let _g = lock();
        unsafe {
            let (dev, phys) = last_device();
            let before = stats::used(phys);
            // memory of the primary context survives the created context's destruction
            let mut primary: CUcontext = std::ptr::null_mut();
            assert_eq!(cuDevicePrimaryCtxRetain(&mut primary, dev), CUDA_SUCCESS);
            assert_eq!(cuCtxPushCurrent_v2(primary), CUDA_SUCCESS);
            let kept = alloc_mem(3000);

            let mut ctx: CUcontext = std::ptr::null_mut();
            assert_eq!(cuCtxCreate_v2(&mut ctx, 0, dev), CUDA_SUCCESS);
            let a = alloc_mem(1 << 20);
            let mut pitch = 0usize;
            let mut b: CUdeviceptr = 0;
            assert_eq!(
                cuMemAllocPitch_v2(&mut b, &mut pitch, 1000, 10, 4),
                CUDA_SUCCESS
            );
            let mut m: CUdeviceptr = 0;
            assert_eq!(cuMemAllocManaged(&mut m, 4096, 1), CUDA_SUCCESS);
            let mut arr: CUarray = std::ptr::null_mut();
            let desc = CUDA_ARRAY_DESCRIPTOR {
                width: 64,
                height: 64,
                format: 0x20,
                num_channels: 1,
            };
            assert_eq!(cuArrayCreate_v2(&mut arr, &desc), CUDA_SUCCESS);
            let mut host: *mut std::ffi::c_void = std::ptr::null_mut();
            assert_eq!(cuMemAllocHost_v2(&mut host, 4096), CUDA_SUCCESS);
            let counted = 3000 + (1 << 20) + 1024 * 10 + 4096 + 64 * 64 * 4; // pitch 1024
            assert_eq!(stats::used(phys), before + counted);

            assert_eq!(cuCtxDestroy_v2(ctx), CUDA_SUCCESS);
            assert_eq!(
                stats::used(phys),
                before + 3000,
                "only the primary context's memory is left"
            );
            for p in [a, b, m] {
                assert!(find(p as usize).is_none());
                assert_eq!(cuMemFree_v2(p), CUDA_ERROR_INVALID_VALUE, "already gone");
                let mut base: CUdeviceptr = 0;
                assert_eq!(
                    cuMemGetAddressRange_v2(&mut base, std::ptr::null_mut(), p),
                    CUDA_ERROR_NOT_FOUND
                );
            }
            assert_eq!(cuArrayDestroy(arr), CUDA_ERROR_INVALID_HANDLE);
            // host memory is not the device's: still there
            assert_eq!(cuMemFreeHost(host), CUDA_SUCCESS);
            assert_eq!(cuMemsetD8_v2(kept, 7, 3000), CUDA_SUCCESS);
            assert_eq!(cuMemFree_v2(kept), CUDA_SUCCESS);
            assert_eq!(stats::used(phys), before);
            let mut popped: CUcontext = std::ptr::null_mut();
            assert_eq!(cuCtxPopCurrent_v2(&mut popped), CUDA_SUCCESS);
            assert_eq!(cuDevicePrimaryCtxRelease_v2(dev), CUDA_SUCCESS);
        }
    }

    #[test]
    fn resetting_the_primary_context_frees_its_memory() {
        let _g = lock();
        unsafe {
            let (dev, phys) = last_device();
            let before = stats::used(phys);
            // a created context's memory is not the primary context's
            let mut other: CUcontext = std::ptr::null_mut();
            assert_eq!(cuCtxCreate_v2(&mut other, 0, dev), CUDA_SUCCESS);
            let survivor = alloc_mem(5000);
            assert_eq!(
                cuCtxDestroy_v2(std::ptr::null_mut()),
                CUDA_ERROR_INVALID_CONTEXT
            );

            let mut primary: CUcontext = std::ptr::null_mut();
            assert_eq!(cuDevicePrimaryCtxRetain(&mut primary, dev), CUDA_SUCCESS);
            assert_eq!(cuCtxPushCurrent_v2(primary), CUDA_SUCCESS);
            let a = alloc_mem(2 << 20);
            let b = alloc_mem(1);
            let mut mip: CUmipmappedArray = std::ptr::null_mut();
            let d3 = CUDA_ARRAY3D_DESCRIPTOR {
                width: 16,
                height: 16,
                depth: 0,
                format: 0x01,
                num_channels: 1,
                flags: 0,
            };
            assert_eq!(cuMipmappedArrayCreate(&mut mip, &d3, 2), CUDA_SUCCESS);
            assert_eq!(stats::used(phys), before + 5000 + (2 << 20) + 1 + 256 + 64);

            assert_eq!(cuDevicePrimaryCtxReset_v2(dev), CUDA_SUCCESS);
            assert_eq!(stats::used(phys), before + 5000);
            assert_eq!(cuMemFree_v2(a), CUDA_ERROR_INVALID_VALUE);
            assert_eq!(cuMemFree_v2(b), CUDA_ERROR_INVALID_VALUE);
            assert_eq!(cuMipmappedArrayDestroy(mip), CUDA_ERROR_INVALID_HANDLE);
            // the primary context lives on (a reset is not a destruction) and allocates again
            let again = alloc_mem(100);
            assert_eq!(stats::used(phys), before + 5100);
            assert_eq!(cuDevicePrimaryCtxReset(dev), CUDA_SUCCESS);
            assert_eq!(cuMemFree_v2(again), CUDA_ERROR_INVALID_VALUE);
            assert_eq!(cuMemFree_v2(survivor), CUDA_SUCCESS);
            assert_eq!(stats::used(phys), before);
            let mut popped: CUcontext = std::ptr::null_mut();
            assert_eq!(cuCtxPopCurrent_v2(&mut popped), CUDA_SUCCESS);
            assert_eq!(cuCtxDestroy_v2(other), CUDA_SUCCESS);
        }
    }

    #[test]
    fn the_last_primary_release_frees_its_memory() {
        let _g = lock();
        unsafe {
            let (dev, phys) = last_device();
            let before = stats::used(phys);
            let mut primary: CUcontext = std::ptr::null_mut();
            assert_eq!(cuDevicePrimaryCtxRetain(&mut primary, dev), CUDA_SUCCESS);
            assert_eq!(cuDevicePrimaryCtxRetain(&mut primary, dev), CUDA_SUCCESS);
            assert_eq!(cuCtxPushCurrent_v2(primary), CUDA_SUCCESS);
            let a = alloc_mem(1 << 20);
            assert_eq!(cuDevicePrimaryCtxRelease_v2(dev), CUDA_SUCCESS);
            assert_eq!(stats::used(phys), before + (1 << 20), "still retained once");
            assert_eq!(cuDevicePrimaryCtxRelease(dev), CUDA_SUCCESS);
            assert_eq!(stats::used(phys), before, "the last release destroys it");
            assert_eq!(cuMemFree_v2(a), CUDA_ERROR_INVALID_VALUE);
            assert_eq!(cuDevicePrimaryCtxRelease(dev), CUDA_ERROR_INVALID_CONTEXT);
            let mut popped: CUcontext = std::ptr::null_mut();
            assert_eq!(cuCtxPopCurrent_v2(&mut popped), CUDA_SUCCESS);
        }
    }
}
