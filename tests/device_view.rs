//! One device view everywhere (issue 13, item 8): whatever `CUDA_VISIBLE_DEVICES` the scheduler
//! set (indices, UUIDs, UUID prefixes) and whatever `GPUSHIM_VISIBLE_DEVICES` asks for, the
//! runtime's count (`cudaGetDeviceCount`), NVML's list (as the shim shows it) and PyTorch's
//! NVML-based count (`torch.cuda._device_count_nvml`, emulated below from PyTorch's source) agree,
//! with the same UUIDs in the same order — in the process and in a child it starts. A bad
//! `GPUSHIM_VIRTUAL_DEVICES` fails NVML as it fails CUDA.
//!
//! The simulated NVML ignores `CUDA_VISIBLE_DEVICES` (as the real one does) and lists the 4
//! physical devices; the simulated driver applies it.

mod common;

use common::*;

/// PyTorch's `_parse_visible_devices`, `_transform_uuid_to_ordinals`, `_raw_device_count_nvml`,
/// `_raw_device_uuid_nvml` and `_device_count_nvml` (torch/cuda/__init__.py), reading
/// `os.environ` (the environment as Python saw it at start) and NVML through ctypes, as PyTorch
/// does; then NVML's list and the runtime's devices. Prints `torch.count`, `torch.uuids`,
/// `nvml.rc`, `nvml.uuids`, `rt.rc`, `rt.count`, `rt.uuids`. With `child` as first argument it
/// runs itself again as a child (inheriting the environment, or with `CUDA_VISIBLE_DEVICES` set
/// to the second argument) and prints what the child printed.
const SCRIPT: &str = r#"
import ctypes, os, subprocess, sys

if len(sys.argv) > 2 and sys.argv[1] == "child":
    env = None
    if sys.argv[2] != "-":
        env = dict(os.environ)
        env["CUDA_VISIBLE_DEVICES"] = sys.argv[2]
    r = subprocess.run([sys.executable, "-c", SCRIPT_TEXT] + sys.argv[3:], env=env, capture_output=True, text=True)
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    sys.exit(r.returncode)

def _parse_visible_devices():
    var = os.getenv("CUDA_VISIBLE_DEVICES")
    if var is None:
        return list(range(64))
    def _strtoul(s):
        if not s:
            return -1
        for idx, c in enumerate(s):
            if not (c.isdigit() or (idx == 0 and c in "+-")):
                break
            if idx + 1 == len(s):
                idx += 1
        return int(s[:idx]) if idx > 0 else -1
    def parse_list_with_prefix(lst, prefix):
        rcs = []
        for elem in lst.split(","):
            if elem in rcs:
                return []
            if not elem.startswith(prefix):
                break
            rcs.append(elem)
        return rcs
    if var.startswith("GPU-"):
        return parse_list_with_prefix(var, "GPU-")
    if var.startswith("MIG-"):
        return parse_list_with_prefix(var, "MIG-")
    rc = []
    for elem in var.split(","):
        x = _strtoul(elem.strip())
        if x in rc:
            return []
        if x < 0:
            break
        rc.append(x)
    return rc

def _raw_device_count_nvml():
    nvml_h = ctypes.CDLL("libnvidia-ml.so.1")
    if nvml_h.nvmlInit() != 0:
        return -1
    dev_count = ctypes.c_int(-1)
    if nvml_h.nvmlDeviceGetCount_v2(ctypes.byref(dev_count)) != 0:
        return -1
    return dev_count.value

def _raw_device_uuid_nvml():
    nvml_h = ctypes.CDLL("libnvidia-ml.so.1")
    if nvml_h.nvmlInit() != 0:
        return None
    dev_count = ctypes.c_int(-1)
    if nvml_h.nvmlDeviceGetCount_v2(ctypes.byref(dev_count)) != 0:
        return None
    uuids = []
    for idx in range(dev_count.value):
        dev_id = ctypes.c_void_p()
        if nvml_h.nvmlDeviceGetHandleByIndex_v2(idx, ctypes.byref(dev_id)) != 0:
            return None
        buf = ctypes.create_string_buffer(96)
        if nvml_h.nvmlDeviceGetUUID(dev_id, buf, 96) != 0:
            return None
        uuids.append(buf.raw.decode("ascii").strip("\0"))
    return uuids

def _transform_uuid_to_ordinals(candidates, uuids):
    def uuid_to_ordinal(candidate, uuids):
        best_match = -1
        for idx, uuid in enumerate(uuids):
            if not uuid.startswith(candidate):
                continue
            if best_match != -1:
                return -1
            best_match = idx
        return best_match
    rc = []
    for candidate in candidates:
        idx = uuid_to_ordinal(candidate, uuids)
        if idx < 0:
            break
        if idx in rc:
            return []
        rc.append(idx)
    return rc

def _device_count_nvml():
    visible_devices = _parse_visible_devices()
    if not visible_devices:
        return 0, []
    if type(visible_devices[0]) is str:
        if visible_devices[0].startswith("MIG-"):
            return -1, None
        uuids = _raw_device_uuid_nvml()
        if uuids is None:
            return -1, None
        visible_devices = _transform_uuid_to_ordinals(visible_devices, uuids)
    else:
        raw_cnt = _raw_device_count_nvml()
        if raw_cnt <= 0:
            return raw_cnt, []
        for idx, val in enumerate(visible_devices):
            if val >= raw_cnt:
                visible_devices = visible_devices[:idx]
                break
    # (PyTorch returns the count; the UUIDs at its ordinals are what it would use.)
    return len(visible_devices), visible_devices

count, ordinals = _device_count_nvml()
print(f"torch.count={count}")
nvml = _raw_device_uuid_nvml()
print(f"nvml.rc={0 if nvml is not None else 1}")
if nvml is not None:
    print("nvml.uuids=" + ",".join(nvml))
    if ordinals is not None and count >= 0:
        print("torch.uuids=" + ",".join(nvml[o] for o in ordinals))

rt = ctypes.CDLL(sys.argv[1])
n = ctypes.c_int(-1)
rc = rt.cudaGetDeviceCount(ctypes.byref(n))
# cudaErrorNoDevice (100): no device visible, a count of 0.
print(f"rt.rc={0 if rc == 100 else rc}")
if rc == 100:
    print("rt.count=0")
    print("rt.uuids=")
if rc == 0:
    print(f"rt.count={n.value}")
    uuids = []
    for d in range(n.value):
        prop = ctypes.create_string_buffer(4096)
        assert rt.cudaGetDeviceProperties_v2(prop, d) == 0
        u = prop.raw[256:272].hex()
        uuids.append(f"GPU-{u[0:8]}-{u[8:12]}-{u[12:16]}-{u[16:20]}-{u[20:32]}")
    print("rt.uuids=" + ",".join(uuids))
print("done=1")
"#;

fn script() -> String {
    // The child runs the same text: handed over through a variable of the script itself.
    format!("SCRIPT_TEXT = {:?}\n{SCRIPT}", SCRIPT)
}

fn cudart() -> String {
    cuda_deps(12).join("lib/libcudart.so.12").display().to_string()
}

/// Physical devices by UUID prefix: `GPU-1011…` is 0, `GPU-2021…` 1, `GPU-3031…` 2, `GPU-4041…` 3.
fn uuids(list: &[u32]) -> String {
    list.iter().map(|&p| phys_uuid(p)).collect::<Vec<_>>().join(",")
}

/// The scheduler's settings: value (None: unset) and the physical devices the driver shows.
fn schedulers() -> Vec<(Option<String>, Vec<u32>)> {
    vec![
        (None, vec![0, 1, 2, 3]),
        (Some("1,2".into()), vec![1, 2]),
        (Some("2,0".into()), vec![2, 0]),
        (Some(format!("{},{}", phys_uuid(3), phys_uuid(1))), vec![3, 1]),
        (Some("GPU-4041,GPU-2021".into()), vec![3, 1]),
        (Some("GPU-3031".into()), vec![2]),
    ]
}

/// The shim's settings for a scheduler view `base`: value (None: unset) and the physical
/// devices of the program's view (None: a configuration error).
fn selections(base: &[u32]) -> Vec<(Option<String>, Option<Vec<u32>>)> {
    let by_ordinal = |ords: &[usize]| ords.iter().map(|&o| base.get(o).copied()).collect::<Option<Vec<u32>>>();
    let last = *base.last().unwrap();
    vec![
        (None, Some(base.to_vec())),
        (Some("1".into()), by_ordinal(&[1])),
        (Some("1,0".into()), by_ordinal(&[1, 0])),
        (Some(phys_uuid(last)[..8].to_string()), Some(vec![last])),
        (Some("none".into()), Some(vec![])),
    ]
}

struct Seen {
    torch: String,
    nvml: String,
    runtime: String,
}

fn run_case(cvd: &Option<String>, sel: &Option<String>, shim: bool, child: Option<&str>) -> (RunOutput, String) {
    let mut run = python_run(&script());
    if let Some(c) = child {
        run = run.args(["child", c]);
    }
    run = run.arg(cudart()).env("GPUSIM_DEVICES", "4").env("GPUSIM_MEMORY", "16GiB").shim(shim);
    if let Some(c) = cvd {
        run = run.env("CUDA_VISIBLE_DEVICES", c);
    }
    if let Some(s) = sel {
        run = run.env("GPUSHIM_VISIBLE_DEVICES", s);
    }
    let what = format!("shim={shim} CUDA_VISIBLE_DEVICES={cvd:?} GPUSHIM_VISIBLE_DEVICES={sel:?} child={child:?}");
    (run.run(), what)
}

fn seen(out: &RunOutput, what: &str) -> Seen {
    out.assert_completed();
    assert_eq!(out.num("rt.rc"), 0, "{what}: cudaGetDeviceCount\n{}", out.dump());
    assert_eq!(out.num("nvml.rc"), 0, "{what}: NVML\n{}", out.dump());
    let torch = out.kv.get("torch.uuids").cloned().unwrap_or_default();
    let runtime = out.kv.get("rt.uuids").cloned().unwrap_or_default();
    assert_eq!(out.u64("torch.count") as usize, torch.split(',').filter(|s| !s.is_empty()).count(), "{what}\n{}", out.dump());
    assert_eq!(out.u64("rt.count") as usize, runtime.split(',').filter(|s| !s.is_empty()).count(), "{what}\n{}", out.dump());
    Seen { torch, nvml: out.kv.get("nvml.uuids").cloned().unwrap_or_default(), runtime }
}

/// Checks one combination, with and without the shim, in the process itself and in a child
/// that inherits its environment.
fn check(cvd: &Option<String>, base: &[u32], sel: &Option<String>, want: &Option<Vec<u32>>) {
    // Without the shim: PyTorch and the runtime agree on the scheduler's view; NVML shows all.
    let (out, what) = run_case(cvd, sel, false, None);
    let s = seen(&out, &what);
    assert_eq!(s.runtime, uuids(base), "{what}: runtime\n{}", out.dump());
    assert_eq!(s.torch, uuids(base), "{what}: PyTorch\n{}", out.dump());
    assert_eq!(s.nvml, uuids(&[0, 1, 2, 3]), "{what}: NVML\n{}", out.dump());
    for child in [None, Some("-")] {
        let (out, what) = run_case(cvd, sel, true, child);
        let Some(want) = want else {
            // A selector naming no device: CUDA and NVML both refuse.
            out.assert_completed();
            assert_ne!(out.num("rt.rc"), 0, "{what}: cudaGetDeviceCount must fail\n{}", out.dump());
            assert_ne!(out.num("nvml.rc"), 0, "{what}: NVML must fail\n{}", out.dump());
            assert!(out.num("torch.count") <= 0, "{what}: PyTorch's count\n{}", out.dump());
            continue;
        };
        let s = seen(&out, &what);
        assert_eq!(s.runtime, uuids(want), "{what}: runtime\n{}", out.dump());
        assert_eq!(s.torch, uuids(want), "{what}: PyTorch's count and devices\n{}", out.dump());
        if sel.is_some() {
            assert_eq!(s.nvml, uuids(want), "{what}: NVML\n{}", out.dump());
        } else {
            // Without the shim's setting NVML's list stays whole (PyTorch applies the
            // scheduler's CUDA_VISIBLE_DEVICES to it itself).
            assert_eq!(s.nvml, uuids(&[0, 1, 2, 3]), "{what}: NVML\n{}", out.dump());
        }
        assert!(out.gpushim_lines().is_empty(), "{what}\n{}", out.dump());
    }
}

#[test]
fn runtime_nvml_and_pytorch_agree_for_every_combination() {
    if skip_emulated("runs python3, a host program, with the target's library") {
        return;
    }
    nvml_sim_library();
    for (cvd, base) in schedulers() {
        for (sel, want) in selections(&base) {
            check(&cvd, &base, &sel, &want);
        }
    }
}

/// A launcher (which never touches CUDA) gives each worker `CUDA_VISIBLE_DEVICES=<i>`: the
/// worker gets device `<i>` of the launcher's view, in all three counts.
#[test]
fn a_worker_given_one_device_of_the_view_agrees_too() {
    if skip_emulated("runs python3, a host program, with the target's library") {
        return;
    }
    nvml_sim_library();
    let cvd = Some("1,2,3".to_string());
    let sel = Some("2,0".to_string()); // physical 3, 1
    for (entry, want) in [("1", vec![1u32]), ("0", vec![3]), ("1,0", vec![1, 3]), ("5", vec![])] {
        let (out, what) = run_case(&cvd, &sel, true, Some(entry));
        let s = seen(&out, &what);
        assert_eq!(s.runtime, uuids(&want), "{what}: runtime\n{}", out.dump());
        assert_eq!(s.torch, uuids(&want), "{what}: PyTorch\n{}", out.dump());
        assert_eq!(s.nvml, uuids(&want), "{what}: NVML\n{}", out.dump());
    }
}

/// NVML_ERROR_UNINITIALIZED: what every NVML function gives under a configuration error.
const NVML_UNINITIALIZED: i64 = 1;

/// An NVML program with and without the shim: without it NVML lists the 3 devices; with it
/// `nvmlDeviceGetCount` gives NVML_ERROR_UNINITIALIZED (nvmlInit itself is the driver's) and
/// exactly one gpushim line is printed, which is returned.
fn nvml_fails_closed(path: NvmlPath, env: (&str, &str)) -> String {
    let run = || Run::program(Program::Nvml(path)).env("GPUSIM_DEVICES", "3").env("GPUSIM_MEMORY", "16GiB").env(env.0, env.1).arg("list");
    let what = format!("{path:?} {}={}", env.0, env.1);
    let plain = run().run();
    plain.assert_completed();
    assert_eq!(plain.num("count.rc"), 0, "{what}\n{}", plain.dump());
    assert_eq!(plain.u64("count"), 3, "{what}\n{}", plain.dump());
    let out = run().shim(true).run();
    out.assert_completed();
    assert_eq!(out.num("count.rc"), NVML_UNINITIALIZED, "{what}: nvmlDeviceGetCount\n{}", out.dump());
    assert!(!out.kv.contains_key("idx0.uuid"), "{what}: a device listed\n{}", out.dump());
    let lines = out.gpushim_lines();
    assert_eq!(lines.len(), 1, "{what}: exactly one gpushim line\n{}", out.dump());
    lines[0].clone()
}

/// A `GPUSHIM_VIRTUAL_DEVICES` that cannot split the devices (parts larger than the GPU, a
/// selector naming no device) fails NVML as it fails CUDA: `nvmlDeviceGetCount` gives
/// NVML_ERROR_UNINITIALIZED, as for any other configuration error (a bad memory limit here),
/// and the one line printed is the one CUDA prints.
#[test]
fn bad_virtual_devices_fail_nvml_as_they_fail_cuda() {
    nvml_sim_library();
    for path in NvmlPath::ALL {
        nvml_fails_closed(path, ("GPUSHIM_MEMORY_LIMIT", "4 gigs"));
    }
    for value in ["0:2x9GiB", "5:1GiB", "GPU-ff:1GiB", "0:8GiB,8GiB,1"] {
        let cuda = check_fails_closed(|| {
            Run::program(Program::Runtime { major: 12, ptsz: false })
                .env("GPUSIM_DEVICES", "3")
                .env("GPUSIM_MEMORY", "16GiB")
                .env("GPUSHIM_VIRTUAL_DEVICES", value)
        });
        assert_fails_closed(&cuda.shim, "GPUSHIM_VIRTUAL_DEVICES", value);
        for path in NvmlPath::ALL {
            let line = nvml_fails_closed(path, ("GPUSHIM_VIRTUAL_DEVICES", value));
            assert_eq!(line, cuda.line, "{path:?} GPUSHIM_VIRTUAL_DEVICES={value}: the line NVML's error prints");
        }
    }
}

/// What a process that never touches CUDA (`env`) is started with under the shim: nothing
/// changed without `GPUSHIM_VISIBLE_DEVICES`; with it, `CUDA_VISIBLE_DEVICES` indexes the
/// narrowed list and the original is kept. Never any output or file.
#[test]
fn load_time_rewrite_in_a_process_that_never_uses_cuda() {
    if skip_emulated("runs env, a host program, with the target's library preloaded") {
        return;
    }
    let env = |vars: &[(&str, &str)], shim: bool| {
        let out = Run::new("env").arg("done=1").envs(vars).shim(shim).run();
        out.assert_completed();
        assert!(out.gpushim_lines().is_empty(), "{}", out.dump());
        out
    };
    for shim in [false, true] {
        let out = env(&[("CUDA_VISIBLE_DEVICES", "1,2")], shim);
        assert_eq!(out.get("CUDA_VISIBLE_DEVICES"), "1,2", "{}", out.dump());
        assert!(!out.kv.keys().any(|k| k.starts_with("GPUSHIM_VIEW") || k.starts_with("GPUSHIM_ORIGINAL")), "{}", out.dump());
        let out = env(&[("CUDA_VISIBLE_DEVICES", "1,2"), ("GPUSHIM_VISIBLE_DEVICES", "1,0")], shim);
        let (cvd, original) = if shim { ("0,1", Some("1,2")) } else { ("1,2", None) };
        assert_eq!(out.get("CUDA_VISIBLE_DEVICES"), cvd, "shim={shim}\n{}", out.dump());
        assert_eq!(out.kv.get("GPUSHIM_ORIGINAL_CUDA_VISIBLE_DEVICES").map(String::as_str), original, "shim={shim}\n{}", out.dump());
        let out = env(&[("GPUSHIM_VISIBLE_DEVICES", "1")], shim);
        assert_eq!(out.kv.get("CUDA_VISIBLE_DEVICES").map(String::as_str), shim.then_some("0"), "shim={shim}\n{}", out.dump());
        assert!(!out.kv.contains_key("GPUSHIM_ORIGINAL_CUDA_VISIBLE_DEVICES"), "{}", out.dump());
    }
}
