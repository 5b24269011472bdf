//! Charging: quotas, `charge`/`uncharge` against a container's quota (the proof is in the crate
//! doc), and recovery of a lost or replaced file.

use crate::*;
use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::*};

impl State {
    pub(crate) fn mirror(&self, slot: usize, dev: usize) -> Option<&AtomicU64> {
        self.mirror.get(slot * MAX_DEVICES + dev)
    }

    /// Publishes the compute limit of the process owning slot `i` (basis points, 0 = none; see
    /// [`ProcSlot::compute_limit`]), remembered to be restored after a loss.
    pub fn set_compute_limit(&self, i: usize, bp: u32) {
        if let Some(m) = self.limit_mirror.get(i) {
            m.store(bp, Release);
        }
        self.slot(i).compute_limit.store(bp, Release);
    }

    /// The container's compute limit from its processes' environments: the smallest nonzero
    /// [`ProcSlot::compute_limit`] over the claimed slots (up to [`SlotTable::slots_in_use`]), 0
    /// if none. A slot counts while it shows a pid: a dead process's until it is reclaimed.
    /// Loads only (a few per process of the container).
    pub fn compute_limit(&self) -> u32 {
        min_limit((0..self.slots_in_use()).map(|i| {
            let s = self.slot(i);
            match s.pid.load(Acquire) {
                0 | slots::RELEASING => 0,
                _ => s.compute_limit.load(Acquire),
            }
        }))
    }

    /// Whether the container's jobs allocate managed memory instead of device memory: it is
    /// opportunistic and allowed to oversubscribe (two relaxed loads).
    pub fn oversubscribes(&self) -> bool {
        let h = self.header();
        h.class() == Class::Opportunistic && h.flags.load(Relaxed) & FLAG_OVERSUBSCRIBE != 0
    }

    /// Sets the quota on `dev` (0 = none), remembered to be restored after a loss.
    pub fn set_quota(&self, dev: usize, bytes: u64) {
        self.quota_seen[dev].store(bytes, Release);
        self.device(dev).quota.store(bytes, Release);
    }

    /// Charges `bytes` on `dev` to process slot `slot` and, within the quota (0 = unlimited),
    /// to the container. Slot first, container second (see the module doc). False: over quota,
    /// nothing charged.
    pub fn charge(&self, slot: usize, dev: usize, bytes: u64) -> bool {
        let s = self.slot(slot);
        let d = self.device(dev);
        let m = self.mirror(slot, dev);
        if let Some(m) = m {
            m.fetch_add(bytes, AcqRel);
        }
        s.charged[dev].fetch_add(bytes, AcqRel);
        let quota = d.quota.load(Acquire);
        let r = d.used.fetch_update(AcqRel, Acquire, |u| {
            let n = u.checked_add(bytes)?;
            (quota == 0 || n <= quota).then_some(n)
        });
        let ok = match r {
            Ok(prev) => {
                d.peak.fetch_max(prev + bytes, AcqRel);
                true
            }
            Err(_) => {
                s.uncharged[dev].fetch_add(bytes, AcqRel);
                if let Some(m) = m {
                    m.fetch_sub(bytes, AcqRel);
                }
                false
            }
        };
        if self.lost() {
            self.recover();
            let (q, u) = (d.quota.load(Acquire), d.used.load(Acquire));
            if ok && q > 0 && u > q {
                // Decided while the quota was lost: refused after all.
                self.uncharge(slot, dev, bytes);
                return false;
            }
        }
        ok
    }

    /// As [`State::charge`] whatever the quota: memory the driver already holds (e.g. blocks a
    /// pool reserved beyond what was charged), so the figures stay true.
    pub fn charge_held(&self, slot: usize, dev: usize, bytes: u64) {
        let s = self.slot(slot);
        let d = self.device(dev);
        if let Some(m) = self.mirror(slot, dev) {
            m.fetch_add(bytes, AcqRel);
        }
        s.charged[dev].fetch_add(bytes, AcqRel);
        let now = d.used.fetch_add(bytes, AcqRel).saturating_add(bytes);
        d.peak.fetch_max(now, AcqRel);
        if self.lost() {
            self.recover();
        }
    }

    /// Returns `bytes` charged on `dev` by slot `slot`: container first, slot second.
    pub fn uncharge(&self, slot: usize, dev: usize, bytes: u64) {
        let s = self.slot(slot);
        let d = self.device(dev);
        let _ = d
            .used
            .fetch_update(AcqRel, Acquire, |u| Some(u.saturating_sub(bytes)));
        s.uncharged[dev].fetch_add(bytes, AcqRel);
        if let Some(m) = self.mirror(slot, dev) {
            let _ = m.fetch_update(AcqRel, Acquire, |u| Some(u.saturating_sub(bytes)));
        }
        if self.lost() {
            self.recover();
        }
    }

    /// Whether the content changed under this State (truncated, re-created): see
    /// [`State::recover`]. One load.
    #[inline]
    pub fn lost(&self) -> bool {
        self.mode == Mode::Shared && self.trailer().epoch.load(Relaxed) != self.epoch.load(Relaxed)
    }

    /// Repairs after a loss of the file's content (see the module doc): rewrites the header if
    /// lost, restores the quotas, class and flags this State last saw where they read 0,
    /// re-publishes this State's slots from its process-local copy, and repairs `used`.
    /// Returns whether anything was to repair.
    pub fn recover(&self) -> bool {
        if self.mode != Mode::Shared {
            return false;
        }
        let g = self.lifecycle();
        if !g.held {
            return false; // tried again at the next charge
        }
        let h = self.header();
        let mine = self.epoch.load(Acquire);
        let (head, tail) = (h.epoch.load(Acquire), self.trailer().epoch.load(Acquire));
        if tail == mine && head == mine {
            return false; // another thread of this process repaired it
        }
        let wiped = !self.layout_ok();
        if wiped {
            self.write_layout();
            h.class.store(self.class_seen.load(Acquire), Release);
            h.flags.store(self.flags_seen.load(Acquire), Release);
        }
        for d in 0..MAX_DEVICES {
            let seen = self.quota_seen[d].load(Acquire);
            if seen != 0 {
                let _ = self
                    .device(d)
                    .quota
                    .compare_exchange(0, seen, AcqRel, Acquire);
            }
        }
        let pid = lock::getpid();
        for (i, mine) in self.mine.iter().enumerate() {
            if !mine.load(Acquire) {
                continue;
            }
            let s = self.slot(i);
            for d in 0..MAX_DEVICES {
                let m = self.mirror(i, d).map_or(0, |m| m.load(Acquire));
                s.uncharged[d].store(0, Release);
                s.charged[d].store(m, Release);
                let mm = self.managed_mirror.get(i * MAX_DEVICES + d);
                s.managed[d].store(mm.map_or(0, |m| m.load(Acquire)), Release);
            }
            if let Some(l) = self.limit_mirror.get(i) {
                s.compute_limit.store(l.load(Acquire), Release);
            }
            // The mark may have been lost with the rest of the header.
            self.mark_in_use(i);
            if s.pid.load(Acquire) == 0 {
                s.start_time.store(proc_start_time(pid), Release);
                s.pid.store(pid, Release);
            }
        }
        if wiped {
            h.magic.store(MAGIC, Release);
        }
        if head != 0 && head != mine && head == tail {
            self.epoch.store(head, Release); // another process repaired: adopt its epoch
        } else {
            self.publish_epoch(new_epoch()); // the first to see this loss
        }
        self.recompute_locked();
        true
    }

    /// Whether `state.shm` at this State's path is still this State's file. If the name was
    /// removed but the second name (`.state.shm.keep`) is still this file, the name is linked
    /// back first. Err: the file was removed or replaced (see the module doc). Cold: a few
    /// system calls, never closes the State's descriptor.
    /// A new descriptor of this State's file (for the daemon to pass to a registering process).
    pub fn dup_file(&self) -> Option<File> {
        self.file.as_ref().and_then(|f| f.file.try_clone().ok())
    }

    pub fn check_path(&self) -> Result<(), StateError> {
        if self.mode != Mode::Shared
            || self.path.as_os_str().is_empty()
            || self.path == Path::new(DESCRIPTOR_PATH)
        {
            return Ok(());
        }
        let same = |p: &Path| {
            use std::os::unix::fs::MetadataExt;
            std::fs::symlink_metadata(p)
                .is_ok_and(|m| (m.dev(), m.ino()) == self.key && m.file_type().is_file())
        };
        if same(&self.path) {
            return Ok(());
        }
        if let Some(dir) = self.path.parent() {
            if same(&dir.join(KEEP_FILE)) && !self.path.exists() {
                if let Ok(dirfd) = fsafe::open_dir(dir, false) {
                    Self::relink_if_removed(&dirfd);
                }
                if same(&self.path) {
                    return Ok(());
                }
            }
        }
        Err(StateError::Replaced {
            path: self.path.clone(),
        })
    }
}
