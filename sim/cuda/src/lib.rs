//! gpusim-cuda: a simulated NVIDIA driver (`libcuda.so.1`) for testing gpushim without a GPU.
//! See README.md for the environment variables, device identities, accounting rules and what
//! is not simulated.

#![allow(non_snake_case)]

#[macro_use]
mod ffi;
mod arbiter;

mod arrays;
mod config;
mod context;
mod cubin;
mod devices;
mod errors;
mod export_tables;
mod graphs;
mod green;
mod hostfn;
mod ipc;
mod kernels;
/// MD2 and HMAC-MD2 for the integrity check: the shim's own file, one implementation for both.
#[path = "../../../src/driver/md2.rs"]
mod md2;
mod memory;
mod node;
mod occupancy;
mod pools;
mod procaddr;
mod registry;
mod stats;
mod streams;
mod timeline;
mod types;
mod vmm;
mod zstd;

// Load-time constructor: reads the configuration, so that `GPUSIM_REPORT` is registered (and a
// report written at exit) for every process that loads the driver, even one that never calls it.
gpusim_common::at_load!(config::get);

/// Serialises the unit tests that drive the simulated driver through its entry points (they
/// share the process' devices, contexts and accounting).
#[cfg(test)]
pub(crate) static DRIVER_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());
