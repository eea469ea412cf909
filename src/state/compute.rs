//! The state's side of the compute share: whether the `duty` pacer paces launches, each
//! device's pacer (its share, its clock: the process' own or its shared quota's, its published
//! figures), and the gate every launch hook goes through.

use std::sync::atomic::AtomicU64;

use gpushim_common::live;

use crate::compute::duty::{EventApi, Pacer, Ticket};
use crate::driver::ffi::*;
use crate::driver::{self};
use crate::platform::log::{log, Level};
use crate::state::{Mode, State};

/// `CU_STREAM_PER_THREAD`: the per-thread default stream, named in any call.
const STREAM_PER_THREAD: usize = 2;

impl State {
    /// Whether the `duty` pacer paces launches: a compute limit is set and the mode is `duty`
    /// (or `auto` without an MPS daemon).
    pub fn compute_paced(&self) -> bool {
        if self.mode != Mode::Active || !self.settings.compute_limits_anything() {
            return false;
        }
        match crate::compute::mode::resolve(&self.settings) {
            crate::compute::mode::Mode::Duty => true,
            // (MPS holds one percentage per process: the devices whose lower limit it cannot
            // hold are paced here)
            crate::compute::mode::Mode::Mps => !self.mps_unheld().is_empty(),
            _ => false,
        }
    }

    /// In `mps` mode: the devices whose limit the MPS percentage does not hold.
    fn mps_unheld(&self) -> Vec<u32> {
        crate::compute::mps::plan(&self.settings, None, false, None, None).unheld
    }

    /// Runs `launch` (a launch onto `stream`; `per_thread`: a `_ptsz` variant) through the
    /// pacer of the stream's device: waits for the device's share, brackets the launch with
    /// the pacer's events. Straight through when nothing paces launches or the stream is
    /// capturing a graph (the graph's launches are paced).
    #[inline]
    pub fn paced_launch(&self, stream: CUstream, per_thread: bool, launch: impl FnOnce() -> CUresult) -> CUresult {
        if self.needs() & crate::state::NEEDS_COMPUTE == 0 {
            return launch();
        }
        self.paced_launch_slow(stream, per_thread, launch)
    }

    #[inline(never)]
    fn paced_launch_slow(&self, stream: CUstream, per_thread: bool, launch: impl FnOnce() -> CUresult) -> CUresult {
        let Some(pacer) = self.pacer_of_stream(stream) else { return launch() };
        let Some(events) = EventApi::from(self.api()) else {
            // (a driver without the event functions cannot be paced: refused, never unpaced)
            static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
            if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                log!(Level::Error, "compute limit: the driver lacks cuEventCreate/Record/Query/ElapsedTime/Destroy or cuCtxGetCurrent, which the duty pacer measures with; launches are refused (use GPUSHIM_COMPUTE_MODE=mps, or no compute limit)");
            }
            return CUDA_ERROR_NOT_SUPPORTED;
        };
        // (during a capture the launch only adds a node to a graph; an event recorded there
        // would add one too)
        let on = if per_thread && stream.is_null() { STREAM_PER_THREAD as CUstream } else { stream };
        if self.compute_capturing(on) {
            return launch();
        }
        let ticket: Ticket = pacer.before_launch(&events, on);
        let result = launch();
        pacer.after_launch(&events, on, ticket, result == CUDA_SUCCESS);
        result
    }

    /// Whether `stream` is capturing a graph: also the per-thread default stream (which can be
    /// captured), asked by its handle; the legacy stream cannot be.
    fn compute_capturing(&self, stream: CUstream) -> bool {
        if stream as usize != STREAM_PER_THREAD {
            return self.capturing(stream);
        }
        let Some(get) = self.api().stream_is_capturing else { return false };
        let mut status: std::ffi::c_int = 0;
        // SAFETY: `CU_STREAM_PER_THREAD`, a handle every call accepts; valid out-pointer.
        (unsafe { get(stream, &mut status) }) == CUDA_SUCCESS && status != 0
    }

    /// The pacer of the device `stream`'s work runs on (`None`: that device has no limit).
    fn pacer_of_stream(&self, stream: CUstream) -> Option<&Pacer> {
        let dev = self.stream_device(stream).or_else(|| self.current_device())?;
        self.pacer(usize::try_from(dev).ok()?)
    }

    /// Device `dev`'s pacer (`None`: no compute limit on it), made at its first launch.
    fn pacer(&self, dev: usize) -> Option<&Pacer> {
        self.pacers.get_or_make(dev, || self.make_pacer(dev))
    }

    #[cold]
    fn make_pacer(&self, dev: usize) -> Option<Pacer> {
        let share = self.settings.compute_limit_for(dev as u32)?;
        if crate::compute::mode::resolve(&self.settings) == crate::compute::mode::Mode::Mps && !self.mps_unheld().contains(&(dev as u32)) {
            return None;
        }
        let publisher = crate::sharing::publisher();
        let figures: Option<&'static live::Compute> = publisher.and_then(|p| p.device(dev)).map(|entry| &entry.compute);
        let clock = self.group_clock(dev).unwrap_or_else(|| Box::leak(Box::new(AtomicU64::new(0))));
        let turn = self.gpu_turn(dev);
        log!(Level::Debug, "device {dev}: compute limit {:.1}% (duty){}", share * 100.0, if turn.is_some() { ", turns with other paced processes" } else { "" });
        Some(Pacer::new(share, clock, figures, turn))
    }

    /// The turn word of the physical GPU under program device `dev` (parts of one GPU share it),
    /// shared with the user's other paced processes on that GPU. Keyed by `cuDeviceGetUuid_v2`
    /// where the driver has it: two MIG instances of one GPU run side by side, never
    /// time-sliced, so they take no turns with each other (v1 names their GPU).
    fn gpu_turn(&self, dev: usize) -> Option<&'static AtomicU64> {
        let d = self.driver_of(dev as CUdevice)?;
        let id = self.api().instance_uuid(d)?;
        let size = self.api().physical_total(d).unwrap_or(0);
        crate::sharing::gpu_turn(&self.settings, &driver::uuid_string(&id), size)
    }

    /// With a shared quota: the group's clock for device `dev` (keyed, like its memory, by the
    /// device's UUID, the part's when split).
    fn group_clock(&self, dev: usize) -> Option<&'static AtomicU64> {
        let quota = crate::sharing::quota()?;
        // (the memory side attaches the device to the quota at its first use)
        let _ = self.limit(dev as CUdevice);
        let uuid = self.part_uuid(dev as CUdevice).or_else(|| self.api().device_uuid(self.driver_of(dev as CUdevice)?))?;
        let d = quota.find(&driver::uuid_string(&uuid))?;
        quota.compute_clock(d)
    }

    /// Publishes the compute mode and each program device's compute limit (its busy and waited
    /// time follow from its pacer, in `duty` mode).
    pub(crate) fn publish_compute(&self, p: &gpushim_common::live::Publisher, driver_devices: usize) {
        use crate::compute::mode::Mode as M;
        let mode = crate::compute::mode::resolve(&self.settings);
        p.set_compute_mode(match mode {
            M::None => 0,
            M::Duty => 1,
            M::Mps => 2,
            M::Green => 3,
        });
        if mode == M::None {
            return;
        }
        let count = self.program_devices().map_or(driver_devices, |d| d.list.len());
        for i in 0..count {
            if let (Some(share), Some(entry)) = (self.settings.compute_limit_for(i as u32), p.device(i)) {
                entry.compute.limit_ppm.store(crate::compute::duty::ppm(share), std::sync::atomic::Ordering::Relaxed);
            }
        }
    }

    /// Each paced device's figures, for the exit report.
    pub fn compute_rows(&self) -> Vec<crate::state::report::ComputeRow> {
        use std::sync::atomic::Ordering::Relaxed;
        self.pacers
            .made_by_device()
            .map(|(ordinal, p)| {
                let f = p.figures();
                crate::state::report::ComputeRow {
                    ordinal,
                    limit: p.share(),
                    busy_ns: f.busy_ns.load(Relaxed),
                    throttled_ns: f.throttled_ns.load(Relaxed),
                    launches: f.launches.load(Relaxed),
                }
            })
            .collect()
    }

    /// Context `ctx` goes away: the pacers forget their events of it; `alive`: it still lives
    /// (they are destroyed first).
    pub fn compute_forget_context(&self, ctx: CUcontext, alive: bool) {
        let destroy = if alive { self.api().event_destroy } else { None };
        for p in self.pacers.made() {
            p.forget_context(ctx as usize, destroy);
        }
    }
}
