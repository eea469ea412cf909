//! This process' part in what is shared with others: its place in a shared quota or the registry, HAMi-core's shared region, and its published live figures.

pub mod hami;
mod join;

pub use join::*;
