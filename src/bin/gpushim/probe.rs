//! `gpushim __probe [cuda] [nvml]`: the child `check` starts to see what a program sees. It
//! opens the driver and NVML the way programs do (`dlopen` + `dlsym`, which the shim
//! intercepts when it is preloaded) and prints `key=value` lines:
//!
//! ```text
//! shim=0.1.0                 (gpushim_version, when the library is loaded)
//! cuda.error=…               (the driver could not be opened)
//! cuda.init=0                (cuInit's result; nothing more when it failed)
//! cuda.version=12090
//! cuda.count=2
//! cuda.0.name=…  cuda.0.uuid=GPU-…  cuda.0.pci=0000:3b:00.0  cuda.0.total=BYTES
//! cuda.0.limit=BYTES         (gpushim_memory_usage's effective limit)
//! nvml.error=… | nvml.count=2
//! nvml.0.name=…  nvml.0.uuid=…  nvml.0.pci=…  nvml.0.total=BYTES
//! ```
//!
//! It never creates a context: under `preallocate` that would take the whole limit.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString, OsString};

use crate::Failure;

pub fn main(args: &[OsString]) -> Result<(), Failure> {
    let want = |s: &str| args.iter().any(|a| a == s);
    if let Some(version) = symbol(libc::RTLD_DEFAULT, "gpushim_version") {
        // SAFETY: gpushim_version returns a static NUL-terminated string.
        let v = unsafe { CStr::from_ptr(std::mem::transmute::<*mut c_void, extern "C" fn() -> *const c_char>(version)()) };
        println!("shim={}", v.to_string_lossy());
    }
    if want("cuda") {
        cuda();
    }
    if want("nvml") {
        nvml();
    }
    Ok(())
}

/// `dlopen(path)`, the way a program opens a library.
pub fn open(path: &str) -> Result<*mut c_void, String> {
    let c = CString::new(path).map_err(|_| format!("{path:?}: NUL in the path"))?;
    // SAFETY: `c` is NUL-terminated; dlerror returns NULL or a valid C string.
    unsafe {
        let handle = libc::dlopen(c.as_ptr(), libc::RTLD_NOW);
        if handle.is_null() {
            let e = libc::dlerror();
            return Err(if e.is_null() { format!("cannot open {path}") } else { CStr::from_ptr(e).to_string_lossy().into_owned() });
        }
        Ok(handle)
    }
}

pub fn symbol(handle: *mut c_void, name: &str) -> Option<*mut c_void> {
    let c = CString::new(name).ok()?;
    // SAFETY: `handle` is a dlopen handle or RTLD_DEFAULT; `c` is NUL-terminated.
    let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
    (!p.is_null()).then_some(p)
}

/// Looks `name` up in `handle` as a function of type `F` (a fn pointer type).
macro_rules! func {
    ($handle:expr, $name:literal, $ty:ty) => {
        // SAFETY: the driver exports `$name` with this C signature (cuda.h / nvml.h).
        $crate::probe::symbol($handle, $name).map(|p| unsafe { std::mem::transmute::<*mut std::ffi::c_void, $ty>(p) })
    };
}
pub(crate) use func;

/// A NUL-terminated buffer as text.
pub fn text(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

pub fn library_path(var: &str, default: &str) -> String {
    std::env::var(var).ok().filter(|v| !v.is_empty()).unwrap_or_else(|| default.to_string())
}

fn cuda() {
    let handle = match open(&library_path("GPUSHIM_DRIVER_PATH", "libcuda.so.1")) {
        Ok(h) => h,
        Err(e) => return println!("cuda.error={e}"),
    };
    type Init = unsafe extern "C" fn(c_uint) -> c_int;
    type Int = unsafe extern "C" fn(*mut c_int) -> c_int;
    type Get = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
    type Name = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int;
    type Uuid = unsafe extern "C" fn(*mut [u8; 16], c_int) -> c_int;
    type Total = unsafe extern "C" fn(*mut usize, c_int) -> c_int;
    type Usage = unsafe extern "C" fn(c_int, *mut u64, *mut u64, *mut u64) -> c_int;
    let (Some(init), Some(version), Some(count), Some(get), Some(name), Some(pci), Some(total)) = (
        func!(handle, "cuInit", Init),
        func!(handle, "cuDriverGetVersion", Int),
        func!(handle, "cuDeviceGetCount", Int),
        func!(handle, "cuDeviceGet", Get),
        func!(handle, "cuDeviceGetName", Name),
        func!(handle, "cuDeviceGetPCIBusId", Name),
        func!(handle, "cuDeviceTotalMem_v2", Total),
    ) else {
        return println!("cuda.error=the driver lacks a basic function (cuInit, cuDeviceGet…)");
    };
    let uuid = func!(handle, "cuDeviceGetUuid_v2", Uuid).or_else(|| func!(handle, "cuDeviceGetUuid", Uuid));
    let usage = func!(libc::RTLD_DEFAULT, "gpushim_memory_usage", Usage);
    // SAFETY: the functions have the signatures above; every out-pointer is a live local.
    unsafe {
        let rc = init(0);
        println!("cuda.init={rc}");
        if rc != 0 {
            return;
        }
        let mut v = 0;
        if version(&mut v) == 0 {
            println!("cuda.version={v}");
        }
        let mut n = 0;
        if count(&mut n) != 0 {
            return;
        }
        println!("cuda.count={n}");
        for i in 0..n {
            let mut dev = 0;
            if get(&mut dev, i) != 0 {
                continue;
            }
            let mut buf = [0 as c_char; 256];
            if name(buf.as_mut_ptr(), buf.len() as c_int, dev) == 0 {
                println!("cuda.{i}.name={}", text(&buf));
            }
            if let Some(uuid) = uuid {
                let mut u = [0u8; 16];
                if uuid(&mut u, dev) == 0 {
                    println!("cuda.{i}.uuid={}", format_uuid(&u));
                }
            }
            let mut buf = [0 as c_char; 64];
            if pci(buf.as_mut_ptr(), buf.len() as c_int, dev) == 0 {
                println!("cuda.{i}.pci={}", normal_pci(&text(&buf)));
            }
            let mut bytes = 0usize;
            if total(&mut bytes, dev) == 0 {
                println!("cuda.{i}.total={bytes}");
            }
            let mut limit = 0u64;
            if usage.is_some_and(|f| f(i, std::ptr::null_mut(), std::ptr::null_mut(), &mut limit) == 0) {
                println!("cuda.{i}.limit={limit}");
            }
        }
    }
}

/// A PCI bus id as the shim writes it (`0000:3b:00.0`): NVML writes 8 domain digits, CUDA 4.
fn normal_pci(id: &str) -> String {
    match crate::config::parse_selector(id) {
        Ok(crate::config::Selector::PciBusId(p)) => p,
        _ => id.to_ascii_lowercase(),
    }
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as nvidia-smi prints it.
fn format_uuid(u: &[u8; 16]) -> String {
    let hex: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!("GPU-{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

#[repr(C)]
struct PciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [c_char; 32],
}

/// `nvmlMemory_t`.
#[repr(C)]
pub struct Memory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

fn nvml() {
    let handle = match open(&library_path("GPUSHIM_NVML_PATH", "libnvidia-ml.so.1")) {
        Ok(h) => h,
        Err(e) => return println!("nvml.error={e}"),
    };
    type Init = unsafe extern "C" fn() -> c_int;
    type Count = unsafe extern "C" fn(*mut c_uint) -> c_int;
    type Handle = unsafe extern "C" fn(c_uint, *mut *mut c_void) -> c_int;
    type Text = unsafe extern "C" fn(*mut c_void, *mut c_char, c_uint) -> c_int;
    type Pci = unsafe extern "C" fn(*mut c_void, *mut PciInfo) -> c_int;
    type Mem = unsafe extern "C" fn(*mut c_void, *mut Memory) -> c_int;
    let (Some(init), Some(count), Some(by_index), Some(uuid), Some(name), Some(pci), Some(mem)) = (
        func!(handle, "nvmlInit_v2", Init),
        func!(handle, "nvmlDeviceGetCount_v2", Count),
        func!(handle, "nvmlDeviceGetHandleByIndex_v2", Handle),
        func!(handle, "nvmlDeviceGetUUID", Text),
        func!(handle, "nvmlDeviceGetName", Text),
        func!(handle, "nvmlDeviceGetPciInfo_v3", Pci),
        func!(handle, "nvmlDeviceGetMemoryInfo", Mem),
    ) else {
        return println!("nvml.error=NVML lacks a basic function (nvmlInit_v2, nvmlDeviceGetCount_v2…)");
    };
    // SAFETY: the functions have the signatures above; every out-pointer is a live local.
    unsafe {
        let rc = init();
        if rc != 0 {
            return println!("nvml.error=nvmlInit_v2 returned {rc}");
        }
        let mut n = 0;
        if count(&mut n) != 0 {
            return println!("nvml.error=nvmlDeviceGetCount_v2 failed");
        }
        println!("nvml.count={n}");
        for i in 0..n {
            let mut h = std::ptr::null_mut();
            if by_index(i, &mut h) != 0 {
                continue;
            }
            let mut buf = [0 as c_char; 96];
            if name(h, buf.as_mut_ptr(), buf.len() as c_uint) == 0 {
                println!("nvml.{i}.name={}", text(&buf));
            }
            if uuid(h, buf.as_mut_ptr(), buf.len() as c_uint) == 0 {
                println!("nvml.{i}.uuid={}", text(&buf).to_ascii_lowercase().replacen("gpu-", "GPU-", 1));
            }
            let mut info: PciInfo = std::mem::zeroed();
            if pci(h, &mut info) == 0 {
                println!("nvml.{i}.pci={}", normal_pci(&text(&info.bus_id)));
            }
            let mut m: Memory = std::mem::zeroed();
            if mem(h, &mut m) == 0 {
                println!("nvml.{i}.total={}", m.total);
                println!("nvml.{i}.used={}", m.used);
            }
        }
    }
}
