//! Issue 9, must-show 6: two ordinary PyTorch training loops (`tests/python/torch_train_loop.py`)
//! on one simulated GPU, one as a production container and one as an opportunistic container,
//! under the shim and `sharectl daemon`: production keeps ≥ 0.95 of its solo iterations/s
//! (measured in the same test) while the opportunistic loop still progresses.
//!
//! `SIMGPU_WAVE=1ms` makes the jobs GPU-bound as on a real GPU (simgpu's default cost model
//! runs a GEMM ~100× faster than an A100, which would leave PyTorch CPU-bound). It is 1 ms, not
//! 200 µs, because this machine has two cores for both Python processes and simgpu's engine
//! threads: at 200 µs a CPU-only busy loop beside the production loop costs it ~30 % of its
//! rate (measured: 167 → 118 it/s), so the test would measure CPU contention, not GPU sharing;
//! at 1 ms the same busy loop costs nothing (41.3 → 41.4 it/s). On a node each container has
//! its own cores. Both loops measure the same wall-clock interval (they warm up until an agreed
//! start time).

use libshare_tests::{describe, python_source, shim_lib, torch_python, Daemon, SimGpu};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Seconds each loop is measured.
const MEASURE: f64 = 8.0;
/// Time for the processes to import torch and set up (both at once on two cores).
const SETUP: f64 = 40.0;

fn machine(state: &Path) -> SimGpu {
    SimGpu::new()
        .memory("8GiB")
        .env("SIMGPU_WAVE", "1ms")
        .env("LD_PRELOAD", shim_lib())
        .env("LIBSHARE_STATE_DIR", state)
        .timeout(Duration::from_secs(300))
}

fn start_loop(gpu: &SimGpu, container: &str, class: &str, start_at: f64) -> Child {
    let mut cmd = gpu.command(torch_python());
    cmd.arg(python_source("torch_train_loop.py"))
        .arg(MEASURE.to_string())
        .arg(start_at.to_string())
        .env("LIBSHARE_CONTAINER", container)
        .env("LIBSHARE_CLASS", class)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.spawn().expect("start python")
}

/// The loop's final line: iterations per second over the agreed interval. `on_time`: the loop
/// must have started measuring at the agreed time (the opportunistic loop may be late: its set-up
/// launches are gated too, and it competes while it sets up).
fn rate(child: Child, what: &str, on_time: bool) -> f64 {
    let out = child.wait_with_output().expect("wait python");
    assert!(out.status.success(), "{what}: {}", describe(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    let done: serde_json::Value = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .find(|v: &serde_json::Value| v["done"] == true)
        .unwrap_or_else(|| panic!("{what}: no final line\n{}", describe(&out)));
    let late = done["late_s"].as_f64().unwrap_or(0.0);
    assert!(
        !on_time || late < 1.0,
        "{what} reached the agreed start {late:.1} s late: raise SETUP\n{done}"
    );
    done["iters_per_s"].as_f64().unwrap()
}

fn epoch_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[test]
fn production_pytorch_keeps_its_rate_beside_an_opportunistic_one() {
    if !torch_python().exists() {
        libshare_tests::skip(&format!(
            "no PyTorch venv at {} (scripts/fetch-cuda.sh installs it)",
            torch_python().display()
        ));
        return;
    }
    let state = tempfile::tempdir().unwrap();
    let gpu = machine(state.path());
    let _daemon = Daemon::start(state.path(), &[]);

    // Solo: production alone under the shim and the daemon.
    let solo = start_loop(&gpu, "prod", "production", epoch_now() + SETUP / 2.0);
    let solo = rate(solo, "solo production", true);

    // Together: the same production loop beside an opportunistic one.
    let at = epoch_now() + SETUP;
    let prod = start_loop(&gpu, "prod", "production", at);
    let opp = start_loop(&gpu, "batch", "opportunistic", at);
    let (prod, opp) = (
        rate(prod, "production", true),
        rate(opp, "opportunistic", false),
    );
    let ratio = prod / solo;
    println!("solo {solo:.1} it/s; shared: production {prod:.1} it/s ({ratio:.3} of solo), opportunistic {opp:.1} it/s");
    assert!(
        ratio >= 0.95,
        "production at {ratio:.3} of solo ({prod:.1} / {solo:.1} it/s)"
    );
    assert!(opp > 0.0, "the opportunistic loop made no progress");
}
