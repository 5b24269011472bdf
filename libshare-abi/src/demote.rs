//! Memory oversubscription's demotion protocol (issue 20, Build 3), defined once: production's
//! device allocations are protected by opportunistic jobs demoting their managed memory to the
//! host on the daemon's request, not by the driver's eviction order.
//!
//! # Who writes what
//!
//! - The daemon, in every production container while an oversubscribing container (opportunistic,
//!   `FLAG_OVERSUBSCRIBE`) is registered: [`Header::protect`](crate::Header) = its [`stamp`],
//!   renewed every rescan (100 ms); 0 otherwise. A production shim whose `protect` reads 0 (one
//!   relaxed load, beside the class and flags its allocation path loads anyway) allocates as
//!   before: the protocol adds nothing there.
//! - A production shim, on a `cuMemAlloc`/`cuMemAllocPitch` while `protect` is fresh
//!   ([`protected`]): asks the driver for free device memory (`cuMemGetInfo`); if the allocation
//!   does not fit, adds the missing bytes to its container's `mem_want` ([`DeviceState::post_want`])
//!   and polls the driver's free memory every millisecond for at most [`WAIT_BOUND_NS`], then
//!   calls the driver whatever it found. The allocation never fails because of an opportunistic
//!   job: past the bound, the driver evicts what is still resident (as it would without the
//!   protocol).
//! - The daemon, every tick: the growth of production's `mem_want` on a device is split among the
//!   oversubscribing containers there in proportion to what they hold that is not already asked
//!   for, raising their `demote` target ([`DeviceState::set_demote`], which wakes their shims
//!   through `gate_seq`). Without a new want for [`HOLD_NS`], the pressure has ended: targets go
//!   back to 0.
//! - Opportunistic shims (a thread per oversubscribing process, waiting on `gate_seq`, never a
//!   production thread): while `demoted < demote`, claim the difference
//!   ([`DeviceState::claim_demotion`]) and demote that many bytes of their managed allocations,
//!   oldest first, whole allocations (`cuMemAdvise` preferred location host, `cuMemPrefetchAsync`
//!   to the host on their own stream); a claim they cannot fill is given back. While `demote` is
//!   0 and they hold demoted memory, claim it back ([`DeviceState::claim_promotion`]) and prefetch
//!   it to the device (preferred location device), newest first, as long as the driver reports
//!   free memory for it.
//!
//! # Faults
//!
//! - An opportunistic process killed in the middle: its memory goes with it (the driver frees
//!   it); production's poll sees the free memory. Its claim stays counted in `demoted` until the
//!   daemon clamps `demoted` to the container's `used` (which loses the dead process's memory at
//!   the next rescan).
//! - A stopped (SIGSTOP) or unresponsive opportunistic job: production waits the bound, then the
//!   driver evicts the stopped job's pages for the allocation.
//! - The daemon killed: `protect` goes stale within [`STALE_MS`]; until then production waits the
//!   bound at most once per allocation that does not fit, after it not at all.

use crate::rate::{futex_wake, now_ns};
use crate::DeviceState;
use std::sync::atomic::Ordering::*;

/// The longest a production allocation waits for demotion before it calls the driver anyway.
pub const WAIT_BOUND_NS: u64 = 50_000_000;
/// How long without a new want before the daemon lets demoted memory come back.
pub const HOLD_NS: u64 = 1_000_000_000;
/// `protect` older than this (in [`stamp`] units, about ms) is a daemon gone: no waiting.
pub const STALE_MS: u32 = 1_000;

/// The daemon's clock for `protect`: [`now_ns`] in units of 2^20 ns (about 1 ms), never 0.
pub fn stamp(now: u64) -> u32 {
    ((now >> 20) as u32).max(1)
}

/// Whether a production shim should make room before allocating: `protect` (the header word)
/// is set and fresh at `now`.
pub fn protected(protect: u32, now: u64) -> bool {
    protect != 0 && stamp(now).wrapping_sub(protect) < STALE_MS
}

impl crate::Header {
    /// The daemon's protection of a production container: its [`stamp`] at its last look, 0 =
    /// none. One relaxed load (a production shim's allocation path reads it): the word stands
    /// alone, nothing is published with it.
    #[inline(always)]
    pub fn protect(&self) -> u32 {
        self.protect.load(Relaxed)
    }

    /// The daemon: renews the protection with `stamp`, or ends it with 0 (a word that already
    /// says so is left unwritten).
    pub fn set_protect(&self, stamp: u32) {
        if self.protect.load(Relaxed) != stamp {
            self.protect.store(stamp, Release);
        }
    }
}

impl DeviceState {
    /// Production: `bytes` more its allocation waits to find free.
    pub fn post_want(&self, bytes: u64) {
        self.mem_want.fetch_add(bytes, AcqRel);
    }

    /// Daemon: the bytes the container should hold demoted; a change wakes its shims.
    pub fn set_demote(&self, bytes: u64) {
        if self.demote.load(Acquire) != bytes && self.demote.swap(bytes, AcqRel) != bytes {
            self.gate_seq.fetch_add(1, AcqRel);
            futex_wake(&self.gate_seq);
        }
    }

    /// Opportunistic shim: claims up to `max` bytes to demote (raising `demoted` toward the
    /// target); the caller demotes them, then settles with [`DeviceState::settle_demoted`].
    pub fn claim_demotion(&self, max: u64) -> u64 {
        let mut got = 0;
        let _ = self.demoted.fetch_update(AcqRel, Acquire, |d| {
            got = self.demote.load(Acquire).saturating_sub(d).min(max);
            (got > 0).then_some(d + got)
        });
        got
    }

    /// Opportunistic shim: claims up to `max` of the demoted bytes back, only while the target is
    /// 0 (pressure ended); the caller promotes them, then settles.
    pub fn claim_promotion(&self, max: u64) -> u64 {
        if self.demote.load(Acquire) != 0 {
            return 0;
        }
        let mut got = 0;
        let _ = self.demoted.fetch_update(AcqRel, Acquire, |d| {
            got = d.min(max);
            (got > 0).then_some(d - got)
        });
        got
    }

    /// Corrects `demoted` after a claim of `claimed` bytes of which `done` were moved: a
    /// demotion (`demoting`) that moved more (whole allocations) adds the excess, one that moved
    /// less gives the rest back; a promotion the other way round.
    pub fn settle_demoted(&self, demoting: bool, claimed: u64, done: u64) {
        let (add, sub) = if demoting == (done >= claimed) {
            (done.abs_diff(claimed), 0)
        } else {
            (0, done.abs_diff(claimed))
        };
        if add > 0 {
            self.demoted.fetch_add(add, AcqRel);
        }
        if sub > 0 {
            let _ = self
                .demoted
                .fetch_update(AcqRel, Acquire, |d| Some(d.saturating_sub(sub)));
        }
    }

    /// Demoted memory freed by its job (it is no longer anywhere).
    pub fn forget_demoted(&self, bytes: u64) {
        self.settle_demoted(true, bytes, 0);
    }

    /// Daemon: `demoted` never above what the container holds (a dead process's claim).
    pub fn clamp_demoted(&self) {
        let used = self.used.load(Acquire);
        let _ = self
            .demoted
            .fetch_update(AcqRel, Acquire, |d| (d > used).then_some(used));
    }
}

/// How the daemon splits `want` bytes among containers by what each holds not yet asked for
/// (`room[i]`): in proportion, each at most its room, rounding so the parts sum to
/// `min(want, Σ room)`.
pub fn split(want: u64, room: &[u64]) -> Vec<u64> {
    let total: u64 = room.iter().sum();
    let want = want.min(total);
    if want == 0 {
        return vec![0; room.len()];
    }
    let mut parts: Vec<u64> = room
        .iter()
        .map(|&r| (want as u128 * r as u128 / total as u128) as u64)
        .collect();
    let mut left = want - parts.iter().sum::<u64>();
    for (p, &r) in parts.iter_mut().zip(room) {
        let more = left.min(r - *p);
        *p += more;
        left -= more;
    }
    parts
}

/// `stamp(now_ns())`.
pub fn stamp_now() -> u32 {
    stamp(now_ns())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn zeroed() -> Box<DeviceState> {
        // SAFETY: every field of DeviceState is an atomic or an integer: all zeroes is valid.
        Box::new(unsafe { std::mem::zeroed() })
    }

    #[test]
    fn claims_never_exceed_the_target_and_promotion_waits_for_it_to_end() {
        let d = zeroed();
        d.used.store(100, Release);
        d.set_demote(60);
        assert_eq!(d.claim_demotion(40), 40);
        assert_eq!(d.claim_demotion(40), 20, "only up to the target");
        assert_eq!(d.claim_demotion(40), 0);
        assert_eq!(d.claim_promotion(100), 0, "no promotion under pressure");
        // A whole allocation of 32 moved for the last claim of 20: the excess counts.
        d.settle_demoted(true, 20, 32);
        assert_eq!(d.demoted.load(Acquire), 72);
        d.set_demote(0);
        assert_eq!(d.claim_promotion(50), 50);
        // Only 16 fit back: 34 stay demoted.
        d.settle_demoted(false, 50, 16);
        assert_eq!(d.demoted.load(Acquire), 56);
        d.forget_demoted(100);
        assert_eq!(d.demoted.load(Acquire), 0, "saturating");
    }

    #[test]
    fn a_target_change_wakes_the_shims() {
        let d = zeroed();
        d.set_demote(5);
        d.set_demote(5);
        assert_eq!(d.gate_seq.load(Acquire), 1, "one change, one bump");
    }

    #[test]
    fn clamp_keeps_demoted_within_what_the_container_holds() {
        let d = zeroed();
        d.demoted.store(80, Release);
        d.used.store(30, Release);
        d.clamp_demoted();
        assert_eq!(d.demoted.load(Acquire), 30);
    }

    #[test]
    fn protection_goes_stale_without_the_daemon() {
        let now = 10_000_000_000u64;
        let s = stamp(now);
        assert!(protected(s, now));
        assert!(protected(s, now + 900 * (1 << 20)));
        assert!(!protected(s, now + 1_100 * (1 << 20)));
        assert!(!protected(0, now));
    }

    proptest! {
        #[test]
        fn split_sums_to_what_can_be_demoted(want in 0u64..1 << 40, room in proptest::collection::vec(0u64..1 << 36, 0..6)) {
            let parts = split(want, &room);
            let total: u64 = room.iter().sum();
            prop_assert_eq!(parts.iter().sum::<u64>(), want.min(total));
            for (p, r) in parts.iter().zip(&room) {
                prop_assert!(p <= r);
            }
        }
    }
}
