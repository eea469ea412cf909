//! Per-physical-device accounting (used / peak / allocation and free counts), the exit report
//! (`GPUSIM_REPORT`) and the test hooks `gpusim_stats`, `gpusim_call_count`, `gpusim_symbol`.
//!
//! `reserve` is the only way memory becomes "used": a compare-and-swap loop that checks and
//! adds in one atomic step, so no interleaving of threads can push `used` above `total`.
//! With `GPUSIM_NODE_STATE` set, `reserve`/`release`/`unreserve` also count on the node-wide
//! shared state (`node`), whose `used` is what every process' allocations are checked against.

use crate::devices::physical;
use crate::node;
use crate::registry;
use crate::types::*;
use gpusim_common::counters::{self, json_str};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

#[derive(Default)]
pub struct DevStats {
    pub used: AtomicU64,
    pub peak: AtomicU64,
    pub allocs: AtomicU64,
    pub frees: AtomicU64,
}

static STATS: OnceLock<Vec<DevStats>> = OnceLock::new();

pub fn all() -> &'static [DevStats] {
    STATS.get_or_init(|| physical().iter().map(|_| DevStats::default()).collect())
}

/// Counts `size` bytes on physical device `p`, or fails with `CUDA_ERROR_OUT_OF_MEMORY`
/// (changing nothing) if that would make `used > total`. With the node state on
/// (`GPUSIM_NODE_STATE`, see `node`) the bytes are also counted on the node's device, and the
/// node's `used` (all processes together) must stay within `total` as well.
pub fn reserve(p: usize, size: u64) -> Res {
    let total = physical().get(p).ok_or(CUDA_ERROR_INVALID_DEVICE)?.total;
    match node::active() {
        Some(n) => n.reserve(p, size, || reserve_local(p, total, size)),
        None => reserve_local(p, total, size),
    }
}

/// The process' own check and count: one compare-and-swap.
fn reserve_local(p: usize, total: u64, size: u64) -> Res {
    let s = &all()[p];
    let mut cur = s.used.load(Ordering::Relaxed);
    loop {
        let new = match cur.checked_add(size) {
            Some(n) if n <= total => n,
            _ => return Err(CUDA_ERROR_OUT_OF_MEMORY),
        };
        match s
            .used
            .compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Relaxed)
        {
            Ok(_) => {
                s.peak.fetch_max(new, Ordering::AcqRel);
                s.allocs.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            Err(actual) => cur = actual,
        }
    }
}

/// Gives back `size` bytes counted by `reserve` on physical device `p`.
pub fn release(p: usize, size: u64) {
    if let Some(s) = all().get(p) {
        let _ = s
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |u| {
                Some(u.saturating_sub(size))
            });
        s.frees.fetch_add(1, Ordering::Relaxed);
        if let Some(n) = node::active() {
            n.release(p, size);
        }
    }
}

/// Undoes a `reserve` whose allocation could not be made after all (not counted as a free).
/// A free whose bytes stay resident (a stream-ordered pool keeps them): counts the free only.
pub fn count_free(p: usize) {
    if let Some(s) = all().get(p) {
        s.frees.fetch_add(1, Ordering::Relaxed);
    }
}

/// Bytes a pool kept after their free, now given back to the device (not a free of its own).
pub fn release_bytes(p: usize, size: u64) {
    if let Some(s) = all().get(p) {
        let _ = s.used.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |u| Some(u.saturating_sub(size)));
        if let Some(n) = node::active() {
            n.release(p, size);
        }
    }
}

pub fn unreserve(p: usize, size: u64) {
    if let Some(s) = all().get(p) {
        let _ = s
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |u| {
                Some(u.saturating_sub(size))
            });
        let _ = s
            .allocs
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |a| {
                Some(a.saturating_sub(1))
            });
        if let Some(n) = node::active() {
            n.release(p, size);
        }
    }
}

/// Bytes this process has counted on physical device `p`.
pub fn used(p: usize) -> u64 {
    all().get(p).map_or(0, |s| s.used.load(Ordering::Acquire))
}

/// What `cuMemGetInfo` subtracts from the total: the node's `used` (after reclaiming dead
/// processes' memory) when the node state is on, else this process' `used`.
pub fn occupied(p: usize) -> u64 {
    match node::active() {
        Some(n) => n.snapshot().get(p).map_or(0, |s| s.0),
        None => used(p),
    }
}

// ---- the report ------------------------------------------------------------------------------

/// The `GPUSIM_REPORT` contents (written at exit by `gpusim_common::config::Settings`, see
/// `config.rs`).
pub fn report_json() -> String {
    // The node's figures (dead processes reclaimed first), when the node state is on.
    let node = node::active().map(|n| n.snapshot()).unwrap_or_default();
    let devs: Vec<String> = physical()
        .iter()
        .zip(all())
        .map(|(p, s)| {
            let node = node
                .get(p.index)
                .map(|(u, pk, _)| format!(",\"node_used\":{u},\"node_peak\":{pk}"))
                .unwrap_or_default();
            format!(
                "{{\"physical\":{},\"name\":{},\"total\":{},\"used\":{},\"peak\":{},\"allocs\":{},\"frees\":{}{}}}",
                p.index,
                json_str(&p.name),
                p.total,
                s.used.load(Ordering::Acquire),
                s.peak.load(Ordering::Acquire),
                s.allocs.load(Ordering::Acquire),
                s.frees.load(Ordering::Acquire),
                node
            )
        })
        .collect();
    format!(
        "{{\"driver_version\":{},\"devices\":[{}],\"calls\":{{{}}},\"launches\":{},\"busy\":{}}}\n",
        crate::config::get().driver_version,
        devs.join(","),
        counters::calls_json(registry::NAMES, &registry::COUNTS),
        crate::kernels::launches_json(),
        crate::timeline::busy_json()
    )
}

// ---- test hooks --------------------------------------------------------------------------------

/// `int gpusim_stats(int physical, uint64_t *used, uint64_t *peak, uint64_t *total)`: 0 on
/// success, -1 for an unknown device. NULL out-pointers are skipped.
#[no_mangle]
pub unsafe extern "C" fn gpusim_stats(
    p: c_int,
    used: *mut u64,
    peak: *mut u64,
    total: *mut u64,
) -> c_int {
    crate::ffi::guard_value(-1, || {
        if p < 0 || p as usize >= physical().len() {
            return -1;
        }
        let s = &all()[p as usize];
        put_opt(used, s.used.load(Ordering::Acquire));
        put_opt(peak, s.peak.load(Ordering::Acquire));
        put_opt(total, physical()[p as usize].total);
        0
    })
}

/// `uint64_t gpusim_call_count(const char *exported_name)`: how often that driver entry point
/// was called (0 for unknown names).
#[no_mangle]
pub unsafe extern "C" fn gpusim_call_count(name: *const c_char) -> u64 {
    crate::ffi::guard_value(0, || {
        counters::count_of_c(registry::NAMES, &registry::COUNTS, name)
    })
}

/// `void *gpusim_symbol(const char *exported_name)`: the simulator's own address of that entry
/// point (what `dlsym` and `cuGetProcAddress` give), NULL for unknown names.
#[no_mangle]
pub unsafe extern "C" fn gpusim_symbol(name: *const c_char) -> *mut c_void {
    crate::ffi::guard_value(std::ptr::null_mut(), || {
        if name.is_null() {
            return std::ptr::null_mut();
        }
        let n = CStr::from_ptr(name).to_string_lossy();
        registry::address_of(&n).map_or(std::ptr::null_mut(), |a| a as *mut c_void)
    })
}
