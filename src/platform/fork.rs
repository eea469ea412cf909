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
//! A child made without `fork()` (a raw `clone` without `CLONE_VM`, glibc's `_Fork`, `vfork`,
//! `clone` with `CLONE_VM`) runs none of the handlers below but inherits the exit handlers:
//! what those do (leave the quota and the registry, remove the published file, write the
//! report) and a quota reservation are tied to the pid that joined, asked of the kernel each
//! time (`quota::whoami`, `live::Publisher::is_mine`, `report`), so such a child never acts on
//! its parent's place or files, and takes a place of its own at its first reservation. (Its
//! other inherited state is not emptied: see the README's Forked children.)
//!
//! Locks: a lock another thread held at the fork would never be released in the child (only
//! the forking thread exists there). So the `pthread_atfork` *prepare* handler takes every lock
//! of the shim's state, in the one order the shim ever nests them (each device's reserve before
//! the live map's shards; no lock is held across a driver call, so this waits only for short
//! critical sections), and the parent and child handlers let them go; the child then empties
//! what it inherited. Before those it takes `gpushim_common::unforked::SCOPE`, so that the
//! shim's calls whose C-library or standard-library locks a fork would leave held (exit
//! handlers, the environment, the panic hook) are never cut in the middle by a fork.
//! Registered when the shim first initialises (never in a process that does not touch CUDA).

use std::any::Any;
use std::cell::Cell;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::{Acquire, Release};

use gpushim_common::bounded::Bounded;
use gpushim_common::once::ForkOnce;

thread_local! {
    /// The guards the prepare handler took (the forking thread's own), boxed: a raw pointer, so
    /// that this thread-local has no destructor. (A `vfork` child that calls `exit` runs the
    /// calling thread's thread-local destructors in its parent's memory: the parent's `HELD`
    /// would be destroyed, and its later forks would hold no lock.)
    static HELD: Cell<*mut Vec<Box<dyn Any>>> = const { Cell::new(std::ptr::null_mut()) };
}

/// Whether the handlers are registered. A `ForkOnce`: a child forked while another thread
/// registered them registers them itself, unless they were (glibc's fork waits for a
/// registration under way): then the child handler, which runs, marks it done.
static REGISTERED: ForkOnce<()> = ForkOnce::new();

/// What the layers above do at a fork, registered with the handlers (plain functions: no
/// allocation, no lock to reach them): `prepare` takes their locks, `child` empties what the
/// child inherited. Stored before the handlers are registered, read by them.
static PREPARE: AtomicUsize = AtomicUsize::new(0);
static CHILD: AtomicUsize = AtomicUsize::new(0);

/// Calls the function stored in `slot`, if any.
fn call(slot: &AtomicUsize) {
    let f = slot.load(Acquire);
    if f != 0 {
        // SAFETY: only `register` stores here, and only a `fn()`.
        let f = unsafe { std::mem::transmute::<usize, fn()>(f) };
        f();
    }
}

/// Registers the handlers, once per process: `take_locks` runs in the forking thread before
/// the fork, `empty_child` in the child once the locks are let go and the fork generation is
/// stepped.
pub fn register(take_locks: fn(), empty_child: fn()) {
    PREPARE.store(take_locks as usize, Release);
    CHILD.store(empty_child as usize, Release);
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
            let _ = HELD.try_with(|h| {
                if h.get().is_null() {
                    h.set(Box::into_raw(Box::default()));
                }
                // SAFETY: a box of this thread's, made above or by an earlier `hold`, freed only
                // by `release_all` (which clears the pointer first).
                unsafe { (*h.get()).push(Box::new(guard)) };
            });
        }
        Err(stuck) => crate::platform::log::stuck("fork's hold of gpushim's locks", stuck),
    }
}

fn release_all() {
    let _ = HELD.try_with(|h| {
        let p = h.replace(std::ptr::null_mut());
        if !p.is_null() {
            // SAFETY: the box `hold` made, no longer reachable through `HELD`.
            let mut held = unsafe { Box::from_raw(p) };
            // released in the reverse order of taking
            while held.pop().is_some() {}
        }
    });
}

extern "C" fn prepare() {
    let _ = std::panic::catch_unwind(|| {
        // (first: the scope of the shim's calls whose C-library locks a fork leaves held)
        hold(&gpushim_common::unforked::SCOPE);
        call(&PREPARE)
    });
}

extern "C" fn in_parent() {
    let _ = std::panic::catch_unwind(release_all);
}

extern "C" fn in_child() {
    let _ = std::panic::catch_unwind(|| {
        release_all();
        // (free even if the prepare handler could not take it)
        gpushim_common::unforked::reset_after_fork();
        gpushim_common::quota::FORK_GENERATION.fetch_add(1, Release);
        // (inherited: registered, whatever the parent's registering thread had got to)
        let _ = REGISTERED.set(());
        call(&CHILD);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Forks while another thread reads and writes the environment through
    /// `gpushim_common::unforked` (as the shim's first `cuInit` does): every child's own write
    /// returns. (With `std::env` called directly in the loop below, 92 of 100 children waited
    /// for ever on glibc's environment lock.)
    #[test]
    fn a_fork_never_lands_inside_the_shims_environment_calls() {
        use gpushim_common::unforked;
        // (under qemu-user, scripts/test-aarch64.sh, a child forked while another thread runs
        // now and then waits on a lock of the emulator's own: not this)
        if std::env::var_os("GPUSHIM_TEST_RUNNER").is_some() {
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "SKIPPED under emulation: qemu-user deadlocks now and then in a child forked while another thread runs");
            return;
        }
        fn no_locks() {}
        register(no_locks, no_locks);
        /// Stops the busy thread however the test ends.
        struct Stop(std::sync::Arc<std::sync::atomic::AtomicBool>);
        impl Drop for Stop {
            fn drop(&mut self) {
                self.0.store(true, Release);
            }
        }
        let stop = Stop(std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)));
        let busy = {
            let stop = stop.0.clone();
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Acquire) {
                    unforked::set_var("GPUSHIM_FORK_TEST_7c1d", n.to_string());
                    let _ = unforked::var_os("GPUSHIM_FORK_TEST_7c1d");
                    n += 1;
                }
            })
        };
        let (mut hung, mut failed) = (0, 0);
        for _ in 0..100 {
            // SAFETY: the child makes one C-library call and leaves with _exit (glibc's setenv:
            // its lock is the one the busy thread's writes take; the standard library's own is
            // also taken by other tests' threads reading the environment, outside the shim).
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                // SAFETY: as above; valid C strings.
                unsafe {
                    let rc = libc::setenv(c"GPUSHIM_FORK_TEST_CHILD_7c1d".as_ptr(), c"1".as_ptr(), 1);
                    libc::_exit(if rc == 0 { 0 } else { 1 });
                }
            }
            assert!(pid > 0, "fork failed");
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            let mut status = 0;
            // SAFETY: waiting for our own child, with a valid status pointer.
            while unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == 0 {
                if std::time::Instant::now() > deadline {
                    hung += 1;
                    // SAFETY: our own child.
                    unsafe {
                        libc::kill(pid, libc::SIGKILL);
                        libc::waitpid(pid, &mut status, 0);
                    }
                    break;
                }
                std::thread::yield_now();
            }
            if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
                failed += 1;
            }
        }
        drop(stop);
        busy.join().unwrap();
        assert_eq!((hung, failed), (0, 0), "children left waiting on an environment lock (hung, and not ended with 0)");
    }

    /// A `vfork` child that calls `exit` runs its parent's thread's thread-local destructors
    /// (glibc's `__call_tls_dtors`, in the parent's memory): the guards of the parent's next
    /// fork are still kept. (With `HELD` a thread-local with a destructor, the second `hold`
    /// let go of the lock at once.)
    #[test]
    fn a_vfork_childs_exit_leaves_the_fork_handler_its_guards() {
        static M: Bounded<()> = Bounded::new("test", ());
        // (from another thread: a lock held elsewhere times out rather than being refused)
        let held_elsewhere = || std::thread::spawn(|| M.lock_within(std::time::Duration::from_millis(20)).is_err()).join().unwrap();
        std::thread::spawn(move || {
            hold(&M);
            assert!(held_elsewhere(), "held for the fork");
            release_all();
            // SAFETY: glibc's own function, with no arguments, as `exit` calls it.
            unsafe {
                let f = libc::dlsym(libc::RTLD_DEFAULT, c"__call_tls_dtors".as_ptr());
                assert!(!f.is_null(), "glibc's __call_tls_dtors");
                std::mem::transmute::<*mut libc::c_void, extern "C" fn()>(f)();
            }
            hold(&M);
            let held = held_elsewhere();
            release_all();
            assert!(held, "held for the fork after the thread's destructors ran");
            assert!(!held_elsewhere(), "released");
        })
        .join()
        .unwrap();
    }
}
