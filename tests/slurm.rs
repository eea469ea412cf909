//! `gpushim slurm task-prolog` under a real Slurm: Debian's slurmctld, slurmd and munged (Slurm
//! 22.05) started by the test in a private directory, one node with two fake GPUs
//! (`File=/dev/null`, `/dev/zero`: device files every container has) of 4 shards each, the
//! simulated driver (16 GiB and 12 GiB GPUs), and the TaskProlog running
//! `gpushim slurm task-prolog --shards-per-gpu 4`. Needs root (slurmd) and the packages
//! slurmctld, slurmd, slurm-client and munge (scripts/test.sh installs them); without them the
//! test says why and passes — unless the variable `CI` is set: there it fails, saying why. Every
//! wait is bounded; the daemons are stopped by pid when the test ends, failed or not, and die
//! with the test's thread should it be killed (`PR_SET_PDEATHSIG`).

mod common;

use common::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SHARDS_PER_GPU: u64 = 4;
/// The simulated GPUs' memory: different, so that a limit taken from the wrong GPU shows.
const MEMORY: [u64; 2] = [16 << 30, 12 << 30];
const MIB: u64 = 1 << 20;

/// The daemons' programs, found where Debian puts them.
fn program(name: &str) -> Option<PathBuf> {
    ["/usr/sbin", "/usr/bin", "/sbin", "/bin"].iter().map(|d| Path::new(d).join(name)).find(|p| p.is_file())
}

/// A free port, held (so that a second call gets another one) until the listener is dropped.
fn free_port() -> (std::net::TcpListener, u16) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    (l, port)
}

/// The test cannot run here: a skip, or under CI (the variable `CI` set) a failure.
fn skip(why: &str) {
    assert!(std::env::var_os("CI").is_none(), "slurm: CI is set, so the test must run, but it cannot: {why}");
    eprintln!("SKIPPED slurm: {why}");
}

/// A single-node Slurm of its own, stopped (jobs cancelled, daemons killed by pid) on drop.
struct Cluster {
    dir: PathBuf,
    conf: PathBuf,
    /// (name, process), in start order: munged, slurmctld, slurmd.
    daemons: Vec<(&'static str, Child)>,
    /// Files whose existence ends the holding jobs (made on drop, so that no job outlives us).
    go_files: Vec<PathBuf>,
}

impl Cluster {
    fn start(dir: &Path) -> Result<Cluster, String> {
        let mut buf = [0u8; 256];
        // SAFETY: gethostname writes at most buf.len() bytes into buf.
        let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
        assert_eq!(rc, 0, "gethostname");
        let name = String::from_utf8_lossy(&buf[..buf.iter().position(|&b| b == 0).unwrap_or(buf.len())]).into_owned();
        // the short name, as slurmd compares it
        let host = name.split('.').next().unwrap_or("").to_string();
        if host.is_empty() {
            return Err("this machine has no host name".into());
        }
        let munge = dir.join("munge");
        std::fs::create_dir_all(munge.join("key")).unwrap();
        for d in ["state", "spool", "log"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&munge, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(munge.join("key"), std::fs::Permissions::from_mode(0o700)).unwrap();
        let socket = munge.join("socket");
        assert!(socket.as_os_str().len() < 100, "the munge socket's path is too long for a unix socket: {}", socket.display());
        let key = munge.join("key/munge.key");
        let st = Command::new(program("mungekey").unwrap()).arg("--create").arg("--keyfile").arg(&key).status().map_err(|e| e.to_string())?;
        assert!(st.success(), "mungekey failed");
        let mut cluster = Cluster { dir: dir.to_path_buf(), conf: dir.join("slurm.conf"), daemons: vec![], go_files: vec![] };
        cluster.spawn(
            "munged",
            Command::new(program("munged").unwrap())
                .args(["--foreground", "--force", "--num-threads=2"])
                .arg(format!("--socket={}", socket.display()))
                .arg(format!("--key-file={}", key.display()))
                .arg(format!("--pid-file={}", munge.join("munged.pid").display()))
                .arg(format!("--log-file={}", munge.join("munged.log").display()))
                .arg(format!("--seed-file={}", munge.join("munged.seed").display())),
        );
        wait_for("munged's socket", Duration::from_secs(20), || socket.exists().then_some(()));

        // the TaskProlog: a wrapper, as a site would install it
        let prolog = dir.join("task-prolog.sh");
        std::fs::write(
            &prolog,
            format!(
                "#!/bin/sh\nexec {} slurm task-prolog --shards-per-gpu {SHARDS_PER_GPU} --compute --library {}\n",
                profile_dir().join("gpushim").display(),
                shim_path().display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&prolog, std::fs::Permissions::from_mode(0o755)).unwrap();
        let d = dir.display();
        // both ports held until the configuration is written (two distinct ports)
        let ((ctld_listener, ctld_port), (slurmd_listener, slurmd_port)) = (free_port(), free_port());
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        std::fs::write(
            &cluster.conf,
            format!(
                "ClusterName=gpushimtest\n\
                 SlurmctldHost={host}(127.0.0.1)\n\
                 SlurmctldPort={ctld_port}\n\
                 SlurmdPort={slurmd_port}\n\
                 SlurmUser=root\n\
                 SlurmdUser=root\n\
                 AuthType=auth/munge\n\
                 AuthInfo=socket={socket}\n\
                 CredType=cred/munge\n\
                 StateSaveLocation={d}/state\n\
                 SlurmdSpoolDir={d}/spool\n\
                 SlurmctldPidFile={d}/slurmctld.pid\n\
                 SlurmdPidFile={d}/slurmd.pid\n\
                 SlurmctldLogFile={d}/log/slurmctld.log\n\
                 SlurmdLogFile={d}/log/slurmd.log\n\
                 ProctrackType=proctrack/pgid\n\
                 TaskPlugin=task/none\n\
                 JobAcctGatherType=jobacct_gather/none\n\
                 AccountingStorageType=accounting_storage/none\n\
                 JobCompType=jobcomp/none\n\
                 SchedulerType=sched/builtin\n\
                 SelectType=select/cons_tres\n\
                 SelectTypeParameters=CR_Core\n\
                 MpiDefault=none\n\
                 ReturnToService=2\n\
                 InactiveLimit=0\n\
                 KillWait=2\n\
                 MinJobAge=300\n\
                 GresTypes=gpu,shard\n\
                 TaskProlog={prolog}\n\
                 NodeName=n0 NodeHostname={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=500 Gres=gpu:2,shard:{shards} State=UNKNOWN\n\
                 PartitionName=test Nodes=n0 Default=YES MaxTime=10 State=UP OverSubscribe=FORCE:4\n",
                socket = socket.display(),
                prolog = prolog.display(),
                shards = 2 * SHARDS_PER_GPU,
            ),
        )
        .unwrap();
        std::fs::write(
            dir.join("gres.conf"),
            format!("Name=gpu File=/dev/null\nName=gpu File=/dev/zero\nName=shard Count={}\n", 2 * SHARDS_PER_GPU),
        )
        .unwrap();
        drop((ctld_listener, slurmd_listener));
        let conf = cluster.conf.clone();
        cluster.spawn("slurmctld", Command::new(program("slurmctld").unwrap()).args(["-D", "-i", "-f"]).arg(&conf));
        cluster.spawn("slurmd", Command::new(program("slurmd").unwrap()).args(["-D", "-N", "n0", "-f"]).arg(&conf));
        Ok(cluster)
    }

    fn spawn(&mut self, name: &'static str, cmd: &mut Command) {
        let log = std::fs::File::create(self.dir.join(format!("log/{name}.out"))).unwrap();
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl only, between fork and exec (async-signal-safe): the daemon gets SIGKILL
        // when the thread that started it ends, so a killed test leaves no daemon behind.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0);
                Ok(())
            });
        }
        let child = cmd
            .env("SLURM_CONF", &self.conf)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        self.daemons.push((name, child));
    }

    /// A client command (sinfo, srun, sbatch…) with the jobs' environment: the simulated driver
    /// and NVML, their GPUs' memory, a state directory of the test's own.
    fn client(&self, name: &str) -> Command {
        let mut cmd = Command::new(name);
        cmd.env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            .env("SLURM_CONF", &self.conf)
            .env("LD_LIBRARY_PATH", sim_dir())
            .env("GPUSIM_MEMORY", format!("{}B,{}B", MEMORY[0], MEMORY[1]))
            .env("GPUSHIM_STATE_DIR", self.dir.join("shim-state"))
            .current_dir(&self.dir);
        cmd
    }

    /// Runs `cmd` to its end, within `limit` (killed after it): (status, stdout + stderr).
    fn run(&self, cmd: &mut Command, limit: Duration) -> (Option<i32>, String) {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let out = self.dir.join(format!("log/client-{}.out", N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)));
        let file = std::fs::File::create(&out).unwrap();
        let mut child = cmd.stdin(Stdio::null()).stdout(file.try_clone().unwrap()).stderr(file).spawn().expect("start a Slurm client");
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st.code();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        (status, std::fs::read_to_string(&out).unwrap_or_default())
    }

    /// `squeue`: job id → (state, reason).
    fn queue(&self) -> BTreeMap<String, (String, String)> {
        let (st, out) = self.run(self.client("squeue").args(["-h", "-o", "%i %T %r"]), Duration::from_secs(20));
        assert_eq!(st, Some(0), "squeue: {out}");
        out.lines()
            .filter_map(|l| {
                let mut w = l.split_whitespace();
                Some((w.next()?.to_string(), (w.next()?.to_string(), w.next().unwrap_or("").to_string())))
            })
            .collect()
    }

    /// `sbatch` of `script` with `args`: the job's id.
    fn sbatch(&mut self, args: &[&str], script: &Path, name: &str) -> String {
        self.sbatch_env(args, script, name, &[])
    }

    /// `sbatch` from a shell with `env` set too (what the job inherits).
    fn sbatch_env(&mut self, args: &[&str], script: &Path, name: &str, env: &[(&str, String)]) -> String {
        self.go_files.push(self.dir.join(format!("go-{name}")));
        let out_file = self.dir.join(format!("{name}.out"));
        let (st, out) = self.run(
            self.client("sbatch").envs(env.iter().map(|(k, v)| (k, v))).args(["--parsable", "-J", name, "-o"]).arg(&out_file).args(args).arg(script).arg(name),
            Duration::from_secs(30),
        );
        assert_eq!(st, Some(0), "sbatch {args:?}: {out}\n{}", self.logs());
        out.trim().to_string()
    }

    /// The daemons' logs, for a failure's message.
    fn logs(&self) -> String {
        let mut s = String::new();
        for name in ["slurmctld.log", "slurmd.log", "slurmctld.out", "slurmd.out"] {
            let text = std::fs::read_to_string(self.dir.join("log").join(name)).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            s += &format!("--- {name} (last lines)\n{}\n", tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
        }
        s
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // the jobs first (a job's slurmstepd outlives slurmd), within bounds, then the daemons
        for f in &self.go_files {
            let _ = std::fs::write(f, "");
        }
        if self.daemons.len() == 3 {
            let _ = self.run(self.client("scancel").args(["--partition", "test"]), Duration::from_secs(10));
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                let (st, out) = self.run(self.client("squeue").args(["-h", "-t", "RUNNING,COMPLETING,PENDING"]), Duration::from_secs(5));
                if st == Some(0) && out.trim().is_empty() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        for (_, child) in self.daemons.iter_mut().rev() {
            // SAFETY: kill(2) of our own child, still unreaped (so the pid is not reused).
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Polls `f` every 100 ms until it gives a value; fails after `limit`.
fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {limit:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The cluster's private directory: under target/tmp, unless that path is too long for the
/// unix sockets in it (slurmd's `SPOOL/n0_JOB.STEP`, at most 107 bytes): then a directory of
/// this process in the temporary directory (0700; one of a process no longer alive is removed).
fn cluster_dir() -> PathBuf {
    let dir = fresh_dir("slurm");
    if dir.as_os_str().len() + "/spool/n0_99999999.4294967294".len() <= 107 {
        return dir;
    }
    let tmp = std::env::temp_dir();
    for e in std::fs::read_dir(&tmp).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(pid) = name.strip_prefix("slurmtest-").and_then(|p| p.parse::<u32>().ok()) {
            if !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    let short = tmp.join(format!("slurmtest-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&short);
    std::fs::create_dir(&short).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o700)).unwrap();
    eprintln!("slurm: {} is too long a path for the cluster's sockets; using {}", dir.display(), short.display());
    short
}

/// Why this machine cannot run the test, if it cannot.
fn missing() -> Option<String> {
    // SAFETY: getuid cannot fail.
    if unsafe { libc::getuid() } != 0 {
        return Some("slurmd needs root".into());
    }
    for (p, package) in [("slurmctld", "slurmctld"), ("slurmd", "slurmd"), ("munged", "munge"), ("mungekey", "munge"), ("srun", "slurm-client"), ("sbatch", "slurm-client")] {
        if program(p).is_none() {
            return Some(format!("{p} is not installed (package {package})"));
        }
    }
    for dev in ["/dev/null", "/dev/zero"] {
        if !Path::new(dev).exists() {
            return Some(format!("{dev} (a fake GPU's device file) does not exist"));
        }
    }
    None
}

/// The job script: what the task-prolog gave it, what the program sees, then it holds until
/// its go file exists (at most 120 s).
fn job_script(dir: &Path, drvapi: &Path, ops: &str) -> PathBuf {
    let path = dir.join("job.sh");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\n\
             echo job=$SLURM_JOB_ID\n\
             echo cvd=$CUDA_VISIBLE_DEVICES\n\
             echo step_gpus=${{SLURM_STEP_GPUS-none}}\n\
             echo job_gpus=${{SLURM_JOB_GPUS-none}}\n\
             echo step_id=${{SLURM_STEP_ID-none}}\n\
             echo shards=${{SLURM_SHARDS_ON_NODE-none}}\n\
             echo preload=${{LD_PRELOAD-none}}\n\
             echo limit=${{GPUSHIM_MEMORY_LIMIT-none}}\n\
             echo quota=${{GPUSHIM_SHARED_QUOTA-none}}\n\
             echo compute=${{GPUSHIM_COMPUTE_LIMIT-none}}\n\
             {drvapi} {ops}\n\
             echo program=$?\n\
             srun {drvapi} info | sed 's/^/step./'\n\
             touch {dir}/ready-$1\n\
             i=0; while [ ! -e {dir}/go-$1 ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done\n\
             echo done\n",
            drvapi = drvapi.display(),
            dir = dir.display(),
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn kv(dir: &Path, name: &str) -> BTreeMap<String, String> {
    parse_kv(&std::fs::read_to_string(dir.join(format!("{name}.out"))).unwrap_or_default())
}

fn num(m: &BTreeMap<String, String>, k: &str, what: &str) -> u64 {
    m.get(k).and_then(|v| v.trim().parse().ok()).unwrap_or_else(|| panic!("{what}: no number {k} in {m:?}"))
}

#[test]
fn shards_under_a_real_slurm() {
    if let Some(why) = missing() {
        return skip(&why);
    }
    let t0 = Instant::now();
    let drvapi = common::program(Program::Driver(DriverPath::Link));
    shim_path();
    nvml_sim_library();
    assert!(profile_dir().join("gpushim").is_file(), "build the gpushim command first");
    // without Slurm and without the shim, the program sees each whole GPU
    for (i, mem) in MEMORY.iter().enumerate() {
        let o = Run::new(&drvapi).env("CUDA_VISIBLE_DEVICES", i.to_string()).env("GPUSIM_MEMORY", format!("{}B,{}B", MEMORY[0], MEMORY[1])).arg("info").run();
        o.assert_completed();
        assert_eq!(o.u64("op1.total"), *mem, "GPU {i} without the shim: {}", o.dump());
    }

    let dir = cluster_dir();
    let mut c = match Cluster::start(&dir) {
        Ok(c) => c,
        Err(why) => return skip(&why),
    };
    let up = wait_for("the node to be idle (sinfo)", Duration::from_secs(90), || {
        let (st, out) = c.run(c.client("sinfo").args(["-h", "-N", "-o", "%T"]), Duration::from_secs(10));
        (st == Some(0) && out.trim() == "idle").then(|| t0.elapsed())
    });
    eprintln!("slurm: node idle {:.1} s after the start", up.as_secs_f64());

    // 1. a whole-GPU job holds one GPU: nothing limits it (no shim), it sees the whole GPU —
    //    even submitted from inside a shard job (Slurm 22.05 keeps the inherited
    //    SLURM_SHARDS_ON_NODE in a job with a GPU: the prolog asks Slurm what the job holds)
    let script = job_script(&dir, &drvapi, "info");
    let w = c.sbatch_env(&["--gres=gpu:1"], &script, "whole", &[("SLURM_SHARDS_ON_NODE", "2".into())]);
    wait_for("the whole-GPU job to start", Duration::from_secs(60), || dir.join("ready-whole").exists().then_some(()));
    let whole = kv(&dir, "whole");
    let got = [&whole["preload"], &whole["limit"], &whole["quota"], &whole["compute"]];
    assert_eq!(got, ["none"; 4], "{whole:?}");
    eprintln!("slurm: the whole-GPU job's inherited SLURM_SHARDS_ON_NODE: {}", whole["shards"]);
    let w_gpu: usize = whole["cvd"].parse().unwrap_or_else(|_| panic!("{whole:?}"));
    assert_eq!(num(&whole, "op1.total", "whole-GPU job"), MEMORY[w_gpu], "{whole:?}");
    assert_eq!(num(&whole, "step.op1.total", "whole-GPU job's srun step"), MEMORY[w_gpu], "{whole:?}");
    let gpu = 1 - w_gpu;
    eprintln!("slurm: the whole-GPU job is on GPU {w_gpu}, the shards on GPU {gpu}");
    let limit = MEMORY[gpu] * 2 / SHARDS_PER_GPU;

    // 2. srun --gres=shard:2 on the other GPU: the shim, with 2/4 of that GPU's memory, one
    //    budget for the job's processes (a second process sees what the first holds taken)
    let t = Instant::now();
    let held = dir.join("held");
    let (st, out) = c.run(
        c.client("srun").args(["--gres=shard:2", "sh", "-c"]).arg(format!(
            "echo job=$SLURM_JOB_ID; echo cvd=$CUDA_VISIBLE_DEVICES; echo step_gpus=${{SLURM_STEP_GPUS-none}}; echo job_gpus=${{SLURM_JOB_GPUS-none}}; echo step_id=${{SLURM_STEP_ID-none}}; echo preload=$LD_PRELOAD; echo quota=$GPUSHIM_SHARED_QUOTA; echo compute=$GPUSHIM_COMPUTE_LIMIT; \
             {d} info alloc=mem:{above} alloc=mem:{within}; \
             {d} alloc=mem:{hold} touch={held} sleep=30000 >/dev/null & \
             i=0; while [ ! -e {held} ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; \
             {d} info alloc=mem:{half} | sed 's/^/second./'; kill $!",
            d = drvapi.display(),
            above = limit + 2 * MIB,
            within = limit - 2 * MIB,
            hold = limit / 4 * 3,
            held = held.display(),
            half = limit / 2,
        )),
        Duration::from_secs(60),
    );
    eprintln!("slurm: srun --gres=shard:2 took {:.1} s", t.elapsed().as_secs_f64());
    assert_eq!(st, Some(0), "srun: {out}\n{}", c.logs());
    let s = parse_kv(&out);
    assert_eq!((s["cvd"].as_str(), s["step_gpus"].as_str()), (gpu.to_string().as_str(), gpu.to_string().as_str()), "{out}");
    assert_eq!(s["preload"], shim_path().display().to_string(), "{out}");
    assert_eq!(s["quota"], format!("slurm-{}", s["job"]), "{out}");
    assert_eq!(s["compute"], "0.500000", "--compute: 2 of 4 shards, half the GPU's time: {out}");
    assert_eq!((num(&s, "op1.total", "srun"), num(&s, "op1.free", "srun")), (limit, limit), "the shard's share of GPU {gpu}: {out}");
    assert_eq!(num(&s, "op2.rc", "srun"), OOM as u64, "above the share: {out}");
    assert_eq!(num(&s, "op3.rc", "srun"), 0, "within the share: {out}");
    assert_eq!(num(&s, "second.op1.free", "srun"), limit / 4, "the job's second process shares its budget: {out}");
    assert_eq!(num(&s, "second.op2.rc", "srun"), OOM as u64, "{out}");

    // 2a. the off switches a job may inherit do not switch the limit off: HAMi's
    //     CUDA_DISABLE_CONTROL=true, a config file of the job's with disable = true
    let off = dir.join("off.toml");
    std::fs::write(&off, "disable = true\n").unwrap();
    let (st, out) = c.run(
        c.client("srun")
            .env("CUDA_DISABLE_CONTROL", "true")
            .env("GPUSHIM_CONFIG", &off)
            .args(["--gres=shard:1", "sh", "-c"])
            .arg(format!("echo disable=$GPUSHIM_DISABLE; echo config=${{GPUSHIM_CONFIG-none}}; {} info", drvapi.display())),
        Duration::from_secs(60),
    );
    assert_eq!(st, Some(0), "srun: {out}\n{}", c.logs());
    let s = parse_kv(&out);
    assert_eq!(num(&s, "op1.total", "srun with the off switches"), MEMORY[gpu] / SHARDS_PER_GPU, "{out}");
    assert_eq!((s["disable"].as_str(), s["config"].as_str()), ("0", "none"), "{out}");

    // 2b. a shard task that cannot be limited does not start (fail closed): no NVML; a job
    //     environment that would inject a line into the TaskProlog's output
    for (var, value, why) in [
        ("GPUSHIM_NVML_PATH", "/nonexistent/libnvidia-ml.so.1", "gpushim slurm task-prolog: NVML: /nonexistent/libnvidia-ml.so.1"),
        ("LD_PRELOAD", "/nonexistent.so\nexport GPUSHIM_MEMORY_LIMIT=100%", "has a control character"),
    ] {
        let (st, out) = c.run(c.client("srun").env(var, value).args(["--gres=shard:1", "sh", "-c", "echo the task ran"]), Duration::from_secs(60));
        assert!(st.is_some() && st != Some(0), "{var}: srun must fail: {st:?} {out}");
        assert!(!out.contains("the task ran"), "{var}: {out}");
        assert!(out.contains(why) && out.contains("the task is not started"), "{var}: the job's output says why: {out}");
    }

    // 3. two shard jobs share that GPU at once; a third waits for their shards
    let smallest = MEMORY[gpu].min(MEMORY[w_gpu]) * 2 / SHARDS_PER_GPU;
    let script = job_script(&dir, &drvapi, &format!("info alloc=mem:{}", smallest - 2 * MIB));
    // (a is submitted from inside an srun step on the whole-GPU job's GPU: its batch script
    // inherits a stale SLURM_STEP_ID and SLURM_STEP_GPUS; the smallest GPU named counts)
    let stale = [("SLURM_STEP_ID", "0".to_string()), ("SLURM_STEP_GPUS", w_gpu.to_string())];
    let a = c.sbatch_env(&["--gres=shard:2"], &script, "a", &stale);
    let b = c.sbatch(&["--gres=shard:2"], &script, "b");
    wait_for("jobs a and b to run together", Duration::from_secs(60), || (dir.join("ready-a").exists() && dir.join("ready-b").exists()).then_some(()));
    for (name, id, want) in [("a", &a, smallest), ("b", &b, limit)] {
        let m = kv(&dir, name);
        assert_eq!((m["cvd"].as_str(), m["job_gpus"].as_str()), (gpu.to_string().as_str(), gpu.to_string().as_str()), "job {name} is on the shared GPU: {m:?}");
        assert_eq!((num(&m, "op1.total", name), num(&m, "op2.rc", name)), (want, 0), "job {name}: {m:?}");
        assert_eq!(m["quota"], format!("slurm-{id}"), "{m:?}");
        // an srun step inside the job (under the batch script's shim and limit) gets the same
        assert_eq!(num(&m, "step.op1.total", name), limit, "the srun step of job {name}: {m:?}");
    }
    let q = c.queue();
    for id in [&w, &a, &b] {
        assert_eq!(q.get(id).map(|s| s.0.as_str()), Some("RUNNING"), "job {id}: {q:?}");
    }
    let third = c.sbatch(&["--gres=shard:2"], &script, "c");
    let reason = wait_for("the third job to wait for resources", Duration::from_secs(30), || {
        let q = c.queue();
        q.get(&third).filter(|s| s.0 == "PENDING" && s.1 == "Resources").cloned()
    });
    std::thread::sleep(Duration::from_secs(2));
    assert!(!dir.join("ready-c").exists(), "the third job ran while the GPU's shards were taken");
    assert_eq!(c.queue().get(&third).map(|s| s.0.clone()).as_deref(), Some("PENDING"), "{reason:?}");
    // a ends: the third runs, beside b
    std::fs::write(dir.join("go-a"), "").unwrap();
    wait_for("the third job to run once a has ended", Duration::from_secs(60), || dir.join("ready-c").exists().then_some(()));
    let m = kv(&dir, "c");
    assert_eq!((m["cvd"].as_str(), num(&m, "op1.total", "c"), num(&m, "op2.rc", "c")), (gpu.to_string().as_str(), limit, 0), "{m:?}");
    let q = c.queue();
    assert_eq!(q.get(&b).map(|s| s.0.as_str()), Some("RUNNING"), "b still runs beside the third: {q:?}");
    assert_eq!(q.get(&third).map(|s| s.0.as_str()), Some("RUNNING"), "{q:?}");
    for f in ["go-b", "go-c", "go-whole"] {
        std::fs::write(dir.join(f), "").unwrap();
    }
    wait_for("every job to end", Duration::from_secs(60), || {
        c.queue().values().all(|(state, _)| state != "RUNNING" && state != "PENDING" && state != "COMPLETING").then_some(())
    });
    for name in ["whole", "a", "b", "c"] {
        let out = std::fs::read_to_string(dir.join(format!("{name}.out"))).unwrap_or_default();
        assert!(out.lines().any(|l| l == "done"), "job {name} ended by itself: {out}");
    }
    drop(c);
    if dir.starts_with(std::env::temp_dir()) {
        let _ = std::fs::remove_dir_all(&dir);
    }
    eprintln!("slurm: the whole test took {:.1} s", t0.elapsed().as_secs_f64());
}
