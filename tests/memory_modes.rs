//! `GPUSHIM_MEMORY_MODE`: `grow` and `preallocate` serve cuMemAlloc_v2 and cuMemAllocPitch_v2
//! from the shim's own reserve (the v1 ABI passes through), with exact figures — chunk sizes, reuse,
//! placement (512-byte granule, best fit), what the driver sees (the simulator's call counts
//! and bytes in use, in the middle of a run and at exit), cuMemGetInfo, the pointer queries,
//! IPC, frees of interior pointers, data integrity of neighbouring sub-allocations, a
//! randomized workload, the real CUDA runtime, threads, and contexts that are destroyed.
//!
//! Every case also runs without the shim and/or in `passthrough` mode, where the same program
//! gives other numbers (each driver allocation reaches the driver), so every test can fail.
//!
//! The program is `tests/c/modes.c` (linked with `-lcuda`; it makes no context until told to),
//! on the simulated driver with 2 devices of 16 GiB; `sim=P` prints the simulator's state.

mod common;

use common::MemoryMode::{Grow, NoShim, Passthrough, Preallocate};
use common::*;

const LIMIT: u64 = GIB;
const GRANULE: u64 = 512;

/// CUDA_ERROR_INVALID_VALUE
const INVALID_VALUE: i64 = 1;
/// CUDA_ERROR_NOT_FOUND
const NOT_FOUND: i64 = 500;
/// CUDA_ERROR_NOT_SUPPORTED
const NOT_SUPPORTED: i64 = 801;

macro_rules! args {
    ($($a:expr),* $(,)?) => { vec![$($a.to_string()),*] };
}

fn alloc(bytes: u64) -> String {
    format!("alloc=mem:{bytes}")
}

/// `tests/c/modes.c` in `mode` with `GPUSHIM_MEMORY_LIMIT=limit` (and `env`), the shim's JSON
/// report asked; the program must have completed and initialised CUDA.
fn run_env(mode: MemoryMode, limit: &str, env: &[(&str, &str)], args: &[String]) -> RunOutput {
    let out = Run::program(Program::Modes)
        .env("GPUSIM_DEVICES", "2")
        .env("GPUSIM_MEMORY", "16GiB")
        .env("GPUSHIM_MEMORY_LIMIT", limit)
        .envs(env)
        .args(args)
        .mode(mode)
        .with_shim_report()
        .run();
    out.assert_completed();
    assert_eq!(out.num("init.rc"), 0, "{mode:?}: CUDA init\n{}", out.dump());
    out
}

fn run(mode: MemoryMode, args: &[String]) -> RunOutput {
    run_env(mode, "1GiB", &[], args)
}

fn num(out: &RunOutput, op: usize, key: &str) -> i64 {
    out.num(&format!("op{op}.{key}"))
}

fn unum(out: &RunOutput, op: usize, key: &str) -> u64 {
    out.u64(&format!("op{op}.{key}"))
}

/// `opN.rc` is `want` for every (N, want).
fn assert_rcs(out: &RunOutput, mode: MemoryMode, checks: &[(usize, i64)]) {
    for &(op, want) in checks {
        assert_eq!(
            num(out, op, "rc"),
            want,
            "{mode:?}: op{op}.rc\n{}",
            out.dump()
        );
    }
}

/// `opN.rc` is 0 for every N.
fn assert_ok(out: &RunOutput, mode: MemoryMode, ops: impl IntoIterator<Item = usize>) {
    for op in ops {
        assert_eq!(num(out, op, "rc"), 0, "{mode:?}: op{op}.rc\n{}", out.dump());
    }
}

/// `opN.KEY` (unsigned) is `want`.
fn assert_at(out: &RunOutput, mode: MemoryMode, op: usize, key: &str, want: u64) {
    assert_eq!(
        unum(out, op, key),
        want,
        "{mode:?}: op{op}.{key}\n{}",
        out.dump()
    );
}

/// `opN.KEY` (signed) is `want`.
fn assert_snum(out: &RunOutput, mode: MemoryMode, op: usize, key: &str, want: i64) {
    assert_eq!(
        num(out, op, key),
        want,
        "{mode:?}: op{op}.{key}\n{}",
        out.dump()
    );
}

/// At `sim=0` operation `op`: the simulator's calls of `name`.
fn calls(out: &RunOutput, op: usize, name: &str) -> u64 {
    unum(out, op, &format!("calls.{name}"))
}

fn assert_calls(out: &RunOutput, mode: MemoryMode, op: usize, name: &str, want: u64) {
    assert_eq!(
        calls(out, op, name),
        want,
        "{mode:?}: op{op}: calls of {name}\n{}",
        out.dump()
    );
}

/// At `sim=P` operation `op`: the simulator's bytes in use on P.
fn assert_sim_used(out: &RunOutput, mode: MemoryMode, op: usize, want: u64) {
    assert_at(out, mode, op, "used", want);
}

/// No gpushim line at all.
fn assert_quiet(out: &RunOutput, mode: MemoryMode) {
    assert!(
        out.gpushim_lines().is_empty(),
        "{mode:?}: gpushim said something\n{}",
        out.dump()
    );
}

/// One refusal warning per `(request, limit)`, in order: `device 0: WHAT of N bytes refused: U
/// bytes in use, limit L bytes`.
/// (preallocate's one-time explanation of an unserved refusal is checked on its own.)
fn assert_refusals(out: &RunOutput, mode: MemoryMode, refusals: &[(u64, u64)]) {
    let warns: Vec<String> = out.warn_lines().into_iter().filter(|l| !l.contains("not served from that reserve")).collect();
    assert_eq!(
        warns.len(),
        refusals.len(),
        "{mode:?}: one warning per refusal {refusals:?}\n{}",
        out.dump()
    );
    for (line, &(request, limit)) in warns.iter().zip(refusals) {
        assert_mentions_device(line, 0);
        assert!(line.contains(" refused: "), "{mode:?}: `{line}`");
        assert_mentions_numbers(line, &[request, limit]);
    }
}

/// The shim's report of device 0: (peak in use, peak reserved, refused); None without the shim.
fn shim_figures(out: &RunOutput) -> Option<(u64, u64, u64)> {
    out.shim_report.as_ref().map(|r| {
        let d = r.device(0);
        (d.peak_in_use, d.peak_reserved, d.refused)
    })
}

fn assert_shim_figures(out: &RunOutput, mode: MemoryMode, want: (u64, u64, u64)) {
    assert_eq!(
        shim_figures(out),
        Some(want),
        "{mode:?}: (peak in use, peak reserved, refused)\n{}",
        out.dump()
    );
}

// ---------------------------------------------------------------------------------------
// grow: reuse, limit, chunk sizes, placement
// ---------------------------------------------------------------------------------------

/// grow: a freed MiB is reused at the same address, the driver saw one cuMemAlloc_v2 (a 2 MiB
/// chunk) and no free, and still holds the chunk at exit; without the shim and in passthrough
/// every allocation and free reaches the driver.
#[test]
fn grow_reuses_freed_memory() {
    // 1 ctx, 2 alloc 1M, 3 free=2, 4 alloc 1M, 5 diff=2,4, 6 sim=0, 7 free=4, 8 sim=0
    let args = args![
        "ctx=primary",
        alloc(MIB),
        "free=2",
        alloc(MIB),
        "diff=2,4",
        "sim=0",
        "free=4",
        "sim=0"
    ];
    for mode in MemoryMode::selected(&[NoShim, Passthrough, Grow]) {
        let out = run(mode, &args);
        assert_ok(&out, mode, [1, 2, 3, 4, 7]);
        assert_quiet(&out, mode);
        let report = out.report();
        if mode == Grow {
            assert_snum(&out, mode, 5, "diff", 0);
            for op in [6, 8] {
                assert_calls(&out, mode, op, "cuMemAlloc_v2", 1);
                assert_calls(&out, mode, op, "cuMemFree_v2", 0);
                assert_sim_used(&out, mode, op, 2 * MIB);
            }
            assert_eq!(report.calls("cuMemAlloc_v2"), 1, "{}", out.dump());
            assert_eq!(report.calls("cuMemFree_v2"), 0, "{}", out.dump());
            assert_eq!(
                report.device(0).used,
                2 * MIB,
                "the chunk is kept\n{}",
                out.dump()
            );
            assert_shim_figures(&out, mode, (MIB, 2 * MIB, 0));
        } else {
            assert_calls(&out, mode, 6, "cuMemAlloc_v2", 2);
            assert_calls(&out, mode, 6, "cuMemFree_v2", 1);
            assert_sim_used(&out, mode, 6, MIB);
            assert_calls(&out, mode, 8, "cuMemAlloc_v2", 2);
            assert_calls(&out, mode, 8, "cuMemFree_v2", 2);
            assert_sim_used(&out, mode, 8, 0);
            assert_eq!(report.device(0).used, 0, "{}", out.dump());
            if mode == Passthrough {
                assert_shim_figures(&out, mode, (MIB, MIB, 0));
            }
        }
    }
}

/// grow, limit 1 GiB: 600 MiB, a second 600 MiB is refused (the limit bounds what the shim
/// reserves), and after the first is freed a new 600 MiB is served from the reserve, at the
/// same address, with no new driver allocation.
#[test]
fn grow_limit_and_reuse() {
    const R: u64 = 600 * MIB;
    // 1 ctx, 2 alloc, 3 alloc (refused with the shim), 4 free=2, 5 alloc, 6 diff=2,5, 7 sim=0, 8 info
    let args = args![
        "ctx=primary",
        alloc(R),
        alloc(R),
        "free=2",
        alloc(R),
        "diff=2,5",
        "sim=0",
        "info"
    ];
    for mode in MemoryMode::selected(&[NoShim, Passthrough, Grow]) {
        let out = run(mode, &args);
        assert_ok(&out, mode, [1, 2, 4, 5, 8]);
        match mode {
            NoShim => {
                assert_rcs(&out, mode, &[(3, 0)]);
                assert_calls(&out, mode, 7, "cuMemAlloc_v2", 3);
                assert_sim_used(&out, mode, 7, 2 * R);
                assert_at(&out, mode, 8, "total", 16 * GIB);
                assert_quiet(&out, mode);
            }
            _ => {
                assert_rcs(&out, mode, &[(3, OOM)]);
                assert_refusals(&out, mode, &[(R, LIMIT)]);
                assert_mentions_numbers(&out.warn_lines()[0], &[R]); // in use (= reserved) 600 MiB
                let driver_allocs = if mode == Grow { 1 } else { 2 };
                assert_calls(&out, mode, 7, "cuMemAlloc_v2", driver_allocs);
                assert_sim_used(&out, mode, 7, R);
                assert_at(&out, mode, 8, "total", LIMIT);
                assert_at(&out, mode, 8, "free", LIMIT - R);
                assert_shim_figures(&out, mode, (R, R, 1));
                if mode == Grow {
                    assert_snum(&out, mode, 6, "diff", 0);
                    assert_calls(&out, mode, 7, "cuMemFree_v2", 0);
                }
            }
        }
    }
}

/// grow: the chunk taken from the driver for a rounded request r that fits nowhere in the
/// reserve: r <= 1 MiB -> 2 MiB; r <= 10 MiB -> 20 MiB; else r rounded up to 2 MiB; capped at
/// limit - reserved but never below r (else out of memory). Requests that fit are served best
/// fit, without the driver.
#[test]
fn grow_chunk_sizes() {
    // limit 1 GiB
    //  1 ctx        2 alloc 1 -> chunk 2M            3 sim
    //  4 alloc 2M   -> chunk 20M                     5 sim
    //  6 alloc 19M  -> chunk 20M (nothing fits)      7 sim
    //  8 alloc 3M+1 -> the 18M left of chunk 2       9 sim
    // 10 alloc 1M   -> exactly the 1M left of chunk 3 (best fit)   11 diff=6,10 (19M)
    // 12 alloc 1M+1 -> the 2M-512 left of chunk 1 (best fit)       13 diff=2,12 (512)
    // 14 sim        15 alloc 900M -> chunk 900M      16 sim
    let args = args![
        "ctx=primary",
        alloc(1),
        "sim=0",
        alloc(2 * MIB),
        "sim=0",
        alloc(19 * MIB),
        "sim=0",
        alloc(3 * MIB + 1),
        "sim=0",
        alloc(MIB),
        "diff=6,10",
        alloc(MIB + 1),
        "diff=2,12",
        "sim=0",
        alloc(900 * MIB),
        "sim=0",
    ];
    for mode in MemoryMode::selected(&[Passthrough, Grow]) {
        let out = run(mode, &args);
        assert_ok(&out, mode, [1, 2, 4, 6, 8, 10, 12, 15]);
        assert_quiet(&out, mode);
        let expect: [(usize, u64, u64); 5] = if mode == Grow {
            [
                (3, 1, 2 * MIB),
                (5, 2, 22 * MIB),
                (7, 3, 42 * MIB),
                (9, 3, 42 * MIB),
                (14, 3, 42 * MIB),
            ]
        } else {
            [
                (3, 1, 1),
                (5, 2, 1 + 2 * MIB),
                (7, 3, 1 + 21 * MIB),
                (9, 4, 2 + 24 * MIB),
                (14, 6, 3 + 26 * MIB),
            ]
        };
        for (op, allocs, used) in expect {
            assert_calls(&out, mode, op, "cuMemAlloc_v2", allocs);
            assert_sim_used(&out, mode, op, used);
        }
        if mode == Grow {
            assert_snum(&out, mode, 11, "diff", 19 * MIB as i64);
            assert_snum(&out, mode, 13, "diff", GRANULE as i64);
            assert_calls(&out, mode, 16, "cuMemAlloc_v2", 4);
            assert_sim_used(&out, mode, 16, 942 * MIB);
            let in_use = 512 + 2 * MIB + 19 * MIB + 3 * MIB + 512 + MIB + MIB + 512 + 900 * MIB;
            assert_shim_figures(&out, mode, (in_use, 942 * MIB, 0));
        }
    }

    // limit 40 MiB: the cap
    //  1 ctx   2 alloc 1 -> 2M   3 alloc 5M -> 20M   4 alloc 12M (fits)   5 sim
    //  6 alloc 4M: nothing fits, nominal 20M, capped at 40M - 22M = 18M   7 sim
    //  8 alloc 14M (exactly what is left of the 18M chunk)   9 alloc 1   10 alloc 3M (exact fit)
    // 11 alloc 2M: nothing fits, nothing left under the limit -> refused   12 sim   13 info
    let args = args![
        "ctx=primary",
        alloc(1),
        alloc(5 * MIB),
        alloc(12 * MIB),
        "sim=0",
        alloc(4 * MIB),
        "sim=0",
        alloc(14 * MIB),
        alloc(1),
        alloc(3 * MIB),
        alloc(2 * MIB),
        "sim=0",
        "info",
    ];
    for mode in MemoryMode::selected(&[Passthrough, Grow]) {
        let out = run_env(mode, "40MiB", &[], &args);
        assert_ok(&out, mode, [1, 2, 3, 4, 6, 13]);
        if mode == Grow {
            assert_ok(&out, mode, [8, 9, 10]);
            assert_rcs(&out, mode, &[(11, OOM)]);
            assert_refusals(&out, mode, &[(2 * MIB, 40 * MIB)]);
            assert_calls(&out, mode, 5, "cuMemAlloc_v2", 2);
            assert_sim_used(&out, mode, 5, 22 * MIB);
            assert_calls(&out, mode, 7, "cuMemAlloc_v2", 3);
            assert_sim_used(&out, mode, 7, 40 * MIB);
            assert_calls(&out, mode, 12, "cuMemAlloc_v2", 3);
            // in use: 512 + 5M + 12M + 4M + 14M + 512 + 3M = 38M + 1024; all 40M reserved
            assert_at(&out, mode, 13, "free", 2 * MIB - 1024);
            assert_shim_figures(&out, mode, (38 * MIB + 1024, 40 * MIB, 1));
        } else {
            // passthrough: 1 + 5M + 12M + 4M = 21M+1, then 14M fits (35M+1), 1 (35M+2), 3M
            // (38M+2), 2M is refused by the limit
            assert_ok(&out, mode, [8, 9, 10]);
            assert_rcs(&out, mode, &[(11, OOM)]);
            assert_calls(&out, mode, 12, "cuMemAlloc_v2", 7);
            assert_sim_used(&out, mode, 12, 38 * MIB + 2);
        }
    }
}

/// grow and preallocate place sub-allocations best fit, the lowest address among blocks of
/// the same size, and coalesce freed neighbours.
#[test]
fn best_fit_lowest_address_and_coalescing() {
    //  1 ctx   2 A=1000   3 B=1000   4 C=1000   5 D=1000   6 E=5000   7 F=1000
    //  8 free C   9 free A   10 free E: free blocks 1024 (A), 1024 (C), 5120 (E), the tail
    // 11 alloc 1000 -> A (lowest of the two 1024s)   12 diff=2,11 (0)
    // 13 alloc 1000 -> C   14 diff=4,13 (0)
    // 15 alloc 1000 -> E (the smallest block that fits)   16 diff=6,15 (0)
    // 17 free B   18 free 11 (A again): A and B coalesce into 2048 at A
    // 19 alloc 2048 -> A (2048 beats E's remaining 4096)   20 diff=2,19 (0)
    // 21 sim
    let k = 1000;
    let args = args![
        "ctx=primary",
        alloc(k),
        alloc(k),
        alloc(k),
        alloc(k),
        alloc(5000),
        alloc(k),
        "free=4",
        "free=2",
        "free=6",
        alloc(k),
        "diff=2,11",
        alloc(k),
        "diff=4,13",
        alloc(k),
        "diff=6,15",
        "free=3",
        "free=11",
        alloc(2048),
        "diff=2,19",
        "sim=0",
    ];
    for mode in MemoryMode::selected(&[Passthrough, Grow, Preallocate]) {
        let out = run(mode, &args);
        assert_ok(
            &out,
            mode,
            [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 18, 19],
        );
        assert_quiet(&out, mode);
        if mode.serves() {
            for op in [12, 14, 16, 20] {
                assert_snum(&out, mode, op, "diff", 0);
            }
            assert_calls(&out, mode, 21, "cuMemAlloc_v2", 1);
            assert_calls(&out, mode, 21, "cuMemFree_v2", 0);
        } else {
            assert_calls(&out, mode, 21, "cuMemAlloc_v2", 10);
            assert_calls(&out, mode, 21, "cuMemFree_v2", 5);
        }
    }
}

// ---------------------------------------------------------------------------------------
// preallocate
// ---------------------------------------------------------------------------------------

/// preallocate: creating a context (cuCtxCreate_v2/v3/v4, cuDevicePrimaryCtxRetain, also
/// without making it current) takes ONE chunk of the whole limit from the driver at once, on
/// that device only.
#[test]
fn preallocate_reserves_the_limit_when_a_context_is_made() {
    for how in ["primary", "retain", "v2", "v3", "v4"] {
        // 1 ctx, 2 sim=0, 3 sim=1
        let args = args![format!("ctx={how}"), "sim=0", "sim=1"];
        for mode in MemoryMode::selected(&[NoShim, Passthrough, Preallocate]) {
            let out = run(mode, &args);
            let what = format!("{mode:?} ctx={how}");
            assert_eq!(num(&out, 1, "rc"), 0, "{what}\n{}", out.dump());
            let (allocs, used) = if mode == Preallocate {
                (1, LIMIT)
            } else {
                (0, 0)
            };
            assert_eq!(
                calls(&out, 2, "cuMemAlloc_v2"),
                allocs,
                "{what}\n{}",
                out.dump()
            );
            assert_eq!(unum(&out, 2, "used"), used, "{what}\n{}", out.dump());
            assert_eq!(
                unum(&out, 3, "used"),
                0,
                "{what}: device 1 untouched\n{}",
                out.dump()
            );
            assert_quiet(&out, mode);
            if mode == Preallocate {
                assert_shim_figures(&out, mode, (0, LIMIT, 0));
                assert_eq!(out.report().device(0).used, LIMIT, "{what}\n{}", out.dump());
            }
        }
    }
    // on device 1: device 0 stays untouched
    let args = args!["dev=1", "ctx=v2", "sim=0", "sim=1"];
    for mode in MemoryMode::selected(&[Passthrough, Preallocate]) {
        let out = run(mode, &args);
        assert_ok(&out, mode, [1, 2]);
        assert_sim_used(&out, mode, 3, 0);
        assert_sim_used(&out, mode, 4, if mode == Preallocate { LIMIT } else { 0 });
    }
}

/// preallocate: after the reservation, 100 allocations of mixed sizes and APIs never reach
/// the driver; every other allocation API (managed, stream-ordered, VMM, arrays) finds the
/// limit reserved and is refused; the reserve can be filled exactly and not one byte more.
/// In passthrough each of them reaches the driver and counts its unrounded size.
#[test]
fn preallocate_serves_everything_from_the_reserve() {
    let mut args = args!["ctx=v2", "sim=0"]; // 1, 2
    let (mut rounded, mut unrounded, mut n_mem, mut n_pitch) = (0u64, 0u64, 0u64, 0u64);
    for k in 0..100u64 {
        if k % 4 == 3 {
            let (w, h) = (1 + (k * 37) % 4000, 1 + k % 50);
            args.push(format!("alloc=pitch:{w}:{h}:4"));
            rounded += round_up(w, GRANULE) * h;
            unrounded += round_up(w, GRANULE) * h;
            n_pitch += 1;
        } else {
            let size = 1 + (k * 7919 * 131) % (4 * MIB);
            args.push(alloc(size));
            rounded += round_up(size, GRANULE);
            unrounded += size;
            n_mem += 1;
        }
    }
    let tail = LIMIT - rounded;
    assert!(rounded - unrounded >= GRANULE && tail > 10 * MIB);
    // 103 sim, 104 info, 105 managed, 106 async, 107 vmm, 108 array, 109 sim,
    // 110..113 free 105..108, 114 alloc the exact rest, 115 alloc 512 more, 116 info, 117 sim
    args.extend(args![
        "sim=0",
        "info",
        format!("alloc=managed:{MIB}"),
        format!("alloc=async:{MIB}"),
        format!("alloc=vmm:{}", 2 * MIB),
        format!("alloc=array:{MIB}"),
        "sim=0",
        "free=105",
        "free=106",
        "free=107",
        "free=108",
        alloc(tail),
        alloc(GRANULE),
        "info",
        "sim=0",
    ]);
    for mode in MemoryMode::selected(&[NoShim, Passthrough, Preallocate]) {
        let out = run(mode, &args);
        assert_ok(&out, mode, (1..=102).filter(|&op| op != 2));
        assert_ok(&out, mode, [104, 114, 116]);
        let other_apis = [
            "cuMemAllocManaged",
            "cuMemAllocAsync",
            "cuMemCreate",
            "cuArrayCreate_v2",
        ];
        if mode == Preallocate {
            for op in [2, 103, 109, 117] {
                assert_calls(&out, mode, op, "cuMemAlloc_v2", 1);
                assert_calls(&out, mode, op, "cuMemAllocPitch_v2", 0);
                assert_sim_used(&out, mode, op, LIMIT);
            }
            assert_at(&out, mode, 104, "free", LIMIT - rounded);
            assert_rcs(
                &out,
                mode,
                &[(105, OOM), (106, OOM), (107, OOM), (108, OOM)],
            );
            for name in other_apis {
                assert_calls(&out, mode, 109, name, 0);
            }
            // the program frees what it never got
            assert_rcs(
                &out,
                mode,
                &[
                    (110, INVALID_VALUE),
                    (111, INVALID_VALUE),
                    (112, INVALID_VALUE),
                    (113, INVALID_VALUE),
                ],
            );
            assert_rcs(&out, mode, &[(115, OOM)]);
            assert_at(&out, mode, 116, "free", 0);
            assert_refusals(
                &out,
                mode,
                &[
                    (MIB, LIMIT),
                    (MIB, LIMIT),
                    (2 * MIB, LIMIT),
                    (MIB, LIMIT),
                    (GRANULE, LIMIT),
                ],
            );
            assert_shim_figures(&out, mode, (LIMIT, LIMIT, 5));
        } else {
            assert_calls(&out, mode, 103, "cuMemAlloc_v2", n_mem);
            assert_calls(&out, mode, 103, "cuMemAllocPitch_v2", n_pitch);
            assert_sim_used(&out, mode, 103, unrounded);
            assert_ok(&out, mode, [105, 106, 107, 108, 110, 111, 112, 113]);
            for name in other_apis {
                assert_calls(&out, mode, 109, name, 1);
            }
            assert_rcs(&out, mode, &[(115, 0)]);
            assert_calls(&out, mode, 117, "cuMemAlloc_v2", n_mem + 2);
            assert_sim_used(&out, mode, 117, unrounded + tail + GRANULE);
            assert_quiet(&out, mode);
            if mode == Passthrough {
                assert_at(&out, mode, 104, "free", LIMIT - unrounded);
                assert_at(&out, mode, 116, "free", LIMIT - unrounded - tail - GRANULE);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// What the program sees: memory info, pointer queries, IPC, frees
// ---------------------------------------------------------------------------------------

/// cuMemGetInfo: total = the limit; free = min(limit - reserved, driver free) + (reserved - in
/// use), i.e. what the program could still allocate, in every mode.
#[test]
fn mem_get_info_in_every_mode() {
    // 1 ctx, 2 info, 3 alloc 1M, 4 info, 5 sim, 6 free=3, 7 info, 8 alloc 100M, 9 info, 10 sim
    let args = args![
        "ctx=primary",
        "info",
        alloc(MIB),
        "info",
        "sim=0",
        "free=3",
        "info",
        alloc(100 * MIB),
        "info",
        "sim=0"
    ];
    for (memory, physical) in [("16GiB", 16 * GIB), ("1GiB", GIB)] {
        for mode in MemoryMode::selected(&MemoryMode::ALL) {
            let out = run_env(mode, "1GiB", &[("GPUSIM_MEMORY", memory)], &args);
            let what = format!("{mode:?} on {memory}");
            assert_ok(&out, mode, [1, 2, 3, 4, 6, 7, 8, 9]);
            let total = if mode.shim() { LIMIT } else { physical };
            for (op, in_use) in [(2, 0), (4, MIB), (7, 0), (9, 100 * MIB)] {
                assert_eq!(
                    unum(&out, op, "total"),
                    total,
                    "{what}: op{op}\n{}",
                    out.dump()
                );
                assert_eq!(
                    unum(&out, op, "free"),
                    total - in_use,
                    "{what}: op{op}\n{}",
                    out.dump()
                );
            }
            let (used5, used10) = match mode {
                Grow => (2 * MIB, 2 * MIB + 100 * MIB),
                Preallocate => (LIMIT, LIMIT),
                _ => (MIB, 100 * MIB),
            };
            assert_eq!(unum(&out, 5, "used"), used5, "{what}\n{}", out.dump());
            assert_eq!(unum(&out, 10, "used"), used10, "{what}\n{}", out.dump());
        }
    }
}

/// Pointer queries on served pointers describe the sub-allocation as the program asked for it:
/// cuMemGetAddressRange (interior pointers too) gives (start, requested size), the rounding
/// slack and freed blocks are CUDA_ERROR_NOT_FOUND; the range attributes agree; BUFFER_ID is
/// new for every sub-allocation, also at a reused address; IS_LEGACY_CUDA_IPC_CAPABLE is 0 and
/// cuIpcGetMemHandle is refused (801) with one warning. Frees of interior pointers and double
/// frees are CUDA_ERROR_INVALID_VALUE without reaching the driver; an unknown pointer goes to
/// the driver.
#[test]
fn pointer_queries_ipc_and_bad_frees() {
    // 1 ctx, 2 p=alloc 1000, 3 q=alloc 3000, 4 diff=2,3, 5 range p, 6 range p+999,
    // 7 range p+1000, 8 range p+1023, 9 range q+2999, 10 attr p+500, 11 attr q, 12 ipc p+10,
    // 13 freeat p+512, 14 free p, 15 freeat p (double), 16 range p, 17 sim, 18 alloc 1000 (p'),
    // 19 diff=2,18, 20 attr p', 21 freeat 0:65536 (unknown), 22 sim
    let args = args![
        "ctx=primary",
        alloc(1000),
        alloc(3000),
        "diff=2,3",
        "range=2:0",
        "range=2:999",
        "range=2:1000",
        "range=2:1023",
        "range=3:2999",
        "attr=2:500",
        "attr=3:0",
        "ipc=2:10",
        "freeat=2:512",
        "free=2",
        "freeat=2:0",
        "range=2:0",
        "sim=0",
        alloc(1000),
        "diff=2,18",
        "attr=18:0",
        "freeat=0:65536",
        "sim=0",
    ];
    for mode in MemoryMode::selected(&MemoryMode::ALL) {
        let out = run(mode, &args);
        assert_ok(&out, mode, [1, 2, 3, 5, 6, 9, 14, 18]);
        for (op, size) in [(5, 1000), (6, 1000), (9, 3000)] {
            assert_snum(&out, mode, op, "off", 0);
            assert_at(&out, mode, op, "size", size);
        }
        assert_rcs(
            &out,
            mode,
            &[(7, NOT_FOUND), (8, NOT_FOUND), (16, NOT_FOUND)],
        );
        assert_rcs(
            &out,
            mode,
            &[
                (13, INVALID_VALUE),
                (15, INVALID_VALUE),
                (21, INVALID_VALUE),
            ],
        );
        for (op, size) in [(10, 1000), (11, 3000), (20, 1000)] {
            for prefix in ["", "s."] {
                assert_snum(&out, mode, op, &format!("{prefix}start_off"), 0);
                assert_at(&out, mode, op, &format!("{prefix}size"), size);
                assert_snum(&out, mode, op, &format!("{prefix}dev"), 0);
            }
            for key in ["a11.rc", "a12.rc", "a7.rc", "a9.rc", "a10.rc", "s.rc"] {
                assert_snum(&out, mode, op, key, 0);
            }
            assert_eq!(
                num(&out, op, "buffer"),
                num(&out, op, "s.buffer"),
                "{mode:?}\n{}",
                out.dump()
            );
        }
        let buffers = [
            unum(&out, 10, "buffer"),
            unum(&out, 11, "buffer"),
            unum(&out, 20, "buffer"),
        ];
        assert!(
            buffers[0] != buffers[1] && buffers[1] != buffers[2] && buffers[0] != buffers[2],
            "{mode:?}: buffer ids {buffers:?}\n{}",
            out.dump()
        );
        if mode.serves() {
            assert_snum(&out, mode, 4, "diff", 1024);
            assert_snum(&out, mode, 19, "diff", 0);
            for op in [10, 11, 20] {
                assert_snum(&out, mode, op, "ipc", 0);
                assert_snum(&out, mode, op, "s.ipc", 0);
            }
            assert_rcs(&out, mode, &[(12, NOT_SUPPORTED)]);
            let lines = out.gpushim_lines_with("cuIpcGetMemHandle");
            assert_eq!(
                lines.len(),
                1,
                "{mode:?}: one line about cuIpcGetMemHandle\n{}",
                out.dump()
            );
            assert!(
                lines[0].starts_with("gpushim: warn:"),
                "{mode:?}: `{}`",
                lines[0]
            );
            // interior free, free, double free: none reached the driver; the unknown one did
            assert_calls(&out, mode, 17, "cuMemFree_v2", 0);
            assert_calls(&out, mode, 22, "cuMemFree_v2", 1);
        } else {
            assert_ne!(
                num(&out, 4, "diff"),
                1024,
                "{mode:?}: the driver's own placement\n{}",
                out.dump()
            );
            for op in [10, 11, 20] {
                assert_snum(&out, mode, op, "ipc", 1);
            }
            assert_rcs(&out, mode, &[(12, 0)]);
            assert_snum(&out, mode, 12, "sim_handle", 1);
            assert_snum(&out, mode, 12, "base_off", 0);
            assert_calls(&out, mode, 17, "cuIpcGetMemHandle", 1);
            assert_calls(&out, mode, 17, "cuMemFree_v2", 3);
            assert_calls(&out, mode, 22, "cuMemFree_v2", 4);
            assert_quiet(&out, mode);
        }
    }
}

/// The other served APIs: cuMemAllocPitch_v2 (pitch = width rounded up to 512, pitch x height
/// counted, its range), the 512-byte granule, and what still goes to the driver: 0 bytes and
/// an element size other than 4, 8, 16 (which the driver rejects).
#[test]
fn pitch_granule_and_driver_rejections() {
    // 1 ctx, 2 alloc 0, 3 pitch elem 3, 4 sim, 5 pitch 1000x10, 6 range p+10239, 7 range
    // p+10240, 8 alloc 1, 9 alloc 1, 10 diff=8,9, 11 range=8:0, 12 range=8:1, 13 sim,
    // 14 free=5, 15 free=8, 16 free=9, 17 sim, 18 pitch 1000x10 again, 19 diff=5,18,
    // 20 pitch 512x3 (elem 16), 21 sim
    let args = args![
        "ctx=primary",
        alloc(0),
        "alloc=pitch:1000:10:3",
        "sim=0",
        "alloc=pitch:1000:10:4",
        "range=5:10239",
        "range=5:10240",
        alloc(1),
        alloc(1),
        "diff=8,9",
        "range=8:0",
        "range=8:1",
        "sim=0",
        "free=5",
        "free=8",
        "free=9",
        "sim=0",
        "alloc=pitch:1000:10:8",
        "diff=5,18",
        "alloc=pitch:512:3:16",
        "sim=0",
    ];
    for mode in MemoryMode::selected(&MemoryMode::ALL) {
        let out = run(mode, &args);
        assert_rcs(&out, mode, &[(2, INVALID_VALUE), (3, INVALID_VALUE)]);
        assert_ok(&out, mode, [1, 5, 6, 8, 9, 11, 14, 15, 16, 18, 20]);
        assert_rcs(&out, mode, &[(7, NOT_FOUND), (12, NOT_FOUND)]);
        assert_at(&out, mode, 5, "pitch", 1024);
        assert_at(&out, mode, 6, "size", 10240);
        assert_snum(&out, mode, 6, "off", 0);
        assert_at(&out, mode, 11, "size", 1);
        assert_at(&out, mode, 20, "pitch", 512);
        assert_calls(&out, mode, 4, "cuMemAllocPitch_v2", 1);
        let prealloc = u64::from(mode == Preallocate);
        assert_calls(&out, mode, 4, "cuMemAlloc_v2", 1 + prealloc);
        if mode.serves() {
            assert_snum(&out, mode, 10, "diff", GRANULE as i64);
            assert_snum(&out, mode, 19, "diff", 0);
            for op in [13, 17, 21] {
                assert_calls(&out, mode, op, "cuMemAllocPitch_v2", 1);
                assert_calls(&out, mode, op, "cuMemAlloc_v2", 2); // the 0 bytes, one chunk
                assert_calls(&out, mode, op, "cuMemFree_v2", 0);
            }
            let reserved = if mode == Grow { 2 * MIB } else { LIMIT };
            assert_sim_used(&out, mode, 17, reserved);
        } else {
            assert_ne!(
                num(&out, 10, "diff"),
                GRANULE as i64,
                "{mode:?}\n{}",
                out.dump()
            );
            assert_calls(&out, mode, 13, "cuMemAllocPitch_v2", 2);
            assert_calls(&out, mode, 13, "cuMemAlloc_v2", 3);
            assert_calls(&out, mode, 17, "cuMemFree_v2", 3);
            assert_sim_used(&out, mode, 17, 0);
            assert_calls(&out, mode, 21, "cuMemAllocPitch_v2", 4);
        }
    }
}

/// The v1 (32-bit) cuMemAlloc / cuMemAllocPitch / cuMemFree are not served from the reserve
/// (its chunks need not lie below 4 GiB; README, "Memory modes"): they reach the driver and
/// count beside the reserve in grow, and are refused in preallocate, where the reservation
/// holds the whole limit. cuMemGetAddressRange (v1 and v2) keeps describing them.
#[test]
fn v1_abi_passes_through() {
    // 1 ctx, 2 v1 alloc 1000, 3 range (v2) +999, 4 rangev1 +999, 5 rangev1 +1000, 6 pitchv1
    // 1000x10, 7 rangev1 6:10239, 8 touch=2, 9 alloc 1M (served in grow), 10 info, 11 freev1=2,
    // 12 freev1=6, 13 info, 14 sim
    let args = args![
        "ctx=primary",
        "alloc=v1:1000",
        "range=2:999",
        "rangev1=2:999",
        "rangev1=2:1000",
        "alloc=pitchv1:1000:10:4",
        "rangev1=6:10239",
        "touch=2",
        alloc(MIB),
        "info",
        "freev1=2",
        "freev1=6",
        "info",
        "sim=0",
    ];
    for mode in MemoryMode::selected(&[NoShim, Passthrough, Grow]) {
        let out = run(mode, &args);
        assert_ok(&out, mode, [1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13]);
        assert_snum(&out, mode, 8, "ok", 1);
        for op in [2, 6] {
            assert!(
                unum(&out, op, "ptr") <= u64::from(u32::MAX),
                "{mode:?}: op{op} is no 32-bit pointer
{}",
                out.dump()
            );
        }
        for (op, size) in [(3, 1000), (4, 1000), (7, 10240)] {
            assert_snum(&out, mode, op, "off", 0);
            assert_at(&out, mode, op, "size", size);
        }
        assert_rcs(&out, mode, &[(5, NOT_FOUND)]);
        assert_at(&out, mode, 6, "pitch", 1024);
        assert_calls(&out, mode, 14, "cuMemAlloc", 1);
        assert_calls(&out, mode, 14, "cuMemAllocPitch", 1);
        assert_calls(&out, mode, 14, "cuMemFree", 2);
        assert_calls(&out, mode, 14, "cuMemAlloc_v2", 1);
        let total = if mode.shim() { LIMIT } else { 16 * GIB };
        assert_at(&out, mode, 10, "free", total - MIB - 1000 - 10240);
        assert_at(&out, mode, 13, "free", total - MIB);
        assert_sim_used(&out, mode, 14, if mode == Grow { 2 * MIB } else { MIB });
        assert_quiet(&out, mode);
    }

    // 1 ctx, 2 v1 alloc 1000, 3 pitchv1 1000x10, 4 sim, 5 info
    let args = args![
        "ctx=primary",
        "alloc=v1:1000",
        "alloc=pitchv1:1000:10:4",
        "sim=0",
        "info"
    ];
    for mode in MemoryMode::selected(&[Passthrough, Preallocate]) {
        let out = run(mode, &args);
        assert_ok(&out, mode, [1, 5]);
        if mode == Preallocate {
            assert_rcs(&out, mode, &[(2, OOM), (3, OOM)]);
            assert_calls(&out, mode, 4, "cuMemAlloc", 0);
            assert_calls(&out, mode, 4, "cuMemAllocPitch", 0);
            assert_refusals(&out, mode, &[(1000, LIMIT), (10240, LIMIT)]);
            assert_at(&out, mode, 5, "free", LIMIT);
        } else {
            assert_ok(&out, mode, [2, 3]);
            assert_calls(&out, mode, 4, "cuMemAlloc", 1);
            assert_calls(&out, mode, 4, "cuMemAllocPitch", 1);
            assert_at(&out, mode, 5, "free", LIMIT - 1000 - 10240);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Data
// ---------------------------------------------------------------------------------------

/// Memsets and copies on adjacent sub-allocations touch exactly their own bytes.
#[test]
fn neighbours_keep_their_bytes() {
    // 1 ctx, 2 a=1000, 3 b=3000, 4 c=pitch 700x3 (3072), 5 diff=2,3, 6 diff=3,4,
    // 7 neighbours=2,3, 8 neighbours=3,4, 9 neighbours=4,2
    let args = args![
        "ctx=primary",
        alloc(1000),
        alloc(3000),
        "alloc=pitch:700:3:4",
        "diff=2,3",
        "diff=3,4",
        "neighbours=2,3",
        "neighbours=3,4",
        "neighbours=4,2"
    ];
    for mode in MemoryMode::selected(&MemoryMode::ALL) {
        let out = run(mode, &args);
        assert_ok(&out, mode, [1, 2, 3, 4]);
        for op in [7, 8, 9] {
            for step in ["set", "htod", "dtod", "reset"] {
                assert_snum(&out, mode, op, &format!("{step}.rc"), 0);
                assert_snum(&out, mode, op, &format!("{step}.ok"), 1);
            }
        }
        if mode.serves() {
            // really neighbours: nothing between them
            assert_snum(&out, mode, 5, "diff", 1024);
            assert_snum(&out, mode, 6, "diff", 3072);
        }
    }
}

// ---------------------------------------------------------------------------------------
// A randomized workload
// ---------------------------------------------------------------------------------------

const RANDOM_LIMIT: u64 = 256 * MIB;

/// 3000 steps (60% allocations of 1 B .. 8 MiB, log-uniform, 40% frees) under a 256 MiB
/// limit, every live allocation checked after every step.
fn random_workload(mode: MemoryMode, seed: u64) -> RunOutput {
    // 1 ctx, 2 random, 3 sim
    let args = args![
        "ctx=primary",
        format!("random={seed}:3000:{}", 8 * MIB),
        "sim=0"
    ];
    let out = run_env(mode, "256MiB", &[], &args);
    let what = format!("{mode:?} seed {seed}");
    assert_ok(&out, mode, [1]);
    for key in [
        "other",
        "free_errors",
        "range_bad",
        "overlap",
        "bytes_bad",
        "whole_bad",
    ] {
        assert_eq!(
            out.num(&format!("random.{key}")),
            0,
            "{what}: random.{key}\n{}",
            out.dump()
        );
    }
    if mode.shim() {
        assert_eq!(out.num("random.misaligned"), 0, "{what}\n{}", out.dump());
    }
    let ok = out.u64("random.ok");
    assert_eq!(
        out.u64("random.frees"),
        ok,
        "{what}: every allocation freed once\n{}",
        out.dump()
    );
    assert!(ok > 1000, "{what}: {ok} allocations\n{}", out.dump());
    assert!(out.u64("random.checks") > 100_000, "{what}\n{}", out.dump());
    let total = if mode.shim() { RANDOM_LIMIT } else { 16 * GIB };
    assert_eq!(
        out.u64("random.info.total"),
        total,
        "{what}\n{}",
        out.dump()
    );
    assert_eq!(
        out.u64("random.info.free"),
        total,
        "{what}: everything free again\n{}",
        out.dump()
    );
    let sim = out.report().device(0);
    if mode.shim() {
        assert!(
            out.u64("random.oom") > 0,
            "{what}: the limit was never reached\n{}",
            out.dump()
        );
        assert!(
            out.u64("random.max_held") <= RANDOM_LIMIT,
            "{what}\n{}",
            out.dump()
        );
        assert!(
            sim.peak <= RANDOM_LIMIT,
            "{what}: driver peak {} above the limit\n{}",
            sim.peak,
            out.dump()
        );
        let (peak_in_use, peak_reserved, refused) = shim_figures(&out).unwrap();
        assert!(
            peak_reserved <= RANDOM_LIMIT,
            "{what}: peak reserved {peak_reserved}"
        );
        assert!(
            peak_in_use <= peak_reserved,
            "{what}: {peak_in_use} > {peak_reserved}"
        );
        assert_eq!(refused, out.u64("random.oom"), "{what}\n{}", out.dump());
    }
    match mode {
        NoShim | Passthrough => {
            assert_calls(&out, mode, 3, "cuMemAlloc_v2", ok);
            assert_calls(&out, mode, 3, "cuMemFree_v2", ok);
            assert_sim_used(&out, mode, 3, 0);
        }
        Grow => {
            let chunks = calls(&out, 3, "cuMemAlloc_v2");
            assert!(
                chunks >= 1 && chunks * 4 < ok,
                "{what}: {chunks} chunks for {ok} allocations\n{}",
                out.dump()
            );
            assert_calls(&out, mode, 3, "cuMemFree_v2", 0);
            assert!(
                unum(&out, 3, "used") <= RANDOM_LIMIT,
                "{what}\n{}",
                out.dump()
            );
        }
        Preallocate => {
            assert_calls(&out, mode, 3, "cuMemAlloc_v2", 1);
            assert_calls(&out, mode, 3, "cuMemFree_v2", 0);
            assert_sim_used(&out, mode, 3, RANDOM_LIMIT);
        }
    }
    out
}

/// The same workload in passthrough: every allocation and free reaches the driver.
#[test]
fn random_workload_passthrough() {
    for mode in MemoryMode::selected(&[Passthrough]) {
        random_workload(mode, 1);
    }
}

#[test]
fn random_workload_grow() {
    for mode in MemoryMode::selected(&[Grow]) {
        for seed in [1, 2] {
            random_workload(mode, seed);
        }
    }
}

#[test]
fn random_workload_preallocate() {
    for mode in MemoryMode::selected(&[Preallocate]) {
        for seed in [1, 3] {
            random_workload(mode, seed);
        }
    }
}

// ---------------------------------------------------------------------------------------
// The CUDA runtime
// ---------------------------------------------------------------------------------------

/// cudart 12.9 and 13.5: ten cudaMalloc/cudaFree of 1 MiB reach the driver once (grow: a 2 MiB
/// chunk; preallocate: the whole limit, taken at the first cudaMalloc at the latest) and never
/// free; cudaMemGetInfo shows the limit.
#[test]
fn runtime_malloc_free() {
    // 1 alloc, 2 sim=0, 3 info, 4 free=1, then (alloc K, free=K) x 9: 5..22, 23 info, 24 sim=0
    let mut args = args![format!("alloc=malloc:{MIB}"), "sim=0", "info", "free=1"];
    for k in 0..9 {
        let op = 5 + 2 * k;
        args.push(format!("alloc=malloc:{MIB}"));
        args.push(format!("free={op}"));
    }
    args.extend(args!["info", "sim=0"]);
    for major in [12, 13] {
        let program = Program::Runtime { major, ptsz: false };
        for mode in MemoryMode::selected(&MemoryMode::ALL) {
            let out = Run::program(program)
                .env("GPUSIM_DEVICES", "2")
                .env("GPUSIM_MEMORY", "16GiB")
                .env("GPUSHIM_MEMORY_LIMIT", "1GiB")
                .args(&args)
                .mode(mode)
                .with_shim_report()
                .run();
            let what = format!("cudart {major} {mode:?}");
            out.assert_completed();
            assert_eq!(out.num("init.rc"), 0, "{what}\n{}", out.dump());
            for op in (1..=22).filter(|&op| op != 2) {
                assert_eq!(num(&out, op, "rc"), 0, "{what}: op{op}\n{}", out.dump());
            }
            assert_eq!(out.num("cleanup.failures"), 0, "{what}\n{}", out.dump());
            let total = if mode.shim() { LIMIT } else { 16 * GIB };
            assert_eq!(unum(&out, 3, "total"), total, "{what}\n{}", out.dump());
            assert_eq!(unum(&out, 3, "free"), total - MIB, "{what}\n{}", out.dump());
            assert_eq!(unum(&out, 23, "total"), total, "{what}\n{}", out.dump());
            assert_eq!(unum(&out, 23, "free"), total, "{what}\n{}", out.dump());
            let (allocs, frees, used_after_first) = match mode {
                Grow => (1, 0, 2 * MIB),
                Preallocate => (1, 0, LIMIT),
                _ => (10, 10, MIB),
            };
            assert_eq!(
                calls(&out, 24, "cuMemAlloc_v2"),
                allocs,
                "{what}\n{}",
                out.dump()
            );
            assert_eq!(
                calls(&out, 24, "cuMemFree_v2"),
                frees,
                "{what}\n{}",
                out.dump()
            );
            assert_eq!(
                unum(&out, 2, "used"),
                used_after_first,
                "{what}\n{}",
                out.dump()
            );
            assert!(out.gpushim_lines().is_empty(), "{what}\n{}", out.dump());
            if mode.serves() {
                let reserved = if mode == Grow { 2 * MIB } else { LIMIT };
                assert_eq!(
                    shim_figures(&out),
                    Some((MIB, reserved, 0)),
                    "{what}\n{}",
                    out.dump()
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Threads
// ---------------------------------------------------------------------------------------

/// 8 threads allocating and freeing at random (tests/c/race.c) under a 64 MiB limit in grow
/// and preallocate: the driver never holds more than the limit, nothing fails but refusals,
/// and at the end all of the limit is free again. Without the shim the same workload goes
/// above the limit.
#[test]
fn threads_never_push_the_driver_past_the_limit() {
    const RACE_LIMIT: u64 = 64 * MIB;
    for mode in MemoryMode::selected(&[NoShim, Grow, Preallocate]) {
        for _ in 0..if mode == NoShim { 1 } else { 3 } {
            let out = Run::program(Program::Race)
                .env("GPUSIM_DEVICES", "1")
                .env("GPUSIM_MEMORY", "4GiB")
                .env("GPUSHIM_MEMORY_LIMIT", "64MiB")
                .args(["8", "4000", &(12 * MIB).to_string(), "4"])
                .mode(mode)
                .with_shim_report()
                .run();
            out.assert_completed();
            assert_eq!(out.num("init.rc"), 0, "{mode:?}\n{}", out.dump());
            assert_eq!(
                out.num("errors"),
                0,
                "{mode:?}: other errors\n{}",
                out.dump()
            );
            assert_eq!(out.num("free_errors"), 0, "{mode:?}\n{}", out.dump());
            assert_eq!(
                out.num("frees"),
                out.num("successes"),
                "{mode:?}\n{}",
                out.dump()
            );
            let sim = out.report().device(0);
            if mode == NoShim {
                assert!(
                    sim.peak > RACE_LIMIT,
                    "the workload never exceeds the limit: make it heavier"
                );
                continue;
            }
            assert!(
                sim.peak <= RACE_LIMIT,
                "{mode:?}: driver peak {} above {RACE_LIMIT}\n{}",
                sim.peak,
                out.dump()
            );
            assert!(out.num("successes") > 1000, "{mode:?}\n{}", out.dump());
            // (refusals depend on how the threads happen to overlap: served allocations are fast
            // enough for a loaded machine to run the threads one after the other)
            assert_eq!(
                out.u64("info.total"),
                RACE_LIMIT,
                "{mode:?}\n{}",
                out.dump()
            );
            assert_eq!(
                out.u64("info.free"),
                RACE_LIMIT,
                "{mode:?}: all free again\n{}",
                out.dump()
            );
            assert_eq!(
                out.report().calls("cuMemFree_v2"),
                0,
                "{mode:?}\n{}",
                out.dump()
            );
            let (peak_in_use, peak_reserved, _) = shim_figures(&out).unwrap();
            assert!(
                peak_reserved <= RACE_LIMIT && peak_in_use <= peak_reserved,
                "{mode:?}\n{}",
                out.dump()
            );
            for line in out.warn_lines() {
                assert_mentions_device(&line, 0);
                assert_mentions_numbers(&line, &[RACE_LIMIT]);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Contexts that go away
// ---------------------------------------------------------------------------------------

/// cuCtxDestroy of a context whose memory came from the reserve: the driver frees the chunks
/// with the context (the simulator's bytes drop to 0), the shim forgets and credits them, and
/// a new context can allocate up to the limit again — memory the driver really has.
#[test]
fn ctx_destroy_gives_the_reserve_back() {
    // 1 ctx=v2, 2 alloc 600M, 3 alloc 300M, 4 sim, 5 ctxdestroy, 6 sim, 7 ctx=v2,
    // 8 alloc 900M, 9 alloc 1000, 10 touch=9, 11 range=8:0, 12 info, 13 sim
    let args = args![
        "ctx=v2",
        alloc(600 * MIB),
        alloc(300 * MIB),
        "sim=0",
        "ctxdestroy",
        "sim=0",
        "ctx=v2",
        alloc(900 * MIB),
        alloc(1000),
        "touch=9",
        "range=8:0",
        "info",
        "sim=0",
    ];
    for mode in MemoryMode::selected(&[NoShim, Grow, Preallocate]) {
        let out = run(mode, &args);
        assert_ok(&out, mode, [1, 2, 3, 5, 7, 8, 9, 10, 11, 12]);
        assert_snum(&out, mode, 5, "dropped", 2);
        assert_snum(&out, mode, 10, "ok", 1);
        assert_at(&out, mode, 11, "size", 900 * MIB);
        assert_sim_used(&out, mode, 6, 0);
        assert_eq!(out.num("cleanup.failures"), 0, "{mode:?}\n{}", out.dump());
        match mode {
            NoShim => {
                assert_sim_used(&out, mode, 4, 900 * MIB);
                assert_at(&out, mode, 12, "free", 16 * GIB - 900 * MIB - 1000);
            }
            Grow => {
                assert_sim_used(&out, mode, 4, 900 * MIB);
                assert_sim_used(&out, mode, 13, 900 * MIB + 2 * MIB);
                assert_at(&out, mode, 12, "free", LIMIT - 900 * MIB - 1024);
                assert_quiet(&out, mode);
            }
            Preallocate => {
                assert_sim_used(&out, mode, 4, LIMIT);
                assert_sim_used(&out, mode, 13, LIMIT);
                assert_calls(&out, mode, 13, "cuMemAlloc_v2", 2);
                assert_at(&out, mode, 12, "free", LIMIT - 900 * MIB - 1024);
                assert_quiet(&out, mode);
            }
            Passthrough => unreachable!(),
        }
    }
}

/// cuDevicePrimaryCtxReset frees the primary context's memory in the driver as cuCtxDestroy
/// does: the shim must not hand out memory from chunks the driver took back.
#[test]
fn primary_ctx_reset_gives_the_reserve_back() {
    // 1 ctx=primary, 2 alloc 600M, 3 alloc 1000, 4 reset, 5 sim, 6 ctx=primary, 7 alloc 600M,
    // 8 alloc 1000, 9 touch=8, 10 touch=7, 11 info, 12 sim
    let args = args![
        "ctx=primary",
        alloc(600 * MIB),
        alloc(1000),
        "reset",
        "sim=0",
        "ctx=primary",
        alloc(600 * MIB),
        alloc(1000),
        "touch=8",
        "touch=7",
        "info",
        "sim=0",
    ];
    for mode in MemoryMode::selected(&[NoShim, Grow, Preallocate]) {
        let out = run(mode, &args);
        assert_ok(&out, mode, [1, 2, 3, 4, 6, 7, 8, 9, 10, 11]);
        assert_snum(&out, mode, 4, "dropped", 2);
        assert_snum(&out, mode, 9, "ok", 1);
        assert_snum(&out, mode, 10, "ok", 1);
        assert_sim_used(&out, mode, 5, 0);
        assert_eq!(out.num("cleanup.failures"), 0, "{mode:?}\n{}", out.dump());
        if mode.serves() {
            assert_at(&out, mode, 11, "free", LIMIT - 600 * MIB - 1024);
            let used = if mode == Grow {
                600 * MIB + 2 * MIB
            } else {
                LIMIT
            };
            assert_sim_used(&out, mode, 12, used);
            assert_quiet(&out, mode);
        }
    }
}

/// passthrough: the driver frees what a destroyed context held, so the shim stops counting it
/// (`src/accounting/teardown.rs`; more cases in `tests/hardening.rs`).
#[test]
fn passthrough_ctx_destroy_credits_the_context() {
    // 1 ctx=v2, 2 alloc 900M, 3 ctxdestroy, 4 sim, 5 ctx=v2, 6 info, 7 alloc 900M
    let args = args![
        "ctx=v2",
        alloc(900 * MIB),
        "ctxdestroy",
        "sim=0",
        "ctx=v2",
        "info",
        alloc(900 * MIB)
    ];
    let out = run(Passthrough, &args);
    assert_ok(&out, Passthrough, [1, 2, 3, 5, 6, 7]);
    assert_sim_used(&out, Passthrough, 4, 0);
    assert_at(&out, Passthrough, 6, "free", LIMIT);
}

/// preallocate reserves the whole limit for cuMemAlloc-style allocations: stream-ordered and
/// VMM allocations are refused, and the first refusal says why and what to use, once.
#[test]
fn preallocate_explains_unserved_refusals_once() {
    let args = args![
        "ctx=primary",                   // 1: takes the reserve
        alloc(MIB),                      // 2
        format!("alloc=async:{MIB}"),    // 3
        format!("alloc=async:{MIB}"),    // 4
        format!("alloc=vmm:{}", 2 * MIB), // 5
    ];
    let want = "cuMemAllocAsync refused: GPUSHIM_MEMORY_MODE=preallocate reserved the whole limit for \
        cuMemAlloc/cudaMalloc-style allocations, and stream-ordered pools (cuMemAllocAsync, \
        cuMemAllocFromPoolAsync) and virtual memory (cuMemCreate) are not served from that reserve; \
        use GPUSHIM_MEMORY_MODE=grow for programs using them (PyTorch backend:cudaMallocAsync or \
        expandable_segments, CuPy MemoryAsyncPool)";
    for mode in MemoryMode::selected(&[NoShim, Grow, Preallocate]) {
        let out = run(mode, &args);
        let refused = if mode == Preallocate { common::OOM } else { 0 };
        assert_rcs(&out, mode, &[(1, 0), (2, 0), (3, refused), (4, refused), (5, refused)]);
        let said = out.gpushim_lines_with("not served from that reserve");
        if mode == Preallocate {
            assert_eq!(said.len(), 1, "{mode:?}\n{}", out.dump());
            assert!(said[0].ends_with(want), "{mode:?}: {}\n{}", said[0], out.dump());
        } else {
            assert!(said.is_empty(), "{mode:?}\n{}", out.dump());
        }
    }
}

/// The same for a program that only uses VMM (cuMemCreate refused first).
#[test]
fn preallocate_explains_vmm_refusal() {
    let args = args!["ctx=primary", alloc(MIB), format!("alloc=vmm:{}", 2 * MIB), format!("alloc=vmm:{}", 2 * MIB)];
    let out = run(Preallocate, &args);
    assert_rcs(&out, Preallocate, &[(1, 0), (2, 0), (3, common::OOM), (4, common::OOM)]);
    let said = out.gpushim_lines_with("not served from that reserve");
    assert_eq!(said.len(), 1, "{}", out.dump());
    assert!(said[0].contains("cuMemCreate refused: GPUSHIM_MEMORY_MODE=preallocate"), "{}", out.dump());
    let plain = run(NoShim, &args);
    assert_rcs(&plain, NoShim, &[(1, 0), (2, 0), (3, 0), (4, 0)]);
}
