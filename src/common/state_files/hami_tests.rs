//! Unit tests of HAMi-core's shared region: opening, refusing, slots, usage and the reader.

use super::*;
use std::path::PathBuf;

thread_local! {
    /// The directories this test (its thread) made.
    static CREATED: std::cell::RefCell<Vec<PathBuf>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Removes the directories this test made (each test calls it last; one that failed leaves its
/// files for a look).
fn cleanup() {
    for dir in CREATED.with(|c| std::mem::take(&mut *c.borrow_mut())) {
        let _ = std::fs::remove_dir_all(dir);
    }
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpushim-hami-unit-{}-{name}", std::process::id()));
    CREATED.with(|c| c.borrow_mut().push(dir.clone()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("region.cache")
}

fn init() -> Init {
    let mut i = Init { limit: [0; DEVICES], sm_limit: [100; DEVICES], priority: 1 };
    i.limit[0] = 1 << 30;
    i.sm_limit[1] = 30;
    i
}

#[test]
fn a_new_region_is_hami_cores_and_usage_shows() {
    let path = temp("new");
    let m = Mapped::open(&path, &init()).unwrap();
    assert!(m.created && m.trusted);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), SIZE as u64 + 1);
    assert_eq!(m.join().unwrap(), 0);
    m.set_device(0, "GPU-abc");
    m.set_usage(0, 4096);
    m.set_usage(DEVICES, 1); // out of range: ignored
    let v = read(&path).unwrap();
    assert_eq!((v.version, v.device_num, v.uuids[0].as_str()), ((1, 2), 1, "GPU-abc"));
    assert_eq!((v.limit[0], v.limit[1], v.sm_limit[0], v.sm_limit[1]), (1 << 30, 0, 100, 30));
    assert_eq!((v.utilization_switch, v.recent_kernel, v.priority), (1, 2, 1));
    assert_eq!(v.slots.len(), 1);
    let s = &v.slots[0];
    assert_eq!((s.pid, s.status, s.alive, s.used[0]), (std::process::id() as i32, 1, true, 4096));
    // a second open adopts it (not re-initialised), and joining again reuses the slot
    let again = Mapped::open(&path, &Init { limit: [5; DEVICES], ..init() }).unwrap();
    assert!(!again.created);
    assert_eq!(again.region().limit[0], 1 << 30);
    assert_eq!(again.join().unwrap(), 0);
    m.leave();
    let v = read(&path).unwrap();
    assert!(v.slots.is_empty(), "{v:?}");
    cleanup();
}

#[test]
fn dead_and_exited_slots_are_removed_by_the_next_joiner() {
    let path = temp("dead");
    let m = Mapped::open(&path, &init()).unwrap();
    let r = m.region();
    // a dead process (a pid that cannot exist), an exited one (pid 0) and a live one (init)
    for (i, pid) in [(0, i32::MAX - 1), (1, 0), (2, 1)] {
        r.procs[i].pid.store(pid, Relaxed);
        r.procs[i].used[0].total.store(100 + i as u64, Relaxed);
    }
    // (seqlocks: the dead slot's above the live one's, the live one's mid-write)
    r.procs[0].seqlock.store(10, Relaxed);
    r.procs[2].seqlock.store(5, Relaxed);
    r.proc_num.store(3, Relaxed);
    let v = read(&path).unwrap();
    assert_eq!(v.slots.iter().map(|s| s.alive).collect::<Vec<_>>(), [false, false, true]);
    let i = m.join().unwrap();
    let v = read(&path).unwrap();
    let pids: Vec<i32> = v.slots.iter().map(|s| s.pid).collect();
    assert_eq!(pids, [1, std::process::id() as i32], "{v:?}");
    assert_eq!(i, 1);
    assert_eq!(v.slots[0].used[0], 102, "the live slot moved with its usage");
    // the copy was written under the destination's seqlock: it ends even, above both counters
    // (a reader that saw either before the copy cannot take the copy for what it saw)
    assert_eq!(r.procs[0].seqlock.load(Relaxed), 12);
    cleanup();
}

#[test]
fn what_cannot_be_adopted_is_refused() {
    let path = temp("short");
    std::fs::write(&path, [1u8; 100]).unwrap();
    assert!(Mapped::open(&path, &init()).err().unwrap().contains("is 100 bytes"));
    let path = temp("magic");
    let mut b = vec![0u8; SIZE + 1];
    b[0] = 1;
    std::fs::write(&path, &b).unwrap();
    assert!(Mapped::open(&path, &init()).err().unwrap().contains("its magic is 1,"));
    assert_eq!(std::fs::read(&path).unwrap(), b);
    let path = temp("procs");
    let mut b = vec![0u8; SIZE + 1];
    b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    b[4..8].copy_from_slice(&1u32.to_le_bytes());
    b[8..12].copy_from_slice(&2u32.to_le_bytes());
    let at = std::mem::offset_of!(Region, proc_num);
    b[at..at + 4].copy_from_slice(&5000i32.to_le_bytes());
    std::fs::write(&path, &b).unwrap();
    assert!(Mapped::open(&path, &init()).err().unwrap().contains("process count is out of range"));
    let path = temp("link");
    std::os::unix::fs::symlink("/dev/null", &path).unwrap();
    assert!(Mapped::open(&path, &init()).err().unwrap().contains("symbolic link"));
    assert!(read(&temp("absent")).is_err());
    cleanup();
}

#[test]
fn an_uninitialised_file_of_hami_cores_size_is_initialised() {
    let path = temp("zero");
    std::fs::write(&path, vec![0u8; SIZE + 1]).unwrap();
    let m = Mapped::open(&path, &init()).unwrap();
    assert!(m.created);
    assert_eq!(m.region().initialized_flag.load(Relaxed), MAGIC);
    cleanup();
}
