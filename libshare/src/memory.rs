//! Memory quota enforcement. Every allocation path reserves its bytes in the container's shared
//! state with one atomic *before* calling the driver, releases them if the driver fails, and on
//! free. Over quota → `CUDA_ERROR_OUT_OF_MEMORY`, exactly what the driver returns when a GPU is
//! full, so PyTorch's caching allocator frees its cache, retries, and raises OutOfMemoryError.
//! `cuMemGetInfo` / `cuDeviceTotalMem` report the quota as the device's memory.

use std::ffi::{c_uint, c_void};
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering::*};

use crate::state::{shim, Allocations, Shim};
use crate::types::*;

static ALLOCS: AtomicPtr<Allocations> = AtomicPtr::new(std::ptr::null_mut());
static HANDLES: AtomicPtr<Allocations> = AtomicPtr::new(std::ptr::null_mut());
static ARRAYS: AtomicPtr<Allocations> = AtomicPtr::new(std::ptr::null_mut());

fn table(slot: &AtomicPtr<Allocations>) -> &'static Allocations {
    let p = slot.load(Acquire);
    if !p.is_null() {
        // SAFETY: only pointers from `Allocations::new` (leaked, never freed) are stored.
        return unsafe { &*p };
    }
    let fresh = Allocations::new() as *const Allocations as *mut Allocations;
    match slot.compare_exchange(std::ptr::null_mut(), fresh, AcqRel, Acquire) {
        // SAFETY: `fresh` comes from `Allocations::new`: leaked, never freed.
        Ok(_) => unsafe { &*fresh },
        // SAFETY: another thread installed one first, also from `Allocations::new` (ours
        // leaks: rare, small).
        Err(other) => unsafe { &*other },
    }
}

/// Live allocations by device pointer.
fn allocs() -> &'static Allocations {
    table(&ALLOCS)
}

/// Live VMM physical allocations by handle.
fn handles() -> &'static Allocations {
    table(&HANDLES)
}

/// Live CUDA arrays and mipmapped arrays by handle.
fn arrays() -> &'static Allocations {
    table(&ARRAYS)
}

/// In a forked child: the parent's allocations are not the child's. No allocation, no lock.
pub fn forget_all_after_fork() {
    ALLOCS.store(std::ptr::null_mut(), Release);
    HANDLES.store(std::ptr::null_mut(), Release);
    ARRAYS.store(std::ptr::null_mut(), Release);
    CTX_CHARGED.store(0, Release);
}

/// Devices on which this process has been charged its context overhead (bit per device).
static CTX_CHARGED: AtomicU32 = AtomicU32::new(0);

/// Charges the context overhead on `dev` the first time this process makes a context there,
/// then creates it. It stays charged until the process exits (when its slot is released).
fn with_context_charge(dev: CUdevice, create: impl FnOnce() -> CUresult) -> CUresult {
    let sh = match shim() {
        Ok(s) => s,
        Err(e) => return e,
    };
    let overhead = sh.cfg.context_overhead;
    if overhead == 0 || dev < 0 || dev as usize >= libshare_abi::MAX_DEVICES {
        return create();
    }
    let bit = 1u32 << dev;
    if CTX_CHARGED.fetch_or(bit, AcqRel) & bit != 0 {
        return create();
    }
    if !sh.charge(dev as usize, overhead) {
        CTX_CHARGED.fetch_and(!bit, AcqRel);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    let r = create();
    if r != CUDA_SUCCESS {
        sh.uncharge(dev as usize, overhead);
        CTX_CHARGED.fetch_and(!bit, AcqRel);
    }
    r
}

/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuDevicePrimaryCtxRetain`.
pub unsafe fn primary_ctx_retain(
    real: unsafe extern "C" fn(*mut CUcontext, CUdevice) -> CUresult,
    pctx: *mut CUcontext,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: the hook contract: the driver's function with the caller's arguments.
    with_context_charge(dev, || unsafe { real(pctx, dev) })
}

/// cudaDeviceReset: the driver frees every allocation of the primary context, so the process's
/// allocations and arrays on that device go back to the quota (cudart makes all its allocations
/// there).
///
/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuDevicePrimaryCtxReset(_v2)`.
pub unsafe fn primary_ctx_reset(
    real: unsafe extern "C" fn(CUdevice) -> CUresult,
    dev: CUdevice,
) -> CUresult {
    crate::deferred::before_context_loss(None);
    // SAFETY: the hook contract: the driver's function with the caller's device ordinal.
    let r = unsafe { real(dev) };
    if r == CUDA_SUCCESS && dev >= 0 {
        if let Some(sh) = crate::state::get() {
            let d = dev as usize % libshare_abi::MAX_DEVICES;
            let freed = allocs().drain_device(d).into_iter();
            for (_, (_, bytes)) in freed.chain(arrays().drain_device(d)) {
                sh.uncharge(d, bytes);
                sh.count_free(d);
            }
        }
    }
    r
}

/// Destroying a context frees its allocations: return them to the quota. Which tracked pointers
/// belong to it is asked of the driver before the destroy (rare: no cost on allocation paths).
///
/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuCtxDestroy(_v2)`.
pub unsafe fn ctx_destroy(
    real: unsafe extern "C" fn(CUcontext) -> CUresult,
    ctx: CUcontext,
) -> CUresult {
    crate::deferred::before_context_loss((!ctx.is_null()).then_some(ctx));
    const CU_POINTER_ATTRIBUTE_CONTEXT: c_uint = 1;
    let owned: Vec<u64> = match (crate::state::real().cuPointerGetAttribute, ctx.is_null()) {
        (Some(attr), false) => allocs()
            .keys()
            .into_iter()
            .filter(|p| {
                let mut c: CUcontext = std::ptr::null_mut();
                // SAFETY: the driver's `cuPointerGetAttribute`; CU_POINTER_ATTRIBUTE_CONTEXT
                // writes one CUcontext, to the live local `c`; `*p` is a device pointer the
                // driver returned to this process (an error if it is freed meanwhile).
                (unsafe {
                    attr(
                        &mut c as *mut CUcontext as *mut c_void,
                        CU_POINTER_ATTRIBUTE_CONTEXT,
                        *p,
                    )
                }) == CUDA_SUCCESS
                    && c == ctx
            })
            .collect(),
        _ => Vec::new(),
    };
    // SAFETY: the hook contract: the driver's function with the caller's context handle.
    let r = unsafe { real(ctx) };
    if r == CUDA_SUCCESS {
        if let Some(sh) = crate::state::get() {
            for p in owned {
                if let Some((dev, bytes)) = allocs().remove(p) {
                    sh.uncharge(dev, bytes);
                    sh.count_free(dev);
                }
            }
        }
        crate::launch::context_changed(r);
    }
    r
}

/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuCtxCreate_v2`.
pub unsafe fn ctx_create_v2(
    real: unsafe extern "C" fn(*mut CUcontext, c_uint, CUdevice) -> CUresult,
    pctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: the hook contract: the driver's function with the caller's arguments.
    let r = with_context_charge(dev, || unsafe { real(pctx, flags, dev) });
    crate::launch::context_changed(r);
    r
}

/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuCtxCreate_v3`.
pub unsafe fn ctx_create_v3(
    real: unsafe extern "C" fn(*mut CUcontext, *mut c_void, i32, c_uint, CUdevice) -> CUresult,
    pctx: *mut CUcontext,
    params: *mut c_void,
    n: i32,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: the hook contract: the driver's function with the caller's arguments.
    let r = with_context_charge(dev, || unsafe { real(pctx, params, n, flags, dev) });
    crate::launch::context_changed(r);
    r
}

/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuCtxCreate_v4`.
pub unsafe fn ctx_create_v4(
    real: unsafe extern "C" fn(*mut CUcontext, *mut c_void, c_uint, CUdevice) -> CUresult,
    pctx: *mut CUcontext,
    params: *mut c_void,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: the hook contract: the driver's function with the caller's arguments.
    let r = with_context_charge(dev, || unsafe { real(pctx, params, flags, dev) });
    crate::launch::context_changed(r);
    r
}

/// The device of the current context (allocation paths may afford the driver call).
fn current_device() -> Option<usize> {
    let get = crate::state::real().cuCtxGetDevice?;
    let mut d: CUdevice = 0;
    // SAFETY: the driver's `cuCtxGetDevice`; `d` is a live local CUdevice to write.
    (unsafe { get(&mut d) } == CUDA_SUCCESS && d >= 0)
        .then_some(d as usize % libshare_abi::MAX_DEVICES)
}

/// Charge `bytes`, run the driver's allocation, keep or return the charge.
fn charged(
    sh: &Shim,
    dev: usize,
    bytes: u64,
    call: impl FnOnce() -> CUresult,
    key: impl FnOnce() -> u64,
    table: &Allocations,
) -> CUresult {
    charged_then(sh, dev, bytes, call, || table.insert(key(), dev, bytes))
}

/// Charge `bytes`, run the driver's allocation; on success `record` who holds the charge, else
/// return it.
pub(crate) fn charged_then(
    sh: &Shim,
    dev: usize,
    bytes: u64,
    call: impl FnOnce() -> CUresult,
    record: impl FnOnce(),
) -> CUresult {
    if !sh.charge(dev, bytes) {
        tracing::debug!(dev, bytes, "allocation refused: over quota");
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    let r = call();
    if r == CUDA_SUCCESS {
        record();
        sh.count_alloc(dev);
    } else {
        sh.uncharge(dev, bytes);
    }
    r
}

/// Removes a tracked device allocation (its charge is now the caller's to hold or return).
pub(crate) fn take_allocation(ptr: CUdeviceptr) -> Option<(usize, u64)> {
    allocs().remove(ptr)
}

/// The driver freed `key` (a pointer or handle of `table`): return its bytes to the quota.
fn returned(table: &Allocations, key: u64) {
    if let (Some((dev, bytes)), Some(sh)) = (table.remove(key), crate::state::get()) {
        sh.uncharge(dev, bytes);
        sh.count_free(dev);
    }
}

/// An allocation that writes its pointer to `dptr`: charged on the current device, recorded by
/// pointer. Without a context (the driver will refuse anyway) or for size 0, passed through.
///
/// # Safety
///
/// `dptr` is NULL or valid for reading a `CUdeviceptr`, which `call` has written when it
/// returns CUDA_SUCCESS.
unsafe fn charged_alloc(
    dptr: *mut CUdeviceptr,
    size: usize,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let sh = match shim() {
        Ok(s) => s,
        Err(e) => return e,
    };
    match current_device() {
        Some(dev) if !dptr.is_null() && size > 0 => {
            // SAFETY: `dptr` is not NULL (checked), so readable by this function's contract,
            // and read only after `call` succeeded and wrote the new pointer there.
            charged(sh, dev, size as u64, call, || unsafe { *dptr }, allocs())
        }
        _ => call(),
    }
}

type AllocFn = unsafe extern "C" fn(*mut CUdeviceptr, usize) -> CUresult;

/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuMemAlloc_v2`.
pub unsafe fn alloc(real: AllocFn, dptr: *mut CUdeviceptr, size: usize) -> CUresult {
    // SAFETY: the hook contract: `dptr` is the caller's out-pointer (NULL or writable), which
    // the driver's function, called with the caller's arguments, fills on success.
    unsafe { charged_alloc(dptr, size, || real(dptr, size)) }
}

/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuMemAllocManaged`.
pub unsafe fn alloc_managed(
    real: unsafe extern "C" fn(*mut CUdeviceptr, usize, c_uint) -> CUresult,
    dptr: *mut CUdeviceptr,
    size: usize,
    flags: c_uint,
) -> CUresult {
    // SAFETY: as in `alloc`: the caller's out-pointer, filled by the driver on success.
    unsafe { charged_alloc(dptr, size, || real(dptr, size, flags)) }
}

/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuMemAllocPitch_v2`.
pub unsafe fn alloc_pitch(
    real: unsafe extern "C" fn(*mut CUdeviceptr, *mut usize, usize, usize, c_uint) -> CUresult,
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> CUresult {
    let sh = match shim() {
        Ok(s) => s,
        Err(e) => return e,
    };
    let Some(dev) = current_device().filter(|_| !dptr.is_null() && !pitch.is_null()) else {
        // SAFETY: the hook contract: the driver's function with the caller's arguments.
        return unsafe { real(dptr, pitch, width, height, elem) };
    };
    // The pitch is known only afterwards: charge the width rounded to 512 (what drivers use), then
    // correct the charge to pitch × height.
    let estimate = (width.div_ceil(512) * 512 * height) as u64;
    if !sh.charge(dev, estimate) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    // SAFETY: the hook contract: the driver's function with the caller's arguments.
    let r = unsafe { real(dptr, pitch, width, height, elem) };
    if r != CUDA_SUCCESS {
        sh.uncharge(dev, estimate);
        return r;
    }
    // SAFETY: `dptr` and `pitch` were checked non-NULL above, so are the caller's valid
    // out-pointers (hook contract), and the driver wrote both on success.
    let (ptr, pitch) = unsafe { (*dptr, *pitch) };
    let actual = (pitch * height) as u64;
    if actual > estimate && !sh.charge(dev, actual - estimate) {
        if let Some(free) = crate::state::real().cuMemFree_v2 {
            // SAFETY: the driver's `cuMemFree_v2` on the allocation it just made.
            unsafe { free(ptr) };
        }
        sh.uncharge(dev, estimate);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if actual < estimate {
        sh.uncharge(dev, estimate - actual);
    }
    allocs().insert(ptr, dev, actual);
    sh.count_alloc(dev);
    CUDA_SUCCESS
}

/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuMemFree_v2`.
pub unsafe fn free(
    real: unsafe extern "C" fn(CUdeviceptr) -> CUresult,
    ptr: CUdeviceptr,
) -> CUresult {
    // SAFETY: the hook contract: the driver's function with the caller's device pointer.
    let r = unsafe { real(ptr) };
    if r == CUDA_SUCCESS && ptr != 0 {
        match crate::pools::freed(ptr) {
            Some((pool, dev)) => {
                if let Some(sh) = crate::state::get() {
                    sh.count_free(dev);
                }
                crate::pools::reconcile(pool);
            }
            None => returned(allocs(), ptr),
        }
    }
    r
}

/// Stream-ordered allocation from `pool` (None: the device's current pool). Charged in full
/// before the call; afterwards the pool's charge follows what it reserves (`pools`). During
/// stream capture the allocation becomes a node of the captured graph, which holds the charge
/// (see `graph_mem`).
///
/// # Safety
///
/// `dptr` is NULL or valid for reading a `CUdeviceptr`, which `call` has written when it
/// returns CUDA_SUCCESS; `stream` is the stream `call` allocates on (a handle of this process,
/// or a default stream).
unsafe fn charged_async(
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: Option<usize>,
    stream: CUstream,
    ptsz: bool,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let sh = match shim() {
        Ok(s) => s,
        Err(e) => return e,
    };
    let Some(dev) = current_device().filter(|_| !dptr.is_null() && size > 0) else {
        return call();
    };
    let bytes = size as u64;
    if let Some(graph) = crate::graph_mem::capturing(stream, ptsz) {
        return charged_then(sh, dev, bytes, call, || {
            // SAFETY: `dptr` is not NULL (checked), so readable by this function's contract,
            // and read only after `call` succeeded and wrote the new pointer there.
            crate::graph_mem::adopt(graph, unsafe { *dptr }, dev, bytes)
        });
    }
    match pool.or_else(|| crate::pools::current_pool(dev)) {
        // SAFETY: `dptr` checked non-NULL above; `dptr`, `stream` and `call` as this
        // function's own contract has them.
        Some(pool) => unsafe { pool_alloc(sh, dev, bytes, pool, dptr, (stream, ptsz), call) },
        // SAFETY: as for the graph above: non-NULL, read after `call` succeeded.
        None => charged(sh, dev, bytes, call, || unsafe { *dptr }, allocs()),
    }
}

/// A stream-ordered allocation of `bytes` from `pool`. Charged in full if that fits; if not,
/// the pool may serve it from blocks it keeps (already charged), so only what those cannot
/// cover is charged; failing that, the pools are trimmed. After the call the pool's charge
/// follows what it reserves; should that leave the container over its quota (the kept blocks
/// did not fit the request), the pools are trimmed, and if that is not enough the allocation
/// is freed again and refused.
///
/// # Safety
///
/// `dptr` is valid for reading a `CUdeviceptr`, which `call` (an allocation from `pool` on
/// `stream`) has written when it returns CUDA_SUCCESS; `stream` is a stream handle of this
/// process or a default stream, per-thread if `ptsz`.
unsafe fn pool_alloc(
    sh: &Shim,
    dev: usize,
    bytes: u64,
    pool: usize,
    dptr: *mut CUdeviceptr,
    (stream, ptsz): (CUstream, bool),
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let pre = if sh.charge_keeping_pools(dev, bytes) {
        bytes
    } else {
        let kept = crate::pools::kept(pool);
        let rest = bytes.saturating_sub(kept);
        if kept > 0 && (rest == 0 || sh.charge_keeping_pools(dev, rest)) {
            rest
        } else if sh.charge(dev, bytes) {
            bytes
        } else {
            tracing::debug!(dev, bytes, "allocation refused: over quota");
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    };
    let r = call();
    if r != CUDA_SUCCESS {
        sh.uncharge(dev, pre);
        return r;
    }
    sh.count_alloc(dev);
    // SAFETY: readable by this function's contract, and written by `call`, which succeeded.
    let ptr = unsafe { *dptr };
    crate::pools::allocated(pool, dev, ptr, pre);
    if sh.over_quota(dev) {
        crate::pools::trim_all();
    }
    if sh.over_quota(dev) {
        let r = crate::state::real();
        if let Some(free) = if ptsz {
            r.cuMemFreeAsync_ptsz
        } else {
            r.cuMemFreeAsync
        } {
            // SAFETY: the driver's `cuMemFreeAsync(_ptsz)` (matching the allocation's), on the
            // allocation it just made, on the caller's stream it was made on.
            unsafe { free(ptr, stream) };
            crate::pools::freed(ptr);
            crate::deferred::defer(dev, 0, Some(pool), stream, ptsz);
            crate::pools::reconcile(pool);
            sh.count_refusal(dev);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    r
}

/// Makes room when an allocation does not fit the quota: returns this process's stream-ordered
/// frees the streams have reached (with `wait`, after waiting for all of them), brings its pools'
/// charges to what they reserve, and (with `trim`) trims the pools. Called before refusing an
/// allocation.
pub fn make_room(wait: bool, trim: bool) {
    crate::deferred::settle(wait);
    crate::pools::reconcile_all();
    if trim {
        crate::pools::trim_all();
    }
}

type AllocAsyncFn = unsafe extern "C" fn(*mut CUdeviceptr, usize, CUstream) -> CUresult;
type AllocPoolFn = unsafe extern "C" fn(*mut CUdeviceptr, usize, *mut c_void, CUstream) -> CUresult;
type FreeAsyncFn = unsafe extern "C" fn(CUdeviceptr, CUstream) -> CUresult;

/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuMemAllocAsync`.
pub unsafe fn alloc_async(
    real: AllocAsyncFn,
    dptr: *mut CUdeviceptr,
    size: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: the hook contract: the caller's out-pointer and stream, which the driver's
    // function, called with the caller's arguments, uses (and fills `dptr`) on success.
    unsafe { charged_async(dptr, size, None, stream, false, || real(dptr, size, stream)) }
}

/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuMemAllocAsync_ptsz`.
pub unsafe fn alloc_async_ptsz(
    real: AllocAsyncFn,
    dptr: *mut CUdeviceptr,
    size: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: the hook contract: the caller's out-pointer and stream, which the driver's
    // function, called with the caller's arguments, uses (and fills `dptr`) on success.
    unsafe { charged_async(dptr, size, None, stream, true, || real(dptr, size, stream)) }
}

/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuMemAllocFromPoolAsync`.
pub unsafe fn alloc_from_pool(
    real: AllocPoolFn,
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: *mut c_void,
    stream: CUstream,
) -> CUresult {
    // SAFETY: as in `alloc_async`; `pool` is the caller's, passed on unchanged.
    unsafe {
        charged_async(dptr, size, Some(pool as usize), stream, false, || {
            real(dptr, size, pool, stream)
        })
    }
}

/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuMemAllocFromPoolAsync_ptsz`.
pub unsafe fn alloc_from_pool_ptsz(
    real: AllocPoolFn,
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: *mut c_void,
    stream: CUstream,
) -> CUresult {
    // SAFETY: as in `alloc_async`; `pool` is the caller's, passed on unchanged.
    unsafe {
        charged_async(dptr, size, Some(pool as usize), stream, true, || {
            real(dptr, size, pool, stream)
        })
    }
}

/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuMemFreeAsync`.
pub unsafe fn free_async(real: FreeAsyncFn, ptr: CUdeviceptr, stream: CUstream) -> CUresult {
    // SAFETY: the hook contract: the driver's function with the caller's arguments.
    freed_async(ptr, stream, false, || unsafe { real(ptr, stream) })
}

/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuMemFreeAsync_ptsz`.
pub unsafe fn free_async_ptsz(real: FreeAsyncFn, ptr: CUdeviceptr, stream: CUstream) -> CUresult {
    // SAFETY: the hook contract: the driver's function with the caller's arguments.
    freed_async(ptr, stream, true, || unsafe { real(ptr, stream) })
}

/// Stream-ordered free: the memory is freed when the stream reaches the free. A pool
/// allocation's charge then follows its pool (an event after the free says when to look); any
/// other's is returned then (`deferred`), not when the free is issued. Freed during stream
/// capture, a tracked allocation passes to the captured graph, which holds the charge.
fn freed_async(
    ptr: CUdeviceptr,
    stream: CUstream,
    ptsz: bool,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let graph = crate::graph_mem::capturing(stream, ptsz);
    let r = call();
    if r != CUDA_SUCCESS {
        return r;
    }
    let Some(sh) = crate::state::get() else {
        return r;
    };
    if let Some((pool, dev)) = crate::pools::freed(ptr) {
        sh.count_free(dev);
        // The stream has not reached the free yet: the pool is reconciled when it has (the
        // event's settlement), not now — unless there is no event to tell.
        if graph.is_none() && !crate::deferred::defer(dev, 0, Some(pool), stream, ptsz) {
            crate::pools::reconcile(pool);
        }
        return r;
    }
    let Some((dev, bytes)) = allocs().remove(ptr) else {
        return r; // not ours (or graph memory: its graph holds the charge)
    };
    sh.count_free(dev);
    match graph {
        Some(g) => crate::graph_mem::adopt(g, ptr, dev, bytes),
        None => {
            if !crate::deferred::defer(dev, bytes, None, stream, ptsz) {
                sh.uncharge(dev, bytes);
            }
        }
    }
    r
}

/// `cuMemCreate` on a device location is charged; host locations are not device memory.
///
/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuMemCreate`.
pub unsafe fn create(
    real: unsafe extern "C" fn(*mut u64, usize, *const MemAllocationProp, u64) -> CUresult,
    handle: *mut u64,
    size: usize,
    prop: *const MemAllocationProp,
    flags: u64,
) -> CUresult {
    let sh = match shim() {
        Ok(s) => s,
        Err(e) => return e,
    };
    // SAFETY: the hook contract: `prop` is the caller's, NULL or a readable, initialised
    // CUmemAllocationProp (the driver reads it too).
    match unsafe { prop.as_ref() } {
        Some(p)
            if p.location.kind == CU_MEM_LOCATION_TYPE_DEVICE
                && p.location.id >= 0
                && !handle.is_null()
                && size > 0 =>
        {
            let dev = p.location.id as usize % libshare_abi::MAX_DEVICES;
            // SAFETY: the hook contract: the driver's function with the caller's arguments;
            // `handle` is not NULL (checked) and read only after the driver wrote it.
            unsafe {
                charged(
                    sh,
                    dev,
                    size as u64,
                    || real(handle, size, prop, flags),
                    || *handle,
                    handles(),
                )
            }
        }
        // SAFETY: the hook contract: the driver's function with the caller's arguments.
        _ => unsafe { real(handle, size, prop, flags) },
    }
}

/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuMemRelease`.
pub unsafe fn release(real: unsafe extern "C" fn(u64) -> CUresult, handle: u64) -> CUresult {
    // SAFETY: the hook contract: the driver's function with the caller's handle.
    let r = unsafe { real(handle) };
    if r == CUDA_SUCCESS {
        returned(handles(), handle);
    }
    r
}

/// A CUDA array (texture/surface storage) of `bytes`, charged on the current device and
/// recorded by handle. Charged at its dense size (`Array3DDesc::dense_bytes`): a GPU pads and
/// tiles arrays, so this is what the array takes at least. Arrays of formats without a fixed
/// element size are passed through uncharged.
///
/// # Safety
///
/// `ph` is NULL or valid for reading a handle, which `call` has written when it returns
/// CUDA_SUCCESS.
unsafe fn charged_array(
    ph: *mut *mut c_void,
    bytes: Option<u64>,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let sh = match shim() {
        Ok(s) => s,
        Err(e) => return e,
    };
    match (current_device(), bytes) {
        (Some(dev), Some(b)) if !ph.is_null() && b > 0 => {
            // SAFETY: `ph` is not NULL (checked), so readable by this function's contract, and
            // read only after `call` succeeded and wrote the new handle there.
            charged(sh, dev, b, call, || unsafe { *ph } as u64, arrays())
        }
        _ => call(),
    }
}

/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuArrayCreate_v2`.
pub unsafe fn array_create(
    real: unsafe extern "C" fn(*mut *mut c_void, *const ArrayDesc) -> CUresult,
    ph: *mut *mut c_void,
    desc: *const ArrayDesc,
) -> CUresult {
    // SAFETY: the hook contract: `desc` is NULL or a readable CUDA_ARRAY_DESCRIPTOR.
    let bytes = unsafe { desc.as_ref() }.and_then(|d| Array3DDesc::from(d).dense_bytes());
    // SAFETY: the hook contract: the caller's out-pointer `ph`, filled by the driver's
    // function, called with the caller's arguments, on success.
    unsafe { charged_array(ph, bytes, || real(ph, desc)) }
}

/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuArray3DCreate_v2`.
pub unsafe fn array3d_create(
    real: unsafe extern "C" fn(*mut *mut c_void, *const Array3DDesc) -> CUresult,
    ph: *mut *mut c_void,
    desc: *const Array3DDesc,
) -> CUresult {
    // SAFETY: the hook contract: `desc` is NULL or a readable CUDA_ARRAY3D_DESCRIPTOR.
    let bytes = unsafe { desc.as_ref() }.and_then(|d| d.dense_bytes());
    // SAFETY: as in `array_create`: the caller's out-pointer, filled by the driver on success.
    unsafe { charged_array(ph, bytes, || real(ph, desc)) }
}

/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuMipmappedArrayCreate`.
pub unsafe fn mipmapped_array_create(
    real: unsafe extern "C" fn(*mut *mut c_void, *const Array3DDesc, c_uint) -> CUresult,
    ph: *mut *mut c_void,
    desc: *const Array3DDesc,
    levels: c_uint,
) -> CUresult {
    // SAFETY: the hook contract: `desc` is NULL or a readable CUDA_ARRAY3D_DESCRIPTOR.
    let bytes = unsafe { desc.as_ref() }.and_then(|d| {
        (0..levels.min(64)).try_fold(0u64, |sum, i| {
            sum.checked_add(d.mip_level(i).dense_bytes()?)
        })
    });
    // SAFETY: as in `array_create`: the caller's out-pointer, filled by the driver on success.
    unsafe { charged_array(ph, bytes, || real(ph, desc, levels)) }
}

/// cuArrayDestroy and cuMipmappedArrayDestroy.
///
/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuArrayDestroy / cuMipmappedArrayDestroy`.
pub unsafe fn array_destroy(
    real: unsafe extern "C" fn(*mut c_void) -> CUresult,
    h: *mut c_void,
) -> CUresult {
    // SAFETY: the hook contract: the driver's function with the caller's array handle.
    let r = unsafe { real(h) };
    if r == CUDA_SUCCESS {
        returned(arrays(), h as u64);
    }
    r
}

/// (total, free) as the job must see them on `dev`: the quota as total, quota − used as free,
/// never more than the device really has. Without a quota, the driver's figures.
pub fn visible(dev: usize, real_free: u64, real_total: u64) -> (u64, u64) {
    let (quota, used) = match crate::state::get() {
        Some(sh) => {
            sh.reclaim_now_and_then();
            sh.quota(dev)
        }
        None => quota_without_cuda(dev),
    };
    if quota == 0 {
        return (real_free, real_total);
    }
    let total = quota.min(real_total);
    (total.saturating_sub(used).min(real_free), total)
}

/// (quota, used) on `dev` for a process that has not initialised CUDA (an NVML-only monitoring
/// tool in the container, `nvidia-smi`-like): read from the container's state file through a
/// read-only view (`State::open_view`) if a CUDA process made it, else the limit from the
/// environment with nothing used. An invalid configuration shows the device as it is (the
/// error is reported to CUDA jobs at cuInit).
fn quota_without_cuda(dev: usize) -> (u64, u64) {
    use std::sync::atomic::Ordering::Acquire;
    use std::sync::OnceLock;
    static VIEW: OnceLock<Option<(crate::config::Config, Option<libshare_abi::State>)>> =
        OnceLock::new();
    let Some((cfg, state)) = VIEW
        .get_or_init(|| {
            let cfg = crate::config::Config::from_env().ok()?;
            let path = cfg.container_dir.join(libshare_abi::STATE_FILE);
            let state = libshare_abi::State::open_view(&path).ok();
            Some((cfg, state))
        })
        .as_ref()
    else {
        return (0, 0);
    };
    if dev >= libshare_abi::MAX_DEVICES {
        return (0, 0);
    }
    let from_file = state.as_ref().map(|s| {
        (
            s.device(dev).quota.load(Acquire),
            s.device(dev).used.load(Acquire),
        )
    });
    match from_file {
        Some((q, used)) if q > 0 => (q, used),
        _ => (
            cfg.memory_limit[dev].unwrap_or(0),
            from_file.map_or(0, |f| f.1),
        ),
    }
}

/// NULL-safe: either output may be NULL.
///
/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuMemGetInfo_v2`.
pub unsafe fn get_info(
    real: unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult,
    free: *mut usize,
    total: *mut usize,
) -> CUresult {
    crate::deferred::settle(false);
    crate::pools::reconcile_all();
    let (mut f, mut t) = (0usize, 0usize);
    // SAFETY: the driver's `cuMemGetInfo_v2` (hook contract), with live locals to write.
    let r = unsafe { real(&mut f, &mut t) };
    if r != CUDA_SUCCESS {
        return r;
    }
    let dev = current_device().unwrap_or(0);
    let (vf, vt) = visible(dev, f as u64, t as u64);
    // SAFETY: each is written only if not NULL, when it is the caller's writable out-pointer
    // (hook contract).
    unsafe {
        if !free.is_null() {
            *free = vf as usize;
        }
        if !total.is_null() {
            *total = vt as usize;
        }
    }
    CUDA_SUCCESS
}

/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuDeviceTotalMem_v2`.
pub unsafe fn total_mem(
    real: unsafe extern "C" fn(*mut usize, CUdevice) -> CUresult,
    bytes: *mut usize,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: the hook contract: the driver's function with the caller's arguments.
    let r = unsafe { real(bytes, dev) };
    if r == CUDA_SUCCESS && !bytes.is_null() && dev >= 0 {
        // SAFETY: `bytes` is not NULL (checked), so the caller's writable out-pointer (hook
        // contract), and the driver wrote the device's memory there.
        let real_total = unsafe { *bytes };
        let (_, t) = visible(
            dev as usize % libshare_abi::MAX_DEVICES,
            u64::MAX,
            real_total as u64,
        );
        // SAFETY: as above.
        unsafe { *bytes = t as usize };
    }
    r
}
