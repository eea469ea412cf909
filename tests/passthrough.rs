//! Processes that never touch CUDA run exactly as without the shim — same stdout, stderr and
//! status byte for byte, even with a bad configuration — and never map libcuda.

mod common;

use common::*;

/// Settings a CUDA process would be refused with, or that make gpushim talkative.
const ENVS: &[&[(&str, &str)]] = &[
    &[],
    &[("GPUSHIM_MEMORY_LIMIT", "4GiB")],
    &[("GPUSHIM_MEMORY_LIMIT", "4 gigs")],
    &[("GPUSHIM_CONFIG", "/nonexistent/gpushim.toml")],
    &[
        ("GPUSHIM_MEMORY_LIMIT_1", "-1"),
        ("CUDA_DEVICE_MEMORY_LIMIT", "08x"),
    ],
];

fn commands() -> Vec<Vec<String>> {
    let dir = workspace_root().join("tests");
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    vec![
        s(&["/bin/echo", "hello", "world"]),
        s(&["sh", "-c", "echo out; echo err >&2; exit 3"]),
        s(&["python3", "-c", "print(1)"]),
        s(&[
            "python3",
            "-c",
            "import sys; sys.stderr.write('e\\n'); sys.exit(5)",
        ]),
        vec!["ls".into(), "-la".into(), dir.to_str().unwrap().into()],
        s(&["sh", "-c", "env | grep -c ^GPUSHIM_ || true"]),
    ]
}

fn which(cmd: &str) -> String {
    if cmd.contains('/') {
        return cmd.to_string();
    }
    let out = std::process::Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn run(cmd: &[String], env: &[(&str, &str)], shim: bool) -> RunOutput {
    Run::new(which(&cmd[0]))
        .args(&cmd[1..])
        .envs(env)
        .shim(shim)
        .run()
}

#[test]
fn non_cuda_processes_are_unchanged() {
    if skip_emulated("runs host programs (echo, sh, python3, ls) with the target's library preloaded") {
        return;
    }
    for cmd in commands() {
        for env in ENVS {
            let plain = run(&cmd, env, false);
            let shimmed = run(&cmd, env, true);
            assert_eq!(
                shimmed.status.code(),
                plain.status.code(),
                "{cmd:?} {env:?}\n{}",
                shimmed.dump()
            );
            assert_eq!(
                shimmed.stdout,
                plain.stdout,
                "{cmd:?} {env:?}: stdout differs\n{}\n{}",
                plain.dump(),
                shimmed.dump()
            );
            assert_eq!(
                shimmed.stderr,
                plain.stderr,
                "{cmd:?} {env:?}: stderr differs\n{}\n{}",
                plain.dump(),
                shimmed.dump()
            );
            assert!(
                shimmed.report.is_none(),
                "{cmd:?} loaded the (simulated) driver\n{}",
                shimmed.dump()
            );
        }
    }
}

fn maps_of(cmd: &[&str], env: &[(&str, &str)]) -> String {
    let out = Run::new(which(cmd[0]))
        .args(&cmd[1..])
        .envs(env)
        .shim(true)
        .run();
    assert!(out.status.success(), "{}", out.dump());
    out.stdout_text()
}

#[test]
fn non_cuda_processes_never_map_libcuda() {
    if skip_emulated("runs host programs (echo, sh, python3, ls) with the target's library preloaded") {
        return;
    }
    let commands: [&[&str]; 2] = [
        &["python3", "-c", "print(open('/proc/self/maps').read())"],
        &["sh", "-c", "cat /proc/$$/maps"],
    ];
    for cmd in commands {
        for env in ENVS {
            let maps = maps_of(cmd, env);
            assert!(
                maps.contains("libgpushim.so"),
                "{cmd:?}: the shim was not even loaded:\n{maps}"
            );
            assert!(
                !maps.contains("libcuda"),
                "{cmd:?} {env:?} mapped libcuda:\n{maps}"
            );
        }
    }
}
