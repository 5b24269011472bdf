//! simgpu configuration: a TOML file (`SIMGPU_CONFIG=path`) overridden by `SIMGPU_*` variables.
//! The full list of keys and variables is documented in `simgpu/README.md` § Configuration.
//!
//! Every error is one line that names the variable (or `file:key`) and says what is accepted, e.g.
//! `simgpu: invalid SIMGPU_MEMORY="banana": expected a size like 40GiB or 512MiB ...`.

use std::collections::HashMap;

pub use libshare_abi::units::{parse_duration_ns, parse_size};
use libshare_abi::units::{NS_PER_S, TIB};
use std::fmt;
use std::path::{Path, PathBuf};

mod env;
mod file;
use env::*;
use file::*;

/// One simulated device.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceConfig {
    pub name: String,
    /// Device memory in bytes.
    pub memory: u64,
    pub sm_count: u32,
    /// (major, minor)
    pub compute_capability: (u32, u32),
    /// 16 bytes, stable per device index unless configured.
    pub uuid: [u8; 16],
    pub pci_domain: u32,
    pub pci_bus: u32,
    pub pci_device: u32,
}

/// How long modelled operations take. See `simgpu/README.md` § Cost model.
#[derive(Clone, Debug, PartialEq)]
pub struct CostModel {
    /// Fixed cost of every kernel, ns.
    pub kernel_base_ns: u64,
    /// Cost of one wave of thread blocks, ns (a wave = SMs × resident blocks per SM).
    pub wave_ns: u64,
    /// Per-kernel-name overrides of the whole duration, ns (exact mangled name or substring).
    pub kernel_overrides: Vec<(String, u64)>,
    /// Host<->device copy bandwidth, bytes per second (each direction has its own engine).
    pub pcie_bytes_per_s: u64,
    /// Device-memory bandwidth (device-to-device copies, memsets), bytes per second.
    pub hbm_bytes_per_s: u64,
    /// Fixed cost of every copy / memset, ns.
    pub copy_base_ns: u64,
    /// Cost of servicing one batch of managed-memory page faults (one per 2 MiB chunk migrated
    /// on demand), on top of its transfer, ns.
    pub fault_ns: u64,
    /// Throughput of fault-driven migration, bytes per second (below `pcie_bytes_per_s`, which a
    /// prefetch on the copy engine gets).
    pub fault_bytes_per_s: u64,
    /// Throughput of `cuMemPrefetchAsync`'s migration, bytes per second; None: `pcie_bytes_per_s`
    /// (a GPU's driver may migrate slower than `cuMemcpy` copies: `sharectl gpu-check` measures it).
    pub prefetch_bytes_per_s: Option<u64>,
    /// Time slice of a context on the compute engine while another context waits, ns; it
    /// includes the context switch into it (`crate::sched`).
    pub timeslice_ns: u64,
    /// Cost of switching the compute engine to another context, ns (less than the time slice).
    pub ctx_switch_ns: u64,
}

/// Fault injection (reliability tests).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Faults {
    /// Fail the Nth device allocation of this process (1-based) with CUDA_ERROR_OUT_OF_MEMORY.
    pub fail_alloc_nth: Option<u64>,
    /// Return this CUresult from the Nth kernel launch of this process (1-based).
    pub launch_error: Option<(u64, u32)>,
    /// Stall any stream forever once it has executed this many operations.
    pub stall_stream_after: Option<u64>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    pub devices: Vec<DeviceConfig>,
    /// What cuDriverGetVersion reports (e.g. 13050).
    pub driver_version: i32,
    pub cost: CostModel,
    pub faults: Faults,
    /// Directory of the shared state files (one simulated machine per directory).
    pub state_dir: std::path::PathBuf,
    /// Log level: 0 off, 1 warnings (stub calls), 2 debug (every call).
    pub log_level: u8,
}

/// A configuration error: one line that names the variable or key and says what is accepted.
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// Most devices a simulated machine can have.
pub const MAX_DEVICES: usize = 16;

const MAX_DURATION_NS: u64 = 3600 * NS_PER_S;

impl SimConfig {
    /// Loads the configuration from the process environment.
    pub fn from_env() -> Result<SimConfig, ConfigError> {
        let mut vars = HashMap::new();
        for (key, value) in std::env::vars_os() {
            let shown_key = key.to_string_lossy();
            if !shown_key.starts_with("SIMGPU_") {
                continue;
            }
            match (key.to_str(), value.to_str()) {
                (Some(k), Some(v)) => {
                    vars.insert(k.to_owned(), v.to_owned());
                }
                _ => {
                    let shown = format!("{:?}", value.to_string_lossy());
                    return Err(invalid(&shown_key, &shown, "expected UTF-8 text"));
                }
            }
        }
        Self::from_vars(&vars)
    }

    /// Loads from an explicit variable map (tests): the file named by `SIMGPU_CONFIG` first,
    /// then the other `SIMGPU_*` variables on top. Empty values count as unset.
    pub fn from_vars(vars: &HashMap<String, String>) -> Result<SimConfig, ConfigError> {
        check_unknown_vars(vars)?;
        let mut cfg = SimConfig::default();
        if let Some(path) = var(vars, "SIMGPU_CONFIG") {
            load_file(&mut cfg, path)?;
        }
        apply_env(&mut cfg, vars)?;
        let c = &cfg.cost;
        if c.timeslice_ns == 0 || c.ctx_switch_ns >= c.timeslice_ns {
            return Err(ConfigError(format!(
                "simgpu: invalid time slice {} ns with context switch {} ns: the time slice \
                 (SIMGPU_TIMESLICE, cost.timeslice) must be longer than the context switch \
                 (SIMGPU_CTX_SWITCH, cost.ctx_switch)",
                c.timeslice_ns, c.ctx_switch_ns
            )));
        }
        Ok(cfg)
    }

    /// The configured duration (ns) of a kernel: an override whose key equals `name` exactly,
    /// else the first override whose key is a substring of `name`.
    pub fn kernel_override(&self, name: &str) -> Option<u64> {
        let overrides = &self.cost.kernel_overrides;
        overrides
            .iter()
            .find(|(key, _)| key == name)
            .or_else(|| {
                overrides
                    .iter()
                    .find(|(key, _)| name.contains(key.as_str()))
            })
            .map(|(_, ns)| *ns)
    }
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            devices: vec![DeviceConfig::a100(0)],
            driver_version: 13050,
            cost: CostModel::default(),
            faults: Faults::default(),
            state_dir: default_state_dir(),
            log_level: 0,
        }
    }
}

impl DeviceConfig {
    /// An A100-SXM4-40GB-like device with a UUID and PCI address derived from its index.
    pub fn a100(index: u32) -> DeviceConfig {
        let mut uuid = *b"simgpu-device-\0\0";
        uuid[14] = (index >> 8) as u8;
        uuid[15] = index as u8;
        DeviceConfig {
            name: "Simulated A100-SXM4-40GB".into(),
            memory: 40 << 30,
            sm_count: 108,
            compute_capability: (8, 0),
            uuid,
            pci_domain: 0,
            pci_bus: 0x10 + index,
            pci_device: 0,
        }
    }
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            kernel_base_ns: 5_000,
            wave_ns: 10_000,
            kernel_overrides: Vec::new(),
            pcie_bytes_per_s: 25_000_000_000,
            hbm_bytes_per_s: 1_500_000_000_000,
            copy_base_ns: 2_000,
            fault_ns: 20_000,
            fault_bytes_per_s: 12_000_000_000,
            prefetch_bytes_per_s: None,
            timeslice_ns: 2_000_000,
            ctx_switch_ns: 25_000,
        }
    }
}

fn default_state_dir() -> std::path::PathBuf {
    // SAFETY: getuid takes no arguments, touches no memory and cannot fail.
    let uid = unsafe { libc::getuid() };
    std::path::PathBuf::from(format!("/dev/shm/simgpu-{uid}"))
}

// ---------------------------------------------------------------------------------------------
// Public parsers

/// Parses a bandwidth into bytes per second: a size (see [`parse_size`]) followed by `/s`,
/// e.g. `25GB/s`, `12GiB/s`.
pub fn parse_bandwidth(s: &str) -> Option<u64> {
    let size = s.trim().strip_suffix("/s")?;
    parse_size(size)
}

/// Parses an NVML-style UUID `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (hex digits).
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let hex = s.trim().strip_prefix("GPU-")?;
    let lengths: Vec<usize> = hex.split('-').map(str::len).collect();
    if lengths != [8, 4, 4, 4, 12] {
        return None;
    }
    let digits: String = hex.split('-').collect();
    if !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut uuid = [0u8; 16];
    for (i, byte) in uuid.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&digits[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(uuid)
}

/// Formats a UUID the way NVML prints it (one definition, shared with libshare).
pub use shim_headers::format_uuid;

// ---------------------------------------------------------------------------------------------
// Settings: how each value is parsed and what the error says is accepted.

/// A setting's parser and the text of its error (`expected ...`), shared by the file and env.
struct Setting<T> {
    parse: fn(&str) -> Option<T>,
    expected: &'static str,
}

const DEVICE_COUNT: Setting<usize> = Setting {
    parse: |s| s.parse().ok().filter(|n| (1..=MAX_DEVICES).contains(n)),
    expected: "expected a device count from 1 to 16",
};
const DEVICE_NAME: Setting<String> = Setting {
    parse: |s| Some(s.to_owned()).filter(|s| !s.is_empty() && s.len() <= 255 && !s.contains('\0')),
    expected: "expected a device name of 1 to 255 bytes",
};
const MEMORY: Setting<u64> = Setting {
    parse: |s| parse_size(s).filter(|n| (1..=TIB).contains(n)),
    expected: "expected a size like 40GiB or 512MiB (also 1.5GiB, 1073741824 bytes, \
               GB/MB = powers of 10), greater than 0 and at most 1TiB",
};
const SMS: Setting<u32> = Setting {
    parse: |s| s.parse().ok().filter(|n| (1..=1024).contains(n)),
    expected: "expected an SM count from 1 to 1024",
};
const COMPUTE_CAPABILITY: Setting<(u32, u32)> = Setting {
    parse: parse_compute_capability,
    expected: "expected a compute capability like 8.0 or 9.0 (major 1 to 20, minor 0 to 9)",
};
const UUID: Setting<[u8; 16]> = Setting {
    parse: parse_uuid,
    expected: "expected an NVML-style UUID like GPU-01234567-89ab-cdef-0123-456789abcdef",
};
const PCI_DOMAIN: Setting<u32> = Setting {
    parse: |s| s.parse().ok().filter(|n| *n <= 0xffff),
    expected: "expected a PCI domain from 0 to 65535",
};
const PCI_BUS: Setting<u32> = Setting {
    parse: |s| s.parse().ok().filter(|n| *n <= 255),
    expected: "expected a PCI bus number from 0 to 255",
};
const PCI_DEVICE: Setting<u32> = Setting {
    parse: |s| s.parse().ok().filter(|n| *n <= 31),
    expected: "expected a PCI device number from 0 to 31",
};
const DRIVER_VERSION: Setting<i32> = Setting {
    parse: |s| s.parse().ok().filter(|n| *n >= 12000),
    expected: "expected a driver version like 13050 (an integer, at least 12000)",
};
const STATE_DIR: Setting<PathBuf> = Setting {
    parse: |s| Some(PathBuf::from(s)).filter(|p| p.is_absolute()),
    expected: "expected an absolute directory path",
};
const LOG: Setting<u8> = Setting {
    parse: |s| match s.to_ascii_lowercase().as_str() {
        "off" | "0" => Some(0),
        "warn" | "1" => Some(1),
        "debug" | "2" => Some(2),
        _ => None,
    },
    expected: "expected off, warn or debug",
};
const DURATION: Setting<u64> = Setting {
    parse: |s| parse_duration_ns(s).filter(|ns| *ns <= MAX_DURATION_NS),
    expected: "expected a duration like 5us, 1ms, 1.5ms, 200ns or 2s (at most 1 hour)",
};
const BANDWIDTH: Setting<u64> = Setting {
    parse: |s| parse_bandwidth(s).filter(|bw| *bw > 0),
    expected: "expected a bandwidth like 25GB/s or 12GiB/s (greater than 0)",
};
const FAIL_ALLOC_NTH: Setting<u64> = Setting {
    parse: |s| s.parse().ok().filter(|n| *n >= 1),
    expected: "expected N, a positive integer (the Nth allocation fails)",
};
const LAUNCH_ERROR: Setting<(u64, u32)> = Setting {
    parse: parse_launch_error,
    expected: "expected N:code like 5:719 (the Nth launch returns CUresult code; both positive)",
};
const STALL_STREAM_AFTER: Setting<u64> = Setting {
    parse: |s| s.parse().ok(),
    expected: "expected a number of operations (an integer, 0 or more)",
};
const KERNEL_TIMES: Setting<Vec<(String, u64)>> = Setting {
    parse: parse_kernel_times,
    expected: "expected name=duration pairs like _Z6kernelPf=1ms,gemm=250us \
               (durations like 5us, 1ms, 2s; at most 1 hour)",
};

/// `8.0` → (8, 0); `9` → (9, 0).
fn parse_compute_capability(s: &str) -> Option<(u32, u32)> {
    let (major, minor) = s.split_once('.').unwrap_or((s, "0"));
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    if !digits(major) || !digits(minor) {
        return None;
    }
    let (major, minor): (u32, u32) = (major.parse().ok()?, minor.parse().ok()?);
    ((1..=20).contains(&major) && minor <= 9).then_some((major, minor))
}

/// `5:719` → (5, 719).
fn parse_launch_error(s: &str) -> Option<(u64, u32)> {
    let (nth, code) = s.split_once(':')?;
    let nth: u64 = nth.trim().parse().ok()?;
    let code: u32 = code.trim().parse().ok()?;
    (nth >= 1 && code >= 1).then_some((nth, code))
}

/// `name=1ms,other=250us` → [("name", 1_000_000), ("other", 250_000)].
fn parse_kernel_times(s: &str) -> Option<Vec<(String, u64)>> {
    let mut times = Vec::new();
    for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (name, duration) = entry.rsplit_once('=')?;
        let name = name.trim();
        if name.is_empty() {
            return None;
        }
        times.push((name.to_owned(), (DURATION.parse)(duration.trim())?));
    }
    Some(times)
}

/// Adds kernel overrides; a name already present gets the new duration (later sources win).
fn add_kernel_overrides(overrides: &mut Vec<(String, u64)>, new: Vec<(String, u64)>) {
    for (name, ns) in new {
        match overrides.iter_mut().find(|(key, _)| *key == name) {
            Some(existing) => existing.1 = ns,
            None => overrides.push((name, ns)),
        }
    }
}

/// `simgpu: invalid NAME=VALUE: EXPECTED`
fn invalid(name: &str, shown_value: &str, expected: &str) -> ConfigError {
    ConfigError(format!("simgpu: invalid {name}={shown_value}: {expected}"))
}

// ---------------------------------------------------------------------------------------------
// The table: one row per setting.

/// Puts the value a setting row reads into its place, or says what is accepted. `None`: the
/// file gave something that is not text or a number.
type Set<C> = fn(&mut C, Option<&str>) -> Result<(), &'static str>;

/// Parses `text` with `setting` into `to`.
fn put<T>(setting: &Setting<T>, text: Option<&str>, to: &mut T) -> Result<(), &'static str> {
    *to = text.and_then(setting.parse).ok_or(setting.expected)?;
    Ok(())
}

/// Parses `text` with `setting` into `to`, as set.
fn put_some<T>(
    setting: &Setting<T>,
    text: Option<&str>,
    to: &mut Option<T>,
) -> Result<(), &'static str> {
    *to = Some(text.and_then(setting.parse).ok_or(setting.expected)?);
    Ok(())
}

/// A variable read elsewhere (its row only makes it known).
fn read_elsewhere(_: &mut SimConfig, _: Option<&str>) -> Result<(), &'static str> {
    Ok(())
}

/// Every `SIMGPU_*` variable before the rows': the file, and the number of devices (which the
/// device rows' variables then apply to).
const CONFIG_VAR: &str = "SIMGPU_CONFIG";
const DEVICES_VAR: &str = "SIMGPU_DEVICES";
/// `SIMGPU_MEMORY` also takes a per-device list (`0:40GiB,1:16GiB`).
const MEMORY_VAR: &str = "SIMGPU_MEMORY";

/// A device's settings: its variable (applied to every device; None: file only), its key in a
/// `[[device]]` table, and where the value goes. Variables apply in this order.
const DEVICE_ROWS: &[(Option<&str>, &str, Set<DeviceConfig>)] = &[
    (Some("SIMGPU_DEVICE_NAME"), "name", |d, s| {
        put(&DEVICE_NAME, s, &mut d.name)
    }),
    (Some(MEMORY_VAR), "memory", |d, s| {
        put(&MEMORY, s, &mut d.memory)
    }),
    (Some("SIMGPU_SMS"), "sms", |d, s| {
        put(&SMS, s, &mut d.sm_count)
    }),
    (Some("SIMGPU_CC"), "compute_capability", |d, s| {
        put(&COMPUTE_CAPABILITY, s, &mut d.compute_capability)
    }),
    (None, "uuid", |d, s| put(&UUID, s, &mut d.uuid)),
    (None, "pci_domain", |d, s| {
        put(&PCI_DOMAIN, s, &mut d.pci_domain)
    }),
    (None, "pci_bus", |d, s| put(&PCI_BUS, s, &mut d.pci_bus)),
    (None, "pci_device", |d, s| {
        put(&PCI_DEVICE, s, &mut d.pci_device)
    }),
];

/// The machine's settings: its variable (None: file only), its key in the file (`table.key`;
/// None: variable only), and where the value goes. Variables apply in this order, after the
/// devices'; the file's `[cost.kernels]` table is `file.rs`'s.
const MACHINE_ROWS: &[(Option<&str>, Option<&str>, Set<SimConfig>)] = &[
    (
        Some("SIMGPU_DRIVER_VERSION"),
        Some("driver_version"),
        |c, s| put(&DRIVER_VERSION, s, &mut c.driver_version),
    ),
    (Some("SIMGPU_STATE_DIR"), Some("state_dir"), |c, s| {
        put(&STATE_DIR, s, &mut c.state_dir)
    }),
    (Some("SIMGPU_LOG"), Some("log"), |c, s| {
        put(&LOG, s, &mut c.log_level)
    }),
    (
        Some("SIMGPU_KERNEL_BASE"),
        Some("cost.kernel_base"),
        |c, s| put(&DURATION, s, &mut c.cost.kernel_base_ns),
    ),
    (Some("SIMGPU_WAVE"), Some("cost.wave"), |c, s| {
        put(&DURATION, s, &mut c.cost.wave_ns)
    }),
    (Some("SIMGPU_KERNEL_TIME"), None, |c, s| {
        let times = s
            .and_then(KERNEL_TIMES.parse)
            .ok_or(KERNEL_TIMES.expected)?;
        add_kernel_overrides(&mut c.cost.kernel_overrides, times);
        Ok(())
    }),
    (
        Some("SIMGPU_PCIE_BW"),
        Some("cost.pcie_bandwidth"),
        |c, s| put(&BANDWIDTH, s, &mut c.cost.pcie_bytes_per_s),
    ),
    (Some("SIMGPU_HBM_BW"), Some("cost.hbm_bandwidth"), |c, s| {
        put(&BANDWIDTH, s, &mut c.cost.hbm_bytes_per_s)
    }),
    (None, Some("cost.copy_base"), |c, s| {
        put(&DURATION, s, &mut c.cost.copy_base_ns)
    }),
    (None, Some("cost.fault"), |c, s| {
        put(&DURATION, s, &mut c.cost.fault_ns)
    }),
    (
        Some("SIMGPU_FAULT_BW"),
        Some("cost.fault_bandwidth"),
        |c, s| put(&BANDWIDTH, s, &mut c.cost.fault_bytes_per_s),
    ),
    (
        Some("SIMGPU_PREFETCH_BW"),
        Some("cost.prefetch_bandwidth"),
        |c, s| put_some(&BANDWIDTH, s, &mut c.cost.prefetch_bytes_per_s),
    ),
    (Some("SIMGPU_TIMESLICE"), Some("cost.timeslice"), |c, s| {
        put(&DURATION, s, &mut c.cost.timeslice_ns)
    }),
    (
        Some("SIMGPU_CTX_SWITCH"),
        Some("cost.ctx_switch"),
        |c, s| put(&DURATION, s, &mut c.cost.ctx_switch_ns),
    ),
    // Read by engine.rs when a kernel completes.
    (Some("SIMGPU_KERNEL_TRACE"), None, read_elsewhere),
    (
        Some("SIMGPU_FAIL_ALLOC_NTH"),
        Some("faults.fail_alloc_nth"),
        |c, s| put_some(&FAIL_ALLOC_NTH, s, &mut c.faults.fail_alloc_nth),
    ),
    (
        Some("SIMGPU_LAUNCH_ERROR"),
        Some("faults.launch_error"),
        |c, s| put_some(&LAUNCH_ERROR, s, &mut c.faults.launch_error),
    ),
    (
        Some("SIMGPU_STALL_STREAM_AFTER"),
        Some("faults.stall_stream_after"),
        |c, s| put_some(&STALL_STREAM_AFTER, s, &mut c.faults.stall_stream_after),
    ),
    // Read at exit (driver/stats.rs) and by the trace writer (log.rs).
    (Some("SIMGPU_STATS_FILE"), None, read_elsewhere),
    (Some("SIMGPU_TRACE_FILE"), None, read_elsewhere),
];

/// Every `SIMGPU_*` variable simgpu knows; any other one is an error (typos must not pass).
pub fn known_vars() -> Vec<&'static str> {
    let devices = DEVICE_ROWS.iter().filter_map(|r| r.0);
    let machine = MACHINE_ROWS.iter().filter_map(|r| r.0);
    [CONFIG_VAR, DEVICES_VAR]
        .into_iter()
        .chain(devices)
        .chain(machine)
        .collect()
}

#[cfg(test)]
mod tests;
