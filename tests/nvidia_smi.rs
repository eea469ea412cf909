//! The real `nvidia-smi` 535.261.03, 550.163.01 and 555.58.02 (Debian non-free, `scripts/fetch-drivers.sh`) over the
//! simulated NVML (`sim/nvml`, which answers `nvmlInternalGetExportTable`): without the shim it
//! lists the physical simulated GPUs; under the shim exactly the program's devices, in order,
//! with the limits as totals; plain `nvidia-smi` prints its table and exits 0.

mod common;
use common::*;
use std::process::Output;

const VERSIONS: [&str; 3] = ["535.261.03", "550.163.01", "555.58.02"];

fn smi(version: &str) -> std::path::PathBuf {
    let p = real_drivers_dir().join(format!("{version}/bin/nvidia-smi"));
    assert!(p.is_file(), "{}: run `bash scripts/fetch-drivers.sh`", p.display());
    p
}

thread_local! {
    /// The nvidia-smi version [`run`] uses on this thread (see [`each_version`]).
    static VERSION: std::cell::RefCell<&'static str> = const { std::cell::RefCell::new("535.261.03") };
}

/// Runs `f` once per nvidia-smi version.
fn each_version(f: impl Fn(&str)) {
    for v in VERSIONS {
        VERSION.with(|c| *c.borrow_mut() = v);
        f(v);
    }
}

const QUERY: &[&str] = &["--query-gpu=index,uuid,name,memory.total,memory.used", "--format=csv"];

fn run(args: &[&str], shim: bool, env: &[(&str, &str)]) -> Output {
    let v = VERSION.with(|v| *v.borrow());
    let mut cmd = target_command(smi(v));
    cmd.args(args).env_clear().env("PATH", "/usr/bin:/bin").env("LD_LIBRARY_PATH", sim_dir());
    cmd.env("GPUSIM_DEVICES", "4");
    let state = work_dir().join(format!("smi-state-{}", std::process::id()));
    std::fs::create_dir_all(&state).unwrap();
    std::fs::set_permissions(&state, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    cmd.env("GPUSHIM_STATE_DIR", &state);
    if shim {
        cmd.env("LD_PRELOAD", shim_path());
    }
    cmd.envs(env.iter().copied());
    cmd.output().unwrap()
}

/// The csv rows after the header, as (index, uuid, name, total, used).
fn rows(out: &Output) -> Vec<Vec<String>> {
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("index, uuid, name, memory.total [MiB], memory.used [MiB]"), "{text}");
    lines.map(|l| l.split(", ").map(str::to_owned).collect()).collect()
}

fn row(i: usize, uuid: &str, name: &str, mib: u64) -> Vec<String> {
    vec![i.to_string(), uuid.to_owned(), name.to_owned(), format!("{mib} MiB"), "0 MiB".to_owned()]
}

#[test]
fn without_the_shim_the_physical_devices() {
    each_version(|_| {
        let got = rows(&run(QUERY, false, &[]));
        let want: Vec<_> = (0..4).map(|p| row(p as usize, &phys_uuid(p), &phys_name(p), 16384)).collect();
        assert_eq!(got, want);
    });
}

#[test]
fn under_the_shim_the_programs_devices_in_order_with_the_limit() {
    each_version(|_| {
        let env = [("GPUSHIM_VISIBLE_DEVICES", "2,0"), ("GPUSHIM_MEMORY_LIMIT", "1GiB")];
        let got = rows(&run(QUERY, true, &env));
        assert_eq!(got, vec![row(0, &phys_uuid(2), &phys_name(2), 1024), row(1, &phys_uuid(0), &phys_name(0), 1024)]);
        // a limit that is not a whole number of MiB: nvidia-smi prints NVML's bytes in whole MiB
        let env = [("GPUSHIM_VISIBLE_DEVICES", "1"), ("GPUSHIM_MEMORY_LIMIT", "1.5GiB")];
        let got = rows(&run(QUERY, true, &env));
        assert_eq!(got, vec![row(0, &phys_uuid(1), &phys_name(1), 1536)]);
    });
}

#[test]
fn under_the_shim_each_virtual_part_is_a_device() {
    each_version(|_| {
        let env = [("GPUSHIM_VISIBLE_DEVICES", "3,1"), ("GPUSHIM_VIRTUAL_DEVICES", "1:2x4GiB")];
        let got = rows(&run(QUERY, true, &env));
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(got[0], row(0, &phys_uuid(3), &phys_name(3), 16384));
        for (i, r) in got.iter().enumerate().skip(1) {
            assert_eq!(r[0], i.to_string());
            assert_eq!(r[2], phys_name(1));
            assert_eq!(r[3], "4096 MiB");
            assert_ne!(r[1], phys_uuid(1), "a part has a UUID of its own");
        }
        assert_ne!(got[1][1], got[2][1]);
    });
}

#[test]
fn plain_nvidia_smi_prints_its_table() {
    each_version(|version| {
        for (shim, env) in [(false, &[][..]), (true, &[("GPUSHIM_VISIBLE_DEVICES", "2,0"), ("GPUSHIM_MEMORY_LIMIT", "1GiB")][..])] {
            let out = run(&[], shim, env);
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
            assert!(text.contains(&format!("NVIDIA-SMI {version}")), "{text}");
            assert!(!text.contains("ERR!"), "{text}");
            let gpus = text.lines().filter(|l| l.contains("gpusim device")).count();
            assert_eq!(gpus, if shim { 2 } else { 4 }, "{text}");
            if shim {
                assert_eq!(text.lines().filter(|l| l.contains(" 0MiB /") && l.contains(" 1024MiB")).count(), 2, "{text}");
                let first = text.find(&phys_name(2)).unwrap();
                assert!(first < text.find(&phys_name(0)).unwrap(), "{text}");
            } else {
                assert_eq!(text.lines().filter(|l| l.contains(" 0MiB /") && l.contains(" 16384MiB")).count(), 4, "{text}");
            }
        }
    });
}

/// GPU-Util comes from the simulated NVML's utilisation, which reads the node state's time
/// region (`sim/common/src/busy.rs`): a node file whose device 1 was half busy (every 100 ms
/// bucket of a process holds 50 ms, around now) shows 50 % on device 1, 0 % on the others.
#[test]
fn gpu_util_from_the_node_state() {
    // the layout of sim/common/src/busy.rs (node state version 2)
    const TIME_OFF: usize = 66_560;
    const DEV_SIZE: usize = 8_512;
    const DEV_HEADER: usize = 64;
    const FILE_SIZE: usize = TIME_OFF + 16 * DEV_SIZE;
    const BUCKET: u64 = 100_000_000;
    let dir = work_dir().join(format!("smi-util-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let path = dir.join("node");
    let mut file = vec![0u8; FILE_SIZE];
    file[0..8].copy_from_slice(b"gpusimND");
    file[8..12].copy_from_slice(&2u32.to_le_bytes());
    let ts = libc_timespec();
    let now = ts.0 * 1_000_000_000 + ts.1;
    let cur = now / BUCKET;
    let entry = TIME_OFF + DEV_SIZE + DEV_HEADER;
    file[entry..entry + 8].copy_from_slice(&4242u64.to_le_bytes());
    // epochs cur-20 .. cur+43: any "last second" of the next 4 s is half busy
    for e in cur - 20..cur + 44 {
        let word = ((e + 1) << 32) | (BUCKET / 2);
        let at = entry + 16 + 8 * (e as usize % 64);
        file[at..at + 8].copy_from_slice(&word.to_le_bytes());
    }
    std::fs::write(&path, &file).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let state = path.to_str().unwrap().to_owned();
    let out = run(&["--query-gpu=index,utilization.gpu", "--format=csv"], false, &[("GPUSIM_NODE_STATE", &state)]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines, vec!["index, utilization.gpu [%]", "0, 0 %", "1, 50 %", "2, 0 %", "3, 0 %"], "{text}");
}

/// CLOCK_MONOTONIC as (seconds, nanoseconds): `std::time::Instant` is CLOCK_MONOTONIC on Linux
/// but opaque, so it is read through the C library.
fn libc_timespec() -> (u64, u64) {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: a valid out-pointer; CLOCK_MONOTONIC (1) always exists.
    unsafe { clock_gettime(1, &mut ts) };
    (ts.sec as u64, ts.nsec as u64)
}
