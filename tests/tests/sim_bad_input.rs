//! Bad input gets one clear error and no crash (design §9): an invalid `SIMGPU_MEMORY`, an unknown
//! export-table UUID, a bogus `CUfunction`; and the ToolsModule export table's unknown slots are
//! errors, never silent success.

use libshare_tests::{compile_c, compile_driver_c, describe, Cudart, SimGpu};

const CUDA_ERROR_NOT_SUPPORTED: i64 = 801;
const CUDA_ERROR_INVALID_HANDLE: i64 = 400;

fn fact(stdout: &str, key: &str) -> Option<String> {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('=').map(str::to_owned))
}

#[test]
fn invalid_simgpu_memory_is_one_clear_error() {
    let bin = compile_c("rt_test.c", Cudart::V13);
    let gpu = SimGpu::new().memory("banana");
    let out = gpu.run(std::process::Command::new(&bin));
    assert!(
        !out.status.success(),
        "rt_test succeeded with SIMGPU_MEMORY=banana\n{}",
        describe(&out)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let naming: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("SIMGPU_MEMORY"))
        .collect();
    assert_eq!(
        naming.len(),
        1,
        "expected exactly one stderr line naming SIMGPU_MEMORY\n{}",
        describe(&out)
    );
    assert!(
        naming[0].contains("banana"),
        "the error should show the bad value: {}",
        naming[0]
    );
    // The program saw a CUDA error, not a crash.
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("FAIL "));
}

#[test]
fn unknown_export_table_is_not_supported() {
    let bin = compile_driver_c("driver_api_test.c");
    let gpu = SimGpu::new();
    let out = gpu.run_ok(&bin, &["export_table"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        fact(&stdout, "unknown_rc").as_deref(),
        Some(CUDA_ERROR_NOT_SUPPORTED.to_string().as_str())
    );
    assert_eq!(fact(&stdout, "unknown_table").as_deref(), Some("(nil)"));
    assert!(stdout.lines().any(|l| l == "OK"), "{stdout}");
}

/// The ToolsModule export table cuFFT walks modules with: slot 7 visits each function of a module
/// (the handles `cuModuleGetFunction` gives), nothing for an unknown module; unknown slots are
/// logging stubs that return an error and show up as stub calls.
#[test]
fn tools_module_export_table_visits_module_functions() {
    let bin = compile_driver_c("driver_api_test.c");
    let gpu = SimGpu::new();
    let out = gpu.run_ok(&bin, &["tools_module"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.lines().any(|l| l == "OK"), "{stdout}");
    assert_eq!(fact(&stdout, "visited").as_deref(), Some("2"), "{stdout}");
    assert_eq!(fact(&stdout, "bogus_module_visited").as_deref(), Some("0"));
    assert_eq!(
        fact(&stdout, "unknown_slot_rc").as_deref(),
        Some(CUDA_ERROR_NOT_SUPPORTED.to_string().as_str())
    );
    assert_eq!(
        gpu.stub_calls(),
        vec!["stub export-table-slot tools_module[1]".to_string()]
    );
}

#[test]
fn launch_with_bogus_function_handle_or_dimensions_fails_cleanly() {
    let bin = compile_driver_c("driver_api_test.c");
    let gpu = SimGpu::new();
    let out = gpu.run_ok(&bin, &["bogus_launch"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        fact(&stdout, "bogus_launch_rc").as_deref(),
        Some(CUDA_ERROR_INVALID_HANDLE.to_string().as_str()),
        "{stdout}"
    );
    assert_eq!(fact(&stdout, "bad_dims_refused").as_deref(), Some("6"));
    assert_eq!(fact(&stdout, "sync_rc").as_deref(), Some("0"));
    assert!(stdout.lines().any(|l| l == "OK"), "{stdout}");
}
