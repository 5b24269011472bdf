//! Shareable file descriptors (`CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`): a VMM allocation's
//! memfd (`vmm.rs`) and a pool's descriptor (`pool.rs`) carry a 64-byte trailer past their bytes
//! saying what they are (kind, device, size, the VMM allocation's properties), so a descriptor
//! passed to another process (SCM_RIGHTS, fork) is all the importer needs. Mappings never reach
//! the trailer.

use std::ffi::c_void;

use crate::driver::R;
use crate::types::*;

/// CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
pub const HANDLE_TYPE_POSIX_FD: u32 = 1;

/// What a shareable descriptor names (its trailer's kind).
pub const SHARED_VMM: u32 = 1;
pub const SHARED_POOL: u32 = 2;
const TRAILER_MAGIC: u32 = 0x4853_4753; // "SGSH"
const TRAILER: usize = 64;

/// The trailer of a shareable descriptor: kind, device, size and (VMM) the allocation's
/// properties, written past the `size` bytes of the file (mappings never reach it).
#[derive(Clone, Copy)]
pub struct Trailer {
    pub kind: u32,
    pub dev: u32,
    pub size: u64,
    pub prop: [u8; 32],
}

/// Writes `t` at offset `t.size` of `fd` (growing the file by the trailer).
pub fn write_trailer(fd: i32, t: &Trailer) -> R {
    let mut b = [0u8; TRAILER];
    b[0..4].copy_from_slice(&TRAILER_MAGIC.to_le_bytes());
    b[4..8].copy_from_slice(&t.kind.to_le_bytes());
    b[8..12].copy_from_slice(&t.dev.to_le_bytes());
    b[16..24].copy_from_slice(&t.size.to_le_bytes());
    b[24..56].copy_from_slice(&t.prop);
    // SAFETY: `b` is a local buffer of TRAILER bytes; `fd` is the caller's open descriptor.
    let n = unsafe { libc::pwrite(fd, b.as_ptr() as *const c_void, TRAILER, t.size as i64) };
    if n != TRAILER as isize {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    Ok(())
}

/// Reads the trailer of a descriptor an application passes in: CUDA_ERROR_INVALID_VALUE if it
/// is not a shareable handle of this simulated machine.
pub fn read_trailer(fd: i32) -> Result<Trailer, CUresult> {
    // SAFETY: `stat` is plain data, valid all-zero.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes into the local struct; an invalid `fd` fails.
    if fd < 0 || unsafe { libc::fstat(fd, &mut st) } != 0 || (st.st_size as usize) < TRAILER {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut b = [0u8; TRAILER];
    let at = st.st_size as i64 - TRAILER as i64;
    // SAFETY: reads at most TRAILER bytes into the local buffer.
    let n = unsafe { libc::pread(fd, b.as_mut_ptr() as *mut c_void, TRAILER, at) };
    let word = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
    if n != TRAILER as isize || word(0) != TRAILER_MAGIC {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let t = Trailer {
        kind: word(4),
        dev: word(8),
        size: u64::from_le_bytes(b[16..24].try_into().unwrap()),
        prop: b[24..56].try_into().unwrap(),
    };
    if t.size != at as u64 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(t)
}

/// A new descriptor (close-on-exec) for the same file as `fd`, or CUDA_ERROR_INVALID_VALUE.
pub fn dup_fd(fd: i32) -> Result<i32, CUresult> {
    // SAFETY: F_DUPFD_CLOEXEC on the caller's descriptor; fails (-1) if it is not open.
    let d = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if d < 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(d)
}
