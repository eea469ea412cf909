//! HAMi-core's shared region file (`CUDA_DEVICE_MEMORY_SHARED_CACHE`): its layout, opening it
//! safely, this process' slot in it, and reading it (`gpushim hami show`).
//!
//! # The file
//!
//! The file is HAMi-core's `shared_region_t` (HAMi-core commit 8f3a89c,
//! `src/multiprocess/multiprocess_memory_limit.h`, version 1.2): [`Region`] is that struct field
//! for field, `#[repr(C)]`, with its size (2,008,952 bytes) and every offset asserted at compile
//! time (and checked against the C header by `tests/hami.rs` where the header is available).
//! HAMi-core makes the file `SIZE + 1` bytes long; so does this module.
//!
//! # What the shim keeps in it, and what it does not
//!
//! The shim does not enforce the budget with the region's numbers: processes sharing one region
//! file are members of one shared quota (`quota`), keyed by the file's identity (device and
//! inode), which is exact under any interleaving and hands a killed member's memory on. The
//! region is kept current as a mirror, so that HAMi's vGPU monitor and `shrreg-tool` read it
//! unchanged: the file's header (magic, version, limits, SM limits, device UUIDs and count,
//! `utilization_switch`, `recent_kernel`, `priority`) as HAMi-core initialises it, and one slot
//! per live process (pid, status 1, each device's `total` and `data_size` = the bytes the
//! process holds there, under the slot's seqlock). Slots are added and removed under the
//! region's semaphore (`sem`, with HAMi-core's owner protocol, waited for with a bound); usage is
//! written lock-free to the own slot, as HAMi-core does. A slot whose process is dead (or whose
//! pid is 0, HAMi-core's mark of an exited process) is removed by the next process that joins or
//! leaves. A `libvgpu.so` process on the same file counts the shim's processes (it adds up every
//! slot); the shim's processes do not count its usage (it is in no quota).
//!
//! # Who may use it
//!
//! `/tmp` is shared: the file is opened with `O_NOFOLLOW`, must be a regular file owned by the
//! user or by root (HAMi's containers run as root and the file may come from the host) and at
//! least HAMi-core's size with its magic and version (or empty: then it is initialised here,
//! under the same `lockf` lock HAMi-core takes). Its blocks are allocated before it is mapped
//! (a fault must never become a `SIGBUS`). Anything else is refused with one message. A new file
//! is made with mode 0644 (HAMi-core: 0666), so other users can read it but not rewrite the
//! limits it carries.
//!
//! This module uses only `libc`: the `gpushim` command compiles it too.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};

/// HAMi-core's `MULTIPROCESS_SHARED_REGION_MAGIC_FLAG`.
pub const MAGIC: i32 = 19_920_718;
pub const MAJOR: u32 = 1;
pub const MINOR: u32 = 2;
/// `CUDA_DEVICE_MAX_COUNT`.
pub const DEVICES: usize = 16;
/// `SHARED_REGION_MAX_PROCESS_NUM`.
pub const SLOTS: usize = 1024;
/// `sizeof(shared_region_t)`.
pub const SIZE: usize = 2_008_952;
/// The longest the region's semaphore or its `lockf` lock is waited for.
pub const LOCK_WAIT_MS: u64 = 5_000;

#[repr(C)]
pub struct DeviceMemory {
    pub context_size: AtomicU64,
    pub module_size: AtomicU64,
    pub data_size: AtomicU64,
    pub offset: AtomicU64,
    pub total: AtomicU64,
    pub unused: [u64; 3],
}

#[repr(C)]
pub struct DeviceUtil {
    pub dec_util: AtomicU64,
    pub enc_util: AtomicU64,
    pub sm_util: AtomicU64,
    pub unused: [u64; 3],
}

/// `shrreg_proc_slot_t`.
#[repr(C)]
pub struct ProcSlot {
    pub pid: AtomicI32,
    pub hostpid: AtomicI32,
    pub used: [DeviceMemory; DEVICES],
    pub monitorused: [AtomicU64; DEVICES],
    pub device_util: [DeviceUtil; DEVICES],
    pub status: AtomicI32,
    pub seqlock: AtomicU64,
    pub unused: [u64; 2],
}

/// `shared_region_t`.
#[repr(C)]
pub struct Region {
    pub initialized_flag: AtomicI32,
    pub major_version: u32,
    pub minor_version: u32,
    pub sm_init_flag: AtomicI32,
    pub owner_pid: AtomicU64,
    pub sem: libc::sem_t,
    pub device_num: u64,
    pub uuids: [[u8; 96]; DEVICES],
    pub limit: [u64; DEVICES],
    pub sm_limit: [u64; DEVICES],
    pub procs: [ProcSlot; SLOTS],
    pub proc_num: AtomicI32,
    pub utilization_switch: AtomicI32,
    pub recent_kernel: AtomicI32,
    pub priority: i32,
    pub last_kernel_time: AtomicU64,
    pub sem_postinit: libc::sem_t,
}

/// The offsets of every field, as C's `offsetof` gives them for HAMi-core's header on x86-64 and
/// aarch64 Linux (checked against the header itself by `tests/hami.rs`).
pub const OFFSETS: &[(&str, usize)] = &[
    ("initialized_flag", std::mem::offset_of!(Region, initialized_flag)),
    ("major_version", std::mem::offset_of!(Region, major_version)),
    ("minor_version", std::mem::offset_of!(Region, minor_version)),
    ("sm_init_flag", std::mem::offset_of!(Region, sm_init_flag)),
    ("owner_pid", std::mem::offset_of!(Region, owner_pid)),
    ("sem", std::mem::offset_of!(Region, sem)),
    ("device_num", std::mem::offset_of!(Region, device_num)),
    ("uuids", std::mem::offset_of!(Region, uuids)),
    ("limit", std::mem::offset_of!(Region, limit)),
    ("sm_limit", std::mem::offset_of!(Region, sm_limit)),
    ("procs", std::mem::offset_of!(Region, procs)),
    ("proc_num", std::mem::offset_of!(Region, proc_num)),
    ("utilization_switch", std::mem::offset_of!(Region, utilization_switch)),
    ("recent_kernel", std::mem::offset_of!(Region, recent_kernel)),
    ("priority", std::mem::offset_of!(Region, priority)),
    ("last_kernel_time", std::mem::offset_of!(Region, last_kernel_time)),
    ("sem_postinit", std::mem::offset_of!(Region, sem_postinit)),
    ("procs[0].pid", std::mem::offset_of!(Region, procs) + std::mem::offset_of!(ProcSlot, pid)),
    ("procs[0].hostpid", std::mem::offset_of!(Region, procs) + std::mem::offset_of!(ProcSlot, hostpid)),
    ("procs[0].used", std::mem::offset_of!(Region, procs) + std::mem::offset_of!(ProcSlot, used)),
    ("procs[0].used[0].data_size", std::mem::offset_of!(Region, procs) + std::mem::offset_of!(ProcSlot, used) + std::mem::offset_of!(DeviceMemory, data_size)),
    ("procs[0].used[0].total", std::mem::offset_of!(Region, procs) + std::mem::offset_of!(ProcSlot, used) + std::mem::offset_of!(DeviceMemory, total)),
    ("procs[0].monitorused", std::mem::offset_of!(Region, procs) + std::mem::offset_of!(ProcSlot, monitorused)),
    ("procs[0].device_util", std::mem::offset_of!(Region, procs) + std::mem::offset_of!(ProcSlot, device_util)),
    ("procs[0].status", std::mem::offset_of!(Region, procs) + std::mem::offset_of!(ProcSlot, status)),
    ("procs[0].seqlock", std::mem::offset_of!(Region, procs) + std::mem::offset_of!(ProcSlot, seqlock)),
    ("procs[1]", std::mem::offset_of!(Region, procs) + std::mem::size_of::<ProcSlot>()),
];

const _: () = {
    assert!(std::mem::size_of::<libc::sem_t>() == 32);
    assert!(std::mem::size_of::<DeviceMemory>() == 64);
    assert!(std::mem::size_of::<DeviceUtil>() == 48);
    assert!(std::mem::size_of::<ProcSlot>() == 1960);
    assert!(std::mem::offset_of!(ProcSlot, status) == 1928);
    assert!(std::mem::offset_of!(ProcSlot, seqlock) == 1936);
    assert!(std::mem::offset_of!(Region, owner_pid) == 16);
    assert!(std::mem::offset_of!(Region, sem) == 24);
    assert!(std::mem::offset_of!(Region, device_num) == 56);
    assert!(std::mem::offset_of!(Region, uuids) == 64);
    assert!(std::mem::offset_of!(Region, limit) == 1600);
    assert!(std::mem::offset_of!(Region, sm_limit) == 1728);
    assert!(std::mem::offset_of!(Region, procs) == 1856);
    assert!(std::mem::offset_of!(Region, proc_num) == 2_008_896);
    assert!(std::mem::offset_of!(Region, priority) == 2_008_908);
    assert!(std::mem::offset_of!(Region, last_kernel_time) == 2_008_912);
    assert!(std::mem::offset_of!(Region, sem_postinit) == 2_008_920);
    assert!(std::mem::size_of::<Region>() == SIZE);
};

/// What a new region is initialised with: the limits in bytes (0: none) and SM limits in percent
/// (100: none), by HAMi device index, and `CUDA_TASK_PRIORITY`'s value.
#[derive(Debug, Clone, Copy)]
pub struct Init {
    pub limit: [u64; DEVICES],
    pub sm_limit: [u64; DEVICES],
    pub priority: i32,
}

/// A mapped region file.
pub struct Mapped {
    fd: libc::c_int,
    region: *mut Region,
    /// (device, inode) of the file: the shared quota's key.
    pub id: (u64, u64),
    /// Whether this process initialised it.
    pub created: bool,
    /// Whether only its owner can write it (or this process is root: HAMi's containers), so
    /// the limits it stores may be trusted over the environment's.
    pub trusted: bool,
    /// This process' slot index (`usize::MAX`: none).
    slot: AtomicUsize,
    pid: AtomicI32,
}

// SAFETY: shared memory accessed through atomics (the plain header fields are written only
// while the file is initialised under its `lockf` lock, before the flag is set).
unsafe impl Send for Mapped {}
unsafe impl Sync for Mapped {}

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

fn sleep_ms(ms: u64) {
    std::thread::sleep(std::time::Duration::from_millis(ms));
}

/// Whether `pid` is a live process (not a zombie) as this process can see it.
pub fn alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 checks existence only.
    if unsafe { libc::kill(pid, 0) } != 0 && errno().raw_os_error() == Some(libc::ESRCH) {
        return false;
    }
    // a zombie (killed, not yet reaped) holds nothing
    match std::fs::read(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let after = stat.iter().rposition(|&b| b == b')').map_or(&stat[..], |i| &stat[i + 1..]);
            !matches!(after.iter().find(|b| !b.is_ascii_whitespace()), Some(b'Z' | b'X'))
        }
        Err(_) => true,
    }
}

/// A `lockf`-style write lock on the region's bytes (HAMi-core's initialisation lock), waited for
/// with a bound.
fn lockf(fd: libc::c_int, lock: bool) -> Result<(), String> {
    // SAFETY: a zeroed flock is valid; fcntl reads it.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = if lock { libc::F_WRLCK } else { libc::F_UNLCK } as _;
    fl.l_whence = libc::SEEK_SET as _;
    fl.l_start = 0;
    fl.l_len = SIZE as _;
    let mut waited = 0;
    loop {
        // SAFETY: `fd` is open; `fl` a valid flock.
        if unsafe { libc::fcntl(fd, libc::F_SETLK, &fl) } == 0 {
            return Ok(());
        }
        let e = errno();
        if !matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES | libc::EINTR)) || waited >= LOCK_WAIT_MS {
            return Err(format!("cannot lock it: {e}"));
        }
        sleep_ms(10);
        waited += 10;
    }
}

impl Mapped {
    /// Opens (creating it when absent) the region file at `path`, initialising it with `init`
    /// when new. Refuses what it cannot safely adopt (see the module docs).
    pub fn open(path: &Path, init: &Init) -> Result<Mapped, String> {
        let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| "the path holds a NUL byte".to_string())?;
        // SAFETY: a NUL-terminated path; flags and mode are plain integers.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK, 0o644 as libc::c_uint) };
        if fd < 0 {
            let e = errno();
            return Err(match e.raw_os_error() {
                Some(libc::ELOOP) => "it is a symbolic link; refused (another user could point it anywhere)".to_string(),
                _ => format!("cannot open it: {e}"),
            });
        }
        let close = |e: String| -> Result<Mapped, String> {
            // SAFETY: our descriptor.
            unsafe { libc::close(fd) };
            Err(e)
        };
        // SAFETY: `st` written by the kernel.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            return close(format!("cannot stat it: {}", errno()));
        }
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return close("it is not a regular file".to_string());
        }
        // SAFETY: no arguments.
        let me = unsafe { libc::geteuid() };
        if st.st_uid != me && st.st_uid != 0 {
            return close(format!("it belongs to user {}, not to this user ({me}) or root; refused (it could carry any limits)", st.st_uid));
        }
        if st.st_nlink != 1 {
            return close(format!("it has {} hard links; refused (it could be another file's name)", st.st_nlink));
        }
        if st.st_mode & 0o022 != 0 {
            // Writable by others (HAMi-core makes its files 0666): any of them could change its
            // limits or truncate it under the program's mapping. Ours: made the owner's alone;
            // another's (root's): refused.
            // SAFETY: our descriptor; a plain mode.
            if st.st_uid != me || unsafe { libc::fchmod(fd, (st.st_mode & 0o7755) as libc::mode_t) } != 0 {
                return close(format!("other users can write it (mode {:o}); refused (they could change its limits, or truncate it under the program)", st.st_mode & 0o777));
            }
            st.st_mode &= !0o022;
        }
        if let Err(e) = lockf(fd, true) {
            return close(e);
        }
        let result = Self::adopt(fd, &st, init);
        let _ = lockf(fd, false);
        match result {
            Ok(m) => Ok(m),
            Err(e) => close(e),
        }
    }

    /// Under the `lockf` lock: sizes, allocates, maps, checks or initialises.
    fn adopt(fd: libc::c_int, st: &libc::stat, init: &Init) -> Result<Mapped, String> {
        // SAFETY: `st2` written by the kernel (the size again, now that the lock is held).
        let mut st2: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(fd, &mut st2) } != 0 {
            return Err(format!("cannot stat it: {}", errno()));
        }
        let size = st2.st_size.max(0) as u64;
        if size != 0 && size < SIZE as u64 {
            return Err(format!("it is {size} bytes, not a HAMi-core shared region ({SIZE} bytes); refused"));
        }
        let hamis_size = size == 0 || size == SIZE as u64 + 1;
        // (HAMi-core's file is one byte longer than the struct)
        crate::platform::sys::allocate(fd, SIZE as u64 + 1).map_err(|e| format!("{e}; refused (a mapping of it could fault)"))?;
        // SAFETY: a fresh shared mapping of SIZE bytes of a file at least that long.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), SIZE, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0) };
        if p == libc::MAP_FAILED {
            return Err(format!("cannot map it: {}", errno()));
        }
        let mut m = Mapped { fd, region: p.cast(), id: (st.st_dev as u64, st.st_ino as u64), created: false, trusted: st.st_mode & 0o022 == 0, slot: AtomicUsize::new(usize::MAX), pid: AtomicI32::new(0) };
        let r = m.region_mut();
        let flag = r.initialized_flag.load(Acquire);
        if flag == MAGIC {
            if (r.major_version, r.minor_version) != (MAJOR, MINOR) {
                let v = (r.major_version, r.minor_version);
                discard(m);
                return Err(format!("its version is {}.{}, not HAMi-core's {MAJOR}.{MINOR} this build knows; refused", v.0, v.1));
            }
            if !(0..=SLOTS as i32).contains(&r.proc_num.load(Acquire)) {
                discard(m);
                return Err("its process count is out of range; refused".to_string());
            }
            return Ok(m);
        }
        if size != 0 && flag != 0 {
            discard(m);
            return Err(format!("its magic is {flag}, not HAMi-core's {MAGIC}; refused"));
        }
        if !hamis_size {
            // (a file never initialised is written only if it is empty or exactly a region's
            // size: never some other file of zeros under that name)
            discard(m);
            return Err(format!("it is {size} bytes and not a HAMi-core shared region; refused"));
        }
        // new (or never initialised): as HAMi-core's `try_create_shrreg`
        r.major_version = MAJOR;
        r.minor_version = MINOR;
        r.limit = init.limit;
        r.sm_limit = init.sm_limit;
        // SAFETY: the semaphores live in the shared mapping (pshared = 1), initialised once here.
        unsafe {
            libc::sem_init(&mut r.sem, 1, 1);
            libc::sem_init(&mut r.sem_postinit, 1, 1);
        }
        r.sm_init_flag.store(0, Relaxed);
        r.utilization_switch.store(1, Relaxed);
        r.recent_kernel.store(2, Relaxed);
        r.proc_num.store(0, Relaxed);
        r.priority = init.priority;
        r.last_kernel_time.store(now_s(), Relaxed);
        r.initialized_flag.store(MAGIC, Release);
        m.created = true;
        Ok(m)
    }

    fn unmap(&self) {
        // SAFETY: our mapping of SIZE bytes, no longer used.
        unsafe { libc::munmap(self.region.cast(), SIZE) };
    }

    #[allow(clippy::mut_from_ref)]
    fn region_mut(&self) -> &mut Region {
        // SAFETY: the mapping lives as long as `self`; plain fields are written only while the
        // file is initialised under the `lockf` lock (see `adopt`), or are the monitor's.
        unsafe { &mut *self.region }
    }

    pub fn region(&self) -> &Region {
        // SAFETY: as `region_mut`.
        unsafe { &*self.region }
    }

    /// Takes the region's semaphore (HAMi-core's `lock_shrreg`), waiting at most `wait_ms`; a
    /// dead owner's hold is broken as HAMi-core breaks it.
    fn lock(&self, wait_ms: u64) -> bool {
        let r = self.region();
        // SAFETY: the semaphore lives in the mapping (valid while `self` is), initialised by its creator.
        let sem = unsafe { std::ptr::addr_of_mut!((*self.region).sem) };
        let mut waited = 0;
        loop {
            // SAFETY: as above.
            if unsafe { libc::sem_trywait(sem) } == 0 {
                r.owner_pid.store(crate::platform::sys::getpid() as u64, Release);
                return true;
            }
            let owner = r.owner_pid.load(Acquire);
            if owner != 0 && !alive(owner as i32) && r.owner_pid.compare_exchange(owner, 0, Release, Acquire).is_ok() {
                // SAFETY: as above.
                unsafe { libc::sem_post(sem) };
                continue;
            }
            if waited >= wait_ms {
                return false;
            }
            sleep_ms(2);
            waited += 2;
        }
    }

    fn unlock(&self) {
        self.region().owner_pid.store(0, Release);
        // SAFETY: as in `lock`.
        unsafe { libc::sem_post(std::ptr::addr_of_mut!((*self.region).sem)) };
    }

    /// Removes the slots of dead or exited processes (HAMi-core's `clear_proc_slot_nolock`:
    /// the last slot moves into the hole). Under the semaphore.
    fn sweep_locked(&self) -> usize {
        let r = self.region();
        let mut removed = 0;
        let mut i = 0;
        loop {
            // (read once per step and clamped: a count rewritten under us never indexes out)
            let n = r.proc_num.load(Acquire).clamp(0, SLOTS as i32) as usize;
            if i >= n {
                break;
            }
            let pid = r.procs[i].pid.load(Acquire);
            if pid != 0 && alive(pid) {
                i += 1;
                continue;
            }
            let last = n - 1;
            copy_slot(&r.procs[last], &r.procs[i]);
            clear_slot(&r.procs[last]);
            r.proc_num.store(last as i32, Release);
            if self.slot.load(Relaxed) == last {
                self.slot.store(i, Relaxed);
            }
            removed += 1;
        }
        removed
    }

    /// Takes a slot for this process (reusing one with its pid), removing dead ones first.
    pub fn join(&self) -> Result<usize, String> {
        if !self.lock(LOCK_WAIT_MS) {
            return Err(format!("its semaphore stayed taken for {} s (owner pid {})", LOCK_WAIT_MS / 1000, self.region().owner_pid.load(Relaxed)));
        }
        let me = crate::platform::sys::getpid();
        self.sweep_locked();
        let r = self.region();
        let n = r.proc_num.load(Acquire).clamp(0, SLOTS as i32) as usize;
        let i = match (0..n).find(|&i| r.procs[i].pid.load(Acquire) == me) {
            Some(i) => i,
            None if n < SLOTS => {
                clear_slot(&r.procs[n]);
                r.procs[n].pid.store(me, Release);
                r.proc_num.store(n as i32 + 1, Release);
                n
            }
            None => {
                self.unlock();
                return Err(format!("all its {SLOTS} process slots are taken"));
            }
        };
        r.procs[i].status.store(1, Release);
        self.slot.store(i, Relaxed);
        self.pid.store(me, Relaxed);
        self.unlock();
        Ok(i)
    }

    /// This process' slot, found again if another process moved it.
    fn my_slot(&self) -> Option<&ProcSlot> {
        let r = self.region();
        let me = self.pid.load(Relaxed);
        if me == 0 || me != crate::platform::sys::getpid() {
            return None; // (not joined, or a forked child: the slot is its parent's)
        }
        let n = r.proc_num.load(Acquire).clamp(0, SLOTS as i32) as usize;
        let cached = self.slot.load(Relaxed);
        if cached < n && r.procs[cached].pid.load(Acquire) == me {
            return Some(&r.procs[cached]);
        }
        let i = (0..n).find(|&i| r.procs[i].pid.load(Acquire) == me)?;
        self.slot.store(i, Relaxed);
        Some(&r.procs[i])
    }

    /// Writes this process' usage on HAMi device `dev` (lock-free, under the slot's seqlock).
    pub fn set_usage(&self, dev: usize, bytes: u64) {
        if dev >= DEVICES {
            return;
        }
        let Some(slot) = self.my_slot() else { return };
        slot.seqlock.fetch_add(1, Release);
        slot.used[dev].total.store(bytes, Release);
        slot.used[dev].data_size.store(bytes, Release);
        slot.seqlock.fetch_add(1, Release);
    }

    /// Records device `dev`'s UUID (`GPU-…`) and raises the device count to cover it.
    /// Plain (non-atomic) fields of the shared mapping, as in HAMi-core: written under the
    /// region's semaphore (its acquire and release order them for every other process that
    /// takes it), through raw pointers (no `&mut` to memory other threads read), and not at all
    /// when the semaphore cannot be had.
    pub fn set_device(&self, dev: usize, uuid: &str) {
        if dev >= DEVICES || !self.lock(LOCK_WAIT_MS) {
            return;
        }
        let r = self.region;
        // SAFETY: the mapping lives as long as `self`; `dev < DEVICES`; the semaphore is held,
        // so no other process of the region writes these fields meanwhile.
        unsafe {
            let slot = std::ptr::addr_of_mut!((*r).uuids[dev]);
            if std::ptr::read_volatile(slot.cast::<u8>()) == 0 {
                let b = uuid.as_bytes();
                let n = b.len().min(95);
                std::ptr::copy_nonoverlapping(b.as_ptr(), slot.cast::<u8>(), n);
            }
            let num = std::ptr::addr_of_mut!((*r).device_num);
            if std::ptr::read_volatile(num) < dev as u64 + 1 {
                std::ptr::write_volatile(num, dev as u64 + 1);
            }
        }
        self.unlock();
    }

    /// Leaves the region (at exit): the slot is removed when the semaphore can be had quickly,
    /// else marked exited (pid 0, no usage) for the next process to remove.
    pub fn leave(&self) {
        let Some(slot) = self.my_slot() else { return };
        slot.seqlock.fetch_add(1, Release);
        for d in &slot.used {
            d.total.store(0, Release);
            d.data_size.store(0, Release);
        }
        slot.seqlock.fetch_add(1, Release);
        slot.status.store(0, Release);
        slot.pid.store(0, Release);
        self.pid.store(0, Relaxed);
        if self.lock(200) {
            self.sweep_locked();
            self.unlock();
        }
    }
}

/// Gives up a mapping made in `adopt` (the descriptor stays the caller's to close).
fn discard(m: Mapped) {
    m.unmap();
    std::mem::forget(m);
}

impl Drop for Mapped {
    fn drop(&mut self) {
        self.unmap();
        // SAFETY: our descriptor.
        unsafe { libc::close(self.fd) };
    }
}

fn now_s() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn clear_slot(s: &ProcSlot) {
    s.pid.store(0, Release);
    s.hostpid.store(0, Relaxed);
    s.status.store(0, Relaxed);
    s.seqlock.store(0, Relaxed);
    for d in 0..DEVICES {
        for a in [&s.used[d].context_size, &s.used[d].module_size, &s.used[d].data_size, &s.used[d].offset, &s.used[d].total, &s.monitorused[d], &s.device_util[d].sm_util, &s.device_util[d].dec_util, &s.device_util[d].enc_util] {
            a.store(0, Relaxed);
        }
    }
}

fn copy_slot(from: &ProcSlot, to: &ProcSlot) {
    if std::ptr::eq(from, to) {
        return;
    }
    // Under `to`'s seqlock, as a writer of it (a reader without the semaphore never takes the
    // copy half-made for a consistent slot): odd first, the data, then an even number above
    // both counters (never one a reader saw before the copy). The fence orders the odd value
    // before the data stores; the final Release orders them before the even one (pairs with
    // the reader's Acquire loads in `read`).
    let seq = to.seqlock.load(Relaxed).max(from.seqlock.load(Relaxed)) | 1;
    to.seqlock.store(seq, Relaxed);
    std::sync::atomic::fence(Release);
    to.hostpid.store(from.hostpid.load(Relaxed), Relaxed);
    to.status.store(from.status.load(Relaxed), Relaxed);
    for d in 0..DEVICES {
        let pairs = [
            (&from.used[d].context_size, &to.used[d].context_size),
            (&from.used[d].module_size, &to.used[d].module_size),
            (&from.used[d].data_size, &to.used[d].data_size),
            (&from.used[d].offset, &to.used[d].offset),
            (&from.used[d].total, &to.used[d].total),
            (&from.monitorused[d], &to.monitorused[d]),
            (&from.device_util[d].sm_util, &to.device_util[d].sm_util),
        ];
        for (a, b) in pairs {
            b.store(a.load(Relaxed), Relaxed);
        }
    }
    // (the pid last, Release: its process, finding its slot here with `my_slot`'s Acquire,
    // sees the copied usage first and its own next write lands after it)
    to.pid.store(from.pid.load(Relaxed), Release);
    to.seqlock.store(seq.wrapping_add(1), Release);
}

// ---------------------------------------------------------------------------------------------
// Reading (the command)
// ---------------------------------------------------------------------------------------------

/// One process slot as read.
#[derive(Debug, Clone)]
pub struct SlotView {
    pub pid: i32,
    pub hostpid: i32,
    pub status: i32,
    pub alive: bool,
    /// `used[dev].total` for each device.
    pub used: Vec<u64>,
}

/// A region file as read.
#[derive(Debug, Clone)]
pub struct View {
    pub version: (u32, u32),
    pub device_num: u64,
    pub uuids: Vec<String>,
    pub limit: Vec<u64>,
    pub sm_limit: Vec<u64>,
    pub slots: Vec<SlotView>,
    pub utilization_switch: i32,
    pub recent_kernel: i32,
    pub priority: i32,
}

/// Reads the region file at `path` without changing it.
pub fn read(path: &Path) -> Result<View, String> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| "the path holds a NUL byte".to_string())?;
    // SAFETY: a NUL-terminated path.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK) };
    if fd < 0 {
        return Err(format!("cannot open it: {}", errno()));
    }
    // SAFETY: written by the kernel.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::fstat(fd, &mut st) } == 0 && st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_size >= SIZE as i64;
    if !ok {
        // SAFETY: ours.
        unsafe { libc::close(fd) };
        return Err(format!("not a HAMi-core shared region (a regular file of at least {SIZE} bytes)"));
    }
    // SAFETY: a read-only shared mapping of a file at least SIZE long (a file truncated under us
    // could fault: the command, not the shim, reads this way).
    let p = unsafe { libc::mmap(std::ptr::null_mut(), SIZE, libc::PROT_READ, libc::MAP_SHARED, fd, 0) };
    // SAFETY: ours.
    unsafe { libc::close(fd) };
    if p == libc::MAP_FAILED {
        return Err(format!("cannot map it: {}", errno()));
    }
    // SAFETY: the mapping is live until the munmap below.
    let r: &Region = unsafe { &*p.cast::<Region>() };
    let view = if r.initialized_flag.load(Acquire) != MAGIC {
        Err(format!("its magic is not HAMi-core's {MAGIC}"))
    } else {
        let n = r.proc_num.load(Acquire).clamp(0, SLOTS as i32) as usize;
        let slots = r.procs[..n]
            .iter()
            .map(|s| {
                let mut used = vec![0; DEVICES];
                for _ in 0..1000 {
                    let a = s.seqlock.load(Acquire);
                    for (d, u) in used.iter_mut().enumerate() {
                        *u = s.used[d].total.load(Acquire);
                    }
                    if a & 1 == 0 && s.seqlock.load(Acquire) == a {
                        break;
                    }
                }
                let pid = s.pid.load(Acquire);
                SlotView { pid, hostpid: s.hostpid.load(Relaxed), status: s.status.load(Relaxed), alive: alive(pid), used }
            })
            .collect();
        let uuid = |u: &[u8; 96]| String::from_utf8_lossy(&u[..u.iter().position(|&b| b == 0).unwrap_or(96)]).into_owned();
        Ok(View {
            version: (r.major_version, r.minor_version),
            device_num: r.device_num,
            uuids: r.uuids.iter().map(uuid).collect(),
            limit: r.limit.to_vec(),
            sm_limit: r.sm_limit.to_vec(),
            slots,
            utilization_switch: r.utilization_switch.load(Relaxed),
            recent_kernel: r.recent_kernel.load(Relaxed),
            priority: r.priority,
        })
    };
    // SAFETY: our mapping, no longer referenced.
    unsafe { libc::munmap(p, SIZE) };
    view
}

#[cfg(test)]
#[path = "hami_tests.rs"]
mod tests;
