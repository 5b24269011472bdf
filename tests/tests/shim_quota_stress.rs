//! Issue 6, must-show 2: a bounded stress of the quota. 5 processes × 4 threads of one container
//! (`tests/cuda/shim_quota_stress.c`) mix every allocation path — plain, pitched, managed,
//! stream-ordered on a retaining pool, VMM (`cuMemCreate` + `cuMemMap`), arrays — with frees,
//! primary-context resets and created contexts destroyed with their allocations alive; one
//! process execs a new image of itself half way while its threads work; the harness `kill -9`s
//! one or two others at random moments. Afterwards, once every process is gone and a new one has
//! registered (which reclaims the dead processes' memory, in the shim and in simgpu), the
//! container's use equals simgpu's device memory (0), and neither simgpu's device nor the
//! container ever held more than the quota.
//!
//! The seed is printed; `SHIM_QUOTA_SEED=<n>` repeats a run's choices (which processes are
//! killed, when, and every thread's sequence of operations; the interleaving is the machine's).
//! `SHIM_QUOTA_CALM=1` runs without the exec and the kills (to tell their effect apart).

use libshare_abi::SlotTable;
use libshare_tests::{compile_gcc, describe, json_lines, Running, SimGpu};
use std::os::unix::process::ExitStatusExt;
use std::sync::atomic::Ordering::Acquire;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const QUOTA: u64 = 256 * MIB;
const DEVICE: u64 = 8 << 30;
const PROCS: usize = 5;
const THREADS: &str = "4";
const OPS: &str = "6000";
const CONTAINER: &str = "stress";

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn shim_quota_stress_every_path_with_exec_and_kill_leaves_the_container_exact() {
    let seed: u64 = std::env::var("SHIM_QUOTA_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x0006_5eed);
    println!("seed {seed} (SHIM_QUOTA_SEED={seed} repeats this run's choices)");
    let mut rng = Rng(seed | 1);
    let calm = std::env::var("SHIM_QUOTA_CALM").as_deref() == Ok("1");
    let prog = compile_gcc("shim_quota_stress.c", "shim_quota_stress", &["-lcuda"]);
    let gpu = SimGpu::new()
        .memory("8GiB")
        .with_shim()
        .quota("256MiB")
        .env("LIBSHARE_CONTAINER", CONTAINER)
        .timeout(Duration::from_secs(120));
    let t0 = Instant::now();

    // Process 0 execs itself half way; the others run to the end unless killed.
    let mut procs: Vec<Running> = (0..PROCS)
        .map(|i| {
            let mut cmd = gpu.command(&prog);
            let stage = if i == 0 && !calm { "exec" } else { "wait" };
            cmd.args([
                THREADS,
                OPS,
                &(seed.wrapping_add(i as u64 * 1000)).to_string(),
                stage,
            ]);
            gpu.spawn(cmd)
        })
        .collect();
    for p in &mut procs {
        p.wait_for_line("ready");
    }
    // One or two of processes 1.. are killed 50–1050 ms after all start together.
    let mut victims: Vec<(usize, u64)> = Vec::new();
    let n_victims = if calm {
        0
    } else {
        1 + (rng.next() % 2) as usize
    };
    while victims.len() < n_victims {
        let v = 1 + (rng.next() % (PROCS as u64 - 1)) as usize;
        if victims.iter().all(|(i, _)| *i != v) {
            victims.push((v, 50 + rng.next() % 1000));
        }
    }
    victims.sort_by_key(|v| v.1);
    println!("kill -9: {victims:?} (process, ms after the start)");
    let started = Instant::now();
    for p in &mut procs {
        p.close_stdin();
    }
    for &(v, ms) in &victims {
        let at = started + Duration::from_millis(ms);
        std::thread::sleep(at.saturating_duration_since(Instant::now()));
        let _ = procs[v].child.kill(); // SIGKILL
    }

    let (mut allocs, mut ooms, mut resets, mut contexts) = (0u64, 0u64, 0u64, 0u64);
    for (i, mut p) in procs.into_iter().enumerate() {
        if victims.iter().any(|(v, _)| *v == i) {
            let status = p.child.wait().expect("wait for a killed process");
            println!(
                "process {i}: {}",
                match status.signal() {
                    Some(9) => "killed".to_owned(),
                    _ => format!("finished before its kill: {status}"),
                }
            );
            continue;
        }
        let out = p.finish();
        assert!(out.status.success(), "process {i}\n{}", describe(&out));
        let lines: Vec<_> = json_lines(&out)
            .into_iter()
            .filter(|v| v["check"] == "stress_proc")
            .collect();
        let expected_stage = if i == 0 && !calm { "execd" } else { "wait" };
        assert_eq!(
            lines.len(),
            1,
            "process {i}: one summary line expected (the exec'd image's for process 0)\n{}",
            describe(&out)
        );
        let v = &lines[0];
        assert_eq!(v["stage"], expected_stage, "{v}");
        allocs += v["allocs"].as_u64().unwrap();
        ooms += v["ooms"].as_u64().unwrap();
        resets += v["resets"].as_u64().unwrap();
        contexts += v["contexts"].as_u64().unwrap();
    }
    println!(
        "survivors: {allocs} allocations, {ooms} refused, {resets} resets, {contexts} contexts \
         destroyed; {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    assert!(
        allocs > 1000 && ooms > 50,
        "not enough contention: {allocs} allocations, {ooms} refused"
    );
    assert!(
        resets > 0 && contexts > 0,
        "{resets} resets, {contexts} contexts"
    );

    // Every stress process is gone. A new process of the container registers (the shim and
    // simgpu reclaim what dead processes held) and holds nothing.
    let mut probe = gpu.spawn({
        let mut cmd = gpu.command(&prog);
        cmd.args(["1", "1", "0", "probe"]);
        cmd
    });
    probe.wait_for_line("probe");
    let st = gpu.container_state(CONTAINER);
    let dev = st.device(0);
    let charged = dev.used.load(Acquire);
    let sim_used = gpu.sim_mem_used(0, DEVICE);
    let live = st.live_slots();
    probe.send("go\n");
    let out = probe.finish();
    assert!(out.status.success(), "{}", describe(&out));

    let sim_peak = gpu.sim_mem_peak(0, DEVICE);
    let peak = dev.peak.load(Acquire);
    println!(
        "simgpu peak {} MiB, container peak {} MiB (quota {} MiB); after: charged {charged}, \
         simgpu {sim_used}",
        sim_peak / MIB,
        peak / MIB,
        QUOTA / MIB
    );
    assert!(
        sim_peak <= QUOTA,
        "simgpu's device memory peaked at {sim_peak} bytes, over the quota by {} MiB (seed {seed})",
        (sim_peak - QUOTA) / MIB
    );
    assert!(peak <= QUOTA, "the container's peak {peak} > quota {QUOTA}");
    assert!(
        sim_peak > QUOTA / 2,
        "simgpu's peak {sim_peak}: no pressure"
    );
    assert_eq!(
        sim_used, 0,
        "simgpu holds {sim_used} bytes with no stress process left (seed {seed})"
    );
    assert_eq!(
        charged, sim_used,
        "the container is charged {charged} bytes, simgpu holds {sim_used}, with only the probe \
         (holding nothing) alive: live slots {live:?} (seed {seed})"
    );
    assert_eq!(dev.used.load(Acquire), 0, "charged after the probe exited");
    gpu.assert_no_stub_calls();
}
