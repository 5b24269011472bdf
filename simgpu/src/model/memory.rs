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
