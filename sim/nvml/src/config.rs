//! The library's settings, read from the environment once: by the load-time constructor
//! (`lib.rs`), or at first use. Parsing, defaults and warnings are `gpusim_common::config`'s,
//! the same as the simulated driver's (`sim/cuda`), so both describe the same devices; what is
//! NVML's own: warnings start with `gpusim-nvml:`, and the report variable is
//! `GPUSIM_NVML_REPORT` (the report is `registry::report_json`).
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `GPUSIM_DEVICES` | physical device count, 1..=16 | 2 |
//! | `GPUSIM_MEMORY` | per-device total memory, comma list (one value = all devices; a shorter list repeats its last value) | `16GiB` |
//! | `GPUSIM_DRIVER_VERSION` | what `nvmlSystemGetCudaDriverVersion[_v2]` returns | 13050 |
//! | `GPUSIM_NVML_REPORT` | path of the JSON report written at exit | unset |
//! | `GPUSIM_TRACE` | `1`: one stderr line per NVML call | unset |
//! | `GPUSIM_LOST` | a file of physical indices of lost GPUs, read at every device call (`devices::check_lost`, not here) | unset |
//!
//! An invalid value prints one warning to stderr and the default is used.

gpusim_common::settings!(
    prefix "gpusim-nvml",
    report "GPUSIM_NVML_REPORT",
    json crate::registry::report_json,
);

#[cfg(test)]
#[test]
fn reads_gpusim_nvml_report() {
    let c = from_env(|k| (k == "GPUSIM_NVML_REPORT").then(|| "/tmp/x.json".to_string()));
    assert_eq!(c.report.as_deref(), Some("/tmp/x.json"));
    let cuda = from_env(|k| (k == "GPUSIM_REPORT").then(|| "/tmp/cuda.json".to_string()));
    assert!(cuda.report.is_none());
}
