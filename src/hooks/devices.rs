//! Device ordinals while devices are split (`GPUSHIM_VIRTUAL_DEVICES`): the program speaks its
//! own ordinals (`CUdevice` handles equal them), the driver its own. These hooks are handed out
//! only while splitting is configured (the `split` flag in the table), and pass everything
//! through unchanged until the driver initialised (it then answers `CUDA_ERROR_NOT_INITIALIZED`).
//!
//! Parts of one GPU share its attributes, name and PCI bus id; each has its own UUID, memory
//! size and contexts. `cuDeviceCanAccessPeer` between parts of one GPU is 0, as between a GPU and
//! itself: their contexts are contexts of one GPU, between which the driver refuses peer access
//! (`cuCtxEnablePeerAccess`: `CUDA_ERROR_PEER_ACCESS_UNSUPPORTED`, seen on an H100), so a program
//! that asked and was told 1 (PyTorch's `.to()`) failed. Copies between their contexts
//! (`cuMemcpyPeer`, `cudaMemcpyPeer`, `cudaMemcpyAsync` of device memory) are copies within one
//! GPU and work.

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::driver::ffi::*;
use crate::state::State;

/// Runs `call` with the driver ordinal of program device `dev`, or answers
/// `CUDA_ERROR_INVALID_DEVICE` for an ordinal the program does not have.
#[inline]
fn on_driver(st: &State, dev: CUdevice, call: impl FnOnce(CUdevice) -> CUresult) -> CUresult {
    match st.driver_of(dev) {
        Some(d) => call(d),
        None => CUDA_ERROR_INVALID_DEVICE,
    }
}

pub unsafe fn get_count(st: &State, real: unsafe extern "C" fn(*mut c_int) -> CUresult, count: *mut c_int) -> CUresult {
    let result = real(count);
    if let (CUDA_SUCCESS, Some(d)) = (result, st.program_devices()) {
        *count = d.list.len() as c_int;
    }
    result
}

pub unsafe fn get(st: &State, real: unsafe extern "C" fn(*mut CUdevice, c_int) -> CUresult, dev: *mut CUdevice, ordinal: c_int) -> CUresult {
    let Some(d) = st.program_devices() else { return real(dev, ordinal) };
    if dev.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if d.get(ordinal).is_none() {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    *dev = ordinal;
    CUDA_SUCCESS
}

pub unsafe fn get_name(st: &State, real: unsafe extern "C" fn(*mut c_char, c_int, CUdevice) -> CUresult, name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    on_driver(st, dev, |d| real(name, len, d))
}

pub unsafe fn get_uuid(st: &State, real: unsafe extern "C" fn(*mut [u8; 16], CUdevice) -> CUresult, uuid: *mut [u8; 16], dev: CUdevice) -> CUresult {
    let result = on_driver(st, dev, |d| real(uuid, d));
    if let (CUDA_SUCCESS, Some(part)) = (result, st.part_uuid(dev)) {
        *uuid = part;
    }
    result
}

pub unsafe fn get_attribute(st: &State, real: unsafe extern "C" fn(*mut c_int, c_int, CUdevice) -> CUresult, value: *mut c_int, attr: c_int, dev: CUdevice) -> CUresult {
    on_driver(st, dev, |d| real(value, attr, d))
}

pub unsafe fn get_pci_bus_id(st: &State, real: unsafe extern "C" fn(*mut c_char, c_int, CUdevice) -> CUresult, id: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    on_driver(st, dev, |d| real(id, len, d))
}

pub unsafe fn get_by_pci_bus_id(st: &State, real: unsafe extern "C" fn(*mut CUdevice, *const c_char) -> CUresult, dev: *mut CUdevice, id: *const c_char) -> CUresult {
    let result = real(dev, id);
    if result == CUDA_SUCCESS && !dev.is_null() {
        *dev = st.program_of(*dev);
    }
    result
}

/// Both devices translated; parts of one GPU answer `same` without asking the driver.
unsafe fn pair(st: &State, a: CUdevice, b: CUdevice, same: impl FnOnce() -> CUresult, call: impl FnOnce(CUdevice, CUdevice) -> CUresult) -> CUresult {
    match (st.driver_of(a), st.driver_of(b)) {
        (Some(x), Some(y)) if x == y && a != b && st.program_devices().is_some() => same(),
        (Some(x), Some(y)) => call(x, y),
        _ => CUDA_ERROR_INVALID_DEVICE,
    }
}

pub unsafe fn can_access_peer(st: &State, real: unsafe extern "C" fn(*mut c_int, CUdevice, CUdevice) -> CUresult, can: *mut c_int, dev: CUdevice, peer: CUdevice) -> CUresult {
    let same = || {
        if can.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        *can = 0;
        CUDA_SUCCESS
    };
    pair(st, dev, peer, same, |x, y| real(can, x, y))
}

pub unsafe fn get_p2p_attribute(st: &State, real: unsafe extern "C" fn(*mut c_int, c_int, CUdevice, CUdevice) -> CUresult, value: *mut c_int, attr: c_int, src: CUdevice, dst: CUdevice) -> CUresult {
    let same = || {
        if value.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // PERFORMANCE_RANK (1) is 0; access (2), native atomics (3) and array access (4) are
        // not supported (no peer access between contexts of one GPU)
        *value = 0;
        CUDA_SUCCESS
    };
    pair(st, src, dst, same, |x, y| real(value, attr, x, y))
}

pub unsafe fn compute_capability(st: &State, real: unsafe extern "C" fn(*mut c_int, *mut c_int, CUdevice) -> CUresult, major: *mut c_int, minor: *mut c_int, dev: CUdevice) -> CUresult {
    on_driver(st, dev, |d| real(major, minor, d))
}

pub unsafe fn get_luid(st: &State, real: unsafe extern "C" fn(*mut c_char, *mut c_uint, CUdevice) -> CUresult, luid: *mut c_char, mask: *mut c_uint, dev: CUdevice) -> CUresult {
    on_driver(st, dev, |d| real(luid, mask, d))
}

pub unsafe fn get_mem_pool(st: &State, real: unsafe extern "C" fn(*mut CUmemoryPool, CUdevice) -> CUresult, pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult {
    on_driver(st, dev, |d| real(pool, d))
}

pub unsafe fn set_mem_pool(st: &State, real: unsafe extern "C" fn(CUdevice, CUmemoryPool) -> CUresult, dev: CUdevice, pool: CUmemoryPool) -> CUresult {
    on_driver(st, dev, |d| real(d, pool))
}

pub unsafe fn texture_1d_max_width(st: &State, real: unsafe extern "C" fn(*mut usize, c_int, c_uint, CUdevice) -> CUresult, max: *mut usize, format: c_int, channels: c_uint, dev: CUdevice) -> CUresult {
    on_driver(st, dev, |d| real(max, format, channels, d))
}

pub unsafe fn exec_affinity_support(st: &State, real: unsafe extern "C" fn(*mut c_int, c_int, CUdevice) -> CUresult, pi: *mut c_int, kind: c_int, dev: CUdevice) -> CUresult {
    on_driver(st, dev, |d| real(pi, kind, d))
}

pub unsafe fn graph_mem_trim(st: &State, real: unsafe extern "C" fn(CUdevice) -> CUresult, dev: CUdevice) -> CUresult {
    let result = on_driver(st, dev, |d| real(d));
    if result == CUDA_SUCCESS {
        st.settle_graph_pool(dev);
    }
    result
}

pub unsafe fn graph_mem_attribute(st: &State, real: unsafe extern "C" fn(CUdevice, c_int, *mut c_void) -> CUresult, dev: CUdevice, attr: c_int, value: *mut c_void) -> CUresult {
    on_driver(st, dev, |d| real(d, attr, value))
}

// --- contexts ---------------------------------------------------------------------------------

pub unsafe fn primary_retain(st: &State, real: unsafe extern "C" fn(*mut CUcontext, CUdevice) -> CUresult, ctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    let result = if st.program_devices().is_none() { real(ctx, dev) } else { st.retain_primary(dev, ctx) };
    if result == CUDA_SUCCESS && !ctx.is_null() {
        st.context_created(dev, *ctx);
    }
    result
}

/// Runs `teardown` (a release or reset of the driver's primary context of program device
/// `dev`) and, if that destroyed the context, forgets its reserve (`modes`).
fn primary_teardown(st: &State, dev: CUdevice, teardown: impl FnOnce(CUdevice) -> CUresult) -> CUresult {
    on_driver(st, dev, |d| {
        // (begun before the state probe: its retain and release may be the last release)
        let _teardown = match (st.pooled() || st.limits_apply()).then(|| st.teardown_begins()).transpose() {
            Ok(teardown) => teardown,
            Err(stuck) => return crate::platform::log::refuse("cuDevicePrimaryCtxRelease/Reset", stuck, CUDA_ERROR_NOT_PERMITTED),
        };
        let primary = if st.pooled() || st.limits_apply() || st.compute_paced() { st.active_primary(d) } else { None };
        let reserve = primary.filter(|_| st.pooled()).map(|c| st.context_id(c));
        let doomed = primary.map(|c| st.context_allocations(c));
        let result = teardown(d);
        if result == CUDA_SUCCESS && primary.is_some() && !st.primary_active(d) {
            if let Some(ctx) = primary {
                st.compute_forget_context(ctx, false);
            }
            if let Some(id) = reserve {
                st.forget_context_reserve(id);
            }
            if let Some(doomed) = doomed {
                st.credit_context(doomed);
            }
        }
        result
    })
}

pub unsafe fn primary_release(st: &State, real: unsafe extern "C" fn(CUdevice) -> CUresult, dev: CUdevice) -> CUresult {
    match st.part_primary_release(dev) {
        Some(r) => r,
        None => primary_teardown(st, dev, |d| real(d)),
    }
}

/// Resetting a part's own primary context keeps it (its memory stays counted until freed):
/// destroying it would take the part's allocations away from under other users of the GPU's
/// contexts. The GPU's first part resets the driver's primary context.
pub unsafe fn primary_reset(st: &State, real: unsafe extern "C" fn(CUdevice) -> CUresult, dev: CUdevice) -> CUresult {
    match st.part_primary_state(dev) {
        Some(_) => CUDA_SUCCESS,
        None => primary_teardown(st, dev, |d| real(d)),
    }
}

pub unsafe fn primary_get_state(st: &State, real: unsafe extern "C" fn(CUdevice, *mut c_uint, *mut c_int) -> CUresult, dev: CUdevice, flags: *mut c_uint, active: *mut c_int) -> CUresult {
    match st.part_primary_state(dev) {
        Some(_) if flags.is_null() || active.is_null() => CUDA_ERROR_INVALID_VALUE,
        Some((f, a)) => {
            *flags = f;
            *active = a as c_int;
            CUDA_SUCCESS
        }
        None => on_driver(st, dev, |d| real(d, flags, active)),
    }
}

pub unsafe fn primary_set_flags(st: &State, real: unsafe extern "C" fn(CUdevice, c_uint) -> CUresult, dev: CUdevice, flags: c_uint) -> CUresult {
    match st.part_primary_set_flags(dev, flags) {
        Some(r) => r,
        None => on_driver(st, dev, |d| real(d, flags)),
    }
}

/// A context the program creates on a part is remembered as that part's (if it cannot be, the
/// context is destroyed again and the creation refused: its allocations would be counted on
/// the wrong part).
fn created(st: &State, result: CUresult, ctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    if result == CUDA_SUCCESS && !ctx.is_null() {
        // SAFETY: the driver just wrote a context there.
        let ctx = unsafe { *ctx };
        if st.program_devices().is_some() {
            if let Err(stuck) = st.remember_context(ctx, dev) {
                if let Some(destroy) = st.api().ctx_destroy {
                    // SAFETY: the driver's cuCtxDestroy of the context it just created.
                    unsafe { destroy(ctx) };
                }
                return crate::platform::log::refuse("cuCtxCreate", stuck, CUDA_ERROR_OUT_OF_MEMORY);
            }
        }
        st.context_created(dev, ctx);
    }
    result
}

pub unsafe fn ctx_create_v2(st: &State, real: unsafe extern "C" fn(*mut CUcontext, c_uint, CUdevice) -> CUresult, ctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult {
    created(st, on_driver(st, dev, |d| real(ctx, flags, d)), ctx, dev)
}

pub unsafe fn ctx_create_v3(st: &State, real: unsafe extern "C" fn(*mut CUcontext, *mut c_void, c_int, c_uint, CUdevice) -> CUresult, ctx: *mut CUcontext, params: *mut c_void, n: c_int, flags: c_uint, dev: CUdevice) -> CUresult {
    created(st, on_driver(st, dev, |d| real(ctx, params, n, flags, d)), ctx, dev)
}

pub unsafe fn ctx_create_v4(st: &State, real: unsafe extern "C" fn(*mut CUcontext, *mut c_void, c_uint, CUdevice) -> CUresult, ctx: *mut CUcontext, params: *mut c_void, flags: c_uint, dev: CUdevice) -> CUresult {
    created(st, on_driver(st, dev, |d| real(ctx, params, flags, d)), ctx, dev)
}

pub unsafe fn ctx_destroy(st: &State, real: unsafe extern "C" fn(CUcontext) -> CUresult, ctx: CUcontext) -> CUresult {
    let id = (st.pooled() && !ctx.is_null()).then(|| st.context_id(ctx));
    let doomed = st.context_allocations(ctx);
    let _teardown = match st.limits_apply().then(|| st.teardown_begins()).transpose() {
        Ok(teardown) => teardown,
        Err(stuck) => return crate::platform::log::refuse("cuCtxDestroy", stuck, CUDA_ERROR_NOT_PERMITTED),
    };
    // (the pacer's events of the context are destroyed with it: forgotten first)
    st.compute_forget_context(ctx, true);
    let result = real(ctx);
    if result == CUDA_SUCCESS {
        st.forget_context(ctx);
        if let Some(id) = id {
            st.forget_context_reserve(id);
        }
        st.credit_context(doomed);
    }
    result
}

pub unsafe fn ctx_get_device(st: &State, real: unsafe extern "C" fn(*mut CUdevice) -> CUresult, dev: *mut CUdevice) -> CUresult {
    let result = real(dev);
    if result == CUDA_SUCCESS && !dev.is_null() && st.program_devices().is_some() {
        if let Some(d) = st.current_device() {
            *dev = d;
        }
    }
    result
}

/// CUDA 13's `cuCtxGetDevice_v2(device, ctx)`: the device of `ctx` (NULL: the current one).
pub unsafe fn ctx_get_device_v2(st: &State, real: unsafe extern "C" fn(*mut CUdevice, CUcontext) -> CUresult, dev: *mut CUdevice, ctx: CUcontext) -> CUresult {
    let result = real(dev, ctx);
    if result == CUDA_SUCCESS && !dev.is_null() && st.program_devices().is_some() {
        *dev = match (ctx.is_null(), st.part_of_context(ctx)) {
            (true, _) => st.current_device().unwrap_or(*dev),
            (false, Ok(Some(d))) => d,
            (false, Ok(None)) => st.program_of(*dev),
            (false, Err(stuck)) => return crate::platform::log::refuse("cuCtxGetDevice", stuck, CUDA_ERROR_NOT_PERMITTED),
        };
    }
    result
}

// --- memory locations -------------------------------------------------------------------------

/// A `CUmemLocation` with a device id translated to the driver's.
fn location_on_driver(st: &State, loc: CUmemLocation) -> Result<CUmemLocation, CUresult> {
    if loc.type_ != MEM_LOCATION_TYPE_DEVICE {
        return Ok(loc);
    }
    let id = st.driver_of(loc.id).ok_or(CUDA_ERROR_INVALID_DEVICE)?;
    Ok(CUmemLocation { id, ..loc })
}

pub unsafe fn allocation_granularity(st: &State, real: unsafe extern "C" fn(*mut usize, *const CUmemAllocationProp, c_int) -> CUresult, gran: *mut usize, prop: *const CUmemAllocationProp, option: c_int) -> CUresult {
    if prop.is_null() {
        return real(gran, prop, option);
    }
    match location_on_driver(st, (*prop).location) {
        Ok(location) => real(gran, &CUmemAllocationProp { location, ..*prop }, option),
        Err(e) => e,
    }
}

/// `CUmemAccessDesc`: a location and the access flags.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUmemAccessDesc {
    pub location: CUmemLocation,
    pub flags: c_int,
}

/// More access descriptors than any program could mean (one per location: devices, host, NUMA
/// nodes): a larger count is refused before reading any of them.
const MAX_ACCESS_DESCS: usize = 4096;

/// The caller's `count` descriptors with their locations translated. `count` is the caller's
/// and checked first: the slice is only built over at most [`MAX_ACCESS_DESCS`] entries, which
/// the driver would read as well.
unsafe fn descs_on_driver(st: &State, desc: *const CUmemAccessDesc, count: usize) -> Result<Vec<CUmemAccessDesc>, CUresult> {
    if count > MAX_ACCESS_DESCS || !desc.is_aligned() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: `desc` is non-NULL (checked by the callers) and aligned, `count` is bounded; the
    // caller promises `count` readable descriptors, as the driver's own reading assumes.
    std::slice::from_raw_parts(desc, count)
        .iter()
        .map(|d| Ok(CUmemAccessDesc { location: location_on_driver(st, d.location)?, flags: d.flags }))
        .collect()
}

pub unsafe fn set_access(st: &State, real: unsafe extern "C" fn(CUdeviceptr, usize, *const CUmemAccessDesc, usize) -> CUresult, ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize) -> CUresult {
    if desc.is_null() || count == 0 {
        return real(ptr, size, desc, count);
    }
    match descs_on_driver(st, desc, count) {
        Ok(v) => real(ptr, size, v.as_ptr(), count),
        Err(e) => e,
    }
}

pub unsafe fn pool_set_access(st: &State, real: unsafe extern "C" fn(CUmemoryPool, *const CUmemAccessDesc, usize) -> CUresult, pool: CUmemoryPool, desc: *const CUmemAccessDesc, count: usize) -> CUresult {
    if desc.is_null() || count == 0 {
        return real(pool, desc, count);
    }
    match descs_on_driver(st, desc, count) {
        Ok(v) => real(pool, v.as_ptr(), count),
        Err(e) => e,
    }
}

pub unsafe fn get_access(st: &State, real: unsafe extern "C" fn(*mut u64, *const CUmemLocation, CUdeviceptr) -> CUresult, flags: *mut u64, location: *const CUmemLocation, ptr: CUdeviceptr) -> CUresult {
    if location.is_null() {
        return real(flags, location, ptr);
    }
    match location_on_driver(st, *location) {
        Ok(loc) => real(flags, &loc, ptr),
        Err(e) => e,
    }
}

pub unsafe fn pool_get_access(st: &State, real: unsafe extern "C" fn(*mut c_int, CUmemoryPool, *const CUmemLocation) -> CUresult, flags: *mut c_int, pool: CUmemoryPool, location: *const CUmemLocation) -> CUresult {
    if location.is_null() {
        return real(flags, pool, location);
    }
    match location_on_driver(st, *location) {
        Ok(loc) => real(flags, pool, &loc),
        Err(e) => e,
    }
}

/// A device argument of the managed-memory calls: `CU_DEVICE_CPU` (-1) stays as it is.
fn device_or_cpu(st: &State, dev: CUdevice) -> Result<CUdevice, CUresult> {
    if dev < 0 {
        return Ok(dev);
    }
    st.driver_of(dev).ok_or(CUDA_ERROR_INVALID_DEVICE)
}

pub unsafe fn advise(st: &State, real: unsafe extern "C" fn(CUdeviceptr, usize, c_int, CUdevice) -> CUresult, ptr: CUdeviceptr, count: usize, advice: c_int, dev: CUdevice) -> CUresult {
    match device_or_cpu(st, dev) {
        Ok(d) => real(ptr, count, advice, d),
        Err(e) => e,
    }
}

pub unsafe fn advise_v2(st: &State, real: unsafe extern "C" fn(CUdeviceptr, usize, c_int, CUmemLocation) -> CUresult, ptr: CUdeviceptr, count: usize, advice: c_int, location: CUmemLocation) -> CUresult {
    match location_on_driver(st, location) {
        Ok(loc) => real(ptr, count, advice, loc),
        Err(e) => e,
    }
}

pub unsafe fn prefetch(st: &State, real: unsafe extern "C" fn(CUdeviceptr, usize, CUdevice, CUstream) -> CUresult, ptr: CUdeviceptr, count: usize, dev: CUdevice, stream: CUstream) -> CUresult {
    match device_or_cpu(st, dev) {
        Ok(d) => real(ptr, count, d, stream),
        Err(e) => e,
    }
}

pub unsafe fn prefetch_v2(st: &State, real: unsafe extern "C" fn(CUdeviceptr, usize, CUmemLocation, c_uint, CUstream) -> CUresult, ptr: CUdeviceptr, count: usize, location: CUmemLocation, flags: c_uint, stream: CUstream) -> CUresult {
    match location_on_driver(st, location) {
        Ok(loc) => real(ptr, count, loc, flags, stream),
        Err(e) => e,
    }
}

// --- pointers ---------------------------------------------------------------------------------

const POINTER_ATTRIBUTE_DEVICE_ORDINAL: c_int = 9;

/// The program's ordinal for an allocation the driver says is on `driver`: the part it was
/// counted on, else the GPU's first part.
fn pointer_device(st: &State, ptr: CUdeviceptr, driver: c_int) -> c_int {
    st.live_device(ptr).unwrap_or_else(|| st.program_of(driver))
}

pub unsafe fn pointer_get_attribute(st: &State, real: unsafe extern "C" fn(*mut c_void, c_int, CUdeviceptr) -> CUresult, data: *mut c_void, attr: c_int, ptr: CUdeviceptr) -> CUresult {
    let result = real(data, attr, ptr);
    if result == CUDA_SUCCESS && attr == POINTER_ATTRIBUTE_DEVICE_ORDINAL && !data.is_null() && st.program_devices().is_some() {
        let d = data.cast::<c_int>();
        *d = pointer_device(st, ptr, *d);
    }
    if result == CUDA_SUCCESS && st.pooled() {
        if let Some(error) = super::reserve::patch_attribute(st, attr, data, ptr, true) {
            return error;
        }
    }
    result
}

pub unsafe fn pointer_get_attributes(st: &State, real: unsafe extern "C" fn(c_uint, *const c_int, *mut *mut c_void, CUdeviceptr) -> CUresult, n: c_uint, attrs: *const c_int, data: *mut *mut c_void, ptr: CUdeviceptr) -> CUresult {
    let result = real(n, attrs, data, ptr);
    if result == CUDA_SUCCESS && !attrs.is_null() && !data.is_null() && (st.program_devices().is_some() || st.pooled()) {
        for i in 0..n as usize {
            let (attr, slot) = (*attrs.add(i), *data.add(i));
            if attr == POINTER_ATTRIBUTE_DEVICE_ORDINAL && !slot.is_null() && st.program_devices().is_some() {
                let d = slot.cast::<c_int>();
                if *d >= 0 {
                    *d = pointer_device(st, ptr, *d);
                }
            }
            super::reserve::patch_attribute(st, attr, slot, ptr, false);
        }
    }
    result
}
