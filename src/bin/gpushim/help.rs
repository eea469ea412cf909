//! The `--help` pages. The options section is generated from `options::SETTINGS`, so the
//! pages cannot drift from what the parser accepts.

use crate::options::{DEVICE_LIMIT_FLAG, LIBRARY_FLAG, SETTINGS};

pub const MAIN: &str = "\
NAME
    gpushim - give a CUDA program only the GPUs and memory it is allotted

SYNOPSIS
    gpushim run [OPTIONS] [--] COMMAND [ARGS...]
    gpushim check [OPTIONS]
    gpushim ps [--quota NAME]
    gpushim top [--interval SECONDS]
    gpushim metrics [--listen ADDR:PORT] [--no-gpus]
    gpushim help [run|check|ps|top|metrics]
    gpushim --version

DESCRIPTION
    gpushim loads libgpushim.so into an unmodified CUDA program (LD_PRELOAD). The program then
    sees only the devices it is given, in the order given, each with a memory limit; one GPU may
    appear as several virtual devices. The same settings work as GPUSHIM_* environment variables
    and in a TOML config file (/etc/gpushim/gpushim.toml, or GPUSHIM_CONFIG).

    run      start COMMAND under the shim with the options applied
    check    validate the configuration and show the devices a program would see
    ps       list this user's processes under the shim and its shared quotas
    top      the same, live, in the terminal
    metrics  the same figures for Prometheus (printed, or served on /metrics)

EXAMPLES
    gpushim run --visible-devices 1 --memory-limit 40% -- python train.py
    gpushim run --virtual-devices 0:2x8GiB --memory-mode grow -- ./app
    GPUSHIM_MEMORY_LIMIT=4GiB gpushim check

SEE ALSO
    gpushim help run, gpushim help check, the README's Configuration section.
";

pub const PS: &str = "\
NAME
    gpushim ps - list the processes under the shim and the shared quotas

SYNOPSIS
    gpushim ps [--quota NAME]

DESCRIPTION
    Without --quota, first every process of this user under the shim (all users' when run as
    root): pid, user, name, its shared quota, and per device of its view (ordinal, GPU UUID,
    part of a split GPU) what it holds, its peak, what is reserved for it, its limit and the
    allocations refused. The figures are the ones the process publishes in the state directory
    (proc-PID-NONCE) as they change; a process killed without exiting is shown as exited until the
    next process of the user that starts CUDA removes its entry.

    For each shared quota of this user (GPUSHIM_SHARED_QUOTA), or only NAME: every device with
    the bytes all members hold now and at most, the budget (the largest limit of a live member)
    and the device's memory; then every member: pid, name, and per device what it holds of its
    limit. A member that died is shown until another member reclaims its memory, which happens
    as soon as one needs room or asks for memory figures. Without --quota, the live processes
    of this user that run with limits of their own (no quota) follow, with their limits.
    Nothing is changed.

    The files are in the state directory: GPUSHIM_STATE_DIR or the config file's state_dir,
    else $XDG_RUNTIME_DIR/gpushim, else /tmp/gpushim-UID.

EXIT STATUS
    0; 1 when a quota file cannot be read or the configuration is invalid; 2 for a bad
    command line.

EXAMPLES
    gpushim ps
    gpushim ps --quota job42
";

pub const TOP: &str = "\
NAME
    gpushim top - the processes under the shim, live

SYNOPSIS
    gpushim top [--interval SECONDS]

DESCRIPTION
    A live view of what gpushim ps shows, refreshed every SECONDS (default 1): per GPU its
    memory as NVML sees it (used of total), then each process under the shim on it with a bar
    of what it holds against its limit, its peak, its limit, its shared quota and the
    allocations refused; then the shared quotas. Keys: q (or Ctrl-C) quits; s changes the
    order (memory in use, pid, refusals, name); r refreshes now.

    When standard output is not a terminal, prints one snapshot (gpushim ps) and exits.

EXIT STATUS
    0; 1 when the state directory cannot be read; 2 for a bad command line.
";

pub const METRICS: &str = "\
NAME
    gpushim metrics - the figures of gpushim ps for Prometheus

SYNOPSIS
    gpushim metrics [--listen ADDR:PORT] [--no-gpus]

DESCRIPTION
    Prints the figures in the Prometheus text exposition format (for node-exporter's textfile
    collector), or, with --listen, serves them over HTTP on /metrics (GET or HEAD) to many
    clients at once: at most 64 connections, a request's head within 2 s, an answer within
    10 s. SIGTERM or SIGINT stops the server.
    Metrics: gpushim_memory_used_bytes, gpushim_memory_reserved_bytes,
    gpushim_memory_peak_used_bytes, gpushim_memory_peak_reserved_bytes,
    gpushim_memory_limit_bytes, gpushim_allocations_refused_total (labels pid, user, comm,
    quota, device, gpu_uuid, part), gpushim_process_alive, gpushim_process_devices,
    gpushim_quota_used_bytes, gpushim_quota_peak_used_bytes, gpushim_quota_limit_bytes (labels
    quota, user, gpu_uuid), gpushim_gpu_memory_total_bytes and gpushim_gpu_memory_used_bytes
    (NVML; labels gpu, gpu_uuid, name; left out with --no-gpus).

    Only this user's processes are shown, unless run as root. The endpoint answers anyone who
    can connect to ADDR: keep it on 127.0.0.1 (or a pod's network) when others share the node.

EXAMPLES
    gpushim metrics > /var/lib/node_exporter/textfile/gpushim.prom
    gpushim metrics --listen 127.0.0.1:9400
";

pub fn run() -> String {
    format!(
        "\
NAME
    gpushim run - run a command under libgpushim.so

SYNOPSIS
    gpushim run [OPTIONS] [--] COMMAND [ARGS...]

DESCRIPTION
    Sets the variables the options name, puts libgpushim.so first in LD_PRELOAD and replaces
    itself with COMMAND (found on PATH), which inherits everything else of the environment.
    Each option is the same as its variable; an option overrides the variable of the same name,
    and both override the config file. Options end at -- or at the first argument that is not
    an option.

    Before starting COMMAND the configuration it would get (options, environment, config
    file) is checked with the shim's own rules; an error is printed as the shim would print
    it and nothing is started.

OPTIONS
{options}
EXIT STATUS
    COMMAND's own status; 125 when gpushim cannot start it (bad option or configuration,
    library not found); 126 when COMMAND cannot be executed; 127 when it is not found.

EXAMPLES
    gpushim run --memory-limit 4GiB -- python train.py
    gpushim run --visible-devices GPU-8f3a,0 --memory-limit-device 0=10GiB -- ./app
    gpushim run --report usage.json --memory-mode preallocate -- ./app
",
        options = options_section()
    )
}

pub fn check() -> String {
    format!(
        "\
NAME
    gpushim check - validate a configuration and show the devices a program would see

SYNOPSIS
    gpushim check [OPTIONS]

DESCRIPTION
    Reads the configuration exactly as the shim would (the options below, the environment, the
    config file) and prints every setting with its value and where it came from. Then it runs a
    small probe under libgpushim.so that asks the CUDA driver and NVML what a program sees, and
    prints each device: its ordinal, the GPU it is (nvidia-smi's index, and which part of it
    when split), name, UUID, PCI bus id, the GPU's memory, the effective limit, which setting
    gave it, and the memory mode. It also checks that NVML (nvidia-smi) shows the same devices.
    No context is created and no memory allocated.

OPTIONS
{options}
EXIT STATUS
    0 when the configuration is valid and the devices could be listed; 1 when a setting is
    invalid (with the same message the shim would print), the library cannot be found or
    loaded, the driver cannot be opened or initialised under the shim, or NVML and CUDA
    disagree; 2 for a command line that cannot be understood.

EXAMPLES
    gpushim check
    GPUSHIM_CONFIG=/etc/gpushim/job.toml gpushim check
    gpushim check --visible-devices 1,0 --memory-limit 50%
",
        options = options_section()
    )
}

/// The help page named `topic`.
pub fn topic(topic: &str) -> Option<String> {
    match topic {
        "run" => Some(run()),
        "check" => Some(check()),
        "ps" => Some(PS.to_string()),
        "top" => Some(TOP.to_string()),
        "metrics" => Some(METRICS.to_string()),
        _ => None,
    }
}

fn options_section() -> String {
    let mut out = String::new();
    let mut item = |flag: &str, value: &str, help: &str| {
        out.push_str(format!("    {flag} {value}").trim_end());
        out.push('\n');
        for line in wrap(help, 80 - 8) {
            out.push_str(&format!("        {line}\n"));
        }
    };
    for s in SETTINGS {
        item(s.flag, s.value, &format!("{} ({})", s.help, s.var));
    }
    item(
        DEVICE_LIMIT_FLAG,
        "I=LIMIT",
        "limit of device I, the program's ordinal (after hiding and splitting); may be given \
         several times (GPUSHIM_MEMORY_LIMIT_<I>)",
    );
    item(
        LIBRARY_FLAG,
        "PATH",
        "the libgpushim.so to load; default: GPUSHIM_LIBRARY, else libgpushim.so next to this \
         program, else ../lib/libgpushim.so from it",
    );
    item("--help", "", "show this page");
    out
}

fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = vec![String::new()];
    for word in text.split_whitespace() {
        let line = lines.last_mut().expect("one line");
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(word.to_string());
        } else {
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(word);
        }
    }
    lines
}
