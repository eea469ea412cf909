//! Kernel launches, for the `duty` pacer (`compute`: the launch waits for its device's share and
//! is measured) and the placement log (`placement`: recorded once the driver accepted it), and
//! the look-ups that tell a kernel's name on drivers that cannot be asked for it. Handed out
//! only while either is on (`place`, `compute` in the hook table); the call is passed on
//! unchanged.

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::driver::ffi::*;
use crate::state::State;

type Function = *mut c_void;

/// The head of `CUlaunchConfig` (cuda.h): the grid and block, the shared memory, the stream.
#[repr(C)]
pub struct CUlaunchConfigHead {
    pub dims: [c_uint; 6],
    pub shared_mem_bytes: c_uint,
    pub stream: CUstream,
}

/// The launch hooks' fast lane. A program linked against `libcuda` reaches the shim's export
/// on every launch whatever the settings (the runtime and frameworks get the driver's own
/// pointer when neither the placement log nor a compute limit is on); the general path's
/// checks (`intercept::enter`) cost ~80 instructions a launch. Once the state is ready, the
/// lane calls the driver's own function at once when neither is on (~40 instructions in
/// all), else the hook's body, under `catch_unwind` as the general path does. It declines
/// (the general path then runs) before the state is ready, without the driver's function,
/// and in a broken state.
#[inline(always)]
fn lane_open(index: usize) -> Option<(&'static crate::state::State, usize, bool)> {
    let st = crate::state::get_if_ready()?;
    // (Acquire: pairs with `intercept::resolve_real`'s Release, as in `intercept::enter`)
    let real = crate::hooks::REAL[index].load(std::sync::atomic::Ordering::Acquire);
    if real == 0 || st.broken() {
        return None;
    }
    let needed = crate::state::NEEDS_PLACE | crate::state::NEEDS_COMPUTE;
    Some((st, real, st.needs() & needed != 0))
}

macro_rules! launch_lanes {
    ($($lane:ident for $hook:ident => $body:ident ($($arg:ident : $ty:ty),*);)*) => {$(
        #[doc = concat!("`", stringify!($hook), "`'s fast lane (`lane_open`).")]
        #[allow(clippy::too_many_arguments)]
        #[inline(always)]
        pub unsafe fn $lane($($arg: $ty),*) -> Option<c_int> {
            type Real = unsafe extern "C" fn($($ty),*) -> c_int;
            let index = crate::hooks::Hook::$hook as usize;
            let (st, real, body) = lane_open(index)?;
            // SAFETY: `real` is the driver's own function of that name, whose C signature is
            // the hook table's.
            let real = unsafe { std::mem::transmute::<usize, Real>(real) };
            if !body {
                // SAFETY: the program's arguments, passed on unchanged.
                return Some(unsafe { real($($arg),*) });
            }
            let run = std::panic::AssertUnwindSafe(|| {
                // SAFETY: as the general path's call of the body.
                unsafe { $body(st, real, $($arg),*) }
            });
            Some(std::panic::catch_unwind(run).unwrap_or_else(|payload| crate::hooks::intercept::unwound(index, payload)))
        }
    )*};
}

launch_lanes! {
    kernel_lane for cuLaunchKernel => launch_kernel (f: Function, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void);
    kernel_ptsz_lane for cuLaunchKernel_ptsz => launch_kernel_ptsz (f: Function, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void);
    kernel_ex_lane for cuLaunchKernelEx => launch_kernel_ex (config: *const CUlaunchConfigHead, f: Function, params: *mut *mut c_void, extra: *mut *mut c_void);
    kernel_ex_ptsz_lane for cuLaunchKernelEx_ptsz => launch_kernel_ex_ptsz (config: *const CUlaunchConfigHead, f: Function, params: *mut *mut c_void, extra: *mut *mut c_void);
    cooperative_lane for cuLaunchCooperativeKernel => launch_cooperative (f: Function, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void);
    cooperative_ptsz_lane for cuLaunchCooperativeKernel_ptsz => launch_cooperative_ptsz (f: Function, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void);
}

#[allow(clippy::too_many_arguments)]
unsafe fn kernel(
    st: &State,
    real: unsafe extern "C" fn(Function, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void, *mut *mut c_void) -> CUresult,
    per_thread: bool,
    f: Function,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    let result = st.paced_launch(stream, per_thread, || real(f, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared, stream, params, extra));
    if result == CUDA_SUCCESS {
        st.place_launch(f, stream, per_thread);
    }
    result
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn launch_kernel(
    st: &State,
    real: unsafe extern "C" fn(Function, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void, *mut *mut c_void) -> CUresult,
    f: Function,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    kernel(st, real, false, f, [gx, gy, gz], [bx, by, bz], shared, stream, params, extra)
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn launch_kernel_ptsz(
    st: &State,
    real: unsafe extern "C" fn(Function, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void, *mut *mut c_void) -> CUresult,
    f: Function,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    kernel(st, real, true, f, [gx, gy, gz], [bx, by, bz], shared, stream, params, extra)
}

#[allow(clippy::too_many_arguments)]
unsafe fn cooperative(
    st: &State,
    real: unsafe extern "C" fn(Function, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void) -> CUresult,
    per_thread: bool,
    f: Function,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
) -> CUresult {
    let result = st.paced_launch(stream, per_thread, || real(f, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared, stream, params));
    if result == CUDA_SUCCESS {
        st.place_launch(f, stream, per_thread);
    }
    result
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn launch_cooperative(
    st: &State,
    real: unsafe extern "C" fn(Function, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void) -> CUresult,
    f: Function,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
) -> CUresult {
    cooperative(st, real, false, f, [gx, gy, gz], [bx, by, bz], shared, stream, params)
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn launch_cooperative_ptsz(
    st: &State,
    real: unsafe extern "C" fn(Function, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void) -> CUresult,
    f: Function,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
) -> CUresult {
    cooperative(st, real, true, f, [gx, gy, gz], [bx, by, bz], shared, stream, params)
}

unsafe fn kernel_ex(
    st: &State,
    real: unsafe extern "C" fn(*const CUlaunchConfigHead, Function, *mut *mut c_void, *mut *mut c_void) -> CUresult,
    per_thread: bool,
    config: *const CUlaunchConfigHead,
    f: Function,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    // (a NULL config is the driver's to refuse: nothing to pace)
    let result = if config.is_null() {
        real(config, f, params, extra)
    } else {
        // SAFETY: a non-NULL `CUlaunchConfig` given to the driver: its head is readable (the
        // driver reads it too; a wild pointer would fault there).
        let stream = unsafe { (*config).stream };
        st.paced_launch(stream, per_thread, || real(config, f, params, extra))
    };
    if result == CUDA_SUCCESS && !config.is_null() {
        // SAFETY: the driver accepted `config`: it points to a whole CUlaunchConfig.
        st.place_launch(f, unsafe { (*config).stream }, per_thread);
    }
    result
}

pub unsafe fn launch_kernel_ex(
    st: &State,
    real: unsafe extern "C" fn(*const CUlaunchConfigHead, Function, *mut *mut c_void, *mut *mut c_void) -> CUresult,
    config: *const CUlaunchConfigHead,
    f: Function,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    kernel_ex(st, real, false, config, f, params, extra)
}

pub unsafe fn launch_kernel_ex_ptsz(
    st: &State,
    real: unsafe extern "C" fn(*const CUlaunchConfigHead, Function, *mut *mut c_void, *mut *mut c_void) -> CUresult,
    config: *const CUlaunchConfigHead,
    f: Function,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    kernel_ex(st, real, true, config, f, params, extra)
}

/// A deprecated launch while the pacer paces: refused (`CUDA_ERROR_NOT_SUPPORTED`), one line
/// the first time; the driver's otherwise (the hook is handed out only while pacing, but the
/// exported symbol can be called directly).
fn refuse_legacy(st: &State, what: &str) -> Option<CUresult> {
    if !st.compute_paced() {
        return None;
    }
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        crate::platform::log::log!(
            crate::platform::log::Level::Error,
            "{what} is refused while a compute limit is set (GPUSHIM_COMPUTE_LIMIT, duty mode): this deprecated launch cannot be paced; use cuLaunchKernel"
        );
    }
    Some(CUDA_ERROR_NOT_SUPPORTED)
}

pub unsafe fn legacy_launch(st: &State, real: unsafe extern "C" fn(Function) -> CUresult, f: Function) -> CUresult {
    refuse_legacy(st, "cuLaunch").unwrap_or_else(|| real(f))
}

pub unsafe fn legacy_launch_grid(st: &State, real: unsafe extern "C" fn(Function, c_int, c_int) -> CUresult, f: Function, w: c_int, h: c_int) -> CUresult {
    refuse_legacy(st, "cuLaunchGrid").unwrap_or_else(|| real(f, w, h))
}

pub unsafe fn legacy_launch_grid_async(st: &State, real: unsafe extern "C" fn(Function, c_int, c_int, CUstream) -> CUresult, f: Function, w: c_int, h: c_int, stream: CUstream) -> CUresult {
    refuse_legacy(st, "cuLaunchGridAsync").unwrap_or_else(|| real(f, w, h, stream))
}

pub unsafe fn legacy_multi_device(st: &State, real: unsafe extern "C" fn(*mut c_void, c_uint, c_uint) -> CUresult, params: *mut c_void, n: c_uint, flags: c_uint) -> CUresult {
    refuse_legacy(st, "cuLaunchCooperativeKernelMultiDevice").unwrap_or_else(|| real(params, n, flags))
}

pub unsafe fn module_get_function(st: &State, real: unsafe extern "C" fn(*mut Function, *mut c_void, *const c_char) -> CUresult, f: *mut Function, module: *mut c_void, name: *const c_char) -> CUresult {
    let result = real(f, module, name);
    if result == CUDA_SUCCESS && !f.is_null() {
        // SAFETY: the driver accepted `name` (a NUL-terminated string) and wrote `*f`.
        unsafe { st.remember_kernel_name(*f, name, module) };
    }
    result
}

pub unsafe fn library_get_kernel(st: &State, real: unsafe extern "C" fn(*mut Function, *mut c_void, *const c_char) -> CUresult, kernel: *mut Function, library: *mut c_void, name: *const c_char) -> CUresult {
    let result = real(kernel, library, name);
    if result == CUDA_SUCCESS && !kernel.is_null() {
        // SAFETY: as above.
        unsafe { st.remember_kernel_name(*kernel, name, library) };
    }
    result
}

pub unsafe fn kernel_get_function(st: &State, real: unsafe extern "C" fn(*mut Function, Function) -> CUresult, f: *mut Function, kernel: Function) -> CUresult {
    let result = real(f, kernel);
    if result == CUDA_SUCCESS && !f.is_null() {
        st.remember_kernel_function(*f, kernel);
    }
    result
}

/// `cuModuleUnload`, `cuLibraryUnload`: the unloaded code's handles are retired (their launches
/// kept by name; the driver may hand the handles out again).
pub unsafe fn unload(st: &State, real: unsafe extern "C" fn(*mut c_void) -> CUresult, owner: *mut c_void) -> CUresult {
    let result = real(owner);
    if result == CUDA_SUCCESS {
        st.forget_kernels_of(owner);
    }
    result
}
