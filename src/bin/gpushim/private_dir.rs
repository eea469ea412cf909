//! The private directory of `gpushim sim`: made only where no other user can swap it, held
//! open, filled and emptied through its descriptor, and removed only while its path still names it.
//!
//! It holds the simulated node's state file (GPUSIM_NODE_STATE), nothing on any search path:
//! the soname links on the command's `LD_LIBRARY_PATH` are in [`soname_dir`], a persistent
//! directory beside the simulator's libraries, so that no process left running after `sim`
//! ends can load a library from a directory someone re-creates under a removed name. A base
//! directory is used only when
//! every directory on its path is owned by root or this (effective) user and writable by others
//! only with the sticky bit, and the base itself is this user's and writable by no one else, or
//! root's and sticky (like /tmp).

use std::ffi::{CStr, CString, OsString};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// A directory only this user can enter (mode 0700, a fresh name), removed with everything in
/// it when dropped, unless its path names another directory by then.
pub struct PrivateDir {
    path: PathBuf,
    /// The base directory and the name in it.
    base: OwnedFd,
    name: CString,
    fd: OwnedFd,
    id: (u64, u64),
}

fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in the path"))
}

fn check(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// openat(2) of a directory without following a link, to read it; `dir` None: a path.
fn open_dir(dir: Option<RawFd>, name: &CStr) -> io::Result<OwnedFd> {
    open_dir_flags(dir, name, libc::O_RDONLY)
}

/// As [`open_dir`], O_PATH: only to walk through it and inspect it (fstat, fstatfs, the *at
/// calls), which a directory one may only search (0711) allows.
fn open_path(dir: Option<RawFd>, name: &CStr) -> io::Result<OwnedFd> {
    open_dir_flags(dir, name, libc::O_PATH)
}

fn open_dir_flags(dir: Option<RawFd>, name: &CStr, mode: libc::c_int) -> io::Result<OwnedFd> {
    let flags = mode | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: a NUL-terminated name; the descriptor returned is owned by the OwnedFd.
    let fd = check(unsafe { libc::openat(dir.unwrap_or(libc::AT_FDCWD), name.as_ptr(), flags) })?;
    // SAFETY: `fd` was just opened and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: an all-zero stat is valid; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid stat to write.
    check(unsafe { libc::fstat(fd, &mut st) })?;
    Ok(st)
}

/// FUSE: its daemon reports whatever owner it likes.
const FUSE_SUPER_MAGIC: i64 = 0x65735546;

fn on_fuse(fd: RawFd) -> io::Result<bool> {
    // SAFETY: an all-zero statfs is valid; fstatfs fills it.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid statfs to write.
    check(unsafe { libc::fstatfs(fd, &mut st) })?;
    Ok(st.f_type as i64 == FUSE_SUPER_MAGIC)
}

/// Characters of a path that make it unusable on LD_LIBRARY_PATH (glibc splits it on `:` and
/// `;` and expands `$ORIGIN`, `$LIB`, `$PLATFORM`).
fn unfit_for_search_path(path: &Path) -> Option<char> {
    path.as_os_str().as_bytes().iter().find(|b| matches!(b, b':' | b';' | b'$')).map(|&b| b as char)
}

fn euid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// Every directory of `path` (absolute) from / down to its parent opened one step at a time
/// without following links (O_PATH), each owned by root or this user, writable by others only
/// if sticky, and on no FUSE file system; `path` itself opened (O_PATH), checked for FUSE, and
/// its stat. Or why not.
fn walk(path: &Path) -> Result<(OwnedFd, libc::stat), String> {
    if !path.is_absolute() {
        return Err("not an absolute path".into());
    }
    let me = euid();
    let mut dir = open_path(None, c"/").map_err(|e| format!("cannot open /: {e}"))?;
    let mut walked = PathBuf::from("/");
    let inspect = |dir: &OwnedFd, walked: &Path| -> Result<libc::stat, String> {
        let st = fstat(dir.as_raw_fd()).map_err(|e| format!("{}: {e}", walked.display()))?;
        if on_fuse(dir.as_raw_fd()).map_err(|e| format!("{}: {e}", walked.display()))? {
            return Err(format!("{} is on a FUSE file system (whose owners its daemon chooses)", walked.display()));
        }
        Ok(st)
    };
    for part in path.components().skip(1) {
        let st = inspect(&dir, &walked)?;
        let others_write = st.st_mode & 0o022 != 0;
        if (st.st_uid != 0 && st.st_uid != me) || (others_write && st.st_mode & libc::S_ISVTX == 0) {
            return Err(format!("{} can be changed by another user", walked.display()));
        }
        let name = cstring(part.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
        walked.push(part);
        dir = open_path(Some(dir.as_raw_fd()), &name).map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) | Some(libc::ENOTDIR) => format!("{} is a link or not a directory", walked.display()),
            _ => format!("{}: {e}", walked.display()),
        })?;
    }
    let st = inspect(&dir, path)?;
    Ok((dir, st))
}

/// Why `path` (absolute) is no safe base for a private directory, or its descriptor (O_PATH).
pub fn trusted_base(path: &Path) -> Result<OwnedFd, String> {
    let me = euid();
    let (dir, st) = walk(path)?;
    let mine = st.st_uid == me && st.st_mode & 0o022 == 0;
    let shared = st.st_uid == 0 && st.st_mode & libc::S_ISVTX != 0;
    if mine || shared {
        Ok(dir)
    } else if st.st_uid != me && st.st_uid != 0 {
        Err(format!("{} belongs to another user (uid {})", path.display(), st.st_uid))
    } else {
        Err(format!("{} is writable by others and not sticky", path.display()))
    }
}

impl PrivateDir {
    /// In `$XDG_RUNTIME_DIR` (the user's own), else `$TMPDIR`, else /tmp: the first of them
    /// that [`trusted_base`] accepts and where a directory can be made. Each one passed over is
    /// said on stderr.
    pub fn create() -> Result<PrivateDir, String> {
        let mut bases: Vec<(String, PathBuf)> = ["XDG_RUNTIME_DIR", "TMPDIR"]
            .iter()
            .filter_map(|v| std::env::var_os(v).filter(|p| !p.is_empty()).map(|p| (format!("${v}"), PathBuf::from(p))))
            .collect();
        bases.push(("/tmp".into(), PathBuf::from("/tmp")));
        let mut why = Vec::new();
        for (label, base) in bases {
            let unfit = unfit_for_search_path(&base.join("gpushim-sim-XXXXXX"))
                .map(|c| format!("{} has a '{c}', which a search path cannot hold", base.display()));
            match unfit.map_or(Ok(()), Err).and_then(|_| trusted_base(&base)).and_then(|fd| PrivateDir::create_in(&base, fd)) {
                Ok(dir) => return Ok(dir),
                Err(e) if label == "/tmp" => why.push(e),
                Err(e) => {
                    // (a closed stderr must not end this process: no eprintln)
                    let _ = writeln!(io::stderr(), "gpushim sim: not using {label} ({e}); trying the next place");
                    why.push(e);
                }
            }
        }
        Err(format!("no safe place for a private directory: {} (set TMPDIR to a directory of yours that only you can write)", why.join("; ")))
    }

    fn create_in(base_path: &Path, base: OwnedFd) -> Result<PrivateDir, String> {
        let fail = |what: &str, e: io::Error| format!("cannot {what} a private directory in {}: {e}", base_path.display());
        let template = cstring(base_path.join("gpushim-sim-XXXXXX").as_os_str().as_bytes()).map_err(|e| fail("make", e))?;
        let mut bytes = template.into_bytes_with_nul();
        // SAFETY: a NUL-terminated template ending in XXXXXX, which mkdtemp fills in place.
        if unsafe { libc::mkdtemp(bytes.as_mut_ptr().cast()) }.is_null() {
            return Err(fail("make", io::Error::last_os_error()));
        }
        bytes.pop();
        let path = PathBuf::from(OsString::from_vec(bytes));
        let name = cstring(path.file_name().unwrap_or_default().as_bytes()).map_err(|e| fail("open", e))?;
        let remove = |e: String| {
            // SAFETY: the name just made in our base directory (empty: it was never used).
            unsafe { libc::unlinkat(base.as_raw_fd(), name.as_ptr(), libc::AT_REMOVEDIR) };
            e
        };
        let fd = open_dir(Some(base.as_raw_fd()), &name).map_err(|e| remove(fail("open", e)))?;
        let st = fstat(fd.as_raw_fd()).map_err(|e| remove(fail("inspect", e)))?;
        if on_fuse(fd.as_raw_fd()).unwrap_or(true) {
            return Err(remove(format!("{} is on a FUSE file system", base_path.display())));
        }
        let dir = PrivateDir { path, base, name, fd, id: (st.st_dev, st.st_ino) };
        if st.st_uid != euid() || st.st_mode & 0o077 != 0 {
            // not the one mkdtemp made: leave it alone (drop would empty it)
            std::mem::forget(dir);
            return Err(format!("the private directory made in {} was replaced", base_path.display()));
        }
        Ok(dir)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

}

/// The directory of soname links (`links`: name → target) in `libraries` (the directory of the
/// simulator's libraries): `<libraries>/gpusim-sonames`, made (0755) with its links when
/// missing. It goes on LD_LIBRARY_PATH, so it is used only on a path only root and this user
/// can change, owned by root or this user and writable by no one else, its links as expected.
pub fn soname_dir(libraries: &Path, links: &[(&str, String)]) -> Result<PathBuf, String> {
    const NAME: &str = "gpusim-sonames";
    let path = libraries.join(NAME);
    if let Some(c) = unfit_for_search_path(&path) {
        return Err(format!("{} has a '{c}', which LD_LIBRARY_PATH cannot hold; build or install the simulator elsewhere", path.display()));
    }
    let me = euid();
    let (lib, st) = walk(libraries)?;
    if (st.st_uid != 0 && st.st_uid != me) || (st.st_mode & 0o022 != 0 && st.st_mode & libc::S_ISVTX == 0) {
        return Err(format!("{} can be changed by another user", libraries.display()));
    }
    let name = cstring(NAME.as_bytes()).map_err(|e| e.to_string())?;
    let dir = match open_path(Some(lib.as_raw_fd()), &name) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            // SAFETY: a NUL-terminated name in our open directory.
            let r = unsafe { libc::mkdirat(lib.as_raw_fd(), name.as_ptr(), 0o755) };
            let e = io::Error::last_os_error();
            if r != 0 && e.raw_os_error() != Some(libc::EEXIST) {
                return Err(format!(
                    "cannot make {}: {e}; have it made once by a user who can write {} (running gpushim sim), or build the simulator where you can write",
                    path.display(),
                    libraries.display()
                ));
            }
            open_path(Some(lib.as_raw_fd()), &name)
        }
        other => other,
    }
    .map_err(|e| format!("{}: {e} (a link or not a directory? remove it)", path.display()))?;
    let st = fstat(dir.as_raw_fd()).map_err(|e| format!("{}: {e}", path.display()))?;
    if (st.st_uid != 0 && st.st_uid != me) || st.st_mode & 0o022 != 0 {
        return Err(format!("{} is not owned by root or you, or is writable by others; remove it", path.display()));
    }
    for (link, target) in links {
        let link_c = cstring(link.as_bytes()).map_err(|e| e.to_string())?;
        let target_c = cstring(target.as_bytes()).map_err(|e| e.to_string())?;
        let read = || {
            let mut buf = [0u8; 4096];
            // SAFETY: our open directory, a NUL-terminated name, a buffer of its length.
            let n = unsafe { libc::readlinkat(dir.as_raw_fd(), link_c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(buf[..n as usize].to_vec())
            }
        };
        let mut found = read();
        if matches!(&found, Err(e) if e.raw_os_error() == Some(libc::ENOENT)) {
            // SAFETY: NUL-terminated strings and our open directory.
            if unsafe { libc::symlinkat(target_c.as_ptr(), dir.as_raw_fd(), link_c.as_ptr()) } != 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EEXIST) {
                    return Err(format!("cannot make the link {link} in {}: {e}", path.display()));
                }
            }
            found = read();
        }
        if !matches!(&found, Ok(t) if t == target.as_bytes()) {
            return Err(format!("{}/{link} is not a link to {target}; remove {} and run gpushim sim again", path.display(), path.display()));
        }
    }
    Ok(path)
}

/// Removes everything in the directory open at `dir`, through descriptors only.
fn empty(dir: RawFd) -> io::Result<()> {
    // SAFETY: duplicating our descriptor for fdopendir, which then owns the copy.
    let copy = check(unsafe { libc::fcntl(dir, libc::F_DUPFD_CLOEXEC, 0) })?;
    // SAFETY: `copy` is a directory descriptor of ours; closedir below closes it.
    let stream = unsafe { libc::fdopendir(copy) };
    if stream.is_null() {
        let e = io::Error::last_os_error();
        // SAFETY: fdopendir failed, so `copy` is still ours to close.
        unsafe { libc::close(copy) };
        return Err(e);
    }
    let mut names = Vec::new();
    loop {
        // SAFETY: a stream from fdopendir; the entry is read before the next call.
        let entry = unsafe { libc::readdir(stream) };
        if entry.is_null() {
            break;
        }
        // SAFETY: d_name of a valid entry is NUL-terminated.
        let name = unsafe { CStr::from_ptr((*entry).d_name.as_ptr()) }.to_owned();
        if name.as_bytes() != b"." && name.as_bytes() != b".." {
            names.push(name);
        }
    }
    // SAFETY: the stream from fdopendir, closed once.
    unsafe { libc::closedir(stream) };
    let mut first = Ok(());
    for name in names {
        // SAFETY: a NUL-terminated name in our open directory.
        if unsafe { libc::unlinkat(dir, name.as_ptr(), 0) } == 0 {
            continue;
        }
        let e = io::Error::last_os_error();
        let result = if matches!(e.raw_os_error(), Some(libc::EISDIR) | Some(libc::EPERM)) {
            // (not into another file system mounted there: a bind mount is not ours to empty)
            let here = fstat(dir).map(|st| st.st_dev);
            open_dir(Some(dir), &name)
                .and_then(|sub| match (here, fstat(sub.as_raw_fd())) {
                    (Ok(d), Ok(st)) if st.st_dev == d => Ok(sub),
                    (Err(e), _) | (_, Err(e)) => Err(e),
                    _ => Err(io::Error::other("another file system is mounted in it")),
                })
                .and_then(|sub| empty(sub.as_raw_fd()))
                .and_then(|_| {
                // SAFETY: as above, removing the now empty directory.
                check(unsafe { libc::unlinkat(dir, name.as_ptr(), libc::AT_REMOVEDIR) }).map(|_| ())
            })
        } else {
            Err(e)
        };
        if first.is_ok() {
            first = result;
        }
    }
    first
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        if let Err(e) = empty(self.fd.as_raw_fd()) {
            let _ = writeln!(io::stderr(), "gpushim sim: cannot empty {}: {e}", self.path.display());
        }
        // SAFETY: an all-zero stat is valid; fstatat fills it.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: our base directory, a NUL-terminated name, a stat to write.
        let found = unsafe { libc::fstatat(self.base.as_raw_fd(), self.name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) } == 0;
        if !found || (st.st_dev, st.st_ino) != self.id {
            let _ = writeln!(io::stderr(), "gpushim sim: {} is no longer the directory it made; left as it is", self.path.display());
            return;
        }
        // SAFETY: as above.
        if unsafe { libc::unlinkat(self.base.as_raw_fd(), self.name.as_ptr(), libc::AT_REMOVEDIR) } != 0 {
            let e = io::Error::last_os_error();
            let _ = writeln!(io::stderr(), "gpushim sim: cannot remove {}: {e}", self.path.display());
        }
    }
}
