//! NVML shows the program's view too: the same devices in the same order as CUDA (NVML itself
//! ignores `CUDA_VISIBLE_DEVICES`), hidden devices unreachable by index, UUID, PCI bus id or
//! serial, and memory totals equal to each device's limit.
//!
//! While devices are split (`GPUSHIM_VIRTUAL_DEVICES`), NVML shows the program's devices
//! ([`State::nvml_parts`]): each part of a split GPU is a device of its own, with its own index,
//! a derived UUID and its size as memory total, reached through a fake handle
//! (`nvml_virtual`); every function below accepts those. Functions not hooked here get the
//! part's GPU (name, PCI info, temperature …) through the trampolines of `nvml_virtual`. A real
//! handle of a split GPU (NVML can hand one out, e.g. `nvmlDeviceGetTopologyNearestGpus`) stands
//! for its first part.

use std::ffi::{c_char, c_int, c_uint, CStr};

use crate::driver::NvmlDevice;
use crate::hooks::nvml_virtual;
use crate::devices::split::NvmlPart;
use crate::state::State;

const NVML_SUCCESS: c_int = 0;
const NVML_ERROR_INVALID_ARGUMENT: c_int = 2;
const NVML_ERROR_NOT_FOUND: c_int = 6;
const NVML_ERROR_INSUFFICIENT_SIZE: c_int = 7;

/// `nvmlInit`, `nvmlInit_v2` (`first` in the table: the shim has started): NVML's own.
pub unsafe fn init(real: unsafe extern "C" fn() -> c_int) -> c_int {
    real()
}

/// `nvmlInitWithFlags`, likewise.
pub unsafe fn init_with_flags(real: unsafe extern "C" fn(c_uint) -> c_int, flags: c_uint) -> c_int {
    real(flags)
}

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

/// `nvmlUUID_v1_t`.
#[repr(C)]
struct NvmlUuidV1 {
    version: c_uint,
    kind: c_uint,
    value: [u8; 41],
}

/// `nvmlUUID_v1`: `NVML_STRUCT_VERSION(UUID, 1)`.
const NVML_UUID_V1: c_uint = std::mem::size_of::<NvmlUuidV1>() as c_uint | (1 << 24);
const NVML_UUID_TYPE_ASCII: c_uint = 1;
const NVML_UUID_TYPE_BINARY: c_uint = 2;

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

fn position(st: &State, view: &crate::devices::view::View, dev: NvmlDevice) -> Option<usize> {
    let physical = physical_of(st, dev)?;
    view.devices.iter().position(|&p| p == physical)
}

/// The inventory index of a real NVML handle.
fn physical_of(st: &State, dev: NvmlDevice) -> Option<usize> {
    let uuid = st.nvml_api()?.uuid_of(dev)?;
    st.inventory()?.iter().position(|d| d.uuid == uuid)
}

// ---------------------------------------------------------------------------------------------
// The program's devices while splitting

/// The list NVML shows while devices are split (`None`: nothing split, or the list could not be
/// built; NVML then shows the view as without splitting, and no fake handle exists).
fn parts(st: &State) -> Option<&[NvmlPart]> {
    st.nvml_parts().map(|v| v.as_slice())
}

/// The program ordinal `dev` stands for: a fake handle its part's; a real handle its GPU's
/// first device in the list (the first part of a split GPU). `None`: a hidden device.
fn ordinal_in(st: &State, parts: &[NvmlPart], dev: NvmlDevice) -> Option<usize> {
    if let Some(i) = nvml_virtual::fake_ordinal(dev) {
        return (i < parts.len()).then_some(i);
    }
    let physical = physical_of(st, dev)?;
    parts.iter().position(|p| p.physical == physical)
}

/// The handle the program gets for program device `i`, given the real handle of its GPU: a
/// fake handle for a part (the real one where none can be made), the real one otherwise.
fn handle_for(parts: &[NvmlPart], i: usize, real: NvmlDevice) -> NvmlDevice {
    match parts.get(i).and_then(|p| p.part) {
        Some(_) => nvml_virtual::fake(i, real).unwrap_or(real),
        None => real,
    }
}

/// Writes `s` as NVML writes strings: NUL-terminated, `INSUFFICIENT_SIZE` if it does not fit.
unsafe fn write_string(s: &str, buf: *mut c_char, len: c_uint) -> c_int {
    if buf.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (len as usize) < s.len() + 1 {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    std::ptr::copy_nonoverlapping(s.as_ptr(), buf as *mut u8, s.len());
    *buf.add(s.len()) = 0;
    NVML_SUCCESS
}

/// A looked-up real handle, as the program may see it: the program's handle for that GPU, or
/// `NOT_FOUND` for a hidden GPU and (`whole_only`: lookups by UUID) for a split GPU, whose own
/// UUID names no device of the program's.
unsafe fn settle_lookup(st: &State, parts: &[NvmlPart], result: c_int, dev: *mut NvmlDevice, whole_only: bool) -> c_int {
    if result != NVML_SUCCESS || dev.is_null() {
        return result;
    }
    match ordinal_in(st, parts, *dev) {
        Some(i) if !(whole_only && parts[i].part.is_some()) => {
            *dev = handle_for(parts, i, *dev);
            NVML_SUCCESS
        }
        _ => {
            *dev = std::ptr::null_mut();
            NVML_ERROR_NOT_FOUND
        }
    }
}

/// The part whose derived UUID is `uuid` (any case), as a fake handle.
fn part_by_uuid(parts: &[NvmlPart], uuid: &str, real_of: impl Fn(&NvmlPart) -> Option<NvmlDevice>) -> Option<NvmlDevice> {
    let i = parts.iter().position(|p| p.part.is_some() && p.uuid.eq_ignore_ascii_case(uuid.trim()))?;
    Some(handle_for(parts, i, real_of(&parts[i])?))
}

/// The real handle of a part's GPU, found by its physical UUID.
fn gpu_handle(st: &State, part: &NvmlPart) -> Option<NvmlDevice> {
    st.nvml_api()?.handle_of(&st.inventory()?.get(part.physical)?.uuid)
}

// ---------------------------------------------------------------------------------------------
// The hooks

pub unsafe fn get_count(st: &State, real: unsafe extern "C" fn(*mut c_uint) -> c_int, count: *mut c_uint) -> c_int {
    let len = match (parts(st), st.view()) {
        (Some(parts), _) => parts.len(),
        (None, Some(view)) => view.devices.len(),
        (None, None) => return real(count),
    };
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *count = len as c_uint;
    NVML_SUCCESS
}

pub unsafe fn handle_by_index(st: &State, real: unsafe extern "C" fn(c_uint, *mut NvmlDevice) -> c_int, index: c_uint, dev: *mut NvmlDevice) -> c_int {
    if let Some(parts) = parts(st) {
        if dev.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let Some(entry) = parts.get(index as usize) else { return NVML_ERROR_INVALID_ARGUMENT };
        // NVML's index of a GPU is its place in the inventory, read with
        // nvmlDeviceGetHandleByIndex_v2 (also for a v1 caller: the list is v2's).
        let by_index = st.nvml_api().and_then(|api| api.by_index).unwrap_or(real);
        let result = by_index(entry.physical as c_uint, dev);
        if result == NVML_SUCCESS {
            *dev = handle_for(parts, index as usize, *dev);
        }
        return result;
    }
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

/// The lookups by PCI bus id and serial: the driver's answer, unless it is hidden; a split GPU
/// is its first part.
pub unsafe fn handle_by_key(st: &State, real: unsafe extern "C" fn(*const c_char, *mut NvmlDevice) -> c_int, key: *const c_char, dev: *mut NvmlDevice) -> c_int {
    let result = real(key, dev);
    if let Some(parts) = parts(st) {
        return settle_lookup(st, parts, result, dev, false);
    }
    if result == NVML_SUCCESS && !dev.is_null() && st.view().is_some() && index_of(st, *dev).is_none() {
        *dev = std::ptr::null_mut();
        return NVML_ERROR_NOT_FOUND;
    }
    result
}

/// `nvmlDeviceGetHandleByUUID`: a part by its derived UUID; a split GPU's own UUID is not found.
pub unsafe fn handle_by_uuid(st: &State, real: unsafe extern "C" fn(*const c_char, *mut NvmlDevice) -> c_int, key: *const c_char, dev: *mut NvmlDevice) -> c_int {
    let Some(parts) = parts(st) else { return handle_by_key(st, real, key, dev) };
    if !key.is_null() && !dev.is_null() {
        if let Some(handle) = CStr::from_ptr(key).to_str().ok().and_then(|k| part_by_uuid(parts, k, |p| gpu_handle(st, p))) {
            *dev = handle;
            return NVML_SUCCESS;
        }
    }
    settle_lookup(st, parts, real(key, dev), dev, true)
}

/// `nvmlDeviceGetHandleByUUIDV` (`nvmlUUID_t`, ASCII or binary): as by UUID.
pub unsafe fn handle_by_uuidv(st: &State, real: unsafe extern "C" fn(*const c_char, *mut NvmlDevice) -> c_int, key: *const c_char, dev: *mut NvmlDevice) -> c_int {
    let Some(parts) = parts(st) else { return handle_by_key(st, real, key, dev) };
    if !key.is_null() && !dev.is_null() {
        let u = &*(key as *const NvmlUuidV1);
        let text = match (u.version, u.kind) {
            (NVML_UUID_V1, NVML_UUID_TYPE_ASCII) => {
                let end = u.value.iter().position(|&b| b == 0).unwrap_or(u.value.len());
                std::str::from_utf8(&u.value[..end]).ok().map(str::to_string)
            }
            (NVML_UUID_V1, NVML_UUID_TYPE_BINARY) => {
                Some(crate::driver::uuid_string(u.value[..16].try_into().expect("16 of 41 bytes")))
            }
            _ => None,
        };
        if let Some(handle) = text.and_then(|k| part_by_uuid(parts, &k, |p| gpu_handle(st, p))) {
            *dev = handle;
            return NVML_SUCCESS;
        }
    }
    settle_lookup(st, parts, real(key, dev), dev, true)
}

pub unsafe fn get_index(st: &State, real: unsafe extern "C" fn(NvmlDevice, *mut c_uint) -> c_int, dev: NvmlDevice, index: *mut c_uint) -> c_int {
    if let Some(parts) = parts(st) {
        // NVML checks the call (initialised, a valid handle) on the part's GPU.
        let result = real(nvml_virtual::real_of(dev), index);
        if result != NVML_SUCCESS {
            return result;
        }
        return match ordinal_in(st, parts, dev) {
            Some(i) => {
                *index = i as c_uint;
                NVML_SUCCESS
            }
            None => NVML_ERROR_NOT_FOUND,
        };
    }
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

/// `nvmlDeviceGetUUID` (hooked only while splitting): a part's derived UUID.
pub unsafe fn get_uuid(st: &State, real: unsafe extern "C" fn(NvmlDevice, *mut c_char, c_uint) -> c_int, dev: NvmlDevice, uuid: *mut c_char, len: c_uint) -> c_int {
    let Some(parts) = parts(st) else { return real(dev, uuid, len) };
    // NVML checks the call (initialised, valid handle and buffer) with the GPU's own UUID, which
    // is as long as a derived one.
    let result = real(nvml_virtual::real_of(dev), uuid, len);
    if result != NVML_SUCCESS {
        return result;
    }
    match ordinal_in(st, parts, dev).and_then(|i| parts.get(i)).filter(|p| p.part.is_some()) {
        Some(part) => write_string(&part.uuid, uuid, len),
        None => result,
    }
}

/// (total, used, free) within the device's limit: used never above it, free never below 0.
fn clamp(st: &State, dev: NvmlDevice, total: u64, used: u64, free: u64) -> (u64, u64, u64) {
    if let Some(parts) = parts(st) {
        return match ordinal_in(st, parts, dev) {
            Some(i) => clamp_program_device(st, &parts[i], i, total, used, free),
            None => (total, used, free),
        };
    }
    let Some(ordinal) = cuda_ordinal_of(st, dev) else { return (total, used, free) };
    let limit = st.settings.limit_for(ordinal as u32).resolve(total);
    let used = quota_used(|| st.nvml_api()?.uuid_of(nvml_virtual::real_of(dev))).unwrap_or(used).min(limit);
    (limit, used, (limit - used).min(free))
}

/// With a shared quota, what all its members hold on the device (or part) whose UUID `uuid`
/// gives (asked only then), which is what counts against the limit.
fn quota_used(uuid: impl FnOnce() -> Option<String>) -> Option<u64> {
    let q = crate::sharing::quota()?;
    q.find(&uuid()?).map(|d| q.reserved(d))
}

/// The numbers of program device `i` while splitting, from its GPU's: total = min(part size,
/// the limit of ordinal `i`) (a whole device: its limit). NVML counts the memory of a GPU as a
/// whole and cannot tell which part used what, so a part shows its GPU's use (at most its
/// total), and free = min(total − used, the GPU's free).
fn clamp_program_device(st: &State, entry: &NvmlPart, i: usize, total: u64, used: u64, free: u64) -> (u64, u64, u64) {
    let size = entry.part.map_or(total, |p| p.size.min(total));
    let total = st.settings.limit_for(i as u32).resolve(size);
    let used = quota_used(|| Some(entry.uuid.clone())).unwrap_or(used).min(total);
    (total, used, (total - used).min(free))
}

pub unsafe fn memory_info(st: &State, real: unsafe extern "C" fn(NvmlDevice, *mut NvmlMemory) -> c_int, dev: NvmlDevice, mem: *mut NvmlMemory) -> c_int {
    let result = real(nvml_virtual::real_of(dev), mem);
    if result == NVML_SUCCESS && !mem.is_null() {
        let m = &mut *mem;
        (m.total, m.used, m.free) = clamp(st, dev, m.total, m.used, m.free);
    }
    result
}

pub unsafe fn memory_info_v2(st: &State, real: unsafe extern "C" fn(NvmlDevice, *mut NvmlMemoryV2) -> c_int, dev: NvmlDevice, mem: *mut NvmlMemoryV2) -> c_int {
    let result = real(nvml_virtual::real_of(dev), mem);
    if result == NVML_SUCCESS && !mem.is_null() {
        let m = &mut *mem;
        // Reserved memory (the driver's own) is part of the total on both sides.
        let (total, used, free) = clamp(st, dev, m.total, m.used.saturating_add(m.reserved), m.free);
        m.reserved = m.reserved.min(used);
        (m.total, m.used, m.free) = (total, used - m.reserved, free);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_struct_layout() {
        // sizeof(nvmlUUID_v1_t) = 4 + 4 + 41, padded to 52: nvmlUUID_v1 = 0x01000034.
        assert_eq!(NVML_UUID_V1, 0x0100_0034);
    }

    #[test]
    fn strings_are_written_as_nvml_writes_them() {
        let mut buf = [1 as c_char; 8];
        unsafe {
            assert_eq!(write_string("abc", buf.as_mut_ptr(), 3), NVML_ERROR_INSUFFICIENT_SIZE);
            assert_eq!(write_string("abc", std::ptr::null_mut(), 8), NVML_ERROR_INVALID_ARGUMENT);
            assert_eq!(write_string("abc", buf.as_mut_ptr(), 4), NVML_SUCCESS);
        }
        assert_eq!(&buf[..5], &[b'a' as c_char, b'b' as c_char, b'c' as c_char, 0, 1]);
    }

    #[test]
    fn part_memory_numbers() {
        use crate::devices::Part;
        const GIB: u64 = 1 << 30;
        let st = State::for_tests();
        let part = NvmlPart { physical: 0, part: Some(Part { index: 1, count: 2, size: 4 * GIB }), uuid: String::new() };
        let whole = NvmlPart { physical: 1, part: None, uuid: String::new() };
        // (total, used, free) of the GPU -> of the program device
        assert_eq!(clamp_program_device(&st, &part, 1, 16 * GIB, GIB, 15 * GIB), (4 * GIB, GIB, 3 * GIB));
        assert_eq!(clamp_program_device(&st, &part, 1, 16 * GIB, 10 * GIB, 6 * GIB), (4 * GIB, 4 * GIB, 0));
        assert_eq!(clamp_program_device(&st, &part, 1, 16 * GIB, 0, GIB), (4 * GIB, 0, GIB));
        assert_eq!(clamp_program_device(&st, &whole, 2, 16 * GIB, GIB, 15 * GIB), (16 * GIB, GIB, 15 * GIB));
    }
}
