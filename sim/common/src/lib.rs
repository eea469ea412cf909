//! gpusim-common: the one copy of what the simulated CUDA driver (`sim/cuda`) and the simulated
//! NVML (`sim/nvml`) share, so that both describe the same devices from the same environment.
//!
//! | module | owns |
//! |---|---|
//! | [`busy`] | the node state file's time region: per device recent busy time per process (written by `sim/cuda`, read by `sim/nvml`) |
//! | [`config`] | the `GPUSIM_*` settings, size parsing, the once-read [`config::Settings`] of a library (and its exit report) |
//! | [`identity`] | name, UUID, PCI address and serial of physical device `p` |
//! | [`counters`] | `exports!` (entry-point ids and call counters), call-count lookups, the `"calls"` JSON |
//! | [`ffi`] | `exported_fns!` (the body of `cu_api!` / `nvml_api!`), `guard`, `guard_value`, trace lines |
//!
//! Each simulator links its own copy of this rlib, so every `static` here exists once per
//! library: loading both libraries in one process gives each its own settings and counters.

pub mod busy;
pub mod config;
pub mod counters;
pub mod faults;
pub mod ffi;
pub mod identity;
