//! The driver below the shim: its C types, finding and opening it, its function tables, and the MD2 its private tables are checked with.

pub mod ffi;
mod library;
pub mod md2;
pub mod table;

pub use library::*;
