//! `GPUSHIM_VISIBLE_DEVICES`: hiding and reordering devices by ordinal, UUID (prefix) or PCI
//! bus id, for the driver API (linked, dlsym, cuGetProcAddress) and the real CUDA runtimes
//! 12.9 and 13.5, on the simulated driver with 3 physical devices of 16 GiB. Every case also
//! runs without the shim (all 3 devices in physical order), so each test can fail; where the
//! same view can be had from the driver itself (`CUDA_VISIBLE_DEVICES`, which the simulator
//! honours like the real driver), that run is the oracle for the return codes expected.
//!
//! Covered: reordering and hiding (what a hidden device answers by ordinal and PCI id), the
//! selector forms, `none`, composition with `CUDA_VISIBLE_DEVICES`, configuration errors,
//! children (inheriting the environment or started with the original one), per-device limits
//! by the program's ordinals, and the `info` log of the view.

mod common;

use common::*;

/// cudaErrorNoDevice / CUDA_ERROR_NO_DEVICE.
const NO_DEVICE: i64 = 100;
/// cudaErrorInvalidDevice / CUDA_ERROR_INVALID_DEVICE.
const INVALID_DEVICE: i64 = 101;

const RUNTIME_12: Program = Program::Runtime {
    major: 12,
    ptsz: false,
};
const RUNTIME_13: Program = Program::Runtime {
    major: 13,
    ptsz: false,
};

/// The programs every view is checked with: each way into the driver, and both runtimes.
const PROGRAMS: [Program; 5] = [
    Program::Driver(DriverPath::Link),
    Program::Driver(DriverPath::Dlsym),
    Program::Driver(DriverPath::Gpa),
    RUNTIME_12,
    RUNTIME_13,
];

fn is_runtime(p: Program) -> bool {
    matches!(p, Program::Runtime { .. })
}

/// The simulator with 3 physical devices of 16 GiB, `env` on top.
fn run3(p: Program, env: &[(&str, &str)]) -> Run {
    Run::program(p)
        .env("GPUSIM_DEVICES", "3")
        .env("GPUSIM_MEMORY", "16GiB")
        .envs(env)
}

/// Checks the `ids` output (keys under `prefix`) against the physical devices `want`, in
/// order: count, and for each ordinal its name, UUID, PCI bus id and PCI bus attribute.
fn assert_view(out: &RunOutput, prefix: &str, want: &[u32], what: &str) {
    let key = |k: &str| format!("{prefix}{k}");
    let seen: Vec<String> = (0..out
        .kv
        .get(&key("ids.count"))
        .and_then(|c| c.parse::<usize>().ok())
        .unwrap_or(0))
        .map(|d| {
            out.kv
                .get(&key(&format!("dev{d}.uuid")))
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    let wanted: Vec<String> = want.iter().map(|&p| phys_uuid(p)).collect();
    assert_eq!(
        out.num(&key("ids.count.rc")),
        0,
        "{what}: device count\n{}",
        out.dump()
    );
    assert_eq!(
        seen,
        wanted,
        "{what}: the devices the program sees (UUIDs by ordinal)\n{}",
        out.dump()
    );
    for (d, &p) in want.iter().enumerate() {
        let k = |f: &str| key(&format!("dev{d}.{f}"));
        assert_eq!(out.num(&k("rc")), 0, "{what}: dev{d}\n{}", out.dump());
        assert_eq!(
            out.get(&k("name")),
            phys_name(p),
            "{what}: name of {d}\n{}",
            out.dump()
        );
        assert!(
            out.get(&k("pci")).eq_ignore_ascii_case(&phys_pci(p)),
            "{what}: PCI bus id of {d} must be {}\n{}",
            phys_pci(p),
            out.dump()
        );
        assert_eq!(
            out.u64(&k("pcibus")),
            phys_bus(p) as u64,
            "{what}: PCI bus attribute of {d}\n{}",
            out.dump()
        );
        if let Some(v1) = out.kv.get(&k("uuid1")) {
            assert_eq!(
                v1,
                &phys_uuid(p),
                "{what}: v1 cuDeviceGetUuid of {d}\n{}",
                out.dump()
            );
        }
    }
}

/// The program initialised, saw `want` and printed no gpushim line at all.
fn assert_quiet_view(out: &RunOutput, want: &[u32], what: &str) {
    out.assert_completed();
    assert_eq!(out.num("init.rc"), 0, "{what}: CUDA init\n{}", out.dump());
    assert_eq!(
        out.u64("count"),
        want.len() as u64,
        "{what}: count\n{}",
        out.dump()
    );
    assert_view(out, "", want, what);
    assert!(
        out.gpushim_lines().is_empty(),
        "{what}: no gpushim output expected\n{}",
        out.dump()
    );
}

const ALL: [u32; 3] = [0, 1, 2];

// ---------------------------------------------------------------------------------------
// 1. reorder and hide by ordinal
// ---------------------------------------------------------------------------------------

/// `2,0`: ordinal 0 is physical 2, ordinal 1 physical 0, physical 1 is unreachable by ordinal
/// and by PCI bus id. The same program with `CUDA_VISIBLE_DEVICES=2,0` and no shim is the
/// oracle; without either, all three devices in physical order.
#[test]
fn reorders_and_hides_by_ordinal() {
    for p in PROGRAMS {
        // op2: hidden p1 by PCI id, op3: p2 by PCI id, op4: ordinal 2
        let ordinal_op = if is_runtime(p) { "dev=2" } else { "get=2" };
        let args = [
            "ids",
            "bypci=0000:20:00.0",
            "bypci=0000:30:00.0",
            ordinal_op,
        ];
        for (shim, env, view) in [
            (true, ("GPUSHIM_VISIBLE_DEVICES", "2,0"), &[2, 0][..]),
            (false, ("CUDA_VISIBLE_DEVICES", "2,0"), &[2, 0][..]),
            (false, ("GPUSHIM_VISIBLE_DEVICES", "2,0"), &ALL[..]),
        ] {
            let what = format!("{p:?} shim={shim} {env:?}");
            let out = run3(p, &[env]).args(args).shim(shim).run();
            assert_quiet_view(&out, view, &what);
            if view.len() == 2 {
                assert_eq!(
                    out.num("op2.rc"),
                    INVALID_DEVICE,
                    "{what}: hidden p1 by PCI id\n{}",
                    out.dump()
                );
                assert_eq!(out.num("op3.rc"), 0, "{what}: p2 by PCI id\n{}", out.dump());
                assert_eq!(
                    out.num("op3.dev"),
                    0,
                    "{what}: p2 by PCI id\n{}",
                    out.dump()
                );
                assert_eq!(
                    out.num("op4.rc"),
                    INVALID_DEVICE,
                    "{what}: ordinal 2\n{}",
                    out.dump()
                );
            } else {
                assert_eq!(out.num("op2.rc"), 0, "{what}\n{}", out.dump());
                assert_eq!(out.num("op2.dev"), 1, "{what}\n{}", out.dump());
                assert_eq!(out.num("op3.rc"), 0, "{what}\n{}", out.dump());
                assert_eq!(out.num("op3.dev"), 2, "{what}\n{}", out.dump());
                assert_eq!(out.num("op4.rc"), 0, "{what}: ordinal 2\n{}", out.dump());
            }
        }
    }
}

/// Hiding without reordering, and an identity permutation, on every path.
#[test]
fn hides_without_reordering() {
    for p in PROGRAMS {
        for (value, view) in [
            ("1", &[1][..]),
            ("0,2", &[0, 2][..]),
            ("0,1,2", &ALL[..]),
            ("2,1,0", &[2, 1, 0][..]),
        ] {
            for shim in [false, true] {
                let out = run3(p, &[("GPUSHIM_VISIBLE_DEVICES", value)])
                    .arg("ids")
                    .shim(shim)
                    .run();
                let want = if shim { view } else { &ALL[..] };
                assert_quiet_view(&out, want, &format!("{p:?} shim={shim} {value}"));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// 2. selectors: UUID (prefix), PCI bus id, mixed
// ---------------------------------------------------------------------------------------

#[test]
fn selects_by_uuid_and_pci_bus_id() {
    let full_p1 = phys_uuid(1);
    let full_list = format!("{full_p1},2");
    let cases: Vec<(&str, Vec<u32>)> = vec![
        ("GPU-30", vec![2]),
        ("0000:20:00.0", vec![1]),
        ("20:00.0", vec![1]),
        ("00000000:20:00.0", vec![1]),
        ("GPU-3,0", vec![2, 0]),
        (full_list.as_str(), vec![1, 2]),
        ("0000:30:00.0,GPU-1", vec![2, 0]),
        (" 2 , 0 ", vec![2, 0]),
        ("GPU-30313233-3435-3637-3839-3A3B3C3D3E3F", vec![2]),
    ];
    for p in PROGRAMS {
        for (value, view) in &cases {
            for shim in [false, true] {
                let out = run3(p, &[("GPUSHIM_VISIBLE_DEVICES", value)])
                    .arg("ids")
                    .shim(shim)
                    .run();
                let want = if shim { &view[..] } else { &ALL[..] };
                assert_quiet_view(
                    &out,
                    want,
                    &format!("{p:?} shim={shim} GPUSHIM_VISIBLE_DEVICES={value}"),
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// 3. none
// ---------------------------------------------------------------------------------------

/// `none`: no device, as the driver says it (cudaErrorNoDevice / CUDA_ERROR_NO_DEVICE), and no
/// gpushim message (it is not an error). `CUDA_VISIBLE_DEVICES=-1` without the shim is the oracle.
#[test]
fn none_hides_every_device() {
    for p in PROGRAMS {
        for (shim, env) in [
            (true, ("GPUSHIM_VISIBLE_DEVICES", "none")),
            (false, ("CUDA_VISIBLE_DEVICES", "-1")),
        ] {
            let what = format!("{p:?} shim={shim} {env:?}");
            let out = run3(p, &[env]).arg("ids").shim(shim).run();
            out.assert_completed();
            assert_eq!(
                out.num("init.rc"),
                NO_DEVICE,
                "{what}: CUDA init\n{}",
                out.dump()
            );
            assert!(
                out.kv.get("count").map_or(true, |c| c == "0"),
                "{what}: devices after `none`\n{}",
                out.dump()
            );
            assert!(
                out.gpushim_lines().is_empty(),
                "{what}: `none` is no error\n{}",
                out.dump()
            );
        }
        let out = run3(p, &[("GPUSHIM_VISIBLE_DEVICES", "none")])
            .arg("ids")
            .run();
        assert_quiet_view(&out, &ALL, &format!("{p:?} without the shim, none"));
    }
}

// ---------------------------------------------------------------------------------------
// 4. composition with CUDA_VISIBLE_DEVICES
// ---------------------------------------------------------------------------------------

/// Ordinals are among the devices the driver shows (after `CUDA_VISIBLE_DEVICES`); UUIDs and
/// PCI ids name devices the driver shows.
#[test]
fn composes_with_cuda_visible_devices() {
    let cases: &[(&str, &str, &[u32], &[u32])] = &[
        // (CUDA_VISIBLE_DEVICES, GPUSHIM_VISIBLE_DEVICES, with the shim, without)
        ("2,1", "1", &[1], &[2, 1]),
        ("1,2", "1,0", &[2, 1], &[1, 2]),
        ("1,2", "GPU-3", &[2], &[1, 2]),
        ("1,2", "0000:20:00.0", &[1], &[1, 2]),
        ("GPU-30,GPU-10", "1", &[0], &[2, 0]),
        ("2,0", "GPU-1,0", &[0, 2], &[2, 0]),
    ];
    for p in PROGRAMS {
        for (cvd, gvd, with, without) in cases {
            for shim in [false, true] {
                let out = run3(
                    p,
                    &[
                        ("CUDA_VISIBLE_DEVICES", cvd),
                        ("GPUSHIM_VISIBLE_DEVICES", gvd),
                    ],
                )
                .arg("ids")
                .shim(shim)
                .run();
                let want = if shim { with } else { without };
                assert_quiet_view(
                    &out,
                    want,
                    &format!("{p:?} shim={shim} CUDA_VISIBLE_DEVICES={cvd} GPUSHIM_VISIBLE_DEVICES={gvd}"),
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// 5. configuration errors
// ---------------------------------------------------------------------------------------

/// Runs `p` with `env` without the shim (must initialise) and with it (CUDA init fails with 3,
/// exactly one gpushim line `gpushim: GPUSHIM_VISIBLE_DEVICES="VALUE": REASON`).
fn fails_closed(p: Program, env: &[(&str, &str)], value: &str) {
    let out = check_fails_closed(|| run3(p, env).arg("ids"));
    assert_fails_closed(&out.shim, "GPUSHIM_VISIBLE_DEVICES", value);
}

#[test]
fn bad_selectors_fail_closed() {
    let values = [
        "5",            // ordinal out of range (3 devices)
        "3",            // the first ordinal out of range
        "GPU-ff",       // unknown UUID
        "GPU-",         // ambiguous prefix (every device)
        "0000:99:00.0", // unknown PCI bus id
        "0,GPU-1",      // the same device twice
        "2,2",          // the same ordinal twice
        "20:00.0,1",    // the same device by PCI id and ordinal
    ];
    for p in PROGRAMS {
        for value in values {
            fails_closed(p, &[("GPUSHIM_VISIBLE_DEVICES", value)], value);
        }
    }
}

/// A device hidden by `CUDA_VISIBLE_DEVICES` cannot be selected: by UUID, by PCI id, nor by an
/// ordinal past what the driver shows.
#[test]
fn selecting_a_device_cuda_visible_devices_hides_fails_closed() {
    for p in PROGRAMS {
        for value in ["GPU-1", "0000:10:00.0", "2"] {
            fails_closed(
                p,
                &[
                    ("CUDA_VISIBLE_DEVICES", "1,2"),
                    ("GPUSHIM_VISIBLE_DEVICES", value),
                ],
                value,
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// 6. children
// ---------------------------------------------------------------------------------------

/// `'…'` for /bin/sh.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// The environment the test gives a run (what a child started "with the original
/// environment" gets), plus the run's own variables; `state` is the run's state directory
/// (without it a child under the shim would use the default one, /tmp/gpushim-UID).
fn original_env(shim: bool, env: &[(&str, &str)], state: &std::path::Path) -> Vec<(String, String)> {
    let mut v = vec![
        (
            "LD_LIBRARY_PATH".to_string(),
            sim_dir().display().to_string(),
        ),
        ("GPUSIM_DEVICES".to_string(), "3".to_string()),
        ("GPUSIM_MEMORY".to_string(), "16GiB".to_string()),
        ("GPUSHIM_STATE_DIR".to_string(), state.display().to_string()),
    ];
    if shim {
        v.push(("LD_PRELOAD".to_string(), shim_path().display().to_string()));
    }
    v.extend(env.iter().map(|(k, val)| (k.to_string(), val.to_string())));
    v
}

/// A runtime program under the shim initialises CUDA, then starts children by popen: one
/// inheriting the environment as it is after CUDA initialisation, one with only the original
/// variables (`env -i`). Both see the parent's view; without the shim everything sees all 3.
#[test]
fn children_see_the_same_view() {
    if skip_unless_target_exec("a program of the target starts its children (spawn=)") {
        return;
    }
    let children = [RUNTIME_13, Program::Driver(DriverPath::Gpa)];
    let cases: &[(&[(&str, &str)], &[u32])] = &[
        (&[("GPUSHIM_VISIBLE_DEVICES", "2,0")], &[2, 0]),
        (
            &[("GPUSHIM_VISIBLE_DEVICES", "GPU-3,0000:10:00.0")],
            &[2, 0],
        ),
        (
            &[
                ("CUDA_VISIBLE_DEVICES", "1,2"),
                ("GPUSHIM_VISIBLE_DEVICES", "1,0"),
            ],
            &[2, 1],
        ),
    ];
    for parent in [RUNTIME_12, RUNTIME_13] {
        for (env, view) in cases {
            for shim in [false, true] {
                let state = scratch_path("state");
                let mut args = vec!["ids".to_string()];
                for child in children {
                    let exe = program(child).display().to_string();
                    // inherit the environment as it is now
                    args.push(format!("spawn={} ids", sh_quote(&exe)));
                    // the original environment only
                    let vars: Vec<String> = original_env(shim, env, &state)
                        .iter()
                        .map(|(k, v)| sh_quote(&format!("{k}={v}")))
                        .collect();
                    args.push(format!(
                        "spawn=env -i {} {} ids",
                        vars.join(" "),
                        sh_quote(&exe)
                    ));
                }
                let out = run3(parent, env).env("GPUSHIM_STATE_DIR", &state).args(&args).shim(shim).run();
                let want = if shim { *view } else { unshimmed(env) };
                let what = format!("parent {parent:?} shim={shim} {env:?}");
                out.assert_completed();
                assert_eq!(out.num("init.rc"), 0, "{what}\n{}", out.dump());
                assert_view(&out, "", want, &what);
                for (k, child) in children.iter().enumerate() {
                    for (j, how) in [
                        "inheriting the environment",
                        "with the original environment",
                    ]
                    .iter()
                    .enumerate()
                    {
                        let op = 2 + 2 * k + j;
                        let what = format!("{what}: child {child:?} {how} (op{op})");
                        assert_eq!(
                            out.num(&format!("op{op}.status")),
                            0,
                            "{what}\n{}",
                            out.dump()
                        );
                        assert_eq!(
                            out.get(&format!("op{op}.done")),
                            "1",
                            "{what}\n{}",
                            out.dump()
                        );
                        assert_eq!(
                            out.num(&format!("op{op}.init.rc")),
                            0,
                            "{what}\n{}",
                            out.dump()
                        );
                        assert_view(&out, &format!("op{op}."), want, &what);
                    }
                }
                assert!(
                    out.gpushim_lines().is_empty(),
                    "{what}: no gpushim output expected from the parent or its children\n{}",
                    out.dump()
                );
            }
        }
    }
}

/// The same from Python: CUDA initialised through ctypes on libcudart, then `subprocess` with
/// the environment inherited and with `env=` a copy taken before CUDA was used.
const PY_CHILDREN: &str = r#"
import ctypes, os, subprocess, sys
orig = dict(os.environ)
cudart, child = sys.argv[1], sys.argv[2]
rt = ctypes.CDLL(cudart)
n = ctypes.c_int(-1)
print(f"init.rc={rt.cudaGetDeviceCount(ctypes.byref(n))}")
print(f"count={n.value}")
print(f"setdevice.rc={rt.cudaSetDevice(0)}")
print(f"free.rc={rt.cudaFree(None)}")
print(f"sync.rc={rt.cudaDeviceSynchronize()}")
for d in range(max(n.value, 0)):
    buf = ctypes.create_string_buffer(64)
    print(f"dev{d}.pci.rc={rt.cudaDeviceGetPCIBusId(buf, 64, d)}")
    print(f"dev{d}.pci={buf.value.decode()}")
for label, env in (("inherit", None), ("orig", orig)):
    r = subprocess.run([child, "ids"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in r.stdout.splitlines():
        print(f"{label}.{line}")
    for line in r.stderr.splitlines():
        print(line, file=sys.stderr)
    print(f"{label}.status={r.returncode}")
print("done=1")
"#;


/// What the driver alone shows under the case's `CUDA_VISIBLE_DEVICES` (the no-shim answer).
fn unshimmed(env: &[(&str, &str)]) -> &'static [u32] {
    match env.iter().find(|(k, _)| *k == "CUDA_VISIBLE_DEVICES").map(|(_, v)| *v) {
        None => &ALL[..],
        Some("1,2") => &[1, 2],
        Some(other) => panic!("no expectation written for CUDA_VISIBLE_DEVICES={other}"),
    }
}

#[test]
fn python_children_see_the_same_view() {
    if skip_emulated("runs python3, a host program, with the target's library") {
        return;
    }
    let cudart = cuda_deps(13).join("lib/libcudart.so.13");
    let child = program(RUNTIME_13);
    let cases: &[(&[(&str, &str)], &[u32])] = &[
        (&[("GPUSHIM_VISIBLE_DEVICES", "2,0")], &[2, 0]),
        (
            &[
                ("CUDA_VISIBLE_DEVICES", "1,2"),
                ("GPUSHIM_VISIBLE_DEVICES", "1,0"),
            ],
            &[2, 1],
        ),
    ];
    for (env, view) in cases {
        for shim in [false, true] {
            let out = Run::new("python3")
                .arg("-c")
                .arg(PY_CHILDREN)
                .arg(&cudart)
                .arg(&child)
                .env("GPUSIM_DEVICES", "3")
                .env("GPUSIM_MEMORY", "16GiB")
                .envs(*env)
                .shim(shim)
                .run();
            let want = if shim { *view } else { unshimmed(env) };
            let what = format!("python shim={shim} {env:?}");
            out.assert_completed();
            assert_eq!(out.num("init.rc"), 0, "{what}\n{}", out.dump());
            assert_eq!(
                out.u64("count"),
                want.len() as u64,
                "{what}\n{}",
                out.dump()
            );
            for (d, &p) in want.iter().enumerate() {
                assert!(
                    out.get(&format!("dev{d}.pci"))
                        .eq_ignore_ascii_case(&phys_pci(p)),
                    "{what}: parent's device {d}\n{}",
                    out.dump()
                );
            }
            for label in ["inherit", "orig"] {
                let what = format!("{what}: child ({label})");
                assert_eq!(
                    out.num(&format!("{label}.status")),
                    0,
                    "{what}\n{}",
                    out.dump()
                );
                assert_eq!(
                    out.num(&format!("{label}.init.rc")),
                    0,
                    "{what}\n{}",
                    out.dump()
                );
                assert_view(&out, &format!("{label}."), want, &what);
            }
            assert!(
                out.gpushim_lines().is_empty(),
                "{what}: no gpushim output expected from the parent or its children\n{}",
                out.dump()
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// 7. per-device limits follow the program's ordinals
// ---------------------------------------------------------------------------------------

/// `2,0` + `GPUSHIM_MEMORY_LIMIT_0=1GiB`: program device 0 (physical 2) admits exactly 1 GiB,
/// program device 1 (physical 0) is unlimited; totals and memory info say so.
#[test]
fn per_device_limits_follow_program_ordinals() {
    let programs = [
        RUNTIME_12,
        RUNTIME_13,
        Program::Driver(DriverPath::Link),
        Program::Driver(DriverPath::Gpa),
    ];
    let env = [
        ("GPUSHIM_VISIBLE_DEVICES", "2,0"),
        ("GPUSHIM_MEMORY_LIMIT_0", "1GiB"),
    ];
    for p in programs {
        let api = if is_runtime(p) { "malloc" } else { "mem" };
        let args = [
            "ids".to_string(),                  // 1
            format!("alloc={api}:{GIB}"),       // 2: exactly the limit
            format!("alloc={api}:{}", 2 * MIB), // 3: refused with the shim
            "info".to_string(),                 // 4
            "dev=1".to_string(),                // 5
            format!("alloc={api}:{}", 8 * GIB), // 6: no limit on device 1
            "info".to_string(),                 // 7
        ];
        for shim in [false, true] {
            let what = format!("{p:?} shim={shim}");
            let out = run3(p, &env).args(&args).shim(shim).run();
            out.assert_completed();
            assert_eq!(out.num("cleanup.failures"), 0, "{what}\n{}", out.dump());
            let report = out.report();
            if shim {
                assert_view(&out, "", &[2, 0], &what);
                assert_eq!(
                    out.u64("dev0.total"),
                    GIB,
                    "{what}: total of device 0\n{}",
                    out.dump()
                );
                assert_eq!(
                    out.u64("dev1.total"),
                    16 * GIB,
                    "{what}: total of device 1\n{}",
                    out.dump()
                );
                assert_eq!(out.num("op2.rc"), 0, "{what}: 1 GiB fits\n{}", out.dump());
                assert_eq!(
                    out.num("op3.rc"),
                    OOM,
                    "{what}: over the limit\n{}",
                    out.dump()
                );
                assert_eq!(out.u64("op4.total"), GIB, "{what}\n{}", out.dump());
                assert_eq!(out.u64("op4.free"), 0, "{what}\n{}", out.dump());
                assert_eq!(
                    out.num("op6.rc"),
                    0,
                    "{what}: device 1 is unlimited\n{}",
                    out.dump()
                );
                assert_eq!(out.u64("op7.total"), 16 * GIB, "{what}\n{}", out.dump());
                assert_eq!(out.u64("op7.free"), 8 * GIB, "{what}\n{}", out.dump());
                assert!(
                    report.device(2).peak <= GIB,
                    "{what}: physical 2 over 1 GiB\n{}",
                    out.dump()
                );
                assert_eq!(
                    report.device(2).peak,
                    GIB,
                    "{what}: physical 2\n{}",
                    out.dump()
                );
                assert_eq!(
                    report.device(0).peak,
                    8 * GIB,
                    "{what}: physical 0\n{}",
                    out.dump()
                );
                assert_eq!(
                    report.device(1).peak,
                    0,
                    "{what}: hidden physical 1\n{}",
                    out.dump()
                );
                let warns = out.warn_lines();
                assert_eq!(warns.len(), 1, "{what}: one refusal\n{}", out.dump());
                assert_mentions_device(&warns[0], 0);
                assert_mentions_numbers(&warns[0], &[2 * MIB, GIB]);
            } else {
                assert_view(&out, "", &ALL, &what);
                assert_eq!(out.u64("dev0.total"), 16 * GIB, "{what}\n{}", out.dump());
                assert_eq!(out.num("op3.rc"), 0, "{what}\n{}", out.dump());
                assert_eq!(out.u64("op4.total"), 16 * GIB, "{what}\n{}", out.dump());
                assert_eq!(
                    report.device(0).peak,
                    GIB + 2 * MIB,
                    "{what}\n{}",
                    out.dump()
                );
                assert_eq!(report.device(1).peak, 8 * GIB, "{what}\n{}", out.dump());
                assert_eq!(report.device(2).peak, 0, "{what}\n{}", out.dump());
                assert!(out.gpushim_lines().is_empty(), "{what}\n{}", out.dump());
            }
            for d in 0..3 {
                assert_eq!(
                    report.device(d).used,
                    0,
                    "{what}: in use at exit\n{}",
                    out.dump()
                );
            }
        }
    }
}

/// `cudaGetDeviceProperties(0).totalGlobalMem` is program device 0's limit (the existing
/// `props` operation), whichever physical device that is.
#[test]
fn total_global_mem_follows_program_ordinals() {
    for p in [RUNTIME_12, RUNTIME_13] {
        for shim in [false, true] {
            let out = run3(
                p,
                &[
                    ("GPUSHIM_VISIBLE_DEVICES", "2,0"),
                    ("GPUSHIM_MEMORY_LIMIT", "4GiB"),
                    ("GPUSHIM_MEMORY_LIMIT_0", "1GiB"),
                ],
            )
            .arg("props")
            .shim(shim)
            .run();
            out.assert_completed();
            let what = format!("{p:?} shim={shim}");
            if shim {
                assert_eq!(out.u64("count"), 2, "{what}\n{}", out.dump());
                assert_eq!(out.u64("op1.total0"), GIB, "{what}\n{}", out.dump());
                assert_eq!(out.u64("op1.total1"), 4 * GIB, "{what}\n{}", out.dump());
                assert_eq!(out.get("op1.name0"), phys_name(2), "{what}\n{}", out.dump());
                assert_eq!(out.get("op1.name1"), phys_name(0), "{what}\n{}", out.dump());
            } else {
                assert_eq!(out.u64("count"), 3, "{what}\n{}", out.dump());
                for d in 0..3 {
                    assert_eq!(
                        out.u64(&format!("op1.total{d}")),
                        16 * GIB,
                        "{what}\n{}",
                        out.dump()
                    );
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// 10. the info log of the view
// ---------------------------------------------------------------------------------------

/// `GPUSHIM_LOG=info`: one `gpushim: info:` line per device of the view with its ordinal, name,
/// UUID and limit in bytes; none for hidden devices; no info lines at the default level.
#[test]
fn info_log_lists_the_view() {
    let env = [
        ("GPUSHIM_VISIBLE_DEVICES", "2,0"),
        ("GPUSHIM_MEMORY_LIMIT", "4GiB"),
        ("GPUSHIM_MEMORY_LIMIT_0", "1GiB"),
    ];
    for p in [
        RUNTIME_13,
        RUNTIME_12,
        Program::Driver(DriverPath::Link),
        Program::Driver(DriverPath::Gpa),
    ] {
        let out = run3(p, &env)
            .env("GPUSHIM_LOG", "info")
            .arg("ids")
            .shim(true)
            .run();
        out.assert_completed();
        assert_eq!(out.num("init.rc"), 0, "{p:?}\n{}", out.dump());
        let info: Vec<String> = out
            .gpushim_lines()
            .into_iter()
            .filter(|l| l.starts_with("gpushim: info:"))
            .collect();
        for (ordinal, phys, limit) in [(0u64, 2u32, GIB), (1, 0, 4 * GIB)] {
            let uuid = phys_uuid(phys);
            let lines: Vec<&String> = info.iter().filter(|l| l.contains(&uuid)).collect();
            assert_eq!(
                lines.len(),
                1,
                "{p:?}: one info line for ordinal {ordinal} ({uuid})\n{}",
                out.dump()
            );
            let line = lines[0];
            assert!(
                line.contains(&phys_name(phys)),
                "{p:?}: `{line}` lacks the name {}",
                phys_name(phys)
            );
            assert_mentions_numbers(line, &[ordinal, limit]);
        }
        assert!(
            !info.iter().any(|l| l.contains(&phys_uuid(1))),
            "{p:?}: the hidden device is listed\n{}",
            out.dump()
        );

        let quiet = run3(p, &env).arg("ids").shim(true).run();
        quiet.assert_completed();
        assert!(
            !quiet
                .stderr_text()
                .lines()
                .any(|l| l.starts_with("gpushim: info:")),
            "{p:?}: info lines at the default level\n{}",
            quiet.dump()
        );
        let plain = run3(p, &env).env("GPUSHIM_LOG", "info").arg("ids").run();
        assert_quiet_view(&plain, &ALL, &format!("{p:?} without the shim"));
    }
}

// ---------------------------------------------------------------------------------------
// More ways to set the view, and its limits
// ---------------------------------------------------------------------------------------

/// `visible_devices` in the config file (array or string), and the environment above it.
#[test]
fn visible_devices_from_the_config_file() {
    let cases: &[(&str, &[(&str, &str)], &[u32])] = &[
        ("visible_devices = [2, 0]\n", &[], &[2, 0]),
        ("visible_devices = \"GPU-3,0000:10:00.0\"\n", &[], &[2, 0]),
        ("visible_devices = [\"20:00.0\"]\n", &[], &[1]),
        (
            "visible_devices = [2, 0]\n",
            &[("GPUSHIM_VISIBLE_DEVICES", "1")],
            &[1],
        ),
    ];
    for p in [Program::Driver(DriverPath::Link), RUNTIME_13] {
        for (file, env, view) in cases {
            let path = scratch_path("gpushim.toml");
            std::fs::write(&path, file).unwrap();
            for shim in [false, true] {
                let out = run3(p, env)
                    .env("GPUSHIM_CONFIG", &path)
                    .arg("ids")
                    .shim(shim)
                    .run();
                let want = if shim { *view } else { unshimmed(env) };
                assert_quiet_view(
                    &out,
                    want,
                    &format!("{p:?} shim={shim} file {file:?} env {env:?}"),
                );
            }
        }
        // an ordinal out of range in the file: fails closed, one line naming the key and file
        let path = scratch_path("gpushim.toml");
        std::fs::write(&path, "visible_devices = [5]\n").unwrap();
        let out = run3(p, &[])
            .env("GPUSHIM_CONFIG", &path)
            .arg("ids")
            .shim(true)
            .run();
        out.assert_completed();
        assert_eq!(out.num("init.rc"), NOT_INITIALIZED, "{p:?}\n{}", out.dump());
        let lines = out.gpushim_lines();
        assert_eq!(lines.len(), 1, "{p:?}: one line\n{}", out.dump());
        assert!(
            lines[0].starts_with("gpushim: visible_devices")
                && lines[0].contains(&*path.to_string_lossy()),
            "{p:?}: `{}` must name visible_devices and the file",
            lines[0]
        );
    }
}

/// `GPUSHIM_DISABLE=1`: everything passes through, the view included.
#[test]
fn disable_passes_every_device_through() {
    for p in PROGRAMS {
        let out = run3(
            p,
            &[
                ("GPUSHIM_DISABLE", "1"),
                ("GPUSHIM_VISIBLE_DEVICES", "2,0"),
                ("GPUSHIM_MEMORY_LIMIT_0", "1GiB"),
            ],
        )
        .arg("ids")
        .shim(true)
        .run();
        assert_quiet_view(&out, &ALL, &format!("{p:?} disabled"));
        for d in 0..3 {
            assert_eq!(
                out.u64(&format!("dev{d}.total")),
                16 * GIB,
                "{p:?}\n{}",
                out.dump()
            );
        }
    }
}

/// A program that sets `CUDA_VISIBLE_DEVICES` itself (`os.environ[…] = …` before importing a
/// GPU library, as many scripts do) composes like one started with it: the selectors are
/// ordinals among what the driver shows once CUDA initialises.
const PY_IN_PROCESS: &str = r#"
import ctypes, os, sys
cudart, cvd, nvml_first = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
if nvml_first:
    import pynvml as n
    n.nvmlInit()
    print(f"nvml.count={n.nvmlDeviceGetCount()}")
os.environ["CUDA_VISIBLE_DEVICES"] = cvd
rt = ctypes.CDLL(cudart)
c = ctypes.c_int(-1)
print(f"init.rc={rt.cudaGetDeviceCount(ctypes.byref(c))}")
if c.value >= 0:
    print(f"count={c.value}")
for d in range(max(c.value, 0)):
    buf = ctypes.create_string_buffer(64)
    print(f"dev{d}.pci.rc={rt.cudaDeviceGetPCIBusId(buf, 64, d)}")
    print(f"dev{d}.pci={buf.value.decode()}")
print("done=1")
"#;

fn assert_pci_view(out: &RunOutput, want: &[u32], what: &str) {
    assert_eq!(out.num("init.rc"), 0, "{what}\n{}", out.dump());
    assert_eq!(
        out.u64("count"),
        want.len() as u64,
        "{what}: count\n{}",
        out.dump()
    );
    for (d, &p) in want.iter().enumerate() {
        assert!(
            out.get(&format!("dev{d}.pci"))
                .eq_ignore_ascii_case(&phys_pci(p)),
            "{what}: device {d} must be physical {p}\n{}",
            out.dump()
        );
    }
}

#[test]
fn cuda_visible_devices_set_in_process_composes() {
    if skip_emulated("runs python3, a host program, with the target's library") {
        return;
    }
    let cudart = cuda_deps(13).join("lib/libcudart.so.13");
    let cases: &[(&str, &str, &[u32], &[u32])] = &[
        // (CUDA_VISIBLE_DEVICES set by the program, GPUSHIM_VISIBLE_DEVICES, with, without)
        ("0,1,2", "2,0", &[2, 0], &ALL),
        ("1,2", "1,0", &[2, 1], &[1, 2]),
        ("2", "0", &[2], &[2]),
    ];
    for (cvd, gvd, with, without) in cases {
        for shim in [false, true] {
            let out = Run::new("python3")
                .args(["-c", PY_IN_PROCESS])
                .arg(&cudart)
                .args([*cvd, "0"])
                .env("GPUSIM_DEVICES", "3")
                .env("GPUSIM_MEMORY", "16GiB")
                .env("GPUSHIM_VISIBLE_DEVICES", gvd)
                .shim(shim)
                .run();
            out.assert_completed();
            let what = format!(
                "shim={shim} in-process CUDA_VISIBLE_DEVICES={cvd} GPUSHIM_VISIBLE_DEVICES={gvd}"
            );
            assert_pci_view(&out, if shim { with } else { without }, &what);
            assert!(out.gpushim_lines().is_empty(), "{what}\n{}", out.dump());
        }
    }
}

/// NVML used first (the view is worked out then), `CUDA_VISIBLE_DEVICES` changed afterwards,
/// then CUDA: the program never sees a hidden device — the view, or CUDA fails closed.
#[test]
fn cuda_visible_devices_changed_after_nvml_never_unhides() {
    if skip_emulated("runs python3, a host program, with the target's library") {
        return;
    }
    nvml_sim_library();
    let cudart = cuda_deps(13).join("lib/libcudart.so.13");
    for shim in [false, true] {
        let out = python_run(PY_IN_PROCESS)
            .arg(&cudart)
            .args(["0,1,2", "1"])
            .env("GPUSIM_DEVICES", "3")
            .env("GPUSIM_MEMORY", "16GiB")
            .env("GPUSHIM_VISIBLE_DEVICES", "2,0")
            .shim(shim)
            .run();
        out.assert_completed();
        let what = format!("shim={shim}");
        if !shim {
            assert_eq!(out.u64("nvml.count"), 3, "{what}\n{}", out.dump());
            assert_pci_view(&out, &ALL, &what);
            continue;
        }
        assert_eq!(out.u64("nvml.count"), 2, "{what}: NVML\n{}", out.dump());
        if out.num("init.rc") == 0 {
            assert_pci_view(&out, &[2, 0], &what);
        } else {
            assert_eq!(
                out.num("init.rc"),
                NOT_INITIALIZED,
                "{what}\n{}",
                out.dump()
            );
            assert!(
                out.kv.get("count").map_or(true, |c| c == "0"),
                "{what}\n{}",
                out.dump()
            );
            assert!(
                !out.gpushim_lines().is_empty(),
                "{what}: failing closed says why\n{}",
                out.dump()
            );
        }
    }
}

/// The view is worked out from NVML's inventory; where NVML cannot be loaded (a container
/// given only the `compute` driver capability has libcuda but no libnvidia-ml) a view must
/// still never run unconstrained: it is applied, or CUDA initialisation fails with a message
/// naming the setting. Limits without a view need no NVML.
#[test]
fn without_nvml_a_view_never_runs_unconstrained() {
    let dir = work_dir().join("driver-without-nvml");
    std::fs::create_dir_all(&dir).unwrap();
    let link = dir.join("libcuda.so.1");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(sim_library(), &link).unwrap();
    for p in [
        RUNTIME_13,
        Program::Driver(DriverPath::Link),
        Program::Driver(DriverPath::Gpa),
    ] {
        let what = format!("{p:?} without NVML");
        let plain = run3(p, &[("GPUSHIM_VISIBLE_DEVICES", "2,0")])
            .env("LD_LIBRARY_PATH", &dir)
            .arg("ids")
            .run();
        assert_quiet_view(&plain, &ALL, &format!("{what}, no shim"));

        let out = run3(p, &[("GPUSHIM_VISIBLE_DEVICES", "2,0")])
            .env("LD_LIBRARY_PATH", &dir)
            .arg("ids")
            .shim(true)
            .run();
        out.assert_completed();
        assert_eq!(out.num("init.rc"), 0, "{what}\n{}", out.dump());
        assert_view(&out, "", &[2, 0], &what);
        assert!(out.gpushim_lines().is_empty(), "{what}\n{}", out.dump());

        let pci = run3(p, &[("GPUSHIM_VISIBLE_DEVICES", "0000:20:00.0")])
            .env("LD_LIBRARY_PATH", &dir)
            .arg("ids")
            .shim(true)
            .run();
        pci.assert_completed();
        assert_eq!(pci.num("init.rc"), NOT_INITIALIZED, "{what}\n{}", pci.dump());
        let lines = pci.gpushim_lines();
        assert_eq!(lines.len(), 1, "{what}: one message\n{}", pci.dump());
        assert!(
            lines[0].starts_with("gpushim: GPUSHIM_VISIBLE_DEVICES=\"0000:20:00.0\": selecting by PCI bus id needs NVML"),
            "{what}\n{}",
            pci.dump()
        );

        let limited = run3(p, &[("GPUSHIM_MEMORY_LIMIT", "1GiB")])
            .env("LD_LIBRARY_PATH", &dir)
            .arg("ids")
            .shim(true)
            .run();
        assert_quiet_view(&limited, &ALL, &format!("{what}, a limit only"));
        for d in 0..3 {
            assert_eq!(
                limited.u64(&format!("dev{d}.total")),
                GIB,
                "{what}\n{}",
                limited.dump()
            );
        }
    }
}

/// A launcher under a view that gives each worker `CUDA_VISIBLE_DEVICES=<i>` hands the worker
/// device `<i>` of its own view, not of the machine.
#[test]
fn a_childs_cuda_visible_devices_narrows_the_parents_view() {
    if skip_unless_target_exec("a program of the target starts its children (spawn=)") {
        return;
    }
    for (child_cvd, want) in [("1", &[0u32][..]), ("1,0", &[0, 2][..]), ("GPU-3", &[2][..])] {
        let exe = program(RUNTIME_13).display().to_string();
        let spawn = format!("spawn=env CUDA_VISIBLE_DEVICES={child_cvd} {} ids", sh_quote(&exe));
        let out = run3(RUNTIME_12, &[("GPUSHIM_VISIBLE_DEVICES", "2,0")])
            .args(["ids".to_string(), spawn])
            .shim(true)
            .run();
        out.assert_completed();
        let what = format!("child CUDA_VISIBLE_DEVICES={child_cvd}");
        assert_view(&out, "", &[2, 0], &what);
        assert_eq!(out.num("op2.status"), 0, "{what}\n{}", out.dump());
        assert_view(&out, "op2.", want, &what);
        assert!(out.gpushim_lines().is_empty(), "{what}\n{}", out.dump());
    }
}
