//! How calls reach the shim: the hook table's machinery, the interposed `dlsym`, and the
//! substitution done for `cuGetProcAddress`.
//!
//! The hooked functions are declared once, as data, with [`hook_table!`] (see `hooks/mod.rs`).
//! Each entry names the exact exported variant (`cuMemAlloc_v2`, `cuMemAllocAsync_ptsz`), the
//! base name and first CUDA version `cuGetProcAddress` knows it by, its C signature and the body
//! that implements it. From that one list come: the `#[no_mangle]` exports (programs linked with
//! `-lcuda`), the table `dlsym` and `cuGetProcAddress` consult, and the slots holding the
//! driver's own pointers. Every other function is handed back as the driver's pointer.
//!
//! An entry may name a fast lane after its body (`=> body, lane path`): the export tries it
//! first, and calls the general path (a function of its own, so that the lane's frame stays
//! small) only when the lane declines (`lane`: the allocation pair).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};

use crate::driver::{self, Lib};
use crate::driver::ffi::*;
use crate::hooks::{BASE_INDEX, BY_BASE, BY_NAME, HOOKS, HOOK_COUNT, NAME_INDEX, REAL};
use crate::state::{self, State};

/// NVML's codes for the failures `enter` reports.
const NVML_ERROR_UNINITIALIZED: c_int = 1;
const NVML_ERROR_FUNCTION_NOT_FOUND: c_int = 13;
const NVML_ERROR_LIBRARY_NOT_FOUND: c_int = 12;
const NVML_ERROR_UNKNOWN: c_int = 999;

/// A function address that may sit in a `static`.
#[derive(Clone, Copy)]
pub struct FnAddr(pub *const ());
// SAFETY: a function address is immutable and valid from every thread.
unsafe impl Sync for FnAddr {}

/// One row of the hook table.
pub struct HookInfo {
    /// The exported symbol, NUL-terminated.
    pub name: &'static str,
    /// The same, as a C string (made at compile time).
    pub cname: &'static CStr,
    /// The name `cuGetProcAddress` is asked with.
    pub base: &'static str,
    /// The first `cudaVersion` for which `cuGetProcAddress` returns this variant.
    pub since: c_int,
    /// Whether this is the per-thread default stream (`_ptsz`/`_ptds`) variant.
    pub per_thread: bool,
    /// When the hook is needed: always (0), or only while devices are split ([`NEEDS_SPLIT`])
    /// and/or a memory mode serves allocations from a reserve ([`NEEDS_POOL`]). When it is not
    /// needed, the driver's own function is handed out, at no cost.
    pub needs: u8,
    /// The shim's implementation.
    pub hook: FnAddr,
    /// The GNU hash of `name` (`elfsym`), for looking the driver's own function up.
    pub gnu_hash: u32,
}

pub use crate::state::{NEEDS_COMPUTE, NEEDS_GREEN, NEEDS_LIMIT, NEEDS_PLACE, NEEDS_POOL, NEEDS_SPLIT};

impl HookInfo {
    /// Whether the hook is handed out when the configuration needs `active` ([`State::needs`]).
    #[inline]
    pub fn wanted(&self, active: u8) -> bool {
        self.needs == 0 || self.needs & active != 0
    }

    #[inline]
    pub fn symbol(&self) -> &'static CStr {
        self.cname
    }

    fn bare_name(&self) -> &'static [u8] {
        let b = self.name.as_bytes();
        &b[..b.len().saturating_sub(1)]
    }

    /// The functions that keep working when the configuration is broken: the ways of looking
    /// functions up (so the program can reach `cuInit` and see it fail).
    fn works_when_broken(&self) -> bool {
        self.base == "cuGetProcAddress"
    }

    pub fn lib(&self) -> Lib {
        Lib::of(self.name)
    }
}

/// Declares the hooked functions; see the module documentation.
macro_rules! hook_table {
    ($( $sym:ident = $base:literal @ $since:literal $($flag:ident)* ( $($arg:ident : $ty:ty),* $(,)? ) => $body:path $(, lane $lane:path)? ; )*) => {
        /// Index of each hook in [`HOOKS`] and [`REAL`].
        #[allow(non_camel_case_types, dead_code, clippy::upper_case_acronyms)]
        #[derive(Clone, Copy, PartialEq, Eq, Debug)]
        #[repr(usize)]
        pub enum Hook { $($sym),* }

        pub const HOOK_COUNT: usize = [$(stringify!($sym)),*].len();

        pub static HOOKS: [$crate::hooks::intercept::HookInfo; HOOK_COUNT] = [$(
            $crate::hooks::intercept::HookInfo {
                name: concat!(stringify!($sym), "\0"),
                cname: match std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($sym), "\0").as_bytes()) {
                    Ok(c) => c,
                    Err(_) => panic!("a hook's name"),
                },
                base: $base,
                since: $since,
                per_thread: false $(|| $crate::hooks::intercept::hook_table!(@per_thread $flag))*,
                needs: 0 $(| $crate::hooks::intercept::hook_table!(@needs $flag))*,
                hook: $crate::hooks::intercept::FnAddr($sym as *const ()),
                gnu_hash: $crate::platform::elfsym::gnu_hash(stringify!($sym).as_bytes()),
            },
        )*];

        /// The hooks' indices in the order of their exported names, and of their base names
        /// (ties in table order): binary searches instead of scans of the whole table for
        /// every `dlsym` and `cuGetProcAddress` of a driver name. Sorted at compile time.
        pub static BY_NAME: [u16; HOOK_COUNT] = $crate::hooks::intercept::sorted(&[$(stringify!($sym)),*]);
        pub static BY_BASE: [u16; HOOK_COUNT] = $crate::hooks::intercept::sorted(&[$($base),*]);
        /// Hash tables of the names in those orders (`NameIndex`).
        pub static NAME_INDEX: $crate::hooks::intercept::NameIndex = $crate::hooks::intercept::NameIndex::of(&[$(stringify!($sym)),*], &BY_NAME);
        pub static BASE_INDEX: $crate::hooks::intercept::NameIndex = $crate::hooks::intercept::NameIndex::of(&[$($base),*], &BY_BASE);

        /// The driver's own pointer for each hook, filled when the driver is opened.
        pub static REAL: [std::sync::atomic::AtomicUsize; HOOK_COUNT] =
            [const { std::sync::atomic::AtomicUsize::new(0) }; HOOK_COUNT];

        $(
            $crate::hooks::intercept::hook_table!(@export $sym { $body } [$($lane)?] [$($flag)*] ($($arg: $ty),*));
        )*
    };
    // A `first` hook: the shim starts, then the body runs with the driver's function only.
    (@export $sym:ident { $body:path } [] [first] ($($arg:ident : $ty:ty),*)) => {
        #[no_mangle]
        pub unsafe extern "C" fn $sym($($arg: $ty),*) -> std::ffi::c_int {
            type Real = unsafe extern "C" fn($($ty),*) -> std::ffi::c_int;
            $crate::hooks::intercept::enter_first(Hook::$sym as usize, |real| {
                // SAFETY: `real` is the driver's own `$sym` (looked up by that exact name),
                // whose C signature is the one declared in this table; the arguments are the
                // program's, passed on unchanged.
                unsafe { $body(std::mem::transmute::<usize, Real>(real), $($arg),*) }
            })
        }
    };
    // A hook without a fast lane: the general path.
    (@export $sym:ident { $body:path } [] [$($flag:ident)*] ($($arg:ident : $ty:ty),*)) => {
        #[no_mangle]
        pub unsafe extern "C" fn $sym($($arg: $ty),*) -> std::ffi::c_int {
            type Real = unsafe extern "C" fn($($ty),*) -> std::ffi::c_int;
            $crate::hooks::intercept::hook_table!(@general $sym Real { $body } ($($arg),*))
        }
    };
    // A hook with a fast lane (`lane`): tried first; the general path is a function of its
    // own, so that the lane's registers and frame stay small.
    (@export $sym:ident { $body:path } [$lane:path] [$($flag:ident)*] ($($arg:ident : $ty:ty),*)) => {
        #[no_mangle]
        pub unsafe extern "C" fn $sym($($arg: $ty),*) -> std::ffi::c_int {
            type Real = unsafe extern "C" fn($($ty),*) -> std::ffi::c_int;
            // SAFETY: the program's arguments, passed on unchanged or checked first (the lane
            // holds the driver's own function, resolved when it opened).
            if let Some(result) = unsafe { $lane($($arg),*) } {
                return result;
            }
            #[cold]
            #[inline(never)]
            unsafe extern "C" fn general($($arg: $ty),*) -> std::ffi::c_int {
                $crate::hooks::intercept::hook_table!(@general $sym Real { $body } ($($arg),*))
            }
            // SAFETY: the program's arguments, passed on unchanged.
            unsafe { general($($arg),*) }
        }
    };
    (@general $sym:ident $real:ident { $body:path } ($($arg:ident),*)) => {
        $crate::hooks::intercept::enter(Hook::$sym as usize, |st, real| {
            // SAFETY: `real` is the driver's own `$sym` (looked up by that exact name),
            // whose C signature is the one declared in this table.
            let real = unsafe { std::mem::transmute::<usize, $real>(real) };
            // SAFETY: the arguments are the program's, passed on unchanged or checked
            // by the body before use.
            unsafe {
                if st.passthrough() {
                    return real($($arg),*);
                }
                $body(st, real, $($arg),*)
            }
        })
    };
    (@per_thread ptsz) => { true };
    (@per_thread $other:ident) => { false };
    (@needs split) => { $crate::hooks::intercept::NEEDS_SPLIT };
    (@needs pool) => { $crate::hooks::intercept::NEEDS_POOL };
    (@needs limit) => { $crate::hooks::intercept::NEEDS_LIMIT };
    (@needs place) => { $crate::hooks::intercept::NEEDS_PLACE };
    (@needs compute) => { $crate::hooks::intercept::NEEDS_COMPUTE };
    (@needs green) => { $crate::hooks::intercept::NEEDS_GREEN };
    (@needs ptsz) => { 0 };
    (@needs first) => { 0 };
}
pub(crate) use hook_table;

/// Runs a hook body with the shim's state and the library's pointer, never letting a panic out.
/// The library is opened here if the program reached the hook directly (an export).
#[inline]
pub fn enter(index: usize, body: impl FnOnce(&'static State, usize) -> c_int) -> c_int {
    let hook = &HOOKS[index];
    let (uninitialised, not_found) = match hook.lib() {
        Lib::Cuda => (CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_NOT_FOUND),
        Lib::Nvml => (NVML_ERROR_UNINITIALIZED, NVML_ERROR_FUNCTION_NOT_FOUND),
    };
    catch_unwind(AssertUnwindSafe(|| {
        let Some(st) = crate::hooks::state() else { return uninitialised };
        // (Acquire: pairs with `resolve_real`'s Release; the driver's code and data, set up
        // by the `dlopen` of whichever thread opened it, are seen before it is called)
        let mut real = REAL[index].load(Acquire);
        // (the pointers are published before the function table, `State::load`: a thread that
        // finds them while another is between the two loads the driver too, harmlessly, so
        // that the body never sees the table missing; under emulation the window was wide
        // enough for `after_cuda_init` to find no devices)
        if real == 0 || !st.opened(hook.lib()) {
            // (with the pointer found as the hint: the copy of the driver the other thread
            // opened, not another one the search would find)
            st.load(hook.lib(), (real != 0).then_some(real as *const c_void), true);
            real = REAL[index].load(Acquire);
            if real == 0 {
                // No driver on this machine: CUDA's own answer for that, quietly.
                if hook.lib() == Lib::Cuda && !st.opened(Lib::Cuda) {
                    return CUDA_ERROR_NO_DEVICE;
                }
                return not_found;
            }
        }
        if st.broken() && !hook.works_when_broken() {
            return uninitialised;
        }
        if hook.lib() == Lib::Nvml && st.nvml_split_failed() {
            return uninitialised;
        }
        body(st, real)
    }))
    .unwrap_or_else(|payload| unwound(index, payload))
}

/// A `first` hook (NVML's initialisation): starts the shim, then calls the driver's own
/// function (`call`) whatever the shim's state: being built on this thread, broken, disabled.
///
/// Why: the real NVML initialises under a lock and, under it, loads the CUDA driver and looks
/// up `cuGetExportTable` through the process' `dlsym`, the shim's. Were the shim to start
/// there, its start-up, which initialises NVML to learn the devices, would wait for that lock
/// on the thread that holds it: `nvidia-smi` and pynvml hung under `GPUSHIM_VISIBLE_DEVICES`
/// on an H100 (driver 580). Started here, before NVML takes its lock, it never does. The real
/// `nvmlInit_v2` also calls `nvmlInitWithFlags` through its PLT, which reaches this again.
pub fn enter_first(index: usize, call: impl FnOnce(usize) -> c_int) -> c_int {
    let hook = &HOOKS[index];
    catch_unwind(AssertUnwindSafe(|| {
        let st = crate::hooks::state();
        // (Acquire: pairs with `resolve_real`'s Release)
        let mut real = REAL[index].load(Acquire);
        if real == 0 {
            if let Some(st) = st {
                st.load(hook.lib(), None, true);
                real = REAL[index].load(Acquire);
            }
        }
        if real == 0 {
            // (inside the shim's own start-up before it opened the library, or no state)
            real = driver::lookup(libc::RTLD_NEXT, hook.symbol()) as usize;
        }
        if real == 0 || real == hook.hook.0 as usize {
            // no NVML in the process (the program found the shim's export by name)
            return NVML_ERROR_LIBRARY_NOT_FOUND;
        }
        call(real)
    }))
    .unwrap_or_else(|payload| unwound(index, payload))
}

/// What a hook whose body unwound answers (`CUDA_ERROR_UNKNOWN`, NVML's unknown error); a
/// one-time step's wait that gave up unwinds with why (`once`), said in one line.
#[cold]
pub fn unwound(index: usize, payload: Box<dyn std::any::Any + Send>) -> c_int {
    let hook = &HOOKS[index];
    if let Some(&stuck) = payload.downcast_ref::<gpushim_common::bounded::Stuck>() {
        crate::platform::log::stuck(hook.name.trim_end_matches('\0'), stuck);
    }
    match hook.lib() {
        Lib::Cuda => CUDA_ERROR_UNKNOWN,
        Lib::Nvml => NVML_ERROR_UNKNOWN,
    }
}

/// `keys`' indices in the order of the keys (a stable insertion sort, at compile time).
pub const fn sorted<const N: usize>(keys: &[&str; N]) -> [u16; N] {
    const fn less(a: &[u8], b: &[u8]) -> bool {
        let mut i = 0;
        while i < a.len() && i < b.len() {
            if a[i] != b[i] {
                return a[i] < b[i];
            }
            i += 1;
        }
        a.len() < b.len()
    }
    assert!(N <= u16::MAX as usize);
    let mut order = [0u16; N];
    let mut i = 0;
    while i < N {
        order[i] = i as u16;
        let mut j = i;
        while j > 0 && less(keys[i].as_bytes(), keys[order[j - 1] as usize].as_bytes()) {
            order[j] = order[j - 1];
            j -= 1;
        }
        order[j] = i as u16;
        i += 1;
    }
    order
}

/// A hash table of names built at compile time: the position of a name in a sorted order of
/// the hook table ([`BY_NAME`], [`BY_BASE`]) in one hash of the name's length and first and
/// last eight bytes, one or two probes and one comparison; a name that is not there is
/// usually told by a 16-bit tag without comparing. (A binary search cost ~360 instructions a
/// name; `cuGetProcAddress` asks for ~420 names at a CUDA runtime's start-up.)
pub struct NameIndex {
    /// Per slot: 0 (empty) or tag << 16 | (position + 1).
    slots: [u32; NAME_SLOTS],
}

const NAME_SLOTS: usize = 1024;

/// Little-endian `u64` of up to eight bytes of `b` from `at` (const: the tables are built with it).
const fn word(b: &[u8], at: usize, n: usize) -> u64 {
    let mut w = 0u64;
    let mut i = 0;
    while i < n {
        w |= (b[at + i] as u64) << (8 * i);
        i += 1;
    }
    w
}

/// The hash both the table and the look-up use.
const fn name_hash_const(name: &[u8]) -> u64 {
    let n = name.len();
    let (first, last) = if n >= 8 { (word(name, 0, 8), word(name, n - 8, 8)) } else { (word(name, 0, n), 0) };
    mix(first, last, n)
}

#[inline(always)]
const fn mix(first: u64, last: u64, n: usize) -> u64 {
    (first ^ last.rotate_left(23) ^ (n as u64) << 56).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

#[inline]
fn name_hash(name: &[u8]) -> u64 {
    let n = name.len();
    if n >= 8 {
        // (two unaligned loads instead of sixteen byte loads)
        let first = u64::from_le_bytes(name[..8].try_into().unwrap_or_default());
        let last = u64::from_le_bytes(name[n - 8..].try_into().unwrap_or_default());
        mix(first, last, n)
    } else {
        name_hash_const(name)
    }
}

impl NameIndex {
    /// The table of `names[order[k]]` → k, for each name its first position in `order`.
    pub const fn of<const N: usize>(names: &[&str; N], order: &[u16; N]) -> NameIndex {
        assert!(N < NAME_SLOTS / 2); // (so also below the 16 bits of a position)
        let mut slots = [0u32; NAME_SLOTS];
        let mut k = 0;
        'names: while k < N {
            let name = names[order[k] as usize].as_bytes();
            let h = name_hash_const(name);
            let tag = (h & 0xffff) as u32;
            let mut slot = (h >> 54) as usize % NAME_SLOTS;
            loop {
                let v = slots[slot];
                if v == 0 {
                    slots[slot] = tag << 16 | (k as u32 + 1);
                    break;
                }
                // (a name already there, from an earlier position: keep the first)
                if v >> 16 == tag && eq(names[order[(v & 0xffff) as usize - 1] as usize].as_bytes(), name) {
                    k += 1;
                    continue 'names;
                }
                slot = (slot + 1) % NAME_SLOTS;
            }
            k += 1;
        }
        NameIndex { slots }
    }

    /// The position of `name`, whose name at a position is `key(position)`.
    #[inline]
    pub fn find(&self, name: &[u8], key: impl Fn(usize) -> &'static [u8]) -> Option<usize> {
        let h = name_hash(name);
        let tag = (h & 0xffff) as u32;
        let mut slot = (h >> 54) as usize % NAME_SLOTS;
        for _ in 0..NAME_SLOTS {
            let v = self.slots[slot];
            if v == 0 {
                return None;
            }
            if v >> 16 == tag && key((v & 0xffff) as usize - 1) == name {
                return Some((v & 0xffff) as usize - 1);
            }
            slot = (slot + 1) % NAME_SLOTS;
        }
        None
    }
}

const fn eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The hook whose exported name is `name` (no allocation, no lock).
fn hook_by_name(name: &[u8]) -> Option<usize> {
    NAME_INDEX.find(name, |k| HOOKS[BY_NAME[k] as usize].bare_name()).map(|k| BY_NAME[k] as usize)
}

/// The hooks whose base name (the name `cuGetProcAddress` is asked with) is `base`, in table
/// order.
fn hooks_by_base(base: &[u8]) -> impl Iterator<Item = usize> + use<'_> {
    let from = BASE_INDEX.find(base, |k| HOOKS[BY_BASE[k] as usize].base.as_bytes()).unwrap_or(HOOK_COUNT);
    BY_BASE[from..].iter().map(|&i| i as usize).take_while(move |&i| HOOKS[i].base.as_bytes() == base)
}

/// The driver's pointers of the hooks, as a set: which hook (if any) a driver address is, in a
/// few loads ([`substitute`] asks for every `cuGetProcAddress`). Open addressing; each slot is
/// `address << 16 | (index + 1)`, claimed with one compare-and-swap (two threads opening the
/// library at once store the same entries; an entry is never removed).
const REAL_SET_SLOTS: usize = 1024;
static REAL_SET: [AtomicU64; REAL_SET_SLOTS] = [const { AtomicU64::new(0) }; REAL_SET_SLOTS];

fn real_set_start(addr: usize) -> usize {
    ((addr as u64 >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54) as usize % REAL_SET_SLOTS
}

/// Records that `addr` is the driver's pointer of hook `index`. An address that does not fit
/// the packing (above 2^48) is not recorded: [`hook_of_real`] then scans [`REAL`].
fn remember_real(addr: usize, index: usize) {
    if addr == 0 || addr as u64 >= 1 << 48 {
        return;
    }
    let entry = (addr as u64) << 16 | (index as u64 + 1);
    let mut slot = real_set_start(addr);
    for _ in 0..REAL_SET_SLOTS {
        match REAL_SET[slot].compare_exchange(0, entry, AcqRel, Acquire) {
            Ok(_) => return,
            Err(seen) if seen == entry => return,
            Err(_) => slot = (slot + 1) % REAL_SET_SLOTS,
        }
    }
}

/// The first hook (in table order) whose driver pointer is `addr`.
fn hook_of_real(addr: usize) -> Option<usize> {
    if addr as u64 >= 1 << 48 {
        return (0..HOOK_COUNT).find(|&i| REAL[i].load(Relaxed) == addr);
    }
    let mut slot = real_set_start(addr);
    let mut first: Option<usize> = None;
    for _ in 0..REAL_SET_SLOTS {
        let entry = REAL_SET[slot].load(Acquire);
        if entry == 0 {
            break;
        }
        if (entry >> 16) as usize == addr {
            let index = (entry & 0xffff) as usize - 1;
            first = Some(first.map_or(index, |f| f.min(index)));
        }
        slot = (slot + 1) % REAL_SET_SLOTS;
    }
    first
}

/// The driver's pointer of a hooked function, once [`resolve_real`] looked it up (NULL: the
/// library lacks it); `None` for a function the shim does not hook.
pub fn resolved(name: &CStr) -> Option<*mut c_void> {
    hook_by_name(name.to_bytes()).map(|i| REAL[i].load(Relaxed) as *mut c_void)
}

/// The hook table as the layers below reach it (`driver::table`): registered by [`state`](crate::hooks::state) before the state first opens a library.
pub static REALS: driver::table::Reals = driver::table::Reals { resolve: resolve_real, resolved };

/// Fills [`REAL`] for the hooks of `which` from the opened library.
pub fn resolve_real(lib: &driver::Library, which: Lib) {
    for (index, (hook, slot)) in HOOKS.iter().zip(REAL.iter()).enumerate() {
        if hook.lib() == which {
            let addr = lib.function_hashed(hook.symbol(), hook.gnu_hash) as usize;
            // (Release: pairs with the Acquire loads of the callers, `enter` and `real_of`)
            slot.store(addr, Release);
            remember_real(addr, index);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// dlsym

/// The interposed `dlsym`. A trampoline: it asks [`dlsym_verdict`] whether the lookup needs the
/// shim; if not (any name but `cu…`/`nvml…`, `RTLD_NEXT`, a function not hooked) it *jumps* to
/// glibc's `dlsym` with the caller's registers and return address untouched, so glibc still
/// resolves relative to the real caller (`RTLD_NEXT`, `RTLD_DEFAULT` from a local scope).
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        // an indirect-branch target under CET/IBT (programs call dlsym through the PLT or a pointer)
        "endbr64",
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {verdict}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 2f",
        "ret",
        "2:",
        "jmp qword ptr [rip + {real}]",
        verdict = sym dlsym_verdict,
        real = sym driver::REAL_DLSYM,
    )
}

/// The same trampoline on aarch64. glibc's `dlsym` takes its caller from the link register
/// (`__builtin_return_address(0)`, x30 at entry), so x30 must hold the program's return address
/// when glibc's function is entered: the trampoline saves x29/x30 and the two arguments in a
/// 32-byte frame (sp stays 16-byte aligned), asks [`dlsym_verdict`], restores them all and
/// then either returns the hook (`ret` through the restored x30) or *branches* (`br`, not `blr`:
/// x30 untouched) to glibc's `dlsym`. The branch goes through x16, an intra-procedure-call
/// scratch register that no argument uses and that BTI accepts for a `bti c` landing pad.
/// `hint #34` is `bti c` (a no-op on cores without BTI): programs reach `dlsym` through a
/// pointer or PLT.
#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "hint #34",
        "stp x29, x30, [sp, #-32]!",
        "mov x29, sp",
        "stp x0, x1, [sp, #16]",
        "bl {verdict}",
        "mov x16, x0",
        "ldp x0, x1, [sp, #16]",
        "ldp x29, x30, [sp], #32",
        "cbz x16, 2f",
        "mov x0, x16",
        "ret",
        "2:",
        "adrp x16, {real}",
        "ldr x16, [x16, #:lo12:{real}]",
        "br x16",
        verdict = sym dlsym_verdict,
        real = sym driver::REAL_DLSYM,
    )
}

/// Elsewhere: the same decision, but glibc sees the shim as the caller (documented).
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let v = dlsym_verdict(handle, symbol);
    if v != 0 {
        return v as *mut c_void;
    }
    driver::real_dlsym()(handle, symbol)
}

/// 0: let glibc answer. Otherwise: the address to return instead (a hook).
/// Also makes sure [`driver::REAL_DLSYM`] is set before returning.
extern "C" fn dlsym_verdict(handle: *mut c_void, symbol: *const c_char) -> usize {
    driver::real_dlsym();
    if symbol.is_null() || handle == libc::RTLD_NEXT {
        return 0;
    }
    // SAFETY: `symbol` is non-NULL and, per dlsym's contract, NUL-terminated. The bytes are
    // read one by one, each only if the previous one was not the terminator.
    let byte = |i: usize| unsafe { *symbol.add(i) } as u8;
    let driver_name = match byte(0) {
        b'c' => byte(1) == b'u',
        b'n' => byte(1) == b'v' && byte(2) == b'm' && byte(3) == b'l',
        _ => false,
    };
    if !driver_name {
        return 0;
    }
    // SAFETY: as above.
    let name = unsafe { CStr::from_ptr(symbol) };
    let Some(index) = hook_by_name(name.to_bytes()) else {
        // Functions that take an NVML device handle: while devices are split, a trampoline that
        // turns virtual devices' handles into NVML's own (slow path: a lock, maybe allocation).
        if crate::hooks::nvml_virtual::takes_device(name.to_bytes()) {
            return catch_unwind(|| crate::hooks::nvml_virtual::lookup(handle, name)).unwrap_or(0);
        }
        return 0;
    };
    catch_unwind(|| hooked_lookup(handle, name, index)).unwrap_or(0)
}

/// A program looked up a function the shim hooks: answer with the hook if glibc's answer is
/// the driver's function (or the shim's own export of it).
#[cold]
fn hooked_lookup(handle: *mut c_void, name: &CStr, index: usize) -> usize {
    let found = driver::lookup(handle, name) as usize;
    if found == 0 {
        return 0;
    }
    let ours = HOOKS[index].hook.0 as usize;
    // The shim's own export (found through RTLD_DEFAULT, where the preloaded library comes
    // first) is the answer whatever the state: its hook passes through, refuses or opens the
    // driver as the settings say when it is called. So that look-up does not start the shim,
    // which needs more stack than the program's look-up may have (README: stack use).
    if found == ours {
        return ours;
    }
    // The driver's own address tells which library the program uses.
    let hint = Some(found as *const c_void);
    let Some(st) = crate::hooks::state() else {
        // This thread's own start-up (a library's own look-ups): the driver's function. Any
        // other thread that could not wait for start-up gets the hook, which refuses until
        // the state exists: never the driver's function unlimited.
        return if state::initialising_here() { 0 } else { ours };
    };
    if st.passthrough() || !HOOKS[index].wanted(st.needs()) {
        return 0;
    }
    st.load(HOOKS[index].lib(), hint, true);
    if found == REAL[index].load(Relaxed) {
        return ours;
    }
    0
}

// ---------------------------------------------------------------------------------------------
// cuGetProcAddress

/// What `cuGetProcAddress(symbol, version, flags)` should hand back, given the driver's answer
/// `found`: the hook of the variant the driver chose, or `found` itself.
///
/// The variant is recognised by identity with the driver's exported functions; if the driver
/// answers with an address that is not one of its exports, the version rules of the table
/// (`since`, per-thread) pick the variant the caller's version and flags select.
/// `symbol` gives the name asked for, measured only when the driver's address is not one of
/// its exports (the common case needs no `strlen`).
pub fn substitute<'a>(st: &State, symbol: &dyn Fn() -> &'a CStr, version: c_int, flags: u64, found: *mut c_void) -> *mut c_void {
    if found.is_null() {
        return found;
    }
    let active = st.needs();
    let wanted = |h: &HookInfo| h.wanted(active);
    if let Some(i) = hook_of_real(found as usize) {
        return if wanted(&HOOKS[i]) { HOOKS[i].hook.0 as *mut c_void } else { found };
    }
    let symbol = symbol();
    let base = symbol.to_bytes();
    let per_thread = flags & PROC_ADDRESS_PER_THREAD != 0;
    let candidates = || hooks_by_base(base).map(|i| &HOOKS[i]).filter(|h| h.since <= version && wanted(h));
    let want_pt = per_thread && candidates().any(|h| h.per_thread);
    match candidates().filter(|h| h.per_thread == want_pt).max_by_key(|h| h.since) {
        Some(h) => {
            crate::platform::log::log!(
                crate::platform::log::Level::Debug,
                "cuGetProcAddress({}, {version}, {flags}): driver answered with an unexported address; using the hook for {}",
                symbol.to_string_lossy(),
                h.symbol().to_string_lossy()
            );
            h.hook.0 as *mut c_void
        }
        None => found,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn dlsym_starts_with_endbr64() {
        // SAFETY: reads the first 4 bytes of a function's code (mapped readable).
        let first = unsafe { std::ptr::read_unaligned(dlsym as *const [u8; 4]) };
        assert_eq!(first, [0xf3, 0x0f, 0x1e, 0xfa]);
    }

    #[test]
    #[cfg(target_arch = "aarch64")]
    fn dlsym_starts_with_bti_c() {
        // SAFETY: reads the first instruction of a function's code (mapped readable).
        let first = unsafe { std::ptr::read_unaligned(dlsym as *const u32) };
        assert_eq!(first, 0xd503245f, "hint #34 (bti c)");
    }

    #[test]
    fn table_names_are_unique_and_nul_terminated() {
        for (i, h) in HOOKS.iter().enumerate() {
            assert!(h.name.ends_with('\0'), "{}", h.name);
            assert!(h.bare_name().starts_with(b"cu") || h.bare_name().starts_with(b"nvml"), "{}", h.name);
            assert_eq!(hook_by_name(h.bare_name()), Some(i), "duplicate {}", h.name);
        }
    }

    #[test]
    fn the_sorted_indexes_agree_with_the_table() {
        for (i, h) in HOOKS.iter().enumerate() {
            let by_base: Vec<usize> = hooks_by_base(h.base.as_bytes()).collect();
            let scanned: Vec<usize> = (0..HOOK_COUNT).filter(|&j| HOOKS[j].base == h.base).collect();
            assert_eq!(by_base, scanned, "{}", h.base);
            assert!(by_base.contains(&i));
        }
        assert_eq!(hook_by_name(b"cuMemAlloc_v"), None);
        assert_eq!(hook_by_name(b""), None);
        assert_eq!(hook_by_name(b"zzz"), None);
        assert_eq!(hooks_by_base(b"cuLaunchKernelEx_").count(), 0);
        // names that differ from a hooked one only inside, or only in length, or are short
        for other in ["cuMemcpyHtoD", "cuMemAllocPitch_v3", "cuMemAlloc_v2_", "cuMemXlloc_v2", "cuMemAllocXsync", "cu", "c", "cuInit_", "cuInix", "nvmlDeviceGetCount_v3"] {
            assert_eq!(hook_by_name(other.as_bytes()), None, "{other}");
            assert_eq!(hooks_by_base(other.as_bytes()).count(), 0, "{other}");
        }
        // every prefix and extension of every name is told apart from it
        for h in &HOOKS {
            let name = h.bare_name();
            for cut in 0..name.len() {
                assert_ne!(hook_by_name(&name[..cut]).map(|i| HOOKS[i].bare_name()), Some(name));
            }
            let longer = [name, b"x"].concat();
            assert_eq!(hook_by_name(&longer), None);
        }
    }

    #[test]
    fn the_runtime_hash_is_the_compile_time_hash() {
        for len in 0..40 {
            let name: Vec<u8> = (0..len).map(|i| b'a' + (i * 7 % 26) as u8).collect();
            assert_eq!(name_hash(&name), name_hash_const(&name), "{len}");
        }
    }

    #[test]
    fn driver_addresses_map_back_to_the_first_hook_that_has_them() {
        // (addresses no driver pointer of the tests can have: the set is process-wide)
        let a = 0x7f12_3456_7000usize;
        assert_eq!(hook_of_real(a), None);
        remember_real(a, 7);
        remember_real(a, 3); // two variants the driver implements with one function
        remember_real(a, 7); // a second thread opening the library stores the same entries
        remember_real(a + 16, 5);
        assert_eq!(hook_of_real(a), Some(3));
        assert_eq!(hook_of_real(a + 16), Some(5));
        assert_eq!(hook_of_real(a + 32), None);
        // many entries starting at the same slot still all resolve
        let colliding: Vec<usize> = (1..2000usize).map(|k| 0x5000_0000 + k * 16).filter(|&x| real_set_start(x) == real_set_start(0x5000_0000)).take(20).collect();
        for (k, &x) in colliding.iter().enumerate() {
            remember_real(x, 100 + k);
        }
        for (k, &x) in colliding.iter().enumerate() {
            assert_eq!(hook_of_real(x), Some(100 + k));
        }
        assert_eq!(hook_of_real(1 << 50), None); // beyond the packing: a scan, which finds nothing
    }

    #[test]
    fn version_rules_pick_the_matching_variant() {
        let fake = 0x1234 as *mut c_void; // not a driver export: forces the rules
        let st = crate::state::State::for_tests();
        let pick = |name: &CStr, v, f| {
            let p = substitute(&st, &|| name, v, f, fake) as usize;
            HOOKS.iter().find(|h| h.hook.0 as usize == p).map(|h| h.bare_name())
        };
        assert_eq!(pick(c"cuMemAlloc", 3020, 0), Some(&b"cuMemAlloc_v2"[..]));
        assert_eq!(pick(c"cuMemAlloc", 12000, 2), Some(&b"cuMemAlloc_v2"[..]));
        assert_eq!(pick(c"cuMemAlloc", 2000, 0), Some(&b"cuMemAlloc"[..]));
        assert_eq!(pick(c"cuMemAllocAsync", 11020, 0), Some(&b"cuMemAllocAsync"[..]));
        assert_eq!(pick(c"cuMemAllocAsync", 11020, 1), Some(&b"cuMemAllocAsync"[..]));
        assert_eq!(pick(c"cuMemAllocAsync", 12090, 2), Some(&b"cuMemAllocAsync_ptsz"[..]));
        assert_eq!(pick(c"cuMemAllocAsync", 11000, 0), None);
        assert_eq!(pick(c"cuGetProcAddress", 12000, 0), Some(&b"cuGetProcAddress_v2"[..]));
        assert_eq!(pick(c"cuGetProcAddress", 11030, 0), Some(&b"cuGetProcAddress"[..]));
        assert_eq!(pick(c"cuLaunchKernel", 12000, 0), None);
    }
}
