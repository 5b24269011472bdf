//! Stream-ordered frees (`cuMemFreeAsync`): the driver frees the memory when the stream reaches
//! the free, so the container's charge is returned then, not when the free is issued —
//! otherwise another allocation could be granted while the memory is still in use (the quota
//! would hold only on paper). An event recorded after the free marks the point; completed
//! frees are settled whenever the shim needs the figure: before an allocation that would not
//! fit (waiting for the outstanding ones if that is what it takes), before `cuMemGetInfo`, and
//! before a context goes away.

use crate::state::PerProcess;
use crate::types::*;

/// A free the stream may not have reached yet.
struct Pending {
    event: usize,
    ctx: usize,
    dev: usize,
    /// Charge to return when the free is reached (0 for a pool allocation, whose pool is then
    /// reconciled instead).
    bytes: u64,
    pool: Option<usize>,
}

#[derive(Default)]
struct Deferred {
    pending: Vec<Pending>,
    /// Completed events for reuse: (context, event).
    idle: Vec<(usize, usize)>,
}

static DEFERRED: PerProcess<Deferred> = PerProcess::new();

const CU_EVENT_DISABLE_TIMING: u32 = 2;
const CUDA_ERROR_NOT_READY: CUresult = 600;
const CU_STREAM_CAPTURE_MODE_RELAXED: u32 = 2;
/// Above this many outstanding frees, completed ones are settled as new ones come.
const SETTLE_ABOVE: usize = 256;
const MAX_IDLE: usize = 64;

/// In a forked child: the parent's events are not the child's.
pub fn forget_all_after_fork() {
    DEFERRED.reset();
}

/// After a successful `cuMemFreeAsync` of `bytes` on `dev` on `stream`: keeps the charge until
/// the stream reaches the free (then also reconciles `pool`). False if that cannot be tracked
/// (the caller returns the charge now).
pub(crate) fn defer(
    dev: usize,
    bytes: u64,
    pool: Option<usize>,
    stream: CUstream,
    ptsz: bool,
) -> bool {
    let r = crate::state::real();
    let (Some(get_ctx), Some(create), Some(record)) = (
        r.cuCtxGetCurrent,
        r.cuEventCreate,
        if ptsz {
            r.cuEventRecord_ptsz
        } else {
            r.cuEventRecord
        },
    ) else {
        return false;
    };
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: the driver's `cuCtxGetCurrent`, writing one CUcontext to a live local.
    if unsafe { get_ctx(&mut ctx) } != CUDA_SUCCESS || ctx.is_null() {
        return false;
    }
    let reused = {
        let mut d = DEFERRED.lock();
        let i = d.idle.iter().position(|(c, _)| *c == ctx as usize);
        i.map(|i| d.idle.swap_remove(i).1)
    };
    let event = match reused {
        Some(e) => e as CUevent,
        None => {
            let mut e: CUevent = std::ptr::null_mut();
            // SAFETY: the driver's `cuEventCreate`, writing one CUevent to a live local; a
            // context is current (checked above).
            if unsafe { create(&mut e, CU_EVENT_DISABLE_TIMING) } != CUDA_SUCCESS {
                return false;
            }
            e
        }
    };
    // SAFETY: our event, of the current context; the caller's stream, just used for the free.
    if unsafe { record(event, stream) } != CUDA_SUCCESS {
        destroy(event);
        return false;
    }
    let many = {
        let mut d = DEFERRED.lock();
        d.pending.push(Pending {
            event: event as usize,
            ctx: ctx as usize,
            dev,
            bytes,
            pool,
        });
        d.pending.len() > SETTLE_ABOVE
    };
    if many {
        settle(false);
    }
    true
}

/// Returns the charge of every free its stream has reached; with `wait`, waits for all of
/// them first. True if anything was returned.
pub fn settle(wait: bool) -> bool {
    let pending = std::mem::take(&mut DEFERRED.lock().pending);
    if pending.is_empty() {
        return false;
    }
    let r = crate::state::real();
    let (Some(query), Some(sync)) = (r.cuEventQuery, r.cuEventSynchronize) else {
        return false;
    };
    if wait {
        relaxed_capture_mode(|| {
            for p in &pending {
                // SAFETY: our event; an error (e.g. its context is gone) ends the wait too.
                unsafe { sync(p.event as CUevent) };
            }
        });
    }
    let mut still = Vec::new();
    let mut idle = Vec::new();
    let mut pools = Vec::new();
    let mut returned = false;
    for p in pending {
        // SAFETY: our event. Anything but NOT_READY means the free is done (or its context,
        // and with it the memory, is gone).
        let rc = unsafe { query(p.event as CUevent) };
        if rc == CUDA_ERROR_NOT_READY {
            still.push(p);
            continue;
        }
        if let Some(sh) = crate::state::get() {
            sh.uncharge(p.dev, p.bytes);
        }
        pools.extend(p.pool);
        returned = true;
        if rc == CUDA_SUCCESS {
            idle.push((p.ctx, p.event));
        }
    }
    let extra = {
        let mut d = DEFERRED.lock();
        d.pending.extend(still);
        d.idle.extend(idle);
        let keep = d.idle.len().min(MAX_IDLE);
        d.idle.split_off(keep)
    };
    for (_, e) in extra {
        destroy(e as CUevent);
    }
    pools.sort_unstable();
    pools.dedup();
    for pool in pools {
        crate::pools::reconcile(pool);
    }
    returned
}

/// Before `ctx` is destroyed or reset (all contexts when None): settles every outstanding free
/// (the driver synchronises anyway) and destroys the context's pooled events while it exists.
pub fn before_context_loss(ctx: Option<CUcontext>) {
    settle(true);
    let gone: Vec<usize> = {
        let mut d = DEFERRED.lock();
        let (gone, keep) = d
            .idle
            .drain(..)
            .partition(|(c, _)| ctx.is_none_or(|x| x as usize == *c));
        d.idle = keep;
        gone.into_iter().map(|(_, e)| e).collect()
    };
    for e in gone {
        destroy(e as CUevent);
    }
}

fn destroy(e: CUevent) {
    if let Some(f) = crate::state::real().cuEventDestroy_v2 {
        // SAFETY: our event, destroyed once.
        unsafe { f(e) };
    }
}

/// Runs `f` with this thread's stream-capture mode relaxed, so that waiting on our own events
/// never invalidates a capture another thread has in progress (what CUDA documents for
/// libraries that must make such calls).
fn relaxed_capture_mode(f: impl FnOnce()) {
    let exchange = crate::state::real().cuThreadExchangeStreamCaptureMode;
    let mut mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: the driver's `cuThreadExchangeStreamCaptureMode`, reading and writing one
    // CUstreamCaptureMode in a live local.
    let swapped = exchange.is_some_and(|x| unsafe { x(&mut mode) } == CUDA_SUCCESS);
    f();
    if swapped {
        if let Some(x) = exchange {
            // SAFETY: as above; restores the caller's mode.
            unsafe { x(&mut mode) };
        }
    }
}
