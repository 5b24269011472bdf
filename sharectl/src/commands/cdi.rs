//! `sharectl cdi generate`: the node's Container Device Interface spec
//! ([`crate::containers::cdi`]), printed or written.

use crate::containers::cdi::{spec, valid_kind};
use crate::containers::inject::{write_atomic, InjectArgs};
use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use std::path::PathBuf;

#[derive(Subcommand, Debug)]
pub enum CdiCommand {
    /// Print (or write with --output) the CDI spec for this node's GPUs.
    Generate(GenerateArgs),
}

#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub inject: InjectArgs,
    /// The spec's kind (vendor/class): devices are requested as KIND=0, KIND=all.
    #[arg(long, default_value = "libshare.dev/gpu")]
    pub kind: String,
    /// Only these GPU indices (comma-separated; default: every GPU NVML reports).
    #[arg(long, value_delimiter = ',')]
    pub devices: Option<Vec<u32>>,
    /// Write the spec here (atomically; e.g. /etc/cdi/libshare.json) instead of stdout.
    #[arg(long, short, value_name = "PATH")]
    pub output: Option<PathBuf>,
}

pub fn run(cmd: CdiCommand) -> Result<()> {
    match cmd {
        CdiCommand::Generate(a) => generate(a),
    }
}

fn generate(a: GenerateArgs) -> Result<()> {
    if !valid_kind(&a.kind) {
        bail!(
            "--kind {}: expected vendor.domain/class (letters, digits, '.', '-', '_'), \
             e.g. libshare.dev/gpu",
            a.kind
        );
    }
    // The daemon may start later (package install): its socket is needed when a container
    // starts, where the runtime fails the mount without it.
    a.inject.check(false)?;
    let count = libshare_node::nvml::device_totals()
        .map_err(|e| anyhow::anyhow!("cannot count the node's GPUs: {e}"))?
        .len() as u32;
    let devices: Vec<u32> = match &a.devices {
        None => (0..count).collect(),
        Some(list) => {
            if let Some(bad) = list.iter().find(|&&i| i >= count) {
                bail!(
                    "GPU {bad} does not exist: this node has {count} GPU(s) (0..{}); nothing written",
                    count.saturating_sub(1)
                );
            }
            list.clone()
        }
    };
    if devices.is_empty() {
        bail!("this node has no GPU (NVML reports none): nothing to generate");
    }
    let spec = spec(&a.inject, &a.kind, &devices)?;
    let text = serde_json::to_string_pretty(&spec)? + "\n";
    a.inject.ensure_preload_file()?;
    match &a.output {
        Some(path) => write_atomic(path, text.as_bytes(), 0o644),
        None => {
            print!("{text}");
            Ok(())
        }
    }
}
