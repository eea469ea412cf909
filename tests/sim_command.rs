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
    // the node's state is in the private directory (0700); first on LD_LIBRARY_PATH is the
    // persistent directory of soname links beside the libraries, never a temporary one (a
    // process left running after sim could load a library from a directory re-made there)
    let script = "d=${GPUSIM_NODE_STATE%/*}; echo dir=$d; stat -c mode=%a $d; l=${LD_LIBRARY_PATH%%:*}; echo lib=$l; \
                  stat -c libmode=%a $l; readlink $l/libcuda.so.1 $l/libnvidia-ml.so.1; exit 7";
    let out = sim(&tmp, &state, &["--", "sh", "-c", script]);
    assert_eq!(out.status.code(), Some(7), "{}", out.dump());
    let dir = out.get("dir").to_string();
    assert!(dir.starts_with(&tmp.display().to_string()), "{}", out.dump());
    assert_eq!(out.get("mode"), "700", "{}", out.dump());
    let libraries = std::fs::canonicalize(sim_library()).unwrap().parent().unwrap().to_path_buf();
    assert_eq!(out.get("lib"), libraries.join("gpusim-sonames").display().to_string(), "{}", out.dump());
    assert_eq!(out.get("libmode"), "755", "{}", out.dump());
    assert!(out.stdout_text().contains("../libcuda.so\n../libnvidia_ml.so\n"), "{}", out.dump());
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
    let mut child = target_command(cli())
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
    target_command(cli())
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
    if skipped_without_root("sim_uses_no_directory_another_user_can_change") {
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
        let out = sim(base, &state, &["--", "sh", "-c", "echo dir=${GPUSIM_NODE_STATE%/*}"]);
        assert!(out.status.success(), "{}", out.dump());
        let dir = out.get("dir").to_string();
        assert!(!dir.starts_with(&base.display().to_string()), "{base:?} was used: {}", out.dump());
        assert!(dir.starts_with("/tmp/gpushim-sim-"), "{}", out.dump());
        assert!(out.stderr_text().contains("gpushim sim: not using $TMPDIR ("), "it says why: {}", out.dump());
        assert!(!Path::new(&dir).exists(), "{dir} is left");
        assert_left_nothing(base);
    }
}

/// Signals ignored when `gpushim sim` starts (nohup, trap '') stay ignored for the command.
#[test]
fn ignored_signals_stay_ignored() {
    let (tmp, state) = dirs();
    sim_library();
    nvml_sim_library();
    let cmd = format!("trap \"\" HUP INT QUIT; exec {} sim -- grep SigIgn /proc/self/status", cli().display());
    let out = Run::new("sh").without_sim().args(["-c", &cmd]).env("TMPDIR", &tmp).env("XDG_RUNTIME_DIR", "").env("GPUSHIM_STATE_DIR", &state).run();
    assert!(out.status.success(), "{}", out.dump());
    let line = out.stdout_text().lines().find_map(|l| l.strip_prefix("SigIgn:").map(str::to_string));
    let mask = u64::from_str_radix(line.unwrap_or_default().trim(), 16).unwrap();
    assert_eq!(mask & 7, 7, "SIGHUP, SIGINT and SIGQUIT ignored: {}", out.dump());
    assert_left_nothing(&tmp);
}

/// An inherited SIGCHLD = SIG_IGN does not lose the command's status.
#[test]
fn ignored_sigchld_keeps_the_status() {
    let (tmp, state) = dirs();
    sim_library();
    nvml_sim_library();
    let py = format!(
        "import signal,os; signal.signal(signal.SIGCHLD, signal.SIG_IGN); os.execv({:?},[\"gpushim\",\"sim\",\"--\",\"sh\",\"-c\",\"exit 3\"])",
        cli().display().to_string()
    );
    let out = Run::new("python3").without_sim().args(["-c", &py]).env("TMPDIR", &tmp).env("XDG_RUNTIME_DIR", "").env("GPUSHIM_STATE_DIR", &state).run();
    assert_eq!(out.status.code(), Some(3), "{}", out.dump());
    assert_left_nothing(&tmp);
}

/// A closed stderr (a broken pipe) does not end `gpushim sim` (nor panic) while it says why it
/// passes a place over, nor keep it from cleaning up.
#[test]
fn a_closed_stderr_is_no_failure() {
    let (tmp, state) = dirs();
    sim_library();
    nvml_sim_library();
    let mut fds = [0; 2];
    // SAFETY: pipe(2) fills two descriptors; the reading end is closed at once.
    unsafe {
        assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
        libc::close(fds[0]);
    }
    // SAFETY: the writing end, owned from here by the Stdio.
    let stderr = unsafe { <std::process::Stdio as std::os::fd::FromRawFd>::from_raw_fd(fds[1]) };
    let status = target_command(cli())
        .args(["sim", "--", "true"])
        .env("TMPDIR", &tmp)
        .env("XDG_RUNTIME_DIR", "/nonexistent")
        .env("GPUSHIM_STATE_DIR", &state)
        .stderr(stderr)
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert_left_nothing(&tmp);
}

/// A copy of gpushim and the simulator's libraries in a fresh directory `name`.
fn copied_tree(name: &str) -> PathBuf {
    let dir = fresh_dir(name);
    std::fs::copy(cli(), dir.join("gpushim")).unwrap();
    std::fs::copy(sim_library(), dir.join("libcuda.so")).unwrap();
    std::fs::copy(nvml_sim_library(), dir.join("libnvidia_ml.so")).unwrap();
    dir
}

fn sim_from(tree: &Path, tmp: &Path, state: &Path) -> RunOutput {
    Run::new(tree.join("gpushim"))
        .without_sim()
        .args(["sim", "--", "sh", "-c", "echo lib=${LD_LIBRARY_PATH%%:*}"])
        .env("TMPDIR", tmp)
        .env("XDG_RUNTIME_DIR", "")
        .env("GPUSHIM_STATE_DIR", state)
        .run()
}

/// The soname directory is made beside the libraries, and one that is not as sim makes it (a
/// link elsewhere, writable by others, a link itself) is refused with what to do.
#[test]
fn the_soname_directory_is_checked() {
    use std::os::unix::fs::PermissionsExt;
    let (tmp, state) = dirs();
    let tree = std::fs::canonicalize(copied_tree("sim-tree")).unwrap();
    let sonames = tree.join("gpusim-sonames");
    let out = sim_from(&tree, &tmp, &state);
    assert!(out.status.success(), "{}", out.dump());
    assert_eq!(out.get("lib"), sonames.display().to_string(), "{}", out.dump());
    assert_eq!(std::fs::read_link(sonames.join("libcuda.so.1")).unwrap(), Path::new("../libcuda.so"));
    // made again when missing; used as it is when right
    let out = sim_from(&tree, &tmp, &state);
    assert!(out.status.success(), "{}", out.dump());

    std::fs::remove_file(sonames.join("libcuda.so.1")).unwrap();
    std::os::unix::fs::symlink("/tmp/libcuda.so", sonames.join("libcuda.so.1")).unwrap();
    let out = sim_from(&tree, &tmp, &state);
    assert_eq!(out.status.code(), Some(125), "{}", out.dump());
    assert!(out.stderr_text().contains("is not a link to ../libcuda.so; remove"), "{}", out.dump());

    std::fs::remove_dir_all(&sonames).unwrap();
    std::fs::create_dir(&sonames).unwrap();
    std::fs::set_permissions(&sonames, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = sim_from(&tree, &tmp, &state);
    assert_eq!(out.status.code(), Some(125), "{}", out.dump());
    assert!(out.stderr_text().contains("writable by others; remove it"), "{}", out.dump());

    std::fs::remove_dir_all(&sonames).unwrap();
    let elsewhere = fresh_dir("sim-tree-elsewhere");
    std::os::unix::fs::symlink(&elsewhere, &sonames).unwrap();
    let out = sim_from(&tree, &tmp, &state);
    assert_eq!(out.status.code(), Some(125), "{}", out.dump());
    assert!(out.stderr_text().contains("a link or not a directory"), "{}", out.dump());
    assert_left_nothing(&tmp);
}

/// A path LD_LIBRARY_PATH cannot hold (`:`, `;`, `$`): the libraries' directory is refused,
/// and a base for the private directory passed over.
#[test]
fn paths_a_search_path_cannot_hold_are_refused() {
    let (_, state) = dirs();
    let tmp = fresh_dir("sim-tmp:colon");
    let tree = std::fs::canonicalize(copied_tree("sim-tree$x")).unwrap();
    let out = sim_from(&tree, &tmp, &state);
    assert_eq!(out.status.code(), Some(125), "{}", out.dump());
    assert!(out.stderr_text().contains("has a '$', which LD_LIBRARY_PATH cannot hold"), "{}", out.dump());
    let out = sim(&tmp, &state, &["--", "sh", "-c", "echo dir=${GPUSIM_NODE_STATE%/*}"]);
    assert!(out.status.success(), "{}", out.dump());
    assert!(out.stderr_text().contains("not using $TMPDIR (") && out.stderr_text().contains("has a ':'"), "{}", out.dump());
    assert!(!out.get("dir").contains(':'), "{}", out.dump());
    assert_left_nothing(&tmp);
}

/// A base under a directory one may only search (root's, 0711) is used: the walk opens the
/// directories on its path O_PATH. (As nobody: root can read any directory.)
#[test]
fn a_search_only_ancestor_is_no_obstacle() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    if skipped_without_root("a_search_only_ancestor_is_no_obstacle") {
        return;
    }
    sim_library();
    nvml_sim_library();
    let outer = fresh_dir("sim-711");
    let base = outer.join("nobody");
    std::fs::create_dir(&base).unwrap();
    std::os::unix::fs::chown(&base, Some(65534), Some(65534)).unwrap();
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::set_permissions(&outer, std::fs::Permissions::from_mode(0o711)).unwrap();
    let out = target_command(cli())
        .args(["sim", "--", "sh", "-c", "echo dir=${GPUSIM_NODE_STATE%/*}"])
        .env("TMPDIR", &base)
        .env("XDG_RUNTIME_DIR", "")
        .env("GPUSHIM_STATE_DIR", &base)
        .env("GPUSHIM_CONFIG", "/dev/null")
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains(&format!("dir={}/gpushim-sim-", base.display())), "{stdout}{stderr}");
    assert!(!stderr.contains("not using $TMPDIR"), "{stderr}");
}

/// Where the soname directory is missing and cannot be made (the libraries in a directory the
/// user cannot write), `gpushim sim` says what to do.
#[test]
fn an_unmakeable_soname_directory_says_what_to_do() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    if skipped_without_root("an_unmakeable_soname_directory_says_what_to_do") {
        return;
    }
    let tree = std::fs::canonicalize(copied_tree("sim-tree-root")).unwrap();
    std::fs::set_permissions(&tree, std::fs::Permissions::from_mode(0o755)).unwrap();
    let base = fresh_dir("sim-tmp-nobody");
    std::os::unix::fs::chown(&base, Some(65534), Some(65534)).unwrap();
    let out = target_command(tree.join("gpushim"))
        .args(["sim", "--", "true"])
        .env("TMPDIR", &base)
        .env("XDG_RUNTIME_DIR", "")
        .env("GPUSHIM_STATE_DIR", &base)
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(stderr.contains(&format!("cannot make {}/gpusim-sonames: ", tree.display())), "{stderr}");
    assert!(stderr.contains("have it made once by a user who can write"), "{stderr}");
}
