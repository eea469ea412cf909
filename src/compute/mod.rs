//! Compute share (`GPUSHIM_COMPUTE_LIMIT`): which mode enforces it, and the `duty` pacer.

pub mod green;
pub mod mode;
pub mod mps;
