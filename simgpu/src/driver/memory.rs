//! Device and host memory: allocation, freeing, page-locked host memory, pointer attributes;
//! copies and memsets are in `copy`, and each other kind of device memory has its submodule
//! (`array`, `ipc`, `managed`, `pool`, `vmm`; `handle` is the trailer of their shareable file
//! descriptors). The kinds allocate through this module's `charge`/`insert_live`, and freeing
//! any pointer comes back here (`free_device` dispatches on its `Kind`). Device memory is real host memory (an anonymous mapping per
//! allocation), so device pointers are host addresses and copies move real bytes. Usage is
//! accounted per device in the shared state, across processes.

pub mod array;
mod copy;
pub mod handle;
pub mod ipc;
pub mod managed;
pub mod pool;
pub mod vmm;

pub use array::*;
pub use copy::*;
pub use ipc::*;
pub use managed::*;
pub use pool::*;
pub use vmm::*;

use libshare_abi::SlotTable;
use std::ffi::c_void;
use std::sync::atomic::Ordering::*;

use super::{current_ctx, out, R};
use crate::driver;
pub use crate::model::memory::{map_anon, unmap, Alloc, Copy3D, Kind, MemTable};
use crate::sim::{sim, Sim};
use crate::types::*;

/// Charges `bytes` of device memory to this process on `dev`, or CUDA_ERROR_OUT_OF_MEMORY.
/// Managed chunks resident on the device are evicted to make room (as the driver does).
pub fn charge(s: &Sim, dev: usize, bytes: u64) -> R {
    if crate::sim::EXITED.load(Acquire) {
        return Ok(()); // exiting: the slot is released; this memory goes with the process
    }
    let n = s.alloc_count.fetch_add(1, AcqRel) + 1;
    if s.cfg.faults.fail_alloc_nth == Some(n) {
        crate::warn!("fault injection: failing allocation #{n}");
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    // A per-cgroup hard limit (nvmlDeviceSetMemoryLimits_v1) applies first: the bytes go on
    // this process's slot before the cgroup's total is summed, so two processes of one cgroup
    // allocating at once never both pass the limit.
    let p = &s.shared.slot(s.slot).dev[dev];
    let capped = cgroup_capped(s, dev);
    if !capped.is_empty() {
        p.mem_used.fetch_add(bytes, AcqRel);
        let over = capped
            .iter()
            .find(|(ns, hard)| crate::cglimits::used_in(s.shared, ns, dev) > *hard);
        if let Some((ns, hard)) = over {
            crate::shared::sub_saturating(&p.mem_used, bytes);
            crate::debug!("allocation of {bytes} B refused: cgroup {ns}'s hard limit is {hard} B");
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
    }
    let d = s.shared.dev(dev);
    let total = d.mem_total.load(Acquire);
    let charged = |mut now: u64| {
        if now > d.mem_peak.load(Acquire) {
            // A GPU frees a process's memory the moment the process dies; simgpu notices
            // lazily, but before a dead process's memory could count toward a new peak
            // (memory of slots another process is reclaiming right now counts as freed).
            s.shared.reclaim_dead();
            now = now.min(s.shared.mem_used_by_live(dev));
        }
        d.mem_peak.fetch_max(now, AcqRel);
        if capped.is_empty() {
            p.mem_used.fetch_add(bytes, AcqRel); // (a capped charge put it there first)
        }
        p.allocs.fetch_add(1, AcqRel);
        d.allocs.fetch_add(1, AcqRel);
    };
    if let Ok(prev) = d.mem_used.fetch_update(AcqRel, Acquire, |u| {
        (u + bytes <= total).then_some(u + bytes)
    }) {
        charged(prev + bytes);
        return Ok(());
    }
    s.shared.reclaim_dead();
    // Managed memory is evicted for the allocation, which takes the freed pages itself (as
    // RM's allocation gets the root chunks PMA's eviction callback frees, so a kernel's fault
    // cannot take them in between): the bytes are claimed first, then what is over the
    // device is evicted; if not enough can be, the claim is returned.
    let prev = d.mem_used.fetch_add(bytes, AcqRel);
    let mut over = (prev + bytes).saturating_sub(total);
    for _ in 0..2 {
        if over == 0 {
            break;
        }
        if managed::evict_bytes(s, dev, over) == 0 {
            break;
        }
        over = d.mem_used.load(Acquire).saturating_sub(total);
    }
    if over == 0 {
        charged(d.mem_used.load(Acquire).min(total));
        return Ok(());
    }
    crate::shared::sub_saturating(&d.mem_used, bytes);
    if !capped.is_empty() {
        crate::shared::sub_saturating(&p.mem_used, bytes);
    }
    Err(CUDA_ERROR_OUT_OF_MEMORY)
}

/// The per-cgroup hard limits on `dev` that apply to this process (none while no limit was
/// ever set: one relaxed load once the table is mapped, which the first charge does).
fn cgroup_capped(s: &Sim, dev: usize) -> Vec<(String, u64)> {
    match crate::cglimits::table(&s.cfg.state_dir, true) {
        Some(t) if t.any() => std::fs::read_to_string("/proc/self/cgroup")
            .map(|c| t.applying(&c, dev))
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

/// Returns `bytes` charged by `charge`.
pub fn uncharge(s: &Sim, dev: usize, bytes: u64) {
    if crate::sim::EXITED.load(Acquire) {
        return; // the slot and what it held were released at exit
    }
    crate::shared::sub_saturating(&s.shared.dev(dev).mem_used, bytes);
    crate::shared::sub_saturating(&s.shared.slot(s.slot).dev[dev].mem_used, bytes);
    s.shared.dev(dev).frees.fetch_add(1, AcqRel);
}

/// Allocates device memory on the current context's device.
pub fn alloc_device(size: u64, pool: usize) -> Result<u64, CUresult> {
    let ctx = current_ctx()?;
    sim()?.api_allocs.fetch_add(1, AcqRel);
    alloc_on(
        ctx.device,
        std::sync::Arc::as_ptr(&ctx) as usize,
        size,
        pool,
    )
}

/// Allocates device memory on `dev` (context-independent callers such as library globals).
pub fn alloc_on(dev: usize, ctx: usize, size: u64, pool: usize) -> Result<u64, CUresult> {
    if size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let s = sim()?;
    charge(s, dev, size)?;
    let base = match map_anon(size) {
        Ok(b) => b,
        Err(e) => {
            uncharge(s, dev, size);
            return Err(e);
        }
    };
    let a = Alloc {
        size,
        kind: Kind::Device,
        device: dev,
        charged: size,
        ctx,
        pool,
        id: 0,
        host_flags: 0,
    };
    if let Err(e) = insert_live(s, base, a) {
        uncharge(s, dev, size);
        unmap(base, size);
        return Err(e);
    }
    Ok(base)
}

/// Enters an allocation of context `a.ctx` (0: of no context) in the allocation table, unless
/// that context has been destroyed (CUDA_ERROR_CONTEXT_IS_DESTROYED; the caller undoes the
/// allocation). Under the table's lock, like `cuCtxDestroy`'s removal of the context and its
/// allocations: an allocation racing a destroy either fails or is freed with the context.
pub fn insert_live(s: &Sim, base: u64, a: Alloc) -> R {
    let mut t = s.mem.lock();
    if a.ctx != 0 && s.contexts.get(a.ctx).is_none() {
        return Err(CUDA_ERROR_CONTEXT_IS_DESTROYED);
    }
    t.insert(base, a);
    Ok(())
}

/// Waits for the device work the process has queued, as the freeing calls of the driver do
/// (`cuMemFree`, `cuArrayDestroy`, `cuMemUnmap`, `cuMemFreeHost`, context teardown): memory
/// never goes away under an operation that may still use it. On the engine thread (a free
/// reached in stream order) the preceding work is already done and nothing is waited for.
pub fn wait_for_users(s: &Sim) {
    s.engine.drain();
}

/// Frees a device or managed allocation by its base address.
pub fn free_device(p: u64) -> R {
    if p == 0 {
        return Ok(());
    }
    let s = sim()?;
    if ipc::is_imported(p) {
        return Err(CUDA_ERROR_INVALID_VALUE); // imported memory is closed, not freed
    }
    let pool = match s.mem.lock().map.get(&p) {
        Some(a) if matches!(a.kind, Kind::Device | Kind::Managed) => a.pool,
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    // cuMemFree synchronises, except for a pool allocation: then the caller must have made sure
    // that nothing uses it any more (CUDA's documented contract).
    if pool == 0 {
        wait_for_users(s);
    }
    let a = {
        let mut t = s.mem.lock();
        match t.map.get(&p) {
            Some(a) if matches!(a.kind, Kind::Device | Kind::Managed) => t.map.remove(&p).unwrap(),
            _ => return Err(CUDA_ERROR_INVALID_VALUE), // freed by another thread meanwhile
        }
    };
    ipc::forget_export(p);
    if a.kind == Kind::Managed {
        managed::forget(s, p, &a);
    }
    if a.pool != 0 {
        pool::released(a.pool, a.charged); // a pool allocation freed synchronously
    }
    uncharge(s, a.device, a.charged);
    unmap(p, a.size);
    Ok(())
}

/// The device and managed allocations and the arrays of context `ctx`, by base address.
pub fn context_allocations(t: &MemTable, ctx: usize) -> Vec<(u64, Kind)> {
    t.map
        .iter()
        .filter(|(_, a)| {
            a.ctx == ctx && matches!(a.kind, Kind::Device | Kind::Managed | Kind::Array)
        })
        .map(|(p, a)| (*p, a.kind))
        .collect()
}

/// Frees allocations listed by `context_allocations` (a context reset or destroy releases them,
/// as the driver does), once the work that may use them has completed. Returns how many were
/// freed.
pub fn free_allocations(s: &Sim, list: &[(u64, Kind)]) -> usize {
    wait_for_users(s);
    list.iter()
        .filter(|(p, kind)| match kind {
            Kind::Array => array::destroy_at(*p),
            _ => free_device(*p).is_ok(),
        })
        .count()
}

/// Frees every device and managed allocation and every array made in the context `ctx`.
/// Returns how many were freed.
pub fn free_context_allocations(ctx: usize) -> usize {
    let Some(s) = crate::sim::get() else { return 0 };
    let list = context_allocations(&s.mem.lock(), ctx);
    free_allocations(s, &list)
}

/// Is [p, p+len) inside one device-accessible allocation (device, managed, mapped VMM, pinned)?
pub fn device_range(s: &Sim, p: u64, len: u64) -> Option<(Kind, usize)> {
    let t = s.mem.lock();
    let (b, a) = t.find(p)?;
    (p + len <= b + a.size).then_some((a.kind, a.device))
}

/// The device of [p, p + len) if all of it is memory the device may write (allocations, managed
/// memory, mapped VMM pages, and page-locked host memory, which every context maps).
pub fn writable_device_range(s: &Sim, p: u64, len: u64) -> Option<usize> {
    match device_range(s, p, len)? {
        (Kind::Device | Kind::Managed | Kind::Host | Kind::Registered, d) => Some(d),
        (Kind::Reserved, d) if vmm::is_mapped(p, len) => Some(d),
        _ => None,
    }
}

/// Allocates page-locked host memory (a plain mapping here), tracked so copies treat it as pinned.
fn host_alloc(size: usize, flags: u32) -> Result<u64, CUresult> {
    let s = sim()?;
    let ctx = current_ctx()?;
    let base = map_anon(size as u64)?;
    s.mem.lock().insert(
        base,
        Alloc {
            size: size as u64,
            kind: Kind::Host,
            device: ctx.device,
            charged: 0,
            ctx: 0,
            pool: 0,
            id: 0,
            host_flags: flags,
        },
    );
    Ok(base)
}

driver! {
    fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, size: usize) {
        if dptr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(dptr, alloc_device(size as u64, 0)?)
    }

    fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: u32) {
        if dptr.is_null() || pitch.is_null() || !matches!(elem, 4 | 8 | 16) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let p = width.div_ceil(512) * 512;
        out(dptr, alloc_device((p * height) as u64, 0)?)?;
        out(pitch, p)
    }

    fn cuMemFree_v2(p: CUdeviceptr) {
        if let Some(r) = crate::model::capture::free_graph_alloc(p) {
            return r; // a graph allocation: freed, its address kept for the graph's next launch
        }
        if let Some(r) = ipc::free_pool_import(p) {
            return r; // imported from another process's pool: unmapped here
        }
        free_device(p)
    }

    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) {
        let s = sim()?;
        let d = s.shared.dev(current_ctx()?.device);
        let t = d.mem_total.load(Acquire);
        let u = d.mem_used.load(Acquire).min(t);
        if !free.is_null() {
            *free = (t - u) as usize;
        }
        if !total.is_null() {
            *total = t as usize;
        }
        Ok(())
    }

    fn cuMemGetAddressRange_v2(base: *mut CUdeviceptr, size: *mut usize, p: CUdeviceptr) {
        let s = sim()?;
        let t = s.mem.lock();
        let (b, a) = t.find(p).ok_or(CUDA_ERROR_NOT_FOUND)?;
        if !base.is_null() {
            *base = b;
        }
        if !size.is_null() {
            *size = a.size as usize;
        }
        Ok(())
    }

    fn cuMemAllocHost_v2(pp: *mut *mut c_void, size: usize) {
        out(pp, host_alloc(size, 0)? as *mut c_void)
    }

    fn cuMemHostAlloc(pp: *mut *mut c_void, size: usize, flags: u32) {
        if flags & !0x7 != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE); // PORTABLE | DEVICEMAP | WRITECOMBINED only
        }
        out(pp, host_alloc(size, flags)? as *mut c_void)
    }

    fn cuMemFreeHost(p: *mut c_void) {
        let s = sim()?;
        match s.mem.lock().map.get(&(p as u64)) {
            Some(a) if a.kind == Kind::Host => {}
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        wait_for_users(s); // queued copies may still read or write it
        let a = {
            let mut t = s.mem.lock();
            match t.map.get(&(p as u64)) {
                Some(a) if a.kind == Kind::Host => t.map.remove(&(p as u64)).unwrap(),
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            }
        };
        unmap(p as u64, a.size);
        Ok(())
    }

    fn cuMemHostGetDevicePointer_v2(dptr: *mut CUdeviceptr, p: *mut c_void, _flags: u32) {
        let s = sim()?;
        match device_range(s, p as u64, 1) {
            Some((Kind::Host | Kind::Registered, _)) => out(dptr, p as u64),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    fn cuMemHostGetFlags(flags: *mut u32, p: *mut c_void) {
        let s = sim()?;
        let t = s.mem.lock();
        match t.find(p as u64) {
            // Every context maps page-locked memory (unified addressing): DEVICEMAP is implied.
            Some((_, a)) if a.kind == Kind::Host => out(flags, a.host_flags | 0x2),
            Some((_, a)) if a.kind == Kind::Registered => out(flags, a.host_flags | 0x2),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    fn cuMemHostRegister_v2(p: *mut c_void, size: usize, flags: u32) {
        let s = sim()?;
        let ctx = current_ctx()?;
        if p.is_null() || size == 0 || flags & !0xf != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut t = s.mem.lock();
        // A range already registered (or any part of it) is CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED.
        let (lo, hi) = (p as u64, p as u64 + size as u64);
        if t.find(lo).is_some() || t.map.range(lo..hi).next().is_some() {
            return Err(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
        }
        t.insert(
            p as u64,
            Alloc { size: size as u64, kind: Kind::Registered, device: ctx.device, charged: 0, ctx: 0, pool: 0, id: 0, host_flags: flags },
        );
        Ok(())
    }

    fn cuMemHostUnregister(p: *mut c_void) {
        let s = sim()?;
        let mut t = s.mem.lock();
        match t.map.get(&(p as u64)) {
            Some(a) if a.kind == Kind::Registered => {
                t.map.remove(&(p as u64));
                Ok(())
            }
            _ => Err(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED),
        }
    }

    fn cuPointerGetAttribute(data: *mut c_void, attr: u32, p: CUdeviceptr) {
        if data.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let s = sim()?;
        let t = s.mem.lock();
        let (b, a) = t.find(p).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        write_attr(data, attr, p, b, a)
    }

    fn cuPointerGetAttributes(n: u32, attrs: *mut u32, data: *mut *mut c_void, p: CUdeviceptr) {
        if attrs.is_null() || data.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let s = sim()?;
        let t = s.mem.lock();
        let found = t.find(p);
        for i in 0..n as usize {
            let (attr, d) = (*attrs.add(i), *data.add(i));
            if d.is_null() {
                continue;
            }
            match found {
                Some((b, a)) => {
                    let _ = write_attr(d, attr, p, b, a);
                }
                None => {
                    // Not a CUDA pointer: attributes read as zero/NULL, and the call succeeds.
                    match attr {
                        1 | 3 | 4 | 7 | 11 | 12 | 14 | 17 | 18 | 19 | 20 => *(d as *mut u64) = 0,
                        9 => *(d as *mut i32) = -2,
                        _ => *(d as *mut u32) = 0,
                    }
                }
            }
        }
        Ok(())
    }

    fn cuPointerSetAttribute(_value: *const c_void, _attr: u32, p: CUdeviceptr) {
        let s = sim()?;
        s.mem.lock().find(p).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        Ok(())
    }
}

/// Writes attribute `attr` of pointer `p` (in allocation `a` at `base`) to `data`.
///
/// Safety: `data` is not NULL and points to writable storage of the attribute's type (the
/// cuPointerGetAttribute(s) contract; the callers check NULL).
unsafe fn write_attr(data: *mut c_void, attr: u32, p: u64, base: u64, a: &Alloc) -> R {
    // SAFETY: every arm writes one value of the type the API documents for that attribute,
    // which is what `data` points to (this fn's contract).
    unsafe {
        match attr {
            1 => *(data as *mut usize) = a.ctx,
            2 => {
                *(data as *mut u32) = match a.kind {
                    Kind::Host | Kind::Registered => CU_MEMORYTYPE_HOST,
                    // Managed memory reads as device memory (CU_MEMORYTYPE_UNIFIED is only a copy
                    // parameter); cudart then reports cudaMemoryTypeManaged from IS_MANAGED.
                    _ => CU_MEMORYTYPE_DEVICE,
                }
            }
            3 | 4 => *(data as *mut u64) = p,
            6 => *(data as *mut u32) = 1,
            7 | 20 => *(data as *mut u64) = a.id,
            8 => *(data as *mut i32) = (a.kind == Kind::Managed) as i32,
            9 => *(data as *mut i32) = crate::sim::get().map_or(-1, |s| s.ordinal(a.device)),
            10 => *(data as *mut i32) = 0,
            11 | 19 => *(data as *mut u64) = base,
            12 | 18 => *(data as *mut usize) = a.size as usize,
            13 => *(data as *mut i32) = 1,
            14 => *(data as *mut u64) = 0,
            15 => *(data as *mut i32) = 0,
            16 => *(data as *mut u32) = 3, // CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE
            17 => *(data as *mut usize) = a.pool,
            21 => *(data as *mut i32) = 0, // CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE
            22 => *(data as *mut i32) = 0, // LOCALITY_DOMAIN_ORDINAL: one domain per device
            _ => {
                crate::debug!("cuPointerGetAttribute: unknown attribute {attr}");
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
        }
    }
    Ok(())
}
