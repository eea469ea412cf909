//! The real CUDA runtime (cudart 12.9 and 13.5 from PyPI, which reach the driver through
//! cuGetProcAddress only) under the shim: device properties, memory info and every runtime
//! allocation API against the limits, with the over-limit cases also run without the shim.

mod common;

use common::*;

const RUNTIMES: [Program; 3] = [
    Program::Runtime {
        major: 12,
        ptsz: false,
    },
    Program::Runtime {
        major: 13,
        ptsz: false,
    },
    Program::Runtime {
        major: 13,
        ptsz: true,
    },
];

fn runtime_run(p: Program, memory: &str, extra: &[(&str, &str)]) -> Run {
    Run::program(p)
        .env("GPUSIM_DEVICES", "2")
        .env("GPUSIM_MEMORY", memory)
        .envs(extra)
}

#[test]
fn runtime_initialises_on_the_simulator() {
    for p in RUNTIMES {
        for shim in [false, true] {
            let out = runtime_run(p, "1GiB", &[]).shim(shim).run();
            out.assert_completed();
            assert_eq!(out.num("init.rc"), 0, "{}", out.dump());
            assert_eq!(out.num("count"), 2, "{}", out.dump());
            assert!(out.gpushim_lines().is_empty(), "{}", out.dump());
        }
    }
}

/// totalGlobalMem and cudaMemGetInfo show the effective limit, per device.
#[test]
fn properties_and_mem_info_show_the_limit() {
    let cases: &[(&str, &[(&str, &str)], [u64; 2])] = &[
        (
            "1GiB",
            &[("GPUSHIM_MEMORY_LIMIT", "64MiB")],
            [64 * MIB, 64 * MIB],
        ),
        (
            "1GiB",
            &[
                ("GPUSHIM_MEMORY_LIMIT", "64MiB"),
                ("GPUSHIM_MEMORY_LIMIT_1", "32MiB"),
            ],
            [64 * MIB, 32 * MIB],
        ),
        (
            "16GiB",
            &[("GPUSHIM_MEMORY_LIMIT", "25%")],
            [4 * GIB, 4 * GIB],
        ),
        (
            "16GiB",
            &[
                ("GPUSHIM_MEMORY_LIMIT", "0.25"),
                ("GPUSHIM_MEMORY_LIMIT_1", "50%"),
            ],
            [4 * GIB, 8 * GIB],
        ),
        (
            "16GiB",
            &[("GPUSHIM_MEMORY_LIMIT", "32GiB")],
            [16 * GIB, 16 * GIB],
        ),
        (
            "1GiB",
            &[
                ("CUDA_DEVICE_MEMORY_LIMIT", "64m"),
                ("CUDA_DEVICE_MEMORY_LIMIT_1", "32m"),
            ],
            [64 * MIB, 32 * MIB],
        ),
        (
            "1GiB",
            &[
                ("CUDA_DEVICE_MEMORY_LIMIT", "16m"),
                ("GPUSHIM_MEMORY_LIMIT", "64MiB"),
            ],
            [64 * MIB, 64 * MIB],
        ),
    ];
    for p in RUNTIMES {
        for (memory, env, totals) in cases {
            let physical = if *memory == "1GiB" { GIB } else { 16 * GIB };
            for shim in [false, true] {
                let out = runtime_run(p, memory, env)
                    .args(["props", "info", "dev=1", "info"])
                    .shim(shim)
                    .run();
                out.assert_completed();
                for d in 0..2 {
                    let want = if shim { totals[d] } else { physical };
                    assert_eq!(out.num(&format!("op1.rc{d}")), 0, "{}", out.dump());
                    assert_eq!(
                        out.u64(&format!("op1.total{d}")),
                        want,
                        "totalGlobalMem of {d} with {env:?}\n{}",
                        out.dump()
                    );
                    let info = if d == 0 { 2 } else { 4 };
                    assert_eq!(
                        out.u64(&format!("op{info}.total")),
                        want,
                        "cudaMemGetInfo total of {d}\n{}",
                        out.dump()
                    );
                    assert_eq!(
                        out.u64(&format!("op{info}.free")),
                        want,
                        "cudaMemGetInfo free of {d}\n{}",
                        out.dump()
                    );
                }
                assert_eq!(out.get("op1.name0"), "gpusim device 0", "{}", out.dump());
                assert_eq!(out.get("op1.name1"), "gpusim device 1", "{}", out.dump());
            }
        }
    }
}

fn standard(api: &'static str) -> Scenario {
    Scenario::new(GIB, &[Some(64 * MIB), Some(64 * MIB)])
        .op(Op::Alloc(api, 40 * MIB)) // 1
        .op(Op::Info) // 2
        .op(Op::Alloc(api, 16 * MIB)) // 3
        .op(Op::Alloc(api, 10 * MIB)) // 4: refused
        .op(Op::Info) // 5
        .op(Op::Alloc(api, 8 * MIB)) // 6: exactly the limit
        .op(Op::Alloc(api, 2 * MIB)) // 7: refused
        .op(Op::Free(1)) // 8
        .op(Op::Alloc(api, 40 * MIB)) // 9: fits again
        .op(Op::Info) // 10
}

fn run_standard(api: &'static str) {
    for p in RUNTIMES {
        for shim in [false, true] {
            standard(api).check(
                runtime_run(p, "1GiB", &[("GPUSHIM_MEMORY_LIMIT", "64MiB")]),
                shim,
            );
        }
    }
}

#[test]
fn cuda_malloc_limit() {
    run_standard("malloc")
}

#[test]
fn cuda_malloc_pitch_limit() {
    run_standard("pitch")
}

#[test]
fn cuda_malloc_managed_limit() {
    run_standard("managed")
}

#[test]
fn cuda_malloc_async_limit() {
    run_standard("async")
}

#[test]
fn cuda_malloc_from_pool_async_limit() {
    run_standard("pool")
}

#[test]
fn cuda_malloc_array_limit() {
    run_standard("array")
}

/// Pinned host memory does not count.
#[test]
fn cuda_malloc_host_is_not_counted() {
    let scenario = Scenario::new(GIB, &[Some(64 * MIB), Some(64 * MIB)])
        .op(Op::Alloc("host", 100 * MIB))
        .op(Op::Info)
        .op(Op::Alloc("malloc", 64 * MIB))
        .op(Op::Info);
    for p in RUNTIMES {
        for shim in [false, true] {
            scenario.check(
                runtime_run(p, "1GiB", &[("GPUSHIM_MEMORY_LIMIT", "64MiB")]),
                shim,
            );
        }
    }
}

/// cudaSetDevice switches between per-device limits; frees go back to their device.
#[test]
fn per_device_limits() {
    let scenario = Scenario::new(GIB, &[Some(64 * MIB), Some(32 * MIB)])
        .op(Op::Alloc("malloc", 40 * MIB)) // 1
        .op(Op::Dev(1)) // 2
        .op(Op::Alloc("malloc", 40 * MIB)) // 3: refused on device 1
        .op(Op::Alloc("async", 32 * MIB)) // 4
        .op(Op::Info) // 5
        .op(Op::Alloc("managed", 2 * MIB)) // 6: refused
        .op(Op::Dev(0)) // 7
        .op(Op::Info) // 8
        .op(Op::Alloc("pool", 24 * MIB)) // 9
        .op(Op::Alloc("malloc", 2 * MIB)) // 10: refused
        .op(Op::Free(4)) // 11
        .op(Op::Dev(1)) // 12
        .op(Op::Info) // 13
        .op(Op::Alloc("malloc", 32 * MIB)); // 14
    let envs: [&[(&str, &str)]; 2] = [
        &[
            ("GPUSHIM_MEMORY_LIMIT", "64MiB"),
            ("GPUSHIM_MEMORY_LIMIT_1", "32MiB"),
        ],
        &[
            ("CUDA_DEVICE_MEMORY_LIMIT", "64m"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "32m"),
        ],
    ];
    for p in RUNTIMES {
        for env in envs {
            for shim in [false, true] {
                scenario.check(runtime_run(p, "1GiB", env), shim);
            }
        }
    }
}

/// GPUSHIM_MEMORY_LIMIT=25% of a 16 GiB device is exactly 4 GiB: 4 GiB fits, 2 MiB more does not.
#[test]
fn fraction_of_physical_memory() {
    let scenario = Scenario::new(16 * GIB, &[Some(4 * GIB), Some(4 * GIB)])
        .op(Op::Info)
        .op(Op::Alloc("malloc", 4 * GIB))
        .op(Op::Info)
        .op(Op::Alloc("malloc", 2 * MIB))
        .op(Op::Free(2))
        .op(Op::Alloc("async", 3 * GIB))
        .op(Op::Alloc("malloc", GIB))
        .op(Op::Alloc("managed", 2 * MIB));
    for p in RUNTIMES {
        for shim in [false, true] {
            scenario.check(
                runtime_run(p, "16GiB", &[("GPUSHIM_MEMORY_LIMIT", "25%")]),
                shim,
            );
        }
    }
}

/// Per-thread-default-stream callers (cudaMallocAsync_ptsz) reach the driver's _ptsz
/// variants through the shim, as without it.
#[test]
fn per_thread_stream_variants_reach_the_driver() {
    let scenario = standard("async");
    for (p, ptsz) in [(RUNTIMES[1], false), (RUNTIMES[2], true)] {
        for shim in [false, true] {
            let out = scenario.check(
                runtime_run(p, "1GiB", &[("GPUSHIM_MEMORY_LIMIT", "64MiB")]),
                shim,
            );
            let report = out.report();
            let (wanted, other) = if ptsz {
                ("cuMemAllocAsync_ptsz", "cuMemAllocAsync")
            } else {
                ("cuMemAllocAsync", "cuMemAllocAsync_ptsz")
            };
            assert!(
                report.calls(wanted) > 0,
                "no call of {wanted}: {:?}\n{}",
                report.calls,
                out.dump()
            );
            assert_eq!(report.calls(other), 0, "calls of {other}\n{}", out.dump());
        }
    }
}
