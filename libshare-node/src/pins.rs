//! The daemon's side of the bound on opportunistic memory that cannot be demoted (issue 30,
//! B6c; `libshare_abi::pin` has the protocol): per device, what production leaves is split
//! between the opportunistic containers, and each one's part written as its `pin_cap`.
//!
//! # What production leaves
//!
//! The device's memory (NVML's total) less a margin of 5 % (contexts and memory outside
//! libshare's containers, as `turns.rs` keeps), less, for every container the daemon holds as
//! production, its quota on the device — or what it holds there, if more or if it has no
//! quota (a production container without a quota is guaranteed only what it holds). The
//! quota is the daemon's word where it has one, else the state's.
//!
//! # The split ([`split`])
//!
//! Each opportunistic container's cap is what it holds pinned (read under its pin lock) plus,
//! if it asked for room (a want: the size of an allocation its cap refused) and that fits what
//! is free, that much, plus an equal share of what is left free among the containers *active*
//! on the device (holding pinned memory there, or having asked within the last second); the
//! others get nothing beyond what they hold, so a container's idle room goes back to the
//! others. Σ caps ≤ what production leaves whenever what they hold fits it; when it does not
//! (production's quota was raised), caps are what each holds: nobody grows. A container whose
//! pin lock is held (one of its processes is in the middle of an allocation, or stopped there)
//! keeps its cap and counts with the larger of its cap and what it held at the last look.
//!
//! # When
//!
//! At every rescan (100 ms) on every device of the node, and at the next tick (5 ms) on the
//! devices where a container posted a want. Cost: one load per opportunistic container per tick;
//! per look, two `fcntl` calls per opportunistic container and a read of its slots per device.

use crate::policy::ContainerId;
use crate::registry::Container;
use libshare_abi::{Class, MAX_DEVICES};
use rustc_hash::FxHashMap;
use std::sync::atomic::Ordering::Acquire;

/// Device memory kept out of what production leaves (contexts, other processes), basis points:
/// the margin `turns.rs` keeps too.
pub const MARGIN_BP: u64 = 500;
/// How long a container that asked for room counts as active on the device.
pub const ACTIVE_NS: u64 = 1_000_000_000;

/// What a production container holds back on a device: its quota (0: none) or what it holds,
/// whichever is more.
pub fn reserve(quota: u64, used: u64) -> u64 {
    if quota > 0 {
        quota.max(used)
    } else {
        used
    }
}

/// What production leaves on a device of `total` bytes where production holds back
/// `reserved`.
pub fn room(total: u64, reserved: u64) -> u64 {
    let margin = (total as u128 * MARGIN_BP as u128 / 10_000) as u64;
    total.saturating_sub(margin).saturating_sub(reserved)
}

/// One opportunistic container on a device, as the daemon looked at it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Member {
    /// Pinned bytes it holds (read under its pin lock).
    pub pinned: u64,
    /// The allocation a want asked room for (0: none this look).
    pub need: u64,
    /// Holds pinned memory here or asked within [`ACTIVE_NS`].
    pub active: bool,
    /// Its pin lock was held: its cap is not written, and it counts with this (the larger of
    /// its cap and what it held at the last look).
    pub fixed: Option<u64>,
}

/// The caps of `members` on a device where production leaves `room` (None: a fixed member,
/// not written), in `caps` (cleared first). See the module doc.
pub fn split(room: u64, members: &[Member], caps: &mut Vec<Option<u64>>) {
    caps.clear();
    let fixed: u64 = members.iter().filter_map(|m| m.fixed).sum();
    let held: u64 = members
        .iter()
        .filter(|m| m.fixed.is_none())
        .map(|m| m.pinned)
        .sum();
    let mut free = room.saturating_sub(fixed).saturating_sub(held);
    let mut granted = Vec::with_capacity(members.len());
    for m in members {
        let g = if m.fixed.is_none() && m.need > 0 && m.need <= free {
            free -= m.need;
            m.need
        } else {
            0
        };
        granted.push(g);
    }
    let n = members
        .iter()
        .filter(|m| m.fixed.is_none() && m.active)
        .count() as u64;
    let fair = free.checked_div(n).unwrap_or(0);
    caps.extend(members.iter().zip(&granted).map(|(m, &g)| {
        m.fixed.is_none().then(|| {
            m.pinned
                .saturating_add(g)
                .saturating_add(if m.active { fair } else { 0 })
        })
    }));
}

/// The daemon's memory of the bound between looks.
#[derive(Debug, Default)]
pub struct Pins {
    /// When each (container, device) last asked for room.
    asked: FxHashMap<(ContainerId, usize), u64>,
    /// What each (container, device) held pinned at the last look under its lock.
    last: FxHashMap<(ContainerId, usize), u64>,
    /// Buffers reused between looks.
    opp: Vec<usize>,
    needs: Vec<[u64; MAX_DEVICES]>,
    members: Vec<Member>,
    caps: Vec<Option<u64>>,
}

/// The class the daemon holds container `c` in (its words, else its file's).
fn class_of(c: &Container) -> Class {
    c.words.class_or(c.state.header().class())
}

impl Pins {
    /// Every tick: looks at once at the devices where an opportunistic container asked for
    /// room (one load per opportunistic container when none did). `totals`: each device's
    /// memory, by the node's index.
    pub fn tick(&mut self, cs: &[Container], totals: &[u64], now: u64) {
        if totals.is_empty() {
            return;
        }
        let wanted = cs
            .iter()
            .filter(|c| class_of(c) == Class::Opportunistic)
            .any(|c| c.state.header().pin_want.load(Acquire) != 0);
        if wanted {
            self.look(cs, totals, now, false);
        }
    }

    /// Every rescan: looks at every device of the node.
    pub fn rescan(&mut self, cs: &[Container], totals: &[u64], now: u64) {
        if !totals.is_empty() {
            self.look(cs, totals, now, true);
        }
    }

    /// One look: takes the wants, locks the opportunistic containers it can, and writes the
    /// caps of the devices that asked (`all`: every device).
    fn look(&mut self, cs: &[Container], totals: &[u64], now: u64, all: bool) {
        self.opp.clear();
        self.opp.extend(
            cs.iter()
                .enumerate()
                .filter(|(_, c)| class_of(c) == Class::Opportunistic)
                .map(|(i, _)| i),
        );
        self.asked
            .retain(|k, at| now.saturating_sub(*at) < ACTIVE_NS && cs.iter().any(|c| c.id == k.0));
        self.last.retain(|k, _| cs.iter().any(|c| c.id == k.0));
        let mut devices = if all { u32::MAX } else { 0 };
        self.needs.clear();
        for &i in &self.opp {
            let c = &cs[i];
            let w = c.state.take_pin_wants();
            devices |= w;
            let mut need = [0u64; MAX_DEVICES];
            for (d, n) in need
                .iter_mut()
                .enumerate()
                .filter(|(d, _)| w & (1 << d) != 0)
            {
                *n = c.state.device(d).take_pin_need();
                self.asked.insert((c.id, d), now);
            }
            self.needs.push(need);
        }
        if self.opp.is_empty() {
            return;
        }
        let guards: Vec<_> = self
            .opp
            .iter()
            .map(|&i| cs[i].state.try_pin_lock())
            .collect();
        // A want of a container found locked is looked at next tick.
        for (k, &i) in self
            .opp
            .iter()
            .enumerate()
            .filter(|(k, _)| guards[*k].is_none())
        {
            for (d, &need) in self.needs[k].iter().enumerate().filter(|(_, n)| **n > 0) {
                cs[i].state.post_pin_want(d, need);
            }
        }
        for (d, &total) in totals.iter().enumerate().take(MAX_DEVICES) {
            if devices & (1 << d) == 0 {
                continue;
            }
            let reserved: u64 = cs
                .iter()
                .filter(|c| class_of(c) != Class::Opportunistic)
                .map(|c| {
                    let s = c.state.device(d);
                    let quota = c.words.quota[d].unwrap_or_else(|| s.quota.load(Acquire));
                    reserve(quota, s.used.load(Acquire))
                })
                .sum();
            self.members.clear();
            for (k, &i) in self.opp.iter().enumerate() {
                let c = &cs[i];
                let need = self.needs[k][d];
                let asked = self.asked.contains_key(&(c.id, d));
                let m = if guards[k].is_some() {
                    let pinned = c.state.pinned(d);
                    self.last.insert((c.id, d), pinned);
                    Member {
                        pinned,
                        need,
                        active: pinned > 0 || asked,
                        fixed: None,
                    }
                } else {
                    let cap = c.state.device(d).pin_cap.load(Acquire);
                    let last = self.last.get(&(c.id, d)).copied().unwrap_or(0);
                    Member {
                        fixed: Some(cap.max(last)),
                        ..Member::default()
                    }
                };
                self.members.push(m);
            }
            split(room(total, reserved), &self.members, &mut self.caps);
            for (k, &i) in self.opp.iter().enumerate() {
                if let Some(cap) = self.caps[k] {
                    let answered = self.needs[k][d] > 0;
                    cs[i].state.device(d).set_pin_cap(cap, answered);
                }
            }
        }
        drop(guards);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn m(pinned: u64, need: u64, active: bool) -> Member {
        Member {
            pinned,
            need,
            active,
            fixed: None,
        }
    }

    #[test]
    fn production_holds_back_its_quota_or_what_it_holds() {
        assert_eq!(reserve(GIB, 0), GIB);
        assert_eq!(
            reserve(GIB, 2 * GIB),
            2 * GIB,
            "a quota lowered below its use"
        );
        assert_eq!(reserve(0, 3 * GIB), 3 * GIB, "no quota: what it holds");
        // The audit's GPU: 4 GiB, production's quota 1 GiB.
        assert_eq!(room(4 * GIB, GIB), 4 * GIB - 4 * GIB / 20 - GIB);
        assert_eq!(room(4 * GIB, 5 * GIB), 0);
    }

    #[test]
    fn caps_never_add_up_to_more_than_production_leaves() {
        let mut caps = Vec::new();
        // One container alone gets all of it.
        split(3 * GIB, &[m(0, 0, true)], &mut caps);
        assert_eq!(caps, [Some(3 * GIB)]);
        // Two active ones share what is free equally, beyond what each holds.
        split(3 * GIB, &[m(GIB, 0, true), m(0, 0, true)], &mut caps);
        assert_eq!(caps, [Some(2 * GIB), Some(GIB)]);
        // An inactive one gets nothing beyond what it holds (0): its room goes to the other.
        split(3 * GIB, &[m(GIB, 0, true), m(0, 0, false)], &mut caps);
        assert_eq!(caps, [Some(3 * GIB), Some(0)]);
        // A want that fits is granted before the equal share; one that does not, is not.
        split(3 * GIB, &[m(0, 2 * GIB, true), m(0, 0, true)], &mut caps);
        assert_eq!(caps, [Some(2 * GIB + GIB / 2), Some(GIB / 2)]);
        split(3 * GIB, &[m(2 * GIB, 2 * GIB, true)], &mut caps);
        assert_eq!(caps, [Some(3 * GIB)], "only 1 GiB free: the equal share");
        // Production's quota raised past what they hold: nobody grows.
        split(GIB, &[m(GIB, 0, true), m(GIB, GIB, true)], &mut caps);
        assert_eq!(caps, [Some(GIB), Some(GIB)]);
        // A container whose lock was held keeps its cap and counts with it.
        let fixed = Member {
            fixed: Some(2 * GIB),
            ..Member::default()
        };
        split(3 * GIB, &[fixed, m(0, 0, true)], &mut caps);
        assert_eq!(caps, [None, Some(GIB)]);
        // Whatever the mix, Σ caps (fixed counted) ≤ room when what they hold fits.
        for pinned in [0, GIB / 3, GIB] {
            for need in [0, GIB / 2, 5 * GIB] {
                let ms = [
                    m(pinned, need, true),
                    m(GIB / 4, 0, false),
                    fixed,
                    m(0, need, true),
                ];
                split(4 * GIB, &ms, &mut caps);
                let sum: u64 = caps
                    .iter()
                    .zip(&ms)
                    .map(|(c, m)| c.or(m.fixed).unwrap())
                    .sum();
                assert!(sum <= 4 * GIB, "{ms:?} → {caps:?}");
            }
        }
    }
}
