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
    // The C library's functions bound on their first call (src/imports.rs): lazy binding (the
    // Rust toolchain asks for immediate binding; the later flag wins). GPUSHIM_BIND_NOW=1 at
    // build time keeps immediate binding (full RELRO: the jump table read-only after loading,
    // ~60,000 instructions more in every process the library is preloaded into).
    println!("cargo:rerun-if-env-changed=GPUSHIM_BIND_NOW");
    let bind_now = std::env::var("GPUSHIM_BIND_NOW").is_ok_and(|v| !v.is_empty() && v != "0");
    if !bind_now
        && std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("x86_64")
        && std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux")
        && std::env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu")
    {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-z,lazy");
    }
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=scripts/build/static_unwinder.rs");
    println!("cargo::rustc-check-cfg=cfg(gpushim_static_unwinder)");
    if link_static_unwinder() {
        // the library answers the unwinder's `_dl_find_object` itself (src/unwind.rs)
        println!("cargo:rustc-cfg=gpushim_static_unwinder");
    }
}
