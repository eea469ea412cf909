//! The `gpushim` command (src/bin/gpushim): `run` with each option launches a program under the
//! shim on the simulated driver; `check` output for good and bad configurations against golden
//! files (tests/golden/, rewritten with `GPUSHIM_BLESS=1`); the exit report written by a run.

mod common;

use std::path::PathBuf;

use common::*;

macro_rules! args {
    ($($a:expr),* $(,)?) => { vec![$($a.to_string()),*] };
}

fn cli() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_gpushim"))
}

/// `gpushim ARGS…` on the simulator with 3 physical devices of 16 GiB.
fn gpushim<I, S>(args: I) -> Run
where
    I: IntoIterator<Item = S>,
    S: Into<std::ffi::OsString>,
{
    // the library next to the binary is the one under test
    shim_path();
    nvml_sim_library();
    Run::new(cli())
        .args(args)
        .env("GPUSIM_DEVICES", "3")
        .env("GPUSIM_MEMORY", "16GiB")
}

fn drvapi() -> String {
    program(Program::Driver(DriverPath::Link)).display().to_string()
}

fn ids_totals(out: &RunOutput) -> Vec<(String, u64)> {
    (0..out.u64("ids.count"))
        .map(|d| (out.get(&format!("dev{d}.uuid")).to_string(), out.u64(&format!("dev{d}.total"))))
        .collect()
}

fn assert_status(out: &RunOutput, code: i32, what: &str) {
    assert_eq!(out.status.code(), Some(code), "{what}: exit status\n{}", out.dump());
}

// ---------------------------------------------------------------------------------------
// gpushim run
// ---------------------------------------------------------------------------------------

/// Each option of `run` reaches the program: the device list and totals the driver API
/// shows, and an allocation past the limit refused (which succeeds without gpushim).
#[test]
fn run_applies_every_option() {
    if skip_unless_target_exec("a program of the target starts another (gpushim check's probe, gpushim run)") {
        return;
    }
    let p = drvapi();
    let over = format!("alloc=mem:{}", 5 * GIB);
    let cases: Vec<(Vec<String>, Vec<(String, u64)>)> = vec![
        (vec![], (0..3).map(|p| (phys_uuid(p), 16 * GIB)).collect()),
        (args!["--visible-devices", "2,0"], vec![(phys_uuid(2), 16 * GIB), (phys_uuid(0), 16 * GIB)]),
        (args!["--memory-limit", "4GiB"], (0..3).map(|p| (phys_uuid(p), 4 * GIB)).collect()),
        (args!["--memory-limit=25%"], (0..3).map(|p| (phys_uuid(p), 4 * GIB)).collect()),
        (
            args!["--memory-limit", "4GiB", "--memory-limit-device", "1=1GiB", "--memory-limit-device=2=2GiB"],
            vec![(phys_uuid(0), 4 * GIB), (phys_uuid(1), GIB), (phys_uuid(2), 2 * GIB)],
        ),
        (
            args!["--visible-devices", "1", "--virtual-devices", "0:2x4GiB"],
            vec![(String::new(), 4 * GIB), (String::new(), 4 * GIB)],
        ),
    ];
    for (options, want) in cases {
        let mut args = args!["run"];
        args.extend(options.iter().cloned());
        args.extend(args!["--", p.clone(), "ids", over.clone()]);
        let out = gpushim(&args).run();
        let what = format!("gpushim {options:?}");
        out.assert_completed();
        let seen = ids_totals(&out);
        let uuids_of_parts = want.iter().all(|(u, _)| u.is_empty());
        let seen_cmp: Vec<(String, u64)> = if uuids_of_parts {
            seen.iter().map(|(_, t)| (String::new(), *t)).collect()
        } else {
            seen.clone()
        };
        assert_eq!(seen_cmp, want, "{what}\n{}", out.dump());
        let limited = want[0].1 < 5 * GIB;
        assert_eq!(out.num("op2.rc"), if limited { 2 } else { 0 }, "{what}: over-limit allocation\n{}", out.dump());
    }
}

/// `--memory-mode`, `--report`, `--config`, `--log`/`--log-file` and `--library`.
#[test]
fn run_modes_report_config_log_and_library() {
    if skip_unless_target_exec("a program of the target starts another (gpushim check's probe, gpushim run)") {
        return;
    }
    let p = drvapi();
    // grow: 1 MiB asked, a 2 MiB chunk taken; the JSON report says so
    let report = scratch_path("cli-report.json");
    let out = gpushim(args![
        "run", "--memory-mode", "grow", "--memory-limit", "1GiB", "--report", report.display().to_string(),
        "--", p.clone(), format!("alloc=mem:{MIB}"), "free=1", format!("alloc=mem:{}", 2 * GIB)
    ])
    .run();
    out.assert_completed();
    assert_eq!((out.num("op1.rc"), out.num("op2.rc"), out.num("op3.rc")), (0, 0, 2), "{}", out.dump());
    let text = std::fs::read_to_string(&report).unwrap_or_else(|e| panic!("no report at {}: {e}\n{}", report.display(), out.dump()));
    let _ = std::fs::remove_file(&report);
    let parsed = ShimReport::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(
        parsed.device(0),
        &ShimDevice { ordinal: 0, peak_in_use: MIB, peak_reserved: 2 * MIB, refused: 1, limit: GIB },
        "{text}"
    );
    assert_eq!(out.report().device(0).peak, 2 * MIB, "{}", out.dump());

    // --config: a file's limit and mode; the option beats nothing else here
    let config = scratch_path("cli-config.toml");
    std::fs::write(&config, "memory_limit = \"3GiB\"\nvisible_devices = [1]\n").unwrap();
    let out = gpushim(args!["run", "--config", config.display().to_string(), "--", p.clone(), "ids"]).run();
    out.assert_completed();
    assert_eq!(ids_totals(&out), vec![(phys_uuid(1), 3 * GIB)], "{}", out.dump());

    // --log info --log-file: the log goes to the file, not stderr
    let log = scratch_path("cli-log.txt");
    let out = gpushim(args![
        "run", "--log", "info", "--log-file", log.display().to_string(), "--visible-devices", "2", "--", p.clone(), "ids"
    ])
    .run();
    out.assert_completed();
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    assert!(logged.contains("gpushim"), "the log file has gpushim lines:\n{logged}\n{}", out.dump());
    assert!(out.gpushim_lines().is_empty(), "{}", out.dump());

    // --library: a copy elsewhere is the one loaded
    let dir = scratch_path("cli-lib");
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("libgpushim.so");
    std::fs::copy(shim_path(), &copy).unwrap();
    let out = gpushim(args!["run", "--library", copy.display().to_string(), "--memory-limit", "1GiB", "--", "sh", "-c", "echo preload=$LD_PRELOAD"]).run();
    assert_status(&out, 0, "--library");
    assert_eq!(out.get("preload"), std::fs::canonicalize(&copy).unwrap().display().to_string(), "{}", out.dump());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The environment the command gets: LD_PRELOAD with the library first and once, the
/// options' variables over the inherited ones, everything else untouched; the command's exit
/// status is passed on; options stop at the command.
#[test]
fn run_environment_and_exit_status() {
    let lib = std::fs::canonicalize(shim_path()).unwrap().display().to_string();
    let script = "echo preload=$LD_PRELOAD; echo limit=$GPUSHIM_MEMORY_LIMIT; echo other=$OTHER; echo args=$*; exit 7";
    let out = gpushim(args!["run", "--memory-limit", "2GiB", "sh", "-c", script, "sh", "--memory-limit", "x"])
        .env("LD_PRELOAD", format!("/lib/x.so {lib}"))
        .env("GPUSHIM_MEMORY_LIMIT", "8GiB")
        .env("OTHER", "kept")
        .run();
    assert_status(&out, 7, "the command's status");
    assert_eq!(out.get("preload"), format!("{lib}:/lib/x.so"), "{}", out.dump());
    assert_eq!(out.get("limit"), "2GiB", "{}", out.dump());
    assert_eq!(out.get("other"), "kept", "{}", out.dump());
    assert_eq!(out.get("args"), "--memory-limit x", "{}", out.dump());
}

/// What `run` says when it cannot start the command, and the status it exits with.
#[test]
fn run_errors_say_what_to_type() {
    let cases: &[(&[&str], &[(&str, &str)], i32, &str)] = &[
        (&["run"], &[], 125, "gpushim run: no command given; type it after the options, like: gpushim run --memory-limit 4GiB -- python train.py"),
        (&["run", "--memory-limit", "4 gigs", "--", "true"], &[], 125, "gpushim run: --memory-limit \"4 gigs\": expected a size like 4GiB or a fraction like 40%"),
        (&["run", "--memory-limt", "4GiB", "--", "true"], &[], 125, "gpushim run: unknown option --memory-limt (did you mean --memory-limit?); see gpushim run --help"),
        (&["run", "--memory-mode"], &[], 125, "gpushim run: --memory-mode needs a value, like --memory-mode grow"),
        (&["run", "--log-placement=1", "--", "true"], &[], 125, "gpushim run: --log-placement takes no value; give it alone, like gpushim run --log-placement -- ./app"),
        (&["run", "--memory-limit-device", "01=1GiB", "true"], &[], 125, "gpushim run: --memory-limit-device \"01=1GiB\": \"01\" is not a device ordinal (0, 1, …); type it like --memory-limit-device 0=4GiB"),
        (&["run", "--visible-devices", "MIG-1", "true"], &[], 125, "gpushim run: --visible-devices \"MIG-1\": "),
        (&["run", "true"], &[("GPUSHIM_MEMORY_LIMIT", "4 gigs")], 125, "gpushim: GPUSHIM_MEMORY_LIMIT=\"4 gigs\": expected a size like 4GiB or a fraction like 40%\n(gpushim run: nothing was started; see gpushim check)"),
        (&["run", "--library", "/nonexistent/libgpushim.so", "true"], &[], 125, "gpushim run: --library /nonexistent/libgpushim.so: No such file or directory"),
        (&["run", "--", "/nonexistent/program"], &[], 127, "gpushim run: command not found: /nonexistent/program"),
        (&["run", "--", "NOT_EXECUTABLE"], &[], 126, "gpushim run: cannot run: NOT_EXECUTABLE"),
        (&["rnu"], &[], 2, "gpushim: unknown command \"rnu\" (did you mean gpushim run?); see gpushim --help"),
        (&["check", "extra"], &[], 2, "gpushim check: unexpected argument \"extra\"; see gpushim check --help"),
    ];
    let plain = scratch_path("not-executable");
    std::fs::write(&plain, "data\n").unwrap();
    let plain = plain.display().to_string();
    for (args, env, code, message) in cases {
        let args: Vec<&str> = args.iter().map(|a| if *a == "NOT_EXECUTABLE" { plain.as_str() } else { a }).collect();
        let message = message.replace("NOT_EXECUTABLE", &plain);
        let out = gpushim(args.iter().copied()).envs(env.iter()).run();
        let what = format!("gpushim {args:?}");
        assert_status(&out, *code, &what);
        assert!(out.stderr_text().starts_with(&message), "{what}: stderr must start with\n{message}\n{}", out.dump());
    }
}

/// An option's value may start with `-` (`--log-file -x`, `--visible-devices -1`): it is the
/// value, checked as any other, not an unknown option.
#[test]
fn option_values_may_start_with_a_dash() {
    let out = gpushim(["run", "--log-file", "-x", "--", "sh", "-c", "echo log=$GPUSHIM_LOG_FILE"]).run();
    assert_status(&out, 0, "run --log-file -x");
    assert_eq!(out.get("log"), "-x", "{}", out.dump());
    let cases: &[(&[&str], i32, &str)] = &[
        (&["check", "--visible-devices", "-1"], 2, "gpushim check: --visible-devices \"-1\": \"-1\" is not a device selector"),
        (&["run", "--config", "-weird.toml", "--", "true"], 125, "gpushim: GPUSHIM_CONFIG=\"-weird.toml\": cannot open the config file"),
        (&["run", "--memory-limit", "-4GiB", "--", "true"], 125, "gpushim run: --memory-limit \"-4GiB\": "),
        (&["top", "--interval", "-1"], 2, "gpushim top: --interval needs seconds between 0.1 and 3600"),
        (&["sim", "--gpus", "-1"], 125, "gpushim sim: --gpus \"-1\": "),
    ];
    for (args, code, message) in cases {
        let out = gpushim(args.iter().copied()).run();
        let what = format!("gpushim {args:?}");
        assert_status(&out, *code, &what);
        assert!(out.stderr_text().starts_with(message), "{what}: stderr must start with\n{message}\n{}", out.dump());
        assert!(!out.stderr_text().contains("unknown option"), "{what}: {}", out.dump());
    }
}

/// `--help` pages read like man pages and name every option.
#[test]
fn help_pages() {
    for (args, first) in [
        (args!["--help"], "NAME\n    gpushim - "),
        (args!["help", "run"], "NAME\n    gpushim run - "),
        (args!["run", "--help"], "NAME\n    gpushim run - "),
        (args!["check", "--help"], "NAME\n    gpushim check - "),
    ] {
        let out = gpushim(&args).without_sim().run();
        assert_status(&out, 0, &format!("{args:?}"));
        let text = out.stdout_text();
        assert!(text.starts_with(first), "{args:?}\n{text}");
        for section in ["SYNOPSIS", "DESCRIPTION", "EXAMPLES"] {
            assert!(text.contains(&format!("\n{section}\n")), "{args:?}: {section}\n{text}");
        }
        if args.contains(&"run".to_string()) || args.contains(&"check".to_string()) {
            for option in [
                "--visible-devices", "--memory-limit", "--memory-limit-device", "--virtual-devices", "--memory-mode",
                "--config", "--log", "--log-file", "--report", "--shared-quota", "--library", "EXIT STATUS",
            ] {
                assert!(text.contains(option), "{args:?}: {option}\n{text}");
            }
        }
    }
    let out = gpushim(args!["--version"]).without_sim().run();
    assert_eq!(out.stdout_text(), format!("gpushim {}\n", env!("CARGO_PKG_VERSION")));
}

// ---------------------------------------------------------------------------------------
// gpushim check
// ---------------------------------------------------------------------------------------

/// `check`'s stdout and stderr with the varying paths replaced, compared with
/// tests/golden/check-NAME.txt (GPUSHIM_BLESS=1 rewrites it).
fn golden(name: &str, out: &RunOutput, code: i32, replace: &[(&str, &str)]) {
    assert_status(out, code, name);
    let mut text = format!("{}--- stderr ---\n{}", out.stdout_text(), out.stderr_text());
    let lib = std::fs::canonicalize(shim_path()).unwrap();
    text = text.replace(&lib.display().to_string(), "$LIBRARY");
    for (from, to) in replace {
        text = text.replace(from, to);
    }
    let path = workspace_root().join("tests/golden").join(format!("check-{name}.txt"));
    if std::env::var_os("GPUSHIM_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &text).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e} (GPUSHIM_BLESS=1 writes it)", path.display()));
    assert!(text == want, "check-{name}: output differs from {}\n--- got ---\n{text}\n--- want ---\n{want}", path.display());
}

#[test]
fn check_defaults() {
    if skip_unless_target_exec("a program of the target starts another (gpushim check's probe, gpushim run)") {
        return;
    }
    let out = gpushim(args!["check"]).env("GPUSHIM_CONFIG", "/dev/null").run();
    golden("defaults", &out, 0, &[]);
}

/// Settings from the file, the environment (and its HAMi-core aliases) and the options, each
/// with its source; hidden, reordered and limited devices, with their compute limits.
#[test]
fn check_sources_and_view() {
    if skip_unless_target_exec("a program of the target starts another (gpushim check's probe, gpushim run)") {
        return;
    }
    let config = scratch_path("check-sources.toml");
    let region = scratch_path("check-sources.cache");
    std::fs::write(&config, "memory_mode = \"grow\"\nmemory_limit = \"50%\"\nlog = \"error\"\ncompute_limit = \"50%\"\ncompute_mode = \"duty\"\n").unwrap();
    let out = gpushim(args!["check", "--memory-limit-device", "1=2GiB", "--report", "stderr"])
        .env("GPUSHIM_CONFIG", &config)
        .env("GPUSHIM_VISIBLE_DEVICES", "2,0")
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "3GiB")
        .env("CUDA_DEVICE_SM_LIMIT_0", "20")
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", &region)
        .env("GPUSHIM_COMPUTE_LIMIT_1", "70%")
        .env("GPUSHIM_SOMETHING", "1")
        .run();
    golden("sources", &out, 0, &[(&config.display().to_string(), "$CONFIG"), (&region.display().to_string(), "$REGION")]);
}

#[test]
fn check_virtual_devices() {
    if skip_unless_target_exec("a program of the target starts another (gpushim check's probe, gpushim run)") {
        return;
    }
    let out = gpushim(args!["check", "--virtual-devices", "1:2x4GiB", "--memory-limit", "3GiB", "--memory-mode", "preallocate"])
        .env("GPUSHIM_CONFIG", "/dev/null")
        .run();
    golden("virtual", &out, 0, &[]);
    // the probe created no context: nothing was preallocated
    let sim = out.report();
    assert!(sim.devices.iter().all(|d| d.peak == 0), "{}", out.dump());
}

#[test]
fn check_bad_value() {
    let out = gpushim(args!["check"]).env("GPUSHIM_CONFIG", "/dev/null").env("GPUSHIM_MEMORY_LIMIT", "4 gigs").run();
    golden("bad-value", &out, 1, &[]);
}

#[test]
fn check_bad_file() {
    let config = scratch_path("check-bad.toml");
    std::fs::write(&config, "memory_limt = \"4GiB\"\n").unwrap();
    let out = gpushim(args!["check"]).env("GPUSHIM_CONFIG", &config).run();
    golden("bad-file", &out, 1, &[(&config.display().to_string(), "$CONFIG")]);
}

/// A selector that matches no device is only found against the devices: the shim's message,
/// from the probe, and status 1.
#[test]
fn check_no_such_device() {
    if skip_unless_target_exec("a program of the target starts another (gpushim check's probe, gpushim run)") {
        return;
    }
    let out = gpushim(args!["check", "--visible-devices", "0,7"]).env("GPUSHIM_CONFIG", "/dev/null").run();
    golden("no-such-device", &out, 1, &[]);
}

#[test]
fn check_oversized_split() {
    if skip_unless_target_exec("a program of the target starts another (gpushim check's probe, gpushim run)") {
        return;
    }
    let out = gpushim(args!["check", "--virtual-devices", "0:3x8GiB"]).env("GPUSHIM_CONFIG", "/dev/null").run();
    golden("oversized-split", &out, 1, &[]);
}

#[test]
fn check_disabled() {
    let out = gpushim(args!["check", "--memory-limit", "1GiB"]).env("GPUSHIM_DISABLE", "yes").run();
    golden("disabled", &out, 0, &[]);
}

/// Without a driver the view cannot be established: status 1 and the loader's reason.
#[test]
fn check_without_driver() {
    if skip_unless_target_exec("a program of the target starts another (gpushim check's probe, gpushim run)") {
        return;
    }
    let out = gpushim(args!["check"])
        .env("GPUSHIM_CONFIG", "/dev/null")
        .env("GPUSHIM_DRIVER_PATH", "/nonexistent/libcuda.so.1")
        .run();
    assert_status(&out, 1, "no driver");
    assert!(
        out.stderr_text().contains("gpushim check: cannot open the CUDA driver: /nonexistent/libcuda.so.1"),
        "{}",
        out.dump()
    );
}

/// `--log-placement` is a switch: it turns the placement log on (`tests/placement.rs`).
#[test]
fn run_log_placement() {
    if skip_unless_target_exec("a program of the target starts another (gpushim check's probe, gpushim run)") {
        return;
    }
    let p = program(Program::Placement).display().to_string();
    let out = gpushim(args!["run", "--log-placement", "--visible-devices", "2", "--", p]).run();
    out.assert_completed();
    assert_eq!(out.num("d0.rc"), 0, "{}", out.dump());
    let line = format!("gpushim: placement: kernel vecAdd on device 0 (GPU 2 {}), the default stream", phys_uuid(2));
    assert!(out.stderr_text().lines().any(|l| l == line), "{line}\n{}", out.dump());
    assert!(out.stderr_text().contains("gpushim placement (pid "), "{}", out.dump());
}

// ---------------------------------------------------------------------------------------
// The command line's definition: every page, completions, the manual's reference, ps
// ---------------------------------------------------------------------------------------

/// Every command's page (`gpushim help COMMAND` and `gpushim COMMAND --help`) is made from the
/// one definition: the same man-page sections everywhere.
#[test]
fn every_command_has_its_page() {
    for command in ["run", "check", "ps", "top", "metrics", "sim", "slurm", "cdi", "device-plugin", "help", "completions"] {
        let page = gpushim(args!["help", command]).without_sim().run();
        assert_status(&page, 0, command);
        let text = page.stdout_text();
        assert!(text.starts_with(&format!("NAME\n    gpushim {command} - ")), "{command}:\n{text}");
        for section in ["SYNOPSIS", "OPTIONS", "EXAMPLES"] {
            assert!(text.contains(&format!("\n{section}\n")), "{command}: {section}\n{text}");
        }
        let flag = gpushim(args![command, "--help"]).without_sim().run();
        assert_eq!(flag.stdout_text(), text, "{command} --help is gpushim help {command}");
    }
    // the hidden commands are on no page
    let main = gpushim(args!["--help"]).without_sim().run().stdout_text();
    assert!(!main.contains("__probe") && !main.contains("__reference"), "{main}");
    // no command at all: the main page on stderr, status 2
    let none = gpushim(Vec::<String>::new()).without_sim().run();
    assert_status(&none, 2, "no command");
    assert!(none.stderr_text().starts_with("NAME\n    gpushim - "), "{}", none.dump());
    let none = gpushim(args!["help", "nope"]).without_sim().run();
    assert_status(&none, 2, "help nope");
    assert!(none.stderr_text().starts_with("gpushim help: no help on \"nope\""), "{}", none.dump());
}

/// `gpushim completions SHELL` prints a script that knows the commands and their options.
#[test]
fn shell_completions() {
    for shell in ["bash", "zsh", "fish"] {
        let out = gpushim(args!["completions", shell]).without_sim().run();
        assert_status(&out, 0, shell);
        let text = out.stdout_text();
        for word in ["gpushim", "check", "metrics", "sim", "memory-limit", "interval"] {
            assert!(text.contains(word), "{shell}: {word}\n{text}");
        }
        assert!(!text.contains("__probe"), "{shell}: the hidden probe is offered");
    }
    let out = gpushim(args!["completions", "tcsh"]).without_sim().run();
    assert_status(&out, 2, "an unknown shell");
    assert!(out.stderr_text().starts_with("gpushim completions: SHELL \"tcsh\": ") || out.stderr_text().contains("\"tcsh\""), "{}", out.dump());
    // bash reads it without complaint
    let script = scratch_path("completion.bash");
    std::fs::write(&script, gpushim(args!["completions", "bash"]).without_sim().run().stdout).unwrap();
    let check = Run::new("bash").without_sim().args(["-c", &format!("source {} && complete -p gpushim", script.display())]).run();
    assert_status(&check, 0, "bash sources the completion");
}

/// The manual's command reference (docs/src/commands.md) is what the command prints.
#[test]
fn the_manual_reference_is_current() {
    let out = gpushim(args!["__reference"]).without_sim().run();
    assert_status(&out, 0, "__reference");
    let path = workspace_root().join("docs/src/commands.md");
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == out.stdout_text(),
        "{} differs from what the command's definition makes; regenerate it with\n    \
         cargo build --release -p gpushim --bin gpushim && target/release/gpushim __reference > docs/src/commands.md",
        path.display()
    );
}

/// `gpushim ps` with nothing running says so, in one line, and succeeds.
#[test]
fn ps_with_nothing_running() {
    let state = fresh_dir("ps-empty");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    let out = gpushim(args!["ps"]).without_sim().env("GPUSHIM_STATE_DIR", &state).env("GPUSHIM_CONFIG", "/dev/null").run();
    assert_status(&out, 0, "ps");
    assert_eq!(out.stdout_text(), format!("nothing runs under gpushim: no process and no shared quota in {}\n", state.display()));
    assert_eq!(out.stderr_text(), "");
}

/// `gpushim slurm task-prolog` runs as Slurm's TaskProlog, whose stdout Slurm reads: a bad
/// command line, like every other error, prints a `print` line for the job's output (status 2).
#[test]
fn slurm_usage_errors_print_for_the_job() {
    for (args, why) in [
        (args!["slurm", "task-prolog", "--shards-per-gpu", "0"], "--shards-per-gpu"),
        (args!["slurm", "task-prolog", "--shards-per-gpu", "4", "--nope"], "--nope"),
        (args!["slurm", "task-prolog"], "--shards-per-gpu is required"),
        (args!["slurm", "task-epilog", "--shards-per-gpu", "4"], "task-epilog"),
    ] {
        let out = gpushim(args.clone()).without_sim().run();
        assert_status(&out, 2, &format!("{args:?}"));
        let text = out.stdout_text();
        assert_eq!(text.lines().count(), 1, "{args:?}: one line: {}", out.dump());
        assert!(text.starts_with("print gpushim slurm") && text.contains(why) && text.ends_with("; the task is not started\n"), "{args:?}: {}", out.dump());
    }
}
