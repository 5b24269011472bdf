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
        // SAFETY: tables are leaked, never freed.
        return unsafe { &*p };
    }
    let fresh = Allocations::new() as *const Allocations as *mut Allocations;
    match slot.compare_exchange(std::ptr::null_mut(), fresh, AcqRel, Acquire) {
        Ok(_) => unsafe { &*fresh },
        // SAFETY: another thread installed one first (ours leaks: rare, small).
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
unsafe fn with_context_charge(dev: CUdevice, create: impl FnOnce() -> CUresult) -> CUresult {
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

pub unsafe fn primary_ctx_retain(
    real: unsafe extern "C" fn(*mut CUcontext, CUdevice) -> CUresult,
    pctx: *mut CUcontext,
    dev: CUdevice,
) -> CUresult {
    with_context_charge(dev, || real(pctx, dev))
}

/// cudaDeviceReset: the driver frees every allocation of the primary context, so the process's
/// allocations and arrays on that device go back to the quota (cudart makes all its allocations
/// there).
pub unsafe fn primary_ctx_reset(
    real: unsafe extern "C" fn(CUdevice) -> CUresult,
    dev: CUdevice,
) -> CUresult {
    crate::deferred::before_context_loss(None);
    let r = real(dev);
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
                attr(
                    &mut c as *mut CUcontext as *mut c_void,
                    CU_POINTER_ATTRIBUTE_CONTEXT,
                    *p,
                ) == CUDA_SUCCESS
                    && c == ctx
            })
            .collect(),
        _ => Vec::new(),
    };
    let r = real(ctx);
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

pub unsafe fn ctx_create_v2(
    real: unsafe extern "C" fn(*mut CUcontext, c_uint, CUdevice) -> CUresult,
    pctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    let r = with_context_charge(dev, || real(pctx, flags, dev));
    crate::launch::context_changed(r);
    r
}

pub unsafe fn ctx_create_v3(
    real: unsafe extern "C" fn(*mut CUcontext, *mut c_void, i32, c_uint, CUdevice) -> CUresult,
    pctx: *mut CUcontext,
    params: *mut c_void,
    n: i32,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    let r = with_context_charge(dev, || real(pctx, params, n, flags, dev));
    crate::launch::context_changed(r);
    r
}

pub unsafe fn ctx_create_v4(
    real: unsafe extern "C" fn(*mut CUcontext, *mut c_void, c_uint, CUdevice) -> CUresult,
    pctx: *mut CUcontext,
    params: *mut c_void,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    let r = with_context_charge(dev, || real(pctx, params, flags, dev));
    crate::launch::context_changed(r);
    r
}

/// The device of the current context (allocation paths may afford the driver call).
fn current_device() -> Option<usize> {
    let get = crate::state::real().cuCtxGetDevice?;
    let mut d: CUdevice = 0;
    // SAFETY: valid out-pointer.
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
            charged(sh, dev, size as u64, call, || *dptr, allocs())
        }
        _ => call(),
    }
}

type AllocFn = unsafe extern "C" fn(*mut CUdeviceptr, usize) -> CUresult;

pub unsafe fn alloc(real: AllocFn, dptr: *mut CUdeviceptr, size: usize) -> CUresult {
    charged_alloc(dptr, size, || real(dptr, size))
}

pub unsafe fn alloc_managed(
    real: unsafe extern "C" fn(*mut CUdeviceptr, usize, c_uint) -> CUresult,
    dptr: *mut CUdeviceptr,
    size: usize,
    flags: c_uint,
) -> CUresult {
    charged_alloc(dptr, size, || real(dptr, size, flags))
}

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
        return real(dptr, pitch, width, height, elem);
    };
    // The pitch is known only afterwards: charge the width rounded to 512 (what drivers use), then
    // correct the charge to pitch × height.
    let estimate = (width.div_ceil(512) * 512 * height) as u64;
    if !sh.charge(dev, estimate) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    let r = real(dptr, pitch, width, height, elem);
    if r != CUDA_SUCCESS {
        sh.uncharge(dev, estimate);
        return r;
    }
    let actual = (*pitch * height) as u64;
    if actual > estimate && !sh.charge(dev, actual - estimate) {
        if let Some(free) = crate::state::real().cuMemFree_v2 {
            free(*dptr);
        }
        sh.uncharge(dev, estimate);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if actual < estimate {
        sh.uncharge(dev, estimate - actual);
    }
    allocs().insert(*dptr, dev, actual);
    sh.count_alloc(dev);
    CUDA_SUCCESS
}

pub unsafe fn free(
    real: unsafe extern "C" fn(CUdeviceptr) -> CUresult,
    ptr: CUdeviceptr,
) -> CUresult {
    let r = real(ptr);
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
            crate::graph_mem::adopt(graph, *dptr, dev, bytes)
        });
    }
    match pool.or_else(|| crate::pools::current_pool(dev)) {
        Some(pool) => pool_alloc(sh, dev, bytes, pool, dptr, (stream, ptsz), call),
        None => charged(sh, dev, bytes, call, || *dptr, allocs()),
    }
}

/// A stream-ordered allocation of `bytes` from `pool`. Charged in full if that fits; if not,
/// the pool may serve it from blocks it keeps (already charged), so only what those cannot
/// cover is charged; failing that, the pools are trimmed. After the call the pool's charge
/// follows what it reserves; should that leave the container over its quota (the kept blocks
/// did not fit the request), the pools are trimmed, and if that is not enough the allocation
/// is freed again and refused.
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
    crate::pools::allocated(pool, dev, *dptr, pre);
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
            free(*dptr, stream);
            crate::pools::freed(*dptr);
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

pub unsafe fn alloc_async(
    real: AllocAsyncFn,
    dptr: *mut CUdeviceptr,
    size: usize,
    stream: CUstream,
) -> CUresult {
    charged_async(dptr, size, None, stream, false, || real(dptr, size, stream))
}

pub unsafe fn alloc_async_ptsz(
    real: AllocAsyncFn,
    dptr: *mut CUdeviceptr,
    size: usize,
    stream: CUstream,
) -> CUresult {
    charged_async(dptr, size, None, stream, true, || real(dptr, size, stream))
}

pub unsafe fn alloc_from_pool(
    real: AllocPoolFn,
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: *mut c_void,
    stream: CUstream,
) -> CUresult {
    charged_async(dptr, size, Some(pool as usize), stream, false, || {
        real(dptr, size, pool, stream)
    })
}

pub unsafe fn alloc_from_pool_ptsz(
    real: AllocPoolFn,
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: *mut c_void,
    stream: CUstream,
) -> CUresult {
    charged_async(dptr, size, Some(pool as usize), stream, true, || {
        real(dptr, size, pool, stream)
    })
}

pub unsafe fn free_async(real: FreeAsyncFn, ptr: CUdeviceptr, stream: CUstream) -> CUresult {
    freed_async(ptr, stream, false, || real(ptr, stream))
}

pub unsafe fn free_async_ptsz(real: FreeAsyncFn, ptr: CUdeviceptr, stream: CUstream) -> CUresult {
    freed_async(ptr, stream, true, || real(ptr, stream))
}

/// Stream-ordered free: the memory is freed when the stream reaches the free. A pool
/// allocation's charge then follows its pool (an event after the free says when to look); any
/// other's is returned then (`deferred`), not when the free is issued. Freed during stream
/// capture, a tracked allocation passes to the captured graph, which holds the charge.
unsafe fn freed_async(
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
        if graph.is_none() {
            crate::deferred::defer(dev, 0, Some(pool), stream, ptsz);
        }
        crate::pools::reconcile(pool);
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
    match prop.as_ref() {
        Some(p)
            if p.location.kind == CU_MEM_LOCATION_TYPE_DEVICE
                && p.location.id >= 0
                && !handle.is_null()
                && size > 0 =>
        {
            let dev = p.location.id as usize % libshare_abi::MAX_DEVICES;
            charged(
                sh,
                dev,
                size as u64,
                || real(handle, size, prop, flags),
                || *handle,
                handles(),
            )
        }
        _ => real(handle, size, prop, flags),
    }
}

pub unsafe fn release(real: unsafe extern "C" fn(u64) -> CUresult, handle: u64) -> CUresult {
    let r = real(handle);
    if r == CUDA_SUCCESS {
        returned(handles(), handle);
    }
    r
}

/// A CUDA array (texture/surface storage) of `bytes`, charged on the current device and
/// recorded by handle. Charged at its dense size (`Array3DDesc::dense_bytes`): a GPU pads and
/// tiles arrays, so this is what the array takes at least. Arrays of formats without a fixed
/// element size are passed through uncharged.
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
            charged(sh, dev, b, call, || *ph as u64, arrays())
        }
        _ => call(),
    }
}

pub unsafe fn array_create(
    real: unsafe extern "C" fn(*mut *mut c_void, *const ArrayDesc) -> CUresult,
    ph: *mut *mut c_void,
    desc: *const ArrayDesc,
) -> CUresult {
    let bytes = desc
        .as_ref()
        .and_then(|d| Array3DDesc::from(d).dense_bytes());
    charged_array(ph, bytes, || real(ph, desc))
}

pub unsafe fn array3d_create(
    real: unsafe extern "C" fn(*mut *mut c_void, *const Array3DDesc) -> CUresult,
    ph: *mut *mut c_void,
    desc: *const Array3DDesc,
) -> CUresult {
    let bytes = desc.as_ref().and_then(|d| d.dense_bytes());
    charged_array(ph, bytes, || real(ph, desc))
}

pub unsafe fn mipmapped_array_create(
    real: unsafe extern "C" fn(*mut *mut c_void, *const Array3DDesc, c_uint) -> CUresult,
    ph: *mut *mut c_void,
    desc: *const Array3DDesc,
    levels: c_uint,
) -> CUresult {
    let bytes = desc.as_ref().and_then(|d| {
        (0..levels.min(64)).try_fold(0u64, |sum, i| {
            sum.checked_add(d.mip_level(i).dense_bytes()?)
        })
    });
    charged_array(ph, bytes, || real(ph, desc, levels))
}

/// cuArrayDestroy and cuMipmappedArrayDestroy.
pub unsafe fn array_destroy(
    real: unsafe extern "C" fn(*mut c_void) -> CUresult,
    h: *mut c_void,
) -> CUresult {
    let r = real(h);
    if r == CUDA_SUCCESS {
        returned(arrays(), h as u64);
    }
    r
}

/// (total, free) as the job must see them on `dev`: the quota as total, quota − used as free,
/// never more than the device really has. Without a quota, the driver's figures.
pub fn visible(dev: usize, real_free: u64, real_total: u64) -> (u64, u64) {
    let Some(sh) = crate::state::get() else {
        return (real_free, real_total);
    };
    sh.reclaim_now_and_then();
    let (quota, used) = sh.quota(dev);
    if quota == 0 {
        return (real_free, real_total);
    }
    let total = quota.min(real_total);
    (total.saturating_sub(used).min(real_free), total)
}

/// NULL-safe: either output may be NULL.
pub unsafe fn get_info(
    real: unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult,
    free: *mut usize,
    total: *mut usize,
) -> CUresult {
    crate::deferred::settle(false);
    crate::pools::reconcile_all();
    let (mut f, mut t) = (0usize, 0usize);
    let r = real(&mut f, &mut t);
    if r != CUDA_SUCCESS {
        return r;
    }
    let dev = current_device().unwrap_or(0);
    let (vf, vt) = visible(dev, f as u64, t as u64);
    if !free.is_null() {
        *free = vf as usize;
    }
    if !total.is_null() {
        *total = vt as usize;
    }
    CUDA_SUCCESS
}

pub unsafe fn total_mem(
    real: unsafe extern "C" fn(*mut usize, CUdevice) -> CUresult,
    bytes: *mut usize,
    dev: CUdevice,
) -> CUresult {
    let r = real(bytes, dev);
    if r == CUDA_SUCCESS && !bytes.is_null() && dev >= 0 {
        let (_, t) = visible(
            dev as usize % libshare_abi::MAX_DEVICES,
            u64::MAX,
            *bytes as u64,
        );
        *bytes = t as usize;
    }
    r
}
