//! The values of the settings as text: switches, levels, modes, paths, device selectors and virtual-device splits.

#[allow(unused_imports)]
use super::*;

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

pub fn parse_compute_mode(s: &str) -> Result<ComputeMode, String> {
    let t = s.trim();
    ComputeMode::ALL
        .into_iter()
        .find(|mode| t.eq_ignore_ascii_case(mode.as_str()))
        .ok_or_else(|| "expected one of auto, duty, mps, green".to_string())
}

const COMPUTE_LIMIT_FORM: &str = "expected a share of the device's time above 0 and at most 100%, like 30% or 0.3";

/// The smallest compute limit (a millionth of the device's time).
pub const MIN_COMPUTE_LIMIT: f64 = 1e-6;

/// A compute limit: `30%` or `0.3`, in [1e-6, 1] (`100%` and `1`: no limit).
pub fn parse_compute_limit(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let (number, scale) = match t.strip_suffix('%') {
        Some(n) => (n.trim_end(), 100.0),
        None => (t, 1.0),
    };
    // (digits and one point only: no signs, exponents, `inf` or `nan`)
    let plain = !number.is_empty()
        && number.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && number.bytes().filter(|&b| b == b'.').count() <= 1
        && number != ".";
    let share = if plain { number.parse::<f64>().ok().map(|v| v / scale) } else { None };
    match share {
        // (the pacer counts shares in millionths: a smaller one would be a larger one)
        Some(v) if v > 0.0 && v < MIN_COMPUTE_LIMIT => Err(format!("{COMPUTE_LIMIT_FORM}; the smallest share is 0.0001% (0.000001)")),
        Some(v) if v > 0.0 && v <= 1.0 => Ok(v),
        Some(v) if v > 1.0 && scale == 1.0 => Err(format!(
            "{COMPUTE_LIMIT_FORM}; a number without % is a fraction (did you mean {number}%?)"
        )),
        _ => Err(COMPUTE_LIMIT_FORM.to_string()),
    }
}

/// HAMi-core's `CUDA_DEVICE_SM_LIMIT`: a whole percent from 0 to 100, 0 being no limit
/// (returned as 1, like 100 %).
pub fn parse_sm_limit(s: &str) -> Result<f64, String> {
    let t = s.trim();
    match t.parse::<u32>() {
        Ok(0) => Ok(1.0),
        Ok(p) if p <= 100 && t.bytes().all(|b| b.is_ascii_digit()) => Ok(f64::from(p) / 100.0),
        _ => Err("expected a whole percent from 0 to 100 (0: no limit), like 30".to_string()),
    }
}

/// The longest `GPUSHIM_OOM_WAIT` accepted: a day (a wait is bounded by it; longer is a typo).
pub const MAX_OOM_WAIT: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

const DURATION_FORM: &str = "expected a duration like 30s, 500ms, 2m or 1h (0: do not wait)";

/// `GPUSHIM_OOM_WAIT`: a number (decimals allowed) with a unit `ms`, `s`, `m` or `h`
/// (case-insensitive, spaces between allowed), or `0` alone; at most [`MAX_OOM_WAIT`].
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let t = s.trim();
    if t == "0" {
        return Ok(std::time::Duration::ZERO);
    }
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = (&t[..split], t[split..].trim_start());
    let plain = !number.is_empty() && number != "." && number.bytes().filter(|&b| b == b'.').count() <= 1;
    let scale = match unit.to_ascii_lowercase().as_str() {
        "ms" => 1e-3,
        "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        "" if plain => return Err(format!("{DURATION_FORM}; a number needs a unit (did you mean {number}s?)")),
        _ => return Err(DURATION_FORM.to_string()),
    };
    let seconds = if plain { number.parse::<f64>().ok().map(|v| v * scale) } else { None };
    match seconds {
        Some(v) if v <= MAX_OOM_WAIT.as_secs_f64() => Ok(std::time::Duration::from_secs_f64(v)),
        Some(_) => Err(format!("{DURATION_FORM}; at most 24h")),
        None => Err(DURATION_FORM.to_string()),
    }
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

pub(crate) fn parse_path(s: &str) -> Result<PathBuf, String> {
    if s.contains('\0') {
        return Err("a path cannot contain a NUL character".to_string());
    }
    Ok(PathBuf::from(s))
}

pub(crate) fn parse_limit(s: &str) -> Result<Limit, String> {
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

pub(crate) fn parse_ordinal_selector(t: &str) -> Result<Selector, String> {
    t.parse::<u32>()
        .map(Selector::Ordinal)
        .map_err(|_| format!("device ordinal {t} is too large"))
}

pub(crate) fn parse_uuid_selector(t: &str, rest: &str) -> Result<Selector, String> {
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

pub(crate) fn strip_prefix_ignore_case<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    if head.eq_ignore_ascii_case(prefix) {
        s.get(prefix.len()..)
    } else {
        None
    }
}

/// `BB:DD.F`, `DDDD:BB:DD.F` or `DDDDDDDD:BB:DD.F` (hex) → `dddd:bb:dd.f`.
pub(crate) fn normalise_pci_bus_id(t: &str) -> Option<String> {
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

pub(crate) fn hex_field(s: &str, max_digits: usize) -> Option<u32> {
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

pub(crate) fn push_unique_selector(list: &mut Vec<Selector>, selector: Selector) -> Result<(), String> {
    if list.contains(&selector) {
        return Err(format!("device {selector} is listed twice"));
    }
    list.push(selector);
    Ok(())
}

pub(crate) const VIRTUAL_SYNTAX: &str =
    "expected SEL:SIZE[,SIZE…] entries separated by ';', like 0:2x8GiB,4GiB";

/// `GPUSHIM_VIRTUAL_DEVICES`: `SEL:SIZE[,SIZE…][;SEL:…]`.
pub fn parse_virtual_devices(s: &str) -> Result<Vec<VirtualSplit>, String> {
    let mut out = Vec::new();
    for entry in s.trim().split(';') {
        push_unique_split(&mut out, parse_virtual_entry(entry)?)?;
    }
    Ok(out)
}

pub(crate) fn push_unique_split(list: &mut Vec<VirtualSplit>, split: VirtualSplit) -> Result<(), String> {
    if list.iter().any(|v| v.selector == split.selector) {
        return Err(format!(
            "device {} is split twice; list all its sizes in one entry, like {}:8GiB,4GiB",
            split.selector, split.selector
        ));
    }
    list.push(split);
    Ok(())
}

pub(crate) fn parse_virtual_entry(entry: &str) -> Result<VirtualSplit, String> {
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
pub(crate) fn append_virtual_sizes(out: &mut Vec<u64>, item: &str) -> Result<(), String> {
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

pub(crate) fn parse_repeat_count(n: &str, item: &str) -> Result<usize, String> {
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
pub(crate) fn parse_ordinal_suffix(suffix: &str) -> Option<u32> {
    let canonical = suffix == "0" || (!suffix.starts_with('0') && !suffix.is_empty());
    if !canonical || !suffix.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    suffix.parse().ok()
}
