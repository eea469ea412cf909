//! The formats of the files the shim shares with other processes and the command: shared quotas and live figures, and the wait for room in a shared budget.

pub mod hami;
pub mod live;
pub mod oom_wait;
pub mod quota;
