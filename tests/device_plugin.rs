//! `gpushim device-plugin` against a fake kubelet speaking the real device plugin API v1beta1
//! (the upstream api.proto, compiled: src/bin/gpushim/kubelet/v1beta1.rs, checked here against a
//! fresh compilation), on the simulated driver: registration, ListAndWatch (exact IDs, a GPU
//! that falls off the bus turning Unhealthy), Allocate (CDI names, environment, mount; an
//! unhealthy device refused), the CDI spec it writes and removes, a bad device ID, a kubelet
//! restart, SIGTERM; a GPU lost at start; NVML blocking in a health check. Every wait is bounded.

mod common;

#[allow(clippy::all, dead_code, missing_docs, unreachable_pub)]
#[path = "../src/bin/gpushim/kubelet/v1beta1.rs"]
mod api;

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use api::device_plugin_client::DevicePluginClient;
use api::registration_server::{Registration, RegistrationServer};
use api::{AllocateRequest, ContainerAllocateRequest, Empty, ListAndWatchResponse, RegisterRequest};
use common::*;
use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

/// The longest any single step may take.
const STEP: Duration = Duration::from_secs(20);

/// `f` within [`STEP`], or the test fails naming `what`.
async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(STEP, f).await.unwrap_or_else(|_| panic!("{what}: not within {STEP:?}"))
}

#[test]
fn generated_api_is_up_to_date() {
    let dir = workspace_root().join("src/bin/gpushim/kubelet");
    let out = fresh_dir("proto");
    let files = protox::compile(["api.proto"], [&dir]).expect("api.proto compiles");
    tonic_prost_build::configure().build_server(true).build_client(true).out_dir(&out).compile_fds(files).expect("generate");
    let fresh = std::fs::read_to_string(out.join("v1beta1.rs")).unwrap();
    let path = dir.join("v1beta1.rs");
    if std::env::var_os("GPUSHIM_BLESS").is_some() {
        std::fs::write(&path, &fresh).unwrap();
    }
    let kept = std::fs::read_to_string(&path).unwrap();
    assert!(kept == fresh, "{} is not what api.proto compiles to: GPUSHIM_BLESS=1 cargo test --release --test device_plugin rewrites it", path.display());
}

// ---------------------------------------------------------------------------------------
// The fake kubelet
// ---------------------------------------------------------------------------------------

struct Kubelet {
    tx: mpsc::UnboundedSender<RegisterRequest>,
    /// How many registrations to refuse first (as a kubelet refuses an unknown version).
    refuse: std::sync::atomic::AtomicUsize,
}

#[tonic::async_trait]
impl Registration for Kubelet {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        use std::sync::atomic::Ordering;
        if self.refuse.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
            return Err(Status::invalid_argument("not now"));
        }
        let _ = self.tx.send(request.into_inner());
        Ok(Response::new(Empty {}))
    }
}

/// A kubelet's Registration service at `socket`; stops when the sender is dropped or sent.
fn start_kubelet(socket: &Path, tx: mpsc::UnboundedSender<RegisterRequest>) -> oneshot::Sender<()> {
    start_kubelet_refusing(socket, tx, 0)
}

/// The same, refusing the first `refuse` registrations.
fn start_kubelet_refusing(socket: &Path, tx: mpsc::UnboundedSender<RegisterRequest>, refuse: usize) -> oneshot::Sender<()> {
    let _ = std::fs::remove_file(socket);
    let listener = UnixListener::bind(socket).unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(Kubelet { tx, refuse: refuse.into() }))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                let _ = stopped.await;
            }),
    );
    stop
}

async fn connect(socket: &Path) -> DevicePluginClient<Channel> {
    let path = socket.to_path_buf();
    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
        .unwrap_or_else(|e| panic!("connect to {}: {e}", socket.display()));
    DevicePluginClient::new(channel)
}

/// The kubelet's directory: short enough for a unix socket's path (108 bytes).
struct KubeletDir(PathBuf);

impl KubeletDir {
    fn new() -> KubeletDir {
        let dir = fresh_dir("kubelet");
        if dir.join("kubelet.sock").as_os_str().len() < 100 {
            return KubeletDir(dir);
        }
        let short = PathBuf::from(format!("/tmp/gpushim-kubelet-{}-{}", std::process::id(), dir.file_name().unwrap().to_string_lossy()));
        std::fs::create_dir_all(&short).unwrap();
        KubeletDir(short)
    }
}

impl Drop for KubeletDir {
    fn drop(&mut self) {
        if self.0.starts_with("/tmp") {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// `gpushim device-plugin ARGS --kubelet-dir DIR --cdi-dir DIR/cdi` on 2 simulated GPUs of 16
/// GiB; GPUSIM_LOST names DIR/lost. Its stderr goes to DIR/plugin.log.
fn start_plugin(dir: &Path, args: &[&str]) -> Holder {
    shim_path();
    nvml_sim_library();
    let log = std::fs::File::create(dir.join("plugin.log")).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_gpushim"))
        .arg("device-plugin")
        .args(args)
        .arg("--kubelet-dir")
        .arg(dir)
        .arg("--cdi-dir")
        .arg(dir.join("cdi"))
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("LD_LIBRARY_PATH", sim_dir())
        .env("GPUSIM_DEVICES", "2")
        .env("GPUSIM_MEMORY", "16GiB")
        .env("GPUSIM_LOST", dir.join("lost"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start gpushim device-plugin");
    Holder(child)
}

/// The device names of the plugin's CDI spec in DIR/cdi, or None while there is none.
fn spec_devices(dir: &Path) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(dir.join("cdi/gpushim-device-plugin.json")).ok()?;
    let spec: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("the spec is not JSON: {e}\n{text}"));
    assert_eq!(spec["kind"], "gpushim.dev/gpu");
    Some(spec["devices"].as_array().unwrap().iter().map(|d| d["name"].as_str().unwrap().to_string()).collect())
}

/// SIGTERM to the plugin: it exits 0 within [`STEP`], its socket and its CDI spec removed (or,
/// `replaced`, the spec another writer put there left as it is).
async fn terminate(plugin: &mut Holder, dir: &Path) {
    terminate_replaced(plugin, dir, None).await
}

async fn terminate_replaced(plugin: &mut Holder, dir: &Path, replaced: Option<Vec<String>>) {
    // SAFETY: a signal to the child this test started (and has not reaped).
    unsafe { libc::kill(plugin.pid() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + STEP;
    let status = loop {
        if let Some(s) = plugin.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "no exit within {STEP:?} of SIGTERM\n{}", log_of(dir));
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(status.code(), Some(0), "{}", log_of(dir));
    assert!(!dir.join("gpushim.sock").exists(), "the plugin's socket is removed");
    assert_eq!(spec_devices(dir), replaced, "the CDI spec is removed, if still the plugin's\n{}", log_of(dir));
    assert!(log_of(dir).contains("SIGTERM: stopped"), "{}", log_of(dir));
}

fn log_of(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("plugin.log")).unwrap_or_default()
}

fn summary(r: &ListAndWatchResponse) -> Vec<(String, String)> {
    r.devices.iter().map(|d| (d.id.clone(), d.health.clone())).collect()
}

fn healthy(ids: &[&str], unhealthy: &[&str]) -> Vec<(String, String)> {
    ids.iter().map(|i| (i.to_string(), if unhealthy.contains(i) { "Unhealthy" } else { "Healthy" }.to_string())).collect()
}

async fn next(stream: &mut Streaming<ListAndWatchResponse>, what: &str) -> ListAndWatchResponse {
    within(what, stream.message()).await.unwrap_or_else(|e| panic!("{what}: {e}")).unwrap_or_else(|| panic!("{what}: the stream ended"))
}

fn allocate(ids: &[&str]) -> AllocateRequest {
    AllocateRequest { container_requests: vec![ContainerAllocateRequest { devices_ids: ids.iter().map(|s| s.to_string()).collect() }] }
}

fn library() -> String {
    std::fs::canonicalize(shim_path()).unwrap().display().to_string()
}

#[tokio::test]
async fn plugin_registers_lists_allocates_restarts_and_stops() {
    let kd = KubeletDir::new();
    let dir = kd.0.clone();
    let kubelet_sock = dir.join("kubelet.sock");
    let plugin_sock = dir.join("gpushim.sock");
    let (tx, mut registrations) = mpsc::unbounded_channel();
    let stop_kubelet = start_kubelet(&kubelet_sock, tx.clone());
    let mut plugin = start_plugin(&dir, &["--slices", "2", "--health-interval", "0.2"]);

    // registration
    let r = within("registration", registrations.recv()).await.unwrap();
    assert_eq!((r.version.as_str(), r.endpoint.as_str(), r.resource_name.as_str()), ("v1beta1", "gpushim.sock", "gpushim.dev/gpu"), "{}", log_of(&dir));
    let o = r.options.unwrap();
    assert!(!o.pre_start_required && !o.get_preferred_allocation_available);
    assert!(plugin_sock.exists());
    // the CDI spec of exactly the devices advertised, mode 0644
    assert_eq!(spec_devices(&dir).unwrap(), ["0-0", "0-1", "1-0", "1-1"], "{}", log_of(&dir));
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(dir.join("cdi/gpushim-device-plugin.json")).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o644);
    let mut client = connect(&plugin_sock).await;
    let got = within("options", client.get_device_plugin_options(Empty {})).await.unwrap().into_inner();
    assert_eq!(got, o);

    // ListAndWatch: one device per slice, then GPU 1 falls off the bus, then comes back
    let ids = ["0-0", "0-1", "1-0", "1-1"];
    let mut stream = within("ListAndWatch", client.list_and_watch(Empty {})).await.unwrap().into_inner();
    assert_eq!(summary(&next(&mut stream, "first list").await), healthy(&ids, &[]));
    std::fs::write(dir.join("lost"), "1\n").unwrap();
    let stale = "GPU 1 lost (never seen: is the simulator's libnvidia-ml.so.1 stale, without GPUSIM_LOST? rebuild sim/nvml)";
    assert_eq!(summary(&next(&mut stream, stale).await), healthy(&ids, &["1-0", "1-1"]), "{}", log_of(&dir));
    // an unhealthy device is refused
    let err = within("Allocate of a lost GPU's slice", client.allocate(allocate(&["1-0"]))).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert_eq!(err.message(), "device \"1-0\" is unhealthy: GPU 1 does not answer");
    std::fs::remove_file(dir.join("lost")).unwrap();
    assert_eq!(summary(&next(&mut stream, "GPU 1 back").await), healthy(&ids, &[]));
    let log = log_of(&dir);
    assert!(log.contains("GPU 1 is unhealthy: nvmlDeviceGetHandleByUUID failed (NVML_ERROR_GPU_IS_LOST, code 15)"), "{log}");

    // Allocate: the CDI name and the same edits for runtimes without CDI
    let a = within("Allocate", client.allocate(allocate(&["0-1"]))).await.unwrap().into_inner();
    assert_eq!(a.container_responses.len(), 1);
    let c = &a.container_responses[0];
    let uuid = phys_uuid(0);
    let want: HashMap<String, String> = [
        ("LD_PRELOAD", "/opt/gpushim/lib/libgpushim.so".to_string()),
        ("GPUSHIM_VISIBLE_DEVICES", uuid.clone()),
        ("GPUSHIM_MEMORY_LIMIT", (8 * GIB).to_string()),
        ("GPUSHIM_SHARED_QUOTA", format!("gpushim-{uuid}-1")),
        ("NVIDIA_VISIBLE_DEVICES", uuid.clone()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(c.envs, want);
    assert_eq!(c.cdi_devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), ["gpushim.dev/gpu=0-1"]);
    assert_eq!(c.mounts, [api::Mount { container_path: "/opt/gpushim/lib/libgpushim.so".into(), host_path: library(), read_only: true }]);
    assert!(c.devices.is_empty(), "no device node: NVIDIA's plugin or CDI spec brings them");

    // two slices of different GPUs in one container: the GPUs in order, a limit each
    let a = within("Allocate 2", client.allocate(allocate(&["1-0", "0-0"]))).await.unwrap().into_inner();
    let e = &a.container_responses[0].envs;
    assert_eq!(e["GPUSHIM_VISIBLE_DEVICES"], format!("{},{}", phys_uuid(1), uuid));
    assert_eq!((e["GPUSHIM_MEMORY_LIMIT_0"].as_str(), e["GPUSHIM_MEMORY_LIMIT_1"].as_str()), (&*(8 * GIB).to_string(), &*(8 * GIB).to_string()));
    assert_eq!(e["GPUSHIM_SHARED_QUOTA"], format!("gpushim-{}-0", phys_uuid(1)));
    assert!(!e.contains_key("GPUSHIM_MEMORY_LIMIT"));
    assert_eq!(e["NVIDIA_VISIBLE_DEVICES"], format!("{},{}", phys_uuid(1), uuid));
    assert_eq!(e.len(), 6, "{e:?}");
    assert!(a.container_responses[0].cdi_devices.is_empty(), "several devices: the environment only");

    // a bad ID: InvalidArgument, and the plugin goes on serving
    let err = within("bad Allocate", client.allocate(allocate(&["9-9"]))).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert_eq!(err.message(), "unknown device \"9-9\"; this plugin offers 0-0, 0-1, 1-0, 1-1");
    let again = within("Allocate after the bad one", client.allocate(allocate(&["1-1"]))).await.unwrap().into_inner();
    assert_eq!(again.container_responses[0].envs["GPUSHIM_SHARED_QUOTA"], format!("gpushim-{}-1", phys_uuid(1)));
    assert!(plugin.0.try_wait().unwrap().is_none(), "the plugin is still running");

    // kubelet restart: its socket made again, the plugins' sockets removed (as the kubelet
    // does); the plugin serves again and registers again; the old stream ends
    drop(stop_kubelet);
    let _ = std::fs::remove_file(&kubelet_sock);
    let _ = std::fs::remove_file(&plugin_sock);
    let _stop_kubelet = start_kubelet(&kubelet_sock, tx.clone());
    let r = within("registration after the kubelet's restart", registrations.recv()).await.unwrap();
    assert_eq!((r.version.as_str(), r.endpoint.as_str(), r.resource_name.as_str()), ("v1beta1", "gpushim.sock", "gpushim.dev/gpu"), "{}", log_of(&dir));
    let ended = within("the old stream ends", stream.message()).await;
    assert!(!matches!(ended, Ok(Some(_))), "the old stream ended: {ended:?}");
    let mut client = connect(&plugin_sock).await;
    let mut stream = within("ListAndWatch after the restart", client.list_and_watch(Empty {})).await.unwrap().into_inner();
    assert_eq!(summary(&next(&mut stream, "list after the restart").await), healthy(&ids, &[]));
    assert!(log_of(&dir).contains("the kubelet restarted: serving and registering again"), "{}", log_of(&dir));

    // SIGTERM: exit 0, socket and spec removed
    assert_eq!(spec_devices(&dir).unwrap(), ids, "the spec outlives a kubelet restart");
    terminate(&mut plugin, &dir).await;
}

/// A GPU lost before the plugin starts (NVML_ERROR_GPU_IS_LOST on its handle): left out of the
/// devices and of the spec, named in a warning; the plugin serves the others.
#[tokio::test]
async fn gpu_lost_at_start_is_left_out() {
    let kd = KubeletDir::new();
    let dir = kd.0.clone();
    std::fs::write(dir.join("lost"), "1\n").unwrap();
    let (tx, mut registrations) = mpsc::unbounded_channel();
    let _stop = start_kubelet(&dir.join("kubelet.sock"), tx);
    let mut plugin = start_plugin(&dir, &["--slices", "2", "--health-interval", "0.2"]);
    within("registration", registrations.recv()).await.unwrap();
    let mut client = connect(&dir.join("gpushim.sock")).await;
    let mut stream = within("ListAndWatch", client.list_and_watch(Empty {})).await.unwrap().into_inner();
    assert_eq!(summary(&next(&mut stream, "list").await), healthy(&["0-0", "0-1"], &[]), "{}", log_of(&dir));
    assert_eq!(spec_devices(&dir).unwrap(), ["0-0", "0-1"]);
    let log = log_of(&dir);
    assert!(
        log.contains("gpushim device-plugin: warning: GPU 1 left out: nvmlDeviceGetHandleByIndex_v2 on GPU 1 failed (NVML_ERROR_GPU_IS_LOST, code 15)"),
        "a stale simulator without GPUSIM_LOST? {log}"
    );
    let err = within("Allocate of the lost GPU", client.allocate(allocate(&["1-0"]))).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    // another writer (a newer plugin in a rolling update) replaces the spec: it is left there
    let spec = dir.join("cdi/gpushim-device-plugin.json");
    let text = std::fs::read_to_string(&spec).unwrap();
    std::fs::write(dir.join("cdi/new"), &text).unwrap();
    std::fs::rename(dir.join("cdi/new"), &spec).unwrap();
    terminate_replaced(&mut plugin, &dir, Some(vec!["0-0".into(), "0-1".into()])).await;
    assert!(log_of(&dir).contains("was replaced by another writer: left in place"), "{}", log_of(&dir));
    std::fs::remove_file(&spec).unwrap();

    // every GPU lost: status 1, the reason
    std::fs::write(dir.join("lost"), "0 1\n").unwrap();
    let mut all = start_plugin(&dir, &[]);
    let status = within("exit with every GPU lost", async {
        loop {
            if let Some(s) = all.0.try_wait().unwrap() {
                break s;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(status.code(), Some(1));
    assert!(log_of(&dir).contains("gpushim device-plugin: no GPU answers (every one is lost)"), "{}", log_of(&dir));
}

/// NVML blocking in a health check (GPUSIM_LOST made a FIFO nobody writes: the simulator reads
/// it at every device call): past --health-timeout every device is Unhealthy; SIGTERM still
/// ends the plugin at once (the blocked thread is not waited for), its spec removed.
#[tokio::test]
async fn hung_nvml_is_bounded() {
    let kd = KubeletDir::new();
    let dir = kd.0.clone();
    let (tx, mut registrations) = mpsc::unbounded_channel();
    let _stop = start_kubelet(&dir.join("kubelet.sock"), tx);
    let mut plugin = start_plugin(&dir, &["--health-interval", "0.2", "--health-timeout", "1"]);
    within("registration", registrations.recv()).await.unwrap();
    let mut client = connect(&dir.join("gpushim.sock")).await;
    let mut stream = within("ListAndWatch", client.list_and_watch(Empty {})).await.unwrap().into_inner();
    assert_eq!(summary(&next(&mut stream, "list").await), healthy(&["0", "1"], &[]));
    let fifo = std::ffi::CString::new(dir.join("lost").into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let t0 = Instant::now();
    assert_eq!(summary(&next(&mut stream, "every device Unhealthy").await), healthy(&["0", "1"], &["0", "1"]), "{}", log_of(&dir));
    assert!(t0.elapsed() >= Duration::from_millis(900), "not before the deadline: {:?}", t0.elapsed());
    assert!(log_of(&dir).contains("NVML did not answer a health check within 1s: every device is Unhealthy"), "{}", log_of(&dir));
    let t0 = Instant::now();
    terminate(&mut plugin, &dir).await;
    assert!(t0.elapsed() < Duration::from_secs(5), "SIGTERM took {:?}", t0.elapsed());
}

/// Without --slices: one device per GPU, no limit; an absent kubelet is waited for, a refused
/// registration tried again; no driver: status 1 and the reason.
#[tokio::test]
async fn whole_gpus_and_no_driver() {
    let kd = KubeletDir::new();
    let dir = kd.0.clone();
    // the plugin starts before the kubelet: it waits, then registers
    let _plugin = start_plugin(&dir, &["--no-cdi"]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (tx, mut registrations) = mpsc::unbounded_channel();
    let _stop = start_kubelet_refusing(&dir.join("kubelet.sock"), tx, 2);
    let r = within("registration", registrations.recv()).await.unwrap();
    assert_eq!(r.resource_name, "gpushim.dev/gpu");
    let mut client = connect(&dir.join("gpushim.sock")).await;
    let mut stream = within("ListAndWatch", client.list_and_watch(Empty {})).await.unwrap().into_inner();
    assert_eq!(summary(&next(&mut stream, "list").await), healthy(&["0", "1"], &[]));
    let a = within("Allocate", client.allocate(allocate(&["1"]))).await.unwrap().into_inner();
    let envs = &a.container_responses[0].envs;
    assert_eq!(envs.len(), 3, "{envs:?}");
    assert_eq!(envs["NVIDIA_VISIBLE_DEVICES"], phys_uuid(1));
    assert_eq!(envs["GPUSHIM_VISIBLE_DEVICES"], phys_uuid(1));
    assert!(a.container_responses[0].cdi_devices.is_empty(), "--no-cdi: no CDI name");
    assert_eq!(spec_devices(&dir), None, "--no-cdi: no spec");
    let log = log_of(&dir);
    assert!(log.contains("waiting for the kubelet"), "{log}");
    // two refusals: said once, then registered
    assert_eq!(log.matches("registration failed: the kubelet refused: not now; trying again").count(), 1, "{log}");

    let out = Command::new(env!("CARGO_BIN_EXE_gpushim"))
        .args(["device-plugin", "--kubelet-dir"])
        .arg(&dir)
        .env("GPUSHIM_NVML_PATH", "/nonexistent/libnvidia-ml.so.1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("gpushim device-plugin: no NVIDIA driver: cannot open /nonexistent/libnvidia-ml.so.1"), "{err}");
}

/// config/device-plugin.yaml and config/pod-gpushim.yaml parse (where PyYAML is installed; CI:
/// it must be); the DaemonSet's command line is one the command accepts (it gets as far as
/// looking for NVML), its library and CDI directory are the node's paths mounted at the same
/// place; the Pod asks for gpushim.dev/gpu without a RuntimeClass.
#[test]
fn kubernetes_manifests() {
    let Some(python) = python_with("yaml", "the manifest check") else { return };
    let script = "import sys, json, yaml\n\
                  ds=[x for x in yaml.safe_load_all(open(sys.argv[1])) if x]\n\
                  pod=[x for x in yaml.safe_load_all(open(sys.argv[2])) if x]\n\
                  assert [x['kind'] for x in ds]==['DaemonSet'] and [x['kind'] for x in pod]==['Pod']\n\
                  c=ds[0]['spec']['template']['spec']['containers'][0]\n\
                  assert not c['securityContext']['privileged']\n\
                  v={x['name']: x['hostPath']['path'] for x in ds[0]['spec']['template']['spec']['volumes']}\n\
                  m={x['name']: x for x in c['volumeMounts']}\n\
                  cmd=c['command']\n\
                  assert v['cdi']=='/var/run/cdi'==m['cdi']['mountPath']==cmd[cmd.index('--cdi-dir')+1] and not m['cdi'].get('readOnly'), 'the CDI dir'\n\
                  lib=cmd[cmd.index('--library')+1]\n\
                  assert v['host-lib']==m['host-lib']['mountPath']=='/var/lib/gpushim/lib' and lib==v['host-lib']+'/libgpushim.so', 'the library: the same path on the node and in the plugin'\n\
                  p=pod[0]['spec']\n\
                  assert 'runtimeClassName' not in p\n\
                  assert p['containers'][0]['resources']['limits']=={'gpushim.dev/gpu': 1}\n\
                  print(json.dumps(c['command']))\n";
    let out = Command::new(&python)
        .args(["-c", script])
        .arg(workspace_root().join("config/device-plugin.yaml"))
        .arg(workspace_root().join("config/pod-gpushim.yaml"))
        .output()
        .expect("python3");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let command: Vec<String> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(command[..2], ["/opt/gpushim/bin/gpushim", "device-plugin"]);
    // the same options, the library replaced by the one under test, no NVML: status 1 (not 2)
    let mut args: Vec<String> = command[1..].to_vec();
    if let Some(i) = args.iter().position(|a| a == "--library") {
        args[i + 1] = shim_path().display().to_string();
    }
    let out = Command::new(env!("CARGO_BIN_EXE_gpushim"))
        .args(&args)
        .env("GPUSHIM_NVML_PATH", "/nonexistent/libnvidia-ml.so.1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    assert!(err.contains("no NVIDIA driver"), "{err}");
}
