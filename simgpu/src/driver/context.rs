//! Contexts: primary contexts (retained by cudart), created contexts, the per-thread stack.

use std::sync::atomic::Ordering::*;
use std::sync::Arc;

use super::{ctx_from, current_ctx, current_ctx_opt, out, with_ctx_stack, R};
use crate::driver;
use crate::sim::{sim, Context};
use crate::types::*;

fn primary(dev: CUdevice) -> Result<&'static Arc<Context>, CUresult> {
    let s = sim()?;
    let ordinal = s.check_ordinal(dev)?;
    s.primary(ordinal).ok_or(CUDA_ERROR_NOT_INITIALIZED)
}

/// Waits for all work of the context.
pub fn sync_ctx(ctx: &Context) -> R {
    let s = sim()?;
    s.engine.wait_all(&ctx.all_streams());
    Ok(())
}

/// cudaDeviceReset: the primary context's work completes and its memory is freed.
fn reset(ctx: &Arc<Context>) -> R {
    sync_ctx(ctx)?;
    super::memory::free_context_allocations(Arc::as_ptr(ctx) as usize);
    Ok(())
}

/// Serialises retain, release and reset of primary contexts, so that a retain racing the last
/// release finds either the old context (not yet reset) or a fresh one.
static PRIMARY_LOCK: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

/// cuDevicePrimaryCtxRelease: the last release resets the context (CUDA destroys it then, with
/// its memory). Releasing a context that is not retained is CUDA_ERROR_INVALID_CONTEXT.
fn release(dev: CUdevice) -> R {
    let c = primary(dev)?;
    let _g = PRIMARY_LOCK.lock();
    let before = c
        .refs
        .fetch_update(AcqRel, Acquire, |r| r.checked_sub(1))
        .map_err(|_| CUDA_ERROR_INVALID_CONTEXT)?;
    if before == 1 {
        reset(c)?;
    }
    Ok(())
}

fn set_current(ctx: Option<Arc<Context>>) {
    with_ctx_stack(|st| {
        st.pop();
        if let Some(c) = ctx {
            st.push(c);
        }
    });
}

/// Safety: `pctx` is NULL or writable (cuCtxCreate's out-argument).
unsafe fn create(pctx: *mut CUcontext, flags: u32, dev: CUdevice) -> R {
    let s = sim()?;
    let d = s.device(dev)?;
    let c = Context::new(s, d, false);
    c.flags.store(flags, Relaxed);
    let h = c.handle();
    with_ctx_stack(|st| st.push(c));
    // SAFETY: `pctx` is NULL or writable (this fn's contract).
    unsafe { out(pctx, h) }
}

unsafe fn destroy(ctx: CUcontext) -> R {
    let s = sim()?;
    // The context leaves the registry and its allocations are listed under the allocation
    // table's lock, where allocations are entered: one racing this call in another thread
    // either is listed here and freed, or finds the context gone and fails.
    let (c, allocations) = {
        let t = s.mem.lock();
        let c = s
            .contexts
            .get(ctx as usize)
            .ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        if c.primary {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        s.contexts.remove(ctx as usize);
        (c, super::memory::context_allocations(&t, ctx as usize))
    };
    sync_ctx(&c)?;
    super::memory::free_allocations(s, &allocations);
    with_ctx_stack(|st| st.retain(|x| !Arc::ptr_eq(x, &c)));
    Ok(())
}

driver! {
    fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) {
        let c = primary(dev)?;
        if pctx.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let _g = PRIMARY_LOCK.lock();
        c.refs.fetch_add(1, AcqRel);
        out(pctx, c.handle())
    }

    fn cuDevicePrimaryCtxRelease(dev: CUdevice) {
        release(dev)
    }

    fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) {
        release(dev)
    }

    fn cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut u32, active: *mut i32) {
        let c = primary(dev)?;
        out(flags, c.flags.load(Acquire))?;
        out(active, (c.refs.load(Acquire) > 0) as i32)
    }

    fn cuDevicePrimaryCtxSetFlags(dev: CUdevice, flags: u32) {
        primary(dev)?.flags.store(flags, Release);
        Ok(())
    }

    fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: u32) {
        primary(dev)?.flags.store(flags, Release);
        Ok(())
    }

    fn cuDevicePrimaryCtxReset(dev: CUdevice) {
        let c = primary(dev)?;
        let _g = PRIMARY_LOCK.lock();
        reset(c)
    }

    fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) {
        let c = primary(dev)?;
        let _g = PRIMARY_LOCK.lock();
        reset(c)
    }

    fn cuCtxCreate(pctx: *mut CUcontext, flags: u32, dev: CUdevice) {
        create(pctx, flags, dev)
    }

    fn cuCtxCreate_v2(pctx: *mut CUcontext, flags: u32, dev: CUdevice) {
        create(pctx, flags, dev)
    }

    fn cuCtxCreate_v3(pctx: *mut CUcontext, _params: *mut std::ffi::c_void, _n: i32, flags: u32, dev: CUdevice) {
        create(pctx, flags, dev)
    }

    fn cuCtxCreate_v4(pctx: *mut CUcontext, _params: *mut std::ffi::c_void, flags: u32, dev: CUdevice) {
        create(pctx, flags, dev)
    }

    fn cuCtxDestroy(ctx: CUcontext) {
        destroy(ctx)
    }

    fn cuCtxDestroy_v2(ctx: CUcontext) {
        destroy(ctx)
    }

    fn cuCtxGetCurrent(pctx: *mut CUcontext) {
        out(pctx, current_ctx_opt().map_or(std::ptr::null_mut(), |c| c.handle()))
    }

    fn cuCtxSetCurrent(ctx: CUcontext) {
        let c = if ctx.is_null() { None } else { Some(ctx_from(ctx)?) };
        set_current(c);
        Ok(())
    }

    fn cuCtxPushCurrent(ctx: CUcontext) {
        let c = ctx_from(ctx)?;
        with_ctx_stack(|st| st.push(c));
        Ok(())
    }

    fn cuCtxPushCurrent_v2(ctx: CUcontext) {
        let c = ctx_from(ctx)?;
        with_ctx_stack(|st| st.push(c));
        Ok(())
    }

    fn cuCtxPopCurrent(pctx: *mut CUcontext) {
        let c = with_ctx_stack(|st| st.pop()).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        if !pctx.is_null() {
            *pctx = c.handle();
        }
        Ok(())
    }

    fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) {
        let c = with_ctx_stack(|st| st.pop()).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        if !pctx.is_null() {
            *pctx = c.handle();
        }
        Ok(())
    }

    fn cuCtxGetDevice(dev: *mut CUdevice) {
        out(dev, sim()?.ordinal(current_ctx()?.device))
    }

    fn cuCtxGetDevice_v2(dev: *mut CUdevice, ctx: CUcontext) {
        out(dev, sim()?.ordinal(ctx_from(ctx)?.device))
    }

    fn cuCtxSynchronize() {
        sync_ctx(&*current_ctx()?)
    }

    fn cuCtxSynchronize_v2(ctx: CUcontext) {
        sync_ctx(&*ctx_from(ctx)?)
    }

    fn cuCtxGetFlags(flags: *mut u32) {
        out(flags, current_ctx()?.flags.load(Acquire))
    }

    fn cuCtxSetFlags(flags: u32) {
        current_ctx()?.flags.store(flags, Release);
        Ok(())
    }

    fn cuCtxGetId(ctx: CUcontext, id: *mut u64) {
        out(id, ctx_from(ctx)?.id)
    }

    fn cuCtxGetApiVersion(ctx: CUcontext, version: *mut u32) {
        ctx_from(ctx)?;
        out(version, 12010)
    }

    fn cuCtxGetLimit(value: *mut usize, limit: u32) {
        let c = current_ctx()?;
        let v = c.limits.lock().get(&limit).copied().unwrap_or(match limit {
            0 => 1024,       // stack size
            1 => 1 << 20,    // printf fifo
            2 => 8 << 20,    // malloc heap
            3 => 2,          // dev runtime sync depth
            4 => 2048,       // pending launch count
            5 => 32,         // max L2 fetch granularity
            6 => 0,          // persisting L2 cache size
            7..=9 => 0,      // shmem size, CIG enabled, CIG shmem fallback
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        });
        out(value, v)
    }

    fn cuCtxSetLimit(limit: u32, value: usize) {
        current_ctx()?.limits.lock().insert(limit, value);
        Ok(())
    }

    fn cuCtxGetCacheConfig(cfg: *mut u32) {
        current_ctx()?;
        out(cfg, 0)
    }

    fn cuCtxSetCacheConfig(_cfg: u32) {
        current_ctx()?;
        Ok(())
    }

    fn cuCtxGetSharedMemConfig(cfg: *mut u32) {
        current_ctx()?;
        out(cfg, 1)
    }

    fn cuCtxSetSharedMemConfig(_cfg: u32) {
        current_ctx()?;
        Ok(())
    }

    fn cuCtxGetStreamPriorityRange(least: *mut i32, greatest: *mut i32) {
        if !least.is_null() {
            *least = 0;
        }
        if !greatest.is_null() {
            *greatest = -5;
        }
        Ok(())
    }

    // All simulated devices are peers (device memory is host memory, so any device can reach
    // any other's): access is bookkeeping that follows the driver's rules and error codes.
    fn cuCtxEnablePeerAccess(peer: CUcontext, flags: u32) {
        let ctx = current_ctx()?;
        if peer.is_null() {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        let peer = super::ctx_from(peer)?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if peer.device == ctx.device {
            return Err(CUDA_ERROR_INVALID_DEVICE);
        }
        let mut peers = ctx.peers.lock();
        if peers.contains(&peer.id) {
            return Err(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
        }
        peers.push(peer.id);
        Ok(())
    }

    fn cuCtxDisablePeerAccess(peer: CUcontext) {
        let ctx = current_ctx()?;
        if peer.is_null() {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        let peer = super::ctx_from(peer)?;
        let mut peers = ctx.peers.lock();
        let i = peers.iter().position(|p| *p == peer.id).ok_or(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED)?;
        peers.swap_remove(i);
        Ok(())
    }

    fn cuCtxResetPersistingL2Cache() {
        Ok(())
    }
}
