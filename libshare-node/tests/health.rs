//! The control loop's live counters (`controller::Health`, the metrics' daemon health) move while
//! it runs and end consistent with its final `RunStats`.

use libshare_abi::{container_dir, State};
use libshare_node::{controller, ControllerConfig, PolicyKind};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[test]
fn health_counts_ticks_containers_and_cpu_while_the_loop_runs() {
    let dir = tempfile::tempdir().unwrap();
    let _a = State::open_or_create(&container_dir(dir.path(), "a")).unwrap();
    let _b = State::open_or_create(&container_dir(dir.path(), "b")).unwrap();
    let cfg = ControllerConfig::new(dir.path().to_path_buf(), 1_000_000, PolicyKind::Libshare);
    let health = cfg.health.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let daemon = {
        let (cfg, stop) = (cfg.clone(), stop.clone());
        std::thread::spawn(move || controller::run(&cfg, &stop).unwrap())
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(health.ticks.load(Relaxed) >= 50 && health.containers.load(Relaxed) == 2) {
        assert!(Instant::now() < deadline, "no ticks: {health:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(health.running.load(Acquire), 1);
    stop.store(true, Release);
    let s = daemon.join().unwrap();
    assert_eq!(
        health.running.load(Acquire),
        0,
        "down once the loop returned"
    );
    assert_eq!(health.ticks.load(Relaxed), s.ticks);
    assert_eq!(health.overruns.load(Relaxed), s.overruns);
    assert_eq!(health.late_max_ns.load(Relaxed), s.late_max_ns);
    assert_eq!(health.cpu_ns.load(Relaxed), s.cpu_ns);
    assert!(s.cpu_ns > 0);
}
