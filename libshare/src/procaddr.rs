//! `cuGetProcAddress` / `_v2`: how every CUDA ≥ 11.3 runtime (and so PyTorch) gets its driver
//! entry points. The real driver answers; when its answer is a function the shim hooks — decided
//! by the same version-aware rule the driver uses, from the declaration list — the hook is returned
//! instead. A request for `cuGetProcAddress` itself gets the shim's wrapper.

use std::ffi::c_void;

use crate::boundary::{rc, CStrArg, Out, R};
use crate::types::*;
use shim_headers::{resolve, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, DECLARED_UP_TO};

/// Replaces the driver's answer in `pfn` with the hook for (symbol, version, flags), if the shim
/// hooks that ABI entry. `same_abi(entry_version)` says whether the driver answers the request
/// with the same function as it does at `entry_version`; it is asked only for requests newer than
/// the declaration list, where a newer driver may have added an ABI version the list does not
/// know (that function is then passed through unhooked, never replaced by a hook with another
/// prototype).
pub fn substitute(
    name: &str,
    pfn: &Out<*mut c_void>,
    version: i32,
    flags: u64,
    same_abi: impl FnOnce(u32) -> bool,
) {
    if pfn.get().is_none_or(|p| p.is_null()) {
        return;
    }
    let per_thread = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0;
    let version = version.max(0) as u32;
    if let Ok(entry) = resolve(name, version, per_thread) {
        if let Some(h) = crate::hooks::hook_ptr(entry.export) {
            if version <= DECLARED_UP_TO || same_abi(entry.version) {
                // `h` has the prototype of the driver's answer (same export, same ABI version).
                pfn.set(h);
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

/// `sym`, the caller's C string, is passed back to the driver, never kept.
pub fn get_proc_address(
    call: impl FnOnce() -> CUresult,
    sym: CStrArg,
    pfn: Out<*mut c_void>,
    version: i32,
    flags: u64,
) -> R {
    rc(call())?;
    let (Some(name), Some(answer)) = (sym.to_str(), pfn.get()) else {
        return Ok(());
    };
    substitute(name, &pfn, version, flags, |v| {
        let Some(real) = crate::driver::real().cuGetProcAddress else {
            return false;
        };
        let mut p = std::ptr::null_mut();
        // SAFETY: the driver's `cuGetProcAddress`, asked again for the caller's symbol (a C
        // string it accepted) at another version, into a live local.
        (unsafe { real(sym.as_ptr(), &mut p, v as i32, flags) }) == CUDA_SUCCESS && p == answer
    });
    Ok(())
}

pub fn get_proc_address_v2(
    call: impl FnOnce() -> CUresult,
    sym: CStrArg,
    pfn: Out<*mut c_void>,
    version: i32,
    flags: u64,
    _status: Out<i32>,
) -> R {
    rc(call())?;
    let (Some(name), Some(answer)) = (sym.to_str(), pfn.get()) else {
        return Ok(());
    };
    substitute(name, &pfn, version, flags, |v| {
        let Some(real) = crate::driver::real().cuGetProcAddress_v2 else {
            return false;
        };
        let (mut p, mut st) = (std::ptr::null_mut(), 0);
        // SAFETY: as in `get_proc_address`, with a live local status.
        (unsafe { real(sym.as_ptr(), &mut p, v as i32, flags, &mut st) }) == CUDA_SUCCESS
            && p == answer
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `substitute` leaves in `*pfn` for a request of `cuMemAlloc` at `version`.
    fn answer(version: i32, same_abi: bool) -> *mut c_void {
        let driver_answer = 0x1000 as *mut c_void;
        let mut pfn = driver_answer;
        let scope = crate::boundary::Scope;
        // SAFETY: a live local function-pointer slot, used within `scope`.
        let out = unsafe { crate::boundary::FromCuda::at_boundary(&raw mut pfn, &scope) };
        substitute("cuMemAlloc", &out, version, 0, |_| same_abi);
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
