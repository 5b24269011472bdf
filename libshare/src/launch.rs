//! Launch accounting: every launch path is counted per process and device, without a driver call,
//! lock or allocation. The thread's current device is tracked by the context hooks.

use std::cell::Cell;
use std::sync::atomic::Ordering::Relaxed;

use crate::types::*;

thread_local! {
    /// Device of this thread's current context (updated when it changes).
    static DEVICE: Cell<u32> = const { Cell::new(0) };
}

/// Counts one launch on the current device. Hot path: an atomic load, a TLS read, an atomic add.
#[inline(always)]
pub fn counted() {
    if let Some(s) = crate::state::get() {
        let d = DEVICE.with(|d| d.get()) as usize;
        s.launches()[d % libshare_abi::MAX_DEVICES].fetch_add(1, Relaxed);
    }
}

/// A context was created (and made current) or changed: track its device.
pub fn context_changed(r: CUresult) {
    if r == CUDA_SUCCESS {
        refresh_device();
    }
}

fn refresh_device() {
    if let Some(get) = crate::state::real().cuCtxGetDevice {
        let mut d: CUdevice = 0;
        // SAFETY: the driver's `cuCtxGetDevice`; `d` is a live local CUdevice to write.
        if unsafe { get(&mut d) } == CUDA_SUCCESS && d >= 0 {
            DEVICE.with(|c| c.set(d as u32));
        }
    }
}

/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuCtxSetCurrent`, `ctx` the caller's.
pub unsafe fn ctx_set_current(
    real: unsafe extern "C" fn(CUcontext) -> CUresult,
    ctx: CUcontext,
) -> CUresult {
    // SAFETY: the hook contract: the driver's function with the caller's context handle.
    let r = unsafe { real(ctx) };
    if r == CUDA_SUCCESS && !ctx.is_null() {
        refresh_device();
    }
    r
}

/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuCtxPushCurrent(_v2)`, `ctx` the caller's.
pub unsafe fn ctx_push(
    real: unsafe extern "C" fn(CUcontext) -> CUresult,
    ctx: CUcontext,
) -> CUresult {
    // SAFETY: the hook contract: the driver's function with the caller's context handle.
    let r = unsafe { real(ctx) };
    if r == CUDA_SUCCESS {
        refresh_device();
    }
    r
}

/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuCtxPopCurrent(_v2)`, `ctx` the caller's.
pub unsafe fn ctx_pop(
    real: unsafe extern "C" fn(*mut CUcontext) -> CUresult,
    ctx: *mut CUcontext,
) -> CUresult {
    // SAFETY: the hook contract: the driver's function with the caller's out-pointer (which
    // the API allows to be NULL).
    let r = unsafe { real(ctx) };
    if r == CUDA_SUCCESS {
        refresh_device();
    }
    r
}
