//! `nvmlInternalGetExportTable`: NVML's private table of internal entry points, which the real
//! `nvidia-smi` fetches right after `nvmlInitWithFlags` and without which it stops with
//! "Mismatch in versions between nvidia-smi and NVML".
//!
//! Measured on the real `libnvidia-ml.so.1` (Debian non-free, no GPU needed, before `nvmlInit`):
//! `nvmlReturn_t nvmlInternalGetExportTable(const void **table, const void *id)` answers for
//! the 16-byte id `c4 fe 3e 6c c9 8f 6c 4e a3 27 ee 69 6e 12 f7 c4` a table of pointer-sized
//! slots whose slot 0 is its size in bytes (535.261.03: 1960 = 245 slots, 550.163.01: 2008), some
//! slots NULL; any other id, a NULL id or a NULL out-pointer is `NVML_ERROR_INVALID_ARGUMENT`.
//!
//! The simulation gives the 535 layout: the same size and the same NULL slots, and every other
//! slot a function of its own that answers `NVML_ERROR_NOT_SUPPORTED` unless its meaning is
//! known (slot 81, see [`call`]). With `GPUSIM_TRACE=1` each call prints
//! `gpusim-nvml: internal[slot](a0, a1, a2, a3) = rc`.

use crate::ffi::trace_line;
use crate::types::*;
use std::ffi::c_void;

/// The id of the one table the simulation answers (the bytes as passed, not a UUID string).
pub const TABLE_ID: [u8; 16] = [
    0xc4, 0xfe, 0x3e, 0x6c, 0xc9, 0x8f, 0x6c, 0x4e, 0xa3, 0x27, 0xee, 0x69, 0x6e, 0x12, 0xf7, 0xc4,
];

/// Slots in the 535 table, slot 0 included (slot 0 = `SLOTS * 8`).
pub const SLOTS: usize = 245;

/// Slots the real 535.261.03 table leaves NULL (550 adds 42, 43 and 241).
pub const NULL_SLOTS: [usize; 35] = [
    1, 2, 24, 35, 60, 64, 90, 104, 121, 122, 139, 150, 157, 158, 159, 160, 161, 162, 163, 167, 176,
    177, 178, 187, 190, 191, 198, 201, 202, 207, 211, 216, 217, 235, 236,
];

type SlotFn = unsafe extern "C" fn(usize, usize, usize, usize, usize, usize) -> nvmlReturn_t;

/// One function per slot, so that a call says which slot it came through. The six integer
/// argument registers are read whatever the slot's real arity (reading unused ones is harmless).
unsafe extern "C" fn slot<const N: usize>(
    a0: usize,
    a1: usize,
    a2: usize,
    a3: usize,
    a4: usize,
    a5: usize,
) -> nvmlReturn_t {
    let rc = crate::ffi::guard(|| call(N, [a0, a1, a2, a3, a4, a5]));
    if crate::config::trace_enabled() {
        trace_line(&format!(
            "gpusim-nvml: internal[{N}]({a0:#x}, {a1:#x}, {a2:#x}, {a3:#x}) = {rc}\n"
        ));
    }
    rc
}

/// Slot 81: `(unsigned index, nvmlDevice_t *out, flags)`, the handle of NVML index `index`.
/// nvidia-smi 535 calls it (flags 0x22) for every index before `nvmlDeviceGetHandleByIndex_v2`,
/// which it uses only when this slot fails. Modelled as that public function (as NVIDIA's own
/// NVML mock in k8s-test-infra found for 580); the flags are not interpreted.
pub const SLOT_HANDLE_BY_INDEX: usize = 81;

/// What slot `n` does with its arguments.
fn call(n: usize, a: [usize; 6]) -> Res {
    match n {
        SLOT_HANDLE_BY_INDEX => {
            crate::ffi::need_init()?;
            let out = a[1] as *mut nvmlDevice_t;
            let d = crate::devices::all().get(a[0] as u32 as usize).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
            // SAFETY: the caller passes NULL or a valid out-pointer.
            unsafe { crate::ffi::put(out, d.handle()) }
        }
        _ => Err(NVML_ERROR_NOT_SUPPORTED),
    }
}

macro_rules! row {
    ($hi:literal) => {
        [
            Some(slot::<{ $hi * 16 }> as SlotFn),
            Some(slot::<{ $hi * 16 + 1 }> as SlotFn),
            Some(slot::<{ $hi * 16 + 2 }> as SlotFn),
            Some(slot::<{ $hi * 16 + 3 }> as SlotFn),
            Some(slot::<{ $hi * 16 + 4 }> as SlotFn),
            Some(slot::<{ $hi * 16 + 5 }> as SlotFn),
            Some(slot::<{ $hi * 16 + 6 }> as SlotFn),
            Some(slot::<{ $hi * 16 + 7 }> as SlotFn),
            Some(slot::<{ $hi * 16 + 8 }> as SlotFn),
            Some(slot::<{ $hi * 16 + 9 }> as SlotFn),
            Some(slot::<{ $hi * 16 + 10 }> as SlotFn),
            Some(slot::<{ $hi * 16 + 11 }> as SlotFn),
            Some(slot::<{ $hi * 16 + 12 }> as SlotFn),
            Some(slot::<{ $hi * 16 + 13 }> as SlotFn),
            Some(slot::<{ $hi * 16 + 14 }> as SlotFn),
            Some(slot::<{ $hi * 16 + 15 }> as SlotFn),
        ]
    };
}

/// Every slot function 0..256 (slot 0 is replaced by the size, slots ≥ `SLOTS` unused).
static FUNCTIONS: [[Option<SlotFn>; 16]; 16] = [
    row!(0), row!(1), row!(2), row!(3), row!(4), row!(5), row!(6), row!(7),
    row!(8), row!(9), row!(10), row!(11), row!(12), row!(13), row!(14), row!(15),
];

/// The table handed out: built once, never freed, never written after.
fn table() -> &'static [usize; SLOTS] {
    static TABLE: std::sync::OnceLock<[usize; SLOTS]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = [0usize; SLOTS];
        t[0] = SLOTS * std::mem::size_of::<usize>();
        for (i, s) in t.iter_mut().enumerate().skip(1) {
            if !NULL_SLOTS.contains(&i) {
                *s = FUNCTIONS[i / 16][i % 16].map_or(0, |f| f as usize);
            }
        }
        t
    })
}

/// The body of `nvmlInternalGetExportTable`: needs no `nvmlInit` (as the real one).
///
/// # Safety
/// `out` NULL or valid for a pointer write; `id` NULL or valid for 16 bytes.
pub unsafe fn get_export_table(out: *mut *const c_void, id: *const c_void) -> Res {
    if out.is_null() || id.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let id = std::slice::from_raw_parts(id.cast::<u8>(), 16);
    if id != TABLE_ID {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    out.write(table().as_ptr().cast());
    Ok(())
}
