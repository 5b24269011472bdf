//! `SIMGPU_*` environment variables: read, checked against `KNOWN_VARS`, applied over the file.

use super::*;

/// A variable's value, trimmed; None if unset or empty.
pub(super) fn var<'a>(vars: &'a HashMap<String, String>, name: &str) -> Option<&'a str> {
    vars.get(name).map(|v| v.trim()).filter(|v| !v.is_empty())
}

/// Parses variable `name` with `setting`; Ok(None) if it is unset.
pub(super) fn env_value<T>(
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

pub(super) fn check_unknown_vars(vars: &HashMap<String, String>) -> Result<(), ConfigError> {
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

pub(super) fn apply_env(
    cfg: &mut SimConfig,
    vars: &HashMap<String, String>,
) -> Result<(), ConfigError> {
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
pub(super) fn apply_env_memory(
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
