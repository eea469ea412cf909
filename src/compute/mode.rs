//! Which mode enforces the compute limit (`GPUSHIM_COMPUTE_MODE`).

use gpushim_common::config::{ComputeMode, Settings};

/// The mode in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// No compute limit.
    None,
    Duty,
    Mps,
    Green,
}

/// The mode the settings ask for (`auto`: `duty` until MPS detection is in).
pub fn resolve(settings: &Settings) -> Mode {
    if !settings.compute_limits_anything() {
        return Mode::None;
    }
    match settings.compute_mode {
        ComputeMode::Auto | ComputeMode::Duty => Mode::Duty,
        ComputeMode::Mps => Mode::Mps,
        ComputeMode::Green => Mode::Green,
    }
}
