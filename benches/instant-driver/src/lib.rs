//! `libinstantcuda.so` (SONAME `libcuda.so.1`): a CUDA driver that answers instantly.
//!
//! The baseline of the shim-overhead benchmarks (`benches/benches/shim_overhead.rs`, design §7
//! M1/M2): each function does the least that keeps its caller going — no device, no logging, no
//! lock, no allocation — so that timing a call through `libshare.so` against a direct call
//! measures what the shim adds and nothing else. It exports exactly what the shim needs to
//! initialise (`cuInit`, device count and memory, current device and context) and what the benchmarks time
//! (`cuLaunchKernel`, `cuMemAlloc_v2`/`cuMemFree_v2`), plus `cuGetProcAddress`/`_v2` answering
//! from its own table, as the real driver does for CUDA ≥ 11.3 runtimes.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

type CUresult = u32;
type CUdevice = i32;
type CUdeviceptr = u64;

const CUDA_SUCCESS: CUresult = 0;
const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
const CUDA_ERROR_NOT_FOUND: CUresult = 500;

/// The one device's memory: 80 GiB, like an H100/A100-80GB.
pub const TOTAL_MEM: usize = 80 << 30;

/// The driver's version (CUDA 12.8).
pub const DRIVER_VERSION: c_int = 12080;

/// Next fake device address (a bump counter: every allocation gets a distinct, non-zero address).
static NEXT: AtomicU64 = AtomicU64::new(0);

#[no_mangle]
pub extern "C" fn cuInit(_flags: c_uint) -> CUresult {
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    if version.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *version = DRIVER_VERSION;
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    if count.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *count = 1;
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, _dev: CUdevice) -> CUresult {
    if bytes.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *bytes = TOTAL_MEM;
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(dev: *mut CUdevice) -> CUresult {
    if dev.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *dev = 0;
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(ctx: *mut *mut c_void) -> CUresult {
    if ctx.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *ctx = 0x1 as *mut c_void;
    CUDA_SUCCESS
}

#[no_mangle]
pub extern "C" fn cuCtxSetCurrent(_ctx: *mut c_void) -> CUresult {
    CUDA_SUCCESS
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cuLaunchKernel(
    _f: *mut c_void,
    _gx: c_uint,
    _gy: c_uint,
    _gz: c_uint,
    _bx: c_uint,
    _by: c_uint,
    _bz: c_uint,
    _smem: c_uint,
    _stream: *mut c_void,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> CUresult {
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, _size: usize) -> CUresult {
    if dptr.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // 4 KiB apart from 0x7f00_0000_0000 on: distinct, aligned, never 0.
    *dptr = 0x7f00_0000_0000 + (NEXT.fetch_add(1, Relaxed) << 12);
    CUDA_SUCCESS
}

#[no_mangle]
pub extern "C" fn cuMemFree_v2(_ptr: CUdeviceptr) -> CUresult {
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    if !free.is_null() {
        *free = TOTAL_MEM;
    }
    if !total.is_null() {
        *total = TOTAL_MEM;
    }
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CUresult {
    cuGetProcAddress_v2(symbol, pfn, version, flags, std::ptr::null_mut())
}

/// Answers from [`exports`] by API name (`cuMemAlloc` → `cuMemAlloc_v2`, as the real driver
/// does); `cuGetProcAddress` itself is `_v2` from CUDA 12.0 on. The per-thread flag is ignored.
/// `status` (`CUdriverProcAddressQueryResult`): 0 found, 1 symbol not found.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    _flags: u64,
    status: *mut c_int,
) -> CUresult {
    if symbol.is_null() || pfn.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let name = CStr::from_ptr(symbol).to_bytes();
    let found = if name == b"cuGetProcAddress" && version >= 12000 {
        Some(cuGetProcAddress_v2 as *mut c_void)
    } else {
        exports().iter().find(|(n, _)| *n == name).map(|(_, p)| *p)
    };
    let (p, r, s) = match found {
        Some(p) => (p, CUDA_SUCCESS, 0),
        None => (std::ptr::null_mut(), CUDA_ERROR_NOT_FOUND, 1),
    };
    *pfn = p;
    if !status.is_null() {
        *status = s;
    }
    r
}

/// Every function this driver exports: (API name, ABI entry).
fn exports() -> [(&'static [u8], *mut c_void); 12] {
    [
        (b"cuInit", cuInit as *mut c_void),
        (b"cuDriverGetVersion", cuDriverGetVersion as *mut c_void),
        (b"cuDeviceGetCount", cuDeviceGetCount as *mut c_void),
        (b"cuDeviceTotalMem", cuDeviceTotalMem_v2 as *mut c_void),
        (b"cuCtxGetDevice", cuCtxGetDevice as *mut c_void),
        (b"cuCtxGetCurrent", cuCtxGetCurrent as *mut c_void),
        (b"cuCtxSetCurrent", cuCtxSetCurrent as *mut c_void),
        (b"cuLaunchKernel", cuLaunchKernel as *mut c_void),
        (b"cuMemAlloc", cuMemAlloc_v2 as *mut c_void),
        (b"cuMemFree", cuMemFree_v2 as *mut c_void),
        (b"cuMemGetInfo", cuMemGetInfo_v2 as *mut c_void),
        (b"cuGetProcAddress", cuGetProcAddress as *mut c_void),
    ]
}
