//! Modules, libraries and kernel launches: no code runs here, launches only take simulated time.
//!
//! Code is loaded from PTX text (`.entry NAME` declarations give the kernels' names), from a
//! cubin (ELF: its entry symbols, `cubin`), or from a fat binary (`0xBA55ED50` container, or
//! the `0x466243B1` wrapper the CUDA runtime registers): its cubins for the simulated GPUs'
//! architecture if it has any, else its PTX entries, compressed ones (LZ4 blocks, zstd frames:
//! `cubin`, `zstd`) decompressed first; a bad image is `CUDA_ERROR_INVALID_IMAGE`, anything
//! else `CUDA_ERROR_NOT_SUPPORTED`. Functions belong to a module (made in the
//! current context); library kernels belong to a library (any context) and give a function per
//! context (`cuKernelGetFunction`). Names are answered by `cuFuncGetName`/`cuKernelGetName`.
//!
//! A launch checks its handle (a function of a loaded module, or a library kernel — which the
//! real driver also accepts where a `CUfunction` is expected) and its stream, runs nothing but
//! takes simulated time on its stream and device (`timeline`; [`duration`]: `gpusim_busy*`
//! kernels take their first parameter in ns, others `GPUSIM_KERNEL_NS`), and is counted per
//! kernel name for the report (`launches`).

use crate::types::*;
use std::collections::{BTreeMap, HashSet};
use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::{Mutex, OnceLock, RwLock};

/// A loaded module: its kernels, by name.
struct Module {
    functions: Vec<(CString, &'static Function)>,
}

/// A kernel as PTX declares it: its name and its parameters' (offset, size) in bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub params: Vec<(usize, usize)>,
}

/// A module's kernel (a `CUfunction`).
pub struct Function {
    name: CString,
    params: Vec<(usize, usize)>,
}

/// A loaded library: its kernels, by name.
struct Library {
    kernels: Vec<&'static Kernel>,
}

/// A library's kernel (a `CUkernel`), usable as a `CUfunction` in launches.
pub struct Kernel {
    name: CString,
    params: Vec<(usize, usize)>,
    library: usize,
}

#[derive(Default)]
struct Registry {
    modules: HashSet<usize>,
    libraries: HashSet<usize>,
    functions: HashSet<usize>,
    kernels: HashSet<usize>,
    /// Per library: the functions (`cuKernelGetFunction`) and modules (`cuLibraryGetModule`)
    /// made from it, which its unload invalidates.
    derived: BTreeMap<usize, Vec<usize>>,
}

fn registry() -> &'static RwLock<Registry> {
    static R: OnceLock<RwLock<Registry>> = OnceLock::new();
    R.get_or_init(|| RwLock::new(Registry::default()))
}

fn launches() -> &'static Mutex<BTreeMap<String, u64>> {
    static L: OnceLock<Mutex<BTreeMap<String, u64>>> = OnceLock::new();
    L.get_or_init(|| Mutex::new(BTreeMap::new()))
}

/// Launches per kernel name, as a JSON object (for the report).
pub fn launches_json() -> String {
    let l = launches().lock().unwrap_or_else(|e| e.into_inner());
    let items: Vec<String> = l.iter().map(|(name, n)| format!("{}:{n}", gpusim_common::counters::json_str(name))).collect();
    format!("{{{}}}", items.join(","))
}

pub(crate) const FATBIN_MAGIC: u32 = 0xBA55_ED50;
const FATBIN_WRAPPER_MAGIC: u32 = 0x4662_43B1;
const FATBIN_KIND_PTX: u16 = 1;
const FATBIN_KIND_ELF: u16 = 2;
/// Entry flags: compressed as an LZ4 block; compressed as a zstd frame (CUDA 12.8 and later).
const FATBIN_FLAG_LZ4: u64 = 0x2000;
const FATBIN_FLAG_ZSTD: u64 = 0x8000;
/// The simulated GPUs' architecture (compute capability 9.0, as `devices` reports).
const DEVICE_ARCH: u32 = 90;

/// The size and alignment of one `.param` declaration (`.param .u64 a`, `.param .align 8 .b8 s[24]`).
fn param_layout(decl: &str) -> Option<(usize, usize)> {
    let words: Vec<&str> = decl.split_whitespace().collect();
    let mut align = None;
    let mut size = None;
    let mut i = 0;
    while i < words.len() {
        let w = words[i];
        if w == ".align" {
            align = words.get(i + 1).and_then(|a| a.parse::<usize>().ok());
            i += 2;
            continue;
        }
        if let Some(t) = w.strip_prefix('.').filter(|t| t.len() >= 2 && matches!(t.as_bytes()[0], b'u' | b's' | b'b' | b'f')) {
            size = t[1..].parse::<usize>().ok().filter(|b| matches!(b, 8 | 16 | 32 | 64)).map(|b| b / 8);
        }
        i += 1;
    }
    let elem = size?;
    // an array: name[count]
    let count = decl.rsplit_once('[').and_then(|(_, r)| r.trim_end().trim_end_matches(']').trim().parse::<usize>().ok()).unwrap_or(1);
    Some((elem * count, align.unwrap_or(elem)))
}

/// The kernels in PTX `text`: each `.entry NAME(PARAMS)` (with or without `.visible`/`.weak`),
/// line comments ignored.
pub fn ptx_entries(text: &str) -> Vec<Entry> {
    let mut entries: Vec<Entry> = Vec::new();
    let code: String = text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n");
    let mut rest = code.as_str();
    while let Some(i) = rest.find(".entry") {
        let after = &rest[i + ".entry".len()..];
        let boundary_before = i == 0 || rest[..i].ends_with(|c: char| c.is_whitespace());
        let boundary_after = after.starts_with(|c: char| c.is_whitespace());
        if boundary_before && boundary_after {
            let name: String = after.trim_start().chars().take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '.')).collect();
            let mut params = Vec::new();
            let sig = after.trim_start()[name.len()..].trim_start();
            if let Some(list) = sig.strip_prefix('(').and_then(|l| l.split_once(')')).map(|(l, _)| l) {
                let mut offset = 0usize;
                for decl in list.split(',').map(str::trim).filter(|d| !d.is_empty()) {
                    if let Some((size, align)) = param_layout(decl) {
                        offset = offset.next_multiple_of(align.max(1));
                        params.push((offset, size));
                        offset += size;
                    }
                }
            }
            if !name.is_empty() && !entries.iter().any(|e| e.name == name) {
                entries.push(Entry { name, params });
            }
        }
        rest = after;
    }
    entries
}

/// The largest fat binary the simulator reads (a sanity bound on sizes an image claims).
const MAX_FATBIN: usize = 1 << 30;

fn le<const N: usize>(b: &[u8], at: usize) -> Option<[u8; N]> {
    b.get(at..at.checked_add(N)?)?.try_into().ok()
}

/// The kernels of a fat binary container held in `bytes` (all of it, as its header says):
/// every read is checked against its length. Machine code (ELF) entries for the simulated
/// GPUs' architecture ([`DEVICE_ARCH`]: the same major version, not newer) are read when there
/// are any, as the driver picks a cubin it can run; otherwise the PTX entries. Compressed
/// entries are decompressed first (LZ4 blocks or zstd frames).
pub(crate) fn fatbin_entries(bytes: &[u8]) -> Res<Vec<Entry>> {
    // header { magic: u32, version: u16, header_size: u16, fat_size: u64 }, then entries
    // { kind: u16, _: u16, header_size: u32, payload_size: u64, compressed_size: u32, _: u32,
    //   minor: u16, major: u16, arch: u32, name_offset: u32, name_len: u32, flags: u64,
    //   _: u64, uncompressed_size: u64, … } each followed by its payload
    let bad = CUDA_ERROR_INVALID_IMAGE;
    let header_size = u16::from_le_bytes(le::<2>(bytes, 6).ok_or(bad)?) as usize;
    let fat_size = usize::try_from(u64::from_le_bytes(le::<8>(bytes, 8).ok_or(bad)?)).map_err(|_| bad)?;
    let end = header_size.checked_add(fat_size).filter(|&e| e <= bytes.len()).ok_or(bad)?;
    let mut ptx = Vec::new();
    let mut elf = Vec::new();
    let mut other_arch = false;
    let mut at = header_size;
    while at < end {
        let field = |off: usize| at.checked_add(off).ok_or(bad);
        let kind = u16::from_le_bytes(le::<2>(bytes, at).ok_or(bad)?);
        let entry_header = u32::from_le_bytes(le::<4>(bytes, field(4)?).ok_or(bad)?) as usize;
        let payload = usize::try_from(u64::from_le_bytes(le::<8>(bytes, field(8)?).ok_or(bad)?)).map_err(|_| bad)?;
        let arch = u32::from_le_bytes(le::<4>(bytes, field(28)?).ok_or(bad)?);
        let flags = u64::from_le_bytes(le::<8>(bytes, field(40)?).ok_or(bad)?);
        let start = at.checked_add(entry_header).ok_or(bad)?;
        let next = start.checked_add(payload).filter(|&n| n <= end).ok_or(bad)?;
        if entry_header < 48 {
            return Err(bad);
        }
        let usable = match kind {
            FATBIN_KIND_PTX => true,
            FATBIN_KIND_ELF => {
                let fits = arch / 10 == DEVICE_ARCH / 10 && arch <= DEVICE_ARCH;
                other_arch |= !fits;
                fits
            }
            _ => false,
        };
        if usable {
            let mut data = std::borrow::Cow::Borrowed(&bytes[start..next]);
            if flags & (FATBIN_FLAG_LZ4 | FATBIN_FLAG_ZSTD) != 0 {
                // compressed_size at +16, uncompressed_size at +56 (a 64-byte entry header at least)
                if entry_header < 64 {
                    return Err(bad);
                }
                let packed = u32::from_le_bytes(le::<4>(bytes, field(16)?).ok_or(bad)?) as usize;
                let size = usize::try_from(u64::from_le_bytes(le::<8>(bytes, field(56)?).ok_or(bad)?)).map_err(|_| bad)?;
                let packed = data.get(..packed).ok_or(bad)?;
                if size > MAX_FATBIN {
                    return Err(bad);
                }
                let plain = if flags & FATBIN_FLAG_ZSTD != 0 {
                    crate::zstd::decompress(packed, size).map_err(|_| bad)?
                } else {
                    crate::cubin::lz4_block(packed, size).map_err(|_| bad)?
                };
                // (the entry says how large it is: anything else is a corrupt stream)
                if plain.len() != size {
                    return Err(bad);
                }
                data = std::borrow::Cow::Owned(plain);
            }
            if kind == FATBIN_KIND_PTX {
                let text = String::from_utf8_lossy(data.split(|&b| b == 0).next().unwrap_or(&[]));
                ptx.extend(ptx_entries(&text));
            } else {
                for e in crate::cubin::elf_kernels(&data).map_err(|_| bad)? {
                    if !elf.iter().any(|k: &Entry| k.name == e.name) {
                        elf.push(e);
                    }
                }
            }
        }
        at = next;
    }
    if !elf.is_empty() {
        Ok(elf)
    } else if !ptx.is_empty() {
        Ok(ptx)
    } else if other_arch {
        Err(CUDA_ERROR_NO_BINARY_FOR_GPU)
    } else {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
}

/// The kernels of an image held in `bytes`: a fat binary, a cubin or PTX text (see the module
/// documentation); anything else is `CUDA_ERROR_NOT_SUPPORTED`.
pub(crate) fn bytes_entries(bytes: &[u8]) -> Res<Vec<Entry>> {
    if le::<4>(bytes, 0).map(u32::from_le_bytes) == Some(FATBIN_MAGIC) {
        return fatbin_entries(bytes);
    }
    if crate::cubin::is_elf(bytes) {
        return crate::cubin::elf_kernels(bytes).map_err(|_| CUDA_ERROR_INVALID_IMAGE);
    }
    let text = String::from_utf8_lossy(bytes.split(|&b| b == 0).next().unwrap_or(&[]));
    if !text.contains(".version") || !text.contains(".target") {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    Ok(ptx_entries(&text))
}

/// The kernels of a code image given by address (`cuModuleLoadData` and friends): PTX text, a
/// fat binary, or the wrapper the CUDA runtime registers (one level).
///
/// # Safety
/// `image` points to a NUL-terminated PTX text, a fat binary whose header tells its size, or
/// a wrapper of one, as the driver API requires of its callers.
unsafe fn image_entries(image: *const c_void) -> Res<Vec<Entry>> {
    // SAFETY: per the contract.
    unsafe { image_entries_at(image, true) }
}

/// # Safety
/// As [`image_entries`].
unsafe fn image_entries_at(image: *const c_void, wrapper_allowed: bool) -> Res<Vec<Entry>> {
    if image.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let p = image as *const u8;
    // The first 4 bytes, stopping at a NUL (a PTX text shorter than that ends there).
    let mut head = [0u8; 4];
    for (i, b) in head.iter_mut().enumerate() {
        // SAFETY: bytes up to and including the first NUL are the caller's image.
        *b = unsafe { *p.add(i) };
        if *b == 0 {
            break;
        }
    }
    let magic = u32::from_le_bytes(head);
    if magic == FATBIN_WRAPPER_MAGIC {
        if !wrapper_allowed {
            return Err(CUDA_ERROR_INVALID_IMAGE);
        }
        // { magic: u32, version: u32, data: *const fatbin, filename_or_fatbins: *const c_void }
        // SAFETY: the wrapper's layout (16 bytes); `data` points to the fat binary.
        let data = unsafe { std::ptr::read_unaligned(p.add(8) as *const *const c_void) };
        // SAFETY: as the wrapper says; a wrapper of a wrapper is refused.
        return unsafe { image_entries_at(data, false) };
    }
    if magic == FATBIN_MAGIC {
        // SAFETY: the container's header is 16 bytes; its sizes say how long the whole is
        // (bounded, then every entry is checked against that length).
        let (header_size, fat_size) = unsafe {
            (u16::from_le_bytes(std::ptr::read_unaligned(p.add(6) as *const [u8; 2])) as usize, u64::from_le_bytes(std::ptr::read_unaligned(p.add(8) as *const [u8; 8])))
        };
        let total = usize::try_from(fat_size).ok().and_then(|f| f.checked_add(header_size)).filter(|&t| t <= MAX_FATBIN).ok_or(CUDA_ERROR_INVALID_IMAGE)?;
        // SAFETY: the caller's image is as long as its header says.
        return fatbin_entries(unsafe { std::slice::from_raw_parts(p, total) });
    }
    if head == *b"\x7fELF" {
        // SAFETY: an ELF header is 64 bytes; its section and program header tables end the
        // image (bounded, then every section is checked against that length).
        let header = unsafe { std::slice::from_raw_parts(p, 64) };
        let field = |at: usize, n: usize| header[at..at + n].iter().rev().fold(0u64, |v, &b| v << 8 | u64::from(b));
        let table_end = |off: u64, num: u64, size: u64| num.checked_mul(size).and_then(|t| t.checked_add(off));
        let total = table_end(field(0x28, 8), field(0x3c, 2), field(0x3a, 2))
            .zip(table_end(field(0x20, 8), field(0x38, 2), field(0x36, 2)))
            .map(|(a, b)| a.max(b).max(64))
            .and_then(|t| usize::try_from(t).ok())
            .filter(|&t| t <= MAX_FATBIN)
            .ok_or(CUDA_ERROR_INVALID_IMAGE)?;
        // SAFETY: the caller's cubin is as long as its header tables say.
        return crate::cubin::elf_kernels(unsafe { std::slice::from_raw_parts(p, total) }).map_err(|_| CUDA_ERROR_INVALID_IMAGE);
    }
    // SAFETY: per the contract, otherwise a NUL-terminated text.
    bytes_entries(unsafe { CStr::from_ptr(image as *const c_char) }.to_bytes())
}

fn cstring(name: &str) -> CString {
    CString::new(name).unwrap_or_default()
}

fn load_module(out: *mut CUmodule, entries: Vec<Entry>) -> Res {
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    crate::context::current()?;
    let functions = entries
        .into_iter()
        .map(|e| {
            let f: &'static Function = Box::leak(Box::new(Function { name: cstring(&e.name), params: e.params }));
            (cstring(&e.name), f)
        })
        .collect();
    let m: &'static Module = Box::leak(Box::new(Module { functions }));
    let mut r = registry().write().unwrap_or_else(|e| e.into_inner());
    r.modules.insert(m as *const Module as usize);
    for (_, f) in &m.functions {
        r.functions.insert(*f as *const Function as usize);
    }
    // SAFETY: `out` is the caller's non-NULL out-pointer.
    unsafe { put(out, m as *const Module as CUmodule) }
}

fn module(h: CUmodule) -> Res<&'static Module> {
    let r = registry().read().unwrap_or_else(|e| e.into_inner());
    if h.is_null() || !r.modules.contains(&(h as usize)) {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    // SAFETY: registered modules are leaked, never freed.
    Ok(unsafe { &*(h as *const Module) })
}

fn library(h: *mut c_void) -> Res<&'static Library> {
    let r = registry().read().unwrap_or_else(|e| e.into_inner());
    if h.is_null() || !r.libraries.contains(&(h as usize)) {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    // SAFETY: registered libraries are leaked, never freed.
    Ok(unsafe { &*(h as *const Library) })
}

/// The name and first parameter's offset of a launchable handle: a loaded module's function or
/// a library's kernel.
fn launchable(f: *mut c_void) -> Res<(&'static CStr, Option<usize>)> {
    let r = registry().read().unwrap_or_else(|e| e.into_inner());
    if !f.is_null() && r.functions.contains(&(f as usize)) {
        // SAFETY: registered functions are leaked, never freed.
        let f = unsafe { &*(f as *const Function) };
        return Ok((&f.name, f.params.first().map(|p| p.0)));
    }
    if !f.is_null() && r.kernels.contains(&(f as usize)) {
        // SAFETY: registered kernels are leaked, never freed.
        let k = unsafe { &*(f as *const Kernel) };
        return Ok((&k.name, k.params.first().map(|p| p.0)));
    }
    Err(CUDA_ERROR_INVALID_HANDLE)
}

/// The number of parameters of a launchable handle (a function or a library kernel), for the
/// queries that accept either.
pub fn launchable_handle(f: *mut c_void) -> Res<usize> {
    let r = registry().read().unwrap_or_else(|e| e.into_inner());
    if !f.is_null() && r.functions.contains(&(f as usize)) {
        // SAFETY: registered functions are leaked, never freed.
        return Ok(unsafe { &*(f as *const Function) }.params.len());
    }
    if !f.is_null() && r.kernels.contains(&(f as usize)) {
        // SAFETY: registered kernels are leaked, never freed.
        return Ok(unsafe { &*(f as *const Kernel) }.params.len());
    }
    Err(CUDA_ERROR_INVALID_HANDLE)
}

/// The duration of a launch of handle `f` with these parameters ([`duration`]).
///
/// # Safety
/// As [`duration`].
pub unsafe fn function_duration(f: *mut c_void, params: *mut *mut c_void, extra: *mut *mut c_void) -> Res<u64> {
    let (name, first) = launchable(f)?;
    // SAFETY: per the contract.
    Ok(unsafe { duration(name, first, params, extra) })
}

/// `CU_LAUNCH_PARAM_END`, `CU_LAUNCH_PARAM_BUFFER_POINTER`, `CU_LAUNCH_PARAM_BUFFER_SIZE`.
const PARAM_END: usize = 0;
const PARAM_BUFFER_POINTER: usize = 1;
const PARAM_BUFFER_SIZE: usize = 2;

/// The simulated duration of a launch of kernel `name`: a `gpusim_busy*` kernel takes its first
/// parameter (a `.u64`, ns) from `kernelParams[0]`, or from the `extra` parameter buffer at the
/// first parameter's offset; every other kernel (and a `gpusim_busy*` one whose parameter
/// cannot be read) takes `GPUSIM_KERNEL_NS`. Capped at 60 s.
///
/// # Safety
/// `params` and `extra` are as the driver API requires of launches (NULL, or arrays the
/// caller owns).
pub unsafe fn duration(name: &CStr, first: Option<usize>, params: *mut *mut c_void, extra: *mut *mut c_void) -> u64 {
    if !name.to_bytes().starts_with(b"gpusim_busy") {
        return crate::timeline::kernel_ns();
    }
    // SAFETY: per the contract: kernelParams[0] points to the first parameter.
    let from_params = (!params.is_null()).then(|| unsafe { *params }).filter(|p| !p.is_null()).map(|p| unsafe { std::ptr::read_unaligned(p as *const u64) });
    let ns = from_params.or_else(|| {
        if extra.is_null() {
            return None;
        }
        let (mut buf, mut size) = (std::ptr::null_mut::<c_void>(), None::<usize>);
        for i in 0..64 {
            // SAFETY: `extra` is a (key, value) list ending with CU_LAUNCH_PARAM_END.
            let key = unsafe { *extra.add(2 * i) } as usize;
            if key == PARAM_END {
                break;
            }
            // SAFETY: as above, every key but END has a value.
            let v = unsafe { *extra.add(2 * i + 1) };
            match key {
                PARAM_BUFFER_POINTER => buf = v,
                // SAFETY: the value of BUFFER_SIZE points to a size_t.
                PARAM_BUFFER_SIZE if !v.is_null() => size = Some(unsafe { *(v as *const usize) }),
                _ => {}
            }
        }
        let off = first.unwrap_or(0);
        let fits = size.is_none_or(|n| off + 8 <= n);
        // SAFETY: the buffer holds the parameters (its size, when given, was checked).
        (!buf.is_null() && fits).then(|| unsafe { std::ptr::read_unaligned((buf as *const u8).add(off) as *const u64) })
    });
    ns.unwrap_or_else(crate::timeline::kernel_ns).min(crate::timeline::MAX_KERNEL_NS)
}

/// A launch on stream `s` (`ptsz`: a `_ptsz` variant): captured into a graph as a kernel node,
/// or put on the simulated timeline (waiting first if the stream's queue is full).
unsafe fn launch(f: CUfunction, s: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void, ptsz: bool) -> Res {
    let (name, first) = launchable(f)?;
    let t = crate::timeline::target(s, ptsz)?;
    // SAFETY: the caller's launch arguments.
    let ns = unsafe { duration(name, first, params, extra) };
    if let Some(g) = crate::graphs::capturing(s) {
        // captured: a node of the graph being built, nothing runs now
        return crate::graphs::capture_kernel(g, ns);
    }
    crate::timeline::submit(&t, crate::timeline::Op::kernel(ns));
    if ns == 0 {
        crate::timeline::mark_used(t.ctx.physical);
    }
    let mut l = launches().lock().unwrap_or_else(|e| e.into_inner());
    *l.entry(name.to_string_lossy().into_owned()).or_insert(0) += 1;
    Ok(())
}

/// The head of `CUlaunchConfig`: grid, block, shared memory, stream.
#[repr(C)]
pub struct LaunchConfigHead {
    dims: [u32; 6],
    shared: u32,
    stream: CUstream,
}

unsafe fn launch_ex(config: *const LaunchConfigHead, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void, ptsz: bool) -> Res {
    if config.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: a caller-given CUlaunchConfig, non-NULL.
    unsafe { launch(f, (*config).stream, params, extra, ptsz) }
}

unsafe fn load_library(out: *mut *mut c_void, code: *const c_void) -> Res {
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's image, per the driver API's contract.
    let entries = unsafe { image_entries(code) }?;
    // (the library's address is known only once it exists: kernels learn it below)
    let lib: &'static mut Library = Box::leak(Box::new(Library { kernels: Vec::new() }));
    let at = lib as *const Library as usize;
    lib.kernels = entries.into_iter().map(|e| &*Box::leak(Box::new(Kernel { name: cstring(&e.name), params: e.params, library: at }))).collect();
    let lib: &'static Library = lib;
    let mut r = registry().write().unwrap_or_else(|e| e.into_inner());
    r.libraries.insert(lib as *const Library as usize);
    for k in &lib.kernels {
        r.kernels.insert(*k as *const Kernel as usize);
    }
    // SAFETY: `out` is the caller's non-NULL out-pointer.
    unsafe { put(out, lib as *const Library as *mut c_void) }
}

/// A function's or kernel's attribute (`CUfunction_attribute`), as a compiled kernel without
/// registers or shared memory to speak of would report it.
fn attribute(attr: i32) -> Res<i32> {
    Ok(match attr {
        0 => 1024,      // MAX_THREADS_PER_BLOCK
        1..=3 => 0,     // SHARED_SIZE_BYTES, CONST_SIZE_BYTES, LOCAL_SIZE_BYTES
        4 => 16,        // NUM_REGS
        5 | 6 => 80,    // PTX_VERSION, BINARY_VERSION
        7 => 0,         // CACHE_MODE_CA
        8 => 48 << 10,  // MAX_DYNAMIC_SHARED_SIZE_BYTES
        9 => -1,        // PREFERRED_SHARED_MEMORY_CARVEOUT
        10..=15 => 0,   // cluster attributes
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    })
}

fn function(f: CUfunction) -> Res<&'static Function> {
    let r = registry().read().unwrap_or_else(|e| e.into_inner());
    if f.is_null() || !r.functions.contains(&(f as usize)) {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    // SAFETY: registered functions are leaked, never freed.
    Ok(unsafe { &*(f as *const Function) })
}

fn kernel(k: *mut c_void) -> Res<&'static Kernel> {
    let r = registry().read().unwrap_or_else(|e| e.into_inner());
    if k.is_null() || !r.kernels.contains(&(k as usize)) {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    // SAFETY: registered kernels are leaked, never freed.
    Ok(unsafe { &*(k as *const Kernel) })
}

/// `cuFuncGetParamInfo`/`cuKernelGetParamInfo`: parameter `index`'s offset and size.
unsafe fn param_info(params: &[(usize, usize)], index: usize, offset: *mut usize, size: *mut usize) -> Res {
    let &(o, n) = params.get(index).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if !offset.is_null() {
        // SAFETY: the caller's out-pointer.
        unsafe { put(offset, o)? };
    }
    if !size.is_null() {
        // SAFETY: as above.
        unsafe { put(size, n)? };
    }
    Ok(())
}

cu_api! {
    fn cuFuncGetAttribute(value: *mut i32, attr: i32, f: CUfunction) {
        function(f)?;
        put(value, attribute(attr)?)
    }

    fn cuKernelGetAttribute(value: *mut i32, attr: i32, k: *mut c_void, dev: CUdevice) {
        let _ = dev;
        kernel(k)?;
        put(value, attribute(attr)?)
    }

    fn cuFuncSetAttribute(f: CUfunction, attr: i32, value: i32) {
        let _ = value;
        function(f)?;
        attribute(attr).map(|_| ())
    }

    fn cuKernelSetAttribute(attr: i32, value: i32, k: *mut c_void, dev: CUdevice) {
        let _ = (value, dev);
        kernel(k)?;
        attribute(attr).map(|_| ())
    }

    fn cuFuncSetCacheConfig(f: CUfunction, config: i32) {
        let _ = config;
        function(f).map(|_| ())
    }

    fn cuKernelSetCacheConfig(k: *mut c_void, config: i32, dev: CUdevice) {
        let _ = (config, dev);
        kernel(k).map(|_| ())
    }

    fn cuFuncGetParamInfo(f: CUfunction, index: usize, offset: *mut usize, size: *mut usize) {
        param_info(&function(f)?.params, index, offset, size)
    }

    fn cuKernelGetParamInfo(k: *mut c_void, index: usize, offset: *mut usize, size: *mut usize) {
        param_info(&kernel(k)?.params, index, offset, size)
    }

    /// CU_FUNCTION_LOADING_STATE_LOADED = 1: nothing is ever left to load.
    fn cuFuncIsLoaded(state: *mut i32, f: CUfunction) {
        function(f)?;
        put(state, 1)
    }

    fn cuFuncLoad(f: CUfunction) { function(f).map(|_| ()) }

    fn cuLibraryGetKernelCount(count: *mut u32, lib: *mut c_void) {
        put(count, library(lib)?.kernels.len() as u32)
    }

    fn cuLibraryEnumerateKernels(kernels: *mut *mut c_void, n: u32, lib: *mut c_void) {
        let l = library(lib)?;
        if kernels.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        for (i, k) in l.kernels.iter().take(n as usize).enumerate() {
            *kernels.add(i) = *k as *const Kernel as *mut c_void;
        }
        Ok(())
    }

    /// The library's module in the current context: made once per (library, context), with a
    /// function per kernel.
    fn cuLibraryGetModule(module: *mut CUmodule, lib: *mut c_void) {
        if module.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let l = library(lib)?;
        let ctx = crate::context::current()?;
        static MADE: OnceLock<Mutex<BTreeMap<(usize, u64), usize>>> = OnceLock::new();
        let mut made = MADE.get_or_init(|| Mutex::new(BTreeMap::new())).lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&m) = made.get(&(lib as usize, ctx.id)) {
            return put(module, m as CUmodule);
        }
        let entries = l.kernels.iter().map(|k| Entry { name: k.name.to_string_lossy().into_owned(), params: k.params.clone() }).collect();
        let mut m: CUmodule = std::ptr::null_mut();
        load_module(&mut m, entries)?;
        made.insert((lib as usize, ctx.id), m as usize);
        let mut made_here = vec![m as usize];
        made_here.extend(crate::kernels::module(m)?.functions.iter().map(|(_, f)| *f as *const Function as usize));
        registry().write().unwrap_or_else(|e| e.into_inner()).derived.entry(lib as usize).or_default().extend(made_here);
        put(module, m)
    }

    fn cuKernelGetLibrary(lib: *mut *mut c_void, k: *mut c_void) {
        put(lib, kernel(k)?.library as *mut c_void)
    }
}

cu_api! {
    /// CU_MODULE_LAZY_LOADING = 2
    fn cuModuleGetLoadingMode(mode: *mut i32) { put(mode, 2) }

    fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) {
        load_module(module, image_entries(image)?)
    }

    fn cuModuleLoadDataEx(module: *mut CUmodule, image: *const c_void, n: u32, options: *mut i32, values: *mut *mut c_void) {
        let _ = (n, options, values);
        load_module(module, image_entries(image)?)
    }

    fn cuModuleLoadFatBinary(module: *mut CUmodule, image: *const c_void) {
        load_module(module, image_entries(image)?)
    }

    fn cuModuleLoad(module: *mut CUmodule, path: *const c_char) {
        if path.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let path = std::ffi::OsStr::new(CStr::from_ptr(path).to_str().map_err(|_| CUDA_ERROR_FILE_NOT_FOUND)?);
        let bytes = std::fs::read(path).map_err(|_| CUDA_ERROR_FILE_NOT_FOUND)?;
        load_module(module, bytes_entries(&bytes)?)
    }

    fn cuModuleUnload(module: CUmodule) {
        let m = crate::kernels::module(module)?;
        let mut r = registry().write().unwrap_or_else(|e| e.into_inner());
        r.modules.remove(&(module as usize));
        for (_, f) in &m.functions {
            r.functions.remove(&(*f as *const Function as usize));
        }
        Ok(())
    }

    fn cuModuleGetFunction(f: *mut CUfunction, module: CUmodule, name: *const c_char) {
        if f.is_null() || name.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let m = crate::kernels::module(module)?;
        let name = CStr::from_ptr(name);
        let found = m.functions.iter().find(|(n, _)| n.as_c_str() == name).ok_or(CUDA_ERROR_NOT_FOUND)?;
        put(f, found.1 as *const Function as CUfunction)
    }

    fn cuFuncGetName(name: *mut *const c_char, f: CUfunction) {
        if name.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let r = registry().read().unwrap_or_else(|e| e.into_inner());
        if f.is_null() || !r.functions.contains(&(f as usize)) {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        put(name, (*(f as *const Function)).name.as_ptr())
    }

    fn cuLibraryLoadData(lib: *mut *mut c_void, code: *const c_void, jit_options: *mut i32, jit_values: *mut *mut c_void, n_jit: u32,
                         lib_options: *mut i32, lib_values: *mut *mut c_void, n_lib: u32) {
        let _ = (jit_options, jit_values, n_jit, lib_options, lib_values, n_lib);
        load_library(lib, code)
    }

    fn cuLibraryUnload(lib: *mut c_void) {
        let l = library(lib)?;
        let mut r = registry().write().unwrap_or_else(|e| e.into_inner());
        r.libraries.remove(&(lib as usize));
        for k in &l.kernels {
            r.kernels.remove(&(*k as *const Kernel as usize));
        }
        // what was made from it goes with it (a handle is in only one of these sets)
        for h in r.derived.remove(&(lib as usize)).unwrap_or_default() {
            r.functions.remove(&h);
            r.modules.remove(&h);
        }
        Ok(())
    }

    fn cuLibraryGetKernel(kernel: *mut *mut c_void, lib: *mut c_void, name: *const c_char) {
        if kernel.is_null() || name.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let l = library(lib)?;
        let name = CStr::from_ptr(name);
        let found = l.kernels.iter().find(|k| k.name.as_c_str() == name).ok_or(CUDA_ERROR_NOT_FOUND)?;
        put(kernel, *found as *const Kernel as *mut c_void)
    }

    fn cuKernelGetName(name: *mut *const c_char, kernel: *mut c_void) {
        if name.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let r = registry().read().unwrap_or_else(|e| e.into_inner());
        if kernel.is_null() || !r.kernels.contains(&(kernel as usize)) {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        put(name, (*(kernel as *const Kernel)).name.as_ptr())
    }

    /// The kernel's function in the current context: a module of the current context holding
    /// just that kernel, made once per (kernel, context).
    fn cuKernelGetFunction(f: *mut CUfunction, kernel: *mut c_void) {
        if f.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let ctx = crate::context::current()?;
        let name = {
            let r = registry().read().unwrap_or_else(|e| e.into_inner());
            if kernel.is_null() || !r.kernels.contains(&(kernel as usize)) {
                return Err(CUDA_ERROR_INVALID_HANDLE);
            }
            (*(kernel as *const Kernel)).name.clone()
        };
        static MADE: OnceLock<Mutex<BTreeMap<(usize, u64), usize>>> = OnceLock::new();
        let mut made = MADE.get_or_init(|| Mutex::new(BTreeMap::new())).lock().unwrap_or_else(|e| e.into_inner());
        let params = (*(kernel as *const Kernel)).params.clone();
        let library = (*(kernel as *const Kernel)).library;
        let function = *made.entry((kernel as usize, ctx.id)).or_insert_with(|| {
            let func: &'static Function = Box::leak(Box::new(Function { name, params }));
            let mut r = registry().write().unwrap_or_else(|e| e.into_inner());
            r.functions.insert(func as *const Function as usize);
            r.derived.entry(library).or_default().push(func as *const Function as usize);
            func as *const Function as usize
        });
        put(f, function as CUfunction)
    }

    fn cuLaunchKernel(f: CUfunction, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32,
                      shared: u32, s: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) {
        let _ = (gx, gy, gz, bx, by, bz, shared);
        launch(f, s, params, extra, false)
    }

    fn cuLaunchKernel_ptsz(f: CUfunction, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32,
                           shared: u32, s: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) {
        let _ = (gx, gy, gz, bx, by, bz, shared);
        launch(f, s, params, extra, true)
    }

    fn cuLaunchKernelEx(config: *const LaunchConfigHead, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) {
        launch_ex(config, f, params, extra, false)
    }

    fn cuLaunchKernelEx_ptsz(config: *const LaunchConfigHead, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) {
        launch_ex(config, f, params, extra, true)
    }

    fn cuLaunchCooperativeKernel(f: CUfunction, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32,
                                 shared: u32, s: CUstream, params: *mut *mut c_void) {
        let _ = (gx, gy, gz, bx, by, bz, shared);
        launch(f, s, params, std::ptr::null_mut(), false)
    }

    fn cuLaunchCooperativeKernel_ptsz(f: CUfunction, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32,
                                      shared: u32, s: CUstream, params: *mut *mut c_void) {
        let _ = (gx, gy, gz, bx, by, bz, shared);
        launch(f, s, params, std::ptr::null_mut(), true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_read_from_ptx() {
        let ptx = ".version 8.0\n.target sm_80\n.address_size 64\n\n.visible .entry vecAdd(\n.param .u64 a\n)\n{ ret; }\n.entry _Z4fillPfi (\n)\n{ret;}\n// .entry not_this\n.func helper()\n";
        let names: Vec<String> = ptx_entries(ptx).into_iter().map(|e| e.name).collect();
        assert_eq!(names, vec!["vecAdd".to_string(), "_Z4fillPfi".to_string()]);
        let e = &ptx_entries(".entry k(.param .u32 n, .param .u64 p, .param .align 16 .b8 s[20], .param .f32 x)\n{}")[0];
        assert_eq!(e.params, vec![(0, 4), (8, 8), (16, 20), (36, 4)]);
        assert!(ptx_entries(".version 8.0\n.target sm_80\n.func f()\n").is_empty());
    }
}
