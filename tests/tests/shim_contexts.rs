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

#[test]
fn nvml_only_tools_see_the_container_quota_and_usage() {
    // A monitoring tool that never calls cuInit: the shim reads the limit from the environment
    // and the container's usage from its state file (read-only).
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let script = libshare_tests::python_source("shim_nvml_only.py");
    let gpu = SimGpu::new().memory("8GiB").with_shim().quota("1GiB");
    let nvml = || {
        let out = gpu.run_ok(libshare_tests::torch_python(), &[script.to_str().unwrap()]);
        json_check(&out, "nvml_only")
    };
    let v = nvml();
    assert_eq!(v["total"], 1u64 << 30, "no CUDA process yet: {v}");
    assert_eq!(v["free"], 1u64 << 30, "{v}");

    // A CUDA process of the same container holds 300 MiB.
    let prog = libshare_tests::compile_gcc("hold_memory.c", "hold_memory", &["-lcuda"]);
    let mut cmd = gpu.command(&prog);
    cmd.args(["hold", "300"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    let mut holder = cmd.spawn().expect("spawn holder");
    let mut line = String::new();
    BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("\"result\":0"), "{line}");
    let v = nvml();
    holder.kill().ok();
    holder.wait().ok();
    assert_eq!(v["total"], 1u64 << 30, "{v}");
    assert_eq!(v["used"], 300u64 << 20, "the container's 300 MiB: {v}");
}
