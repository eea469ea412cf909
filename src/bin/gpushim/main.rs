//! `gpushim`: runs programs under `libgpushim.so` and checks configurations.
//!
//! The settings are read by the same code the library uses (the `gpushim-common` crate,
//! shared with the library), so `gpushim check` and the shim never disagree about what a
//! variable or a config file means. What the devices look like is not computed here: `check`
//! starts itself again under the library (`gpushim __probe`) and asks the driver, as any
//! program would.

#[allow(unused_imports)]
use gpushim_common::{bounded, config, live, once, quota, secure, sys, units};

mod cdi;
mod check;
mod cli;
mod device_plugin;
mod figures;
mod gpus;
mod help;
mod help_k8s;
mod kubelet;
mod library;
mod metrics;
mod options;
mod private_dir;
mod probe;
mod ps;
mod run;
mod serve;
mod sim;
mod slurm;
mod top;

use std::ffi::OsString;
use std::process::ExitCode;

/// Exit status of `run` when gpushim itself fails (as `env` and `docker run` do).
pub const EXIT_RUN_SETUP: u8 = 125;
/// Exit status of `check` for an invalid configuration or a view that cannot be established.
pub const EXIT_CHECK_FAILED: u8 = 1;
/// Exit status of a command line that cannot be understood (except under `run`).
pub const EXIT_USAGE: u8 = 2;

/// Why a command stops, with the message for stderr.
#[derive(Debug)]
pub struct Failure {
    pub message: String,
    pub kind: FailureKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The command line cannot be understood.
    Usage,
    /// The command line is fine but gpushim cannot do what it asks (library, configuration).
    Setup,
    /// Not a failure to report as such: exit with this status, the message already printed.
    Status(u8),
}

impl Failure {
    pub fn usage(command: &str, message: impl Into<String>) -> Failure {
        Failure { message: format!("{}: {}", prefix(command), message.into()), kind: FailureKind::Usage }
    }

    pub fn setup(command: &str, message: impl Into<String>) -> Failure {
        Failure { message: format!("{}: {}", prefix(command), message.into()), kind: FailureKind::Setup }
    }

    /// An error whose message is complete already (the shim's own configuration messages).
    pub fn plain(message: impl Into<String>) -> Failure {
        Failure { message: message.into(), kind: FailureKind::Setup }
    }

    pub fn status(code: u8) -> Failure {
        Failure { message: String::new(), kind: FailureKind::Status(code) }
    }
}

fn prefix(command: &str) -> String {
    if command.is_empty() {
        "gpushim".into()
    } else {
        format!("gpushim {command}")
    }
}

fn main() -> ExitCode {
    // Like other command-line tools, end quietly when the reader of the output goes away
    // (`gpushim check | head`) instead of failing on a write.
    // SAFETY: setting a signal's disposition to its default before any thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let first = args.first().and_then(|a| a.to_str()).unwrap_or("").to_string();
    // `run` and `sim` fail with 125 (as `env` and `docker run` do), usage errors included
    let runs = matches!(first.as_str(), "run" | "sim");
    let result = cli::parse(args).and_then(dispatch);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            if !failure.message.is_empty() {
                eprintln!("{}", failure.message);
            }
            // a TaskProlog's bad command line: the job's output says why, as every other error
            if first == "slurm" && failure.kind == FailureKind::Usage {
                slurm::print_refusal(&failure.message);
            }
            let code = match failure.kind {
                FailureKind::Status(code) => code,
                _ if runs => EXIT_RUN_SETUP,
                FailureKind::Usage => EXIT_USAGE,
                FailureKind::Setup => EXIT_CHECK_FAILED,
            };
            ExitCode::from(code)
        }
    }
}

fn dispatch(cli: cli::Cli) -> Result<(), Failure> {
    use cli::Command;
    let Some(command) = cli.command else {
        // (clap answers an empty command line with the main page on stderr)
        return Err(Failure::status(EXIT_USAGE));
    };
    match command {
        Command::Run(a) => run::main(&a),
        Command::Check(a) => check::main(&a),
        Command::Ps(a) => match &a.hami {
            Some(file) => ps::hami(file),
            None => ps::main(a.quota.as_deref()),
        },
        Command::Top(a) => top::main(a.interval),
        Command::Metrics(a) => metrics::main(a.listen.as_deref(), !a.no_gpus),
        Command::Sim(a) => sim::main(&a),
        Command::Slurm(a) => match a.shards_per_gpu {
            Some(n) => slurm::task_prolog(n, a.compute, a.library.as_deref()),
            None => Err(Failure::usage("slurm", "--shards-per-gpu is required: the shards of each GPU as gres.conf counts them, like --shards-per-gpu 4")),
        },
        Command::Cdi(a) => cdi::main(&a),
        Command::DevicePlugin(a) => device_plugin::main(&a),
        Command::Help { topic } => match cli::page(topic.as_deref()) {
            Some(page) => print(&page),
            None => Err(Failure::usage(
                "help",
                format!("no help on {:?}; try gpushim --help", topic.unwrap_or_default()),
            )),
        },
        Command::Completions { shell } => {
            cli::completions(shell);
            Ok(())
        }
        Command::Version => print(&format!("gpushim {}\n", env!("CARGO_PKG_VERSION"))),
        Command::Probe { sections } => probe::main(&sections),
        Command::Reference => print(&cli::reference()),
    }
}

fn print(text: &str) -> Result<(), Failure> {
    print!("{text}");
    Ok(())
}
