//! PyTorch (torch 2.15.0, CUDA 13.2 build from PyPI) on simgpu: `tests/python/torch_smoke.py`.
//! Also the canary for driver drift: fails if simgpu's trace file shows any call of an
//! unimplemented stub function.

use libshare_tests::{json_lines, python_source, torch_python, SimGpu};

const SIXTEEN_GIB: u64 = 16 << 30;

#[test]
fn torch_smoke() {
    let python = torch_python();
    let script = python_source("torch_smoke.py");
    let gpu = SimGpu::new().memory("16GiB");
    let out = gpu.run_ok(
        &python,
        &[script.to_str().unwrap(), &SIXTEEN_GIB.to_string()],
    );
    let lines = json_lines(&out);
    let steps: Vec<&str> = lines.iter().filter_map(|v| v["step"].as_str()).collect();
    for step in [
        "is_available",
        "properties",
        "zeros",
        "copy_roundtrip",
        "linear_fwd_bwd",
        "sgd_steps",
        "events",
        "mem_get_info",
        "synchronize",
    ] {
        assert!(steps.contains(&step), "step {step} missing: {steps:?}");
    }
    assert!(lines.iter().all(|v| v["ok"] == true), "{lines:?}");
    let props = lines.iter().find(|v| v["step"] == "properties").unwrap();
    assert_eq!(props["total_memory"], SIXTEEN_GIB);
    let mem = lines.iter().find(|v| v["step"] == "mem_get_info").unwrap();
    assert_eq!(mem["total"], SIXTEEN_GIB);
    gpu.assert_no_stub_calls();
}

#[test]
fn torch_cuda_graph_capture_and_replay() {
    let script = python_source("torch_graph.py");
    // Every kernel takes 1 ms, so 10 replays take at least 10 ms of modelled device time.
    let gpu = SimGpu::new().env("SIMGPU_KERNEL_BASE", "1ms");
    let out = gpu.run_ok(torch_python(), &[script.to_str().unwrap()]);
    let v = libshare_tests::json_check(&out, "graph");
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["input_roundtrip"], true, "{v}");
    assert_eq!(v["out_shape"], serde_json::json!([64, 256]), "{v}");
    let ms = v["replay_ms"].as_f64().unwrap();
    assert!(
        ms >= 10.0,
        "10 replays of >= 1 ms of kernels took {ms} ms: {v}"
    );
    gpu.assert_no_stub_calls();
}

#[test]
fn torch_cuda_graph_with_the_cuda_malloc_async_backend() {
    // Allocations made during capture are graph allocations; the script frees the graph before
    // the tensor made during capture, which CUDA allows. Plain, and under the shim with a quota
    // (the graph holds its allocations' charge; `libshare/src/graph_mem.rs`).
    let script = python_source("torch_graph.py");
    for gpu in [SimGpu::new(), SimGpu::new().with_shim().quota("2GiB")] {
        let gpu = gpu.env("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync");
        let out = gpu.run_ok(torch_python(), &[script.to_str().unwrap()]);
        let v = libshare_tests::json_check(&out, "graph");
        assert_eq!(v["input_roundtrip"], true, "{v}");
        let freed = libshare_tests::json_check(&out, "graph_freed");
        assert_eq!(freed["ok"], true, "{freed}");
        gpu.assert_no_stub_calls();
    }
}

/// Runs `tests/python/torch_broad.py` on `gpu`; every step must succeed and no stub be reached.
fn broad(gpu: &SimGpu) {
    let script = python_source("torch_broad.py");
    let out = gpu.run_ok(torch_python(), &[script.to_str().unwrap()]);
    let lines = json_lines(&out);
    assert!(lines.len() >= 14, "steps missing: {lines:?}");
    let failed: Vec<_> = lines.iter().filter(|v| v["ok"] != true).collect();
    assert!(failed.is_empty(), "failed steps: {failed:?}");
    gpu.assert_no_stub_calls();
}

#[test]
fn torch_broad_workload() {
    broad(&SimGpu::new());
}

#[test]
fn torch_broad_workload_under_the_shim() {
    broad(&SimGpu::new().with_shim().quota("8GiB"));
}

/// `tests/python/torch_fft.py`: cuFFT (torch.fft.*, torch.stft/istft) runs; it walks each module
/// it loads through the ToolsModule export table.
fn fft(gpu: &SimGpu) {
    let script = python_source("torch_fft.py");
    let out = gpu.run_ok(torch_python(), &[script.to_str().unwrap()]);
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 12, "steps missing: {lines:?}");
    let failed: Vec<_> = lines.iter().filter(|v| v["ok"] != true).collect();
    assert!(failed.is_empty(), "failed steps: {failed:?}");
    gpu.assert_no_stub_calls();
}

#[test]
fn torch_fft() {
    fft(&SimGpu::new());
}

#[test]
fn torch_fft_under_the_shim() {
    fft(&SimGpu::new().with_shim().quota("4GiB"));
}

#[test]
fn torch_fills_write_their_value_and_counts_on_stale_memory_are_zero() {
    // simgpu/src/driver/results.rs: kernels do not compute, except PyTorch's contiguous fills
    // and the CUB kernels that count for nonzero/unique/masked indexing.
    let script = python_source("torch_results.py");
    let gpu = SimGpu::new();
    let out = gpu.run_ok(torch_python(), &[script.to_str().unwrap()]);
    let v = libshare_tests::json_check(&out, "results");
    for dtype in [
        "float32", "float16", "bfloat16", "float64", "int32", "int64", "uint8", "bool",
    ] {
        for fill in ["full", "zeros", "ones"] {
            assert_eq!(v[dtype][fill], true, "{dtype} {fill}: {v}");
        }
    }
    assert_eq!(v["fill_"], true, "{v}");
    let shapes = &v["shapes"];
    assert_eq!(shapes["nonzero"], serde_json::json!([0, 1]), "{v}");
    assert_eq!(shapes["masked_select"], serde_json::json!([0]), "{v}");
    assert_eq!(shapes["boolean_index"], serde_json::json!([0, 10]), "{v}");
    assert_eq!(shapes["unique"], serde_json::json!([0]), "{v}");
    assert_eq!(shapes["argwhere"], serde_json::json!([0, 2]), "{v}");
    gpu.assert_no_stub_calls();
}

#[test]
fn torch_cuda_tensors_shared_between_processes() {
    let script = python_source("torch_ipc.py");
    for gpu in [SimGpu::new(), SimGpu::new().with_shim().quota("4GiB")] {
        let out = gpu.run_ok(torch_python(), &[script.to_str().unwrap()]);
        let v = libshare_tests::json_check(&out, "ipc");
        assert_eq!(v["seen"], serde_json::json!([0.0, 1.0, 2.0, 3.0]), "{v}");
        assert_eq!(v["after"], serde_json::json!([7.0, 7.0, 7.0, 7.0]), "{v}");
        assert_eq!(v["exit"], 0, "{v}");
        gpu.assert_no_stub_calls();
    }
}

#[test]
fn torch_distributed_nccl_single_rank() {
    let script = python_source("torch_nccl.py");
    for gpu in [SimGpu::new(), SimGpu::new().with_shim().quota("8GiB")] {
        let out = gpu.run_ok(torch_python(), &[script.to_str().unwrap()]);
        assert_eq!(libshare_tests::json_check(&out, "nccl")["ok"], true);
        gpu.assert_no_stub_calls();
    }
}

/// `tests/python/torch_broad2.py`: the profiler (CUPTI), NVTX, TorchScript, cuSPARSE, cuSOLVER, CUB,
/// cuDNN benchmark mode, AMP, `torch.compile(mode="reduce-overhead")`, every SDPA backend, memory
/// history and fraction, stream priorities, IPC events, NVML, the caching-allocator API,
/// DataLoader workers, jiterator, CUDA-graphed callables and expandable segments.
fn broad2(gpu: &SimGpu) {
    let script = python_source("torch_broad2.py");
    let out = gpu.run_ok(torch_python(), &[script.to_str().unwrap()]);
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 23, "steps missing: {lines:?}");
    let failed: Vec<_> = lines.iter().filter(|v| v["ok"] != true).collect();
    assert!(failed.is_empty(), "failed steps: {failed:?}");
    let sdpa = lines.iter().find(|v| v["step"] == "SDPA backends").unwrap();
    assert_eq!(
        sdpa["backends"],
        serde_json::json!([
            "FLASH_ATTENTION",
            "EFFICIENT_ATTENTION",
            "CUDNN_ATTENTION",
            "MATH"
        ])
    );
    gpu.assert_no_stub_calls();
}

#[test]
fn torch_broad2_workload() {
    broad2(&SimGpu::new().timeout(std::time::Duration::from_secs(400)));
}

#[test]
fn torch_broad2_workload_under_the_shim() {
    broad2(
        &SimGpu::new()
            .with_shim()
            .quota("8GiB")
            .timeout(std::time::Duration::from_secs(400)),
    );
}
