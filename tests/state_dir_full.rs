//! A full or size-limited file system under the state directory (issue 26, item 3): the shim's
//! files there (the published figures, the registry of limited processes, a shared quota's file)
//! are mapped shared, and a page the file system cannot back was a SIGBUS in the program, a file
//! grown beyond `ulimit -f` a SIGXFSZ. Each program runs on the simulated driver in a mount
//! namespace of its own with a small tmpfs as its `GPUSHIM_STATE_DIR` (we are root), or under a
//! file size limit set before `exec`; none may die of a signal: the figures go unpublished, a
//! shared quota that cannot be set up is a configuration error naming the state directory.

mod common;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};

use common::*;

/// The published figures' file in this build (`live.rs`: 64 device entries).
const LIVE_FILE_BYTES: u64 = 13_432;
const LIMIT: u64 = 64 * MIB;

fn check(rc: libc::c_int) -> std::io::Result<()> {
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn c(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// What the child does before `exec`.
#[derive(Clone, Default)]
struct Confine {
    /// A tmpfs of this many KiB (mode 0700) mounted on the state directory, in a mount namespace
    /// of the child's own.
    tmpfs_kib: Option<u64>,
    /// Fill the tmpfs up (a file written until it is full).
    fill: bool,
    /// Written into the tmpfs first: a file name and its bytes, then its size (sparse beyond).
    file: Option<(String, Vec<u8>, u64)>,
    /// `RLIMIT_FSIZE` (bytes), soft and hard.
    fsize: Option<u64>,
}

impl Confine {
    /// The closure for [`Run::before_exec`] (everything it needs made here: it only makes
    /// system calls).
    fn before_exec(self, state: &Path) -> impl FnMut() -> std::io::Result<()> + Send + Sync + 'static {
        let dir = c(state);
        let options = CString::new(format!("size={}k,mode=0700", self.tmpfs_kib.unwrap_or(0))).unwrap();
        let filler = c(&state.join("filler"));
        let file = self.file.clone().map(|(name, bytes, size)| (c(&state.join(name)), bytes, size));
        let zeros = vec![0u8; 4096];
        move || {
            // SAFETY: system calls with NUL-terminated strings and live buffers, in the child
            // between fork and exec.
            unsafe {
                if self.tmpfs_kib.is_some() {
                    check(libc::unshare(libc::CLONE_NEWNS))?;
                    // (private: the tmpfs must not show in the test's own namespace)
                    check(libc::mount(c"none".as_ptr(), c"/".as_ptr(), std::ptr::null(), libc::MS_REC | libc::MS_PRIVATE, std::ptr::null()))?;
                    check(libc::mount(c"tmpfs".as_ptr(), dir.as_ptr(), c"tmpfs".as_ptr(), 0, options.as_ptr().cast()))?;
                }
                if let Some((path, bytes, size)) = &file {
                    let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC, 0o600);
                    check(fd)?;
                    if libc::write(fd, bytes.as_ptr().cast(), bytes.len()) != bytes.len() as isize {
                        return Err(std::io::Error::last_os_error());
                    }
                    check(libc::ftruncate(fd, *size as libc::off_t))?;
                    libc::close(fd);
                }
                if self.fill {
                    let fd = libc::open(filler.as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC, 0o600);
                    check(fd)?;
                    while libc::write(fd, zeros.as_ptr().cast(), zeros.len()) > 0 {}
                    libc::close(fd);
                }
                if let Some(n) = self.fsize {
                    check(libc::setrlimit(libc::RLIMIT_FSIZE, &libc::rlimit { rlim_cur: n, rlim_max: n }))?;
                }
            }
            Ok(())
        }
    }
}

/// A fresh state directory (the tmpfs' mount point when there is one).
fn state_dir(name: &str) -> PathBuf {
    let dir = fresh_dir(name).join("state");
    std::fs::create_dir(&dir).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    dir
}

/// The driver-API program (1 simulated 16 GiB device) running `ops` with `env`, its state
/// directory `state` confined as `confine` says, logging at `info`.
fn run(shim: bool, state: &Path, confine: &Confine, env: &[(&str, &str)], ops: &[String]) -> RunOutput {
    let out = Run::program(Program::Driver(DriverPath::Link))
        .shim(shim)
        .args(ops)
        .env("GPUSIM_DEVICES", "1")
        .env("GPUSIM_MEMORY", "16GiB")
        .env("GPUSHIM_STATE_DIR", state)
        .env("GPUSHIM_LOG", "info")
        .envs(env)
        .before_exec(confine.clone().before_exec(state))
        .run();
    assert_eq!(out.status.signal(), None, "killed by a signal\n{}", out.dump());
    out
}

/// The `info` line saying the figures are not published, without its temporary file's name
/// (`.proc-tmp-PID-NONCE`): `(directory, reason)`.
fn not_published(out: &RunOutput) -> (String, String) {
    let lines = out.gpushim_lines_with("not publishing");
    assert_eq!(lines.len(), 1, "{}", out.dump());
    let rest = lines[0]
        .strip_prefix("gpushim: info: not publishing this process' figures (gpushim ps, top, metrics will not show it): ")
        .unwrap_or_else(|| panic!("{}", out.dump()));
    let (tmp, reason) = rest.split_once(": ").unwrap();
    let (dir, name) = tmp.rsplit_once('/').unwrap();
    assert!(name.starts_with(".proc-tmp-"), "{}", out.dump());
    (dir.to_string(), reason.to_string())
}

/// A full state directory, nothing configured: the program runs as without the shim (before:
/// SIGBUS at `cuInit`, the published file's first write).
#[test]
fn nothing_configured_on_a_full_state_dir_runs() {
    let confine = Confine { tmpfs_kib: Some(64), fill: true, ..Confine::default() };
    let ops = [format!("alloc=mem:{}", 64 * MIB), "info".to_string()];
    for shim in [false, true] {
        let state = state_dir("full-nothing");
        let out = run(shim, &state, &confine, &[], &ops);
        out.assert_completed();
        assert_eq!((out.num("init.rc"), out.num("op1.rc"), out.u64("op2.free")), (0, 0, 16 * GIB - 64 * MIB), "shim {shim}\n{}", out.dump());
        if shim {
            let reason = format!("cannot allocate its {LIVE_FILE_BYTES} bytes: No space left on device (os error 28)");
            assert_eq!(not_published(&out), (state.display().to_string(), reason), "{}", out.dump());
        }
    }
}

/// A full state directory, a limit and no quota: the limit holds (48 MiB then 32 MiB of 64:
/// the second refused; both pass without the shim); neither the figures nor the limit are
/// published, one `info` line each (before: SIGBUS).
#[test]
fn a_limit_on_a_full_state_dir_holds_unpublished() {
    let confine = Confine { tmpfs_kib: Some(64), fill: true, ..Confine::default() };
    let ops = [format!("alloc=mem:{}", 48 * MIB), format!("alloc=mem:{}", 32 * MIB)];
    let limit = LIMIT.to_string();
    for shim in [false, true] {
        let state = state_dir("full-limit");
        let out = run(shim, &state, &confine, &[("GPUSHIM_MEMORY_LIMIT", &limit)], &ops);
        out.assert_completed();
        assert_eq!([out.num("op1.rc"), out.num("op2.rc")], if shim { [0, OOM] } else { [0, 0] }, "shim {shim}\n{}", out.dump());
        if shim {
            assert_eq!(not_published(&out).1, format!("cannot allocate its {LIVE_FILE_BYTES} bytes: No space left on device (os error 28)"));
            let quota_bytes = quota_file_bytes();
            assert_eq!(
                out.gpushim_lines_with("not registering"),
                vec![format!(
                    "gpushim: info: not registering this process' limits (no oversubscription warning): the state directory {} cannot hold limits: cannot allocate its {quota_bytes} bytes: No space left on device (os error 28); free space there, or set GPUSHIM_STATE_DIR to a directory with room",
                    state.display()
                )],
                "{}",
                out.dump()
            );
        }
    }
}

/// The size of a quota file (and of the registry) in this build, from a real one.
fn quota_file_bytes() -> u64 {
    std::fs::metadata(made_quota_file()).unwrap().len()
}

/// A quota file `quota-q` made by the shim (a program that joined it and left), in a state
/// directory of its own.
fn made_quota_file() -> PathBuf {
    static FILE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    FILE.get_or_init(|| {
        let state = state_dir("made-quota");
        let limit = LIMIT.to_string();
        let out = run(true, &state, &Confine::default(), &[("GPUSHIM_MEMORY_LIMIT", &limit), ("GPUSHIM_SHARED_QUOTA", "q")], &[format!("alloc=mem:{MIB}")]);
        out.assert_completed();
        assert_eq!(out.num("op1.rc"), 0, "{}", out.dump());
        state.join("quota-q")
    })
    .clone()
}

/// The configuration error of a quota whose file the state directory `state` cannot hold,
/// for `reason`.
fn cannot_hold(state: &Path, reason: &str) -> String {
    format!("gpushim: GPUSHIM_SHARED_QUOTA=\"q\": the state directory {} cannot hold quota-q: {reason}", state.display())
}

/// `n` copies of the driver-API program started at once by one shell (one mount namespace:
/// they share the tmpfs), each as [`run`] would, its state directory confined by `confine`:
/// each one's `key=value` lines, `gpushim` lines and exit status (`status=`, 128 + the signal
/// for one killed).
fn run_together(n: usize, state: &Path, confine: &Confine, env: &[(&str, &str)], ops: &[String]) -> Vec<(std::collections::BTreeMap<String, String>, Vec<String>)> {
    let out = scratch_path("together");
    const SCRIPT: &str = r#"prog=$1; out=$2; n=$3; shift 3
i=0
while [ $i -lt $n ]; do
  i=$((i+1))
  ( GPUSIM_REPORT="$out.$i.json" "$prog" "$@" > "$out.$i" 2>&1; echo "status=$?" >> "$out.$i" ) &
done
wait
echo done=1"#;
    let shell = Run::new("/bin/sh")
        .shim(true)
        .arg("-c")
        .arg(SCRIPT)
        .arg("sh")
        .arg(program(Program::Driver(DriverPath::Link)))
        .arg(&out)
        .arg(n.to_string())
        .args(ops)
        .env("GPUSIM_DEVICES", "1")
        .env("GPUSIM_MEMORY", "16GiB")
        .env("GPUSHIM_STATE_DIR", state)
        .env("GPUSHIM_LOG", "info")
        .envs(env)
        .before_exec(confine.clone().before_exec(state))
        .run();
    shell.assert_completed();
    (1..=n)
        .map(|i| {
            let text = std::fs::read_to_string(format!("{}.{i}", out.display())).unwrap();
            let lines = text.lines().filter(|l| l.starts_with("gpushim:")).map(str::to_string).collect();
            let kv = parse_kv(&text);
            assert_eq!(kv.get("status").map(String::as_str), Some("0"), "program {i} of {n}\n{text}");
            assert_eq!(kv.get("done").map(String::as_str), Some("1"), "program {i} of {n}\n{text}");
            (kv, lines)
        })
        .collect()
}

fn num(kv: &std::collections::BTreeMap<String, String>, key: &str) -> i64 {
    kv.get(key).unwrap_or_else(|| panic!("no {key} in {kv:?}")).parse().unwrap()
}

/// A shared quota on a full state directory: `cuInit` fails with one message naming the
/// directory, for each of 8 programs starting at once; no signal (before: SIGBUS).
#[test]
fn a_shared_quota_on_a_full_state_dir_is_a_configuration_error() {
    if skip_emulated("starts the programs from /bin/sh, a host program, with the target's library preloaded") {
        return;
    }
    let confine = Confine { tmpfs_kib: Some(64), fill: true, ..Confine::default() };
    let limit = LIMIT.to_string();
    let state = state_dir("full-quota");
    let reason = format!("cannot allocate its {} bytes: No space left on device (os error 28); free space there, or set GPUSHIM_STATE_DIR to a directory with room", quota_file_bytes());
    let env = [("GPUSHIM_MEMORY_LIMIT", limit.as_str()), ("GPUSHIM_SHARED_QUOTA", "q")];
    for (kv, lines) in run_together(8, &state, &confine, &env, &[format!("alloc=mem:{MIB}")]) {
        assert_ne!(num(&kv, "init.rc"), 0, "{kv:?}");
        assert_eq!(lines.iter().filter(|l| l.contains("GPUSHIM_SHARED_QUOTA")).collect::<Vec<_>>(), vec![&cannot_hold(&state, &reason)], "{lines:?}");
    }
}

/// A state directory with room for one quota file, not one per process, while another
/// process builds it (its temporary, linked to `quota-q` 0.5 s after the start): the program
/// refused room for its own waits for that one and joins it (48 MiB then 32 MiB of 64: the
/// second refused), instead of a configuration error.
#[test]
fn a_program_refused_room_joins_the_quota_being_built() {
    if skip_emulated("starts the programs from /bin/sh, a host program, with the target's library preloaded") {
        return;
    }
    let made = std::fs::read(made_quota_file()).unwrap();
    let tmp = ".quota-tmp-1-1";
    let confine = Confine { tmpfs_kib: Some(400), file: Some((tmp.into(), made.clone(), made.len() as u64)), ..Confine::default() };
    let limit = LIMIT.to_string();
    let state = state_dir("small-quota");
    const SCRIPT: &str = r#"tmp=$1; final=$2; shift 2
( sleep 0.5; ln "$tmp" "$final"; rm "$tmp" ) &
"$@"
rc=$?
wait
exit $rc"#;
    let out = Run::new("/bin/sh")
        .shim(true)
        .args(["-c", SCRIPT, "sh"])
        .arg(state.join(tmp))
        .arg(state.join("quota-q"))
        .arg(program(Program::Driver(DriverPath::Link)))
        .args([format!("alloc=mem:{}", 48 * MIB), format!("alloc=mem:{}", 32 * MIB)])
        .env("GPUSIM_DEVICES", "1")
        .env("GPUSIM_MEMORY", "16GiB")
        .env("GPUSHIM_STATE_DIR", &state)
        .env("GPUSHIM_MEMORY_LIMIT", &limit)
        .env("GPUSHIM_SHARED_QUOTA", "q")
        .before_exec(confine.before_exec(&state))
        .run();
    assert_eq!(out.status.signal(), None, "killed by a signal\n{}", out.dump());
    out.assert_completed();
    assert_eq!([out.num("init.rc"), out.num("op1.rc"), out.num("op2.rc")], [0, 0, OOM], "{}", out.dump());
}

/// A quota file left sparse (as builds before this one made them: sized, not allocated) on a
/// full state directory: a program joining it gets the configuration error, not a SIGBUS when
/// it writes its place.
#[test]
fn a_sparse_quota_file_on_a_full_state_dir_is_refused() {
    let made = std::fs::read(made_quota_file()).unwrap();
    let size = made.len() as u64;
    // its first page (header, lock, part of the device table); the places beyond are holes
    let confine = Confine { tmpfs_kib: Some(64), fill: true, file: Some(("quota-q".into(), made[..4096].to_vec(), size)), ..Confine::default() };
    let limit = LIMIT.to_string();
    let state = state_dir("full-sparse");
    let out = run(true, &state, &confine, &[("GPUSHIM_MEMORY_LIMIT", &limit), ("GPUSHIM_SHARED_QUOTA", "q")], &[format!("alloc=mem:{MIB}")]);
    out.assert_completed();
    assert_ne!(out.num("init.rc"), 0, "{}", out.dump());
    let reason = format!("cannot allocate its {size} bytes: No space left on device (os error 28); free space there, or set GPUSHIM_STATE_DIR to a directory with room");
    assert_eq!(out.gpushim_lines_with("GPUSHIM_SHARED_QUOTA"), vec![cannot_hold(&state, &reason)], "{}", out.dump());
    // with room, the same file is completed and joined
    let confine = Confine { fill: false, tmpfs_kib: Some(1024), ..confine };
    let out = run(true, &state, &confine, &[("GPUSHIM_MEMORY_LIMIT", &limit), ("GPUSHIM_SHARED_QUOTA", "q")], &[format!("alloc=mem:{}", 48 * MIB), format!("alloc=mem:{}", 32 * MIB)]);
    out.assert_completed();
    assert_eq!([out.num("init.rc"), out.num("op1.rc"), out.num("op2.rc")], [0, 0, OOM], "{}", out.dump());
}

/// A file size limit (`ulimit -f`) below a quota file's size: a configuration error naming the
/// limit, no SIGXFSZ; a quota whose file exists already needs no growth and is joined under the
/// same limit. Nothing configured, a limit below the published file's size: the program runs,
/// unpublished. (Before: SIGXFSZ in each of the first two.)
#[test]
fn a_file_size_limit_never_raises_sigxfsz() {
    let limit = LIMIT.to_string();
    let quota = [("GPUSHIM_MEMORY_LIMIT", limit.as_str()), ("GPUSHIM_SHARED_QUOTA", "q")];
    let ops = [format!("alloc=mem:{}", 48 * MIB), format!("alloc=mem:{}", 32 * MIB)];
    let small = Confine { fsize: Some(64 * 1024), ..Confine::default() };
    let state = state_dir("fsize-quota");
    let out = run(true, &state, &small, &quota, &ops);
    out.assert_completed();
    assert_ne!(out.num("init.rc"), 0, "{}", out.dump());
    let reason = format!("its {} bytes would pass this process' file size limit (65536 bytes, ulimit -f); raise the file size limit (ulimit -f) or set GPUSHIM_STATE_DIR elsewhere", quota_file_bytes());
    assert_eq!(out.gpushim_lines_with("GPUSHIM_SHARED_QUOTA"), vec![cannot_hold(&state, &reason)], "{}", out.dump());
    assert!(!state.join("quota-q").exists(), "no file left");
    // the quota's file made without the limit, then joined under it
    let made = run(true, &state, &Confine::default(), &quota, &[format!("alloc=mem:{MIB}")]);
    made.assert_completed();
    let out = run(true, &state, &small, &quota, &ops);
    out.assert_completed();
    assert_eq!([out.num("init.rc"), out.num("op1.rc"), out.num("op2.rc")], [0, 0, OOM], "{}", out.dump());

    let tiny = Confine { fsize: Some(8192), ..Confine::default() };
    for shim in [false, true] {
        let state = state_dir("fsize-nothing");
        let out = run(shim, &state, &tiny, &[], &ops);
        out.assert_completed();
        assert_eq!([out.num("init.rc"), out.num("op1.rc"), out.num("op2.rc")], [0, 0, 0], "shim {shim}\n{}", out.dump());
        if shim {
            let reason = format!("its {LIVE_FILE_BYTES} bytes would pass this process' file size limit (8192 bytes, ulimit -f)");
            assert_eq!(not_published(&out), (state.display().to_string(), reason), "{}", out.dump());
        }
    }

    // an exit report longer than the limit is not written (one warn line), never a SIGXFSZ
    // at exit (the simulator's own report off: it would be)
    let report = scratch_path("report.txt");
    let env = [("GPUSHIM_REPORT", report.to_str().unwrap()), ("GPUSIM_REPORT", "")];
    let out = run(true, &state_dir("fsize-report"), &Confine { fsize: Some(64), ..Confine::default() }, &env, &ops);
    out.assert_completed();
    let warned = out.warn_lines();
    let prefix = format!("gpushim: warn: cannot write the report to {}: its ", report.display());
    let bytes = warned.iter().find_map(|l| l.strip_prefix(&prefix)?.strip_suffix(" bytes would pass this process' file size limit (64 bytes, ulimit -f)"));
    assert!(bytes.is_some_and(|n| n.parse::<u64>().unwrap() > 64), "{}", out.dump());
    assert!(!report.exists(), "{}", out.dump());
}
