//! The kernel calls of the shim's own bookkeeping: the state directory's files (live figures,
//! quotas, the registry) and their blocks, allocated before they are mapped ([`allocate`]), the
//! anonymous mappings of its tables, the process' ids and name.
//!
//! They go to the kernel through the C library's `syscall(2)`, not through one wrapper each:
//! every C-library function the library calls is looked up when it is loaded, in every
//! process, about 650 instructions each, and the ~20 wrappers below would add ~13,000 to every
//! one of them, where `syscall` is one (the Rust run-time's locks use it anyway). Each
//! function keeps its wrapper's contract: the same system call as glibc (2.33 and later) makes
//! on this platform, so a seccomp policy sees what it saw, the same result, `-1` and `errno` on
//! failure. What changes: a program that interposes `open`, `mmap`, `getuid` and the like (a
//! tracer, an I/O profiler, a uid-faking tool such as fakeroot, a checkpointer that tracks
//! descriptors and locks through the wrappers) does not see the shim's own files, mappings and
//! ids, as it does not see the C library's internal ones. Memory (malloc), `dlopen`, locks and
//! the clock still go through the C library.
//!
//! x86-64 and aarch64; aarch64 has no `unlink`, `mkdir`, `rename` and `link` system calls, and
//! glibc makes their `…at` forms there (`AT_FDCWD`), as do the functions below; its `open`
//! adds no `O_LARGEFILE` there (the kernel implies it on 64-bit). Other platforms (and x32)
//! call the C library's wrappers.

use std::ffi::{c_char, c_int};

#[cfg(all(target_os = "linux", any(all(target_arch = "x86_64", target_pointer_width = "64"), target_arch = "aarch64")))]
mod imp {
    use super::*;
    use libc::{c_long, syscall, AT_FDCWD, AT_SYMLINK_NOFOLLOW};
    use std::ffi::c_void;

    // SAFETY (all): each passes its caller's arguments, as the C wrapper would, to the system
    // call the wrapper makes; the callers' contracts (valid paths and buffers) are the wrappers'.
    pub unsafe fn open(path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int {
        // (glibc's O_LARGEFILE: the kernel's on x86-64, 0 on aarch64)
        let large = if cfg!(target_arch = "x86_64") { libc::O_LARGEFILE } else { 0 };
        unsafe { syscall(libc::SYS_openat, AT_FDCWD as c_long, path, (flags | large) as c_long, mode as c_long) as c_int }
    }
    pub unsafe fn close(fd: c_int) -> c_int {
        unsafe { syscall(libc::SYS_close, fd as c_long) as c_int }
    }
    pub unsafe fn unlink(path: *const c_char) -> c_int {
        #[cfg(target_arch = "x86_64")]
        return unsafe { syscall(libc::SYS_unlink, path) as c_int };
        #[cfg(target_arch = "aarch64")]
        return unsafe { syscall(libc::SYS_unlinkat, AT_FDCWD as c_long, path, 0 as c_long) as c_int };
    }
    pub unsafe fn mkdir(path: *const c_char, mode: libc::mode_t) -> c_int {
        #[cfg(target_arch = "x86_64")]
        return unsafe { syscall(libc::SYS_mkdir, path, mode as c_long) as c_int };
        #[cfg(target_arch = "aarch64")]
        return unsafe { syscall(libc::SYS_mkdirat, AT_FDCWD as c_long, path, mode as c_long) as c_int };
    }
    pub unsafe fn rename(from: *const c_char, to: *const c_char) -> c_int {
        #[cfg(target_arch = "x86_64")]
        return unsafe { syscall(libc::SYS_rename, from, to) as c_int };
        #[cfg(target_arch = "aarch64")]
        return unsafe { syscall(libc::SYS_renameat, AT_FDCWD as c_long, from, AT_FDCWD as c_long, to) as c_int };
    }
    pub unsafe fn link(from: *const c_char, to: *const c_char) -> c_int {
        #[cfg(target_arch = "x86_64")]
        return unsafe { syscall(libc::SYS_link, from, to) as c_int };
        #[cfg(target_arch = "aarch64")]
        return unsafe { syscall(libc::SYS_linkat, AT_FDCWD as c_long, from, AT_FDCWD as c_long, to, 0 as c_long) as c_int };
    }
    /// (x86-64's and aarch64's `struct stat` are the kernel's)
    pub unsafe fn lstat(path: *const c_char, st: *mut libc::stat) -> c_int {
        unsafe { syscall(libc::SYS_newfstatat, AT_FDCWD as c_long, path, st, AT_SYMLINK_NOFOLLOW as c_long) as c_int }
    }
    /// (as glibc 2.33 and later make it: `newfstatat(fd, "", st, AT_EMPTY_PATH)`)
    pub unsafe fn fstat(fd: c_int, st: *mut libc::stat) -> c_int {
        unsafe { syscall(libc::SYS_newfstatat, fd as c_long, c"".as_ptr(), st, libc::AT_EMPTY_PATH as c_long) as c_int }
    }
    pub unsafe fn pread(fd: c_int, buf: *mut c_void, n: usize, at: libc::off_t) -> isize {
        unsafe { syscall(libc::SYS_pread64, fd as c_long, buf, n, at) as isize }
    }
    pub unsafe fn pwrite(fd: c_int, buf: *const c_void, n: usize, at: libc::off_t) -> isize {
        unsafe { syscall(libc::SYS_pwrite64, fd as c_long, buf, n, at) as isize }
    }
    pub unsafe fn fallocate(fd: c_int, mode: c_int, at: libc::off_t, len: libc::off_t) -> c_int {
        unsafe { syscall(libc::SYS_fallocate, fd as c_long, mode as c_long, at, len) as c_int }
    }
    /// (as glibc makes it: `prlimit64(0, resource, NULL, rl)`)
    pub unsafe fn getrlimit(resource: c_int, rl: *mut libc::rlimit) -> c_int {
        unsafe { syscall(libc::SYS_prlimit64, 0 as c_long, resource as c_long, std::ptr::null::<libc::rlimit>(), rl) as c_int }
    }
    /// (`MAP_FAILED` on failure: `syscall` answers -1)
    pub unsafe fn mmap(addr: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int, at: libc::off_t) -> *mut c_void {
        unsafe { syscall(libc::SYS_mmap, addr, len, prot as c_long, flags as c_long, fd as c_long, at) as *mut c_void }
    }
    pub unsafe fn munmap(addr: *mut c_void, len: usize) -> c_int {
        unsafe { syscall(libc::SYS_munmap, addr, len) as c_int }
    }
    /// `fcntl` with a `struct flock` (the lock commands).
    pub unsafe fn fcntl_lock(fd: c_int, cmd: c_int, lock: *mut libc::flock) -> c_int {
        unsafe { syscall(libc::SYS_fcntl, fd as c_long, cmd as c_long, lock) as c_int }
    }
    pub unsafe fn getdents64(fd: c_int, buf: *mut u8, n: usize) -> isize {
        unsafe { syscall(libc::SYS_getdents64, fd as c_long, buf, n) as isize }
    }
    pub fn getuid() -> libc::uid_t {
        // SAFETY: no arguments; cannot fail.
        unsafe { syscall(libc::SYS_getuid) as libc::uid_t }
    }
    pub fn getpid() -> libc::pid_t {
        // SAFETY: no arguments; cannot fail.
        unsafe { syscall(libc::SYS_getpid) as libc::pid_t }
    }
    /// `prctl(PR_GET_NAME, buf)`: `buf` holds 16 bytes.
    pub unsafe fn get_name(buf: *mut c_char) -> c_int {
        unsafe { syscall(libc::SYS_prctl, libc::PR_GET_NAME as c_long, buf) as c_int }
    }
}

#[cfg(not(all(target_os = "linux", any(all(target_arch = "x86_64", target_pointer_width = "64"), target_arch = "aarch64"))))]
mod imp {
    use super::*;
    // SAFETY (all): the C library's wrappers, with their callers' contracts.
    pub unsafe fn open(path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int {
        unsafe { libc::open(path, flags, mode) }
    }
    pub use libc::{close, fallocate, fstat, link, lstat, mkdir, mmap, munmap, pread, pwrite, rename, unlink};
    pub unsafe fn getrlimit(resource: c_int, rl: *mut libc::rlimit) -> c_int {
        unsafe { libc::getrlimit(resource as _, rl) }
    }
    pub unsafe fn fcntl_lock(fd: c_int, cmd: c_int, lock: *mut libc::flock) -> c_int {
        unsafe { libc::fcntl(fd, cmd, lock) }
    }
    pub unsafe fn getdents64(fd: c_int, buf: *mut u8, n: usize) -> isize {
        unsafe { libc::syscall(libc::SYS_getdents64, fd as libc::c_long, buf, n) as isize }
    }
    pub fn getuid() -> libc::uid_t {
        // SAFETY: cannot fail.
        unsafe { libc::getuid() }
    }
    pub fn getpid() -> libc::pid_t {
        // SAFETY: cannot fail.
        unsafe { libc::getpid() }
    }
    pub unsafe fn get_name(buf: *mut c_char) -> c_int {
        unsafe { libc::prctl(libc::PR_GET_NAME, buf) }
    }
}

pub use imp::*;

/// Why a state file could not be given its blocks ([`allocate`]).
#[derive(Debug)]
pub enum Unallocated {
    /// Growing the file to `len` bytes would pass the process' file size limit (`RLIMIT_FSIZE`,
    /// `ulimit -f`): the kernel would raise `SIGXFSZ`, which kills the program. Not tried.
    OverFileSizeLimit { len: u64, limit: u64 },
    /// The file system refused (full, a disk quota, no writing there).
    Refused { len: u64, error: std::io::Error },
}

impl std::fmt::Display for Unallocated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unallocated::OverFileSizeLimit { len, limit } => {
                write!(f, "its {len} bytes would pass this process' file size limit ({limit} bytes, ulimit -f)")
            }
            Unallocated::Refused { len, error } => write!(f, "cannot allocate its {len} bytes: {error}"),
        }
    }
}

impl Unallocated {
    /// What the user can do about it (the file is in the state directory).
    pub fn advice(&self) -> &'static str {
        match self {
            Unallocated::OverFileSizeLimit { .. } => "raise the file size limit (ulimit -f) or set GPUSHIM_STATE_DIR elsewhere",
            Unallocated::Refused { error, .. } if matches!(error.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT)) => {
                "free space there, or set GPUSHIM_STATE_DIR to a directory with room"
            }
            Unallocated::Refused { .. } => "set GPUSHIM_STATE_DIR to another directory",
        }
    }
}

/// Gives the open file `fd` at least `len` bytes whose blocks are all allocated, so that a
/// shared mapping of them never faults for want of space (a page the file system cannot back
/// is a `SIGBUS` in the program), and without ever raising `SIGXFSZ`:
/// * a file shorter than `len` is grown only within the process' file size limit
///   (`RLIMIT_FSIZE`, looked at first: growing a file beyond it raises `SIGXFSZ` unless the
///   program ignores it); one already long enough is not grown, whatever the limit;
/// * `fallocate(2)` (mode 0: blocks allocated, the size extended) does it in one call, or
///   fails having allocated nothing (tmpfs, ext4, xfs, btrfs). Blocks already allocated are
///   left as they are: a file other processes use may be passed again;
/// * where the file system has no `fallocate` (`EOPNOTSUPP`: some network and FUSE file
///   systems), zeros are written from the file's end to `len` (not before it: those bytes are
///   whoever wrote them's, and writing over them would race with their users).
pub fn allocate(fd: c_int, len: u64) -> Result<(), Unallocated> {
    let refused = |error| Unallocated::Refused { len, error };
    // SAFETY: `st` is written by the kernel; `fd` is the caller's open descriptor.
    let size = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if fstat(fd, &mut st) != 0 {
            return Err(refused(std::io::Error::last_os_error()));
        }
        st.st_size.max(0) as u64
    };
    if size < len {
        let limit = file_size_limit().map_err(refused)?;
        if len > limit {
            return Err(Unallocated::OverFileSizeLimit { len, limit });
        }
    }
    let Ok(bytes) = libc::off_t::try_from(len) else { return Err(refused(std::io::Error::from_raw_os_error(libc::EFBIG))) };
    // (EINTR: a signal came while tmpfs was allocating; tried again, a bounded number of times)
    for _ in 0..64 {
        // SAFETY: the caller's descriptor; no memory is passed.
        if unsafe { fallocate(fd, 0, 0, bytes) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => return write_zeros(fd, size, len).map_err(refused),
            _ => return Err(refused(e)),
        }
    }
    Err(refused(std::io::Error::from_raw_os_error(libc::EINTR)))
}

/// The largest size this process may give a file (`RLIMIT_FSIZE`, `ulimit -f`; `u64::MAX`:
/// none): growing one beyond it raises `SIGXFSZ`, which kills the program unless it ignores it.
pub fn file_size_limit() -> std::io::Result<u64> {
    // SAFETY: `rl` is written by the kernel.
    unsafe {
        let mut rl: libc::rlimit = std::mem::zeroed();
        if getrlimit(libc::RLIMIT_FSIZE as c_int, &mut rl) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(if rl.rlim_cur == libc::RLIM_INFINITY { u64::MAX } else { rl.rlim_cur as u64 })
    }
}

/// Writes zeros to `fd` from `from` to `to` (the file's end to its new end, see [`allocate`]).
fn write_zeros(fd: c_int, from: u64, to: u64) -> std::io::Result<()> {
    // (static, not on the stack: start-up may run on a small one, README: stack use)
    static ZEROS: [u8; 4096] = [0; 4096];
    let zeros = &ZEROS;
    let (mut at, mut interrupted) = (from, 0);
    while at < to {
        let n = (to - at).min(zeros.len() as u64) as usize;
        // SAFETY: `zeros` is readable for `n` bytes; the caller's descriptor.
        let written = unsafe { pwrite(fd, zeros.as_ptr().cast(), n, at as libc::off_t) };
        if written > 0 {
            at += written as u64;
            continue;
        }
        let e = if written == 0 { std::io::Error::from_raw_os_error(libc::EIO) } else { std::io::Error::last_os_error() };
        if e.raw_os_error() == Some(libc::EINTR) && interrupted < 64 {
            interrupted += 1;
            continue;
        }
        return Err(e);
    }
    Ok(())
}

/// Calls `each` with the name of every entry of the directory `dir` but `.` and `..`, in the
/// order the kernel lists them; an error if it cannot be opened or read (the names read until
/// then have been passed).
pub fn each_name(dir: &std::ffi::CStr, mut each: impl FnMut(&[u8])) -> std::io::Result<()> {
    // SAFETY: a NUL-terminated path; the descriptor is ours, closed below.
    let fd = unsafe { open(dir.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC | libc::O_NONBLOCK, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // 8-byte aligned for the records' 64-bit fields; not zeroed: only what the kernel wrote is
    // read; on the heap, not the stack (the program's thread may have a small one: README,
    // stack use), 4 KiB, a few reads for a large directory
    let mut buf: Vec<u64> = Vec::new();
    if buf.try_reserve_exact(512).is_err() {
        // SAFETY: our own descriptor.
        unsafe { close(fd) };
        return Err(std::io::ErrorKind::OutOfMemory.into());
    }
    let size = buf.capacity() * 8;
    let result = loop {
        // SAFETY: `buf`'s allocation is writable for its whole capacity.
        let n = unsafe { getdents64(fd, buf.as_mut_ptr().cast(), size) };
        if n < 0 {
            break Err(std::io::Error::last_os_error());
        }
        if n == 0 {
            break Ok(());
        }
        // SAFETY: the kernel wrote `n` bytes of records into `buf`.
        let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), (n as usize).min(size)) };
        for name in records(bytes) {
            if name != b"." && name != b".." {
                each(name);
            }
        }
    };
    // SAFETY: our own descriptor.
    unsafe { close(fd) };
    result
}

/// The names of the `linux_dirent64` records in `bytes` (ino: 8, off: 8, reclen: 2, type: 1,
/// name NUL-terminated); stops at a record that does not fit.
fn records(bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut at = 0usize;
    std::iter::from_fn(move || {
        let head = bytes.get(at..at + 19)?;
        let len = u16::from_ne_bytes([head[16], head[17]]) as usize;
        let record = bytes.get(at..at.checked_add(len)?).filter(|_| len > 19)?;
        at += len;
        let name = &record[19..];
        Some(&name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())])
    })
}

/// `FUTEX_WAIT` on `word` (in a shared mapping: no `FUTEX_PRIVATE_FLAG`, so processes mapping
/// the same file wait on the same key) while it holds `expected`, at most `timeout`. Returns
/// when woken, when the word differs, when the time is up or on a signal (`EINTR`): the caller
/// looks again in every case.
pub fn futex_wait(word: &std::sync::atomic::AtomicU32, expected: u32, timeout: std::time::Duration) {
    let ts = libc::timespec { tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t, tv_nsec: timeout.subsec_nanos() as libc::c_long };
    // SAFETY: `word` is a live, aligned 32-bit word; `ts` outlives the call; the kernel only
    // reads both.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, &ts as *const libc::timespec, std::ptr::null::<u32>(), 0) };
}

/// `FUTEX_WAKE` of every process and thread waiting on `word` (see [`futex_wait`]).
pub fn futex_wake_all(word: &std::sync::atomic::AtomicU32) {
    // SAFETY: `word` is a live, aligned 32-bit word; the kernel does not read or write it.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX, std::ptr::null::<libc::timespec>(), std::ptr::null::<u32>(), 0) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;

    fn c(p: &std::path::Path) -> CString {
        CString::new(p.as_os_str().as_bytes()).unwrap()
    }

    /// A test's directory in /tmp, removed when dropped, the test passed or not.
    struct RemoveOnDrop(std::path::PathBuf);
    impl Drop for RemoveOnDrop {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn each_call_answers_as_the_c_library_does() {
        let d = std::env::temp_dir().join(format!("gpushim-sys-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let _rm = RemoveOnDrop(d.clone());
        let (cd, f, g) = (c(&d), c(&d.join("f")), c(&d.join("g")));
        // SAFETY: NUL-terminated paths, our own descriptors and buffers.
        unsafe {
            assert_eq!(mkdir(cd.as_ptr(), 0o700), 0);
            assert_eq!(mkdir(cd.as_ptr(), 0o700), -1);
            assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EEXIST));
            let fd = open(f.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC, 0o600);
            assert!(fd >= 0);
            allocate(fd, 8192).unwrap();
            let (mut a, mut b, mut l): (libc::stat, libc::stat, libc::stat) = (std::mem::zeroed(), std::mem::zeroed(), std::mem::zeroed());
            assert_eq!(fstat(fd, &mut a), 0);
            assert_eq!(libc::fstat(fd, &mut b), 0, "the C library's own");
            assert_eq!((a.st_ino, a.st_dev, a.st_size, a.st_mode, a.st_uid), (b.st_ino, b.st_dev, 8192, libc::S_IFREG | 0o600, getuid()));
            assert_eq!(lstat(f.as_ptr(), &mut l), 0);
            assert_eq!((l.st_ino, l.st_size), (a.st_ino, 8192));
            let m = mmap(std::ptr::null_mut(), 8192, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0);
            assert_ne!(m, libc::MAP_FAILED);
            m.cast::<u8>().add(100).write(42);
            let mut byte = 0u8;
            assert_eq!(pread(fd, (&mut byte as *mut u8).cast(), 1, 100), 1);
            assert_eq!(byte, 42);
            assert_eq!(munmap(m, 8192), 0);
            let bad = mmap(std::ptr::null_mut(), 8192, libc::PROT_READ, libc::MAP_SHARED, -1, 0);
            assert_eq!((bad, std::io::Error::last_os_error().raw_os_error()), (libc::MAP_FAILED, Some(libc::EBADF)));
            // an OFD lock, seen from a second description
            let mut fl: libc::flock = std::mem::zeroed();
            fl.l_type = libc::F_WRLCK as _;
            fl.l_len = 1;
            assert_eq!(fcntl_lock(fd, libc::F_OFD_SETLK, &mut fl), 0);
            let other = open(f.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC, 0);
            let mut probe: libc::flock = std::mem::zeroed();
            probe.l_type = libc::F_WRLCK as _;
            probe.l_len = 1;
            assert_eq!(fcntl_lock(other, libc::F_OFD_GETLK, &mut probe), 0);
            assert_eq!(probe.l_type, libc::F_WRLCK as _, "held by the first description");
            assert_eq!(close(other), 0);
            assert_eq!(link(f.as_ptr(), g.as_ptr()), 0);
            assert_eq!(link(f.as_ptr(), g.as_ptr()), -1);
            assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EEXIST));
            assert_eq!(unlink(g.as_ptr()), 0);
            assert_eq!(rename(f.as_ptr(), g.as_ptr()), 0);
            assert_eq!(close(fd), 0);
            assert_eq!(close(fd), -1);
            assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EBADF));
            assert_eq!(open(f.as_ptr(), libc::O_RDONLY, 0), -1);
            assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::ENOENT));
        }
        assert_eq!((getpid() as u32, getuid()), (std::process::id(), unsafe { libc::getuid() }));
        let mut name = [0 as c_char; 17];
        let mut theirs = [0 as c_char; 17];
        // SAFETY: 17-byte buffers.
        assert_eq!(unsafe { (get_name(name.as_mut_ptr()), libc::prctl(libc::PR_GET_NAME, theirs.as_mut_ptr())) }, (0, 0));
        assert_eq!(name, theirs);
        // SAFETY: as above.
        unsafe { libc::unlink(c(&d.join("g")).as_ptr()) };

        // a directory of many entries (several reads), names of every length and odd bytes
        let mut want: Vec<Vec<u8>> = (0..700).map(|i| format!("{i:0width$}", width = 1 + i % 200).into_bytes()).collect();
        want.push("é\u{1F600}".as_bytes().to_vec());
        want.push(vec![b'n'; 255]); // NAME_MAX: the longest record
        want.push(vec![b'x', 0xff, 0xfe]);
        for n in &want {
            std::fs::write(d.join(std::ffi::OsStr::from_bytes(n)), b"").unwrap();
        }
        let mut got = Vec::new();
        each_name(&cd, |n| got.push(n.to_vec())).unwrap();
        let mut std_names: Vec<Vec<u8>> = std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name().as_bytes().to_vec()).collect();
        got.sort();
        want.sort();
        std_names.sort();
        assert_eq!(got, want);
        assert_eq!(got, std_names);
        std::fs::remove_dir_all(&d).unwrap();
        let e = each_name(&cd, |_| panic!("no entries")).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    }

    /// `allocate` and its fallback keep the bytes already written and allocate every block up
    /// to the new end (a hole there would be a SIGBUS in a mapping on a full file system).
    #[test]
    fn allocation_keeps_the_bytes_and_fills_the_holes() {
        use std::os::unix::fs::MetadataExt;
        use std::os::unix::io::AsRawFd;
        let d = std::env::temp_dir().join(format!("gpushim-sys-alloc-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let _rm = RemoveOnDrop(d.clone());
        for (name, fallback) in [("fallocate", false), ("zeros", true)] {
            let path = d.join(name);
            std::fs::write(&path, b"abc").unwrap();
            let f = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
            if fallback {
                write_zeros(f.as_raw_fd(), 3, 100_000).unwrap();
            } else {
                allocate(f.as_raw_fd(), 100_000).unwrap();
                allocate(f.as_raw_fd(), 10).unwrap(); // never shrinks
            }
            let m = f.metadata().unwrap();
            assert_eq!(m.len(), 100_000, "{name}");
            assert!(m.blocks() * 512 >= 100_000, "{name}: {} blocks", m.blocks());
            let bytes = std::fs::read(&path).unwrap();
            assert_eq!((&bytes[..3], bytes[3..].iter().all(|&b| b == 0)), (&b"abc"[..], true), "{name}");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn records_that_do_not_fit_end_the_listing() {
        let mut rec = vec![0u8; 24];
        rec[16..18].copy_from_slice(&24u16.to_ne_bytes());
        rec[19..22].copy_from_slice(b"abc");
        assert_eq!(records(&rec).collect::<Vec<_>>(), vec![&b"abc"[..]]);
        let mut two = rec.clone();
        two.extend_from_slice(&rec[..20]); // a second record cut short
        assert_eq!(records(&two).count(), 1);
        for bad in [0u16, 5, 19, 1000] {
            let mut r = rec.clone();
            r[16..18].copy_from_slice(&bad.to_ne_bytes());
            assert_eq!(records(&r).count(), 0, "reclen {bad}");
        }
        // a name without its NUL ends at the record's end
        let mut full = vec![b'n'; 24];
        full[16..18].copy_from_slice(&24u16.to_ne_bytes());
        assert_eq!(records(&full).collect::<Vec<_>>(), vec![&b"nnnnn"[..]]);
    }
}
