//! `gpushim cdi generate` on the simulated driver: the devices and their edits, exactly; the
//! spec against the CDI JSON schema (tests/cdi/schema.json, defs.json: the
//! cncf-tags/container-device-interface repository's schema/, commit 05ae4b5b, Apache-2.0;
//! validated with Python's `jsonschema`); the atomic --output; bad --slices; no driver; and a
//! real runtime applying it: Debian's podman writes the edits into the OCI config.json at
//! `podman init`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

fn cli() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_gpushim"))
}

/// `gpushim ARGS…` on 2 simulated GPUs of 16 GiB.
fn gpushim(args: &[&str]) -> Run {
    shim_path();
    nvml_sim_library();
    Run::new(cli()).args(args).env("GPUSIM_DEVICES", "2").env("GPUSIM_MEMORY", "16GiB")
}

fn spec(args: &[&str]) -> Value {
    let out = gpushim(args).run();
    assert_eq!(out.status.code(), Some(0), "{}", out.dump());
    serde_json::from_str(&out.stdout_text()).unwrap_or_else(|e| panic!("not JSON: {e}\n{}", out.dump()))
}

fn library() -> String {
    std::fs::canonicalize(shim_path()).unwrap().display().to_string()
}

fn device<'a>(spec: &'a Value, name: &str) -> &'a Value {
    spec["devices"].as_array().unwrap().iter().find(|d| d["name"] == name).unwrap_or_else(|| panic!("no device {name}: {spec}"))
}

fn env_of(spec: &Value, name: &str) -> Vec<String> {
    device(spec, name)["containerEdits"]["env"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect()
}

#[test]
fn devices_and_edits_exactly() {
    let s = spec(&["cdi", "generate", "--slices", "2", "--compute"]);
    assert_eq!(s["cdiVersion"], "0.5.0");
    assert_eq!(s["kind"], "gpushim.dev/gpu");
    let names: Vec<&str> = s["devices"].as_array().unwrap().iter().map(|d| d["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["0", "0-0", "0-1", "1", "1-0", "1-1"]);
    let preload = "LD_PRELOAD=/opt/gpushim/lib/libgpushim.so".to_string();
    for p in 0..2u32 {
        let uuid = phys_uuid(p);
        assert_eq!(env_of(&s, &p.to_string()), [preload.clone(), format!("GPUSHIM_VISIBLE_DEVICES={uuid}")], "whole GPU {p}");
        for k in 0..2 {
            assert_eq!(
                env_of(&s, &format!("{p}-{k}")),
                [
                    preload.clone(),
                    format!("GPUSHIM_VISIBLE_DEVICES={uuid}"),
                    format!("GPUSHIM_MEMORY_LIMIT={}", 8 * GIB),
                    format!("GPUSHIM_SHARED_QUOTA=gpushim-{uuid}-{k}"),
                    "GPUSHIM_COMPUTE_LIMIT=50%".to_string(),
                ]
            );
        }
    }
    for d in s["devices"].as_array().unwrap() {
        let edits = d["containerEdits"].as_object().unwrap();
        let keys: Vec<&str> = edits.keys().map(String::as_str).collect();
        assert_eq!(keys, ["env", "mounts"], "no device nodes, hooks or driver libraries: {d}");
        assert_eq!(
            d["containerEdits"]["mounts"],
            serde_json::json!([{"hostPath": library(), "containerPath": "/opt/gpushim/lib/libgpushim.so", "options": ["ro", "nosuid", "nodev", "bind"]}])
        );
    }
    // without --slices: the whole GPUs only; three slices of 16 GiB, a third of the time each
    let whole = spec(&["cdi", "generate"]);
    assert_eq!(whole["devices"].as_array().unwrap().len(), 2);
    let thirds = spec(&["cdi", "generate", "--slices", "3", "--compute"]);
    let e = env_of(&thirds, "1-2");
    assert_eq!(e[2], format!("GPUSHIM_MEMORY_LIMIT={}", 16 * GIB / 3));
    assert_eq!(e[4], "GPUSHIM_COMPUTE_LIMIT=33.3333%");
    // without --compute no compute share
    assert_eq!(env_of(&spec(&["cdi", "generate", "--slices", "4"]), "0-3").len(), 4);
}

/// The spec validates against the CDI project's JSON schema; a broken one does not (the
/// validator can fail).
#[test]
fn spec_validates_against_the_cdi_schema() {
    let Some(python) = python_with("jsonschema", "the CDI schema check") else { return };
    let dir = fresh_dir("cdi-schema");
    let good = dir.join("good.json");
    let s = spec(&["cdi", "generate", "--slices", "2", "--compute"]);
    std::fs::write(&good, serde_json::to_string(&s).unwrap()).unwrap();
    let mut bad = s.clone();
    bad["devices"][0]["containerEdits"]["env"] = serde_json::json!("LD_PRELOAD=x");
    let bad_path = dir.join("bad.json");
    std::fs::write(&bad_path, serde_json::to_string(&bad).unwrap()).unwrap();
    let validate = |p: &Path| {
        Command::new(&python)
            .arg(workspace_root().join("tests/cdi/validate.py"))
            .arg(p)
            .output()
            .unwrap()
    };
    let out = validate(&good);
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let out = validate(&bad_path);
    assert!(!out.status.success(), "a spec whose env is a string must fail the schema");
}

#[test]
fn output_is_written_atomically() {
    let dir = fresh_dir("cdi-out");
    let path = dir.join("gpushim.json");
    std::fs::write(&path, "old").unwrap();
    let out = gpushim(&["cdi", "generate", "--slices", "2", "--output", path.to_str().unwrap()]).run();
    assert_eq!(out.status.code(), Some(0), "{}", out.dump());
    assert_eq!(out.stdout_text(), "", "nothing on stdout with --output");
    let written: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(written, spec(&["cdi", "generate", "--slices", "2"]));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o644);
    let names: Vec<String> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(names, ["gpushim.json"], "no temporary file left");
    // a directory that does not exist: an error naming the path, status 1
    let missing = dir.join("no/such/dir.json");
    let out = gpushim(&["cdi", "generate", "--output", missing.to_str().unwrap()]).run();
    assert_eq!(out.status.code(), Some(1), "{}", out.dump());
    assert!(out.stderr_text().starts_with(&format!("gpushim cdi generate: {}: ", missing.display())), "{}", out.dump());
}

/// A GPU lost (NVML_ERROR_GPU_IS_LOST on its handle) is left out of the spec with a warning
/// naming it; every GPU lost: status 1.
#[test]
fn lost_gpu_is_left_out() {
    let dir = fresh_dir("cdi-lost");
    let lost = dir.join("lost");
    std::fs::write(&lost, "0\n").unwrap();
    let out = gpushim(&["cdi", "generate", "--slices", "2"]).env("GPUSIM_LOST", &lost).run();
    assert_eq!(out.status.code(), Some(0), "{}", out.dump());
    assert_eq!(
        out.stderr_text(),
        "gpushim cdi generate: warning: GPU 0 left out: nvmlDeviceGetHandleByIndex_v2 on GPU 0 failed (NVML_ERROR_GPU_IS_LOST, code 15)\n",
        "(a stale simulator without GPUSIM_LOST? rebuild sim/nvml)"
    );
    let s: Value = serde_json::from_str(&out.stdout_text()).unwrap();
    let names: Vec<&str> = s["devices"].as_array().unwrap().iter().map(|d| d["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["1", "1-0", "1-1"]);
    assert_eq!(env_of(&s, "1-1")[1], format!("GPUSHIM_VISIBLE_DEVICES={}", phys_uuid(1)));
    std::fs::write(&lost, "0,1\n").unwrap();
    let out = gpushim(&["cdi", "generate"]).env("GPUSIM_LOST", &lost).run();
    assert_eq!(out.status.code(), Some(1), "{}", out.dump());
    assert!(out.stderr_text().ends_with("gpushim cdi generate: no GPU answers (every one is lost)\n"), "{}", out.dump());
    assert_eq!(out.stdout_text(), "");
}

#[test]
fn bad_slices_and_no_driver() {
    for n in ["0", "129", "99999999999999999999", "abc", "-1", "2.5"] {
        let out = gpushim(&["cdi", "generate", "--slices", n]).run();
        assert_eq!(out.status.code(), Some(2), "--slices {n}: {}", out.dump());
        assert_eq!(out.stderr_text().trim_end(), "gpushim cdi: --slices needs a number of slices from 1 to 128, like --slices 4", "--slices {n}");
    }
    let out = gpushim(&["cdi", "frobnicate"]).run();
    assert_eq!(out.status.code(), Some(2), "{}", out.dump());
    let out = gpushim(&["cdi", "generate"]).env("GPUSHIM_NVML_PATH", "/nonexistent/libnvidia-ml.so.1").run();
    assert_eq!(out.status.code(), Some(1), "{}", out.dump());
    assert!(out.stderr_text().starts_with("gpushim cdi generate: no NVIDIA driver: cannot open /nonexistent/libnvidia-ml.so.1"), "{}", out.dump());
    assert_eq!(out.stdout_text(), "");
}

// ---------------------------------------------------------------------------------------
// podman applies the spec
// ---------------------------------------------------------------------------------------

/// Runs `cmd` to its end within `limit` (killed after it), returning (status, stdout, stderr).
fn bounded(cmd: &mut Command, limit: Duration) -> (Option<i32>, String, String) {
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("start");
    let deadline = Instant::now() + limit;
    loop {
        if let Some(_) = child.try_wait().unwrap() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The podman part, run in a private mount namespace (`unshare --mount`) where a tmpfs covers
/// /run: podman 4.3 reads CDI specs only from /etc/cdi and /var/run/cdi (no `cdi_spec_dirs`,
/// no `--cdi-spec-dir`), so the spec goes to that namespace's /var/run/cdi, with podman's run
/// root beside it; its storage root is in the test's directory, a tmpfs covers
/// /var/lib/containers (podman's blob-info cache) and the containers have no network (no CNI
/// lock in /etc/cni/net.d). Nothing of the machine's own containers or CDI specs is seen or
/// touched, and nothing is left when the namespace ends.
/// `$1`: the test directory (spec.json, rootfs.tar; config.json and unknown.txt are written).
const PODMAN_SCRIPT: &str = r#"
set -u
dir="$1"
mount -t tmpfs -o mode=0755 tmpfs /run || { echo "SKIP: cannot mount a tmpfs on /run"; exit 0; }
mkdir -p /run/cdi /run/podman-test /run/xdg /var/lib/containers
mount -t tmpfs -o mode=0700 tmpfs /var/lib/containers || { echo "SKIP: cannot mount a tmpfs on /var/lib/containers"; exit 0; }
cp "$dir/spec.json" /run/cdi/gpushim.json
printf '[storage]\ndriver = "vfs"\ngraphroot = "%s/root"\nrunroot = "/run/podman-test"\n' "$dir" > "$dir/storage.conf"
printf '[engine]\nevents_logger = "none"\ncgroup_manager = "cgroupfs"\n' > "$dir/containers.conf"
export XDG_RUNTIME_DIR=/run/xdg TMPDIR="$dir/tmp" CONTAINERS_CONF="$dir/containers.conf" CONTAINERS_STORAGE_CONF="$dir/storage.conf"
p() { podman --root "$dir/root" --runroot /run/podman-test "$@"; }
p import "$dir/rootfs.tar" localhost/gpushim-cdi-test:latest >/dev/null || { echo "SKIP: podman cannot import an image here"; exit 0; }
id=$(p create --network none --device gpushim.dev/gpu=0-1 localhost/gpushim-cdi-test:latest /bin/busybox true) || exit 11
# init applies the CDI edits and writes config.json; the runtime may then fail to create the
# container where this machine forbids it (a container without RLIMIT_NOFILE rights)
p init "$id" >/dev/null 2>"$dir/init.txt"
cp "$dir/root/vfs-containers/$id/userdata/config.json" "$dir/config.json" || { cat "$dir/init.txt"; exit 13; }
id2=$(p create --network none --device gpushim.dev/gpu=7-7 localhost/gpushim-cdi-test:latest /bin/busybox true) || exit 14
p init "$id2" >/dev/null 2>"$dir/unknown.txt" && exit 15
p rm --all --force >/dev/null 2>&1
exit 0
"#;

/// Whether a private mount namespace can be made here (`unshare --mount true`): not in an
/// unprivileged container.
fn unshare_works() -> Result<(), String> {
    let (code, _, err) = bounded(Command::new("unshare").args(["--mount", "--propagation", "private", "true"]), Duration::from_secs(30));
    if code == Some(0) {
        Ok(())
    } else {
        Err(format!("`unshare --mount true` fails here ({code:?}: {}): no private mount namespace", err.trim()))
    }
}

#[test]
fn podman_applies_the_spec() {
    if Command::new("podman").arg("--version").output().is_err() {
        eprintln!("SKIPPED: podman is not installed (Debian package podman; scripts/test.sh installs it as root)");
        return;
    }
    // SAFETY: geteuid has no precondition.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: the podman test runs as root only (a private mount namespace)");
        return;
    }
    if let Err(why) = unshare_works() {
        eprintln!("SKIPPED: {why}");
        return;
    }
    // root, podman and a namespace: under CI nothing may skip from here on
    let ci = std::env::var_os("CI").is_some();
    let dir = fresh_dir("podman");
    for d in ["tmp", "root", "rootfs/bin"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    let out = gpushim(&["cdi", "generate", "--slices", "2", "--output", dir.join("spec.json").to_str().unwrap()]).run();
    assert_eq!(out.status.code(), Some(0), "{}", out.dump());
    // a local image (no registry): a tiny root file system, a static busybox when there is one
    let busybox = Path::new("/bin/busybox");
    if busybox.exists() {
        std::fs::copy(busybox, dir.join("rootfs/bin/busybox")).unwrap();
    }
    let (code, _, err) = bounded(Command::new("tar").arg("-C").arg(dir.join("rootfs")).arg("-cf").arg(dir.join("rootfs.tar")).arg("."), Duration::from_secs(30));
    assert_eq!(code, Some(0), "{err}");
    let (code, out, err) = bounded(
        Command::new("unshare").args(["--mount", "--propagation", "private", "sh", "-c", PODMAN_SCRIPT, "sh"]).arg(&dir),
        Duration::from_secs(240),
    );
    let _ = std::fs::remove_dir_all(dir.join("root"));
    if out.contains("SKIP: ") {
        assert!(!ci, "CI is set, the machine is root with unshare working, yet: {}\n{err}", out.trim());
        eprintln!("SKIPPED: {}", out.trim());
        return;
    }
    assert_eq!(code, Some(0), "the podman script failed (11 create, 13 no config.json after init, 14/15 the unknown device):\n{out}\n{err}");
    let oci: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let env: Vec<&str> = oci["process"]["env"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    let uuid = phys_uuid(0);
    for want in [
        "LD_PRELOAD=/opt/gpushim/lib/libgpushim.so".to_string(),
        format!("GPUSHIM_VISIBLE_DEVICES={uuid}"),
        format!("GPUSHIM_MEMORY_LIMIT={}", 8 * GIB),
        format!("GPUSHIM_SHARED_QUOTA=gpushim-{uuid}-1"),
    ] {
        assert!(env.contains(&want.as_str()), "{want} not in {env:?}");
    }
    assert!(!env.iter().any(|e| e.starts_with("GPUSHIM_COMPUTE_LIMIT=")), "{env:?}");
    let mounts = oci["mounts"].as_array().unwrap();
    let m = mounts
        .iter()
        .find(|m| m["destination"] == "/opt/gpushim/lib/libgpushim.so")
        .unwrap_or_else(|| panic!("no library mount in {mounts:?}"));
    assert_eq!(m["source"], library());
    let options: Vec<&str> = m["options"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(options.contains(&"ro") && options.contains(&"bind"), "{options:?}");
    // no device node from gpushim's spec
    let nodes = oci["linux"]["devices"].as_array().map_or(0, |d| d.len());
    assert_eq!(nodes, 0, "{}", oci["linux"]["devices"]);
    // an unknown device: podman refuses it at init, naming it
    let unknown = std::fs::read_to_string(dir.join("unknown.txt")).unwrap();
    assert!(unknown.contains("gpushim.dev/gpu=7-7"), "{unknown}");
}
