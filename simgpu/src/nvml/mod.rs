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

// ---------------------------------------------------------------------------------------------
// Pure parts

/// `NVML_DEVICE_PCI_BUS_ID_FMT`: `00000000:10:00.0`.
pub fn bus_id(d: &DeviceConfig) -> String {
    format!(
        "{:08X}:{:02X}:{:02X}.0",
        d.pci_domain, d.pci_bus, d.pci_device
    )
}

/// `NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT`: `0000:10:00.0`.
pub fn bus_id_legacy(d: &DeviceConfig) -> String {
    format!(
        "{:04X}:{:02X}:{:02X}.0",
        d.pci_domain, d.pci_bus, d.pci_device
    )
}

/// Parses a PCI bus id the way `nvmlDeviceGetHandleByPciBusId` accepts it (hex numbers):
/// `domain:bus:device.function`, `domain:bus:device` or `bus:device.function`.
/// Returns (domain, bus, device, function).
pub fn parse_bus_id(s: &str) -> Option<(u32, u32, u32, u32)> {
    let hex = |t: &str| {
        (!t.is_empty() && t.len() <= 8)
            .then(|| u32::from_str_radix(t, 16).ok())
            .flatten()
    };
    let parts: Vec<&str> = s.trim().split(':').collect();
    let (domain, bus, devfn, need_fn) = match parts.as_slice() {
        [domain, bus, devfn] => (hex(domain)?, hex(bus)?, *devfn, false),
        [bus, devfn] => (0, hex(bus)?, *devfn, true),
        _ => return None,
    };
    let (device, function) = match devfn.split_once('.') {
        Some((d, f)) => (hex(d)?, hex(f)?),
        None if !need_fn => (hex(devfn)?, 0),
        None => return None,
    };
    Some((domain, bus, device, function))
}

fn fill_c<const N: usize>(s: &str) -> [c_char; N] {
    let mut a = [0 as c_char; N];
    for (dst, src) in a.iter_mut().zip(s.bytes().take(N - 1)) {
        *dst = src as c_char;
    }
    a
}

/// The driver branch a CUDA driver version ships with (13000 → 580), for version strings.
pub fn driver_branch(cuda_version: i32) -> u32 {
    let (major, minor) = (cuda_version / 1000, ((cuda_version % 1000) / 10) as u32);
    match major {
        ..=11 => 470,
        12 => [525, 530, 535, 545, 550, 555, 560, 565, 570, 575][minor.min(9) as usize],
        _ => 580 + 5 * (minor + 10 * (major as u32 - 13)),
    }
}

/// What `nvmlSystemGetDriverVersion` reports, e.g. `580.00` for CUDA 13.0.
pub fn driver_version_string(cuda_version: i32) -> String {
    format!("{}.00", driver_branch(cuda_version))
}

/// Live processes using device `dev`: (slot, pid, bytes allocated there), in slot order.
pub fn running_processes(shared: &Shared, dev: usize) -> Vec<(usize, u32, u64)> {
    shared
        .live_slots()
        .into_iter()
        .filter_map(|(slot, pid)| {
            let pd = &shared.slot(slot).dev[dev];
            let mem = pd.mem_used.load(Acquire);
            (mem > 0 || pd.kernels.load(Acquire) > 0).then_some((slot, pid, mem))
        })
        .collect()
}

/// One utilisation sample per process using `dev`, time stamped `stamp_us`, with `smUtil` its
/// busy share of the `UTIL_WINDOW_NS` before `now` (CLOCK_MONOTONIC ns).
pub fn process_samples(
    shared: &Shared,
    dev: usize,
    now: u64,
    stamp_us: u64,
) -> Vec<NvmlProcessUtilizationSample> {
    running_processes(shared, dev)
        .into_iter()
        .map(|(slot, pid, _)| NvmlProcessUtilizationSample {
            pid,
            time_stamp: stamp_us,
            sm_util: to_percent(
                shared.slot(slot).dev[dev]
                    .window
                    .utilisation(now, UTIL_WINDOW_NS),
            ),
            ..Default::default()
        })
        .collect()
}

/// The device's memory: (total, used), with used ≤ total.
fn memory(s: &Nvml, d: &Device) -> (u64, u64) {
    // Memory of processes that were killed goes back to the device, as with the real driver.
    s.shared.reclaim_dead();
    let ds = s.shared.dev(d.index);
    let total = ds.mem_total.load(Acquire);
    (total, ds.mem_used.load(Acquire).min(total))
}

fn gpu_utilisation(s: &Nvml, d: &Device) -> f64 {
    s.shared
        .dev(d.index)
        .window
        .utilisation(now_ns(), UTIL_WINDOW_NS)
}

// ---------------------------------------------------------------------------------------------
// Exports: initialisation and system queries

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

// ---------------------------------------------------------------------------------------------
// Exports: devices and handles

nvml! {
    fn nvmlDeviceGetCount_v2(count: *mut c_uint) {
        out(count, state()?.devices.len() as c_uint)
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount(count: *mut c_uint) -> NvmlReturn {
    // SAFETY: the same argument under the same contract.
    unsafe { nvmlDeviceGetCount_v2(count) }
}

nvml! {
    fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut NvmlDevice) {
        let s = state()?;
        if index as usize >= s.devices.len() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        out(device, s.handle(index as usize))
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    device: *mut NvmlDevice,
) -> NvmlReturn {
    // SAFETY: the same arguments under the same contract.
    unsafe { nvmlDeviceGetHandleByIndex_v2(index, device) }
}

nvml! {
    fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, device: *mut NvmlDevice) {
        let s = state()?;
        let want = in_str(uuid)?;
        if device.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let i = s
            .devices
            .iter()
            .position(|d| format_uuid(&d.cfg.uuid).eq_ignore_ascii_case(want.trim()))
            .ok_or(NVML_ERROR_NOT_FOUND)?;
        out(device, s.handle(i))
    }
}

nvml! {
    fn nvmlDeviceGetHandleByPciBusId_v2(pci_bus_id: *const c_char, device: *mut NvmlDevice) {
        let s = state()?;
        let want = parse_bus_id(&in_str(pci_bus_id)?).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        if device.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let i = s
            .devices
            .iter()
            .position(|d| want == (d.cfg.pci_domain, d.cfg.pci_bus, d.cfg.pci_device, 0))
            .ok_or(NVML_ERROR_NOT_FOUND)?;
        out(device, s.handle(i))
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId(
    pci_bus_id: *const c_char,
    device: *mut NvmlDevice,
) -> NvmlReturn {
    // SAFETY: the same arguments under the same contract.
    unsafe { nvmlDeviceGetHandleByPciBusId_v2(pci_bus_id, device) }
}

nvml! {
    fn nvmlDeviceGetIndex(device: NvmlDevice, index: *mut c_uint) {
        out(index, dev(device)?.1.index as c_uint)
    }
}

nvml! {
    fn nvmlDeviceGetMinorNumber(device: NvmlDevice, minor: *mut c_uint) {
        out(minor, dev(device)?.1.index as c_uint)
    }
}

nvml! {
    fn nvmlDeviceGetName(device: NvmlDevice, name: *mut c_char, length: c_uint) {
        out_str(name, length, &dev(device)?.1.cfg.name)
    }
}

nvml! {
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`: the bytes `cuDeviceGetUuid` returns.
    fn nvmlDeviceGetUUID(device: NvmlDevice, uuid: *mut c_char, length: c_uint) {
        out_str(uuid, length, &format_uuid(&dev(device)?.1.cfg.uuid))
    }
}

nvml! {
    fn nvmlDeviceGetPciInfo_v3(device: NvmlDevice, pci: *mut NvmlPciInfo) {
        let d = &dev(device)?.1.cfg;
        out(
            pci,
            NvmlPciInfo {
                bus_id_legacy: fill_c(&bus_id_legacy(d)),
                domain: d.pci_domain,
                bus: d.pci_bus,
                device: d.pci_device,
                pci_device_id: PCI_DEVICE_ID,
                pci_sub_system_id: PCI_SUBSYSTEM_ID,
                bus_id: fill_c(&bus_id(d)),
            },
        )
    }
}

nvml! {
    fn nvmlDeviceGetPciInfo_v2(device: NvmlDevice, pci: *mut NvmlPciInfoV2) {
        let d = &dev(device)?.1.cfg;
        out(
            pci,
            NvmlPciInfoV2 {
                bus_id: fill_c(&bus_id_legacy(d)),
                domain: d.pci_domain,
                bus: d.pci_bus,
                device: d.pci_device,
                pci_device_id: PCI_DEVICE_ID,
                pci_sub_system_id: PCI_SUBSYSTEM_ID,
                reserved: [0; 4],
            },
        )
    }
}

nvml! {
    /// The oldest layout: only the first 36 bytes of [`NvmlPciInfoV2`] (no reserved words) are written.
    fn nvmlDeviceGetPciInfo(device: NvmlDevice, pci: *mut NvmlPciInfoV2) {
        let d = &dev(device)?.1.cfg;
        if pci.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: pci points to at least the 36 bytes of the legacy struct.
        unsafe {
            let p = pci as *mut u8;
            let id: [c_char; 16] = fill_c(&bus_id_legacy(d));
            std::ptr::copy_nonoverlapping(id.as_ptr() as *const u8, p, 16);
            let words = [
                d.pci_domain,
                d.pci_bus,
                d.pci_device,
                PCI_DEVICE_ID,
                PCI_SUBSYSTEM_ID,
            ];
            std::ptr::copy_nonoverlapping(words.as_ptr() as *const u8, p.add(16), 20);
        }
        Ok(())
    }
}

nvml! {
    fn nvmlDeviceGetCudaComputeCapability(device: NvmlDevice, major: *mut c_int, minor: *mut c_int) {
        let (ma, mi) = dev(device)?.1.cfg.compute_capability;
        if major.is_null() || minor.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        out(major, ma as c_int)?;
        out(minor, mi as c_int)
    }
}

nvml! {
    fn nvmlDeviceGetComputeMode(device: NvmlDevice, mode: *mut c_uint) {
        dev(device)?;
        out(mode, NVML_COMPUTEMODE_DEFAULT)
    }
}

nvml! {
    fn nvmlDeviceGetMultiGpuBoard(device: NvmlDevice, multi_gpu: *mut c_uint) {
        dev(device)?;
        out(multi_gpu, 0)
    }
}

nvml! {
    /// What NCCL's NVML wrapper loads (and calls without checking) when it builds its topology: a
    /// PCIe Gen4 x16 device with no NVLink, no field values, not in confidential-computing mode.
    fn nvmlDeviceGetCurrPcieLinkGeneration(device: NvmlDevice, gen: *mut c_uint) {
        dev(device)?;
        out(gen, 4)
    }
}

nvml! {
    fn nvmlDeviceGetCurrPcieLinkWidth(device: NvmlDevice, width: *mut c_uint) {
        dev(device)?;
        out(width, 16)
    }
}

nvml! {
    fn nvmlDeviceGetPcieLinkMaxSpeed(device: NvmlDevice, mbps: *mut c_uint) {
        dev(device)?;
        out(mbps, 16000) // NVML_PCIE_LINK_MAX_SPEED_16000MBPS (Gen4)
    }
}

/// `nvmlPcieUtilCounter_t`: bytes the device sent (`TX`) or received (`RX`).
pub const NVML_PCIE_UTIL_TX_BYTES: c_uint = 0;
pub const NVML_PCIE_UTIL_RX_BYTES: c_uint = 1;
/// NVML samples the PCIe byte counters over 20 ms.
const PCIE_WINDOW_NS: u64 = 20_000_000;

nvml! {
    /// PCIe throughput in KB/s over about the last 20 ms (NVML's sample; simgpu's byte windows
    /// have 16 ms buckets, so it averages over the buckets that cover those 20 ms): host-device
    /// copies and managed-memory migrations, write-backs and remote reads, in the modelled
    /// interval they moved in. TX is what the device sent (device to host), RX what it received.
    fn nvmlDeviceGetPcieThroughput(device: NvmlDevice, counter: c_uint, value: *mut c_uint) {
        let (s, d) = dev(device)?;
        let ds = s.shared.dev(d.index);
        let w = match counter {
            NVML_PCIE_UTIL_TX_BYTES => &ds.pcie_tx,
            NVML_PCIE_UTIL_RX_BYTES => &ds.pcie_rx,
            _ => return Err(NVML_ERROR_INVALID_ARGUMENT),
        };
        let kb = w.rate(now_ns(), PCIE_WINDOW_NS) / 1000;
        out(value, kb.min(c_uint::MAX as u64) as c_uint)
    }
}

nvml! {
    fn nvmlDeviceGetNvLinkState(device: NvmlDevice, _link: c_uint, _active: *mut c_uint) {
        dev(device)?;
        Err(NVML_ERROR_NOT_SUPPORTED)
    }
}

nvml! {
    fn nvmlDeviceGetNvLinkCapability(device: NvmlDevice, _link: c_uint, _cap: c_uint, _result: *mut c_uint) {
        dev(device)?;
        Err(NVML_ERROR_NOT_SUPPORTED)
    }
}

nvml! {
    fn nvmlDeviceGetNvLinkRemotePciInfo(device: NvmlDevice, _link: c_uint, _pci: *mut c_void) {
        dev(device)?;
        Err(NVML_ERROR_NOT_SUPPORTED)
    }
}

/// `nvmlFieldValue_t`.
#[repr(C)]
pub struct NvmlFieldValue {
    pub field_id: c_uint,
    pub scope_id: c_uint,
    pub timestamp: i64,
    pub latency_usec: i64,
    pub value_type: c_uint,
    pub nvml_return: NvmlReturn,
    pub value: u64,
}

nvml! {
    /// Every field is answered "not supported" (the call itself succeeds, as NVML does).
    fn nvmlDeviceGetFieldValues(device: NvmlDevice, count: c_int, values: *mut NvmlFieldValue) {
        dev(device)?;
        if values.is_null() || count < 0 {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        for i in 0..count as usize {
            // SAFETY: `values` is not NULL (checked) and holds `count` entries (NVML's contract).
            let v = unsafe { &mut *values.add(i) };
            v.nvml_return = NVML_ERROR_NOT_SUPPORTED;
            v.value = 0;
        }
        Ok(())
    }
}

/// `nvmlPciInfoExt_t` (v1).
#[repr(C)]
pub struct NvmlPciInfoExt {
    pub version: c_uint,
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pci_device_id: c_uint,
    pub pci_sub_system_id: c_uint,
    pub base_class: c_uint,
    pub sub_class: c_uint,
    pub bus_id: [c_char; 32],
}

nvml! {
    fn nvmlDeviceGetPciInfoExt(device: NvmlDevice, pci: *mut NvmlPciInfoExt) {
        let d = &dev(device)?.1.cfg;
        // SAFETY: `pci` is NULL or a writable nvmlPciInfoExt_t (NVML's contract; a caller of
        // another struct version would make this reference too long before `version` is
        // checked below).
        let p = unsafe { pci.as_mut() }.ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        if p.version != std::mem::size_of::<NvmlPciInfoExt>() as c_uint | (1 << 24) {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        p.domain = d.pci_domain;
        p.bus = d.pci_bus;
        p.device = d.pci_device;
        p.pci_device_id = PCI_DEVICE_ID;
        p.pci_sub_system_id = PCI_SUBSYSTEM_ID;
        p.base_class = 3; // display controller
        p.sub_class = 2; // 3D controller
        p.bus_id = fill_c(&bus_id(d));
        Ok(())
    }
}

nvml! {
    fn nvmlDeviceGetPlatformInfo(device: NvmlDevice, _info: *mut c_void) {
        dev(device)?;
        Err(NVML_ERROR_NOT_SUPPORTED)
    }
}

nvml! {
    /// Confidential computing is off (`nvmlConfComputeSystemState_t`: environment, feature, dev tools).
    fn nvmlSystemGetConfComputeState(state_out: *mut [c_uint; 3]) {
        state()?;
        out(state_out, [0; 3])
    }
}

nvml! {
    /// `nvmlSystemConfComputeSettings_t`: version, then environment, feature, dev tools, multi-GPU
    /// mode — all off.
    fn nvmlSystemGetConfComputeSettings(settings: *mut [c_uint; 5]) {
        state()?;
        // SAFETY: `settings` is NULL or a writable nvmlSystemConfComputeSettings_t (NVML's
        // contract).
        let s = unsafe { settings.as_mut() }.ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        s[1..].fill(0);
        Ok(())
    }
}

nvml! {
    /// One GPU, no NVLink, no fabric: PyTorch's c10 loads these (and asserts they exist) on its
    /// out-of-memory path; they answer as a PCIe-only node does.
    fn nvmlDeviceGetP2PStatus(device1: NvmlDevice, device2: NvmlDevice, _index: c_uint, status: *mut c_uint) {
        dev(device1)?;
        dev(device2)?;
        out(status, 5) // NVML_P2P_STATUS_NOT_SUPPORTED
    }
}

nvml! {
    fn nvmlDeviceGetNvLinkRemoteDeviceType(device: NvmlDevice, _link: c_uint, _kind: *mut c_uint) {
        dev(device)?;
        Err(NVML_ERROR_NOT_SUPPORTED)
    }
}

nvml! {
    fn nvmlDeviceGetNvLinkRemotePciInfo_v2(device: NvmlDevice, _link: c_uint, _pci: *mut c_void) {
        dev(device)?;
        Err(NVML_ERROR_NOT_SUPPORTED)
    }
}

nvml! {
    fn nvmlDeviceGetGpuFabricInfoV(device: NvmlDevice, _info: *mut c_void) {
        dev(device)?;
        Err(NVML_ERROR_NOT_SUPPORTED)
    }
}

nvml! {
    fn nvmlDeviceGetTemperature(device: NvmlDevice, sensor: c_uint, temp: *mut c_uint) {
        dev(device)?;
        if sensor != NVML_TEMPERATURE_GPU {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        out(temp, TEMPERATURE_C)
    }
}

nvml! {
    /// Milliwatts: 55 W idle to 400 W at full utilisation.
    fn nvmlDeviceGetPowerUsage(device: NvmlDevice, power: *mut c_uint) {
        let (s, d) = dev(device)?;
        let u = gpu_utilisation(s, d);
        out(
            power,
            (IDLE_POWER_MW + u * (MAX_POWER_MW - IDLE_POWER_MW)) as c_uint,
        )
    }
}

/// `nvmlClockType_t`: graphics, SM, memory, video; MHz.
fn clock_mhz(kind: c_uint) -> Result<c_uint, NvmlReturn> {
    match kind {
        0 | 1 => Ok(1410),
        2 => Ok(1215),
        3 => Ok(1290),
        _ => Err(NVML_ERROR_INVALID_ARGUMENT),
    }
}

nvml! {
    /// The current clock of one domain (MHz); the simulated GPU always runs at its maximum clocks.
    fn nvmlDeviceGetClockInfo(device: NvmlDevice, kind: c_uint, clock: *mut c_uint) {
        dev(device)?;
        out(clock, clock_mhz(kind)?)
    }
}

nvml! {
    /// The maximum clock of one domain (MHz).
    fn nvmlDeviceGetMaxClockInfo(device: NvmlDevice, kind: c_uint, clock: *mut c_uint) {
        dev(device)?;
        out(clock, clock_mhz(kind)?)
    }
}

// ---------------------------------------------------------------------------------------------
// Exports: memory and utilisation

nvml! {
    fn nvmlDeviceGetMemoryInfo(device: NvmlDevice, memory_out: *mut NvmlMemory) {
        let (s, d) = dev(device)?;
        if memory_out.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let (total, used) = memory(s, d);
        out(
            memory_out,
            NvmlMemory {
                total,
                free: total - used,
                used,
            },
        )
    }
}

nvml! {
    /// Requires `version == nvmlMemory_v2` (else NVML_ERROR_ARGUMENT_VERSION_MISMATCH); reserved is 0.
    fn nvmlDeviceGetMemoryInfo_v2(device: NvmlDevice, memory_out: *mut NvmlMemoryV2) {
        let (s, d) = dev(device)?;
        if memory_out.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: not NULL; the caller set the version field.
        let version = unsafe { std::ptr::addr_of!((*memory_out).version).read_unaligned() };
        if version != NVML_MEMORY_V2 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let (total, used) = memory(s, d);
        out(
            memory_out,
            NvmlMemoryV2 {
                version,
                total,
                reserved: 0,
                free: total - used,
                used,
            },
        )
    }
}

nvml! {
    fn nvmlDeviceGetUtilizationRates(device: NvmlDevice, utilization: *mut NvmlUtilization) {
        let (s, d) = dev(device)?;
        out(
            utilization,
            NvmlUtilization {
                gpu: to_percent(gpu_utilisation(s, d)),
                memory: 0,
            },
        )
    }
}

// ---------------------------------------------------------------------------------------------
// Exports: processes

/// # Safety
///
/// As for [`out_list`]: `count` and `infos` under NVML's list contract.
unsafe fn compute_processes<T: Copy>(
    device: NvmlDevice,
    count: *mut c_uint,
    infos: *mut T,
    make: impl Fn(u32, u64) -> T,
) -> R {
    let (s, d) = dev(device)?;
    let list: Vec<T> = running_processes(&s.shared, d.index)
        .into_iter()
        .map(|(_, pid, mem)| make(pid, mem))
        .collect();
    // SAFETY: `count` and `infos` under this fn's contract, which is out_list's.
    unsafe { out_list(&list, count, infos) }
}

fn info_v2(pid: u32, used_gpu_memory: u64) -> NvmlProcessInfoV2 {
    NvmlProcessInfoV2 {
        pid,
        used_gpu_memory,
        gpu_instance_id: NVML_INSTANCE_ID_NONE,
        compute_instance_id: NVML_INSTANCE_ID_NONE,
    }
}

fn info_v1(pid: u32, used_gpu_memory: u64) -> NvmlProcessInfoV1 {
    NvmlProcessInfoV1 {
        pid,
        used_gpu_memory,
    }
}

nvml! {
    fn nvmlDeviceGetComputeRunningProcesses(device: NvmlDevice, count: *mut c_uint, infos: *mut NvmlProcessInfoV1) {
        compute_processes(device, count, infos, info_v1)
    }
}

nvml! {
    fn nvmlDeviceGetComputeRunningProcesses_v2(device: NvmlDevice, count: *mut c_uint, infos: *mut NvmlProcessInfoV2) {
        compute_processes(device, count, infos, info_v2)
    }
}

nvml! {
    fn nvmlDeviceGetComputeRunningProcesses_v3(device: NvmlDevice, count: *mut c_uint, infos: *mut NvmlProcessInfoV2) {
        compute_processes(device, count, infos, info_v2)
    }
}

/// No graphics (or MPS) processes run on the simulated GPU.
///
/// # Safety
///
/// As for [`out_list`]: `count` and `infos` under NVML's list contract.
unsafe fn no_processes<T: Copy>(device: NvmlDevice, count: *mut c_uint, infos: *mut T) -> R {
    dev(device)?;
    // SAFETY: `count` and `infos` under this fn's contract, which is out_list's.
    unsafe { out_list::<T>(&[], count, infos) }
}

nvml! {
    fn nvmlDeviceGetGraphicsRunningProcesses(device: NvmlDevice, count: *mut c_uint, infos: *mut NvmlProcessInfoV1) {
        no_processes(device, count, infos)
    }
}

nvml! {
    fn nvmlDeviceGetGraphicsRunningProcesses_v2(device: NvmlDevice, count: *mut c_uint, infos: *mut NvmlProcessInfoV2) {
        no_processes(device, count, infos)
    }
}

nvml! {
    fn nvmlDeviceGetGraphicsRunningProcesses_v3(device: NvmlDevice, count: *mut c_uint, infos: *mut NvmlProcessInfoV2) {
        no_processes(device, count, infos)
    }
}

nvml! {
    fn nvmlDeviceGetMPSComputeRunningProcesses_v3(device: NvmlDevice, count: *mut c_uint, infos: *mut NvmlProcessInfoV2) {
        no_processes(device, count, infos)
    }
}

nvml! {
    /// One sample per process using the device (see the module doc). With `utilization` NULL,
    /// `*count` returns the number of samples and the result is INSUFFICIENT_SIZE; with no samples
    /// (no processes, or `last_seen` not in the past) it is NOT_FOUND.
    fn nvmlDeviceGetProcessUtilization(device: NvmlDevice, utilization: *mut NvmlProcessUtilizationSample, count: *mut c_uint, last_seen: c_ulonglong) {
        let (s, d) = dev(device)?;
        if count.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let stamp = wall_us();
        let samples = if stamp > last_seen {
            process_samples(&s.shared, d.index, now_ns(), stamp)
        } else {
            Vec::new()
        };
        if samples.is_empty() {
            // SAFETY: count is not NULL.
            unsafe { *count = 0 };
            return Err(NVML_ERROR_NOT_FOUND);
        }
        if utilization.is_null() {
            // SAFETY: as above.
            unsafe { *count = samples.len() as c_uint };
            return Err(NVML_ERROR_INSUFFICIENT_SIZE);
        }
        out_list(&samples, count, utilization)
    }
}

// ---------------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------------
// Exports: per-cgroup memory limits (r615+; `crate::cglimits`)

/// An older driver's libnvidia-ml has no such function; one library serves every configured
/// version here, so it answers as NVML does for a function it does not implement.
fn limits_driver() -> Result<&'static Nvml, NvmlReturn> {
    let s = state()?;
    if driver_branch(s.cfg.driver_version) < MEMORY_LIMITS_BRANCH {
        return Err(NVML_ERROR_FUNCTION_NOT_FOUND);
    }
    Ok(s)
}

/// The checks both calls make: a driver that has them, a device, a cgroup directory.
fn limits_target(
    device: NvmlDevice,
    ns: &str,
) -> Result<(&'static Nvml, &'static Device), NvmlReturn> {
    let s = limits_driver()?;
    let d = s.device(device)?;
    let p = std::path::Path::new(ns);
    if !p.is_absolute() || !p.starts_with("/sys/fs/cgroup") || ns.len() > crate::cglimits::MAX_PATH
    {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    if !p.is_dir() {
        return Err(NVML_ERROR_NOT_FOUND);
    }
    Ok((s, d))
}

nvml! {
    /// Sets a cgroup's soft (guaranteed) and hard (maximum) memory limits on a device; root
    /// only. Soft 0 and hard NVML_DEVICE_MEMORY_LIMIT_MAX clear them.
    fn nvmlDeviceSetMemoryLimits_v1(device: NvmlDevice, limits: *mut NvmlSetMemoryLimitsV1) {
        limits_driver()?;
        if limits.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: not NULL; the caller's struct, read once.
        let l = unsafe { limits.read_unaligned() };
        let ns = in_str(l.name_space)?;
        let (s, d) = limits_target(device, &ns)?;
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Err(NVML_ERROR_NO_PERMISSION);
        }
        if l.soft_limit > l.hard_limit {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let t = crate::cglimits::table(&s.cfg.state_dir, true).ok_or(NVML_ERROR_UNKNOWN)?;
        if !t.set(&ns, d.index, l.soft_limit, l.hard_limit) {
            return Err(NVML_ERROR_INSUFFICIENT_SIZE);
        }
        Ok(())
    }
}

nvml! {
    /// A cgroup's limits on a device and what its processes hold there now.
    fn nvmlDeviceGetMemoryLimits_v1(device: NvmlDevice, limits: *mut NvmlGetMemoryLimitsV1) {
        limits_driver()?;
        if limits.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: not NULL; the caller's struct.
        let mut l = unsafe { limits.read_unaligned() };
        let ns = in_str(l.name_space)?;
        let (s, d) = limits_target(device, &ns)?;
        s.shared.reclaim_dead();
        (l.soft_limit, l.hard_limit) = crate::cglimits::table(&s.cfg.state_dir, false)
            .map_or((0, NVML_DEVICE_MEMORY_LIMIT_MAX), |t| t.get(&ns, d.index));
        l.current_used = crate::cglimits::used_in(&s.shared, &ns, d.index);
        out(limits, l)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::BUCKET_NS;
    use std::ptr::{null, null_mut};

    #[test]
    fn uuid_and_bus_ids() {
        let d = DeviceConfig::a100(0);
        assert_eq!(
            format_uuid(&d.uuid),
            "GPU-73696d67-7075-2d64-6576-6963652d0000"
        );
        assert_eq!(bus_id(&d), "00000000:10:00.0");
        assert_eq!(bus_id_legacy(&d), "0000:10:00.0");
        let mut d = DeviceConfig::a100(3);
        d.pci_domain = 0xab;
        d.pci_device = 0x1f;
        assert_eq!(bus_id(&d), "000000AB:13:1F.0");
        assert_eq!(bus_id_legacy(&d), "00AB:13:1F.0");
        let legacy: [c_char; 16] = fill_c(&bus_id_legacy(&d));
        assert_eq!(legacy[12], 0);
    }

    #[test]
    fn bus_id_formats_accepted() {
        assert_eq!(parse_bus_id("00000000:10:00.0"), Some((0, 0x10, 0, 0)));
        assert_eq!(parse_bus_id("0000:10:00.0"), Some((0, 0x10, 0, 0)));
        assert_eq!(parse_bus_id("0:1a:1f"), Some((0, 0x1a, 0x1f, 0)));
        assert_eq!(parse_bus_id("10:00.1"), Some((0, 0x10, 0, 1)));
        assert_eq!(
            parse_bus_id("000000AB:13:1F.0"),
            Some((0xab, 0x13, 0x1f, 0))
        );
        for bad in [
            "",
            "10",
            "10:00",
            "x:10:00.0",
            "0:0:0:0",
            "0:10:.0",
            "123456789:0:0.0",
        ] {
            assert_eq!(parse_bus_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn version_strings() {
        assert_eq!(driver_version_string(13000), "580.00");
        assert_eq!(driver_version_string(13050), "605.00");
        assert_eq!(driver_version_string(12020), "535.00");
        assert_eq!(driver_version_string(12090), "575.00");
    }

    /// `out_list` on a test's own locals.
    fn list(items: &[NvmlProcessInfoV1], count: *mut c_uint, out: *mut NvmlProcessInfoV1) -> R {
        // SAFETY: the tests pass NULL or pointers to their live locals; `out` has room for the
        // `*count` entries passed in.
        unsafe { out_list(items, count, out) }
    }

    /// `out_str` on a test's own buffer.
    fn string(buf: *mut c_char, len: c_uint, s: &str) -> R {
        // SAFETY: the tests pass NULL or their live buffer of at least `len` bytes.
        unsafe { out_str(buf, len, s) }
    }

    #[test]
    fn list_size_protocol() {
        let items = [info_v1(1, 10), info_v1(2, 20)];
        let mut count = 0;
        assert_eq!(
            list(&items, &mut count, null_mut()),
            Err(NVML_ERROR_INSUFFICIENT_SIZE)
        );
        assert_eq!(count, 2);
        let mut buf = [NvmlProcessInfoV1::default(); 1];
        count = 1;
        assert_eq!(
            list(&items, &mut count, buf.as_mut_ptr()),
            Err(NVML_ERROR_INSUFFICIENT_SIZE)
        );
        assert_eq!(count, 2);
        let mut buf = [NvmlProcessInfoV1::default(); 5];
        count = 5;
        assert_eq!(list(&items, &mut count, buf.as_mut_ptr()), Ok(()));
        assert_eq!((count, &buf[..2]), (2, &items[..]));
        count = 5;
        assert_eq!(
            list(&items, &mut count, null_mut()),
            Err(NVML_ERROR_INVALID_ARGUMENT)
        );
        count = 0;
        assert_eq!(list(&[], &mut count, null_mut()), Ok(()));
        assert_eq!(count, 0);
        assert_eq!(
            list(&items, null_mut(), buf.as_mut_ptr()),
            Err(NVML_ERROR_INVALID_ARGUMENT)
        );
    }

    #[test]
    fn strings_need_room_for_the_nul() {
        let mut buf = [1 as c_char; 8];
        assert_eq!(
            string(buf.as_mut_ptr(), 4, "abcd"),
            Err(NVML_ERROR_INSUFFICIENT_SIZE)
        );
        assert_eq!(string(buf.as_mut_ptr(), 5, "abcd"), Ok(()));
        assert_eq!(buf[..6], [97, 98, 99, 100, 0, 1]);
        assert_eq!(
            string(null_mut(), 5, "abcd"),
            Err(NVML_ERROR_INVALID_ARGUMENT)
        );
    }

    /// A child process that lives until dropped: a second live pid for the process tables.
    struct Child(std::process::Child);

    impl Drop for Child {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn processes_and_samples_from_shared_state() {
        let dir = tempfile::tempdir().unwrap();
        let sh = Shared::open(dir.path(), &[1 << 30, 1 << 30]).unwrap();
        let child = Child(
            std::process::Command::new("sleep")
                .arg("30")
                .spawn()
                .unwrap(),
        );
        let me = std::process::id();
        let (a, _) = sh.register(me).unwrap();
        let (b, _) = sh.register(child.0.id()).unwrap();
        let (idle, _) = sh.register(child.0.id()).unwrap(); // a slot with nothing on any device
        let dead = (0..crate::shared::MAX_PROCS)
            .find(|i| ![a, b, idle].contains(i))
            .unwrap();
        sh.id(dead).pid.store(u32::MAX - 7, Release); // no such process
        sh.slot(dead).dev[0].mem_used.store(1 << 20, Release);

        sh.slot(a).dev[0].mem_used.store(64 << 20, Release);
        sh.slot(b).dev[0].kernels.store(3, Release); // kernels only, no memory
        sh.slot(b).dev[1].mem_used.store(4096, Release);
        let now = 1000 * BUCKET_NS;
        sh.slot(a).dev[0]
            .window
            .add(now - 500_000_000, now - 250_000_000); // 25 %
        sh.slot(b).dev[0].window.add(now - 100_000_000, now); // 10 %

        let p0 = running_processes(&sh, 0);
        assert_eq!(p0, vec![(a, me, 64 << 20), (b, child.0.id(), 0)]);
        let p1 = running_processes(&sh, 1);
        assert_eq!(p1, vec![(b, child.0.id(), 4096)]);

        let s0 = process_samples(&sh, 0, now, 77);
        assert_eq!(s0.len(), 2);
        assert_eq!((s0[0].pid, s0[0].time_stamp, s0[0].sm_util), (me, 77, 25));
        assert_eq!((s0[1].pid, s0[1].sm_util), (child.0.id(), 10));
        assert_eq!(process_samples(&sh, 1, now, 77)[0].sm_util, 0);

        // Once the child is gone it is no longer listed.
        drop(child);
        assert_eq!(running_processes(&sh, 0), vec![(a, me, 64 << 20)]);
        assert!(running_processes(&sh, 1).is_empty());
    }

    /// The exports end to end on a temporary machine (the only test that initialises NVML:
    /// the state is per process).
    #[test]
    fn exports_end_to_end() {
        // SAFETY: every pointer passed below is to a live local of the type NVML documents (or a
        // deliberate NULL, which the exports reject).
        unsafe {
            let mut count = 0;
            assert_eq!(nvmlDeviceGetCount_v2(&mut count), NVML_ERROR_UNINITIALIZED);
            assert_eq!(nvmlShutdown(), NVML_ERROR_UNINITIALIZED);

            let dir = tempfile::tempdir().unwrap();
            let mut cfg = SimConfig {
                state_dir: dir.path().to_path_buf(),
                devices: vec![DeviceConfig::a100(0), DeviceConfig::a100(1)],
                ..SimConfig::default()
            };
            cfg.devices[1].memory = 8 << 30;
            assert_eq!(init_with(|| Ok(cfg)), NVML_SUCCESS);
            assert_eq!(nvmlInit_v2(), NVML_SUCCESS); // refcounted; config already loaded

            assert_eq!(
                nvmlDeviceGetCount_v2(null_mut()),
                NVML_ERROR_INVALID_ARGUMENT
            );
            assert_eq!(nvmlDeviceGetCount(&mut count), NVML_SUCCESS);
            assert_eq!(count, 2);
            let mut h = null_mut();
            assert_eq!(
                nvmlDeviceGetHandleByIndex_v2(2, &mut h),
                NVML_ERROR_INVALID_ARGUMENT
            );
            assert_eq!(nvmlDeviceGetHandleByIndex_v2(1, &mut h), NVML_SUCCESS);
            let mut index = 9;
            assert_eq!(nvmlDeviceGetIndex(h, &mut index), NVML_SUCCESS);
            assert_eq!(index, 1);
            let mut x = 0u8;
            let bogus = &mut x as *mut u8 as NvmlDevice;
            assert_eq!(
                nvmlDeviceGetIndex(bogus, &mut index),
                NVML_ERROR_INVALID_ARGUMENT
            );
            assert_eq!(
                nvmlDeviceGetIndex(null_mut(), &mut index),
                NVML_ERROR_INVALID_ARGUMENT
            );

            let mut buf = [0 as c_char; 96];
            assert_eq!(nvmlDeviceGetUUID(h, buf.as_mut_ptr(), 96), NVML_SUCCESS);
            let uuid = CStr::from_ptr(buf.as_ptr()).to_owned();
            assert_eq!(
                uuid.to_str().unwrap(),
                format_uuid(&DeviceConfig::a100(1).uuid)
            );
            assert_eq!(
                nvmlDeviceGetUUID(h, buf.as_mut_ptr(), 40),
                NVML_ERROR_INSUFFICIENT_SIZE
            );
            let mut h2 = null_mut();
            assert_eq!(
                nvmlDeviceGetHandleByUUID(uuid.as_ptr(), &mut h2),
                NVML_SUCCESS
            );
            assert_eq!(h2, h);
            assert_eq!(
                nvmlDeviceGetHandleByUUID(
                    c"GPU-00000000-0000-0000-0000-000000000000".as_ptr(),
                    &mut h2
                ),
                NVML_ERROR_NOT_FOUND
            );
            assert_eq!(
                nvmlDeviceGetHandleByUUID(null(), &mut h2),
                NVML_ERROR_INVALID_ARGUMENT
            );
            h2 = null_mut();
            assert_eq!(
                nvmlDeviceGetHandleByPciBusId_v2(c"0000:11:00.0".as_ptr(), &mut h2),
                NVML_SUCCESS
            );
            assert_eq!(h2, h);
            assert_eq!(
                nvmlDeviceGetHandleByPciBusId_v2(c"0000:42:00.0".as_ptr(), &mut h2),
                NVML_ERROR_NOT_FOUND
            );

            let mut pci: NvmlPciInfo = std::mem::zeroed();
            assert_eq!(nvmlDeviceGetPciInfo_v3(h, &mut pci), NVML_SUCCESS);
            assert_eq!(
                CStr::from_ptr(pci.bus_id.as_ptr()).to_str().unwrap(),
                "00000000:11:00.0"
            );
            assert_eq!(
                CStr::from_ptr(pci.bus_id_legacy.as_ptr()).to_str().unwrap(),
                "0000:11:00.0"
            );
            assert_eq!((pci.domain, pci.bus, pci.device), (0, 0x11, 0));
            let mut old: NvmlPciInfoV2 = std::mem::zeroed();
            old.reserved = [7; 4];
            assert_eq!(nvmlDeviceGetPciInfo(h, &mut old), NVML_SUCCESS);
            assert_eq!(
                (old.bus, old.pci_device_id, old.reserved),
                (0x11, PCI_DEVICE_ID, [7; 4])
            );

            let mut mem = NvmlMemory::default();
            assert_eq!(nvmlDeviceGetMemoryInfo(h, &mut mem), NVML_SUCCESS);
            assert_eq!(
                mem,
                NvmlMemory {
                    total: 8 << 30,
                    free: 8 << 30,
                    used: 0
                }
            );
            let mut mem2 = NvmlMemoryV2::default();
            assert_eq!(
                nvmlDeviceGetMemoryInfo_v2(h, &mut mem2),
                NVML_ERROR_ARGUMENT_VERSION_MISMATCH
            );
            mem2.version = NVML_MEMORY_V2;
            mem2.reserved = 5;
            assert_eq!(nvmlDeviceGetMemoryInfo_v2(h, &mut mem2), NVML_SUCCESS);
            assert_eq!((mem2.total, mem2.reserved, mem2.used), (8 << 30, 0, 0));

            let mut util = NvmlUtilization { gpu: 9, memory: 9 };
            assert_eq!(nvmlDeviceGetUtilizationRates(h, &mut util), NVML_SUCCESS);
            assert_eq!(util, NvmlUtilization::default());

            let mut n = 0;
            assert_eq!(
                nvmlDeviceGetComputeRunningProcesses_v3(h, &mut n, null_mut()),
                NVML_SUCCESS
            );
            assert_eq!(n, 0);
            assert_eq!(
                nvmlDeviceGetProcessUtilization(h, null_mut(), &mut n, 0),
                NVML_ERROR_NOT_FOUND
            );

            // A process using device 1 shows up in the lists and the memory total.
            let st = state().unwrap();
            let (slot, _) = st.shared.register(std::process::id()).unwrap();
            let pd = &st.shared.slot(slot).dev[1];
            pd.mem_used.store(64 << 20, Release);
            st.shared.dev(1).mem_used.store(64 << 20, Release);
            let t = now_ns();
            pd.window.add(t - 300_000_000, t);
            st.shared.dev(1).window.add(t - 300_000_000, t);
            assert_eq!(nvmlDeviceGetMemoryInfo(h, &mut mem), NVML_SUCCESS);
            assert_eq!((mem.used, mem.free), (64 << 20, (8 << 30) - (64 << 20)));
            assert_eq!(nvmlDeviceGetUtilizationRates(h, &mut util), NVML_SUCCESS);
            assert!((25..=35).contains(&util.gpu), "{util:?}");

            n = 0;
            assert_eq!(
                nvmlDeviceGetComputeRunningProcesses_v3(h, &mut n, null_mut()),
                NVML_ERROR_INSUFFICIENT_SIZE
            );
            assert_eq!(n, 1);
            let mut procs = [NvmlProcessInfoV2::default(); 4];
            n = 4;
            assert_eq!(
                nvmlDeviceGetComputeRunningProcesses_v2(h, &mut n, procs.as_mut_ptr()),
                NVML_SUCCESS
            );
            assert_eq!((n, procs[0]), (1, info_v2(std::process::id(), 64 << 20)));
            let mut procs1 = [NvmlProcessInfoV1::default(); 1];
            assert_eq!(
                nvmlDeviceGetComputeRunningProcesses(h, &mut n, procs1.as_mut_ptr()),
                NVML_SUCCESS
            );
            assert_eq!(procs1[0], info_v1(std::process::id(), 64 << 20));
            n = 4;
            assert_eq!(
                nvmlDeviceGetGraphicsRunningProcesses_v3(h, &mut n, procs.as_mut_ptr()),
                NVML_SUCCESS
            );
            assert_eq!(n, 0);

            n = 0;
            assert_eq!(
                nvmlDeviceGetProcessUtilization(h, null_mut(), &mut n, 0),
                NVML_ERROR_INSUFFICIENT_SIZE
            );
            assert_eq!(n, 1);
            let mut samples = [NvmlProcessUtilizationSample::default(); 1];
            assert_eq!(
                nvmlDeviceGetProcessUtilization(h, samples.as_mut_ptr(), &mut n, 0),
                NVML_SUCCESS
            );
            assert_eq!(samples[0].pid, std::process::id());
            assert!((25..=35).contains(&samples[0].sm_util), "{:?}", samples[0]);
            assert!(samples[0].time_stamp > 0);
            assert_eq!(
                nvmlDeviceGetProcessUtilization(h, samples.as_mut_ptr(), &mut n, u64::MAX),
                NVML_ERROR_NOT_FOUND
            );
            st.shared.release_slot(slot, std::process::id());

            let (mut major, mut minor) = (0, 0);
            assert_eq!(
                nvmlDeviceGetCudaComputeCapability(h, &mut major, &mut minor),
                NVML_SUCCESS
            );
            assert_eq!((major, minor), (8, 0));
            let mut v = 0;
            assert_eq!(nvmlSystemGetCudaDriverVersion_v2(&mut v), NVML_SUCCESS);
            assert_eq!(v, SimConfig::default().driver_version);
            assert_eq!(
                nvmlSystemGetDriverVersion(buf.as_mut_ptr(), 80),
                NVML_SUCCESS
            );
            let mut temp = 0;
            assert_eq!(nvmlDeviceGetTemperature(h, 0, &mut temp), NVML_SUCCESS);
            assert_eq!(
                nvmlDeviceGetTemperature(h, 1, &mut temp),
                NVML_ERROR_INVALID_ARGUMENT
            );
            let mut mhz = 0;
            assert_eq!(nvmlDeviceGetClockInfo(h, 1, &mut mhz), NVML_SUCCESS);
            assert_eq!(mhz, 1410);
            assert_eq!(nvmlDeviceGetMaxClockInfo(h, 2, &mut mhz), NVML_SUCCESS);
            assert_eq!(mhz, 1215);
            assert_eq!(
                nvmlDeviceGetClockInfo(h, 4, &mut mhz),
                NVML_ERROR_INVALID_ARGUMENT
            );
            assert_eq!(
                CStr::from_ptr(nvmlErrorString(7)).to_str().unwrap(),
                "Insufficient Size"
            );

            assert_eq!(nvmlShutdown(), NVML_SUCCESS);
            assert_eq!(nvmlDeviceGetCount(&mut count), NVML_SUCCESS); // one init still open
            assert_eq!(nvmlShutdown(), NVML_SUCCESS);
            assert_eq!(nvmlDeviceGetCount(&mut count), NVML_ERROR_UNINITIALIZED);
            assert_eq!(
                nvmlDeviceGetMemoryInfo(h, &mut mem),
                NVML_ERROR_UNINITIALIZED
            );
            assert_eq!(nvmlShutdown(), NVML_ERROR_UNINITIALIZED);
        }
    }
}
