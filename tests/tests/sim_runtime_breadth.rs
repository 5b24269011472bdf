//! What CUDA programs written like NVIDIA's samples do through the runtime API, on simgpu:
//! `tests/cuda/rt_*.cu`, compiled with the CUDA 13.5 nvcc and run with the shared cudart. Kernels
//! do not compute on simgpu, so the programs check bytes moved by copies and memsets, error
//! codes and reported properties; each must call no unimplemented driver function. Each program
//! also runs once with the shim preloaded, which must not change what it sees.

use libshare_tests::{compile_cu, json_check, CudartLink, SimGpu};
use serde_json::Value;

/// Runs `tests/cuda/<name>.cu` on `gpu`, checks the trace has no `stub` line, returns its JSON.
fn run(gpu: &SimGpu, name: &str, check: &str) -> Value {
    let out = gpu.run_ok(
        compile_cu(&format!("{name}.cu"), CudartLink::Shared),
        &[] as &[&str],
    );
    gpu.assert_no_stub_calls();
    json_check(&out, check)
}

/// Runs the program plainly and under the shim; both must report the same.
fn run_both(gpu: impl Fn() -> SimGpu, name: &str, check: &str, differs: &[&str]) -> Value {
    let plain = run(&gpu(), name, check);
    let shimmed = run(&gpu().with_shim(), name, check);
    for (k, v) in plain.as_object().unwrap() {
        if !differs.contains(&k.as_str()) {
            assert_eq!(
                &shimmed[k], v,
                "{k} differs under the shim: {shimmed} vs {plain}"
            );
        }
    }
    plain
}

/// Every key ending in `_ok` is 1.
fn all_ok(v: &Value) {
    for (k, x) in v.as_object().unwrap() {
        if k.ends_with("_ok") {
            assert_eq!(x, 1, "{k}: {v}");
        }
    }
}

#[test]
fn device_query_occupancy_and_launch_variants() {
    let v = run_both(SimGpu::new, "rt_device", "device", &[]);
    assert_eq!(v["count"], 1, "{v}");
    assert_eq!(v["attr_err"], 0, "every attribute id 1..150 answers: {v}");
    assert!(v["occupancy"].as_u64().unwrap() >= 1, "{v}");
    assert_ne!(
        v["too_many_threads"], 0,
        "a 4096-thread block is an error: {v}"
    );
    assert_eq!(v["bad_device"], 101, "cudaErrorInvalidDevice: {v}");
}

#[test]
fn streams_events_callbacks_zero_copy_registered_and_managed_memory() {
    let v = run_both(
        SimGpu::new,
        "rt_streams",
        "streams",
        &["polls", "elapsed_ms"],
    );
    all_ok(&v);
    assert_eq!(v["no_timing"], 400, "elapsed time of untimed events: {v}");
    assert_eq!(v["registered_type"], 1, "cudaMemoryTypeHost: {v}");
    assert_eq!(
        v["unregister_again"], 713,
        "cudaErrorHostMemoryNotRegistered: {v}"
    );
    assert_eq!(v["managed_type"], 3, "cudaMemoryTypeManaged: {v}");
    // What cudaMemAdvise / cudaMemPrefetchAsync recorded, read back by cudaMemRangeGetAttribute.
    assert_eq!(v["preferred"], 0, "preferred location device 0: {v}");
    assert_eq!(v["read_mostly"], 1, "{v}");
    assert_eq!(
        v["last_prefetch"], -1,
        "last prefetched to the host (cudaCpuDeviceId): {v}"
    );
    assert_eq!(
        v["accessed_by"],
        serde_json::json!([0, -2]),
        "device 0, then cudaInvalidDeviceId: {v}"
    );
}

#[test]
fn pitched_2d_3d_and_symbol_copies_round_trip() {
    let v = run_both(SimGpu::new, "rt_copies", "copies", &[]);
    all_ok(&v);
    assert_eq!(v["bad_pitch"], 12, "cudaErrorInvalidPitchValue: {v}");
    assert_eq!(v["past_end"], 1, "cudaErrorInvalidValue: {v}");
}

#[test]
fn graphs_capture_update_set_params_memory_child_and_conditional_nodes() {
    let v = run_both(SimGpu::new, "rt_graphs", "graphs", &[]);
    all_ok(&v);
    assert_eq!(v["graph_unchanged"], 1, "exec updates leave the graph: {v}");
    assert_eq!(v["update_result"], 0, "cudaGraphExecUpdateSuccess: {v}");
    assert_eq!(
        v["topo_err"], 910,
        "cudaErrorGraphExecUpdateFailure for another topology: {v}"
    );
    assert_eq!(
        v["topo_result"], 2,
        "cudaGraphExecUpdateErrorTopologyChanged: {v}"
    );
    assert_eq!(v["nodes"], 4, "{v}");
}

#[test]
fn peer_access_and_copies_between_two_devices() {
    let v = run_both(
        || SimGpu::new().env("SIMGPU_DEVICES", "2"),
        "rt_peer",
        "peer",
        &[],
    );
    all_ok(&v);
    assert_eq!(
        (&v["can01"], &v["can10"], &v["can00"]),
        (&1.into(), &1.into(), &0.into()),
        "{v}"
    );
    assert_eq!(v["access"], 1, "{v}");
    assert_eq!(v["not_enabled"], 705, "cudaErrorPeerAccessNotEnabled: {v}");
    assert_eq!(v["again"], 704, "cudaErrorPeerAccessAlreadyEnabled: {v}");
    assert_eq!(v["self"], 101, "cudaErrorInvalidDevice: {v}");
    assert_eq!(v["disabled_again"], 705, "{v}");
}

#[test]
fn arrays_textures_and_surfaces_round_trip_bytes() {
    let v = run_both(SimGpu::new, "rt_arrays", "arrays", &[]);
    all_ok(&v);
    assert_eq!(v["no_surface_flag"], 1, "cudaErrorInvalidValue: {v}");
    assert_eq!(v["oob"], 1, "cudaErrorInvalidValue past the array: {v}");
}
