//! The exit report (`GPUSHIM_REPORT`): per device the program used, the peak in use, the peak
//! reserved, the allocations refused and the limit — JSON for a `.json` path, text on stderr.

mod common;

use common::*;

const MIB: u64 = 1 << 20;

fn run(report: &str) -> RunOutput {
    let out = Run::program(Program::Driver(DriverPath::Gpa))
        .env("GPUSIM_DEVICES", "2")
        .env("GPUSIM_MEMORY", "16GiB")
        .env("GPUSHIM_MEMORY_LIMIT", "1GiB")
        .env("GPUSHIM_REPORT", report)
        .args(["alloc=mem:536870912", "alloc=mem:805306368", "free=1", "alloc=mem:268435456"])
        .shim(true)
        .run();
    out.assert_completed();
    assert_eq!(out.num("op1.rc"), 0, "{}", out.dump());
    assert_eq!(out.num("op2.rc"), 2, "{}", out.dump());
    assert_eq!(out.num("op3.rc"), 0, "{}", out.dump());
    assert_eq!(out.num("op4.rc"), 0, "{}", out.dump());
    out
}

#[test]
fn json_report_at_exit() {
    let path = scratch_path("report.json");
    let out = run(path.to_str().unwrap());
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("no report at {}: {e}\n{}", path.display(), out.dump()));
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("bad JSON {text}: {e}"));
    let devices = v["devices"].as_array().expect("devices");
    assert_eq!(devices.len(), 1, "only the device the program used: {text}");
    let d = &devices[0];
    assert_eq!(d["ordinal"], 0, "{text}");
    assert_eq!(d["peak_in_use"], 512 * MIB, "{text}");
    assert_eq!(d["peak_reserved"], 512 * MIB, "{text}");
    assert_eq!(d["refused"], 1, "{text}");
    assert_eq!(d["limit"], 1024 * MIB, "{text}");
    assert!(v["pid"].as_u64().is_some_and(|p| p > 0), "{text}");
}

#[test]
fn text_report_on_stderr() {
    let out = run("stderr");
    let err = out.stderr_text();
    assert!(err.contains("gpushim report (pid "), "{}", out.dump());
    assert!(
        err.contains(&format!(
            "  device 0: peak in use {} bytes, peak reserved {} bytes, 1 allocations refused, limit {} bytes",
            512 * MIB,
            512 * MIB,
            1024 * MIB
        )),
        "{}",
        out.dump()
    );
}
