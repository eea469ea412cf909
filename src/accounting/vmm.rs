//! Virtual memory management handles: when the driver really frees their memory.
//!
//! On the driver a `cuMemCreate` handle holds its physical memory until it has been released
//! (the creator's reference and every `cuMemRetainAllocationHandle` reference) *and* unmapped
//! (every `cuMemMap` of it undone). The handle's live entry (`Kind::VmmHandle`) stays counted
//! until both are true. Only handles the shim counted are tracked; the state is updated after
//! the driver's call succeeded, never across it.
//!
//! Every function answers `Err` when the handles' lock cannot be had (`bounded`); the hooks
//! then refuse before the driver's call, or undo it (`hooks::memory`), or, where it cannot be
//! undone (a release, an unmap), leave the handle counted (closed).

use std::collections::{BTreeMap, HashMap};

use gpushim_common::bounded::{Bounded, Stuck};

#[derive(Default)]
struct Handles {
    /// handle -> (references, mappings)
    handles: HashMap<u64, (u64, u64)>,
    /// Handles exported to a shareable handle (`cuMemExportToShareableHandle`): whoever imports
    /// it keeps the memory alive where the shim cannot see, so they stay counted until exit.
    exported: std::collections::HashSet<u64>,
    /// mapped address -> (size, handle)
    mappings: BTreeMap<u64, (u64, u64)>,
}

static HANDLES: Bounded<Option<Handles>> = Bounded::new("gpushim's table of virtual memory handles", None);

pub fn hold_for_fork() {
    crate::platform::fork::hold(&HANDLES);
}

/// A forked child holds nothing (`fork`).
pub fn reset_after_fork() {
    HANDLES.reset_after_fork(None);
}

fn with<R>(f: impl FnOnce(&mut Handles) -> R) -> Result<R, Stuck> {
    Ok(f(HANDLES.lock()?.get_or_insert_with(Handles::default)))
}

/// Drops `h` if nothing references or maps it; true when its memory is now free (never for
/// an exported handle).
fn collect(t: &mut Handles, h: u64) -> bool {
    if t.exported.contains(&h) {
        return false;
    }
    if t.handles.get(&h).is_some_and(|&(r, m)| r == 0 && m == 0) {
        t.handles.remove(&h);
        return true;
    }
    false
}

/// A counted `cuMemCreate` succeeded: one reference, no mapping.
pub fn created(h: u64) -> Result<(), Stuck> {
    with(|t| {
        t.handles.insert(h, (1, 0));
    })
}

/// The driver exported `h` to a shareable handle: it stays counted until the process exits.
pub fn exported(h: u64) -> Result<(), Stuck> {
    with(|t| {
        if t.handles.contains_key(&h) {
            t.exported.insert(h);
        }
    })
}

/// Whether the shim tracks handle `h`.
pub fn known(h: u64) -> Result<bool, Stuck> {
    with(|t| t.handles.contains_key(&h))
}

/// The driver accepted `cuMemRelease(h)`: true when the memory is now free.
pub fn released(h: u64) -> Result<bool, Stuck> {
    with(|t| {
        if let Some(e) = t.handles.get_mut(&h) {
            e.0 = e.0.saturating_sub(1);
        }
        collect(t, h)
    })
}

/// The driver accepted `cuMemRetainAllocationHandle`, which returned `h`.
pub fn retained(h: u64) -> Result<(), Stuck> {
    with(|t| {
        if let Some(e) = t.handles.get_mut(&h) {
            e.0 += 1;
        }
    })
}

/// The driver accepted `cuMemMap(addr, size, .., h)`.
pub fn mapped(addr: u64, size: u64, h: u64) -> Result<(), Stuck> {
    with(|t| {
        if let Some(e) = t.handles.get_mut(&h) {
            e.1 += 1;
            t.mappings.insert(addr, (size, h));
        }
    })
}

/// The handles mapped in `[addr, addr + size)` (read only).
pub fn mapped_handles(addr: u64, size: u64) -> Result<Vec<u64>, Stuck> {
    let end = addr.saturating_add(size);
    with(|t| t.mappings.range(addr..end).map(|(_, &(_, h))| h).collect())
}

/// The driver accepted `cuMemUnmap(addr, size)`: the handles whose memory is now free.
pub fn unmapped(addr: u64, size: u64) -> Result<Vec<u64>, Stuck> {
    let end = addr.saturating_add(size);
    with(|t| {
        let inside: Vec<(u64, u64)> = t.mappings.range(addr..end).map(|(&a, &(_, h))| (a, h)).collect();
        let mut freed = Vec::new();
        for (a, h) in inside {
            t.mappings.remove(&a);
            if let Some(e) = t.handles.get_mut(&h) {
                e.1 = e.1.saturating_sub(1);
            }
            if collect(t, h) {
                freed.push(h);
            }
        }
        freed
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_once_released_and_unmapped() {
        created(0x77).unwrap();
        mapped(0x1000, 0x100, 0x77).unwrap();
        mapped(0x1100, 0x100, 0x77).unwrap();
        assert!(!released(0x77).unwrap());
        retained(0x77).unwrap();
        assert_eq!(unmapped(0x1000, 0x100).unwrap(), Vec::<u64>::new());
        assert_eq!(unmapped(0x1100, 0x100).unwrap(), Vec::<u64>::new());
        assert!(known(0x77).unwrap());
        assert!(released(0x77).unwrap());
        assert!(!known(0x77).unwrap());
        mapped(0x5000, 0x100, 0x99).unwrap(); // unknown handle: not tracked
        assert_eq!(unmapped(0x5000, 0x100).unwrap(), Vec::<u64>::new());
    }
}
