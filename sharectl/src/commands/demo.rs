//! `sharectl demo`: a production and an opportunistic job sharing one GPU (real, or simgpu);
//! the run and its output are `crate::demo`'s.

use crate::platform;
use std::path::PathBuf;

/// Run a production and an opportunistic job on this machine's GPU, or on simgpu.
///
/// Both run under libshare's shim as two containers with memory quotas: "prod" (production) and
/// "batch" (opportunistic, smaller quota). Phase 1 runs the production job alone; phase 2 runs it
/// next to the opportunistic job, which keeps the GPU busy, and a second batch worker tries to
/// grow the batch container past its quota (the shim refuses it). Live throughput and
/// per-container memory are printed once a second, then a summary. Kernel-rate control (the
/// daemon that protects production's GPU time) is not running in phase 2; phase 3 runs the pair
/// again under `sharectl daemon`.
#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Seconds per phase.
    #[arg(long, value_name = "SECS", default_value = "5", value_parser = |s: &str| crate::commands::parse_secs(s, 0.5..=3600.0))]
    pub duration: f64,

    #[command(flatten)]
    pub platform: platform::PlatformArgs,

    /// The shim to preload [default: libshare.so next to the sharectl binary, else
    /// <target>/dist/libshare.so; without either the demo runs without the shim].
    #[arg(long, value_name = "FILE", conflicts_with = "no_shim")]
    pub shim: Option<PathBuf>,

    /// Run the jobs without the shim (native co-location only, no quotas).
    #[arg(long)]
    pub no_shim: bool,

    /// Print JSON lines (progress, then a final summary with "final": true) instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    crate::demo::run(crate::demo::Options {
        duration: args.duration,
        platform: args.platform,
        shim: args.shim,
        no_shim: args.no_shim,
        json: args.json,
    })
}
