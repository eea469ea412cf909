//! The simulators' settings, read from the environment once per library: by its load-time
//! constructor, or at first use.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `GPUSIM_DEVICES` | physical device count, 1..=16 | 2 |
//! | `GPUSIM_MEMORY` | per-device total memory, comma list (one value = all devices; a shorter list repeats its last value) | `16GiB` |
//! | `GPUSIM_DRIVER_VERSION` | what `cuDriverGetVersion` / `nvmlSystemGetCudaDriverVersion` return | 13050 |
//! | report variable (`GPUSIM_REPORT` for the driver, `GPUSIM_NVML_REPORT` for NVML) | path of the library's JSON report written at exit | unset |
//! | `GPUSIM_TRACE` | `1`/`true`/`yes`: one stderr line per call | unset |
//! | `GPUSIM_FAIL` | `NAME=CODE[@N],…`: the function `NAME` fails with `CODE` (every call, or its N-th) — see `faults` | unset |
//!
//! An invalid value prints one warning (`<prefix>: …`) to stderr and the default is used.

use crate::ffi::{guard_value, trace_line};
use std::sync::atomic::{AtomicI32, AtomicU8, Ordering};
use std::sync::OnceLock;

pub const MAX_DEVICES: usize = 16;
pub const DEFAULT_DEVICES: usize = 2;
pub const DEFAULT_MEMORY: u64 = 16 << 30;
pub const DEFAULT_DRIVER_VERSION: i32 = 13050;

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub devices: usize,
    /// Total memory of each physical device (`devices` entries).
    pub memory: Vec<u64>,
    pub driver_version: i32,
    /// The path in the library's report variable (`Settings::report_var`), if set and non-empty.
    pub report: Option<String>,
    pub trace: bool,
}

/// One library's settings: what it calls itself in stderr lines, which variable names its
/// report, and how the report is made. Meant for a `static`:
///
/// ```ignore
/// static SETTINGS: Settings = Settings::new("gpusim", "GPUSIM_REPORT", crate::stats::report_json);
/// ```
pub struct Settings {
    /// Start of every stderr line: `gpusim` (driver), `gpusim-nvml` (NVML).
    pub prefix: &'static str,
    /// The variable holding the exit report's path.
    pub report_var: &'static str,
    /// The report's contents, made at exit.
    pub report_json: fn() -> String,
    config: OnceLock<Config>,
    /// 0 = unknown, 1 = off, 2 = on: lets `trace_enabled` avoid the OnceLock on the hot path.
    trace: AtomicU8,
}

impl Settings {
    pub const fn new(
        prefix: &'static str,
        report_var: &'static str,
        report_json: fn() -> String,
    ) -> Settings {
        Settings {
            prefix,
            report_var,
            report_json,
            config: OnceLock::new(),
            trace: AtomicU8::new(0),
        }
    }

    /// The configuration, read from the environment at the first call. If the report variable
    /// is set, that first call also registers (`atexit`) the writing of the report.
    pub fn get(&'static self) -> &'static Config {
        self.config.get_or_init(|| {
            let c = self.from_env(|k| std::env::var(k).ok());
            if c.report.is_some() {
                register_report_at_exit(self);
            }
            c
        })
    }

    #[inline]
    pub fn trace_enabled(&'static self) -> bool {
        match self.trace.load(Ordering::Relaxed) {
            1 => false,
            2 => true,
            _ => {
                let on = self.get().trace;
                self.trace.store(if on { 2 } else { 1 }, Ordering::Relaxed);
                on
            }
        }
    }

    /// The configuration `var` describes (warnings go to stderr with this library's prefix).
    pub fn from_env(&self, var: impl Fn(&str) -> Option<String>) -> Config {
        from_env(self.prefix, self.report_var, var)
    }
}

/// A library's `config` module, in one line:
///
/// ```ignore
/// gpusim_common::settings!(prefix "gpusim", report "GPUSIM_REPORT", json crate::stats::report_json);
/// ```
/// defines there `PREFIX` (the start of the library's stderr lines), the `static SETTINGS`,
/// `get()` (the configuration, read once), `trace_enabled()` and, for tests, `from_env(var)`.
#[macro_export]
macro_rules! settings {
    (prefix $prefix:literal, report $report_var:literal, json $report_json:path $(,)?) => {
        pub use $crate::config::Config;

        /// Start of every stderr line the library writes.
        pub const PREFIX: &str = $prefix;

        /// What the library reads from the environment, and where its report goes.
        pub static SETTINGS: $crate::config::Settings =
            $crate::config::Settings::new(PREFIX, $report_var, $report_json);

        /// The configuration, read from the environment at the first call.
        pub fn get() -> &'static Config {
            SETTINGS.get()
        }

        /// `GPUSIM_TRACE` is on.
        #[inline]
        pub fn trace_enabled() -> bool {
            SETTINGS.trace_enabled()
        }

        /// The configuration `var` would give (the environment is not read).
        #[cfg(test)]
        pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Config {
            SETTINGS.from_env(var)
        }
    };
}

/// The one `Settings` whose report this copy of the crate writes at exit.
static REPORTING: OnceLock<&'static Settings> = OnceLock::new();
/// The process that registered the report: a forked child (which inherits the `atexit` entry
/// but not the other threads) writes none. It would overwrite its parent's report, and making
/// one takes the library's locks, which a thread of the parent may have held at the fork (the
/// child would wait for ever on its way out).
static REPORTING_PID: AtomicI32 = AtomicI32::new(0);

fn register_report_at_exit(s: &'static Settings) {
    extern "C" fn at_exit() {
        guard_value((), || {
            // SAFETY: getpid has no preconditions.
            if REPORTING_PID.load(Ordering::Relaxed) != unsafe { libc::getpid() } {
                return;
            }
            let Some(s) = REPORTING.get() else { return };
            if let Some(path) = s.get().report.as_deref() {
                if let Err(e) = std::fs::write(path, (s.report_json)()) {
                    trace_line(&format!(
                        "{}: cannot write {}={path}: {e}\n",
                        s.prefix, s.report_var
                    ));
                }
            }
        })
    }
    if REPORTING.set(s).is_ok() {
        // SAFETY: getpid has no preconditions; registering a plain function with libc.
        unsafe {
            REPORTING_PID.store(libc::getpid(), Ordering::Relaxed);
            libc::atexit(at_exit);
        }
    }
}

/// The configuration `var` describes; `prefix` starts the warning lines, `report_var` is the
/// variable holding the report path.
pub fn from_env(prefix: &str, report_var: &str, var: impl Fn(&str) -> Option<String>) -> Config {
    let warn = |msg: &str| trace_line(&format!("{prefix}: {msg}\n"));
    let devices = match var("GPUSIM_DEVICES") {
        None => DEFAULT_DEVICES,
        Some(s) => match s.trim().parse::<usize>() {
            Ok(n) if (1..=MAX_DEVICES).contains(&n) => n,
            _ => {
                warn(&format!(
                    "GPUSIM_DEVICES={s:?}: expected 1..=16, using {DEFAULT_DEVICES}"
                ));
                DEFAULT_DEVICES
            }
        },
    };
    let memory = match var("GPUSIM_MEMORY") {
        None => vec![DEFAULT_MEMORY; devices],
        Some(s) => match parse_memory_list(&s, devices) {
            Some(m) => m,
            None => {
                warn(&format!(
                    "GPUSIM_MEMORY={s:?}: expected sizes like 16GiB, using 16GiB"
                ));
                vec![DEFAULT_MEMORY; devices]
            }
        },
    };
    let driver_version = match var("GPUSIM_DRIVER_VERSION") {
        None => DEFAULT_DRIVER_VERSION,
        Some(s) => match s.trim().parse::<i32>() {
            Ok(v) if v > 0 => v,
            _ => {
                warn(&format!(
                    "GPUSIM_DRIVER_VERSION={s:?}: expected a number like 13050"
                ));
                DEFAULT_DRIVER_VERSION
            }
        },
    };
    let report = var(report_var).filter(|s| !s.is_empty());
    let trace = matches!(
        var("GPUSIM_TRACE").as_deref().map(str::trim),
        Some("1" | "true" | "yes")
    );
    Config {
        devices,
        memory,
        driver_version,
        report,
        trace,
    }
}

/// `"16GiB"`, `"1GiB,2GiB"`: one value for all devices, or one per device (a shorter list
/// repeats its last value; a longer one is cut).
pub fn parse_memory_list(s: &str, devices: usize) -> Option<Vec<u64>> {
    let vals: Vec<u64> = s.split(',').map(parse_size).collect::<Option<_>>()?;
    let last = *vals.last()?;
    Some(
        (0..devices)
            .map(|i| vals.get(i).copied().unwrap_or(last))
            .collect(),
    )
}

/// A size: a whole or decimal number with an optional unit, case-insensitive: none/`B` = bytes,
/// `K`/`Ki`/`KiB`, `M`/`Mi`/`MiB`, `G`/`Gi`/`GiB`, `T`/`Ti`/`TiB` = powers of 1024,
/// `KB`/`MB`/`GB`/`TB` = powers of 1000. Zero is refused (a device has memory).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = (s[..split].trim(), s[split..].trim().to_ascii_lowercase());
    if num.is_empty() || num.starts_with('.') || num.ends_with('.') {
        return None;
    }
    let mult: u64 = match unit.as_str() {
        "" | "b" => 1,
        "k" | "ki" | "kib" => 1 << 10,
        "m" | "mi" | "mib" => 1 << 20,
        "g" | "gi" | "gib" => 1 << 30,
        "t" | "ti" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return None,
    };
    let bytes = if let Some((int, frac)) = num.split_once('.') {
        if frac.contains('.') || mult == 1 {
            return None;
        }
        let int: u64 = int.parse().ok()?;
        let frac_digits = frac.len().min(18) as u32;
        let frac_val: u128 = frac[..frac_digits as usize].parse().ok()?;
        let whole = (int as u128).checked_mul(mult as u128)?;
        whole + frac_val * mult as u128 / 10u128.pow(frac_digits)
    } else {
        (num.parse::<u64>().ok()? as u128).checked_mul(mult as u128)?
    };
    if bytes == 0 || bytes > u64::MAX as u128 {
        return None;
    }
    Some(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    fn from(pairs: &'static [(&'static str, &'static str)]) -> Config {
        from_env("gpusim-test", "GPUSIM_TEST_REPORT", env(pairs))
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("16GiB"), Some(16 << 30));
        assert_eq!(parse_size("16gib"), Some(16 << 30));
        assert_eq!(parse_size(" 512 MiB "), Some(512 << 20));
        assert_eq!(parse_size("1024"), Some(1024));
        assert_eq!(parse_size("4KiB"), Some(4096));
        assert_eq!(parse_size("1.5GiB"), Some(3 << 29));
        assert_eq!(parse_size("2GB"), Some(2_000_000_000));
        assert_eq!(parse_size("08G"), Some(8 << 30));
        assert_eq!(parse_size("1TB"), Some(1_000_000_000_000));
        assert_eq!(parse_size("2t"), Some(2 << 40));
        assert_eq!(parse_size("0"), None);
        assert_eq!(parse_size("-1"), None);
        assert_eq!(parse_size("4 gigs"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("1.5"), None);
        assert_eq!(parse_size("1.5.1GiB"), None);
        assert_eq!(parse_size(".5GiB"), None);
        assert_eq!(parse_size("99999999999TiB"), None);
    }

    #[test]
    fn defaults() {
        let c = from(&[]);
        assert_eq!(c.devices, 2);
        assert_eq!(c.memory, vec![16 << 30, 16 << 30]);
        assert_eq!(c.driver_version, 13050);
        assert_eq!(c.report, None);
        assert!(!c.trace);
    }

    #[test]
    fn memory_lists() {
        let c = from(&[("GPUSIM_DEVICES", "3"), ("GPUSIM_MEMORY", "1GiB,2GiB")]);
        assert_eq!(c.memory, vec![1 << 30, 2 << 30, 2 << 30]);
        let c = from(&[("GPUSIM_DEVICES", "1"), ("GPUSIM_MEMORY", "1GiB,2GiB")]);
        assert_eq!(c.memory, vec![1 << 30]);
        let c = from(&[("GPUSIM_MEMORY", "bogus")]);
        assert_eq!(c.memory, vec![16 << 30; 2]);
        let c = from(&[("GPUSIM_DEVICES", "17")]);
        assert_eq!(c.devices, 2);
        let c = from(&[("GPUSIM_DEVICES", "0")]);
        assert_eq!(c.devices, 2);
        let c = from(&[("GPUSIM_DEVICES", "16"), ("GPUSIM_DRIVER_VERSION", "12090")]);
        assert_eq!((c.devices, c.driver_version), (16, 12090));
        let c = from(&[("GPUSIM_DRIVER_VERSION", "-5")]);
        assert_eq!(c.driver_version, 13050);
    }

    #[test]
    fn report_and_trace() {
        let c = from(&[
            ("GPUSIM_TEST_REPORT", "/tmp/r.json"),
            ("GPUSIM_REPORT", "/x"),
        ]);
        assert_eq!(c.report.as_deref(), Some("/tmp/r.json"));
        assert_eq!(from(&[("GPUSIM_TEST_REPORT", "")]).report, None);
        for on in ["1", "true", "yes", " 1 "] {
            let c = from_env("p", "R", move |k| {
                (k == "GPUSIM_TRACE").then(|| on.to_string())
            });
            assert!(c.trace, "{on:?}");
        }
        assert!(!from(&[("GPUSIM_TRACE", "0")]).trace);
        assert!(!from(&[("GPUSIM_TRACE", "on")]).trace);
    }

    #[test]
    fn settings_from_env() {
        fn report() -> String {
            String::from("{}")
        }
        static S: Settings = Settings::new("gpusim-test", "GPUSIM_TEST_REPORT", report);
        let c = S.from_env(env(&[
            ("GPUSIM_TEST_REPORT", "/r"),
            ("GPUSIM_DEVICES", "4"),
        ]));
        assert_eq!((c.devices, c.report.as_deref()), (4, Some("/r")));
        assert_eq!(
            (S.prefix, S.report_var),
            ("gpusim-test", "GPUSIM_TEST_REPORT")
        );
    }
}
