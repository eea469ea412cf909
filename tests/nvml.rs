//! NVML under the shim: the devices NVML shows follow `GPUSHIM_VISIBLE_DEVICES` (count,
//! indices, handles by index / UUID / PCI bus id / serial) and its memory totals follow the
//! limits — for a C program linked with `-lnvidia-ml`, one that `dlopen`s
//! `libnvidia-ml.so.1`, a CUDA program that also asks NVML, and pynvml. The simulated NVML
//! (`sim/nvml`) ignores `CUDA_VISIBLE_DEVICES` and always lists every physical device, so every
//! case also runs without the shim (3 devices, physical order, 16 GiB each).

mod common;

use common::*;

/// NVML_ERROR_INVALID_ARGUMENT
const NVML_INVALID_ARGUMENT: i64 = 2;
/// NVML_ERROR_NOT_FOUND
const NVML_NOT_FOUND: i64 = 6;

const ALL: [u32; 3] = [0, 1, 2];

/// 3 physical devices of 16 GiB; `env` on top.
fn nvml_run(path: NvmlPath, env: &[(&str, &str)]) -> Run {
    nvml_sim_library();
    Run::program(Program::Nvml(path))
        .env("GPUSIM_DEVICES", "3")
        .env("GPUSIM_MEMORY", "16GiB")
        .envs(env)
}

/// Identity and memory of one NVML handle (`nvml_describe` keys under `p`) against physical
/// device `phys` with memory total `total`.
fn assert_handle(out: &RunOutput, p: &str, phys: u32, total: u64, what: &str) {
    let k = |f: &str| format!("{p}{f}");
    for rc in [
        "uuid.rc",
        "name.rc",
        "serial.rc",
        "pci.rc",
        "mem.rc",
        "mem2.rc",
    ] {
        out.assert_num(&k(rc), 0, what);
    }
    out.assert_str(&k("uuid"), &phys_uuid(phys), what);
    out.assert_str(&k("name"), &phys_name(phys), what);
    out.assert_str(&k("serial"), &format!("GPUSIM-{phys}"), what);
    out.assert_u64(&k("pcibus"), phys_bus(phys) as u64, what);
    let bus_tail = &phys_pci(phys)[4..]; // ":30:00.0"
    for key in ["pci", "pcilegacy"] {
        assert!(
            out.get(&k(key)).to_ascii_lowercase().ends_with(bus_tail),
            "{what}: {p}{key} must name bus {bus_tail}\n{}",
            out.dump()
        );
    }
    for (t, u, f) in [("total", "used", "free"), ("total2", "used2", "free2")] {
        let (tv, uv, fv) = (out.u64(&k(t)), out.u64(&k(u)), out.u64(&k(f)));
        assert_eq!(tv, total, "{what}: {p}{t}\n{}", out.dump());
        assert!(uv <= tv, "{what}: {p}{u} > {t}\n{}", out.dump());
        assert!(fv <= tv - uv, "{what}: {p}{f} > {t} - {u}\n{}", out.dump());
    }
}

/// The `list` output under `prefix`: count (v2 and v1) and each index against `want`
/// (physical device, memory total).
fn assert_nvml_view(out: &RunOutput, prefix: &str, want: &[(u32, u64)], what: &str) {
    let k = |f: &str| format!("{prefix}{f}");
    assert_eq!(
        out.num(&k("init.rc")),
        0,
        "{what}: nvmlInit\n{}",
        out.dump()
    );
    assert_eq!(out.num(&k("count.rc")), 0, "{what}\n{}", out.dump());
    let seen: Vec<String> = (0..out.u64(&k("count")))
        .map(|i| {
            out.kv
                .get(&k(&format!("idx{i}.uuid")))
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    let wanted: Vec<String> = want.iter().map(|&(p, _)| phys_uuid(p)).collect();
    assert_eq!(
        seen,
        wanted,
        "{what}: the devices NVML shows, by index\n{}",
        out.dump()
    );
    assert_eq!(
        out.u64(&k("count_v1")),
        want.len() as u64,
        "{what}: nvmlDeviceGetCount (v1)\n{}",
        out.dump()
    );
    for (i, &(p, total)) in want.iter().enumerate() {
        let ip = k(&format!("idx{i}."));
        assert_eq!(out.num(&format!("{ip}rc")), 0, "{what}\n{}", out.dump());
        assert_eq!(
            out.u64(&format!("{ip}index")),
            i as u64,
            "{what}: nvmlDeviceGetIndex of index {i}\n{}",
            out.dump()
        );
        assert_handle(out, &ip, p, total, what);
    }
}

fn same_total(view: &[u32], total: u64) -> Vec<(u32, u64)> {
    view.iter().map(|&p| (p, total)).collect()
}

// ---------------------------------------------------------------------------------------
// NVML alone
// ---------------------------------------------------------------------------------------

/// `2,0` + 4 GiB: index 0 is physical 2, index 1 physical 0; hidden physical 1 cannot be found
/// by UUID, PCI bus id (v1 and v2) or serial; physical 0's handle has index 1.
#[test]
fn nvml_follows_visible_devices() {
    let args = [
        "list".to_string(),
        format!("uuid={}", phys_uuid(0)),                // 2
        format!("uuid={}", phys_uuid(1)),                // 3: hidden
        "pci=0000:20:00.0".to_string(),                  // 4: hidden
        "pci=00000000:20:00.0".to_string(),              // 5: hidden
        "serial=GPUSIM-1".to_string(),                   // 6: hidden
        "pci=00000000:30:00.0".to_string(),              // 7
        "serial=GPUSIM-2".to_string(),                   // 8
        "index=2".to_string(),                           // 9: past the view
        format!("uuid={}", phys_uuid(2).to_uppercase()), // 10
        format!("uuidv={}", phys_uuid(1)), // 11: hidden, nvmlDeviceGetHandleByUUIDV (ASCII)
        format!("uuidvbin={}", phys_uuid(1)), // 12: hidden, nvmlDeviceGetHandleByUUIDV (binary)
        format!("uuidvbin={}", phys_uuid(0)), // 13
        "index1=1".to_string(),            // 14: v1 nvmlDeviceGetHandleByIndex
        "index1=2".to_string(),            // 15: past the view
    ];
    let env = [
        ("GPUSHIM_VISIBLE_DEVICES", "2,0"),
        ("GPUSHIM_MEMORY_LIMIT", "4GiB"),
    ];
    for path in NvmlPath::ALL {
        for shim in [false, true] {
            let what = format!("{path:?} shim={shim}");
            let out = nvml_run(path, &env).args(&args).shim(shim).run();
            out.assert_completed();
            let (view, total) = if shim {
                (&[2, 0][..], 4 * GIB)
            } else {
                (&ALL[..], 16 * GIB)
            };
            assert_nvml_view(&out, "", &same_total(view, total), &what);
            let index_of = |phys: u32| view.iter().position(|&p| p == phys).unwrap() as u64;
            // found: p0 by UUID, p2 by PCI id, serial and upper-case UUID
            let index1 = if shim { 0 } else { 1 }; // index 1: physical 0 with the shim
            for (op, phys) in [(2, 0), (7, 2), (8, 2), (10, 2), (13, 0), (14, index1)] {
                assert_eq!(
                    out.num(&format!("op{op}.rc")),
                    0,
                    "{what}: op{op}\n{}",
                    out.dump()
                );
                assert_eq!(
                    out.u64(&format!("op{op}.index")),
                    index_of(phys),
                    "{what}: nvmlDeviceGetIndex of physical {phys} (op{op})\n{}",
                    out.dump()
                );
                assert_handle(&out, &format!("op{op}."), phys, total, &what);
            }
            assert_eq!(out.num("op7.rc_v1"), 0, "{what}\n{}", out.dump());
            assert_eq!(
                out.num("op7.same_v1"),
                1,
                "{what}: v1 and v2 give one handle\n{}",
                out.dump()
            );
            if shim {
                for op in [3, 4, 5, 6, 11, 12] {
                    assert_eq!(
                        out.num(&format!("op{op}.rc")),
                        NVML_NOT_FOUND,
                        "{what}: hidden physical 1 (op{op} {})\n{}",
                        args[op - 1],
                        out.dump()
                    );
                }
                for op in [4, 5] {
                    assert_eq!(
                        out.num(&format!("op{op}.rc_v1")),
                        NVML_NOT_FOUND,
                        "{what}: v1, op{op}\n{}",
                        out.dump()
                    );
                }
                assert_eq!(
                    out.num("op9.rc"),
                    NVML_INVALID_ARGUMENT,
                    "{what}: index 2 of 2\n{}",
                    out.dump()
                );
                assert_eq!(
                    out.num("op15.rc"),
                    NVML_INVALID_ARGUMENT,
                    "{what}: v1 index 2 of 2\n{}",
                    out.dump()
                );
            } else {
                for op in [3, 4, 5, 6, 11, 12] {
                    assert_eq!(
                        out.num(&format!("op{op}.rc")),
                        0,
                        "{what}: op{op}\n{}",
                        out.dump()
                    );
                    assert_eq!(
                        out.u64(&format!("op{op}.index")),
                        1,
                        "{what}: op{op}\n{}",
                        out.dump()
                    );
                }
                for op in [9, 15] {
                    assert_eq!(
                        out.num(&format!("op{op}.rc")),
                        0,
                        "{what}: op{op}\n{}",
                        out.dump()
                    );
                    assert_handle(&out, &format!("op{op}."), 2, total, &what);
                }
                assert!(out.gpushim_lines().is_empty(), "{what}\n{}", out.dump());
            }
            assert_eq!(out.num("shutdown.rc"), 0, "{what}\n{}", out.dump());
        }
    }
}

/// Memory totals: a fraction, per-device limits by the program's ordinals, no limit at all,
/// and limits without hiding (all 3 devices, physical order, totals = the limit).
#[test]
fn nvml_totals_follow_the_limits() {
    let cases: &[(&[(&str, &str)], &[(u32, u64)])] = &[
        (
            &[
                ("GPUSHIM_VISIBLE_DEVICES", "2,0"),
                ("GPUSHIM_MEMORY_LIMIT", "25%"),
            ],
            &[(2, 4 * GIB), (0, 4 * GIB)],
        ),
        (
            &[("GPUSHIM_VISIBLE_DEVICES", "2,0")],
            &[(2, 16 * GIB), (0, 16 * GIB)],
        ),
        (
            &[
                ("GPUSHIM_VISIBLE_DEVICES", "2,0"),
                ("GPUSHIM_MEMORY_LIMIT", "4GiB"),
                ("GPUSHIM_MEMORY_LIMIT_1", "1GiB"),
            ],
            &[(2, 4 * GIB), (0, GIB)],
        ),
        (
            &[("GPUSHIM_MEMORY_LIMIT", "4GiB")],
            &[(0, 4 * GIB), (1, 4 * GIB), (2, 4 * GIB)],
        ),
        (
            &[
                ("GPUSHIM_MEMORY_LIMIT", "0.25"),
                ("GPUSHIM_MEMORY_LIMIT_2", "2GiB"),
            ],
            &[(0, 4 * GIB), (1, 4 * GIB), (2, 2 * GIB)],
        ),
        (
            &[("GPUSHIM_MEMORY_LIMIT", "64GiB")],
            &[(0, 16 * GIB), (1, 16 * GIB), (2, 16 * GIB)],
        ),
    ];
    for path in NvmlPath::ALL {
        for (env, want) in cases {
            for shim in [false, true] {
                let what = format!("{path:?} shim={shim} {env:?}");
                let out = nvml_run(path, env).arg("list").shim(shim).run();
                out.assert_completed();
                let plain = same_total(&ALL, 16 * GIB);
                assert_nvml_view(&out, "", if shim { want } else { &plain }, &what);
                assert!(out.gpushim_lines().is_empty(), "{what}\n{}", out.dump());
            }
        }
    }
}

/// With `CUDA_VISIBLE_DEVICES` composed with `GPUSHIM_VISIBLE_DEVICES`, NVML shows the view the
/// shim applied. Without the shim NVML ignores `CUDA_VISIBLE_DEVICES`.
#[test]
fn nvml_follows_cuda_visible_devices_too() {
    let cases: &[(&[(&str, &str)], &[(u32, u64)])] = &[
        (
            &[
                ("CUDA_VISIBLE_DEVICES", "1,2"),
                ("GPUSHIM_VISIBLE_DEVICES", "1,0"),
            ],
            &[(2, 16 * GIB), (1, 16 * GIB)],
        ),
        (
            &[
                ("CUDA_VISIBLE_DEVICES", "GPU-30,GPU-10"),
                ("GPUSHIM_VISIBLE_DEVICES", "1"),
                ("GPUSHIM_MEMORY_LIMIT", "4GiB"),
            ],
            &[(0, 4 * GIB)],
        ),
    ];
    for path in NvmlPath::ALL {
        for (env, want) in cases {
            for shim in [false, true] {
                let what = format!("{path:?} shim={shim} {env:?}");
                let out = nvml_run(path, env)
                    .args(["list".to_string(), format!("uuid={}", phys_uuid(want[0].0))])
                    .shim(shim)
                    .run();
                out.assert_completed();
                let plain = same_total(&ALL, 16 * GIB);
                assert_nvml_view(&out, "", if shim { want } else { &plain }, &what);
                assert_eq!(out.num("op2.rc"), 0, "{what}\n{}", out.dump());
                let index = if shim { 0 } else { want[0].0 as u64 };
                assert_eq!(out.u64("op2.index"), index, "{what}\n{}", out.dump());
                assert!(out.gpushim_lines().is_empty(), "{what}\n{}", out.dump());
            }
        }
    }
}

/// A plain `CUDA_VISIBLE_DEVICES` (no `GPUSHIM_VISIBLE_DEVICES`) is not applied to NVML — it
/// shows every device, as the real NVML does, because programs such as PyTorch apply
/// `CUDA_VISIBLE_DEVICES` to NVML themselves — but each GPU's memory total is the limit of its
/// CUDA ordinal: with `CUDA_VISIBLE_DEVICES=2,0`, `GPUSHIM_MEMORY_LIMIT_0` is physical 2's.
/// A GPU CUDA does not show (physical 1) keeps its physical total.
#[test]
fn plain_cuda_visible_devices_limits_by_cuda_ordinal_in_nvml() {
    let env: &[(&str, &str)] = &[("CUDA_VISIBLE_DEVICES", "2,0"), ("GPUSHIM_MEMORY_LIMIT_0", "1GiB")];
    for path in NvmlPath::ALL {
        for shim in [false, true] {
            let what = format!("{path:?} shim={shim} {env:?}");
            let out = nvml_run(path, env).args(["list"]).shim(shim).run();
            out.assert_completed();
            let want: &[(u32, u64)] = if shim {
                &[(0, 16 * GIB), (1, 16 * GIB), (2, GIB)]
            } else {
                &[(0, 16 * GIB), (1, 16 * GIB), (2, 16 * GIB)]
            };
            assert_nvml_view(&out, "", want, &what);
            assert!(out.gpushim_lines().is_empty(), "{what}\n{}", out.dump());
        }
    }
}

/// `GPUSHIM_DISABLE=1`: NVML untouched, whatever else is set.
#[test]
fn nvml_untouched_when_disabled() {
    for path in NvmlPath::ALL {
        let out = nvml_run(
            path,
            &[
                ("GPUSHIM_DISABLE", "1"),
                ("GPUSHIM_VISIBLE_DEVICES", "2,0"),
                ("GPUSHIM_MEMORY_LIMIT", "4GiB"),
            ],
        )
        .args(["list".to_string(), format!("uuid={}", phys_uuid(1))])
        .shim(true)
        .run();
        out.assert_completed();
        assert_nvml_view(
            &out,
            "",
            &same_total(&ALL, 16 * GIB),
            &format!("{path:?} disabled"),
        );
        assert_eq!(out.num("op2.rc"), 0, "{path:?}\n{}", out.dump());
        assert!(out.gpushim_lines().is_empty(), "{path:?}\n{}", out.dump());
    }
}

/// `none`: NVML shows no device (or refuses to initialise); never a device CUDA cannot see.
#[test]
fn nvml_with_no_visible_device() {
    for path in NvmlPath::ALL {
        let out = nvml_run(path, &[("GPUSHIM_VISIBLE_DEVICES", "none")])
            .args(["list", "index=0", "serial=GPUSIM-0"])
            .shim(true)
            .run();
        out.assert_completed();
        if out.num("init.rc") == 0 {
            assert_eq!(out.u64("count"), 0, "{path:?}\n{}", out.dump());
            assert_eq!(out.u64("count_v1"), 0, "{path:?}\n{}", out.dump());
            assert_eq!(
                out.num("op2.rc"),
                NVML_INVALID_ARGUMENT,
                "{path:?}: index 0\n{}",
                out.dump()
            );
            assert_eq!(
                out.num("op3.rc"),
                NVML_NOT_FOUND,
                "{path:?}: serial\n{}",
                out.dump()
            );
        }
        let plain = nvml_run(path, &[("GPUSHIM_VISIBLE_DEVICES", "none")])
            .arg("list")
            .run();
        plain.assert_completed();
        assert_nvml_view(
            &plain,
            "",
            &same_total(&ALL, 16 * GIB),
            &format!("{path:?} without the shim"),
        );
    }
}

// ---------------------------------------------------------------------------------------
// A CUDA program that also asks NVML
// ---------------------------------------------------------------------------------------

/// After cudaMalloc of 1 GiB on program device 0 (physical 2), NVML index 0 reports it used,
/// with the limit as total; index 1 (physical 0) holds nothing.
#[test]
fn nvml_in_a_cuda_program_sees_its_allocations() {
    nvml_sim_library();
    let env = [
        ("GPUSHIM_VISIBLE_DEVICES", "2,0"),
        ("GPUSHIM_MEMORY_LIMIT", "4GiB"),
    ];
    for major in [12, 13] {
        let p = Program::Runtime { major, ptsz: false };
        for shim in [false, true] {
            let what = format!("cudart {major} shim={shim}");
            let out = Run::program(p)
                .env("GPUSIM_DEVICES", "3")
                .env("GPUSIM_MEMORY", "16GiB")
                .envs(&env)
                .args([
                    format!("alloc=malloc:{GIB}"),
                    "nvml".to_string(),
                    "free=1".to_string(),
                    "nvml".to_string(),
                ])
                .shim(shim)
                .run();
            out.assert_completed();
            assert_eq!(out.num("op1.rc"), 0, "{what}\n{}", out.dump());
            let (view, total) = if shim {
                (&[2, 0][..], 4 * GIB)
            } else {
                (&ALL[..], 16 * GIB)
            };
            assert_eq!(
                out.u64("count"),
                view.len() as u64,
                "{what}: CUDA's count\n{}",
                out.dump()
            );
            for op in [2, 4] {
                assert_nvml_view(&out, &format!("op{op}."), &same_total(view, total), &what);
            }
            assert!(
                out.u64("op2.idx0.used") >= GIB,
                "{what}: NVML used of index 0 after 1 GiB\n{}",
                out.dump()
            );
            assert!(
                out.u64("op2.idx0.used2") >= GIB,
                "{what}: v2\n{}",
                out.dump()
            );
            assert!(
                out.u64("op2.idx1.used") < GIB,
                "{what}: index 1 holds nothing\n{}",
                out.dump()
            );
            assert!(
                out.u64("op4.idx0.used") < GIB,
                "{what}: after the free\n{}",
                out.dump()
            );
            if !shim {
                assert!(out.gpushim_lines().is_empty(), "{what}\n{}", out.dump());
            }
            assert_eq!(out.num("cleanup.failures"), 0, "{what}\n{}", out.dump());
        }
    }
}

// ---------------------------------------------------------------------------------------
// pynvml
// ---------------------------------------------------------------------------------------

#[test]
fn pynvml_follows_visible_devices() {
    if skip_emulated("runs python3 (pynvml), a host program, with the target's library") {
        return;
    }
    nvml_sim_library();
    let lookups = [
        format!("uuid={}", phys_uuid(0)),   // 1
        format!("uuid={}", phys_uuid(1)),   // 2: hidden
        "pci=0000:20:00.0".to_string(),     // 3: hidden
        "serial=GPUSIM-1".to_string(),      // 4: hidden
        "pci=00000000:30:00.0".to_string(), // 5
    ];
    let cases: &[(&[(&str, &str)], &[(u32, u64)])] = &[
        (
            &[
                ("GPUSHIM_VISIBLE_DEVICES", "2,0"),
                ("GPUSHIM_MEMORY_LIMIT", "4GiB"),
            ],
            &[(2, 4 * GIB), (0, 4 * GIB)],
        ),
        (
            &[
                ("GPUSHIM_VISIBLE_DEVICES", "2,0"),
                ("GPUSHIM_MEMORY_LIMIT", "25%"),
            ],
            &[(2, 4 * GIB), (0, 4 * GIB)],
        ),
        (
            &[("GPUSHIM_MEMORY_LIMIT", "4GiB")],
            &[(0, 4 * GIB), (1, 4 * GIB), (2, 4 * GIB)],
        ),
    ];
    for (env, want) in cases {
        for shim in [false, true] {
            let what = format!("pynvml shim={shim} {env:?}");
            let out = python_run(PYNVML_LIST)
                .args(&lookups)
                .env("GPUSIM_DEVICES", "3")
                .env("GPUSIM_MEMORY", "16GiB")
                .envs(*env)
                .shim(shim)
                .run();
            out.assert_completed();
            let plain = same_total(&ALL, 16 * GIB);
            let want = if shim { *want } else { &plain[..] };
            assert_eq!(
                out.u64("count"),
                want.len() as u64,
                "{what}\n{}",
                out.dump()
            );
            for (i, &(p, total)) in want.iter().enumerate() {
                let k = |f: &str| format!("idx{i}.{f}");
                out.assert_str(&k("uuid"), &phys_uuid(p), &what);
                out.assert_str(&k("name"), &phys_name(p), &what);
                out.assert_u64(&k("index"), i as u64, &what);
                assert!(
                    out.get(&k("pci"))
                        .to_ascii_lowercase()
                        .ends_with(&phys_pci(p)[4..]),
                    "{what}: PCI bus id of index {i}\n{}",
                    out.dump()
                );
                let mut triples = vec![("total", "used", "free")];
                if !out.kv.contains_key(&k("v2")) {
                    triples.push(("total2", "used2", "free2"));
                }
                for (t, u, f) in triples {
                    let (tv, uv, fv) = (out.u64(&k(t)), out.u64(&k(u)), out.u64(&k(f)));
                    assert_eq!(tv, total, "{what}: {t} of index {i}\n{}", out.dump());
                    assert!(
                        uv <= tv && fv <= tv - uv,
                        "{what}: {u}/{f} of index {i}\n{}",
                        out.dump()
                    );
                }
            }
            let hidden = shim && want.len() == 2;
            let index_of = |phys: u32| want.iter().position(|&(p, _)| p == phys).unwrap() as u64;
            for (op, phys) in [(1, 0), (5, 2)] {
                assert_eq!(
                    out.num(&format!("op{op}.rc")),
                    0,
                    "{what}: op{op}\n{}",
                    out.dump()
                );
                assert_eq!(
                    out.u64(&format!("op{op}.index")),
                    index_of(phys),
                    "{what}: op{op}\n{}",
                    out.dump()
                );
            }
            for op in [2, 3, 4] {
                let rc = out.num(&format!("op{op}.rc"));
                if hidden {
                    assert_eq!(
                        rc,
                        NVML_NOT_FOUND,
                        "{what}: hidden physical 1 ({})\n{}",
                        lookups[op - 1],
                        out.dump()
                    );
                } else {
                    assert_eq!(rc, 0, "{what}: op{op}\n{}", out.dump());
                    assert_eq!(
                        out.u64(&format!("op{op}.index")),
                        1,
                        "{what}: op{op}\n{}",
                        out.dump()
                    );
                }
            }
            assert!(out.gpushim_lines().is_empty(), "{what}\n{}", out.dump());
        }
    }
}

/// The compute processes of a device: this process once its simulated driver has a context
/// there (the primary context retained), with what it allocated, and no longer after the last
/// release; never on another device; the count protocol of the real NVML (a count of 0 asks).
#[test]
fn compute_processes_list_this_process_while_it_has_a_context() {
    if skip_emulated("runs python3 (ctypes), a host program, with the target's library") {
        return;
    }
    const SCRIPT: &str = r#"
import ctypes, os
import pynvml as n
cuda = ctypes.CDLL("libcuda.so.1")
n.nvmlInit()
hs = [n.nvmlDeviceGetHandleByIndex(i) for i in range(2)]
def show(tag):
    for i, h in enumerate(hs):
        procs = n.nvmlDeviceGetComputeRunningProcesses(h)
        print(f"{tag}.d{i}=" + ",".join(f"{p.pid == os.getpid()}:{p.usedGpuMemory}" for p in procs))
    count = ctypes.c_uint(0)
    rc = n.nvmlLib.nvmlDeviceGetComputeRunningProcesses_v3(hs[1], ctypes.byref(count), None)
    print(f"{tag}.ask={rc}:{count.value}")
print("init=%d" % cuda.cuInit(0))
show("before")
ctx = ctypes.c_void_p()
print("retain=%d" % cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 1))
print("current=%d" % cuda.cuCtxSetCurrent(ctx))
ptr = ctypes.c_uint64()
print("alloc=%d" % cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(3 << 20)))
show("with")
print("release=%d" % cuda.cuDevicePrimaryCtxRelease_v2(1))
show("after")
print("done=1")
"#;
    let out = python_run(SCRIPT).env("GPUSIM_DEVICES", "2").run();
    out.assert_completed();
    for k in ["init", "retain", "current", "alloc", "release"] {
        out.assert_num(k, 0, k);
    }
    out.assert_str("before.d0", "", "no context yet");
    out.assert_str("before.d1", "", "no context yet");
    out.assert_str("before.ask", "0:0", "no process: SUCCESS, count 0");
    out.assert_str("with.d0", "", "no context on device 0");
    out.assert_str("with.d1", &format!("True:{}", 3 * MIB), "this process, its bytes");
    out.assert_str("with.ask", "7:1", "count 0 asks: INSUFFICIENT_SIZE, 1 needed");
    out.assert_str("after.d1", "", "the last release ends the context");
}
