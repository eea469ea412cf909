//! `gpushim sim [--gpus N] [--memory SIZE] [-- COMMAND [ARGS...]]`: runs a shell (or COMMAND) on
//! the project's simulated GPUs, whose processes share one simulated node. The node's state is
//! in a private directory (see `private_dir`) that is removed when it ends or when this process
//! is stopped by a signal it can catch; the libraries are found through soname links in a
//! persistent directory beside them (`private_dir::soname_dir`), never in a temporary one.
//! Nothing of this is in the preloaded library.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicI32, Ordering};

use crate::cli::SimArgs;
use crate::private_dir::{soname_dir, PrivateDir};
use crate::units::format_size;
use crate::Failure;

/// The simulated driver and NVML as cargo builds them, and the names programs open them by.
const LIBRARIES: [(&str, &str); 2] = [("libcuda.so", "libcuda.so.1"), ("libnvidia_ml.so", "libnvidia-ml.so.1")];
const BUILD: &str = "cargo build --release -p gpusim-cuda -p gpusim-nvml";

pub fn main(a: &SimArgs) -> Result<(), Failure> {
    // SIGCHLD inherited ignored would reap the command at once and lose its status: the default
    // while this process waits for it (the command gets the inherited one back)
    let sigchld = Signals::default_sigchld();
    let libraries = find_libraries()?;
    let sonames = sonames(&libraries)?;
    // From here until the command runs, the signals that would end this process wait (blocked),
    // so that none ends it between making the directory and being able to remove it.
    let signals = Signals::block();
    let dir = PrivateDir::create().map_err(|e| Failure::setup("sim", e))?;
    let (program, args): (OsString, &[OsString]) = match a.command.split_first() {
        Some((p, rest)) => (p.clone(), rest),
        None => (std::env::var_os("SHELL").filter(|s| !s.is_empty()).unwrap_or_else(|| "/bin/sh".into()), &[]),
    };
    let mut search = OsString::from(sonames.as_os_str());
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|p| !p.is_empty()) {
        search.push(":");
        search.push(old);
    }
    // `gpushim` works in there (after the user's own PATH, which wins)
    let mut path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    if let Some(dir) = std::env::current_exe().ok().and_then(|e| e.parent().map(Path::to_path_buf)) {
        path.push(":");
        path.push(dir);
    }
    let leave = if a.command.is_empty() { "leave it with exit or Ctrl-D" } else { "it ends with the command" };
    // (not eprintln: a closed stderr must not end this process before it cleans up)
    let _ = writeln!(
        std::io::stderr(),
        "gpushim sim: SIMULATED GPUs ({} x {}), not real ones: the project's simulated CUDA driver and NVML; {leave}",
        a.gpus,
        format_size(a.memory)
    );
    let mut command = Command::new(&program);
    command
        .args(args)
        .env("LD_LIBRARY_PATH", search)
        .env("PATH", path)
        .env("GPUSIM_DEVICES", a.gpus.to_string())
        .env("GPUSIM_MEMORY", a.memory.to_string())
        .env("GPUSIM_NODE_STATE", dir.path().join("node-state"));
    let original = signals.original;
    let mut actions = signals.actions.clone();
    actions.push((libc::SIGCHLD, sigchld));
    // SAFETY: sigaction and sigprocmask are async-signal-safe, and the closure only reads what
    // was made before the fork: the command gets this process' original dispositions (those
    // replaced by `forward`, and SIGCHLD) and then its original mask (std empties it before).
    unsafe {
        command.pre_exec(move || {
            for (signal, action) in &actions {
                libc::sigaction(*signal, action, std::ptr::null_mut());
            }
            libc::sigprocmask(libc::SIG_SETMASK, &original, std::ptr::null_mut());
            Ok(())
        });
    }
    let mut child = match command.spawn() {
        Ok(c) => c,
        Err(e) => return Err(crate::run::exec_failure("sim", &program, &e)),
    };
    // Ctrl-C and Ctrl-\ from the terminal are the command's (a shell's, a program's): this
    // process waits for it and then cleans up, as a shell does for its foreground job. The
    // other signals that would end this process, and SIGINT or SIGQUIT sent by a process
    // (kill, timeout), are passed on to the command, so that the directory is removed then too.
    CHILD.store(child.id() as i32, Ordering::SeqCst);
    drop(signals);
    wait_without_reaping(child.id() as i32);
    // the pid is free again once reaped: nothing is passed on from here
    CHILD.store(0, Ordering::SeqCst);
    let status = child.wait().map_err(|e| Failure::setup("sim", format!("cannot wait for the command: {e}")))?;
    drop(dir);
    match (status.code(), status.signal()) {
        (Some(0), _) => Ok(()),
        (Some(code), _) => Err(Failure::status(code.clamp(0, 255) as u8)),
        (None, Some(signal)) => Err(Failure::status((128 + signal).clamp(0, 255) as u8)),
        (None, None) => Err(Failure::status(1)),
    }
}

/// Waits until the command `pid` has ended, leaving it unreaped (its pid cannot be reused yet).
fn wait_without_reaping(pid: i32) {
    loop {
        // SAFETY: an all-zero siginfo_t is valid; waitid fills it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid on our own child, WNOWAIT: it stays a zombie for child.wait().
        let r = unsafe { libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return;
        }
    }
}

/// The command's pid while it may be signalled (0 before it runs and once it has ended), for
/// [`forward`].
static CHILD: AtomicI32 = AtomicI32::new(0);

/// The signals whose default ends a process and which this process can catch, except those of
/// a crash (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGSYS, SIGTRAP): passed on to the command.
fn forwarded() -> Vec<libc::c_int> {
    let mut all = vec![
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGINT,
        libc::SIGQUIT,
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGALRM,
        libc::SIGPIPE,
        libc::SIGVTALRM,
        libc::SIGPROF,
        libc::SIGXCPU,
        libc::SIGXFSZ,
        libc::SIGIO,
        libc::SIGPWR,
        libc::SIGSTKFLT,
    ];
    all.extend(libc::SIGRTMIN()..=libc::SIGRTMAX());
    all
}

/// While held, the [`forwarded`] signals are blocked (their handler, [`forward`], is installed
/// at once, except over those ignored: they stay ignored, here and for the command); dropped,
/// they are unblocked and the pending ones are handled.
struct Signals {
    original: libc::sigset_t,
    /// The dispositions replaced by `forward`, for the command.
    actions: Vec<(libc::c_int, libc::sigaction)>,
}

impl Signals {
    /// Sets SIGCHLD to its default action, and returns the one it had.
    fn default_sigchld() -> libc::sigaction {
        // SAFETY: plain C structures; sigaction only reads `dfl` and fills `old`.
        unsafe {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGCHLD, &dfl, &mut old);
            old
        }
    }

    fn block() -> Signals {
        // SAFETY: sigset_t and sigaction are plain C structures, filled by the calls below;
        // `forward` only reads an atomic and calls kill(2), both async-signal-safe.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for s in forwarded() {
                libc::sigaddset(&mut set, s);
            }
            let mut original: libc::sigset_t = std::mem::zeroed();
            libc::sigprocmask(libc::SIG_BLOCK, &set, &mut original);
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = forward as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) as libc::sighandler_t;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            action.sa_mask = set;
            let mut actions = Vec::new();
            for s in forwarded() {
                let mut old: libc::sigaction = std::mem::zeroed();
                // (a null act: only reads the disposition)
                if libc::sigaction(s, std::ptr::null(), &mut old) != 0 || old.sa_sigaction == libc::SIG_IGN {
                    continue;
                }
                libc::sigaction(s, &action, std::ptr::null_mut());
                actions.push((s, old));
            }
            Signals { original, actions }
        }
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        // SAFETY: restoring the mask saved in `block`.
        unsafe { libc::sigprocmask(libc::SIG_SETMASK, &self.original, std::ptr::null_mut()) };
    }
}

/// Passes `signal` on to the command, except SIGINT, SIGQUIT and SIGPIPE that the kernel sent
/// (a terminal's Ctrl-C and Ctrl-\ reach the command through its process group; a SIGPIPE is
/// this process' own write, which the kernel may also send as from this process).
extern "C" fn forward(signal: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo_t (SA_SIGINFO); si_code <= 0: sent by a process.
    let by_process = info.is_null() || unsafe { (*info).si_code } <= 0;
    if !by_process && matches!(signal, libc::SIGINT | libc::SIGQUIT | libc::SIGPIPE) {
        return;
    }
    // SAFETY: as above; getpid is async-signal-safe. A SIGPIPE of this process' own write (to a
    // closed stderr) comes as sent by itself (SI_USER, its pid): not the command's.
    if signal == libc::SIGPIPE && !info.is_null() && unsafe { (*info).si_pid() == libc::getpid() } {
        return;
    }
    let pid = CHILD.load(Ordering::SeqCst);
    if pid > 0 {
        // SAFETY: errno of this thread, saved around kill(2) on the command's pid.
        unsafe {
            let errno = *libc::__errno_location();
            libc::kill(pid, signal);
            *libc::__errno_location() = errno;
        }
    }
}

/// The directory of soname links to `libraries` (`private_dir::soname_dir`), all in one
/// directory: each link is `../FILE`.
fn sonames(libraries: &[PathBuf]) -> Result<PathBuf, Failure> {
    let dir = libraries[0].parent().unwrap_or(Path::new("/"));
    if libraries.iter().any(|l| l.parent() != Some(dir)) {
        return Err(Failure::setup("sim", format!("the simulator's libraries are not all in one directory: {libraries:?}")));
    }
    let links: Vec<(&str, String)> = LIBRARIES.iter().map(|(file, soname)| (*soname, format!("../{file}"))).collect();
    soname_dir(dir, &links).map_err(|e| Failure::setup("sim", e))
}

/// The simulator's libraries next to this program (a cargo build: target/release/), else in
/// ../lib from it (an installed tree).
fn find_libraries() -> Result<Vec<PathBuf>, Failure> {
    let exe = std::env::current_exe()
        .and_then(std::fs::canonicalize)
        .map_err(|e| Failure::setup("sim", format!("cannot locate the gpushim executable: {e}")))?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    LIBRARIES
        .iter()
        .map(|(file, _)| {
            [dir.join(file), dir.join("../lib").join(file)]
                .into_iter()
                .find_map(|c| std::fs::canonicalize(c).ok().filter(|p| p.is_file()))
                .ok_or_else(|| {
                    Failure::setup(
                        "sim",
                        format!("the simulated GPUs are not built: no {file} in {}; build them with: {BUILD}", dir.display()),
                    )
                })
        })
        .collect()
}
