//! A real Rust client: cudarc 0.19 (dynamic loading — it opens `libcuda.so` itself and resolves
//! every function with `dlsym`) allocating through the shim with its safe API.

mod common;

use common::*;

const GIB: u64 = 1 << 30;

fn client(shim: bool) -> RunOutput {
    let exe = profile_dir().join("cudarc-client");
    assert!(exe.is_file(), "{} is not built: run `cargo build --release --workspace`", exe.display());
    let out = Run::new(exe)
        .arg(GIB.to_string())
        .env("GPUSIM_DEVICES", "2")
        .env("GPUSIM_MEMORY", "16GiB")
        .env("GPUSHIM_MEMORY_LIMIT", "3GiB")
        .shim(shim)
        .run();
    out.assert_completed();
    out
}

#[test]
fn cudarc_allocations_are_limited() {
    let out = client(true);
    assert_eq!(out.get("device_count"), "2", "{}", out.dump());
    assert_eq!(out.u64("total_mem"), 3 * GIB, "{}", out.dump());
    assert_eq!(out.u64("meminfo_total"), 3 * GIB, "{}", out.dump());
    assert_eq!(out.u64("meminfo_free"), 3 * GIB, "{}", out.dump());
    assert_eq!(out.get("allocated_blocks"), "3", "{}", out.dump());
    assert_eq!(out.get("refusal"), "CUDA_ERROR_OUT_OF_MEMORY", "{}", out.dump());
    assert_eq!(out.u64("meminfo_free_full"), 0, "{}", out.dump());
    assert_eq!(out.get("retry"), "ok", "{}", out.dump());
    assert_eq!(out.get("zeroed"), "true", "{}", out.dump());
    assert_eq!(out.u64("meminfo_free_after"), 3 * GIB, "{}", out.dump());
    let warns = out.warn_lines();
    assert_eq!(warns.len(), 1, "{}", out.dump());
    assert_mentions_device(&warns[0], 0);
    assert_mentions_numbers(&warns[0], &[GIB, 3 * GIB]);
    let dev = out.report().device(0);
    assert_eq!(dev.peak, 3 * GIB, "{}", out.dump());
    assert_eq!(dev.used, 0, "{}", out.dump());
}

#[test]
fn cudarc_without_the_shim_gets_the_whole_device() {
    let out = client(false);
    assert_eq!(out.u64("total_mem"), 16 * GIB, "{}", out.dump());
    assert_eq!(out.get("allocated_blocks"), "16", "{}", out.dump());
    assert_eq!(out.report().device(0).peak, 16 * GIB, "{}", out.dump());
}
