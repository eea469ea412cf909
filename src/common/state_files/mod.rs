//! The formats of the files the shim shares with other processes and the command: shared quotas and live figures.

pub mod hami;
pub mod live;
pub mod quota;
