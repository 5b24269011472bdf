//! `cuGetProcAddress` / `_v2`: how every CUDA ≥ 11.3 runtime (and so PyTorch) gets its driver
//! entry points. The real driver answers; when its answer is a function the shim hooks — decided
//! by the same version-aware rule the driver uses, from the declaration list — the hook is returned
//! instead. A request for `cuGetProcAddress` itself gets the shim's wrapper.

use std::ffi::{c_char, c_void, CStr};

use crate::types::*;
use shim_headers::{resolve, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM};

type GetProcV1 = unsafe extern "C" fn(*const c_char, *mut *mut c_void, i32, u64) -> CUresult;
type GetProcV2 =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, i32, u64, *mut i32) -> CUresult;

/// Replaces `*pfn` with the hook for (symbol, version, flags), if the shim hooks that ABI entry.
///
/// # Safety
/// `sym` is a C string and `pfn` a valid pointer holding the driver's answer.
pub unsafe fn substitute(sym: *const c_char, pfn: *mut *mut c_void, version: i32, flags: u64) {
    if sym.is_null() || pfn.is_null() || (*pfn).is_null() {
        return;
    }
    let Ok(name) = CStr::from_ptr(sym).to_str() else {
        return;
    };
    let per_thread = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0;
    if let Ok(entry) = resolve(name, version.max(0) as u32, per_thread) {
        if let Some(h) = crate::hooks::hook_ptr(entry.export) {
            *pfn = h;
        }
    }
}

pub unsafe fn get_proc_address(
    real: GetProcV1,
    sym: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
) -> CUresult {
    let r = real(sym, pfn, version, flags);
    if r == CUDA_SUCCESS {
        substitute(sym, pfn, version, flags);
    }
    r
}

pub unsafe fn get_proc_address_v2(
    real: GetProcV2,
    sym: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
    status: *mut i32,
) -> CUresult {
    let r = real(sym, pfn, version, flags, status);
    if r == CUDA_SUCCESS {
        substitute(sym, pfn, version, flags);
    }
    r
}
