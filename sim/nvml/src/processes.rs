//! The compute processes of a device (`nvmlDeviceGetComputeRunningProcesses[_v2,_v3]`): this
//! process, when the simulated driver loaded in it has a context on the device.
//!
//! The real NVML lists every process of the machine that has a context on the device. The
//! simulated NVML sees only the simulated driver of its own process: if `libcuda.so.1` is
//! already loaded (`dlopen(RTLD_NOW | RTLD_NOLOAD)`, never loading it here; `nvmlInit*` loads it when it
//! is on the search path) and exports the
//! simulator's hooks `int gpusim_has_context(int physical)` and `gpusim_stats`, the process is
//! listed with its pid and, as `usedGpuMemory`, the bytes that driver has allocated on the
//! device (the real figure also counts the context's own reservation, which the simulator does
//! not model). Other processes are never listed.

use crate::types::*;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

type HasContextFn = unsafe extern "C" fn(c_int) -> c_int;
type StatsFn = unsafe extern "C" fn(c_int, *mut u64, *mut u64, *mut u64) -> c_int;

static HAS_CONTEXT: AtomicUsize = AtomicUsize::new(0);
static STATS: AtomicUsize = AtomicUsize::new(0);

/// The simulator's hook `name`, found once and kept in `cache` (until found, every call looks
/// again: the driver may be loaded later).
fn cached(cache: &AtomicUsize, name: &std::ffi::CStr) -> Option<*mut c_void> {
    let known = cache.load(Ordering::Acquire);
    if known != 0 {
        return Some(known as *mut c_void);
    }
    let f = hook(name)?;
    cache.store(f as usize, Ordering::Release);
    Some(f)
}

/// The simulator's hook `name` in an already loaded `libcuda.so.1`, if there is one.
fn hook(name: &std::ffi::CStr) -> Option<*mut c_void> {
    // SAFETY: plain libdl calls with NUL-terminated names; the reference taken by a successful
    // `dlopen` is kept (never closed), so the address stays valid.
    unsafe {
        let h = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        if h.is_null() {
            return None;
        }
        let f = libc::dlsym(h, name.as_ptr());
        if f.is_null() {
            libc::dlclose(h);
            return None;
        }
        Some(f)
    }
}

/// This process' entry for physical device `p`, if it has a context there: (pid, bytes used).
pub fn own(p: usize) -> Option<(u32, u64)> {
    let has = cached(&HAS_CONTEXT, c"gpusim_has_context")?;
    // SAFETY: the simulator's `int gpusim_has_context(int)`.
    let on = unsafe { std::mem::transmute::<*mut c_void, HasContextFn>(has)(p as c_int) };
    if on != 1 {
        return None;
    }
    let mut used = 0u64;
    if let Some(stats) = cached(&STATS, c"gpusim_stats") {
        // SAFETY: the simulator's `gpusim_stats`; NULL out-pointers are skipped by it.
        let rc = unsafe {
            std::mem::transmute::<*mut c_void, StatsFn>(stats)(p as c_int, &mut used, std::ptr::null_mut(), std::ptr::null_mut())
        };
        if rc != 0 {
            used = 0;
        }
    }
    // SAFETY: getpid has no preconditions.
    Some((unsafe { libc::getpid() } as u32, used))
}

/// The NVML count/size protocol over `list`: `*count` in, the number listed out; a count
/// smaller than the list is `NVML_ERROR_INSUFFICIENT_SIZE` with the count needed (so `*count`
/// 0 asks for the count; no process is `SUCCESS`); `write(i, entry)` fills `infos[i]`.
///
/// # Safety
/// `count` is NULL or valid; `write` writes within the caller's array of `*count` entries.
pub unsafe fn answer(list: &[(u32, u64)], count: *mut c_uint, mut write: impl FnMut(usize, (u32, u64))) -> Res {
    if count.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-NULL, the caller's count.
    let room = unsafe { *count } as usize;
    // SAFETY: as above.
    unsafe { *count = list.len() as c_uint };
    if room < list.len() {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (i, &e) in list.iter().enumerate() {
        write(i, e);
    }
    Ok(())
}
