//! Stream capture status. Capturing CUDA graphs is not simulated yet: streams report that they
//! are not capturing, and the capture/graph entry points are stubs (CUDA_ERROR_NOT_SUPPORTED).

use std::ffi::c_void;

use super::{out, stream_ref, R};
use crate::types::*;
use crate::{driver, driver_ptds};

static CAPTURE_MODE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

unsafe fn not_capturing(h: CUstream, ptds: bool, status: *mut u32, id: *mut u64) -> R {
    stream_ref(h, ptds)?;
    out(status, 0)?; // CU_STREAM_CAPTURE_STATUS_NONE
    if !id.is_null() {
        *id = 0;
    }
    Ok(())
}

driver! {
    fn cuThreadExchangeStreamCaptureMode(mode: *mut u32) {
        if mode.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        *mode = CAPTURE_MODE.swap(*mode, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

driver_ptds! {
    fn cuStreamIsCapturing / cuStreamIsCapturing_ptsz(h: CUstream, status: *mut u32) |ptds| {
        not_capturing(h, ptds, status, std::ptr::null_mut())
    }
    fn cuStreamGetCaptureInfo / cuStreamGetCaptureInfo_ptsz(h: CUstream, status: *mut u32, id: *mut u64) |ptds| {
        not_capturing(h, ptds, status, id)
    }
    fn cuStreamGetCaptureInfo_v2 / cuStreamGetCaptureInfo_v2_ptsz(h: CUstream, status: *mut u32, id: *mut u64,
        graph: *mut *mut c_void, deps: *mut *const c_void, n: *mut usize) |ptds| {
        not_capturing(h, ptds, status, id)?;
        clear(graph, deps, std::ptr::null_mut(), n);
        Ok(())
    }
    fn cuStreamGetCaptureInfo_v3 / cuStreamGetCaptureInfo_v3_ptsz(h: CUstream, status: *mut u32, id: *mut u64,
        graph: *mut *mut c_void, deps: *mut *const c_void, edges: *mut *const c_void, n: *mut usize) |ptds| {
        not_capturing(h, ptds, status, id)?;
        clear(graph, deps, edges, n);
        Ok(())
    }
}

unsafe fn clear(
    graph: *mut *mut c_void,
    deps: *mut *const c_void,
    edges: *mut *const c_void,
    n: *mut usize,
) {
    if !graph.is_null() {
        *graph = std::ptr::null_mut();
    }
    if !deps.is_null() {
        *deps = std::ptr::null();
    }
    if !edges.is_null() {
        *edges = std::ptr::null();
    }
    if !n.is_null() {
        *n = 0;
    }
}
