//! Contexts: the first context a process makes on a device is charged
//! `LIBSHARE_CONTEXT_OVERHEAD`; a context's end (destroy, primary reset, primary release to
//! refcount 0) returns exactly its allocations (`ledger::context_end`); and each thread's
//! current device is tracked here so a launch knows it without a driver call.

use std::cell::Cell;
use std::sync::atomic::Ordering::*;

use crate::boundary::{rc, Out, R};
use crate::ledger;
use crate::ops::{DriverOps, Handle, REAL};
use crate::process::shim;
use crate::types::*;

thread_local! {
    /// Device of this thread's current context, as the node's GPU index (`devmap.rs`: converted
    /// when the context changes, so a launch reads it as it is).
    static DEVICE: Cell<u32> = const { Cell::new(0) };
}

/// The device of this thread's current context, as last seen by a context hook. Hot path: a
/// TLS read.
#[inline(always)]
pub fn device_fast() -> usize {
    DEVICE.with(|d| d.get()) as usize % libshare_abi::MAX_DEVICES
}

/// The device (node index) of the current context, asked of the driver (allocation paths can
/// afford it).
pub fn current_device() -> Option<usize> {
    REAL.ctx_device()
}

/// After a context was made current or created: track its device (`ctx_device` gives the node
/// index).
fn refresh_device(r: CUresult) {
    if r == CUDA_SUCCESS {
        if let Some(d) = REAL.ctx_device() {
            DEVICE.with(|c| c.set(d as u32));
        }
    }
}

/// The node index of the caller's CUDA ordinal `dev` (None: not a device).
fn device_index(dev: CUdevice) -> Option<usize> {
    (dev >= 0 && (dev as usize) < libshare_abi::MAX_DEVICES).then(|| crate::devmap::node_of(dev))
}

/// Charges the context overhead on `dev` the first time this process makes a context there,
/// then creates it. It stays charged until the process exits (when its slot is released).
fn with_context_charge(dev: CUdevice, create: impl FnOnce() -> CUresult) -> R {
    let sh = shim()?;
    let overhead = sh.cfg.context_overhead;
    let Some(d) = device_index(dev).filter(|_| overhead > 0) else {
        return rc(create());
    };
    let bit = 1u32 << d;
    if sh.ctx_charged.fetch_or(bit, AcqRel) & bit != 0 {
        return rc(create());
    }
    let l = ledger::of(sh);
    if !l.charge(d, overhead) {
        sh.ctx_charged.fetch_and(!bit, AcqRel);
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let r = create();
    if r != CUDA_SUCCESS {
        sh.account.uncharge(d, overhead);
        sh.ctx_charged.fetch_and(!bit, AcqRel);
    }
    rc(r)
}

pub fn primary_retain(call: impl FnOnce() -> CUresult, pctx: Out<CUcontext>, dev: CUdevice) -> R {
    with_context_charge(dev, call)?;
    if let (Some(d), Some(ctx), Ok(sh)) = (device_index(dev), pctx.get(), shim()) {
        sh.primary[d].store(ctx as Handle, Release);
    }
    Ok(())
}

/// The primary context of `dev` as this process saw it (0: never retained through the shim,
/// so nothing was allocated in it through the shim either).
fn primary_of(dev: CUdevice) -> Handle {
    match (crate::process::get(), device_index(dev)) {
        (Some(sh), Some(d)) => sh.primary[d].load(Acquire),
        _ => 0,
    }
}

/// cudaDeviceReset: the driver destroys the primary context's resources: its allocations, and
/// only those (allocations of `cuCtxCreate` contexts on the device stay), go back to the quota.
pub fn primary_reset(call: impl FnOnce() -> CUresult, dev: CUdevice) -> R {
    match crate::process::get() {
        Some(sh) => ledger::of(sh).context_end(primary_of(dev), call),
        None => rc(call()),
    }
}

/// The last release of a primary context destroys it with its allocations.
pub fn primary_release(call: impl FnOnce() -> CUresult, dev: CUdevice) -> R {
    let Some(sh) = crate::process::get() else {
        return rc(call());
    };
    let ctx = primary_of(dev);
    let l = ledger::of(sh);
    let r = call();
    let node = device_index(dev);
    if r == CUDA_SUCCESS && ctx != 0 && node.and_then(|d| l.ops.primary_active(d)) == Some(false) {
        l.settle_context(ctx);
    }
    rc(r)
}

pub fn destroy(call: impl FnOnce() -> CUresult, ctx: CUcontext) -> R {
    let r = match crate::process::get() {
        Some(sh) => ledger::of(sh).context_end(ctx as Handle, call),
        None => rc(call()),
    };
    refresh_device(crate::boundary::code(r));
    r
}

pub fn create(
    call: impl FnOnce() -> CUresult,
    _pctx: Out<CUcontext>,
    _flags: u32,
    dev: CUdevice,
) -> R {
    let r = with_context_charge(dev, call);
    refresh_device(crate::boundary::code(r));
    r
}

pub fn create_v3(
    call: impl FnOnce() -> CUresult,
    pctx: Out<CUcontext>,
    _params: *mut std::ffi::c_void,
    _n: i32,
    flags: u32,
    dev: CUdevice,
) -> R {
    create(call, pctx, flags, dev)
}

pub fn create_v4(
    call: impl FnOnce() -> CUresult,
    pctx: Out<CUcontext>,
    _params: *mut std::ffi::c_void,
    flags: u32,
    dev: CUdevice,
) -> R {
    create(call, pctx, flags, dev)
}

pub fn set_current(call: impl FnOnce() -> CUresult, ctx: CUcontext) -> R {
    let r = call();
    if !ctx.is_null() {
        refresh_device(r);
    }
    rc(r)
}

pub fn push(call: impl FnOnce() -> CUresult, _ctx: CUcontext) -> R {
    let r = call();
    refresh_device(r);
    rc(r)
}

pub fn pop(call: impl FnOnce() -> CUresult, _ctx: Out<CUcontext>) -> R {
    let r = call();
    refresh_device(r);
    rc(r)
}
