//! `gpushim run [OPTIONS] [--] COMMAND [ARGS…]`: sets the variables and `LD_PRELOAD`, checks
//! the configuration the program would get, and replaces itself with the command.

use std::os::unix::process::CommandExt;
use std::process::Command;

use crate::{library, options, Failure};

pub fn main(args: &crate::cli::RunArgs) -> Result<(), Failure> {
    let parsed = crate::cli::resolve("run", &args.options)?;
    let Some((program, program_args)) = args.command.split_first() else {
        return Err(Failure::usage(
            "run",
            "no command given; type it after the options, like: gpushim run --memory-limit 4GiB -- python train.py",
        ));
    };
    let mut env = options::environment(&parsed);
    // A configuration the shim would refuse would start the program with CUDA failing;
    // say so now instead, with the shim's own message.
    // (Warnings, such as unknown variables, are the shim's to print when CUDA starts.)
    options::settings(&env)
        .map_err(|e| Failure::plain(format!("{e}\n(gpushim run: nothing was started; see gpushim check)")))?;
    let lib = library::find("run", parsed.library.as_deref(), &env)?;
    let preload = library::preload(&lib, library::lookup(&env, "LD_PRELOAD"));
    library::set(&mut env, "LD_PRELOAD", preload);
    let error = Command::new(program).args(program_args).env_clear().envs(env).exec();
    Err(exec_failure("run", program, &error))
}

/// Why COMMAND could not be started, with the status a shell would give (126, 127).
pub fn exec_failure(command: &str, program: &std::ffi::OsStr, error: &std::io::Error) -> Failure {
    let (what, code) = match error.kind() {
        std::io::ErrorKind::NotFound => ("command not found", 127),
        _ => ("cannot run", 126),
    };
    Failure {
        message: format!("gpushim {command}: {what}: {}: {error}", program.to_string_lossy()),
        kind: crate::FailureKind::Status(code),
    }
}
