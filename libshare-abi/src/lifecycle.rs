//! The slot lifecycle under the lifecycle lock: claim, release, reclaim of dead processes' slots
//! and repair of `used` (see the crate doc).

use crate::*;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};

/// The lifecycle lock (see the module doc), released on drop. `held` is false when another
/// process kept it longer than [`LIFECYCLE_WAIT`] (stopped or frozen while holding it): callers
/// then skip what needs it (clearing slots, repairing `used`) rather than hang.
pub(crate) struct Lifecycle {
    pub(crate) fd: Option<libc::c_int>,
    pub(crate) held: bool,
    pub(crate) _p: lock::ProcessLock,
}

/// How long a lifecycle operation waits for another process's (held for microseconds).
pub(crate) const LIFECYCLE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

impl Drop for Lifecycle {
    fn drop(&mut self) {
        if let Some(fd) = self.fd {
            lock::unlock_byte(fd, LIFECYCLE_LOCK);
        }
    }
}

impl State {
    pub(crate) fn rw_fd(&self) -> Option<libc::c_int> {
        match self.mode {
            Mode::Shared => self.file.as_ref().map(|f| f.fd()),
            _ => None,
        }
    }

    pub(crate) fn lifecycle(&self) -> Lifecycle {
        let p = lock::ProcessLock::take();
        let (fd, held) = match self.rw_fd() {
            None => (None, true), // anonymous: the process lock is enough
            Some(fd) => match lock::lock_byte_within(fd, LIFECYCLE_LOCK, LIFECYCLE_WAIT) {
                Ok(true) => (Some(fd), true),
                _ => (None, false),
            },
        };
        Lifecycle { fd, held, _p: p }
    }

    /// Whether process slot `i` is owned by a live process: this process (a slot it claimed) or
    /// another one holding the slot's lock.
    pub fn slot_owned(&self, i: usize) -> bool {
        let pid = self.slot(i).pid.load(Acquire);
        if pid == 0 {
            return false;
        }
        if lock::own_has(self.key, i) {
            return true;
        }
        match &self.file {
            Some(f) => lock::locked_by_other(f.fd(), SLOT_LOCK_BASE + i as u64),
            None => false,
        }
    }

    /// Clears slot `i`'s memory (under the lifecycle lock, its lock held or its owner gone).
    /// Its launch and allocation counters stay until the slot is claimed again (totals of
    /// processes that exited).
    pub(crate) fn clear_slot(&self, i: usize) {
        let s = self.slot(i);
        s.pid.store(slots::RELEASING, Release);
        for d in 0..MAX_DEVICES {
            s.charged[d].store(0, Release);
            s.uncharged[d].store(0, Release);
            s.managed[d].store(0, Release);
            // What its process still had in flight (a `kill -9`, or an exit with launches
            // pending) leaves the container's sum, so no other process waits for it.
            rate::release_in_flight(self.device(d), &s.in_flight[d]);
        }
        s.compute_limit.store(0, Release);
        s.start_time.store(0, Release);
        s.pid.store(0, Release);
    }

    /// No slot has a pid and every device's `used` is 0 (what a repair would leave).
    pub(crate) fn nothing_held(&self) -> bool {
        (0..self.slots_in_use()).all(|i| self.slot(i).pid.load(Acquire) == 0)
            && (0..MAX_DEVICES).all(|d| self.device(d).used.load(Acquire) == 0)
    }

    pub(crate) fn reclaim_locked(&self) -> usize {
        let mut n = 0;
        for i in 0..self.slots_in_use() {
            if self.slot(i).pid.load(Acquire) == 0 || lock::own_has(self.key, i) {
                continue;
            }
            let free = match self.rw_fd() {
                Some(fd) => lock::try_lock_byte(fd, SLOT_LOCK_BASE + i as u64).unwrap_or(false),
                None => true, // anonymous: no other process can own a slot
            };
            // A dying process (`kill -9`) drops its lock when its descriptors close, which may
            // be before the driver has freed its device memory (that descriptor may close
            // later in the same exit): its slot is left for a later reclaim until it is a
            // zombie or gone, so the container never allocates over memory still held.
            let slot = self.slot(i);
            let dying = free && proc_exiting(slot.pid.load(Acquire), slot.start_time.load(Acquire));
            if dying {
                if let Some(fd) = self.rw_fd() {
                    lock::unlock_byte(fd, SLOT_LOCK_BASE + i as u64);
                }
                continue;
            }
            if free {
                self.clear_slot(i);
                if let Some(fd) = self.rw_fd() {
                    lock::unlock_byte(fd, SLOT_LOCK_BASE + i as u64);
                }
                n += 1;
            }
        }
        if !self.lost() {
            self.remember_config();
        }
        self.recompute_locked();
        n
    }

    /// Sets each device's `used` from the claimed slots (see the module doc for why it is never
    /// below what they hold and converges to it). Takes the lifecycle lock.
    pub fn recompute_used(&self) {
        if !matches!(self.mode, Mode::Shared | Mode::Anonymous) {
            return;
        }
        let g = self.lifecycle();
        if g.held {
            self.recompute_locked();
        }
    }

    pub(crate) fn recompute_locked(&self) {
        let claimed: Vec<usize> = (0..self.slots_in_use())
            .filter(|&i| self.slot(i).pid.load(Acquire) != 0)
            .collect();
        // 1. uncharged, then used, then charged.
        let down: Vec<[u64; MAX_DEVICES]> = claimed
            .iter()
            .map(|&i| std::array::from_fn(|d| self.slot(i).uncharged[d].load(Acquire)))
            .collect();
        let u: Vec<u64> = (0..MAX_DEVICES)
            .map(|d| self.device(d).used.load(Acquire))
            .collect();
        let mut bound = [0u64; MAX_DEVICES];
        for (k, &i) in claimed.iter().enumerate() {
            let s = self.slot(i);
            for d in 0..MAX_DEVICES {
                let up = s.charged[d].load(Acquire);
                bound[d] = bound[d].saturating_add(up.saturating_sub(down[k][d]));
            }
        }
        // A slot claimed meanwhile (only possible by a process that gave up waiting for the
        // lifecycle lock, see `lifecycle`) may have charged before `u` was read: its bytes are
        // in `u` but not in the bound. Leave the repair to the next call then.
        let now: Vec<usize> = (0..self.slots_in_use())
            .filter(|&i| self.slot(i).pid.load(Acquire) != 0)
            .collect();
        if claimed.iter().any(|i| now.binary_search(i).is_err())
            || now.iter().any(|i| claimed.binary_search(i).is_err())
        {
            return;
        }
        // 2. used += bound − u.
        for d in 0..MAX_DEVICES {
            let used = &self.device(d).used;
            if bound[d] > u[d] {
                used.fetch_add(bound[d] - u[d], AcqRel);
            } else if bound[d] < u[d] {
                let cut = u[d] - bound[d];
                let _ = used.fetch_update(AcqRel, Acquire, |x| Some(x.saturating_sub(cut)));
            }
        }
    }
}

impl slots::SlotTable for State {
    /// [`Header::slots_hwm`], a garbage value clamped to [`MAX_PROCS`].
    fn slots_in_use(&self) -> usize {
        (self.header().slots_hwm.load(Acquire) as usize).min(MAX_PROCS)
    }
    fn mark_in_use(&self, i: usize) {
        self.header().slots_hwm.fetch_max(i as u32 + 1, AcqRel);
    }
    fn slot_count(&self) -> usize {
        MAX_PROCS
    }
    fn slot_pid(&self, i: usize) -> &AtomicU32 {
        &self.slot(i).pid
    }
    fn slot_start_time(&self, i: usize) -> &AtomicU64 {
        &self.slot(i).start_time
    }
    fn reset_slot(&self, i: usize) {
        let s = self.slot(i);
        s.compute_limit.store(0, Release);
        for d in 0..MAX_DEVICES {
            s.charged[d].store(0, Release);
            s.uncharged[d].store(0, Release);
            s.launches[d].store(0, Release);
            s.allocs[d].store(0, Release);
            s.in_flight[d].store(0, Release);
            s.managed[d].store(0, Release);
        }
    }
    fn free_slot(&self, i: usize) {
        self.reset_slot(i);
    }

    /// Owned by this process or locked by another (the pid is not trusted).
    fn slot_alive(&self, i: usize) -> bool {
        self.slot_owned(i)
    }

    /// Claims a free slot for `pid` (this process), taking its lock, after reclaiming the slots
    /// nobody holds. None: every slot is taken, or this is a view.
    fn claim_slot(&self, pid: u32) -> Option<usize> {
        if !matches!(self.mode, Mode::Shared | Mode::Anonymous) {
            return None;
        }
        if self.lost() {
            self.recover();
        }
        let g = self.lifecycle();
        if g.held {
            self.reclaim_locked();
        }
        let start = proc_start_time(pid);
        for i in 0..MAX_PROCS {
            let s = self.slot(i);
            if s.pid.load(Acquire) != 0 || lock::own_has(self.key, i) {
                continue;
            }
            let fd = self.rw_fd();
            if let Some(fd) = fd {
                if !lock::try_lock_byte(fd, SLOT_LOCK_BASE + i as u64).unwrap_or(false) {
                    continue; // held by a process whose slot lost its pid (after a loss)
                }
            }
            if !lock::own_add(self.key, i) {
                if let Some(fd) = fd {
                    lock::unlock_byte(fd, SLOT_LOCK_BASE + i as u64);
                }
                return None;
            }
            s.pid.store(slots::RELEASING, Release);
            self.reset_slot(i);
            for d in 0..MAX_DEVICES {
                if let Some(m) = self.mirror(i, d) {
                    m.store(0, Release);
                }
                if let Some(m) = self.managed_mirror.get(i * MAX_DEVICES + d) {
                    m.store(0, Release);
                }
            }
            if let Some(l) = self.limit_mirror.get(i) {
                l.store(0, Release);
            }
            s.start_time.store(start, Release);
            self.mark_in_use(i);
            s.pid.store(pid, Release);
            self.mine[i].store(true, Release);
            self.remember_config();
            return Some(i);
        }
        None
    }

    /// Releases slot `i`: this process's own (at exit), or another process's that is gone.
    /// Its charges leave the container's `used` (by a repair, not a subtraction).
    fn release_slot(&self, i: usize, pid: u32) -> bool {
        if !matches!(self.mode, Mode::Shared | Mode::Anonymous) {
            return false;
        }
        let g = self.lifecycle();
        if self.slot(i).pid.load(Acquire) != pid {
            return false;
        }
        let fd = self.rw_fd();
        if lock::own_has(self.key, i) {
            self.clear_slot(i);
            if g.held {
                self.recompute_locked();
            }
            if let Some(m) = self.mine.get(i) {
                m.store(false, Release);
            }
            lock::own_remove(self.key, i);
            if let Some(fd) = fd {
                lock::unlock_byte(fd, SLOT_LOCK_BASE + i as u64);
            }
            return true;
        }
        let free = g.held
            && match fd {
                Some(fd) => lock::try_lock_byte(fd, SLOT_LOCK_BASE + i as u64).unwrap_or(false),
                None => true,
            };
        if free {
            self.clear_slot(i);
            self.recompute_locked();
            if let Some(fd) = fd {
                lock::unlock_byte(fd, SLOT_LOCK_BASE + i as u64);
            }
        }
        free
    }

    /// Clears every slot nobody holds (dead, exec'd, or garbage) and repairs `used`. Returns
    /// how many. A view reclaims nothing.
    fn reclaim_dead(&self) -> usize {
        if !matches!(self.mode, Mode::Shared | Mode::Anonymous) {
            return 0;
        }
        if self.lost() {
            self.recover();
        } else if self.nothing_held() {
            // No slot claimed and nothing in use: nothing to reclaim or repair, so no lock to
            // take (the daemon's rescan looks at every container every 100 ms, most idle). A
            // process claiming meanwhile is seen at the next call.
            self.remember_config();
            return 0;
        }
        let g = self.lifecycle();
        if !g.held {
            return 0;
        }
        self.reclaim_locked()
    }

    fn live_slots(&self) -> Vec<(usize, u32)> {
        (0..self.slots_in_use())
            .filter_map(|i| {
                let pid = self.slot(i).pid.load(Acquire);
                (pid != 0 && pid != slots::RELEASING && self.slot_owned(i)).then_some((i, pid))
            })
            .collect()
    }
}
