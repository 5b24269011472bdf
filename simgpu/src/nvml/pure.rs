//! The pure parts of NVML: formats, clocks, power, samples (no state, no exports).

use super::*;

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

pub(super) fn fill_c<const N: usize>(s: &str) -> [c_char; N] {
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
pub(super) fn memory(s: &Nvml, d: &Device) -> (u64, u64) {
    // Memory of processes that were killed goes back to the device, as with the real driver.
    s.shared.reclaim_dead();
    let ds = s.shared.dev(d.index);
    let total = ds.mem_total.load(Acquire);
    (total, ds.mem_used.load(Acquire).min(total))
}

pub(super) fn gpu_utilisation(s: &Nvml, d: &Device) -> f64 {
    s.shared
        .dev(d.index)
        .window
        .utilisation(now_ns(), UTIL_WINDOW_NS)
}
