//! Stream-ordered allocations are charged by what their memory pool reserves, not allocation by
//! allocation: a pool keeps freed blocks for reuse (up to its release threshold, which PyTorch's
//! `cudaMallocAsync` backend sets to the maximum), and that memory stays the container's until
//! the pool releases it. An allocation is charged in full before the driver call (so the quota
//! holds whatever the pool does); after it, after each free, and whenever the shim needs the
//! figure, the container's charge for a pool is brought to the pool's
//! `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT` (an allocation served from kept blocks adds nothing).
//! When the container is at its quota, the shim trims its pools (`cuMemPoolTrimTo(pool, 0)`)
//! before refusing an allocation.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::*};

use crate::state::PerProcess;
use crate::types::*;

#[derive(Default)]
struct Pools {
    /// Pool handle → (device, bytes charged for it).
    charged: HashMap<usize, (usize, u64)>,
    /// Live stream-ordered allocation → its pool.
    allocations: HashMap<CUdeviceptr, usize>,
}

static POOLS: PerProcess<Pools> = PerProcess::new();
/// Live stream-ordered allocations: while there are none, `freed` answers without the lock
/// (every `cuMemFree` asks).
static LIVE: AtomicUsize = AtomicUsize::new(0);

const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: u32 = 5;
const CU_MEMPOOL_ATTR_USED_MEM_CURRENT: u32 = 7;

/// In a forked child: the parent's pools are not the child's.
pub fn forget_all_after_fork() {
    POOLS.reset();
    LIVE.store(0, Release);
}

fn attribute(pool: usize, attr: u32) -> Option<u64> {
    let get = crate::state::real().cuMemPoolGetAttribute?;
    let mut v = 0u64;
    // SAFETY: the driver's `cuMemPoolGetAttribute`; both attributes asked for are cuuint64_t,
    // written to a live local u64; a pool handle the driver gave this process.
    (unsafe { get(pool as CUmemoryPool, attr, &mut v as *mut u64 as *mut _) } == CUDA_SUCCESS)
        .then_some(v)
}

/// The pool `cuMemAllocAsync` uses on `dev` (its current pool), if the driver says.
pub fn current_pool(dev: usize) -> Option<usize> {
    let get = crate::state::real().cuDeviceGetMemPool?;
    let mut p: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: the driver's `cuDeviceGetMemPool`, writing one CUmemoryPool to a live local.
    (unsafe { get(&mut p, dev as CUdevice) } == CUDA_SUCCESS && !p.is_null()).then_some(p as usize)
}

/// Bytes `pool` reserves but does not use: what an allocation from it may be served from.
pub fn kept(pool: usize) -> u64 {
    match (
        attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
        attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT),
    ) {
        (Some(r), Some(u)) => r.saturating_sub(u),
        _ => 0,
    }
}

/// A stream-ordered allocation of `ptr` from `pool` on `dev`, for which `precharged` bytes were
/// charged before the driver call.
pub fn allocated(pool: usize, dev: usize, ptr: CUdeviceptr, precharged: u64) {
    {
        let mut p = POOLS.lock();
        p.charged.entry(pool).or_insert((dev, 0)).1 += precharged;
        if p.allocations.insert(ptr, pool).is_none() {
            LIVE.fetch_add(1, AcqRel);
        }
    }
    reconcile(pool);
}

/// `ptr` was freed (stream-ordered or not): (pool, device) of a stream-ordered allocation, if it
/// was one.
pub fn freed(ptr: CUdeviceptr) -> Option<(usize, usize)> {
    if LIVE.load(Acquire) == 0 {
        return None;
    }
    let mut p = POOLS.lock();
    let pool = p.allocations.remove(&ptr)?;
    LIVE.fetch_sub(1, AcqRel);
    let dev = p.charged.get(&pool).map_or(0, |e| e.0);
    Some((pool, dev))
}

/// Brings the container's charge for `pool` to what the pool reserves now.
pub fn reconcile(pool: usize) {
    let Some(sh) = crate::state::get() else {
        return;
    };
    let reserved = attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
    let mut p = POOLS.lock();
    let Some(entry) = p.charged.get_mut(&pool) else {
        return;
    };
    let (dev, charged) = *entry;
    match reserved {
        Some(r) if r > charged => {
            // Memory the pool already holds (granularity, or an allocation served from kept
            // blocks after a trim elsewhere): the container holds it, quota or not.
            sh.charge_held(dev, r - charged);
            entry.1 = r;
        }
        Some(r) => {
            sh.uncharge(dev, charged - r);
            entry.1 = r;
        }
        None => {
            // The pool is gone (destroyed with its memory).
            sh.uncharge(dev, charged);
            p.charged.remove(&pool);
        }
    }
}

/// Every pool this process has used.
fn known() -> Vec<usize> {
    POOLS.lock().charged.keys().copied().collect()
}

pub fn reconcile_all() {
    for pool in known() {
        reconcile(pool);
    }
}

/// Releases what this process's pools keep (`cuMemPoolTrimTo(pool, 0)`), as the container is at
/// its quota. True if that returned anything.
pub fn trim_all() -> bool {
    let Some(trim) = crate::state::real().cuMemPoolTrimTo else {
        return false;
    };
    let before: u64 = POOLS.lock().charged.values().map(|(_, b)| b).sum();
    for pool in known() {
        // SAFETY: a pool handle the driver gave this process.
        unsafe { trim(pool as CUmemoryPool, 0) };
        reconcile(pool);
    }
    let after: u64 = POOLS.lock().charged.values().map(|(_, b)| b).sum();
    after < before
}
