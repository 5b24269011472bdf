//! Without a CUDA driver the jobs fail with one clear line, not a panic.

use std::process::Command;

fn run(bin: &str) -> std::process::Output {
    Command::new(bin)
        .args(["--duration", "0"])
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("LD_PRELOAD")
        .output()
        .expect("spawn job")
}

#[test]
fn jobs_fail_cleanly_without_libcuda() {
    for (name, bin) in [
        ("simjob-train", env!("CARGO_BIN_EXE_simjob-train")),
        ("simjob-infer", env!("CARGO_BIN_EXE_simjob-infer")),
        ("simjob-saturate", env!("CARGO_BIN_EXE_simjob-saturate")),
    ] {
        let out = run(bin);
        if out.status.success() {
            // A real driver is installed system-wide: nothing to check here.
            continue;
        }
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            err.lines().count(),
            1,
            "{name}: expected one line, got {err:?}"
        );
        assert!(err.starts_with(&format!("{name}: ")), "{name}: {err:?}");
        assert!(!err.contains("panicked"), "{name}: {err:?}");
        if err.contains("no CUDA driver") {
            assert!(err.contains("libcuda.so.1 not found"), "{name}: {err:?}");
        }
        assert_eq!(out.status.code(), Some(1), "{name}: {err:?}");
    }
}

#[test]
fn help_works() {
    for bin in [
        env!("CARGO_BIN_EXE_simjob-train"),
        env!("CARGO_BIN_EXE_simjob-infer"),
        env!("CARGO_BIN_EXE_simjob-saturate"),
    ] {
        let out = Command::new(bin).arg("--help").output().unwrap();
        assert!(out.status.success());
        assert!(String::from_utf8_lossy(&out.stdout).contains("--duration"));
    }
}
