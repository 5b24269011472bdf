//! The last `cuDevicePrimaryCtxRelease` destroys the primary context with its memory (CUDA
//! resets it; simgpu frees it: `sim_free.rs`), so the quota must get those bytes back: under the
//! shim, `cuMemGetInfo` after the last release shows the container's use back where it started.

use libshare_tests::{compile_gcc, json_check, SimGpu};

/// Measured at 9b7da1a: 121634816 bytes (100 MiB + a 16 MiB array) stay charged after the last
/// release although the device freed them (issue 6 item 11: the release is not hooked).
#[test]
fn shim_last_primary_release_returns_its_memory_to_the_quota() {
    let prog = compile_gcc("sim_free.c", "sim_free", &["-lcuda"]);
    let gpu = SimGpu::new().memory("8GiB").with_shim().quota("1GiB");
    let out = gpu.run_ok(&prog, &["primary"]);
    let v = json_check(&out, "primary");
    let base = v["base"].as_u64().unwrap();
    assert_eq!(v["allocated"].as_u64().unwrap(), base + (116 << 20), "{v}");
    assert_eq!(v["after_first_release"], v["allocated"], "{v}");
    assert_eq!(v["after_last_release"].as_u64().unwrap(), base, "{v}");
}
