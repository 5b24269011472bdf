//! The launch hooks: every launch path passes the rate gate's seam (`rate.rs`) with its key (the
//! function or graph), its stream and whether it is a per-thread default-stream (`_ptsz`) call;
//! the seam runs the driver's launch. Each hook serves a call and its `_ptsz` twin (`PTSZ`, set
//! by the declaration list). The deprecated execution-control launches (`cuLaunch`,
//! `cuLaunchGrid`, `cuLaunchGridAsync`) are keyed by their function like `cuLaunchKernel`;
//! `cuLaunchCooperativeKernelMultiDevice` passes the seam once per device it launches on.

use crate::boundary::{rc, In, Out, R};
use crate::rate;
use crate::types::*;

#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn kernel<const PTSZ: bool>(
    call: impl FnOnce() -> CUresult,
    f: CUfunction,
    gx: u32,
    gy: u32,
    gz: u32,
    bx: u32,
    by: u32,
    bz: u32,
    smem: u32,
    stream: CUstream,
    params: Out<*mut std::ffi::c_void>,
    extra: Out<*mut std::ffi::c_void>,
) -> R {
    let g = crate::gate::Geometry {
        grid: [gx, gy, gz],
        params: params.raw(),
    };
    // A block range of the launch, through the kernel's sliced entry (`slicing.rs`).
    let block = [bx, by, bz];
    let range = |sliced: usize, grid: [u32; 3], kernel_params: *mut *mut std::ffi::c_void| {
        range::<PTSZ>(sliced, grid, block, smem, stream as usize, kernel_params)
    };
    rc(rate::launch_kernel(
        f,
        g,
        extra.raw(),
        stream,
        PTSZ,
        range,
        call,
    ))
}

/// One block range of a `cuLaunchKernel` (`PTSZ`: its `_ptsz` twin) through the real driver:
/// the kernel's sliced entry, the range's grid, the launch's block, shared memory and stream,
/// the kernel's arguments followed by the range's six.
fn range<const PTSZ: bool>(
    sliced: usize,
    grid: [u32; 3],
    block: [u32; 3],
    smem: u32,
    stream: usize,
    kernel_params: *mut *mut std::ffi::c_void,
) -> CUresult {
    let real = crate::driver::real();
    let launch = if PTSZ {
        real.cuLaunchKernel_ptsz
    } else {
        real.cuLaunchKernel
    };
    match launch {
        // SAFETY: the launch the program made (its stream, block and shared memory), with the
        // sliced entry of its kernel, a block range of its grid and the kernel's arguments
        // followed by the range's six (`gate::launch_kernel` builds them).
        Some(l) => unsafe {
            l(
                sliced as CUfunction,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                smem,
                stream as CUstream,
                kernel_params,
                std::ptr::null_mut(),
            )
        },
        None => CUDA_ERROR_NOT_SUPPORTED,
    }
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
    params: Out<*mut std::ffi::c_void>,
) -> R {
    rc(rate::launch(f as usize, params.raw(), stream, PTSZ, call))
}

#[inline(always)]
pub fn kernel_ex<const PTSZ: bool>(
    call: impl FnOnce() -> CUresult,
    config: In<LaunchConfig>,
    f: CUfunction,
    params: Out<*mut std::ffi::c_void>,
    _extra: Out<*mut std::ffi::c_void>,
) -> R {
    let stream = config.get().map_or(std::ptr::null_mut(), |c| c.stream);
    rc(rate::launch(f as usize, params.raw(), stream, PTSZ, call))
}

#[inline(always)]
pub fn graph<const PTSZ: bool>(
    call: impl FnOnce() -> CUresult,
    exec: CUgraphExec,
    stream: CUstream,
) -> R {
    rc(rate::launch(
        exec as usize,
        std::ptr::null_mut(),
        stream,
        PTSZ,
        call,
    ))
}

/// `cuLaunchCooperativeKernelMultiDevice`: one launch per entry of `list`, each on its stream's
/// device.
#[inline(always)]
pub fn multi_device(
    call: impl FnOnce() -> CUresult,
    list: Out<LaunchParams>,
    n: u32,
    _flags: u32,
) -> R {
    // Never more entries than devices the shim tracks (the driver rejects more than it has).
    let n = (n as usize).min(libshare_abi::MAX_DEVICES);
    // SAFETY: the API documents `launchParamsList` as `numDevices` entries (at most `n` read).
    let entries = unsafe { list.array(n) }.unwrap_or(&[]);
    let mut launches = [(0usize, std::ptr::null_mut()); libshare_abi::MAX_DEVICES];
    for (l, e) in launches.iter_mut().zip(entries) {
        *l = (e.function as usize, e.stream);
    }
    rc(rate::launch_multi(&launches[..entries.len()], call))
}

/// `cuLaunch`: a 1 × 1 grid on the NULL stream.
#[inline(always)]
pub fn legacy(call: impl FnOnce() -> CUresult, f: CUfunction) -> R {
    rc(rate::launch(
        f as usize,
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        false,
        call,
    ))
}

/// `cuLaunchGrid`: on the NULL stream.
#[inline(always)]
pub fn legacy_grid(call: impl FnOnce() -> CUresult, f: CUfunction, _gw: i32, _gh: i32) -> R {
    rc(rate::launch(
        f as usize,
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        false,
        call,
    ))
}

#[inline(always)]
pub fn legacy_grid_async(
    call: impl FnOnce() -> CUresult,
    f: CUfunction,
    _gw: i32,
    _gh: i32,
    stream: CUstream,
) -> R {
    rc(rate::launch(
        f as usize,
        std::ptr::null_mut(),
        stream,
        false,
        call,
    ))
}
