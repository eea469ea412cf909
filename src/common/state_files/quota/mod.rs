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
//! # Waiting for room
//!
//! With `GPUSHIM_OOM_WAIT`, a reservation the quota refuses while the member is under its own
//! limit waits for another member to free ([`crate::oom_wait`] for the loop, `queue` for the
//! quota's side): the header holds a queue of waiting threads (ticket, slot, device; FIFO by
//! ticket) and a futex word bumped at every release, departure and reclaimed member.
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
const VERSION: u32 = 4;
/// Threads of all members waiting for room at once (`GPUSHIM_OOM_WAIT`); a refused
/// reservation finding the queue full does not wait.
pub const WAITERS: usize = 64;
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
        WAITERS as u64,
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
    /// In a quota file: the group's compute clock on the device (`compute::duty`: the time, on
    /// the machine's monotonic clock, at which the members' measured work is paid for). In the
    /// registry, which has no group clock: the GPU's turn among the user's paced processes
    /// (`compute::turns`; one word, so that files of earlier builds keep their layout).
    compute_clock: AtomicU64,
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

/// A thread waiting for room (`queue`): all zero when free.
#[repr(C)]
struct Waiter {
    /// Its place in the order of arrival (from 1; 0: a free entry).
    ticket: AtomicU64,
    /// The member's slot.
    slot: AtomicU32,
    /// The quota's device it waits on.
    dev: AtomicU32,
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
    /// The last ticket handed to a waiter (`queue`).
    tickets: AtomicU64,
    /// Entries of `waiter` in use: releases wake sleepers only when there are some.
    waiting: AtomicU32,
    /// The futex word waiters sleep on: bumped (and its sleepers woken) when room may have
    /// appeared or the queue changed.
    wake: AtomicU32,
    waiter: [Waiter; WAITERS],
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

/// Called with this member's new usage on device `d` each time its reservation there changes
/// (under the quota's lock, so calls come in order; it must not block): set once by the shim to
/// mirror usage into HAMi-core's shared region (`sharing::hami`). Unset: nothing is called.
pub static ON_USAGE: crate::platform::once::ForkOnce<fn(&Quota, usize, u64)> = crate::platform::once::ForkOnce::new();

fn report_usage(q: &Quota, d: usize, usage: u64) {
    if let Some(f) = ON_USAGE.get() {
        f(q, d, usage);
    }
}

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
        self.drop_waiters_of(i);
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
            let busy = s.used.load(Relaxed) != 0 || s.usage.iter().any(|u| u.load(Relaxed) != 0) || self.has_waiter(i);
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
        let waiting = h.waiter.iter().filter(|w| w.ticket.load(Relaxed) != 0).count();
        h.waiting.store(waiting as u32, Relaxed);
    }

    /// The index of the device `uuid` (`size` its physical bytes), adding it if new, and
    /// records this member's `limit` on it. `None` when the table is full.
    pub fn device(&self, uuid: &str, size: u64, limit: u64) -> Result<Option<usize>, String> {
        let _g = self.lock()?;
        let found = self.entry_of(uuid, size);
        if let (Some(d), Some(i)) = (found, self.slot()) {
            self.h().slot[i].limit[d].store(limit, Relaxed);
        }
        Ok(found)
    }

    /// In the registry: the GPU `uuid`'s turn word (`size` its bytes), adding the GPU if new;
    /// `None` when the table is full.
    pub fn turn(&self, uuid: &str, size: u64) -> Result<Option<&AtomicU64>, String> {
        // (a GPU already in the table is found without the mutex)
        if let Some(d) = self.find(uuid) {
            return Ok(Some(&self.h().devices[d].compute_clock));
        }
        let _g = self.lock()?;
        Ok(self.entry_of(uuid, size).map(|d| &self.h().devices[d].compute_clock))
    }

    /// The index of the device `uuid`, added if new (under the mutex).
    fn entry_of(&self, uuid: &str, size: u64) -> Option<usize> {
        let key = uuid_key(uuid);
        let h = self.h();
        h.devices.iter().position(|d| uuid_of_atomic(&d.uuid) == key).or_else(|| {
            let free = h.devices.iter().position(|d| d.uuid.iter().all(|w| w.load(Relaxed) == 0))?;
            // The size first, the UUID after it with Release: [`Quota::find`] and
            // [`Quota::snapshot`] read the table without the mutex (Acquire), and a device seen
            // by its UUID comes with its size on weakly ordered CPUs (aarch64) too.
            h.devices[free].size.store(size, Relaxed);
            for (w, chunk) in h.devices[free].uuid.iter().zip(key.chunks(8)) {
                w.store(u64::from_le_bytes(chunk.try_into().expect("8 bytes")), Release);
            }
            Some(free)
        })
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
        if !fits(dev.reserved.load(Relaxed)) {
            let reaped = self.reap(me);
            if reaped > 0 {
                self.bump();
            }
            if reaped == 0 || !fits(dev.reserved.load(Relaxed)) {
                return Err(dev.reserved.load(Relaxed));
            }
        }
        let now = dev.reserved.load(Relaxed) + bytes;
        dev.reserved.store(now, Relaxed);
        dev.peak.fetch_max(now, Relaxed);
        let usage = h.slot[i].usage[d].fetch_add(bytes, Relaxed).saturating_add(bytes);
        report_usage(self, d, usage);
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
        report_usage(self, d, mine.load(Relaxed));
        drop(_g);
        self.wake_waiters();
    }

    /// What all members hold on device `d` now, after clearing dead members' usage.
    pub fn reserved(&self, d: usize) -> u64 {
        if let Ok(_g) = self.lock() {
            if self.reap(whoami()) > 0 {
                self.bump();
            }
        }
        self.h().devices[d].reserved.load(Relaxed)
    }

    /// The group's compute clock on device `d` (see `Device::compute_clock`), lock-free.
    pub fn compute_clock(&self, d: usize) -> Option<&AtomicU64> {
        self.h().devices.get(d).map(|dev| &dev.compute_clock)
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
        self.wake_waiters();
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
            .take_while(|d| d.uuid[0].load(Acquire) != 0)
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
        chunk.copy_from_slice(&w.load(Acquire).to_le_bytes());
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

mod files;
mod queue;
#[cfg(test)]
mod tests;

pub use files::*;
