//! Stream-ordered allocation and memory pools. Pools do not cache here: memory is charged at
//! allocation and returned when the free executes in stream order, so `cuMemGetInfo` is exact.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::{Arc, OnceLock};

use super::memory::{alloc_device, free_device};
use super::{current_ctx, out, stream_ref, submit, R};
use crate::engine::Op;
use crate::sim::sim;
use crate::types::*;
use crate::{driver, driver_ptds};

pub struct Pool {
    pub dev: usize,
    pub used: AtomicU64,
    pub used_high: AtomicU64,
    pub release_threshold: AtomicU64,
}

fn pools() -> &'static Mutex<HashMap<usize, Arc<Pool>>> {
    static P: OnceLock<Mutex<HashMap<usize, Arc<Pool>>>> = OnceLock::new();
    P.get_or_init(|| Mutex::new(HashMap::new()))
}

fn new_pool(dev: usize) -> usize {
    let p = Arc::new(Pool {
        dev,
        used: AtomicU64::new(0),
        used_high: AtomicU64::new(0),
        release_threshold: AtomicU64::new(0),
    });
    let h = Arc::as_ptr(&p) as usize;
    pools().lock().insert(h, p);
    h
}

/// The default (or current) pool of a device.
fn device_pool(dev: usize) -> usize {
    static DEFAULT: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());
    let mut d = DEFAULT.lock();
    if let Some((_, h)) = d.iter().find(|(x, _)| *x == dev) {
        return *h;
    }
    let h = new_pool(dev);
    d.push((dev, h));
    h
}

fn pool(h: *mut c_void) -> Result<Arc<Pool>, CUresult> {
    pools()
        .lock()
        .get(&(h as usize))
        .cloned()
        .ok_or(CUDA_ERROR_INVALID_HANDLE)
}

/// Safety: `dptr` is NULL or writable (cuMemAllocAsync's out-argument).
unsafe fn alloc_async(
    dptr: *mut CUdeviceptr,
    size: usize,
    ph: usize,
    h: CUstream,
    ptds: bool,
) -> R {
    if dptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let r = stream_ref(h, ptds)?;
    let p = pool(ph as *mut c_void)?;
    if let Some(g) = crate::driver::graph::capturing(r.id) {
        // Captured: the graph owns the allocation (address fixed now, freed with the graph).
        let ptr = alloc_device(size as u64, 0)?;
        crate::driver::graph::add_captured_alloc(&g, ptr, size, p.dev);
        // SAFETY: not NULL (checked above), so writable (this fn's contract).
        unsafe { *dptr = ptr };
        return Ok(());
    }
    let ptr = alloc_device(size as u64, ph)?;
    let u = p.used.fetch_add(size as u64, AcqRel) + size as u64;
    p.used_high.fetch_max(u, AcqRel);
    // SAFETY: not NULL (checked above), so writable (this fn's contract).
    unsafe { *dptr = ptr };
    Ok(())
}

driver! {
    fn cuDeviceGetDefaultMemPool(pool: *mut *mut c_void, dev: CUdevice) {
        let d = sim()?.device(dev)?;
        out(pool, device_pool(d) as *mut c_void)
    }
    fn cuDeviceGetMemPool(pool: *mut *mut c_void, dev: CUdevice) {
        let d = sim()?.device(dev)?;
        out(pool, device_pool(d) as *mut c_void)
    }
    fn cuDeviceSetMemPool(dev: CUdevice, p: *mut c_void) {
        sim()?.device(dev)?;
        pool(p)?;
        Ok(())
    }
    fn cuMemGetDefaultMemPool(pool_out: *mut *mut c_void, loc: *const MemLocation, _kind: u32) {
        let loc = loc.as_ref().ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let d = sim()?.device(loc.id)?;
        out(pool_out, device_pool(d) as *mut c_void)
    }
    fn cuMemGetMemPool(pool_out: *mut *mut c_void, loc: *const MemLocation, _kind: u32) {
        let loc = loc.as_ref().ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let d = sim()?.device(loc.id)?;
        out(pool_out, device_pool(d) as *mut c_void)
    }
    fn cuMemSetMemPool(_loc: *const MemLocation, _kind: u32, p: *mut c_void) {
        pool(p)?;
        Ok(())
    }
    fn cuDeviceGetGraphMemAttribute(dev: CUdevice, _attr: u32, value: *mut u64) {
        // Graph memory nodes are not simulated: no graph-owned memory, current or high-water.
        sim()?.device(dev)?;
        out(value, 0)
    }
    fn cuDeviceSetGraphMemAttribute(dev: CUdevice, _attr: u32, _value: *mut u64) {
        sim()?.device(dev)?;
        Ok(())
    }
    fn cuDeviceGraphMemTrim(dev: CUdevice) {
        sim()?.device(dev)?;
        Ok(())
    }
    fn cuMemPoolCreate(p: *mut *mut c_void, props: *const MemPoolProps) {
        let props = props.as_ref().ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let d = sim()?.device(props.location.id)?;
        out(p, new_pool(d) as *mut c_void)
    }
    fn cuMemPoolDestroy(p: *mut c_void) {
        pools().lock().remove(&(p as usize)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        Ok(())
    }
    fn cuMemPoolTrimTo(p: *mut c_void, _keep: usize) {
        pool(p)?;
        Ok(())
    }
    fn cuMemPoolSetAttribute(p: *mut c_void, attr: u32, value: *mut c_void) {
        let p = pool(p)?;
        if value.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        match attr {
            4 => p.release_threshold.store(*(value as *const u64), Release),
            6 => p.used_high.store(p.used.load(Acquire), Release), // reset high-water marks
            8 => p.used_high.store(p.used.load(Acquire), Release),
            1..=3 => {}
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        Ok(())
    }
    fn cuMemPoolGetAttribute(p: *mut c_void, attr: u32, value: *mut c_void) {
        let p = pool(p)?;
        if value.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        match attr {
            1..=3 => *(value as *mut i32) = 1,
            4 => *(value as *mut u64) = p.release_threshold.load(Acquire),
            5 | 7 => *(value as *mut u64) = p.used.load(Acquire),
            6 | 8 => *(value as *mut u64) = p.used_high.load(Acquire),
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        Ok(())
    }
    fn cuMemPoolSetAccess(p: *mut c_void, _desc: *const MemAccessDesc, _n: usize) {
        pool(p)?;
        Ok(())
    }
    fn cuMemPoolGetAccess(flags: *mut u32, p: *mut c_void, _loc: *const MemLocation) {
        pool(p)?;
        out(flags, 3)
    }
}

driver_ptds! {
    fn cuMemAllocAsync / cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, size: usize, h: CUstream) |ptds| {
        let dev = current_ctx()?.device;
        alloc_async(dptr, size, device_pool(dev), h, ptds)
    }
    fn cuMemAllocFromPoolAsync / cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, size: usize, p: *mut c_void, h: CUstream) |ptds| {
        alloc_async(dptr, size, p as usize, h, ptds)
    }
    fn cuMemFreeAsync / cuMemFreeAsync_ptsz(ptr: CUdeviceptr, h: CUstream) |ptds| {
        let s = sim()?;
        let r = stream_ref(h, ptds)?;
        if let Some(g) = crate::driver::graph::capturing(r.id) {
            // Captured: a free node; the memory goes when the graph no longer needs it.
            s.mem.lock().map.get(&ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            crate::driver::graph::add_captured_free(&g, ptr);
            return Ok(());
        }
        let (size, ph) = {
            let t = s.mem.lock();
            let a = t.map.get(&ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            (a.size, a.pool)
        };
        submit(s, &r, Op::marker().with_effect(move || {
            if let Ok(p) = pool(ph as *mut c_void) {
                crate::shared::sub_saturating(&p.used, size);
            }
            let _ = free_device(ptr);
        }));
        Ok(())
    }
}
