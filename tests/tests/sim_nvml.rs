//! NVML through nvidia-ml-py on simgpu's `libnvidia-ml.so.1`: device count, name, memory and UUID
//! agree with the CUDA side (`tests/python/nvml_smoke.py`, `tests/cuda/rt_test.c`); NVML from C
//! without cuInit, and NVML (C and pynvml) watching two GPU users (`tests/cuda/nvml_test.c`).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use libshare_tests::{
    compile_c, compile_driver_c, describe, json_check, python_source, torch_python, Cudart, SimGpu,
};

#[test]
fn nvml_agrees_with_cuda() {
    let total: u64 = 12 << 30;
    let gpu = SimGpu::new().memory("12GiB");
    let script = python_source("nvml_smoke.py");
    let out = gpu.run_ok(
        torch_python(),
        &[script.to_str().unwrap(), &total.to_string()],
    );
    let nvml = json_check(&out, "nvml");
    assert_eq!(nvml["total"], total);
    assert!(nvml["count"].as_u64().unwrap() >= 1);

    // The CUDA side of the same machine reports the same device.
    let rt = gpu.run_ok(compile_c("rt_test.c", Cudart::V13), &[total.to_string()]);
    let stdout = String::from_utf8_lossy(&rt.stdout);
    let cuda_name = stdout
        .lines()
        .find_map(|l| l.strip_prefix("name="))
        .expect("rt_test prints name=");
    assert_eq!(
        nvml["name"], cuda_name,
        "NVML and CUDA disagree on the name"
    );
    gpu.assert_no_stub_calls();
}

// ---------------------------------------------------------------------------------------------
// NVML without cuInit, and NVML watching two GPU users (tests/cuda/nvml_test.c, pynvml).

const MIB: u64 = 1 << 20;
/// Device memory each job holds.
const JOB_MIB: u64 = 64;

/// The `{"check":"nvml"}` line of `nvml_test report` on `gpu`.
fn nvml_report(gpu: &SimGpu) -> serde_json::Value {
    let out = gpu.run_ok(compile_driver_c("nvml_test.c"), &["report"]);
    json_check(&out, "nvml")
}

fn pids_in(list: &serde_json::Value) -> Vec<u64> {
    list.as_array()
        .expect("a JSON array")
        .iter()
        .map(|p| p["pid"].as_u64().expect("pid"))
        .collect()
}

/// Jobs that are killed when the test ends, however it ends.
struct Jobs(Vec<Child>);

impl Jobs {
    fn pids(&self) -> Vec<u64> {
        self.0.iter().map(|c| u64::from(c.id())).collect()
    }

    /// Kills the jobs and returns what they printed.
    fn kill(&mut self) -> String {
        let mut text = String::new();
        for mut c in self.0.drain(..) {
            let _ = c.kill();
            let out = c.wait_with_output().expect("wait for a job");
            text.push_str(&describe(&out));
            text.push('\n');
        }
        text
    }
}

impl Drop for Jobs {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts `n` jobs that each hold `JOB_MIB` MiB and keep the device busy for up to a minute.
fn start_jobs(gpu: &SimGpu, n: usize) -> Jobs {
    let bin = compile_driver_c("nvml_test.c");
    Jobs(
        (0..n)
            .map(|_| {
                let mut cmd = Command::new(&bin);
                cmd.args(["job", "60", &JOB_MIB.to_string()]);
                gpu.configure(&mut cmd);
                cmd.stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("start nvml_test job")
            })
            .collect(),
    )
}

#[test]
fn nvml_works_without_cuinit() {
    let gpu = SimGpu::new().memory("12GiB").env("SIMGPU_DEVICES", "2");
    let r = nvml_report(&gpu);
    assert_eq!(r["count"], 2, "{r}");
    assert_eq!(r["total"], 12u64 << 30, "{r}");
    assert_eq!(
        (r["used"].as_u64(), r["free"].as_u64()),
        (Some(0), Some(12 << 30)),
        "{r}"
    );
    assert_eq!(r["util_gpu"], 0, "{r}");
    assert_eq!(r["bus_id"], "00000000:10:00.0", "{r}");
    assert_eq!(r["bus_id_legacy"], "0000:10:00.0", "{r}");
    assert_eq!(r["cc"], serde_json::json!([8, 0]), "{r}");
    let uuid = r["uuid"].as_str().unwrap();
    let groups: Vec<usize> = uuid
        .strip_prefix("GPU-")
        .expect("GPU- prefix")
        .split('-')
        .map(str::len)
        .collect();
    assert_eq!(groups, [8, 4, 4, 4, 12], "{uuid}");
    // An NVML-only process is not a GPU user: the next report does not list the first one.
    let again = nvml_report(&gpu);
    assert!(pids_in(&again["processes"]).is_empty(), "{again}");
    assert!(pids_in(&again["samples"]).is_empty(), "{again}");
    gpu.assert_no_stub_calls();
}

#[test]
fn nvml_init_reports_a_bad_config_once() {
    let gpu = SimGpu::new().memory("banana");
    let mut cmd = Command::new(compile_driver_c("nvml_test.c"));
    cmd.arg("report");
    let out = gpu.run(cmd);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("nvmlInit_v2 = 9 (Driver Not Loaded)"),
        "nvmlInit_v2 should fail with NVML_ERROR_DRIVER_NOT_LOADED\n{}",
        describe(&out)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let naming = stderr
        .lines()
        .filter(|l| l.contains("SIMGPU_MEMORY"))
        .count();
    assert_eq!(
        naming,
        1,
        "one stderr line names SIMGPU_MEMORY\n{}",
        describe(&out)
    );
}

const PYNVML_WATCH: &str = r#"
import json, sys, time
import pynvml as n

pids = {int(p) for p in sys.argv[1:]}
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
deadline = time.time() + 30
while True:
    count = n.nvmlDeviceGetCount()
    mem = n.nvmlDeviceGetMemoryInfo(h)
    mem2 = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
    procs = {p.pid: p.usedGpuMemory for p in n.nvmlDeviceGetComputeRunningProcesses(h)}
    util = n.nvmlDeviceGetUtilizationRates(h)
    try:
        samples = {s.pid: s.smUtil for s in n.nvmlDeviceGetProcessUtilization(h, 0)}
    except n.NVMLError_NotFound:
        samples = {}
    if (pids <= procs.keys() and util.gpu >= 50 and all(samples.get(p, 0) > 0 for p in pids)) \
            or time.time() > deadline:
        break
    time.sleep(0.1)
uuid = n.nvmlDeviceGetUUID(h)
print(json.dumps({
    "check": "pynvml",
    "count": count,
    "used": mem.used,
    "used_v2": mem2.used,
    "total": mem.total,
    "util": util.gpu,
    "processes": {str(k): v for k, v in procs.items()},
    "samples": {str(k): v for k, v in samples.items()},
    "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
    "graphics": len(n.nvmlDeviceGetGraphicsRunningProcesses(h)),
}), flush=True)
n.nvmlShutdown()
"#;

#[test]
fn nvml_sees_two_busy_jobs() {
    let gpu = SimGpu::new().memory("16GiB");
    let mut jobs = start_jobs(&gpu, 2);
    let pids = jobs.pids();

    // From C: poll until both jobs hold their memory and have kept the device busy.
    let deadline = Instant::now() + Duration::from_secs(30);
    let r = loop {
        let r = nvml_report(&gpu);
        let listed = pids_in(&r["processes"]);
        let sampled = pids_in(&r["samples"]);
        let ready = pids
            .iter()
            .all(|p| listed.contains(p) && sampled.contains(p))
            && r["util_gpu"].as_u64().unwrap() >= 50;
        if ready || Instant::now() > deadline {
            break r;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(r["count"], 1, "{r}");
    assert!(
        r["used"].as_u64().unwrap() >= 2 * JOB_MIB * MIB,
        "memory used: {r}"
    );
    assert!(r["util_gpu"].as_u64().unwrap() >= 50, "{r}");
    for pid in &pids {
        let proc_ = r["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pid"] == *pid)
            .unwrap_or_else(|| panic!("job {pid} not listed: {r}"));
        assert_eq!(proc_["used"], JOB_MIB * MIB, "{r}");
        let sample = r["samples"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["pid"] == *pid)
            .unwrap_or_else(|| panic!("no sample for job {pid}: {r}"));
        let sm = sample["sm"].as_u64().unwrap();
        assert!((1..=100).contains(&sm), "smUtil {sm}: {r}");
    }

    // From pynvml.
    let mut args = vec!["-c".to_string(), PYNVML_WATCH.to_string()];
    args.extend(pids.iter().map(u64::to_string));
    let out = gpu.run_ok(torch_python(), &args);
    let p = json_check(&out, "pynvml");
    assert_eq!(p["count"], 1, "{p}");
    assert_eq!(p["total"], 16u64 << 30, "{p}");
    assert!(p["used"].as_u64().unwrap() >= 2 * JOB_MIB * MIB, "{p}");
    assert_eq!(p["used"], p["used_v2"], "{p}");
    assert!(p["util"].as_u64().unwrap() >= 50, "{p}");
    assert_eq!(p["graphics"], 0, "{p}");
    assert_eq!(p["uuid"], r["uuid"], "{p}");
    for pid in &pids {
        let key = pid.to_string();
        assert_eq!(p["processes"][&key], JOB_MIB * MIB, "job {pid}: {p}");
        assert!(
            p["samples"][&key].as_u64().unwrap_or(0) > 0,
            "job {pid}: {p}"
        );
    }

    // The jobs see the same device as NVML.
    let job_log = jobs.kill();
    for line in job_log.lines().filter(|l| l.contains(r#""check":"job""#)) {
        let v: serde_json::Value = serde_json::from_str(line.trim()).expect("job JSON");
        assert_eq!(v["uuid"], r["uuid"], "cuDeviceGetUuid vs nvmlDeviceGetUUID");
    }
    assert_eq!(
        job_log.matches(r#""check":"job""#).count(),
        2,
        "both jobs started:\n{job_log}"
    );

    // Killed jobs leave the process list, and their memory returns to the device.
    let after = nvml_report(&gpu);
    assert!(pids_in(&after["processes"]).is_empty(), "{after}");
    assert_eq!(after["used"], 0, "{after}");
    gpu.assert_no_stub_calls();
}
