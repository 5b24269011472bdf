//! The launch hooks: every launch path passes the rate gate's seam (`rate.rs`) with its stream
//! and grid, then the driver's launch runs.

use crate::boundary::{rc, In, Out, R};
use crate::rate;
use crate::types::*;

fn blocks(gx: u32, gy: u32, gz: u32) -> u64 {
    gx as u64 * gy as u64 * gz as u64
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn kernel(
    call: impl FnOnce() -> CUresult,
    _f: CUfunction,
    gx: u32,
    gy: u32,
    gz: u32,
    _bx: u32,
    _by: u32,
    _bz: u32,
    _smem: u32,
    stream: CUstream,
    _params: Out<*mut std::ffi::c_void>,
    _extra: Out<*mut std::ffi::c_void>,
) -> R {
    rate::admit(stream, blocks(gx, gy, gz));
    rc(call())
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn cooperative(
    call: impl FnOnce() -> CUresult,
    _f: CUfunction,
    gx: u32,
    gy: u32,
    gz: u32,
    _bx: u32,
    _by: u32,
    _bz: u32,
    _smem: u32,
    stream: CUstream,
    _params: Out<*mut std::ffi::c_void>,
) -> R {
    rate::admit(stream, blocks(gx, gy, gz));
    rc(call())
}

#[inline(always)]
pub fn kernel_ex(
    call: impl FnOnce() -> CUresult,
    config: In<LaunchConfig>,
    _f: CUfunction,
    _params: Out<*mut std::ffi::c_void>,
    _extra: Out<*mut std::ffi::c_void>,
) -> R {
    let (stream, grid) = config.get().map_or((std::ptr::null_mut(), 0), |c| {
        (c.stream, blocks(c.grid[0], c.grid[1], c.grid[2]))
    });
    rate::admit(stream, grid);
    rc(call())
}

#[inline(always)]
pub fn graph(call: impl FnOnce() -> CUresult, _exec: CUgraphExec, stream: CUstream) -> R {
    rate::admit(stream, 0);
    rc(call())
}
