//! What devices the program sees: the view (hide, reorder), the driver's devices, and their splits into program devices.

#[cfg(test)]
mod fuzz;
mod physical;
pub mod split;
pub mod view;

pub use physical::*;

/// Device ordinals the shim accounts for (the program's, after hiding and splitting). A
/// configuration that makes more devices is an error; an allocation on a device beyond this
/// (a driver showing more GPUs) is refused while any limit is set, never passed uncounted.
pub const MAX_DEVICES: usize = 256;
