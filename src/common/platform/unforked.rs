//! The shim's calls into the C library and its own standard library whose internal locks `fork`
//! leaves as they were: made inside one scope that the shim's fork handler waits for.
//!
//! `fork` copies only the forking thread; a lock another thread held at that moment stays held
//! in the child for ever. glibc's `fork` takes care of malloc's and stdio's locks, not of the
//! lock of its list of exit handlers (`atexit`) nor of its environment's (`setenv`), and the
//! standard library's environment lock (a reader-writer lock around `getenv`/`setenv`) is not
//! taken care of by anyone. The shim uses all three during the first `cuInit`, while the
//! program's other threads may be forking: a child forked in the middle of one waited for ever
//! in its own `atexit`, `exit`, or first `cuInit` (which reads and writes the environment).
//! Here those calls hold [`SCOPE`], which the shim's `pthread_atfork` prepare handler takes
//! (`src/platform/fork.rs`), so a fork waits for them — microseconds — and never lands inside.
//!
//! A scope entered again by the thread inside it (a signal handler that interrupted it) runs
//! without taking the lock, held already (the interrupted call's own C-library lock is another
//! matter: a handler reaching the environment while its thread was inside `setenv` waits as it
//! did before; only first-use paths get there). A scope that waited out the bound runs anyway
//! (a fork that holds the lock that long is stuck elsewhere; so does a child made by `_Fork` or
//! a raw `clone`, which runs no fork handler, while another thread was inside: it waits the
//! bound once). Not covered: the environment rewrite of the library's load-time constructor
//! (`devices::view`, before any fork handler is registered, in the single-threaded start of a
//! preloaded program), and other libraries' calls (the driver's own exit handlers, a program's
//! `setenv`).

use std::ffi::{OsStr, OsString};

use crate::bounded::Bounded;

/// Held by the calls below and by the fork handler.
pub static SCOPE: Bounded<()> = Bounded::new("gpushim's fork-sensitive calls", ());

/// Runs `f` where no fork lands (see the module documentation).
pub fn unforked<R>(f: impl FnOnce() -> R) -> R {
    let _held = SCOPE.lock();
    f()
}

/// `std::env::var_os`, never in the middle of a fork.
pub fn var_os(name: impl AsRef<OsStr>) -> Option<OsString> {
    unforked(|| std::env::var_os(name))
}

/// `std::env::var`, never in the middle of a fork.
pub fn var(name: impl AsRef<OsStr>) -> Result<String, std::env::VarError> {
    unforked(|| std::env::var(name))
}

/// `std::env::set_var`, never in the middle of a fork.
pub fn set_var(name: impl AsRef<OsStr>, value: impl AsRef<OsStr>) {
    unforked(|| std::env::set_var(name, value))
}

/// `std::env::remove_var`, never in the middle of a fork.
pub fn remove_var(name: impl AsRef<OsStr>) {
    unforked(|| std::env::remove_var(name))
}

/// `atexit(f)`, never in the middle of a fork.
pub fn at_exit(f: extern "C" fn()) {
    // SAFETY: registers a plain `extern "C" fn()`; atexit has no other preconditions.
    unforked(|| unsafe { libc::atexit(f) });
}

/// In a forked child: the scope free, whatever the parent's threads were doing.
pub fn reset_after_fork() {
    SCOPE.reset_after_fork(());
}
