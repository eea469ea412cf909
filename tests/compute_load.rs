//! The compute workloads (`tests/c/compute_load.c`, `tests/c/rt_compute.c`) without the shim:
//! every launch path runs for its wall time and counts its launches, the simulated driver's
//! own record agrees, a CUDA error is reported and exits 1, every kernel's simulated time is in
//! the simulator's report (`busy`, exactly launches × kernel time); and the busy-share
//! arithmetic over the report's 10 ms buckets (`common::compute`).

mod common;

use common::compute::{busy_ns, busy_share, window_shares, Load};
use common::*;

const MODES: [&str; 7] = ["continuous", "sync", "ex", "coop", "graph", "ptsz", "null"];

fn load(args: &[&str]) -> Run {
    Run::program(Program::ComputeLoad).args(args.iter().copied())
}

/// Runs `run`, which must exit 0 having printed `done=1`.
fn completed(run: Run) -> RunOutput {
    let out = run.run();
    out.assert_completed();
    out
}

#[test]
fn busy_share_reads_the_buckets() {
    let r: serde_json::Value = serde_json::from_str(
        r#"{"busy":[{"device":1,"busy_ns":15000000,"origin_ns":1000,"bucket_ns":10000000,
            "buckets":[10000000,5000000]}]}"#,
    )
    .unwrap();
    assert_eq!(busy_share(&r, 1, 1000, 10_001_000), 1.0);
    assert_eq!(busy_share(&r, 1, 1000, 20_001_000), 0.75);
    // half of each bucket inside the window
    assert_eq!(busy_share(&r, 1, 5_001_000, 15_001_000), 0.75);
    // beyond the timeline, and a device never used
    assert_eq!(busy_share(&r, 1, 20_001_000, 40_001_000), 0.0);
    assert_eq!(busy_share(&r, 0, 1000, 20_001_000), 0.0);
    assert_eq!(busy_ns(&r, 1), 15_000_000);
    assert_eq!(window_shares(&r, 1, 1000, 0.0, 0.01, 30_000_000), vec![1.0, 0.5]);
    assert_eq!(window_shares(&r, 1, 1000, 0.01, 0.01, 30_000_000), vec![0.5]);
}

#[test]
fn the_output_is_parsed() {
    let l = Load::parse("device=0 launches=7\ndevice=2 launches=3\nwall_ns=5 start_ns=9\ndone=1\n").unwrap();
    assert_eq!((l.on(0), l.on(2), l.on(1), l.start_ns, l.wall_ns), (7, 3, 0, 9, 5));
    assert!(Load::parse("device=0 launches=7\n").is_err());
}

#[test]
fn every_mode_launches_for_its_wall_time_on_two_devices() {
    for mode in MODES {
        let out = completed(load(&[mode, "0.3", "0", "0,1"]).env("GPUSIM_DEVICES", "2"));
        let l = Load::of(&out);
        assert_eq!(l.launches.len(), 2, "{mode}\n{}", out.dump());
        for d in [0, 1] {
            assert!(l.on(d) > 0, "{mode}: no launch on device {d}\n{}", out.dump());
        }
        assert!(l.wall_ns >= 300_000_000, "{mode}: ran {} ns\n{}", l.wall_ns, out.dump());
        assert!(l.start_ns > 0);
        // the driver's own count: a graph's captured launches are no launches of their own
        let kernels = out.report().launches.get("gpusim_busy").copied().unwrap_or(0);
        if mode == "graph" {
            assert_eq!(out.report().calls("cuGraphLaunch"), l.on(0) + l.on(1), "{mode}\n{}", out.dump());
        } else {
            assert_eq!(kernels, l.on(0) + l.on(1), "{mode}\n{}", out.dump());
        }
    }
}

#[test]
fn launch_calls_are_the_modes() {
    for (mode, call) in [
        ("continuous", "cuLaunchKernel"),
        ("ex", "cuLaunchKernelEx"),
        ("coop", "cuLaunchCooperativeKernel"),
        ("ptsz", "cuLaunchKernel_ptsz"),
        ("null", "cuLaunchKernel"),
    ] {
        let out = completed(load(&[mode, "0.1", "1000"]));
        let l = Load::of(&out);
        assert_eq!(out.report().calls(call), l.on(0), "{mode}\n{}", out.dump());
    }
    let out = completed(load(&["sync", "0.1", "1000"]));
    assert_eq!(out.report().calls("cuStreamSynchronize"), Load::of(&out).on(0), "{}", out.dump());
}

#[test]
fn bounded_pending_launches_wait_for_events() {
    let out = completed(load(&["continuous", "0.1", "1000"]).env("COMPUTE_LOAD_MAX_PENDING", "4"));
    let n = Load::of(&out).on(0);
    assert!(n > 4, "{}", out.dump());
    assert_eq!(out.report().calls("cuEventSynchronize"), n - 4, "{}", out.dump());
    assert_eq!(out.report().calls("cuEventRecord"), n, "{}", out.dump());
}

#[test]
fn a_cuda_error_is_named_and_exits_1() {
    let out = load(&["continuous", "0.1", "0", "5"]).run();
    assert_eq!(out.status.code(), Some(1), "{}", out.dump());
    assert!(out.stdout_text().contains("error: cuDeviceGet = 101"), "{}", out.dump());
    assert!(!out.kv.contains_key("done"), "{}", out.dump());
    let out = load(&["spin", "0.1", "0"]).run();
    assert_eq!(out.status.code(), Some(64), "{}", out.dump());
}

/// (cudart 12 checks the launch's dimensions against the device's attributes 2–7.)
#[test]
fn the_runtime_variant_launches_through_cudart() {
    for major in [12, 13] {
        for sync in [false, true] {
            let mut run = Run::program(Program::RtCompute { major }).args(["0.2", "100000"]);
            if sync {
                run = run.arg("sync");
            }
            let out = completed(run);
            let l = Load::of(&out);
            assert!(l.on(0) > 0 && l.wall_ns >= 200_000_000, "cudart {major}\n{}", out.dump());
            assert_eq!(out.report().launches.get("gpusim_busy").copied(), Some(l.on(0)), "cudart {major}\n{}", out.dump());
            assert_eq!(busy_ns(&out.report().raw, 0), l.on(0) * 100_000, "cudart {major}\n{}", out.dump());
        }
    }
}

/// With the simulator's time model: every launched kernel's time is in the report, exactly
/// (`busy_ns` = launches × kernels per launch × KERNEL_NS on each device: the program
/// synchronises before it exits), and launches back to back keep the device busy.
#[test]
fn the_kernels_time_is_in_the_simulator_report() {
    const NS: u64 = 1_000_000;
    for mode in MODES {
        let out = completed(
            load(&[mode, "0.6", &NS.to_string(), "0,1"]).env("GPUSIM_DEVICES", "2").env("COMPUTE_LOAD_MAX_PENDING", "50"),
        );
        let l = Load::of(&out);
        let per_launch = if mode == "graph" { 10 * NS } else { NS };
        let raw = &out.report().raw;
        for d in [0, 1] {
            assert!(l.on(d) > 0, "{mode}\n{}", out.dump());
            assert_eq!(busy_ns(raw, d), l.on(d) * per_launch, "{mode}: device {d}\n{}", out.dump());
        }
        if mode != "sync" {
            // (the first launches' set-up aside) the device never idles
            let share = busy_share(raw, 0, l.start_ns + 100_000_000, l.start_ns + 500_000_000);
            assert!(share > 0.9, "{mode}: busy {share}\n{}", out.dump());
        }
    }
}
