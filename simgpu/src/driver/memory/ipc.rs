//! CUDA IPC memory and event handles (how `torch.multiprocessing` shares CUDA tensors).
//!
//! Device memory is a private anonymous mapping. Exporting an allocation re-backs it in place with
//! a memfd (its bytes are copied, its address does not change); the handle names the exporting
//! process and that file descriptor, and an importer maps `/proc/<pid>/fd/<fd>`, so both processes
//! see the same bytes. Imported memory is the exporter's: it is not charged again. IPC events open
//! as events with no pending work (simgpu's events cannot span processes).
//!
//! Shareable handles (POSIX file descriptors, `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`) use the
//! same files: a VMM allocation's memfd (`vmm.rs`) and a pool's descriptor (`pool.rs`) carry a
//! 64-byte trailer past their bytes saying what they are, so a descriptor passed to another
//! process (SCM_RIGHTS, fork) is all the importer needs; a pool allocation is exported with
//! `cuMemPoolExportPointer` exactly like an IPC handle, and its importer frees it with
//! `cuMemFree(Async)`.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::c_void;

use super::{Alloc, Kind};
use crate::driver;
use crate::driver::{out, R};
use crate::sim::sim;
use crate::types::*;

const MAGIC: u32 = 0x5049_4753; // "SGIP"

/// `CUipcMemHandle` / `CUipcEventHandle`: 64 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IpcHandle(pub [u8; 64]);

/// `CUmemPoolPtrExportData`'s magic: a pool allocation's export (same layout as an IPC handle).
pub const POOL_PTR_MAGIC: u32 = 0x5050_4753; // "SGPP"

/// Exported allocations (base → memfd) and imported mappings (address → (size, imported from a
/// pool: freed with cuMemFree(Async) rather than closed)).
static EXPORTED: Mutex<Option<HashMap<u64, i32>>> = Mutex::new(None);
static IMPORTED: Mutex<Option<HashMap<u64, (u64, bool)>>> = Mutex::new(None);

/// A pointer imported from another process's pool (`cuMemPoolImportPointer`)? Then
/// `cuMemFree` of it unmaps it here (the exporter's allocation and charge are its own).
pub fn free_pool_import(p: u64) -> Option<R> {
    if !IMPORTED
        .lock()
        .as_ref()
        .is_some_and(|m| m.get(&p).is_some_and(|e| e.1))
    {
        return None;
    }
    Some(sim().and_then(|s| close(s, p)))
}

/// Whether `p` was imported from another process's pool (its `cuMemFreeAsync` unmaps it when the
/// stream reaches the free).
pub fn is_pool_import(p: u64) -> bool {
    IMPORTED
        .lock()
        .as_ref()
        .is_some_and(|m| m.get(&p).is_some_and(|e| e.1))
}

/// Unmaps imported mapping `dptr` (after the work that may use it).
fn close(s: &crate::sim::Sim, dptr: u64) -> R {
    super::wait_for_users(s); // queued copies may still use the mapping
    let (size, _) = IMPORTED
        .lock()
        .as_mut()
        .and_then(|m| m.remove(&dptr))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    s.mem.lock().map.remove(&dptr);
    // SAFETY: (dptr, size) was removed from IMPORTED above, so it is a mapping `open` made
    // and it is unmapped once; the application promises not to use it after closing.
    unsafe { libc::munmap(dptr as *mut c_void, size as usize) };
    Ok(())
}

pub fn is_imported(p: u64) -> bool {
    IMPORTED.lock().as_ref().is_some_and(|m| m.contains_key(&p))
}

/// An exported allocation is being freed: close its file (importers keep their mapping).
pub fn forget_export(base: u64) {
    if let Some(fd) = EXPORTED.lock().as_mut().and_then(|m| m.remove(&base)) {
        // SAFETY: our own descriptor.
        unsafe { libc::close(fd) };
    }
}

/// Re-backs [base, base + size) with a memfd holding the same bytes; returns the descriptor.
///
/// Safety: [base, base + size) is a whole device allocation of this process, mapped by
/// `map_anon` (page-aligned, so MAP_FIXED replaces exactly its pages), and no other thread
/// accesses it meanwhile (writes between the copy and the remap would be lost).
unsafe fn share(base: u64, size: u64) -> Result<i32, CUresult> {
    // SAFETY: a static NUL-terminated name; ftruncate only runs on a descriptor we just created.
    let fd = unsafe { libc::memfd_create(c"simgpu-ipc".as_ptr(), 0) };
    // SAFETY: `fd` is ours (checked >= 0 first).
    if fd < 0 || unsafe { libc::ftruncate(fd, size as i64) } != 0 {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    // Copy the bytes through a temporary mapping of the file, then put the file in place.
    // SAFETY: a new mapping (null hint) of our own `size`-byte file; checked below.
    let tmp = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if tmp == libc::MAP_FAILED {
        // SAFETY: our own descriptor, closed once.
        unsafe { libc::close(fd) };
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    // SAFETY: `base` is readable for `size` bytes (this fn's contract) and `tmp` is a fresh
    // `size`-byte mapping, so they do not overlap; `tmp` is unmapped right after, unused.
    unsafe {
        std::ptr::copy_nonoverlapping(base as *const u8, tmp as *mut u8, size as usize);
        libc::munmap(tmp, size as usize);
    }
    // SAFETY: MAP_FIXED replaces the pages of the allocation [base, base + size) with the file
    // now holding the same bytes (this fn's contract: our own page-aligned anonymous mapping
    // that nobody touches meanwhile); no Rust reference points into it.
    let r = unsafe {
        libc::mmap(
            base as *mut c_void,
            size as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd,
            0,
        )
    };
    if r == libc::MAP_FAILED {
        // SAFETY: our own descriptor, closed once.
        unsafe { libc::close(fd) };
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    Ok(fd)
}

fn field(h: &IpcHandle, at: usize) -> u64 {
    u64::from_le_bytes(h.0[at..at + 8].try_into().unwrap())
}

driver! {
    fn cuIpcGetMemHandle(handle: *mut IpcHandle, dptr: CUdeviceptr) {
        if handle.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(handle, IpcHandle(export(dptr, MAGIC, |_| true)?))
    }

    fn cuIpcOpenMemHandle(dptr: *mut CUdeviceptr, handle: IpcHandle, _flags: u32) {
        open(dptr, handle, MAGIC)
    }

    fn cuIpcOpenMemHandle_v2(dptr: *mut CUdeviceptr, handle: IpcHandle, _flags: u32) {
        open(dptr, handle, MAGIC)
    }

    fn cuIpcCloseMemHandle(dptr: CUdeviceptr) {
        let s = sim()?;
        if IMPORTED.lock().as_ref().is_none_or(|m| m.get(&dptr).is_none_or(|e| e.1)) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        close(s, dptr)
    }

    fn cuIpcGetEventHandle(handle: *mut IpcHandle, event: CUevent) {
        sim()?.events.get(event as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let mut h = [0u8; 64];
        h[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        h[8..16].copy_from_slice(&(event as u64).to_le_bytes());
        out(handle, IpcHandle(h))
    }

    fn cuIpcOpenEventHandle(event: *mut CUevent, handle: IpcHandle) {
        if u32::from_le_bytes(handle.0[0..4].try_into().unwrap()) != MAGIC {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        crate::driver::cuEventCreate(event, CU_EVENT_DISABLE_TIMING);
        Ok(())
    }
}

/// The 64 bytes naming the device allocation holding `dptr` for another process (`magic`
/// first), whose pool `allowed` accepts (0 for cuMemAlloc memory); the allocation is re-backed
/// with a file the first time.
pub fn export(
    dptr: CUdeviceptr,
    magic: u32,
    allowed: impl Fn(usize) -> bool,
) -> Result<[u8; 64], CUresult> {
    let s = sim()?;
    let (base, size) = {
        let t = s.mem.lock();
        match t.find(dptr) {
            Some((b, a)) if a.kind == Kind::Device && !is_imported(b) && allowed(a.pool) => {
                (b, a.size)
            }
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
    };
    let mut exported = EXPORTED.lock();
    let map = exported.get_or_insert_with(HashMap::new);
    let fd = match map.get(&base) {
        Some(fd) => *fd,
        None => {
            // No queued work may write the allocation while its bytes move to the file.
            super::wait_for_users(s);
            // SAFETY: (base, size) is a device allocation found in `s.mem`, made by `map_anon`
            // and not imported (checked above), and no queued work uses it any more (waited for
            // above; new work from other threads is not excluded).
            let fd = unsafe { share(base, size)? };
            map.insert(base, fd);
            fd
        }
    };
    let mut h = [0u8; 64];
    h[0..4].copy_from_slice(&magic.to_le_bytes());
    h[4..8].copy_from_slice(&std::process::id().to_le_bytes());
    h[8..16].copy_from_slice(&(fd as u64).to_le_bytes());
    h[16..24].copy_from_slice(&size.to_le_bytes());
    h[24..32].copy_from_slice(&(dptr - base).to_le_bytes());
    Ok(h)
}

/// Maps the allocation `h` names (an IPC handle, or a pool pointer's export data: `magic`).
///
/// Safety: `dptr` is NULL or writable (cuIpcOpenMemHandle's out-argument).
pub(super) unsafe fn open(dptr: *mut CUdeviceptr, h: IpcHandle, magic: u32) -> R {
    let s = sim()?;
    if dptr.is_null() || u32::from_le_bytes(h.0[0..4].try_into().unwrap()) != magic {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let pid = u32::from_le_bytes(h.0[4..8].try_into().unwrap());
    let (fd, size, offset) = (field(&h, 8), field(&h, 16), field(&h, 24));
    if pid == std::process::id() {
        return Err(CUDA_ERROR_INVALID_CONTEXT); // as the driver: a process cannot open its own handle
    }
    let path = std::ffi::CString::new(format!("/proc/{pid}/fd/{fd}"))
        .map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    // SAFETY: `path` is a NUL-terminated CString alive across the call.
    let file = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if file < 0 {
        return Err(CUDA_ERROR_INVALID_VALUE); // the exporter is gone or freed the memory
    }
    // SAFETY: a new mapping (null hint) of the exporter's memfd, checked against MAP_FAILED; then
    // our own descriptor is closed once (the mapping keeps the file).
    let p = unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            size as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file,
            0,
        );
        libc::close(file);
        p
    };
    if p == libc::MAP_FAILED {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let base = p as u64;
    let dev = crate::driver::current_ctx_opt().map_or(0, |c| c.device);
    s.mem.lock().insert(
        base,
        Alloc {
            size,
            kind: Kind::Device,
            device: dev,
            charged: 0,
            ctx: 0,
            pool: 0,
            id: 0,
            host_flags: 0,
        },
    );
    IMPORTED
        .lock()
        .get_or_insert_with(HashMap::new)
        .insert(base, (size, magic == POOL_PTR_MAGIC));
    // SAFETY: `dptr` is not NULL (checked above) and writable (this fn's contract).
    unsafe { out(dptr, base + offset) }
}
