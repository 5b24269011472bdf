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

/// Every `SIMGPU_*` variable simgpu knows; any other one is an error (typos must not pass).
pub const KNOWN_VARS: &[&str] = &[
    "SIMGPU_CONFIG",
    "SIMGPU_DEVICES",
    "SIMGPU_DEVICE_NAME",
    "SIMGPU_MEMORY",
    "SIMGPU_SMS",
    "SIMGPU_CC",
    "SIMGPU_DRIVER_VERSION",
    "SIMGPU_STATE_DIR",
    "SIMGPU_LOG",
    "SIMGPU_KERNEL_BASE",
    "SIMGPU_WAVE",
    "SIMGPU_KERNEL_TIME",
    "SIMGPU_PCIE_BW",
    "SIMGPU_HBM_BW",
    "SIMGPU_FAULT_BW",
    "SIMGPU_TIMESLICE",
    "SIMGPU_CTX_SWITCH",
    "SIMGPU_KERNEL_TRACE",
    "SIMGPU_FAIL_ALLOC_NTH",
    "SIMGPU_LAUNCH_ERROR",
    "SIMGPU_STALL_STREAM_AFTER",
    "SIMGPU_STATS_FILE",
    "SIMGPU_TRACE_FILE",
];

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
// Environment variables

/// A variable's value, trimmed; None if unset or empty.
fn var<'a>(vars: &'a HashMap<String, String>, name: &str) -> Option<&'a str> {
    vars.get(name).map(|v| v.trim()).filter(|v| !v.is_empty())
}

/// Parses variable `name` with `setting`; Ok(None) if it is unset.
fn env_value<T>(
    vars: &HashMap<String, String>,
    name: &str,
    setting: &Setting<T>,
) -> Result<Option<T>, ConfigError> {
    let Some(value) = var(vars, name) else {
        return Ok(None);
    };
    match (setting.parse)(value) {
        Some(parsed) => Ok(Some(parsed)),
        None => Err(invalid(
            name,
            &format!("{:?}", vars[name]),
            setting.expected,
        )),
    }
}

fn check_unknown_vars(vars: &HashMap<String, String>) -> Result<(), ConfigError> {
    let mut unknown: Vec<&String> = vars
        .keys()
        .filter(|k| k.starts_with("SIMGPU_") && !KNOWN_VARS.contains(&k.as_str()))
        .collect();
    unknown.sort();
    match unknown.first() {
        Some(name) => Err(ConfigError(format!(
            "simgpu: unknown variable {name}; known: {}",
            KNOWN_VARS.join(", ")
        ))),
        None => Ok(()),
    }
}

fn apply_env(cfg: &mut SimConfig, vars: &HashMap<String, String>) -> Result<(), ConfigError> {
    if let Some(count) = env_value(vars, "SIMGPU_DEVICES", &DEVICE_COUNT)? {
        cfg.devices.truncate(count);
        while cfg.devices.len() < count {
            cfg.devices
                .push(DeviceConfig::a100(cfg.devices.len() as u32));
        }
    }
    if let Some(name) = env_value(vars, "SIMGPU_DEVICE_NAME", &DEVICE_NAME)? {
        cfg.devices.iter_mut().for_each(|d| d.name = name.clone());
    }
    apply_env_memory(cfg, vars)?;
    if let Some(sms) = env_value(vars, "SIMGPU_SMS", &SMS)? {
        cfg.devices.iter_mut().for_each(|d| d.sm_count = sms);
    }
    if let Some(cc) = env_value(vars, "SIMGPU_CC", &COMPUTE_CAPABILITY)? {
        cfg.devices
            .iter_mut()
            .for_each(|d| d.compute_capability = cc);
    }
    if let Some(version) = env_value(vars, "SIMGPU_DRIVER_VERSION", &DRIVER_VERSION)? {
        cfg.driver_version = version;
    }
    if let Some(dir) = env_value(vars, "SIMGPU_STATE_DIR", &STATE_DIR)? {
        cfg.state_dir = dir;
    }
    if let Some(level) = env_value(vars, "SIMGPU_LOG", &LOG)? {
        cfg.log_level = level;
    }
    let cost = &mut cfg.cost;
    if let Some(ns) = env_value(vars, "SIMGPU_KERNEL_BASE", &DURATION)? {
        cost.kernel_base_ns = ns;
    }
    if let Some(ns) = env_value(vars, "SIMGPU_WAVE", &DURATION)? {
        cost.wave_ns = ns;
    }
    if let Some(times) = env_value(vars, "SIMGPU_KERNEL_TIME", &KERNEL_TIMES)? {
        add_kernel_overrides(&mut cost.kernel_overrides, times);
    }
    if let Some(bw) = env_value(vars, "SIMGPU_PCIE_BW", &BANDWIDTH)? {
        cost.pcie_bytes_per_s = bw;
    }
    if let Some(bw) = env_value(vars, "SIMGPU_HBM_BW", &BANDWIDTH)? {
        cost.hbm_bytes_per_s = bw;
    }
    if let Some(bw) = env_value(vars, "SIMGPU_FAULT_BW", &BANDWIDTH)? {
        cost.fault_bytes_per_s = bw;
    }
    if let Some(ns) = env_value(vars, "SIMGPU_TIMESLICE", &DURATION)? {
        cost.timeslice_ns = ns;
    }
    if let Some(ns) = env_value(vars, "SIMGPU_CTX_SWITCH", &DURATION)? {
        cost.ctx_switch_ns = ns;
    }
    let faults = &mut cfg.faults;
    if let Some(nth) = env_value(vars, "SIMGPU_FAIL_ALLOC_NTH", &FAIL_ALLOC_NTH)? {
        faults.fail_alloc_nth = Some(nth);
    }
    if let Some(error) = env_value(vars, "SIMGPU_LAUNCH_ERROR", &LAUNCH_ERROR)? {
        faults.launch_error = Some(error);
    }
    if let Some(after) = env_value(vars, "SIMGPU_STALL_STREAM_AFTER", &STALL_STREAM_AFTER)? {
        faults.stall_stream_after = Some(after);
    }
    Ok(())
}

/// `SIMGPU_MEMORY`: one size for every device (`40GiB`), or per device (`0:40GiB,1:16GiB`).
fn apply_env_memory(
    cfg: &mut SimConfig,
    vars: &HashMap<String, String>,
) -> Result<(), ConfigError> {
    const NAME: &str = "SIMGPU_MEMORY";
    let Some(value) = var(vars, NAME) else {
        return Ok(());
    };
    if !value.contains(':') {
        if let Some(memory) = env_value(vars, NAME, &MEMORY)? {
            cfg.devices.iter_mut().for_each(|d| d.memory = memory);
        }
        return Ok(());
    }
    let count = cfg.devices.len();
    let error = || {
        let expected = format!(
            "{}, or a per-device list like 0:40GiB,1:16GiB with device indexes 0 to {}",
            MEMORY.expected,
            count - 1
        );
        invalid(NAME, &format!("{:?}", vars[NAME]), &expected)
    };
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (index, size) = entry.split_once(':').ok_or_else(error)?;
        let index: usize = index.trim().parse().map_err(|_| error())?;
        let memory = (MEMORY.parse)(size.trim()).ok_or_else(error)?;
        cfg.devices.get_mut(index).ok_or_else(error)?.memory = memory;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// TOML file

/// A TOML value that keeps table keys in document order (`toml::Table` sorts them, and the
/// order of `[cost.kernels]` decides which substring override matches first).
#[derive(Debug)]
enum Node {
    Text(String),
    /// An integer or float, as text.
    Number(String),
    /// A boolean or date-time, by kind: no setting accepts one.
    Other(&'static str),
    Array(Vec<Node>),
    Table(Vec<(String, Node)>),
}

impl Node {
    /// The value as text, for the settings' parsers (strings and numbers only).
    fn scalar(&self) -> Option<&str> {
        match self {
            Node::Text(s) | Node::Number(s) => Some(s),
            _ => None,
        }
    }

    /// How an error message shows the value.
    fn shown(&self) -> String {
        match self {
            Node::Text(s) => format!("{s:?}"),
            Node::Number(s) => s.clone(),
            Node::Other(kind) => (*kind).to_owned(),
            Node::Array(_) => "an array".to_owned(),
            Node::Table(_) => "a table".to_owned(),
        }
    }
}

impl<'de> serde::Deserialize<'de> for Node {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Node, D::Error> {
        deserializer.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> serde::de::Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a TOML value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Node, E> {
        Ok(Node::Other("a boolean"))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Node, E> {
        Ok(Node::Number(v.to_string()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Node, E> {
        Ok(Node::Number(v.to_string()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Node, E> {
        Ok(Node::Number(v.to_string()))
    }

    fn visit_str<E>(self, v: &str) -> Result<Node, E> {
        Ok(Node::Text(v.to_owned()))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Node::Array(items))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries: Vec<(String, Node)> = Vec::new();
        while let Some(entry) = map.next_entry()? {
            entries.push(entry);
        }
        // toml hands a date-time over as a one-entry map with this private key.
        if entries.len() == 1 && entries[0].0 == "$__toml_private_datetime" {
            return Ok(Node::Other("a date-time"));
        }
        Ok(Node::Table(entries))
    }
}

fn load_file(cfg: &mut SimConfig, path: &str) -> Result<(), ConfigError> {
    let shown = format!("{path:?}");
    let text = std::fs::read_to_string(Path::new(path)).map_err(|e| {
        invalid(
            "SIMGPU_CONFIG",
            &shown,
            &format!("cannot read the file: {e}"),
        )
    })?;
    let root: Node = toml::from_str(&text).map_err(|e| {
        let at = match e.span() {
            Some(span) => {
                let (line, column) = line_column(&text, span.start);
                format!(" at line {line}, column {column}")
            }
            None => String::new(),
        };
        let message: Vec<&str> = e.message().lines().map(str::trim).collect();
        let expected = format!("TOML error{at}: {}", message.join("; "));
        invalid("SIMGPU_CONFIG", &shown, &expected)
    })?;
    TomlFile { path }.apply(cfg, &root)
}

/// 1-based line and column (in characters) of byte `offset` in `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (
        before.matches('\n').count() + 1,
        before[line_start..].chars().count() + 1,
    )
}

const TOP_KEYS: &[&str] = &[
    "driver_version",
    "state_dir",
    "log",
    "device",
    "cost",
    "faults",
];
const DEVICE_KEYS: &[&str] = &[
    "name",
    "memory",
    "sms",
    "compute_capability",
    "uuid",
    "pci_domain",
    "pci_bus",
    "pci_device",
];
const COST_KEYS: &[&str] = &[
    "kernel_base",
    "wave",
    "pcie_bandwidth",
    "hbm_bandwidth",
    "copy_base",
    "fault",
    "fault_bandwidth",
    "timeslice",
    "ctx_switch",
    "kernels",
];
const FAULT_KEYS: &[&str] = &["fail_alloc_nth", "launch_error", "stall_stream_after"];

/// Applies a parsed TOML file; errors name `path:key`.
struct TomlFile<'a> {
    path: &'a str,
}

impl TomlFile<'_> {
    fn apply(&self, cfg: &mut SimConfig, root: &Node) -> Result<(), ConfigError> {
        let Node::Table(entries) = root else {
            return Err(invalid(self.path, &root.shown(), "expected a TOML table"));
        };
        for (key, node) in entries {
            match key.as_str() {
                "driver_version" => cfg.driver_version = self.value(key, node, &DRIVER_VERSION)?,
                "state_dir" => cfg.state_dir = self.value(key, node, &STATE_DIR)?,
                "log" => cfg.log_level = self.value(key, node, &LOG)?,
                "device" => cfg.devices = self.devices(node)?,
                "cost" => self.cost(&mut cfg.cost, node)?,
                "faults" => self.faults(&mut cfg.faults, node)?,
                _ => return Err(self.unknown(key, TOP_KEYS)),
            }
        }
        Ok(())
    }

    fn devices(&self, node: &Node) -> Result<Vec<DeviceConfig>, ConfigError> {
        const EXPECTED: &str = "expected 1 to 16 [[device]] tables";
        let Node::Array(items) = node else {
            return Err(self.invalid("device", node, EXPECTED));
        };
        if items.is_empty() || items.len() > MAX_DEVICES {
            return Err(self.invalid("device", node, EXPECTED));
        }
        let mut devices: Vec<DeviceConfig> = Vec::new();
        for (index, item) in items.iter().enumerate() {
            let path = format!("device[{index}]");
            let entries = self.table(&path, item)?;
            let mut device = DeviceConfig::a100(index as u32);
            for (key, node) in entries {
                let key_path = format!("{path}.{key}");
                let key_path = key_path.as_str();
                match key.as_str() {
                    "name" => device.name = self.value(key_path, node, &DEVICE_NAME)?,
                    "memory" => device.memory = self.value(key_path, node, &MEMORY)?,
                    "sms" => device.sm_count = self.value(key_path, node, &SMS)?,
                    "compute_capability" => {
                        device.compute_capability =
                            self.value(key_path, node, &COMPUTE_CAPABILITY)?
                    }
                    "uuid" => {
                        device.uuid = self.value(key_path, node, &UUID)?;
                        if let Some(other) = devices.iter().position(|d| d.uuid == device.uuid) {
                            let expected =
                                format!("expected a UUID different from device[{other}]'s");
                            return Err(self.invalid(key_path, node, &expected));
                        }
                    }
                    "pci_domain" => device.pci_domain = self.value(key_path, node, &PCI_DOMAIN)?,
                    "pci_bus" => device.pci_bus = self.value(key_path, node, &PCI_BUS)?,
                    "pci_device" => device.pci_device = self.value(key_path, node, &PCI_DEVICE)?,
                    _ => return Err(self.unknown(key_path, DEVICE_KEYS)),
                }
            }
            devices.push(device);
        }
        Ok(devices)
    }

    fn cost(&self, cost: &mut CostModel, node: &Node) -> Result<(), ConfigError> {
        for (key, node) in self.table("cost", node)? {
            let key_path = format!("cost.{key}");
            let key_path = key_path.as_str();
            match key.as_str() {
                "kernel_base" => cost.kernel_base_ns = self.value(key_path, node, &DURATION)?,
                "wave" => cost.wave_ns = self.value(key_path, node, &DURATION)?,
                "pcie_bandwidth" => {
                    cost.pcie_bytes_per_s = self.value(key_path, node, &BANDWIDTH)?
                }
                "hbm_bandwidth" => cost.hbm_bytes_per_s = self.value(key_path, node, &BANDWIDTH)?,
                "copy_base" => cost.copy_base_ns = self.value(key_path, node, &DURATION)?,
                "fault" => cost.fault_ns = self.value(key_path, node, &DURATION)?,
                "fault_bandwidth" => {
                    cost.fault_bytes_per_s = self.value(key_path, node, &BANDWIDTH)?
                }
                "timeslice" => cost.timeslice_ns = self.value(key_path, node, &DURATION)?,
                "ctx_switch" => cost.ctx_switch_ns = self.value(key_path, node, &DURATION)?,
                "kernels" => {
                    let mut times = Vec::new();
                    for (name, node) in self.table(key_path, node)? {
                        let name_path = format!("cost.kernels.{name:?}");
                        if name.is_empty() {
                            return Err(self.invalid(
                                &name_path,
                                node,
                                "expected a non-empty kernel name",
                            ));
                        }
                        times.push((name.clone(), self.value(&name_path, node, &DURATION)?));
                    }
                    add_kernel_overrides(&mut cost.kernel_overrides, times);
                }
                _ => return Err(self.unknown(key_path, COST_KEYS)),
            }
        }
        Ok(())
    }

    fn faults(&self, faults: &mut Faults, node: &Node) -> Result<(), ConfigError> {
        for (key, node) in self.table("faults", node)? {
            let key_path = format!("faults.{key}");
            let key_path = key_path.as_str();
            match key.as_str() {
                "fail_alloc_nth" => {
                    faults.fail_alloc_nth = Some(self.value(key_path, node, &FAIL_ALLOC_NTH)?)
                }
                "launch_error" => {
                    faults.launch_error = Some(self.value(key_path, node, &LAUNCH_ERROR)?)
                }
                "stall_stream_after" => {
                    faults.stall_stream_after =
                        Some(self.value(key_path, node, &STALL_STREAM_AFTER)?)
                }
                _ => return Err(self.unknown(key_path, FAULT_KEYS)),
            }
        }
        Ok(())
    }

    /// The entries of a table at `key_path`, or an error if the node is not a table.
    fn table<'n>(
        &self,
        key_path: &str,
        node: &'n Node,
    ) -> Result<&'n [(String, Node)], ConfigError> {
        match node {
            Node::Table(entries) => Ok(entries),
            _ => Err(self.invalid(key_path, node, &format!("expected a table ([{key_path}])"))),
        }
    }

    fn value<T>(
        &self,
        key_path: &str,
        node: &Node,
        setting: &Setting<T>,
    ) -> Result<T, ConfigError> {
        node.scalar()
            .map(|s| s.trim())
            .and_then(setting.parse)
            .ok_or_else(|| self.invalid(key_path, node, setting.expected))
    }

    fn invalid(&self, key_path: &str, node: &Node, expected: &str) -> ConfigError {
        invalid(
            &format!("{}:{key_path}", self.path),
            &node.shown(),
            expected,
        )
    }

    fn unknown(&self, key_path: &str, known: &[&str]) -> ConfigError {
        ConfigError(format!(
            "simgpu: unknown key {}:{key_path}; known: {}",
            self.path,
            known.join(", ")
        ))
    }
}

// ---------------------------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn load(pairs: &[(&str, &str)]) -> Result<SimConfig, ConfigError> {
        SimConfig::from_vars(&vars(pairs))
    }

    fn error(pairs: &[(&str, &str)]) -> String {
        match load(pairs) {
            Ok(cfg) => panic!("expected an error for {pairs:?}, got {cfg:?}"),
            Err(e) => {
                assert!(!e.0.contains('\n'), "error is not one line: {e}");
                assert!(e.0.starts_with("simgpu: "), "{e}");
                e.0
            }
        }
    }

    fn toml_file(text: &str) -> tempfile::NamedTempFile {
        let mut file = tempfile::Builder::new()
            .suffix(".toml")
            .tempfile()
            .expect("temp file");
        file.write_all(text.as_bytes()).expect("write temp file");
        file
    }

    fn path_of(file: &tempfile::NamedTempFile) -> String {
        file.path().to_str().expect("utf-8 temp path").to_owned()
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1073741824"), Some(1 << 30));
        assert_eq!(parse_size("40GiB"), Some(40 << 30));
        assert_eq!(parse_size("512MiB"), Some(512 << 20));
        assert_eq!(parse_size("1.5GiB"), Some(3 << 29));
        assert_eq!(parse_size("2KiB"), Some(2048));
        assert_eq!(parse_size("1TiB"), Some(1 << 40));
        assert_eq!(parse_size("40GB"), Some(40_000_000_000));
        assert_eq!(parse_size("512MB"), Some(512_000_000));
        assert_eq!(parse_size("3kB"), Some(3000));
        assert_eq!(parse_size("16 gib"), Some(16 << 30));
        assert_eq!(parse_size(" 7B "), Some(7));
        assert_eq!(parse_size("0"), Some(0));
        assert_eq!(parse_size("0.1KiB"), Some(102)); // truncated
        for bad in [
            "",
            "banana",
            "GiB",
            "1.5",
            "1.",
            ".5GiB",
            "-1GiB",
            "+1GiB",
            "1 .5GiB",
            "1..5GiB",
            "40G",
            "40GiBs",
            "1e9",
            "99999999999999999999",
            "20000000TiB",
        ] {
            assert_eq!(parse_size(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ns("200ns"), Some(200));
        assert_eq!(parse_duration_ns("5us"), Some(5_000));
        assert_eq!(parse_duration_ns("5µs"), Some(5_000));
        assert_eq!(parse_duration_ns("1ms"), Some(1_000_000));
        assert_eq!(parse_duration_ns("1.5ms"), Some(1_500_000));
        assert_eq!(parse_duration_ns("2s"), Some(2_000_000_000));
        assert_eq!(parse_duration_ns("0.25 s"), Some(250_000_000));
        for bad in [
            "", "5", "1m", "1h", "ms", "1.5.5ms", "-1ms", "five ms", "1e3ns",
        ] {
            assert_eq!(parse_duration_ns(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn bandwidths() {
        assert_eq!(parse_bandwidth("25GB/s"), Some(25_000_000_000));
        assert_eq!(parse_bandwidth("12GiB/s"), Some(12 << 30));
        assert_eq!(parse_bandwidth("1.5 TB/s"), Some(1_500_000_000_000));
        assert_eq!(parse_bandwidth("1000/s"), Some(1000));
        for bad in ["", "25GB", "/s", "fast/s", "25GB/h"] {
            assert_eq!(parse_bandwidth(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn uuids() {
        let text = "GPU-01234567-89ab-cdef-0123-456789ABCDEF";
        let uuid = parse_uuid(text).expect("valid uuid");
        assert_eq!(uuid[0], 0x01);
        assert_eq!(uuid[15], 0xef);
        assert_eq!(
            format_uuid(&uuid),
            text.to_ascii_lowercase().replace("gpu-", "GPU-")
        );
        for bad in [
            "01234567-89ab-cdef-0123-456789abcdef",
            "GPU-0123456-789ab-cdef-0123-456789abcdef",
            "GPU-01234567-89ab-cdef-0123-456789abcdeg",
            "GPU-+1234567-89ab-cdef-0123-456789abcdef",
            "GPU-01234567-89ab-cdef-0123",
        ] {
            assert_eq!(parse_uuid(bad), None, "{bad:?}");
        }
        assert_eq!(format_uuid(&DeviceConfig::a100(0).uuid).len(), 40);
    }

    #[test]
    fn compute_capabilities_and_launch_errors() {
        assert_eq!(parse_compute_capability("8.0"), Some((8, 0)));
        assert_eq!(parse_compute_capability("9"), Some((9, 0)));
        for bad in ["", "0.0", "21.0", "8.10", "8.", ".8", "a.b"] {
            assert_eq!(parse_compute_capability(bad), None, "{bad:?}");
        }
        assert_eq!(parse_launch_error("5:719"), Some((5, 719)));
        for bad in ["", "5", "0:719", "5:0", "5:x", ":719"] {
            assert_eq!(parse_launch_error(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn no_variables_give_defaults() {
        let cfg = load(&[]).expect("defaults");
        assert_eq!(cfg, SimConfig::default());
        // Empty values count as unset.
        let cfg = load(&[("SIMGPU_MEMORY", ""), ("SIMGPU_CONFIG", " ")]).expect("defaults");
        assert_eq!(cfg, SimConfig::default());
    }

    #[test]
    fn every_variable() {
        let cfg = load(&[
            ("SIMGPU_DEVICES", "3"),
            ("SIMGPU_DEVICE_NAME", "Simulated H100"),
            ("SIMGPU_MEMORY", "80GiB"),
            ("SIMGPU_SMS", "132"),
            ("SIMGPU_CC", "9.0"),
            ("SIMGPU_DRIVER_VERSION", "12040"),
            ("SIMGPU_STATE_DIR", "/tmp/simgpu-x"),
            ("SIMGPU_LOG", "debug"),
            ("SIMGPU_KERNEL_BASE", "3us"),
            ("SIMGPU_WAVE", "1.5ms"),
            ("SIMGPU_KERNEL_TIME", "gemm=1ms, _Z6kernelPf=250us"),
            ("SIMGPU_PCIE_BW", "12GiB/s"),
            ("SIMGPU_HBM_BW", "3TB/s"),
            ("SIMGPU_FAIL_ALLOC_NTH", "3"),
            ("SIMGPU_LAUNCH_ERROR", "5:719"),
            ("SIMGPU_STALL_STREAM_AFTER", "100"),
            ("SIMGPU_STATS_FILE", "/tmp/stats"),
            ("SIMGPU_TRACE_FILE", "/tmp/trace"),
        ])
        .expect("valid variables");
        assert_eq!(cfg.devices.len(), 3);
        for (i, d) in cfg.devices.iter().enumerate() {
            assert_eq!(d.name, "Simulated H100");
            assert_eq!(d.memory, 80 << 30);
            assert_eq!(d.sm_count, 132);
            assert_eq!(d.compute_capability, (9, 0));
            assert_eq!(d.uuid, DeviceConfig::a100(i as u32).uuid);
        }
        assert_eq!(cfg.driver_version, 12040);
        assert_eq!(cfg.state_dir, PathBuf::from("/tmp/simgpu-x"));
        assert_eq!(cfg.log_level, 2);
        assert_eq!(cfg.cost.kernel_base_ns, 3_000);
        assert_eq!(cfg.cost.wave_ns, 1_500_000);
        assert_eq!(
            cfg.cost.kernel_overrides,
            vec![
                ("gemm".to_owned(), 1_000_000),
                ("_Z6kernelPf".to_owned(), 250_000)
            ]
        );
        assert_eq!(cfg.cost.pcie_bytes_per_s, 12 << 30);
        assert_eq!(cfg.cost.hbm_bytes_per_s, 3_000_000_000_000);
        assert_eq!(cfg.faults.fail_alloc_nth, Some(3));
        assert_eq!(cfg.faults.launch_error, Some((5, 719)));
        assert_eq!(cfg.faults.stall_stream_after, Some(100));
    }

    #[test]
    fn per_device_memory() {
        let cfg = load(&[
            ("SIMGPU_DEVICES", "3"),
            ("SIMGPU_MEMORY", "0:40GiB, 2:16GiB"),
        ])
        .expect("per-device memory");
        let memory: Vec<u64> = cfg.devices.iter().map(|d| d.memory).collect();
        assert_eq!(memory, vec![40 << 30, 40 << 30, 16 << 30]);

        let e = error(&[
            ("SIMGPU_DEVICES", "2"),
            ("SIMGPU_MEMORY", "0:40GiB,2:16GiB"),
        ]);
        assert!(
            e.starts_with("simgpu: invalid SIMGPU_MEMORY=\"0:40GiB,2:16GiB\": expected"),
            "{e}"
        );
        assert!(e.contains("device indexes 0 to 1"), "{e}");
        let e = error(&[("SIMGPU_MEMORY", "0:banana")]);
        assert!(e.contains("0:40GiB,1:16GiB"), "{e}");
        error(&[("SIMGPU_MEMORY", "x:1GiB")]);
        error(&[("SIMGPU_MEMORY", "0:0")]);
    }

    #[test]
    fn device_count_truncates_and_extends() {
        let cfg = load(&[("SIMGPU_DEVICES", "16")]).expect("16 devices");
        assert_eq!(cfg.devices.len(), 16);
        assert_eq!(cfg.devices[15], DeviceConfig::a100(15));
        error(&[("SIMGPU_DEVICES", "0")]);
        error(&[("SIMGPU_DEVICES", "17")]);
    }

    #[test]
    fn errors_name_the_variable_and_what_is_accepted() {
        let e = error(&[("SIMGPU_MEMORY", "banana")]);
        assert!(
            e.starts_with(
                "simgpu: invalid SIMGPU_MEMORY=\"banana\": expected a size like 40GiB or 512MiB"
            ),
            "{e}"
        );
        let cases: &[(&str, &str, &str)] = &[
            ("SIMGPU_DEVICES", "two", "device count from 1 to 16"),
            ("SIMGPU_MEMORY", "0", "greater than 0"),
            ("SIMGPU_MEMORY", "2TiB", "at most 1TiB"),
            ("SIMGPU_SMS", "0", "from 1 to 1024"),
            ("SIMGPU_SMS", "1025", "from 1 to 1024"),
            ("SIMGPU_CC", "21.0", "major 1 to 20"),
            ("SIMGPU_DRIVER_VERSION", "11080", "at least 12000"),
            ("SIMGPU_DRIVER_VERSION", "13.5", "like 13050"),
            ("SIMGPU_STATE_DIR", "relative/dir", "absolute"),
            ("SIMGPU_LOG", "verbose", "off, warn or debug"),
            ("SIMGPU_KERNEL_BASE", "5", "like 5us"),
            ("SIMGPU_WAVE", "2h", "like 5us"),
            ("SIMGPU_WAVE", "3601s", "at most 1 hour"),
            ("SIMGPU_KERNEL_TIME", "gemm", "name=duration"),
            ("SIMGPU_KERNEL_TIME", "=1ms", "name=duration"),
            ("SIMGPU_KERNEL_TIME", "gemm=2h", "name=duration"),
            ("SIMGPU_PCIE_BW", "0GB/s", "greater than 0"),
            ("SIMGPU_HBM_BW", "1500GB", "like 25GB/s"),
            ("SIMGPU_FAIL_ALLOC_NTH", "0", "positive integer"),
            ("SIMGPU_LAUNCH_ERROR", "5", "N:code"),
            ("SIMGPU_STALL_STREAM_AFTER", "-1", "number of operations"),
            ("SIMGPU_DEVICE_NAME", &"x".repeat(256), "1 to 255 bytes"),
        ];
        for (name, value, accepted) in cases {
            let e = error(&[(name, value)]);
            let prefix = format!("simgpu: invalid {name}={value:?}: expected ");
            assert!(e.starts_with(&prefix), "{e}");
            assert!(e.contains(accepted), "{e} should say {accepted}");
        }
    }

    #[test]
    fn unknown_variable() {
        let e = error(&[("SIMGPU_MEMROY", "40GiB"), ("SIMGPU_ZZZ", "1")]);
        assert!(
            e.starts_with("simgpu: unknown variable SIMGPU_MEMROY; known: SIMGPU_CONFIG, "),
            "{e}"
        );
        assert!(e.contains("SIMGPU_MEMORY"), "{e}");
        // Variables of other programs pass.
        load(&[("CUDA_VISIBLE_DEVICES", "0"), ("SIMGPU", "1")]).expect("not ours");
    }

    const FULL_FILE: &str = r#"
driver_version = 12080
state_dir = "/dev/shm/simgpu-test"
log = "warn"

[[device]]
name = "Simulated A100-SXM4-80GB"
memory = "80GiB"
sms = 108
compute_capability = "8.0"
uuid = "GPU-01234567-89ab-cdef-0123-456789abcdef"
pci_bus = 32

[[device]]
memory = 17179869184
compute_capability = 8.6

[cost]
kernel_base = "4us"
wave = "10us"
pcie_bandwidth = "25GB/s"
hbm_bandwidth = "1500GB/s"
copy_base = "2us"
fault = "20us"
fault_bandwidth = "10GB/s"

[cost.kernels]
"zz_gemm" = "2ms"
"_Z6kernelPf" = "1ms"
"gemm" = "3ms"

[faults]
fail_alloc_nth = 3
launch_error = "5:719"
stall_stream_after = 100
"#;

    #[test]
    fn toml_file_round_trip() {
        let file = toml_file(FULL_FILE);
        let cfg = load(&[("SIMGPU_CONFIG", &path_of(&file))]).expect("valid file");
        assert_eq!(cfg.driver_version, 12080);
        assert_eq!(cfg.state_dir, PathBuf::from("/dev/shm/simgpu-test"));
        assert_eq!(cfg.log_level, 1);
        assert_eq!(cfg.devices.len(), 2);
        let d0 = &cfg.devices[0];
        assert_eq!(d0.name, "Simulated A100-SXM4-80GB");
        assert_eq!(d0.memory, 80 << 30);
        assert_eq!(d0.sm_count, 108);
        assert_eq!(
            format_uuid(&d0.uuid),
            "GPU-01234567-89ab-cdef-0123-456789abcdef"
        );
        assert_eq!(d0.pci_bus, 32);
        let d1 = &cfg.devices[1];
        assert_eq!(d1.name, DeviceConfig::a100(1).name);
        assert_eq!(d1.memory, 16 << 30);
        assert_eq!(d1.compute_capability, (8, 6));
        assert_eq!(d1.uuid, DeviceConfig::a100(1).uuid);
        assert_eq!(d1.pci_bus, DeviceConfig::a100(1).pci_bus);
        let cost = &cfg.cost;
        assert_eq!(cost.kernel_base_ns, 4_000);
        assert_eq!(cost.wave_ns, 10_000);
        assert_eq!(cost.pcie_bytes_per_s, 25_000_000_000);
        assert_eq!(cost.hbm_bytes_per_s, 1_500_000_000_000);
        assert_eq!(cost.copy_base_ns, 2_000);
        assert_eq!(cost.fault_ns, 20_000);
        assert_eq!(cost.fault_bytes_per_s, 10_000_000_000);
        // Document order is kept, so the first substring match is the first in the file.
        let names: Vec<&str> = cost
            .kernel_overrides
            .iter()
            .map(|(k, _)| k.as_str())
            .collect();
        assert_eq!(names, ["zz_gemm", "_Z6kernelPf", "gemm"]);
        assert_eq!(cfg.faults.fail_alloc_nth, Some(3));
        assert_eq!(cfg.faults.launch_error, Some((5, 719)));
        assert_eq!(cfg.faults.stall_stream_after, Some(100));
    }

    #[test]
    fn kernel_override_exact_then_first_substring() {
        let file = toml_file(FULL_FILE);
        let cfg = load(&[("SIMGPU_CONFIG", &path_of(&file))]).expect("valid file");
        assert_eq!(cfg.kernel_override("_Z6kernelPf"), Some(1_000_000));
        assert_eq!(cfg.kernel_override("gemm"), Some(3_000_000)); // exact beats zz_gemm
        assert_eq!(cfg.kernel_override("_Z7zz_gemm_v2Pf"), Some(2_000_000));
        assert_eq!(cfg.kernel_override("_Z9sgemm_128v"), Some(3_000_000));
        assert_eq!(cfg.kernel_override("_Z6reducePf"), None);
        assert_eq!(SimConfig::default().kernel_override("anything"), None);
    }

    #[test]
    fn env_beats_file() {
        let file = toml_file(FULL_FILE);
        let cfg = load(&[
            ("SIMGPU_CONFIG", &path_of(&file)),
            ("SIMGPU_DEVICES", "4"),
            ("SIMGPU_MEMORY", "1:8GiB"),
            ("SIMGPU_DRIVER_VERSION", "13050"),
            ("SIMGPU_LOG", "off"),
            ("SIMGPU_KERNEL_BASE", "1us"),
            ("SIMGPU_KERNEL_TIME", "gemm=5ms,reduce=1us"),
            ("SIMGPU_LAUNCH_ERROR", "1:999"),
        ])
        .expect("valid");
        assert_eq!(cfg.devices.len(), 4);
        assert_eq!(cfg.devices[0].name, "Simulated A100-SXM4-80GB"); // from the file
        assert_eq!(cfg.devices[0].memory, 80 << 30);
        assert_eq!(cfg.devices[1].memory, 8 << 30);
        assert_eq!(cfg.devices[3], DeviceConfig::a100(3));
        assert_eq!(cfg.driver_version, 13050);
        assert_eq!(cfg.log_level, 0);
        assert_eq!(cfg.cost.kernel_base_ns, 1_000);
        assert_eq!(cfg.cost.wave_ns, 10_000); // from the file
        assert_eq!(cfg.kernel_override("gemm"), Some(5_000_000));
        assert_eq!(cfg.kernel_override("_Z6reducePf"), Some(1_000));
        assert_eq!(cfg.cost.kernel_overrides.len(), 4);
        assert_eq!(cfg.faults.launch_error, Some((1, 999)));
        assert_eq!(cfg.faults.fail_alloc_nth, Some(3)); // from the file

        let cfg =
            load(&[("SIMGPU_CONFIG", &path_of(&file)), ("SIMGPU_DEVICES", "1")]).expect("valid");
        assert_eq!(cfg.devices.len(), 1);
    }

    fn file_error(text: &str) -> (String, String) {
        let file = toml_file(text);
        let path = path_of(&file);
        (error(&[("SIMGPU_CONFIG", &path)]), path)
    }

    #[test]
    fn unknown_toml_keys() {
        let (e, path) = file_error("driver_verison = 13050\n");
        assert!(
            e.starts_with(&format!(
                "simgpu: unknown key {path}:driver_verison; known: driver_version"
            )),
            "{e}"
        );
        let (e, path) = file_error("[[device]]\nmemroy = \"1GiB\"\n");
        assert!(
            e.starts_with(&format!(
                "simgpu: unknown key {path}:device[0].memroy; known: name"
            )),
            "{e}"
        );
        let (e, path) = file_error("[cost]\nwaves = \"1us\"\n");
        assert!(
            e.starts_with(&format!("simgpu: unknown key {path}:cost.waves;")),
            "{e}"
        );
        let (e, path) = file_error("[faults]\nfail_alloc = 1\n");
        assert!(
            e.starts_with(&format!("simgpu: unknown key {path}:faults.fail_alloc;")),
            "{e}"
        );
    }

    #[test]
    fn toml_value_errors_name_file_and_key() {
        let (e, path) = file_error("[[device]]\n[[device]]\nmemory = \"banana\"\n");
        let prefix = format!(
            "simgpu: invalid {path}:device[1].memory=\"banana\": expected a size like 40GiB or 512MiB"
        );
        assert!(e.starts_with(&prefix), "{e}");
        let (e, path) = file_error("[cost]\nwave = 10\n");
        assert!(
            e.starts_with(&format!(
                "simgpu: invalid {path}:cost.wave=10: expected a duration"
            )),
            "{e}"
        );
        let (e, path) = file_error("[cost.kernels]\ngemm = \"fast\"\n");
        assert!(
            e.starts_with(&format!(
                "simgpu: invalid {path}:cost.kernels.\"gemm\"=\"fast\":"
            )),
            "{e}"
        );
        let (e, path) = file_error("log = true\n");
        assert!(
            e.starts_with(&format!(
                "simgpu: invalid {path}:log=a boolean: expected off"
            )),
            "{e}"
        );
        let (e, path) = file_error("cost = 5\n");
        assert!(
            e.starts_with(&format!(
                "simgpu: invalid {path}:cost=5: expected a table ([cost])"
            )),
            "{e}"
        );
        let (e, _) = file_error("[device]\nname = \"x\"\n");
        assert!(
            e.contains(":device=a table: expected 1 to 16 [[device]] tables"),
            "{e}"
        );
        let (e, _) = file_error("device = []\n");
        assert!(e.contains(":device=an array: expected 1 to 16"), "{e}");
        let (e, _) = file_error(&"[[device]]\n".repeat(17));
        assert!(e.contains("expected 1 to 16"), "{e}");
        let (e, _) = file_error("state_dir = 1979-05-27\n");
        assert!(
            e.contains(":state_dir=a date-time: expected an absolute"),
            "{e}"
        );
        let uuid = "uuid = \"GPU-01234567-89ab-cdef-0123-456789abcdef\"\n";
        let (e, _) = file_error(&format!("[[device]]\n{uuid}[[device]]\n{uuid}"));
        assert!(e.contains(":device[1].uuid=\"GPU-"), "{e}");
        assert!(e.contains("different from device[0]"), "{e}");
    }

    #[test]
    fn unreadable_or_invalid_file() {
        let e = error(&[("SIMGPU_CONFIG", "/nonexistent/simgpu.toml")]);
        assert!(
            e.starts_with(
                "simgpu: invalid SIMGPU_CONFIG=\"/nonexistent/simgpu.toml\": cannot read the file:"
            ),
            "{e}"
        );
        let (e, path) = file_error("log = \"warn\"\n[cost\nwave = 1\n");
        let prefix =
            format!("simgpu: invalid SIMGPU_CONFIG={path:?}: TOML error at line 2, column ");
        assert!(e.starts_with(&prefix), "{e}");
        let (e, _) = file_error("log = \"warn\"\nlog = \"off\"\n");
        assert!(e.contains("TOML error at line 2"), "{e}");
    }

    #[test]
    fn file_errors_are_reported_even_if_env_overrides_the_key() {
        let file = toml_file("log = \"loud\"\n");
        let e = error(&[("SIMGPU_CONFIG", &path_of(&file)), ("SIMGPU_LOG", "off")]);
        assert!(
            e.contains(":log=\"loud\": expected off, warn or debug"),
            "{e}"
        );
    }
}
