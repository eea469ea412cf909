//! Live figures: each process under the shim publishes what it holds, per device, in a small
//! file of the state directory (`STATE_DIR/proc-PID-NONCE`, 0600 in the 0700 directory of
//! `quota`), read by `gpushim ps`, `gpushim top` and `gpushim metrics`.
//!
//! # Cheap
//!
//! The file is created once, when the driver initialises (`cuInit`): never in a process that
//! does not touch CUDA. It is mapped shared, and each device's budget (`memory::DeviceBudget`)
//! keeps its figures in its entry from then on (`memory::publish_budgets` moves them there):
//! every change of a figure (a reservation, a release, a refusal, a resolved limit) is the
//! budget's own atomic update, made in the file — no copy, no system call, no lock, no clock
//! on the allocation path; readers see the page cache.
//!
//! # A full file system
//!
//! The file's blocks are allocated before it is mapped (`sys::allocate`): on a full file
//! system, or beyond the process' file size limit, the file is not published (the program runs
//! as usual, one `info` line) instead of a page fault becoming `SIGBUS` (or the sizing,
//! `SIGXFSZ`) in the program.
//!
//! # Liveness
//!
//! The process holds an open-file-description lock (`F_OFD_SETLK`) on the file's first byte,
//! taken before the file gets its public name (it is built under a temporary name and
//! renamed). The kernel drops the lock when the process dies, however it dies: a reader that
//! could take it (`F_OFD_GETLK`) knows the process is gone. A clean exit removes the file
//! (`atexit`); a killed process' file stays, shown as exited, until the next process of the
//! user that publishes removes it (it removes every file whose lock is free).
//!
//! # Forks
//!
//! A forked child inherits the mapping and the lock (the open file description is shared), so
//! it stops publishing: its budgets let go of the mapping, it closes its copy of the
//! descriptor (so the lock still goes with the parent's death), and only the process that made
//! the file removes it at exit.
//!
//! This module uses only `libc` and `quota`: the `gpushim` command compiles it too.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

/// Program devices whose figures are published (the first ones of the program's view).
pub const DEVICES: usize = 64;
const UUID_BYTES: usize = 48;
const NAME_BYTES: usize = 64;
const MAGIC: u64 = u64::from_le_bytes(*b"gpushimL");
const VERSION: u32 = 3;
/// The prefix of the files' names.
pub const PREFIX: &str = "proc-";
/// The compute modes as published (index = the value in the file).
pub const COMPUTE_MODES: [&str; 4] = ["none", "duty", "mps", "green"];
/// A figure not known yet (a limit resolved at the device's first use).
pub const UNKNOWN: u64 = u64::MAX;

/// One program device's entry.
#[repr(C)]
pub struct Dev {
    /// 1 once the entry describes a device of the program's view.
    pub present: AtomicU32,
    /// For a part of a split GPU: its index (from 1) and the count of parts; 0 otherwise.
    pub part_index: AtomicU32,
    pub part_count: AtomicU32,
    _pad: AtomicU32,
    /// The physical GPU's UUID (`GPU-…`), NUL-padded.
    pub uuid: [AtomicU64; UUID_BYTES / 8],
    /// A part's derived UUID (all zero for a whole GPU).
    pub part_uuid: [AtomicU64; UUID_BYTES / 8],
    /// The device's figures: from publication on, the very counters the process' budget for
    /// the device keeps (`memory::DeviceBudget`), not a copy.
    pub figures: Figures,
    /// The device's compute share (`GPUSHIM_COMPUTE_LIMIT`): kept by the process' pacer.
    pub compute: Compute,
    /// Allocations that waited for room in a shared budget (`GPUSHIM_OOM_WAIT`).
    pub waits: Waits,
}

/// A device's waits for room in a shared budget (`oom_wait`), counted when each wait ends.
#[repr(C)]
pub struct Waits {
    /// Allocations that waited, whatever the outcome.
    pub waits: AtomicU64,
    /// The time they waited (nanoseconds).
    pub waited_ns: AtomicU64,
}

/// A device's compute figures, as the pacer (`sharing::compute`) keeps them.
#[repr(C)]
pub struct Compute {
    /// The compute limit in millionths of the device's time; 0: none.
    pub limit_ppm: AtomicU64,
    /// The GPU time the process' work took on the device, as measured (nanoseconds).
    pub busy_ns: AtomicU64,
    /// The time the process' launches waited for their share (nanoseconds).
    pub throttled_ns: AtomicU64,
    /// Launches measured.
    pub launches: AtomicU64,
}

impl Compute {
    pub const fn new() -> Compute {
        Compute { limit_ppm: AtomicU64::new(0), busy_ns: AtomicU64::new(0), throttled_ns: AtomicU64::new(0), launches: AtomicU64::new(0) }
    }
}

/// A device's figures, as a budget keeps them and the file publishes them.
#[repr(C)]
pub struct Figures {
    /// The effective limit ([`UNKNOWN`] until resolved), in the published entry only (a budget
    /// holds its own in another form).
    pub limit: AtomicU64,
    pub in_use: AtomicU64,
    pub peak_in_use: AtomicU64,
    pub reserved: AtomicU64,
    pub peak_reserved: AtomicU64,
    pub refused: AtomicU64,
}

impl Figures {
    pub const fn new() -> Figures {
        Figures {
            limit: AtomicU64::new(0),
            in_use: AtomicU64::new(0),
            peak_in_use: AtomicU64::new(0),
            reserved: AtomicU64::new(0),
            peak_reserved: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }
}

#[repr(C)]
struct Header {
    magic: AtomicU64,
    version: AtomicU32,
    pid: AtomicU32,
    layout: AtomicU64,
    /// Seconds since the epoch when the process started publishing.
    started: AtomicU64,
    /// Devices in the program's view (may exceed [`DEVICES`]).
    devices: AtomicU32,
    /// The compute mode in use ([`COMPUTE_MODES`]; 0: no compute limit).
    compute_mode: AtomicU32,
    comm: [AtomicU64; 2],
    /// The shared quota's name, NUL-padded (empty: none).
    quota: [AtomicU64; NAME_BYTES / 8],
    dev: [Dev; DEVICES],
}

const FILE_BYTES: usize = std::mem::size_of::<Header>();
const LAYOUT: u64 = (std::mem::size_of::<Header>() as u64) << 16 | std::mem::size_of::<Dev>() as u64;

/// What a device of the program's view is, when publishing starts.
#[derive(Debug, Clone, Default)]
pub struct ViewEntry {
    pub uuid: String,
    /// (index from 1, count, derived UUID) of a part of a split GPU.
    pub part: Option<(u32, u32, String)>,
}

fn put_str(words: &[AtomicU64], s: &str) {
    let mut bytes = vec![0u8; words.len() * 8];
    let n = s.len().min(bytes.len() - 1);
    bytes[..n].copy_from_slice(&s.as_bytes()[..n]);
    for (w, chunk) in words.iter().zip(bytes.chunks(8)) {
        w.store(u64::from_le_bytes(chunk.try_into().expect("8 bytes")), Relaxed);
    }
}

fn get_str(words: &[AtomicU64]) -> String {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.load(Relaxed).to_le_bytes()).collect();
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

fn cpath(p: &Path) -> Result<CString, String> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| format!("{}: NUL in the path", p.display()))
}

/// `F_OFD_SETLK` (take) or `F_OFD_GETLK` (is it free?) on byte 0 of `fd`: true when taken / free.
fn lock0(fd: libc::c_int, cmd: libc::c_int) -> bool {
    // SAFETY: a zeroed flock is valid; fcntl reads and (GETLK) writes it.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as _;
    fl.l_whence = libc::SEEK_SET as _;
    fl.l_start = 0;
    fl.l_len = 1;
    // SAFETY: `fd` is open; `fl` is a valid flock.
    if unsafe { crate::platform::sys::fcntl_lock(fd, cmd, &mut fl) } != 0 {
        return false;
    }
    cmd == libc::F_OFD_SETLK || fl.l_type == libc::F_UNLCK as _
}

/// This process' published file.
pub struct Publisher {
    pid: u32,
    path: PathBuf,
    header: *mut Header,
    /// The descriptor holding the liveness lock (kept open for the life of the process).
    fd: libc::c_int,
}

// SAFETY: the mapping is shared memory accessed through atomics only, never unmapped.
unsafe impl Send for Publisher {}
unsafe impl Sync for Publisher {}

impl Publisher {
    /// Creates `dir/proc-PID-NONCE` describing `view` (and the quota `quota`), locked and mapped;
    /// first removes the files of processes that died.
    pub fn start(dir: &Path, quota: Option<&str>, view: &[ViewEntry]) -> Result<Publisher, String> {
        crate::state_files::quota::private_dir(dir)?;
        reap(dir);
        let pid = crate::platform::sys::getpid() as u32;
        // PID and a nonce: processes of other PID namespaces (containers sharing a state
        // directory, each with its PID 1) have the same PIDs, and must not replace or remove
        // each other's files.
        let nonce = nonce();
        let path = dir.join(format!("{PREFIX}{pid}-{nonce:08x}"));
        let tmp = dir.join(format!(".{PREFIX}tmp-{pid}-{nonce:08x}"));
        let (ctmp, cfinal) = (cpath(&tmp)?, cpath(&path)?);
        // SAFETY: NUL-terminated paths; the file is sized, its blocks allocated, before it is
        // mapped; the mapping is kept for the life of the process.
        let lock_fd;
        let header = unsafe {
            crate::platform::sys::unlink(ctmp.as_ptr());
            let fd = crate::platform::sys::open(ctmp.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC | libc::O_NOFOLLOW, 0o600);
            if fd < 0 {
                return Err(format!("cannot create {}: {}", tmp.display(), errno()));
            }
            let fail = |what: &str| {
                let e = format!("{}: {what}: {}", tmp.display(), errno());
                crate::platform::sys::close(fd);
                crate::platform::sys::unlink(ctmp.as_ptr());
                Err(e)
            };
            // (its blocks allocated before it is mapped: on a full file system a page fault in
            // the mapping would be a SIGBUS in the program; a file size limit, SIGXFSZ)
            if let Err(e) = crate::platform::sys::allocate(fd, FILE_BYTES as u64) {
                crate::platform::sys::close(fd);
                crate::platform::sys::unlink(ctmp.as_ptr());
                return Err(format!("{}: {e}", tmp.display()));
            }
            // The lock is taken through a description of its own, not the one mapped: a forked
            // child inherits the mapping (which keeps its description alive) but closes its copy
            // of the lock's descriptor, so the lock goes with the parent's death.
            let lfd = crate::platform::sys::open(ctmp.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOFOLLOW, 0);
            if lfd < 0 {
                return fail("cannot open");
            }
            if !lock0(lfd, libc::F_OFD_SETLK) {
                crate::platform::sys::close(lfd);
                return fail("cannot lock");
            }
            let m = crate::platform::sys::mmap(std::ptr::null_mut(), FILE_BYTES, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0);
            if m == libc::MAP_FAILED {
                crate::platform::sys::close(lfd);
                return fail("cannot map");
            }
            crate::platform::sys::close(fd);
            // (`lfd` stays open: it holds the liveness lock until the process ends)
            lock_fd = lfd;
            m.cast::<Header>()
        };
        // SAFETY: the fresh mapping (zero-filled), ours alone until renamed.
        let h = unsafe { &*header };
        h.version.store(VERSION, Relaxed);
        h.pid.store(pid, Relaxed);
        h.layout.store(LAYOUT, Relaxed);
        h.started.store(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()), Relaxed);
        h.devices.store(view.len() as u32, Relaxed);
        let comm = crate::state_files::quota::comm();
        h.comm[0].store(u64::from_le_bytes(comm[..8].try_into().expect("8 bytes")), Relaxed);
        h.comm[1].store(u64::from_le_bytes(comm[8..].try_into().expect("8 bytes")), Relaxed);
        put_str(&h.quota, quota.unwrap_or(""));
        for (d, v) in h.dev.iter().zip(view) {
            d.figures.limit.store(UNKNOWN, Relaxed);
            put_str(&d.uuid, &v.uuid);
            if let Some((index, count, uuid)) = &v.part {
                d.part_index.store(*index, Relaxed);
                d.part_count.store(*count, Relaxed);
                put_str(&d.part_uuid, uuid);
            }
            d.present.store(1, Relaxed);
        }
        h.magic.store(MAGIC, std::sync::atomic::Ordering::Release);
        // SAFETY: NUL-terminated paths.
        if unsafe { crate::platform::sys::rename(ctmp.as_ptr(), cfinal.as_ptr()) } != 0 {
            let e = errno();
            // SAFETY: as above; our own descriptor and mapping, not handed out.
            unsafe {
                crate::platform::sys::unlink(ctmp.as_ptr());
                crate::platform::sys::close(lock_fd);
                crate::platform::sys::munmap(header.cast(), FILE_BYTES);
            }
            return Err(format!("cannot publish {}: {e}", path.display()));
        }
        Ok(Publisher { pid, path, header, fd: lock_fd })
    }

    /// The entry of program device `d` (`None` beyond [`DEVICES`]).
    pub fn device(&self, d: usize) -> Option<&'static Dev> {
        // SAFETY: the mapping lives as long as the process.
        let h: &'static Header = unsafe { &*self.header };
        h.dev.get(d)
    }

    /// Publishes the compute mode in use (an index of [`COMPUTE_MODES`]).
    pub fn set_compute_mode(&self, mode: u32) {
        // SAFETY: the mapping lives as long as the process.
        let h: &'static Header = unsafe { &*self.header };
        h.compute_mode.store(mode, Relaxed);
    }

    /// Whether this process made the file (not a forked child of the one that did).
    pub fn is_mine(&self) -> bool {
        crate::platform::sys::getpid() as u32 == self.pid
    }

    /// In a forked child: lets go of the inherited descriptor, so that the lock (held by the
    /// open file description both share) goes away when the parent dies, even while the child
    /// lives. Only `close`: safe in a fork handler.
    pub fn forget_in_child(&self) {
        // SAFETY: closing the child's copy of our own descriptor.
        unsafe { crate::platform::sys::close(self.fd) };
    }

    /// Removes the file (at exit), unless this is a forked child (the file is its parent's) or
    /// the name is no longer this file.
    pub fn remove(&self) {
        if !self.is_mine() {
            return;
        }
        if let Ok(c) = cpath(&self.path) {
            // SAFETY: NUL-terminated path; `a`, `b` written by fstat/lstat; `self.fd` is our open
            // descriptor of the file.
            unsafe {
                let (mut a, mut b): (libc::stat, libc::stat) = (std::mem::zeroed(), std::mem::zeroed());
                if crate::platform::sys::fstat(self.fd, &mut a) == 0 && crate::platform::sys::lstat(c.as_ptr(), &mut b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev {
                    crate::platform::sys::unlink(c.as_ptr());
                }
            }
        }
    }
}

/// 32 bits that differ between processes started at the same instant with the same PID (in
/// other PID namespaces): the clock's nanoseconds, mixed with an address of this process
/// (randomised by ASLR).
fn nonce() -> u32 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let local = 0u8;
    let x = (t ^ (&local as *const u8 as u64).rotate_left(32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x >> 32) as u32
}

fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Removes the files of `dir` whose process died (their lock is free).
fn reap(dir: &Path) {
    let Ok(cdir) = cpath(dir) else { return };
    let mut names = Vec::new();
    let _ = crate::platform::sys::each_name(&cdir, |n| {
        // (a temporary whose process died between creating and publishing it is unlocked too)
        let temporary = n.strip_prefix(b".").and_then(|n| n.strip_prefix(PREFIX.as_bytes())).is_some_and(|n| n.starts_with(b"tmp-"));
        if n.starts_with(PREFIX.as_bytes()) || temporary {
            names.push(std::ffi::OsStr::from_bytes(n).to_os_string());
        }
    });
    for name in names {
        let path = dir.join(&name);
        let Ok(c) = cpath(&path) else { continue };
        let name = name.as_bytes();
        // SAFETY: NUL-terminated path; our own fd, closed below; `a`, `b` written by fstat/lstat.
        unsafe {
            let fd = crate::platform::sys::open(c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK, 0);
            if fd < 0 {
                continue;
            }
            if lock0(fd, libc::F_OFD_GETLK) {
                // dead: remove it if the name still is this file (not a new process' of the same pid)
                let (mut a, mut b): (libc::stat, libc::stat) = (std::mem::zeroed(), std::mem::zeroed());
                if crate::platform::sys::fstat(fd, &mut a) == 0 && crate::platform::sys::lstat(c.as_ptr(), &mut b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev {
                    // (a temporary is unlocked for a moment after it is created: only old ones)
                    if name.starts_with(PREFIX.as_bytes()) || now_secs().saturating_sub(a.st_mtime as u64) > 60 {
                        crate::platform::sys::unlink(c.as_ptr());
                    }
                }
            }
            crate::platform::sys::close(fd);
        }
    }
}

/// One device's figures as read.
#[derive(Debug, Clone)]
#[allow(dead_code)]
pub struct DeviceFigures {
    pub ordinal: usize,
    pub uuid: String,
    pub part: Option<(u32, u32, String)>,
    pub limit: Option<u64>,
    pub in_use: u64,
    pub peak_in_use: u64,
    pub reserved: u64,
    pub peak_reserved: u64,
    pub refused: u64,
    /// The compute limit as a fraction (`None`: none).
    pub compute_limit: Option<f64>,
    pub busy_ns: u64,
    pub throttled_ns: u64,
    pub launches: u64,
    /// Allocations that waited for room in a shared budget, and how long (nanoseconds).
    pub waits: u64,
    pub waited_ns: u64,
}

/// One process' published file as read.
#[derive(Debug, Clone)]
#[allow(dead_code)]
pub struct Process {
    pub pid: u32,
    pub uid: u32,
    pub comm: String,
    pub alive: bool,
    pub started: u64,
    pub quota: Option<String>,
    /// Devices in the program's view.
    pub view_len: usize,
    /// The compute mode in use: one of [`COMPUTE_MODES`].
    pub compute_mode: &'static str,
    pub devices: Vec<DeviceFigures>,
    pub path: PathBuf,
}

/// Reads the published files of `dir` without changing anything. The directory and each file
/// must be closed to other users and belong to one user (this user, unless run as root).
#[allow(dead_code)]
pub fn read_dir(dir: &Path) -> Result<Vec<Process>, String> {
    let c = cpath(dir)?;
    // SAFETY: `st` is written by lstat.
    let (me, st) = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if crate::platform::sys::lstat(c.as_ptr(), &mut st) != 0 {
            return Err(format!("{}: {}", dir.display(), errno()));
        }
        (crate::platform::sys::getuid(), st)
    };
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR || st.st_mode & 0o077 != 0 || (me != 0 && st.st_uid != me) {
        return Err(format!("{} is not a private directory of this user (mode {:o}, uid {})", dir.display(), st.st_mode & 0o7777, st.st_uid));
    }
    let owner = st.st_uid;
    let mut out = Vec::new();
    let rd = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with(PREFIX) {
            continue;
        }
        if let Some(p) = read_file(&dir.join(name), owner) {
            out.push(p);
        }
    }
    out.sort_by_key(|p| p.pid);
    Ok(out)
}

fn read_file(path: &Path, owner: u32) -> Option<Process> {
    let c = cpath(path).ok()?;
    // SAFETY: NUL-terminated path; our own fd, closed before returning; `st` by fstat;
    // `buf` is a zeroed Header (all atomics: any bytes are a valid value), filled by pread.
    unsafe {
        let fd = crate::platform::sys::open(c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK, 0);
        if fd < 0 {
            return None;
        }
        let mut st: libc::stat = std::mem::zeroed();
        let ok = crate::platform::sys::fstat(fd, &mut st) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_uid == owner && st.st_mode & 0o077 == 0 && st.st_size as usize >= FILE_BYTES;
        let mut buf: Box<std::mem::MaybeUninit<Header>> = Box::new(std::mem::MaybeUninit::zeroed());
        let n = if ok { crate::platform::sys::pread(fd, buf.as_mut_ptr().cast(), FILE_BYTES, 0) } else { -1 };
        let alive = ok && !lock0(fd, libc::F_OFD_GETLK);
        crate::platform::sys::close(fd);
        if n != FILE_BYTES as isize {
            return None;
        }
        let h = buf.assume_init_ref();
        if h.magic.load(Relaxed) != MAGIC || h.version.load(Relaxed) != VERSION || h.layout.load(Relaxed) != LAYOUT {
            return None;
        }
        let comm = get_str(&h.comm);
        let quota = Some(get_str(&h.quota)).filter(|q| !q.is_empty());
        let devices = h
            .dev
            .iter()
            .enumerate()
            .filter(|(_, d)| d.present.load(Relaxed) != 0)
            .map(|(ordinal, d)| DeviceFigures {
                ordinal,
                uuid: get_str(&d.uuid),
                part: (d.part_count.load(Relaxed) != 0).then(|| (d.part_index.load(Relaxed), d.part_count.load(Relaxed), get_str(&d.part_uuid))),
                limit: Some(d.figures.limit.load(Relaxed)).filter(|&l| l != UNKNOWN),
                in_use: d.figures.in_use.load(Relaxed),
                peak_in_use: d.figures.peak_in_use.load(Relaxed),
                reserved: d.figures.reserved.load(Relaxed),
                peak_reserved: d.figures.peak_reserved.load(Relaxed),
                refused: d.figures.refused.load(Relaxed),
                compute_limit: Some(d.compute.limit_ppm.load(Relaxed)).filter(|&l| l != 0).map(|l| l as f64 / 1e6),
                busy_ns: d.compute.busy_ns.load(Relaxed),
                throttled_ns: d.compute.throttled_ns.load(Relaxed),
                launches: d.compute.launches.load(Relaxed),
                waits: d.waits.waits.load(Relaxed),
                waited_ns: d.waits.waited_ns.load(Relaxed),
            })
            .collect();
        Some(Process {
            pid: h.pid.load(Relaxed),
            uid: st.st_uid,
            comm,
            alive,
            started: h.started.load(Relaxed),
            quota,
            view_len: h.devices.load(Relaxed) as usize,
            compute_mode: COMPUTE_MODES.get(h.compute_mode.load(Relaxed) as usize).copied().unwrap_or("none"),
            devices,
            path: path.to_path_buf(),
        })
    }
}

/// The state directories to read: the configured one; as root, also every user's default one
/// (`/run/user/UID/gpushim`, `/tmp/gpushim-UID`) unless a directory was configured.
#[allow(dead_code)]
pub fn dirs(configured: Option<&Path>) -> Vec<PathBuf> {
    let mine = crate::state_files::quota::state_dir(configured);
    let mut out = vec![mine.clone()];
    if configured.is_some() || crate::platform::sys::getuid() != 0 {
        return out;
    }
    // (set-user-ID root programs publish in /run/gpushim: see `secure`)
    let mut more = vec![PathBuf::from(crate::state_files::quota::SECURE_ROOT_DIR)];
    if let Ok(rd) = std::fs::read_dir("/run/user") {
        more.extend(rd.flatten().map(|e| e.path().join("gpushim")));
    }
    if let Ok(rd) = std::fs::read_dir("/tmp") {
        more.extend(rd.flatten().filter(|e| e.file_name().to_str().is_some_and(|n| n.starts_with("gpushim-"))).map(|e| e.path()));
    }
    more.sort();
    for d in more {
        if d != mine && d.is_dir() {
            out.push(d);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh_dir(what: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("gpushim-live-test-{}-{what}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    /// A test's directory in /tmp, removed when dropped, the test passed or not.
    struct RemoveOnDrop(PathBuf);
    impl Drop for RemoveOnDrop {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn publishers_with_one_pid_keep_their_own_files() {
        // Two processes with one PID (other PID namespaces sharing the state directory) are
        // two publishers of one process here: neither replaces nor removes the other's file.
        let dir = fresh_dir("samepid");
        let _rm = RemoveOnDrop(dir.clone());
        let view = [ViewEntry { uuid: "GPU-a".into(), part: None }];
        let a = Publisher::start(&dir, None, &view).unwrap();
        let b = Publisher::start(&dir, Some("q"), &view).unwrap();
        assert_ne!(a.path, b.path);
        a.device(0).unwrap().figures.in_use.store(5, Relaxed);
        b.device(0).unwrap().figures.in_use.store(7, Relaxed);
        let seen = read_dir(&dir).unwrap();
        let mut figures: Vec<(Option<String>, u64, bool)> = seen.iter().map(|p| (p.quota.clone(), p.devices[0].in_use, p.alive)).collect();
        figures.sort();
        assert_eq!(figures, vec![(None, 5, true), (Some("q".into()), 7, true)]);
        a.remove();
        let left: Vec<PathBuf> = read_dir(&dir).unwrap().into_iter().map(|p| p.path).collect();
        assert_eq!(left, vec![b.path.clone()]);
        // a name that no longer is this publisher's file is not removed
        std::fs::rename(&b.path, dir.join("moved")).unwrap();
        std::fs::write(&b.path, b"someone else's").unwrap();
        b.remove();
        assert!(b.path.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn dead_temporaries_are_reaped_only_when_old() {
        let dir = fresh_dir("tmp");
        let _rm = RemoveOnDrop(dir.clone());
        crate::state_files::quota::private_dir(&dir).unwrap();
        let (young, old) = (dir.join(".proc-tmp-1-00000001"), dir.join(".proc-tmp-2-00000002"));
        for p in [&young, &old] {
            std::fs::write(p, b"").unwrap();
        }
        let past = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        std::fs::File::options().write(true).open(&old).unwrap().set_modified(past).unwrap();
        reap(&dir);
        assert!(young.exists());
        assert!(!old.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
