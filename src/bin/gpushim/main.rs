//! `gpushim`: runs programs under `libgpushim.so` and checks configurations.
//!
//! The settings are read by the same code the library uses (the `gpushim-common` crate,
//! shared with the library), so `gpushim check` and the shim never disagree about what a
//! variable or a config file means. What the devices look like is not computed here: `check`
//! starts itself again under the library (`gpushim __probe`) and asks the driver, as any
//! program would.

#[allow(unused_imports)]
use gpushim_common::{bounded, config, live, once, quota, secure, sys, units};

mod check;
mod figures;
mod help;
mod library;
mod metrics;
mod options;
mod probe;
mod ps;
mod run;
mod serve;
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
    let command = args.first().and_then(|a| a.to_str()).unwrap_or("");
    let rest = args.get(1..).unwrap_or(&[]);
    let result = match command {
        "" => {
            eprint!("{}", help::MAIN);
            Err(Failure::status(EXIT_USAGE))
        }
        "-h" | "--help" | "help" => match rest.first().and_then(|a| a.to_str()) {
            None => print(help::MAIN),
            Some(topic) => match help::topic(topic) {
                Some(page) => print(&page),
                None => Err(Failure::usage("help", format!("no help on {topic:?}; try gpushim --help"))),
            },
        },
        "-V" | "--version" | "version" => print(&format!("gpushim {}\n", env!("CARGO_PKG_VERSION"))),
        "run" => run::main(rest),
        "check" => check::main(rest),
        "ps" => ps::main(rest),
        "top" => top::main(rest),
        "metrics" => metrics::main(rest),
        "__probe" => probe::main(rest),
        other => {
            let hint = config::suggest(other, &["run", "check", "ps", "top", "metrics", "help", "version"])
                .map_or(String::new(), |s| format!(" (did you mean gpushim {s}?)"));
            Err(Failure::usage("", format!("unknown command {other:?}{hint}; see gpushim --help")))
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            if !failure.message.is_empty() {
                eprintln!("{}", failure.message);
            }
            let code = match failure.kind {
                FailureKind::Status(code) => code,
                _ if command == "run" => EXIT_RUN_SETUP,
                FailureKind::Usage => EXIT_USAGE,
                FailureKind::Setup => EXIT_CHECK_FAILED,
            };
            ExitCode::from(code)
        }
    }
}

fn print(text: &str) -> Result<(), Failure> {
    print!("{text}");
    Ok(())
}
