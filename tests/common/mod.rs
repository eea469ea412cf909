//! Shared harness of the gpushim integration tests.
//!
//! The tests run real programs — C programs in `tests/c/` built here with gcc, the real CUDA
//! runtime from the PyPI wheels (`scripts/fetch-deps.sh` puts them in `.deps/`) — on the
//! simulated driver (`sim/cuda`, `libcuda.so`) with and without `LD_PRELOAD=libgpushim.so`.
//!
//! One helper per concern:
//! * [`profile_dir`], [`shim_path`], [`sim_dir`], [`cuda_deps`]: where the built pieces are;
//! * [`program`]: the C programs, compiled once per test process into [`work_dir`];
//! * [`Run`]: one run of a program with a clean environment, giving a [`RunOutput`] with
//!   the `key=value` lines, the gpushim stderr lines and the simulator's [`SimReport`] (and,
//!   asked with [`Run::with_shim_report`], the shim's [`ShimReport`]); [`MemoryMode`] runs it
//!   without the shim or under one of the `GPUSHIM_MEMORY_MODE`s;
//! * [`nvml_sim_library`], [`python_run`]: the simulated NVML (`sim/nvml`, reached as
//!   `libnvidia-ml.so.1` in [`sim_dir`]) and Python with pynvml (`.deps/python`);
//! * [`phys_name`], [`phys_uuid`], [`phys_pci`]: the identity of a simulated physical device;
//! * [`compute`]: the compute workloads' output and the busy shares of the simulator's report.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

pub mod compute;

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// CUDA_ERROR_OUT_OF_MEMORY and cudaErrorMemoryAllocation.
pub const OOM: i64 = 2;
/// CUDA_ERROR_NOT_INITIALIZED and cudaErrorInitializationError.
pub const NOT_INITIALIZED: i64 = 3;

/// How long one program may run before the test fails (a hang is a failure, not a stall).
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------------------
// Locations
// ---------------------------------------------------------------------------------------

/// The workspace root (the root package's manifest directory).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `<target>/<profile>`: the directory holding this test binary's `deps/`. This follows
/// `CARGO_TARGET_DIR`, `--release` / `--profile` and `--target` without guessing.
pub fn profile_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("current_exe");
        let deps = exe.parent().expect("test binary has a directory");
        if deps.file_name().map_or(false, |n| n == "deps") {
            return deps.parent().unwrap().to_path_buf();
        }
        // Unusual layout: fall back to CARGO_TARGET_DIR or <workspace>/target, by profile.
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace_root().join("target"));
        target.join(if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        })
    })
    .clone()
}

// ---------------------------------------------------------------------------------------
// The target (native or cross, e.g. aarch64 under qemu-user)
// ---------------------------------------------------------------------------------------

/// The architecture the tests and the libraries were built for (`x86_64`, `aarch64`).
pub const TARGET_ARCH: &str = std::env::consts::ARCH;

/// The emulator that runs the target's programs when the host cannot (`GPUSHIM_TEST_RUNNER`,
/// words split on spaces, e.g. `qemu-aarch64-static -L /usr/aarch64-linux-gnu`, set by
/// `scripts/test-aarch64.sh`); empty when the tests run natively. binfmt_misc is not relied on:
/// where it is registered, leaving the variable unset runs the programs directly.
pub fn runner() -> &'static [OsString] {
    static R: OnceLock<Vec<OsString>> = OnceLock::new();
    R.get_or_init(|| {
        std::env::var("GPUSHIM_TEST_RUNNER")
            .map(|v| v.split_whitespace().map(OsString::from).collect())
            .unwrap_or_default()
    })
}

/// Whether the tests run under an emulator ([`runner`] is set).
pub fn emulated() -> bool {
    !runner().is_empty()
}

/// Skips a test that needs what emulation cannot give (a host program such as python3 or
/// podman loading the target's library, a system call qemu-user lacks): prints
/// `SKIPPED under emulation (TARGET_ARCH): reason` and returns true when [`emulated`].
pub fn skip_emulated(reason: &str) -> bool {
    if emulated() {
        // (written to the descriptor, not through eprintln!, which the test harness captures)
        let _ = writeln!(std::io::stderr(), "SKIPPED under emulation ({TARGET_ARCH}): {reason}");
        return true;
    }
    false
}

/// Whether a program of the target can start another program of the target (`gpushim run`,
/// `gpushim check`'s probe, a program that forks and execs one): natively always; under
/// emulation only where binfmt_misc hands the target's ELF files to the emulator
/// (`/proc/sys/fs/binfmt_misc/qemu-<arch>` enabled), as qemu-user does not follow `execve`.
pub fn target_can_exec() -> bool {
    if !emulated() {
        return true;
    }
    let entry = format!("/proc/sys/fs/binfmt_misc/qemu-{TARGET_ARCH}");
    std::fs::read_to_string(entry).is_ok_and(|t| t.starts_with("enabled"))
}

/// Skips a test in which a program of the target starts another (see [`target_can_exec`])
/// where that cannot work: prints `SKIPPED under emulation (arch): reason` and returns true.
pub fn skip_unless_target_exec(reason: &str) -> bool {
    if target_can_exec() {
        return false;
    }
    let _ = writeln!(std::io::stderr(), "SKIPPED under emulation ({TARGET_ARCH}, no binfmt_misc entry for qemu-{TARGET_ARCH}): {reason}");
    true
}

/// A tool of the target's toolchain: `GPUSHIM_TEST_<VAR>` if set, else `<arch>-linux-gnu-<tool>`
/// for a target other than x86-64 when that exists on PATH (a cross toolchain), else `tool`.
fn target_tool(var: &str, tool: &str) -> OsString {
    if let Some(v) = std::env::var_os(format!("GPUSHIM_TEST_{var}")) {
        return v;
    }
    if TARGET_ARCH != "x86_64" {
        let cross = format!("{TARGET_ARCH}-linux-gnu-{tool}");
        let on_path = std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(&cross).is_file()));
        if on_path {
            return cross.into();
        }
    }
    tool.into()
}

/// The C compiler for the target's programs (`GPUSHIM_TEST_CC`, `aarch64-linux-gnu-gcc`, `gcc`).
pub fn c_compiler() -> OsString {
    target_tool("CC", "gcc")
}

/// `nm` for the target's objects (`GPUSHIM_TEST_NM`, `aarch64-linux-gnu-nm`, `nm`).
pub fn nm() -> OsString {
    target_tool("NM", "nm")
}

/// ELF `e_machine` of the target: EM_X86_64 (62), EM_AARCH64 (183).
fn target_machine() -> u16 {
    match TARGET_ARCH {
        "aarch64" => 183,
        _ => 62,
    }
}

/// Whether `exe` is an ELF file of the target's architecture (a program for [`runner`]).
fn is_target_elf(exe: &Path) -> bool {
    let mut head = [0u8; 20];
    let Ok(mut f) = std::fs::File::open(exe) else { return false };
    f.read_exact(&mut head).is_ok() && head[..4] == *b"\x7fELF" && u16::from_le_bytes([head[18], head[19]]) == target_machine()
}

/// A `Command` that runs `exe`: the program itself, or, when it is a program of the target and
/// the tests run under an emulator, the emulator with the program as its first argument (host
/// programs, scripts and bare names such as `python3` always run directly).
pub fn target_command(exe: impl AsRef<Path>) -> Command {
    let exe = exe.as_ref();
    match runner().split_first() {
        Some((emu, rest)) if is_target_elf(exe) => {
            let mut c = Command::new(emu);
            c.args(rest).arg(exe);
            c
        }
        _ => Command::new(exe),
    }
}

fn build_hint() -> String {
    let profile = profile_dir();
    let release = profile.file_name().map_or(false, |n| n == "release");
    format!(
        "build the workspace first: `cargo build {}--workspace` (or run `bash scripts/test.sh`)",
        if release { "--release " } else { "" }
    )
}

fn require_built(path: PathBuf, what: &str) -> PathBuf {
    if !path.is_file() {
        panic!("{what} not found at {}; {}", path.display(), build_hint());
    }
    path
}

/// `libgpushim.so`, which must have been built.
pub fn shim_path() -> PathBuf {
    require_built(
        profile_dir().join("libgpushim.so"),
        "the shim libgpushim.so",
    )
}

/// The simulated driver as cargo built it (`libcuda.so`, crate `gpusim-cuda`).
pub fn sim_library() -> PathBuf {
    require_built(
        profile_dir().join("libcuda.so"),
        "the simulated driver libcuda.so (crate gpusim-cuda)",
    )
}

/// The simulated NVML as cargo built it (`libnvidia_ml.so`, crate `gpusim-nvml`).
pub fn nvml_sim_library() -> PathBuf {
    require_built(
        profile_dir().join("libnvidia_ml.so"),
        "the simulated NVML libnvidia_ml.so (crate gpusim-nvml)",
    )
}

/// A directory with `libcuda.so.1` and `libcuda.so` → the simulated driver and
/// `libnvidia-ml.so.1` and `libnvidia-ml.so` → the simulated NVML, for LD_LIBRARY_PATH and
/// for `-lcuda` / `-lnvidia-ml`. (The NVML links are made even before that library is
/// built; tests that use NVML call [`nvml_sim_library`] first.)
pub fn sim_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let lib = sim_library();
        let nvml = profile_dir().join("libnvidia_ml.so");
        let dir = work_dir().join("driver");
        std::fs::create_dir_all(&dir).unwrap();
        for (name, target) in [
            ("libcuda.so.1", &lib),
            ("libcuda.so", &lib),
            ("libnvidia-ml.so.1", &nvml),
            ("libnvidia-ml.so", &nvml),
        ] {
            let link = dir.join(name);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(target, &link).unwrap();
        }
        dir
    })
    .clone()
}

/// `.deps/python`, where `scripts/fetch-deps.sh` puts pynvml (nvidia-ml-py).
pub fn python_deps() -> PathBuf {
    let dir = workspace_root().join(".deps").join("python");
    if !dir.join("pynvml.py").is_file() && !dir.join("pynvml").is_dir() {
        panic!(
            "pynvml (nvidia-ml-py) is not in {}; run `bash scripts/fetch-deps.sh` first",
            dir.display()
        );
    }
    dir
}

/// The python of the framework virtual environment `.deps/<dir>/venv` (`scripts/fetch-frameworks.sh`;
/// `what` names its frameworks for the message when it is missing).
pub fn venv_python(dir: &str, what: &str) -> PathBuf {
    let py = workspace_root().join(".deps").join(dir).join("venv/bin/python");
    if !py.is_file() {
        panic!("{what} not installed in {}; run `bash scripts/fetch-frameworks.sh` first", py.display());
    }
    py
}

/// `python3 -c SCRIPT ARGS…` with `PYTHONPATH=.deps/python` (pynvml), the simulators on
/// LD_LIBRARY_PATH like any other [`Run`].
pub fn python_run(script: &str) -> Run {
    Run::new("python3")
        .arg("-c")
        .arg(script)
        .env("PYTHONPATH", python_deps())
        .env("PYTHONDONTWRITEBYTECODE", "1")
}

/// A pynvml program (for [`python_run`]) that lists what NVML shows: `init.rc`, `count`, per
/// index I `idxI.{uuid,name,serial,index,pci,temp,util,cc,procs,total,used,free}`, the v2 memory
/// info `idxI.{total2,used2,free2}` (or `idxI.v2=unsupported`), `p2pIJ` (nvmlDeviceGetP2PStatus,
/// read) for every pair; then for each argument `uuid=` / `pci=` / `serial=` VALUE (K-th) the
/// lookup `opK.rc` and, found, `opK.{index,uuid,name}`; last `done=1`.
pub const PYNVML_LIST: &str = r#"
import sys
import pynvml as n

def s(x):
    return x.decode() if isinstance(x, bytes) else x

def call(f, *a):
    try:
        return 0, f(*a)
    except n.NVMLError as e:
        return e.value, None

n.nvmlInit()
print("init.rc=0")
count = n.nvmlDeviceGetCount()
print(f"count={count}")
hs = [n.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
for i, h in enumerate(hs):
    print(f"idx{i}.uuid={s(n.nvmlDeviceGetUUID(h))}")
    print(f"idx{i}.name={s(n.nvmlDeviceGetName(h))}")
    print(f"idx{i}.serial={s(n.nvmlDeviceGetSerial(h))}")
    print(f"idx{i}.index={n.nvmlDeviceGetIndex(h)}")
    print(f"idx{i}.pci={s(n.nvmlDeviceGetPciInfo(h).busId)}")
    print(f"idx{i}.temp={n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)}")
    print(f"idx{i}.util={n.nvmlDeviceGetUtilizationRates(h).gpu}")
    print(f"idx{i}.cc={n.nvmlDeviceGetCudaComputeCapability(h)[0]}")
    print(f"idx{i}.procs={len(n.nvmlDeviceGetComputeRunningProcesses(h))}")
    m = n.nvmlDeviceGetMemoryInfo(h)
    print(f"idx{i}.total={m.total}")
    print(f"idx{i}.used={m.used}")
    print(f"idx{i}.free={m.free}")
    try:
        m2 = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
        print(f"idx{i}.total2={m2.total}")
        print(f"idx{i}.used2={m2.used}")
        print(f"idx{i}.free2={m2.free}")
    except (TypeError, AttributeError):
        print(f"idx{i}.v2=unsupported")
    for j, g in enumerate(hs):
        # 0: NVML_P2P_CAPS_INDEX_READ (pynvml 13.615 defines that name as a tuple by mistake)
        print(f"p2p{i}{j}={n.nvmlDeviceGetP2PStatus(h, g, 0)}")
for k, arg in enumerate(sys.argv[1:], start=1):
    kind, value = arg.split("=", 1)
    f = {"uuid": n.nvmlDeviceGetHandleByUUID,
         "pci": n.nvmlDeviceGetHandleByPciBusId,
         "serial": n.nvmlDeviceGetHandleBySerial}[kind]
    rc, h = call(f, value)
    print(f"op{k}.rc={rc}")
    if rc == 0:
        print(f"op{k}.index={n.nvmlDeviceGetIndex(h)}")
        print(f"op{k}.uuid={s(n.nvmlDeviceGetUUID(h))}")
        print(f"op{k}.name={s(n.nvmlDeviceGetName(h))}")
n.nvmlShutdown()
print("done=1")
"#;

/// The name of simulated physical device `p` (`sim/cuda`, `sim/nvml`).
pub fn phys_name(p: u32) -> String {
    format!("gpusim device {p}")
}

/// The UUID of simulated physical device `p`: bytes `0x10*(p+1) + i`.
pub fn phys_uuid(p: u32) -> String {
    let b: Vec<String> = (0..16u32)
        .map(|i| format!("{:02x}", ((0x10 * (p + 1) + i) & 0xff) as u8))
        .collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        b[0..4].concat(),
        b[4..6].concat(),
        b[6..8].concat(),
        b[8..10].concat(),
        b[10..16].concat()
    )
}

/// The UUID gpushim derives for part `index` of simulated physical device `p`
/// (`devices::part_uuid`: an RFC 9562 version-8 UUID whose last 8 bytes are an FNV-1a hash of
/// the physical UUID, the index and "gpushim").
pub fn part_uuid(p: u32, index: u32) -> String {
    let mut u: [u8; 16] = std::array::from_fn(|i| ((0x10 * (p + 1) + i as u32) & 0xff) as u8);
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in u.iter().chain(index.to_le_bytes().iter()).chain(b"gpushim".iter()) {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    u[8..16].copy_from_slice(&h.to_be_bytes());
    u[6] = (u[6] & 0x0f) | 0x80;
    u[8] = (u[8] & 0x3f) | 0x80;
    let h: Vec<String> = u.iter().map(|b| format!("{b:02x}")).collect();
    format!("GPU-{}-{}-{}-{}-{}", h[0..4].concat(), h[4..6].concat(), h[6..8].concat(), h[8..10].concat(), h[10..16].concat())
}

/// The PCI bus id of simulated physical device `p` as `cuDeviceGetPCIBusId` writes it
/// (`0000:10:00.0`); compare case-insensitively with NVML's (`00000000:10:00.0`, upper case).
pub fn phys_pci(p: u32) -> String {
    format!("0000:{:02x}:00.0", 0x10 * (p + 1))
}

/// The PCI bus number of simulated physical device `p`.
pub fn phys_bus(p: u32) -> u32 {
    0x10 * (p + 1)
}

/// `.deps/cuda12` or `.deps/cuda13` (include/ and lib/ of the runtime wheel); for another
/// target than x86-64 `.deps/<arch>/cuda12` (`scripts/fetch-deps.sh --arch aarch64`).
pub fn cuda_deps(major: u32) -> PathBuf {
    let deps = workspace_root().join(".deps");
    let deps = if TARGET_ARCH == "x86_64" { deps } else { deps.join(TARGET_ARCH) };
    let dir = deps.join(format!("cuda{major}"));
    if !dir.join("include/cuda.h").is_file()
        || !dir.join(format!("lib/libcudart.so.{major}")).is_file()
    {
        panic!(
            "the CUDA {major} runtime is not in {}; run `bash scripts/fetch-deps.sh{}` first",
            dir.display(),
            if TARGET_ARCH == "x86_64" { String::new() } else { format!(" --arch {TARGET_ARCH}") }
        );
    }
    dir
}

/// `.deps/drivers` (`scripts/fetch-drivers.sh`), or for another target than x86-64
/// `.deps/<arch>/drivers` (`scripts/fetch-drivers.sh --arch aarch64`): the real NVIDIA driver
/// binaries of the target's architecture, by version.
pub fn real_drivers_dir() -> PathBuf {
    let deps = workspace_root().join(".deps");
    if TARGET_ARCH == "x86_64" { deps.join("drivers") } else { deps.join(TARGET_ARCH).join("drivers") }
}

/// A scratch directory of this test process, under cargo's `target/tmp`. Directories left
/// by earlier processes that are no longer alive are removed on first use.
pub fn work_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        // (a cross build's is target/<triple>/tmp: target/tmp instead, so that the paths of
        // the sockets made there stay within sun_path's 108 bytes)
        let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        let cross = tmp.parent().and_then(|t| Some((t.file_name()?.to_str()?.contains("-linux-"), t.parent()?.join("tmp"))));
        let base = match cross {
            Some((true, shared)) => shared,
            _ => tmp,
        }
        .join("gpushim-tests");
        std::fs::create_dir_all(&base).unwrap();
        if let Ok(entries) = std::fs::read_dir(&base) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let pid = name.split('-').next().and_then(|p| p.parse::<u32>().ok());
                if let Some(pid) = pid {
                    if !Path::new(&format!("/proc/{pid}")).exists() {
                        let _ = std::fs::remove_dir_all(e.path());
                    }
                }
            }
        }
        let exe = std::env::current_exe().unwrap();
        let stem = exe.file_stem().unwrap().to_string_lossy().into_owned();
        let dir = base.join(format!("{}-{}", std::process::id(), stem));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    })
    .clone()
}

/// A fresh path in the work directory (nothing is created).
pub fn scratch_path(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    work_dir().join(format!("{}-{}", N.fetch_add(1, Ordering::Relaxed), name))
}

/// A fresh, empty scratch directory (see [`scratch_path`]), created.
pub fn fresh_dir(name: &str) -> PathBuf {
    let dir = scratch_path(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

// ---------------------------------------------------------------------------------------
// The C programs
// ---------------------------------------------------------------------------------------

/// How a driver-API program reaches the driver (`tests/c/drvapi.c`, one source).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DriverPath {
    /// linked with `-lcuda`
    Link,
    /// linked with `-lcuda`, per-thread default stream (`_ptsz` exports)
    LinkPtsz,
    /// `dlopen("libcuda.so.1")` + `dlsym` of exact names
    Dlsym,
    /// `dlsym` of the `_ptsz` names
    DlsymPtsz,
    /// `cuGetProcAddress_v2`, flags 0
    Gpa,
    /// `cuGetProcAddress_v2`, flags 2 (per-thread default stream)
    GpaPtsz,
    /// v1 `cuGetProcAddress` (no status argument), flags 0
    GpaV1,
}

impl DriverPath {
    pub const ALL: [DriverPath; 7] = [
        DriverPath::Link,
        DriverPath::LinkPtsz,
        DriverPath::Dlsym,
        DriverPath::DlsymPtsz,
        DriverPath::Gpa,
        DriverPath::GpaPtsz,
        DriverPath::GpaV1,
    ];

    pub fn is_ptsz(self) -> bool {
        matches!(
            self,
            DriverPath::LinkPtsz | DriverPath::DlsymPtsz | DriverPath::GpaPtsz
        )
    }

    /// Whether the program asks the driver library itself (dlsym on its handle or
    /// cuGetProcAddress), so that functions gpushim does not change must be the driver's own.
    pub fn asks_driver(self) -> bool {
        !matches!(self, DriverPath::Link | DriverPath::LinkPtsz)
    }

    fn defines(self) -> &'static [&'static str] {
        match self {
            DriverPath::Link => &["-DMODE_LINK"],
            DriverPath::LinkPtsz => &["-DMODE_LINK", "-DCUDA_API_PER_THREAD_DEFAULT_STREAM"],
            DriverPath::Dlsym => &["-DMODE_DLSYM"],
            DriverPath::DlsymPtsz => &["-DMODE_DLSYM", "-DCUDA_API_PER_THREAD_DEFAULT_STREAM"],
            DriverPath::Gpa => &["-DMODE_GPA"],
            DriverPath::GpaPtsz => &["-DMODE_GPA", "-DCUDA_API_PER_THREAD_DEFAULT_STREAM"],
            DriverPath::GpaV1 => &["-DMODE_GPA", "-DGPA_V1"],
        }
    }
}

/// Every C program the tests run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Program {
    Driver(DriverPath),
    /// `tests/c/runtime.c` against cudart 12 or 13; `ptsz` = per-thread default stream
    Runtime {
        major: u32,
        ptsz: bool,
    },
    /// `tests/c/race.c`
    Race,
    /// `tests/c/stress.c`: every allocation API from threads, forks, teardowns
    Stress,
    /// `tests/c/teardown_race.c`: a torn-down context's addresses handed to another thread
    TeardownRace,
    /// `tests/c/sighandler.c`: CUDA called from a signal handler that interrupted the shim
    SigHandler,
    /// `tests/c/placement.c`: kernels (from PTX) and allocations on every device
    Placement,
    /// `tests/c/rtlaunch.c`: the CUDA runtime's own launch path (cudart 13)
    RtLaunch,
    /// `tests/c/realdrv.c`: what a real driver library answers (`dlopen`, no link)
    RealDriver,
    /// `tests/c/firstuse.c`: concurrent first use through `dlsym(RTLD_DEFAULT)` (no link)
    FirstUse,
    /// `tests/c/forkq.c`: a forked child and its parent's figures (linked with `-lcuda`)
    ForkQuota,
    /// `tests/c/smallstack.c`: look-ups and calls on a small `clone(2)` stack (linked with `-lcuda`)
    SmallStack,
    /// `tests/c/modes.c`: the memory modes through the driver API (linked with `-lcuda`)
    Modes,
    /// `tests/c/nvml.c`: NVML alone
    Nvml(NvmlPath),
    /// `tests/c/compute_load.c`: `gpusim_busy` kernels launched for a wall time through one
    /// launch path on one or more devices (linked with `-lcuda`; see [`compute`])
    ComputeLoad,
    /// `tests/c/rt_compute.c`: `gpusim_busy` kernels through `cudaLaunchKernel` (cudart 12 or 13)
    RtCompute { major: u32 },
}

/// How `tests/c/nvml.c` reaches NVML.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NvmlPath {
    /// linked with `-lnvidia-ml`
    Link,
    /// `dlopen("libnvidia-ml.so.1")` + `dlsym` (as pynvml and PyTorch)
    Dlopen,
}

impl NvmlPath {
    pub const ALL: [NvmlPath; 2] = [NvmlPath::Link, NvmlPath::Dlopen];
}

impl Program {
    fn file_name(self) -> String {
        match self {
            Program::Driver(p) => format!("drvapi-{p:?}").to_lowercase(),
            Program::Runtime { major, ptsz } => {
                format!("runtime{major}{}", if ptsz { "-ptsz" } else { "" })
            }
            Program::Race => "race".into(),
            Program::Stress => "stress".into(),
            Program::TeardownRace => "teardown_race".into(),
            Program::SigHandler => "sighandler".into(),
            Program::Placement => "placement".into(),
            Program::RtLaunch => "rtlaunch".into(),
            Program::RealDriver => "realdrv".into(),
            Program::FirstUse => "firstuse".into(),
            Program::ForkQuota => "forkq".into(),
            Program::SmallStack => "smallstack".into(),
            Program::Modes => "modes".into(),
            Program::Nvml(p) => format!("nvml-{p:?}").to_lowercase(),
            Program::ComputeLoad => "compute_load".into(),
            Program::RtCompute { major } => format!("rt_compute{major}"),
        }
    }

    fn gcc_args(self) -> Vec<OsString> {
        let c = workspace_root().join("tests/c");
        let mut args: Vec<OsString> = vec![
            "-std=gnu11".into(),
            "-O1".into(),
            "-g".into(),
            "-Wall".into(),
            "-Wextra".into(),
        ];
        let link_cuda = |args: &mut Vec<OsString>| {
            args.push(format!("-L{}", sim_dir().display()).into());
            // keep libcuda NEEDED even where every reference is weak (drvapi's link mode)
            args.push("-Wl,--no-as-needed".into());
            args.push("-lcuda".into());
        };
        match self {
            Program::Driver(path) => {
                args.push(format!("-I{}", cuda_deps(13).join("include").display()).into());
                args.extend(path.defines().iter().map(OsString::from));
                args.push(c.join("drvapi.c").into());
                if matches!(path, DriverPath::Link | DriverPath::LinkPtsz) {
                    link_cuda(&mut args);
                }
                args.push("-ldl".into());
            }
            Program::Runtime { major, ptsz } => {
                let deps = cuda_deps(major);
                args.push(format!("-I{}", deps.join("include").display()).into());
                if ptsz {
                    args.push("-DCUDA_API_PER_THREAD_DEFAULT_STREAM".into());
                }
                args.push(c.join("runtime.c").into());
                args.push(format!("-L{}", deps.join("lib").display()).into());
                args.push(format!("-l:libcudart.so.{major}").into());
                args.push(format!("-Wl,-rpath,{}", deps.join("lib").display()).into());
                args.push("-ldl".into());
            }
            Program::RtLaunch | Program::RtCompute { .. } => {
                let (major, file) = match self {
                    Program::RtCompute { major } => (major, "rt_compute.c"),
                    _ => (13, "rtlaunch.c"),
                };
                let deps = cuda_deps(major);
                args.push(format!("-I{}", deps.join("include").display()).into());
                args.push(c.join(file).into());
                args.push(format!("-L{}", deps.join("lib").display()).into());
                args.push(format!("-l:libcudart.so.{major}").into());
                args.push(format!("-Wl,-rpath,{}", deps.join("lib").display()).into());
                args.push("-ldl".into());
            }
            Program::Race
            | Program::Stress
            | Program::TeardownRace
            | Program::Placement
            | Program::ForkQuota
            | Program::SigHandler
            | Program::ComputeLoad => {
                let file = match self {
                    Program::Race => "race.c",
                    Program::ComputeLoad => "compute_load.c",
                    Program::Placement => "placement.c",
                    Program::Stress => "stress.c",
                    Program::TeardownRace => "teardown_race.c",
                    Program::SigHandler => "sighandler.c",
                    _ => "forkq.c",
                };
                args.push(format!("-I{}", cuda_deps(13).join("include").display()).into());
                args.push(c.join(file).into());
                link_cuda(&mut args);
                args.push("-lpthread".into());
            }
            Program::RealDriver | Program::FirstUse => {
                let file = if self == Program::RealDriver { "realdrv.c" } else { "firstuse.c" };
                args.push(c.join(file).into());
                args.push("-ldl".into());
                args.push("-lpthread".into());
            }
            Program::SmallStack => {
                args.push(c.join("smallstack.c").into());
                link_cuda(&mut args);
                // (its own calls bound at load: the stack figures are the callees')
                args.push("-Wl,-z,now".into());
                args.push("-ldl".into());
            }
            Program::Modes => {
                args.push(format!("-I{}", cuda_deps(13).join("include").display()).into());
                args.push(c.join("modes.c").into());
                link_cuda(&mut args);
                args.push("-ldl".into());
            }
            Program::Nvml(path) => {
                args.push(c.join("nvml.c").into());
                if path == NvmlPath::Link {
                    nvml_sim_library();
                    args.push("-DNVML_LINK".into());
                    args.push(format!("-L{}", sim_dir().display()).into());
                    args.push("-Wl,--no-as-needed".into());
                    args.push("-lnvidia-ml".into());
                }
                args.push("-ldl".into());
            }
        }
        args
    }
}

/// The executable of `p`, compiled on first use in this process (gcc).
pub fn program(p: Program) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<Program, PathBuf>>> = OnceLock::new();
    let built = BUILT.get_or_init(|| Mutex::new(HashMap::new()));
    let mut built = built.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(exe) = built.get(&p) {
        return exe.clone();
    }
    let exe = work_dir().join("bin").join(p.file_name());
    std::fs::create_dir_all(exe.parent().unwrap()).unwrap();
    let out = Command::new(c_compiler())
        .args(p.gcc_args())
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("cannot run gcc (is it installed?): {e}"));
    if !out.status.success() {
        panic!(
            "compiling {p:?} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    built.insert(p, exe.clone());
    exe
}

// ---------------------------------------------------------------------------------------
// Running
// ---------------------------------------------------------------------------------------

/// Variables a run never inherits from the test's own environment.
fn is_controlled_var(name: &str) -> bool {
    ["GPUSHIM_", "CUDA_", "GPUSIM_", "PYTORCH_", "NVIDIA_"]
        .iter()
        .any(|p| name.starts_with(p))
        || matches!(name, "LD_PRELOAD" | "LD_LIBRARY_PATH")
}

/// One run of a program. By default: the simulator on LD_LIBRARY_PATH, a simulator report
/// requested, and LD_PRELOAD of the shim only with [`Run::shim`].
pub struct Run {
    cmd: PathBuf,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    shim: bool,
    with_sim: bool,
    shim_report: bool,
    /// Run as this user (uid = gid); needs root.
    user: Option<u32>,
    /// Run in the child before `exec` ([`Run::before_exec`]).
    before_exec: Option<Box<dyn FnMut() -> std::io::Result<()> + Send + Sync>>,
}

impl Run {
    pub fn new(cmd: impl AsRef<Path>) -> Run {
        Run {
            cmd: cmd.as_ref().to_path_buf(),
            args: vec![],
            env: vec![],
            shim: false,
            with_sim: true,
            shim_report: false,
            user: None,
            before_exec: None,
        }
    }

    /// A run of one of the C programs.
    pub fn program(p: Program) -> Run {
        Run::new(program(p))
    }

    pub fn arg(mut self, a: impl Into<OsString>) -> Run {
        self.args.push(a.into());
        self
    }

    pub fn args<I, S>(mut self, args: I) -> Run
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    pub fn env(mut self, k: &str, v: impl Into<OsString>) -> Run {
        self.env.push((k.into(), v.into()));
        self
    }

    /// A variable whose name need not be UTF-8.
    pub fn env_os(mut self, k: impl Into<OsString>, v: impl Into<OsString>) -> Run {
        self.env.push((k.into(), v.into()));
        self
    }

    pub fn envs<'a>(mut self, vars: impl IntoIterator<Item = &'a (&'a str, &'a str)>) -> Run {
        for (k, v) in vars {
            self.env.push((k.into(), OsString::from(v)));
        }
        self
    }

    /// LD_PRELOAD the shim or not.
    pub fn shim(mut self, on: bool) -> Run {
        self.shim = on;
        self
    }

    /// Ask the shim for its JSON exit report (`GPUSHIM_REPORT` = a scratch `.json` path), read
    /// back into [`RunOutput::shim_report`] (absent when the shim wrote none).
    pub fn with_shim_report(mut self) -> Run {
        self.shim_report = true;
        self
    }

    /// Run under `GPUSHIM_MEMORY_MODE` `mode` ([`MemoryMode`]: with or without the shim).
    pub fn mode(self, mode: MemoryMode) -> Run {
        mode.apply(self)
    }

    /// Run as user `uid` (its group too), for tests of what another user can reach (needs root).
    pub fn as_user(mut self, uid: u32) -> Run {
        self.user = Some(uid);
        self
    }

    /// Runs `f` in the child between `fork` and `exec` (a mount namespace of its own, a resource
    /// limit): only what is safe after `fork` in a threaded process (system calls, no
    /// allocation).
    pub fn before_exec(mut self, f: impl FnMut() -> std::io::Result<()> + Send + Sync + 'static) -> Run {
        self.before_exec = Some(Box::new(f));
        self
    }

    /// Leave the simulator off LD_LIBRARY_PATH (and ask no report), for non-CUDA programs.
    pub fn without_sim(mut self) -> Run {
        self.with_sim = false;
        self
    }

    pub fn run(self) -> RunOutput {
        let report_path = scratch_path("sim-report.json");
        let mut cmd = target_command(&self.cmd);
        cmd.args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (name, _) in std::env::vars_os() {
            if let Some(name) = name.to_str() {
                if is_controlled_var(name) {
                    cmd.env_remove(name);
                }
            }
        }
        if self.with_sim {
            cmd.env("LD_LIBRARY_PATH", sim_dir());
            cmd.env("GPUSIM_REPORT", &report_path);
        }
        if self.shim {
            cmd.env("LD_PRELOAD", shim_path());
        }
        // A state directory of the run's own (shared quotas, the registry of processes with
        // limits), so that tests running side by side never see each other's processes (no
        // oversubscription warning from a neighbour); tests that share one set it themselves.
        cmd.env("GPUSHIM_STATE_DIR", scratch_path("state"));
        let shim_report_path = self.shim_report.then(|| scratch_path("shim-report.json"));
        if let Some(p) = &shim_report_path {
            cmd.env("GPUSHIM_REPORT", p);
        }
        // A run configured through HAMi's variables uses HAMi-core's shared region, by default
        // the machine's /tmp/cudevshr.cache: a file of the run's own instead, unless it names one
        let hami = |k: &str| k.starts_with("CUDA_DEVICE_MEMORY_LIMIT") || k.starts_with("CUDA_DEVICE_SM_LIMIT");
        if self.env.iter().any(|(k, _)| hami(&k.to_string_lossy())) && !self.env.iter().any(|(k, _)| k == "CUDA_DEVICE_MEMORY_SHARED_CACHE") {
            cmd.env("CUDA_DEVICE_MEMORY_SHARED_CACHE", scratch_path("hami-region"));
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        if let Some(uid) = self.user {
            use std::os::unix::process::CommandExt;
            cmd.uid(uid).gid(uid);
        }
        if let Some(f) = self.before_exec {
            use std::os::unix::process::CommandExt;
            // SAFETY: the callers' closures only make system calls (see `before_exec`).
            unsafe { cmd.pre_exec(f) };
        }
        let description = format!(
            "{} {:?} (shim: {}, env: {:?})",
            self.cmd.display(),
            self.args,
            self.shim,
            self.env
        );
        let (status, stdout, stderr) = run_with_timeout(cmd, &description);
        let report = std::fs::read_to_string(&report_path).ok().map(|text| {
            SimReport::parse(&text)
                .unwrap_or_else(|e| panic!("bad simulator report of {description}: {e}\n{text}"))
        });
        let _ = std::fs::remove_file(&report_path);
        let shim_report = shim_report_path.and_then(|p| {
            let text = std::fs::read_to_string(&p).ok()?;
            let _ = std::fs::remove_file(&p);
            Some(
                ShimReport::parse(&text)
                    .unwrap_or_else(|e| panic!("bad gpushim report of {description}: {e}\n{text}")),
            )
        });
        let mut out = RunOutput::new(description, status, stdout, stderr, report);
        out.shim_report = shim_report;
        out
    }
}

fn run_with_timeout(mut cmd: Command, description: &str) -> (ExitStatus, Vec<u8>, Vec<u8>) {
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {description}: {e}"));
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out_reader = std::thread::spawn(move || {
        let mut v = vec![];
        let _ = out.read_to_end(&mut v);
        v
    });
    let err_reader = std::thread::spawn(move || {
        let mut v = vec![];
        let _ = err.read_to_end(&mut v);
        v
    });
    let deadline = Instant::now() + RUN_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{description} did not finish within {RUN_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    (
        status,
        out_reader.join().unwrap(),
        err_reader.join().unwrap(),
    )
}

/// What a run gave.
pub struct RunOutput {
    pub description: String,
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// the `key=value` lines of stdout (the last value of a repeated key)
    pub kv: BTreeMap<String, String>,
    /// the simulator's report (absent for programs that never loaded it)
    pub report: Option<SimReport>,
    /// the shim's JSON exit report, when asked with [`Run::with_shim_report`] and written
    pub shim_report: Option<ShimReport>,
}

impl RunOutput {
    fn new(
        description: String,
        status: ExitStatus,
        stdout: Vec<u8>,
        stderr: Vec<u8>,
        report: Option<SimReport>,
    ) -> Self {
        let kv = parse_kv(&String::from_utf8_lossy(&stdout));
        RunOutput {
            description,
            status,
            stdout,
            stderr,
            kv,
            report,
            shim_report: None,
        }
    }

    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }

    /// Everything about the run, for assertion messages.
    pub fn dump(&self) -> String {
        format!(
            "{}\nstatus: {}\n--- stdout\n{}--- stderr\n{}---",
            self.description,
            self.status,
            self.stdout_text(),
            self.stderr_text()
        )
    }

    /// Panics unless the program exited with status 0 and printed `done=1`.
    pub fn assert_completed(&self) -> &Self {
        assert!(self.status.success(), "program failed\n{}", self.dump());
        assert_eq!(
            self.kv.get("done").map(String::as_str),
            Some("1"),
            "program did not finish\n{}",
            self.dump()
        );
        self
    }

    pub fn get(&self, key: &str) -> &str {
        self.kv
            .get(key)
            .unwrap_or_else(|| panic!("no `{key}=` in the output\n{}", self.dump()))
    }

    pub fn num(&self, key: &str) -> i64 {
        let v = self.get(key);
        v.parse()
            .unwrap_or_else(|_| panic!("`{key}={v}` is not a number\n{}", self.dump()))
    }

    pub fn u64(&self, key: &str) -> u64 {
        let v = self.get(key);
        v.parse()
            .unwrap_or_else(|_| panic!("`{key}={v}` is not a number\n{}", self.dump()))
    }

    /// `key` is exactly `want` (text); `what` says which check failed.
    pub fn assert_str(&self, key: &str, want: &str, what: &str) {
        assert_eq!(self.get(key), want, "{what}: `{key}`\n{}", self.dump());
    }

    /// `key` is the number `want`.
    pub fn assert_num(&self, key: &str, want: i64, what: &str) {
        assert_eq!(self.num(key), want, "{what}: `{key}`\n{}", self.dump());
    }

    /// `key` is the unsigned number `want`.
    pub fn assert_u64(&self, key: &str, want: u64, what: &str) {
        assert_eq!(self.u64(key), want, "{what}: `{key}`\n{}", self.dump());
    }

    /// stderr lines that start with `gpushim:`.
    pub fn gpushim_lines(&self) -> Vec<String> {
        self.stderr_text()
            .lines()
            .filter(|l| l.starts_with("gpushim:"))
            .map(str::to_string)
            .collect()
    }

    /// stderr lines that start with `gpushim: warn:`.
    pub fn warn_lines(&self) -> Vec<String> {
        self.stderr_text()
            .lines()
            .filter(|l| l.starts_with("gpushim: warn:"))
            .map(str::to_string)
            .collect()
    }

    pub fn report(&self) -> &SimReport {
        self.report
            .as_ref()
            .unwrap_or_else(|| panic!("the simulator wrote no report\n{}", self.dump()))
    }

    /// The shim's exit report ([`Run::with_shim_report`]).
    pub fn shim_report(&self) -> &ShimReport {
        self.shim_report
            .as_ref()
            .unwrap_or_else(|| panic!("the shim wrote no report\n{}", self.dump()))
    }

    /// stderr lines that start with `gpushim` and mention `needle`.
    pub fn gpushim_lines_with(&self, needle: &str) -> Vec<String> {
        self.gpushim_lines()
            .into_iter()
            .filter(|l| l.contains(needle))
            .collect()
    }
}

/// `key=value` lines of a text (other lines are ignored).
pub fn parse_kv(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.to_string()))
        .collect()
}

// ---------------------------------------------------------------------------------------
// The simulator's report
// ---------------------------------------------------------------------------------------

/// A JSON report's root and its `devices` array.
fn json_devices(text: &str) -> Result<(serde_json::Value, Vec<serde_json::Value>), String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let devices = v
        .get("devices")
        .and_then(|d| d.as_array())
        .ok_or("missing `devices`")?
        .clone();
    Ok((v, devices))
}

/// The number `k` of a JSON object.
fn json_num(d: &serde_json::Value, k: &str) -> Result<u64, String> {
    d.get(k)
        .and_then(|x| x.as_u64())
        .ok_or_else(|| format!("missing number `{k}`"))
}

/// One device of the simulator's report (`GPUSIM_REPORT`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimDevice {
    pub physical: u64,
    pub name: String,
    pub total: u64,
    pub used: u64,
    pub peak: u64,
    pub allocs: u64,
    pub frees: u64,
    /// The node-wide figures (`GPUSIM_NODE_STATE`): the device's memory in use by all the
    /// processes sharing the node state when the report was written, and its highest value
    /// ever; `None` when the node state is off.
    pub node_used: Option<u64>,
    pub node_peak: Option<u64>,
}

#[derive(Clone, Debug)]
pub struct SimReport {
    pub driver_version: u64,
    pub devices: Vec<SimDevice>,
    pub calls: BTreeMap<String, u64>,
    /// launches per kernel name (the driver's own record)
    pub launches: BTreeMap<String, u64>,
    /// the whole report as JSON (for [`compute::busy_share`] and other figures)
    pub raw: serde_json::Value,
    /// every green context created: (device ordinal, SMs)
    pub green_contexts: Vec<(u64, u64)>,
}

impl SimReport {
    pub fn parse(text: &str) -> Result<SimReport, String> {
        let (v, devices) = json_devices(text)?;
        let devices = devices
            .iter()
            .map(|d| {
                Ok(SimDevice {
                    physical: json_num(d, "physical")?,
                    name: d
                        .get("name")
                        .and_then(|n| n.as_str())
                        .unwrap_or_default()
                        .to_string(),
                    total: json_num(d, "total")?,
                    used: json_num(d, "used")?,
                    peak: json_num(d, "peak")?,
                    allocs: json_num(d, "allocs")?,
                    frees: json_num(d, "frees")?,
                    node_used: d.get("node_used").and_then(|x| x.as_u64()),
                    node_peak: d.get("node_peak").and_then(|x| x.as_u64()),
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let calls = v
            .get("calls")
            .and_then(|c| c.as_object())
            .map(|c| {
                c.iter()
                    .filter_map(|(k, n)| Some((k.clone(), n.as_u64()?)))
                    .collect()
            })
            .unwrap_or_default();
        let launches = v
            .get("launches")
            .and_then(|c| c.as_object())
            .map(|c| c.iter().filter_map(|(k, n)| Some((k.clone(), n.as_u64()?))).collect())
            .unwrap_or_default();
        let green_contexts = v
            .get("green_contexts")
            .and_then(|g| g.as_array())
            .map(|a| a.iter().filter_map(|g| Some((g.get("device")?.as_u64()?, g.get("sms")?.as_u64()?))).collect())
            .unwrap_or_default();
        Ok(SimReport {
            driver_version: json_num(&v, "driver_version")?,
            devices,
            calls,
            launches,
            raw: v,
            green_contexts,
        })
    }

    /// The device of physical index `p`.
    pub fn device(&self, p: u64) -> &SimDevice {
        self.devices
            .iter()
            .find(|d| d.physical == p)
            .unwrap_or_else(|| panic!("no physical device {p} in the report {self:?}"))
    }

    /// How often the program (or the shim) called the export `name`.
    pub fn calls(&self, name: &str) -> u64 {
        self.calls.get(name).copied().unwrap_or(0)
    }
}

// ---------------------------------------------------------------------------------------
// The shim's exit report and memory modes
// ---------------------------------------------------------------------------------------

/// One device of the shim's JSON exit report (`GPUSHIM_REPORT=PATH.json`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShimDevice {
    pub ordinal: u64,
    pub peak_in_use: u64,
    pub peak_reserved: u64,
    pub refused: u64,
    pub limit: u64,
}

#[derive(Clone, Debug)]
pub struct ShimReport {
    pub pid: u64,
    /// the devices the program used
    pub devices: Vec<ShimDevice>,
    /// the placement summary (`placement`), when the placement log was on
    pub placement: Option<serde_json::Value>,
    /// the compute rows (`compute`), when a device was paced
    pub compute: Option<serde_json::Value>,
}

impl ShimReport {
    pub fn parse(text: &str) -> Result<ShimReport, String> {
        let (v, devices) = json_devices(text)?;
        let devices = devices
            .iter()
            .map(|d| {
                Ok(ShimDevice {
                    ordinal: json_num(d, "ordinal")?,
                    peak_in_use: json_num(d, "peak_in_use")?,
                    peak_reserved: json_num(d, "peak_reserved")?,
                    refused: json_num(d, "refused")?,
                    limit: json_num(d, "limit")?,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(ShimReport {
            pid: json_num(&v, "pid")?,
            devices,
            placement: v.get("placement").cloned(),
            compute: v.get("compute").cloned(),
        })
    }

    /// The device of (program) ordinal `i`.
    pub fn device(&self, i: u64) -> &ShimDevice {
        self.devices
            .iter()
            .find(|d| d.ordinal == i)
            .unwrap_or_else(|| panic!("no device {i} in the gpushim report {self:?}"))
    }
}

/// How a run is made with respect to the memory modes: without the shim, or with it in one of
/// the `GPUSHIM_MEMORY_MODE`s (set explicitly, `passthrough` included).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryMode {
    NoShim,
    Passthrough,
    Grow,
    Preallocate,
}

impl MemoryMode {
    pub const ALL: [MemoryMode; 4] = [
        MemoryMode::NoShim,
        MemoryMode::Passthrough,
        MemoryMode::Grow,
        MemoryMode::Preallocate,
    ];
    /// The modes that serve cuMemAlloc / cuMemAllocPitch from the shim's reserve.
    pub const SERVED: [MemoryMode; 2] = [MemoryMode::Grow, MemoryMode::Preallocate];

    pub fn shim(self) -> bool {
        self != MemoryMode::NoShim
    }

    /// grow or preallocate: allocations come from the shim's reserve.
    pub fn serves(self) -> bool {
        matches!(self, MemoryMode::Grow | MemoryMode::Preallocate)
    }

    /// The value of `GPUSHIM_MEMORY_MODE` (None without the shim).
    pub fn env_value(self) -> Option<&'static str> {
        match self {
            MemoryMode::NoShim => None,
            MemoryMode::Passthrough => Some("passthrough"),
            MemoryMode::Grow => Some("grow"),
            MemoryMode::Preallocate => Some("preallocate"),
        }
    }

    /// The name `GPUSHIM_TEST_MODES` uses: `noshim`, `passthrough`, `grow`, `preallocate`.
    pub fn name(self) -> &'static str {
        self.env_value().unwrap_or("noshim")
    }

    /// `modes`, less those the test's environment leaves out: `GPUSHIM_TEST_MODES` (a comma
    /// list of [`MemoryMode::name`]s; unset = all) lets a developer run only some modes, e.g.
    /// `GPUSHIM_TEST_MODES=noshim,passthrough cargo test --test memory_modes`.
    pub fn selected(modes: &[MemoryMode]) -> Vec<MemoryMode> {
        let only = std::env::var("GPUSHIM_TEST_MODES").ok();
        modes
            .iter()
            .copied()
            .filter(|m| {
                only.as_deref().map_or(true, |o| {
                    o.split(',')
                        .any(|n| n.trim().eq_ignore_ascii_case(m.name()))
                })
            })
            .collect()
    }

    /// `run` with the shim preloaded (or not) and `GPUSHIM_MEMORY_MODE` set.
    pub fn apply(self, run: Run) -> Run {
        let run = run.shim(self.shim());
        match self.env_value() {
            Some(v) => run.env("GPUSHIM_MEMORY_MODE", v),
            None => run,
        }
    }
}

/// `x` rounded up to a multiple of `to` (a power of two).
pub fn round_up(x: u64, to: u64) -> u64 {
    (x + to - 1) & !(to - 1)
}

// ---------------------------------------------------------------------------------------
// Small assertion helpers
// ---------------------------------------------------------------------------------------

/// Asserts that `line` mentions every number of `numbers` as a whole decimal number.
pub fn assert_mentions_numbers(line: &str, numbers: &[u64]) {
    let found: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|w| !w.is_empty())
        .filter_map(|w| w.parse().ok())
        .collect();
    for n in numbers {
        assert!(found.contains(n), "`{line}` does not mention {n}");
    }
}

/// Asserts that the line names device `i` (`device <i>`, not `device <i>x`).
pub fn assert_mentions_device(line: &str, i: u32) {
    let needle = format!("device {i}");
    let ok = line
        .match_indices(&needle)
        .any(|(at, _)| !line[at + needle.len()..].starts_with(|c: char| c.is_ascii_digit()));
    assert!(ok, "`{line}` does not name `device {i}`");
}

// ---------------------------------------------------------------------------------------
// Allocation scenarios and their expected outcome
// ---------------------------------------------------------------------------------------

/// One operation of `tests/c/drvapi.c` / `tests/c/runtime.c`.
#[derive(Clone, Debug)]
pub enum Op {
    /// make device N current
    Dev(u32),
    /// allocate through an API of the program (`mem`, `pitch`, `malloc`, `host` ...)
    Alloc(&'static str, u64),
    /// free what operation K allocated (K = 1-based position in the scenario)
    Free(usize),
    /// free what operation K allocated with plain cuMemFree (drvapi only)
    MemFree(usize),
    /// memory info of the current device
    Info,
}

impl Op {
    fn arg(&self) -> String {
        match self {
            Op::Dev(d) => format!("dev={d}"),
            Op::Alloc(api, bytes) => format!("alloc={api}:{bytes}"),
            Op::Free(k) => format!("free={k}"),
            Op::MemFree(k) => format!("memfree={k}"),
            Op::Info => "info".into(),
        }
    }
}

/// APIs that allocate host memory, which never counts against a device.
pub fn is_host_api(api: &str) -> bool {
    matches!(api, "host" | "hostalloc" | "hostreg")
}

/// A list of operations on devices with `physical` bytes each and per-device limits
/// (`None`: unlimited). [`Scenario::expect`] works out what must happen with or without the shim.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub ops: Vec<Op>,
    pub physical: u64,
    pub limits: Vec<Option<u64>>,
}

/// A refusal the shim must log: device, request, in use, limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub device: u32,
    pub request: u64,
    pub in_use: u64,
    pub limit: u64,
}

/// What a scenario must give.
#[derive(Clone, Debug, Default)]
pub struct Expected {
    /// (key, value) pairs of the program output, e.g. ("op3.rc", 2), ("op4.free", N)
    pub values: Vec<(String, u64)>,
    pub refusals: Vec<Refusal>,
    /// the simulator's peak in use per device
    pub peaks: Vec<u64>,
}

impl Scenario {
    pub fn new(physical: u64, limits: &[Option<u64>]) -> Scenario {
        Scenario {
            ops: vec![],
            physical,
            limits: limits.to_vec(),
        }
    }

    pub fn op(mut self, op: Op) -> Scenario {
        self.ops.push(op);
        self
    }

    pub fn args(&self) -> Vec<String> {
        self.ops.iter().map(Op::arg).collect()
    }

    fn effective_limit(&self, device: usize, shim: bool) -> u64 {
        match (shim, self.limits.get(device).copied().flatten()) {
            (true, Some(limit)) => limit.min(self.physical),
            _ => self.physical,
        }
    }

    /// The outcome with (`shim`) or without the shim.
    pub fn expect(&self, shim: bool) -> Expected {
        let n = self.limits.len().max(1);
        let mut used = vec![0u64; n];
        let mut peaks = vec![0u64; n];
        let mut live: HashMap<usize, (usize, u64)> = HashMap::new();
        let mut device = 0usize;
        let mut e = Expected::default();
        for (i, op) in self.ops.iter().enumerate() {
            let i = i + 1;
            let limit = self.effective_limit(device, shim);
            match op {
                Op::Dev(d) => {
                    device = *d as usize;
                    e.values.push((format!("op{i}.rc"), 0));
                }
                Op::Alloc(api, _) if is_host_api(api) => {
                    live.insert(i, (device, 0));
                    e.values.push((format!("op{i}.rc"), 0));
                }
                Op::Alloc(_, bytes) => {
                    if used[device] + bytes <= limit {
                        used[device] += bytes;
                        peaks[device] = peaks[device].max(used[device]);
                        live.insert(i, (device, *bytes));
                        e.values.push((format!("op{i}.rc"), 0));
                    } else {
                        e.values.push((format!("op{i}.rc"), OOM as u64));
                        e.refusals.push(Refusal {
                            device: device as u32,
                            request: *bytes,
                            in_use: used[device],
                            limit,
                        });
                    }
                }
                Op::Free(k) | Op::MemFree(k) => {
                    let (d, bytes) = live
                        .remove(k)
                        .unwrap_or_else(|| panic!("op{i} frees op{k}, which holds nothing"));
                    used[d] -= bytes;
                    e.values.push((format!("op{i}.rc"), 0));
                }
                Op::Info => {
                    e.values.push((format!("op{i}.rc"), 0));
                    e.values.push((format!("op{i}.total"), limit));
                    let driver_free = self.physical - used[device];
                    e.values.push((
                        format!("op{i}.free"),
                        (limit - used[device]).min(driver_free),
                    ));
                }
            }
        }
        e.peaks = peaks;
        e
    }

    /// Runs `run` (a program run with everything but the scenario's arguments set) and
    /// checks every expected value, the warnings and the simulator's report.
    pub fn check(&self, run: Run, shim: bool) -> RunOutput {
        self.check_as(run, shim, shim)
    }

    /// Like [`Scenario::check`], with the shim preloaded or not (`preload`) and the outcome
    /// expected with limits in force or not (`limited`): `GPUSHIM_DISABLE` preloads without limits.
    pub fn check_as(&self, run: Run, preload: bool, limited: bool) -> RunOutput {
        let shim = limited;
        let out = run.args(self.args()).shim(preload).run();
        out.assert_completed();
        let e = self.expect(limited);
        for (key, want) in &e.values {
            assert_eq!(
                out.u64(key),
                *want,
                "`{key}` (shim: {shim})\n{}",
                out.dump()
            );
        }
        assert_eq!(
            out.num("cleanup.failures"),
            0,
            "freeing at the end failed\n{}",
            out.dump()
        );
        let warns = out.warn_lines();
        if shim {
            assert_eq!(
                warns.len(),
                e.refusals.len(),
                "one warning per refusal: {:?}\n{}",
                e.refusals,
                out.dump()
            );
            for (line, r) in warns.iter().zip(&e.refusals) {
                assert_mentions_device(line, r.device);
                assert_mentions_numbers(line, &[r.request, r.in_use, r.limit]);
            }
        } else {
            assert!(
                out.gpushim_lines().is_empty(),
                "gpushim output without the shim?\n{}",
                out.dump()
            );
        }
        let report = out.report();
        for (d, peak) in e.peaks.iter().enumerate() {
            let dev = report.device(d as u64);
            assert_eq!(
                dev.used,
                0,
                "device {d} still has memory in use at exit\n{}",
                out.dump()
            );
            assert_eq!(
                dev.peak,
                *peak,
                "peak of device {d} (shim: {shim})\n{}",
                out.dump()
            );
        }
        out
    }
}

// ---------------------------------------------------------------------------------------
// Configuration errors: the shim fails closed
// ---------------------------------------------------------------------------------------

/// A run under the shim with a configuration error: the program completes, CUDA init fails with
/// 3 ([`NOT_INITIALIZED`]), no device is usable and exactly one gpushim line is printed, which
/// is returned.
pub fn assert_config_error(out: &RunOutput) -> String {
    out.assert_completed();
    assert_eq!(
        out.num("init.rc"),
        NOT_INITIALIZED,
        "CUDA init must fail with 3\n{}",
        out.dump()
    );
    assert!(
        out.kv.get("count").map_or(true, |c| c == "0"),
        "devices usable after a configuration error\n{}",
        out.dump()
    );
    let lines = out.gpushim_lines();
    assert_eq!(lines.len(), 1, "exactly one gpushim line\n{}", out.dump());
    lines[0].clone()
}

/// [`assert_config_error`], and the line is `gpushim: SETTING="VALUE": REASON` with a reason.
pub fn assert_fails_closed(out: &RunOutput, setting: &str, value: &str) -> String {
    let line = assert_config_error(out);
    let prefix = format!("gpushim: {setting}=\"{value}\": ");
    assert!(
        line.starts_with(&prefix),
        "`{line}` does not start with `{prefix}`\n{}",
        out.dump()
    );
    assert!(
        line.len() > prefix.len() + 3,
        "`{line}` gives no reason\n{}",
        out.dump()
    );
    line
}

/// The runs of [`check_fails_closed`].
pub struct FailsClosed {
    /// without the shim (it initialised)
    pub plain: RunOutput,
    /// with the shim (it failed closed)
    pub shim: RunOutput,
    /// the one gpushim line of the run with the shim
    pub line: String,
}

/// Runs `run()` (everything set but the shim) without the shim, where the program must
/// initialise, and with it, where it must fail closed ([`assert_config_error`]).
pub fn check_fails_closed(run: impl Fn() -> Run) -> FailsClosed {
    let plain = run().run();
    plain.assert_completed();
    assert_eq!(
        plain.num("init.rc"),
        0,
        "the program must work without the shim\n{}",
        plain.dump()
    );
    let shim = run().shim(true).run();
    let line = assert_config_error(&shim);
    FailsClosed { plain, shim, line }
}

/// Whether this test process is not root, saying so on stderr: a test of what another user can
/// reach (it runs processes as `nobody`, chowns to them) returns early when this is true.
pub fn skipped_without_root(test: &str) -> bool {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return false;
    }
    eprintln!("{test}: skipped (needs root)");
    true
}

/// The first of /usr/bin/python3 (where Debian's python3-jsonschema and python3-yaml go) and
/// `python3` on PATH that imports `modules` (comma-separated); None, saying why on stderr,
/// where none does — a failure instead where `CI` is set (scripts/test.sh installs them).
pub fn python_with(modules: &str, test: &str) -> Option<PathBuf> {
    for python in ["/usr/bin/python3", "python3"] {
        let ok = Command::new(python).args(["-c", &format!("import {modules}")]).stdout(Stdio::null()).stderr(Stdio::null()).status();
        if ok.is_ok_and(|s| s.success()) {
            return Some(PathBuf::from(python));
        }
    }
    let why = format!("{test}: neither /usr/bin/python3 nor python3 imports {modules} (Debian: apt-get install python3-jsonschema python3-yaml)");
    assert!(std::env::var_os("CI").is_none(), "{why}; CI is set: not skipped");
    eprintln!("SKIPPED: {why}");
    None
}

/// A program running in the background (a member holding memory, a parent of children):
/// killed with SIGKILL when dropped, also when a test fails first.
pub struct Holder(pub std::process::Child);

impl Holder {
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill(); // SIGKILL
        let _ = self.0.wait();
    }
}

/// `p` under the shim on the simulator with a clean environment (`PATH`, the simulator's
/// libraries, the shim, nothing else: unlike [`Run`], no state directory or report of a run's
/// own), to start in the background.
pub fn background_program(p: Program) -> Command {
    let mut cmd = target_command(program(p));
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("LD_LIBRARY_PATH", sim_dir())
        .env("LD_PRELOAD", shim_path());
    cmd
}

/// Starts `cmd` (no input, its output discarded) and returns once it has created `ready`
/// (20 s at most).
pub fn start_until_ready(cmd: &mut Command, ready: &Path) -> Holder {
    let child = Holder(cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("start the program"));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ready.exists() {
        assert!(Instant::now() < deadline, "the program never got ready ({} not made)", ready.display());
        std::thread::sleep(Duration::from_millis(10));
    }
    child
}
