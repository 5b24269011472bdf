//! Memory of a process killed with SIGKILL (no exit handlers run) returns to its container's
//! quota within a second, with no daemon: the next process that needs it reclaims the dead
//! process's slot (design §3.3). And memory freed by exit handlers that run after the shim's
//! is not returned to the quota a second time.

use libshare_tests::{compile_gcc, SimGpu};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CUDA_ERROR_OUT_OF_MEMORY: i64 = 2;

fn try_alloc(gpu: &SimGpu, prog: &std::path::Path, mib: u32) -> i64 {
    let out = gpu.run_ok(prog, &["try", &mib.to_string()]);
    libshare_tests::json_check(&out, "try")["result"]
        .as_i64()
        .unwrap()
}

#[test]
fn killed_process_memory_returns_to_the_quota_within_a_second() {
    let prog = compile_gcc("hold_memory.c", "hold_memory", &["-lcuda"]);
    let gpu = SimGpu::new()
        .with_shim()
        .quota("1GiB")
        .env("LIBSHARE_CONTAINER", "batch");

    let mut cmd = Command::new(&prog);
    cmd.args(["hold", "600"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    gpu.configure(&mut cmd);
    let mut holder = cmd.spawn().expect("spawn holder");
    let mut line = String::new();
    BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut line)
        .expect("read holder");
    assert!(
        line.contains("\"result\":0"),
        "the holder could not allocate: {line}"
    );

    // The quota is shared: 600 of 1024 MiB are held, so another 600 MiB do not fit.
    assert_eq!(try_alloc(&gpu, &prog, 600), CUDA_ERROR_OUT_OF_MEMORY);

    holder.kill().expect("SIGKILL");
    holder.wait().expect("reap");
    let killed = Instant::now();
    let r = try_alloc(&gpu, &prog, 600);
    let took = killed.elapsed();
    assert_eq!(r, 0, "600 MiB still charged to the killed process");
    assert!(
        took < Duration::from_secs(1),
        "took {took:?} to get the memory back"
    );

    // Nothing is left charged once every process is gone.
    let st = gpu.container_state("batch");
    assert_eq!(
        st.device(0).used.load(std::sync::atomic::Ordering::Acquire),
        0
    );
}

#[test]
fn frees_after_the_exit_handler_do_not_return_memory_twice() {
    let holder_prog = compile_gcc("hold_memory.c", "hold_memory", &["-lcuda"]);
    let late_free = compile_gcc("late_free.c", "late_free", &["-lcuda"]);
    let gpu = SimGpu::new()
        .with_shim()
        .quota("4GiB")
        .env("LIBSHARE_CONTAINER", "c");
    let mut cmd = Command::new(&holder_prog);
    cmd.args(["hold", "600"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    gpu.configure(&mut cmd);
    let mut holder = cmd.spawn().expect("spawn holder");
    let mut line = String::new();
    BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("\"result\":0"), "{line}");

    gpu.run_ok(&late_free, &[] as &[&str]);
    let used = gpu
        .container_state("c")
        .device(0)
        .used
        .load(std::sync::atomic::Ordering::Acquire);
    holder.kill().ok();
    holder.wait().ok();
    assert_eq!(
        used,
        600 << 20,
        "the live holder's 600 MiB must stay charged"
    );
}
