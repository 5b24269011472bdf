//! The cudart C test (`tests/cuda/rt_test.c`), compiled with gcc against the real cudart 12.9 and
//! 13.5 from the pip wheels, run on simgpu with an 8 GiB device.

use libshare_tests::{compile_c, Cudart, SimGpu};

const EIGHT_GIB: u64 = 8 << 30;

fn facts(stdout: &str) -> std::collections::HashMap<String, String> {
    stdout
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn run_rt_test(cudart: Cudart) {
    let bin = compile_c("rt_test.c", cudart);
    let gpu = SimGpu::new().memory("8GiB");
    let out = gpu.run_ok(&bin, &[EIGHT_GIB.to_string()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.lines().any(|l| l == "OK"),
        "rt_test did not print OK:\n{stdout}"
    );
    let f = facts(&stdout);
    assert_eq!(f["total_global_mem"], EIGHT_GIB.to_string());
    assert_eq!(f["mem_total"], EIGHT_GIB.to_string());
    let free_before: u64 = f["mem_free_before"].parse().unwrap();
    let free_after: u64 = f["mem_free_after"].parse().unwrap();
    assert!(free_before - free_after >= 256 << 20);
    let driver: i64 = f["driver_version"].parse().unwrap();
    let runtime: i64 = f["runtime_version"].parse().unwrap();
    assert!(
        driver >= runtime,
        "driver {driver} older than runtime {runtime}"
    );
    gpu.assert_no_stub_calls();
}

#[test]
fn cudart_12_9() {
    run_rt_test(Cudart::V12);
}

#[test]
fn cudart_13_5() {
    run_rt_test(Cudart::V13);
}
