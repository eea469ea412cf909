//! Finding and opening the real driver, the real `dlsym`, and the handful of unhooked driver
//! functions the shim itself calls (typed once, at start-up).

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use crate::ffi::*;

/// glibc's own `dlsym`, found with `dlvsym` (which the shim does not interpose). Read by the
/// `dlsym` trampoline in `intercept`, which jumps to it with the caller's registers and return
/// address intact.
pub static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

unsafe extern "C" fn no_dlsym(_: *mut c_void, _: *const c_char) -> *mut c_void {
    std::ptr::null_mut()
}

/// The real `dlsym`, resolved on first use (cheap afterwards: one relaxed load).
#[inline]
pub fn real_dlsym() -> DlsymFn {
    let p = REAL_DLSYM.load(Relaxed);
    if p != 0 {
        // SAFETY: only ever set to glibc's `dlsym` or `no_dlsym`, both of type `DlsymFn`.
        return unsafe { std::mem::transmute::<usize, DlsymFn>(p) };
    }
    resolve_real_dlsym()
}

#[cold]
fn resolve_real_dlsym() -> DlsymFn {
    let mut found: usize = 0;
    for version in [c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17"] {
        // SAFETY: plain C strings; dlvsym has no other preconditions.
        let p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
        if !p.is_null() {
            found = p as usize;
            break;
        }
    }
    if found == 0 {
        // Never crash: a lookup that finds nothing is better than a jump to address 0.
        found = no_dlsym as *const () as usize;
    }
    REAL_DLSYM.store(found, Relaxed);
    // SAFETY: as in `real_dlsym`.
    unsafe { std::mem::transmute::<usize, DlsymFn>(found) }
}

/// Looks `name` up in `handle` with the real `dlsym`.
pub fn lookup(handle: *mut c_void, name: &CStr) -> *mut c_void {
    // SAFETY: `name` is NUL-terminated; handle validity is the caller's (a dlopen handle).
    unsafe { real_dlsym()(handle, name.as_ptr()) }
}

/// An opened driver library.
pub struct Library {
    pub handle: *mut c_void,
    pub path: String,
}

// SAFETY: a dlopen handle is an opaque token usable from any thread.
unsafe impl Send for Library {}
unsafe impl Sync for Library {}

/// Opens a driver library: the explicit path if configured; else the library that holds `hint`
/// (a function the program just looked up there, so it is surely loaded); else `soname`.
pub fn open(explicit: Option<&std::path::Path>, hint: Option<*const c_void>, soname: &CStr) -> Result<Library, String> {
    if let Some(path) = explicit {
        use std::os::unix::ffi::OsStrExt;
        let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| "path contains a NUL byte".to_string())?;
        return dlopen(&c).ok_or_else(|| format!("cannot open {}: {}", path.display(), dlerror()));
    }
    let own = object_of(open as *const c_void);
    if let Some(lib) = hint.and_then(object_of).filter(|path| Some(path) != own.as_ref()).and_then(|path| dlopen_noload(&path)) {
        return Ok(lib);
    }
    let lib = dlopen(soname).ok_or_else(|| format!("cannot open {}: {}", soname.to_string_lossy(), dlerror()))?;
    // A library named like the driver that resolves to the shim itself (installed under the
    // driver's name by mistake) would make every hook call itself.
    if object_of(lookup(lib.handle, c"cuInit")) == own {
        return Err(format!("{} resolves to gpushim itself, not to the NVIDIA driver", lib.path));
    }
    Ok(lib)
}

fn object_of(addr: *const c_void) -> Option<CString> {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: dladdr writes into `info`; it accepts any address.
    let ok = unsafe { libc::dladdr(addr, info.as_mut_ptr()) };
    // SAFETY: zero-initialised, and filled in by dladdr when it succeeds.
    let info = unsafe { info.assume_init() };
    if ok == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr returns a NUL-terminated path owned by the loader.
    Some(unsafe { CStr::from_ptr(info.dli_fname) }.to_owned())
}

fn dlopen_flags(path: &CStr, flags: c_int) -> Option<Library> {
    // SAFETY: `path` is NUL-terminated.
    let handle = unsafe { libc::dlopen(path.as_ptr(), flags) };
    (!handle.is_null()).then(|| Library { handle, path: path.to_string_lossy().into_owned() })
}

fn dlopen(path: &CStr) -> Option<Library> {
    dlopen_flags(path, libc::RTLD_NOW | libc::RTLD_LOCAL)
}

fn dlopen_noload(path: &CStr) -> Option<Library> {
    dlopen_flags(path, libc::RTLD_NOW | libc::RTLD_LOCAL | libc::RTLD_NOLOAD)
}

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated message.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: as above.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// Driver functions the shim calls for its own purposes and does not hook.
pub struct Api {
    pub ctx_get_device: Option<unsafe extern "C" fn(*mut CUdevice) -> CUresult>,
    pub ctx_get_current: Option<unsafe extern "C" fn(*mut CUcontext) -> CUresult>,
    pub ctx_push_current: Option<unsafe extern "C" fn(CUcontext) -> CUresult>,
    pub ctx_pop_current: Option<unsafe extern "C" fn(*mut CUcontext) -> CUresult>,
    pub stream_get_ctx: Option<unsafe extern "C" fn(CUstream, *mut CUcontext) -> CUresult>,
    pub device_total_mem: Option<unsafe extern "C" fn(*mut usize, CUdevice) -> CUresult>,
}

impl Api {
    pub fn load(lib: &Library) -> Api {
        macro_rules! sym {
            ($name:literal) => {{
                let p = lookup(lib.handle, $name);
                // SAFETY: a non-NULL result is the driver's function of that name, whose C
                // signature is the one in the field's type (cuda.h).
                (!p.is_null()).then(|| unsafe { std::mem::transmute(p) })
            }};
        }
        Api {
            ctx_get_device: sym!(c"cuCtxGetDevice"),
            ctx_get_current: sym!(c"cuCtxGetCurrent"),
            ctx_push_current: sym!(c"cuCtxPushCurrent_v2"),
            ctx_pop_current: sym!(c"cuCtxPopCurrent_v2"),
            stream_get_ctx: sym!(c"cuStreamGetCtx"),
            device_total_mem: sym!(c"cuDeviceTotalMem_v2"),
        }
    }

    /// The device of the current context.
    pub fn current_device(&self) -> Option<CUdevice> {
        let f = self.ctx_get_device?;
        let mut dev: CUdevice = 0;
        // SAFETY: valid out-pointer.
        (unsafe { f(&mut dev) } == CUDA_SUCCESS).then_some(dev)
    }

    /// The device a stream's work runs on: the current context's for the default streams and
    /// for streams of the current context, else that of the stream's own context.
    pub fn stream_device(&self, stream: CUstream) -> Option<CUdevice> {
        let s = stream as usize;
        if s == 0 || s == STREAM_LEGACY || s == STREAM_PER_THREAD {
            return self.current_device();
        }
        let (get_ctx, get_cur) = (self.stream_get_ctx?, self.ctx_get_current?);
        let (mut ctx, mut cur): (CUcontext, CUcontext) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: valid out-pointers; `stream` is the program's own handle, passed on as given.
        if unsafe { get_ctx(stream, &mut ctx) } != CUDA_SUCCESS || ctx.is_null() {
            return self.current_device();
        }
        // SAFETY: valid out-pointer.
        if unsafe { get_cur(&mut cur) } == CUDA_SUCCESS && cur == ctx {
            return self.current_device();
        }
        let (push, pop) = (self.ctx_push_current?, self.ctx_pop_current?);
        // SAFETY: `ctx` came from the driver; it is pushed and popped again on this thread.
        if unsafe { push(ctx) } != CUDA_SUCCESS {
            return None;
        }
        let dev = self.current_device();
        let mut popped: CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer; pops what was pushed above.
        unsafe { pop(&mut popped) };
        dev
    }

    /// The device's physical memory as the driver reports it.
    pub fn physical_total(&self, dev: CUdevice) -> Option<u64> {
        let f = self.device_total_mem?;
        let mut total: usize = 0;
        // SAFETY: valid out-pointer.
        (unsafe { f(&mut total, dev) } == CUDA_SUCCESS).then_some(total as u64)
    }
}
