// Shared by the build scripts of libgpushim.so and of the simulated libraries (`include!`d).
//
// The unwinder linked in, not needed: the standard library asks for libgcc_s.so.1 (`-lgcc_s`),
// a second library to load, and ~15 symbols to look up, in every process that loads the
// library (~20,000 instructions of /bin/true for the shim). Where the compiler's static
// unwinder (libgcc_eh.a, position-independent) is there, a linker script named libgcc_s.so in
// the build directory, found before the system's, links it into the library instead: its own
// copy, hidden, used only for the library's own panics (caught at every entry point of the
// shim; an unwinding never crosses into the program). Without libgcc_eh.a, or with
// GPUSHIM_DYNAMIC_UNWINDER set, the system's libgcc_s is linked as before.
//
// The simulated driver does the same so that it needs what NVIDIA's driver needs (the C
// run-time only): loading it must not bring libgcc_s into a process for the shim to find
// there already (which made the shim's start-up look cheaper than it is).

/// Links the static unwinder instead of libgcc_s into the crate's cdylib (only: its test
/// programs and command-line tool keep libgcc_s) where the compiler has one; returns whether
/// it does. x86-64 and aarch64 Linux: the unwinder calls glibc 2.35's `_dl_find_object`, which
/// libgpushim answers itself (`src/platform/unwind.rs`) so as to load on glibc 2.34. For a
/// cross build the target's compiler is asked (`CC_<target>`, else `<arch>-linux-gnu-gcc`);
/// a cross build without one links libgcc_s as before.
fn link_static_unwinder() -> bool {
    println!("cargo:rerun-if-env-changed=GPUSHIM_DYNAMIC_UNWINDER");
    let target = (std::env::var("CARGO_CFG_TARGET_OS"), std::env::var("CARGO_CFG_TARGET_ARCH"));
    if std::env::var_os("GPUSHIM_DYNAMIC_UNWINDER").is_some() || target.0.as_deref() != Ok("linux") || !matches!(target.1.as_deref(), Ok("x86_64" | "aarch64")) {
        return false;
    }
    let Some(eh) = static_unwinder() else { return false };
    let Some(out) = std::env::var_os("OUT_DIR").map(std::path::PathBuf::from) else { return false };
    let dir = out.join("unwinder");
    if std::fs::create_dir_all(&dir).is_err() {
        return false;
    }
    let script = format!("/* the static unwinder instead of libgcc_s.so.1 */\nINPUT({})\n", eh.display());
    if std::fs::write(dir.join("libgcc_s.so"), script).is_err() {
        return false;
    }
    // (-L applies to every -l of the link, whatever the order)
    println!("cargo:rustc-cdylib-link-arg=-L{}", dir.display());
    true
}

/// The compiler's libgcc_eh.a, if it has one.
fn static_unwinder() -> Option<std::path::PathBuf> {
    let target = std::env::var("TARGET").unwrap_or_default();
    let cross = std::env::var("HOST").map_or(false, |host| host != target);
    let cc = if cross {
        let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
        std::env::var(format!("CC_{}", target.replace('-', "_"))).unwrap_or_else(|_| format!("{arch}-linux-gnu-gcc"))
    } else {
        std::env::var("CC").unwrap_or_else(|_| "cc".to_string())
    };
    let out = std::process::Command::new(cc).arg("-print-file-name=libgcc_eh.a").output().ok()?;
    let path = std::path::PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    // (a compiler without it prints the bare name back)
    (path.is_absolute() && path.is_file()).then_some(path)
}
