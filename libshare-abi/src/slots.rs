//! The lifecycle of per-process slots in a shared state file, used by libshare's container state
//! and by simgpu's machine state: a process claims a free slot; a slot whose process is gone is
//! reclaimed by whoever notices first; claiming and releasing go through a transient pid so two
//! processes never both release, or release a slot someone just claimed.
//!
//! Whether a slot's process is alive is [`SlotTable::slot_alive`]: by default its pid is alive
//! with the same start time (a reused pid is not the same process), which is what simgpu's
//! machine state uses. libshare's container state overrides the lifecycle to use a lock the
//! slot's process holds (see the crate doc), which also drops at `exec`.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};

/// A slot's pid while it is being claimed or released.
pub const RELEASING: u32 = u32::MAX;

/// A table of process slots in shared memory. Implementors say where a slot's pid and start
/// time live and how to reset and free it; the lifecycle is provided.
///
/// Scans over the slots (reclaim, listing) stop at [`SlotTable::slots_in_use`], a high-water
/// mark a claim raises ([`SlotTable::mark_in_use`]) before it publishes its pid and that is
/// never lowered while the table lives: a table of 1024 slots that a handful of processes use
/// costs a handful of slots per scan. Implementors keep the mark in their shared memory; the
/// defaults (no mark: every slot) suit a table without one.
pub trait SlotTable {
    fn slot_count(&self) -> usize;
    fn slot_pid(&self, i: usize) -> &AtomicU32;
    fn slot_start_time(&self, i: usize) -> &AtomicU64;
    /// Slot `i` is being claimed (its pid is RELEASING): start it from zero.
    fn reset_slot(&self, i: usize);
    /// Slot `i` is being released (its pid is RELEASING): give back what its process held.
    fn free_slot(&self, i: usize);

    /// Slots `0..slots_in_use()` include every slot ever claimed (at most [`slot_count`]).
    ///
    /// [`slot_count`]: SlotTable::slot_count
    fn slots_in_use(&self) -> usize {
        self.slot_count()
    }

    /// Slot `i` is being claimed: raise the mark so scans reach it (before its pid is
    /// published).
    fn mark_in_use(&self, i: usize) {
        let _ = i;
    }

    /// Whether slot `i`'s process is alive: by default, its pid exists, is not a zombie and has
    /// the start time it registered with.
    fn slot_alive(&self, i: usize) -> bool {
        crate::proc_alive(
            self.slot_pid(i).load(Acquire),
            self.slot_start_time(i).load(Acquire),
        )
    }

    /// Claims a slot for `pid`, reclaiming the slots of dead processes first.
    fn claim_slot(&self, pid: u32) -> Option<usize> {
        self.reclaim_dead();
        let start = crate::proc_start_time(pid);
        (0..self.slot_count()).find(|&i| {
            if self
                .slot_pid(i)
                .compare_exchange(0, RELEASING, AcqRel, Acquire)
                .is_err()
            {
                return false;
            }
            self.slot_start_time(i).store(start, Release);
            self.reset_slot(i);
            self.mark_in_use(i);
            self.slot_pid(i).store(pid, Release);
            true
        })
    }

    /// Releases slot `i` if it still belongs to `pid`. Returns whether this call released it.
    fn release_slot(&self, i: usize, pid: u32) -> bool {
        if self
            .slot_pid(i)
            .compare_exchange(pid, RELEASING, AcqRel, Acquire)
            .is_err()
        {
            return false;
        }
        self.free_slot(i);
        self.slot_pid(i).store(0, Release);
        true
    }

    /// Releases every slot whose process is gone. Returns how many.
    fn reclaim_dead(&self) -> usize {
        (0..self.slots_in_use())
            .filter(|&i| {
                let pid = self.slot_pid(i).load(Acquire);
                pid != 0 && pid != RELEASING && !self.slot_alive(i) && self.release_slot(i, pid)
            })
            .count()
    }

    /// (slot, pid) of every live process.
    fn live_slots(&self) -> Vec<(usize, u32)> {
        (0..self.slots_in_use())
            .filter_map(|i| {
                let pid = self.slot_pid(i).load(Acquire);
                (pid != 0 && pid != RELEASING && self.slot_alive(i)).then_some((i, pid))
            })
            .collect()
    }
}
