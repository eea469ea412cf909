//! Compute share (`GPUSHIM_COMPUTE_LIMIT`): which mode enforces it, the `duty` pacer and its
//! turns with other paced processes on a GPU.

pub mod duty;
pub mod green;
pub mod mode;
pub mod mps;
pub mod turns;
#[cfg(test)]
mod duty_tests;

use gpushim_common::once::ForkOnce;

use crate::devices::MAX_DEVICES;
use duty::Pacer;

/// The `duty` pacers of the program's devices (`None`: that device has no limit), each made
/// at the device's first launch.
pub struct Pacers {
    slots: Box<[ForkOnce<Option<Pacer>>]>,
}

impl Pacers {
    pub fn new() -> Pacers {
        Pacers { slots: (0..MAX_DEVICES).map(|_| ForkOnce::new()).collect() }
    }

    /// Device `dev`'s pacer, made by `make` the first time.
    pub fn get_or_make(&self, dev: usize, make: impl FnOnce() -> Option<Pacer>) -> Option<&Pacer> {
        self.slots.get(dev)?.try_get_or_init(make).ok()?.as_ref()
    }

    /// Every pacer made so far.
    pub fn made(&self) -> impl Iterator<Item = &Pacer> {
        self.made_by_device().map(|(_, p)| p)
    }

    /// Every pacer made so far, with its program device.
    pub fn made_by_device(&self) -> impl Iterator<Item = (usize, &Pacer)> {
        self.slots.iter().enumerate().filter_map(|(i, s)| Some((i, s.get()?.as_ref()?)))
    }

    /// In a forked child: the parent's events and unmeasured work are not the child's.
    pub fn reset_after_fork(&self) {
        for p in self.made() {
            p.reset_after_fork();
        }
    }
}
