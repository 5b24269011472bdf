use super::*;

const MS: u64 = 1_000_000;
const US: u64 = 1_000;
const T0: u64 = 1_000 * MS;

const PROD: ContainerId = 1;
const OPP: ContainerId = 2;

fn entry(id: ContainerId, class: Class, c: Counters) -> Entry {
    Entry {
        id,
        device: 0,
        class,
        c,
    }
}

fn snap(entries: &[Entry]) -> Snapshot {
    Snapshot {
        entries: entries.to_vec(),
    }
}

fn find(ds: &Decisions, id: ContainerId) -> Option<Decision> {
    ds.iter().copied().find(|d| d.id == id)
}

/// A production job on a fixed cycle as its shim would publish it: `launches` moves while busy,
/// `busy_since` is the phase's start, `drained_at` its end.
#[derive(Clone, Copy)]
struct Periodic {
    period: u64,
    busy: u64,
    /// Arrival k is offset by `jitter[k % 4]`.
    jitter: [u64; 4],
    start: u64,
}

impl Periodic {
    fn arrival(&self, k: u64) -> u64 {
        self.start + k * self.period + self.jitter[(k % 4) as usize]
    }

    fn at(&self, now: u64) -> Counters {
        let mut c = Counters::default();
        if now < self.start {
            return c;
        }
        let mut k = (now - self.start) / self.period;
        if k > 0 && self.arrival(k) > now {
            k -= 1;
        }
        let a = self.arrival(k);
        c.launches = (k + 1) * 100 + ((now - a).min(self.busy) / US);
        if now < a + self.busy {
            c.busy_since = a;
            c.drained_at = if k > 0 {
                self.arrival(k - 1) + self.busy
            } else {
                0
            };
        } else {
            c.drained_at = a + self.busy;
        }
        c
    }
}

fn opp(launches: u64) -> Counters {
    Counters {
        launches,
        ..Counters::default()
    }
}

/// Steps the policy every ms over [from, to) with production `p` and a saturating opportunistic
/// job; returns the decisions of the last tick.
fn run_periodic(ps: &mut PolicyState, p: &Periodic, from: u64, to: u64) -> Decisions {
    let mut last = Vec::new();
    let mut now = from;
    while now < to {
        let s = snap(&[
            entry(PROD, Class::Production, p.at(now)),
            entry(OPP, Class::Opportunistic, opp(now / US)),
        ]);
        last = step(ps, &s, now);
        now += MS;
    }
    last
}

#[test]
fn production_is_never_gated() {
    let mut ps = PolicyState::new(PolicyKind::Libshare);
    let p = Periodic {
        period: 10 * MS,
        busy: 3 * MS,
        jitter: [0; 4],
        start: T0,
    };
    let mut now = T0;
    while now < T0 + 200 * MS {
        // A production container whose word is not Open (left over from another class) is
        // opened; one that is Open is left alone.
        let mut c = p.at(now);
        c.gate = if (now / MS) % 2 == 0 {
            Gate::Paused
        } else {
            Gate::Open
        };
        let s = snap(&[
            entry(PROD, Class::Production, c),
            entry(OPP, Class::Opportunistic, opp(now / US)),
        ]);
        let ds = step(&mut ps, &s, now);
        match find(&ds, PROD) {
            Some(d) => {
                assert_eq!(d.gate, Gate::Open);
                assert_eq!(c.gate, Gate::Paused);
            }
            None => assert_eq!(c.gate, Gate::Open),
        }
        assert!(
            find(&ds, OPP).is_some(),
            "opportunistic gates written every tick"
        );
        now += MS;
    }
}

#[test]
fn a_periodic_trace_gives_a_window_before_the_next_arrival() {
    let mut ps = PolicyState::new(PolicyKind::Libshare);
    let p = Periodic {
        period: 10 * MS,
        busy: 3 * MS,
        jitter: [0; 4],
        start: T0,
    };
    // 6 cycles: 5 intervals learned. At 5 ms into cycle 6, production is idle (drained at 3).
    let ds = run_periodic(&mut ps, &p, T0, p.arrival(6) + 5 * MS + 1);
    assert_eq!(ps.period(PROD, 0), Some((10 * MS, 0)));
    assert_eq!(ps.busy_duration(PROD, 0), Some(3 * MS));
    let d = find(&ds, OPP).unwrap();
    assert_eq!(
        d.gate,
        Gate::Run {
            in_flight_us: 2_000,
            window: true,
            share: false
        },
        "a window, and the budget should the prediction be wrong"
    );
    assert_eq!(
        d.window_end,
        p.arrival(7) - 300 * US,
        "next arrival − 300 µs"
    );

    // With jitter (±200 µs), the guard grows to 3 × the median absolute deviation.
    let mut ps = PolicyState::new(PolicyKind::Libshare);
    let p = Periodic {
        jitter: [0, 200 * US, 0, 200 * US],
        ..p
    };
    let ds = run_periodic(&mut ps, &p, T0, p.arrival(10) + 5 * MS + 1);
    let (period, jitter) = ps.period(PROD, 0).unwrap();
    // Arrivals ±200 µs make intervals of 9.8 and 10.2 ms: a deviation of 400 µs.
    assert_eq!(jitter, 400 * US);
    let d = find(&ds, OPP).unwrap();
    assert_eq!(d.window_end, p.arrival(10) + period - 1_200 * US);
    assert!(d.window_end < p.arrival(11));
}

/// Production's phases as a list: arrival `k` at `arrivals[k]`, busy for `busy[k]`.
struct Phases {
    arrivals: Vec<u64>,
    busy: Vec<u64>,
}

impl Phases {
    fn at(&self, now: u64) -> Counters {
        let mut c = Counters::default();
        let Some(k) = self.arrivals.iter().rposition(|&a| a <= now) else {
            return c;
        };
        let a = self.arrivals[k];
        let drain = |k: usize| self.arrivals[k] + self.busy[k];
        c.launches = (k as u64 + 1) * 100 + ((now - a).min(self.busy[k]) / US);
        if now < drain(k) {
            c.busy_since = a;
            c.drained_at = if k > 0 { drain(k - 1) } else { 0 };
        } else {
            c.drained_at = drain(k);
        }
        c
    }

    /// Steps the policy every 250 µs from the first arrival to the last, and asserts that every
    /// window written from arrival `from` on ends before production's next arrival. Returns,
    /// per arrival, whether a window that was still open came before it.
    fn assert_windows_end_before_arrivals(&self, from: usize) -> Vec<bool> {
        let mut ps = PolicyState::new(PolicyKind::Libshare);
        let mut windows = vec![false; self.arrivals.len()];
        let mut now = self.arrivals[0];
        while now < *self.arrivals.last().unwrap() {
            let s = snap(&[
                entry(PROD, Class::Production, self.at(now)),
                entry(OPP, Class::Opportunistic, opp(now / US)),
            ]);
            let d = find(&step(&mut ps, &s, now), OPP).unwrap();
            let next = self.arrivals.iter().position(|&a| a > now).unwrap();
            if let Gate::Run { window: true, .. } = d.gate {
                windows[next] |= d.window_end > now;
                if next > from {
                    assert!(
                        d.window_end < self.arrivals[next],
                        "window written at {:.2} ms ends {:.2} ms after arrival {next}",
                        (now - T0) as f64 / 1e6,
                        (d.window_end - self.arrivals[next]) as f64 / 1e6
                    );
                }
            }
            now += 250 * US;
        }
        windows
    }
}

#[test]
fn a_window_ends_before_the_arrival_after_a_request_that_ran_long() {
    // Requests on a 25 ms clock, 3.4 ms each, ±50 µs; every 10th runs 4 ms longer (it was
    // held up): its late drain must not move the next window past the clock's next arrival.
    let n = 60;
    let arrivals = (0..n).map(|k| T0 + k * 25 * MS + [0, 50 * US][k as usize % 2]);
    let busy = (0..n).map(|k| if k % 10 == 9 { 7_400 * US } else { 3_400 * US });
    let p = Phases {
        arrivals: arrivals.collect(),
        busy: busy.collect(),
    };
    let windows = p.assert_windows_end_before_arrivals(0);
    assert!(
        windows[10..].iter().all(|&w| w),
        "a window before every arrival"
    );
}

#[test]
fn a_request_that_started_late_does_not_move_the_clock() {
    // Requests on a 25 ms clock, 3.4 ms each; every 10th starts 6 ms late (its process was
    // not scheduled): the next request is due on the clock all the same.
    let n = 60;
    let arrivals = (0..n).map(|k| T0 + k * 25 * MS + if k % 10 == 9 { 6 * MS } else { 0 });
    let p = Phases {
        arrivals: arrivals.collect(),
        busy: vec![3_400 * US; n as usize],
    };
    let windows = p.assert_windows_end_before_arrivals(0);
    assert!(
        windows[10..].iter().all(|&w| w),
        "a window before every arrival"
    );
}

#[test]
fn an_arrival_the_daemon_did_not_see_does_not_shift_the_clock() {
    // Requests on a 25 ms clock, 3.4 ms each, but every 7th is served in 100 µs, between two
    // of the daemon's ticks: it sees no arrival there, and one interval of two periods. The
    // clock's next tick stays where it is: every gap still gets a window that ends before it.
    let n = 60;
    let p = Phases {
        // (Ticks fall on the clock; the short ones begin 100 µs after one.)
        arrivals: (0..n)
            .map(|k| T0 + k * 25 * MS + if k % 7 == 3 { 100 * US } else { 0 })
            .collect(),
        busy: (0..n)
            .map(|k| if k % 7 == 3 { 100 * US } else { 3_400 * US })
            .collect(),
    };
    let windows = p.assert_windows_end_before_arrivals(0);
    let missing: Vec<usize> = (10..n as usize)
        .filter(|&k| !windows[k] && k % 7 != 3)
        .collect();
    assert!(missing.is_empty(), "no window before arrivals {missing:?}");
}

#[test]
fn a_pattern_that_gets_shorter_is_followed_from_its_first_sample() {
    // A warm-up loop (3.4 ms of work, then 25.5 ms asleep: a 28.9 ms cycle) turns into
    // requests on a 25 ms clock: the median of the old samples would put the next eight or so
    // arrivals 3.9 ms late, and while old and new samples are mixed their deviation would make
    // the job unpredictable; from the second arrival of the new pattern on, no window may reach
    // past an arrival, and every gap gets one.
    let mut arrivals = Vec::new();
    let mut t = T0;
    for _ in 0..20 {
        arrivals.push(t);
        t += 28_900 * US;
    }
    for _ in 0..20 {
        arrivals.push(t);
        t += 25 * MS;
    }
    let busy = vec![3_400 * US; arrivals.len()];
    let p = Phases { arrivals, busy };
    let windows = p.assert_windows_end_before_arrivals(21);
    // And it stays predictable while old and new samples are mixed.
    let missing: Vec<usize> = (10..windows.len()).filter(|&k| !windows[k]).collect();
    assert!(missing.is_empty(), "no window before arrivals {missing:?}");
}

#[test]
fn production_arrival_pauses_opportunistic_work_at_once() {
    let mut ps = PolicyState::new(PolicyKind::Libshare);
    let p = Periodic {
        period: 10 * MS,
        busy: 3 * MS,
        jitter: [0; 4],
        start: T0,
    };
    // Ticks every ms, half a ms off the cycle: every tick that sees production busy pauses,
    // every other one lets opportunistic work run (in a window once learned).
    let (mut paused, mut ran) = (0, 0);
    let mut now = T0 + MS / 2;
    while now < T0 + 300 * MS {
        let c = p.at(now);
        let s = snap(&[
            entry(PROD, Class::Production, c),
            entry(OPP, Class::Opportunistic, opp(now / US)),
        ]);
        let g = find(&step(&mut ps, &s, now), OPP).unwrap().gate;
        if c.busy_since != 0 {
            assert_eq!(g, Gate::Paused, "at {} ms", (now - T0) / MS);
            paused += 1;
        } else {
            assert_ne!(g, Gate::Paused, "at {} ms", (now - T0) / MS);
            ran += 1;
        }
        now += MS;
    }
    assert_eq!((paused, ran), (90, 210));
}

#[test]
fn unpredictable_or_long_idle_production_gets_the_in_flight_bound() {
    let bounded = Gate::Run {
        in_flight_us: 2_000,
        window: false,
        share: false,
    };
    // Jitter of 30 % of the period: not predictable.
    let mut ps = PolicyState::new(PolicyKind::Libshare);
    let p = Periodic {
        period: 10 * MS,
        busy: 2 * MS,
        jitter: [0, 3 * MS, 0, 3 * MS],
        start: T0,
    };
    let ds = run_periodic(&mut ps, &p, T0, p.arrival(8) + 4 * MS + 1);
    assert_eq!(find(&ds, OPP).unwrap().gate, bounded);

    // Periodic, then silent past 2 × period + 10 ms (but still active: launched < 3 s ago).
    let mut ps = PolicyState::new(PolicyKind::Libshare);
    let p = Periodic {
        jitter: [0; 4],
        ..p
    };
    run_periodic(&mut ps, &p, T0, p.arrival(8) + 4 * MS);
    let frozen = p.at(p.arrival(8) + 4 * MS);
    let mut last = Vec::new();
    for t in 0..40 {
        let now = p.arrival(8) + 4 * MS + t * MS;
        let s = snap(&[
            entry(PROD, Class::Production, frozen),
            entry(OPP, Class::Opportunistic, opp(now / US)),
        ]);
        last = step(&mut ps, &s, now);
    }
    assert_eq!(find(&last, OPP).unwrap().gate, bounded);
}

/// Issue 31 (S10 at 60 % load): a prediction production outlives (no arrival by its predicted
/// time + 1 ms) stops holding opportunistic work for the rest of the idle phase: the window
/// closes before the arrival as it should, then the budget alone bounds what goes.
#[test]
fn a_prediction_production_outlives_gives_way_to_the_budget() {
    let mut ps = PolicyState::new(PolicyKind::Libshare);
    let p = Periodic {
        period: 10 * MS,
        busy: 2 * MS,
        jitter: [0; 4],
        start: T0,
    };
    run_periodic(&mut ps, &p, T0, p.arrival(8) + 3 * MS);
    let frozen = p.at(p.arrival(8) + 3 * MS);
    let gate_at = |ps: &mut PolicyState, now: u64| {
        let s = snap(&[
            entry(PROD, Class::Production, frozen),
            entry(OPP, Class::Opportunistic, opp(now / US)),
        ]);
        find(&step(ps, &s, now), OPP).unwrap()
    };
    // Before the predicted arrival (arrival 9 at 90 ms): a window that ends before it.
    let d = gate_at(&mut ps, p.arrival(8) + 5 * MS);
    assert!(matches!(d.gate, Gate::Run { window: true, .. }), "{d:?}");
    assert!(d.window_end < p.arrival(9), "{d:?}");
    // Just after it, not yet outlived: still the window (closed: its end has passed).
    let d = gate_at(&mut ps, p.arrival(9) + 300 * US);
    assert!(matches!(d.gate, Gate::Run { window: true, .. }), "{d:?}");
    // 1 ms and more after it: the budget alone, no window.
    for late in [1_100 * US, 5 * MS, 12 * MS] {
        let d = gate_at(&mut ps, p.arrival(9) + late);
        assert_eq!(
            d.gate,
            Gate::Run {
                in_flight_us: 2_000,
                window: false,
                share: false
            },
            "{late} ns late"
        );
    }
}

#[test]
fn a_lone_opportunistic_container_runs_open() {
    let mut ps = PolicyState::new(PolicyKind::Libshare);
    // A production container that never launched does not count.
    let mut now = T0;
    for _ in 0..10 {
        let s = snap(&[
            entry(PROD, Class::Production, Counters::default()),
            entry(OPP, Class::Opportunistic, opp(now / US)),
        ]);
        let ds = step(&mut ps, &s, now);
        assert_eq!(find(&ds, OPP).unwrap().gate, Gate::Open);
        assert_eq!(find(&ds, OPP).unwrap().refill, None);
        now += MS;
    }
    // Production that stopped launching more than 3 s ago is no longer active, but it is
    // present: it may come back at any time, and then meets at most the budget.
    let old = Counters {
        launches: 5,
        drained_at: now,
        ..Counters::default()
    };
    let mut ps = PolicyState::new(PolicyKind::Libshare);
    for t in 0..=3_100u64 {
        let s = snap(&[
            entry(PROD, Class::Production, old),
            entry(OPP, Class::Opportunistic, opp(t)),
        ]);
        let ds = step(&mut ps, &s, now + t * MS);
        let g = find(&ds, OPP).unwrap().gate;
        // (At t = 0 it has not launched and waits for nothing: paused until it does.)
        let want = if t == 0 {
            Gate::Paused
        } else {
            Gate::Run {
                in_flight_us: 2_000,
                window: false,
                share: false,
            }
        };
        assert_eq!(g, want, "t = {t} ms");
    }
    // 100 % (or more) from the environment is no limit.
    assert_eq!(static_share(0, 10_000), None);
    assert_eq!(static_share(0, 0), None);
    assert_eq!(static_share(5_000, 3_000), Some(3_000));
    assert_eq!(static_share(2_000, 0), Some(2_000));
}

#[test]
fn a_30_percent_share_is_refilled_at_30_percent() {
    let mut ps = PolicyState::new(PolicyKind::Libshare);
    let mut tokens: i64 = 0;
    let mut granted: i64 = 0;
    let mut now = T0;
    for _ in 0..=1_000 {
        let c = Counters {
            compute: 3_000,
            launches: now / US,
            ..Counters::default()
        };
        let ds = step(&mut ps, &snap(&[entry(OPP, Class::Opportunistic, c)]), now);
        let d = find(&ds, OPP).unwrap();
        assert_eq!(
            d.gate,
            Gate::Run {
                in_flight_us: 0,
                window: false,
                share: true
            }
        );
        assert_eq!(d.share_bp, 3_000);
        let r = d.refill.unwrap();
        assert_eq!(r.cap, 3 * MS as i64, "cap = share × 10 ms");
        tokens = (tokens + r.ns).min(r.cap);
        // A saturating job spends whatever is there in kernels of 200 µs (debt of one kernel).
        while tokens > 0 {
            tokens -= 200 * US as i64;
            granted += 200 * US as i64;
        }
        now += MS;
    }
    // Over 1 s: 300 ms ± one kernel.
    assert!(
        (granted - 300 * MS as i64).abs() <= 200 * US as i64,
        "{granted}"
    );
    // A daemon stall does not bank more than the cap.
    let c = Counters {
        compute: 3_000,
        ..Counters::default()
    };
    let ds = step(
        &mut ps,
        &snap(&[entry(OPP, Class::Opportunistic, c)]),
        now + 5_000 * MS,
    );
    assert_eq!(find(&ds, OPP).unwrap().refill.unwrap().ns, 3 * MS as i64);
}

#[test]
fn weights_1_to_3_split_the_device_2500_7500() {
    let mut ps = PolicyState::new(PolicyKind::Libshare);
    let a = |launches, weight| Counters {
        launches,
        weight,
        ..Counters::default()
    };
    let mut ds = Vec::new();
    for t in 0..5u64 {
        let s = snap(&[
            entry(10, Class::Opportunistic, a(t, 1)),
            entry(11, Class::Opportunistic, a(t, 3)),
        ]);
        ds = step(&mut ps, &s, T0 + t * MS);
    }
    assert_eq!(find(&ds, 10).unwrap().share_bp, 2_500);
    assert_eq!(find(&ds, 11).unwrap().share_bp, 7_500);
    assert!(matches!(
        find(&ds, 11).unwrap().gate,
        Gate::Run { share: true, .. }
    ));
    // Weight 0 counts as 1; a static share below the weighted one wins.
    let mut ps = PolicyState::new(PolicyKind::Libshare);
    for t in 0..5u64 {
        let mut b = a(t, 0);
        b.compute = 2_000;
        let s = snap(&[
            entry(10, Class::Opportunistic, a(t, 0)),
            entry(11, Class::Opportunistic, b),
        ]);
        ds = step(&mut ps, &s, T0 + t * MS);
    }
    assert_eq!(find(&ds, 10).unwrap().share_bp, 5_000);
    assert_eq!(find(&ds, 11).unwrap().share_bp, 2_000);
    // When one stops demanding (no launch for 100 ms, nothing held), the other runs Open.
    let mut ps = PolicyState::new(PolicyKind::Libshare);
    for t in 0..200u64 {
        let s = snap(&[
            entry(10, Class::Opportunistic, a(t, 1)),
            entry(11, Class::Opportunistic, a(7, 3)),
        ]);
        ds = step(&mut ps, &s, T0 + t * MS);
    }
    assert_eq!(find(&ds, 10).unwrap().gate, Gate::Open);
    assert_eq!(find(&ds, 10).unwrap().share_bp, 0);
    // ... but a container held at the gate is demanding even if its launches do not move.
    let mut held = a(7, 3);
    held.held = 1;
    let s = snap(&[
        entry(10, Class::Opportunistic, a(300, 1)),
        entry(11, Class::Opportunistic, held),
    ]);
    ds = step(&mut ps, &s, T0 + 300 * MS);
    assert_eq!(find(&ds, 10).unwrap().share_bp, 2_500);
}

#[test]
fn time_slice_rotates_exclusive_quanta() {
    let q = 100 * MS;
    let mut ps = PolicyState::new(PolicyKind::TimeSlice { quantum_ns: q });
    let ids = [1, 2, 3];
    let mut holders = Vec::new();
    for t in 0..600u64 {
        let now = T0 + t * MS;
        let s = snap(&ids.map(|id| {
            let class = if id == 1 {
                Class::Production
            } else {
                Class::Opportunistic
            };
            entry(id, class, opp(t + 1))
        }));
        let ds = step(&mut ps, &s, now);
        assert_eq!(ds.len(), 3, "every container, every tick");
        let open: Vec<_> = ds.iter().filter(|d| d.gate == Gate::Open).collect();
        assert_eq!(open.len(), 1, "exactly one holder at t = {t} ms");
        assert!(ds
            .iter()
            .all(|d| d.gate == Gate::Open || d.gate == Gate::Paused));
        holders.push(open[0].id);
    }
    for (t, h) in holders.iter().enumerate() {
        assert_eq!(*h, ids[(t / 100) % 3], "t = {t} ms");
    }

    // The holder stops demanding (no launch for 10 ms, not busy, nothing held): the other gets
    // the device early; a paused container demands through its held threads.
    let mut ps = PolicyState::new(PolicyKind::TimeSlice { quantum_ns: q });
    let mut switched = None;
    for t in 0..60u64 {
        let a = opp(if t < 20 { t + 1 } else { 20 });
        let b = Counters {
            launches: 1,
            held: 1,
            ..Counters::default()
        };
        let s = snap(&[
            entry(1, Class::Opportunistic, a),
            entry(2, Class::Opportunistic, b),
        ]);
        let ds = step(&mut ps, &s, T0 + t * MS);
        if t == 0 {
            assert_eq!(find(&ds, 1).unwrap().gate, Gate::Open);
        }
        if switched.is_none() && find(&ds, 2).unwrap().gate == Gate::Open {
            switched = Some(t);
            assert_eq!(find(&ds, 1).unwrap().gate, Gate::Paused);
        }
    }
    let t = switched.expect("switched before the quantum's end");
    assert!((28..=32).contains(&t), "switched at {t} ms");
}

#[test]
fn a_stale_busy_flag_stops_counting_after_50_ms() {
    let mut ps = PolicyState::new(PolicyKind::Libshare);
    // Production launched 100 times at T0 and never synchronised: busy_since stays set.
    let c = Counters {
        launches: 100,
        busy_since: T0,
        ..Counters::default()
    };
    for t in 0..120u64 {
        let s = snap(&[
            entry(PROD, Class::Production, c),
            entry(OPP, Class::Opportunistic, opp(t)),
        ]);
        let ds = step(&mut ps, &s, T0 + t * MS);
        let g = find(&ds, OPP).unwrap().gate;
        if t < 50 {
            assert_eq!(g, Gate::Paused, "t = {t} ms");
        } else {
            assert_eq!(
                g,
                Gate::Run {
                    in_flight_us: 2_000,
                    window: false,
                    share: false
                },
                "t = {t} ms"
            );
        }
    }
    // It launches again: busy at once.
    let c = Counters { launches: 101, ..c };
    let s = snap(&[
        entry(PROD, Class::Production, c),
        entry(OPP, Class::Opportunistic, opp(200)),
    ]);
    let ds = step(&mut ps, &s, T0 + 121 * MS);
    assert_eq!(find(&ds, OPP).unwrap().gate, Gate::Paused);
}

#[test]
fn devices_are_decided_separately() {
    let mut ps = PolicyState::new(PolicyKind::Libshare);
    let busy = Counters {
        launches: 1,
        busy_since: T0,
        ..Counters::default()
    };
    let s = Snapshot {
        entries: vec![
            Entry {
                id: PROD,
                device: 0,
                class: Class::Production,
                c: busy,
            },
            Entry {
                id: OPP,
                device: 0,
                class: Class::Opportunistic,
                c: opp(1),
            },
            Entry {
                id: PROD,
                device: 1,
                class: Class::Production,
                c: Counters::default(),
            },
            Entry {
                id: OPP,
                device: 1,
                class: Class::Opportunistic,
                c: opp(1),
            },
        ],
    };
    let ds = step(&mut ps, &s, T0);
    let g = |dev| {
        ds.iter()
            .find(|d| d.id == OPP && d.device == dev)
            .unwrap()
            .gate
    };
    assert_eq!(g(0), Gate::Paused);
    assert_eq!(g(1), Gate::Open);
}

#[test]
fn a_starved_opportunistic_container_gets_one_launch_per_starve_interval() {
    let mut ps = PolicyState::new(PolicyKind::Libshare);
    // Production always busy (launching); the opportunistic job waits at the gate and only
    // launches when let through.
    let mut opp_launches = 1;
    let mut granted = Vec::new();
    let mut now = T0;
    while now < T0 + 1_000 * MS {
        let prod = Counters {
            launches: now / US,
            busy_since: T0,
            ..Counters::default()
        };
        let o = Counters {
            launches: opp_launches,
            held: 1,
            ..Counters::default()
        };
        let s = snap(&[
            entry(PROD, Class::Production, prod),
            entry(OPP, Class::Opportunistic, o),
        ]);
        let g = find(&step(&mut ps, &s, now), OPP).unwrap().gate;
        match g {
            Gate::Paused => {}
            Gate::Run {
                in_flight_us: 1,
                window: false,
                share: false,
            } => {
                granted.push((now - T0) / MS);
                opp_launches += 1; // the one launch it was let through
            }
            g => panic!("unexpected {g:?} at {} ms", (now - T0) / MS),
        }
        now += MS;
    }
    // First sight counts as a launch; then one grant per 100 ms.
    assert_eq!(
        granted,
        vec![100, 201, 302, 403, 504, 605, 706, 807, 908],
        "{granted:?}"
    );
}

/// Issue 31 (S9 with 8 containers): containers taking turns do not starve while they wait
/// theirs. Production busy 4 ms in every 25, eight opportunistic containers held at their
/// gates that launch only when let through: no launch goes while production is busy (a
/// hand-over during a request pauses the new holder); production always busy: one launch per
/// 100 ms for the device, not one per container, and each container gets some.
#[test]
fn containers_waiting_their_turn_are_not_starved_into_a_launch() {
    let ids: Vec<ContainerId> = (0..8).map(|i| OPP + i).collect();
    let cases = [
        (25 * MS, 4 * MS, 2_000u64, false),
        (u64::MAX / 4, u64::MAX / 8, 2_000, true),
    ];
    for (period, busy, ticks, always) in cases {
        let mut ps = PolicyState::new(PolicyKind::Libshare);
        let p = Periodic {
            period,
            busy,
            jitter: [0; 4],
            start: T0,
        };
        let mut launches: Vec<u64> = vec![1; ids.len()];
        let mut starved = Vec::new();
        for t in 0..ticks {
            let now = T0 + t * MS;
            let prod = p.at(now);
            let mut s = vec![entry(PROD, Class::Production, prod)];
            for (i, &id) in ids.iter().enumerate() {
                let c = Counters {
                    launches: launches[i],
                    held: 1,
                    ..Counters::default()
                };
                s.push(entry(id, Class::Opportunistic, c));
            }
            let ds = step(&mut ps, &snap(&s), now);
            for (i, &id) in ids.iter().enumerate() {
                let g = find(&ds, id).unwrap().gate;
                if g == Gate::Paused {
                    continue;
                }
                launches[i] += 1;
                if prod.busy_since != 0 {
                    assert!(always, "at {t} ms production is busy and {id} got {g:?}");
                    assert_eq!(
                        g,
                        Gate::Run {
                            in_flight_us: 1,
                            window: false,
                            share: false
                        }
                    );
                    starved.push((t, id));
                }
            }
        }
        if always {
            // 2 s: one launch per 100 ms for the device (the first at 100 ms), spread over
            // the containers as their turns come.
            assert!(
                (18..=20).contains(&starved.len()),
                "{} starvation launches: {starved:?}",
                starved.len()
            );
            let who: std::collections::HashSet<_> = starved.iter().map(|&(_, id)| id).collect();
            assert!(who.len() >= 6, "only {who:?} progressed");
        }
    }
}

/// Issue 31 (S9, 8 containers started at once): beside production, opportunistic containers
/// that do not demand yet are paused, so that their first launches do not all pass at once; the
/// first to wait at its gate gets it at the next tick, the others in turn.
#[test]
fn containers_that_do_not_demand_yet_are_paused_beside_production() {
    let mut ps = PolicyState::new(PolicyKind::Libshare);
    let p = Periodic {
        period: 25 * MS,
        busy: 4 * MS,
        jitter: [0; 4],
        start: T0,
    };
    let ids: Vec<ContainerId> = (0..8).map(|i| OPP + i).collect();
    let at = |now: u64, held: &[ContainerId]| {
        let mut s = vec![entry(PROD, Class::Production, p.at(now))];
        for &id in &ids {
            let c = Counters {
                held: u32::from(held.contains(&id)),
                ..Counters::default()
            };
            s.push(entry(id, Class::Opportunistic, c));
        }
        snap(&s)
    };
    // Production idle between requests: none of the eight has launched or waits yet.
    let now = p.arrival(4) + 10 * MS;
    for t in 0..5 {
        let ds = step(&mut ps, &at(now + t * MS, &[]), now + t * MS);
        for &id in &ids {
            assert_eq!(find(&ds, id).unwrap().gate, Gate::Paused, "{id} at +{t} ms");
        }
    }
    // One waits at its gate: it alone may go; then all eight wait: one at a time.
    let ds = step(&mut ps, &at(now + 5 * MS, &[OPP + 3]), now + 5 * MS);
    let open: Vec<_> = ids
        .iter()
        .filter(|&&id| find(&ds, id).unwrap().gate != Gate::Paused)
        .collect();
    assert_eq!(open, vec![&(OPP + 3)]);
    let ds = step(&mut ps, &at(now + 6 * MS, &ids), now + 6 * MS);
    let open = ids
        .iter()
        .filter(|&&id| find(&ds, id).unwrap().gate != Gate::Paused)
        .count();
    assert_eq!(open, 1);
}

/// Issue 31: production meets at most the device's latency budget, whether it is busy, idle,
/// predictable, unpredictable or gone quiet; a percentage follows its measured service time;
/// demanding opportunistic containers take turns.
#[test]
fn the_latency_budget_bounds_every_gate_but_paused_while_production_is_present() {
    let budget = |b: LatencyBudget| {
        PolicyState::with_tunables(
            PolicyKind::Libshare,
            Tunables {
                latency_budget: b,
                ..Tunables::default()
            },
        )
    };
    let p = Periodic {
        period: 10 * MS,
        busy: 3 * MS,
        jitter: [0; 4],
        start: T0,
    };
    // 10 % of a 3 ms service time: 300 µs, in the window and out of it.
    let mut ps = budget(LatencyBudget::OfService(1_000));
    let mut now = T0;
    let (mut windows, mut bounded) = (0, 0);
    while now < T0 + 300 * MS {
        let s = snap(&[
            entry(PROD, Class::Production, p.at(now)),
            entry(OPP, Class::Opportunistic, opp(now / US)),
        ]);
        let g = find(&step(&mut ps, &s, now), OPP).unwrap().gate;
        match g {
            Gate::Paused => {}
            Gate::Run {
                in_flight_us,
                window,
                ..
            } => {
                // Until a phase was measured: the default's 2 ms.
                let want = if ps.busy_duration(PROD, 0).is_some() {
                    300
                } else {
                    2_000
                };
                assert_eq!(in_flight_us, want, "at {} ms", (now - T0) / MS);
                if window {
                    windows += 1;
                } else {
                    bounded += 1;
                }
            }
            Gate::Open => panic!("open beside present production at {} ms", (now - T0) / MS),
        }
        now += MS;
    }
    assert!(windows > 100, "windows {windows}, bounded {bounded}");
    // Production goes quiet (its flag stale after 50 ms, no arrival for longer than 2 periods
    // + 10 ms): no window, the budget.
    let frozen = p.at(now);
    let mut g = Gate::Open;
    for t in 0..100 {
        let at = now + t * MS;
        let s = snap(&[
            entry(PROD, Class::Production, frozen),
            entry(OPP, Class::Opportunistic, opp(at / US)),
        ]);
        g = find(&step(&mut ps, &s, at), OPP).unwrap().gate;
    }
    assert_eq!(
        g,
        Gate::Run {
            in_flight_us: 300,
            window: false,
            share: false
        }
    );
    // Three demanding opportunistic containers (one of weight 2) beside production: one at a
    // time has a gate that lets work go, with the whole budget and no weighted share, in
    // turns of 20 ms × its weight; none is starved into a launch out of turn.
    let mut ps = budget(LatencyBudget::Fixed(1_000));
    let ids = [OPP, OPP + 1, OPP + 2];
    let mut turns = std::collections::HashMap::<ContainerId, u64>::new();
    let mut last = None;
    let mut switches = 0;
    for t in 0..1_200u64 {
        let now = T0 + t * MS;
        let mut s = vec![entry(PROD, Class::Production, p.at(now))];
        for id in ids {
            let mut c = opp(now / US);
            c.held = 1;
            c.weight = if id == OPP + 2 { 2 } else { 0 };
            s.push(entry(id, Class::Opportunistic, c));
        }
        let ds = step(&mut ps, &snap(&s), now);
        let running: Vec<_> = ids
            .iter()
            .filter(|&&id| find(&ds, id).unwrap().gate != Gate::Paused)
            .collect();
        let busy = p.at(now).busy_since != 0;
        assert!(running.len() <= 1, "at {t} ms: {running:?} may launch");
        for &&id in &running {
            let d = find(&ds, id).unwrap();
            assert!(
                matches!(
                    d.gate,
                    Gate::Run {
                        in_flight_us: 1_000,
                        share: false,
                        ..
                    }
                ),
                "at {t} ms: {:?}",
                d.gate
            );
            assert_eq!(d.share_bp, 0);
        }
        if !busy {
            let holder = *running[0];
            *turns.entry(holder).or_default() += 1;
            if last != Some(holder) {
                switches += 1;
                last = Some(holder);
            }
        }
    }
    // 1.2 s: turns of 20, 20 and 40 ms; the idle ticks (70 %) split 1:1:2.
    let (a, b, c) = (turns[&OPP], turns[&(OPP + 1)], turns[&(OPP + 2)]);
    assert!(switches >= 20, "{switches} switches");
    assert!(
        (a as f64 / b as f64 - 1.0).abs() < 0.3 && (c as f64 / a as f64 - 2.0).abs() < 0.5,
        "{a}:{b}:{c}"
    );
}

#[test]
fn a_latency_budget_is_parsed_or_refused_in_one_line() {
    for (arg, want) in [
        ("2ms", LatencyBudget::Fixed(2_000)),
        ("500us", LatencyBudget::Fixed(500)),
        ("1.5ms", LatencyBudget::Fixed(1_500)),
        ("1s", LatencyBudget::Fixed(1_000_000)),
        ("10%", LatencyBudget::OfService(1_000)),
        ("2.5%", LatencyBudget::OfService(250)),
        (" 5% ", LatencyBudget::OfService(500)),
    ] {
        assert_eq!(arg.parse::<LatencyBudget>(), Ok(want), "{arg}");
        assert_eq!(
            want.to_string().parse::<LatencyBudget>(),
            Ok(want),
            "{want}"
        );
    }
    for (arg, why) in [
        ("0", "is not a latency budget"),
        ("0ms", "would never let"),
        ("0%", "would never let"),
        ("100%", "is no budget"),
        ("250%", "is no budget"),
        ("2s", "more than 1s"),
        ("fast", "is not a latency budget"),
        ("-1ms", "is not a latency budget"),
        ("%", "is not a latency budget"),
        ("", "is not a latency budget"),
    ] {
        let e = arg.parse::<LatencyBudget>().unwrap_err().to_string();
        assert!(e.contains(why), "{arg:?}: {e}");
        assert!(!e.contains('\n'), "{e}");
    }
    assert_eq!(
        LatencyBudget::OfService(1_000).bound_us(Some(100 * US)),
        50,
        "at least 50 µs"
    );
    assert_eq!(LatencyBudget::OfService(1_000).bound_us(None), 2_000);
    assert_eq!(LatencyBudget::Fixed(700).bound_us(Some(MS)), 700);
}
