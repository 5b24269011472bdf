//! The few NVML calls the daemon makes (NVIDIA's documented C API, `libnvidia-ml.so.1` loaded at
//! run time so the daemon starts on a node without a driver): each device's total memory, to
//! refuse a quota above it, and what the DRA plugin publishes of each GPU (UUID, product name,
//! the driver's version).

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

/// One GPU as NVML reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    /// NVML's index (the node's GPU number, as `nvidia-smi` shows it).
    pub index: u32,
    /// `GPU-xxxxxxxx-…`.
    pub uuid: String,
    /// The product name (`NVIDIA H100 80GB HBM3`).
    pub name: String,
    /// Total memory, bytes.
    pub memory: u64,
}

/// The node's GPUs as NVML reports them, and the driver's version (`580.65.06`); `Err` says why
/// there are none.
pub fn gpus() -> Result<(Vec<Gpu>, String), String> {
    type Text = unsafe extern "C" fn(*mut c_void, *mut c_char, c_uint) -> c_int;
    type Version = unsafe extern "C" fn(*mut c_char, c_uint) -> c_int;
    // SAFETY: dlopen with a constant NUL-terminated name; the library stays loaded (no dlclose:
    // NVML keeps threads and state).
    let lib = unsafe { libc::dlopen(c"libnvidia-ml.so.1".as_ptr(), libc::RTLD_NOW) };
    if lib.is_null() {
        return Err("libnvidia-ml.so.1 not found (no NVIDIA driver on this node?)".into());
    }
    // A NUL-terminated string NVML wrote into `buf` (empty when it failed).
    fn text(buf: &[c_char], rc: c_int) -> String {
        if rc != 0 {
            return String::new();
        }
        // SAFETY: NVML wrote a NUL-terminated string into `buf` (its last byte stays 0).
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    }
    // SAFETY: the types are NVML's documented prototypes (nvml.h): nvmlInit_v2(void),
    // nvmlDeviceGetCount_v2(unsigned*), nvmlDeviceGetHandleByIndex_v2(unsigned, nvmlDevice_t*),
    // nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvmlMemory_t*), nvmlDeviceGetUUID and
    // nvmlDeviceGetName(nvmlDevice_t, char*, unsigned), nvmlSystemGetDriverVersion(char*,
    // unsigned); out-pointers are live locals, buffers are passed with one byte less than their
    // length so the last stays NUL.
    unsafe {
        let (Some(init), Some(count), Some(handle), Some(memory)) = (
            sym::<Init>(lib, c"nvmlInit_v2"),
            sym::<Count>(lib, c"nvmlDeviceGetCount_v2"),
            sym::<Handle>(lib, c"nvmlDeviceGetHandleByIndex_v2"),
            sym::<Memory>(lib, c"nvmlDeviceGetMemoryInfo"),
        ) else {
            return Err("libnvidia-ml.so.1 lacks the NVML calls the daemon needs".into());
        };
        let uuid = sym::<Text>(lib, c"nvmlDeviceGetUUID");
        let name = sym::<Text>(lib, c"nvmlDeviceGetName");
        let version = sym::<Version>(lib, c"nvmlSystemGetDriverVersion");
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
            let ask = |f: Option<Text>| {
                let mut buf = [0 as c_char; 96];
                f.map_or(String::new(), |f| {
                    let rc = f(h, buf.as_mut_ptr(), 95);
                    text(&buf, rc)
                })
            };
            let (u, p) = (ask(uuid), ask(name));
            out.push(Gpu {
                index: i,
                uuid: u,
                name: p,
                memory: m.total,
            });
        }
        let mut buf = [0 as c_char; 96];
        let v = version.map_or(String::new(), |f| {
            let rc = f(buf.as_mut_ptr(), 95);
            text(&buf, rc)
        });
        Ok((out, v))
    }
}

/// Total memory of every device NVML reports, in bytes; `Err` says why there is none.
pub fn device_totals() -> Result<Vec<u64>, String> {
    Ok(gpus()?.0.into_iter().map(|g| g.memory).collect())
}
