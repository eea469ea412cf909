//! What devices the program sees: the view (hide, reorder), the driver's devices, their splits into program devices, and NVML's virtual handles.

#[cfg(test)]
mod fuzz;
pub mod nvml_virtual;
mod physical;
pub mod split;
pub mod view;

pub use physical::*;
