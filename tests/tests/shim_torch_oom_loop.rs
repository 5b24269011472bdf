//! Issue 6, must-show 3: PyTorch's ordinary train -> OOM -> `empty_cache` -> train loop
//! (`tests/python/torch_oom_loop.py`) with each allocator — native, `backend:cudaMallocAsync`,
//! `expandable_segments:True`:
//! - under the shim with `LIBSHARE_MEMORY_LIMIT=512MiB` on an 8 GiB device: no crash, simgpu's own
//!   device peak stays within the quota, and while the job still holds its memory the container's
//!   charge equals what simgpu holds (nothing else runs on the device) but for the few bytes of
//!   module globals; after exit both are 0;
//! - without the shim on a 512 MiB device: no crash (freeing the cache under the copies still
//!   queued by the failed step used to unmap memory under simgpu's engine and kill the process
//!   with SIGSEGV with the native allocator, issue 6 item 12).

use libshare_tests::{describe, python_source, torch_python, SimGpu};
use std::sync::atomic::Ordering::Acquire;

const MIB: u64 = 1 << 20;
const QUOTA: u64 = 512 * MIB;
const DEVICE: u64 = 8 << 30;
const ROUNDS: usize = 2;
/// Bound on the device memory of module globals (see the accounting check).
const MODULE_GLOBALS: u64 = 4096;
/// A run takes ~1 min on a loaded 2-core machine (importing torch is most of it).
const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// The JSON lines the script printed, and its "done" line.
fn results(lines: &[String], out: &str) -> (Vec<serde_json::Value>, serde_json::Value) {
    let json: Vec<serde_json::Value> = lines
        .iter()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line {l:?}: {e}")))
        .collect();
    let rounds: Vec<_> = json
        .iter()
        .filter(|v| v["round"].is_u64())
        .cloned()
        .collect();
    let done = json
        .iter()
        .find(|v| v["done"] == true)
        .unwrap_or_else(|| panic!("no done line\n{out}"))
        .clone();
    assert_eq!(rounds.len(), ROUNDS, "{out}");
    for r in &rounds {
        // Batches of 256 × 2^k up to the OOM: at least 4096 fit in 512 MiB, 2^24 never does.
        let b = r["batch"].as_u64().unwrap();
        assert!((4096..1 << 24).contains(&b), "round {r}\n{out}");
    }
    (rounds, done)
}

fn with_shim(alloc_conf: Option<&str>, backend: &str) {
    let script = python_source("torch_oom_loop.py");
    let mut gpu = SimGpu::new()
        .memory("8GiB")
        .with_shim()
        .quota("512MiB")
        .timeout(TIMEOUT);
    if let Some(conf) = alloc_conf {
        gpu = gpu.env("PYTORCH_CUDA_ALLOC_CONF", conf);
    }
    let mut cmd = gpu.command(torch_python());
    cmd.arg(&script).arg(ROUNDS.to_string());
    if alloc_conf.is_none() {
        cmd.env_remove("PYTORCH_CUDA_ALLOC_CONF");
    }
    let mut job = gpu.spawn(cmd);
    job.wait_for_line("READY");
    // The job is alive and idle, holding its cached memory: the container's charge must be
    // exactly what the device holds (this job is the only process on it).
    let sim_used = gpu.sim_mem_used(0, DEVICE);
    let st = gpu.container_state("default");
    let charged = st.device(0).used.load(Acquire);
    let shim_peak = st.device(0).peak.load(Acquire);
    job.send("\n");
    let out = job.finish();
    let text = describe(&out);
    assert!(out.status.success(), "{text}");
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    let (_, done) = results(&lines, &text);
    assert_eq!(done["backend"], backend, "{done}");
    let sim_peak = gpu.sim_mem_peak(0, DEVICE);
    eprintln!(
        "{backend}: device held {sim_used} and the container was charged {charged} at the end; \
         device peak {sim_peak}, shim peak {shim_peak}, quota {QUOTA}"
    );
    assert!(
        sim_peak <= QUOTA,
        "the device held {sim_peak} bytes, over the {QUOTA}-byte quota\n{text}"
    );
    // What the device holds beyond the charge is the `__device__` globals of the modules the
    // libraries loaded (cuBLAS…): driver allocations made at module load, which no allocation
    // hook sees (128 bytes with torch 2.15). Anything more is a charge lost or left behind.
    assert!(
        charged <= sim_used && sim_used - charged <= MODULE_GLOBALS,
        "container charged {charged} bytes while the device held {sim_used} for the job"
    );
    assert_eq!(st.device(0).used.load(Acquire), 0, "charged after exit");
    assert_eq!(
        gpu.sim_mem_used(0, DEVICE),
        0,
        "device memory held after exit"
    );
    gpu.assert_no_stub_calls();
}

fn without_shim(alloc_conf: Option<&str>, backend: &str) {
    let script = python_source("torch_oom_loop.py");
    let mut gpu = SimGpu::new().memory("512MiB").timeout(TIMEOUT);
    if let Some(conf) = alloc_conf {
        gpu = gpu.env("PYTORCH_CUDA_ALLOC_CONF", conf);
    }
    let mut cmd = gpu.command(torch_python());
    cmd.arg(&script).arg(ROUNDS.to_string());
    if alloc_conf.is_none() {
        cmd.env_remove("PYTORCH_CUDA_ALLOC_CONF");
    }
    let mut job = gpu.spawn(cmd);
    job.wait_for_line("READY");
    job.send("\n");
    let out = job.finish();
    let text = describe(&out);
    assert!(out.status.success(), "{text}");
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    let (_, done) = results(&lines, &text);
    assert_eq!(done["backend"], backend, "{done}");
}

#[test]
fn torch_oom_loop_native_allocator_quota() {
    with_shim(None, "native");
}

/// Measured: the device peaked at 625-650 MB in four runs (+16 to +21 % over the 512 MiB quota;
/// the shim's own peak 128 bytes less) — the stream-ordered pool accounting of issue 6 item 2.
#[test]
fn torch_oom_loop_cuda_malloc_async_quota() {
    with_shim(Some("backend:cudaMallocAsync"), "cudaMallocAsync");
}

#[test]
fn torch_oom_loop_expandable_segments_quota() {
    with_shim(Some("expandable_segments:True"), "native");
}

#[test]
fn torch_oom_loop_native_allocator_no_shim() {
    without_shim(None, "native");
}

#[test]
fn torch_oom_loop_cuda_malloc_async_no_shim() {
    without_shim(Some("backend:cudaMallocAsync"), "cudaMallocAsync");
}

#[test]
fn torch_oom_loop_expandable_segments_no_shim() {
    without_shim(Some("expandable_segments:True"), "native");
}
