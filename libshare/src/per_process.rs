//! Per-process tables and the fork generation. A forked child must not inherit the parent's
//! tables (its allocations, pools, events are the parent's) nor a lock another thread held at
//! fork time. The fork handler only bumps [`GENERATION`]; every [`PerProcess`] value remembers
//! the generation it was made in and is replaced, lazily, by a fresh one in a new generation
//! (the parent's copy leaks in the child: small, once per fork). The fork handler names no
//! module.

use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering::*};
use std::sync::{Mutex, MutexGuard};

/// Bumped in a forked child (`process.rs`'s atfork handler).
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// In a forked child: every per-process value is renewed on its next use. No allocation, no
/// lock (allowed in the child of a multithreaded process).
pub fn new_generation() {
    GENERATION.fetch_add(1, AcqRel);
}

struct Slot<T> {
    generation: u64,
    value: T,
}

/// A per-process value, made on first use and renewed after a fork.
pub struct PerProcess<T: Default + 'static>(AtomicPtr<Slot<T>>);

impl<T: Default + 'static> Default for PerProcess<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Default + 'static> PerProcess<T> {
    pub const fn new() -> Self {
        PerProcess(AtomicPtr::new(std::ptr::null_mut()))
    }

    /// This process's value. One atomic load and a compare on the fast path.
    #[inline]
    pub fn get(&self) -> &'static T {
        let generation = GENERATION.load(Acquire);
        let p = self.0.load(Acquire);
        // SAFETY: only pointers from `Box::into_raw` (below) are stored, never freed.
        if let Some(s) = unsafe { p.as_ref() } {
            if s.generation == generation {
                return &s.value;
            }
        }
        self.renew(p, generation)
    }

    #[cold]
    fn renew(&self, old: *mut Slot<T>, generation: u64) -> &'static T {
        let fresh = Box::into_raw(Box::new(Slot {
            generation,
            value: T::default(),
        }));
        match self.0.compare_exchange(old, fresh, AcqRel, Acquire) {
            // SAFETY: ours, from `Box::into_raw`, published and never freed from now on.
            Ok(_) => unsafe { &(*fresh).value },
            Err(other) => {
                // Another thread renewed it first: use theirs (ours is dropped unpublished).
                // SAFETY: `fresh` was never published; we own it.
                drop(unsafe { Box::from_raw(fresh) });
                // SAFETY: a pointer from `Box::into_raw`, never freed.
                unsafe { &(*other).value }
            }
        }
    }
}

impl<T: Default + 'static> PerProcess<Mutex<T>> {
    /// Locks, ignoring poisoning (a panic in a hook never leaves the data inconsistent: every
    /// critical section is a few plain collection operations).
    pub fn lock(&self) -> MutexGuard<'static, T> {
        self.get().lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_generation_renews_every_value() {
        static V: PerProcess<Mutex<Vec<u32>>> = PerProcess::new();
        V.lock().push(1);
        assert_eq!(*V.lock(), [1]);
        new_generation();
        assert!(V.lock().is_empty(), "a forked child starts empty");
        V.lock().push(2);
        assert_eq!(*V.lock(), [2]);
    }
}
