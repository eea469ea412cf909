//! The settings: what the environment and the config file say, the units they are written in, and what secure execution refuses.

pub mod compute_mode;
pub mod config;
pub mod secure;
pub mod units;
