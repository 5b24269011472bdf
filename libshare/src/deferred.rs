//! Stream-ordered frees (`cuMemFreeAsync`): the driver frees the memory when the stream reaches
//! the free, so the container's charge is returned then, not when the free is issued —
//! otherwise another allocation could be granted while the memory is still in use (the quota
//! would hold only on paper). An event recorded after the free marks the point; completed
//! frees are settled whenever the ledger needs the figure: before an allocation that would not
//! fit (waiting for the outstanding ones if that is what it takes), before `cuMemGetInfo`, and
//! before a context goes away.

use std::sync::Mutex;

use crate::ops::{DriverOps, EventState, Handle};
use crate::per_process::PerProcess;
use crate::pools::Pools;
use crate::process::Account;

/// A free the stream may not have reached yet.
struct Pending {
    event: Handle,
    ctx: Handle,
    dev: usize,
    /// Charge to return when the free is reached (0 for a pool allocation, whose pool is then
    /// reconciled instead).
    bytes: u64,
    pool: Option<Handle>,
}

#[derive(Default)]
struct Inner {
    pending: Vec<Pending>,
    /// Completed events for reuse: (context, event).
    idle: Vec<(Handle, Handle)>,
}

/// This process's outstanding stream-ordered frees.
#[derive(Default)]
pub struct Deferred(Mutex<Inner>);

pub static DEFERRED: PerProcess<Deferred> = PerProcess::new();

/// Above this many outstanding frees, completed ones are settled as new ones come.
const SETTLE_ABOVE: usize = 256;
const MAX_IDLE: usize = 64;

impl Deferred {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// After a successful `cuMemFreeAsync` of `bytes` on `dev` on `stream`: keeps the charge
    /// until the stream reaches the free (then also reconciles `pool`). False if that cannot be
    /// tracked (the caller returns the charge now).
    #[allow(clippy::too_many_arguments)]
    pub fn defer(
        &self,
        acc: &Account,
        ops: &dyn DriverOps,
        pools: &Pools,
        (dev, bytes, pool): (usize, u64, Option<Handle>),
        stream: Handle,
        ptsz: bool,
    ) -> bool {
        let Some(ctx) = ops.current_ctx() else {
            return false;
        };
        let reused = {
            let mut d = self.lock();
            let i = d.idle.iter().position(|(c, _)| *c == ctx);
            i.map(|i| d.idle.swap_remove(i).1)
        };
        let Some(event) = reused.or_else(|| ops.event_create()) else {
            return false;
        };
        if !ops.event_record(event, stream, ptsz) {
            ops.event_destroy(event);
            return false;
        }
        let many = {
            let mut d = self.lock();
            d.pending.push(Pending {
                event,
                ctx,
                dev,
                bytes,
                pool,
            });
            d.pending.len() > SETTLE_ABOVE
        };
        if many {
            self.settle(acc, ops, pools, false);
        }
        true
    }

    /// Returns the charge of every free its stream has reached; with `wait`, waits for all of
    /// them first. True if anything was returned.
    pub fn settle(&self, acc: &Account, ops: &dyn DriverOps, pools: &Pools, wait: bool) -> bool {
        let pending = std::mem::take(&mut self.lock().pending);
        if pending.is_empty() {
            return false;
        }
        if wait {
            for p in &pending {
                ops.event_wait(p.event);
            }
        }
        let (mut still, mut idle, mut reached) = (Vec::new(), Vec::new(), Vec::new());
        let mut returned = false;
        for p in pending {
            match ops.event_query(p.event) {
                EventState::NotReady => still.push(p),
                state => {
                    returned = true;
                    acc.uncharge(p.dev, p.bytes);
                    reached.extend(p.pool);
                    if state == EventState::Done {
                        idle.push((p.ctx, p.event));
                    }
                }
            }
        }
        let extra = {
            let mut d = self.lock();
            d.pending.extend(still);
            d.idle.extend(idle);
            let keep = d.idle.len().min(MAX_IDLE);
            d.idle.split_off(keep)
        };
        for (_, e) in extra {
            ops.event_destroy(e);
        }
        reached.sort_unstable();
        reached.dedup();
        for pool in reached {
            pools.reconcile(acc, ops, pool);
        }
        returned
    }

    /// Before `ctx` is destroyed or reset (all contexts when None): settles every outstanding
    /// free (the driver synchronises anyway) and destroys the context's pooled events while it
    /// exists.
    pub fn before_context_loss(
        &self,
        acc: &Account,
        ops: &dyn DriverOps,
        pools: &Pools,
        ctx: Option<Handle>,
    ) {
        self.settle(acc, ops, pools, true);
        let gone: Vec<Handle> = {
            let mut d = self.lock();
            let (gone, keep) = d
                .idle
                .drain(..)
                .partition(|(c, _)| ctx.is_none_or(|x| x == *c));
            d.idle = keep;
            gone.into_iter().map(|(_, e)| e).collect()
        };
        for e in gone {
            ops.event_destroy(e);
        }
    }

    /// Outstanding frees (for tests).
    pub fn outstanding(&self) -> usize {
        self.lock().pending.len()
    }
}
