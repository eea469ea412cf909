//! PyTorch's device count and devices under every combination of the scheduler's
//! `CUDA_VISIBLE_DEVICES`, `GPUSHIM_VISIBLE_DEVICES` and `GPUSHIM_VIRTUAL_DEVICES` (issue 26,
//! item 5): PyTorch 2.15.0 from `.deps/frameworks/venv` counts devices through NVML before CUDA
//! is initialised (`torch.cuda.device_count()` → `_device_count_nvml`: the
//! `CUDA_VISIBLE_DEVICES` Python read at start applied to NVML's list), and maps its ordinals to
//! NVML's indices the same way (`_get_nvml_device_index`). Its count must equal the runtime's
//! (`torch._C._cuda_getDeviceCount`) and NVML's (`nvmlDeviceGetCount`), and behind each ordinal
//! the same device: UUID, name and memory total through `torch.cuda.get_device_properties` (the
//! runtime's `cudaGetDeviceProperties`), NVML by index, and NVML at PyTorch's own index.
//! Children started with the process's environment (the C environment after CUDA was used, and
//! Python's copy taken at start) see the same devices.
//!
//! The simulated driver has 3 GPUs of 16, 12 and 8 GiB (names `gpusim device <p>`, UUIDs
//! `GPU-1011…`, `GPU-2021…`, `GPU-3031…`); the simulated NVML lists all 3 whatever
//! `CUDA_VISIBLE_DEVICES` says (as the real one does), the simulated driver applies it.

mod common;

use common::*;
use std::path::PathBuf;

const GIB: u64 = 1 << 30;
const TOTALS: [u64; 3] = [16 * GIB, 12 * GIB, 8 * GIB];

fn venv_python() -> PathBuf {
    common::venv_python("frameworks", "PyTorch is")
}

/// Prints, for the process and (with `PROBE_CHILDREN=1`) for two children running the same
/// probe (prefix `c.` inheriting the C environment after CUDA was used, `p.` given Python's
/// `os.environ`): `cvd` (as Python read it), `torch.count` (`torch.cuda.device_count()` before
/// CUDA is initialised), `nvml.rc`, `nvml.count`, `nvml.I` (UUID|name|total by index),
/// `torch.nvmlI` (PyTorch's NVML index of its ordinal I), `rt.count`, `rt.I` (UUID|name|total
/// of `get_device_properties(I)`), `torch.after` (the count once CUDA is initialised).
const PROBE: &str = r#"
import ctypes, os, subprocess, sys
import torch
print("cvd=%s" % os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"))
count = torch.cuda.device_count()
print("torch.count=%d" % count)
nvml = ctypes.CDLL("libnvidia-ml.so.1")
class Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]
rc = nvml.nvmlInit_v2()
n = ctypes.c_uint(0)
if rc == 0:
    rc = nvml.nvmlDeviceGetCount_v2(ctypes.byref(n))
print("nvml.rc=%d" % rc)
if rc == 0:
    print("nvml.count=%d" % n.value)
    for i in range(n.value):
        h = ctypes.c_void_p()
        assert nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)) == 0
        uuid, name, mem = ctypes.create_string_buffer(96), ctypes.create_string_buffer(96), Memory()
        assert nvml.nvmlDeviceGetUUID(h, uuid, 96) == 0
        assert nvml.nvmlDeviceGetName(h, name, 96) == 0
        assert nvml.nvmlDeviceGetMemoryInfo(h, ctypes.byref(mem)) == 0
        print("nvml.%d=%s|%s|%d" % (i, uuid.value.decode(), name.value.decode(), mem.total))
for i in range(count):
    try:
        print("torch.nvml%d=%d" % (i, torch.cuda._get_nvml_device_index(i)))
    except RuntimeError as e:
        print("torch.nvml%d=error" % i)
rt = torch._C._cuda_getDeviceCount()
print("rt.count=%d" % rt)
for i in range(rt):
    p = torch.cuda.get_device_properties(i)
    print("rt.%d=GPU-%s|%s|%d" % (i, p.uuid, p.name, p.total_memory))
print("torch.after=%d" % torch.cuda.device_count())
if os.environ.get("PROBE_CHILDREN") == "1":
    for prefix, env in (("c.", None), ("p.", dict(os.environ))):
        if env is None:
            del os.environ["PROBE_CHILDREN"]  # (putenv: the C environment the child inherits)
        else:
            env.pop("PROBE_CHILDREN", None)
        r = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True)
        sys.stderr.write(r.stderr)
        for line in r.stdout.splitlines():
            print(prefix + line)
print("done=1")
"#;

fn probe() -> String {
    // The children run the same text, handed over through a variable of the probe itself.
    format!("PROBE = {:?}\n{PROBE}", PROBE)
}

/// One device as the program should see it: its GPU and, for a part, its index and size.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Want {
    phys: u32,
    part: Option<(u32, u64)>,
}

impl Want {
    /// `UUID|name|total`, as the probe prints a device.
    fn line(&self) -> String {
        let (uuid, total) = match self.part {
            Some((index, size)) => (part_uuid(self.phys, index), size),
            None => (phys_uuid(self.phys), TOTALS[self.phys as usize]),
        };
        format!("{uuid}|{}|{total}", phys_name(self.phys))
    }
}

/// The scheduler's `CUDA_VISIBLE_DEVICES` (None: unset) and the GPUs the driver then shows.
fn scheduler(cvd: Option<&str>) -> Vec<u32> {
    match cvd {
        None => vec![0, 1, 2],
        Some("0") => vec![0],
        Some("1,0") => vec![1, 0],
        Some(c) if c == uuid_cvd() => vec![2, 0],
        Some("") | Some("-1") => vec![],
        Some(c) => panic!("no model for CUDA_VISIBLE_DEVICES={c}"),
    }
}

/// A scheduler's `CUDA_VISIBLE_DEVICES` in UUID form: GPU 2 by its whole UUID, GPU 0 by a prefix.
fn uuid_cvd() -> String {
    format!("{},{}", phys_uuid(2), &phys_uuid(0)[..8])
}

/// `GPUSHIM_VISIBLE_DEVICES` over the scheduler's view `base`: the GPUs selected; None where the
/// setting names a device `base` lacks (a configuration error).
fn select(sel: Option<&str>, base: &[u32]) -> Option<Vec<u32>> {
    let ord = |list: &[usize]| list.iter().map(|&i| base.get(i).copied()).collect::<Option<Vec<u32>>>();
    match sel {
        None => Some(base.to_vec()),
        Some("none") => Some(vec![]),
        Some("0") => ord(&[0]),
        Some("1") => ord(&[1]),
        Some("1,0") => ord(&[1, 0]),
        // GPU 2 by UUID prefix
        Some("GPU-3031") => base.contains(&2).then(|| vec![2]),
        Some(s) => panic!("no model for GPUSHIM_VISIBLE_DEVICES={s}"),
    }
}

/// `GPUSHIM_VIRTUAL_DEVICES` over the view: the program's devices; None where the setting names
/// a device the view lacks (a configuration error). Nothing to split in an empty view.
fn split(virt: Option<&str>, view: &[u32]) -> Option<Vec<Want>> {
    let sizes: Vec<Vec<u64>> = match virt {
        None => vec![],
        Some("0:2x4GiB") => vec![vec![4 * GIB; 2]],
        Some("0:2x4GiB;1:3x2GiB") => vec![vec![4 * GIB; 2], vec![2 * GIB; 3]],
        Some(v) => panic!("no model for GPUSHIM_VIRTUAL_DEVICES={v}"),
    };
    if view.is_empty() {
        return Some(vec![]);
    }
    if sizes.len() > view.len() {
        return None;
    }
    let mut out = Vec::new();
    for (i, p) in view.iter().enumerate() {
        match sizes.get(i) {
            Some(s) => out.extend(s.iter().enumerate().map(|(k, &size)| Want { phys: *p, part: Some((k as u32, size)) })),
            None => out.push(Want { phys: *p, part: None }),
        }
    }
    Some(out)
}

/// One combination: the scheduler's `CUDA_VISIBLE_DEVICES`, `GPUSHIM_VISIBLE_DEVICES`,
/// `GPUSHIM_VIRTUAL_DEVICES` (None: unset).
type Case<'a> = (Option<&'a str>, Option<&'a str>, Option<&'a str>);

fn run(case: &Case, shim: bool, children: bool) -> RunOutput {
    let (cvd, sel, virt) = case;
    let mut run = Run::new(venv_python())
        .arg("-c")
        .arg(probe())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("GPUSIM_DEVICES", "3")
        .env("GPUSIM_MEMORY", "16GiB,12GiB,8GiB")
        .shim(shim);
    for (k, v) in [("CUDA_VISIBLE_DEVICES", cvd), ("GPUSHIM_VISIBLE_DEVICES", sel), ("GPUSHIM_VIRTUAL_DEVICES", virt)] {
        if let Some(v) = v {
            run = run.env(k, v);
        }
    }
    if children {
        run = run.env("PROBE_CHILDREN", "1");
    }
    run.run()
}

/// The devices a probe's output (keys under `p`) shows through PyTorch, the runtime and NVML
/// agree with `want`: the three counts, and behind each ordinal the same UUID, name and total.
fn assert_sees(out: &RunOutput, p: &str, want: &[Want], nvml_whole: Option<&[u32]>, what: &str) {
    let k = |s: &str| format!("{p}{s}");
    let n = want.len() as i64;
    out.assert_num(&k("torch.count"), n, &format!("{what}: torch.cuda.device_count() before CUDA is initialised"));
    out.assert_num(&k("rt.count"), n, &format!("{what}: the runtime's count"));
    out.assert_num(&k("torch.after"), n, &format!("{what}: torch.cuda.device_count() after"));
    out.assert_num(&k("nvml.rc"), 0, &format!("{what}: nvmlDeviceGetCount"));
    // NVML's list: the program's devices, or (nothing of the shim's set) all GPUs whole
    let nvml: Vec<String> = match nvml_whole {
        Some(all) => all.iter().map(|&q| Want { phys: q, part: None }.line()).collect(),
        None => want.iter().map(Want::line).collect(),
    };
    out.assert_num(&k("nvml.count"), nvml.len() as i64, &format!("{what}: NVML's count"));
    for (i, line) in nvml.iter().enumerate() {
        out.assert_str(&k(&format!("nvml.{i}")), line, &format!("{what}: NVML's device {i}"));
    }
    for (i, w) in want.iter().enumerate() {
        out.assert_str(&k(&format!("rt.{i}")), &w.line(), &format!("{what}: get_device_properties({i})"));
        let at = out.get(&k(&format!("torch.nvml{i}")));
        let line = at.parse::<usize>().ok().and_then(|j| out.kv.get(&k(&format!("nvml.{j}"))));
        assert_eq!(line, Some(&w.line()), "{what}: NVML's device at PyTorch's index of ordinal {i} ({at})\n{}", out.dump());
    }
}

/// Checks one combination under the shim (with children when asked): `want` the program's
/// devices, None for a configuration error.
fn check(case: &Case, children: bool) {
    let (cvd, sel, virt) = *case;
    let what = format!("CUDA_VISIBLE_DEVICES={cvd:?} GPUSHIM_VISIBLE_DEVICES={sel:?} GPUSHIM_VIRTUAL_DEVICES={virt:?}");
    let want = select(sel, &scheduler(cvd)).and_then(|view| split(virt, &view));
    let out = run(case, true, children);
    out.assert_completed();
    let Some(want) = want else {
        // A configuration error: CUDA and NVML both refuse, PyTorch counts nothing, one line.
        out.assert_num("rt.count", 0, &format!("{what}: the runtime's count"));
        assert_ne!(out.num("nvml.rc"), 0, "{what}: NVML must fail\n{}", out.dump());
        out.assert_num("torch.count", 0, &format!("{what}: torch.cuda.device_count()"));
        assert_eq!(out.gpushim_lines().len(), 1, "{what}: one configuration error\n{}", out.dump());
        return;
    };
    // Without any of the shim's settings NVML's list stays whole (PyTorch applies the scheduler's
    // CUDA_VISIBLE_DEVICES to it itself).
    let all = [0, 1, 2];
    let nvml_whole = (sel.is_none() && virt.is_none()).then_some(&all[..]);
    assert_sees(&out, "", &want, nvml_whole, &what);
    if children {
        for p in ["c.", "p."] {
            assert_sees(&out, p, &want, nvml_whole, &format!("{what}: child {p}"));
        }
    }
    assert!(out.gpushim_lines().is_empty(), "{what}\n{}", out.dump());
}

/// Without the shim (its settings ignored), PyTorch and the runtime agree on the scheduler's
/// view and NVML lists all 3 GPUs: the model of the scheduler's settings is right.
#[test]
fn without_the_shim_pytorch_follows_the_scheduler() {
    for cvd in [None, Some("0"), Some("1,0"), Some(uuid_cvd().as_str()), Some(""), Some("-1")] {
        let case = (cvd, Some("1,0"), Some("0:2x4GiB"));
        let out = run(&case, false, false);
        out.assert_completed();
        let base: Vec<Want> = scheduler(cvd).iter().map(|&phys| Want { phys, part: None }).collect();
        assert_sees(&out, "", &base, Some(&[0, 1, 2]), &format!("no shim, CUDA_VISIBLE_DEVICES={cvd:?}"));
    }
}

/// One GPU split in two, under every scheduler setting, with and without a selection.
#[test]
fn one_gpu_split() {
    let uuid = uuid_cvd();
    let split = Some("0:2x4GiB");
    for cvd in [None, Some("0"), Some("1,0"), Some(uuid.as_str()), Some(""), Some("-1")] {
        check(&(cvd, None, split), false);
    }
    for (cvd, sel) in [(None, "0"), (None, "1,0"), (None, "GPU-3031"), (Some("1,0"), "1"), (Some(uuid.as_str()), "1,0"), (Some("0"), "0"), (None, "none")] {
        check(&(cvd, Some(sel), split), false);
    }
}

/// Two GPUs split, and a split that names a device the view lacks (a configuration error).
#[test]
fn two_gpus_split() {
    let uuid = uuid_cvd();
    let split = Some("0:2x4GiB;1:3x2GiB");
    for (cvd, sel) in [(None, None), (Some("1,0"), None), (None, Some("1,0")), (Some(uuid.as_str()), Some("1,0")), (Some("0"), None)] {
        check(&(cvd, sel, split), false);
    }
}

/// Without splitting: the view alone, and the scheduler's setting alone.
#[test]
fn no_split() {
    let uuid = uuid_cvd();
    for (cvd, sel) in [(None, Some("1,0")), (Some("1,0"), None), (Some(uuid.as_str()), Some("1")), (Some(""), None), (Some("-1"), Some("none"))] {
        check(&(cvd, sel, None), false);
    }
}

/// Children started with the process's environment, before and after it used CUDA, see the
/// same devices: the split is applied once, in each process, to the same GPUs.
#[test]
fn children_see_the_same_devices() {
    let uuid = uuid_cvd();
    for case in [
        (None, Some("0"), Some("0:2x4GiB")),
        (Some("1,0"), None, Some("0:2x4GiB")),
        (Some(uuid.as_str()), Some("1,0"), Some("0:2x4GiB;1:3x2GiB")),
        (None, Some("1,0"), None),
    ] {
        check(&case, true);
    }
}

// ---------------------------------------------------------------------------------------
// The placement log under PyTorch (from tests/placement.rs: every test that needs a framework
// environment is in a tests/frameworks*.rs binary, which `scripts/test.sh --quick` leaves out)
// ---------------------------------------------------------------------------------------

fn placement_lines(out: &RunOutput) -> Vec<String> {
    out.stderr_text().lines().filter(|l| l.starts_with("gpushim: placement: ")).map(|l| l["gpushim: placement: ".len()..].to_string()).collect()
}

/// The report's placement entry of program device `d`.
fn device_summary(out: &RunOutput, d: u64) -> serde_json::Value {
    let placement = out.shim_report().placement.clone().unwrap_or_else(|| panic!("no placement in the report\n{}", out.dump()));
    placement.as_array().unwrap().iter().find(|v| v["ordinal"] == d).cloned().unwrap_or_else(|| panic!("device {d} missing\n{}", out.dump()))
}

/// PyTorch (`.deps/frameworks/venv`, `scripts/fetch-frameworks.sh`): `torch.empty` on `cuda:1`
/// lands on the program's device 1 — the GPU `GPUSHIM_VISIBLE_DEVICES` put there — through its
/// caching allocator (`cudaMalloc`, so `cuMemAlloc`), and nothing lands on device 0.
#[test]
fn pytorch_tensors_on_cuda_1() {
    let python = venv_python();
    let script = "import torch\nx = torch.empty(8 << 20, dtype=torch.uint8, device='cuda:1')\ny = torch.empty(4 << 20, dtype=torch.uint8, device='cuda:1')\ntorch.cuda.synchronize(1)\nprint('done=1')\n";
    let out = Run::new(python)
        .arg("-c")
        .arg(script)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("GPUSIM_DEVICES", "3")
        .env("GPUSHIM_VISIBLE_DEVICES", "2,0")
        .env("GPUSHIM_LOG_PLACEMENT", "1")
        .shim(true)
        .with_shim_report()
        .run();
    out.assert_completed();
    let at = format!("device 1 (GPU 0 {})", phys_uuid(0));
    let lines = placement_lines(&out);
    // the caching allocator rounds a block up (here to 20 MiB): the line shows what it asked for
    assert!(lines.iter().any(|l| l.starts_with("cuMemAlloc of ") && l.ends_with(&format!(" bytes on {at}"))), "{}", out.dump());
    assert!(!lines.iter().any(|l| l.starts_with("cuMemAlloc") && l.contains("on device 0 ")), "nothing allocated on device 0\n{}", out.dump());
    let s = device_summary(&out, 1);
    let bytes: u64 = s["allocations"].as_array().unwrap().iter().filter(|a| a["api"] == "cuMemAlloc").map(|a| a["bytes"].as_u64().unwrap()).sum();
    assert!(bytes >= 12 * MIB, "{s}");
    assert_eq!(s["uuid"], phys_uuid(0), "{s}");
}
