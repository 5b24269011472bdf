//! The bound on what opportunistic containers hold that cannot be demoted (issue 30, B6c),
//! defined once.
//!
//! Production containers are guaranteed their quota on a device. Opportunistic containers' managed
//! memory can be demoted to the host when production needs the device (`demote.rs`), but
//! everything else they hold is device memory the demotion protocol cannot move: VMM
//! (`cuMemCreate`, PyTorch's `expandable_segments`), stream-ordered pools, CUDA arrays, graph
//! memory, memory exported over IPC, the 32-bit entry points, and plain `cuMemAlloc` of a
//! container that does not oversubscribe. The daemon bounds it, per device, so that together it
//! never exceeds what production leaves.
//!
//! # What is counted
//!
//! A process's slot already records what it holds on each device (its net, see the crate doc);
//! [`ProcSlot::managed`] records the part that is managed memory. A container's *pinned*
//! memory on a device ([`State::pinned`]) is Σ over its claimed slots (dead ones included until
//! reclaimed) of net − managed. Ordering keeps it from ever reading low: a process raises
//! `managed` only after its net was charged and lowers it before its net is uncharged, and
//! raises it only under the container's **pin lock** (a POSIX lock on byte [`PIN_LOCK`] of the
//! state file, plus a lock between the process's threads) while the container is bounded; the
//! pinned figure is read under that lock, each slot's net before its managed part. A charge of
//! non-managed memory anywhere, or a free of anything (managed part first), can only make a
//! reading high (a charge is made before the driver allocates, a free
//! is returned after the driver freed).
//!
//! # The protocol
//!
//! - The daemon sets [`FLAG_PIN_BOUND`] in the containers it registers when it knows the
//!   devices' memory (NVML), and, under each opportunistic container's pin lock, writes
//!   [`DeviceState::pin_cap`]: what that container may hold pinned on the device. Its split
//!   (`libshare-node/src/pins.rs`) keeps Σ over opportunistic containers of max(cap, pinned) at
//!   or under what production leaves (the device's memory less a margin, less every production
//!   container's quota or, without one, what it holds).
//! - An opportunistic shim of a bounded container ([`State::pin_bounded`]): after charging a
//!   non-managed allocation to its quota, takes the pin lock and reads [`State::pinned`], which
//!   now includes the new charge; above `pin_cap`, it returns the charge under the lock (so the
//!   next reader never sees it) and the allocation is refused — after, once per allocation,
//!   posting a want ([`Header::pin_want`]) and waiting at most [`WANT_WAIT_NS`] for the daemon
//!   to look again ([`DeviceState::pin_gen`]). A new container's caps are 0 until the daemon
//!   first looks at it, so its first allocation waits for that look.
//! - Two processes of the container charging at once: each is checked under the lock against a
//!   figure that holds both; the first to check either fits with both or gives its charge back
//!   before the second checks. Two containers: each stays within its own cap, and the caps do not
//!   add up to more than production leaves.
//!
//! # Faults
//!
//! - A process killed while holding the pin lock: the kernel drops the lock; its slot holds
//!   what it charged until reclaimed (counted as pinned meanwhile: never low).
//! - A process stopped while holding it (microseconds of work): the container's other
//!   allocations that need it wait at most `LIFECYCLE_WAIT` and are refused; the daemon skips
//!   the container (it keeps its cap) and counts it with what it may hold.
//! - The daemon gone: caps stay as they were; a want waits the bound and is refused if its cap
//!   does not fit it. Without a daemon nothing is bounded (the flag is never set): an
//!   opportunistic job may take the whole device, as it could before.
//! - A job that writes its own state (it maps it read-write) can clear the flag or its pinned
//!   figures, as it can lift its own quota: like a job that bypasses the preload, that takes
//!   NVIDIA's driver-side limits to stop. The daemon re-sets the flag at every rescan.

use crate::lock::{self, WordLock};
use crate::slots::SlotTable;
use crate::*;
use std::sync::atomic::Ordering::*;

/// The longest an allocation waits for the daemon to look at its want.
pub const WANT_WAIT_NS: u64 = 250_000_000;

/// The pin lock of one container, held: released on drop.
pub struct PinGuard<'a> {
    fd: Option<libc::c_int>,
    _w: WordLock<'a>,
}

impl Drop for PinGuard<'_> {
    fn drop(&mut self) {
        if let Some(fd) = self.fd {
            lock::unlock_byte(fd, PIN_LOCK);
        }
    }
}

impl State {
    /// Whether this container's pinned memory is bounded now: opportunistic and
    /// [`FLAG_PIN_BOUND`] (two relaxed loads).
    #[inline]
    pub fn pin_bounded(&self) -> bool {
        let h = self.header();
        h.class() == Class::Opportunistic && h.flags.load(Relaxed) & FLAG_PIN_BOUND != 0
    }

    /// Takes the pin lock, waiting at most `LIFECYCLE_WAIT` for another process (a stopped
    /// holder must not hang the container). None: not taken.
    pub fn pin_lock(&self) -> Option<PinGuard<'_>> {
        self.pin_lock_within(crate::lifecycle::LIFECYCLE_WAIT)
    }

    /// Takes the pin lock if no other process holds it (the daemon: it never waits for a
    /// container). None: held.
    pub fn try_pin_lock(&self) -> Option<PinGuard<'_>> {
        self.pin_lock_within(std::time::Duration::ZERO)
    }

    fn pin_lock_within(&self, limit: std::time::Duration) -> Option<PinGuard<'_>> {
        let w = WordLock::take(&self.pin_holder);
        let fd = match self.mode {
            Mode::Shared => self.file.as_ref().map(|f| f.fd()),
            Mode::Anonymous => None,
            Mode::View | Mode::Snapshot => return None,
        };
        if let Some(fd) = fd {
            if !lock::lock_byte_within(fd, PIN_LOCK, limit).unwrap_or(false) {
                return None;
            }
        }
        Some(PinGuard { fd, _w: w })
    }

    /// What the container holds on `dev` that cannot be demoted: Σ over claimed slots of net −
    /// managed (see the module doc; read it under the pin lock for a figure that is never low).
    pub fn pinned(&self, dev: usize) -> u64 {
        (0..self.slots_in_use()).fold(0u64, |sum, i| {
            let s = self.slot(i);
            if s.pid.load(Acquire) == 0 {
                return sum;
            }
            let net = s.net(dev);
            sum.saturating_add(net.saturating_sub(s.managed[dev].load(Acquire)))
        })
    }

    /// The container's managed memory, every process and device (its footprint that may be
    /// demoted to the host).
    pub fn managed_footprint(&self) -> u64 {
        (0..self.slots_in_use()).fold(0u64, |sum, i| {
            let s = self.slot(i);
            if s.pid.load(Acquire) == 0 {
                return sum;
            }
            (0..MAX_DEVICES).fold(sum, |a, d| a.saturating_add(s.managed[d].load(Acquire)))
        })
    }

    /// Records that `bytes` of what slot `slot` holds on `dev` (already charged) are managed.
    pub fn add_managed(&self, slot: usize, dev: usize, bytes: u64) {
        if let Some(m) = self.managed_mirror.get(slot * MAX_DEVICES + dev) {
            m.fetch_add(bytes, AcqRel);
        }
        self.slot(slot).managed[dev].fetch_add(bytes, AcqRel);
    }

    /// Before `bytes` of managed memory slot `slot` holds on `dev` are uncharged.
    pub fn sub_managed(&self, slot: usize, dev: usize, bytes: u64) {
        let sub = |w: &std::sync::atomic::AtomicU64| {
            let _ = w.fetch_update(AcqRel, Acquire, |m| Some(m.saturating_sub(bytes)));
        };
        sub(&self.slot(slot).managed[dev]);
        if let Some(m) = self.managed_mirror.get(slot * MAX_DEVICES + dev) {
            sub(m);
        }
    }

    /// Opportunistic shim: tells the daemon an allocation on `dev` needs `need` bytes of
    /// pinned memory beyond the container's cap there.
    pub fn post_pin_want(&self, dev: usize, need: u64) {
        self.device(dev).pin_need.fetch_max(need, AcqRel);
        self.header().pin_want.fetch_or(1 << dev, AcqRel);
    }

    /// Daemon: the devices with a want since the last call (a bit each), and clears them.
    pub fn take_pin_wants(&self) -> u32 {
        let h = &self.header().pin_want;
        if h.load(Relaxed) == 0 {
            return 0;
        }
        h.swap(0, AcqRel)
    }
}

impl DeviceState {
    /// Daemon, under the container's pin lock: the container's cap on this device; `answered`
    /// (a want was looked at) wakes the shims waiting on [`DeviceState::pin_gen`].
    pub fn set_pin_cap(&self, bytes: u64, answered: bool) {
        if self.pin_cap.load(Acquire) != bytes {
            self.pin_cap.store(bytes, Release);
        }
        if answered {
            self.pin_gen.fetch_add(1, AcqRel);
            crate::rate::futex_wake(&self.pin_gen);
        }
    }

    /// Daemon: the need posted with a want (see [`State::post_pin_want`]), taken.
    pub fn take_pin_need(&self) -> u64 {
        self.pin_need.swap(0, AcqRel)
    }
}
