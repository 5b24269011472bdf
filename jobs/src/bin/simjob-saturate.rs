//! simjob-saturate: keeps the GPU busy with back-to-back kernels, memsets or device-to-device
//! copies.
//!
//! Issues operations back to back, keeping at most --depth in flight (one event per operation;
//! when --depth are queued it waits for the oldest), for --duration. `--op kernel` (default)
//! launches kernels of --kernel-ms; `--op blocks` kernels of --kernel-ms made of waves of
//! blocks that each spin --wave (a kernel slicing can cut into block ranges); `--op memset` issues one `cuMemsetD8Async` of a --bytes
//! buffer, `--op copy` one `cuMemcpyDtoDAsync` between two --bytes buffers. A memset's or copy's
//! GPU time is not known in advance: each is bracketed by a pair of timed events and its
//! `cuEventElapsedTime` is added to `gpu_ms` (a kernel's `gpu_ms` is --kernel-ms). The span
//! is the operation's own only if the stream had not yet reached the start event when the call
//! returned (`cuEventQuery`): otherwise the stream idled in between, while the call was held
//! (a sharing layer's gate) or the host was late, and the operation counts at the mean of the
//! timed ones (`untimed` in the lines).

use clap::{Parser, ValueEnum};
use jobs::cli::{self, CommonArgs};
use jobs::gpu::{DeviceBuffer, Event, Gpu};
use jobs::report::Reporter;
use jobs::stats::{round3, RateWindow};
use serde_json::json;
use std::collections::VecDeque;
use std::process::ExitCode;
use std::time::Duration;

const JOB: &str = "simjob-saturate";

/// What each operation is.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    /// A spin kernel of --kernel-ms.
    Kernel,
    /// A kernel of --kernel-ms made of waves of blocks that each spin --wave.
    Blocks,
    /// `cuMemsetD8Async` of a --bytes buffer.
    Memset,
    /// `cuMemcpyDtoDAsync` of --bytes from one device buffer to another.
    Copy,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Kernel => "kernel",
            Op::Blocks => "blocks",
            Op::Memset => "memset",
            Op::Copy => "copy",
        }
    }
}

/// A GPU-saturating CUDA job: back-to-back kernels, memsets or device-to-device copies with at
/// most --depth in flight.
///
/// Prints JSON lines on stdout: a start line, progress every --report-interval, and a final
/// summary ("final": true) with operations/s and GPU-ms/s achieved (`gpu_ms`: cumulative GPU
/// time, kernels × --kernel-ms, or the measured event spans of memsets and copies).
/// SIGTERM/SIGINT stop it early, still with the final line.
#[derive(Parser, Debug)]
#[command(name = JOB, version, about, long_about)]
struct Args {
    /// What each operation is.
    #[arg(long, value_enum, default_value = "kernel")]
    op: Op,

    /// GPU time of each kernel, in milliseconds (`--op kernel|blocks`).
    #[arg(long, value_name = "MS", default_value = "2", value_parser = cli::parse_ms)]
    kernel_ms: f64,

    /// Bytes each memset sets or each copy moves (`--op memset|copy`).
    #[arg(long, value_name = "SIZE", default_value = "2MiB", value_parser = parse_bytes)]
    bytes: u64,

    /// What one wave of blocks spins (`--op blocks`): simgpu's `SIMGPU_WAVE` (its default 10us),
    /// so that simgpu and a GPU time the kernel alike.
    #[arg(long, value_name = "DURATION", default_value = "10us", value_parser = cli::parse_duration)]
    wave: Duration,

    /// Maximum number of operations in flight.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    depth: u32,

    /// How long to keep launching.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = cli::parse_duration)]
    duration: Duration,

    #[command(flatten)]
    common: CommonArgs,
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    match cli::parse_size(s)? {
        0 => Err("must be at least 1 byte".into()),
        n => Ok(n),
    }
}

fn main() -> ExitCode {
    jobs::run::main_with(JOB, || run(Args::parse()))
}

/// One operation's events: `end` after it, and `start` before it when it is timed;
/// `exact`: the stream had not reached `start` when the call returned.
struct Slot<'g> {
    start: Option<Event<'g>>,
    end: Event<'g>,
    exact: bool,
}

/// The operation's buffers (`--op memset`: `a`; `--op copy`: `a` to `b`).
struct Buffers<'g> {
    a: DeviceBuffer<'g>,
    b: Option<DeviceBuffer<'g>>,
}

/// Completed operations: the timed ones' GPU milliseconds and count, and the untimed count.
#[derive(Default)]
struct Tally {
    timed_ms: f64,
    timed_n: u64,
    untimed: u64,
}

impl Tally {
    fn add(&mut self, slot: &Slot<'_>, kernel_ms: f64) -> anyhow::Result<()> {
        match (&slot.start, slot.exact) {
            (Some(start), true) => {
                self.timed_ms += slot.end.elapsed_ms(start)?;
                self.timed_n += 1;
            }
            (None, _) => {
                self.timed_ms += kernel_ms;
                self.timed_n += 1;
            }
            (Some(_), false) => self.untimed += 1,
        }
        Ok(())
    }

    /// GPU time so far: the untimed operations at the timed ones' mean.
    fn gpu_ms(&self) -> f64 {
        self.timed_ms + self.untimed as f64 * self.timed_ms / self.timed_n.max(1) as f64
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    let gpu = Gpu::open(args.common.device)?;
    let ns = (args.kernel_ms * 1e6).round() as u64;
    let wave_ns = (args.wave.as_nanos() as u64).max(1);
    // Waves of resident blocks that make --kernel-ms, and the blocks of that many waves.
    let blocks = (ns.div_ceil(wave_ns).max(1)
        * u64::from(gpu.sm_count()? * jobs::BLOCK_SPIN_PER_SM))
    .min(u64::from(i32::MAX as u32)) as u32;
    let timed = !matches!(args.op, Op::Kernel | Op::Blocks);
    let bufs = if timed {
        let a = gpu.alloc(args.bytes, false)?;
        let b = if args.op == Op::Copy {
            Some(gpu.alloc(args.bytes, false)?)
        } else {
            None
        };
        // First touch outside the measured loop.
        gpu.memset(&a, 0)?;
        if let Some(b) = &b {
            gpu.memset(b, 0)?;
        }
        gpu.sync()?;
        Some(Buffers { a, b })
    } else {
        None
    };
    let mut free: Vec<Slot<'_>> = (0..args.depth)
        .map(|_| -> anyhow::Result<Slot<'_>> {
            Ok(if timed {
                Slot {
                    start: Some(gpu.timed_event()?),
                    end: gpu.timed_event()?,
                    exact: false,
                }
            } else {
                Slot {
                    start: None,
                    end: gpu.event()?,
                    exact: true,
                }
            })
        })
        .collect::<Result<_, _>>()?;
    let mut in_flight: VecDeque<Slot<'_>> = VecDeque::with_capacity(args.depth as usize);
    let mut tally = Tally::default();
    let mut rep = Reporter::new(JOB, args.common.report_interval);
    let mut config = json!({
        "device": gpu.info.to_json(),
        "op": args.op.name(),
        "depth": args.depth,
        "duration_s": args.duration.as_secs_f64(),
    });
    if timed {
        config["bytes"] = args.bytes.into();
    } else {
        config["kernel_ms"] = args.kernel_ms.into();
    }
    if args.op == Op::Blocks {
        config["blocks"] = blocks.into();
        config["wave_us"] = (wave_ns as f64 / 1e3).into();
    }
    rep.started(config.clone());
    let start = rep.start();
    let mut window = RateWindow::new(0.0, 0);
    let mut launched: u64 = 0;
    let mut completed: u64 = 0;
    let counts = |completed: u64, gpu_ms: f64, untimed: u64, ops_per_s: f64, gpu_ms_per_s: f64| {
        let mut m = json!({
            "ops": completed,
            "untimed": untimed,
            "ops_per_s": round3(ops_per_s),
            "gpu_ms": round3(gpu_ms),
            "gpu_ms_per_s": round3(gpu_ms_per_s),
        });
        if !timed {
            m["kernels"] = completed.into();
            m["kernels_per_s"] = round3(ops_per_s).into();
        }
        m
    };
    let mut last = (0.0, 0.0);
    while start.elapsed() < args.duration && !jobs::run::stop_requested() {
        if let Some(mut slot) = free.pop() {
            if let Some(s) = &slot.start {
                s.record()?;
            }
            match (args.op, &bufs) {
                (Op::Memset, Some(b)) => gpu.memset(&b.a, 0xA5)?,
                (Op::Copy, Some(Buffers { a, b: Some(b) })) => gpu.copy_on_device(b, a)?,
                (Op::Blocks, _) => gpu.block_spin(wave_ns, blocks)?,
                _ => gpu.spin(ns)?,
            }
            if let Some(s) = &slot.start {
                slot.exact = !s.done()?;
            }
            slot.end.record()?;
            in_flight.push_back(slot);
            launched += 1;
            continue;
        }
        let oldest = in_flight.pop_front().expect("depth >= 1");
        oldest.end.synchronize()?;
        tally.add(&oldest, args.kernel_ms)?;
        completed += 1;
        free.push(oldest);

        if rep.due() {
            let t = rep.t();
            let ops = window.tick(t, completed);
            let gpu_ms = tally.gpu_ms();
            let per_s = if t > last.0 {
                (gpu_ms - last.1) / (t - last.0)
            } else {
                0.0
            };
            last = (t, gpu_ms);
            rep.progress(counts(completed, gpu_ms, tally.untimed, ops, per_s));
        }
    }
    // Drain what is still queued so every launched operation is accounted for.
    gpu.sync()?;
    for slot in &in_flight {
        tally.add(slot, args.kernel_ms)?;
        completed += 1;
    }
    let gpu_ms = tally.gpu_ms();
    let elapsed = start.elapsed().as_secs_f64();
    let per_s = |x: f64| if elapsed > 0.0 { x / elapsed } else { 0.0 };
    let mut fin = counts(
        completed,
        gpu_ms,
        tally.untimed,
        per_s(completed as f64),
        per_s(gpu_ms),
    );
    fin["launched"] = launched.into();
    fin["elapsed_s"] = round3(elapsed).into();
    if timed && tally.timed_n > 0 {
        fin["op_ms_mean"] = round3(tally.timed_ms / tally.timed_n as f64).into();
    }
    for (k, v) in config.as_object().expect("an object") {
        fin[k] = v.clone();
    }
    rep.finish(fin);
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
        assert_eq!(a.op, Op::Kernel);
        let a = Args::try_parse_from([JOB, "--op", "copy", "--bytes", "1MiB"]).unwrap();
        assert_eq!((a.op, a.bytes), (Op::Copy, 1 << 20));
        assert!(Args::try_parse_from([JOB, "--op", "memset", "--bytes", "0"]).is_err());
        assert!(Args::try_parse_from([JOB, "--op", "fill"]).is_err());
    }
}
