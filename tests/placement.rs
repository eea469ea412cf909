//! The placement log (`GPUSHIM_LOG_PLACEMENT`, `src/placement/mod.rs`): one line per first
//! (kernel, device) launch and per first (allocation API, device), a summary per device in the
//! exit report — checked against the simulated driver's own record of launches — through the
//! driver API (`tests/c/placement.c`: a PTX module, a library kernel, `cuLaunchKernelEx`, a
//! cooperative launch, a graph) and through the CUDA runtime's own launch path
//! (`tests/c/rtlaunch.c`, cudart 13). Off, the launch hooks are not handed out at all.
//!
//! Also TensorFlow's `allow_soft_placement` as far as a driver-level shim can offer it: a
//! program written for 4 GPUs runs on one, split into 4 virtual devices.

mod common;

use common::*;
use serde_json::Value;

fn placement_lines(out: &RunOutput) -> Vec<String> {
    out.stderr_text().lines().filter(|l| l.starts_with("gpushim: placement: ")).map(|l| l["gpushim: placement: ".len()..].to_string()).collect()
}

/// `line` with a `stream 0x…` or `graph 0x…` handle replaced by `0x?` (handles differ per run).
fn without_handles(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(i) = rest.find("0x") {
        out.push_str(&rest[..i]);
        out.push_str("0x?");
        rest = rest[i + 2..].trim_start_matches(|c: char| c.is_ascii_hexdigit());
    }
    out.push_str(rest);
    out
}

fn placement_run(env: &[(&str, &str)], args: &[&str]) -> RunOutput {
    let out = Run::program(Program::Placement).envs(env).args(args.iter().copied()).shim(true).with_shim_report().run();
    out.assert_completed();
    out
}

/// The report's placement entry of program device `d`.
fn device_summary(out: &RunOutput, d: u64) -> Value {
    let placement = out.shim_report().placement.clone().unwrap_or_else(|| panic!("no placement in the report\n{}", out.dump()));
    placement.as_array().unwrap().iter().find(|v| v["ordinal"] == d).cloned().unwrap_or_else(|| panic!("device {d} missing\n{}", out.dump()))
}

#[test]
fn first_launches_and_allocations_are_logged_once_per_device() {
    let out = placement_run(&[("GPUSIM_DEVICES", "2"), ("GPUSHIM_VISIBLE_DEVICES", "1,0"), ("GPUSHIM_LOG_PLACEMENT", "1")], &[]);
    for d in 0..2 {
        assert_eq!(out.num(&format!("d{d}.rc")), 0, "{}", out.dump());
    }
    let mut want = Vec::new();
    for (d, phys) in [(0u32, 1u32), (1, 0)] {
        let at = format!("device {d} (GPU {phys} {})", phys_uuid(phys));
        want.push(format!("cuMemAlloc of {} bytes on {at}", (d as u64 + 1) * MIB));
        want.push(format!("cuMemAllocManaged of {MIB} bytes on {at}"));
        want.push(format!("kernel vecAdd on {at}, the default stream"));
        want.push(format!("kernel _Z4fillPfi on {at}, stream 0x?"));
        want.push(format!("graph 0x? on {at}, the default stream"));
        // the graph a captured launch built (the captured launch itself is no launch)
        want.push(format!("graph 0x? on {at}, stream 0x?"));
    }
    let got: Vec<String> = placement_lines(&out).iter().map(|l| without_handles(l)).collect();
    assert_eq!(got, want, "one line per first (what, device), in order\n{}", out.dump());

    // The summary: every launch counted, per device, and the same total as the driver's record.
    let mut vec_add = 0;
    for (d, phys) in [(0u64, 1u32), (1, 0)] {
        let s = device_summary(&out, d);
        assert_eq!(s["gpu_index"], phys as u64, "{s}");
        assert_eq!(s["uuid"], phys_uuid(phys), "{s}");
        assert_eq!(s["part"], Value::Null, "{s}");
        // vecAdd: d+2 module launches, one through the library kernel's handle, one from the
        // module loaded again after the unload (kept by name); the captured one is no launch
        let kernels = serde_json::json!([{"name": "_Z4fillPfi", "launches": 2}, {"name": "vecAdd", "launches": d + 4}]);
        assert_eq!(s["kernels"], kernels, "{s}");
        let mut graphs: Vec<u64> = s["graphs"].as_array().unwrap().iter().map(|g| g["launches"].as_u64().unwrap()).collect();
        graphs.sort();
        assert_eq!(graphs, vec![1, 2], "the empty graph twice, the captured one once: {s}");
        let allocations = serde_json::json!([
            {"api": "cuMemAlloc", "count": 2, "bytes": 2 * (d + 1) * MIB},
            {"api": "cuMemAllocManaged", "count": 1, "bytes": MIB},
        ]);
        assert_eq!(s["allocations"], allocations, "{s}");
        vec_add += d + 4;
    }
    let driver = &out.report().launches;
    assert_eq!(driver.get("vecAdd"), Some(&vec_add), "the driver's record: {driver:?}");
    assert_eq!(driver.get("_Z4fillPfi"), Some(&4), "the driver's record: {driver:?}");
}

#[test]
fn parts_of_a_split_gpu_are_named() {
    let out = placement_run(&[("GPUSIM_DEVICES", "1"), ("GPUSHIM_VIRTUAL_DEVICES", "0:2x4GiB"), ("GPUSHIM_LOG_PLACEMENT", "true")], &[]);
    let lines = placement_lines(&out);
    for d in 0..2u64 {
        let at = format!("device {d} (GPU 0 {}, part {} of 2)", phys_uuid(0), d + 1);
        assert!(lines.iter().any(|l| *l == format!("kernel vecAdd on {at}, the default stream")), "{at}\n{}", out.dump());
        let s = device_summary(&out, d);
        assert_eq!(s["part"], serde_json::json!({"index": d, "count": 2}), "{s}");
        assert_eq!(s["gpu_index"], 0, "{s}");
    }
}

/// TensorFlow's `allow_soft_placement` moves work to another processor; a driver-level shim
/// cannot, but a program written for 4 GPUs runs on one split into 4 virtual devices.
#[test]
fn a_program_for_four_gpus_runs_on_one() {
    let alone = Run::program(Program::Placement).env("GPUSIM_DEVICES", "1").arg("4").run();
    alone.assert_completed();
    assert_eq!((alone.num("devices"), alone.num("enough")), (1, 0), "without the shim it sees one GPU\n{}", alone.dump());
    let out = placement_run(&[("GPUSIM_DEVICES", "1"), ("GPUSHIM_VIRTUAL_DEVICES", "0:4x2GiB"), ("GPUSHIM_LOG_PLACEMENT", "1")], &["4"]);
    assert_eq!((out.num("devices"), out.num("enough")), (4, 1), "{}", out.dump());
    for d in 0..4 {
        assert_eq!(out.num(&format!("d{d}.rc")), 0, "{}", out.dump());
        assert!(
            placement_lines(&out).iter().any(|l| l.starts_with("kernel vecAdd on ") && l.contains(&format!("device {d} (GPU 0 ")) && l.contains(&format!("part {} of 4", d + 1))),
            "device {d}\n{}",
            out.dump()
        );
    }
}

#[test]
fn the_runtimes_own_launches_are_logged() {
    let out = Run::program(Program::RtLaunch)
        .env("GPUSIM_DEVICES", "2")
        .env("GPUSHIM_LOG_PLACEMENT", "1")
        .shim(true)
        .with_shim_report()
        .run();
    out.assert_completed();
    assert_eq!(out.num("devices"), 2, "{}", out.dump());
    for d in 0..2u32 {
        assert_eq!(out.num(&format!("d{d}.rc")), 0, "cudaLaunchKernel on device {d}\n{}", out.dump());
        let at = format!("device {d} (GPU {d} {})", phys_uuid(d));
        let lines = placement_lines(&out);
        assert!(lines.contains(&format!("kernel vecAdd on {at}, the default stream")), "{}", out.dump());
        assert!(lines.contains(&format!("cuMemAlloc of {MIB} bytes on {at}")), "{}", out.dump());
        assert_eq!(device_summary(&out, d as u64)["kernels"], serde_json::json!([{"name": "vecAdd", "launches": d + 1}]));
    }
    assert_eq!(out.report().launches.get("vecAdd"), Some(&3), "the driver's record");
}

#[test]
fn without_a_report_the_summary_goes_to_the_log_and_log_off_silences_it() {
    let out = Run::program(Program::Placement).env("GPUSIM_DEVICES", "1").env("GPUSHIM_LOG_PLACEMENT", "yes").shim(true).run();
    out.assert_completed();
    let err = out.stderr_text();
    assert!(err.contains(&format!("gpushim placement (pid ")), "{}", out.dump());
    assert!(err.contains(&format!("  device 0 (GPU 0 {}):\n    kernel _Z4fillPfi: 2 launches\n    kernel vecAdd: 4 launches\n", phys_uuid(0))), "{}", out.dump());
    assert!(err.contains("    cuMemAlloc: 2 allocations, 2097152 bytes\n    cuMemAllocManaged: 1 allocation, 1048576 bytes"), "{}", out.dump());

    let quiet = Run::program(Program::Placement).env("GPUSIM_DEVICES", "1").env("GPUSHIM_LOG_PLACEMENT", "1").env("GPUSHIM_LOG", "off").shim(true).run();
    quiet.assert_completed();
    assert_eq!(quiet.num("d0.rc"), 0);
    assert!(!quiet.stderr_text().contains("gpushim"), "{}", quiet.dump());
}

#[test]
fn off_nothing_is_logged_and_the_launch_functions_are_the_drivers() {
    for value in [None, Some("0"), Some("false")] {
        let mut run = Run::program(Program::Placement).env("GPUSIM_DEVICES", "1").shim(true).with_shim_report();
        if let Some(v) = value {
            run = run.env("GPUSHIM_LOG_PLACEMENT", v);
        }
        let out = run.run();
        out.assert_completed();
        assert_eq!(out.num("d0.rc"), 0, "{}", out.dump());
        assert!(placement_lines(&out).is_empty(), "{value:?}\n{}", out.dump());
        assert!(!out.stderr_text().contains("gpushim placement"), "{value:?}\n{}", out.dump());
        assert!(out.shim_report().placement.is_none(), "{value:?}");
    }
    // Pointer identity on every way of reaching the driver: off, the driver's own cuLaunchKernel
    // (`tests/driver_paths.rs`); on, the shim's.
    for path in DriverPath::ALL.into_iter().filter(|p| p.asks_driver()) {
        // (tests/c/drvapi.c's `ident` reports cuLaunchKernel of its stream variant)
        let name = if path.is_ptsz() { "cuLaunchKernel_ptsz" } else { "cuLaunchKernel" };
        for (on, want) in [(false, "driver"), (true, "other")] {
            let mut run = Run::program(Program::Driver(path)).env("GPUSIM_MEMORY", "1GiB").arg("ident").shim(true);
            if on {
                run = run.env("GPUSHIM_LOG_PLACEMENT", "1");
            }
            let out = run.run();
            out.assert_completed();
            assert_eq!(out.get(&format!("ident.{name}")), want, "{name} by {path:?}, placement log {on}\n{}", out.dump());
        }
    }
}

#[test]
fn a_bad_value_is_a_configuration_error() {
    let out = Run::program(Program::Placement).env("GPUSIM_DEVICES", "1").env("GPUSHIM_LOG_PLACEMENT", "maybe").shim(true).run();
    out.assert_completed();
    assert_ne!(out.num("init.rc"), 0, "{}", out.dump());
    assert!(
        out.stderr_text().contains("gpushim: GPUSHIM_LOG_PLACEMENT=\"maybe\": expected 1, true, yes or on (or 0, false, no, off)"),
        "{}",
        out.dump()
    );
}

/// A process that only uses NVML (nvidia-smi under `gpushim run --log-placement`) prints no
/// placement summary: it launched and allocated nothing.
#[test]
fn an_nvml_only_process_prints_no_summary() {
    if skip_emulated("runs python3 (pynvml), a host program, with the target's library") {
        return;
    }
    let out = python_run("import pynvml\npynvml.nvmlInit()\nprint('count=%d' % pynvml.nvmlDeviceGetCount())\npynvml.nvmlShutdown()\nprint('done=1')\n")
        .env("GPUSIM_DEVICES", "2")
        .env("GPUSHIM_LOG_PLACEMENT", "1")
        .shim(true)
        .run();
    out.assert_completed();
    assert_eq!(out.num("count"), 2, "{}", out.dump());
    assert!(!out.stderr_text().contains("gpushim"), "{}", out.dump());
}
