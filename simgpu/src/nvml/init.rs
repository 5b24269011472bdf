//! NVML exports: initialisation and system queries.

use super::*;

nvml! {
    fn nvmlInit_v2() {
        match init_with(SimConfig::from_env) {
            NVML_SUCCESS => Ok(()),
            e => Err(e),
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlInit() -> NvmlReturn {
    // SAFETY: nvmlInit_v2 takes no arguments.
    unsafe { nvmlInit_v2() }
}

/// `flags` (NVML_INIT_FLAG_NO_GPUS, NVML_INIT_FLAG_NO_ATTACH) change nothing here.
#[no_mangle]
pub unsafe extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> NvmlReturn {
    // SAFETY: nvmlInit_v2 takes no arguments.
    unsafe { nvmlInit_v2() }
}

nvml! {
    fn nvmlShutdown() {
        REFS.fetch_update(AcqRel, Acquire, |n| n.checked_sub(1))
            .map(|_| ())
            .map_err(|_| NVML_ERROR_UNINITIALIZED)
    }
}

/// A static description of `result`; valid without nvmlInit.
#[no_mangle]
pub unsafe extern "C" fn nvmlErrorString(result: NvmlReturn) -> *const c_char {
    let s: &'static CStr = match result {
        0 => c"Success",
        1 => c"Uninitialized",
        2 => c"Invalid Argument",
        3 => c"Not Supported",
        4 => c"Insufficient Permissions",
        5 => c"Already Initialized",
        6 => c"Not Found",
        7 => c"Insufficient Size",
        8 => c"Insufficient External Power",
        9 => c"Driver Not Loaded",
        10 => c"Timeout",
        11 => c"Interrupt request issue",
        12 => c"NVML Shared Library Not Found",
        13 => c"Function Not Found",
        14 => c"Corrupted infoROM",
        15 => c"GPU is lost",
        16 => c"GPU requires restart",
        17 => c"The operating system has blocked the request.",
        18 => c"RM has detected an NVML/RM version mismatch.",
        19 => c"In use by another client",
        20 => c"Insufficient Memory",
        21 => c"No data",
        22 => c"The requested vgpu operation is not available on target device, becasue ECC is enabled",
        23 => c"Insufficient resources",
        24 => c"Frequency not supported",
        25 => c"Argument version mismatch",
        26 => c"Deprecated",
        27 => c"Not Ready",
        28 => c"GPU not found",
        29 => c"Invalid state",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

nvml! {
    fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) {
        let s = state()?;
        out_str(
            version,
            length,
            &driver_version_string(s.cfg.driver_version),
        )
    }
}

nvml! {
    /// `<CUDA major>.<driver version>`, e.g. `13.580.00`.
    fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) {
        let s = state()?;
        let v = s.cfg.driver_version;
        out_str(
            version,
            length,
            &format!("{}.{}", v / 1000, driver_version_string(v)),
        )
    }
}

nvml! {
    fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) {
        out(version, state()?.cfg.driver_version)
    }
}

nvml! {
    fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) {
        out(version, state()?.cfg.driver_version)
    }
}
