//! `gpushim metrics --listen` over HTTP (issue 17): the exact figures on `/metrics`, for a plain
//! client and for a real Prometheus server.

mod common;
mod observe;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use observe::*;

/// `/metrics` over HTTP: the same exact figures; other paths 404.
#[test]
fn metrics_over_http() {
    let node = Node::new("http-basic");
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
    let node = Node::new("http-slow");
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
    let node = Node::new("http-prometheus");
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
