//! Real NVIDIA driver libraries as ground truth, without a GPU: Debian's non-free `libcuda1`,
//! `libnvidia-ml1` and `nvidia-smi` of the 535, 550 and 555 branches (`scripts/fetch-drivers.sh`,
//! run by `scripts/test.sh`, unpacks them into `.deps/drivers/`). These libraries load and
//! answer `cuGetProcAddress` and `cuGetExportTable` before `cuInit`; `cuInit` then says
//! `CUDA_ERROR_NO_DEVICE`, `nvmlInit` `NVML_ERROR_DRIVER_NOT_LOADED`, and `nvidia-smi` exits 9.
//!
//! Checked on each driver, through the shim and without it:
//! * `cuGetProcAddress[_v2]` for every base name the driver exports, 14 versions from 2000 to
//!   13000, flags 0 and per-thread: the same result code, status and **the same variant** (the
//!   symbol `dladdr` names); where the shim answers with its own function it is its hook of that
//!   very variant, everything else is the driver's own pointer; the functions the shim always
//!   counts are its hooks;
//! * `cuGetExportTable` for every table id the CUDA runtime uses, virtual devices configured:
//!   the same result code and slot-0 size as the driver's own;
//! * with no device, under every kind of setting: `cuInit` gives the driver's own 100, the real
//!   runtime (cudart 12.9) its own `cudaErrorNoDevice`, `nvidia-smi` the same exit status and
//!   output; nothing at all on stderr from the shim, no crash, no hang.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::*;

/// The unpacked drivers (version, directory); the fetch script must have run.
fn drivers() -> Vec<(String, PathBuf)> {
    let dir = real_drivers_dir();
    let mut found: Vec<(String, PathBuf)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}; run `bash scripts/fetch-drivers.sh` (scripts/test.sh does)", dir.display()))
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.join(".complete").is_file())
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), p))
        .collect();
    found.sort();
    let branches: Vec<&str> = found.iter().map(|(v, _)| v.split('.').next().unwrap()).collect();
    assert_eq!(branches, ["535", "550", "555"], "expected one driver of each branch in {}", dir.display());
    found
}

/// Runs `program args` with only the real driver `dir/lib` on the library path (and the shim
/// preloaded, with `env`, when `shim`), in a clean environment; a hang fails.
fn run_real(dir: &Path, program: &Path, args: &[&str], shim: bool, env: &[(&str, &str)]) -> Output {
    let mut cmd = target_command(program);
    cmd.args(args).env_clear().env("PATH", "/usr/bin:/bin").env("LD_LIBRARY_PATH", dir.join("lib"));
    let state = work_dir().join(format!("real-state-{}", std::process::id()));
    std::fs::create_dir_all(&state).unwrap();
    std::fs::set_permissions(&state, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    cmd.env("GPUSHIM_STATE_DIR", &state);
    if shim {
        cmd.env("LD_PRELOAD", shim_path());
        cmd.envs(env.iter().copied());
    }
    let child = cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().expect("spawn");
    let (tx, rx) = std::sync::mpsc::channel();
    let pid = child.id();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(out) => out.expect("wait"),
        Err(_) => {
            // SAFETY: kill(2) of the child we spawned.
            unsafe { libc_kill(pid as i32, 9) };
            panic!("{} {args:?} (shim {shim}, {env:?}) did not finish within 120 s", program.display());
        }
    }
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Every `cu…` function the library exports, as base names (`_v2`, `_ptsz`, `_ptds` stripped).
fn base_names(lib: &Path) -> Vec<String> {
    let out = Command::new(nm()).args(["-D", "--defined-only"]).arg(lib).output().expect("nm (binutils) is needed");
    assert!(out.status.success(), "nm {}: {}", lib.display(), text(&out.stderr));
    let mut names: Vec<String> = text(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .filter(|n| n.starts_with("cu"))
        .map(|n| {
            let mut n = n.split('@').next().unwrap().to_string();
            loop {
                let before = n.len();
                for suffix in ["_ptsz", "_ptds"] {
                    if let Some(s) = n.strip_suffix(suffix) {
                        n = s.to_string();
                    }
                }
                if let Some(i) = n.rfind("_v") {
                    if n[i + 2..].chars().all(|c| c.is_ascii_digit()) && n.len() > i + 2 {
                        n.truncate(i);
                    }
                }
                if n.len() == before {
                    break n;
                }
            }
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

type Answers = BTreeMap<(String, String, String, String), (String, String, String, String)>;

fn gpa(dir: &Path, names: &Path, shim: bool, env: &[(&str, &str)]) -> Answers {
    let out = run_real(dir, &program(Program::RealDriver), &["gpa", names.to_str().unwrap()], shim, env);
    let stdout = text(&out.stdout);
    assert!(stdout.ends_with("done=1\n"), "{}: {stdout}\n{}", dir.display(), text(&out.stderr));
    assert_eq!(text(&out.stderr), "", "shim {shim} {env:?}: nothing on stderr");
    stdout
        .lines()
        .filter(|l| l.starts_with("gpa"))
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            assert_eq!(f.len(), 8, "{l}");
            ((f[0].into(), f[1].into(), f[2].into(), f[3].into()), (f[4].into(), f[5].into(), f[6].into(), f[7].into()))
        })
        .collect()
}

#[test]
fn get_proc_address_gives_the_same_variant_and_hooks_only_what_the_shim_changes() {
    let configs: [&[(&str, &str)]; 3] = [
        &[("GPUSHIM_MEMORY_LIMIT", "1GiB")],
        &[("GPUSHIM_VIRTUAL_DEVICES", "0:2x1GiB"), ("GPUSHIM_MEMORY_MODE", "grow")],
        &[("GPUSHIM_VISIBLE_DEVICES", "0")],
    ];
    for (version, dir) in drivers() {
        let names = base_names(&dir.join("lib/libcuda.so.1"));
        assert!(names.len() > 400, "{version}: {} base names", names.len());
        let file = work_dir().join(format!("names-{version}.txt"));
        std::fs::write(&file, names.join("\n")).unwrap();
        let truth = gpa(&dir, &file, false, &[]);
        assert_eq!(truth.len(), names.len() * 14 * 2 * 2);
        for env in configs {
            let shim = gpa(&dir, &file, true, env);
            let mut hooked = 0;
            for (key, want) in &truth {
                let got = &shim[key];
                assert_eq!(want.2, "-".to_string().max(want.2.clone()), "{version} {key:?}");
                assert!(want.3 == "driver" || want.3 == "-", "{version} {key:?}: without the shim {want:?}");
                assert_eq!((&got.0, &got.1, &got.2), (&want.0, &want.1, &want.2), "{version} {env:?} {key:?}: rc, status and variant");
                assert!(got.3 == want.3 || (got.3 == "shim" && want.3 == "driver"), "{version} {env:?} {key:?}: {got:?}");
                hooked += (got.3 == "shim") as usize;
            }
            // what the shim always counts is its own, for every caller
            let limit_set = env.iter().any(|(k, _)| *k != "GPUSHIM_VISIBLE_DEVICES");
            for (name, v, flags, variant) in [
                ("cuMemAlloc", "3020", "0", "cuMemAlloc_v2"),
                ("cuMemAlloc", "12090", "2", "cuMemAlloc_v2"),
                ("cuMemFree", "13000", "0", "cuMemFree_v2"),
                ("cuMemGetInfo", "12000", "0", "cuMemGetInfo_v2"),
                ("cuMemAllocAsync", "12000", "2", "cuMemAllocAsync_ptsz"),
                ("cuMemAllocAsync", "12000", "0", "cuMemAllocAsync"),
                ("cuMemCreate", "12000", "0", "cuMemCreate"),
                ("cuInit", "2000", "0", "cuInit"),
            ] {
                let key = ("gpa".to_string(), name.to_string(), v.to_string(), flags.to_string());
                assert_eq!((shim[&key].2.as_str(), shim[&key].3.as_str()), (variant, "shim"), "{version} {env:?} {key:?}");
            }
            for teardown in ["cuCtxDestroy", "cuDevicePrimaryCtxReset"] {
                let key = ("gpa".to_string(), teardown.to_string(), "12000".to_string(), "0".to_string());
                assert_eq!(shim[&key].3, if limit_set { "shim" } else { "driver" }, "{version} {env:?} {key:?}");
            }
            for unhooked in ["cuLaunchKernel", "cuModuleLoadData", "cuStreamCreate"] {
                let key = ("gpa".to_string(), unhooked.to_string(), "12000".to_string(), "2".to_string());
                assert_eq!(shim[&key].3, truth[&key].3, "{version} {env:?} {key:?}: the driver's own");
            }
            assert!(hooked > 100, "{version} {env:?}: only {hooked} answers were the shim's");
        }
    }
}

#[test]
fn export_tables_are_the_drivers_own_size_with_virtual_devices() {
    for (version, dir) in drivers() {
        let truth = run_real(&dir, &program(Program::RealDriver), &["tables"], false, &[]);
        let truth = text(&truth.stdout);
        assert!(truth.contains("table 6bd5fb6c 0 ") && truth.ends_with("done=1\n"), "{version}: {truth}");
        for env in [&[("GPUSHIM_VIRTUAL_DEVICES", "0:2x1GiB")][..], &[("GPUSHIM_MEMORY_LIMIT", "50%")][..]] {
            let out = run_real(&dir, &program(Program::RealDriver), &["tables"], true, env);
            assert_eq!(text(&out.stdout), truth, "{version} {env:?}");
            assert_eq!(text(&out.stderr), "", "{version} {env:?}");
        }
    }
}

/// Every kind of setting, on a machine whose driver finds no device.
const SETTINGS: [&[(&str, &str)]; 10] = [
    &[],
    &[("GPUSHIM_MEMORY_LIMIT", "1GiB")],
    &[("GPUSHIM_MEMORY_LIMIT", "40%"), ("GPUSHIM_MEMORY_LIMIT_1", "2GiB")],
    &[("GPUSHIM_VISIBLE_DEVICES", "0")],
    &[("GPUSHIM_VISIBLE_DEVICES", "none")],
    &[("GPUSHIM_VIRTUAL_DEVICES", "0:2x1GiB")],
    &[("GPUSHIM_MEMORY_LIMIT", "1GiB"), ("GPUSHIM_MEMORY_MODE", "grow")],
    &[("GPUSHIM_MEMORY_LIMIT", "1GiB"), ("GPUSHIM_MEMORY_MODE", "preallocate")],
    &[("GPUSHIM_MEMORY_LIMIT", "1GiB"), ("GPUSHIM_SHARED_QUOTA", "real")],
    &[("GPUSHIM_MEMORY_LIMIT", "1GiB"), ("GPUSHIM_REPORT", "stderr")],
];

#[test]
fn without_a_device_every_setting_gives_the_drivers_own_answers_quietly() {
    let runtime = program(Program::Runtime { major: 12, ptsz: false });
    for (version, dir) in drivers() {
        let init = |shim, env| text(&run_real(&dir, &program(Program::RealDriver), &["init"], shim, env).stdout);
        let rt = |shim, env| run_real(&dir, &runtime, &["info"], shim, env);
        let smi = |shim, env, args: &[&str]| run_real(&dir, &dir.join("bin/nvidia-smi"), args, shim, env);
        let want_init = init(false, &[]);
        assert!(want_init.contains("init.rc=100\n"), "{version}: {want_init}");
        let want_rt = rt(false, &[]);
        assert!(text(&want_rt.stdout).contains("init.rc=100\n"), "{version}: {}", text(&want_rt.stdout));
        let query = ["--query-gpu=index,uuid,name,memory.total,memory.used", "--format=csv"];
        let want_smi = [smi(false, &[], &[]), smi(false, &[], &query)];
        assert_eq!(want_smi[0].status.code(), Some(9), "{version}: {}", text(&want_smi[0].stdout));
        for env in SETTINGS {
            if env.iter().any(|(k, _)| *k == "GPUSHIM_REPORT") {
                continue; // the report is asked-for output: checked below
            }
            assert_eq!(init(true, env), want_init, "{version} {env:?}");
            let got = rt(true, env);
            assert_eq!(text(&got.stdout), text(&want_rt.stdout), "{version} {env:?}: the runtime");
            assert_eq!(text(&got.stderr), text(&want_rt.stderr), "{version} {env:?}: the runtime's stderr");
            for (i, args) in [&[][..], &query[..]].into_iter().enumerate() {
                let got = smi(true, env, args);
                assert_eq!(got.status.code(), want_smi[i].status.code(), "{version} {env:?} nvidia-smi {args:?}");
                assert_eq!(text(&got.stdout), text(&want_smi[i].stdout), "{version} {env:?} nvidia-smi {args:?}");
                assert_eq!(text(&got.stderr), text(&want_smi[i].stderr), "{version} {env:?} nvidia-smi {args:?}");
            }
        }
    }
}
