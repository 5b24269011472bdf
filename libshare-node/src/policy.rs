//! The sharing policy: a pure function from the counters the containers' shims publish to the
//! gates the daemon writes. No I/O, no clock reads: `now` comes in, decisions go out, so every
//! rule is unit-tested on synthetic or recorded counter traces.
//!
//! # What is modelled, what is assumed
//!
//! Inputs, per container and device ([`Counters`], read from `libshare_abi::DeviceState`):
//! `launches` (monotonic), `busy_since` (the first launch since the work was last seen drained,
//! 0 while drained), `drained_at`, `held` (threads waiting at the gate), the admin's `compute`
//! and `weight`, the environment's `env_compute`, and the gate word as it stands.
//!
//! Production (policy `libshare`, the default):
//! - A busy phase starts at each new nonzero `busy_since` value (an *arrival* at that time) and
//!   ends when `drained_at` changes. The inter-arrival period is the median of the last
//!   [`SAMPLES`] intervals, its jitter their median absolute deviation; busy durations are kept
//!   the same way (for display and future use).
//! - A production container is *busy* while `busy_since != 0`, unless `launches` has not moved
//!   for more than [`Tunables::stale_ns`]: a job that launched and never synchronises publishes
//!   no drain, so after that it counts as idle (its flag is stale, not its GPU).
//! - It is *active* if busy or if its `launches` moved in the last [`Tunables::active_ns`].
//!   Inactive production containers do not hold anyone back.
//! - Assumed: the daemon samples every period, so a busy phase shorter than the period (begun
//!   and drained between two ticks) is not seen as an arrival; periodic production with phases
//!   that short is then "not predictable" and gets the bounded in-flight gate (safe, less
//!   harvest). A drain seen on one stream is a hint (see `libshare_abi::rate`): the stale rule
//!   and the in-flight bound cover a wrong hint.
//!
//! Opportunistic gates per device (production containers are never gated: always Open). A
//! production container is *present* on a device once it has launched there (its `launches`).
//! While one is, opportunistic work in flight is bounded by the device's **latency budget**
//! ([`LatencyBudget`], `--latency-budget`: a fixed time, 2 ms by default, or a share of
//! production's service time, the median busy phase), windows included, so that production,
//! arriving when nothing predicted it (open-loop requests, a quiet server's first request, a
//! prediction gone wrong), meets at most that much queued work, or one kernel longer than it
//! (such a launch goes only when its container has nothing in flight, and within a window only
//! if it fits). What is in flight is counted as what is left of it: the shim takes off what
//! its oldest launch has already run, so operations of half the budget keep two in flight.
//! The budget is the device's: while production is
//! present, two or more demanding opportunistic containers take turns
//! ([`Tunables::rotate_ns`] × weight each, in container order; the others `Paused`, never
//! starved into a launch, and without the weighted split, which the turns' lengths replace),
//! so production meets one container's work whatever their number; one that does not demand
//! is `Paused` too (its first launch, held, makes it demand), so containers that start
//! together do not all pass a gate left open:
//! - any active production container busy → `Paused`;
//! - all idle, every active one predictable → `Run{window, budget}` with `window_end` = the earliest
//!   predicted next arrival − guard, guard = max(300 µs, 3 × jitter); the shim admits only
//!   launches whose estimated end fits before it. Two predictions, the earlier wins when both
//!   are steady: a fixed rate (requests on a clock: the earliest of the last arrival + the
//!   period and the three arrivals before it + whole periods, so that one request that
//!   started late does not move the clock) and a
//!   fixed idle gap (this idle phase's drain + drain-to-arrival gap: a loop that works or
//!   sleeps on the host after each synchronisation, whose GPU phase varies). Each counts on the median of its samples, or on either of the two newest
//!   if shorter (a pattern that gets shorter is followed at once), and needs ≥ [`MIN_SAMPLES`]
//!   samples, jitter (median absolute deviation) ≤ 10 % of its median, production idle for
//!   less than 2 × that + 10 ms, and its predicted arrival not passed by more than twice the
//!   guard (at least 1 ms: a prediction production outlived is wrong for this idle phase);
//! - idle but not predictable (or idle longer), or present but not active (no launch for
//!   [`Tunables::active_ns`]: an inference server without requests) → `Run{budget}`;
//! - no production container present → `Open`.
//! - Progress: an opportunistic container held at the gate (`held > 0`) whose `launches` did not
//!   move for [`Tunables::starve_ns`] (100 ms) gets `Run{in_flight_us: 1}` for a tick: one
//!   launch goes (in turns, the holder, when no container of the device launched for that
//!   long: one launch per device, not per container). However busy production is, opportunistic jobs progress, at a cost to
//!   production of at most one opportunistic kernel per 100 ms.
//! - Shares: the static share is the smaller of the nonzero `compute` and `env_compute`
//!   (10000 bp = 100 % = none). Among ≥ 2 *demanding* opportunistic containers (launches moved in
//!   the last [`Tunables::demand_ns`] or threads held at the gate) weights (0 = 1) split the
//!   device: `w_i / Σ w` over itself and the other demanding ones; the smaller of the two is the
//!   container's share. A container with a share gets the `share` bit (Open becomes
//!   `Run{0, share}`) and `share × elapsed` GPU time in tokens every tick, capped at
//!   `share × 10 ms` (so an idle spell cannot bank a burst; debt of one kernel is allowed by
//!   the shim). Tokens are refilled while paused too (the cap bounds them).
//!
//! - Exclusive turns (`crate::turns`, decided before this policy each tick): a (container,
//!   device) pair turns pause ([`PolicyState::set_turn_paused`]) is `Paused`, does not count as
//!   demanding in the weighted split, and is never given the starvation launch.
//!
//! Policy `time-slice` (nvshare-style baseline): on each device the demanding containers, of
//! any class, take exclusive turns of one quantum: the holder is `Open`, the others `Paused`;
//! the turn passes (in container order) at the quantum's end if another demands, or at once when
//! the holder stops demanding (no launch for [`Tunables::slice_idle_ns`], not busy, nothing
//! held). Nobody demanding: everyone `Open`. Demand of a paused container is its held threads.

use libshare_abi::rate::Gate;
use libshare_abi::MAX_DEVICES;
use rustc_hash::FxHashMap;

/// A container as the registry numbers it (a new number whenever its state file is new).
pub type ContainerId = u64;

/// Samples kept for the period, jitter and busy-duration estimates.
pub const SAMPLES: usize = 16;
/// Intervals needed before production counts as predictable.
pub const MIN_SAMPLES: usize = 4;
/// Arrivals the clock of a production job is read from (see [`Ring::next_on_clock`]).
const CLOCK_ARRIVALS: usize = 4;
/// How closely the newest samples must agree for a change of pattern (basis points of their
/// median; see [`Ring::push`]).
const CHANGE_BP: u64 = 1_000;
/// Basis points of the whole device.
pub const FULL_BP: u32 = 10_000;

/// The job class (the state file's, `libshare_abi::Class`).
pub use libshare_abi::Class;

/// One container's words on one device, read at one tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counters {
    pub launches: u64,
    pub busy_since: u64,
    pub drained_at: u64,
    pub held: u32,
    /// Basis points, 0 = none.
    pub compute: u32,
    /// Basis points, 0 = none.
    pub env_compute: u32,
    /// 0 = 1.
    pub weight: u32,
    /// The gate word as it stands.
    pub gate: Gate,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            launches: 0,
            busy_since: 0,
            drained_at: 0,
            held: 0,
            compute: 0,
            env_compute: 0,
            weight: 0,
            gate: Gate::Open,
        }
    }
}

/// One (container, device) pair in a snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub id: ContainerId,
    pub device: u8,
    pub class: Class,
    pub c: Counters,
}

/// Every (container, device) pair the daemon looks at this tick, grouped by device (entries of
/// one device are contiguous; within a device, in container order).
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub entries: Vec<Entry>,
}

/// GPU time to add to a container's token bucket: `ns`, keeping it at most `cap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refill {
    pub ns: i64,
    pub cap: i64,
}

/// What to write for one (container, device).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    pub id: ContainerId,
    pub device: u8,
    pub gate: Gate,
    pub window_end: u64,
    pub refill: Option<Refill>,
    /// The share the container got, basis points (0 = none): for logs and tests.
    pub share_bp: u32,
}

pub type Decisions = Vec<Decision>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyKind {
    /// Production as if alone; opportunistic work in production's gaps (the default).
    Libshare,
    /// Exclusive turns of `quantum_ns` among the demanding containers (the nvshare baseline).
    TimeSlice { quantum_ns: u64 },
}

/// What opportunistic work production may meet when it arrives on a device (`sharectl daemon
/// --latency-budget`): the in-flight bound of every opportunistic gate but `Paused` on a device
/// where a production container has launched, whether production is busy, idle, predictable or
/// not (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LatencyBudget {
    /// A fixed time, µs.
    Fixed(u32),
    /// Basis points of production's service time on the device (the median busy phase of
    /// the present production container with the shortest), [`LatencyBudget::MIN_US`] at
    /// least; [`LatencyBudget::DEFAULT`]'s time until a phase was measured.
    OfService(u32),
}

impl LatencyBudget {
    /// 2 ms: what the in-flight bound was before the budget (so S1–S9 keep their harvest).
    pub const DEFAULT: LatencyBudget = LatencyBudget::Fixed(2_000);
    /// The smallest budget a percentage gives: a launch's fixed cost is a few µs, and a bound
    /// below a kernel lets only one kernel at a time go anyway.
    pub const MIN_US: u32 = 50;
    /// The largest fixed budget.
    pub const MAX_US: u32 = 1_000_000;

    /// The bound on a device whose present production containers' shortest service time is
    /// `service` ns (None: not measured yet), µs.
    pub fn bound_us(self, service: Option<u64>) -> u32 {
        match (self, service) {
            (LatencyBudget::Fixed(us), _) => us,
            (LatencyBudget::OfService(bp), Some(ns)) => {
                let us = ns as u128 * bp as u128 / FULL_BP as u128 / 1_000;
                (us.min(Self::MAX_US as u128) as u32).max(Self::MIN_US)
            }
            (LatencyBudget::OfService(_), None) => Self::DEFAULT.bound_us(None),
        }
    }
}

/// A `--latency-budget` that cannot be one.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BudgetError {
    #[error("a latency budget of {0} would never let opportunistic work run beside production: give a time (e.g. 2ms, 500us) or a share of production's service time (e.g. 10%)")]
    Zero(String),
    #[error("a latency budget of {0} is no budget (100 % or more of production's service time): give less than 100%, or a time (e.g. 2ms)")]
    Whole(String),
    #[error("a latency budget of {0} is more than 1s: opportunistic work would not be bounded; give at most 1s")]
    TooLong(String),
    #[error("'{0}' is not a latency budget: give a time (e.g. 2ms, 500us) or a share of production's service time (e.g. 10%)")]
    Garbage(String),
}

impl std::str::FromStr for LatencyBudget {
    type Err = BudgetError;

    /// `2ms`, `500us`, `1.5ms`, `1s` (a fixed time), or `10%`, `2.5%` (of production's service
    /// time).
    fn from_str(s: &str) -> Result<Self, BudgetError> {
        let t = s.trim();
        let garbage = || BudgetError::Garbage(s.to_string());
        if let Some(pct) = t.strip_suffix('%') {
            // Basis points: a percentage is a duration-like decimal with two places kept.
            let bp = libshare_abi::units::parse_duration_ns(&format!("{}us", pct.trim()))
                .ok_or_else(garbage)?
                / 10;
            return match bp {
                0 => Err(BudgetError::Zero(t.into())),
                bp if bp >= FULL_BP as u64 => Err(BudgetError::Whole(t.into())),
                bp => Ok(LatencyBudget::OfService(bp as u32)),
            };
        }
        let ns = libshare_abi::units::parse_duration_ns(t).ok_or_else(garbage)?;
        let us = ns / 1_000;
        if us == 0 {
            Err(BudgetError::Zero(t.into()))
        } else if us > Self::MAX_US as u64 {
            Err(BudgetError::TooLong(t.into()))
        } else {
            Ok(LatencyBudget::Fixed(us as u32))
        }
    }
}

impl std::fmt::Display for LatencyBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            LatencyBudget::Fixed(us) if us % 1_000 == 0 => write!(f, "{}ms", us / 1_000),
            LatencyBudget::Fixed(us) => write!(f, "{us}us"),
            LatencyBudget::OfService(bp) => write!(f, "{}%", bp as f64 / 100.0),
        }
    }
}

/// The policy's constants (defaults as documented in the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tunables {
    /// A busy flag whose `launches` did not move for this long is stale.
    pub stale_ns: u64,
    /// A production container that launched within this is active.
    pub active_ns: u64,
    /// An opportunistic container that launched within this is demanding.
    pub demand_ns: u64,
    /// What opportunistic work production may meet on arrival on a device where it is
    /// present: the in-flight bound of every gate but Paused there (see the module doc).
    pub latency_budget: LatencyBudget,
    /// The smallest guard before a predicted arrival.
    pub min_guard_ns: u64,
    /// Jitter at most this fraction of the period (basis points) for a prediction.
    pub max_jitter_bp: u64,
    /// Token cap: this much time at the container's share.
    pub share_cap_ns: u64,
    /// Time-slice: a holder that did not launch for this long, not busy and holding nothing,
    /// gives its turn away.
    pub slice_idle_ns: u64,
    /// An opportunistic container held at the gate that has not launched for this long may
    /// launch once (one launch in flight): it progresses however busy production is, at a cost
    /// to production of one of its kernels per this interval.
    pub starve_ns: u64,
    /// The in-flight bound of containers sharing the device by weight.
    pub weighted_in_flight_us: u32,
    /// Beside present production, demanding opportunistic containers take turns of this
    /// × their weight (see the module doc).
    pub rotate_ns: u64,
}

impl Default for Tunables {
    fn default() -> Self {
        Tunables {
            stale_ns: 50_000_000,
            active_ns: 3_000_000_000,
            demand_ns: 100_000_000,
            latency_budget: LatencyBudget::DEFAULT,
            min_guard_ns: 300_000,
            max_jitter_bp: 1_000,
            share_cap_ns: 10_000_000,
            slice_idle_ns: 10_000_000,
            starve_ns: 100_000_000,
            weighted_in_flight_us: 1_000,
            rotate_ns: 20_000_000,
        }
    }
}

/// A fixed ring of the last [`SAMPLES`] values with their median and median absolute deviation.
#[derive(Clone, Copy, Debug, Default)]
struct Ring {
    v: [u64; SAMPLES],
    len: usize,
    pos: usize,
}

impl Ring {
    /// Adds a sample. When all but one of the newest [`MIN_SAMPLES`] agree (within
    /// [`CHANGE_BP`] of their median: one request that started late is allowed for) and the
    /// ring's median is not near them, the pattern changed: the ring restarts from them. Without this the median would hold the old pattern for half a ring more and,
    /// while old and new samples are mixed, their deviation would make the job unpredictable.
    fn push(&mut self, x: u64) {
        self.v[self.pos] = x;
        self.pos = (self.pos + 1) % SAMPLES;
        self.len = (self.len + 1).min(SAMPLES);
        if self.len <= MIN_SAMPLES {
            return;
        }
        let mut newest = [0u64; MIN_SAMPLES];
        for (m, n) in newest.iter_mut().enumerate() {
            *n = self.v[(self.pos + SAMPLES - 1 - m) % SAMPLES];
        }
        let mut sorted = newest;
        sorted.sort_unstable();
        let mid = sorted[MIN_SAMPLES / 2];
        let tol = mid * CHANGE_BP / FULL_BP as u64;
        let agree = newest.iter().filter(|n| n.abs_diff(mid) <= tol).count() + 1 >= MIN_SAMPLES;
        let Some((med, _)) = self.median_mad() else {
            return;
        };
        if agree && med.abs_diff(mid) > tol {
            // Oldest first, as pushed.
            for (m, n) in newest.iter().rev().enumerate() {
                self.v[m] = *n;
            }
            self.len = MIN_SAMPLES;
            self.pos = MIN_SAMPLES;
        }
    }

    /// (median, median absolute deviation), None when empty.
    fn median_mad(&self) -> Option<(u64, u64)> {
        if self.len == 0 {
            return None;
        }
        let mut a = self.v;
        let s = &mut a[..self.len];
        s.sort_unstable();
        let med = s[s.len() / 2];
        for x in s.iter_mut() {
            *x = x.abs_diff(med);
        }
        s.sort_unstable();
        Some((med, s[s.len() / 2]))
    }

    /// The value a window may count on, and its jitter: the median, or less when either of the
    /// two newest samples is (a pattern that just got shorter is followed at its first sample,
    /// where the median would follow it only after half the ring, each arrival meanwhile
    /// predicted late; one that got longer is followed as the median moves: safe, a little
    /// harvest lost). None with fewer than [`MIN_SAMPLES`].
    fn lower(&self) -> Option<(u64, u64)> {
        if self.len < MIN_SAMPLES {
            return None;
        }
        let (med, mad) = self.median_mad()?;
        let newest = self.v[(self.pos + SAMPLES - 1) % SAMPLES];
        let before = self.v[(self.pos + SAMPLES - 2) % SAMPLES];
        Some((med.min(newest).min(before), mad))
    }

    /// For a ring of intervals between arrivals, the last at `last`: the next arrival on the
    /// clock, the earliest of `last` + [`Ring::lower`] and each of the [`CLOCK_ARRIVALS`] − 1
    /// arrivals before it (rebuilt from the newest samples) projected by whole median periods
    /// to the first tick after `last` (as many as it is periods away, rounded, + 1: an arrival
    /// the daemon did not see, or one seen twice, does not shift it). A request that started
    /// late (its process was not scheduled) moves the last arrival, not the clock, so the next
    /// window still ends before the clock's next tick.
    fn next_on_clock(&self, last: u64) -> Option<u64> {
        let (lower, _) = self.lower()?;
        let (med, _) = self.median_mad()?;
        let mut best = last + lower;
        let mut arrival = last;
        for m in 1..CLOCK_ARRIVALS.min(self.len + 1) {
            arrival = arrival.saturating_sub(self.v[(self.pos + SAMPLES - m) % SAMPLES]);
            let periods = (last - arrival + med / 2) / med.max(1) + 1;
            best = best.min(arrival + periods * med);
        }
        Some(best)
    }
}

/// What the policy remembers of one (container, device). What every tick reads is kept
/// together; the sample rings, touched only when a phase begins or ends, are boxed apart (a tick
/// runs with cold caches: the jobs ran in between, so every line it touches costs a miss).
#[derive(Clone, Debug, Default)]
struct Track {
    key: (ContainerId, u8),
    launches: u64,
    /// When `launches` last moved (0 = never seen moving).
    moved_at: u64,
    busy_since: u64,
    last_arrival: u64,
    drained_at: u64,
    /// (period, jitter), recomputed when an interval is added.
    period: Option<(u64, u64)>,
    /// The next arrival on the clock, when `period` is known: see [`Ring::next_on_clock`].
    clock: u64,
    /// (gap, jitter), recomputed when a gap is added.
    gap: Option<(u64, u64)>,
    /// The median busy phase (production's service time), recomputed when one is added.
    service: Option<u64>,
    rings: Box<Rings>,
}

/// A track's samples.
#[derive(Clone, Debug, Default)]
struct Rings {
    intervals: Ring,
    durations: Ring,
    /// Idle gaps: from a drain to the next arrival.
    gaps: Ring,
}

impl Track {
    fn new(key: (ContainerId, u8)) -> Self {
        Track {
            key,
            ..Track::default()
        }
    }

    fn observe(&mut self, c: &Counters, now: u64) {
        if c.launches != self.launches {
            // (At first sight of a container that already launched: assume it just did.)
            self.moved_at = now;
            self.launches = c.launches;
        }
        if c.busy_since != 0 && c.busy_since != self.busy_since {
            // The drain that ended the previous phase (published before this arrival, whether
            // or not a tick saw it in between).
            if c.drained_at > self.last_arrival
                && self.last_arrival != 0
                && c.busy_since > c.drained_at
            {
                let gaps = &mut self.rings.gaps;
                gaps.push(c.busy_since - c.drained_at);
                self.gap = gaps.lower();
            }
            self.arrived(c.busy_since);
        }
        self.busy_since = c.busy_since;
        if c.drained_at != self.drained_at {
            if c.busy_since == 0 && self.drained_at > self.last_arrival && self.last_arrival != 0 {
                // A second drain since the last arrival: a whole phase began and ended between
                // two looks. Its start is unknown; its end stands for it (late by less than
                // the phase), so the clock still counts it.
                self.arrived(c.drained_at);
            }
            if c.drained_at > self.last_arrival && self.last_arrival != 0 {
                self.rings.durations.push(c.drained_at - self.last_arrival);
                self.service = self.rings.durations.median_mad().map(|(m, _)| m);
            }
            self.drained_at = c.drained_at;
        }
    }

    /// A phase began at `at`: the interval since the last one, and the clock.
    fn arrived(&mut self, at: u64) {
        if self.last_arrival != 0 && at > self.last_arrival {
            let intervals = &mut self.rings.intervals;
            intervals.push(at - self.last_arrival);
            self.period = intervals.lower();
            self.clock = intervals.next_on_clock(at).unwrap_or(0);
        }
        self.last_arrival = at;
    }

    fn launched_within(&self, now: u64, ns: u64) -> bool {
        self.moved_at != 0 && now.saturating_sub(self.moved_at) < ns
    }

    /// Busy: flagged, and the flag is not stale.
    fn busy(&self, c: &Counters, now: u64, t: &Tunables) -> bool {
        c.busy_since != 0 && self.launched_within(now, t.stale_ns)
    }
}

/// What one tick needs of an entry's track, computed once per entry (index = entry index).
#[derive(Clone, Copy, Debug, Default)]
struct Facts {
    /// Busy and not stale.
    busy: bool,
    /// Launched within `active_ns` (production) / `demand_ns` (opportunistic) /
    /// `slice_idle_ns` (time-slice).
    recent: bool,
    moved_at: u64,
    last_arrival: u64,
    period: Option<(u64, u64)>,
    clock: u64,
    gap: Option<(u64, u64)>,
    service: Option<u64>,
}

/// Per-device state of the time-slice policy's turns, or of the opportunistic containers' turns
/// beside production (policy `libshare`).
#[derive(Clone, Copy, Debug, Default)]
struct Slice {
    holder: Option<ContainerId>,
    since: u64,
}

impl Slice {
    /// Passes the turn to the next of the demanding containers `dem` (in container order,
    /// wrapping) when the holder no longer demands, or its `quantum` is over and another
    /// demands; returns the holder.
    fn pass(&mut self, dem: &[ContainerId], quantum: u64, now: u64) -> Option<ContainerId> {
        let holder_demands = self.holder.is_some_and(|h| dem.contains(&h));
        let over = now.saturating_sub(self.since) >= quantum && dem.len() > 1;
        if !holder_demands || over {
            self.holder = self
                .holder
                .and_then(|h| dem.iter().copied().find(|&id| id > h))
                .or_else(|| dem.first().copied());
            self.since = now;
        }
        self.holder
    }
}

/// Everything the policy remembers between ticks.
#[derive(Debug)]
pub struct PolicyState {
    kind: PolicyKind,
    t: Tunables,
    /// One per entry of the last snapshot, in its order (rebuilt when the entries change).
    tracks: Vec<Track>,
    facts: Vec<Facts>,
    slices: [Slice; MAX_DEVICES],
    last_now: Option<u64>,
    /// (container, device) pairs exclusive turns pause this tick (`crate::turns`): paused,
    /// neither demanding a share nor starved into a launch.
    turn_paused: Vec<(ContainerId, u8)>,
}

impl PolicyState {
    pub fn new(kind: PolicyKind) -> Self {
        Self::with_tunables(kind, Tunables::default())
    }

    pub fn with_tunables(kind: PolicyKind, t: Tunables) -> Self {
        PolicyState {
            kind,
            t,
            tracks: Vec::new(),
            facts: Vec::new(),
            slices: [Slice::default(); MAX_DEVICES],
            last_now: None,
            turn_paused: Vec::new(),
        }
    }

    /// The (container, device) pairs exclusive turns pause from the next step on (policy
    /// `libshare` only; cleared by an empty list).
    pub fn set_turn_paused(&mut self, pairs: impl IntoIterator<Item = (ContainerId, u8)>) {
        self.turn_paused.clear();
        self.turn_paused.extend(pairs);
    }

    pub fn kind(&self) -> PolicyKind {
        self.kind
    }

    fn track(&self, id: ContainerId, device: u8) -> Option<&Track> {
        self.tracks.iter().find(|t| t.key == (id, device))
    }

    /// The learned (period, jitter) of a container's arrivals on a device, ns.
    pub fn period(&self, id: ContainerId, device: u8) -> Option<(u64, u64)> {
        self.track(id, device).and_then(|t| t.period)
    }

    /// The median busy duration learned for a container on a device, ns.
    pub fn busy_duration(&self, id: ContainerId, device: u8) -> Option<u64> {
        self.track(id, device)
            .and_then(|t| t.rings.durations.median_mad())
            .map(|(m, _)| m)
    }

    /// Lines the tracks up with `snap`'s entries: kept as they are while the entries stay the
    /// same (every tick but those after a registry or device change); else rebuilt, carrying
    /// each (container, device)'s track over and dropping those no longer in the snapshot.
    fn align(&mut self, snap: &Snapshot) {
        let same = self.tracks.len() == snap.entries.len()
            && self
                .tracks
                .iter()
                .zip(&snap.entries)
                .all(|(t, e)| t.key == (e.id, e.device));
        if same {
            return;
        }
        let mut old: FxHashMap<(ContainerId, u8), Track> =
            self.tracks.drain(..).map(|t| (t.key, t)).collect();
        self.tracks.extend(snap.entries.iter().map(|e| {
            let key = (e.id, e.device);
            old.remove(&key).unwrap_or_else(|| Track::new(key))
        }));
    }
}

/// One tick of the policy: observes `snap` taken at `now` and decides the gates to write.
/// Decisions cover every opportunistic entry, every entry whose gate is not already Open, and
/// (time-slice) every entry.
pub fn step(ps: &mut PolicyState, snap: &Snapshot, now: u64) -> Decisions {
    let mut out = Vec::with_capacity(snap.entries.len());
    step_into(ps, snap, now, &mut out);
    out
}

/// [`step`] into `out` (cleared first), so a caller ticking every few ms reuses one buffer.
pub fn step_into(ps: &mut PolicyState, snap: &Snapshot, now: u64, out: &mut Decisions) {
    out.clear();
    let elapsed = ps
        .last_now
        .map_or(0, |l| now.saturating_sub(l))
        .min(ps.t.share_cap_ns);
    ps.last_now = Some(now);
    let t = ps.t;
    ps.align(snap);
    ps.facts.clear();
    for (e, tr) in snap.entries.iter().zip(&mut ps.tracks) {
        tr.observe(&e.c, now);
        let recent_ns = match (ps.kind, e.class) {
            (PolicyKind::TimeSlice { .. }, _) => t.slice_idle_ns,
            (_, Class::Production) => t.active_ns,
            (_, Class::Opportunistic) => t.demand_ns,
        };
        ps.facts.push(Facts {
            busy: tr.busy(&e.c, now, &t),
            recent: tr.launched_within(now, recent_ns),
            moved_at: tr.moved_at,
            last_arrival: tr.last_arrival,
            period: tr.period,
            clock: tr.clock,
            gap: tr.gap,
            service: tr.service,
        });
    }
    let facts = std::mem::take(&mut ps.facts);
    let mut at = 0;
    while at < snap.entries.len() {
        let d = snap.entries[at].device;
        let n = snap.entries[at..]
            .iter()
            .take_while(|e| e.device == d)
            .count();
        let (dev, f) = (&snap.entries[at..at + n], &facts[at..at + n]);
        match ps.kind {
            PolicyKind::Libshare => libshare_device(
                &t,
                &mut ps.slices[d as usize],
                dev,
                f,
                now,
                elapsed,
                &ps.turn_paused,
                out,
            ),
            PolicyKind::TimeSlice { quantum_ns } => {
                time_slice_device(&mut ps.slices[d as usize], dev, f, now, quantum_ns, out)
            }
        }
        at += n;
    }
    ps.facts = facts;
}

/// The opportunistic gate of one device before shares, and the window's end.
fn opportunistic_gate(t: &Tunables, dev: &[Entry], facts: &[Facts], now: u64) -> (Gate, u64) {
    let mut present = false;
    let mut active = false;
    let mut predictable = true;
    let mut window_end = u64::MAX;
    let mut service: Option<u64> = None;
    for (e, f) in dev.iter().zip(facts) {
        if e.class != Class::Production || e.c.launches == 0 {
            continue;
        }
        present = true;
        if let Some(s) = f.service {
            service = Some(service.map_or(s, |x| x.min(s)));
        }
        if !(f.busy || f.recent) {
            continue;
        }
        active = true;
        if f.busy {
            return (Gate::Paused, 0);
        }
        let idle_since = if e.c.busy_since == 0 && e.c.drained_at != 0 {
            e.c.drained_at
        } else {
            f.moved_at
        };
        // Two models of the next arrival: a fixed rate (requests on a clock) or a fixed idle
        // gap (the drain + the gap: a loop that sleeps or works on the host after each
        // synchronisation, whose GPU phase varies).
        let steady = |(m, jitter): (u64, u64)| jitter * FULL_BP as u64 <= m * t.max_jitter_bp;
        let drained = e.c.busy_since == 0 && e.c.drained_at > f.last_arrival;
        // A prediction production has outlived (no arrival by its time + twice the guard, at
        // least 1 ms) is wrong for this idle phase: without it, opportunistic work goes under
        // the budget alone rather than waiting out the rest of the phase (Poisson requests at
        // 60 % load, whose queued requests make a steady gap of a few µs, held it 10-17 ms at a
        // time: S10, issue 31).
        let due = |(next, jitter): (u64, u64)| {
            now <= next + (2 * t.min_guard_ns.max(3 * jitter)).max(1_000_000)
        };
        let by_period = f
            .period
            .filter(|&p| steady(p) && now.saturating_sub(idle_since) < 2 * p.0 + 10_000_000)
            .map(|(_, jitter)| (f.clock, jitter))
            .filter(|&n| due(n));
        let by_gap = f
            .gap
            .filter(|&g| {
                drained && steady(g) && now.saturating_sub(idle_since) < 2 * g.0 + 10_000_000
            })
            .map(|(gap, jitter)| (e.c.drained_at + gap, jitter))
            .filter(|&n| due(n));
        // Both steady: the earlier end. Each model is right for one kind of job and late for
        // the other exactly when it matters: after a request that ran long (its drain late),
        // the gap model puts a clocked job's next arrival late by as much; after one that
        // started late, the period model puts a sleeping loop's early. Either way the earlier
        // end is the safe one.
        let end = |(next, jitter): (u64, u64)| next.saturating_sub(t.min_guard_ns.max(3 * jitter));
        match (by_period.map(end), by_gap.map(end)) {
            (None, None) => predictable = false,
            (a, b) => window_end = window_end.min(a.unwrap_or(u64::MAX).min(b.unwrap_or(u64::MAX))),
        }
    }
    if !present {
        return (Gate::Open, 0);
    }
    // Production may arrive at any time: what it would meet is bounded by the budget, whatever
    // the prediction says (a window only narrows what goes).
    let window = active && predictable;
    (
        Gate::Run {
            in_flight_us: t.latency_budget.bound_us(service),
            window,
            share: false,
        },
        if window { window_end } else { 0 },
    )
}

/// A static share in basis points: the smaller nonzero of the admin's and the environment's,
/// 100 % or more meaning none.
pub fn static_share(compute: u32, env_compute: u32) -> Option<u32> {
    [compute, env_compute]
        .into_iter()
        .filter(|&bp| bp > 0 && bp < FULL_BP)
        .min()
}

#[allow(clippy::too_many_arguments)]
fn libshare_device(
    t: &Tunables,
    slice: &mut Slice,
    dev: &[Entry],
    facts: &[Facts],
    now: u64,
    elapsed: u64,
    turn_paused: &[(ContainerId, u8)],
    out: &mut Decisions,
) {
    let (base, window_end) = opportunistic_gate(t, dev, facts, now);
    let paused = |e: &Entry| turn_paused.contains(&(e.id, e.device));
    let demanding = |e: &Entry, f: &Facts| {
        e.class == Class::Opportunistic && (e.c.held > 0 || f.recent) && !paused(e)
    };
    let weight = |e: &Entry| e.c.weight.max(1) as u64;
    let demand_sum: u64 = dev
        .iter()
        .zip(facts)
        .filter(|(e, f)| demanding(e, f))
        .map(|(e, _)| weight(e))
        .sum();
    // The budget is the device's (issue 31): beside present production, one demanding
    // opportunistic container at a time has a gate that lets work go, in turns of
    // `rotate_ns` × its weight in container order (the weights' split), so production meets
    // one container's bounded work whatever their number (two for a moment at a hand-over).
    let rotating = base != Gate::Open
        && dev
            .iter()
            .zip(facts)
            .filter(|(e, f)| demanding(e, f))
            .nth(1)
            .is_some();
    let holder = if rotating {
        let dem: Vec<ContainerId> = dev
            .iter()
            .zip(facts)
            .filter(|(e, f)| demanding(e, f))
            .map(|(e, _)| e.id)
            .collect();
        let quantum = slice
            .holder
            .and_then(|h| dev.iter().find(|e| e.id == h))
            .map_or(0, |e| t.rotate_ns * weight(e));
        slice.pass(&dem, quantum, now)
    } else {
        slice.holder = None;
        None
    };
    let waits_turn = |e: &Entry, f: &Facts| rotating && demanding(e, f) && holder != Some(e.id);
    let last_opportunistic = dev
        .iter()
        .zip(facts)
        .filter(|(e, _)| e.class == Class::Opportunistic)
        .map(|(_, f)| f.moved_at)
        .max()
        .unwrap_or(0);
    for (e, f) in dev.iter().zip(facts) {
        if e.class == Class::Production {
            if e.c.gate != Gate::Open {
                out.push(Decision {
                    id: e.id,
                    device: e.device,
                    gate: Gate::Open,
                    window_end: 0,
                    refill: None,
                    share_bp: 0,
                });
            }
            continue;
        }
        let others = demand_sum - if demanding(e, f) { weight(e) } else { 0 };
        let weighted = (others > 0 && !rotating)
            .then(|| (weight(e) * FULL_BP as u64 / (weight(e) + others)) as u32);
        let share = match (static_share(e.c.compute, e.c.env_compute), weighted) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let (gate, refill) = match share {
            None => (base, None),
            Some(bp) => {
                let gate = match base {
                    Gate::Paused => Gate::Paused,
                    // Containers splitting the device by weight keep little in flight, so
                    // the engine's time slices pass between them as their tokens say rather
                    // than in whole slices of queued work.
                    Gate::Open => Gate::Run {
                        in_flight_us: if weighted.is_some() {
                            t.weighted_in_flight_us
                        } else {
                            0
                        },
                        window: false,
                        share: true,
                    },
                    Gate::Run {
                        in_flight_us,
                        window,
                        ..
                    } => Gate::Run {
                        in_flight_us,
                        window,
                        share: true,
                    },
                };
                let at = |ns: u64| (ns as u128 * bp as u128 / FULL_BP as u128) as i64;
                (
                    gate,
                    Some(Refill {
                        ns: at(elapsed),
                        cap: at(t.share_cap_ns),
                    }),
                )
            }
        };
        // Starved: held with no launch for `starve_ns`. In turns, the device's opportunistic
        // work is one queue: the holder is starved when no container of the device launched
        // for that long, so production meets one such launch per `starve_ns` whatever the
        // containers' number (counted per container, 8 containers waiting 140 ms each for a
        // 20 ms turn made every hand-over during a request a starvation launch: S9, issue 31).
        let waited_since = if rotating && holder == Some(e.id) {
            last_opportunistic
        } else {
            f.moved_at
        };
        let starved =
            gate == Gate::Paused && e.c.held > 0 && now.saturating_sub(waited_since) >= t.starve_ns;
        // Beside present production only a demanding container has a gate that lets work go:
        // one that does not demand yet (registered, its first launch not made) would pass an
        // open gate at once, and containers started together then all did (S9, 8 containers
        // at once: a request met up to 6.7 ms of their first kernels). Its first launch waits
        // at the gate, which makes it demand: it goes at the next tick, in turn.
        let idle = base != Gate::Open && e.class == Class::Opportunistic && !demanding(e, f);
        let gate = if paused(e) || waits_turn(e, f) || idle {
            Gate::Paused
        } else if starved {
            Gate::Run {
                in_flight_us: 1,
                window: false,
                share: false,
            }
        } else {
            gate
        };
        out.push(Decision {
            id: e.id,
            device: e.device,
            gate,
            window_end,
            refill,
            share_bp: share.unwrap_or(0),
        });
    }
}

fn time_slice_device(
    slice: &mut Slice,
    dev: &[Entry],
    facts: &[Facts],
    now: u64,
    quantum_ns: u64,
    out: &mut Decisions,
) {
    let dem: Vec<ContainerId> = dev
        .iter()
        .zip(facts)
        .filter(|(e, f)| e.c.held > 0 || f.busy || f.recent)
        .map(|(e, _)| e.id)
        .collect();
    slice.pass(&dem, quantum_ns, now);
    for e in dev {
        let gate = match slice.holder {
            Some(h) if h != e.id => Gate::Paused,
            _ => Gate::Open,
        };
        out.push(Decision {
            id: e.id,
            device: e.device,
            gate,
            window_end: 0,
            refill: None,
            share_bp: 0,
        });
    }
}

#[cfg(test)]
mod tests;
