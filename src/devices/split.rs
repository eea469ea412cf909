//! The state of split devices (`GPUSHIM_VIRTUAL_DEVICES`): the program's devices, each part's
//! own primary context and the contexts the program creates on parts, and the list NVML shows.
//! The model (which program device is which part of which driver device) is `devices`; the
//! hooks that speak program ordinals are `hooks::devices`.


use crate::devices::{Devices, Part};
use crate::driver::ffi::CUdevice;

/// What the runtime's integrity check hashes of a device: UUID, PCI domain, bus, device.
pub type DeviceFacts = ([u8; 16], i32, i32, i32);

/// The program's devices while split, with what the shim keeps for each.
pub(crate) struct Split {
    pub(crate) devices: Devices,
    /// Per program device: UUID (derived for parts), PCI domain, bus, device.
    pub(crate) facts: Vec<DeviceFacts>,
    /// The primary contexts of parts after the first (the driver has one per GPU, the first
    /// part uses it): created on first retain, kept for the life of the process.
    pub(crate) primaries: Vec<PartPrimary>,
    /// Contexts the program created on a part, with the part's ordinal.
    pub(crate) contexts: gpushim_common::bounded::Bounded<Vec<(usize, CUdevice)>>,
}

impl Split {
    pub(crate) fn hold_for_fork(&'static self) {
        crate::platform::fork::hold(&self.contexts);
    }

    /// A forked child (`fork`): the parent's contexts do not survive the fork.
    pub(crate) fn reset_after_fork(&self) {
        self.contexts.reset_after_fork(Vec::new());
        for p in &self.primaries {
            p.ctx.store(0, std::sync::atomic::Ordering::Release);
            p.refs.store(0, std::sync::atomic::Ordering::Release);
        }
    }
}

#[derive(Default)]
pub(crate) struct PartPrimary {
    /// The context, 0 until the first retain created it.
    pub(crate) ctx: std::sync::atomic::AtomicUsize,
    pub(crate) refs: std::sync::atomic::AtomicU32,
    pub(crate) flags: std::sync::atomic::AtomicU32,
}

/// Set when `GPUSHIM_VIRTUAL_DEVICES` could not split NVML's list (see
/// [`State::nvml_split_failed`]); the state is one per process.
pub(crate) static NVML_SPLIT_FAILED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// One device of the list NVML shows while devices are split.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvmlPart {
    /// The physical device (an index into NVML's inventory).
    pub physical: usize,
    /// Which part of it, for a split GPU.
    pub part: Option<Part>,
    /// The UUID shown: derived for a part, the physical one for a whole device.
    pub uuid: String,
}

