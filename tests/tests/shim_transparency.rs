//! Issue 3, must-show 1: under `LD_PRELOAD=libshare.so` the cudart C test (cudart 12.9 and 13.5),
//! the nvcc kernel test (shared and static cudart) and the PyTorch smoke test behave exactly as
//! without the shim, and the shim's launch and allocation counters (summed over the process slots
//! of the container's state file) equal simgpu's own counts for the same run — including the
//! calls PyTorch makes through the cudart copies inside cuBLAS/cuBLASLt, which resolve the driver
//! through `dlsym` and `cuGetProcAddress`.

use libshare_tests::{
    compile_c, compile_cu, compile_gcc, describe, json_lines, python_source, torch_python, Cudart,
    CudartLink, SimCounts, SimGpu,
};
use std::path::Path;
use std::process::Output;

const EIGHT_GIB: u64 = 8 << 30;

/// Runs `program args` on a fresh machine, with or without the shim; returns the output, simgpu's
/// counters, and the machine (for the shim's state file).
fn run(shim: bool, memory: &str, program: &Path, args: &[String]) -> (Output, SimCounts, SimGpu) {
    let gpu = SimGpu::new().memory(memory);
    let gpu = if shim {
        gpu.with_shim()
    } else {
        gpu.with_stats()
    };
    let out = gpu.run_cmd_ok(|| {
        let mut cmd = gpu.command(program);
        cmd.args(args);
        cmd
    });
    gpu.assert_no_stub_calls();
    let counts = gpu.sim_counts();
    assert_eq!(
        counts.processes,
        1,
        "one stats line per run\n{:?}",
        gpu.stats()
    );
    (out, counts, gpu)
}

/// Output lines with the values that vary from run to run (wall-clock timings) removed.
fn stable_lines(out: &Output, volatile: &[&str]) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            if let Ok(serde_json::Value::Object(mut m)) = serde_json::from_str(l) {
                for k in volatile {
                    m.remove(*k);
                }
                return serde_json::Value::Object(m).to_string();
            }
            match l.split_once('=') {
                Some((k, _)) if volatile.contains(&k) => format!("{k}=<varies>"),
                _ => l.to_string(),
            }
        })
        .collect()
}

/// Runs the program without and with the shim and compares everything observable; returns
/// simgpu's counts (same in both runs) for further checks.
fn same_with_and_without_shim(
    memory: &str,
    program: &Path,
    args: &[String],
    volatile: &[&str],
) -> SimCounts {
    let (plain, plain_counts, _) = run(false, memory, program, args);
    let (shimmed, counts, gpu) = run(true, memory, program, args);
    assert_eq!(
        stable_lines(&shimmed, volatile),
        stable_lines(&plain, volatile),
        "stdout differs under the shim\n---- without\n{}\n---- with\n{}",
        describe(&plain),
        describe(&shimmed)
    );
    assert_eq!(
        String::from_utf8_lossy(&shimmed.stderr),
        String::from_utf8_lossy(&plain.stderr),
        "stderr differs under the shim"
    );
    assert_eq!(
        (counts.launches, counts.api_allocs),
        (plain_counts.launches, plain_counts.api_allocs),
        "simgpu saw different driver calls with the shim (launches, allocations)"
    );
    let shim = gpu.shim_counts("default");
    assert_eq!(
        (shim.launches, shim.allocs),
        (counts.launches, counts.api_allocs),
        "shim counters (launches, allocations) differ from simgpu's for the same run"
    );
    counts
}

fn cudart_c_test(cudart: Cudart) {
    let bin = compile_c("rt_test.c", cudart);
    let counts = same_with_and_without_shim(
        "8GiB",
        &bin,
        &[EIGHT_GIB.to_string()],
        &["event_elapsed_ms"],
    );
    // cudaMalloc × 3 (cudaMallocHost is host memory).
    assert_eq!(counts.api_allocs, 3, "{counts:?}");
}

#[test]
fn shim_cudart_12_9_unchanged_and_counted() {
    cudart_c_test(Cudart::V12);
}

#[test]
fn shim_cudart_13_5_unchanged_and_counted() {
    cudart_c_test(Cudart::V13);
}

#[test]
fn shim_cudart_under_a_quota_sees_the_quota_as_the_device() {
    // The same unmodified program, told to expect a 2 GiB device: cudaGetDeviceProperties and
    // cudaMemGetInfo report the quota, and its accounting checks hold.
    let bin = compile_c("rt_test.c", Cudart::V13);
    let gpu = SimGpu::new().memory("8GiB").with_shim().quota("2GiB");
    let out = gpu.run_cmd_ok(|| {
        let mut cmd = gpu.command(&bin);
        cmd.arg((2u64 << 30).to_string());
        cmd
    });
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.lines().any(|l| l == "OK"), "{}", describe(&out));
    assert!(stdout.contains("total_global_mem=2147483648"), "{stdout}");
    assert!(stdout.contains("mem_free_before=2147483648"), "{stdout}");
    assert!(
        stdout.contains(&format!("mem_free_after={}", (2u64 << 30) - (256 << 20))),
        "{stdout}"
    );
}

fn kernel_test(link: CudartLink) {
    let bin = compile_cu("kernel_test.cu", link);
    let symbol = same_with_and_without_shim("8GiB", &bin, &["symbol".to_string()], &[]);
    assert_eq!(symbol.launches, 2, "{symbol:?}");
    let args: Vec<String> = ["time", "both", "4", "64", "10"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let timed = same_with_and_without_shim(
        "8GiB",
        &bin,
        &args,
        &["elapsed_ms", "enqueue_ms", "host_ms"],
    );
    assert!(timed.launches >= 20, "{timed:?}");
}

#[test]
fn shim_nvcc_kernel_shared_cudart_unchanged_and_counted() {
    kernel_test(CudartLink::Shared);
}

#[test]
fn shim_nvcc_kernel_static_cudart_unchanged_and_counted() {
    kernel_test(CudartLink::Static);
}

#[test]
fn shim_torch_smoke_unchanged_and_counted_including_cublas() {
    let script = python_source("torch_smoke.py");
    let args = [
        script.to_string_lossy().into_owned(),
        (16u64 << 30).to_string(),
    ];
    let python = torch_python();
    let (plain, plain_counts, _) = run(false, "16GiB", &python, &args);
    let (shimmed, counts, gpu) = run(true, "16GiB", &python, &args);
    let volatile = ["seconds", "elapsed_ms"];
    assert_eq!(
        stable_lines(&shimmed, &volatile),
        stable_lines(&plain, &volatile),
        "torch_smoke.py output differs under the shim\n---- without\n{}\n---- with\n{}",
        describe(&plain),
        describe(&shimmed)
    );
    let lines = json_lines(&shimmed);
    assert!(lines.iter().all(|v| v["ok"] == true), "{lines:?}");
    assert!(
        lines.iter().any(|v| v["step"] == "events"),
        "the matmul step (cuBLAS) did not run: {lines:?}"
    );
    assert_eq!(
        (counts.launches, counts.api_allocs),
        (plain_counts.launches, plain_counts.api_allocs),
        "simgpu saw different driver calls with the shim"
    );
    // PyTorch launches its own kernels and cuBLAS's (`a @ a`, nn.Linear): all of them, and
    // every allocation (the caching allocator's and cuBLAS's workspace), reach the shim.
    let shim = gpu.shim_counts("default");
    assert!(counts.launches > 10 && counts.api_allocs > 1, "{counts:?}");
    assert_eq!(
        (shim.launches, shim.allocs),
        (counts.launches, counts.api_allocs),
        "shim counters (launches, allocations) differ from simgpu's"
    );
}

#[test]
fn shim_every_allocation_and_launch_path_is_counted_once() {
    // The driver API directly: cuMemAlloc, cuMemAllocPitch, cuMemAllocManaged, cuMemAllocAsync,
    // cuMemAllocFromPoolAsync, cuMemCreate; cuLaunchKernel, _ptsz, cuLaunchKernelEx,
    // cuLaunchCooperativeKernel, captured launches and cuGraphLaunch.
    let bin = compile_gcc("shim_driver.c", "shim_driver", &[]);
    let gpu = SimGpu::new().memory("8GiB").with_shim().quota("1GiB");
    let out = gpu.run_cmd_ok(|| {
        let mut cmd = gpu.command(&bin);
        cmd.arg("paths");
        cmd
    });
    let stdout = String::from_utf8_lossy(&out.stdout);
    let fact = |k: &str| -> u64 {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("no {k} in\n{stdout}"))
            .parse()
            .unwrap()
    };
    let sim = gpu.sim_counts();
    let shim = gpu.shim_counts("default");
    assert_eq!(
        sim.launches,
        fact("expected_launches"),
        "{}",
        describe(&out)
    );
    assert_eq!(sim.api_allocs, fact("expected_api_allocs"));
    assert_eq!(
        (shim.launches, shim.allocs),
        (sim.launches, sim.api_allocs),
        "shim counters (launches, allocations) differ from simgpu's"
    );
    let st = gpu.container_state("default");
    let dev = st.device(0);
    use std::sync::atomic::Ordering::Acquire;
    assert_eq!(dev.used.load(Acquire), 0, "memory left charged after exit");
    assert_eq!(dev.oom.load(Acquire), 0);
    assert_eq!(dev.allocs.load(Acquire), sim.api_allocs);
    gpu.assert_no_stub_calls();
}

/// Runs `shim_driver <mode>` under a `quota`: the program checks each charge and return through
/// cuMemGetInfo. Afterwards nothing is left charged, the container's refusals are `refusals`, and
/// simgpu's own device-memory peak (what the job really held) never exceeded the quota.
fn memory_path_under_a_quota(mode: &str, quota: &str, refusals: u64) -> String {
    let bin = compile_gcc("shim_driver.c", "shim_driver", &[]);
    let gpu = SimGpu::new().memory("8GiB").with_shim().quota(quota);
    let out = gpu.run_cmd_ok(|| {
        let mut cmd = gpu.command(&bin);
        cmd.arg(mode);
        cmd
    });
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let limit = libshare_abi::units::parse_size(quota).unwrap();
    let st = gpu.container_state("default");
    use std::sync::atomic::Ordering::Acquire;
    let dev = st.device(0);
    assert_eq!(dev.used.load(Acquire), 0, "memory left charged after exit");
    assert!(dev.peak.load(Acquire) <= limit, "peak above the quota");
    assert_eq!(dev.oom.load(Acquire), refusals, "refusals: {stdout}");
    let sim_peak = gpu.sim_mem_peak(0, 8 << 30);
    assert!(
        sim_peak <= limit,
        "simgpu's device memory peaked at {} MiB, over the {quota} quota: {stdout}",
        sim_peak >> 20
    );
    gpu.assert_no_stub_calls();
    stdout
}

#[test]
fn shim_cuda_arrays_count_against_the_quota() {
    // cuArrayCreate, cuArray3DCreate and cuMipmappedArrayCreate: charged at the arrays' size,
    // refused past the quota with CUDA_ERROR_OUT_OF_MEMORY, returned on destroy.
    let out = memory_path_under_a_quota("arrays", "64MiB", 1);
    assert!(out.contains("over_quota=2\n"), "{out}");
}

#[test]
fn shim_graph_memory_stays_charged_while_a_graph_holds_it() {
    // cuGraphAddMemAllocNode / cuGraphAddMemFreeNode and cuGraphAddNode with memory nodes; the
    // charge outlives free nodes and the graph while an executable graph made from it exists.
    let out = memory_path_under_a_quota("graph_mem", "64MiB", 2);
    assert!(out.contains("over_quota=2\n"), "{out}");
    assert!(out.contains("alloc_while_graph_exists=2\n"), "{out}");
}

#[test]
fn shim_stream_ordered_free_returns_the_quota_when_the_stream_reaches_it() {
    let out = memory_path_under_a_quota("async_window", "256MiB", 0);
    assert!(out.contains("charged_while_queued_mib=200\n"), "{out}");
    assert!(out.contains("alloc_after_wait=0\n"), "{out}");
}

#[test]
fn shim_memory_a_pool_keeps_is_charged_and_trimmed_at_the_quota() {
    let out = memory_path_under_a_quota("pool_retention", "256MiB", 0);
    assert!(out.contains("pool_reserved_mib=200\n"), "{out}");
    assert!(out.contains("kept_charged_mib=200\n"), "{out}");
    assert!(out.contains("reuse_charged_mib=200\n"), "{out}");
    assert!(out.contains("full_charge_charged_mib=150\n"), "{out}");
    assert!(out.contains("after_trim_charged_mib=200\n"), "{out}");
}
