//! The simulated GPU's own model (issue 2, must-show 4 and 5): kernel occupancy, fair sharing
//! between processes, native co-location, and thrashing of oversubscribed managed memory.
//! Every figure is a ratio against a baseline measured in the same run.

use crate::{finish, job, median, num, run_job};
use jobs::profiles::{Train, TRAIN};
use libshare_tests::SimGpu;
use serde_json::{json, Value};
use std::time::Instant;

/// Device time one 1 ms kernel occupies, from the throughput of a saturating job
/// (4 kernels in flight, so the device never idles): 1000 ms / kernels per second. Also the
/// modelled device time per kernel simgpu accounted (busy time / kernels, from its per-process
/// counters): what the timeline reserved, whatever the host's load did to the throughput.
pub fn kernel_occupancy(runs: usize, secs: f64) -> Value {
    let d = format!("{secs}s");
    let (per_kernel, modelled): (Vec<f64>, Vec<f64>) = (0..runs)
        .map(|_| {
            let sim = SimGpu::new().with_stats();
            let (v, _) = run_job(
                &sim,
                "simjob-saturate",
                &["--kernel-ms", "1", "--depth", "4", "--duration", &d],
            );
            let (busy, kernels) = sim.stats().iter().fold((0.0, 0.0), |(b, k), p| {
                let dev = &p["devices"][0];
                (b + num(dev, "busy_ns"), k + num(dev, "kernels"))
            });
            (
                1000.0 / num(&v, "kernels_per_s"),
                busy / kernels.max(1.0) / 1e6,
            )
        })
        .unzip();
    json!({
        "scenario": "kernel_occupancy", "kernel_ms": 1.0, "median_ms": median(per_kernel.clone()),
        "runs_ms": per_kernel, "modelled_ms": median(modelled),
    })
}

/// Two saturating processes on one device: each one's share of the solo throughput.
pub fn two_saturating(secs: f64) -> Value {
    let d = format!("{secs}s");
    let args = ["--kernel-ms", "1", "--depth", "4", "--duration", d.as_str()];
    let sim = SimGpu::new();
    let (solo, _) = run_job(&sim, "simjob-saturate", &args);
    let solo = num(&solo, "kernels_per_s");
    let a = job(&sim, "simjob-saturate", &args).spawn().expect("spawn");
    let b = job(&sim, "simjob-saturate", &args).spawn().expect("spawn");
    let (a, b) = (finish(a, "saturate A"), finish(b, "saturate B"));
    let (sa, sb) = (
        num(&a, "kernels_per_s") / solo,
        num(&b, "kernels_per_s") / solo,
    );
    // Fractions of the device's time each ran kernels (1 ms kernels): independent of how fast
    // the solo run managed to feed the device on a loaded host.
    let (da, db) = (
        num(&a, "gpu_ms_per_s") / 1000.0,
        num(&b, "gpu_ms_per_s") / 1000.0,
    );
    json!({
        "scenario": "two_saturating", "solo_kernels_per_s": solo, "share_a": sa, "share_b": sb,
        "total": sa + sb, "device_share_a": da, "device_share_b": db, "device_total": da + db,
    })
}

/// A training-like job (6 ms GPU + 4 ms CPU per iteration, ~60 % of the GPU) alone, then with a
/// saturating job beside it, natively co-located (no libshare).
pub fn train_colocation(secs: f64) -> Value {
    let d = format!("{secs}s");
    let mut args = TRAIN.args();
    args.extend(["--duration".into(), d]);
    let train: Vec<&str> = args.iter().map(String::as_str).collect();
    let sim = SimGpu::new();
    let (solo, _) = run_job(&sim, Train::BIN, &train);
    let solo = num(&solo, "iters_per_s");
    let sat_d = format!("{}s", secs + 1.0);
    let sat = job(
        &sim,
        "simjob-saturate",
        &["--kernel-ms", "2", "--depth", "4", "--duration", &sat_d],
    )
    .spawn()
    .expect("spawn");
    let (co, _) = run_job(&sim, Train::BIN, &train);
    let sat = finish(sat, "saturate");
    let co = num(&co, "iters_per_s");
    json!({
        "scenario": "train_colocation", "solo_iters_per_s": solo, "colocated_iters_per_s": co,
        "ratio": co / solo, "opportunistic_gpu_ms_per_s": num(&sat, "gpu_ms_per_s"),
    })
}

/// Two jobs whose managed working sets are each 70 % of a 256 MiB device: their training loops
/// (the jobs' own `elapsed_s`, so host-side setup does not count) run one after the other against
/// run together.
pub fn managed_thrash(iters: u32) -> Value {
    let it = iters.to_string();
    let args = [
        "--managed",
        "--mem",
        "180MiB",
        "--iters",
        it.as_str(),
        "--gpu-ms",
        "5",
        "--kernels",
        "1",
        "--cpu-ms",
        "0",
    ];
    let sim = SimGpu::new().memory("256MiB");
    let (a, _) = run_job(&sim, "simjob-train", &args);
    let (b, _) = run_job(&sim, "simjob-train", &args);
    let serial = num(&a, "elapsed_s") + num(&b, "elapsed_s");
    // Together: the span from the first loop's start to the last loop's end. A job's `t` counts
    // from its own start, so each loop's start/end is placed on the spawn clock.
    let t0 = Instant::now();
    let ja = job(&sim, "simjob-train", &args).spawn().expect("spawn");
    let sa = t0.elapsed().as_secs_f64();
    let jb = job(&sim, "simjob-train", &args).spawn().expect("spawn");
    let sb = t0.elapsed().as_secs_f64();
    let (a, b) = (finish(ja, "managed A"), finish(jb, "managed B"));
    let span = |spawn: f64, v: &Value| {
        (
            spawn + num(v, "t") - num(v, "elapsed_s"),
            spawn + num(v, "t"),
        )
    };
    let ((a0, a1), (b0, b1)) = (span(sa, &a), span(sb, &b));
    let together = a1.max(b1) - a0.min(b0);
    json!({
        "scenario": "managed_thrash", "device": "256MiB", "working_set_each": "180MiB (70 %)",
        "serial_s": serial, "together_s": together, "slowdown": together / serial,
    })
}

/// Oversubscription alone: a managed working set of 150 % of the device runs (no OOM) and pays
/// migration time against the same job with 50 %.
pub fn managed_oversubscribed(iters: u32) -> Value {
    let it = iters.to_string();
    let run = |mem: &str| {
        let sim = SimGpu::new().memory("1GiB");
        let args = [
            "--managed",
            "--mem",
            mem,
            "--iters",
            it.as_str(),
            "--gpu-ms",
            "5",
            "--kernels",
            "1",
            "--cpu-ms",
            "0",
        ];
        let (v, _) = run_job(&sim, "simjob-train", &args);
        num(&v, "elapsed_s")
    };
    let (fits, over) = (run("512MiB"), run("1536MiB"));
    json!({ "scenario": "managed_oversubscribed", "fits_s": fits, "oversubscribed_s": over, "slowdown": over / fits })
}

/// One kernel of simgpu's kernel trace (`SIMGPU_KERNEL_TRACE`): its process, when it became
/// ready, and the intervals it ran in (ns, CLOCK_MONOTONIC).
pub struct TracedKernel {
    pub pid: u64,
    pub ready: u64,
    pub slices: Vec<(u64, u64)>,
}

impl TracedKernel {
    /// Completion latency: from ready to the end of its last slice, ms.
    pub fn latency_ms(&self) -> f64 {
        self.slices
            .last()
            .map_or(f64::NAN, |s| (s.1 - self.ready) as f64 / 1e6)
    }
}

/// Where a scenario's kernel trace goes.
fn traced(sim: SimGpu) -> (SimGpu, std::path::PathBuf) {
    let path = sim.state_dir().join("kernels.jsonl");
    (sim.env("SIMGPU_KERNEL_TRACE", &path), path)
}

pub fn read_trace(path: &std::path::Path) -> Vec<TracedKernel> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        // Kernels only: copies and other compute operations carry an "op".
        .filter(|v| v.get("op").is_none())
        .map(|v| TracedKernel {
            pid: v["pid"].as_u64().unwrap_or(0),
            ready: v["ready"].as_u64().unwrap_or(0),
            slices: v["slices"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|s| (s[0].as_u64().unwrap_or(0), s[1].as_u64().unwrap_or(0)))
                        .collect()
                })
                .unwrap_or_default(),
        })
        .collect()
}

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
    v[rank.min(v.len()) - 1]
}

/// Two processes issuing 0.1 ms kernels back to back: how long each keeps the device before the
/// other gets it (runs of consecutive slices of one process, from the kernel trace, while both
/// run). A GPU without MPS time-slices: runs of about one slice, not strict alternation (one
/// kernel per run). 32 kernels in flight (3.2 ms of work) keep each queue from draining while a
/// loaded host is slow to see completions and launch more; a drained queue yields the device
/// at once, as it should.
pub fn slice_runs(secs: f64) -> Value {
    let (sim, path) = traced(SimGpu::new());
    let d = format!("{secs}s");
    let args = [
        "--kernel-ms",
        "0.1",
        "--depth",
        "32",
        "--duration",
        d.as_str(),
    ];
    let a = job(&sim, "simjob-saturate", &args).spawn().expect("spawn");
    let b = job(&sim, "simjob-saturate", &args).spawn().expect("spawn");
    finish(a, "saturate A");
    finish(b, "saturate B");
    let mut slices: Vec<(u64, u64, u64)> = read_trace(&path)
        .iter()
        .flat_map(|k| k.slices.iter().map(|s| (s.0, s.1, k.pid)))
        .collect();
    slices.sort();
    let pids: std::collections::BTreeSet<u64> = slices.iter().map(|s| s.2).collect();
    // The window in which both had started and neither had finished.
    let from = pids
        .iter()
        .map(|p| slices.iter().find(|s| s.2 == *p).map_or(0, |s| s.0))
        .max()
        .unwrap_or(0);
    let to = pids
        .iter()
        .map(|p| slices.iter().rev().find(|s| s.2 == *p).map_or(0, |s| s.1))
        .min()
        .unwrap_or(0);
    let overlaps = slices.windows(2).filter(|w| w[1].0 < w[0].1).count();
    let mut runs: Vec<(u64, u64, u64, usize)> = Vec::new(); // (start, end, pid, slices)
    for &(a, b, pid) in slices.iter().filter(|s| s.0 >= from && s.1 <= to) {
        match runs.last_mut() {
            Some(r) if r.2 == pid => {
                r.1 = b;
                r.3 += 1;
            }
            _ => runs.push((a, b, pid, 1)),
        }
    }
    // The first and last runs are cut by the window.
    let inner = if runs.len() > 2 {
        &runs[1..runs.len() - 1]
    } else {
        &runs[..]
    };
    let lens: Vec<f64> = inner.iter().map(|r| (r.1 - r.0) as f64 / 1e6).collect();
    let kernels: Vec<f64> = inner.iter().map(|r| r.3 as f64).collect();
    let single = inner.iter().filter(|r| r.3 == 1).count() as f64 / inner.len().max(1) as f64;
    json!({
        "scenario": "slice_runs", "kernel_ms": 0.1, "depth": 32, "timeslice_ms": 2.0, "processes": pids.len(),
        "runs": inner.len(), "median_run_ms": median(lens.clone()),
        "p90_run_ms": percentile(lens, 90.0), "median_slices_per_run": median(kernels),
        "single_slice_runs": single, "overlaps": overlaps,
    })
}

/// Starts the short-kernel process of `short_beside_long` and `kill_holder`: one request of one
/// 0.1 ms kernel every 10 ms (4-byte copies) for `d`.
fn short_kernels(sim: &SimGpu, d: &str) -> std::process::Child {
    job(
        sim,
        "simjob-infer",
        &[
            "--rate",
            "100",
            "--gpu-ms",
            "0.1",
            "--kernels",
            "1",
            "--input",
            "4B",
            "--output",
            "4B",
            "--duration",
            d,
        ],
    )
    .spawn()
    .expect("spawn")
}

/// A process running 50 ms kernels beside one issuing one 0.1 ms kernel every 10 ms: the short
/// kernel's completion latency (modelled, from the kernel trace: ready to end), which a time-
/// sliced GPU bounds by slice + switch + 0.1 ms. `timeslice` sets `SIMGPU_TIMESLICE`.
pub fn short_beside_long(timeslice: &str, secs: f64) -> Value {
    let (sim, path) = traced(SimGpu::new().env("SIMGPU_TIMESLICE", timeslice));
    let long_d = format!("{}s", secs + 0.5);
    let long = job(
        &sim,
        "simjob-saturate",
        &["--kernel-ms", "50", "--depth", "2", "--duration", &long_d],
    )
    .spawn()
    .expect("spawn");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let d = format!("{secs}s");
    let short = short_kernels(&sim, &d);
    let short_pid = short.id() as u64;
    let short = finish(short, "0.1 ms kernels");
    let long = finish(long, "50 ms kernels");
    let lat: Vec<f64> = read_trace(&path)
        .iter()
        .filter(|k| k.pid == short_pid)
        .map(|k| k.latency_ms())
        .collect();
    json!({
        "scenario": "short_beside_long", "timeslice": timeslice, "kernels": lat.len(),
        "p50_ms": percentile(lat.clone(), 50.0), "p99_ms": percentile(lat.clone(), 99.0),
        "max_ms": percentile(lat, 100.0), "host_p99_ms": num(&short, "p99_ms"),
        "long_gpu_ms_per_s": num(&long, "gpu_ms_per_s"),
    })
}

/// The same two processes; the one with 50 ms kernels (which holds the device nearly all the
/// time) is killed with SIGKILL after `kill_after` seconds. The short kernels' latencies over
/// the whole run, and after the kill, show whether the dead process stalled the device.
pub fn kill_holder(secs: f64, kill_after: f64) -> Value {
    let (sim, path) = traced(SimGpu::new());
    let mut long = job(
        &sim,
        "simjob-saturate",
        &["--kernel-ms", "50", "--depth", "2", "--duration", "60s"],
    )
    .spawn()
    .expect("spawn");
    let long_pid = long.id() as u64;
    let d = format!("{secs}s");
    let short = short_kernels(&sim, &d);
    std::thread::sleep(std::time::Duration::from_secs_f64(kill_after));
    long.kill().expect("kill -9");
    let _ = long.wait();
    let short = finish(short, "short kernels");
    let trace = read_trace(&path);
    // The long job's last completed kernel: it died within a kernel or two after it.
    let last_long = trace
        .iter()
        .filter(|k| k.pid == long_pid)
        .filter_map(|k| k.slices.last().map(|s| s.1))
        .max()
        .unwrap_or(0);
    let short_k: Vec<&TracedKernel> = trace.iter().filter(|k| k.pid != long_pid).collect();
    let all: Vec<f64> = short_k.iter().map(|k| k.latency_ms()).collect();
    let after: Vec<f64> = short_k
        .iter()
        .filter(|k| k.ready > last_long + 200_000_000)
        .map(|k| k.latency_ms())
        .collect();
    json!({
        "scenario": "kill_holder", "long_kernels_completed": trace.iter().filter(|k| k.pid == long_pid).count(),
        "short_kernels": all.len(), "short_after_kill": after.len(),
        "max_ms": percentile(all, 100.0), "max_after_kill_ms": percentile(after, 100.0),
        "requests": num(&short, "requests"), "achieved_rate": num(&short, "achieved_rate"),
    })
}
