//! `sharectl runtime`: the runc wrapper ([`crate::containers::runtime`]): its own options
//! before `--`, runc's after.

use crate::containers::inject::InjectArgs;
use crate::containers::runtime::{bundle_of, edit_bundle, verb_index, VERBS};
use anyhow::{anyhow, bail, Result};
use clap::{Args, Parser};
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct RuntimeCli {
    /// [OPTIONS] -- RUNC-ARGUMENTS (the options: `sharectl runtime --help`).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "ARGS"
    )]
    pub args: Vec<OsString>,
}

/// The wrapper's own options (before `--`).
#[derive(Parser, Debug)]
#[command(
    name = "sharectl runtime",
    no_binary_name = true,
    override_usage = "sharectl runtime [OPTIONS] -- <RUNC ARGUMENTS>...",
    about = "runc wrapper: adds the libshare hook to containers asking for a shared GPU, then execs runc"
)]
struct RuntimeOpts {
    #[command(flatten)]
    inject: InjectArgs,
    /// The OCI runtime to exec.
    #[arg(long, value_name = "PATH", default_value = "runc")]
    runc: PathBuf,
}

pub fn run(cli: RuntimeCli) -> Result<()> {
    let (own, runc_args) = match cli.args.iter().position(|a| a == "--") {
        Some(i) => (&cli.args[..i], &cli.args[i + 1..]),
        // `sharectl runtime --help`: the wrapper's own options.
        None if cli.args.len() == 1 && (cli.args[0] == "--help" || cli.args[0] == "-h") => {
            (&cli.args[..], &cli.args[..0])
        }
        None => (&cli.args[..0], &cli.args[..]),
    };
    let opts = RuntimeOpts::try_parse_from(own).map_err(|e| {
        if e.kind() == clap::error::ErrorKind::DisplayHelp {
            let _ = e.print();
            std::process::exit(0);
        }
        anyhow!(
            "{}",
            e.to_string().lines().next().unwrap_or("bad options").trim()
        )
    })?;
    let verb_at = verb_index(runc_args);
    if let Some(i) = verb_at {
        let verb = runc_args[i].to_string_lossy();
        if !VERBS.contains(&verb.as_ref()) {
            bail!(
                "unknown runc command {verb:?}: nothing was run (runc's commands: {})",
                VERBS.join(", ")
            );
        }
        if verb == "create" || verb == "run" {
            let bundle = bundle_of(&runc_args[i + 1..])?;
            edit_bundle(&opts.inject, &bundle)?;
        }
    }
    let err = std::process::Command::new(&opts.runc)
        .arg0("runc")
        .args(runc_args)
        .exec();
    Err(anyhow!("cannot run {}: {err}", opts.runc.display()))
}
