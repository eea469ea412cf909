//! The host-function worker: one thread per process, started by the first host function
//! (`cuLaunchHostFunc`, `cuStreamAddCallback`), never at load. It runs each function when its
//! stream reaches it (its scheduled time), earliest first and in submission order among equal
//! times, so every stream's functions run in stream order; then it tells `timeline` the real
//! return time (later work of that stream starts no earlier).

use crate::timeline::{self, Key};
use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// A function to run, with the raw pointers the application gave (they are its business).
pub struct Job {
    pub key: Key,
    pub ctx: u64,
    /// The physical device of its stream (whose solo clock `at` is on).
    pub p: usize,
    pub run: Box<dyn FnOnce() + Send>,
}

struct Queue {
    jobs: BTreeMap<(u64, u64), Job>,
    seq: u64,
    /// The process that owns the worker (a forked child starts its own).
    pid: u32,
}

static QUEUE: Mutex<Option<Queue>> = Mutex::new(None);
static WAKE: Condvar = Condvar::new();

/// Queues `job` to run at `at` (CLOCK_MONOTONIC ns), starting the worker if this process has
/// none yet.
pub fn push(at: u64, job: Job) {
    let pid = std::process::id();
    let mut g = QUEUE.lock().unwrap_or_else(|e| e.into_inner());
    let start = g.as_ref().is_none_or(|q| q.pid != pid);
    if start {
        *g = Some(Queue { jobs: BTreeMap::new(), seq: 0, pid });
    }
    let Some(q) = g.as_mut() else { return };
    q.seq += 1;
    let seq = q.seq;
    q.jobs.insert((at, seq), job);
    drop(g);
    if start && std::thread::Builder::new().name("gpusim-hostfn".into()).spawn(worker).is_err() {
        // No thread: run what is queued here, now (the order is kept).
        run_all_now();
    }
    WAKE.notify_all();
}

fn run_all_now() {
    loop {
        let job = QUEUE.lock().unwrap_or_else(|e| e.into_inner()).as_mut().and_then(|q| q.jobs.pop_first()).map(|(_, j)| j);
        let Some(job) = job else { return };
        run(job);
    }
}

fn run(job: Job) {
    let (key, ctx, p) = (job.key, job.ctx, job.p);
    (job.run)();
    timeline::host_done(key, ctx, timeline::clock(p));
}

fn worker() {
    loop {
        let mut g = QUEUE.lock().unwrap_or_else(|e| e.into_inner());
        // (each job's time is on its device's solo clock: the first, in order, whose device
        // has reached it runs; a stream's jobs are in order on one device)
        let mut due = None;
        let mut wait = 100_000_000u64;
        if let Some(q) = g.as_ref() {
            let mut clocks: Vec<(usize, u64)> = Vec::new();
            for (&(at, seq), job) in &q.jobs {
                let c = match clocks.iter().find(|(p, _)| *p == job.p) {
                    Some(&(_, c)) => c,
                    None => {
                        let c = timeline::clock(job.p);
                        clocks.push((job.p, c));
                        c
                    }
                };
                if at <= c {
                    due = Some((at, seq));
                    break;
                }
                wait = wait.min((at - c).min(2_000_000));
            }
        }
        match due {
            Some(k) => {
                let job = g.as_mut().and_then(|q| q.jobs.remove(&k));
                drop(g);
                if let Some(job) = job {
                    run(job);
                }
            }
            None => drop(WAKE.wait_timeout(g, Duration::from_nanos(wait)).unwrap_or_else(|e| e.into_inner())),
        }
    }
}
