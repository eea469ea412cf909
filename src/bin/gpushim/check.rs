//! `gpushim check [OPTIONS]`: validates the configuration a program would get (environment,
//! options, config file) without running it, and prints the effective settings with their
//! sources and the devices the program would see.
//!
//! The devices come from two runs of `gpushim __probe`: one with `GPUSHIM_DISABLE=1` lists the
//! physical GPUs (NVML, as `nvidia-smi` numbers them); one under the library, with the
//! program's environment, lists what the driver and NVML then show. So the view printed is the
//! one the shim really builds, and its errors are the shim's own messages.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::config::{self, ReportTarget, Settings};
use crate::units::format_size;
use crate::{library, options, Failure, EXIT_CHECK_FAILED};

/// A probe that takes longer than this (a driver hanging in `cuInit`) is killed.
const PROBE_TIMEOUT: Duration = Duration::from_secs(120);

pub fn main(args: &crate::cli::CheckArgs) -> Result<(), Failure> {
    let parsed = crate::cli::resolve("check", &args.options)?;
    let env = options::environment(&parsed);
    let settings = options::settings(&env).map_err(|e| Failure::plain(e.to_string()))?;
    for warning in &settings.warnings {
        println!("warning: {warning}");
    }
    if settings.disable {
        println!(
            "gpushim is disabled ({}): programs run without it, nothing is checked",
            settings.source_of("disable")
        );
        return Ok(());
    }
    print_settings(&settings, &env, &parsed);
    if let Some(line) = compute_mode_line(&settings, &env) {
        println!("{line}");
    }
    let lib = library::find("check", parsed.library.as_deref(), &env)?;
    println!();
    println!("library: {}", lib.display());

    let mut bare = env.clone();
    library::set(&mut bare, config::ENV_DISABLE, "1");
    let physical = probe(&bare, &["nvml"]).map(|p| p.values).unwrap_or_default();

    let mut shimmed = env;
    let preload = library::preload(&lib, library::lookup(&shimmed, "LD_PRELOAD"));
    library::set(&mut shimmed, "LD_PRELOAD", preload);
    for quiet in [config::ENV_REPORT, config::ENV_LOG_FILE] {
        shimmed.retain(|(n, _)| n.as_os_str() != quiet);
    }
    let seen = probe(&shimmed, &["cuda", "nvml"]).map_err(|e| Failure::setup("check", e))?;
    let problems = print_devices(&settings, &physical, &seen.values);
    if problems.is_empty() {
        return Ok(());
    }
    for line in seen.stderr.lines().filter(|l| !l.trim().is_empty()) {
        eprintln!("{line}");
    }
    for p in &problems {
        eprintln!("gpushim check: {p}");
    }
    Err(Failure::status(EXIT_CHECK_FAILED))
}

fn print_settings(s: &Settings, env: &[(OsString, OsString)], parsed: &options::Parsed) {
    // a variable an option set is shown as that option
    let source = |key: &str| match s.source_of(key) {
        config::Source::Env(var) if parsed.env.iter().any(|(v, _)| v == var) => {
            format!("option {} ({var})", options::flag_of(var))
        }
        other => other.to_string(),
    };
    let list = |v: Vec<String>, sep: &str| v.join(sep);
    let mut rows: Vec<(String, String)> = vec![
        (
            "visible_devices".into(),
            match &s.visible_devices {
                None => "all".into(),
                Some(v) if v.is_empty() => "none".into(),
                Some(v) => list(v.iter().map(|x| x.to_string()).collect(), ","),
            },
        ),
        ("memory_limit".into(), s.memory_limit.to_string()),
    ];
    for (ordinal, limit) in &s.device_limits {
        rows.push((format!("memory_limits.{ordinal}"), limit.to_string()));
    }
    let splits: Vec<String> = s
        .virtual_devices
        .iter()
        .map(|v| format!("{}:{}", v.selector, list(v.sizes.iter().map(|&b| format_size(b)).collect(), ",")))
        .collect();
    let path = |p: &Option<std::path::PathBuf>, none: &str| p.as_ref().map_or(none.to_string(), |p| p.display().to_string());
    rows.extend([
        ("virtual_devices".into(), if splits.is_empty() { "none".into() } else { list(splits, ";") }),
        ("memory_mode".into(), s.memory_mode.to_string()),
        ("compute_limit".into(), s.compute_limit.filter(|&l| l < 1.0).map_or("none".into(), crate::figures::percent)),
    ]);
    for (ordinal, limit) in &s.compute_limits {
        rows.push((format!("compute_limits.{ordinal}"), if *limit < 1.0 { crate::figures::percent(*limit) } else { "none".into() }));
    }
    rows.extend([
        ("compute_mode".into(), s.compute_mode.as_str().to_string()),
        ("log".into(), s.log_level.to_string()),
        ("log_file".into(), path(&s.log_file, "stderr")),
        (
            "report".into(),
            match &s.report {
                None => "none".into(),
                Some(ReportTarget::Stderr) => "stderr".into(),
                Some(ReportTarget::Path(p)) => p.display().to_string(),
            },
        ),
        ("shared_quota".into(), s.shared_quota.clone().unwrap_or_else(|| "none".into())),
        ("oom_wait".into(), s.oom_wait.filter(|w| !w.is_zero()).map_or("none (refused at once)".into(), |w| format!("{w:?}"))),
        ("driver_path".into(), path(&s.driver_path, "libcuda.so.1 (library search path)")),
        ("nvml_path".into(), path(&s.nvml_path, "libnvidia-ml.so.1 (library search path)")),
    ]);
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0).max("setting".len());
    let vwidth = rows.iter().map(|(_, v)| v.chars().count()).max().unwrap_or(0).max("value".len());
    println!("{:width$}  {:vwidth$}  from", "setting", "value");
    for (key, value) in &rows {
        println!("{key:width$}  {value:vwidth$}  {}", source(key));
    }
    let named = library::lookup(env, config::ENV_CONFIG);
    match named {
        Some(p) => println!("config file: {} ({})", p.to_string_lossy(), config::ENV_CONFIG),
        None if Path::new(config::DEFAULT_CONFIG_PATH).exists() => {
            println!("config file: {} (the default location)", config::DEFAULT_CONFIG_PATH)
        }
        None => println!("config file: none ({} does not exist)", config::DEFAULT_CONFIG_PATH),
    }
    // (HAMi's variables: the shared region the program would join, see coming-from-hami.md)
    if let Some(region) = &s.hami_region {
        let from = match s.source_of("hami_region") {
            config::Source::Env(v) => v.clone(),
            _ => format!("{} unset: HAMi-core's default", config::ENV_HAMI_SHARED_CACHE),
        };
        println!("HAMi-core shared region: {} ({from})", region.to_string_lossy());
    }
}

/// `compute mode: …` — how the compute limit would be enforced in the program (the library's
/// own resolution, `gpushim_common::compute_mode`); `None` without a compute limit.
pub(crate) fn compute_mode_line(s: &Settings, env: &[(OsString, OsString)]) -> Option<String> {
    use gpushim_common::compute_mode::{self, Mode};
    let r = compute_mode::resolve(s, library::lookup(env, compute_mode::ENV_PIPE_DIRECTORY), false);
    (r.mode != Mode::None).then(|| match r.why {
        Some(why) => format!("compute mode: {} (auto: {why})", r.mode.as_str()),
        None => format!("compute mode: {} ({})", r.mode.as_str(), s.source_of("compute_mode")),
    })
}

pub(crate) struct Probe {
    pub values: BTreeMap<String, String>,
    pub stderr: String,
}

/// Runs `gpushim __probe SECTIONS…` in `env` and reads its `key=value` lines.
pub(crate) fn probe(env: &[(OsString, OsString)], sections: &[&str]) -> Result<Probe, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot locate the gpushim executable: {e}"))?;
    let mut child = Command::new(exe)
        .arg("__probe")
        .args(sections)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start the probe: {e}"))?;
    let mut out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let mut stdout = String::new();
    let _ = out.read_to_string(&mut stdout);
    let deadline = Instant::now() + PROBE_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let stderr = reader.join().unwrap_or_default();
    let values = stdout
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    match status {
        Some(s) if s.success() => Ok(Probe { values, stderr }),
        Some(s) => Err(format!("the probe program failed ({s}):\n{stderr}")),
        None => Err(format!("the probe program did not finish within {PROBE_TIMEOUT:?} (a hanging driver?)")),
    }
}

/// Prints the program's devices; returns what makes the check fail.
fn print_devices(s: &Settings, physical: &BTreeMap<String, String>, seen: &BTreeMap<String, String>) -> Vec<String> {
    let get = |m: &BTreeMap<String, String>, k: String| m.get(&k).cloned();
    let mut problems = Vec::new();
    if seen.get("shim").is_none() {
        problems.push("the library was not loaded into the probe program (see the loader's message above)".into());
        return problems;
    }
    if let Some(e) = seen.get("cuda.error") {
        problems.push(format!("cannot open the CUDA driver: {e}"));
        return problems;
    }
    match seen.get("cuda.init").map(String::as_str) {
        Some("0") => {}
        Some(rc) => {
            problems.push(format!("cuInit returns {rc} under gpushim: programs would see no usable device"));
            return problems;
        }
        None => {
            problems.push("the probe program stopped before cuInit".into());
            return problems;
        }
    }
    let count: usize = seen.get("cuda.count").and_then(|n| n.parse().ok()).unwrap_or(0);
    let version = seen.get("cuda.version").and_then(|v| v.parse::<u32>().ok());
    println!();
    println!(
        "devices the program sees: {count}{}",
        version.map_or(String::new(), |v| format!(" (CUDA driver API {}.{})", v / 1000, v % 1000 / 10))
    );
    // physical devices by PCI bus id, in NVML's (nvidia-smi's) order
    let gpus: Vec<(String, String)> = (0..physical.get("nvml.count").and_then(|n| n.parse().ok()).unwrap_or(0usize))
        .filter_map(|j| Some((get(physical, format!("nvml.{j}.pci"))?, j.to_string())))
        .collect();
    let pcis: Vec<String> = (0..count).map(|i| get(seen, format!("cuda.{i}.pci")).unwrap_or_default()).collect();
    let mut rows = vec![["ordinal", "gpu", "name", "uuid", "pci", "gpu memory", "limit", "set by", "mode", "compute"].map(String::from)];
    for i in 0..count {
        let pci = &pcis[i];
        let gpu = gpus.iter().find(|(p, _)| p == pci).map(|(_, j)| j.clone()).unwrap_or_else(|| "?".into());
        let parts = pcis.iter().filter(|p| *p == pci).count();
        let gpu = if parts > 1 {
            let k = pcis[..=i].iter().filter(|p| *p == pci).count();
            format!("{gpu} part {k}/{parts}")
        } else {
            gpu
        };
        let memory = gpus
            .iter()
            .find(|(p, _)| p == pci)
            .and_then(|(_, j)| get(physical, format!("nvml.{j}.total")))
            .and_then(|t| t.parse().ok())
            .map_or("?".into(), format_size);
        let limit = get(seen, format!("cuda.{i}.limit")).and_then(|l| l.parse().ok()).map_or("?".into(), format_size);
        let set_by = match s.device_limits.get(&(i as u32)) {
            Some(l) => format!("memory_limits.{i} = {l}"),
            None if s.memory_limit != crate::units::Limit::Unlimited => format!("memory_limit = {}", s.memory_limit),
            None => "no limit".into(),
        };
        rows.push([
            i.to_string(),
            gpu,
            get(seen, format!("cuda.{i}.name")).unwrap_or_default(),
            get(seen, format!("cuda.{i}.uuid")).unwrap_or_default(),
            pci.clone(),
            memory,
            limit,
            set_by,
            s.memory_mode.to_string(),
            compute_text(s, i),
        ]);
    }
    print_table(&rows);
    if count == 0 {
        return problems;
    }
    // NVML (nvidia-smi, pynvml) inside the program must show the same devices and totals
    match seen.get("nvml.error") {
        Some(e) => println!("NVML: not available in the program ({e}); nvidia-smi and pynvml will not work there"),
        None => {
            let n: usize = seen.get("nvml.count").and_then(|n| n.parse().ok()).unwrap_or(0);
            let mut differences = Vec::new();
            if n != count {
                differences.push(format!("NVML shows {n} devices, CUDA {count}"));
            }
            let mut notes = Vec::new();
            for i in 0..count.min(n) {
                let (c, m) = (get(seen, format!("cuda.{i}.uuid")), get(seen, format!("nvml.{i}.uuid")));
                if c != m {
                    differences.push(format!("device {i}: UUID {} in CUDA, {} in NVML", c.unwrap_or_default(), m.unwrap_or_default()));
                }
                // A fraction is taken of each API's own total, and NVML counts a little more
                // memory than CUDA on real GPUs: a difference is worth a note, not a failure.
                let (c, m) = (get(seen, format!("cuda.{i}.total")), get(seen, format!("nvml.{i}.total")));
                if c != m {
                    notes.push(format!("note: device {i}: memory total {} bytes in CUDA, {} bytes in NVML", c.unwrap_or_default(), m.unwrap_or_default()));
                }
            }
            if differences.is_empty() {
                let same = if notes.is_empty() { " with the same memory totals" } else { "" };
                println!("NVML (nvidia-smi, pynvml) shows the same {n} devices{same}");
                for note in notes {
                    println!("{note}");
                }
            } else {
                problems.extend(differences);
            }
        }
    }
    problems
}

fn print_table<const N: usize>(rows: &[[String; N]]) {
    let widths: Vec<usize> = (0..N).map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
    for row in rows {
        // (names and UUIDs as the driver gives them: printable, like every figure shown)
        let line: Vec<String> = row.iter().zip(&widths).map(|(cell, &w)| format!("{:w$}", crate::figures::printable(cell))).collect();
        println!("{}", line.join("  ").trim_end());
    }
}

/// The `compute` column of program device `ordinal`: its compute limit and the mode
/// (`30% auto`), or `none`.
fn compute_text(s: &Settings, ordinal: usize) -> String {
    match s.compute_limit_for(ordinal as u32) {
        Some(limit) => format!("{} {}", crate::figures::percent(limit), s.compute_mode.as_str()),
        None => "none".into(),
    }
}
