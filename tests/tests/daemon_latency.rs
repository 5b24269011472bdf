//! Issue 31, production's tail without prediction, on simgpu with the shim and a real
//! `sharectl daemon`:
//! - opportunistic processes that start while production runs are gated from their first
//!   launch: six saturating processes (2 ms kernels, 4 deep) started at once in a new
//!   container never have more than the latency budget and about one kernel in flight
//!   together, and production's requests meanwhile stay near their latency alone (before, the
//!   new container ran on the open word of its fresh state until the daemon's next rescan:
//!   6 × 4 × 2 ms queued, a 52 ms request);
//! - `--latency-budget` refuses 0, 100 % and garbage in one line.
//!
//! The observables are the containers' shared words (`libshare_abi::State`) and the production
//! job's own per-request trace; simgpu's own state is not used.

use libshare_tests::{artifacts, describe, Daemon, SimGpu};
use std::sync::atomic::Ordering::Acquire;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MS: u64 = 1_000_000;

/// Production inference: 40 requests/s of 4 ms of GPU time in 2 kernels, one trace line each.
fn infer(gpu: &SimGpu, secs: f64) -> libshare_tests::Running {
    let mut cmd = gpu.command(artifacts().bin("simjob-infer"));
    cmd.args(["--rate", "40", "--gpu-ms", "4", "--kernels", "2", "--trace"])
        .args(["--duration", &format!("{secs}s")])
        .env("LIBSHARE_CONTAINER", "prod")
        .env("LIBSHARE_CLASS", "production");
    gpu.spawn(cmd)
}

fn saturate(gpu: &SimGpu, secs: f64) -> libshare_tests::Running {
    let mut cmd = gpu.command(artifacts().bin("simjob-saturate"));
    cmd.args(["--kernel-ms", "2", "--depth", "4"])
        .args(["--duration", &format!("{secs}s")])
        .env("LIBSHARE_CONTAINER", "late")
        .env("LIBSHARE_CLASS", "opportunistic");
    gpu.spawn(cmd)
}

/// (due time in s since the job's start, latency ms) of each request in a `--trace` output.
fn requests(stdout: &[u8]) -> Vec<(f64, f64)> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["event"] == "request")
        .filter_map(|v| Some((v["t"].as_f64()?, v["latency_ms"].as_f64()?)))
        .collect()
}

fn percentile(mut xs: Vec<f64>, p: f64) -> f64 {
    assert!(!xs.is_empty(), "no requests");
    xs.sort_by(f64::total_cmp);
    xs[((xs.len() - 1) as f64 * p / 100.0).round() as usize]
}

#[test]
fn daemon_gates_opportunistic_processes_from_their_first_launch() {
    let gpu = SimGpu::new().with_shim();
    let _daemon = Daemon::start(&gpu.shim_state_dir(), &["--latency-budget", "2ms"]);
    let t0 = Instant::now();
    let prod = infer(&gpu, 6.0);
    let prod_state = gpu.wait_container_state("prod");
    libshare_tests::until(Duration::from_secs(20), || {
        prod_state.device(0).launches.load(Acquire) > 40
    })
    .expect("production's first requests");
    // Production alone for a while (its baseline in this run), then six processes at once.
    std::thread::sleep(Duration::from_millis(1_500));
    let started = t0.elapsed().as_secs_f64();
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (stop, dir) = (stop.clone(), gpu.shim_state_dir());
        std::thread::spawn(move || {
            let path = dir.join("containers/late").join(libshare_abi::STATE_FILE);
            let st = loop {
                if let Ok(st) = libshare_abi::State::open_existing(&path) {
                    break st;
                }
                assert!(!stop.load(Relaxed), "the new container never registered");
                std::thread::sleep(Duration::from_micros(50));
            };
            let d = st.device(0);
            let mut max = 0;
            while !stop.load(Relaxed) {
                max = max.max(d.in_flight_ns.load(Acquire));
                std::thread::sleep(Duration::from_micros(100));
            }
            (max, d.gpu_ns.load(Acquire))
        })
    };
    let late: Vec<_> = (0..6).map(|_| saturate(&gpu, 2.5)).collect();
    for j in late {
        let out = j.finish();
        assert!(out.status.success(), "{}", describe(&out));
    }
    stop.store(true, Relaxed);
    let (in_flight_max, late_gpu_ns) = sampler.join().unwrap();
    let out = prod.finish();
    assert!(out.status.success(), "{}", describe(&out));
    let reqs = requests(&out.stdout);
    // The job's clock starts after its own start-up: its requests due before `started` (as
    // the test measured from the spawn) ran alone.
    let alone: Vec<f64> = reqs
        .iter()
        .filter(|(t, _)| *t > 0.5 && *t < started - 0.5)
        .map(|r| r.1)
        .collect();
    let beside: Vec<f64> = reqs
        .iter()
        .filter(|(t, _)| *t >= started - 0.5)
        .map(|r| r.1)
        .collect();
    let (alone_p50, beside_max) = (percentile(alone, 50.0), percentile(beside.clone(), 100.0));
    println!(
        "six opportunistic processes started at once beside production: at most {:.1} ms in \
         flight together, production's worst request {beside_max:.1} ms ({} requests; \
         alone p50 {alone_p50:.1} ms), the new container ran {:.0} ms on the GPU",
        in_flight_max as f64 / 1e6,
        beside.len(),
        late_gpu_ns as f64 / 1e6
    );
    // The budget (2 ms) and one kernel priced at the bound, twice that for a loaded machine;
    // six processes queueing freely held 6 × 4 kernels (24 ms at 1 ms each before timing).
    assert!(
        in_flight_max <= 2 * (2 * MS + 2 * MS),
        "the new container had {in_flight_max} ns in flight at once"
    );
    assert!(late_gpu_ns > 50 * MS, "the opportunistic processes ran");
    // Generous: a request that meets one 2 ms kernel and the host's load; 52 ms before.
    assert!(
        beside_max <= 4.0 * alone_p50,
        "production's worst request beside the start was {beside_max:.1} ms, alone p50 {alone_p50:.1} ms"
    );
}

#[test]
fn daemon_refuses_a_latency_budget_that_cannot_be_one() {
    for (arg, why) in [
        ("0ms", "would never let opportunistic work run"),
        ("100%", "is no budget"),
        ("soon", "is not a latency budget"),
    ] {
        let out = std::process::Command::new(artifacts().bin("sharectl"))
            .args([
                "daemon",
                "--latency-budget",
                arg,
                "--state-dir",
                "/nonexistent",
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{arg}: {err}");
        assert!(err.contains(why), "{arg}: {err}");
        let lines: Vec<_> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert!(lines.len() <= 3, "{arg}: short: {err}");
    }
}
