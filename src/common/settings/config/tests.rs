//! Unit tests of the settings: every variable, the config file, precedence and the error messages.

use super::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const NO_DEFAULT: &str = "/nonexistent/gpushim-test/gpushim.toml";
const SPEC_MSG: &str = "expected a size like 4GiB or a fraction like 40%";

fn load_vars_default(vars: &[(&str, &str)], default: &Path) -> Result<Settings, ConfigError> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let mut names: Vec<String> = map.keys().cloned().collect();
    names.sort();
    let env = move |k: &str| map.get(k).cloned();
    load_with_default(&env, &names, default)
}

fn load_vars(vars: &[(&str, &str)]) -> Result<Settings, ConfigError> {
    load_vars_default(vars, Path::new(NO_DEFAULT))
}

pub(super) fn ok(vars: &[(&str, &str)]) -> Settings {
    match load_vars(vars) {
        Ok(s) => s,
        Err(e) => panic!("{vars:?}: {e}"),
    }
}

pub(super) fn err(vars: &[(&str, &str)]) -> String {
    match load_vars(vars) {
        Ok(s) => panic!("{vars:?} was accepted: {s:?}"),
        Err(e) => e.to_string(),
    }
}

/// A test's file in /tmp, removed when dropped, the test passed or not.
struct RemoveOnDrop(PathBuf);
impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn temp_file(contents: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!(
        "gpushim-config-test-{}-{n}.toml",
        std::process::id()
    ));
    std::fs::write(&path, contents).expect("write temp config");
    path
}

fn with_file(
    contents: &str,
    vars: &[(&str, &str)],
) -> (PathBuf, Result<Settings, ConfigError>) {
    let path = temp_file(contents);
    let p = path.to_string_lossy().into_owned();
    let mut all: Vec<(&str, &str)> = vec![(ENV_CONFIG, p.as_str())];
    all.extend_from_slice(vars);
    let result = load_vars(&all);
    let _ = std::fs::remove_file(&path);
    (path, result)
}

pub(super) fn file_ok(contents: &str, vars: &[(&str, &str)]) -> (PathBuf, Settings) {
    match with_file(contents, vars) {
        (path, Ok(s)) => (path, s),
        (_, Err(e)) => panic!("{contents:?}: {e}"),
    }
}

pub(super) fn file_err(contents: &str) -> (PathBuf, String) {
    match with_file(contents, &[]) {
        (_, Ok(s)) => panic!("{contents:?} was accepted: {s:?}"),
        (path, Err(e)) => (path, e.to_string()),
    }
}

fn env_src(name: &str) -> Source {
    Source::Env(name.to_string())
}

// --- defaults, messages -------------------------------------------------------------

#[test]
fn environment_names_are_found_by_prefix_without_copying_the_environment() {
    std::env::set_var("GPUSHIM_TEST_ENV_NAMES_7f3a", "x=y");
    std::env::set_var("GPUSHIM_TEST_ENV_NAMES_EMPTY_7f3a", "");
    std::env::set_var("XGPUSHIM_TEST_ENV_NAMES_7f3a", "1");
    let names = env_names_starting_with(&["GPUSHIM_TEST_ENV_NAMES_", "CUDA_DEVICE_MEMORY_LIMIT_TEST_7f3a"]);
    assert!(names.contains(&"GPUSHIM_TEST_ENV_NAMES_7f3a".to_string()), "{names:?}");
    assert!(names.contains(&"GPUSHIM_TEST_ENV_NAMES_EMPTY_7f3a".to_string()), "{names:?}");
    assert!(names.iter().all(|n| n.starts_with("GPUSHIM_TEST_ENV_NAMES_")), "{names:?}");
    assert!(env_names_starting_with(&["GPUSHIM_TEST_ENV_NAMES_NONE_"]).is_empty());
    // the same names as the standard library's copy of the environment
    let mut copied: Vec<String> = std::env::vars().map(|(n, _)| n).filter(|n| n.starts_with("GPUSHIM_TEST_ENV_NAMES_")).collect();
    let mut mine = names.clone();
    copied.sort();
    mine.sort();
    assert_eq!(mine, copied);
    // values as getenv gives them (after the first '='), lossily where not UTF-8
    use std::os::unix::ffi::OsStrExt;
    std::env::set_var("GPUSHIM_TEST_ENV_VALUES_7f3a", std::ffi::OsStr::from_bytes(b"a\xffb"));
    let vars = env_vars_starting_with(&["GPUSHIM_TEST_ENV_"]);
    for (name, value) in &vars {
        assert_eq!(Some(value.clone()), std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()), "{name}");
    }
    let value = |n: &str| vars.iter().find(|(name, _)| name == n).map(|(_, v)| v.as_str());
    assert_eq!(value("GPUSHIM_TEST_ENV_NAMES_7f3a"), Some("x=y"));
    assert_eq!(value("GPUSHIM_TEST_ENV_NAMES_EMPTY_7f3a"), Some(""));
    assert_eq!(value("GPUSHIM_TEST_ENV_VALUES_7f3a"), Some("a\u{fffd}b"));
}

#[test]
fn defaults() {
    let s = ok(&[]);
    assert_eq!(s, Settings::default());
    assert!(!s.disable);
    assert_eq!(s.log_level, LogLevel::Warn);
    assert_eq!(s.memory_limit, Limit::Unlimited);
    assert_eq!(s.memory_mode, MemoryMode::Passthrough);
    assert_eq!(s.visible_devices, None);
    assert!(s.virtual_devices.is_empty() && s.sources.is_empty() && s.warnings.is_empty());
    assert_eq!(s.source_of("memory_limit"), &Source::Default);
    assert_eq!(s.limit_for(3), Limit::Unlimited);
}

#[test]
fn spec_example_message_word_for_word() {
    assert_eq!(
        err(&[("GPUSHIM_MEMORY_LIMIT", "4 gigs")]),
        "gpushim: GPUSHIM_MEMORY_LIMIT=\"4 gigs\": expected a size like 4GiB or a fraction like 40%"
    );
}

#[test]
fn every_bad_limit_value_is_an_error_naming_the_variable() {
    let cases: &[(&str, &str)] = &[
        ("4 gigs", SPEC_MSG),
        ("-1", SPEC_MSG),
        ("08x", SPEC_MSG),
        ("1e9", SPEC_MSG),
        ("nan", SPEC_MSG),
        ("inf", SPEC_MSG),
        ("0x10", SPEC_MSG),
        ("4 096", SPEC_MSG),
        ("0%", "a percentage must be above 0% and at most 100%"),
        ("101%", "a percentage must be above 0% and at most 100%"),
        ("1.5", "a bare decimal is a fraction of the device's memory and must be at most 1 (like 0.4 or 40%); for a size write the unit, like 1.5GiB"),
        ("0.0", "a fraction must be above 0; write 0 for a limit of zero bytes"),
        (".5", "a number needs digits on both sides of its point, like 0.5 or 1.5GiB"),
        ("18446744073709551616", "too large: a size can be at most 18446744073709551615 bytes (16 EiB)"),
        ("", EMPTY_ENV),
        ("   ", EMPTY_ENV),
    ];
    // (HAMi-core's names read some of these as HAMi-core does: see `hami_tests`)
    for var in [
        "GPUSHIM_MEMORY_LIMIT",
        "GPUSHIM_MEMORY_LIMIT_0",
    ] {
        for (value, reason) in cases {
            let want = format!("gpushim: {var}={value:?}: {reason}");
            assert_eq!(err(&[(var, value)]), want);
        }
    }
}

#[test]
fn error_display_escapes_and_truncates() {
    let e = ConfigError::new("GPUSHIM_LOG", "a\"b\nc", "r");
    assert_eq!(e.to_string(), "gpushim: GPUSHIM_LOG=\"a\\\"b\\nc\": r");
    let long = "x".repeat(1000);
    let shown = ConfigError::new("S", long, "r").to_string();
    assert!(
        shown.len() < 260 && shown.ends_with("\"…: r") && !shown.contains('\n'),
        "{shown}"
    );
    let unicode = ConfigError::new("S", "é".repeat(300), "r").to_string();
    assert!(unicode.contains('…'));
}

// --- memory limits and precedence ---------------------------------------------------

#[test]
fn memory_limit_values() {
    assert_eq!(
        ok(&[("GPUSHIM_MEMORY_LIMIT", "4GiB")]).memory_limit,
        Limit::Bytes(4 * GIB)
    );
    assert_eq!(
        ok(&[("GPUSHIM_MEMORY_LIMIT", "40%")]).memory_limit,
        Limit::Fraction(0.4)
    );
    assert_eq!(
        ok(&[("GPUSHIM_MEMORY_LIMIT", "0.4")]).memory_limit,
        Limit::Fraction(0.4)
    );
    assert_eq!(
        ok(&[("GPUSHIM_MEMORY_LIMIT", "0")]).memory_limit,
        Limit::Bytes(0)
    );
    assert_eq!(
        ok(&[("GPUSHIM_MEMORY_LIMIT", " unlimited ")]).memory_limit,
        Limit::Unlimited
    );
    let s = ok(&[("GPUSHIM_MEMORY_LIMIT", "4GiB")]);
    assert_eq!(
        s.sources,
        vec![("memory_limit".to_string(), env_src("GPUSHIM_MEMORY_LIMIT"))]
    );
}

#[test]
fn per_device_limits() {
    let s = ok(&[
        ("GPUSHIM_MEMORY_LIMIT", "2GiB"),
        ("GPUSHIM_MEMORY_LIMIT_0", "8GiB"),
        ("GPUSHIM_MEMORY_LIMIT_12", "50%"),
    ]);
    assert_eq!(s.limit_for(0), Limit::Bytes(8 * GIB));
    assert_eq!(s.limit_for(12), Limit::Fraction(0.5));
    assert_eq!(s.limit_for(1), Limit::Bytes(2 * GIB));
    assert_eq!(
        s.source_of("memory_limits.0"),
        &env_src("GPUSHIM_MEMORY_LIMIT_0")
    );
    assert_eq!(
        s.source_of("memory_limits.12"),
        &env_src("GPUSHIM_MEMORY_LIMIT_12")
    );
}

#[test]
fn per_device_suffix_must_be_an_ordinal() {
    for var in [
        "GPUSHIM_MEMORY_LIMIT_X",
        "GPUSHIM_MEMORY_LIMIT_",
        "GPUSHIM_MEMORY_LIMIT_01",
        "GPUSHIM_MEMORY_LIMIT_-1",
        "GPUSHIM_MEMORY_LIMIT_1a",
        "GPUSHIM_MEMORY_LIMIT_99999999999",
        "CUDA_DEVICE_MEMORY_LIMIT_X",
    ] {
        let e = err(&[(var, "4GiB")]);
        assert!(
            e.starts_with(&format!("gpushim: {var}=\"4GiB\": \"")),
            "{e}"
        );
        assert!(e.contains("is not a device ordinal"), "{e}");
    }
    assert_eq!(
        err(&[("GPUSHIM_MEMORY_LIMIT_X", "4GiB")]),
        "gpushim: GPUSHIM_MEMORY_LIMIT_X=\"4GiB\": \"X\" after GPUSHIM_MEMORY_LIMIT_ is not a device \
             ordinal; name the device by the ordinal the program sees, like GPUSHIM_MEMORY_LIMIT_0"
    );
}

#[test]
fn malformed_names_in_the_namespace_are_errors() {
    // (a name that is not UTF-8 reaches here as the environment reader keeps it: lossily)
    for var in ["GPUSHIM_MEMORY_LIMIT-0", "GPUSHIM_LOG ", "GPUSHIM_\u{fffd}", "GPUSHIM_\u{1b}[31m"] {
        let e = err(&[(var, "4GiB")]);
        assert_eq!(
            e,
            format!(
                "gpushim: {}=\"4GiB\": the variable's name holds characters no setting has (only A-Z, a-z, \
                     0-9 and _; bytes that are not UTF-8 are shown as \u{fffd}); rename or unset it",
                var.escape_debug()
            )
        );
        assert!(!e.contains('\u{1b}'), "escaped: {e}");
    }
    // a per-device name: not an ordinal, the suffix shown escaped
    for (var, shown) in [
        ("GPUSHIM_MEMORY_LIMIT_\u{fffd}", "\u{fffd}"),
        ("GPUSHIM_MEMORY_LIMIT_0\u{fffd}", "0\u{fffd}"),
        ("GPUSHIM_MEMORY_LIMIT_0 ", "0 "),
        ("CUDA_DEVICE_MEMORY_LIMIT_\u{1b}[2J", "\\u{1b}[2J"),
    ] {
        let e = err(&[(var, "4GiB")]);
        assert!(e.contains(&format!("=\"4GiB\": \"{shown}\" after ")), "{e}");
        assert!(e.contains("is not a device ordinal"), "{e}");
        assert!(!e.contains('\u{1b}'), "escaped: {e}");
    }
    // GPUSHIM_DISABLE still gets the program running
    assert!(ok(&[("GPUSHIM_MEMORY_LIMIT_\u{fffd}", "1"), ("GPUSHIM_DISABLE", "1")]).disable);
}

#[test]
fn a_non_utf8_name_is_read_lossily_not_skipped() {
    use std::os::unix::ffi::OsStrExt;
    let name = std::ffi::OsStr::from_bytes(b"GPUSHIM_TEST_ENV_NAME_\xff");
    std::env::set_var(name, "1");
    let vars = env_vars_starting_with(&["GPUSHIM_TEST_ENV_NAME_"]);
    std::env::remove_var(name);
    assert_eq!(vars, vec![("GPUSHIM_TEST_ENV_NAME_\u{fffd}".to_string(), "1".to_string())]);
}

#[test]
fn secure_execution_wants_absolute_paths() {
    let (_, s) = file_ok("log_file = \"/var/log/g.log\"\nreport = \"/var/log/r.json\"\nstate_dir = \"/run/g\"\n", &[]);
    assert!(require_absolute_paths(s).is_ok());
    for (key, value) in [
        ("log_file", "g.log"),
        ("report", "r.json"),
        ("driver_path", "lib/libcuda.so.1"),
        ("nvml_path", "./libnvidia-ml.so.1"),
        ("state_dir", "state"),
    ] {
        let (path, s) = file_ok(&format!("{key} = \"{value}\"\n"), &[]);
        let e = require_absolute_paths(s).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "gpushim: {key} (in {})=\"{value}\": must be an absolute path in a set-user-ID, set-group-ID \
                     or file-capability program (a relative one would name a file in the caller's current directory)",
                path.display()
            )
        );
    }
    // the report to stderr names no file
    let (_, s) = file_ok("report = \"stderr\"\n", &[]);
    assert!(require_absolute_paths(s).is_ok());
}

#[test]
fn hami_aliases() {
    let s = ok(&[("CUDA_DEVICE_MEMORY_LIMIT", "4g")]);
    assert_eq!(s.memory_limit, Limit::Bytes(4 * GIB));
    assert_eq!(
        s.source_of("memory_limit"),
        &env_src("CUDA_DEVICE_MEMORY_LIMIT")
    );
    let s = ok(&[("CUDA_DEVICE_MEMORY_LIMIT_1", "4096m")]);
    assert_eq!(s.limit_for(1), Limit::Bytes(4096 * MIB));
    assert_eq!(s.limit_for(0), Limit::Unlimited);
    // GPUSHIM names win.
    let s = ok(&[
        ("CUDA_DEVICE_MEMORY_LIMIT", "4g"),
        ("GPUSHIM_MEMORY_LIMIT", "1GiB"),
    ]);
    assert_eq!(s.memory_limit, Limit::Bytes(GIB));
    assert_eq!(
        s.source_of("memory_limit"),
        &env_src("GPUSHIM_MEMORY_LIMIT")
    );
    let s = ok(&[
        ("CUDA_DEVICE_MEMORY_LIMIT_0", "4g"),
        ("GPUSHIM_MEMORY_LIMIT_0", "1GiB"),
    ]);
    assert_eq!(s.limit_for(0), Limit::Bytes(GIB));
    // The GPUSHIM all-devices limit replaces the alias's per-device limits.
    let s = ok(&[
        ("CUDA_DEVICE_MEMORY_LIMIT_0", "4g"),
        ("GPUSHIM_MEMORY_LIMIT", "1GiB"),
    ]);
    assert_eq!(s.limit_for(0), Limit::Bytes(GIB));
    assert!(s.device_limits.is_empty());
    // A GPUSHIM per-device limit over an alias all-devices limit: both hold.
    let s = ok(&[
        ("CUDA_DEVICE_MEMORY_LIMIT", "4g"),
        ("GPUSHIM_MEMORY_LIMIT_1", "1GiB"),
    ]);
    assert_eq!(s.limit_for(0), Limit::Bytes(4 * GIB));
    assert_eq!(s.limit_for(1), Limit::Bytes(GIB));
    // Within the alias layer the per-device limit beats the all-devices one.
    let s = ok(&[
        ("CUDA_DEVICE_MEMORY_LIMIT", "4g"),
        ("CUDA_DEVICE_MEMORY_LIMIT_2", "1g"),
    ]);
    assert_eq!(s.limit_for(2), Limit::Bytes(GIB));
    assert_eq!(s.limit_for(0), Limit::Bytes(4 * GIB));
}

#[test]
fn precedence_env_over_alias_over_file_over_default() {
    let file = "memory_limit = \"1GiB\"\nlog = \"debug\"\nmemory_mode = \"grow\"\n";
    let (path, s) = file_ok(file, &[]);
    assert_eq!(s.memory_limit, Limit::Bytes(GIB));
    assert_eq!(s.source_of("memory_limit"), &Source::File(path.clone()));
    assert_eq!(s.log_level, LogLevel::Debug);

    let (path, s) = file_ok(file, &[("CUDA_DEVICE_MEMORY_LIMIT", "2g")]);
    assert_eq!(s.memory_limit, Limit::Bytes(2 * GIB));
    assert_eq!(
        s.source_of("memory_limit"),
        &env_src("CUDA_DEVICE_MEMORY_LIMIT")
    );
    assert_eq!(s.source_of("log"), &Source::File(path.clone()));

    let (path, s) = file_ok(
        file,
        &[
            ("CUDA_DEVICE_MEMORY_LIMIT", "2g"),
            ("GPUSHIM_MEMORY_LIMIT", "3GiB"),
            ("GPUSHIM_LOG", "info"),
        ],
    );
    assert_eq!(s.memory_limit, Limit::Bytes(3 * GIB));
    assert_eq!(s.log_level, LogLevel::Info);
    assert_eq!(s.memory_mode, MemoryMode::Grow);
    assert_eq!(
        s.sources,
        vec![
            ("log".to_string(), env_src("GPUSHIM_LOG")),
            ("memory_limit".to_string(), env_src("GPUSHIM_MEMORY_LIMIT")),
            ("memory_mode".to_string(), Source::File(path)),
        ]
    );
}

#[test]
fn file_per_device_limits_and_layering() {
    let file = "memory_limit = \"50%\"\n[memory_limits]\n0 = \"8GiB\"\n3 = 1073741824\n";
    let (path, s) = file_ok(file, &[]);
    assert_eq!(s.limit_for(0), Limit::Bytes(8 * GIB));
    assert_eq!(s.limit_for(3), Limit::Bytes(GIB));
    assert_eq!(s.limit_for(1), Limit::Fraction(0.5));
    assert_eq!(s.source_of("memory_limits.3"), &Source::File(path));
    // An env per-device limit adds to the file's.
    let (_, s) = file_ok(file, &[("GPUSHIM_MEMORY_LIMIT_1", "2GiB")]);
    assert_eq!(s.limit_for(0), Limit::Bytes(8 * GIB));
    assert_eq!(s.limit_for(1), Limit::Bytes(2 * GIB));
    assert_eq!(s.limit_for(2), Limit::Fraction(0.5));
    // An env all-devices limit replaces all of the file's limits.
    let (_, s) = file_ok(file, &[("GPUSHIM_MEMORY_LIMIT", "2GiB")]);
    assert_eq!(s.limit_for(0), Limit::Bytes(2 * GIB));
    assert!(s.device_limits.is_empty());
    // HAMi-core's "no limit" (0, unlimited) is the same as unset: the file's limits hold
    let (_, s) = file_ok(file, &[("CUDA_DEVICE_MEMORY_LIMIT", "unlimited")]);
    assert_eq!(s.limit_for(0), Limit::Bytes(8 * GIB));
    let (_, s) = file_ok(file, &[("GPUSHIM_MEMORY_LIMIT", "unlimited")]);
    assert_eq!(s.limit_for(0), Limit::Unlimited);
    // Dotted keys work too.
    let (_, s) = file_ok("memory_limits.2 = \"25%\"\n", &[]);
    assert_eq!(s.limit_for(2), Limit::Fraction(0.25));
}

// --- simple settings ----------------------------------------------------------------

#[test]
fn disable_values() {
    for v in ["1", "true", "TRUE", "yes", "Yes", " yes "] {
        let s = ok(&[("GPUSHIM_DISABLE", v)]);
        assert!(s.disable, "{v:?}");
        assert_eq!(s.source_of("disable"), &env_src("GPUSHIM_DISABLE"));
    }
    for v in ["0", "false", "no", "", " ", "2", "on", "disable"] {
        let s = ok(&[("GPUSHIM_DISABLE", v)]);
        assert!(!s.disable, "{v:?}");
    }
}

#[test]
fn disable_always_gets_the_program_running() {
    let s = ok(&[
        ("GPUSHIM_DISABLE", "1"),
        ("GPUSHIM_MEMORY_LIMIT", "4 gigs"),
        ("GPUSHIM_CONFIG", "/nonexistent/x.toml"),
    ]);
    assert!(s.disable);
    assert_eq!(
        s.sources,
        vec![("disable".to_string(), env_src("GPUSHIM_DISABLE"))]
    );
    // Disabled by the file: the environment's other settings are not read.
    let (path, s) = file_ok(
        "disable = true\nmemory_limit = \"1GiB\"\n",
        &[("GPUSHIM_LOG", "bogus")],
    );
    assert!(s.disable);
    assert_eq!(s.memory_limit, Limit::Unlimited);
    assert_eq!(s.source_of("disable"), &Source::File(path));
    // GPUSHIM_DISABLE=0 re-activates a file-disabled shim.
    let (_, s) = file_ok(
        "disable = true\nmemory_limit = \"1GiB\"\n",
        &[("GPUSHIM_DISABLE", "0")],
    );
    assert!(!s.disable);
    assert_eq!(s.memory_limit, Limit::Bytes(GIB));
    assert_eq!(s.source_of("disable"), &env_src("GPUSHIM_DISABLE"));
    // But an invalid file is still an error when the environment does not disable.
    let (_, e) = file_err("disable = true\nbogus = 1\n");
    assert!(e.contains("unknown setting"), "{e}");
}

#[test]
fn log_levels() {
    for (v, want) in [
        ("off", LogLevel::Off),
        ("ERROR", LogLevel::Error),
        ("warn", LogLevel::Warn),
        ("Info", LogLevel::Info),
        (" debug ", LogLevel::Debug),
        ("trace", LogLevel::Trace),
    ] {
        assert_eq!(ok(&[("GPUSHIM_LOG", v)]).log_level, want);
    }
    for bad in ["warning", "verbose", "3", "in fo"] {
        assert_eq!(
            err(&[("GPUSHIM_LOG", bad)]),
            format!("gpushim: GPUSHIM_LOG={bad:?}: expected one of off, error, warn, info, debug, trace")
        );
    }
    assert!(LogLevel::Off < LogLevel::Error && LogLevel::Error < LogLevel::Warn);
    assert!(LogLevel::Warn < LogLevel::Info && LogLevel::Debug < LogLevel::Trace);
    assert!(LogLevel::Warn.enables(LogLevel::Error) && LogLevel::Warn.enables(LogLevel::Warn));
    assert!(!LogLevel::Warn.enables(LogLevel::Info));
    assert!(!LogLevel::Off.enables(LogLevel::Error) && !LogLevel::Trace.enables(LogLevel::Off));
}

#[test]
fn memory_modes() {
    for (v, want) in [
        ("passthrough", MemoryMode::Passthrough),
        ("GROW", MemoryMode::Grow),
        (" preallocate", MemoryMode::Preallocate),
    ] {
        assert_eq!(ok(&[("GPUSHIM_MEMORY_MODE", v)]).memory_mode, want);
    }
    assert_eq!(
        err(&[("GPUSHIM_MEMORY_MODE", "lazy")]),
        "gpushim: GPUSHIM_MEMORY_MODE=\"lazy\": expected one of passthrough, grow, preallocate"
    );
}

#[test]
fn report_targets() {
    assert_eq!(
        ok(&[("GPUSHIM_REPORT", "stderr")]).report,
        Some(ReportTarget::Stderr)
    );
    assert_eq!(
        ok(&[("GPUSHIM_REPORT", "STDERR")]).report,
        Some(ReportTarget::Stderr)
    );
    let r = ok(&[("GPUSHIM_REPORT", "/tmp/r.json")]).report;
    assert_eq!(r, Some(ReportTarget::Path(PathBuf::from("/tmp/r.json"))));
    assert!(r.is_some_and(|r| r.is_json()));
    assert!(ReportTarget::Path(PathBuf::from("r.JSON")).is_json());
    assert!(!ReportTarget::Path(PathBuf::from("/tmp/r.txt")).is_json());
    assert!(!ReportTarget::Path(PathBuf::from("/tmp/json")).is_json());
    assert!(!ReportTarget::Stderr.is_json());
}

#[test]
fn paths_and_names() {
    let s = ok(&[
        ("GPUSHIM_LOG_FILE", "/tmp/shim log.txt"),
        ("GPUSHIM_DRIVER_PATH", "/opt/nv/libcuda.so.1"),
        ("GPUSHIM_NVML_PATH", "/opt/nv/libnvidia-ml.so.1"),
        ("GPUSHIM_SHARED_QUOTA", "team-a.v2_x"),
        ("GPUSHIM_STATE_DIR", "/run/gpushim q"),
    ]);
    assert_eq!(s.log_file, Some(PathBuf::from("/tmp/shim log.txt")));
    assert_eq!(s.driver_path, Some(PathBuf::from("/opt/nv/libcuda.so.1")));
    assert_eq!(
        s.nvml_path,
        Some(PathBuf::from("/opt/nv/libnvidia-ml.so.1"))
    );
    assert_eq!(s.shared_quota.as_deref(), Some("team-a.v2_x"));
    assert_eq!(s.state_dir, Some(PathBuf::from("/run/gpushim q")));
    for bad in ["a/b", "..", ".hidden", "x y", &"n".repeat(65), "é"] {
        let e = err(&[("GPUSHIM_SHARED_QUOTA", bad)]);
        assert!(e.starts_with("gpushim: GPUSHIM_SHARED_QUOTA="), "{e}");
    }
}

#[test]
fn empty_values_are_errors_except_disable() {
    // The view marker is the shim's own bookkeeping (empty = the view `none`), not a setting.
    let markers = [ENV_VIEW_APPLIED, ENV_VIEW_PENDING, ENV_ORIGINAL_CUDA_VISIBLE_DEVICES];
    for var in SETTING_ENV.iter().filter(|v| **v != ENV_DISABLE && !markers.contains(*v)) {
        for empty in ["", " \t"] {
            let e = err(&[(var, empty)]);
            assert!(
                e.starts_with(&format!("gpushim: {var}={empty:?}: the value is empty")),
                "{e}"
            );
        }
    }
    assert!(!ok(&[("GPUSHIM_DISABLE", "")]).disable);
    for marker in markers {
        assert!(ok(&[(marker, "")]).warnings.is_empty(), "{marker}");
    }
    // the tools' own variables are theirs to check, and are no unknown names
    for var in TOOL_ENV {
        assert!(ok(&[(var, "")]).warnings.is_empty(), "{var}");
    }
}

#[test]
fn unknown_env_names_give_warnings() {
    let s = ok(&[
        ("GPUSHIM_MEMORY_LIMT", "4GiB"),
        ("GPUSHIM_WHATEVER", "1"),
        ("GPUSHIM_LOG", "info"),
    ]);
    assert_eq!(
        s.warnings,
        vec![
            "unknown environment variable GPUSHIM_MEMORY_LIMT is ignored (did you mean GPUSHIM_MEMORY_LIMIT?)".to_string(),
            "unknown environment variable GPUSHIM_WHATEVER is ignored".to_string(),
        ]
    );
    assert!(ok(&[
        ("GPUSHIM_MEMORY_LIMIT_0", "1GiB"),
        ("CUDA_DEVICE_MEMORY_LIMIT", "1g")
    ])
    .warnings
    .is_empty());
}

// --- selectors ----------------------------------------------------------------------

#[test]
fn visible_devices_selectors() {
    let s = ok(&[("GPUSHIM_VISIBLE_DEVICES", "2, 0 ,1")]);
    assert_eq!(
        s.visible_devices,
        Some(vec![
            Selector::Ordinal(2),
            Selector::Ordinal(0),
            Selector::Ordinal(1)
        ])
    );
    assert_eq!(
        s.source_of("visible_devices"),
        &env_src("GPUSHIM_VISIBLE_DEVICES")
    );
    assert_eq!(
        ok(&[("GPUSHIM_VISIBLE_DEVICES", "none")]).visible_devices,
        Some(vec![])
    );
    assert_eq!(
        ok(&[("GPUSHIM_VISIBLE_DEVICES", " NONE ")]).visible_devices,
        Some(vec![])
    );
    let s = ok(&[(
        "GPUSHIM_VISIBLE_DEVICES",
        "GPU-8F3A,07,3B:00.0,00000000:AF:1f.7,0001:02:03.4",
    )]);
    assert_eq!(
        s.visible_devices,
        Some(vec![
            Selector::Uuid("GPU-8f3a".to_string()),
            Selector::Ordinal(7),
            Selector::PciBusId("0000:3b:00.0".to_string()),
            Selector::PciBusId("0000:af:1f.7".to_string()),
            Selector::PciBusId("0001:02:03.4".to_string()),
        ])
    );
    let full = "GPU-12345678-1234-1234-1234-123456789abc";
    assert_eq!(parse_selector(full), Ok(Selector::Uuid(full.to_string())));
    assert_eq!(
        parse_selector("gpu-ABC"),
        Ok(Selector::Uuid("GPU-abc".to_string()))
    );
    assert_eq!(
        parse_selector("0000:3b:00.0"),
        Ok(Selector::PciBusId("0000:3b:00.0".to_string()))
    );
    assert_eq!(
        parse_selector("10000:3b:00.0"),
        Ok(Selector::PciBusId("10000:3b:00.0".to_string()))
    );
    assert_eq!(
        Selector::PciBusId("0000:3b:00.0".to_string()).to_string(),
        "0000:3b:00.0"
    );
}

#[test]
fn visible_devices_errors() {
    let bad: &[(&str, &str)] = &[
        ("0,,1", "the list has an empty entry"),
        ("0,", "the list has an empty entry"),
        ("0,0", "device 0 is listed twice"),
        ("1,01", "device 1 is listed twice"),
        ("GPU-ab,gpu-AB", "device GPU-ab is listed twice"),
        ("3b:00.0,0000:3B:00.0", "device 0000:3b:00.0 is listed twice"),
        ("none,0", "none hides every device and cannot be combined"),
        ("0,none", "none hides every device and cannot be combined"),
        ("MIG-1234", "MIG devices cannot be selected"),
        ("GPU-", "is not a GPU UUID"),
        ("GPU-zz", "is not a GPU UUID"),
        ("GPU-12345678-1234-1234-1234-123456789abcd", "is not a GPU UUID"),
        ("foo", "\"foo\" is not a device selector: expected an ordinal like 0, a UUID like GPU-8f3a… or a PCI bus id like 0000:3b:00.0"),
        ("-1", "is not a device selector"),
        ("+1", "is not a device selector"),
        ("4294967296", "device ordinal 4294967296 is too large"),
        ("3b:00", "\"3b:00\" is not a PCI bus id like 0000:3b:00.0"),
        ("0000:3b:00.8", "is not a PCI bus id"),
        ("0000:3b:20.0", "is not a PCI bus id"),
        ("000000000:3b:00.0", "is not a PCI bus id"),
        ("0000:3b:00:00.0", "is not a PCI bus id"),
        ("0000:3g:00.0", "is not a PCI bus id"),
        ("0000:3b:00.0.1", "is not a PCI bus id"),
        ("1 2", "is not a device selector"),
    ];
    for (value, reason) in bad {
        let e = err(&[("GPUSHIM_VISIBLE_DEVICES", value)]);
        assert!(
            e.starts_with(&format!("gpushim: GPUSHIM_VISIBLE_DEVICES={value:?}: ")),
            "{e}"
        );
        assert!(e.contains(reason), "{value}: {e}");
    }
}

// --- virtual devices ----------------------------------------------------------------

#[test]
fn virtual_devices_syntax() {
    let s = ok(&[(
        "GPUSHIM_VIRTUAL_DEVICES",
        "0:2x8GiB,4GiB; GPU-AB : 1G ;0000:3b:00.0:3 x 512MiB",
    )]);
    assert_eq!(
        s.virtual_devices,
        vec![
            VirtualSplit {
                selector: Selector::Ordinal(0),
                sizes: vec![8 * GIB, 8 * GIB, 4 * GIB]
            },
            VirtualSplit {
                selector: Selector::Uuid("GPU-ab".to_string()),
                sizes: vec![GIB]
            },
            VirtualSplit {
                selector: Selector::PciBusId("0000:3b:00.0".to_string()),
                sizes: vec![512 * MIB; 3],
            },
        ]
    );
    assert_eq!(
        s.source_of("virtual_devices"),
        &env_src("GPUSHIM_VIRTUAL_DEVICES")
    );
    let s = ok(&[("GPUSHIM_VIRTUAL_DEVICES", "1:1X1GiB")]);
    assert_eq!(
        s.virtual_devices,
        vec![VirtualSplit {
            selector: Selector::Ordinal(1),
            sizes: vec![GIB]
        }]
    );
    let s = ok(&[("GPUSHIM_VIRTUAL_DEVICES", "0:64x1GiB")]);
    assert_eq!(s.virtual_devices.first().map(|v| v.sizes.len()), Some(64));
}

#[test]
fn virtual_devices_errors() {
    let bad: &[(&str, &str)] = &[
        ("0", "\"0\" names a device but no sizes"),
        (
            "0000:3b:00.0",
            "\"0000:3b:00.0\" names a device but no sizes",
        ),
        ("GPU-ab", "\"GPU-ab\" names a device but no sizes"),
        ("8GiB", "\"8GiB\" has no ':'"),
        ("0:", "a size is missing"),
        ("0:8GiB,", "a size is missing"),
        ("0:8GiB;", "an entry is empty"),
        (";0:8GiB", "an entry is empty"),
        ("0:0", "a size of 0 is not allowed"),
        ("0:0x8GiB", "expected NxSIZE with N at least 1"),
        ("0:x8GiB", "expected NxSIZE with N at least 1"),
        ("0:8GiBx2", "expected NxSIZE with N at least 1"),
        ("0:2x", "size \"\": the value is empty"),
        ("0:2x8 gigs", "size \"8 gigs\": expected a size like 4GiB"),
        ("0:40%", "a fraction is not allowed here"),
        ("0:1.5", "a number of bytes must be whole"),
        ("0:unlimited", "\"unlimited\" is not allowed here"),
        ("0:-1G", "expected a size like 4GiB"),
        ("0:8GiB;0:4GiB", "device 0 is split twice"),
        ("0:65x1G", "at most 64 virtual devices per device"),
        ("0:64x1G,1G", "at most 64 virtual devices per device"),
        (
            "0:99999999999999999999999x1G",
            "at most 64 virtual devices per device",
        ),
        ("x:1G", "in \"x:1G\": \"x\" is not a device selector"),
        ("none:1G", "is not a device selector"),
        ("MIG-1:1G", "MIG devices cannot be selected"),
    ];
    for (value, reason) in bad {
        let e = err(&[("GPUSHIM_VIRTUAL_DEVICES", value)]);
        assert!(
            e.starts_with(&format!("gpushim: GPUSHIM_VIRTUAL_DEVICES={value:?}: ")),
            "{e}"
        );
        assert!(e.contains(reason), "{value}: {e}");
    }
}

// --- the config file ----------------------------------------------------------------

#[test]
fn config_file_errors() {
    let e = err(&[("GPUSHIM_CONFIG", "/nonexistent/gpushim.toml")]);
    assert_eq!(
        e,
        "gpushim: GPUSHIM_CONFIG=\"/nonexistent/gpushim.toml\": cannot open the config file: \
             No such file or directory (os error 2)"
    );
    let dir = std::env::temp_dir();
    let dir_s = dir.to_string_lossy().into_owned();
    let e = err(&[("GPUSHIM_CONFIG", &dir_s)]);
    assert!(
        e.contains("cannot read the config file") && e.contains("directory"),
        "{e}"
    );
    let e = err(&[("GPUSHIM_CONFIG", "")]);
    assert!(
        e.starts_with("gpushim: GPUSHIM_CONFIG=\"\": the value is empty"),
        "{e}"
    );
    // /dev/null: an empty, valid config.
    assert_eq!(ok(&[("GPUSHIM_CONFIG", "/dev/null")]), Settings::default());

    let (path, e) = file_err("log = \"info\"\nmemory_limit = \n");
    let want = format!(
        "gpushim: GPUSHIM_CONFIG={:?}: invalid TOML at line 2, column ",
        path.display().to_string()
    );
    assert!(e.starts_with(&want) && !e.contains('\n'), "{e}");
    let (_, e) = file_err("log = \"info\"\nlog = \"warn\"\n");
    assert!(e.contains("invalid TOML at line 2"), "{e}");
    let (_, e) = file_err("\u{0}\u{1}garbage");
    assert!(e.contains("invalid TOML"), "{e}");

    let big = format!("# {}\n", "x".repeat(MAX_CONFIG_BYTES as usize));
    let (_, e) = file_err(&big);
    assert!(e.ends_with("the config file is larger than 1 MiB"), "{e}");
}

#[test]
fn config_file_not_utf8() {
    let path = temp_file("");
    let _rm = RemoveOnDrop(path.clone());
    std::fs::write(&path, [0xffu8, 0xfe, b'\n']).expect("write");
    let p = path.to_string_lossy().into_owned();
    let e = load_vars(&[("GPUSHIM_CONFIG", &p)])
        .map(|_| ())
        .unwrap_err()
        .to_string();
    let _ = std::fs::remove_file(&path);
    assert!(e.ends_with("the config file is not valid UTF-8"), "{e}");
}

#[test]
fn default_config_path() {
    // Absent: fine (the other tests use a path that does not exist).
    assert_eq!(
        load_vars_default(&[], Path::new("/nonexistent/dir/x.toml")),
        Ok(Settings::default())
    );
    // A parent that is a file, not a directory: absent too.
    let file = temp_file("");
    let _rm_file = RemoveOnDrop(file.clone());
    let under_file = file.join("gpushim.toml");
    assert_eq!(load_vars_default(&[], &under_file), Ok(Settings::default()));
    let _ = std::fs::remove_file(&file);
    // Present and valid: read, unless GPUSHIM_CONFIG names another file.
    let default = temp_file("memory_limit = \"3GiB\"\n");
    let _rm_valid = RemoveOnDrop(default.clone());
    let s = load_vars_default(&[], &default).expect("default file");
    assert_eq!(s.memory_limit, Limit::Bytes(3 * GIB));
    assert_eq!(s.source_of("memory_limit"), &Source::File(default.clone()));
    let s = load_vars_default(&[("GPUSHIM_CONFIG", "/dev/null")], &default).expect("dev null");
    assert_eq!(s.memory_limit, Limit::Unlimited);
    let _ = std::fs::remove_file(&default);
    // Present and invalid: an error naming GPUSHIM_CONFIG and the default file.
    let default = temp_file("memory_limit = \"4 gigs\"\n");
    let _rm_invalid = RemoveOnDrop(default.clone());
    let e = load_vars_default(&[], &default)
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        format!(
            "gpushim: memory_limit (in {})=\"4 gigs\": {SPEC_MSG}",
            default.display()
        )
    );
    std::fs::write(&default, "[[[").expect("write");
    let e = load_vars_default(&[], &default)
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("gpushim: GPUSHIM_CONFIG=") && e.ends_with("(the default config file)"),
        "{e}"
    );
    let _ = std::fs::remove_file(&default);
}

#[test]
fn file_keys_and_types() {
    let text = r#"
            visible_devices = [1, "GPU-8F3A", "3b:00.0"]
            memory_limit = 0.4
            virtual_devices = ["0:2x8GiB", "1:10GiB,6GiB"]
            memory_mode = "preallocate"
            log = "TRACE"
            log_file = "/tmp/g.log"
            report = "stderr"
            shared_quota = "q1"
            disable = false
            driver_path = "/d/libcuda.so.1"
            nvml_path = "/d/libnvidia-ml.so.1"
            state_dir = "/run/q"
            [memory_limits]
            0 = "8GiB"
            1 = 0.5
        "#;
    let (path, s) = file_ok(text, &[]);
    assert_eq!(
        s.visible_devices,
        Some(vec![
            Selector::Ordinal(1),
            Selector::Uuid("GPU-8f3a".to_string()),
            Selector::PciBusId("0000:3b:00.0".to_string()),
        ])
    );
    assert_eq!(s.memory_limit, Limit::Fraction(0.4));
    assert_eq!(s.limit_for(0), Limit::Bytes(8 * GIB));
    assert_eq!(s.limit_for(1), Limit::Fraction(0.5));
    assert_eq!(s.virtual_devices.len(), 2);
    assert_eq!(s.memory_mode, MemoryMode::Preallocate);
    assert_eq!(s.log_level, LogLevel::Trace);
    assert_eq!(s.report, Some(ReportTarget::Stderr));
    assert_eq!(s.shared_quota.as_deref(), Some("q1"));
    assert_eq!(s.state_dir, Some(PathBuf::from("/run/q")));
    assert!(!s.disable);
    let names: Vec<&str> = s.sources.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "disable",
            "log",
            "log_file",
            "memory_limit",
            "memory_limits.0",
            "memory_limits.1",
            "visible_devices",
            "virtual_devices",
            "memory_mode",
            "report",
            "shared_quota",
            "driver_path",
            "nvml_path",
            "state_dir"
        ]
    );
    assert!(s
        .sources
        .iter()
        .all(|(_, src)| *src == Source::File(path.clone())));

    let (_, s) = file_ok(
        "visible_devices = \"none\"\nmemory_limit = 4294967296\n",
        &[],
    );
    assert_eq!(s.visible_devices, Some(vec![]));
    assert_eq!(s.memory_limit, Limit::Bytes(4 * GIB));
    let (_, s) = file_ok("visible_devices = 3\nvirtual_devices = \"3:1GiB\"\n", &[]);
    assert_eq!(s.visible_devices, Some(vec![Selector::Ordinal(3)]));
}

#[test]
fn file_errors_name_the_key_and_the_file() {
    let cases: &[(&str, &str, &str, &str)] = &[
        ("memory_limt = \"4GiB\"", "memory_limt", "4GiB", "unknown setting; did you mean memory_limit?"),
        ("Memory_Limit = \"4GiB\"", "Memory_Limit", "4GiB", "unknown setting; did you mean memory_limit?"),
        ("visible_device = \"0\"", "visible_device", "0", "unknown setting; did you mean visible_devices?"),
        ("frobnicate = 1", "frobnicate", "1", "unknown setting; the settings are visible_devices, memory_limit, memory_limits, virtual_devices, memory_mode, log, log_file, report, shared_quota, disable, log_placement, driver_path, nvml_path, state_dir"),
        ("[gpushim]\nlog = \"info\"", "gpushim", "{…}", "unknown setting; the settings are"),
        ("memory_limit = \"4 gigs\"", "memory_limit", "4 gigs", SPEC_MSG),
        ("memory_limit = \"\"", "memory_limit", "", "the value is empty; remove the key for the default"),
        ("memory_limit = -1", "memory_limit", "-1", "a size cannot be negative"),
        ("memory_limit = 1.5", "memory_limit", "1.5", "a number with a point is a fraction"),
        ("memory_limit = 0.0", "memory_limit", "0", "a number with a point is a fraction"),
        ("memory_limit = nan", "memory_limit", "NaN", "a number with a point is a fraction"),
        ("memory_limit = true", "memory_limit", "true", LIMIT_TYPES),
        ("memory_limit = [1]", "memory_limit", "[1]", LIMIT_TYPES),
        ("memory_limits = \"4GiB\"", "memory_limits", "4GiB", "expected a table of per-device limits"),
        ("[memory_limits]\nx = \"4GiB\"", "memory_limits.x", "4GiB", "\"x\" is not a device ordinal"),
        ("[memory_limits]\n01 = \"4GiB\"", "memory_limits.01", "4GiB", "\"01\" is not a device ordinal"),
        ("[memory_limits]\n0 = \"101%\"", "memory_limits.0", "101%", "a percentage must be above 0%"),
        ("visible_devices = []", "visible_devices", "[]", "the list is empty; write \"none\""),
        ("visible_devices = [0, 0]", "visible_devices", "[0, 0]", "device 0 is listed twice"),
        ("visible_devices = [0, \"none\"]", "visible_devices", "none", "none cannot be in a list"),
        ("visible_devices = [-1]", "visible_devices", "-1", "not a device ordinal"),
        ("visible_devices = [\"foo\"]", "visible_devices", "foo", "\"foo\" is not a device selector"),
        ("visible_devices = [true]", "visible_devices", "true", "expected an ordinal like 0"),
        ("visible_devices = \"0,,1\"", "visible_devices", "0,,1", "the list has an empty entry"),
        ("visible_devices = true", "visible_devices", "true", "expected a string like \"0,1\""),
        ("virtual_devices = [\"0:1G\", \"0:2G\"]", "virtual_devices", "[\"0:1G\", \"0:2G\"]", "device 0 is split twice"),
        ("virtual_devices = \"0:0\"", "virtual_devices", "0:0", "in \"0:0\": a virtual device needs memory; a size of 0 is not allowed"),
        ("virtual_devices = 5", "virtual_devices", "5", "expected a string"),
        ("disable = \"yes\"", "disable", "yes", "expected true or false"),
        ("log_placement = 1", "log_placement", "1", "expected true or false"),
        ("log = 3", "log", "3", "expected a string (in double quotes)"),
        ("log = \"loud\"", "log", "loud", "expected one of off, error, warn"),
        ("memory_mode = \"lazy\"", "memory_mode", "lazy", "expected one of passthrough, grow, preallocate"),
        ("shared_quota = \"a/b\"", "shared_quota", "a/b", "expected a name"),
        ("log_file = \"  \"", "log_file", "  ", "the value is empty"),
        ("report = 1979-05-27", "report", "1979-05-27", "expected a string"),
    ];
    for (text, key, value, reason) in cases {
        let (path, e) = file_err(text);
        let head = format!("gpushim: {key} (in {})={value:?}: {reason}", path.display());
        assert!(e.starts_with(&head), "\n got: {e}\nwant: {head}…");
    }
}

#[test]
fn example_config_file_as_shipped_changes_nothing() {
    let text = include_str!("../../../../config/gpushim.toml");
    let layer = parse_file(text, Path::new("config/gpushim.toml")).expect("example parses");
    assert_eq!(layer.into_settings(), Settings::default());
}

#[test]
fn example_config_file_uncommented_covers_every_key() {
    let text = include_str!("../../../../config/gpushim.toml");
    // Example settings are written `#key = value` (prose is `# text`): uncomment them.
    let uncommented: String = text
        .lines()
        .map(|l| match l.strip_prefix('#') {
            Some(rest) if rest.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '[') => {
                rest
            }
            _ => l,
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let path = Path::new("config/gpushim.toml");
    let s = match parse_file(&uncommented, path) {
        Ok(layer) => layer.into_settings(),
        Err(e) => panic!("{e}\n{uncommented}"),
    };
    for key in FILE_KEYS {
        let covered = s
            .sources
            .iter()
            .any(|(n, _)| n == key || n.starts_with(&format!("{key}.")));
        assert!(covered, "the example does not show {key}");
    }
    assert_eq!(
        s.visible_devices,
        Some(vec![Selector::Ordinal(2), Selector::Ordinal(0)])
    );
    assert_eq!(s.memory_limit, Limit::Fraction(0.4));
    assert_eq!(s.limit_for(0), Limit::Bytes(8 * GIB));
    assert_eq!(s.limit_for(1), Limit::Fraction(0.5));
    assert_eq!(s.virtual_devices.len(), 2);
    assert_eq!(s.memory_mode, MemoryMode::Grow);
    assert_eq!(s.log_level, LogLevel::Info);
    assert!(s.report.as_ref().is_some_and(ReportTarget::is_json));
    assert!(!s.disable);
    // Every prose line mentioning an example in quotes must parse too, for the forms the
    // comments advertise.
    for alt in [
        "visible_devices = \"none\"",
        "visible_devices = [1, \"GPU-8f3a\", \"0000:3b:00.0\"]",
        "memory_limit = 4294967296",
        "memory_limit = 0.4",
        "virtual_devices = [\"0:2x8GiB\", \"1:10GiB,6GiB\"]",
    ] {
        assert!(text.contains(alt), "{alt}");
        assert!(parse_file(alt, path).is_ok(), "{alt}");
    }
}

#[test]
fn real_environment_loads_without_panicking() {
    let _ = load();
}

#[test]
fn suggestions() {
    assert_eq!(suggest("memory_limt", FILE_KEYS), Some("memory_limit"));
    assert_eq!(suggest("memorylimits", FILE_KEYS), Some("memory_limits"));
    assert_eq!(suggest("lg", FILE_KEYS), Some("log"));
    assert_eq!(suggest("zzzzzzzz", FILE_KEYS), None);
    assert_eq!(suggest(&"a".repeat(100), FILE_KEYS), None);
    assert_eq!(edit_distance("", ""), 0);
    assert_eq!(edit_distance("abc", ""), 3);
    assert_eq!(edit_distance("", "abc"), 3);
    assert_eq!(edit_distance("kitten", "sitting"), 3);
}

/// Garbage of every shape through every variable and the file: errors, never panics.
#[test]
fn garbage_never_panics() {
    let alphabet: Vec<char> = "0123456789.:;,xX%-+ GgKkMmiIBbPpuUnN\u{e9}\u{0}\"\n[]=#"
        .chars()
        .collect();
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut vars: Vec<&str> = SETTING_ENV.to_vec();
    vars.extend([
        "GPUSHIM_MEMORY_LIMIT_0",
        "CUDA_DEVICE_MEMORY_LIMIT",
        "CUDA_DEVICE_MEMORY_LIMIT_1",
    ]);
    vars.retain(|v| *v != ENV_CONFIG);
    for _ in 0..3000 {
        let len = (next() % 24) as usize;
        let value: String = (0..len)
            .map(|_| {
                alphabet
                    .get((next() % alphabet.len() as u64) as usize)
                    .copied()
                    .unwrap_or('0')
            })
            .collect();
        let var = vars
            .get((next() % vars.len() as u64) as usize)
            .copied()
            .unwrap_or(ENV_LOG);
        let _ = load_vars(&[(var, value.as_str())]);
        let _ = parse_file(
            &format!(
                "memory_limit = \"{}\"",
                value.replace(['"', '\\', '\n', '\0'], "")
            ),
            Path::new("f"),
        );
        let _ = parse_file(&value, Path::new("f"));
    }
}

#[test]
fn oom_wait_durations() {
    use std::time::Duration;
    for (text, want) in [("30s", 30_000), ("500ms", 500), ("2m", 120_000), ("1h", 3_600_000), ("1.5s", 1_500), (" 10 S ", 10_000), ("0", 0), ("24h", 86_400_000)] {
        assert_eq!(parse_duration(text), Ok(Duration::from_millis(want)), "{text}");
    }
    for text in ["30", "soon", "-1s", "2d", "1.5.0s", "25h", "s", ".s", "1e3s", ""] {
        assert!(parse_duration(text).is_err(), "{text}");
    }
    assert!(parse_duration("30").unwrap_err().contains("did you mean 30s?"));
    let env = |name: &str| (name == ENV_OOM_WAIT).then(|| "2m".to_string());
    let s = load_from(&|n| if n == ENV_CONFIG { Some("/dev/null".into()) } else { env(n) }, &[ENV_OOM_WAIT.to_string()]).unwrap();
    assert_eq!(s.oom_wait, Some(Duration::from_secs(120)));
    assert_eq!(s.source_of("oom_wait"), &Source::Env(ENV_OOM_WAIT.to_string()));
    let e = load_from(&|n| if n == ENV_CONFIG { Some("/dev/null".into()) } else { (n == ENV_OOM_WAIT).then(|| "30".into()) }, &[ENV_OOM_WAIT.to_string()]).unwrap_err();
    assert_eq!(e.setting, ENV_OOM_WAIT);
}
