//! Issue 3, must-show 4: processes of one container share one quota.
//! - Process A holds 600 MiB of a 1 GiB quota (and waits on a pipe): process B of the same
//!   container cannot get 600 MiB but can get 300 MiB and sees A's use in `cuMemGetInfo`; a
//!   process of another container is not affected. Handshakes over pipes, no sleeps.
//! - 4 processes × 8 threads allocating and freeing random sizes at once (`shim_stress.c`) never
//!   exceed the quota by one byte: simgpu's own peak device memory (its `mem_peak`, on a device 32×
//!   larger than the quota) and the shim's `peak` both stay ≤ the quota, and at the end nothing is
//!   charged.
//! - Issue 18, must-show 5a: `CUDA_DEVICE_SM_LIMIT` is per process and the smallest wins: an
//!   opportunistic container's process started with 20 % and a second one started without a
//!   limit (both saturating the GPU) keep the container at 20 % under a real daemon; once the
//!   limited one is killed (its slot reclaimed) the other runs unlimited.

use libshare_abi::SlotTable;
use libshare_tests::{
    artifacts, compile_gcc, describe, json_check, until, Daemon, Running, SimGpu,
};
use std::collections::HashMap;
use std::sync::atomic::Ordering::Acquire;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn facts(stdout: &str) -> HashMap<String, String> {
    stdout
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

#[test]
fn shim_two_processes_of_one_container_share_its_quota() {
    let bin = compile_gcc("shim_driver.c", "shim_driver", &[]);
    let gpu = SimGpu::new()
        .memory("8GiB")
        .with_shim()
        .quota("1GiB")
        .env("LIBSHARE_CONTAINER", "web");

    // A: holds 600 MiB until its stdin closes.
    let mut a: Running = gpu.spawn({
        let mut cmd = gpu.command(&bin);
        cmd.args(["hold", "600"]);
        cmd
    });
    a.wait_for_line("held");
    let a_facts = facts(&a.lines.join("\n"));
    assert_eq!(a_facts["hold_rc"], "0", "{:?}", a.lines);
    assert_eq!(a_facts["free"], (GIB - 600 * MIB).to_string());

    // B, same container: 600 MiB does not fit any more, 300 MiB does.
    let b = gpu.run_cmd_ok(|| {
        let mut cmd = gpu.command(&bin);
        cmd.args(["try", "600", "300"]);
        cmd
    });
    let f = facts(&String::from_utf8_lossy(&b.stdout));
    let ctx = describe(&b);
    assert_eq!(f["free_start"], (GIB - 600 * MIB).to_string(), "{ctx}");
    assert_eq!(
        f["alloc_600_rc"], "2",
        "CUDA_ERROR_OUT_OF_MEMORY expected\n{ctx}"
    );
    assert_eq!(f["alloc_300_rc"], "0", "{ctx}");
    assert_eq!(f["free_end"], (GIB - 900 * MIB).to_string(), "{ctx}");

    // C, another container on the same GPU: its own 1 GiB quota.
    let c = gpu.run_cmd_ok(|| {
        let mut cmd = gpu.command(&bin);
        cmd.args(["try", "600", "300"])
            .env("LIBSHARE_CONTAINER", "batch");
        cmd
    });
    let f = facts(&String::from_utf8_lossy(&c.stdout));
    assert_eq!(f["free_start"], GIB.to_string(), "{}", describe(&c));
    assert_eq!(f["alloc_600_rc"], "0", "{}", describe(&c));
    assert_eq!(f["alloc_300_rc"], "0", "{}", describe(&c));

    // While A still runs, the container holds exactly A's 600 MiB (B exited and returned its 300).
    let st = gpu.container_state("web");
    assert_eq!(st.device(0).used.load(Acquire), 600 * MIB);
    assert_eq!(st.device(0).oom.load(Acquire), 1);
    let live = st.live_slots();
    assert_eq!(live.len(), 1, "live slots {live:?}");
    assert_eq!(live[0].1, a.pid());
    assert_eq!(st.slot(live[0].0).net(0), 600 * MIB);

    // Release A: it frees and sees the whole quota again.
    let out = a.finish();
    assert!(out.status.success(), "{}", describe(&out));
    let f = facts(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(f["free_end"], GIB.to_string(), "{}", describe(&out));
    assert_eq!(st.device(0).used.load(Acquire), 0);
    assert!(st.device(0).peak.load(Acquire) <= GIB);
}

#[test]
fn shim_four_processes_of_eight_threads_never_exceed_the_quota() {
    const QUOTA: u64 = 256 * MIB;
    const PROCS: usize = 4;
    let bin = compile_gcc("shim_stress.c", "shim_stress", &[]);
    // simgpu has 8 GiB: only the shim can keep the processes within 256 MiB.
    let gpu = SimGpu::new()
        .memory("8GiB")
        .with_shim()
        .quota("256MiB")
        .env("LIBSHARE_CONTAINER", "stress");
    let mut procs: Vec<Running> = (0..PROCS)
        .map(|i| {
            gpu.spawn({
                let mut cmd = gpu.command(&bin);
                // 8 threads × 2000 operations, sizes 1 B .. 40 MiB.
                cmd.args(["8", "2000", "40", &(i + 1).to_string()]);
                cmd
            })
        })
        .collect();
    // Every process has initialised CUDA; closing their stdin starts them together.
    for p in &mut procs {
        p.wait_for_line("ready");
    }
    for p in &mut procs {
        p.close_stdin();
    }
    let outs: Vec<_> = procs.into_iter().map(Running::finish).collect();
    let (mut allocs, mut ooms) = (0u64, 0u64);
    for out in &outs {
        assert!(out.status.success(), "{}", describe(out));
        let v = json_check(out, "stress");
        assert_eq!(v["total"], QUOTA, "cuMemGetInfo total in a process: {v}");
        allocs += v["allocs"].as_u64().unwrap();
        ooms += v["ooms"].as_u64().unwrap();
    }
    assert!(
        allocs > 1000 && ooms > 100,
        "not enough contention: {allocs} allocations, {ooms} refused"
    );

    let st = gpu.container_state("stress");
    let dev = st.device(0);
    let shim_peak = dev.peak.load(Acquire);
    let sim_peak = gpu.sim_mem_peak(0, 8 << 30);
    assert!(
        sim_peak <= QUOTA,
        "simgpu's device memory peaked at {sim_peak} bytes, over the {QUOTA}-byte quota by {}",
        sim_peak - QUOTA
    );
    assert!(shim_peak <= QUOTA, "shim peak {shim_peak} > quota {QUOTA}");
    // The quota was really reached for (so the bound is tight, not vacuous).
    assert!(sim_peak > QUOTA / 2, "simgpu peak {sim_peak}");
    assert_eq!(dev.used.load(Acquire), 0, "memory left charged at the end");
    assert_eq!(dev.allocs.load(Acquire), allocs, "shim allocation count");
    assert_eq!(dev.oom.load(Acquire), ooms, "shim refusal count");
    let sim = gpu.sim_counts();
    assert_eq!(sim.processes, PROCS as u64);
    assert_eq!(
        sim.api_allocs, allocs,
        "simgpu saw other allocations than granted"
    );
    assert_eq!(gpu.shim_counts("stress").allocs, allocs);
    gpu.assert_no_stub_calls();
}

/// The container's GPU time per second of wall time (GPU-ms/s) over `span`, from its state.
fn gpu_ms_per_s(st: &libshare_abi::State, span: Duration) -> f64 {
    let dev = st.device(0);
    let (g0, t0) = (dev.gpu_ns.load(Acquire), Instant::now());
    std::thread::sleep(span);
    let (g1, t1) = (dev.gpu_ns.load(Acquire), Instant::now());
    (g1 - g0) as f64 / 1e6 / (t1 - t0).as_secs_f64()
}

#[test]
fn shim_sm_limit_is_per_process_and_a_process_without_one_lifts_no_cap() {
    let gpu = SimGpu::new().with_shim();
    let _daemon = Daemon::start(&gpu.shim_state_dir(), &[]);
    let saturate = |limit: Option<&str>| {
        let mut cmd = gpu.command(artifacts().bin("simjob-saturate"));
        cmd.args(["--kernel-ms", "0.5", "--depth", "4", "--duration", "60s"])
            .env("LIBSHARE_CONTAINER", "batch")
            .env("LIBSHARE_CLASS", "opportunistic");
        if let Some(l) = limit {
            cmd.env("CUDA_DEVICE_SM_LIMIT", l);
        } else {
            cmd.env_remove("CUDA_DEVICE_SM_LIMIT");
        }
        gpu.spawn(cmd)
    };
    let mut capped = saturate(Some("20"));
    let st = gpu.wait_container_state("batch");
    let launching = |slot: usize| {
        let l0 = st.slot(slot).launches[0].load(Acquire);
        until(Duration::from_secs(30), || {
            st.slot(slot).launches[0].load(Acquire) > l0 + 10
        })
        .is_some()
    };
    until(Duration::from_secs(30), || st.live_slots().len() == 1).expect("the first process");
    let first = st.live_slots()[0].0;
    assert!(launching(first), "the limited process launches");
    assert_eq!(st.compute_limit(), 2000);

    // A second process of the container, its environment without the limit.
    let _free = saturate(None);
    until(Duration::from_secs(30), || st.live_slots().len() == 2).expect("the second process");
    let second = st
        .live_slots()
        .into_iter()
        .find(|(i, _)| *i != first)
        .unwrap()
        .0;
    assert!(launching(second), "the second process launches");
    assert_eq!(st.slot(second).compute_limit.load(Acquire), 0);
    assert_eq!(st.compute_limit(), 2000, "0 lifts nobody's limit");
    // The daemon reads the limits at its rescans (100 ms): measure after a few.
    std::thread::sleep(Duration::from_millis(300));
    let both = gpu_ms_per_s(&st, Duration::from_millis(1500));
    eprintln!("two processes, one at CUDA_DEVICE_SM_LIMIT=20: {both:.0} GPU-ms/s");
    assert!(
        (120.0..=280.0).contains(&both),
        "the container should stay at 20 % (200 GPU-ms/s): {both:.0}"
    );

    // The limited process dies: once its slot is reclaimed, its limit no longer counts.
    capped.child.kill().unwrap();
    capped.child.wait().unwrap();
    until(Duration::from_secs(5), || st.compute_limit() == 0).expect("the dead slot reclaimed");
    std::thread::sleep(Duration::from_millis(300));
    let alone = gpu_ms_per_s(&st, Duration::from_millis(1000));
    eprintln!("the unlimited process alone: {alone:.0} GPU-ms/s");
    assert!(alone > 600.0, "no limit left: {alone:.0} GPU-ms/s");
}
