//! `sharectl gpu-check OUT_DIR`: libshare against the machine's NVIDIA driver, and simgpu
//! calibrated against it (issue 33). `scripts/gpu-check.sh` wraps it and makes the bundle it
//! runs from; the checks are `crate::gpu_check`'s.

use std::path::PathBuf;

/// Run libshare on this machine's GPU and calibrate simgpu against it: interposition, quotas,
/// the gate, M1/M2 and the sharing scenarios beside the same on simgpu; writes report.json,
/// summary.md and simgpu-calibrated.toml into OUT_DIR.
///
/// Runs from a bundle made by `scripts/gpu-check.sh --bundle` (no toolchain needed on the GPU
/// machine). Every check is time-boxed; the whole run stops starting checks at --budget.
#[derive(clap::Args, Debug)]
pub struct GpuCheckArgs {
    /// Directory for report.json, summary.md, simgpu-calibrated.toml and logs/ (created).
    pub out: PathBuf,

    /// The bundle [default: the directory above this sharectl, `<bundle>/release/sharectl`].
    #[arg(long, value_name = "DIR")]
    pub bundle: Option<PathBuf>,

    /// A dry run without a GPU: simgpu's libcuda.so.1 and NVML stand in for the driver (the flag
    /// chooses the driver and nothing else).
    #[arg(long)]
    pub sim: bool,

    /// Shorter measurements for CI: 2-3 s benchmark runs, fewer policies for S4 and S9, no S5,
    /// simgpu beside the GPU for S1 only.
    #[arg(long)]
    pub short: bool,

    /// Seconds after which no check starts (each is time-boxed within it).
    #[arg(long, value_name = "SECS", default_value_t = 420, value_parser = clap::value_parser!(u64).range(60..=3600))]
    pub budget: u64,

    /// The Python whose PyTorch runs the PyTorch check [default: python3 on PATH].
    #[arg(long, value_name = "FILE")]
    pub python: Option<PathBuf>,
}

pub fn run(args: GpuCheckArgs) -> anyhow::Result<()> {
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    crate::gpu_check::run(crate::gpu_check::Options {
        out: args.out,
        bundle: args.bundle,
        sim: args.sim,
        short: args.short,
        budget_s: args.budget,
        python: args.python,
        command,
    })
}
