//! `gpushim slurm task-prolog`: the Slurm TaskProlog that turns a job's `gres/shard` allocation
//! into the shim's variables (`export NAME=value` lines on stdout, the TaskProlog protocol).
//!
//! What Slurm 22.05 gives the TaskProlog (slurmstepd `exec_task`: the step's GRES variables are
//! in the task's environment before `_run_script_and_set_env` runs the prolog with it):
//! `SLURM_JOB_ID`, `SLURM_SHARDS_ON_NODE` (the job's shards on this node; unset for a job without
//! shards), the GPU the shards are on: `SLURM_STEP_GPUS` (an srun step, which also has
//! `SLURM_STEP_ID`) or `SLURM_JOB_GPUS` (the batch script) as the node's GPU index, and
//! `CUDA_VISIBLE_DEVICES` / `GPU_DEVICE_ORDINAL` as the program's (the same number without
//! cgroups; from 0 with `ConstrainDevices`). Slurm reads the prolog's stdout *and stderr* (one
//! pipe, `run_command`) line by line: `export NAME=value` sets NAME to everything after `=` up
//! to the newline (no unquoting: a quote would become part of the value), `unset NAME` removes
//! it, `print TEXT` writes TEXT to the job's stdout. A prolog that exits non-zero makes the task
//! exit with that status (the job's program never starts).
//!
//! So: values are written raw, and a value that could end its line early (a newline, any
//! control byte) is refused, never escaped; every failure exits 1 (fail closed) after a
//! `print` line telling the job why.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{library, Failure};

const COMMAND: &str = "slurm task-prolog";

/// The most shards per GPU: K/N then stays at or above the compute limit's smallest share.
pub const MAX_SHARDS_PER_GPU: u32 = 1_000_000;

/// Variables a job may have inherited that would loosen the limits written here: unset.
/// `GPUSHIM_CONFIG` is the job's own config file (the site's is /etc/gpushim/gpushim.toml, which
/// still applies); every switch that turns the shim off — `GPUSHIM_DISABLE`, HAMi's
/// `CUDA_DISABLE_CONTROL=true`, `disable = true` in a config file — is beaten by the
/// `GPUSHIM_DISABLE=0` always exported.
const LOOSENING: &[&str] = &["GPUSHIM_VIRTUAL_DEVICES", "GPUSHIM_CONFIG"];

/// One line of the TaskProlog protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    Export(String, Vec<u8>),
    Unset(String),
}

/// Which GPU an entry of `CUDA_VISIBLE_DEVICES` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gpu {
    Index(u32),
    Uuid(String),
}

/// What the job asks, read from its environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    pub id: String,
    pub shards: u32,
    /// `None`: `CUDA_VISIBLE_DEVICES` unset, every GPU the driver shows.
    pub gpus: Option<Vec<Gpu>>,
}

fn var<'a>(env: &'a [(OsString, OsString)], name: &str) -> Option<&'a OsStr> {
    library::lookup(env, name)
}

fn text<'a>(name: &str, v: &'a OsStr) -> Result<&'a str, String> {
    v.to_str().ok_or_else(|| format!("{name} is not valid UTF-8"))
}

/// A count as Slurm writes it: ASCII digits only (no sign, no space), at most 9 of them.
fn count(name: &str, v: &str) -> Result<u32, String> {
    if v.is_empty() || v.len() > 9 || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{name}={:?}: expected a whole number of shards", v));
    }
    v.parse().map_err(|_| format!("{name}={v:?}: expected a whole number of shards"))
}

/// The job as its environment describes it; `Ok(None)` for a job without shards (a whole-GPU
/// job, or one without GPUs): nothing to limit.
pub fn read_job(env: &[(OsString, OsString)], shards_per_gpu: u32) -> Result<Option<Job>, String> {
    let shards = match var(env, "SLURM_SHARDS_ON_NODE") {
        None => return Ok(None),
        Some(v) => count("SLURM_SHARDS_ON_NODE", text("SLURM_SHARDS_ON_NODE", v)?)?,
    };
    if shards == 0 {
        return Err("SLURM_SHARDS_ON_NODE=0: a job with shards has at least one".into());
    }
    if shards > shards_per_gpu {
        return Err(format!(
            "SLURM_SHARDS_ON_NODE={shards} is more than --shards-per-gpu {shards_per_gpu}: the GPU's shard count in gres.conf and --shards-per-gpu must agree"
        ));
    }
    let id = match var(env, "SLURM_JOB_ID") {
        None => return Err("SLURM_JOB_ID is not set: run as Slurm's TaskProlog".into()),
        Some(v) => text("SLURM_JOB_ID", v)?,
    };
    if id.is_empty() || id.len() > 20 || !id.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("SLURM_JOB_ID={id:?}: expected a job number"));
    }
    Ok(Some(Job { id: id.to_string(), shards, gpus: gpu_lists(env)? }))
}

/// The variables that name the job's GPU: Slurm's own lists (`SLURM_STEP_GPUS` in an `srun`
/// step, `SLURM_JOB_GPUS` in the batch script: the GPU's index on the node) and the program's
/// `CUDA_VISIBLE_DEVICES` (from 0 among the job's GPUs under `ConstrainDevices`).
const GPU_LISTS: [&str; 3] = ["SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"];

/// Every GPU that any of [`GPU_LISTS`] names (`None`: none is set, every GPU the driver shows):
/// the limit is taken from the smallest of them. A job may inherit another job's or step's
/// list from the shell that submitted it (a batch script submitted from inside an `srun` step
/// has that step's `SLURM_STEP_ID` and `SLURM_STEP_GPUS`), so no one list is trusted alone and
/// the smallest GPU named never gives more than the job's GPU allows. A list that names several
/// GPUs is refused: shards spread over several GPUs (Slurm 23.11's
/// `MULTIPLE_SHARING_GRES_PJ`) would get K/N of every GPU where they hold fewer there.
fn gpu_lists(env: &[(OsString, OsString)]) -> Result<Option<Vec<Gpu>>, String> {
    let mut all: Option<Vec<Gpu>> = None;
    for name in GPU_LISTS {
        let Some(v) = var(env, name) else { continue };
        let v = text(name, v)?;
        let list = parse_gpus(name, v)?;
        if list.len() > 1 {
            return Err(format!("{name}={v:?}: the job's shards are on several GPUs, which gpushim cannot split (one limit for every GPU)"));
        }
        let all = all.get_or_insert_with(Vec::new);
        for gpu in list {
            if !all.contains(&gpu) {
                all.push(gpu);
            }
        }
    }
    Ok(all)
}

/// A list of GPUs as Slurm sets it (`name`'s value `v`): indexes (or UUIDs), comma-separated.
pub fn parse_gpus(name: &str, v: &str) -> Result<Vec<Gpu>, String> {
    let bad = |why: &str| format!("{name}={v:?}: {why}");
    if v.trim().is_empty() {
        return Err(bad("names no GPU"));
    }
    let mut out = Vec::new();
    for entry in v.split(',').map(str::trim) {
        let gpu = if !entry.is_empty() && entry.len() <= 4 && entry.bytes().all(|b| b.is_ascii_digit()) {
            Gpu::Index(entry.parse().map_err(|_| bad("not a GPU index"))?)
        } else if entry.starts_with("GPU-") && entry.len() <= 80 && entry[4..].bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
            Gpu::Uuid(entry.to_string())
        } else {
            return Err(bad("expected GPU indexes or GPU-… UUIDs, comma-separated (MIG devices are not supported)"));
        };
        if out.contains(&gpu) {
            return Err(bad("names a GPU twice"));
        }
        out.push(gpu);
    }
    Ok(out)
}

/// `total × shards / shards_per_gpu`, rounded down.
pub fn share(total: u64, shards: u32, shards_per_gpu: u32) -> u64 {
    (u128::from(total) * u128::from(shards) / u128::from(shards_per_gpu.max(1))) as u64
}

/// K/N as `GPUSHIM_COMPUTE_LIMIT` reads it (a fraction, six decimals, rounded down but never
/// below a millionth).
pub fn compute_share(shards: u32, shards_per_gpu: u32) -> String {
    let millionths = (u64::from(shards) * 1_000_000 / u64::from(shards_per_gpu.max(1))).max(1);
    format!("{}.{:06}", millionths / 1_000_000, millionths % 1_000_000)
}

/// The lines for `job`: `totals` are the memory of its GPUs (bytes, one per GPU), `library` the
/// libgpushim.so to preload.
pub fn lines(env: &[(OsString, OsString)], job: &Job, shards_per_gpu: u32, compute: bool, totals: &[u64], library: &Path) -> Result<Vec<Line>, String> {
    let Some(&smallest) = totals.iter().min() else {
        return Err("the driver shows no GPU".into());
    };
    // ld.so splits LD_PRELOAD at spaces and colons: such a path would be ignored (unlimited)
    if library.as_os_str().as_bytes().iter().any(|&b| b == b' ' || b == b':') {
        return Err(format!("the library's path {:?} has a space or a colon: LD_PRELOAD cannot hold it (ld.so splits it there)", library.display().to_string()));
    }
    let preload = library::preload(library, var(env, "LD_PRELOAD"));
    let mut out = vec![
        Line::Export("LD_PRELOAD".into(), preload.as_bytes().to_vec()),
        Line::Export("GPUSHIM_DISABLE".into(), b"0".to_vec()),
        Line::Export("GPUSHIM_MEMORY_LIMIT".into(), share(smallest, job.shards, shards_per_gpu).to_string().into_bytes()),
        Line::Export("GPUSHIM_SHARED_QUOTA".into(), format!("slurm-{}", job.id).into_bytes()),
    ];
    if compute {
        out.push(Line::Export("GPUSHIM_COMPUTE_LIMIT".into(), compute_share(job.shards, shards_per_gpu).into_bytes()));
    }
    // per-device limits would override the job's: gone (names made of [A-Z0-9_] only)
    let per_device = |name: &str, prefix: &str| name.strip_prefix(prefix).is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()));
    let mut unset: Vec<String> = LOOSENING.iter().filter(|n| var(env, n).is_some()).map(|n| n.to_string()).collect();
    for (name, _) in env {
        let Some(name) = name.to_str() else { continue };
        let loosens = per_device(name, "GPUSHIM_MEMORY_LIMIT_") || (compute && per_device(name, "GPUSHIM_COMPUTE_LIMIT_"));
        if loosens && !unset.iter().any(|n| n == name) {
            unset.push(name.to_string());
        }
    }
    out.extend(unset.into_iter().map(Line::Unset));
    Ok(out)
}

/// The protocol's text of `lines`; a value Slurm would cut short or misread is refused.
pub fn render(lines: &[Line]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    for line in lines {
        match line {
            Line::Export(name, value) => {
                if !name.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_') || name.is_empty() {
                    return Err(format!("{name:?} is not a variable name"));
                }
                if value.is_empty() || value.iter().any(|&b| b < 0x20 || b == 0x7f) || value[0] == b' ' {
                    return Err(format!("the value of {name} ({:?}) has a control character or a leading space: Slurm would misread it", String::from_utf8_lossy(value)));
                }
                out.extend_from_slice(b"export ");
                out.extend_from_slice(name.as_bytes());
                out.push(b'=');
                out.extend_from_slice(value);
                out.push(b'\n');
            }
            Line::Unset(name) => {
                out.extend_from_slice(format!("unset {name}\n").as_bytes());
            }
        }
    }
    Ok(out)
}

/// `gpushim slurm task-prolog`.
pub fn task_prolog(shards_per_gpu: u32, compute: bool, library_flag: Option<&Path>) -> Result<(), Failure> {
    let env: Vec<(OsString, OsString)> = std::env::vars_os().collect();
    let result = (|| -> Result<Vec<u8>, Failure> {
        let Some(job) = read_job(&env, shards_per_gpu).map_err(|e| Failure::setup(COMMAND, e))? else {
            return Ok(Vec::new());
        };
        // SLURM_SHARDS_ON_NODE may be inherited (Slurm 22.05 keeps it in a job with a GPU):
        // Slurm's own view of the job decides
        if !job_holds_shards(&job.id).map_err(|e| Failure::setup(COMMAND, e))? {
            return Ok(Vec::new());
        }
        let library = library::find(COMMAND, library_flag, &env)?;
        let totals = gpu_memory(&env, job.gpus.as_deref()).map_err(|e| Failure::setup(COMMAND, e))?;
        let lines = lines(&env, &job, shards_per_gpu, compute, &totals, &library).map_err(|e| Failure::setup(COMMAND, e))?;
        render(&lines).map_err(|e| Failure::setup(COMMAND, e))
    })();
    match result {
        Ok(text) => {
            let mut stdout = std::io::stdout().lock();
            stdout.write_all(&text).and_then(|_| stdout.flush()).map_err(|e| Failure::setup(COMMAND, format!("cannot write: {e}")))
        }
        Err(failure) => {
            print_refusal(&failure.message);
            Err(failure)
        }
    }
}

/// The `print` line that tells the job why its task did not start (one line, no control bytes),
/// on stdout, where Slurm reads it. Command-line errors print it too (main.rs).
pub fn print_refusal(message: &str) {
    let why: String = message.trim_end().chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    println!("print {why}; the task is not started");
}

// ---------------------------------------------------------------------------------------------
// Slurm's view of the job
// ---------------------------------------------------------------------------------------------

/// How long `scontrol` may take before the task is refused.
const SCONTROL_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether Slurm allocated shards to job `id`: `scontrol -d show job ID`'s `JOB_GRES` (the job's
/// allocated GRES, Slurm 22.05 `slurm_sprint_job_info`). Fails (the task is refused) when Slurm
/// cannot be asked or its answer has no `JOB_GRES`: a shard job must not run unlimited, and a
/// whole-GPU job is refused only when `slurmctld` does not answer.
fn job_holds_shards(id: &str) -> Result<bool, String> {
    let mut cmd = Command::new("scontrol");
    // (not under the shim a step inherits from its batch script)
    cmd.args(["-d", "-o", "show", "job", id]).env_remove("LD_PRELOAD");
    let (status, out) = bounded_output(&mut cmd, SCONTROL_TIMEOUT).map_err(|e| format!("scontrol show job {id}: {e}"))?;
    if !status.success() {
        return Err(format!("scontrol show job {id} failed ({status}): cannot confirm the job's shards"));
    }
    gres_has_shards(&out).ok_or_else(|| format!("scontrol show job {id} gives no JOB_GRES: cannot confirm the job's shards"))
}

/// Whether `scontrol -d show job`'s text has a `shard` GRES in `JOB_GRES` (`None`: no
/// `JOB_GRES`). Entries: `name[:type]:count[(…)]`, comma-separated; `(null)` for none.
pub fn gres_has_shards(text: &str) -> Option<bool> {
    let value = text.split_whitespace().find_map(|w| w.strip_prefix("JOB_GRES="))?;
    Some(value.split(',').any(|entry| {
        let name = entry.split([':', '(']).next().unwrap_or("");
        name == "shard" || name == "gres/shard"
    }))
}

/// Runs `cmd` (stdin from /dev/null, stderr dropped) and reads its stdout, within `limit`:
/// the output comes through a channel with a deadline, so that neither the child nor a
/// grandchild holding its pipe open can hold the prolog; the child is killed after the limit.
fn bounded_output(cmd: &mut Command, limit: Duration) -> Result<(std::process::ExitStatus, String), String> {
    let deadline = Instant::now() + limit;
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().map_err(|e| format!("cannot start it: {e}"))?;
    let mut out = child.stdout.take().ok_or("no pipe from the child")?;
    let (tx, rx) = std::sync::mpsc::channel();
    // (a reader held by a grandchild stays blocked: left to end with the process)
    std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
        let _ = tx.send(String::from_utf8_lossy(&s).into_owned());
    });
    let text = rx.recv_timeout(deadline.saturating_duration_since(Instant::now()));
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) if text.is_ok() => break Some(status),
            Ok(None) if text.is_ok() && Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    match (status, text) {
        (Some(status), Ok(text)) => Ok((status, text)),
        _ => Err(format!("no answer within {} s", limit.as_secs())),
    }
}

// ---------------------------------------------------------------------------------------------
// NVML: the total memory of the job's GPUs
// ---------------------------------------------------------------------------------------------

/// The total memory (bytes) of each GPU in `gpus`, or of every GPU NVML shows when `None`, as
/// `gpushim __probe nvml` (probe.rs) reads NVML (`libnvidia-ml.so.1`, or `GPUSHIM_NVML_PATH`) — in a child
/// without `LD_PRELOAD` and with `GPUSHIM_DISABLE=1`: an `srun` step inside a batch script
/// inherits the script's `LD_PRELOAD` and limit, and NVML under the shim would show the limit
/// as the GPU's memory.
fn gpu_memory(env: &[(OsString, OsString)], gpus: Option<&[Gpu]>) -> Result<Vec<u64>, String> {
    let mut clean: Vec<(OsString, OsString)> = env
        .iter()
        .filter(|(k, _)| {
            let k = k.to_string_lossy();
            k != "LD_PRELOAD" && (!k.starts_with("GPUSHIM_") || k == "GPUSHIM_NVML_PATH")
        })
        .cloned()
        .collect();
    clean.push(("GPUSHIM_DISABLE".into(), "1".into()));
    totals(&probe_nvml(&clean)?, gpus)
}

/// How long NVML may take to answer before the task is refused (a hanging driver must not hold
/// the task's start for ever: Slurm waits for a TaskProlog without a bound).
const NVML_TIMEOUT: Duration = Duration::from_secs(60);

/// `gpushim __probe nvml` in `env`: its `key=value` lines, within [`NVML_TIMEOUT`].
fn probe_nvml(env: &[(OsString, OsString)]) -> Result<BTreeMap<String, String>, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot locate the gpushim executable: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.args(["__probe", "nvml"]).env_clear().envs(env.iter().map(|(k, v)| (k, v)));
    match bounded_output(&mut cmd, NVML_TIMEOUT) {
        Ok((st, text)) if st.success() => Ok(text.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()),
        Ok((st, _)) => Err(format!("gpushim __probe nvml failed ({st})")),
        Err(e) => Err(format!("gpushim __probe nvml: {e} (a hanging driver?)")),
    }
}

/// The memory of `gpus` from the probe's `nvml.*` lines.
fn totals(v: &BTreeMap<String, String>, gpus: Option<&[Gpu]>) -> Result<Vec<u64>, String> {
    if let Some(e) = v.get("nvml.error") {
        return Err(format!("NVML: {e}"));
    }
    let count: u32 = v.get("nvml.count").and_then(|c| c.parse().ok()).ok_or("NVML gave no GPU count")?;
    let total = |i: u32| {
        v.get(&format!("nvml.{i}.total"))
            .and_then(|t| t.parse::<u64>().ok())
            .filter(|&t| t > 0)
            .ok_or_else(|| format!("NVML gives no memory for GPU {i}"))
    };
    match gpus {
        None if count == 0 => Err("NVML shows no GPU".into()),
        None => (0..count).map(total).collect(),
        Some(gpus) => gpus
            .iter()
            .map(|g| match g {
                Gpu::Index(i) if *i < count => total(*i),
                Gpu::Index(i) => Err(format!("no GPU {i}: NVML shows {count}")),
                Gpu::Uuid(u) => {
                    let uuid = |i: &u32| v.get(&format!("nvml.{i}.uuid")).map(|x| x.to_ascii_lowercase());
                    let want = u.to_ascii_lowercase();
                    let found: Vec<u32> = (0..count).filter(|i| uuid(i).is_some_and(|x| x.starts_with(&want))).collect();
                    match found[..] {
                        [i] => total(i),
                        [] => Err(format!("no GPU {u}")),
                        _ => Err(format!("{u} names several GPUs")),
                    }
                }
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        vars.iter().map(|(k, v)| (OsString::from(k), OsString::from(v))).collect()
    }

    const GIB: u64 = 1 << 30;

    #[test]
    fn a_shard_job() {
        let e = env(&[("SLURM_JOB_ID", "42"), ("SLURM_SHARDS_ON_NODE", "2"), ("CUDA_VISIBLE_DEVICES", "1")]);
        let job = read_job(&e, 4).unwrap().unwrap();
        assert_eq!(job, Job { id: "42".into(), shards: 2, gpus: Some(vec![Gpu::Index(1)]) });
        let l = lines(&e, &job, 4, true, &[16 * GIB], Path::new("/lib/libgpushim.so")).unwrap();
        let text = String::from_utf8(render(&l).unwrap()).unwrap();
        assert_eq!(
            text,
            "export LD_PRELOAD=/lib/libgpushim.so\nexport GPUSHIM_DISABLE=0\nexport GPUSHIM_MEMORY_LIMIT=8589934592\nexport GPUSHIM_SHARED_QUOTA=slurm-42\nexport GPUSHIM_COMPUTE_LIMIT=0.500000\n"
        );
        gpushim_common::config::parse_compute_limit("0.500000").unwrap();
        gpushim_common::config::parse_shared_quota("slurm-42").unwrap();
    }

    #[test]
    fn no_shards_nothing_limits() {
        for e in [env(&[("SLURM_JOB_ID", "7"), ("CUDA_VISIBLE_DEVICES", "0")]), env(&[])] {
            assert_eq!(read_job(&e, 4).unwrap(), None);
        }
    }

    #[test]
    fn bad_counts() {
        let job = |shards: &str, id: &str| read_job(&env(&[("SLURM_JOB_ID", id), ("SLURM_SHARDS_ON_NODE", shards)]), 4);
        assert!(job("5", "1").unwrap_err().contains("more than --shards-per-gpu 4"));
        assert!(job("0", "1").unwrap_err().contains("at least one"));
        for bad in ["", " 2", "2 ", "+2", "-1", "2x", "1e3", "9999999999", "٢"] {
            assert!(job(bad, "1").is_err(), "{bad:?}");
        }
        for bad in ["", "1 2", "1\nexport X=1", "12a", "-3", "1;2", "123456789012345678901"] {
            assert!(job("2", bad).unwrap_err().contains("SLURM_JOB_ID"), "{bad:?}");
        }
        assert!(read_job(&env(&[("SLURM_SHARDS_ON_NODE", "2")]), 4).unwrap_err().contains("SLURM_JOB_ID is not set"));
        assert_eq!(job("4", "1").unwrap().unwrap().shards, 4);
    }

    #[test]
    fn visible_devices() {
        let v = "CUDA_VISIBLE_DEVICES";
        assert_eq!(parse_gpus(v, "0,3").unwrap(), vec![Gpu::Index(0), Gpu::Index(3)]);
        assert_eq!(parse_gpus(v, "GPU-0a1b-2c").unwrap(), vec![Gpu::Uuid("GPU-0a1b-2c".into())]);
        for bad in ["", " ", "0,0", "MIG-1234", "NoDevFiles", "0,,1", "-1", "0\n1", "GPU-xyz"] {
            assert!(parse_gpus(v, bad).unwrap_err().starts_with("CUDA_VISIBLE_DEVICES="), "{bad:?}");
        }
    }

    #[test]
    fn every_gpu_list_counts() {
        let gpus = |vars: &[(&str, &str)]| read_job(&env(&[&[("SLURM_JOB_ID", "3"), ("SLURM_SHARDS_ON_NODE", "1")], vars].concat()), 4).map(|j| j.unwrap().gpus);
        let idx = |v: &[u32]| Some(v.iter().map(|&i| Gpu::Index(i)).collect::<Vec<_>>());
        // a step (srun): SLURM_STEP_GPUS 3, CUDA_VISIBLE_DEVICES from 0 (ConstrainDevices): both
        assert_eq!(gpus(&[("SLURM_STEP_ID", "0"), ("SLURM_STEP_GPUS", "3"), ("SLURM_JOB_GPUS", "3"), ("CUDA_VISIBLE_DEVICES", "0")]).unwrap(), idx(&[3, 0]));
        // a batch script with another step's stale SLURM_STEP_ID / SLURM_STEP_GPUS: both GPUs
        // count (the smallest gives the limit), whichever list Slurm refreshed
        assert_eq!(gpus(&[("SLURM_STEP_ID", "0"), ("SLURM_STEP_GPUS", "0"), ("SLURM_JOB_GPUS", "1"), ("CUDA_VISIBLE_DEVICES", "1")]).unwrap(), idx(&[0, 1]));
        assert_eq!(gpus(&[("SLURM_STEP_ID", "0"), ("CUDA_VISIBLE_DEVICES", "2")]).unwrap(), idx(&[2]));
        assert_eq!(gpus(&[("SLURM_STEP_ID", "0")]).unwrap(), None);
        assert!(gpus(&[("SLURM_JOB_GPUS", "x")]).unwrap_err().starts_with("SLURM_JOB_GPUS=\"x\""));
        // shards on several GPUs: refused, whichever list says so
        for name in GPU_LISTS {
            assert!(gpus(&[(name, "0,1")]).unwrap_err().contains("several GPUs"), "{name}");
        }
    }

    #[test]
    fn the_smallest_gpu_named_gives_the_limit() {
        let e = env(&[("SLURM_JOB_ID", "3"), ("SLURM_SHARDS_ON_NODE", "2"), ("SLURM_STEP_ID", "0"), ("SLURM_STEP_GPUS", "0"), ("SLURM_JOB_GPUS", "1")]);
        let job = read_job(&e, 4).unwrap().unwrap();
        let v: BTreeMap<String, String> = [("nvml.count", "2"), ("nvml.0.total", "100"), ("nvml.1.total", "60")].iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let l = lines(&e, &job, 4, false, &totals(&v, job.gpus.as_deref()).unwrap(), Path::new("/lib/libgpushim.so")).unwrap();
        assert!(l.contains(&Line::Export("GPUSHIM_MEMORY_LIMIT".into(), b"30".to_vec())), "{l:?}");
    }

    #[test]
    fn totals_from_nvml() {
        let v: BTreeMap<String, String> = [("nvml.count", "2"), ("nvml.0.total", "100"), ("nvml.0.uuid", "GPU-aa11"), ("nvml.1.total", "60"), ("nvml.1.uuid", "GPU-aa22")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(totals(&v, None).unwrap(), vec![100, 60]);
        assert_eq!(totals(&v, Some(&[Gpu::Index(1)])).unwrap(), vec![60]);
        assert_eq!(totals(&v, Some(&[Gpu::Uuid("GPU-AA22".into())])).unwrap(), vec![60]);
        assert!(totals(&v, Some(&[Gpu::Uuid("GPU-aa".into())])).unwrap_err().contains("several"));
        assert!(totals(&v, Some(&[Gpu::Uuid("GPU-bb".into())])).is_err());
        assert!(totals(&v, Some(&[Gpu::Index(2)])).unwrap_err().contains("NVML shows 2"));
        let err: BTreeMap<String, String> = [("nvml.error".to_string(), "cannot open".to_string())].into();
        assert!(totals(&err, None).unwrap_err().contains("cannot open"));
        let none: BTreeMap<String, String> = [("nvml.count".to_string(), "0".to_string())].into();
        assert!(totals(&none, None).is_err());
    }

    #[test]
    fn slurms_view_of_the_job() {
        let line = |gres: &str| format!("JobId=7 JobName=x UserId=root(0) TresPerNode=gres:gpu:1 Nodes=n0 CPU_IDs=0 Mem=0 GRES=x JOB_GRES={gres} Partition=test");
        assert_eq!(gres_has_shards(&line("shard:2")), Some(true));
        assert_eq!(gres_has_shards(&line("gpu:1,shard:2(IDX:0)")), Some(true));
        assert_eq!(gres_has_shards(&line("gpu:1")), Some(false));
        assert_eq!(gres_has_shards(&line("gpu:tesla:1")), Some(false));
        assert_eq!(gres_has_shards(&line("(null)")), Some(false));
        assert_eq!(gres_has_shards(&line("shardx:1")), Some(false));
        assert_eq!(gres_has_shards("JobId=7 JobState=PENDING"), None);
    }

    #[test]
    fn a_grandchild_holding_the_pipe_cannot_hold_the_prolog() {
        // the child exits at once; its grandchild keeps stdout open for 5 s
        let t = Instant::now();
        let err = bounded_output(Command::new("sh").args(["-c", "echo hi; sleep 5 & exit 0"]), Duration::from_secs(1)).unwrap_err();
        assert!(err.contains("no answer within 1 s"), "{err}");
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        let t = Instant::now();
        assert!(bounded_output(Command::new("sh").args(["-c", "sleep 5"]), Duration::from_secs(1)).is_err());
        assert!(t.elapsed() < Duration::from_secs(10));
        let (st, out) = bounded_output(Command::new("sh").args(["-c", "echo hi; exit 3"]), Duration::from_secs(20)).unwrap();
        assert_eq!((st.code(), out.as_str()), (Some(3), "hi\n"));
    }

    #[test]
    fn shares() {
        assert_eq!(share(16 * GIB, 2, 4), 8 * GIB);
        assert_eq!(share(u64::MAX, 3, 3), u64::MAX);
        assert_eq!(share(10, 1, 3), 3);
        assert_eq!(compute_share(1, 3), "0.333333");
        assert_eq!(compute_share(4, 4), "1.000000");
        assert_eq!(compute_share(1, MAX_SHARDS_PER_GPU), "0.000001");
    }

    #[test]
    fn preload_and_loosening_variables() {
        let e = env(&[
            ("SLURM_JOB_ID", "9"),
            ("SLURM_SHARDS_ON_NODE", "1"),
            ("LD_PRELOAD", "/a.so /lib/libgpushim.so:/b.so"),
            ("GPUSHIM_DISABLE", "1"),
            ("CUDA_DISABLE_CONTROL", "true"),
            ("GPUSHIM_CONFIG", "/home/u/off.toml"),
            ("GPUSHIM_MEMORY_LIMIT_0", "99GiB"),
            ("GPUSHIM_MEMORY_LIMIT_X", "1"),
            ("GPUSHIM_COMPUTE_LIMIT_1", "100%"),
        ]);
        let job = read_job(&e, 2).unwrap().unwrap();
        assert_eq!(job.gpus, None);
        let l = lines(&e, &job, 2, false, &[10 * GIB, 6 * GIB], Path::new("/lib/libgpushim.so")).unwrap();
        let text = String::from_utf8(render(&l).unwrap()).unwrap();
        assert_eq!(
            text,
            "export LD_PRELOAD=/lib/libgpushim.so:/a.so:/b.so\nexport GPUSHIM_DISABLE=0\nexport GPUSHIM_MEMORY_LIMIT=3221225472\nexport GPUSHIM_SHARED_QUOTA=slurm-9\nunset GPUSHIM_CONFIG\nunset GPUSHIM_MEMORY_LIMIT_0\n"
        );
        let l = lines(&e, &job, 2, true, &[GIB], Path::new("/lib/libgpushim.so")).unwrap();
        assert!(l.contains(&Line::Unset("GPUSHIM_COMPUTE_LIMIT_1".into())));
        assert!(lines(&e, &job, 2, false, &[], Path::new("/x")).is_err());
    }

    #[test]
    fn hostile_values_are_refused_not_escaped() {
        for value in ["/x.so\nexport GPUSHIM_MEMORY_LIMIT=0", "/x.so\r", "/x\u{1b}[2J.so", "/x\u{7f}", "/x\ty"] {
            let e = env(&[("SLURM_JOB_ID", "1"), ("SLURM_SHARDS_ON_NODE", "1"), ("LD_PRELOAD", value)]);
            let job = read_job(&e, 1).unwrap().unwrap();
            let l = lines(&e, &job, 1, false, &[GIB], Path::new("/lib/libgpushim.so")).unwrap();
            assert!(render(&l).unwrap_err().contains("LD_PRELOAD"), "{value:?}");
        }
        assert!(render(&[Line::Export("A B".into(), b"1".to_vec())]).is_err());
        assert!(render(&[Line::Export("A".into(), b" 1".to_vec())]).is_err());
        assert!(render(&[Line::Export("A".into(), Vec::new())]).is_err());
        // a value with a space is kept whole by Slurm (no quoting needed)…
        assert_eq!(render(&[Line::Export("A".into(), b"/my dir/x.so".to_vec())]).unwrap(), b"export A=/my dir/x.so\n");
    }

    #[test]
    fn a_library_path_ld_so_would_split_is_refused() {
        // …but ld.so splits LD_PRELOAD at spaces and colons and would ignore the pieces
        let e = env(&[("SLURM_JOB_ID", "1"), ("SLURM_SHARDS_ON_NODE", "1")]);
        let job = read_job(&e, 1).unwrap().unwrap();
        for bad in ["/my dir/libgpushim.so", "/opt/a:b/libgpushim.so"] {
            let err = lines(&e, &job, 1, false, &[GIB], Path::new(bad)).unwrap_err();
            assert!(err.contains("a space or a colon"), "{bad}: {err}");
        }
    }

    #[test]
    fn every_off_switch_is_beaten() {
        // GPUSHIM_DISABLE=0 beats CUDA_DISABLE_CONTROL=true and a file's disable = true (the
        // shim's own loader says so); the job's GPUSHIM_CONFIG is unset
        let e = env(&[("SLURM_JOB_ID", "1"), ("SLURM_SHARDS_ON_NODE", "1"), ("CUDA_DISABLE_CONTROL", "true"), ("GPUSHIM_CONFIG", "/x.toml")]);
        let job = read_job(&e, 1).unwrap().unwrap();
        let l = lines(&e, &job, 1, false, &[GIB], Path::new("/lib/libgpushim.so")).unwrap();
        assert!(l.contains(&Line::Export("GPUSHIM_DISABLE".into(), b"0".to_vec())), "{l:?}");
        assert!(l.contains(&Line::Unset("GPUSHIM_CONFIG".into())), "{l:?}");
        let dir = std::env::temp_dir().join(format!("gpushim-slurm-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("off.toml");
        std::fs::write(&file, "disable = true\n").unwrap();
        let get = |vars: Vec<(&'static str, String)>| {
            let names: Vec<String> = vars.iter().map(|(k, _)| k.to_string()).collect();
            let lookup = move |n: &str| vars.iter().find(|(k, _)| *k == n).map(|(_, v)| v.clone());
            gpushim_common::config::load_from(&lookup, &names).map(|s| s.disable)
        };
        let f = file.display().to_string();
        assert_eq!(get(vec![("CUDA_DISABLE_CONTROL", "true".into())]).unwrap(), true, "the switch works without the prolog");
        assert_eq!(get(vec![("GPUSHIM_CONFIG", f.clone())]).unwrap(), true);
        assert_eq!(get(vec![("CUDA_DISABLE_CONTROL", "true".into()), ("GPUSHIM_CONFIG", f), ("GPUSHIM_DISABLE", "0".into())]).unwrap(), false);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
