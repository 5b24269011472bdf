//! NVML memory info reports the quota too (PyTorch and monitoring read it), consistent with
//! `cuMemGetInfo`. The real NVML is opened by name (`LIBSHARE_REAL_LIBNVML`, else
//! `libnvidia-ml.so.1`) on first use.

use std::ffi::c_void;

use crate::boundary::{FromCuda, Out, Pod, Scope};
use crate::types::{
    CUuuid, NvmlReturn, CUDA_SUCCESS, NVML_ERROR_UNINITIALIZED, NVML_ERROR_UNKNOWN, NVML_SUCCESS,
};
use shim_headers::{format_uuid, guard};
use std::sync::OnceLock;

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

/// An NVML export through the shim's boundary, as `hook_fn!` makes the driver's: the real
/// NVML's function (`nvml().$real`; NVML_ERROR_UNINITIALIZED without it), the panic guard, and
/// each argument converted once ([`FromCuda`]: `*mut T` becomes an [`Out`]) for a safe handler
/// `$h(call, args…)` that returns NVML's code.
macro_rules! nvml_fn {
    ($name:ident ($($a:ident : $t:ty),*) via $real:ident => $h:path) => {
        /// The NVML function of this name, through the shim.
        ///
        /// # Safety
        ///
        /// NVML's documented contract for this function.
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name($($a: $t),*) -> NvmlReturn {
            guard(concat!("libshare ", stringify!($name)), NVML_ERROR_UNKNOWN, || {
                let Some(real) = nvml().$real else {
                    return NVML_ERROR_UNINITIALIZED;
                };
                let scope = Scope;
                // SAFETY: NVML's contract (above): the real NVML's `$name` with the caller's
                // arguments, unchanged.
                #[allow(clippy::macro_metavars_in_unsafe)]
                let call = move || unsafe { real($($a),*) };
                // SAFETY: NVML's contract: the caller's arguments, valid as NVML documents for
                // this call, wrapped for its duration (`scope`).
                #[allow(clippy::macro_metavars_in_unsafe)]
                let ($($a,)*) = unsafe { ($(FromCuda::at_boundary($a, &scope),)*) };
                $h(call, $($a),*)
            })
        }
    };
}

nvml_fn!(nvmlDeviceGetMemoryInfo(device: *mut c_void, mem: *mut Memory) via get_info => memory_info);
nvml_fn!(nvmlDeviceGetMemoryInfo_v2(device: *mut c_void, mem: *mut MemoryV2) via get_info_v2 => memory_info_v2);

struct Nvml {
    base: usize,
    get_info: Option<unsafe extern "C" fn(*mut c_void, *mut Memory) -> NvmlReturn>,
    get_info_v2: Option<unsafe extern "C" fn(*mut c_void, *mut MemoryV2) -> NvmlReturn>,
    get_index: Option<unsafe extern "C" fn(*mut c_void, *mut u32) -> NvmlReturn>,
    get_uuid: Option<unsafe extern "C" fn(*mut c_void, *mut std::ffi::c_char, u32) -> NvmlReturn>,
}

fn nvml() -> &'static Nvml {
    static N: OnceLock<Nvml> = OnceLock::new();
    N.get_or_init(|| {
        let path =
            std::env::var("LIBSHARE_REAL_LIBNVML").unwrap_or_else(|_| "libnvidia-ml.so.1".into());
        let h = crate::loader::dlopen_local(&path);
        let sym = |n: &std::ffi::CStr| {
            if h.is_null() {
                std::ptr::null_mut()
            } else {
                // SAFETY: `h` is a non-NULL handle from `dlopen`; `n` a NUL-terminated name.
                unsafe { crate::loader::real_dlsym(h, n.as_ptr()) }
            }
        };
        let (a, b, c) = (
            sym(c"nvmlDeviceGetMemoryInfo"),
            sym(c"nvmlDeviceGetMemoryInfo_v2"),
            sym(c"nvmlDeviceGetIndex"),
        );
        let u = sym(c"nvmlDeviceGetUUID");
        // SAFETY: each transmute is of a non-NULL address of the real NVML's export of that
        // name, whose prototype (nvml.h) is the field's type.
        unsafe {
            Nvml {
                base: crate::loader::object_base(a),
                get_info: (!a.is_null()).then(|| std::mem::transmute::<*mut c_void, _>(a)),
                get_info_v2: (!b.is_null()).then(|| std::mem::transmute::<*mut c_void, _>(b)),
                get_index: (!c.is_null()).then(|| std::mem::transmute::<*mut c_void, _>(c)),
                get_uuid: (!u.is_null()).then(|| std::mem::transmute::<*mut c_void, _>(u)),
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

/// The CUDA ordinal of an NVML device (quotas are per ordinal), or None if CUDA does not see it
/// (no quota applies then). NVML numbers physical devices; CUDA numbers the ones
/// CUDA_VISIBLE_DEVICES shows, so they are matched by UUID. Without a CUDA driver in this process
/// (an NVML-only tool), NVML's index is the best guess. `dev` is the caller's NVML handle, a value
/// only NVML dereferences (as driver handles are at the boundary).
fn cuda_ordinal(dev: *mut c_void) -> Option<usize> {
    if let Some(found) = cuda_ordinal_by_uuid(dev) {
        return found;
    }
    let mut i = 0u32;
    match nvml().get_index {
        // SAFETY: NVML's `nvmlDeviceGetIndex` with the caller's handle and a live local.
        Some(f) if unsafe { f(dev, &mut i) } == NVML_SUCCESS => {
            Some(i as usize % libshare_abi::MAX_DEVICES)
        }
        _ => Some(0),
    }
}

/// Some(Some(ordinal)) or Some(None) (CUDA does not see it) when CUDA can be asked; None if not.
fn cuda_ordinal_by_uuid(dev: *mut c_void) -> Option<Option<usize>> {
    let get_uuid = nvml().get_uuid?;
    let mut buf = [0 as std::ffi::c_char; 96];
    // SAFETY: NVML's `nvmlDeviceGetUUID` with the caller's handle and a local buffer of the
    // length passed.
    if unsafe { get_uuid(dev, buf.as_mut_ptr(), buf.len() as u32) } != NVML_SUCCESS {
        return None;
    }
    // SAFETY: on success NVML wrote a NUL-terminated string within the length passed, into
    // `buf`, which lives to the end of this function.
    let nvml_uuid = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
        .to_str()
        .ok()?;
    let r = crate::driver::real();
    let (count, uuid_of) = (r.cuDeviceGetCount?, r.cuDeviceGetUuid?);
    let mut n = 0;
    // SAFETY: the driver's `cuDeviceGetCount` with a live local.
    if unsafe { count(&mut n) } != CUDA_SUCCESS {
        return None;
    }
    Some(
        (0..n.clamp(0, libshare_abi::MAX_DEVICES as i32)).find_map(|d| {
            let mut u = CUuuid([0; 16]);
            // SAFETY: the driver's `cuDeviceGetUuid` with a live local and an ordinal below
            // the device count (else an error, not UB).
            (unsafe { uuid_of(&mut u, d) } == CUDA_SUCCESS
                && nvml_uuid.eq_ignore_ascii_case(&format_uuid(&u.0)))
            .then_some(d as usize)
        }),
    )
}

/// (free, total) of an NVML device as the job sees it: the quota of the CUDA device it is, or the
/// real figures for a device CUDA does not see.
fn as_job_sees(device: *mut c_void, free: u64, total: u64) -> (u64, u64) {
    match cuda_ordinal(device) {
        Some(d) => crate::ledger::visible(d, free, total),
        None => (free, total),
    }
}

/// `nvmlDeviceGetMemoryInfo`: the real NVML's answer, with free and total as the job sees them
/// (the quota); `used` follows and never wraps.
fn memory_info(
    call: impl FnOnce() -> NvmlReturn,
    device: *mut c_void,
    mem: Out<Memory>,
) -> NvmlReturn {
    let r = call();
    if let (NVML_SUCCESS, Some(m)) = (r, mem.get()) {
        let (free, total) = as_job_sees(device, m.free, m.total);
        mem.set(Memory {
            total,
            free,
            used: total.saturating_sub(free),
        });
    }
    r
}

/// As [`memory_info`], for `nvmlMemory_v2_t` (`used` excludes `reserved`).
fn memory_info_v2(
    call: impl FnOnce() -> NvmlReturn,
    device: *mut c_void,
    mem: Out<MemoryV2>,
) -> NvmlReturn {
    let r = call();
    if let (NVML_SUCCESS, Some(m)) = (r, mem.get()) {
        let (free, total) = as_job_sees(device, m.free, m.total);
        mem.set(MemoryV2 {
            total,
            free,
            used: total.saturating_sub(free).saturating_sub(m.reserved),
            ..m
        });
    }
    r
}
