//! Devices: count, identity, attributes (an A100-like table that follows the configuration).

use std::ffi::c_char;

use super::{out, R};
use crate::config::DeviceConfig;
use crate::driver;
use crate::sim::sim;
use crate::types::*;

/// The memory clock (`CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE`, kHz) of a device whose memory
/// moves `hbm` bytes per second on its 5120-bit bus (double data rate): an A100's 1215 MHz at
/// the default bandwidth, else the clock that gives the configured bandwidth, so that clock ×
/// bus width (how CUDA's samples and sharing layers derive a device's bandwidth) agrees with
/// the cost model.
pub fn memory_clock_khz(hbm: u64) -> i32 {
    if hbm == crate::config::CostModel::default().hbm_bytes_per_s {
        return 1215000;
    }
    (hbm / (2 * 5120 / 8) / 1000).clamp(1, i32::MAX as u64) as i32
}

/// `cuDeviceGetAttribute` values for `d` (attribute ids from `cuda.h`; unknown ids answer 0).
/// Values an A100-class device reports; SM count, compute capability and PCI ids follow the config.
pub fn attribute(d: &DeviceConfig, attr: i32) -> i32 {
    match attr {
        1..=3 => 1024, // max threads per block, max block dim x, y
        4 => 64,       // max block dim z
        5 => i32::MAX, // max grid dim x
        6 | 7 => 65535,
        8 => 49152, // max shared memory per block
        9 => 65536, // total constant memory
        10 => 32,   // warp size
        11 => i32::MAX,
        12 => 65536,   // registers per block
        13 => 1410000, // clock kHz
        14 => 512,     // texture alignment
        15 => 1,       // gpu overlap
        16 => d.sm_count as i32,
        17 => 0, // kernel exec timeout
        18 => 0, // integrated
        19 => 1, // can map host memory
        20 => 0, // compute mode default
        21 | 22 => 131072,
        23 => 65536,
        24..=26 => 16384,
        27 | 28 => 32768,
        29 => 2048,
        30 => 512, // surface alignment
        31 => 1,   // concurrent kernels
        32 => 1,   // ECC enabled
        33 => d.pci_bus as i32,
        34 => d.pci_device as i32,
        35 => 0, // TCC driver
        36 => 1215000,
        37 => 5120,
        38 => 41943040, // L2 bytes
        39 => 2048,     // max threads per SM
        40 => 3,        // async engine count
        41 => 1,        // unified addressing
        42 => 32768,    // max texture 1D layered width, layers
        43 => 2048,
        44 => 1, // can texture 2D gather
        45 | 46 => 32768,
        47 | 48 => 8192, // max texture 3D alternate width, height, depth
        49 => 32768,
        50 => d.pci_domain as i32,
        51 => 32,    // texture pitch alignment
        52 => 32768, // max texture cubemap width
        53 => 32768, // max texture cubemap layered width, layers
        54 => 2046,
        55 => 32768,  // max surface 1D width
        56 => 131072, // max surface 2D width, height
        57 => 65536,
        58..=60 => 16384, // max surface 3D width, height, depth
        61 => 32768,      // max surface 1D layered width, layers
        62 => 2048,
        63 | 64 => 32768, // max surface 2D layered width, height, layers
        65 => 2048,
        66 | 67 => 32768, // max surface cubemap (layered) width, layers
        68 => 2046,
        69 => 268435456, // max texture 1D linear width
        70 => 131072,    // max texture 2D linear width, height, pitch
        71 => 65000,
        72 => 2097120,
        73 | 74 => 32768, // max texture 2D mipmapped width, height
        75 => d.compute_capability.0 as i32,
        76 => d.compute_capability.1 as i32,
        77 => 32768,  // max texture 1D mipmapped width
        78 => 1,      // stream priorities supported
        79 => 1,      // global L1 cache supported
        80 => 1,      // local L1 cache supported
        81 => 167936, // max shared memory per SM
        82 => 65536,  // registers per SM
        83 => 1,      // managed memory
        84 => 0,      // multi-GPU board
        85 => 0,
        86 => 1, // host native atomics
        87 => 2, // single-to-double perf ratio
        88 => 1, // pageable memory access
        89 => 1, // concurrent managed access
        90 => 1, // compute preemption
        91 => 1, // can use host pointer for registered mem
        95 => 1, // cooperative launch
        96 => 1,
        97 => 166912, // max shared memory per block optin
        98 => 1,      // can flush remote writes
        99 => 1,      // host register supported
        100 => 0,
        101 => 0,
        102 => 1, // virtual memory management supported
        103 => 1, // handle type posix fd supported
        104 | 105 => 0,
        106 => 32,       // max blocks per SM
        107 => 1,        // generic compression
        108 => 31457280, // max persisting L2
        109 => 134213632,
        110 => 0,
        111 => 1024, // reserved shared memory per block
        112 => 1,    // sparse CUDA arrays
        113 => 1,    // read-only host register
        114 => 0,
        115 => 1, // memory pools supported
        116 => 0, // GPUDirect RDMA
        117 | 118 => 0,
        119 => 1, // memory pool handle types: POSIX file descriptor
        120 => (d.compute_capability.0 >= 9) as i32, // cluster launch
        121 => 1, // deferred mapping CUDA array
        124 => 1, // DMA-BUF
        125 => 1, // IPC events
        126 => 1, // memory synchronisation domains
        127 => 0,
        128 => 0, // fabric handles
        129 => 0,
        130 => 0,  // NUMA config: none
        131 => -1, // NUMA id
        133 => 0,  // MPS enabled
        134 => -1, // host NUMA id
        139 => crate::nvml::PCI_DEVICE_ID as i32,
        140 => crate::nvml::PCI_SUBSYSTEM_ID as i32,
        _ => 0,
    }
}

fn dev_cfg(dev: CUdevice) -> Result<&'static DeviceConfig, CUresult> {
    let s = sim()?;
    let i = s.device(dev)?;
    Ok(&s.cfg.devices[i])
}

/// Copies `s` (truncated to `len - 1` bytes) and a NUL into `dst`. Safety: a non-NULL `dst` has
/// room for `len` bytes (the application's buffer argument).
unsafe fn write_cstr(dst: *mut c_char, len: i32, s: &str) -> R {
    if dst.is_null() || len <= 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let n = s.len().min(len as usize - 1);
    // SAFETY: `dst` is not NULL and has `len` bytes (this fn's contract); `n + 1 <= len`, so the
    // copy and the NUL stay inside it; `s` is Rust memory, not the application's buffer.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr() as *const c_char, dst, n);
        *dst.add(n) = 0;
    }
    Ok(())
}

driver! {
    fn cuDeviceGetCount(count: *mut i32) {
        out(count, sim()?.ndev() as i32)
    }

    fn cuDeviceGet(device: *mut CUdevice, ordinal: i32) {
        sim()?.device(ordinal)?;
        out(device, ordinal)
    }

    fn cuDeviceGetName(name: *mut c_char, len: i32, dev: CUdevice) {
        write_cstr(name, len, &dev_cfg(dev)?.name)
    }

    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) {
        out(bytes, dev_cfg(dev)?.memory as usize)
    }

    fn cuDeviceTotalMem(bytes: *mut u32, dev: CUdevice) {
        out(bytes, dev_cfg(dev)?.memory.min(u32::MAX as u64) as u32)
    }

    fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) {
        out(uuid, CUuuid(dev_cfg(dev)?.uuid))
    }

    fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) {
        out(uuid, CUuuid(dev_cfg(dev)?.uuid))
    }

    fn cuDeviceGetAttribute(value: *mut i32, attr: i32, dev: CUdevice) {
        let v = match attr {
            36 => memory_clock_khz(sim()?.cfg.cost.hbm_bytes_per_s),
            _ => attribute(dev_cfg(dev)?, attr),
        };
        out(value, v)
    }

    fn cuDeviceComputeCapability(major: *mut i32, minor: *mut i32, dev: CUdevice) {
        let d = dev_cfg(dev)?;
        out(major, d.compute_capability.0 as i32)?;
        out(minor, d.compute_capability.1 as i32)
    }

    fn cuDeviceGetPCIBusId(id: *mut c_char, len: i32, dev: CUdevice) {
        let d = dev_cfg(dev)?;
        write_cstr(id, len, &format!("{:08X}:{:02X}:{:02X}.0", d.pci_domain, d.pci_bus, d.pci_device))
    }

    fn cuDeviceGetByPCIBusId(dev: *mut CUdevice, id: *const c_char) {
        let want = super::cstr(id)?.to_ascii_uppercase();
        let s = sim()?;
        for (i, d) in s.visible.iter().map(|&p| &s.cfg.devices[p]).enumerate() {
            let full = format!("{:08X}:{:02X}:{:02X}.0", d.pci_domain, d.pci_bus, d.pci_device);
            if full == want || full.ends_with(&want) {
                return out(dev, i as CUdevice);
            }
        }
        Err(CUDA_ERROR_INVALID_DEVICE)
    }

    // Every pair of distinct simulated devices is linked like the GPUs of one NVLink board:
    // peer access, native atomics and CUDA-array access supported, performance rank 0.
    fn cuDeviceCanAccessPeer(can: *mut i32, dev: CUdevice, peer: CUdevice) {
        let s = sim()?;
        let (a, b) = (s.device(dev)?, s.device(peer)?);
        out(can, (a != b) as i32)
    }

    fn cuDeviceGetP2PAttribute(value: *mut i32, attr: i32, src: CUdevice, dst: CUdevice) {
        let s = sim()?;
        if s.device(src)? == s.device(dst)? {
            return Err(CUDA_ERROR_INVALID_DEVICE);
        }
        let v = match attr {
            1 => 0,     // CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK
            2..=4 => 1, // access, native atomics, CUDA array access supported
            5 => 0,     // only partial native atomics
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        out(value, v)
    }

    fn cuDeviceGetLuid(_luid: *mut c_char, _mask: *mut u32, _dev: CUdevice) {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }

    fn cuDeviceGetExecAffinitySupport(pi: *mut i32, _kind: u32, dev: CUdevice) {
        dev_cfg(dev)?;
        out(pi, 0)
    }

    fn cuFlushGPUDirectRDMAWrites(_target: u32, _scope: u32) {
        Ok(())
    }
}

#[cfg(test)]
mod clock_tests {
    use super::memory_clock_khz;

    #[test]
    fn memory_clock_follows_the_configured_bandwidth() {
        assert_eq!(memory_clock_khz(1_500_000_000_000), 1215000, "an A100's");
        // 2 GB/s: clock × 2 × 640 bytes within 0.1 % of it.
        let bw = memory_clock_khz(2_000_000_000) as u64 * 1000 * 2 * 640;
        assert!((1_998_000_000..=2_000_000_000).contains(&bw), "{bw}");
    }
}
