//! The command line: every command and option of `gpushim`, defined once (clap), from which the
//! `--help` pages, the usage errors, the shell completions and the manual's command reference
//! (`gpushim __reference`, docs/src/commands.md) are all made.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Arg, ArgAction, ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::help;
use crate::options::{self, DEVICE_LIMIT_FLAG, LIBRARY_FLAG, SETTINGS};
use crate::Failure;

/// Help pages are wrapped at this width whatever the terminal, so that they (and the manual
/// made from them) read the same everywhere.
const WIDTH: usize = 100;

#[derive(Parser, Debug)]
#[command(
    name = "gpushim",
    version,
    about = "give a CUDA program only the GPUs and memory it is allotted",
    override_usage = "gpushim COMMAND [OPTIONS] [ARGS...]\n    gpushim --version",
    disable_help_subcommand = true,
    arg_required_else_help = true,
    help_template = help::ROOT_TEMPLATE,
    before_help = help::MAIN_DESCRIPTION,
    after_help = help::MAIN_AFTER,
    term_width = WIDTH,
    max_term_width = WIDTH,
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// run a command under libgpushim.so
    #[command(display_name = "gpushim run", 
        override_usage = "gpushim run [OPTIONS] [--] COMMAND [ARGS...]",
        help_template = help::COMMAND_TEMPLATE_ARGS,
        before_help = help::RUN_DESCRIPTION,
        after_help = help::RUN_AFTER,
        args_override_self = true
    )]
    Run(RunArgs),
    /// validate a configuration and show the devices a program would see
    #[command(display_name = "gpushim check", override_usage = "gpushim check [OPTIONS]", 
        help_template = help::COMMAND_TEMPLATE,
        before_help = help::CHECK_DESCRIPTION,
        after_help = help::CHECK_AFTER,
        args_override_self = true
    )]
    Check(CheckArgs),
    /// list the processes under the shim and the shared quotas
    #[command(display_name = "gpushim ps", override_usage = "gpushim ps [--quota NAME | --hami FILE]", help_template = help::COMMAND_TEMPLATE, before_help = help::PS_DESCRIPTION, after_help = help::PS_AFTER, args_override_self = true)]
    Ps(PsArgs),
    /// the processes under the shim, live
    #[command(display_name = "gpushim top", override_usage = "gpushim top [--interval SECONDS]", help_template = help::COMMAND_TEMPLATE, before_help = help::TOP_DESCRIPTION, after_help = help::TOP_AFTER, args_override_self = true)]
    Top(TopArgs),
    /// the figures of gpushim ps for Prometheus
    #[command(display_name = "gpushim metrics", override_usage = "gpushim metrics [--listen ADDR:PORT] [--no-gpus]", help_template = help::COMMAND_TEMPLATE, before_help = help::METRICS_DESCRIPTION, after_help = help::METRICS_AFTER, args_override_self = true)]
    Metrics(MetricsArgs),
    /// a shell (or COMMAND) on simulated GPUs, to try gpushim without one
    #[command(display_name = "gpushim sim", 
        override_usage = "gpushim sim [--gpus N] [--memory SIZE] [-- COMMAND [ARGS...]]",
        help_template = help::COMMAND_TEMPLATE_ARGS,
        before_help = help::SIM_DESCRIPTION,
        after_help = help::SIM_AFTER,
        args_override_self = true
    )]
    Sim(SimArgs),
    /// a Slurm TaskProlog that gives a job its shards' share of the GPU
    #[command(display_name = "gpushim slurm",
        override_usage = "gpushim slurm task-prolog --shards-per-gpu N [--compute] [--library PATH]",
        help_template = help::COMMAND_TEMPLATE_ARGS,
        before_help = help::SLURM_DESCRIPTION,
        after_help = help::SLURM_AFTER,
        args_override_self = true
    )]
    Slurm(SlurmArgs),
    /// write a CDI spec of the GPUs and their slices, for container runtimes
    #[command(display_name = "gpushim cdi", override_usage = "gpushim cdi generate [--slices N] [--compute] [--output PATH]", help_template = help::COMMAND_TEMPLATE_ARGS, before_help = crate::help_k8s::CDI_DESCRIPTION, after_help = crate::help_k8s::CDI_AFTER, args_override_self = true)]
    Cdi(crate::cdi::CdiArgs),
    /// a Kubernetes device plugin offering the GPUs' slices as gpushim.dev/gpu
    #[command(display_name = "gpushim device-plugin", override_usage = "gpushim device-plugin [--slices N] [--compute] [--kubelet-dir DIR]", help_template = help::COMMAND_TEMPLATE, before_help = crate::help_k8s::PLUGIN_DESCRIPTION, after_help = crate::help_k8s::PLUGIN_AFTER, args_override_self = true)]
    DevicePlugin(crate::device_plugin::PluginArgs),
    /// show the help page of a command
    #[command(display_name = "gpushim help", override_usage = "gpushim help [COMMAND]", help_template = help::COMMAND_TEMPLATE_ARGS, after_help = help::HELP_AFTER)]
    Help {
        /// the command whose page to show
        #[arg(value_name = "COMMAND")]
        topic: Option<String>,
    },
    /// print a shell's completion script for gpushim
    #[command(display_name = "gpushim completions", override_usage = "gpushim completions SHELL", help_template = help::COMMAND_TEMPLATE_ARGS, after_help = help::COMPLETIONS_AFTER)]
    Completions {
        /// the shell: bash, zsh, fish, elvish or powershell
        #[arg(value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
    /// print the version
    #[command(hide = true)]
    Version,
    /// the child of `check`: prints what a program sees (key=value lines)
    #[command(name = "__probe", hide = true)]
    Probe {
        sections: Vec<OsString>,
    },
    /// the command reference of the manual, in Markdown (docs/src/commands.md)
    #[command(name = "__reference", hide = true)]
    Reference,
}

/// The options that set the shim's variables (`run`, `check`), made from `options::SETTINGS`
/// so that each option, its value's check and its help are written once.
#[derive(Debug, Clone, Default)]
pub struct ShimOptions {
    /// (flag, value) of every setting given; switches have the value `1`.
    pub values: Vec<(&'static str, String)>,
    /// The values of `--memory-limit-device`, in the order given.
    pub device_limits: Vec<String>,
    pub library: Option<PathBuf>,
}

fn id(flag: &'static str) -> &'static str {
    flag.trim_start_matches('-')
}

impl FromArgMatches for ShimOptions {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let mut o = ShimOptions::default();
        for s in SETTINGS {
            if s.value.is_empty() {
                if m.get_flag(id(s.flag)) {
                    o.values.push((s.flag, "1".into()));
                }
            } else if let Some(v) = m.get_one::<String>(id(s.flag)) {
                o.values.push((s.flag, v.clone()));
            }
        }
        o.device_limits = m.get_many::<String>(id(DEVICE_LIMIT_FLAG)).map(|v| v.cloned().collect()).unwrap_or_default();
        o.library = m.get_one::<String>(id(LIBRARY_FLAG)).map(PathBuf::from);
        Ok(o)
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl Args for ShimOptions {
    fn augment_args(mut cmd: clap::Command) -> clap::Command {
        for s in SETTINGS {
            let arg = Arg::new(id(s.flag)).long(id(s.flag)).help(format!("{} ({})", s.help, s.var));
            cmd = cmd.arg(if s.value.is_empty() { arg.action(ArgAction::SetTrue) } else { arg.value_name(s.value).action(ArgAction::Set).allow_hyphen_values(true) });
        }
        cmd.arg(
            Arg::new(id(DEVICE_LIMIT_FLAG))
                .long(id(DEVICE_LIMIT_FLAG))
                .value_name("I=LIMIT")
                .action(ArgAction::Append)
                .allow_hyphen_values(true)
                .help("limit of device I, the program's ordinal (after hiding and splitting); may be given several times (GPUSHIM_MEMORY_LIMIT_<I>)"),
        )
        .arg(Arg::new(id(LIBRARY_FLAG)).long(id(LIBRARY_FLAG)).value_name("PATH").action(ArgAction::Set).allow_hyphen_values(true).help(
            "the libgpushim.so to load; default: GPUSHIM_LIBRARY, else libgpushim.so next to this program, else ../lib/libgpushim.so from it",
        ))
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub options: ShimOptions,
    /// the program (found on PATH) and its arguments, passed on untouched; options end at -- or
    /// at the first argument that is not an option
    #[arg(value_name = "COMMAND", trailing_var_arg = true, value_parser = clap::value_parser!(OsString))]
    pub command: Vec<OsString>,
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    #[command(flatten)]
    pub options: ShimOptions,
}

#[derive(Args, Debug)]
pub struct PsArgs {
    /// only this shared quota (its devices and members)
    #[arg(long, value_name = "NAME", allow_hyphen_values = true)]
    pub quota: Option<String>,
    /// only this HAMi-core shared region file (limits, devices, process slots)
    #[arg(long, value_name = "FILE", conflicts_with = "quota")]
    pub hami: Option<std::path::PathBuf>,
}

#[derive(Args, Debug)]
pub struct TopArgs {
    /// seconds between refreshes, 0.1 to 3600
    #[arg(long, short = 'd', value_name = "SECONDS", default_value = "1", value_parser = interval, allow_hyphen_values = true)]
    pub interval: Duration,
}

fn interval(v: &str) -> Result<Duration, String> {
    v.trim()
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.1 && *s <= 3600.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| "needs seconds between 0.1 and 3600, like --interval 2".to_string())
}

#[derive(Args, Debug)]
pub struct MetricsArgs {
    /// serve the figures over HTTP on /metrics at this address instead of printing them once
    #[arg(long, value_name = "ADDR:PORT", allow_hyphen_values = true)]
    pub listen: Option<String>,
    /// leave out the GPUs' own figures (NVML)
    #[arg(long)]
    pub no_gpus: bool,
}

#[derive(Args, Debug)]
pub struct SimArgs {
    /// how many simulated GPUs, 1 to 16
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=16), allow_hyphen_values = true)]
    pub gpus: u32,
    /// the memory of each simulated GPU (a size: 16GiB, 8000MB)
    #[arg(long, value_name = "SIZE", default_value = "16GiB", value_parser = gpu_memory, allow_hyphen_values = true)]
    pub memory: u64,
    /// what to run (default: $SHELL, else /bin/sh), with its arguments, passed on untouched
    #[arg(value_name = "COMMAND", trailing_var_arg = true, value_parser = clap::value_parser!(OsString))]
    pub command: Vec<OsString>,
}

#[derive(Args, Debug)]
pub struct SlurmArgs {
    /// the hook: task-prolog (slurm.conf's TaskProlog, through a wrapper script)
    #[arg(value_name = "HOOK", value_parser = ["task-prolog"])]
    pub hook: String,
    /// the shards of each GPU, as gres.conf counts them (Name=shard Count=… per GPU)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=i64::from(crate::slurm::MAX_SHARDS_PER_GPU)), allow_hyphen_values = true)]
    pub shards_per_gpu: Option<u32>,
    /// also limit the job's share of the GPU's time to its shards (GPUSHIM_COMPUTE_LIMIT=K/N)
    #[arg(long)]
    pub compute: bool,
    /// the libgpushim.so to preload; default: GPUSHIM_LIBRARY, else libgpushim.so next to this
    /// program, else ../lib/libgpushim.so from it
    #[arg(long, value_name = "PATH", allow_hyphen_values = true)]
    pub library: Option<PathBuf>,
}

fn gpu_memory(v: &str) -> Result<u64, String> {
    match crate::units::parse_size(v) {
        Ok(b) if b >= 1 << 20 => Ok(b),
        Ok(_) => Err("a simulated GPU needs at least 1 MiB".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// The command line `args` (without the program's name) as the definition reads it; help and
/// version requests are answered here.
pub fn parse(args: Vec<OsString>) -> Result<Cli, Failure> {
    let command = args.first().and_then(|a| a.to_str()).unwrap_or("").to_string();
    let argv = std::iter::once(OsString::from("gpushim")).chain(args);
    Cli::try_parse_from(argv).map_err(|e| usage_error(e, &command))
}

/// The clap definition, ready to render (subcommands know their full names).
pub fn definition() -> clap::Command {
    let mut cmd = Cli::command();
    cmd.build();
    cmd
}

/// The visible commands' names.
fn command_names() -> Vec<String> {
    Cli::command().get_subcommands().filter(|c| !c.is_hide_set()).map(|c| c.get_name().to_string()).collect()
}

/// The help page of `topic` (a command), or the main page.
pub fn page(topic: Option<&str>) -> Option<String> {
    let mut cmd = definition();
    match topic {
        None => Some(cmd.render_help().to_string()),
        Some(name) => cmd
            .get_subcommands_mut()
            .find(|c| c.get_name() == name && !c.is_hide_set())
            .map(|c| c.render_help().to_string()),
    }
}

/// `gpushim completions SHELL`: the visible commands and their options (clap_complete would
/// offer the hidden ones too).
pub fn completions(shell: clap_complete::Shell) {
    let full = Cli::command();
    let mut visible = clap::Command::new("gpushim")
        .version(env!("CARGO_PKG_VERSION"))
        .disable_help_subcommand(true)
        .subcommands(full.get_subcommands().filter(|c| !c.is_hide_set()).cloned());
    clap_complete::generate(shell, &mut visible, "gpushim", &mut std::io::stdout());
}

/// The manual's command reference (docs/src/commands.md), in Markdown: every command's page.
pub fn reference() -> String {
    let mut out = String::from(
        "# Commands\n\n<!-- Generated by `gpushim __reference > docs/src/commands.md` from the command's own\n\
         definition (src/bin/gpushim/cli.rs); tests/cli.rs fails when this page differs. Do not edit. -->\n\n\
         Every page below is what `gpushim help COMMAND` (or `gpushim COMMAND --help`) prints.\n\n",
    );
    let page_md = |title: &str, text: String| format!("## {title}\n\n```text\n{}\n```\n\n", text.trim_end());
    out.push_str(&page_md("gpushim", page(None).unwrap_or_default()));
    for name in command_names() {
        out.push_str(&page_md(&format!("gpushim {name}"), page(Some(&name)).unwrap_or_default()));
    }
    out.truncate(out.trim_end().len());
    out.push('\n');
    out
}

/// What clap found wrong with the command line, said the way gpushim says it: what to type
/// instead, and where the page is. Help and version requests become their page (status 0).
fn usage_error(e: clap::Error, command: &str) -> Failure {
    let known = command_names().iter().any(|c| c == command) || command == "__probe";
    let command = if known { command } else { "" };
    let see = if command.is_empty() { "see gpushim --help".to_string() } else { format!("see gpushim {command} --help") };
    let context = |kind: ContextKind| match e.get(kind) {
        Some(ContextValue::String(s)) => Some(s.clone()),
        Some(ContextValue::Strings(v)) => v.first().cloned(),
        _ => None,
    };
    // "--memory-mode <MODE>" → "--memory-mode"
    let flag = context(ContextKind::InvalidArg).map(|a| a.split([' ', '=']).next().unwrap_or("").to_string()).unwrap_or_default();
    let message = match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            return Failure::status(0);
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            eprint!("{}", page(None).unwrap_or_default());
            return Failure::status(crate::EXIT_USAGE);
        }
        ErrorKind::InvalidSubcommand => {
            let other = context(ContextKind::InvalidSubcommand).unwrap_or_default();
            let names = command_names();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let hint = crate::config::suggest(&other, &names).map_or(String::new(), |s| format!(" (did you mean gpushim {s}?)"));
            format!("unknown command {other:?}{hint}; {see}")
        }
        ErrorKind::UnknownArgument if flag.starts_with('-') && flag.len() > 1 => {
            let mut cmd = Cli::command();
            let sub = cmd.find_subcommand_mut(command).cloned().unwrap_or(cmd);
            let mut names: Vec<String> = sub.get_arguments().filter_map(|a| a.get_long()).map(|l| format!("--{l}")).collect();
            names.push("--help".into());
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let hint = crate::config::suggest(&flag, &names).map_or(String::new(), |s| format!(" (did you mean {s}?)"));
            format!("unknown option {flag}{hint}; {see}")
        }
        ErrorKind::UnknownArgument => {
            let arg = context(ContextKind::InvalidArg).unwrap_or_default();
            format!("unexpected argument {arg:?}; {see}")
        }
        ErrorKind::InvalidValue if context(ContextKind::InvalidValue).is_none_or(|v| v.is_empty()) => {
            let (what, example) = example(&flag);
            format!("{flag} needs {what}, like {flag} {example}")
        }
        ErrorKind::TooManyValues if !flag.is_empty() => {
            let then = if command == "run" { " -- ./app" } else { "" };
            format!("{flag} takes no value; give it alone, like gpushim {command} {flag}{then}")
        }
        ErrorKind::ValueValidation | ErrorKind::InvalidValue => {
            let value = context(ContextKind::InvalidValue).unwrap_or_default();
            let reason = std::error::Error::source(&e).map(|s| s.to_string());
            match reason {
                Some(r) if r.starts_with("needs ") => format!("{flag} {r}"),
                Some(r) => format!("{flag} {value:?}: {r}"),
                None => {
                    let valid = match e.get(ContextKind::ValidValue) {
                        Some(ContextValue::Strings(v)) => format!(" (one of {})", v.join(", ")),
                        _ => String::new(),
                    };
                    format!("{flag} {value:?}: not a valid value{valid}")
                }
            }
        }
        ErrorKind::InvalidUtf8 => format!("an argument is not valid UTF-8; {see}"),
        _ => {
            // the rest (rare): clap's own sentence, without its "error: " and usage lines
            let text = e.render().to_string();
            let first = text.lines().next().unwrap_or("").trim_start_matches("error: ").to_string();
            format!("{first}; {see}")
        }
    };
    Failure::usage(command, message)
}

/// What a flag's value is and an example of one, for "needs a value" messages.
fn example(flag: &str) -> (&'static str, &'static str) {
    match flag {
        DEVICE_LIMIT_FLAG => ("a value", "0=4GiB"),
        LIBRARY_FLAG => ("a value", "/usr/local/lib/libgpushim.so"),
        "--listen" => ("an address", "127.0.0.1:9400"),
        "--quota" => ("a value", "job42"),
        "--interval" | "-d" => ("seconds between 0.1 and 3600", "2"),
        "--gpus" => ("a number", "3"),
        "--memory" => ("a size", "8GiB"),
        "--shards-per-gpu" => ("a number", "4"),
        "--slices" => ("a number of slices from 1 to 128", "4"),
        "--output" | "-o" => ("a path", "/etc/cdi/gpushim.json"),
        "--kubelet-dir" => ("a directory", "/var/lib/kubelet/device-plugins"),
        _ => ("a value", SETTINGS.iter().find(|s| s.flag == flag).map_or("VALUE", |s| s.example)),
    }
}

/// `options::Parsed` of the options given to `run` or `check`, each value checked with the
/// shim's own parser (the message names the option as typed).
pub fn resolve(command: &str, o: &ShimOptions) -> Result<options::Parsed, Failure> {
    options::resolve(command, &o.values, &o.device_limits, o.library.clone())
}
