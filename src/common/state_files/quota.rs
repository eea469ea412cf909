//! Shared quotas (`GPUSHIM_SHARED_QUOTA=NAME`): one budget per device for every process of the
//! same user started with the same name.
//!
//! # The quota file
//!
//! `STATE_DIR/quota-NAME`, mapped shared by every member: a header (magic, version, a robust
//! process-shared mutex, a table of devices by UUID with the bytes reserved by all members and
//! the peak) and [`SLOTS`] slots, one per live member (pid, name, per-device limit and usage).
//! The header starts with the version and a fingerprint of the layout ([`LAYOUT`]: the sizes
//! of the header, the slot and device tables and the mutex), checked on open: a file made by a
//! build with another layout, a truncated file or one that is not a quota file is refused with
//! an error naming it, never mapped beyond its end. The mutex is taken with a bound
//! ([`LOCK_TIMEOUT_S`]): a corrupted mutex (or a holder that never lets go) is an error that
//! refuses the allocation, never a hang.
//! The file appears fully initialised or not at all: it is built under a temporary name and
//! `link`ed into place; a process that loses that race opens the winner's file.
//!
//! # Race-free
//!
//! A reservation takes the mutex, checks the device's total against the process' limit, adds
//! to the total and to the process' own slot, and lets go. No interleaving of processes can
//! pass the limit; the mutex is held for a few loads and stores and never across a call into
//! the driver.
//!
//! # Crash-safe
//!
//! Each member holds an open-file-description lock (`F_OFD_SETLK`) on its slot's byte; the
//! kernel drops it when the process dies, however it dies. A slot whose lock can be taken while
//! it still records usage belongs to a dead process: the next member that needs room (a
//! reservation that would fail), asks for numbers (`cuMemGetInfo`, NVML) or joins subtracts
//! that usage from the totals and clears the slot. A member killed while holding the mutex
//! leaves it to the robust-mutex protocol: the next locker gets `EOWNERDEAD`, rebuilds every
//! total from the slots of live members (the only state a dead member could have left half
//! written is its own slot and the totals) and marks the mutex consistent. Nobody waits for a
//! dead process; joining takes no node-wide lock beyond one short critical section.
//!
//! # Oversubscription
//!
//! A process with a limit but no quota takes a slot in the user's registry ([`REGISTRY_FILE`],
//! same format) and records its limits there; nothing is reserved in it. When a process first
//! uses a device, [`commitments_on`] adds up what the live quotas (their budgets) and the live
//! registered processes (their limits) promise on that device: more than the device has is
//! worth a warning (three processes at 40% of one GPU).
//!
//! # Who may use it
//!
//! [`state_dir`] is the `state_dir` setting (`GPUSHIM_STATE_DIR`), else `$XDG_RUNTIME_DIR/gpushim`, else
//! `/tmp/gpushim-UID`; created with mode 0700 and refused unless it is a directory (not a
//! link) owned by the user with no permission for anyone else. Files are 0600 and checked the
//! same way, so another user can neither read nor change a quota.
//!
//! This module uses only `libc`: the `gpushim` command compiles it too (`gpushim ps`).

use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::Release, Ordering::Acquire};

/// Bumped in every forked child (`fork.rs`, the library's `pthread_atfork` handler): places
/// taken under an earlier generation are a parent's.
pub use crate::platform::once::FORK_GENERATION;

const NO_SLOT: usize = usize::MAX;

/// Members of one quota at a time.
pub const SLOTS: usize = 256;
/// Devices one quota keeps budgets for.
pub const DEVICES: usize = 64;
const UUID_BYTES: usize = 48;
const MAGIC: u64 = u64::from_le_bytes(*b"gpushimQ");
const VERSION: u32 = 2;
/// The longest anyone waits for the quota's mutex (held for a few loads and stores): beyond it
/// the mutex is taken to be corrupted or held by a stuck process, and the operation fails.
pub const LOCK_TIMEOUT_S: i64 = 5;
/// A fingerprint of the file's layout in this build (with [`VERSION`]): two builds that would
/// read each other's files differently have different fingerprints.
pub const LAYOUT: u64 = {
    let parts = [
        VERSION as u64,
        std::mem::size_of::<Header>() as u64,
        std::mem::size_of::<Slot>() as u64,
        std::mem::size_of::<Device>() as u64,
        std::mem::size_of::<libc::pthread_mutex_t>() as u64,
        SLOTS as u64,
        DEVICES as u64,
        UUID_BYTES as u64,
    ];
    let mut h: u64 = 0xcbf2_9ce4_8422_2325; // FNV-1a over the parts
    let mut i = 0;
    while i < parts.len() {
        h ^= parts[i];
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    h
};
/// The bytes at the start of every quota file, whatever its layout: magic, version, slots,
/// layout.
const PREFIX_BYTES: usize = 24;
/// Slot `i`'s liveness lock is on byte `LOCK_BASE + i` (beyond the data, which locks ignore).
const LOCK_BASE: i64 = 1 << 40;
/// The user's registry of processes with a limit and no shared quota, in the state directory:
/// a file of the quota format in which each member records its limits (nobody reserves in
/// it). Quotas and the registry together are what the oversubscription warning adds up.
pub const REGISTRY_FILE: &str = "limits";

#[repr(C)]
struct Device {
    /// `GPU-…`, NUL-padded; all zero for an unused entry.
    uuid: [AtomicU64; UUID_BYTES / 8],
    /// Bytes reserved on the device by all members.
    reserved: AtomicU64,
    peak: AtomicU64,
    /// The physical size of the device (or part), as the first member saw it.
    size: AtomicU64,
}

#[repr(C)]
struct Slot {
    pid: AtomicU32,
    /// 1 while a member is registered in it.
    used: AtomicU32,
    /// The process' name (`comm`), NUL-padded.
    comm: [AtomicU64; 2],
    limit: [AtomicU64; DEVICES],
    usage: [AtomicU64; DEVICES],
}

#[repr(C)]
struct Header {
    magic: AtomicU64,
    version: AtomicU32,
    slots: AtomicU32,
    /// [`LAYOUT`] of the build that made the file.
    layout: AtomicU64,
    mutex: libc::pthread_mutex_t,
    devices: [Device; DEVICES],
    slot: [Slot; SLOTS],
}

const FILE_BYTES: usize = std::mem::size_of::<Header>();

/// One process' membership of a quota.
pub struct Quota {
    pub name: String,
    pub path: PathBuf,
    fd: libc::c_int,
    header: *mut Header,
    /// The slot this member took ([`NO_SLOT`]: none; the file is only being read, `gpushim ps`).
    slot_index: AtomicUsize,
    /// Who took it ([`whoami`]: pid and fork generation): in a child, the membership is its
    /// parent's place until the child re-joins (see [`Quota::slot`]).
    owner: AtomicU64,
    /// The open file description holding this member's slot lock (a re-joined child's own).
    lock_fd: AtomicI32,
}

// SAFETY: the mapping is shared memory accessed through atomics and the process-shared mutex;
// the pointer stays valid for the life of the `Quota` (never unmapped while one exists).
unsafe impl Send for Quota {}
unsafe impl Sync for Quota {}

/// A member as `gpushim ps` shows it.
#[allow(dead_code)] // (read by `gpushim ps` only)
#[derive(Debug, Clone)]
pub struct Member {
    pub pid: u32,
    pub comm: String,
    pub alive: bool,
    /// (device index, limit, usage) for each device the member has a limit or usage on.
    pub devices: Vec<(usize, u64, u64)>,
}

/// A device entry as `gpushim ps` shows it.
#[allow(dead_code)] // (read by `gpushim ps` only)
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    pub uuid: String,
    pub reserved: u64,
    pub peak: u64,
    pub size: u64,
}

/// Where errors met outside a `Result` (a reservation refused because the quota's lock is
/// unusable) are reported; set once by the shim (its log). Unset: not reported.
pub static ON_ERROR: crate::platform::once::ForkOnce<fn(&str)> = crate::platform::once::ForkOnce::new();

fn report_error(e: &str) {
    if let Some(f) = ON_ERROR.get() {
        f(e);
    }
}

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// Who this process is, as the owner of a place: its pid (high half) and its fork generation
/// (low half). The pid is the kernel's, asked each time (no cache): a child made without
/// `fork()` (a raw `clone`, glibc's `_Fork`, `vfork`) runs no fork handler, so its generation
/// is its parent's, and it inherits the parent's exit handlers; its pid tells it apart.
fn whoami() -> u64 {
    (crate::platform::sys::getpid() as u32 as u64) << 32 | (FORK_GENERATION.load(Acquire) & 0xFFFF_FFFF)
}

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
    } else if let Some(d) = std::env::var("XDG_RUNTIME_DIR").ok().filter(|d| d.starts_with('/')) {
        return Path::new(&d).join("gpushim");
    }
    PathBuf::from(format!("/tmp/gpushim-{}", owner_uid()))
}

/// The default state directory of a set-user-ID root program (see `secure`).
pub const SECURE_ROOT_DIR: &str = "/run/gpushim";

/// The user the shim's files belong to: the effective one, who creates them (the real one
/// differs in a set-user-ID program, whose files must not land in the caller's directory).
fn owner_uid() -> libc::uid_t {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

fn cpath(p: &Path) -> Result<CString, String> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| format!("{}: NUL in the path", p.display()))
}

/// `stat` of `fd` or `path` (not following a final link) must show the user's own object of
/// the given type with no permission for group or others.
fn check_private(st: &libc::stat, what: &Path, dir: bool) -> Result<(), String> {
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

fn private_dir_checked(dir: &Path) -> Result<(), String> {
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
/// `F_OFD_GETLK` (would it be free?).
fn slot_lock(fd: libc::c_int, i: usize, cmd: libc::c_int) -> Result<bool, std::io::Error> {
    // SAFETY: a zeroed flock is valid; fcntl reads and (GETLK) writes it.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as _;
    fl.l_whence = libc::SEEK_SET as _;
    fl.l_start = LOCK_BASE + i as i64;
    fl.l_len = 1;
    // SAFETY: `fd` is open; `fl` is a valid flock.
    let rc = unsafe { crate::platform::sys::fcntl_lock(fd, cmd, &mut fl) };
    if rc != 0 {
        let e = errno();
        return match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EACCES) => Ok(false),
            _ => Err(e),
        };
    }
    Ok(cmd == libc::F_OFD_SETLK || fl.l_type == libc::F_UNLCK as _)
}

impl Quota {
    /// Opens (creating it if needed) the quota `name` in `dir` and, when `join`, takes a slot.
    pub fn open(dir: &Path, name: &str, join: bool) -> Result<Quota, String> {
        Quota::open_file(dir, name, file_of(dir, name), join)
    }

    /// Opens (creating it if needed) the user's registry of limited processes in `dir` (see
    /// [`REGISTRY_FILE`]) and, when `join`, takes a slot in it.
    pub fn open_registry(dir: &Path, join: bool) -> Result<Quota, String> {
        Quota::open_file(dir, "", dir.join(REGISTRY_FILE), join)
    }

    fn open_file(dir: &Path, name: &str, path: PathBuf, join: bool) -> Result<Quota, String> {
        if join {
            private_dir(dir)?;
        }
        let fd = match open_existing(&path) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) && join => create(dir, &path)?,
            Err(e) => return Err(format!("cannot open {}: {e}", path.display())),
        };
        // From here on `q` owns `fd` (closed by Drop).
        let mut q = Quota {
            name: name.to_string(),
            path,
            fd,
            header: std::ptr::null_mut(),
            slot_index: AtomicUsize::new(NO_SLOT),
            owner: AtomicU64::new(whoami()),
            lock_fd: AtomicI32::new(fd),
        };
        q.map(join)?;
        if join {
            q.slot_index.store(q.claim_slot(fd)?, Relaxed);
        }
        Ok(q)
    }

    /// This process' slot (`me`: [`whoami`]). A child (another pid, or a later
    /// [`FORK_GENERATION`]) has none until it re-joins: the inherited place is its parent's,
    /// which the child never changes, nor leaves at its exit.
    fn slot_of(&self, me: u64) -> Option<usize> {
        if self.owner.load(Acquire) != me {
            return None;
        }
        let i = self.slot_index.load(Relaxed);
        (i != NO_SLOT).then_some(i)
    }

    fn slot(&self) -> Option<usize> {
        self.slot_of(whoami())
    }

    /// Whether this process (`me`) can tell live members from dead ones: its lock checks go
    /// through a description of its own. A child that has not re-joined shares its parent's
    /// (which holds the parent's lock): it would see its parent's place as free.
    fn judges_liveness(&self, me: u64) -> bool {
        self.slot_index.load(Relaxed) == NO_SLOT || self.owner.load(Acquire) == me
    }

    /// A child's first reservation (`me`: the child): a place of its own (its usage starts at
    /// zero), locked through an open file description of its own (the inherited one is the
    /// parent's).
    fn rejoin(&self, me: u64) -> Option<usize> {
        if self.slot_index.load(Relaxed) == NO_SLOT {
            return None; // never a member (a read-only view)
        }
        let fd = open_existing(&self.path).ok()?;
        match self.claim_slot(fd) {
            Ok(i) => {
                self.slot_index.store(i, Relaxed);
                self.lock_fd.store(fd, Relaxed);
                self.owner.store(me, Release);
                Some(i)
            }
            Err(_) => {
                // SAFETY: our own fd, just opened.
                unsafe { crate::platform::sys::close(fd) };
                None
            }
        }
    }

    /// Maps the file, checked; a member's (`join`) with all its blocks allocated.
    fn map(&mut self, join: bool) -> Result<(), String> {
        let p = self.path.display();
        let way_out = "remove it when no process uses it, or use another GPUSHIM_STATE_DIR or quota name";
        // SAFETY: `st` is written by fstat; `prefix` by pread (at most its size); the mapping
        // covers FILE_BYTES of a file at least that long (checked), shared, and outlives every
        // reference made from it.
        unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            if crate::platform::sys::fstat(self.fd, &mut st) != 0 {
                return Err(format!("{p}: {}", errno()));
            }
            check_private(&st, &self.path, false)?;
            let size = st.st_size.max(0) as usize;
            let mut prefix = [0u8; PREFIX_BYTES];
            let n = crate::platform::sys::pread(self.fd, prefix.as_mut_ptr().cast(), PREFIX_BYTES, 0);
            let word = |at: usize, len: usize| prefix[at..at + len].iter().rev().fold(0u64, |a, &b| a << 8 | b as u64);
            if n < 8 || word(0, 8) != MAGIC {
                return Err(format!("{p} is not a gpushim quota file ({size} bytes, no gpushim header): {way_out}"));
            }
            let version = if n >= 12 { word(8, 4) } else { 0 };
            let layout = if n as usize >= PREFIX_BYTES { word(16, 8) } else { 0 };
            if version != u64::from(VERSION) || layout != LAYOUT {
                return Err(format!(
                    "{p} was made by a different gpushim build (file version {version}, layout {layout:#x}; this build reads version {VERSION}, layout {LAYOUT:#x}): {way_out}"
                ));
            }
            if size < FILE_BYTES {
                return Err(format!("{p} is truncated ({size} of {FILE_BYTES} bytes): {way_out}"));
            }
            // A member writes its place: the blocks must be there (a file of this build has
            // them before it has its name; one sparse, as earlier builds made them, gets them
            // now, or is refused: a SIGBUS otherwise on a full file system).
            if join && (st.st_blocks.max(0) as u64).saturating_mul(512) < FILE_BYTES as u64 {
                crate::platform::sys::allocate(self.fd, FILE_BYTES as u64).map_err(|e| cannot_hold(&self.path, &e))?;
            }
            let m = crate::platform::sys::mmap(std::ptr::null_mut(), FILE_BYTES, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, self.fd, 0);
            if m == libc::MAP_FAILED {
                return Err(format!("cannot map {p}: {}", errno()));
            }
            self.header = m.cast();
        }
        let h = self.h();
        if h.magic.load(Acquire) != MAGIC || h.version.load(Relaxed) != VERSION || h.layout.load(Relaxed) != LAYOUT || h.slots.load(Relaxed) as usize != SLOTS {
            return Err(format!("{p} is not a gpushim quota file of this build: {way_out}"));
        }
        Ok(())
    }

    fn h(&self) -> &Header {
        // SAFETY: `header` points at the live mapping (see `map`).
        unsafe { &*self.header }
    }

    /// Takes the first slot whose lock is free, starting at a place that depends on the pid so
    /// that processes starting together rarely try the same slots.
    fn claim_slot(&self, fd: libc::c_int) -> Result<usize, String> {
        let pid = crate::platform::sys::getpid() as u32;
        for j in 0..SLOTS {
            let i = (pid as usize + j) % SLOTS;
            if !slot_lock(fd, i, libc::F_OFD_SETLK).map_err(|e| format!("{}: cannot lock: {e}", self.path.display()))? {
                continue;
            }
            let _g = self.lock()?;
            self.clear_slot(i);
            let s = &self.h().slot[i];
            s.pid.store(pid, Relaxed);
            let comm = comm();
            s.comm[0].store(u64::from_le_bytes(comm[..8].try_into().expect("8 bytes")), Relaxed);
            s.comm[1].store(u64::from_le_bytes(comm[8..].try_into().expect("8 bytes")), Relaxed);
            s.used.store(1, Relaxed);
            return Ok(i);
        }
        Err(format!("{}: all {SLOTS} places of the quota are taken by live processes", self.path.display()))
    }

    /// Subtracts slot `i`'s usage from the totals and empties it (the mutex is held).
    fn clear_slot(&self, i: usize) {
        let h = self.h();
        let s = &h.slot[i];
        for d in 0..DEVICES {
            let u = s.usage[d].swap(0, Relaxed);
            if u != 0 {
                let _ = h.devices[d].reserved.fetch_update(Relaxed, Relaxed, |r| Some(r.saturating_sub(u)));
            }
            s.limit[d].store(0, Relaxed);
        }
        s.used.store(0, Relaxed);
        s.pid.store(0, Relaxed);
    }

    /// Clears the slots of members that died (the mutex is held; `me`: [`whoami`]). Returns
    /// how many.
    fn reap(&self, me: u64) -> usize {
        if !self.judges_liveness(me) {
            return 0;
        }
        let h = self.h();
        let mine = self.slot_of(me);
        let mut reaped = 0;
        for i in 0..SLOTS {
            if Some(i) == mine {
                continue;
            }
            let s = &h.slot[i];
            let busy = s.used.load(Relaxed) != 0 || s.usage.iter().any(|u| u.load(Relaxed) != 0);
            if busy && matches!(slot_lock(self.lock_fd.load(Relaxed), i, libc::F_OFD_GETLK), Ok(true)) {
                self.clear_slot(i);
                reaped += 1;
            }
        }
        reaped
    }

    /// Takes the quota's mutex, repairing the totals if its last holder died.
    fn lock(&self) -> Result<Guard, String> {
        let m = std::ptr::addr_of!(self.h().mutex).cast_mut();
        // SAFETY: `ts` is written by clock_gettime; `m` is the process-shared robust mutex
        // initialised in `create` (or garbage in a corrupted file: the wait is bounded).
        let rc = unsafe {
            let mut ts: libc::timespec = std::mem::zeroed();
            libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts);
            ts.tv_sec += LOCK_TIMEOUT_S as libc::time_t;
            libc::pthread_mutex_timedlock(m, &ts)
        };
        match rc {
            0 => Ok(Guard(m)),
            libc::EOWNERDEAD => {
                let g = Guard(m);
                self.reap(whoami());
                self.rebuild_totals();
                // SAFETY: we hold the mutex after EOWNERDEAD.
                unsafe { libc::pthread_mutex_consistent(m) };
                Ok(g)
            }
            libc::ETIMEDOUT => Err(format!(
                "{}: the quota's lock was not free within {LOCK_TIMEOUT_S} s (corrupted, or held by a stuck process): remove the file when no process uses it, or use another GPUSHIM_STATE_DIR or quota name",
                self.path.display()
            )),
            e => Err(format!(
                "{}: the quota's lock is unusable ({}): remove the file when no process uses it, or use another GPUSHIM_STATE_DIR or quota name",
                self.path.display(),
                std::io::Error::from_raw_os_error(e)
            )),
        }
    }

    /// Every device's total from the slots of live members (after a member died mid-update).
    fn rebuild_totals(&self) {
        let h = self.h();
        for d in 0..DEVICES {
            let sum: u64 = h.slot.iter().map(|s| s.usage[d].load(Relaxed)).fold(0, u64::saturating_add);
            h.devices[d].reserved.store(sum, Relaxed);
        }
    }

    /// The index of the device `uuid` (`size` its physical bytes), adding it if new, and
    /// records this member's `limit` on it. `None` when the table is full.
    pub fn device(&self, uuid: &str, size: u64, limit: u64) -> Result<Option<usize>, String> {
        let key = uuid_key(uuid);
        let _g = self.lock()?;
        let h = self.h();
        let found = h.devices.iter().position(|d| uuid_of_atomic(&d.uuid) == key).or_else(|| {
            let free = h.devices.iter().position(|d| d.uuid.iter().all(|w| w.load(Relaxed) == 0))?;
            for (w, chunk) in h.devices[free].uuid.iter().zip(key.chunks(8)) {
                w.store(u64::from_le_bytes(chunk.try_into().expect("8 bytes")), Relaxed);
            }
            h.devices[free].size.store(size, Relaxed);
            Some(free)
        });
        if let (Some(d), Some(i)) = (found, self.slot()) {
            h.slot[i].limit[d].store(limit, Relaxed);
        }
        Ok(found)
    }

    /// The index of the device `uuid`, if the quota has it.
    pub fn find(&self, uuid: &str) -> Option<usize> {
        let key = uuid_key(uuid);
        self.h().devices.iter().position(|d| uuid_of_atomic(&d.uuid) == key)
    }

    /// Adds `bytes` to device `d` for this member if the total stays within `limit`;
    /// `Err(total)` otherwise (after clearing dead members' usage).
    pub fn reserve(&self, d: usize, bytes: u64, limit: u64) -> Result<(), u64> {
        let me = whoami();
        let Some(i) = self.slot_of(me).or_else(|| self.rejoin(me)) else { return Err(0) };
        let _g = match self.lock() {
            Ok(g) => g,
            Err(e) => {
                report_error(&e);
                return Err(u64::MAX); // fail closed
            }
        };
        let h = self.h();
        let dev = &h.devices[d];
        let fits = |r: u64| r.checked_add(bytes).is_some_and(|n| n <= limit);
        if !fits(dev.reserved.load(Relaxed)) && (self.reap(me) == 0 || !fits(dev.reserved.load(Relaxed))) {
            return Err(dev.reserved.load(Relaxed));
        }
        let now = dev.reserved.load(Relaxed) + bytes;
        dev.reserved.store(now, Relaxed);
        dev.peak.fetch_max(now, Relaxed);
        h.slot[i].usage[d].fetch_add(bytes, Relaxed);
        Ok(())
    }

    /// Gives back `bytes` of this member's reservation on device `d` (never more than it holds).
    pub fn release(&self, d: usize, bytes: u64) {
        let Some(i) = self.slot() else { return };
        let Ok(_g) = self.lock() else { return };
        let h = self.h();
        let mine = &h.slot[i].usage[d];
        let n = bytes.min(mine.load(Relaxed));
        mine.fetch_sub(n, Relaxed);
        let _ = h.devices[d].reserved.fetch_update(Relaxed, Relaxed, |r| Some(r.saturating_sub(n)));
    }

    /// What all members hold on device `d` now, after clearing dead members' usage.
    pub fn reserved(&self, d: usize) -> u64 {
        if let Ok(_g) = self.lock() {
            self.reap(whoami());
        }
        self.h().devices[d].reserved.load(Relaxed)
    }

    /// The highest total device `d` reached.
    pub fn peak(&self, d: usize) -> u64 {
        self.h().devices[d].peak.load(Relaxed)
    }

    /// Leaves the quota: this member's usage is given back and its slot emptied (at exit).
    pub fn leave(&self) {
        let Some(i) = self.slot() else { return };
        if let Ok(_g) = self.lock() {
            self.clear_slot(i);
        }
    }

    /// (pid, name, limit) of every live member with a limit on device `d`, read without changing
    /// anything. Looks at registered places only (a start-up path: no full scan of the file).
    pub fn live_limits(&self, d: usize) -> Vec<(u32, String, u64)> {
        let h = self.h();
        let me = whoami();
        let (mine, judges) = (self.slot_of(me), self.judges_liveness(me));
        h.slot
            .iter()
            .enumerate()
            .filter(|(_, s)| s.used.load(Relaxed) != 0)
            .filter_map(|(i, s)| {
                let limit = s.limit.get(d)?.load(Relaxed);
                let alive = Some(i) == mine || !judges || !matches!(slot_lock(self.lock_fd.load(Relaxed), i, libc::F_OFD_GETLK), Ok(true));
                (limit > 0 && alive).then(|| (s.pid.load(Relaxed), comm_of(s), limit))
            })
            .collect()
    }

    /// Devices and members, read without changing anything (`gpushim ps`).
    #[allow(dead_code)] // (`gpushim ps` only)
    pub fn snapshot(&self) -> (Vec<DeviceInfo>, Vec<Member>) {
        let h = self.h();
        let me = whoami();
        let (mine, judges) = (self.slot_of(me), self.judges_liveness(me));
        let devices = h
            .devices
            .iter()
            .take_while(|d| d.uuid[0].load(Relaxed) != 0)
            .map(|d| DeviceInfo {
                uuid: String::from_utf8_lossy(&uuid_of_atomic(&d.uuid)).trim_end_matches('\0').to_string(),
                reserved: d.reserved.load(Relaxed),
                peak: d.peak.load(Relaxed),
                size: d.size.load(Relaxed),
            })
            .collect();
        let members = (0..SLOTS)
            .filter_map(|i| {
                let s = &h.slot[i];
                let usage: Vec<(usize, u64, u64)> = (0..DEVICES)
                    .map(|d| (d, s.limit[d].load(Relaxed), s.usage[d].load(Relaxed)))
                    .filter(|&(_, l, u)| l != 0 || u != 0)
                    .collect();
                if s.used.load(Relaxed) == 0 && usage.is_empty() {
                    return None;
                }
                let comm = comm_of(s);
                let alive = Some(i) == mine || !judges || !matches!(slot_lock(self.lock_fd.load(Relaxed), i, libc::F_OFD_GETLK), Ok(true));
                Some(Member { pid: s.pid.load(Relaxed), comm, alive, devices: usage })
            })
            .collect();
        (devices, members)
    }
}

/// What the live processes of this user promise on the device `uuid`, as (who, bytes): each
/// shared quota of `dir` with live members there (its budget: the largest limit of a live
/// member), and each live process of the registry with a limit there (its own limit): the
/// `registry` this process has open, else the one of `dir`. Files that cannot be read are left
/// out.
pub fn commitments_on(dir: &Path, uuid: &str, registry: Option<&Quota>) -> Vec<(String, u64)> {
    let live_limits = |q: &Quota| q.find(uuid).map_or_else(Vec::new, |d| q.live_limits(d));
    let mut out: Vec<(String, u64)> = names_in(dir)
        .into_iter()
        .filter_map(|name| {
            let q = Quota::open(dir, &name, false).ok()?;
            let budget = live_limits(&q).into_iter().map(|(_, _, l)| l).max()?;
            Some((format!("shared quota {name}"), budget))
        })
        .collect();
    let opened = if registry.is_none() { Quota::open_registry(dir, false).ok() } else { None };
    if let Some(registry) = registry.or(opened.as_ref()) {
        for (pid, comm, limit) in live_limits(registry) {
            out.push((format!("pid {pid} ({comm})"), limit));
        }
    }
    out
}

impl Drop for Quota {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping and closing our own fd; nothing borrowed from them
        // outlives `self`.
        unsafe {
            if !self.header.is_null() {
                crate::platform::sys::munmap(self.header.cast(), FILE_BYTES);
            }
            crate::platform::sys::close(self.fd);
        }
    }
}

struct Guard(*mut libc::pthread_mutex_t);

impl Drop for Guard {
    fn drop(&mut self) {
        // SAFETY: the guard exists only while this thread holds the mutex.
        unsafe { libc::pthread_mutex_unlock(self.0) };
    }
}

fn uuid_key(uuid: &str) -> [u8; UUID_BYTES] {
    let mut k = [0u8; UUID_BYTES];
    let b = uuid.as_bytes();
    let n = b.len().min(UUID_BYTES - 1);
    k[..n].copy_from_slice(&b[..n]);
    k
}

fn uuid_of_atomic(words: &[AtomicU64; UUID_BYTES / 8]) -> [u8; UUID_BYTES] {
    let mut k = [0u8; UUID_BYTES];
    for (chunk, w) in k.chunks_mut(8).zip(words) {
        chunk.copy_from_slice(&w.load(Relaxed).to_le_bytes());
    }
    k
}

/// The name a slot records for its process.
fn comm_of(s: &Slot) -> String {
    let mut comm = [0u8; 16];
    comm[..8].copy_from_slice(&s.comm[0].load(Relaxed).to_le_bytes());
    comm[8..].copy_from_slice(&s.comm[1].load(Relaxed).to_le_bytes());
    String::from_utf8_lossy(&comm).trim_end_matches('\0').to_string()
}

/// This process' `comm` (at most 15 bytes), NUL-padded.
pub fn comm() -> [u8; 16] {
    let mut out = [0u8; 16];
    let mut buf = [0 as libc::c_char; 17];
    // SAFETY: PR_GET_NAME writes at most 16 bytes including the NUL into `buf`.
    if unsafe { crate::platform::sys::get_name(buf.as_mut_ptr()) } == 0 {
        // SAFETY: `buf` is NUL-terminated (17 bytes, zeroed, at most 16 written).
        let name = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_bytes();
        let n = name.len().min(15);
        out[..n].copy_from_slice(&name[..n]);
    }
    out
}

fn open_existing(path: &Path) -> Result<libc::c_int, std::io::Error> {
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
fn cannot_hold(path: &Path, e: &crate::platform::sys::Unallocated) -> String {
    let (dir, file) = (path.parent().unwrap_or(Path::new("")), path.file_name().unwrap_or_default());
    format!("the state directory {} cannot hold {}: {e}; {}", dir.display(), file.to_string_lossy(), e.advice())
}

/// The file `path` another process is building in `dir`, once it has its name: a directory
/// with room for one quota file but not for one per process starting together refuses room
/// to all but one, and they join the one built. Waits while a file is being built there (a
/// temporary exists), 1 s at most.
fn theirs_when_built(dir: &Path, path: &Path) -> Option<libc::c_int> {
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
fn create(dir: &Path, path: &Path) -> Result<libc::c_int, String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gpushim-quota-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// Each call looks again: a directory removed since is made again, one replaced by a
    /// directory open to others (or a link) is refused (a cached first answer let both pass).
    #[test]
    fn the_state_directory_is_checked_on_every_call() {
        use std::os::unix::fs::PermissionsExt;
        let d = dir("checked");
        private_dir(&d).unwrap();
        assert_eq!(std::fs::metadata(&d).unwrap().permissions().mode() & 0o777, 0o700);
        std::fs::remove_dir(&d).unwrap();
        private_dir(&d).unwrap();
        assert!(d.is_dir(), "made again");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = private_dir(&d).unwrap_err();
        assert!(e.contains("open to other users (mode 777)"), "{e}");
        std::fs::remove_dir(&d).unwrap();
        let target = dir("checked-target");
        std::fs::create_dir(&target).unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::symlink(&target, &d).unwrap();
        let e = private_dir(&d).unwrap_err();
        assert!(e.contains("is not a directory"), "{e}");
        std::fs::remove_file(&d).unwrap();
        std::fs::remove_dir(&target).unwrap();
    }

    #[test]
    fn two_members_share_one_budget() {
        let d = dir("share");
        let a = Quota::open(&d, "q", true).unwrap();
        let b = Quota::open(&d, "q", true).unwrap();
        assert_ne!(a.slot(), b.slot());
        let da = a.device("GPU-aaaa", 100, 50).unwrap().unwrap();
        let db = b.device("GPU-aaaa", 100, 50).unwrap().unwrap();
        assert_eq!(da, db);
        assert_eq!(a.reserve(da, 30, 50), Ok(()));
        assert_eq!(b.reserve(db, 30, 50), Err(30));
        assert_eq!(b.reserve(db, 20, 50), Ok(()));
        assert_eq!(a.reserved(da), 50);
        a.release(da, 1000); // never more than it holds
        assert_eq!(b.reserved(db), 20);
        assert_eq!(a.peak(da), 50);
        let other = b.device("GPU-bbbb", 100, 10).unwrap().unwrap();
        assert_ne!(other, da);
        let (devices, members) = a.snapshot();
        assert_eq!(devices.len(), 2);
        assert_eq!(devices[0].uuid, "GPU-aaaa");
        assert_eq!(members.len(), 2);
        assert!(members.iter().all(|m| m.alive && m.pid == std::process::id()));
        b.leave();
        assert_eq!(a.reserved(da), 0);
        drop((a, b));
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A member's file has all its blocks: one left sparse (as earlier builds made them) gets
    /// them when a member joins (a write to a hole on a full file system is a SIGBUS); a reader
    /// changes nothing.
    #[test]
    fn a_sparse_file_gets_its_blocks_when_joined() {
        use std::os::unix::fs::MetadataExt;
        use std::os::unix::io::AsRawFd;
        let d = dir("sparse");
        drop(Quota::open(&d, "q", true).unwrap());
        let path = file_of(&d, "q");
        let allocated = || std::fs::metadata(&path).unwrap().blocks() * 512;
        assert!(allocated() >= FILE_BYTES as u64, "made with its blocks: {}", allocated());
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        // SAFETY: our own descriptor; punches the places out, the size kept.
        let rc = unsafe { libc::fallocate(f.as_raw_fd(), libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, 8192, FILE_BYTES as i64 - 8192) };
        assert_eq!(rc, 0, "{}", errno());
        assert!(allocated() < 16384, "{}", allocated());
        let view = Quota::open(&d, "q", false).unwrap();
        assert!(allocated() < 16384, "a reader: {}", allocated());
        let member = Quota::open(&d, "q", true).unwrap();
        assert!(allocated() >= FILE_BYTES as u64, "a member: {}", allocated());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), FILE_BYTES as u64);
        drop((view, member));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_closed_member_is_reclaimed() {
        let d = dir("reclaim");
        let a = Quota::open(&d, "q", true).unwrap();
        let dev = a.device("GPU-x", 100, 100).unwrap().unwrap();
        {
            let b = Quota::open(&d, "q", true).unwrap();
            b.device("GPU-x", 100, 100).unwrap();
            assert_eq!(b.reserve(dev, 70, 100), Ok(()));
            // dropping b closes its file: its lock goes, as when a process dies
        }
        // the reservation that does not fit reclaims b's 70 bytes first
        assert_eq!(a.reserve(dev, 50, 100), Ok(()));
        assert_eq!(a.reserved(dev), 50);
        let _ = std::fs::remove_dir_all(&d);
    }

    /// The child half of `a_member_killed_holding_the_lock_is_repaired` (does nothing unless
    /// that test started this binary for it): joins the quota, reserves 30 bytes, takes the
    /// lock, leaves the device's total half-updated, and dies by SIGKILL still holding it.
    #[test]
    fn killed_holding_the_lock_child() {
        let Ok(dir) = std::env::var("GPUSHIM_QUOTA_TEST_CHILD") else { return };
        let q = Quota::open(Path::new(&dir), "q", true).unwrap();
        let d = q.device("GPU-k", 100, 100).unwrap().unwrap();
        q.reserve(d, 30, 100).unwrap();
        let _g = q.lock().unwrap();
        q.h().devices[d].reserved.store(77_777, Relaxed); // an update cut short
        // SAFETY: ends this child process at once, as `kill -9` would.
        unsafe { libc::raise(libc::SIGKILL) };
        unreachable!();
    }

    #[test]
    fn a_member_killed_holding_the_lock_is_repaired() {
        let d = dir("ownerdead");
        let a = Quota::open(&d, "q", true).unwrap();
        let dev = a.device("GPU-k", 100, 100).unwrap().unwrap();
        assert_eq!(a.reserve(dev, 10, 100), Ok(()));
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "quota::tests::killed_holding_the_lock_child", "--test-threads=1"])
            .env("GPUSHIM_QUOTA_TEST_CHILD", &d)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL), "the child did not die as planned: {status:?}");
        // the next locker is not blocked, rebuilds the total from the live members' places
        // (the dead child's 30 bytes and its half-written total are gone) and goes on
        assert_eq!(a.reserved(dev), 10);
        assert_eq!(a.reserve(dev, 90, 100), Ok(()));
        assert_eq!(a.reserve(dev, 1, 100), Err(100));
        let (_, members) = a.snapshot();
        assert_eq!(members.len(), 1, "{members:?}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn others_cannot_use_an_open_directory() {
        let d = dir("perm");
        std::fs::create_dir_all(&d).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = Quota::open(&d, "q", true).err().unwrap();
        assert!(e.contains("open to other users"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A quota file of `bytes` in a fresh private directory, as a file of another build or a
    /// damaged one would be; returns the directory.
    fn crafted(name: &str, bytes: &[u8]) -> PathBuf {
        let d = dir(name);
        private_dir(&d).unwrap();
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(file_of(&d, "q")).unwrap();
        std::io::Write::write_all(&mut f, bytes).unwrap();
        d
    }

    #[test]
    fn a_file_of_another_layout_is_refused_by_name() {
        let mut bytes = vec![0u8; FILE_BYTES];
        bytes[..8].copy_from_slice(&MAGIC.to_le_bytes());
        bytes[8..12].copy_from_slice(&VERSION.to_le_bytes());
        bytes[12..16].copy_from_slice(&(SLOTS as u32).to_le_bytes());
        bytes[16..24].copy_from_slice(&(LAYOUT ^ 1).to_le_bytes());
        let d = crafted("layout", &bytes);
        let path = file_of(&d, "q");
        let e = Quota::open(&d, "q", true).err().unwrap();
        assert_eq!(
            e,
            format!(
                "{} was made by a different gpushim build (file version {VERSION}, layout {:#x}; this build reads version {VERSION}, layout {LAYOUT:#x}): remove it when no process uses it, or use another GPUSHIM_STATE_DIR or quota name",
                path.display(),
                LAYOUT ^ 1
            )
        );
        // a file of the first version (no fingerprint) too
        bytes[8..12].copy_from_slice(&1u32.to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        let e = Quota::open(&d, "q", true).err().unwrap();
        assert!(e.starts_with(&format!("{} was made by a different gpushim build (file version 1,", path.display())), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_truncated_or_foreign_file_is_refused_not_mapped() {
        let q = Quota::open(&dir("trunc-src"), "q", true).unwrap();
        let mut whole = std::fs::read(&q.path).unwrap();
        whole.truncate(FILE_BYTES / 2);
        let d = crafted("trunc", &whole);
        let e = Quota::open(&d, "q", true).err().unwrap();
        assert_eq!(
            e,
            format!(
                "{} is truncated ({} of {FILE_BYTES} bytes): remove it when no process uses it, or use another GPUSHIM_STATE_DIR or quota name",
                file_of(&d, "q").display(),
                FILE_BYTES / 2
            )
        );
        for (name, bytes) in [("empty", &b""[..]), ("short", &b"gpush"[..]), ("foreign", &b"not a quota file at all, just text"[..])] {
            let d = crafted(name, bytes);
            let e = Quota::open(&d, "q", true).err().unwrap();
            assert_eq!(
                e,
                format!(
                    "{} is not a gpushim quota file ({} bytes, no gpushim header): remove it when no process uses it, or use another GPUSHIM_STATE_DIR or quota name",
                    file_of(&d, "q").display(),
                    bytes.len()
                )
            );
            let _ = std::fs::remove_dir_all(&d);
        }
        let _ = std::fs::remove_dir_all(q.path.parent().unwrap());
    }

    /// A mutex whose word names a live process that will never let go (what garbage in the
    /// file can look like): the member gets an error naming the file after the bounded wait,
    /// and a reservation is refused (closed), instead of hanging.
    #[test]
    fn a_garbage_mutex_is_an_error_not_a_hang() {
        let d = dir("garbage");
        let q = Quota::open(&d, "q", true).unwrap();
        let dev = q.device("GPU-g", 100, 100).unwrap().unwrap();
        let mut other = std::process::Command::new("sleep").arg("1000").spawn().unwrap();
        // SAFETY: glibc's mutex starts with its lock word (the owner's tid); writing it is
        // what a corrupted file does.
        unsafe { std::ptr::addr_of!(q.h().mutex).cast::<AtomicU32>().as_ref().unwrap().store(other.id(), Relaxed) };
        let started = std::time::Instant::now();
        let e = q.lock().err().expect("the lock cannot be taken");
        assert_eq!(
            e,
            format!(
                "{}: the quota's lock was not free within {LOCK_TIMEOUT_S} s (corrupted, or held by a stuck process): remove the file when no process uses it, or use another GPUSHIM_STATE_DIR or quota name",
                file_of(&d, "q").display()
            )
        );
        assert_eq!(q.reserve(dev, 1, 100), Err(u64::MAX));
        assert!(started.elapsed() < std::time::Duration::from_secs(60), "not bounded: {:?}", started.elapsed());
        let _ = other.kill();
        let _ = other.wait();
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Another user's directory (or something else) where the state directory should be: the
    /// error names the way out.
    #[test]
    fn a_squatted_state_dir_names_the_setting() {
        let d = dir("squat");
        std::fs::create_dir_all(&d).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        // SAFETY: getuid cannot fail; chown is given a NUL-terminated path.
        let owner = if unsafe { libc::getuid() } == 0 { 65534 } else { 0 };
        let c = cpath(&d).unwrap();
        let chowned = unsafe { libc::chown(c.as_ptr(), owner, owner) } == 0;
        let squatted = if chowned { d.clone() } else { PathBuf::from("/") };
        let e = Quota::open(&squatted, "q", true).err().unwrap();
        assert_eq!(
            e,
            format!(
                "{} belongs to uid {owner}, not to this user (uid {}); set GPUSHIM_STATE_DIR to a directory of your own (mode 0700)",
                squatted.display(),
                unsafe { libc::getuid() }
            )
        );
        let file = dir("squat-file");
        std::fs::write(&file, b"").unwrap();
        let e = Quota::open(&file, "q", true).err().unwrap();
        assert_eq!(e, format!("{} is not a directory; set GPUSHIM_STATE_DIR to a directory of your own (mode 0700)", file.display()));
        let _ = std::fs::remove_file(&file);
        let _ = std::fs::remove_dir_all(&d);
    }
}
