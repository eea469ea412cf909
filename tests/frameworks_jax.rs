//! JAX 0.10.2 (`jax[cuda12]`, XLA's CUDA 12 plugin) on the simulated driver, from the virtual
//! environment `scripts/fetch-frameworks.sh` makes in `.deps/jax/venv`. The simulator runs no
//! kernels, so the probe only places a host array on each device (`jax.device_put`), which
//! makes XLA's allocator take its preallocation: by default 75 % of the memory the device shows
//! (`XLA_PYTHON_CLIENT_MEM_FRACTION` changes the share) in one allocation. Under the shim the
//! device shows the limit, so the preallocation is 75 % of the limit and stays within it.
//! Checked against the simulated driver's own record of what it held; without the shim the
//! same program takes 75 % of the whole GPU.

mod common;

use common::*;
use std::path::PathBuf;

const GIB: u64 = 1 << 30;

fn venv_python() -> PathBuf {
    common::venv_python("jax", "JAX is")
}

/// Per device JAX shows: `limitI` (its allocator's `bytes_limit`) after a `device_put`.
///
/// JAX tries its CUDA backend only where a GPU's device node exists (`/dev/nvidia0`,
/// `/dev/nvidiactl` or `/dev/dxg`: `jax._src.hardware_utils.has_visible_nvidia_gpu`), and
/// falls back to the CPU without a word otherwise. The simulated driver has no device node, and
/// a machine without a GPU (CI's) has none either: the probe answers that check itself, so the
/// CUDA backend is tried on the simulated driver wherever the tests run.
const PROBE: &str = r#"
import numpy as np, jax
from jax._src import hardware_utils
hardware_utils.has_visible_nvidia_gpu = lambda: True
ds = jax.devices()
print("count=%d" % len(ds))
print("gpu=%d" % all(d.platform == "gpu" for d in ds))
for d in ds:
    jax.device_put(np.zeros(1024, dtype=np.float32), d).block_until_ready()
    print("limit%d=%d" % (d.id, d.memory_stats()["bytes_limit"]))
print("done=1")
"#;

fn jax_run(shim: bool, env: &[(&str, &str)]) -> RunOutput {
    let out = Run::new(venv_python())
        .arg("-c")
        .arg(PROBE)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("GPUSIM_DEVICES", "2")
        .env("GPUSIM_MEMORY", "16GiB")
        .envs(env)
        .shim(shim)
        .run();
    out.assert_completed();
    assert_eq!(out.num("gpu"), 1, "JAX fell back to its CPU\n{}", out.dump());
    out
}

#[test]
fn xla_preallocation_stays_within_the_limit() {
    let alone = jax_run(false, &[]);
    assert_eq!(alone.num("count"), 2, "{}", alone.dump());
    for d in 0..2 {
        assert_eq!(alone.u64(&format!("limit{d}")), 12 * GIB, "75% of 16 GiB\n{}", alone.dump());
        assert!(alone.report().device(d).peak >= 12 * GIB, "without the shim XLA takes 12 GiB of GPU {d}");
    }
    let out = jax_run(true, &[("GPUSHIM_MEMORY_LIMIT", "4GiB")]);
    assert_eq!(out.num("count"), 2, "{}", out.dump());
    for d in 0..2 {
        assert_eq!(out.u64(&format!("limit{d}")), 3 * GIB, "75% of the 4 GiB limit\n{}", out.dump());
        let peak = out.report().device(d).peak;
        assert!((3 * GIB..=4 * GIB).contains(&peak), "GPU {d}: the driver held {peak} bytes\n{}", out.dump());
    }
}

#[test]
fn xla_client_mem_fraction_composes_with_the_limit() {
    let out = jax_run(true, &[("GPUSHIM_MEMORY_LIMIT", "4GiB"), ("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")]);
    for d in 0..2 {
        assert_eq!(out.u64(&format!("limit{d}")), 2 * GIB, "half of the 4 GiB limit\n{}", out.dump());
        assert!(out.report().device(d).peak <= 4 * GIB, "{}", out.dump());
    }
}

#[test]
fn jax_devices_follow_the_view() {
    let out = jax_run(true, &[("GPUSHIM_VISIBLE_DEVICES", "1"), ("GPUSHIM_MEMORY_LIMIT", "2GiB")]);
    assert_eq!(out.num("count"), 1, "{}", out.dump());
    assert_eq!(out.u64("limit0"), 3 * GIB / 2, "75% of 2 GiB\n{}", out.dump());
    let report = out.report();
    assert!(report.device(1).peak >= 3 * GIB / 2 && report.device(1).peak <= 2 * GIB, "JAX's device 0 is GPU 1\n{}", out.dump());
    assert_eq!(report.device(0).peak, 0, "nothing on the hidden GPU 0\n{}", out.dump());
}
