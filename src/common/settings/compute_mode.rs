//! Which mode enforces the compute limit (`GPUSHIM_COMPUTE_MODE`), `auto` resolved by looking
//! for a reachable MPS control daemon: shared by the library (`compute::mode`) and `gpushim
//! check`, so both say the same.
//!
//! `auto` is `mps` when the MPS control daemon's pipe directory (`CUDA_MPS_PIPE_DIRECTORY`, not
//! in a secure-execution process, else `/tmp/nvidia-mps`) holds a `control` UNIX socket that
//! accepts a connection (non-blocking, closed at once). Another local user can create
//! `/tmp/nvidia-mps/control`, and the limited user could start an MPS daemon of its own (which
//! needs no privilege) to trade the pacer for a daemon it controls, so the socket counts only
//! when the directory and the socket are owned by root and the directory is not writable by
//! others (group or world). Anything else — and anything unsure — is `duty`.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::settings::config::{ComputeMode, Settings};

/// The MPS control daemon's default pipe directory.
pub const DEFAULT_PIPE_DIRECTORY: &str = "/tmp/nvidia-mps";
/// The variable naming another pipe directory.
pub const ENV_PIPE_DIRECTORY: &str = "CUDA_MPS_PIPE_DIRECTORY";

/// How the compute limit is enforced in this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// No compute limit: the launch functions are the driver's own.
    None,
    /// The shim's pacer.
    Duty,
    /// The MPS client variables (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, …).
    Mps,
    /// Green contexts with the limit's share of SMs.
    Green,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::None => "none",
            Mode::Duty => "duty",
            Mode::Mps => "mps",
            Mode::Green => "green",
        }
    }
}

/// The mode and, for `auto`, why it chose what it chose (`None`: nothing to say).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    pub mode: Mode,
    pub why: Option<String>,
}

/// The mode for `settings`. `pipe_dir`: the program's `CUDA_MPS_PIPE_DIRECTORY` (ignored when
/// `secure`, a secure-execution process).
pub fn resolve(settings: &Settings, pipe_dir: Option<&OsStr>, secure: bool) -> Resolved {
    if settings.disable || !settings.compute_limits_anything() {
        return Resolved { mode: Mode::None, why: None };
    }
    match settings.compute_mode {
        ComputeMode::Duty => Resolved { mode: Mode::Duty, why: None },
        ComputeMode::Mps => Resolved { mode: Mode::Mps, why: None },
        ComputeMode::Green => Resolved { mode: Mode::Green, why: None },
        ComputeMode::Auto => {
            let dir = pipe_directory(pipe_dir, secure);
            // SAFETY: geteuid cannot fail.
            let euid = unsafe { libc::geteuid() };
            match mps_reachable(&dir, euid) {
                Ok(()) => Resolved { mode: Mode::Mps, why: Some(format!("an MPS control daemon is reachable at {}", dir.join("control").display())) },
                Err(why) => Resolved { mode: Mode::Duty, why: Some(format!("no usable MPS control daemon: {why}")) },
            }
        }
    }
}

/// The pipe directory MPS clients use.
pub fn pipe_directory(pipe_dir: Option<&OsStr>, secure: bool) -> PathBuf {
    match pipe_dir {
        Some(d) if !secure && !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from(DEFAULT_PIPE_DIRECTORY),
    }
}

/// Whether `dir/control` is a trustworthy UNIX socket that accepts a connection; else why not.
pub fn mps_reachable(dir: &Path, euid: u32) -> Result<(), String> {
    // (root only: a daemon of the limited user's own would let it choose to be unlimited)
    let _ = euid;
    let trusted = |uid: u32| uid == 0;
    let d = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !d.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    if !trusted(d.uid()) {
        return Err(format!("{} belongs to uid {}, not root", dir.display(), d.uid()));
    }
    if d.mode() & 0o022 != 0 {
        return Err(format!("{} is writable by others (mode {:o})", dir.display(), d.mode() & 0o7777));
    }
    let control = dir.join("control");
    let s = std::fs::symlink_metadata(&control).map_err(|e| format!("{}: {e}", control.display()))?;
    if !s.file_type().is_socket() {
        return Err(format!("{} is not a socket", control.display()));
    }
    if !trusted(s.uid()) {
        return Err(format!("{} belongs to uid {}, not root", control.display(), s.uid()));
    }
    connect(&control).map_err(|e| format!("{}: {e}", control.display()))
}

/// Connects to the UNIX socket at `path` without blocking (a connection in progress counts:
/// the daemon is there) and closes it.
fn connect(path: &Path) -> Result<(), std::io::Error> {
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: a zeroed sockaddr_un is valid; the path is copied in below, bounded.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "path too long for a socket"));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, &b) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = b as libc::c_char;
    }
    // SAFETY: plain socket call.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `addr` is a valid sockaddr_un of the size given; `fd` is ours and closed below.
    let rc = unsafe { libc::connect(fd, &addr as *const libc::sockaddr_un as *const libc::sockaddr, std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t) };
    let err = std::io::Error::last_os_error();
    // SAFETY: closes the socket made above.
    unsafe { libc::close(fd) };
    if rc == 0 || err.raw_os_error() == Some(libc::EINPROGRESS) || err.raw_os_error() == Some(libc::EAGAIN) {
        Ok(())
    } else {
        Err(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn limited(mode: ComputeMode) -> Settings {
        Settings { compute_limit: Some(0.3), compute_mode: mode, ..Settings::default() }
    }

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gpushim-mps-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        d
    }

    #[test]
    fn no_limit_is_no_mode_and_explicit_modes_are_kept() {
        assert_eq!(resolve(&Settings::default(), None, false).mode, Mode::None);
        let full = Settings { compute_limit: Some(1.0), compute_mode: ComputeMode::Green, ..Settings::default() };
        assert_eq!(resolve(&full, None, false).mode, Mode::None);
        for (m, want) in [(ComputeMode::Duty, Mode::Duty), (ComputeMode::Mps, Mode::Mps), (ComputeMode::Green, Mode::Green)] {
            assert_eq!(resolve(&limited(m), None, false), Resolved { mode: want, why: None });
        }
    }

    #[test]
    fn auto_is_mps_only_with_a_listening_socket_in_a_private_directory() {
        let euid = unsafe { libc::geteuid() };
        let d = tmp("auto");
        let settings = limited(ComputeMode::Auto);
        let r = resolve(&settings, Some(d.as_os_str()), false);
        assert_eq!(r.mode, Mode::Duty, "no socket: {r:?}");
        let listener = std::os::unix::net::UnixListener::bind(d.join("control")).unwrap();
        if euid != 0 {
            // (only root's daemon counts: as another user, this one is not trusted)
            assert!(mps_reachable(&d, euid).unwrap_err().contains("not root"));
            let _ = std::fs::remove_dir_all(&d);
            return;
        }
        assert_eq!(mps_reachable(&d, euid), Ok(()));
        assert_eq!(resolve(&settings, Some(d.as_os_str()), false).mode, Mode::Mps);
        // secure execution: the variable is not taken
        assert_eq!(pipe_directory(Some(d.as_os_str()), true), PathBuf::from(DEFAULT_PIPE_DIRECTORY));
        // a directory others may write to
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        let r = resolve(&settings, Some(d.as_os_str()), false);
        assert_eq!(r.mode, Mode::Duty);
        assert!(r.why.unwrap().contains("writable by others"));
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        // owned by someone else (as the check sees it: another effective user)
        if euid != 0 {
            assert!(mps_reachable(&d, euid + 1).unwrap_err().contains("not root"));
        }
        // nobody listening any more
        drop(listener);
        assert!(mps_reachable(&d, euid).is_err());
        // not a socket
        std::fs::remove_file(d.join("control")).unwrap();
        std::fs::write(d.join("control"), b"").unwrap();
        assert!(mps_reachable(&d, euid).unwrap_err().contains("not a socket"));
        let _ = std::fs::remove_dir_all(&d);
    }
}
