//! `tests/cuda/kernel_test.cu`, compiled with the real CUDA 13.5 nvcc (shared and static cudart):
//! `<<<>>>` launches, `__device__` globals, and CUDA events that report the simgpu cost model.
//!
//! Cost model (design §6, simgpu README): a kernel takes `kernel_base + waves × wave`, with
//! `waves = ceil(blocks / (SMs × min(32, max(1, 2048 / threads_per_block))))`, unless
//! `SIMGPU_KERNEL_TIME=<name substring>=<duration>` overrides it. Host↔device copies take
//! `bytes / pcie_bandwidth` on one copy engine per direction. Timing bounds are ±20 %.

use libshare_tests::{assert_close, compile_cu, json_check, CudartLink, SimGpu};
use std::path::PathBuf;

const BUSY_MANGLED: &str = "_Z11busy_kernelPfi";

fn kernel_test(link: CudartLink) -> PathBuf {
    compile_cu("kernel_test.cu", link)
}

/// Runs `kernel_test time <which> <grid> <block> <launches>`; returns (elapsed, enqueue, host) ms.
fn timed(
    gpu: &SimGpu,
    link: CudartLink,
    which: &str,
    grid: u64,
    block: u64,
    launches: u64,
) -> (f64, f64, f64) {
    let args = [
        "time".to_string(),
        which.to_string(),
        grid.to_string(),
        block.to_string(),
        launches.to_string(),
    ];
    let out = gpu.run_ok(kernel_test(link), &args);
    let v = json_check(&out, "time");
    (
        v["elapsed_ms"].as_f64().unwrap(),
        v["enqueue_ms"].as_f64().unwrap(),
        v["host_ms"].as_f64().unwrap(),
    )
}

fn sm_count(gpu: &SimGpu) -> u64 {
    let out = gpu.run_ok(kernel_test(CudartLink::Shared), &["props"]);
    json_check(&out, "props")["sm_count"].as_u64().unwrap()
}

/// The documented default cost model, in ms.
fn model_ms(base_ms: f64, wave_ms: f64, sms: u64, grid: u64, block: u64) -> f64 {
    let per_sm = (2048 / block).clamp(1, 32);
    let waves = grid.div_ceil(sms * per_sm);
    base_ms + waves as f64 * wave_ms
}

fn symbol_roundtrip(link: CudartLink) {
    let gpu = SimGpu::new();
    let out = gpu.run_ok(kernel_test(link), &["symbol"]);
    let v = json_check(&out, "symbol");
    assert_eq!(v["ok"], true);
    assert_eq!(v["bytes"], 4096);
    gpu.assert_no_stub_calls();
}

#[test]
fn symbol_roundtrip_and_launch_shared_cudart() {
    symbol_roundtrip(CudartLink::Shared);
}

#[test]
fn symbol_roundtrip_and_launch_static_cudart() {
    symbol_roundtrip(CudartLink::Static);
}

#[test]
fn kernel_time_override_by_substring() {
    let gpu = SimGpu::new().env("SIMGPU_KERNEL_TIME", "busy_kernel=1ms");
    for link in [CudartLink::Shared, CudartLink::Static] {
        let (elapsed, _, host) = timed(&gpu, link, "busy", 1, 32, 20);
        assert_close(
            &format!("{link:?}: 20 × 1 ms kernels, event elapsed"),
            elapsed,
            20.0,
            0.2,
        );
        // simgpu sleeps to the modelled deadline: the host really waited for the kernels.
        assert!(
            host >= 0.8 * elapsed,
            "{link:?}: host waited {host:.2} ms for {elapsed:.2} ms of kernels"
        );
    }
}

#[test]
fn kernel_time_override_by_mangled_name() {
    let gpu = SimGpu::new().env("SIMGPU_KERNEL_TIME", format!("{BUSY_MANGLED}=2ms"));
    let (elapsed, _, _) = timed(&gpu, CudartLink::Shared, "busy", 4, 64, 10);
    assert_close(
        "10 × 2 ms kernels (mangled-name override)",
        elapsed,
        20.0,
        0.2,
    );
}

#[test]
fn kernel_time_override_applies_only_to_matching_kernels() {
    // busy_kernel: 5 ms by override; other_kernel: default model, 1 wave = 5 µs + 10 µs.
    let gpu = SimGpu::new().env("SIMGPU_KERNEL_TIME", "busy_kernel=5ms");
    let (elapsed, _, _) = timed(&gpu, CudartLink::Shared, "both", 1, 32, 10);
    assert_close("10 × (5 ms busy + 15 µs other)", elapsed, 50.15, 0.2);
}

#[test]
fn default_cost_model_scaled() {
    // 1 ms base, 4 ms per wave: every case is several ms, so host overhead is noise.
    let gpu = SimGpu::new()
        .env("SIMGPU_KERNEL_BASE", "1ms")
        .env("SIMGPU_WAVE", "4ms");
    let sms = sm_count(&gpu);
    assert_eq!(sms, 108, "default SM count");
    let cases = [
        // (grid, block, launches)
        (1, 32, 4),                // 1 wave
        (sms * 8 * 2 + 1, 256, 2), // 8 blocks/SM: 3 waves
        (sms * 2 * 3, 1024, 2),    // 2 blocks/SM: exactly 3 waves
        (sms * 32 + 1, 32, 2),     // 32 blocks/SM (cap): 2 waves
        (sms * 32, 16, 2),         // 2048/16 = 128 → capped at 32: 1 wave
    ];
    for (grid, block, launches) in cases {
        let per_kernel = model_ms(1.0, 4.0, sms, grid, block);
        let (elapsed, _, _) = timed(&gpu, CudartLink::Shared, "busy", grid, block, launches);
        assert_close(
            &format!("grid {grid} × block {block}, {launches} launches of {per_kernel} ms"),
            elapsed,
            per_kernel * launches as f64,
            0.2,
        );
    }
}

#[test]
fn default_cost_model_unscaled() {
    // The documented defaults: 5 µs base + 10 µs per wave, 108 SMs.
    let gpu = SimGpu::new();
    let sms = sm_count(&gpu);
    let (grid, block, launches) = (sms * 8 * 100, 256, 20); // 100 waves: 1.005 ms per kernel
    let expected = model_ms(0.005, 0.010, sms, grid, block) * launches as f64;
    let (elapsed, _, _) = timed(&gpu, CudartLink::Shared, "busy", grid, block, launches);
    assert_close("20 kernels of 100 waves", elapsed, expected, 0.2);
}

#[test]
fn events_on_idle_stream_measure_the_host_gap() {
    let gpu = SimGpu::new();
    let out = gpu.run_ok(kernel_test(CudartLink::Shared), &["gap", "100"]);
    let v = json_check(&out, "gap");
    let elapsed = v["elapsed_ms"].as_f64().unwrap();
    let gap = v["host_gap_ms"].as_f64().unwrap();
    assert!(gap >= 100.0, "host slept {gap} ms");
    assert_close(
        "elapsed between events on an idle stream",
        elapsed,
        gap,
        0.2,
    );
}

#[test]
fn events_measure_modelled_kernel_time_not_sync_time() {
    // Events around one 50 ms kernel; the host sleeps 200 ms before synchronizing. The elapsed
    // time is the kernel's device time (50 ms), not the time until the host synchronized.
    let gpu = SimGpu::new().env("SIMGPU_KERNEL_TIME", "busy_kernel=50ms");
    let out = gpu.run_ok(
        kernel_test(CudartLink::Shared),
        &["late_sync", "1", "32", "200"],
    );
    let v = json_check(&out, "late_sync");
    let elapsed = v["elapsed_ms"].as_f64().unwrap();
    let host = v["host_ms"].as_f64().unwrap();
    assert!(host >= 200.0, "host time {host} ms");
    assert_close("elapsed around a 50 ms kernel", elapsed, 50.0, 0.2);
}

#[test]
fn kernel_launches_are_asynchronous() {
    // As on a real GPU, launching returns before the kernel finishes: enqueueing 20 × 2 ms
    // kernels takes far less than the 40 ms they occupy the device.
    let gpu = SimGpu::new().env("SIMGPU_KERNEL_TIME", "busy_kernel=2ms");
    let (elapsed, enqueue, host) = timed(&gpu, CudartLink::Shared, "busy", 1, 32, 20);
    assert_close("20 × 2 ms kernels", elapsed, 40.0, 0.2);
    assert!(
        enqueue < 0.5 * elapsed,
        "enqueueing took {enqueue:.2} ms of {elapsed:.2} ms: launches block until the kernel ends"
    );
    assert!(
        host >= 0.8 * elapsed,
        "synchronize returned after {host:.2} ms"
    );
}

#[test]
fn copies_follow_pcie_bandwidth_one_engine_per_direction() {
    // 64 MiB at 1 GiB/s = 62.5 ms per direction; both directions at once overlap.
    let gpu = SimGpu::new().env("SIMGPU_PCIE_BW", "1GiB/s");
    let out = gpu.run_ok(kernel_test(CudartLink::Shared), &["copy", "64"]);
    let v = json_check(&out, "copy");
    let h2d = v["h2d_ms"].as_f64().unwrap();
    let d2h = v["d2h_ms"].as_f64().unwrap();
    let both = v["both_ms"].as_f64().unwrap();
    assert_close("64 MiB host-to-device at 1 GiB/s", h2d, 62.5, 0.2);
    assert_close("64 MiB device-to-host at 1 GiB/s", d2h, 62.5, 0.2);
    assert_close("both directions at once", both, 62.5, 0.2);
}
