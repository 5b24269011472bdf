//! Issue 20, Build 2: an opportunistic container allowed to oversubscribe (`CUDA_OVERSUBSCRIBE`,
//! HAMi's variable, or `sharectl set --oversubscribe`) gets managed memory for `cuMemAlloc` and
//! `cuMemAllocPitch`: its quota limits its footprint, which may exceed the device, and every byte
//! it wrote reads back. Without the setting, or as production, allocations stay device memory
//! and the device's size is the end. What cannot be managed (stream-ordered pools, VMM) stays
//! device memory and a request larger than the device is a clean `CUDA_ERROR_OUT_OF_MEMORY`.
//! The program is `tests/cuda/oversub.c` (32 MiB pieces, each filled and touched by a kernel).

use libshare_tests::{
    compile_gcc, describe, json_check, json_lines, ok, python_source, torch_python, SimGpu,
};
use std::process::Stdio;

const OOM: i64 = 2; // CUDA_ERROR_OUT_OF_MEMORY

fn run(gpu: &SimGpu, target_mib: u64) -> serde_json::Value {
    let bin = compile_gcc("oversub.c", "oversub", &["-lcuda"]);
    let out = gpu.run_cmd_ok(|| {
        let mut c = gpu.command(&bin);
        c.arg(target_mib.to_string());
        c
    });
    json_check(&out, "oversub")
}

/// A 128 MiB device with the shim, a container of `class`.
fn machine(class: &str) -> SimGpu {
    SimGpu::new()
        .memory("128MiB")
        .with_shim()
        .env("LIBSHARE_CONTAINER", "batch")
        .env("LIBSHARE_CLASS", class)
}

#[test]
fn an_oversubscribing_opportunistic_job_holds_more_than_the_device_with_every_byte_intact() {
    // 320 MiB on a 128 MiB device, under a 384 MiB quota.
    let gpu = machine("opportunistic")
        .env("CUDA_OVERSUBSCRIBE", "true")
        .quota("384MiB");
    let v = run(&gpu, 320);
    assert_eq!(v["allocated_mib"], 320, "{v}");
    assert_eq!(v["alloc_error"], 0, "{v}");
    assert_eq!(
        v["managed"], v["pieces"],
        "every piece is managed memory: {v}"
    );
    assert_eq!(v["bad_words"], 0, "every word read back as written: {v}");
    // The job sees a device of its quota: 384 MiB, 64 MiB of it free with 320 MiB held.
    assert_eq!(v["total_mib"], 384, "{v}");
    assert_eq!(v["free_mib"], serde_json::json!([384, 64, 384]), "{v}");
    // What stays device memory: a pool allocation (not managed) and a VMM allocation fit (the
    // driver evicts managed memory for them); one larger than the device is refused cleanly.
    assert_eq!(v["pool_rc"], 0, "{v}");
    assert_eq!(v["pool_managed"], 0, "{v}");
    assert_eq!(v["vmm_rc"], 0, "{v}");
    assert_eq!(v["vmm_big_rc"], OOM, "{v}");
    assert_eq!(v["array_rc"], 0, "a CUDA array stays device memory: {v}");
    // Managed memory cannot be exported over IPC (CUDA's IPC is for cuMemAlloc memory): the
    // driver's error code, not a crash.
    assert_eq!(v["ipc_rc"], 1, "CUDA_ERROR_INVALID_VALUE: {v}");
}

#[test]
fn the_quota_still_limits_an_oversubscribing_jobs_footprint() {
    let gpu = machine("opportunistic")
        .env("CUDA_OVERSUBSCRIBE", "true")
        .quota("256MiB");
    let v = run(&gpu, 512);
    assert_eq!(v["allocated_mib"], 256, "{v}");
    assert_eq!(v["alloc_error"], OOM, "{v}");
    assert_eq!(v["bad_words"], 0, "{v}");
    let state = gpu.container_state("batch");
    assert_eq!(
        state
            .device(0)
            .used
            .load(std::sync::atomic::Ordering::Acquire),
        0,
        "everything freed is back in the quota"
    );
}

#[test]
fn without_the_setting_an_opportunistic_job_stops_at_the_device() {
    let v = run(&machine("opportunistic"), 320);
    assert_eq!(v["alloc_error"], OOM, "{v}");
    assert_eq!(v["allocated_mib"], 128, "{v}");
    assert_eq!(v["managed"], 0, "{v}");
    assert_eq!(v["bad_words"], 0, "{v}");
    assert_eq!(v["ipc_rc"], 0, "device memory exports: {v}");
}

#[test]
fn production_allocations_stay_device_memory_whatever_the_setting() {
    let v = run(
        &machine("production").env("CUDA_OVERSUBSCRIBE", "true"),
        320,
    );
    assert_eq!(v["alloc_error"], OOM, "{v}");
    assert_eq!(v["allocated_mib"], 128, "{v}");
    assert_eq!(v["managed"], 0, "{v}");
    // A production limit above the device is still a configuration error, in one line.
    let gpu = machine("production")
        .env("CUDA_OVERSUBSCRIBE", "true")
        .quota("384MiB");
    let bin = compile_gcc("oversub.c", "oversub", &["-lcuda"]);
    let mut c = gpu.command(&bin);
    c.arg("64");
    let out = gpu.run_cmd(c);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("LIBSHARE_MEMORY_LIMIT") && err.contains("CUDA_OVERSUBSCRIBE=true"),
        "{err}"
    );
}

#[test]
fn a_bad_oversubscribe_value_is_one_line_at_cuinit() {
    let gpu = machine("opportunistic").env("CUDA_OVERSUBSCRIBE", "yes please");
    let bin = compile_gcc("oversub.c", "oversub", &["-lcuda"]);
    let mut c = gpu.command(&bin);
    c.arg("32");
    let out = gpu.run_cmd(c);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("invalid CUDA_OVERSUBSCRIBE=\"yes please\""),
        "{err}"
    );
}

#[test]
fn sharectl_set_oversubscribe_lets_a_container_exceed_the_device_and_is_taken_back() {
    // The daemon's word: a quota above the device is refused unless the container may
    // oversubscribe; with `--oversubscribe` its job (no such variable in its environment) gets
    // managed memory; `--no-oversubscribe` takes it back for the next allocation.
    let gpu = SimGpu::new()
        .memory("128MiB")
        .with_shim()
        .env("LIBSHARE_CONTAINER", "batch");
    let mut cmd = gpu.sharectl_cmd(&["daemon", "--trust-env"]);
    cmd.stdout(Stdio::null()).stderr(Stdio::inherit());
    let _daemon = libshare_tests::cgroups::start_daemon(&gpu, cmd);
    let no = gpu.sharectl(&[
        "set",
        "batch",
        "--class",
        "opportunistic",
        "--memory",
        "384MiB",
    ]);
    assert!(!no.status.success());
    let err = String::from_utf8_lossy(&no.stderr);
    assert!(
        err.contains("above device 0's memory") && err.contains("--oversubscribe"),
        "{err}"
    );
    ok(&gpu.sharectl(&[
        "set",
        "batch",
        "--class",
        "opportunistic",
        "--memory",
        "384MiB",
        "--oversubscribe",
    ]));
    assert!(ok(&gpu.sharectl(&["get", "batch"])).contains("oversubscribe=true"));
    let v = run(&gpu, 320);
    assert_eq!(
        (&v["allocated_mib"], &v["bad_words"], &v["total_mib"]),
        (&320.into(), &0.into(), &384.into()),
        "{v}"
    );
    assert_eq!(v["managed"], v["pieces"], "{v}");
    ok(&gpu.sharectl(&["set", "batch", "--no-oversubscribe"]));
    let v = run(&gpu, 320);
    assert_eq!(v["alloc_error"], OOM, "{v}");
    assert_eq!(v["managed"], 0, "{v}");
}

const GIB: u64 = 1 << 30;

/// Runs `tests/python/<script> args…` with the torch venv on `gpu` and returns each step's
/// JSON line, every one of `steps` present and ok; None (after `skip`) without the venv.
fn torch_steps(
    gpu: &SimGpu,
    script: &str,
    args: &[u64],
    steps: &[&str],
) -> Option<Vec<serde_json::Value>> {
    if !torch_python().exists() {
        libshare_tests::skip(&format!(
            "no PyTorch venv at {} (scripts/fetch-cuda.sh installs it)",
            torch_python().display()
        ));
        return None;
    }
    let out = gpu.run_cmd_ok(|| {
        let mut cmd = gpu.command(torch_python());
        cmd.arg(python_source(script));
        cmd.args(args.iter().map(u64::to_string));
        cmd
    });
    let lines = json_lines(&out);
    let step = |name: &str| {
        lines
            .iter()
            .find(|v| v["step"] == name)
            .unwrap_or_else(|| panic!("step {name} missing\n{}", describe(&out)))
            .clone()
    };
    let found: Vec<serde_json::Value> = steps.iter().map(|s| step(s)).collect();
    for v in &found {
        assert_eq!(v["ok"], true, "{v}");
    }
    Some(found)
}

#[test]
fn pytorch_keeps_working_past_the_device_memory_when_oversubscribing() {
    // PyTorch's caching allocator (cudaMalloc → cuMemAlloc_v2 → managed memory) on a 1 GiB
    // device under a 2 GiB quota: 1.5 GiB of tensors read back their values, a model trains
    // with all of it held, mem_get_info and the device properties show the quota, past the
    // quota is torch.OutOfMemoryError (`tests/python/torch_oversub.py`).
    let gpu = machine("opportunistic")
        .memory("1GiB")
        .env("CUDA_OVERSUBSCRIBE", "true")
        .env("PYTORCH_CUDA_ALLOC_CONF", "")
        .quota("2GiB");
    let steps = ["init", "fill", "train", "over_quota", "freed"];
    if let Some(s) = torch_steps(&gpu, "torch_oversub.py", &[GIB, 2 * GIB], &steps) {
        assert_eq!(s[1]["tensors"], 24, "{}", s[1]);
    }
}

/// `tests/python/shim_quota.py` (1 GiB quota on an 8 GiB device) as an oversubscribing
/// opportunistic job whose allocator never calls cuMemAlloc: every step passes (the quota holds,
/// `torch.OutOfMemoryError` past it, the memory comes back).
fn torch_device_memory_paths(alloc_conf: &str) {
    let gpu = machine("opportunistic")
        .memory("8GiB")
        .env("CUDA_OVERSUBSCRIBE", "true")
        .env("PYTORCH_CUDA_ALLOC_CONF", alloc_conf)
        .quota("1GiB");
    let steps = [
        "init",
        "fill",
        "over_quota",
        "still_usable",
        "freed",
        "again",
    ];
    if let Some(s) = torch_steps(&gpu, "shim_quota.py", &[GIB], &steps) {
        assert_eq!(s[2]["error"], "OutOfMemoryError", "{}", s[2]);
    }
}

#[test]
fn pytorch_expandable_segments_stay_device_memory_under_the_quota() {
    torch_device_memory_paths("expandable_segments:True");
}

#[test]
fn pytorch_cuda_malloc_async_stays_device_memory_under_the_quota() {
    torch_device_memory_paths("backend:cudaMallocAsync");
}

#[test]
fn production_gets_its_quota_beside_an_opportunistic_job_holding_the_device_resident() {
    // Today's protection (the demotion protocol is not built): the driver evicts opportunistic
    // managed memory for production's device allocations. An opportunistic process holds
    // 112 MiB resident on the 128 MiB device; production's 96 MiB quota is all there, every
    // byte intact.
    let gpu = machine("production").quota("96MiB");
    let mut hold = gpu.command(compile_gcc("sim_managed.c", "sim_managed", &["-lcuda"]));
    hold.args(["hold", "112"])
        .env("LIBSHARE_CLASS", "opportunistic");
    hold.env("LIBSHARE_CONTAINER", "batch2")
        .env("LIBSHARE_MEMORY_LIMIT", "120MiB");
    let mut holder = gpu.spawn(hold);
    holder.wait_for_line(r#"{"check":"hold"}"#);
    let mut prod = gpu.command(compile_gcc("oversub.c", "oversub", &["-lcuda"]));
    prod.arg("96").env("LIBSHARE_CONTAINER", "prod");
    let v = json_check(&gpu.run_cmd(prod), "oversub");
    assert_eq!(
        (
            &v["allocated_mib"],
            &v["alloc_error"],
            &v["bad_words"],
            &v["managed"]
        ),
        (&96.into(), &0.into(), &0.into(), &0.into()),
        "{v}"
    );
    holder.close_stdin();
    holder.finish();
}

/// A v1 memory cgroup of `limit` bytes for this test (removed when dropped), or None after a
/// skip line where it cannot be made.
struct MemoryCgroup(std::path::PathBuf);

impl MemoryCgroup {
    fn new(name: &str, limit: u64) -> Option<MemoryCgroup> {
        let cg = std::path::Path::new("/sys/fs/cgroup/memory")
            .join(format!("libshare-test-{name}-{}", std::process::id()));
        if let Err(e) = std::fs::create_dir(&cg) {
            libshare_tests::skip(&format!(
                "cannot create a v1 memory cgroup at {}: {e}",
                cg.display()
            ));
            return None;
        }
        let cg = MemoryCgroup(cg);
        std::fs::write(cg.0.join("memory.limit_in_bytes"), limit.to_string()).unwrap();
        Some(cg)
    }

    /// `bin args…` started in this cgroup (moved there before it execs).
    fn command(&self, gpu: &SimGpu, bin: &std::path::Path, args: &[&str]) -> std::process::Command {
        let mut c = gpu.command("sh");
        c.arg("-c")
            .arg(r#"echo $$ > "$0/cgroup.procs" && shift && exec "$@""#)
            .arg(&self.0)
            .arg("-")
            .arg(bin)
            .args(args);
        c
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn a_host_short_of_memory_for_demoted_pages_refuses_the_allocation_in_one_line() {
    // Issue 20, must-show 7: the job's memory cgroup (v1) holds 192 MiB; an oversubscribing
    // job asking for 320 MiB in 32 MiB pieces on a 128 MiB device (quota 1 GiB) gets managed
    // memory while the host can hold its pages, then CUDA_ERROR_OUT_OF_MEMORY and one line —
    // not the OOM killer (on simgpu the device's memory is the process's host memory too, so
    // the cgroup bounds both). Every byte it wrote reads back; the refusal is counted.
    let Some(cg) = MemoryCgroup::new("host-short", 192 << 20) else {
        return;
    };
    let gpu = machine("opportunistic")
        .env("CUDA_OVERSUBSCRIBE", "true")
        .quota("1GiB");
    let bin = compile_gcc("oversub.c", "oversub", &["-lcuda"]);
    let out = gpu.run_cmd(cg.command(&gpu, &bin, &["320"]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}", describe(&out));
    let v = json_check(&out, "oversub");
    assert_eq!(v["alloc_error"], OOM, "{v}");
    let mib = v["allocated_mib"].as_u64().unwrap();
    assert!(
        (32..192).contains(&mib),
        "{mib} MiB before the refusal: {v}"
    );
    assert_eq!(v["managed"], v["pieces"], "{v}");
    assert_eq!(v["bad_words"], 0, "{v}");
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("refused an oversubscribing allocation"))
        .collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    assert!(
        lines[0].contains("host") && lines[0].contains("sharectl set --memory"),
        "{}",
        lines[0]
    );
    let refused = gpu
        .container_state("batch")
        .device(0)
        .oom
        .load(std::sync::atomic::Ordering::Acquire);
    assert!(refused >= 1, "the refusal is counted");
}

/// Issue 30, B6a: the host-memory check reserves. Under a 192 MiB memory cgroup, an
/// oversubscribing container (128 MiB device, 1 GiB quota, no daemon) asks for 100 MiB pieces
/// of managed memory it never touches (so they take no host memory yet, as on a GPU): each one
/// alone fits the host, two do not. `demote take alloc 100 N` holds what it got.
fn take_managed(gpu: &SimGpu, cg: &MemoryCgroup, n: u32) -> libshare_tests::Running {
    let bin = compile_gcc("demote.c", "demote", &["-lcuda"]);
    let mut h = gpu.spawn(cg.command(gpu, &bin, &["take", "alloc", "100", &n.to_string()]));
    h.wait_for_line(r#"{"check":"ready"}"#);
    h
}

fn oversubscribing_gpu() -> SimGpu {
    machine("opportunistic")
        .env("CUDA_OVERSUBSCRIBE", "true")
        .quota("1GiB")
}

#[test]
fn the_host_check_counts_the_containers_whole_managed_footprint() {
    // The audit's repro: 4 × 768 MiB managed under a 1 GiB cgroup were all accepted (each
    // checked alone). Here three 100 MiB pieces under 192 MiB: the first fits, the second would
    // take the footprint to 200 MiB.
    let Some(cg) = MemoryCgroup::new("host-footprint", 192 << 20) else {
        return;
    };
    let gpu = oversubscribing_gpu();
    let mut h = take_managed(&gpu, &cg, 3);
    h.send("go\n");
    let v = h.wait_for_check("take");
    assert_eq!((&v["ok"], &v["error"]), (&1.into(), &OOM.into()), "{v}");
    let out = h.finish();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("refused an oversubscribing allocation") && err.contains("200 MiB with it"),
        "{err}"
    );
}

#[test]
fn two_racing_processes_cannot_both_pass_the_host_check() {
    // The audit's second repro: two jobs of one container, 768 MiB each, both accepted. Here
    // two processes, 100 MiB each under 192 MiB, told to allocate at the same moment: exactly
    // one gets it, whatever the order (the footprint is reserved in the container's state).
    let Some(cg) = MemoryCgroup::new("host-race", 192 << 20) else {
        return;
    };
    let gpu = oversubscribing_gpu();
    for round in 0..3 {
        let (mut a, mut b) = (take_managed(&gpu, &cg, 1), take_managed(&gpu, &cg, 1));
        a.send("go\n");
        b.send("go\n");
        let (va, vb) = (a.wait_for_check("take"), b.wait_for_check("take"));
        let oks = va["ok"].as_i64().unwrap() + vb["ok"].as_i64().unwrap();
        assert_eq!(oks, 1, "round {round}: {va} {vb}");
        a.finish();
        b.finish();
    }
}
