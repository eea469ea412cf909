//! Loading the settings: the entry points, the layers (environment, aliases, file) and how they merge.

#[allow(unused_imports)]
use super::*;

// ---------------------------------------------------------------------------------------------
// Entry points
// ---------------------------------------------------------------------------------------------

/// Loads the settings from the process environment and the config file.
#[inline(never)] // a start-up step scripts/bench.sh counts by name
pub fn load() -> Result<Settings, ConfigError> {
    if crate::settings::secure::secure_execution() {
        // (see `secure`: the system file alone, its paths absolute, no log or report file)
        let mut settings = require_absolute_paths(load_from(&|_| None, &[])?)?;
        settings.log_file = None;
        if matches!(settings.report, Some(ReportTarget::Path(_))) {
            settings.report = None;
        }
        return Ok(settings);
    }
    pub(crate) const PREFIXES: [&str; 6] =
        ["GPUSHIM_", ENV_ALIAS_MEMORY_LIMIT, ENV_ALIAS_SM_LIMIT, ENV_HAMI_SHARED_CACHE, ENV_HAMI_LOG_LEVEL, ENV_HAMI_DISABLE];
    let vars = env_vars_starting_with(&PREFIXES);
    let names: Vec<String> = vars.iter().map(|(n, _)| n.clone()).collect();
    // Every name asked for has one of the prefixes, so it is among `vars` (the first of
    // duplicates, as `getenv` answers) or unset; another name (none today) asks `getenv`.
    // Non-UTF-8 values are read lossily: a size then fails to parse, a path would not match.
    let env = |name: &str| {
        if PREFIXES.iter().any(|p| name.starts_with(p)) {
            vars.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone())
        } else {
            crate::unforked::var_os(name).map(|v| v.to_string_lossy().into_owned())
        }
    };
    load_from(&env, &names)
}

/// In a secure-execution process (`secure`): every path setting must be absolute, since a
/// relative one names a file in the caller's current directory.
pub(crate) fn require_absolute_paths(settings: Settings) -> Result<Settings, ConfigError> {
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
pub(crate) fn env_names_starting_with(prefixes: &[&str]) -> Vec<String> {
    env_vars_starting_with(prefixes).into_iter().map(|(n, _)| n).collect()
}

/// The environment variables whose names start with one of `prefixes`, with their names and
/// values (read lossily), in the environment's order, the first of duplicate names only. Reads the C library's `environ` in place, once: `std::env::vars_os` would copy every
/// variable of the process to keep a few (15,000 instructions in a small environment), and a
/// `getenv` per setting would scan the whole environment ~20 times.
pub(crate) fn env_vars_starting_with(prefixes: &[&str]) -> Vec<(String, String)> {
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

pub(crate) fn load_with_default(
    env: &dyn Fn(&str) -> Option<String>,
    env_names: &[String],
    default_path: &Path,
) -> Result<Settings, ConfigError> {
    let env_disable = env(ENV_DISABLE);
    if env_disable.as_deref().is_some_and(parse_disable) {
        return Ok(Settings::disabled_by(Source::Env(ENV_DISABLE.to_string())));
    }
    // HAMi's `CUDA_DISABLE_CONTROL=true`, below `GPUSHIM_DISABLE` (set to another value: active)
    if env_disable.is_none() && env(ENV_HAMI_DISABLE).as_deref().is_some_and(parse_disable) {
        return Ok(Settings::disabled_by(Source::Env(ENV_HAMI_DISABLE.to_string())));
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
pub(crate) fn file_layer(env: Env<'_>, default_path: &Path) -> Result<Box<Layer>, ConfigError> {
    match config_file(env, default_path)? {
        Some(file) => parse_file(&file.text, &file.path).map_err(|e| file.annotate(e)),
        None => Ok(Box::default()),
    }
}

/// The settings of `merged` under the environment's layers.
#[inline(never)]
pub(crate) fn with_env(
    mut merged: Box<Layer>,
    env: Env<'_>,
    env_names: &[String],
) -> Result<Settings, ConfigError> {
    merged.overlay(alias_layer(env, env_names)?);
    merged.overlay(env_layer(env, env_names)?);
    let notes = std::mem::take(&mut merged.notes);
    let mut settings = merged.into_settings();
    settings.warnings = unknown_env_warnings(env_names);
    settings.warnings.extend(notes);
    Ok(settings)
}

// ---------------------------------------------------------------------------------------------
// Layers: what one source sets, merged from lowest to highest precedence.
// ---------------------------------------------------------------------------------------------

pub(crate) type Sourced<T> = Option<(T, Source)>;

#[derive(Debug, Default)]
pub(crate) struct Layer {
    pub(crate) disable: Sourced<bool>,
    pub(crate) log_level: Sourced<LogLevel>,
    pub(crate) log_file: Sourced<PathBuf>,
    pub(crate) memory_limit: Sourced<Limit>,
    pub(crate) device_limits: BTreeMap<u32, (Limit, Source)>,
    pub(crate) visible_devices: Sourced<Vec<Selector>>,
    pub(crate) virtual_devices: Sourced<Vec<VirtualSplit>>,
    pub(crate) memory_mode: Sourced<MemoryMode>,
    pub(crate) report: Sourced<ReportTarget>,
    pub(crate) shared_quota: Sourced<String>,
    pub(crate) log_placement: Sourced<bool>,
    pub(crate) driver_path: Sourced<PathBuf>,
    pub(crate) nvml_path: Sourced<PathBuf>,
    pub(crate) state_dir: Sourced<PathBuf>,
    pub(crate) compute_limit: Sourced<f64>,
    pub(crate) compute_limits: BTreeMap<u32, (f64, Source)>,
    pub(crate) compute_mode: Sourced<ComputeMode>,
    /// HAMi-core's shared region (set only by the HAMi layer).
    pub(crate) hami_region: Sourced<PathBuf>,
    /// Lines for [`Settings::warnings`] (HAMi values HAMi-core would misread).
    pub(crate) notes: Vec<String>,
    pub(crate) oom_wait: Sourced<std::time::Duration>,
}

pub(crate) fn replace_if_set<T>(lower: &mut Sourced<T>, upper: Sourced<T>) {
    if upper.is_some() {
        *lower = upper;
    }
}

impl Layer {
    /// Puts `upper` (higher precedence) over `self`.
    pub(crate) fn overlay(&mut self, upper: Box<Layer>) {
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
        // (as memory limits: a layer's all-devices limit replaces the per-device ones below it)
        if upper.compute_limit.is_some() {
            self.compute_limit = upper.compute_limit;
            self.compute_limits.clear();
        }
        self.compute_limits.extend(upper.compute_limits);
        replace_if_set(&mut self.compute_mode, upper.compute_mode);
        replace_if_set(&mut self.hami_region, upper.hami_region);
        self.notes.extend(upper.notes);
        replace_if_set(&mut self.oom_wait, upper.oom_wait);
    }

    pub(crate) fn into_settings(self: Box<Self>) -> Settings {
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
        take("compute_limit", self.compute_limit.as_ref().map(|v| &v.1));
        for (ordinal, (_, source)) in &self.compute_limits {
            take(&format!("compute_limits.{ordinal}"), Some(source));
        }
        take("compute_mode", self.compute_mode.as_ref().map(|v| &v.1));
        take("hami_region", self.hami_region.as_ref().map(|v| &v.1).filter(|s| **s != Source::Default));
        take("oom_wait", self.oom_wait.as_ref().map(|v| &v.1));
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
            compute_limit: self.compute_limit.map(|v| v.0),
            compute_limits: self.compute_limits.into_iter().map(|(i, (l, _))| (i, l)).collect(),
            compute_mode: self.compute_mode.map_or(ComputeMode::default(), |v| v.0),
            hami_region: self.hami_region.map(|v| v.0),
            oom_wait: self.oom_wait.map(|v| v.0),
            sources,
            warnings: Vec::new(),
        }
    }
}
