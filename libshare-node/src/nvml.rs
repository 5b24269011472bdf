//! The few NVML calls the daemon makes (NVIDIA's documented C API, `libnvidia-ml.so.1` loaded at
//! run time so the daemon starts on a node without a driver): each device's total memory, to
//! refuse a quota above it.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr};

#[repr(C)]
#[derive(Default)]
struct NvmlMemory {
    total: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

type Init = unsafe extern "C" fn() -> c_int;
type Count = unsafe extern "C" fn(*mut c_uint) -> c_int;
type Handle = unsafe extern "C" fn(c_uint, *mut *mut c_void) -> c_int;
type Memory = unsafe extern "C" fn(*mut c_void, *mut NvmlMemory) -> c_int;

/// Looks up `name` in `lib`.
///
/// # Safety
/// `lib` is a live handle from `dlopen`; `T` is the symbol's C function type.
unsafe fn sym<T>(lib: *mut c_void, name: &CStr) -> Option<T> {
    // SAFETY: per the contract; dlsym returns NULL or the symbol's address.
    let p = unsafe { libc::dlsym(lib, name.as_ptr() as *const c_char) };
    // SAFETY: a non-NULL address of a function of type T (the contract), same size as a pointer.
    (!p.is_null()).then(|| unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
}

/// Total memory of every device NVML reports, in bytes; `Err` says why there is none.
pub fn device_totals() -> Result<Vec<u64>, String> {
    // SAFETY: dlopen with a constant NUL-terminated name; the library stays loaded (no dlclose:
    // NVML keeps threads and state).
    let lib = unsafe { libc::dlopen(c"libnvidia-ml.so.1".as_ptr(), libc::RTLD_NOW) };
    if lib.is_null() {
        return Err("libnvidia-ml.so.1 not found (no NVIDIA driver on this node?)".into());
    }
    // SAFETY: the types are NVML's documented prototypes (nvml.h): nvmlInit_v2(void),
    // nvmlDeviceGetCount_v2(unsigned*), nvmlDeviceGetHandleByIndex_v2(unsigned, nvmlDevice_t*),
    // nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvmlMemory_t*); out-pointers are live locals.
    unsafe {
        let (Some(init), Some(count), Some(handle), Some(memory)) = (
            sym::<Init>(lib, c"nvmlInit_v2"),
            sym::<Count>(lib, c"nvmlDeviceGetCount_v2"),
            sym::<Handle>(lib, c"nvmlDeviceGetHandleByIndex_v2"),
            sym::<Memory>(lib, c"nvmlDeviceGetMemoryInfo"),
        ) else {
            return Err("libnvidia-ml.so.1 lacks the NVML calls the daemon needs".into());
        };
        if init() != 0 {
            return Err("nvmlInit_v2 failed".into());
        }
        let mut n: c_uint = 0;
        if count(&mut n) != 0 {
            return Err("nvmlDeviceGetCount_v2 failed".into());
        }
        let mut out = Vec::with_capacity(n as usize);
        for i in 0..n {
            let mut h = std::ptr::null_mut();
            let mut m = NvmlMemory::default();
            if handle(i, &mut h) != 0 || memory(h, &mut m) != 0 {
                return Err(format!("NVML cannot read device {i}'s memory"));
            }
            out.push(m.total);
        }
        Ok(out)
    }
}
