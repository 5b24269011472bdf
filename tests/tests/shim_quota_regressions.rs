//! Issue 6, must-show 1 (the shim's items): one regression test per way the audit exceeded or
//! eroded the memory quota. Each measures simgpu's OWN device memory (its `mem_used` / `mem_peak`
//! in the machine's state file), not only the shim's counters: the device never holds more than
//! the quota, and at every pause of the program (`tests/cuda/shim_quota.c`) what the container is
//! charged equals what simgpu holds — each test runs one CUDA process on a fresh machine, so the
//! device's memory is that process's.

use libshare_tests::{compile_c, compile_gcc, describe, Cudart, Running, SimGpu};
use std::collections::HashMap;
use std::sync::atomic::Ordering::Acquire;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// simgpu's device: 8× the quota, so only the shim keeps a process within it.
const DEVICE: u64 = 8 * GIB;
const CONTAINER: &str = "quota";

fn machine(quota: &str) -> SimGpu {
    SimGpu::new()
        .memory("8GiB")
        .with_shim()
        .quota(quota)
        .env("LIBSHARE_CONTAINER", CONTAINER)
}

/// The `key=value` lines a program printed so far.
fn facts(p: &Running) -> HashMap<String, String> {
    p.lines
        .iter()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn fact(p: &Running, key: &str) -> u64 {
    let f = facts(p);
    f.get(key)
        .unwrap_or_else(|| panic!("no {key}= line in {:?}", p.lines))
        .parse()
        .unwrap_or_else(|e| panic!("{key}={}: {e}", f[key]))
}

/// (what the container is charged on device 0, what simgpu's device 0 holds).
fn figures(gpu: &SimGpu) -> (u64, u64) {
    let st = gpu.container_state(CONTAINER);
    let charged = st.device(0).used.load(Acquire);
    (charged, gpu.sim_mem_used(0, DEVICE))
}

/// Waits for the program's pause `tag`, asserts the container's charge equals simgpu's memory
/// there, lets the program go on; returns the figure.
#[track_caller]
fn at_pause(gpu: &SimGpu, p: &mut Running, tag: &str) -> u64 {
    p.wait_for_line(tag);
    let (charged, held) = figures(gpu);
    assert_eq!(
        charged,
        held,
        "at {tag:?}: the container is charged {charged} bytes but simgpu holds {held} \
         (difference {} MiB)\n{:?}",
        (charged as i64 - held as i64) / MIB as i64,
        p.lines
    );
    p.send("go\n");
    charged
}

/// The program exited 0 after "OK"; neither the container nor the device holds anything; the
/// device and the container never held more than `quota`. Returns simgpu's peak.
#[track_caller]
fn finish_within(gpu: &SimGpu, p: Running, quota: u64) -> u64 {
    let out = p.finish();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("\nOK"),
        "{}",
        describe(&out)
    );
    let st = gpu.container_state(CONTAINER);
    let peak = st.device(0).peak.load(Acquire);
    let sim_peak = gpu.sim_mem_peak(0, DEVICE);
    assert!(
        sim_peak <= quota,
        "simgpu's device memory peaked at {sim_peak} bytes, over the {quota}-byte quota by {} MiB",
        (sim_peak - quota) / MIB
    );
    assert!(peak <= quota, "the container's peak {peak} > quota {quota}");
    assert_eq!(
        figures(gpu),
        (0, 0),
        "(charged, simgpu) after the process exited"
    );
    sim_peak
}

fn start(gpu: &SimGpu, prog: &std::path::Path, args: &[&str]) -> Running {
    let mut cmd = gpu.command(prog);
    cmd.args(args);
    gpu.spawn(cmd)
}

fn driver_probe() -> std::path::PathBuf {
    compile_gcc("shim_quota.c", "shim_quota", &["-lcuda"])
}

/// Item 1: `cuDevicePrimaryCtxReset` (`cudaDeviceReset`) returns only the primary context's
/// allocations: a `cuCtxCreate` context's 600 MiB stay charged through 20 rounds of filling the
/// primary context to the quota and resetting it (the audit reached 4.8 GiB under 1 GiB).
#[test]
fn shim_quota_primary_reset_keeps_a_created_contexts_memory_charged() {
    let gpu = machine("1GiB");
    let mut p = start(&gpu, &driver_probe(), &["reset", "20"]);
    assert_eq!(at_pause(&gpu, &mut p, "held"), 600 * MIB);
    assert_eq!(at_pause(&gpu, &mut p, "freed"), 0);
    let peak = finish_within(&gpu, p, GIB);
    // Every round filled the quota: 600 MiB + 4 × 100 MiB.
    assert_eq!(peak, 1000 * MIB, "simgpu's peak");
}

/// Item 2: 8 threads each holding ≤ 100 MiB through `cuMemAllocAsync`/`cuMemFreeAsync` on a pool
/// that keeps everything (release threshold = max) under a 1 GiB quota: the device stays within
/// the quota (the audit saw +46 % in bursts), the container's `peak` too (concurrent reconciles
/// double-counted growth), and what the pool keeps is charged exactly.
#[test]
fn shim_quota_stream_ordered_allocations_on_a_retaining_pool_stay_within_the_quota() {
    let gpu = machine("1GiB");
    let mut p = start(&gpu, &driver_probe(), &["async", "8", "3000"]);
    let kept = at_pause(&gpu, &mut p, "held");
    assert_eq!(
        kept,
        fact(&p, "pool_reserved"),
        "charged vs the pool's reserve"
    );
    assert_eq!(at_pause(&gpu, &mut p, "trimmed"), 0);
    assert_eq!(fact(&p, "trimmed_reserved"), 0);
    let allocs = fact(&p, "allocs");
    let peak = finish_within(&gpu, p, GIB);
    assert!(allocs > 5000, "{allocs} stream-ordered allocations");
    assert!(
        peak > 200 * MIB,
        "simgpu's peak {peak}: the pool hardly grew"
    );
}

/// Item 3, driver API: 8 threads × 40 000 cuMemAlloc/cuMemFree of 1 B .. 1 MiB (up to 8 live
/// each) under a 24 MiB quota, so that many are refused (the audit lost 58 % of a 64 MiB quota to
/// phantom charges): what is charged is what is held, and 0 once everything is freed.
#[test]
fn shim_quota_threads_allocating_and_freeing_leave_no_phantom_charge() {
    let gpu = machine("24MiB");
    let mut p = start(&gpu, &driver_probe(), &["churn", "8", "40000"]);
    let held = at_pause(&gpu, &mut p, "held");
    assert_eq!(
        held,
        fact(&p, "held"),
        "charged vs the bytes the threads hold"
    );
    assert_eq!(at_pause(&gpu, &mut p, "freed"), 0);
    assert_eq!(fact(&p, "ops"), 320_000);
    assert!(fact(&p, "ooms") > 0, "the quota was never reached");
    finish_within(&gpu, p, 24 * MIB);
}

/// Item 3 through cudart (cudaMalloc/cudaFree from 8 threads, 200 000 operations).
#[test]
fn shim_quota_cudart_threads_leave_no_phantom_charge() {
    let prog = compile_c("shim_quota_rt.c", Cudart::V13);
    let gpu = machine("24MiB");
    let mut p = start(&gpu, &prog, &["8", "25000"]);
    let held = at_pause(&gpu, &mut p, "held");
    assert_eq!(
        held,
        fact(&p, "held"),
        "charged vs the bytes the threads hold"
    );
    assert_eq!(at_pause(&gpu, &mut p, "freed"), 0);
    assert_eq!(fact(&p, "ops"), 200_000);
    assert!(fact(&p, "ooms") > 0, "the quota was never reached");
    finish_within(&gpu, p, 24 * MIB);
}

/// Item 4: 8 threads allocate in a context that another thread destroys and replaces 100 times
/// (the audit left 34 MB .. 1 GiB charged): the charge equals simgpu's memory while the last
/// context lives and after it is destroyed.
#[test]
fn shim_quota_context_destroy_racing_allocations_leaves_the_charge_exact() {
    let gpu = machine("1GiB");
    let mut p = start(&gpu, &driver_probe(), &["ctx_race", "8", "100"]);
    at_pause(&gpu, &mut p, "held");
    let left = at_pause(&gpu, &mut p, "destroyed");
    if left > 0 {
        // simgpu keeps an allocation made in a context after its destroy (issue 6 item 13); the
        // shim charges exactly what it keeps.
        println!("NOTE: simgpu kept {left} bytes allocated in destroyed contexts (charged alike)");
    }
    assert!(fact(&p, "allocs") > 1000, "{:?}", p.lines);
    finish_within(&gpu, p, GIB);
}

/// Item 11: block-compressed (BC1, BC7) and planar (NV12, P010) arrays, legacy `cuMemAlloc` (v1)
/// from `cuGetProcAddress(.., 2000)`, and pitched sizes whose width × height overflows. simgpu
/// refuses those array formats (CUDA_ERROR_INVALID_VALUE): the shim must charge nothing net after
/// the refusal (their sizing is `shim_quota_array_sizes.rs`).
#[test]
fn shim_quota_arrays_legacy_alloc_and_overflowing_pitches_charge_exactly() {
    let gpu = machine("1GiB");
    let mut p = start(&gpu, &driver_probe(), &["uncharged"]);
    let v1 = at_pause(&gpu, &mut p, "v1");
    assert_eq!(at_pause(&gpu, &mut p, "done"), 0);
    let f = facts(&p);
    println!("{}", p.lines.join("\n"));
    let v1_rc = fact(&p, "alloc_v1_rc");
    match v1_rc {
        0 => assert_eq!(v1, 64 * MIB, "cuMemAlloc (v1) of 64 MiB charged"),
        _ => {
            println!("NOTE: simgpu answers cuMemAlloc (v1) with {v1_rc}; the shim charged {v1}");
            assert_eq!(v1, 0, "a refused cuMemAlloc (v1) charged")
        }
    }
    for i in 0..4 {
        assert_ne!(f[&format!("pitch_{i}_rc")], "0");
    }
    finish_within(&gpu, p, GIB);
}

/// Item 11: the last `cuDevicePrimaryCtxRelease` destroys the primary context with its
/// allocations; the shim then charges for them exactly what the driver still holds: nothing on
/// CUDA, which frees them. simgpu keeps them today (issue 6 item 13), and the shim, which checks
/// each of the context's allocations against the driver at its end, keeps them charged: the
/// device never holds uncharged memory. Printed when so.
#[test]
fn shim_quota_primary_release_to_refcount_zero_returns_its_memory() {
    let gpu = machine("1GiB");
    let mut p = start(&gpu, &driver_probe(), &["primary_release"]);
    assert_eq!(at_pause(&gpu, &mut p, "held"), 200 * MIB);
    let left = at_pause(&gpu, &mut p, "released");
    assert_eq!(fact(&p, "released_charged"), left);
    if left != 0 {
        println!(
            "NOTE: simgpu still holds {left} bytes of a primary context released to refcount 0 \
             (CUDA frees them; issue 6 item 13); the shim charges them alike"
        );
    }
    finish_within(&gpu, p, GIB);
}
