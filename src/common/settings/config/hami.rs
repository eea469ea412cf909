//! HAMi-core's variables read with HAMi-core's meaning (SPEC "HAMi-core's names (drop-in)"):
//! `CUDA_DEVICE_MEMORY_LIMIT(_<i>)`, `CUDA_DEVICE_SM_LIMIT(_<i>)`, `CUDA_DEVICE_MEMORY_SHARED_CACHE`,
//! `LIBCUDA_LOG_LEVEL` and `CUDA_DISABLE_CONTROL`.
//!
//! HAMi-core (commit 8f3a89c) reads a size with `strtoul(value, _, 0)` after taking a last `k`,
//! `m` or `g` (either case) as a power of 1024: decimal, `0x` hex and, with a leading zero,
//! octal; it stops at the first character it does not understand, and `0` (or nothing it can
//! read) means "no limit". Where that reading and the shim's own size grammar agree, the value
//! means what HAMi-core makes of it. Where HAMi-core silently misreads a value the shim's grammar
//! understands (`1GiB` is 1 byte to it, `50%` 50 bytes, `1.5g` 1 GiB, `010` 8 bytes), the shim
//! does what the user meant and says so once (a line in [`Settings::warnings`] naming the
//! variable and both readings). Anything else (`4 gigs`, `-1`, a number past 2^64 − 1, control
//! characters) is a configuration error naming the variable: HAMi-core would run such a program
//! with a limit nobody asked for.
//!
//! Zero means "no limit" for the all-devices variable and "fall back to the all-devices value"
//! for `_<i>`, exactly as unset: HAMi-core cannot tell the two apart, so neither does the shim
//! (a `CUDA_DEVICE_MEMORY_LIMIT=0` next to a config file's `memory_limit` leaves the file's).
//! An empty value is read as zero, as HAMi-core does.

#[allow(unused_imports)]
use super::*;

/// HAMi-core's shared region file (see `state_files::hami`).
pub const ENV_HAMI_SHARED_CACHE: &str = "CUDA_DEVICE_MEMORY_SHARED_CACHE";
/// HAMi-core's log level, 0 to 4.
pub const ENV_HAMI_LOG_LEVEL: &str = "LIBCUDA_LOG_LEVEL";
/// Read by HAMi's device plugin; here `true` passes everything through, as `GPUSHIM_DISABLE`.
pub const ENV_HAMI_DISABLE: &str = "CUDA_DISABLE_CONTROL";
/// HAMi-core's region file when `CUDA_DEVICE_MEMORY_SHARED_CACHE` is unset.
pub const HAMI_DEFAULT_REGION: &str = "/tmp/cudevshr.cache";

/// What a HAMi size variable holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HamiSize {
    /// `None`: zero, empty or `unlimited` (no limit / fall back to the all-devices value).
    pub limit: Option<Limit>,
    /// HAMi-core's own reading when it differs from `limit` (in bytes, 0 = no limit).
    pub hami_reads: Option<u64>,
}

/// HAMi-core's reading of a size variable, in bytes; 0 is "no limit" (as its overflow check).
pub fn hami_core_reading(value: &str) -> u64 {
    let bytes = value.as_bytes();
    let scalar: u64 = match bytes.last() {
        Some(b'g' | b'G') => 1 << 30,
        Some(b'm' | b'M') => 1 << 20,
        Some(b'k' | b'K') => 1 << 10,
        _ => 1,
    };
    let res = strtoul0(bytes);
    let scaled = res.wrapping_mul(scalar);
    if scaled == 0 || scaled / scalar != res {
        0
    } else {
        scaled
    }
}

/// C's `strtoul(s, _, 0)` on a 64-bit machine: leading white space, a sign, then `0x` hex, `0`
/// octal or decimal digits up to the first other character; saturates at `u64::MAX`; a minus
/// sign negates in unsigned arithmetic.
fn strtoul0(s: &[u8]) -> u64 {
    let mut i = 0;
    while i < s.len() && matches!(s[i], b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c) {
        i += 1;
    }
    let mut negative = false;
    if i < s.len() && (s[i] == b'+' || s[i] == b'-') {
        negative = s[i] == b'-';
        i += 1;
    }
    let mut base = 10u64;
    if s.get(i) == Some(&b'0') {
        if matches!(s.get(i + 1), Some(b'x' | b'X')) && s.get(i + 2).is_some_and(u8::is_ascii_hexdigit) {
            base = 16;
            i += 2;
        } else {
            base = 8;
        }
    }
    let mut value: u64 = 0;
    let mut overflow = false;
    while let Some(d) = s.get(i).and_then(|&c| (c as char).to_digit(base as u32)) {
        match value.checked_mul(base).and_then(|v| v.checked_add(u64::from(d))) {
            Some(v) => value = v,
            None => overflow = true,
        }
        i += 1;
    }
    if overflow {
        u64::MAX
    } else if negative {
        value.wrapping_neg()
    } else {
        value
    }
}

/// The forms HAMi-core and the shim read alike: decimal digits without a leading zero (or `0`)
/// or `0x` hex, with an optional last `k`, `m` or `g`. `Some(bytes)`; `None` for another form.
fn common_form(t: &str) -> Option<u64> {
    let (number, scalar) = match t.as_bytes().last()? {
        b'g' | b'G' => (&t[..t.len() - 1], 1u64 << 30),
        b'm' | b'M' => (&t[..t.len() - 1], 1 << 20),
        b'k' | b'K' => (&t[..t.len() - 1], 1 << 10),
        _ => (t, 1),
    };
    let value = if let Some(hex) = number.strip_prefix("0x").or_else(|| number.strip_prefix("0X")) {
        if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u64::from_str_radix(hex, 16).ok()
    } else {
        if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) || (number.len() > 1 && number.starts_with('0')) {
            return None;
        }
        number.parse::<u64>().ok()
    };
    // (past 2^64 - 1: `None`, and the shim's grammar says why)
    value.and_then(|v| v.checked_mul(scalar))
}

/// Parses a HAMi size variable (see the module docs).
pub fn parse_hami_size(value: &str) -> Result<HamiSize, String> {
    let t = value.trim();
    let hami = hami_core_reading(value);
    if t.is_empty() {
        return Ok(HamiSize { limit: None, hami_reads: None });
    }
    let ours = match common_form(t) {
        Some(bytes) => Limit::Bytes(bytes),
        None => units::parse_limit(t).map_err(|e| e.to_string())?,
    };
    let limit = match ours {
        Limit::Bytes(0) | Limit::Unlimited => None,
        other => Some(other),
    };
    let same = match limit {
        None => hami == 0,
        Some(Limit::Bytes(b)) => b == hami,
        _ => false,
    };
    Ok(HamiSize { limit, hami_reads: (!same).then_some(hami) })
}

/// The line said once about a value HAMi-core would misread.
pub fn misread_note(name: &str, value: &str, size: &HamiSize) -> Option<String> {
    let hami = size.hami_reads?;
    let theirs = if hami == 0 { "no limit".to_string() } else { format!("{hami} bytes") };
    let ours = match size.limit {
        None => "no limit".to_string(),
        Some(Limit::Bytes(b)) => format!("{b} bytes ({})", units::format_size(b)),
        Some(Limit::Fraction(f)) => format!("{}% of the device's memory", f * 100.0),
        Some(Limit::Unlimited) => "no limit".to_string(),
    };
    Some(format!(
        "{name}={:?}: HAMi-core would read {theirs}; gpushim reads {ours}, as meant (HAMi-core's own forms: 4g, 4096m, bytes)",
        value.escape_debug().to_string()
    ))
}

/// `LIBCUDA_LOG_LEVEL`: a whole number (HAMi-core reads it with `atoi`): 0 or less nothing,
/// 1 errors, 2 warnings (HAMi-core's default), 3 info, 4 or more debug.
pub fn parse_hami_log_level(s: &str) -> Result<LogLevel, String> {
    match s.trim().parse::<i64>() {
        Ok(n) if n <= 0 => Ok(LogLevel::Off),
        Ok(1) => Ok(LogLevel::Error),
        Ok(2) => Ok(LogLevel::Warn),
        Ok(3) => Ok(LogLevel::Info),
        Ok(_) => Ok(LogLevel::Debug),
        Err(_) => Err("expected HAMi-core's log level, a whole number from 0 (nothing) to 4 (debug)".to_string()),
    }
}

/// The HAMi layer's memory limits: the all-devices one (zero: unset) and `_<i>` (zero: left out,
/// so the all-devices value applies), with the misread notes.
pub(crate) fn hami_memory_limits(env: Env<'_>, names: &[String], layer: &mut Layer) -> Result<(), ConfigError> {
    let mut one = |name: &str| -> Result<Option<(Limit, Source)>, ConfigError> {
        let Some(value) = env(name) else { return Ok(None) };
        let size = parse_hami_size(&value).map_err(|reason| ConfigError::new(name, value.clone(), reason))?;
        if let Some(note) = misread_note(name, &value, &size) {
            layer.notes.push(note);
        }
        Ok(size.limit.map(|l| (l, Source::Env(name.to_string()))))
    };
    let global = one(ENV_ALIAS_MEMORY_LIMIT)?;
    let mut matching: Vec<&String> = names.iter().filter(|n| n.starts_with(ENV_ALIAS_MEMORY_LIMIT_PREFIX)).collect();
    matching.sort();
    matching.dedup();
    let mut per_device = BTreeMap::new();
    for name in matching {
        let suffix = name.get(ENV_ALIAS_MEMORY_LIMIT_PREFIX.len()..).unwrap_or("");
        let Some(ordinal) = parse_ordinal_suffix(suffix) else {
            let reason = format!(
                "\"{}\" after {ENV_ALIAS_MEMORY_LIMIT_PREFIX} is not a device ordinal; name the device by the \
                 ordinal the program sees, like {ENV_ALIAS_MEMORY_LIMIT_PREFIX}0",
                suffix.escape_debug()
            );
            return Err(ConfigError::new(name.escape_debug().to_string(), env(name).unwrap_or_default(), reason));
        };
        if let Some(limit) = one(name)? {
            per_device.insert(ordinal, limit);
        }
    }
    layer.memory_limit = global;
    layer.device_limits = per_device;
    Ok(())
}

/// `CUDA_DEVICE_SM_LIMIT_<i>=0` falls back to the all-devices value (HAMi-core), so zero
/// entries are left out of the layer.
pub(crate) fn hami_sm_limits(env: Env<'_>, names: &[String]) -> Result<BTreeMap<u32, (f64, Source)>, ConfigError> {
    let mut out = env_per_device(env, names, ENV_ALIAS_SM_LIMIT_PREFIX, parse_sm_limit)?;
    out.retain(|&ordinal, _| {
        let name = format!("{ENV_ALIAS_SM_LIMIT_PREFIX}{ordinal}");
        env(&name).is_none_or(|v| v.trim().parse::<u32>() != Ok(0))
    });
    Ok(out)
}

/// Whether the process is configured through HAMi's variables (so HAMi-core's shared region
/// applies): any `CUDA_DEVICE_MEMORY_LIMIT*`, `CUDA_DEVICE_SM_LIMIT*` or
/// `CUDA_DEVICE_MEMORY_SHARED_CACHE` is set.
pub fn configured_through_hami(names: &[String]) -> bool {
    names.iter().any(|n| {
        n.starts_with(ENV_ALIAS_MEMORY_LIMIT) || n.starts_with(ENV_ALIAS_SM_LIMIT) || n == ENV_HAMI_SHARED_CACHE
    })
}
