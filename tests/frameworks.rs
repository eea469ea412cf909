//! Real frameworks on the simulated driver: PyTorch 2.15.0 (PyPI's CUDA 13.2 build) and CuPy
//! 14.2.0 (`cupy-cuda12x`, runtime linked statically), from the virtual environment
//! `scripts/fetch-frameworks.sh` makes in `.deps/frameworks/venv`. The simulator runs no
//! kernels, so only what allocates and what queries devices is exercised: PyTorch's caching
//! allocator (default, `backend:cudaMallocAsync`, `expandable_segments:True`), `mem_get_info`,
//! `OutOfMemoryError` and its message, device properties, `set_per_process_memory_fraction`;
//! CuPy's default pool, `MemoryAsyncPool`, managed memory and `cupy.cuda.runtime` queries.
//!
//! Every limit test also runs without the shim, where the same fill goes far past the limit
//! (up to a cap), so it can fail. The simulated GPUs have 16 GiB; the limit is 1 GiB; the fills
//! take 64 MiB chunks (a multiple of every rounding PyTorch's allocator applies, so exactly
//! 16 fit in 1 GiB; with `expandable_segments` the segment is mapped in 20 MiB pages, so the
//! last chunk may not fit: one chunk less).

mod common;

use common::*;
use std::path::PathBuf;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const CHUNK: u64 = 64 * MIB;
const LIMIT: u64 = GIB;
/// How far a fill goes at most (without the shim it gets all of it).
const CAP: u64 = 2 * GIB;

fn venv_python() -> PathBuf {
    common::venv_python("frameworks", "PyTorch/CuPy are")
}

fn framework_run(script: &str) -> Run {
    Run::new(venv_python())
        .arg("-c")
        .arg(script)
        .env("PYTHONDONTWRITEBYTECODE", "1")
}

/// Prints what PyTorch sees (`avail`, `count`, per device `nameI`, `uuidI`, `totalI`), then for
/// each device of `PROBE_FILL` (default `0`): `freeI`/`memtotalI` (`mem_get_info`), and fills
/// it with `torch.empty` chunks of `PROBE_CHUNK` bytes up to `PROBE_CAP` bytes, `PROBE_ROUNDS`
/// times (freeing and `empty_cache` between rounds unless `PROBE_KEEP=1`): `oomI`, `msgI` (the
/// `OutOfMemoryError` text on one line), `obtainedI`. `PROBE_FRACTION`: first
/// `set_per_process_memory_fraction` on the device.
const TORCH_PROBE: &str = r#"
import os, sys, torch
avail = torch.cuda.is_available()
print("avail=%d" % avail)
if not avail:
    print("done=1")
    sys.exit(0)
n = torch.cuda.device_count()
print("count=%d" % n)
for i in range(n):
    p = torch.cuda.get_device_properties(i)
    print("name%d=%s" % (i, torch.cuda.get_device_name(i)))
    print("uuid%d=GPU-%s" % (i, p.uuid))
    print("total%d=%d" % (i, p.total_memory))
fraction = os.environ.get("PROBE_FRACTION")
chunk = int(os.environ.get("PROBE_CHUNK", str(64 << 20)))
cap = int(os.environ.get("PROBE_CAP", str(2 << 30)))
rounds = int(os.environ.get("PROBE_ROUNDS", "1"))
keep = os.environ.get("PROBE_KEEP") == "1"
kept = []
for d in [int(x) for x in os.environ.get("PROBE_FILL", "0").split(",") if x]:
    if fraction:
        torch.cuda.set_per_process_memory_fraction(float(fraction), d)
    free, total = torch.cuda.mem_get_info(d)
    print("free%d=%d" % (d, free))
    print("memtotal%d=%d" % (d, total))
    for r in range(rounds):
        chunks, oom = [], 0
        try:
            while (len(chunks) + 1) * chunk <= cap:
                chunks.append(torch.empty(chunk, dtype=torch.uint8, device="cuda:%d" % d))
        except torch.OutOfMemoryError as e:
            oom = 1
            print("msg%d=%s" % (d, " ".join(str(e).split())))
        print("oom%d=%d" % (d, oom))
        print("obtained%d=%d" % (d, len(chunks) * chunk))
        if keep:
            kept.extend(chunks)
        del chunks
        torch.cuda.empty_cache()
print("done=1")
"#;

fn torch_run() -> Run {
    framework_run(TORCH_PROBE)
}

/// The same for CuPy: `count`, per device `nameI`, `uuidI` (`GPU-` + hex), `totalI`
/// (`getDeviceProperties`), then on device 0 with the allocator `PROBE_ALLOC` (`default`: the
/// default memory pool; `async`: `MemoryAsyncPool`; `managed`: a pool over `malloc_managed`):
/// `free0`/`memtotal0` (`memGetInfo`), and the fill: `oom0`, `msg0`, `obtained0`.
const CUPY_PROBE: &str = r#"
import os, cupy
rt = cupy.cuda.runtime
n = rt.getDeviceCount()
print("count=%d" % n)
for i in range(n):
    p = rt.getDeviceProperties(i)
    print("name%d=%s" % (i, p["name"].decode()))
    u = bytes(p["uuid"]).hex()
    print("uuid%d=GPU-%s-%s-%s-%s-%s" % (i, u[0:8], u[8:12], u[12:16], u[16:20], u[20:32]))
    print("total%d=%d" % (i, p["totalGlobalMem"]))
kind = os.environ.get("PROBE_ALLOC", "default")
if kind == "async":
    cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool().malloc)
elif kind == "managed":
    cupy.cuda.set_allocator(cupy.cuda.MemoryPool(cupy.cuda.malloc_managed).malloc)
free, total = rt.memGetInfo()
print("free0=%d" % free)
print("memtotal0=%d" % total)
chunk, cap = 64 << 20, 2 << 30
chunks, oom = [], 0
try:
    while (len(chunks) + 1) * chunk <= cap:
        chunks.append(cupy.empty(chunk, dtype=cupy.uint8))
except cupy.cuda.memory.OutOfMemoryError as e:
    oom = 1
    print("msg0=%s" % " ".join(str(e).split()))
print("oom0=%d" % oom)
print("obtained0=%d" % (len(chunks) * chunk))
print("done=1")
"#;

fn cupy_run() -> Run {
    framework_run(CUPY_PROBE)
}

/// Without the shim, the fill of device 0 takes the whole cap (the simulated GPU has 16 GiB).
fn assert_unlimited_fill(out: &RunOutput) {
    out.assert_completed();
    out.assert_u64("memtotal0", 16 * GIB, "mem_get_info total without the shim");
    out.assert_num("oom0", 0, "no out-of-memory without the shim");
    out.assert_u64("obtained0", CAP, "the whole fill without the shim");
    assert!(out.report().device(0).peak >= CAP, "{}", out.dump());
}

/// With the 1 GiB limit: the program sees 1 GiB, the fill stops with an out-of-memory error
/// between one chunk below the limit and the limit, the driver never held more than the limit,
/// and the shim said why.
fn assert_limited_fill(out: &RunOutput, min_obtained: u64) {
    out.assert_completed();
    out.assert_u64("memtotal0", LIMIT, "mem_get_info total = the limit");
    out.assert_u64("free0", LIMIT, "mem_get_info free before the fill");
    out.assert_num("oom0", 1, "the fill ends with an out-of-memory error");
    let got = out.u64("obtained0");
    assert!(
        (min_obtained..=LIMIT).contains(&got),
        "obtained {got}, expected {min_obtained}..={LIMIT}\n{}",
        out.dump()
    );
    let peak = out.report().device(0).peak;
    assert!(peak <= LIMIT, "driver peak {peak} above the limit\n{}", out.dump());
    let warns = out.warn_lines();
    assert!(!warns.is_empty(), "no refusal logged\n{}", out.dump());
    assert_mentions_device(&warns[0], 0);
    assert_mentions_numbers(&warns[0], &[LIMIT]);
}

// ---------------------------------------------------------------------------------------
// PyTorch: limits
// ---------------------------------------------------------------------------------------

/// `alloc_conf`: `PYTORCH_CUDA_ALLOC_CONF`, or None for the default caching allocator.
fn torch_limit(alloc_conf: Option<&str>, min_obtained: u64, message: &[&str]) {
    let run = |shim: bool| {
        let mut r = torch_run().shim(shim).env("GPUSHIM_MEMORY_LIMIT", "1GiB");
        if let Some(c) = alloc_conf {
            r = r.env("PYTORCH_CUDA_ALLOC_CONF", c);
        }
        r.run()
    };
    assert_unlimited_fill(&run(false));
    let out = run(true);
    out.assert_u64("total0", LIMIT, "total_memory = the limit");
    assert_limited_fill(&out, min_obtained);
    let msg = out.get("msg0");
    for m in message {
        assert!(msg.contains(m), "OutOfMemoryError `{msg}` lacks `{m}`\n{}", out.dump());
    }
}

#[test]
fn torch_caching_allocator_stops_at_the_limit() {
    // "GPU 0 has a total capacity of 1024.00 MiB of which 0 bytes is free."
    torch_limit(
        None,
        LIMIT,
        &["Tried to allocate 64.00 MiB", "total capacity of 1024.00 MiB", "of which 0 bytes is free"],
    );
}

#[test]
fn torch_cuda_malloc_async_stops_at_the_limit() {
    // "Allocation on device 0 would exceed allowed memory. (out of memory) Currently allocated
    // : 1024.00 MiB Requested : 64.00 MiB Device limit : 1024.00 MiB Free (according to CUDA):
    // 0 bytes"
    torch_limit(
        Some("backend:cudaMallocAsync"),
        LIMIT,
        &["Device limit : 1024.00 MiB", "Requested : 64.00 MiB", "Free (according to CUDA): 0 bytes"],
    );
}

#[test]
fn torch_expandable_segments_stop_at_the_limit() {
    // Expandable segments map 20 MiB pages: 64 MiB chunks end one short of 1 GiB (960 MiB
    // obtained, the 61st..64th MiB mapped and given back on failure).
    torch_limit(
        Some("expandable_segments:True"),
        LIMIT - CHUNK,
        &["Tried to allocate 64.00 MiB", "total capacity of 1024.00 MiB", "expandable_segments is enabled"],
    );
}

#[test]
fn torch_memory_fraction_takes_a_share_of_the_limit() {
    let run = |shim: bool| {
        torch_run()
            .shim(shim)
            .env("GPUSHIM_MEMORY_LIMIT", "1GiB")
            .env("PROBE_FRACTION", "0.5")
            .run()
    };
    // without the shim: half of 16 GiB, more than the 2 GiB fill
    let plain = run(false);
    plain.assert_completed();
    plain.assert_num("oom0", 0, "half of 16 GiB is more than the fill");
    plain.assert_u64("obtained0", CAP, "the whole fill without the shim");
    let out = run(true);
    out.assert_completed();
    out.assert_num("oom0", 1, "out of memory at half the limit");
    out.assert_u64("obtained0", LIMIT / 2, "half of the 1 GiB limit");
    assert!(out.get("msg0").contains("512.00 MiB allowed"), "{}", out.dump());
    // PyTorch refused by itself: the driver held half the limit, the shim refused nothing
    assert_eq!(out.report().device(0).peak, LIMIT / 2, "{}", out.dump());
    assert!(out.warn_lines().is_empty(), "{}", out.dump());
}

// ---------------------------------------------------------------------------------------
// PyTorch: memory modes
// ---------------------------------------------------------------------------------------

/// Two fills of 1 GiB with `empty_cache()` between them in each memory mode: the same 1 GiB
/// each time; in `grow` and `preallocate` the driver never gets memory back (0 frees), in
/// `preallocate` it saw one allocation of the whole limit.
#[test]
fn torch_memory_modes() {
    for mode in MemoryMode::selected(&MemoryMode::ALL) {
        let out = torch_run()
            .mode(mode)
            .env("GPUSHIM_MEMORY_LIMIT", "1GiB")
            .env("PROBE_ROUNDS", "2")
            .run();
        if !mode.shim() {
            assert_unlimited_fill(&out);
            continue;
        }
        assert_limited_fill(&out, LIMIT);
        out.assert_u64("obtained0", LIMIT, &format!("{mode:?}: the whole limit"));
        let dev = out.report().device(0);
        match mode {
            MemoryMode::Passthrough => {
                assert_eq!(dev.allocs, 2 * LIMIT / CHUNK, "{mode:?}\n{}", out.dump());
                assert_eq!(dev.frees, dev.allocs, "{mode:?}: empty_cache frees\n{}", out.dump());
            }
            MemoryMode::Grow => {
                assert!(dev.allocs >= 1, "{}", out.dump());
                assert_eq!(dev.frees, 0, "grow never gives memory back\n{}", out.dump());
                assert_eq!(dev.peak, LIMIT, "{}", out.dump());
            }
            MemoryMode::Preallocate => {
                assert_eq!(dev.allocs, 1, "one reservation of the limit\n{}", out.dump());
                assert_eq!(dev.frees, 0, "{}", out.dump());
                assert_eq!(dev.peak, LIMIT, "{}", out.dump());
            }
            MemoryMode::NoShim => unreachable!(),
        }
    }
}

// ---------------------------------------------------------------------------------------
// PyTorch: device views
// ---------------------------------------------------------------------------------------

#[test]
fn torch_sees_the_shims_view() {
    // 4 GPUs; the program sees physical 2 then 0, device 1 limited to 2 GiB
    let run = |shim: bool| {
        torch_run()
            .shim(shim)
            .env("GPUSIM_DEVICES", "4")
            .env("GPUSHIM_VISIBLE_DEVICES", "2,0")
            .env("GPUSHIM_MEMORY_LIMIT_1", "2GiB")
            .env("PROBE_FILL", "0,1")
            .env("PROBE_CAP", (3 * GIB).to_string())
            .run()
    };
    let plain = run(false);
    plain.assert_completed();
    plain.assert_num("count", 4, "all 4 GPUs without the shim");
    plain.assert_str("name0", &phys_name(0), "physical order without the shim");
    plain.assert_u64("obtained1", 3 * GIB, "no limit without the shim");

    let out = run(true);
    out.assert_completed();
    out.assert_num("count", 2, "torch.cuda.device_count()");
    for (i, p) in [(0, 2), (1, 0)] {
        out.assert_str(&format!("name{i}"), &phys_name(p), "get_device_name");
        out.assert_str(&format!("uuid{i}"), &phys_uuid(p), "get_device_properties().uuid");
    }
    out.assert_u64("total0", 16 * GIB, "device 0 unlimited");
    out.assert_u64("total1", 2 * GIB, "device 1 limited by GPUSHIM_MEMORY_LIMIT_1");
    out.assert_u64("memtotal1", 2 * GIB, "mem_get_info of device 1");
    out.assert_num("oom0", 0, "device 0 takes the whole fill");
    out.assert_u64("obtained0", 3 * GIB, "device 0 fill");
    out.assert_num("oom1", 1, "device 1 stops at its limit");
    out.assert_u64("obtained1", 2 * GIB, "device 1 fill");
    // the allocations landed on the physical devices the program's ordinals name
    let r = out.report();
    assert_eq!(r.device(2).peak, 3 * GIB, "{}", out.dump());
    assert_eq!(r.device(0).peak, 2 * GIB, "{}", out.dump());
    assert_eq!(r.device(1).peak + r.device(3).peak, 0, "{}", out.dump());
}

#[test]
fn torch_view_composes_with_cuda_visible_devices() {
    // CUDA_VISIBLE_DEVICES=3,2,0 shows physical 3, 2, 0; the shim's 2,0 picks physical 0, 3.
    // PyTorch counts devices through NVML and parses CUDA_VISIBLE_DEVICES itself.
    let run = |shim: bool| {
        torch_run()
            .shim(shim)
            .env("GPUSIM_DEVICES", "4")
            .env("CUDA_VISIBLE_DEVICES", "3,2,0")
            .env("GPUSHIM_VISIBLE_DEVICES", "2,0")
            .env("PROBE_FILL", "1")
            .env("PROBE_CAP", GIB.to_string())
            .run()
    };
    let plain = run(false);
    plain.assert_completed();
    plain.assert_num("count", 3, "CUDA_VISIBLE_DEVICES alone");
    for (i, p) in [(0, 3), (1, 2), (2, 0)] {
        plain.assert_str(&format!("uuid{i}"), &phys_uuid(p), "CUDA_VISIBLE_DEVICES order");
    }
    let out = run(true);
    out.assert_completed();
    out.assert_num("count", 2, "torch.cuda.device_count()");
    for (i, p) in [(0, 0), (1, 3)] {
        out.assert_str(&format!("name{i}"), &phys_name(p), "get_device_name");
        out.assert_str(&format!("uuid{i}"), &phys_uuid(p), "uuid");
        out.assert_u64(&format!("total{i}"), 16 * GIB, "total_memory");
    }
    out.assert_u64("obtained1", GIB, "fill of the program's device 1");
    assert_eq!(out.report().device(3).peak, GIB, "device 1 is physical 3\n{}", out.dump());
}

#[test]
fn torch_view_composes_with_cuda_visible_devices_by_uuid() {
    // the same with CUDA_VISIBLE_DEVICES as UUID prefixes (PyTorch matches them against NVML's
    // UUIDs itself) and a UUID-prefix selector for the shim
    let cvd = [3, 2, 0].map(|p| phys_uuid(p)[..12].to_string()).join(",");
    let run = |shim: bool| {
        torch_run()
            .shim(shim)
            .env("GPUSIM_DEVICES", "4")
            .env("CUDA_VISIBLE_DEVICES", &cvd)
            .env("GPUSHIM_VISIBLE_DEVICES", format!("{},1", &phys_uuid(0)[..8]))
            .env("PROBE_FILL", "")
            .run()
    };
    let plain = run(false);
    plain.assert_completed();
    plain.assert_num("count", 3, "CUDA_VISIBLE_DEVICES alone");
    plain.assert_str("uuid0", &phys_uuid(3), "CUDA_VISIBLE_DEVICES order");
    let out = run(true);
    out.assert_completed();
    out.assert_num("count", 2, "torch.cuda.device_count()");
    out.assert_str("uuid0", &phys_uuid(0), "selected by UUID prefix");
    out.assert_str("uuid1", &phys_uuid(2), "ordinal 1 of CUDA_VISIBLE_DEVICES");
}

#[test]
fn torch_virtual_devices() {
    // physical 0 split into two 3 GiB devices, physical 1 whole: 3 devices; fill both parts
    // (keeping the memory) with 512 MiB chunks up to 4 GiB each
    let run = |shim: bool| {
        torch_run()
            .shim(shim)
            .env("GPUSHIM_VIRTUAL_DEVICES", "0:2x3GiB")
            .env("PROBE_FILL", "0,1")
            .env("PROBE_KEEP", "1")
            .env("PROBE_CHUNK", (512 * MIB).to_string())
            .env("PROBE_CAP", (4 * GIB).to_string())
            .run()
    };
    let plain = run(false);
    plain.assert_completed();
    plain.assert_num("count", 2, "two GPUs without the shim");
    plain.assert_u64("obtained0", 4 * GIB, "no limit without the shim");
    plain.assert_u64("obtained1", 4 * GIB, "no limit without the shim");

    let out = run(true);
    out.assert_completed();
    out.assert_num("count", 3, "two parts and the whole second GPU");
    for (i, p, total) in [(0, 0, 3 * GIB), (1, 0, 3 * GIB), (2, 1, 16 * GIB)] {
        out.assert_str(&format!("name{i}"), &phys_name(p), "get_device_name");
        out.assert_u64(&format!("total{i}"), total, "total_memory");
    }
    // parts have UUIDs of their own, different from each other and from the GPU's
    let uuids: Vec<&str> = (0..3).map(|i| out.get(&format!("uuid{i}"))).collect();
    assert_ne!(uuids[0], uuids[1], "{}", out.dump());
    assert_ne!(uuids[0], phys_uuid(0), "{}", out.dump());
    assert_eq!(uuids[2], phys_uuid(1), "{}", out.dump());
    for i in 0..2 {
        out.assert_u64(&format!("memtotal{i}"), 3 * GIB, "mem_get_info of a part");
        out.assert_num(&format!("oom{i}"), 1, "a part stops at its size");
        out.assert_u64(&format!("obtained{i}"), 3 * GIB, "a part fills to its size");
    }
    assert_eq!(out.report().device(0).peak, 6 * GIB, "both parts on physical 0\n{}", out.dump());
    assert_eq!(out.report().device(1).peak, 0, "{}", out.dump());
}

#[test]
fn torch_bad_setting_fails_closed() {
    let run = |shim: bool| torch_run().shim(shim).env("GPUSHIM_MEMORY_LIMIT", "banana").run();
    let plain = run(false);
    plain.assert_completed();
    plain.assert_num("avail", 1, "CUDA works without the shim");
    let out = run(true);
    out.assert_completed();
    out.assert_num("avail", 0, "torch.cuda.is_available() after a configuration error");
    let lines = out.gpushim_lines();
    assert_eq!(lines.len(), 1, "one gpushim line\n{}", out.dump());
    assert!(
        lines[0].starts_with("gpushim: GPUSHIM_MEMORY_LIMIT=\"banana\": "),
        "{}",
        out.dump()
    );
    assert_eq!(out.report().device(0).peak, 0, "{}", out.dump());
}

// ---------------------------------------------------------------------------------------
// CuPy
// ---------------------------------------------------------------------------------------

fn cupy_limit(alloc: &str) {
    let run = |shim: bool| {
        cupy_run()
            .shim(shim)
            .env("GPUSHIM_MEMORY_LIMIT", "1GiB")
            .env("PROBE_ALLOC", alloc)
            .run()
    };
    assert_unlimited_fill(&run(false));
    let out = run(true);
    out.assert_u64("total0", LIMIT, "totalGlobalMem = the limit");
    assert_limited_fill(&out, LIMIT);
    out.assert_u64("obtained0", LIMIT, "the whole limit");
    // "Out of memory allocating 67,108,864 bytes (allocated so far: 1,073,741,824 bytes…"
    let msg = out.get("msg0");
    assert!(
        msg.contains("Out of memory allocating 67,108,864 bytes (allocated so far: 1,073,741,824 bytes"),
        "{}",
        out.dump()
    );
}

#[test]
fn cupy_default_pool_stops_at_the_limit() {
    cupy_limit("default");
}

#[test]
fn cupy_memory_async_pool_stops_at_the_limit() {
    cupy_limit("async");
}

#[test]
fn cupy_managed_memory_stops_at_the_limit() {
    cupy_limit("managed");
}

#[test]
fn cupy_sees_the_shims_view() {
    let run = |shim: bool| {
        cupy_run()
            .shim(shim)
            .env("GPUSIM_DEVICES", "4")
            .env("GPUSHIM_VISIBLE_DEVICES", "2,0")
            .env("GPUSHIM_MEMORY_LIMIT_1", "2GiB")
            .run()
    };
    let plain = run(false);
    plain.assert_completed();
    plain.assert_num("count", 4, "all 4 GPUs without the shim");
    plain.assert_str("uuid0", &phys_uuid(0), "physical order without the shim");
    let out = run(true);
    out.assert_completed();
    out.assert_num("count", 2, "getDeviceCount");
    for (i, p, total) in [(0, 2, 16 * GIB), (1, 0, 2 * GIB)] {
        out.assert_str(&format!("name{i}"), &phys_name(p), "name");
        out.assert_str(&format!("uuid{i}"), &phys_uuid(p), "uuid");
        out.assert_u64(&format!("total{i}"), total, "totalGlobalMem");
    }
    // the fill of the program's device 0 (unlimited) lands on physical 2
    out.assert_u64("obtained0", CAP, "device 0 is not limited");
    assert_eq!(out.report().device(2).peak, CAP, "{}", out.dump());
    assert_eq!(out.report().device(0).peak, 0, "{}", out.dump());
}

/// The stream-ordered and VMM allocators of PyTorch in `grow` and `preallocate`: in `grow` they
/// are counted beside the reserve and fill to the limit as in `passthrough`; in `preallocate`
/// the reservation holds the whole limit for `cudaMalloc`-style allocations, so they get nothing
/// (documented in the README's memory modes) and the shim says to use `grow`.
#[test]
fn torch_alloc_conf_in_grow_and_preallocate() {
    for (conf, grow_min) in [("backend:cudaMallocAsync", LIMIT), ("expandable_segments:True", LIMIT - CHUNK)] {
        let run = |mode: MemoryMode| {
            torch_run()
                .mode(mode)
                .env("GPUSHIM_MEMORY_LIMIT", "1GiB")
                .env("PYTORCH_CUDA_ALLOC_CONF", conf)
                .run()
        };
        let grow = run(MemoryMode::Grow);
        assert_limited_fill(&grow, grow_min);

        let pre = run(MemoryMode::Preallocate);
        pre.assert_completed();
        pre.assert_num("oom0", 1, &format!("{conf} under preallocate"));
        pre.assert_u64("obtained0", 0, &format!("{conf} under preallocate"));
        assert_eq!(pre.report().device(0).peak, LIMIT, "the reservation\n{}", pre.dump());
        let hint = pre.gpushim_lines_with("use GPUSHIM_MEMORY_MODE=grow");
        assert_eq!(hint.len(), 1, "one hint per process\n{}", pre.dump());
    }
}
