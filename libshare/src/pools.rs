//! Stream-ordered allocations are charged by what their memory pool reserves, not allocation by
//! allocation: a pool keeps freed blocks for reuse (up to its release threshold, which PyTorch's
//! `cudaMallocAsync` backend sets to the maximum), and that memory stays the container's until
//! the pool releases it.
//!
//! An allocation is charged in full before the driver call, rounded up to the pool's growth
//! granularity (so the quota holds whatever the pool does: serve it from kept blocks, or grow),
//! and never less because the pool "might" serve it from kept blocks — they may be fragmented or
//! taken by another thread. After the call the charge passes to the pool, whose charge is then
//! brought to `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`, read under the table's lock so concurrent
//! reconciles never count one growth twice. While other threads' allocations are in flight their
//! full charges are held too, so the container's figure is never below what the device holds.
//! When the container is at its quota, the ledger trims the pools before refusing.

use rustc_hash::FxHashMap as HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::*};
use std::sync::Mutex;

use crate::ops::{DriverOps, Handle};
use crate::per_process::PerProcess;
use crate::process::Account;
use crate::types::*;

/// What a pool grows by at least (the driver's minimum allocation granularity on current GPUs).
pub const GRANULARITY: u64 = 2 << 20;

/// What to charge before a stream-ordered allocation of `bytes`.
pub fn precharge(bytes: u64) -> u64 {
    bytes.div_ceil(GRANULARITY).saturating_mul(GRANULARITY)
}

#[derive(Default)]
struct Inner {
    /// Pool handle → (device, bytes charged for it).
    charged: HashMap<Handle, (usize, u64)>,
    /// Live stream-ordered allocation → its pool.
    allocations: HashMap<CUdeviceptr, Handle>,
}

/// This process's pools.
#[derive(Default)]
pub struct Pools {
    inner: Mutex<Inner>,
    /// Live stream-ordered allocations: while there are none, `freed` answers without the lock
    /// (every `cuMemFree` asks).
    live: AtomicUsize,
}

pub static POOLS: PerProcess<Pools> = PerProcess::new();

impl Pools {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A stream-ordered allocation of `ptr` from `pool` on `dev`, for which `precharged` bytes
    /// were charged before the driver call: the pool takes that charge over.
    pub fn allocated(
        &self,
        acc: &Account,
        ops: &dyn DriverOps,
        pool: Handle,
        dev: usize,
        ptr: CUdeviceptr,
        precharged: u64,
    ) {
        let mut p = self.lock();
        p.charged.entry(pool).or_insert((dev, 0)).1 += precharged;
        if p.allocations.insert(ptr, pool).is_none() {
            self.live.fetch_add(1, AcqRel);
        }
        self.reconcile_locked(&mut p, acc, ops, pool);
    }

    /// Runs the driver's stream-ordered allocation `call` from `pool` (for which `precharged`
    /// bytes were charged) under the table's lock, and hands the charge to the pool. Serialised
    /// with every reconcile, so no reconcile sees a pool grown by an allocation whose charge has
    /// not reached the pool yet (which would count that growth twice). `call` touches none of
    /// the shim's locks. On failure the caller keeps (and returns) the charge.
    pub fn allocate(
        &self,
        acc: &Account,
        ops: &dyn DriverOps,
        (pool, dev, precharged): (Handle, usize, u64),
        call: impl FnOnce() -> CUresult,
        ptr: impl FnOnce() -> CUdeviceptr,
    ) -> CUresult {
        let mut p = self.lock();
        let r = call();
        if r != CUDA_SUCCESS {
            return r;
        }
        p.charged.entry(pool).or_insert((dev, 0)).1 += precharged;
        if p.allocations.insert(ptr(), pool).is_none() {
            self.live.fetch_add(1, AcqRel);
        }
        self.reconcile_locked(&mut p, acc, ops, pool);
        r
    }

    /// `ptr` was freed (stream-ordered or not): (pool, device) of a stream-ordered allocation,
    /// if it was one.
    pub fn freed(&self, ptr: CUdeviceptr) -> Option<(Handle, usize)> {
        if self.live.load(Acquire) == 0 {
            return None;
        }
        let mut p = self.lock();
        let pool = p.allocations.remove(&ptr)?;
        self.live.fetch_sub(1, AcqRel);
        let dev = p.charged.get(&pool).map_or(0, |e| e.0);
        Some((pool, dev))
    }

    /// Brings the container's charge for `pool` to what the pool reserves now.
    pub fn reconcile(&self, acc: &Account, ops: &dyn DriverOps, pool: Handle) {
        self.reconcile_locked(&mut self.lock(), acc, ops, pool);
    }

    fn reconcile_locked(&self, p: &mut Inner, acc: &Account, ops: &dyn DriverOps, pool: Handle) {
        let Some(entry) = p.charged.get_mut(&pool) else {
            return;
        };
        let (dev, charged) = *entry;
        match ops.pool_reserved(pool) {
            Some(r) if r > charged => {
                // Memory the pool holds beyond its charges (a granularity larger than ours):
                // the container holds it, quota or not; the ledger trims or refuses after.
                acc.charge_held(dev, r - charged);
                entry.1 = r;
            }
            Some(r) => {
                acc.uncharge(dev, charged - r);
                entry.1 = r;
            }
            None => {
                // The pool is gone (destroyed with its memory, or with its context).
                acc.uncharge(dev, charged);
                p.charged.remove(&pool);
                let before = p.allocations.len();
                p.allocations.retain(|_, q| *q != pool);
                self.live.fetch_sub(before - p.allocations.len(), AcqRel);
            }
        }
    }

    pub fn reconcile_all(&self, acc: &Account, ops: &dyn DriverOps) {
        let mut p = self.lock();
        let pools: Vec<Handle> = p.charged.keys().copied().collect();
        for pool in pools {
            self.reconcile_locked(&mut p, acc, ops, pool);
        }
    }

    /// Releases what this process's pools keep (`cuMemPoolTrimTo(pool, 0)`), as the container
    /// is at its quota. True if that returned anything.
    pub fn trim_all(&self, acc: &Account, ops: &dyn DriverOps) -> bool {
        let mut p = self.lock();
        let before: u64 = p.charged.values().map(|(_, b)| b).sum();
        let pools: Vec<Handle> = p.charged.keys().copied().collect();
        for pool in pools {
            ops.pool_trim(pool);
            self.reconcile_locked(&mut p, acc, ops, pool);
        }
        let after: u64 = p.charged.values().map(|(_, b)| b).sum();
        after < before
    }

    /// Bytes charged for all pools on `dev` (for tests and status).
    pub fn charged(&self, dev: usize) -> u64 {
        self.lock()
            .charged
            .values()
            .filter(|(d, _)| *d == dev)
            .map(|(_, b)| b)
            .sum()
    }
}
