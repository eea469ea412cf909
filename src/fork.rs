//! Forked children. A child of a process under the shim inherits its state, its places in a
//! shared quota and the user's registry, and its exit handlers. What a forked child is, here:
//! * it holds nothing, as far as the shim knows (CUDA contexts and their memory do not survive
//!   `fork`): its budgets, live allocations, reserves, pools and graphs start empty, with the
//!   limits its parent resolved;
//! * its place in a shared quota is its own, taken at its first reservation, starting at zero
//!   (`quota::Quota::rejoin`); the parent's place and usage are never changed by the child, and
//!   the child's exit leaves only its own place;
//! * it writes no exit report (the report is the parent's; a child that `exec`s is a new
//!   program with its own).
//!
//! Locks: a lock another thread held at the fork would never be released in the child (only
//! the forking thread exists there). So the `pthread_atfork` *prepare* handler takes every lock
//! of the shim's state, in the one order the shim ever nests them (each device's reserve before
//! the live map's shards; no lock is held across a driver call, so this waits only for short
//! critical sections), and the parent and child handlers let them go; the child then empties
//! what it inherited. Registered when the shim first initialises (never in a process that does
//! not touch CUDA).

use std::any::Any;
use std::cell::RefCell;
use std::sync::atomic::Ordering::Release;

use crate::bounded::Bounded;
use crate::once::ForkOnce;

thread_local! {
    /// The guards the prepare handler took (the forking thread's own).
    static HELD: RefCell<Vec<Box<dyn Any>>> = const { RefCell::new(Vec::new()) };
}

/// Whether the handlers are registered. A `ForkOnce`: a child forked while another thread
/// registered them registers them itself, unless they were (glibc's fork waits for a
/// registration under way): then the child handler, which runs, marks it done.
static REGISTERED: ForkOnce<()> = ForkOnce::new();

/// Registers the handlers, once per process.
pub fn register() {
    REGISTERED.call_once(|| {
        // SAFETY: registers plain extern "C" functions that never unwind.
        unsafe { libc::pthread_atfork(Some(prepare), Some(in_parent), Some(in_child)) };
    });
}

/// Takes `m` for the fork (see the module documentation). Bounded (`bounded`): a lock this
/// thread holds itself (a fork from a signal handler that interrupted the shim) or that is not
/// free within the bound is not taken, with one line; the child resets it whatever its state.
pub fn hold<T: 'static>(m: &'static Bounded<T>) {
    match m.lock() {
        Ok(guard) => {
            let _ = HELD.try_with(|h| h.borrow_mut().push(Box::new(guard)));
        }
        Err(stuck) => crate::log::stuck("fork's hold of gpushim's locks", stuck),
    }
}

fn release_all() {
    let _ = HELD.try_with(|h| {
        // released in the reverse order of taking
        let mut held = std::mem::take(&mut *h.borrow_mut());
        while held.pop().is_some() {}
    });
}

extern "C" fn prepare() {
    let _ = std::panic::catch_unwind(crate::state::hold_for_fork);
}

extern "C" fn in_parent() {
    let _ = std::panic::catch_unwind(release_all);
}

extern "C" fn in_child() {
    let _ = std::panic::catch_unwind(|| {
        release_all();
        crate::quota::FORK_GENERATION.fetch_add(1, Release);
        // (inherited: registered, whatever the parent's registering thread had got to)
        let _ = REGISTERED.set(());
        crate::report::disarm();
        crate::state::after_fork_in_child();
    });
}
