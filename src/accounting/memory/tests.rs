//! Unit tests of the budgets and the live map.

use super::*;
use std::sync::Arc;

#[test]
fn a_new_budget_is_all_zero_bytes_and_zeroed_budgets_work() {
    let b = DeviceBudget::new();
    // SAFETY: reads the bytes of a live value (no padding: every field is 8 bytes).
    let bytes = unsafe { std::slice::from_raw_parts(&b as *const DeviceBudget as *const u8, std::mem::size_of::<DeviceBudget>()) };
    assert!(bytes.iter().all(|&x| x == 0));
    let all = Budgets::new(MAX_DEVICES);
    assert!(matches!(all, Budgets::Mapped(_)));
    assert_eq!(all.len(), MAX_DEVICES);
    let last = &all[MAX_DEVICES - 1];
    assert_eq!((last.limit(), last.reserved(), last.in_use(), last.shared().is_none()), (None, 0, 0, true));
    last.set_limit(1000);
    assert_eq!(last.limit(), Some(1000));
    last.set_limit(0);
    assert_eq!(last.limit(), Some(0));
    last.set_limit(u64::MAX);
    assert_eq!(last.limit(), Some(u64::MAX - 1));
    assert_eq!(last.try_reserve(600, 1000), Ok(()));
    assert_eq!(all[0].reserved(), 0);
}

#[test]
fn the_mutex_map_counts_its_entries_per_kind() {
    let map = LiveMap::new();
    let live = |bytes| Live { device: 0, bytes, served: false, pool: false, ctx: 7, id: entry_id() };
    assert!(map.entries(Kind::Array).is_empty());
    assert_eq!(map.insert(Kind::Array, 0x1000, live(1)).unwrap(), None);
    assert!(map.insert(Kind::Array, 0x1000, live(2)).unwrap().is_some()); // replaced: still one
    assert_eq!(map.insert(Kind::Array, 0x2000, live(3)).unwrap(), None);
    // (a device pointer with a context recorded goes to the mutex map too)
    assert_eq!(map.insert(Kind::DevicePtr, 0x3000, live(4)).unwrap(), None);
    assert_eq!(map.shards.counts.iter().map(|c| c.load(Relaxed)).collect::<Vec<_>>(), [1, 0, 2, 0]);
    assert_eq!(map.entries(Kind::Array).len(), 2);
    assert!(map.entries(Kind::MipmappedArray).is_empty());
    assert!(map.remove(Kind::Array, 0x1000).unwrap().is_some());
    assert!(map.remove(Kind::Array, 0x1000).unwrap().is_none());
    let e = map.get(Kind::Array, 0x2000).unwrap().unwrap();
    assert!(map.remove_if(Kind::Array, 0x2000, &live(9)).unwrap().is_none()); // not that entry
    assert!(map.remove_if(Kind::Array, 0x2000, &e).unwrap().is_some());
    assert!(map.remove(Kind::DevicePtr, 0x3000).unwrap().is_some());
    assert_eq!(map.shards.counts.iter().map(|c| c.load(Relaxed)).collect::<Vec<_>>(), [0, 0, 0, 0]);
    assert!(map.entries(Kind::Array).is_empty());
}

#[test]
fn reserve_respects_limit_exactly() {
    let b = DeviceBudget::new();
    assert_eq!(b.try_reserve(600, 1000), Ok(()));
    assert_eq!(b.try_reserve(400, 1000), Ok(()));
    assert_eq!(b.try_reserve(1, 1000), Err(Refused { reserved: 1000, limit: 1000 }));
    b.release(400);
    assert_eq!(b.reserved(), 600);
    assert_eq!(b.peak_reserved(), 1000);
    assert_eq!(b.try_reserve(u64::MAX, u64::MAX), Err(Refused { reserved: 600, limit: u64::MAX }));
    b.release(10_000);
    assert_eq!(b.reserved(), 0);
    b.take(300);
    b.give(100);
    b.take(50);
    assert_eq!((b.in_use(), b.peak_in_use()), (250, 300));
    b.give(1000);
    assert_eq!(b.in_use(), 0);
    // `bytes` alone beyond the limit: refused, whatever is reserved
    assert_eq!(b.try_reserve(1001, 1000), Err(Refused { reserved: 0, limit: 1000 }));
    assert_eq!(b.try_reserve(1000, 1000), Ok(()));
    b.take(400);
    // freed: both counters, each never below zero
    b.freed(300);
    assert_eq!((b.reserved(), b.in_use()), (700, 100));
    b.freed(500);
    assert_eq!((b.reserved(), b.in_use()), (200, 0));
    b.take(50);
    b.freed(250);
    assert_eq!((b.reserved(), b.in_use(), b.peak_reserved(), b.peak_in_use()), (0, 0, 1000, 400));
}

#[test]
fn concurrent_reservations_never_pass_the_limit() {
    let b = Arc::new(DeviceBudget::new());
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let b = b.clone();
            std::thread::spawn(move || {
                let mut held = Vec::new();
                for i in 0..20_000u64 {
                    let size = 1 + (i * 7919 + t * 104_729) % 300;
                    if b.try_reserve(size, 10_000).is_ok() {
                        held.push(size);
                    }
                    assert!(b.reserved() <= 10_000);
                    if i % 3 == 0 {
                        if let Some(s) = held.pop() {
                            b.release(s);
                        }
                    }
                }
                for s in held {
                    b.release(s);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(b.reserved(), 0);
    assert!(b.peak_reserved() <= 10_000 && b.peak_reserved() > 9_000);
}

/// Budgets whose figures move to published entries ([`publish_budgets`]) while 6 threads
/// update them: no update is lost (each thread's own net figures add up exactly), the limit
/// set meanwhile is published, a budget not published keeps its own, and a forked child's
/// reset leaves the published entry alone.
#[test]
fn figures_move_to_their_published_entries_without_losing_an_update() {
    const LIMIT: u64 = 1 << 40;
    for round in 0..60u64 {
        let budgets: &'static [DeviceBudget] = Box::leak((0..3).map(|_| DeviceBudget::new()).collect::<Vec<_>>().into_boxed_slice());
        let entries: &'static [Figures] = Box::leak((0..3).map(|_| Figures::new()).collect::<Vec<_>>().into_boxed_slice());
        budgets[0].set_limit(LIMIT);
        budgets[2].set_limit(LIMIT);
        let go = Arc::new(std::sync::Barrier::new(8));
        // device 2's limit set over and over until its figures have moved: the last one
        // set (before the move, or across it) is the one published
        let setter = {
            let go = go.clone();
            std::thread::spawn(move || {
                go.wait();
                let mut n = 0u64;
                while budgets[2].moved().is_none() {
                    n += 1;
                    budgets[2].set_limit(LIMIT + n);
                }
                n
            })
        };
        let threads: Vec<_> = (0..6u64)
            .map(|t| {
                let go = go.clone();
                std::thread::spawn(move || {
                    go.wait();
                    // (reserved, in use, refusals) this thread leaves on each budget
                    let mut net = [(0u64, 0u64, 0u64); 3];
                    for i in 0..3_000u64 {
                        let d = ((i + t) % 3) as usize;
                        let b = &budgets[d];
                        let size = 1 + (i * 7919 + t * 104_729 + round) % 5_000;
                        if t == 5 && i == 1_000 {
                            b.set_limit(LIMIT - 1); // (the limit set while the figures move)
                        }
                        if i % 7 == 3 {
                            b.count_refusal();
                            net[d].2 += 1;
                        } else if b.try_reserve(size, LIMIT).is_ok() {
                            b.take(size);
                            match i % 3 {
                                0 => b.freed(size),
                                1 => {
                                    b.give(size);
                                    b.release(size);
                                }
                                _ => {
                                    net[d].0 += size;
                                    net[d].1 += size;
                                }
                            }
                        }
                    }
                    net
                })
            })
            .collect();
        go.wait();
        for _ in 0..(round % 8) * 200 {
            std::hint::spin_loop();
        }
        publish_budgets(budgets, |i| (i != 1).then(|| &entries[i]));
        let mut want = [(0u64, 0u64, 0u64); 3];
        for t in threads {
            for (w, n) in want.iter_mut().zip(t.join().unwrap()) {
                *w = (w.0 + n.0, w.1 + n.1, w.2 + n.2);
            }
        }
        for (d, b) in budgets.iter().enumerate() {
            let got = (b.reserved(), b.in_use(), b.refused());
            assert_eq!(got, want[d], "round {round}, device {d}");
            assert!(b.peak_reserved() >= want[d].0 && b.peak_in_use() >= want[d].1);
            let f = &entries[d];
            let published = (f.reserved.load(SeqCst), f.in_use.load(SeqCst), f.refused.load(SeqCst));
            assert_eq!(published, if d == 1 { (0, 0, 0) } else { want[d] }, "round {round}, device {d}");
            assert!(b.moved().is_some());
        }
        // the limit set meanwhile (device 0's: thread 5's step 1,000) was published
        assert_eq!((entries[0].limit.load(SeqCst), budgets[0].limit()), (LIMIT - 1, Some(LIMIT - 1)));
        let last = LIMIT + setter.join().unwrap();
        assert_eq!((entries[2].limit.load(SeqCst), budgets[2].limit()), (last, Some(last)), "round {round}");
        // a forked child's budget lets go of the published entry
        budgets[0].reset_after_fork();
        budgets[0].take(5);
        assert_eq!((budgets[0].in_use(), entries[0].in_use.load(SeqCst)), (5, want[0].1));
    }
}

/// The lane's reservation ([`Moved::try_reserve_within`]) against the budget's limit: none
/// while it is not resolved, exact at its edges (the largest limit included).
#[test]
fn moved_figures_reserve_within_the_limit_exactly() {
    let b: &'static [DeviceBudget] = Box::leak(vec![DeviceBudget::new()].into_boxed_slice());
    let entry: &'static Figures = Box::leak(Box::new(Figures::new()));
    publish_budgets(b, |_| Some(entry));
    let (b, m) = (&b[0], b[0].moved().unwrap());
    assert!(!m.try_reserve_within(b, 0) && !m.try_reserve_within(b, 1)); // not resolved
    b.set_limit(1000);
    assert!(!m.try_reserve_within(b, 1001) && !m.try_reserve_within(b, u64::MAX));
    assert_eq!(b.reserved(), 0);
    assert!(m.try_reserve_within(b, 1000));
    assert!(!m.try_reserve_within(b, 1));
    assert!(m.try_reserve_within(b, 0));
    assert_eq!((b.reserved(), entry.reserved.load(SeqCst)), (1000, 1000));
    m.release(600);
    assert!(m.try_reserve_within(b, 600) && !m.try_reserve_within(b, 1));
    m.release(1000);
    b.set_limit(u64::MAX); // (held as u64::MAX - 1)
    assert!(!m.try_reserve_within(b, u64::MAX));
    assert!(m.try_reserve_within(b, u64::MAX - 1 - 1000));
    assert!(m.try_reserve_within(b, 1000));
    assert!(!m.try_reserve_within(b, 1));
    assert_eq!((b.reserved(), b.peak_reserved()), (u64::MAX - 1, u64::MAX - 1));
}

/// A gate: closed, it waits for the update inside and holds new ones out; reopened after
/// its closure unwound; open and empty after a fork whatever it was left as.
#[test]
fn the_gate_waits_for_updates_inside_and_reopens() {
    let gate: &'static Gate = Box::leak(Box::new(Gate::new()));
    let inside = gate.enter().unwrap();
    let step = Arc::new(AtomicU64::new(0));
    let closer = {
        let step = step.clone();
        std::thread::spawn(move || gate.closed_for(|| step.fetch_add(1, SeqCst)).unwrap())
    };
    while !gate.closed.load(SeqCst) {
        std::hint::spin_loop();
    }
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert_eq!(step.load(SeqCst), 0); // (waiting for the update inside)
    // an update that comes while it is closed is held out until the closure has run
    let trying = Arc::new(AtomicBool::new(false));
    let late = {
        let (step, trying) = (step.clone(), trying.clone());
        std::thread::spawn(move || {
            trying.store(true, SeqCst);
            let _in = gate.enter().unwrap();
            step.fetch_add(10, SeqCst)
        })
    };
    while !trying.load(SeqCst) {
        std::hint::spin_loop();
    }
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert_eq!((step.load(SeqCst), gate.inside.load(SeqCst)), (0, 1));
    drop(inside);
    assert_eq!(closer.join().unwrap(), 0); // the closure ran before the late update
    assert_eq!(late.join().unwrap(), 1);
    assert_eq!((gate.inside.load(SeqCst), gate.closed.load(SeqCst)), (0, false));
    // a second closer waits for the first to open it: its closure runs after the first's
    // returned
    let first_done = Arc::new(AtomicBool::new(false));
    let (second, trying) = gate.closed_for(|| {
        let trying = Arc::new(AtomicBool::new(false));
        let other = {
            let (first_done, trying) = (first_done.clone(), trying.clone());
            std::thread::spawn(move || {
                trying.store(true, SeqCst);
                gate.closed_for(|| first_done.load(SeqCst)).unwrap()
            })
        };
        while !trying.load(SeqCst) {
            std::hint::spin_loop();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        first_done.store(true, SeqCst);
        (other, trying)
    })
    .unwrap();
    assert!(trying.load(SeqCst));
    assert!(second.join().unwrap());
    assert!(!gate.closed.load(SeqCst));
    // unwound: open again
    assert!(std::panic::catch_unwind(|| gate.closed_for(|| panic!("unwinds"))).is_err());
    assert!(!gate.closed.load(SeqCst));
    drop(gate.enter().unwrap());
    // left as a forked child finds it: open and empty
    std::mem::forget(gate.enter().unwrap());
    gate.closed.store(true, SeqCst);
    gate.reset_after_fork();
    assert_eq!((gate.inside.load(SeqCst), gate.closed.load(SeqCst)), (0, false));
    gate.closed_for(|| ()).unwrap();
}

/// The moving thread re-entered (as a signal handler that interrupted the move would,
/// here the move's own closure): an update or a second move finds the gate closed by its
/// own thread and is refused at once (it waited for ever); a reservation then is refused.
/// A move that waits for an update inside that never leaves gives up after the bound.
#[test]
fn the_gate_refuses_its_own_thread_at_once_and_bounds_the_move() {
    let gate: &'static Gate = Box::leak(Box::new(Gate::new()));
    let start = std::time::Instant::now();
    let inner = gate.closed_for(|| (gate.enter().err(), gate.closed_for(|| ()).err())).unwrap();
    assert_eq!(inner, (Some(Stuck::Reentered(GATE_WHAT)), Some(Stuck::Reentered(GATE_WHAT))));
    let b: &'static [DeviceBudget] = Box::leak(vec![DeviceBudget::new()].into_boxed_slice());
    let refused = GATE.closed_for(|| b[0].try_reserve(1, 10)).unwrap();
    assert_eq!(refused, Err(Refused { reserved: 0, limit: 10 }));
    assert!(start.elapsed() < std::time::Duration::from_secs(1), "{:?}", start.elapsed());
    let inside = gate.enter().unwrap();
    let short = std::time::Duration::from_millis(200);
    assert_eq!(gate.closed_for_within(short, || ()).err(), Some(Stuck::TimedOut(GATE_WHAT)));
    drop(inside);
    assert!(!gate.closed.load(SeqCst));
    gate.closed_for(|| ()).unwrap();
}

/// Limits set at once by several threads on moved figures: the figures show the limit in
/// force, the last stored, whatever the interleaving.
#[test]
fn limits_set_at_once_publish_the_one_in_force() {
    for round in 0..200u64 {
        let b: &'static [DeviceBudget] = Box::leak(vec![DeviceBudget::new()].into_boxed_slice());
        let entry: &'static Figures = Box::leak(Box::new(Figures::new()));
        publish_budgets(b, |_| Some(entry));
        let go = Arc::new(std::sync::Barrier::new(4));
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let go = go.clone();
                std::thread::spawn(move || {
                    go.wait();
                    for i in 0..50u64 {
                        b[0].set_limit(round * 1_000 + t * 100 + i);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(Some(entry.limit.load(SeqCst)), b[0].limit(), "round {round}");
    }
}

#[test]
fn pool_credits_wait_for_figures_taken_after_the_last_free() {
    let b = DeviceBudget::new();
    b.try_reserve(300, 1000).unwrap();
    b.take(300);
    let stale = b.pool_epoch();
    b.keep_in_pool(100);
    assert_eq!((b.in_use(), b.reserved(), b.pool_kept()), (200, 300, 100));
    b.pools_keep(0, stale); // figures read before that free: nothing credited
    assert_eq!((b.reserved(), b.pool_kept()), (300, 100));
    b.pools_keep(40, b.pool_epoch());
    assert_eq!((b.reserved(), b.pool_kept()), (240, 40));
    b.pools_keep(500, b.pool_epoch()); // never more than was counted
    assert_eq!((b.reserved(), b.pool_kept()), (240, 40));
}

#[test]
fn live_map_keys_are_per_kind() {
    let m = LiveMap::new();
    m.insert(Kind::DevicePtr, 0x1000, Live { device: 0, bytes: 5, served: false, pool: false, ctx: 0, id: 1 }).unwrap();
    m.insert(Kind::VmmHandle, 0x1000, Live { device: 1, bytes: 7, served: false, pool: false, ctx: 0, id: 2 }).unwrap();
    assert_eq!(m.remove(Kind::DevicePtr, 0x1000).unwrap(), Some(Live { device: 0, bytes: 5, served: false, pool: false, ctx: 0, id: 1 }));
    assert_eq!(m.remove(Kind::DevicePtr, 0x1000).unwrap(), None);
    assert_eq!(m.len(), 1);
    assert_eq!(m.remove(Kind::VmmHandle, 0x1000).unwrap(), Some(Live { device: 1, bytes: 7, served: false, pool: false, ctx: 0, id: 2 }));
}
