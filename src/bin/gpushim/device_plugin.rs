//! `gpushim device-plugin`: a kubelet device plugin (API v1beta1, gRPC over unix sockets) for
//! `gpushim.dev/gpu`: serves DevicePlugin on DIR/gpushim.sock, registers at DIR/kubelet.sock,
//! polls NVML for health (each poll bounded), writes the CDI spec of the devices it offers,
//! registers again when the kubelet restarts, stops on SIGTERM/SIGINT (removing the spec).

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tonic::{Request, Response, Status};

use crate::cdi::{self, Device, DeviceOptions, KIND};
use crate::gpus::Nvml;
use crate::kubelet::device_plugin_server::{DevicePlugin, DevicePluginServer};
use crate::kubelet::registration_client::RegistrationClient;
use crate::kubelet::{
    AllocateRequest, AllocateResponse, CdiDevice, ContainerAllocateResponse, DevicePluginOptions, Empty, ListAndWatchResponse,
    Mount, PreStartContainerRequest, PreStartContainerResponse, PreferredAllocationRequest, PreferredAllocationResponse,
    RegisterRequest,
};
use crate::Failure;

const COMMAND: &str = "device-plugin";
/// The API version this plugin speaks.
pub const API_VERSION: &str = "v1beta1";
/// The plugin's socket, in the kubelet's directory.
pub const SOCKET: &str = "gpushim.sock";
/// How often the kubelet's socket is looked at (a restart makes it again).
const WATCH_EVERY: Duration = Duration::from_millis(500);
/// The variable NVIDIA's container runtime reads to give a container GPUs (legacy mode).
pub const NVIDIA_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
/// The longest a registration call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// The plugin's CDI spec, in --cdi-dir (not the name `cdi generate`'s documentation uses).
pub const SPEC_FILE: &str = "gpushim-device-plugin.json";
/// How long blocking threads (a hung NVML call) are waited for at exit.
const EXIT_WAIT: Duration = Duration::from_millis(500);

#[derive(Args, Debug)]
pub struct PluginArgs {
    #[command(flatten)]
    pub devices: DeviceOptions,
    /// the kubelet's device plugin directory (its kubelet.sock; the plugin's gpushim.sock goes
    /// there too)
    #[arg(long, value_name = "DIR", default_value = "/var/lib/kubelet/device-plugins")]
    pub kubelet_dir: PathBuf,
    /// seconds between two health checks of the GPUs (NVML), 0.1 to 3600
    #[arg(long, value_name = "SECONDS", default_value = "5", value_parser = seconds, allow_hyphen_values = true)]
    pub health_interval: Duration,
    /// seconds one health check may take, 0.1 to 3600; past it (a hung driver) every device is
    /// Unhealthy until NVML answers again
    #[arg(long, value_name = "SECONDS", default_value = "10", value_parser = seconds, allow_hyphen_values = true)]
    pub health_timeout: Duration,
    /// the directory of the CDI spec the plugin writes at start (gpushim-device-plugin.json, the
    /// devices it offers) and removes when it stops; the container runtime's CDI directory
    #[arg(long, value_name = "DIR", default_value = "/var/run/cdi")]
    pub cdi_dir: PathBuf,
    /// write no CDI spec and name no CDI device in Allocate (the environment and the mount only,
    /// for runtimes without CDI)
    #[arg(long)]
    pub no_cdi: bool,
}

fn seconds(v: &str) -> Result<Duration, String> {
    v.trim()
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.1 && *s <= 3600.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| "needs seconds between 0.1 and 3600, like --health-interval 5".to_string())
}

/// A line on stderr; a closed stderr is not a reason to stop serving.
fn log(message: impl std::fmt::Display) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "gpushim device-plugin: {message}");
}

/// What every session of the service shares.
struct Plugin {
    devices: Vec<Device>,
    compute: bool,
    library: PathBuf,
    /// Whether Allocate names CDI devices (a spec of them was written).
    cdi: bool,
    /// Health of each GPU, by NVML index (the poller writes it).
    health: watch::Receiver<BTreeMap<u32, bool>>,
}

impl Plugin {
    fn list(&self, health: &BTreeMap<u32, bool>) -> ListAndWatchResponse {
        let devices = self
            .devices
            .iter()
            .map(|d| crate::kubelet::Device {
                id: d.id.clone(),
                health: if health.get(&d.gpu.index).copied().unwrap_or(true) { "Healthy" } else { "Unhealthy" }.into(),
                topology: None,
            })
            .collect();
        ListAndWatchResponse { devices }
    }

    /// The answer for one container given `ids`.
    fn allocate(&self, ids: &[String]) -> Result<ContainerAllocateResponse, Status> {
        let mut devices: Vec<&Device> = Vec::new();
        for id in ids {
            let Some(d) = self.devices.iter().find(|d| &d.id == id) else {
                let known: Vec<&str> = self.devices.iter().map(|d| d.id.as_str()).collect();
                return Err(Status::invalid_argument(format!("unknown device {id:?}; this plugin offers {}", known.join(", "))));
            };
            if !self.health.borrow().get(&d.gpu.index).copied().unwrap_or(true) {
                return Err(Status::failed_precondition(format!("device {id:?} is unhealthy: GPU {} does not answer", d.gpu.index)));
            }
            if !devices.contains(&d) {
                devices.push(d);
            }
        }
        let Some(first) = devices.first() else {
            return Err(Status::invalid_argument("no device requested"));
        };
        let mut response = ContainerAllocateResponse::default();
        let edits = cdi::edits(first, self.compute, &self.library);
        if devices.len() == 1 {
            response.envs = edits.env.into_iter().collect();
            if self.cdi {
                response.cdi_devices = vec![CdiDevice { name: format!("{KIND}={}", first.id) }];
            }
        } else {
            // Several devices: one LD_PRELOAD, the GPUs in order, each GPU's limit the sum of
            // its slices. The CDI devices' edits would overwrite each other's variables, so
            // only the environment below is given (runtimes apply it with or without CDI).
            response.envs = merged_env(&devices, self.compute);
        }
        // NVIDIA's container runtime (the GPU Operator's default) gives the container these
        // GPUs' device nodes and driver libraries; gpushim's edits never do
        let uuids: Vec<&str> = devices.iter().map(|d| d.gpu.uuid.as_str()).fold(Vec::new(), |mut v, u| {
            if !v.contains(&u) {
                v.push(u);
            }
            v
        });
        response.envs.insert(NVIDIA_VISIBLE_DEVICES.into(), uuids.join(","));
        response.mounts = edits
            .mounts
            .iter()
            .map(|m| Mount { container_path: m.container.clone(), host_path: m.host.to_string_lossy().into_owned(), read_only: m.read_only })
            .collect();
        Ok(response)
    }
}

/// The environment of a container given several devices.
fn merged_env(devices: &[&Device], compute: bool) -> std::collections::HashMap<String, String> {
    let mut gpus: Vec<(&crate::gpus::Gpu, u64, Option<u32>)> = Vec::new();
    for d in devices {
        let share = d.slice.map_or(d.gpu.memory, |(_, n)| d.gpu.memory / n as u64);
        match gpus.iter_mut().find(|(g, _, _)| g.uuid == d.gpu.uuid) {
            Some(entry) => entry.1 += share,
            None => gpus.push((&d.gpu, share, d.slice.map(|(_, n)| n))),
        }
    }
    let mut env = std::collections::HashMap::new();
    env.insert("LD_PRELOAD".to_string(), cdi::CONTAINER_LIBRARY.to_string());
    env.insert("GPUSHIM_VISIBLE_DEVICES".into(), gpus.iter().map(|(g, _, _)| g.uuid.as_str()).collect::<Vec<_>>().join(","));
    for (i, (g, limit, sliced)) in gpus.iter().enumerate() {
        if sliced.is_some() && *limit < g.memory {
            env.insert(format!("GPUSHIM_MEMORY_LIMIT_{i}"), limit.to_string());
        }
    }
    if let Some((k, _)) = devices.iter().find_map(|d| d.slice) {
        env.insert("GPUSHIM_SHARED_QUOTA".into(), cdi::quota_name(&devices[0].gpu.uuid, k));
        if compute {
            if let Some(n) = devices[0].slice.map(|(_, n)| n) {
                env.insert("GPUSHIM_COMPUTE_LIMIT".into(), cdi::compute_share(n));
            }
        }
    }
    env
}

/// One serving of the plugin's socket: its service ends its streams when `stop` turns true.
struct Service {
    plugin: Arc<Plugin>,
    stop: watch::Receiver<bool>,
}

type Stream = Pin<Box<dyn tokio_stream::Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for Service {
    async fn get_device_plugin_options(&self, _: Request<Empty>) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    type ListAndWatchStream = Stream;

    async fn list_and_watch(&self, _: Request<Empty>) -> Result<Response<Stream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        let plugin = self.plugin.clone();
        let mut health = plugin.health.clone();
        let mut stop = self.stop.clone();
        tokio::spawn(async move {
            loop {
                let list = plugin.list(&health.borrow_and_update());
                if tx.send(Ok(list)).await.is_err() {
                    break;
                }
                tokio::select! {
                    r = health.changed() => if r.is_err() { break },
                    _ = stop.wait_for(|s| *s) => break,
                    _ = tx.closed() => break,
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn get_preferred_allocation(&self, _: Request<PreferredAllocationRequest>) -> Result<Response<PreferredAllocationResponse>, Status> {
        // not advertised (options()): the kubelet does not call it
        Ok(Response::new(PreferredAllocationResponse::default()))
    }

    async fn allocate(&self, request: Request<AllocateRequest>) -> Result<Response<AllocateResponse>, Status> {
        let mut out = AllocateResponse::default();
        for c in &request.get_ref().container_requests {
            match self.plugin.allocate(&c.devices_ids) {
                Ok(r) => out.container_responses.push(r),
                Err(e) => {
                    log(format!("Allocate refused: {}", e.message()));
                    return Err(e);
                }
            }
        }
        log(format!(
            "Allocate: {}",
            request.get_ref().container_requests.iter().map(|c| c.devices_ids.join("+")).collect::<Vec<_>>().join(", ")
        ));
        Ok(Response::new(out))
    }

    async fn pre_start_container(&self, _: Request<PreStartContainerRequest>) -> Result<Response<PreStartContainerResponse>, Status> {
        // not required (options()): nothing to do before a container starts
        Ok(Response::new(PreStartContainerResponse::default()))
    }
}

fn options() -> DevicePluginOptions {
    DevicePluginOptions { pre_start_required: false, get_preferred_allocation_available: false }
}

/// `gpushim device-plugin`.
pub fn main(a: &PluginArgs) -> Result<(), Failure> {
    let library = cdi::library(COMMAND, a.devices.library.as_deref())?;
    let nvml = Nvml::open().map_err(|e| Failure::setup(COMMAND, e.to_string()))?;
    // a GPU lost at start is left out (cdi::gpus says which): its UUID and memory are unknown
    let gpus = cdi::gpus(COMMAND, &nvml)?;
    let devices = cdi::plugin_devices(&gpus, a.devices.slices);
    let ids: Vec<&str> = devices.iter().map(|d| d.id.as_str()).collect();
    log(format!("{} GPU(s), devices {}, library {}", gpus.len(), ids.join(" "), library.display()));
    // the spec of exactly the devices advertised: Allocate names them, and containerd 2.x or
    // CRI-O with CDI on refuse a container whose CDI device no spec resolves
    let spec_path = a.cdi_dir.join(SPEC_FILE);
    // the file written (device, inode): removed at the end only if still ours (a newer plugin,
    // in a rolling update, may have replaced it)
    let mut written = None;
    if !a.no_cdi {
        let spec = cdi::spec(&devices, a.devices.compute, &library);
        let mut text = serde_json::to_string_pretty(&spec).map_err(|e| Failure::setup(COMMAND, e.to_string()))?;
        text.push('\n');
        std::fs::create_dir_all(&a.cdi_dir)
            .and_then(|()| cdi::write_atomically(&spec_path, text.as_bytes()))
            .map_err(|e| Failure::setup(COMMAND, format!("cannot write the CDI spec {}: {e} (--no-cdi: none, and no CDI names in Allocate)", spec_path.display())))?;
        written = identity(&spec_path);
        log(format!("CDI spec of the devices written to {}", spec_path.display()));
    }
    // a kubelet that goes away mid-answer must not kill the plugin: write errors instead of
    // SIGPIPE (main sets it to the default, for commands whose reader may go away)
    // SAFETY: setting a signal's disposition before any thread of this command exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::setup(COMMAND, format!("cannot start: {e}")))?;
    let (health_tx, health_rx) = watch::channel(gpus.iter().map(|g| (g.index, true)).collect::<BTreeMap<_, _>>());
    let plugin = Arc::new(Plugin { devices, compute: a.devices.compute, library, cdi: !a.no_cdi, health: health_rx });
    let result = runtime.block_on(async {
        tokio::spawn(poll_health(nvml, gpus, health_tx, a.health_interval, a.health_timeout));
        serve(plugin, &a.kubelet_dir).await
    });
    // a health check blocked in NVML is not waited for (dropping the runtime would)
    runtime.shutdown_timeout(EXIT_WAIT);
    if written.is_some() {
        if identity(&spec_path) != written {
            log(format!("{} was replaced by another writer: left in place", spec_path.display()));
        } else {
            match std::fs::remove_file(&spec_path) {
                Ok(()) => log(format!("{} removed", spec_path.display())),
                Err(e) => log(format!("cannot remove {}: {e}", spec_path.display())),
            }
        }
    }
    result
}

type Check = tokio::task::JoinHandle<Vec<(u32, Result<(), crate::gpus::Error>)>>;

/// Checks every GPU every `every`; a change is sent to every ListAndWatch stream. A check not
/// done within `deadline` (NVML blocked) makes every device Unhealthy; no second check is
/// started while that one is blocked.
async fn poll_health(nvml: Nvml, gpus: Vec<crate::gpus::Gpu>, tx: watch::Sender<BTreeMap<u32, bool>>, every: Duration, deadline: Duration) {
    let nvml = Arc::new(nvml);
    let mut blocked: Option<Check> = None;
    loop {
        tokio::time::sleep(every).await;
        let mut check = match blocked.take() {
            Some(c) if !c.is_finished() => {
                blocked = Some(c);
                continue;
            }
            Some(c) => c,
            None => {
                let (n, list) = (nvml.clone(), gpus.clone());
                tokio::task::spawn_blocking(move || list.iter().map(|g| (g.index, n.health(&g.uuid))).collect::<Vec<_>>())
            }
        };
        let now = match tokio::time::timeout(deadline, &mut check).await {
            Ok(Ok(now)) => now,
            Ok(Err(_)) => continue,
            Err(_) => {
                blocked = Some(check);
                tx.send_if_modified(|health| {
                    let changed = health.values().any(|ok| *ok);
                    if changed {
                        log(format!("NVML did not answer a health check within {deadline:?}: every device is Unhealthy until it does"));
                    }
                    health.values_mut().for_each(|ok| *ok = false);
                    changed
                });
                continue;
            }
        };
        tx.send_if_modified(|health| {
            let mut changed = false;
            for (index, result) in &now {
                let ok = result.is_ok();
                if health.get(index) != Some(&ok) {
                    match result {
                        Ok(()) => log(format!("GPU {index} is healthy again")),
                        Err(e) => log(format!("GPU {index} is unhealthy: {e}")),
                    }
                    health.insert(*index, ok);
                    changed = true;
                }
            }
            changed
        });
    }
}

/// The kubelet socket's identity (device, inode), or None while it is absent.
fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Serves and registers, again after each kubelet restart, until SIGTERM or SIGINT.
async fn serve(plugin: Arc<Plugin>, dir: &Path) -> Result<(), Failure> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).map_err(|e| Failure::setup(COMMAND, e.to_string()))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| Failure::setup(COMMAND, e.to_string()))?;
    let kubelet = dir.join("kubelet.sock");
    let socket = dir.join(SOCKET);
    let mut restarts = 0u32;
    loop {
        // a session: our socket served, then registered; it ends when the kubelet's socket
        // is made again (a restart) or ours is removed (the kubelet removes it when it starts)
        let (stop_tx, stop_rx) = watch::channel(false);
        let _ = std::fs::remove_file(&socket);
        let listener = match UnixListener::bind(&socket) {
            Ok(l) => l,
            // at start a failure is final; after a kubelet restart (its directory being made
            // again) it is tried again
            Err(e) if restarts == 0 => return Err(Failure::setup(COMMAND, format!("cannot serve on {}: {e}", socket.display()))),
            Err(e) => {
                log(format!("cannot serve on {}: {e}; trying again in {WATCH_EVERY:?}", socket.display()));
                tokio::select! {
                    _ = term.recv() => log("SIGTERM: stopped"),
                    _ = int.recv() => log("SIGINT: stopped"),
                    _ = tokio::time::sleep(WATCH_EVERY) => continue,
                }
                return Ok(());
            }
        };
        let ours = identity(&socket);
        let service = Service { plugin: plugin.clone(), stop: stop_rx.clone() };
        let mut stopped = stop_rx.clone();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(DevicePluginServer::new(service))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                    let _ = stopped.wait_for(|s| *s).await;
                }),
        );
        log(format!("serving on {}", socket.display()));
        let mut registered: Option<(u64, u64)> = None;
        let mut said_waiting = false;
        let mut last_error = String::new();
        let end = loop {
            if registered.is_none() {
                if let Some(id) = identity(&kubelet) {
                    let result = tokio::select! {
                        r = register(&kubelet) => r,
                        _ = term.recv() => break "SIGTERM",
                        _ = int.recv() => break "SIGINT",
                    };
                    match result {
                        Ok(()) => {
                            log(format!("registered {KIND} with the kubelet at {}", kubelet.display()));
                            registered = Some(id);
                        }
                        // said once, not at every try
                        Err(e) if e != last_error => {
                            log(format!("registration failed: {e}; trying again every {WATCH_EVERY:?}"));
                            last_error = e;
                        }
                        Err(_) => {}
                    }
                } else if !said_waiting {
                    log(format!("waiting for the kubelet ({} is absent)", kubelet.display()));
                    said_waiting = true;
                }
            }
            tokio::select! {
                _ = term.recv() => break "SIGTERM",
                _ = int.recv() => break "SIGINT",
                _ = tokio::time::sleep(WATCH_EVERY) => {}
            }
            // None: removed between bind and stat (the kubelet starting): a restart too
            if ours.is_none() || identity(&socket) != ours {
                break "restart";
            }
            if let (Some(id), Some(now)) = (registered, identity(&kubelet)) {
                if id != now {
                    break "restart";
                }
            }
        };
        let _ = stop_tx.send(true);
        // the server ends when its connections have; a kubelet that keeps one open is not waited for
        let abort = server.abort_handle();
        if tokio::time::timeout(Duration::from_secs(2), server).await.is_err() {
            abort.abort();
        }
        if identity(&socket) == ours {
            let _ = std::fs::remove_file(&socket);
        }
        if end != "restart" {
            log(format!("{end}: stopped, {} removed", socket.display()));
            return Ok(());
        }
        restarts += 1;
        log("the kubelet restarted: serving and registering again");
    }
}

/// `Registration.Register` at the kubelet's socket.
async fn register(kubelet: &Path) -> Result<(), String> {
    let path = kubelet.to_path_buf();
    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_timeout(CALL_TIMEOUT)
        .timeout(CALL_TIMEOUT)
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
        .map_err(|e| format!("cannot connect to {}: {e}", kubelet.display()))?;
    let request = RegisterRequest {
        version: API_VERSION.into(),
        endpoint: SOCKET.into(),
        resource_name: KIND.into(),
        options: Some(options()),
    };
    RegistrationClient::new(channel).register(request).await.map_err(|s| format!("the kubelet refused: {}", s.message()))?;
    Ok(())
}
