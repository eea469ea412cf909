//! Observability (issue 17): the live figures each process under the shim publishes in the
//! state directory, and what `gpushim ps`, `gpushim metrics` (printed and over HTTP) and
//! `gpushim top` make of them, against test programs holding known amounts on the simulated
//! driver.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn cli() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_gpushim"))
}

/// A fresh directory for one test: `state` is its GPUSHIM_STATE_DIR.
struct Node {
    dir: PathBuf,
    state: PathBuf,
}

impl Node {
    fn new(name: &str) -> Node {
        let dir = fresh_dir(name);
        Node { state: dir.join("state"), dir }
    }

    /// Starts the driver-API program under the shim on 2 simulated 16 GiB devices with `env`,
    /// running `ops` then sleeping; returns once the operations are done.
    fn start(&self, env: &[(&str, &str)], ops: &[&str]) -> Holder {
        self.start_as(None, env, ops)
    }

    /// As [`Node::start`], as user `uid` (when given) with its own `GPUSHIM_STATE_DIR` in `env`
    /// (or none: its default directory).
    fn start_as(&self, uid: Option<u32>, env: &[(&str, &str)], ops: &[&str]) -> Holder {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let ready = self.dir.join(format!("ready-{n}"));
        let mut cmd = Command::new(program(Program::Driver(DriverPath::Link)));
        cmd.args(ops)
            .arg(format!("touch={}", ready.display()))
            .arg("sleep=60000")
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("LD_LIBRARY_PATH", sim_dir())
            .env("LD_PRELOAD", shim_path())
            .env("GPUSIM_DEVICES", "2")
            .env("GPUSIM_MEMORY", "16GiB")
            .env("GPUSHIM_STATE_DIR", &self.state)
            .current_dir("/");
        for (k, v) in env {
            cmd.env(k, v);
        }
        if let Some(uid) = uid {
            use std::os::unix::process::CommandExt;
            cmd.uid(uid).gid(uid);
            if !env.iter().any(|(k, _)| *k == "GPUSHIM_STATE_DIR") {
                cmd.env_remove("GPUSHIM_STATE_DIR");
            }
        }
        let child = Holder(cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("start the holder"));
        let deadline = Instant::now() + Duration::from_secs(20);
        while !ready.exists() {
            assert!(Instant::now() < deadline, "the holder never got ready");
            std::thread::sleep(Duration::from_millis(10));
        }
        child
    }

    /// `gpushim ARGS…` reading this node's state directory.
    fn gpushim(&self, args: &[&str]) -> RunOutput {
        shim_path();
        nvml_sim_library();
        Run::new(cli()).args(args).env("GPUSIM_DEVICES", "2").env("GPUSIM_MEMORY", "16GiB").env("GPUSHIM_STATE_DIR", &self.state).run()
    }

    /// The published files, as `proc-PID` (their names end in `-NONCE`, checked here).
    fn published(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.state)
            .map(|rd| rd.flatten().filter_map(|e| e.file_name().to_str().filter(|n| n.starts_with("proc-")).map(without_nonce)).collect())
            .unwrap_or_default();
        v.sort();
        v
    }
}

/// A program holding memory in the background; killed with SIGKILL when dropped.
struct Holder(Child);

impl Holder {
    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One sample of the exposition: metric name, labels, value.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses the text exposition format (checking every line is a comment or a sample).
fn parse_exposition(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with("# HELP ") || line.starts_with("# TYPE ") || line.is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("bad line {line:?}"));
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("bad value in {line:?}"));
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => (n, rest.strip_suffix('}').unwrap_or_else(|| panic!("bad labels in {line:?}"))),
            None => (series, ""),
        };
        assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'), "{line}");
        let mut map = BTreeMap::new();
        // (the test's label values hold no `",` sequence)
        for pair in labels.split("\",").filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once("=\"").unwrap_or_else(|| panic!("bad label {pair:?} in {line:?}"));
            map.insert(k.to_string(), v.trim_end_matches('"').to_string());
        }
        out.push(Sample { name: name.to_string(), labels: map, value });
    }
    out
}

/// The value of `name` whose labels include all of `want`; panics unless exactly one matches.
fn value(samples: &[Sample], name: &str, want: &[(&str, &str)]) -> f64 {
    let found: Vec<&Sample> = samples.iter().filter(|s| s.name == name && want.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))).collect();
    assert_eq!(found.len(), 1, "{name} {want:?}: {found:?}");
    found[0].value
}

fn count(samples: &[Sample], name: &str, want: &[(&str, &str)]) -> usize {
    samples.iter().filter(|s| s.name == name && want.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))).count()
}

/// Two programs under the shim: one with a 64 MiB limit holding 10 MiB on device 0 and 3 MiB
/// on device 1 after one refused request; one seeing only GPU 1, in a shared quota, holding
/// 5 MiB. `gpushim metrics` reports exactly that, `gpushim ps` too; a SIGKILLed program is
/// shown dead at once and its entry is removed by the next program; a clean exit removes it.
#[test]
fn metrics_and_ps_show_what_programs_hold() {
    let node = Node::new("obs-figures");
    let a = node.start(
        &[("GPUSHIM_MEMORY_LIMIT", "64MiB")],
        &["dev=0", &format!("alloc=mem:{}", 10 * MIB), "dev=1", &format!("alloc=mem:{}", 3 * MIB), &format!("alloc=mem:{}", 100 * MIB)],
    );
    let b = node.start(
        &[("GPUSHIM_MEMORY_LIMIT", "32MiB"), ("GPUSHIM_VISIBLE_DEVICES", "1"), ("GPUSHIM_SHARED_QUOTA", "team")],
        &[&format!("alloc=mem:{}", 5 * MIB)],
    );
    let (pa, pb) = (a.pid().to_string(), b.pid().to_string());
    assert_eq!(node.published(), {
        let mut v = vec![format!("proc-{pa}"), format!("proc-{pb}")];
        v.sort();
        v
    });
    // private to the user
    {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(published_file(&node.state, &pa)).unwrap();
        assert_eq!(m.mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(&node.state).unwrap().mode() & 0o777, 0o700);
    }

    let out = node.gpushim(&["metrics"]);
    assert!(out.status.success(), "{}", out.dump());
    let text = out.stdout_text();
    let s = parse_exposition(&text);
    let (g0, g1) = (phys_uuid(0), phys_uuid(1));
    let at = |pid: &str, dev: &str| vec![("pid", pid.to_string()), ("device", dev.to_string())];
    let v = |name: &str, l: Vec<(&str, String)>| {
        let l: Vec<(&str, &str)> = l.iter().map(|(k, v)| (*k, v.as_str())).collect();
        value(&s, name, &l)
    };
    assert_eq!(v("gpushim_memory_used_bytes", at(&pa, "0")), (10 * MIB) as f64, "{text}");
    assert_eq!(v("gpushim_memory_used_bytes", at(&pa, "1")), (3 * MIB) as f64, "{text}");
    assert_eq!(v("gpushim_memory_peak_used_bytes", at(&pa, "1")), (3 * MIB) as f64, "{text}");
    assert_eq!(v("gpushim_memory_limit_bytes", at(&pa, "0")), (64 * MIB) as f64, "{text}");
    assert_eq!(v("gpushim_allocations_refused_total", at(&pa, "1")), 1.0, "{text}");
    assert_eq!(v("gpushim_allocations_refused_total", at(&pa, "0")), 0.0, "{text}");
    assert_eq!(value(&s, "gpushim_memory_used_bytes", &[("pid", &pa), ("device", "0"), ("gpu_uuid", &g0), ("quota", ""), ("user", "root")]), (10 * MIB) as f64);
    assert_eq!(value(&s, "gpushim_memory_used_bytes", &[("pid", &pa), ("device", "1"), ("gpu_uuid", &g1)]), (3 * MIB) as f64);
    // b sees GPU 1 as its device 0, in quota "team"
    assert_eq!(value(&s, "gpushim_memory_used_bytes", &[("pid", &pb), ("device", "0"), ("gpu_uuid", &g1), ("quota", "team")]), (5 * MIB) as f64, "{text}");
    assert_eq!(count(&s, "gpushim_memory_used_bytes", &[("pid", &pb)]), 1, "{text}");
    assert_eq!(value(&s, "gpushim_quota_used_bytes", &[("quota", "team"), ("gpu_uuid", &g1)]), (5 * MIB) as f64, "{text}");
    assert_eq!(value(&s, "gpushim_quota_limit_bytes", &[("quota", "team"), ("gpu_uuid", &g1)]), (32 * MIB) as f64, "{text}");
    assert_eq!(value(&s, "gpushim_process_alive", &[("pid", &pa)]), 1.0);
    assert_eq!(value(&s, "gpushim_process_devices", &[("pid", &pa)]), 2.0);
    // the physical GPUs, from NVML
    assert_eq!(value(&s, "gpushim_gpu_memory_total_bytes", &[("gpu_uuid", &g0)]), (16 * GIB) as f64, "{text}");
    assert!(text.contains("# TYPE gpushim_allocations_refused_total counter"));

    let ps = node.gpushim(&["ps"]);
    assert!(ps.status.success(), "{}", ps.dump());
    let pst = ps.stdout_text();
    assert!(pst.contains("processes under gpushim ("), "{pst}");
    assert!(pst.contains(&format!("pid {pa} drvapi-link")), "{pst}");
    assert!(pst.contains(&format!("device 1 {g1}: 3 MiB in use (peak 3 MiB), 3 MiB reserved, limit 64 MiB, 1 refused")), "{pst}");
    assert!(pst.contains(&format!("pid {pb} drvapi-link (root, shared quota team): 1 devices")), "{pst}");

    // killed: dead at once, its figures gone from the metrics; the next program reclaims it
    drop(a);
    let s = parse_exposition(&node.gpushim(&["metrics", "--no-gpus"]).stdout_text());
    assert_eq!(value(&s, "gpushim_process_alive", &[("pid", &pa)]), 0.0);
    assert_eq!(count(&s, "gpushim_memory_used_bytes", &[("pid", &pa)]), 0);
    assert_eq!(count(&s, "gpushim_gpu_memory_total_bytes", &[]), 0, "--no-gpus");
    let ps = node.gpushim(&["ps"]).stdout_text();
    assert!(ps.contains(&format!("pid {pa} drvapi-link (root): 2 devices (exited without leaving")), "{ps}");
    // a program that runs to its end: its entry is gone when it is; it removed the dead one
    let done = Run::program(Program::Driver(DriverPath::Link))
        .shim(true)
        .args([format!("alloc=mem:{MIB}")])
        .env("GPUSIM_DEVICES", "2")
        .env("GPUSHIM_STATE_DIR", &node.state)
        .run();
    done.assert_completed();
    assert_eq!(node.published(), vec![format!("proc-{pb}")]);
    drop(b);
}

/// Split GPUs: each part is published with its GPU's UUID and its place (`part="2/2"`).
#[test]
fn split_parts_are_labelled() {
    let node = Node::new("obs-split");
    let h = node.start(&[("GPUSHIM_VIRTUAL_DEVICES", "0:2x4GiB")], &["dev=1", &format!("alloc=mem:{}", 7 * MIB)]);
    let s = parse_exposition(&node.gpushim(&["metrics", "--no-gpus"]).stdout_text());
    let pid = h.pid().to_string();
    let g0 = phys_uuid(0);
    assert_eq!(value(&s, "gpushim_memory_used_bytes", &[("pid", &pid), ("device", "1"), ("gpu_uuid", &g0), ("part", "2/2")]), (7 * MIB) as f64);
    assert_eq!(value(&s, "gpushim_memory_limit_bytes", &[("pid", &pid), ("device", "1")]), (4 * GIB) as f64);
    assert_eq!(value(&s, "gpushim_memory_used_bytes", &[("pid", &pid), ("device", "0"), ("part", "1/2")]), 0.0);
    assert_eq!(value(&s, "gpushim_memory_used_bytes", &[("pid", &pid), ("device", "2"), ("gpu_uuid", &phys_uuid(1)), ("part", "")]), 0.0);
}

/// A program that never touches CUDA publishes nothing (no state directory is made).
#[test]
fn nothing_without_cuda() {
    let node = Node::new("obs-nocuda");
    let out = Run::new("/bin/true").shim(true).env("GPUSHIM_STATE_DIR", &node.state).env("GPUSHIM_MEMORY_LIMIT", "1GiB").run();
    assert!(out.status.success());
    assert!(!node.state.exists());
}

/// Waits for `path` (a file a background command writes) to have content.
#[allow(dead_code)]
fn wait_for(path: &Path, what: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(t) = std::fs::read_to_string(path) {
            if !t.is_empty() {
                return t;
            }
        }
        assert!(Instant::now() < deadline, "{what}: nothing in {}", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A background command killed with SIGKILL when dropped; its stderr is read line by line.
struct Server {
    child: Child,
    #[allow(dead_code)] // (kept open: the server must not get SIGPIPE)
    stderr: std::io::BufReader<std::process::ChildStderr>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `gpushim metrics --listen 127.0.0.1:0` on `node`; returns it and the port it listens on.
fn serve_metrics(node: &Node) -> (Server, u16) {
    use std::io::BufRead;
    shim_path();
    nvml_sim_library();
    let mut child = Command::new(cli())
        .args(["metrics", "--listen", "127.0.0.1:0"])
        .env("GPUSHIM_STATE_DIR", &node.state)
        .env("LD_LIBRARY_PATH", sim_dir())
        .env("GPUSIM_DEVICES", "2")
        .env("GPUSIM_MEMORY", "16GiB")
        .env_remove("LD_PRELOAD")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start gpushim metrics --listen");
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    let port = line
        .trim()
        .strip_prefix("gpushim metrics: serving http://127.0.0.1:")
        .and_then(|r| r.strip_suffix("/metrics"))
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
    (Server { child, stderr }, port)
}

/// A plain HTTP/1.0 GET: (status code, body).
fn http_get(port: u16, target: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(s, "GET {target} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
    let code = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, body.to_string())
}

/// `/metrics` over HTTP: the same exact figures; other paths 404.
#[test]
fn metrics_over_http() {
    let node = Node::new("obs-http");
    let h = node.start(&[("GPUSHIM_MEMORY_LIMIT", "1GiB")], &[&format!("alloc=mem:{}", 12 * MIB)]);
    let (_server, port) = serve_metrics(&node);
    let (code, body) = http_get(port, "/metrics");
    assert_eq!(code, 200, "{body}");
    let s = parse_exposition(&body);
    let pid = h.pid().to_string();
    assert_eq!(value(&s, "gpushim_memory_used_bytes", &[("pid", &pid), ("device", "0"), ("gpu_uuid", &phys_uuid(0))]), (12 * MIB) as f64);
    assert_eq!(value(&s, "gpushim_memory_limit_bytes", &[("pid", &pid), ("device", "0")]), GIB as f64);
    assert_eq!(http_get(port, "/nothing").0, 404);
    // a second scrape sees a change at once: the program is gone
    drop(h);
    let s = parse_exposition(&http_get(port, "/metrics").1);
    assert_eq!(value(&s, "gpushim_process_alive", &[("pid", &pid)]), 0.0);
}

/// A client trickling its request a byte a second holds the one-at-a-time server for at most
/// 5 s: a scrape behind it is answered (before, each byte renewed a 5 s timeout, up to 16 KiB).
#[test]
fn a_slow_client_cannot_hold_the_metrics_endpoint() {
    use std::io::Write;
    let node = Node::new("obs-slow");
    let (_server, port) = serve_metrics(&node);
    let mut slow = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let trickle = std::thread::spawn(move || {
        for _ in 0..15 {
            if slow.write_all(b"G").is_err() {
                return;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    });
    std::thread::sleep(Duration::from_millis(300)); // the slow client is being served
    let start = Instant::now();
    let (code, _) = http_get(port, "/metrics");
    let waited = start.elapsed();
    assert_eq!(code, 200);
    assert!(waited < Duration::from_secs(9), "the scrape waited {waited:?} behind the slow client");
    trickle.join().unwrap();
}

fn prometheus_binary() -> PathBuf {
    let p = workspace_root().join(".deps/prometheus/bin/prometheus");
    assert!(p.is_file(), "{}: run `bash scripts/fetch-prometheus.sh`", p.display());
    p
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn urlencode(s: &str) -> String {
    s.bytes().map(|b| if b.is_ascii_alphanumeric() || b"_-.".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") }).collect()
}

/// A real Prometheus server (Debian's package, `scripts/fetch-prometheus.sh`) scrapes
/// `gpushim metrics --listen` every second; its query API returns exactly what the programs
/// hold, and sees a killed program as dead.
#[test]
fn prometheus_scrapes_the_endpoint() {
    let started = Instant::now();
    let prom = prometheus_binary();
    let node = Node::new("obs-prometheus");
    let a = node.start(&[("GPUSHIM_MEMORY_LIMIT", "256MiB")], &["dev=1", &format!("alloc=mem:{}", 24 * MIB), &format!("alloc=mem:{}", 300 * MIB)]);
    let b = node.start(&[("GPUSHIM_MEMORY_LIMIT", "64MiB"), ("GPUSHIM_SHARED_QUOTA", "job")], &[&format!("alloc=mem:{}", 6 * MIB)]);
    let (_server, port) = serve_metrics(&node);
    let pport = free_port();
    let config = node.dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: gpushim\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"),
    )
    .unwrap();
    let log = std::fs::File::create(node.dir.join("prometheus.log")).unwrap();
    let _prometheus = Server::wrap(
        Command::new(prom)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", node.dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{pport}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start prometheus"),
    );
    let query = |q: &str| -> Vec<(BTreeMap<String, String>, String)> {
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", pport)) else { return vec![] };
        use std::io::{Read, Write};
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = write!(s, "GET /api/v1/query?query={} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", urlencode(q));
        let mut resp = String::new();
        let _ = s.read_to_string(&mut resp);
        let Some((_, body)) = resp.split_once("\r\n\r\n") else { return vec![] };
        let Ok(j) = serde_json::from_str::<serde_json::Value>(body) else { return vec![] };
        j["data"]["result"]
            .as_array()
            .map(|r| {
                r.iter()
                    .map(|x| {
                        let labels = x["metric"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string())).collect();
                        (labels, x["value"][1].as_str().unwrap().to_string())
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let wait = |q: &str, want: &str| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let r = query(q);
            if r.len() == 1 && r[0].1 == want {
                return r[0].0.clone();
            }
            assert!(Instant::now() < deadline, "prometheus: {q} never gave {want}: {r:?}\n{}", std::fs::read_to_string(node.dir.join("prometheus.log")).unwrap_or_default());
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let (pa, pb) = (a.pid().to_string(), b.pid().to_string());
    let labels = wait(&format!("gpushim_memory_used_bytes{{pid=\"{pa}\",device=\"1\"}}"), &(24 * MIB).to_string());
    let first = started.elapsed();
    assert_eq!(labels.get("gpu_uuid"), Some(&phys_uuid(1)));
    assert_eq!(labels.get("job").map(String::as_str), Some("gpushim"));
    assert_eq!(labels.get("user").map(String::as_str), Some("root"));
    wait(&format!("gpushim_allocations_refused_total{{pid=\"{pa}\",device=\"1\"}}"), "1");
    wait(&format!("gpushim_memory_limit_bytes{{pid=\"{pa}\",device=\"1\"}}"), &(256 * MIB).to_string());
    wait(&format!("gpushim_memory_used_bytes{{pid=\"{pb}\",quota=\"job\",device=\"0\"}}"), &(6 * MIB).to_string());
    wait(&format!("gpushim_quota_used_bytes{{quota=\"job\",gpu_uuid=\"{}\"}}", phys_uuid(0)), &(6 * MIB).to_string());
    // an alert-style expression: the program near its limit
    wait("count(gpushim_memory_used_bytes / gpushim_memory_limit_bytes > 0.05)", "2");
    drop(a);
    wait(&format!("gpushim_process_alive{{pid=\"{pa}\"}}"), "0");
    eprintln!("prometheus: first figures after {first:?}, all checks after {:?}", started.elapsed());
}

impl Server {
    fn wrap(mut child: Child) -> Server {
        let stderr = child.stderr.take();
        match stderr {
            Some(e) => Server { child, stderr: std::io::BufReader::new(e) },
            None => {
                // (no pipe: a reader over an empty pipe of our own)
                let mut empty = Command::new("true").stderr(Stdio::piped()).spawn().unwrap();
                let e = empty.stderr.take().unwrap();
                let _ = empty.wait();
                Server { child, stderr: std::io::BufReader::new(e) }
            }
        }
    }
}

/// `gpushim top` in a real terminal (tmux): the program's row with its figures under its GPU,
/// `s` changes the order, `q` quits; not on a terminal it prints the `ps` snapshot.
#[test]
fn top_in_a_terminal() {
    let node = Node::new("obs-top");
    let a = node.start(&[("GPUSHIM_MEMORY_LIMIT", "64MiB")], &["dev=1", &format!("alloc=mem:{}", 32 * MIB)]);
    let b = node.start(&[("GPUSHIM_MEMORY_LIMIT", "64MiB"), ("GPUSHIM_SHARED_QUOTA", "tq")], &[&format!("alloc=mem:{}", 8 * MIB), &format!("alloc=mem:{}", 90 * MIB)]);
    shim_path();
    nvml_sim_library();
    let socket = format!("gpushim-obs-{}", std::process::id());
    let tmux = |args: &[&str]| Command::new("tmux").arg("-L").arg(&socket).args(args).output().expect("tmux");
    let cmd = format!(
        "env -u LD_PRELOAD GPUSHIM_STATE_DIR={} LD_LIBRARY_PATH={} GPUSIM_DEVICES=2 GPUSIM_MEMORY=16GiB {} top --interval 0.3",
        node.state.display(),
        sim_dir().display(),
        cli().display()
    );
    struct Kill(Box<dyn Fn()>);
    impl Drop for Kill {
        fn drop(&mut self) {
            (self.0)()
        }
    }
    let s2 = socket.clone();
    let _cleanup = Kill(Box::new(move || {
        let _ = Command::new("tmux").args(["-L", &s2, "kill-server"]).output();
    }));
    let o = tmux(&["new-session", "-d", "-s", "top", "-x", "200", "-y", "40", &cmd]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let capture = || String::from_utf8_lossy(&tmux(&["capture-pane", "-p", "-t", "top"]).stdout).into_owned();
    let wait_screen = |what: &dyn Fn(&str) -> bool, why: &str| -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let screen = capture();
            if what(&screen) {
                return screen;
            }
            assert!(Instant::now() < deadline, "{why}:\n{screen}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let (pa, pb) = (a.pid().to_string(), b.pid().to_string());
    let screen = wait_screen(&|s: &str| s.contains(&pa) && s.contains(&pb) && s.contains("order: memory in use"), "top never showed both programs");
    // GPU 1 (NVML) with a's row: half of its limit
    assert!(screen.contains(&format!("GPU 1 gpusim device 1 {}: ", phys_uuid(1))), "{screen}");
    let row_a = screen.lines().find(|l| l.trim_start().starts_with(&format!("{pa} ")) && l.contains("32 MiB")).unwrap_or_else(|| panic!("{screen}"));
    assert!(row_a.contains("[##########..........]") && row_a.contains("32 MiB") && row_a.contains("64 MiB"), "{row_a}");
    let row_b = screen.lines().find(|l| l.trim_start().starts_with(&format!("{pb} ")) && l.contains("8 MiB")).unwrap_or_else(|| panic!("{screen}"));
    assert!(row_b.contains(" 1 tq"), "refusals and quota: {row_b}");
    assert!(screen.contains("tq (root)"), "{screen}");
    tmux(&["send-keys", "-t", "top", "s"]);
    wait_screen(&|s: &str| s.contains("order: pid"), "s did not change the order");
    tmux(&["send-keys", "-t", "top", "s"]);
    wait_screen(&|s: &str| s.contains("order: refusals"), "s did not change the order again");
    // a program killed: shown as exited
    drop(a);
    wait_screen(&|s: &str| s.contains(&format!("pid {pa} drvapi-link (root): exited")), "the killed program was not shown as exited");
    tmux(&["send-keys", "-t", "top", "q"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while tmux(&["has-session", "-t", "top"]).status.success() {
        assert!(Instant::now() < deadline, "q did not quit:\n{}", capture());
        std::thread::sleep(Duration::from_millis(50));
    }
    // not on a terminal: the snapshot
    let snap = node.gpushim(&["top"]);
    assert!(snap.status.success(), "{}", snap.dump());
    assert!(snap.stdout_text().contains(&format!("pid {pb} drvapi-link (root, shared quota tq)")), "{}", snap.dump());
    drop(b);
}

/// Only the user's own processes are shown, unless run as root; another user can read nothing.
/// Needs root (to run processes as other users).
#[test]
fn other_users_see_nothing() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("other_users_see_nothing: skipped (needs root)");
        return;
    }
    const NOBODY: u32 = 65534;
    const OTHER: u32 = 65533;
    use std::os::unix::fs::PermissionsExt;
    let node = Node::new("obs-users");
    // everything the other users run must be reachable to them
    let make_reachable = |p: &Path| {
        let mut d = Some(p);
        while let Some(dir) = d {
            if let Ok(m) = std::fs::metadata(dir) {
                if m.is_dir() && m.permissions().mode() & 0o001 == 0 {
                    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(m.permissions().mode() | 0o011));
                }
            }
            d = dir.parent();
        }
    };
    for p in [node.dir.clone(), sim_dir(), program(Program::Driver(DriverPath::Link)), shim_path(), cli()] {
        make_reachable(&p);
    }
    std::fs::set_permissions(&node.dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let theirs = node.dir.join("their-state");
    let theirs_s = theirs.display().to_string();
    let h = node.start_as(Some(NOBODY), &[("GPUSHIM_MEMORY_LIMIT", "1GiB"), ("GPUSHIM_STATE_DIR", &theirs_s)], &[&format!("alloc=mem:{}", 9 * MIB)]);
    let pid = h.pid().to_string();
    let file = published_file(&theirs, &pid);
    {
        use std::os::unix::fs::MetadataExt;
        let (d, f) = (std::fs::metadata(&theirs).unwrap(), std::fs::metadata(&file).unwrap());
        assert_eq!((d.uid(), d.mode() & 0o777, f.uid(), f.mode() & 0o777), (NOBODY, 0o700, NOBODY, 0o600));
    }
    let metrics_as = |uid: Option<u32>, dir: Option<&Path>| {
        use std::os::unix::process::CommandExt;
        let mut c = Command::new(cli());
        c.args(["metrics", "--no-gpus"]).env_remove("GPUSHIM_STATE_DIR").env_remove("XDG_RUNTIME_DIR").env_remove("GPUSHIM_CONFIG").current_dir("/");
        if let Some(d) = dir {
            c.env("GPUSHIM_STATE_DIR", d);
        }
        if let Some(u) = uid {
            c.uid(u).gid(u);
        }
        let out = c.output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    // the owner sees it; root sees it, labelled with the owner's name
    let (ok, text, err) = metrics_as(Some(NOBODY), Some(&theirs));
    assert!(ok, "{err}");
    let s = parse_exposition(&text);
    assert_eq!(value(&s, "gpushim_memory_used_bytes", &[("pid", &pid), ("user", "nobody"), ("device", "0")]), (9 * MIB) as f64, "{text}");
    let (ok, text, _) = metrics_as(None, Some(&theirs));
    assert!(ok);
    assert_eq!(value(&parse_exposition(&text), "gpushim_memory_used_bytes", &[("pid", &pid), ("user", "nobody"), ("device", "0")]), (9 * MIB) as f64);
    // another user: refused the directory, shown nothing, cannot open the file
    let (ok, text, err) = metrics_as(Some(OTHER), Some(&theirs));
    assert!(!ok && !text.contains(&pid), "{text}{err}");
    assert!(err.contains("is not a private directory of this user"), "{err}");
    let peek = Run::new("/bin/cat").arg(&file).without_sim().as_user(OTHER).run();
    assert!(!peek.status.success() && peek.stderr_text().contains("Permission denied"), "{}", peek.dump());
    // root without a configured directory reads every user's default one: a process of
    // nobody's in /tmp/gpushim-65534 is listed
    let d = node.start_as(Some(NOBODY), &[("GPUSHIM_MEMORY_LIMIT", "1GiB")], &[&format!("alloc=mem:{}", 5 * MIB)]);
    let dpid = d.pid().to_string();
    let (ok, text, err) = metrics_as(None, None);
    assert!(ok, "{err}");
    assert_eq!(value(&parse_exposition(&text), "gpushim_memory_used_bytes", &[("pid", &dpid), ("user", "nobody"), ("device", "0")]), (5 * MIB) as f64, "{text}");
    // ... which that user's own listing shows too, but another user's does not
    let (_, text, _) = metrics_as(Some(NOBODY), None);
    assert!(text.contains(&format!("pid=\"{dpid}\"")), "{text}");
    let (_, text, _) = metrics_as(Some(OTHER), None);
    assert!(!text.contains(&format!("pid=\"{dpid}\"")) && !text.contains(&format!("pid=\"{pid}\"")), "{text}");
    drop(d);
    let _ = std::fs::remove_file(published_file(Path::new(&format!("/tmp/gpushim-{NOBODY}")), &dpid));
    drop(h);
}

/// A forked child that uses CUDA does not change its parent's published figures, and does not
/// keep the parent alive in them: killed, the parent is dead at once while the child lives.
#[test]
fn forked_child_leaves_the_parent_figures_alone() {
    use std::os::unix::process::CommandExt;
    let node = Node::new("obs-fork");
    let ready = node.dir.join("ready");
    let mut cmd = Command::new(program(Program::ForkQuota));
    cmd.args(["linger", &(10 * MIB).to_string(), &(3 * MIB).to_string(), &ready.display().to_string()])
        .env_clear()
        .env("LD_LIBRARY_PATH", sim_dir())
        .env("LD_PRELOAD", shim_path())
        .env("GPUSIM_DEVICES", "1")
        .env("GPUSHIM_MEMORY_LIMIT", "1GiB")
        .env("GPUSHIM_STATE_DIR", &node.state)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let parent = Holder(cmd.spawn().unwrap());
    let pgid = parent.pid() as i32;
    struct Group(i32);
    impl Drop for Group {
        fn drop(&mut self) {
            // SAFETY: signalling the test's own process group.
            unsafe { libc::kill(-self.0, libc::SIGKILL) };
        }
    }
    let _group = Group(pgid);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ready.exists() {
        assert!(Instant::now() < deadline, "the program never got ready");
        std::thread::sleep(Duration::from_millis(10));
    }
    let pid = parent.pid().to_string();
    assert_eq!(node.published(), vec![format!("proc-{pid}")], "the child publishes nothing");
    let s = parse_exposition(&node.gpushim(&["metrics", "--no-gpus"]).stdout_text());
    assert_eq!(value(&s, "gpushim_memory_used_bytes", &[("pid", &pid), ("device", "0")]), (10 * MIB) as f64, "the child's 3 MiB are not the parent's");
    assert_eq!(value(&s, "gpushim_process_alive", &[("pid", &pid)]), 1.0);
    // SAFETY: killing the test's own child.
    unsafe { libc::kill(parent.pid() as i32, libc::SIGKILL) };
    std::thread::sleep(Duration::from_millis(100));
    let s = parse_exposition(&node.gpushim(&["metrics", "--no-gpus"]).stdout_text());
    assert_eq!(value(&s, "gpushim_process_alive", &[("pid", &pid)]), 0.0, "the child (still running) does not keep the parent alive");
}

/// The command lines: help pages, mistakes.
#[test]
fn command_lines() {
    let node = Node::new("obs-cli");
    for (args, code, needle) in [
        (&["help", "metrics"][..], 0, "gpushim_allocations_refused_total"),
        (&["help", "top"][..], 0, "s changes the"),
        (&["metrics", "--help"][..], 0, "--listen ADDR:PORT"),
        (&["metrics", "--bogus"][..], 2, "unexpected argument \"--bogus\""),
        (&["metrics", "--listen"][..], 2, "--listen needs an address"),
        (&["top", "--interval", "0"][..], 2, "--interval needs seconds"),
        (&["metrics", "--listen", "256.0.0.1:1"][..], 1, "cannot listen on 256.0.0.1:1"),
        (&["topp"][..], 2, "did you mean gpushim top?"),
    ] {
        let out = node.gpushim(args);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {}", out.dump());
        let all = out.stdout_text() + &out.stderr_text();
        assert!(all.contains(needle), "{args:?}: {all}");
    }
    // nothing under the shim yet: an empty exposition with its HELP/TYPE lines, an empty ps
    let out = node.gpushim(&["metrics", "--no-gpus"]);
    assert!(out.status.success() && out.stdout_text().contains("# TYPE gpushim_memory_used_bytes gauge"), "{}", out.dump());
    assert!(parse_exposition(&out.stdout_text()).is_empty());
}

/// A process with no limit at all is listed with what it holds; its limit is the device's
/// memory.
#[test]
fn a_process_without_limits_is_listed() {
    let node = Node::new("obs-nolimit");
    let h = node.start(&[], &[&format!("alloc=mem:{}", 4 * MIB)]);
    let pid = h.pid().to_string();
    let s = parse_exposition(&node.gpushim(&["metrics", "--no-gpus"]).stdout_text());
    assert_eq!(value(&s, "gpushim_process_alive", &[("pid", &pid)]), 1.0);
    assert_eq!(value(&s, "gpushim_process_devices", &[("pid", &pid)]), 2.0);
    assert_eq!(value(&s, "gpushim_memory_used_bytes", &[("pid", &pid), ("device", "0"), ("gpu_uuid", &phys_uuid(0))]), (4 * MIB) as f64);
    assert_eq!(value(&s, "gpushim_memory_limit_bytes", &[("pid", &pid), ("device", "0")]), (16 * GIB) as f64);
    assert_eq!(count(&s, "gpushim_memory_limit_bytes", &[("pid", &pid), ("device", "1")]), 0, "device 1 never used: not resolved yet");
}

/// `proc-PID-NONCE` as `proc-PID`, checking the nonce's form (8 hex digits).
fn without_nonce(name: &str) -> String {
    let (head, nonce) = name.rsplit_once('-').unwrap_or((name, ""));
    assert!(nonce.len() == 8 && nonce.bytes().all(|b| b.is_ascii_hexdigit()), "{name}: no nonce");
    head.to_string()
}

/// The file process `pid` published in `dir` (panics unless exactly one).
fn published_file(dir: &Path, pid: &str) -> PathBuf {
    let prefix = format!("proc-{pid}-");
    let found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.flatten().filter(|e| e.file_name().to_str().is_some_and(|n| n.starts_with(&prefix))).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert_eq!(found.len(), 1, "{prefix}* in {}: {found:?}", dir.display());
    found.into_iter().next().unwrap()
}
