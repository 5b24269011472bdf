//! Device memory as the simulator holds it: every allocation of the process by base address
//! (`MemTable`, in `Sim::mem`) and the anonymous mappings that back device pointers. The exports
//! that allocate, free and copy are `driver/memory.rs`.

use std::collections::BTreeMap;
use std::ffi::c_void;

use crate::types::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Device,
    /// Page-locked host memory from cuMemHostAlloc / cuMemAllocHost.
    Host,
    /// Host memory registered with cuMemHostRegister (not owned).
    Registered,
    Managed,
    /// A VMM reservation (cuMemAddressReserve); mapped ranges are accounted by their handle.
    Reserved,
    /// The storage of a CUDA array (see `array.rs`): device memory reached through its handle.
    Array,
}

#[derive(Clone, Debug)]
pub struct Alloc {
    pub size: u64,
    pub kind: Kind,
    pub device: usize,
    /// Bytes charged to the device for this allocation.
    pub charged: u64,
    pub ctx: usize,
    /// Memory pool the allocation came from (stream-ordered allocations).
    pub pool: usize,
    pub id: u64,
    /// Host memory: the flags it was allocated (CU_MEMHOSTALLOC_*) or registered
    /// (CU_MEMHOSTREGISTER_*) with.
    pub host_flags: u32,
}

#[derive(Default)]
pub struct MemTable {
    pub map: BTreeMap<u64, Alloc>,
    next_id: u64,
}

impl MemTable {
    /// The allocation containing `p`, as (base, alloc).
    pub fn find(&self, p: u64) -> Option<(u64, &Alloc)> {
        let (b, a) = self.map.range(..=p).next_back()?;
        (p < b + a.size.max(1)).then_some((*b, a))
    }
    pub fn insert(&mut self, base: u64, mut a: Alloc) -> u64 {
        self.next_id += 1;
        a.id = self.next_id;
        self.map.insert(base, a);
        self.next_id
    }
}

/// Maps `size` bytes of zeroed memory (address-space only until touched).
pub fn map_anon(size: u64) -> Result<u64, CUresult> {
    // SAFETY: anonymous private mapping; the caller owns it until unmap().
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size.max(1) as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        Err(CUDA_ERROR_OUT_OF_MEMORY)
    } else {
        Ok(p as u64)
    }
}

pub fn unmap(base: u64, size: u64) {
    // SAFETY: base/size came from map_anon.
    unsafe { libc::munmap(base as *mut c_void, size.max(1) as usize) };
}

/// A 3D copy descriptor that graph builders may keep (its pointers are the application's).
#[derive(Clone, Copy)]
pub struct Copy3D(pub Memcpy3D);
// SAFETY: the raw pointers are only addresses, not owned data; the CUDA contract makes the
// application keep them valid while the copy can run, from whichever thread runs it.
unsafe impl Send for Copy3D {}
// SAFETY: as for Send: shared access only reads the addresses, it never dereferences them.
unsafe impl Sync for Copy3D {}

impl Copy3D {
    pub fn from_2d(p: &Memcpy2D) -> Copy3D {
        Copy3D(Memcpy3D {
            src_x_in_bytes: p.src_x_in_bytes,
            src_y: p.src_y,
            src_z: 0,
            src_lod: 0,
            src_memory_type: p.src_memory_type,
            src_host: p.src_host,
            src_device: p.src_device,
            src_array: p.src_array,
            reserved0: std::ptr::null_mut(),
            src_pitch: p.src_pitch,
            src_height: p.height,
            dst_x_in_bytes: p.dst_x_in_bytes,
            dst_y: p.dst_y,
            dst_z: 0,
            dst_lod: 0,
            dst_memory_type: p.dst_memory_type,
            dst_host: p.dst_host,
            dst_device: p.dst_device,
            dst_array: p.dst_array,
            reserved1: std::ptr::null_mut(),
            dst_pitch: p.dst_pitch,
            dst_height: p.height,
            width_in_bytes: p.width_in_bytes,
            height: p.height,
            depth: 1,
        })
    }
}
