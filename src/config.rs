//! The merged settings of the shim, and where each one came from (SPEC "Environment variables").
//!
//! # Sources and precedence
//!
//! Each setting is taken from the first of these that sets it:
//!
//! 1. a `GPUSHIM_…` environment variable;
//! 2. for memory limits only, the HAMi-core aliases `CUDA_DEVICE_MEMORY_LIMIT` and
//!    `CUDA_DEVICE_MEMORY_LIMIT_<i>` (environment, below the `GPUSHIM_` names, above the file);
//! 3. the config file: `GPUSHIM_CONFIG` if set (missing or invalid: error), else
//!    [`DEFAULT_CONFIG_PATH`] if it exists (absent: fine; present but unreadable or invalid: error);
//! 4. the defaults (everything visible, no limit, `passthrough`, log at `warn` to stderr).
//!
//! Memory limits are resolved per device, layer by layer: a layer (GPUSHIM env, alias env,
//! file) that sets the all-devices limit also replaces the per-device limits of the layers
//! below it, and within one layer a per-device limit beats the all-devices one. So
//! `GPUSHIM_MEMORY_LIMIT=2GiB` limits every device to 2 GiB even when the file or
//! `CUDA_DEVICE_MEMORY_LIMIT_0` names device 0, while `GPUSHIM_MEMORY_LIMIT_0=8GiB` next to it
//! gives device 0 8 GiB. Per-device ordinals are the program's ordinals (after hiding and
//! splitting); [`Settings::limit_for`] applies the rule.
//!
//! # Values
//!
//! * Sizes and fractions: see [`crate::units`].
//! * `GPUSHIM_DISABLE`: `1`, `true`, `yes` (case-insensitive, spaces ignored) disable the shim;
//!   any other value, the empty string included, or unset: active. When the environment
//!   disables the shim nothing else is read or checked (not even the config file), so
//!   `GPUSHIM_DISABLE=1` always gets a program running. `disable = true` in the file does the
//!   same for the environment's settings, unless `GPUSHIM_DISABLE` is set to another value.
//! * `GPUSHIM_LOG`: `off`, `error`, `warn`, `info`, `debug`, `trace` (case-insensitive).
//! * `GPUSHIM_MEMORY_MODE`: `passthrough`, `grow`, `preallocate` (case-insensitive).
//! * `GPUSHIM_REPORT`: `stderr` (case-insensitive) or a path, JSON when it ends in `.json`.
//! * `GPUSHIM_SHARED_QUOTA`: a name of 1 to 64 characters from `A-Z a-z 0-9 . _ -`, not
//!   starting with `.` (it names shared objects; a `/` must not be able to escape them).
//! * `GPUSHIM_LOG_FILE`, `GPUSHIM_DRIVER_PATH`, `GPUSHIM_NVML_PATH`, `GPUSHIM_STATE_DIR`: paths, taken as written
//!   (not trimmed, relative paths not resolved here).
//! * `GPUSHIM_VISIBLE_DEVICES`: comma-separated selectors, spaces around them ignored, or `none`
//!   (every device hidden). A selector is an ordinal (decimal digits, leading zeros allowed),
//!   a UUID or prefix `GPU-<hex and dashes>` (stored lower-cased after `GPU-`, as NVML prints
//!   them) or a PCI bus id `BB:DD.F`, `DDDD:BB:DD.F` or `DDDDDDDD:BB:DD.F` (hex,
//!   case-insensitive), stored as `0000:3b:00.0`. `MIG-…` UUIDs are refused. The same device
//!   written twice the same way is an error; so are empty entries and `none` among others.
//! * `GPUSHIM_VIRTUAL_DEVICES`: `SEL:SIZE[,SIZE…][;SEL:…]`; `NxSIZE` repeats (1 ≤ N), at most
//!   [`MAX_VIRTUAL_PER_DEVICE`] virtual devices per selector, every size a size (not a fraction)
//!   above 0, each selector once. The selector is what precedes the last `:` of an entry, so PCI
//!   bus ids work (`0000:3b:00.0:2x8GiB`). Whether the sizes fit the device is checked later.
//! * `GPUSHIM_MEMORY_LIMIT_<i>` / `CUDA_DEVICE_MEMORY_LIMIT_<i>`: `<i>` is a decimal ordinal
//!   without leading zeros (`_0`, `_12`); any other suffix is an error naming the variable.
//! * Empty or whitespace-only values are errors for every variable except `GPUSHIM_DISABLE`
//!   (SPEC: any other value is "active"). That includes `GPUSHIM_CONFIG`: an empty path is
//!   more likely a broken script than a wish; to ignore the system file use
//!   `GPUSHIM_CONFIG=/dev/null` (an empty file is a valid, empty config).
//! * Unknown `GPUSHIM_…` variables are not errors (other parts of the shim or its tools may
//!   use more names) but each one gives a line in [`Settings::warnings`], with a suggestion.
//!
//! # The config file
//!
//! TOML, at most 1 MiB, keys as documented in `config/gpushim.toml`. Unknown keys are errors
//! (a typo must never run a program unconstrained), with a suggestion when one is close.
//! Besides strings, the file accepts TOML's own types where they read naturally:
//! `memory_limit = 4294967296` (bytes), `memory_limit = 0.4` (a fraction, in (0, 1]),
//! `visible_devices = [0, "GPU-8f3a"]`, `virtual_devices = ["0:2x8GiB", "1:4GiB"]`,
//! `disable = true`.
//!
//! # Errors
//!
//! [`ConfigError`] displays as one line, `gpushim: SETTING="VALUE": REASON`, e.g.
//! `gpushim: GPUSHIM_MEMORY_LIMIT="4 gigs": expected a size like 4GiB or a fraction like 40%`.
//! For a file key SETTING is `memory_limit (in /path/file.toml)`; for a file that cannot be
//! read or parsed it is `GPUSHIM_CONFIG` with the path as VALUE. VALUE is printed with Rust
//! string escapes (quotes, control characters) and cut at 200 characters so the message stays
//! one line.
//!
//! Nothing here panics, whatever the environment or file holds.

use crate::units::{self, Limit};
use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The config file read when `GPUSHIM_CONFIG` is unset, if it exists.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/gpushim/gpushim.toml";
/// Config files larger than this are refused (a mistaken `GPUSHIM_CONFIG=/dev/zero` must not hang).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// The most virtual devices one physical device may be split into.
pub const MAX_VIRTUAL_PER_DEVICE: usize = 64;

pub const ENV_CONFIG: &str = "GPUSHIM_CONFIG";
pub const ENV_VISIBLE_DEVICES: &str = "GPUSHIM_VISIBLE_DEVICES";
pub const ENV_MEMORY_LIMIT: &str = "GPUSHIM_MEMORY_LIMIT";
/// `GPUSHIM_MEMORY_LIMIT_<i>`.
pub const ENV_MEMORY_LIMIT_PREFIX: &str = "GPUSHIM_MEMORY_LIMIT_";
pub const ENV_VIRTUAL_DEVICES: &str = "GPUSHIM_VIRTUAL_DEVICES";
pub const ENV_MEMORY_MODE: &str = "GPUSHIM_MEMORY_MODE";
pub const ENV_LOG: &str = "GPUSHIM_LOG";
pub const ENV_LOG_FILE: &str = "GPUSHIM_LOG_FILE";
pub const ENV_REPORT: &str = "GPUSHIM_REPORT";
pub const ENV_SHARED_QUOTA: &str = "GPUSHIM_SHARED_QUOTA";
pub const ENV_DISABLE: &str = "GPUSHIM_DISABLE";
pub const ENV_LOG_PLACEMENT: &str = "GPUSHIM_LOG_PLACEMENT";
pub const ENV_DRIVER_PATH: &str = "GPUSHIM_DRIVER_PATH";
pub const ENV_NVML_PATH: &str = "GPUSHIM_NVML_PATH";
/// Set by the shim itself for child processes (see `view`), never by users.
pub const ENV_VIEW_APPLIED: &str = "GPUSHIM_VIEW_APPLIED";
/// Set by the shim at load time (see `view::at_load`), never by users: the devices of the view
/// still to be resolved, as indices into the list `GPUSHIM_VISIBLE_DEVICES` selects.
pub const ENV_VIEW_PENDING: &str = "GPUSHIM_VIEW_PENDING";
/// Set by the shim at load time, never by users: the `CUDA_VISIBLE_DEVICES` the process was
/// started with (absent: it was unset), which selectors compose with.
pub const ENV_ORIGINAL_CUDA_VISIBLE_DEVICES: &str = "GPUSHIM_ORIGINAL_CUDA_VISIBLE_DEVICES";
/// Where shared quota files live (see `quota`).
pub const ENV_STATE_DIR: &str = "GPUSHIM_STATE_DIR";
/// Read by the `gpushim` command and the container entrypoint (where the library is), not
/// by the shim (see [`TOOL_ENV`]).
pub const ENV_LIBRARY: &str = "GPUSHIM_LIBRARY";
/// Read by the container entrypoint: run `gpushim check` before the program (see [`TOOL_ENV`]).
pub const ENV_ENTRYPOINT_CHECK: &str = "GPUSHIM_ENTRYPOINT_CHECK";
/// HAMi-core alias of `GPUSHIM_MEMORY_LIMIT`.
pub const ENV_ALIAS_MEMORY_LIMIT: &str = "CUDA_DEVICE_MEMORY_LIMIT";
/// HAMi-core alias of `GPUSHIM_MEMORY_LIMIT_<i>`.
pub const ENV_ALIAS_MEMORY_LIMIT_PREFIX: &str = "CUDA_DEVICE_MEMORY_LIMIT_";

/// Every `GPUSHIM_` variable this module reads (besides `GPUSHIM_MEMORY_LIMIT_<i>`).
pub const SETTING_ENV: &[&str] = &[
    ENV_CONFIG,
    ENV_VISIBLE_DEVICES,
    ENV_MEMORY_LIMIT,
    ENV_VIRTUAL_DEVICES,
    ENV_MEMORY_MODE,
    ENV_LOG,
    ENV_LOG_FILE,
    ENV_REPORT,
    ENV_SHARED_QUOTA,
    ENV_DISABLE,
    ENV_LOG_PLACEMENT,
    ENV_DRIVER_PATH,
    ENV_NVML_PATH,
    ENV_VIEW_APPLIED,
    ENV_VIEW_PENDING,
    ENV_ORIGINAL_CUDA_VISIBLE_DEVICES,
    ENV_STATE_DIR,
];

/// `GPUSHIM_` variables read by the `gpushim` command and the container entrypoint, not by
/// the shim: known, so that the shim does not warn about them, but never checked here.
pub const TOOL_ENV: &[&str] = &[ENV_LIBRARY, ENV_ENTRYPOINT_CHECK];

/// Whether `name` is a `GPUSHIM_` variable of the shim or its tools.
fn known_env(name: &str) -> bool {
    SETTING_ENV.contains(&name) || TOOL_ENV.contains(&name) || name.starts_with(ENV_MEMORY_LIMIT_PREFIX)
}

/// Every key of the config file. These are also the setting names used in [`Settings::sources`]
/// (per-device limits appear there as `memory_limits.<i>`).
pub const FILE_KEYS: &[&str] = &[
    "visible_devices",
    "memory_limit",
    "memory_limits",
    "virtual_devices",
    "memory_mode",
    "log",
    "log_file",
    "report",
    "shared_quota",
    "disable",
    "log_placement",
    "driver_path",
    "nvml_path",
    "state_dir",
];

// ---------------------------------------------------------------------------------------------
// Types
// ---------------------------------------------------------------------------------------------

/// Log verbosity, ordered from quietest (`Off`) to noisiest (`Trace`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum LogLevel {
    Off,
    Error,
    #[default]
    Warn,
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    pub const ALL: [LogLevel; 6] = [
        LogLevel::Off,
        LogLevel::Error,
        LogLevel::Warn,
        LogLevel::Info,
        LogLevel::Debug,
        LogLevel::Trace,
    ];

    /// The name as written in `GPUSHIM_LOG`.
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Off => "off",
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }

    /// Whether a message at level `message` is written when the configured level is `self`.
    pub fn enables(self, message: LogLevel) -> bool {
        message != LogLevel::Off && message <= self
    }
}

impl fmt::Display for LogLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How device memory is obtained from the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MemoryMode {
    #[default]
    Passthrough,
    Grow,
    Preallocate,
}

impl MemoryMode {
    pub const ALL: [MemoryMode; 3] = [
        MemoryMode::Passthrough,
        MemoryMode::Grow,
        MemoryMode::Preallocate,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            MemoryMode::Passthrough => "passthrough",
            MemoryMode::Grow => "grow",
            MemoryMode::Preallocate => "preallocate",
        }
    }
}

impl fmt::Display for MemoryMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where the exit report goes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ReportTarget {
    Stderr,
    Path(PathBuf),
}

impl ReportTarget {
    /// JSON when the path ends in `.json` (any case); text otherwise and on stderr.
    pub fn is_json(&self) -> bool {
        match self {
            ReportTarget::Stderr => false,
            ReportTarget::Path(p) => p
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("json")),
        }
    }
}

/// One device as the user named it. Matching against real devices is the view's job.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Selector {
    /// An ordinal among the devices the driver shows the process.
    Ordinal(u32),
    /// `GPU-` followed by a (prefix of a) UUID, lower-cased after `GPU-`: `GPU-8f3a`.
    Uuid(String),
    /// A PCI bus id, normalised: `0000:3b:00.0` (4 or more hex digits of domain, lower case).
    PciBusId(String),
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Selector::Ordinal(n) => write!(f, "{n}"),
            Selector::Uuid(s) | Selector::PciBusId(s) => f.write_str(s),
        }
    }
}

/// One physical device split into virtual devices of the given sizes, in order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VirtualSplit {
    pub selector: Selector,
    pub sizes: Vec<u64>,
}

/// Where a setting came from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Source {
    /// An environment variable, by name.
    Env(String),
    /// The config file at this path.
    File(PathBuf),
    Default,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Env(name) => write!(f, "environment variable {name}"),
            Source::File(path) => write!(f, "config file {}", path.display()),
            Source::Default => f.write_str("default"),
        }
    }
}

/// A setting that cannot be used, and why. See the module docs for the message format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub setting: String,
    pub value: String,
    pub reason: String,
}

impl ConfigError {
    pub fn new(
        setting: impl Into<String>,
        value: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        ConfigError {
            setting: setting.into(),
            value: value.into(),
            reason: reason.into(),
        }
    }
}

/// Values longer than this are cut in messages.
const MAX_SHOWN_VALUE_CHARS: usize = 200;

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown: String = self.value.chars().take(MAX_SHOWN_VALUE_CHARS).collect();
        let cut = if shown.len() < self.value.len() {
            "…"
        } else {
            ""
        };
        write!(
            f,
            "gpushim: {}={:?}{}: {}",
            self.setting, shown, cut, self.reason
        )
    }
}

impl std::error::Error for ConfigError {}

/// Everything the shim is configured to do.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub disable: bool,
    pub log_level: LogLevel,
    /// `None`: stderr.
    pub log_file: Option<PathBuf>,
    /// The limit of every device without a per-device limit.
    pub memory_limit: Limit,
    /// Per-device limits by the program's ordinal.
    pub device_limits: BTreeMap<u32, Limit>,
    /// `None`: every device, in driver order. `Some(vec![])`: `none`.
    pub visible_devices: Option<Vec<Selector>>,
    pub virtual_devices: Vec<VirtualSplit>,
    pub memory_mode: MemoryMode,
    pub report: Option<ReportTarget>,
    pub shared_quota: Option<String>,
    /// `GPUSHIM_LOG_PLACEMENT`: log where kernels and allocations land (`placement`).
    pub log_placement: bool,
    /// An explicit real `libcuda.so.1`.
    pub driver_path: Option<PathBuf>,
    /// An explicit real `libnvidia-ml.so.1`.
    pub nvml_path: Option<PathBuf>,
    /// Where shared quota files live; `None`: the default (see `quota::state_dir`).
    pub state_dir: Option<PathBuf>,
    /// Every setting set explicitly (environment or file), with its source, in a fixed order.
    /// Names are the config file's keys; per-device limits are `memory_limits.<i>`.
    pub sources: Vec<(String, Source)>,
    /// Non-fatal findings worth a log line at `warn` (unknown `GPUSHIM_` variables).
    pub warnings: Vec<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            disable: false,
            log_level: LogLevel::Warn,
            log_file: None,
            memory_limit: Limit::Unlimited,
            device_limits: BTreeMap::new(),
            visible_devices: None,
            virtual_devices: Vec::new(),
            memory_mode: MemoryMode::Passthrough,
            report: None,
            shared_quota: None,
            driver_path: None,
            nvml_path: None,
            state_dir: None,
            log_placement: false,
            sources: Vec::new(),
            warnings: Vec::new(),
        }
    }
}

impl Settings {
    /// The limit of the program's device `ordinal`: its own limit, else the all-devices one.
    pub fn limit_for(&self, ordinal: u32) -> Limit {
        self.device_limits
            .get(&ordinal)
            .copied()
            .unwrap_or(self.memory_limit)
    }

    /// Whether any device can have a limit: a memory limit (global or per device), virtual
    /// devices (a part is limited to its size), a shared quota, or a memory mode with a reserve.
    pub fn limits_anything(&self) -> bool {
        !matches!(self.memory_limit, Limit::Unlimited)
            || self.device_limits.values().any(|l| !matches!(l, Limit::Unlimited))
            || !self.virtual_devices.is_empty()
            || self.shared_quota.is_some()
            || self.memory_mode != MemoryMode::Passthrough
    }

    /// Where `setting` (a name from [`FILE_KEYS`], or `memory_limits.<i>`) came from.
    pub fn source_of(&self, setting: &str) -> &Source {
        self.sources
            .iter()
            .find(|(name, _)| name == setting)
            .map_or(&Source::Default, |(_, source)| source)
    }

    fn disabled_by(source: Source) -> Settings {
        Settings {
            disable: true,
            sources: vec![("disable".to_string(), source)],
            ..Settings::default()
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Entry points
// ---------------------------------------------------------------------------------------------

/// Loads the settings from the process environment and the config file.
#[inline(never)] // a start-up step scripts/bench.sh counts by name
pub fn load() -> Result<Settings, ConfigError> {
    if crate::secure::secure_execution() {
        // (see `secure`: the system file alone, its paths absolute, no log or report file)
        let mut settings = require_absolute_paths(load_from(&|_| None, &[])?)?;
        settings.log_file = None;
        if matches!(settings.report, Some(ReportTarget::Path(_))) {
            settings.report = None;
        }
        return Ok(settings);
    }
    const PREFIXES: [&str; 2] = ["GPUSHIM_", ENV_ALIAS_MEMORY_LIMIT];
    let vars = env_vars_starting_with(&PREFIXES);
    let names: Vec<String> = vars.iter().map(|(n, _)| n.clone()).collect();
    // Every name asked for has one of the prefixes, so it is among `vars` (the first of
    // duplicates, as `getenv` answers) or unset; another name (none today) asks `getenv`.
    // Non-UTF-8 values are read lossily: a size then fails to parse, a path would not match.
    let env = |name: &str| {
        if PREFIXES.iter().any(|p| name.starts_with(p)) {
            vars.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone())
        } else {
            std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
        }
    };
    load_from(&env, &names)
}

/// In a secure-execution process (`secure`): every path setting must be absolute, since a
/// relative one names a file in the caller's current directory.
fn require_absolute_paths(settings: Settings) -> Result<Settings, ConfigError> {
    let report = match &settings.report {
        Some(ReportTarget::Path(p)) => Some(p),
        _ => None,
    };
    let paths = [
        ("log_file", settings.log_file.as_ref()),
        ("report", report),
        ("driver_path", settings.driver_path.as_ref()),
        ("nvml_path", settings.nvml_path.as_ref()),
        ("state_dir", settings.state_dir.as_ref()),
    ];
    for (key, path) in paths {
        if let Some(path) = path.filter(|p| !p.is_absolute()) {
            let place = match settings.source_of(key) {
                Source::File(file) => format!("{key} (in {})", file.display()),
                other => format!("{key} ({other})"),
            };
            return Err(ConfigError::new(
                place,
                path.to_string_lossy(),
                "must be an absolute path in a set-user-ID, set-group-ID or file-capability program \
                 (a relative one would name a file in the caller's current directory)",
            ));
        }
    }
    Ok(settings)
}

/// The names of the environment variables that start with one of `prefixes`.
#[cfg(test)]
fn env_names_starting_with(prefixes: &[&str]) -> Vec<String> {
    env_vars_starting_with(prefixes).into_iter().map(|(n, _)| n).collect()
}

/// The environment variables whose names start with one of `prefixes`, with their names and
/// values (read lossily), in the environment's order, the first of duplicate names only. Reads the C library's `environ` in place, once: `std::env::vars_os` would copy every
/// variable of the process to keep a few (15,000 instructions in a small environment), and a
/// `getenv` per setting would scan the whole environment ~20 times.
fn env_vars_starting_with(prefixes: &[&str]) -> Vec<(String, String)> {
    extern "C" {
        static environ: *const *const std::ffi::c_char;
    }
    let mut names: Vec<(String, String)> = Vec::new();
    // SAFETY: `environ` is the C library's NULL-terminated array of NUL-terminated
    // "NAME=value" strings (or NULL). It is read as `getenv` reads it; a program changing its
    // environment from another thread at this instant races with `getenv` just the same.
    unsafe {
        let mut entry = environ;
        if entry.is_null() {
            return names;
        }
        while !(*entry).is_null() {
            let text = *entry;
            // compare the prefix byte by byte, stopping at the terminator: most variables are
            // ruled out at their first byte, without measuring them
            let starts = |prefix: &str| prefix.bytes().enumerate().all(|(i, b)| *text.add(i) as u8 == b);
            if prefixes.iter().any(|p| starts(p)) {
                let bytes = std::ffi::CStr::from_ptr(text).to_bytes();
                // (an entry without '=' is no variable: getenv never matches it)
                if let Some(eq) = bytes.iter().position(|&b| b == b'=') {
                    let (name, value) = (&bytes[..eq], &bytes[eq + 1..]);
                    // (a name that is not UTF-8 is kept lossily: `malformed_name` refuses it)
                    let name = String::from_utf8_lossy(name);
                    if !names.iter().any(|(n, _)| *n == name) {
                        names.push((name.into_owned(), String::from_utf8_lossy(value).into_owned()));
                    }
                }
            }
            entry = entry.add(1);
        }
    }
    names
}

/// Loads the settings from `env` (a lookup by name) and the config file it names.
/// `env_names` lists the variables present, to find `GPUSHIM_MEMORY_LIMIT_<i>` and its alias;
/// names it lists that `env` does not know are ignored.
pub fn load_from(
    env: &dyn Fn(&str) -> Option<String>,
    env_names: &[String],
) -> Result<Settings, ConfigError> {
    load_with_default(env, env_names, Path::new(DEFAULT_CONFIG_PATH))
}

fn load_with_default(
    env: &dyn Fn(&str) -> Option<String>,
    env_names: &[String],
    default_path: &Path,
) -> Result<Settings, ConfigError> {
    let env_disable = env(ENV_DISABLE);
    if env_disable.as_deref().is_some_and(parse_disable) {
        return Ok(Settings::disabled_by(Source::Env(ENV_DISABLE.to_string())));
    }
    if let Some(e) = env_names.iter().find_map(|name| malformed_name(env, name)) {
        return Err(e);
    }
    // The file, then the environment, each in a frame of its own, the layers boxed: start-up
    // runs on the stack of the program's first CUDA call, which may be small (README: stack use).
    let merged = file_layer(env, default_path)?;
    if env_disable.is_none() {
        if let Some((true, source)) = &merged.disable {
            return Ok(Settings::disabled_by(source.clone()));
        }
    }
    with_env(merged, env, env_names)
}

/// The config file's layer (an empty one without a file).
#[inline(never)]
fn file_layer(env: Env<'_>, default_path: &Path) -> Result<Box<Layer>, ConfigError> {
    match config_file(env, default_path)? {
        Some(file) => parse_file(&file.text, &file.path).map_err(|e| file.annotate(e)),
        None => Ok(Box::default()),
    }
}

/// The settings of `merged` under the environment's layers.
#[inline(never)]
fn with_env(
    mut merged: Box<Layer>,
    env: Env<'_>,
    env_names: &[String],
) -> Result<Settings, ConfigError> {
    merged.overlay(alias_layer(env, env_names)?);
    merged.overlay(env_layer(env, env_names)?);
    let mut settings = merged.into_settings();
    settings.warnings = unknown_env_warnings(env_names);
    Ok(settings)
}

// ---------------------------------------------------------------------------------------------
// Value parsers shared by the environment and the file. Errors are the REASON part.
// ---------------------------------------------------------------------------------------------

/// `1`, `true`, `yes` (any case, spaces ignored) disable the shim; anything else does not.
pub fn parse_disable(s: &str) -> bool {
    let t = s.trim();
    ["1", "true", "yes"]
        .iter()
        .any(|word| t.eq_ignore_ascii_case(word))
}

/// An on/off setting (`GPUSHIM_LOG_PLACEMENT`): `1`/`true`/`yes`/`on` or `0`/`false`/`no`/`off`,
/// case-insensitive; anything else is an error (a typo must not silently mean "off").
pub fn parse_switch(s: &str) -> Result<bool, String> {
    let t = s.trim();
    let any = |words: &[&str]| words.iter().any(|w| t.eq_ignore_ascii_case(w));
    if any(&["1", "true", "yes", "on"]) {
        Ok(true)
    } else if any(&["0", "false", "no", "off"]) {
        Ok(false)
    } else {
        Err("expected 1, true, yes or on (or 0, false, no, off)".to_string())
    }
}

pub fn parse_log_level(s: &str) -> Result<LogLevel, String> {
    let t = s.trim();
    LogLevel::ALL
        .into_iter()
        .find(|level| t.eq_ignore_ascii_case(level.as_str()))
        .ok_or_else(|| "expected one of off, error, warn, info, debug, trace".to_string())
}

pub fn parse_memory_mode(s: &str) -> Result<MemoryMode, String> {
    let t = s.trim();
    MemoryMode::ALL
        .into_iter()
        .find(|mode| t.eq_ignore_ascii_case(mode.as_str()))
        .ok_or_else(|| "expected one of passthrough, grow, preallocate".to_string())
}

pub fn parse_report(s: &str) -> Result<ReportTarget, String> {
    if s.trim().eq_ignore_ascii_case("stderr") {
        Ok(ReportTarget::Stderr)
    } else {
        parse_path(s).map(ReportTarget::Path)
    }
}

pub fn parse_shared_quota(s: &str) -> Result<String, String> {
    let t = s.trim();
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if t.chars().count() > 64 || !t.chars().all(allowed) || t.starts_with('.') {
        return Err(
            "expected a name of at most 64 letters, digits, '.', '_' or '-', \
                    not starting with '.', like team-a"
                .to_string(),
        );
    }
    Ok(t.to_string())
}

fn parse_path(s: &str) -> Result<PathBuf, String> {
    if s.contains('\0') {
        return Err("a path cannot contain a NUL character".to_string());
    }
    Ok(PathBuf::from(s))
}

fn parse_limit(s: &str) -> Result<Limit, String> {
    units::parse_limit(s).map_err(|e| e.to_string())
}

/// One device selector: an ordinal, a `GPU-` UUID (prefix) or a PCI bus id.
pub fn parse_selector(s: &str) -> Result<Selector, String> {
    let t = s.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        return parse_ordinal_selector(t);
    }
    if let Some(rest) = strip_prefix_ignore_case(t, "GPU-") {
        return parse_uuid_selector(t, rest);
    }
    if strip_prefix_ignore_case(t, "MIG-").is_some() {
        return Err(format!(
            "\"{t}\": MIG devices cannot be selected; select the GPU by ordinal, GPU-… UUID or PCI bus id"
        ));
    }
    if t.contains(':') {
        return normalise_pci_bus_id(t)
            .map(Selector::PciBusId)
            .ok_or_else(|| format!("\"{t}\" is not a PCI bus id like 0000:3b:00.0"));
    }
    Err(format!(
        "\"{t}\" is not a device selector: expected an ordinal like 0, a UUID like GPU-8f3a… \
         or a PCI bus id like 0000:3b:00.0"
    ))
}

fn parse_ordinal_selector(t: &str) -> Result<Selector, String> {
    t.parse::<u32>()
        .map(Selector::Ordinal)
        .map_err(|_| format!("device ordinal {t} is too large"))
}

fn parse_uuid_selector(t: &str, rest: &str) -> Result<Selector, String> {
    let valid = rest.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
        && rest.chars().any(|c| c.is_ascii_hexdigit())
        && rest.len() <= 36;
    if !valid {
        return Err(format!(
            "\"{t}\" is not a GPU UUID: expected GPU- and hex digits, like GPU-8f3a or a full UUID"
        ));
    }
    Ok(Selector::Uuid(format!("GPU-{}", rest.to_ascii_lowercase())))
}

fn strip_prefix_ignore_case<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    if head.eq_ignore_ascii_case(prefix) {
        s.get(prefix.len()..)
    } else {
        None
    }
}

/// `BB:DD.F`, `DDDD:BB:DD.F` or `DDDDDDDD:BB:DD.F` (hex) → `dddd:bb:dd.f`.
fn normalise_pci_bus_id(t: &str) -> Option<String> {
    let parts: Vec<&str> = t.split(':').collect();
    let (domain, bus, dev_fn) = match parts.as_slice() {
        [bus, dev_fn] => ("0", *bus, *dev_fn),
        [domain, bus, dev_fn] => (*domain, *bus, *dev_fn),
        _ => return None,
    };
    let (device, function) = dev_fn.split_once('.')?;
    let domain = hex_field(domain, 8)?;
    let bus = hex_field(bus, 2)?;
    let device = hex_field(device, 2).filter(|d| *d <= 0x1f)?;
    let function = hex_field(function, 1).filter(|f| *f <= 7)?;
    Some(format!("{domain:04x}:{bus:02x}:{device:02x}.{function:x}"))
}

fn hex_field(s: &str, max_digits: usize) -> Option<u32> {
    if s.is_empty() || s.len() > max_digits || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(s, 16).ok()
}

/// `GPUSHIM_VISIBLE_DEVICES`: comma-separated selectors, or `none`.
pub fn parse_visible_devices(s: &str) -> Result<Vec<Selector>, String> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("none") {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for item in t.split(',') {
        let item = item.trim();
        if item.is_empty() {
            return Err(
                "the list has an empty entry; expected selectors separated by single \
                        commas, like 0,1 or GPU-8f3a,0000:3b:00.0, or none"
                    .to_string(),
            );
        }
        if item.eq_ignore_ascii_case("none") {
            return Err(
                "none hides every device and cannot be combined with other selectors".to_string(),
            );
        }
        push_unique_selector(&mut out, parse_selector(item)?)?;
    }
    Ok(out)
}

fn push_unique_selector(list: &mut Vec<Selector>, selector: Selector) -> Result<(), String> {
    if list.contains(&selector) {
        return Err(format!("device {selector} is listed twice"));
    }
    list.push(selector);
    Ok(())
}

const VIRTUAL_SYNTAX: &str =
    "expected SEL:SIZE[,SIZE…] entries separated by ';', like 0:2x8GiB,4GiB";

/// `GPUSHIM_VIRTUAL_DEVICES`: `SEL:SIZE[,SIZE…][;SEL:…]`.
pub fn parse_virtual_devices(s: &str) -> Result<Vec<VirtualSplit>, String> {
    let mut out = Vec::new();
    for entry in s.trim().split(';') {
        push_unique_split(&mut out, parse_virtual_entry(entry)?)?;
    }
    Ok(out)
}

fn push_unique_split(list: &mut Vec<VirtualSplit>, split: VirtualSplit) -> Result<(), String> {
    if list.iter().any(|v| v.selector == split.selector) {
        return Err(format!(
            "device {} is split twice; list all its sizes in one entry, like {}:8GiB,4GiB",
            split.selector, split.selector
        ));
    }
    list.push(split);
    Ok(())
}

fn parse_virtual_entry(entry: &str) -> Result<VirtualSplit, String> {
    let e = entry.trim();
    if e.is_empty() {
        return Err(format!("an entry is empty; {VIRTUAL_SYNTAX}"));
    }
    let no_sizes = || format!("\"{e}\" names a device but no sizes; {VIRTUAL_SYNTAX}");
    let Some((selector, sizes)) = e.rsplit_once(':') else {
        return Err(if parse_selector(e).is_ok() {
            no_sizes()
        } else {
            format!("\"{e}\" has no ':'; {VIRTUAL_SYNTAX}")
        });
    };
    let selector = parse_selector(selector).map_err(|r| {
        // `0000:3b:00.0` alone splits as `0000:3b` + `00.0`: say what is really missing.
        if parse_selector(e).is_ok() {
            no_sizes()
        } else {
            format!("in \"{e}\": {r}")
        }
    })?;
    let mut out = Vec::new();
    for item in sizes.split(',') {
        append_virtual_sizes(&mut out, item).map_err(|r| format!("in \"{e}\": {r}"))?;
    }
    Ok(VirtualSplit {
        selector,
        sizes: out,
    })
}

/// One `SIZE` or `NxSIZE` item, appended to `out`.
fn append_virtual_sizes(out: &mut Vec<u64>, item: &str) -> Result<(), String> {
    let item = item.trim();
    if item.is_empty() {
        return Err(format!("a size is missing; {VIRTUAL_SYNTAX}"));
    }
    let (count, size_text) = match item.split_once(['x', 'X']) {
        Some((n, size)) => (parse_repeat_count(n.trim(), item)?, size.trim()),
        None => (1, item),
    };
    let size = units::parse_size(size_text).map_err(|e| format!("size \"{size_text}\": {e}"))?;
    if size == 0 {
        return Err("a virtual device needs memory; a size of 0 is not allowed".to_string());
    }
    if out.len().saturating_add(count) > MAX_VIRTUAL_PER_DEVICE {
        return Err(format!(
            "at most {MAX_VIRTUAL_PER_DEVICE} virtual devices per device"
        ));
    }
    out.resize(out.len() + count, size);
    Ok(())
}

fn parse_repeat_count(n: &str, item: &str) -> Result<usize, String> {
    let bad = || format!("\"{item}\": expected NxSIZE with N at least 1, like 2x8GiB");
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    match n.parse::<usize>() {
        Ok(0) => Err(bad()),
        Ok(count) => Ok(count),
        Err(_) => Err(format!(
            "at most {MAX_VIRTUAL_PER_DEVICE} virtual devices per device"
        )),
    }
}

/// The `<i>` of `…_MEMORY_LIMIT_<i>`: decimal, no sign, no leading zeros.
fn parse_ordinal_suffix(suffix: &str) -> Option<u32> {
    let canonical = suffix == "0" || (!suffix.starts_with('0') && !suffix.is_empty());
    if !canonical || !suffix.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    suffix.parse().ok()
}

// ---------------------------------------------------------------------------------------------
// Layers: what one source sets, merged from lowest to highest precedence.
// ---------------------------------------------------------------------------------------------

type Sourced<T> = Option<(T, Source)>;

#[derive(Debug, Default)]
struct Layer {
    disable: Sourced<bool>,
    log_level: Sourced<LogLevel>,
    log_file: Sourced<PathBuf>,
    memory_limit: Sourced<Limit>,
    device_limits: BTreeMap<u32, (Limit, Source)>,
    visible_devices: Sourced<Vec<Selector>>,
    virtual_devices: Sourced<Vec<VirtualSplit>>,
    memory_mode: Sourced<MemoryMode>,
    report: Sourced<ReportTarget>,
    shared_quota: Sourced<String>,
    log_placement: Sourced<bool>,
    driver_path: Sourced<PathBuf>,
    nvml_path: Sourced<PathBuf>,
    state_dir: Sourced<PathBuf>,
}

fn replace_if_set<T>(lower: &mut Sourced<T>, upper: Sourced<T>) {
    if upper.is_some() {
        *lower = upper;
    }
}

impl Layer {
    /// Puts `upper` (higher precedence) over `self`.
    fn overlay(&mut self, upper: Box<Layer>) {
        replace_if_set(&mut self.disable, upper.disable);
        replace_if_set(&mut self.log_level, upper.log_level);
        replace_if_set(&mut self.log_file, upper.log_file);
        if upper.memory_limit.is_some() {
            self.memory_limit = upper.memory_limit;
            self.device_limits.clear();
        }
        self.device_limits.extend(upper.device_limits);
        replace_if_set(&mut self.visible_devices, upper.visible_devices);
        replace_if_set(&mut self.virtual_devices, upper.virtual_devices);
        replace_if_set(&mut self.memory_mode, upper.memory_mode);
        replace_if_set(&mut self.report, upper.report);
        replace_if_set(&mut self.shared_quota, upper.shared_quota);
        replace_if_set(&mut self.log_placement, upper.log_placement);
        replace_if_set(&mut self.driver_path, upper.driver_path);
        replace_if_set(&mut self.nvml_path, upper.nvml_path);
        replace_if_set(&mut self.state_dir, upper.state_dir);
    }

    fn into_settings(self: Box<Self>) -> Settings {
        let mut sources = Vec::new();
        let mut take = |name: &str, source: Option<&Source>| {
            if let Some(source) = source {
                sources.push((name.to_string(), source.clone()));
            }
        };
        take("disable", self.disable.as_ref().map(|v| &v.1));
        take("log", self.log_level.as_ref().map(|v| &v.1));
        take("log_file", self.log_file.as_ref().map(|v| &v.1));
        take("memory_limit", self.memory_limit.as_ref().map(|v| &v.1));
        for (ordinal, (_, source)) in &self.device_limits {
            take(&format!("memory_limits.{ordinal}"), Some(source));
        }
        take(
            "visible_devices",
            self.visible_devices.as_ref().map(|v| &v.1),
        );
        take(
            "virtual_devices",
            self.virtual_devices.as_ref().map(|v| &v.1),
        );
        take("memory_mode", self.memory_mode.as_ref().map(|v| &v.1));
        take("report", self.report.as_ref().map(|v| &v.1));
        take("shared_quota", self.shared_quota.as_ref().map(|v| &v.1));
        take("log_placement", self.log_placement.as_ref().map(|v| &v.1));
        take("driver_path", self.driver_path.as_ref().map(|v| &v.1));
        take("nvml_path", self.nvml_path.as_ref().map(|v| &v.1));
        take("state_dir", self.state_dir.as_ref().map(|v| &v.1));
        Settings {
            disable: self.disable.is_some_and(|v| v.0),
            log_level: self.log_level.map_or(LogLevel::default(), |v| v.0),
            log_file: self.log_file.map(|v| v.0),
            memory_limit: self.memory_limit.map_or(Limit::Unlimited, |v| v.0),
            device_limits: self
                .device_limits
                .into_iter()
                .map(|(i, (l, _))| (i, l))
                .collect(),
            visible_devices: self.visible_devices.map(|v| v.0),
            virtual_devices: self.virtual_devices.map(|v| v.0).unwrap_or_default(),
            memory_mode: self.memory_mode.map_or(MemoryMode::default(), |v| v.0),
            report: self.report.map(|v| v.0),
            shared_quota: self.shared_quota.map(|v| v.0),
            log_placement: self.log_placement.is_some_and(|v| v.0),
            driver_path: self.driver_path.map(|v| v.0),
            nvml_path: self.nvml_path.map(|v| v.0),
            state_dir: self.state_dir.map(|v| v.0),
            sources,
            warnings: Vec::new(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The environment
// ---------------------------------------------------------------------------------------------

type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

const EMPTY_ENV: &str = "the value is empty; unset the variable for the default, or give a value";

/// The variable's value parsed with `parse`, `None` when unset; empty values are errors.
fn env_setting<T>(
    env: Env<'_>,
    name: &str,
    parse: fn(&str) -> Result<T, String>,
) -> Result<Sourced<T>, ConfigError> {
    let Some(value) = env(name) else {
        return Ok(None);
    };
    if value.trim().is_empty() {
        return Err(ConfigError::new(name, value, EMPTY_ENV));
    }
    match parse(&value) {
        Ok(v) => Ok(Some((v, Source::Env(name.to_string())))),
        Err(reason) => Err(ConfigError::new(name, value, reason)),
    }
}

fn env_layer(env: Env<'_>, names: &[String]) -> Result<Box<Layer>, ConfigError> {
    // (set one by one, in this order, into a boxed layer: each result's stack slot is reused)
    let mut layer = Box::<Layer>::default();
    layer.disable =
        env(ENV_DISABLE).map(|v| (parse_disable(&v), Source::Env(ENV_DISABLE.to_string())));
    layer.log_level = env_setting(env, ENV_LOG, parse_log_level)?;
    layer.log_file = env_setting(env, ENV_LOG_FILE, parse_path)?;
    layer.memory_limit = env_setting(env, ENV_MEMORY_LIMIT, parse_limit)?;
    layer.device_limits = env_device_limits(env, names, ENV_MEMORY_LIMIT_PREFIX)?;
    layer.visible_devices = env_setting(env, ENV_VISIBLE_DEVICES, parse_visible_devices)?;
    layer.virtual_devices = env_setting(env, ENV_VIRTUAL_DEVICES, parse_virtual_devices)?;
    layer.memory_mode = env_setting(env, ENV_MEMORY_MODE, parse_memory_mode)?;
    layer.report = env_setting(env, ENV_REPORT, parse_report)?;
    layer.shared_quota = env_setting(env, ENV_SHARED_QUOTA, parse_shared_quota)?;
    layer.log_placement = env_setting(env, ENV_LOG_PLACEMENT, parse_switch)?;
    layer.driver_path = env_setting(env, ENV_DRIVER_PATH, parse_path)?;
    layer.nvml_path = env_setting(env, ENV_NVML_PATH, parse_path)?;
    layer.state_dir = env_setting(env, ENV_STATE_DIR, parse_path)?;
    Ok(layer)
}

fn alias_layer(env: Env<'_>, names: &[String]) -> Result<Box<Layer>, ConfigError> {
    Ok(Box::new(Layer {
        memory_limit: env_setting(env, ENV_ALIAS_MEMORY_LIMIT, parse_limit)?,
        device_limits: env_device_limits(env, names, ENV_ALIAS_MEMORY_LIMIT_PREFIX)?,
        ..Layer::default()
    }))
}

/// `<prefix><i>` variables, in name order so the first error reported does not depend on
/// the order of the environment.
fn env_device_limits(
    env: Env<'_>,
    names: &[String],
    prefix: &str,
) -> Result<BTreeMap<u32, (Limit, Source)>, ConfigError> {
    let mut matching: Vec<&String> = names.iter().filter(|n| n.starts_with(prefix)).collect();
    matching.sort();
    matching.dedup();
    let mut out = BTreeMap::new();
    for name in matching {
        let suffix = name.get(prefix.len()..).unwrap_or("");
        let Some(value) = env(name) else { continue };
        let Some(ordinal) = parse_ordinal_suffix(suffix) else {
            // (escaped: the name may hold control characters; bytes that are not UTF-8 are
            // U+FFFD here, see `env_vars_starting_with`)
            let reason = format!(
                "\"{}\" after {prefix} is not a device ordinal; name the device by the \
                 ordinal the program sees, like {prefix}0",
                suffix.escape_debug()
            );
            return Err(ConfigError::new(name.escape_debug().to_string(), value, reason));
        };
        if let Some(limit) = env_setting(env, name, parse_limit)? {
            out.insert(ordinal, limit);
        }
    }
    Ok(out)
}

/// A variable of the shim's namespace whose name holds anything but ASCII letters, digits and
/// `_` (bytes that are not UTF-8 included, read as U+FFFD) is a configuration error: no setting
/// has such a name, and one meant as a setting (`GPUSHIM_MEMORY_LIMIT_<bytes>`) must not be
/// ignored. The name is shown escaped.
/// (`<prefix><i>` names are left to [`env_device_limits`], whose error says what an ordinal is.)
fn malformed_name(env: Env<'_>, name: &str) -> Option<ConfigError> {
    let per_device = [ENV_MEMORY_LIMIT_PREFIX, ENV_ALIAS_MEMORY_LIMIT_PREFIX];
    if name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') || per_device.iter().any(|p| name.starts_with(p)) {
        return None;
    }
    let reason = "the variable's name holds characters no setting has (only A-Z, a-z, 0-9 and _; \
                  bytes that are not UTF-8 are shown as \u{fffd}); rename or unset it";
    Some(ConfigError::new(name.escape_debug().to_string(), env(name).unwrap_or_default(), reason))
}

fn unknown_env_warnings(names: &[String]) -> Vec<String> {
    let mut unknown: Vec<&String> = names
        .iter()
        .filter(|n| n.starts_with("GPUSHIM_"))
        .filter(|n| !known_env(n))
        .collect();
    unknown.sort();
    unknown.dedup();
    unknown
        .into_iter()
        .map(|name| {
            let known: Vec<&str> = SETTING_ENV.iter().chain(TOOL_ENV).copied().collect();
            let hint =
                suggest(name, &known).map_or(String::new(), |s| format!(" (did you mean {s}?)"));
            format!("unknown environment variable {name} is ignored{hint}")
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The config file
// ---------------------------------------------------------------------------------------------

/// A config file's path and text.
struct ConfigFile {
    path: PathBuf,
    text: String,
    /// Read because `GPUSHIM_CONFIG` is unset.
    is_default: bool,
}

impl ConfigFile {
    /// Errors about the file as a whole say when it is the default file, which the user may
    /// not know is being read.
    fn annotate(&self, mut e: ConfigError) -> ConfigError {
        if self.is_default && e.setting == ENV_CONFIG {
            e.reason.push_str(" (the default config file)");
        }
        e
    }
}

/// The config file to read: `GPUSHIM_CONFIG`, else the default path if present.
fn config_file(env: Env<'_>, default_path: &Path) -> Result<Option<ConfigFile>, ConfigError> {
    let (path, is_default) = match env(ENV_CONFIG) {
        Some(value) if value.trim().is_empty() => {
            return Err(ConfigError::new(
                ENV_CONFIG,
                value,
                "the value is empty; unset the variable for the default file, \
                 or use /dev/null for no file",
            ))
        }
        Some(value) => (PathBuf::from(value), false),
        None => match std::fs::metadata(default_path) {
            Err(e) if is_absent(&e) => return Ok(None),
            _ => (default_path.to_path_buf(), true),
        },
    };
    let mut file = ConfigFile {
        path,
        text: String::new(),
        is_default,
    };
    file.text = read_config(&file.path).map_err(|reason| {
        file.annotate(ConfigError::new(
            ENV_CONFIG,
            file.path.display().to_string(),
            reason,
        ))
    })?;
    Ok(Some(file))
}

fn is_absent(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENOTDIR)
}

fn read_config(path: &Path) -> Result<String, String> {
    let file =
        std::fs::File::open(path).map_err(|e| format!("cannot open the config file: {e}"))?;
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read the config file: {e}"))?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err("the config file is larger than 1 MiB".to_string());
    }
    String::from_utf8(bytes).map_err(|_| "the config file is not valid UTF-8".to_string())
}

/// Parses a config file's text; `path` is named in errors and sources.
fn parse_file(text: &str, path: &Path) -> Result<Box<Layer>, ConfigError> {
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        let message: Vec<&str> = e
            .message()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        let reason = format!(
            "invalid TOML{}: {}",
            toml_position(text, e.span()),
            message.join("; ")
        );
        ConfigError::new(ENV_CONFIG, path.display().to_string(), reason)
    })?;
    let file = FileCtx { path };
    let mut layer = Box::<Layer>::default();
    for (key, value) in &table {
        file.apply(&mut layer, key, value)?;
    }
    Ok(layer)
}

/// ` at line L, column C` for the start of `span`, or nothing.
fn toml_position(text: &str, span: Option<std::ops::Range<usize>>) -> String {
    let Some(before) = span.and_then(|s| text.get(..s.start)) else {
        return String::new();
    };
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    format!(" at line {line}, column {column}")
}

/// A short, one-line rendering of a TOML value for messages (strings as written).
fn render(value: &toml::Value) -> String {
    match value {
        toml::Value::String(s) => s.clone(),
        toml::Value::Integer(i) => i.to_string(),
        toml::Value::Float(f) => f.to_string(),
        toml::Value::Boolean(b) => b.to_string(),
        toml::Value::Datetime(d) => d.to_string(),
        toml::Value::Array(items) => {
            let inner: Vec<String> = items
                .iter()
                .map(|v| match v {
                    toml::Value::String(s) => format!("{s:?}"),
                    toml::Value::Array(_) => "[…]".to_string(),
                    toml::Value::Table(_) => "{…}".to_string(),
                    other => render(other),
                })
                .collect();
            format!("[{}]", inner.join(", "))
        }
        toml::Value::Table(_) => "{…}".to_string(),
    }
}

const EMPTY_FILE_VALUE: &str =
    "the value is empty; remove the key for the default, or give a value";
const LIMIT_TYPES: &str = "expected a string like \"4GiB\" or \"40%\", or a whole number of bytes";

struct FileCtx<'a> {
    path: &'a Path,
}

impl FileCtx<'_> {
    fn error(&self, key: &str, value: impl Into<String>, reason: impl Into<String>) -> ConfigError {
        ConfigError::new(format!("{key} (in {})", self.path.display()), value, reason)
    }

    fn source(&self) -> Source {
        Source::File(self.path.to_path_buf())
    }

    fn apply(&self, layer: &mut Layer, key: &str, value: &toml::Value) -> Result<(), ConfigError> {
        let src = || self.source();
        match key {
            "disable" => layer.disable = Some((self.boolean(key, value)?, src())),
            "log" => layer.log_level = Some((self.string(key, value, parse_log_level)?, src())),
            "log_file" => layer.log_file = Some((self.string(key, value, parse_path)?, src())),
            "memory_limit" => layer.memory_limit = Some((self.limit(key, value)?, src())),
            "memory_limits" => layer.device_limits = self.device_limits(value)?,
            "visible_devices" => layer.visible_devices = Some((self.visible(key, value)?, src())),
            "virtual_devices" => {
                layer.virtual_devices = Some((self.virtual_devices(key, value)?, src()))
            }
            "memory_mode" => {
                layer.memory_mode = Some((self.string(key, value, parse_memory_mode)?, src()))
            }
            "report" => layer.report = Some((self.string(key, value, parse_report)?, src())),
            "shared_quota" => {
                layer.shared_quota = Some((self.string(key, value, parse_shared_quota)?, src()))
            }
            "log_placement" => layer.log_placement = Some((self.boolean(key, value)?, src())),
            "driver_path" => {
                layer.driver_path = Some((self.string(key, value, parse_path)?, src()))
            }
            "nvml_path" => layer.nvml_path = Some((self.string(key, value, parse_path)?, src())),
            "state_dir" => layer.state_dir = Some((self.string(key, value, parse_path)?, src())),
            _ => return Err(self.unknown_key(key, value)),
        }
        Ok(())
    }

    fn unknown_key(&self, key: &str, value: &toml::Value) -> ConfigError {
        let reason = match suggest(key, FILE_KEYS) {
            Some(s) => format!("unknown setting; did you mean {s}?"),
            None => format!("unknown setting; the settings are {}", FILE_KEYS.join(", ")),
        };
        self.error(key, render(value), reason)
    }

    fn boolean(&self, key: &str, value: &toml::Value) -> Result<bool, ConfigError> {
        value
            .as_bool()
            .ok_or_else(|| self.error(key, render(value), "expected true or false"))
    }

    /// A non-empty string value parsed with `parse`.
    fn string<T>(
        &self,
        key: &str,
        value: &toml::Value,
        parse: fn(&str) -> Result<T, String>,
    ) -> Result<T, ConfigError> {
        let Some(s) = value.as_str() else {
            return Err(self.error(key, render(value), "expected a string (in double quotes)"));
        };
        if s.trim().is_empty() {
            return Err(self.error(key, s, EMPTY_FILE_VALUE));
        }
        parse(s).map_err(|reason| self.error(key, s, reason))
    }

    /// A string (size, fraction, `unlimited`), an integer (bytes) or a float (fraction).
    fn limit(&self, key: &str, value: &toml::Value) -> Result<Limit, ConfigError> {
        match value {
            toml::Value::String(_) => self.string(key, value, parse_limit),
            toml::Value::Integer(i) => u64::try_from(*i)
                .map(Limit::Bytes)
                .map_err(|_| self.error(key, render(value), "a size cannot be negative")),
            toml::Value::Float(f) if *f > 0.0 && *f <= 1.0 => Ok(Limit::Fraction(*f)),
            toml::Value::Float(_) => Err(self.error(
                key,
                render(value),
                "a number with a point is a fraction of the device's memory and must be above 0 \
                 and at most 1; write sizes as strings, like \"1.5GiB\"",
            )),
            _ => Err(self.error(key, render(value), LIMIT_TYPES)),
        }
    }

    /// `[memory_limits]`: `<ordinal> = limit`.
    fn device_limits(
        &self,
        value: &toml::Value,
    ) -> Result<BTreeMap<u32, (Limit, Source)>, ConfigError> {
        let Some(table) = value.as_table() else {
            return Err(self.error(
                "memory_limits",
                render(value),
                "expected a table of per-device limits, like [memory_limits] with 0 = \"4GiB\"",
            ));
        };
        let mut out = BTreeMap::new();
        for (ordinal, limit) in table {
            let key = format!("memory_limits.{ordinal}");
            let Some(i) = parse_ordinal_suffix(ordinal) else {
                let reason = format!(
                    "\"{ordinal}\" is not a device ordinal; use the ordinal the program sees, like 0 = \"4GiB\""
                );
                return Err(self.error(&key, render(limit), reason));
            };
            out.insert(i, (self.limit(&key, limit)?, self.source()));
        }
        Ok(out)
    }

    /// A string (`GPUSHIM_VISIBLE_DEVICES` syntax), an ordinal, or an array of either.
    fn visible(&self, key: &str, value: &toml::Value) -> Result<Vec<Selector>, ConfigError> {
        match value {
            toml::Value::String(_) => self.string(key, value, parse_visible_devices),
            toml::Value::Integer(_) => Ok(vec![self.selector_item(key, value)?]),
            toml::Value::Array(items) if items.is_empty() => Err(self.error(
                key,
                render(value),
                "the list is empty; write \"none\" to hide every device",
            )),
            toml::Value::Array(items) => {
                let mut out = Vec::new();
                for item in items {
                    let selector = self.selector_item(key, item)?;
                    push_unique_selector(&mut out, selector)
                        .map_err(|r| self.error(key, render(value), r))?;
                }
                Ok(out)
            }
            _ => Err(self.error(
                key,
                render(value),
                "expected a string like \"0,1\", or a list like [0, \"GPU-8f3a\"]",
            )),
        }
    }

    /// One selector of a `visible_devices` array: an integer ordinal or a selector string.
    fn selector_item(&self, key: &str, item: &toml::Value) -> Result<Selector, ConfigError> {
        match item {
            toml::Value::Integer(i) => u32::try_from(*i)
                .map(Selector::Ordinal)
                .map_err(|_| self.error(key, render(item), "not a device ordinal")),
            toml::Value::String(s) if s.trim().eq_ignore_ascii_case("none") => Err(self.error(
                key,
                s.as_str(),
                "none cannot be in a list; write visible_devices = \"none\" to hide every device",
            )),
            toml::Value::String(_) => self.string(key, item, parse_selector),
            _ => Err(self.error(
                key,
                render(item),
                "expected an ordinal like 0 or a string like \"GPU-8f3a\"",
            )),
        }
    }

    /// A string (`GPUSHIM_VIRTUAL_DEVICES` syntax) or an array of such strings.
    fn virtual_devices(
        &self,
        key: &str,
        value: &toml::Value,
    ) -> Result<Vec<VirtualSplit>, ConfigError> {
        let Some(items) = value.as_array() else {
            return self.string(key, value, parse_virtual_devices);
        };
        let mut out = Vec::new();
        for item in items {
            for split in self.string(key, item, parse_virtual_devices)? {
                push_unique_split(&mut out, split)
                    .map_err(|r| self.error(key, render(value), r))?;
            }
        }
        Ok(out)
    }
}

// ---------------------------------------------------------------------------------------------
// Suggestions for typos
// ---------------------------------------------------------------------------------------------

/// The closest of `candidates` to `word` (case-insensitive), if close enough to be a typo.
pub fn suggest<'a>(word: &str, candidates: &[&'a str]) -> Option<&'a str> {
    if word.len() > 64 {
        return None;
    }
    let word = word.to_ascii_lowercase();
    candidates
        .iter()
        .map(|c| (edit_distance(&word, &c.to_ascii_lowercase()), *c))
        .filter(|(d, _)| *d <= 3 && *d < word.len())
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Levenshtein distance, two rows, no indexing.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = Vec::with_capacity(b.len() + 1);
        cur.push(i + 1);
        for ((cb, diag), up) in b.iter().zip(prev.iter()).zip(prev.iter().skip(1)) {
            let left = cur.last().copied().unwrap_or(usize::MAX - 1);
            let substitute = diag + usize::from(ca != *cb);
            cur.push(substitute.min(up + 1).min(left + 1));
        }
        prev = cur;
    }
    prev.last().copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
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

    fn ok(vars: &[(&str, &str)]) -> Settings {
        match load_vars(vars) {
            Ok(s) => s,
            Err(e) => panic!("{vars:?}: {e}"),
        }
    }

    fn err(vars: &[(&str, &str)]) -> String {
        match load_vars(vars) {
            Ok(s) => panic!("{vars:?} was accepted: {s:?}"),
            Err(e) => e.to_string(),
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

    fn file_ok(contents: &str, vars: &[(&str, &str)]) -> (PathBuf, Settings) {
        match with_file(contents, vars) {
            (path, Ok(s)) => (path, s),
            (_, Err(e)) => panic!("{contents:?}: {e}"),
        }
    }

    fn file_err(contents: &str) -> (PathBuf, String) {
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
        for var in [
            "GPUSHIM_MEMORY_LIMIT",
            "GPUSHIM_MEMORY_LIMIT_0",
            "CUDA_DEVICE_MEMORY_LIMIT",
            "CUDA_DEVICE_MEMORY_LIMIT_3",
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
        let (_, s) = file_ok(file, &[("CUDA_DEVICE_MEMORY_LIMIT", "unlimited")]);
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
        let under_file = file.join("gpushim.toml");
        assert_eq!(load_vars_default(&[], &under_file), Ok(Settings::default()));
        let _ = std::fs::remove_file(&file);
        // Present and valid: read, unless GPUSHIM_CONFIG names another file.
        let default = temp_file("memory_limit = \"3GiB\"\n");
        let s = load_vars_default(&[], &default).expect("default file");
        assert_eq!(s.memory_limit, Limit::Bytes(3 * GIB));
        assert_eq!(s.source_of("memory_limit"), &Source::File(default.clone()));
        let s = load_vars_default(&[("GPUSHIM_CONFIG", "/dev/null")], &default).expect("dev null");
        assert_eq!(s.memory_limit, Limit::Unlimited);
        let _ = std::fs::remove_file(&default);
        // Present and invalid: an error naming GPUSHIM_CONFIG and the default file.
        let default = temp_file("memory_limit = \"4 gigs\"\n");
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
        let text = include_str!("../config/gpushim.toml");
        let layer = parse_file(text, Path::new("config/gpushim.toml")).expect("example parses");
        assert_eq!(layer.into_settings(), Settings::default());
    }

    #[test]
    fn example_config_file_uncommented_covers_every_key() {
        let text = include_str!("../config/gpushim.toml");
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
}
