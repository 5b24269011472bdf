//! `sharectl bench S1` on simgpu, short: every policy reports finite figures, native co-location
//! harms production, and libshare keeps production near its solo throughput while the
//! opportunistic job still harvests most of the idle GPU. `sharectl bench S8` (PyTorch inference
//! beside PyTorch training, each on CPUs of its own): libshare keeps production's median request
//! latency near solo where native co-location does not, and the training progresses. Bounds are
//! generous (the machine is shared with builds); BENCHMARKS.md has the real figures.

use libshare_tests::{artifacts, describe, json_lines, shim_lib, torch_python, SimGpu};
use serde_json::Value;
use std::time::Duration;

#[test]
fn bench_s1_libshare_protects_production_and_harvests() {
    let gpu = SimGpu::new().timeout(Duration::from_secs(300));
    let mut cmd = gpu.command(artifacts().bin("sharectl"));
    cmd.args([
        "bench",
        "S1",
        "--sim",
        "--json",
        "--duration",
        "3",
        "--simgpu-lib",
    ])
    .arg(&artifacts().lib_dir)
    .arg("--shim")
    .arg(shim_lib());
    let out = gpu.run_cmd(cmd);
    let ctx = describe(&out);
    assert!(out.status.success(), "{ctx}");
    let lines = json_lines(&out);

    let get = |policy: &str| -> &Value {
        lines
            .iter()
            .find(|l| l["scenario"] == "S1" && l["policy"] == policy)
            .unwrap_or_else(|| panic!("no S1 {policy} line: {ctx}"))
    };
    let fig = |policy: &str, key: &str| -> f64 {
        let l = get(policy);
        assert!(l.get("error").is_none(), "S1 {policy} failed: {l}\n{ctx}");
        let v = l[key]
            .as_f64()
            .unwrap_or_else(|| panic!("S1 {policy}: {key} missing: {l}"));
        assert!(v.is_finite() && v >= 0.0, "S1 {policy}: {key} = {v}");
        v
    };
    for p in [
        "exclusive",
        "native",
        "static-split",
        "time-slice",
        "libshare",
    ] {
        fig(p, "production_ratio");
        fig(p, "opportunistic_harvest");
    }
    assert_eq!(fig("exclusive", "production_ratio"), 1.0, "{ctx}");
    assert_eq!(fig("exclusive", "opportunistic_harvest"), 0.0, "{ctx}");
    for p in ["static-split", "time-slice", "libshare"] {
        fig(p, "daemon_cpu_pct");
    }

    let native = fig("native", "production_ratio");
    let libshare = fig("libshare", "production_ratio");
    assert!(
        native < libshare,
        "native co-location should harm production more than libshare: native {native}, libshare {libshare}\n{ctx}"
    );
    assert!(
        libshare >= 0.85,
        "libshare production_ratio {libshare}\n{ctx}"
    );
    let harvest = fig("libshare", "opportunistic_harvest");
    assert!(
        harvest >= 0.4,
        "libshare opportunistic_harvest {harvest}\n{ctx}"
    );
}

#[test]
fn bench_s8_pytorch_inference_keeps_its_latency_beside_training() {
    let gpu = SimGpu::new().timeout(Duration::from_secs(600));
    let mut cmd = gpu.command(artifacts().bin("sharectl"));
    cmd.args([
        "bench",
        "S8",
        "--sim",
        "--json",
        "--duration",
        "2",
        "--policy",
        "native,libshare",
        "--cpus",
        "by-class",
        "--python",
    ])
    .arg(torch_python())
    .arg("--simgpu-lib")
    .arg(&artifacts().lib_dir)
    .arg("--shim")
    .arg(shim_lib());
    let out = gpu.run_cmd(cmd);
    let ctx = describe(&out);
    assert!(out.status.success(), "{ctx}");
    let lines = json_lines(&out);
    let fig = |policy: &str, key: &str| -> f64 {
        let l = lines
            .iter()
            .find(|l| l["scenario"] == "S8" && l["policy"] == policy)
            .unwrap_or_else(|| panic!("no S8 {policy} line: {ctx}"));
        assert!(l.get("error").is_none(), "S8 {policy} failed: {l}\n{ctx}");
        assert_eq!(l["cpus"], "by-class", "{l}");
        let v = l[key]
            .as_f64()
            .unwrap_or_else(|| panic!("S8 {policy}: {key} missing: {l}"));
        assert!(v.is_finite() && v > 0.0, "S8 {policy}: {key} = {v}");
        v
    };
    // The median, not the p99: a short run's p99 is a few requests, and this machine's hiccups.
    let (native, libshare) = (fig("native", "p50_ms"), fig("libshare", "p50_ms"));
    assert!(
        libshare < 0.8 * native,
        "libshare should keep production's median latency well below native co-location's: \
         native {native} ms, libshare {libshare} ms\n{ctx}"
    );
    let served = fig("libshare", "production_ratio");
    assert!(served >= 0.9, "libshare production_ratio {served}\n{ctx}");
    let progress = fig("libshare", "opportunistic_progress");
    assert!(
        progress >= 0.1,
        "the opportunistic training should progress under libshare: {progress}\n{ctx}"
    );
}
