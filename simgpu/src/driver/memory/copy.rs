//! Copies and memsets (`cuMemcpy*`, `cuMemset*`, synchronous, asynchronous and per-thread
//! default stream): each is one engine operation that moves real bytes between host memory,
//! device allocations and CUDA arrays, on the copy engine of its direction (host to device,
//! device to host) or on the device's compute resource (device to device, memsets). Where an
//! address lies is read from the allocation table (`super::device_range`).

use std::ffi::c_void;
use std::sync::atomic::Ordering::*;

use super::{device_range, writable_device_range, Copy3D, Kind};
use crate::driver::{stream_ref, submit_or_capture, submit_sync, R};
use crate::driver_ptds;
use crate::engine::{Op, Resource};
use crate::sim::{sim, Sim};
use crate::types::*;

#[derive(Clone, Copy)]
struct SendPtr(u64);
// SAFETY: as for Send; graph builders share these addresses between threads.
unsafe impl Sync for SendPtr {}
// SAFETY: the addresses are plain memory owned by the application or by simgpu's mappings.
unsafe impl Send for SendPtr {}

fn copy_cost(s: &Sim, bytes: u64, bw: u64) -> u64 {
    s.cfg.cost.copy_base_ns + (bytes as u128 * 1_000_000_000 / bw.max(1) as u128) as u64
}

/// Where a unified-address copy goes.
fn classify(s: &Sim, p: u64, len: u64) -> Result<Option<usize>, CUresult> {
    match device_range(s, p, len) {
        Some((Kind::Device | Kind::Managed | Kind::Array, d)) => Ok(Some(d)),
        // Inside a VMM reservation only mapped pages hold memory (touching the rest would fault).
        Some((Kind::Reserved, d)) if super::vmm::is_mapped(p, len) => Ok(Some(d)),
        Some((Kind::Reserved, _)) => Err(CUDA_ERROR_INVALID_VALUE),
        Some(_) => Ok(None),
        None => {
            // A device-looking address that is not inside an allocation would crash the job.
            if s.mem.lock().find(p).is_some() {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            Ok(None)
        }
    }
}

fn is_pinned(s: &Sim, p: u64, len: u64) -> bool {
    matches!(
        device_range(s, p, len),
        Some((Kind::Host | Kind::Registered, _))
    )
}

/// Builds the operation that copies `len` bytes from `src` to `dst` (either side host or device).
/// `stage` copies a pageable host source at enqueue time (asynchronous host-to-device copies).
fn copy_op(s: &Sim, dst: u64, src: u64, len: u64, stage: bool) -> Result<Op, CUresult> {
    let dd = classify(s, dst, len)?;
    let sd = classify(s, src, len)?;
    let c = &s.cfg.cost;
    let (res, dur) = match (sd, dd) {
        (None, Some(d)) => (Resource::H2D(d), copy_cost(s, len, c.pcie_bytes_per_s)),
        (Some(d), None) => (Resource::D2H(d), copy_cost(s, len, c.pcie_bytes_per_s)),
        (Some(d), Some(_)) => (
            Resource::Compute(d),
            copy_cost(s, len, c.hbm_bytes_per_s / 2),
        ),
        (None, None) => (Resource::None, 0),
    };
    if let Resource::H2D(d) | Resource::D2H(d) | Resource::Compute(d) = res {
        s.shared.dev(d).copies.fetch_add(1, AcqRel);
        s.shared.dev(d).copy_bytes.fetch_add(len, AcqRel);
    }
    let (dst, src) = (SendPtr(dst), SendPtr(src));
    let mut op = if stage && sd.is_none() && !is_pinned(s, src.0, len) {
        // SAFETY: the caller promised `len` readable bytes at `src` for the duration of the call.
        let data = unsafe { std::slice::from_raw_parts(src.0 as *const u8, len as usize) }.to_vec();
        Op::new(res, dur).with_effect(move || {
            let dst = dst;
            // SAFETY: dst was checked to lie inside a live allocation.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst.0 as *mut u8, data.len()) }
        })
    } else {
        Op::new(res, dur).with_effect(move || {
            let (dst, src) = (dst, src);
            // SAFETY: device sides checked against the allocation table; host sides are the
            // caller's buffers, valid until the copy completes (CUDA's contract).
            unsafe { std::ptr::copy(src.0 as *const u8, dst.0 as *mut u8, len as usize) }
        })
    };
    if matches!(res, Resource::H2D(_) | Resource::D2H(_)) {
        op.pcie_bytes = len;
    }
    Ok(op)
}

unsafe fn memcpy(dst: u64, src: u64, len: u64, stream: Option<(CUstream, bool)>, ptds: bool) -> R {
    let s = sim()?;
    if len == 0 {
        return Ok(());
    }
    match stream {
        None => {
            let sr = stream_ref(std::ptr::null_mut(), ptds)?;
            let op = copy_op(s, dst, src, len, false)?;
            submit_sync(s, &sr, op);
        }
        Some((h, ptds)) => {
            let sr = stream_ref(h, ptds)?;
            let capturing = crate::model::capture::capturing(sr.id).is_some();
            // Device to pageable host memory is synchronous in CUDA: the call returns once the
            // bytes are there (applications rely on it).
            if !capturing
                && classify(s, src, len)?.is_some()
                && classify(s, dst, len)?.is_none()
                && !is_pinned(s, dst, len)
            {
                let op = copy_op(s, dst, src, len, false)?;
                submit_sync(s, &sr, op);
                return Ok(());
            }
            // A captured copy reads its source when the graph runs, so it is not staged.
            let node = crate::model::capture::NODE_MEMCPY;
            submit_or_capture(s, &sr, node, move || copy_op(s, dst, src, len, !capturing))?;
        }
    }
    Ok(())
}

/// One side of a 3D copy: address of its first byte, row pitch, bytes between slices.
fn copy_side(
    mt: u32,
    host: u64,
    dev: u64,
    array: *mut c_void,
    (x, y, z): (u64, u64, u64),
    (pitch, height): (u64, u64),
    (w, h, depth): (u64, u64, u64),
) -> Result<(u64, u64, u64), CUresult> {
    if mt == CU_MEMORYTYPE_ARRAY {
        // A CUDA array: its own pitch and height; the region must lie inside it.
        let a = super::array::array(array)?;
        let (ap, rows) = (a.pitch(), a.rows());
        let inside =
            |at: u64, len: u64, limit: u64| at.checked_add(len).is_some_and(|e| e <= limit);
        if !inside(x, w, ap) || !inside(y, h, rows) || !inside(z, depth, a.slices()) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        return Ok((a.base + z * ap * rows + y * ap + x, ap, ap * rows));
    }
    let base = match mt {
        CU_MEMORYTYPE_HOST => host,
        CU_MEMORYTYPE_DEVICE => dev,
        CU_MEMORYTYPE_UNIFIED => {
            if dev != 0 {
                dev
            } else {
                host
            }
        }
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    // Pitched memory: pitch × the allocation's height (at least the copied height) per slice.
    let p = pitch.max(w);
    let slice = p * height.max(h);
    Ok((base + z * slice + y * p + x, p, slice))
}

/// One operation that copies a (pitched) 3D region: `depth` slices of `height` rows of
/// `width_in_bytes`, between host memory, device memory and CUDA arrays.
pub fn copy3d_op(s: &Sim, c: Copy3D) -> Result<Op, CUresult> {
    let p = c.0;
    let (w, h, depth) = (
        p.width_in_bytes as u64,
        p.height as u64,
        p.depth.max(1) as u64,
    );
    let (src0, sp, ss) = copy_side(
        p.src_memory_type,
        p.src_host as u64,
        p.src_device,
        p.src_array,
        (p.src_x_in_bytes as u64, p.src_y as u64, p.src_z as u64),
        (p.src_pitch as u64, p.src_height as u64),
        (w, h, depth),
    )?;
    let (dst0, dp, ds) = copy_side(
        p.dst_memory_type,
        p.dst_host as u64,
        p.dst_device,
        p.dst_array,
        (p.dst_x_in_bytes as u64, p.dst_y as u64, p.dst_z as u64),
        (p.dst_pitch as u64, p.dst_height as u64),
        (w, h, depth),
    )?;
    if w == 0 || h == 0 {
        return Ok(Op::marker());
    }
    // Validate both extents (first and last row), then one op for the total byte count.
    let mut op = copy_op(s, dst0, src0, w, false)?;
    classify(s, dst0 + (depth - 1) * ds + (h - 1) * dp, w)?;
    classify(s, src0 + (depth - 1) * ss + (h - 1) * sp, w)?;
    let total = w * h * depth;
    op.dur_ns = match op.resource {
        Resource::None => 0,
        Resource::Compute(_) => copy_cost(s, total, s.cfg.cost.hbm_bytes_per_s / 2),
        _ => copy_cost(s, total, s.cfg.cost.pcie_bytes_per_s),
    };
    let (d, sr0) = (SendPtr(dst0), SendPtr(src0));
    op.effect = Some(Box::new(move || {
        let (d, sr0) = (d, sr0);
        for z in 0..depth {
            for row in 0..h {
                // SAFETY: extents validated above (device sides) or the caller's (host sides).
                unsafe {
                    std::ptr::copy(
                        (sr0.0 + z * ss + row * sp) as *const u8,
                        (d.0 + z * ds + row * dp) as *mut u8,
                        w as usize,
                    )
                }
            }
        }
    }));
    Ok(op)
}

unsafe fn memcpy3d(c: Copy3D, stream: Option<(CUstream, bool)>, ptds: bool) -> R {
    let s = sim()?;
    match stream {
        None => submit_sync(
            s,
            &stream_ref(std::ptr::null_mut(), ptds)?,
            copy3d_op(s, c)?,
        ),
        Some((h, pt)) => submit_or_capture(
            s,
            &stream_ref(h, pt)?,
            crate::model::capture::NODE_MEMCPY,
            move || copy3d_op(s, c),
        )?,
    }
    Ok(())
}

/// One operation setting `rows` rows of `count` elements of `elem` bytes (1, 2 or 4), `pitch`
/// bytes apart, to `value`.
pub fn memset_op(
    s: &Sim,
    dst: u64,
    pitch: u64,
    value: u32,
    elem: u64,
    count: u64,
    rows: u64,
) -> Result<Op, CUresult> {
    let width = count * elem;
    if width == 0 || rows == 0 {
        return Ok(Op::marker());
    }
    let pitch = if rows == 1 { width } else { pitch };
    let Some(dev) = writable_device_range(s, dst, pitch * (rows - 1) + width) else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let dur = copy_cost(s, width * rows, s.cfg.cost.hbm_bytes_per_s);
    let d = SendPtr(dst);
    Ok(Op::new(Resource::Compute(dev), dur).with_effect(move || {
        let d = d;
        for r in 0..rows {
            let row = (d.0 + r * pitch) as *mut u8;
            // SAFETY: extent validated against the allocation table above.
            unsafe {
                match elem {
                    1 => std::ptr::write_bytes(row, value as u8, count as usize),
                    2 => std::slice::from_raw_parts_mut(row as *mut u16, count as usize)
                        .fill(value as u16),
                    _ => {
                        std::slice::from_raw_parts_mut(row as *mut u32, count as usize).fill(value)
                    }
                }
            }
        }
    }))
}

#[allow(clippy::too_many_arguments)]
unsafe fn memset(
    dst: u64,
    pitch: u64,
    value: u32,
    elem: u64,
    count: u64,
    rows: u64,
    stream: Option<(CUstream, bool)>,
    ptds: bool,
) -> R {
    let s = sim()?;
    match stream {
        None => submit_sync(
            s,
            &stream_ref(std::ptr::null_mut(), ptds)?,
            memset_op(s, dst, pitch, value, elem, count, rows)?,
        ),
        Some((h, pt)) => submit_or_capture(
            s,
            &stream_ref(h, pt)?,
            crate::model::capture::NODE_MEMSET,
            move || memset_op(s, dst, pitch, value, elem, count, rows),
        )?,
    }
    Ok(())
}

/// The contexts of a peer copy must be live (any two devices are peers on simgpu).
fn peer_contexts(dst: CUcontext, src: CUcontext) -> R {
    for c in [dst, src] {
        if c.is_null() {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        crate::driver::ctx_from(c)?;
    }
    Ok(())
}

/// A `CUDA_MEMCPY3D_PEER` as a 3D copy: the two layouts are the same except that the peer form
/// has the source and destination contexts where `CUDA_MEMCPY3D` has its reserved pointers.
///
/// Safety: `p` is NULL or points to a readable `CUDA_MEMCPY3D_PEER`.
unsafe fn peer_copy(p: *const c_void) -> Result<Copy3D, CUresult> {
    // SAFETY: p is NULL or points to a CUDA_MEMCPY3D_PEER (this fn's contract), which has
    // Memcpy3D's size and layout.
    let mut c = *unsafe { (p as *const Memcpy3D).as_ref() }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    for ctx in [c.reserved0, c.reserved1] {
        if !ctx.is_null() {
            crate::driver::ctx_from(ctx as CUcontext)?;
        }
    }
    c.reserved0 = std::ptr::null_mut();
    c.reserved1 = std::ptr::null_mut();
    Ok(Copy3D(c))
}

/// The address of byte `off` of an array, if `n` bytes from there lie inside it.
fn array_at(a: *mut c_void, off: usize, n: usize) -> Result<u64, CUresult> {
    let a = super::array::array(a)?;
    if (off as u64)
        .checked_add(n as u64)
        .is_none_or(|end| end > a.size())
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(a.base + off as u64)
}

driver_ptds! {
    fn cuMemcpy / cuMemcpy_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize) |ptds| {
        memcpy(dst, src, n as u64, None, ptds)
    }
    fn cuMemcpyHtoD_v2 / cuMemcpyHtoD_v2_ptds(dst: CUdeviceptr, src: *const c_void, n: usize) |ptds| {
        memcpy(dst, src as u64, n as u64, None, ptds)
    }
    fn cuMemcpyDtoH_v2 / cuMemcpyDtoH_v2_ptds(dst: *mut c_void, src: CUdeviceptr, n: usize) |ptds| {
        memcpy(dst as u64, src, n as u64, None, ptds)
    }
    fn cuMemcpyDtoD_v2 / cuMemcpyDtoD_v2_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize) |ptds| {
        memcpy(dst, src, n as u64, None, ptds)
    }
    fn cuMemcpyPeer / cuMemcpyPeer_ptds(dst: CUdeviceptr, dc: CUcontext, src: CUdeviceptr, sc: CUcontext, n: usize) |ptds| {
        peer_contexts(dc, sc)?;
        memcpy(dst, src, n as u64, None, ptds)
    }
    fn cuMemcpy3DPeer / cuMemcpy3DPeer_ptds(p: *const c_void) |ptds| {
        memcpy3d(peer_copy(p)?, None, ptds)
    }
    fn cuMemcpy3DPeerAsync / cuMemcpy3DPeerAsync_ptsz(p: *const c_void, h: CUstream) |ptds| {
        memcpy3d(peer_copy(p)?, Some((h, ptds)), ptds)
    }
    fn cuMemcpyHtoA_v2 / cuMemcpyHtoA_v2_ptds(a: *mut c_void, off: usize, src: *const c_void, n: usize) |ptds| {
        memcpy(array_at(a, off, n)?, src as u64, n as u64, None, ptds)
    }
    fn cuMemcpyAtoH_v2 / cuMemcpyAtoH_v2_ptds(dst: *mut c_void, a: *mut c_void, off: usize, n: usize) |ptds| {
        memcpy(dst as u64, array_at(a, off, n)?, n as u64, None, ptds)
    }
    fn cuMemcpyDtoA_v2 / cuMemcpyDtoA_v2_ptds(a: *mut c_void, off: usize, src: CUdeviceptr, n: usize) |ptds| {
        memcpy(array_at(a, off, n)?, src, n as u64, None, ptds)
    }
    fn cuMemcpyAtoD_v2 / cuMemcpyAtoD_v2_ptds(dst: CUdeviceptr, a: *mut c_void, off: usize, n: usize) |ptds| {
        memcpy(dst, array_at(a, off, n)?, n as u64, None, ptds)
    }
    fn cuMemcpyAtoA_v2 / cuMemcpyAtoA_v2_ptds(da: *mut c_void, doff: usize, sa: *mut c_void, soff: usize, n: usize) |ptds| {
        memcpy(array_at(da, doff, n)?, array_at(sa, soff, n)?, n as u64, None, ptds)
    }
    fn cuMemcpyHtoAAsync_v2 / cuMemcpyHtoAAsync_v2_ptsz(a: *mut c_void, off: usize, src: *const c_void, n: usize, h: CUstream) |ptds| {
        memcpy(array_at(a, off, n)?, src as u64, n as u64, Some((h, ptds)), ptds)
    }
    fn cuMemcpyAtoHAsync_v2 / cuMemcpyAtoHAsync_v2_ptsz(dst: *mut c_void, a: *mut c_void, off: usize, n: usize, h: CUstream) |ptds| {
        memcpy(dst as u64, array_at(a, off, n)?, n as u64, Some((h, ptds)), ptds)
    }
    fn cuMemcpyAsync / cuMemcpyAsync_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, h: CUstream) |ptds| {
        memcpy(dst, src, n as u64, Some((h, ptds)), ptds)
    }
    fn cuMemcpyHtoDAsync_v2 / cuMemcpyHtoDAsync_v2_ptsz(dst: CUdeviceptr, src: *const c_void, n: usize, h: CUstream) |ptds| {
        memcpy(dst, src as u64, n as u64, Some((h, ptds)), ptds)
    }
    fn cuMemcpyDtoHAsync_v2 / cuMemcpyDtoHAsync_v2_ptsz(dst: *mut c_void, src: CUdeviceptr, n: usize, h: CUstream) |ptds| {
        memcpy(dst as u64, src, n as u64, Some((h, ptds)), ptds)
    }
    fn cuMemcpyDtoDAsync_v2 / cuMemcpyDtoDAsync_v2_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, h: CUstream) |ptds| {
        memcpy(dst, src, n as u64, Some((h, ptds)), ptds)
    }
    fn cuMemcpyPeerAsync / cuMemcpyPeerAsync_ptsz(dst: CUdeviceptr, dc: CUcontext, src: CUdeviceptr, sc: CUcontext, n: usize, h: CUstream) |ptds| {
        peer_contexts(dc, sc)?;
        memcpy(dst, src, n as u64, Some((h, ptds)), ptds)
    }
    fn cuMemcpy2D_v2 / cuMemcpy2D_v2_ptds(p: *const Memcpy2D) |ptds| {
        memcpy3d(Copy3D::from_2d(p.as_ref().ok_or(CUDA_ERROR_INVALID_VALUE)?), None, ptds)
    }
    fn cuMemcpy2DUnaligned_v2 / cuMemcpy2DUnaligned_v2_ptds(p: *const Memcpy2D) |ptds| {
        memcpy3d(Copy3D::from_2d(p.as_ref().ok_or(CUDA_ERROR_INVALID_VALUE)?), None, ptds)
    }
    fn cuMemcpy2DAsync_v2 / cuMemcpy2DAsync_v2_ptsz(p: *const Memcpy2D, h: CUstream) |ptds| {
        memcpy3d(Copy3D::from_2d(p.as_ref().ok_or(CUDA_ERROR_INVALID_VALUE)?), Some((h, ptds)), ptds)
    }
    fn cuMemcpy3D_v2 / cuMemcpy3D_v2_ptds(p: *const Memcpy3D) |ptds| {
        memcpy3d(Copy3D(*p.as_ref().ok_or(CUDA_ERROR_INVALID_VALUE)?), None, ptds)
    }
    fn cuMemcpy3DAsync_v2 / cuMemcpy3DAsync_v2_ptsz(p: *const Memcpy3D, h: CUstream) |ptds| {
        memcpy3d(Copy3D(*p.as_ref().ok_or(CUDA_ERROR_INVALID_VALUE)?), Some((h, ptds)), ptds)
    }
    fn cuMemsetD8_v2 / cuMemsetD8_v2_ptds(d: CUdeviceptr, v: u8, n: usize) |ptds| {
        memset(d, 0, v as u32, 1, n as u64, 1, None, ptds)
    }
    fn cuMemsetD16_v2 / cuMemsetD16_v2_ptds(d: CUdeviceptr, v: u16, n: usize) |ptds| {
        memset(d, 0, v as u32, 2, n as u64, 1, None, ptds)
    }
    fn cuMemsetD32_v2 / cuMemsetD32_v2_ptds(d: CUdeviceptr, v: u32, n: usize) |ptds| {
        memset(d, 0, v, 4, n as u64, 1, None, ptds)
    }
    fn cuMemsetD2D8_v2 / cuMemsetD2D8_v2_ptds(d: CUdeviceptr, pitch: usize, v: u8, w: usize, h: usize) |ptds| {
        memset(d, pitch as u64, v as u32, 1, w as u64, h as u64, None, ptds)
    }
    fn cuMemsetD2D16_v2 / cuMemsetD2D16_v2_ptds(d: CUdeviceptr, pitch: usize, v: u16, w: usize, h: usize) |ptds| {
        memset(d, pitch as u64, v as u32, 2, w as u64, h as u64, None, ptds)
    }
    fn cuMemsetD2D32_v2 / cuMemsetD2D32_v2_ptds(d: CUdeviceptr, pitch: usize, v: u32, w: usize, h: usize) |ptds| {
        memset(d, pitch as u64, v, 4, w as u64, h as u64, None, ptds)
    }
    fn cuMemsetD8Async / cuMemsetD8Async_ptsz(d: CUdeviceptr, v: u8, n: usize, s: CUstream) |ptds| {
        memset(d, 0, v as u32, 1, n as u64, 1, Some((s, ptds)), ptds)
    }
    fn cuMemsetD16Async / cuMemsetD16Async_ptsz(d: CUdeviceptr, v: u16, n: usize, s: CUstream) |ptds| {
        memset(d, 0, v as u32, 2, n as u64, 1, Some((s, ptds)), ptds)
    }
    fn cuMemsetD32Async / cuMemsetD32Async_ptsz(d: CUdeviceptr, v: u32, n: usize, s: CUstream) |ptds| {
        memset(d, 0, v, 4, n as u64, 1, Some((s, ptds)), ptds)
    }
    fn cuMemsetD2D8Async / cuMemsetD2D8Async_ptsz(d: CUdeviceptr, pitch: usize, v: u8, w: usize, h: usize, s: CUstream) |ptds| {
        memset(d, pitch as u64, v as u32, 1, w as u64, h as u64, Some((s, ptds)), ptds)
    }
    fn cuMemsetD2D16Async / cuMemsetD2D16Async_ptsz(d: CUdeviceptr, pitch: usize, v: u16, w: usize, h: usize, s: CUstream) |ptds| {
        memset(d, pitch as u64, v as u32, 2, w as u64, h as u64, Some((s, ptds)), ptds)
    }
    fn cuMemsetD2D32Async / cuMemsetD2D32Async_ptsz(d: CUdeviceptr, pitch: usize, v: u32, w: usize, h: usize, s: CUstream) |ptds| {
        memset(d, pitch as u64, v, 4, w as u64, h as u64, Some((s, ptds)), ptds)
    }
}
