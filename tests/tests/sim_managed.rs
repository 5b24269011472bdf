//! simgpu's unified memory against what NVIDIA's driver does (issue 20, Build 1; where each rule
//! comes from: `simgpu/README.md` § Managed memory). Each test fails on a model that differs:
//! eviction by kernel accesses the driver never sees, prefetches priced as faults, no PCIe
//! counters, a dead process's chunks written back as if alive. The program is
//! `tests/cuda/sim_managed.c` (driver API, one kernel, timed with events).

use libshare_tests::{assert_close, compile_gcc, json_check, SimGpu};
use std::path::PathBuf;

const MIB: f64 = 1024.0 * 1024.0;
/// simgpu's defaults (`simgpu/README.md` § Configuration): one fault batch per 2 MiB chunk
/// faulted in, fault-driven migration at 12 GB/s, the copy engine (prefetch, write-back,
/// remote reads) at 25 GB/s.
const FAULT_MS: f64 = 0.020;
const FAULT_BW: f64 = 12e9;
const PCIE_BW: f64 = 25e9;
/// A 32-thread, one-block kernel: `kernel_base` + one wave.
const KERNEL_MS: f64 = 0.015;

fn program() -> PathBuf {
    compile_gcc("sim_managed.c", "sim_managed", &["-lcuda"])
}

fn run(gpu: &SimGpu, mode: &str) -> serde_json::Value {
    json_check(&gpu.run_ok(program(), &[mode]), mode)
}

fn f(v: &serde_json::Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("no {key} in {v}"))
}

/// Modelled ms of faulting `mib` MiB in by a kernel, with no eviction.
fn fault_in_ms(mib: f64) -> f64 {
    (mib / 2.0) * FAULT_MS + mib * MIB / FAULT_BW * 1e3
}

#[test]
fn eviction_follows_migration_order_not_kernel_accesses() {
    // The driver keeps resident chunks on an LRU list ordered by when they were allocated to a
    // VA block (migrated in); accesses to resident pages never reach it. So after A then B were
    // migrated in, A is evicted for a cuMemAlloc however often kernels touched it since.
    let v = run(&SimGpu::new().memory("256MiB"), "lru");
    let b_ms = f(&v, "b_ms");
    assert!(
        b_ms < 1.0,
        "B, migrated in last, stayed resident: its kernel took {b_ms} ms (a fault would add ~{:.1} ms): {v}",
        fault_in_ms(96.0)
    );
    // cuMemAlloc returned once the 96 MiB were written back (wall time; the host may add).
    let alloc_ms = f(&v, "alloc_ms");
    let write_back = 96.0 * MIB / PCIE_BW * 1e3;
    assert!(
        alloc_ms >= write_back && alloc_ms < write_back + 50.0,
        "cuMemAlloc took {alloc_ms} ms, the write-back {write_back} ms: {v}"
    );
    // A comes back by faults, writing B back to make room.
    let a_ms = f(&v, "a_ms");
    let expected = fault_in_ms(96.0) + 96.0 * MIB / PCIE_BW * 1e3 + KERNEL_MS;
    assert_close("A faulted back in, B written back", a_ms, expected, 0.05);
}

#[test]
fn faults_cost_a_batch_each_and_less_throughput_than_a_prefetch() {
    let v = run(&SimGpu::new().memory("1GiB"), "costs");
    // Fault-driven: one batch per 2 MiB chunk plus the chunk at the fault-driven rate.
    assert_close(
        "kernel faulting 256 MiB in (ms)",
        f(&v, "fault_ms"),
        fault_in_ms(256.0) + KERNEL_MS,
        0.05,
    );
    // A prefetch moves the same bytes on the copy engine at its bandwidth, with no fault cost.
    let prefetch = f(&v, "prefetch_ms");
    assert_close(
        "prefetch of 256 MiB (ms)",
        prefetch,
        256.0 * MIB / PCIE_BW * 1e3,
        0.05,
    );
    assert!(f(&v, "fault_ms") > 2.0 * prefetch, "{v}");
    // Preferred location CPU: read over PCIe at every kernel, never resident.
    for r in v["remote_ms"].as_array().unwrap() {
        assert_close(
            "kernel reading 64 MiB advised to the CPU (ms)",
            r.as_f64().unwrap(),
            64.0 * MIB / PCIE_BW * 1e3 + KERNEL_MS,
            0.05,
        );
    }
    assert_eq!(v["remote_resident"], 0, "nothing migrated: {v}");
}

#[test]
fn nvml_counts_resident_managed_memory_and_pcie_traffic() {
    let v = run(&SimGpu::new().memory("1GiB"), "nvml");
    let used: Vec<u64> = v["used"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u.as_u64().unwrap())
        .collect();
    let mib = 1u64 << 20;
    assert_eq!(used[1], used[0], "allocation takes no device memory: {v}");
    assert_eq!(
        used[2],
        used[0] + 256 * mib,
        "the faulted-in chunks are used: {v}"
    );
    assert_eq!(used[3], used[0], "prefetched to the host: freed: {v}");
    // KB/s over NVML's 20 ms sample (averaged over simgpu's 16 ms buckets that cover it, so
    // between a third of the rate and the rate itself).
    let rx = f(&v, "rx");
    assert!(
        rx > FAULT_BW / 1e3 * 0.3 && rx < PCIE_BW / 1e3 * 1.05,
        "RX while faulting in: {v}"
    );
    let tx = f(&v, "tx");
    assert!(
        tx > PCIE_BW / 1e3 * 0.2 && tx < PCIE_BW / 1e3 * 1.05,
        "TX while prefetching to the host: {v}"
    );
    assert_eq!(
        (&v["rx_idle"], &v["tx_idle"]),
        (&0.into(), &0.into()),
        "{v}"
    );
}

#[test]
fn a_dead_process_residency_goes_with_it_without_write_back() {
    // A process killed with chunks resident loses them at once (the driver tears its VA space
    // down): another process faulting in pays no write-back for them, and NVML counts only its.
    let gpu = SimGpu::new().memory("256MiB");
    let mut hold = gpu.command(program());
    hold.args(["hold", "192"]);
    let mut holder = gpu.spawn(hold);
    holder.wait_for_line(r#"{"check":"hold"}"#);
    let mut after = gpu.command(program());
    after.arg("after_death");
    let mut next = gpu.spawn(after);
    next.wait_for_line(r#"{"check":"ready"}"#);
    holder.child.kill().expect("kill -9");
    holder.child.wait().expect("reap");
    next.send("go\n");
    let out = next.finish();
    let v = json_check(&out, "after_death");
    assert_close(
        "kernel faulting 192 MiB in after the death (ms)",
        f(&v, "ms"),
        fault_in_ms(192.0) + KERNEL_MS,
        0.05,
    );
    assert_close(
        "the same with nobody else's chunks ever resident (ms)",
        f(&v, "ms"),
        f(&v, "control_ms"),
        0.03,
    );
    assert_eq!(v["used"], 192 * (1 << 20), "{v}");
}
