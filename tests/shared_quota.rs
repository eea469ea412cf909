//! Shared quotas (`GPUSHIM_SHARED_QUOTA`) across processes on the simulated driver, whose
//! node-wide state (`GPUSIM_NODE_STATE`) records what all processes hold on each device: that
//! peak is the evidence that the budget holds across processes.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

const LIMIT: u64 = 64 * MIB;

/// A fresh state directory and node file for one test.
struct Node {
    state: PathBuf,
    node: PathBuf,
}

impl Node {
    fn new(name: &str) -> Node {
        let dir = fresh_dir(name);
        Node { state: dir.join("state"), node: dir.join("node") }
    }

    /// `p` on 1 simulated 16 GiB device, in quota `quota` (None: no quota) with a 64 MiB limit.
    fn run(&self, p: Program, quota: Option<&str>, args: &[String]) -> Run {
        let mut run = Run::program(p)
            .shim(true)
            .args(args)
            .env("GPUSIM_DEVICES", "1")
            .env("GPUSIM_MEMORY", "16GiB")
            .env("GPUSIM_NODE_STATE", &self.node)
            .env("GPUSHIM_STATE_DIR", &self.state)
            .env("GPUSHIM_MEMORY_LIMIT", LIMIT.to_string());
        if let Some(q) = quota {
            run = run.env("GPUSHIM_SHARED_QUOTA", q);
        }
        run
    }

    /// A command for `p` under the shim on this node (as `run`, with the 64 MiB limit unless
    /// `env` says otherwise), to start in the background.
    fn background(&self, p: Program, args: &[String], env: &[(&str, &str)]) -> Command {
        let mut cmd = background_program(p);
        cmd.args(args)
            .env("GPUSIM_DEVICES", "1")
            .env("GPUSIM_MEMORY", "16GiB")
            .env("GPUSIM_NODE_STATE", &self.node)
            .env("GPUSHIM_STATE_DIR", &self.state)
            .env("GPUSHIM_MEMORY_LIMIT", LIMIT.to_string());
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd
    }

    /// A new member of `quota` finds the whole budget free (`cuMemGetInfo`) and gets all of it,
    /// and the simulated driver holds nothing once it has ended.
    fn assert_all_free(&self, quota: &str) {
        let args = ["info".to_string(), format!("alloc=mem:{LIMIT}")];
        let out = self.run(Program::Driver(DriverPath::Link), Some(quota), &args).run();
        out.assert_completed();
        assert_eq!((out.u64("op1.free"), out.u64("op1.total")), (LIMIT, LIMIT), "{}", out.dump());
        assert_eq!(out.num("op2.rc"), 0, "{}", out.dump());
        assert_eq!(out.report().device(0).node_used, Some(0), "everything was given back at the end\n{}", out.dump());
    }

    /// Starts the driver-API program in the background in quota `quota` with the 64 MiB
    /// limit, holding `bytes` while it sleeps; returns once it holds them.
    fn start_holder(&self, quota: &str, bytes: u64) -> Holder {
        self.start_holder_with(&[("GPUSHIM_SHARED_QUOTA", quota)], bytes)
    }

    /// Starts the driver-API program in the background (with the 64 MiB limit unless `env`
    /// says otherwise), holding `bytes` while it sleeps; returns once it holds them.
    fn start_holder_with(&self, env: &[(&str, &str)], bytes: u64) -> Holder {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let ready = self.state.parent().unwrap().join(format!("ready-{n}"));
        let _ = std::fs::remove_file(&ready);
        let args = [format!("alloc=mem:{bytes}"), format!("touch={}", ready.display()), "sleep=60000".into()];
        start_until_ready(&mut self.background(Program::Driver(DriverPath::Link), &args, env), &ready)
    }
}

fn node_peak(out: &RunOutput) -> u64 {
    out.report().device(0).node_peak.unwrap_or_else(|| panic!("no node figures in the simulator's report\n{}", out.dump()))
}

fn kill(holder: Holder) {
    drop(holder);
}

/// 4 processes × 4 threads allocating and freeing at random (up to 4 × 8 MiB held per thread)
/// under one 64 MiB quota: the simulated driver never holds more than 64 MiB for all of them
/// together, and some requests are refused. With per-process limits instead (no quota) the
/// same processes together go far above 64 MiB, so the check can fail.
#[test]
fn four_processes_racing_stay_within_one_quota() {
    for quota in [Some("race"), None] {
        let node = Node::new(if quota.is_some() { "quota-race" } else { "quota-race-none" });
        let args: Vec<String> = ["4", "3000", &(8 * MIB).to_string(), "4"].iter().map(|s| s.to_string()).collect();
        let runs: Vec<_> = (0..4)
            .map(|_| {
                let run = node.run(Program::Race, quota, &args);
                std::thread::spawn(move || run.run())
            })
            .collect();
        let outs: Vec<RunOutput> = runs.into_iter().map(|t| t.join().unwrap()).collect();
        let mut refusals = 0;
        let mut peak = 0;
        for out in &outs {
            assert!(out.status.success(), "{}", out.dump());
            assert_eq!(out.num("errors"), 0, "{}", out.dump());
            assert_eq!(out.num("free_errors"), 0, "{}", out.dump());
            refusals += out.num("refusals");
            peak = peak.max(node_peak(out));
        }
        let dump = outs.iter().map(|o| o.dump()).collect::<Vec<_>>().join("\n");
        if quota.is_some() {
            assert!(peak <= LIMIT, "node peak {peak} above the quota's {LIMIT}\n{dump}");
            assert!(peak > LIMIT / 2, "the processes did contend for the quota (peak {peak})\n{dump}");
            assert!(refusals > 0, "{dump}");
        } else {
            assert!(peak > LIMIT, "without a quota the processes together pass {LIMIT} (peak {peak})\n{dump}");
        }
    }
}

/// 4 processes racing under one quota, one of them (racing until it is killed, so no timing
/// decides the outcome) killed with SIGKILL once it holds memory (at whatever instruction it is): the other 3 finish without an error (nobody hangs on what the victim
/// left), and afterwards a new member finds the whole budget free, gets all of it, and the
/// simulated driver holds nothing. (The node's peak is not checked here: the quota hands the
/// victim's budget on as soon as the kernel drops its lock, and the simulated driver frees the
/// victim's memory only at its own next reclaim, so for a while the node counts both; a real
/// driver frees a dead process' memory during its exit. The race without a kill checks it.)
#[test]
fn a_member_killed_mid_race_is_reclaimed_and_the_others_finish() {
    let node = Node::new("quota-kill-race");
    let args = |iterations: &str| -> Vec<String> { ["4", iterations, &(8 * MIB).to_string(), "4"].iter().map(|s| s.to_string()).collect() };
    let start = |iterations: &str| {
        node.background(Program::Race, &args(iterations), &[("GPUSHIM_SHARED_QUOTA", "kr")])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start a racer")
    };
    // the victim races until it is killed (`-1`); it is killed once it says it holds memory
    let mut victim = start("-1");
    let racers: Vec<Child> = (0..3).map(|_| start("40000")).collect();
    use std::io::BufRead;
    let mut lines = std::io::BufReader::new(victim.stdout.take().unwrap()).lines();
    let seen: Vec<String> = lines.by_ref().map_while(Result::ok).take_while(|l| l != "racing=1").collect();
    let _ = victim.kill(); // SIGKILL, mid-race
    let killed = victim.wait_with_output().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(killed.status.signal(), Some(9), "the victim stopped before it was killed\n{seen:?}\n{killed:?}");
    for r in racers {
        let out = r.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{out:?}");
        for bad in ["errors=0", "free_errors=0"] {
            assert!(text.lines().any(|l| l == bad), "{bad} missing\n{text}");
        }
    }
    node.assert_all_free("kr");
}

/// A member killed with SIGKILL while holding 48 MiB: the next member sees all 64 MiB free
/// (cuMemGetInfo) and gets them. While the holder lives, the same request is refused.
#[test]
fn a_killed_member_is_reclaimed() {
    let node = Node::new("quota-kill");
    let holder = node.start_holder("kill", 48 * MIB);
    let args = vec!["info".to_string(), format!("alloc=mem:{LIMIT}"), format!("alloc=mem:{}", 16 * MIB)];
    let out = node.run(Program::Driver(DriverPath::Link), Some("kill"), &args).run();
    out.assert_completed();
    assert_eq!((out.u64("op1.free"), out.u64("op1.total")), (16 * MIB, LIMIT), "{}", out.dump());
    assert_eq!((out.num("op2.rc"), out.num("op3.rc")), (2, 0), "{}", out.dump());

    kill(holder);
    node.assert_all_free("kill");
}

/// Different names are different budgets; the same name is one.
#[test]
fn quotas_are_isolated_by_name() {
    let node = Node::new("quota-names");
    let holder = node.start_holder("x", 48 * MIB);
    let big = vec![format!("alloc=mem:{}", 32 * MIB)];
    let other = node.run(Program::Driver(DriverPath::Link), Some("y"), &big).run();
    let same = node.run(Program::Driver(DriverPath::Link), Some("x"), &big).run();
    let none = node.run(Program::Driver(DriverPath::Link), None, &big).run();
    kill(holder);
    for (out, rc) in [(&other, 0), (&same, 2), (&none, 0)] {
        out.assert_completed();
        assert_eq!(out.num("op1.rc"), rc, "{}", out.dump());
    }
}

/// The state directory must be the user's alone: one open to others is refused (CUDA fails
/// to initialise, with a message naming the setting); what gpushim creates is 0700 / 0600.
#[test]
fn state_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let node = Node::new("quota-private");
    let out = node.run(Program::Driver(DriverPath::Link), Some("p"), &["alloc=mem:1024".to_string()]).run();
    out.assert_completed();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&node.state), 0o700);
    assert_eq!(mode(&node.state.join("quota-p")), 0o600);

    std::fs::set_permissions(&node.state, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = node.run(Program::Driver(DriverPath::Link), Some("p"), &["alloc=mem:1024".to_string()]).run();
    assert_ne!(out.num("init.rc"), 0, "{}", out.dump());
    let lines = out.gpushim_lines();
    assert!(
        lines.iter().any(|l| l.starts_with("gpushim: GPUSHIM_SHARED_QUOTA=\"p\": ") && l.contains("open to other users")),
        "{}",
        out.dump()
    );
}

/// The exit report and NVML show the quota: NVML's used is what all members hold; the report
/// has the quota's name and peak.
#[test]
fn report_and_nvml_show_the_quota() {
    let node = Node::new("quota-report");
    let holder = node.start_holder("r", 40 * MIB);
    let report = node.state.parent().unwrap().join("report.json");
    let out = node
        .run(Program::Driver(DriverPath::Link), Some("r"), &[format!("alloc=mem:{}", 8 * MIB)])
        .env("GPUSHIM_REPORT", &report)
        .run();
    out.assert_completed();
    let text = std::fs::read_to_string(&report).unwrap();
    assert!(text.contains("\"shared_quota\":\"r\",\"quota_peak_reserved\":50331648"), "{text}");

    nvml_sim_library();
    let nvml = node.run(Program::Nvml(NvmlPath::Dlopen), Some("r"), &["list".to_string()]).run();
    kill(holder);
    assert!(nvml.status.success(), "{}", nvml.dump());
    assert_eq!(nvml.u64("idx0.total"), LIMIT, "{}", nvml.dump());
    assert_eq!(nvml.u64("idx0.used"), 40 * MIB, "{}", nvml.dump());
    assert_eq!(nvml.u64("idx0.free"), LIMIT - 40 * MIB, "{}", nvml.dump());
}

/// `GPUSHIM_MEMORY_LIMIT=40%` for three processes of one user on one GPU promises 120% of it:
/// the third to start says so in one line with the numbers (the other two are found in the
/// user's registry of limited processes); two of them (80%) say nothing. Between shared quotas
/// it is their budgets that add up: two quotas of 10 GiB on the 16 GiB device are too many,
/// two members of one quota are not.
#[test]
fn oversubscription_is_warned_about_once_with_numbers() {
    let node = Node::new("quota-oversub");
    let device = 16 * GIB;
    let probe = |node: &Node, env: &[(&str, &str)]| {
        let out = node.run(Program::Driver(DriverPath::Link), None, &["info".into(), "info".into()]).envs(env).run();
        out.assert_completed();
        out
    };
    let warned = |out: &RunOutput| out.gpushim_lines_with("oversubscribed");
    let forty = [("GPUSHIM_MEMORY_LIMIT", "40%")];

    let a = node.start_holder_with(&forty, MIB);
    let two = probe(&node, &forty);
    assert!(warned(&two).is_empty(), "{}", two.dump());
    let limit = two.u64("op1.total");
    assert_eq!(limit, device * 2 / 5, "{}", two.dump());

    let b = node.start_holder_with(&forty, MIB);
    let three = probe(&node, &forty);
    let lines = warned(&three);
    assert_eq!(lines.len(), 1, "one line, however often the device is asked about\n{}", three.dump());
    let line = &lines[0];
    for expected in [
        format!("add up to {} bytes", 3 * limit),
        format!("more than its {device} bytes"),
        format!("pid {}", a.pid()),
        format!("pid {}", b.pid()),
        format!(": {limit}"),
    ] {
        assert!(line.contains(&expected), "{expected:?} missing from {line}");
    }
    assert_eq!(line.matches("pid ").count(), 3, "{line}");
    // the same third process without a limit promises nothing and is not warned
    let unlimited = probe(&node, &[("GPUSHIM_MEMORY_LIMIT", "unlimited")]);
    assert!(warned(&unlimited).is_empty(), "{}", unlimited.dump());
    drop((a, b));

    // quotas: their budgets add up, not their members' limits
    let node = Node::new("quota-oversub-q");
    let ten = "10GiB";
    let _a = node.start_holder_with(&[("GPUSHIM_SHARED_QUOTA", "a"), ("GPUSHIM_MEMORY_LIMIT", ten)], MIB);
    let same = probe(&node, &[("GPUSHIM_SHARED_QUOTA", "a"), ("GPUSHIM_MEMORY_LIMIT", ten)]);
    assert!(warned(&same).is_empty(), "{}", same.dump());
    let other = probe(&node, &[("GPUSHIM_SHARED_QUOTA", "b"), ("GPUSHIM_MEMORY_LIMIT", ten)]);
    let lines = warned(&other);
    assert_eq!(lines.len(), 1, "{}", other.dump());
    assert!(
        lines[0].contains(&format!("add up to {} bytes (shared quota a: {}, shared quota b: {})", 20 * GIB, 10 * GIB, 10 * GIB)),
        "{}",
        lines[0]
    );
}

/// Another user shares nothing: this user's state directory is refused to them (CUDA does not
/// initialise, and the message says why), and the same quota name in their own directory is
/// another budget. Needs root, to start a process as another user.
#[test]
fn another_user_is_isolated() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("another_user_is_isolated: skipped (needs root to run a process as another user)");
        return;
    }
    const NOBODY: u32 = 65534;
    let node = Node::new("quota-user");
    let _holder = node.start_holder("u", 48 * MIB);
    // the other user's run: everything it reads must be reachable to it
    let theirs = node.state.parent().unwrap().join("their-state");
    std::fs::create_dir_all(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(NOBODY), Some(NOBODY)).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).unwrap();
    let make_reachable = |p: &Path| {
        let mut d = Some(p);
        while let Some(dir) = d {
            if let Ok(m) = std::fs::metadata(dir) {
                if m.is_dir() && m.permissions().mode() & 0o001 == 0 {
                    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(m.permissions().mode() | 0o011));
                }
            }
            d = dir.parent();
        }
    };
    for p in [node.state.parent().unwrap().to_path_buf(), sim_dir(), program(Program::Driver(DriverPath::Link)), shim_path()] {
        make_reachable(&p);
    }
    let as_them = |state: &Path| {
        Run::program(Program::Driver(DriverPath::Link))
            .shim(true)
            .as_user(NOBODY)
            .args([format!("alloc=mem:{}", 32 * MIB)])
            .env("GPUSIM_DEVICES", "1")
            .env("GPUSIM_MEMORY", "16GiB")
            .env("GPUSHIM_MEMORY_LIMIT", LIMIT.to_string())
            .env("GPUSHIM_SHARED_QUOTA", "u")
            .env("GPUSHIM_STATE_DIR", state)
            .run()
    };
    let refused = as_them(&node.state);
    assert_ne!(refused.num("init.rc"), 0, "{}", refused.dump());
    assert!(
        refused.gpushim_lines().iter().any(|l| l.starts_with("gpushim: GPUSHIM_SHARED_QUOTA=\"u\": ") && l.contains(&format!("belongs to uid 0, not to this user (uid {NOBODY})"))),
        "{}",
        refused.dump()
    );
    // in their own directory, "u" is a budget of their own: 32 MiB fit although this user's
    // "u" holds 48 of its 64 MiB
    let own = as_them(&theirs);
    own.assert_completed();
    assert_eq!(own.num("op1.rc"), 0, "{}", own.dump());
    let mode = std::fs::metadata(theirs.join("quota-u")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!((mode.uid(), mode.mode() & 0o777), (NOBODY, 0o600));
}

/// `gpushim ps` lists a quota's devices and members (a killed member until it is reclaimed)
/// and the processes with limits of their own, read from the same state directory.
#[test]
fn ps_lists_quotas_and_members() {
    if skip_emulated("names processes by their comm, which is the emulator's (qemu-aarch64-st) under qemu-user") {
        return;
    }
    let node = Node::new("quota-ps");
    let ps = || {
        let out = target_command(env!("CARGO_BIN_EXE_gpushim"))
            .arg("ps")
            .env_remove("GPUSHIM_CONFIG")
            .env("GPUSHIM_STATE_DIR", &node.state)
            .output()
            .expect("run gpushim ps");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(ps(), format!("nothing runs under gpushim: no process and no shared quota in {}\n", node.state.display()));
    let a = node.start_holder("job", 48 * MIB);
    let b = node.start_holder("job", 8 * MIB);
    let solo = node.start_holder_with(&[("GPUSHIM_MEMORY_LIMIT", "1GiB")], MIB);
    let text = ps();
    let quota_file = node.state.join("quota-job");
    assert!(text.contains(&format!("shared quota job ({}): 2 processes\n", quota_file.display())), "{text}");
    assert!(text.contains(": 56 MiB held (peak 56 MiB), limit 64 MiB, device memory 16 GiB\n"), "{text}");
    assert!(text.contains(&format!("  pid {} drvapi", a.pid())) && text.contains(" 48 MiB of 64 MiB\n"), "{text}");
    assert!(text.contains(&format!("  pid {} drvapi", b.pid())) && text.contains(" 8 MiB of 64 MiB\n"), "{text}");
    assert!(text.contains("processes with limits of their own ("), "{text}");
    assert!(text.contains(&format!("  pid {} drvapi", solo.pid())) && text.contains(" limit 1 GiB\n"), "{text}");

    // a killed member stays listed, marked, until another member reclaims its memory
    let dead = a.pid();
    kill(a);
    let text = ps();
    assert!(text.contains("shared quota job (") && text.contains("): 1 processes\n"), "{text}");
    assert!(text.contains(&format!("  pid {dead} drvapi")) && text.contains("(exited: given back when another process next needs room)"), "{text}");
    let probe = node.run(Program::Driver(DriverPath::Link), Some("job"), &["info".to_string()]).run();
    probe.assert_completed();
    assert_eq!(probe.u64("op1.free"), LIMIT - 8 * MIB, "{}", probe.dump());
    let text = ps();
    assert!(!text.contains(&format!("pid {dead} ")), "{text}");
    assert!(text.contains(": 8 MiB held (peak 56 MiB)"), "{text}");
    drop((b, solo));
}

/// A child made without `fork()` runs no fork handler but inherits the exit handlers: a raw
/// `clone` (SIGCHLD, no CLONE_VM), glibc's `_Fork`, `vfork` and `clone` with CLONE_VM, each
/// calling `exit(0)` (`tests/c/forkq.c`). The parent, in a quota of 1 GiB (its limit), holds
/// 600 MiB; after the child's exit the quota's file still shows them as the parent's
/// (`gpushim ps`, the parent paused) and the parent's published file is still there. Then, for
/// the children that leave the parent its exit handlers and its thread's state (raw `clone`,
/// `_Fork`): the quota still counts the 600 MiB (cuMemGetInfo's free is the quota's: 424 MiB),
/// 300 MiB fit once, not twice, and only the parent writes a report (GPUSHIM_REPORT to stderr);
/// without the shim both 300 MiB pass. (`vfork` and CLONE_VM children calling `exit` run the
/// parent's exit handlers and thread-local destructors in its memory: the simulated driver's
/// context stack among them, so the parent's later calls fail, with or without the shim.)
/// Before: the child's exit left the parent's place, the quota counted nothing, the parent got
/// the whole quota again, and the raw clone's and `_Fork`'s child wrote a report.
#[test]
fn a_child_made_without_fork_leaves_its_parents_place_alone() {
    if skip_emulated("names processes by their comm, which is the emulator's (qemu-aarch64-st) under qemu-user") {
        return;
    }
    const P: u64 = 600 * MIB;
    const C: u64 = 300 * MIB;
    for mode in ["clone", "_Fork", "vfork", "clonevm"] {
        let keeps_thread = matches!(mode, "clone" | "_Fork");
        for shim in if keeps_thread { vec![false, true] } else { vec![true] } {
            let dir = fresh_dir("nofork");
            let (state, pause) = (dir.join("state"), dir.join("pause"));
            let run = Run::program(Program::ForkQuota)
                .shim(shim)
                .env("GPUSIM_DEVICES", "1")
                .env("GPUSIM_MEMORY", "16GiB")
                .env("GPUSHIM_MEMORY_LIMIT", "1GiB")
                .env("GPUSHIM_SHARED_QUOTA", "noforkq")
                .env("GPUSHIM_STATE_DIR", &state)
                .env("GPUSHIM_REPORT", "stderr")
                .args([mode, &P.to_string(), &C.to_string()])
                .arg(&pause);
            let program = std::thread::spawn(move || run.run());
            let start = Instant::now();
            while !pause.exists() && !program.is_finished() && start.elapsed() < Duration::from_secs(60) {
                std::thread::sleep(Duration::from_millis(10));
            }
            let ps = target_command(env!("CARGO_BIN_EXE_gpushim")).arg("ps").env_remove("GPUSHIM_CONFIG").env("GPUSHIM_STATE_DIR", &state).output().unwrap();
            let _ = std::fs::remove_file(&pause);
            let out = program.join().unwrap();
            out.assert_completed();
            assert_eq!((out.num("parent.rc"), out.num("child.status")), (0, 0), "{mode}\n{}", out.dump());
            let ps = String::from_utf8_lossy(&ps.stdout).into_owned();
            let parent = out.num("parent.pid");
            if shim {
                let uuid = phys_uuid(0);
                let want = [
                    format!("pid {parent} forkq (root, shared quota noforkq): 1 devices"),
                    format!("  {uuid}: 600 MiB held (peak 600 MiB), limit 1 GiB, device memory 16 GiB\n  pid {parent} forkq: {uuid} 600 MiB of 1 GiB\n"),
                ];
                for w in want {
                    assert!(ps.contains(&w), "{mode}: the parent's figures after the child's exit: {w:?} in\n{ps}\n{}", out.dump());
                }
            }
            if !keeps_thread {
                continue;
            }
            let total = if shim { GIB } else { 16 * GIB };
            assert_eq!(out.u64("before.free"), total - P, "{mode}, shim {shim}: the parent's 600 MiB still counted\n{}", out.dump());
            let want = if shim { [0, OOM] } else { [0, 0] };
            assert_eq!([out.num("after.rc1"), out.num("after.rc2")], want, "{mode}, shim {shim}\n{}", out.dump());
            let held = if shim { P + C } else { P + 2 * C };
            assert_eq!(out.u64("after.free"), total - held, "{mode}, shim {shim}\n{}", out.dump());
            let reports: Vec<String> = out.stderr_text().lines().filter(|l| l.starts_with("gpushim report (pid ")).map(str::to_string).collect();
            let parents = if shim { vec![format!("gpushim report (pid {parent}):")] } else { vec![] };
            assert_eq!(reports, parents, "{mode}, shim {shim}: the parent's report only\n{}", out.dump());
        }
    }
}
