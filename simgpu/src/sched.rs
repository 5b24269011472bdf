//! The compute engine's scheduler between contexts (processes) of one device, as on an NVIDIA GPU
//! without MPS: contexts with work time-share the engine in slices.
//!
//! - A context that owns the engine runs its operations back to back until its slice ends, or until
//!   it runs out of work (then it gives the engine up at once).
//! - When its slice ends and another context waits, the owner is preempted, even in the middle of
//!   a kernel, and waits in turn; the rest of that kernel runs when it gets the engine back. When
//!   nobody waits, the owner starts a new slice.
//! - The waiting contexts take the engine in round-robin order (by context index, after the one
//!   that ran last). Switching to another context costs `switch`, counted in the new slice.
//!
//! So a context with work waits at most (contexts − 1) × slice ≤ (contexts − 1) × (slice +
//! switch) for the engine.
//!
//! Decisions are made online, on the modelled clock: a grant (an interval on the engine) never
//! crosses the end of the owner's slice, and what happens at a slice end is decided only once the
//! real clock has passed it by `decide_after`, so every context waiting by then is known. Anyone may make that
//! decision (`advance`): an owner that died, or whose engine thread is late, loses the engine at its
//! slice end. The functions here are pure over [`SchedState`], so they are tested without
//! processes; `shared.rs` implements the state in the machine's shared file.

/// The scheduler's parameters (ns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    /// A context's time slice, including the context switch into it.
    pub slice: u64,
    /// Cost of a context switch; less than `slice`.
    pub switch: u64,
    /// How long after a slice end (real time) its decision is made, so that a context whose
    /// work became ready before the slice end but whose engine thread registered it a little
    /// later (wake-up latency) still counts as waiting. Not part of the model: modelled times do
    /// not depend on it.
    pub decide_after: u64,
    /// How long (real time) past its slice end's decision an owner that does not act because
    /// its process is stopped (SIGSTOP, a debugger: its engine thread neither asks for the engine
    /// nor gives it up) keeps it while others wait: then they take it over from its slice end,
    /// and it asks again when it runs. A GPU does not stop when its host process does. An owner
    /// that is merely late (a loaded host) is waited for, so modelled times stay right. Not part
    /// of the model for punctual contexts.
    pub lease: u64,
}

/// One device's scheduler state. Contexts are indices `0..contexts()`.
pub trait SchedState {
    fn contexts(&self) -> usize;
    /// The context that owns the engine.
    fn owner(&self) -> Option<usize>;
    fn set_owner(&mut self, c: Option<usize>);
    /// The context that owned the engine last (to charge switches).
    fn last(&self) -> Option<usize>;
    fn set_last(&mut self, c: Option<usize>);
    /// End of the owner's slice (ns).
    fn slice_end(&self) -> u64;
    fn set_slice_end(&mut self, t: u64);
    /// End of the last grant or switch: the engine is free from then.
    fn free_at(&self) -> u64;
    fn set_free_at(&mut self, t: u64);
    /// 0 when context `c` does not wait, else the time (≥ 1) from which it has work.
    fn waiting(&self, c: usize) -> u64;
    fn set_waiting(&mut self, c: usize, ready: u64);
    /// False once the process of context `c` has died.
    fn alive(&self, c: usize) -> bool;
    /// True while the process of context `c` is stopped (SIGSTOP, a debugger): its engine thread
    /// cannot act, though a GPU would go on.
    fn stopped(&self, c: usize) -> bool;
    /// True when context `c` has no compute operation queued (enqueued and not completed): it
    /// cannot have work ready that it has not registered yet, so a slice-end decision need not
    /// wait `decide_after` for it.
    fn quiet(&self, c: usize) -> bool;
    /// `c` was given the engine by another context's decision: wake it.
    fn wake(&mut self, c: usize);
}

/// What a context asking for the engine gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Run on the engine over [start, end); if `end` is before the operation's end, the rest must
    /// be asked for again from `end`.
    Run { start: u64, end: u64 },
    /// Another context owns the engine: wait until woken, or until this time at the latest (the
    /// owner's slice end, when the waiter may decide itself).
    Wait { until: u64 },
}

/// Context `c` has an operation of `dur` ns ready since `ready` (it asks at real time `now`).
pub fn request(
    s: &mut impl SchedState,
    p: Params,
    c: usize,
    ready: u64,
    dur: u64,
    now: u64,
) -> Decision {
    let ready = ready.max(1);
    // Registered first, so that a slice end decided now knows `c` has had work since `ready`.
    s.set_waiting(c, ready);
    advance(s, p, now);
    s.set_waiting(c, 0);
    match s.owner() {
        Some(o) if o != c => {
            s.set_waiting(c, ready);
            return Decision::Wait {
                until: wait_until(s, p, now),
            };
        }
        Some(_) if ready <= s.free_at() => {}
        // The engine is free, or `c` owns it but ran out of work at `free_at`: whoever was ready
        // first takes it (round robin among those ready by then).
        _ => {
            let free = s.free_at();
            if handoff(s, p, free, Some((c, ready))) {
                s.set_waiting(c, ready);
                return Decision::Wait {
                    until: wait_until(s, p, now),
                };
            }
            let at = ready.max(free);
            let start = at + switch_cost(s, p, c);
            s.set_owner(Some(c));
            s.set_last(Some(c));
            s.set_free_at(start);
            s.set_slice_end(at + p.slice);
        }
    }
    let start = ready.max(s.free_at());
    if start >= s.slice_end() {
        // Its slice is used up; what comes next is decided at its end.
        return Decision::Wait {
            until: wait_until(s, p, now),
        };
    }
    let end = (start + dur).min(s.slice_end());
    s.set_free_at(end);
    Decision::Run { start, end }
}

/// Context `c` has no more work from `at` (the end of its last grant): it gives the engine up.
pub fn idle(s: &mut impl SchedState, p: Params, c: usize, at: u64, now: u64) {
    advance(s, p, now);
    s.set_waiting(c, 0);
    if s.owner() == Some(c) {
        let t = s.free_at().max(at.min(s.slice_end()));
        s.set_free_at(t);
        handoff(s, p, t, None);
    }
}

/// Makes every slice-end decision due by real time `now`: `decide_after` past the slice end,
/// or at once once the slice end has passed if every other context is known (it waits, or has
/// nothing queued), so the holder's own work never waits in real time for a decision nobody
/// else can change.
pub fn advance(s: &mut impl SchedState, p: Params, now: u64) {
    while let Some(o) = s.owner() {
        let t = s.slice_end();
        if t + p.decide_after > now && !(t <= now && all_known(s, o)) {
            break;
        }
        if s.free_at() < t {
            if s.alive(o) {
                // The owner neither ran to its slice end nor gave the engine up: its engine
                // thread is late (a loaded host). Its next request or `idle` decides; modelled
                // times do not depend on when that comes — unless its process is stopped a
                // lease past its slice end while others wait: it loses the engine at its slice
                // end, and waits no more until it asks again.
                let others = (0..s.contexts()).any(|w| w != o && s.waiting(w) != 0 && s.alive(w));
                if !others || now < t + p.decide_after + p.lease || !s.stopped(o) {
                    break;
                }
                s.set_waiting(o, 0);
                handoff(s, p, t, None);
                continue;
            }
            // It died (perhaps right after its last operation, before giving the engine up):
            // the engine has been free since its last grant ended.
            let at = s.free_at();
            handoff(s, p, at, None);
            continue;
        }
        if !(0..s.contexts()).any(|w| w != o && ready_by(s, w, t)) {
            s.set_slice_end(t + p.slice); // nobody waits: a new slice
            continue;
        }
        if s.waiting(o) == 0 {
            s.set_waiting(o, t); // preempted with work left
        }
        handoff(s, p, t, None);
    }
}

/// How long a context told to wait may sleep before it asks again: until the owner's slice end
/// has been decided, and in any case a little (while the owner is late, to notice its death).
fn wait_until(s: &impl SchedState, p: Params, now: u64) -> u64 {
    (s.slice_end() + p.decide_after).max(now + p.decide_after.max(1))
}

/// Every context but `o` waits (registered), has nothing queued, or is dead.
fn all_known(s: &impl SchedState, o: usize) -> bool {
    (0..s.contexts()).all(|w| w == o || s.waiting(w) != 0 || s.quiet(w) || !s.alive(w))
}

fn ready_by(s: &impl SchedState, w: usize, t: u64) -> bool {
    let r = s.waiting(w);
    r != 0 && r <= t && s.alive(w)
}

fn switch_cost(s: &impl SchedState, p: Params, c: usize) -> u64 {
    match s.last() {
        Some(l) if l != c => p.switch,
        _ => 0,
    }
}

/// The engine is free from `t`: gives it to the next context — round robin after the last one
/// among those ready by `t`, else the one ready first — considering also `requester` (not yet
/// registered). Returns true when someone other than the requester got it; with nobody to take
/// it, the engine is left without owner.
fn handoff(s: &mut impl SchedState, p: Params, t: u64, requester: Option<(usize, u64)>) -> bool {
    let n = s.contexts();
    let from = s.last().map_or(0, |l| l + 1);
    let mut best: Option<(usize, u64)> = None; // (context, ready)
    let mut best_key = (true, u64::MAX, usize::MAX);
    for k in 0..n {
        let w = (from + k) % n;
        let r = match requester {
            Some((c, r)) if c == w => r,
            _ => {
                let r = s.waiting(w);
                if r == 0 {
                    continue;
                }
                if !s.alive(w) {
                    s.set_waiting(w, 0);
                    continue;
                }
                r
            }
        };
        // Ready by `t`: round-robin order; else by readiness.
        let key = if r <= t { (false, 0, k) } else { (true, r, k) };
        if key < best_key {
            best_key = key;
            best = Some((w, r));
        }
    }
    match best {
        None => {
            s.set_owner(None);
            false
        }
        Some((w, _)) if requester.is_some_and(|(c, _)| c == w) => {
            s.set_owner(None);
            false
        }
        Some((w, r)) => {
            let at = t.max(r);
            let start = at + switch_cost(s, p, w);
            s.set_owner(Some(w));
            s.set_last(Some(w));
            s.set_free_at(start);
            s.set_slice_end(at + p.slice);
            s.wake(w);
            true
        }
    }
}

/// A scheduler state in ordinary memory (tests, and models of the scheduler).
#[derive(Clone, Debug, Default)]
pub struct Plain {
    pub owner: Option<usize>,
    pub last: Option<usize>,
    pub slice_end: u64,
    pub free_at: u64,
    pub waiting: Vec<u64>,
    pub dead: Vec<bool>,
    /// Contexts whose process is stopped (see [`SchedState::stopped`]).
    pub stopped: Vec<bool>,
    pub woken: Vec<usize>,
    /// Contexts with compute work queued (see [`SchedState::quiet`]).
    pub queued: Vec<bool>,
}

impl Plain {
    pub fn new(contexts: usize) -> Plain {
        Plain {
            waiting: vec![0; contexts],
            dead: vec![false; contexts],
            stopped: vec![false; contexts],
            queued: vec![false; contexts],
            ..Plain::default()
        }
    }
}

impl SchedState for Plain {
    fn contexts(&self) -> usize {
        self.waiting.len()
    }
    fn owner(&self) -> Option<usize> {
        self.owner
    }
    fn set_owner(&mut self, c: Option<usize>) {
        self.owner = c;
    }
    fn last(&self) -> Option<usize> {
        self.last
    }
    fn set_last(&mut self, c: Option<usize>) {
        self.last = c;
    }
    fn slice_end(&self) -> u64 {
        self.slice_end
    }
    fn set_slice_end(&mut self, t: u64) {
        self.slice_end = t;
    }
    fn free_at(&self) -> u64 {
        self.free_at
    }
    fn set_free_at(&mut self, t: u64) {
        self.free_at = t;
    }
    fn waiting(&self, c: usize) -> u64 {
        self.waiting[c]
    }
    fn set_waiting(&mut self, c: usize, ready: u64) {
        self.waiting[c] = ready;
    }
    fn alive(&self, c: usize) -> bool {
        !self.dead[c]
    }
    fn stopped(&self, c: usize) -> bool {
        self.stopped[c]
    }
    fn quiet(&self, c: usize) -> bool {
        !self.queued[c]
    }
    fn wake(&mut self, c: usize) {
        self.woken.push(c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const P: Params = Params {
        slice: 2_000_000,
        switch: 25_000,
        decide_after: 0,
        lease: 2_000_000,
    };

    #[test]
    fn a_stopped_owner_loses_the_engine_a_lease_after_its_slice_end() {
        let mut s = Plain::new(2);
        // Context 0 owns the engine, ran 100 µs and then did not act: late (a loaded host).
        request(&mut s, P, 0, 1, 100_000, 1);
        let end = P.slice + 1;
        // Context 1 waits; a late owner is waited for, past the lease too.
        assert!(matches!(
            request(&mut s, P, 1, 200_000, 100, end + 10 * P.lease),
            Decision::Wait { .. }
        ));
        assert_eq!(s.owner, Some(0));
        // Its process is stopped (SIGSTOP): within the lease it is still waited for ...
        s.stopped[0] = true;
        assert!(matches!(
            request(&mut s, P, 1, 200_000, 100, end + P.lease - 1),
            Decision::Wait { .. }
        ));
        assert_eq!(s.owner, Some(0));
        // ... a lease past the slice end, context 1 takes over from the slice end.
        assert_eq!(
            request(&mut s, P, 1, 200_000, 100, end + P.lease),
            Decision::Run {
                start: end + P.switch,
                end: end + P.switch + 100
            }
        );
        // The stopped context is not handed the engine back until it asks again.
        idle(&mut s, P, 1, end + P.switch + 100, end + P.lease + 1);
        assert_eq!(s.owner, None);
        assert_eq!(s.waiting(0), 0);
        // It resumes and asks: it runs.
        s.stopped[0] = false;
        let later = end + 10 * P.slice;
        assert!(matches!(
            request(&mut s, P, 0, 100_001, 5, later),
            Decision::Run { .. }
        ));
    }

    #[test]
    fn a_slice_end_is_decided_at_once_when_every_other_context_is_known() {
        let p = Params {
            decide_after: 250_000,
            ..P
        };
        // Context 0 holds the engine; its kernel runs 25 µs past its slice end.
        let mut s = Plain::new(2);
        assert_eq!(
            request(&mut s, p, 0, 100, 2_000_000, 100),
            Decision::Run {
                start: 100,
                end: 2_000_100
            }
        );
        // Real time just past the slice end, context 1 has nothing queued: the rest runs now.
        assert_eq!(
            request(&mut s, p, 0, 2_000_100, 25_000, 2_000_150),
            Decision::Run {
                start: 2_000_100,
                end: 2_025_100
            }
        );
        // Context 1 has work queued but not registered (its engine thread is late): the
        // decision waits `decide_after` of real time, as before.
        let mut s = Plain::new(2);
        request(&mut s, p, 0, 100, 2_000_000, 100);
        s.queued[1] = true;
        assert_eq!(
            request(&mut s, p, 0, 2_000_100, 25_000, 2_000_150),
            Decision::Wait {
                until: 2_000_150 + 250_000
            }
        );
        // It registers, ready before the slice end: at the decision it gets the engine.
        s.queued[1] = true;
        request(&mut s, p, 1, 1_900_000, 1_000, 2_000_200);
        assert_eq!(s.owner, Some(1));
    }

    #[test]
    fn a_lone_context_runs_back_to_back_without_switches() {
        let mut s = Plain::new(2);
        assert_eq!(
            request(&mut s, P, 0, 100, 1_000_000, 100),
            Decision::Run {
                start: 100,
                end: 1_000_100
            }
        );
        // A 3 ms kernel alone: cut at the slice end, then continued with no gap.
        assert_eq!(
            request(&mut s, P, 0, 1_000_100, 3_000_000, 1_000_100),
            Decision::Run {
                start: 1_000_100,
                end: 2_000_100
            }
        );
        assert_eq!(
            request(&mut s, P, 0, 2_000_100, 2_000_000, 2_000_100),
            Decision::Run {
                start: 2_000_100,
                end: 4_000_100
            }
        );
    }

    #[test]
    fn a_waiter_preempts_the_owner_at_its_slice_end_and_pays_a_switch() {
        let mut s = Plain::new(2);
        let Decision::Run { end, .. } = request(&mut s, P, 0, 0, 50_000_000, 1) else {
            panic!()
        };
        assert_eq!(end, P.slice + 1); // ready 0 counts as 1
        assert_eq!(
            request(&mut s, P, 1, 500_000, 100_000, 500_000),
            Decision::Wait { until: end }
        );
        // The owner asks for the rest at its slice end: preempted, context 1 runs after a switch.
        assert_eq!(
            request(&mut s, P, 0, end, 48_000_000, end),
            Decision::Wait {
                until: end + P.slice
            }
        );
        assert_eq!(s.woken, vec![1]);
        assert_eq!(
            request(&mut s, P, 1, 500_000, 100_000, end + 10),
            Decision::Run {
                start: end + P.switch,
                end: end + P.switch + 100_000
            }
        );
        // Out of work: context 0 gets the engine back at once, after a switch.
        idle(
            &mut s,
            P,
            1,
            end + P.switch + 100_000,
            end + P.switch + 100_000,
        );
        assert_eq!(s.woken, vec![1, 0]);
        let back = end + 2 * P.switch + 100_000;
        assert_eq!(
            request(&mut s, P, 0, end, 48_000_000, back),
            Decision::Run {
                start: back,
                end: back - P.switch + P.slice
            }
        );
    }

    #[test]
    fn a_dead_owner_loses_the_engine_at_its_slice_end() {
        let mut s = Plain::new(2);
        request(&mut s, P, 0, 1, 50_000_000, 1);
        s.dead[0] = true;
        let d = request(&mut s, P, 1, 10, 100, 10);
        let Decision::Wait { until } = d else {
            panic!("{d:?}")
        };
        assert_eq!(until, P.slice + 1);
        assert_eq!(
            request(&mut s, P, 1, 10, 100, until),
            Decision::Run {
                start: until + P.switch,
                end: until + P.switch + 100
            }
        );
    }

    /// One context of the model below: its operations (arrival, duration), in order.
    #[derive(Clone, Debug)]
    struct Ctx {
        ops: Vec<(u64, u64)>,
        dies_at: Option<u64>,
    }

    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Phase {
        /// No operation started; the next one is `next`.
        Idle,
        /// Granted up to `end`, with `left` of the operation after it.
        Running { end: u64, left: u64 },
        /// Waiting for the engine with `left` to run, ready since `ready`; asks again at `until`.
        Waiting { ready: u64, left: u64, until: u64 },
    }

    /// Grants (context, start, end) and waits (context, waited ns).
    type Outcome = (Vec<(usize, u64, u64)>, Vec<(usize, u64)>);

    /// Drives the pure scheduler with punctual contexts (each acts exactly at its deadlines).
    fn simulate(p: Params, ctxs: &[Ctx]) -> Outcome {
        let n = ctxs.len();
        let mut s = Plain::new(n);
        let mut phase = vec![Phase::Idle; n];
        let mut next = vec![0usize; n]; // index of the next operation to start
        let mut prev_end = vec![0u64; n];
        let mut grants = Vec::new();
        let mut waits = Vec::new();
        let mut since = vec![0u64; n];
        let mut now = 0;
        for _ in 0..1_000_000 {
            // The next time anything happens.
            let mut t = u64::MAX;
            for c in 0..n {
                if ctxs[c].dies_at.is_some_and(|d| d <= now) && !s.dead[c] {
                    s.dead[c] = true;
                }
                if s.dead[c] {
                    continue;
                }
                t = t.min(match phase[c] {
                    Phase::Idle => ctxs[c]
                        .ops
                        .get(next[c])
                        .map_or(u64::MAX, |o| o.0.max(prev_end[c])),
                    Phase::Running { end, .. } => end,
                    Phase::Waiting { until, .. } => until,
                });
                if let Some(d) = ctxs[c].dies_at {
                    t = t.min(d.max(now));
                }
            }
            if t == u64::MAX {
                break;
            }
            now = now.max(t);
            s.woken.clear();
            // Queued: an operation has arrived (it may not be registered yet) or is under way.
            for c in 0..n {
                s.queued[c] = match phase[c] {
                    Phase::Idle => ctxs[c]
                        .ops
                        .get(next[c])
                        .is_some_and(|o| o.0.max(prev_end[c]) <= now),
                    _ => true,
                };
            }
            let mut act: Vec<usize> = (0..n).collect();
            while let Some(c) = act.pop() {
                if s.dead[c] {
                    continue;
                }
                let woken = s.woken.contains(&c);
                let ask = match phase[c] {
                    Phase::Idle => {
                        let Some(&(arr, dur)) = ctxs[c].ops.get(next[c]) else {
                            continue;
                        };
                        let ready = arr.max(prev_end[c]);
                        if ready > now {
                            continue;
                        }
                        next[c] += 1;
                        since[c] = ready;
                        Some((ready, dur))
                    }
                    Phase::Running { end, left } if end <= now => {
                        if left > 0 {
                            since[c] = end;
                            Some((end, left))
                        } else {
                            prev_end[c] = end;
                            phase[c] = Phase::Idle;
                            match ctxs[c].ops.get(next[c]) {
                                Some(&(arr, dur)) if arr <= end => {
                                    next[c] += 1;
                                    since[c] = end;
                                    Some((end, dur))
                                }
                                _ => {
                                    idle(&mut s, p, c, end, now);
                                    None
                                }
                            }
                        }
                    }
                    Phase::Waiting { ready, left, until } if until <= now || woken => {
                        Some((ready, left))
                    }
                    _ => None,
                };
                let Some((ready, left)) = ask else { continue };
                let before = s.woken.len();
                match request(&mut s, p, c, ready, left, now) {
                    Decision::Run { start, end } => {
                        assert!(end > start, "an empty grant: {start} {end}");
                        grants.push((c, start, end));
                        waits.push((c, start - since[c]));
                        phase[c] = Phase::Running {
                            end,
                            left: left - (end - start),
                        };
                    }
                    Decision::Wait { until } => {
                        assert!(until > now, "waits for the past: {until} <= {now}");
                        phase[c] = Phase::Waiting { ready, left, until };
                    }
                }
                // Whoever was just given the engine acts at once.
                for &w in &s.woken[before..] {
                    act.push(w);
                }
            }
        }
        (grants, waits)
    }

    fn ctx_strategy() -> impl Strategy<Value = Ctx> {
        (
            prop::collection::vec((0u64..40_000_000, 1u64..12_000_000), 0..12),
            prop::option::weighted(0.15, 0u64..30_000_000),
        )
            .prop_map(|(mut ops, dies_at)| {
                ops.sort();
                Ctx { ops, dies_at }
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        /// Random arrivals, durations and 1–8 contexts (some dying): grants never overlap,
        /// switches between contexts cost `switch`, every operation runs to its end, and no
        /// context with work waits longer than (contexts − 1) × (slice + switch).
        #[test]
        fn no_overlap_and_no_starvation(
            ctxs in prop::collection::vec(ctx_strategy(), 1..=8),
            slice in 100_000u64..5_000_000,
            switch in 0u64..50_000,
            decide_after in prop_oneof![Just(0u64), 0u64..500_000],
        ) {
            let p = Params { slice, switch: switch.min(slice - 1), decide_after, lease: slice };
            let (mut grants, waits) = simulate(p, &ctxs);
            grants.sort_by_key(|g| g.1);
            for w in grants.windows(2) {
                let ((a, _, a_end), (b, b_start, _)) = (w[0], w[1]);
                prop_assert!(b_start >= a_end, "overlap: {:?} then {:?}", w[0], w[1]);
                if a != b {
                    prop_assert!(b_start >= a_end + p.switch, "no switch cost: {:?}", w);
                }
            }
            let bound = (ctxs.len() as u64 - 1) * (p.slice + p.switch);
            for (c, waited) in &waits {
                prop_assert!(*waited <= bound.max(p.switch), "context {c} waited {waited} > {bound}");
            }
            // Every operation of a context that never dies ran for exactly its duration.
            for (c, ctx) in ctxs.iter().enumerate().filter(|(_, x)| x.dies_at.is_none()) {
                let ran: u64 = grants.iter().filter(|g| g.0 == c).map(|g| g.2 - g.1).sum();
                let want: u64 = ctx.ops.iter().map(|o| o.1).sum();
                prop_assert_eq!(ran, want, "context {}", c);
            }
        }
    }
}
