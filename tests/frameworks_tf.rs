//! TensorFlow 2.21.0 (`tensorflow[and-cuda]`, CUDA 12 wheels) on the simulated driver, from the
//! virtual environment `scripts/fetch-frameworks.sh` makes in `.deps/tf/venv`. The simulator runs
//! no kernels; placing a constant on the GPU makes TensorFlow's BFC allocator take its region:
//! almost all the memory the GPU shows free (what `cuMemGetInfo` says, minus a reserve), in one
//! allocation. Under the shim the GPU shows its limit, so the region stays within it. Checked
//! against the simulated driver's own record (per process, and node-wide for two processes).
//! TensorFlow's pip build does not put `nvidia/cusolver/lib` on its search path: the probe loads
//! `libcusolver.so.11` by path first, as its users do, else TensorFlow registers no GPU.

mod common;

use common::*;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const GIB: u64 = 1 << 30;
/// 16 GiB simulated GPUs.
const GPU: u64 = 16 * GIB;

fn venv_python() -> PathBuf {
    common::venv_python("tf", "TensorFlow is")
}

/// `count` (GPUs TensorFlow lists), `device` (where a constant landed), then, with `HOLD=P`, it
/// creates `P.ready` and waits (up to 60 s) for `P.release`.
const PROBE: &str = r#"
import os, ctypes, glob, sys
site = [p for p in sys.path if p.endswith("site-packages")][0]
for lib in glob.glob(os.path.join(site, "nvidia/cusolver/lib/libcusolver.so.11")):
    ctypes.CDLL(lib)
import tensorflow as tf
gpus = tf.config.list_physical_devices('GPU')
print("count=%d" % len(gpus))
if gpus:
    with tf.device('/GPU:0'):
        x = tf.constant([1.0, 2.0])
    print("device=%s" % x.device.split("device:")[-1])
hold = os.environ.get("HOLD")
if hold:
    import time
    open(hold + ".ready", "w").close()
    for _ in range(600):
        if os.path.exists(hold + ".release"):
            break
        time.sleep(0.1)
print("done=1")
"#;

fn tf_run(shim: bool, env: &[(&str, &str)]) -> RunOutput {
    let out = Run::new(venv_python())
        .arg("-c")
        .arg(PROBE)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("TF_CPP_MIN_LOG_LEVEL", "3")
        .env("GPUSIM_MEMORY", "16GiB")
        .envs(env)
        .shim(shim)
        .run();
    out.assert_completed();
    out
}

#[test]
fn the_default_allocator_stays_within_the_limit() {
    let alone = tf_run(false, &[("GPUSIM_DEVICES", "1")]);
    assert_eq!((alone.num("count"), alone.get("device")), (1, "GPU:0"), "{}", alone.dump());
    let peak = alone.report().device(0).peak;
    assert!(peak > GPU * 8 / 10, "without the shim TensorFlow takes almost the whole GPU ({peak})");
    let out = tf_run(true, &[("GPUSIM_DEVICES", "1"), ("GPUSHIM_MEMORY_LIMIT", "40%")]);
    assert_eq!((out.num("count"), out.get("device")), (1, "GPU:0"), "{}", out.dump());
    let peak = out.report().device(0).peak;
    assert!(peak <= GPU * 4 / 10 && peak > GPU / 4, "40% of the GPU at most, most of it taken ({peak})\n{}", out.dump());
}

/// The scenario TensorFlow users know: two processes on one GPU. Without the shim the first
/// takes almost all of it and the second gets what is left (TensorFlow sizes its region by
/// what is free); with `GPUSHIM_MEMORY_LIMIT=40%` each gets its 40 %.
#[test]
fn two_processes_side_by_side_on_one_gpu() {
    for shim in [false, true] {
        let dir = fresh_dir(&format!("tf-side-by-side-{shim}"));
        let node = dir.join("node");
        let hold = dir.join("first");
        let mut first = Command::new(venv_python());
        first
            .arg("-c")
            .arg(PROBE)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", std::env::var_os("HOME").unwrap_or_default())
            .env("LD_LIBRARY_PATH", sim_dir())
            .env("TF_CPP_MIN_LOG_LEVEL", "3")
            .env("GPUSIM_DEVICES", "1")
            .env("GPUSIM_MEMORY", "16GiB")
            .env("GPUSIM_NODE_STATE", &node)
            // (a state directory of its own, as every run's: not the default /tmp/gpushim-UID)
            .env("GPUSHIM_STATE_DIR", dir.join("state"))
            .env("HOLD", &hold)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if shim {
            first.env("LD_PRELOAD", shim_path()).env("GPUSHIM_MEMORY_LIMIT", "40%");
        }
        let mut first = first.spawn().expect("start the first TensorFlow");
        let ready = hold.with_extension("ready");
        let deadline = Instant::now() + Duration::from_secs(120);
        while !ready.exists() {
            assert!(Instant::now() < deadline, "the first TensorFlow never got its GPU");
            std::thread::sleep(Duration::from_millis(50));
        }
        let node_s = node.display().to_string();
        let mut env = vec![("GPUSIM_DEVICES", "1"), ("GPUSIM_NODE_STATE", node_s.as_str())];
        if shim {
            env.push(("GPUSHIM_MEMORY_LIMIT", "40%"));
        }
        let second = tf_run(shim, &env);
        std::fs::write(hold.with_extension("release"), "").unwrap();
        let _ = first.wait();
        assert_eq!((second.num("count"), second.get("device")), (1, "GPU:0"), "{}", second.dump());
        let (peak, node_peak) = (second.report().device(0).peak, second.report().device(0).node_peak.unwrap());
        if shim {
            assert!(peak > GPU / 4 && peak <= GPU * 4 / 10, "the second gets its 40% ({peak})\n{}", second.dump());
            assert!(node_peak <= GPU * 8 / 10, "the two together hold at most 80% ({node_peak})");
        } else {
            assert!(peak < 2 * GIB, "without the shim the second gets only what the first left ({peak})\n{}", second.dump());
            assert!(node_peak > GPU * 9 / 10, "the first took almost all ({node_peak})");
        }
    }
}

#[test]
fn gpus_follow_the_view_and_virtual_devices() {
    let out = tf_run(true, &[("GPUSIM_DEVICES", "2"), ("GPUSHIM_VISIBLE_DEVICES", "1"), ("GPUSHIM_MEMORY_LIMIT", "4GiB")]);
    assert_eq!(out.num("count"), 1, "{}", out.dump());
    let r = out.report();
    assert!(r.device(1).peak > GIB && r.device(1).peak <= 4 * GIB, "TensorFlow's GPU:0 is GPU 1\n{}", out.dump());
    assert_eq!(r.device(0).peak, 0, "nothing on the hidden GPU 0\n{}", out.dump());
    let split = tf_run(true, &[("GPUSIM_DEVICES", "1"), ("GPUSHIM_VIRTUAL_DEVICES", "0:2x4GiB")]);
    assert_eq!(split.num("count"), 2, "two virtual devices are two TensorFlow GPUs\n{}", split.dump());
    assert!(split.report().device(0).peak <= 4 * GIB, "{}", split.dump());
}

/// TensorFlow asks for its whole region in one allocation, so `GPUSHIM_MEMORY_MODE=grow` cannot
/// make it grow (the shim cannot shrink a request); TensorFlow's own switch does, under the shim.
#[test]
fn allow_growth_is_tensorflows_own_switch() {
    let grow = tf_run(true, &[("GPUSIM_DEVICES", "1"), ("GPUSHIM_MEMORY_LIMIT", "40%"), ("GPUSHIM_MEMORY_MODE", "grow")]);
    assert!(grow.report().device(0).peak > GPU / 4, "grow mode serves TensorFlow's one big request\n{}", grow.dump());
    let growth = tf_run(true, &[("GPUSIM_DEVICES", "1"), ("GPUSHIM_MEMORY_LIMIT", "40%"), ("TF_FORCE_GPU_ALLOW_GROWTH", "true")]);
    assert_eq!(growth.get("device"), "GPU:0", "{}", growth.dump());
    assert!(growth.report().device(0).peak < 64 << 20, "allow_growth takes only what tensors need\n{}", growth.dump());
}
