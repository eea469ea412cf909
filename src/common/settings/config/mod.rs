//! The merged settings of the shim, and where each one came from (SPEC "Environment variables").
//!
//! # Sources and precedence
//!
//! Each setting is taken from the first of these that sets it:
//!
//! 1. a `GPUSHIM_…` environment variable;
//! 2. HAMi-core's variables, with HAMi-core's meaning (see [`hami`]): `CUDA_DEVICE_MEMORY_LIMIT(_<i>)`,
//!    `CUDA_DEVICE_SM_LIMIT(_<i>)`, `LIBCUDA_LOG_LEVEL`, `CUDA_DEVICE_MEMORY_SHARED_CACHE`
//!    (environment, below the `GPUSHIM_` names, above the file); `CUDA_DISABLE_CONTROL=true`
//!    disables the shim as `GPUSHIM_DISABLE` does, unless `GPUSHIM_DISABLE` is set;
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
//! * Sizes and fractions: see [`crate::settings::units`].
//! * `GPUSHIM_DISABLE`: `1`, `true`, `yes` (case-insensitive, spaces ignored) disable the shim;
//!   any other value, the empty string included, or unset: active. When the environment
//!   disables the shim nothing else is read or checked (not even the config file), so
//!   `GPUSHIM_DISABLE=1` always gets a program running. `disable = true` in the file does the
//!   same for the environment's settings, unless `GPUSHIM_DISABLE` is set to another value.
//! * `GPUSHIM_LOG`: `off`, `error`, `warn`, `info`, `debug`, `trace` (case-insensitive).
//! * `GPUSHIM_MEMORY_MODE`: `passthrough`, `grow`, `preallocate` (case-insensitive).
//! * `GPUSHIM_OOM_WAIT`: a duration, `30s`, `500ms`, `2m`, `1h` (decimals allowed), or `0`
//!   (do not wait); at most a day. A number without a unit is an error.
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

use crate::settings::units::{self, Limit};
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
/// The share of each device's time the process' GPU work may occupy (see `compute`).
pub const ENV_COMPUTE_LIMIT: &str = "GPUSHIM_COMPUTE_LIMIT";
/// How long an allocation refused by a full shared budget waits for room (see `quota::wait`).
pub const ENV_OOM_WAIT: &str = "GPUSHIM_OOM_WAIT";
/// `GPUSHIM_COMPUTE_LIMIT_<i>`.
pub const ENV_COMPUTE_LIMIT_PREFIX: &str = "GPUSHIM_COMPUTE_LIMIT_";
/// How the compute limit is enforced: `auto`, `duty`, `mps`, `green`.
pub const ENV_COMPUTE_MODE: &str = "GPUSHIM_COMPUTE_MODE";
/// HAMi-core alias of `GPUSHIM_COMPUTE_LIMIT`: integer percent, 0 = no limit.
pub const ENV_ALIAS_SM_LIMIT: &str = "CUDA_DEVICE_SM_LIMIT";
/// HAMi-core alias of `GPUSHIM_COMPUTE_LIMIT_<i>`.
pub const ENV_ALIAS_SM_LIMIT_PREFIX: &str = "CUDA_DEVICE_SM_LIMIT_";
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
    ENV_COMPUTE_LIMIT,
    ENV_COMPUTE_MODE,
    ENV_OOM_WAIT,
];

/// `GPUSHIM_` variables read by the `gpushim` command and the container entrypoint, not by
/// the shim: known, so that the shim does not warn about them, but never checked here.
pub const TOOL_ENV: &[&str] = &[ENV_LIBRARY, ENV_ENTRYPOINT_CHECK];

/// Whether `name` is a `GPUSHIM_` variable of the shim or its tools.
fn known_env(name: &str) -> bool {
    SETTING_ENV.contains(&name) || TOOL_ENV.contains(&name) || name.starts_with(ENV_MEMORY_LIMIT_PREFIX)
        || name.starts_with(ENV_COMPUTE_LIMIT_PREFIX)
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
    "compute_limit",
    "compute_limits",
    "compute_mode",
    "oom_wait",
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

/// How a compute limit is enforced (`GPUSHIM_COMPUTE_MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ComputeMode {
    /// `mps` when an MPS control daemon is reachable for the process, else `duty`.
    #[default]
    Auto,
    /// The shim's pacer: launches wait for the process' share of the device's time.
    Duty,
    /// The MPS client variables, set before the driver initialises.
    Mps,
    /// Green contexts with the limit's share of SMs (experimental).
    Green,
}

impl ComputeMode {
    pub const ALL: [ComputeMode; 4] = [ComputeMode::Auto, ComputeMode::Duty, ComputeMode::Mps, ComputeMode::Green];

    pub fn as_str(self) -> &'static str {
        match self {
            ComputeMode::Auto => "auto",
            ComputeMode::Duty => "duty",
            ComputeMode::Mps => "mps",
            ComputeMode::Green => "green",
        }
    }
}

impl fmt::Display for ComputeMode {
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
    /// The compute limit of every device without a per-device one: a share in (0, 1], 1 being
    /// no limit; `None`: unset.
    pub compute_limit: Option<f64>,
    /// Per-device compute limits by the program's ordinal (1: none on that device).
    pub compute_limits: BTreeMap<u32, f64>,
    pub compute_mode: ComputeMode,
    /// HAMi-core's shared region file (`CUDA_DEVICE_MEMORY_SHARED_CACHE`, else HAMi-core's
    /// default path): `Some` only when the process is configured through HAMi's variables
    /// (see `hami::configured_through_hami`), never from `GPUSHIM_` names or the file.
    pub hami_region: Option<PathBuf>,
    /// `GPUSHIM_OOM_WAIT`: how long an allocation refused because a shared budget is full
    /// waits for room (`None` or zero: refused at once).
    pub oom_wait: Option<std::time::Duration>,
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
            compute_limit: None,
            compute_limits: BTreeMap::new(),
            compute_mode: ComputeMode::Auto,
            hami_region: None,
            oom_wait: None,
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

    /// The compute limit of the program's device `ordinal` as a share in (0, 1): its own, else
    /// the all-devices one; `None` when the device has none (unset, or 100 %).
    pub fn compute_limit_for(&self, ordinal: u32) -> Option<f64> {
        self.compute_limits
            .get(&ordinal)
            .copied()
            .or(self.compute_limit)
            .filter(|&share| share < 1.0)
    }

    /// Whether any device can have a compute limit.
    pub fn compute_limits_anything(&self) -> bool {
        self.compute_limit.is_some_and(|s| s < 1.0) || self.compute_limits.values().any(|&s| s < 1.0)
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

mod env;
mod file;
mod hami;
mod load;
mod values;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod compute_tests;
#[cfg(test)]
mod hami_tests;

#[allow(unused_imports)]
pub use env::*;
#[allow(unused_imports)]
pub use file::*;
pub use hami::*;
pub use load::*;
pub use values::*;
