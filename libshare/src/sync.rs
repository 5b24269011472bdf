//! The drain signal: a synchronising call (`cuCtxSynchronize[_v2]`, `cuStreamSynchronize`,
//! `cuEventSynchronize`) or a query (`cuStreamQuery`, `cuEventQuery`) that returns
//! `CUDA_SUCCESS` tells the container's shared state that its work on the device is done
//! (`DeviceState::note_drained`, see `libshare_abi::rate`).
//!
//! It is a hint, not a proof: a stream or an event being done says nothing of the process's
//! other streams, nor of the container's other processes; the daemon reads it as such. The
//! shim's own queries go through the real driver's table (`ops.rs`) and are not counted.

use crate::boundary::{rc, R};
use crate::types::*;

/// `cuCtxSynchronize`: the current context's device.
pub fn ctx(call: impl FnOnce() -> CUresult) -> R {
    drained(call(), None)
}

/// `cuCtxSynchronize_v2(ctx)`: that context's device (NULL: the current one).
pub fn ctx_v2(call: impl FnOnce() -> CUresult, ctx: CUcontext) -> R {
    drained(call(), (!ctx.is_null()).then_some(ctx as usize))
}

/// `cuStreamSynchronize`, `cuStreamQuery` (and their `_ptsz` twins).
pub fn stream(call: impl FnOnce() -> CUresult, _stream: CUstream) -> R {
    drained(call(), None)
}

/// `cuEventSynchronize`, `cuEventQuery`.
pub fn event(call: impl FnOnce() -> CUresult, _event: CUevent) -> R {
    drained(call(), None)
}

fn drained(r: CUresult, ctx: Option<usize>) -> R {
    if r == CUDA_SUCCESS {
        crate::rate::drained(ctx);
    }
    rc(r)
}
