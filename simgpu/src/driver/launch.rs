//! Kernel launches: each occupies the device for the time the cost model gives.
//!
//! Cost model (documented in simgpu/README.md): a kernel named in a `cost.kernels` override takes
//! that long; a kernel whose name contains `simgpu_spin` takes its first (u64) parameter in ns;
//! otherwise `kernel_base + waves × wave`, waves = ceil(blocks / (SMs × resident blocks per SM)),
//! resident blocks per SM = clamp(2048 / threads per block, 1, 32). Managed memory the kernel
//! references is faulted in first (see `managed`).

use std::ffi::c_void;
use std::sync::atomic::Ordering::*;

use super::module::{blocks_per_sm, function, Function};
use std::sync::Arc;

use super::{stream_ref, Builder, R};
use crate::driver_ptds;
use crate::engine::{Op, Resource};
use crate::sim::{sim, Sim};
use crate::types::*;

/// Modelled duration of one launch, ns.
///
/// # Safety
/// `params` is the launch's kernelParams array (or NULL).
pub unsafe fn kernel_ns(
    s: &Sim,
    f: &Function,
    dev: usize,
    grid: [u32; 3],
    block: [u32; 3],
    params: *mut *mut c_void,
) -> u64 {
    if let Some(ns) = s.cfg.kernel_override(&f.name) {
        return ns;
    }
    if f.name.contains("simgpu_spin") && !params.is_null() {
        let first_is_u64 = f
            .params
            .as_ref()
            .is_none_or(|p| p.first().is_some_and(|p| p.size == 8));
        if first_is_u64 {
            // SAFETY: `params` is not NULL (checked) and is the launch's kernelParams array (this
            // fn's contract), whose element 0 points to the first argument, a u64 for this kernel
            // (checked against its parameter table when known).
            return unsafe { *(*params as *const u64) }.min(3_600_000_000_000);
        }
    }
    let c = &s.cfg.cost;
    let blocks = grid.iter().map(|&x| x as u64).product::<u64>();
    let threads: u64 = block.iter().map(|&x| x as u64).product();
    let per_wave = s.cfg.devices[dev].sm_count as u64 * blocks_per_sm(threads as u32) as u64;
    c.kernel_base_ns + blocks.div_ceil(per_wave.max(1)) * c.wave_ns
}

/// Device addresses passed as kernel arguments (only when the parameter layout is known).
fn pointer_args(f: &Function, params: *mut *mut c_void) -> Option<Vec<u64>> {
    let layout = f.params.as_ref()?;
    if params.is_null() {
        return Some(Vec::new());
    }
    Some(
        layout
            .iter()
            .enumerate()
            .filter(|(_, p)| p.size == 8)
            // SAFETY: kernelParams has one pointer per parameter of the known layout.
            .map(|(i, _)| unsafe { *(*params.add(i) as *const u64) })
            .collect(),
    )
}

/// Validates a launch and returns the builder of its stream operation. Everything that depends on
/// the caller's argument memory (duration, pointer arguments) is read now.
///
/// # Safety
/// `params` is NULL or the launch's kernelParams array: one readable pointer per kernel
/// parameter, each to that argument's value (the cuLaunchKernel contract).
pub unsafe fn kernel_op(
    f: *mut c_void,
    grid: [u32; 3],
    block: [u32; 3],
    params: *mut *mut c_void,
) -> Result<Builder, CUresult> {
    let s = sim()?;
    let func = function(f)?;
    // The device's limits (the A100-like attributes simgpu reports): 1024 threads per block,
    // block dimensions (1024, 1024, 64), grid dimensions (2^31 - 1, 65535, 65535).
    const MAX_BLOCK: [u32; 3] = [1024, 1024, 64];
    const MAX_GRID: [u32; 3] = [i32::MAX as u32, 65535, 65535];
    let within = |dims: [u32; 3], max: [u32; 3]| (0..3).all(|i| (1..=max[i]).contains(&dims[i]));
    if !within(grid, MAX_GRID)
        || !within(block, MAX_BLOCK)
        || block.iter().map(|&x| x as u64).product::<u64>() > 1024
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let dev = super::current_ctx_opt().map_or(0, |c| c.device);
    // SAFETY: `params` is NULL or the kernelParams array (this fn's contract).
    let dur = unsafe { kernel_ns(s, &func, dev, grid, block, params) };
    let ptr_args = pointer_args(&func, params);
    // SAFETY: `params` is NULL or the kernelParams array (this fn's contract).
    let written = unsafe { super::results::output(s, &func, params) };
    Ok(Arc::new(move || {
        let mut op = Op::new(Resource::Compute(dev), dur);
        op.is_kernel = true;
        op.extra = super::managed::touch_for_kernel(s, dev, ptr_args.clone());
        if let Some(out) = written.clone() {
            op = op.with_effect(move || out.write(s));
        }
        Ok(op)
    }))
}

/// Safety: as for `kernel_op` (`params` NULL or the kernelParams array).
unsafe fn launch(
    f: *mut c_void,
    grid: [u32; 3],
    block: [u32; 3],
    smem: u32,
    h: CUstream,
    params: *mut *mut c_void,
    ptds: bool,
) -> R {
    let s = sim()?;
    let r = stream_ref(h, ptds)?;
    // SAFETY: `params` is NULL or the kernelParams array (this fn's contract).
    let build = unsafe { kernel_op(f, grid, block, params)? };
    let n = s.launch_count.fetch_add(1, AcqRel) + 1;
    if let Some((nth, code)) = s.cfg.faults.launch_error {
        if nth == n {
            crate::warn!("fault injection: launch #{n} returns {code}");
            return Err(code);
        }
    }
    let node = super::graph::Params::Kernel(super::graph::KernelNode {
        func: f as usize,
        is_kernel: false,
        grid,
        block,
        shared_mem: smem,
    });
    super::submit_or_capture_params(s, &r, super::graph::NODE_KERNEL, node, move || build())
}

/// Safety: `cfg` is NULL or a readable CUlaunchConfig; `params` as for `launch`.
unsafe fn launch_ex(
    cfg: *const LaunchConfig,
    f: *mut c_void,
    params: *mut *mut c_void,
    ptds: bool,
) -> R {
    // SAFETY: `cfg` is NULL or readable (this fn's contract); `params` is passed on unchanged
    // under the same contract `launch` requires.
    unsafe {
        let c = cfg.as_ref().ok_or(CUDA_ERROR_INVALID_VALUE)?;
        launch(
            f,
            c.grid,
            c.block,
            c.shared_mem_bytes,
            c.stream,
            params,
            ptds,
        )
    }
}

driver_ptds! {
    fn cuLaunchKernel / cuLaunchKernel_ptsz(f: *mut c_void, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32,
                                           smem: u32, h: CUstream, params: *mut *mut c_void, _extra: *mut *mut c_void) |ptds| {
        launch(f, [gx, gy, gz], [bx, by, bz], smem, h, params, ptds)
    }
    fn cuLaunchCooperativeKernel / cuLaunchCooperativeKernel_ptsz(f: *mut c_void, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32,
                                           smem: u32, h: CUstream, params: *mut *mut c_void) |ptds| {
        launch(f, [gx, gy, gz], [bx, by, bz], smem, h, params, ptds)
    }
    fn cuLaunchKernelEx / cuLaunchKernelEx_ptsz(cfg: *const LaunchConfig, f: *mut c_void, params: *mut *mut c_void, _extra: *mut *mut c_void) |ptds| {
        launch_ex(cfg, f, params, ptds)
    }
}
