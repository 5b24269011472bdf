//! Kernel slicing (issue 31, build 3) on simgpu with the shim and a real `sharectl daemon`:
//! beside production, an opportunistic job whose 10 ms kernels are loaded as PTX (`simjob-saturate
//! --op blocks`: waves of blocks) has them cut into block ranges of about the latency budget, and
//! gets far more of the GPU than when they go whole (held, as kernels longer than production's
//! gaps are), with production's requests as bounded; a 10 ms kernel of one block cannot be cut,
//! goes whole and is counted `unsliced`; a cudart program's kernels are cut through the PTX
//! its fatbin carries (`cuLibraryLoadData`), and go whole, counted, when it carries cubins only;
//! `LIBSHARE_SLICING=off` turns it off, and a bad value is one line.
//!
//! The observables are the containers' shared words (`libshare_abi::State`: `gpu_ns`, `sliced`,
//! `unsliced`) and the production job's own per-request trace; simgpu's own state is not used.

use libshare_tests::{artifacts, compile_cu_for, describe, CudartLink, Daemon, SimGpu};
use std::sync::atomic::Ordering::Acquire;
use std::time::Duration;

/// Production inference, open loop: 40 requests/s arriving as a Poisson process (the same seed,
/// the same times in every run), 4 ms of GPU time in 2 kernels each, one trace line each. Its
/// gaps are not predictable: whole 10 ms kernels rarely find one they fit.
fn infer(gpu: &SimGpu, secs: f64) -> libshare_tests::Running {
    let mut cmd = gpu.command(artifacts().bin("simjob-infer"));
    cmd.args(["--rate", "40", "--gpu-ms", "4", "--kernels", "2", "--trace"])
        .args(["--arrivals", "poisson", "--seed", "1"])
        .args(["--duration", &format!("{secs}s")])
        .env("LIBSHARE_CONTAINER", "prod")
        .env("LIBSHARE_CLASS", "production");
    gpu.spawn(cmd)
}

/// An opportunistic job of 10 ms kernels (`op`: `blocks`, waves of blocks; `kernel`, one block).
fn saturate(gpu: &SimGpu, container: &str, op: &str, slicing: &str) -> libshare_tests::Running {
    let mut cmd = gpu.command(artifacts().bin("simjob-saturate"));
    cmd.args([
        "--op",
        op,
        "--kernel-ms",
        "10",
        "--depth",
        "2",
        "--duration",
        "4s",
    ])
    .env("LIBSHARE_CONTAINER", container)
    .env("LIBSHARE_CLASS", "opportunistic")
    .env("LIBSHARE_SLICING", slicing);
    gpu.spawn(cmd)
}

/// Latencies (ms) of the requests of a `--trace` output due after `from` s of the job.
fn latencies(stdout: &[u8], from: f64) -> Vec<f64> {
    let mut xs: Vec<f64> = String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["event"] == "request" && v["t"].as_f64().is_some_and(|t| t >= from))
        .filter_map(|v| v["latency_ms"].as_f64())
        .collect();
    xs.sort_by(f64::total_cmp);
    xs
}

fn percentile(xs: &[f64], p: f64) -> f64 {
    assert!(!xs.is_empty(), "no requests");
    xs[((xs.len() - 1) as f64 * p / 100.0).round() as usize]
}

/// An opportunistic cudart program (`tests/cuda/rt_spin.cu`, built with nvcc's `targets`):
/// 10 ms kernels of waves of blocks for 4 s, launched by cudart from its registered fatbin.
fn rt_spin(gpu: &SimGpu, tag: &str, targets: &[&str]) -> libshare_tests::Running {
    let program = compile_cu_for("rt_spin.cu", CudartLink::Shared, tag, targets);
    let mut cmd = gpu.command(program);
    // simgpu's default wave is 10 us: 1000 waves make 10 ms.
    cmd.args(["4", "10", "10"])
        .env("LIBSHARE_CONTAINER", "opp")
        .env("LIBSHARE_CLASS", "opportunistic");
    gpu.spawn(cmd)
}

/// One run: production for 6 s, the opportunistic job from 1.5 s for 4 s. Returns the job's
/// container's (gpu_ns, sliced, unsliced) and production's latencies beside it.
fn run(op: &str, slicing: &str) -> ((u64, u64, u64), Vec<f64>) {
    run_beside_production(|gpu| saturate(gpu, "opp", op, slicing))
}

fn run_beside_production(
    job: impl FnOnce(&SimGpu) -> libshare_tests::Running,
) -> ((u64, u64, u64), Vec<f64>) {
    let gpu = SimGpu::new().with_shim();
    let _daemon = Daemon::start(&gpu.shim_state_dir(), &["--latency-budget", "2ms"]);
    let prod = infer(&gpu, 6.0);
    let prod_state = gpu.wait_container_state("prod");
    libshare_tests::until(Duration::from_secs(20), || {
        prod_state.device(0).launches.load(Acquire) > 40
    })
    .expect("production's first requests");
    let out = job(&gpu).finish();
    assert!(out.status.success(), "{}", describe(&out));
    let st = gpu.wait_container_state("opp");
    let d = st.device(0);
    let counts = (
        d.gpu_ns.load(Acquire),
        d.sliced.load(Acquire),
        d.unsliced.load(Acquire),
    );
    let out = prod.finish();
    assert!(out.status.success(), "{}", describe(&out));
    // Requests from 1.5 s on met the job (the job's clock starts after its own start-up).
    (counts, latencies(&out.stdout, 1.5))
}

#[test]
fn long_kernels_run_as_block_ranges_beside_production_and_take_more_of_the_gpu() {
    let ((whole_gpu, whole_sliced, _), whole_lat) = run("blocks", "off");
    let ((gpu_ns, sliced, unsliced), lat) = run("blocks", "on");
    let (p99_whole, p99) = (percentile(&whole_lat, 99.0), percentile(&lat, 99.0));
    println!(
        "10 ms kernels beside production, budget 2 ms: cut into ranges {sliced} launches \
         ({unsliced} whole), {:.0} ms of GPU in 4 s, production p99 {p99:.1} ms; whole (slicing \
         off) {:.0} ms of GPU, p99 {p99_whole:.1} ms",
        gpu_ns as f64 / 1e6,
        whole_gpu as f64 / 1e6
    );
    assert_eq!(whole_sliced, 0, "LIBSHARE_SLICING=off cuts nothing");
    assert!(sliced > 10, "only {sliced} launches were cut");
    assert_eq!(
        unsliced, 0,
        "every long launch of the PTX job had a sliced entry"
    );
    // Whole, the 10 ms kernels go only in production's gaps they fit, or after 19 × their span:
    // ~5 % of the GPU. Cut, they run beside production's requests.
    assert!(
        gpu_ns > 3 * whole_gpu.max(1),
        "cut: {gpu_ns} ns of GPU; whole: {whole_gpu} ns"
    );
    // Generous (a loaded CI machine): a request meets at most about one range (the budget)
    // more than whole kernels, which go only where they fit.
    assert!(
        p99 <= 2.0 * p99_whole.max(4.0) + 4.0,
        "production's p99 beside cut kernels {p99:.1} ms, beside whole ones {p99_whole:.1} ms"
    );
}

#[test]
fn a_cudart_programs_kernels_are_cut_through_the_ptx_its_fatbin_carries() {
    // nvcc's -arch=sm_80: the sm_80 cubin (what the driver runs whole) and the compute_80 PTX
    // (what the shim cuts), registered by cudart through cuLibraryLoadData.
    let ((gpu_ns, sliced, unsliced), _) =
        run_beside_production(|gpu| rt_spin(gpu, "", &["-arch=sm_80"]));
    println!("cudart, cubin + PTX: {sliced} cut, {unsliced} whole, {gpu_ns} ns of GPU");
    assert!(sliced > 10, "only {sliced} launches were cut");
    assert_eq!(unsliced, 0, "every long launch had a sliced entry");
}

#[test]
fn a_cudart_program_with_cubins_only_goes_whole_counted_unsliced() {
    let ((gpu_ns, sliced, unsliced), _) = run_beside_production(|gpu| {
        rt_spin(gpu, "-sm80", &["-gencode=arch=compute_80,code=sm_80"])
    });
    println!("cudart, cubin only: {sliced} cut, {unsliced} whole, {gpu_ns} ns of GPU");
    assert_eq!(sliced, 0, "no PTX, nothing to cut");
    assert!(unsliced > 0, "the long kernels that went whole are counted");
}

#[test]
fn a_long_kernel_of_one_block_goes_whole_and_is_counted_unsliced() {
    let ((gpu_ns, sliced, unsliced), _) = run("kernel", "on");
    println!("one-block 10 ms kernels: {sliced} cut, {unsliced} whole, {gpu_ns} ns of GPU");
    assert_eq!(sliced, 0, "one block cannot be cut");
    assert!(unsliced > 0, "the long kernels that went whole are counted");
}

#[test]
fn a_bad_libshare_slicing_is_one_line() {
    let gpu = SimGpu::new().with_shim();
    let mut cmd = gpu.command(artifacts().bin("simjob-saturate"));
    cmd.args(["--duration", "1s"])
        .env("LIBSHARE_SLICING", "sometimes");
    let out = gpu.run(cmd);
    assert!(!out.status.success(), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("invalid LIBSHARE_SLICING=\"sometimes\": expected on or off"),
        "{err}"
    );
}
