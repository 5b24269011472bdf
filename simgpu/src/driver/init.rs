//! Initialisation, versions, entry-point lookup (`cuGetProcAddress`), error strings, logs.

use std::ffi::{c_char, c_void};

use super::{cstr, out, R};
use crate::driver;
use crate::table::export_ptr;
use crate::types::*;
use shim_headers::{resolve, LookupError, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM};

const CU_GET_PROC_ADDRESS_SUCCESS: i32 = 0;

/// Safety: `sym` is NULL or a NUL-terminated string; `pfn` and `status` are NULL or writable
/// (cuGetProcAddress's arguments).
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
    // SAFETY: `pfn` is not NULL (checked) and writable, `sym` NULL or NUL-terminated (this fn's
    // contract).
    let name = unsafe {
        *pfn = std::ptr::null_mut();
        cstr(sym)?
    };
    let per_thread = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0;
    let r = resolve(name, version.max(0) as u32, per_thread)
        .map_err(|e| e as i32)
        .and_then(|e| export_ptr(e.export).ok_or(LookupError::NotFound as i32));
    match r {
        Ok(p) => {
            // SAFETY: `pfn` is writable (checked above); `status` only when not NULL (contract).
            unsafe {
                *pfn = p;
                if !status.is_null() {
                    *status = CU_GET_PROC_ADDRESS_SUCCESS;
                }
            }
            Ok(())
        }
        Err(st) => {
            if !status.is_null() {
                // SAFETY: not NULL, so writable (this fn's contract).
                unsafe { *status = st };
            }
            if !name.is_empty() {
                crate::debug!("cuGetProcAddress({name}, {version}, {flags}): not found");
            }
            Err(CUDA_ERROR_NOT_FOUND)
        }
    }
}

/// `cuGetProcAddress_v2`: hot (hundreds of calls per process) and must not log per call.
///
/// # Safety
///
/// `sym` is NULL or a NUL-terminated string; `pfn` and `status` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    sym: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
    status: *mut i32,
) -> CUresult {
    // SAFETY: the same contract as this function's.
    match unsafe { get_proc_address(sym, pfn, version, flags, status) } {
        Ok(()) => CUDA_SUCCESS,
        Err(e) => e,
    }
}

/// # Safety
///
/// As for [`cuGetProcAddress_v2`] (there is no `status`).
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    sym: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
) -> CUresult {
    // SAFETY: the same contract; a NULL `status` is allowed.
    unsafe { cuGetProcAddress_v2(sym, pfn, version, flags, std::ptr::null_mut()) }
}

/// Same as `cuGetProcAddress_v2`: the per-thread variant has no stream argument to change.
///
/// # Safety
///
/// As for [`cuGetProcAddress_v2`].
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2_ptsz(
    sym: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
    status: *mut i32,
) -> CUresult {
    // SAFETY: the same contract as this function's.
    unsafe { cuGetProcAddress_v2(sym, pfn, version, flags, status) }
}

/// # Safety
///
/// `v` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(v: *mut i32) -> CUresult {
    if v.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // Before cuInit the configuration may not be loaded yet: read it (errors surface at cuInit).
    let version = match crate::sim::get() {
        Some(s) => s.cfg.driver_version,
        None => crate::config::SimConfig::from_env()
            .map(|c| c.driver_version)
            .unwrap_or(13050),
    };
    // SAFETY: not NULL (checked), so writable (this fn's contract).
    unsafe { *v = version };
    CUDA_SUCCESS
}

driver! {
    fn cuInit(flags: u32) {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let edges = crate::sim::Edges {
            forked: super::memory::managed::forget_all,
            exit: super::stats::write_stats_file,
        };
        match crate::sim::init(&edges) {
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
        301 => ("CUDA_ERROR_FILE_NOT_FOUND\0", "file not found\0"),
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
