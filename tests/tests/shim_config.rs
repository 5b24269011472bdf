//! Issue 3, must-show 7: an invalid configuration fails the job at `cuInit` with exactly one line
//! on stderr, starting `libshare:` and naming the variable — never silently unlimited.
//! Cases: `LIBSHARE_MEMORY_LIMIT=banana`, a limit above the device (16 GiB on an 8 GiB device,
//! also per device and through HAMi's `CUDA_DEVICE_MEMORY_LIMIT`), `LIBSHARE_CLASS=unknown`. Run
//! with the cudart test (it exits 1 on the first CUDA error), and with a driver-API program that
//! ignores the failed `cuInit` and allocates anyway: the allocation fails.
//! Issue 6 item 10 adds the edges that used to pass silently: an empty limit, a device given
//! twice, `CUDA_DEVICE_MEMORY_LIMIT_16`/`_00` (which HAMi-core ignores), a context overhead not
//! below the quota; and a bare number in HAMi's variables is bytes, as HAMi-core reads it.
//! A misspelled `LIBSHARE_` variable is not fatal (the shim's policy since a192388: an unrelated
//! variable must not stop a production job) but is not silent either: one `libshare:` line names
//! it, and the job runs with the rest of its configuration.

use libshare_tests::{compile_c, compile_gcc, describe, Cudart, SimGpu};
use std::process::Output;

/// (variable, value, what the line must name, another variable set with it).
type Case = (
    &'static str,
    &'static str,
    &'static str,
    Option<(&'static str, &'static str)>,
);

const CASES: &[Case] = &[
    // A limit for a device the process does not have (simgpu has one by default).
    (
        "LIBSHARE_MEMORY_LIMIT",
        "1:4GiB",
        "LIBSHARE_MEMORY_LIMIT",
        None,
    ),
    (
        "LIBSHARE_MEMORY_LIMIT",
        "banana",
        "LIBSHARE_MEMORY_LIMIT",
        None,
    ),
    (
        "LIBSHARE_MEMORY_LIMIT",
        "16GiB",
        "LIBSHARE_MEMORY_LIMIT",
        None,
    ),
    (
        "LIBSHARE_MEMORY_LIMIT",
        "0:16GiB",
        "LIBSHARE_MEMORY_LIMIT",
        None,
    ),
    (
        "CUDA_DEVICE_MEMORY_LIMIT",
        "16g",
        "CUDA_DEVICE_MEMORY_LIMIT",
        None,
    ),
    ("LIBSHARE_CLASS", "unknown", "LIBSHARE_CLASS", None),
    // Issue 6 item 10: edges that used to pass silently.
    ("LIBSHARE_MEMORY_LIMIT", "", "LIBSHARE_MEMORY_LIMIT", None),
    (
        "CUDA_DEVICE_MEMORY_LIMIT",
        "",
        "CUDA_DEVICE_MEMORY_LIMIT",
        None,
    ),
    (
        "CUDA_DEVICE_MEMORY_LIMIT_0",
        "",
        "CUDA_DEVICE_MEMORY_LIMIT_0",
        None,
    ),
    (
        "LIBSHARE_MEMORY_LIMIT",
        "0:1GiB,0:2GiB",
        "LIBSHARE_MEMORY_LIMIT",
        None,
    ),
    (
        "CUDA_DEVICE_MEMORY_LIMIT_16",
        "1g",
        "CUDA_DEVICE_MEMORY_LIMIT_16",
        None,
    ),
    (
        "CUDA_DEVICE_MEMORY_LIMIT_00",
        "1g",
        "CUDA_DEVICE_MEMORY_LIMIT_00",
        None,
    ),
    // A bare HAMi number is bytes: 16 GiB of them do not fit the 8 GiB device.
    (
        "CUDA_DEVICE_MEMORY_LIMIT",
        "17179869184",
        "CUDA_DEVICE_MEMORY_LIMIT",
        None,
    ),
    (
        "LIBSHARE_CONTEXT_OVERHEAD",
        "300MiB",
        "LIBSHARE_CONTEXT_OVERHEAD",
        Some(("LIBSHARE_MEMORY_LIMIT", "256MiB")),
    ),
];

/// Exactly one stderr line starts with `libshare:`, it names `var`, and it is the only line the
/// shim printed.
fn one_clear_line(out: &Output, var: &str, value: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("libshare:"))
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "{var}={value}: expected exactly one `libshare:` line\n{}",
        describe(out)
    );
    assert!(
        lines[0].contains(var),
        "{var}={value}: the line does not name the variable: {}",
        lines[0]
    );
    assert!(
        stderr.lines().filter(|l| l.contains("libshare")).count() == 1,
        "{var}={value}: more output from the shim\n{stderr}"
    );
}

fn machine(var: &str, value: &str) -> SimGpu {
    SimGpu::new().memory("8GiB").with_shim().env(var, value)
}

fn case_machine((var, value, _, with): &Case) -> SimGpu {
    let gpu = machine(var, value);
    match with {
        Some((k, v)) => gpu.env(k, v),
        None => gpu,
    }
}

fn cudart_job_fails(cudart: Cudart) {
    let bin = compile_c("rt_test.c", cudart);
    for case @ (var, value, names, _) in CASES {
        let gpu = case_machine(case);
        let out = gpu.run_cmd(gpu.command(&bin));
        assert_eq!(
            out.status.code(),
            Some(1),
            "{var}={value}: the job must fail with a CUDA error (exit 1), not run or crash\n{}",
            describe(&out)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.lines().any(|l| l.starts_with("FAIL ")) && !stdout.contains("\nOK"),
            "{var}={value}\n{}",
            describe(&out)
        );
        one_clear_line(&out, names, value);
        // Nothing was allocated: the job never ran, limited or not.
        let sim = gpu.sim_counts();
        assert_eq!(sim.api_allocs, 0, "{var}={value}: {sim:?}");
    }
}

#[test]
fn shim_invalid_configuration_fails_cudart_12_9_job_at_cuinit() {
    cudart_job_fails(Cudart::V12);
}

#[test]
fn shim_invalid_configuration_fails_cudart_13_5_job_at_cuinit() {
    cudart_job_fails(Cudart::V13);
}

#[test]
fn shim_a_job_that_ignores_the_failed_cuinit_still_cannot_allocate() {
    let bin = compile_gcc("shim_driver.c", "shim_driver", &[]);
    for case @ (var, value, names, _) in CASES {
        let gpu = case_machine(case);
        let out = gpu.run_cmd({
            let mut cmd = gpu.command(&bin);
            cmd.arg("ignore_init");
            cmd
        });
        assert!(out.status.success(), "{var}={value}\n{}", describe(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with("init_rc=") && l != "init_rc=0"),
            "{var}={value}: cuInit succeeded\n{}",
            describe(&out)
        );
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with("alloc_rc=") && l != "alloc_rc=0"),
            "{var}={value}: allocated despite the invalid configuration\n{}",
            describe(&out)
        );
        one_clear_line(&out, names, value);
        assert_eq!(gpu.sim_counts().api_allocs, 0, "{var}={value}");
    }
}

#[test]
fn shim_a_misspelled_variable_is_named_in_one_line_and_the_rest_applies() {
    let bin = compile_c("rt_test.c", Cudart::V13);
    // The real limit (2 GiB) still applies next to the misspelled one.
    let gpu = machine("LIBSHARE_MEMROY_LIMIT", "1GiB").quota("2GiB");
    let out = gpu.run_cmd({
        let mut cmd = gpu.command(&bin);
        cmd.arg((2u64 << 30).to_string());
        cmd
    });
    assert!(out.status.success(), "{}", describe(&out));
    one_clear_line(&out, "LIBSHARE_MEMROY_LIMIT", "1GiB");
    // Nothing else was printed: no line for the valid variables.
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).lines().count(),
        1,
        "{}",
        describe(&out)
    );
}

#[test]
fn shim_valid_configurations_run() {
    // Controls for the cases above: the same variables with valid values work.
    let bin = compile_c("rt_test.c", Cudart::V13);
    for (var, value) in [
        ("LIBSHARE_MEMORY_LIMIT", "8GiB"),
        ("LIBSHARE_MEMORY_LIMIT", "0:4GiB"),
        ("CUDA_DEVICE_MEMORY_LIMIT", "4g"),
        ("LIBSHARE_CLASS", "opportunistic"),
        ("LIBSHARE_CONTAINER", "web-1"),
    ] {
        let gpu = machine(var, value);
        let out = gpu.run_cmd(gpu.command(&bin));
        assert!(out.status.success(), "{var}={value}\n{}", describe(&out));
        assert!(
            out.stderr.is_empty(),
            "{var}={value}: unexpected stderr\n{}",
            describe(&out)
        );
    }
}

#[test]
fn shim_a_bare_number_in_hami_variables_is_bytes_as_in_hami_core() {
    // The job sees exactly the quota (cudaMemGetInfo and totalGlobalMem = the argument): a bare
    // number read as MiB would have been a quota a million times larger (and refused as above the
    // device's 8 GiB).
    let bin = compile_c("rt_test.c", Cudart::V13);
    for (var, value, quota) in [
        ("CUDA_DEVICE_MEMORY_LIMIT", "1073741824", 1u64 << 30),
        ("CUDA_DEVICE_MEMORY_LIMIT_0", "2147483648", 2 << 30),
        ("CUDA_DEVICE_MEMORY_LIMIT", "1536m", 1536 << 20),
    ] {
        let gpu = machine(var, value);
        let out = gpu.run_cmd({
            let mut cmd = gpu.command(&bin);
            cmd.arg(quota.to_string());
            cmd
        });
        assert!(out.status.success(), "{var}={value}\n{}", describe(&out));
        assert!(
            out.stderr.is_empty(),
            "{var}={value}: unexpected stderr\n{}",
            describe(&out)
        );
    }
}
