//! The NVML subset: what `nvidia-smi`-like tools, pynvml (`nvidia-ml-py`) and PyTorch ask
//! `libnvidia-ml.so.1` for — device identity, memory, utilisation, running processes and
//! per-process utilisation — answered from the simulated machine's shared state file.
//!
//! NVML works without `cuInit`: `nvmlInit*` loads the configuration and maps the state file itself
//! but does not register a process slot (a monitoring process is not a GPU user). Devices are the
//! configured ones (at most as many as the state file was created with); a device handle is the
//! address of a per-device record that lives as long as the process.
//!
//! What the numbers mean here:
//! - memory: `used` is the device's allocations plus resident managed chunks (`DevState.mem_used`);
//!   slots of processes that died without exiting are reclaimed first, as the driver would;
//! - PCIe throughput: bytes of host-device copies and managed-memory migrations per 20 ms;
//! - utilisation: `gpu` is the share of the last second the compute timeline was busy (all
//!   processes); `memory` is 0 (the model has no memory-bandwidth counter);
//! - running compute processes: live processes that hold memory on, or have launched kernels
//!   on, the device; `usedGpuMemory` is their allocations there;
//! - process utilisation: one sample per such process, `smUtil` its share of the last second,
//!   time stamped now (CPU clock, µs); none if `lastSeenTimeStamp` is not in the past;
//! - graphics processes: none. Temperature is a constant 40 °C; power follows utilisation
//!   (55 W idle to 400 W busy, like an A100 SXM4). Clocks are an A100's maximum clocks, current
//!   and maximum alike (1410 MHz graphics/SM, 1215 MHz memory, 1290 MHz video), the SM and memory
//!   clocks being those `cuDeviceGetAttribute` reports (13, 36).
//!
//! Every export is NULL-safe (`NVML_ERROR_INVALID_ARGUMENT`), returns
//! `NVML_ERROR_UNINITIALIZED` before `nvmlInit` (and after the matching `nvmlShutdown`) and
//! turns an internal panic into `NVML_ERROR_UNKNOWN`. Struct layouts are NVIDIA's `nvml.h`
//! (checked by the size assertions below). NVML functions not listed here are not exported:
//! NVML callers resolve functions by name and handle a missing one.
//!
//! # Safety
//!
//! The exports are `unsafe extern "C"` for one reason, the same for all of them: their callers
//! (C code reading `nvml.h`, not Rust code reading rustdoc) must pass pointers that are NULL or
//! valid for the type or buffer length `nvml.h` documents for that argument, and device handles
//! this library handed out. Hence `clippy::missing_safety_doc` is allowed for this module instead
//! of repeating that sentence on ~60 exports; each `unsafe` block inside says what it relies on.
#![allow(clippy::missing_safety_doc)]

use libshare_abi::SlotTable;
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr};
use std::sync::atomic::{AtomicU32, Ordering::*};
use std::sync::OnceLock;

use crate::config::{format_uuid, ConfigError, DeviceConfig, SimConfig};
use crate::shared::{now_ns, Shared};

/// `nvmlDevice_t`: an opaque pointer.
pub type NvmlDevice = *mut c_void;

/// Return codes: the one table in `shim_headers::types`, shared with libshare.
pub use shim_headers::types::{
    NvmlReturn, NVML_ERROR_ALREADY_INITIALIZED, NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
    NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_INSUFFICIENT_SIZE,
    NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_FOUND, NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_NO_PERMISSION, NVML_ERROR_UNINITIALIZED, NVML_ERROR_UNKNOWN, NVML_SUCCESS,
};

/// `nvmlTemperatureSensors_t`
pub const NVML_TEMPERATURE_GPU: c_uint = 0;
/// `nvmlComputeMode_t`
pub const NVML_COMPUTEMODE_DEFAULT: c_uint = 0;
/// `gpuInstanceId` / `computeInstanceId` when MIG is disabled.
pub const NVML_INSTANCE_ID_NONE: c_uint = 0xFFFF_FFFF;
/// `NVML_STRUCT_VERSION(Memory, 2)`: sizeof(nvmlMemory_v2_t) | 2 << 24.
pub const NVML_MEMORY_V2: c_uint = (std::mem::size_of::<NvmlMemoryV2>() as c_uint) | (2 << 24);

/// PCI ids reported for every device: an A100-SXM4-40GB (device 0x20B0, vendor 0x10DE).
pub const PCI_DEVICE_ID: c_uint = 0x20B0_10DE;
pub const PCI_SUBSYSTEM_ID: c_uint = 0x134F_10DE;

const TEMPERATURE_C: c_uint = 40;
const IDLE_POWER_MW: f64 = 55_000.0;
const MAX_POWER_MW: f64 = 400_000.0;
/// Utilisation is measured over this window.
const UTIL_WINDOW_NS: u64 = 1_000_000_000;

/// `nvmlMemory_t`
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NvmlMemory {
    pub total: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `nvmlMemory_v2_t`
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NvmlMemoryV2 {
    pub version: c_uint,
    pub total: c_ulonglong,
    pub reserved: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `nvmlUtilization_t`
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NvmlUtilization {
    pub gpu: c_uint,
    pub memory: c_uint,
}

/// `nvmlPciInfo_t` (NVML ≥ 9, `nvmlDeviceGetPciInfo_v3`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NvmlPciInfo {
    pub bus_id_legacy: [c_char; 16],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pci_device_id: c_uint,
    pub pci_sub_system_id: c_uint,
    pub bus_id: [c_char; 32],
}

/// The pre-9 `nvmlPciInfo_t` of `nvmlDeviceGetPciInfo` / `_v2` (pynvml's `nvmlPciInfo_v2_t`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NvmlPciInfoV2 {
    pub bus_id: [c_char; 16],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pci_device_id: c_uint,
    pub pci_sub_system_id: c_uint,
    pub reserved: [c_uint; 4],
}

/// `nvmlProcessInfo_v1_t`
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NvmlProcessInfoV1 {
    pub pid: c_uint,
    pub used_gpu_memory: c_ulonglong,
}

/// `nvmlProcessInfo_v2_t` (`nvmlProcessInfo_t` for the `_v2` and `_v3` functions).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NvmlProcessInfoV2 {
    pub pid: c_uint,
    pub used_gpu_memory: c_ulonglong,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

/// `nvmlProcessUtilizationSample_t`
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NvmlProcessUtilizationSample {
    pub pid: c_uint,
    /// CPU time stamp, µs.
    pub time_stamp: c_ulonglong,
    pub sm_util: c_uint,
    pub mem_util: c_uint,
    pub enc_util: c_uint,
    pub dec_util: c_uint,
}

/// `nvmlSetMemoryLimits_v1_t` (r615+): the limits of one cgroup, in bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NvmlSetMemoryLimitsV1 {
    /// [in] Full path to the cgroup's sysfs directory.
    pub name_space: *const c_char,
    /// [in] Guaranteed before allocations may fail under memory pressure.
    pub soft_limit: c_ulonglong,
    /// [in] The most the cgroup's processes may allocate (NVML_DEVICE_MEMORY_LIMIT_MAX: none).
    pub hard_limit: c_ulonglong,
}

/// `nvmlGetMemoryLimits_v1_t` (r615+).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NvmlGetMemoryLimitsV1 {
    /// [in] Full path to the cgroup's sysfs directory.
    pub name_space: *const c_char,
    /// [out]
    pub soft_limit: c_ulonglong,
    /// [out]
    pub hard_limit: c_ulonglong,
    /// [out] Device memory the cgroup's processes hold now.
    pub current_used: c_ulonglong,
}

/// `NVML_DEVICE_MEMORY_LIMIT_MAX`: a hard limit that means none (assumed ULLONG_MAX; the
/// header's value is not in the documentation simgpu was written against).
pub const NVML_DEVICE_MEMORY_LIMIT_MAX: c_ulonglong = crate::cglimits::NO_LIMIT;

/// The first driver branch with per-cgroup memory limits.
pub const MEMORY_LIMITS_BRANCH: u32 = 615;

// The ABI: sizes (and the offsets that padding decides) as in nvml.h on x86-64 / aarch64.
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<NvmlMemory>() == 24);
    assert!(size_of::<NvmlMemoryV2>() == 40);
    assert!(offset_of!(NvmlMemoryV2, total) == 8);
    assert!(NVML_MEMORY_V2 == 0x0200_0028);
    assert!(size_of::<NvmlUtilization>() == 8);
    assert!(size_of::<NvmlPciInfo>() == 68);
    assert!(offset_of!(NvmlPciInfo, bus_id) == 36);
    assert!(size_of::<NvmlPciInfoV2>() == 52);
    assert!(size_of::<NvmlProcessInfoV1>() == 16);
    assert!(offset_of!(NvmlProcessInfoV1, used_gpu_memory) == 8);
    assert!(size_of::<NvmlProcessInfoV2>() == 24);
    assert!(offset_of!(NvmlProcessInfoV2, gpu_instance_id) == 16);
    assert!(size_of::<NvmlProcessUtilizationSample>() == 32);
    assert!(offset_of!(NvmlProcessUtilizationSample, time_stamp) == 8);
    assert!(offset_of!(NvmlProcessUtilizationSample, sm_util) == 16);
    assert!(size_of::<NvmlSetMemoryLimitsV1>() == 24);
    assert!(size_of::<NvmlGetMemoryLimitsV1>() == 32);
};

// ---------------------------------------------------------------------------------------------
// State

/// One device: its handle is the address of this record.
pub struct Device {
    pub index: usize,
    pub cfg: DeviceConfig,
}

struct Nvml {
    cfg: SimConfig,
    shared: Shared,
    devices: Vec<Device>,
}

static STATE: OnceLock<Result<Nvml, NvmlReturn>> = OnceLock::new();
/// nvmlInit calls not yet matched by nvmlShutdown.
static REFS: AtomicU32 = AtomicU32::new(0);

type R = Result<(), NvmlReturn>;

/// Loads the configuration (once per process) with `load` and maps the state file.
fn init_with(load: impl FnOnce() -> Result<SimConfig, ConfigError>) -> NvmlReturn {
    let state = STATE.get_or_init(|| {
        let cfg = load().map_err(|e| {
            eprintln!("{e}");
            NVML_ERROR_DRIVER_NOT_LOADED
        })?;
        if crate::sim::get().is_none() {
            crate::log::LEVEL.store(cfg.log_level, Relaxed);
        }
        let mem: Vec<u64> = cfg.devices.iter().map(|d| d.memory).collect();
        let shared = Shared::open(&cfg.state_dir, &mem).map_err(|e| {
            eprintln!("simgpu: {e} (set SIMGPU_STATE_DIR to a writable directory)");
            NVML_ERROR_DRIVER_NOT_LOADED
        })?;
        let ndev = cfg.devices.len().min(shared.ndev);
        let devices = cfg.devices[..ndev]
            .iter()
            .enumerate()
            .map(|(index, d)| Device {
                index,
                cfg: d.clone(),
            })
            .collect();
        Ok(Nvml {
            cfg,
            shared,
            devices,
        })
    });
    match state {
        Ok(_) => {
            REFS.fetch_add(1, AcqRel);
            NVML_SUCCESS
        }
        Err(e) => *e,
    }
}

fn state() -> Result<&'static Nvml, NvmlReturn> {
    match STATE.get() {
        Some(Ok(s)) if REFS.load(Acquire) > 0 => Ok(s),
        _ => Err(NVML_ERROR_UNINITIALIZED),
    }
}

impl Nvml {
    fn handle(&self, i: usize) -> NvmlDevice {
        &self.devices[i] as *const Device as NvmlDevice
    }

    /// The device a handle names (handles are checked, never dereferenced blindly).
    fn device(&self, h: NvmlDevice) -> Result<&Device, NvmlReturn> {
        self.devices
            .iter()
            .find(|d| std::ptr::eq(*d as *const Device as *const c_void, h))
            .ok_or(NVML_ERROR_INVALID_ARGUMENT)
    }
}

/// The state and the device of `h`, in NVML's order of checks.
fn dev(h: NvmlDevice) -> Result<(&'static Nvml, &'static Device), NvmlReturn> {
    let s = state()?;
    Ok((s, s.device(h)?))
}

/// Runs an export's body (`nvml!`): a panic becomes NVML_ERROR_UNKNOWN (`shim_headers::guard`),
/// never an unwind into C.
pub fn run(name: &str, f: impl FnOnce() -> R) -> NvmlReturn {
    crate::debug!("{name}");
    shim_headers::guard(name, NVML_ERROR_UNKNOWN, || match f() {
        Ok(()) => NVML_SUCCESS,
        Err(e) => {
            crate::debug!("{name} -> {e}");
            e
        }
    })
}

/// Defines exported NVML functions whose body returns `R`, each run by [`run`] under its own
/// name.
///
/// # Safety
///
/// Every generated function is an `unsafe extern "C"` NVML entry point: its caller keeps the
/// pointer contracts `nvml.h` documents for it (out-pointers NULL or writable for the documented
/// type, buffers of the length passed, C strings NUL-terminated, device handles from this
/// library). As in `driver!`, the body runs in one `unsafe` block covering exactly "read or write
/// through an argument under that contract" (`out`, `out_str`, `out_list`, `in_str`); anything
/// beyond it gets its own `unsafe fn` or `// SAFETY:` comment.
macro_rules! nvml {
    ($(#[$m:meta])* fn $name:ident ($($a:ident : $t:ty),* $(,)?) $body:block) => {
        $(#[$m])*
        ///
        /// # Safety
        ///
        /// NVML's documented pointer contract for this function.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> NvmlReturn {
            run(stringify!($name), || -> R {
                // SAFETY: the arguments come from an NVML caller, which keeps the pointer
                // contracts nvml.h documents for this function (see the macro's doc).
                #[allow(unused_unsafe, clippy::macro_metavars_in_unsafe)]
                unsafe { $body }
            })
        }
    };
}

/// Writes `v` through an out-pointer, or fails with NVML_ERROR_INVALID_ARGUMENT if it is NULL.
///
/// # Safety
///
/// `p` is NULL or valid for writing one `T` (alignment not required; the old value is not
/// dropped).
unsafe fn out<T>(p: *mut T, v: T) -> R {
    if p.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: not NULL (checked), so writable by this fn's contract.
    unsafe { p.write_unaligned(v) };
    Ok(())
}

/// Copies `s` and a NUL into `buf` of `len` bytes.
///
/// # Safety
///
/// `buf` is NULL or valid for writing `len` bytes.
unsafe fn out_str(buf: *mut c_char, len: c_uint, s: &str) -> R {
    if buf.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    if (len as usize) < s.len() + 1 {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: not NULL (checked) and writable for len >= s.len() + 1 bytes (this fn's contract).
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf as *mut u8, s.len());
        *buf.add(s.len()) = 0;
    }
    Ok(())
}

/// The C string `p` as UTF-8.
///
/// # Safety
///
/// `p` is NULL or a NUL-terminated string.
unsafe fn in_str(p: *const c_char) -> Result<String, NvmlReturn> {
    if p.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: not NULL (checked), so NUL-terminated by this fn's contract.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map(str::to_owned)
        .map_err(|_| NVML_ERROR_INVALID_ARGUMENT)
}

/// NVML's size protocol for lists: `*count` is the capacity of `out` in, the number of entries
/// out. Too small (including a NULL `out` with `*count == 0`) → INSUFFICIENT_SIZE with the
/// number needed. An empty list is SUCCESS with `*count = 0`.
///
/// # Safety
///
/// `count` is NULL or valid for reading and writing; `out` is NULL or valid for writing `*count`
/// (as passed in) entries.
unsafe fn out_list<T: Copy>(items: &[T], count: *mut c_uint, out: *mut T) -> R {
    if count.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: not NULL (checked), so readable and writable by this fn's contract.
    let capacity = unsafe { count.replace(items.len() as c_uint) } as usize;
    let n = items.len();
    if n == 0 {
        return Ok(());
    }
    if capacity < n {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    if out.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: `out` is not NULL (checked) and holds capacity >= n entries (this fn's contract).
    unsafe { std::ptr::copy_nonoverlapping(items.as_ptr(), out, n) };
    Ok(())
}

fn to_percent(fraction: f64) -> c_uint {
    (fraction * 100.0).round().clamp(0.0, 100.0) as c_uint
}

/// CLOCK_REALTIME in µs: NVML's sample time stamps.
fn wall_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

mod devices;
mod init;
mod limits;
mod pure;
mod usage;
pub use devices::*;
pub use init::*;
pub use limits::*;
use pure::*;
pub use usage::*;

#[cfg(test)]
mod tests;
