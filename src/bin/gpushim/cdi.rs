//! The devices gpushim offers to containers (a whole GPU `i`, a slice `i-k`), the container
//! edits of each (environment, the library's read-only mount), and `gpushim cdi generate`, the
//! Container Device Interface spec made of them; the device plugin answers with the same edits.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Args;
use serde_json::{json, Value};

use crate::gpus::{Gpu, Nvml};
use crate::Failure;

/// The CDI kind (`vendor/class`) of every gpushim device, and the Kubernetes resource name.
pub const KIND: &str = "gpushim.dev/gpu";
/// The newest CDI version Debian 12's podman (4.3) accepts; the spec uses nothing newer.
pub const CDI_VERSION: &str = "0.5.0";
/// Where the library is mounted in a container (the path of config/Dockerfile's image).
pub const CONTAINER_LIBRARY: &str = "/opt/gpushim/lib/libgpushim.so";
/// The most slices of one GPU.
pub const MAX_SLICES: u32 = 128;

#[derive(Args, Debug)]
pub struct CdiArgs {
    /// what to do: generate (the only action)
    #[arg(value_name = "ACTION", value_parser = ["generate"])]
    pub action: String,
    #[command(flatten)]
    pub devices: DeviceOptions,
    /// write the spec to this file (atomically: a temporary file renamed), e.g.
    /// /etc/cdi/gpushim.json; default: standard output
    #[arg(long, short = 'o', value_name = "PATH")]
    pub output: Option<PathBuf>,
}

/// What `cdi generate` and `device-plugin` offer.
#[derive(Args, Debug, Clone)]
pub struct DeviceOptions {
    /// offer N slices of each GPU, each with 1/N of its memory (1 to 128)
    #[arg(long, value_name = "N", value_parser = slices, allow_hyphen_values = true)]
    pub slices: Option<u32>,
    /// give each slice 1/N of the GPU's time too (GPUSHIM_COMPUTE_LIMIT)
    #[arg(long)]
    pub compute: bool,
    /// the libgpushim.so to mount into containers, as a path on the host; default:
    /// GPUSHIM_LIBRARY, else libgpushim.so next to this program, else ../lib/libgpushim.so from it
    #[arg(long, value_name = "PATH")]
    pub library: Option<PathBuf>,
}

fn slices(v: &str) -> Result<u32, String> {
    match v.trim().parse::<u64>() {
        Ok(n) if (1..=MAX_SLICES as u64).contains(&n) => Ok(n as u32),
        Ok(_) => Err(format!("needs a number of slices from 1 to {MAX_SLICES}, like --slices 4")),
        Err(_) => Err(format!("needs a number of slices from 1 to {MAX_SLICES}, like --slices 4")),
    }
}

/// One device offered to containers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// `i` (a whole GPU) or `i-k` (slice k of GPU i).
    pub id: String,
    pub gpu: Gpu,
    /// `(k, n)`: slice k of n.
    pub slice: Option<(u32, u32)>,
}

/// A bind mount of a container edit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub host: PathBuf,
    pub container: String,
    pub read_only: bool,
}

/// What a device changes in a container: environment variables and mounts. Never device
/// nodes or driver libraries: NVIDIA's own spec (`nvidia.com/gpu`) or runtime brings those.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Edits {
    pub env: Vec<(String, String)>,
    pub mounts: Vec<Mount>,
}

/// The CDI devices of `gpus`: each GPU whole (`i`) and, with `slices`, its slices `i-k`.
pub fn cdi_devices(gpus: &[Gpu], slices: Option<u32>) -> Vec<Device> {
    let mut out = Vec::new();
    for g in gpus {
        out.push(Device { id: g.index.to_string(), gpu: g.clone(), slice: None });
        if let Some(n) = slices {
            out.extend((0..n).map(|k| Device { id: format!("{}-{k}", g.index), gpu: g.clone(), slice: Some((k, n)) }));
        }
    }
    out
}

/// The devices the kubelet is told of: one per slice (`i-k`), or one per GPU (`i`) without
/// slices or with one.
pub fn plugin_devices(gpus: &[Gpu], slices: Option<u32>) -> Vec<Device> {
    match slices {
        Some(n) if n > 1 => cdi_devices(gpus, Some(n)).into_iter().filter(|d| d.slice.is_some()).collect(),
        _ => cdi_devices(gpus, None),
    }
}

/// The shared quota of slice `k` of the GPU `uuid`: one budget for every process of the
/// container (or of every container given that slice).
pub fn quota_name(uuid: &str, k: u32) -> String {
    format!("gpushim-{uuid}-{k}")
}

/// 1/n as a GPUSHIM_COMPUTE_LIMIT percentage (`50%`, `33.3333%`).
pub fn compute_share(n: u32) -> String {
    let p = format!("{:.4}", 100.0 / n as f64);
    format!("{}%", p.trim_end_matches('0').trim_end_matches('.'))
}

/// The edits of `device`, the library being at `library` on the host.
pub fn edits(device: &Device, compute: bool, library: &Path) -> Edits {
    let mut env = vec![
        ("LD_PRELOAD".to_string(), CONTAINER_LIBRARY.to_string()),
        ("GPUSHIM_VISIBLE_DEVICES".to_string(), device.gpu.uuid.clone()),
    ];
    if let Some((k, n)) = device.slice {
        env.push(("GPUSHIM_MEMORY_LIMIT".into(), (device.gpu.memory / n as u64).to_string()));
        env.push(("GPUSHIM_SHARED_QUOTA".into(), quota_name(&device.gpu.uuid, k)));
        if compute {
            env.push(("GPUSHIM_COMPUTE_LIMIT".into(), compute_share(n)));
        }
    }
    Edits { env, mounts: vec![Mount { host: library.to_path_buf(), container: CONTAINER_LIBRARY.into(), read_only: true }] }
}

/// The CDI spec (JSON) of `devices`.
pub fn spec(devices: &[Device], compute: bool, library: &Path) -> Value {
    let devices: Vec<Value> = devices
        .iter()
        .map(|d| {
            let e = edits(d, compute, library);
            json!({
                "name": d.id,
                "containerEdits": {
                    "env": e.env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
                    "mounts": e.mounts.iter().map(|m| json!({
                        "hostPath": m.host.to_string_lossy(),
                        "containerPath": m.container,
                        "options": if m.read_only { vec!["ro", "nosuid", "nodev", "bind"] } else { vec!["nosuid", "nodev", "bind"] },
                    })).collect::<Vec<_>>(),
                },
            })
        })
        .collect();
    json!({ "cdiVersion": CDI_VERSION, "kind": KIND, "devices": devices })
}

/// The GPUs that answer, or the failure `command` reports. A lost GPU
/// (`NVML_ERROR_GPU_IS_LOST`) is left out with a warning naming it on stderr: a spec or a
/// plugin without one GPU is better than none; no GPU answering at all is a failure.
pub fn gpus(command: &str, nvml: &Nvml) -> Result<Vec<Gpu>, Failure> {
    let listing = nvml.list().map_err(|e| Failure::setup(command, e.to_string()))?;
    for (index, e) in &listing.lost {
        eprintln!("gpushim {command}: warning: GPU {index} left out: {e}");
    }
    if listing.gpus.is_empty() {
        let why = if listing.lost.is_empty() { "the driver shows no GPU (nvidia-smi lists none)" } else { "no GPU answers (every one is lost)" };
        return Err(Failure::setup(command, why));
    }
    Ok(listing.gpus)
}

/// The library's host path: `--library`, else as `gpushim run` finds it.
pub fn library(command: &str, flag: Option<&Path>) -> Result<PathBuf, Failure> {
    let env: Vec<_> = std::env::vars_os().collect();
    crate::library::find(command, flag, &env)
}

/// `gpushim cdi generate`.
pub fn main(a: &CdiArgs) -> Result<(), Failure> {
    const COMMAND: &str = "cdi generate";
    let library = library(COMMAND, a.devices.library.as_deref())?;
    let nvml = Nvml::open().map_err(|e| Failure::setup(COMMAND, e.to_string()))?;
    let gpus = gpus(COMMAND, &nvml)?;
    let spec = spec(&cdi_devices(&gpus, a.devices.slices), a.devices.compute, &library);
    let mut text = serde_json::to_string_pretty(&spec).map_err(|e| Failure::setup(COMMAND, e.to_string()))?;
    text.push('\n');
    match &a.output {
        None => {
            print!("{text}");
            Ok(())
        }
        Some(path) => write_atomically(path, text.as_bytes()).map_err(|e| Failure::setup(COMMAND, format!("{}: {e}", path.display()))),
    }
}

/// Writes `path` whole or not at all: a temporary file in the same directory, mode 0644
/// whatever the umask, synced, renamed over it, the directory synced (a runtime reading the CDI
/// directory never sees half a spec). A temporary file is removed only if this call made it.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().ok_or_else(|| std::io::Error::other("not a file name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".tmp{}", std::process::id()));
    let tmp = dir.join(tmp_name);
    // create_new: a file of that name already there (another writer) is never ours to remove
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o644).open(&tmp)?;
    let result = (|| {
        f.set_permissions(std::fs::Permissions::from_mode(0o644))?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        // ours (create_new succeeded); already gone if the rename happened
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
