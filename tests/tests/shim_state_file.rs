//! Issue 6 item 8, at the job's side: a container state file that cannot be used refuses
//! `cuInit` with one line (never a per-process quota of its own), and a `DAEMON_MANAGED` flag
//! with no daemon behind it never lifts the environment's limit.

use libshare_tests::{compile_gcc, describe, SimGpu};
use std::sync::atomic::Ordering::{AcqRel, Acquire};

const MIB: u64 = 1 << 20;

fn state_path(gpu: &SimGpu) -> std::path::PathBuf {
    gpu.shim_state_dir()
        .join("containers/default")
        .join(libshare_abi::STATE_FILE)
}

/// `shim_driver try <MiB>…` under the shim with a 256 MiB quota; the first run makes the file.
fn machine() -> (SimGpu, std::path::PathBuf) {
    let bin = compile_gcc("shim_driver.c", "shim_driver", &[]);
    let gpu = SimGpu::new().memory("8GiB").with_shim().quota("256MiB");
    gpu.run_ok(&bin, &["try", "1"]);
    assert!(state_path(&gpu).exists());
    (gpu, bin)
}

#[test]
fn shim_a_corrupt_state_file_refuses_cuinit_in_one_line() {
    let (gpu, bin) = machine();
    let path = state_path(&gpu);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[..8].copy_from_slice(b"garbage!");
    std::fs::write(&path, &bytes).unwrap();
    let out = gpu.run_cmd({
        let mut cmd = gpu.command(&bin);
        cmd.args(["try", "300"]);
        cmd
    });
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success(),
        "the job ran on a corrupt state\n{}",
        describe(&out)
    );
    assert!(
        !stdout.contains("alloc_300_rc=0"),
        "an allocation went through\n{}",
        describe(&out)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("libshare:"))
        .collect();
    assert_eq!(lines.len(), 1, "{}", describe(&out));
    assert!(
        lines[0].contains("state.shm"),
        "the line names the file: {}",
        lines[0]
    );
    assert_eq!(
        gpu.sim_mem_peak(0, 8 << 30),
        MIB,
        "only the first run's 1 MiB was allocated"
    );
}

#[test]
fn shim_a_daemon_flag_without_a_daemon_keeps_the_environments_limit() {
    let (gpu, bin) = machine();
    {
        // What a crashed or removed daemon would leave: the flag, and no quota.
        let st = libshare_abi::State::open_existing(&state_path(&gpu)).unwrap();
        st.header()
            .flags
            .fetch_or(libshare_abi::FLAG_DAEMON_MANAGED, AcqRel);
        st.set_quota(0, 0);
        drop(st);
    }
    let out = gpu.run_ok(&bin, &["try", "300", "200"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("alloc_300_rc=2\n"),
        "300 MiB over the 256 MiB limit\n{stdout}"
    );
    assert!(stdout.contains("alloc_200_rc=0\n"), "{stdout}");
    let st = gpu.container_state("default");
    assert_eq!(st.device(0).quota.load(Acquire), 256 * MIB);
    assert!(gpu.sim_mem_peak(0, 8 << 30) <= 256 * MIB);
}
