//! NVML memory info reports the quota too (PyTorch and monitoring read it), consistent with
//! `cuMemGetInfo`, for the node's GPU the NVML device is (`devmap.rs`). The real NVML:
//! `nvml_real.rs`.

use std::ffi::c_void;

use crate::boundary::{FromCuda, Out, Scope};
use crate::nvml_real::nvml;
pub use crate::nvml_real::{library_base, Memory, MemoryV2};
use crate::types::{NvmlReturn, NVML_ERROR_UNINITIALIZED, NVML_ERROR_UNKNOWN, NVML_SUCCESS};
use shim_headers::guard;

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

pub fn hook_ptr(name: &str) -> Option<*mut c_void> {
    match name {
        "nvmlDeviceGetMemoryInfo" => Some(nvmlDeviceGetMemoryInfo as *const () as *mut c_void),
        "nvmlDeviceGetMemoryInfo_v2" => {
            Some(nvmlDeviceGetMemoryInfo_v2 as *const () as *mut c_void)
        }
        _ => None,
    }
}

/// The node's GPU index of an NVML device (quotas are per node GPU: NVML's index is the node's),
/// or None if this process's CUDA does not see it (`CUDA_VISIBLE_DEVICES`; no quota applies
/// then), which `devmap.rs` knows. An NVML-only tool (no CUDA driver answering) sees what a
/// numeric `CUDA_VISIBLE_DEVICES` lists, else every GPU. `dev` is the caller's NVML handle, a
/// value only NVML dereferences (as driver handles are at the boundary).
fn node_index(dev: *mut c_void) -> Option<usize> {
    let mut i = 0u32;
    let node = match nvml().get_index {
        // SAFETY: NVML's `nvmlDeviceGetIndex` with the caller's handle and a live local.
        Some(f) if unsafe { f(dev, &mut i) } == NVML_SUCCESS => i as usize,
        _ => 0,
    };
    crate::devmap::ordinal_of(node).map(|_| node)
}

/// (free, total) of an NVML device as the job sees it: the quota of the CUDA device it is, or the
/// real figures for a device CUDA does not see.
fn as_job_sees(device: *mut c_void, free: u64, total: u64) -> (u64, u64) {
    match node_index(device) {
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
