//! The real NVML, opened by name (`LIBSHARE_REAL_LIBNVML`, else `libnvidia-ml.so.1`) on first
//! use: the functions the shim's NVML hooks pass on to, and the node's GPUs by UUID (NVML's
//! order is the node's GPU numbering, `devmap.rs`).

use std::ffi::c_void;
use std::sync::OnceLock;

use crate::boundary::Pod;
use crate::types::{NvmlReturn, NVML_SUCCESS};

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Memory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemoryV2 {
    pub version: u32,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

// SAFETY: `#[repr(C)]` structs of integers: every bit pattern is a valid value.
unsafe impl Pod for Memory {}
// SAFETY: as for `Memory`.
unsafe impl Pod for MemoryV2 {}

/// `nvmlDeviceGetMemoryInfo`.
type MemoryInfo = unsafe extern "C" fn(*mut c_void, *mut Memory) -> NvmlReturn;

/// The real NVML's functions the shim calls (None: not exported, or no NVML).
pub struct Nvml {
    base: usize,
    pub get_info: Option<MemoryInfo>,
    pub get_info_v2: Option<unsafe extern "C" fn(*mut c_void, *mut MemoryV2) -> NvmlReturn>,
    pub get_index: Option<unsafe extern "C" fn(*mut c_void, *mut u32) -> NvmlReturn>,
    get_uuid: Option<unsafe extern "C" fn(*mut c_void, *mut std::ffi::c_char, u32) -> NvmlReturn>,
    init: Option<unsafe extern "C" fn() -> NvmlReturn>,
    shutdown: Option<unsafe extern "C" fn() -> NvmlReturn>,
    count: Option<unsafe extern "C" fn(*mut u32) -> NvmlReturn>,
    by_index: Option<unsafe extern "C" fn(u32, *mut *mut c_void) -> NvmlReturn>,
}

/// The real NVML, opened on first use.
pub fn nvml() -> &'static Nvml {
    static N: OnceLock<Nvml> = OnceLock::new();
    N.get_or_init(|| {
        let path =
            std::env::var("LIBSHARE_REAL_LIBNVML").unwrap_or_else(|_| "libnvidia-ml.so.1".into());
        let h = crate::loader::dlopen_local(&path);
        // SAFETY: each name's prototype in nvml.h is the type of the field it fills.
        unsafe {
            let get_info = export(h, c"nvmlDeviceGetMemoryInfo");
            Nvml {
                base: crate::loader::object_base(
                    get_info.map_or(std::ptr::null(), |f: MemoryInfo| f as *const c_void),
                ),
                get_info,
                get_info_v2: export(h, c"nvmlDeviceGetMemoryInfo_v2"),
                get_index: export(h, c"nvmlDeviceGetIndex"),
                get_uuid: export(h, c"nvmlDeviceGetUUID"),
                init: export(h, c"nvmlInit_v2"),
                shutdown: export(h, c"nvmlShutdown"),
                count: export(h, c"nvmlDeviceGetCount_v2"),
                by_index: export(h, c"nvmlDeviceGetHandleByIndex_v2"),
            }
        }
    })
}

/// The real NVML's export `name` from `dlopen` handle `h` (NULL: none), as the function
/// pointer type `F`; None if it lacks it.
///
/// # Safety
///
/// `F` is an `unsafe extern "C" fn` with `name`'s prototype in nvml.h.
unsafe fn export<F: Copy>(h: *mut c_void, name: &std::ffi::CStr) -> Option<F> {
    const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<*mut c_void>()) };
    if h.is_null() {
        return None;
    }
    // SAFETY: `h` is a non-NULL handle from `dlopen`; `name` is NUL-terminated.
    let p = unsafe { crate::loader::real_dlsym(h, name.as_ptr()) };
    // SAFETY: `p` is the non-NULL address of that export, and `F` a function pointer of its
    // prototype (the caller's contract) and of a pointer's size (checked above).
    (!p.is_null()).then(|| unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

pub fn library_base() -> usize {
    nvml().base
}

/// The UUID (`GPU-…`) of an NVML device handle, or None if NVML cannot say.
fn uuid_of(dev: *mut c_void) -> Option<String> {
    let get_uuid = nvml().get_uuid?;
    let mut buf = [0 as std::ffi::c_char; 96];
    // SAFETY: NVML's `nvmlDeviceGetUUID` with the caller's handle and a local buffer of the
    // length passed.
    if unsafe { get_uuid(dev, buf.as_mut_ptr(), buf.len() as u32) } != NVML_SUCCESS {
        return None;
    }
    // SAFETY: on success NVML wrote a NUL-terminated string within the length passed, into
    // `buf`, which lives to the end of this function.
    let s = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    s.to_str().ok().map(str::to_owned)
}

/// The UUIDs of the node's GPUs in NVML's order (the node's GPU indices: what `nvidia-smi`
/// and the daemon number), or None without a usable NVML. NVML is initialised for the call and
/// shut down after (NVML counts its initialisations: an application's own stays).
pub fn node_uuids() -> Option<Vec<String>> {
    let n = nvml();
    let (init, shutdown, count, by_index) = (n.init?, n.shutdown?, n.count?, n.by_index?);
    // SAFETY: NVML's `nvmlInit_v2`, no arguments.
    if unsafe { init() } != NVML_SUCCESS {
        return None;
    }
    let mut c = 0u32;
    // SAFETY: NVML's `nvmlDeviceGetCount_v2` with a live local, NVML initialised above.
    let uuids = (unsafe { count(&mut c) } == NVML_SUCCESS).then(|| {
        (0..c.min(libshare_abi::MAX_DEVICES as u32))
            .map(|i| {
                let mut h = std::ptr::null_mut();
                // SAFETY: NVML's `nvmlDeviceGetHandleByIndex_v2` with an index below its
                // count and a live local.
                let ok = unsafe { by_index(i, &mut h) } == NVML_SUCCESS;
                ok.then(|| uuid_of(h)).flatten().unwrap_or_default()
            })
            .collect()
    });
    // SAFETY: NVML's `nvmlShutdown`, balancing the `nvmlInit_v2` above.
    unsafe { shutdown() };
    uuids
}
