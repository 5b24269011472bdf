//! `sharectl demo` on simgpu, short: both jobs run under the shim as the containers "prod"
//! (production) and "batch" (opportunistic); the batch container's second worker is refused past
//! its quota while production's memory is untouched, and both jobs report throughput.

use libshare_tests::{artifacts, describe, json_lines, shim_lib, SimGpu};
use serde_json::Value;

/// Device 0's figures of `name` in a `containers` list (the `sharectl status --json` objects).
fn dev0<'a>(containers: &'a Value, name: &str) -> &'a Value {
    let c = containers
        .as_array()
        .and_then(|a| a.iter().find(|c| c["container"] == name))
        .unwrap_or_else(|| panic!("no container {name} in {containers}"));
    c["devices"]
        .as_array()
        .and_then(|d| d.iter().find(|d| d["device"] == 0))
        .unwrap_or_else(|| panic!("container {name} has no device 0: {c}"))
}

fn u(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} missing in {v}"))
}

#[test]
fn demo_runs_both_jobs_under_the_shim_and_the_batch_quota_refuses_growth() {
    const MIB: u64 = 1 << 20;
    let (prod_quota, prod_mem) = (2048 * MIB, 512 * MIB);
    let batch_quota = 512 * MIB;

    let gpu = SimGpu::new();
    let mut cmd = gpu.command(artifacts().bin("sharectl"));
    cmd.args(["demo", "--sim", "--json", "--duration", "2", "--simgpu-lib"])
        .arg(&artifacts().lib_dir)
        .arg("--shim")
        .arg(shim_lib());
    let out = gpu.run_cmd(cmd);
    assert!(out.status.success(), "{}", describe(&out));
    let lines = json_lines(&out);
    let ctx = describe(&out);

    let start = &lines[0];
    assert_eq!(start["event"], "start", "{ctx}");
    assert_eq!(start["gpu"]["kind"], "simgpu", "{ctx}");
    assert!(start["libshare"]["shim"].is_string(), "{ctx}");
    assert_eq!(start["libshare"]["kernel_rate_control"], true, "{ctx}");

    let last = lines.last().unwrap();
    assert_eq!(last["final"], true, "{ctx}");
    assert_eq!(last["libshare_enforced"]["shim"], true, "{ctx}");
    assert_eq!(
        last["libshare_enforced"]["kernel_rate_control"], true,
        "{ctx}"
    );

    // Throughput: production alone and shared, and the opportunistic job while shared.
    let solo = last["solo"]["production_iters_per_s"].as_f64().unwrap();
    let shared = last["colocated"]["production_iters_per_s"]
        .as_f64()
        .unwrap();
    let opp = last["colocated"]["opportunistic_iters_per_s"]
        .as_f64()
        .unwrap_or(0.0);
    assert!(solo > 0.0 && shared > 0.0 && opp > 0.0, "{ctx}");

    // Phase 3, the same pair under the daemon: production does better than natively co-located
    // (generous: the tight figures are `sharectl bench`'s) and the opportunistic job still runs.
    let (native, governed) = (
        last["production_vs_solo"].as_f64().unwrap(),
        last["production_vs_solo_libshare"].as_f64().unwrap(),
    );
    assert!(
        governed > native + 0.1 && governed > 0.8,
        "{native} -> {governed}: {ctx}"
    );
    assert!(
        last["libshare"]["opportunistic_gpu_ms_per_s"]
            .as_f64()
            .unwrap()
            > 0.0,
        "{ctx}"
    );

    // The batch container's second worker asked for more than its quota had left: refused.
    let grow = &last["colocated"]["grow"];
    assert_eq!(grow["refused"], true, "{ctx}");
    assert!(
        grow["message"]
            .as_str()
            .unwrap()
            .contains("CUDA_ERROR_OUT_OF_MEMORY"),
        "{ctx}"
    );
    let events: Vec<_> = lines.iter().filter(|v| v["event"] == "grow").collect();
    assert_eq!(events.len(), 1, "one grow event: {ctx}");

    // Per-container figures: the batch container never held more than its quota and counted the
    // refusal; production's quota and memory are its own, untouched.
    let colocated = &last["colocated"]["containers"];
    let batch = dev0(colocated, "batch");
    assert_eq!(u(batch, "quota_bytes"), batch_quota, "{ctx}");
    assert!(u(batch, "refused_over_quota") >= 1, "{ctx}");
    assert!(u(batch, "peak_bytes") <= batch_quota, "{ctx}");
    let prod = dev0(colocated, "prod");
    assert_eq!(u(prod, "quota_bytes"), prod_quota, "{ctx}");
    assert_eq!(u(prod, "refused_over_quota"), 0, "{ctx}");
    assert_eq!(u(prod, "peak_bytes"), prod_mem, "{ctx}");
    assert_eq!(
        u(dev0(&last["solo"]["containers"], "prod"), "peak_bytes"),
        prod_mem,
        "{ctx}"
    );

    // Every live reading along the way: batch within its quota, prod holding only its own memory.
    let progress: Vec<_> = lines.iter().filter(|v| v["event"] == "progress").collect();
    assert!(!progress.is_empty(), "{ctx}");
    for p in &progress {
        let c = &p["containers"];
        assert!(c.is_array(), "progress without containers: {p}");
        if let Some(b) = c
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["container"] == "batch")
        {
            let d = &b["devices"][0];
            assert!(u(d, "used_bytes") <= batch_quota, "{p}");
            assert!(u(d, "peak_bytes") <= batch_quota, "{p}");
        }
        let prod = dev0(c, "prod");
        assert!(u(prod, "used_bytes") <= prod_mem, "{p}");
        assert_eq!(u(prod, "refused_over_quota"), 0, "{p}");
        assert_eq!(u(prod, "quota_bytes"), prod_quota, "{p}");
    }
}

#[test]
fn demo_without_the_shim_says_so_and_still_measures_colocation() {
    let gpu = SimGpu::new();
    let mut cmd = gpu.command(artifacts().bin("sharectl"));
    cmd.args([
        "demo",
        "--sim",
        "--json",
        "--no-shim",
        "--duration",
        "1",
        "--simgpu-lib",
    ])
    .arg(&artifacts().lib_dir);
    let out = gpu.run_cmd(cmd);
    assert!(out.status.success(), "{}", describe(&out));
    let lines = json_lines(&out);
    let ctx = describe(&out);
    assert!(lines[0]["libshare"]["shim"].is_null(), "{ctx}");
    let last = lines.last().unwrap();
    assert_eq!(last["libshare_enforced"]["shim"], false, "{ctx}");
    assert!(
        last["libshare"].is_null(),
        "no phase 3 without the shim: {ctx}"
    );
    assert!(last["colocated"]["containers"].is_null(), "{ctx}");
    assert!(last["colocated"]["grow"].is_null(), "{ctx}");
    assert!(
        last["colocated"]["production_iters_per_s"]
            .as_f64()
            .unwrap()
            > 0.0,
        "{ctx}"
    );
}
