//! simjob-train: a training-like CUDA job.
//!
//! Allocates `--mem` up front (touched with a memset), then loops: launch `--kernels` kernels
//! totalling `--gpu-ms` of GPU time, wait for them (like reading the loss), sleep `--cpu-ms` on
//! the host (data loading, optimiser bookkeeping). Reports iterations/s. With `--phases
//! BUSY:IDLE` it alternates busy phases of iterations with idle phases without GPU work (starting
//! busy); `--trace` prints one line per iteration (and per idle phase).

use anyhow::Context;
use clap::Parser;
use jobs::cli::{self, CommonArgs};
use jobs::gpu::Gpu;
use jobs::profiles::{Train, TRAIN};
use jobs::report::Reporter;
use jobs::stats::{round3, RateWindow, Summary};
use serde_json::json;
use std::process::ExitCode;
use std::time::{Duration, Instant};

const JOB: &str = Train::BIN;

/// A training-like CUDA job: per iteration, kernels totalling --gpu-ms, then a --cpu-ms host gap.
///
/// Prints JSON lines on stdout: a start line, progress every --report-interval, and a final
/// summary ("final": true) with iterations/s. Runs for --duration (default 10s) or --iters;
/// SIGTERM/SIGINT stop it early, still with the final line.
#[derive(Parser, Debug)]
#[command(name = JOB, version, about, long_about)]
struct Args {
    /// GPU time per iteration, in milliseconds, split over --kernels kernels.
    #[arg(long, value_name = "MS", default_value_t = TRAIN.gpu_ms, value_parser = cli::parse_ms)]
    gpu_ms: f64,

    /// Number of kernels launched per iteration.
    #[arg(long, value_name = "K", default_value_t = TRAIN.kernels, value_parser = clap::value_parser!(u32).range(1..))]
    kernels: u32,

    /// Host time between iterations (a sleep), in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = TRAIN.cpu_ms, value_parser = cli::parse_ms)]
    cpu_ms: f64,

    /// Device memory allocated up front and touched with a memset (e.g. 512MiB, 2GiB).
    #[arg(long, value_name = "SIZE", default_value = "256MiB", value_parser = cli::parse_size)]
    mem: u64,

    /// Allocate --mem as managed memory (cuMemAllocManaged) instead of cuMemAlloc.
    #[arg(long)]
    managed: bool,

    /// Allocate --mem in N equal buffers; the kernels take them in turn (one each).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pieces: u64,

    /// Also memset the whole buffer every N iterations (0 = only once, up front).
    #[arg(long, value_name = "N", default_value_t = 0)]
    touch_every: u64,

    /// Alternate BUSY of iterations and IDLE without GPU work, starting busy (e.g. 2s:2s).
    #[arg(long, value_name = "BUSY:IDLE", value_parser = cli::parse_phases)]
    phases: Option<(Duration, Duration)>,

    /// Print a line per iteration, {"event":"iter","t":START,"end":END,"phase":N}, and per idle
    /// phase, {"event":"idle","t":START,"end":END} (seconds since the start).
    #[arg(long)]
    trace: bool,

    /// Begin the loop (after allocating and touching --mem) at this wall-clock time, seconds
    /// since the Unix epoch, so jobs started together work over the same interval (no wait if
    /// it has passed).
    #[arg(long, value_name = "EPOCH")]
    start_at: Option<f64>,

    /// Begin the loop (after allocating and touching --mem) once --parties jobs given the same
    /// directory have too, whatever their set-up took: jobs started together then work over the
    /// same interval even on a loaded host.
    #[arg(long, value_name = "DIR", conflicts_with = "start_at")]
    barrier: Option<std::path::PathBuf>,

    /// How many jobs meet at --barrier.
    #[arg(long, value_name = "N", default_value_t = 2, requires = "barrier")]
    parties: usize,

    /// Stop after this many iterations.
    #[arg(long, value_name = "N", conflicts_with = "duration")]
    iters: Option<u64>,

    /// Stop after this long (default 10s unless --iters is given).
    #[arg(long, value_name = "DURATION", value_parser = cli::parse_duration)]
    duration: Option<Duration>,

    #[command(flatten)]
    common: CommonArgs,
}

fn main() -> ExitCode {
    jobs::run::main_with(JOB, || run(Args::parse()))
}

fn run(args: Args) -> anyhow::Result<()> {
    let gpu = Gpu::open(args.common.device)?;
    let piece = args.mem / args.pieces;
    let mems = (0..args.pieces)
        .map(|_| gpu.alloc(piece, args.managed))
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("allocating --mem {}", cli::format_size(args.mem)))?;
    for mem in &mems {
        gpu.memset(mem, 0)?;
    }
    gpu.sync()?;
    if let Some(at) = args.start_at {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        if at > now && !jobs::run::sleep_until(Instant::now() + Duration::from_secs_f64(at - now)) {
            return Ok(());
        }
    }
    if let Some(dir) = &args.barrier {
        if !jobs::run::barrier(dir, args.parties, Duration::from_secs(300))? {
            return Ok(());
        }
    }
    let mut turn = 0usize;

    let kernel_ns = cli::split_ns(args.gpu_ms, args.kernels);
    let cpu_gap = Duration::from_secs_f64(args.cpu_ms / 1e3);
    let (limit_iters, limit_time) = match (args.iters, args.duration) {
        (Some(n), _) => (Some(n), None),
        (None, Some(d)) => (None, Some(d)),
        (None, None) => (None, Some(Duration::from_secs(10))),
    };

    let mut rep = Reporter::new(JOB, args.common.report_interval);
    rep.started(json!({
        "device": gpu.info.to_json(),
        "gpu_ms": args.gpu_ms,
        "kernels": args.kernels,
        "cpu_ms": args.cpu_ms,
        "mem_bytes": args.mem,
        "managed": args.managed,
        "pieces": args.pieces,
        "touch_every": args.touch_every,
        "iters_limit": limit_iters,
        "phases_s": args.phases.map(|(b, i)| [b.as_secs_f64(), i.as_secs_f64()]),
        "trace": args.trace,
        "duration_s": limit_time.map(|d| d.as_secs_f64()),
    }));

    let start = rep.start();
    let mut window = RateWindow::new(0.0, 0);
    let mut iter_ms: Vec<f64> = Vec::new();
    let mut iters: u64 = 0;
    loop {
        if limit_iters.is_some_and(|n| iters >= n)
            || limit_time.is_some_and(|d| start.elapsed() >= d)
            || jobs::run::stop_requested()
        {
            break;
        }
        if let Some((busy, idle)) = args.phases {
            // Idle until the next cycle if the busy part of this one is over.
            let cycle = busy + idle;
            let into = start.elapsed();
            let k = (into.as_nanos() / cycle.as_nanos().max(1)) as u32;
            if into - cycle * k >= busy {
                let began = Instant::now();
                let mut resume = start + cycle * (k + 1);
                if let Some(d) = limit_time {
                    resume = resume.min(start + d);
                }
                if !idle_until(&mut rep, &mut window, iters, resume) {
                    break;
                }
                if args.trace {
                    rep.trace("idle", began, Instant::now(), json!({ "phase": k }));
                }
                continue;
            }
        }
        let t0 = Instant::now();
        if args.touch_every > 0 && iters > 0 && iters % args.touch_every == 0 {
            for mem in &mems {
                gpu.memset(mem, (iters / args.touch_every) as u8)?;
            }
        }
        // The kernels work on the job's memory, so --managed memory is faulted in as it is used.
        for &ns in &kernel_ns {
            gpu.spin_over(ns, &mems[turn % mems.len()])?;
            turn += 1;
        }
        gpu.sync()?;
        if !cpu_gap.is_zero() {
            // A stop request cuts the gap short; the iteration still counts.
            jobs::run::sleep_until(Instant::now() + cpu_gap);
        }
        iters += 1;
        let t1 = Instant::now();
        iter_ms.push(t1.duration_since(t0).as_secs_f64() * 1e3);
        if args.trace {
            let phase = args
                .phases
                .map(|(b, i)| t0.duration_since(start).as_nanos() / (b + i).as_nanos().max(1));
            rep.trace("iter", t0, t1, json!({ "phase": phase }));
        }

        if rep.due() {
            let t = rep.t();
            rep.progress(json!({
                "iters": iters,
                "iters_per_s": round3(window.tick(t, iters)),
                "avg_iters_per_s": round3(iters as f64 / t),
            }));
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    drop(mems);
    rep.finish(json!({
        "iters": iters,
        "elapsed_s": round3(elapsed),
        "iters_per_s": round3(if elapsed > 0.0 { iters as f64 / elapsed } else { 0.0 }),
        "iter_ms": Summary::to_json(Summary::of(&iter_ms)),
        "ideal_iter_ms": round3(args.gpu_ms + args.cpu_ms),
        "gpu_ms": args.gpu_ms,
        "cpu_ms": args.cpu_ms,
        "kernels": args.kernels,
        "mem_bytes": args.mem,
        "managed": args.managed,
        "device": gpu.info.to_json(),
    }));
    Ok(())
}

/// Sleeps until `resume` (an idle phase), still printing progress lines when due. Returns
/// `false` if a stop was requested.
fn idle_until(rep: &mut Reporter, window: &mut RateWindow, iters: u64, resume: Instant) -> bool {
    loop {
        let step =
            (resume.saturating_duration_since(Instant::now())).min(Duration::from_millis(10));
        if !jobs::run::sleep_until(Instant::now() + step) {
            return false;
        }
        if rep.due() {
            let t = rep.t();
            rep.progress(json!({
                "iters": iters,
                "iters_per_s": round3(window.tick(t, iters)),
                "avg_iters_per_s": round3(iters as f64 / t),
            }));
        }
        if Instant::now() >= resume {
            return true;
        }
    }
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
        assert_eq!(a.gpu_ms, 6.0);
        assert_eq!(a.kernels, 4);
        assert_eq!(a.mem, 256 << 20);
        // The defaults are the shared TRAIN profile, and its rendered argv means the same.
        let of = |a: &Args| Train {
            gpu_ms: a.gpu_ms,
            kernels: a.kernels,
            cpu_ms: a.cpu_ms,
            mem_mib: a.mem >> 20,
        };
        assert_eq!(of(&a), TRAIN);
        let rendered = Args::try_parse_from(std::iter::once(JOB.to_string()).chain(TRAIN.args()));
        assert_eq!(of(&rendered.unwrap()), TRAIN);
        assert!(a.iters.is_none() && a.duration.is_none());
        let a = Args::try_parse_from([
            JOB,
            "--mem",
            "2GiB",
            "--managed",
            "--gpu-ms",
            "1.5",
            "--duration",
            "500ms",
        ])
        .unwrap();
        assert_eq!(a.mem, 2 << 30);
        assert!(a.managed);
        assert_eq!(a.duration, Some(Duration::from_millis(500)));
        assert!(Args::try_parse_from([JOB, "--iters", "5", "--duration", "1s"]).is_err());
        assert!(Args::try_parse_from([JOB, "--kernels", "0"]).is_err());
        let a = Args::try_parse_from([JOB, "--phases", "2s:1s", "--trace"]).unwrap();
        assert_eq!(
            a.phases,
            Some((Duration::from_secs(2), Duration::from_secs(1)))
        );
        assert!(a.trace);
        assert!(Args::try_parse_from([JOB, "--mem", "lots"]).is_err());
    }
}
