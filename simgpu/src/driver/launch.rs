//! Kernel launches: each occupies the device for the time the cost model gives.
//!
//! Cost model (documented in simgpu/README.md): a kernel named in a `cost.kernels` override takes
//! that long; a kernel whose name contains `simgpu_spin` takes its first (u64) parameter in ns;
//! otherwise `kernel_base + waves × wave`, waves = ceil(blocks / (SMs × resident blocks per SM)),
//! resident blocks per SM = clamp(2048 / threads per block, 1, 32). Managed memory the kernel
//! references is faulted in first (see `managed`).

use std::ffi::c_void;
use std::sync::atomic::Ordering::*;

use super::module::{blocks_per_sm, function};
use crate::model::module::{Function, PARAM_SPACE};
use std::sync::Arc;

use super::{stream_ref, Builder, R};
use crate::engine::{Op, Resource};
use crate::sim::{sim, Sim};
use crate::types::*;
use crate::{driver, driver_ptds};

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

/// Validates a launch on the current context's device and returns the builder of its stream
/// operation. Everything that depends on the caller's argument memory (duration, pointer
/// arguments) is read now.
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
    let dev = super::current_ctx_opt().map_or(0, |c| c.device);
    // SAFETY: this fn's contract.
    unsafe { kernel_op_on(dev, f, grid, block, params) }
}

/// `kernel_op` on device `dev` (a launch's stream's device).
///
/// # Safety
/// As for [`kernel_op`].
unsafe fn kernel_op_on(
    dev: usize,
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
    // SAFETY: `params` is NULL or the kernelParams array (this fn's contract).
    let dur = unsafe { kernel_ns(s, &func, dev, grid, block, params) };
    let ptr_args = pointer_args(&func, params);
    // SAFETY: `params` is NULL or the kernelParams array (this fn's contract).
    let written = unsafe { super::results::output(s, &func, params) };
    let name: Option<Arc<str>> = crate::engine::trace_file().map(|_| func.name.as_str().into());
    Ok(Arc::new(move || {
        let mut op = Op::new(Resource::Compute(dev), dur);
        op.is_kernel = true;
        op.name = name.clone();
        op.extra = super::memory::managed::touch_for_kernel(s, dev, ptr_args.clone());
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
    let build = unsafe { kernel_op_on(r.ctx.device, f, grid, block, params)? };
    injected_fault(s)?;
    let node = crate::model::capture::Params::Kernel(crate::model::capture::KernelNode {
        func: f as usize,
        is_kernel: false,
        grid,
        block,
        shared_mem: smem,
    });
    super::submit_or_capture_params(s, &r, crate::model::capture::NODE_KERNEL, node, move || {
        build()
    })
}

/// Counts a launch; the configured fault (`faults.launch_error`) fails the n-th.
fn injected_fault(s: &Sim) -> R {
    let n = s.launch_count.fetch_add(1, AcqRel) + 1;
    if let Some((nth, code)) = s.cfg.faults.launch_error {
        if nth == n {
            crate::warn!("fault injection: launch #{n} returns {code}");
            return Err(code);
        }
    }
    Ok(())
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

/// A legacy launch of `f`: a `grid` of the block shape set on it, with its shared size and its
/// parameter buffer, on stream `h` — through `launch`, as a cuLaunchKernel of the same
/// configuration whose kernelParams point into the buffer (at the kernel's parameter offsets;
/// for a kernel whose layout is unknown, one pointer to the buffer's start).
fn launch_legacy(f: *mut c_void, grid_w: i32, grid_h: i32, h: CUstream) -> R {
    let func = function(f)?;
    if grid_w < 1 || grid_h < 1 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // The kernel's view of the buffer: its first `size` bytes, zeros after.
    let (block, smem, mut view) = {
        let legacy = func.legacy.lock();
        let mut view = vec![0u8; PARAM_SPACE];
        let n = legacy.size.min(legacy.buf.len());
        view[..n].copy_from_slice(&legacy.buf[..n]);
        (legacy.block, legacy.shared, view)
    };
    let base = view.as_mut_ptr();
    let mut args: Vec<*mut c_void> = match &func.params {
        Some(layout) => layout
            .iter()
            .map(|p| {
                let end = p.offset as usize + p.size as usize;
                // SAFETY: `offset` < `end` <= PARAM_SPACE, the buffer's length.
                (end <= PARAM_SPACE).then(|| unsafe { base.add(p.offset as usize) } as *mut c_void)
            })
            .collect::<Option<_>>()
            .ok_or(CUDA_ERROR_INVALID_VALUE)?,
        None => vec![base as *mut c_void],
    };
    let params = if args.is_empty() {
        std::ptr::null_mut()
    } else {
        args.as_mut_ptr()
    };
    // SAFETY: `params` is NULL or one pointer per parameter of the kernel's layout, each to
    // that parameter's bytes inside `view` (bounds checked above), alive until `launch` returns
    // (which reads the arguments before returning); for an unknown layout, element 0 points to
    // the view's first byte, PARAM_SPACE readable bytes.
    unsafe {
        launch(
            f,
            [grid_w as u32, grid_h as u32, 1],
            block,
            smem,
            h,
            params,
            false,
        )
    }
}

const MULTI_DEVICE_NO_PRE_LAUNCH_SYNC: u32 = 1;
const MULTI_DEVICE_NO_POST_LAUNCH_SYNC: u32 = 2;

/// `cuLaunchCooperativeKernelMultiDevice`: each entry of `list` launched on its stream (created
/// with cuStreamCreate: no default stream), one entry per device, all with the same kernel and
/// configuration. Unless the flags say otherwise, each kernel first waits for the work before it
/// on every stream of the list, and work queued later on any of those streams waits for every
/// kernel of the launch. Everything is validated before anything is queued.
///
/// Safety: `list` is NULL or `n` readable entries, each with a kernelParams array as for `launch`.
unsafe fn launch_multi_device(list: *const LaunchParams, n: u32, flags: u32) -> R {
    let s = sim()?;
    if list.is_null() || n == 0 || n as usize > s.cfg.devices.len() || flags & !3 != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: `list` is not NULL (checked) and has `n` entries (this fn's contract).
    let entries = unsafe { std::slice::from_raw_parts(list, n as usize) };
    let first = entries[0];
    let name = function(first.function)?.name.clone();
    let mut launches = Vec::with_capacity(entries.len());
    for e in entries {
        let h = e.stream as usize;
        if h == 0 || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        let r = stream_ref(e.stream, false)?;
        if function(e.function)?.name != name
            || (e.grid, e.block, e.shared_mem_bytes)
                != (first.grid, first.block, first.shared_mem_bytes)
            || launches
                .iter()
                .any(|(o, _): &(super::StreamRef, Builder)| o.ctx.device == r.ctx.device)
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if crate::model::capture::capturing(r.id).is_some() {
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        // SAFETY: the entry's kernelParams array (this fn's contract).
        let build =
            unsafe { kernel_op_on(r.ctx.device, e.function, e.grid, e.block, e.kernel_params)? };
        launches.push((r, build));
    }
    for _ in entries {
        injected_fault(s)?;
    }
    let tails: Vec<_> = launches
        .iter()
        .map(|(r, _)| (r.id, s.engine.tail(r.id)))
        .collect();
    let mut kernels = Vec::with_capacity(launches.len());
    for (r, build) in &launches {
        let mut op = build()?;
        if flags & MULTI_DEVICE_NO_PRE_LAUNCH_SYNC == 0 {
            op.deps.extend(tails.iter().filter(|(id, _)| *id != r.id));
        }
        kernels.push((r.id, super::submit(s, r, op)));
    }
    if flags & MULTI_DEVICE_NO_POST_LAUNCH_SYNC == 0 && launches.len() > 1 {
        for (r, _) in &launches {
            let mut join = Op::marker();
            join.deps
                .extend(kernels.iter().filter(|(id, _)| *id != r.id));
            super::submit(s, r, join);
        }
    }
    Ok(())
}

driver! {
    fn cuFuncSetBlockShape(f: *mut c_void, x: i32, y: i32, z: i32) {
        let func = function(f)?;
        let dims = [x, y, z].map(|d| u32::try_from(d).ok().filter(|&d| d >= 1));
        let [Some(x), Some(y), Some(z)] = dims else {
            return Err(CUDA_ERROR_INVALID_VALUE);
        };
        func.legacy.lock().block = [x, y, z];
        Ok(())
    }
    fn cuFuncSetSharedSize(f: *mut c_void, bytes: u32) {
        function(f)?.legacy.lock().shared = bytes;
        Ok(())
    }
    fn cuParamSetSize(f: *mut c_void, bytes: u32) {
        let func = function(f)?;
        if bytes as usize > PARAM_SPACE {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        func.legacy.lock().size = bytes as usize;
        Ok(())
    }
    fn cuParamSeti(f: *mut c_void, offset: i32, value: u32) {
        function(f)?.legacy.lock().write(offset, &value.to_ne_bytes())
    }
    fn cuParamSetf(f: *mut c_void, offset: i32, value: f32) {
        function(f)?.legacy.lock().write(offset, &value.to_ne_bytes())
    }
    fn cuParamSetv(f: *mut c_void, offset: i32, ptr: *mut c_void, bytes: u32) {
        let func = function(f)?;
        if ptr.is_null() && bytes > 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let data = if bytes == 0 { &[][..] } else { std::slice::from_raw_parts(ptr as *const u8, bytes as usize) };
        let r = func.legacy.lock().write(offset, data);
        r
    }
    fn cuParamSetTexRef(f: *mut c_void, unit: i32, _tex: *mut c_void) {
        // Only CU_PARAM_TR_DEFAULT (-1) is accepted; simgpu's kernels sample nothing.
        function(f)?;
        if unit != -1 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        Ok(())
    }
    fn cuLaunch(f: *mut c_void) {
        launch_legacy(f, 1, 1, std::ptr::null_mut())
    }
    fn cuLaunchGrid(f: *mut c_void, grid_w: i32, grid_h: i32) {
        launch_legacy(f, grid_w, grid_h, std::ptr::null_mut())
    }
    fn cuLaunchGridAsync(f: *mut c_void, grid_w: i32, grid_h: i32, h: CUstream) {
        launch_legacy(f, grid_w, grid_h, h)
    }
    fn cuLaunchCooperativeKernelMultiDevice(list: *mut LaunchParams, n: u32, flags: u32) {
        launch_multi_device(list, n, flags)
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
