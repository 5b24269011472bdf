//! NVML exports: per-cgroup memory limits (r615+; `crate::cglimits`).

use super::*;

/// An older driver's libnvidia-ml has no such function; one library serves every configured
/// version here, so it answers as NVML does for a function it does not implement.
pub(super) fn limits_driver() -> Result<&'static Nvml, NvmlReturn> {
    let s = state()?;
    if driver_branch(s.cfg.driver_version) < MEMORY_LIMITS_BRANCH {
        return Err(NVML_ERROR_FUNCTION_NOT_FOUND);
    }
    Ok(s)
}

/// The checks both calls make: a driver that has them, a device, a cgroup directory.
pub(super) fn limits_target(
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
