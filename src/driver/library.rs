//! Finding and opening the real driver, the real `dlsym`, and the handful of unhooked driver
//! functions the shim itself calls (typed once, at start-up).

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use crate::driver::ffi::*;

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
    /// Its own symbol tables, for look-ups cheaper than `dlsym` (`elfsym`).
    symbols: Option<crate::platform::elfsym::Symbols>,
}

impl Library {
    /// The library's function `name`, whose GNU hash (`elfsym::gnu_hash`, computed at compile
    /// time) is `hash`: from its own hash table when that gives a plain answer, else from
    /// `dlsym` (which also searches the library's dependencies).
    pub fn function_hashed(&self, name: &CStr, hash: u32) -> *mut c_void {
        use crate::platform::elfsym::Answer;
        match self.symbols.as_ref().map_or(Answer::Ask, |s| s.function(name.to_bytes(), hash)) {
            Answer::Found(found) => found,
            Answer::Absent => std::ptr::null_mut(),
            Answer::Ask => lookup(self.handle, name),
        }
    }
}

// SAFETY: a dlopen handle is an opaque token usable from any thread.
unsafe impl Send for Library {}
unsafe impl Sync for Library {}

/// The two libraries the shim stands in front of.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Lib {
    Cuda,
    Nvml,
}

impl Lib {
    pub fn soname(self) -> &'static CStr {
        match self {
            Lib::Cuda => c"libcuda.so.1",
            Lib::Nvml => c"libnvidia-ml.so.1",
        }
    }

    /// A function every version of the library exports.
    fn probe(self) -> &'static CStr {
        match self {
            Lib::Cuda => c"cuInit",
            Lib::Nvml => c"nvmlInit_v2",
        }
    }

    /// The library a hooked function belongs to, from its name.
    pub fn of(symbol: &str) -> Lib {
        if symbol.starts_with("nvml") {
            Lib::Nvml
        } else {
            Lib::Cuda
        }
    }
}

/// Opens a library: the explicit path if configured; else the library that holds `hint` (a
/// function the program just looked up there, so it is surely loaded); else its soname.
pub fn open(lib: Lib, explicit: Option<&std::path::Path>, hint: Option<*const c_void>) -> Result<Library, String> {
    let soname = lib.soname();
    if let Some(path) = explicit {
        use std::os::unix::ffi::OsStrExt;
        let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| "path contains a NUL byte".to_string())?;
        return dlopen(&c).ok_or_else(|| format!("cannot open {}: {}", path.display(), dlerror()));
    }
    let own = object_of(open as *const c_void);
    if let Some(lib) = hint.and_then(object_of).filter(|path| Some(path) != own.as_ref()).and_then(|path| dlopen_noload(&path)) {
        return Ok(lib);
    }
    let opened = dlopen(soname).ok_or_else(|| format!("cannot open {}: {}", soname.to_string_lossy(), dlerror()))?;
    // A library named like the driver that resolves to the shim itself (installed under the
    // driver's name by mistake) would make every hook call itself.
    if object_of(lookup(opened.handle, lib.probe())) == own {
        return Err(format!("{} resolves to gpushim itself, not to the NVIDIA library", opened.path));
    }
    Ok(opened)
}

/// The path of the loaded library that holds `addr` (`None`: none, or the main program). Walks
/// the loaded objects' segments (`dl_iterate_phdr`): `dladdr` would also search the object's
/// symbols for the nearest one, ~10,000 instructions a call.
fn object_of(addr: *const c_void) -> Option<CString> {
    struct Search {
        addr: usize,
        found: Option<CString>,
    }
    extern "C" fn visit(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
        // SAFETY: the loader passes a valid `dl_phdr_info` whose `dlpi_phdr` has `dlpi_phnum`
        // headers and whose name is NUL-terminated (or NULL); `data` is our `Search`.
        unsafe {
            let (info, search) = (&*info, &mut *(data as *mut Search));
            if info.dlpi_phdr.is_null() {
                return 0;
            }
            for i in 0..info.dlpi_phnum as usize {
                let ph = &*info.dlpi_phdr.add(i);
                let start = (info.dlpi_addr as usize).wrapping_add(ph.p_vaddr as usize);
                if ph.p_type == libc::PT_LOAD && search.addr >= start && search.addr - start < ph.p_memsz as usize {
                    if !info.dlpi_name.is_null() && *info.dlpi_name != 0 {
                        search.found = Some(CStr::from_ptr(info.dlpi_name).to_owned());
                    }
                    return 1;
                }
            }
            0
        }
    }
    let mut search = Search { addr: addr as usize, found: None };
    // SAFETY: `visit` only reads what the loader passes and writes `search`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&mut search as *mut Search).cast()) };
    search.found
}

fn dlopen_flags(path: &CStr, flags: c_int) -> Option<Library> {
    // SAFETY: `path` is NUL-terminated.
    let handle = unsafe { libc::dlopen(path.as_ptr(), flags) };
    (!handle.is_null()).then(|| Library { handle, path: path.to_string_lossy().into_owned(), symbols: crate::platform::elfsym::Symbols::of(handle) })
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
    pub device_get_attribute: Option<unsafe extern "C" fn(*mut c_int, c_int, CUdevice) -> CUresult>,
    pub ctx_create: Option<unsafe extern "C" fn(*mut CUcontext, c_uint, CUdevice) -> CUresult>,
    pub ctx_destroy: Option<unsafe extern "C" fn(CUcontext) -> CUresult>,
    pub primary_ctx_retain: Option<unsafe extern "C" fn(*mut CUcontext, CUdevice) -> CUresult>,
    pub driver_get_version: Option<unsafe extern "C" fn(*mut c_int) -> CUresult>,
    pub device_get_count: Option<unsafe extern "C" fn(*mut c_int) -> CUresult>,
    pub device_get_name: Option<unsafe extern "C" fn(*mut c_char, c_int, CUdevice) -> CUresult>,
    pub device_get_uuid: Option<unsafe extern "C" fn(*mut [u8; 16], CUdevice) -> CUresult>,
    /// `cuDeviceGetUuid_v2` (CUDA 11.4+): a MIG instance's own UUID where v1 gives its GPU's.
    pub device_get_uuid_v2: Option<unsafe extern "C" fn(*mut [u8; 16], CUdevice) -> CUresult>,
    pub ctx_get_device: Option<unsafe extern "C" fn(*mut CUdevice) -> CUresult>,
    pub ctx_get_current: Option<unsafe extern "C" fn(*mut CUcontext) -> CUresult>,
    pub ctx_push_current: Option<unsafe extern "C" fn(CUcontext) -> CUresult>,
    pub ctx_pop_current: Option<unsafe extern "C" fn(*mut CUcontext) -> CUresult>,
    pub stream_get_ctx: Option<unsafe extern "C" fn(CUstream, *mut CUcontext) -> CUresult>,
    pub device_total_mem: Option<unsafe extern "C" fn(*mut usize, CUdevice) -> CUresult>,
    // For the reserve of the grow and preallocate memory modes (`modes`).
    pub ctx_get_id: Option<unsafe extern "C" fn(CUcontext, *mut u64) -> CUresult>,
    pub ctx_synchronize: Option<unsafe extern "C" fn() -> CUresult>,
    pub stream_synchronize: Option<unsafe extern "C" fn(CUstream) -> CUresult>,
    pub mem_alloc: Option<unsafe extern "C" fn(*mut CUdeviceptr, usize) -> CUresult>,
    pub mem_get_info: Option<unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult>,
    pub primary_ctx_release: Option<unsafe extern "C" fn(CUdevice) -> CUresult>,
    pub primary_ctx_get_state: Option<unsafe extern "C" fn(CUdevice, *mut c_uint, *mut c_int) -> CUresult>,
    pub pointer_get_attribute: Option<unsafe extern "C" fn(*mut c_void, c_int, CUdeviceptr) -> CUresult>,
    pub device_get_mem_pool: Option<unsafe extern "C" fn(*mut CUmemoryPool, CUdevice) -> CUresult>,
    pub device_get_default_mem_pool: Option<unsafe extern "C" fn(*mut CUmemoryPool, CUdevice) -> CUresult>,
    pub mem_pool_get_attribute: Option<unsafe extern "C" fn(CUmemoryPool, c_int, *mut c_void) -> CUresult>,
    pub mem_pool_trim_to: Option<unsafe extern "C" fn(CUmemoryPool, usize) -> CUresult>,
    pub stream_is_capturing: Option<unsafe extern "C" fn(CUstream, *mut c_int) -> CUresult>,
    pub graph_get_nodes: Option<unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut usize) -> CUresult>,
    pub graph_node_get_type: Option<unsafe extern "C" fn(*mut c_void, *mut c_int) -> CUresult>,
    pub graph_mem_alloc_node_get_params: Option<unsafe extern "C" fn(*mut c_void, *mut c_void) -> CUresult>,
    pub device_get_graph_mem_attribute: Option<unsafe extern "C" fn(CUdevice, c_int, *mut c_void) -> CUresult>,
    // Kernel names for the placement log (`placement`; CUDA 12.3+).
    pub func_get_name: Option<unsafe extern "C" fn(*mut *const c_char, *mut c_void) -> CUresult>,
    pub kernel_get_name: Option<unsafe extern "C" fn(*mut *const c_char, *mut c_void) -> CUresult>,
    // The events the compute pacer measures the device time of launches with (`compute::duty`).
    pub event_create: Option<unsafe extern "C" fn(*mut CUevent, c_uint) -> CUresult>,
    pub event_record: Option<unsafe extern "C" fn(CUevent, CUstream) -> CUresult>,
    pub event_query: Option<unsafe extern "C" fn(CUevent) -> CUresult>,
    pub event_elapsed: Option<unsafe extern "C" fn(*mut f32, CUevent, CUevent) -> CUresult>,
    pub event_destroy: Option<unsafe extern "C" fn(CUevent) -> CUresult>,
    pub thread_exchange_capture_mode: Option<unsafe extern "C" fn(*mut u32) -> CUresult>,
    // Green contexts for the `green` compute mode (`compute::green`; CUDA 12.4+). The
    // resources are `CUdevResource *`, descriptors and green contexts opaque pointers.
    pub device_get_dev_resource: Option<unsafe extern "C" fn(CUdevice, *mut c_void, c_int) -> CUresult>,
    pub dev_sm_resource_split_by_count: Option<unsafe extern "C" fn(*mut c_void, *mut c_uint, *const c_void, *mut c_void, c_uint, c_uint) -> CUresult>,
    pub dev_resource_generate_desc: Option<unsafe extern "C" fn(*mut *mut c_void, *mut c_void, c_uint) -> CUresult>,
    pub green_ctx_create: Option<unsafe extern "C" fn(*mut *mut c_void, *mut c_void, CUdevice, c_uint) -> CUresult>,
    pub green_ctx_destroy: Option<unsafe extern "C" fn(*mut c_void) -> CUresult>,
    pub ctx_from_green_ctx: Option<unsafe extern "C" fn(*mut CUcontext, *mut c_void) -> CUresult>,
}

/// Looks a function up and types it: `sym!(lib, known, c"name")`.
/// `NVML_ERROR_DRIVER_NOT_LOADED`: NVML's answer on a machine without the NVIDIA kernel driver.
const NVML_ERROR_DRIVER_NOT_LOADED: c_int = 9;

macro_rules! sym {
    ($lib:expr, $known:expr, $name:literal) => {{
        let p = $known($name).unwrap_or_else(|| $lib.function_hashed($name, const { crate::platform::elfsym::gnu_hash($name.to_bytes()) }));
        // SAFETY: a non-NULL result is the library's function of that name, whose C signature
        // is the one of the field it is stored in (cuda.h, nvml.h).
        (!p.is_null()).then(|| unsafe { std::mem::transmute(p) })
    }};
}

impl Api {
    /// No driver: every function absent.
    pub const NONE: Api = Api {
        device_get_attribute: None,
        ctx_create: None,
        ctx_destroy: None,
        primary_ctx_retain: None,
        driver_get_version: None,
        device_get_count: None,
        device_get_name: None,
        device_get_uuid: None,
        device_get_uuid_v2: None,
        ctx_get_device: None,
        ctx_get_current: None,
        ctx_push_current: None,
        ctx_pop_current: None,
        stream_get_ctx: None,
        device_total_mem: None,
        ctx_get_id: None,
        ctx_synchronize: None,
        stream_synchronize: None,
        mem_alloc: None,
        mem_get_info: None,
        primary_ctx_release: None,
        primary_ctx_get_state: None,
        pointer_get_attribute: None,
        device_get_mem_pool: None,
        device_get_default_mem_pool: None,
        mem_pool_get_attribute: None,
        mem_pool_trim_to: None,
        stream_is_capturing: None,
        graph_get_nodes: None,
        graph_node_get_type: None,
        graph_mem_alloc_node_get_params: None,
        device_get_graph_mem_attribute: None,
        func_get_name: None,
        kernel_get_name: None,
        event_create: None,
        event_record: None,
        event_query: None,
        event_elapsed: None,
        event_destroy: None,
        thread_exchange_capture_mode: None,
        device_get_dev_resource: None,
        dev_sm_resource_split_by_count: None,
        dev_resource_generate_desc: None,
        green_ctx_create: None,
        green_ctx_destroy: None,
        ctx_from_green_ctx: None,
    };

    /// `known`: the pointers already looked up (the hooks'), by name; the rest are looked up.
    pub fn load(lib: &Library, known: &dyn Fn(&CStr) -> Option<*mut c_void>) -> Api {
        Api {
            device_get_attribute: sym!(lib, known, c"cuDeviceGetAttribute"),
            ctx_create: sym!(lib, known, c"cuCtxCreate_v2"),
            ctx_destroy: sym!(lib, known, c"cuCtxDestroy_v2"),
            primary_ctx_retain: sym!(lib, known, c"cuDevicePrimaryCtxRetain"),
            driver_get_version: sym!(lib, known, c"cuDriverGetVersion"),
            device_get_count: sym!(lib, known, c"cuDeviceGetCount"),
            device_get_name: sym!(lib, known, c"cuDeviceGetName"),
            device_get_uuid: sym!(lib, known, c"cuDeviceGetUuid"),
            device_get_uuid_v2: sym!(lib, known, c"cuDeviceGetUuid_v2"),
            ctx_get_device: sym!(lib, known, c"cuCtxGetDevice"),
            ctx_get_current: sym!(lib, known, c"cuCtxGetCurrent"),
            ctx_push_current: sym!(lib, known, c"cuCtxPushCurrent_v2"),
            ctx_pop_current: sym!(lib, known, c"cuCtxPopCurrent_v2"),
            stream_get_ctx: sym!(lib, known, c"cuStreamGetCtx"),
            device_total_mem: sym!(lib, known, c"cuDeviceTotalMem_v2"),
            ctx_get_id: sym!(lib, known, c"cuCtxGetId"),
            ctx_synchronize: sym!(lib, known, c"cuCtxSynchronize"),
            stream_synchronize: sym!(lib, known, c"cuStreamSynchronize"),
            mem_alloc: sym!(lib, known, c"cuMemAlloc_v2"),
            mem_get_info: sym!(lib, known, c"cuMemGetInfo_v2"),
            primary_ctx_release: sym!(lib, known, c"cuDevicePrimaryCtxRelease_v2"),
            primary_ctx_get_state: sym!(lib, known, c"cuDevicePrimaryCtxGetState"),
            pointer_get_attribute: sym!(lib, known, c"cuPointerGetAttribute"),
            device_get_mem_pool: sym!(lib, known, c"cuDeviceGetMemPool"),
            device_get_default_mem_pool: sym!(lib, known, c"cuDeviceGetDefaultMemPool"),
            mem_pool_get_attribute: sym!(lib, known, c"cuMemPoolGetAttribute"),
            mem_pool_trim_to: sym!(lib, known, c"cuMemPoolTrimTo"),
            stream_is_capturing: sym!(lib, known, c"cuStreamIsCapturing"),
            graph_get_nodes: sym!(lib, known, c"cuGraphGetNodes"),
            graph_node_get_type: sym!(lib, known, c"cuGraphNodeGetType"),
            graph_mem_alloc_node_get_params: sym!(lib, known, c"cuGraphMemAllocNodeGetParams"),
            device_get_graph_mem_attribute: sym!(lib, known, c"cuDeviceGetGraphMemAttribute"),
            func_get_name: sym!(lib, known, c"cuFuncGetName"),
            kernel_get_name: sym!(lib, known, c"cuKernelGetName"),
            event_create: sym!(lib, known, c"cuEventCreate"),
            event_record: sym!(lib, known, c"cuEventRecord"),
            event_query: sym!(lib, known, c"cuEventQuery"),
            // (CUDA 12.8 added `_v2`, which keeps the same signature; older drivers lack it)
            event_elapsed: sym!(lib, known, c"cuEventElapsedTime_v2").or(sym!(lib, known, c"cuEventElapsedTime")),
            event_destroy: sym!(lib, known, c"cuEventDestroy_v2"),
            thread_exchange_capture_mode: sym!(lib, known, c"cuThreadExchangeStreamCaptureMode"),
            device_get_dev_resource: sym!(lib, known, c"cuDeviceGetDevResource"),
            dev_sm_resource_split_by_count: sym!(lib, known, c"cuDevSmResourceSplitByCount"),
            dev_resource_generate_desc: sym!(lib, known, c"cuDevResourceGenerateDesc"),
            green_ctx_create: sym!(lib, known, c"cuGreenCtxCreate"),
            green_ctx_destroy: sym!(lib, known, c"cuGreenCtxDestroy"),
            ctx_from_green_ctx: sym!(lib, known, c"cuCtxFromGreenCtx"),
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
        if is_default_stream(stream) {
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

    /// The device's UUID by `cuDeviceGetUuid` (under MIG: its GPU's).
    pub fn device_uuid(&self, dev: CUdevice) -> Option<[u8; 16]> {
        Self::uuid_by(self.device_get_uuid?, dev)
    }

    /// The device's own UUID: by `cuDeviceGetUuid_v2` where the driver has it (a MIG
    /// instance's), else as [`Api::device_uuid`].
    pub fn instance_uuid(&self, dev: CUdevice) -> Option<[u8; 16]> {
        Self::uuid_by(self.device_get_uuid_v2.or(self.device_get_uuid)?, dev)
    }

    fn uuid_by(get: unsafe extern "C" fn(*mut [u8; 16], CUdevice) -> CUresult, dev: CUdevice) -> Option<[u8; 16]> {
        let mut id = [0u8; 16];
        // SAFETY: the driver's cuDeviceGetUuid[_v2] with a live out-buffer.
        (unsafe { get(&mut id, dev) } == CUDA_SUCCESS).then_some(id)
    }

    /// The device's physical memory as the driver reports it.
    pub fn physical_total(&self, dev: CUdevice) -> Option<u64> {
        let f = self.device_total_mem?;
        let mut total: usize = 0;
        // SAFETY: valid out-pointer.
        (unsafe { f(&mut total, dev) } == CUDA_SUCCESS).then_some(total as u64)
    }
}

impl Api {
    /// The devices the driver shows, as (name, UUID bytes).
    pub fn devices(&self) -> Vec<(String, [u8; 16])> {
        let (Some(count), Some(name), Some(uuid)) = (self.device_get_count, self.device_get_name, self.device_get_uuid) else {
            return Vec::new();
        };
        let mut n: c_int = 0;
        // SAFETY: valid out-pointer.
        if unsafe { count(&mut n) } != CUDA_SUCCESS {
            return Vec::new();
        }
        (0..n)
            .map(|d| {
                let mut buf = [0 as c_char; 256];
                let mut id = [0u8; 16];
                // SAFETY: the buffers are as large as said; the driver NUL-terminates the name.
                unsafe {
                    name(buf.as_mut_ptr(), buf.len() as c_int - 1, d);
                    uuid(&mut id, d);
                    (CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned(), id)
                }
            })
            .collect()
    }
}

impl Api {
    /// An integer attribute of a driver device.
    pub fn attribute(&self, attr: c_int, dev: CUdevice) -> Option<c_int> {
        let f = self.device_get_attribute?;
        let mut v: c_int = 0;
        // SAFETY: valid out-pointer.
        (unsafe { f(&mut v, attr, dev) } == CUDA_SUCCESS).then_some(v)
    }
}

/// Formats 16 UUID bytes the way CUDA_VISIBLE_DEVICES and NVML write them.
pub fn uuid_string(u: &[u8; 16]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(40);
    s.push_str("GPU-");
    for (i, b) in u.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push(HEX[(b >> 4) as usize] as char);
        s.push(HEX[(b & 15) as usize] as char);
    }
    s
}

pub type NvmlDevice = *mut c_void;

/// `nvmlPciInfo_t`.
#[repr(C)]
pub struct NvmlPciInfo {
    pub bus_id_legacy: [c_char; 16],
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    pub pci_device_id: u32,
    pub pci_subsystem_id: u32,
    pub bus_id: [c_char; 32],
}

/// NVML functions the shim calls itself.
pub struct NvmlApi {
    pub init: Option<unsafe extern "C" fn() -> c_int>,
    pub shutdown: Option<unsafe extern "C" fn() -> c_int>,
    pub count: Option<unsafe extern "C" fn(*mut u32) -> c_int>,
    pub by_index: Option<unsafe extern "C" fn(u32, *mut NvmlDevice) -> c_int>,
    pub by_uuid: Option<unsafe extern "C" fn(*const c_char, *mut NvmlDevice) -> c_int>,
    pub uuid: Option<unsafe extern "C" fn(NvmlDevice, *mut c_char, u32) -> c_int>,
    pub pci: Option<unsafe extern "C" fn(NvmlDevice, *mut NvmlPciInfo) -> c_int>,
    /// `nvmlDeviceGetMemoryInfo` (`nvmlMemory_t`: total, free, used).
    pub memory: Option<unsafe extern "C" fn(NvmlDevice, *mut [u64; 3]) -> c_int>,
}

impl NvmlApi {
    /// `known`: as for [`Api::load`].
    pub fn load(lib: &Library, known: &dyn Fn(&CStr) -> Option<*mut c_void>) -> NvmlApi {
        NvmlApi {
            init: sym!(lib, known, c"nvmlInit_v2"),
            shutdown: sym!(lib, known, c"nvmlShutdown"),
            count: sym!(lib, known, c"nvmlDeviceGetCount_v2"),
            by_index: sym!(lib, known, c"nvmlDeviceGetHandleByIndex_v2"),
            by_uuid: sym!(lib, known, c"nvmlDeviceGetHandleByUUID"),
            uuid: sym!(lib, known, c"nvmlDeviceGetUUID"),
            pci: sym!(lib, known, c"nvmlDeviceGetPciInfo_v3"),
            memory: sym!(lib, known, c"nvmlDeviceGetMemoryInfo"),
        }
    }

    /// The UUID of a device handle, lower case.
    pub fn uuid_of(&self, dev: NvmlDevice) -> Option<String> {
        let f = self.uuid?;
        let mut buf = [0 as c_char; 96];
        // SAFETY: the buffer is as large as said; NVML NUL-terminates.
        (unsafe { f(dev, buf.as_mut_ptr(), buf.len() as u32) } == 0)
            .then(|| unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().to_ascii_lowercase().replacen("gpu-", "GPU-", 1))
    }

    pub fn handle_of(&self, uuid: &str) -> Option<NvmlDevice> {
        let f = self.by_uuid?;
        let c = CString::new(uuid).ok()?;
        let mut dev: NvmlDevice = std::ptr::null_mut();
        // SAFETY: valid string and out-pointer.
        (unsafe { f(c.as_ptr(), &mut dev) } == 0).then_some(dev)
    }

    /// Every physical device, in NVML's order (PCI bus order). Initialises NVML for the time
    /// of the call (NVML counts initialisations, so a program's own stays untouched).
    /// The error [`NvmlApi::inventory`] gives on a machine whose NVIDIA kernel driver is not
    /// loaded (no GPU): the program will find no device, and the shim says nothing about it at
    /// the default log level.
    pub const NO_DRIVER: &'static str = "nvmlInit: the NVIDIA driver is not loaded (error 9)";

    pub fn inventory(&self) -> Result<Vec<Physical>, String> {
        let (init, shutdown, count, by_index, pci, memory) =
            match (self.init, self.shutdown, self.count, self.by_index, self.pci, self.memory) {
                (Some(a), Some(b), Some(c), Some(d), Some(e), Some(f)) => (a, b, c, d, e, f),
                _ => return Err("the NVML library lacks functions the shim needs".into()),
            };
        // SAFETY: plain NVML calls with valid out-pointers; init and shutdown are paired.
        unsafe {
            let r = init();
            if r == NVML_ERROR_DRIVER_NOT_LOADED {
                // a machine without an NVIDIA kernel driver: not worth a warning (CUDA says so)
                return Err(Self::NO_DRIVER.into());
            }
            if r != 0 {
                return Err(format!("nvmlInit failed with error {r}"));
            }
            let mut n = 0u32;
            let mut out = Vec::new();
            let mut failed = count(&mut n) != 0;
            for i in 0..n {
                let mut dev: NvmlDevice = std::ptr::null_mut();
                let mut info: NvmlPciInfo = std::mem::zeroed();
                let mut mem = [0u64; 3];
                if failed || by_index(i, &mut dev) != 0 || pci(dev, &mut info) != 0 || memory(dev, &mut mem) != 0 {
                    failed = true;
                    break;
                }
                let Some(uuid) = self.uuid_of(dev) else {
                    failed = true;
                    break;
                };
                let pci = format!("{:04x}:{:02x}:{:02x}.0", info.domain, info.bus, info.device);
                out.push(Physical { uuid, pci, total: mem[0] });
            }
            shutdown();
            if failed {
                return Err("NVML could not list the devices".into());
            }
            Ok(out)
        }
    }
}

/// One physical device as NVML lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Physical {
    /// `GPU-…`, lower case.
    pub uuid: String,
    /// `0000:3b:00.0`, lower case.
    pub pci: String,
    /// Memory in bytes, as NVML counts it.
    pub total: u64,
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_object_of_an_address_is_the_library_that_holds_it() {
        // the C library's own malloc
        let malloc = super::lookup(libc::RTLD_DEFAULT, c"malloc") as *const std::ffi::c_void;
        let libc_path = super::object_of(malloc).expect("libc");
        assert!(libc_path.to_string_lossy().contains("libc.so"), "{libc_path:?}");
        assert_eq!(super::object_of(std::ptr::null()), None);
        // the main program (this test executable) has no name in the loader's list
        assert_eq!(super::object_of(super::object_of as *const std::ffi::c_void), None);
        // as dladdr says, for a library
        let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
        // SAFETY: dladdr writes `info`; the name it returns is the loader's, NUL-terminated.
        let by_dladdr = unsafe {
            assert_ne!(libc::dladdr(malloc, info.as_mut_ptr()), 0);
            std::ffi::CStr::from_ptr(info.assume_init().dli_fname).to_owned()
        };
        assert_eq!(libc_path, by_dladdr);
    }

    #[test]
    fn uuid_strings_are_written_as_nvml_writes_them() {
        let u = [0x5b, 0x1e, 0xaf, 0x00, 0x12, 0x34, 0xab, 0xcd, 0xef, 0x01, 0x23, 0x45, 0x67, 0x89, 0xff, 0x0a];
        assert_eq!(super::uuid_string(&u), "GPU-5b1eaf00-1234-abcd-ef01-23456789ff0a");
        assert_eq!(super::uuid_string(&[0; 16]), "GPU-00000000-0000-0000-0000-000000000000");
    }
}
