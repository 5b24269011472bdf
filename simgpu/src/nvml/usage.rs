//! NVML exports: memory, utilisation and processes.

use super::*;

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
pub(super) unsafe fn compute_processes<T: Copy>(
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

pub(super) fn info_v2(pid: u32, used_gpu_memory: u64) -> NvmlProcessInfoV2 {
    NvmlProcessInfoV2 {
        pid,
        used_gpu_memory,
        gpu_instance_id: NVML_INSTANCE_ID_NONE,
        compute_instance_id: NVML_INSTANCE_ID_NONE,
    }
}

pub(super) fn info_v1(pid: u32, used_gpu_memory: u64) -> NvmlProcessInfoV1 {
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
pub(super) unsafe fn no_processes<T: Copy>(
    device: NvmlDevice,
    count: *mut c_uint,
    infos: *mut T,
) -> R {
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
