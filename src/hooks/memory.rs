//! Every way of getting device memory, counted against the device it lands on.
//!
//! What counts is what the program asked for: the requested bytes (the driver's own rounding
//! to its pages is not counted), pitch × height for pitched memory, the array formula below,
//! the size of a `cuMemCreate` from create to release. Bodies reserve before calling the driver
//! (`State::counted`) and credit after it freed (`State::uncounted`). A call whose out-pointers
//! are NULL is passed straight to the driver, which rejects it.
//!
//! Where a wait of the shim's bookkeeping gives up (`bounded`: CUDA called from a signal
//! handler that interrupted the shim), a call is refused before the driver's, or the driver's
//! call undone where it has an exact inverse (`state::undo_allocation`); what cannot be undone (a
//! release, an unmap) leaves the memory counted (closed).

use std::ffi::c_uint;

use gpushim_common::bounded::Stuck;
use crate::driver::ffi::*;
use crate::hooks::{Hook, REAL};
use crate::accounting::memory::Kind;
use crate::state::{free_driver_ptr, undo_allocation, State};

type Alloc = unsafe extern "C" fn(*mut CUdeviceptr, usize) -> CUresult;

pub unsafe fn alloc(st: &State, real: Alloc, dptr: *mut CUdeviceptr, bytes: usize) -> CUresult {
    if dptr.is_null() {
        return real(dptr, bytes);
    }
    if st.pooled() && bytes > 0 {
        if let Some(served) = st.serve("cuMemAlloc", bytes as u64) {
            return deliver(served, dptr);
        }
    }
    st.counted("cuMemAlloc", st.current_device(), bytes as u64, Kind::DevicePtr, None, || (real(dptr, bytes), *dptr))
}

pub unsafe fn alloc_v1(st: &State, real: unsafe extern "C" fn(*mut CUdeviceptr_v1, c_uint) -> CUresult, dptr: *mut CUdeviceptr_v1, bytes: c_uint) -> CUresult {
    if dptr.is_null() {
        return real(dptr, bytes);
    }
    st.counted("cuMemAlloc", st.current_device(), bytes as u64, Kind::DevicePtr, None, || (real(dptr, bytes), *dptr as u64))
}

pub unsafe fn alloc_managed(st: &State, real: unsafe extern "C" fn(*mut CUdeviceptr, usize, c_uint) -> CUresult, dptr: *mut CUdeviceptr, bytes: usize, flags: c_uint) -> CUresult {
    if dptr.is_null() {
        return real(dptr, bytes, flags);
    }
    st.counted("cuMemAllocManaged", st.current_device(), bytes as u64, Kind::DevicePtr, None, || (real(dptr, bytes, flags), *dptr))
}

/// Writes a served pointer out, or returns why it was refused.
unsafe fn deliver(served: Result<CUdeviceptr, CUresult>, dptr: *mut CUdeviceptr) -> CUresult {
    match served {
        Ok(p) => {
            *dptr = p;
            CUDA_SUCCESS
        }
        Err(e) => e,
    }
}

/// The pitch the driver will choose is not known before the call: reserve for the usual
/// 512-byte alignment, then settle on the real pitch × height (if the driver chose a larger
/// pitch and the difference does not fit, the allocation is undone and refused).
const PITCH_ALIGN: u64 = 512;

pub unsafe fn alloc_pitch(
    st: &State,
    real: unsafe extern "C" fn(*mut CUdeviceptr, *mut usize, usize, usize, c_uint) -> CUresult,
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> CUresult {
    if dptr.is_null() || pitch.is_null() {
        return real(dptr, pitch, width, height, elem);
    }
    let valid = width > 0 && height > 0 && matches!(elem, 4 | 8 | 16);
    let mut estimate = (width as u64).div_ceil(PITCH_ALIGN).saturating_mul(PITCH_ALIGN).saturating_mul(height as u64);
    // Served from the reserve: rows of `width` rounded up to 512 bytes, as the driver pitches
    // them. Invalid arguments (the driver accepts 4-, 8- and 16-byte elements) go to the driver
    // with nothing reserved up front, so that its own error comes back even when the limit is
    // fully reserved; should it succeed after all, `settle_pitch` counts the real size.
    if st.pooled() {
        if valid {
            if let Some(served) = st.serve("cuMemAllocPitch", estimate) {
                if served.is_ok() {
                    *pitch = (width as u64).div_ceil(PITCH_ALIGN) as usize * PITCH_ALIGN as usize;
                }
                return deliver(served, dptr);
            }
        } else {
            estimate = 0;
        }
    }
    let dev = st.current_device();
    let result = st.counted("cuMemAllocPitch", dev, estimate, Kind::DevicePtr, None, || (real(dptr, pitch, width, height, elem), *dptr));
    if result == CUDA_SUCCESS {
        return settle_pitch(st, dev, *dptr, (*pitch as u64).saturating_mul(height as u64));
    }
    result
}

pub unsafe fn alloc_pitch_v1(
    st: &State,
    real: unsafe extern "C" fn(*mut CUdeviceptr_v1, *mut c_uint, c_uint, c_uint, c_uint) -> CUresult,
    dptr: *mut CUdeviceptr_v1,
    pitch: *mut c_uint,
    width: c_uint,
    height: c_uint,
    elem: c_uint,
) -> CUresult {
    if dptr.is_null() || pitch.is_null() {
        return real(dptr, pitch, width, height, elem);
    }
    let estimate = (width as u64).div_ceil(PITCH_ALIGN) * PITCH_ALIGN * height as u64;
    let dev = st.current_device();
    let result = st.counted("cuMemAllocPitch", dev, estimate, Kind::DevicePtr, None, || (real(dptr, pitch, width, height, elem), *dptr as u64));
    if result == CUDA_SUCCESS {
        return settle_pitch(st, dev, *dptr as u64, *pitch as u64 * height as u64);
    }
    result
}

/// Replaces the estimate recorded for a pitched allocation with its real size. (Its entry was
/// recorded a moment ago, so its bucket is not this thread's: should the wait for it give up
/// even so, the estimate stays.)
fn settle_pitch(st: &State, dev: Option<CUdevice>, ptr: CUdeviceptr, actual: u64) -> CUresult {
    let (Some(dev), Ok(Some(live))) = (dev, st.live.remove(Kind::DevicePtr, ptr)) else { return CUDA_SUCCESS };
    let Some(budget) = st.budget(dev) else { return CUDA_SUCCESS };
    if actual <= live.bytes {
        budget.freed(live.bytes - actual);
    } else if budget.try_reserve(actual - live.bytes, st.limit(dev).unwrap_or(u64::MAX)).is_err() {
        // (no wait for room here: the driver has made the allocation already, and waiting
        // would leave its extra bytes uncounted meanwhile)
        st.report_refusal("cuMemAllocPitch", dev, actual);
        budget.freed(live.bytes);
        free_driver_ptr(ptr);
        return CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        budget.take(actual - live.bytes);
    }
    if let Err(stuck) = st.live.insert(Kind::DevicePtr, ptr, crate::accounting::memory::Live { bytes: actual, ..live }) {
        undo_allocation(Kind::DevicePtr, ptr);
        budget.freed(actual);
        budget.count_refusal();
        return crate::platform::log::refuse("cuMemAllocPitch", stuck, CUDA_ERROR_OUT_OF_MEMORY);
    }
    CUDA_SUCCESS
}

/// The driver's own function of `hook` (0: not resolved).
fn real_of(hook: Hook) -> usize {
    // (Acquire: pairs with `intercept::resolve_real`'s Release, as in `intercept::enter`)
    REAL[hook as usize].load(std::sync::atomic::Ordering::Acquire)
}

pub unsafe fn free(st: &State, real: unsafe extern "C" fn(CUdeviceptr) -> CUresult, dptr: CUdeviceptr) -> CUresult {
    st.uncounted(Kind::DevicePtr, dptr, None, || real(dptr))
}

pub unsafe fn free_v1(st: &State, real: unsafe extern "C" fn(CUdeviceptr_v1) -> CUresult, dptr: CUdeviceptr_v1) -> CUresult {
    st.uncounted(Kind::DevicePtr, dptr as u64, None, || real(dptr))
}

// --- stream-ordered ---------------------------------------------------------------------------

pub unsafe fn alloc_async(st: &State, real: unsafe extern "C" fn(*mut CUdeviceptr, usize, CUstream) -> CUresult, dptr: *mut CUdeviceptr, bytes: usize, stream: CUstream) -> CUresult {
    if dptr.is_null() || st.capturing(stream) {
        // (captured: a node of the graph, counted when the graph is launched: `graphs`)
        return real(dptr, bytes, stream);
    }
    let result = st.counted("cuMemAllocAsync", st.stream_device(stream), bytes as u64, Kind::DevicePtr, Some(stream), || (real(dptr, bytes, stream), *dptr));
    refused_unserved(st, result, "cuMemAllocAsync");
    result
}

pub unsafe fn alloc_from_pool_async(
    st: &State,
    real: unsafe extern "C" fn(*mut CUdeviceptr, usize, CUmemoryPool, CUstream) -> CUresult,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    if dptr.is_null() || st.capturing(stream) {
        return real(dptr, bytes, pool, stream);
    }
    // (a pool whose device cannot be looked up, or remembered, is refused: what it keeps after
    // frees would not be read)
    let dev = match pool_device(st, pool) {
        Ok(Some(dev)) => Some(dev),
        Ok(None) => match st.stream_device(stream) {
            Some(dev) => match remember_pool(st, pool, dev) {
                Ok(()) => Some(dev),
                Err(stuck) => return crate::platform::log::refuse("cuMemAllocFromPoolAsync", stuck, CUDA_ERROR_OUT_OF_MEMORY),
            },
            None => None,
        },
        Err(stuck) => return crate::platform::log::refuse("cuMemAllocFromPoolAsync", stuck, CUDA_ERROR_OUT_OF_MEMORY),
    };
    let result = st.counted("cuMemAllocFromPoolAsync", dev, bytes as u64, Kind::DevicePtr, Some(stream), || (real(dptr, bytes, pool, stream), *dptr));
    refused_unserved(st, result, "cuMemAllocFromPoolAsync");
    result
}

pub unsafe fn free_async(st: &State, real: unsafe extern "C" fn(CUdeviceptr, CUstream) -> CUresult, dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    st.uncounted(Kind::DevicePtr, dptr, Some(stream), || real(dptr, stream))
}

/// The program device a pool allocates on: a pool the program created, else a device's own
/// (default or current) pool, asked of the driver once and remembered.
fn pool_device(st: &State, pool: CUmemoryPool) -> Result<Option<CUdevice>, Stuck> {
    {
        let pools = st.pools.lock()?;
        if let Some(&(_, d)) = pools.iter().find(|(p, _)| *p == pool as usize) {
            return Ok(Some(d));
        }
    }
    let Some(dev) = st.device_of_pool(pool) else { return Ok(None) };
    remember_pool(st, pool, dev)?;
    Ok(Some(dev))
}

/// Records `pool` as allocating on `dev`, so that what it keeps after frees is read from it
/// (`pools`); a pool no device owns is remembered on the device its allocations are counted on.
fn remember_pool(st: &State, pool: CUmemoryPool, dev: CUdevice) -> Result<(), Stuck> {
    let mut pools = st.pools.lock()?;
    if !pools.iter().any(|(p, _)| *p == pool as usize) {
        pools.push((pool as usize, dev));
    }
    Ok(())
}

pub unsafe fn pool_create(st: &State, real: unsafe extern "C" fn(*mut CUmemoryPool, *const CUmemPoolPropsPrefix) -> CUresult, pool: *mut CUmemoryPool, props: *const CUmemPoolPropsPrefix) -> CUresult {
    let result = match on_driver_pool_props(st, props) {
        Err(e) => return e,
        Ok(Some(copy)) => real(pool, copy.as_ptr().cast()),
        Ok(None) => real(pool, props),
    };
    if result == CUDA_SUCCESS && !pool.is_null() && !props.is_null() && (*props).location.type_ == MEM_LOCATION_TYPE_DEVICE {
        if let Err(stuck) = st.pools.lock().map(|mut pools| pools.push((*pool as usize, (*props).location.id))) {
            // a pool the shim does not know would keep memory it cannot see: undone, refused
            let destroy = real_of(Hook::cuMemPoolDestroy);
            if destroy != 0 {
                // SAFETY: the driver's cuMemPoolDestroy of the pool it just created.
                std::mem::transmute::<usize, unsafe extern "C" fn(CUmemoryPool) -> CUresult>(destroy)(*pool);
            }
            return crate::platform::log::refuse("cuMemPoolCreate", stuck, CUDA_ERROR_OUT_OF_MEMORY);
        }
    }
    result
}

/// `sizeof(CUmemPoolProps)` (unchanged since CUDA 11.2: the fields grew into its reserved bytes).
const POOL_PROPS_SIZE: usize = 88;

/// The pool properties with the location translated to the driver's ordinal, when devices are
/// split and the pool lives on a device; `None`: pass the program's own.
unsafe fn on_driver_pool_props(st: &State, props: *const CUmemPoolPropsPrefix) -> Result<Option<[u64; POOL_PROPS_SIZE / 8]>, CUresult> {
    if props.is_null() || st.program_devices().is_none() || (*props).location.type_ != MEM_LOCATION_TYPE_DEVICE {
        return Ok(None);
    }
    let driver = st.driver_of((*props).location.id).ok_or(CUDA_ERROR_INVALID_DEVICE)?;
    let mut copy = [0u64; POOL_PROPS_SIZE / 8];
    std::ptr::copy_nonoverlapping(props.cast::<u8>(), copy.as_mut_ptr().cast::<u8>(), POOL_PROPS_SIZE);
    (*copy.as_mut_ptr().cast::<CUmemPoolPropsPrefix>()).location.id = driver;
    Ok(Some(copy))
}

/// The pool is forgotten only once the driver destroyed it (what it kept is then gone with it).
pub unsafe fn pool_destroy(st: &State, real: unsafe extern "C" fn(CUmemoryPool) -> CUresult, pool: CUmemoryPool) -> CUresult {
    let result = real(pool);
    if result == CUDA_SUCCESS {
        // (if the list cannot be had the pool stays in it: its figures cannot be read, and
        // nothing the device's pools keep is credited until then: closed)
        if let Ok(mut pools) = st.pools.lock() {
            pools.retain(|(p, _)| *p != pool as usize);
        }
    }
    result
}

// --- virtual memory management ----------------------------------------------------------------

pub unsafe fn vmm_create(
    st: &State,
    real: unsafe extern "C" fn(*mut CUmemGenericAllocationHandle, usize, *const CUmemAllocationProp, u64) -> CUresult,
    handle: *mut CUmemGenericAllocationHandle,
    bytes: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> CUresult {
    if handle.is_null() || prop.is_null() || (*prop).location.type_ != MEM_LOCATION_TYPE_DEVICE {
        return real(handle, bytes, prop, flags);
    }
    let dev = (*prop).location.id;
    let Some(driver) = st.driver_of(dev) else { return CUDA_ERROR_INVALID_DEVICE };
    let mut on_driver = *prop;
    on_driver.location.id = driver;
    let result = st.counted("cuMemCreate", Some(dev), bytes as u64, Kind::VmmHandle, None, || (real(handle, bytes, &on_driver, flags), *handle));
    if result == CUDA_SUCCESS {
        if let Err(stuck) = crate::accounting::vmm::created(*handle) {
            // (untracked, its release would be credited while it is still mapped: undone)
            let entry = st.live.remove(Kind::VmmHandle, *handle);
            undo_allocation(Kind::VmmHandle, *handle);
            if let Ok(Some(live)) = entry {
                st.credit_freed(live.device, live.bytes, live.bytes);
            }
            return crate::platform::log::refuse("cuMemCreate", stuck, CUDA_ERROR_OUT_OF_MEMORY);
        }
    }
    refused_unserved(st, result, "cuMemCreate");
    result
}

/// A handle the shim counted is credited once the driver freed it: released (every reference)
/// and unmapped (`crate::accounting::vmm`). Unknown handles go to the driver as they are.
pub unsafe fn vmm_release(st: &State, real: unsafe extern "C" fn(CUmemGenericAllocationHandle) -> CUresult, handle: CUmemGenericAllocationHandle) -> CUresult {
    let refuse = |stuck| crate::platform::log::refuse("cuMemRelease", stuck, CUDA_ERROR_NOT_PERMITTED);
    match crate::accounting::vmm::known(handle) {
        Ok(true) => {}
        Ok(false) => return st.uncounted(Kind::VmmHandle, handle, None, || real(handle)),
        Err(stuck) => return refuse(stuck),
    }
    // The entry as it is before the driver frees anything: once the memory is free, the driver
    // may hand the same handle value to another thread's cuMemCreate at once, whose new entry
    // must not be taken for this one.
    let entry = match st.live.get(Kind::VmmHandle, handle) {
        Ok(entry) => entry,
        Err(stuck) => return refuse(stuck),
    };
    // (another thread handed this handle's value or addresses meanwhile must not credit the
    // old memory before the driver's release has returned: `teardown`)
    let _freeing = match st.teardown_begins() {
        Ok(t) => t,
        Err(stuck) => return refuse(stuck),
    };
    let result = real(handle);
    // (a release whose bookkeeping cannot be done after the driver's leaves the handle counted)
    if result == CUDA_SUCCESS && crate::accounting::vmm::released(handle).unwrap_or(false) {
        credit_vmm(st, handle, entry);
    }
    result
}

/// Credits the entry a handle had before its memory was freed, unless a newer one replaced it
/// (the replacement credited it then).
fn credit_vmm(st: &State, handle: CUmemGenericAllocationHandle, entry: Option<crate::accounting::memory::Live>) {
    if let Some(live) = entry {
        if st.live.remove_if(Kind::VmmHandle, handle, &live).is_ok_and(|r| r.is_some()) {
            st.credit_stale(live);
        }
    }
}

/// `cuMemExportToShareableHandle`: an exported handle's memory can be kept alive by whoever
/// imports it, where the shim cannot see: it stays counted until the process exits.
pub unsafe fn vmm_export(st: &State, real: unsafe extern "C" fn(*mut std::ffi::c_void, CUmemGenericAllocationHandle, std::ffi::c_int, u64) -> CUresult, shareable: *mut std::ffi::c_void, handle: CUmemGenericAllocationHandle, kind: std::ffi::c_int, flags: u64) -> CUresult {
    // (checked first: an export the shim could not record would be credited at release while
    // an importer may keep the memory)
    if st.limits_apply() {
        if let Err(stuck) = crate::accounting::vmm::known(handle) {
            return crate::platform::log::refuse("cuMemExportToShareableHandle", stuck, CUDA_ERROR_NOT_PERMITTED);
        }
    }
    let result = real(shareable, handle, kind, flags);
    if result == CUDA_SUCCESS && st.limits_apply() {
        if let Err(stuck) = crate::accounting::vmm::exported(handle) {
            crate::platform::log::stuck("recording an exported handle (it may be credited at its release)", stuck);
        }
    }
    result
}

pub unsafe fn vmm_map(
    _st: &State,
    real: unsafe extern "C" fn(CUdeviceptr, usize, usize, CUmemGenericAllocationHandle, u64) -> CUresult,
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: u64,
) -> CUresult {
    let result = real(ptr, size, offset, handle, flags);
    if result == CUDA_SUCCESS {
        if let Err(stuck) = crate::accounting::vmm::mapped(ptr, size as u64, handle) {
            // (unrecorded, its handle's release would be credited while mapped: undone)
            let unmap = real_of(Hook::cuMemUnmap);
            if unmap != 0 {
                // SAFETY: the driver's cuMemUnmap of the range it just mapped.
                std::mem::transmute::<usize, unsafe extern "C" fn(CUdeviceptr, usize) -> CUresult>(unmap)(ptr, size);
            }
            return crate::platform::log::refuse("cuMemMap", stuck, CUDA_ERROR_NOT_PERMITTED);
        }
    }
    result
}

pub unsafe fn vmm_unmap(st: &State, real: unsafe extern "C" fn(CUdeviceptr, usize) -> CUresult, ptr: CUdeviceptr, size: usize) -> CUresult {
    // (entries as they are before the driver frees anything: see `vmm_release`)
    let entries = crate::accounting::vmm::mapped_handles(ptr, size as u64).and_then(|handles| {
        let mut entries: Vec<(u64, crate::accounting::memory::Live)> = Vec::new();
        for h in handles {
            if let Some(live) = st.live.get(Kind::VmmHandle, h)? {
                entries.push((h, live));
            }
        }
        Ok(entries)
    });
    let (entries, _freeing) = match entries.and_then(|e| Ok((e, st.teardown_begins()?))) {
        Ok(both) => both,
        Err(stuck) => return crate::platform::log::refuse("cuMemUnmap", stuck, CUDA_ERROR_NOT_PERMITTED),
    };
    let result = real(ptr, size);
    if result == CUDA_SUCCESS {
        // (an unmap whose bookkeeping cannot be done after the driver's leaves its handles counted)
        for handle in crate::accounting::vmm::unmapped(ptr, size as u64).unwrap_or_default() {
            credit_vmm(st, handle, entries.iter().find(|(h, _)| *h == handle).map(|&(_, l)| l));
        }
    }
    result
}

pub unsafe fn vmm_retain(
    _st: &State,
    real: unsafe extern "C" fn(*mut CUmemGenericAllocationHandle, *mut std::ffi::c_void) -> CUresult,
    handle: *mut CUmemGenericAllocationHandle,
    addr: *mut std::ffi::c_void,
) -> CUresult {
    let result = real(handle, addr);
    if result == CUDA_SUCCESS && !handle.is_null() {
        if let Err(stuck) = crate::accounting::vmm::retained(*handle) {
            // (uncounted, the reference's release would credit the handle early: undone)
            let release = real_of(Hook::cuMemRelease);
            if release != 0 {
                // SAFETY: the driver's cuMemRelease of the reference it just handed out.
                std::mem::transmute::<usize, unsafe extern "C" fn(CUmemGenericAllocationHandle) -> CUresult>(release)(*handle);
            }
            return crate::platform::log::refuse("cuMemRetainAllocationHandle", stuck, CUDA_ERROR_NOT_PERMITTED);
        }
    }
    result
}

/// Says once why preallocate refused a stream-ordered or VMM allocation.
fn refused_unserved(st: &State, result: CUresult, what: &str) {
    if result == CUDA_ERROR_OUT_OF_MEMORY {
        st.explain_unserved_refusal(what);
    }
}

// --- arrays -----------------------------------------------------------------------------------

/// Bytes per channel of a `CUarray_format`. Formats not listed (block-compressed, video and
/// packed normalised formats) count 4 bytes per channel.
pub fn format_bytes(format: c_uint) -> u64 {
    match format {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        _ => 4,
    }
}

/// W × max(H,1) × max(D,1) × channels × bytes per channel, saturating.
pub fn array_bytes(width: usize, height: usize, depth: usize, channels: c_uint, format: c_uint) -> u64 {
    [width as u64, height.max(1) as u64, depth.max(1) as u64, channels as u64, format_bytes(format)]
        .into_iter()
        .fold(1u64, |acc, f| acc.saturating_mul(f))
}

/// The sum over mip levels; layered and cubemap arrays keep their depth (layer count) at every level.
pub fn mipmapped_bytes(d: &CUDA_ARRAY3D_DESCRIPTOR, levels: c_uint) -> u64 {
    let keep_depth = d.Flags & (ARRAY3D_LAYERED | ARRAY3D_CUBEMAP) != 0;
    let shrink = |v: usize, l: u32| (v.max(1) >> l.min(63)).max(1);
    (0..levels.min(64)).fold(0u64, |acc, l| {
        let depth = if keep_depth { d.Depth.max(1) } else { shrink(d.Depth, l) };
        acc.saturating_add(array_bytes(shrink(d.Width, l), shrink(d.Height, l), depth, d.NumChannels, d.Format))
    })
}

pub unsafe fn array_create(st: &State, real: unsafe extern "C" fn(*mut CUarray, *const CUDA_ARRAY_DESCRIPTOR) -> CUresult, array: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR) -> CUresult {
    if array.is_null() || desc.is_null() {
        return real(array, desc);
    }
    let d = *desc;
    let bytes = array_bytes(d.Width, d.Height, 1, d.NumChannels, d.Format);
    st.counted("cuArrayCreate", st.current_device(), bytes, Kind::Array, None, || (real(array, desc), *array as u64))
}

pub unsafe fn array3d_create(st: &State, real: unsafe extern "C" fn(*mut CUarray, *const CUDA_ARRAY3D_DESCRIPTOR) -> CUresult, array: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR) -> CUresult {
    if array.is_null() || desc.is_null() {
        return real(array, desc);
    }
    let d = *desc;
    let bytes = array_bytes(d.Width, d.Height, d.Depth, d.NumChannels, d.Format);
    st.counted("cuArray3DCreate", st.current_device(), bytes, Kind::Array, None, || (real(array, desc), *array as u64))
}

pub unsafe fn array_destroy(st: &State, real: unsafe extern "C" fn(CUarray) -> CUresult, array: CUarray) -> CUresult {
    st.uncounted(Kind::Array, array as u64, None, || real(array))
}

pub unsafe fn mipmapped_create(
    st: &State,
    real: unsafe extern "C" fn(*mut CUmipmappedArray, *const CUDA_ARRAY3D_DESCRIPTOR, c_uint) -> CUresult,
    array: *mut CUmipmappedArray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
    levels: c_uint,
) -> CUresult {
    if array.is_null() || desc.is_null() {
        return real(array, desc, levels);
    }
    let bytes = mipmapped_bytes(&*desc, levels);
    st.counted("cuMipmappedArrayCreate", st.current_device(), bytes, Kind::MipmappedArray, None, || (real(array, desc, levels), *array as u64))
}

pub unsafe fn mipmapped_destroy(st: &State, real: unsafe extern "C" fn(CUmipmappedArray) -> CUresult, array: CUmipmappedArray) -> CUresult {
    st.uncounted(Kind::MipmappedArray, array as u64, None, || real(array))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_sizes() {
        assert_eq!(array_bytes(1024, 0, 0, 4, 0x20), 16 * 1024);
        assert_eq!(array_bytes(100, 10, 3, 2, 0x10), 100 * 10 * 3 * 2 * 2);
        assert_eq!(array_bytes(usize::MAX, 2, 1, 1, 1), u64::MAX);
        let d = CUDA_ARRAY3D_DESCRIPTOR { Width: 8, Height: 4, Depth: 0, Format: 0x01, NumChannels: 1, Flags: 0 };
        assert_eq!(mipmapped_bytes(&d, 4), 32 + 8 + 2 + 1);
        let layered = CUDA_ARRAY3D_DESCRIPTOR { Depth: 3, Flags: ARRAY3D_LAYERED, ..d };
        assert_eq!(mipmapped_bytes(&layered, 2), 3 * 32 + 3 * 8);
    }
}
