//! Which device a quota applies to: destroying a created context returns its allocations to the
//! quota (as simgpu returns them to the device), and NVML, which numbers physical devices, shows
//! the quota for the device CUDA sees under CUDA_VISIBLE_DEVICES.

use libshare_tests::{compile_gcc, json_check, SimGpu};

#[test]
fn destroyed_context_memory_returns_to_the_quota() {
    let prog = compile_gcc("ctx_destroy.c", "ctx_destroy", &["-lcuda"]);
    for gpu in [
        SimGpu::new().memory("1GiB"),
        SimGpu::new().with_shim().quota("1GiB"),
    ] {
        let out = gpu.run_ok(&prog, &[] as &[&str]);
        let v = json_check(&out, "ctx_destroy");
        assert_eq!(v["before"], 1024, "{v}");
        assert_eq!(v["allocated"], 724, "{v}");
        assert_eq!(v["after_destroy"], 1024, "{v}");
    }
}

#[test]
fn nvml_reports_the_quota_for_the_device_cuda_sees() {
    let script = libshare_tests::python_source("shim_nvml_visible.py");
    let gpu = SimGpu::new()
        .with_shim()
        .quota("1GiB")
        .env("SIMGPU_DEVICES", "2")
        .env("SIMGPU_MEMORY", "8GiB")
        .env("CUDA_VISIBLE_DEVICES", "1");
    let out = gpu.run_ok(libshare_tests::torch_python(), &[script.to_str().unwrap()]);
    let v = json_check(&out, "nvml_visible");
    assert_eq!(v["cuda_total"], 1u64 << 30, "{v}");
    assert_eq!(
        v["nvml_totals"],
        serde_json::json!([8u64 << 30, 1u64 << 30]),
        "{v}"
    );
}
