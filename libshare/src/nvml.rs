//! NVML memory info reports the quota too (PyTorch and monitoring read it), consistent with
//! `cuMemGetInfo`. The real NVML is opened by name (`LIBSHARE_REAL_LIBNVML`, else
//! `libnvidia-ml.so.1`) on first use.

use std::ffi::c_void;
use std::sync::OnceLock;

type NvmlReturn = u32;
const NVML_SUCCESS: NvmlReturn = 0;
const NVML_ERROR_UNINITIALIZED: NvmlReturn = 1;

/// `nvmlMemory_t`.
#[repr(C)]
pub struct Memory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct MemoryV2 {
    pub version: u32,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

struct Nvml {
    base: usize,
    get_info: Option<unsafe extern "C" fn(*mut c_void, *mut Memory) -> NvmlReturn>,
    get_info_v2: Option<unsafe extern "C" fn(*mut c_void, *mut MemoryV2) -> NvmlReturn>,
    get_index: Option<unsafe extern "C" fn(*mut c_void, *mut u32) -> NvmlReturn>,
}

fn nvml() -> &'static Nvml {
    static N: OnceLock<Nvml> = OnceLock::new();
    N.get_or_init(|| {
        let path =
            std::env::var("LIBSHARE_REAL_LIBNVML").unwrap_or_else(|_| "libnvidia-ml.so.1".into());
        let h = crate::interpose::dlopen_local(&path);
        let sym = |n: &std::ffi::CStr| {
            if h.is_null() {
                std::ptr::null_mut()
            } else {
                unsafe { crate::interpose::real_dlsym(h, n.as_ptr()) }
            }
        };
        let (a, b, c) = (
            sym(c"nvmlDeviceGetMemoryInfo"),
            sym(c"nvmlDeviceGetMemoryInfo_v2"),
            sym(c"nvmlDeviceGetIndex"),
        );
        // SAFETY: NVML's exports with these prototypes (nvml.h), or NULL.
        unsafe {
            Nvml {
                base: crate::interpose::object_base(a),
                get_info: (!a.is_null()).then(|| std::mem::transmute::<*mut c_void, _>(a)),
                get_info_v2: (!b.is_null()).then(|| std::mem::transmute::<*mut c_void, _>(b)),
                get_index: (!c.is_null()).then(|| std::mem::transmute::<*mut c_void, _>(c)),
            }
        }
    })
}

pub fn library_base() -> usize {
    nvml().base
}

pub fn hook_ptr(name: &str) -> Option<*mut c_void> {
    match name {
        "nvmlDeviceGetMemoryInfo" => Some(nvmlDeviceGetMemoryInfo as *const () as *mut c_void),
        "nvmlDeviceGetMemoryInfo_v2" => {
            Some(nvmlDeviceGetMemoryInfo_v2 as *const () as *mut c_void)
        }
        _ => None,
    }
}

unsafe fn device_index(dev: *mut c_void) -> usize {
    let mut i = 0u32;
    match nvml().get_index {
        Some(f) if f(dev, &mut i) == NVML_SUCCESS => i as usize % libshare_abi::MAX_DEVICES,
        _ => 0,
    }
}

/// # Safety
/// NVML's contract: `device` is an NVML handle, `mem` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: *mut c_void,
    mem: *mut Memory,
) -> NvmlReturn {
    let Some(real) = nvml().get_info else {
        return NVML_ERROR_UNINITIALIZED;
    };
    let r = real(device, mem);
    if r == NVML_SUCCESS && !mem.is_null() {
        let m = &mut *mem;
        let (free, total) = crate::memory::visible(device_index(device), m.free, m.total);
        *m = Memory {
            total,
            free,
            used: total - free,
        };
    }
    r
}

/// # Safety
/// As for `nvmlDeviceGetMemoryInfo`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: *mut c_void,
    mem: *mut MemoryV2,
) -> NvmlReturn {
    let Some(real) = nvml().get_info_v2 else {
        return NVML_ERROR_UNINITIALIZED;
    };
    let r = real(device, mem);
    if r == NVML_SUCCESS && !mem.is_null() {
        let m = &mut *mem;
        let (free, total) = crate::memory::visible(device_index(device), m.free, m.total);
        m.total = total;
        m.free = free;
        m.used = total.saturating_sub(free).saturating_sub(m.reserved);
    }
    r
}
