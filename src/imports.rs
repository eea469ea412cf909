//! The C library's functions, bound on their first call instead of when the library is loaded.
//!
//! A preloaded library is loaded into every program, CUDA or not, and the dynamic loader looks
//! up each function the library imports before the program's `main`: Rust links every library
//! for immediate binding, and its code calls C functions through the global offset table, which
//! lazy binding cannot serve. Each look-up walks the program's scope and compares names and
//! versions, about 650 instructions; ~80 of them, most for functions a program that never
//! touches CUDA never reaches.
//!
//! So the library defines each C-library function it calls itself, hidden (never exported: the
//! program and every other library still reach the C library's own), and its calls, the Rust
//! run-time's and the unwinder's included, bind to these definitions when it is linked. Each is
//! one jump to the function's procedure-linkage entry, `name@version` (`.symver`), which the
//! library is linked to bind lazily (`build.rs`: `-z lazy`). The dynamic loader binds it on the
//! first call, with the same scope, versions and interposition as at load time (a program that
//! brings its own `malloc` still gets it); a later call takes two direct jumps where it took one
//! indirect call. `LD_BIND_NOW` binds them all at load time again, as for any library, but the
//! jump table stays writable (partial RELRO); `GPUSHIM_BIND_NOW=1` at build time links the
//! library as before instead.
//!
//! The four functions the Rust run-time refers to weakly (`statx`, `getrandom`, `gettid`,
//! `__cxa_thread_atexit_impl`) stay ordinary imports: a hidden definition of such a name is made
//! weak by the assembler, and pointing the name at another label makes GNU ld bind the
//! versioned reference to that label itself (a jump to itself). Works with GNU ld and lld; the
//! tests check that every name below has its own lazily bound entry in the built library.
//!
//! The versions are those the linker records for the names on this platform (a test compares
//! them with the C library's default versions); the library still needs each of them at load
//! time (glibc 2.34 at most), so a C library without one refuses the library then, as before.
//! A function the library starts to call and that is missing here is imported as before (a
//! test lists the imports that remain).

/// Defines the hidden function `$label` (the C library's `$name`, but for the tests' own), a
/// jump to the procedure-linkage entry of the C library's `$name@$version`.
macro_rules! bound_on_first_call {
    ($($name:ident @ $version:literal),* $(,)?) => {
        $(bound_on_first_call!(@asm $name, $name, $version);)*
        /// The names bound on first call, with their versions.
        #[cfg(test)]
        pub const BOUND: &[(&str, &str)] = &[$((stringify!($name), $version)),*];
    };
    (@asm $label:ident, $name:ident, $version:literal) => {
        std::arch::global_asm!(
            concat!(".globl ", stringify!($label)),
            concat!(".hidden ", stringify!($label)),
            concat!(".type ", stringify!($label), ",@function"),
            ".p2align 4",
            concat!(stringify!($label), ":"),
            "endbr64",
            concat!("jmp gpushim_import_", stringify!($label), "@PLT"),
            concat!(".size ", stringify!($label), ", .-", stringify!($label)),
            concat!(".symver gpushim_import_", stringify!($label), ", ", stringify!($name), "@", $version),
        );
    };
}

bound_on_first_call! {
    __cxa_atexit @ "GLIBC_2.2.5",
    __errno_location @ "GLIBC_2.2.5",
    __pthread_key_create @ "GLIBC_2.34",
    __register_atfork @ "GLIBC_2.3.2",
    __xpg_strerror_r @ "GLIBC_2.3.4",
    abort @ "GLIBC_2.2.5",
    bcmp @ "GLIBC_2.2.5",
    calloc @ "GLIBC_2.2.5",
    clock_gettime @ "GLIBC_2.17",
    clock_nanosleep @ "GLIBC_2.17",
    close @ "GLIBC_2.2.5",
    dl_iterate_phdr @ "GLIBC_2.2.5",
    dladdr @ "GLIBC_2.34",
    dlerror @ "GLIBC_2.34",
    dlinfo @ "GLIBC_2.34",
    dlopen @ "GLIBC_2.34",
    dlvsym @ "GLIBC_2.34",
    free @ "GLIBC_2.2.5",
    fstat64 @ "GLIBC_2.33",
    getcwd @ "GLIBC_2.2.5",
    getenv @ "GLIBC_2.2.5",
    getpid @ "GLIBC_2.2.5",
    lseek64 @ "GLIBC_2.2.5",
    malloc @ "GLIBC_2.2.5",
    memcmp @ "GLIBC_2.2.5",
    memcpy @ "GLIBC_2.14",
    memmove @ "GLIBC_2.2.5",
    memset @ "GLIBC_2.2.5",
    mmap64 @ "GLIBC_2.2.5",
    munmap @ "GLIBC_2.2.5",
    open @ "GLIBC_2.2.5",
    open64 @ "GLIBC_2.2.5",
    posix_memalign @ "GLIBC_2.2.5",
    pthread_key_create @ "GLIBC_2.34",
    pthread_key_delete @ "GLIBC_2.34",
    pthread_mutex_consistent @ "GLIBC_2.34",
    pthread_mutex_init @ "GLIBC_2.2.5",
    pthread_mutex_lock @ "GLIBC_2.2.5",
    pthread_mutex_timedlock @ "GLIBC_2.34",
    pthread_mutex_unlock @ "GLIBC_2.2.5",
    pthread_mutexattr_destroy @ "GLIBC_2.34",
    pthread_mutexattr_init @ "GLIBC_2.34",
    pthread_mutexattr_setpshared @ "GLIBC_2.34",
    pthread_mutexattr_setrobust @ "GLIBC_2.34",
    pthread_once @ "GLIBC_2.34",
    pthread_self @ "GLIBC_2.2.5",
    pthread_setspecific @ "GLIBC_2.34",
    read @ "GLIBC_2.2.5",
    readlink @ "GLIBC_2.2.5",
    realloc @ "GLIBC_2.2.5",
    realpath @ "GLIBC_2.3",
    sched_yield @ "GLIBC_2.2.5",
    setenv @ "GLIBC_2.2.5",
    stat64 @ "GLIBC_2.33",
    strlen @ "GLIBC_2.2.5",
    syscall @ "GLIBC_2.2.5",
    unsetenv @ "GLIBC_2.2.5",
    write @ "GLIBC_2.2.5",
    writev @ "GLIBC_2.2.5",
}

// The start files' (crti, crtbegin) weak references to the profiler's and transactional
// memory's hooks, which this library never has: answered when it is linked, by functions that
// do nothing, instead of looked up, and found absent, in every program. (`.init` calls
// `__gmon_start__` when it is not null; the clone-table functions are called only for a
// non-empty clone table, which this library has not. An absolute 0 would do under one linker
// and, rewritten by GNU ld into an address of the library, crash under the other.)
std::arch::global_asm!(
    ".globl __gmon_start__",
    ".hidden __gmon_start__",
    ".globl _ITM_registerTMCloneTable",
    ".hidden _ITM_registerTMCloneTable",
    ".globl _ITM_deregisterTMCloneTable",
    ".hidden _ITM_deregisterTMCloneTable",
    ".type gpushim_start_file_hook,@function",
    ".p2align 4",
    "gpushim_start_file_hook:",
    "__gmon_start__:",
    "_ITM_registerTMCloneTable:",
    "_ITM_deregisterTMCloneTable:",
    "endbr64",
    "ret",
    ".size gpushim_start_file_hook, .-gpushim_start_file_hook",
);

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::{c_char, c_int, CStr, CString};

    // A variadic function nothing else in the tests calls through a stand-in.
    bound_on_first_call!(@asm gpushim_test_snprintf, snprintf, "GLIBC_2.2.5");

    extern "C" {
        fn gpushim_test_snprintf(buf: *mut c_char, n: usize, format: *const c_char, ...) -> c_int;
    }

    /// Each name binds to the version the C library makes its default, which is the one the
    /// linker records: else a call would reach another ABI than the one compiled against.
    #[test]
    fn each_name_binds_to_the_c_librarys_default_version() {
        for (name, version) in BOUND {
            let cname = CString::new(*name).unwrap();
            let cversion = CString::new(*version).unwrap();
            // SAFETY: C strings.
            let versioned = unsafe { libc::dlvsym(libc::RTLD_DEFAULT, cname.as_ptr(), cversion.as_ptr()) };
            let default = crate::driver::lookup(libc::RTLD_DEFAULT, &cname);
            assert!(!versioned.is_null(), "{name}@{version} is not in the C library");
            assert_eq!(versioned, default, "{name}: the C library's default is not {version}");
        }
    }

    /// A call through a stand-in arrives with every argument: six in registers, more on the
    /// stack, doubles in vector registers and a variadic call's count of them in al.
    #[test]
    fn a_call_through_a_stand_in_arrives_with_all_its_arguments() {
        for _ in 0..2 {
            let mut buf = [0 as c_char; 128];
            // SAFETY: a buffer of the given size, a format matching its arguments.
            let n = unsafe {
                gpushim_test_snprintf(buf.as_mut_ptr(), buf.len(), c"%d %d %d %.2f %d %.1f %d %s".as_ptr(), 1 as c_int, -2 as c_int, 3 as c_int, 1.25f64, 4 as c_int, -7.5f64, 5 as c_int, c"six".as_ptr())
            };
            // SAFETY: snprintf wrote a NUL-terminated string into `buf`.
            let text = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap();
            assert_eq!(text, "1 -2 3 1.25 4 -7.5 5 six");
            assert_eq!(n as usize, text.len());
        }
    }
}
