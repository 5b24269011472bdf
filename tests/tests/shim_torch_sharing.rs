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
    start_loop_with(gpu, container, class, start_at, &[], &[])
}

/// [`start_loop`] with more of the script's arguments (WIDTH BATCH HOLD_BYTES) and variables.
fn start_loop_with(
    gpu: &SimGpu,
    container: &str,
    class: &str,
    start_at: f64,
    more: &[&str],
    env: &[(&str, &str)],
) -> Child {
    let mut cmd = gpu.command(torch_python());
    cmd.arg(python_source("torch_train_loop.py"))
        .arg(MEASURE.to_string())
        .arg(start_at.to_string())
        .args(more)
        .envs(env.iter().copied())
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
    final_line(child, what, on_time)["iters_per_s"]
        .as_f64()
        .unwrap()
}

/// The loop's final line (see [`rate`]).
fn final_line(child: Child, what: &str, on_time: bool) -> serde_json::Value {
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
    done
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

#[test]
fn production_pytorch_keeps_its_rate_beside_an_oversubscribing_one() {
    // Issue 20, must-show 4: the opportunistic loop first fills 1.25 × a 1 GiB device (20
    // tensors of 64 MiB: managed memory, its container may oversubscribe up to 4 GiB), then
    // trains beside them; production starts after the fill, so its allocations need what the
    // opportunistic job holds resident (the demotion protocol). Production keeps ≥ 0.95 of its
    // solo rate, the opportunistic loop trains (no OOM) and every held tensor reads back.
    if !torch_python().exists() {
        libshare_tests::skip(&format!(
            "no PyTorch venv at {} (scripts/fetch-cuda.sh installs it)",
            torch_python().display()
        ));
        return;
    }
    let state = tempfile::tempdir().unwrap();
    let gpu = machine(state.path()).memory("1GiB");
    let _daemon = Daemon::start(state.path(), &[]);
    let solo = start_loop(&gpu, "prod", "production", epoch_now() + SETUP / 2.0);
    let solo = rate(solo, "solo production", true);

    let at = epoch_now() + SETUP;
    let hold = (1280u64 << 20).to_string();
    let mut opp = start_loop_with(
        &gpu,
        "batch",
        "opportunistic",
        at,
        &["1024", "256", &hold],
        &[
            ("CUDA_OVERSUBSCRIBE", "true"),
            ("LIBSHARE_MEMORY_LIMIT", "4GiB"),
        ],
    );
    // Production starts once the opportunistic job holds the device.
    let mut out = std::io::BufReader::new(opp.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        let n = std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        assert!(n > 0, "the opportunistic loop ended before its fill");
        if line.contains("\"filled\"") {
            break;
        }
    }
    let prod = start_loop(&gpu, "prod", "production", at);
    let batch = libshare_abi::container_dir(state.path(), "batch").join(libshare_abi::STATE_FILE);
    let batch = libshare_abi::State::open_view(&batch).expect("the opportunistic state");
    let (mut demoted, mut opp_lines) = (0u64, String::new());
    let reader = std::thread::spawn(move || {
        let _ = std::io::Read::read_to_string(&mut out, &mut opp_lines);
        opp_lines
    });
    let prod_done = std::thread::spawn(move || final_line(prod, "production", true));
    while !prod_done.is_finished() {
        demoted = demoted.max(
            batch
                .device(0)
                .demoted
                .load(std::sync::atomic::Ordering::Acquire),
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let prod = prod_done.join().unwrap()["iters_per_s"].as_f64().unwrap();
    let status = opp.wait().expect("wait the opportunistic loop");
    let opp_lines = reader.join().unwrap();
    assert!(
        status.success(),
        "the opportunistic loop failed: {opp_lines}"
    );
    let done: serde_json::Value = opp_lines
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .find(|v: &serde_json::Value| v["done"] == true)
        .unwrap_or_else(|| panic!("no final line from the opportunistic loop: {opp_lines}"));
    let ratio = prod / solo;
    println!(
        "solo {solo:.1} it/s; beside an oversubscribing loop: production {prod:.1} it/s ({ratio:.3} of solo), opportunistic {} it/s, {} MiB demoted at most",
        done["iters_per_s"], demoted >> 20
    );
    assert_eq!(
        (&done["held"], &done["held_bad"]),
        (&20.into(), &0.into()),
        "{done}"
    );
    assert!(
        demoted > 0,
        "production's allocations never asked for a demotion"
    );
    assert!(
        ratio >= 0.95,
        "production at {ratio:.3} of solo ({prod:.1} / {solo:.1} it/s)"
    );
    assert!(
        done["iters"].as_u64() > Some(0),
        "the opportunistic loop made no progress: {done}"
    );
}
