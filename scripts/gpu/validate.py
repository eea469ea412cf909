#!/usr/bin/env python3
"""gpu-validate: gpushim on a real NVIDIA GPU, with the programs users run.

Every scenario runs its programs in child processes, WITH the shim (LD_PRELOAD=libgpushim.so)
and WITHOUT it: the run without the shim must show the unconstrained behaviour (the physical
total, an allocation past the limit that succeeds …), so each check can fail. Expectations are
computed exactly from the GPU's cuDeviceTotalMem_v2, read once without the shim.

Layout of this file: constants; `Check` (one PASS/FAIL/SKIP row); the viewers (what a
program of each kind sees: PyTorch, a runtime program, a driver-API program, ctypes, pynvml,
nvidia-smi); one function per scenario (those of the compute share, group `compute`, in
compute_share.py); the scenario table `SCENARIOS`; main.

Features not implemented by this version of gpushim are listed in `NOT_IMPLEMENTED` at the top
of common.py: their scenarios are SKIP "not implemented in this version" (their code is here,
ready; `--include-unimplemented` runs them anyway). Delete an entry there once it lands.

Usage: scripts/gpu-validate.sh [--library PATH] [--build] [--only NAMES] [--timeout S]
                               [--json PATH] [--simulated] [--include-unimplemented] [--list]
"""
import argparse
import contextlib
import fnmatch
import math
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (GIB, MIB, NOT_IMPLEMENTED, BuildError, FatalError, Machine, NvmlMonitor, Skip,  # noqa: E402
                    fmt_bytes, norm_uuid, short, size_arg, tail, write_json)
from compute_share import compute_graph, compute_green, compute_overhead, compute_pair  # noqa: E402

CHUNK = 256 * MIB  # every fill allocates in pieces of this size
SLACK = 512 * MIB  # a caching allocator may stop this far below the limit (its own rounding)
INFO_SLACK = 64 * MIB  # cuMemGetInfo's free right after start-up: at most this below the limit
# Without the shim, free right after start-up is the GPU less the context's own reservation,
# which the shim does not count: 527 MiB on an H100 80GB with driver 580 (seen 2026-11-27).
NATIVE_INFO_SLACK = 1 * GIB
CONTEXT_SLACK = 1536 * MIB  # device memory of a CUDA context + libraries, which no limit counts
CONFIG_ERROR_LINE = 'gpushim: GPUSHIM_MEMORY_LIMIT="4 gigs": expected a size like 4GiB or a fraction like 40%'
NOT_AVAILABLE = "is not available in this version of gpushim"
REFUSED = re.compile(r"^gpushim: warn: device (\d+): (\w+) of (\d+) bytes refused: (\d+) bytes in use, "
                     r"limit (\d+) bytes", re.M)
# The CUDA runtime's device-integrity check failing (cudaErrorSoftwareValidityNotEstablished = 103)
INTEGRITY = re.compile(r"SoftwareValidityNotEstablished|validity not established|integrity check|"
                       r"(error|code|rc)[ =:]*103\b", re.I)
OOM_CUDA = 2  # CUDA_ERROR_OUT_OF_MEMORY and cudaErrorMemoryAllocation

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"


# ---------------------------------------------------------------------------------------------
# One row of the table
# ---------------------------------------------------------------------------------------------

class Abort(Exception):
    """Stops a check whose failure is already recorded (no output to look at …)."""


class Check:
    """`with t.check("shim, limit 4 GiB") as c:` — failures are collected, not raised; an
    exception inside the block is a FAIL (Skip: SKIP) and never stops the harness."""

    def __init__(self, variant):
        self.variant = variant
        self.status = None
        self.notes, self.failures, self.runs = [], [], []
        self.seconds = 0.0

    def __enter__(self):
        self._t0 = time.monotonic()
        return self

    def __exit__(self, et, e, tb):
        self.seconds = time.monotonic() - self._t0
        if et is not None and not issubclass(et, Exception):
            return False  # KeyboardInterrupt and the like
        if et is Skip:
            self.status, self.notes = SKIP, [str(e)]
            return True
        if et is BuildError:
            self.failures.append(str(e))
        elif et is not None and et is not Abort:
            where = traceback.extract_tb(tb)[-1]
            self.failures.append("harness error: %s: %s (%s:%d)" % (et.__name__, e, os.path.basename(where.filename),
                                                                    where.lineno))
        self.status = FAIL if self.failures else PASS
        return True

    # recording
    def note(self, text):
        self.notes.append(text)

    def fail(self, text):
        self.failures.append(text)

    def expect(self, what, ok, seen):
        if not ok:
            self.failures.append("%s: %s" % (what, seen))
        return bool(ok)

    def eq(self, what, got, want):
        return self.expect(what, got == want, "got %r, expected %r" % (got, want))

    # runs
    def run(self, r):
        self.runs.append(r)
        if r.timed_out:
            self.fail("timed out after %d s" % r.timeout)
            raise Abort()
        return r

    def result(self, r):
        """The RESULT json of a Python probe; aborts the check if there is none."""
        self.run(r)
        d = r.result()
        if d is None:
            self.fail("the probe printed no RESULT line (exit status %s)" % r.rc)
            raise Abort()
        if "import_error" in d:
            self.fail("import failed: " + d["import_error"])
            raise Abort()
        return d

    def kv(self, r):
        """The key=value lines of a C probe; aborts the check unless it finished."""
        self.run(r)
        d = r.kv()
        if d.get("done") != "1":
            self.fail("the program did not finish (exit status %s)" % r.rc)
            raise Abort()
        return d

    def to_json(self):
        return {"variant": self.variant, "status": self.status, "summary": "; ".join(self.notes),
                "failures": self.failures, "seconds": round(self.seconds, 2), "runs": [r.to_json() for r in self.runs]}


class Test:
    """What a scenario function gets: the machine, the limit, and `check(variant)`."""

    def __init__(self, machine):
        self.m = machine
        self.checks = []

    def check(self, variant):
        c = Check(variant)
        self.checks.append(c)
        return c

    @property
    def limit(self):
        return self.m.limit()

    def uuids(self):
        return [d["uuid"] for d in self.m.devices]

    def physical(self):
        return [int(d["total"]) for d in self.m.devices]


def limit_env(limit, **extra):
    env = {"GPUSHIM_MEMORY_LIMIT": size_arg(limit) if isinstance(limit, int) else limit}
    env.update(extra)
    return env


# ---------------------------------------------------------------------------------------------
# Viewers: what a program of each kind sees. Each returns a View; problems are things that went
# wrong beyond the numbers (a failed kernel, counts that disagree, an integrity error …).
# ---------------------------------------------------------------------------------------------

class View:
    def __init__(self, viewer, count, uuids, totals, problems, run, extra=None):
        self.viewer, self.count, self.uuids, self.totals = viewer, count, uuids, totals
        self.problems, self.run, self.extra = problems, run, extra or {}


def see_torch(m, c, env, shim):
    r = m.python_probe("torch_probe.py", "info", shim=shim, env=env)
    d = c.result(r)
    problems = [d["error"]] if "error" in d else []
    if d.get("device_count") != d.get("cuda_device_count"):
        problems.append("torch.cuda.device_count() = %s but cudaGetDeviceCount = %s"
                        % (d.get("device_count"), d.get("cuda_device_count")))
    devs = d.get("devices", [])
    for x in devs:
        if "error" in x:
            problems.append("cuda:%d: %s" % (x["index"], x["error"]))
        elif x.get("touch") != "ok":
            problems.append("cuda:%d kernel + copy: %s" % (x["index"], x.get("touch")))
    return View("torch", d.get("device_count"), [norm_uuid(x.get("uuid")) for x in devs],
                [x.get("total_memory") for x in devs], problems, r, d)


def see_cudart(m, c, env, shim):
    exe, label = m.build("cudart")
    r = m.run([exe, "ids", "touch"], shim=shim, env=env)
    d = c.kv(r)
    n = int(d.get("count", 0))
    problems = []
    for i in range(n):
        if d.get("dev%d.touch" % i) != "0":
            problems.append("device %d: cudaMalloc/cudaMemset/cudaMemcpy failed: %s (%s)"
                            % (i, d.get("dev%d.touch_err" % i), d.get("dev%d.touch" % i)))
    return View("cudart", n, [norm_uuid(d.get("dev%d.uuid" % i)) for i in range(n)],
                [int(d.get("dev%d.total" % i, -1)) for i in range(n)], problems, r, d)


def see_driver(m, c, env, shim):
    exe, label = m.build("driver")
    r = m.run([exe, "ids", "touch"], shim=shim, env=env)
    d = c.kv(r)
    n = int(d.get("count", 0))
    problems = ["device %d: cuMemAlloc/cuMemsetD8/cuMemcpyDtoH failed: CUresult %s" % (i, d.get("dev%d.touch" % i))
                for i in range(n) if d.get("dev%d.touch" % i) != "0"]
    return View("driver", n, [norm_uuid(d.get("dev%d.uuid" % i)) for i in range(n)],
                [int(d.get("dev%d.total" % i, -1)) for i in range(n)], problems, r, d)


def see_dlopen(m, c, env, shim):
    r = m.python_probe("cuda_info.py", "--no-nvml", shim=shim, env=env)
    d = c.result(r)["driver"]
    devs = d.get("devices", [])
    problems = ["device %d: cuMemGetInfo_v2 failed: CUresult %s" % (i, x["info_rc"])
                for i, x in enumerate(devs) if x.get("info_rc") != 0]
    return View("dlopen", d.get("count", 0), [norm_uuid(x["uuid"]) for x in devs], [x["total"] for x in devs],
                problems, r, d)


def see_nvml(m, c, env, shim):
    r = m.python_probe("nvml_probe.py", shim=shim, env=env)
    d = c.result(r)
    problems = [d["error"]] if "error" in d else []
    devs = d.get("devices", [])
    for x in devs:
        if x.get("by_uuid") is not True:
            problems.append("nvmlDeviceGetHandleByUUID(%s) does not find index %d again: %s"
                            % (x["uuid"], x["index"], x.get("by_uuid")))
    return View("pynvml", d.get("count"), [norm_uuid(x["uuid"]) for x in devs], [x["total"] for x in devs],
                problems, r, d)


def see_smi(m, c, env, shim):
    r = m.run([m.nvidia_smi, "--query-gpu=index,uuid,memory.total", "--format=csv,noheader,nounits"],
              shim=shim, env=env)
    c.run(r)
    rows = [[f.strip() for f in line.split(",")] for line in r.stdout.splitlines() if line.count(",") == 2]
    problems = []
    if not rows and "No devices were found" not in r.stdout + r.stderr and r.rc != 0:
        problems.append("nvidia-smi failed (exit status %s)" % r.rc)
    totals = []
    for row in rows:
        try:
            totals.append(int(row[2]) * MIB)
        except ValueError:
            totals.append(row[2])
    return View("nvidia-smi", len(rows), [norm_uuid(row[1]) for row in rows], totals, problems, r, {"rows": rows})


VIEWERS = {"torch": see_torch, "cudart": see_cudart, "driver": see_driver, "dlopen": see_dlopen,
           "pynvml": see_nvml, "nvidia-smi": see_smi}
CUDA_VIEWERS = ("torch", "cudart", "driver", "dlopen")
ALL_VIEWERS = CUDA_VIEWERS + ("pynvml", "nvidia-smi")
NVML_VIEWERS = ("pynvml", "nvidia-smi")


def viewer_missing(m, name):
    """Why this viewer cannot run here, or None."""
    if m.driver_reason:
        return m.driver_reason
    if name == "torch":
        return None if m.has("torch") else m.module_reason("torch")
    if name == "pynvml":
        return None if m.has("pynvml") else m.module_reason("pynvml")
    if name == "nvidia-smi":
        if m.simulated:
            return "--simulated: nvidia-smi talks to the real driver"
        return None if m.nvidia_smi else "nvidia-smi not found on PATH"
    if name in ("cudart", "driver"):
        try:
            m.build(name)
        except Skip as e:
            return str(e)
        except BuildError:
            return None  # the viewer runs and its check reports the build failure
    return None


def primary_viewer(m):
    """The viewer of the control runs: PyTorch where it can run, else the runtime program."""
    for name in ("torch", "cudart", "driver", "dlopen"):
        if viewer_missing(m, name) is None:
            return name
    return "dlopen"


def each_viewer(t, names, variant, env, shim, expect):
    """One check per viewer: `expect(c, view)`. A viewer missing here is a SKIP row, except
    the ones --simulated can never have (frameworks, nvidia-smi), which are left out."""
    for name in names:
        why = viewer_missing(t.m, name)
        if why and t.m.simulated and name in ("torch", "nvidia-smi"):
            continue
        with t.check("%s: %s" % (variant, name)) as c:
            if why:
                raise Skip(why)
            expect(c, VIEWERS[name](t.m, c, env, shim))


def expect_view(c, v, want_uuids, want_totals=None):
    """The view shows exactly these devices in this order (and these totals), and nothing
    went wrong on the way (kernels, copies, the runtime's integrity check)."""
    want = [norm_uuid(u) for u in want_uuids]
    c.eq("%s: device count" % v.viewer, v.count, len(want))
    c.eq("%s: devices (UUIDs, in order)" % v.viewer, v.uuids, want)
    if want_totals is not None:
        want_totals = list(want_totals)
        if v.viewer == "nvidia-smi":  # it prints whole MiB: allow its rounding
            close = len(v.totals) == len(want_totals) and all(
                isinstance(g, int) and w is not None and abs(g - w) < MIB for g, w in zip(v.totals, want_totals))
            c.expect("nvidia-smi: memory.total per device (MiB)", close, "got %s MiB, expected %s MiB" % (
                [g // MIB if isinstance(g, int) else g for g in v.totals],
                [w / MIB if w is not None else None for w in want_totals]))
        else:
            c.eq("%s: total memory per device" % v.viewer, v.totals, want_totals)
    for p in v.problems:
        c.fail("%s: %s" % (v.viewer, p))
    expect_no_integrity_error(c, v.run)
    shown = ", ".join(fmt_bytes(x) if isinstance(x, int) else str(x) for x in (v.totals or []))
    c.note("%d device(s)%s" % (v.count or 0, " of " + shown if shown else ""))


def expect_no_integrity_error(c, r):
    hit = INTEGRITY.search(r.stdout + "\n" + r.stderr)
    c.expect("no device-integrity error (103)", hit is None, "the output has %r" % (hit.group(0) if hit else ""))


def expect_refusal_logged(c, r, limit):
    """The shim's one warn line per refusal names the device, the request, the use and the limit."""
    seen = [x for x in REFUSED.finditer(r.stderr) if int(x.group(5)) == limit]
    c.expect("a `gpushim: warn: … refused …, limit %d bytes` line on stderr" % limit, seen,
             "none (stderr: %s)" % short(tail(r.stderr, 3), 300))


def expect_config_error(c, r, text):
    lines = [l for l in r.stderr.splitlines() if text in l]
    c.expect("stderr names the bad setting (%r)" % text, lines, "not found")
    return lines


def physical_totals(t, viewer, uuids):
    """What each device has without the shim, as this viewer reports it (NVML's totals are
    slightly larger than CUDA's on real GPUs)."""
    out = []
    for u in uuids:
        if viewer in NVML_VIEWERS:
            out.append(t.m.nvml_total_of(u))
        else:
            out.append(next(int(d["total"]) for d in t.m.devices if norm_uuid(d["uuid"]) == norm_uuid(u)))
    return out


@contextlib.contextmanager
def nvml_monitor(m, device=0):
    """An NvmlMonitor of physical device `device`, or None where NVML cannot see the child
    (--simulated: the simulator's NVML sees its own process only; no NVML)."""
    if m.simulated or m.nvml_reason or not m.devices:
        yield None
        return
    try:
        mon = NvmlMonitor(m.devices[device]["uuid"])
    except (OSError, Skip):
        yield None
        return
    with mon:
        yield mon


def fill_bounds(c, label, p, limit, slack, outcomes=("oom",)):
    """A fill stopped by the limit: refused (an OOM of the framework), and it got within
    `slack` of the limit without passing it."""
    if not c.expect(label + ": result", isinstance(p, dict), "missing"):
        return
    c.expect(label + ": stopped by an out-of-memory error", p.get("outcome") in outcomes,
             "outcome %r after %s" % (p.get("outcome"), fmt_bytes(p.get("bytes"))))
    b = p.get("bytes", -1)
    c.expect(label + ": allocated ≤ limit", b <= limit, "%s > %s" % (fmt_bytes(b), fmt_bytes(limit)))
    c.expect(label + ": allocated ≥ limit − %s" % fmt_bytes(slack), b >= limit - slack,
             "only %s of %s" % (fmt_bytes(b), fmt_bytes(limit)))
    c.note("%s %s" % (label, fmt_bytes(b)))


def unconstrained_fill(c, label, p, limit):
    """Without the shim, the same fill passes the limit and stops only at its cap."""
    if not c.expect(label + ": result", isinstance(p, dict), "missing"):
        return
    c.expect(label + ": passes the limit without an error", p.get("outcome") == "cap" and p.get("bytes", 0) > limit,
             "outcome %r after %s" % (p.get("outcome"), fmt_bytes(p.get("bytes"))))
    c.note("%s %s, past the limit" % (label, fmt_bytes(p.get("bytes"))))


def report_note(c, r):
    rep = r.report or {}
    devs = rep.get("devices") or []
    if devs:
        c.note("shim report: peak in use " + ", ".join("%s (dev %s)" % (fmt_bytes(d.get("peak_in_use")),
                                                                      d.get("ordinal")) for d in devs))


# ---------------------------------------------------------------------------------------------
# Scenarios: PyTorch
# ---------------------------------------------------------------------------------------------

def torch_limits(t):
    """device_count, get_device_properties().total_memory and mem_get_info() under byte,
    fraction and per-device limits; without the shim the physical totals."""
    L, phys, uu = t.limit, t.physical(), t.uuids()

    def check_info(c, v, totals):
        expect_view(c, v, uu, totals)
        for x, want in zip(v.extra.get("devices", []), totals):
            c.eq("cuda:%d mem_get_info total" % x["index"], x.get("mem_total"), want)
            free = x.get("mem_free", -1)
            c.expect("cuda:%d mem_get_info free" % x["index"], want - INFO_SLACK <= free <= want,
                     "%s, expected within %s below %s" % (fmt_bytes(free), fmt_bytes(INFO_SLACK), fmt_bytes(want)))

    with t.check("shim, limit %s" % fmt_bytes(L)) as c:
        check_info(c, see_torch(t.m, c, limit_env(L), True), [L] * t.m.n)
    with t.check("shim, limit 25%") as c:
        check_info(c, see_torch(t.m, c, limit_env("25%"), True), [p * 25 // 100 for p in phys])
    if t.m.n >= 2:
        with t.check("shim, GPUSHIM_MEMORY_LIMIT_1=%s" % fmt_bytes(L // 2)) as c:
            env = limit_env(L, GPUSHIM_MEMORY_LIMIT_1=size_arg(L // 2))
            check_info(c, see_torch(t.m, c, env, True), [L, L // 2] + [L] * (t.m.n - 2))
    with t.check("native") as c:
        v = see_torch(t.m, c, limit_env(L), False)  # the variable alone changes nothing
        expect_view(c, v, uu, phys)
        for x, want in zip(v.extra.get("devices", []), phys):
            c.eq("cuda:%d mem_get_info total" % x["index"], x.get("mem_total"), want)


def torch_fill_with(t, alloc_conf):
    L = t.limit
    cap = L + GIB
    env = {"PYTORCH_CUDA_ALLOC_CONF": alloc_conf} if alloc_conf else {}
    with t.check("shim, limit %s" % fmt_bytes(L)) as c:
        r = t.m.python_probe("torch_probe.py", "fill", CHUNK, cap, shim=True, env=limit_env(L, **env))
        d = c.result(r)
        c.expect("no error", "error" not in d, d.get("error"))
        fill_bounds(c, "filled", d.get("pass1"), L, SLACK)
        fill_bounds(c, "after free, refilled", d.get("pass2"), L, SLACK)
        if not alloc_conf:  # the native caching allocator reserves with plain cudaMalloc
            c.expect("max_memory_reserved ≤ limit", d.get("max_reserved", L + 1) <= L,
                     fmt_bytes(d.get("max_reserved")))
        expect_refusal_logged(c, r, L)
        report_note(c, r)
    with t.check("native") as c:
        d = c.result(t.m.python_probe("torch_probe.py", "fill", CHUNK, cap, shim=False, env=env))
        unconstrained_fill(c, "filled", d.get("pass1"), L)


def torch_fill(t):
    """256 MiB tensors until torch.cuda.OutOfMemoryError; free; again (default allocator)."""
    torch_fill_with(t, None)


def torch_fill_expandable(t):
    """The same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (cuMemCreate/cuMemMap)."""
    torch_fill_with(t, "expandable_segments:True")


def torch_fill_async(t):
    """The same with PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync (stream-ordered pools)."""
    torch_fill_with(t, "backend:cudaMallocAsync")


def torch_train(t):
    """30 training steps of a small MLP under the limit: the loss is finite and decreases."""
    L = t.limit
    for variant, shim, env in (("shim, limit %s" % fmt_bytes(L), True, limit_env(L)), ("native", False, {})):
        with t.check(variant) as c:
            d = c.result(t.m.python_probe("torch_probe.py", "train", 30, shim=shim, env=env))
            c.expect("no error", "error" not in d, d.get("error"))
            losses = d.get("losses", [])
            c.eq("steps", len(losses), 30)
            if losses:
                c.expect("loss finite", all(math.isfinite(x) for x in losses), losses)
                c.expect("loss decreases", losses[-1] < losses[0], "%.4f → %.4f" % (losses[0], losses[-1]))
                c.note("loss %.3f → %.3f in %.2f s" % (losses[0], losses[-1], d.get("seconds", 0)))
            if shim:
                c.expect("max_memory_reserved ≤ limit", d.get("max_reserved", L + 1) <= L,
                         fmt_bytes(d.get("max_reserved")))


# ---------------------------------------------------------------------------------------------
# Scenarios: JAX, CuPy
# ---------------------------------------------------------------------------------------------

def jax_prealloc(t):
    """JAX's default preallocation (75% of what cuMemGetInfo reports) takes its share of the
    limit, not of the GPU; an array past the limit fails with RESOURCE_EXHAUSTED; exit 0."""
    L = t.limit
    for variant, shim, env in (("shim, limit %s" % fmt_bytes(L), True, limit_env(L)), ("native", False, {})):
        with t.check(variant) as c:
            with nvml_monitor(t.m) as mon:
                r = t.m.python_probe("jax_probe.py", "prealloc", L, 1500, shim=shim, env=env)
            d = c.result(r)
            c.eq("exit status", r.rc, 0)
            c.expect("no error", "error" not in d, d.get("error"))
            plat = [x.get("platform") for x in d.get("devices", [])]
            c.expect("JAX runs on the GPU", plat and plat[0] in ("gpu", "cuda"), "devices: %s" % plat)
            limit = d.get("stats_before", {}).get("bytes_limit")
            peak = mon.peak_delta() if mon else None
            if shim:
                c.expect("memory_stats()['bytes_limit'] ≤ limit", limit is not None and limit <= L, fmt_bytes(limit))
                c.expect("memory_stats()['bytes_limit'] ≥ half the limit (75% of it expected)",
                         limit is not None and limit >= L // 2, fmt_bytes(limit))
                c.expect("an array of %s is refused with RESOURCE_EXHAUSTED" % fmt_bytes(L),
                         "RESOURCE_EXHAUSTED" in str(d.get("big")), d.get("big"))
                c.eq("a small computation afterwards", d.get("small"), 1024.0)
                if peak is not None:
                    c.expect("device memory the process holds (NVML) ≤ limit + %s (context)" % fmt_bytes(CONTEXT_SLACK),
                             peak <= L + CONTEXT_SLACK, fmt_bytes(peak))
            else:
                c.expect("bytes_limit > limit (unconstrained)", limit is not None and limit > L, fmt_bytes(limit))
                c.eq("an array of %s" % fmt_bytes(L), d.get("big"), "ok")
                if peak is not None:
                    c.expect("device memory the process holds (NVML) > limit", peak > L, fmt_bytes(peak))
            c.note("bytes_limit %s%s" % (fmt_bytes(limit), ", NVML: the process held %s" % fmt_bytes(peak)
                                         if peak is not None else ""))


def jax_platform(t):
    """XLA_PYTHON_CLIENT_ALLOCATOR=platform, no preallocation: every array is a driver
    allocation; 256 MiB arrays until the shim refuses one: RESOURCE_EXHAUSTED at the limit."""
    L = t.limit
    cap = L + GIB
    xla = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}
    with t.check("shim, limit %s" % fmt_bytes(L)) as c:
        r = t.m.python_probe("jax_probe.py", "chunks", CHUNK, cap, shim=True, env=limit_env(L, **xla))
        d = c.result(r)
        c.eq("exit status", r.rc, 0)
        c.expect("no error", "error" not in d, d.get("error"))
        oom = "RESOURCE_EXHAUSTED" in str(d.get("outcome")) or "out of memory" in str(d.get("outcome")).lower()
        fill_bounds(c, "allocated", dict(d, outcome="oom" if oom else d.get("outcome")), L, SLACK)
        c.eq("a small computation afterwards", d.get("small"), 1024.0)
        expect_refusal_logged(c, r, L)
    with t.check("native") as c:
        d = c.result(t.m.python_probe("jax_probe.py", "chunks", CHUNK, cap, shim=False, env=xla))
        unconstrained_fill(c, "allocated", d, L)


def cupy_with(t, pool):
    L, phys = t.limit, t.physical()
    cap = L + GIB
    with t.check("shim, limit %s" % fmt_bytes(L)) as c:
        r = t.m.python_probe("cupy_probe.py", pool, CHUNK, cap, shim=True, env=limit_env(L))
        d = c.result(r)
        c.expect("no error", "error" not in d, d.get("error"))
        c.eq("totalGlobalMem", d.get("total"), L)
        c.eq("memGetInfo total", d.get("mem_total"), L)
        fill_bounds(c, "filled", d.get("pass1"), L, SLACK, ("oom", "oom-runtime"))
        fill_bounds(c, "after free, refilled", d.get("pass2"), L, SLACK, ("oom", "oom-runtime"))
        c.eq("a small computation afterwards", d.get("small"), 523776.0)
        expect_refusal_logged(c, r, L)
    with t.check("native") as c:
        d = c.result(t.m.python_probe("cupy_probe.py", pool, CHUNK, cap, shim=False))
        c.eq("totalGlobalMem", d.get("total"), phys[0])
        unconstrained_fill(c, "filled", d.get("pass1"), L)


def cupy_pool(t):
    """CuPy's default memory pool up to and past the limit: cupy.cuda.memory.OutOfMemoryError."""
    cupy_with(t, "default")


def cupy_async_pool(t):
    """cupy.cuda.MemoryAsyncPool (cudaMallocAsync) up to and past the limit."""
    cupy_with(t, "async")


# ---------------------------------------------------------------------------------------------
# Scenarios: plain CUDA programs
# ---------------------------------------------------------------------------------------------

def c_program_limits(t, which):
    """Shared by the runtime and driver-API programs: totals, cuMemGetInfo, a fill that stops
    exactly at the limit, one allocation of exactly the limit (admitted) and one 2 MiB more."""
    L, phys, n = t.limit, t.physical(), t.m.n
    cap = L + GIB
    exe, label = None, None

    def ops(dev, cap):
        steps = ["ids", "fill=%d:%d:%d" % (dev, CHUNK, cap)]
        if which == "driver":
            steps.append("free")
        return steps + ["exact=%d:%d" % (dev, L), "exact=%d:%d" % (dev, L + 2 * MIB)]

    def run(c, env, shim, dev=0, cap=cap):
        nonlocal exe, label
        exe, label = t.m.build(which)
        c.note(label)
        r = t.m.run([exe] + ops(dev, cap), shim=shim, env=env)
        return r, c.kv(r)

    def totals(c, d, want, slack=INFO_SLACK):
        c.eq("device count", int(d.get("count", -1)), n)
        for i, w in enumerate(want):
            c.eq("device %d total" % i, int(d.get("dev%d.total" % i, -1)), w)
            c.eq("device %d cuMemGetInfo total" % i, int(d.get("dev%d.info.total" % i, -1)), w)
            free = int(d.get("dev%d.info.free" % i, -1))
            c.expect("device %d cuMemGetInfo free" % i, w - slack <= free <= w, fmt_bytes(free))

    def limited_fill(c, d, limit, dev):
        want = limit // CHUNK * CHUNK
        c.eq("fill stops at", int(d.get("fill.bytes", -1)), want)
        c.eq("the refused allocation's error", int(d.get("fill.rc", -1)), OOM_CUDA)
        c.note("filled %s, then error %s" % (fmt_bytes(int(d.get("fill.bytes", 0))), d.get("fill.rc")))

    with t.check("shim, limit %s" % fmt_bytes(L)) as c:
        r, d = run(c, limit_env(L), True)
        totals(c, d, [L] * n)
        limited_fill(c, d, L, 0)
        c.eq("one allocation of exactly the limit", d.get("exact.%d.rc" % L), "0")
        c.eq("one allocation of the limit + 2 MiB", d.get("exact.%d.rc" % (L + 2 * MIB)), str(OOM_CUDA))
        expect_refusal_logged(c, r, L)
    with t.check("shim, limit 25%") as c:
        want = [p * 25 // 100 for p in phys]
        r, d = run(c, limit_env("25%"), True, cap=want[0] + GIB)
        totals(c, d, want)
        limited_fill(c, d, want[0], 0)
    if n >= 2:
        with t.check("shim, GPUSHIM_MEMORY_LIMIT_1=%s" % fmt_bytes(L // 2)) as c:
            r, d = run(c, limit_env(L, GPUSHIM_MEMORY_LIMIT_1=size_arg(L // 2)), True, dev=1)
            totals(c, d, [L, L // 2] + [L] * (n - 2))
            limited_fill(c, d, L // 2, 1)
    with t.check("native") as c:
        r, d = run(c, {}, False)
        totals(c, d, phys, NATIVE_INFO_SLACK)
        c.expect("fill passes the limit", d.get("fill.rc") == "0" and int(d.get("fill.bytes", 0)) >= cap,
                 "rc %s after %s" % (d.get("fill.rc"), fmt_bytes(int(d.get("fill.bytes", 0)))))
        c.eq("one allocation of the limit + 2 MiB", d.get("exact.%d.rc" % (L + 2 * MIB)), "0")


def cudart_program(t):
    """A runtime program (nvcc -cudart static; gcc + libcudart.so without nvcc):
    cudaGetDeviceProperties, cudaMemGetInfo, cudaMalloc up to and past the limit."""
    c_program_limits(t, "cudart")


def driver_api(t):
    """A driver-API program linked with -lcuda: cuDeviceTotalMem_v2, cuMemGetInfo_v2,
    cuMemAlloc_v2 up to and past the limit."""
    c_program_limits(t, "driver")


def driver_dlopen(t):
    """The driver through dlopen + dlsym (Python ctypes), as XLA and cudarc reach it."""
    L, phys = t.limit, t.physical()
    cap = L + GIB
    for variant, shim, env, totals in (("shim, limit %s" % fmt_bytes(L), True, limit_env(L), [L] * t.m.n),
                                       ("native", False, {}, phys)):
        with t.check(variant) as c:
            d = c.result(t.m.python_probe("cuda_info.py", "--no-nvml", "--fill", "0:%d:%d" % (CHUNK, cap),
                                          shim=shim, env=env))
            devs = d["driver"].get("devices", [])
            c.eq("cuDeviceTotalMem_v2", [x["total"] for x in devs], totals)
            c.eq("cuMemGetInfo_v2 total", [x["info_total"] for x in devs], totals)
            f = d.get("fill", {})
            if shim:
                c.eq("cuMemAlloc_v2 fill stops at", f.get("bytes"), L)
                c.eq("the refused allocation's CUresult", f.get("rc"), OOM_CUDA)
            else:
                c.expect("cuMemAlloc_v2 fill passes the limit", f.get("rc") == 0 and f.get("bytes", 0) >= cap, f)
            c.note("cuMemAlloc_v2 filled %s" % fmt_bytes(f.get("bytes")))


def entry_point(t):
    """cuMemAlloc / cuMemFree from cudaGetDriverEntryPoint[ByVersion] (the runtime's
    cuGetProcAddress) up to and past the limit."""
    L = t.limit
    cap = L + GIB
    for variant, shim, env in (("shim, limit %s" % fmt_bytes(L), True, limit_env(L)), ("native", False, {})):
        with t.check(variant) as c:
            exe, label = t.m.build("cudart")
            d = c.kv(t.m.run([exe, "entry=0:%d:%d" % (CHUNK, cap)], shim=shim, env=env))
            c.eq("cudaGetDriverEntryPoint found cuMemAlloc and cuMemFree", d.get("entry.found"), "1")
            b = int(d.get("entry.bytes", -1))
            if shim:
                c.eq("fill through the entry point stops at", b, L)
                c.eq("the refused allocation's CUresult", d.get("entry.rc"), str(OOM_CUDA))
            else:
                c.expect("fill through the entry point passes the limit", d.get("entry.rc") == "0" and b >= cap,
                         "rc %s after %s" % (d.get("entry.rc"), fmt_bytes(b)))
            c.note("%s; filled %s" % (label, fmt_bytes(b)))


# ---------------------------------------------------------------------------------------------
# Scenarios: NVML
# ---------------------------------------------------------------------------------------------

def nvml_limits(t, viewer):
    L, uu = t.limit, t.uuids()
    with t.check("shim, limit %s" % fmt_bytes(L)) as c:
        v = VIEWERS[viewer](t.m, c, limit_env(L), True)
        expect_view(c, v, uu, [L] * len(uu))
        for x in v.extra.get("devices", []):  # pynvml only: used and free within the limit
            c.expect("device %d: used ≤ total" % x["index"], x["used"] <= x["total"], x)
            c.expect("device %d: used + free ≤ total" % x["index"], x["used"] + x["free"] <= x["total"], x)
    with t.check("shim, visible: GPU 0 by UUID, limit %s" % fmt_bytes(L)) as c:
        v = VIEWERS[viewer](t.m, c, limit_env(L, GPUSHIM_VISIBLE_DEVICES=uu[0]), True)
        expect_view(c, v, uu[:1], [L])
    with t.check("native") as c:
        v = VIEWERS[viewer](t.m, c, {}, False)
        expect_view(c, v, uu, physical_totals(t, viewer, uu))


def nvidia_smi(t):
    """nvidia-smi --query-gpu=index,uuid,memory.total in the shim's environment: the limit as
    total, only the visible devices."""
    nvml_limits(t, "nvidia-smi")


def pynvml_view(t):
    """pynvml: count, UUIDs, handles by UUID, memory info (total = limit, used + free ≤ total)."""
    nvml_limits(t, "pynvml")


# ---------------------------------------------------------------------------------------------
# Scenarios: which devices the program sees
# ---------------------------------------------------------------------------------------------

def visible_none(t):
    """GPUSHIM_VISIBLE_DEVICES=none: no device, through every access path."""
    each_viewer(t, ALL_VIEWERS, "shim, none", {"GPUSHIM_VISIBLE_DEVICES": "none"}, True,
                lambda c, v: expect_view(c, v, []))
    each_viewer(t, [primary_viewer(t.m)], "native (variable ignored)", {"GPUSHIM_VISIBLE_DEVICES": "none"}, False,
                lambda c, v: expect_view(c, v, t.uuids()))


def visible_uuid(t):
    """By UUID (GPU 0, full), by UUID prefix and by PCI bus id: exactly that device."""
    uu, devs = t.uuids(), t.m.devices
    each_viewer(t, ALL_VIEWERS, "shim, GPU 0 by UUID", {"GPUSHIM_VISIBLE_DEVICES": uu[0]}, True,
                lambda c, v: expect_view(c, v, uu[:1]))
    last = t.m.n - 1
    each_viewer(t, [primary_viewer(t.m), "pynvml"], "shim, UUID prefix %s" % uu[last][:12],
                {"GPUSHIM_VISIBLE_DEVICES": uu[last][:12]}, True, lambda c, v: expect_view(c, v, [uu[last]]))
    each_viewer(t, [primary_viewer(t.m), "pynvml"], "shim, PCI bus id %s" % devs[last]["pci"],
                {"GPUSHIM_VISIBLE_DEVICES": devs[last]["pci"]}, True, lambda c, v: expect_view(c, v, [uu[last]]))
    each_viewer(t, [primary_viewer(t.m)], "native (variable ignored)", {"GPUSHIM_VISIBLE_DEVICES": uu[last]}, False,
                lambda c, v: expect_view(c, v, uu))


def visible_reorder(t):
    """GPUSHIM_VISIBLE_DEVICES=1,0: the first two devices, swapped, everywhere."""
    uu = t.uuids()
    each_viewer(t, ALL_VIEWERS, "shim, 1,0", {"GPUSHIM_VISIBLE_DEVICES": "1,0"}, True,
                lambda c, v: expect_view(c, v, [uu[1], uu[0]]))
    each_viewer(t, [primary_viewer(t.m)], "native (variable ignored)", {"GPUSHIM_VISIBLE_DEVICES": "1,0"}, False,
                lambda c, v: expect_view(c, v, uu))


def visible_compose(t):
    """Selectors are ordinals among what CUDA_VISIBLE_DEVICES already shows; selecting a device
    it hides is a configuration error."""
    uu = t.uuids()
    views = ("torch", "cudart", "pynvml")
    if t.m.n >= 2:
        each_viewer(t, views, "shim, CUDA_VISIBLE_DEVICES=1,0 GPUSHIM_VISIBLE_DEVICES=1", {"CUDA_VISIBLE_DEVICES": "1,0",
                                                                    "GPUSHIM_VISIBLE_DEVICES": "1"}, True,
                    lambda c, v: expect_view(c, v, [uu[0]]))
        each_viewer(t, views, "shim, CUDA_VISIBLE_DEVICES=uuid1,uuid0 GPUSHIM_VISIBLE_DEVICES=0",
                    {"CUDA_VISIBLE_DEVICES": "%s,%s" % (uu[1], uu[0]), "GPUSHIM_VISIBLE_DEVICES": "0"}, True,
                    lambda c, v: expect_view(c, v, [uu[1]]))
    else:
        each_viewer(t, views, "shim, CUDA_VISIBLE_DEVICES=0 GPUSHIM_VISIBLE_DEVICES=0", {"CUDA_VISIBLE_DEVICES": "0",
                                                                  "GPUSHIM_VISIBLE_DEVICES": "0"}, True,
                    lambda c, v: expect_view(c, v, [uu[0]]))
    line = ('gpushim: GPUSHIM_VISIBLE_DEVICES="1": there is no device 1: 1 device is visible '
            '(CUDA_VISIBLE_DEVICES=0)')

    def refused(c, v):
        c.eq("%s: device count" % v.viewer, v.count, 0)
        if expect_config_error(c, v.run, line):
            c.note("no device; stderr: " + line)

    each_viewer(t, ("torch", "cudart"), "shim, CUDA_VISIBLE_DEVICES=0 GPUSHIM_VISIBLE_DEVICES=1 (error)",
                {"CUDA_VISIBLE_DEVICES": "0", "GPUSHIM_VISIBLE_DEVICES": "1"}, True, refused)
    each_viewer(t, [primary_viewer(t.m)], "native, CUDA_VISIBLE_DEVICES=0 GPUSHIM_VISIBLE_DEVICES=1",
                {"CUDA_VISIBLE_DEVICES": "0", "GPUSHIM_VISIBLE_DEVICES": "1"}, False,
                lambda c, v: expect_view(c, v, uu[:1]))


def private_tables(t):
    """The runtime's device-integrity check (cudaErrorSoftwareValidityNotEstablished, 103) and
    its private tables agree with the view: kernels, memsets and copies work under
    GPUSHIM_VISIBLE_DEVICES. Every visible-* run above checks the same on its output."""
    uu = t.uuids()
    each_viewer(t, ("torch", "cudart"), "shim, GPU 0 by UUID", {"GPUSHIM_VISIBLE_DEVICES": uu[0]}, True,
                lambda c, v: expect_view(c, v, uu[:1]))
    if t.m.n >= 2:
        each_viewer(t, ("torch", "cudart"), "shim, 1,0", {"GPUSHIM_VISIBLE_DEVICES": "1,0"}, True,
                    lambda c, v: expect_view(c, v, [uu[1], uu[0]]))
        each_viewer(t, ("torch", "cudart"), "shim, 1", {"GPUSHIM_VISIBLE_DEVICES": "1"}, True,
                    lambda c, v: expect_view(c, v, [uu[1]]))


# ---------------------------------------------------------------------------------------------
# Scenarios: configuration errors
# ---------------------------------------------------------------------------------------------

def config_error(t):
    """GPUSHIM_MEMORY_LIMIT='4 gigs': no usable device, and exactly one line saying why."""

    def refused(c, v):
        c.eq("%s: device count" % v.viewer, v.count, 0)
        lines = [l for l in v.run.stderr.splitlines() if l == CONFIG_ERROR_LINE]
        if c.eq("stderr lines equal to %r" % CONFIG_ERROR_LINE, len(lines), 1):
            c.note("no device; the message, once")

    env = {"GPUSHIM_MEMORY_LIMIT": "4 gigs"}
    each_viewer(t, CUDA_VIEWERS, "shim", env, True, refused)
    each_viewer(t, [primary_viewer(t.m)], "native (variable ignored)", env, False,
                lambda c, v: expect_view(c, v, t.uuids()))


def unimplemented_refused(t):
    """Each feature listed in NOT_IMPLEMENTED is refused (fail-closed), never ignored."""
    if not NOT_IMPLEMENTED:
        raise Skip("every feature is implemented")
    for feature, env in NOT_IMPLEMENTED.items():
        def refused(c, v):
            c.eq("%s: device count" % v.viewer, v.count, 0)
            for line in expect_config_error(c, v.run, NOT_AVAILABLE)[:1]:
                c.note("no device; " + line)
        each_viewer(t, [primary_viewer(t.m)], "shim, %s" % " ".join("%s=%s" % kv for kv in env.items()), env, True,
                    refused)


# ---------------------------------------------------------------------------------------------
# Scenarios of features (each SKIP while listed in NOT_IMPLEMENTED)
# ---------------------------------------------------------------------------------------------

def virtual_devices(t):
    """GPUSHIM_VIRTUAL_DEVICES=0:2x<limit>: GPU 0 becomes two devices of the limit each; tensors
    on both, .to() between them, an OOM per device at its own size."""
    V, n = t.limit, t.m.n
    env = {"GPUSHIM_VIRTUAL_DEVICES": "0:2x%s" % size_arg(V)}
    with t.check("shim, torch, 0:2x%s" % fmt_bytes(V)) as c:
        if viewer_missing(t.m, "torch"):
            raise Skip(viewer_missing(t.m, "torch"))
        d = c.result(t.m.python_probe("torch_probe.py", "pair", CHUNK, V + GIB, shim=True, env=env))
        c.eq("torch.cuda.device_count()", d.get("device_count"), n + 1)
        c.eq("total_memory of cuda:0, cuda:1", [x.get("total_memory") for x in d.get("devices", [])[:2]], [V, V])
        c.eq(".to() between the two", d.get("copy"), "ok")
        fill_bounds(c, "cuda:0 filled", d.get("fill0"), V, SLACK)
        fill_bounds(c, "cuda:1 filled", d.get("fill1"), V, SLACK)
    with t.check("shim, cudart, 0:2x%s" % fmt_bytes(V)) as c:
        exe, label = t.m.build("cudart")
        r = t.m.run([exe, "ids", "touch", "fill=1:%d:%d" % (CHUNK, V + GIB)], shim=True, env=env)
        d = c.kv(r)
        c.eq("device count", int(d.get("count", -1)), n + 1)
        c.eq("totals of devices 0, 1", [int(d.get("dev%d.total" % i, -1)) for i in (0, 1)], [V, V])
        c.eq("device 1 fill stops at", int(d.get("fill.bytes", -1)), V)
        expect_no_integrity_error(c, r)
    with t.check("native") as c:
        v = see_torch(t.m, c, env, False) if not viewer_missing(t.m, "torch") else see_cudart(t.m, c, env, False)
        expect_view(c, v, t.uuids())


def mode_fill(t, mode):
    """Shared by the grow and preallocate scenarios: PyTorch fills to the limit, and a
    driver-API program whose device memory an NVML monitor follows from outside."""
    L = t.limit
    env = limit_env(L, GPUSHIM_MEMORY_MODE=mode)
    with t.check("shim, torch, %s, limit %s" % (mode, fmt_bytes(L))) as c:
        if viewer_missing(t.m, "torch"):
            raise Skip(viewer_missing(t.m, "torch"))
        d = c.result(t.m.python_probe("torch_probe.py", "fill", CHUNK, L + GIB, shim=True, env=env))
        fill_bounds(c, "filled", d.get("pass1"), L, SLACK)
        fill_bounds(c, "after free, refilled", d.get("pass2"), L, SLACK)
    with t.check("shim, driver API, %s, limit %s" % (mode, fmt_bytes(L))) as c:
        exe, label = t.m.build("driver")
        ops = ["ctx=0", "mark=ctx", "sleep=1500", "mark=filling", "fill=0:%d:%d" % (CHUNK, L + GIB), "mark=filled",
               "sleep=1000", "mark=freeing", "free", "mark=freed", "sleep=1500", "mark=end", "info=0"]
        with nvml_monitor(t.m) as mon:
            r = t.m.run([exe] + ops, shim=True, env=env)
        d = c.kv(r)
        c.eq("fill stops at", int(d.get("fill.bytes", -1)), L)
        c.eq("the refused allocation's error", int(d.get("fill.rc", -1)), OOM_CUDA)
        c.eq("cuMemGetInfo total", int(d.get("info.0.total", -1)), L)
        if mon is None:
            c.note("no NVML monitor here: what the driver holds is not checked")
            return
        mark = {k[5:]: float(v) for k, v in d.items() if k.startswith("mark.")}
        held_before = mon.peak_delta(mark["ctx"] + 0.5, mark["filling"])
        held_filled = mon.peak_delta(mark["filled"], mark["freeing"])
        held_after = mon.min_delta(mark["freed"] + 0.5, mark["end"])
        c.note("NVML: %s held after the context, %s filled, %s after the free"
               % (fmt_bytes(held_before), fmt_bytes(held_filled), fmt_bytes(held_after)))
        if mode == "preallocate":
            c.expect("the whole limit is reserved when the context is created", held_before is not None and
                     held_before >= L - 256 * MIB, fmt_bytes(held_before))
        if mode in ("grow", "preallocate"):
            c.expect("freed memory stays with the process", held_after is not None and held_filled is not None and
                     held_after >= held_filled - 256 * MIB, "%s of %s" % (fmt_bytes(held_after),
                                                                       fmt_bytes(held_filled)))


def mode_grow(t):
    """GPUSHIM_MEMORY_MODE=grow: allocate lazily, keep freed memory, never give it back."""
    mode_fill(t, "grow")


def mode_preallocate(t):
    """GPUSHIM_MEMORY_MODE=preallocate: the whole limit reserved at context creation."""
    mode_fill(t, "preallocate")


def shared_quota(t):
    """GPUSHIM_SHARED_QUOTA: two driver-API processes at once on one limit. The first holds half
    of it; the second then fills only the other half with a quota, the whole limit without one
    (per-process limits), and past it without the shim."""
    L = t.limit
    half = L // 2 // CHUNK * CHUNK
    exe, label = t.m.build("driver")
    state = tempfile.mkdtemp(prefix="gpushim-quota-")
    os.chmod(state, 0o700)

    def pair(c, env, shim):
        """The holder fills `half` and keeps it for 8 s; the second process starts 3 s later
        and fills up to the limit + 1 GiB. Returns both key=value dicts."""
        c.note(label)
        env = dict(env, GPUSHIM_STATE_DIR=state)
        runs = {}
        holder_ops = ["ctx=0", "fill=0:%d:%d" % (CHUNK, half), "mark=held", "sleep=8000", "free"]
        th = threading.Thread(target=lambda: runs.update(a=t.m.run([exe] + holder_ops, shim=shim, env=env,
                                                                     report=False)))
        th.start()
        time.sleep(3)
        runs["b"] = t.m.run([exe, "ctx=0", "mark=start", "fill=0:%d:%d" % (CHUNK, L + GIB), "info=0", "free"],
                            shim=shim, env=env, report=False)
        th.join()
        a, b = c.kv(runs["a"]), c.kv(runs["b"])
        c.eq("the holder's fill", int(a.get("fill.bytes", -1)), half)
        c.expect("the holder held its memory before the second process filled",
                 float(a.get("mark.held", 1e18)) < float(b.get("mark.start", 0)),
                 "held at %s, second started at %s" % (a.get("mark.held"), b.get("mark.start")))
        return a, b

    with t.check("shim, quota, limit %s, holder %s" % (fmt_bytes(L), fmt_bytes(half))) as c:
        a, b = pair(c, limit_env(L, GPUSHIM_SHARED_QUOTA="gpu-validate"), True)
        c.eq("the second fills what the holder left", int(b.get("fill.bytes", -1)), (L - half) // CHUNK * CHUNK)
        c.eq("its refused allocation's error", int(b.get("fill.rc", -1)), OOM_CUDA)
        c.eq("its cuMemGetInfo total", int(b.get("info.0.total", -1)), L)
    with t.check("shim, no quota (limits per process)") as c:
        a, b = pair(c, limit_env(L), True)
        c.eq("the second fills a whole limit of its own", int(b.get("fill.bytes", -1)), L // CHUNK * CHUNK)
    with t.check("native") as c:
        a, b = pair(c, {}, False)
        c.expect("the second fills past the limit", int(b.get("fill.bytes", 0)) >= L + GIB,
                 fmt_bytes(int(b.get("fill.bytes", 0))))
    shutil.rmtree(state, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# The scenario table
# ---------------------------------------------------------------------------------------------

class Scenario:
    def __init__(self, name, group, func, requires=(), feature=None):
        self.name, self.group, self.func, self.requires, self.feature = name, group, func, requires, feature
        self.title = " ".join((func.__doc__ or "").split())


SCENARIOS = [
    #         name                     group         function               requires                     feature
    Scenario("torch-limits", "pytorch", torch_limits, ("driver", "torch")),
    Scenario("torch-fill", "pytorch", torch_fill, ("driver", "torch")),
    Scenario("torch-fill-expandable", "pytorch", torch_fill_expandable, ("driver", "torch")),
    Scenario("torch-fill-async", "pytorch", torch_fill_async, ("driver", "torch")),
    Scenario("torch-train", "pytorch", torch_train, ("driver", "torch")),
    Scenario("jax-prealloc", "jax", jax_prealloc, ("driver", "jax")),
    Scenario("jax-platform", "jax", jax_platform, ("driver", "jax")),
    Scenario("cupy-pool", "cupy", cupy_pool, ("driver", "cupy")),
    Scenario("cupy-async-pool", "cupy", cupy_async_pool, ("driver", "cupy")),
    Scenario("cudart-program", "cuda", cudart_program, ("driver", "build:cudart")),
    Scenario("driver-api", "cuda", driver_api, ("driver", "build:driver")),
    Scenario("driver-dlopen", "cuda", driver_dlopen, ("driver",)),
    Scenario("entry-point", "cuda", entry_point, ("driver", "build:cudart")),
    Scenario("nvidia-smi", "nvml", nvidia_smi, ("driver", "nvml", "nvidia-smi")),
    Scenario("pynvml", "nvml", pynvml_view, ("driver", "nvml", "pynvml")),
    Scenario("visible-none", "visibility", visible_none, ("driver", "nvml")),
    Scenario("visible-uuid", "visibility", visible_uuid, ("driver", "nvml")),
    Scenario("visible-reorder", "visibility", visible_reorder, ("driver", "nvml", "2gpus")),
    Scenario("visible-compose", "visibility", visible_compose, ("driver", "nvml")),
    Scenario("private-tables", "visibility", private_tables, ("driver", "nvml")),
    Scenario("config-error", "config", config_error, ("driver",)),
    Scenario("unimplemented-refused", "config", unimplemented_refused, ("driver",)),
    Scenario("virtual-devices", "features", virtual_devices, ("driver",), feature="virtual-devices"),
    Scenario("mode-grow", "features", mode_grow, ("driver",), feature="mode-grow"),
    Scenario("mode-preallocate", "features", mode_preallocate, ("driver",), feature="mode-preallocate"),
    Scenario("shared-quota", "features", shared_quota, ("driver",), feature="shared-quota"),
    # the compute share: scenarios in compute_share.py
    Scenario("compute-pair", "compute", compute_pair, ("driver", "torch")),
    Scenario("compute-graph", "compute", compute_graph, ("driver", "torch")),
    Scenario("compute-overhead", "compute", compute_overhead, ("driver", "torch")),
    Scenario("compute-green", "compute", compute_green, ("driver", "torch")),
]


def missing_prerequisites(m, s, include_unimplemented):
    """Every reason this scenario cannot run here (all of them, not just the first)."""
    if s.feature in NOT_IMPLEMENTED and not include_unimplemented:
        return ["not implemented in this version (%s: a configuration error today; listed in NOT_IMPLEMENTED, "
                "scripts/gpu/common.py)" % " ".join("%s=%s" % kv for kv in NOT_IMPLEMENTED[s.feature].items())]
    reasons = []
    for req in s.requires:
        if req == "driver":
            if m.driver_reason:
                reasons.append(m.driver_reason)
        elif req == "nvml":
            if m.nvml_reason and not m.driver_reason:
                reasons.append(m.nvml_reason)
        elif req in ("torch", "jax", "cupy", "pynvml"):
            if not m.has(req):
                reasons.append(m.module_reason(req))
        elif req == "nvidia-smi":
            if m.simulated:
                reasons.append("--simulated: nvidia-smi talks to the real driver")
            elif not m.nvidia_smi:
                reasons.append("nvidia-smi not found on PATH")
        elif req == "2gpus":
            if not m.driver_reason and m.n < 2:
                reasons.append("needs 2 GPUs; this machine has %d" % m.n)
        elif req.startswith("build:"):
            try:
                m.build(req[6:])
            except Skip as e:
                reasons.append(str(e))
            except BuildError:
                pass  # reported as the scenario's FAIL
    if not m.driver_reason and "driver" in s.requires and m.limit() < 512 * MIB:
        reasons.append("the GPU is too small for the limits used here (%s)" % fmt_bytes(m.physical_total()))
    out = []
    for r in reasons:
        if r not in out:
            out.append(r)
    return out


def select(names):
    if not names:
        return list(SCENARIOS)
    wanted = [w.strip() for n in names for w in n.split(",") if w.strip()]
    chosen, unknown = [], []
    for w in wanted:
        hits = [s for s in SCENARIOS if fnmatch.fnmatch(s.name, w) or s.group == w]
        if not hits:
            unknown.append(w)
        chosen += [s for s in hits if s not in chosen]
    if unknown:
        raise FatalError("--only: unknown scenario or group %s; known: %s; groups: %s" % (
            ", ".join(unknown), ", ".join(s.name for s in SCENARIOS),
            ", ".join(sorted({s.group for s in SCENARIOS}))))
    return [s for s in SCENARIOS if s in chosen]


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------

def machine_summary(m):
    lines = ["gpu-validate: %s" % ("SIMULATED driver and NVML (2 x 16 GiB, not real hardware)" if m.simulated
                                   else "real hardware")]
    st = os.stat(m.library)
    lines.append("  library     %s (%s, built %s)" % (m.library, fmt_bytes(st.st_size),
                                                      time.strftime("%Y-%m-%d %H:%M", time.localtime(st.st_mtime))))
    if m.driver_reason:
        lines.append("  driver      %s" % m.driver_reason)
    else:
        lines.append("  driver      CUDA %s, %s" % (m.driver_version, m.libcuda_path or "libcuda.so.1"))
        for i, d in enumerate(m.devices):
            lines.append("  device %d    %s, %s, %s, %s" % (i, d["name"], d["uuid"], d["pci"], fmt_bytes(d["total"])))
        lines.append("  limit       %s (GPUSHIM_MEMORY_LIMIT=%s), fills in %s pieces"
                     % (fmt_bytes(m.limit()), size_arg(m.limit()), fmt_bytes(CHUNK)))
    lines.append("  NVML        %s" % (m.nvml_reason or "%d device(s)" % len(m.nvml_devices)))
    for name in ("torch", "jax", "cupy", "pynvml"):
        ok, what = m.modules[name]
        lines.append("  %-11s %s" % (name, what))
    lines.append("  nvcc        %s" % (m.nvcc or ("not used (--simulated)" if m.simulated else "not found")))
    lines.append("  gcc         %s" % (m.cc or "not found"))
    lines.append("  nvidia-smi  %s" % (m.nvidia_smi or ("not used (--simulated)" if m.simulated else "not found")))
    lines.append("  python      %s" % m.python)
    return "\n".join(lines)


def rows_of(results):
    rows = []
    for s, status, reason, checks, secs in results:
        if not checks:
            rows.append((s.name, "-", status, reason))
        for c in checks:
            rows.append((s.name, c.variant, c.status, "; ".join(c.notes) if c.status != FAIL else
                         "; ".join(c.failures[:2]) + (" …" if len(c.failures) > 2 else "")))
    return rows


def print_table(results):
    rows = rows_of(results)
    w0 = max([len("scenario")] + [len(r[0]) for r in rows])
    w1 = min(72, max([len("variant")] + [len(r[1]) for r in rows]))
    print()
    print("%-*s  %-*s  %-6s %s" % (w0, "scenario", w1, "variant", "result", "details"))
    print("%s  %s  %s %s" % ("-" * w0, "-" * w1, "-" * 6, "-" * 40))
    for name, variant, status, detail in rows:
        print("%-*s  %-*s  %-6s %s" % (w0, name, w1, short(variant, w1), status, short(detail, 160)))
    n = {k: sum(1 for r in rows if r[2] == k) for k in (PASS, FAIL, SKIP)}
    print()
    print("%d passed, %d failed, %d skipped" % (n[PASS], n[FAIL], n[SKIP]))
    return n


def print_failures(results):
    for s, status, reason, checks, secs in results:
        for c in checks:
            if c.status != FAIL:
                continue
            print()
            print("== FAIL %s / %s" % (s.name, c.variant))
            for f in c.failures:
                print("  - " + f.replace("\n", "\n    "))
            for r in c.runs:
                print(r.describe())


def to_json(m, results, counts, started, finished):
    return {
        "tool": "gpu-validate",
        "simulated": m.simulated,
        "started": started, "finished": finished,
        "library": m.library,
        "driver": {"reason_unusable": m.driver_reason, "version": m.driver_version, "devices": m.devices,
                   "nvml_reason_unusable": m.nvml_reason, "nvml_devices": m.nvml_devices},
        "limit": None if m.driver_reason else m.limit(),
        "modules": {k: {"ok": v[0], "detail": v[1]} for k, v in m.modules.items()},
        "tools": {"nvcc": m.nvcc, "gcc": m.cc, "nvidia-smi": m.nvidia_smi, "python": m.python},
        "not_implemented": sorted(NOT_IMPLEMENTED),
        "summary": {"pass": counts[PASS], "fail": counts[FAIL], "skip": counts[SKIP]},
        "scenarios": [{"name": s.name, "group": s.group, "title": s.title, "status": status, "reason": reason,
                       "seconds": round(secs, 2), "checks": [c.to_json() for c in checks]}
                      for s, status, reason, checks, secs in results],
    }


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------

def run_scenario(m, s, include_unimplemented):
    t0 = time.monotonic()
    reasons = missing_prerequisites(m, s, include_unimplemented)
    if reasons:
        return s, SKIP, "; ".join(reasons), [], time.monotonic() - t0
    t = Test(m)
    try:
        s.func(t)
    except Skip as e:
        return s, SKIP, str(e), [], time.monotonic() - t0
    except Exception as e:  # a bug of the harness: the scenario FAILs, the others still run
        c = Check("harness")
        c.status = FAIL
        c.failures.append("harness error: %s: %s\n%s" % (type(e).__name__, e, traceback.format_exc()))
        t.checks.append(c)
    statuses = [c.status for c in t.checks]
    status = FAIL if FAIL in statuses else PASS if PASS in statuses else SKIP
    reason = "; ".join(sorted({n for c in t.checks if c.status == SKIP for n in c.notes})) if status == SKIP else ""
    return s, status, reason, t.checks, time.monotonic() - t0


def main(argv):
    ap = argparse.ArgumentParser(prog="gpu-validate.sh", description=__doc__.split("\n\n")[0])
    ap.add_argument("--library", help="libgpushim.so to test (default: target/release/libgpushim.so, built "
                                      "with cargo if missing)")
    ap.add_argument("--build", action="store_true", help="run `cargo build --release -p gpushim` first")
    ap.add_argument("--only", action="append", default=[],
                    help="scenarios or groups to run: names, groups or globs, comma-separated (repeatable)")
    ap.add_argument("--timeout", type=int, default=120, help="seconds for each child process (default 120)")
    ap.add_argument("--json", default="gpu-validate.json", help="result file (default gpu-validate.json)")
    ap.add_argument("--simulated", action="store_true",
                    help="run on the project's simulated driver and NVML (no GPU needed; no frameworks)")
    ap.add_argument("--include-unimplemented", action="store_true",
                    help="also run the scenarios of features listed in NOT_IMPLEMENTED (they fail today)")
    ap.add_argument("--python", help="the Python that runs the framework probes (default: this one)")
    ap.add_argument("--list", action="store_true", help="list the scenarios and exit")
    args = ap.parse_args(argv)

    if args.list:
        for s in SCENARIOS:
            flag = " [not implemented]" if s.feature in NOT_IMPLEMENTED else ""
            print("%-24s %-11s %s%s" % (s.name, s.group, s.title, flag))
        return 0
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    try:
        chosen = select(args.only)
        m = Machine(library=args.library, build=args.build, simulated=args.simulated, timeout=args.timeout,
                    python=args.python)
    except FatalError as e:
        print("gpu-validate: error: %s" % e, file=sys.stderr)
        return 2
    try:
        print(machine_summary(m))
        print()
        results = []
        for s in chosen:
            res = run_scenario(m, s, args.include_unimplemented)
            results.append(res)
            _, status, reason, checks, secs = res
            print("%-5s %-24s %5.1f s  %s" % (status, s.name, secs, short(reason, 150) if reason else
                                               ", ".join("%s %s" % (c.status, c.variant) for c in checks
                                                         if c.status != PASS) or "all checks passed"), flush=True)
            counts = {k: sum(1 for r in rows_of(results) if r[2] == k) for k in (PASS, FAIL, SKIP)}
            write_json(args.json, to_json(m, results, counts, started, None))  # partial results survive a kill
        counts = print_table(results)
        print_failures(results)
        write_json(args.json, to_json(m, results, counts, started, time.strftime("%Y-%m-%dT%H:%M:%S%z")))
        print()
        print("results written to %s" % os.path.abspath(args.json))
        return 1 if counts[FAIL] else 0
    finally:
        m.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
