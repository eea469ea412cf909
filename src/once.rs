//! One-time initialisation that survives `fork`: [`ForkOnce`], the shim's `OnceLock`.
//!
//! A `std::sync::OnceLock` (or `Once`) whose initialisation another thread is running when the
//! process forks is copied into the child as "running" for ever: the runner does not exist
//! there, and the child's first use waits without end (its `cuInit`, its first allocation: a
//! hang inside the host program). A [`ForkOnce`] records who runs it, the process (its pid)
//! and the fork generation ([`FORK_GENERATION`], stepped by the shim's child handler); a
//! thread that finds it run by another process, or by an earlier generation, is in a forked
//! child and takes it over, running the initialisation itself, as a first use would. Nothing
//! is held across `fork`, so no fork waits for an initialisation and no `pthread_atfork`
//! handler (the program's own, which may call CUDA) can find a lock taken.
//!
//! Taking over is sound for the shim's initialisations because each is also made by another
//! process of the user at the same time (opening the driver, a file in the state directory,
//! the registry), so a half-done one in the parent is like another process' start-up.

use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, Ordering::Acquire, Ordering::Release};

/// Forks this process has been through: the shim's `pthread_atfork` child handler adds one.
/// (A forked child's shared-quota membership and its [`ForkOnce`]s' runners are told apart
/// from its parent's by it.)
pub static FORK_GENERATION: AtomicU64 = AtomicU64::new(0);

const NEW: u64 = 0;
const DONE: u64 = 1;
/// Running: this bit, with the runner's pid in the high 32 bits and its fork generation's low
/// 30 bits between.
const RUNNING: u64 = 2;

/// A value set once, also across `fork` (see the module documentation). `get_or_init`, `get`
/// and `set` as `std::sync::OnceLock`'s.
pub struct ForkOnce<T> {
    state: AtomicU64,
    value: UnsafeCell<MaybeUninit<T>>,
}

// SAFETY: the value is written once, by the one thread whose compare-and-swap marked the cell
// running, before it is published with `DONE` (Release); it is read only after `DONE` was seen
// (Acquire), and never changed or dropped after. A taken-over cell's value was never published.
unsafe impl<T: Send + Sync> Sync for ForkOnce<T> {}
unsafe impl<T: Send> Send for ForkOnce<T> {}

impl<T> Default for ForkOnce<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> ForkOnce<T> {
    pub const fn new() -> Self {
        ForkOnce { state: AtomicU64::new(NEW), value: UnsafeCell::new(MaybeUninit::uninit()) }
    }

    #[inline]
    pub fn get(&self) -> Option<&T> {
        if self.state.load(Acquire) == DONE {
            // SAFETY: `DONE` is stored after the value was written (see `Sync`).
            Some(unsafe { (*self.value.get()).assume_init_ref() })
        } else {
            None
        }
    }

    #[inline]
    pub fn get_or_init(&self, f: impl FnOnce() -> T) -> &T {
        match self.get() {
            Some(v) => v,
            None => self.init(f),
        }
    }

    /// Sets the value unless it was set (`Err`); waits while another thread sets it.
    pub fn set(&self, value: T) -> Result<(), T> {
        let mut value = Some(value);
        let _ = self.init(|| value.take().expect("runs at most once"));
        match value {
            None => Ok(()),
            Some(v) => Err(v),
        }
    }

    #[cold]
    #[inline(never)]
    fn init(&self, f: impl FnOnce() -> T) -> &T {
        let me = RUNNING | (crate::sys::getpid() as u32 as u64) << 32 | (FORK_GENERATION.load(Acquire) & 0x3FFF_FFFF) << 2;
        let mut spins = 0u32;
        loop {
            let now = self.state.load(Acquire);
            if now == DONE {
                return self.get().expect("done");
            }
            // new, or run by a process this one is a fork of (another pid or generation)
            let free = now == NEW || (now & RUNNING != 0 && now != me);
            if free && self.state.compare_exchange(now, me, Acquire, Acquire).is_ok() {
                /// Back to new if `f` unwinds (a later use runs it again, as `OnceLock`).
                struct Unwound<'a>(&'a AtomicU64);
                impl Drop for Unwound<'_> {
                    fn drop(&mut self) {
                        self.0.store(NEW, Release);
                    }
                }
                let unwound = Unwound(&self.state);
                let value = f();
                std::mem::forget(unwound);
                // SAFETY: this thread marked the cell running; no one reads the value before
                // `DONE` (a taken-over value was never published: no reference to it exists).
                unsafe { (*self.value.get()).write(value) };
                self.state.store(DONE, Release);
                return self.get().expect("done");
            }
            // run by another thread of this process: wait for it (start-up's steps take
            // microseconds to milliseconds)
            spins = wait(spins);
        }
    }
}

impl<T> Drop for ForkOnce<T> {
    fn drop(&mut self) {
        if *self.state.get_mut() == DONE {
            // SAFETY: set (`DONE`), and no reference outlives `&mut self`.
            unsafe { self.value.get_mut().assume_init_drop() };
        }
    }
}

/// `std::sync::Once`'s `call_once`: `f` runs once, by the first caller.
impl ForkOnce<()> {
    #[inline]
    pub fn call_once(&self, f: impl FnOnce()) {
        self.get_or_init(f);
    }
}

fn wait(spins: u32) -> u32 {
    match spins {
        0..64 => std::hint::spin_loop(),
        64..256 => std::thread::yield_now(),
        _ => std::thread::sleep(std::time::Duration::from_micros(50)),
    }
    spins.saturating_add(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    use std::sync::Arc;

    #[test]
    fn one_thread_runs_it_the_others_wait_for_its_value() {
        let cell: &'static ForkOnce<usize> = Box::leak(Box::new(ForkOnce::new()));
        let runs = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let runs = runs.clone();
                std::thread::spawn(move || {
                    *cell.get_or_init(|| {
                        runs.fetch_add(1, Relaxed);
                        std::thread::sleep(std::time::Duration::from_millis(5));
                        100 + t
                    })
                })
            })
            .collect();
        let got: Vec<usize> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(runs.load(Relaxed), 1);
        assert!(got.iter().all(|&v| v == got[0]) && (100..108).contains(&got[0]), "{got:?}");
        assert_eq!(cell.set(7), Err(7));
        assert_eq!(cell.get(), Some(&got[0]));
    }

    #[test]
    fn set_get_and_an_unwound_initialisation() {
        let cell = ForkOnce::new();
        assert_eq!(cell.get(), None);
        assert!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cell.get_or_init(|| panic!("unwinds")))).is_err());
        assert_eq!(cell.get(), None); // (as new: run again)
        assert_eq!(cell.set("a".to_string()), Ok(()));
        assert_eq!(cell.set("b".to_string()), Err("b".to_string()));
        assert_eq!(cell.get_or_init(|| "c".to_string()), "a");
        let once = ForkOnce::new();
        let mut n = 0;
        once.call_once(|| n += 1);
        once.call_once(|| n += 1);
        assert_eq!(n, 1);
    }

    /// Left running by another process (a parent forked in the middle of it) or an earlier
    /// fork generation: taken over. Left running by this process: waited for.
    #[test]
    fn a_runner_of_another_process_or_generation_is_taken_over() {
        let pid = crate::sys::getpid() as u32 as u64;
        let generation = FORK_GENERATION.load(Acquire) & 0x3FFF_FFFF;
        for stale in [RUNNING | (pid ^ 1) << 32 | generation << 2, RUNNING | pid << 32 | ((generation + 1) & 0x3FFF_FFFF) << 2] {
            let cell: &'static ForkOnce<u32> = Box::leak(Box::new(ForkOnce::new()));
            cell.state.store(stale, Relaxed);
            let user = std::thread::spawn(|| *cell.get_or_init(|| 5));
            for _ in 0..500 {
                if user.is_finished() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            assert!(user.is_finished(), "{stale:#x}: waited for a runner that is not in this process");
            assert_eq!(user.join().unwrap(), 5);
        }
        let cell: &'static ForkOnce<u32> = Box::leak(Box::new(ForkOnce::new()));
        cell.state.store(RUNNING | pid << 32 | generation << 2, Relaxed); // (this process')
        let waiter = std::thread::spawn(|| *cell.get_or_init(|| 6));
        std::thread::sleep(std::time::Duration::from_millis(30));
        assert!(!waiter.is_finished(), "a runner of this process was not waited for");
        // SAFETY: as the runner would: the value, then done.
        unsafe { (*cell.value.get()).write(9) };
        cell.state.store(DONE, Release);
        assert_eq!(waiter.join().unwrap(), 9);
    }

    /// The real thing: a thread runs an initialisation (held in the middle of it) while the
    /// process forks; the child's own use of the cell returns (a `std::sync::OnceLock` there
    /// waits for ever). The child steps the fork generation as the shim's handler does.
    #[test]
    fn a_child_forked_in_the_middle_of_it_runs_it_itself() {
        static CELL: ForkOnce<u32> = ForkOnce::new();
        let (inside, go) = (Arc::new(std::sync::Barrier::new(2)), Arc::new(std::sync::Barrier::new(2)));
        let runner = {
            let (inside, go) = (inside.clone(), go.clone());
            std::thread::spawn(move || {
                *CELL.get_or_init(|| {
                    inside.wait();
                    go.wait();
                    1
                })
            })
        };
        inside.wait();
        // SAFETY: the child only touches atomics, the cell and `_exit`.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            FORK_GENERATION.fetch_add(1, Release);
            let v = *CELL.get_or_init(|| 2);
            // SAFETY: ends the child without running the test harness' exit.
            unsafe { libc::_exit(if v == 2 { 0 } else { 1 }) };
        }
        assert!(pid > 0);
        let mut status = 0;
        let mut waited = 0;
        // SAFETY: waits for the child just forked.
        while unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == 0 {
            waited += 1;
            if waited > 1000 {
                // SAFETY: the child of this test.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, &mut status, 0);
                }
                panic!("the child waited for a runner that is not in it");
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child status {status}");
        go.wait();
        assert_eq!(runner.join().unwrap(), 1);
        assert_eq!(CELL.get(), Some(&1));
    }
}
