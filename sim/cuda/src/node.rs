//! Node-wide shared device state (`GPUSIM_NODE_STATE=/path/file`, opt-in): every simulated
//! process started with the same path shares, per physical device, the memory in use, as the
//! processes on one real GPU do.
//!
//! The state is a small file of fixed size ([`FILE_SIZE`]) mapped `MAP_SHARED`:
//!
//! | offset | what |
//! |---|---|
//! | 0 | magic `gpusimND` (u64, little-endian), written last at creation |
//! | 8 | version (u32) = [`VERSION`] |
//! | 12 | device count (u32) |
//! | 16 | slot count (u32) = [`NSLOTS`] |
//! | 20 | `busy` (u32): 1 while the header lock's holder is updating (see below) |
//! | 64 + 32·d | device `d` (up to 16): `total`, `used`, `peak` (u64 each), 8 bytes reserved |
//! | 1024 + 256·i | slot `i` (256 of them): owner pid (u64), then per device the bytes that process has counted (16 × u64), rest reserved |
//! | 66 560 | the time region: per device recent busy time per process, updated lock-free (layout: `gpusim_common::busy`) |
//! | 66 560 + `busy::TIME_SIZE` | the arbitration region (version 3): per device the processes' queued kernels and the device's time slices, under the device's arbitration lock (layout: `crate::arbiter`) |
//!
//! Locks are Linux open-file-description locks (`F_OFD_SETLK[W]`, one byte each), so they
//! belong to one `open()` of the file and the kernel drops them when the process dies, however
//! it dies:
//! - the *header lock* (write lock on byte 0) serialises every change of the numbers, between
//!   processes (and, with a mutex, between the threads of a process, which share the
//!   descriptor);
//! - the *slot lock* (write lock on the slot's first byte) is held by the slot's owner for as
//!   long as it lives. A slot whose lock can be taken has a dead owner: its bytes are subtracted
//!   from the devices' `used` and the slot is cleared ("reclaimed"). That happens, under the
//!   header lock, when a process attaches, when an allocation would not fit, at every
//!   `cuMemGetInfo` and when the report is written.
//!
//! Every change of the numbers happens under the header lock, with `busy` set to 1 for the
//! duration. A process killed inside that window leaves `busy` at 1; the next holder then
//! recomputes each device's `used` as the sum of the slots (the slots are the authority), so a
//! kill at any instruction leaves the figures exact.
//!
//! Creation is race-free: the first process writes a complete file under a temporary name in
//! the same directory (`O_CREAT|O_EXCL`, mode 0600) and `link()`s it to the final name; a
//! process that loses the race (`EEXIST`) removes its temporary file and opens the winner's.
//! A file whose device count or totals differ from the process' configuration is re-initialised
//! if no live process uses it, else the node state stays off in that process (with a warning).

use std::ffi::{c_int, CString};
use std::io;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, Once};

use crate::types::*;
use gpusim_common::busy;

/// The variable naming the node state file.
pub const ENV: &str = "GPUSIM_NODE_STATE";
pub const MAGIC: u64 = u64::from_le_bytes(*b"gpusimND");
pub const VERSION: u32 = 4;
pub const MAX_DEVICES: usize = gpusim_common::config::MAX_DEVICES;
pub const NSLOTS: usize = 256;
const DEVS_OFF: usize = 64;
pub const SLOTS_OFF: usize = 1024;
pub const SLOT_SIZE: usize = 256;
pub const FILE_SIZE: usize = busy::TIME_OFF + busy::TIME_SIZE + crate::arbiter::SIZE;
const _: () = assert!(crate::arbiter::OFF == busy::TIME_OFF + busy::TIME_SIZE);
const _: () = assert!(SLOTS_OFF + NSLOTS * SLOT_SIZE == busy::TIME_OFF);
/// Byte locked for the header lock.
const HEADER_LOCK: u64 = 0;
const NO_SLOT: usize = usize::MAX;

#[repr(C)]
struct Header {
    magic: AtomicU64,
    version: AtomicU32,
    ndev: AtomicU32,
    nslots: AtomicU32,
    busy: AtomicU32,
    _reserved: [u64; 5],
    devs: [DevEntry; MAX_DEVICES],
}

#[repr(C)]
struct DevEntry {
    total: AtomicU64,
    used: AtomicU64,
    peak: AtomicU64,
    _reserved: u64,
}

#[repr(C)]
struct Slot {
    pid: AtomicU64,
    usage: [AtomicU64; MAX_DEVICES],
    /// How many times the slot was claimed (the arbitration region names an attachment by its
    /// slot and this generation: a slot claimed again is another attachment).
    generation: AtomicU64,
    _reserved: [u64; 14],
}

const _: () = assert!(std::mem::size_of::<Header>() == DEVS_OFF + 32 * MAX_DEVICES);
const _: () = assert!(std::mem::size_of::<Header>() <= SLOTS_OFF);
const _: () = assert!(std::mem::size_of::<Slot>() == SLOT_SIZE);

/// One attachment to a node state file: what a process holds (a test may hold several, each
/// behaving as a separate process). Dropping it closes the file, which releases its slot lock
/// exactly as the death of a process does: its counted bytes stay in the file until reclaimed.
pub struct Node {
    path: String,
    /// The open file description carrying the locks (not the one the mapping was made from).
    fd: c_int,
    base: *mut u8,
    /// This attachment's slot (`NO_SLOT` only while attaching).
    slot: usize,
    ndev: usize,
    /// Serialises the threads of this attachment around the header lock (an OFD lock does not
    /// exclude holders of the same open file description).
    mutex: Mutex<()>,
    /// `FORKS` when attached: a forked child re-attaches with its own descriptor and slot.
    forks: u64,
    /// Entry of `FDS` holding `fd` (closed in forked children), if there was room.
    registered: Option<usize>,
}

// SAFETY: the mapping is shared memory accessed only through atomics; the descriptor is
// immutable after attaching.
unsafe impl Send for Node {}
unsafe impl Sync for Node {}

impl Drop for Node {
    fn drop(&mut self) {
        // In a forked child a registered lock descriptor was closed at the fork (and its number
        // may be another file's now): leave it alone.
        let parent = self.forks == FORKS.load(Ordering::Acquire);
        // SAFETY: our own mapping, no longer used.
        unsafe { libc::munmap(self.base.cast(), FILE_SIZE) };
        if parent {
            close_lock_fd(self.fd, self.registered);
        } else if self.registered.is_none() {
            // SAFETY: our inherited copy, never closed.
            unsafe { libc::close(self.fd) };
        }
    }
}

/// The lock descriptors of the process' attachments (-1: free). A forked child closes its
/// copies at once (`forked_child`): an open file description shared with a child would keep the
/// parent's slot lock, hence its memory, alive after the parent's death for as long as the
/// child lives.
const MAX_FDS: usize = 256;
static FDS: [std::sync::atomic::AtomicI32; MAX_FDS] =
    [const { std::sync::atomic::AtomicI32::new(-1) }; MAX_FDS];

fn register_fd(fd: c_int) -> Option<usize> {
    FDS.iter().position(|f| {
        f.compare_exchange(-1, fd, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    })
}

fn os_err(what: &str) -> String {
    format!("{what}: {}", io::Error::last_os_error())
}

/// `fcntl(fd, cmd, {type, SEEK_SET, start, 1})`, retried on `EINTR`.
fn ofd(fd: c_int, cmd: c_int, typ: c_int, start: u64) -> io::Result<()> {
    // SAFETY: a zeroed `flock` is valid; OFD commands require l_pid = 0.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = typ as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start as libc::off_t;
    fl.l_len = 1;
    loop {
        // SAFETY: `fl` is a valid flock for the duration of the call.
        if unsafe { libc::fcntl(fd, cmd, &mut fl as *mut libc::flock) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// Takes the write lock on byte `start` without waiting: `Ok(false)` if another open file
/// description holds a conflicting lock.
fn try_lock(fd: c_int, start: u64) -> io::Result<bool> {
    match ofd(fd, libc::F_OFD_SETLK, libc::F_WRLCK, start) {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether another open file description holds a lock on byte `start` (`F_OFD_GETLK`); an
/// error counts as held.
fn held_elsewhere(fd: c_int, start: u64) -> bool {
    // SAFETY: a zeroed `flock` is valid; OFD commands require l_pid = 0.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start as libc::off_t;
    fl.l_len = 1;
    // SAFETY: `fl` is a valid flock for the duration of the call.
    let r = unsafe { libc::fcntl(fd, libc::F_OFD_GETLK, &mut fl as *mut libc::flock) };
    r != 0 || fl.l_type != libc::F_UNLCK as libc::c_short
}

fn unlock(fd: c_int, start: u64) {
    let _ = ofd(fd, libc::F_OFD_SETLK, libc::F_UNLCK, start);
}

fn slot_lock_byte(i: usize) -> u64 {
    (SLOTS_OFF + i * SLOT_SIZE) as u64
}

fn open_cloexec(path: &CString, flags: c_int, mode: libc::mode_t) -> c_int {
    // SAFETY: a valid NUL-terminated path.
    unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) }
}

/// Writes a complete, fresh state for `totals` into the mapping at `base`.
///
/// # Safety
/// `base` maps `FILE_SIZE` bytes of a file nobody else can see yet.
unsafe fn initialise(base: *mut u8, totals: &[u64]) {
    let h = unsafe { &*(base as *const Header) };
    h.version.store(VERSION, Ordering::Relaxed);
    h.ndev.store(totals.len() as u32, Ordering::Relaxed);
    h.nslots.store(NSLOTS as u32, Ordering::Relaxed);
    h.busy.store(0, Ordering::Relaxed);
    for (d, e) in h.devs.iter().enumerate() {
        e.total
            .store(totals.get(d).copied().unwrap_or(0), Ordering::Relaxed);
        e.used.store(0, Ordering::Relaxed);
        e.peak.store(0, Ordering::Relaxed);
    }
    h.magic.store(MAGIC, Ordering::Release);
}

/// Opens `path`, creating and initialising it (temporary file + `link`) if it does not exist.
/// Whether `fd` is a regular file owned by this (effective) user and writable by no one else.
fn own_private_file(fd: c_int) -> Result<(), String> {
    // SAFETY: a zeroed stat is valid; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(os_err("fstat"));
    }
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err("not a regular file".to_string());
    }
    if st.st_uid != me || st.st_mode & 0o022 != 0 {
        return Err(format!(
            "owned by uid {} (not {me}) or writable by others (mode {:o}): not used",
            st.st_uid,
            st.st_mode & 0o7777
        ));
    }
    Ok(())
}

fn open_or_create(path: &str, totals: &[u64]) -> Result<c_int, String> {
    let cpath = CString::new(path).map_err(|_| "the path contains a NUL byte".to_string())?;
    for _ in 0..100 {
        // (not through a link; only a file of this user's that no one else can write: whoever
        // could change it would steer every process sharing the node)
        let fd = open_cloexec(&cpath, libc::O_RDWR | libc::O_NOFOLLOW, 0);
        if fd >= 0 {
            return match own_private_file(fd) {
                Ok(()) => Ok(fd),
                Err(e) => {
                    // SAFETY: our descriptor, closed once.
                    unsafe { libc::close(fd) };
                    Err(e)
                }
            };
        }
        if io::Error::last_os_error().raw_os_error() != Some(libc::ENOENT) {
            return Err(os_err("open"));
        }
        // Create it complete under a temporary name, then publish it with link(2).
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let tmp = format!(
            "{path}.{}.{}.tmp",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let ctmp = CString::new(tmp).expect("no NUL in the path");
        let fd = open_cloexec(&ctmp, libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW, 0o600);
        if fd < 0 {
            return Err(os_err("create a temporary file"));
        }
        let ready = (|| {
            // SAFETY: our fresh descriptor; the mapping covers the whole (truncated) file.
            unsafe {
                if libc::ftruncate(fd, FILE_SIZE as libc::off_t) != 0 {
                    return Err(os_err("ftruncate"));
                }
                let base = map(fd)?;
                initialise(base, totals);
                libc::munmap(base.cast(), FILE_SIZE);
            }
            // SAFETY: valid paths.
            if unsafe { libc::link(ctmp.as_ptr(), cpath.as_ptr()) } == 0 {
                Ok(true)
            } else if io::Error::last_os_error().raw_os_error() == Some(libc::EEXIST) {
                Ok(false)
            } else {
                Err(os_err("link"))
            }
        })();
        // SAFETY: valid path; our temporary name is never needed after the link.
        unsafe { libc::unlink(ctmp.as_ptr()) };
        match ready {
            Ok(true) => return Ok(fd),
            // Another process won the race: open its file.
            Ok(false) => unsafe {
                libc::close(fd);
            },
            Err(e) => {
                unsafe { libc::close(fd) };
                return Err(e);
            }
        }
    }
    Err("the file keeps disappearing".to_string())
}

/// Maps `FILE_SIZE` bytes of `fd` read-write, shared.
fn map(fd: c_int) -> Result<*mut u8, String> {
    // SAFETY: a fresh shared mapping of our descriptor.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            FILE_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(os_err("mmap"));
    }
    Ok(p.cast())
}

/// Opens (or creates) `path` and maps it; returns the mapping and a *second* open file
/// description of the same file, never mapped, that carries this attachment's locks. (A mapping
/// holds a reference to the open file description it was made from, and an OFD lock lives as
/// long as its open file description: locks on the mapped one would survive in every forked
/// child that inherited the mapping.)
fn open_map_and_reopen(
    path: &str,
    totals: &[u64],
) -> Result<(*mut u8, c_int, Option<usize>), String> {
    let fd = open_or_create(path, totals)?;
    let close = |fd: c_int| unsafe {
        libc::close(fd);
    };
    // SAFETY: a zeroed stat is valid; fd is ours.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        let e = os_err("fstat");
        close(fd);
        return Err(e);
    }
    if (st.st_size as u64) < FILE_SIZE as u64 {
        close(fd);
        return Err(format!(
            "not a node state file ({} bytes, {FILE_SIZE} expected)",
            st.st_size
        ));
    }
    let base = match map(fd) {
        Ok(b) => b,
        Err(e) => {
            close(fd);
            return Err(e);
        }
    };
    // Between this open and the registration a fork must not happen (the child would keep an
    // unregistered copy): `no_fork` holds forks back meanwhile.
    let gate = no_fork();
    let proc_path = CString::new(format!("/proc/self/fd/{fd}")).expect("no NUL");
    let mut lock_fd = open_cloexec(&proc_path, libc::O_RDWR, 0);
    if lock_fd < 0 {
        lock_fd = open_cloexec(&CString::new(path).expect("checked"), libc::O_RDWR | libc::O_NOFOLLOW, 0);
    }
    let registered = if lock_fd >= 0 {
        register_fd(lock_fd)
    } else {
        None
    };
    drop(gate);
    close(fd);
    let fail = |e: String| {
        // SAFETY: our mapping.
        unsafe { libc::munmap(base.cast(), FILE_SIZE) };
        Err(e)
    };
    if lock_fd < 0 {
        return fail(os_err("open"));
    }
    // SAFETY: as above.
    let mut st2: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(lock_fd, &mut st2) } != 0
        || (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino)
    {
        close_lock_fd(lock_fd, registered);
        return fail("the file was replaced while opening it".to_string());
    }
    Ok((base, lock_fd, registered))
}

/// Unregisters and closes a lock descriptor (in the process that opened it), with no fork in
/// between.
fn close_lock_fd(fd: c_int, registered: Option<usize>) {
    let _gate = no_fork();
    if let Some(i) = registered {
        FDS[i].store(-1, Ordering::Release);
    }
    // SAFETY: our descriptor.
    unsafe { libc::close(fd) };
}

/// The header lock held: numbers may be changed. Dropping it releases the lock.
/// A device's arbitration lock, held.
pub struct ArbLocked<'a> {
    word: &'a AtomicU64,
    me: u64,
}

impl Drop for ArbLocked<'_> {
    fn drop(&mut self) {
        let _ = self.word.compare_exchange(self.me, 0, Ordering::Release, Ordering::Relaxed);
    }
}

struct Locked<'a> {
    node: &'a Node,
    _threads: MutexGuard<'a, ()>,
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        self.node.header().busy.store(0, Ordering::Release);
        unlock(self.node.fd, HEADER_LOCK);
    }
}

impl Node {
    /// Attaches to (creating if needed) the node state at `path` for devices of the given
    /// totals and claims a slot. Dead processes' slots are reclaimed first.
    pub fn attach(path: &str, totals: &[u64]) -> Result<Node, String> {
        if totals.is_empty() || totals.len() > MAX_DEVICES {
            return Err(format!(
                "{} devices (1..={MAX_DEVICES} supported)",
                totals.len()
            ));
        }
        watch_forks();
        let (base, fd, registered) = open_map_and_reopen(path, totals)?;
        if registered.is_none() {
            // (it works, but a forked child keeps this descriptor, hence our slot, alive)
            crate::ffi::trace_line(&format!(
                "{}: {ENV}={path}: more than {MAX_FDS} attachments in this process\n",
                crate::config::PREFIX
            ));
        }
        let mut node = Node {
            path: path.to_string(),
            fd,
            base,
            slot: NO_SLOT,
            ndev: totals.len(),
            mutex: Mutex::new(()),
            forks: FORKS.load(Ordering::Acquire),
            registered,
        };
        let h = node.header();
        if h.magic.load(Ordering::Acquire) != MAGIC
            || h.version.load(Ordering::Relaxed) != VERSION
            || h.nslots.load(Ordering::Relaxed) as usize != NSLOTS
        {
            return Err(format!(
                "not a node state file of version {VERSION} (bad magic, version or slot count)"
            ));
        }
        let slot = {
            let g = node.lock();
            node.reclaim(&g);
            let matches = h.ndev.load(Ordering::Relaxed) as usize == totals.len()
                && totals
                    .iter()
                    .zip(&h.devs)
                    .all(|(&t, e)| e.total.load(Ordering::Relaxed) == t);
            if !matches {
                if node.live_slots() > 0 {
                    return Err(format!(
                        "the file describes other devices ({}) than this process ({}) and is in use",
                        node.describe(),
                        totals.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(",")
                    ));
                }
                // Nobody uses it: start afresh with this configuration.
                h.ndev.store(totals.len() as u32, Ordering::Relaxed);
                for (d, e) in h.devs.iter().enumerate() {
                    e.total
                        .store(totals.get(d).copied().unwrap_or(0), Ordering::Relaxed);
                    e.used.store(0, Ordering::Relaxed);
                    e.peak.store(0, Ordering::Relaxed);
                }
            }
            let mut claimed = NO_SLOT;
            for i in 0..NSLOTS {
                let s = node.slot_at(i);
                if s.pid.load(Ordering::Acquire) != 0 {
                    continue; // a live owner (the dead ones were just reclaimed)
                }
                if try_lock(fd, slot_lock_byte(i)).unwrap_or(false) {
                    for u in &s.usage {
                        u.store(0, Ordering::Relaxed);
                    }
                    s.generation.fetch_add(1, Ordering::AcqRel);
                    s.pid.store(std::process::id() as u64, Ordering::Release);
                    claimed = i;
                    break;
                }
            }
            drop(g);
            claimed
        };
        if slot == NO_SLOT {
            return Err(format!("all {NSLOTS} slots are held by live processes"));
        }
        node.slot = slot;
        Ok(node)
    }

    /// The slot this attachment holds.
    #[cfg(test)]
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// Word `i` (8 bytes) of physical device `d`'s block of the time region
    /// (`gpusim_common::busy`), updated with atomics only, by every process.
    pub fn time_word(&self, d: usize, i: usize) -> Option<&AtomicU64> {
        (d < self.ndev && i < busy::DEV_SIZE / 8).then(|| {
            // SAFETY: the block lies within the mapping (FILE_SIZE covers the time region),
            // 8-aligned; shared memory accessed through atomics only.
            unsafe { &*(self.base.add(busy::dev_off(d) + 8 * i) as *const AtomicU64) }
        })
    }

    /// Word `i` of physical device `d`'s block of the arbitration region (`crate::arbiter`),
    /// read and written under [`Node::arb_lock`].
    pub fn arb_word(&self, d: usize, i: usize) -> Option<&AtomicU64> {
        (d < self.ndev && d < busy::MAX_DEVICES && i < crate::arbiter::DEV_SIZE / 8).then(|| {
            // SAFETY: the block lies within the mapping (FILE_SIZE covers the region), 8-aligned;
            // shared memory accessed through atomics only.
            unsafe { &*(self.base.add(crate::arbiter::OFF + crate::arbiter::DEV_SIZE * d + 8 * i) as *const AtomicU64) }
        })
    }

    /// This attachment's identity in the arbitration region (32 bits, never 0): its slot + 1
    /// (9 bits) and the slot's generation when it was claimed (23 bits).
    pub fn arb_id(&self) -> u64 {
        let generation = self.slot_at(self.slot).generation.load(Ordering::Acquire) & 0x7f_ffff;
        generation << 9 | (self.slot as u64 + 1)
    }

    /// Whether the attachment `id` (an `arb_id`) still lives: its slot's lock is held (the
    /// kernel drops it when its process exits, zombie or not, whatever its pid namespace) and,
    /// when `pid` is given, the slot is still that process'.
    pub fn arb_alive(&self, id: u64, pid: Option<u64>) -> bool {
        let Some(i) = ((id & 0x1ff) as usize).checked_sub(1).filter(|&i| i < NSLOTS) else { return false };
        if self.slot_at(i).generation.load(Ordering::Acquire) & 0x7f_ffff != id >> 9 {
            return false; // the slot was claimed again since: that attachment is gone
        }
        if i == self.slot {
            return true;
        }
        if pid.is_some_and(|pid| self.slot_at(i).pid.load(Ordering::Acquire) != pid) {
            return false;
        }
        held_elsewhere(self.fd, slot_lock_byte(i))
    }

    /// Device `d`'s arbitration lock: word `lock` of its arbitration block holds the holder
    /// (`arb_id` << 32 | thread id), taken by compare-and-swap. A waiter spins, then yields,
    /// then sleeps 50 µs at a time; a holder whose attachment is gone is replaced (its work
    /// was a few writes of a schedule that the next holder goes on computing from the same
    /// record). `None` for a device without an arbitration block, or after 10 s of waiting for
    /// a live holder (the call then runs on its last known clock).
    pub fn arb_lock(&self, d: usize, lock: usize) -> Option<ArbLocked<'_>> {
        let word = self.arb_word(d, lock)?;
        // SAFETY: gettid has no preconditions.
        thread_local!(static TID: u64 = unsafe { libc::gettid() } as u64 & 0xffff_ffff);
        let me = self.arb_id() << 32 | TID.with(|t| *t);
        let mut spins = 0u64;
        let mut since = 0u64;
        loop {
            let cur = word.load(Ordering::Relaxed);
            if cur == 0 && word.compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                return Some(ArbLocked { word, me });
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
                continue;
            }
            if spins < 4096 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
            if spins % 64 == 0 {
                if cur != 0 && !self.arb_alive(cur >> 32, None) && word.compare_exchange(cur, me, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                    return Some(ArbLocked { word, me });
                }
                let n = crate::timeline::now();
                if since == 0 {
                    since = n;
                } else if n.saturating_sub(since) > 10_000_000_000 {
                    return None;
                }
            }
        }
    }

    fn header(&self) -> &Header {
        // SAFETY: `base` maps FILE_SIZE bytes, the header is at offset 0, page-aligned.
        unsafe { &*(self.base as *const Header) }
    }

    fn slot_at(&self, i: usize) -> &Slot {
        debug_assert!(i < NSLOTS);
        // SAFETY: slot i lies within the mapping, 8-aligned.
        unsafe { &*(self.base.add(SLOTS_OFF + i * SLOT_SIZE) as *const Slot) }
    }

    fn dev(&self, d: usize) -> Option<&DevEntry> {
        (d < self.ndev).then(|| &self.header().devs[d])
    }

    fn describe(&self) -> String {
        let h = self.header();
        let n = (h.ndev.load(Ordering::Relaxed) as usize).min(MAX_DEVICES);
        h.devs[..n]
            .iter()
            .map(|e| e.total.load(Ordering::Relaxed).to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    fn live_slots(&self) -> usize {
        (0..NSLOTS)
            .filter(|&i| self.slot_at(i).pid.load(Ordering::Acquire) != 0)
            .count()
    }

    /// Takes the header lock (waiting). If the previous holder died while changing numbers,
    /// each device's `used` is recomputed from the slots.
    fn lock(&self) -> Locked<'_> {
        let threads = self.mutex.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = ofd(self.fd, libc::F_OFD_SETLKW, libc::F_WRLCK, HEADER_LOCK) {
            // Going on unlocked would make the figures wrong: fail the call instead.
            panic!("gpusim: {ENV}={}: cannot lock: {e}", self.path);
        }
        let g = Locked {
            node: self,
            _threads: threads,
        };
        if self.header().busy.swap(1, Ordering::AcqRel) != 0 {
            self.repair(&g);
        }
        g
    }

    /// `used` of every device := the sum of the slots (the previous lock holder died midway).
    fn repair(&self, _g: &Locked) {
        for (d, e) in self.header().devs.iter().enumerate() {
            let sum: u64 = (0..NSLOTS)
                .map(|i| self.slot_at(i).usage[d].load(Ordering::Acquire))
                .fold(0u64, |a, b| a.saturating_add(b));
            e.used.store(sum, Ordering::Release);
            e.peak.fetch_max(sum, Ordering::AcqRel);
        }
    }

    /// Subtracts the bytes of every slot whose owner is dead (its slot lock can be taken) and
    /// clears those slots; returns how many bytes came back.
    fn reclaim(&self, _g: &Locked) -> u64 {
        let h = self.header();
        let mut back = 0u64;
        for i in 0..NSLOTS {
            if i == self.slot {
                continue; // our own lock: always "takeable" by us
            }
            let s = self.slot_at(i);
            if s.pid.load(Ordering::Acquire) == 0
                && s.usage.iter().all(|u| u.load(Ordering::Relaxed) == 0)
            {
                continue;
            }
            if !try_lock(self.fd, slot_lock_byte(i)).unwrap_or(false) {
                continue; // alive
            }
            for (d, u) in s.usage.iter().enumerate() {
                let n = u.load(Ordering::Acquire);
                if n > 0 {
                    let e = &h.devs[d];
                    e.used.store(
                        e.used.load(Ordering::Acquire).saturating_sub(n),
                        Ordering::Release,
                    );
                    u.store(0, Ordering::Release);
                    back += n;
                }
            }
            s.pid.store(0, Ordering::Release);
            unlock(self.fd, slot_lock_byte(i));
        }
        back
    }

    /// Counts `size` bytes on device `d` for this attachment if the node has room (reclaiming
    /// dead processes' memory first if it has not); `local` is called, still under the lock,
    /// once the node check passed, and its error cancels the count. The node full is
    /// `CUDA_ERROR_OUT_OF_MEMORY` and changes nothing.
    pub fn reserve(&self, d: usize, size: u64, local: impl FnOnce() -> Res) -> Res {
        let e = self.dev(d).ok_or(CUDA_ERROR_INVALID_DEVICE)?;
        let g = self.lock();
        let total = e.total.load(Ordering::Relaxed);
        let fits = || {
            e.used
                .load(Ordering::Acquire)
                .checked_add(size)
                .is_some_and(|n| n <= total)
        };
        if !fits() {
            self.reclaim(&g);
            if !fits() {
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
        }
        local()?;
        let mine = &self.slot_at(self.slot).usage[d];
        mine.store(
            mine.load(Ordering::Acquire).saturating_add(size),
            Ordering::Release,
        );
        let new = e.used.load(Ordering::Acquire) + size;
        e.used.store(new, Ordering::Release);
        e.peak.fetch_max(new, Ordering::AcqRel);
        drop(g);
        Ok(())
    }

    /// Gives back `size` bytes counted by this attachment on device `d` (never more than it
    /// counted: memory a forked child inherited stays its parent's).
    pub fn release(&self, d: usize, size: u64) {
        let Some(e) = self.dev(d) else { return };
        let g = self.lock();
        let mine = &self.slot_at(self.slot).usage[d];
        let n = size.min(mine.load(Ordering::Acquire));
        mine.store(mine.load(Ordering::Acquire) - n, Ordering::Release);
        e.used.store(
            e.used.load(Ordering::Acquire).saturating_sub(n),
            Ordering::Release,
        );
        drop(g);
    }

    /// Reclaims dead processes' memory, then returns `(used, peak, total)` of every device.
    pub fn snapshot(&self) -> Vec<(u64, u64, u64)> {
        let g = self.lock();
        self.reclaim(&g);
        let v = self.header().devs[..self.ndev]
            .iter()
            .map(|e| {
                (
                    e.used.load(Ordering::Acquire),
                    e.peak.load(Ordering::Acquire),
                    e.total.load(Ordering::Relaxed),
                )
            })
            .collect();
        drop(g);
        v
    }

    /// Bytes this attachment has counted on device `d`.
    #[cfg(test)]
    pub fn mine(&self, d: usize) -> u64 {
        if d >= self.ndev {
            return 0;
        }
        self.slot_at(self.slot).usage[d].load(Ordering::Acquire)
    }
}

// ---- the process' attachment -------------------------------------------------------------------

/// The process' attachment (null: node state off).
static ACTIVE: AtomicPtr<Node> = AtomicPtr::new(std::ptr::null_mut());
static STARTED: Once = Once::new();
/// Incremented in every forked child (`pthread_atfork`): an attachment made before the fork
/// belongs to the parent (same open file description, same slot).
static FORKS: AtomicU64 = AtomicU64::new(0);
static REATTACH: Mutex<()> = Mutex::new(());

/// `pthread_atfork` child handler (async-signal-safe: atomics and `close`).
extern "C" fn forked_child() {
    GATE.store(0, Ordering::Release);
    FORKS.fetch_add(1, Ordering::AcqRel);
    for f in &FDS {
        let fd = f.swap(-1, Ordering::AcqRel);
        if fd >= 0 {
            // SAFETY: the child's copy of an attachment's descriptor.
            unsafe { libc::close(fd) };
        }
    }
}

/// Forks held back (`FORKING`) / threads between opening and registering (or unregistering
/// and closing) a lock descriptor (the count below it).
static GATE: AtomicU64 = AtomicU64::new(0);
const FORKING: u64 = 1 << 63;

/// Holds forks back while alive (see `GATE`).
struct NoFork;

fn no_fork() -> NoFork {
    loop {
        let g = GATE.load(Ordering::Acquire);
        if g & FORKING == 0
            && GATE
                .compare_exchange_weak(g, g + 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            return NoFork;
        }
        std::thread::yield_now();
    }
}

impl Drop for NoFork {
    fn drop(&mut self) {
        GATE.fetch_sub(1, Ordering::AcqRel);
    }
}

/// `pthread_atfork` prepare handler: waits for the threads between an open and its
/// registration (a few system calls), holding new ones back.
extern "C" fn before_fork() {
    while GATE
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |g| {
            (g & FORKING == 0).then_some(g | FORKING)
        })
        .is_err()
    {
        std::thread::yield_now(); // another thread is forking
    }
    while GATE.load(Ordering::Acquire) != FORKING {
        std::thread::yield_now();
    }
}

extern "C" fn after_fork_parent() {
    GATE.fetch_and(!FORKING, Ordering::AcqRel);
}

/// This process' pid, without a system call each time (refreshed in a child forked by
/// `fork()`, whose handler counts `FORKS`).
pub fn my_pid() -> u64 {
    static CACHE: AtomicU64 = AtomicU64::new(0);
    let tag = (FORKS.load(Ordering::Acquire).wrapping_add(1)) & 0xffff_ffff;
    let c = CACHE.load(Ordering::Relaxed);
    if c >> 32 == tag {
        return c & 0xffff_ffff;
    }
    let pid = std::process::id() as u64;
    CACHE.store(tag << 32 | pid, Ordering::Relaxed);
    pid
}

fn watch_forks() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers handlers that only use atomics, `sched_yield` and `close`.
        unsafe {
            libc::pthread_atfork(
                Some(before_fork),
                Some(after_fork_parent),
                Some(forked_child),
            )
        };
    });
}

fn warn(path: &str, msg: &str) {
    crate::ffi::trace_line(&format!(
        "{}: {ENV}={path}: {msg}; node-wide accounting is off in this process\n",
        crate::config::PREFIX
    ));
}

fn totals() -> Vec<u64> {
    crate::devices::physical().iter().map(|p| p.total).collect()
}

fn start_from_env() {
    let Some(path) = std::env::var(ENV).ok().filter(|p| !p.is_empty()) else {
        return;
    };
    watch_forks();
    match Node::attach(&path, &totals()) {
        Ok(n) => ACTIVE.store(Box::into_raw(Box::new(n)), Ordering::Release),
        Err(e) => warn(&path, &e),
    }
}

/// The process' node state, attached at the first call (`cuInit`, the first counted allocation
/// or the exit report) if `GPUSIM_NODE_STATE` is set; `None` when off. In a forked child the
/// first call attaches anew (its own descriptor and slot).
pub fn active() -> Option<&'static Node> {
    STARTED.call_once(start_from_env);
    let p = ACTIVE.load(Ordering::Acquire);
    if p.is_null() {
        return None;
    }
    // SAFETY: attachments are leaked boxes, never freed while installed.
    let n = unsafe { &*p };
    if n.forks == FORKS.load(Ordering::Acquire) {
        return Some(n);
    }
    reattach()
}

#[cold]
fn reattach() -> Option<&'static Node> {
    let _g = REATTACH.lock().unwrap_or_else(|e| e.into_inner());
    let p = ACTIVE.load(Ordering::Acquire);
    if p.is_null() {
        return None;
    }
    // SAFETY: as in `active`.
    let old = unsafe { &*p };
    if old.forks == FORKS.load(Ordering::Acquire) {
        return Some(old);
    }
    // The parent's descriptor would keep the parent's slot "alive" after its death: our copy
    // was closed at the fork (`forked_child`) unless it could not be registered. The old
    // attachment is never used again (leaked).
    if old.registered.is_none() {
        // SAFETY: our inherited copy of the descriptor.
        unsafe { libc::close(old.fd) };
    }
    let path = old.path.clone();
    match Node::attach(&path, &totals()) {
        Ok(n) => {
            let n: &'static Node = Box::leak(Box::new(n));
            ACTIVE.store(n as *const Node as *mut Node, Ordering::Release);
            Some(n)
        }
        Err(e) => {
            ACTIVE.store(std::ptr::null_mut(), Ordering::Release);
            warn(&path, &e);
            None
        }
    }
}

/// Installs `n` as the process' attachment (tests only; under `DRIVER_TESTS`) and drops the
/// previous one.
#[cfg(test)]
pub fn install_for_test(n: Option<Node>) {
    STARTED.call_once(start_from_env);
    watch_forks();
    let p = n.map_or(std::ptr::null_mut(), |n| Box::into_raw(Box::new(n)));
    let old = ACTIVE.swap(p, Ordering::AcqRel);
    crate::arbiter::forget();
    if !old.is_null() {
        // SAFETY: installed by us; no driver call is running (DRIVER_TESTS is held).
        drop(unsafe { Box::from_raw(old) });
    }
}

#[cfg(test)]
#[path = "node_tests.rs"]
pub(crate) mod tests;
