//! Issue 3, must-show 3: PyTorch under `LIBSHARE_MEMORY_LIMIT=1GiB` on an 8 GiB simulated device
//! (`tests/python/shim_quota.py`): allocating past 1 GiB raises `torch.OutOfMemoryError` (not
//! another error), `torch.cuda.mem_get_info()` reports a total of 1 GiB and a free value
//! consistent with what PyTorch holds, the process stays usable, and after `del` +
//! `empty_cache()` the quota is available again — with the native caching allocator,
//! `backend:cudaMallocAsync` (stream-ordered allocations from the driver's pool) and
//! `expandable_segments:True` (cuMemCreate/cuMemMap).

use libshare_tests::{describe, json_lines, python_source, torch_python, SimGpu};
use std::sync::atomic::Ordering::Acquire;

const GIB: u64 = 1 << 30;

fn torch_quota(alloc_conf: Option<&str>, backend: &str) {
    let script = python_source("shim_quota.py");
    let mut gpu = SimGpu::new().memory("8GiB").with_shim().quota("1GiB");
    if let Some(conf) = alloc_conf {
        gpu = gpu.env("PYTORCH_CUDA_ALLOC_CONF", conf);
    }
    let out = gpu.run_cmd_ok(|| {
        let mut cmd = gpu.command(torch_python());
        cmd.arg(&script).arg(GIB.to_string());
        if alloc_conf.is_none() {
            cmd.env_remove("PYTORCH_CUDA_ALLOC_CONF");
        }
        cmd
    });
    let lines = json_lines(&out);
    let step = |name: &str| {
        lines
            .iter()
            .find(|v| v["step"] == name)
            .unwrap_or_else(|| panic!("step {name} missing\n{}", describe(&out)))
            .clone()
    };
    for s in [
        "init",
        "fill",
        "over_quota",
        "still_usable",
        "freed",
        "again",
    ] {
        assert_eq!(step(s)["ok"], true, "{}", describe(&out));
    }
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l == "OK"),
        "{}",
        describe(&out)
    );
    let init = step("init");
    assert_eq!(init["backend"], backend, "allocator backend: {init}");
    assert_eq!(init["total"], GIB, "{init}");
    assert_eq!(init["total_memory"], GIB, "{init}");
    assert_eq!(step("over_quota")["error"], "OutOfMemoryError");
    assert_eq!(
        step("freed")["free"],
        GIB,
        "everything freed: {}",
        step("freed")
    );

    // The shim refused at least one allocation, never let the container pass the quota, and
    // nothing stays charged once the process has exited.
    let st = gpu.container_state("default");
    let dev = st.device(0);
    assert_eq!(dev.quota.load(Acquire), GIB);
    assert!(
        dev.oom.load(Acquire) >= 1,
        "no allocation refused by the shim"
    );
    let peak = dev.peak.load(Acquire);
    assert!(
        (896 << 20..=GIB).contains(&peak),
        "shim peak {peak} (quota {GIB})"
    );
    assert_eq!(dev.used.load(Acquire), 0, "memory left charged after exit");
    gpu.assert_no_stub_calls();
}

#[test]
fn shim_torch_native_allocator_quota() {
    torch_quota(None, "native");
}

#[test]
fn shim_torch_cuda_malloc_async_quota() {
    torch_quota(Some("backend:cudaMallocAsync"), "cudaMallocAsync");
}

#[test]
fn shim_torch_expandable_segments_quota() {
    torch_quota(Some("expandable_segments:True"), "native");
}
