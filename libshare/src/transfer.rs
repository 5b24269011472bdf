//! The memset and device-to-device copy hooks: work the device runs like a kernel, so each call
//! passes the rate gate's seam (`rate::transfer`) as a launch does: counted on the current
//! device (production: nothing more), gated and timed for an opportunistic process, keyed by
//! its kind and priced by its bytes until timed. Each hook serves a call and its per-thread
//! twin (`PTSZ`: `_ptds` for the synchronous forms, `_ptsz` for the `Async` ones, set by the
//! declaration list); `ELEM` is a memset's element size in bytes. The synchronous forms run
//! on the NULL stream (the per-thread one for `_ptds`), gated the same way before the call.
//! `cuMemcpy`/`cuMemcpyAsync` (unified addressing) are gated only when both pointers are device
//! memory, asked of the driver on the opportunistic path only. Graph memset and copy nodes run
//! inside graph launches, gated as those.

use crate::boundary::{rc, R};
use crate::ops::DriverOps;
use crate::rate::{self, COPY_D2D, MEMSET};
use crate::types::*;

const NULL: CUstream = std::ptr::null_mut();

fn always() -> bool {
    true
}

/// `cuMemsetD{8,16,32}` (v1: 32-bit pointer and count).
#[inline(always)]
pub fn memset_v1<const ELEM: u64>(
    call: impl FnOnce() -> CUresult,
    _d: u32,
    _v: impl Copy,
    n: u32,
) -> R {
    rc(rate::transfer(
        MEMSET,
        n as u64 * ELEM,
        NULL,
        false,
        always,
        call,
    ))
}

/// `cuMemsetD{8,16,32}_v2` and `_v2_ptds`.
#[inline(always)]
pub fn memset<const ELEM: u64, const PTSZ: bool>(
    call: impl FnOnce() -> CUresult,
    _d: CUdeviceptr,
    _v: impl Copy,
    n: usize,
) -> R {
    rc(rate::transfer(
        MEMSET,
        bytes(n, ELEM),
        NULL,
        PTSZ,
        always,
        call,
    ))
}

/// `cuMemsetD{8,16,32}Async` and `_ptsz`.
#[inline(always)]
pub fn memset_async<const ELEM: u64, const PTSZ: bool>(
    call: impl FnOnce() -> CUresult,
    _d: CUdeviceptr,
    _v: impl Copy,
    n: usize,
    stream: CUstream,
) -> R {
    rc(rate::transfer(
        MEMSET,
        bytes(n, ELEM),
        stream,
        PTSZ,
        always,
        call,
    ))
}

/// `cuMemsetD2D{8,16,32}` (v1).
#[inline(always)]
pub fn memset_2d_v1<const ELEM: u64>(
    call: impl FnOnce() -> CUresult,
    _d: u32,
    _pitch: u32,
    _v: impl Copy,
    w: u32,
    h: u32,
) -> R {
    let n = (w as u64).saturating_mul(h as u64);
    rc(rate::transfer(
        MEMSET,
        n.saturating_mul(ELEM),
        NULL,
        false,
        always,
        call,
    ))
}

/// `cuMemsetD2D{8,16,32}_v2` and `_v2_ptds`.
#[inline(always)]
pub fn memset_2d<const ELEM: u64, const PTSZ: bool>(
    call: impl FnOnce() -> CUresult,
    _d: CUdeviceptr,
    _pitch: usize,
    _v: impl Copy,
    w: usize,
    h: usize,
) -> R {
    let n = bytes(w, 1).saturating_mul(h as u64);
    rc(rate::transfer(
        MEMSET,
        n.saturating_mul(ELEM),
        NULL,
        PTSZ,
        always,
        call,
    ))
}

/// `cuMemsetD2D{8,16,32}Async` and `_ptsz`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn memset_2d_async<const ELEM: u64, const PTSZ: bool>(
    call: impl FnOnce() -> CUresult,
    _d: CUdeviceptr,
    _pitch: usize,
    _v: impl Copy,
    w: usize,
    h: usize,
    stream: CUstream,
) -> R {
    let n = bytes(w, 1).saturating_mul(h as u64);
    rc(rate::transfer(
        MEMSET,
        n.saturating_mul(ELEM),
        stream,
        PTSZ,
        always,
        call,
    ))
}

/// `cuMemcpyDtoD` (v1).
#[inline(always)]
pub fn dtod_v1(call: impl FnOnce() -> CUresult, _dst: u32, _src: u32, n: u32) -> R {
    rc(rate::transfer(
        COPY_D2D, n as u64, NULL, false, always, call,
    ))
}

/// `cuMemcpyDtoD_v2` and `_v2_ptds`.
#[inline(always)]
pub fn dtod<const PTSZ: bool>(
    call: impl FnOnce() -> CUresult,
    _dst: CUdeviceptr,
    _src: CUdeviceptr,
    n: usize,
) -> R {
    rc(rate::transfer(
        COPY_D2D,
        bytes(n, 1),
        NULL,
        PTSZ,
        always,
        call,
    ))
}

/// `cuMemcpyDtoDAsync` (v1).
#[inline(always)]
pub fn dtod_async_v1(
    call: impl FnOnce() -> CUresult,
    _dst: u32,
    _src: u32,
    n: u32,
    stream: CUstream,
) -> R {
    rc(rate::transfer(
        COPY_D2D, n as u64, stream, false, always, call,
    ))
}

/// `cuMemcpyDtoDAsync_v2` and `_v2_ptsz`.
#[inline(always)]
pub fn dtod_async<const PTSZ: bool>(
    call: impl FnOnce() -> CUresult,
    _dst: CUdeviceptr,
    _src: CUdeviceptr,
    n: usize,
    stream: CUstream,
) -> R {
    rc(rate::transfer(
        COPY_D2D,
        bytes(n, 1),
        stream,
        PTSZ,
        always,
        call,
    ))
}

/// Whether a unified-addressing copy is device to device (the driver's answer for each pointer).
fn device_to_device(dst: CUdeviceptr, src: CUdeviceptr) -> bool {
    let ops: &dyn DriverOps = &crate::ops::REAL;
    ops.pointer_on_device(dst) && ops.pointer_on_device(src)
}

/// `cuMemcpy` and `cuMemcpy_ptds`: gated when both pointers are device memory.
#[inline(always)]
pub fn copy<const PTSZ: bool>(
    call: impl FnOnce() -> CUresult,
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
) -> R {
    let d2d = || device_to_device(dst, src);
    rc(rate::transfer(COPY_D2D, bytes(n, 1), NULL, PTSZ, d2d, call))
}

/// `cuMemcpyAsync` and `cuMemcpyAsync_ptsz`: gated when both pointers are device memory.
#[inline(always)]
pub fn copy_async<const PTSZ: bool>(
    call: impl FnOnce() -> CUresult,
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    stream: CUstream,
) -> R {
    let d2d = || device_to_device(dst, src);
    rc(rate::transfer(
        COPY_D2D,
        bytes(n, 1),
        stream,
        PTSZ,
        d2d,
        call,
    ))
}

/// `n` elements of `elem` bytes (saturating: a size the driver will reject anyway).
#[inline(always)]
fn bytes(n: usize, elem: u64) -> u64 {
    (n as u64).saturating_mul(elem)
}
