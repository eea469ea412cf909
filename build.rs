// Link flags for libgpushim.so.
//
// -Bsymbolic-functions: the library's references to its own functions (the hook table's
// addresses of its exported hooks, calls between them) are bound to its own definitions when
// it is linked, instead of being looked up by name when it is loaded. A preloaded library is
// the first in every lookup scope, so the binding is the same; only the load-time work goes
// (each such reference was a symbol look-up in every process the library is preloaded into,
// CUDA or not). Data symbols are not affected.
//
// The static unwinder instead of libgcc_s: see scripts/build/static_unwinder.rs.
include!("scripts/build/static_unwinder.rs");

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
    // Immediate binding and full RELRO: every C-library function the library calls is bound when
    // it is loaded, and the dynamic linker makes the global offset table read-only before the
    // program runs (`-z now -z relro`: DT_FLAGS BIND_NOW, the GOT inside PT_GNU_RELRO; the Rust
    // toolchain asks for the same, said again here so that no toolchain default changes it). A
    // library meant for /etc/ld.so.preload is in every process, set-user-ID ones included, and
    // leaves no writable function pointer of its own there (tests/hardening.rs checks the built
    // library).
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-z,now");
        println!("cargo:rustc-cdylib-link-arg=-Wl,-z,relro");
    }
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=scripts/build/static_unwinder.rs");
    println!("cargo::rustc-check-cfg=cfg(gpushim_static_unwinder)");
    if link_static_unwinder() {
        // the library answers the unwinder's `_dl_find_object` itself (src/unwind.rs)
        println!("cargo:rustc-cfg=gpushim_static_unwinder");
    }
}

