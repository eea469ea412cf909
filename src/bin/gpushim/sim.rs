//! `gpushim sim [--gpus N] [--memory SIZE] [-- COMMAND [ARGS...]]`: runs a shell (or COMMAND) on
//! the project's simulated GPUs, whose processes share one simulated node, from a private
//! directory that is removed when it ends. Nothing of this is in the preloaded library.

use std::ffi::{CString, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicI32, Ordering};

use crate::cli::SimArgs;
use crate::units::format_size;
use crate::Failure;

/// The simulated driver and NVML as cargo builds them, and the names programs open them by.
const LIBRARIES: [(&str, &str); 2] = [("libcuda.so", "libcuda.so.1"), ("libnvidia_ml.so", "libnvidia-ml.so.1")];
const BUILD: &str = "cargo build --release -p gpusim-cuda -p gpusim-nvml";

pub fn main(a: &SimArgs) -> Result<(), Failure> {
    let libraries = find_libraries()?;
    let dir = PrivateDir::create()?;
    for (built, soname) in LIBRARIES.iter().zip(&libraries).map(|((_, soname), path)| (path, soname)) {
        std::os::unix::fs::symlink(built, dir.0.join(soname))
            .map_err(|e| Failure::setup("sim", format!("cannot link {} in {}: {e}", built.display(), dir.0.display())))?;
    }
    let (program, args): (OsString, &[OsString]) = match a.command.split_first() {
        Some((p, rest)) => (p.clone(), rest),
        None => (std::env::var_os("SHELL").filter(|s| !s.is_empty()).unwrap_or_else(|| "/bin/sh".into()), &[]),
    };
    let mut search = OsString::from(dir.0.as_os_str());
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
    eprintln!(
        "gpushim sim: SIMULATED GPUs ({} x {}), not real ones: the project's simulated CUDA driver and NVML; {leave}",
        a.gpus,
        format_size(a.memory)
    );
    let child = Command::new(&program)
        .args(args)
        .env("LD_LIBRARY_PATH", search)
        .env("PATH", path)
        .env("GPUSIM_DEVICES", a.gpus.to_string())
        .env("GPUSIM_MEMORY", a.memory.to_string())
        .env("GPUSIM_NODE_STATE", dir.0.join("node-state"))
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return Err(crate::run::exec_failure("sim", &program, &e)),
    };
    // Ctrl-C and Ctrl-\ are the command's (a shell's, a program's): this process waits for it
    // and then cleans up, as a shell does for its foreground job. SIGTERM and SIGHUP sent to
    // this process are passed on to the command, so that the directory is removed then too.
    CHILD.store(child.id() as i32, Ordering::Relaxed);
    // SAFETY: changing signal dispositions; `forward` only calls kill(2), which is
    // async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGQUIT, libc::SIG_IGN);
        for signal in [libc::SIGTERM, libc::SIGHUP] {
            libc::signal(signal, forward as extern "C" fn(libc::c_int) as libc::sighandler_t);
        }
    }
    let status = child.wait().map_err(|e| Failure::setup("sim", format!("cannot wait for the command: {e}")))?;
    drop(dir);
    match (status.code(), status.signal()) {
        (Some(0), _) => Ok(()),
        (Some(code), _) => Err(Failure::status(code.clamp(0, 255) as u8)),
        (None, Some(signal)) => Err(Failure::status((128 + signal).clamp(0, 255) as u8)),
        (None, None) => Err(Failure::status(1)),
    }
}

/// The command's pid, for [`forward`].
static CHILD: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(signal: libc::c_int) {
    let pid = CHILD.load(Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill(2) on the child's pid.
        unsafe { libc::kill(pid, signal) };
    }
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

/// A directory only this user can enter (mkdtemp: a fresh name, mode 0700), removed with
/// everything in it when dropped.
struct PrivateDir(PathBuf);

impl PrivateDir {
    /// In `$XDG_RUNTIME_DIR` (the user's own), else `$TMPDIR`, else /tmp.
    fn create() -> Result<PrivateDir, Failure> {
        let base = ["XDG_RUNTIME_DIR", "TMPDIR"]
            .iter()
            .filter_map(std::env::var_os)
            .map(PathBuf::from)
            .find(|p| p.is_absolute() && p.is_dir())
            .unwrap_or_else(|| PathBuf::from("/tmp"));
        let template = base.join("gpushim-sim-XXXXXX");
        let template = CString::new(template.as_os_str().as_bytes())
            .map_err(|_| Failure::setup("sim", format!("{}: NUL in the path", base.display())))?;
        let mut bytes = template.into_bytes_with_nul();
        // SAFETY: a NUL-terminated template ending in XXXXXX, which mkdtemp fills in place.
        let made = unsafe { libc::mkdtemp(bytes.as_mut_ptr().cast()) };
        if made.is_null() {
            let e = std::io::Error::last_os_error();
            return Err(Failure::setup("sim", format!("cannot make a private directory in {}: {e} (set TMPDIR to a writable directory)", base.display())));
        }
        bytes.pop();
        Ok(PrivateDir(PathBuf::from(OsString::from_vec(bytes))))
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            eprintln!("gpushim sim: cannot remove {}: {e}", self.0.display());
        }
    }
}
