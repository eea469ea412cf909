//! NVML handles for virtual devices (`GPUSHIM_VIRTUAL_DEVICES`).
//!
//! A part of a split GPU needs an `nvmlDevice_t` of its own, so that `nvmlDeviceGetIndex`,
//! `nvmlDeviceGetUUID` and the memory numbers can tell the parts apart. NVML has no such handle:
//! a part gets a **fake handle**, the address of an entry of [`FAKES`] (indexed by the program
//! ordinal) that holds the real handle of its GPU. Whole devices keep their real handle.
//!
//! The hooked NVML functions (`hooks/nvml.rs`) understand fake handles. Every other function
//! that may be given a device handle reaches the program through a **trampoline** that swaps a
//! fake handle found in the first or second argument register (`rdi`, `rsi`: two-device
//! functions such as `nvmlDeviceGetP2PStatus` take it in either) for the real one and jumps to
//! NVML's function with every other register and the stack untouched, so the real NVML never
//! sees a handle it does not know. Two ways lead there:
//!
//! - `dlsym` (pynvml, `dlopen` users): while devices are split, `intercept::dlsym_verdict` asks
//!   [`lookup`] for every `nvmlDevice…` name it does not hook (and the few other functions that
//!   take a device: `nvmlGpm…`, `nvmlVgpuTypeGetMaxInstances`). Each function address gets one
//!   stub of a fixed pool ([`POOL`]); the same function always gets the same stub.
//! - programs linked with `-lnvidia-ml` call the exported names directly: the shim exports every
//!   function of `nvml.h` (12.9) that takes a device handle and is not hooked, each a stub that
//!   enters the same pool (see [`EXPORTED`]); it finds NVML's function with
//!   `dlsym(RTLD_NEXT, name)` on first call. Outside a split these stubs cost one test per
//!   argument and a jump; a function NVML lacks answers `NVML_ERROR_FUNCTION_NOT_FOUND`.
//!
//! A pool stub is 16 bytes: `endbr64; lea r11, [rip of itself]; jmp common`. The common stub
//! turns r11 into the slot number, replaces rdi/rsi if they point at a handed-out entry of
//! [`FAKES`], and jumps through [`TRAMP_REAL`]`[slot]` (resolving an exported name's slot first
//! if it is still 0, saving the argument registers around that call). No argument of NVML's
//! API is a floating-point value, so the vector registers are not saved.
//!
//! On aarch64 the same pool and exports, in AArch64 assembly (x0/x1 for rdi/rsi, x16 for r11,
//! a `br` that leaves the return address in x30 for the `jmp`; see the aarch64 `global_asm!`).
//! On other architectures nothing is exported, [`lookup`] hands out NVML's own function and
//! [`fake`] gives no fake handle: the parts of a split GPU then share their GPU's real handle
//! (NVML shows them with one handle, described as the first part).

use std::ffi::CStr;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::driver::NvmlDevice;

/// How many program devices can have a fake handle (program ordinals `0..MAX_FAKES`).
pub const MAX_FAKES: usize = crate::devices::MAX_DEVICES;
/// Size of one [`Fake`]; the trampoline checks handles are multiples of it from [`FAKES`].
const FAKE_SIZE: usize = 16;

/// One fake handle: the real handle of the part's GPU (0 while never handed out), and the
/// program ordinal of the part. The trampoline reads `real` at offset 0.
#[repr(C, align(16))]
pub struct Fake {
    real: AtomicUsize,
    ordinal: AtomicUsize,
}

const _: () = assert!(std::mem::size_of::<Fake>() == FAKE_SIZE);

/// The fake handles, by program ordinal.
pub static FAKES: [Fake; MAX_FAKES] =
    [const { Fake { real: AtomicUsize::new(0), ordinal: AtomicUsize::new(usize::MAX) } }; MAX_FAKES];

/// The fake handle of program device `ordinal`, standing for the real handle `real` of its GPU
/// (updated at each call: NVML may give other handles after a new `nvmlInit`). `None` where no
/// fake handle can be given (an ordinal past [`MAX_FAKES`], a NULL real handle, not x86-64 or aarch64).
pub fn fake(ordinal: usize, real: NvmlDevice) -> Option<NvmlDevice> {
    if !cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) || real.is_null() {
        return None;
    }
    let entry = FAKES.get(ordinal)?;
    entry.ordinal.store(ordinal, Ordering::Relaxed);
    entry.real.store(real as usize, Ordering::Release);
    Some(entry as *const Fake as NvmlDevice)
}

/// The entry `dev` points at, if it is a handed-out fake handle.
fn entry_of(dev: NvmlDevice) -> Option<&'static Fake> {
    let offset = (dev as usize).wrapping_sub(FAKES.as_ptr() as usize);
    if offset >= MAX_FAKES * FAKE_SIZE || !offset.is_multiple_of(FAKE_SIZE) {
        return None;
    }
    let entry = &FAKES[offset / FAKE_SIZE];
    (entry.real.load(Ordering::Acquire) != 0).then_some(entry)
}

/// The program ordinal of a fake handle; `None` for any other value (a real handle).
pub fn fake_ordinal(dev: NvmlDevice) -> Option<usize> {
    entry_of(dev).map(|e| e.ordinal.load(Ordering::Relaxed))
}

/// The real handle `dev` stands for: itself unless it is a fake handle.
pub fn real_of(dev: NvmlDevice) -> NvmlDevice {
    entry_of(dev).map_or(dev, |e| e.real.load(Ordering::Acquire) as NvmlDevice)
}

/// Whether a function looked up by this name may take a device handle, so that it must be
/// handed out through a trampoline while devices are split. Cheap: no lock, no allocation.
#[inline]
pub fn takes_device(name: &[u8]) -> bool {
    name.starts_with(b"nvmlDevice") || name.starts_with(b"nvmlGpm") || name == b"nvmlVgpuTypeGetMaxInstances"
}

// ---------------------------------------------------------------------------------------------
// The trampolines (x86-64 and aarch64)

/// Number of trampoline stubs: the exported names take the first [`EXPORTED`]`.len()`, the
/// functions found through `dlsym` under other names or addresses the rest.
pub const POOL: usize = 512;
/// Size of one pool stub (the common stub divides by it with a shift of 4).
const STUB_SIZE: usize = 16;

const _: () = assert!(STUB_SIZE == 16 && FAKE_SIZE == 16);
const _: () = assert!(EXPORTED_COUNT < POOL);

/// NVML's function behind each stub (0: not resolved yet, only for exported names).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub static TRAMP_REAL: [AtomicUsize; POOL] = [const { AtomicUsize::new(0) }; POOL];

#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    r#"
    .pushsection .text.gpushim_nvml_trampolines,"ax",@progbits
    .balign 16
    .globl gpushim_nvml_pool
    .hidden gpushim_nvml_pool
    .type gpushim_nvml_pool,@function
gpushim_nvml_pool:
    .rept {pool}
    .balign 16
1:
    endbr64
    leaq 1b(%rip), %r11
    jmp gpushim_nvml_common
    .endr
    .size gpushim_nvml_pool, . - gpushim_nvml_pool

    .balign 16
    .globl gpushim_nvml_common
    .hidden gpushim_nvml_common
    .type gpushim_nvml_common,@function
gpushim_nvml_common:
    pushq %rax
    leaq gpushim_nvml_pool(%rip), %r10
    subq %r10, %r11
    shrq $4, %r11
    leaq {fakes}(%rip), %r10
    movq %rdi, %rax
    subq %r10, %rax
    cmpq ${fake_bytes}, %rax
    jae 2f
    testq ${fake_mask}, %rax
    jnz 2f
    cmpq $0, (%rdi)
    je 2f
    movq (%rdi), %rdi
2:
    movq %rsi, %rax
    subq %r10, %rax
    cmpq ${fake_bytes}, %rax
    jae 3f
    testq ${fake_mask}, %rax
    jnz 3f
    cmpq $0, (%rsi)
    je 3f
    movq (%rsi), %rsi
3:
    leaq {reals}(%rip), %r10
    movq (%r10,%r11,8), %r10
    popq %rax
    testq %r10, %r10
    jz 4f
    jmpq *%r10
4:
    pushq %rdi
    pushq %rsi
    pushq %rdx
    pushq %rcx
    pushq %r8
    pushq %r9
    pushq %rax
    movq %r11, %rdi
    call {resolve}
    movq %rax, %r10
    popq %rax
    popq %r9
    popq %r8
    popq %rcx
    popq %rdx
    popq %rsi
    popq %rdi
    testq %r10, %r10
    jz 5f
    jmpq *%r10
5:
    movl ${not_found}, %eax
    ret
    .size gpushim_nvml_common, . - gpushim_nvml_common
    .popsection
"#,
    pool = const POOL,
    fakes = sym FAKES,
    fake_bytes = const MAX_FAKES * FAKE_SIZE,
    fake_mask = const FAKE_SIZE - 1,
    reals = sym TRAMP_REAL,
    resolve = sym resolve_slot,
    not_found = const NVML_ERROR_FUNCTION_NOT_FOUND,
    options(att_syntax)
);

// The same pool on aarch64. A pool stub is 16 bytes, four instructions: `bti c` (`hint #34`: a
// landing pad for the program's `blr`; a no-op on cores without BTI), `adr x16, <itself>`,
// `b common`, and a `nop` filling it to 16 bytes. The common stub turns x16 into the slot
// number, replaces x0/x1 (the first two argument registers) if they point at a handed-out
// entry of [`FAKES`], and *branches* (`br x17`, not `blr`) to NVML's function, so x30 (the
// program's return address), sp and every other argument register reach NVML untouched. It
// uses only registers a called function may destroy and no argument uses: x16/x17 (the
// intra-procedure-call registers, which a `br` to a `bti c` pad must use) and x9–x11. The
// entries and slots are read with `ldar` (load-acquire), pairing with the Release stores of
// [`fake`] and [`dynamic_slot`]/[`resolve_exported`]: aarch64 may otherwise see a slot or
// entry before what was written before it. Resolving an exported name's slot calls
// [`resolve_slot`] in a 96-byte frame (16-byte aligned) saving x29/x30, x0–x7 and x8.
#[cfg(target_arch = "aarch64")]
core::arch::global_asm!(
    r#"
    .pushsection .text.gpushim_nvml_trampolines,"ax",@progbits
    .balign 16
    .globl gpushim_nvml_pool
    .hidden gpushim_nvml_pool
    .type gpushim_nvml_pool,@function
gpushim_nvml_pool:
    .rept {pool}
    .balign 16
1:
    hint #34
    adr x16, 1b
    b gpushim_nvml_common
    nop
    .endr
    .size gpushim_nvml_pool, . - gpushim_nvml_pool

    .balign 16
    .globl gpushim_nvml_common
    .hidden gpushim_nvml_common
    .type gpushim_nvml_common,@function
gpushim_nvml_common:
    adrp x9, gpushim_nvml_pool
    add x9, x9, #:lo12:gpushim_nvml_pool
    sub x16, x16, x9
    lsr x16, x16, #4
    adrp x9, {fakes}
    add x9, x9, #:lo12:{fakes}
    mov x11, #{fake_bytes}
    sub x10, x0, x9
    cmp x10, x11
    b.hs 2f
    tst x10, #{fake_mask}
    b.ne 2f
    ldar x10, [x0]
    cbz x10, 2f
    mov x0, x10
2:
    sub x10, x1, x9
    cmp x10, x11
    b.hs 3f
    tst x10, #{fake_mask}
    b.ne 3f
    ldar x10, [x1]
    cbz x10, 3f
    mov x1, x10
3:
    adrp x9, {reals}
    add x9, x9, #:lo12:{reals}
    add x9, x9, x16, lsl #3
    ldar x17, [x9]
    cbz x17, 4f
    br x17
4:
    stp x29, x30, [sp, #-96]!
    mov x29, sp
    stp x0, x1, [sp, #16]
    stp x2, x3, [sp, #32]
    stp x4, x5, [sp, #48]
    stp x6, x7, [sp, #64]
    str x8, [sp, #80]
    mov x0, x16
    bl {resolve}
    mov x17, x0
    ldr x8, [sp, #80]
    ldp x6, x7, [sp, #64]
    ldp x4, x5, [sp, #48]
    ldp x2, x3, [sp, #32]
    ldp x0, x1, [sp, #16]
    ldp x29, x30, [sp], #96
    cbz x17, 5f
    br x17
5:
    mov w0, #{not_found}
    ret
    .size gpushim_nvml_common, . - gpushim_nvml_common
    .popsection
"#,
    pool = const POOL,
    fakes = sym FAKES,
    fake_bytes = const MAX_FAKES * FAKE_SIZE,
    fake_mask = const FAKE_SIZE - 1,
    reals = sym TRAMP_REAL,
    resolve = sym resolve_slot,
    not_found = const NVML_ERROR_FUNCTION_NOT_FOUND,
);

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const NVML_ERROR_FUNCTION_NOT_FOUND: i32 = 13;

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
unsafe extern "C" {
    /// The first pool stub (defined above); stub `k` is at `+ k * STUB_SIZE`.
    fn gpushim_nvml_pool();
}

/// The address of pool stub `slot`.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn stub(slot: usize) -> usize {
    gpushim_nvml_pool as *const () as usize + slot * STUB_SIZE
}

/// Called by the common stub when an exported name's slot is still 0: NVML's function, or 0
/// (the stub then answers `NVML_ERROR_FUNCTION_NOT_FOUND`).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
extern "C" fn resolve_slot(slot: usize) -> usize {
    std::panic::catch_unwind(|| if slot < EXPORTED.len() { resolve_exported(slot) } else { TRAMP_REAL[slot].load(Ordering::Acquire) })
        .unwrap_or(0)
}

/// NVML's function for exported name `k`: the next definition after the shim (what the program
/// would have called without it), else the one in the NVML library the shim opened.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn resolve_exported(k: usize) -> usize {
    let current = TRAMP_REAL[k].load(Ordering::Acquire);
    if current != 0 {
        return current;
    }
    let Ok(name) = CStr::from_bytes_with_nul(EXPORTED[k].as_bytes()) else { return 0 };
    let mut found = crate::driver::lookup(libc::RTLD_NEXT, name) as usize;
    if found == 0 || in_shim(found) {
        found = nvml_library().map_or(0, |h| crate::driver::lookup(h, name) as usize);
    }
    if found == 0 || in_shim(found) {
        return 0;
    }
    match TRAMP_REAL[k].compare_exchange(0, found, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => found,
        Err(other) => other,
    }
}

/// A `dlopen` handle of the NVML library the shim opened (found from one of its functions).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn nvml_library() -> Option<*mut std::ffi::c_void> {
    static HANDLE: AtomicUsize = AtomicUsize::new(0);
    let h = HANDLE.load(Ordering::Acquire);
    if h != 0 {
        return Some(h as *mut std::ffi::c_void);
    }
    let resolved = || crate::hooks::REAL[crate::hooks::Hook::nvmlDeviceGetIndex as usize].load(Ordering::Acquire);
    // (the shim's start-up fills REAL before it initialises NVML: a call made by NVML's own
    // initialisation, while this thread builds the state, finds the library without the state)
    let mut anchor = resolved();
    if anchor == 0 {
        crate::hooks::state()?.nvml_api()?;
        anchor = resolved();
    }
    if anchor == 0 {
        return None;
    }
    // SAFETY: dladdr only reads the loader's tables; `info` is a valid out-pointer.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    if unsafe { libc::dladdr(anchor as *const std::ffi::c_void, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: a NUL-terminated path from the loader; RTLD_NOLOAD never loads anything new.
    let handle = unsafe { libc::dlopen(info.dli_fname, libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if handle.is_null() {
        return None;
    }
    HANDLE.store(handle as usize, Ordering::Release);
    Some(handle)
}

/// The load address of the object holding `addr` (0: none).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn object_base(addr: usize) -> usize {
    // SAFETY: dladdr only reads the loader's tables; `info` is a valid out-pointer.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    if unsafe { libc::dladdr(addr as *const std::ffi::c_void, &mut info) } == 0 {
        return 0;
    }
    info.dli_fbase as usize
}

/// Whether `addr` lies in the shim itself (one of its exports, found through `RTLD_DEFAULT`).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn in_shim(addr: usize) -> bool {
    let own = object_base(in_shim as *const () as usize);
    own != 0 && object_base(addr) == own
}

/// What `dlsym(handle, name)` should answer while devices are split, for a name that
/// [`takes_device`] and the hook table does not hook: a trampoline in front of the function
/// glibc finds, or 0 to let glibc answer (nothing split, nothing found, the shim's own export,
/// or the pool exhausted). Slow path: takes a lock, may allocate.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub fn lookup(handle: *mut std::ffi::c_void, name: &CStr) -> usize {
    let Some(st) = crate::hooks::state() else { return 0 };
    if !st.split_configured() {
        return 0;
    }
    let found = crate::driver::lookup(handle, name) as usize;
    if found == 0 || in_shim(found) {
        return 0;
    }
    let bytes = name.to_bytes_with_nul();
    if let Some(k) = EXPORTED.iter().position(|n| n.as_bytes() == bytes) {
        if resolve_exported(k) == found {
            return stub(k);
        }
    }
    dynamic_slot(found, name).map_or(0, stub)
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub fn lookup(_: *mut std::ffi::c_void, _: &CStr) -> usize {
    0
}

/// The slot of a function found through `dlsym` (one per address, assigned once).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn dynamic_slot(real: usize, name: &CStr) -> Option<usize> {
    static DYNAMIC: gpushim_common::bounded::Bounded<Vec<usize>> = gpushim_common::bounded::Bounded::new("gpushim's NVML trampolines", Vec::new());
    static EXHAUSTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    // (not to be had, `bounded`: handed out untranslated, as when the pool is exhausted)
    let mut list = DYNAMIC.lock().map_err(|stuck| crate::platform::log::stuck("a trampoline for an NVML function", stuck)).ok()?;
    if let Some(i) = list.iter().position(|&r| r == real) {
        return Some(EXPORTED.len() + i);
    }
    let slot = EXPORTED.len() + list.len();
    if slot >= POOL {
        if !EXHAUSTED.swap(true, Ordering::Relaxed) {
            crate::platform::log::log!(
                crate::platform::log::Level::Warn,
                "{} is handed out without translating virtual devices' NVML handles: all {} trampolines are in use (later such functions too; passing them a virtual device fails)",
                name.to_string_lossy(),
                POOL - EXPORTED.len()
            );
        }
        return None;
    }
    TRAMP_REAL[slot].store(real, Ordering::Release);
    list.push(real);
    Some(slot)
}

// ---------------------------------------------------------------------------------------------
// The exported stubs

macro_rules! exported {
    ($($name:ident),* $(,)?) => {
        #[allow(non_camel_case_types, dead_code, clippy::enum_variant_names)]
        #[repr(usize)]
        enum Exported { $($name),* }

        /// The functions of `nvml.h` (12.9) that take a device handle and that the hook table
        /// does not hook, NUL-terminated; name `k` is exported as a stub entering pool slot `k`.
        #[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))]
        pub static EXPORTED: &[&str] = &[$(concat!(stringify!($name), "\0")),*];

        const EXPORTED_COUNT: usize = [$(stringify!($name)),*].len();

        $(
            #[cfg(target_arch = "x86_64")]
            #[unsafe(naked)]
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn $name() {
                core::arch::naked_asm!(
                    "endbr64",
                    "jmp gpushim_nvml_pool + {offset}",
                    offset = const Exported::$name as usize * STUB_SIZE,
                    options(att_syntax),
                )
            }

            // aarch64: `bti c`, then a direct branch (x30 and the arguments untouched).
            #[cfg(target_arch = "aarch64")]
            #[unsafe(naked)]
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn $name() {
                core::arch::naked_asm!(
                    "hint #34",
                    "b gpushim_nvml_pool + {offset}",
                    offset = const Exported::$name as usize * STUB_SIZE,
                )
            }
        )*
    };
}

exported! {
    nvmlDeviceClearAccountingPids, nvmlDeviceClearCpuAffinity, nvmlDeviceClearEccErrorCounts,
    nvmlDeviceClearFieldValues, nvmlDeviceCreateGpuInstance,
    nvmlDeviceCreateGpuInstanceWithPlacement, nvmlDeviceFreezeNvLinkUtilizationCounter,
    nvmlDeviceGetAPIRestriction, nvmlDeviceGetAccountingBufferSize, nvmlDeviceGetAccountingMode,
    nvmlDeviceGetAccountingPids, nvmlDeviceGetAccountingStats, nvmlDeviceGetActiveVgpus,
    nvmlDeviceGetAdaptiveClockInfoStatus, nvmlDeviceGetApplicationsClock, nvmlDeviceGetArchitecture,
    nvmlDeviceGetAttributes, nvmlDeviceGetAttributes_v2, nvmlDeviceGetAutoBoostedClocksEnabled,
    nvmlDeviceGetBAR1MemoryInfo, nvmlDeviceGetBoardId, nvmlDeviceGetBoardPartNumber,
    nvmlDeviceGetBrand, nvmlDeviceGetBridgeChipInfo, nvmlDeviceGetBusType,
    nvmlDeviceGetC2cModeInfoV, nvmlDeviceGetCapabilities, nvmlDeviceGetClkMonStatus,
    nvmlDeviceGetClock, nvmlDeviceGetClockInfo, nvmlDeviceGetClockOffsets,
    nvmlDeviceGetComputeInstanceId, nvmlDeviceGetComputeMode, nvmlDeviceGetComputeRunningProcesses,
    nvmlDeviceGetComputeRunningProcesses_v2, nvmlDeviceGetComputeRunningProcesses_v3,
    nvmlDeviceGetConfComputeGpuAttestationReport, nvmlDeviceGetConfComputeGpuCertificate,
    nvmlDeviceGetConfComputeMemSizeInfo, nvmlDeviceGetConfComputeProtectedMemoryUsage,
    nvmlDeviceGetCoolerInfo, nvmlDeviceGetCpuAffinity, nvmlDeviceGetCpuAffinityWithinScope,
    nvmlDeviceGetCreatableVgpus, nvmlDeviceGetCudaComputeCapability,
    nvmlDeviceGetCurrPcieLinkGeneration, nvmlDeviceGetCurrPcieLinkWidth,
    nvmlDeviceGetCurrentClockFreqs, nvmlDeviceGetCurrentClocksEventReasons,
    nvmlDeviceGetCurrentClocksThrottleReasons, nvmlDeviceGetDecoderUtilization,
    nvmlDeviceGetDefaultApplicationsClock, nvmlDeviceGetDefaultEccMode,
    nvmlDeviceGetDetailedEccErrors, nvmlDeviceGetDeviceHandleFromMigDeviceHandle,
    nvmlDeviceGetDisplayActive, nvmlDeviceGetDisplayMode, nvmlDeviceGetDramEncryptionMode,
    nvmlDeviceGetDriverModel, nvmlDeviceGetDriverModel_v2, nvmlDeviceGetDynamicPstatesInfo,
    nvmlDeviceGetEccMode, nvmlDeviceGetEncoderCapacity, nvmlDeviceGetEncoderSessions,
    nvmlDeviceGetEncoderStats, nvmlDeviceGetEncoderUtilization, nvmlDeviceGetEnforcedPowerLimit,
    nvmlDeviceGetFBCSessions, nvmlDeviceGetFBCStats, nvmlDeviceGetFanControlPolicy_v2,
    nvmlDeviceGetFanSpeed, nvmlDeviceGetFanSpeedRPM, nvmlDeviceGetFanSpeed_v2,
    nvmlDeviceGetFieldValues, nvmlDeviceGetGpcClkMinMaxVfOffset, nvmlDeviceGetGpcClkVfOffset,
    nvmlDeviceGetGpuFabricInfo, nvmlDeviceGetGpuFabricInfoV, nvmlDeviceGetGpuInstanceById,
    nvmlDeviceGetGpuInstanceId, nvmlDeviceGetGpuInstancePossiblePlacements,
    nvmlDeviceGetGpuInstancePossiblePlacements_v2, nvmlDeviceGetGpuInstanceProfileInfo,
    nvmlDeviceGetGpuInstanceProfileInfoV, nvmlDeviceGetGpuInstanceRemainingCapacity,
    nvmlDeviceGetGpuInstances, nvmlDeviceGetGpuMaxPcieLinkGeneration, nvmlDeviceGetGpuOperationMode,
    nvmlDeviceGetGraphicsRunningProcesses, nvmlDeviceGetGraphicsRunningProcesses_v2,
    nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlDeviceGetGridLicensableFeatures,
    nvmlDeviceGetGridLicensableFeatures_v2, nvmlDeviceGetGridLicensableFeatures_v3,
    nvmlDeviceGetGridLicensableFeatures_v4, nvmlDeviceGetGspFirmwareMode,
    nvmlDeviceGetGspFirmwareVersion, nvmlDeviceGetHostVgpuMode,
    nvmlDeviceGetInforomConfigurationChecksum, nvmlDeviceGetInforomImageVersion,
    nvmlDeviceGetInforomVersion, nvmlDeviceGetIrqNum, nvmlDeviceGetJpgUtilization,
    nvmlDeviceGetLastBBXFlushTime, nvmlDeviceGetMPSComputeRunningProcesses,
    nvmlDeviceGetMPSComputeRunningProcesses_v2, nvmlDeviceGetMPSComputeRunningProcesses_v3,
    nvmlDeviceGetMarginTemperature, nvmlDeviceGetMaxClockInfo, nvmlDeviceGetMaxCustomerBoostClock,
    nvmlDeviceGetMaxMigDeviceCount, nvmlDeviceGetMaxPcieLinkGeneration,
    nvmlDeviceGetMaxPcieLinkWidth, nvmlDeviceGetMemClkMinMaxVfOffset, nvmlDeviceGetMemClkVfOffset,
    nvmlDeviceGetMemoryAffinity, nvmlDeviceGetMemoryBusWidth, nvmlDeviceGetMemoryErrorCounter,
    nvmlDeviceGetMigDeviceHandleByIndex, nvmlDeviceGetMigMode, nvmlDeviceGetMinMaxClockOfPState,
    nvmlDeviceGetMinMaxFanSpeed, nvmlDeviceGetMinorNumber, nvmlDeviceGetModuleId,
    nvmlDeviceGetMultiGpuBoard, nvmlDeviceGetName, nvmlDeviceGetNumFans, nvmlDeviceGetNumGpuCores,
    nvmlDeviceGetNumaNodeId, nvmlDeviceGetNvLinkCapability, nvmlDeviceGetNvLinkErrorCounter,
    nvmlDeviceGetNvLinkRemoteDeviceType, nvmlDeviceGetNvLinkRemotePciInfo,
    nvmlDeviceGetNvLinkRemotePciInfo_v2, nvmlDeviceGetNvLinkState,
    nvmlDeviceGetNvLinkUtilizationControl, nvmlDeviceGetNvLinkUtilizationCounter,
    nvmlDeviceGetNvLinkVersion, nvmlDeviceGetNvlinkBwMode, nvmlDeviceGetNvlinkSupportedBwModes,
    nvmlDeviceGetOfaUtilization, nvmlDeviceGetP2PStatus, nvmlDeviceGetPciInfo,
    nvmlDeviceGetPciInfoExt, nvmlDeviceGetPciInfo_v2, nvmlDeviceGetPciInfo_v3,
    nvmlDeviceGetPcieLinkMaxSpeed, nvmlDeviceGetPcieReplayCounter, nvmlDeviceGetPcieSpeed,
    nvmlDeviceGetPcieThroughput, nvmlDeviceGetPerformanceModes, nvmlDeviceGetPerformanceState,
    nvmlDeviceGetPersistenceMode, nvmlDeviceGetPgpuMetadataString, nvmlDeviceGetPlatformInfo,
    nvmlDeviceGetPowerManagementDefaultLimit, nvmlDeviceGetPowerManagementLimit,
    nvmlDeviceGetPowerManagementLimitConstraints, nvmlDeviceGetPowerManagementMode,
    nvmlDeviceGetPowerSource, nvmlDeviceGetPowerState, nvmlDeviceGetPowerUsage,
    nvmlDeviceGetProcessUtilization, nvmlDeviceGetProcessesUtilizationInfo,
    nvmlDeviceGetRemappedRows, nvmlDeviceGetRetiredPages, nvmlDeviceGetRetiredPagesPendingStatus,
    nvmlDeviceGetRetiredPages_v2, nvmlDeviceGetRowRemapperHistogram,
    nvmlDeviceGetRunningProcessDetailList, nvmlDeviceGetSamples, nvmlDeviceGetSerial,
    nvmlDeviceGetSramEccErrorStatus, nvmlDeviceGetSupportedClocksEventReasons,
    nvmlDeviceGetSupportedClocksThrottleReasons, nvmlDeviceGetSupportedEventTypes,
    nvmlDeviceGetSupportedGraphicsClocks, nvmlDeviceGetSupportedMemoryClocks,
    nvmlDeviceGetSupportedPerformanceStates, nvmlDeviceGetSupportedVgpus,
    nvmlDeviceGetTargetFanSpeed, nvmlDeviceGetTemperature, nvmlDeviceGetTemperatureThreshold,
    nvmlDeviceGetTemperatureV, nvmlDeviceGetThermalSettings, nvmlDeviceGetTopologyCommonAncestor,
    nvmlDeviceGetTopologyNearestGpus, nvmlDeviceGetTotalEccErrors,
    nvmlDeviceGetTotalEnergyConsumption, nvmlDeviceGetUtilizationRates, nvmlDeviceGetVbiosVersion,
    nvmlDeviceGetVgpuCapabilities, nvmlDeviceGetVgpuHeterogeneousMode,
    nvmlDeviceGetVgpuInstancesUtilizationInfo, nvmlDeviceGetVgpuMetadata,
    nvmlDeviceGetVgpuProcessUtilization, nvmlDeviceGetVgpuProcessesUtilizationInfo,
    nvmlDeviceGetVgpuSchedulerCapabilities, nvmlDeviceGetVgpuSchedulerLog,
    nvmlDeviceGetVgpuSchedulerState, nvmlDeviceGetVgpuTypeCreatablePlacements,
    nvmlDeviceGetVgpuTypeSupportedPlacements, nvmlDeviceGetVgpuUtilization,
    nvmlDeviceGetViolationStatus, nvmlDeviceGetVirtualizationMode, nvmlDeviceIsMigDeviceHandle,
    nvmlDeviceOnSameBoard, nvmlDevicePowerSmoothingActivatePresetProfile,
    nvmlDevicePowerSmoothingSetState, nvmlDevicePowerSmoothingUpdatePresetProfileParam,
    nvmlDeviceRegisterEvents, nvmlDeviceResetApplicationsClocks, nvmlDeviceResetGpuLockedClocks,
    nvmlDeviceResetMemoryLockedClocks, nvmlDeviceResetNvLinkErrorCounters,
    nvmlDeviceResetNvLinkUtilizationCounter, nvmlDeviceSetAPIRestriction,
    nvmlDeviceSetAccountingMode, nvmlDeviceSetApplicationsClocks,
    nvmlDeviceSetAutoBoostedClocksEnabled, nvmlDeviceSetClockOffsets, nvmlDeviceSetComputeMode,
    nvmlDeviceSetConfComputeUnprotectedMemSize, nvmlDeviceSetCpuAffinity,
    nvmlDeviceSetDefaultAutoBoostedClocksEnabled, nvmlDeviceSetDefaultFanSpeed_v2,
    nvmlDeviceSetDramEncryptionMode, nvmlDeviceSetDriverModel, nvmlDeviceSetEccMode,
    nvmlDeviceSetFanControlPolicy, nvmlDeviceSetFanSpeed_v2, nvmlDeviceSetGpcClkVfOffset,
    nvmlDeviceSetGpuLockedClocks, nvmlDeviceSetGpuOperationMode, nvmlDeviceSetMemClkVfOffset,
    nvmlDeviceSetMemoryLockedClocks, nvmlDeviceSetMigMode,
    nvmlDeviceSetNvLinkDeviceLowPowerThreshold, nvmlDeviceSetNvLinkUtilizationControl,
    nvmlDeviceSetNvlinkBwMode, nvmlDeviceSetPersistenceMode, nvmlDeviceSetPowerManagementLimit,
    nvmlDeviceSetPowerManagementLimit_v2, nvmlDeviceSetTemperatureThreshold,
    nvmlDeviceSetVgpuCapabilities, nvmlDeviceSetVgpuHeterogeneousMode,
    nvmlDeviceSetVgpuSchedulerState, nvmlDeviceSetVirtualizationMode, nvmlDeviceValidateInforom,
    nvmlDeviceWorkloadPowerProfileClearRequestedProfiles,
    nvmlDeviceWorkloadPowerProfileGetCurrentProfiles, nvmlDeviceWorkloadPowerProfileGetProfilesInfo,
    nvmlDeviceWorkloadPowerProfileSetRequestedProfiles, nvmlGpmMigSampleGet,
    nvmlGpmQueryDeviceSupport, nvmlGpmQueryIfStreamingEnabled, nvmlGpmSampleGet,
    nvmlGpmSetStreamingEnabled, nvmlVgpuTypeGetMaxInstances,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_handles_round_trip() {
        let real = 0xdead_bee0usize as NvmlDevice;
        let f = fake(5, real).unwrap();
        assert_eq!(fake_ordinal(f), Some(5));
        assert_eq!(real_of(f), real);
        assert_ne!(f, real);
        // Re-handing it out follows NVML's current handle.
        let real2 = 0xfeed_f00dusize as NvmlDevice;
        assert_eq!(fake(5, real2), Some(f));
        assert_eq!(real_of(f), real2);
        // Anything else is not a fake handle and passes unchanged.
        for other in [
            std::ptr::null_mut(),
            real,
            (f as usize + 8) as NvmlDevice,           // inside an entry, not at its start
            (FAKES.as_ptr() as usize + MAX_FAKES * FAKE_SIZE) as NvmlDevice, // past the array
            &FAKES[MAX_FAKES - 1] as *const Fake as NvmlDevice, // never handed out
        ] {
            assert_eq!(fake_ordinal(other), None, "{other:?}");
            assert_eq!(real_of(other), other);
        }
        assert_eq!(fake(MAX_FAKES, real), None);
        assert_eq!(fake(6, std::ptr::null_mut()), None);
    }

    #[test]
    fn names_that_take_a_device() {
        assert!(takes_device(b"nvmlDeviceGetName"));
        assert!(takes_device(b"nvmlDeviceGetP2PStatus"));
        assert!(takes_device(b"nvmlGpmSampleGet"));
        assert!(takes_device(b"nvmlVgpuTypeGetMaxInstances"));
        assert!(!takes_device(b"nvmlInit_v2"));
        assert!(!takes_device(b"nvmlSystemGetDriverVersion"));
        assert!(!takes_device(b"nvmlVgpuTypeGetName"));
        assert!(!takes_device(b"cuDeviceGetName"));
    }

    #[test]
    fn exported_names_are_unique_not_hooked_and_take_a_device() {
        let mut seen = std::collections::HashSet::new();
        for name in EXPORTED {
            let bare = name.strip_suffix('\0').unwrap();
            assert!(seen.insert(bare), "{bare} twice");
            assert!(takes_device(bare.as_bytes()), "{bare}");
            assert!(
                crate::hooks::HOOKS.iter().all(|h| h.name != *name),
                "{bare} is also in the hook table (two exports of one name)"
            );
        }
        for needed in ["nvmlDeviceGetName", "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo", "nvmlDeviceGetTemperature", "nvmlDeviceGetP2PStatus"] {
            assert!(seen.contains(needed), "{needed}");
        }
    }

    /// What the target of a trampoline received: 8 integer arguments (6 in registers, 2 on the
    /// stack), returned packed so the caller can check each one.
    type Eight = unsafe extern "C" fn(usize, usize, usize, usize, usize, usize, usize, usize) -> u64;

    static SEEN: std::sync::Mutex<Vec<[usize; 8]>> = std::sync::Mutex::new(Vec::new());
    /// Held by each test that calls `target`, so that they do not see each other's calls.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    unsafe extern "C" fn target(a: usize, b: usize, c: usize, d: usize, e: usize, f: usize, g: usize, h: usize) -> u64 {
        SEEN.lock().unwrap().push([a, b, c, d, e, f, g, h]);
        0x1234_5678_9abc
    }

    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    #[test]
    fn trampoline_swaps_fake_handles_in_the_first_two_arguments_only() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let real0 = 0x7000_0000_1000usize;
        let real1 = 0x7000_0000_2000usize;
        let f0 = fake(10, real0 as NvmlDevice).unwrap() as usize;
        let f1 = fake(11, real1 as NvmlDevice).unwrap() as usize;
        let slot = dynamic_slot(target as *const () as usize, c"test").unwrap();
        assert_eq!(dynamic_slot(target as *const () as usize, c"test"), Some(slot), "one slot per function");
        // SAFETY: the stub jumps to `target`, whose signature is `Eight`.
        let call = unsafe { std::mem::transmute::<usize, Eight>(stub(slot)) };
        let cases = [
            ([f0, f1, f0, f1, 5, 6, f0, f1], [real0, real1, f0, f1, 5, 6, f0, f1]),
            ([1, f0, 3, 4, 5, 6, 7, 8], [1, real0, 3, 4, 5, 6, 7, 8]),
            ([f1, 0, 3, 4, 5, 6, 7, 8], [real1, 0, 3, 4, 5, 6, 7, 8]),
            ([f0 + 8, f1 - 16 * 11 - 16, 3, 4, 5, 6, 7, 8], [f0 + 8, f1 - 16 * 11 - 16, 3, 4, 5, 6, 7, 8]),
        ];
        for (args, want) in cases {
            SEEN.lock().unwrap().clear();
            // SAFETY: see above.
            let r = unsafe { call(args[0], args[1], args[2], args[3], args[4], args[5], args[6], args[7]) };
            assert_eq!(r, 0x1234_5678_9abc);
            assert_eq!(SEEN.lock().unwrap().as_slice(), &[want]);
        }
    }

    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    #[test]
    fn exported_stub_enters_its_slot() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let k = Exported::nvmlDeviceOnSameBoard as usize;
        TRAMP_REAL[k].store(target as *const () as usize, Ordering::Release);
        let real = 0x7000_0000_3000usize;
        let f = fake(12, real as NvmlDevice).unwrap() as usize;
        // SAFETY: the export jumps to pool slot k, which jumps to `target`.
        let call = unsafe { std::mem::transmute::<usize, Eight>(nvmlDeviceOnSameBoard as *const () as usize) };
        SEEN.lock().unwrap().clear();
        // SAFETY: see above.
        let r = unsafe { call(7, f, 9, 10, 11, 12, 13, 14) };
        assert_eq!(r, 0x1234_5678_9abc);
        assert_eq!(SEEN.lock().unwrap().as_slice(), &[[7, real, 9, 10, 11, 12, 13, 14]]);
        assert!(in_shim(stub(k)));
    }
}
