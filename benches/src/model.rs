//! The simulated GPU's own model (issue 2, must-show 4 and 5): kernel occupancy, fair sharing
//! between processes, native co-location, and thrashing of oversubscribed managed memory.
//! Every figure is a ratio against a baseline measured in the same run.

use crate::{finish, job, median, num, run_job};
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
    let train = [
        "--gpu-ms",
        "6",
        "--kernels",
        "4",
        "--cpu-ms",
        "4",
        "--mem",
        "256MiB",
        "--duration",
        d.as_str(),
    ];
    let sim = SimGpu::new();
    let (solo, _) = run_job(&sim, "simjob-train", &train);
    let solo = num(&solo, "iters_per_s");
    let sat_d = format!("{}s", secs + 1.0);
    let sat = job(
        &sim,
        "simjob-saturate",
        &["--kernel-ms", "2", "--depth", "4", "--duration", &sat_d],
    )
    .spawn()
    .expect("spawn");
    let (co, _) = run_job(&sim, "simjob-train", &train);
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
