//! simjob-saturate: keeps the GPU busy with back-to-back kernels.
//!
//! Launches kernels of --kernel-ms each, keeping at most --depth in flight (one event per
//! kernel; when --depth are queued it waits for the oldest), for --duration. Reports kernels/s
//! and GPU-ms/s (completed kernels × --kernel-ms per second of wall time).

use clap::Parser;
use jobs::cli::{self, CommonArgs};
use jobs::gpu::{Event, Gpu};
use jobs::report::Reporter;
use jobs::stats::{round3, RateWindow};
use serde_json::json;
use std::collections::VecDeque;
use std::process::ExitCode;
use std::time::Duration;

const JOB: &str = "simjob-saturate";

/// A GPU-saturating CUDA job: back-to-back kernels with at most --depth in flight.
///
/// Prints JSON lines on stdout: a start line, progress every --report-interval, and a final
/// summary ("final": true) with kernels/s and GPU-ms/s achieved. SIGTERM/SIGINT stop it early,
/// still with the final line.
#[derive(Parser, Debug)]
#[command(name = JOB, version, about, long_about)]
struct Args {
    /// GPU time of each kernel, in milliseconds.
    #[arg(long, value_name = "MS", default_value = "2", value_parser = cli::parse_ms)]
    kernel_ms: f64,

    /// Maximum number of kernels in flight.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    depth: u32,

    /// How long to keep launching.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = cli::parse_duration)]
    duration: Duration,

    #[command(flatten)]
    common: CommonArgs,
}

fn main() -> ExitCode {
    jobs::run::main_with(JOB, || run(Args::parse()))
}

fn run(args: Args) -> anyhow::Result<()> {
    let gpu = Gpu::open(args.common.device)?;
    let ns = (args.kernel_ms * 1e6).round() as u64;
    let mut free: Vec<Event<'_>> = (0..args.depth)
        .map(|_| gpu.event())
        .collect::<Result<_, _>>()?;
    let mut in_flight: VecDeque<Event<'_>> = VecDeque::with_capacity(args.depth as usize);

    let mut rep = Reporter::new(JOB, args.common.report_interval);
    rep.started(json!({
        "device": gpu.info.to_json(),
        "kernel_ms": args.kernel_ms,
        "depth": args.depth,
        "duration_s": args.duration.as_secs_f64(),
    }));
    let start = rep.start();
    let mut window = RateWindow::new(0.0, 0);
    let mut launched: u64 = 0;
    let mut completed: u64 = 0;
    while start.elapsed() < args.duration && !jobs::run::stop_requested() {
        if let Some(ev) = free.pop() {
            gpu.spin(ns)?;
            ev.record()?;
            in_flight.push_back(ev);
            launched += 1;
            continue;
        }
        let oldest = in_flight.pop_front().expect("depth >= 1");
        oldest.synchronize()?;
        completed += 1;
        free.push(oldest);

        if rep.due() {
            let t = rep.t();
            let kps = window.tick(t, completed);
            rep.progress(json!({
                "kernels": completed,
                "kernels_per_s": round3(kps),
                "gpu_ms_per_s": round3(kps * args.kernel_ms),
            }));
        }
    }
    // Drain what is still queued so every launched kernel is accounted for.
    gpu.sync()?;
    completed += in_flight.len() as u64;
    let elapsed = start.elapsed().as_secs_f64();
    let kps = if elapsed > 0.0 {
        completed as f64 / elapsed
    } else {
        0.0
    };
    rep.finish(json!({
        "kernels": completed,
        "launched": launched,
        "elapsed_s": round3(elapsed),
        "kernels_per_s": round3(kps),
        "gpu_ms_per_s": round3(kps * args.kernel_ms),
        "kernel_ms": args.kernel_ms,
        "depth": args.depth,
        "device": gpu.info.to_json(),
    }));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn defaults_and_flags() {
        let a = Args::try_parse_from([JOB]).unwrap();
        assert_eq!(a.kernel_ms, 2.0);
        assert_eq!(a.depth, 4);
        assert_eq!(a.duration, Duration::from_secs(10));
        let a = Args::try_parse_from([JOB, "--depth", "1", "--duration", "2"]).unwrap();
        assert_eq!(a.depth, 1);
        assert_eq!(a.duration, Duration::from_secs(2));
        assert!(Args::try_parse_from([JOB, "--depth", "0"]).is_err());
        assert!(Args::try_parse_from([JOB, "--kernel-ms", "-1"]).is_err());
    }
}
