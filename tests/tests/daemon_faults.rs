//! Issue 10, faults, on simgpu with the shim and a real `sharectl daemon`; each time measured
//! and printed:
//! - `kill -9` of a job: its memory is back in its container's quota within 1 s, returned by
//!   the daemon with no other process of the container starting;
//! - `kill -9` of the daemon under load (a training-like production job, a saturating
//!   opportunistic one): production's launches never stop; the opportunistic job, left paused
//!   or in a closed window by the dead daemon, runs again at `rate::FLOOR` within 1 s and stays
//!   within its in-flight bound; a restarted daemon re-attaches every live job within 1 s (its
//!   heartbeat reaches them) with the quotas intact;
//! - a job started while no daemon runs works with its environment's limits and is attached
//!   when the daemon starts.
//!
//! The observables are the containers' shared words (`libshare_abi::State`), as an operator's
//! `sharectl status` reads them; simgpu's own state is not used.

use jobs::profiles::{Train, TRAIN};
use libshare_abi::rate::{now_ns, FLOOR};
use libshare_abi::DeviceState;
use libshare_tests::{artifacts, until, Daemon, SimGpu};
use std::sync::atomic::Ordering::Acquire;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

#[test]
fn daemon_returns_a_killed_jobs_memory_within_a_second() {
    let gpu = SimGpu::new().with_shim().quota("1GiB");
    let _daemon = Daemon::start(&gpu.shim_state_dir(), &[]);
    let mut holder = gpu.hold_memory("batch", 600);
    let st = Box::leak(Box::new(gpu.wait_container_state("batch")));
    let used = || st.device(0).used.load(Acquire);
    assert!(used() >= 600 * MIB, "600 MiB charged: {}", used());

    holder.kill().expect("SIGKILL");
    holder.wait().expect("reap");
    let took = until(Duration::from_secs(5), || used() == 0)
        .unwrap_or_else(|| panic!("{} bytes still charged 5 s after the kill", used()));
    println!(
        "job kill -9 -> memory back in the quota after {} ms (by the daemon)",
        took.as_millis()
    );
    assert!(took < Duration::from_secs(1), "took {took:?}");
    assert_eq!(
        st.device(0).quota.load(Acquire),
        1 << 30,
        "the quota is intact"
    );
}

fn train(gpu: &SimGpu, secs: u32) -> libshare_tests::Running {
    let mut cmd = gpu.command(artifacts().bin(Train::BIN));
    cmd.args(TRAIN.loop_args())
        .args(["--duration", &format!("{secs}s")])
        .env("LIBSHARE_CONTAINER", "prod")
        .env("LIBSHARE_CLASS", "production");
    gpu.spawn(cmd)
}

fn saturate(gpu: &SimGpu, secs: u32) -> libshare_tests::Running {
    let mut cmd = gpu.command(artifacts().bin("simjob-saturate"));
    cmd.args([
        "--kernel-ms",
        "0.5",
        "--depth",
        "4",
        "--duration",
        &format!("{secs}s"),
    ])
    .env("LIBSHARE_CONTAINER", "opp")
    .env("LIBSHARE_CLASS", "opportunistic");
    gpu.spawn(cmd)
}

/// Samples production's launches and the opportunistic job's GPU time every 20 ms for `span`:
/// the longest stretch production launched nothing, the time until the opportunistic job's
/// GPU time moved again, and the most it had in flight.
struct Watch {
    prod_longest_stall: Duration,
    opp_resumed_after: Option<Duration>,
    opp_in_flight_max: u64,
}

fn watch(prod: &DeviceState, opp: &DeviceState, span: Duration) -> Watch {
    let t0 = Instant::now();
    let (mut last_launches, mut last_change) = (prod.launches.load(Acquire), t0);
    let opp_gpu0 = opp.gpu_ns.load(Acquire);
    let mut w = Watch {
        prod_longest_stall: Duration::ZERO,
        opp_resumed_after: None,
        opp_in_flight_max: 0,
    };
    while t0.elapsed() < span {
        std::thread::sleep(Duration::from_millis(20));
        let l = prod.launches.load(Acquire);
        if l != last_launches {
            last_launches = l;
            last_change = Instant::now();
        }
        w.prod_longest_stall = w.prod_longest_stall.max(last_change.elapsed());
        if w.opp_resumed_after.is_none() && opp.gpu_ns.load(Acquire) > opp_gpu0 {
            w.opp_resumed_after = Some(t0.elapsed());
        }
        w.opp_in_flight_max = w.opp_in_flight_max.max(opp.in_flight_ns.load(Acquire));
    }
    w
}

#[test]
fn daemon_killed_under_load_leaves_production_running_and_opportunistic_at_the_floor() {
    let gpu = SimGpu::new().with_shim().quota("2GiB");
    let mut daemon = Some(Daemon::start(&gpu.shim_state_dir(), &[]));
    let prod_job = train(&gpu, 40);
    let opp_job = saturate(&gpu, 40);
    let (prod_st, opp_st) = (
        Box::leak(Box::new(gpu.wait_container_state("prod"))),
        Box::leak(Box::new(gpu.wait_container_state("opp"))),
    );
    let (prod, opp) = (prod_st.device(0), opp_st.device(0));
    // Steered: the daemon's heartbeat reaches the opportunistic job, which is held at times.
    until(Duration::from_secs(20), || {
        opp.refreshed.load(Acquire) != 0 && opp.held_ns.load(Acquire) > 0
    })
    .expect("the daemon never steered the opportunistic job");
    std::thread::sleep(Duration::from_millis(500));

    // kill -9, right after a gate write: the dead daemon's last word may pause the job forever.
    daemon.take().unwrap().kill9();
    let after_kill = watch(prod, opp, Duration::from_millis(2500));
    assert_eq!(
        opp.gate_at(now_ns()),
        FLOOR,
        "a silent daemon's job runs at the floor"
    );
    let resumed = after_kill
        .opp_resumed_after
        .expect("the opportunistic job never ran again after the daemon died");
    println!(
        "daemon kill -9: opportunistic GPU time moving again after {} ms (the floor applies {} ms after the last heartbeat); \
         production's longest launch gap {} ms; opportunistic in flight max {:.1} ms",
        resumed.as_millis(),
        libshare_abi::rate::DAEMON_SILENT_NS / 1_000_000,
        after_kill.prod_longest_stall.as_millis(),
        after_kill.opp_in_flight_max as f64 / 1e6
    );
    assert!(
        resumed < Duration::from_secs(1),
        "the opportunistic job resumed after {resumed:?}"
    );
    assert!(
        after_kill.prod_longest_stall < Duration::from_millis(200),
        "production stopped launching for {:?} while the daemon was dead",
        after_kill.prod_longest_stall
    );
    let floor_ns = match FLOOR {
        libshare_abi::rate::Gate::Run { in_flight_us, .. } => in_flight_us as u64 * 1_000,
        _ => unreachable!(),
    };
    assert!(
        after_kill.opp_in_flight_max <= floor_ns + 1_000_000,
        "at the floor the job had {} ns in flight (floor {floor_ns} ns + one kernel)",
        after_kill.opp_in_flight_max
    );

    // Restart: every live job re-attached (the new daemon's heartbeat) within 1 s, quotas intact.
    let restart_ns = now_ns();
    let _daemon = Daemon::start(&gpu.shim_state_dir(), &[]);
    let took = until(Duration::from_secs(5), || {
        opp.refreshed.load(Acquire) > restart_ns && opp.gate_at(now_ns()) != FLOOR
    })
    .unwrap_or_else(|| {
        panic!("the restarted daemon did not re-attach the opportunistic job within 5 s")
    });
    println!(
        "daemon restart: jobs re-attached after {} ms",
        took.as_millis()
    );
    assert!(took < Duration::from_secs(1), "re-attached after {took:?}");
    let during = watch(prod, opp, Duration::from_millis(1000));
    assert!(
        during.prod_longest_stall < Duration::from_millis(200),
        "production stalled after the restart"
    );
    for st in [prod_st, opp_st] {
        assert_eq!(st.device(0).quota.load(Acquire), 2 << 30, "quota intact");
    }
    drop(opp_job);
    drop(prod_job);
}

#[test]
fn a_job_started_while_the_daemon_is_down_attaches_when_it_returns() {
    let gpu = SimGpu::new().with_shim().quota("512MiB");
    let prod_job = train(&gpu, 30);
    let opp_job = saturate(&gpu, 30);
    let (prod_st, opp_st) = (
        Box::leak(Box::new(gpu.wait_container_state("prod"))),
        Box::leak(Box::new(gpu.wait_container_state("opp"))),
    );
    let opp = opp_st.device(0);
    until(Duration::from_secs(20), || opp.gpu_ns.load(Acquire) > 0)
        .expect("the opportunistic job runs without a daemon");
    assert_eq!(opp.refreshed.load(Acquire), 0, "no daemon yet");
    let held0 = opp.held_ns.load(Acquire);
    assert_eq!(
        opp_st.device(0).quota.load(Acquire),
        512 * MIB,
        "the environment's limit applies"
    );
    let start_ns = now_ns();
    let _daemon = Daemon::start(&gpu.shim_state_dir(), &[]);
    let took = until(Duration::from_secs(5), || {
        opp.refreshed.load(Acquire) > start_ns && opp.held_ns.load(Acquire) > held0
    })
    .expect("the daemon never attached the running jobs");
    println!(
        "job started while the daemon was down: attached {} ms after the daemon started",
        took.as_millis()
    );
    assert!(took < Duration::from_secs(1), "attached after {took:?}");
    assert_eq!(
        prod_st.device(0).quota.load(Acquire),
        512 * MIB,
        "quota intact"
    );
    drop(opp_job);
    drop(prod_job);
}
