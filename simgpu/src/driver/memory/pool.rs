//! Stream-ordered allocation and memory pools. A free that the stream reaches gives its block
//! back to the pool, which keeps it (still device memory, counted as in use by the device) for
//! reuse by later allocations from the pool, as long as the pool's reserved memory stays within
//! its release threshold (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`, default 0: nothing is kept);
//! `cuMemPoolTrimTo` releases kept blocks. Reserved = in use + kept, kept as its own figure that
//! changes only when memory enters or leaves the pool (as a driver's does): a block moving
//! between in use and kept never makes it dip, so a reader (the shim reconciling its charge)
//! never sees the pool hold less than the device gave it.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::{Arc, OnceLock};

use super::ipc::{self, IpcHandle, POOL_PTR_MAGIC};
use super::{alloc_device, free_device, insert_live, Alloc, Kind};
use crate::driver::{current_ctx, out, stream_ref, submit, R};
use crate::engine::Op;
use crate::sim::sim;
use crate::types::*;
use crate::{driver, driver_ptds};

pub struct Pool {
    pub dev: usize,
    pub used: AtomicU64,
    pub used_high: AtomicU64,
    pub release_threshold: AtomicU64,
    /// Freed blocks kept for reuse: (base, size), still mapped and charged to the device.
    cache: Mutex<Vec<(u64, u64)>>,
    cached: AtomicU64,
    /// Memory mapped for the pool: in use + kept.
    reserved: AtomicU64,
    reserved_high: AtomicU64,
}

impl Pool {
    fn reserved(&self) -> u64 {
        self.reserved.load(Acquire)
    }

    /// A block of `bytes` in use: a kept one, or (`grown`) one the pool just took from the device.
    fn note_use(&self, bytes: u64, grown: bool) {
        let u = self.used.fetch_add(bytes, AcqRel) + bytes;
        self.used_high.fetch_max(u, AcqRel);
        if grown {
            let r = self.reserved.fetch_add(bytes, AcqRel) + bytes;
            self.reserved_high.fetch_max(r, AcqRel);
        }
    }

    /// The smallest kept block of at least `size` bytes, taken out of the cache.
    fn take_cached(&self, size: u64) -> Option<(u64, u64)> {
        let mut c = self.cache.lock();
        let i = (0..c.len())
            .filter(|&i| c[i].1 >= size)
            .min_by_key(|&i| c[i].1)?;
        let block = c.swap_remove(i);
        self.cached.fetch_sub(block.1, AcqRel);
        Some(block)
    }

    /// Releases kept blocks to the device until the pool reserves at most `keep` bytes (or
    /// keeps nothing).
    fn release_down_to(&self, keep: u64) {
        let s = crate::sim::get();
        let mut c = self.cache.lock();
        while self.reserved() > keep {
            let Some((base, size)) = c.pop() else { break };
            self.cached.fetch_sub(size, AcqRel);
            crate::shared::sub_saturating(&self.reserved, size);
            if let Some(s) = s {
                super::uncharge(s, self.dev, size);
            }
            super::unmap(base, size);
        }
    }

    /// A freed block of this pool, reached in stream order: kept or released.
    fn give_back(&self, base: u64, size: u64) {
        crate::shared::sub_saturating(&self.used, size);
        self.keep(base, size);
        self.release_down_to(self.release_threshold.load(Acquire));
    }

    /// Puts a block (mapped and charged) into the cache of kept blocks.
    fn keep(&self, base: u64, size: u64) {
        self.cache.lock().push((base, size));
        self.cached.fetch_add(size, AcqRel);
    }
}

type Sharing = (HashMap<usize, u32>, std::collections::HashSet<usize>);

/// Pools made exportable (cuMemPoolCreate with `handleTypes`), with those types, and pools
/// imported from another process (`cuMemPoolImportFromShareableHandle`): these only import
/// pointers; allocating from them is CUDA_ERROR_INVALID_VALUE, as in CUDA.
fn sharing() -> &'static Mutex<Sharing> {
    static S: OnceLock<Mutex<Sharing>> = OnceLock::new();
    S.get_or_init(Default::default)
}

/// Pool `ph` may export its allocations (a POSIX file-descriptor pool).
pub fn exportable(ph: usize) -> bool {
    sharing()
        .lock()
        .0
        .get(&ph)
        .is_some_and(|t| t & super::handle::HANDLE_TYPE_POSIX_FD != 0)
}

/// Pool `ph` was imported from another process.
pub fn imported(ph: usize) -> bool {
    sharing().lock().1.contains(&ph)
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
        cache: Mutex::new(Vec::new()),
        cached: AtomicU64::new(0),
        reserved: AtomicU64::new(0),
        reserved_high: AtomicU64::new(0),
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

/// A block of pool `ph` was freed outside stream order (`cuMemFree`, a context teardown): it is
/// no longer in use, and not kept either (it leaves the pool).
pub fn released(ph: usize, bytes: u64) {
    if let Ok(p) = pool(ph as *mut c_void) {
        crate::shared::sub_saturating(&p.used, bytes);
        crate::shared::sub_saturating(&p.reserved, bytes);
    }
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
    if imported(ph) {
        return Err(CUDA_ERROR_INVALID_VALUE); // an imported pool only imports pointers
    }
    if let Some(g) = crate::model::capture::capturing(r.id) {
        // Captured: the graph owns the allocation (address fixed now, freed with the graph).
        let ptr = alloc_device(size as u64, 0)?;
        crate::model::capture::add_captured_alloc(&g, ptr, size, p.dev);
        // SAFETY: not NULL (checked above), so writable (this fn's contract).
        unsafe { *dptr = ptr };
        return Ok(());
    }
    let (ptr, block, grown) = match p.take_cached(size as u64) {
        Some((base, block)) => {
            // A kept block: already mapped and charged to the device.
            let s = sim()?;
            let ctx = current_ctx()?;
            s.api_allocs.fetch_add(1, AcqRel);
            let a = Alloc {
                size: block,
                kind: Kind::Device,
                device: p.dev,
                charged: block,
                ctx: Arc::as_ptr(&ctx) as usize,
                pool: ph,
                id: 0,
                host_flags: 0,
            };
            if let Err(e) = insert_live(s, base, a) {
                p.keep(base, block); // the context is gone: the block stays the pool's
                return Err(e);
            }
            (base, block, false)
        }
        None => (alloc_device(size as u64, ph)?, size as u64, true),
    };
    p.note_use(block, grown);
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
    fn cuMemGetDefaultMemPool(pool_out: *mut *mut c_void, loc: *mut MemLocation, _kind: u32) {
        let loc = loc.as_ref().ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let d = sim()?.device(loc.id)?;
        out(pool_out, device_pool(d) as *mut c_void)
    }
    fn cuMemGetMemPool(pool_out: *mut *mut c_void, loc: *mut MemLocation, _kind: u32) {
        let loc = loc.as_ref().ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let d = sim()?.device(loc.id)?;
        out(pool_out, device_pool(d) as *mut c_void)
    }
    fn cuMemSetMemPool(_loc: *mut MemLocation, _kind: u32, p: *mut c_void) {
        pool(p)?;
        Ok(())
    }
    fn cuDeviceGetGraphMemAttribute(dev: CUdevice, _attr: u32, value: *mut c_void) {
        // Graph memory nodes are not simulated: no graph-owned memory, current or high-water.
        // Every CUgraphMem_attribute's value is a cuuint64_t.
        sim()?.device(dev)?;
        out(value.cast::<u64>(), 0)
    }
    fn cuDeviceSetGraphMemAttribute(dev: CUdevice, _attr: u32, _value: *mut c_void) {
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
        if props.handle_types & !super::handle::HANDLE_TYPE_POSIX_FD != 0 {
            return Err(CUDA_ERROR_NOT_SUPPORTED); // Win32 and fabric handles: not on Linux here
        }
        let h = new_pool(d);
        if props.handle_types != 0 {
            sharing().lock().0.insert(h, props.handle_types);
        }
        out(p, h as *mut c_void)
    }
    fn cuMemPoolExportToShareableHandle(handle_out: *mut c_void, p: *mut c_void, kind: u32, _flags: u64) {
        let pl = pool(p)?;
        if kind != super::handle::HANDLE_TYPE_POSIX_FD {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        if handle_out.is_null() || !exportable(p as usize) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // A small file that says "a pool of device d"; its allocations travel as pointers.
        let fd = libc::memfd_create(c"simgpu-pool".as_ptr(), libc::MFD_CLOEXEC);
        if fd < 0 {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let t = super::handle::Trailer { kind: super::handle::SHARED_POOL, dev: pl.dev as u32, size: 0, prop: [0; 32] };
        if let Err(e) = super::handle::write_trailer(fd, &t) {
            libc::close(fd);
            return Err(e);
        }
        *(handle_out as *mut i32) = fd;
        Ok(())
    }
    fn cuMemPoolImportFromShareableHandle(pool_out: *mut *mut c_void, handle: *mut c_void, kind: u32, _flags: u64) {
        sim()?;
        if kind != super::handle::HANDLE_TYPE_POSIX_FD {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        if pool_out.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // The descriptor is passed by value in the pointer, as CUDA does for POSIX handles.
        let t = super::handle::read_trailer(handle as usize as i32)?;
        if t.kind != super::handle::SHARED_POOL {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let h = new_pool(t.dev as usize);
        sharing().lock().1.insert(h);
        out(pool_out, h as *mut c_void)
    }
    fn cuMemPoolDestroy(p: *mut c_void) {
        let p = pools().lock().remove(&(p as usize)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        {
            let mut sh = sharing().lock();
            sh.0.remove(&(Arc::as_ptr(&p) as usize));
            sh.1.remove(&(Arc::as_ptr(&p) as usize));
        }
        p.release_down_to(0);
        Ok(())
    }
    fn cuMemPoolTrimTo(p: *mut c_void, keep: usize) {
        pool(p)?.release_down_to(keep as u64);
        Ok(())
    }
    fn cuMemPoolSetAttribute(p: *mut c_void, attr: u32, value: *mut c_void) {
        let p = pool(p)?;
        if value.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        match attr {
            4 => p.release_threshold.store(*(value as *const u64), Release),
            // Reset the high-water marks to the current values.
            6 => p.reserved_high.store(p.reserved(), Release),
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
            5 => *(value as *mut u64) = p.reserved(),
            6 => *(value as *mut u64) = p.reserved_high.load(Acquire),
            7 => *(value as *mut u64) = p.used.load(Acquire),
            8 => *(value as *mut u64) = p.used_high.load(Acquire),
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        Ok(())
    }
    fn cuMemPoolSetAccess(p: *mut c_void, _desc: *const MemAccessDesc, _n: usize) {
        pool(p)?;
        Ok(())
    }
    fn cuMemPoolGetAccess(flags: *mut u32, p: *mut c_void, _loc: *mut MemLocation) {
        pool(p)?;
        out(flags, 3)
    }

    fn cuMemPoolExportPointer(data: *mut u8, dptr: CUdeviceptr) {
        // CUmemPoolPtrExportData: 64 opaque bytes, laid out as an IPC handle. Only allocations
        // of a pool made exportable (cuMemPoolCreate with a handle type).
        out(data as *mut IpcHandle, IpcHandle(ipc::export(dptr, POOL_PTR_MAGIC, exportable)?))
    }

    fn cuMemPoolImportPointer(dptr: *mut CUdeviceptr, pool: *mut c_void, data: *mut u8) {
        if !imported(pool as usize) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let h = *(data as *const IpcHandle).as_ref().ok_or(CUDA_ERROR_INVALID_VALUE)?;
        ipc::open(dptr, h, POOL_PTR_MAGIC)
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
        if let Some(g) = crate::model::capture::capturing(r.id) {
            // Captured: a free node; the memory goes when the graph no longer needs it.
            s.mem.lock().map.get(&ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            crate::model::capture::add_captured_free(&g, ptr);
            return Ok(());
        }
        if let Some(r) = crate::model::capture::free_graph_alloc(ptr) {
            return r; // a graph allocation: freed, its address kept for the graph's next launch
        }
        if ipc::is_pool_import(ptr) {
            // Imported from another process's pool: unmapped here when the stream reaches it.
            submit(s, &r, Op::marker().with_effect(move || {
                let _ = ipc::free_pool_import(ptr);
            }));
            return Ok(());
        }
        let ph = s.mem.lock().map.get(&ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?.pool;
        submit(s, &r, Op::marker().with_effect(move || {
            let kept = pool(ph as *mut c_void).ok().and_then(|p| {
                // Out of the allocation table (the pointer is no longer the application's),
                // into the pool.
                let a = crate::sim::get()?.mem.lock().map.remove(&ptr)?;
                ipc::forget_export(ptr);
                p.give_back(ptr, a.charged);
                Some(())
            });
            if kept.is_none() {
                let _ = free_device(ptr);
            }
        }));
        Ok(())
    }
}
