//! Modules and kernel launches: nothing runs here. Launches succeed and do nothing; loading
//! code is CUDA_ERROR_NOT_SUPPORTED.

use crate::types::*;
use std::ffi::c_void;

fn launch(f: CUfunction, s: CUstream) -> Res {
    let _ = f;
    crate::streams::ctx_of(s).map(|_| ())
}

cu_api! {
    /// CU_MODULE_LAZY_LOADING = 2
    fn cuModuleGetLoadingMode(mode: *mut i32) { put(mode, 2) }

    fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) {
        let _ = (module, image);
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }

    fn cuLaunchKernel(f: CUfunction, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32,
                      shared: u32, s: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) {
        let _ = (gx, gy, gz, bx, by, bz, shared, params, extra);
        launch(f, s)
    }

    fn cuLaunchKernel_ptsz(f: CUfunction, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32,
                           shared: u32, s: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) {
        let _ = (gx, gy, gz, bx, by, bz, shared, params, extra);
        launch(f, s)
    }
}
