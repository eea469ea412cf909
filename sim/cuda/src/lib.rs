//! gpusim-cuda: a simulated NVIDIA driver (`libcuda.so.1`) for testing gpushim without a GPU.
//! See README.md for the environment variables, device identities, accounting rules and what
//! is not simulated.

#![allow(non_snake_case)]

#[macro_use]
mod ffi;

mod arrays;
mod config;
mod context;
mod devices;
mod errors;
mod export_tables;
mod kernels;
mod md2;
mod memory;
mod pools;
mod procaddr;
mod registry;
mod stats;
mod streams;
mod types;
mod vmm;
