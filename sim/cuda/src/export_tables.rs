//! `cuGetExportTable`: the private tables the CUDA runtime needs (see
//! NOTES-private-tables.md). Each table is an array of pointer-sized slots built once and never
//! freed; unless noted slot 0 is the table's size in bytes. Slots nobody was seen calling hold
//! distinct stubs that return CUDA_ERROR_NOT_SUPPORTED (and say so under `GPUSIM_TRACE=1`).

use crate::context;
use crate::devices;
use crate::md2;
use crate::types::*;
use std::ffi::c_void;
use std::sync::OnceLock;

/// Table UUIDs, byte for byte as the runtime passes them.
/// Asked first by the runtime; deliberately absent (CUDA_ERROR_NOT_FOUND).
#[allow(dead_code)]
pub const UUID_NOT_FOUND: [u8; 16] = uuid("f8cff951-2146-8b4e-b9e2-fb469e7c0dd9");
pub const UUID_CONTEXT: [u8; 16] = uuid("6bd5fb6c-5bf4-e74a-8987-d93912fd9df9");
pub const UUID_RUNTIME_BUFFERS: [u8; 16] = uuid("a094798c-2e74-2e74-93f2-0800200c0a66");
pub const UUID_42D85A81: [u8; 16] = uuid("42d85a81-23f6-cb47-8298-f6e78a3aecdc");
pub const UUID_21318C60: [u8; 16] = uuid("21318c60-9714-3248-8ca6-41ff7324c8f2");
pub const UUID_CTX_STORAGE: [u8; 16] = uuid("c693336e-1121-df11-a8c3-68f355d89593");
pub const UUID_263E8860: [u8; 16] = uuid("263e8860-7cd2-6143-92f6-bbd5006dfa7e");
pub const UUID_INTEGRITY: [u8; 16] = uuid("d4082055-bde6-704b-8d34-ba123c66e1f2");

/// Parses `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` into its 16 bytes, in written order.
pub const fn uuid(s: &str) -> [u8; 16] {
    let b = s.as_bytes();
    let mut out = [0u8; 16];
    let (mut i, mut n) = (0, 0);
    while i < b.len() {
        if b[i] == b'-' {
            i += 1;
            continue;
        }
        let hi = hexval(b[i]);
        let lo = hexval(b[i + 1]);
        out[n] = hi * 16 + lo;
        n += 1;
        i += 2;
    }
    assert!(n == 16);
    out
}

const fn hexval(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        b'A'..=b'F' => c - b'A' + 10,
        _ => panic!("bad uuid"),
    }
}

/// Key of the integrity HMAC.
const INTEGRITY_KEY: [u8; 16] = [
    0x14, 0x6a, 0xdd, 0xae, 0x53, 0xa9, 0xa7, 0x52, 0xaa, 0x08, 0x41, 0x36, 0x0b, 0xf5, 0x5a, 0x9f,
];

fn slot_trace(what: &str) {
    if crate::config::trace_enabled() {
        crate::ffi::trace_line(&format!("gpusim:   private table: {what}\n"));
    }
}

/// A slot nobody is known to call: table `T`, slot `N`.
extern "C" fn stub<const T: usize, const N: usize>() -> CUresult {
    if crate::config::trace_enabled() {
        crate::ffi::trace_line(&format!(
            "gpusim: private table {T} slot {N} called (stub)\n"
        ));
    }
    CUDA_ERROR_NOT_SUPPORTED
}

macro_rules! stubs {
    ($t:literal; $($n:literal)*) => { [$(stub::<$t, $n> as *const () as usize),*] };
}

// ---- 6bd5fb6c: contexts ----------------------------------------------------------------------

/// Slot 2: retain and return the primary context of a device ordinal.
unsafe extern "C" fn primary_context(out: *mut CUcontext, dev: CUdevice) -> CUresult {
    crate::ffi::guard(|| {
        if out.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let c = context::primary_retain(dev)?;
        put(out, c.handle())
    })
}

/// Slot 12 (13.x): called, result unused; success.
extern "C" fn context_slot12() -> CUresult {
    CUDA_SUCCESS
}

// ---- a094798c: runtime buffers ---------------------------------------------------------------
//
// Slots 2 and 6 are `(void **buffer, size_t *size)`. The runtime checks the sizes against the
// sizes of structures it knows (seen in its code: slot 2 must exceed 0x1e6 bytes for 12.9 and
// 0x236 for 13.5, slot 6 must exceed 13 bytes), so the buffers are large, zeroed and writable.

const RUNTIME_BUFFER_WORDS: usize = 512;
const SLOT2_SIZE: usize = 1024;
const SLOT6_SIZE: usize = 64;
static mut SLOT2_BUFFER: [u64; RUNTIME_BUFFER_WORDS] = [0; RUNTIME_BUFFER_WORDS];
static mut SLOT6_BUFFER: [u64; RUNTIME_BUFFER_WORDS] = [0; RUNTIME_BUFFER_WORDS];

unsafe extern "C" fn runtime_buffer_slot2(buffer: *mut *mut c_void, size: *mut usize) -> CUresult {
    slot_trace("a094798c slot 2");
    put_opt(buffer, (&raw mut SLOT2_BUFFER) as *mut c_void);
    put_opt(size, SLOT2_SIZE);
    CUDA_SUCCESS
}

unsafe extern "C" fn runtime_buffer_slot6(buffer: *mut *mut c_void, size: *mut usize) -> CUresult {
    slot_trace("a094798c slot 6");
    put_opt(buffer, (&raw mut SLOT6_BUFFER) as *mut c_void);
    put_opt(size, SLOT6_SIZE);
    CUDA_SUCCESS
}

// ---- c693336e: context-local storage (no size slot) ------------------------------------------

unsafe extern "C" fn storage_put(
    ctx: CUcontext,
    key: *mut c_void,
    value: *mut c_void,
    dtor: context::StorageDtor,
) -> CUresult {
    crate::ffi::guard(|| context::storage_put(ctx, key, value, dtor))
}

unsafe extern "C" fn storage_delete(ctx: CUcontext, key: *mut c_void) -> CUresult {
    crate::ffi::guard(|| context::storage_delete(ctx, key))
}

unsafe extern "C" fn storage_get(
    value: *mut *mut c_void,
    ctx: CUcontext,
    key: *mut c_void,
) -> CUresult {
    crate::ffi::guard(|| {
        if value.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = context::storage_get(ctx, key)?;
        put(value, v)
    })
}

// ---- 263e8860 --------------------------------------------------------------------------------

unsafe extern "C" fn t263_slot2(
    ctx: CUcontext,
    out1: *mut u32,
    out2: *mut *mut c_void,
) -> CUresult {
    let _ = ctx;
    put_opt(out1, 0);
    put_opt(out2, std::ptr::null_mut());
    CUDA_SUCCESS
}

extern "C" fn t263_slot3() -> u32 {
    0
}

// ---- d4082055: integrity check -----------------------------------------------------------------

unsafe extern "C" fn integrity_check(
    version: u32,
    unix_seconds: u64,
    out: *mut [u64; 2],
) -> CUresult {
    crate::ffi::guard(|| {
        if out.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let t = tables();
        let devices = integrity_devices()?;
        put(
            out,
            integrity_answer(
                version,
                unix_seconds,
                crate::config::get().driver_version as u32,
                libc::getpid() as u32,
                libc::pthread_self() as u64 as u32,
                t.context.as_ptr() as u64,
                t.integrity.as_ptr() as u64,
                integrity_check as *const () as usize as u64,
                &devices,
            ),
        )
    })
}

/// UUID, PCI domain, bus, device.
pub type DeviceFacts = ([u8; 16], i32, i32, i32);

/// The facts hashed per device: UUID, PCI domain, bus, device — of the visible devices, in
/// ordinal order (what the runtime enumerated).
fn integrity_devices() -> Res<Vec<DeviceFacts>> {
    let vis = devices::visible()?;
    let phys = devices::physical();
    Ok(vis
        .iter()
        .map(|&p| {
            (
                phys[p].uuid,
                phys[p].pci_domain,
                phys[p].pci_bus,
                phys[p].pci_device,
            )
        })
        .collect())
}

/// The integrity answer for `version` (pure: every process fact is an argument).
#[allow(clippy::too_many_arguments)]
pub fn integrity_answer(
    version: u32,
    unix_seconds: u64,
    driver_version: u32,
    pid: u32,
    thread_low32: u32,
    context_table: u64,
    integrity_table: u64,
    check_fn: u64,
    devices: &[DeviceFacts],
) -> [u64; 2] {
    match version % 10 {
        0 => return [0x3341181c03cb675c, 0x8ed383aa1f4cd1e8],
        1 => return [0x1841181c03cb675c, 0x8ed383aa1f4cd1e8],
        _ => {}
    }
    let mut m = Vec::with_capacity(48 + 28 * devices.len());
    m.extend_from_slice(&driver_version.to_ne_bytes());
    m.extend_from_slice(&version.to_ne_bytes());
    m.extend_from_slice(&pid.to_ne_bytes());
    m.extend_from_slice(&thread_low32.to_ne_bytes());
    m.extend_from_slice(&context_table.to_ne_bytes());
    m.extend_from_slice(&integrity_table.to_ne_bytes());
    m.extend_from_slice(&check_fn.to_ne_bytes());
    m.extend_from_slice(&unix_seconds.to_ne_bytes());
    for (uuid, domain, bus, dev) in devices {
        m.extend_from_slice(uuid);
        m.extend_from_slice(&domain.to_ne_bytes());
        m.extend_from_slice(&bus.to_ne_bytes());
        m.extend_from_slice(&dev.to_ne_bytes());
    }
    let h = md2::hmac_md2(&INTEGRITY_KEY, &m);
    let mut lo = [0u8; 8];
    let mut hi = [0u8; 8];
    lo.copy_from_slice(&h[..8]);
    hi.copy_from_slice(&h[8..]);
    [u64::from_ne_bytes(lo), u64::from_ne_bytes(hi)]
}

// ---- the tables --------------------------------------------------------------------------------

struct Tables {
    context: &'static [usize],
    runtime_buffers: &'static [usize],
    t42d85a81: &'static [usize],
    t21318c60: &'static [usize],
    storage: &'static [usize],
    t263e8860: &'static [usize],
    integrity: &'static [usize],
}

fn sized(mut slots: Vec<usize>) -> &'static [usize] {
    slots[0] = slots.len() * std::mem::size_of::<usize>();
    Box::leak(slots.into_boxed_slice())
}

fn tables() -> &'static Tables {
    static T: OnceLock<Tables> = OnceLock::new();
    T.get_or_init(|| {
        let mut context = stubs!(1; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15).to_vec();
        context[2] = primary_context as *const () as usize;
        context[12] = context_slot12 as *const () as usize;

        let mut runtime_buffers = stubs!(2; 0 1 2 3 4 5 6 7 8 9).to_vec();
        runtime_buffers[2] = runtime_buffer_slot2 as *const () as usize;
        runtime_buffers[6] = runtime_buffer_slot6 as *const () as usize;

        let mut t263 = stubs!(5; 0 1 2 3 4 5 6 7).to_vec();
        t263[2] = t263_slot2 as *const () as usize;
        t263[3] = t263_slot3 as *const () as usize;

        let mut integrity = stubs!(6; 0 1 2 3).to_vec();
        integrity[1] = integrity_check as *const () as usize;

        let mut storage = stubs!(4; 0 1 2 3 4 5 6 7).to_vec();
        storage[0] = storage_put as *const () as usize;
        storage[1] = storage_delete as *const () as usize;
        storage[2] = storage_get as *const () as usize;

        Tables {
            context: sized(context),
            runtime_buffers: sized(runtime_buffers),
            t42d85a81: sized(stubs!(3; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15).to_vec()),
            t21318c60: sized(stubs!(7; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15).to_vec()),
            storage: Box::leak(storage.into_boxed_slice()),
            t263e8860: sized(t263),
            integrity: sized(integrity),
        }
    })
}

/// The table for `id`, if this driver has one.
pub fn lookup(id: &[u8; 16]) -> Option<*const c_void> {
    let t = tables();
    let table = match *id {
        UUID_CONTEXT => t.context,
        UUID_RUNTIME_BUFFERS => t.runtime_buffers,
        UUID_42D85A81 => t.t42d85a81,
        UUID_21318C60 => t.t21318c60,
        UUID_CTX_STORAGE => t.storage,
        UUID_263E8860 => t.t263e8860,
        UUID_INTEGRITY => t.integrity,
        _ => return None,
    };
    Some(table.as_ptr() as *const c_void)
}

cu_api! {
    fn cuGetExportTable(table: *mut *const c_void, id: *const CUuuid) {
        let id = get(id)?;
        if table.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        match lookup(&id.bytes) {
            Some(t) => put(table, t),
            None => {
                if crate::config::trace_enabled() {
                    crate::ffi::trace_line(&format!(
                        "gpusim:   cuGetExportTable: no table {}\n",
                        devices::uuid_string(&id.bytes).trim_start_matches("GPU-")
                    ));
                }
                put(table, std::ptr::null())?;
                Err(CUDA_ERROR_NOT_FOUND)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_parse_in_written_order() {
        assert_eq!(UUID_CONTEXT[..4], [0x6b, 0xd5, 0xfb, 0x6c]);
        assert_eq!(UUID_INTEGRITY[15], 0xf2);
        assert_eq!(UUID_NOT_FOUND[0], 0xf8);
    }

    #[test]
    fn integrity_constants_and_hash() {
        let devs = [([0x10u8; 16], 0, 0x10, 0)];
        assert_eq!(
            integrity_answer(12090, 1, 13050, 1, 1, 1, 1, 1, &devs),
            [0x3341181c03cb675c, 0x8ed383aa1f4cd1e8]
        );
        assert_eq!(
            integrity_answer(12091, 1, 13050, 1, 1, 1, 1, 1, &devs),
            [0x1841181c03cb675c, 0x8ed383aa1f4cd1e8]
        );
        let a = integrity_answer(12092, 1, 13050, 1, 1, 1, 1, 1, &devs);
        // depends on every device fact and on the device list
        assert_ne!(
            a,
            integrity_answer(
                12092,
                1,
                13050,
                1,
                1,
                1,
                1,
                1,
                &[([0x10u8; 16], 0, 0x20, 0)]
            )
        );
        assert_ne!(a, integrity_answer(12092, 1, 13050, 1, 1, 1, 1, 1, &[]));
        assert_ne!(a, integrity_answer(12092, 2, 13050, 1, 1, 1, 1, 1, &devs));
        assert_eq!(a, integrity_answer(12092, 1, 13050, 1, 1, 1, 1, 1, &devs));
    }

    #[test]
    fn table_shapes() {
        let t = tables();
        assert!(t.runtime_buffers[0] >= 7 * 8);
        assert_eq!(t.context[0], t.context.len() * 8);
        assert!(t.context.len() > 12);
        const {
            assert!(SLOT2_SIZE > 0x236 && SLOT6_SIZE > 13 && SLOT2_SIZE <= RUNTIME_BUFFER_WORDS * 8)
        };
        assert_eq!(t.storage[0], storage_put as *const () as usize);
        assert!(lookup(&UUID_NOT_FOUND).is_none());
    }
}
