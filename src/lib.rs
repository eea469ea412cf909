//! gpushim: hides, reorders, splits and memory-limits NVIDIA GPUs for unmodified CUDA programs.
//!
//! Loaded with `LD_PRELOAD`, the library sits between the program and the driver. Nothing
//! happens until the program asks for a CUDA function (`state`); the hooked functions are
//! declared once in `hooks` and reached through exports, an interposed `dlsym` and
//! `cuGetProcAddress` (`intercept`); limits are enforced by atomic reservation (`memory`); the
//! `grow` and `preallocate` memory modes serve allocations from a reserve (`modes`, `reserve`).

mod api;
mod devices;
mod driver;
mod elfsym;
mod ffi;
mod fork;
mod graphs;
#[cfg(test)]
mod fuzz;
mod hooks;
mod intercept;
mod lane;
mod log;
mod md2;
mod memory;
mod modes;
mod nvml_virtual;
mod placement;
mod pools;
mod private;
mod report;
mod reserve;
mod sharing;
mod split;
mod state;
mod teardown;
#[cfg(all(gpushim_static_unwinder, target_arch = "x86_64", target_os = "linux"))]
mod unwind;
mod view;
mod vmm;
