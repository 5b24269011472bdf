use super::*;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

fn used(st: &State, d: usize) -> u64 {
    st.device(d).used.load(Acquire)
}

fn live_net(st: &State, d: usize) -> u64 {
    st.live_slots()
        .iter()
        .map(|(i, _)| st.slot(*i).net(d))
        .sum()
}

// ---------------------------------------------------------------------------------------------
// Child processes: this test binary re-executed with LIBSHARE_ABI_CHILD set runs `child_entry`,
// which plays one role and talks over stdout lines starting with "@ ".

fn spawn_child(mode: &str, dir: &Path, extra: &[(&str, String)]) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "tests::child_entry",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("LIBSHARE_ABI_CHILD", mode)
    .env("LIBSHARE_ABI_DIR", dir)
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn child")
}

/// The next "@ " line of a child (None at EOF).
fn child_line(r: &mut impl BufRead) -> Option<String> {
    let mut l = String::new();
    loop {
        l.clear();
        if r.read_line(&mut l).ok()? == 0 {
            return None;
        }
        // libtest may print "test … ... " before it on the same line.
        if let Some((_, rest)) = l.trim_end().split_once("@ ") {
            return Some(rest.to_string());
        }
    }
}

fn say(s: &str) {
    let mut o = std::io::stdout().lock();
    writeln!(o, "@ {s}").unwrap();
    o.flush().unwrap();
}

fn wait_stdin_line() -> String {
    let mut l = String::new();
    std::io::stdin().read_line(&mut l).unwrap();
    l.trim().to_string()
}

#[test]
fn child_entry() {
    let Ok(mode) = std::env::var("LIBSHARE_ABI_CHILD") else {
        return; // a normal run: nothing to do
    };
    let dir = PathBuf::from(std::env::var("LIBSHARE_ABI_DIR").unwrap());
    match mode.as_str() {
        // Charges and uncharges random sizes from 4 threads until killed.
        "churn" => {
            let st = Arc::new(State::open_or_create(&dir).unwrap());
            let slot = st.claim_slot(std::process::id()).unwrap();
            say("ready");
            let threads: Vec<_> = (0..4u64)
                .map(|t| {
                    let st = st.clone();
                    std::thread::spawn(move || {
                        let mut x =
                            0x2545_f491_4f6c_dd1du64 ^ (t << 17) ^ std::process::id() as u64;
                        loop {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            let b = 1 + x % (3 * MIB);
                            if st.charge(slot, (x >> 40) as usize % 2, b) {
                                st.uncharge(slot, (x >> 40) as usize % 2, b);
                            }
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
        }
        // Churns a while, then holds a fixed amount and reports it; sleeps until killed.
        "churn-then-hold" => {
            let st = Arc::new(State::open_or_create(&dir).unwrap());
            let slot = st.claim_slot(std::process::id()).unwrap();
            let stop = Arc::new(AtomicBool::new(false));
            let threads: Vec<_> = (0..3u64)
                .map(|t| {
                    let (st, stop) = (st.clone(), stop.clone());
                    std::thread::spawn(move || {
                        let mut x = 0x9e37_79b9u64 ^ (t << 20) ^ std::process::id() as u64;
                        while !stop.load(Relaxed) {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            let b = 1 + x % MIB;
                            if st.charge(slot, 0, b) {
                                st.uncharge(slot, 0, b);
                            }
                        }
                    })
                })
                .collect();
            std::thread::sleep(Duration::from_millis(30));
            stop.store(true, Relaxed);
            for t in threads {
                t.join().unwrap();
            }
            let hold = (std::process::id() as u64 % 7 + 1) * 1000;
            let held = if st.charge(slot, 0, hold) { hold } else { 0 };
            say(&format!("held {held}"));
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        // Claims a slot, puts 3 ms of GPU time in flight on device 1 as a gated launch does,
        // says so and sleeps until killed.
        "in-flight" => {
            let st = State::open_or_create(&dir).unwrap();
            let slot = st.claim_slot(std::process::id()).unwrap();
            crate::rate::add_in_flight(st.device(1), Some(&st.slot(slot).in_flight[1]), 3_000_000);
            say("launched");
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        // Claims, charges 100, then execs `sleep 30` (same pid, new image).
        "exec-sleep" => {
            let st = State::open_or_create(&dir).unwrap();
            let slot = st.claim_slot(std::process::id()).unwrap();
            assert!(st.charge(slot, 0, 100));
            say(&format!("slot {slot}"));
            use std::os::unix::process::CommandExt;
            let e = Command::new("sleep").arg("30").exec();
            panic!("exec: {e}");
        }
        // Claims, charges 100, then execs this binary again in "after-exec" mode.
        "exec-self" => {
            let st = State::open_or_create(&dir).unwrap();
            let slot = st.claim_slot(std::process::id()).unwrap();
            assert!(st.charge(slot, 0, 100));
            use std::os::unix::process::CommandExt;
            let e = Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "tests::child_entry", "--nocapture"])
                .env("LIBSHARE_ABI_CHILD", "after-exec")
                .env("LIBSHARE_ABI_OLD_SLOT", slot.to_string())
                .exec();
            panic!("exec: {e}");
        }
        "after-exec" => {
            let st = State::open_or_create(&dir).unwrap();
            let old: usize = std::env::var("LIBSHARE_ABI_OLD_SLOT")
                .unwrap()
                .parse()
                .unwrap();
            let old_pid = st.slot(old).pid.load(Acquire);
            let before = used(&st, 0);
            let reclaimed = st.reclaim_dead();
            say(&format!(
                "old_pid_is_mine {} used_before {before} reclaimed {reclaimed} used_after {} old_slot_pid {}",
                old_pid == std::process::id(),
                used(&st, 0),
                st.slot(old).pid.load(Acquire)
            ));
        }
        // Holds 600 of a 1000-byte quota while a thread charges and uncharges; the parent
        // truncates the file meanwhile, then says "go": reports what it sees.
        "truncation" => {
            let st = Arc::new(State::open_or_create(&dir).unwrap());
            st.set_quota(0, 1000);
            let slot = st.claim_slot(std::process::id()).unwrap();
            assert!(st.charge(slot, 0, 600));
            let stop = Arc::new(AtomicBool::new(false));
            let worker = {
                let (st, stop) = (st.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut n = 0u64;
                    while !stop.load(Relaxed) {
                        if st.charge(slot, 0, 300) {
                            n += 1;
                            st.uncharge(slot, 0, 300);
                        }
                        // Over the quota: must always be refused.
                        assert!(!st.charge(slot, 0, 401), "401 more bytes fit");
                    }
                    n
                })
            };
            say("ready");
            assert_eq!(wait_stdin_line(), "go");
            stop.store(true, Relaxed);
            let n = worker.join().unwrap();
            st.recover();
            let over = st.charge(slot, 0, 401);
            say(&format!(
                "alive quota {} used {} over_quota_charged {over} charges {n} slot_net {}",
                st.device(0).quota.load(Acquire),
                used(&st, 0),
                st.slot(slot).net(0)
            ));
        }
        // Under umask 0: creates a state and reports the modes.
        "umask0" => {
            // SAFETY: umask only changes this (child) process's file creation mask.
            unsafe { libc::umask(0) };
            let r = State::open_or_create(&dir.join("containers/c"));
            let mode = |p: &Path| std::fs::metadata(p).map(|m| m.mode() & 0o777).unwrap_or(0);
            say(&format!(
                "ok {} containers {:o} c {:o} file {:o}",
                r.is_ok(),
                mode(&dir.join("containers")),
                mode(&dir.join("containers/c")),
                mode(&dir.join("containers/c/state.shm"))
            ));
        }
        // Tries to open the state dir it is given; reports the error.
        "open" => {
            let r = State::open_or_create(&dir);
            say(&match r {
                Ok(_) => "opened".to_string(),
                Err(e) => format!("error {e}"),
            });
        }
        // Claims, publishes the compute limit LIBSHARE_ABI_LIMIT (basis points), says "ready",
        // sleeps until killed.
        "limit" => {
            let st = State::open_or_create(&dir).unwrap();
            let slot = st.claim_slot(std::process::id()).unwrap();
            let bp = std::env::var("LIBSHARE_ABI_LIMIT")
                .unwrap()
                .parse()
                .unwrap();
            st.set_compute_limit(slot, bp);
            say("ready");
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        m => panic!("unknown child mode {m}"),
    }
}

// ---------------------------------------------------------------------------------------------

#[test]
fn layout_is_stable() {
    // v6 appended the pin words (`pin.rs`) to the header and each device, and each slot's
    // managed bytes.
    assert_eq!(HEADER_SIZE, 128);
    assert_eq!(std::mem::size_of::<DeviceState>(), 256);
    assert_eq!(FILE_SIZE % 64, 0);
    assert_eq!(std::mem::offset_of!(Header, epoch), 48);
    assert_eq!(FILE_SIZE - TRAILER_OFFSET, 64);
    // The compute limit took the slot's padding; v5 appended each device's in-flight part.
    assert_eq!(std::mem::size_of::<ProcSlot>(), 832);
    assert_eq!(std::mem::offset_of!(ProcSlot, compute_limit), 4);
    assert_eq!(std::mem::offset_of!(ProcSlot, start_time), 8);
}

#[test]
fn pinned_memory_is_what_slots_hold_less_their_managed_part_until_reclaimed() {
    let dir = tempfile::tempdir().unwrap();
    let st = State::open_or_create(dir.path()).unwrap();
    let me = st.claim_slot(std::process::id()).unwrap();
    assert!(st.charge(me, 0, 100));
    assert!(st.charge(me, 0, 60));
    st.add_managed(me, 0, 60);
    assert!(st.charge(me, 1, 7));
    assert_eq!(
        (st.pinned(0), st.pinned(1), st.managed_footprint()),
        (100, 7, 60)
    );
    // A managed free: managed first, then the net; in between it reads high, never low.
    st.sub_managed(me, 0, 60);
    assert_eq!(st.pinned(0), 160);
    st.uncharge(me, 0, 60);
    assert_eq!((st.pinned(0), st.managed_footprint()), (100, 0));
    // A dead process's slot counts until it is reclaimed (its memory may still be held).
    let dead = st.claim_slot(std::process::id()).unwrap();
    assert!(st.charge(dead, 0, 5));
    assert_eq!(st.pinned(0), 105);
    assert!(st.release_slot(dead, std::process::id()));
    assert_eq!(st.pinned(0), 100);
    // The pin lock: taken, and again once released (threads of one process queue on it).
    let g = st.pin_lock().expect("the pin lock");
    drop(g);
    assert!(st.try_pin_lock().is_some());
    // A view (no descriptor to lock with) cannot take it.
    let view = State::open_view(&dir.path().join(STATE_FILE)).unwrap();
    assert!(view.try_pin_lock().is_none());
    assert!(!st.pin_bounded(), "production, no flag");
    st.header().set_class(Class::Opportunistic);
    st.header().flags.fetch_or(FLAG_PIN_BOUND, AcqRel);
    assert!(st.pin_bounded());
    st.post_pin_want(3, 42);
    assert_eq!(st.take_pin_wants(), 1 << 3);
    assert_eq!((st.take_pin_wants(), st.device(3).take_pin_need()), (0, 42));
}

#[test]
fn min_limit_is_the_smallest_nonzero() {
    assert_eq!(min_limit([]), 0, "no process: no limit");
    assert_eq!(min_limit([0, 0]), 0, "no process with a limit");
    assert_eq!(min_limit([2000, 0]), 2000, "0 lifts nobody's limit");
    assert_eq!(min_limit([0, 5000, 2000, 0, 9000]), 2000);
    assert_eq!(min_limit([10_000]), 10_000);
}

#[test]
fn the_container_compute_limit_is_the_smallest_over_live_slots() {
    let dir = tempfile::tempdir().unwrap();
    let st = State::open_or_create(dir.path()).unwrap();
    let mine = st.claim_slot(std::process::id()).unwrap();
    st.set_compute_limit(mine, 5000);
    assert_eq!(st.compute_limit(), 5000);
    let start = |bp: u32| {
        let mut c = spawn_child(
            "limit",
            dir.path(),
            &[("LIBSHARE_ABI_LIMIT", bp.to_string())],
        );
        let mut out = BufReader::new(c.stdout.take().unwrap());
        assert_eq!(child_line(&mut out).as_deref(), Some("ready"));
        c
    };
    let mut capped = start(2000);
    assert_eq!(st.compute_limit(), 2000, "the smaller limit wins");
    let mut free = start(0);
    assert_eq!(
        st.compute_limit(),
        2000,
        "a process without a limit lifts nobody's"
    );
    capped.kill().unwrap();
    capped.wait().unwrap();
    assert_eq!(
        st.compute_limit(),
        2000,
        "a dead process's slot counts until reclaimed"
    );
    assert_eq!(st.reclaim_dead(), 1);
    assert_eq!(st.compute_limit(), 5000, "reclaimed: its limit is gone");
    // A slot claimed again starts without a limit.
    st.release_slot(mine, std::process::id());
    assert_eq!(st.compute_limit(), 0);
    let again = st.claim_slot(std::process::id()).unwrap();
    assert_eq!(st.slot(again).compute_limit.load(Acquire), 0);
    assert_eq!(st.compute_limit(), 0);
    free.kill().unwrap();
    free.wait().unwrap();
}

#[test]
fn bytes_charged_are_returned_and_a_refusal_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let st = State::open_or_create(dir.path()).unwrap();
    st.set_quota(0, 1000);
    let s = st.claim_slot(std::process::id()).unwrap();
    assert!(st.charge(s, 0, 700));
    assert_eq!((used(&st, 0), st.slot(s).net(0)), (700, 700));
    assert!(!st.charge(s, 0, 301), "over the quota");
    assert_eq!((used(&st, 0), st.slot(s).net(0)), (700, 700));
    assert!(st.charge(s, 0, 300), "exactly the quota fits");
    st.charge_held(s, 0, 50); // held by the driver: recorded whatever the quota
    assert_eq!((used(&st, 0), st.slot(s).net(0)), (1050, 1050));
    assert_eq!(st.device(0).peak.load(Acquire), 1050);
    st.uncharge(s, 0, 1050);
    assert_eq!((used(&st, 0), st.slot(s).net(0)), (0, 0));
    // Device 1 has no quota: unlimited.
    assert!(st.charge(s, 1, u64::MAX / 2));
    st.uncharge(s, 1, u64::MAX / 2);
    assert_eq!(used(&st, 1), 0);
    assert!(st.release_slot(s, std::process::id()));
}

#[test]
fn quota_is_never_exceeded_under_contention() {
    let dir = tempfile::tempdir().unwrap();
    let st = Arc::new(State::open_or_create(dir.path()).unwrap());
    st.set_quota(0, 1000);
    let s = st.claim_slot(std::process::id()).unwrap();
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let st = st.clone();
            std::thread::spawn(move || {
                for _ in 0..20_000 {
                    if st.charge(s, 0, 7) {
                        assert!(used(&st, 0) <= 1000);
                        st.uncharge(s, 0, 7);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!((used(&st, 0), st.slot(s).net(0)), (0, 0));
    assert!(st.device(0).peak.load(Acquire) <= 1000);
    assert!(!st.charge(s, 0, 1001));
}

/// Threads charge and uncharge while another repairs `used` from the slots over and over; at
/// each pause the container's `used` is at least what the threads hold (never below) and one
/// quiet repair makes it exact.
#[test]
fn recompute_under_concurrent_charges_is_never_below_and_converges() {
    let dir = tempfile::tempdir().unwrap();
    let st = Arc::new(State::open_or_create(dir.path()).unwrap());
    st.set_quota(0, 64 * MIB);
    let slots: Vec<usize> = (0..3)
        .map(|_| st.claim_slot(std::process::id()).unwrap())
        .collect();
    for round in 0..15 {
        let stop = Arc::new(AtomicBool::new(false));
        let held: Vec<_> = (0..6).map(|_| Arc::new(AtomicU64::new(0))).collect();
        let workers: Vec<_> = (0..6)
            .map(|t| {
                let (st, stop, held) = (st.clone(), stop.clone(), held[t].clone());
                let slot = slots[t % slots.len()];
                std::thread::spawn(move || {
                    let mut x = 0x1234_5678u64 ^ ((t as u64) << 24) ^ round;
                    let mut mine: Vec<u64> = Vec::new();
                    while !stop.load(Relaxed) {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let b = 1 + x % (2 * MIB);
                        if !x.is_multiple_of(3) || mine.is_empty() {
                            if st.charge(slot, 0, b) {
                                mine.push(b);
                            }
                        } else {
                            st.uncharge(slot, 0, mine.pop().unwrap());
                        }
                    }
                    held.store(mine.iter().sum(), Release);
                })
            })
            .collect();
        let repairs = Arc::new(AtomicU64::new(0));
        let repairer = {
            let (st, stop, repairs) = (st.clone(), stop.clone(), repairs.clone());
            std::thread::spawn(move || {
                while !stop.load(Relaxed) {
                    st.recompute_used();
                    repairs.fetch_add(1, Relaxed);
                }
            })
        };
        // At least 20 repairs and 20 ms of charging, however loaded the machine is.
        let t = Instant::now();
        while repairs.load(Relaxed) < 20 || t.elapsed() < Duration::from_millis(20) {
            std::thread::yield_now();
        }
        stop.store(true, Relaxed);
        for w in workers {
            w.join().unwrap();
        }
        repairer.join().unwrap();
        let truth: u64 = held.iter().map(|h| h.load(Acquire)).sum();
        assert!(
            truth <= 64 * MIB,
            "round {round}: {truth} held over the quota"
        );
        assert!(
            used(&st, 0) >= truth,
            "round {round}: used {} below the {truth} held",
            used(&st, 0)
        );
        st.recompute_used();
        assert_eq!(
            used(&st, 0),
            truth,
            "round {round}: a quiet repair is exact"
        );
        for (t, h) in held.iter().enumerate() {
            st.uncharge(slots[t % slots.len()], 0, h.load(Acquire));
        }
        assert_eq!(used(&st, 0), 0);
    }
}

/// Children charge and uncharge from several threads and are killed with SIGKILL at random
/// points; after the survivors settle, a reclaim leaves the container's `used` exactly equal to
/// the survivors' slots and to what they hold.
#[test]
fn kill_9_at_random_points_leaves_used_equal_to_the_survivors() {
    let dir = tempfile::tempdir().unwrap();
    let st = State::open_or_create(dir.path()).unwrap();
    st.set_quota(0, 48 * MIB);
    let mut x = 88172645463325252u64 ^ std::process::id() as u64;
    let mut rng = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for round in 0..6 {
        // Some churn forever (to be killed), some churn and then hold.
        let mut victims = Vec::new();
        let mut holders = Vec::new();
        for _ in 0..3 {
            let mut c = spawn_child("churn", dir.path(), &[]);
            let mut out = BufReader::new(c.stdout.take().unwrap());
            assert_eq!(child_line(&mut out).as_deref(), Some("ready"));
            victims.push(c);
        }
        for _ in 0..2 {
            holders.push(spawn_child("churn-then-hold", dir.path(), &[]));
        }
        for v in &mut victims {
            std::thread::sleep(Duration::from_micros(rng() % 20_000));
            v.kill().unwrap();
            v.wait().unwrap();
        }
        let mut held = 0;
        for h in &mut holders {
            let mut out = BufReader::new(h.stdout.take().unwrap());
            let l = child_line(&mut out).expect("holder line");
            held += l.strip_prefix("held ").unwrap().parse::<u64>().unwrap();
        }
        // Reclaimed here or already by a holder's claim: no victim keeps a slot.
        st.reclaim_dead();
        let victim_pids: Vec<u32> = victims.iter().map(|v| v.id()).collect();
        assert!(
            (0..MAX_PROCS).all(|i| !victim_pids.contains(&st.slot(i).pid.load(Acquire))),
            "round {round}: a killed child keeps its slot"
        );
        assert_eq!(st.live_slots().len(), 2, "round {round}: the two holders");
        assert_eq!(
            used(&st, 0),
            held,
            "round {round}: used = what the survivors hold"
        );
        assert_eq!(live_net(&st, 0), held);
        assert_eq!(used(&st, 1), 0, "round {round}: device 1");
        for mut h in holders {
            h.kill().unwrap();
            h.wait().unwrap();
        }
        assert_eq!(st.reclaim_dead(), 2);
        assert_eq!((used(&st, 0), used(&st, 1)), (0, 0));
        assert!(st.device(0).peak.load(Acquire) <= 48 * MIB);
    }
}

#[test]
fn a_killed_process_s_work_in_flight_leaves_the_container_when_its_slot_is_reclaimed() {
    let dir = tempfile::tempdir().unwrap();
    let st = State::open_or_create(dir.path()).unwrap();
    let mine = st.claim_slot(std::process::id()).unwrap();
    let d = st.device(1);
    crate::rate::add_in_flight(d, Some(&st.slot(mine).in_flight[1]), 1_000_000);
    let mut c = spawn_child("in-flight", dir.path(), &[]);
    let mut out = BufReader::new(c.stdout.take().unwrap());
    assert_eq!(child_line(&mut out).as_deref(), Some("launched"));
    assert_eq!(d.in_flight_ns.load(Acquire), 4_000_000);
    assert_eq!(st.reclaim_dead(), 0, "alive: its work counts");
    assert_eq!(d.in_flight_ns.load(Acquire), 4_000_000);
    let seq = d.drain_seq.load(Acquire);
    c.kill().unwrap();
    c.wait().unwrap();
    assert_eq!(st.reclaim_dead(), 1);
    assert_eq!(
        d.in_flight_ns.load(Acquire),
        1_000_000,
        "the dead process's 3 ms left; this process's 1 ms stays"
    );
    assert_ne!(d.drain_seq.load(Acquire), seq, "waiters are told");
    // This process's own completions, then its exit, leave nothing behind either.
    crate::rate::take_in_flight(d, Some(&st.slot(mine).in_flight[1]), 400_000);
    assert_eq!(st.slot(mine).in_flight[1].load(Acquire), 600_000);
    assert!(st.release_slot(mine, std::process::id()));
    assert_eq!(d.in_flight_ns.load(Acquire), 0);
}

#[test]
fn exec_drops_the_slot_and_the_new_image_reclaims_its_old_one() {
    let dir = tempfile::tempdir().unwrap();
    let st = State::open_or_create(dir.path()).unwrap();
    // exec of another program: the slot (same pid, still running) is reclaimed.
    let mut c = spawn_child("exec-sleep", dir.path(), &[]);
    let mut out = BufReader::new(c.stdout.take().unwrap());
    let slot: usize = child_line(&mut out)
        .unwrap()
        .strip_prefix("slot ")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(st.slot(slot).pid.load(Acquire), c.id());
    let deadline = Instant::now() + Duration::from_secs(10);
    while st.reclaim_dead() == 0 {
        assert!(
            Instant::now() < deadline,
            "the exec'd slot was never reclaimed"
        );
        std::thread::yield_now();
    }
    assert!(
        c.try_wait().unwrap().is_none(),
        "the process still runs (sleep)"
    );
    assert_eq!(st.slot(slot).pid.load(Acquire), 0);
    assert_eq!(used(&st, 0), 0, "the old image's 100 bytes are back");
    c.kill().unwrap();
    c.wait().unwrap();

    // exec of a libshare process: the new image (same pid) reclaims the old image's slot.
    let mut c = spawn_child("exec-self", dir.path(), &[]);
    let mut out = BufReader::new(c.stdout.take().unwrap());
    let l = child_line(&mut out).expect("after-exec line");
    c.wait().unwrap();
    assert!(l.contains("old_pid_is_mine true"), "{l}");
    assert!(
        l.contains("used_before 100 reclaimed 1 used_after 0"),
        "{l}"
    );
    assert!(l.contains("old_slot_pid 0"), "{l}");
}

#[test]
fn a_process_never_reclaims_its_own_slot_and_sees_it_live() {
    let dir = tempfile::tempdir().unwrap();
    let st = State::open_or_create(dir.path()).unwrap();
    let s = st.claim_slot(std::process::id()).unwrap();
    assert!(st.charge(s, 0, 5));
    assert_eq!(st.reclaim_dead(), 0);
    assert_eq!(st.live_slots(), vec![(s, std::process::id())]);
    assert_eq!(used(&st, 0), 5);
    // A second State of the same file in this process: same answer; dropping it keeps our
    // lock (its descriptor is not closed while we own slots).
    let other = State::open_or_create(dir.path()).unwrap();
    assert_eq!(other.reclaim_dead(), 0);
    drop(other);
    let view = State::snapshot(&dir.path().join(STATE_FILE)).unwrap();
    // This process's own lock is invisible to itself, but its own slots count as live.
    assert_eq!(view.live_slots(), vec![(s, std::process::id())]);
    assert!(st.release_slot(s, std::process::id()));
    assert_eq!(used(&st, 0), 0);
}

#[test]
fn a_dead_or_garbage_slot_never_becomes_free_quota() {
    let dir = tempfile::tempdir().unwrap();
    let st = State::open_or_create(dir.path()).unwrap();
    st.set_quota(0, 1000);
    let s = st.claim_slot(std::process::id()).unwrap();
    assert!(st.charge(s, 0, 400));
    // A dead process's slot whose uncharge was cut in the middle: the container already gave
    // back its 200, the slot still shows them. Subtracting the slot would free 200 of ours.
    let g = st.slot(s + 1);
    st.header().slots_hwm.fetch_max(s as u32 + 2, AcqRel); // as its claim did
    g.pid.store(u32::MAX - 3, Release);
    g.charged[0].store(900, Release);
    g.uncharged[0].store(700, Release);
    assert_eq!(st.reclaim_dead(), 1);
    assert_eq!(used(&st, 0), 400, "exactly the live slot");
    // Garbage: a huge net on a slot nobody holds, and a `used` written below the truth.
    g.pid.store(12345, Release);
    g.charged[0].store(u64::MAX, Release);
    st.device(0).used.store(3, Release);
    assert_eq!(st.reclaim_dead(), 1);
    assert_eq!(used(&st, 0), 400, "raised back to the live slot");
    assert!(!st.charge(s, 0, 601));
    assert!(st.charge(s, 0, 600));
}

#[test]
fn second_open_sees_the_same_state_and_bad_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let a = State::open_or_create(dir.path()).unwrap();
    a.set_quota(1, 5);
    let b = State::open_or_create(dir.path()).unwrap();
    assert_eq!(b.device(1).quota.load(Acquire), 5);
    let good = std::fs::read(dir.path().join(STATE_FILE)).unwrap();
    let bad = tempfile::tempdir().unwrap();
    let p = bad.path().join(STATE_FILE);
    let try_with = |bytes: &[u8]| {
        let _ = std::fs::remove_file(&p);
        std::fs::write(&p, bytes).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        State::open_or_create(bad.path())
            .err()
            .map(|e| e.to_string())
    };
    let mut v = good.clone();
    v[8] = 99;
    assert!(try_with(&v).unwrap().contains("another libshare version"));
    let mut v = good.clone();
    v[0] ^= 1;
    assert!(try_with(&v).unwrap().contains("bad magic"));
    let mut v = good.clone();
    v[44] = 0x80; // unknown flag
    assert!(try_with(&v).unwrap().contains("unknown flags"));
    let mut v = good.clone();
    v.extend_from_slice(&[0; 64]);
    assert!(try_with(&v).unwrap().contains("longer than its layout"));
    assert!(try_with(b"not a state file").unwrap().contains("truncated"));
    for e in [try_with(&v).unwrap(), try_with(b"x").unwrap()] {
        assert!(
            !e.contains('\n') && e.contains(": "),
            "one line saying what to do: {e}"
        );
    }
    // Open to other users: refused.
    std::fs::write(&p, &good).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666)).unwrap();
    let e = State::open_or_create(bad.path()).err().unwrap();
    assert!(matches!(e, StateError::OpenToOthers { .. }), "{e}");
}

#[test]
fn a_view_follows_the_file_and_never_writes_it() {
    let dir = tempfile::tempdir().unwrap();
    let st = State::open_or_create(dir.path()).unwrap();
    let s = st.claim_slot(std::process::id()).unwrap();
    let path = dir.path().join(STATE_FILE);
    let view = State::open_view(&path).unwrap();
    assert!(st.charge(s, 0, 100));
    assert_eq!(used(&view, 0), 100, "updates are visible");
    view.device(1).used.store(7, Release);
    assert_eq!(used(&st, 1), 0, "the view's writes stay private");
    assert_eq!(view.reclaim_dead(), 0);
    assert_eq!(view.claim_slot(1), None);
    let bad = dir.path().join("short");
    std::fs::write(&bad, b"x").unwrap();
    assert!(State::open_view(&bad).is_err());
    assert!(State::snapshot(&bad).is_err());
    // A truncation under a view shows zeros instead of killing the reader.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(4096)
        .unwrap();
    assert_eq!(view.slot(MAX_PROCS - 1).pid.load(Acquire), 0);
    st.recover();
}

#[test]
fn symlinks_fifos_and_foreign_owners_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    // A symlink as the state file.
    let c = dir.path().join("c1");
    std::fs::create_dir(&c).unwrap();
    std::fs::write(dir.path().join("elsewhere"), b"").unwrap();
    std::os::unix::fs::symlink(dir.path().join("elsewhere"), c.join(STATE_FILE)).unwrap();
    let e = State::open_or_create(&c).err().unwrap();
    assert!(matches!(e, StateError::Symlink { .. }), "{e}");
    assert!(matches!(
        State::snapshot(&c.join(STATE_FILE)).err().unwrap(),
        StateError::Symlink { .. }
    ));
    assert_eq!(
        std::fs::metadata(dir.path().join("elsewhere"))
            .unwrap()
            .len(),
        0,
        "not written through"
    );
    // A FIFO: refused at once, never blocks.
    let c = dir.path().join("c2");
    std::fs::create_dir(&c).unwrap();
    let fifo = std::ffi::CString::new(c.join(STATE_FILE).as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let t = Instant::now();
    let e = State::open_or_create(&c).err().unwrap();
    assert!(e.to_string().contains("FIFO"), "{e}");
    let e = State::snapshot(&c.join(STATE_FILE)).err().unwrap();
    assert!(e.to_string().contains("FIFO"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(2));
    // A directory on the way writable by others (no sticky bit), and one of another user.
    let c = dir.path().join("open");
    std::fs::create_dir(&c).unwrap();
    std::fs::set_permissions(&c, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = State::open_or_create(&c.join("x")).err().unwrap();
    assert!(matches!(e, StateError::OpenToOthers { .. }), "{e}");
    if fsafe::euid() == 0 {
        let c = dir.path().join("theirs");
        std::fs::create_dir(&c).unwrap();
        std::os::unix::fs::chown(&c, Some(65534), Some(65534)).unwrap();
        let e = State::open_or_create(&c.join("x")).err().unwrap();
        assert!(
            matches!(e, StateError::ForeignOwner { owner: 65534, .. }),
            "{e}"
        );
    } else {
        eprintln!("SKIP foreign-owner part: needs root to chown a directory");
    }
}

use std::os::unix::ffi::OsStrExt;

fn setpriv_nobody() -> Option<Command> {
    let ok = fsafe::euid() == 0
        && Command::new("setpriv")
            .arg("--help")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("SKIP the unprivileged part: needs root and setpriv");
        return None;
    }
    let mut c = Command::new("setpriv");
    c.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"]);
    Some(c)
}

fn run_as_nobody(mode: &str, dir: &Path) -> Option<String> {
    let mut cmd = setpriv_nobody()?;
    let out = cmd
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", "tests::child_entry", "--nocapture"])
        .env("LIBSHARE_ABI_CHILD", mode)
        .env("LIBSHARE_ABI_DIR", dir)
        .output()
        .unwrap();
    let mut r = BufReader::new(&out.stdout[..]);
    let l = child_line(&mut r);
    assert!(l.is_some(), "{}", String::from_utf8_lossy(&out.stderr));
    l
}

/// As an unprivileged user: files and directories are private under umask 0, and a directory
/// another user pre-created (the `/tmp/libshare-<uid>` attack) is never used.
#[test]
fn as_another_user_modes_are_private_and_a_planted_dir_is_refused() {
    let top = tempfile::tempdir().unwrap();
    std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mine = top.path().join("mine");
    std::fs::create_dir(&mine).unwrap();
    if fsafe::euid() == 0 {
        std::os::unix::fs::chown(&mine, Some(65534), Some(65534)).unwrap();
    }
    let Some(l) = run_as_nobody("umask0", &mine) else {
        return;
    };
    assert_eq!(l, "ok true containers 700 c 700 file 600");
    // Planted by root (another user for nobody), world-writable: refused.
    let planted = top.path().join("planted");
    std::fs::create_dir(&planted).unwrap();
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o777)).unwrap();
    let l = run_as_nobody("open", &planted.join("c")).unwrap();
    assert!(
        l.starts_with("error ") && l.contains("writable by other users"),
        "{l}"
    );
    // Planted by a third user (uid 1), private to them: refused by owner.
    let theirs = top.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(1), Some(1)).unwrap();
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o755)).unwrap();
    let l = run_as_nobody("open", &theirs).unwrap();
    assert!(l.contains("belongs to uid 1"), "{l}");
}

#[test]
fn default_state_dir_is_private() {
    match default_state_dir_checked() {
        Ok(p) => {
            if p.exists() {
                let m = std::fs::symlink_metadata(&p).unwrap();
                assert!(m.is_dir() && m.mode() & 0o022 == 0, "{}", p.display());
                assert!(m.uid() == 0 || m.uid() == fsafe::euid());
            }
        }
        Err(e) => assert!(e.to_string().contains("LIBSHARE_STATE_DIR"), "{e}"),
    }
    assert_eq!(
        fsafe::private_dir_of(Path::new("/nonexistent-libshare-test"), 0),
        Ok(false)
    );
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    assert!(
        fsafe::private_dir_of(d.path(), fsafe::euid()).is_err(),
        "0755 is not private"
    );
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(fsafe::private_dir_of(d.path(), fsafe::euid()), Ok(true));
    assert!(
        fsafe::private_dir_of(d.path(), fsafe::euid() + 1).is_err(),
        "another owner"
    );
}

/// A process keeps charging while another truncates its state file: it survives, the quota
/// stays enforced (never unlimited), and its holding is counted again.
#[test]
fn truncation_does_not_kill_and_the_quota_holds() {
    for len in [0u64, 4096, 100] {
        let dir = tempfile::tempdir().unwrap();
        let mut c = spawn_child("truncation", dir.path(), &[]);
        let mut out = BufReader::new(c.stdout.take().unwrap());
        assert_eq!(child_line(&mut out).as_deref(), Some("ready"));
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.path().join(STATE_FILE))
            .unwrap();
        f.set_len(len).unwrap();
        drop(f);
        // Let the child's worker meet the truncated pages (it loops without pause); the
        // outcome is checked below either way.
        std::thread::sleep(Duration::from_millis(50));
        writeln!(c.stdin.as_mut().unwrap(), "go").unwrap();
        let l = child_line(&mut out);
        let status = c.wait().unwrap();
        let l = l.unwrap_or_else(|| panic!("truncated to {len}: child died: {status:?}"));
        assert!(status.success(), "truncated to {len}: {status:?}");
        assert!(
            l.starts_with("alive quota 1000 used 600 over_quota_charged false"),
            "truncated to {len}: {l}"
        );
        assert!(l.ends_with("slot_net 600"), "{l}");
        assert!(
            std::fs::metadata(dir.path().join(STATE_FILE))
                .unwrap()
                .len()
                == FILE_SIZE as u64,
            "truncated to {len}: size restored"
        );
    }
}

/// A new process that opens a short file with a valid header restores it; a live process then
/// re-publishes its part at its next charge.
#[test]
fn a_short_file_is_restored_and_live_processes_republish() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = spawn_child("churn-then-hold", dir.path(), &[]);
    let mut out = BufReader::new(c.stdout.take().unwrap());
    let held: u64 = child_line(&mut out)
        .unwrap()
        .strip_prefix("held ")
        .unwrap()
        .parse()
        .unwrap();
    let path = dir.path().join(STATE_FILE);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(4096)
        .unwrap();
    let st = State::open_or_create(dir.path()).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), FILE_SIZE as u64);
    // The child holds its slot's lock though its pid was lost: its slot is not taken.
    let s = st.claim_slot(std::process::id()).unwrap();
    assert!(st.charge(s, 0, 10));
    assert!(used(&st, 0) >= 10);
    c.kill().unwrap();
    c.wait().unwrap();
    let _ = held;
    st.reclaim_dead();
    assert_eq!(used(&st, 0), 10);
}

#[test]
fn a_removed_file_gets_its_name_back_and_a_replaced_one_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let a = State::open_or_create(dir.path()).unwrap();
    a.set_quota(0, 1000);
    let s = a.claim_slot(std::process::id()).unwrap();
    assert!(a.charge(s, 0, 700));
    std::fs::remove_file(dir.path().join(STATE_FILE)).unwrap();
    // A new process finds the second name: same file, same quota.
    let b = State::open_or_create(dir.path()).unwrap();
    assert_eq!((used(&b, 0), b.device(0).quota.load(Acquire)), (700, 1000));
    assert!(a.check_path().is_ok());
    // A live process restores the name too.
    std::fs::remove_file(dir.path().join(STATE_FILE)).unwrap();
    assert!(a.check_path().is_ok());
    assert!(dir.path().join(STATE_FILE).exists());
    // Both names gone: a new file; the old one is reported as replaced.
    std::fs::remove_file(dir.path().join(STATE_FILE)).unwrap();
    std::fs::remove_file(dir.path().join(KEEP_FILE)).unwrap();
    let c = State::open_or_create(dir.path()).unwrap();
    assert_eq!(used(&c, 0), 0);
    let e = a.check_path().err().unwrap();
    assert!(matches!(e, StateError::Replaced { .. }), "{e}");
}

#[test]
fn a_sealed_memfd_cannot_be_truncated() {
    let (st, fd) = State::create_sealed_memfd().unwrap();
    let s = st.claim_slot(std::process::id()).unwrap();
    assert!(st.charge(s, 0, 42));
    let f = File::from(fd);
    assert!(f.set_len(0).is_err(), "sealed against shrinking");
    let other = State::from_fd(f).unwrap();
    assert_eq!(used(&other, 0), 42);
    assert_eq!(other.live_slots(), vec![(s, std::process::id())]);
}

/// A process stopped while holding the lifecycle lock does not hang the others: they skip the
/// repair (done by a later call) and can still claim a slot.
#[test]
fn a_stuck_lifecycle_lock_does_not_hang_the_container() {
    let dir = tempfile::tempdir().unwrap();
    let st = State::open_or_create(dir.path()).unwrap();
    let mut holder = match Command::new("python3")
        .args([
            "-c",
            "import fcntl,sys,time\nf=open(sys.argv[1],'r+b')\nfcntl.lockf(f,fcntl.LOCK_EX|fcntl.LOCK_NB,1,int(sys.argv[2]))\nprint('@ locked',flush=True)\ntime.sleep(60)",
        ])
        .arg(dir.path().join(STATE_FILE))
        .arg(LIFECYCLE_LOCK.to_string())
        .stdout(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("SKIP: python3 is needed to hold a lock from another process: {e}");
            return;
        }
    };
    let mut out = BufReader::new(holder.stdout.take().unwrap());
    assert_eq!(child_line(&mut out).as_deref(), Some("locked"));
    let g = st.slot(5);
    st.header().slots_hwm.fetch_max(6, AcqRel); // as its claim did
    g.pid.store(77, Release);
    g.charged[0].store(100, Release);
    let t = Instant::now();
    assert_eq!(st.reclaim_dead(), 0, "skipped while the lock is stuck");
    let s = st.claim_slot(std::process::id()).expect("claims anyway");
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert_eq!(st.reclaim_dead(), 1, "done once the lock is free");
    assert!(st.charge(s, 0, 1));
    assert_eq!(used(&st, 0), 1);
}

#[test]
fn only_a_process_being_torn_down_counts_as_exiting() {
    let me = std::process::id();
    assert!(
        !crate::proc_exiting(me, crate::proc_start_time(me)),
        "a running process"
    );
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    // Wait until it is a zombie (exited, not reaped): its teardown is over.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.rsplit_once(')').unwrap().1.trim_start().starts_with('Z'))
        .unwrap_or(false)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "child never became a zombie"
        );
        std::thread::yield_now();
    }
    assert!(
        !crate::proc_exiting(pid, 0),
        "a zombie has freed everything"
    );
    child.wait().unwrap();
    assert!(!crate::proc_exiting(pid, 0), "a reaped process");
}

#[test]
fn the_daemon_claims_its_state_directory_private() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run/libshare");
    assert!(
        !crate::claim_state_dir(&dir).unwrap(),
        "created: nobody had rights to lose"
    );
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&dir), 0o711, "others may only pass through");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert!(crate::claim_state_dir(&dir).unwrap(), "tightened");
    assert_eq!(mode(&dir), 0o711);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    assert!(
        !crate::claim_state_dir(&dir).unwrap(),
        "opened for search only"
    );
    assert_eq!(mode(&dir), 0o711);
    let file = tmp.path().join("file");
    std::fs::write(&file, b"").unwrap();
    assert!(crate::claim_state_dir(&file).is_err(), "a file is refused");
}

#[test]
fn scans_stop_at_the_highest_slot_ever_claimed() {
    let dir = tempfile::tempdir().unwrap();
    let st = State::open_or_create(dir.path()).unwrap();
    assert_eq!(st.slots_in_use(), 0, "a new file has none");
    let me = std::process::id();
    let a = st.claim_slot(me).unwrap();
    let b = st.claim_slot(me).unwrap();
    assert_eq!((a, b), (0, 1), "the lowest free slots");
    assert_eq!(st.slots_in_use(), 2);
    assert!(st.release_slot(a, me));
    assert_eq!(st.slots_in_use(), 2, "never lowered while the file lives");
    assert_eq!(st.claim_slot(me), Some(0), "a freed slot is reused first");
    assert_eq!(st.live_slots().len(), 2);
    // A view (as the daemon opens it) sees the same end, and the same live slots.
    let view = State::open_existing(&dir.path().join(STATE_FILE)).unwrap();
    assert_eq!(view.slots_in_use(), 2);
    // The content lost (truncated and re-grown: zeros): the live process marks its slots again.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join(STATE_FILE))
        .unwrap();
    f.set_len(0).unwrap();
    f.set_len(FILE_SIZE as u64).unwrap();
    assert_eq!(st.slots_in_use(), 0);
    st.recover();
    assert_eq!(st.slots_in_use(), 2);
    assert_eq!(st.live_slots().len(), 2);
    // A garbage hwm never makes a scan leave the table.
    st.header().slots_hwm.store(u32::MAX, Release);
    assert_eq!(st.slots_in_use(), MAX_PROCS);
    assert_eq!(st.reclaim_dead(), 0);
    assert_eq!(st.live_slots().len(), 2);
}
