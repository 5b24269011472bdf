//! The launch hooks: every launch path passes the rate gate's seam (`rate.rs`) with its key (the
//! function or graph), its stream and whether it is a per-thread default-stream (`_ptsz`) call;
//! the seam runs the driver's launch. Each hook serves a call and its `_ptsz` twin (`PTSZ`, set
//! by the declaration list).

use crate::boundary::{rc, In, Out, R};
use crate::rate;
use crate::types::*;

#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn kernel<const PTSZ: bool>(
    call: impl FnOnce() -> CUresult,
    f: CUfunction,
    _gx: u32,
    _gy: u32,
    _gz: u32,
    _bx: u32,
    _by: u32,
    _bz: u32,
    _smem: u32,
    stream: CUstream,
    _params: Out<*mut std::ffi::c_void>,
    _extra: Out<*mut std::ffi::c_void>,
) -> R {
    rc(rate::launch(f as usize, stream, PTSZ, call))
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn cooperative<const PTSZ: bool>(
    call: impl FnOnce() -> CUresult,
    f: CUfunction,
    _gx: u32,
    _gy: u32,
    _gz: u32,
    _bx: u32,
    _by: u32,
    _bz: u32,
    _smem: u32,
    stream: CUstream,
    _params: Out<*mut std::ffi::c_void>,
) -> R {
    rc(rate::launch(f as usize, stream, PTSZ, call))
}

#[inline(always)]
pub fn kernel_ex<const PTSZ: bool>(
    call: impl FnOnce() -> CUresult,
    config: In<LaunchConfig>,
    f: CUfunction,
    _params: Out<*mut std::ffi::c_void>,
    _extra: Out<*mut std::ffi::c_void>,
) -> R {
    let stream = config.get().map_or(std::ptr::null_mut(), |c| c.stream);
    rc(rate::launch(f as usize, stream, PTSZ, call))
}

#[inline(always)]
pub fn graph<const PTSZ: bool>(
    call: impl FnOnce() -> CUresult,
    exec: CUgraphExec,
    stream: CUstream,
) -> R {
    rc(rate::launch(exec as usize, stream, PTSZ, call))
}
