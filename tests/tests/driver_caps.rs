//! Issue 22, driver-enforced caps: on a driver with per-cgroup memory limits (NVML's
//! `nvmlDeviceSetMemoryLimits_v1`, r615+; simgpu configured as such a driver), a root
//! `sharectl daemon` sets each container's quota as its cgroup's hard limit (production's as the
//! soft limit too), so a process in the container's cgroup that bypasses the preload gets
//! `CUDA_ERROR_OUT_OF_MEMORY` at the quota; the limit is read back with
//! `nvmlDeviceGetMemoryLimits_v1` and cleared when the container goes. On an older driver
//! (simgpu without the call) the daemon says once that the shim alone enforces quotas, and the
//! same process is not held.

use libshare_tests::cgroups::{
    bypassing, driver_limits as limits, holder_in, start_daemon, untrusting_daemon_cmd, Cgroups,
};
use libshare_tests::{skip, until, SimGpu};
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;
use std::time::Duration;

const MIB: u64 = 1 << 20;
/// `NVML_DEVICE_MEMORY_LIMIT_MAX` as simgpu models it.
const NO_LIMIT: u64 = u64::MAX;
/// The first CUDA driver version simgpu reports as branch 615 (`nvmlSystemGetDriverVersion`).
const R615: &str = "13070";

fn set(gpu: &SimGpu, args: &[&str]) {
    let out = gpu.sharectl(args);
    assert!(
        out.status.success(),
        "sharectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A machine the non-root jobs may use, and a root daemon for it (stderr piped).
fn machine(driver_version: &str) -> Option<(SimGpu, Cgroups, libshare_tests::Daemon)> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        skip("the driver takes memory limits from root only: run the test as root");
        return None;
    }
    let cg = Cgroups::create(&["capped", "free"])?;
    let gpu = SimGpu::new()
        .memory("4GiB")
        .env("SIMGPU_DRIVER_VERSION", driver_version)
        .with_shim();
    std::fs::set_permissions(gpu.state_dir(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let mut cmd = untrusting_daemon_cmd(&gpu, &cg.prefix, &[]);
    cmd.stderr(Stdio::piped());
    let d = start_daemon(&gpu, cmd);
    set(
        &gpu,
        &[
            "set",
            "capped",
            "--memory",
            "256MiB",
            "--class",
            "production",
        ],
    );
    set(
        &gpu,
        &["set", "free", "--memory", "256MiB", "--class", "production"],
    );
    Some((gpu, cg, d))
}

/// Stops the daemon and returns what it logged.
fn stop(mut d: libshare_tests::Daemon) -> String {
    // SAFETY: kill on the daemon's own pid, which the test started.
    unsafe { libc::kill(d.0.id() as i32, libc::SIGTERM) };
    let mut log = String::new();
    d.0.stderr.take().unwrap().read_to_string(&mut log).unwrap();
    let _ = d.0.wait();
    log
}

#[test]
fn driver_caps_hold_a_process_that_bypasses_the_preload() {
    let Some((gpu, cg, d)) = machine(R615) else {
        return;
    };
    let ns = std::path::Path::new("/sys/fs/cgroup/pids")
        .join(cg.prefix.trim_start_matches('/'))
        .join("capped");
    // Before any of the container's processes registered, the daemon knows no cgroup of it.
    let v = limits(&gpu, &ns);
    assert_eq!(
        (v["result"].as_i64(), v["hard"].as_u64()),
        (Some(0), Some(NO_LIMIT)),
        "{v}"
    );

    // A shimmed job of the container registers from its cgroup; the daemon sets the cgroup's
    // limits in the driver: hard = the quota, soft = the quota (production's guarantee).
    let mut job = holder_in(&gpu, &cg, "capped", "capped", 64);
    let mut v = serde_json::Value::Null;
    until(Duration::from_secs(10), || {
        v = limits(&gpu, &ns);
        v["hard"].as_u64() == Some(256 * MIB)
    })
    .unwrap_or_else(|| panic!("the daemon never set the cgroup's hard limit: {v}"));
    assert_eq!(
        v["soft"].as_u64(),
        Some(256 * MIB),
        "production's guarantee: {v}"
    );
    assert_eq!(v["used"].as_u64(), Some(64 * MIB), "the job's 64 MiB: {v}");

    // A process of the same cgroup that bypasses the preload: the driver stops it at the
    // quota (64 MiB held by the job + 3 × 64 MiB = 256 MiB; the 4th is refused).
    let f = bypassing(&gpu, &cg, "capped", "fill 64 1024");
    assert_eq!(
        f["result"].as_i64(),
        Some(2),
        "CUDA_ERROR_OUT_OF_MEMORY at the limit: {f}"
    );
    assert_eq!(f["allocated_mib"].as_u64(), Some(192), "{f}");
    // The same process in a cgroup none of whose processes registered is not held (the
    // daemon does not know its cgroup): what the cap above is, not the device.
    let free = bypassing(&gpu, &cg, "free", "fill 64 1024");
    assert_eq!(
        (free["result"].as_i64(), free["allocated_mib"].as_u64()),
        (Some(0), Some(1024)),
        "{free}"
    );

    // A new quota reaches the driver.
    set(
        &gpu,
        &[
            "set",
            "capped",
            "--memory",
            "512MiB",
            "--class",
            "opportunistic",
        ],
    );
    until(Duration::from_secs(10), || {
        v = limits(&gpu, &ns);
        v["hard"].as_u64() == Some(512 * MIB)
    })
    .unwrap_or_else(|| panic!("the new quota never reached the driver: {v}"));
    assert_eq!(
        v["soft"].as_u64(),
        Some(0),
        "no guarantee for opportunistic: {v}"
    );
    let f = bypassing(&gpu, &cg, "capped", "fill 64 1024");
    assert_eq!(
        (f["result"].as_i64(), f["allocated_mib"].as_u64()),
        (Some(2), Some(448)),
        "{f}"
    );

    // The container goes (its job ends, its state is removed): the limits are cleared.
    let _ = job.kill();
    let _ = job.wait();
    std::fs::remove_dir_all(gpu.shim_state_dir().join("containers").join("capped")).unwrap();
    until(Duration::from_secs(10), || {
        v = limits(&gpu, &ns);
        v["hard"].as_u64() == Some(NO_LIMIT)
    })
    .unwrap_or_else(|| panic!("the limits outlived the container: {v}"));
    assert_eq!(v["soft"].as_u64(), Some(0), "{v}");
    let log = stop(d);
    assert!(log.contains("driver memory caps on"), "{log}");
    assert!(!log.contains("shim alone enforces quotas"), "{log}");
}

#[test]
fn driver_caps_older_driver_is_said_once_and_the_shim_alone_enforces() {
    let Some((gpu, cg, d)) = machine("13050") else {
        return;
    };
    let ns = std::path::Path::new("/sys/fs/cgroup/pids")
        .join(cg.prefix.trim_start_matches('/'))
        .join("capped");
    // NVML_ERROR_FUNCTION_NOT_FOUND: this driver has no per-cgroup limits.
    assert_eq!(limits(&gpu, &ns)["result"].as_i64(), Some(13));
    // Jobs register and run under the shim's quota as before …
    let mut job = holder_in(&gpu, &cg, "capped", "capped", 64);
    let held = gpu.container_state("capped");
    assert_eq!(
        held.device(0)
            .quota
            .load(std::sync::atomic::Ordering::Acquire),
        256 * MIB
    );
    // … and a process that bypasses the preload is not held by the driver.
    let f = bypassing(&gpu, &cg, "capped", "fill 64 1024");
    assert_eq!(
        (f["result"].as_i64(), f["allocated_mib"].as_u64()),
        (Some(0), Some(1024)),
        "{f}"
    );
    let _ = job.kill();
    let _ = job.wait();
    let log = stop(d);
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("shim alone enforces quotas"))
        .collect();
    assert_eq!(lines.len(), 1, "one line, whatever registered: {log}");
    assert!(
        lines[0].contains("nvmlDeviceSetMemoryLimits_v1"),
        "{}",
        lines[0]
    );
}

/// Issue 30, B5b: in HAMi mode the daemon adopted `CUDA_DEVICE_MEMORY_LIMIT_0=…
/// CUDA_TASK_PRIORITY=0` from the first registering process's environment — which the tenant
/// writes — as production with the driver's soft (guaranteed) limit at the quota. The quota may
/// still come from there (it only limits the container), but never a guarantee.
#[test]
fn hami_mode_sets_no_guarantee_from_the_tenants_environment() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        skip("the driver takes memory limits from root only: run the test as root");
        return;
    }
    let Some(cg) = Cgroups::create(&["capped"]) else {
        return;
    };
    let gpu = SimGpu::new()
        .memory("4GiB")
        .env("SIMGPU_DRIVER_VERSION", R615)
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "256m")
        .env("CUDA_TASK_PRIORITY", "0")
        .with_shim();
    std::fs::set_permissions(gpu.state_dir(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let mut cmd = untrusting_daemon_cmd(&gpu, &cg.prefix, &["--hami"]);
    cmd.stderr(Stdio::piped());
    let d = start_daemon(&gpu, cmd);
    let ns = std::path::Path::new("/sys/fs/cgroup/pids")
        .join(cg.prefix.trim_start_matches('/'))
        .join("capped");
    let mut job = holder_in(&gpu, &cg, "capped", "capped", 64);
    let mut v = serde_json::Value::Null;
    until(Duration::from_secs(10), || {
        v = limits(&gpu, &ns);
        v["hard"].as_u64() == Some(256 * MIB)
    })
    .unwrap_or_else(|| panic!("the daemon never set the adopted hard limit: {v}"));
    assert_eq!(
        v["soft"].as_u64(),
        Some(0),
        "a guarantee from the environment: {v}"
    );
    let _ = job.kill();
    let _ = job.wait();
    stop(d);
}
