//! Legacy CUDA IPC of device memory: `cuIpcGetMemHandle`, `cuIpcOpenMemHandle[_v2]`,
//! `cuIpcCloseMemHandle`.
//!
//! As on the real driver, a handle names a whole `cuMemAlloc`/`cuMemAllocPitch` allocation: a
//! pointer anywhere inside one gives the handle of its base. The 64 bytes of the handle are
//! (little-endian):
//!
//! | bytes | contents |
//! |---|---|
//! | 0..8 | the magic `gpusimIP` |
//! | 8..16 | the allocation's base address |
//! | 16..24 | the allocation's size (the bytes requested) |
//! | 24..32 | its buffer id (`CU_POINTER_ATTRIBUTE_BUFFER_ID`) |
//! | 32..36 | the process id that made the handle |
//! | 36..40 | the physical device |
//! | 40..64 | zero |
//!
//! Simplification: the simulator cannot map another process's memory, so opening is only
//! possible in the process that made the handle (where the real driver refuses), and it simply
//! gives back the allocation's base; a handle from another process is
//! `CUDA_ERROR_NOT_SUPPORTED`. Opening needs a current context; a handle whose allocation has
//! been freed (or whose address now holds another allocation) is `CUDA_ERROR_INVALID_VALUE`.
//! `cuIpcCloseMemHandle` takes a pointer that was opened (and not yet closed as often as
//! opened); anything else is `CUDA_ERROR_INVALID_VALUE`. Closing frees nothing.

use crate::context;
use crate::memory::{self, Kind};
use crate::types::*;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

pub const MAGIC: [u8; 8] = *b"gpusimIP";

/// Base → how many opens are not closed yet.
static OPENED: OnceLock<Mutex<HashMap<u64, u64>>> = OnceLock::new();

fn opened() -> std::sync::MutexGuard<'static, HashMap<u64, u64>> {
    OPENED
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// What a handle says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decoded {
    pub base: u64,
    pub size: u64,
    pub id: u64,
    pub pid: u32,
    pub physical: u32,
}

pub fn encode(d: &Decoded) -> CUipcMemHandle {
    let mut h = CUipcMemHandle { reserved: [0; 64] };
    h.reserved[0..8].copy_from_slice(&MAGIC);
    h.reserved[8..16].copy_from_slice(&d.base.to_le_bytes());
    h.reserved[16..24].copy_from_slice(&d.size.to_le_bytes());
    h.reserved[24..32].copy_from_slice(&d.id.to_le_bytes());
    h.reserved[32..36].copy_from_slice(&d.pid.to_le_bytes());
    h.reserved[36..40].copy_from_slice(&d.physical.to_le_bytes());
    h
}

pub fn decode(h: &CUipcMemHandle) -> Option<Decoded> {
    let r = &h.reserved;
    if r[0..8] != MAGIC {
        return None;
    }
    let u64_at = |i: usize| u64::from_le_bytes(r[i..i + 8].try_into().unwrap_or([0; 8]));
    let u32_at = |i: usize| u32::from_le_bytes(r[i..i + 4].try_into().unwrap_or([0; 4]));
    Some(Decoded {
        base: u64_at(8),
        size: u64_at(16),
        id: u64_at(24),
        pid: u32_at(32),
        physical: u32_at(36),
    })
}

/// The handle of the device allocation containing `dptr`.
fn handle_of(dptr: CUdeviceptr) -> Res<CUipcMemHandle> {
    let (base, a) = memory::find(dptr as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if a.kind != Kind::Device {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(encode(&Decoded {
        base: base as u64,
        size: a.size as u64,
        id: a.id,
        pid: std::process::id(),
        physical: a.physical as u32,
    }))
}

/// The base an opened handle maps to.
fn open(h: &CUipcMemHandle, flags: u32) -> Res<u64> {
    // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1 is the only flag
    if flags & !1 != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    context::current()?;
    let d = decode(h).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if d.pid != std::process::id() {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    match memory::find(d.base as usize) {
        Some((base, a)) if base as u64 == d.base && a.id == d.id && a.kind == Kind::Device => {}
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    }
    *opened().entry(d.base).or_insert(0) += 1;
    Ok(d.base)
}

fn close(dptr: CUdeviceptr) -> Res {
    crate::devices::visible()?;
    let mut m = opened();
    match m.get_mut(&dptr) {
        Some(n) if *n > 1 => *n -= 1,
        Some(_) => {
            m.remove(&dptr);
        }
        None => return Err(CUDA_ERROR_INVALID_VALUE),
    }
    Ok(())
}

cu_api! {
    /// A pointer inside a `cuMemAlloc`/`cuMemAllocPitch` allocation; the handle names its base.
    fn cuIpcGetMemHandle(handle: *mut CUipcMemHandle, dptr: CUdeviceptr) {
        crate::devices::visible()?;
        if handle.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let h = handle_of(dptr)?;
        put(handle, h)
    }

    /// The CUDA 4.1 ABI (same arguments as `_v2`).
    fn cuIpcOpenMemHandle(pdptr: *mut CUdeviceptr, handle: CUipcMemHandle, flags: u32) {
        if pdptr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let base = open(&handle, flags)?;
        put(pdptr, base)
    }

    fn cuIpcOpenMemHandle_v2(pdptr: *mut CUdeviceptr, handle: CUipcMemHandle, flags: u32) {
        if pdptr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let base = open(&handle, flags)?;
        put(pdptr, base)
    }

    fn cuIpcCloseMemHandle(dptr: CUdeviceptr) { close(dptr) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip() {
        let d = Decoded {
            base: 0x7f12_3456_7000,
            size: 1000,
            id: 42,
            pid: 1234,
            physical: 1,
        };
        let h = encode(&d);
        assert_eq!(&h.reserved[0..8], b"gpusimIP");
        assert_eq!(&h.reserved[8..16], &0x7f12_3456_7000u64.to_le_bytes());
        assert!(h.reserved[40..].iter().all(|&b| b == 0));
        assert_eq!(decode(&h), Some(d));
        let mut bad = h;
        bad.reserved[0] = b'x';
        assert_eq!(decode(&bad), None);
    }

    #[test]
    fn get_open_close() {
        use crate::context::*;
        use crate::memory::*;
        let _g = crate::DRIVER_TESTS
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        unsafe {
            assert_eq!(crate::devices::cuInit(0), CUDA_SUCCESS);
            let mut ctx: CUcontext = std::ptr::null_mut();
            assert_eq!(cuCtxCreate_v2(&mut ctx, 0, 0), CUDA_SUCCESS);
            let mut p: CUdeviceptr = 0;
            assert_eq!(cuMemAlloc_v2(&mut p, 1000), CUDA_SUCCESS);
            let mut h = CUipcMemHandle { reserved: [0; 64] };
            assert_eq!(cuIpcGetMemHandle(&mut h, p), CUDA_SUCCESS);
            let d = decode(&h).expect("a simulator handle");
            assert_eq!((d.base, d.size, d.pid), (p, 1000, std::process::id()));
            // an interior pointer names the same allocation
            let mut h2 = CUipcMemHandle { reserved: [1; 64] };
            assert_eq!(cuIpcGetMemHandle(&mut h2, p + 999), CUDA_SUCCESS);
            assert_eq!(h2, h);
            assert_eq!(
                cuIpcGetMemHandle(std::ptr::null_mut(), p),
                CUDA_ERROR_INVALID_VALUE
            );
            assert_eq!(
                cuIpcGetMemHandle(&mut h2, p + 1000),
                CUDA_ERROR_INVALID_VALUE
            );
            assert_eq!(cuIpcGetMemHandle(&mut h2, 0x10), CUDA_ERROR_INVALID_VALUE);
            // managed memory is not legacy-IPC capable
            let mut m: CUdeviceptr = 0;
            assert_eq!(cuMemAllocManaged(&mut m, 4096, 1), CUDA_SUCCESS);
            assert_eq!(cuIpcGetMemHandle(&mut h2, m), CUDA_ERROR_INVALID_VALUE);

            let mut q: CUdeviceptr = 0;
            assert_eq!(cuIpcOpenMemHandle_v2(&mut q, h, 1), CUDA_SUCCESS);
            assert_eq!(q, p);
            assert_eq!(cuIpcOpenMemHandle(&mut q, h, 0), CUDA_SUCCESS);
            assert_eq!(
                cuIpcOpenMemHandle_v2(&mut q, h, 4),
                CUDA_ERROR_INVALID_VALUE
            );
            assert_eq!(
                cuIpcOpenMemHandle_v2(std::ptr::null_mut(), h, 0),
                CUDA_ERROR_INVALID_VALUE
            );
            let mut other_pid = h;
            other_pid.reserved[32..36].copy_from_slice(&(std::process::id() ^ 1).to_le_bytes());
            assert_eq!(
                cuIpcOpenMemHandle_v2(&mut q, other_pid, 0),
                CUDA_ERROR_NOT_SUPPORTED
            );
            assert_eq!(
                cuIpcOpenMemHandle_v2(&mut q, CUipcMemHandle { reserved: [0; 64] }, 0),
                CUDA_ERROR_INVALID_VALUE
            );
            assert_eq!(cuIpcCloseMemHandle(p), CUDA_SUCCESS);
            assert_eq!(cuIpcCloseMemHandle(p), CUDA_SUCCESS);
            assert_eq!(cuIpcCloseMemHandle(p), CUDA_ERROR_INVALID_VALUE);
            assert_eq!(cuIpcCloseMemHandle(p + 512), CUDA_ERROR_INVALID_VALUE);
            // closing frees nothing; a freed allocation's handle no longer opens
            assert_eq!(cuMemFree_v2(p), CUDA_SUCCESS);
            assert_eq!(
                cuIpcOpenMemHandle_v2(&mut q, h, 0),
                CUDA_ERROR_INVALID_VALUE
            );
            assert_eq!(cuMemFree_v2(m), CUDA_SUCCESS);
            assert_eq!(cuCtxDestroy_v2(ctx), CUDA_SUCCESS);
            // no current context
            assert_eq!(
                cuIpcOpenMemHandle_v2(&mut q, h, 0),
                CUDA_ERROR_INVALID_CONTEXT
            );
        }
    }
}
