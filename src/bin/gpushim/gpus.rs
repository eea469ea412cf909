//! The GPUs the driver shows, read through NVML (`libnvidia-ml.so.1`, opened as `probe` opens
//! it): index, UUID, name, total memory, and whether each still answers (`cdi generate`,
//! `device-plugin`).

use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::fmt;

use crate::probe::{self, func, Memory};

/// One GPU as NVML shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// NVML's index (the driver's order, as `nvidia-smi` numbers them).
    pub index: u32,
    /// `GPU-xxxxxxxx-…`, lower case.
    pub uuid: String,
    pub name: String,
    /// Total memory in bytes.
    pub memory: u64,
}

/// What `Nvml::list` found: the GPUs that answer, and those lost (index, why).
#[derive(Debug, Default)]
pub struct Listing {
    pub gpus: Vec<Gpu>,
    pub lost: Vec<(u32, Error)>,
}

/// `GPU-` and 36 characters of lower-case hex digits and dashes in the 8-4-4-4-12 form (or the
/// same after `MIG-`): what NVML reports, and what may go into an environment variable and a
/// quota name unquoted.
pub fn valid_uuid(uuid: &str) -> bool {
    let Some(rest) = uuid.strip_prefix("GPU-").or_else(|| uuid.strip_prefix("MIG-")) else { return false };
    rest.len() == 36
        && rest.bytes().enumerate().all(|(i, b)| if [8, 13, 18, 23].contains(&i) { b == b'-' } else { b.is_ascii_digit() || (b'a'..=b'f').contains(&b) })
}

/// Why the GPUs cannot be listed, said so that a user knows what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// `libnvidia-ml.so.1` cannot be opened.
    NoDriver { path: String, reason: String },
    /// The library lacks a function every NVML since 2015 has.
    MissingFunction { path: String, name: &'static str },
    /// `nvmlInit_v2` failed (a driver/library mismatch, no GPU, no permission on /dev/nvidia*).
    Init { rc: i32 },
    /// A call about the devices failed.
    Call { call: &'static str, index: Option<u32>, rc: i32 },
    /// NVML reported a UUID not of the form `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    BadUuid { index: u32, uuid: String },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NoDriver { path, reason } => write!(
                f,
                "no NVIDIA driver: cannot open {path} ({reason}); install the driver on this machine \
                 (or in the container: NVIDIA's container toolkit mounts it), or name the library with GPUSHIM_NVML_PATH"
            ),
            Error::MissingFunction { path, name } => {
                write!(f, "{path} lacks {name}: not an NVIDIA NVML library, or a very old one; point GPUSHIM_NVML_PATH at the driver's libnvidia-ml.so.1")
            }
            Error::Init { rc } => write!(
                f,
                "NVML initialisation failed ({}, code {rc}); run nvidia-smi to see why (driver/library version mismatch, no GPU, no access to /dev/nvidia*)",
                return_name(*rc)
            ),
            Error::Call { call, index: Some(i), rc } => write!(f, "{call} on GPU {i} failed ({}, code {rc})", return_name(*rc)),
            Error::Call { call, index: None, rc } => write!(f, "{call} failed ({}, code {rc})", return_name(*rc)),
            Error::BadUuid { index, uuid } => {
                write!(f, "GPU {index} reports the UUID {uuid:?}, not of the form GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx: refused")
            }
        }
    }
}

impl std::error::Error for Error {}

/// `NVML_ERROR_GPU_IS_LOST`: the GPU has fallen off the bus or is otherwise inaccessible.
pub const GPU_IS_LOST: i32 = 15;

/// nvml.h's names of the codes a user may meet here.
fn return_name(rc: i32) -> &'static str {
    match rc {
        1 => "NVML_ERROR_UNINITIALIZED",
        2 => "NVML_ERROR_INVALID_ARGUMENT",
        3 => "NVML_ERROR_NOT_SUPPORTED",
        4 => "NVML_ERROR_NO_PERMISSION",
        6 => "NVML_ERROR_NOT_FOUND",
        9 => "NVML_ERROR_DRIVER_NOT_LOADED",
        12 => "NVML_ERROR_LIBRARY_NOT_FOUND",
        GPU_IS_LOST => "NVML_ERROR_GPU_IS_LOST",
        18 => "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
        _ => "an NVML error",
    }
}

type Init = unsafe extern "C" fn() -> c_int;
type Count = unsafe extern "C" fn(*mut c_uint) -> c_int;
type ByIndex = unsafe extern "C" fn(c_uint, *mut *mut c_void) -> c_int;
type ByUuid = unsafe extern "C" fn(*const c_char, *mut *mut c_void) -> c_int;
type Text = unsafe extern "C" fn(*mut c_void, *mut c_char, c_uint) -> c_int;
type Mem = unsafe extern "C" fn(*mut c_void, *mut Memory) -> c_int;

/// NVML, opened and initialised once for the life of the command.
pub struct Nvml {
    count: Count,
    by_index: ByIndex,
    by_uuid: ByUuid,
    uuid: Text,
    name: Text,
    memory: Mem,
}

// SAFETY: the struct holds only function pointers into NVML, which nvml.h documents as
// thread-safe ("NVML is thread-safe so it is safe to make simultaneous NVML calls").
unsafe impl Send for Nvml {}
// SAFETY: as above.
unsafe impl Sync for Nvml {}

impl Nvml {
    /// Opens `libnvidia-ml.so.1` (or `GPUSHIM_NVML_PATH`) and calls `nvmlInit_v2`.
    pub fn open() -> Result<Nvml, Error> {
        let path = probe::library_path("GPUSHIM_NVML_PATH", "libnvidia-ml.so.1");
        let handle = probe::open(&path).map_err(|reason| Error::NoDriver { path: path.clone(), reason })?;
        let missing = |name| Error::MissingFunction { path: path.clone(), name };
        let init = func!(handle, "nvmlInit_v2", Init).ok_or_else(|| missing("nvmlInit_v2"))?;
        let nvml = Nvml {
            count: func!(handle, "nvmlDeviceGetCount_v2", Count).ok_or_else(|| missing("nvmlDeviceGetCount_v2"))?,
            by_index: func!(handle, "nvmlDeviceGetHandleByIndex_v2", ByIndex).ok_or_else(|| missing("nvmlDeviceGetHandleByIndex_v2"))?,
            by_uuid: func!(handle, "nvmlDeviceGetHandleByUUID", ByUuid).ok_or_else(|| missing("nvmlDeviceGetHandleByUUID"))?,
            uuid: func!(handle, "nvmlDeviceGetUUID", Text).ok_or_else(|| missing("nvmlDeviceGetUUID"))?,
            name: func!(handle, "nvmlDeviceGetName", Text).ok_or_else(|| missing("nvmlDeviceGetName"))?,
            memory: func!(handle, "nvmlDeviceGetMemoryInfo", Mem).ok_or_else(|| missing("nvmlDeviceGetMemoryInfo"))?,
        };
        // SAFETY: nvmlInit_v2 takes no argument.
        let rc = unsafe { init() };
        if rc != 0 {
            return Err(Error::Init { rc });
        }
        Ok(nvml)
    }

    /// Every GPU the driver shows, in NVML's order. A GPU that answers
    /// `NVML_ERROR_GPU_IS_LOST` is listed apart, in `lost` (its UUID and memory are unknown:
    /// the caller leaves it out, loudly); any other failure fails the list.
    pub fn list(&self) -> Result<Listing, Error> {
        let mut n: c_uint = 0;
        // SAFETY: `n` is a live local.
        let rc = unsafe { (self.count)(&mut n) };
        if rc != 0 {
            return Err(Error::Call { call: "nvmlDeviceGetCount_v2", index: None, rc });
        }
        let mut out = Listing::default();
        for i in 0..n.min(64) {
            match self.gpu(i) {
                Ok(g) => out.gpus.push(g),
                Err(e @ Error::Call { rc: GPU_IS_LOST, .. }) => out.lost.push((i, e)),
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    fn gpu(&self, index: u32) -> Result<Gpu, Error> {
        let fail = |call, rc| Error::Call { call, index: Some(index), rc };
        let mut h = std::ptr::null_mut();
        // SAFETY: `h` is a live local; the buffers are live locals of the size passed; NVML
        // writes NUL-terminated strings within that size or fails.
        unsafe {
            let rc = (self.by_index)(index, &mut h);
            if rc != 0 {
                return Err(fail("nvmlDeviceGetHandleByIndex_v2", rc));
            }
            let mut buf = [0 as c_char; 96];
            let rc = (self.uuid)(h, buf.as_mut_ptr(), buf.len() as c_uint);
            if rc != 0 {
                return Err(fail("nvmlDeviceGetUUID", rc));
            }
            let uuid = probe::text(&buf).to_ascii_lowercase().replacen("gpu-", "GPU-", 1).replacen("mig-", "MIG-", 1);
            if !valid_uuid(&uuid) {
                return Err(Error::BadUuid { index, uuid });
            }
            let mut buf = [0 as c_char; 96];
            let rc = (self.name)(h, buf.as_mut_ptr(), buf.len() as c_uint);
            if rc != 0 {
                return Err(fail("nvmlDeviceGetName", rc));
            }
            let name = probe::text(&buf);
            let mut m: Memory = std::mem::zeroed();
            let rc = (self.memory)(h, &mut m);
            if rc != 0 {
                return Err(fail("nvmlDeviceGetMemoryInfo", rc));
            }
            Ok(Gpu { index, uuid, name, memory: m.total })
        }
    }

    /// Whether the GPU with this UUID still answers: its handle and its memory figures. A GPU
    /// that has fallen off the bus answers `NVML_ERROR_GPU_IS_LOST` (or is not found).
    pub fn health(&self, uuid: &str) -> Result<(), Error> {
        let Ok(c) = CString::new(uuid) else {
            return Err(Error::Call { call: "nvmlDeviceGetHandleByUUID", index: None, rc: 2 });
        };
        let mut h = std::ptr::null_mut();
        // SAFETY: `c` is NUL-terminated; `h` and `m` are live locals.
        unsafe {
            let rc = (self.by_uuid)(c.as_ptr(), &mut h);
            if rc != 0 {
                return Err(Error::Call { call: "nvmlDeviceGetHandleByUUID", index: None, rc });
            }
            let mut m: Memory = std::mem::zeroed();
            let rc = (self.memory)(h, &mut m);
            if rc != 0 {
                return Err(Error::Call { call: "nvmlDeviceGetMemoryInfo", index: None, rc });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::valid_uuid;

    #[test]
    fn uuid_forms() {
        assert!(valid_uuid("GPU-12345678-9abc-def0-1234-56789abcdef0"));
        assert!(valid_uuid("MIG-12345678-9abc-def0-1234-56789abcdef0"));
        for bad in [
            "",
            "GPU-",
            "gpu-12345678-9abc-def0-1234-56789abcdef0",
            "GPU-12345678-9ABC-def0-1234-56789abcdef0",
            "GPU-12345678-9abc-def0-1234-56789abcdef",
            "GPU-12345678-9abc-def0-1234-56789abcdef0x",
            "GPU-123456789-abc-def0-1234-56789abcdef0",
            "GPU-12345678-9abc-def0-1234-56789abcde,0",
            "GPU-12345678-9abc-def0-1234-56789abcd\nf0",
        ] {
            assert!(!valid_uuid(bad), "{bad:?}");
        }
    }
}
