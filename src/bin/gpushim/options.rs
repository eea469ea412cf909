//! The options `run` and `check` share: each one is the command-line spelling of a `GPUSHIM_…`
//! variable, its value checked with the parser the shim itself uses (so an error shows up
//! before anything runs, naming the option as typed); `cli` makes them clap arguments.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::config;
use crate::units;
use crate::Failure;

/// One option that sets a variable.
pub struct Setting {
    pub flag: &'static str,
    /// What the value looks like, for `--help` and errors; empty: a switch, which takes no
    /// value and sets the variable to `1`.
    pub value: &'static str,
    /// An example value, for "type this instead" hints.
    pub example: &'static str,
    pub var: &'static str,
    check: fn(&str) -> Result<(), String>,
    pub help: &'static str,
}

fn ok<T, E: ToString>(r: Result<T, E>) -> Result<(), String> {
    r.map(|_| ()).map_err(|e| e.to_string())
}

/// Every option that sets a variable, in the order `--help` lists them.
pub const SETTINGS: &[Setting] = &[
    Setting {
        flag: "--visible-devices",
        value: "LIST",
        example: "1,0",
        var: config::ENV_VISIBLE_DEVICES,
        check: |v| ok(config::parse_visible_devices(v)),
        help: "devices the program sees, in its order: ordinals, UUIDs (GPU-…, a unique prefix \
               is enough), PCI bus ids, or `none`",
    },
    Setting {
        flag: "--memory-limit",
        value: "LIMIT",
        example: "4GiB",
        var: config::ENV_MEMORY_LIMIT,
        check: |v| ok(units::parse_limit(v)),
        help: "limit of every device: a size (4GiB, 1500MB, bytes) or a fraction of the device \
               (40%, 0.4), or `unlimited`",
    },
    Setting {
        flag: "--virtual-devices",
        value: "SPEC",
        example: "0:2x8GiB",
        var: config::ENV_VIRTUAL_DEVICES,
        check: |v| ok(config::parse_virtual_devices(v)),
        help: "split devices: SEL:SIZE[,SIZE…][;SEL:…], NxSIZE repeats; `0:2x8GiB` makes \
               device 0 two 8 GiB devices",
    },
    Setting {
        flag: "--memory-mode",
        value: "MODE",
        example: "grow",
        var: config::ENV_MEMORY_MODE,
        check: |v| ok(config::parse_memory_mode(v)),
        help: "`passthrough` (default), `grow` (keep freed memory, never give it back) or \
               `preallocate` (take the whole limit up front)",
    },
    Setting {
        flag: "--config",
        value: "FILE",
        example: "/etc/gpushim/gpushim.toml",
        var: config::ENV_CONFIG,
        check: |v| if v.trim().is_empty() { Err("the path is empty".into()) } else { Ok(()) },
        help: "TOML config file (the options and variables override it)",
    },
    Setting {
        flag: "--log",
        value: "LEVEL",
        example: "info",
        var: config::ENV_LOG,
        check: |v| ok(config::parse_log_level(v)),
        help: "`off`, `error`, `warn` (default), `info`, `debug`, `trace`",
    },
    Setting {
        flag: "--log-file",
        value: "PATH",
        example: "/tmp/gpushim.log",
        var: config::ENV_LOG_FILE,
        check: |v| if v.trim().is_empty() { Err("the path is empty".into()) } else { Ok(()) },
        help: "write the log there instead of stderr",
    },
    Setting {
        flag: "--report",
        value: "stderr|PATH",
        example: "usage.json",
        var: config::ENV_REPORT,
        check: |v| ok(config::parse_report(v)),
        help: "at exit, per device: peak in use, peak reserved, allocations refused, the limit \
               (JSON when PATH ends in .json)",
    },
    Setting {
        flag: "--log-placement",
        value: "",
        example: "",
        var: config::ENV_LOG_PLACEMENT,
        check: |v| ok(config::parse_switch(v)),
        help: "log where kernels and allocations land: one line for the first launch of each \
               kernel and the first allocation through each API on each device, and a \
               placement summary per device at exit",
    },
    Setting {
        flag: "--shared-quota",
        value: "NAME",
        example: "job42",
        var: config::ENV_SHARED_QUOTA,
        check: |v| ok(config::parse_shared_quota(v)),
        help: "processes started with the same NAME share one budget per device",
    },
];

pub const DEVICE_LIMIT_FLAG: &str = "--memory-limit-device";
pub const LIBRARY_FLAG: &str = "--library";

/// What the options of one command said.
#[derive(Default)]
pub struct Parsed {
    /// Variables to set in the program's environment.
    pub env: Vec<(String, String)>,
    pub library: Option<PathBuf>,
}

/// Checks the values of the options `command` was given (`values`: (flag, value) of the
/// settings; `device_limits`: the values of `--memory-limit-device`) with the parsers the shim
/// uses, and turns them into variables. An error names the option as typed.
pub fn resolve(
    command: &str,
    values: &[(&'static str, String)],
    device_limits: &[String],
    library: Option<PathBuf>,
) -> Result<Parsed, Failure> {
    let usage = |message: String| Failure::usage(command, message);
    let mut parsed = Parsed { library, ..Parsed::default() };
    for (flag, value) in values {
        let setting = SETTINGS.iter().find(|s| s.flag == *flag).expect("a flag of SETTINGS");
        if !setting.value.is_empty() {
            (setting.check)(value).map_err(|reason| usage(format!("{flag} {value:?}: {reason}")))?;
        }
        parsed.env.push((setting.var.to_string(), value.clone()));
    }
    for value in device_limits {
        let flag = DEVICE_LIMIT_FLAG;
        let (ordinal, limit) = device_limit(value)
            .map_err(|reason| usage(format!("{flag} {value:?}: {reason}; type it like {flag} 0=4GiB")))?;
        parsed.env.push((format!("{}{ordinal}", config::ENV_MEMORY_LIMIT_PREFIX), limit));
    }
    Ok(parsed)
}

/// The option that sets the variable `var`.
pub fn flag_of(var: &str) -> &'static str {
    SETTINGS.iter().find(|s| s.var == var).map_or(DEVICE_LIMIT_FLAG, |s| s.flag)
}

/// `I=LIMIT` of `--memory-limit-device`: a program ordinal (no leading zeros) and a limit.
fn device_limit(value: &str) -> Result<(u32, String), String> {
    let (ordinal, limit) = value.split_once('=').ok_or("expected ORDINAL=LIMIT")?;
    let ordinal = ordinal.trim();
    let valid = !ordinal.is_empty()
        && ordinal.bytes().all(|b| b.is_ascii_digit())
        && (ordinal == "0" || !ordinal.starts_with('0'));
    let ordinal: u32 = ordinal
        .parse()
        .ok()
        .filter(|_| valid)
        .ok_or_else(|| format!("{ordinal:?} is not a device ordinal (0, 1, …)"))?;
    units::parse_limit(limit).map_err(|e| e.to_string())?;
    Ok((ordinal, limit.to_string()))
}

/// The environment a program started by the command gets: this process' environment with the
/// options' variables set on top.
pub fn environment(parsed: &Parsed) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os().collect();
    for (name, value) in &parsed.env {
        env.retain(|(n, _)| n.as_os_str() != name.as_str());
        env.push((name.into(), value.into()));
    }
    env
}

/// Loads the settings exactly as the shim would from `env`.
pub fn settings(env: &[(OsString, OsString)]) -> Result<config::Settings, config::ConfigError> {
    let names: Vec<String> = env
        .iter()
        .filter_map(|(n, _)| n.to_str())
        .filter(|n| n.starts_with("GPUSHIM_") || n.starts_with(config::ENV_ALIAS_MEMORY_LIMIT) || n.starts_with(config::ENV_ALIAS_SM_LIMIT))
        .map(str::to_string)
        .collect();
    let lookup = |name: &str| {
        env.iter()
            .rev()
            .find(|(n, _)| n.as_os_str() == name)
            .map(|(_, v)| v.to_string_lossy().into_owned())
    };
    config::load_from(&lookup, &names)
}
