//! Secure execution (set-user-ID, set-group-ID, file capabilities): whether this process runs
//! with `AT_SECURE`, and what the shim then refuses to take from the environment.
//!
//! In such a process the environment belongs to the unprivileged caller, not to the program.
//! glibc's `secure_getenv` and the dynamic loader (which drops `LD_PRELOAD`, `LD_LIBRARY_PATH`
//! and friends) decide by the same auxiliary-vector entry. The shim's policy there:
//!
//! * **no setting comes from the environment**: every `GPUSHIM_…` variable and HAMi-core alias
//!   is ignored, `GPUSHIM_CONFIG` included, so only the system config file
//!   (`/etc/gpushim/gpushim.toml`, written by the administrator) applies; `GPUSHIM_DISABLE`
//!   cannot lift its limits either;
//! * the markers the shim passes to its own children (`GPUSHIM_VIEW_APPLIED`,
//!   `GPUSHIM_VIEW_PENDING`, `GPUSHIM_ORIGINAL_CUDA_VISIBLE_DEVICES`) are removed when the
//!   library is loaded, as the loader removes its unsafe variables, so the caller cannot forge
//!   a parent's device view;
//! * `XDG_RUNTIME_DIR` is not consulted: the default state directory is
//!   `/tmp/gpushim-<effective uid>`, and the shim's files must belong to the effective user;
//! * a path in the system file (log file, report, driver, NVML, state directory) must be
//!   absolute (a relative one would name a file in the caller's current directory): otherwise
//!   CUDA initialisation fails with a configuration error; the log file and the report are
//!   opened without following a final symbolic link.
//!
//! `CUDA_VISIBLE_DEVICES` is still read: the driver reads it too, and it can only narrow and
//! reorder what the system file shows.

/// Whether the process runs with secure execution (`getauxval(AT_SECURE)`, as glibc decides).
pub fn secure_execution() -> bool {
    // SAFETY: getauxval reads the process' auxiliary vector; no preconditions.
    unsafe { libc::getauxval(libc::AT_SECURE) != 0 }
}

/// `O_NOFOLLOW` in a secure-execution process, else nothing: the flag the shim adds when it
/// opens a file the configuration names for writing (the log file, the report).
pub fn no_follow() -> libc::c_int {
    if secure_execution() {
        libc::O_NOFOLLOW
    } else {
        0
    }
}
