//! Unit tests of the `duty` pacer against a fake device: one stream that runs each launch for a
//! fixed time after the previous one, and events stamped when the stream reaches them.

use super::duty::*;
use crate::driver::ffi::*;
use gpushim_common::live;
use std::ffi::{c_float, c_uint};
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

/// The fake device: the stream's tail, the events' stamps (index = handle − 1), the kernels run.
struct Fake {
    tail: u64,
    stamps: Vec<u64>,
    kernels: Vec<(u64, u64)>,
}

static FAKE: Mutex<Fake> = Mutex::new(Fake { tail: 0, stamps: Vec::new(), kernels: Vec::new() });
/// Serialises the tests (one fake device).
static SERIAL: Mutex<()> = Mutex::new(());

fn fake() -> std::sync::MutexGuard<'static, Fake> {
    FAKE.lock().unwrap_or_else(|e| e.into_inner())
}

unsafe extern "C" fn create(e: *mut CUevent, _: c_uint) -> CUresult {
    let mut f = fake();
    f.stamps.push(u64::MAX);
    *e = f.stamps.len() as CUevent;
    CUDA_SUCCESS
}
unsafe extern "C" fn record(e: CUevent, _: CUstream) -> CUresult {
    let mut f = fake();
    let t = f.tail.max(now_ns());
    f.stamps[e as usize - 1] = t;
    CUDA_SUCCESS
}
unsafe extern "C" fn query(e: CUevent) -> CUresult {
    if fake().stamps[e as usize - 1] <= now_ns() { CUDA_SUCCESS } else { 600 }
}
unsafe extern "C" fn elapsed(ms: *mut c_float, a: CUevent, b: CUevent) -> CUresult {
    let f = fake();
    let (a, b) = (f.stamps[a as usize - 1], f.stamps[b as usize - 1]);
    *ms = (b.saturating_sub(a)) as f32 / 1e6;
    CUDA_SUCCESS
}
unsafe extern "C" fn destroy(_: CUevent) -> CUresult {
    CUDA_SUCCESS
}
unsafe extern "C" fn current(c: *mut CUcontext) -> CUresult {
    *c = 0x1000 as CUcontext;
    CUDA_SUCCESS
}

const API: EventApi = EventApi { create, record, query, elapsed, destroy, current, capture_mode: None };

fn launch(d: u64) {
    let mut f = fake();
    let start = f.tail.max(now_ns());
    f.tail = start + d;
    f.kernels.push((start, start + d));
}

/// An empty fake device, and new figures and clock.
fn fresh() -> (&'static live::Compute, &'static AtomicU64) {
    let mut f = fake();
    f.tail = 0;
    f.stamps.clear();
    f.kernels.clear();
    (Box::leak(Box::new(live::Compute::new())), Box::leak(Box::new(AtomicU64::new(0))))
}

/// Busy fraction of the fake device over [from, to).
fn busy(kernels: &[(u64, u64)], from: u64, to: u64) -> f64 {
    let ns: u64 = kernels.iter().map(|&(s, e)| e.min(to).saturating_sub(s.max(from))).sum();
    ns as f64 / (to - from) as f64
}

/// Launches kernels of `d` ns for `seconds` through a pacer of `share`; `sync`: waits for each.
/// Returns the kernels run, the start and the figures.
fn run(share: f64, d: u64, seconds: f64, sync: bool) -> (Vec<(u64, u64)>, u64, &'static live::Compute) {
    let (figures, clock) = fresh();
    let pacer = Pacer::new(share, clock, Some(figures), None);
    let start = now_ns();
    let end = start + (seconds * 1e9) as u64;
    while now_ns() < end {
        let ticket = pacer.before_launch(&API, std::ptr::null_mut());
        launch(d);
        pacer.after_launch(&API, std::ptr::null_mut(), ticket, true);
        if sync {
            let tail = fake().tail;
            while now_ns() < tail {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        }
    }
    let kernels = fake().kernels.clone();
    (kernels, start, figures)
}

fn check(share: f64, d: u64, sync: bool) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (kernels, start, figures) = run(share, d, 3.2, sync);
    let s = 1_000_000_000;
    for (a, b) in [(start + s, start + 3 * s), (start + s + s / 10, start + 3 * s + s / 10)] {
        let got = busy(&kernels, a, b);
        eprintln!("share {share} d {d} sync {sync}: {got:.4}");
        assert!((got - share).abs() <= 0.05, "share {share}, kernels of {d} ns, sync {sync}: {got:.3} over a 2 s window");
    }
    assert_eq!(figures.limit_ppm.load(std::sync::atomic::Ordering::Relaxed), (share * 1e6).round() as u64);
    assert!(figures.busy_ns.load(std::sync::atomic::Ordering::Relaxed) > 0);
}

#[test]
fn continuous_launches_get_their_share() {
    for share in [0.1, 0.5, 0.9] {
        check(share, 1_000_000, false);
    }
}

#[test]
fn synchronised_launches_get_their_share() {
    check(0.3, 2_000_000, true);
}

#[test]
fn tiny_and_huge_kernels_get_their_share() {
    check(0.3, 20_000, false);
    check(0.5, 200_000_000, false);
}

/// Launches from `threads` threads (each kernel of `d` ns, `d_after` after `switch_s` seconds)
/// for `seconds`; returns the share of the device over the window [from_s, to_s).
fn run_threads(share: f64, threads: usize, d: u64, d_after: u64, switch_s: f64, seconds: f64, from_s: f64, to_s: f64) -> f64 {
    let (figures, clock) = fresh();
    let pacer: &'static Pacer = Box::leak(Box::new(Pacer::new(share, clock, Some(figures), None)));
    let start = now_ns();
    let s = move |x: f64| start + (x * 1e9) as u64;
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            std::thread::spawn(move || {
                while now_ns() < s(seconds) {
                    let ticket = pacer.before_launch(&API, std::ptr::null_mut());
                    launch(if now_ns() < s(switch_s) { d } else { d_after });
                    pacer.after_launch(&API, std::ptr::null_mut(), ticket, true);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    busy(&fake().kernels, s(from_s), s(to_s))
}

#[test]
fn threads_launching_at_once_share_one_turn() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let got = run_threads(0.1, 16, 100_000_000, 100_000_000, 0.0, 4.0, 1.0, 3.0);
    assert!(got <= 0.15, "16 threads of 100 ms kernels at 10%: {got:.3}");
}

#[test]
fn kernels_that_grow_at_once_queue_little_ahead() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // 10 µs kernels, then 100 ms ones: at most MAX_IN_FLIGHT of them go before the first is
    // measured (1.6 s of work here); the debt is then paid, and over a few seconds the share
    // holds
    let got = run_threads(0.5, 1, 10_000, 100_000_000, 0.5, 5.0, 1.0, 5.0);
    assert!(got <= 0.55, "a 10,000-fold growth at 50%: {got:.3} over [1 s, 5 s)");
}

#[test]
fn a_forked_child_counts_its_own_figures() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (published, clock) = fresh();
    let pacer = Pacer::new(0.5, clock, Some(published), None);
    for _ in 0..3 {
        let ticket = pacer.before_launch(&API, std::ptr::null_mut());
        launch(1_000);
        pacer.after_launch(&API, std::ptr::null_mut(), ticket, true);
    }
    std::thread::sleep(std::time::Duration::from_millis(2));
    // (a fourth launch measures the first three)
    let ticket = pacer.before_launch(&API, std::ptr::null_mut());
    launch(1_000);
    pacer.after_launch(&API, std::ptr::null_mut(), ticket, true);
    let counted = published.launches.load(std::sync::atomic::Ordering::Relaxed);
    assert!(counted >= 3, "{counted}");
    // as the shim's fork handler does in the child
    pacer.reset_after_fork();
    assert!(!std::ptr::eq(pacer.figures(), published));
    assert_eq!(pacer.figures().launches.load(std::sync::atomic::Ordering::Relaxed), 0);
    assert_eq!(pacer.figures().limit_ppm.load(std::sync::atomic::Ordering::Relaxed), 500_000);
    std::thread::sleep(std::time::Duration::from_millis(2));
    for _ in 0..2 {
        let ticket = pacer.before_launch(&API, std::ptr::null_mut());
        launch(1_000);
        pacer.after_launch(&API, std::ptr::null_mut(), ticket, true);
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    // the parent's entry is left as it was; the child's own launch was measured
    assert_eq!(published.launches.load(std::sync::atomic::Ordering::Relaxed), counted);
    assert!(pacer.figures().launches.load(std::sync::atomic::Ordering::Relaxed) >= 1);
}

static FORGOTTEN_UP_TO: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static STALE_RECORDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// `record`, counting records of events made before the last `forget_context`.
unsafe extern "C" fn record_checked(e: CUevent, s: CUstream) -> CUresult {
    if (e as usize) <= FORGOTTEN_UP_TO.load(std::sync::atomic::Ordering::SeqCst) {
        STALE_RECORDS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    record(e, s)
}

/// A launch waiting for its turn (at 1 %, ~100 ms) while its context is forgotten by another
/// thread (`cuCtxDestroy`): it never records the forgotten context's events (those of a
/// measured launch handed on to it are back in the pool while it sleeps).
#[test]
fn a_waiting_launch_never_records_a_forgotten_contexts_events() {
    use std::sync::atomic::Ordering::SeqCst;
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let api = EventApi { record: record_checked, ..API };
    let (figures, clock) = fresh();
    FORGOTTEN_UP_TO.store(0, SeqCst);
    STALE_RECORDS.store(0, SeqCst);
    let pacer: &'static Pacer = Box::leak(Box::new(Pacer::new(0.01, clock, Some(figures), None)));
    let t = pacer.before_launch(&api, std::ptr::null_mut());
    launch(1_000_000);
    pacer.after_launch(&api, std::ptr::null_mut(), t, true);
    std::thread::sleep(std::time::Duration::from_millis(3));
    let waiter = std::thread::spawn(move || {
        let t = pacer.before_launch(&api, std::ptr::null_mut());
        launch(1_000_000);
        pacer.after_launch(&api, std::ptr::null_mut(), t, true);
    });
    std::thread::sleep(std::time::Duration::from_millis(15));
    let made = fake().stamps.len();
    pacer.forget_context(0x1000, Some(destroy));
    FORGOTTEN_UP_TO.store(made, SeqCst);
    waiter.join().unwrap();
    assert_eq!(STALE_RECORDS.load(SeqCst), 0, "events of the forgotten context recorded after it went ({made} made before)");
}

/// A legitimate debt of more than a day (a 1 s kernel at 0.001 %: 28 hours) is kept (capped at
/// half a day), never taken for a corrupt clock and reset: the next launch waits.
#[test]
fn a_debt_of_days_is_kept_not_reset() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (figures, clock) = fresh();
    let pacer: &'static Pacer = Box::leak(Box::new(Pacer::new(0.00001, clock, Some(figures), None)));
    let t = pacer.before_launch(&API, std::ptr::null_mut());
    launch(1_000_000_000);
    pacer.after_launch(&API, std::ptr::null_mut(), t, true);
    // the next launch measures the first once it completed, and must then wait
    let done = Box::leak(Box::new(std::sync::atomic::AtomicBool::new(false)));
    let flag: &'static std::sync::atomic::AtomicBool = done;
    std::thread::spawn(move || {
        let t = pacer.before_launch(&API, std::ptr::null_mut());
        flag.store(true, std::sync::atomic::Ordering::SeqCst);
        pacer.after_launch(&API, std::ptr::null_mut(), t, false);
    });
    std::thread::sleep(std::time::Duration::from_millis(1_500));
    assert!(!done.load(std::sync::atomic::Ordering::SeqCst), "a launch went 0.5 s after a 1 s kernel at 0.001 %");
    let ahead = clock.load(std::sync::atomic::Ordering::SeqCst).saturating_sub(now_ns());
    assert!(ahead > 3_600_000_000_000 && ahead <= MAX_LEAD / 2, "the debt: {} s ahead", ahead / 1_000_000_000);
}

/// Two pacers (two processes, 30 % and 70 %) launching 500 µs kernels flat out on one fake GPU
/// for 1.5 s: the fraction of launches made while the other's work was still in the device.
fn overlapped_launches(turns: bool) -> f64 {
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    let _ = fresh();
    let word: &'static AtomicU64 = Box::leak(Box::new(AtomicU64::new(0)));
    let ends: &'static [AtomicU64; 2] = Box::leak(Box::new([AtomicU64::new(0), AtomicU64::new(0)]));
    let counts: &'static [AtomicUsize; 2] = Box::leak(Box::new([AtomicUsize::new(0), AtomicUsize::new(0)]));
    let stop = now_ns() + 1_500_000_000;
    let handles: Vec<_> = [0.3, 0.7]
        .into_iter()
        .enumerate()
        .map(|(me, share)| {
            std::thread::spawn(move || {
                let (figures, clock) = (Box::leak(Box::new(live::Compute::new())), Box::leak(Box::new(AtomicU64::new(0))));
                let pacer = Pacer::new(share, clock, Some(figures), turns.then_some(word));
                while now_ns() < stop {
                    let ticket = pacer.before_launch(&API, std::ptr::null_mut());
                    let now = now_ns();
                    {
                        let mut f = fake();
                        // (20 µs: the claim's end is kept in 4 µs units, and estimates are means)
                        if ends[1 - me].load(Relaxed) > now + 20_000 {
                            counts[1].fetch_add(1, Relaxed);
                        }
                        counts[0].fetch_add(1, Relaxed);
                        let start = f.tail.max(now);
                        f.tail = start + 500_000;
                        ends[me].store(start + 500_000, Relaxed);
                    }
                    pacer.after_launch(&API, std::ptr::null_mut(), ticket, true);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    counts[1].load(Relaxed) as f64 / counts[0].load(Relaxed).max(1) as f64
}

#[test]
fn two_pacers_on_one_gpu_take_turns() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let with = overlapped_launches(true);
    let without = overlapped_launches(false);
    eprintln!("launches while the other's work was in the device: {with:.3} with turns, {without:.3} without");
    assert!(with < 0.05, "{with:.3} of the launches went while the other pacer's work was in the device");
    assert!(without > 0.2, "without turns the two overlap ({without:.3}): the test would not see turns missing");
}

#[test]
fn a_claim_that_never_ends_costs_one_launch_a_second_then_nothing() {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (figures, clock) = fresh();
    let word: &'static AtomicU64 = Box::leak(Box::new(AtomicU64::new(0)));
    let stop: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    // a stuck (or hostile) claimant keeps its claim 100 ms ahead, forever
    let holder = std::thread::spawn(move || {
        let them = crate::compute::turns::Turns::new(word);
        while !stop.load(Relaxed) {
            them.claim(now_ns(), 100_000_000);
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    });
    std::thread::sleep(std::time::Duration::from_millis(5));
    let pacer = Pacer::new(0.9, clock, Some(figures), Some(word));
    let go = |n: usize| {
        let t0 = now_ns();
        for _ in 0..n {
            let ticket = pacer.before_launch(&API, std::ptr::null_mut());
            launch(10_000);
            pacer.after_launch(&API, std::ptr::null_mut(), ticket, true);
        }
        (now_ns() - t0) as f64 / 1e9
    };
    let first = go(1);
    let next = go(200);
    stop.store(true, Relaxed);
    holder.join().unwrap();
    assert!((0.95..2.5).contains(&first), "the first launch waited {first:.3} s for the stuck claim (1 s expected)");
    assert!(next < 0.5, "200 launches of 10 µs took {next:.3} s after turns were given up");
}
