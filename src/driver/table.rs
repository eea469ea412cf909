//! The driver's own functions behind the hooks, as the layers below the hooks reach them: the hook table (in `hooks`, above) registers here how it is filled and read.
//!
//! The table of the driver's pointers (`hooks::REAL`) is generated with the hooks' list, above
//! every layer that needs it filled (the state, when it opens a library) or read (the fast
//! lane, the undoing of an allocation). So the hooks layer registers two plain functions here
//! before it first reaches the state (`hooks::state`): a pointer stored once, read with one
//! atomic load, no allocation and no lock.

use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicPtr, Ordering::Acquire, Ordering::Release};

use super::{Lib, Library};

/// How the hooks' table of the driver's pointers is filled and read.
pub struct Reals {
    /// Fills the table for the hooks of one library from the opened library.
    pub resolve: fn(&Library, Lib),
    /// The driver's own function behind the hook of this exported name, once resolved.
    pub resolved: fn(&CStr) -> Option<*mut c_void>,
}

static REALS: AtomicPtr<Reals> = AtomicPtr::new(std::ptr::null_mut());

/// Registers the hooks' table (the same one every time).
#[inline]
pub fn register(reals: &'static Reals) {
    REALS.store(reals as *const Reals as *mut Reals, Release);
}

fn reals() -> Option<&'static Reals> {
    let p = REALS.load(Acquire);
    // SAFETY: only `register` stores here, a `&'static Reals`.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// Fills the hooks' table for `which` from `lib` (nothing before the hooks registered).
pub fn resolve(lib: &Library, which: Lib) {
    if let Some(r) = reals() {
        (r.resolve)(lib, which);
    }
}

/// The driver's own function behind the hook named `name`, once resolved.
pub fn resolved(name: &CStr) -> Option<*mut c_void> {
    reals().and_then(|r| (r.resolved)(name))
}
