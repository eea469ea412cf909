//! Observability (issue 17): the live figures each process under the shim publishes in the
//! state directory, and what `gpushim ps`, `gpushim metrics` (printed; over HTTP in
//! tests/metrics_http.rs) and `gpushim top` make of them, against test programs holding known
//! amounts on the simulated driver.

mod common;
mod observe;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use observe::*;

/// Two programs under the shim: one with a 64 MiB limit holding 10 MiB on device 0 and 3 MiB
/// on device 1 after one refused request; one seeing only GPU 1, in a shared quota, holding
/// 5 MiB. `gpushim metrics` reports exactly that, `gpushim ps` too; a SIGKILLed program is
/// shown dead at once and its entry is removed by the next program; a clean exit removes it.
#[test]
fn metrics_and_ps_show_what_programs_hold() {
    let node = Node::new("obs-figures");
    let a = node.start(
        &[("GPUSHIM_MEMORY_LIMIT", "64MiB")],
        &["dev=0", &format!("alloc=mem:{}", 10 * MIB), "dev=1", &format!("alloc=mem:{}", 3 * MIB), &format!("alloc=mem:{}", 100 * MIB)],
    );
    let b = node.start(
        &[("GPUSHIM_MEMORY_LIMIT", "32MiB"), ("GPUSHIM_VISIBLE_DEVICES", "1"), ("GPUSHIM_SHARED_QUOTA", "team")],
        &[&format!("alloc=mem:{}", 5 * MIB)],
    );
    let (pa, pb) = (a.pid().to_string(), b.pid().to_string());
    assert_eq!(node.published(), {
        let mut v = vec![format!("proc-{pa}"), format!("proc-{pb}")];
        v.sort();
        v
    });
    // private to the user
    {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(published_file(&node.state, &pa)).unwrap();
        assert_eq!(m.mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(&node.state).unwrap().mode() & 0o777, 0o700);
    }

    let out = node.gpushim(&["metrics"]);
    assert!(out.status.success(), "{}", out.dump());
    let text = out.stdout_text();
    let s = parse_exposition(&text);
    let (g0, g1) = (phys_uuid(0), phys_uuid(1));
    let at = |pid: &str, dev: &str| vec![("pid", pid.to_string()), ("device", dev.to_string())];
    let v = |name: &str, l: Vec<(&str, String)>| {
        let l: Vec<(&str, &str)> = l.iter().map(|(k, v)| (*k, v.as_str())).collect();
        value(&s, name, &l)
    };
    assert_eq!(v("gpushim_memory_used_bytes", at(&pa, "0")), (10 * MIB) as f64, "{text}");
    assert_eq!(v("gpushim_memory_used_bytes", at(&pa, "1")), (3 * MIB) as f64, "{text}");
    assert_eq!(v("gpushim_memory_peak_used_bytes", at(&pa, "1")), (3 * MIB) as f64, "{text}");
    assert_eq!(v("gpushim_memory_limit_bytes", at(&pa, "0")), (64 * MIB) as f64, "{text}");
    assert_eq!(v("gpushim_allocations_refused_total", at(&pa, "1")), 1.0, "{text}");
    assert_eq!(v("gpushim_allocations_refused_total", at(&pa, "0")), 0.0, "{text}");
    assert_eq!(value(&s, "gpushim_memory_used_bytes", &[("pid", &pa), ("device", "0"), ("gpu_uuid", &g0), ("quota", ""), ("user", "root")]), (10 * MIB) as f64);
    assert_eq!(value(&s, "gpushim_memory_used_bytes", &[("pid", &pa), ("device", "1"), ("gpu_uuid", &g1)]), (3 * MIB) as f64);
    // b sees GPU 1 as its device 0, in quota "team"
    assert_eq!(value(&s, "gpushim_memory_used_bytes", &[("pid", &pb), ("device", "0"), ("gpu_uuid", &g1), ("quota", "team")]), (5 * MIB) as f64, "{text}");
    assert_eq!(count(&s, "gpushim_memory_used_bytes", &[("pid", &pb)]), 1, "{text}");
    assert_eq!(value(&s, "gpushim_quota_used_bytes", &[("quota", "team"), ("gpu_uuid", &g1)]), (5 * MIB) as f64, "{text}");
    assert_eq!(value(&s, "gpushim_quota_limit_bytes", &[("quota", "team"), ("gpu_uuid", &g1)]), (32 * MIB) as f64, "{text}");
    assert_eq!(value(&s, "gpushim_process_alive", &[("pid", &pa)]), 1.0);
    assert_eq!(value(&s, "gpushim_process_devices", &[("pid", &pa)]), 2.0);
    // the physical GPUs, from NVML
    assert_eq!(value(&s, "gpushim_gpu_memory_total_bytes", &[("gpu_uuid", &g0)]), (16 * GIB) as f64, "{text}");
    assert!(text.contains("# TYPE gpushim_allocations_refused_total counter"));

    let ps = node.gpushim(&["ps"]);
    assert!(ps.status.success(), "{}", ps.dump());
    let pst = ps.stdout_text();
    assert!(pst.contains("processes under gpushim ("), "{pst}");
    assert!(pst.contains(&format!("pid {pa} drvapi-link")), "{pst}");
    assert!(pst.contains(&format!("device 1 {g1}: 3 MiB in use (peak 3 MiB), 3 MiB reserved, limit 64 MiB, 1 refused")), "{pst}");
    assert!(pst.contains(&format!("pid {pb} drvapi-link (root, shared quota team): 1 devices")), "{pst}");

    // killed: dead at once, its figures gone from the metrics; the next program reclaims it
    drop(a);
    let s = parse_exposition(&node.gpushim(&["metrics", "--no-gpus"]).stdout_text());
    assert_eq!(value(&s, "gpushim_process_alive", &[("pid", &pa)]), 0.0);
    assert_eq!(count(&s, "gpushim_memory_used_bytes", &[("pid", &pa)]), 0);
    assert_eq!(count(&s, "gpushim_gpu_memory_total_bytes", &[]), 0, "--no-gpus");
    let ps = node.gpushim(&["ps"]).stdout_text();
    assert!(ps.contains(&format!("pid {pa} drvapi-link (root): 2 devices (exited without leaving")), "{ps}");
    // a program that runs to its end: its entry is gone when it is; it removed the dead one
    let done = Run::program(Program::Driver(DriverPath::Link))
        .shim(true)
        .args([format!("alloc=mem:{MIB}")])
        .env("GPUSIM_DEVICES", "2")
        .env("GPUSHIM_STATE_DIR", &node.state)
        .run();
    done.assert_completed();
    assert_eq!(node.published(), vec![format!("proc-{pb}")]);
    drop(b);
}

/// Split GPUs: each part is published with its GPU's UUID and its place (`part="2/2"`).
#[test]
fn split_parts_are_labelled() {
    let node = Node::new("obs-split");
    let h = node.start(&[("GPUSHIM_VIRTUAL_DEVICES", "0:2x4GiB")], &["dev=1", &format!("alloc=mem:{}", 7 * MIB)]);
    let s = parse_exposition(&node.gpushim(&["metrics", "--no-gpus"]).stdout_text());
    let pid = h.pid().to_string();
    let g0 = phys_uuid(0);
    assert_eq!(value(&s, "gpushim_memory_used_bytes", &[("pid", &pid), ("device", "1"), ("gpu_uuid", &g0), ("part", "2/2")]), (7 * MIB) as f64);
    assert_eq!(value(&s, "gpushim_memory_limit_bytes", &[("pid", &pid), ("device", "1")]), (4 * GIB) as f64);
    assert_eq!(value(&s, "gpushim_memory_used_bytes", &[("pid", &pid), ("device", "0"), ("part", "1/2")]), 0.0);
    assert_eq!(value(&s, "gpushim_memory_used_bytes", &[("pid", &pid), ("device", "2"), ("gpu_uuid", &phys_uuid(1)), ("part", "")]), 0.0);
}

/// The compute share as `gpushim ps` and `gpushim metrics` show it, from a live file with known
/// figures (made here with the library's own `Publisher`, as the pacer fills it): device 0
/// with a 30 % limit in mode duty, 300 s of GPU time in the 1000 s since the process started
/// publishing (30 % achieved), 1.5 s throttled, 12345 launches; device 1 without a limit.
#[test]
fn compute_share_in_ps_and_metrics() {
    use gpushim_common::live::{Publisher, ViewEntry};
    use std::os::unix::fs::FileExt;
    use std::sync::atomic::Ordering::Relaxed;
    let node = Node::new("obs-compute");
    let (g0, g1) = (phys_uuid(0), phys_uuid(1));
    let view = [ViewEntry { uuid: g0.clone(), part: None }, ViewEntry { uuid: g1.clone(), part: None }];
    let publisher = Publisher::start(&node.state, None, &view).expect("publish");
    publisher.set_compute_mode(1); // "duty"
    let c = &publisher.device(0).unwrap().compute;
    c.limit_ppm.store(300_000, Relaxed);
    c.busy_ns.store(300_000_000_000, Relaxed);
    c.throttled_ns.store(1_500_000_000, Relaxed);
    c.launches.store(12_345, Relaxed);
    let w = &publisher.device(0).unwrap().waits;
    w.waits.store(3, Relaxed);
    w.waited_ns.store(2_250_000_000, Relaxed);
    // started publishing 1000 s ago: the header's `started` (seconds since the epoch) is its
    // fifth word, at byte 24 (magic 8, version 4, pid 4, layout 8)
    let pid = std::process::id().to_string();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let file = std::fs::OpenOptions::new().write(true).open(published_file(&node.state, &pid)).unwrap();
    file.write_all_at(&(now - 1000).to_le_bytes(), 24).unwrap();

    let ps = node.gpushim(&["ps"]);
    assert!(ps.status.success(), "{}", ps.dump());
    let text = ps.stdout_text();
    let devices: Vec<&str> = text.lines().skip_while(|l| !l.starts_with(&format!("  pid {pid} "))).skip(1).take(2).collect();
    assert_eq!(
        devices,
        [
            format!("    device 0 {g0}: 0 B in use (peak 0 B), 0 B reserved, limit not yet resolved, 0 refused, compute limit 30% (duty), 30% achieved, 1.5 s throttled"),
            format!("    device 1 {g1}: 0 B in use (peak 0 B), 0 B reserved, limit not yet resolved, 0 refused, compute limit -"),
        ],
        "{text}"
    );

    let out = node.gpushim(&["metrics", "--no-gpus"]);
    assert!(out.status.success(), "{}", out.dump());
    let text = out.stdout_text();
    let s = parse_exposition(&text);
    let at = |dev: &'static str| [("pid", pid.as_str()), ("device", dev), ("quota", ""), ("part", "")];
    assert_eq!(value(&s, "gpushim_compute_limit_ratio", &at("0")), 0.3, "{text}");
    assert_eq!(count(&s, "gpushim_compute_limit_ratio", &at("1")), 0, "no limit, no sample: {text}");
    assert_eq!(value(&s, "gpushim_gpu_busy_seconds_total", &at("0")), 300.0, "{text}");
    assert_eq!(value(&s, "gpushim_gpu_busy_seconds_total", &at("1")), 0.0, "{text}");
    assert_eq!(value(&s, "gpushim_compute_throttled_seconds_total", &at("0")), 1.5, "{text}");
    assert_eq!(value(&s, "gpushim_compute_launches_total", &at("0")), 12_345.0, "{text}");
    assert_eq!(value(&s, "gpushim_compute_launches_total", &at("1")), 0.0, "{text}");
    assert_eq!(value(&s, "gpushim_memory_waits_total", &at("0")), 3.0, "{text}");
    assert_eq!(value(&s, "gpushim_memory_wait_seconds_total", &at("0")), 2.25, "{text}");
    assert_eq!(value(&s, "gpushim_memory_waits_total", &at("1")), 0.0, "{text}");
    // the values as written, and the families' types
    let line = |name: &str| text.lines().find(|l| l.starts_with(&format!("{name}{{pid=\"{pid}\"")) && l.contains("device=\"0\"")).unwrap_or_else(|| panic!("{name}: {text}")).to_string();
    assert!(line("gpushim_compute_limit_ratio").ends_with("} 0.3"), "{text}");
    assert!(line("gpushim_compute_throttled_seconds_total").ends_with("} 1.5"), "{text}");
    assert!(line("gpushim_gpu_busy_seconds_total").ends_with("} 300"), "{text}");
    for (name, kind) in [
        ("gpushim_compute_limit_ratio", "gauge"),
        ("gpushim_gpu_busy_seconds_total", "counter"),
        ("gpushim_compute_throttled_seconds_total", "counter"),
        ("gpushim_compute_launches_total", "counter"),
        ("gpushim_memory_waits_total", "counter"),
        ("gpushim_memory_wait_seconds_total", "counter"),
    ] {
        assert!(text.contains(&format!("# TYPE {name} {kind}\n")), "{name}: {text}");
    }
    publisher.remove();
}

/// A program that never touches CUDA publishes nothing (no state directory is made).
#[test]
fn nothing_without_cuda() {
    let node = Node::new("obs-nocuda");
    let out = Run::new("/bin/true").shim(true).env("GPUSHIM_STATE_DIR", &node.state).env("GPUSHIM_MEMORY_LIMIT", "1GiB").run();
    assert!(out.status.success());
    assert!(!node.state.exists());
}


/// `gpushim top` in a real terminal (tmux): the program's row with its figures under its GPU,
/// the screen follows the terminal's size, `s` changes the order, `q` quits; not on a terminal
/// it prints the `ps` snapshot.
#[test]
fn top_in_a_terminal() {
    let node = Node::new("obs-top");
    let a = node.start(&[("GPUSHIM_MEMORY_LIMIT", "64MiB")], &["dev=1", &format!("alloc=mem:{}", 32 * MIB)]);
    let b = node.start(&[("GPUSHIM_MEMORY_LIMIT", "64MiB"), ("GPUSHIM_SHARED_QUOTA", "tq")], &[&format!("alloc=mem:{}", 8 * MIB), &format!("alloc=mem:{}", 90 * MIB)]);
    shim_path();
    nvml_sim_library();
    let server = Tmux::new("obs");
    let tmux = |args: &[&str]| server.tmux(args);
    let cmd = format!(
        "env -u LD_PRELOAD GPUSHIM_STATE_DIR={} LD_LIBRARY_PATH={} GPUSIM_DEVICES=2 GPUSIM_MEMORY=16GiB {} top --interval 0.3",
        node.state.display(),
        sim_dir().display(),
        cli().display()
    );
    let o = tmux(&["new-session", "-d", "-s", "top", "-x", "200", "-y", "40", &cmd]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let capture = || String::from_utf8_lossy(&tmux(&["capture-pane", "-p", "-t", "top"]).stdout).into_owned();
    let wait_screen = |what: &dyn Fn(&str) -> bool, why: &str| -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let screen = capture();
            if what(&screen) {
                return screen;
            }
            assert!(Instant::now() < deadline, "{why}:\n{screen}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let (pa, pb) = (a.pid().to_string(), b.pid().to_string());
    let screen = wait_screen(&|s: &str| s.contains(&pa) && s.contains(&pb) && s.contains("order: memory in use"), "top never showed both programs");
    // GPU 1 (NVML) with a's row: half of its limit
    assert!(screen.contains(&format!("GPU 1 gpusim device 1 {}: ", phys_uuid(1))), "{screen}");
    let row_a = screen.lines().find(|l| l.trim_start().starts_with(&format!("{pa} ")) && l.contains("32 MiB")).unwrap_or_else(|| panic!("{screen}"));
    assert!(row_a.contains("[##########..........]") && row_a.contains("32 MiB") && row_a.contains("64 MiB"), "{row_a}");
    let row_b = screen.lines().find(|l| l.trim_start().starts_with(&format!("{pb} ")) && l.contains("8 MiB")).unwrap_or_else(|| panic!("{screen}"));
    assert!(row_b.contains(" 1 tq"), "refusals and quota: {row_b}");
    assert!(screen.contains("tq (root)"), "{screen}");
    // the terminal made smaller, then larger: top follows its size at once (no key pressed)
    let o = tmux(&["resize-window", "-t", "top", "-x", "60", "-y", "12"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let small = wait_screen(
        &|s: &str| s.lines().next().is_some_and(|l| l.starts_with("gpushim top - 2 processes") && !l.contains("refresh")),
        "top did not follow the smaller terminal",
    );
    assert!(small.lines().count() <= 12 && small.lines().all(|l| l.chars().count() <= 60), "{small}");
    let o = tmux(&["resize-window", "-t", "top", "-x", "200", "-y", "40"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    wait_screen(&|s: &str| s.contains("keys: q quit, s order, r refresh") && s.contains(&pa) && s.contains(&pb), "top did not follow the larger terminal");
    tmux(&["send-keys", "-t", "top", "s"]);
    wait_screen(&|s: &str| s.contains("order: pid"), "s did not change the order");
    tmux(&["send-keys", "-t", "top", "s"]);
    wait_screen(&|s: &str| s.contains("order: refusals"), "s did not change the order again");
    // a program killed: shown as exited
    drop(a);
    wait_screen(&|s: &str| s.contains(&format!("pid {pa} drvapi-link (root): exited")), "the killed program was not shown as exited");
    // the compute columns: a live file of this process (as the pacer fills it) with a 50 %
    // limit in mode duty, its busy time growing at a quarter of the wall time: SHARE ≈ 25 %
    {
        use std::sync::atomic::Ordering::Relaxed;
        let publisher = gpushim_common::live::Publisher::start(&node.state, None, &[gpushim_common::live::ViewEntry { uuid: phys_uuid(0), part: None }]).unwrap();
        publisher.set_compute_mode(1);
        let c = &publisher.device(0).unwrap().compute;
        c.limit_ppm.store(500_000, Relaxed);
        let stop = std::sync::atomic::AtomicBool::new(false);
        let me = std::process::id().to_string();
        let share_of = |screen: &str| -> Option<u32> {
            let row = screen.lines().find(|l| l.trim_start().starts_with(&format!("{me} ")))?;
            let t: Vec<&str> = row.split_whitespace().collect();
            let k = t.iter().position(|w| *w == "duty")?;
            (t[k - 1] == "50%").then(|| t.get(k + 1)?.strip_suffix('%')?.parse().ok())?
        };
        std::thread::scope(|scope| {
            // (bounded: it ends by itself if the check below panics before stopping it)
            scope.spawn(|| {
                let t0 = Instant::now();
                while !stop.load(Relaxed) && t0.elapsed() < Duration::from_secs(30) {
                    c.busy_ns.store(t0.elapsed().as_nanos() as u64 / 4, Relaxed);
                    std::thread::sleep(Duration::from_millis(5));
                }
            });
            let screen = wait_screen(&|s: &str| share_of(s).is_some_and(|x| (20..=30).contains(&x)), "top did not show a 25 % share under a 50 % duty limit");
            assert!(screen.contains("COMPUTE LIMIT") && screen.contains("SHARE") && screen.contains("WAITED"), "{screen}");
            stop.store(true, Relaxed);
        });
        publisher.remove();
    }
    tmux(&["send-keys", "-t", "top", "q"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while tmux(&["has-session", "-t", "top"]).status.success() {
        assert!(Instant::now() < deadline, "q did not quit:\n{}", capture());
        std::thread::sleep(Duration::from_millis(50));
    }
    // not on a terminal: the snapshot
    let snap = node.gpushim(&["top"]);
    assert!(snap.status.success(), "{}", snap.dump());
    assert!(snap.stdout_text().contains(&format!("pid {pb} drvapi-link (root, shared quota tq)")), "{}", snap.dump());
    drop(b);
}

/// `gpushim top` stopped by a signal from another process (SIGTERM, SIGHUP, SIGINT, SIGQUIT)
/// restores the terminal as `q` does: the shell in the pane is back, off the alternate screen,
/// the cursor shown, the terminal cooked (`icanon echo`); the status is 128 + the signal.
#[test]
fn top_restores_the_terminal_when_signalled() {
    let node = Node::new("obs-topsig");
    shim_path();
    nvml_sim_library();
    let server = Tmux::new("topsig");
    let tmux = |args: &[&str]| server.tmux(args);
    let o = tmux(&["new-session", "-d", "-s", "top", "-x", "150", "-y", "30", "sh"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let capture = || String::from_utf8_lossy(&tmux(&["capture-pane", "-p", "-t", "top"]).stdout).into_owned();
    let shown = |format: &str| String::from_utf8_lossy(&tmux(&["display-message", "-p", "-t", "top", format]).stdout).trim().to_string();
    let wait = |what: &dyn Fn() -> bool, why: &str| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !what() {
            assert!(Instant::now() < deadline, "{why}:\n{}", capture());
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let pid_file = node.dir.join("top.pid");
    for (n, signal) in [libc::SIGTERM, libc::SIGHUP, libc::SIGINT, libc::SIGQUIT].into_iter().enumerate() {
        let _ = std::fs::remove_file(&pid_file);
        let line = format!(
            "clear; env -u LD_PRELOAD GPUSHIM_STATE_DIR={} LD_LIBRARY_PATH={} GPUSIM_DEVICES=2 GPUSIM_MEMORY=16GiB sh -c 'echo $$ > {}; exec {} top --interval 0.3'; echo \"end\"\"ed-{n}=$?\"; stty -a | tr ' ' '\\n' | grep -c -x -e icanon -e echo | sed 's/^/cook''ed-{n}=/'",
            node.state.display(),
            sim_dir().display(),
            pid_file.display(),
            cli().display()
        );
        tmux(&["send-keys", "-t", "top", "-l", &line]);
        tmux(&["send-keys", "-t", "top", "Enter"]);
        wait(&|| capture().contains("gpushim top - ") && shown("#{alternate_on}") == "1", "top did not start");
        let pid: i32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
        // SAFETY: kill(2) on the pid top wrote.
        unsafe { libc::kill(pid, signal) };
        wait(&|| capture().contains(&format!("cooked-{n}=")), "top did not end on the signal");
        let screen = capture();
        assert!(screen.contains(&format!("ended-{n}={}", 128 + signal)), "exit status 128 + {signal}:\n{screen}");
        assert!(!screen.contains("gpushim top - "), "the alternate screen was left:\n{screen}");
        assert_eq!(shown("#{alternate_on}"), "0", "off the alternate screen");
        assert_eq!(shown("#{cursor_flag}"), "1", "the cursor is shown");
        let cooked = screen.lines().find_map(|l| l.trim().strip_prefix(&format!("cooked-{n}="))).unwrap_or("");
        assert_eq!(cooked.trim(), "2", "icanon and echo are on again:\n{screen}");
    }
}

/// Only the user's own processes are shown, unless run as root; another user can read nothing.
/// Needs root (to run processes as other users).
#[test]
fn other_users_see_nothing() {
    if skipped_without_root("other_users_see_nothing") {
        return;
    }
    const NOBODY: u32 = 65534;
    const OTHER: u32 = 65533;
    use std::os::unix::fs::PermissionsExt;
    let node = Node::new("obs-users");
    // (nobody's default directory is used below: what the test adds there goes at the end;
    // dropped last, after the programs are killed)
    let nobody_default = DefaultStateDir::of_user(NOBODY);
    // everything the other users run must be reachable to them
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
    for p in [node.dir.clone(), sim_dir(), program(Program::Driver(DriverPath::Link)), shim_path(), cli()] {
        make_reachable(&p);
    }
    std::fs::set_permissions(&node.dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let theirs = node.dir.join("their-state");
    let theirs_s = theirs.display().to_string();
    let h = node.start_as(Some(NOBODY), &[("GPUSHIM_MEMORY_LIMIT", "1GiB"), ("GPUSHIM_STATE_DIR", &theirs_s)], &[&format!("alloc=mem:{}", 9 * MIB)]);
    let pid = h.pid().to_string();
    let file = published_file(&theirs, &pid);
    {
        use std::os::unix::fs::MetadataExt;
        let (d, f) = (std::fs::metadata(&theirs).unwrap(), std::fs::metadata(&file).unwrap());
        assert_eq!((d.uid(), d.mode() & 0o777, f.uid(), f.mode() & 0o777), (NOBODY, 0o700, NOBODY, 0o600));
    }
    let metrics_as = |uid: Option<u32>, dir: Option<&Path>| {
        use std::os::unix::process::CommandExt;
        let mut c = target_command(cli());
        c.args(["metrics", "--no-gpus"]).env_remove("GPUSHIM_STATE_DIR").env_remove("XDG_RUNTIME_DIR").env_remove("GPUSHIM_CONFIG").current_dir("/");
        if let Some(d) = dir {
            c.env("GPUSHIM_STATE_DIR", d);
        }
        if let Some(u) = uid {
            c.uid(u).gid(u);
        }
        let out = c.output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    // the owner sees it; root sees it, labelled with the owner's name
    let (ok, text, err) = metrics_as(Some(NOBODY), Some(&theirs));
    assert!(ok, "{err}");
    let s = parse_exposition(&text);
    assert_eq!(value(&s, "gpushim_memory_used_bytes", &[("pid", &pid), ("user", "nobody"), ("device", "0")]), (9 * MIB) as f64, "{text}");
    let (ok, text, _) = metrics_as(None, Some(&theirs));
    assert!(ok);
    assert_eq!(value(&parse_exposition(&text), "gpushim_memory_used_bytes", &[("pid", &pid), ("user", "nobody"), ("device", "0")]), (9 * MIB) as f64);
    // another user: refused the directory, shown nothing, cannot open the file
    let (ok, text, err) = metrics_as(Some(OTHER), Some(&theirs));
    assert!(!ok && !text.contains(&pid), "{text}{err}");
    assert!(err.contains("is not a private directory of this user"), "{err}");
    let peek = Run::new("/bin/cat").arg(&file).without_sim().as_user(OTHER).run();
    assert!(!peek.status.success() && peek.stderr_text().contains("Permission denied"), "{}", peek.dump());
    // root without a configured directory reads every user's default one: a process of
    // nobody's in /tmp/gpushim-65534 is listed
    let d = node.start_as(Some(NOBODY), &[("GPUSHIM_MEMORY_LIMIT", "1GiB")], &[&format!("alloc=mem:{}", 5 * MIB)]);
    let dpid = d.pid().to_string();
    let (ok, text, err) = metrics_as(None, None);
    assert!(ok, "{err}");
    assert_eq!(value(&parse_exposition(&text), "gpushim_memory_used_bytes", &[("pid", &dpid), ("user", "nobody"), ("device", "0")]), (5 * MIB) as f64, "{text}");
    // ... which that user's own listing shows too, but another user's does not
    let (_, text, _) = metrics_as(Some(NOBODY), None);
    assert!(text.contains(&format!("pid=\"{dpid}\"")), "{text}");
    let (_, text, _) = metrics_as(Some(OTHER), None);
    assert!(!text.contains(&format!("pid=\"{dpid}\"")) && !text.contains(&format!("pid=\"{pid}\"")), "{text}");
    drop(d);
    let _ = std::fs::remove_file(published_file(&nobody_default.dir, &dpid));
    drop(h);
}

/// A forked child that uses CUDA does not change its parent's published figures, and does not
/// keep the parent alive in them: killed, the parent is dead at once while the child lives.
#[test]
fn forked_child_leaves_the_parent_figures_alone() {
    use std::os::unix::process::CommandExt;
    let node = Node::new("obs-fork");
    let ready = node.dir.join("ready");
    let mut cmd = target_command(program(Program::ForkQuota));
    cmd.args(["linger", &(10 * MIB).to_string(), &(3 * MIB).to_string(), &ready.display().to_string()])
        .env_clear()
        .env("LD_LIBRARY_PATH", sim_dir())
        .env("LD_PRELOAD", shim_path())
        .env("GPUSIM_DEVICES", "1")
        .env("GPUSHIM_MEMORY_LIMIT", "1GiB")
        .env("GPUSHIM_STATE_DIR", &node.state)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let parent = Holder(cmd.spawn().unwrap());
    let pgid = parent.pid() as i32;
    struct Group(i32);
    impl Drop for Group {
        fn drop(&mut self) {
            // SAFETY: signalling the test's own process group.
            unsafe { libc::kill(-self.0, libc::SIGKILL) };
        }
    }
    let _group = Group(pgid);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ready.exists() {
        assert!(Instant::now() < deadline, "the program never got ready");
        std::thread::sleep(Duration::from_millis(10));
    }
    let pid = parent.pid().to_string();
    assert_eq!(node.published(), vec![format!("proc-{pid}")], "the child publishes nothing");
    let s = parse_exposition(&node.gpushim(&["metrics", "--no-gpus"]).stdout_text());
    assert_eq!(value(&s, "gpushim_memory_used_bytes", &[("pid", &pid), ("device", "0")]), (10 * MIB) as f64, "the child's 3 MiB are not the parent's");
    assert_eq!(value(&s, "gpushim_process_alive", &[("pid", &pid)]), 1.0);
    // SAFETY: killing the test's own child.
    unsafe { libc::kill(parent.pid() as i32, libc::SIGKILL) };
    std::thread::sleep(Duration::from_millis(100));
    let s = parse_exposition(&node.gpushim(&["metrics", "--no-gpus"]).stdout_text());
    assert_eq!(value(&s, "gpushim_process_alive", &[("pid", &pid)]), 0.0, "the child (still running) does not keep the parent alive");
}

/// The command lines: help pages, mistakes.
#[test]
fn command_lines() {
    let node = Node::new("obs-cli");
    for (args, code, needle) in [
        (&["help", "metrics"][..], 0, "gpushim_allocations_refused_total"),
        (&["help", "top"][..], 0, "s changes the"),
        (&["metrics", "--help"][..], 0, "--listen ADDR:PORT"),
        (&["metrics", "--bogus"][..], 2, "unknown option --bogus"),
        (&["metrics", "--listen"][..], 2, "--listen needs an address"),
        (&["top", "--interval", "0"][..], 2, "--interval needs seconds"),
        (&["metrics", "--listen", "256.0.0.1:1"][..], 1, "cannot listen on 256.0.0.1:1"),
        (&["topp"][..], 2, "did you mean gpushim top?"),
    ] {
        let out = node.gpushim(args);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {}", out.dump());
        let all = out.stdout_text() + &out.stderr_text();
        assert!(all.contains(needle), "{args:?}: {all}");
    }
    // nothing under the shim yet: an empty exposition with its HELP/TYPE lines, an empty ps
    let out = node.gpushim(&["metrics", "--no-gpus"]);
    assert!(out.status.success() && out.stdout_text().contains("# TYPE gpushim_memory_used_bytes gauge"), "{}", out.dump());
    assert!(parse_exposition(&out.stdout_text()).is_empty());
}

/// A process with no limit at all is listed with what it holds; its limit is the device's
/// memory.
#[test]
fn a_process_without_limits_is_listed() {
    let node = Node::new("obs-nolimit");
    let h = node.start(&[], &[&format!("alloc=mem:{}", 4 * MIB)]);
    let pid = h.pid().to_string();
    let s = parse_exposition(&node.gpushim(&["metrics", "--no-gpus"]).stdout_text());
    assert_eq!(value(&s, "gpushim_process_alive", &[("pid", &pid)]), 1.0);
    assert_eq!(value(&s, "gpushim_process_devices", &[("pid", &pid)]), 2.0);
    assert_eq!(value(&s, "gpushim_memory_used_bytes", &[("pid", &pid), ("device", "0"), ("gpu_uuid", &phys_uuid(0))]), (4 * MIB) as f64);
    assert_eq!(value(&s, "gpushim_memory_limit_bytes", &[("pid", &pid), ("device", "0")]), (16 * GIB) as f64);
    assert_eq!(count(&s, "gpushim_memory_limit_bytes", &[("pid", &pid), ("device", "1")]), 0, "device 1 never used: not resolved yet");
}


/// Checks that `out` (what a command printed) is valid UTF-8 with no control character but
/// new lines: no C0 control (escape, bell, carriage return...), no DEL, no C1 control.
fn assert_printable(what: &str, out: &[u8]) {
    let text = std::str::from_utf8(out).unwrap_or_else(|e| panic!("{what}: not UTF-8 ({e}): {out:?}"));
    let reorders = |c: char| matches!(c, '\u{200B}'..='\u{200F}' | '\u{2028}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{FEFF}');
    let bad: Vec<char> = text.chars().filter(|&c| (c.is_control() && c != '\n') || reorders(c)).collect();
    assert!(bad.is_empty(), "{what}: control characters {bad:?} in\n{text:?}");
}

/// The first occurrence of `old` in `file` replaced by `new` NUL-padded to its length (the
/// string fields of the published files are NUL-padded): what a process can do to its own file.
fn overwrite(file: &Path, old: &[u8], new: &[u8]) {
    use std::os::unix::fs::FileExt;
    let data = std::fs::read(file).unwrap();
    let at = data.windows(old.len()).position(|w| w == old).unwrap_or_else(|| panic!("{old:?} not in {}", file.display()));
    assert!(new.len() <= old.len());
    let mut padded = new.to_vec();
    padded.resize(old.len(), 0);
    std::fs::OpenOptions::new().write(true).open(file).unwrap().write_all_at(&padded, at as u64).unwrap();
}

/// Names and UUIDs come from files that processes write: a process named (by the link it was
/// started through) with an OSC title sequence, a bell, a C1 CSI, a byte that is not UTF-8, a
/// quote, a backslash, a new line and DEL, whose published GPU UUID and quota name it rewrote
/// with CSI sequences, shows in `ps`, `metrics` and `top` with `?` for each control character
/// (U+FFFD for the byte that is not UTF-8) and nothing else changed; the exposition escapes
/// the quote and the backslash; a quota file named with escapes is named harmlessly in `ps`'s
/// error. (Before, ps printed them raw: the terminal took the title, the colours, the new line.)
#[test]
fn names_from_files_reach_no_terminal_raw() {
    use std::os::unix::ffi::OsStrExt;
    let node = Node::new("obs-escapes");
    std::fs::create_dir_all(&node.dir).unwrap();
    let name: &[u8] = b"\x1b]0;pw\x07\xc2\x9bJ\x9b\"\\\n\x7f"; // 15 bytes: all of a process name
    let shown = "?]0;pw??J\u{FFFD}\"\\??";
    let link = node.dir.join(std::ffi::OsStr::from_bytes(name));
    std::os::unix::fs::symlink(program(Program::Driver(DriverPath::Link)), &link).unwrap();
    let a = node.start_program(&link, None, &[("GPUSHIM_MEMORY_LIMIT", "64MiB")], &[&format!("alloc=mem:{}", 4 * MIB)]);
    let b = node.start_program(&link, None, &[("GPUSHIM_MEMORY_LIMIT", "64MiB"), ("GPUSHIM_SHARED_QUOTA", "evilq")], &[&format!("alloc=mem:{}", 2 * MIB)]);
    let (pa, pb) = (a.pid().to_string(), b.pid().to_string());
    // (and U+202E, a right-to-left override, which reorders what follows it on the line)
    overwrite(&published_file(&node.state, &pa), phys_uuid(0).as_bytes(), b"GPU-\x1b[2J\x1b[31m\x9b\xc2\x85x\xe2\x80\xaey");
    let uuid = "GPU-?[2J?[31m\u{FFFD}?x?y";
    overwrite(&published_file(&node.state, &pb), b"evilq", b"\x1b[5mq");
    // ps
    let ps = node.gpushim(&["ps"]);
    assert!(ps.status.success(), "{}", ps.dump());
    assert_printable("gpushim ps", &ps.stdout);
    let text = ps.stdout_text();
    for line in [
        format!("  pid {pa} {shown} (root): 2 devices"),
        format!("    device 0 {uuid}: 4 MiB in use (peak 4 MiB)"),
        format!("  pid {pb} {shown} (root, shared quota ?[5mq): 2 devices"),
        format!("  pid {pa} {shown}: {} limit 64 MiB", phys_uuid(0)), // (the registry's)
        format!("  pid {pb} {shown}: {} 2 MiB of 64 MiB", phys_uuid(0)), // (the quota's)
    ] {
        assert!(text.lines().any(|l| l.starts_with(&line)), "no line {line:?} in\n{text}");
    }
    // metrics: the same, the quote and backslash escaped as the format wants
    let m = node.gpushim(&["metrics", "--no-gpus"]);
    assert!(m.status.success(), "{}", m.dump());
    assert_printable("gpushim metrics", &m.stdout);
    let text = m.stdout_text();
    let comm = "?]0;pw??J\u{FFFD}\\\"\\\\??";
    for want in [
        format!("gpushim_memory_used_bytes{{pid=\"{pa}\",user=\"root\",comm=\"{comm}\",quota=\"\",device=\"0\",gpu_uuid=\"{uuid}\",part=\"\"}} {}", 4 * MIB),
        format!("gpushim_process_alive{{pid=\"{pb}\",user=\"root\",comm=\"{comm}\",quota=\"?[5mq\"}} 1"),
    ] {
        assert!(text.lines().any(|l| l == want), "no line {want:?} in\n{text}");
    }
    // top, in a terminal: what it wrote (tmux's pipe-pane) holds none of the sequences
    top_writes_no_escapes(&node, &pa, shown);
    // a quota file whose name holds escapes: ps names it in its error, harmlessly
    {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(node.state.join(std::ffi::OsStr::from_bytes(b"quota-\x1b]0;q\x07"))).unwrap();
    }
    let ps = node.gpushim(&["ps"]);
    assert_eq!(ps.status.code(), Some(1), "{}", ps.dump());
    assert_printable("gpushim ps's errors", &ps.stderr);
    assert!(ps.stderr_text().contains("quota-?]0;q? is not a gpushim quota file"), "{}", ps.dump());
    drop((a, b));
}

/// A tmux server of the test's own, `tmux -L name` with `TMUX_TMPDIR` a directory of its own in
/// /tmp (short: a socket's path has room for 107 bytes; tmux leaves its socket behind when its
/// server ends): `tmux(args)` runs a tmux command on it; dropped, the server is killed and the
/// directory removed.
struct Tmux {
    name: String,
    dir: std::path::PathBuf,
}

impl Tmux {
    fn new(name: &str) -> Tmux {
        let dir = std::path::PathBuf::from(format!("/tmp/gpushim-tmux-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        Tmux { name: name.to_string(), dir }
    }

    fn tmux(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux").env("TMUX_TMPDIR", &self.dir).arg("-L").arg(&self.name).args(args).output().expect("tmux")
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.tmux(&["kill-server"]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `gpushim top` on `node` in tmux, its output recorded raw: the row of `pid` shows `shown`,
/// and nothing but top's own sequences reached the terminal (the pane's title is unchanged).
fn top_writes_no_escapes(node: &Node, pid: &str, shown: &str) {
    let server = Tmux::new("esc");
    let tmux = |args: &[&str]| server.tmux(args);
    let raw = node.dir.join("top.raw");
    // (top starts after a second: the recording is set up by then)
    let cmd = format!(
        "sleep 1; exec env -u LD_PRELOAD GPUSHIM_STATE_DIR={} LD_LIBRARY_PATH={} GPUSIM_DEVICES=2 GPUSIM_MEMORY=16GiB {} top --interval 0.3",
        node.state.display(),
        sim_dir().display(),
        cli().display()
    );
    let o = tmux(&["new-session", "-d", "-s", "esc", "-x", "200", "-y", "40", &cmd]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let title = String::from_utf8_lossy(&tmux(&["display-message", "-p", "-t", "esc", "#{pane_title}"]).stdout).trim().to_string();
    let o = tmux(&["pipe-pane", "-t", "esc", "-o", &format!("cat >> {}", raw.display())]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let screen = String::from_utf8_lossy(&tmux(&["capture-pane", "-p", "-t", "esc"]).stdout).into_owned();
        if screen.lines().any(|l| l.trim_start().starts_with(&format!("{pid} root     {}", &shown[..9]))) {
            break;
        }
        assert!(Instant::now() < deadline, "top never showed {pid}:\n{screen}");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(700)); // two more screens
    let now = String::from_utf8_lossy(&tmux(&["display-message", "-p", "-t", "esc", "#{pane_title}"]).stdout).trim().to_string();
    tmux(&["send-keys", "-t", "esc", "q"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while tmux(&["has-session", "-t", "esc"]).status.success() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = std::fs::read(&raw).unwrap();
    assert!(out.len() > 1000, "top wrote {} bytes", out.len());
    for bad in [&b"\x1b]"[..], b"\x07", b"\x7f", b"\xc2\x9b", b"\xc2\x85", b"\x1b[31m", b"\x1b[5m"] {
        assert!(!out.windows(bad.len()).any(|w| w == bad), "top wrote {bad:?}: {:?}", String::from_utf8_lossy(&out));
    }
    assert_eq!(now, title, "the pane's title changed");
}
