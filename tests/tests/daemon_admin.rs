//! Issue 10, live admin, on simgpu with the shim and a real `sharectl daemon`:
//! - `sharectl set` on a running job changes its memory quota (the job is refused what no
//!   longer fits), class and compute share; each time, from the command's start to the job's
//!   state showing it, is measured (≤ 100 ms);
//! - the daemon keeps the settings across a `kill -9` and restart, and applies them to a new
//!   instance of the container (its jobs' environment says otherwise);
//! - a non-root user cannot use the admin socket;
//! - bad input (garbage, oversized, truncated or silent clients; unknown containers; a quota
//!   above the device; malformed sizes and percentages) gets one clear line, changes nothing,
//!   and the daemon keeps serving.

use libshare_abi::CLASS_OPPORTUNISTIC;
use libshare_tests::{artifacts, compile_gcc, ok, until, Daemon, SimGpu};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::Ordering::Acquire;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

fn daemon(gpu: &SimGpu) -> Daemon {
    // NVML (the node's devices) comes from simgpu.
    let mut cmd = gpu.sharectl_cmd(&["daemon", "--trust-env"]);
    cmd.stdout(Stdio::null()).stderr(Stdio::inherit());
    libshare_tests::cgroups::start_daemon(gpu, cmd)
}

/// The one line a failed command printed.
fn refused(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let first = err.lines().next().unwrap_or("").to_string();
    assert!(
        first.starts_with("sharectl: ") || first.starts_with("error: "),
        "not one clear line: {err}"
    );
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{err}"
    );
    first
}

fn try_alloc(gpu: &SimGpu, container: &str, mib: u32) -> i64 {
    let prog = compile_gcc("hold_memory.c", "hold_memory", &["-lcuda"]);
    let mut cmd = Command::new(&prog);
    cmd.args(["try", &mib.to_string()]);
    gpu.configure(&mut cmd);
    cmd.env("LIBSHARE_CONTAINER", container);
    let out = cmd.output().unwrap();
    libshare_tests::json_check(&out, "try")["result"]
        .as_i64()
        .unwrap()
}

/// Runs `set ARGS` and measures from its start until `applied` holds.
fn set_and_time(gpu: &SimGpu, args: &[&str], applied: impl FnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    let mut full = vec!["set"];
    full.extend_from_slice(args);
    ok(&gpu.sharectl(&full));
    let _ =
        until(Duration::from_secs(5), applied).unwrap_or_else(|| panic!("{args:?} never applied"));
    t0.elapsed()
}

#[test]
fn daemon_admin_set_changes_a_running_job_within_100ms_and_survives_a_restart() {
    let gpu = SimGpu::new().with_shim().quota("1GiB");
    let mut d = Some(daemon(&gpu));
    let mut job = gpu.hold_memory("web", 64);
    let st = gpu.wait_container_state("web");
    assert_eq!(st.device(0).quota.load(Acquire), 1 << 30);

    let mem = set_and_time(&gpu, &["web", "--memory", "128MiB"], || {
        st.device(0).quota.load(Acquire) == 128 * MIB
    });
    assert_eq!(
        try_alloc(&gpu, "web", 100),
        2,
        "64 held + 100 MiB > the new 128 MiB quota: CUDA_ERROR_OUT_OF_MEMORY"
    );
    assert_eq!(try_alloc(&gpu, "web", 32), 0, "what fits still does");
    let class = set_and_time(&gpu, &["web", "--class", "opportunistic"], || {
        st.header().class.load(Acquire) == CLASS_OPPORTUNISTIC
    });
    let compute = set_and_time(&gpu, &["web", "--compute", "30%"], || {
        st.device(0).compute.load(Acquire) == 3_000
    });
    println!(
        "sharectl set on a running job: memory quota {} ms, class {} ms, compute share {} ms (command start to the job's state)",
        mem.as_millis(),
        class.as_millis(),
        compute.as_millis()
    );
    for (what, t) in [("memory", mem), ("class", class), ("compute", compute)] {
        assert!(t <= Duration::from_millis(100), "{what} took {t:?}");
    }
    let got = ok(&gpu.sharectl(&["get", "web", "--json"]));
    let v: serde_json::Value = serde_json::from_str(got.trim()).unwrap();
    assert_eq!(v["settings"]["all"]["memory"], 128 * MIB);
    assert_eq!(v["settings"]["class"], "opportunistic");
    assert_eq!(v["devices"][0]["used"], 64 * MIB);

    // Bad requests change nothing.
    let line = refused(&gpu.sharectl(&["set", "web", "--memory", "100TiB"]));
    assert!(line.contains("above device 0"), "{line}");
    for bad in [
        &["set", "web", "--memory", "-5MiB"][..],
        &["set", "web", "--memory", "lots"][..],
        &["set", "web", "--memory", "0"][..],
        &["set", "web", "--compute", "150%"][..],
        &["set", "web", "--compute", "-1"][..],
        &["set", "web", "--device", "7", "--memory", "1GiB"][..],
        &["get", "nobody-here"][..],
        &["reset", "nobody-here"][..],
        &["set", "../etc", "--weight", "2"][..],
    ] {
        let line = refused(&gpu.sharectl(bad));
        println!("{bad:?}: {line}");
    }
    assert_eq!(st.device(0).quota.load(Acquire), 128 * MIB, "unchanged");
    assert_eq!(st.device(0).compute.load(Acquire), 3_000, "unchanged");

    // kill -9 and restart: the settings are kept and reach a new instance of the container,
    // whatever its jobs' environment says.
    d.take().unwrap().kill9();
    let _d = daemon(&gpu);
    let got = ok(&gpu.sharectl(&["get", "web", "--json"]));
    let v: serde_json::Value = serde_json::from_str(got.trim()).unwrap();
    assert_eq!(v["settings"]["all"]["memory"], 128 * MIB, "{got}");
    job.kill().unwrap();
    job.wait().unwrap();
    drop(st);
    std::fs::remove_dir_all(gpu.shim_state_dir().join("containers/web")).unwrap();
    let mut job = gpu.hold_memory("web", 64);
    let st = gpu.wait_container_state("web");
    let took = until(Duration::from_secs(5), || {
        st.device(0).quota.load(Acquire) == 128 * MIB
            && st.header().class.load(Acquire) == CLASS_OPPORTUNISTIC
            && st.device(0).compute.load(Acquire) == 3_000
    })
    .expect("the restarted daemon never applied its settings to the new instance");
    println!(
        "new instance of the container: the daemon's settings applied after {} ms",
        took.as_millis()
    );
    assert_eq!(
        try_alloc(&gpu, "web", 100),
        2,
        "the daemon's 128 MiB, not the environment's 1 GiB"
    );

    // reset: the daemon forgets them.
    ok(&gpu.sharectl(&["reset", "web"]));
    assert_eq!(st.device(0).compute.load(Acquire), 0);
    job.kill().unwrap();
    job.wait().unwrap();
}

#[test]
fn daemon_admin_socket_refuses_other_users_and_bad_clients() {
    let gpu = SimGpu::new().with_shim();
    let _d = daemon(&gpu);
    ok(&gpu.sharectl(&["set", "batch", "--weight", "2"]));
    let sock = gpu.shim_state_dir().join("admin.sock");

    // A non-root user: the socket is root's (0600 in a 0700 directory) and the daemon checks
    // the peer's uid too.
    let out = {
        let mut cmd = Command::new(artifacts().bin("sharectl"));
        cmd.args(["get", "batch", "--state-dir"])
            .arg(gpu.shim_state_dir())
            .stdin(Stdio::null());
        cmd.uid(65534).gid(65534);
        cmd.output().unwrap()
    };
    let line = refused(&out);
    assert!(
        line.contains("not allowed") || line.contains("ermission"),
        "{line}"
    );

    // Garbage, oversized, truncated and silent clients: an error each, and the daemon serves on.
    let answer = |bytes: &[u8], close: bool| -> String {
        let mut s = UnixStream::connect(&sock).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(bytes).unwrap();
        if close {
            s.shutdown(std::net::Shutdown::Write).unwrap();
        }
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    };
    let silent = UnixStream::connect(&sock).unwrap();
    assert!(answer(&libshare_abi::wire::frame(b"{not json"), false).contains("malformed request"));
    assert!(answer(
        &libshare_abi::wire::frame(br#"{"op":"set","container":"batch","memory":-1}"#),
        false
    )
    .contains("malformed request"));
    assert!(answer(&(1u32 << 31).to_le_bytes(), false).contains("too long"));
    assert!(answer(&[50, 0, 0, 0, b'{'], true).contains("truncated"));
    let t0 = Instant::now();
    let got = ok(&gpu.sharectl(&["get", "batch"]));
    assert!(got.contains("weight=2"), "{got}");
    assert!(
        t0.elapsed() < Duration::from_millis(900),
        "a silent client held the daemon up"
    );
    drop(silent);
    let st = gpu.wait_container_state("batch");
    assert_eq!(st.device(0).weight.load(Acquire), 2, "nothing changed");
    assert!(Path::new(&sock).exists());
}
