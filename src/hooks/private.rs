//! The CUDA runtime's private driver tables, made to agree with a split device view.
//!
//! cudart gets two tables through `cuGetExportTable` that speak device ordinals
//! (NOTES-private-tables.md):
//! - `6bd5fb6c…`, slot 2: `CUresult (CUcontext *out, CUdevice ordinal)` — retain and return the
//!   primary context of an ordinal; cudart uses it instead of `cuDevicePrimaryCtxRetain`;
//! - `d4082055…`, slot 1: the integrity check — an HMAC-MD2 over a header (driver version, the
//!   runtime's version, pid, thread, the addresses of both tables *as the runtime got them* and
//!   of the check function, a time) and, per device in ordinal order, its UUID and PCI
//!   domain/bus/device. cudart hashes what *it* saw and fails with error 103 on a mismatch.
//!
//! With virtual devices the program's ordinals are not the driver's, so while devices are split
//! the shim hands the runtime copies of these two tables (allocated once, never freed), equal
//! to the driver's but for those two slots: the context slot speaks program ordinals
//! (`State::retain_primary`), and the check hashes the program's devices
//! (`State::program_devices_facts`) with the copies' addresses and the shim's check function.
//! In the `green` compute mode the same two copies are handed out without a split: the
//! context slot retains the device's green context (`hooks/green.rs`) and the check hashes the
//! driver's own devices. Every other table, and these two when nothing is split and the mode
//! is not `green`, are the driver's own, untouched.
//!
//! A driver table whose shape is not what the runtime is known to use (slot 0 is not a
//! plausible size in bytes) is not handed out at all while devices are split: the driver's own
//! would give the runtime another device view than every public function (the wrong GPU, or a
//! virtual device's context shared with its siblings), silently.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use gpushim_common::once::ForkOnce;

use crate::driver::ffi::*;
use crate::platform::log::{log, Level};
use crate::driver::md2;
use crate::devices::split::DeviceFacts;
use crate::state::{self, State};

/// The runtime's context table (`6bd5fb6c-5bf4-e74a-8987-d93912fd9df9`), byte for byte as
/// passed to `cuGetExportTable`.
pub const UUID_CONTEXT: [u8; 16] =
    [0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9];
/// The integrity-check table (`d4082055-bde6-704b-8d34-ba123c66e1f2`).
pub const UUID_INTEGRITY: [u8; 16] =
    [0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2];

/// The slot of the context table that retains a device's primary context.
const CONTEXT_SLOT: usize = 2;
/// The slot of the integrity table holding the check.
const CHECK_SLOT: usize = 1;
/// The largest table the shim copies (the known ones are well under 1 KiB); a larger "size"
/// means slot 0 is not what the notes say, and reading that much could fault.
const MAX_TABLE_BYTES: usize = 4096;

/// Key of the integrity HMAC.
const INTEGRITY_KEY: [u8; 16] =
    [0x14, 0x6a, 0xdd, 0xae, 0x53, 0xa9, 0xa7, 0x52, 0xaa, 0x08, 0x41, 0x36, 0x0b, 0xf5, 0x5a, 0x9f];

pub type GetExportTable = unsafe extern "C" fn(*mut *const c_void, *const [u8; 16]) -> CUresult;
type CheckFn = unsafe extern "C" fn(u32, u64, *mut [u64; 2]) -> CUresult;

/// A table as handed to the runtime: the shim's copy and the driver's function it replaced.
#[derive(Clone, Copy)]
struct Wrapped {
    table: usize,
    original: usize,
}

/// The copies, each made once per process from the first table the driver returned (`Err`:
/// the driver's table does not have the expected shape, and is refused while split).
static CONTEXT_COPY: ForkOnce<Result<Wrapped, String>> = ForkOnce::new();
static INTEGRITY_COPY: ForkOnce<Result<Wrapped, String>> = ForkOnce::new();

/// `cuGetExportTable` while devices are split or the compute mode is `green` (hook-table
/// entries `split`, `green`): the driver's answer, except the two ordinal-speaking tables,
/// which are the shim's copies.
///
/// # Safety
/// `real` is the driver's `cuGetExportTable`; `table` and `id` are the caller's (checked for
/// NULL here: the driver has already rejected a NULL `table` or `id`).
pub unsafe fn get_export_table(st: &State, real: GetExportTable, table: *mut *const c_void, id: *const [u8; 16]) -> CUresult {
    let result = real(table, id);
    let green = st.needs() & crate::hooks::intercept::NEEDS_GREEN != 0;
    if result != CUDA_SUCCESS || table.is_null() || id.is_null() || (*table).is_null() || !(st.split_configured() || green) {
        return result;
    }
    let (name, copy) = match *id {
        UUID_CONTEXT => ("6bd5fb6c", copy_of(&CONTEXT_COPY, *table, CONTEXT_SLOT, primary_context as *const () as usize)),
        UUID_INTEGRITY => {
            // The check hashes the context table's address as the runtime got it: make sure
            // the copy exists (the runtime asks for it first anyway).
            if CONTEXT_COPY.get().is_none() {
                let mut context: *const c_void = std::ptr::null();
                if real(&mut context, &UUID_CONTEXT) == CUDA_SUCCESS && !context.is_null() {
                    copy_of(&CONTEXT_COPY, context, CONTEXT_SLOT, primary_context as *const () as usize);
                }
            }
            ("d4082055", copy_of(&INTEGRITY_COPY, *table, CHECK_SLOT, integrity_check as *const () as usize))
        }
        other => {
            // For validation on real drivers: which other tables the runtime uses while split.
            log!(Level::Debug, "private table {} passed through", crate::driver::uuid_string(&other).trim_start_matches("GPU-"));
            return result;
        }
    };
    match copy {
        Ok(w) => {
            *table = w.table as *const c_void;
            CUDA_SUCCESS
        }
        Err(why) => {
            log!(Level::Error, "the driver's private table {name} {why}: the CUDA runtime cannot be given the split device view");
            *table = std::ptr::null();
            CUDA_ERROR_NOT_SUPPORTED
        }
    }
}

/// The copy in `cell`, made from `driver` (a table the driver just returned) if there is none
/// yet: slot `slot` replaced by `function`.
///
/// # Safety
/// `driver` is a table returned by the driver's `cuGetExportTable`.
unsafe fn copy_of(cell: &'static ForkOnce<Result<Wrapped, String>>, driver: *const c_void, slot: usize, function: usize) -> &'static Result<Wrapped, String> {
    cell.get_or_init(|| {
        // SAFETY: slot 0 (the table's size) is always there.
        let size = unsafe { *(driver as *const usize) };
        check_size(size, slot)?;
        // SAFETY: `size` bytes are the table's own, and within the bound `check_size` allows.
        let copy = unsafe { copy_table(driver as *const u8, size) };
        let original = copy[slot];
        copy[slot] = function;
        log!(Level::Debug, "private table at {driver:p}: {size} bytes, slot {slot} wrapped");
        Ok(Wrapped { table: copy.as_ptr() as usize, original })
    })
}

/// Whether slot 0 of a table (`size`) is a size in bytes that holds `slot`.
fn check_size(size: usize, slot: usize) -> Result<(), String> {
    let word = std::mem::size_of::<usize>();
    if size < (slot + 1) * word || size > MAX_TABLE_BYTES {
        return Err(format!("has an unexpected size ({size} bytes, slot {slot} needed)"));
    }
    Ok(())
}

/// A leaked copy of the first `size` bytes at `src`, in whole pointer-sized slots (a partial
/// last slot is zero-filled).
///
/// # Safety
/// `src` is readable for `size` bytes.
unsafe fn copy_table(src: *const u8, size: usize) -> &'static mut [usize] {
    let word = std::mem::size_of::<usize>();
    let copy: &'static mut [usize] = Box::leak(vec![0usize; size.div_ceil(word)].into_boxed_slice());
    // SAFETY: `copy` holds at least `size` bytes; the regions are distinct.
    unsafe { std::ptr::copy_nonoverlapping(src, copy.as_mut_ptr() as *mut u8, size) };
    copy
}

// ---- the replaced slots ------------------------------------------------------------------------

/// Context table slot 2: the primary context of a *program* ordinal, retained.
unsafe extern "C" fn primary_context(out: *mut CUcontext, dev: CUdevice) -> CUresult {
    catch_unwind(AssertUnwindSafe(|| {
        if out.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        match state::get_if_ready() {
            Some(st) => match crate::hooks::green::green_share(st, dev) {
                Some(share) => crate::hooks::green::retain(st, dev, share, out),
                None => st.retain_primary(dev, out),
            },
            None => CUDA_ERROR_NOT_INITIALIZED,
        }
    }))
    .unwrap_or(CUDA_ERROR_UNKNOWN)
}

/// Integrity table slot 1, over the program's devices. The two constant answers (versions
/// ending in 0 and 1) are the driver's own.
unsafe extern "C" fn integrity_check(version: u32, unix_seconds: u64, out: *mut [u64; 2]) -> CUresult {
    catch_unwind(AssertUnwindSafe(|| {
        let (Some(Ok(context)), Some(Ok(integrity))) = (CONTEXT_COPY.get(), INTEGRITY_COPY.get()) else {
            // Only reachable through the integrity copy, which exists; without a context
            // table there is nothing the runtime could have hashed.
            return CUDA_ERROR_NOT_INITIALIZED;
        };
        if version % 10 < 2 {
            // SAFETY: the driver's own check, with the caller's arguments.
            return unsafe { std::mem::transmute::<usize, CheckFn>(integrity.original)(version, unix_seconds, out) };
        }
        if out.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let Some(st) = state::get_if_ready() else { return CUDA_ERROR_NOT_INITIALIZED };
        let Some(driver_version) = driver_version(st) else { return CUDA_ERROR_NOT_INITIALIZED };
        let Some(devices) = st.program_devices_facts().or_else(|| driver_facts(st)) else { return CUDA_ERROR_NOT_INITIALIZED };
        let header = Header {
            driver_version,
            version,
            pid: gpushim_common::sys::getpid() as u32,
            // SAFETY: a plain libc call.
            thread: unsafe { libc::pthread_self() } as u64 as u32,
            context_table: context.table as u64,
            integrity_table: integrity.table as u64,
            // What the runtime reads from the slot it was given.
            check_fn: integrity_check as *const () as usize as u64,
            unix_seconds,
        };
        // SAFETY: non-NULL; the caller's buffer of two u64 (written unaligned to be safe).
        unsafe { out.write_unaligned(answer(&header, &devices)) };
        CUDA_SUCCESS
    }))
    .unwrap_or(CUDA_ERROR_UNKNOWN)
}

/// The driver's own devices' facts, in its order (the tables are wrapped without a split in
/// the `green` compute mode: the driver's devices are the program's).
fn driver_facts(st: &State) -> Option<Vec<DeviceFacts>> {
    let api = st.api();
    let devices = api.devices();
    (!devices.is_empty()).then(|| {
        devices
            .iter()
            .enumerate()
            .map(|(d, (_, uuid))| {
                let pci = [50, 33, 34].map(|a| api.attribute(a, d as CUdevice).unwrap_or(0));
                (*uuid, pci[0], pci[1], pci[2])
            })
            .collect()
    })
}

fn driver_version(st: &State) -> Option<u32> {
    let f = st.api().driver_get_version?;
    let mut v = 0;
    // SAFETY: valid out-pointer.
    (unsafe { f(&mut v) } == CUDA_SUCCESS).then_some(v as u32)
}

/// The 48-byte header of the integrity message, field by field in its order.
pub struct Header {
    /// What `cuDriverGetVersion` gave the runtime.
    pub driver_version: u32,
    /// The version the runtime passed.
    pub version: u32,
    pub pid: u32,
    /// The low 32 bits of `pthread_self()` of the calling thread.
    pub thread: u32,
    /// The context table as the runtime got it.
    pub context_table: u64,
    /// The integrity table as the runtime got it.
    pub integrity_table: u64,
    /// The check function (slot 1 of that table).
    pub check_fn: u64,
    pub unix_seconds: u64,
}

/// The answer of the check for a version not ending in 0 or 1: HMAC-MD2 over the header and,
/// per device in ordinal order, UUID, PCI domain, bus, device (native endianness), as two
/// native-endian `u64`.
pub fn answer(h: &Header, devices: &[DeviceFacts]) -> [u64; 2] {
    let mut m = Vec::with_capacity(48 + 28 * devices.len());
    for word in [h.driver_version, h.version, h.pid, h.thread] {
        m.extend_from_slice(&word.to_ne_bytes());
    }
    for word in [h.context_table, h.integrity_table, h.check_fn, h.unix_seconds] {
        m.extend_from_slice(&word.to_ne_bytes());
    }
    for (uuid, domain, bus, device) in devices {
        m.extend_from_slice(uuid);
        for v in [domain, bus, device] {
            m.extend_from_slice(&v.to_ne_bytes());
        }
    }
    let d = md2::hmac_md2(&INTEGRITY_KEY, &m);
    let half = |i: usize| u64::from_ne_bytes(d[i..i + 8].try_into().unwrap_or_default());
    [half(0), half(8)]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    type ContextFn = unsafe extern "C" fn(*mut CUcontext, CUdevice) -> CUresult;

    fn sim_device(p: u8) -> DeviceFacts {
        (std::array::from_fn(|i| 0x10 * (p + 1) + i as u8), 0, 0x10 * (p as i32 + 1), 0)
    }

    fn header(version: u32, driver_version: u32) -> Header {
        Header {
            driver_version,
            version,
            pid: 4242,
            thread: 0xdead_beef,
            context_table: 0x7f00_1234_5678,
            integrity_table: 0x7f00_1234_9abc,
            check_fn: 0x7f00_0000_1111,
            unix_seconds: 1_700_000_000,
        }
    }

    /// The simulated driver's `integrity_answer` (sim/cuda/src/export_tables.rs), which cudart
    /// 12.9 and 13.5 accept, gave these for the same inputs.
    #[test]
    fn answer_equals_the_simulators() {
        let two = [sim_device(0), sim_device(1)];
        assert_eq!(answer(&header(12092, 13050), &two), [0x35a439198b61974d, 0x9d38708d35ba226f]);
        assert_eq!(answer(&header(13052, 13050), &two), [0xdb2e28e17390b00e, 0x33dc434e9e327731]);
        let h = Header {
            driver_version: 12090,
            version: 12092,
            pid: 1,
            thread: 2,
            context_table: 3,
            integrity_table: 4,
            check_fn: 5,
            unix_seconds: 1,
        };
        assert_eq!(answer(&h, &[]), [0xb7341d3137e8cc21, 0x2de2ee2aee3cdce2]);
    }

    #[test]
    fn answer_covers_every_fact() {
        let two = [sim_device(0), sim_device(1)];
        let a = answer(&header(12092, 13050), &two);
        let mut other_uuid = two;
        other_uuid[1].0[15] ^= 1;
        let mut other_bus = two;
        other_bus[0].2 += 1;
        assert_ne!(a, answer(&header(12092, 13050), &other_uuid));
        assert_ne!(a, answer(&header(12092, 13050), &other_bus));
        assert_ne!(a, answer(&header(12092, 13050), &two[..1]));
        assert_ne!(a, answer(&header(12092, 13050), &[two[1], two[0]]));
        assert_ne!(a, answer(&header(12092, 13051), &two));
        let mut h = header(12092, 13050);
        h.context_table += 8;
        assert_ne!(a, answer(&h, &two));
    }

    #[test]
    fn sizes() {
        assert!(check_size(13 * 8, CONTEXT_SLOT).is_ok());
        assert!(check_size(3 * 8, CHECK_SLOT).is_ok());
        assert!(check_size(2 * 8, CHECK_SLOT).is_ok());
        assert!(check_size(8, CHECK_SLOT).is_err());
        assert!(check_size(2 * 8, CONTEXT_SLOT).is_err());
        assert!(check_size(0x7f12_3456_7890, CONTEXT_SLOT).is_err());
    }

    // A fake driver: tables of its own, counting its lookups.
    unsafe extern "C" fn fake_check(version: u32, _: u64, out: *mut [u64; 2]) -> CUresult {
        unsafe { *out = [version as u64, 0xc0de] };
        0
    }
    extern "C" fn fake_other() -> CUresult {
        0
    }
    static CONTEXT: [usize; 13] = {
        let mut t = [0usize; 13];
        t[0] = 13 * 8;
        let mut i = 1;
        while i < 13 {
            t[i] = 0x1000 + i;
            i += 1;
        }
        t
    };
    static mut INTEGRITY: [usize; 3] = [3 * 8, 0, 0];
    static OTHER: [usize; 2] = [16, 0x55];
    static LOOKUPS: AtomicUsize = AtomicUsize::new(0);

    unsafe extern "C" fn fake_get_export_table(table: *mut *const c_void, id: *const [u8; 16]) -> CUresult {
        LOOKUPS.fetch_add(1, Ordering::SeqCst);
        let t: *const c_void = match unsafe { *id } {
            UUID_CONTEXT => CONTEXT.as_ptr() as *const c_void,
            UUID_INTEGRITY => (&raw const INTEGRITY) as *const c_void,
            [0x42, ..] => OTHER.as_ptr() as *const c_void,
            _ => {
                unsafe { *table = std::ptr::null() };
                return CUDA_ERROR_NOT_FOUND;
            }
        };
        unsafe { *table = t };
        0
    }

    fn split_state() -> State {
        let mut st = State::for_tests();
        st.settings.virtual_devices =
            vec![gpushim_common::config::VirtualSplit { selector: gpushim_common::config::Selector::Ordinal(0), sizes: vec![1 << 30, 1 << 30] }];
        assert!(st.split_configured());
        st
    }

    fn ask(st: &State, id: [u8; 16]) -> (CUresult, *const c_void) {
        let mut t: *const c_void = std::ptr::dangling();
        let r = unsafe { get_export_table(st, fake_get_export_table, &mut t, &id) };
        (r, t)
    }

    /// The only test that builds the process-wide copies (from the fake driver above).
    #[test]
    fn tables_are_wrapped_only_when_split_and_only_once() {
        unsafe {
            INTEGRITY[1] = fake_check as *const () as usize;
            INTEGRITY[2] = fake_other as *const () as usize;
        }
        let plain = State::for_tests();
        let (r, t) = ask(&plain, UUID_CONTEXT);
        assert_eq!((r, t), (0, CONTEXT.as_ptr() as *const c_void));
        assert!(CONTEXT_COPY.get().is_none() && INTEGRITY_COPY.get().is_none(), "nothing built without a split");

        let st = split_state();
        let other = [0x42u8; 16];
        assert_eq!(ask(&st, other), (0, OTHER.as_ptr() as *const c_void));
        let (r, _) = ask(&st, [0x99; 16]);
        assert_eq!(r, CUDA_ERROR_NOT_FOUND);

        // The integrity table asked for first: the context copy is made with it (its address
        // is hashed).
        let (r, integ_first) = ask(&st, UUID_INTEGRITY);
        assert_eq!(r, 0);
        assert!(matches!(CONTEXT_COPY.get(), Some(Ok(_))));

        // Many threads at once: the same copies for all.
        let got: Vec<(usize, usize)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|i| {
                    let st = &st;
                    s.spawn(move || {
                        let (a, b) = if i % 2 == 0 { (UUID_CONTEXT, UUID_INTEGRITY) } else { (UUID_INTEGRITY, UUID_CONTEXT) };
                        let (ra, ta) = ask(st, a);
                        let (rb, tb) = ask(st, b);
                        assert_eq!((ra, rb), (0, 0));
                        if i % 2 == 0 { (ta as usize, tb as usize) } else { (tb as usize, ta as usize) }
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let (ctx, integ) = got[0];
        assert!(got.iter().all(|&g| g == (ctx, integ)), "{got:x?}");
        assert_eq!(integ, integ_first as usize);
        assert_ne!(ctx, CONTEXT.as_ptr() as usize);
        assert_ne!(integ, (&raw const INTEGRITY) as usize);

        // Same size and slots, but the wrapped one.
        let ctx = unsafe { std::slice::from_raw_parts(ctx as *const usize, 13) };
        assert_eq!(ctx[0], 13 * 8);
        for i in 1..13 {
            if i == CONTEXT_SLOT {
                assert_eq!(ctx[i], primary_context as *const () as usize);
            } else {
                assert_eq!(ctx[i], CONTEXT[i]);
            }
        }
        let integ = unsafe { std::slice::from_raw_parts(integ as *const usize, 3) };
        assert_eq!(integ, [24, integrity_check as *const () as usize, fake_other as *const () as usize]);

        // Versions ending in 0 and 1 are the driver's answers; others need the published state.
        let check: CheckFn = unsafe { std::mem::transmute::<usize, CheckFn>(integ[CHECK_SLOT]) };
        let mut out = [0u64; 2];
        assert_eq!(unsafe { check(12090, 5, &mut out) }, 0);
        assert_eq!(out, [12090, 0xc0de]);
        assert_eq!(unsafe { check(13051, 5, &mut out) }, 0);
        assert_eq!(out, [13051, 0xc0de]);
        out = [0; 2];
        assert_eq!(unsafe { check(12092, 5, &mut out) }, CUDA_ERROR_NOT_INITIALIZED);
        assert_eq!(out, [0, 0]);
        let context: ContextFn = unsafe { std::mem::transmute::<usize, ContextFn>(ctx[CONTEXT_SLOT]) };
        assert_eq!(unsafe { context(std::ptr::null_mut(), 0) }, CUDA_ERROR_INVALID_VALUE);

        // Later asks: one driver lookup each, the same copy.
        let before = LOOKUPS.load(Ordering::SeqCst);
        let again = ask(&st, UUID_CONTEXT);
        assert_eq!(again, (0, ctx.as_ptr() as *const c_void));
        assert_eq!(LOOKUPS.load(Ordering::SeqCst), before + 1);
    }

    #[test]
    fn copies_keep_the_size_and_refuse_odd_shapes() {
        static ODD: ForkOnce<Result<Wrapped, String>> = ForkOnce::new();
        static BAD: ForkOnce<Result<Wrapped, String>> = ForkOnce::new();
        // 27 bytes: 3 whole slots and 3 bytes of a fourth, copied exactly, the rest zero.
        let odd: [usize; 4] = [27, 0x11, 0x22, 0xffff_ffff_ff33_4455];
        let w = unsafe { copy_of(&ODD, odd.as_ptr() as *const c_void, CHECK_SLOT, 0x99) }.clone().unwrap();
        let copy = unsafe { std::slice::from_raw_parts(w.table as *const usize, 4) };
        assert_eq!(copy, [27, 0x99, 0x22, 0x33_4455]);
        assert_eq!(w.original, 0x11);
        let bad: [usize; 2] = [8, 0x11];
        assert!(unsafe { copy_of(&BAD, bad.as_ptr() as *const c_void, CHECK_SLOT, 0x99) }.is_err());
    }
}
