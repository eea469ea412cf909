//! NVML under `GPUSHIM_VIRTUAL_DEVICES`: a split GPU is several NVML devices, each with its own
//! index, handle, derived UUID and memory total (its size, or its limit), while every other
//! property (name, PCI info, temperature, utilisation, P2P status …) is its GPU's — for a C
//! program linked with `-lnvidia-ml`, one that `dlopen`s `libnvidia-ml.so.1`, pynvml, and a CUDA
//! program that also asks NVML. The simulated NVML rejects any handle it did not hand out
//! (`NVML_ERROR_INVALID_ARGUMENT`), so a virtual device's handle reaching it untranslated fails
//! the call. Every case also runs without the shim (2 GPUs of 16 GiB, as NVML lists them).

mod common;

use common::*;

const NVML_INVALID_ARGUMENT: i64 = 2;
const NVML_NOT_FOUND: i64 = 6;
/// `NVML_P2P_STATUS_NOT_SUPPORTED`, the simulator's answer for a GPU and itself.
const P2P_NOT_SUPPORTED: i64 = 5;
/// `NVML_TOPOLOGY_HOSTBRIDGE` between two simulated GPUs; `NVML_TOPOLOGY_INTERNAL` (0) for one.
const TOPOLOGY_HOSTBRIDGE: i64 = 30;

/// One device NVML shows: its physical GPU, its UUID and its memory total.
#[derive(Clone, Debug)]
struct Shown {
    phys: u32,
    uuid: String,
    total: u64,
}

fn whole(phys: u32, total: u64) -> Shown {
    Shown { phys, uuid: phys_uuid(phys), total }
}

fn part(phys: u32, index: u32, total: u64) -> Shown {
    Shown { phys, uuid: part_uuid(phys, index), total }
}

/// 2 physical devices of 16 GiB; `env` on top.
fn nvml_run(path: NvmlPath, env: &[(&str, &str)]) -> Run {
    nvml_sim_library();
    Run::program(Program::Nvml(path)).env("GPUSIM_DEVICES", "2").env("GPUSIM_MEMORY", "16GiB").envs(env)
}

/// One handle (`nvml_describe` keys under `p`) against `want`; NVML's program index `index`.
fn assert_handle(out: &RunOutput, p: &str, want: &Shown, index: usize, what: &str) {
    let k = |f: &str| format!("{p}{f}");
    for rc in ["index.rc", "uuid.rc", "name.rc", "serial.rc", "pci.rc", "mem.rc", "mem2.rc"] {
        assert_eq!(out.num(&k(rc)), 0, "{what}: {p}{rc}\n{}", out.dump());
    }
    assert_eq!(out.u64(&k("index")), index as u64, "{what}: {p}index\n{}", out.dump());
    assert_eq!(out.get(&k("uuid")), want.uuid, "{what}: {p}uuid\n{}", out.dump());
    assert_eq!(out.get(&k("name")), phys_name(want.phys), "{what}: {p}name\n{}", out.dump());
    assert_eq!(out.get(&k("serial")), format!("GPUSIM-{}", want.phys), "{what}: {p}serial\n{}", out.dump());
    assert_eq!(out.u64(&k("pcibus")), phys_bus(want.phys) as u64, "{what}: {p}pcibus\n{}", out.dump());
    assert_eq!(
        out.get(&k("pci")),
        format!("00000000:{:02X}:00.0", phys_bus(want.phys)),
        "{what}: {p}pci\n{}",
        out.dump()
    );
    // NVML alone: nothing is allocated, so the whole total is free.
    for (t, u, f) in [("total", "used", "free"), ("total2", "used2", "free2")] {
        assert_eq!(out.u64(&k(t)), want.total, "{what}: {p}{t}\n{}", out.dump());
        assert_eq!(out.u64(&k(u)), 0, "{what}: {p}{u}\n{}", out.dump());
        assert_eq!(out.u64(&k(f)), want.total, "{what}: {p}{f}\n{}", out.dump());
    }
}

/// The `list` output against `want`, in order.
fn assert_list(out: &RunOutput, want: &[Shown], what: &str) {
    assert_eq!(out.num("init.rc"), 0, "{what}\n{}", out.dump());
    assert_eq!(out.u64("count"), want.len() as u64, "{what}: nvmlDeviceGetCount_v2\n{}", out.dump());
    assert_eq!(out.u64("count_v1"), want.len() as u64, "{what}: nvmlDeviceGetCount\n{}", out.dump());
    for (i, w) in want.iter().enumerate() {
        assert_eq!(out.num(&format!("idx{i}.rc")), 0, "{what}\n{}", out.dump());
        assert_handle(out, &format!("idx{i}."), w, i, what);
    }
}

/// `0:2x4GiB`: NVML shows part 0 and part 1 of GPU 0 (4 GiB each, derived UUIDs, GPU 0's name,
/// serial and PCI id), then GPU 1; unhooked functions given a part's handle answer for GPU 0,
/// two-device functions see two parts of one GPU as that GPU with itself; a split GPU is found
/// by PCI bus id and serial as its first part, its parts by their UUIDs (string, `UUIDV` ASCII
/// and binary), and its own UUID names no device.
#[test]
fn nvml_shows_the_parts_of_a_split_gpu() {
    let args = [
        "list".to_string(),                         // 1
        "extra=0".to_string(),                      // 2
        "extra=1".to_string(),                      // 3
        "extra=2".to_string(),                      // 4
        "pair=0,1".to_string(),                     // 5
        "pair=0,2".to_string(),                     // 6
        "pair=2,1".to_string(),                     // 7
        "pci=00000000:10:00.0".to_string(),         // 8
        "serial=GPUSIM-0".to_string(),              // 9
        format!("uuid={}", phys_uuid(0)),           // 10
        format!("uuid={}", part_uuid(0, 1)),        // 11
        format!("uuidv={}", part_uuid(0, 1)),       // 12
        format!("uuidvbin={}", part_uuid(0, 0)),    // 13
        "index1=1".to_string(),                     // 14
        format!("uuid={}", phys_uuid(1)),           // 15
        "pci=0000:20:00.0".to_string(),             // 16
        "index=3".to_string(),                      // 17
        format!("uuid={}", part_uuid(0, 1).to_uppercase()), // 18
        format!("uuidvbin={}", phys_uuid(0)),       // 19
    ];
    let env = [("GPUSHIM_VIRTUAL_DEVICES", "0:2x4GiB")];
    for path in NvmlPath::ALL {
        for shim in [false, true] {
            let what = format!("{path:?} shim={shim}");
            let out = nvml_run(path, &env).args(&args).shim(shim).run();
            out.assert_completed();
            let want = if shim {
                vec![part(0, 0, 4 * GIB), part(0, 1, 4 * GIB), whole(1, 16 * GIB)]
            } else {
                vec![whole(0, 16 * GIB), whole(1, 16 * GIB)]
            };
            assert_list(&out, &want, &what);

            // Functions the shim does not hook, on each device.
            for (op, i) in [(2, 0), (3, 1), (4, 2)] {
                let k = |f: &str| format!("op{op}.{f}");
                let Some(w) = want.get(i) else {
                    assert_eq!(out.num(&k("rc")), NVML_INVALID_ARGUMENT, "{what}: index {i}\n{}", out.dump());
                    continue;
                };
                for rc in ["rc", "temp.rc", "util.rc", "power.rc", "minor.rc"] {
                    assert_eq!(out.num(&k(rc)), 0, "{what}: index {i} {rc}\n{}", out.dump());
                }
                assert_eq!(out.u64(&k("temp")), 40, "{what}: index {i}\n{}", out.dump());
                assert_eq!(out.u64(&k("util.gpu")), 0, "{what}: index {i}\n{}", out.dump());
                assert_eq!(out.u64(&k("util.mem")), 0, "{what}: index {i}\n{}", out.dump());
                assert_eq!(out.u64(&k("power")), 75000, "{what}: index {i}\n{}", out.dump());
                assert_eq!(out.u64(&k("minor")), w.phys as u64, "{what}: index {i}: the GPU's minor number\n{}", out.dump());
            }

            // Two-device functions: (op, indices) -> whether both are one GPU.
            for (op, pair) in [(5, (0, 1)), (6, (0, 2)), (7, (2, 1))] {
                let k = |f: &str| format!("op{op}.{f}");
                let (Some(a), Some(b)) = (want.get(pair.0), want.get(pair.1)) else {
                    assert_eq!(out.num(&k("rc")), NVML_INVALID_ARGUMENT, "{what}: pair {pair:?}\n{}", out.dump());
                    continue;
                };
                for rc in ["rc", "p2p.rc", "board.rc", "ancestor.rc"] {
                    assert_eq!(out.num(&k(rc)), 0, "{what}: pair {pair:?} {rc}\n{}", out.dump());
                }
                let same = a.phys == b.phys;
                assert_eq!(out.num(&k("p2p")), if same { P2P_NOT_SUPPORTED } else { 0 }, "{what}: pair {pair:?}\n{}", out.dump());
                assert_eq!(out.num(&k("board")), same as i64, "{what}: pair {pair:?}\n{}", out.dump());
                assert_eq!(out.num(&k("ancestor")), if same { 0 } else { TOPOLOGY_HOSTBRIDGE }, "{what}: pair {pair:?}\n{}", out.dump());
            }

            // Lookups: op -> the index found (None: NOT_FOUND), with and without the shim.
            let found: &[(usize, Option<usize>)] = if shim {
                &[(8, Some(0)), (9, Some(0)), (10, None), (11, Some(1)), (12, Some(1)), (13, Some(0)), (14, Some(1)), (15, Some(2)), (16, Some(2)), (18, Some(1)), (19, None)]
            } else {
                &[(8, Some(0)), (9, Some(0)), (10, Some(0)), (11, None), (12, None), (13, None), (14, Some(1)), (15, Some(1)), (16, Some(1)), (18, None), (19, Some(0))]
            };
            for &(op, index) in found {
                let p = format!("op{op}.");
                match index {
                    Some(i) => {
                        assert_eq!(out.num(&format!("{p}rc")), 0, "{what}: {}\n{}", args[op - 1], out.dump());
                        assert_handle(&out, &p, &want[i], i, &format!("{what}: {}", args[op - 1]));
                    }
                    None => assert_eq!(out.num(&format!("{p}rc")), NVML_NOT_FOUND, "{what}: {}\n{}", args[op - 1], out.dump()),
                }
            }
            assert_eq!(out.num("op8.rc_v1"), 0, "{what}\n{}", out.dump());
            assert_eq!(out.num("op8.same_v1"), 1, "{what}: v1 and v2 give one handle\n{}", out.dump());
            assert_eq!(out.num("op17.rc"), NVML_INVALID_ARGUMENT, "{what}: index 3\n{}", out.dump());
            assert_eq!(out.num("shutdown.rc"), 0, "{what}\n{}", out.dump());
            assert!(out.gpushim_lines().is_empty(), "{what}\n{}", out.dump());
        }
    }
}

/// Memory totals of parts: a part's size, its own limit by program ordinal (`_1` is part 1), a
/// fraction of its size; unequal sizes; the second GPU split, GPU 0 whole; a split composed with
/// `GPUSHIM_VISIBLE_DEVICES` (the selector names a device of the view).
#[test]
fn nvml_part_totals_follow_sizes_and_limits() {
    type Case<'a> = (Vec<(&'a str, &'a str)>, Vec<Shown>);
    let cases: Vec<Case> = vec![
        (
            vec![("GPUSHIM_VIRTUAL_DEVICES", "0:2x4GiB"), ("GPUSHIM_MEMORY_LIMIT", "50%"), ("GPUSHIM_MEMORY_LIMIT_1", "1GiB")],
            vec![part(0, 0, 2 * GIB), part(0, 1, GIB), whole(1, 8 * GIB)],
        ),
        (
            vec![("GPUSHIM_VIRTUAL_DEVICES", "0:3GiB,5GiB"), ("GPUSHIM_MEMORY_LIMIT_2", "6GiB")],
            vec![part(0, 0, 3 * GIB), part(0, 1, 5 * GIB), whole(1, 6 * GIB)],
        ),
        (
            vec![("GPUSHIM_VIRTUAL_DEVICES", "1:3x2GiB"), ("GPUSHIM_MEMORY_LIMIT_3", "64GiB")],
            vec![whole(0, 16 * GIB), part(1, 0, 2 * GIB), part(1, 1, 2 * GIB), part(1, 2, 2 * GIB)],
        ),
        (
            vec![("GPUSHIM_VISIBLE_DEVICES", "1,0"), ("GPUSHIM_VIRTUAL_DEVICES", "0:8GiB,8GiB")],
            vec![part(1, 0, 8 * GIB), part(1, 1, 8 * GIB), whole(0, 16 * GIB)],
        ),
    ];
    for path in NvmlPath::ALL {
        for (env, want) in &cases {
            for shim in [false, true] {
                let what = format!("{path:?} shim={shim} {env:?}");
                let out = nvml_run(path, env).arg("list").shim(shim).run();
                out.assert_completed();
                let plain = vec![whole(0, 16 * GIB), whole(1, 16 * GIB)];
                assert_list(&out, if shim { want } else { &plain }, &what);
                assert!(out.gpushim_lines().is_empty(), "{what}\n{}", out.dump());
            }
        }
    }
}

/// What `dlsym(libnvidia-ml.so.1, name)` answers: NVML's own function unless devices are split
/// (nothing changes for a program that does not split), the shim's trampoline while they are —
/// for an unhooked function (`nvmlDeviceGetName`) and for
/// `nvmlDeviceGetUUID`, hooked only while splitting. A name NVML lacks stays missing.
#[test]
fn nvml_functions_are_wrapped_only_while_splitting() {
    let names = ["nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetNoSuchThing", "nvmlSystemGetDriverVersion"];
    let args: Vec<String> = names.iter().map(|n| format!("where={n}")).collect();
    let cases: [(&[(&str, &str)], bool); 3] = [
        (&[("GPUSHIM_VIRTUAL_DEVICES", "0:2x4GiB")], true),
        (&[("GPUSHIM_MEMORY_LIMIT", "4GiB")], false),
        (&[("GPUSHIM_VIRTUAL_DEVICES", "0:2x4GiB"), ("GPUSHIM_DISABLE", "1")], false),
    ];
    for path in NvmlPath::ALL {
        for (env, split) in cases {
            for shim in [false, true] {
                let what = format!("{path:?} shim={shim} {env:?}");
                let out = nvml_run(path, env).arg("list").args(&args).shim(shim).run();
                out.assert_completed();
                let wrapped = shim && split;
                for (i, name) in names.iter().enumerate() {
                    let want = match *name {
                        "nvmlDeviceGetNoSuchThing" => "none",
                        "nvmlDeviceGetName" | "nvmlDeviceGetUUID" if wrapped => "libgpushim.so",
                        _ => "libnvidia-ml.so.1",
                    };
                    assert_eq!(out.get(&format!("op{}.where", i + 2)), want, "{what}: {name}\n{}", out.dump());
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// A CUDA program that also asks NVML
// ---------------------------------------------------------------------------------------

/// 3 GiB allocated on program device 0 and 3 GiB on device 1. With the shim both are parts of
/// GPU 0 (4 GiB each): NVML cannot tell which part used what, so each part shows its GPU's 6 GiB
/// of use capped at its total (4 GiB used, 0 free); GPU 1 holds nothing. Without the shim the
/// devices are GPUs 0 and 1, 3 GiB used on each.
#[test]
fn nvml_parts_show_their_gpu_use_capped_at_their_total() {
    nvml_sim_library();
    for major in [12, 13] {
        for shim in [false, true] {
            let what = format!("cudart {major} shim={shim}");
            let out = Run::program(Program::Runtime { major, ptsz: false })
                .env("GPUSIM_DEVICES", "2")
                .env("GPUSIM_MEMORY", "16GiB")
                .env("GPUSHIM_VIRTUAL_DEVICES", "0:2x4GiB")
                .args(["dev=0".to_string(), format!("alloc=malloc:{}", 3 * GIB), "dev=1".into(), format!("alloc=malloc:{}", 3 * GIB), "nvml".into()])
                .shim(shim)
                .run();
            out.assert_completed();
            assert_eq!(out.num("op2.rc"), 0, "{what}\n{}", out.dump());
            assert_eq!(out.num("op4.rc"), 0, "{what}\n{}", out.dump());
            let p = "op5.";
            // (uuid, total, used, free) by NVML index
            let want: Vec<(String, u64, u64, u64)> = if shim {
                vec![(part_uuid(0, 0), 4 * GIB, 4 * GIB, 0), (part_uuid(0, 1), 4 * GIB, 4 * GIB, 0), (phys_uuid(1), 16 * GIB, 0, 16 * GIB)]
            } else {
                vec![(phys_uuid(0), 16 * GIB, 3 * GIB, 13 * GIB), (phys_uuid(1), 16 * GIB, 3 * GIB, 13 * GIB)]
            };
            assert_eq!(out.u64(&format!("{p}count")), want.len() as u64, "{what}\n{}", out.dump());
            for (i, (uuid, total, used, free)) in want.iter().enumerate() {
                let k = |f: &str| format!("{p}idx{i}.{f}");
                assert_eq!(out.get(&k("uuid")), uuid, "{what}: index {i}\n{}", out.dump());
                assert_eq!(out.u64(&k("index")), i as u64, "{what}: index {i}\n{}", out.dump());
                for (t, u, f) in [("total", "used", "free"), ("total2", "used2", "free2")] {
                    assert_eq!(out.u64(&k(t)), *total, "{what}: index {i} {t}\n{}", out.dump());
                    assert_eq!(out.u64(&k(u)), *used, "{what}: index {i} {u}\n{}", out.dump());
                    assert_eq!(out.u64(&k(f)), *free, "{what}: index {i} {f}\n{}", out.dump());
                }
            }
            assert_eq!(out.num("cleanup.failures"), 0, "{what}\n{}", out.dump());
        }
    }
}

// ---------------------------------------------------------------------------------------
// pynvml
// ---------------------------------------------------------------------------------------

#[test]
fn pynvml_shows_the_parts_of_a_split_gpu() {
    if skip_emulated("runs python3 (pynvml), a host program, with the target's library") {
        return;
    }
    nvml_sim_library();
    let lookups = [
        format!("uuid={}", part_uuid(0, 1)), // 1
        format!("uuid={}", phys_uuid(0)),    // 2: the split GPU's own UUID
        "pci=00000000:10:00.0".to_string(),  // 3
        "serial=GPUSIM-1".to_string(),       // 4
    ];
    for shim in [false, true] {
        let what = format!("pynvml shim={shim}");
        let out = python_run(PYNVML_LIST)
            .args(&lookups)
            .env("GPUSIM_DEVICES", "2")
            .env("GPUSIM_MEMORY", "16GiB")
            .env("GPUSHIM_VIRTUAL_DEVICES", "0:2x4GiB")
            .shim(shim)
            .run();
        out.assert_completed();
        let want = if shim {
            vec![part(0, 0, 4 * GIB), part(0, 1, 4 * GIB), whole(1, 16 * GIB)]
        } else {
            vec![whole(0, 16 * GIB), whole(1, 16 * GIB)]
        };
        assert_eq!(out.u64("count"), want.len() as u64, "{what}\n{}", out.dump());
        for (i, w) in want.iter().enumerate() {
            let k = |f: &str| format!("idx{i}.{f}");
            assert_eq!(out.get(&k("uuid")), w.uuid, "{what}: index {i}\n{}", out.dump());
            assert_eq!(out.get(&k("name")), phys_name(w.phys), "{what}: index {i}\n{}", out.dump());
            assert_eq!(out.get(&k("serial")), format!("GPUSIM-{}", w.phys), "{what}: index {i}\n{}", out.dump());
            assert_eq!(out.u64(&k("index")), i as u64, "{what}: index {i}\n{}", out.dump());
            assert_eq!(out.get(&k("pci")), format!("00000000:{:02X}:00.0", phys_bus(w.phys)), "{what}: index {i}\n{}", out.dump());
            assert_eq!(out.u64(&k("temp")), 40, "{what}: index {i}\n{}", out.dump());
            assert_eq!(out.u64(&k("util")), 0, "{what}: index {i}\n{}", out.dump());
            assert_eq!(out.u64(&k("cc")), 9, "{what}: index {i}\n{}", out.dump());
            assert_eq!(out.u64(&k("procs")), 0, "{what}: index {i}\n{}", out.dump());
            assert_eq!(out.u64(&k("total")), w.total, "{what}: index {i}\n{}", out.dump());
            assert_eq!(out.u64(&k("used")), 0, "{what}: index {i}\n{}", out.dump());
            assert_eq!(out.u64(&k("free")), w.total, "{what}: index {i}\n{}", out.dump());
            for (j, v) in want.iter().enumerate() {
                let p2p = if v.phys == w.phys { P2P_NOT_SUPPORTED } else { 0 };
                assert_eq!(out.num(&format!("p2p{i}{j}")), p2p, "{what}: P2P {i} -> {j}\n{}", out.dump());
            }
        }
        // op -> the index found (None: NOT_FOUND)
        let found: [(usize, Option<usize>); 4] =
            if shim { [(1, Some(1)), (2, None), (3, Some(0)), (4, Some(2))] } else { [(1, None), (2, Some(0)), (3, Some(0)), (4, Some(1))] };
        for (op, index) in found {
            match index {
                Some(i) => {
                    assert_eq!(out.num(&format!("op{op}.rc")), 0, "{what}: {}\n{}", lookups[op - 1], out.dump());
                    assert_eq!(out.u64(&format!("op{op}.index")), i as u64, "{what}: {}\n{}", lookups[op - 1], out.dump());
                    assert_eq!(out.get(&format!("op{op}.uuid")), want[i].uuid, "{what}: {}\n{}", lookups[op - 1], out.dump());
                    assert_eq!(out.get(&format!("op{op}.name")), phys_name(want[i].phys), "{what}\n{}", out.dump());
                }
                None => assert_eq!(out.num(&format!("op{op}.rc")), NVML_NOT_FOUND, "{what}: {}\n{}", lookups[op - 1], out.dump()),
            }
        }
        assert!(out.gpushim_lines().is_empty(), "{what}\n{}", out.dump());
    }
}
