//! Exclusive turns between oversubscribing opportunistic containers whose working sets do not fit
//! together in device memory (issue 20, Build 4): a pure policy (no I/O, no clock), run by the
//! controller every tick per device before the sharing policy.
//!
//! # What it sees (what a real GPU exposes, through the containers' own counters and NVML)
//!
//! Per device: the memory left to the oversubscribing containers (NVML's total less what the
//! other containers hold, `used` in their state files), and per oversubscribing container
//! ([`Member`]): its footprint (`used`: its managed allocations, charged by its shims), what it
//! holds demoted (`demoted`, the demotion protocol's word), whether it has GPU work in flight
//! (`busy_since`, set at its first launch and cleared when a synchronising call saw the work
//! done), since when it is idle (`drained_at`), and whether it asks for the GPU (threads held at
//! the gate).
//!
//! # What it decides
//!
//! - **Sharing** while the footprints fit (Σ footprint ≤ capacity − [`TurnConfig::margin_bp`]):
//!   nobody is paused by turns, every target is 0 (demoted memory comes back as it fits).
//! - **Turns** when they do not: one container, the *holder*, may launch; the others are paused
//!   and asked to hold their whole footprint demoted (the demotion protocol's target: advice
//!   host + prefetch to host on their own streams), which makes room for the holder, whose target
//!   is 0 (its memory is prefetched back). Thrash under demand paging (each job's kernels
//!   evicting the other's pages, at the fault-driven rate) becomes a few bulk migrations at the
//!   copy engine's bandwidth per switch.
//! - **A switch** (to the next container that asks, in container order) happens when the
//!   holder's quantum is over, or earlier when the holder has had no GPU work in flight for as
//!   long as a switch costs (a holder on the CPU gives the GPU away: ski rental, never more than
//!   twice what waiting for it would have cost), or at once (past [`TurnConfig::min_idle_ns`])
//!   when its previous idle gap was longer than two switches. The incoming container stays paused until its
//!   memory is back (`demoted` 0) or the switch times out ([`TurnConfig::timeout`]); the time
//!   that took is the **switch's cost**.
//! - **The quantum adapts to that cost**: `k × last cost` ([`TurnConfig::k`]), within
//!   [`TurnConfig::min_quantum_ns`]..[`TurnConfig::max_quantum_ns`], so the switches' share of
//!   the GPU's time stays about 1/k whatever the working sets' sizes and the link's speed;
//!   nvshare's fixed 30 s is too long for small working sets and too short for huge ones.
//!   [`TurnConfig::fixed_quantum_ns`] gives the fixed baseline (`sharectl daemon --turn-quantum`).
//!
//! Assumed: footprints are working sets (a job that allocates much and touches little is given
//! turns it did not need: conservative, never a thrash); memory outside libshare's containers
//! (other processes, contexts) is inside the margin.

use crate::policy::ContainerId;

/// The policy's constants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TurnConfig {
    /// A fixed quantum (the nvshare-style baseline); None: adaptive.
    pub fixed_quantum_ns: Option<u64>,
    /// Adaptive quantum = `k` × the last switch's cost.
    pub k: u64,
    pub min_quantum_ns: u64,
    pub max_quantum_ns: u64,
    /// The cost assumed before a switch was measured.
    pub initial_cost_ns: u64,
    /// Bounds of the idle time after which a holder gives its turn away (the last switch's
    /// cost within them).
    pub min_idle_ns: u64,
    pub max_idle_ns: u64,
    /// Device memory kept out of the fit test (contexts, other processes), basis points.
    pub margin_bp: u64,
}

impl Default for TurnConfig {
    fn default() -> Self {
        TurnConfig {
            fixed_quantum_ns: None,
            k: 20,
            min_quantum_ns: 200_000_000,
            max_quantum_ns: 60_000_000_000,
            initial_cost_ns: 100_000_000,
            min_idle_ns: 10_000_000,
            max_idle_ns: 1_000_000_000,
            margin_bp: 500,
        }
    }
}

impl TurnConfig {
    /// The quantum after a switch that cost `cost` ns.
    pub fn quantum(&self, cost: u64) -> u64 {
        self.fixed_quantum_ns.unwrap_or_else(|| {
            cost.saturating_mul(self.k)
                .clamp(self.min_quantum_ns, self.max_quantum_ns)
        })
    }

    /// How long a holder with nothing in flight keeps its turn while another asks.
    pub fn idle(&self, cost: u64) -> u64 {
        cost.clamp(self.min_idle_ns, self.max_idle_ns)
    }

    /// The longest an incoming container waits for its memory before it runs anyway.
    pub fn timeout(&self, cost: u64) -> u64 {
        cost.saturating_mul(4).clamp(500_000_000, 10_000_000_000)
    }
}

/// One oversubscribing container on the device, as read this tick.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Member {
    pub id: ContainerId,
    /// Bytes it holds (its shims' charge).
    pub footprint: u64,
    /// Bytes it holds demoted to the host.
    pub demoted: u64,
    /// GPU work in flight (a busy phase not seen drained).
    pub busy: bool,
    /// When its current or last busy phase began (0: never).
    pub busy_since: u64,
    /// When its last busy phase was seen drained (0: never).
    pub drained_at: u64,
    /// It asks for the GPU (threads held at its gate, or work in flight).
    pub asking: bool,
}

/// What turns decide for one member (same order as the members given).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Out {
    /// Launch nothing (whatever the sharing policy says).
    pub paused: bool,
    /// The demotion target: bytes it should hold demoted.
    pub demote: u64,
}

/// The turn being held or handed over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Turn {
    holder: ContainerId,
    /// When the holder got the GPU (or the switch began, while `switching`).
    since: u64,
    /// Its memory is still coming back: paused.
    switching: bool,
    /// The switch moved memory (the holder had some demoted): its time is a cost to learn.
    moved: bool,
}

/// One device's turns.
#[derive(Clone, Debug, Default)]
pub struct DeviceTurns {
    turn: Option<Turn>,
    /// The last measured switch cost, ns (0: none yet).
    last_cost: u64,
    /// Switches since the daemon started (entering turns counts as one).
    pub switches: u64,
    /// Per member: the `busy_since` last seen and the idle gap before it (drain to next
    /// launch), ns.
    gaps: Vec<(ContainerId, u64, u64)>,
}

impl DeviceTurns {
    /// Whether the device is in turns (working sets that do not fit).
    pub fn active(&self) -> bool {
        self.turn.is_some()
    }

    /// The holder now, if in turns.
    pub fn holder(&self) -> Option<ContainerId> {
        self.turn.map(|t| t.holder)
    }

    /// The last switch's measured cost, ns (the configured initial cost before one).
    pub fn cost(&self, cfg: &TurnConfig) -> u64 {
        if self.last_cost == 0 {
            cfg.initial_cost_ns
        } else {
            self.last_cost
        }
    }

    /// The quantum in force.
    pub fn quantum(&self, cfg: &TurnConfig) -> u64 {
        cfg.quantum(self.cost(cfg))
    }

    /// One tick at `now`: `capacity` is the device memory left to the members; `out` gets one
    /// [`Out`] per member (cleared first).
    pub fn step(
        &mut self,
        cfg: &TurnConfig,
        capacity: u64,
        members: &[Member],
        now: u64,
        out: &mut Vec<Out>,
    ) {
        out.clear();
        let need: u64 = members.iter().map(|m| m.footprint).sum();
        let room = capacity - capacity / 10_000 * cfg.margin_bp.min(10_000);
        if members.len() < 2 || need <= room {
            self.turn = None;
            out.extend(members.iter().map(|_| Out::default()));
            return;
        }
        let cost = self.cost(cfg);
        self.gaps.retain(|g| members.iter().any(|m| m.id == g.0));
        for m in members {
            let i = match self.gaps.iter().position(|g| g.0 == m.id) {
                Some(i) => i,
                None => {
                    self.gaps.push((m.id, m.busy_since, 0));
                    self.gaps.len() - 1
                }
            };
            let g = &mut self.gaps[i];
            if m.busy_since != g.1 {
                g.1 = m.busy_since;
                if m.busy_since > m.drained_at && m.drained_at != 0 {
                    g.2 = m.busy_since - m.drained_at;
                }
            }
        }
        let gaps = &self.gaps;
        let last_gap = |id: ContainerId| gaps.iter().find(|g| g.0 == id).map_or(0, |g| g.2);
        let find = |id: ContainerId| members.iter().find(|m| m.id == id);
        // The next member asking after `after` in container order (wrapping), else any.
        let next = |after: Option<ContainerId>| {
            let asking = |m: &&Member| m.asking && Some(m.id) != after;
            after
                .and_then(|a| members.iter().filter(asking).find(|m| m.id > a))
                .or_else(|| members.iter().find(asking))
                .or_else(|| after.and_then(find).or(members.first()))
                .map(|m| m.id)
        };
        let mut turn = match self.turn {
            Some(t) if find(t.holder).is_some() => t,
            // Entering turns, or the holder went: a switch to the next that asks.
            prev => {
                self.switches += 1;
                Turn {
                    holder: next(prev.map(|t| t.holder)).unwrap_or(members[0].id),
                    since: now,
                    switching: true,
                    moved: false,
                }
            }
        };
        let h = *find(turn.holder).expect("the holder is a member");
        if turn.switching {
            // Its memory is back, and what the others keep resident fits beside it.
            let resident: u64 = members
                .iter()
                .map(|m| m.footprint.saturating_sub(m.demoted))
                .sum();
            turn.moved |= h.demoted > 0;
            let back = h.demoted == 0 && resident <= room;
            if back || now.saturating_sub(turn.since) >= cfg.timeout(cost) {
                if back && turn.moved {
                    self.last_cost = now.saturating_sub(turn.since).max(1);
                }
                turn.switching = false;
                turn.since = now;
            }
        } else if members.iter().any(|m| m.id != h.id && m.asking) {
            let idle_for = now.saturating_sub(h.drained_at.max(turn.since));
            // Idle for a switch's cost; or at once (past a blip) when its last idle gap was
            // longer than two switches: a job on the CPU for long gives the GPU away.
            let wait = if last_gap(h.id) >= 2 * cost {
                cfg.min_idle_ns
            } else {
                cfg.idle(cost)
            };
            let idle = !h.busy && idle_for >= wait;
            let over = now.saturating_sub(turn.since) >= cfg.quantum(cost);
            if idle || over {
                if let Some(n) = next(Some(h.id)).filter(|&n| n != h.id) {
                    self.switches += 1;
                    turn = Turn {
                        holder: n,
                        since: now,
                        switching: true,
                        moved: false,
                    };
                }
            }
        }
        self.turn = Some(turn);
        out.extend(members.iter().map(|m| {
            let holds = m.id == turn.holder;
            Out {
                paused: !holds || turn.switching,
                demote: if holds { 0 } else { m.footprint },
            }
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GIB: u64 = 1 << 30;
    const MS: u64 = 1_000_000;

    fn m(id: ContainerId, footprint: u64) -> Member {
        Member {
            id,
            footprint,
            ..Member::default()
        }
    }

    #[test]
    fn working_sets_that_fit_share_and_those_that_do_not_take_turns() {
        let cfg = TurnConfig::default();
        let mut t = DeviceTurns::default();
        let mut out = Vec::new();
        let fit = [m(1, GIB / 2), m(2, GIB / 2)];
        t.step(&cfg, 2 * GIB, &fit, 1, &mut out);
        assert!(!t.active());
        assert_eq!(out, vec![Out::default(); 2]);
        // 2 × 1.4 GiB on 2 GiB: turns; the first asking holds, the other is demoted whole.
        let mut a = m(1, 14 * GIB / 10);
        let mut b = m(2, 14 * GIB / 10);
        b.asking = true;
        b.demoted = b.footprint;
        t.step(&cfg, 2 * GIB, &[a, b], 10 * MS, &mut out);
        assert_eq!(t.holder(), Some(2));
        assert_eq!(t.switches, 1);
        assert_eq!(
            out[0],
            Out {
                paused: true,
                demote: a.footprint
            }
        );
        assert_eq!(
            out[1],
            Out {
                paused: true,
                demote: 0
            },
            "paused until its memory is back"
        );
        b.demoted = 0;
        t.step(&cfg, 2 * GIB, &[a, b], 25 * MS, &mut out);
        assert!(out[1].paused, "the other's memory is still resident");
        a.demoted = a.footprint;
        t.step(&cfg, 2 * GIB, &[a, b], 40 * MS, &mut out);
        assert!(!out[1].paused, "its memory is back (nothing demoted)");
        assert_eq!(t.cost(&cfg), 30 * MS, "the switch's measured cost");
        assert_eq!(t.quantum(&cfg), cfg.min_quantum_ns.max(20 * 30 * MS));
        // One leaves: they fit again, everything comes back.
        t.step(&cfg, 2 * GIB, &[b], 50 * MS, &mut out);
        assert!(!t.active());
        assert_eq!(out, vec![Out::default()]);
    }

    /// Drives two members through switches: returns (holder, outs) at each tick.
    fn run(
        cfg: &TurnConfig,
        t: &mut DeviceTurns,
        members: &mut [Member],
        from: u64,
        to: u64,
    ) -> Vec<(u64, Option<ContainerId>)> {
        let mut out = Vec::new();
        let mut seen = Vec::new();
        let mut now = from;
        while now < to {
            t.step(cfg, 2 * GIB, members, now, &mut out);
            // The shims: a target is reached at once.
            for (mm, o) in members.iter_mut().zip(&out) {
                mm.demoted = o.demote;
            }
            seen.push((now, t.holder()));
            now += 5 * MS;
        }
        seen
    }

    #[test]
    fn a_busy_holder_keeps_its_turn_for_the_quantum_then_hands_it_over() {
        let cfg = TurnConfig {
            fixed_quantum_ns: Some(500 * MS),
            ..TurnConfig::default()
        };
        let mut t = DeviceTurns::default();
        let mut ms = [m(1, 14 * GIB / 10), m(2, 14 * GIB / 10)];
        for x in &mut ms {
            x.asking = true;
            x.busy = true;
        }
        let seen = run(&cfg, &mut t, &mut ms, 0, 2_000 * MS);
        let holders: Vec<_> = seen.iter().map(|s| s.1.unwrap()).collect();
        let changes = holders.windows(2).filter(|w| w[0] != w[1]).count();
        assert_eq!(changes, 3, "a switch per 500 ms quantum: {holders:?}");
        assert_eq!(t.switches, 4, "entering turns, then three");
    }

    #[test]
    fn an_idle_holder_gives_its_turn_away_after_a_switch_cost_only_to_one_who_asks() {
        let cfg = TurnConfig::default();
        let mut t = DeviceTurns::default();
        let mut ms = [m(1, 14 * GIB / 10), m(2, 14 * GIB / 10)];
        ms[0].asking = true;
        ms[0].busy = true;
        run(&cfg, &mut t, &mut ms, 0, 50 * MS);
        assert_eq!(t.holder(), Some(1));
        // The holder goes to the CPU at 50 ms; nobody else asks: it keeps the turn.
        ms[0].busy = false;
        ms[0].asking = false;
        ms[0].drained_at = 50 * MS;
        run(&cfg, &mut t, &mut ms, 50 * MS, 1_000 * MS);
        assert_eq!(t.holder(), Some(1));
        // The other asks: the turn passes once the holder was idle for a switch's cost (the
        // measured one: 5 ms, one tick, raised to the 10 ms floor).
        ms[1].asking = true;
        let seen = run(&cfg, &mut t, &mut ms, 1_000 * MS, 1_100 * MS);
        let at = seen.iter().find(|s| s.1 == Some(2)).unwrap().0;
        assert_eq!(at, 1_000 * MS, "idle far longer than a switch: at once");
        // Back on 2, busy; 1 asks again after its CPU phase: 2 keeps the GPU for its quantum.
        ms[1].busy = true;
        ms[0].asking = true;
        let seen = run(&cfg, &mut t, &mut ms, 1_100 * MS, 1_150 * MS);
        assert!(seen.iter().all(|s| s.1 == Some(2)));
    }

    #[test]
    fn a_holder_whose_idle_gaps_are_long_gives_its_turn_away_at_once() {
        let cfg = TurnConfig::default();
        let mut t = DeviceTurns::default();
        let mut ms = [m(1, 14 * GIB / 10), m(2, 14 * GIB / 10)];
        ms[0].asking = true;
        ms[0].busy = true;
        ms[0].busy_since = 1;
        run(&cfg, &mut t, &mut ms, 0, 20 * MS);
        assert_eq!(t.holder(), Some(1));
        // One second on the CPU, then a busy phase: its gap is learnt.
        ms[0] = Member {
            busy: false,
            busy_since: 0,
            drained_at: 20 * MS,
            ..ms[0]
        };
        run(&cfg, &mut t, &mut ms, 20 * MS, 1_020 * MS);
        ms[0] = Member {
            busy: true,
            busy_since: 1_020 * MS,
            ..ms[0]
        };
        run(&cfg, &mut t, &mut ms, 1_020 * MS, 1_500 * MS);
        // It drains while the other asks: the turn passes after the 10 ms blip guard, not
        // after a switch's cost (100 ms before one was measured).
        ms[0] = Member {
            busy: false,
            busy_since: 0,
            drained_at: 1_500 * MS,
            asking: false,
            ..ms[0]
        };
        ms[1].asking = true;
        let seen = run(&cfg, &mut t, &mut ms, 1_500 * MS, 1_600 * MS);
        let at = seen.iter().find(|s| s.1 == Some(2)).unwrap().0;
        assert_eq!(at, 1_510 * MS);
    }

    proptest! {
        /// Whatever the members do: at most one is not paused while in turns, that one has a
        /// target of 0, every other is asked to demote its whole footprint; sharing pauses no one
        /// and demotes nothing; the quantum stays in its bounds.
        #[test]
        fn at_most_one_runs_and_only_it_keeps_its_memory(
            steps in proptest::collection::vec(
                (proptest::collection::vec((0u64..4, 0u64..3 * GIB, any::<bool>(), any::<bool>(), any::<bool>()), 0..5), 1u64..200),
                1..60),
        ) {
            let cfg = TurnConfig::default();
            let mut t = DeviceTurns::default();
            let mut out = Vec::new();
            let mut now = 0;
            for (ms, dt) in steps {
                now += dt * MS;
                let mut members: Vec<Member> = ms.iter().map(|&(id, f, busy, asking, back)| Member {
                    id, footprint: f, demoted: if back { 0 } else { f / 2 }, busy, busy_since: if busy { now / 3 } else { 0 }, drained_at: now / 2, asking,
                }).collect();
                members.sort_by_key(|m| m.id);
                members.dedup_by_key(|m| m.id);
                t.step(&cfg, 2 * GIB, &members, now, &mut out);
                prop_assert_eq!(out.len(), members.len());
                let running = out.iter().filter(|o| !o.paused).count();
                if t.active() {
                    prop_assert!(running <= 1);
                    let h = t.holder().unwrap();
                    for (mm, o) in members.iter().zip(&out) {
                        prop_assert_eq!(o.demote, if mm.id == h { 0 } else { mm.footprint });
                        prop_assert!(o.paused || mm.id == h);
                    }
                } else {
                    prop_assert!(out.iter().all(|o| *o == Out::default()));
                }
                let q = t.quantum(&cfg);
                prop_assert!((cfg.min_quantum_ns..=cfg.max_quantum_ns).contains(&q));
            }
        }
    }
}
