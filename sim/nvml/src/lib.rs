//! gpusim-nvml: a simulated NVML (`libnvidia-ml.so.1`) for testing gpushim without a GPU.
//! It describes the same physical devices as the simulated CUDA driver (`sim/cuda`), from the
//! same environment, and reports the memory that driver has allocated in the same process.
//! See README.md for the environment variables, device identities and what is simulated.

#![allow(non_snake_case)]

#[macro_use]
mod ffi;

mod api;
mod config;
mod cuda_link;
mod devices;
mod processes;
pub mod internal;
mod registry;
mod types;

#[cfg(test)]
mod tests;

// Load-time constructor: reads the configuration, so that `GPUSIM_NVML_REPORT` is registered (and a
// report written at exit) for every process that loads the library.
gpusim_common::at_load!(config::get);
