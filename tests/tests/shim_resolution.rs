//! Issue 3, must-show 2: each way a program can get a driver entry point is intercepted, shown by
//! behaviour — an allocation through a pointer obtained that way is charged to a 1 GiB quota on an
//! 8 GiB simulated device, so a second 600 MiB allocation fails with CUDA_ERROR_OUT_OF_MEMORY
//! (the driver alone would grant it) and `cuMemGetInfo` obtained the same way reports the quota:
//! (a) direct calls of the exported symbols, (b) `dlsym` on a `dlopen("libcuda.so.1")` handle,
//! (c) `cuGetProcAddress` (v1), (d) `cuGetProcAddress_v2`, with and without the per-thread
//! default-stream flag — in (c) and (d) everything goes through what `cuGetProcAddress` returned
//! when asked for "cuGetProcAddress" itself.
//! Also: `dlsym(RTLD_NEXT, …)` from another library still returns the next definition after
//! *that* library with the shim preloaded (the naked `dlsym` trampoline).

use libshare_tests::{compile_gcc, describe, SimGpu};
use std::collections::HashMap;
use std::sync::atomic::Ordering::Acquire;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const CUDA_ERROR_OUT_OF_MEMORY: &str = "2";

fn facts(stdout: &str) -> HashMap<String, String> {
    stdout
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Runs `shim_driver quota <path>` under a 1 GiB quota on an 8 GiB device and checks that every
/// allocation and memory query made through that path went through the shim.
fn quota_through(path: &str) -> HashMap<String, String> {
    let bin = if path == "export" {
        compile_gcc(
            "shim_driver.c",
            "shim_driver_linked",
            &["-DSHIM_LINKED", "-lcuda"],
        )
    } else {
        compile_gcc("shim_driver.c", "shim_driver", &[])
    };
    let gpu = SimGpu::new().memory("8GiB").with_shim().quota("1GiB");
    let out = gpu.run_cmd_ok(|| {
        let mut cmd = gpu.command(&bin);
        cmd.args(["quota", path]);
        cmd
    });
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let f = facts(&stdout);
    let ctx = describe(&out);
    assert_eq!(f["path"], path, "{ctx}");
    // cuMemGetInfo through this path reports the quota, not the 8 GiB device.
    assert_eq!(f["total"], GIB.to_string(), "{ctx}");
    assert_eq!(f["free_start"], GIB.to_string(), "{ctx}");
    assert_eq!(f["alloc_600_rc"], "0", "{ctx}");
    assert_eq!(f["free_after_600"], (GIB - 600 * MIB).to_string(), "{ctx}");
    // Over quota: refused by the shim, although the simulated device has 8 GiB.
    assert_eq!(f["alloc_600_again_rc"], CUDA_ERROR_OUT_OF_MEMORY, "{ctx}");
    assert_eq!(f["alloc_300_rc"], "0", "{ctx}");
    assert_eq!(f["free_after_900"], (GIB - 900 * MIB).to_string(), "{ctx}");
    assert_eq!(f["free_end"], GIB.to_string(), "{ctx}");
    assert!(stdout.lines().any(|l| l == "OK"), "{ctx}");
    // The state file agrees: two charged allocations, one refusal, nothing left.
    let st = gpu.container_state("default");
    let dev = st.device(0);
    assert_eq!(dev.allocs.load(Acquire), 2, "{ctx}");
    assert_eq!(dev.oom.load(Acquire), 1, "{ctx}");
    assert_eq!(dev.used.load(Acquire), 0, "{ctx}");
    assert_eq!(dev.peak.load(Acquire), 900 * MIB, "{ctx}");
    assert_eq!(dev.quota.load(Acquire), GIB, "{ctx}");
    gpu.assert_no_stub_calls();
    f
}

#[test]
fn shim_exported_symbols_called_directly() {
    quota_through("export");
}

#[test]
fn shim_dlsym_on_the_driver_handle() {
    let f = quota_through("dlsym");
    assert_eq!(
        f["alloc_in_shim"], "1",
        "dlsym(libcuda, cuMemAlloc_v2) is not the shim's"
    );
}

#[test]
fn shim_cu_get_proc_address_v1_including_itself() {
    let f = quota_through("gpa");
    assert_eq!(
        f["gpa_self_in_shim"], "1",
        "cuGetProcAddress(\"cuGetProcAddress\", 11030) did not return the shim's wrapper"
    );
    assert_eq!(f["mem_alloc_in_shim"], "1");
}

#[test]
fn shim_cu_get_proc_address_v2_including_itself() {
    let f = quota_through("gpa_v2");
    assert_eq!(
        f["gpa_self_in_shim"], "1",
        "cuGetProcAddress_v2(\"cuGetProcAddress\", 12000) did not return the shim's wrapper"
    );
    assert_eq!(f["mem_alloc_in_shim"], "1");
}

#[test]
fn shim_cu_get_proc_address_v2_per_thread_default_stream() {
    // flags = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: cuMemAllocAsync at 11020 is the
    // _ptsz ABI entry, hooked, and the allocations go through it.
    let f = quota_through("gpa_v2_ptds");
    assert_eq!(f["alloc_async_symbol"], "cuMemAllocAsync_ptsz");
}

#[test]
fn shim_dlsym_rtld_next_from_another_library_returns_the_next_definition() {
    // libshim_rtld_next.so wraps puts() and finds the real one with dlsym(RTLD_NEXT, "puts").
    // Preloaded *after* the shim: if the shim's dlsym resolved RTLD_NEXT relative to itself, the
    // lookup would return the wrapper's own puts (the next object after the shim) and recurse.
    let lib = compile_gcc(
        "shim_rtld_next.c",
        "libshim_rtld_next.so",
        &["-shared", "-fPIC", "-DSHIM_RTLD_NEXT_LIB"],
    );
    let main = compile_gcc("shim_rtld_next.c", "shim_rtld_next", &[]);
    let gpu = SimGpu::new().with_shim();
    let preload = format!("{} {}", libshare_tests::shim_lib().display(), lib.display());
    let out = gpu.run_cmd({
        let mut cmd = gpu.command(&main);
        cmd.env("LD_PRELOAD", &preload);
        cmd
    });
    assert!(out.status.success(), "{}", describe(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        [
            "[wrapped] hello from main",
            "next_is_libc=1",
            "dlsym_is_shim=1"
        ],
        "{}",
        describe(&out)
    );
    assert!(out.stderr.is_empty(), "{}", describe(&out));
    // Control: the same without the shim.
    let plain = SimGpu::new();
    let out = plain.run_cmd({
        let mut cmd = plain.command(&main);
        cmd.env("LD_PRELOAD", &lib);
        cmd
    });
    assert_eq!(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .collect::<Vec<_>>(),
        [
            "[wrapped] hello from main",
            "next_is_libc=1",
            "dlsym_is_shim=0"
        ],
        "{}",
        describe(&out)
    );
}
