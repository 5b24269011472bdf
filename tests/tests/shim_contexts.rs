//! Destroying a created context (or resetting the primary one) frees its allocations; the shim
//! returns them to the container's quota, as without the shim simgpu returns them to the device.

use libshare_tests::{compile_gcc, json_check, SimGpu};

#[test]
fn destroyed_context_memory_returns_to_the_quota() {
    let prog = compile_gcc("ctx_destroy.c", "ctx_destroy", &["-lcuda"]);
    for gpu in [
        SimGpu::new().memory("1GiB"),
        SimGpu::new().with_shim().quota("1GiB"),
    ] {
        let out = gpu.run_ok(&prog, &[] as &[&str]);
        let v = json_check(&out, "ctx_destroy");
        assert_eq!(v["before"], 1024, "{v}");
        assert_eq!(v["allocated"], 724, "{v}");
        assert_eq!(v["after_destroy"], 1024, "{v}");
    }
}
