//! Which function a program gets, by every way of asking: functions gpushim does not change
//! must be the driver's own (pointer-equal to `gpusim_symbol(name)`), hooked ones must not;
//! the per-thread-stream variant must get its own hook. `GPUSHIM_DISABLE` hands out the
//! driver's functions only, and `GPUSHIM_DRIVER_PATH` names the driver.

mod common;

use common::*;

/// Exports gpushim must hook (every counted allocation API, its free, and the queries it
/// answers), by the name each path resolves them to.
const HOOKED: &[&str] = &[
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemGetInfo_v2",
    "cuDeviceTotalMem_v2",
    "cuMemAllocPitch_v2",
    "cuMemAllocManaged",
    "cuMemCreate",
    "cuMemRelease",
    "cuArrayCreate_v2",
    "cuArray3DCreate_v2",
    "cuArrayDestroy",
    "cuMipmappedArrayCreate",
    "cuMipmappedArrayDestroy",
];
/// Hooked, in the variant of the path (`_ptsz` for per-thread callers).
const HOOKED_STREAM: &[&str] = &[
    "cuMemAllocAsync",
    "cuMemFreeAsync",
    "cuMemAllocFromPoolAsync",
];
/// Exports gpushim has no reason to change: they must come back untouched.
const UNHOOKED: &[&str] = &[
    "cuDeviceGet",
    "cuDevicePrimaryCtxRetain",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuStreamCreate",
    "cuMemcpyHtoD_v2",
];
const UNHOOKED_STREAM: &[&str] = &["cuLaunchKernel"];

fn variant(path: DriverPath, base: &str) -> String {
    if path.is_ptsz() {
        format!("{base}_ptsz")
    } else {
        base.to_string()
    }
}

fn ident_run(path: DriverPath, shim: bool, extra: &[(&str, &str)]) -> RunOutput {
    let out = Run::program(Program::Driver(path))
        .env("GPUSIM_MEMORY", "1GiB")
        .env("GPUSHIM_MEMORY_LIMIT", "64MiB")
        .envs(extra)
        .arg("ident")
        .shim(shim)
        .run();
    out.assert_completed();
    out
}

fn ident(out: &RunOutput, name: &str) -> String {
    out.get(&format!("ident.{name}")).to_string()
}

fn hooked_names(path: DriverPath) -> Vec<String> {
    let mut v: Vec<String> = HOOKED.iter().map(|s| s.to_string()).collect();
    v.extend(HOOKED_STREAM.iter().map(|b| variant(path, b)));
    v
}

fn unhooked_names(path: DriverPath) -> Vec<String> {
    let mut v: Vec<String> = UNHOOKED.iter().map(|s| s.to_string()).collect();
    v.extend(UNHOOKED_STREAM.iter().map(|b| variant(path, b)));
    if path.is_ptsz() {
        // cuda.h maps cuMemcpyHtoD to the _ptds export for per-thread callers
        v.retain(|n| n != "cuMemcpyHtoD_v2");
    }
    v
}

#[test]
fn without_the_shim_every_pointer_is_the_drivers() {
    for path in DriverPath::ALL {
        let out = ident_run(path, false, &[]);
        for name in hooked_names(path).iter().chain(&unhooked_names(path)) {
            assert_eq!(
                ident(&out, name),
                "driver",
                "{name} by {path:?}\n{}",
                out.dump()
            );
        }
    }
}

#[test]
fn hooked_functions_are_the_shims_on_every_path() {
    for path in DriverPath::ALL {
        let out = ident_run(path, true, &[]);
        for name in hooked_names(path) {
            assert_eq!(
                ident(&out, &name),
                "other",
                "{name} by {path:?} must be gpushim's hook\n{}",
                out.dump()
            );
        }
    }
}

#[test]
fn unhooked_functions_come_back_untouched() {
    for path in DriverPath::ALL.into_iter().filter(|p| p.asks_driver()) {
        let out = ident_run(path, true, &[]);
        for name in unhooked_names(path) {
            assert_eq!(
                ident(&out, &name),
                "driver",
                "{name} by {path:?} must be the driver's own\n{}",
                out.dump()
            );
        }
    }
}

/// The program's own dlsym of the resolvers must give gpushim's, or the cuGetProcAddress
/// path (the one every cudart uses) escapes the limits.
#[test]
fn get_proc_address_is_hooked_for_dlsym_callers() {
    for path in [DriverPath::Dlsym, DriverPath::Gpa, DriverPath::GpaV1] {
        for (shim, want) in [(false, "driver"), (true, "other")] {
            let out = ident_run(path, shim, &[]);
            for name in ["cuGetProcAddress_v2", "cuGetProcAddress"] {
                assert_eq!(
                    out.get(&format!("ident.dlsym.{name}")),
                    want,
                    "{name} (shim: {shim})\n{}",
                    out.dump()
                );
            }
        }
    }
}

/// cuGetProcAddress_v2("cuMemAllocAsync", 11020, flags 2) is a hook of its own (per-thread
/// semantics), not the flags-0 one; unhooked names stay the driver's per variant.
#[test]
fn get_proc_address_flags_select_the_variant() {
    for path in [DriverPath::Gpa, DriverPath::GpaPtsz] {
        let plain = Run::program(Program::Driver(path)).arg("gpaflags").run();
        plain.assert_completed();
        let shimmed = Run::program(Program::Driver(path))
            .arg("gpaflags")
            .shim(true)
            .run();
        shimmed.assert_completed();
        for base in [
            "cuMemAllocAsync",
            "cuMemFreeAsync",
            "cuMemAllocFromPoolAsync",
            "cuLaunchKernel",
        ] {
            for f in ["f0", "f2"] {
                let key = format!("gpaflags.{base}.{f}");
                assert_eq!(
                    plain.get(&key),
                    "driver",
                    "{key} without the shim\n{}",
                    plain.dump()
                );
                let want = if base == "cuLaunchKernel" {
                    "driver"
                } else {
                    "other"
                };
                assert_eq!(
                    shimmed.get(&key),
                    want,
                    "{key} with the shim\n{}",
                    shimmed.dump()
                );
            }
            let same = format!("gpaflags.{base}.same");
            assert_eq!(plain.num(&same), 0, "{}", plain.dump());
            assert_eq!(
                shimmed.num(&same),
                0,
                "{base}: flags 0 and 2 gave the same pointer\n{}",
                shimmed.dump()
            );
        }
        for f in ["f0", "f2"] {
            assert_eq!(
                shimmed.get(&format!("gpaflags.cuMemAlloc.{f}")),
                "other",
                "{}",
                shimmed.dump()
            );
        }
    }
}

/// GPUSHIM_DISABLE=1/true/yes: no limit, the driver's pointers; other values: active.
#[test]
fn disable_passes_everything_through() {
    let scenario = Scenario::new(GIB, &[Some(64 * MIB), Some(64 * MIB)])
        .op(Op::Info)
        .op(Op::Alloc("mem", 60 * MIB))
        .op(Op::Alloc("vmm", 10 * MIB))
        .op(Op::Info);
    for value in ["1", "true", "yes"] {
        let env = [("GPUSHIM_DISABLE", value)];
        for path in DriverPath::ALL {
            let run = Run::program(Program::Driver(path))
                .env("GPUSIM_MEMORY", "1GiB")
                .env("GPUSHIM_MEMORY_LIMIT", "64MiB")
                .envs(&env);
            // preloaded, yet exactly the driver's behaviour and pointers
            let out = scenario.check_as(run, true, false);
            assert!(
                out.stderr.is_empty(),
                "disabled gpushim printed something\n{}",
                out.dump()
            );
            if !path.asks_driver() {
                continue; // a linked program binds to gpushim's exports, disabled or not
            }
            let out = ident_run(path, true, &env);
            for name in hooked_names(path).iter().chain(&unhooked_names(path)) {
                assert_eq!(
                    ident(&out, name),
                    "driver",
                    "{name} by {path:?} with GPUSHIM_DISABLE={value}\n{}",
                    out.dump()
                );
            }
        }
    }
    for value in ["0", "no", "false", ""] {
        let out = Run::program(Program::Driver(DriverPath::Link))
            .env("GPUSIM_MEMORY", "1GiB")
            .env("GPUSHIM_MEMORY_LIMIT", "64MiB")
            .env("GPUSHIM_DISABLE", value)
            .arg("totalmem")
            .shim(true)
            .run();
        out.assert_completed();
        assert_eq!(
            out.u64("op1.total0"),
            64 * MIB,
            "GPUSHIM_DISABLE={value:?} must leave gpushim active\n{}",
            out.dump()
        );
    }
}

/// GPUSHIM_DISABLE=1 also ignores a bad configuration (everything passes through).
#[test]
fn disable_ignores_bad_configuration() {
    let out = Run::program(Program::Driver(DriverPath::Link))
        .env("GPUSHIM_DISABLE", "1")
        .env("GPUSHIM_MEMORY_LIMIT", "4 gigs")
        .arg("totalmem")
        .shim(true)
        .run();
    out.assert_completed();
    assert_eq!(out.num("init.rc"), 0, "{}", out.dump());
    assert!(out.stderr.is_empty(), "{}", out.dump());
}

/// GPUSHIM_DRIVER_PATH names the driver library; limits work the same through it.
#[test]
fn driver_path_override() {
    let driver = sim_dir().join("libcuda.so.1");
    let scenario = Scenario::new(GIB, &[Some(64 * MIB), Some(64 * MIB)])
        .op(Op::Alloc("mem", 40 * MIB))
        .op(Op::Alloc("mem", 30 * MIB))
        .op(Op::Info)
        .op(Op::Alloc("async", 24 * MIB));
    for path in [DriverPath::Link, DriverPath::Dlsym, DriverPath::Gpa] {
        let run = Run::program(Program::Driver(path))
            .env("GPUSIM_MEMORY", "1GiB")
            .env("GPUSHIM_MEMORY_LIMIT", "64MiB")
            .env("GPUSHIM_DRIVER_PATH", &driver);
        scenario.check(run, true);
        let out = ident_run(
            path,
            true,
            &[("GPUSHIM_DRIVER_PATH", driver.to_str().unwrap())],
        );
        if path.asks_driver() {
            for name in unhooked_names(path) {
                assert_eq!(ident(&out, &name), "driver", "{name}\n{}", out.dump());
            }
        }
        for name in hooked_names(path) {
            assert_eq!(ident(&out, &name), "other", "{name}\n{}", out.dump());
        }
    }
}
