//! Waiting instead of failing (`GPUSHIM_OOM_WAIT`): processes sharing a quota on the simulated
//! driver, whose node-wide state (`GPUSIM_NODE_STATE`) records what all of them hold on the
//! device at once (the peak: the budget held). Times are the processes' own (`stamp`: the
//! machine's monotonic clock, in ms), so a loaded machine moves them together; tolerances
//! are generous (2 loaded cores) but each bound separates waiting from not waiting.

mod common;
mod observe;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;

const LIMIT: u64 = 64 * MIB;

struct Node {
    dir: PathBuf,
    state: PathBuf,
    node: PathBuf,
}

impl Node {
    fn new(name: &str) -> Node {
        let dir = fresh_dir(name);
        Node { state: dir.join("state"), node: dir.join("node"), dir }
    }

    /// A file of this test's directory (a marker between processes).
    fn mark(&self, name: &str) -> String {
        format!("{}", self.dir.join(name).display())
    }

    /// The driver-API program running `ops` on 1 simulated 16 GiB device, under the shim
    /// (`shim`), waiting `wait` (`None`: GPUSHIM_OOM_WAIT unset); no limit yet.
    fn program(&self, shim: bool, wait: Option<&str>, ops: &[String]) -> Run {
        let mut run = Run::program(Program::Driver(DriverPath::Link))
            .shim(shim)
            .args(ops)
            .env("GPUSIM_DEVICES", "1")
            .env("GPUSIM_MEMORY", "16GiB")
            .env("GPUSIM_NODE_STATE", &self.node)
            .env("GPUSHIM_STATE_DIR", &self.state)
            .env("GPUSHIM_LOG", "info");
        if let Some(w) = wait {
            run = run.env("GPUSHIM_OOM_WAIT", w);
        }
        run
    }

    /// `program` with a 64 MiB limit, in quota `q`, with the exit report on stderr.
    fn run(&self, shim: bool, wait: Option<&str>, ops: &[String]) -> Run {
        self.program(shim, wait, ops)
            .env("GPUSHIM_MEMORY_LIMIT", LIMIT.to_string())
            .env("GPUSHIM_SHARED_QUOTA", "q")
            .env("GPUSHIM_REPORT", "stderr")
    }

    /// `program` under the shim configured through HAMi's variables: a 64 MiB limit per
    /// process and the budget shared through the region file `region`.
    fn run_hami(&self, wait: Option<&str>, region: &std::path::Path, ops: &[String]) -> Run {
        self.program(true, wait, ops)
            .env("CUDA_DEVICE_MEMORY_LIMIT", "64m")
            .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", region)
    }

    /// A holder in the background: `ops`, then `touch=ready`, then a long sleep; killed with
    /// SIGKILL when dropped. Returns once it is ready.
    fn holder(&self, ops: &[String]) -> Holder {
        let ready = self.dir.join("holder-ready");
        let mut cmd = background_program(Program::Driver(DriverPath::Link));
        cmd.args(ops)
            .arg(format!("touch={}", ready.display()))
            .arg("sleep=60000")
            .env("GPUSIM_DEVICES", "1")
            .env("GPUSIM_MEMORY", "16GiB")
            .env("GPUSIM_NODE_STATE", &self.node)
            .env("GPUSHIM_STATE_DIR", &self.state)
            .env("GPUSHIM_MEMORY_LIMIT", LIMIT.to_string())
            .env("GPUSHIM_SHARED_QUOTA", "q");
        start_until_ready(&mut cmd, &ready)
    }
}

fn ops(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// Runs each in a thread of its own, all at once; their outputs in order.
fn together(runs: Vec<Run>) -> Vec<RunOutput> {
    let threads: Vec<_> = runs.into_iter().map(|r| std::thread::spawn(move || r.run())).collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

fn ms(out: &RunOutput, op: usize) -> i64 {
    out.num(&format!("op{op}.ms"))
}

fn rc(out: &RunOutput, op: usize) -> i64 {
    out.num(&format!("op{op}.rc"))
}

fn node_peak(out: &RunOutput) -> u64 {
    out.report().device(0).node_peak.unwrap_or_else(|| panic!("no node figures\n{}", out.dump()))
}

/// A holds 48 MiB for ~1.5 s, then frees; B asks for 32 MiB meanwhile (80 MiB in all: the quota
/// refuses it while B is under its own 64 MiB limit). With GPUSHIM_OOM_WAIT B succeeds once A
/// freed, after about A's hold; without it B is refused at once; without the shim both get
/// their memory at once (80 MiB on the node: the check can fail).
#[test]
fn a_waiter_proceeds_when_another_member_frees() {
    for (shim, wait) in [(true, Some("20s")), (true, None), (false, Some("20s"))] {
        let node = Node::new(&format!("oomwait-frees-{shim}-{}", wait.is_some()));
        let (ready, done) = (node.mark("a-ready"), node.mark("b-done"));
        let a = ops(&["alloc=mem:50331648", &format!("touch={ready}"), "sleep=1500", "stamp", "free=1", &format!("waitfor={done}")]);
        let b = ops(&[&format!("waitfor={ready}"), "stamp", "alloc=mem:33554432", "stamp", &format!("touch={done}")]);
        let outs = together(vec![node.run(shim, wait, &a), node.run(shim, wait, &b)]);
        let (a, b) = (&outs[0], &outs[1]);
        a.assert_completed();
        b.assert_completed();
        let (freed, asked, answered) = (ms(a, 4), ms(b, 2), ms(b, 4));
        let what = format!("B asked at {asked}, A freed at {freed}, B answered at {answered}\n{}\n{}", a.dump(), b.dump());
        match (shim, wait) {
            (true, Some(_)) => {
                assert_eq!(rc(b, 3), 0, "B waits, then gets its memory: {what}");
                assert!(answered >= freed, "B got its memory only once A freed: {what}");
                assert!(answered - freed < 1000, "B was woken promptly by A's free: {what}");
                assert!(answered - asked >= 700, "B waited about A's hold (1.5 s): {what}");
                assert!(b.stderr_text().contains("1 allocations waited"), "the exit report counts the wait: {what}");
                assert!(node_peak(b) <= LIMIT, "the quota held on the node: {what}");
            }
            (true, None) => {
                assert_eq!(rc(b, 3), OOM, "without GPUSHIM_OOM_WAIT, refused: {what}");
                assert!(answered - asked < 1000, "at once: {what}");
                assert!(!b.stderr_text().contains("allocations waited"), "no wait in the report: {what}");
            }
            (false, _) => {
                assert_eq!(rc(b, 3), 0, "without the shim nothing limits B: {what}");
                assert!(answered < freed, "B did not wait for A: {what}");
                assert_eq!(node_peak(b), 80 * MIB, "without the shim both held their memory at once: {what}");
            }
        }
    }
}

/// Every allocation path refused for the quota waits: pitched, managed, stream-ordered, VMM,
/// arrays, and `cuMemAlloc` served from a `grow` reserve (whose chunk waits). A holder frees
/// 48 MiB after 1 s; each request of 32 MiB gets its memory after waiting for it.
#[test]
fn every_allocation_path_waits() {
    for (api, mode) in [("pitch", "passthrough"), ("managed", "passthrough"), ("async", "passthrough"), ("vmm", "passthrough"), ("array", "passthrough"), ("mipmap", "passthrough"), ("mem", "grow")] {
        let node = Node::new(&format!("oomwait-path-{api}-{mode}"));
        let (ready, done) = (node.mark("a-ready"), node.mark("b-done"));
        let a = ops(&["alloc=mem:50331648", &format!("touch={ready}"), "sleep=1000", "free=1", &format!("waitfor={done}")]);
        let b = ops(&[&format!("waitfor={ready}"), "stamp", &format!("alloc={api}:33554432"), "stamp", &format!("touch={done}")]);
        let outs = together(vec![node.run(true, Some("20s"), &a), node.run(true, Some("20s"), &b).env("GPUSHIM_MEMORY_MODE", mode)]);
        let (a, b) = (&outs[0], &outs[1]);
        let what = format!("{api} ({mode})\n{}\n{}", a.dump(), b.dump());
        a.assert_completed();
        b.assert_completed();
        assert_eq!(rc(b, 3), 0, "{what}");
        assert!(ms(b, 4) - ms(b, 2) >= 500, "it waited for the free: {what}");
        assert!(b.stderr_text().contains("1 allocations waited"), "{what}");
        assert!(node_peak(b) <= LIMIT, "{what}");
    }
}

/// Nobody frees: the waiter fails with out-of-memory at its deadline (1.5 s), not before and
/// not much after; `gpushim metrics` counts the wait and its time meanwhile.
#[test]
fn a_waiter_times_out_at_its_deadline_and_is_counted() {
    let node = Node::new("oomwait-timeout");
    let _a = node.holder(&ops(&["alloc=mem:50331648"]));
    let (done, seen) = (node.mark("b-done"), node.mark("metrics-seen"));
    let b = ops(&["stamp", "alloc=mem:33554432", "stamp", &format!("touch={done}"), &format!("waitfor={seen}")]);
    let run = node.run(true, Some("1500ms"), &b);
    let t = std::thread::spawn(move || run.run());
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::path::Path::new(&done).exists() {
        assert!(Instant::now() < deadline, "B never finished its allocation");
        std::thread::sleep(Duration::from_millis(10));
    }
    let obs = observe::Node { dir: node.dir.clone(), state: node.state.clone() };
    let text = obs.gpushim(&["metrics", "--no-gpus"]).stdout_text();
    std::fs::write(&seen, "").unwrap();
    let b = t.join().unwrap();
    b.assert_completed();
    let waited = ms(&b, 3) - ms(&b, 1);
    assert_eq!(rc(&b, 2), OOM, "refused at the deadline\n{}", b.dump());
    assert!((1400..5000).contains(&waited), "refused after about 1.5 s, not {waited} ms\n{}", b.dump());
    let s = observe::parse_exposition(&text);
    let pid = b.stdout_text().lines().find_map(|l| l.strip_prefix("pid=").map(str::to_string));
    let at: Vec<(&str, &str)> = vec![("device", "0")];
    let waits: Vec<&observe::Sample> = s.iter().filter(|x| x.name == "gpushim_memory_waits_total" && x.value == 1.0).collect();
    assert_eq!(waits.len(), 1, "one process waited once ({pid:?})\n{text}");
    let who = &waits[0].labels["pid"];
    let secs = observe::value(&s, "gpushim_memory_wait_seconds_total", &[("pid", who.as_str()), at[0]]);
    assert!((1.4..5.0).contains(&secs), "the wait's time: {secs}\n{text}");
    assert!(b.stderr_text().contains("1 allocations waited"), "{}", b.dump());
    assert!(node_peak(&b) <= LIMIT, "{}", b.dump());
}

/// A holds 40 MiB, B 20 MiB; then both ask for 16 MiB more (each under its own limit, the
/// quota full): every member waits, so B, the newest waiter, is refused at once; it then frees
/// its 20 MiB and A, still waiting, gets its 16 MiB. Without GPUSHIM_OOM_WAIT A is refused at
/// once.
#[test]
fn when_every_member_waits_the_newest_fails_at_once() {
    for wait in [Some("20s"), None] {
        let node = Node::new(&format!("oomwait-all-{}", wait.is_some()));
        let (a1, b1) = (node.mark("a1"), node.mark("b1"));
        let a = ops(&["alloc=mem:41943040", &format!("touch={a1}"), &format!("waitfor={b1}"), "stamp", "alloc=mem:16777216", "stamp"]);
        let b = ops(&[&format!("waitfor={a1}"), "alloc=mem:20971520", &format!("touch={b1}"), "sleep=700", "stamp", "alloc=mem:16777216", "stamp", "free=2", "sleep=300"]);
        let outs = together(vec![node.run(true, wait, &a), node.run(true, wait, &b)]);
        let (a, b) = (&outs[0], &outs[1]);
        a.assert_completed();
        b.assert_completed();
        let what = format!("{}\n{}", a.dump(), b.dump());
        // (without GPUSHIM_OOM_WAIT, A was refused and has ended by then: B gets its memory)
        assert!(ms(b, 7) - ms(b, 5) < 1000, "B's answer came at once, not at its deadline: {what}");
        if wait.is_some() {
            assert_eq!(rc(b, 6), OOM, "B is refused: {what}");
            assert_eq!(rc(a, 5), 0, "A got its memory once B freed: {what}");
            assert!(ms(a, 6) >= ms(b, 7), "after B's refusal and free: {what}");
            assert!(ms(a, 6) - ms(b, 7) < 1500, "promptly: {what}");
        } else {
            assert_eq!(rc(a, 5), OOM, "{what}");
            assert!(ms(a, 6) - ms(a, 4) < 1000, "{what}");
        }
        assert!(node_peak(a) <= LIMIT, "{what}");
    }
}

/// A process refused by its own limit never waits, GPUSHIM_OOM_WAIT or not: 48 + 32 MiB is
/// beyond its own 64 MiB. The next request, 16 MiB (64 MiB of its own, but 8 MiB more held by
/// another member), is the quota's refusal: that one waits its 1 s.
#[test]
fn a_process_refused_by_its_own_limit_fails_at_once() {
    let node = Node::new("oomwait-own");
    let _other = node.holder(&ops(&["alloc=mem:8388608"]));
    let a = ops(&["stamp", "alloc=mem:50331648", "stamp", "alloc=mem:33554432", "stamp", "alloc=mem:16777216", "stamp"]);
    let out = node.run(true, Some("1s"), &a).run();
    out.assert_completed();
    assert_eq!(rc(&out, 2), 0, "{}", out.dump());
    assert_eq!(rc(&out, 4), OOM, "{}", out.dump());
    assert!(ms(&out, 5) - ms(&out, 3) < 500, "its own limit: refused at once\n{}", out.dump());
    assert_eq!(rc(&out, 6), OOM, "{}", out.dump());
    let waited = ms(&out, 7) - ms(&out, 5);
    assert!((900..4000).contains(&waited), "the quota's refusal waited about 1 s, not {waited} ms\n{}", out.dump());
    assert!(out.stderr_text().contains("1 allocations waited"), "{}", out.dump());
}

/// A member killed with SIGKILL while holding 48 MiB: its memory goes to the waiter within a
/// bounded time (the next try after the kill, at most 100 ms later, reclaims it). Without
/// GPUSHIM_OOM_WAIT the request is refused at once.
#[test]
fn a_killed_holders_memory_goes_to_the_waiter() {
    for wait in [Some("20s"), None] {
        let node = Node::new(&format!("oomwait-kill-{}", wait.is_some()));
        let holder = node.holder(&ops(&["alloc=mem:50331648"]));
        let run = node.run(true, wait, &ops(&["stamp", "alloc=mem:33554432", "stamp"]));
        let t = std::thread::spawn(move || run.run());
        std::thread::sleep(Duration::from_millis(1500));
        if wait.is_some() {
            // (`gpushim ps` says so while it waits)
            let ps = observe::Node { dir: node.dir.clone(), state: node.state.clone() }.gpushim(&["ps"]).stdout_text();
            assert!(ps.contains(": 2 processes, 1 allocations waiting for room"), "{ps}");
        }
        let killed = Instant::now();
        drop(holder); // SIGKILL
        let out = t.join().unwrap();
        out.assert_completed();
        let waited = ms(&out, 3) - ms(&out, 1);
        if wait.is_some() {
            assert_eq!(rc(&out, 2), 0, "{}", out.dump());
            assert!(waited >= 700, "it waited for the kill ({waited} ms)\n{}", out.dump());
            assert!(killed.elapsed() < Duration::from_secs(10), "{}", out.dump());
        } else {
            assert_eq!(rc(&out, 2), OOM, "{}", out.dump());
            assert!(waited < 1000, "{}", out.dump());
        }
    }
}

/// Two waiters are served in their order of arrival: B (40 MiB) before C (32 MiB, arriving
/// later), although C alone would fit first once A frees its 56 MiB; C gets its memory once B
/// frees. The budget holds throughout.
#[test]
fn waiters_are_served_in_order() {
    let node = Node::new("oomwait-fifo");
    let (ready, cdone) = (node.mark("a-ready"), node.mark("c-done"));
    let a = ops(&["alloc=mem:58720256", &format!("touch={ready}"), "sleep=2000", "stamp", "free=1", &format!("waitfor={cdone}")]);
    let b = ops(&[&format!("waitfor={ready}"), "stamp", "alloc=mem:41943040", "stamp", "sleep=1000", "stamp", "free=3", &format!("waitfor={cdone}")]);
    let c = ops(&[&format!("waitfor={ready}"), "sleep=800", "stamp", "alloc=mem:33554432", "stamp", &format!("touch={cdone}")]);
    let outs = together(vec![node.run(true, Some("20s"), &a), node.run(true, Some("20s"), &b), node.run(true, Some("20s"), &c)]);
    let (a, b, c) = (&outs[0], &outs[1], &outs[2]);
    for o in &outs {
        o.assert_completed();
    }
    let what = format!("{}\n{}\n{}", a.dump(), b.dump(), c.dump());
    assert_eq!((rc(b, 3), rc(c, 4)), (0, 0), "both got their memory: {what}");
    assert!(ms(b, 4) >= ms(a, 4), "B once A freed: {what}");
    assert!(ms(c, 5) >= ms(b, 6), "C only once B freed (first come, first served): {what}");
    assert!(ms(b, 4) < ms(c, 5), "{what}");
    assert!(node_peak(a) <= LIMIT, "{what}");
}

/// Bad values are configuration errors naming the variable; `0` means no wait.
#[test]
fn bad_values_are_configuration_errors() {
    for value in ["30", "soon", "-1s", "2d", "1.5.0s", "25h"] {
        let out = check_fails_closed(|| Run::program(Program::Driver(DriverPath::Link)).env("GPUSHIM_OOM_WAIT", value));
        assert_fails_closed(&out.shim, "GPUSHIM_OOM_WAIT", value);
    }
    let node = Node::new("oomwait-zero");
    let _a = node.holder(&ops(&["alloc=mem:50331648"]));
    let out = node.run(true, Some("0"), &ops(&["stamp", "alloc=mem:33554432", "stamp"])).run();
    assert_eq!(rc(&out, 2), OOM, "{}", out.dump());
    assert!(ms(&out, 3) - ms(&out, 1) < 1000, "{}", out.dump());
}

/// A forked child waits in a place of its own (`tests/c/forkq.c`, `alloc`): the parent holds
/// 600 MiB of a 1 GiB quota; the child gets 300 MiB, then waits its 1.5 s for 300 MiB more
/// (the parent, waiting for the child, frees nothing) and is refused; the parent's place is
/// untouched (its next 300 MiB fit, then its own limit refuses at once).
#[test]
fn a_forked_child_waits_in_its_own_place() {
    for wait in [Some("1500ms"), None] {
        let mut run = Run::program(Program::ForkQuota)
            .shim(true)
            .env("GPUSIM_DEVICES", "1")
            .env("GPUSIM_MEMORY", "16GiB")
            .env("GPUSHIM_MEMORY_LIMIT", "1GiB")
            .env("GPUSHIM_SHARED_QUOTA", "forkwait")
            .env("GPUSHIM_STATE_DIR", fresh_dir(&format!("oomwait-fork-{}", wait.is_some())).join("state"))
            .env("GPUSHIM_LOG", "info")
            .args(["alloc", &(600 * MIB).to_string(), &(300 * MIB).to_string()]);
        if let Some(w) = wait {
            run = run.env("GPUSHIM_OOM_WAIT", w);
        }
        let start = Instant::now();
        let out = run.run();
        let took = start.elapsed();
        out.assert_completed();
        assert_eq!((out.num("parent.rc"), out.num("child.status")), (0, 0), "{}", out.dump());
        assert_eq!([out.num("child.rc1"), out.num("child.rc2")], [0, OOM], "{}", out.dump());
        assert_eq!([out.num("after.rc1"), out.num("after.rc2")], [0, OOM], "{}", out.dump());
        let waited = out.stderr_text().lines().filter(|l| l.contains("bytes waited")).count();
        if wait.is_some() {
            assert!(took >= Duration::from_millis(1400), "the child waited its 1.5 s ({took:?})\n{}", out.dump());
            assert_eq!(waited, 1, "one wait, the child's (the parent's own limit does not wait)\n{}", out.dump());
        } else {
            assert_eq!(waited, 0, "{}", out.dump());
        }
    }
}

/// Eight members each hold 8 MiB of the 64 MiB quota, then ask for 8 MiB more, one after the
/// other (300 ms apart): the eighth finds every member waiting and is refused at once; it
/// frees its first 8 MiB, which the first waiter gets; each one served frees its first 8 MiB
/// for the next: all seven are served, in their order of arrival. The budget holds throughout.
#[test]
fn eight_members_all_waiting_resolve_in_order() {
    let node = Node::new("oomwait-eight");
    let marks: Vec<String> = (0..8).map(|i| node.mark(&format!("r{i}"))).collect();
    let runs: Vec<Run> = (0..8)
        .map(|i| {
            let mut list = vec!["alloc=mem:8388608".to_string(), format!("touch={}", marks[i])];
            list.extend(marks.iter().map(|m| format!("waitfor={m}"))); // ops 3..=10
            list.extend([format!("sleep={}", 300 * i), "stamp".into(), "alloc=mem:8388608".into(), "stamp".into(), "free=1".into(), "sleep=3000".into()]);
            node.run(true, Some("20s"), &list)
        })
        .collect();
    let outs = together(runs);
    let what = outs.iter().map(|o| o.dump()).collect::<Vec<_>>().join("\n");
    for o in &outs {
        o.assert_completed();
    }
    // ops: 11 sleep, 12 stamp, 13 alloc, 14 stamp
    assert_eq!(rc(&outs[7], 13), OOM, "the eighth is refused: {what}");
    assert!(ms(&outs[7], 14) - ms(&outs[7], 12) < 1000, "at once: {what}");
    let served: Vec<i64> = (0..7).map(|i| ms(&outs[i], 14)).collect();
    for i in 0..7 {
        assert_eq!(rc(&outs[i], 13), 0, "member {i} is served: {what}");
    }
    assert!(served.windows(2).all(|w| w[0] <= w[1]), "in order of arrival: {served:?}\n{what}");
    assert!(served[0] >= ms(&outs[7], 14), "the first once the eighth gave up and freed: {served:?}\n{what}");
    assert!(node_peak(&outs[0]) <= LIMIT, "{what}");
}

/// The same on a HAMi-core shared region (`CUDA_DEVICE_MEMORY_SHARED_CACHE`, a budget shared
/// through the region's quota): B waits for A's free with GPUSHIM_OOM_WAIT, and is refused at
/// once without it.
#[test]
fn a_waiter_on_a_hami_region_proceeds_when_another_member_frees() {
    for wait in [Some("20s"), None] {
        let node = Node::new(&format!("oomwait-hami-{}", wait.is_some()));
        let region = node.dir.join("region.cache");
        let (ready, done) = (node.mark("a-ready"), node.mark("b-done"));
        let a = ops(&["alloc=mem:50331648", &format!("touch={ready}"), "sleep=1500", "stamp", "free=1", &format!("waitfor={done}")]);
        let holds = node.mark("b-holds");
        let b = ops(&[&format!("waitfor={ready}"), "stamp", "alloc=mem:33554432", "stamp", &format!("touch={done}"), &format!("touch={holds}"), "sleep=1500"]);
        let (ra, rb) = (node.run_hami(wait, &region, &a), node.run_hami(wait, &region, &b));
        let ta = std::thread::spawn(move || ra.run());
        let tb = std::thread::spawn(move || rb.run());
        // while B holds what it waited for, the region's slot shows it (HAMi's monitor reads it)
        let mut shown = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        while wait.is_some() && Instant::now() < deadline && !std::path::Path::new(&holds).exists() {
            std::thread::sleep(Duration::from_millis(10));
        }
        if wait.is_some() {
            let out = target_command(profile_dir().join("gpushim")).args(["ps", "--hami"]).arg(&region).output().expect("gpushim ps --hami");
            shown = String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect();
        }
        let outs = vec![ta.join().unwrap(), tb.join().unwrap()];
        let (a, b) = (&outs[0], &outs[1]);
        a.assert_completed();
        b.assert_completed();
        let (freed, asked, answered) = (ms(a, 4), ms(b, 2), ms(b, 4));
        let what = format!("B asked at {asked}, A freed at {freed}, B answered at {answered}\n{}\n{}", a.dump(), b.dump());
        if wait.is_some() {
            assert_eq!(rc(b, 3), 0, "B waits, then gets its memory: {what}");
            assert!(answered >= freed && answered - freed < 1000, "B got its memory once A freed: {what}");
            assert!(answered - asked >= 700, "B waited about A's hold (1.5 s): {what}");
            assert!(node_peak(b) <= LIMIT, "the region's budget held on the node: {what}");
            assert!(shown.iter().any(|l| l.starts_with("slot ") && l.ends_with(&format!("alive used 0:{}", 32 * MIB))), "B's slot shows what it waited for: {shown:?}\n{what}");
        } else {
            assert_eq!(rc(b, 3), OOM, "without GPUSHIM_OOM_WAIT, refused: {what}");
            assert!(answered - asked < 1000, "at once: {what}");
        }
    }
}
