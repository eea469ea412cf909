//! Memory limits through the driver API: every way of reaching the driver (linked, dlsym,
//! cuGetProcAddress v2 flags 0/2, v1) × every counted allocation API, each run with the
//! shim (limit holds, warning logged, memory info honest) and without it (the same
//! over-limit requests succeed, so the tests can fail).

mod common;

use common::*;

const PHYSICAL: u64 = GIB;
const LIMIT: u64 = 64 * MIB;
const LIMIT_1: u64 = 32 * MIB;

/// The simulator with 2 devices of 1 GiB; `extra` variables on top.
fn driver_run(path: DriverPath, extra: &[(&str, &str)]) -> Run {
    Run::program(Program::Driver(path))
        .env("GPUSIM_DEVICES", "2")
        .env("GPUSIM_MEMORY", "1GiB")
        .envs(extra)
}

/// Checks `scenario` through each of `paths`, without and with the shim, with `env` set.
fn check_paths(scenario: &Scenario, paths: &[DriverPath], env: &[(&str, &str)]) {
    for &path in paths {
        for shim in [false, true] {
            scenario.check(driver_run(path, env), shim);
        }
    }
}

/// Linked and through cuGetProcAddress, each with and without the per-thread default stream
/// (dlsym of the `_ptsz` names).
const MIXED_PATHS: [DriverPath; 4] = [
    DriverPath::Link,
    DriverPath::DlsymPtsz,
    DriverPath::Gpa,
    DriverPath::GpaPtsz,
];

/// Fill up to the limit, get refused, free, retry; memory info along the way.
fn standard(api: &'static str) -> Scenario {
    standard_on(api, &[Some(LIMIT), Some(LIMIT)])
}

/// [`standard`] on devices of these limits.
fn standard_on(api: &'static str, limits: &[Option<u64>]) -> Scenario {
    Scenario::new(PHYSICAL, limits)
        .op(Op::Alloc(api, 40 * MIB)) // 1
        .op(Op::Info) // 2: free 24 MiB
        .op(Op::Alloc(api, 16 * MIB)) // 3: 56 MiB in use
        .op(Op::Alloc(api, 10 * MIB)) // 4: refused (66 > 64)
        .op(Op::Info) // 5: free 8 MiB
        .op(Op::Alloc(api, 8 * MIB)) // 6: exactly at the limit
        .op(Op::Alloc(api, 2 * MIB)) // 7: refused
        .op(Op::Free(1)) // 8: 24 MiB in use
        .op(Op::Info) // 9: free 40 MiB
        .op(Op::Alloc(api, 40 * MIB)) // 10: fits again
        .op(Op::Info) // 11: free 0
}

/// Device 0 limited by GPUSHIM_MEMORY_LIMIT, device 1 by GPUSHIM_MEMORY_LIMIT_1.
fn per_device(api: &'static str) -> Scenario {
    Scenario::new(PHYSICAL, &[Some(LIMIT), Some(LIMIT_1)])
        .op(Op::Alloc(api, 40 * MIB)) // 1: device 0
        .op(Op::Dev(1)) // 2
        .op(Op::Alloc(api, 40 * MIB)) // 3: refused on device 1 (limit 32 MiB)
        .op(Op::Alloc(api, 32 * MIB)) // 4
        .op(Op::Info) // 5: total 32 MiB, free 0
        .op(Op::Alloc(api, 2 * MIB)) // 6: refused
        .op(Op::Dev(0)) // 7
        .op(Op::Info) // 8: total 64 MiB, free 24 MiB
        .op(Op::Alloc(api, 24 * MIB)) // 9
        .op(Op::Alloc(api, 2 * MIB)) // 10: refused
        .op(Op::Free(4)) // 11: device 1's 32 MiB, freed from device 0's context
        .op(Op::Dev(1)) // 12
        .op(Op::Info) // 13: free 32 MiB
        .op(Op::Alloc(api, 32 * MIB)) // 14
}

const LIMIT_ENV: &[(&str, &str)] = &[("GPUSHIM_MEMORY_LIMIT", "64MiB")];
const PER_DEVICE_ENV: &[(&str, &str)] = &[
    ("GPUSHIM_MEMORY_LIMIT", "64MiB"),
    ("GPUSHIM_MEMORY_LIMIT_1", "32MiB"),
];

/// The stream-ordered APIs must reach the driver in the variant the program asked for
/// (`_ptsz` for per-thread default stream callers), also through the shim.
fn check_stream_variant(out: &RunOutput, path: DriverPath, api: &str) {
    let (alloc, free) = match api {
        "async" => ("cuMemAllocAsync", "cuMemFreeAsync"),
        "pool" => ("cuMemAllocFromPoolAsync", "cuMemFreeAsync"),
        _ => return,
    };
    let report = out.report();
    for base in [alloc, free] {
        let (wanted, other) = if path.is_ptsz() {
            (format!("{base}_ptsz"), base.to_string())
        } else {
            (base.to_string(), format!("{base}_ptsz"))
        };
        assert!(
            report.calls(&wanted) > 0,
            "the driver saw no call of {wanted}: {:?}\n{}",
            report.calls,
            out.dump()
        );
        assert_eq!(
            report.calls(&other),
            0,
            "the driver saw calls of {other}\n{}",
            out.dump()
        );
    }
}

fn run_standard(path: DriverPath, api: &'static str) {
    let scenario = standard(api);
    for shim in [false, true] {
        let out = scenario.check(driver_run(path, LIMIT_ENV), shim);
        check_stream_variant(&out, path, api);
        if api == "vmm" {
            for op in [1, 3, 6, 10] {
                assert_eq!(
                    out.num(&format!("op{op}.maprc")),
                    0,
                    "mapping op{op}\n{}",
                    out.dump()
                );
            }
        }
    }
}

fn run_per_device(path: DriverPath, api: &'static str) {
    let scenario = per_device(api);
    check_paths(&scenario, &[path], PER_DEVICE_ENV);
}

macro_rules! path_tests {
    ($api:expr) => {
        use super::*;
        #[test]
        fn link() {
            run_standard(DriverPath::Link, $api)
        }
        #[test]
        fn link_ptsz() {
            run_standard(DriverPath::LinkPtsz, $api)
        }
        #[test]
        fn dlsym() {
            run_standard(DriverPath::Dlsym, $api)
        }
        #[test]
        fn dlsym_ptsz() {
            run_standard(DriverPath::DlsymPtsz, $api)
        }
        #[test]
        fn gpa() {
            run_standard(DriverPath::Gpa, $api)
        }
        #[test]
        fn gpa_ptsz() {
            run_standard(DriverPath::GpaPtsz, $api)
        }
        #[test]
        fn gpa_v1() {
            run_standard(DriverPath::GpaV1, $api)
        }
        #[test]
        fn per_device_link() {
            run_per_device(DriverPath::Link, $api)
        }
        #[test]
        fn per_device_dlsym() {
            run_per_device(DriverPath::Dlsym, $api)
        }
        #[test]
        fn per_device_gpa() {
            run_per_device(DriverPath::Gpa, $api)
        }
        #[test]
        fn per_device_gpa_ptsz() {
            run_per_device(DriverPath::GpaPtsz, $api)
        }
    };
}

macro_rules! api_tests {
    ($($module:ident => $api:expr),* $(,)?) => {
        $( mod $module { path_tests!($api); } )*
    };
}

api_tests! {
    mem => "mem",
    mem_v1 => "v1",
    pitch => "pitch",
    managed => "managed",
    async_alloc => "async",
    pool => "pool",
    vmm => "vmm",
    array => "array",
    array3d => "array3d",
    mipmap => "mipmap",
}

/// The simulator rounds a 1000-byte-wide pitch allocation to a 1024-byte pitch; the shim
/// must count pitch × height (1024 × 40960 = 40 MiB), not width × height.
#[test]
fn pitch_counts_pitch_times_height() {
    for shim in [false, true] {
        let out = driver_run(DriverPath::Link, LIMIT_ENV)
            .args(["alloc=pitch:41943040", "info"])
            .shim(shim)
            .run();
        out.assert_completed();
        assert_eq!(out.u64("op1.pitch"), 1024, "{}", out.dump());
        assert_eq!(out.u64("op1.height"), 40960, "{}", out.dump());
        let free = if shim {
            LIMIT - 40 * MIB
        } else {
            PHYSICAL - 40 * MIB
        };
        assert_eq!(out.u64("op2.free"), free, "{}", out.dump());
    }
}

/// Host memory never counts: 100 MiB of it, then the whole limit on the device.
fn host_scenario(api: &'static str) -> Scenario {
    Scenario::new(PHYSICAL, &[Some(LIMIT), Some(LIMIT)])
        .op(Op::Alloc(api, 100 * MIB))
        .op(Op::Info)
        .op(Op::Alloc("mem", LIMIT))
        .op(Op::Info)
        .op(Op::Free(1))
}

#[test]
fn host_allocations_are_not_counted() {
    for api in ["host", "hostalloc"] {
        let paths = [DriverPath::Link, DriverPath::Dlsym, DriverPath::Gpa];
        check_paths(&host_scenario(api), &paths, LIMIT_ENV);
    }
}

#[test]
fn registered_host_memory_is_not_counted() {
    let paths = [DriverPath::Link, DriverPath::Gpa];
    check_paths(&host_scenario("hostreg"), &paths, LIMIT_ENV);
}

/// Memory freed by a different context than the one it was allocated in goes back to the
/// device it came from; nothing leaks between the devices' budgets.
#[test]
fn frees_return_to_the_right_device() {
    let scenario = Scenario::new(PHYSICAL, &[Some(LIMIT), Some(LIMIT)])
        .op(Op::Alloc("mem", LIMIT)) // 1: device 0 full
        .op(Op::Dev(1)) // 2
        .op(Op::Free(1)) // 3: freed while device 1 is current
        .op(Op::Info) // 4: device 1 untouched
        .op(Op::Alloc("mem", LIMIT)) // 5: device 1 full
        .op(Op::Dev(0)) // 6
        .op(Op::Info) // 7: device 0 empty again
        .op(Op::Alloc("mem", LIMIT)); // 8
    check_paths(&scenario, &[DriverPath::Link, DriverPath::Gpa], LIMIT_ENV);
}

/// Mixed APIs share one budget per device.
#[test]
fn all_apis_share_one_budget() {
    let apis = [
        "mem", "pitch", "managed", "async", "pool", "vmm", "array", "array3d", "mipmap",
    ];
    let mut scenario = Scenario::new(PHYSICAL, &[Some(LIMIT), Some(LIMIT)]);
    for api in apis {
        scenario = scenario.op(Op::Alloc(api, 6 * MIB)); // 9 × 6 = 54 MiB
    }
    scenario = scenario
        .op(Op::Info) // 10: 10 MiB free
        .op(Op::Alloc("vmm", 12 * MIB)) // 11: refused
        .op(Op::Alloc("array", 10 * MIB)) // 12: exactly the limit
        .op(Op::Alloc("mem", 2 * MIB)) // 13: refused
        .op(Op::Free(5)) // 14: the pool allocation
        .op(Op::Alloc("managed", 6 * MIB)) // 15
        .op(Op::Info); // 16: 0 free
    check_paths(&scenario, &MIXED_PATHS, LIMIT_ENV);
}

/// cuDeviceTotalMem is the effective limit: min(limit, physical), per device.
#[test]
fn total_mem_is_the_effective_limit() {
    let cases: &[(&[(&str, &str)], [u64; 2])] = &[
        (&[], [GIB, GIB]),
        (LIMIT_ENV, [LIMIT, LIMIT]),
        (PER_DEVICE_ENV, [LIMIT, LIMIT_1]),
        (&[("GPUSHIM_MEMORY_LIMIT_1", "32MiB")], [GIB, LIMIT_1]),
        (&[("GPUSHIM_MEMORY_LIMIT", "4GiB")], [GIB, GIB]), // above physical
        (&[("GPUSHIM_MEMORY_LIMIT", "unlimited")], [GIB, GIB]),
        (&[("GPUSHIM_MEMORY_LIMIT", "0")], [0, 0]),
        (&[("GPUSHIM_MEMORY_LIMIT", "25%")], [GIB / 4, GIB / 4]),
        (&[("GPUSHIM_MEMORY_LIMIT", "0.5")], [GIB / 2, GIB / 2]),
        (
            &[
                ("GPUSHIM_MEMORY_LIMIT", "12.5%"),
                ("GPUSHIM_MEMORY_LIMIT_1", "100%"),
            ],
            [GIB / 8, GIB],
        ),
        (
            &[("GPUSHIM_MEMORY_LIMIT", "100MB")],
            [100_000_000, 100_000_000],
        ),
        (&[("GPUSHIM_MEMORY_LIMIT", " 0.5g ")], [GIB / 2, GIB / 2]),
        (&[("GPUSHIM_MEMORY_LIMIT", "08M")], [8 * MIB, 8 * MIB]),
        (&[("GPUSHIM_MEMORY_LIMIT", "4 KiB")], [4096, 4096]),
        (
            &[("GPUSHIM_MEMORY_LIMIT", "123456789")],
            [123_456_789, 123_456_789],
        ),
        // the HAMi-core aliases, and their lower precedence
        (&[("CUDA_DEVICE_MEMORY_LIMIT", "64m")], [LIMIT, LIMIT]),
        (&[("CUDA_DEVICE_MEMORY_LIMIT_1", "32m")], [GIB, LIMIT_1]),
        (
            &[
                ("CUDA_DEVICE_MEMORY_LIMIT", "64m"),
                ("CUDA_DEVICE_MEMORY_LIMIT_1", "32m"),
            ],
            [LIMIT, LIMIT_1],
        ),
        (
            &[
                ("CUDA_DEVICE_MEMORY_LIMIT", "16m"),
                ("GPUSHIM_MEMORY_LIMIT", "64MiB"),
            ],
            [LIMIT, LIMIT],
        ),
        (
            &[
                ("CUDA_DEVICE_MEMORY_LIMIT_1", "16m"),
                ("GPUSHIM_MEMORY_LIMIT_1", "32MiB"),
            ],
            [GIB, LIMIT_1],
        ),
    ];
    for path in [
        DriverPath::Link,
        DriverPath::Dlsym,
        DriverPath::Gpa,
        DriverPath::GpaV1,
    ] {
        for (env, totals) in cases {
            for shim in [false, true] {
                let out = driver_run(path, env).arg("totalmem").shim(shim).run();
                out.assert_completed();
                for (d, total) in totals.iter().enumerate() {
                    let want = if shim { *total } else { PHYSICAL };
                    assert_eq!(out.num(&format!("op1.rc{d}")), 0, "{}", out.dump());
                    assert_eq!(
                        out.u64(&format!("op1.total{d}")),
                        want,
                        "device {d} with {env:?}\n{}",
                        out.dump()
                    );
                }
                assert!(
                    out.gpushim_lines().is_empty(),
                    "valid settings print nothing\n{}",
                    out.dump()
                );
            }
        }
    }
}

/// A limit above the physical memory changes nothing; a limit of 0 refuses everything.
#[test]
fn limit_above_physical_and_zero() {
    // Above the physical memory the driver's own refusal (1030 MiB > 1 GiB) comes through.
    let ops = ["info", "alloc=mem:1048576000", "info", "alloc=mem:31457280"];
    for shim in [false, true] {
        let o = driver_run(DriverPath::Link, &[("GPUSHIM_MEMORY_LIMIT", "4GiB")])
            .args(ops)
            .shim(shim)
            .run();
        o.assert_completed();
        assert_eq!(o.u64("op1.total"), PHYSICAL, "{}", o.dump());
        assert_eq!(o.u64("op1.free"), PHYSICAL, "{}", o.dump());
        assert_eq!(o.num("op2.rc"), 0, "{}", o.dump());
        assert_eq!(o.u64("op3.free"), PHYSICAL - 1000 * MIB, "{}", o.dump());
        assert_eq!(o.num("op4.rc"), OOM, "{}", o.dump());
        assert_eq!(o.report().device(0).used, 0, "{}", o.dump());
    }
    let zero = Scenario::new(PHYSICAL, &[Some(0), Some(0)])
        .op(Op::Info)
        .op(Op::Alloc("mem", 2 * MIB))
        .op(Op::Alloc("vmm", 2 * MIB))
        .op(Op::Alloc("host", 2 * MIB));
    for shim in [false, true] {
        zero.check(
            driver_run(DriverPath::Gpa, &[("GPUSHIM_MEMORY_LIMIT", "0")]),
            shim,
        );
    }
}

/// cuMemGetInfo tolerates NULL out-pointers and answers the other one exactly; the shim
/// gives the same status codes as the driver does.
#[test]
fn mem_get_info_null_pointers() {
    for path in [
        DriverPath::Link,
        DriverPath::Dlsym,
        DriverPath::Gpa,
        DriverPath::GpaV1,
    ] {
        let plain = driver_run(path, LIMIT_ENV)
            .args(["alloc=mem:10485760", "infonull"])
            .run();
        plain.assert_completed();
        let shimmed = driver_run(path, LIMIT_ENV)
            .args(["alloc=mem:10485760", "infonull"])
            .shim(true)
            .run();
        shimmed.assert_completed();
        for key in ["op2.rc_null_free", "op2.rc_null_total", "op2.rc_null_both"] {
            assert_eq!(
                shimmed.num(key),
                plain.num(key),
                "{key}: shim and driver disagree\n{}\n{}",
                plain.dump(),
                shimmed.dump()
            );
        }
        if plain.num("op2.rc_null_free") == 0 {
            assert_eq!(plain.u64("op2.total"), PHYSICAL);
            assert_eq!(shimmed.u64("op2.total"), LIMIT, "{}", shimmed.dump());
        }
        if plain.num("op2.rc_null_total") == 0 {
            assert_eq!(plain.u64("op2.free"), PHYSICAL - 10 * MIB);
            assert_eq!(
                shimmed.u64("op2.free"),
                LIMIT - 10 * MIB,
                "{}",
                shimmed.dump()
            );
        }
    }
}

/// The unversioned v1 exports (32-bit sizes) get v1-shaped answers: exact values, clamped to
/// 32 bits like the driver does, and never a 64-bit write past the caller's variable.
#[test]
fn v1_queries_keep_their_abi() {
    let clamp = |v: u64| v.min(u32::MAX as u64);
    // (GPUSIM_MEMORY, bytes, GPUSHIM_MEMORY_LIMIT, bytes)
    let cases: &[(&str, u64, &str, u64)] = &[
        ("1GiB", GIB, "64MiB", 64 * MIB),
        ("16GiB", 16 * GIB, "6GiB", 6 * GIB),
        ("16GiB", 16 * GIB, "3GiB", 3 * GIB),
    ];
    for path in DriverPath::ALL {
        for (memory, physical, limit, limit_bytes) in cases {
            for shim in [false, true] {
                let out = Run::program(Program::Driver(path))
                    .env("GPUSIM_MEMORY", memory)
                    .env("GPUSHIM_MEMORY_LIMIT", limit)
                    .args(["v1info", "v1total", "alloc=v1:10485760", "v1info"])
                    .shim(shim)
                    .run();
                out.assert_completed();
                let total = if shim {
                    (*limit_bytes).min(*physical)
                } else {
                    *physical
                };
                let what = format!("{path:?}, {memory}, limit {limit}, shim {shim}");
                for (op, free) in [(1, total), (4, total - 10 * MIB)] {
                    assert_eq!(out.num(&format!("op{op}.rc")), 0, "{}", out.dump());
                    assert_eq!(
                        out.get(&format!("op{op}.canary")),
                        "ok",
                        "v1 cuMemGetInfo wrote 64 bits\n{}",
                        out.dump()
                    );
                    assert_eq!(
                        out.u64(&format!("op{op}.total")),
                        clamp(total),
                        "{what}\n{}",
                        out.dump()
                    );
                    assert_eq!(
                        out.u64(&format!("op{op}.free")),
                        clamp(free),
                        "{what}\n{}",
                        out.dump()
                    );
                }
                assert_eq!(out.num("op3.rc"), 0, "{}", out.dump());
                for d in 0..2 {
                    assert_eq!(
                        out.get(&format!("op2.canary{d}")),
                        "ok",
                        "v1 cuDeviceTotalMem wrote 64 bits\n{}",
                        out.dump()
                    );
                    assert_eq!(
                        out.u64(&format!("op2.total{d}")),
                        clamp(total),
                        "{what}\n{}",
                        out.dump()
                    );
                }
            }
        }
    }
}

/// Stream-ordered memory (default pool and created pools) may be freed with plain cuMemFree:
/// it goes back to the budget all the same.
#[test]
fn stream_ordered_memory_freed_with_cu_mem_free() {
    let scenario = Scenario::new(PHYSICAL, &[Some(LIMIT), Some(LIMIT)])
        .op(Op::Alloc("async", 40 * MIB)) // 1
        .op(Op::Alloc("pool", 24 * MIB)) // 2: the limit
        .op(Op::Alloc("mem", 2 * MIB)) // 3: refused
        .op(Op::MemFree(1)) // 4
        .op(Op::MemFree(2)) // 5
        .op(Op::Info) // 6: all free
        .op(Op::Alloc("mem", LIMIT)); // 7
    check_paths(&scenario, &MIXED_PATHS, LIMIT_ENV);
}

/// One device, not split, counted as the driver gives it: `cuMemAlloc_v2`/`cuMemFree_v2`
/// take the fast lane (`src/accounting/lane.rs`, said at debug level), and the limit holds as on the
/// general path: the standard fill, and stream-ordered memory freed with `cuMemFree` (which
/// the lane hands to the general path). With two devices the lane stays closed.
#[test]
fn one_device_takes_the_fast_lane_and_the_limit_holds() {
    const LANE: &str = "take the fast lane";
    let env = [("GPUSIM_DEVICES", "1"), ("GPUSHIM_MEMORY_LIMIT", "64MiB"), ("GPUSHIM_LOG", "debug")];
    let stream = Scenario::new(PHYSICAL, &[Some(LIMIT)])
        .op(Op::Alloc("mem", 8 * MIB)) // 1
        .op(Op::Alloc("async", 32 * MIB)) // 2
        .op(Op::Alloc("pool", 24 * MIB)) // 3: the limit
        .op(Op::Alloc("mem", 2 * MIB)) // 4: refused
        .op(Op::MemFree(2)) // 5
        .op(Op::MemFree(3)) // 6
        .op(Op::MemFree(1)) // 7
        .op(Op::Info) // 8: all free
        .op(Op::Alloc("mem", LIMIT)) // 9: the whole limit, through the lane
        .op(Op::Alloc("mem", 1)); // 10: one byte beyond it, refused
    for scenario in [standard_on("mem", &[Some(LIMIT)]), stream] {
        for path in MIXED_PATHS {
            for shim in [false, true] {
                let run = Run::program(Program::Driver(path)).env("GPUSIM_MEMORY", "1GiB").envs(&env);
                let out = scenario.check(run, shim);
                assert_eq!(out.stderr_text().contains(LANE), shim, "{}", out.dump());
            }
        }
    }
    let out = standard("mem").check(driver_run(DriverPath::Link, &[("GPUSHIM_MEMORY_LIMIT", "64MiB"), ("GPUSHIM_LOG", "debug")]), true);
    assert!(!out.stderr_text().contains(LANE), "{}", out.dump());
}

/// GPUSHIM_MEMORY_LIMIT_<i> names the ordinal the program sees: with CUDA_VISIBLE_DEVICES=1
/// the program's device 0 is physical device 1, and that is where the limit applies.
#[test]
fn per_device_limit_follows_cuda_visible_devices() {
    for path in [DriverPath::Link, DriverPath::Gpa] {
        for shim in [false, true] {
            let out = driver_run(
                path,
                &[
                    ("CUDA_VISIBLE_DEVICES", "1"),
                    ("GPUSHIM_MEMORY_LIMIT_0", "32MiB"),
                ],
            )
            .args([
                "totalmem",
                "alloc=mem:33554432",
                "alloc=mem:2097152",
                "info",
            ])
            .shim(shim)
            .run();
            out.assert_completed();
            assert_eq!(out.num("count"), 1, "{}", out.dump());
            let total = if shim { 32 * MIB } else { PHYSICAL };
            assert_eq!(out.u64("op1.total0"), total, "{}", out.dump());
            assert_eq!(out.num("op2.rc"), 0, "{}", out.dump());
            assert_eq!(
                out.num("op3.rc"),
                if shim { OOM } else { 0 },
                "{}",
                out.dump()
            );
            assert_eq!(out.u64("op4.total"), total, "{}", out.dump());
            let report = out.report();
            assert_eq!(
                report.device(0).peak,
                0,
                "physical device 0 is hidden\n{}",
                out.dump()
            );
            assert_eq!(
                report.device(1).peak,
                if shim { 32 * MIB } else { 34 * MIB },
                "{}",
                out.dump()
            );
            if shim {
                let warns = out.warn_lines();
                assert_eq!(warns.len(), 1, "{}", out.dump());
                assert_mentions_device(&warns[0], 0);
                assert_mentions_numbers(&warns[0], &[2 * MIB, 32 * MIB]);
            }
        }
    }
}

/// Runs the driver program (linked, and through cuGetProcAddress) with a 64 MiB limit, without
/// and with the shim.
fn vmm_runs(args: &[String]) -> Vec<(bool, RunOutput)> {
    let mut runs = Vec::new();
    for path in [DriverPath::Link, DriverPath::Gpa] {
        for shim in [false, true] {
            let o = driver_run(path, LIMIT_ENV).args(args).shim(shim).run();
            o.assert_completed();
            assert_eq!(o.num("cleanup.failures"), 0, "{}", o.dump());
            assert_eq!(o.report().device(0).used, 0, "{}", o.dump());
            runs.push((shim, o));
        }
    }
    runs
}

/// A VMM handle released while still mapped holds its memory (the driver frees it once it is
/// both released and unmapped, as NVIDIA's samples rely on): the shim keeps counting it.
#[test]
fn vmm_released_while_mapped_counts_until_unmapped() {
    let m = 40 * MIB;
    let args: Vec<String> = [
        format!("alloc=vmm:{m}"), // 1
        "vrelease=1".into(),      // 2: mapping stays
        "sim=0".into(),           // 3: still resident
        format!("alloc=vmm:{m}"), // 4: over the limit while 1 is mapped
        format!("vunmap=1:0:{m}"), // 5: now freed
        "sim=0".into(),           // 6
        format!("alloc=vmm:{m}"), // 7: fits
        "vrelease=1".into(),      // 8: already released
        format!("vunmap=7:{}:{}", 2 * m, MIB * 2), // 9: not mapped: the driver's answer
    ]
    .into();
    for (shim, o) in vmm_runs(&args) {
        assert_eq!(o.num("op1.rc"), 0, "{}", o.dump());
        assert_eq!(o.num("op2.rc"), 0, "{}", o.dump());
        assert_eq!(o.u64("op3.used"), m, "{}", o.dump());
        assert_eq!(o.num("op4.rc"), if shim { OOM } else { 0 }, "{}", o.dump());
        assert_eq!(o.num("op5.rc"), 0, "{}", o.dump());
        assert_eq!(o.u64("op6.used"), if shim { 0 } else { m }, "{}", o.dump());
        assert_eq!(o.num("op7.rc"), 0, "{}", o.dump());
        assert_eq!(o.num("op8.rc"), 1, "{}", o.dump());
        assert_eq!(o.num("op9.rc"), 1, "{}", o.dump());
        if shim {
            assert!(o.report().device(0).peak <= LIMIT, "{}", o.dump());
        } else {
            assert_eq!(o.report().device(0).peak, 2 * m, "{}", o.dump());
        }
    }
}

/// cuMemRetainAllocationHandle adds a reference: released and unmapped, the handle still
/// counts until that reference is released too. Partial unmaps free it only with the last.
#[test]
fn vmm_retained_and_partly_unmapped_handles_count() {
    let m = 40 * MIB;
    let half = m / 2;
    let args: Vec<String> = [
        format!("alloc=vmmhalves:{m}"),   // 1
        "vretain=1".into(),               // 2: a second reference
        "vrelease=1".into(),              // 3
        format!("vunmap=1:0:{half}"),     // 4: first half
        format!("alloc=vmm:{m}"),         // 5: 1 still mapped
        format!("vunmap=1:{half}:{half}"), // 6: all unmapped, one reference left
        format!("alloc=vmm:{m}"),         // 7: still held
        "sim=0".into(),                   // 8
        "vrelease=1".into(),              // 9: the retained reference: freed
        "sim=0".into(),                   // 10
        format!("alloc=vmm:{m}"),         // 11: fits
    ]
    .into();
    for (shim, o) in vmm_runs(&args) {
        for op in [1, 2, 3, 4, 6, 9, 11] {
            assert_eq!(o.num(&format!("op{op}.rc")), 0, "op{op}: {}", o.dump());
        }
        assert_eq!(o.num("op2.same"), 1, "{}", o.dump());
        let refused = if shim { OOM } else { 0 };
        assert_eq!(o.num("op5.rc"), refused, "{}", o.dump());
        assert_eq!(o.num("op7.rc"), refused, "{}", o.dump());
        let others = if shim { 0 } else { 2 * m };
        assert_eq!(o.u64("op8.used"), m + others, "{}", o.dump());
        assert_eq!(o.u64("op10.used"), others, "{}", o.dump());
        if shim {
            assert!(o.report().device(0).peak <= LIMIT, "{}", o.dump());
        }
    }
}
