//! This process' part in what is shared with others: its place in a shared quota or the registry, and its published live figures.

mod join;

pub use join::*;
