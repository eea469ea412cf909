#!/usr/bin/env python3
"""gpu-bench: what gpushim costs on a real GPU, with and without the shim in one run.

Benchmarks (each a child process per run; runs of the variants interleaved, so drift of the
machine hits them alike; the figure is the median of every timed round of every run):
  * cudaMalloc + cudaFree latency, 4 KiB, 1 MiB, 64 MiB and 1 GiB (bench.cu, nvcc; without
    nvcc gcc + a libcudart.so, e.g. the nvidia-cuda-runtime wheel PyTorch ships with)
  * empty-kernel launches per second (bench.cu; needs nvcc)
  * a PyTorch training step of a small MLP (torch_bench.py)
Variants: native (no shim) and the shim in each memory mode (GPUSHIM_MEMORY_MODE=passthrough,
grow, preallocate). Before benchmarking, each mode is tried once (one 4 KiB cudaMalloc+cudaFree):
a mode this build of the shim refuses as "not available in this version" is SKIP "not available
yet", one that fails otherwise is ERROR, so the modes are measured as soon as the shim accepts
them, whatever NOT_IMPLEMENTED (scripts/gpu/common.py) still says. Where that try cannot run
(no driver, bench.cu not buildable) the modes listed in NOT_IMPLEMENTED are SKIP. A variant that
fails during a benchmark is ERROR for that benchmark only; the others still run. The shim runs
with GPUSHIM_MEMORY_LIMIT=90%, so every allocation goes through the accounting (in preallocate,
90% of the GPU is reserved when the context is created). After the verdict table, a table of the
cudaMalloc+cudaFree latency per pair of every variant side by side.

Targets: training step and launch rate ≥ 0.99 of native; allocation overhead ≤ 1 µs per pair
(passthrough). Verdicts: OK, MISS, or "MISS (within noise)" when the difference is inside the
spread of the native runs.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (GIB, KIB, MIB, NOT_IMPLEMENTED, BuildError, FatalError, Machine, Skip,  # noqa: E402
                    fmt_bytes, short, write_json)

LIMIT = "90%"
# (size, pairs per round): rounds of roughly equal duration on a real GPU
ALLOC_SIZES = [(4 * KIB, 2000), (1 * MIB, 2000), (64 * MIB, 500), (1 * GIB, 50)]
ROUNDS = 5  # timed rounds inside each child
LAUNCHES = 20000
TRAIN_STEPS = 50
ALLOC_TARGET_US = 1.0
RATIO_TARGET = 0.99

# name, shim?, environment, feature (SKIP while listed in NOT_IMPLEMENTED)
VARIANTS = [
    ("native", False, {}, None),
    ("passthrough", True, {"GPUSHIM_MEMORY_LIMIT": LIMIT}, None),
    ("grow", True, {"GPUSHIM_MEMORY_LIMIT": LIMIT, "GPUSHIM_MEMORY_MODE": "grow"}, "mode-grow"),
    ("preallocate", True, {"GPUSHIM_MEMORY_LIMIT": LIMIT, "GPUSHIM_MEMORY_MODE": "preallocate"}, "mode-preallocate"),
]


class Bench:
    """One benchmark: `measure(m, variant) -> list of values` per child run; `higher`
    says whether bigger is better; `compare(native, shim)` gives (figure text, ok)."""

    def __init__(self, name, unit, higher, measure, compare, target, requires):
        self.name, self.unit, self.higher, self.measure = name, unit, higher, measure
        self.compare, self.target, self.requires = compare, target, requires


def alloc_measure(size, pairs):
    def measure(m, shim, env):
        exe, _ = m.build("bench")
        r = m.run([exe, "alloc", size, pairs, ROUNDS], shim=shim, env=env, report=False)
        return parse_line(r, "alloc")
    return measure


def launch_measure(m, shim, env):
    exe, label = m.build("bench")
    if not label.startswith("nvcc"):
        raise Skip("no nvcc: the empty kernel needs it")
    r = m.run([exe, "launch", LAUNCHES, ROUNDS], shim=shim, env=env, report=False)
    return parse_line(r, "launch")


def train_measure(m, shim, env):
    r = m.python_probe("torch_bench.py", TRAIN_STEPS, ROUNDS, shim=shim, env=env, report=False)
    d = r.result()
    if r.timed_out or d is None or "error" in d:
        raise RuntimeError((d or {}).get("error") or "no result: " + run_error(r))
    return d["step_ms"]


def parse_line(r, tag):
    for line in r.stdout.splitlines():
        f = line.split()
        if f and f[0] == tag:
            return [float(x) for x in f[2:]]
    raise RuntimeError(run_error(r))


def run_error(r):
    if r.timed_out:
        return "timed out after %d s: %s" % (r.timeout, r.command())
    lines = [l for l in (r.stdout + "\n" + r.stderr).splitlines() if l.strip()]
    return "exit status %s: %s (%s)" % (r.rc, short(" | ".join(lines[-3:]), 240), r.command())


def overhead_us(native, shim):
    d = shim - native
    return "%+.2f µs/pair" % d, d <= ALLOC_TARGET_US, d


def rate_ratio(native, shim):
    q = shim / native
    return "%.3f" % q, q >= RATIO_TARGET, q


def time_ratio(native, shim):
    q = native / shim  # speed of the shim run relative to native
    return "%.3f" % q, q >= RATIO_TARGET, q


BENCHES = [Bench("cudaMalloc+cudaFree %s" % fmt_bytes(size), "µs/pair", False, alloc_measure(size, pairs),
                 overhead_us, "≤ +%.0f µs/pair" % ALLOC_TARGET_US, ("driver", "build"))
           for size, pairs in ALLOC_SIZES]
BENCHES += [
    Bench("empty-kernel launches", "/s", True, launch_measure, rate_ratio, "≥ %.2f" % RATIO_TARGET,
          ("driver", "build", "nvcc")),
    Bench("PyTorch training step (MLP)", "ms", False, train_measure, time_ratio, "≥ %.2f" % RATIO_TARGET,
          ("driver", "torch")),
]


def missing(m, b):
    reasons = []
    for req in b.requires:
        if req == "driver" and m.driver_reason:
            reasons.append(m.driver_reason)
        elif req == "torch" and not m.has("torch"):
            reasons.append(m.module_reason("torch"))
        elif req == "nvcc" and not m.nvcc:
            reasons.append("no nvcc (the empty kernel needs it)" if not m.simulated else
                           "--simulated: the simulated driver runs no kernels")
        elif req == "build":
            try:
                m.build("bench")
            except Skip as e:
                reasons.append(str(e))
            except BuildError:
                pass
    return "; ".join(dict.fromkeys(reasons))


def fmt_value(v, unit):
    if v is None:
        return "-"
    if unit == "/s":
        return "{:,.0f}/s".format(v)
    if unit == "µs/pair":
        return "%.2f µs" % v
    return "%.3f %s" % (v, unit)


def run_bench(m, b, variants, runs, log):
    """Interleaves runs × variants; returns ({variant: [values]}, {variant: [run medians]},
    {variant: error}). A shim variant that fails is dropped from the later runs and reported in
    the errors; a failure of the native variant (the reference) raises."""
    values = {name: [] for name, _, _, _ in variants}
    per_run = {name: [] for name, _, _, _ in variants}
    failed = {}
    for i in range(runs):
        for name, shim, env, _ in variants:
            if name in failed:
                continue
            try:
                v = b.measure(m, shim, env)
            except RuntimeError as e:
                if not shim:
                    raise
                failed[name] = str(e)
                continue
            values[name] += v
            per_run[name].append(statistics.median(v))
        log("  %s: run %d/%d done" % (b.name, i + 1, runs))
    return values, per_run, failed


def probe_variants(m, variants, log):
    """Tries each shim variant once (one 4 KiB cudaMalloc+cudaFree with bench.cu). Returns
    {variant: (status, reason)} for the variants that cannot be benchmarked: SKIP where the shim
    says the setting is not available in this version, ERROR where the try failed otherwise; or
    None when the try cannot run here (no driver, bench.cu not buildable)."""
    if m.driver_reason:
        return None
    try:
        exe, _ = m.build("bench")
    except (Skip, BuildError):
        return None
    out = {}
    for name, shim, env, feature in variants:
        if not shim:
            continue
        r = m.run([exe, "alloc", 4 * KIB, 1, 1], shim=True, env=env, report=False, timeout=min(m.timeout, 120))
        text = r.stdout + "\n" + r.stderr
        if r.rc == 0 and not r.timed_out and any(l.startswith("alloc ") for l in r.stdout.splitlines()):
            if feature in NOT_IMPLEMENTED:
                log("note: the shim accepts %s although scripts/gpu/common.py lists %r in NOT_IMPLEMENTED; "
                    "benchmarking it" % (" ".join("%s=%s" % kv for kv in env.items() if kv[0] != "GPUSHIM_MEMORY_LIMIT"),
                                         feature))
            continue
        if "not available in this version" in text:
            said = [l for l in text.splitlines() if "not available in this version" in l][0]
            out[name] = ("SKIP", "not available yet (%s)" % short(said, 160))
        else:
            out[name] = ("ERROR", "the first try failed: " + run_error(r))
    return out


def latency_table(rows, variants, unusable):
    """cudaMalloc+cudaFree µs per pair, one column per variant (native first); a variant that
    could not run says why in a word."""
    names = [v[0] for v in variants]
    gone = {n: ("not available yet" if st == "SKIP" else st) for n, (st, _) in unusable.items()}
    by = {}
    for r in rows:
        if not r["benchmark"].startswith("cudaMalloc+cudaFree"):
            continue
        cells = by.setdefault(r["benchmark"], dict(gone))
        if "native" in r:
            cells["native"] = "%.2f" % r["native"]
            cells[r["variant"]] = "%.2f" % r["shim"]
        elif r["variant"] != "-":
            cells[r["variant"]] = r["status"]
        else:
            cells.update({n: r["status"] for n in names if n not in cells})
    if not by:
        return []
    table = [["size"] + names]
    for bench, cells in by.items():
        table.append([bench.split()[-2] + " " + bench.split()[-1]] + [cells.get(n, "-") for n in names])
    return table


def main(argv):
    ap = argparse.ArgumentParser(prog="gpu-bench.sh", description=__doc__.split("\n\n")[0])
    ap.add_argument("--library", help="libgpushim.so (default: target/release/libgpushim.so, built if missing)")
    ap.add_argument("--build", action="store_true", help="run `cargo build --release -p gpushim` first")
    ap.add_argument("--runs", type=int, default=3, help="child runs per variant and benchmark (default 3)")
    ap.add_argument("--json", default="gpu-bench.json", help="result file (default gpu-bench.json)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds for each child process (default 300)")
    ap.add_argument("--simulated", action="store_true",
                    help="on the project's simulated driver (allocation figures only; not real hardware)")
    ap.add_argument("--strict", action="store_true", help="exit 1 if a target is missed")
    ap.add_argument("--python", help="the Python that runs PyTorch (default: this one)")
    args = ap.parse_args(argv)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    try:
        m = Machine(library=args.library, build=args.build, simulated=args.simulated, timeout=args.timeout,
                    python=args.python)
    except FatalError as e:
        print("gpu-bench: error: %s" % e, file=sys.stderr)
        return 2
    try:
        probed = probe_variants(m, VARIANTS, log)
        if probed is None:  # the modes could not be tried: the static list decides
            unusable = {v[0]: ("SKIP", "not implemented in this version (%s)" % " ".join(
                "%s=%s" % kv for kv in NOT_IMPLEMENTED[v[3]].items())) for v in VARIANTS if v[3] in NOT_IMPLEMENTED}
        else:
            unusable = probed
        active = [v for v in VARIANTS if v[0] not in unusable]
        print("gpu-bench: %s" % ("SIMULATED driver (figures of the simulator, not of a GPU)" if m.simulated
                                 else "real hardware"))
        print("  library  %s" % m.library)
        print("  driver   %s" % (m.driver_reason or "CUDA %s, %s" % (
            m.driver_version, ", ".join("%s (%s)" % (d["name"], fmt_bytes(d["total"])) for d in m.devices))))
        print("  shim     GPUSHIM_MEMORY_LIMIT=%s; variants %s; %d runs x %d rounds each, medians"
              % (LIMIT, ", ".join(v[0] for v in active), args.runs, ROUNDS))
        rows, errors, misses = [], 0, 0
        for b in BENCHES:
            why = missing(m, b)
            if why:
                rows.append({"benchmark": b.name, "variant": "-", "status": "SKIP", "reason": why})
                continue
            try:
                values, per_run, failed = run_bench(m, b, active, args.runs, log)
            except Skip as e:
                rows.append({"benchmark": b.name, "variant": "-", "status": "SKIP", "reason": str(e)})
                continue
            except (BuildError, RuntimeError) as e:
                errors += 1
                rows.append({"benchmark": b.name, "variant": "-", "status": "ERROR", "reason": str(e)})
                continue
            native = statistics.median(values["native"])
            spread = (max(per_run["native"]) - min(per_run["native"])) / 2 if len(per_run["native"]) > 1 else 0.0
            for name, _, _, _ in active[1:]:
                if name in failed:
                    errors += 1
                    rows.append({"benchmark": b.name, "variant": name, "status": "ERROR", "reason": failed[name]})
                    continue
                shim = statistics.median(values[name])
                figure, ok, q = b.compare(native, shim)
                noise = abs(shim - native) <= spread + (max(per_run[name]) - min(per_run[name])) / 2
                status = "OK" if ok else ("MISS (within noise)" if noise else "MISS")
                misses += 0 if ok else 1
                rows.append({"benchmark": b.name, "variant": name, "status": status, "unit": b.unit,
                             "native": native, "shim": shim, "figure": figure, "value": q, "target": b.target,
                             "native_runs": per_run["native"], "shim_runs": per_run[name],
                             "native_rounds": values["native"], "shim_rounds": values[name]})
        for name, _, _, _ in VARIANTS:
            if name in unusable:
                status, reason = unusable[name]
                errors += status == "ERROR"
                rows.append({"benchmark": "memory mode %s" % name, "variant": name, "status": status, "reason": reason})
        print()
        head = ("benchmark", "variant", "native", "with shim", "shim vs native", "target", "verdict")
        table = [head]
        for r in rows:
            if "native" in r:
                table.append((r["benchmark"], r["variant"], fmt_value(r["native"], r["unit"]),
                              fmt_value(r["shim"], r["unit"]), r["figure"], r["target"], r["status"]))
            else:
                table.append((r["benchmark"], r["variant"], "-", "-", "-", "-", "%s: %s" % (r["status"], r["reason"])))
        widths = [max(len(str(row[i])) for row in table) for i in range(6)]
        for i, row in enumerate(table):
            print("  ".join(str(row[j]).ljust(widths[j]) for j in range(6)) + "  " + short(row[6], 170))
            if i == 0:
                print("  ".join("-" * w for w in widths) + "  " + "-" * 10)
        lat = latency_table(rows, VARIANTS, unusable)
        if lat:
            print()
            print("cudaMalloc+cudaFree, µs per pair (median of every round), per variant:")
            widths = [max(len(row[i]) for row in lat) for i in range(len(lat[0]))]
            for row in lat:
                print("  " + "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))))
        write_json(args.json, {"tool": "gpu-bench", "simulated": m.simulated, "started": started,
                               "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "library": m.library,
                               "driver": {"reason_unusable": m.driver_reason, "version": m.driver_version,
                                          "devices": m.devices},
                               "limit": LIMIT, "runs": args.runs, "rounds": ROUNDS,
                               "variants": {v[0]: ({"status": unusable[v[0]][0], "reason": unusable[v[0]][1]}
                                                   if v[0] in unusable else {"status": "measured"}) for v in VARIANTS},
                               "not_implemented": sorted(NOT_IMPLEMENTED), "results": rows})
        print()
        print("results written to %s" % os.path.abspath(args.json))
        if errors:
            return 1
        return 1 if (args.strict and misses) else 0
    finally:
        m.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
