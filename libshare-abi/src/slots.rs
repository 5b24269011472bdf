//! The lifecycle of per-process slots in a shared state file, used by libshare's container state
//! and by simgpu's machine state: a process claims a free slot; a slot whose process is gone
//! (pid no longer alive, or reused by another process: the start time differs) is reclaimed by
//! whoever notices first; claiming and releasing go through a transient pid so two processes never
//! both release, or release a slot someone just claimed.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};

/// A slot's pid while it is being claimed or released.
pub const RELEASING: u32 = u32::MAX;

/// A table of process slots in shared memory.
pub trait SlotTable {
    fn slot_count(&self) -> usize;
    fn slot_pid(&self, i: usize) -> &AtomicU32;
    fn slot_start_time(&self, i: usize) -> &AtomicU64;
    /// Slot `i` is being claimed (its pid is RELEASING): start it from zero.
    fn reset_slot(&self, i: usize);
    /// Slot `i` is being released (its pid is RELEASING): give back what its process held.
    fn free_slot(&self, i: usize);
}

/// Claims a slot for `pid`, reclaiming the slots of dead processes first.
pub fn claim<T: SlotTable + ?Sized>(t: &T, pid: u32) -> Option<usize> {
    reclaim_dead(t);
    let start = crate::proc_start_time(pid);
    (0..t.slot_count()).find(|&i| {
        if t.slot_pid(i)
            .compare_exchange(0, RELEASING, AcqRel, Acquire)
            .is_err()
        {
            return false;
        }
        t.slot_start_time(i).store(start, Release);
        t.reset_slot(i);
        t.slot_pid(i).store(pid, Release);
        true
    })
}

/// Releases slot `i` if it still belongs to `pid`. Returns whether this call released it.
pub fn release<T: SlotTable + ?Sized>(t: &T, i: usize, pid: u32) -> bool {
    if t.slot_pid(i)
        .compare_exchange(pid, RELEASING, AcqRel, Acquire)
        .is_err()
    {
        return false;
    }
    t.free_slot(i);
    t.slot_pid(i).store(0, Release);
    true
}

/// Releases every slot whose process is gone. Returns how many.
pub fn reclaim_dead<T: SlotTable + ?Sized>(t: &T) -> usize {
    (0..t.slot_count())
        .filter(|&i| {
            let pid = t.slot_pid(i).load(Acquire);
            pid != 0
                && pid != RELEASING
                && !crate::proc_alive(pid, t.slot_start_time(i).load(Acquire))
                && release(t, i, pid)
        })
        .count()
}

/// (slot, pid) of every live process.
pub fn live<T: SlotTable + ?Sized>(t: &T) -> Vec<(usize, u32)> {
    (0..t.slot_count())
        .filter_map(|i| {
            let pid = t.slot_pid(i).load(Acquire);
            (pid != 0
                && pid != RELEASING
                && crate::proc_alive(pid, t.slot_start_time(i).load(Acquire)))
            .then_some((i, pid))
        })
        .collect()
}
