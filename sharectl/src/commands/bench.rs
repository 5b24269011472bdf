//! `sharectl bench`: issue 9's sharing scenarios under every policy; the scenarios, their runs
//! and their rows are `crate::bench`'s.

use crate::bench::{CpuLayout, Policy, S3Op, ScenarioArg};
use std::path::PathBuf;

/// Run issue 9's sharing scenarios under every policy and print one result per scenario and
/// policy.
///
/// Starts a private `sharectl daemon` per run on a temporary state dir and the `jobs/` programs
/// (on simgpu when there is no GPU). Policies: exclusive, native, static-split, time-slice,
/// libshare. A policy that cannot run (e.g. no daemon in this build) prints its error, the
/// others still run, and the exit code is 1.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Which scenario(s) to run.
    #[arg(value_enum)]
    pub scenario: ScenarioArg,

    /// Print JSON lines instead of a table.
    #[arg(long, conflicts_with = "markdown")]
    pub json: bool,

    /// Print a Markdown table (as in BENCHMARKS.md).
    #[arg(long)]
    pub markdown: bool,

    /// Write one SVG timeline per scenario, policy and run into DIR.
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,

    /// Seconds per co-located run (scenarios scale their phases with it).
    #[arg(long, value_name = "SECS", default_value_t = 6.0, value_parser = |s: &str| crate::commands::parse_secs(s, 2.0..=600.0))]
    pub duration: f64,

    #[command(flatten)]
    pub platform: crate::platform::PlatformArgs,

    /// The shim to preload [default: libshare.so next to sharectl, else <target>/dist/].
    #[arg(long, value_name = "FILE")]
    pub shim: Option<PathBuf>,

    /// The Python (with PyTorch) that runs S8's jobs [default: the venv scripts/fetch-cuda.sh
    /// installs in ~/.cache/libshare/torch-venv, else python3].
    #[arg(long, value_name = "FILE")]
    pub python: Option<PathBuf>,

    /// S8's and S9's CPU layout: `by-class` (production on a CPU of its own, the others and the
    /// daemon on the rest, as containers on a GPU node), `shared` (anywhere: CPU contention on
    /// top of the GPU's), or `both` (`shared` as a control for `native` and `libshare`)
    /// [default: S8 both, S9 shared].
    #[arg(long, value_enum)]
    pub cpus: Option<CpuLayout>,

    /// S3's opportunistic operations (comma-separated), one part each: `kernel` (0.5 ms
    /// kernels), `memset` (2 MiB `cuMemsetD8Async`), `copy` (1 MiB `cuMemcpyDtoDAsync`).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "kernel,memset,copy"
    )]
    pub ops: Vec<S3Op>,

    /// Only these policies (comma-separated) [default: all five].
    #[arg(long, value_enum, value_delimiter = ',')]
    pub policy: Vec<Policy>,

    /// The latency budget of libshare's daemon: a time (e.g. 500us) or a share of production's
    /// service time (e.g. 10%) [default: the daemon's, 2ms]; S10's libshare rows run under
    /// this one only instead of their four.
    #[arg(long, value_name = "TIME|PCT")]
    pub latency_budget: Option<libshare_node::policy::LatencyBudget>,

    /// S9's numbers of opportunistic processes (comma-separated).
    #[arg(long, value_name = "N", value_delimiter = ',', default_value = "1,2,4,8", value_parser = clap::value_parser!(u16).range(1..=64))]
    pub s9_processes: Vec<u16>,

    /// S10's opportunistic kernels (comma-separated).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "0.5ms,2ms,10ms,10ms-blocks"
    )]
    pub s10_kernels: Vec<crate::bench::S10Kernel>,

    /// S8's training batch: 4096 with --s8-width 4096 makes its kernels 0.4-2 ms (large-batch
    /// training, issue 31).
    #[arg(long, value_name = "N", default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..))]
    pub s8_batch: u32,

    /// S8's training layer width.
    #[arg(long, value_name = "N", default_value_t = 2048, value_parser = clap::value_parser!(u32).range(1..))]
    pub s8_width: u32,
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    crate::bench::run(crate::bench::Options {
        scenario: args.scenario,
        json: args.json,
        markdown: args.markdown,
        plot: args.plot,
        duration: args.duration,
        platform: args.platform,
        shim: args.shim,
        python: args.python,
        cpus: args.cpus,
        ops: args.ops,
        policy: args.policy,
        latency_budget: args.latency_budget,
        s10_kernels: args.s10_kernels,
        s9_processes: args.s9_processes,
        s8_training: (args.s8_batch, args.s8_width),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        a: BenchArgs,
    }

    fn parse(args: &[&str]) -> Result<BenchArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied())).map(|c| c.a)
    }

    #[test]
    fn args() {
        let a = parse(&["S1"]).unwrap();
        assert_eq!(a.scenario, ScenarioArg::S1);
        assert_eq!(a.duration, 6.0);
        assert!(!a.json && !a.markdown && a.policy.is_empty());
        let a = parse(&[
            "all",
            "--json",
            "--duration",
            "3",
            "--policy",
            "native,libshare",
        ])
        .unwrap();
        assert_eq!(a.scenario, ScenarioArg::All);
        assert_eq!(a.policy, vec![Policy::Native, Policy::Libshare]);
        assert_eq!(parse(&["S9"]).unwrap().scenario, ScenarioArg::S9);
        assert_eq!(parse(&["S4"]).unwrap().scenario, ScenarioArg::S4);
        assert_eq!(
            parse(&["S3"]).unwrap().ops,
            vec![S3Op::Kernel, S3Op::Memset, S3Op::Copy]
        );
        assert_eq!(
            parse(&["S3", "--ops", "memset"]).unwrap().ops,
            vec![S3Op::Memset]
        );
        assert!(parse(&["S3", "--ops", "fill"]).is_err());
        assert_eq!(parse(&["S5"]).unwrap().scenario, ScenarioArg::S5);
        assert_eq!(
            parse(&["S5", "--policy", "fixed-quantum"]).unwrap().policy,
            vec![Policy::FixedQuantum]
        );
        assert!(parse(&["S1", "--duration", "1"]).is_err());
        assert!(parse(&["S1", "--json", "--markdown"]).is_err());
        assert!(parse(&["S1", "--policy", "mps"]).is_err());
        let a = parse(&["S8", "--s8-batch", "4096", "--s8-width", "4096"]).unwrap();
        assert_eq!(
            (a.s8_batch, a.s8_width, a.latency_budget),
            (4096, 4096, None)
        );
        assert_eq!(
            (
                parse(&["S8"]).unwrap().s8_batch,
                parse(&["S8"]).unwrap().s8_width
            ),
            (512, 2048)
        );
        assert!(parse(&["S8", "--s8-batch", "0"]).is_err());
        let a = parse(&["S8", "--latency-budget", "500us"]).unwrap();
        assert_eq!(a.latency_budget.unwrap().to_string(), "500us");
        assert!(parse(&["S8", "--latency-budget", "0"]).is_err());
        assert!(parse(&["S8", "--latency-budget", "soon"]).is_err());
    }
}
