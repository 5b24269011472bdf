//! simgpu frees device memory as the driver does (issue 6, items 12 and 13), measured on
//! simgpu's own accounting of the device (`cuMemGetInfo` without the shim):
//! - the synchronous freeing calls wait for the queued work that may use the memory, instead of
//!   unmapping it under the engine (which crashed the process);
//! - an allocation racing `cuCtxDestroy` either fails or is freed with the context;
//! - arrays larger than the device's limits or than 64 bits are refused and charge nothing, and
//!   arrays are freed with their context;
//! - the last `cuDevicePrimaryCtxRelease` frees the primary context's memory.
//!
//! Programs: `tests/cuda/sim_free.c`.

use libshare_tests::{compile_gcc, json_check, SimGpu};

const MIB: u64 = 1 << 20;

fn run(mode: &str, gpu: &SimGpu) -> serde_json::Value {
    let prog = compile_gcc("sim_free.c", "sim_free", &["-lcuda"]);
    let out = gpu.run_ok(&prog, &[mode]);
    json_check(&out, mode)
}

#[test]
fn freeing_calls_wait_for_queued_work() {
    let v = run("pending", &SimGpu::new().memory("1GiB"));
    // The copies were still queued when cuMemFree was called (so the wait was needed) ...
    assert_eq!(v["busy_before_free"], 1, "{v}");
    // ... and every freeing call returned only once the stream had drained.
    for k in [
        "idle_after_free",
        "idle_after_array_destroy",
        "idle_after_unmap",
        "idle_after_free_host",
    ] {
        assert_eq!(v[k], 1, "{k}: {v}");
    }
    let base = v["base"].as_u64().unwrap();
    for k in [
        "after_free",
        "after_array",
        "after_unmap",
        "after_pool",
        "end",
    ] {
        assert_eq!(v[k].as_u64().unwrap(), base, "{k}: memory not back: {v}");
    }
    // cuMemRelease of a mapped allocation frees nothing until its last mapping goes.
    assert_eq!(
        v["released_mapped"].as_u64().unwrap(),
        base + 32 * MIB,
        "{v}"
    );
}

#[test]
fn allocations_racing_a_context_destroy_do_not_survive_it() {
    let v = run("ctx_race", &SimGpu::new().memory("8GiB"));
    assert!(
        v["allocated"].as_u64().unwrap() > 0,
        "no allocation raced the destroys: {v}"
    );
    assert_eq!(v["leaked_rounds"], 0, "{v}");
    assert_eq!(v["end"], v["base"], "{v}");
}

#[test]
fn arrays_are_size_checked_and_freed_with_their_context() {
    let v = run("arrays", &SimGpu::new().memory("1GiB"));
    const INVALID_VALUE: u64 = 1;
    const OUT_OF_MEMORY: u64 = 2;
    assert_eq!(v["huge"], INVALID_VALUE, "2^40 x 2^40: {v}");
    assert_eq!(v["huge3d"], INVALID_VALUE, "2^40 x 2^40 x 2^40: {v}");
    assert_eq!(v["wide"], INVALID_VALUE, "1D wider than 131072: {v}");
    assert_eq!(v["big"], OUT_OF_MEMORY, "64 TiB within the limits: {v}");
    let base = v["base"].as_u64().unwrap();
    assert_eq!(v["after_refused"].as_u64().unwrap(), base, "{v}");
    assert_eq!(v["with_array"].as_u64().unwrap(), base + 64 * MIB, "{v}");
    assert_eq!(v["after_destroy"].as_u64().unwrap(), base, "{v}");
}

#[test]
fn last_primary_release_frees_the_primary_context_memory() {
    let v = run("primary", &SimGpu::new().memory("1GiB"));
    let base = v["base"].as_u64().unwrap();
    assert_eq!(v["allocated"].as_u64().unwrap(), base + 116 * MIB, "{v}");
    assert_eq!(v["after_first_release"], v["allocated"], "{v}");
    assert_eq!(v["active"], 1, "{v}");
    assert_eq!(v["after_last_release"].as_u64().unwrap(), base, "{v}");
    assert_eq!(v["active_after"], 0, "{v}");
    assert_eq!(v["extra_release"], 201, "CUDA_ERROR_INVALID_CONTEXT: {v}");
}

#[test]
fn vmm_memory_released_while_mapped_stays_until_unmapped() {
    // 384 MiB mapped and released on a 512 MiB device: 384 MiB more do not fit until the unmap.
    let v = run("vmm_release_mapped", &SimGpu::new().memory("512MiB"));
    assert_eq!(v["second"], 2, "CUDA_ERROR_OUT_OF_MEMORY while mapped: {v}");
    assert_eq!(v["after_unmap"], 0, "{v}");
}
