// Link flags for the simulated NVML.
//
// -Bsymbolic: a preloaded shim exports the same `nvml*` names as we do; without this flag the
// dynamic linker would bind the simulator's *internal* references (calls between its own entry
// points) to the shim's definitions, and the shim would end up calling itself.
// -soname: consumers load us as `libnvidia-ml.so.1` (symlinked to the built `libnvidia_ml.so`).
// The static unwinder instead of libgcc_s, as the shim: see scripts/build/static_unwinder.rs.
include!("../../scripts/build/static_unwinder.rs");

fn main() {
    println!("cargo:rerun-if-changed=../../scripts/build/static_unwinder.rs");
    // (needing glibc 2.35 for the unwinder's `_dl_find_object` is fine for a test library)
    let _ = link_static_unwinder();
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
    println!("cargo:rerun-if-changed=build.rs");
}
