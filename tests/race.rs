//! The limit holds exactly under concurrency: 8 threads allocating and freeing random sizes
//! never push the simulator's peak above the limit, and everything is back at the end.

mod common;

use common::*;

const LIMIT: u64 = 64 * MIB;
const THREADS: &str = "8";
const ITERATIONS: &str = "4000";
const MAX_BYTES: u64 = 12 * MIB;
const HELD: &str = "4";

fn race(shim: bool) -> RunOutput {
    let out = Run::program(Program::Race)
        .env("GPUSIM_DEVICES", "1")
        .env("GPUSIM_MEMORY", "4GiB")
        .env("GPUSHIM_MEMORY_LIMIT", "64MiB")
        .args([THREADS, ITERATIONS, &MAX_BYTES.to_string(), HELD])
        .shim(shim)
        .run();
    out.assert_completed();
    assert_eq!(out.num("init.rc"), 0, "{}", out.dump());
    assert_eq!(
        out.num("errors"),
        0,
        "allocations failed with other errors\n{}",
        out.dump()
    );
    assert_eq!(out.num("free_errors"), 0, "frees failed\n{}", out.dump());
    assert_eq!(
        out.num("frees"),
        out.num("successes"),
        "every allocation freed once\n{}",
        out.dump()
    );
    let dev = out.report().device(0);
    assert_eq!(dev.used, 0, "memory in use at exit\n{}", out.dump());
    assert_eq!(dev.allocs, dev.frees, "{}", out.dump());
    out
}

#[test]
fn limit_holds_under_contention() {
    // Without the shim the same workload goes above the limit: it is really contended.
    let plain = race(false);
    assert_eq!(plain.num("refusals"), 0, "{}", plain.dump());
    let peak = plain.report().device(0).peak;
    assert!(
        peak > LIMIT,
        "the workload never exceeds {LIMIT} (peak {peak}); make it heavier"
    );

    let out = race(true);
    let dev = out.report().device(0);
    assert!(
        dev.peak <= LIMIT,
        "peak {} above the limit {LIMIT}\n{}",
        dev.peak,
        out.dump()
    );
    let refusals = out.num("refusals");
    assert!(
        refusals > 0,
        "no refusals: the limit was never contended\n{}",
        out.dump()
    );
    assert!(out.num("successes") > 1000, "{}", out.dump());
    assert_eq!(out.u64("info.total"), LIMIT, "{}", out.dump());
    assert_eq!(
        out.u64("info.free"),
        LIMIT,
        "everything freed, all of the limit free again\n{}",
        out.dump()
    );
    // Every refusal may be logged, or the log may be rate-limited; at least one must be there.
    let warns = out.warn_lines();
    assert!(
        !warns.is_empty() && warns.len() as i64 <= refusals,
        "{} warnings for {refusals} refusals\n{}",
        warns.len(),
        out.dump()
    );
    for line in &warns {
        assert_mentions_device(line, 0);
        assert_mentions_numbers(line, &[LIMIT]);
    }
}

/// The same under several processes' worth of repetition: the result is stable.
#[test]
fn limit_holds_repeatedly() {
    for _ in 0..5 {
        let out = race(true);
        assert!(out.report().device(0).peak <= LIMIT, "{}", out.dump());
        assert_eq!(out.u64("info.free"), LIMIT, "{}", out.dump());
    }
}
