//! `gpushim sim` (issue 27): a command on the simulated GPUs with the count and size asked for,
//! processes under one `gpushim sim` sharing the simulated node (each one's memory in the
//! other's `gpushim ps` and in NVML's GPU-wide figures of `gpushim metrics`), the command's exit
//! status passed on, and the private directory gone afterwards.

mod common;

use std::path::{Path, PathBuf};

use common::*;

fn cli() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_gpushim"))
}

/// `gpushim sim ARGS…` with TMPDIR = `tmp` (where its private directory goes) and its own
/// state directory; nothing of the test harness' simulator set-up.
fn sim(tmp: &Path, state: &Path, args: &[&str]) -> RunOutput {
    shim_path();
    sim_library();
    nvml_sim_library();
    Run::new(cli())
        .without_sim()
        .arg("sim")
        .args(args)
        .env("TMPDIR", tmp)
        .env("XDG_RUNTIME_DIR", "")
        .env("GPUSHIM_CONFIG", "/dev/null")
        .env("GPUSHIM_STATE_DIR", state)
        .run()
}

/// A fresh temporary directory and a fresh private state directory.
fn dirs() -> (PathBuf, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let (tmp, state) = (fresh_dir("sim-tmp"), fresh_dir("sim-state"));
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
    (tmp, state)
}

fn assert_left_nothing(tmp: &Path) {
    let left: Vec<_> = std::fs::read_dir(tmp).unwrap().flatten().map(|e| e.path()).collect();
    assert!(left.is_empty(), "gpushim sim left {left:?}");
}

#[test]
fn sim_runs_a_command_on_the_gpus_asked_for() {
    let (tmp, state) = dirs();
    let out = sim(&tmp, &state, &["--gpus", "3", "--", cli().to_str().unwrap(), "check"]);
    assert_eq!(out.status.code(), Some(0), "{}", out.dump());
    assert!(out.stdout_text().contains("devices the program sees: 3"), "{}", out.dump());
    assert!(out.stdout_text().contains(&phys_name(2)), "{}", out.dump());
    let first = out.stderr_text().lines().next().unwrap_or("").to_string();
    assert!(first.starts_with("gpushim sim: SIMULATED GPUs (3 x 16GiB)"), "one line says it is simulated: {}", out.dump());
    assert_left_nothing(&tmp);

    // the default: 2 GPUs; --memory sets each one's size
    let out = sim(&tmp, &state, &["--memory", "8GiB", "--", cli().to_str().unwrap(), "check"]);
    assert!(out.stdout_text().contains("devices the program sees: 2"), "{}", out.dump());
    assert!(out.stdout_text().contains("8GiB"), "{}", out.dump());
    assert_left_nothing(&tmp);
}

#[test]
fn sim_passes_the_exit_status_on_and_cleans_up() {
    let (tmp, state) = dirs();
    // the command sees the private directory (0700) first on LD_LIBRARY_PATH
    let script = "d=${LD_LIBRARY_PATH%%:*}; echo dir=$d; stat -c mode=%a $d; ls $d; exit 7";
    let out = sim(&tmp, &state, &["--", "sh", "-c", script]);
    assert_eq!(out.status.code(), Some(7), "{}", out.dump());
    let dir = out.get("dir").to_string();
    assert!(dir.starts_with(&tmp.display().to_string()), "{}", out.dump());
    assert_eq!(out.get("mode"), "700", "{}", out.dump());
    assert!(out.stdout_text().contains("libcuda.so.1\nlibnvidia-ml.so.1\n"), "{}", out.dump());
    assert!(!Path::new(&dir).exists(), "{dir} is left");
    assert_left_nothing(&tmp);
    // a command killed by a signal: 128 + the signal, as a shell says
    let out = sim(&tmp, &state, &["--", "sh", "-c", "kill -TERM $$"]);
    assert_eq!(out.status.code(), Some(128 + 15), "{}", out.dump());
    assert_left_nothing(&tmp);
    // a command that does not exist: 127; usage errors: 125
    let out = sim(&tmp, &state, &["--", "/nonexistent/program"]);
    assert_eq!(out.status.code(), Some(127), "{}", out.dump());
    assert_left_nothing(&tmp);
    let out = sim(&tmp, &state, &["--gpus", "17"]);
    assert_eq!(out.status.code(), Some(125), "{}", out.dump());
    assert!(out.stderr_text().starts_with("gpushim sim: --gpus \"17\": "), "{}", out.dump());
    // the default command is $SHELL
    let out = sim(&tmp, &state, &[]);
    assert!(out.status.success(), "{}", out.dump());
    assert_left_nothing(&tmp);
}

/// Two programs under one `gpushim sim` share the simulated GPUs: `gpushim ps` run there lists
/// both, and NVML's memory in use of the GPU (`gpushim metrics`) is what both hold.
#[test]
fn processes_under_one_sim_see_each_other() {
    let (tmp, state) = dirs();
    let marks = fresh_dir("sim-marks");
    let prog = program(Program::Driver(DriverPath::Link));
    let gpushim = cli();
    let script = format!(
        "G={g}; P={p}; M={m}
         $G run --memory-limit 1GiB -- $P alloc=mem:{a} touch=$M/a sleep=60000 >/dev/null & A=$!
         $G run --memory-limit 1GiB -- $P alloc=mem:{b} touch=$M/b sleep=60000 >/dev/null & B=$!
         n=0; while [ ! -e $M/a ] || [ ! -e $M/b ]; do n=$((n+1)); [ $n -gt 600 ] && break; sleep 0.05; done
         echo pids=$A,$B
         echo '--- ps'; $G ps
         echo '--- metrics'; $G metrics
         kill $A $B; wait",
        g = gpushim.display(),
        p = prog.display(),
        m = marks.display(),
        a = 64 * MIB,
        b = 32 * MIB
    );
    let out = sim(&tmp, &state, &["--", "sh", "-c", &script]);
    assert!(out.status.success(), "{}", out.dump());
    let text = out.stdout_text();
    let pids: Vec<String> = out.get("pids").split(',').map(str::to_string).collect();
    let ps = text.split("--- ps").nth(1).and_then(|s| s.split("--- metrics").next()).unwrap_or("");
    for pid in &pids {
        assert!(ps.contains(&format!("pid {pid} ")), "ps lists {pid}:\n{}", out.dump());
    }
    assert!(ps.contains("64 MiB in use") && ps.contains("32 MiB in use"), "{ps}");
    let metrics = text.split("--- metrics").nth(1).unwrap_or("");
    let gpu0 = metrics
        .lines()
        .find(|l| l.starts_with("gpushim_gpu_memory_used_bytes{gpu=\"0\""))
        .unwrap_or_else(|| panic!("no NVML figure of GPU 0:\n{metrics}"));
    let used: u64 = gpu0.rsplit(' ').next().unwrap().parse().unwrap();
    assert_eq!(used, 96 * MIB, "NVML shows what both processes hold: {gpu0}");
    assert_left_nothing(&tmp);
}

/// Without the simulator's libraries next to the command, it says what to build.
#[test]
fn sim_says_what_to_build() {
    let (tmp, state) = dirs();
    let alone = fresh_dir("sim-alone").join("gpushim");
    std::fs::copy(cli(), &alone).unwrap();
    let out = Run::new(&alone).without_sim().args(["sim", "--", "true"]).env("TMPDIR", &tmp).env("GPUSHIM_STATE_DIR", &state).run();
    assert_eq!(out.status.code(), Some(125), "{}", out.dump());
    assert!(
        out.stderr_text().contains("the simulated GPUs are not built: no libcuda.so in ")
            && out.stderr_text().contains("cargo build --release -p gpusim-cuda -p gpusim-nvml"),
        "{}",
        out.dump()
    );
    assert_left_nothing(&tmp);
}

/// SIGTERM to `gpushim sim` reaches the command, and the directory is removed.
#[test]
fn sim_passes_sigterm_on_and_cleans_up() {
    let (tmp, state) = dirs();
    shim_path();
    sim_library();
    nvml_sim_library();
    let mut child = std::process::Command::new(cli())
        .args(["sim", "--", "sleep", "60"])
        .env("TMPDIR", &tmp)
        .env("XDG_RUNTIME_DIR", "")
        .env("GPUSHIM_STATE_DIR", &state)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::fs::read_dir(&tmp).unwrap().next().is_none() {
        assert!(std::time::Instant::now() < deadline, "gpushim sim made no directory");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    // SAFETY: kill(2) on our child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{status:?}");
    assert_left_nothing(&tmp);
}

/// `gpushim sim ARGS…` started in the background (TMPDIR = `tmp`), stderr discarded.
fn spawn_sim(tmp: &Path, state: &Path, args: &[&str]) -> std::process::Child {
    shim_path();
    sim_library();
    nvml_sim_library();
    std::process::Command::new(cli())
        .arg("sim")
        .args(args)
        .env("TMPDIR", tmp)
        .env("XDG_RUNTIME_DIR", "")
        .env("GPUSHIM_CONFIG", "/dev/null")
        .env("GPUSHIM_STATE_DIR", state)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

fn wait_for(path: &Path) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !path.exists() {
        assert!(std::time::Instant::now() < deadline, "{} never appeared", path.display());
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

fn kill(child: &std::process::Child, signal: i32) {
    // SAFETY: kill(2) on our child.
    unsafe { libc::kill(child.id() as i32, signal) };
}

/// SIGTERM at any moment of `gpushim sim`'s start, the directory being made included, leaves
/// no directory behind.
#[test]
fn sim_stopped_at_once_leaves_nothing() {
    let (tmp, state) = dirs();
    for n in 0..24u64 {
        let mut child = spawn_sim(&tmp, &state, &["--", "true"]);
        std::thread::sleep(std::time::Duration::from_micros(n * 450));
        kill(&child, libc::SIGTERM);
        let _ = child.wait().unwrap();
        assert_left_nothing(&tmp);
    }
}

/// Other signals that would end `gpushim sim` (SIGUSR1), and SIGINT sent with kill, reach the
/// command; the directory is removed.
#[test]
fn sim_passes_other_signals_on() {
    let (tmp, state) = dirs();
    for (signal, name, status) in [(libc::SIGUSR1, "USR1", 3), (libc::SIGINT, "INT", 4), (libc::SIGQUIT, "QUIT", 5), (libc::SIGALRM, "ALRM", 6)] {
        let marks = fresh_dir("sim-signal-marks");
        // (bounded: a command left behind by a `gpushim sim` that did not pass the signal on ends)
        let script = format!(
            "trap 'touch {m}/got; exit {status}' {name}; touch {m}/ready; n=0; while [ $n -lt 1000 ]; do n=$((n+1)); sleep 0.02; done",
            m = marks.display()
        );
        let mut child = spawn_sim(&tmp, &state, &["--", "sh", "-c", &script]);
        wait_for(&marks.join("ready"));
        kill(&child, signal);
        let end = child.wait().unwrap();
        assert!(marks.join("got").exists(), "SIG{name} did not reach the command ({end:?})");
        assert_eq!(end.code(), Some(status), "SIG{name}: the command's status");
        assert_left_nothing(&tmp);
    }
}

/// A base directory another user could change is not used: one owned by another user, one
/// writable by the group; the command's private directory is elsewhere (/tmp), and removed.
#[test]
fn sim_uses_no_directory_another_user_can_change() {
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("sim_uses_no_directory_another_user_can_change: skipped (needs root)");
        return;
    }
    let (_, state) = dirs();
    let others = fresh_dir("sim-nobody");
    std::os::unix::fs::chown(&others, Some(65534), Some(65534)).unwrap();
    let group = fresh_dir("sim-group");
    std::fs::set_permissions(&group, std::fs::Permissions::from_mode(0o775)).unwrap();
    let inside = fresh_dir("sim-under-nobody");
    let below = inside.join("base");
    std::fs::create_dir(&below).unwrap();
    std::fs::set_permissions(&inside, std::fs::Permissions::from_mode(0o777)).unwrap();
    for base in [&others, &group, &below] {
        let out = sim(base, &state, &["--", "sh", "-c", "echo dir=${LD_LIBRARY_PATH%%:*}"]);
        assert!(out.status.success(), "{}", out.dump());
        let dir = out.get("dir").to_string();
        assert!(!dir.starts_with(&base.display().to_string()), "{base:?} was used: {}", out.dump());
        assert!(dir.starts_with("/tmp/gpushim-sim-"), "{}", out.dump());
        assert!(out.stderr_text().contains("gpushim sim: not using $TMPDIR ("), "it says why: {}", out.dump());
        assert!(!Path::new(&dir).exists(), "{dir} is left");
        assert_left_nothing(base);
    }
}
