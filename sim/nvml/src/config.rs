//! The simulator's settings, read from the environment once: by the load-time constructor
//! (`lib.rs`), or at first use.
//!
//! Copied from `sim/cuda/src/config.rs` (which cannot be included as is: it calls into that
//! crate's `stats` and `ffi`), so that both simulated libraries describe the same devices from
//! the same environment. Keep `parse_size`, `parse_memory_list` and the `GPUSIM_DEVICES`,
//! `GPUSIM_MEMORY` and `GPUSIM_DRIVER_VERSION` rules identical to the original.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `GPUSIM_DEVICES` | physical device count, 1..=16 | 2 |
//! | `GPUSIM_MEMORY` | per-device total memory, comma list (one value = all devices; a shorter list repeats its last value) | `16GiB` |
//! | `GPUSIM_DRIVER_VERSION` | what `nvmlSystemGetCudaDriverVersion[_v2]` returns | 13050 |
//! | `GPUSIM_NVML_REPORT` | path of the JSON report written at exit | unset |
//! | `GPUSIM_TRACE` | `1`: one stderr line per NVML call | unset |
//!
//! An invalid value prints one warning to stderr and the default is used.

use std::sync::atomic::{AtomicU8, Ordering};
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
    pub report: Option<String>,
    pub trace: bool,
}

static CONFIG: OnceLock<Config> = OnceLock::new();
/// 0 = unknown, 1 = off, 2 = on: lets `trace_enabled` avoid the OnceLock on the hot path.
static TRACE: AtomicU8 = AtomicU8::new(0);

pub fn get() -> &'static Config {
    CONFIG.get_or_init(|| {
        let c = from_env(|k| std::env::var(k).ok());
        if c.report.is_some() {
            crate::registry::register_report_at_exit();
        }
        c
    })
}

#[inline]
pub fn trace_enabled() -> bool {
    match TRACE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let on = get().trace;
            TRACE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
            on
        }
    }
}

fn warn(msg: &str) {
    crate::ffi::trace_line(&format!("gpusim-nvml: {msg}\n"));
}

pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Config {
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
    let report = var("GPUSIM_NVML_REPORT").filter(|s| !s.is_empty());
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
        assert_eq!(parse_size("0"), None);
        assert_eq!(parse_size("-1"), None);
        assert_eq!(parse_size("4 gigs"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("1.5"), None);
    }

    #[test]
    fn defaults() {
        let c = from_env(env(&[]));
        assert_eq!(c.devices, 2);
        assert_eq!(c.memory, vec![16 << 30, 16 << 30]);
        assert_eq!(c.driver_version, 13050);
        assert_eq!(c.report, None);
        assert!(!c.trace);
    }

    #[test]
    fn memory_lists() {
        let c = from_env(env(&[
            ("GPUSIM_DEVICES", "3"),
            ("GPUSIM_MEMORY", "1GiB,2GiB"),
        ]));
        assert_eq!(c.memory, vec![1 << 30, 2 << 30, 2 << 30]);
        let c = from_env(env(&[
            ("GPUSIM_DEVICES", "1"),
            ("GPUSIM_MEMORY", "1GiB,2GiB"),
        ]));
        assert_eq!(c.memory, vec![1 << 30]);
        let c = from_env(env(&[("GPUSIM_MEMORY", "bogus")]));
        assert_eq!(c.memory, vec![16 << 30; 2]);
        let c = from_env(env(&[("GPUSIM_DEVICES", "17")]));
        assert_eq!(c.devices, 2);
        let c = from_env(env(&[
            ("GPUSIM_DEVICES", "16"),
            ("GPUSIM_DRIVER_VERSION", "12090"),
            ("GPUSIM_NVML_REPORT", "/tmp/x.json"),
            ("GPUSIM_REPORT", "/tmp/cuda.json"),
        ]));
        assert_eq!((c.devices, c.driver_version), (16, 12090));
        assert_eq!(c.report.as_deref(), Some("/tmp/x.json"));
    }
}
