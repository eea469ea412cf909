#!/usr/bin/env bash
# gpushim's compute share (GPUSHIM_COMPUTE_LIMIT) next to HAMi-core's compute limiter
# (CUDA_DEVICE_SM_LIMIT) on the same simulated workloads. Not part of CI.
#
#   bash scripts/compare-hami.sh --hami PATH/libvgpu.so [options]
#
# For each workload (tests/c/compute_load.c: continuous 1 ms kernels, a sync after every
# launch, tiny 10 us kernels, huge 200 ms kernels, graphs of 10 x 1 ms, cooperative 1 ms,
# cuLaunchKernelEx and the per-thread default stream's cuLaunchKernel_ptsz, 1 ms each) and
# each limit (10/30/50/70/90 %), runs the workload for --seconds on the simulated driver
# (target/release/libcuda.so and libnvidia_ml.so, one simulated GPU, GPUSIM_NODE_STATE set so
# that the simulated NVML reports utilisation) once under gpushim
# (LD_PRELOAD=libgpushim.so GPUSHIM_COMPUTE_LIMIT=L%) and once under HAMi-core
# (LD_PRELOAD=libvgpu.so CUDA_DEVICE_SM_LIMIT=L GPU_CORE_UTILIZATION_POLICY=force, a
# CUDA_DEVICE_MEMORY_SHARED_CACHE of its own), plus once per workload with no limiter. Then two
# processes at once on the one GPU, limited to 30 % and 70 %, under each.
#
# The achieved share is read from the simulator's exit report (GPUSIM_REPORT: the process'
# kernel time per 10 ms bucket): the busy share of each 2-s window after the first second of
# launching, printed as mean (min-max). It needs the simulator's time model (kernels named
# gpusim_busy take the time of their first parameter); without it every share is "no busy".
#
# Options:
#   --hami PATH        HAMi-core's libvgpu.so (required unless --sides leaves out hami)
#   --shim PATH        libgpushim.so (default target/release/libgpushim.so)
#   --sim-dir DIR      where libcuda.so and libnvidia_ml.so (the simulator) are (default target/release)
#   --seconds S        wall time of each run (default 6)
#   --limits LIST      comma list of percentages (default 10,30,50,70,90)
#   --workloads LIST   comma list of workload names (default all; --list shows them)
#   --sides LIST       comma list of none,gpushim,hami (default all three)
#   --grid N           blocks per launch (default 1024; HAMi-core's limiter charges per block)
#   --no-pair          leave out the two-process 30/70 runs
#   --keep DIR         keep every run's files (reports, stdout, stderr) in DIR
#   --list             list the workloads and exit
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export COMPARE_ROOT=$ROOT
exec python3 - "$@" <<'PY'
import argparse, json, os, shutil, subprocess, sys, tempfile, time

ROOT = os.environ["COMPARE_ROOT"]
MS = 1_000_000
# name -> (compute_load mode, kernel ns, what), each keeping at most ~200 ms of work queued
WORKLOADS = {
    "continuous-1ms": ("continuous", 1 * MS, "1 ms kernels back to back"),
    "sync-1ms": ("sync", 1 * MS, "1 ms kernels, cuStreamSynchronize after each"),
    "tiny-10us": ("continuous", 10_000, "10 us kernels back to back"),
    "huge-200ms": ("continuous", 200 * MS, "200 ms kernels back to back"),
    "graph-10x1ms": ("graph", 1 * MS, "cuGraphLaunch of 10 x 1 ms kernel nodes"),
    "coop-1ms": ("coop", 1 * MS, "cuLaunchCooperativeKernel of 1 ms kernels"),
    "ex-1ms": ("ex", 1 * MS, "cuLaunchKernelEx of 1 ms kernels"),
    "ptsz-1ms": ("ptsz", 1 * MS, "cuLaunchKernel_ptsz (per-thread default stream) of 1 ms kernels"),
}
QUEUED_NS = 200 * MS


def die(msg):
    print("compare-hami: " + msg, file=sys.stderr)
    sys.exit(2)


ap = argparse.ArgumentParser(prog="compare-hami.sh", add_help=True)
ap.add_argument("--hami")
ap.add_argument("--shim", default=os.path.join(ROOT, "target/release/libgpushim.so"))
ap.add_argument("--sim-dir", default=os.path.join(ROOT, "target/release"))
ap.add_argument("--seconds", type=float, default=6.0)
ap.add_argument("--limits", default="10,30,50,70,90")
ap.add_argument("--workloads", default=",".join(WORKLOADS))
ap.add_argument("--sides", default="none,gpushim,hami")
ap.add_argument("--grid", type=int, default=1024)
ap.add_argument("--no-pair", action="store_true")
ap.add_argument("--keep")
ap.add_argument("--list", action="store_true")
args = ap.parse_args()
if args.list:
    for name, (mode, ns, what) in WORKLOADS.items():
        print("%-16s compute_load %s, %s" % (name, mode, what))
    sys.exit(0)
sides = [s for s in args.sides.split(",") if s]
for s in sides:
    if s not in ("none", "gpushim", "hami"):
        die("unknown side %r (none, gpushim, hami)" % s)
workloads = [w for w in args.workloads.split(",") if w]
for w in workloads:
    if w not in WORKLOADS:
        die("unknown workload %r (--list)" % w)
limits = [int(x) for x in args.limits.split(",") if x]
if "hami" in sides:
    if not args.hami or not os.path.isfile(args.hami):
        die("--hami PATH/libvgpu.so is required (HAMi-core's library; or --sides none,gpushim)")
    args.hami = os.path.abspath(args.hami)
if "gpushim" in sides and not os.path.isfile(args.shim):
    die("no %s: build it (cargo build --release) or give --shim" % args.shim)
if args.seconds < 3:
    die("--seconds must be at least 3 (the first second is left out, windows are 2 s)")
cuda = os.path.join(args.sim_dir, "libcuda.so")
nvml = os.path.join(args.sim_dir, "libnvidia_ml.so")
for lib in (cuda, nvml):
    if not os.path.isfile(lib):
        die("no %s: build the simulator (cargo build --release --workspace) or give --sim-dir" % lib)

work = args.keep or tempfile.mkdtemp(prefix="compare-hami.")
os.makedirs(work, exist_ok=True)
libdir = os.path.join(work, "driver")
os.makedirs(libdir, exist_ok=True)
for name, target in [("libcuda.so.1", cuda), ("libcuda.so", cuda), ("libnvidia-ml.so.1", nvml), ("libnvidia-ml.so", nvml)]:
    link = os.path.join(libdir, name)
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(os.path.abspath(target), link)
exe = os.path.join(work, "compute_load")
cc = subprocess.run(["gcc", "-std=gnu11", "-O1", "-I", os.path.join(ROOT, ".deps/cuda13/include"),
                     os.path.join(ROOT, "tests/c/compute_load.c"), "-L" + libdir, "-Wl,--no-as-needed",
                     "-lcuda", "-lpthread", "-o", exe], capture_output=True, text=True)
if cc.returncode != 0:
    die("compiling tests/c/compute_load.c failed (is .deps/cuda13 fetched? scripts/fetch-deps.sh):\n" + cc.stderr)

CONTROLLED = ("GPUSHIM_", "CUDA_", "GPUSIM_", "GPU_CORE_", "LIBCUDA_", "NVIDIA_")
base_env = {k: v for k, v in os.environ.items()
            if not k.startswith(CONTROLLED) and k not in ("LD_PRELOAD", "LD_LIBRARY_PATH")}
counter = [0]


def busy_share(report, device, lo, hi):
    """The share of [lo, hi) (CLOCK_MONOTONIC ns) the process' kernels kept `device` busy."""
    for b in report.get("busy", []):
        if b.get("device") == device:
            origin, width, total = b["origin_ns"], b["bucket_ns"], 0.0
            for i, ns in enumerate(b["buckets"]):
                a = origin + i * width
                overlap = max(0, min(a + width, hi) - max(a, lo))
                total += ns * overlap / width
            return total / (hi - lo)
    return 0.0


def start(side, limit, workload, tag, node):
    """Starts one compute_load process; returns (Popen, files)."""
    counter[0] += 1
    stem = os.path.join(work, "%03d-%s-%s-%s%s" % (counter[0], workload, side, limit, tag))
    mode, ns, _ = WORKLOADS[workload]
    env = dict(base_env)
    env.update({
        "LD_LIBRARY_PATH": libdir,
        "GPUSIM_DEVICES": "1",
        "GPUSIM_NODE_STATE": node,
        "GPUSIM_REPORT": stem + ".sim.json",
        "COMPUTE_LOAD_GRID": str(args.grid),
    })
    per_launch = ns * (10 if mode == "graph" else 1)
    pending = max(2, QUEUED_NS // max(per_launch, 1))
    if pending < 1024:
        env["COMPUTE_LOAD_MAX_PENDING"] = str(pending)
    if side == "gpushim":
        env.update({"LD_PRELOAD": os.path.abspath(args.shim), "GPUSHIM_COMPUTE_LIMIT": "%d%%" % limit,
                    "GPUSHIM_STATE_DIR": stem + ".state"})
    elif side == "hami":
        env.update({"LD_PRELOAD": args.hami, "CUDA_DEVICE_SM_LIMIT": str(limit),
                    "GPU_CORE_UTILIZATION_POLICY": "force",
                    "CUDA_DEVICE_MEMORY_SHARED_CACHE": stem + ".hami.cache"})
    out, err = open(stem + ".out", "w"), open(stem + ".err", "w")
    p = subprocess.Popen([exe, mode, "%g" % args.seconds, str(ns), "0"], env=env, stdin=subprocess.DEVNULL,
                         stdout=out, stderr=err)
    return p, stem


def finish(p, stem):
    """Waits for a run; returns a dict: shares (list) or error."""
    try:
        rc = p.wait(timeout=args.seconds + 90)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        return {"error": "timed out", "stem": stem}
    text = open(stem + ".out").read()
    err = open(stem + ".err").read()
    res = {"stem": stem, "rc": rc, "stderr": err}
    if rc != 0:
        bad = [l for l in text.splitlines() + err.splitlines() if "error" in l.lower()]
        res["error"] = "exit %d%s" % (rc, (": " + bad[0][:80]) if bad else "")
        return res
    kv = {}
    for line in text.splitlines():
        for word in line.split():
            if "=" in word:
                k, v = word.split("=", 1)
                kv[k] = v
    try:
        report = json.load(open(stem + ".sim.json"))
    except (OSError, ValueError) as e:
        res["error"] = "no simulator report (%s)" % e
        return res
    res["launches"] = int(kv.get("launches", 0))
    if "busy" not in report:
        res["error"] = "no busy (simulator without the time model)"
        return res
    s = int(kv["start_ns"])
    windows = []
    lo = s + 1_000_000_000
    while lo + 2_000_000_000 <= s + int(args.seconds * 1e9):
        windows.append(busy_share(report, 0, lo, lo + 2_000_000_000))
        lo += 2_000_000_000
    res["shares"] = windows
    return res


def cell(res):
    if "error" in res:
        return res["error"]
    w = res["shares"]
    if not w:
        return "no window"
    return "%.1f %% (%.1f-%.1f)" % (100 * sum(w) / len(w), 100 * min(w), 100 * max(w))


def run_one(side, limit, workload):
    node = os.path.join(work, "node-%d" % (counter[0] + 1))
    p, stem = start(side, limit, workload, "", node)
    return finish(p, stem)


results = {}
notes = {}
t0 = time.time()
total = len(workloads) * (("none" in sides) + len(limits) * len([s for s in sides if s != "none"]))
done = 0
for w in workloads:
    if "none" in sides:
        results[(w, "none", 0)] = run_one("none", 0, w)
        done += 1
    for limit in limits:
        for side in sides:
            if side == "none":
                continue
            r = run_one(side, limit, w)
            results[(w, side, limit)] = r
            done += 1
            for line in r.get("stderr", "").splitlines():
                if any(k in line for k in ("ERROR", "WARN", "error", "warn")):
                    notes.setdefault(side, [])
                    key = line.split("]")[-1].strip()[:160]
                    if key not in notes[side]:
                        notes[side].append(key)
        print("compare-hami: %d/%d runs, %.0f s" % (done, total, time.time() - t0), file=sys.stderr)

print("# Compute share: gpushim and HAMi-core on the simulated GPU\n")
print("Achieved share of the GPU's time: mean of the 2-s windows after the first second of a")
print("%g-s run (min-max window). Blocks per launch: %d. Workloads: `tests/c/compute_load.c`.\n" % (args.seconds, args.grid))
head = "| workload | limit |"
line = "|---|---|"
for side in sides:
    head += {"none": " no limiter |", "gpushim": " gpushim |", "hami": " HAMi-core |"}[side]
    line += "---|"
print(head)
print(line)
for w in workloads:
    for limit in limits:
        row = "| %s | %d %% |" % (w, limit)
        for side in sides:
            r = results.get((w, side, 0 if side == "none" else limit))
            row += " %s |" % cell(r)
        print(row)

if not args.no_pair:
    print("\n## Two processes on one GPU, limited to 30 % and 70 % (continuous 1 ms kernels)\n")
    print("| limiter | process at 30 % | process at 70 % | together |")
    print("|---|---|---|---|")
    for side in [s for s in sides if s != "none"] + (["none"] if "none" in sides else []):
        node = os.path.join(work, "node-pair-%s" % side)
        a = start(side, 30, "continuous-1ms", "-pairA", node)
        b = start(side, 70, "continuous-1ms", "-pairB", node)
        ra, rb = finish(*a), finish(*b)
        if "shares" in ra and "shares" in rb and ra["shares"] and rb["shares"]:
            both = [x + y for x, y in zip(ra["shares"], rb["shares"])]
            together = "%.1f %%" % (100 * sum(both) / len(both))
        else:
            together = "-"
        name = {"none": "none (both unlimited)", "gpushim": "gpushim", "hami": "HAMi-core"}[side]
        print("| %s | %s | %s | %s |" % (name, cell(ra), cell(rb), together))

if notes:
    print("\n## Messages the limiters printed (distinct, first 12)\n")
    for side, lines in notes.items():
        for l in lines[:12]:
            print("- %s: `%s`" % (side, l.replace("`", "'")))
print("\nRuns kept in %s" % work if args.keep else "")
if not args.keep:
    shutil.rmtree(work, ignore_errors=True)
PY
