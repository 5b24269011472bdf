//! The daemon's side of the demotion protocol (`libshare_abi::demote` has the protocol): every
//! tick, the growth of production containers' `mem_want` on a device becomes demotion targets of
//! the oversubscribing containers there; a second without a new want ends the pressure (targets
//! back to 0: the shims prefetch their memory back as it fits). Every 100 ms, production
//! containers' `protect` stamp is renewed while an oversubscribing container is registered.
//!
//! Cost per tick: a few loads per container and device in use; writes only on a change.

use crate::policy::ContainerId;
use crate::registry::Container;
use libshare_abi::demote::{split, stamp, HOLD_NS};
use libshare_abi::{Class, FLAG_OVERSUBSCRIBE, MAX_DEVICES};
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicU32, Ordering::*};

/// How often production's `protect` stamp is renewed.
const STAMP_NS: u64 = 100_000_000;

/// The stamp the loop last wrote (0: no protection): registration gives it to a new production
/// container at once, so its first allocations are protected too (not only from the next stamp).
pub static STAMP: AtomicU32 = AtomicU32::new(0);

/// The daemon's memory of the protocol between ticks.
#[derive(Debug)]
pub struct Demoter {
    enabled: bool,
    /// `mem_want` last seen per (production container, device).
    seen: FxHashMap<(ContainerId, usize), u64>,
    /// When a device last saw a new want.
    last_want: [u64; MAX_DEVICES],
    stamped_at: u64,
    /// The oversubscribing containers this tick (indices; reused, no allocation per tick).
    over: Vec<usize>,
    /// Whether the protocol ran last tick (targets are reset once when it stops).
    was_active: bool,
}

impl Demoter {
    /// `enabled` false (`sharectl daemon --no-demotion`): production is never protected (what
    /// TGS-style hints alone give), every target stays 0.
    pub fn new(enabled: bool) -> Self {
        Demoter {
            enabled,
            seen: FxHashMap::default(),
            last_want: [0; MAX_DEVICES],
            stamped_at: 0,
            over: Vec::new(),
            was_active: false,
        }
    }

    /// One look at every container on the devices in `devices` (bit mask) at `now`. `floor(i,
    /// d)`: the target exclusive turns set for container `cs[i]` on device `d` (`crate::turns`:
    /// its whole footprint while it waits for its turn, 0 for the holder), None where turns have
    /// no say; a container's target is never below it.
    pub fn step(
        &mut self,
        cs: &[Container],
        devices: u32,
        now: u64,
        floor: &dyn Fn(usize, usize) -> Option<u64>,
    ) {
        let class = |c: &Container| c.words.class_or(c.state.header().class());
        self.over.clear();
        for (i, c) in cs.iter().enumerate() {
            if class(c) == Class::Opportunistic
                && c.state.header().flags.load(Acquire) & FLAG_OVERSUBSCRIBE != 0
            {
                self.over.push(i);
            }
        }
        let active = self.enabled && !self.over.is_empty();
        if now.saturating_sub(self.stamped_at) >= STAMP_NS {
            self.stamped_at = now;
            let s = if active { stamp(now) } else { 0 };
            STAMP.store(s, Release);
            for c in cs.iter().filter(|c| class(c) != Class::Opportunistic) {
                c.state.header().set_protect(s);
            }
        }
        if !active {
            if std::mem::take(&mut self.was_active) {
                for c in cs {
                    (0..MAX_DEVICES).for_each(|d| c.state.device(d).set_demote(0));
                }
            }
            for &i in &self.over {
                for d in (0..MAX_DEVICES).filter(|d| devices & (1 << d) != 0) {
                    if let Some(f) = floor(i, d) {
                        cs[i].state.device(d).set_demote(f);
                    }
                }
            }
            return;
        }
        self.was_active = true;
        for d in (0..MAX_DEVICES).filter(|d| devices & (1 << d) != 0 || *d == 0) {
            let mut want = 0u64;
            for c in cs.iter().filter(|c| class(c) != Class::Opportunistic) {
                let w = c.state.device(d).mem_want.load(Acquire);
                let seen = self.seen.entry((c.id, d)).or_insert(w);
                want = want.saturating_add(w.saturating_sub(*seen));
                *seen = w;
            }
            let over = || {
                self.over
                    .iter()
                    .map(|&i| (&cs[i], floor(i, d).unwrap_or(0)))
            };
            if want > 0 {
                self.last_want[d] = now;
                let room: Vec<u64> = over()
                    .map(|(c, _)| {
                        let s = c.state.device(d);
                        s.used.load(Acquire).saturating_sub(s.demote.load(Acquire))
                    })
                    .collect();
                for ((c, f), part) in over().zip(split(want, &room)) {
                    let s = c.state.device(d);
                    s.set_demote((s.demote.load(Acquire) + part).max(f));
                    if part > 0 {
                        tracing::debug!(container = %c.name, device = d, bytes = part, "demote");
                    }
                }
            } else if now.saturating_sub(self.last_want[d]) >= HOLD_NS {
                over().for_each(|(c, f)| c.state.device(d).set_demote(f));
            } else {
                // Turns' targets apply at once; production's stay until the pressure ends.
                over().for_each(|(c, f)| {
                    let s = c.state.device(d);
                    if s.demote.load(Acquire) < f {
                        s.set_demote(f);
                    }
                });
            }
            over().for_each(|(c, _)| c.state.device(d).clamp_demoted());
        }
    }
}
