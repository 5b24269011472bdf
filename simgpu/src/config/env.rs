//! `SIMGPU_*` environment variables: read, checked against `known_vars`, applied over the file
//! in the order of the table's rows.

use super::*;

/// A variable's value, trimmed; None if unset or empty.
pub(super) fn var<'a>(vars: &'a HashMap<String, String>, name: &str) -> Option<&'a str> {
    vars.get(name).map(|v| v.trim()).filter(|v| !v.is_empty())
}

/// The error for variable `name`'s value.
fn invalid_var(vars: &HashMap<String, String>, name: &str, expected: &str) -> ConfigError {
    invalid(name, &format!("{:?}", vars[name]), expected)
}

pub(super) fn check_unknown_vars(vars: &HashMap<String, String>) -> Result<(), ConfigError> {
    let known = known_vars();
    let mut unknown: Vec<&String> = vars
        .keys()
        .filter(|k| k.starts_with("SIMGPU_") && !known.contains(&k.as_str()))
        .collect();
    unknown.sort();
    match unknown.first() {
        Some(name) => Err(ConfigError(format!(
            "simgpu: unknown variable {name}; known: {}",
            known.join(", ")
        ))),
        None => Ok(()),
    }
}

pub(super) fn apply_env(
    cfg: &mut SimConfig,
    vars: &HashMap<String, String>,
) -> Result<(), ConfigError> {
    if let Some(value) = var(vars, DEVICES_VAR) {
        let count = (DEVICE_COUNT.parse)(value)
            .ok_or_else(|| invalid_var(vars, DEVICES_VAR, DEVICE_COUNT.expected))?;
        cfg.devices.truncate(count);
        while cfg.devices.len() < count {
            cfg.devices
                .push(DeviceConfig::a100(cfg.devices.len() as u32));
        }
    }
    for (name, _, set) in DEVICE_ROWS {
        let Some(name) = *name else { continue };
        let Some(value) = var(vars, name) else {
            continue;
        };
        if name == MEMORY_VAR && value.contains(':') {
            apply_env_memory_list(cfg, vars, value)?;
            continue;
        }
        for d in cfg.devices.iter_mut() {
            set(d, Some(value)).map_err(|e| invalid_var(vars, name, e))?;
        }
    }
    for (name, _, set) in MACHINE_ROWS {
        let Some(name) = *name else { continue };
        if let Some(value) = var(vars, name) {
            set(cfg, Some(value)).map_err(|e| invalid_var(vars, name, e))?;
        }
    }
    Ok(())
}

/// `SIMGPU_MEMORY` per device (`0:40GiB,1:16GiB`).
fn apply_env_memory_list(
    cfg: &mut SimConfig,
    vars: &HashMap<String, String>,
    value: &str,
) -> Result<(), ConfigError> {
    let count = cfg.devices.len();
    let error = || {
        let expected = format!(
            "{}, or a per-device list like 0:40GiB,1:16GiB with device indexes 0 to {}",
            MEMORY.expected,
            count - 1
        );
        invalid_var(vars, MEMORY_VAR, &expected)
    };
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (index, size) = entry.split_once(':').ok_or_else(error)?;
        let index: usize = index.trim().parse().map_err(|_| error())?;
        let memory = (MEMORY.parse)(size.trim()).ok_or_else(error)?;
        cfg.devices.get_mut(index).ok_or_else(error)?.memory = memory;
    }
    Ok(())
}
