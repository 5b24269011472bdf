//! simgpu's fault injection (for reliability tests) and CUDA graphs, through NVIDIA's cudart 13.5
//! and nvcc-compiled kernels (`tests/cuda/sim_features.cu`).

use libshare_tests::{compile_cu, compile_gcc, json_check, CudartLink, SimGpu};

fn run(gpu: &SimGpu, mode: &str) -> serde_json::Value {
    let out = gpu.run_ok(compile_cu("sim_features.cu", CudartLink::Shared), &[mode]);
    json_check(&out, mode)
}

#[test]
fn allocating_past_the_configured_memory_is_out_of_memory() {
    let v = run(&SimGpu::new().memory("1GiB"), "oom");
    // cudaSuccess, cudaErrorMemoryAllocation (CUDA_ERROR_OUT_OF_MEMORY), then room again.
    assert_eq!(v["results"], serde_json::json!([0, 2, 0, 0]), "{v}");
    assert_eq!(v["total_mib"], 1024, "{v}");
    assert!(v["free_mib"].as_u64().unwrap() <= 1024 - 900, "{v}");
}

#[test]
fn explicit_graph_runs_in_dependency_order_and_clones() {
    let v = run(&SimGpu::new(), "graph_explicit");
    assert_eq!(v["errors"], 0, "{v}");
    // The host node saw the memset's 2 at the end and the copied 1 at the start ...
    assert_eq!(v["first"], 21, "{v}");
    // ... and the clone read the new host data (3) when it ran.
    assert_eq!(v["clone"], 23, "{v}");
}

#[test]
fn device_reset_frees_the_context_memory_and_the_quota() {
    for gpu in [
        SimGpu::new().memory("2GiB"),
        SimGpu::new().with_shim().quota("1GiB"),
    ] {
        let v = run(&gpu, "reset");
        let before = v["before"].as_u64().unwrap();
        assert_eq!(v["allocated"].as_u64().unwrap(), before - 300, "{v}");
        assert_eq!(v["after_reset"].as_u64().unwrap(), before, "{v}");
    }
}

#[test]
fn async_copy_to_pageable_memory_is_complete_on_return() {
    // 1 MiB at 10 MB/s takes 100 ms of modelled time: returning early would show zeros.
    let v = run(&SimGpu::new().env("SIMGPU_PCIE_BW", "10MB/s"), "pageable");
    assert_eq!(v["visible"], true, "{v}");
}

#[test]
fn nth_allocation_fails_with_out_of_memory() {
    let v = run(
        &SimGpu::new().env("SIMGPU_FAIL_ALLOC_NTH", "2"),
        "faults_alloc",
    );
    // cudaSuccess, cudaErrorMemoryAllocation, cudaSuccess
    assert_eq!(v["results"], serde_json::json!([0, 2, 0]), "{v}");
}

#[test]
fn nth_launch_returns_the_injected_error() {
    let v = run(
        &SimGpu::new().env("SIMGPU_LAUNCH_ERROR", "2:719"),
        "faults_launch",
    );
    assert_eq!(v["results"][0], 0, "{v}");
    assert_eq!(v["results"][1], 719, "cudaErrorLaunchFailure expected: {v}");
}

#[test]
fn stalled_stream_never_completes() {
    let v = run(
        &SimGpu::new().env("SIMGPU_STALL_STREAM_AFTER", "1"),
        "faults_stall",
    );
    // cudaErrorNotReady (600) on every poll, long after the 15 µs of modelled work.
    assert_eq!(v["last"], 600, "{v}");
    assert!(v["polls"].as_u64().unwrap() > 10, "{v}");
}

#[test]
fn captured_graph_replays_its_kernels_and_copies() {
    let gpu = SimGpu::new().env("SIMGPU_KERNEL_TIME", "busy_kernel=2ms");
    let v = run(&gpu, "graph");
    assert_eq!(v["errors"], serde_json::json!([0, 0, 0, 0]), "{v}");
    assert_eq!(
        v["capturing"], 1,
        "cudaStreamCaptureStatusActive during capture: {v}"
    );
    assert_eq!(v["nodes"], 6, "one copy and five kernels: {v}");
    // 3 launches × 5 kernels × 2 ms (plus the copies' microseconds).
    let ms = v["elapsed_ms"].as_f64().unwrap();
    assert!(
        (29.0..36.0).contains(&ms),
        "3 replays of 5 × 2 ms kernels took {ms} ms: {v}"
    );
    assert_eq!(
        v["value"], 7.0,
        "the captured copy reads the host buffer at launch time: {v}"
    );
}

#[test]
fn vmm_mapped_ranges_hold_bytes_and_unmapped_ones_are_errors() {
    let gpu = SimGpu::new();
    let out = gpu.run_ok(
        compile_gcc("vmm_test.c", "vmm_test", &["-lcuda"]),
        &[] as &[&str],
    );
    let v = json_check(&out, "vmm");
    assert_eq!(v["mapped"], 0, "{v}");
    assert_eq!(v["roundtrip"], 1, "{v}");
    assert_eq!(
        v["unmapped_copy"], 1,
        "CUDA_ERROR_INVALID_VALUE expected: {v}"
    );
    assert_eq!(
        v["unmapped_memset"], 1,
        "CUDA_ERROR_INVALID_VALUE expected: {v}"
    );
}

#[test]
fn jit_linked_image_keeps_kernels_layouts_and_globals() {
    let gpu = SimGpu::new();
    let out = gpu.run_ok(
        compile_gcc("link_test.c", "link_test", &["-lcuda"]),
        &[] as &[&str],
    );
    let v = json_check(&out, "link");
    assert_eq!(v["global_bytes"], 4, "{v}");
    let ms = v["spin_ms"].as_f64().unwrap();
    assert!(
        (4.9..5.5).contains(&ms),
        "the 5 ms parameter reached the linked kernel: {v}"
    );
}

#[test]
fn the_deprecated_launch_api_launches_with_the_configuration_set_on_the_function() {
    // `set_info_ker(value, info)` writes `value` to `*info` (a kernel simgpu produces the result
    // of): each value read back came through the legacy parameter buffer or a multi-device entry.
    let bin = compile_gcc("legacy_launch.c", "legacy_launch", &["-lcuda"]);
    let gpu = SimGpu::new().env("SIMGPU_DEVICES", "2");
    let out = gpu.run_ok(&bin, &[] as &[&str]);
    let v = json_check(&out, "legacy");
    assert_eq!(
        (&v["grid"], &v["launch"], &v["grid_async"]),
        (&0x1234.into(), &0x2345.into(), &0x3456.into()),
        "cuLaunchGrid, cuLaunch, cuLaunchGridAsync: {v}"
    );
    assert_eq!(
        v["truncated"], 0,
        "bytes past cuParamSetSize are not parameters: {v}"
    );
    // CUDA_ERROR_INVALID_VALUE (1) for no block shape, an empty grid, a negative shape, a write
    // past the 4 KiB parameter space and a texture unit other than CU_PARAM_TR_DEFAULT.
    for k in [
        "no_shape",
        "zero_grid",
        "bad_shape",
        "past_space",
        "bad_tex_unit",
    ] {
        assert_eq!(v[k], 1, "{k}: {v}");
    }
    assert_eq!(
        v["multi"],
        serde_json::json!([0x100, 0x101]),
        "each device's entry ran: {v}"
    );
    assert_eq!(v["same_device"], 1, "two entries on one device: {v}");
    assert_eq!(
        v["multi_null_stream"], 400,
        "the NULL stream is CUDA_ERROR_INVALID_HANDLE: {v}"
    );
    assert_eq!(v["multi_mismatch"], 1, "block shapes differ: {v}");
    gpu.assert_no_stub_calls();
}
