//! The launch hooks: every launch path passes the rate gate's seam (`rate.rs`) with its key (the
//! function or graph), its stream and whether it is a per-thread default-stream (`_ptsz`) call;
//! the seam runs the driver's launch.

use crate::boundary::{rc, In, Out, R};
use crate::rate;
use crate::types::*;

#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn kernel(
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
    rc(rate::launch(f as usize, stream, false, call))
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn kernel_ptsz(
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
    rc(rate::launch(f as usize, stream, true, call))
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn cooperative(
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
    rc(rate::launch(f as usize, stream, false, call))
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn cooperative_ptsz(
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
    rc(rate::launch(f as usize, stream, true, call))
}

fn config_stream(config: &In<LaunchConfig>) -> CUstream {
    config.get().map_or(std::ptr::null_mut(), |c| c.stream)
}

#[inline(always)]
pub fn kernel_ex(
    call: impl FnOnce() -> CUresult,
    config: In<LaunchConfig>,
    f: CUfunction,
    _params: Out<*mut std::ffi::c_void>,
    _extra: Out<*mut std::ffi::c_void>,
) -> R {
    rc(rate::launch(
        f as usize,
        config_stream(&config),
        false,
        call,
    ))
}

#[inline(always)]
pub fn kernel_ex_ptsz(
    call: impl FnOnce() -> CUresult,
    config: In<LaunchConfig>,
    f: CUfunction,
    _params: Out<*mut std::ffi::c_void>,
    _extra: Out<*mut std::ffi::c_void>,
) -> R {
    rc(rate::launch(f as usize, config_stream(&config), true, call))
}

#[inline(always)]
pub fn graph(call: impl FnOnce() -> CUresult, exec: CUgraphExec, stream: CUstream) -> R {
    rc(rate::launch(exec as usize, stream, false, call))
}

#[inline(always)]
pub fn graph_ptsz(call: impl FnOnce() -> CUresult, exec: CUgraphExec, stream: CUstream) -> R {
    rc(rate::launch(exec as usize, stream, true, call))
}
