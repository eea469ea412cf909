//! Memory in use, from the simulated CUDA driver loaded in the same process, or from the node
//! state all simulated processes share; utilisation, from the node state's time region.
//!
//! With `GPUSIM_NODE_STATE` naming the simulated driver's node-wide file (`sim/cuda`'s `node`:
//! magic `gpusimND` at 0, device `d`'s `used` at 64 + 32·d + 8), `used(p)` is what every process
//! of the node holds on physical device `p`, as NVML shows of a real GPU; otherwise:
//!
//! If `libcuda.so.1` is already loaded (`dlopen(RTLD_NOW | RTLD_NOLOAD)`: this module never loads
//! it; `nvmlInit*` does, as the real NVML does, when it is on the search path) and
//! exports the simulator's hook `int gpusim_stats(int physical, uint64_t *used, uint64_t *peak,
//! uint64_t *total)`, `used(p)` is what it reports for physical device `p`; otherwise 0. Once
//! found, the hook's address is kept, and so is the `dlopen` reference that keeps the driver
//! loaded; until then every call looks again (the driver may be loaded later).

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

type StatsFn = unsafe extern "C" fn(c_int, *mut u64, *mut u64, *mut u64) -> c_int;

static STATS: AtomicUsize = AtomicUsize::new(0);

fn stats_fn() -> Option<StatsFn> {
    let cached = STATS.load(Ordering::Acquire);
    if cached != 0 {
        // SAFETY: only ever set from a non-NULL `dlsym` of `gpusim_stats`, whose library stays
        // loaded (we keep our reference).
        return Some(unsafe { std::mem::transmute::<usize, StatsFn>(cached) });
    }
    // SAFETY: plain libdl calls with NUL-terminated names.
    unsafe {
        let h = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        if h.is_null() {
            return None;
        }
        let f: *mut c_void = libc::dlsym(h, c"gpusim_stats".as_ptr());
        if f.is_null() {
            // A libcuda.so.1 without the hook (not the simulator): nothing to ask.
            libc::dlclose(h);
            return None;
        }
        STATS.store(f as usize, Ordering::Release);
        Some(std::mem::transmute::<*mut c_void, StatsFn>(f))
    }
}

/// Bytes the simulated driver in this process has allocated on physical device `p` (0 if no
/// simulated driver is loaded or it does not know `p`).
pub fn used(p: usize) -> u64 {
    if let Some(used) = node_used(p) {
        return used;
    }
    let Some(f) = stats_fn() else { return 0 };
    let mut used = 0u64;
    // SAFETY: `f` is the simulator's `gpusim_stats`; NULL out-pointers are skipped by it.
    let rc = unsafe {
        f(
            p as c_int,
            &mut used,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    if rc == 0 {
        used
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn no_driver_means_nothing_used() {
        // This module never loads libcuda.so.1; if another test's nvmlInit did, it is the
        // simulated driver, which holds nothing in this process.
        assert_eq!(super::used(0), 0);
        assert_eq!(super::used(99), 0);
    }
}

/// The node state file (`GPUSIM_NODE_STATE`), when it is one: opened read-only as the simulated
/// driver opens it (not through a link, only this user's file that no one else can write).
fn node_file() -> Option<std::fs::File> {
    use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
    const MAGIC: &[u8; 8] = b"gpusimND";
    let path = std::env::var_os("GPUSIM_NODE_STATE").filter(|v| !v.is_empty())?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    let st = file.metadata().ok()?;
    // SAFETY: geteuid cannot fail.
    if !st.is_file() || st.uid() != unsafe { libc::geteuid() } || st.mode() & 0o022 != 0 {
        return None;
    }
    let mut word = [0u8; 8];
    file.read_exact_at(&mut word, 0).ok()?;
    (&word == MAGIC).then_some(file)
}

/// Device `p`'s memory in use on the node (`GPUSIM_NODE_STATE`), when that file is a node
/// state (read without its lock: a figure, never a decision).
fn node_used(p: usize) -> Option<u64> {
    use std::os::unix::fs::FileExt;
    if p >= 16 {
        return None;
    }
    let file = node_file()?;
    let mut word = [0u8; 8];
    file.read_exact_at(&mut word, 64 + 32 * p as u64 + 8).ok()?;
    Some(u64::from_le_bytes(word))
}

/// Device `p`'s block of the node state's time region (`gpusim_common::busy`; version 2 files
/// only), `None` without node state.
pub fn node_time_block(p: usize) -> Option<Vec<u8>> {
    use gpusim_common::busy;
    use std::os::unix::fs::FileExt;
    if p >= busy::MAX_DEVICES {
        return None;
    }
    let file = node_file()?;
    let mut version = [0u8; 4];
    file.read_exact_at(&mut version, 8).ok()?;
    if u32::from_le_bytes(version) < 2 {
        return None;
    }
    let mut block = vec![0u8; busy::DEV_SIZE];
    file.read_exact_at(&mut block, busy::dev_off(p) as u64).ok()?;
    Some(block)
}

/// Device `p`'s utilisation over the last second, node-wide (`gpusim_common::busy::utilisation`):
/// the device's % and `(pid, %)` per process; `(0, [])` without node state.
pub fn utilisation(p: usize) -> (u32, Vec<(u32, u32)>) {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let now = ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
    node_time_block(p).map_or((0, Vec::new()), |b| gpusim_common::busy::utilisation(&b, now))
}
