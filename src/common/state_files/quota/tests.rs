//! Unit tests of shared quotas and the registry: joining, reserving, leaving, reclaiming.

use super::*;

fn dir(name: &str) -> TestDir {
    let d = std::env::temp_dir().join(format!("gpushim-quota-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    TestDir(d)
}

/// A test's directory (or file) in /tmp, removed when dropped, the test passed or not.
struct TestDir(PathBuf);
impl std::ops::Deref for TestDir {
    type Target = PathBuf;
    fn deref(&self) -> &PathBuf {
        &self.0
    }
}
impl AsRef<Path> for TestDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}
impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
        let _ = std::fs::remove_file(&self.0);
    }
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
    // Under qemu-user (scripts/test-aarch64.sh sets GPUSHIM_TEST_RUNNER) there is no
    // set_robust_list: the kernel never marks the dead child's lock, EOWNERDEAD never comes.
    if std::env::var_os("GPUSHIM_TEST_RUNNER").is_some() {
        // (to the descriptor: the test harness captures eprintln!)
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "SKIPPED under emulation: qemu-user lacks set_robust_list, so a robust mutex whose owner died is never repaired");
        return;
    }
    let d = dir("ownerdead");
    let a = Quota::open(&d, "q", true).unwrap();
    let dev = a.device("GPU-k", 100, 100).unwrap().unwrap();
    assert_eq!(a.reserve(dev, 10, 100), Ok(()));
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "state_files::quota::tests::killed_holding_the_lock_child", "--test-threads=1"])
        .env("GPUSHIM_QUOTA_TEST_CHILD", &*d)
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
fn crafted(name: &str, bytes: &[u8]) -> TestDir {
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
    let src = dir("trunc-src");
    let q = Quota::open(&src, "q", true).unwrap();
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

/// Two members of one quota in this process (each its own slot and lock): a waiter proceeds
/// when the other frees; when both wait, the newest fails at once; a wait with nobody freeing
/// ends at its deadline; the queue is empty afterwards.
#[test]
fn waiting_for_room() {
    use crate::oom_wait::{wait_for_room, End};
    use std::time::Duration;
    let d = dir("wait");
    let a = std::sync::Arc::new(Quota::open(&d, "q", true).unwrap());
    let b = std::sync::Arc::new(Quota::open(&d, "q", true).unwrap());
    let dev = a.device("GPU-w", 1000, 100).unwrap().unwrap();
    assert_eq!(b.device("GPU-w", 1000, 100).unwrap(), Some(dev));
    a.reserve(dev, 90, 100).unwrap();
    // b waits; a frees after 300 ms
    let bb = b.clone();
    let t = std::thread::spawn(move || wait_for_room(&*bb, dev, 20, 100, Duration::from_secs(20)));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(a.waiting(), 1);
    a.release(dev, 50);
    let w = t.join().unwrap();
    assert_eq!(w.end, End::Reserved);
    assert!(w.waited >= Duration::from_millis(250) && w.waited < Duration::from_secs(5), "{w:?}");
    assert_eq!(a.reserved(dev), 60);
    // both wait: the newest (a) fails at once, b goes on waiting until a frees
    a.reserve(dev, 40, 100).unwrap();
    let bb = b.clone();
    let t = std::thread::spawn(move || wait_for_room(&*bb, dev, 30, 100, Duration::from_secs(20)));
    let start = std::time::Instant::now();
    while a.waiting() == 0 {
        assert!(start.elapsed() < Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(5));
    }
    let w = wait_for_room(&*a, dev, 10, 100, Duration::from_secs(20));
    assert_eq!(w.end, End::AllWaiting, "{w:?}");
    assert!(w.waited < Duration::from_secs(1), "{w:?}");
    a.release(dev, 80);
    assert_eq!(t.join().unwrap().end, End::Reserved);
    // nobody frees: the deadline
    let w = wait_for_room(&*a, dev, 60, 100, Duration::from_millis(300));
    assert_eq!(w.end, End::TimedOut);
    assert!(w.waited >= Duration::from_millis(300) && w.waited < Duration::from_secs(3), "{w:?}");
    assert_eq!(a.waiting(), 0);
    assert_eq!(a.reserved(dev), 50);
}

/// Signals delivered to a waiting thread (a handler installed without `SA_RESTART`: each one
/// ends a `FUTEX_WAIT` with `EINTR`) neither end the wait early nor lose it: a wait with nobody
/// freeing lasts its deadline, and one whose room appears gets it.
#[test]
fn signals_do_not_cut_a_wait_short() {
    use crate::oom_wait::{wait_for_room, End};
    use std::os::unix::thread::JoinHandleExt;
    use std::time::Duration;
    extern "C" fn nothing(_: libc::c_int) {}
    // SAFETY: a handler that does nothing, installed for SIGUSR2 (not used elsewhere in tests).
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = nothing as extern "C" fn(libc::c_int) as usize;
        libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut());
    }
    let d = dir("signals");
    let a = std::sync::Arc::new(Quota::open(&d, "q", true).unwrap());
    let b = std::sync::Arc::new(Quota::open(&d, "q", true).unwrap());
    let dev = a.device("GPU-s", 1000, 100).unwrap().unwrap();
    b.device("GPU-s", 1000, 100).unwrap();
    a.reserve(dev, 90, 100).unwrap();
    for free_after in [None, Some(Duration::from_millis(400))] {
        let bb = b.clone();
        let t = std::thread::spawn(move || wait_for_room(&*bb, dev, 20, 100, Duration::from_millis(800)));
        let start = std::time::Instant::now();
        let mut freed = false;
        while !t.is_finished() {
            // SAFETY: the thread is alive (not finished; joined only below).
            unsafe { libc::pthread_kill(t.as_pthread_t(), libc::SIGUSR2) };
            if !freed && free_after.is_some_and(|f| start.elapsed() >= f) {
                a.release(dev, 50);
                freed = true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let w = t.join().unwrap();
        match free_after {
            None => {
                assert_eq!(w.end, End::TimedOut, "{w:?}");
                assert!(w.waited >= Duration::from_millis(800), "{w:?}");
            }
            Some(_) => {
                assert_eq!(w.end, End::Reserved, "{w:?}");
                assert!(w.waited >= Duration::from_millis(350) && w.waited < Duration::from_millis(800), "{w:?}");
            }
        }
    }
    assert_eq!(a.waiting(), 0);
}
