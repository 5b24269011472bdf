//! Generous sanity bounds on the simulated GPU's model; the figures themselves are benchmarks
//! (`simgpu-model`, BENCHMARKS.md).

use libshare_benches::{model, num};

#[test]
fn one_ms_kernel_occupies_about_one_ms() {
    let v = model::kernel_occupancy(3, 0.5);
    eprintln!("{v}");
    // What the shared timeline reserved per kernel: the model itself.
    let modelled = num(&v, "modelled_ms");
    assert!(
        (0.95..1.05).contains(&modelled),
        "a 1 ms kernel was modelled as {modelled} ms: {v}"
    );
    // From throughput, which a loaded host (the other tests run beside this one) can only slow:
    // a sanity bound; the benchmark measures it on an idle machine.
    let ms = num(&v, "median_ms");
    assert!(
        (0.9..3.0).contains(&ms),
        "a 1 ms kernel occupied {ms} ms: {v}"
    );
}

#[test]
fn two_saturating_processes_share_the_device() {
    let v = model::two_saturating(1.5);
    // Fair: each gets about half of what the two got (throughputs relative to the same solo run).
    let (a, b) = (num(&v, "share_a"), num(&v, "share_b"));
    let fair = a / (a + b);
    assert!((0.35..0.65).contains(&fair), "unfair split: {v}");
    // Fully shared, never overlapping: the device ran one of them nearly all the time, never
    // both at once (device time, not throughput relative to a solo run a loaded host may slow).
    let total = num(&v, "device_total");
    assert!(
        total > 0.7 && total < 1.05,
        "the device is not fully shared: {v}"
    );
}

#[test]
fn training_job_slows_down_when_a_saturating_job_joins() {
    let v = model::train_colocation(2.0);
    let r = num(&v, "ratio");
    assert!(r < 0.9, "co-location did not slow the training job: {v}");
    assert!(
        num(&v, "opportunistic_gpu_ms_per_s") > 200.0,
        "the saturating job got no GPU time: {v}"
    );
}

#[test]
fn oversubscribed_managed_memory_thrashes() {
    let v = model::managed_thrash(200);
    assert!(num(&v, "slowdown") >= 2.0, "no thrashing: {v}");
}

#[test]
fn managed_memory_beyond_the_device_runs_and_pays_migration() {
    let v = model::managed_oversubscribed(20);
    assert!(
        num(&v, "slowdown") > 1.2,
        "oversubscription paid nothing: {v}"
    );
}
