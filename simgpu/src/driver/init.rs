//! Initialisation, versions, entry-point lookup (`cuGetProcAddress`), error strings, logs.

use std::collections::HashMap;
use std::ffi::{c_char, c_void};
use std::sync::OnceLock;

use super::{cstr, out, R};
use crate::table::{export_ptr, PROC_TABLE};
use crate::types::*;
use crate::{driver, ProcEntry};

const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 2;
const CU_GET_PROC_ADDRESS_SUCCESS: i32 = 0;
const CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: i32 = 1;
const CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: i32 = 2;

/// The ABI entry for (name, requested version, per-thread flag): the highest ABI version not newer
/// than the request; the per-thread twin when asked for and one exists.
/// `Err(status)` is CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND or _VERSION_NOT_SUFFICIENT.
pub fn resolve(name: &str, version: u32, per_thread: bool) -> Result<&'static ProcEntry, i32> {
    static BY_NAME: OnceLock<HashMap<&'static str, Vec<&'static ProcEntry>>> = OnceLock::new();
    let map = BY_NAME.get_or_init(|| {
        let mut m: HashMap<&str, Vec<&ProcEntry>> = HashMap::new();
        for e in PROC_TABLE {
            m.entry(e.name).or_default().push(e);
        }
        m
    });
    let entries = map.get(name).ok_or(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND)?;
    let best = |pt: bool| {
        entries
            .iter()
            .filter(|e| e.per_thread == pt && e.version <= version)
            .max_by_key(|e| e.version)
            .copied()
    };
    let plain = best(false);
    let pick = if per_thread {
        match (best(true), plain) {
            // The twin must be at least as new as the plain entry it replaces.
            (Some(t), Some(p)) if t.version >= p.version => Some(t),
            (Some(t), None) => Some(t),
            _ => plain,
        }
    } else {
        plain
    };
    pick.ok_or(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT)
}

unsafe fn get_proc_address(
    sym: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
    status: *mut i32,
) -> R {
    if pfn.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    *pfn = std::ptr::null_mut();
    let name = cstr(sym)?;
    let per_thread = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0;
    let r = resolve(name, version.max(0) as u32, per_thread)
        .and_then(|e| export_ptr(e.export).ok_or(1));
    match r {
        Ok(p) => {
            *pfn = p;
            if !status.is_null() {
                *status = CU_GET_PROC_ADDRESS_SUCCESS;
            }
            Ok(())
        }
        Err(st) => {
            if !status.is_null() {
                *status = st;
            }
            if !name.is_empty() {
                crate::debug!("cuGetProcAddress({name}, {version}, {flags}): not found");
            }
            Err(CUDA_ERROR_NOT_FOUND)
        }
    }
}

/// `cuGetProcAddress_v2`: hot (hundreds of calls per process) and must not log per call.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    sym: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
    status: *mut i32,
) -> CUresult {
    match get_proc_address(sym, pfn, version, flags, status) {
        Ok(()) => CUDA_SUCCESS,
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    sym: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
) -> CUresult {
    cuGetProcAddress_v2(sym, pfn, version, flags, std::ptr::null_mut())
}

/// Same as `cuGetProcAddress_v2`: the per-thread variant has no stream argument to change.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2_ptsz(
    sym: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
    status: *mut i32,
) -> CUresult {
    cuGetProcAddress_v2(sym, pfn, version, flags, status)
}

#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(v: *mut i32) -> CUresult {
    if v.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // Before cuInit the configuration may not be loaded yet: read it (errors surface at cuInit).
    *v = match crate::sim::get() {
        Some(s) => s.cfg.driver_version,
        None => crate::config::SimConfig::from_env()
            .map(|c| c.driver_version)
            .unwrap_or(13050),
    };
    CUDA_SUCCESS
}

driver! {
    fn cuInit(flags: u32) {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        match crate::sim::init() {
            CUDA_SUCCESS => Ok(()),
            e => Err(e),
        }
    }

    fn cuModuleGetLoadingMode(mode: *mut u32) {
        // CU_MODULE_EAGER_LOADING = 1, CU_MODULE_LAZY_LOADING = 2 (the default since CUDA 12.2).
        let eager = std::env::var("CUDA_MODULE_LOADING").is_ok_and(|v| v.eq_ignore_ascii_case("EAGER"));
        out(mode, if eager { 1 } else { 2 })
    }

    fn cuGetErrorString(error: CUresult, s: *mut *const c_char) {
        let (_, text) = error_strings(error).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        out(s, text.as_ptr() as *const c_char)
    }

    fn cuGetErrorName(error: CUresult, s: *mut *const c_char) {
        let (name, _) = error_strings(error).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        out(s, name.as_ptr() as *const c_char)
    }

    fn cuLogsRegisterCallback(_cb: *mut c_void, _user: *mut c_void, handle: *mut *mut c_void) {
        if !handle.is_null() {
            *handle = std::ptr::dangling_mut::<c_void>();
        }
        Ok(())
    }

    fn cuLogsUnregisterCallback(_handle: *mut c_void) {
        Ok(())
    }

    fn cuLogsCurrent(iterator: *mut u32, _flags: u32) {
        out(iterator, 0)
    }

    fn cuProfilerInitialize(_config: *const c_char, _out: *const c_char, _mode: u32) {
        Ok(())
    }

    fn cuProfilerStart() {
        Ok(())
    }

    fn cuProfilerStop() {
        Ok(())
    }
}

/// (name, description), NUL-terminated, for the results simgpu can return.
fn error_strings(e: CUresult) -> Option<(&'static str, &'static str)> {
    Some(match e {
        0 => ("CUDA_SUCCESS\0", "no error\0"),
        1 => ("CUDA_ERROR_INVALID_VALUE\0", "invalid argument\0"),
        2 => ("CUDA_ERROR_OUT_OF_MEMORY\0", "out of memory\0"),
        3 => ("CUDA_ERROR_NOT_INITIALIZED\0", "initialization error\0"),
        4 => ("CUDA_ERROR_DEINITIALIZED\0", "driver shutting down\0"),
        100 => (
            "CUDA_ERROR_NO_DEVICE\0",
            "no CUDA-capable device is detected\0",
        ),
        101 => ("CUDA_ERROR_INVALID_DEVICE\0", "invalid device ordinal\0"),
        200 => (
            "CUDA_ERROR_INVALID_IMAGE\0",
            "device kernel image is invalid\0",
        ),
        201 => ("CUDA_ERROR_INVALID_CONTEXT\0", "invalid device context\0"),
        211 => ("CUDA_ERROR_NOT_MAPPED\0", "resource not mapped\0"),
        400 => ("CUDA_ERROR_INVALID_HANDLE\0", "invalid resource handle\0"),
        500 => ("CUDA_ERROR_NOT_FOUND\0", "named symbol not found\0"),
        600 => ("CUDA_ERROR_NOT_READY\0", "device not ready\0"),
        700 => (
            "CUDA_ERROR_ILLEGAL_ADDRESS\0",
            "an illegal memory access was encountered\0",
        ),
        701 => (
            "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES\0",
            "too many resources requested for launch\0",
        ),
        704 => (
            "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED\0",
            "peer access is already enabled\0",
        ),
        708 => (
            "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE\0",
            "primary context active\0",
        ),
        709 => (
            "CUDA_ERROR_CONTEXT_IS_DESTROYED\0",
            "context is destroyed\0",
        ),
        719 => ("CUDA_ERROR_LAUNCH_FAILED\0", "unspecified launch failure\0"),
        801 => ("CUDA_ERROR_NOT_SUPPORTED\0", "operation not supported\0"),
        900 => (
            "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED\0",
            "operation not permitted when stream is capturing\0",
        ),
        999 => ("CUDA_ERROR_UNKNOWN\0", "unknown error\0"),
        214 => (
            "CUDA_ERROR_ECC_UNCORRECTABLE\0",
            "uncorrectable ECC error encountered\0",
        ),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::resolve;

    #[test]
    fn version_aware_resolution() {
        let e = |n, v, p| resolve(n, v, p).map(|e| e.export);
        assert_eq!(e("cuMemAlloc", 3020, false), Ok("cuMemAlloc_v2"));
        assert_eq!(e("cuMemAlloc", 2000, false), Ok("cuMemAlloc"));
        assert_eq!(e("cuCtxCreate", 3020, false), Ok("cuCtxCreate_v2"));
        assert_eq!(e("cuCtxCreate", 11040, false), Ok("cuCtxCreate_v3"));
        assert_eq!(e("cuCtxCreate", 12050, false), Ok("cuCtxCreate_v4"));
        assert_eq!(e("cuCtxCreate", 12000, false), Ok("cuCtxCreate_v3"));
        assert_eq!(
            e("cuStreamGetCaptureInfo", 10010, false),
            Ok("cuStreamGetCaptureInfo")
        );
        assert_eq!(
            e("cuStreamGetCaptureInfo", 11030, false),
            Ok("cuStreamGetCaptureInfo_v2")
        );
        assert_eq!(
            e("cuStreamGetCaptureInfo", 12030, false),
            Ok("cuStreamGetCaptureInfo_v3")
        );
        assert_eq!(
            e("cuStreamGetCaptureInfo", 12030, true),
            Ok("cuStreamGetCaptureInfo_v3_ptsz")
        );
        assert_eq!(e("cuCtxGetDevice", 13000, false), Ok("cuCtxGetDevice_v2"));
        assert_eq!(e("cuCtxGetDevice", 12090, false), Ok("cuCtxGetDevice"));
        assert_eq!(e("cuMemcpyHtoD", 7000, true), Ok("cuMemcpyHtoD_v2_ptds"));
        assert_eq!(e("cuMemcpyHtoD", 3020, true), Ok("cuMemcpyHtoD_v2"));
        assert_eq!(e("cuLaunchKernel", 12000, true), Ok("cuLaunchKernel_ptsz"));
        assert_eq!(e("cuInit", 12000, true), Ok("cuInit"));
        assert_eq!(resolve("cuNoSuchThing", 12000, false).err(), Some(1));
        assert_eq!(resolve("cuMemAllocAsync", 11000, false).err(), Some(2));
        assert_eq!(resolve("", 0, false).err(), Some(1));
    }
}
