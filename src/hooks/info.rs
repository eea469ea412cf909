//! What the program can read about memory: `cuDeviceTotalMem` reports the effective limit,
//! `cuMemGetInfo` reports total = limit and free = min(limit − in use, driver free).
//! Also `cuInit`, which fails while the configuration is broken (see `intercept::enter`).

use std::ffi::c_uint;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use crate::compute::mode::Mode;
use crate::platform::log::{log, Level};

use crate::driver::ffi::*;
use crate::state::State;

/// `cuInit`: the device view was applied when the shim initialised (before this); once the
/// driver is up, check it shows that view. In the `mps` compute mode the MPS client variables
/// are set before the driver's `cuInit`; in the `green` mode a driver without green contexts
/// makes it fail.
pub unsafe fn init(st: &'static State, real: unsafe extern "C" fn(c_uint) -> CUresult, flags: c_uint) -> CUresult {
    let mode = crate::compute::mode::resolve(&st.settings);
    if mode == Mode::Mps {
        let totals: Option<Vec<u64>> = st
            .cuda_ordinals()
            .and_then(|v| st.inventory().map(|inv| v.devices.iter().filter_map(|&p| inv.get(p).map(|d| d.total)).collect()));
        crate::compute::mps::apply(&st.settings, totals.as_deref(), st.split_configured());
    }
    let result = real(flags);
    if result == CUDA_SUCCESS {
        if let Err(e) = st.after_cuda_init() {
            if !e.is_empty() {
                log!(Level::Error, "{e}");
            }
            return CUDA_ERROR_NOT_INITIALIZED;
        }
        if mode == Mode::Green {
            let why = match crate::compute::green::check(st.api()) {
                Some(why) => Some(why),
                None if st.split_configured() => Some("green contexts and GPUSHIM_VIRTUAL_DEVICES do not go together".to_string()),
                None => None,
            };
            if let Some(why) = why {
                static SAID: AtomicBool = AtomicBool::new(false);
                if !SAID.swap(true, Relaxed) {
                    log!(Level::Error, "GPUSHIM_COMPUTE_MODE=green: {why}; CUDA initialisation fails (choose another GPUSHIM_COMPUTE_MODE)");
                }
                return CUDA_ERROR_NOT_SUPPORTED;
            }
        }
    }
    result
}

pub unsafe fn device_total_mem(st: &State, real: unsafe extern "C" fn(*mut usize, CUdevice) -> CUresult, bytes: *mut usize, dev: CUdevice) -> CUresult {
    if bytes.is_null() {
        return real(bytes, dev);
    }
    let Some(driver) = st.driver_of(dev) else { return CUDA_ERROR_INVALID_DEVICE };
    let mut physical: usize = 0;
    let result = real(&mut physical, driver);
    if result == CUDA_SUCCESS {
        *bytes = st.limit(dev).map_or(physical, |l| l.min(physical as u64) as usize);
    }
    result
}

pub unsafe fn device_total_mem_v1(st: &State, real: unsafe extern "C" fn(*mut c_uint, CUdevice) -> CUresult, bytes: *mut c_uint, dev: CUdevice) -> CUresult {
    if bytes.is_null() {
        return real(bytes, dev);
    }
    let Some(driver) = st.driver_of(dev) else { return CUDA_ERROR_INVALID_DEVICE };
    let mut physical: c_uint = 0;
    let result = real(&mut physical, driver);
    if result == CUDA_SUCCESS {
        *bytes = st.limit(dev).map_or(physical, |l| l.min(physical as u64) as c_uint);
    }
    result
}

pub unsafe fn mem_get_info(st: &State, real: unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult, free: *mut usize, total: *mut usize) -> CUresult {
    let (mut f, mut t): (usize, usize) = (0, 0);
    let result = real(&mut f, &mut t);
    if result == CUDA_SUCCESS {
        let (f, t) = clamp(st, f as u64, t as u64);
        write(free, f as usize);
        write(total, t as usize);
    }
    result
}

pub unsafe fn mem_get_info_v1(st: &State, real: unsafe extern "C" fn(*mut c_uint, *mut c_uint) -> CUresult, free: *mut c_uint, total: *mut c_uint) -> CUresult {
    let (mut f, mut t): (c_uint, c_uint) = (0, 0);
    let result = real(&mut f, &mut t);
    if result == CUDA_SUCCESS {
        let (f, t) = clamp(st, f as u64, t as u64);
        write(free, f.min(c_uint::MAX as u64) as c_uint);
        write(total, t.min(c_uint::MAX as u64) as c_uint);
    }
    result
}

fn clamp(st: &State, free: u64, total: u64) -> (u64, u64) {
    match st.current_device() {
        Some(dev) => st.clamp_mem_info(dev, free, total),
        None => (free, total),
    }
}

/// Writes through an out-pointer the program may have left NULL.
unsafe fn write<T>(out: *mut T, value: T) {
    if !out.is_null() {
        *out = value;
    }
}
