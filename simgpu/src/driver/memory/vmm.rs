//! Virtual memory management (cuMemCreate / cuMemMap …), as PyTorch's expandable segments use it.
//! Physical allocations are memfd-backed, so a handle mapped at two addresses really aliases.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::ffi::c_void;

use super::{charge, uncharge, Alloc, Kind};
use crate::driver;
use crate::driver::out;
use crate::sim::sim;
use crate::types::*;

const GRANULARITY: usize = 2 << 20;

struct Phys {
    fd: i32,
    size: u64,
    dev: usize,
    prop: MemAllocationProp,
    /// Device memory (charged to the device); host-located allocations are not.
    charged: bool,
    /// References: the creation plus each cuMemRetainAllocationHandle; freed at zero.
    refs: u32,
}

/// Physical handles (by handle value) and mappings (VA -> (size, handle)).
// SAFETY: MemAllocationProp holds an unused (Windows-only) pointer field; never dereferenced.
unsafe impl Send for Phys {}

static PHYS: Mutex<BTreeMap<usize, Phys>> = Mutex::new(BTreeMap::new());
static MAPS: Mutex<BTreeMap<u64, (u64, usize)>> = Mutex::new(BTreeMap::new());

/// Is [p, p + len) entirely covered by mappings made with `cuMemMap` (adjacent ones included)?
pub fn is_mapped(p: u64, len: u64) -> bool {
    let maps = MAPS.lock();
    let (mut at, end) = (p, p + len.max(1));
    while at < end {
        match maps.range(..=at).next_back() {
            Some((b, (size, _))) if at < b + size => at = b + size,
            _ => return false,
        }
    }
    true
}
/// Frees physical allocation `h` once it has neither handle references nor mappings left: as
/// in CUDA, `cuMemRelease` of a mapped allocation frees nothing until its last `cuMemUnmap`.
fn free_if_unused(s: &crate::sim::Sim, phys: &mut BTreeMap<usize, Phys>, h: usize) {
    let unused =
        phys.get(&h).is_some_and(|p| p.refs == 0) && !MAPS.lock().values().any(|(_, mh)| *mh == h);
    if !unused {
        return;
    }
    let p = phys.remove(&h).expect("present");
    if p.fd >= 0 {
        // SAFETY: our own descriptor, closed once (the entry is gone).
        unsafe { libc::close(p.fd) };
    }
    if p.charged {
        uncharge(s, p.dev, p.size);
    }
}

static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0x1000);

driver! {
    fn cuMemGetAllocationGranularity(g: *mut usize, _prop: *const MemAllocationProp, _opt: u32) {
        out(g, GRANULARITY)
    }
    fn cuMemAddressReserve(ptr: *mut CUdeviceptr, size: usize, _align: usize, _addr: CUdeviceptr, _flags: u64) {
        let s = sim()?;
        if ptr.is_null() || size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: a fresh PROT_NONE reservation; pages become usable through cuMemMap.
        let p = libc::mmap(std::ptr::null_mut(), size, libc::PROT_NONE,
                           libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE, -1, 0);
        if p == libc::MAP_FAILED {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let dev = crate::driver::current_ctx_opt().map_or(0, |c| c.device);
        s.mem.lock().insert(p as u64, Alloc { size: size as u64, kind: Kind::Reserved, device: dev, charged: 0, ctx: 0, pool: 0, id: 0, host_flags: 0 });
        out(ptr, p as u64)
    }
    fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) {
        let s = sim()?;
        match s.mem.lock().map.get(&ptr) {
            Some(a) if a.kind == Kind::Reserved => {}
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        super::wait_for_users(s);
        let a = s.mem.lock().map.remove(&ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        libc::munmap(ptr as *mut c_void, a.size.max(size as u64) as usize);
        Ok(())
    }
    fn cuMemCreate(handle: *mut u64, size: usize, prop: *const MemAllocationProp, _flags: u64) {
        let s = sim()?;
        let prop = *prop.as_ref().ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if handle.is_null() || size == 0 || !size.is_multiple_of(GRANULARITY) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // Host locations (HOST, HOST_NUMA, HOST_NUMA_CURRENT) are host memory: not charged.
        let host = matches!(prop.location.kind, 2..=4);
        if !host && prop.location.kind != CU_MEM_LOCATION_TYPE_DEVICE {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        let dev = if host { crate::driver::current_ctx_opt().map_or(0, |c| c.device) } else { s.device(prop.location.id)? };
        if !host {
            s.api_allocs.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            charge(s, dev, size as u64)?;
        }
        let fd = libc::memfd_create(c"simgpu-vmm".as_ptr(), libc::MFD_CLOEXEC);
        if fd < 0 || libc::ftruncate(fd, size as i64) != 0 {
            if !host {
                uncharge(s, dev, size as u64);
            }
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let h = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        PHYS.lock().insert(h, Phys { fd, size: size as u64, dev, prop, charged: !host, refs: 1 });
        out(handle, h as u64)
    }
    fn cuMemRelease(handle: u64) {
        let s = sim()?;
        let mut phys = PHYS.lock();
        let p = phys.get_mut(&(handle as usize)).filter(|p| p.refs > 0).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        p.refs -= 1;
        free_if_unused(s, &mut phys, handle as usize);
        Ok(())
    }
    fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: u64, _flags: u64) {
        let s = sim()?;
        let phys = PHYS.lock();
        // A released handle no longer names the memory (its mappings keep it alive).
        let p = phys.get(&(handle as usize)).filter(|p| p.refs > 0).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if p.fd < 0 {
            return Err(CUDA_ERROR_NOT_SUPPORTED); // a handle of cuMemAlloc memory: not remappable
        }
        if offset as u64 + size as u64 > p.size {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        match super::device_range(s, ptr, size as u64) {
            Some((Kind::Reserved, _)) => {}
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        // SAFETY: [ptr, ptr+size) lies inside our own reservation (checked above).
        let r = libc::mmap(ptr as *mut c_void, size, libc::PROT_READ | libc::PROT_WRITE,
                           libc::MAP_SHARED | libc::MAP_FIXED, p.fd, offset as i64);
        if r == libc::MAP_FAILED {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        MAPS.lock().insert(ptr, (size as u64, handle as usize));
        Ok(())
    }
    fn cuMemUnmap(ptr: CUdeviceptr, size: usize) {
        let s = sim()?;
        if !MAPS.lock().contains_key(&ptr) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // Synchronous, like cuMemFree: queued work may still use the range.
        super::wait_for_users(s);
        let mut phys = PHYS.lock();
        let (_, h) = MAPS.lock().remove(&ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: turning our own mapped range back into a PROT_NONE reservation.
        libc::mmap(ptr as *mut c_void, size, libc::PROT_NONE,
                   libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED, -1, 0);
        free_if_unused(s, &mut phys, h);
        Ok(())
    }
    fn cuMemSetAccess(ptr: CUdeviceptr, _size: usize, desc: *const MemAccessDesc, count: usize) {
        sim()?;
        if desc.is_null() || count == 0 || ptr == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        Ok(())
    }
    fn cuMemGetAccess(flags: *mut u64, _loc: *const MemLocation, ptr: CUdeviceptr) {
        sim()?;
        let m = MAPS.lock();
        let mapped = m.range(..=ptr).next_back().is_some_and(|(b, (sz, _))| ptr < b + sz);
        out(flags, if mapped { 3 } else { 0 })
    }
    fn cuMemRetainAllocationHandle(handle: *mut u64, addr: *mut c_void) {
        let s = sim()?;
        let a = addr as u64;
        {
            let mut phys = PHYS.lock(); // PHYS before MAPS, as everywhere
            let mapped = MAPS.lock().range(..=a).next_back().filter(|(b, (sz, _))| a < *b + sz).map(|(_, (_, h))| *h);
            if let Some(h) = mapped {
                if let Some(p) = phys.get_mut(&h) {
                    p.refs += 1;
                }
                return out(handle, h as u64);
            }
        }
        // cuMemAlloc memory: current drivers build it on VMM, so it has an allocation handle too.
        // This one describes the allocation (properties, size) but cannot be mapped elsewhere.
        let (dev, size) = {
            let t = s.mem.lock();
            match t.find(a) {
                Some((_, al)) if al.kind == Kind::Device => (al.device, al.size),
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            }
        };
        let mut prop: MemAllocationProp = std::mem::zeroed();
        prop.kind = 1; // CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location = MemLocation { kind: CU_MEM_LOCATION_TYPE_DEVICE, id: s.ordinal(dev) };
        let h = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        PHYS.lock().insert(h, Phys { fd: -1, size, dev, prop, charged: false, refs: 1 });
        out(handle, h as u64)
    }
    fn cuMemExportToShareableHandle(shareable: *mut c_void, handle: u64, kind: u32, _flags: u64) {
        sim()?;
        let phys = PHYS.lock();
        let p = phys.get(&(handle as usize)).filter(|p| p.refs > 0).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if kind != super::handle::HANDLE_TYPE_POSIX_FD {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        // Only what cuMemCreate was asked to make shareable that way (requestedHandleTypes).
        if shareable.is_null() || p.fd < 0 || p.prop.requested_handle_types & kind == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // The memfd itself, with a trailer past its bytes saying what it is; the application
        // owns (and closes) the new descriptor.
        let mut prop = [0u8; 32];
        std::ptr::copy_nonoverlapping(&p.prop as *const MemAllocationProp as *const u8, prop.as_mut_ptr(), 32);
        let t = super::handle::Trailer { kind: super::handle::SHARED_VMM, dev: p.dev as u32, size: p.size, prop };
        super::handle::write_trailer(p.fd, &t)?;
        let fd = super::handle::dup_fd(p.fd)?;
        *(shareable as *mut i32) = fd;
        Ok(())
    }
    fn cuMemImportFromShareableHandle(handle: *mut u64, os_handle: *mut c_void, kind: u32) {
        sim()?;
        if kind != super::handle::HANDLE_TYPE_POSIX_FD {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        if handle.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // A POSIX descriptor is passed by value in the pointer; the application keeps it.
        let t = super::handle::read_trailer(os_handle as usize as i32)?;
        if t.kind != super::handle::SHARED_VMM {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let fd = super::handle::dup_fd(os_handle as usize as i32)?;
        let mut prop: MemAllocationProp = std::mem::zeroed();
        std::ptr::copy_nonoverlapping(t.prop.as_ptr(), &mut prop as *mut MemAllocationProp as *mut u8, 32);
        prop.win32_handle_meta_data = std::ptr::null_mut();
        let h = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Not charged here: the memory is the exporter's (charged to it while it holds it).
        PHYS.lock().insert(h, Phys { fd, size: t.size, dev: t.dev as usize, prop, charged: false, refs: 1 });
        out(handle, h as u64)
    }
    fn cuMemGetAllocationPropertiesFromHandle(prop: *mut MemAllocationProp, handle: u64) {
        sim()?;
        let phys = PHYS.lock();
        let p = phys.get(&(handle as usize)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        out(prop, p.prop)
    }
}
