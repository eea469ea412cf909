//! The prose of the help pages (DESCRIPTION, EXIT STATUS, EXAMPLES) and the man-page layout
//! they are put in; the names, synopses and options come from the definition in `cli.rs`.

/// The main page: NAME, SYNOPSIS, DESCRIPTION, COMMANDS, OPTIONS, then the rest.
pub const ROOT_TEMPLATE: &str = "\
NAME
    gpushim - {about}

SYNOPSIS
    {usage}

{before-help}COMMANDS
{subcommands}

OPTIONS
{options}{after-help}";

/// A command's page.
pub const COMMAND_TEMPLATE: &str = "\
NAME
    {name} - {about}

SYNOPSIS
    {usage}

{before-help}OPTIONS
{options}{after-help}";

/// A command's page, with its arguments.
pub const COMMAND_TEMPLATE_ARGS: &str = "\
NAME
    {name} - {about}

SYNOPSIS
    {usage}

{before-help}ARGUMENTS
{positionals}

OPTIONS
{options}{after-help}";

pub const MAIN_DESCRIPTION: &str = "\
DESCRIPTION
    gpushim loads libgpushim.so into an unmodified CUDA program (LD_PRELOAD). The program then
    sees only the devices it is given, in the order given, each with a memory limit; one GPU may
    appear as several virtual devices. The same settings work as GPUSHIM_* environment variables
    and in a TOML config file (/etc/gpushim/gpushim.toml, or GPUSHIM_CONFIG).

    gpushim COMMAND --help (or gpushim help COMMAND) shows a command's page.";

pub const MAIN_AFTER: &str = "\
EXIT STATUS
    The command's own (see its page); 2 for a command line that cannot be understood.

EXAMPLES
    gpushim run --visible-devices 1 --memory-limit 40% -- python train.py
    gpushim run --virtual-devices 0:2x8GiB --memory-mode grow -- ./app
    GPUSHIM_MEMORY_LIMIT=4GiB gpushim check
    gpushim sim --gpus 3 -- gpushim check
    gpushim completions bash > /etc/bash_completion.d/gpushim

SEE ALSO
    gpushim help run, gpushim help check, the manual (docs/).";

pub const RUN_DESCRIPTION: &str = "\
DESCRIPTION
    Sets the variables the options name, puts libgpushim.so first in LD_PRELOAD and replaces
    itself with COMMAND (found on PATH), which inherits everything else of the environment.
    Each option is the same as its variable; an option overrides the variable of the same name,
    and both override the config file. Options end at -- or at the first argument that is not
    an option.

    Before starting COMMAND the configuration it would get (options, environment, config
    file) is checked with the shim's own rules; an error is printed as the shim would print
    it and nothing is started.";

pub const RUN_AFTER: &str = "\
EXIT STATUS
    COMMAND's own status; 125 when gpushim cannot start it (bad option or configuration,
    library not found); 126 when COMMAND cannot be executed; 127 when it is not found.

EXAMPLES
    gpushim run --memory-limit 4GiB -- python train.py
    gpushim run --visible-devices GPU-8f3a,0 --memory-limit-device 0=10GiB -- ./app
    gpushim run --report usage.json --memory-mode preallocate -- ./app";

pub const CHECK_DESCRIPTION: &str = "\
DESCRIPTION
    Reads the configuration exactly as the shim would (the options below, the environment, the
    config file) and prints every setting with its value and where it came from. Then it runs a
    small probe under libgpushim.so that asks the CUDA driver and NVML what a program sees, and
    prints each device: its ordinal, the GPU it is (nvidia-smi's index, and which part of it
    when split), name, UUID, PCI bus id, the GPU's memory, the effective limit, which setting
    gave it, and the memory mode. It also checks that NVML (nvidia-smi) shows the same devices.
    No context is created and no memory allocated.";

pub const CHECK_AFTER: &str = "\
EXIT STATUS
    0 when the configuration is valid and the devices could be listed; 1 when a setting is
    invalid (with the same message the shim would print), the library cannot be found or
    loaded, the driver cannot be opened or initialised under the shim, or NVML and CUDA
    disagree; 2 for a command line that cannot be understood.

EXAMPLES
    gpushim check
    GPUSHIM_CONFIG=/etc/gpushim/job.toml gpushim check
    gpushim check --visible-devices 1,0 --memory-limit 50%";

pub const PS_DESCRIPTION: &str = "\
DESCRIPTION
    Without --quota, first every process of this user under the shim (all users' when run as
    root): pid, user, name, its shared quota, and per device of its view (ordinal, GPU UUID,
    part of a split GPU) what it holds, its peak, what is reserved for it, its limit, the
    allocations refused, and its compute share: the compute limit and mode (- without a
    limit), the share achieved (the GPU time its work took on the device over the wall time
    since the process started publishing, in whole percent) and the time its launches waited
    for their share. The figures are the ones the process publishes in the state directory
    (proc-PID-NONCE) as they change; a process killed without exiting is shown as exited until the
    next process of the user that starts CUDA removes its entry. With no process under the shim,
    one line says so.

    For each shared quota of this user (GPUSHIM_SHARED_QUOTA), or only NAME: every device with
    the bytes all members hold now and at most, the budget (the largest limit of a live member)
    and the device's memory; then every member: pid, name, and per device what it holds of its
    limit. A member that died is shown until another member reclaims its memory, which happens
    as soon as one needs room or asks for memory figures. Without --quota, the live processes
    of this user that run with limits of their own (no quota) follow, with their limits.
    Nothing is changed.

    The files are in the state directory: GPUSHIM_STATE_DIR or the config file's state_dir,
    else $XDG_RUNTIME_DIR/gpushim, else /tmp/gpushim-UID.";

pub const PS_AFTER: &str = "\
EXIT STATUS
    0 (also when nothing runs under the shim); 1 when a quota file cannot be read or the
    configuration is invalid; 2 for a bad command line.

EXAMPLES
    gpushim ps
    gpushim ps --quota job42
    gpushim ps --hami /tmp/cudevshr.cache";

pub const TOP_DESCRIPTION: &str = "\
DESCRIPTION
    A live view of what gpushim ps shows, refreshed every SECONDS (default 1): per GPU its
    memory as NVML sees it (used of total), then each process under the shim on it with a bar
    of what it holds against its limit, its peak, its limit, its compute limit and mode, the
    share of the device's time its work took over the last interval (SHARE: GPU time between
    two readings over the wall time between them) and the share of that time its launches
    waited (WAITED), its shared quota and the allocations refused; then the shared quotas. It follows the terminal's size. Keys: q (or
    Ctrl-C) quits; s changes the order (memory in use, pid, refusals, name); r refreshes now.
    SIGTERM, SIGHUP, SIGINT and SIGQUIT quit too, the terminal restored.

    When standard output is not a terminal, prints one snapshot (gpushim ps) and exits.";

pub const TOP_AFTER: &str = "\
EXIT STATUS
    0; 1 when the state directory cannot be read; 2 for a bad command line; 128 + the signal
    when SIGTERM, SIGHUP, SIGINT or SIGQUIT stops it (the terminal restored first).

EXAMPLES
    gpushim top
    gpushim top --interval 5";

pub const METRICS_DESCRIPTION: &str = "\
DESCRIPTION
    Prints the figures in the Prometheus text exposition format (for node-exporter's textfile
    collector), or, with --listen, serves them over HTTP on /metrics (GET or HEAD) to many
    clients at once: at most 64 connections, a request's head within 2 s, an answer within
    10 s. SIGTERM or SIGINT stops the server.
    Metrics: gpushim_memory_used_bytes, gpushim_memory_reserved_bytes,
    gpushim_memory_peak_used_bytes, gpushim_memory_peak_reserved_bytes,
    gpushim_memory_limit_bytes, gpushim_allocations_refused_total,
    gpushim_compute_limit_ratio (0..1, devices with a compute limit only),
    gpushim_gpu_busy_seconds_total, gpushim_compute_throttled_seconds_total,
    gpushim_compute_launches_total, gpushim_memory_waits_total,
    gpushim_memory_wait_seconds_total (labels pid, user, comm, quota, device, gpu_uuid, part),
    gpushim_process_alive, gpushim_process_devices,
    gpushim_quota_used_bytes, gpushim_quota_peak_used_bytes, gpushim_quota_limit_bytes (labels
    quota, user, gpu_uuid), gpushim_gpu_memory_total_bytes and gpushim_gpu_memory_used_bytes
    (NVML; labels gpu, gpu_uuid, name; left out with --no-gpus).

    Only this user's processes are shown, unless run as root. The endpoint answers anyone who
    can connect to ADDR: keep it on 127.0.0.1 (or a pod's network) when others share the node.";

pub const METRICS_AFTER: &str = "\
EXIT STATUS
    0; 1 when the figures cannot be read or the address cannot be listened on; 2 for a bad
    command line.

EXAMPLES
    gpushim metrics > /var/lib/node_exporter/textfile/gpushim.prom
    gpushim metrics --listen 127.0.0.1:9400";

pub const SIM_DESCRIPTION: &str = "\
DESCRIPTION
    Runs COMMAND (default: your $SHELL, else /bin/sh) on the project's SIMULATED GPUs, to try
    gpushim where there is no GPU: the simulated CUDA driver (libcuda.so) and NVML
    (libnvidia_ml.so), built next to this program (cargo build --release -p gpusim-cuda -p
    gpusim-nvml), come first on LD_LIBRARY_PATH, through links by their sonames in
    gpusim-sonames/ beside them (made by gpushim sim when missing; it must be owned by root or
    you and writable by no one else, on a path only root and you can change, with no ':', ';'
    or '$'). Every process started in it shares the simulated GPUs' memory (GPUSIM_NODE_STATE),
    so what gpushim ps, top and metrics show of the GPUs inside it is what all its processes
    hold. The directory of this gpushim is added at the end of PATH. Leave the shell with exit
    (or Ctrl-D).

    The simulated node's state is in a private directory (mode 0700), in $XDG_RUNTIME_DIR,
    else $TMPDIR, else /tmp: the first that is yours and writable by no one else, or root's and
    sticky (like /tmp), on a path only root and you can change. It is removed when COMMAND
    ends, or when gpushim sim is stopped by a signal it catches: SIGTERM, SIGHUP, SIGUSR1 and
    the other signals that would end it are passed on to COMMAND, and so are SIGINT and SIGQUIT
    sent with kill (Ctrl-C and Ctrl-\\ reach COMMAND from the terminal). SIGKILL, and the
    signals of a crash (SIGSEGV, SIGABRT...), leave it behind. Nothing of this is in
    libgpushim.so. Signals ignored when gpushim sim starts (nohup) stay ignored for COMMAND.";

pub const SIM_AFTER: &str = "\
EXIT STATUS
    COMMAND's own status; 125 when gpushim cannot set the simulator up (not built, no private
    directory); 126 when COMMAND cannot be executed; 127 when it is not found.

EXAMPLES
    gpushim sim
    gpushim sim --gpus 3 -- gpushim check
    gpushim sim --memory 8GiB -- gpushim run --memory-limit 2GiB -- ./app";

pub const SLURM_DESCRIPTION: &str = "\
DESCRIPTION
    The TaskProlog of a Slurm cluster whose GPUs are shared as gres/shard: slurm.conf's
    TaskProlog names a script that runs gpushim slurm task-prolog --shards-per-gpu N, N being
    each GPU's shard count in gres.conf. For a task of a job given K shards of a GPU
    (SLURM_SHARDS_ON_NODE=K, confirmed with scontrol -d show job: JOB_GRES names shard; the
    GPU: the smallest named by SLURM_STEP_GPUS, SLURM_JOB_GPUS and CUDA_VISIBLE_DEVICES) it
    prints the lines that Slurm turns into the task's environment:
        export LD_PRELOAD=<libgpushim.so, then the job's own LD_PRELOAD>
        export GPUSHIM_DISABLE=0
        export GPUSHIM_MEMORY_LIMIT=<the GPU's memory (NVML) x K / N, in bytes>
        export GPUSHIM_SHARED_QUOTA=slurm-<SLURM_JOB_ID>
        export GPUSHIM_COMPUTE_LIMIT=<K / N>        (with --compute)
    and unset lines for GPUSHIM_CONFIG, GPUSHIM_VIRTUAL_DEVICES and per-device limits the job
    inherited. All the job's processes on the node share one budget. A job without shards (whole
    GPUs, or none) gets nothing. Shards on several GPUs are refused.

    A TaskProlog runs as the job's user, who can unset LD_PRELOAD: this keeps honest jobs
    within their shares, it is not a fence against a hostile one.";

pub const SLURM_AFTER: &str = "\
EXIT STATUS
    0; 1 when the job's variables are wrong (SLURM_SHARDS_ON_NODE above N, no SLURM_JOB_ID, a
    value with a control character, shards on several GPUs), when NVML, scontrol or the library
    (its path without spaces and colons) fails: a print line says why and Slurm then does not
    start the task; 2 for a bad command line, after the same print line.

EXAMPLES
    gpushim slurm task-prolog --shards-per-gpu 4
    gpushim slurm task-prolog --shards-per-gpu 8 --compute --library /usr/local/lib/libgpushim.so";

pub const HELP_AFTER: &str = "\
EXAMPLES
    gpushim help
    gpushim help run";

pub const COMPLETIONS_AFTER: &str = "\
EXAMPLES
    gpushim completions bash > ~/.local/share/bash-completion/completions/gpushim
    gpushim completions zsh > ~/.zfunc/_gpushim
    gpushim completions fish > ~/.config/fish/completions/gpushim.fish";
