//! A device is the node's GPU, whatever ordinal a container's CUDA gives it. Containers are
//! given their GPUs with `CUDA_VISIBLE_DEVICES` (CDI, the device plugin), so a job on the
//! node's GPU 1 sees it as CUDA ordinal 0. Everything libshare shares per device (quotas, what
//! is used, launches, the gate) is indexed by the node's GPU index (NVML's, what `nvidia-smi`
//! and `sharectl set --device` show), on a 2-GPU simgpu:
//! - a production job saturating GPU 0 does not slow an opportunistic job on GPU 1 (near its
//!   solo rate), while an opportunistic job on GPU 0 beside it is paused (the control);
//! - `sharectl set NAME --device 1 --memory 256MiB` limits the container whose process sees
//!   GPU 1 as ordinal 0 (more is refused with CUDA_ERROR_OUT_OF_MEMORY), and `sharectl status`
//!   shows its usage on GPU 1;
//! - with `CUDA_VISIBLE_DEVICES=1,0`, ordinal 0's allocations charge GPU 1 and ordinal 1's GPU 0;
//!   the environment's per-ordinal limit (`CUDA_DEVICE_MEMORY_LIMIT_0`, as HAMi documents it)
//!   lands on the GPU that ordinal is;
//! - a GPU the environment names by UUID (`CUDA_VISIBLE_DEVICES=GPU-…`) is found through NVML
//!   (this one fails with NVML hidden from the shim: it is the UUID match that places it).

use libshare_abi::{DeviceState, State, MAX_DEVICES};
use libshare_tests::{artifacts, compile_gcc, json_check, ok, until, Daemon, Running, SimGpu};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering::Acquire;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// A child killed (and reaped) when dropped, so a failed assertion leaves no job behind.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn two_gpus() -> SimGpu {
    SimGpu::new().with_shim().env("SIMGPU_DEVICES", "2")
}

/// A counter of `st` summed over every device (so a job's rate is measured whichever index its
/// work lands at).
fn total(st: &State, f: impl Fn(&DeviceState) -> u64) -> u64 {
    (0..MAX_DEVICES).map(|d| f(st.device(d))).sum()
}

/// `simjob-saturate ARGS` in `container` of `class`, seeing only the node's GPU(s) `visible`.
fn job(gpu: &SimGpu, container: &str, class: &str, visible: &str, args: &[&str]) -> Running {
    let mut cmd = gpu.command(artifacts().bin("simjob-saturate"));
    cmd.args(args)
        .env("LIBSHARE_CONTAINER", container)
        .env("LIBSHARE_CLASS", class)
        .env("CUDA_VISIBLE_DEVICES", visible);
    gpu.spawn(cmd)
}

/// The GPU time per second (GPU-ms/s) of each of `states` over `span`, measured together.
fn gpu_ms_per_s(states: &[&State], span: Duration) -> Vec<f64> {
    let t0 = Instant::now();
    let g0: Vec<u64> = states
        .iter()
        .map(|s| total(s, |d| d.gpu_ns.load(Acquire)))
        .collect();
    std::thread::sleep(span);
    let secs = t0.elapsed().as_secs_f64();
    states
        .iter()
        .zip(g0)
        .map(|(s, g)| (total(s, |d| d.gpu_ns.load(Acquire)) - g) as f64 / 1e6 / secs)
        .collect()
}

#[test]
fn shim_device_identity_production_on_gpu0_does_not_pause_opportunistic_work_on_gpu1() {
    let gpu = two_gpus();
    let _daemon = Daemon::start(&gpu.shim_state_dir(), &[]);
    let opp_args = ["--kernel-ms", "0.5", "--depth", "4", "--duration", "60s"];
    // The subject on the node's GPU 1 (its ordinal 0) and the control on GPU 0.
    let _opp1 = job(&gpu, "opp1", "opportunistic", "1", &opp_args);
    let _opp0 = job(&gpu, "opp0", "opportunistic", "0", &opp_args);
    let (st1, st0) = (
        gpu.wait_container_state("opp1"),
        gpu.wait_container_state("opp0"),
    );
    for st in [&st1, &st0] {
        until(Duration::from_secs(30), || {
            total(st, |d| d.gpu_ns.load(Acquire)) > 100_000_000
        })
        .expect("the opportunistic jobs run");
    }
    let alone = gpu_ms_per_s(&[&st1, &st0], Duration::from_millis(1000));
    eprintln!(
        "alone: GPU 1 {:.0} GPU-ms/s, GPU 0 {:.0} GPU-ms/s",
        alone[0], alone[1]
    );
    assert!(
        alone[0] > 300.0 && alone[1] > 300.0,
        "each alone on its GPU should take most of it: {alone:?}"
    );

    // Production saturates GPU 0 (its ordinal 0 too).
    let prod = job(
        &gpu,
        "prod",
        "production",
        "0",
        &["--kernel-ms", "2", "--depth", "8", "--duration", "4s"],
    );
    let pst = gpu.wait_container_state("prod");
    until(Duration::from_secs(30), || {
        total(&pst, |d| d.launches.load(Acquire)) > 50
    })
    .expect("production's kernels counted");
    let beside = gpu_ms_per_s(&[&st1, &st0], Duration::from_millis(1000));
    let prod_on = |d: usize| pst.device(d).launches.load(Acquire);
    eprintln!(
        "beside production on GPU 0: GPU 1 {:.0} GPU-ms/s, GPU 0 {:.0} GPU-ms/s \
         (production's launches on GPU 0 {}, on GPU 1 {})",
        beside[0],
        beside[1],
        prod_on(0),
        prod_on(1)
    );
    assert!(
        prod_on(0) > 50 && prod_on(1) == 0,
        "production counted on GPU 0"
    );
    assert!(
        beside[1] < 0.3 * alone[1],
        "control: production should pause the opportunistic job on its own GPU: {:.0} GPU-ms/s against {:.0} alone",
        beside[1],
        alone[1]
    );
    assert!(
        beside[0] > 0.7 * alone[0],
        "production on GPU 0 slowed the opportunistic job on GPU 1: {:.0} GPU-ms/s against {:.0} alone",
        beside[0],
        alone[0]
    );
    drop(prod);
}

/// `hold_memory MODE MIB ORDINAL` in `container`, seeing `visible`; not yet run.
fn hold_memory(
    gpu: &SimGpu,
    container: &str,
    visible: &str,
    (mode, mib, ordinal): (&str, u32, &str),
) -> Command {
    let prog = compile_gcc("hold_memory.c", "hold_memory", &["-lcuda"]);
    let mut cmd = Command::new(prog);
    cmd.args([mode, &mib.to_string(), ordinal]);
    gpu.configure(&mut cmd);
    cmd.env("LIBSHARE_CONTAINER", container)
        .env("CUDA_VISIBLE_DEVICES", visible)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    cmd
}

/// `cmd` (a `hold_memory hold`) started: the job, killed when dropped, and its first line.
fn held(mut cmd: Command) -> (Killed, String) {
    let mut child = Killed(cmd.spawn().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.0.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    (child, line)
}

fn try_alloc(gpu: &SimGpu, container: &str, visible: &str, mib: u32) -> i64 {
    let out = hold_memory(gpu, container, visible, ("try", mib, "0"))
        .output()
        .unwrap();
    json_check(&out, "try")["result"].as_i64().unwrap()
}

#[test]
fn shim_device_identity_sharectl_set_device_1_limits_the_job_that_sees_gpu1_as_ordinal_0() {
    let gpu = two_gpus();
    let mut cmd = gpu.sharectl_cmd(&["daemon", "--trust-env"]);
    cmd.stdout(Stdio::null()).stderr(Stdio::inherit());
    let _daemon = libshare_tests::cgroups::start_daemon(&gpu, cmd);
    // The container exists (the daemon knows it) once a process of it has run.
    assert_eq!(try_alloc(&gpu, "web", "1", 16), 0, "no quota yet");
    let st = gpu.wait_container_state("web");
    ok(&gpu.sharectl(&["set", "web", "--device", "1", "--memory", "256MiB"]));
    until(Duration::from_secs(5), || {
        st.device(1).quota.load(Acquire) == 256 * MIB
    })
    .expect("the quota set on GPU 1");
    assert_eq!(st.device(0).quota.load(Acquire), 0, "GPU 0 has none");
    assert_eq!(
        try_alloc(&gpu, "web", "1", 300),
        2,
        "300 MiB on GPU 1 (ordinal 0 to the job) > its 256 MiB quota: CUDA_ERROR_OUT_OF_MEMORY"
    );
    assert_eq!(
        try_alloc(&gpu, "other", "0", 300),
        0,
        "another container on GPU 0 is not limited"
    );

    // A job holding 100 MiB on GPU 1: `sharectl status` shows it there.
    let (_holder, line) = held(hold_memory(&gpu, "web", "1", ("hold", 100, "0")));
    assert!(line.contains("\"result\":0"), "holding 100 MiB: {line}");
    let v: serde_json::Value =
        serde_json::from_str(&ok(&gpu.sharectl(&["status", "--json"]))).unwrap();
    let web = v["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["container"] == "web")
        .unwrap_or_else(|| panic!("no web in {v}"))
        .clone();
    let devices = web["devices"].as_array().unwrap();
    let on = |dev: u64| devices.iter().find(|d| d["device"] == dev);
    let gpu1 = on(1).unwrap_or_else(|| panic!("nothing on GPU 1: {web}"));
    assert_eq!(gpu1["used_bytes"], 100 * MIB, "{web}");
    assert_eq!(gpu1["quota_bytes"], 256 * MIB, "{web}");
    assert!(
        on(0).is_none_or(|d| d["used_bytes"] == 0),
        "nothing used on GPU 0: {web}"
    );
}

#[test]
fn shim_device_identity_a_reordered_visible_list_charges_the_gpu_each_ordinal_is() {
    let gpu = two_gpus();
    let held = |ordinal: &str, mib: u32| {
        let mut cmd = hold_memory(&gpu, "swapped", "1,0", ("hold", mib, ordinal));
        // Ordinal 0 is the node's GPU 1: its limit lands there.
        cmd.env("CUDA_DEVICE_MEMORY_LIMIT_0", "128MiB");
        held(cmd)
    };
    let (_a, line) = held("0", 64);
    assert!(line.contains("\"result\":0"), "64 MiB on ordinal 0: {line}");
    let st = gpu.wait_container_state("swapped");
    assert_eq!(
        st.device(1).used.load(Acquire),
        64 * MIB,
        "ordinal 0 is GPU 1"
    );
    assert_eq!(st.device(0).used.load(Acquire), 0);
    assert_eq!(
        st.device(1).quota.load(Acquire),
        128 * MIB,
        "ordinal 0's limit"
    );
    assert_eq!(st.device(0).quota.load(Acquire), 0);
    let (_b, line) = held("1", 32);
    assert!(line.contains("\"result\":0"), "32 MiB on ordinal 1: {line}");
    assert_eq!(
        st.device(0).used.load(Acquire),
        32 * MIB,
        "ordinal 1 is GPU 0"
    );
    assert_eq!(st.device(1).used.load(Acquire), 64 * MIB);
    // Ordinal 0's limit is GPU 1's: 64 held + 100 MiB more does not fit there.
    let (_c, line) = held("0", 100);
    assert!(
        line.contains("\"result\":2"),
        "GPU 1 over its limit: {line}"
    );
}

#[test]
fn shim_device_identity_a_gpu_named_by_uuid_is_found_through_nvml() {
    // Only NVML can place a GPU the environment names by UUID: the shim matches the ordinal's
    // cuDeviceGetUuid with NVML's devices.
    const GPU1: &str = "GPU-11111111-2222-3333-4444-555555555555";
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("simgpu.toml");
    std::fs::write(
        &config,
        format!(
            "[[device]]\nuuid = \"GPU-00000000-2222-3333-4444-555555555555\"\n\
             [[device]]\nuuid = \"{GPU1}\"\n"
        ),
    )
    .unwrap();
    let gpu = SimGpu::new().with_shim().env("SIMGPU_CONFIG", &config);
    let (child, line) = held(hold_memory(&gpu, "by-uuid", GPU1, ("hold", 64, "0")));
    let st = gpu.wait_container_state("by-uuid");
    let used = (
        st.device(0).used.load(Acquire),
        st.device(1).used.load(Acquire),
    );
    drop(child);
    assert!(line.contains("\"result\":0"), "64 MiB on {GPU1}: {line}");
    assert_eq!(
        used,
        (0, 64 * MIB),
        "the GPU named by UUID is the node's GPU 1"
    );
}
