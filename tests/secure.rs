//! Set-user-ID programs under the shim (issue: the shim inside privileged processes).
//!
//! For real: a set-user-ID root copy of a test program, run as the unprivileged user `nobody`,
//! with `libgpushim.so` preloaded through `/etc/ld.so.preload` in a private mount namespace
//! (`unshare -m`) over a copy of `/etc` (the machine's own `/etc` is never touched) and a
//! private `/tmp`. The loader finds the simulated driver through that copy's `ld.so.cache`
//! (`LD_LIBRARY_PATH` is ignored in a secure-execution process, as on any system). The system
//! config file of the copy limits every device to 1 GiB.
//!
//! The caller's environment then tries everything a hostile user would: a library to load as
//! root (`GPUSHIM_DRIVER_PATH`, `GPUSHIM_NVML_PATH`), a root-only file to overwrite
//! (`GPUSHIM_REPORT`), files and directories to create as root (`GPUSHIM_LOG_FILE`,
//! `GPUSHIM_STATE_DIR`, `XDG_RUNTIME_DIR`), a root-only file to show (`GPUSHIM_CONFIG`), the
//! limit lifted (`GPUSHIM_MEMORY_LIMIT`, `CUDA_DEVICE_MEMORY_LIMIT`, `GPUSHIM_DISABLE`), a
//! parent's device view forged (`GPUSHIM_VIEW_APPLIED`). None of it may take effect; the same
//! program without the set-user-ID bit takes the environment as usual, and without the shim
//! the 2 GiB allocation the limit refuses succeeds.
//!
//! Needs root (to make the set-user-ID program and the namespace); skipped, saying so, without.

mod common;

use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const NOBODY: u32 = 65534;

/// The sandbox: the programs, the libraries and the copies of `/etc`, under one directory.
struct Sandbox {
    dir: PathBuf,
}

fn sh(script: &str) {
    let out = Command::new("sh").arg("-c").arg(script).output().expect("sh");
    assert!(out.status.success(), "{script}\n{}", String::from_utf8_lossy(&out.stderr));
}

fn q(p: &Path) -> String {
    format!("'{}'", p.display())
}

impl Sandbox {
    /// `None` (said on stderr) where the test cannot run: not root, or no mount namespace.
    fn new() -> Option<Sandbox> {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("secure: skipped: needs root (a set-user-ID program and a mount namespace)");
            return None;
        }
        if !Command::new("unshare").args(["-m", "true"]).status().is_ok_and(|s| s.success()) {
            eprintln!("secure: skipped: `unshare -m` is not allowed here");
            return None;
        }
        let dir = fresh_dir("secure");
        let d = |n: &str| dir.join(n);
        // Every directory on the way must be reachable by `nobody`.
        let mut up = dir.clone();
        while up.pop() {
            let _ = std::fs::set_permissions(&up, std::fs::Permissions::from_mode(
                std::fs::metadata(&up).map(|m| m.permissions().mode() | 0o711).unwrap_or(0o755),
            ));
            if up == Path::new("/") {
                break;
            }
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        // The libraries the loader finds by name (copies: ldconfig reads their sonames).
        std::fs::create_dir_all(d("lib")).unwrap();
        std::fs::copy(sim_library(), d("lib/libcuda.so.1")).unwrap();
        std::fs::copy(nvml_sim_library(), d("lib/libnvidia-ml.so.1")).unwrap();
        std::fs::copy(shim_path(), d("lib/libgpushim.so")).unwrap();
        // The programs: set-user-ID root, and a plain copy.
        std::fs::create_dir_all(d("bin")).unwrap();
        for (src, name) in [(program(Program::Modes), "modes"), (program(Program::Nvml(NvmlPath::Link)), "nvml")] {
            for (suffix, mode) in [("-setuid", 0o4755), ("-setgid", 0o2755), ("", 0o755)] {
                let to = d(&format!("bin/{name}{suffix}"));
                std::fs::copy(&src, &to).unwrap();
                std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode)).unwrap();
            }
        }
        // What a hostile caller points at: a library whose constructor leaves a mark, and
        // root's private files.
        std::fs::create_dir_all(d("evil")).unwrap();
        std::fs::set_permissions(d("evil"), std::fs::Permissions::from_mode(0o1777)).unwrap();
        let src = d("evil/evil.c");
        std::fs::write(
            &src,
            format!(
                "#include <fcntl.h>\n#include <unistd.h>\n__attribute__((constructor)) static void mark(void) {{\n\
                 int fd = open(\"{}\", O_WRONLY | O_CREAT, 0644); if (fd >= 0) close(fd); }}\n\
                 int cuInit(unsigned f) {{ (void)f; return 0; }}\nint nvmlInit_v2(void) {{ return 0; }}\n",
                d("evil/loaded").display()
            ),
        )
        .unwrap();
        sh(&format!("gcc -shared -fPIC -o {} {}", q(&d("evil/libevil.so")), q(&src)));
        std::fs::create_dir_all(d("root")).unwrap();
        std::fs::set_permissions(d("root"), std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::write(d("root/shadow"), "root's own text\n").unwrap();
        std::fs::write(d("root/secret.toml"), "SECRET-7f3a = [\n").unwrap();
        // Copies of /etc: with the shim in ld.so.preload (system files: GPU 0 by UUID and 1 GiB;
        // 1 GiB on ordinal 0; a shared quota), and without it.
        let uuid0 = phys_uuid(0);
        let limited = format!("memory_limit = \"1GiB\"\nvisible_devices = [\"{uuid0}\"]\n");
        for (etc, preload, toml) in [
            ("etc-shim", true, limited.clone()),
            ("etc-ordinal", true, "[memory_limits]\n0 = \"1GiB\"\n".to_string()),
            ("etc-quota", true, "memory_limit = \"1GiB\"\nshared_quota = \"team\"\n".to_string()),
            ("etc-plain", false, limited.clone()),
        ] {
            let e = d(etc);
            sh(&format!("cp -a /etc {}", q(&e)));
            std::fs::write(e.join("ld.so.preload"), if preload { format!("{}\n", d("lib/libgpushim.so").display()) } else { String::new() })
                .unwrap();
            // (ld.so.conf's own `include /etc/ld.so.conf.d/*.conf` names the machine's /etc)
            let conf = std::fs::read_to_string(e.join("ld.so.conf")).unwrap_or_default();
            std::fs::write(e.join("ld.so.conf"), format!("{}\n{conf}", d("lib").display())).unwrap();
            std::fs::create_dir_all(e.join("gpushim")).unwrap();
            std::fs::write(e.join("gpushim/gpushim.toml"), toml).unwrap();
            // (-X: no links made in the system's library directories)
            sh(&format!("ldconfig -X -C {} -f {}", q(&e.join("ld.so.cache")), q(&e.join("ld.so.conf"))));
        }
        Some(Sandbox { dir })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Runs `bin/<prog>` as `nobody` with exactly `env` (plus the simulator's own settings),
    /// in a namespace whose `/etc` is `etc` and whose `/tmp` and `/run` are empty (the sandbox
    /// mounted back at its own path, which may lie under `/tmp`); then lists, as root, the
    /// shim's directories the run left there (`left./tmp/gpushim-UID=UID`).
    fn run(&self, etc: &str, prog: &str, env: &[(&str, String)], args: &[&str]) -> RunOutput {
        let vars: Vec<String> = [("GPUSIM_DEVICES", "2".to_string()), ("GPUSIM_MEMORY", "16GiB".to_string())]
            .iter()
            .chain(env)
            .map(|(k, v)| format!("'{k}={v}'"))
            .collect();
        let script = format!(
            "set -e\n\
             mount --bind {sb} /mnt\n\
             mount -t tmpfs tmpfs /tmp\n\
             mount -t tmpfs tmpfs /run\n\
             umask 022; mkdir -p {sb}\n\
             mount --bind /mnt {sb}\n\
             mount --bind {etc} /etc\n\
             setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups -- env -i PATH=/usr/bin:/bin {vars} {prog} {args} || echo exit={NOBODY}\n\
             for f in /tmp/gpushim* /run/gpushim*; do [ -e \"$f\" ] && echo \"left.$f=$(stat -c %u \"$f\")\"; done; true\n",
            etc = q(&self.path(etc)),
            sb = q(&self.dir),
            vars = vars.join(" "),
            prog = q(&self.path(&format!("bin/{prog}"))),
            args = args.join(" "),
        );
        let out = Run::new("unshare").args(["-m", "--propagation", "private", "sh", "-c", &script]).without_sim().run();
        out.assert_completed();
        out
    }
}

fn alloc_run(sb: &Sandbox, etc: &str, prog: &str, env: &[(&str, String)]) -> RunOutput {
    sb.run(etc, prog, env, &["ctx=v2", "alloc=mem:2147483648", "alloc=mem:536870912"])
}

/// The 1 GiB limit of the system file held: 2 GiB refused, 512 MiB granted.
fn assert_limited(out: &RunOutput, what: &str) {
    assert_eq!(out.num("init.rc"), 0, "{what}: CUDA initialises\n{}", out.dump());
    assert_eq!((out.num("op1.rc"), out.num("op2.rc"), out.num("op3.rc")), (0, OOM, 0), "{what}: the system file's 1 GiB holds\n{}", out.dump());
}

#[test]
fn a_set_user_id_program_takes_nothing_from_the_callers_environment() {
    let Some(sb) = Sandbox::new() else { return };
    let p = |n: &str| sb.path(n).display().to_string();
    let hostile = vec![
        ("GPUSHIM_DRIVER_PATH", p("evil/libevil.so")),
        ("GPUSHIM_NVML_PATH", p("evil/libevil.so")),
        ("GPUSHIM_REPORT", p("root/shadow")),
        ("GPUSHIM_LOG_FILE", p("root/log")),
        ("GPUSHIM_LOG", "debug".to_string()),
        ("GPUSHIM_STATE_DIR", p("root/state")),
        ("XDG_RUNTIME_DIR", p("root/xdg")),
        ("GPUSHIM_MEMORY_LIMIT", "unlimited".to_string()),
        ("GPUSHIM_MEMORY_LIMIT_0", "64GiB".to_string()),
        ("CUDA_DEVICE_MEMORY_LIMIT", "64g".to_string()),
    ];
    let out = alloc_run(&sb, "etc-shim", "modes-setuid", &hostile);
    assert_limited(&out, "hostile paths and limits");
    assert!(!sb.path("evil/loaded").exists(), "no library named by the caller is loaded\n{}", out.dump());
    assert_eq!(std::fs::read_to_string(sb.path("root/shadow")).unwrap(), "root's own text\n", "root's file is untouched");
    for made in ["root/log", "root/state", "root/xdg"] {
        assert!(!sb.path(made).exists(), "{made} is not created\n{}", out.dump());
    }
    // nothing in /tmp (a user could make root's directory there first); root's own in /run
    assert_eq!(left(&out), vec![("left./run/gpushim".to_string(), "0".to_string())], "{}", out.dump());
    assert_eq!(
        out.stderr_text(),
        "gpushim: warn: device 0: cuMemAlloc of 2147483648 bytes refused: 0 bytes in use, limit 1073741824 bytes\n",
        "the refusal alone, at the system file's log level (not the caller's debug)\n{}",
        out.dump()
    );

    // A root-only config file is neither read nor shown.
    let out = alloc_run(&sb, "etc-shim", "modes-setuid", &[("GPUSHIM_CONFIG", p("root/secret.toml"))]);
    assert_limited(&out, "GPUSHIM_CONFIG");
    assert!(!out.stderr_text().contains("SECRET"), "{}", out.dump());

    // GPUSHIM_DISABLE cannot lift the system's limit.
    let out = alloc_run(&sb, "etc-shim", "modes-setuid", &[("GPUSHIM_DISABLE", "1".to_string())]);
    assert_limited(&out, "GPUSHIM_DISABLE");

    // NVML in a set-user-ID program: the caller's NVML library is not loaded; a forged
    // parent's view (GPU 1, "applied") is not taken: the system file's GPU 0 and limit are what
    // it shows.
    let uuid1 = phys_uuid(1);
    let forged = [
        ("GPUSHIM_NVML_PATH", p("evil/libevil.so")),
        ("CUDA_VISIBLE_DEVICES", uuid1.clone()),
        ("GPUSHIM_VIEW_APPLIED", uuid1.clone()),
    ];
    let out = sb.run("etc-shim", "nvml-setuid", &forged, &["list"]);
    assert!(!sb.path("evil/loaded").exists(), "{}", out.dump());
    assert_eq!((out.num("init.rc"), out.num("count")), (0, 1), "{}", out.dump());
    assert_eq!((out.get("idx0.uuid"), out.u64("idx0.total")), (phys_uuid(0).as_str(), GIB), "{}", out.dump());
    let out = alloc_run(&sb, "etc-shim", "modes-setuid", &forged[1..]);
    assert_limited(&out, "a forged view");

    // The caller's CUDA_VISIBLE_DEVICES cannot re-aim the system file's ordinals: 1 GiB on
    // ordinal 0 stays on GPU 0 with `1,0` (which makes GPU 1 ordinal 0 and GPU 0, unlimited,
    // ordinal 1): NVML (which lists GPUs in the driver's order) shows GPU 0 limited.
    let cvd = [("CUDA_VISIBLE_DEVICES", "1,0".to_string())];
    let out = alloc_run(&sb, "etc-ordinal", "modes-setuid", &cvd);
    assert_limited(&out, "CUDA_VISIBLE_DEVICES=1,0");
    let out = sb.run("etc-ordinal", "nvml-setuid", &cvd, &["list"]);
    assert_eq!((out.num("count"), out.get("idx0.uuid"), out.u64("idx0.total")), (2, phys_uuid(0).as_str(), GIB), "{}", out.dump());
    assert_eq!(out.u64("idx1.total"), 16 * GIB, "{}", out.dump());
}

/// What a run left in `/tmp` and `/run`, sorted.
fn left(out: &RunOutput) -> Vec<(String, String)> {
    out.kv.iter().filter(|(k, _)| k.starts_with("left.")).map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// A set-group-ID program's effective user is the caller, who owns the state directory and
/// could rewrite what is in it (the budget's figures, a quota's mutex): nothing is published
/// or registered there, and a shared quota in the system file is a configuration error.
#[test]
fn a_set_group_id_program_keeps_its_budget_out_of_the_callers_files() {
    let Some(sb) = Sandbox::new() else { return };
    let out = alloc_run(&sb, "etc-shim", "modes-setgid", &[("GPUSHIM_MEMORY_LIMIT", "unlimited".to_string())]);
    assert_limited(&out, "set-group-ID");
    assert_eq!(left(&out), vec![], "nothing in the caller's state directory\n{}", out.dump());
    let out = alloc_run(&sb, "etc-quota", "modes-setgid", &[]);
    assert_eq!(out.num("init.rc"), NOT_INITIALIZED, "{}", out.dump());
    assert!(
        out.stderr_text().starts_with("gpushim: shared_quota (config file /etc/gpushim/gpushim.toml)=\"team\": a shared quota cannot be used by a set-group-ID"),
        "{}",
        out.dump()
    );
    assert_eq!(left(&out), vec![], "{}", out.dump());
    // set-user-ID root: the quota is root's, in /run/gpushim
    let out = alloc_run(&sb, "etc-quota", "modes-setuid", &[]);
    assert_limited(&out, "set-user-ID, shared quota");
    assert_eq!(left(&out), vec![("left./run/gpushim".to_string(), "0".to_string())], "{}", out.dump());
}

#[test]
fn without_the_set_user_id_bit_or_the_shim_the_environment_and_the_driver_decide() {
    let Some(sb) = Sandbox::new() else { return };
    // Not set-user-ID: the caller's environment is the program's, and it lifts the limit.
    let out = alloc_run(&sb, "etc-shim", "modes", &[("GPUSHIM_MEMORY_LIMIT", "unlimited".to_string())]);
    assert_eq!((out.num("init.rc"), out.num("op2.rc")), (0, 0), "{}", out.dump());
    let out = alloc_run(&sb, "etc-shim", "modes", &[]);
    assert_limited(&out, "the system file, not set-user-ID");
    // Not set-user-ID, CUDA_VISIBLE_DEVICES=1,0: ordinal 0 is GPU 1, which takes the system
    // file's `memory_limits.0`, and GPU 0 is unlimited (the set-user-ID test can tell).
    let out = sb.run("etc-ordinal", "nvml", &[("CUDA_VISIBLE_DEVICES", "1,0".to_string())], &["list"]);
    assert_eq!((out.num("count"), out.get("idx0.uuid"), out.u64("idx0.total")), (2, phys_uuid(0).as_str(), 16 * GIB), "{}", out.dump());
    assert_eq!(out.u64("idx1.total"), GIB, "{}", out.dump());
    // Without the shim: the 2 GiB the limit refuses is granted (the test can tell).
    let out = alloc_run(&sb, "etc-plain", "modes-setuid", &[]);
    assert_eq!((out.num("init.rc"), out.num("op2.rc"), out.num("op3.rc")), (0, 0, 0), "{}", out.dump());
}
