"""Shared machinery of scripts/gpu-validate.sh and scripts/gpu-bench.sh (standard library only).

* `Machine`: what this machine has — libgpushim.so (found or built), the NVIDIA driver and its
  devices as seen WITHOUT the shim (read once, in a child, through ctypes), NVML, PyTorch / JAX /
  CuPy / pynvml, nvcc / gcc / nvidia-smi — and, with --simulated, the project's simulated driver
  and NVML set up on LD_LIBRARY_PATH. Each missing prerequisite has a precise reason.
* `Machine.run`: one child process with a clean environment (no inherited GPUSHIM_*, LD_PRELOAD,
  CUDA_VISIBLE_DEVICES …), optionally with the shim preloaded, under a timeout that kills its
  whole process group; gives a `RunResult` with the output parsed.
* `Machine.build`: the C probes of scripts/gpu/, built with nvcc where it exists, else gcc.
* `NvmlMonitor`: samples device memory through NVML in this (unshimmed) process, to see what a
  child really holds on the GPU.
"""
import ctypes
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30

GPU_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(GPU_DIR))

# Features of SPEC.md this version of gpushim does not implement yet. Setting them is a
# configuration error today. The scenarios and benchmark variants that need them are listed as
# SKIP "not implemented in this version" while their name is here: delete the entry once the
# feature lands. Each value is an environment that asks for the feature (used to check that it
# is refused, fail-closed, as long as it is listed here).
NOT_IMPLEMENTED = {}

# Inherited variables that would change what a child sees; every child starts without them.
STRIPPED_PREFIXES = ("GPUSHIM_", "CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT", "CUDA_MPS_", "GPUSIM_")
STRIPPED = {"LD_PRELOAD", "CUDA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF", "JAX_PLATFORMS",
            "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION",
            "XLA_PYTHON_CLIENT_ALLOCATOR", "PYTORCH_NVML_BASED_CUDA_CHECK"}
# The variables shown with a command when a check fails.
SHOWN_PREFIXES = STRIPPED_PREFIXES + tuple(STRIPPED) + ("LD_LIBRARY_PATH", "PYTHONPATH")


class FatalError(Exception):
    """The harness cannot run at all (no libgpushim.so and no way to build it …)."""


class Skip(Exception):
    """A prerequisite is missing: the scenario or check is SKIP with this reason."""


class BuildError(Exception):
    """A probe program failed to compile: a FAIL, with the compiler's output."""


def fmt_bytes(n):
    if n is None:
        return "?"
    n = int(n)
    for unit, size in (("TiB", 1 << 40), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if abs(n) >= size:
            v = n / size
            return ("%d %s" % (v, unit)) if n % size == 0 else ("%.2f %s" % (v, unit))
    return "%d B" % n


def size_arg(n):
    """A byte count written as gpushim reads it back exactly (4GiB, 3584MiB, or bytes)."""
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n % size == 0:
            return "%d%s" % (n // size, unit)
    return str(n)


def norm_uuid(u):
    """`GPU-8f3a…`, `8f3a…` (torch's str(uuid)) and upper case all compare equal."""
    u = str(u or "").strip().lower()
    return u[4:] if u.startswith("gpu-") else u


def tail(text, lines=25):
    rows = (text or "").rstrip("\n").splitlines()
    if len(rows) > lines:
        rows = ["… (%d lines before)" % (len(rows) - lines)] + rows[-lines:]
    return "\n".join(rows)


class RunResult:
    def __init__(self, argv, shown_env, shim, rc, stdout, stderr, seconds, timed_out, timeout, report):
        self.argv, self.shown_env, self.shim = argv, shown_env, shim
        self.rc, self.stdout, self.stderr = rc, stdout, stderr
        self.seconds, self.timed_out, self.timeout, self.report = seconds, timed_out, timeout, report

    def kv(self):
        """`key=value` lines of stdout (the C probes)."""
        out = {}
        for line in self.stdout.splitlines():
            if "=" in line:
                k, v = line.split("=", 1)
                out[k.strip()] = v.strip()
        return out

    def result(self):
        """The `RESULT {json}` line of stdout (the Python probes), or None."""
        for line in reversed(self.stdout.splitlines()):
            if line.startswith("RESULT "):
                try:
                    return json.loads(line[7:])
                except ValueError:
                    return None
        return None

    def command(self):
        env = " ".join("%s=%s" % (k, shell_quote(v)) for k, v in sorted(self.shown_env.items()))
        return (env + " " if env else "") + " ".join(shell_quote(a) for a in self.argv)

    def describe(self):
        status = "timed out after %d s" % self.timeout if self.timed_out else "exit status %s" % self.rc
        parts = ["$ " + self.command(), "  %s, %.1f s" % (status, self.seconds)]
        for name, text in (("stdout", self.stdout), ("stderr", self.stderr)):
            if text.strip():
                parts.append("  --- %s ---" % name)
                parts.extend("  " + line for line in tail(text).splitlines())
        return "\n".join(parts)

    def to_json(self):
        return {"command": self.command(), "shim": self.shim, "rc": self.rc, "timed_out": self.timed_out,
                "seconds": round(self.seconds, 3), "stdout_tail": tail(self.stdout, 40),
                "stderr_tail": tail(self.stderr, 40), "shim_report": self.report}


def shell_quote(s):
    s = str(s)
    return s if re.fullmatch(r"[\w@%+=:,./-]+", s) else "'" + s.replace("'", "'\\''") + "'"


class Machine:
    def __init__(self, library=None, build=False, simulated=False, timeout=120, python=None, log=None):
        self.simulated = simulated
        self.timeout = timeout
        self.python = python or sys.executable or "python3"
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.work = tempfile.mkdtemp(prefix="gpushim-gpu-")
        self.base_env = self._clean_env()
        self._runs = 0
        self._builds = {}
        self.notes = []
        if simulated:
            self._setup_simulated(library is None or build)
        self.library = self._find_library(library, build)
        self._discover_driver()
        self._discover_tools()
        self._discover_python_modules()

    def close(self):
        shutil.rmtree(self.work, ignore_errors=True)

    # -- environment ------------------------------------------------------------------------

    def _clean_env(self):
        env = {}
        for k, v in os.environ.items():
            if k in STRIPPED or k.startswith(STRIPPED_PREFIXES):
                continue
            env[k] = v
        for k in ("LD_PRELOAD", "CUDA_VISIBLE_DEVICES"):
            if os.environ.get(k):
                self.log("note: %s=%s is set here; every child runs without it" % (k, os.environ[k]))
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        return env

    def _cargo_build(self, packages):
        cargo = shutil.which("cargo")
        if not cargo:
            raise FatalError("cargo is not installed, so %s cannot be built here" % ", ".join(packages))
        cmd = [cargo, "build", "--release"] + [a for p in packages for a in ("-p", p)]
        self.log("building: " + " ".join(cmd[1:]))
        p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if p.returncode != 0:
            raise FatalError("`%s` failed:\n%s" % (" ".join(cmd), tail(p.stdout, 40)))

    def target_dir(self):
        return os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")

    def _find_library(self, library, build):
        if library:
            path = os.path.abspath(library)
            if not os.path.isfile(path):
                raise FatalError("--library %s: no such file" % library)
            return path
        path = os.path.join(self.target_dir(), "release", "libgpushim.so")
        if self.simulated:  # built with the simulator by _setup_simulated
            if not os.path.isfile(path):
                raise FatalError("cargo did not produce %s" % path)
            return path
        if build or not os.path.isfile(path):
            if not shutil.which("cargo"):
                raise FatalError(
                    "libgpushim.so not found at %s and cargo is not installed to build it: build it on a machine "
                    "with Rust (`cargo build --release -p gpushim`) and copy it here, or pass --library PATH" % path)
            self._cargo_build(["gpushim"])
        if not os.path.isfile(path):
            raise FatalError("cargo did not produce %s" % path)
        return path

    def _setup_simulated(self, with_shim):
        """The project's simulated driver and NVML as libcuda.so.1 / libnvidia-ml.so.1."""
        self._cargo_build((["gpushim"] if with_shim else []) + ["gpusim-cuda", "gpusim-nvml"])
        release = os.path.join(self.target_dir(), "release")
        self.sim_dir = os.path.join(self.work, "simlib")
        os.makedirs(self.sim_dir)
        for link, lib in (("libcuda.so.1", "libcuda.so"), ("libcuda.so", "libcuda.so"),
                          ("libnvidia-ml.so.1", "libnvidia_ml.so"), ("libnvidia-ml.so", "libnvidia_ml.so")):
            target = os.path.join(release, lib)
            if not os.path.isfile(target):
                raise FatalError("the simulator library %s is missing after the build" % target)
            os.symlink(target, os.path.join(self.sim_dir, link))
        deps = os.path.join(ROOT, ".deps")
        if not (os.path.isfile(os.path.join(deps, "cuda12", "lib", "libcudart.so.12"))
                and os.path.isfile(os.path.join(deps, "python", "pynvml.py"))):
            self.log("fetching the CUDA runtime wheels: bash scripts/fetch-deps.sh")
            p = subprocess.run(["bash", os.path.join(ROOT, "scripts", "fetch-deps.sh")], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if p.returncode != 0:
                raise FatalError("scripts/fetch-deps.sh failed:\n" + tail(p.stdout, 20))
        old = self.base_env.get("LD_LIBRARY_PATH")
        self.base_env["LD_LIBRARY_PATH"] = self.sim_dir + (":" + old if old else "")
        self.base_env["GPUSIM_DEVICES"] = "2"
        self.base_env["GPUSIM_MEMORY"] = "16GiB"
        old = self.base_env.get("PYTHONPATH")
        self.base_env["PYTHONPATH"] = os.path.join(deps, "python") + (":" + old if old else "")

    # -- running children ------------------------------------------------------------------

    def run(self, argv, shim=False, env=None, timeout=None, report=True):
        """Runs argv in its own process group; env values of None unset a variable."""
        timeout = timeout or self.timeout
        self._runs += 1
        full = dict(self.base_env)
        shown = {}
        overrides = dict(env or {})
        if shim:
            overrides["LD_PRELOAD"] = self.library
            if report:
                overrides["GPUSHIM_REPORT"] = os.path.join(self.work, "report-%d.json" % self._runs)
        for k, v in overrides.items():
            if v is None:
                full.pop(k, None)
            else:
                full[k] = str(v)
                if k != "GPUSHIM_REPORT":
                    shown[k] = str(v)
        t0 = time.monotonic()
        timed_out = False
        try:
            proc = subprocess.Popen([str(a) for a in argv], env=full, cwd=self.work, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True)
        except OSError as e:
            return RunResult(argv, shown, shim, 127, "", "cannot start: %s" % e, 0.0, False, timeout, None)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            out, err = proc.communicate()
        seconds = time.monotonic() - t0
        rep = None
        path = overrides.get("GPUSHIM_REPORT")
        if shim and path and os.path.isfile(path):
            try:
                with open(path) as f:
                    rep = json.load(f)
            except ValueError:
                rep = {"unreadable": True}
            os.unlink(path)
        return RunResult(argv, shown, shim, proc.returncode, out or "", err or "", seconds, timed_out, timeout, rep)

    def python_probe(self, script, *args, **kw):
        return self.run([self.python, os.path.join(GPU_DIR, script)] + [str(a) for a in args], **kw)

    # -- the driver, as it is without the shim --------------------------------------------

    def _discover_driver(self):
        """Reads the devices once, without the shim: every expectation is computed from this."""
        self.devices, self.nvml_devices = [], []
        self.driver_reason = self.nvml_reason = None
        self.driver_version = None
        self.libcuda_path = None
        r = self.python_probe("cuda_info.py", timeout=max(self.timeout, 60))
        info = r.result()
        if info is None:
            self.driver_reason = "probing the driver failed (%s): %s" % (
                "timed out" if r.timed_out else "exit status %s" % r.rc, tail(r.stderr, 3).replace("\n", " "))
            self.nvml_reason = self.driver_reason
            return
        drv, nvml = info.get("driver", {}), info.get("nvml", {})
        if not drv.get("loaded"):
            self.driver_reason = "no NVIDIA driver: libcuda.so.1 " + load_failure(drv.get("error"))
        elif drv.get("init_rc") != 0:
            self.driver_reason = "no usable GPU: cuInit failed with CUresult %s" % drv.get("init_rc")
        elif not drv.get("count"):
            self.driver_reason = "no GPU: the driver shows 0 devices"
        else:
            self.devices = drv["devices"]
            self.driver_version = drv.get("version")
            self.libcuda_path = drv.get("path")
            bad = [d for d in self.devices if d.get("total_rc") != 0 or not d.get("total")]
            if bad:
                self.driver_reason = "cuDeviceTotalMem_v2 failed for device(s) %s" % bad
                self.devices = []
        if not nvml.get("loaded"):
            self.nvml_reason = "no NVML: libnvidia-ml.so.1 " + load_failure(nvml.get("error"))
        elif nvml.get("init_rc") != 0:
            self.nvml_reason = "nvmlInit_v2 failed with %s" % nvml.get("init_rc")
        else:
            self.nvml_devices = nvml.get("devices", [])

    @property
    def n(self):
        return len(self.devices)

    def physical_total(self, i=0):
        return int(self.devices[i]["total"])

    def nvml_total_of(self, uuid):
        for d in self.nvml_devices:
            if norm_uuid(d.get("uuid")) == norm_uuid(uuid):
                return int(d["total"])
        return None

    def limit(self):
        """The byte limit the scenarios use: 4 GiB, or a quarter of the smallest GPU if that is
        less (rounded down to 256 MiB), so the GPU always has room well past the limit."""
        smallest = min(int(d["total"]) for d in self.devices)
        return min(4 * GIB, (smallest // 4) // (256 * MIB) * (256 * MIB))

    # -- tools and modules -------------------------------------------------------------------

    def _discover_tools(self):
        self.nvcc = None if self.simulated else (shutil.which("nvcc") or first_file(
            [os.path.join(h, "bin", "nvcc") for h in cuda_homes()]))
        self.cc = shutil.which("gcc") or shutil.which("cc")
        self.nvidia_smi = None if self.simulated else shutil.which("nvidia-smi")

    def _discover_python_modules(self):
        self.modules = {}
        names = ["pynvml"] if self.simulated else ["torch", "jax", "cupy", "pynvml"]
        for name in ["torch", "jax", "cupy", "pynvml"]:
            if name not in names:
                self.modules[name] = (False, "--simulated: %s needs a real GPU (the simulated driver runs no kernels)"
                                      % MODULE_LABEL[name])
                continue
            code = "import %s as m; print('VERSION', getattr(m, '__version__', '?'))" % name
            r = self.run([self.python, "-c", code], timeout=max(self.timeout, 120))
            version = [l[8:] for l in r.stdout.splitlines() if l.startswith("VERSION ")]
            if r.rc == 0 and version:
                self.modules[name] = (True, version[0] if version[0] != "?" else "importable")
            else:
                last = [l for l in r.stderr.strip().splitlines() if l.strip()]
                why = "timed out" if r.timed_out else (last[-1] if last else "exit status %s" % r.rc)
                self.modules[name] = (False, "no %s (%s)" % (MODULE_LABEL[name], short(why, 120)))
        if not self.simulated and not self.modules["pynvml"][0]:
            deps = os.path.join(ROOT, ".deps", "python")
            if os.path.isfile(os.path.join(deps, "pynvml.py")):
                old = self.base_env.get("PYTHONPATH")
                self.base_env["PYTHONPATH"] = deps + (":" + old if old else "")
                self.modules["pynvml"] = (True, "from .deps/python")

    def has(self, module):
        return self.modules.get(module, (False, ""))[0]

    def module_reason(self, module):
        return self.modules.get(module, (False, "%s: unknown module" % module))[1]

    # -- building the C probes --------------------------------------------------------------

    def find_cudart(self):
        """(include dir, libcudart.so path) for building runtime programs with gcc, or None."""
        cands = []
        if self.simulated:
            cands.append(os.path.join(ROOT, ".deps", "cuda12"))
        else:
            cands += cuda_homes()
            cands += self._pip_cuda_dirs()
            cands.append(os.path.join(ROOT, ".deps", "cuda12"))
            cands.append(os.path.join(ROOT, ".deps", "cuda13"))
        for base in cands:
            inc = os.path.join(base, "include")
            if not os.path.isfile(os.path.join(inc, "cuda_runtime_api.h")):
                continue
            if not os.path.isfile(os.path.join(inc, "crt", "host_defines.h")):
                continue
            libs = sorted(glob.glob(os.path.join(base, "lib64", "libcudart.so*")) +
                          glob.glob(os.path.join(base, "lib", "libcudart.so*")))
            libs = [l for l in libs if re.search(r"libcudart\.so(\.\d+)?$", l)]
            if libs:
                return inc, libs[-1]
        return None

    def find_cuda_h(self):
        if self.simulated:
            return os.path.join(ROOT, ".deps", "cuda12", "include")
        for base in cuda_homes() + self._pip_cuda_dirs() + [os.path.join(ROOT, ".deps", "cuda12")]:
            inc = os.path.join(base, "include")
            if os.path.isfile(os.path.join(inc, "cuda.h")):
                return inc
        return None

    def _pip_cuda_dirs(self):
        if not hasattr(self, "_pip_dirs"):
            code = ("import json, nvidia; print('DIRS ' + json.dumps(list(nvidia.__path__)))")
            r = self.run([self.python, "-c", code], timeout=60)
            dirs = []
            for line in r.stdout.splitlines():
                if line.startswith("DIRS "):
                    for top in json.loads(line[5:]):
                        dirs += [os.path.join(top, s) for s in ("cuda_runtime", "cu13", "cu12")]
            self._pip_dirs = [d for d in dirs if os.path.isdir(d)]
        return self._pip_dirs

    def build(self, what):
        """Builds a probe: 'cudart' (cudart_probe.c), 'driver' (driver_probe.c) or 'bench'
        (bench.cu). Returns (path, label). Raises Skip if no compiler can build it here,
        BuildError if the compiler fails."""
        if what in self._builds:
            value = self._builds[what]
            if isinstance(value, Exception):
                raise value
            return value
        try:
            value = self._build(what)
        except (Skip, BuildError) as e:
            self._builds[what] = e
            raise
        self._builds[what] = value
        return value

    def _build(self, what):
        src = os.path.join(GPU_DIR, {"cudart": "cudart_probe.c", "driver": "driver_probe.c", "bench": "bench.cu"}[what])
        out = os.path.join(self.work, what + "_probe")
        if self.nvcc:
            if what == "driver":
                attempts = [([self.nvcc, "-O2", "-o", out, src, "-lcuda"], "nvcc, -lcuda")]
                if self.libcuda_path:  # should nvcc's stub directory be missing
                    attempts.append(([self.nvcc, "-O2", "-o", out, src, self.libcuda_path],
                                     "nvcc, linked with %s" % self.libcuda_path))
            elif what == "cudart":
                attempts = [([self.nvcc, "-O2", "-cudart", "static", "-o", out, src], "nvcc -cudart static")]
            else:
                attempts = [([self.nvcc, "-O2", "-arch=native", "-cudart", "static", "-o", out, src],
                             "nvcc -arch=native -cudart static"),
                            ([self.nvcc, "-O2", "-cudart", "static", "-o", out, src], "nvcc -cudart static")]
        else:
            if not self.cc:
                raise Skip("no nvcc and no gcc to build %s" % os.path.basename(src))
            if what == "driver":
                inc = self.find_cuda_h()
                if not inc:
                    raise Skip("no nvcc, and no cuda.h (CUDA toolkit or pip nvidia-cuda-runtime) for gcc")
                if self.simulated:
                    link = ["-L" + self.sim_dir, "-lcuda"]
                elif self.libcuda_path:
                    link = [self.libcuda_path]
                else:
                    raise Skip("no nvcc, and the path of libcuda.so.1 is unknown")
                attempts = [([self.cc, "-O2", "-o", out, src, "-I" + inc] + link,
                             "gcc, -lcuda" + (" (simulated driver)" if self.simulated else ""))]
            else:
                found = self.find_cudart()
                if not found:
                    raise Skip("no nvcc, and no libcudart.so with its headers (CUDA toolkit, pip "
                               "nvidia-cuda-runtime, .deps/) for gcc")
                inc, lib = found
                lang = ["-x", "c"] if what == "bench" else []
                attempts = [([self.cc, "-O2", "-o", out] + lang + [src, "-I" + inc, "-x", "none", lib,
                              "-Wl,-rpath," + os.path.dirname(lib)],
                             "gcc + %s (dynamic)" % os.path.basename(lib))]
        errors = []
        for cmd, label in attempts:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                               timeout=300)
            if p.returncode == 0:
                return out, label
            errors.append("$ %s\n%s" % (" ".join(cmd), tail(p.stdout, 30)))
        raise BuildError("building %s failed:\n%s" % (os.path.basename(src), "\n".join(errors)))


MODULE_LABEL = {"torch": "PyTorch", "jax": "JAX", "cupy": "CuPy", "pynvml": "pynvml"}


def load_failure(error):
    """dlopen's error, short: 'not found' for the usual case."""
    error = str(error or "")
    if error and all("cannot open shared object file" in e for e in error.split("; ")):
        return "not found"
    return "cannot be loaded (%s)" % short(error)


def short(text, n=200):
    text = " ".join(str(text or "").split())
    return text if len(text) <= n else text[: n - 1] + "…"


def cuda_homes():
    homes = []
    for h in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if h and os.path.isdir(h) and h not in homes:
            homes.append(h)
    return homes


def first_file(paths):
    for p in paths:
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


class NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class NvmlMonitor:
    """Samples `used` of one physical GPU through NVML in this process (never shimmed), every
    `period` seconds, while a child runs: what the child really holds, whatever it believes."""

    def __init__(self, uuid, period=0.05):
        self.nv = ctypes.CDLL("libnvidia-ml.so.1")
        if self.nv.nvmlInit_v2() != 0:
            raise Skip("nvmlInit_v2 failed in the harness")
        self.handle = ctypes.c_void_p(0)
        if self.nv.nvmlDeviceGetHandleByUUID(str(uuid).encode(), ctypes.byref(self.handle)) != 0:
            raise Skip("NVML does not know %s" % uuid)
        self.period = period
        self.samples = []
        self._stop = threading.Event()
        self._thread = None

    def used(self):
        m = NvmlMemory()
        if self.nv.nvmlDeviceGetMemoryInfo(self.handle, ctypes.byref(m)) != 0:
            return None
        return int(m.used)

    def __enter__(self):
        self.baseline = self.used()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self):
        while not self._stop.is_set():
            u = self.used()
            if u is not None:
                self.samples.append((time.time(), u))
            self._stop.wait(self.period)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        return False

    def peak_delta(self, t0=None, t1=None):
        """Highest `used` minus the baseline taken before the child started, over [t0, t1]."""
        vals = [u for (t, u) in self.samples if (t0 is None or t >= t0) and (t1 is None or t <= t1)]
        if not vals or self.baseline is None:
            return None
        return max(vals) - self.baseline

    def min_delta(self, t0=None, t1=None):
        vals = [u for (t, u) in self.samples if (t0 is None or t >= t0) and (t1 is None or t <= t1)]
        if not vals or self.baseline is None:
            return None
        return min(vals) - self.baseline


def write_json(path, data):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)
