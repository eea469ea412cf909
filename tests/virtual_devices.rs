//! `GPUSHIM_VIRTUAL_DEVICES`: one physical GPU split into several devices, each with its own
//! ordinal, UUID, memory size, limit and contexts — through the driver API (linked with
//! `-lcuda`, `dlopen`+`dlsym`, `cuGetProcAddress` v2 and v1) and the real CUDA runtimes 12.9
//! and 13.5, on the simulated driver with 2 physical devices of 16 GiB (NVML is tested in
//! `tests/nvml_virtual.rs`).
//!
//! With `0:2x4GiB` the program sees 3 devices: ordinals 0 and 1 are the two 4 GiB parts of
//! physical device 0, ordinal 2 is physical device 1. Every case also runs without the shim in
//! the same environment (2 devices of 16 GiB, the over-limit allocations succeed), so each test
//! can fail.
//!
//! Covered: the view (count, names, UUIDs, PCI ids, attributes, totals, invalid ordinals),
//! independent limits of the parts and the simulator's peak of the physical device, a thread per
//! part allocating concurrently, contexts / pointer ordinals / peer queries, copies between
//! parts (`cuMemcpyPeer[Async]`, `cudaMemcpyPeer[Async]`), configuration errors, the split after
//! `GPUSHIM_VISIBLE_DEVICES`, per-device limits on a virtual ordinal, other allocation APIs on a
//! part, and that without a split the device-translating hooks are never handed out.

mod common;

use common::*;

/// CUDA_ERROR_INVALID_DEVICE / cudaErrorInvalidDevice.
const INVALID_DEVICE: i64 = 101;

const PHYSICAL: u64 = 16 * GIB;
const PART: u64 = 4 * GIB;
const SPLIT: (&str, &str) = ("GPUSHIM_VIRTUAL_DEVICES", "0:2x4GiB");

/// Physical device 0's two parts under `0:2x4GiB` (the contract's exact values).
const PART0_UUID: &str = "GPU-10111213-1415-8617-aadb-9b4472064d98";
const PART1_UUID: &str = "GPU-10111213-1415-8617-adad-4cfdbe048297";

const RUNTIME_12: Program = Program::Runtime {
    major: 12,
    ptsz: false,
};
const RUNTIME_13: Program = Program::Runtime {
    major: 13,
    ptsz: false,
};
const RUNTIMES: [Program; 2] = [RUNTIME_12, RUNTIME_13];

/// The driver-API paths most tests use: linked, dlsym, cuGetProcAddress.
const DRIVER_PATHS: [DriverPath; 3] = [DriverPath::Link, DriverPath::Dlsym, DriverPath::Gpa];

/// The driver-API programs of [`DRIVER_PATHS`].
fn driver_programs() -> Vec<Program> {
    DRIVER_PATHS.iter().map(|&p| Program::Driver(p)).collect()
}

fn is_runtime(p: Program) -> bool {
    matches!(p, Program::Runtime { .. })
}

/// The allocation API name of a program (`mem` for the driver API, `malloc` for the runtime).
fn alloc_api(p: Program) -> &'static str {
    if is_runtime(p) {
        "malloc"
    } else {
        "mem"
    }
}

/// The simulator with 2 physical devices of 16 GiB, `env` on top.
fn run2(p: Program, env: &[(&str, &str)]) -> Run {
    Run::program(p)
        .env("GPUSIM_DEVICES", "2")
        .env("GPUSIM_MEMORY", "16GiB")
        .envs(env)
}

/// `alloc=API:BYTES`.
fn alloc(p: Program, bytes: u64) -> String {
    format!("alloc={}:{bytes}", alloc_api(p))
}

fn what(p: Program, shim: bool, env: &[(&str, &str)]) -> String {
    format!("{p:?} shim={shim} env={env:?}")
}

/// The program initialised and saw `count` devices.
fn assert_started(out: &RunOutput, count: u64, what: &str) {
    out.assert_completed();
    assert_eq!(out.num("init.rc"), 0, "{what}: CUDA init\n{}", out.dump());
    assert_eq!(
        out.u64("count"),
        count,
        "{what}: device count\n{}",
        out.dump()
    );
}

fn assert_num(out: &RunOutput, key: &str, want: i64, what: &str) {
    assert_eq!(out.num(key), want, "{what}: `{key}`\n{}", out.dump());
}

fn assert_u64(out: &RunOutput, key: &str, want: u64, what: &str) {
    assert_eq!(out.u64(key), want, "{what}: `{key}`\n{}", out.dump());
}

/// `opN.rc` is 0 for every N of `ops`.
fn assert_ok(out: &RunOutput, ops: impl IntoIterator<Item = u32>, what: &str) {
    for op in ops {
        assert_num(out, &format!("op{op}.rc"), 0, what);
    }
}

/// `opN.rc` is 0 and `opN.KEY` is `want` for every (N, want) of `checks`.
fn assert_ok_with(
    out: &RunOutput,
    key: &str,
    checks: impl IntoIterator<Item = (u32, i64)>,
    what: &str,
) {
    for (op, want) in checks {
        assert_num(out, &format!("op{op}.rc"), 0, what);
        assert_num(out, &format!("op{op}.{key}"), want, what);
    }
}

/// `opN` (`info`) and the `dev=` before it succeeded; the device is empty with `total` bytes.
fn assert_empty_info(out: &RunOutput, op: u32, total: u64, what: &str) {
    assert_ok(out, [op - 1, op], what);
    assert_u64(out, &format!("op{op}.total"), total, what);
    assert_u64(out, &format!("op{op}.free"), total, what);
}

/// Nothing was left to free at the end and, with the shim, it printed nothing.
fn assert_clean_end(out: &RunOutput, shim: bool, what: &str) {
    assert_num(out, "cleanup.failures", 0, what);
    if shim {
        assert!(out.gpushim_lines().is_empty(), "{what}\n{}", out.dump());
    }
}

/// The simulator's report: physical `p` peaked at `peak` and holds nothing at exit.
fn assert_peak(out: &RunOutput, p: u64, peak: u64, what: &str) {
    let dev = out.report().device(p);
    assert_eq!(
        dev.peak,
        peak,
        "{what}: peak of physical device {p} in the simulator\n{}",
        out.dump()
    );
    assert_eq!(
        dev.used,
        0,
        "{what}: physical device {p} still has memory in use at exit\n{}",
        out.dump()
    );
}

/// Identity of ordinal `d` in the `ids` output: name, UUID (also the v1 UUID where printed),
/// PCI bus id, PCI bus attribute and total memory.
fn assert_ident(out: &RunOutput, d: u32, phys: u32, uuid: &str, total: u64, what: &str) {
    let k = |f: &str| format!("dev{d}.{f}");
    assert_num(out, &k("rc"), 0, what);
    assert_eq!(
        out.get(&k("name")),
        phys_name(phys),
        "{what}: name of {d}\n{}",
        out.dump()
    );
    assert_eq!(
        out.get(&k("uuid")),
        uuid,
        "{what}: UUID of {d}\n{}",
        out.dump()
    );
    if let Some(v1) = out.kv.get(&k("uuid1")) {
        assert_eq!(
            v1,
            uuid,
            "{what}: v1 cuDeviceGetUuid of {d}\n{}",
            out.dump()
        );
    }
    assert!(
        out.get(&k("pci")).eq_ignore_ascii_case(&phys_pci(phys)),
        "{what}: PCI bus id of {d} must be {}\n{}",
        phys_pci(phys),
        out.dump()
    );
    assert_u64(out, &k("pcibus"), phys_bus(phys) as u64, what);
    assert_u64(out, &k("total"), total, what);
}

/// Every `devD.attrA` of `out` equals `devP.attrA` of `reference` (a run without the shim,
/// where ordinal P is physical device P).
fn assert_attrs_as(out: &RunOutput, d: u32, reference: &RunOutput, p: u32, what: &str) {
    let prefix = format!("dev{p}.attr");
    let mut n = 0;
    for (key, want) in reference.kv.range(prefix.clone()..) {
        let Some(attr) = key.strip_prefix(&prefix) else {
            break;
        };
        let mine = format!("dev{d}.attr{attr}");
        assert_eq!(
            out.get(&mine),
            want,
            "{what}: attribute {attr} of ordinal {d} must be physical {p}'s\n{}",
            out.dump()
        );
        n += 1;
    }
    assert!(
        n >= 8,
        "{what}: the reference has too few attributes\n{}",
        reference.dump()
    );
}

// ---------------------------------------------------------------------------------------
// 1. the view
// ---------------------------------------------------------------------------------------

/// Driver API: 3 devices; ordinals 0 and 1 are physical 0 (name, PCI id, attributes) with
/// 4 GiB each (cuDeviceTotalMem_v2, cuMemGetInfo) and their own UUIDs; ordinal 2 is physical 1
/// with 16 GiB; cuDeviceGet(3) is CUDA_ERROR_INVALID_DEVICE.
#[test]
fn driver_api_sees_three_devices() {
    // 1 ids, 2 attrs, 3 get=3, 4 dev=0, 5 info, 6 dev=1, 7 info, 8 dev=2, 9 info, 10 totalmem,
    // 11 v1total
    let args = [
        "ids", "attrs", "get=3", "dev=0", "info", "dev=1", "info", "dev=2", "info", "totalmem",
        "v1total",
    ];
    for path in [
        DriverPath::Link,
        DriverPath::Dlsym,
        DriverPath::Gpa,
        DriverPath::GpaV1,
    ] {
        let p = Program::Driver(path);
        let plain = run2(p, &[SPLIT]).args(args).run();
        let w = what(p, false, &[SPLIT]);
        assert_started(&plain, 2, &w);
        assert_ident(&plain, 0, 0, &phys_uuid(0), PHYSICAL, &w);
        assert_ident(&plain, 1, 1, &phys_uuid(1), PHYSICAL, &w);
        assert_num(&plain, "op3.rc", INVALID_DEVICE, &w);
        assert_u64(&plain, "op5.total", PHYSICAL, &w);
        assert_u64(&plain, "op7.total", PHYSICAL, &w);
        assert_num(&plain, "op8.rc", INVALID_DEVICE, &w);
        assert!(plain.gpushim_lines().is_empty(), "{w}\n{}", plain.dump());

        let out = run2(p, &[SPLIT]).args(args).shim(true).run();
        let w = what(p, true, &[SPLIT]);
        assert_started(&out, 3, &w);
        assert_num(&out, "ids.count", 3, &w);
        assert_ident(&out, 0, 0, PART0_UUID, PART, &w);
        assert_ident(&out, 1, 0, PART1_UUID, PART, &w);
        assert_ident(&out, 2, 1, &phys_uuid(1), PHYSICAL, &w);
        assert_attrs_as(&out, 0, &plain, 0, &w);
        assert_attrs_as(&out, 1, &plain, 0, &w);
        assert_attrs_as(&out, 2, &plain, 1, &w);
        assert_num(&out, "op3.rc", INVALID_DEVICE, &w);
        for (op, total) in [(5, PART), (7, PART), (9, PHYSICAL)] {
            assert_empty_info(&out, op, total, &w);
        }
        for (d, total) in [PART, PART, PHYSICAL].iter().enumerate() {
            assert_num(&out, &format!("op10.rc{d}"), 0, &w);
            assert_u64(&out, &format!("op10.total{d}"), *total, &w);
            // the v1 cuDeviceTotalMem: 32 bits, clamped as the driver does
            assert_num(&out, &format!("op11.rc{d}"), 0, &w);
            assert_u64(
                &out,
                &format!("op11.total{d}"),
                (*total).min(u32::MAX as u64),
                &w,
            );
            assert_eq!(
                out.get(&format!("op11.canary{d}")),
                "ok",
                "{w}\n{}",
                out.dump()
            );
        }
        assert!(
            out.gpushim_lines().is_empty(),
            "{w}: a valid split prints nothing\n{}",
            out.dump()
        );
    }
}

/// The CUDA runtime: cudaGetDeviceCount 3, cudaGetDeviceProperties (name, UUID, PCI bus,
/// totalGlobalMem 4 GiB / 4 GiB / 16 GiB), cudaDeviceGetAttribute as the physical device,
/// cudaMemGetInfo per device, cudaSetDevice(3) = cudaErrorInvalidDevice.
#[test]
fn runtime_sees_three_devices() {
    // 1 ids, 2 props, 3 attrs, 4 dev=3, 5 dev=0, 6 info, 7 dev=1, 8 info, 9 dev=2, 10 info
    let args = [
        "ids", "props", "attrs", "dev=3", "dev=0", "info", "dev=1", "info", "dev=2", "info",
    ];
    for p in RUNTIMES {
        let plain = run2(p, &[SPLIT]).args(args).run();
        let w = what(p, false, &[SPLIT]);
        assert_started(&plain, 2, &w);
        assert_ident(&plain, 0, 0, &phys_uuid(0), PHYSICAL, &w);
        assert_ident(&plain, 1, 1, &phys_uuid(1), PHYSICAL, &w);
        assert_num(&plain, "op4.rc", INVALID_DEVICE, &w);
        assert_u64(&plain, "op6.total", PHYSICAL, &w);
        assert_u64(&plain, "op8.total", PHYSICAL, &w);
        assert!(plain.gpushim_lines().is_empty(), "{w}\n{}", plain.dump());

        let out = run2(p, &[SPLIT]).args(args).shim(true).run();
        let w = what(p, true, &[SPLIT]);
        assert_started(&out, 3, &w);
        assert_num(&out, "setdevice.rc", 0, &w);
        assert_num(&out, "ids.count", 3, &w);
        assert_ident(&out, 0, 0, PART0_UUID, PART, &w);
        assert_ident(&out, 1, 0, PART1_UUID, PART, &w);
        assert_ident(&out, 2, 1, &phys_uuid(1), PHYSICAL, &w);
        for (d, total) in [PART, PART, PHYSICAL].iter().enumerate() {
            assert_num(&out, &format!("op2.rc{d}"), 0, &w);
            assert_u64(&out, &format!("op2.total{d}"), *total, &w);
        }
        assert_eq!(out.get("op2.name1"), phys_name(0), "{w}\n{}", out.dump());
        assert_eq!(out.get("op2.name2"), phys_name(1), "{w}\n{}", out.dump());
        assert_attrs_as(&out, 0, &plain, 0, &w);
        assert_attrs_as(&out, 1, &plain, 0, &w);
        assert_attrs_as(&out, 2, &plain, 1, &w);
        assert_num(&out, "op4.rc", INVALID_DEVICE, &w);
        for (op, total) in [(6, PART), (8, PART), (10, PHYSICAL)] {
            assert_empty_info(&out, op, total, &w);
        }
        assert!(
            out.gpushim_lines().is_empty(),
            "{w}: a valid split prints nothing\n{}",
            out.dump()
        );
    }
}

// ---------------------------------------------------------------------------------------
// 2. independent limits
// ---------------------------------------------------------------------------------------

/// 3 GiB on device 0 and 3 GiB on device 1; 1.5 GiB more on device 0 is refused (one warning
/// naming device 0) while 1 GiB more on device 1 still fits; memory info per device; the
/// simulator sees 7 GiB on physical device 0 at its peak.
#[test]
fn parts_have_independent_limits_driver_api() {
    independent_limits(&driver_programs());
}

#[test]
fn parts_have_independent_limits_runtime() {
    independent_limits(&RUNTIMES);
}

fn independent_limits(programs: &[Program]) {
    let g3 = 3 * GIB;
    let g15 = 3 * GIB / 2;
    for &p in programs {
        // 1 alloc 3G (device 0), 2 dev=1, 3 alloc 3G, 4 dev=0, 5 alloc 1.5G, 6 info,
        // 7 dev=1, 8 alloc 1G, 9 info, 10 dev=0, 11 info
        let args = vec![
            alloc(p, g3),
            "dev=1".into(),
            alloc(p, g3),
            "dev=0".into(),
            alloc(p, g15),
            "info".into(),
            "dev=1".into(),
            alloc(p, GIB),
            "info".into(),
            "dev=0".into(),
            "info".into(),
        ];
        for shim in [false, true] {
            let w = what(p, shim, &[SPLIT]);
            let out = run2(p, &[SPLIT]).args(&args).shim(shim).run();
            assert_started(&out, if shim { 3 } else { 2 }, &w);
            assert_ok(&out, [1, 2, 3, 4, 7, 8, 10], &w);
            assert_num(&out, "cleanup.failures", 0, &w);
            if shim {
                assert_num(&out, "op5.rc", OOM, &w);
                // device 0: 3 GiB of 4; device 1: 4 GiB of 4
                assert_u64(&out, "op6.total", PART, &w);
                assert_u64(&out, "op6.free", GIB, &w);
                assert_u64(&out, "op9.total", PART, &w);
                assert_u64(&out, "op9.free", 0, &w);
                assert_u64(&out, "op11.free", GIB, &w);
                let warns = out.warn_lines();
                assert_eq!(
                    warns.len(),
                    1,
                    "{w}: one warning for the refusal\n{}",
                    out.dump()
                );
                assert_mentions_device(&warns[0], 0);
                assert_mentions_numbers(&warns[0], &[g15, g3, PART]);
                assert_eq!(out.gpushim_lines().len(), 1, "{w}\n{}", out.dump());
                assert_peak(&out, 0, 7 * GIB, &w);
                assert_peak(&out, 1, 0, &w);
            } else {
                assert_num(&out, "op5.rc", 0, &w);
                assert_u64(&out, "op6.total", PHYSICAL, &w);
                assert_u64(&out, "op6.free", PHYSICAL - g3 - g15, &w);
                assert_u64(&out, "op9.free", PHYSICAL - g3 - GIB, &w);
                assert!(out.gpushim_lines().is_empty(), "{w}\n{}", out.dump());
                assert_peak(&out, 0, g3 + g15, &w);
                assert_peak(&out, 1, g3 + GIB, &w);
            }
        }
    }
}

/// Driver API: the other counted allocation APIs (VMM with a `CUmemLocation` naming the
/// virtual ordinal, stream-ordered from the default pool and from a pool created on the
/// virtual ordinal, managed, pitch, arrays) made while device 1 is current count against
/// device 1 alone; device 0 keeps its whole 4 GiB.
#[test]
fn other_allocation_apis_count_against_the_part() {
    let m = 512 * MIB;
    // 1 dev=1, 2 vmm, 3 async, 4 pool, 5 managed, 6 pitch, 7 array, 8 mem 1G, 9 info,
    // 10 mem 2M (refused), 11 dev=0, 12 info, 13 mem 4G, 14 free=2, 15 dev=1, 16 info
    let args: Vec<String> = vec![
        "dev=1".into(),
        format!("alloc=vmm:{m}"),
        format!("alloc=async:{m}"),
        format!("alloc=pool:{m}"),
        format!("alloc=managed:{m}"),
        format!("alloc=pitch:{m}"),
        format!("alloc=array:{m}"),
        format!("alloc=mem:{GIB}"),
        "info".into(),
        format!("alloc=mem:{}", 2 * MIB),
        "dev=0".into(),
        "info".into(),
        format!("alloc=mem:{PART}"),
        "free=2".into(),
        "dev=1".into(),
        "info".into(),
    ];
    for path in [DriverPath::Link, DriverPath::Gpa, DriverPath::GpaPtsz] {
        let p = Program::Driver(path);
        for shim in [false, true] {
            let w = what(p, shim, &[SPLIT]);
            let out = run2(p, &[SPLIT]).args(&args).shim(shim).run();
            assert_started(&out, if shim { 3 } else { 2 }, &w);
            assert_ok(&out, [1, 2, 3, 4, 5, 6, 7, 8, 11, 13, 14, 15], &w);
            assert_num(&out, "op2.maprc", 0, &w);
            assert_num(&out, "cleanup.failures", 0, &w);
            if shim {
                assert_u64(&out, "op9.total", PART, &w);
                assert_u64(&out, "op9.free", 0, &w);
                assert_num(&out, "op10.rc", OOM, &w);
                assert_u64(&out, "op12.total", PART, &w);
                assert_u64(&out, "op12.free", PART, &w);
                assert_u64(&out, "op16.free", m, &w);
                let warns = out.warn_lines();
                assert_eq!(warns.len(), 1, "{w}\n{}", out.dump());
                assert_mentions_device(&warns[0], 1);
                assert_mentions_numbers(&warns[0], &[2 * MIB, PART]);
                assert_peak(&out, 0, 2 * PART, &w);
                assert_peak(&out, 1, 0, &w);
            } else {
                assert_num(&out, "op10.rc", 0, &w);
                assert_u64(&out, "op9.free", PHYSICAL - PART, &w);
                assert_peak(&out, 0, PART, &w);
                assert_peak(&out, 1, PART + 2 * MIB, &w);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// 3. a thread per virtual device
// ---------------------------------------------------------------------------------------

/// One thread per part (driver API: the part's primary context from cuDevicePrimaryCtxRetain
/// made current in the thread; runtime: cudaSetDevice in the thread), random sizes up to and
/// past 4 GiB with a fixed seed, frees at random, memory info after every step. With the shim
/// each part never holds more than 4 GiB, memory info always shows exactly what the thread
/// holds, both threads are refused, never spuriously, and the simulator's physical device 0
/// never held more than 8 GiB. Without it the same threads hold far more than 4 GiB each.
#[test]
fn a_thread_per_part_allocates_concurrently_driver_api() {
    concurrent(&[
        Program::Driver(DriverPath::Link),
        Program::Driver(DriverPath::Gpa),
    ]);
}

#[test]
fn a_thread_per_part_allocates_concurrently_runtime() {
    concurrent(&RUNTIMES);
}

fn concurrent(programs: &[Program]) {
    for &p in programs {
        for seed in [7u32, 20240607] {
            let arg = format!("hammer={seed}:1500:0,1");
            for shim in [false, true] {
                let w = format!("{} {arg}", what(p, shim, &[SPLIT]));
                let out = run2(p, &[SPLIT]).arg(&arg).shim(shim).run();
                assert_started(&out, if shim { 3 } else { 2 }, &w);
                assert_num(&out, "hammer.threads", 2, &w);
                let total = if shim { PART } else { PHYSICAL };
                for d in 0..2 {
                    let k = |f: &str| format!("hammer{d}.{f}");
                    assert_num(&out, &k("ctxrc"), 0, &w);
                    assert_u64(&out, &k("total"), total, &w);
                    assert_u64(&out, &k("base"), 0, &w);
                    assert_num(&out, &k("other"), 0, &w);
                    assert_num(&out, &k("left"), 0, &w);
                    assert_num(&out, &k("infobad"), 0, &w);
                    assert_num(&out, &k("spurious"), 0, &w);
                    assert!(
                        out.num(&k("ok")) > 100,
                        "{w}: thread {d} allocated little\n{}",
                        out.dump()
                    );
                    assert!(
                        out.num(&k("refused")) > 0,
                        "{w}: thread {d} was never refused\n{}",
                        out.dump()
                    );
                    let held = out.u64(&k("maxheld"));
                    if shim {
                        assert!(
                            held <= PART,
                            "{w}: device {d} held {held} bytes > 4 GiB\n{}",
                            out.dump()
                        );
                        assert!(
                            held > 3 * GIB,
                            "{w}: device {d} never came near its limit\n{}",
                            out.dump()
                        );
                    } else {
                        assert!(
                            held > PART,
                            "{w}: without the shim device {d} must pass 4 GiB\n{}",
                            out.dump()
                        );
                    }
                }
                let report = out.report();
                for ph in 0..2 {
                    assert_eq!(
                        report.device(ph).used,
                        0,
                        "{w}: physical {ph} in use at exit\n{}",
                        out.dump()
                    );
                }
                if shim {
                    let peak = report.device(0).peak;
                    assert!(
                        peak <= 2 * PART,
                        "{w}: physical 0 peaked at {peak} > 8 GiB\n{}",
                        out.dump()
                    );
                    assert!(
                        peak > PART,
                        "{w}: both parts must have held memory at once\n{}",
                        out.dump()
                    );
                    assert_eq!(
                        report.device(1).peak,
                        0,
                        "{w}: physical 1 untouched\n{}",
                        out.dump()
                    );
                    for line in out.gpushim_lines() {
                        assert!(
                            line.starts_with("gpushim: warn: device 0:")
                                || line.starts_with("gpushim: warn: device 1:"),
                            "{w}: unexpected gpushim line `{line}`\n{}",
                            out.dump()
                        );
                    }
                    assert!(
                        !out.warn_lines().is_empty(),
                        "{w}: refusals are logged\n{}",
                        out.dump()
                    );
                } else {
                    assert!(report.device(0).peak > PART, "{w}\n{}", out.dump());
                    assert!(report.device(1).peak > PART, "{w}\n{}", out.dump());
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// 4. contexts, pointers, peers
// ---------------------------------------------------------------------------------------

/// Driver API: cuCtxGetDevice (and CUDA 13's cuCtxGetDevice_v2, of the current and of each
/// retained primary context) names the part whose primary context is current;
/// CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL (cuPointerGetAttribute and cuPointerGetAttributes) of an
/// allocation is the part it was made on; cuDeviceCanAccessPeer between the parts is 0 (as for
/// a GPU and itself: contexts of one GPU cannot enable peer access to each other).
#[test]
fn contexts_pointers_and_peers_driver_api() {
    // 1 dev=1, 2 ctxdev, 3 alloc, 4 ptrdev=3, 5 dev=0, 6 ctxdev, 7 alloc, 8 ptrdev=7,
    // 9 peer=0,1, 10 peer=1,0, 11 ptrdev=3 (device 0 current), 12 dev=2, 13 ctxdev,
    // 14 alloc, 15 ptrdev=14, 16 peer=0,2, 17 peer=2,1, 18 ptrdev=3
    let args: Vec<String> = vec![
        "dev=1".into(),
        "ctxdev".into(),
        format!("alloc=mem:{MIB}"),
        "ptrdev=3".into(),
        "dev=0".into(),
        "ctxdev".into(),
        format!("alloc=mem:{MIB}"),
        "ptrdev=7".into(),
        "peer=0,1".into(),
        "peer=1,0".into(),
        "ptrdev=3".into(),
        "dev=2".into(),
        "ctxdev".into(),
        format!("alloc=mem:{MIB}"),
        "ptrdev=14".into(),
        "peer=0,2".into(),
        "peer=2,1".into(),
        "ptrdev=3".into(),
    ];
    for path in [
        DriverPath::Link,
        DriverPath::Dlsym,
        DriverPath::Gpa,
        DriverPath::GpaPtsz,
    ] {
        let p = Program::Driver(path);
        for shim in [false, true] {
            let w = what(p, shim, &[SPLIT]);
            let out = run2(p, &[SPLIT]).args(&args).shim(shim).run();
            assert_started(&out, if shim { 3 } else { 2 }, &w);
            // (ctxdev op, device whose primary context is current, contexts retained so far)
            let mut ctx_checks = vec![(2, 1, vec![0, 1]), (6, 0, vec![0, 1])];
            // (ptrdev op, device of the allocation)
            let mut ptr_checks = vec![(4, 1), (8, 0), (11, 1)];
            // (peer op, can: parts of one GPU cannot be peers, as a GPU and itself cannot)
            let mut peer_checks = vec![(9, 1), (10, 1)];
            if shim {
                ctx_checks.push((13, 2, vec![0, 1, 2]));
                ptr_checks.extend([(15, 2), (18, 1)]);
                peer_checks = vec![(9, 0), (10, 0), (16, 1), (17, 1)];
            } else {
                assert_num(&out, "op12.rc", INVALID_DEVICE, &w);
            }
            for (op, dev, retained) in ctx_checks {
                assert_ok_with(&out, "dev", [(op, dev)], &w);
                assert_num(&out, &format!("op{op}.rc2"), 0, &w);
                assert_num(&out, &format!("op{op}.dev2"), dev, &w);
                for k in retained {
                    assert_num(&out, &format!("op{op}.ctx{k}.rc"), 0, &w);
                    assert_num(&out, &format!("op{op}.ctx{k}.dev"), k, &w);
                }
            }
            assert_ok_with(&out, "dev", ptr_checks.iter().copied(), &w);
            for (op, dev) in ptr_checks {
                assert_num(&out, &format!("op{op}.rcs"), 0, &w);
                assert_num(&out, &format!("op{op}.devs"), dev, &w);
            }
            assert_ok_with(&out, "can", peer_checks, &w);
            assert_clean_end(&out, shim, &w);
        }
    }
}

/// Driver API: a context the program creates on a part (cuCtxCreate_v2, and CUDA 13's
/// cuCtxCreate_v4) belongs to that part: cuCtxGetDevice[_v2] names it, allocations made in it
/// count against it, its pointers carry its ordinal; device 0 is untouched. The program frees
/// its memory before destroying a context (the driver would free what is left with the
/// context: that is tested in `tests/memory_modes.rs`).
#[test]
fn created_contexts_belong_to_their_part() {
    // 1 ctxcreate=1, 2 ctxdev, 3 alloc 3G, 4 info, 5 ptrdev=3, 6 free=3, 7 ctxdestroy, 8 dev=1,
    // 9 info, 10 dev=0, 11 info, 12 ctxcreate4=1, 13 ctxdev, 14 alloc 3G, 15 alloc 2G (refused
    // with the shim), 16 alloc 1G, 17 info, 18 free=14, 19 free=16, [free=15 without the shim,]
    // then ctxdestroy
    let base: Vec<String> = vec![
        "ctxcreate=1".into(),
        "ctxdev".into(),
        format!("alloc=mem:{}", 3 * GIB),
        "info".into(),
        "ptrdev=3".into(),
        "free=3".into(),
        "ctxdestroy".into(),
        "dev=1".into(),
        "info".into(),
        "dev=0".into(),
        "info".into(),
        "ctxcreate4=1".into(),
        "ctxdev".into(),
        format!("alloc=mem:{}", 3 * GIB),
        format!("alloc=mem:{}", 2 * GIB),
        format!("alloc=mem:{GIB}"),
        "info".into(),
        "free=14".into(),
        "free=16".into(),
    ];
    for path in DRIVER_PATHS {
        let p = Program::Driver(path);
        for shim in [false, true] {
            let w = what(p, shim, &[SPLIT]);
            let mut args = base.clone();
            if !shim {
                args.push("free=15".into());
            }
            args.push("ctxdestroy".into());
            let last = args.len() as u32;
            let out = run2(p, &[SPLIT]).args(&args).shim(shim).run();
            assert_started(&out, if shim { 3 } else { 2 }, &w);
            assert_ok(&out, (1..=last).filter(|&op| op != 15), &w);
            for op in [2, 13] {
                assert_num(&out, &format!("op{op}.dev"), 1, &w);
                assert_num(&out, &format!("op{op}.dev2"), 1, &w);
                assert_num(&out, &format!("op{op}.created.rc"), 0, &w);
                assert_num(&out, &format!("op{op}.created.dev"), 1, &w);
            }
            assert_num(&out, "op5.dev", 1, &w);
            assert_num(&out, "op5.devs", 1, &w);
            assert_num(&out, "op7.back", 0, &w);
            assert_num(&out, &format!("op{last}.back"), 0, &w);
            assert_num(&out, "cleanup.failures", 0, &w);
            let total = if shim { PART } else { PHYSICAL };
            assert_u64(&out, "op4.total", total, &w);
            assert_u64(&out, "op4.free", total - 3 * GIB, &w);
            for op in [9, 11] {
                assert_u64(&out, &format!("op{op}.total"), total, &w);
                assert_u64(&out, &format!("op{op}.free"), total, &w);
            }
            if shim {
                assert_num(&out, "op15.rc", OOM, &w);
                assert_u64(&out, "op17.free", 0, &w);
                let warns = out.warn_lines();
                assert_eq!(warns.len(), 1, "{w}\n{}", out.dump());
                assert_mentions_device(&warns[0], 1);
                assert_mentions_numbers(&warns[0], &[2 * GIB, 3 * GIB, PART]);
                assert_peak(&out, 0, PART, &w);
                assert_peak(&out, 1, 0, &w);
            } else {
                assert_num(&out, "op15.rc", 0, &w);
                assert_u64(&out, "op17.free", PHYSICAL - 6 * GIB, &w);
                assert_peak(&out, 0, 0, &w);
                assert_peak(&out, 1, 6 * GIB, &w);
            }
        }
    }
}

/// The runtime: cudaPointerGetAttributes().device of an allocation is the part it was made
/// on, cudaGetDevice follows cudaSetDevice, cudaDeviceCanAccessPeer between the parts is 0.
#[test]
fn pointers_and_peers_runtime() {
    // 1 dev=1, 2 getdev, 3 alloc, 4 ptrdev=3, 5 dev=0, 6 getdev, 7 alloc, 8 ptrdev=7,
    // 9 peer=0,1, 10 peer=1,0, 11 ptrdev=3, 12 dev=2, 13 getdev, 14 alloc, 15 ptrdev=14,
    // 16 peer=0,2, 17 peer=2,1
    let args: Vec<String> = vec![
        "dev=1".into(),
        "getdev".into(),
        format!("alloc=malloc:{MIB}"),
        "ptrdev=3".into(),
        "dev=0".into(),
        "getdev".into(),
        format!("alloc=malloc:{MIB}"),
        "ptrdev=7".into(),
        "peer=0,1".into(),
        "peer=1,0".into(),
        "ptrdev=3".into(),
        "dev=2".into(),
        "getdev".into(),
        format!("alloc=malloc:{MIB}"),
        "ptrdev=14".into(),
        "peer=0,2".into(),
        "peer=2,1".into(),
    ];
    for p in RUNTIMES {
        for shim in [false, true] {
            let w = what(p, shim, &[SPLIT]);
            let out = run2(p, &[SPLIT]).args(&args).shim(shim).run();
            assert_started(&out, if shim { 3 } else { 2 }, &w);
            let mut dev_checks = vec![(2, 1), (6, 0)];
            let mut ptr_checks = vec![(4, 1), (8, 0), (11, 1)];
            let mut peer_checks = vec![(9, 1), (10, 1)];
            if shim {
                dev_checks.push((13, 2));
                ptr_checks.push((15, 2));
                peer_checks = vec![(9, 0), (10, 0), (16, 1), (17, 1)];
            } else {
                assert_num(&out, "op12.rc", INVALID_DEVICE, &w);
            }
            assert_ok_with(&out, "dev", dev_checks, &w);
            assert_ok_with(&out, "dev", ptr_checks, &w);
            assert_ok_with(&out, "can", peer_checks, &w);
            assert_clean_end(&out, shim, &w);
        }
    }
}

// ---------------------------------------------------------------------------------------
// 5. copies between parts
// ---------------------------------------------------------------------------------------

/// Fill a buffer on device 0, copy it to a buffer on device 1 with cuMemcpyPeer (the two
/// parts' primary contexts) / cudaMemcpyPeer, read it back: equal; the same back with the
/// asynchronous forms, and to and from physical device 1 (ordinal 2).
#[test]
fn copies_between_parts_driver_api() {
    let mut programs = driver_programs();
    programs.push(Program::Driver(DriverPath::GpaPtsz));
    copies(&programs);
}

#[test]
fn copies_between_parts_runtime() {
    copies(&RUNTIMES);
}

fn copies(programs: &[Program]) {
    for &p in programs {
        let a = alloc(p, 4 * MIB);
        // 1 alloc (device 0), 2 dev=1, 3 alloc, 4 copy 1→3, 5 copyasync 3→1, 6 dev=2, 7 alloc,
        // 8 copy 3→7, 9 copyasync 7→1
        let args: Vec<String> = vec![
            a.clone(),
            "dev=1".into(),
            a.clone(),
            "copy=1,3".into(),
            "copyasync=3,1".into(),
            "dev=2".into(),
            a,
            "copy=3,7".into(),
            "copyasync=7,1".into(),
        ];
        for shim in [false, true] {
            let w = what(p, shim, &[SPLIT]);
            let out = run2(p, &[SPLIT]).args(&args).shim(shim).run();
            assert_started(&out, if shim { 3 } else { 2 }, &w);
            let copies: &[u32] = if shim { &[4, 5, 8, 9] } else { &[4, 5] };
            assert_ok(&out, [1, 2, 3], &w);
            for op in copies {
                for k in ["fill", "rc", "back"] {
                    assert_num(&out, &format!("op{op}.{k}"), 0, &w);
                }
                assert_u64(&out, &format!("op{op}.bytes"), 4 * MIB, &w);
                assert_num(&out, &format!("op{op}.equal"), 1, &w);
            }
            assert_clean_end(&out, shim, &w);
            if shim {
                assert_peak(&out, 0, 8 * MIB, &w);
                assert_peak(&out, 1, 4 * MIB, &w);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// 6. configuration errors
// ---------------------------------------------------------------------------------------

/// Without the shim `p` initialises; with it CUDA init fails with 3 and exactly one gpushim
/// line `gpushim: GPUSHIM_VIRTUAL_DEVICES="VALUE": REASON` is printed.
fn fails_closed(p: Program, value: &str) {
    let env = [("GPUSHIM_VIRTUAL_DEVICES", value)];
    let out = check_fails_closed(|| run2(p, &env).arg("ids"));
    assert_started(&out.plain, 2, &what(p, false, &env));
    assert_fails_closed(&out.shim, "GPUSHIM_VIRTUAL_DEVICES", value);
    let report = out.shim.report();
    for ph in 0..2 {
        assert_eq!(report.device(ph).peak, 0, "{}", out.shim.dump());
    }
}

/// Sizes adding up to more than the device has (2 × 9 GiB on 16 GiB), and a selector naming
/// no device (`5`): cuInit → 3 / cudaErrorInitializationError, one line.
#[test]
fn oversize_and_unknown_device_fail_closed_driver_api() {
    for p in driver_programs() {
        for value in ["0:2x9GiB", "5:1GiB"] {
            fails_closed(p, value);
        }
    }
}

#[test]
fn oversize_and_unknown_device_fail_closed_runtime() {
    for p in RUNTIMES {
        for value in ["0:2x9GiB", "5:1GiB"] {
            fails_closed(p, value);
        }
    }
}

/// Other values that cannot be a split: a bad size, no sizes, a device split twice, an
/// unknown UUID, an unknown PCI bus id, 2 × 8 GiB + 1 byte.
#[test]
fn malformed_values_fail_closed() {
    let values = [
        "0:4 gigs",
        "0:",
        "0:1GiB;0:1GiB",
        "GPU-ff:1GiB",
        "0000:99:00.0:1GiB",
        "1:8GiB,8GiB,1",
    ];
    for path in DRIVER_PATHS {
        for value in values {
            fails_closed(Program::Driver(path), value);
        }
    }
    fails_closed(RUNTIME_13, "0:4 gigs");
}

/// The whole device in parts is fine: `1:2x8GiB` (exactly 16 GiB), and a split by UUID prefix
/// and by PCI bus id name the same device.
#[test]
fn exact_fit_and_selector_forms() {
    let cases: &[(&str, &[(u32, u64)])] = &[
        // (value, (physical, total) by ordinal)
        ("1:2x8GiB", &[(0, PHYSICAL), (1, 8 * GIB), (1, 8 * GIB)]),
        (
            "GPU-10:4GiB,12GiB",
            &[(0, 4 * GIB), (0, 12 * GIB), (1, PHYSICAL)],
        ),
        ("0000:20:00.0:1GiB", &[(0, PHYSICAL), (1, GIB)]),
        (
            "0:2x4GiB;1:3x1GiB",
            &[(0, PART), (0, PART), (1, GIB), (1, GIB), (1, GIB)],
        ),
    ];
    for path in [DriverPath::Link, DriverPath::Gpa] {
        let p = Program::Driver(path);
        for (value, view) in cases {
            let env = [("GPUSHIM_VIRTUAL_DEVICES", *value)];
            let w = what(p, true, &env);
            let out = run2(p, &env).args(["ids", "totalmem"]).shim(true).run();
            assert_started(&out, view.len() as u64, &w);
            let mut uuids = std::collections::BTreeSet::new();
            for (d, (phys, total)) in view.iter().enumerate() {
                let k = |f: &str| format!("dev{d}.{f}");
                assert_num(&out, &k("rc"), 0, &w);
                assert_eq!(out.get(&k("name")), phys_name(*phys), "{w}\n{}", out.dump());
                assert_u64(&out, &k("pcibus"), phys_bus(*phys) as u64, &w);
                assert_u64(&out, &k("total"), *total, &w);
                assert_u64(&out, &format!("op2.total{d}"), *total, &w);
                uuids.insert(out.get(&k("uuid")).to_string());
            }
            assert_eq!(
                uuids.len(),
                view.len(),
                "{w}: UUIDs must be distinct\n{}",
                out.dump()
            );
            assert!(out.gpushim_lines().is_empty(), "{w}\n{}", out.dump());
        }
    }
}

// ---------------------------------------------------------------------------------------
// 7. with visibility
// ---------------------------------------------------------------------------------------

/// `GPUSHIM_VISIBLE_DEVICES=1,0` then `0:2x4GiB`: the split applies to the program's device 0
/// after reordering, i.e. physical device 1: ordinals 0 and 1 are its parts (4 GiB each, UUIDs
/// derived from physical 1's, the same as when physical 1 is split without visibility), ordinal
/// 2 is physical 0. Memory allocated on ordinal 0 lands on physical 1.
#[test]
fn split_after_visibility_driver_api() {
    split_after_visibility(&driver_programs());
}

#[test]
fn split_after_visibility_runtime() {
    split_after_visibility(&RUNTIMES);
}

fn split_after_visibility(programs: &[Program]) {
    let env = [("GPUSHIM_VISIBLE_DEVICES", "1,0"), SPLIT];
    for &p in programs {
        // 1 ids, 2 alloc 3G (ordinal 0), 3 dev=1, 4 alloc 1G, 5 info, 6 dev=0, 7 info
        let args: Vec<String> = vec![
            "ids".into(),
            alloc(p, 3 * GIB),
            "dev=1".into(),
            alloc(p, GIB),
            "info".into(),
            "dev=0".into(),
            "info".into(),
        ];
        let w = what(p, false, &env);
        let plain = run2(p, &env).args(&args).run();
        assert_started(&plain, 2, &w);
        assert_ident(&plain, 0, 0, &phys_uuid(0), PHYSICAL, &w);
        assert_ident(&plain, 1, 1, &phys_uuid(1), PHYSICAL, &w);
        assert_peak(&plain, 0, 3 * GIB, &w);
        assert_peak(&plain, 1, GIB, &w);

        // physical 1 split without visibility: ordinals 1 and 2 are its parts
        let direct_env = [("GPUSHIM_VIRTUAL_DEVICES", "1:2x4GiB")];
        let direct = run2(p, &direct_env).arg("ids").shim(true).run();
        let wd = what(p, true, &direct_env);
        assert_started(&direct, 3, &wd);
        assert_ident(&direct, 0, 0, &phys_uuid(0), PHYSICAL, &wd);

        let w = what(p, true, &env);
        let out = run2(p, &env).args(&args).shim(true).run();
        assert_started(&out, 3, &w);
        let uuid0 = out.get("dev0.uuid").to_string();
        let uuid1 = out.get("dev1.uuid").to_string();
        assert_ident(&out, 0, 1, &uuid0, PART, &w);
        assert_ident(&out, 1, 1, &uuid1, PART, &w);
        assert_ident(&out, 2, 0, &phys_uuid(0), PHYSICAL, &w);
        assert_ne!(
            uuid0,
            uuid1,
            "{w}: the parts' UUIDs must differ\n{}",
            out.dump()
        );
        for u in [&uuid0, &uuid1] {
            assert_ne!(
                u,
                &phys_uuid(1),
                "{w}: a part must not have the GPU's UUID\n{}",
                out.dump()
            );
            assert!(
                u.starts_with("GPU-20212223-2425-"),
                "{w}: `{u}` is not derived from physical 1's UUID\n{}",
                out.dump()
            );
        }
        assert_eq!(
            direct.get("dev1.uuid"),
            uuid0,
            "{wd}: part 0 of physical 1 must have one UUID\n{}\n{}",
            direct.dump(),
            out.dump()
        );
        assert_eq!(
            direct.get("dev2.uuid"),
            uuid1,
            "{wd}: part 1 of physical 1 must have one UUID\n{}\n{}",
            direct.dump(),
            out.dump()
        );
        assert_ok(&out, [2, 3, 4, 6], &w);
        assert_u64(&out, "op5.total", PART, &w);
        assert_u64(&out, "op5.free", PART - GIB, &w);
        assert_u64(&out, "op7.total", PART, &w);
        assert_u64(&out, "op7.free", GIB, &w);
        assert!(out.gpushim_lines().is_empty(), "{w}\n{}", out.dump());
        assert_peak(&out, 0, 0, &w);
        assert_peak(&out, 1, 4 * GIB, &w);
    }
}

/// The scheduler's `CUDA_VISIBLE_DEVICES=1` with `0:2x4GiB` alone: the driver still shows
/// physical 1 only, and that GPU is split (the runtime and the driver API); the program starts
/// with `CUDA_VISIBLE_DEVICES=0,1`, one entry per device NVML shows it (PyTorch's count:
/// `tests/frameworks_view.rs`), and the scheduler's value is kept for the driver, which reads it
/// back at first use. A process that never uses CUDA (`env`) gets the rewrite and prints nothing.
#[test]
fn split_under_the_schedulers_cuda_visible_devices() {
    if skip_emulated("runs env, a host program, with the target's library preloaded") {
        return;
    }
    let env = [("CUDA_VISIBLE_DEVICES", "1"), SPLIT];
    for p in [RUNTIME_12, Program::Driver(DriverPath::Link)] {
        let w = what(p, false, &env);
        let plain = run2(p, &env).arg("ids").run();
        assert_started(&plain, 1, &w);
        assert_ident(&plain, 0, 1, &phys_uuid(1), PHYSICAL, &w);
        let w = what(p, true, &env);
        let out = run2(p, &env).arg("ids").shim(true).run();
        assert_started(&out, 2, &w);
        for d in 0..2 {
            let uuid = out.get(&format!("dev{d}.uuid")).to_string();
            assert!(uuid.starts_with("GPU-20212223-2425-") && uuid != phys_uuid(1), "{w}: `{uuid}` is not a part of physical 1\n{}", out.dump());
            assert_ident(&out, d, 1, &uuid, PART, &w);
        }
        assert_ne!(out.get("dev0.uuid"), out.get("dev1.uuid"), "{w}\n{}", out.dump());
        assert!(out.gpushim_lines().is_empty(), "{w}\n{}", out.dump());
    }
    for shim in [false, true] {
        let out = Run::new("env").arg("done=1").envs(&env).shim(shim).run();
        out.assert_completed();
        assert!(out.gpushim_lines().is_empty(), "{}", out.dump());
        let (cvd, original) = if shim { ("0,1", Some("1")) } else { ("1", None) };
        assert_eq!(out.get("CUDA_VISIBLE_DEVICES"), cvd, "shim={shim}\n{}", out.dump());
        assert_eq!(out.kv.get("GPUSHIM_ORIGINAL_CUDA_VISIBLE_DEVICES").map(String::as_str), original, "shim={shim}\n{}", out.dump());
    }
}

// ---------------------------------------------------------------------------------------
// 8. a per-device limit on a virtual ordinal
// ---------------------------------------------------------------------------------------

/// `GPUSHIM_MEMORY_LIMIT_1=1GiB`: device 1 (part 1 of physical 0) has 1 GiB in total and admits
/// exactly 1 GiB; device 0 still has 4 GiB, device 2 16 GiB.
#[test]
fn per_device_limit_on_a_virtual_ordinal_driver_api() {
    per_device_limit(&driver_programs());
}

#[test]
fn per_device_limit_on_a_virtual_ordinal_runtime() {
    per_device_limit(&RUNTIMES);
}

fn per_device_limit(programs: &[Program]) {
    let env = [SPLIT, ("GPUSHIM_MEMORY_LIMIT_1", "1GiB")];
    for &p in programs {
        let totals = if is_runtime(p) { "props" } else { "totalmem" };
        // 1 totals, 2 dev=1, 3 alloc 1G, 4 alloc 2M, 5 info, 6 dev=0, 7 alloc 4G, 8 info
        let args: Vec<String> = vec![
            totals.into(),
            "dev=1".into(),
            alloc(p, GIB),
            alloc(p, 2 * MIB),
            "info".into(),
            "dev=0".into(),
            alloc(p, PART),
            "info".into(),
        ];
        for shim in [false, true] {
            let w = what(p, shim, &env);
            let out = run2(p, &env).args(&args).shim(shim).run();
            assert_started(&out, if shim { 3 } else { 2 }, &w);
            assert_ok(&out, [2, 3, 6, 7], &w);
            assert_num(&out, "cleanup.failures", 0, &w);
            if shim {
                for (d, total) in [PART, GIB, PHYSICAL].iter().enumerate() {
                    assert_num(&out, &format!("op1.rc{d}"), 0, &w);
                    assert_u64(&out, &format!("op1.total{d}"), *total, &w);
                }
                assert_num(&out, "op4.rc", OOM, &w);
                assert_u64(&out, "op5.total", GIB, &w);
                assert_u64(&out, "op5.free", 0, &w);
                assert_u64(&out, "op8.total", PART, &w);
                assert_u64(&out, "op8.free", 0, &w);
                let warns = out.warn_lines();
                assert_eq!(warns.len(), 1, "{w}\n{}", out.dump());
                assert_mentions_device(&warns[0], 1);
                assert_mentions_numbers(&warns[0], &[2 * MIB, GIB]);
                assert_peak(&out, 0, GIB + PART, &w);
            } else {
                for d in 0..2 {
                    assert_u64(&out, &format!("op1.total{d}"), PHYSICAL, &w);
                }
                assert_num(&out, "op4.rc", 0, &w);
                assert_u64(&out, "op5.total", PHYSICAL, &w);
                assert!(out.gpushim_lines().is_empty(), "{w}\n{}", out.dump());
                assert_peak(&out, 0, PART, &w);
                assert_peak(&out, 1, GIB + 2 * MIB, &w);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// 9. no split, no translating hooks
// ---------------------------------------------------------------------------------------

/// Without `GPUSHIM_VIRTUAL_DEVICES` (even with limits or a visibility setting) the shim hands
/// out the driver's own functions for the device-translating names — through `dlsym` on the
/// driver's handle and through `cuGetProcAddress` — compared with the simulator's
/// `gpusim_symbol`; with a split it hands out its hooks.
#[test]
fn no_split_hands_out_the_drivers_own_functions() {
    let names = [
        "cuDeviceGet",
        "cuDeviceGetCount",
        "cuDeviceGetAttribute",
        "cuDeviceGetName",
        "cuDeviceGetUuid",
        "cuDeviceGetPCIBusId",
        "cuDeviceCanAccessPeer",
        "cuDevicePrimaryCtxRetain",
        "cuCtxGetDevice",
        "cuPointerGetAttribute",
    ];
    let unsplit: &[&[(&str, &str)]] = &[
        &[],
        &[("GPUSHIM_MEMORY_LIMIT", "1GiB")],
        &[("GPUSHIM_VISIBLE_DEVICES", "1,0")],
    ];
    for path in [DriverPath::Dlsym, DriverPath::Gpa, DriverPath::GpaV1] {
        let p = Program::Driver(path);
        let kinds: &[&str] = if path == DriverPath::Dlsym {
            &["dlsym"]
        } else {
            &["dlsym", "gpa"]
        };
        let check = |env: &[(&str, &str)], shim: bool, want: &str| {
            let w = what(p, shim, env);
            let out = run2(p, env).arg("splitident").shim(shim).run();
            out.assert_completed();
            assert_num(&out, "init.rc", 0, &w);
            for kind in kinds {
                for name in names {
                    assert_eq!(
                        out.get(&format!("splitident.{kind}.{name}")),
                        want,
                        "{w}: {kind} of {name}\n{}",
                        out.dump()
                    );
                }
            }
        };
        check(&[SPLIT], false, "driver");
        for env in unsplit {
            check(env, true, "driver");
        }
        check(&[SPLIT], true, "other");
    }
}
