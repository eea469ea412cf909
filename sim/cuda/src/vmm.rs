//! Virtual memory management: `cuMemCreate` handles, reserved address ranges and mappings.
//!
//! A handle with a device location holds its physical memory from `cuMemCreate` until it has
//! been released (`cuMemRelease` of the creator's reference and of every reference
//! `cuMemRetainAllocationHandle` added) *and* unmapped (every `cuMemMap` of it undone by
//! `cuMemUnmap`), as on the real driver: releasing a mapped handle only invalidates the handle
//! value. `cuMemAddressFree` of a range that still has mappings is refused. A
//! reservation is an anonymous read-write `MAP_NORESERVE` range, so mapped memory can be read
//! and written; `cuMemUnmap` discards the pages (contents are not shared between two mappings
//! of one handle).

use crate::devices::{self, phys_of};
use crate::memory::{self, PtrInfo};
use crate::stats;
use crate::types::*;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::{Mutex, MutexGuard};

pub const GRANULARITY: usize = 2 << 20;

struct Handle {
    size: usize,
    prop: CUmemAllocationProp,
    /// Physical device it is counted on, if any.
    physical: Option<usize>,
    ordinal: CUdevice,
    /// References: the creator's and one per retain; 0 once released (the handle value is then
    /// invalid, but the memory stays while mapped).
    refs: u64,
    /// Mappings of (part of) this handle.
    maps: u64,
}

#[derive(Clone, Copy)]
struct Mapping {
    size: usize,
    handle: u64,
    ordinal: CUdevice,
}

struct State {
    next_handle: u64,
    handles: BTreeMap<u64, Handle>,
    /// base -> size
    reservations: BTreeMap<usize, usize>,
    mappings: BTreeMap<usize, Mapping>,
}

// SAFETY: the raw pointer inside `CUmemAllocationProp` is an opaque value we only copy back.
unsafe impl Send for State {}

static STATE: Mutex<State> = Mutex::new(State {
    next_handle: 0x5100_0000_0001,
    handles: BTreeMap::new(),
    reservations: BTreeMap::new(),
    mappings: BTreeMap::new(),
});

fn lock() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

impl State {
    /// The reservation containing all of `[addr, addr+len)`.
    fn reservation_of(&self, addr: usize, len: usize) -> Option<(usize, usize)> {
        let (&b, &s) = self.reservations.range(..=addr).next_back()?;
        let end = addr.checked_add(len.max(1))?;
        (end <= b + s).then_some((b, s))
    }

    fn mapping_of(&self, addr: usize) -> Option<(usize, Mapping)> {
        let (&b, &m) = self.mappings.range(..=addr).next_back()?;
        (addr < b + m.size).then_some((b, m))
    }

    fn overlaps_mapping(&self, addr: usize, len: usize) -> bool {
        let end = addr + len;
        if let Some((b, m)) = self
            .mappings
            .range(..end)
            .next_back()
            .map(|(b, m)| (*b, *m))
        {
            return b + m.size > addr;
        }
        false
    }
}

/// `[addr, addr+len)` lies inside one reserved range.
pub fn contains(addr: usize, len: usize) -> bool {
    lock().reservation_of(addr, len).is_some()
}

/// Pointer attributes of an address inside a mapping.
pub fn ptr_info(addr: usize) -> Option<PtrInfo> {
    let (base, m) = lock().mapping_of(addr)?;
    Some(PtrInfo {
        base,
        size: m.size,
        memtype: 2,
        ctx: 0,
        ordinal: m.ordinal,
        managed: false,
        legacy_ipc: false,
        id: m.handle,
        pool: 0,
    })
}

impl State {
    /// The handle `h` if it is still referenced (not fully released).
    fn referenced(&mut self, h: u64) -> Option<&mut Handle> {
        self.handles.get_mut(&h).filter(|hd| hd.refs > 0)
    }

    /// Drops handle `h` if nothing references or maps it; returns what to credit.
    fn collect(&mut self, h: u64) -> Option<(usize, u64)> {
        let hd = self.handles.get(&h)?;
        if hd.refs > 0 || hd.maps > 0 {
            return None;
        }
        let hd = self.handles.remove(&h)?;
        hd.physical.map(|p| (p, hd.size as u64))
    }
}

fn release(h: u64) -> Res {
    let freed = {
        let mut st = lock();
        let hd = st.referenced(h).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        hd.refs -= 1;
        st.collect(h)
    };
    if let Some((p, size)) = freed {
        stats::release(p, size);
    }
    Ok(())
}

cu_api! {
    fn cuMemGetAllocationGranularity(granularity: *mut usize, prop: *const CUmemAllocationProp, option: i32) {
        let _ = option;
        get(prop)?;
        put(granularity, GRANULARITY)
    }

    /// Sizes must be multiples of the 2 MiB granularity. A device location counts the whole
    /// size on that device until the last cuMemRelease.
    fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: u64) {
        devices::visible()?;
        let pr = get(prop)?;
        if handle.is_null() || flags != 0 || size == 0 || !size.is_multiple_of(GRANULARITY) || pr.type_ != 1 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (physical, ordinal) = if pr.location.type_ == CU_MEM_LOCATION_TYPE_DEVICE {
            let p = phys_of(pr.location.id)?;
            stats::reserve(p.index, size as u64)?;
            (Some(p.index), pr.location.id)
        } else {
            (None, -1)
        };
        let h = {
            let mut st = lock();
            let h = st.next_handle;
            st.next_handle += 1;
            st.handles.insert(h, Handle { size, prop: pr, physical, ordinal, refs: 1, maps: 0 });
            h
        };
        put(handle, h)
    }

    fn cuMemRelease(handle: CUmemGenericAllocationHandle) {
        devices::visible()?;
        release(handle)
    }

    fn cuMemRetainAllocationHandle(handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void) {
        devices::visible()?;
        if handle.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut st = lock();
        let (_, m) = st.mapping_of(addr as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // a mapped handle can be retained again even after its creator released it
        let hd = st.handles.get_mut(&m.handle).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        hd.refs += 1;
        put(handle, m.handle)
    }

    fn cuMemGetAllocationPropertiesFromHandle(prop: *mut CUmemAllocationProp, handle: CUmemGenericAllocationHandle) {
        devices::visible()?;
        let pr = lock().referenced(handle).map(|h| h.prop).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        put(prop, pr)
    }

    fn cuMemAddressReserve(ptr: *mut CUdeviceptr, size: usize, alignment: usize, addr: CUdeviceptr, flags: u64) {
        devices::visible()?;
        let _ = addr; // a hint only
        if ptr.is_null() || size == 0 || flags != 0 || (alignment != 0 && !alignment.is_power_of_two()) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let align = alignment.max(GRANULARITY);
        let len = size.checked_add(memory::PAGE - 1).ok_or(CUDA_ERROR_OUT_OF_MEMORY)? & !(memory::PAGE - 1);
        let total = len.checked_add(align).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        let raw = memory::map_anon(total, false).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        let base = (raw + align - 1) & !(align - 1);
        if base > raw {
            memory::unmap(raw, base - raw);
        }
        if raw + total > base + len {
            memory::unmap(base + len, raw + total - (base + len));
        }
        lock().reservations.insert(base, len);
        put(ptr, base as CUdeviceptr)
    }

    fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) {
        devices::visible()?;
        let base = ptr as usize;
        let len = {
            let mut st = lock();
            let &len = st.reservations.get(&base).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            if size > len {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            // still mapped: unmap first (the memory stays held until then)
            if st.mappings.range(base..base + len).next().is_some() {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            st.reservations.remove(&base);
            len
        };
        memory::unmap(base, len);
        Ok(())
    }

    fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64) {
        devices::visible()?;
        let addr = ptr as usize;
        if size == 0 || flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut st = lock();
        let h = st.referenced(handle).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if offset.checked_add(size).is_none_or(|e| e > h.size) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let ordinal = h.ordinal;
        st.reservation_of(addr, size).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if st.overlaps_mapping(addr, size) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        st.mappings.insert(addr, Mapping { size, handle, ordinal });
        if let Some(h) = st.handles.get_mut(&handle) {
            h.maps += 1;
        }
        Ok(())
    }

    /// Unmaps every mapping inside `[ptr, ptr+size)`; one that straddles the range is an error.
    /// A handle released and no longer mapped frees its memory.
    fn cuMemUnmap(ptr: CUdeviceptr, size: usize) {
        devices::visible()?;
        let (addr, end) = (ptr as usize, (ptr as usize).checked_add(size).ok_or(CUDA_ERROR_INVALID_VALUE)?);
        let mut freed = Vec::new();
        {
            let mut st = lock();
            if let Some((b, m)) = st.mapping_of(addr) {
                if b < addr || b + m.size > end {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
            }
            let inside: Vec<(usize, Mapping)> = st.mappings.range(addr..end).map(|(b, m)| (*b, *m)).collect();
            if inside.is_empty() || inside.iter().any(|(b, m)| b + m.size > end) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            for (b, m) in inside {
                st.mappings.remove(&b);
                if let Some(h) = st.handles.get_mut(&m.handle) {
                    h.maps -= 1;
                }
                freed.extend(st.collect(m.handle));
            }
        }
        for (p, size) in freed {
            stats::release(p, size);
        }
        // Discard the pages, keeping the reserved range readable and writable.
        // SAFETY: the range lies inside a reservation this crate mapped.
        unsafe { libc::madvise(addr as *mut c_void, size, libc::MADV_DONTNEED) };
        Ok(())
    }

    fn cuMemSetAccess(ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize) {
        devices::visible()?;
        if count == 0 || desc.is_null() || !contains(ptr as usize, size) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        Ok(())
    }

    fn cuMemGetAccess(flags: *mut u64, location: *const CUmemLocation, ptr: CUdeviceptr) {
        devices::visible()?;
        let loc = get(location)?;
        let mapped = lock().mapping_of(ptr as usize).is_some();
        if !mapped {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        put(flags, if loc.type_ == CU_MEM_LOCATION_TYPE_DEVICE { 3 } else { 0 })
    }
}

// Shareable handles (`cuMemExportToShareableHandle`/`cuMemImportFromShareableHandle`) are not
// modelled: no OS handle (file descriptor, fabric handle) is ever made. A valid handle is
// answered `CUDA_ERROR_NOT_SUPPORTED`, as the driver does for a handle type the allocation or
// the platform does not support; an invalid one `CUDA_ERROR_INVALID_VALUE`.
cu_api! {
    fn cuMemExportToShareableHandle(shareable: *mut c_void, handle: CUmemGenericAllocationHandle, kind: i32, flags: u64) {
        devices::visible()?;
        let _ = kind;
        if shareable.is_null() || flags != 0 || lock().referenced(handle).is_none() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }

    fn cuMemImportFromShareableHandle(handle: *mut CUmemGenericAllocationHandle, os_handle: *mut c_void, kind: i32) {
        devices::visible()?;
        let _ = (os_handle, kind);
        if handle.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
}
