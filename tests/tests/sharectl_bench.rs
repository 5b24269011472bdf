//! `sharectl bench S1` on simgpu, short: every policy reports finite figures, native co-location
//! harms production, and libshare keeps production near its solo throughput while the
//! opportunistic job still harvests most of the idle GPU. `sharectl bench S8` (PyTorch inference
//! beside PyTorch training, each on CPUs of its own): libshare keeps production's median request
//! latency near solo where native co-location does not, and the training progresses.
//! `sharectl bench S3 --ops memset,copy` (issue 18 must-show 3: an opportunistic job issuing only
//! large memsets or device-to-device copies): libshare keeps production's median latency well
//! below native's (its p99 ratio in the log),
//! serves production, and the opportunistic job's measured GPU time counts. `sharectl bench S9
//! --s9-processes 8` (issue 31): eight opportunistic containers taking turns keep production's
//! p99 near solo. Bounds are
//! generous (the machine is shared with builds); BENCHMARKS.md has the real figures.

use libshare_tests::{artifacts, describe, json_lines, shim_lib, torch_python, SimGpu};
use serde_json::Value;
use std::ffi::OsStr;
use std::time::Duration;

/// `sharectl bench SCENARIO --sim --json --duration 3` on simgpu: its JSON lines (it must
/// succeed) and a description of its output for failure messages.
fn bench(scenario: &str) -> (Vec<Value>, String) {
    bench_with(scenario, "3", &[])
}

/// [`bench`] with `--duration SECS` and more arguments.
fn bench_with(scenario: &str, secs: &str, extra: &[&OsStr]) -> (Vec<Value>, String) {
    let gpu = SimGpu::new().timeout(Duration::from_secs(600));
    let mut cmd = gpu.command(artifacts().bin("sharectl"));
    cmd.args(["bench", scenario, "--sim", "--json", "--duration", secs])
        .args(extra)
        .arg("--simgpu-lib")
        .arg(&artifacts().lib_dir)
        .arg("--shim")
        .arg(shim_lib());
    let out = gpu.run_cmd(cmd);
    let ctx = describe(&out);
    assert!(out.status.success(), "{ctx}");
    (json_lines(&out), ctx)
}

#[test]
fn bench_s1_libshare_protects_production_and_harvests() {
    let (lines, ctx) = bench("S1");

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
fn bench_s4_production_never_runs_out_of_memory_beside_an_oversubscribing_job() {
    // Issue 20, must-show 2: working sets at 125 % of the device. Without the shim production's
    // allocation fails; with managed memory (hints-only, libshare) it never does, and the
    // opportunistic job keeps making progress.
    let (lines, ctx) = bench("S4");
    let get = |policy: &str| -> &Value {
        let l = lines
            .iter()
            .find(|l| l["scenario"] == "S4" && l["policy"] == policy)
            .unwrap_or_else(|| panic!("no S4 {policy} line: {ctx}"));
        assert!(l.get("error").is_none(), "S4 {policy} failed: {l}\n{ctx}");
        l
    };
    assert_eq!(get("native")["production_oom"], 1, "{ctx}");
    for p in ["exclusive", "hints-only", "libshare"] {
        let l = get(p);
        assert_eq!(l["production_oom"], 0, "{l}");
        let r = l["production_ratio"].as_f64().unwrap();
        // Hints alone may starve production (0.004 seen on a loaded host): no bound there.
        assert!(
            r.is_finite() && (p == "hints-only" || r > 0.3),
            "S4 {p}: production_ratio {r}"
        );
    }
    for p in ["hints-only", "libshare"] {
        let o = get(p)["opportunistic_iters_per_s"].as_f64().unwrap();
        assert!(
            o > 0.0,
            "S4 {p}: the opportunistic job made no progress: {ctx}"
        );
    }
}

#[test]
fn bench_s5_thrashing_jobs_take_turns_and_beat_serial() {
    // Issue 20, must-show 3: two opportunistic jobs of 70 % of the device each. Managed memory
    // co-run without the shim thrashes; libshare's turns beat running them one after the other,
    // and beat turns of nvshare's fixed quantum (scaled to the run). Generous bounds (a loaded
    // host); BENCHMARKS.md has the figures of one run.
    let (lines, ctx) = bench_with("S5", "4", &[]);
    let get = |policy: &str| -> &Value {
        let l = lines
            .iter()
            .find(|l| l["scenario"] == "S5" && l["policy"] == policy)
            .unwrap_or_else(|| panic!("no S5 {policy} line: {ctx}"));
        assert!(l.get("error").is_none(), "S5 {policy} failed: {l}\n{ctx}");
        l
    };
    let ratio = |policy: &str| -> f64 {
        let r = get(policy)["serial_ratio"].as_f64().unwrap();
        assert!(r.is_finite() && r > 0.0, "S5 {policy}: serial_ratio {r}");
        r
    };
    assert_eq!(ratio("serial"), 1.0);
    let (native, fixed, libshare) = (ratio("native"), ratio("fixed-quantum"), ratio("libshare"));
    assert!(
        native >= 1.5,
        "native co-run should thrash: {native}\n{ctx}"
    );
    assert!(
        libshare < 0.9,
        "libshare's turns should beat serial: {libshare}\n{ctx}"
    );
    assert!(
        libshare < fixed,
        "the adaptive quantum should beat the fixed one: libshare {libshare}, fixed {fixed}\n{ctx}"
    );
    let l = get("libshare");
    let switches = l["switches"].as_f64().unwrap_or(0.0);
    assert!(switches >= 2.0, "libshare: switches {switches}: {l}");
    assert!(l["quantum_ms"].as_f64().unwrap_or(0.0) > 0.0, "{l}");
}

#[test]
fn bench_s8_pytorch_inference_keeps_its_latency_beside_training() {
    let python = torch_python();
    let extra = [
        "--policy".as_ref(),
        "native,libshare".as_ref(),
        "--cpus".as_ref(),
        "by-class".as_ref(),
        "--python".as_ref(),
        python.as_os_str(),
    ];
    let (lines, ctx) = bench_with("S8", "2", &extra);
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

#[test]
fn bench_s3_memsets_and_device_copies_keep_production_latency() {
    let extra = [
        "--policy".as_ref(),
        "exclusive,native,libshare".as_ref(),
        "--ops".as_ref(),
        "memset,copy".as_ref(),
    ];
    let (lines, ctx) = bench_with("S3", "3", &extra);
    for op in ["memset", "copy"] {
        let fig = |policy: &str, key: &str| -> f64 {
            let l = lines
                .iter()
                .find(|l| l["scenario"] == "S3" && l["policy"] == policy && l["op"] == op)
                .unwrap_or_else(|| panic!("no S3 {policy} {op} line: {ctx}"));
            assert!(
                l.get("error").is_none(),
                "S3 {policy} {op} failed: {l}\n{ctx}"
            );
            let v = l[key]
                .as_f64()
                .unwrap_or_else(|| panic!("S3 {policy} {op}: {key} missing: {l}"));
            assert!(v.is_finite() && v >= 0.0, "S3 {policy} {op}: {key} = {v}");
            v
        };
        // The median, not the p99: a short run's p99 is one or two requests, and this machine's
        // hiccups (a loaded VM's solo p99 is 12-28 ms against a p50 of 5.3).
        let (native, libshare) = (fig("native", "p50_ms"), fig("libshare", "p50_ms"));
        assert!(
            libshare < 0.8 * native,
            "{op}: libshare should keep production's median latency well below native \
             co-location's: native {native} ms, libshare {libshare} ms\n{ctx}"
        );
        let p99 = fig("libshare", "p99_ratio");
        eprintln!("S3 {op}: libshare p99 ratio {p99}, p50 native {native} ms, libshare {libshare}");
        let served = fig("libshare", "production_ratio");
        assert!(
            served >= 0.9,
            "{op}: libshare production_ratio {served}\n{ctx}"
        );
        let harvest = fig("libshare", "opportunistic_harvest");
        assert!(
            harvest > 0.1,
            "{op}: the opportunistic job's measured GPU time should count: harvest {harvest}\n{ctx}"
        );
    }
}

/// Issue 31 (S9 with N containers): eight opportunistic containers of one saturating process
/// each, taking turns beside production, keep production's tail near solo. Before the fix a
/// container whose turn came while production was busy counted its wait for the turn as
/// starvation and launched at once, so about one request in forty met an extra 2–4 ms (p99
/// 1.9 × solo). The bound is generous; BENCHMARKS.md has the medians.
#[test]
fn bench_s9_eight_containers_taking_turns_keep_production_near_solo() {
    let extra = [
        "--policy".as_ref(),
        "exclusive,libshare".as_ref(),
        "--s9-processes".as_ref(),
        "8".as_ref(),
        "--cpus".as_ref(),
        "shared".as_ref(),
    ];
    let (lines, ctx) = bench_with("S9", "3", &extra);
    let row = lines
        .iter()
        .find(|l| l["policy"] == "libshare" && l["containers"] == 8)
        .unwrap_or_else(|| panic!("no S9 libshare 8-container line: {ctx}"));
    assert!(row.get("error").is_none(), "S9 failed: {row}\n{ctx}");
    let fig = |key: &str| {
        row[key]
            .as_f64()
            .unwrap_or_else(|| panic!("S9: {key} missing: {row}"))
    };
    let (p99, harvest) = (fig("p99_ratio"), fig("opportunistic_harvest"));
    eprintln!("S9, 8 containers: p99 {p99} x solo, harvest {harvest}");
    assert!(
        p99 <= 1.45,
        "8 opportunistic containers should not stretch production's p99: {p99} x solo\n{ctx}"
    );
    assert!(harvest >= 0.5, "the eight should harvest: {harvest}\n{ctx}");
}
