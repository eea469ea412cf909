//! Deploying gpushim: the container entrypoint (`scripts/entrypoint.sh`), the installer
//! (`scripts/install.sh`) and the examples in `config/` (`Dockerfile`, `kubernetes.yaml`).
//!
//! The entrypoint runs the driver-API program (`tests/c/drvapi.c`, linked with `-lcuda`) on the
//! simulated driver (one 1 GiB device): under the entrypoint the program sees the limit
//! (`cuDeviceTotalMem` = the limit, an over-limit `cuMemAlloc` refused with 2); the same command
//! without it gets the whole device, so each test can fail. The installer puts the built files
//! into a scratch prefix and takes them out again.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use common::*;

const PHYSICAL: u64 = GIB;
const LIMIT: u64 = 64 * MIB;
const OVER_LIMIT: u64 = 96 * MIB;

fn entrypoint() -> PathBuf {
    workspace_root().join("scripts/entrypoint.sh")
}

fn install_script() -> PathBuf {
    workspace_root().join("scripts/install.sh")
}

fn driver_program() -> PathBuf {
    program(Program::Driver(DriverPath::Link))
}

/// The program's arguments: op1 `totalmem` (op1.total0), op2 an over-limit `cuMemAlloc`.
fn probe_args() -> Vec<String> {
    vec!["totalmem".into(), format!("alloc=mem:{OVER_LIMIT}")]
}

/// `cmd …` on the simulator (1 device of 1 GiB) with `GPUSHIM_MEMORY_LIMIT` = 64 MiB; `cmd`
/// is the entrypoint (through `sh`, or run directly) followed by the program, or the program.
fn limited(cmd: Run) -> Run {
    cmd.env("GPUSIM_DEVICES", "1")
        .env("GPUSIM_MEMORY", "1GiB")
        .env("GPUSHIM_MEMORY_LIMIT", "64MiB")
}

/// `sh scripts/entrypoint.sh PROGRAM totalmem alloc=…` (library not yet named).
fn via_entrypoint() -> Run {
    limited(
        Run::new("sh")
            .arg(entrypoint())
            .arg(driver_program())
            .args(probe_args()),
    )
}

/// The program saw the limit: total = 64 MiB, the 96 MiB allocation refused, one warning.
fn assert_limited(out: &RunOutput, what: &str) {
    out.assert_completed();
    out.assert_num("init.rc", 0, what);
    out.assert_u64("op1.total0", LIMIT, what);
    out.assert_num("op2.rc", OOM, what);
    assert_eq!(
        out.warn_lines().len(),
        1,
        "{what}: one refusal\n{}",
        out.dump()
    );
}

/// The program ran without the shim: the whole device, the allocation granted.
fn assert_unlimited(out: &RunOutput, what: &str) {
    out.assert_completed();
    out.assert_num("init.rc", 0, what);
    out.assert_u64("op1.total0", PHYSICAL, what);
    out.assert_num("op2.rc", 0, what);
    assert!(
        out.gpushim_lines().is_empty(),
        "{what}: gpushim output\n{}",
        out.dump()
    );
}

/// The exit status (panics on a signal).
fn code(out: &RunOutput) -> i32 {
    out.status
        .code()
        .unwrap_or_else(|| panic!("killed by a signal\n{}", out.dump()))
}

/// The lines of stderr that the entrypoint printed.
fn entrypoint_lines(out: &RunOutput) -> Vec<String> {
    out.stderr_text()
        .lines()
        .filter(|l| l.starts_with("gpushim-entrypoint:"))
        .map(str::to_string)
        .collect()
}

/// `sh -c 'echo "preload=$LD_PRELOAD"'` as the entrypoint's command.
fn print_preload(run: Run) -> Run {
    run.arg("sh")
        .arg("-c")
        .arg("echo \"preload=$LD_PRELOAD\"; echo done=1")
}

// ---------------------------------------------------------------------------------------
// The entrypoint
// ---------------------------------------------------------------------------------------

#[test]
fn entrypoint_applies_the_limit() {
    let out = via_entrypoint().env("GPUSHIM_LIBRARY", shim_path()).run();
    assert_limited(&out, "under the entrypoint");
    assert!(
        entrypoint_lines(&out).is_empty(),
        "entrypoint output\n{}",
        out.dump()
    );

    // the same command without the entrypoint: no limit
    let plain = limited(Run::new(driver_program()).args(probe_args())).run();
    assert_unlimited(&plain, "without the entrypoint");
}

#[test]
fn entrypoint_passes_arguments_and_exit_status() {
    let out = Run::new("sh")
        .arg(entrypoint())
        .args([
            "sh",
            "-c",
            "printf 'arg=%s\\n' \"$@\"; exit 7",
            "zero",
            "a b",
            "",
            "*",
        ])
        .env("GPUSHIM_LIBRARY", shim_path())
        .without_sim()
        .run();
    assert_eq!(code(&out), 7, "the command's exit status\n{}", out.dump());
    assert_eq!(
        out.stdout_text(),
        "arg=a b\narg=\narg=*\n",
        "{}",
        out.dump()
    );
}

#[test]
fn entrypoint_without_arguments_is_a_usage_error() {
    let out = Run::new("sh").arg(entrypoint()).without_sim().run();
    assert_eq!(code(&out), 2, "{}", out.dump());
    assert!(out.stdout.is_empty(), "{}", out.dump());
    assert!(
        out.stderr_text().starts_with("usage: gpushim-entrypoint"),
        "{}",
        out.dump()
    );
}

#[test]
fn entrypoint_refuses_a_missing_library() {
    let out = print_preload(Run::new("sh").arg(entrypoint()))
        .env("GPUSHIM_LIBRARY", "/nonexistent/libgpushim.so")
        .without_sim()
        .run();
    assert_eq!(code(&out), 127, "{}", out.dump());
    assert!(out.stdout.is_empty(), "the command ran\n{}", out.dump());
    let lines = entrypoint_lines(&out);
    assert_eq!(lines.len(), 1, "one error line\n{}", out.dump());
    assert!(
        lines[0].contains("GPUSHIM_LIBRARY=/nonexistent/libgpushim.so"),
        "the line names the setting\n{}",
        out.dump()
    );

    // found nowhere: the entrypoint alone in a directory without ../lib (only meaningful where
    // no libgpushim.so is installed system-wide)
    if ["/usr/local/lib/libgpushim.so", "/usr/lib/libgpushim.so"]
        .iter()
        .any(|p| Path::new(p).exists())
    {
        eprintln!("skipped the not-found case: libgpushim.so is installed system-wide here");
        return;
    }
    let dir = scratch_path("lonely/bin");
    std::fs::create_dir_all(&dir).unwrap();
    let lonely = dir.join("gpushim-entrypoint");
    std::fs::copy(entrypoint(), &lonely).unwrap();
    let out = print_preload(Run::new("sh").arg(&lonely))
        .without_sim()
        .run();
    assert_eq!(code(&out), 127, "{}", out.dump());
    assert!(out.stdout.is_empty(), "the command ran\n{}", out.dump());
    let lines = entrypoint_lines(&out);
    assert_eq!(lines.len(), 1, "one error line\n{}", out.dump());
    assert!(
        lines[0].contains("cannot find libgpushim.so") && lines[0].contains("GPUSHIM_LIBRARY="),
        "the line says what to set\n{}",
        out.dump()
    );
}

#[test]
fn entrypoint_disable_runs_without_the_shim() {
    for value in ["1", " Yes ", "TRUE"] {
        let out = via_entrypoint()
            .env("GPUSHIM_LIBRARY", shim_path())
            .env("GPUSHIM_DISABLE", value)
            .run();
        assert_unlimited(&out, &format!("GPUSHIM_DISABLE={value:?}"));
        let out = print_preload(Run::new("sh").arg(entrypoint()))
            .env("GPUSHIM_LIBRARY", shim_path())
            .env("GPUSHIM_DISABLE", value)
            .without_sim()
            .run();
        out.assert_str("preload", "", "nothing preloaded");
    }
    // a disabled entrypoint does not even need the library
    let out = via_entrypoint()
        .env("GPUSHIM_LIBRARY", "/nonexistent/libgpushim.so")
        .env("GPUSHIM_DISABLE", "1")
        .run();
    assert_unlimited(&out, "GPUSHIM_DISABLE=1, no library");
    // any other value leaves it on
    for value in ["0", "no", "off"] {
        let out = via_entrypoint()
            .env("GPUSHIM_LIBRARY", shim_path())
            .env("GPUSHIM_DISABLE", value)
            .run();
        assert_limited(&out, &format!("GPUSHIM_DISABLE={value:?}"));
    }
}

#[test]
fn entrypoint_puts_the_library_first_in_ld_preload_once() {
    let shim = shim_path();
    let shim_s = shim.display().to_string();
    // the same file by another spelling: <profile>/../<profile name>/libgpushim.so
    let profile = profile_dir();
    let other_spelling = profile
        .join("..")
        .join(profile.file_name().unwrap())
        .join("libgpushim.so")
        .display()
        .to_string();
    let cases: [(Option<String>, String); 5] = [
        (None, shim_s.clone()),
        (Some(shim_s.clone()), shim_s.clone()),
        (Some("libc.so.6".into()), format!("{shim_s}:libc.so.6")),
        (
            Some(format!("libc.so.6 {shim_s}:{other_spelling}  libm.so.6")),
            format!("{shim_s}:libc.so.6:libm.so.6"),
        ),
        (Some(format!(":{shim_s}: ")), shim_s.clone()),
    ];
    for (before, want) in cases {
        let mut run = print_preload(Run::new("sh").arg(entrypoint()))
            .env("GPUSHIM_LIBRARY", &shim)
            .without_sim();
        if let Some(b) = &before {
            run = run.env("LD_PRELOAD", b);
        }
        let out = run.run();
        assert!(out.status.success(), "{}", out.dump());
        out.assert_str("preload", &want, &format!("LD_PRELOAD={before:?}"));
    }

    // a relative GPUSHIM_LIBRARY becomes absolute (run from the library's directory)
    let script = format!(
        "cd '{}' && exec sh '{}' sh -c 'echo \"preload=$LD_PRELOAD\"; echo done=1'",
        shim.parent().unwrap().display(),
        entrypoint().display()
    );
    let out = Run::new("sh")
        .arg("-c")
        .arg(script)
        .env("GPUSHIM_LIBRARY", "./libgpushim.so")
        .without_sim()
        .run();
    assert!(out.status.success(), "{}", out.dump());
    let got = PathBuf::from(out.get("preload"));
    assert!(got.is_absolute(), "{}", out.dump());
    assert_eq!(
        std::fs::canonicalize(&got).unwrap(),
        std::fs::canonicalize(&shim).unwrap(),
        "{}",
        out.dump()
    );
}

// ---------------------------------------------------------------------------------------
// The installer
// ---------------------------------------------------------------------------------------

/// The files install.sh puts under PREFIX: (installed path, source, mode).
fn installed_files(target: &Path) -> Vec<(&'static str, PathBuf, u32)> {
    let root = workspace_root();
    vec![
        (
            "lib/libgpushim.so",
            target.join("release/libgpushim.so"),
            0o755,
        ),
        ("bin/gpushim", target.join("release/gpushim"), 0o755),
        (
            "bin/gpushim-entrypoint",
            root.join("scripts/entrypoint.sh"),
            0o755,
        ),
        ("include/gpushim.h", root.join("include/gpushim.h"), 0o644),
        (
            "share/gpushim/gpushim.toml",
            root.join("config/gpushim.toml"),
            0o644,
        ),
    ]
}

/// `bash scripts/install.sh ARGS…`.
fn install(args: &[&dyn AsRef<std::ffi::OsStr>]) -> RunOutput {
    let mut run = Run::new("bash").arg(install_script()).without_sim();
    for a in args {
        run = run.arg(a.as_ref());
    }
    run.run()
}

/// The target directory to install from: the one holding this test's profile directory when
/// it is `release` and holds the `gpushim` tool; else a scratch copy with the library (and, if
/// the tool is not built yet, a stand-in for it, whose checks are then skipped).
fn target_to_install() -> (PathBuf, bool) {
    let profile = profile_dir();
    let tool = profile.join("gpushim");
    if profile.file_name().is_some_and(|n| n == "release") && tool.is_file() {
        return (profile.parent().unwrap().to_path_buf(), true);
    }
    let target = scratch_path("target");
    let release = target.join("release");
    std::fs::create_dir_all(&release).unwrap();
    std::os::unix::fs::symlink(shim_path(), release.join("libgpushim.so")).unwrap();
    let have_tool = tool.is_file();
    if have_tool {
        std::os::unix::fs::symlink(&tool, release.join("gpushim")).unwrap();
    } else {
        eprintln!(
            "{} is not built (yet): installing a stand-in and skipping the checks of the gpushim tool",
            tool.display()
        );
        std::fs::write(release.join("gpushim"), "#!/bin/sh\nexit 0\n").unwrap();
    }
    (target, have_tool)
}

fn mode_of(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

#[test]
fn install_script_installs_runs_and_uninstalls() {
    let (target, have_tool) = target_to_install();
    let prefix = scratch_path("prefix");
    let out = install(&[
        &"--no-build",
        &"--target-dir",
        &target,
        &"--prefix",
        &prefix,
    ]);
    assert!(out.status.success(), "install.sh failed\n{}", out.dump());
    let stdout = out.stdout_text();

    for (rel, src, mode) in installed_files(&target) {
        let path = prefix.join(rel);
        assert!(
            path.is_file(),
            "{} not installed\n{}",
            path.display(),
            out.dump()
        );
        assert!(
            stdout.contains(&format!("installed {}", path.display())),
            "install.sh does not say it installed {}\n{}",
            path.display(),
            out.dump()
        );
        if rel == "bin/gpushim" && !have_tool {
            continue;
        }
        assert_eq!(
            std::fs::read(&path).unwrap(),
            std::fs::read(&src).unwrap(),
            "{} is not a copy of {}",
            path.display(),
            src.display()
        );
        assert_eq!(mode_of(&path), mode, "mode of {}", path.display());
    }
    let lib = prefix.join("lib/libgpushim.so");
    assert!(
        stdout
            .lines()
            .any(|l| l.trim() == lib.display().to_string()),
        "no /etc/ld.so.preload line\n{}",
        out.dump()
    );
    assert!(
        stdout.contains(&format!("LD_PRELOAD={}", lib.display())),
        "no LD_PRELOAD example\n{}",
        out.dump()
    );

    // the installed entrypoint finds the library through ../lib, run directly or through a
    // symbolic link elsewhere (as /usr/local/bin/gpushim-entrypoint -> /opt/gpushim/bin/...)
    let installed_entrypoint = prefix.join("bin/gpushim-entrypoint");
    let links = scratch_path("links");
    std::fs::create_dir_all(&links).unwrap();
    let link = links.join("gpushim-entrypoint");
    std::os::unix::fs::symlink(&installed_entrypoint, &link).unwrap();
    for ep in [&installed_entrypoint, &link] {
        let out = limited(Run::new(ep).arg(driver_program()).args(probe_args())).run();
        assert_limited(&out, &format!("{} (library through ../lib)", ep.display()));
        let out = print_preload(Run::new(ep)).without_sim().run();
        out.assert_str(
            "preload",
            &lib.display().to_string(),
            "the installed library",
        );
    }

    // GPUSHIM_ENTRYPOINT_CHECK=1: `gpushim check` (next to the entrypoint) first
    if have_tool {
        let out = limited(
            Run::new(&installed_entrypoint)
                .arg(driver_program())
                .args(probe_args()),
        )
        .env("GPUSHIM_ENTRYPOINT_CHECK", "1")
        .run();
        assert_limited(&out, "GPUSHIM_ENTRYPOINT_CHECK=1, valid configuration");
        let out = limited(
            Run::new(&installed_entrypoint)
                .arg(driver_program())
                .args(probe_args()),
        )
        .env("GPUSHIM_ENTRYPOINT_CHECK", "1")
        .env("GPUSHIM_MEMORY_LIMIT", "4 gigs")
        .run();
        assert_eq!(
            code(&out),
            1,
            "a failed check stops the container\n{}",
            out.dump()
        );
        assert!(out.stdout.is_empty(), "the program ran\n{}", out.dump());
        assert!(
            out.stderr_text()
                .contains("GPUSHIM_MEMORY_LIMIT=\"4 gigs\""),
            "the check names the bad setting\n{}",
            out.dump()
        );
    } else {
        eprintln!("skipped GPUSHIM_ENTRYPOINT_CHECK: the gpushim tool is not built");
    }

    // the installed header compiles
    let obj = scratch_path("gpushim-h.o");
    let cc = std::process::Command::new(c_compiler())
        .args(["-x", "c", "-c", "-Wall", "-Werror", "-o"])
        .arg(&obj)
        .arg("-include")
        .arg(prefix.join("include/gpushim.h"))
        .arg("/dev/null")
        .output()
        .unwrap();
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );

    // --uninstall removes exactly those files
    let out = install(&[
        &"--uninstall",
        &"--target-dir",
        &target,
        &"--prefix",
        &prefix,
    ]);
    assert!(
        out.status.success(),
        "install.sh --uninstall failed\n{}",
        out.dump()
    );
    for (rel, _, _) in installed_files(&target) {
        let path = prefix.join(rel);
        assert!(
            !path.exists(),
            "{} still there\n{}",
            path.display(),
            out.dump()
        );
    }
    assert!(
        !prefix.join("share/gpushim").exists(),
        "share/gpushim still there"
    );
    for dir in ["lib", "bin", "include"] {
        assert!(prefix.join(dir).is_dir(), "--uninstall removed {dir}/");
    }
    // the sources are untouched
    assert!(target.join("release/libgpushim.so").is_file());
    assert!(entrypoint().is_file());
}

#[test]
fn install_script_stages_under_destdir() {
    let (target, _) = target_to_install();
    let destdir = scratch_path("destdir");
    let out = install(&[
        &"--no-build",
        &"--target-dir",
        &target,
        &"--prefix",
        &"/opt/gpushim",
        &"--destdir",
        &destdir,
    ]);
    assert!(out.status.success(), "install.sh failed\n{}", out.dump());
    for (rel, _, _) in installed_files(&target) {
        let path = destdir.join("opt/gpushim").join(rel);
        assert!(
            path.is_file(),
            "{} not installed\n{}",
            path.display(),
            out.dump()
        );
    }
    // what goes into /etc/ld.so.preload is the path at run time, without DESTDIR
    assert!(
        out.stdout_text()
            .lines()
            .any(|l| l.trim() == "/opt/gpushim/lib/libgpushim.so"),
        "{}",
        out.dump()
    );
    let out = install(&[
        &"--uninstall",
        &"--prefix",
        &"/opt/gpushim",
        &"--destdir",
        &destdir,
    ]);
    assert!(out.status.success(), "{}", out.dump());
    for (rel, _, _) in installed_files(&target) {
        assert!(!destdir.join("opt/gpushim").join(rel).exists());
    }
}

#[test]
fn install_script_errors_clearly() {
    // the tool not built: an error naming it, nothing installed
    let target = scratch_path("target-lib-only");
    std::fs::create_dir_all(target.join("release")).unwrap();
    std::os::unix::fs::symlink(shim_path(), target.join("release/libgpushim.so")).unwrap();
    let prefix = scratch_path("prefix-none");
    let out = install(&[
        &"--no-build",
        &"--target-dir",
        &target,
        &"--prefix",
        &prefix,
    ]);
    assert!(!out.status.success(), "{}", out.dump());
    let err = out.stderr_text();
    assert!(
        err.contains(&target.join("release/gpushim").display().to_string())
            && err.contains("cargo build --release -p gpushim"),
        "the error names the missing file and how to build it\n{}",
        out.dump()
    );
    assert!(!prefix.exists(), "installed something\n{}", out.dump());

    // a relative prefix, an unknown option
    let out = install(&[&"--no-build", &"--prefix", &"relative/dir"]);
    assert_eq!(code(&out), 1, "{}", out.dump());
    assert!(out.stderr_text().contains("absolute"), "{}", out.dump());
    let out = install(&[&"--frobnicate"]);
    assert_eq!(code(&out), 2, "{}", out.dump());
}

// ---------------------------------------------------------------------------------------
// The examples in config/
// ---------------------------------------------------------------------------------------

/// The `gpushim.toml: |` block of the ConfigMap in config/kubernetes.yaml.
fn kubernetes_config() -> String {
    let text = std::fs::read_to_string(workspace_root().join("config/kubernetes.yaml")).unwrap();
    let mut lines = text
        .lines()
        .skip_while(|l| l.trim() != "gpushim.toml: |")
        .skip(1);
    let first = lines.next().expect("a gpushim.toml block");
    let indent = first.len() - first.trim_start().len();
    let mut out = format!("{}\n", &first[indent..]);
    for l in lines {
        if !l.trim().is_empty() && l.len() - l.trim_start().len() < indent {
            break;
        }
        out.push_str(l.get(indent..).unwrap_or(""));
        out.push('\n');
    }
    out
}

#[test]
fn kubernetes_example_config_is_valid() {
    let config = kubernetes_config();
    assert!(config.contains("memory_limit = \"50%\""), "{config}");
    let path = scratch_path("gpushim.toml");
    std::fs::write(&path, &config).unwrap();
    // the ConfigMap's file alone: 50% of 1 GiB
    let out = Run::new("sh")
        .arg(entrypoint())
        .arg(driver_program())
        .arg("totalmem")
        .env("GPUSIM_DEVICES", "1")
        .env("GPUSIM_MEMORY", "1GiB")
        .env("GPUSHIM_LIBRARY", shim_path())
        .env("GPUSHIM_CONFIG", &path)
        .run();
    out.assert_completed();
    assert!(out.gpushim_lines().is_empty(), "{}", out.dump());
    out.assert_u64("op1.total0", PHYSICAL / 2, "memory_limit of the ConfigMap");

    // the YAML itself parses (where PyYAML is installed)
    let check = std::process::Command::new("python3")
        .arg("-c")
        .arg(
            "import sys\ntry:\n import yaml\nexcept ImportError:\n sys.exit(3)\n\
             d=[x for x in yaml.safe_load_all(open(sys.argv[1])) if x]\n\
             assert [x['kind'] for x in d]==['ConfigMap','Pod'], d\n",
        )
        .arg(workspace_root().join("config/kubernetes.yaml"))
        .output();
    match check {
        Ok(o) if o.status.code() == Some(3) => eprintln!("PyYAML not installed: YAML not parsed"),
        Ok(o) => assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => eprintln!("python3 not available ({e}): YAML not parsed"),
    }
}

#[test]
fn dockerfile_example_matches_the_installed_layout() {
    let text = std::fs::read_to_string(workspace_root().join("config/Dockerfile")).unwrap();
    for needle in [
        "bash scripts/install.sh --prefix /opt/gpushim",
        "COPY --from=build /opt/gpushim /opt/gpushim",
        "ENTRYPOINT [\"/opt/gpushim/bin/gpushim-entrypoint\"]",
        "/etc/ld.so.preload",
    ] {
        assert!(text.contains(needle), "config/Dockerfile lacks `{needle}`");
    }
    // every GPUSHIM_ value the Dockerfile sets with ENV is one the shim accepts
    let vars = dockerfile_env(&text);
    assert!(
        vars.iter().any(|(k, _)| k == "GPUSHIM_MEMORY_LIMIT"),
        "no ENV GPUSHIM_MEMORY_LIMIT: {vars:?}"
    );
    let mut run = Run::new(driver_program())
        .arg("totalmem")
        .env("GPUSIM_DEVICES", "1")
        .env("GPUSIM_MEMORY", "1GiB")
        .shim(true);
    for (k, v) in &vars {
        run = run.env(k, v);
    }
    let out = run.run();
    out.assert_completed();
    assert!(out.gpushim_lines().is_empty(), "{vars:?}\n{}", out.dump());
    if vars
        .iter()
        .any(|(k, v)| k == "GPUSHIM_MEMORY_LIMIT" && v == "40%")
    {
        out.assert_u64("op1.total0", PHYSICAL * 2 / 5, "the Dockerfile's 40%");
    }
}

/// The `KEY=VALUE` pairs of the (uncommented) `ENV` instructions of a Dockerfile, with their
/// `\` continuation lines; values without quotes or spaces only, as the example writes them.
fn dockerfile_env(text: &str) -> Vec<(String, String)> {
    let mut vars = vec![];
    let mut in_env = false;
    for line in text.lines() {
        let t = line.trim();
        let body = if let Some(rest) = t.strip_prefix("ENV ") {
            rest
        } else if in_env {
            t
        } else {
            continue;
        };
        let continued = body.ends_with('\\');
        for word in body.trim_end_matches('\\').split_whitespace() {
            if let Some((k, v)) = word.split_once('=') {
                vars.push((k.to_string(), v.to_string()));
            }
        }
        in_env = continued;
    }
    vars
}
