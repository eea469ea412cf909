//! NVML shows the program's view too: the same devices in the same order as CUDA (NVML itself
//! ignores `CUDA_VISIBLE_DEVICES`), hidden devices unreachable by index, UUID, PCI bus id or
//! serial, and memory totals equal to each device's limit.

use std::ffi::{c_char, c_int, c_uint};

use crate::driver::NvmlDevice;
use crate::state::State;

const NVML_SUCCESS: c_int = 0;
const NVML_ERROR_INVALID_ARGUMENT: c_int = 2;
const NVML_ERROR_NOT_FOUND: c_int = 6;

/// `nvmlMemory_t`.
#[repr(C)]
pub struct NvmlMemory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct NvmlMemoryV2 {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// The place of an NVML device handle in the list NVML shows the program. `None`: a device
/// hidden from the program.
fn index_of(st: &State, dev: NvmlDevice) -> Option<usize> {
    position(st, st.view()?, dev)
}

/// The CUDA ordinal of an NVML device handle (whose limit NVML reports). `None`: a device
/// CUDA does not show the program.
fn cuda_ordinal_of(st: &State, dev: NvmlDevice) -> Option<usize> {
    position(st, st.cuda_ordinals()?, dev)
}

fn position(st: &State, view: &crate::view::View, dev: NvmlDevice) -> Option<usize> {
    let uuid = st.nvml_api()?.uuid_of(dev)?;
    let inventory = st.inventory()?;
    view.devices.iter().position(|&p| inventory[p].uuid == uuid)
}

pub unsafe fn get_count(st: &State, real: unsafe extern "C" fn(*mut c_uint) -> c_int, count: *mut c_uint) -> c_int {
    let Some(view) = st.view() else { return real(count) };
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *count = view.devices.len() as c_uint;
    NVML_SUCCESS
}

pub unsafe fn handle_by_index(st: &State, real: unsafe extern "C" fn(c_uint, *mut NvmlDevice) -> c_int, index: c_uint, dev: *mut NvmlDevice) -> c_int {
    let Some(view) = st.view() else { return real(index, dev) };
    if dev.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    let physical = view.devices.get(index as usize).and_then(|&p| st.inventory()?.get(p));
    match physical.and_then(|p| st.nvml_api()?.handle_of(&p.uuid)) {
        Some(handle) => {
            *dev = handle;
            NVML_SUCCESS
        }
        None => NVML_ERROR_INVALID_ARGUMENT,
    }
}

/// The lookups by UUID, PCI bus id and serial: the driver's answer, unless it is hidden.
pub unsafe fn handle_by_key(st: &State, real: unsafe extern "C" fn(*const c_char, *mut NvmlDevice) -> c_int, key: *const c_char, dev: *mut NvmlDevice) -> c_int {
    let result = real(key, dev);
    if result == NVML_SUCCESS && !dev.is_null() && st.view().is_some() && index_of(st, *dev).is_none() {
        *dev = std::ptr::null_mut();
        return NVML_ERROR_NOT_FOUND;
    }
    result
}

pub unsafe fn get_index(st: &State, real: unsafe extern "C" fn(NvmlDevice, *mut c_uint) -> c_int, dev: NvmlDevice, index: *mut c_uint) -> c_int {
    if st.view().is_none() || index.is_null() {
        return real(dev, index);
    }
    match index_of(st, dev) {
        Some(i) => {
            *index = i as c_uint;
            NVML_SUCCESS
        }
        None => NVML_ERROR_NOT_FOUND,
    }
}

/// (total, used, free) within the device's limit: used never above it, free never below 0.
fn clamp(st: &State, dev: NvmlDevice, total: u64, used: u64, free: u64) -> (u64, u64, u64) {
    let Some(ordinal) = cuda_ordinal_of(st, dev) else { return (total, used, free) };
    let limit = st.settings.limit_for(ordinal as u32).resolve(total);
    let used = used.min(limit);
    (limit, used, (limit - used).min(free))
}

pub unsafe fn memory_info(st: &State, real: unsafe extern "C" fn(NvmlDevice, *mut NvmlMemory) -> c_int, dev: NvmlDevice, mem: *mut NvmlMemory) -> c_int {
    let result = real(dev, mem);
    if result == NVML_SUCCESS && !mem.is_null() {
        let m = &mut *mem;
        (m.total, m.used, m.free) = clamp(st, dev, m.total, m.used, m.free);
    }
    result
}

pub unsafe fn memory_info_v2(st: &State, real: unsafe extern "C" fn(NvmlDevice, *mut NvmlMemoryV2) -> c_int, dev: NvmlDevice, mem: *mut NvmlMemoryV2) -> c_int {
    let result = real(dev, mem);
    if result == NVML_SUCCESS && !mem.is_null() {
        let m = &mut *mem;
        // Reserved memory (the driver's own) is part of the total on both sides.
        let (total, used, free) = clamp(st, dev, m.total, m.used.saturating_add(m.reserved), m.free);
        m.reserved = m.reserved.min(used);
        (m.total, m.used, m.free) = (total, used - m.reserved, free);
    }
    result
}
