//! `cuGetProcAddress` / `_v2`: how every CUDA ≥ 11.3 runtime (and so PyTorch) gets its driver
//! entry points. The real driver answers; when its answer is a function the shim hooks — decided
//! by the same version-aware rule the driver uses, from the declaration list — the hook is returned
//! instead. A request for `cuGetProcAddress` itself gets the shim's wrapper.

use std::ffi::{c_char, c_void, CStr};

use crate::types::*;
use shim_headers::{resolve, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, DECLARED_UP_TO};

type GetProcV1 = unsafe extern "C" fn(*const c_char, *mut *mut c_void, i32, u64) -> CUresult;
type GetProcV2 =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, i32, u64, *mut i32) -> CUresult;

/// Replaces `*pfn` with the hook for (symbol, version, flags), if the shim hooks that ABI entry.
/// `same_abi(entry_version)` says whether the driver answers the request with the same function
/// as it does at `entry_version`; it is asked only for requests newer than the declaration list,
/// where a newer driver may have added an ABI version the list does not know (that function is
/// then passed through unhooked, never replaced by a hook with another prototype).
///
/// # Safety
/// `sym` is NULL or a NUL-terminated C string; `pfn` is NULL or valid for reading and writing a
/// function pointer (the driver's answer).
pub unsafe fn substitute(
    sym: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
    same_abi: impl FnOnce(u32) -> bool,
) {
    // SAFETY: `pfn` is read only if not NULL, when it is valid by this function's contract.
    if sym.is_null() || pfn.is_null() || unsafe { (*pfn).is_null() } {
        return;
    }
    // SAFETY: not NULL (checked), so a NUL-terminated C string by this function's contract.
    let Ok(name) = unsafe { CStr::from_ptr(sym) }.to_str() else {
        return;
    };
    let per_thread = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0;
    let version = version.max(0) as u32;
    if let Ok(entry) = resolve(name, version, per_thread) {
        if let Some(h) = crate::hooks::hook_ptr(entry.export) {
            if version <= DECLARED_UP_TO || same_abi(entry.version) {
                // SAFETY: not NULL (checked above), writable by this function's contract; `h`
                // has the prototype of the driver's answer (same export, same ABI version).
                unsafe { *pfn = h };
            } else {
                tracing::warn!(
                    name,
                    version,
                    "driver function newer than libshare's declaration list: passed through unhooked"
                );
            }
        }
    }
}

/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuGetProcAddress`.
pub unsafe fn get_proc_address(
    real: GetProcV1,
    sym: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
) -> CUresult {
    // SAFETY: the hook contract: the driver's function with the caller's arguments.
    let r = unsafe { real(sym, pfn, version, flags) };
    if r == CUDA_SUCCESS && !pfn.is_null() {
        // SAFETY: `pfn` is not NULL (checked), so the caller's valid out-pointer (hook
        // contract), holding the driver's answer; `sym` is the caller's C string, which the
        // driver accepted. The closure asks the driver again with the same `sym` and a live
        // local out-pointer.
        unsafe {
            let answer = *pfn;
            substitute(sym, pfn, version, flags, |v| {
                let mut p = std::ptr::null_mut();
                real(sym, &mut p, v as i32, flags) == CUDA_SUCCESS && p == answer
            });
        }
    }
    r
}

/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuGetProcAddress_v2`.
pub unsafe fn get_proc_address_v2(
    real: GetProcV2,
    sym: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
    status: *mut i32,
) -> CUresult {
    // SAFETY: the hook contract: the driver's function with the caller's arguments.
    let r = unsafe { real(sym, pfn, version, flags, status) };
    if r == CUDA_SUCCESS && !pfn.is_null() {
        // SAFETY: as in `get_proc_address`; the closure's status out-pointer is a live local.
        unsafe {
            let answer = *pfn;
            substitute(sym, pfn, version, flags, |v| {
                let mut p = std::ptr::null_mut();
                let mut st = 0;
                real(sym, &mut p, v as i32, flags, &mut st) == CUDA_SUCCESS && p == answer
            });
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `substitute` leaves in `*pfn` for a request of `cuMemAlloc` at `version`.
    fn answer(version: i32, same_abi: bool) -> *mut c_void {
        let driver_answer = 0x1000 as *mut c_void;
        let mut pfn = driver_answer;
        // SAFETY: a C string literal and a live local function-pointer slot.
        unsafe { substitute(c"cuMemAlloc".as_ptr(), &mut pfn, version, 0, |_| same_abi) };
        pfn
    }

    #[test]
    fn requests_newer_than_the_declaration_list_are_hooked_only_with_the_same_abi() {
        let hook = crate::hooks::hook_ptr("cuMemAlloc_v2").unwrap();
        assert_eq!(
            answer(12000, false),
            hook,
            "known version: the table decides"
        );
        assert_eq!(answer(DECLARED_UP_TO as i32 + 1000, true), hook);
        assert_eq!(
            answer(DECLARED_UP_TO as i32 + 1000, false),
            0x1000 as *mut c_void,
            "an ABI the list does not know passes through"
        );
    }
}
