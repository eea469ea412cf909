//! The config-file layer: finding, reading and parsing the TOML file, and spelling suggestions for its keys.

#[allow(unused_imports)]
use super::*;

// ---------------------------------------------------------------------------------------------
// The config file
// ---------------------------------------------------------------------------------------------

/// A config file's path and text.
pub(crate) struct ConfigFile {
    pub(crate) path: PathBuf,
    pub(crate) text: String,
    /// Read because `GPUSHIM_CONFIG` is unset.
    pub(crate) is_default: bool,
}

impl ConfigFile {
    /// Errors about the file as a whole say when it is the default file, which the user may
    /// not know is being read.
    pub(crate) fn annotate(&self, mut e: ConfigError) -> ConfigError {
        if self.is_default && e.setting == ENV_CONFIG {
            e.reason.push_str(" (the default config file)");
        }
        e
    }
}

/// The config file to read: `GPUSHIM_CONFIG`, else the default path if present.
pub(crate) fn config_file(env: Env<'_>, default_path: &Path) -> Result<Option<ConfigFile>, ConfigError> {
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

pub(crate) fn is_absent(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENOTDIR)
}

pub(crate) fn read_config(path: &Path) -> Result<String, String> {
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
pub(crate) fn parse_file(text: &str, path: &Path) -> Result<Box<Layer>, ConfigError> {
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
pub(crate) fn toml_position(text: &str, span: Option<std::ops::Range<usize>>) -> String {
    let Some(before) = span.and_then(|s| text.get(..s.start)) else {
        return String::new();
    };
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    format!(" at line {line}, column {column}")
}

/// A short, one-line rendering of a TOML value for messages (strings as written).
pub(crate) fn render(value: &toml::Value) -> String {
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

pub(crate) const EMPTY_FILE_VALUE: &str =
    "the value is empty; remove the key for the default, or give a value";
pub(crate) const LIMIT_TYPES: &str = "expected a string like \"4GiB\" or \"40%\", or a whole number of bytes";

pub(crate) struct FileCtx<'a> {
    pub(crate) path: &'a Path,
}

impl FileCtx<'_> {
    pub(crate) fn error(&self, key: &str, value: impl Into<String>, reason: impl Into<String>) -> ConfigError {
        ConfigError::new(format!("{key} (in {})", self.path.display()), value, reason)
    }

    pub(crate) fn source(&self) -> Source {
        Source::File(self.path.to_path_buf())
    }

    pub(crate) fn apply(&self, layer: &mut Layer, key: &str, value: &toml::Value) -> Result<(), ConfigError> {
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
            "compute_limit" => layer.compute_limit = Some((self.compute_limit(key, value)?, src())),
            "compute_limits" => layer.compute_limits = self.compute_limits(value)?,
            "compute_mode" => {
                layer.compute_mode = Some((self.string(key, value, parse_compute_mode)?, src()))
            }
            "oom_wait" => layer.oom_wait = Some((self.string(key, value, parse_duration)?, src())),
            _ => return Err(self.unknown_key(key, value)),
        }
        Ok(())
    }

    pub(crate) fn unknown_key(&self, key: &str, value: &toml::Value) -> ConfigError {
        let reason = match suggest(key, FILE_KEYS) {
            Some(s) => format!("unknown setting; did you mean {s}?"),
            None => format!("unknown setting; the settings are {}", FILE_KEYS.join(", ")),
        };
        self.error(key, render(value), reason)
    }

    pub(crate) fn boolean(&self, key: &str, value: &toml::Value) -> Result<bool, ConfigError> {
        value
            .as_bool()
            .ok_or_else(|| self.error(key, render(value), "expected true or false"))
    }

    /// A non-empty string value parsed with `parse`.
    pub(crate) fn string<T>(
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
    pub(crate) fn limit(&self, key: &str, value: &toml::Value) -> Result<Limit, ConfigError> {
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

    /// A compute limit: a string (`"30%"`, `"0.3"`) or a number in (0, 1].
    pub(crate) fn compute_limit(&self, key: &str, value: &toml::Value) -> Result<f64, ConfigError> {
        match value {
            toml::Value::String(_) => self.string(key, value, parse_compute_limit),
            toml::Value::Float(f) if *f > 0.0 && *f <= 1.0 => Ok(*f),
            toml::Value::Integer(1) => Ok(1.0),
            _ => Err(self.error(key, render(value), "expected a share like \"30%\" or a number above 0 and at most 1, like 0.3")),
        }
    }

    /// `[compute_limits]`: `<ordinal> = share`.
    pub(crate) fn compute_limits(&self, value: &toml::Value) -> Result<BTreeMap<u32, (f64, Source)>, ConfigError> {
        let Some(table) = value.as_table() else {
            return Err(self.error(
                "compute_limits",
                render(value),
                "expected a table of per-device compute limits, like [compute_limits] with 0 = \"30%\"",
            ));
        };
        let mut out = BTreeMap::new();
        for (ordinal, share) in table {
            let key = format!("compute_limits.{ordinal}");
            let Some(i) = parse_ordinal_suffix(ordinal) else {
                let reason = format!("\"{ordinal}\" is not a device ordinal; use the ordinal the program sees, like 0 = \"30%\"");
                return Err(self.error(&key, render(share), reason));
            };
            out.insert(i, (self.compute_limit(&key, share)?, self.source()));
        }
        Ok(out)
    }

    /// `[memory_limits]`: `<ordinal> = limit`.
    pub(crate) fn device_limits(
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
    pub(crate) fn visible(&self, key: &str, value: &toml::Value) -> Result<Vec<Selector>, ConfigError> {
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
    pub(crate) fn selector_item(&self, key: &str, item: &toml::Value) -> Result<Selector, ConfigError> {
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
    pub(crate) fn virtual_devices(
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
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
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
