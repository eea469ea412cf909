//! The simulator's settings, read from the environment once: by the load-time constructor
//! (`lib.rs`), or at first use. Parsing, defaults and warnings are `gpusim_common::config`'s
//! (the same for `sim/nvml`); what is the driver's own: warnings start with `gpusim:`, and the
//! report variable is `GPUSIM_REPORT` (the report is `stats::report_json`).
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `GPUSIM_DEVICES` | physical device count, 1..=16 | 2 |
//! | `GPUSIM_MEMORY` | per-device total memory, comma list (one value = all devices; a shorter list repeats its last value) | `16GiB` |
//! | `GPUSIM_DRIVER_VERSION` | what `cuDriverGetVersion` returns | 13050 |
//! | `GPUSIM_REPORT` | path of the JSON report written at exit | unset |
//! | `GPUSIM_TRACE` | `1`: one stderr line per driver call | unset |
//! | `GPUSIM_NODE_STATE` | path of the node-wide shared device state (read by `node`, at first use) | unset |
//! | `GPUSIM_KERNEL_NS` | duration of every kernel not named `gpusim_busy*`, ns, capped at 60 s (read by `timeline`, at first use) | 0 |
//! | `GPUSIM_QUEUE_DEPTH` | uncompleted operations a stream holds before a launch blocks (read by `timeline`, at first use) | 1024 |
//! | `GPUSIM_TEARDOWN_DELAY_MS` | pause, in a context teardown, between releasing each allocation's addresses and uncounting its memory (read by `memory`, at first use) | unset |
//!
//! An invalid value prints one warning to stderr and the default is used.

gpusim_common::settings!(prefix "gpusim", report "GPUSIM_REPORT", json crate::stats::report_json);

#[cfg(test)]
#[test]
fn reads_gpusim_report() {
    let c = from_env(|k| (k == "GPUSIM_REPORT").then(|| "/tmp/cuda.json".to_string()));
    assert_eq!(c.report.as_deref(), Some("/tmp/cuda.json"));
    assert!(from_env(|k| (k == "GPUSIM_NVML_REPORT").then(String::new))
        .report
        .is_none());
}
