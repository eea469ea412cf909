//! HAMi-core drop-in: HAMi's variables and its shared region file (`CUDA_DEVICE_MEMORY_SHARED_CACHE`)
//! across processes on the simulated driver, read back by `gpushim ps --hami` (always) and by
//! HAMi-core's own `shrreg-tool` and test programs (only where `GPUSHIM_HAMI_SRC` names
//! HAMi-core's source at commit 8f3a89c and `GPUSHIM_HAMI_LIB` its built `libvgpu.so`; skipped
//! with a printed reason otherwise: CI cannot fetch them).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::*;

const LIMIT: u64 = 64 * MIB;

struct Node {
    dir: PathBuf,
    state: PathBuf,
    node: PathBuf,
    region: PathBuf,
}

impl Node {
    fn new(name: &str) -> Node {
        let dir = fresh_dir(name);
        Node { state: dir.join("state"), node: dir.join("node"), region: dir.join("region.cache"), dir }
    }

    fn hami_env(&self) -> Vec<(String, String)> {
        vec![
            ("GPUSIM_DEVICES".into(), "1".into()),
            ("GPUSIM_MEMORY".into(), "16GiB".into()),
            ("GPUSIM_NODE_STATE".into(), self.node.display().to_string()),
            ("GPUSHIM_STATE_DIR".into(), self.state.display().to_string()),
            ("CUDA_DEVICE_MEMORY_LIMIT".into(), "64m".into()),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE".into(), self.region.display().to_string()),
        ]
    }

    /// The driver-API program on this node with HAMi's variables (`shim`: under gpushim).
    fn run(&self, shim: bool, args: &[String]) -> Run {
        let mut run = Run::program(Program::Driver(DriverPath::Link)).shim(shim).args(args);
        for (k, v) in self.hami_env() {
            run = run.env(&k, v);
        }
        run
    }

    fn background(&self, p: Program, args: &[String], env: &[(&str, &str)]) -> Command {
        let mut cmd = background_program(p);
        cmd.args(args);
        for (k, v) in self.hami_env() {
            cmd.env(k, v);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd
    }

    /// Starts the driver-API program holding `bytes` under the shim; returns once it holds them.
    fn start_holder(&self, bytes: u64) -> Holder {
        self.start_holder_ops(&[format!("alloc=mem:{bytes}")])
    }

    /// Starts the driver-API program running `ops` under the shim, then sleeping; returns once
    /// it has run them.
    fn start_holder_ops(&self, ops: &[String]) -> Holder {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let ready = self.dir.join(format!("ready-{n}"));
        let mut args = ops.to_vec();
        args.extend([format!("touch={}", ready.display()), "sleep=60000".into()]);
        start_until_ready(&mut self.background(Program::Driver(DriverPath::Link), &args, &[]), &ready)
    }

    /// `gpushim ps --hami` on the region: its lines.
    fn show(&self) -> Vec<String> {
        show(&self.region)
    }
}

fn show(region: &Path) -> Vec<String> {
    let out = target_command(profile_dir().join("gpushim"))
        .args(["ps", "--hami"])
        .arg(region)
        .output()
        .expect("run gpushim ps --hami");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
}

fn slot_lines(lines: &[String]) -> Vec<&String> {
    lines.iter().filter(|l| l.starts_with("slot ")).collect()
}

/// The region file is HAMi-core's: its size, magic and version, the limit from
/// `CUDA_DEVICE_MEMORY_LIMIT`, the device's UUID, one live slot per member with what it holds;
/// a SIGKILLed member's slot reads dead and its memory is handed on; a member that ends leaves no
/// slot, and the dead one is removed by the next process.
#[test]
fn the_region_is_hamis_and_kept_current() {
    let node = Node::new("hami-region");
    let holder = node.start_holder(40 * MIB);
    let len = std::fs::metadata(&node.region).unwrap().len();
    assert_eq!(len, 2_008_952 + 1, "HAMi-core's size (the struct and one byte)");
    let bytes = std::fs::read(&node.region).unwrap();
    assert_eq!(i32::from_le_bytes(bytes[0..4].try_into().unwrap()), 19_920_718, "magic");
    assert_eq!((u32::from_le_bytes(bytes[4..8].try_into().unwrap()), u32::from_le_bytes(bytes[8..12].try_into().unwrap())), (1, 2));
    let lines = node.show();
    assert!(lines[0].contains("version 1.2, 1 devices, 1 process slots"), "{lines:?}");
    assert!(lines.iter().any(|l| *l == format!("device 0 {} limit {LIMIT} sm_limit 100", phys_uuid(0))), "{lines:?}");
    let slots = slot_lines(&lines);
    assert_eq!(slots.len(), 1, "{lines:?}");
    assert_eq!(*slots[0], format!("slot pid {} hostpid 0 status 1 alive used 0:{}", holder.pid(), 40 * MIB), "{lines:?}");

    // a second member: one budget (48 + 32 > 64 refused, 16 more fits), its usage during the run
    let args = vec!["info".to_string(), format!("alloc=mem:{}", 32 * MIB), format!("alloc=mem:{}", 16 * MIB)];
    let out = node.run(true, &args).run();
    out.assert_completed();
    assert_eq!((out.u64("op1.free"), out.u64("op1.total")), (24 * MIB, LIMIT), "{}", out.dump());
    assert_eq!((out.num("op2.rc"), out.num("op3.rc")), (2, 0), "{}", out.dump());
    // it ended: its slot is gone
    let lines = node.show();
    assert_eq!(slot_lines(&lines).len(), 1, "{lines:?}");

    let pid = holder.pid();
    drop(holder); // SIGKILL, reaped
    let lines = node.show();
    assert_eq!(slot_lines(&lines), vec![&format!("slot pid {pid} hostpid 0 status 1 dead used 0:{}", 40 * MIB)], "{lines:?}");
    // the next member gets the whole budget, and removes the dead slot
    let out = node.run(true, &["info".to_string(), format!("alloc=mem:{LIMIT}")]).run();
    out.assert_completed();
    assert_eq!((out.u64("op1.free"), out.num("op2.rc")), (LIMIT, 0), "{}", out.dump());
    let lines = node.show();
    assert!(slot_lines(&lines).is_empty(), "{lines:?}");
    assert!(lines[0].contains("0 process slots"), "{lines:?}");
}

/// The same two members without the shim: the simulated driver gives both what they ask (the
/// check above can fail).
#[test]
fn without_the_shim_nothing_is_shared() {
    let node = Node::new("hami-noshim");
    let args = vec![format!("alloc=mem:{}", 48 * MIB), format!("alloc=mem:{}", 32 * MIB)];
    let out = node.run(false, &args).run();
    out.assert_completed();
    assert_eq!((out.num("op1.rc"), out.num("op2.rc")), (0, 0), "{}", out.dump());
    assert!(!node.region.exists());
}

/// `n` processes × 4 threads racing on one region (64 MiB) next to a member holding 48 MiB: the
/// simulated driver never holds more than 64 MiB for all of them; with `GPUSHIM_MEMORY_LIMIT`
/// alone (no region) they pass it.
fn racing(n: usize) {
    for hami in [true, false] {
        let node = Node::new(&format!("hami-race-{n}-{hami}"));
        let args: Vec<String> = ["4", "3000", &(8 * MIB).to_string(), "4"].iter().map(|s| s.to_string()).collect();
        let configure = |cmd: &mut Command| {
            if !hami {
                cmd.env_remove("CUDA_DEVICE_MEMORY_LIMIT").env_remove("CUDA_DEVICE_MEMORY_SHARED_CACHE").env("GPUSHIM_MEMORY_LIMIT", "64MiB");
            }
        };
        // a member holding 48 MiB throughout, so that the racers overlap with someone however
        // the machine schedules them (without the region, any racer above 16 MiB passes 64)
        let ready = node.dir.join("holder-ready");
        let hold = [format!("alloc=mem:{}", 48 * MIB), format!("touch={}", ready.display()), "sleep=60000".into()];
        let mut cmd = node.background(Program::Driver(DriverPath::Link), &hold, &[]);
        configure(&mut cmd);
        let holder = start_until_ready(&mut cmd, &ready);
        let kids: Vec<Child> = (0..n)
            .map(|_| {
                let mut cmd = node.background(Program::Race, &args, &[]);
                configure(&mut cmd);
                cmd.env("GPUSIM_REPORT", node.dir.join(format!("sim-{}.txt", rand_id())));
                cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
            })
            .collect();
        let mut refusals = 0;
        for k in kids {
            let out = k.wait_with_output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            assert!(out.status.success(), "{out:?}");
            let kv = parse_kv(&text);
            assert_eq!(kv.get("errors").map(String::as_str), Some("0"), "{text}");
            refusals += kv.get("refusals").and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        }
        let mut peak = 0;
        for e in std::fs::read_dir(&node.dir).unwrap().flatten() {
            if e.file_name().to_string_lossy().starts_with("sim-") {
                let r = SimReport::parse(&std::fs::read_to_string(e.path()).unwrap()).unwrap();
                peak = peak.max(r.device(0).node_peak.unwrap());
            }
        }
        drop(holder);
        if hami {
            assert!(peak <= LIMIT, "{n} processes: node peak {peak} above the region's {LIMIT}");
            assert!(peak > 48 * MIB && refusals > 0, "they contended (peak {peak}, {refusals} refusals)");
            let lines = node.show();
            assert!(slot_lines(&lines).iter().all(|l| l.contains(" dead ")), "every member left (the holder was killed): {lines:?}");
        } else {
            assert!(peak > LIMIT, "without the region they pass {LIMIT} (peak {peak})");
        }
    }
}

fn rand_id() -> String {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    format!("{}-{}", std::process::id(), N.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
}

#[test]
fn two_processes_share_one_region_budget() {
    racing(2);
}

#[test]
fn eight_processes_share_one_region_budget() {
    racing(8);
}

// ---------------------------------------------------------------------------------------------
// Refusals: a region file the shim cannot safely adopt fails CUDA initialisation with one line
// ---------------------------------------------------------------------------------------------

fn assert_refused(node: &Node, why: &str) {
    let out = node.run(true, &[format!("alloc=mem:{}", MIB)]).run();
    assert_ne!(out.num("init.rc"), 0, "{}", out.dump());
    let lines = out.gpushim_lines();
    let named: Vec<_> = lines.iter().filter(|l| l.starts_with("gpushim: CUDA_DEVICE_MEMORY_SHARED_CACHE=")).collect();
    assert_eq!(named.len(), 1, "{}", out.dump());
    assert!(named[0].contains(why), "{why}: {}", out.dump());
}

#[test]
fn unsafe_region_files_are_refused() {
    let node = Node::new("hami-refuse-link");
    let target = node.dir.join("elsewhere");
    std::fs::write(&target, b"").unwrap();
    std::os::unix::fs::symlink(&target, &node.region).unwrap();
    assert_refused(&node, "symbolic link");
    assert_eq!(std::fs::metadata(&target).unwrap().len(), 0, "the link's target untouched");

    let node = Node::new("hami-refuse-hardlink");
    let other = node.dir.join("precious");
    std::fs::write(&other, vec![0u8; 4 << 20]).unwrap();
    std::fs::hard_link(&other, &node.region).unwrap();
    assert_refused(&node, "has 2 hard links");
    assert_eq!(std::fs::read(&other).unwrap(), vec![0u8; 4 << 20], "the other name's file untouched");

    let node = Node::new("hami-refuse-zeros");
    std::fs::write(&node.region, vec![0u8; 4 << 20]).unwrap();
    assert_refused(&node, "is 4194304 bytes and not a HAMi-core shared region");

    let node = Node::new("hami-refuse-dir");
    std::fs::create_dir(&node.region).unwrap();
    assert_refused(&node, "cannot open it");

    let node = Node::new("hami-refuse-fifo");
    let c = std::ffi::CString::new(node.region.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    assert_refused(&node, "not a regular file");

    let node = Node::new("hami-refuse-size");
    std::fs::write(&node.region, vec![7u8; 4096]).unwrap();
    assert_refused(&node, "is 4096 bytes, not a HAMi-core shared region");

    let node = Node::new("hami-refuse-magic");
    let mut bytes = vec![0u8; 2_008_953];
    bytes[0..4].copy_from_slice(&12345i32.to_le_bytes());
    std::fs::write(&node.region, &bytes).unwrap();
    assert_refused(&node, "its magic is 12345");
    assert_eq!(std::fs::read(&node.region).unwrap(), bytes, "left as it was");

    let node = Node::new("hami-refuse-version");
    let mut bytes = vec![0u8; 2_008_953];
    bytes[0..4].copy_from_slice(&19_920_718i32.to_le_bytes());
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    std::fs::write(&node.region, &bytes).unwrap();
    assert_refused(&node, "its version is 2.0");
}

/// Another user's file is refused (as root: the file is given to another user; skipped otherwise).
#[test]
fn another_users_region_file_is_refused() {
    // SAFETY: no arguments.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to give a file to another user");
        return;
    }
    let node = Node::new("hami-refuse-owner");
    std::fs::write(&node.region, b"").unwrap();
    std::os::unix::fs::chown(&node.region, Some(4242), Some(4242)).unwrap();
    assert_refused(&node, "belongs to user 4242");
}

/// An existing file's limit wins over `CUDA_DEVICE_MEMORY_LIMIT` (one line), as in HAMi-core; a
/// `GPUSHIM_` limit wins over the file.
#[test]
fn an_existing_files_limit_wins_over_hamis_variable() {
    let node = Node::new("hami-stored");
    let out = node.run(true, &["info".to_string()]).run();
    out.assert_completed();
    assert_eq!(out.u64("op1.total"), LIMIT, "{}", out.dump());
    let out = node.run(true, &["info".to_string()]).env("CUDA_DEVICE_MEMORY_LIMIT", "1g").run();
    out.assert_completed();
    assert_eq!(out.u64("op1.total"), LIMIT, "{}", out.dump());
    let lines = out.warn_lines();
    assert_eq!(lines.iter().filter(|l| l.contains("win over the environment's, as in HAMi-core: devices 0-15: 67108864 bytes (environment: 1073741824 bytes)")).count(), 1, "{}", out.dump());
    let out = node.run(true, &["info".to_string()]).env("GPUSHIM_MEMORY_LIMIT", "32MiB").run();
    out.assert_completed();
    assert_eq!(out.u64("op1.total"), 32 * MIB, "{}", out.dump());
    // a stored limit only lowers the environment's: 32 MiB asked, 64 MiB stored
    let out = node.run(true, &["info".to_string()]).env("CUDA_DEVICE_MEMORY_LIMIT", "32m").run();
    out.assert_completed();
    assert_eq!(out.u64("op1.total"), 32 * MIB, "{}", out.dump());
    assert!(!out.stderr_text().contains("win over the environment"), "{}", out.dump());
}

/// A region file other users can write (HAMi-core makes its files 0666): one of this user's is
/// made the owner's alone before it is used (nobody else can then change its limits or
/// truncate it under the program's mapping).
#[test]
fn a_region_file_others_can_write_is_made_the_owners() {
    use std::os::unix::fs::PermissionsExt;
    let node = Node::new("hami-0666");
    std::fs::write(&node.region, b"").unwrap();
    std::fs::set_permissions(&node.region, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = node.run(true, &[format!("alloc=mem:{}", MIB)]).run();
    out.assert_completed();
    assert_eq!(out.num("op1.rc"), 0, "{}", out.dump());
    let mode = std::fs::metadata(&node.region).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o644, "{}", out.dump());
}

/// A process configured with `GPUSHIM_` names only never opens a region file, even with one at
/// HAMi-core's path (here a state directory's: the default path is the machine's).
#[test]
fn gpushim_names_alone_use_no_region() {
    let node = Node::new("hami-none");
    let out = Run::program(Program::Driver(DriverPath::Link))
        .shim(true)
        .args([format!("alloc=mem:{}", 48 * MIB)])
        .env("GPUSIM_DEVICES", "1")
        .env("GPUSHIM_STATE_DIR", &node.state)
        .env("GPUSHIM_MEMORY_LIMIT", "64MiB")
        .env("LIBCUDA_LOG_LEVEL", "3")
        .run();
    out.assert_completed();
    assert_eq!(out.num("op1.rc"), 0, "{}", out.dump());
    assert!(!out.stderr_text().contains("HAMi-core shared region"), "{}", out.dump());
}

// ---------------------------------------------------------------------------------------------
// Against HAMi-core itself (its source and library named by the environment)
// ---------------------------------------------------------------------------------------------

struct Hami {
    src: PathBuf,
    lib: PathBuf,
    nvml_include: PathBuf,
    cache: PathBuf,
}

/// HAMi-core's source (`GPUSHIM_HAMI_SRC`, commit 8f3a89c) and built `libvgpu.so`
/// (`GPUSHIM_HAMI_LIB`), with an `nvml.h` (`GPUSHIM_HAMI_NVML_INCLUDE`, else TensorFlow's in
/// `.deps`); `None` (the test then prints why it is skipped) when one is missing.
fn hami() -> Option<Hami> {
    let var = |n: &str| std::env::var_os(n).map(PathBuf::from);
    let (Some(src), Some(lib)) = (var("GPUSHIM_HAMI_SRC"), var("GPUSHIM_HAMI_LIB")) else {
        eprintln!("skipped: set GPUSHIM_HAMI_SRC (HAMi-core's source at 8f3a89c) and GPUSHIM_HAMI_LIB (its libvgpu.so) to compare with HAMi-core");
        return None;
    };
    let nvml_include = var("GPUSHIM_HAMI_NVML_INCLUDE").unwrap_or_else(|| {
        workspace_root().join(".deps/tf/venv/lib/python3.11/site-packages/tensorflow/include/third_party/gpus/cuda/nvml/include")
    });
    if !nvml_include.join("nvml.h").exists() || !src.join("src/multiprocess/multiprocess_memory_limit.h").exists() || !lib.exists() {
        eprintln!("skipped: no nvml.h in {} (GPUSHIM_HAMI_NVML_INCLUDE), or GPUSHIM_HAMI_SRC / GPUSHIM_HAMI_LIB wrong", nvml_include.display());
        return None;
    }
    // (outside the repository: the built programs are HAMi-core's)
    // SAFETY: no arguments.
    let cache = std::env::temp_dir().join(format!("gpushim-hami-cache-{}", unsafe { libc::geteuid() }));
    std::fs::create_dir_all(cache.join("config")).unwrap();
    std::fs::write(
        cache.join("config/static_config.h"),
        "#define MULTIPROCESS_LIMIT_ENABLE\n#define DLSYM_HOOK_ENABLE\n#define HOOK_MEMINFO_ENABLE\n#define HOOK_NVML_ENABLE\n",
    )
    .unwrap();
    Some(Hami { src, lib, nvml_include, cache })
}

impl Hami {
    /// Compiles `sources` (relative to the source tree) into the cache as `name`.
    fn build(&self, name: &str, sources: &[&str]) -> PathBuf {
        // (built under a name of this process' own, then renamed into place: tests side by side)
        let exe = self.cache.join(name);
        let tmp = self.cache.join(format!("{name}.{}", std::process::id()));
        let deps = cuda_deps(13);
        let out = Command::new(c_compiler())
            .args(["-O1", "-w", "-std=gnu11"])
            .arg(format!("-I{}", deps.join("include").display()))
            .arg(format!("-I{}", self.nvml_include.display()))
            .arg(format!("-I{}", self.src.join("src").display()))
            .arg(format!("-I{}", self.cache.join("config").display()))
            .args(sources.iter().map(|s| self.src.join(s)))
            .arg("-o")
            .arg(&tmp)
            .arg(format!("-L{}", sim_dir().display()))
            .args(["-lcuda", "-lnvidia-ml"])
            .arg(format!("-L{}", deps.join("lib").display()))
            .arg("-l:libcudart.so.13")
            .arg(format!("-Wl,-rpath,{}", deps.join("lib").display()))
            .args(["-lpthread", "-lrt"])
            .output()
            .expect("gcc");
        assert!(out.status.success(), "building {name}: {}", String::from_utf8_lossy(&out.stderr));
        std::fs::rename(&tmp, &exe).unwrap();
        exe
    }
}

/// Every field's offset in HAMi-core's header is the one `gpushim_common::hami` uses.
#[test]
fn the_c_header_agrees_on_every_offset() {
    let Some(h) = hami() else { return };
    let mut c = String::from("#include <stdio.h>\n#include <stddef.h>\n#include \"multiprocess/multiprocess_memory_limit.h\"\nint main(void) {\n");
    c += "printf(\"size %zu\\n\", sizeof(shared_region_t));\n";
    for (name, _) in gpushim_common::hami::OFFSETS {
        let expr = match *name {
            "procs[1]" => "offsetof(shared_region_t, procs) + sizeof(shrreg_proc_slot_t)".to_string(),
            n => format!("offsetof(shared_region_t, {n})"),
        };
        c += &format!("printf(\"{name} %zu\\n\", (size_t)({expr}));\n");
    }
    c += "return 0; }\n";
    let file = h.cache.join(format!("offsets-{}.c", std::process::id()));
    std::fs::write(&file, c).unwrap();
    let exe = h.build("offsets", &[file.to_str().unwrap()]);
    let _ = std::fs::remove_file(&file);
    let out = target_command(&exe).env("LD_LIBRARY_PATH", sim_dir()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let mut want = format!("size {}\n", gpushim_common::hami::SIZE);
    for (name, off) in gpushim_common::hami::OFFSETS {
        want += &format!("{name} {off}\n");
    }
    assert_eq!(text, want);
}

/// HAMi-core's own test programs (test/*.c; test_alloc_hold holds forever and is left out) give
/// the same exit status under gpushim with HAMi's variables as under libvgpu.so, on the same
/// simulated driver; gpushim's region file is left without live slots.
#[test]
fn hami_cores_test_programs_give_the_same_results() {
    let Some(h) = hami() else { return };
    let mut names: Vec<String> = std::fs::read_dir(h.src.join("test"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".c") && n != "test_alloc_hold.c")
        .collect();
    names.sort();
    assert!(names.len() >= 10, "{names:?}");
    let dir = fresh_dir("hami-programs");
    let mut table = Vec::new();
    for name in &names {
        let exe = h.build(name.trim_end_matches(".c"), &[&format!("test/{name}")]);
        let mut codes = Vec::new();
        for (which, lib) in [("gpushim", shim_path()), ("libvgpu", h.lib.clone())] {
            let region = dir.join(format!("{which}-{name}.cache"));
            let out = target_command(&exe)
                .env_clear()
                .env("PATH", std::env::var_os("PATH").unwrap_or_default())
                .env("LD_LIBRARY_PATH", sim_dir())
                .env("LD_PRELOAD", &lib)
                .env("GPUSIM_DEVICES", "1")
                .env("GPUSIM_MEMORY", "16GiB")
                .env("GPUSHIM_STATE_DIR", dir.join("state"))
                .env("CUDA_DEVICE_MEMORY_LIMIT", "1g")
                .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", &region)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .unwrap();
            codes.push(out.code().or_else(|| std::os::unix::process::ExitStatusExt::signal(&out).map(|s| 128 + s)));
            if which == "gpushim" && region.exists() {
                // (a program that aborts runs no exit handler: its slot reads dead, for the next to remove)
                assert!(!slot_lines(&show(&region)).iter().any(|l| l.contains(" alive ")), "{name}: {:?}", show(&region));
            }
        }
        table.push(format!("{name}: gpushim {:?}, libvgpu {:?}", codes[0], codes[1]));
        assert_eq!(codes[0], codes[1], "{name}\n{}", table.join("\n"));
    }
    eprintln!("{}", table.join("\n"));
}

/// HAMi-core's `shrreg-tool` (built from the same source) adopts gpushim's region: same size and
/// version, no version or limit mismatch, and the member's slot and usage are left as they were.
#[test]
fn shrreg_tool_reads_the_region() {
    let Some(h) = hami() else { return };
    let tool = h.build("shrreg-tool", &[
        "src/multiprocess/shrreg_tool.c",
        "src/log_utils.c",
        "src/multiprocess/multiprocess_memory_limit.c",
        "src/multiprocess/multiprocess_utilization_watcher.c",
    ]);
    let node = Node::new("hami-shrreg");
    let holder = node.start_holder(40 * MIB);
    let out = target_command(&tool)
        .args(["--version", "--print"])
        .env_clear()
        .env("LD_LIBRARY_PATH", sim_dir())
        .env("GPUSIM_DEVICES", "1")
        .env("LIBCUDA_LOG_LEVEL", "2")
        .env("CUDA_DEVICE_MEMORY_LIMIT", "64m")
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", &node.region)
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    assert!(text.contains("shrreg size: 2008952, version 1.2"), "{text}");
    assert!(!text.contains("different from the file's version") && !text.contains("inconsistency"), "{text}");
    let lines = node.show();
    let alive: Vec<_> = slot_lines(&lines).into_iter().filter(|l| l.contains(" alive ")).cloned().collect();
    assert_eq!(alive, vec![format!("slot pid {} hostpid 0 status 1 alive used 0:{}", holder.pid(), 40 * MIB)], "{lines:?}");
}

// ---------------------------------------------------------------------------------------------
// HAMi's variables in a real run
// ---------------------------------------------------------------------------------------------

/// A size HAMi-core would misread (`64MiB`: 64 bytes to it) is read as meant, said once;
/// `LIBCUDA_LOG_LEVEL=0` silences everything, a refusal included; `CUDA_DISABLE_CONTROL=true`
/// passes through. Each also without the shim (the physical size, nothing refused).
#[test]
fn hamis_variables_in_a_run() {
    let node = Node::new("hami-vars");
    let args = vec!["info".to_string(), format!("alloc=mem:{}", 80 * MIB)];
    for shim in [true, false] {
        let out = node.run(shim, &args).env("CUDA_DEVICE_MEMORY_LIMIT", "64MiB").run();
        out.assert_completed();
        let total = if shim { LIMIT } else { 16 << 30 };
        assert_eq!((out.u64("op1.total"), out.num("op2.rc")), (total, if shim { 2 } else { 0 }), "{}", out.dump());
        let said: Vec<_> = out.gpushim_lines().into_iter().filter(|l| l.contains("HAMi-core would read 64 bytes")).collect();
        assert_eq!(said.len(), usize::from(shim), "{}", out.dump());

        let out = node.run(shim, &args).env("CUDA_DEVICE_MEMORY_LIMIT", "64MiB").env("LIBCUDA_LOG_LEVEL", "0").run();
        out.assert_completed();
        assert_eq!(out.num("op2.rc"), if shim { 2 } else { 0 }, "{}", out.dump());
        assert_eq!(out.stderr_text(), "", "{}", out.dump());

        let out = node.run(shim, &args).env("CUDA_DISABLE_CONTROL", "true").run();
        out.assert_completed();
        assert_eq!((out.u64("op1.total"), out.num("op2.rc")), (16 << 30, 0), "{}", out.dump());
    }
}

/// Two members without the shim: both get what they ask (64 MiB passed together), so the
/// region's budget above can fail.
#[test]
fn a_holder_and_a_member_without_the_shim_pass_the_budget() {
    let node = Node::new("hami-noshim-two");
    let ready = node.dir.join("ready");
    let args = [format!("alloc=mem:{}", 48 * MIB), format!("touch={}", ready.display()), "sleep=60000".into()];
    let mut cmd = node.background(Program::Driver(DriverPath::Link), &args, &[]);
    cmd.env_remove("LD_PRELOAD");
    let _holder = start_until_ready(&mut cmd, &ready);
    let out = node.run(false, &[format!("alloc=mem:{}", 32 * MIB)]).run();
    out.assert_completed();
    assert_eq!(out.num("op1.rc"), 0, "{}", out.dump());
    assert_eq!(out.report().device(0).node_peak, Some(80 * MIB), "{}", out.dump());
}

/// A `libvgpu.so` process on gpushim's region counts gpushim's members: with 40 MiB held under
/// gpushim, HAMi-core refuses 32 MiB more of the 64 MiB and grants 16 MiB.
#[test]
fn libvgpu_counts_gpushims_members() {
    let Some(h) = hami() else { return };
    let node = Node::new("hami-mixed");
    let _holder = node.start_holder(40 * MIB);
    let out = node.run(false, &[format!("alloc=mem:{}", 32 * MIB), format!("alloc=mem:{}", 16 * MIB)]).env("LD_PRELOAD", &h.lib).run();
    out.assert_completed();
    assert_eq!((out.num("op1.rc"), out.num("op2.rc")), (2, 0), "{}", out.dump());
}

/// A member's slot follows what it holds: 40 + 16 MiB allocated, the 40 freed: 16 MiB.
#[test]
fn a_slot_follows_allocations_and_frees() {
    let node = Node::new("hami-frees");
    let holder = node.start_holder_ops(&[format!("alloc=mem:{}", 40 * MIB), format!("alloc=mem:{}", 16 * MIB), "free=1".into()]);
    let lines = node.show();
    assert_eq!(slot_lines(&lines), vec![&format!("slot pid {} hostpid 0 status 1 alive used 0:{}", holder.pid(), 16 * MIB)], "{lines:?}");
}
