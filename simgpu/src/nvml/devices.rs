//! NVML exports: devices and handles.

use super::*;

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
pub(super) const PCIE_WINDOW_NS: u64 = 20_000_000;

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
pub(super) fn clock_mhz(kind: c_uint) -> Result<c_uint, NvmlReturn> {
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
