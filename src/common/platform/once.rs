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
//! handler (the program's own, which may call CUDA) can find a lock taken. (An initialisation
//! may itself enter `unforked`'s scope for a C-library call: a fork waits for that call, not for
//! the initialisation.)
//!
//! Only one value is ever published (a compare-and-swap of its box): a runner that was taken
//! over (a thread that forked from inside the initialisation and goes on in the child) drops
//! its own and returns the published one.
//!
//! What taking over re-runs: the shim's file steps (the published file, the registry, a
//! shared quota) are made by other processes of the user at the same moment anyway, so a
//! half-done one in the parent is like another process' start-up (its open file descriptions
//! are inherited, though: a lock on one outlives the parent while the child lives). A step
//! inside a library (the driver's or NVML's `dlopen` and initialisation) runs again over that
//! library's half-initialised state, as a program that forked in the middle of it would.
//!
//! The wait for another thread of this process is bounded (`bounded`): a thread that finds the
//! step run by itself (a signal handler that interrupted the initialisation) gives up at once,
//! any other after `bounded::WAIT_BOUND`. [`ForkOnce::try_get_or_init`] then answers `Err`;
//! [`ForkOnce::get_or_init`], which must return a value, unwinds (without the panic message),
//! and the hook's `catch_unwind` refuses the call (`CUDA_ERROR_UNKNOWN`) with one line.

use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};

use crate::platform::bounded::{self, Backoff, Stuck};

/// What a one-time step is called in messages.
const WHAT: &str = "a one-time step of gpushim's start-up";

/// Forks this process has been through: the shim's `pthread_atfork` child handler adds one.
/// (A forked child's shared-quota membership and its [`ForkOnce`]s' runners are told apart
/// from its parent's by it.)
pub static FORK_GENERATION: AtomicU64 = AtomicU64::new(0);

const NEW: u64 = 0;
const DONE: u64 = 1;
/// Running: this bit, with the runner ([`runner`]).
const RUNNING: u64 = 2;

/// The running state of a runner: `RUNNING`, its pid in the high 32 bits and its fork
/// generation's low 30 bits between.
fn runner(pid: u32, generation: u64) -> u64 {
    RUNNING | (pid as u64) << 32 | (generation & 0x3FFF_FFFF) << 2
}

/// A value set once, also across `fork` (see the module documentation). `get_or_init`, `get`
/// and `set` as `std::sync::OnceLock`'s.
pub struct ForkOnce<T> {
    /// Who runs the initialisation (`NEW`, `RUNNING` with its runner, `DONE`).
    state: AtomicU64,
    /// The value, once published: a box, set once from null.
    value: AtomicPtr<T>,
    /// The running thread's mark (`bounded::this_thread`) while it runs, else 0.
    thread: AtomicUsize,
}

// SAFETY: the value is a box published once by compare-and-swap from null (Release), read
// only through a non-null pointer loaded with Acquire, and never changed or freed while the
// cell lives (as `OnceLock`: shared `&T` across threads needs `T: Sync`, moving it `T: Send`).
unsafe impl<T: Send + Sync> Sync for ForkOnce<T> {}
unsafe impl<T: Send> Send for ForkOnce<T> {}

impl<T> Default for ForkOnce<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> ForkOnce<T> {
    pub const fn new() -> Self {
        ForkOnce { state: AtomicU64::new(NEW), value: AtomicPtr::new(std::ptr::null_mut()), thread: AtomicUsize::new(0) }
    }

    #[inline]
    pub fn get(&self) -> Option<&T> {
        let p = self.value.load(Acquire);
        // SAFETY: a published box, never freed while `self` lives (see `Sync`).
        (!p.is_null()).then(|| unsafe { &*p })
    }

    /// The value, initialised by `f` if it is not yet. A wait for another thread's
    /// initialisation that gives up (see the module documentation) unwinds.
    #[inline]
    pub fn get_or_init(&self, f: impl FnOnce() -> T) -> &T {
        match self.get() {
            Some(v) => v,
            None => self.init(f).unwrap_or_else(|stuck| gave_up(stuck)),
        }
    }

    /// [`ForkOnce::get_or_init`], `Err` where it would unwind.
    #[inline]
    pub fn try_get_or_init(&self, f: impl FnOnce() -> T) -> Result<&T, Stuck> {
        match self.get() {
            Some(v) => Ok(v),
            None => self.init(f),
        }
    }

    /// Sets the value unless it was set (`Err`); waits while another thread sets it (bounded:
    /// `Err` also when that wait gave up).
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
    fn init(&self, f: impl FnOnce() -> T) -> Result<&T, Stuck> {
        let mut f = Some(f);
        let me = runner(crate::platform::sys::getpid() as u32, FORK_GENERATION.load(Acquire));
        let this_thread = bounded::this_thread();
        let mut backoff = Backoff::new();
        loop {
            if let Some(v) = self.get() {
                return Ok(v);
            }
            let now = self.state.load(Acquire);
            // new, or run by a process this one is a fork of (another pid or generation)
            let free = now == NEW || (now & RUNNING != 0 && now != me);
            if free && self.state.compare_exchange(now, me, Acquire, Acquire).is_ok() {
                // (cleared before the state leaves "running by this thread", so a mark seen
                // while it runs is the runner's own)
                self.thread.store(this_thread, Relaxed);
                /// Back to new if `f` unwinds (a later use runs it again, as `OnceLock`),
                /// unless it was taken over meanwhile.
                struct Unwound<'a>(&'a AtomicU64, &'a AtomicUsize, u64);
                impl Drop for Unwound<'_> {
                    fn drop(&mut self) {
                        self.1.store(0, Relaxed);
                        let _ = self.0.compare_exchange(self.2, NEW, Release, Acquire);
                    }
                }
                let unwound = Unwound(&self.state, &self.thread, me);
                // (run once: after it, a value is published, by this thread or another)
                let Some(f) = f.take() else { continue };
                let value = Box::into_raw(Box::new(f()));
                std::mem::forget(unwound);
                self.thread.store(0, Relaxed);
                match self.value.compare_exchange(std::ptr::null_mut(), value, Release, Acquire) {
                    Ok(_) => self.state.store(DONE, Release),
                    // taken over and published meanwhile: that one stands
                    // SAFETY: our own box, never published.
                    Err(_) => drop(unsafe { Box::from_raw(value) }),
                }
                continue;
            }
            // run by another thread of this process: wait for it (start-up's steps take
            // microseconds to milliseconds), unless it is this one (a signal handler that
            // interrupted it), and not for ever
            if now & RUNNING != 0 && self.thread.load(Relaxed) == this_thread {
                return Err(Stuck::Reentered(WHAT));
            }
            if !backoff.wait() {
                return Err(Stuck::TimedOut(WHAT));
            }
        }
    }
}

/// [`ForkOnce::get_or_init`] whose wait gave up: unwinds to the hook's `catch_unwind`, which
/// says why in one line (`resume_unwind`: no panic message, this is not a bug).
#[cold]
fn gave_up(stuck: Stuck) -> ! {
    std::panic::resume_unwind(Box::new(stuck))
}

impl<T> Drop for ForkOnce<T> {
    fn drop(&mut self) {
        let p = *self.value.get_mut();
        if !p.is_null() {
            // SAFETY: the published box; no reference outlives `&mut self`.
            drop(unsafe { Box::from_raw(p) });
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

    /// Used from inside its own initialisation, as a signal handler that interrupted the
    /// runner would: refused at once (it waited for ever); `get_or_init` unwinds with why. The
    /// runner's value is published as usual.
    #[test]
    fn a_use_by_its_own_runner_is_refused_at_once() {
        let cell: &'static ForkOnce<u32> = Box::leak(Box::new(ForkOnce::new()));
        let start = std::time::Instant::now();
        let got = *cell.get_or_init(|| {
            let unwound = std::panic::catch_unwind(|| *cell.get_or_init(|| 3));
            assert!(unwound.is_err(), "the inner use returned");
            assert_eq!(unwound.unwrap_err().downcast_ref::<Stuck>(), Some(&Stuck::Reentered(WHAT)));
            assert_eq!(cell.try_get_or_init(|| 2).err(), Some(Stuck::Reentered(WHAT)));
            1
        });
        assert_eq!((got, cell.get()), (1, Some(&1)));
        assert!(start.elapsed() < std::time::Duration::from_secs(1), "{:?}", start.elapsed());
    }

    /// Left running by another process (a parent forked in the middle of it) or an earlier
    /// fork generation: taken over. Left running by this process: waited for.
    #[test]
    fn a_runner_of_another_process_or_generation_is_taken_over() {
        let pid = crate::platform::sys::getpid() as u32;
        let generation = FORK_GENERATION.load(Acquire);
        for stale in [runner(pid ^ 1, generation), runner(pid, generation + 1)] {
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
        cell.state.store(runner(pid, generation), Relaxed); // (this process')
        let waiter = std::thread::spawn(|| *cell.get_or_init(|| 6));
        std::thread::sleep(std::time::Duration::from_millis(30));
        assert!(!waiter.is_finished(), "a runner of this process was not waited for");
        // as the runner would: the value published, then done
        cell.value.store(Box::into_raw(Box::new(9)), Release);
        cell.state.store(DONE, Release);
        assert_eq!(waiter.join().unwrap(), 9);
    }

    /// A runner taken over while inside its initialisation (a thread that forked from inside
    /// it and goes on in the child): the value published by the one that took over stands,
    /// and the late runner's is dropped; an unwinding late runner leaves the cell alone.
    #[test]
    fn a_runner_taken_over_leaves_the_published_value_alone() {
        let cell: &'static ForkOnce<String> = Box::leak(Box::new(ForkOnce::new()));
        let got = cell.get_or_init(|| {
            // (as after a fork: this runner's mark is another process')
            let stale = runner(crate::platform::sys::getpid() as u32 ^ 1, 0);
            cell.state.store(stale, Release);
            let other = std::thread::spawn(move || cell.get_or_init(|| "taken over".to_string()).clone());
            assert_eq!(other.join().unwrap(), "taken over");
            "late".to_string()
        });
        assert_eq!((got.as_str(), cell.get().map(String::as_str)), ("taken over", Some("taken over")));
        let cell: &'static ForkOnce<u32> = Box::leak(Box::new(ForkOnce::new()));
        let unwound = std::panic::catch_unwind(|| {
            cell.get_or_init(|| {
                cell.state.store(runner(crate::platform::sys::getpid() as u32 ^ 1, 0), Release);
                assert_eq!(std::thread::spawn(move || *cell.get_or_init(|| 3)).join().unwrap_or(0), 3);
                panic!("the late runner unwinds")
            })
        });
        assert!(unwound.is_err());
        assert_eq!((cell.get(), cell.state.load(Acquire)), (Some(&3), DONE));
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
