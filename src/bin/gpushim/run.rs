//! `gpushim run [OPTIONS] [--] COMMAND [ARGS…]`: sets the variables and `LD_PRELOAD`, checks
//! the configuration the program would get, and replaces itself with the command.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::Command;

use crate::{library, options, Failure};

pub fn main(args: &[OsString]) -> Result<(), Failure> {
    let parsed = options::parse("run", args, true, &[])?;
    if parsed.switches.contains(&"--help") {
        print!("{}", crate::help::run());
        return Ok(());
    }
    let Some((program, program_args)) = parsed.rest.split_first() else {
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
    let (what, code) = match error.kind() {
        std::io::ErrorKind::NotFound => ("command not found", 127),
        _ => ("cannot run", 126),
    };
    Err(Failure {
        message: format!("gpushim run: {what}: {}: {error}", program.to_string_lossy()),
        kind: crate::FailureKind::Status(code),
    })
}
