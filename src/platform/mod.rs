//! The library's own platform pieces: ELF symbol look-ups, the unwinder's object finder, the log, and the fork handlers.

pub mod elfsym;
pub mod fork;
pub mod log;
#[cfg(all(gpushim_static_unwinder, any(target_arch = "x86_64", target_arch = "aarch64"), target_os = "linux"))]
pub mod unwind;
