//! The compute share's `mps` and `green` modes and `auto`'s choice (GPUSHIM_COMPUTE_MODE): the
//! MPS client variables a program finds after `cuInit`, and the green contexts the simulated
//! driver records. Each effect is also checked without the shim (absent), so the tests can fail.

mod common;

use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::OnceLock;

/// `tests/c/compute_modes.c`, compiled once (driver API, linked with `-lcuda`).
fn modes_program() -> PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let exe = work_dir().join("bin").join("compute_modes");
        std::fs::create_dir_all(exe.parent().unwrap()).unwrap();
        let out = std::process::Command::new(c_compiler())
            .args(["-std=gnu11", "-O1", "-Wall", "-Wextra"])
            .arg(format!("-I{}", cuda_deps(13).join("include").display()))
            .arg(workspace_root().join("tests/c/compute_modes.c"))
            .arg(format!("-L{}", sim_dir().display()))
            .args(["-Wl,--no-as-needed", "-lcuda", "-o"])
            .arg(&exe)
            .output()
            .expect("gcc");
        assert!(out.status.success(), "compiling compute_modes.c: {}", String::from_utf8_lossy(&out.stderr));
        exe
    })
    .clone()
}

fn run(env: &[(&str, &str)], green: bool, shim: bool) -> RunOutput {
    nvml_sim_library();
    let mut r = Run::new(modes_program()).env("GPUSIM_DEVICES", "2").envs(env).shim(shim);
    if green {
        r = r.arg("green");
    }
    let out = r.run();
    out.assert_completed();
    out
}

/// The MPS variables the program saw after cuInit, with the shim; without it, none.
fn mps_vars(env: &[(&str, &str)]) -> (String, String) {
    let bare = run(env, false, false);
    let preset = |k: &str| env.iter().find(|(n, _)| *n == k).map_or("unset", |(_, v)| *v).to_string();
    assert_eq!(bare.get("percentage"), preset("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "{}", bare.dump());
    assert_eq!(bare.get("pinned"), preset("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), "{}", bare.dump());
    let out = run(env, false, true);
    assert_eq!(out.num("init"), 0, "{}", out.dump());
    (out.get("percentage").to_string(), out.get("pinned").to_string())
}

#[test]
fn mps_sets_both_variables_before_cuinit() {
    let env = [
        ("GPUSHIM_COMPUTE_MODE", "mps"),
        ("GPUSHIM_COMPUTE_LIMIT", "30%"),
        ("GPUSHIM_MEMORY_LIMIT", "1GiB"),
        ("GPUSHIM_MEMORY_LIMIT_1", "1536MiB"),
    ];
    assert_eq!(mps_vars(&env), ("30".into(), "0=1024M,1=1536M".into()));
    // 25.5 % is 26 (rounded up), a fraction of the memory in whole MiB rounded down
    let env = [("GPUSHIM_COMPUTE_MODE", "mps"), ("GPUSHIM_COMPUTE_LIMIT", "0.255"), ("GPUSHIM_MEMORY_LIMIT", "10%"), ("GPUSIM_MEMORY", "1000MiB")];
    assert_eq!(mps_vars(&env), ("26".into(), "0=100M,1=100M".into()));
    // no memory limit: no pairs
    assert_eq!(mps_vars(&[("GPUSHIM_COMPUTE_MODE", "mps"), ("GPUSHIM_COMPUTE_LIMIT", "50%")]), ("50".into(), "unset".into()));
}

#[test]
fn mps_keeps_a_lower_percentage_already_set() {
    let base = [("GPUSHIM_COMPUTE_MODE", "mps"), ("GPUSHIM_COMPUTE_LIMIT", "30%")];
    let with = |pct: &'static str| [base[0], base[1], ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", pct)];
    assert_eq!(mps_vars(&with("20")).0, "20", "a client can only lower it");
    assert_eq!(mps_vars(&with("50")).0, "30");
}

#[test]
fn mps_uses_the_largest_per_device_limit_and_says_which_it_cannot_hold() {
    let env = [("GPUSHIM_COMPUTE_MODE", "mps"), ("GPUSHIM_COMPUTE_LIMIT_0", "20%"), ("GPUSHIM_COMPUTE_LIMIT_1", "60%")];
    assert_eq!(mps_vars(&env).0, "60");
    let out = run(&[env[0], env[1], env[2], ("GPUSHIM_LOG", "info")], false, true);
    let lines = out.gpushim_lines_with("MPS gives a process one share");
    assert_eq!(lines.len(), 1, "{}", out.dump());
    assert!(lines[0].contains("device 0") && !lines[0].contains("device 1") && lines[0].contains("held by gpushim's duty pacer"), "{}", out.dump());
}

#[test]
fn mps_memory_pairs_speak_the_drivers_ordinals_after_hiding() {
    // program device 0 is physical GPU 2 (4 GiB): after the shim's CUDA_VISIBLE_DEVICES the
    // driver calls it 0, and half of it is 2048 MiB
    let env = [
        ("GPUSIM_DEVICES", "3"),
        ("GPUSIM_MEMORY", "16GiB,8GiB,4GiB"),
        ("GPUSHIM_VISIBLE_DEVICES", "2"),
        ("GPUSHIM_COMPUTE_MODE", "mps"),
        ("GPUSHIM_COMPUTE_LIMIT", "40%"),
        ("GPUSHIM_MEMORY_LIMIT", "50%"),
    ];
    assert_eq!(mps_vars(&env), ("40".into(), "0=2048M".into()));
    // two devices in the program's order 2,0: device 1 is physical 0 (16 GiB)
    let env = [env[0], env[1], ("GPUSHIM_VISIBLE_DEVICES", "2,0"), env[3], env[4], ("GPUSHIM_MEMORY_LIMIT_1", "25%")];
    assert_eq!(mps_vars(&env), ("40".into(), "1=4096M".into()));
}

/// A pipe directory of this test's own, mode `mode`, with a listening `control` socket.
fn pipe_dir(name: &str, mode: u32) -> (PathBuf, std::os::unix::net::UnixListener) {
    let dir = fresh_dir(name);
    let listener = std::os::unix::net::UnixListener::bind(dir.join("control")).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
    (dir, listener)
}

#[test]
fn auto_is_mps_with_a_reachable_daemon_in_a_private_directory() {
    // (only a daemon of root's counts: the test's socket is root's only when it runs as root)
    if skipped_without_root("auto_is_mps_with_a_reachable_daemon_in_a_private_directory") {
        return;
    }
    let (dir, _listener) = pipe_dir("mps-pipe-private", 0o700);
    let d = dir.to_str().unwrap();
    let env = [("GPUSHIM_COMPUTE_LIMIT", "30%"), ("CUDA_MPS_PIPE_DIRECTORY", d), ("GPUSHIM_LOG", "info")];
    assert_eq!(mps_vars(&env).0, "30");
    let out = run(&env, false, true);
    assert_eq!(out.gpushim_lines_with("GPUSHIM_COMPUTE_MODE=auto: mps").len(), 1, "{}", out.dump());
}

#[test]
fn auto_is_duty_with_a_socket_others_could_have_planted_or_none() {
    let (dir, _listener) = pipe_dir("mps-pipe-open", 0o777);
    let d = dir.to_str().unwrap();
    let env = [("GPUSHIM_COMPUTE_LIMIT", "30%"), ("CUDA_MPS_PIPE_DIRECTORY", d), ("GPUSHIM_LOG", "info")];
    assert_eq!(mps_vars(&env).0, "unset");
    let out = run(&env, false, true);
    let why = out.gpushim_lines_with("GPUSHIM_COMPUTE_MODE=auto: duty");
    assert!(why.len() == 1 && why[0].contains("writable by others"), "{}", out.dump());

    let empty = fresh_dir("mps-pipe-empty");
    let env = [("GPUSHIM_COMPUTE_LIMIT", "30%"), ("CUDA_MPS_PIPE_DIRECTORY", empty.to_str().unwrap())];
    assert_eq!(mps_vars(&env).0, "unset");
    // explicitly duty: never the MPS variables, even with a daemon there
    let (dir, _listener) = pipe_dir("mps-pipe-duty", 0o700);
    let env = [("GPUSHIM_COMPUTE_LIMIT", "30%"), ("GPUSHIM_COMPUTE_MODE", "duty"), ("CUDA_MPS_PIPE_DIRECTORY", dir.to_str().unwrap())];
    assert_eq!(mps_vars(&env).0, "unset");
}

const GREEN: [(&str, &str); 2] = [("GPUSHIM_COMPUTE_MODE", "green"), ("GPUSHIM_COMPUTE_LIMIT", "30%")];

#[test]
fn green_gives_the_program_a_green_context_with_its_share_of_sms() {
    let bare = run(&GREEN, true, false);
    assert_eq!((bare.num("retain"), bare.num("sms")), (0, 132), "{}", bare.dump());
    assert!(bare.report().green_contexts.is_empty());
    // 30 % of 132 SMs is 39.6: rounded down to the 8-SM partitions of compute capability 9.0
    let out = run(&GREEN, true, true);
    for (key, want) in [("retain", 0), ("resource", 0), ("sms", 32), ("alloc", 0), ("same", 1), ("free", 0), ("release", 0)] {
        assert_eq!(out.num(key), want, "{key}\n{}", out.dump());
    }
    assert_eq!(out.report().green_contexts, vec![(0, 32)], "{}", out.dump());
    assert_eq!(out.report().device(0).used, 0, "the last release freed everything");
    // 5 %: at least one partition
    let out = run(&[GREEN[0], ("GPUSHIM_COMPUTE_LIMIT", "5%")], true, true);
    assert_eq!((out.num("sms"), out.report().green_contexts.clone()), (8, vec![(0, 8)]), "{}", out.dump());
}

#[test]
fn green_refuses_a_driver_older_than_12_4() {
    let env = [GREEN[0], GREEN[1], ("GPUSIM_DRIVER_VERSION", "12030")];
    assert_eq!(run(&env, true, false).num("init"), 0);
    let out = run(&env, true, true);
    assert_eq!(out.num("init"), 801, "CUDA_ERROR_NOT_SUPPORTED\n{}", out.dump());
    let lines = out.gpushim_lines();
    assert_eq!(lines.len(), 1, "{}", out.dump());
    assert!(lines[0].contains("GPUSHIM_COMPUTE_MODE=green") && lines[0].contains("12.4"), "{}", out.dump());
}

#[test]
fn green_refuses_cleanly_when_the_driver_cannot_make_one() {
    let env = [GREEN[0], GREEN[1], ("GPUSIM_FAIL", "cuGreenCtxCreate=801")];
    let out = run(&env, true, true);
    assert_eq!(out.num("retain"), 801, "{}", out.dump());
    let lines = out.gpushim_lines();
    assert!(lines.len() == 1 && lines[0].contains("GPUSHIM_COMPUTE_MODE=green") && lines[0].contains("cuGreenCtxCreate"), "{}", out.dump());
    assert!(out.report().green_contexts.is_empty());
}

#[test]
fn the_cuda_runtime_allocates_and_launches_in_green_contexts() {
    nvml_sim_library();
    let runtime = |shim: bool| {
        let out = Run::program(Program::RtLaunch).env("GPUSIM_DEVICES", "2").envs(&GREEN).shim(shim).run();
        out.assert_completed();
        for d in 0..2 {
            assert_eq!(out.num(&format!("d{d}.rc")), 0, "cudaLaunchKernel on device {d}\n{}", out.dump());
        }
        assert_eq!(out.report().launches.get("vecAdd"), Some(&3), "{}", out.dump());
        out
    };
    assert!(runtime(false).report().green_contexts.is_empty());
    let out = runtime(true);
    assert_eq!(out.report().green_contexts, vec![(0, 32), (1, 32)], "{}", out.dump());
    assert!(out.gpushim_lines().is_empty(), "{}", out.dump());
}

/// `gpushim check` says which mode enforces the compute limit, resolved as the library does.
#[test]
fn check_names_the_compute_mode() {
    if skip_unless_target_exec("a program of the target starts another (gpushim check's probe, gpushim run)") {
        return;
    }
    shim_path();
    nvml_sim_library();
    let check = |env: &[(&str, &str)]| {
        let out = Run::new(env!("CARGO_BIN_EXE_gpushim")).arg("check").env("GPUSHIM_CONFIG", "/dev/null").env("GPUSIM_DEVICES", "2").envs(env).run();
        assert!(out.status.success(), "{}", out.dump());
        out.stdout_text().lines().filter(|l| l.starts_with("compute mode:")).map(str::to_string).collect::<Vec<_>>()
    };
    assert!(check(&[]).is_empty(), "no compute limit, no line");
    assert_eq!(check(&GREEN), ["compute mode: green (environment variable GPUSHIM_COMPUTE_MODE)"]);
    let (dir, _listener) = pipe_dir("mps-pipe-check", 0o700);
    let d = dir.to_str().unwrap();
    assert_eq!(
        check(&[("GPUSHIM_COMPUTE_LIMIT", "30%"), ("CUDA_MPS_PIPE_DIRECTORY", d)]),
        [format!("compute mode: mps (auto: an MPS control daemon is reachable at {d}/control)")]
    );
    let empty = fresh_dir("mps-pipe-check-empty");
    let lines = check(&[("GPUSHIM_COMPUTE_LIMIT", "30%"), ("CUDA_MPS_PIPE_DIRECTORY", empty.to_str().unwrap())]);
    assert!(lines.len() == 1 && lines[0].starts_with("compute mode: duty (auto: no usable MPS control daemon: "), "{lines:?}");
}
