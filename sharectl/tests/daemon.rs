//! `sharectl daemon` end to end, without a GPU: two containers' state files, counters written
//! as their shims would (launches, busy_since, drained_at), the daemon steering the
//! opportunistic one's gate.

use libshare_abi::rate::{now_ns, Gate};
use libshare_abi::{container_dir, Class, State};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering::*;
use std::time::{Duration, Instant};

fn sharectl() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sharectl"))
}

/// Polls `f` every 100 µs until it holds; the time it took, or None after `limit`.
fn until(limit: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    None
}

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_daemon_pauses_batch_work_while_production_is_busy() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let prod = State::open_or_create(&container_dir(dir, "prod")).unwrap();
    let mut daemon = Daemon(
        sharectl()
            .args(["daemon", "--period", "1ms", "--state-dir"])
            .arg(dir)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // The opportunistic container is declared before it starts, as an admin would.
    let set = || {
        sharectl()
            .args(["set", "batch", "--state-dir"])
            .arg(dir)
            .args(["--class", "opportunistic", "--weight", "3"])
            .output()
            .unwrap()
    };
    until(Duration::from_secs(5), || set().status.success())
        .expect("the daemon's admin socket answers");
    let batch = State::open_or_create(&container_dir(dir, "batch")).unwrap();
    assert_eq!(batch.header().class(), Class::Opportunistic);
    assert_eq!(batch.device(0).weight.load(Acquire), 3);
    let (p, b) = (prod.device(0), batch.device(0));
    // Both launched once and synchronised.
    for d in [p, b] {
        d.note_launch();
        d.note_drained();
    }

    until(Duration::from_secs(5), || b.refreshed.load(Acquire) != 0)
        .expect("the daemon writes the batch gate");

    // The heartbeat advances at the period: ~200 distinct values in 200 ms at 1 ms. The batch
    // job keeps launching throughout (beside production, an opportunistic container that does
    // not demand is paused: issue 31).
    let mut seen = std::collections::HashSet::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(200) {
        b.note_launch();
        seen.insert(b.refreshed.load(Acquire));
        std::thread::sleep(Duration::from_micros(200));
    }
    assert!(seen.len() >= 100, "{} refreshes in 200 ms", seen.len());
    let age = now_ns() - b.refreshed.load(Acquire);
    assert!(age < 250_000_000, "heartbeat {age} ns old");
    assert_ne!(b.gate(), Gate::Paused, "production idle");
    assert_eq!(p.gate(), Gate::Open, "production is never gated");

    for round in 0..5 {
        // Production becomes busy: the batch gate pauses within a few periods...
        p.note_launch();
        let t = until(Duration::from_secs(2), || {
            b.note_launch();
            b.gate() == Gate::Paused
        })
        .unwrap_or_else(|| panic!("round {round}: never paused"));
        assert!(
            t < Duration::from_millis(250), // a few periods, typically; generous for a loaded machine
            "round {round}: paused after {t:?}"
        );
        assert_eq!(p.gate(), Gate::Open);
        std::thread::sleep(Duration::from_millis(5));
        p.note_launch();
        assert_eq!(b.gate(), Gate::Paused, "round {round}: still busy");
        // ... and runs again once production drains.
        p.note_drained();
        let t = until(Duration::from_secs(2), || {
            b.note_launch();
            b.gate() != Gate::Paused
        })
        .unwrap_or_else(|| panic!("round {round}: never resumed"));
        assert!(
            t < Duration::from_millis(250), // a few periods, typically; generous for a loaded machine
            "round {round}: resumed after {t:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    // SIGTERM while production is busy: a clean exit with the summary line.
    p.note_launch();
    until(Duration::from_secs(2), || b.gate() == Gate::Paused).expect("paused");
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(daemon.0.id() as i32, libc::SIGTERM) };
    let start = Instant::now();
    let status = loop {
        if let Some(s) = daemon.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "no exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(daemon.0.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(status.success(), "{status:?}: {err}");
    assert!(err.contains("daemon started"), "{err}");
    assert!(
        err.contains("daemon stopped") && err.contains("ticks="),
        "{err}"
    );
}

#[test]
fn bad_values_are_one_line_errors() {
    let tmp = tempfile::tempdir().unwrap();
    for args in [
        &["daemon", "--period", "10ns"][..],
        &["daemon", "--policy", "time-slice", "--quantum", "100us"][..],
        &["set", "x", "--compute", "130%"][..],
        &["set", "../x", "--weight", "1"][..],
        &["set", "x"][..],
    ] {
        let out = sharectl()
            .args(args)
            .arg("--state-dir")
            .arg(tmp.path())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        let first = err.lines().next().unwrap_or("");
        assert!(
            first.starts_with("sharectl: ") || first.starts_with("error: "),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn time_slice_hands_exclusive_turns_to_the_demanding_containers() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let a = State::open_or_create(&container_dir(dir, "a")).unwrap();
    let b = State::open_or_create(&container_dir(dir, "b")).unwrap();
    let (da, db) = (a.device(0), b.device(0));
    da.note_launch();
    db.note_launch();
    let _daemon = Daemon(
        sharectl()
            .args([
                "daemon",
                "--policy",
                "time-slice",
                "--quantum",
                "20ms",
                "--state-dir",
            ])
            .arg(dir)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    until(Duration::from_secs(5), || da.refreshed.load(Acquire) != 0).expect("daemon up");
    // Both keep launching (a paused one is held at the gate, which also counts as demand).
    let start = Instant::now();
    let (mut turns, mut last) = (0, None);
    let mut open_ms = [0u32; 2];
    while start.elapsed() < Duration::from_millis(600) {
        for (i, d) in [da, db].into_iter().enumerate() {
            if d.gate() == Gate::Open {
                d.note_launch();
                open_ms[i] += 1;
                if last != Some(i) {
                    turns += 1;
                    last = Some(i);
                }
            } else {
                d.held.store(1, Release);
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // 600 ms of 20 ms quanta: ~30 turns (generous bounds: a loaded machine sleeps longer).
    assert!((8..=60).contains(&turns), "{turns} turns");
    assert!(open_ms.iter().all(|&ms| ms > 50), "both ran: {open_ms:?}");
}
