//! The driver below the shim: its C types, finding and opening it, its function tables, and the private export tables.

pub mod ffi;
mod library;
pub mod md2;
pub mod table;

pub use library::*;
