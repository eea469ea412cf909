//! gpushim: hides, reorders, splits and memory-limits NVIDIA GPUs for unmodified CUDA programs.
//!
//! Loaded with `LD_PRELOAD`, the library sits between the program and the driver. Nothing
//! happens until the program asks for a CUDA function (`state`); the hooked functions are
//! declared once in `hooks` and reached through exports, an interposed `dlsym` and
//! `cuGetProcAddress` (`hooks::intercept`); limits are enforced by atomic reservation
//! (`accounting::memory`); the `grow` and `preallocate` memory modes serve allocations from a
//! reserve (`accounting::modes`, `accounting::reserve`). The layers and the path of one
//! allocation through them: docs/src/architecture.md.

// The layers, bottom to top (scripts/layers.py checks that none imports one above it; below
// them all is the gpushim-common crate: system calls, settings, the state files' formats).
mod platform;
mod driver;
mod devices;
mod accounting;
mod compute;
mod sharing;
mod placement;
mod state;
mod hooks;
