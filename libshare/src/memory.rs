//! The allocation hooks: every path that takes device memory is charged to the container's
//! quota before the driver is called (`ledger.rs`), and returned when the driver freed it. Over
//! quota → `CUDA_ERROR_OUT_OF_MEMORY`, exactly what the driver returns when a GPU is full, so
//! PyTorch's caching allocator frees its cache, retries, and raises OutOfMemoryError.
//! `cuMemGetInfo` / `cuDeviceTotalMem` report the quota as the device's memory.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;

use crate::boundary::{rc, In, Out, Pod, Word, R};
use crate::context::current_device;
use crate::graph_mem;
use crate::ledger::{self, Entry, Kind, Ledger};
use crate::ops::{DriverOps, Handle, REAL};
use crate::per_process::PerProcess;
use crate::pools;
use crate::process::shim;
use crate::types::*;

/// An allocation that writes its pointer to `dptr`: charged on the current device, recorded by
/// pointer. Without a context (the driver will refuse anyway), a NULL `dptr` or size 0, passed
/// through.
fn charged_alloc<T: Word>(call: impl FnOnce() -> CUresult, dptr: &Out<T>, size: u64) -> R {
    let l = ledger::of(shim()?);
    match current_device() {
        Some(dev) if !dptr.is_null() && size > 0 => l.charged(Kind::Alloc, dev, size, call, || {
            dptr.get().map_or(0, Word::to_u64)
        }),
        _ => rc(call()),
    }
}

pub fn alloc(call: impl FnOnce() -> CUresult, dptr: Out<CUdeviceptr>, size: usize) -> R {
    let sh = shim()?;
    if sh.account.state.oversubscribes() && current_device().is_some() {
        return as_managed(&dptr, size as u64);
    }
    crate::demote::make_room(sh, size as u64);
    charged_alloc(call, &dptr, size as u64)
}

// --- Oversubscription (issue 20): an opportunistic container allowed to oversubscribe gets
// managed memory for `cuMemAlloc_v2` and `cuMemAllocPitch_v2` (cudaMalloc, cudaMallocPitch,
// cudaMalloc3D and PyTorch's caching allocator reach them), charged to its quota as its
// footprint; what cannot be managed (VMM, stream-ordered pools, IPC, arrays, graph memory, the
// 32-bit CUDA 2.x entry points) stays device memory under the same quota and the device's size.

const CU_MEM_ATTACH_GLOBAL: u32 = 1;
const CU_MEM_ADVISE_SET_PREFERRED_LOCATION: u32 = 3;
const CU_MEM_ADVISE_SET_ACCESSED_BY: u32 = 5;

/// `size` bytes of managed memory on the current device, charged like a device allocation and
/// advised to live on the device (preferred location) and to stay mapped there once evicted
/// (accessed by: the device reads evicted pages over PCIe rather than fault them straight back,
/// which keeps a thrashing job from thrashing harder). Advice is a hint: if the driver refuses
/// it the allocation stands. Called with a current context (without one, the driver's own
/// call answers).
fn as_managed(dptr: &Out<CUdeviceptr>, size: u64) -> R {
    let l = ledger::of(shim()?);
    let real = crate::driver::real();
    let (Some(alloc), Some(dev)) = (real.cuMemAllocManaged, current_device()) else {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    };
    // The advice names the device to the driver: its CUDA ordinal.
    let ordinal = crate::devmap::ordinal_of(dev).unwrap_or(0);
    if dptr.is_null() || size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let p = std::cell::Cell::new(0u64);
    l.charged_managed(
        dev,
        size,
        true,
        || {
            let mut out: CUdeviceptr = 0;
            // SAFETY: the real driver's cuMemAllocManaged with a live local out-pointer.
            let r = unsafe { alloc(&mut out, size as usize, CU_MEM_ATTACH_GLOBAL) };
            if r == CUDA_SUCCESS {
                p.set(out);
                if let Some(advise) = real.cuMemAdvise {
                    for advice in [
                        CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
                        CU_MEM_ADVISE_SET_ACCESSED_BY,
                    ] {
                        // SAFETY: the real driver's cuMemAdvise on the range it just made.
                        unsafe { advise(out, size as usize, advice, ordinal) };
                    }
                }
            }
            r
        },
        || p.get(),
    )?;
    dptr.set(p.get());
    crate::demote::track(p.get(), size, dev);
    Ok(())
}

/// `cuMemAllocPitch_v2` as managed memory: rows padded to 512 bytes (the pitch the driver
/// reports for device memory), element sizes checked as the driver checks them.
fn pitched_managed(dptr: &Out<CUdeviceptr>, pitch: &Out<usize>, w: u64, h: u64, elem: u32) -> R {
    if pitch.is_null() || w == 0 || h == 0 || !matches!(elem, 4 | 8 | 16) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let p = w
        .checked_next_multiple_of(512)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    as_managed(dptr, p.checked_mul(h).ok_or(CUDA_ERROR_INVALID_VALUE)?)?;
    pitch.set(p as usize);
    Ok(())
}

/// `cuMemAlloc` of the CUDA 2.x ABI (32-bit pointer and size), as `cuGetProcAddress` hands out
/// for old versions.
pub fn alloc_v1(call: impl FnOnce() -> CUresult, dptr: Out<u32>, size: u32) -> R {
    charged_alloc(call, &dptr, size as u64)
}

/// `cuMemAllocManaged` by the job itself: managed memory, recorded as such (the driver may move
/// it; it is not what the bound on memory that cannot be demoted counts, `pin.rs`).
pub fn alloc_managed(
    call: impl FnOnce() -> CUresult,
    dptr: Out<CUdeviceptr>,
    size: usize,
    _flags: u32,
) -> R {
    let l = ledger::of(shim()?);
    match current_device() {
        Some(dev) if !dptr.is_null() && size > 0 => {
            l.charged_managed(dev, size as u64, false, call, || dptr.get().unwrap_or(0))
        }
        _ => rc(call()),
    }
}

/// The pitch is known only afterwards: the width rounded up to 512 (what drivers use) × height
/// is charged first, then the charge is corrected to pitch × height.
fn pitched<T: Word, P: Word>(
    call: impl FnOnce() -> CUresult,
    dptr: &Out<T>,
    pitch: &Out<P>,
    width: u64,
    height: u64,
) -> R {
    let sh = shim()?;
    let l = ledger::of(sh);
    let Some(dev) = current_device().filter(|_| !dptr.is_null() && !pitch.is_null()) else {
        return rc(call());
    };
    let estimate = width
        .checked_next_multiple_of(512)
        .and_then(|w| w.checked_mul(height))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if estimate == 0 {
        return rc(call());
    }
    let mut got = None;
    l.charged_then(dev, estimate, call, |ctx, epoch| {
        got = Some((ctx, epoch));
    })?;
    let (ctx, epoch) = got.unwrap_or((0, 0));
    let ptr: u64 = dptr.get().map_or(0, Word::to_u64);
    let actual = pitch
        .get()
        .map_or(estimate, Word::to_u64)
        .saturating_mul(height);
    if actual > estimate && !l.charge(dev, actual - estimate) {
        l.ops.mem_free(ptr);
        l.acc.uncharge(dev, estimate);
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    if actual < estimate {
        l.acc.uncharge(dev, estimate - actual);
    }
    let e = Entry {
        dev,
        bytes: actual,
        ctx,
        managed: false,
    };
    l.record(Kind::Alloc, ptr, e, epoch);
    Ok(())
}

pub fn alloc_pitch(
    call: impl FnOnce() -> CUresult,
    dptr: Out<CUdeviceptr>,
    pitch: Out<usize>,
    width: usize,
    height: usize,
    elem: u32,
) -> R {
    let sh = shim()?;
    if sh.account.state.oversubscribes() && current_device().is_some() {
        return pitched_managed(&dptr, &pitch, width as u64, height as u64, elem);
    }
    crate::demote::make_room(sh, (width as u64).saturating_mul(height as u64));
    pitched(call, &dptr, &pitch, width as u64, height as u64)
}

pub fn alloc_pitch_v1(
    call: impl FnOnce() -> CUresult,
    dptr: Out<u32>,
    pitch: Out<u32>,
    width: u32,
    height: u32,
    _elem: u32,
) -> R {
    pitched(call, &dptr, &pitch, width as u64, height as u64)
}

/// `cuMemFree`: a stream-ordered allocation's charge follows its pool; any other's returns
/// once the driver freed it.
pub fn free(call: impl FnOnce() -> CUresult, ptr: CUdeviceptr) -> R {
    let Some(sh) = crate::process::get() else {
        return rc(call());
    };
    let l = ledger::of(sh);
    if ptr != 0 {
        crate::demote::untrack(ptr);
        if let Some((pool, dev)) = l.pools.freed(ptr) {
            let r = call();
            if r == CUDA_SUCCESS {
                l.acc.count_free(dev);
            }
            l.pools.reconcile(l.acc, l.ops, pool);
            return rc(r);
        }
    }
    l.freed(Kind::Alloc, ptr, call)
}

pub fn free_v1(call: impl FnOnce() -> CUresult, ptr: u32) -> R {
    free(call, ptr as CUdeviceptr)
}

/// Stream-ordered allocation from `pool` (None: the device's current pool). During stream
/// capture the allocation becomes a node of the captured graph, which holds the charge
/// (`graph_mem`).
fn charged_async(
    call: impl FnOnce() -> CUresult,
    dptr: &Out<CUdeviceptr>,
    size: usize,
    pool: Option<Handle>,
    (stream, ptsz): (Handle, bool),
) -> R {
    let l = ledger::of(shim()?);
    let Some(dev) = current_device().filter(|_| !dptr.is_null() && size > 0) else {
        return rc(call());
    };
    let bytes = size as u64;
    if let Some(graph) = l.ops.capturing(stream, ptsz) {
        return l.charged_then(dev, bytes, call, |_, _| {
            graph_mem::adopt(graph, dptr.get().unwrap_or(0), dev, bytes)
        });
    }
    match pool.or_else(|| l.ops.current_pool(dev)) {
        Some(pool) => pool_alloc(&l, dev, bytes, pool, dptr, (stream, ptsz), call),
        None => l.charged(Kind::Alloc, dev, bytes, call, || dptr.get().unwrap_or(0)),
    }
}

/// A stream-ordered allocation of `bytes` from `pool`: charged in full (`pools::precharge`)
/// before the call, whatever the pool keeps; the pool takes the charge over after it. Should
/// the pool have grown beyond that (a coarser granularity than assumed), the pools are
/// trimmed, and if that is not enough the allocation is freed again and refused.
fn pool_alloc(
    l: &Ledger,
    dev: usize,
    bytes: u64,
    pool: Handle,
    dptr: &Out<CUdeviceptr>,
    (stream, ptsz): (Handle, bool),
    call: impl FnOnce() -> CUresult,
) -> R {
    let pre = pools::precharge(bytes);
    if !l.charge(dev, pre) {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let r = l.pools.allocate(l.acc, l.ops, (pool, dev, pre), call, || {
        dptr.get().unwrap_or(0)
    });
    if r != CUDA_SUCCESS {
        l.acc.uncharge(dev, pre);
        return Err(r);
    }
    l.acc.count_alloc(dev);
    let ptr = dptr.get().unwrap_or(0);
    let over = || l.acc.over_quota(dev) || crate::pin::over(l.acc, dev);
    if over() {
        l.pools.trim_all(l.acc, l.ops);
    }
    if over() {
        l.ops.mem_free_async(ptr, stream, ptsz);
        l.pools.freed(ptr);
        if !l
            .deferred
            .defer(l.acc, l.ops, l.pools, (dev, 0, Some(pool)), stream, ptsz)
        {
            l.pools.reconcile(l.acc, l.ops, pool);
        }
        l.acc.count_refusal(dev);
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    Ok(())
}

pub fn alloc_async(
    call: impl FnOnce() -> CUresult,
    dptr: Out<CUdeviceptr>,
    size: usize,
    stream: CUstream,
) -> R {
    charged_async(call, &dptr, size, None, (stream as Handle, false))
}

pub fn alloc_async_ptsz(
    call: impl FnOnce() -> CUresult,
    dptr: Out<CUdeviceptr>,
    size: usize,
    stream: CUstream,
) -> R {
    charged_async(call, &dptr, size, None, (stream as Handle, true))
}

pub fn alloc_from_pool(
    call: impl FnOnce() -> CUresult,
    dptr: Out<CUdeviceptr>,
    size: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> R {
    charged_async(
        call,
        &dptr,
        size,
        Some(pool as Handle),
        (stream as Handle, false),
    )
}

pub fn alloc_from_pool_ptsz(
    call: impl FnOnce() -> CUresult,
    dptr: Out<CUdeviceptr>,
    size: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> R {
    charged_async(
        call,
        &dptr,
        size,
        Some(pool as Handle),
        (stream as Handle, true),
    )
}

pub fn free_async(call: impl FnOnce() -> CUresult, ptr: CUdeviceptr, stream: CUstream) -> R {
    freed_async(call, ptr, stream as Handle, false)
}

pub fn free_async_ptsz(call: impl FnOnce() -> CUresult, ptr: CUdeviceptr, stream: CUstream) -> R {
    freed_async(call, ptr, stream as Handle, true)
}

/// Stream-ordered free: the memory is freed when the stream reaches the free. A pool
/// allocation's charge then follows its pool (an event after the free says when to look); any
/// other's is returned then (`deferred`), not when the free is issued. Freed during stream
/// capture, a tracked allocation passes to the captured graph, which holds the charge.
fn freed_async(call: impl FnOnce() -> CUresult, ptr: CUdeviceptr, stream: Handle, ptsz: bool) -> R {
    let Some(sh) = crate::process::get() else {
        return rc(call());
    };
    let l = ledger::of(sh);
    let graph = l.ops.capturing(stream, ptsz);
    // Out of the table before the driver may reuse the address.
    let pooled = if graph.is_none() {
        l.pools.freed(ptr)
    } else {
        None
    };
    let entry = if pooled.is_none() {
        l.take(Kind::Alloc, ptr)
    } else {
        None
    };
    let r = call();
    if r != CUDA_SUCCESS {
        if let Some(e) = entry {
            l.record(Kind::Alloc, ptr, e, 0);
        }
        if let Some((pool, dev)) = pooled {
            l.pools.allocated(l.acc, l.ops, pool, dev, ptr, 0);
        }
        return Err(r);
    }
    if let Some((pool, dev)) = pooled {
        l.acc.count_free(dev);
        // The stream has not reached the free yet: the pool is reconciled when it has (the
        // event's settlement), not now — unless there is no event to tell.
        if !l
            .deferred
            .defer(l.acc, l.ops, l.pools, (dev, 0, Some(pool)), stream, ptsz)
        {
            l.pools.reconcile(l.acc, l.ops, pool);
        }
        return Ok(());
    }
    let Some(e) = entry else {
        // Not ours, a pool allocation freed during capture, or graph memory (its graph holds
        // the charge).
        return Ok(());
    };
    if e.managed {
        // The bytes stay charged until the stream reaches the free (or with the graph), as
        // memory that is no longer managed: never counted low (`pin.rs`).
        crate::pin::managed_freed(l.acc, e.dev, e.bytes);
    }
    l.acc.count_free(e.dev);
    match graph {
        Some(g) => graph_mem::adopt(g, ptr, e.dev, e.bytes),
        None => {
            if !l
                .deferred
                .defer(l.acc, l.ops, l.pools, (e.dev, e.bytes, None), stream, ptsz)
            {
                l.acc.uncharge(e.dev, e.bytes);
            }
        }
    }
    Ok(())
}

/// `cuMemCreate` on a device location is charged; host locations are not device memory.
pub fn create(
    call: impl FnOnce() -> CUresult,
    handle: Out<u64>,
    size: usize,
    prop: In<MemAllocationProp>,
    _flags: u64,
) -> R {
    let l = ledger::of(shim()?);
    match prop.get() {
        Some(p)
            if p.location.kind == CU_MEM_LOCATION_TYPE_DEVICE
                && p.location.id >= 0
                && !handle.is_null()
                && size > 0 =>
        {
            let dev = crate::devmap::node_of(p.location.id);
            l.charged(Kind::Handle, dev, size as u64, call, || {
                handle.get().unwrap_or(0)
            })
        }
        _ => rc(call()),
    }
}

/// Where VMM physical allocations are mapped: a handle released while mapped keeps its memory
/// (and its charge) until its last `cuMemUnmap`, as CUDA documents.
#[derive(Default)]
struct Mappings {
    /// Mapped range start → (handle, size).
    ranges: BTreeMap<CUdeviceptr, (u64, usize)>,
    /// Handle → how many ranges map it.
    count: HashMap<u64, u32>,
    /// Handles released while mapped.
    released: HashSet<u64>,
}

static MAPPINGS: PerProcess<Mutex<Mappings>> = PerProcess::new();

pub fn release(call: impl FnOnce() -> CUresult, handle: u64) -> R {
    let Some(sh) = crate::process::get() else {
        return rc(call());
    };
    if MAPPINGS.lock().count.contains_key(&handle) {
        rc(call())?;
        MAPPINGS.lock().released.insert(handle);
        return Ok(());
    }
    ledger::of(sh).freed(Kind::Handle, handle, call)
}

pub fn map(
    call: impl FnOnce() -> CUresult,
    ptr: CUdeviceptr,
    size: usize,
    _offset: usize,
    handle: u64,
    _flags: u64,
) -> R {
    rc(call())?;
    let mut m = MAPPINGS.lock();
    m.ranges.insert(ptr, (handle, size));
    *m.count.entry(handle).or_default() += 1;
    Ok(())
}

/// Unmapping the last range of a released handle frees its memory: its charge returns.
pub fn unmap(call: impl FnOnce() -> CUresult, ptr: CUdeviceptr, size: usize) -> R {
    rc(call())?;
    let freed: Vec<u64> = {
        let mut m = MAPPINGS.lock();
        let end = ptr.saturating_add(size as u64);
        let starts: Vec<CUdeviceptr> = m.ranges.range(ptr..end).map(|(s, _)| *s).collect();
        let mut freed = Vec::new();
        for s in starts {
            let Some((h, _)) = m.ranges.remove(&s) else {
                continue;
            };
            let last = match m.count.get_mut(&h) {
                Some(c) => {
                    *c -= 1;
                    *c == 0
                }
                None => false,
            };
            if last {
                m.count.remove(&h);
                if m.released.remove(&h) {
                    freed.push(h);
                }
            }
        }
        freed
    };
    if let Some(sh) = crate::process::get() {
        let l = ledger::of(sh);
        for h in freed {
            l.freed(Kind::Handle, h, || CUDA_SUCCESS)?;
        }
    }
    Ok(())
}

/// Bytes a CUDA array of `desc` takes at least: its dense size for formats with a fixed
/// element size; 4×4 blocks of 8 or 16 bytes for block-compressed formats; for any other
/// format (planar video, formats newer than this list) 16 bytes per element, the largest
/// element any format has — never less than the array takes. None: the size overflows (the
/// driver refuses such an array; so does the shim).
pub fn array_bytes(desc: &Array3DDesc) -> Option<u64> {
    if let Some(b) = desc.dense_bytes() {
        return Some(b);
    }
    let (w, h) = (desc.width as u64, (desc.height as u64).max(1));
    let d = (desc.depth as u64).max(1);
    let block = match desc.format {
        // BC1 and BC4 (UNORM, SRGB / SNORM): 8 bytes per 4×4 block.
        0x91 | 0x92 | 0x97 | 0x98 => Some(8),
        // BC2, BC3, BC5, BC6H, BC7: 16 bytes per block.
        0x93..=0x96 | 0x99..=0x9e => Some(16),
        _ => None,
    };
    match block {
        Some(b) => w
            .div_ceil(4)
            .checked_mul(h.div_ceil(4))?
            .checked_mul(d)?
            .checked_mul(b),
        None => w.checked_mul(h)?.checked_mul(d)?.checked_mul(16),
    }
}

/// A CUDA array (texture/surface storage) of `bytes` (None: refused, its size overflows),
/// charged on the current device and recorded by handle.
fn charged_array(
    call: impl FnOnce() -> CUresult,
    ph: &Out<*mut std::ffi::c_void>,
    bytes: Option<u64>,
) -> R {
    let l = ledger::of(shim()?);
    let Some(bytes) = bytes else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    match current_device() {
        Some(dev) if !ph.is_null() && bytes > 0 => l.charged(Kind::Array, dev, bytes, call, || {
            ph.get().map_or(0, |h| h as u64)
        }),
        _ => rc(call()),
    }
}

/// The four CUDA array descriptors (1D/2D and 3D, in the current and the CUDA 2.x ABI).
pub trait ArrayDescriptor {
    fn as_3d(&self) -> Array3DDesc;
}

impl ArrayDescriptor for ArrayDesc {
    fn as_3d(&self) -> Array3DDesc {
        Array3DDesc::from(self)
    }
}

impl ArrayDescriptor for ArrayDescV1 {
    fn as_3d(&self) -> Array3DDesc {
        Array3DDesc::from(self)
    }
}

impl ArrayDescriptor for Array3DDesc {
    fn as_3d(&self) -> Array3DDesc {
        *self
    }
}

impl ArrayDescriptor for Array3DDescV1 {
    fn as_3d(&self) -> Array3DDesc {
        Array3DDesc::from(self)
    }
}

/// `cuArrayCreate(_v2)`, `cuArray3DCreate(_v2)`.
pub fn array_create<D: Pod + ArrayDescriptor>(
    call: impl FnOnce() -> CUresult,
    ph: Out<*mut std::ffi::c_void>,
    desc: In<D>,
) -> R {
    match desc.get() {
        Some(d) => charged_array(call, &ph, array_bytes(&d.as_3d())),
        None => rc(call()),
    }
}

pub fn mipmapped_array_create(
    call: impl FnOnce() -> CUresult,
    ph: Out<*mut std::ffi::c_void>,
    desc: In<Array3DDesc>,
    levels: u32,
) -> R {
    let Some(d) = desc.get() else {
        return rc(call());
    };
    let bytes = (0..levels.clamp(1, 64)).try_fold(0u64, |sum, i| {
        sum.checked_add(array_bytes(&d.mip_level(i))?)
    });
    charged_array(call, &ph, bytes)
}

/// cuArrayDestroy and cuMipmappedArrayDestroy.
pub fn array_destroy(call: impl FnOnce() -> CUresult, h: *mut std::ffi::c_void) -> R {
    match crate::process::get() {
        Some(sh) => ledger::of(sh).freed(Kind::Array, h as u64, call),
        None => rc(call()),
    }
}

/// What the job is told of the device's memory: the quota as total, quota − used as free.
/// NULL-safe (either output may be NULL, as without the shim); the driver is asked with locals.
fn info<T: Word>(free: Out<T>, total: Out<T>) -> R {
    if let Some(sh) = crate::process::get() {
        ledger::of(sh).refresh();
    }
    let (f, t) = REAL.mem_info()?;
    let dev = current_device().unwrap_or(0);
    let (vf, vt) = ledger::visible(dev, f, t);
    free.set(T::saturating_from(vf));
    total.set(T::saturating_from(vt));
    Ok(())
}

pub fn get_info(_call: impl FnOnce() -> CUresult, free: Out<usize>, total: Out<usize>) -> R {
    info(free, total)
}

pub fn get_info_v1(_call: impl FnOnce() -> CUresult, free: Out<u32>, total: Out<u32>) -> R {
    info(free, total)
}

fn total<T: Word>(call: impl FnOnce() -> CUresult, bytes: Out<T>, dev: CUdevice) -> R {
    rc(call())?;
    if let (Some(real_total), true) = (bytes.get(), dev >= 0) {
        let (_, t) = ledger::visible(crate::devmap::node_of(dev), u64::MAX, real_total.to_u64());
        bytes.set(T::saturating_from(t));
    }
    Ok(())
}

pub fn total_mem(call: impl FnOnce() -> CUresult, bytes: Out<usize>, dev: CUdevice) -> R {
    total(call, bytes, dev)
}

pub fn total_mem_v1(call: impl FnOnce() -> CUresult, bytes: Out<u32>, dev: CUdevice) -> R {
    total(call, bytes, dev)
}
