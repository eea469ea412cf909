//! What the observability tests share (tests/observability.rs, tests/metrics_http.rs): a
//! state directory with programs holding known amounts under the shim, the `gpushim` command
//! reading it, and a reader of the text exposition format.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

pub fn cli() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_gpushim"))
}

/// A fresh directory for one test: `state` is its GPUSHIM_STATE_DIR.
pub struct Node {
    pub dir: PathBuf,
    pub state: PathBuf,
}

impl Node {
    pub fn new(name: &str) -> Node {
        let dir = fresh_dir(name);
        Node { state: dir.join("state"), dir }
    }

    /// Starts the driver-API program under the shim on 2 simulated 16 GiB devices with `env`,
    /// running `ops` then sleeping; returns once the operations are done.
    pub fn start(&self, env: &[(&str, &str)], ops: &[&str]) -> Holder {
        self.start_as(None, env, ops)
    }

    /// As [`Node::start`], as user `uid` (when given) with its own `GPUSHIM_STATE_DIR` in `env`
    /// (or none: its default directory).
    pub fn start_as(&self, uid: Option<u32>, env: &[(&str, &str)], ops: &[&str]) -> Holder {
        self.start_program(&program(Program::Driver(DriverPath::Link)), uid, env, ops)
    }

    /// As [`Node::start_as`], running `exe` (the driver-API program, or a link to it whose
    /// name becomes the process' name).
    pub fn start_program(&self, exe: &Path, uid: Option<u32>, env: &[(&str, &str)], ops: &[&str]) -> Holder {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let ready = self.dir.join(format!("ready-{n}"));
        let mut cmd = Command::new(exe);
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
        start_until_ready(&mut cmd, &ready)
    }

    /// `gpushim ARGS…` reading this node's state directory.
    pub fn gpushim(&self, args: &[&str]) -> RunOutput {
        shim_path();
        nvml_sim_library();
        Run::new(cli()).args(args).env("GPUSIM_DEVICES", "2").env("GPUSIM_MEMORY", "16GiB").env("GPUSHIM_STATE_DIR", &self.state).run()
    }

    /// The published files, as `proc-PID` (their names end in `-NONCE`, checked here).
    pub fn published(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.state)
            .map(|rd| rd.flatten().filter_map(|e| e.file_name().to_str().filter(|n| n.starts_with("proc-")).map(without_nonce)).collect())
            .unwrap_or_default();
        v.sort();
        v
    }
}

/// A shim's default state directory outside the test's own (`/tmp/gpushim-UID`, for tests of
/// what the default is): when dropped, the test passed or not, what the test added there is
/// removed: the directory if it was not there before, else the entries that were not.
pub struct DefaultStateDir {
    pub dir: PathBuf,
    before: Option<std::collections::BTreeSet<std::ffi::OsString>>,
}

impl DefaultStateDir {
    pub fn of_user(uid: u32) -> DefaultStateDir {
        let dir = PathBuf::from(format!("/tmp/gpushim-{uid}"));
        let before = std::fs::read_dir(&dir).ok().map(|rd| rd.flatten().map(|e| e.file_name()).collect());
        DefaultStateDir { dir, before }
    }
}

impl Drop for DefaultStateDir {
    fn drop(&mut self) {
        match &self.before {
            None => {
                let _ = std::fs::remove_dir_all(&self.dir);
            }
            Some(before) => {
                for e in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
                    if !before.contains(&e.file_name()) {
                        let _ = std::fs::remove_file(e.path());
                    }
                }
            }
        }
    }
}

/// One sample of the exposition: metric name, labels, value.
#[derive(Debug, Clone)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parses the text exposition format (checking every line is a comment or a sample).
pub fn parse_exposition(text: &str) -> Vec<Sample> {
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
pub fn value(samples: &[Sample], name: &str, want: &[(&str, &str)]) -> f64 {
    let found: Vec<&Sample> = samples.iter().filter(|s| s.name == name && want.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))).collect();
    assert_eq!(found.len(), 1, "{name} {want:?}: {found:?}");
    found[0].value
}

pub fn count(samples: &[Sample], name: &str, want: &[(&str, &str)]) -> usize {
    samples.iter().filter(|s| s.name == name && want.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))).count()
}

/// Waits for `path` (a file a background command writes) to have content.
#[allow(dead_code)]
pub fn wait_for(path: &Path, what: &str) -> String {
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
pub struct Server {
    pub child: Child,
    /// (kept open: the server must not get SIGPIPE)
    pub stderr: std::io::BufReader<std::process::ChildStderr>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `gpushim metrics --listen 127.0.0.1:0` on `node`; returns it and the port it listens on.
pub fn serve_metrics(node: &Node) -> (Server, u16) {
    serve_metrics_with(node, &[])
}

/// As [`serve_metrics`], with more arguments (`--no-gpus`).
pub fn serve_metrics_with(node: &Node, more: &[&str]) -> (Server, u16) {
    use std::io::BufRead;
    shim_path();
    nvml_sim_library();
    let mut child = Command::new(cli())
        .args(["metrics", "--listen", "127.0.0.1:0"])
        .args(more)
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
pub fn http_get(port: u16, target: &str) -> (u16, String) {
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

impl Server {
    pub fn wrap(mut child: Child) -> Server {
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

/// `proc-PID-NONCE` as `proc-PID`, checking the nonce's form (8 hex digits).
pub fn without_nonce(name: &str) -> String {
    let (head, nonce) = name.rsplit_once('-').unwrap_or((name, ""));
    assert!(nonce.len() == 8 && nonce.bytes().all(|b| b.is_ascii_hexdigit()), "{name}: no nonce");
    head.to_string()
}

/// The file process `pid` published in `dir` (panics unless exactly one).
pub fn published_file(dir: &Path, pid: &str) -> PathBuf {
    let prefix = format!("proc-{pid}-");
    let found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.flatten().filter(|e| e.file_name().to_str().is_some_and(|n| n.starts_with(&prefix))).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert_eq!(found.len(), 1, "{prefix}* in {}: {found:?}", dir.display());
    found.into_iter().next().unwrap()
}

