//! A VMM allocation released (`cuMemRelease`) while still mapped keeps its device memory until
//! its last `cuMemUnmap`, as CUDA documents (and simgpu does: `sim_free.rs`). The quota must keep
//! charging it: under a 512 MiB quota on an 8 GiB device, 384 MiB mapped and released leave no
//! room for 384 MiB more until the unmap.

use libshare_tests::{compile_gcc, json_check, SimGpu};

/// Before the shim tracked mappings (563a677) the second 384 MiB was granted and the device held
/// 768 MiB under the 512 MiB quota.
#[test]
fn shim_quota_charges_vmm_memory_until_its_last_unmap() {
    let prog = compile_gcc("sim_free.c", "sim_free", &["-lcuda"]);
    let gpu = SimGpu::new().memory("8GiB").with_shim().quota("512MiB");
    let out = gpu.run_ok(&prog, &["vmm_release_mapped"]);
    let v = json_check(&out, "vmm_release_mapped");
    assert_eq!(v["second"], 2, "CUDA_ERROR_OUT_OF_MEMORY while mapped: {v}");
    assert_eq!(v["after_unmap"], 0, "{v}");
    let peak = gpu.sim_mem_peak(0, 8 << 30);
    assert!(
        peak <= 512 << 20,
        "the device held {peak} bytes under the quota"
    );
}
