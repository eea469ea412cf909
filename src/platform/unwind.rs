//! The one C-library function the static unwinder needs beyond what the rest of the library
//! needs: `_dl_find_object` (glibc 2.35), which it calls to find the unwind tables of the code
//! a panic unwinds through. The library is linked with that unwinder (`build.rs`), and a
//! preloaded library that needed glibc 2.35 would stop every program on a system with 2.34
//! (RHEL 9 and its kin) from starting. So the library answers the call itself, with a hidden
//! definition the unwinder binds to when the library is linked: glibc's own function when the
//! C library has one, else the same answer from the loaded objects' program headers
//! (`dl_iterate_phdr`). Called only while a panic unwinds.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// glibc's `struct dl_find_object` on x86-64 and aarch64 (neither has `dlfo_eh_dbase` or
/// `dlfo_eh_count`: those are i386's/nios2's and arm32's).
#[repr(C)]
pub struct DlFindObject {
    flags: u64,
    map_start: *mut c_void,
    map_end: *mut c_void,
    link_map: *mut c_void,
    eh_frame: *mut c_void,
    reserved: [u64; 7],
}

type FindObject = unsafe extern "C" fn(*mut c_void, *mut DlFindObject) -> c_int;

// The hidden `_dl_find_object` the unwinder's reference binds to (not exported: the program's
// and every other library's calls still reach glibc's). A tail jump to `find_object`: x86-64
// with an `endbr64` landing pad, aarch64 with `bti c` (`hint #34`) and a direct `b`.
#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".globl _dl_find_object",
    ".hidden _dl_find_object",
    ".type _dl_find_object,@function",
    "_dl_find_object:",
    "endbr64",
    "jmp {find}",
    ".size _dl_find_object, .-_dl_find_object",
    find = sym find_object,
);
#[cfg(target_arch = "aarch64")]
std::arch::global_asm!(
    ".globl _dl_find_object",
    ".hidden _dl_find_object",
    ".type _dl_find_object,@function",
    "_dl_find_object:",
    "hint #34",
    "b {find}",
    ".size _dl_find_object, .-_dl_find_object",
    find = sym find_object,
);

/// 0: not looked up yet; 1: the C library has none.
static GLIBC: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn find_object(pc: *mut c_void, out: *mut DlFindObject) -> c_int {
    let mut real = GLIBC.load(Relaxed);
    if real == 0 {
        // SAFETY: plain C strings; RTLD_DEFAULT never sees the hidden definition above.
        let p = unsafe { libc::dlvsym(libc::RTLD_DEFAULT, c"_dl_find_object".as_ptr(), c"GLIBC_2.35".as_ptr()) };
        real = if p.is_null() { 1 } else { p as usize };
        GLIBC.store(real, Relaxed);
    }
    if real != 1 {
        // SAFETY: glibc's `_dl_find_object`, called as the unwinder called this one.
        return unsafe { std::mem::transmute::<usize, FindObject>(real)(pc, out) };
    }
    // SAFETY: `out` is the unwinder's writable result.
    unsafe { from_program_headers(pc, out) }
}

/// `_dl_find_object` from the loaded objects' program headers: the object with a loaded
/// segment holding `pc`, the span of its loaded segments and its `PT_GNU_EH_FRAME`.
///
/// # Safety
/// `out` is NULL or writable.
pub unsafe fn from_program_headers(pc: *mut c_void, out: *mut DlFindObject) -> c_int {
    struct Search {
        pc: usize,
        found: Option<(usize, usize, usize)>,
    }
    unsafe extern "C" fn visit(info: *mut libc::dl_phdr_info, _: usize, data: *mut c_void) -> c_int {
        // SAFETY: the loader passes a valid `info` and our `data` back.
        let (info, search) = unsafe { (&*info, &mut *(data as *mut Search)) };
        if info.dlpi_phdr.is_null() {
            return 0;
        }
        // SAFETY: `dlpi_phdr` points at `dlpi_phnum` program headers.
        let headers = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
        let base = info.dlpi_addr as usize;
        let (mut start, mut end, mut eh, mut holds) = (usize::MAX, 0usize, 0usize, false);
        for h in headers {
            let at = base.wrapping_add(h.p_vaddr as usize);
            match h.p_type {
                libc::PT_LOAD => {
                    let stop = at.wrapping_add(h.p_memsz as usize);
                    start = start.min(at);
                    end = end.max(stop);
                    holds |= (at..stop).contains(&search.pc);
                }
                libc::PT_GNU_EH_FRAME => eh = at,
                _ => {}
            }
        }
        if holds {
            search.found = Some((start, end, eh));
            return 1;
        }
        0
    }
    if out.is_null() {
        return -1;
    }
    let mut search = Search { pc: pc as usize, found: None };
    // SAFETY: `visit` only reads what the loader passes; `search` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&mut search as *mut Search).cast()) };
    let Some((start, end, eh)) = search.found else { return -1 };
    // SAFETY: `out` is writable (checked non-NULL above; the caller's contract).
    unsafe {
        out.write(DlFindObject {
            flags: 0,
            map_start: start as *mut c_void,
            map_end: end as *mut c_void,
            link_map: std::ptr::null_mut(),
            eh_frame: eh as *mut c_void,
            reserved: [0; 7],
        })
    };
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn empty() -> DlFindObject {
        DlFindObject { flags: 9, map_start: std::ptr::null_mut(), map_end: std::ptr::null_mut(), link_map: std::ptr::null_mut(), eh_frame: std::ptr::null_mut(), reserved: [0; 7] }
    }

    /// The loaded spans (`p_vaddr` .. `p_vaddr + p_memsz`) of the object holding `pc`.
    fn segments_of(pc: usize) -> Vec<std::ops::Range<usize>> {
        struct Find {
            pc: usize,
            spans: Vec<std::ops::Range<usize>>,
        }
        unsafe extern "C" fn visit(info: *mut libc::dl_phdr_info, _: usize, data: *mut c_void) -> c_int {
            // SAFETY: the loader passes a valid `info` and our `data` back; `dlpi_phdr` points
            // at `dlpi_phnum` headers.
            let (info, find) = unsafe { (&*info, &mut *(data as *mut Find)) };
            let headers = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
            let spans: Vec<_> = headers
                .iter()
                .filter(|h| h.p_type == libc::PT_LOAD)
                .map(|h| (info.dlpi_addr as usize + h.p_vaddr as usize)..(info.dlpi_addr as usize + (h.p_vaddr + h.p_memsz) as usize))
                .collect();
            if spans.iter().any(|s| s.contains(&find.pc)) {
                find.spans = spans;
                return 1;
            }
            0
        }
        let mut find = Find { pc, spans: Vec::new() };
        // SAFETY: `visit` only reads what the loader passes; `find` outlives the call.
        unsafe { libc::dl_iterate_phdr(Some(visit), (&mut find as *mut Find).cast()) };
        find.spans
    }

    #[test]
    fn program_headers_answer_as_glibc_answers() {
        // SAFETY: plain C strings.
        let real = unsafe { libc::dlvsym(libc::RTLD_DEFAULT, c"_dl_find_object".as_ptr(), c"GLIBC_2.35".as_ptr()) };
        assert!(!real.is_null(), "this machine's glibc has _dl_find_object (2.35+)");
        // SAFETY: glibc's function of that type.
        let real = unsafe { std::mem::transmute::<*mut c_void, FindObject>(real) };
        let here = program_headers_answer_as_glibc_answers as *mut c_void;
        // an address in the C library
        let in_libc = crate::driver::lookup(libc::RTLD_DEFAULT, c"getpid");
        for pc in [here, in_libc, (here as usize + 1) as *mut c_void] {
            let (mut a, mut b) = (empty(), empty());
            // SAFETY: valid out-pointers.
            let (ra, rb) = unsafe { (real(pc, &mut a), from_program_headers(pc, &mut b)) };
            assert_eq!((ra, rb), (0, 0), "{pc:?}");
            // The same object, found by its unwind tables. glibc reports the span of the
            // object's segments, except for a main program whose segments lie apart (a gap
            // between them: `l_contiguous` unset), where it reports the one segment holding
            // `pc`, which depends on how the linker laid this test program out. The span
            // answered here holds glibc's either way.
            assert_eq!(a.eh_frame, b.eh_frame, "{pc:?}");
            assert!(!b.eh_frame.is_null());
            let (pc, a_span, b_span) = (pc as usize, a.map_start as usize..a.map_end as usize, b.map_start as usize..b.map_end as usize);
            assert!(a_span.contains(&pc) && b_span.contains(&pc), "{pc:#x}: {a_span:x?} {b_span:x?}");
            // the answer here: the hull of the object's loaded segments
            let segments = segments_of(pc);
            let hull = segments.iter().map(|s| s.start).min().unwrap()..segments.iter().map(|s| s.end).max().unwrap();
            assert_eq!(b_span, hull, "{pc:#x}: {segments:x?}");
            // glibc's: the same hull (its start rounded down to the page), or one segment
            let page = 4096usize;
            assert!(
                a_span == hull || a_span == ((hull.start & !(page - 1))..hull.end) || segments.contains(&a_span),
                "{pc:#x}: glibc's {a_span:x?}, the segments {segments:x?}"
            );
        }
        // an address no object holds
        let mut b = empty();
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { from_program_headers(16 as *mut c_void, &mut b) }, -1);
        // the hidden definition answers like glibc's too
        let mut c = empty();
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { find_object(here, &mut c) }, 0);
        assert!(!c.eh_frame.is_null());
    }
}
