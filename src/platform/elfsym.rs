//! Looking functions up in one loaded library's own GNU hash table: what `dlsym(handle, name)`
//! finds first for a function the library defines itself, at a fraction of its cost (`dlsym`
//! takes the loader's lock, sets up error catching and searches the handle's whole scope:
//! ~890 instructions a name; the shim looks up ~120 driver functions at start-up).
//!
//! Only plain answers are given: a defined, global or weak, non-hidden `FUNC` symbol of the
//! library itself ([`Answer::Found`]); or that the library does not define the name at all
//! ([`Answer::Absent`]), given only when `dlsym` could not find it elsewhere either: every
//! library the driver needs (`DT_NEEDED`) is one of the C and compiler run-time libraries,
//! which define no CUDA or NVML function. Anything else — a name a dependency might define
//! (a driver stacked on another library), an indirect function (`STT_GNU_IFUNC`, whose
//! resolver `dlsym` runs), only hidden versions, a table that looks malformed — is
//! [`Answer::Ask`], and the caller asks `dlsym`.
//! Tests compare every answer with `dlsym`'s on the simulated driver and on three real NVIDIA
//! drivers.

use std::ffi::{c_void, CStr};

const DT_NULL: i64 = 0;
const DT_NEEDED: i64 = 1;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_STRSZ: i64 = 10;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
const DT_VERSYM: i64 = 0x6fff_fff0;
const STT_FUNC: u8 = 2;
const STB_GLOBAL: u8 = 1;
const STB_WEAK: u8 = 2;
const VERSYM_HIDDEN: u16 = 0x8000;
/// The most dynamic entries, and chain links, read before giving up (a malformed table).
const MOST_ENTRIES: usize = 1 << 12;
const MOST_LINKS: usize = 1 << 16;

/// The libraries a driver may need and still be answered "absent" for a name it does not
/// define: the C run-time's and the compiler's, none of which defines a `cu*` or `nvml*` name.
const RUNTIME_LIBRARIES: [&[u8]; 10] = [
    b"libc.so.6",
    b"libm.so.6",
    b"libdl.so.2",
    b"libpthread.so.0",
    b"librt.so.1",
    b"ld-linux-x86-64.so.2",
    b"ld-linux-aarch64.so.1",
    b"libgcc_s.so.1",
    b"libstdc++.so.6",
    b"libutil.so.1",
];

/// What the table says of a name.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Answer {
    /// The library defines this function here.
    Found(*mut c_void),
    /// Neither the library nor anything `dlsym` would search next defines it (only said of
    /// `cu*` and `nvml*` names).
    Absent,
    /// Only `dlsym` can tell.
    Ask,
}

/// The GNU hash of a name (`dl_new_hash`), at compile time for the names the shim looks up.
pub const fn gnu_hash(name: &[u8]) -> u32 {
    let mut h = 5381u32;
    let mut i = 0;
    while i < name.len() {
        h = h.wrapping_mul(33).wrapping_add(name[i] as u32);
        i += 1;
    }
    h
}

/// `Elf64_Sym`.
#[repr(C)]
struct Sym {
    st_name: u32,
    st_info: u8,
    st_other: u8,
    st_shndx: u16,
    st_value: u64,
    st_size: u64,
}

/// The first fields of glibc's `struct link_map` (public in `<link.h>`).
#[repr(C)]
struct LinkMap {
    l_addr: usize,
    l_name: *const libc::c_char,
    l_ld: *const [i64; 2],
    l_next: *const LinkMap,
    l_prev: *const LinkMap,
}

/// One library's dynamic symbol table, hash table and version table, as mapped.
pub struct Symbols {
    base: usize,
    symtab: *const Sym,
    strtab: *const u8,
    strsz: usize,
    versym: *const u16,
    nbuckets: u32,
    symoffset: u32,
    bloom_words: u32,
    bloom_shift: u32,
    bloom: *const u64,
    buckets: *const u32,
    chain: *const u32,
    /// Every `DT_NEEDED` library is a run-time library ([`RUNTIME_LIBRARIES`]): a name the
    /// table lacks is absent for `dlsym` too.
    self_contained: bool,
}

// SAFETY: read-only views of a library's mapped tables, which stay mapped while it is loaded
// (the shim never closes the driver).
unsafe impl Send for Symbols {}
unsafe impl Sync for Symbols {}

impl Symbols {
    /// The tables of the library `handle` (from `dlopen`), if it has a GNU hash table.
    pub fn of(handle: *mut c_void) -> Option<Symbols> {
        if handle.is_null() {
            return None;
        }
        let mut map: *const LinkMap = std::ptr::null();
        // SAFETY: dlinfo writes the handle's link map pointer into `map`.
        if unsafe { libc::dlinfo(handle, libc::RTLD_DI_LINKMAP, (&mut map as *mut *const LinkMap).cast()) } != 0 || map.is_null() {
            return None;
        }
        // SAFETY: the loader's link map of a loaded library, and its dynamic section (an array
        // of (tag, value) pairs ending with DT_NULL), mapped while the library is loaded.
        unsafe {
            let (base, mut dynamic) = ((*map).l_addr, (*map).l_ld);
            if dynamic.is_null() {
                return None;
            }
            // Addresses in the dynamic section are relocated in place by some loaders and not
            // by others: an unrelocated one is an offset, below the library's base.
            let at = |v: i64| if (v as usize) < base { base.wrapping_add(v as usize) } else { v as usize };
            let (mut strtab, mut symtab, mut strsz, mut gnu, mut versym) = (0usize, 0usize, 0usize, 0usize, 0usize);
            let mut needed = [0usize; 16];
            let mut needs = 0usize;
            let mut ended = false;
            for _ in 0..MOST_ENTRIES {
                let [tag, val] = *dynamic;
                match tag {
                    DT_NULL => {
                        ended = true;
                        break;
                    }
                    DT_NEEDED => {
                        // (more than the array holds: not self-contained, see below)
                        if let Some(slot) = needed.get_mut(needs) {
                            *slot = val as usize;
                        }
                        needs += 1;
                    }
                    DT_STRTAB => strtab = at(val),
                    DT_SYMTAB => symtab = at(val),
                    DT_STRSZ => strsz = val as usize,
                    DT_GNU_HASH => gnu = at(val),
                    DT_VERSYM => versym = at(val),
                    _ => {}
                }
                dynamic = dynamic.add(1);
            }
            if strtab == 0 || symtab == 0 || gnu == 0 || strsz == 0 {
                return None;
            }
            let header = gnu as *const u32;
            let (nbuckets, symoffset, bloom_words, bloom_shift) = (*header, *header.add(1), *header.add(2), *header.add(3));
            if nbuckets == 0 || bloom_words == 0 || !bloom_words.is_power_of_two() || bloom_shift >= 64 {
                return None;
            }
            let bloom = header.add(4) as *const u64;
            let buckets = bloom.add(bloom_words as usize) as *const u32;
            let chain = buckets.add(nbuckets as usize);
            let runtime = |at: usize| {
                if at >= strsz {
                    return false;
                }
                let name = CStr::from_bytes_until_nul(std::slice::from_raw_parts((strtab as *const u8).add(at), strsz - at));
                name.is_ok_and(|n| RUNTIME_LIBRARIES.contains(&n.to_bytes()))
            };
            let self_contained = ended && needs <= needed.len() && needed[..needs].iter().all(|&at| runtime(at));
            Some(Symbols {
                base,
                symtab: symtab as *const Sym,
                strtab: strtab as *const u8,
                strsz,
                versym: versym as *const u16,
                nbuckets,
                symoffset,
                bloom_words,
                bloom_shift,
                bloom,
                buckets,
                chain,
                self_contained,
            })
        }
    }

    /// What the table says of the function `name`, whose [`gnu_hash`] is `hash`.
    pub fn function(&self, name: &[u8], hash: u32) -> Answer {
        let h = hash;
        // (the run-time libraries define no `cu*`/`nvml*` name; any other name, they might)
        let driver_name = name.starts_with(b"cu") || name.starts_with(b"nvml");
        let absent = if self.self_contained && driver_name { Answer::Absent } else { Answer::Ask };
        // SAFETY: indices below are bounded by the table's own sizes (bloom words, buckets) or
        // by the chain's end marker (with a cap on links); names are read below `strsz`.
        unsafe {
            let word = *self.bloom.add((h / 64) as usize & (self.bloom_words as usize - 1));
            let mask = (1u64 << (h % 64)) | (1u64 << ((h >> self.bloom_shift) % 64));
            if word & mask != mask {
                return absent;
            }
            let first = *self.buckets.add((h % self.nbuckets) as usize);
            if first < self.symoffset {
                return absent;
            }
            for i in (first..).take(MOST_LINKS) {
                let link = *self.chain.add((i - self.symoffset) as usize);
                if link | 1 == h | 1 {
                    if let Some(found) = self.matches(i as usize, name) {
                        return found.map_or(Answer::Ask, Answer::Found);
                    }
                }
                if link & 1 != 0 {
                    return absent;
                }
            }
            Answer::Ask
        }
    }

    /// Whether symbol `i` is `name`: `Some(answer)` when it is (the answer `None` when `dlsym`
    /// must decide), `None` when it is another symbol.
    ///
    /// # Safety
    /// `i` is an index the hash table gave.
    unsafe fn matches(&self, i: usize, name: &[u8]) -> Option<Option<*mut c_void>> {
        let sym = &*self.symtab.add(i);
        let at = sym.st_name as usize;
        if at >= self.strsz || self.strsz - at <= name.len() {
            return None;
        }
        let text = std::slice::from_raw_parts(self.strtab.add(at), name.len() + 1);
        if &text[..name.len()] != name || text[name.len()] != 0 {
            return None;
        }
        let version = if self.versym.is_null() { 1 } else { *self.versym.add(i) };
        let (kind, bind) = (sym.st_info & 0xf, sym.st_info >> 4);
        if version & VERSYM_HIDDEN != 0 {
            return None; // an older version of the name: the default may follow in the chain
        }
        let plain = kind == STT_FUNC && (bind == STB_GLOBAL || bind == STB_WEAK) && sym.st_shndx != 0 && sym.st_value != 0 && version != 0;
        Some(plain.then(|| self.base.wrapping_add(sym.st_value as usize) as *mut c_void))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn open(path: &std::path::Path) -> *mut c_void {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
        assert!(!h.is_null(), "dlopen {}", path.display());
        h
    }

    /// Every name the shim looks up, and some it does not, answered as `dlsym` answers.
    fn agrees_with_dlsym(path: &std::path::Path) -> usize {
        let handle = open(path);
        let table = Symbols::of(handle).expect("a GNU hash table");
        let mut names: Vec<String> = crate::hooks::HOOKS.iter().map(|h| h.name.trim_end_matches('\0').to_string()).collect();
        names.extend(["cuStreamGetCtx", "cuCtxGetId", "cuFuncGetName", "cuKernelGetName", "cuDeviceGetUuid", "cuInit"].map(String::from));
        names.extend(["cuNoSuchFunction", "", "c", "cuMemAlloc_v9", "malloc", "_init", "memcpy"].map(String::from));
        assert!(table.self_contained, "{}: needs only run-time libraries", path.display());
        let (mut answered, mut wrong, mut absent) = (0, Vec::new(), 0);
        for name in &names {
            let c = std::ffi::CString::new(name.as_str()).unwrap();
            // (glibc's own dlsym: in this test program `dlsym` binds to the shim's interposer)
            let by_dlsym = crate::driver::lookup(handle, &c);
            let fast = match table.function(name.as_bytes(), gnu_hash(name.as_bytes())) {
                Answer::Found(p) => p,
                Answer::Absent => {
                    absent += 1;
                    std::ptr::null_mut()
                }
                Answer::Ask => continue,
            };
            if fast != by_dlsym {
                wrong.push(format!("{name}: {fast:?} (dlsym: {by_dlsym:?})"));
            }
            answered += 1;
        }
        // (the library's quiet panic hook prints no assertion message: say it first)
        if !wrong.is_empty() {
            eprintln!("{}: {wrong:?}", path.display());
        }
        assert!(wrong.is_empty());
        // (at least the made-up names: "cuNoSuchFunction", "cuMemAlloc_v9")
        assert!(absent >= 2, "{}: {absent} answered absent", path.display());
        answered
    }

    fn root() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
    }

    #[test]
    fn the_simulated_driver_is_answered_as_dlsym_answers() {
        // (next to this test binary's deps/ first: a cross build's target/<triple>/release)
        let own = std::env::current_exe().ok().and_then(|e| Some(e.parent()?.parent()?.join("libcuda.so")));
        let built = ["release", "debug", "profiling"].iter().map(|p| root().join("target").join(p).join("libcuda.so"));
        let lib = own.into_iter().chain(built).find(|p| p.is_file());
        let lib = lib.expect("the simulated driver (cargo build --release --workspace) before the tests");
        assert!(agrees_with_dlsym(&lib) > 100);
    }

    #[test]
    fn real_drivers_are_answered_as_dlsym_answers() {
        // (this architecture's: scripts/fetch-drivers.sh --arch aarch64 for aarch64)
        let dir = if cfg!(target_arch = "x86_64") { root().join(".deps/drivers") } else { root().join(".deps").join(std::env::consts::ARCH).join("drivers") };
        let rd = std::fs::read_dir(&dir).expect("the real drivers: run scripts/fetch-drivers.sh");
        let mut checked = 0;
        for e in rd.flatten() {
            let lib = e.path().join("lib/libcuda.so.1");
            if lib.exists() {
                // (the real driver's NVML is found next to it, as in tests/real_driver.rs)
                let answered = agrees_with_dlsym(&lib);
                assert!(answered > 100, "{}: only {answered} answered", lib.display());
                checked += 1;
            }
        }
        assert!(checked >= 3, "{checked} drivers in {}", dir.display());
    }
}
