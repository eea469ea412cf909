//! Compute share (`GPUSHIM_COMPUTE_LIMIT`): which mode enforces it, and the `duty` pacer.
