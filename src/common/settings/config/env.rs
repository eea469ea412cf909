//! The environment layer: `GPUSHIM_…` variables, the HAMi-core aliases and the warnings about unknown names.

#[allow(unused_imports)]
use super::*;

// ---------------------------------------------------------------------------------------------
// The environment
// ---------------------------------------------------------------------------------------------

pub(crate) type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

pub(crate) const EMPTY_ENV: &str = "the value is empty; unset the variable for the default, or give a value";

/// The variable's value parsed with `parse`, `None` when unset; empty values are errors.
pub(crate) fn env_setting<T>(
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

pub(crate) fn env_layer(env: Env<'_>, names: &[String]) -> Result<Box<Layer>, ConfigError> {
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
    layer.compute_limit = env_setting(env, ENV_COMPUTE_LIMIT, parse_compute_limit)?;
    layer.compute_limits = env_per_device(env, names, ENV_COMPUTE_LIMIT_PREFIX, parse_compute_limit)?;
    layer.compute_mode = env_setting(env, ENV_COMPUTE_MODE, parse_compute_mode)?;
    layer.oom_wait = env_setting(env, ENV_OOM_WAIT, parse_duration)?;
    Ok(layer)
}

pub(crate) fn alias_layer(env: Env<'_>, names: &[String]) -> Result<Box<Layer>, ConfigError> {
    // (set field by field into a boxed layer, as `env_layer`: a `Layer` built by value would
    // take a kilobyte of the first CUDA call's stack)
    let mut layer = Box::<Layer>::default();
    // (HAMi-core's meanings: see `hami`)
    hami_memory_limits(env, names, &mut layer)?;
    layer.compute_limit = env_setting(env, ENV_ALIAS_SM_LIMIT, parse_sm_limit)?;
    layer.compute_limits = hami_sm_limits(env, names)?;
    layer.log_level = env_setting(env, ENV_HAMI_LOG_LEVEL, parse_hami_log_level)?;
    if configured_through_hami(names) {
        // (unset: HAMi-core's default path; empty: an error, as for every path)
        layer.hami_region = Some(
            env_setting(env, ENV_HAMI_SHARED_CACHE, parse_path)?
                .unwrap_or_else(|| (PathBuf::from(HAMI_DEFAULT_REGION), Source::Default)),
        );
    }
    Ok(layer)
}

/// `<prefix><i>` variables, in name order so the first error reported does not depend on
/// the order of the environment.
pub(crate) fn env_device_limits(
    env: Env<'_>,
    names: &[String],
    prefix: &str,
) -> Result<BTreeMap<u32, (Limit, Source)>, ConfigError> {
    env_per_device(env, names, prefix, parse_limit)
}

/// `<prefix><i>` variables parsed with `parse` (see [`env_device_limits`]).
pub(crate) fn env_per_device<T>(
    env: Env<'_>,
    names: &[String],
    prefix: &str,
    parse: fn(&str) -> Result<T, String>,
) -> Result<BTreeMap<u32, (T, Source)>, ConfigError> {
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
        if let Some(limit) = env_setting(env, name, parse)? {
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
pub(crate) fn malformed_name(env: Env<'_>, name: &str) -> Option<ConfigError> {
    let per_device = [ENV_MEMORY_LIMIT_PREFIX, ENV_ALIAS_MEMORY_LIMIT_PREFIX, ENV_COMPUTE_LIMIT_PREFIX, ENV_ALIAS_SM_LIMIT_PREFIX];
    if name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') || per_device.iter().any(|p| name.starts_with(p)) {
        return None;
    }
    let reason = "the variable's name holds characters no setting has (only A-Z, a-z, 0-9 and _; \
                  bytes that are not UTF-8 are shown as \u{fffd}); rename or unset it";
    Some(ConfigError::new(name.escape_debug().to_string(), env(name).unwrap_or_default(), reason))
}

pub(crate) fn unknown_env_warnings(names: &[String]) -> Vec<String> {
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
