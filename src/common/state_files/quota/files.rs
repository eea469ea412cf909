//! The state directory and its files: where they live, that they are private to their user, how they are opened and created.

#[allow(unused_imports)]
use super::*;

/// Where quota files live: the configured `state_dir` (`GPUSHIM_STATE_DIR` or the file's key),
/// else the default (see the module docs).
pub fn state_dir(configured: Option<&Path>) -> PathBuf {
    if let Some(d) = configured {
        return d.to_path_buf();
    }
    // (not in a secure-execution process: the caller's variable; and root's directory is not
    // one a user can make first in /tmp: see `secure`)
    if crate::settings::secure::secure_execution() {
        if owner_uid() == 0 {
            return PathBuf::from(SECURE_ROOT_DIR);
        }
    } else if let Some(d) = crate::unforked::var("XDG_RUNTIME_DIR").ok().filter(|d| d.starts_with('/')) {
        return Path::new(&d).join("gpushim");
    }
    PathBuf::from(format!("/tmp/gpushim-{}", owner_uid()))
}

/// The default state directory of a set-user-ID root program (see `secure`).
pub const SECURE_ROOT_DIR: &str = "/run/gpushim";

/// The user the shim's files belong to: the effective one, who creates them (the real one
/// differs in a set-user-ID program, whose files must not land in the caller's directory).
pub(crate) fn owner_uid() -> libc::uid_t {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

pub(crate) fn cpath(p: &Path) -> Result<CString, String> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| format!("{}: NUL in the path", p.display()))
}

/// `stat` of `fd` or `path` (not following a final link) must show the user's own object of
/// the given type with no permission for group or others.
pub(crate) fn check_private(st: &libc::stat, what: &Path, dir: bool) -> Result<(), String> {
    let uid = owner_uid();
    let kind = st.st_mode & libc::S_IFMT;
    let want = if dir { libc::S_IFDIR } else { libc::S_IFREG };
    if kind != want {
        return Err(format!("{} is not a {}", what.display(), if dir { "directory" } else { "regular file" }));
    }
    if st.st_uid != uid {
        return Err(format!("{} belongs to uid {}, not to this user (uid {uid})", what.display(), st.st_uid));
    }
    if st.st_mode & 0o077 != 0 {
        return Err(format!("{} is open to other users (mode {:o}); it must be 0700/0600", what.display(), st.st_mode & 0o777));
    }
    Ok(())
}

/// Creates `dir` (mode 0700) if needed and checks it is private; an error says how to use
/// another directory.
/// Checked on every call: the directory may have been removed or replaced since.
pub fn private_dir(dir: &Path) -> Result<(), String> {
    let hint = if crate::settings::secure::secure_execution() {
        "set state_dir in /etc/gpushim/gpushim.toml to a directory of the program's owner (mode 0700)"
    } else {
        "set GPUSHIM_STATE_DIR to a directory of your own (mode 0700)"
    };
    private_dir_checked(dir).map_err(|e| format!("{e}; {hint}"))
}

pub(crate) fn private_dir_checked(dir: &Path) -> Result<(), String> {
    let c = cpath(dir)?;
    // SAFETY: `c` is NUL-terminated; `st` is written by lstat.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        // (looked at first: it exists but the first time)
        if crate::platform::sys::lstat(c.as_ptr(), &mut st) != 0 {
            if crate::platform::sys::mkdir(c.as_ptr(), 0o700) != 0 && errno().raw_os_error() != Some(libc::EEXIST) {
                return Err(format!("cannot create {}: {}", dir.display(), errno()));
            }
            if crate::platform::sys::lstat(c.as_ptr(), &mut st) != 0 {
                return Err(format!("{}: {}", dir.display(), errno()));
            }
        }
        check_private(&st, dir, true)
    }
}

/// The quota file of `name` in `dir`.
pub fn file_of(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("quota-{name}"))
}

/// The quota names that have a file in `dir`.
pub fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    if let Ok(c) = cpath(dir) {
        let _ = crate::platform::sys::each_name(&c, |n| {
            if let Some(name) = std::str::from_utf8(n).ok().and_then(|n| n.strip_prefix("quota-")) {
                names.push(name.to_string());
            }
        });
    }
    names.sort();
    names
}

/// An OFD lock operation on slot `i`'s byte: `F_OFD_SETLK` (take, non-blocking), or

pub(crate) fn open_existing(path: &Path) -> Result<libc::c_int, std::io::Error> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `c` is NUL-terminated.
    let fd = unsafe { crate::platform::sys::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOFOLLOW, 0) };
    if fd < 0 {
        Err(errno())
    } else {
        Ok(fd)
    }
}

/// The error of a state file `path` that cannot be given its blocks: it names the state
/// directory and what to do.
pub(crate) fn cannot_hold(path: &Path, e: &crate::platform::sys::Unallocated) -> String {
    let (dir, file) = (path.parent().unwrap_or(Path::new("")), path.file_name().unwrap_or_default());
    format!("the state directory {} cannot hold {}: {e}; {}", dir.display(), file.to_string_lossy(), e.advice())
}

/// The file `path` another process is building in `dir`, once it has its name: a directory
/// with room for one quota file but not for one per process starting together refuses room
/// to all but one, and they join the one built. Waits while a file is being built there (a
/// temporary exists), 1 s at most.
pub(crate) fn theirs_when_built(dir: &Path, path: &Path) -> Option<libc::c_int> {
    let building = || {
        let mut any = false;
        let _ = cpath(dir).map(|d| crate::platform::sys::each_name(&d, |n| any |= n.starts_with(b".quota-tmp-")));
        any
    };
    for _ in 0..200 {
        if let Ok(fd) = open_existing(path) {
            return Some(fd);
        }
        if !building() {
            return open_existing(path).ok();
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    None
}

/// Builds an initialised quota file under a temporary name and links it to `path`; if another
/// process linked first, opens theirs.
pub(crate) fn create(dir: &Path, path: &Path) -> Result<libc::c_int, String> {
    let pid = crate::platform::sys::getpid();
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let tmp = dir.join(format!(".quota-tmp-{pid}-{nanos}"));
    let ctmp = cpath(&tmp)?;
    let cpath_final = cpath(path)?;
    // SAFETY: the path strings are NUL-terminated; the fresh file is given FILE_BYTES, its
    // blocks allocated, before it is mapped; the mutex is initialised in the mapping before
    // anyone else can open the file (it has no public name yet).
    unsafe {
        let fd = crate::platform::sys::open(ctmp.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC | libc::O_NOFOLLOW, 0o600);
        if fd < 0 {
            return Err(format!("cannot create {}: {}", tmp.display(), errno()));
        }
        let fail = |what: &str| {
            let e = format!("{what} {}: {}", tmp.display(), errno());
            crate::platform::sys::close(fd);
            crate::platform::sys::unlink(ctmp.as_ptr());
            e
        };
        // (its blocks allocated before it is mapped, and before it has its public name, so
        // that no member ever maps a page the file system cannot back: SIGBUS)
        if let Err(e) = crate::platform::sys::allocate(fd, FILE_BYTES as u64) {
            crate::platform::sys::close(fd);
            crate::platform::sys::unlink(ctmp.as_ptr());
            return theirs_when_built(dir, path).ok_or_else(|| cannot_hold(path, &e));
        }
        let p = crate::platform::sys::mmap(std::ptr::null_mut(), FILE_BYTES, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0);
        if p == libc::MAP_FAILED {
            return Err(fail("cannot map"));
        }
        let h = p.cast::<Header>();
        let mut attr: libc::pthread_mutexattr_t = std::mem::zeroed();
        libc::pthread_mutexattr_init(&mut attr);
        libc::pthread_mutexattr_setpshared(&mut attr, libc::PTHREAD_PROCESS_SHARED);
        libc::pthread_mutexattr_setrobust(&mut attr, libc::PTHREAD_MUTEX_ROBUST);
        let rc = libc::pthread_mutex_init(std::ptr::addr_of_mut!((*h).mutex), &attr);
        libc::pthread_mutexattr_destroy(&mut attr);
        (*h).version.store(VERSION, Relaxed);
        (*h).slots.store(SLOTS as u32, Relaxed);
        (*h).layout.store(LAYOUT, Relaxed);
        (*h).magic.store(MAGIC, Release);
        crate::platform::sys::munmap(p, FILE_BYTES);
        if rc != 0 {
            return Err(fail("cannot initialise the lock of"));
        }
        let linked = crate::platform::sys::link(ctmp.as_ptr(), cpath_final.as_ptr());
        let link_error = errno();
        crate::platform::sys::unlink(ctmp.as_ptr());
        if linked == 0 {
            return Ok(fd);
        }
        crate::platform::sys::close(fd);
        if link_error.raw_os_error() != Some(libc::EEXIST) {
            return Err(format!("cannot create {}: {link_error}", path.display()));
        }
    }
    open_existing(path).map_err(|e| format!("cannot open {}: {e}", path.display()))
}
