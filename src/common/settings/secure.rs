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
//! * [`scrub_environment`]: the markers the shim passes to its own children
//!   (`GPUSHIM_VIEW_APPLIED`, `GPUSHIM_VIEW_PENDING`, `GPUSHIM_ORIGINAL_CUDA_VISIBLE_DEVICES`)
//!   and the caller's `CUDA_VISIBLE_DEVICES` are removed, when the library is loaded and again
//!   before the first CUDA or NVML call is served (a library's constructor may call CUDA before
//!   the shim's runs), so the caller can neither forge a parent's device view nor re-aim the
//!   system file's ordinals (`memory_limits.0`, `visible_devices = [0]`) at another GPU;
//! * `XDG_RUNTIME_DIR` is not consulted: the default state directory is `/run/gpushim` for root
//!   and `/tmp/gpushim-<effective uid>` for another user, and the shim's files must belong to the
//!   effective user;
//! * where the effective user is the caller (set-group-ID, file capabilities), the state
//!   directory and its files would be the caller's to rewrite (the budget's figures live in the
//!   published file, the quota files hold a process-shared mutex): [`caller_owns_state`] — the
//!   process' figures are not published, it joins no registry, and a shared quota is a
//!   configuration error;
//! * a path in the system file (log file, report, driver, NVML, state directory) must be
//!   absolute (a relative one would name a file in the caller's current directory), and no log
//!   file or report file is written at all (the log goes to stderr; `report = "stderr"` works):
//!   a file opened as the program's owner in a directory the caller can reach could be a FIFO
//!   that blocks, a link, or another user's file.

/// Whether the process runs with secure execution (`getauxval(AT_SECURE)`, as glibc decides).
pub fn secure_execution() -> bool {
    // SAFETY: getauxval reads the process' auxiliary vector; no preconditions.
    unsafe { libc::getauxval(libc::AT_SECURE) != 0 }
}

/// In a secure-execution process whose effective user is the caller (set-group-ID, file
/// capabilities): the shim's shared files would belong to the caller (see the module docs).
pub fn caller_owns_state() -> bool {
    // SAFETY: getuid and geteuid cannot fail.
    secure_execution() && unsafe { libc::geteuid() == libc::getuid() }
}

/// In a secure-execution process, removes what the caller's environment could use to re-aim
/// the view (see the module docs); elsewhere nothing. Idempotent.
pub fn scrub_environment() {
    if !secure_execution() {
        return;
    }
    const CALLERS: [&str; 4] = [
        "CUDA_VISIBLE_DEVICES",
        crate::settings::config::ENV_VIEW_APPLIED,
        crate::settings::config::ENV_VIEW_PENDING,
        crate::settings::config::ENV_ORIGINAL_CUDA_VISIBLE_DEVICES,
    ];
    for name in CALLERS {
        if crate::unforked::var_os(name).is_some() {
            crate::unforked::remove_var(name);
        }
    }
}
