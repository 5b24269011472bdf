//! The control loop. Every period (absolute deadlines on `CLOCK_MONOTONIC`, so lateness does
//! not accumulate): read every registered container's counters into a [`Snapshot`], run the
//! pure policy, write each decided gate with `DeviceState::write_gate` (every tick, for every
//! opportunistic container: `refreshed` is the daemon's heartbeat) and refill token buckets.
//! The registry is rescanned every 100 ms, between ticks, and at the next tick after the
//! registration service opened a new container's state ([`Health::registered`]); until the
//! policy decides for it, a new opportunistic container is held on the devices in use
//! ([`hold_new`]). When the loop stops, gates are
//! left at a floor that stalls nobody ([`Controller::release`]).
//!
//! Which devices: a device is looked at when any container has launched on it (or has a busy
//! flag or a gate word there); every container then has an entry on every such device, so an
//! opportunistic container that has not launched there yet is already gated. The set is
//! recomputed every [`DEVICE_SCAN_TICKS`] ticks (a pass over every device of every container
//! costs more than the rest of a tick): the first container to launch on a device nobody used
//! runs ungated for at most that many periods.
//!
//! Cost: per tick one pass over the containers' device words (a few loads each), the policy
//! and one gate write per opportunistic entry; no allocation (the buffers are reused), no
//! system call but the sleep and the futex wakes of changed gates with threads held.

use crate::error::NodeError;
use crate::host::{Host, LinuxHost};
use crate::policy::{self, Class, Counters, Entry, PolicyKind, PolicyState, Snapshot};
use crate::registry::{Container, Registry};
use libshare_abi::rate::Gate;
use libshare_abi::{State, MAX_DEVICES};
use rustc_hash::FxHashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};
use std::sync::Arc;

/// The most phase words the loop waits on at once (`futex_waitv`'s limit); production
/// containers beyond them are left to the periodic ticks.
pub const MAX_WORDS: usize = 128;
/// Fills the unused entries of the loop's word array.
static UNUSED_WORD: AtomicU32 = AtomicU32::new(0);

/// How often (in ticks) the set of devices in use is recomputed.
pub const DEVICE_SCAN_TICKS: u64 = 8;

/// The soonest a registration makes the loop rescan after the last rescan (a burst of new
/// containers costs one rescan per this, not one each).
const EARLY_RESCAN_NS: u64 = 10_000_000;

/// Holds a container the loop may not know yet (just registered) on the devices in use
/// (`devices`, [`Health::devices`]): an opportunistic container's gate there, never written by
/// a daemon, becomes `Paused`, with the heartbeat, until the loop's policy decides at its next
/// tick after the rescan the registration asked for. Without it a new container's first
/// launches would find the open word of a fresh state and queue freely beside production until
/// the next rescan (issue 31). A daemon that never decides leaves it at the shims' floor after
/// `DAEMON_SILENT_NS`.
pub fn hold_new(st: &State, devices: u32, now: u64) {
    if st.header().class() != Class::Opportunistic {
        return;
    }
    for d in (0..MAX_DEVICES).filter(|d| devices & (1 << d) != 0) {
        let dev = st.device(d);
        if dev.refreshed.load(Acquire) == 0 {
            dev.write_gate(Gate::Paused, 0, now);
        }
    }
}

/// The loop's settings.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    pub state_dir: PathBuf,
    pub period_ns: u64,
    pub policy: PolicyKind,
    /// How often the registry rescans the state directory.
    pub rescan_ns: u64,
    /// Live counters of the loop, for the metrics (clone the `Arc` before [`run`]).
    pub health: Arc<Health>,
    /// The daemon's words on each container (the persisted settings), asserted by the
    /// registry and read by the policy instead of the containers' own words.
    pub authority: Option<crate::authority::Authority>,
    /// Whether the daemon runs memory oversubscription's demotion protocol (`demote.rs`).
    pub demotion: bool,
    /// Exclusive turns between oversubscribing containers whose working sets do not fit
    /// (`turns.rs`), None: never. They need each device's memory (`device_totals`).
    pub turns: Option<crate::turns::TurnConfig>,
    /// Each device's total memory (NVML), by the node's GPU index (NVML's, as every device
    /// index of the daemon); None: unknown (no turns).
    pub device_totals: Option<Vec<u64>>,
    /// What opportunistic work production may meet on arrival (policy `libshare`).
    pub latency_budget: crate::policy::LatencyBudget,
}

/// The loop's live counters (the metrics' daemon health): plain stores by the loop, readable
/// from any thread. Ticks, overruns and lateness are updated every tick; CPU time and the
/// number of containers at every rescan (every 100 ms).
#[derive(Debug, Default)]
pub struct Health {
    pub ticks: AtomicU64,
    pub event_ticks: AtomicU64,
    pub overruns: AtomicU64,
    /// Worst (wake-up time − deadline) since the loop started, ns.
    pub late_max_ns: AtomicU64,
    /// CPU time of the loop's thread, ns.
    pub cpu_ns: AtomicU64,
    pub containers: AtomicU64,
    /// Nonzero while the loop runs.
    pub running: AtomicU32,
    /// Early wakes of the loop with no listened word changed (someone woke a phase word without
    /// a phase change): no tick ran for them.
    pub spurious_wakes: AtomicU64,
    /// Containers' words the daemon had to restore (see [`crate::authority`]).
    pub restores: Arc<crate::authority::Restores>,
    /// The devices in use (bit per node GPU index), as the loop last scanned them: the
    /// registration service holds a new opportunistic container on these (see [`hold_new`]).
    pub devices: AtomicU32,
    /// Bumped by the registration service whenever it opens a container's state the loop may
    /// not know yet: the loop rescans at its next tick instead of within [`ControllerConfig::rescan_ns`].
    pub registered: AtomicU64,
    /// Exclusive turns (`turns.rs`), all devices: switches since the start, devices in turns
    /// now, and the last switch's cost and the quantum in force (ns, the latest device's).
    pub turn_switches: AtomicU64,
    pub turns_active: AtomicU64,
    pub turn_cost_ns: AtomicU64,
    pub turn_quantum_ns: AtomicU64,
}

impl ControllerConfig {
    pub fn new(state_dir: PathBuf, period_ns: u64, policy: PolicyKind) -> Self {
        ControllerConfig {
            state_dir,
            period_ns,
            policy,
            rescan_ns: 100_000_000,
            health: Arc::default(),
            authority: None,
            demotion: true,
            turns: Some(crate::turns::TurnConfig::default()),
            device_totals: None,
            latency_budget: crate::policy::LatencyBudget::DEFAULT,
        }
    }

    /// Checks the period and quantum (one-line errors).
    pub fn check(&self) -> Result<(), NodeError> {
        if !(100_000..=1_000_000_000).contains(&self.period_ns) {
            return Err(NodeError::Period(self.period_ns));
        }
        if let PolicyKind::TimeSlice { quantum_ns } = self.policy {
            if quantum_ns < self.period_ns {
                return Err(NodeError::Quantum {
                    quantum: quantum_ns,
                    period: self.period_ns,
                });
            }
        }
        Ok(())
    }
}

/// What a run did, for the exit log line and the benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RunStats {
    /// Ticks at the period.
    pub ticks: u64,
    /// Ticks run at once because a production container began or ended a busy phase.
    pub event_ticks: u64,
    /// Mean and max of (wake-up time − deadline), ns.
    pub late_mean_ns: u64,
    pub late_max_ns: u64,
    /// Deadlines skipped because a tick ended past the next one.
    pub overruns: u64,
    /// CPU time of the loop's thread, ns, and the wall time it ran.
    pub cpu_ns: u64,
    pub wall_ns: u64,
    pub containers: usize,
}

impl RunStats {
    /// CPU used as a percentage of one core.
    pub fn cpu_pct(&self) -> f64 {
        if self.wall_ns == 0 {
            0.0
        } else {
            self.cpu_ns as f64 * 100.0 / self.wall_ns as f64
        }
    }
}

/// The registry, the policy's memory and the reusable snapshot.
pub struct Controller {
    registry: Registry,
    policy: PolicyState,
    demoter: crate::demote::Demoter,
    /// Exclusive turns per device, their settings, and the buffers a tick reuses.
    turns: [crate::turns::DeviceTurns; MAX_DEVICES],
    turn_cfg: Option<crate::turns::TurnConfig>,
    totals: Vec<u64>,
    members: Vec<crate::turns::Member>,
    member_of: Vec<usize>,
    turn_out: Vec<crate::turns::Out>,
    /// (container index, device, demotion target) decided by turns this tick, and the pairs
    /// they pause.
    floors: Vec<(usize, usize, u64)>,
    turn_paused: Vec<(policy::ContainerId, u8)>,
    health: Arc<Health>,
    /// The bound on opportunistic memory that cannot be demoted (`pins.rs`), and whether the
    /// next tick looks at every device (after a rescan).
    pins: crate::pins::Pins,
    pins_all: bool,
    snap: Snapshot,
    /// The devices in use (see the module doc), recomputed every [`DEVICE_SCAN_TICKS`].
    devices: u32,
    ticks: u64,
    /// Which container index each snapshot entry came from.
    owner: Vec<usize>,
    /// The policy's decisions, reused every tick.
    decisions: policy::Decisions,
    /// Whether the loop listens to each (container, device), and why (see
    /// [`Controller::listen`]).
    phases: FxHashMap<(u64, u8), Listen>,
    /// Each registered container's environment compute limit (the smallest nonzero over its
    /// processes' slots), by index in the registry: computed at each rescan, after the
    /// registry reclaimed dead processes' slots, so a tick reads one word per container.
    env_limits: Vec<u32>,
    listen_at: u64,
}

/// The daemon's listening to one production container's phase word on one device.
#[derive(Clone, Copy, Debug, Default)]
struct Listen {
    /// `phase_seq` at the last [`Controller::listen`] decision.
    seq: u32,
    /// Whether the loop waits on the word (the daemon's decision: the file's `daemon_listens`
    /// only tells the container's shims to wake it, and a job can write it).
    on: bool,
    /// Wakes of the word that changed nothing, since the last decision.
    spurious: u32,
    /// Not listened to before this time (`rate::now_ns()` clock): spurious wakes.
    muted_until: u64,
    /// A line was logged for the current mute episode (cleared by a clean listened window).
    warned: bool,
    /// The [`Controller::listen`] round that last saw the container registered; an entry
    /// left behind by a container that went is dropped at the end of the next round.
    round: u64,
}

/// Wakes of a listened phase word that change nothing (any process mapping the word can wake
/// it) tolerated per [`LISTEN_WINDOW_NS`]: a genuine phase change can look like one when its
/// wake lands after the loop already read the new value, which is rare. A container above it
/// is not listened to for [`SPURIOUS_MUTE_NS`] (its phases are seen at the periodic ticks).
pub const SPURIOUS_BUDGET: u32 = 8;
/// How long a container with too many spurious wakes is not listened to.
pub const SPURIOUS_MUTE_NS: u64 = 1_000_000_000;

/// How often the daemon decides whom to listen to.
pub const LISTEN_WINDOW_NS: u64 = 100_000_000;
/// A production container whose busy phases change more often than once per this (on average
/// over [`LISTEN_WINDOW_NS`]) does not wake the daemon.
pub const MIN_PHASE_NS: u64 = 1_000_000;

/// Container `c`'s counters on device `d`: the shims' from the file, its compute share and
/// weight from the daemon's words (the file's only where the daemon has none), and its
/// processes' environment compute limit `env_limit` (the smallest over its slots, cached at
/// the last rescan: [`State::compute_limit`]), which counts only where the daemon trusts the
/// environment.
fn read_counters(c: &Container, d: usize, env_limit: u32) -> Counters {
    let s = c.state.device(d);
    let [compute, weight, env_compute] = c.words.shares_or(
        d,
        s.compute.load(Acquire),
        s.weight.load(Acquire),
        env_limit,
    );
    Counters {
        launches: s.launches.load(Acquire),
        busy_since: s.busy_since.load(Acquire),
        drained_at: s.drained_at.load(Acquire),
        held: s.held.load(Acquire),
        compute,
        env_compute,
        weight,
        gate: s.gate(),
    }
}

/// The class the daemon holds container `c` in (its words, else its file's).
fn class_of(c: &Container) -> Class {
    c.words.class_or(c.state.header().class())
}

/// Whether the daemon holds container `c` as opportunistic.
fn opportunistic(c: &Container) -> bool {
    class_of(c) == Class::Opportunistic
}

/// Has anything run on the device for this container (a launch, a busy flag, a gate)? A share
/// or weight alone does not count: `sharectl set` writes them on every device, and a device
/// nobody launched on needs no gate.
fn in_use(st: &State, d: usize) -> bool {
    let s = st.device(d);
    s.launches.load(Relaxed) != 0 || s.busy_since.load(Relaxed) != 0 || s.budget.load(Relaxed) != 0
}

impl Controller {
    pub fn new(cfg: &ControllerConfig) -> Result<Self, NodeError> {
        cfg.check()?;
        let mut registry = Registry::new(&cfg.state_dir).with_authority(cfg.authority.clone());
        registry.rescan()?;
        Ok(Controller {
            registry,
            policy: PolicyState::with_tunables(
                cfg.policy,
                crate::policy::Tunables {
                    latency_budget: cfg.latency_budget,
                    ..Default::default()
                },
            ),
            demoter: crate::demote::Demoter::new(cfg.demotion),
            turns: Default::default(),
            turn_cfg: cfg
                .turns
                .filter(|_| cfg.device_totals.is_some() && cfg.policy == PolicyKind::Libshare),
            totals: cfg.device_totals.clone().unwrap_or_default(),
            members: Vec::new(),
            member_of: Vec::new(),
            turn_out: Vec::new(),
            floors: Vec::new(),
            turn_paused: Vec::new(),
            health: cfg.health.clone(),
            pins: Default::default(),
            pins_all: true,
            snap: Snapshot::default(),
            devices: 0,
            ticks: 0,
            owner: Vec::new(),
            decisions: Vec::new(),
            phases: FxHashMap::default(),
            listen_at: 0,
            env_limits: Vec::new(),
        }
        .with_env_limits())
    }

    /// Recomputes [`Controller::env_limits`] (after a rescan).
    fn with_env_limits(mut self) -> Self {
        self.refresh_env_limits();
        self
    }

    fn refresh_env_limits(&mut self) {
        self.env_limits.clear();
        self.env_limits.extend(
            self.registry
                .containers()
                .iter()
                .map(|c| c.state.compute_limit()),
        );
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn rescan(&mut self) -> Result<(), NodeError> {
        self.ticks = 0; // new containers: look at the devices again next tick
        self.pins_all = true;
        let r = self.registry.rescan().map(|_| ());
        self.refresh_env_limits();
        r
    }

    /// One tick at `now`: snapshot, policy, writes. Returns the number of gates written.
    pub fn tick(&mut self, now: u64) -> usize {
        self.registry.refresh_words();
        let cs = self.registry.containers();
        if std::mem::take(&mut self.pins_all) {
            self.pins.rescan(cs, &self.totals, now);
        } else {
            self.pins.tick(cs, &self.totals, now);
        }
        if self.ticks % DEVICE_SCAN_TICKS == 0 {
            self.devices = 0;
            for c in cs {
                for d in 0..MAX_DEVICES {
                    if self.devices & (1 << d) == 0 && in_use(&c.state, d) {
                        self.devices |= 1 << d;
                    }
                }
            }
            self.health.devices.store(self.devices, Relaxed);
        }
        self.ticks += 1;
        self.turns_step(now);
        let cs = self.registry.containers();
        let devices = self.devices;
        self.snap.entries.clear();
        self.owner.clear();
        for d in (0..MAX_DEVICES).filter(|d| devices & (1 << d) != 0) {
            for (i, c) in cs.iter().enumerate() {
                let class = class_of(c);
                self.snap.entries.push(Entry {
                    id: c.id,
                    device: d as u8,
                    class,
                    c: read_counters(c, d, self.env_limits.get(i).copied().unwrap_or(0)),
                });
                self.owner.push(i);
            }
        }
        policy::step_into(&mut self.policy, &self.snap, now, &mut self.decisions);
        let decisions = &self.decisions;
        // Decisions come in snapshot order (a subset): walk both together. Two passes: pauses
        // first, then the rest, so a turn handed from one container to another (time-slice)
        // never has both running at once.
        for pauses in [true, false] {
            let mut k = 0;
            for dec in decisions {
                while self.snap.entries[k].id != dec.id || self.snap.entries[k].device != dec.device
                {
                    k += 1;
                }
                if (dec.gate == Gate::Paused) != pauses {
                    continue;
                }
                let dev = cs[self.owner[k]].state.device(dec.device as usize);
                if let Some(r) = dec.refill {
                    dev.refill(r.ns, r.cap);
                }
                if tracing::enabled!(tracing::Level::DEBUG) && dev.gate() != dec.gate {
                    tracing::debug!(
                        container = %cs[self.owner[k]].name,
                        device = dec.device,
                        gate = ?dec.gate,
                        window_us = dec.window_end.saturating_sub(now) / 1_000,
                        now_us = now / 1_000,
                        share_bp = dec.share_bp,
                        "gate"
                    );
                }
                dev.write_gate(dec.gate, dec.window_end, now);
            }
        }
        let n = decisions.len();
        let floors = &self.floors;
        let floor = |i: usize, d: usize| {
            floors
                .iter()
                .find(|&&(fi, fd, _)| fi == i && fd == d)
                .map(|f| f.2)
        };
        self.demoter.step(cs, self.devices, now, &floor);
        self.listen(now);
        n
    }

    /// Exclusive turns (`turns.rs`) on every device in use: the oversubscribing containers'
    /// footprints against the memory the others leave; tells the policy whom turns pause and
    /// keeps the demotion targets for the demoter.
    fn turns_step(&mut self, now: u64) {
        self.floors.clear();
        let Some(cfg) = self.turn_cfg else { return };
        let cs = self.registry.containers();
        self.turn_paused.clear();
        let (mut switches, mut active) = (0, 0);
        for d in (0..MAX_DEVICES).filter(|d| self.devices & (1 << d) != 0) {
            let Some(&total) = self.totals.get(d) else {
                continue;
            };
            self.members.clear();
            self.member_of.clear();
            let mut others = 0u64;
            for (i, c) in cs.iter().enumerate() {
                let s = c.state.device(d);
                let used = s.used.load(Acquire);
                let over = opportunistic(c)
                    && c.state.header().flags.load(Acquire) & libshare_abi::FLAG_OVERSUBSCRIBE != 0;
                if !over {
                    others = others.saturating_add(used);
                    continue;
                }
                if used == 0 {
                    continue;
                }
                let busy_since = s.busy_since.load(Acquire);
                let busy = busy_since != 0;
                self.members.push(crate::turns::Member {
                    id: c.id,
                    footprint: used,
                    demoted: s.demoted.load(Acquire),
                    busy,
                    busy_since,
                    drained_at: s.drained_at.load(Acquire),
                    asking: busy || s.held.load(Acquire) > 0,
                });
                self.member_of.push(i);
            }
            let t = &mut self.turns[d];
            let was = (t.active(), t.holder());
            t.step(
                &cfg,
                total.saturating_sub(others),
                &self.members,
                now,
                &mut self.turn_out,
            );
            if (t.active(), t.holder()) != was {
                tracing::info!(
                    device = d,
                    turns = t.active(),
                    holder = ?t.holder().and_then(|h| cs.iter().find(|c| c.id == h)).map(|c| &c.name),
                    cost_ms = t.cost(&cfg) / 1_000_000,
                    quantum_ms = t.quantum(&cfg) / 1_000_000,
                    "turns"
                );
            }
            for ((m, o), &i) in self.members.iter().zip(&self.turn_out).zip(&self.member_of) {
                self.floors.push((i, d, o.demote));
                if o.paused {
                    self.turn_paused.push((m.id, d as u8));
                }
            }
            switches += t.switches;
            if t.active() {
                active += 1;
                self.health.turn_cost_ns.store(t.cost(&cfg), Relaxed);
                self.health.turn_quantum_ns.store(t.quantum(&cfg), Relaxed);
            }
        }
        self.policy
            .set_turn_paused(self.turn_paused.iter().copied());
        self.health.turn_switches.store(switches, Relaxed);
        self.health.turns_active.store(active, Relaxed);
    }

    /// The phase words of the production containers listened to (see [`Controller::listen`]),
    /// with their values now, for the loop to wait on, and in `keys` whose each is (container
    /// id, device): as many as fit in `out` and `keys`, their number returned (the loop passes
    /// [`MAX_WORDS`], what one `futex_waitv` takes).
    pub fn phase_words<'a>(
        &'a self,
        out: &mut [(&'a AtomicU32, u32)],
        keys: &mut [(u64, u8)],
    ) -> usize {
        let max = out.len().min(keys.len());
        let mut n = 0;
        for c in self.registry.containers() {
            for d in (0..MAX_DEVICES).filter(|d| self.devices & (1 << d) != 0) {
                if n < max && self.phases.get(&(c.id, d as u8)).is_some_and(|l| l.on) {
                    let dev = c.state.device(d);
                    out[n] = (&dev.phase_seq, dev.phase_seq.load(Acquire));
                    keys[n] = (c.id, d as u8);
                    n += 1;
                }
            }
        }
        n
    }

    /// The loop woke early on (container, device) `key`'s phase word and no listened word had
    /// changed: counted; above [`SPURIOUS_BUDGET`] in the listen window the container is not
    /// listened to for [`SPURIOUS_MUTE_NS`] (one log line per episode). Returns whether it was
    /// dropped now.
    pub fn spurious_wake(&mut self, key: (u64, u8), now: u64) -> bool {
        let Some(l) = self.phases.get_mut(&key) else {
            return false;
        };
        l.spurious = l.spurious.saturating_add(1);
        if !l.on || l.spurious <= SPURIOUS_BUDGET {
            return false;
        }
        l.on = false;
        l.muted_until = now + SPURIOUS_MUTE_NS;
        let warn = !std::mem::replace(&mut l.warned, true);
        if let Some(c) = self.registry.containers().iter().find(|c| c.id == key.0) {
            c.state
                .device(key.1 as usize)
                .daemon_listens
                .store(0, Release);
            if warn {
                tracing::warn!(
                    container = %c.name,
                    device = key.1,
                    wakes = l.spurious,
                    "a job of the container wakes the daemon without changing its busy phase; \
                     not listening to it for {} ms (its phases are seen at the period)",
                    SPURIOUS_MUTE_NS / 1_000_000
                );
            }
        }
        true
    }

    /// Decides, every [`LISTEN_WINDOW_NS`], which production containers wake the loop: those
    /// whose busy phases changed at most once per [`MIN_PHASE_NS`] on average. A job flipping
    /// faster (e.g. one that queries an event after every launch) would make both it (a futex
    /// wake per phase) and the daemon (a tick per phase) pay for nothing the period does not
    /// already give: it is left to the periodic ticks. So is, for [`SPURIOUS_MUTE_NS`], one
    /// whose word was woken more than [`SPURIOUS_BUDGET`] times in a window without changing
    /// ([`Controller::spurious_wake`]); it is listened to again after that, and logged again
    /// only if it does it again after a clean window.
    fn listen(&mut self, now: u64) {
        if now < self.listen_at {
            return;
        }
        let window = now - self.listen_at + LISTEN_WINDOW_NS;
        self.listen_at = now + LISTEN_WINDOW_NS;
        let round = now;
        for c in self.registry.containers() {
            let production = !opportunistic(c);
            for d in (0..MAX_DEVICES).filter(|d| self.devices & (1 << d) != 0) {
                let dev = c.state.device(d);
                let seq = dev.phase_seq.load(Acquire);
                let l = self.phases.entry((c.id, d as u8)).or_insert(Listen {
                    seq,
                    ..Listen::default()
                });
                let changes = seq.wrapping_sub(l.seq) as u64;
                l.seq = seq;
                l.round = round;
                if l.on && l.spurious <= SPURIOUS_BUDGET {
                    l.warned = false; // a clean window listened to
                }
                l.spurious = 0;
                l.on = production && changes * MIN_PHASE_NS <= window && now >= l.muted_until;
                if (dev.daemon_listens.load(Relaxed) != 0) != l.on {
                    dev.daemon_listens.store(l.on as u32, Release);
                }
            }
        }
        // Containers that went (every registration is a new id): their entries go too.
        self.phases.retain(|_, l| l.round == round);
    }

    /// Leaves every gate this daemon may have closed at a floor that cannot stall anyone: Open
    /// for production containers, [`libshare_abi::rate::FLOOR`] for opportunistic ones (where
    /// their shims put them anyway once the heartbeat is silent), so a stopped daemon never leaves a job paused and a
    /// production job's wait stays bounded until a daemon returns.
    pub fn release(&self, now: u64) {
        for c in self.registry.containers() {
            for d in 0..MAX_DEVICES {
                c.state.device(d).daemon_listens.store(0, Release);
            }
            let opportunistic = opportunistic(c);
            for d in 0..MAX_DEVICES {
                let dev = c.state.device(d);
                if dev.budget.load(Acquire) == 0 {
                    continue;
                }
                let gate = if opportunistic {
                    libshare_abi::rate::FLOOR
                } else {
                    Gate::Open
                };
                dev.write_gate(gate, 0, now);
            }
        }
    }

    /// The gate now written for a container on a device (tests, status).
    pub fn gate_of(&self, name: &str, device: usize) -> Option<Gate> {
        self.registry
            .containers()
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.state.device(device).gate())
    }
}

/// Runs the loop until `stop` is set (a signal handler sets it; the sleep returns early on a
/// signal), on the Linux host.
pub fn run(cfg: &ControllerConfig, stop: &AtomicBool) -> Result<RunStats, NodeError> {
    run_on(&LinuxHost, cfg, stop)
}

/// [`run`] on any [`Host`].
pub fn run_on(
    host: &impl Host,
    cfg: &ControllerConfig,
    stop: &AtomicBool,
) -> Result<RunStats, NodeError> {
    let mut ctl = Controller::new(cfg)?;
    let period = cfg.period_ns;
    let cpu0 = host.thread_cpu_ns();
    let start = host.now();
    let mut stats = RunStats::default();
    let mut late_sum: u128 = 0;
    let mut next_rescan = start + cfg.rescan_ns;
    let mut seen_registered = cfg.health.registered.load(Acquire);
    let mut last_rescan = start;
    let mut deadline = start;
    let mut early = false;
    let health = &*cfg.health;
    health.running.store(1, Release);
    while !stop.load(Acquire) {
        let now = host.now();
        let registered = health.registered.load(Acquire);
        let asked = registered != seen_registered && now >= last_rescan + EARLY_RESCAN_NS;
        if now >= next_rescan || asked {
            seen_registered = registered;
            last_rescan = now;
            if let Err(e) = ctl.rescan() {
                tracing::warn!("{e}");
            }
            next_rescan = now + cfg.rescan_ns;
            let cpu = host.thread_cpu_ns().saturating_sub(cpu0);
            health.cpu_ns.store(cpu, Relaxed);
            let n = ctl.registry().containers().len() as u64;
            health.containers.store(n, Relaxed);
        }
        let now = host.now();
        ctl.tick(now);
        if early {
            // An event tick refreshed every gate: the next periodic one is a period from now.
            stats.event_ticks += 1;
            deadline = now + period;
        } else {
            stats.ticks += 1;
            deadline += period;
        }
        let after = host.now();
        if after >= deadline {
            // The tick (or the sleep before it) ran past the next deadline: skip ahead rather
            // than run a burst of ticks.
            let missed = (after - deadline) / period + 1;
            stats.overruns += missed;
            deadline += missed * period;
        }
        health.ticks.store(stats.ticks, Relaxed);
        health.event_ticks.store(stats.event_ticks, Relaxed);
        health.overruns.store(stats.overruns, Relaxed);
        // Sleep to the next period, or less: a production container beginning or ending a busy
        // phase wakes the loop at once, so opportunistic work is paused on production's return
        // and let in when it drains without waiting for the period. A wake that changed no
        // listened word ticks nothing: the loop waits again (and a container doing that too
        // often is no longer listened to).
        let mut keys = [(0u64, 0u8); MAX_WORDS];
        loop {
            let (changed, woken) = {
                let mut words = [(&UNUSED_WORD, 0); MAX_WORDS];
                let n = ctl.phase_words(&mut words, &mut keys);
                let woken = host.wait_until(deadline, &words[..n]).filter(|&i| i < n);
                let changed = words[..n].iter().any(|(w, v)| w.load(Acquire) != *v);
                (changed, woken)
            };
            if stop.load(Acquire) {
                break;
            }
            let woke = host.now();
            early = woke < deadline;
            if !early {
                let late = woke - deadline;
                late_sum += late as u128;
                stats.late_max_ns = stats.late_max_ns.max(late);
                health.late_max_ns.store(stats.late_max_ns, Relaxed);
                break;
            }
            if changed {
                break;
            }
            // Early with nothing changed: a wake of an unchanged word, or a signal.
            if let Some(i) = woken {
                health.spurious_wakes.fetch_add(1, Relaxed);
                ctl.spurious_wake(keys[i], woke);
            }
        }
        if stop.load(Acquire) {
            break;
        }
    }
    health.running.store(0, Release);
    ctl.release(host.now());
    stats.wall_ns = host.now() - start;
    stats.cpu_ns = host.thread_cpu_ns().saturating_sub(cpu0);
    stats.late_mean_ns = late_sum.checked_div(stats.ticks as u128).unwrap_or(0) as u64;
    stats.containers = ctl.registry().containers().len();
    health.cpu_ns.store(stats.cpu_ns, Relaxed);
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;
    use libshare_abi::{container_dir, rate, Class};

    /// A container that goes takes its listening entries with it: a node that sees thousands of
    /// containers come and go keeps only the live ones'.
    #[test]
    fn listening_entries_of_gone_containers_are_dropped() {
        let tmp = tempfile::tempdir().unwrap();
        let dirs: Vec<PathBuf> = (0..3)
            .map(|i| {
                let dir = container_dir(tmp.path(), &format!("prod-{i}"));
                let st = State::open_or_create(&dir).unwrap();
                st.header().set_class(Class::Production);
                st.device(0).note_launch();
                dir
            })
            .collect();
        let cfg = ControllerConfig::new(tmp.path().to_path_buf(), 1_000_000, PolicyKind::Libshare);
        let mut ctl = Controller::new(&cfg).unwrap();
        let mut now = rate::now_ns();
        ctl.tick(now);
        assert_eq!(ctl.phases.len(), 3);
        for dir in &dirs[1..] {
            std::fs::remove_dir_all(dir).unwrap();
        }
        ctl.rescan().unwrap();
        assert_eq!(ctl.registry().containers().len(), 1);
        now += 2 * LISTEN_WINDOW_NS;
        ctl.tick(now);
        assert_eq!(
            ctl.phases.len(),
            1,
            "entries of the two containers that went remain"
        );
    }
}
