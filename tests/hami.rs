//! HAMi-core drop-in: HAMi's variables and its shared region file (`CUDA_DEVICE_MEMORY_SHARED_CACHE`)
//! across processes on the simulated driver, read back by `gpushim ps --hami` (always) and by
//! HAMi-core's own `shrreg-tool` and test programs (only where `GPUSHIM_HAMI_SRC` names
//! HAMi-core's source at commit 8f3a89c and `GPUSHIM_HAMI_LIB` its built `libvgpu.so`; skipped
//! with a printed reason otherwise: CI cannot fetch them).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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
        let mut cmd = Command::new(program(p));
        cmd.args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("LD_LIBRARY_PATH", sim_dir())
            .env("LD_PRELOAD", shim_path());
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
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let ready = self.dir.join(format!("ready-{n}"));
        let args = [format!("alloc=mem:{bytes}"), format!("touch={}", ready.display()), "sleep=60000".into()];
        let mut cmd = self.background(Program::Driver(DriverPath::Link), &args, &[]);
        let child = Holder(cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("start the holder"));
        let deadline = Instant::now() + Duration::from_secs(20);
        while !ready.exists() {
            assert!(Instant::now() < deadline, "the holder never got ready");
            std::thread::sleep(Duration::from_millis(10));
        }
        child
    }

    /// `gpushim ps --hami` on the region: its lines.
    fn show(&self) -> Vec<String> {
        show(&self.region)
    }
}

fn show(region: &Path) -> Vec<String> {
    let out = Command::new(profile_dir().join("gpushim"))
        .args(["ps", "--hami"])
        .arg(region)
        .output()
        .expect("run gpushim ps --hami");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
}

struct Holder(Child);

impl Holder {
    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
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

/// `n` processes × 4 threads racing on one region (64 MiB): the simulated driver never holds more
/// than 64 MiB for all of them; with `GPUSHIM_MEMORY_LIMIT` alone (no region) they pass it.
fn racing(n: usize) {
    for hami in [true, false] {
        let node = Node::new(&format!("hami-race-{n}-{hami}"));
        let args: Vec<String> = ["4", "1500", &(8 * MIB).to_string(), "4"].iter().map(|s| s.to_string()).collect();
        let kids: Vec<Child> = (0..n)
            .map(|_| {
                let mut cmd = node.background(Program::Race, &args, &[]);
                if !hami {
                    cmd.env_remove("CUDA_DEVICE_MEMORY_LIMIT").env_remove("CUDA_DEVICE_MEMORY_SHARED_CACHE").env("GPUSHIM_MEMORY_LIMIT", "64MiB");
                }
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
        if hami {
            assert!(peak <= LIMIT, "{n} processes: node peak {peak} above the region's {LIMIT}");
            assert!(peak > LIMIT / 2 && refusals > 0, "they contended (peak {peak}, {refusals} refusals)");
            assert!(slot_lines(&node.show()).is_empty(), "every member left");
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
