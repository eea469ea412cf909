//! `gpushim metrics [--listen ADDR:PORT] [--no-gpus]`: the figures of `gpushim ps` in the
//! Prometheus text exposition format (version 0.0.4), printed once (for node-exporter's
//! textfile collector) or served on `/metrics` over HTTP (`serve.rs`).
//!
//! The exposition is written here, not by the prometheus-client crate (checked again with
//! 0.23.1 for issue 27): that crate writes only OpenMetrics text, a `# EOF` line, a HELP text
//! with a period appended, and a counter's TYPE line naming the family without its `_total`
//! (`# TYPE gpushim_allocations_refused counter` above `gpushim_allocations_refused_total`),
//! which the 0.0.4 text format read by node-exporter's textfile collector, by `promtool check
//! metrics` and by users' scrapers takes as an untyped family of another name. The output is
//! checked by promtool and scraped by a real Prometheus in the tests (tests/metrics_http.rs).

use std::fmt::Write as _;

use crate::figures::{self, Figures};
use crate::Failure;

pub fn main(listen: Option<&str>, with_gpus: bool) -> Result<(), Failure> {
    match listen {
        None => {
            let f = figures::collect(with_gpus).map_err(|e| Failure::setup("metrics", e))?;
            print!("{}", exposition(&f));
            Ok(())
        }
        Some(addr) => serve(addr, with_gpus),
    }
}

fn serve(addr: &str, with_gpus: bool) -> Result<(), Failure> {
    let collect = std::sync::Arc::new(move || figures::collect(with_gpus).map(|f| exposition(&f)));
    let on_listening = |local: std::net::SocketAddr| eprintln!("gpushim metrics: serving http://{local}/metrics");
    match crate::serve::serve(addr, collect, on_listening) {
        Ok(signal) => {
            eprintln!("gpushim metrics: stopped by {signal}");
            Ok(())
        }
        Err(e) => Err(Failure::setup("metrics", e.to_string())),
    }
}

/// A label value, escaped as the format wants (`\\`, `\"`, `\n`).
fn esc(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    /// (labels, value as written).
    samples: Vec<(String, String)>,
}

impl Family {
    fn new(name: &'static str, kind: &'static str, help: &'static str) -> Family {
        Family { name, kind, help, samples: Vec::new() }
    }

    fn push(&mut self, labels: &str, v: u64) {
        self.samples.push((labels.to_string(), v.to_string()));
    }

    /// A value with fractions (Rust writes the shortest decimal that reads back as `v`, never
    /// an exponent: `0.3`, `1.5`, `12`).
    fn push_f64(&mut self, labels: &str, v: f64) {
        self.samples.push((labels.to_string(), format!("{v}")));
    }
}

/// The exposition of `f`.
pub fn exposition(f: &Figures) -> String {
    let mut used = Family::new("gpushim_memory_used_bytes", "gauge", "Device memory the process holds (its allocations), per device of its view.");
    let mut reserved = Family::new("gpushim_memory_reserved_bytes", "gauge", "Device memory taken from the driver for the process (allocations and its reserve's free blocks); what the limit bounds.");
    let mut peak = Family::new("gpushim_memory_peak_used_bytes", "gauge", "The most device memory the process held at once.");
    let mut peak_res = Family::new("gpushim_memory_peak_reserved_bytes", "gauge", "The most device memory reserved for the process at once.");
    let mut limit = Family::new("gpushim_memory_limit_bytes", "gauge", "The process' effective limit on the device (with a shared quota: the quota's budget).");
    let mut refused = Family::new("gpushim_allocations_refused_total", "counter", "Allocations the shim refused because of the limit.");
    let mut alive = Family::new("gpushim_process_alive", "gauge", "1 while the process runs; 0 for one that died without exiting (killed) until its entry is reclaimed.");
    let mut devices = Family::new("gpushim_process_devices", "gauge", "Devices in the process' view.");
    let mut q_used = Family::new("gpushim_quota_used_bytes", "gauge", "Device memory all processes of a shared quota hold on the device.");
    let mut q_peak = Family::new("gpushim_quota_peak_used_bytes", "gauge", "The most all processes of the shared quota held on the device at once.");
    let mut q_limit = Family::new("gpushim_quota_limit_bytes", "gauge", "The shared quota's budget on the device (the largest limit of a live member).");
    let mut c_limit = Family::new("gpushim_compute_limit_ratio", "gauge", "The process' compute limit on the device: the share of the device's time its GPU work may occupy (0..1; only for devices with a limit).");
    let mut c_busy = Family::new("gpushim_gpu_busy_seconds_total", "counter", "GPU time the process' work took on the device, as the shim measured it (with a compute limit).");
    let mut c_throttled = Family::new("gpushim_compute_throttled_seconds_total", "counter", "Time the process' launches waited for their compute share.");
    let mut c_launches = Family::new("gpushim_compute_launches_total", "counter", "Launches the shim measured for the compute share.");
    let mut waits = Family::new("gpushim_memory_waits_total", "counter", "Allocations that waited for room in a full shared budget (GPUSHIM_OOM_WAIT), whatever the outcome.");
    let mut waited = Family::new("gpushim_memory_wait_seconds_total", "counter", "Time allocations waited for room in a full shared budget (GPUSHIM_OOM_WAIT).");
    let mut g_total = Family::new("gpushim_gpu_memory_total_bytes", "gauge", "The GPU's memory (NVML).");
    let mut g_used = Family::new("gpushim_gpu_memory_used_bytes", "gauge", "The GPU's memory in use by all processes (NVML).");
    let mut users = std::collections::HashMap::new();
    let mut user = |uid: u32| users.entry(uid).or_insert_with(|| figures::user_name(uid)).clone();
    for p in &f.processes {
        let u = user(p.uid);
        let quota = esc(p.quota.as_deref().unwrap_or(""));
        let who = format!("pid=\"{}\",user=\"{}\",comm=\"{}\",quota=\"{quota}\"", p.pid, esc(&u), esc(&p.comm));
        alive.push(&who, p.alive as u64);
        if !p.alive {
            continue;
        }
        devices.push(&who, p.view_len as u64);
        for d in &p.devices {
            let part = d.part.as_ref().map_or(String::new(), |(i, n, _)| format!("{i}/{n}"));
            let l = format!("{who},device=\"{}\",gpu_uuid=\"{}\",part=\"{part}\"", d.ordinal, esc(&d.uuid));
            used.push(&l, d.in_use);
            reserved.push(&l, d.reserved);
            peak.push(&l, d.peak_in_use);
            peak_res.push(&l, d.peak_reserved);
            refused.push(&l, d.refused);
            c_busy.push_f64(&l, d.busy_ns as f64 / 1e9);
            c_throttled.push_f64(&l, d.throttled_ns as f64 / 1e9);
            c_launches.push(&l, d.launches);
            waits.push(&l, d.waits);
            waited.push_f64(&l, d.waited_ns as f64 / 1e9);
            if let Some(x) = d.compute_limit {
                c_limit.push_f64(&l, x);
            }
            if let Some(x) = d.limit {
                limit.push(&l, x);
            }
        }
    }
    for q in &f.quotas {
        let l = format!("quota=\"{}\",user=\"{}\",gpu_uuid=\"{}\"", esc(&q.quota), esc(&user(q.uid)), esc(&q.uuid));
        q_used.push(&l, q.held);
        q_peak.push(&l, q.peak);
        if q.limit > 0 {
            q_limit.push(&l, q.limit);
        }
    }
    for g in &f.gpus {
        let l = format!("gpu=\"{}\",gpu_uuid=\"{}\",name=\"{}\"", g.index, esc(&g.uuid), esc(&g.name));
        g_total.push(&l, g.total);
        g_used.push(&l, g.used);
    }
    let mut out = String::new();
    for fam in [used, reserved, peak, peak_res, limit, refused, c_limit, c_busy, c_throttled, c_launches, waits, waited, alive, devices, q_used, q_peak, q_limit, g_total, g_used] {
        let _ = writeln!(out, "# HELP {} {}", fam.name, fam.help);
        let _ = writeln!(out, "# TYPE {} {}", fam.name, fam.kind);
        for (labels, v) in fam.samples {
            let _ = writeln!(out, "{}{{{labels}}} {v}", fam.name);
        }
    }
    out
}
