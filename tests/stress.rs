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
    check_modes(&[NoShim, Passthrough, Grow, Preallocate]);
}

/// The same, many times over (1,500 runs of `grow`, about a minute): how the threads interleave
/// depends on the machine's load, and the rare interleavings are the ones that found defects
/// (a torn-down context's memory credited before the driver gave it back, see
/// `memory_of_a_context_being_torn_down_is_not_allocated_twice`; about 1 run in 130 before
/// that fix). Run it with `cargo test --release --test stress -- --ignored`.
#[test]
#[ignore = "long: many repetitions of the stress test (run by hand after changes to accounting)"]
fn many_runs_in_grow_mode() {
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

/// A context torn down in one thread while another thread is handed its addresses again,
/// before the driver has given the old memory back (`tests/c/teardown_race.c`; the simulated
/// driver pauses there for `GPUSIM_TEARDOWN_DELAY_MS`). The reuse proves the old allocation
/// gone, but not its memory: crediting it at once let the second thread allocate it twice
/// (found by the grow-mode stress test: the driver held one grow chunk over the limit). The
/// shim now applies such credits once the teardown has returned. Both ways the memory is
/// reached: a served block in `grow` (a stale reserve chunk) and a counted allocation
/// (`cuMemAllocManaged`, a stale live entry).
#[test]
fn memory_of_a_context_being_torn_down_is_not_allocated_twice() {
    // (API, filler, own, again, in MiB): the filler and the torn-down context's allocation
    // leave exactly room for `again`, which the driver places where the torn-down one was.
    let cases: [(&str, MemoryMode, [u64; 3]); 5] = [
        ("alloc", Grow, [24, 8, 8]),       // chunks: 24 MiB, 20 MiB, 20 MiB again
        ("alloc", Passthrough, [32, 16, 16]), // one device: the fast lane (`src/accounting/lane.rs`)
        ("managed", Grow, [32, 16, 16]),
        ("managed", Passthrough, [32, 16, 16]),
        ("managed", NoShim, [32, 16, 16]),
    ];
    for (api, mode, [filler, own, again]) in cases {
        if !MemoryMode::selected(&[mode]).contains(&mode) {
            continue;
        }
        let what = format!("{api} {mode:?}");
        let out = Run::program(Program::TeardownRace)
            .env("GPUSIM_DEVICES", "1")
            .env("GPUSIM_MEMORY", "4GiB")
            .env("GPUSIM_TEARDOWN_DELAY_MS", "1500")
            .env("GPUSHIM_MEMORY_LIMIT", "64MiB")
            .args([api, &filler.to_string(), &own.to_string(), &again.to_string()])
            .mode(mode)
            .run();
        out.assert_completed();
        for key in ["init.rc", "filler.rc", "own.rc", "again.rc", "destroy.rc"] {
            assert_eq!(out.num(key), 0, "{what}: {key}\n{}", out.dump());
        }
        // the scenario happened: the torn-down context's addresses were handed out again while
        // its memory was still held
        assert_eq!(out.num("reuse"), 1, "{what}: the driver did not hand the torn-down addresses out again\n{}", out.dump());
        let peak = out.report().device(0).peak;
        if mode == NoShim {
            assert_eq!((out.u64("fill.bytes"), out.num("fill.refused")), (64 * MIB, 0), "{what}\n{}", out.dump());
            assert!(peak > LIMIT, "{what}: without the shim the same calls pass the limit ({peak})");
            continue;
        }
        assert!(peak <= LIMIT, "{what}: the driver held {peak} bytes, limit {LIMIT}\n{}", out.dump());
        assert_eq!(out.num("fill.refused"), 1, "{what}\n{}", out.dump());
        // (else the scenario ran after the destroy had returned: nothing was tested)
        assert_eq!(out.num("fill.during_destroy"), 1, "{what}: the destroy returned too early\n{}", out.dump());
        // the credits that waited for the destroy were applied once it returned: the limit
        // minus what the program still holds (the reserve's chunks in grow) is free again
        let held = if api == "alloc" && mode == Grow { filler + 20 } else { filler + again + out.u64("fill.bytes") / MIB };
        assert_eq!(out.u64("after.bytes"), (64 - held) * MIB, "{what}: the torn-down memory is free again\n{}", out.dump());
    }
}
