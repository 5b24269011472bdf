//! simjob-infer: an inference-like CUDA job.
//!
//! Open loop: request i is due at start + i/--rate (`--arrivals clock`), or after exponential
//! gaps of mean 1/--rate (`--arrivals poisson`, the serving case: users send requests when they
//! do; a seeded generator, so a seed replays the same times), whether or not earlier requests
//! are done.
//! Each request copies --input bytes in, runs kernels totalling --gpu-ms, copies --output bytes
//! out and waits for the stream. Latency is measured from the request's due time to its
//! completion, so time spent queued behind late requests counts.

use anyhow::{bail, Context};
use clap::{Parser, ValueEnum};
use jobs::cli::{self, CommonArgs};
use jobs::gpu::Gpu;
use jobs::report::Reporter;
use jobs::stats::{round3, RateWindow, Summary};
use serde_json::json;
use std::process::ExitCode;
use std::time::{Duration, Instant};

const JOB: &str = "simjob-infer";

/// An inference-like CUDA job: --rate requests/s (open loop), each copy in, kernels, copy out.
///
/// Prints JSON lines on stdout: a start line, progress every --report-interval, and a final
/// summary ("final": true) with latency p50/p99/max (ms) and the achieved rate. SIGTERM/SIGINT
/// stop it early, still with the final line.
#[derive(Parser, Debug)]
#[command(name = JOB, version, about, long_about)]
struct Args {
    /// Requests per second, scheduled on absolute deadlines (open loop).
    #[arg(long, value_name = "PER_S", default_value = "20", value_parser = cli::parse_positive)]
    rate: f64,

    /// When requests are due: on a clock (every 1/--rate), or a Poisson process of --rate.
    #[arg(long, value_enum, default_value_t = Arrivals::Clock)]
    arrivals: Arrivals,

    /// Seed of the Poisson arrivals (the same seed gives the same arrival times).
    #[arg(long, value_name = "N", default_value_t = 1)]
    seed: u64,

    /// GPU time per request, in milliseconds, split over --kernels kernels.
    #[arg(long, value_name = "MS", default_value = "5", value_parser = cli::parse_ms)]
    gpu_ms: f64,

    /// Number of kernels per request.
    #[arg(long, value_name = "K", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    kernels: u32,

    /// Bytes copied host→device per request (e.g. 1MiB).
    #[arg(long, value_name = "SIZE", default_value = "1MiB", value_parser = cli::parse_size)]
    input: u64,

    /// Bytes copied device→host per request (e.g. 64KiB).
    #[arg(long, value_name = "SIZE", default_value = "64KiB", value_parser = cli::parse_size)]
    output: u64,

    /// Use ordinary (pageable) host buffers instead of page-locked ones (cuMemHostAlloc).
    #[arg(long)]
    pageable: bool,

    /// Print a line per request, {"event":"request","t":DUE,"end":DONE,"latency_ms":L,
    /// "began":B,"gpu_ms":G} (seconds since the start; G: from the input's arrival on the GPU
    /// to the last kernel's end, timed by two events around the kernels).
    #[arg(long)]
    trace: bool,

    /// Stop after this many requests.
    #[arg(long, value_name = "N", conflicts_with = "duration")]
    requests: Option<u64>,

    /// Stop issuing requests after this long (default 10s unless --requests is given).
    #[arg(long, value_name = "DURATION", value_parser = cli::parse_duration)]
    duration: Option<Duration>,

    #[command(flatten)]
    common: CommonArgs,
}

/// When requests are due.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Arrivals {
    /// Every 1/--rate.
    Clock,
    /// Exponential gaps of mean 1/--rate.
    Poisson,
}

fn main() -> ExitCode {
    jobs::run::main_with(JOB, || run(Args::parse()))
}

fn run(args: Args) -> anyhow::Result<()> {
    let gpu = Gpu::open(args.common.device)?;
    let dev_bytes = args.input.max(args.output).max(1);
    let dev = gpu.alloc(dev_bytes, false).with_context(|| {
        format!(
            "allocating {} of device memory",
            cli::format_size(dev_bytes)
        )
    })?;
    let mut input = gpu.host_alloc(args.input, args.pageable)?;
    let mut output = gpu.host_alloc(args.output, args.pageable)?;

    // Check once that copies move bytes (a broken driver would make the latencies meaningless).
    for (i, b) in input.as_mut_slice().iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    gpu.copy_to_device(&dev, &input)?;
    gpu.copy_to_host(&mut output, &dev)?;
    gpu.sync()?;
    let n = input.len().min(output.len());
    if input.as_slice()[..n] != output.as_slice()[..n] {
        bail!("data copied to the device and back does not match (cuMemcpyHtoDAsync_v2/cuMemcpyDtoHAsync_v2)");
    }

    let kernel_ns = cli::split_ns(args.gpu_ms, args.kernels);
    let interval = Duration::from_secs_f64(1.0 / args.rate);
    let (limit_reqs, limit_time) = match (args.requests, args.duration) {
        (Some(n), _) => (Some(n), None),
        (None, Some(d)) => (None, Some(d)),
        (None, None) => (None, Some(Duration::from_secs(10))),
    };

    let mut rep = Reporter::new(JOB, args.common.report_interval);
    rep.started(json!({
        "device": gpu.info.to_json(),
        "rate": args.rate,
        "arrivals": format!("{:?}", args.arrivals).to_lowercase(),
        "gpu_ms": args.gpu_ms,
        "kernels": args.kernels,
        "input_bytes": args.input,
        "output_bytes": args.output,
        "pinned": input.is_pinned() || output.is_pinned(),
        "requests_limit": limit_reqs,
        "trace": args.trace,
        "duration_s": limit_time.map(|d| d.as_secs_f64()),
    }));

    // With --trace, each request's kernels between two timed events: the GPU time from its
    // input's arrival to its last kernel's end (the kernels plus what they waited for on the
    // GPU: other contexts' work), without the host's part (a late wake-up, slow calls).
    let marks = if args.trace {
        Some((gpu.timed_event()?, gpu.timed_event()?))
    } else {
        None
    };
    let start = rep.start();
    let mut lat_ms: Vec<f64> = Vec::new();
    let mut service_ms: Vec<f64> = Vec::new();
    let mut win_lat: Vec<f64> = Vec::new();
    let mut window = RateWindow::new(0.0, 0);
    let mut done: u64 = 0;
    let mut gaps = jobs::stats::Exponential::new(args.seed);
    let mut poisson_at = Duration::ZERO;
    loop {
        let due = match args.arrivals {
            Arrivals::Clock => start + interval.mul_f64(done as f64),
            Arrivals::Poisson => {
                poisson_at += interval.mul_f64(gaps.next_gap());
                start + poisson_at
            }
        };
        if limit_reqs.is_some_and(|n| done >= n)
            || limit_time.is_some_and(|d| due.duration_since(start) >= d)
            || jobs::run::stop_requested()
        {
            break;
        }
        if !jobs::run::sleep_until(due) {
            break;
        }
        let began = Instant::now();
        gpu.copy_to_device(&dev, &input)?;
        if let Some((a, _)) = &marks {
            a.record()?;
        }
        for &ns in &kernel_ns {
            gpu.spin(ns)?;
        }
        if let Some((_, b)) = &marks {
            b.record()?;
        }
        gpu.copy_to_host(&mut output, &dev)?;
        gpu.sync()?;
        let finished = Instant::now();
        done += 1;
        let l = finished.duration_since(due).as_secs_f64() * 1e3;
        lat_ms.push(l);
        win_lat.push(l);
        service_ms.push(finished.duration_since(began).as_secs_f64() * 1e3);
        if args.trace {
            rep.trace(
                "request",
                due,
                finished,
                json!({
                    "latency_ms": round3(l),
                    "began": jobs::report::micros(rep.t_of(began)),
                    "gpu_ms": match &marks {
                        Some((a, b)) => Some(round3(b.elapsed_ms(a)?)),
                        None => None,
                    },
                }),
            );
        }

        if rep.due() {
            let t = rep.t();
            let s = Summary::of(&win_lat);
            rep.progress(json!({
                "requests": done,
                "rate": round3(window.tick(t, done)),
                "p50_ms": s.map(|s| round3(s.p50)),
                "p99_ms": s.map(|s| round3(s.p99)),
                "max_ms": s.map(|s| round3(s.max)),
            }));
            win_lat.clear();
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    // Over the schedule's span at least: the last request is due one interval before the end,
    // so dividing by the run time alone would overstate a job that keeps up.
    let span = elapsed.max(done as f64 / args.rate);
    let lat = Summary::of(&lat_ms);
    rep.finish(json!({
        "requests": done,
        "elapsed_s": round3(elapsed),
        "target_rate": args.rate,
        "achieved_rate": round3(if span > 0.0 { done as f64 / span } else { 0.0 }),
        "p50_ms": lat.map(|s| round3(s.p50)),
        "p99_ms": lat.map(|s| round3(s.p99)),
        "max_ms": lat.map(|s| round3(s.max)),
        "latency_ms": Summary::to_json(lat),
        "service_ms": Summary::to_json(Summary::of(&service_ms)),
        "gpu_ms": args.gpu_ms,
        "kernels": args.kernels,
        "input_bytes": args.input,
        "output_bytes": args.output,
        "pinned": input.is_pinned() || output.is_pinned(),
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
        assert_eq!(a.rate, 20.0);
        assert_eq!(a.input, 1 << 20);
        assert_eq!(a.output, 64 << 10);
        let a = Args::try_parse_from([JOB, "--rate", "100", "--input", "4MiB", "--requests", "10"])
            .unwrap();
        assert_eq!(a.rate, 100.0);
        assert_eq!(a.input, 4 << 20);
        assert_eq!(a.requests, Some(10));
        assert!(Args::try_parse_from([JOB, "--rate", "0"]).is_err());
        assert!(Args::try_parse_from([JOB, "--requests", "1", "--duration", "1s"]).is_err());
    }
}
