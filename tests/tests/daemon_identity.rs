//! Issue 10, identity, with real cgroups (v1 `pids` hierarchy, created by the test) and a
//! real `sharectl daemon` that does not trust the environment:
//! - a job in the cgroup the daemon maps to container A, run by a non-root user (as a
//!   container's job usually is), is registered as A although its environment says
//!   `LIBSHARE_CONTAINER=B`: it reaches the registration socket through the daemon's state
//!   directory (0711), its memory is charged to A, under the quota the daemon set for A (not the
//!   environment's), and B gets nothing; an NVML-only tool (no `cuInit`) run the same way
//!   registers too and sees A's quota and usage as its device's memory;
//! - a non-root process cannot list the state directory nor open any container's state file by
//!   path: the files reach processes only as the descriptors registration passes;
//! - a job whose registration socket file exists but nobody listens on it (a killed daemon's)
//!   does not run on its environment's word: `cuInit` fails after `LIBSHARE_REGISTER_TIMEOUT`
//!   with one line; with no socket file at all the job runs as without a daemon;
//! - bad input on the registration socket is refused and the daemon keeps registering.

use libshare_abi::register::{Hello, Welcome};
use libshare_abi::State;
use libshare_tests::cgroups::{holder_in, spawn_in, untrusting_daemon, Cgroups, NOBODY};
use libshare_tests::{artifacts, compile_gcc, Daemon, SimGpu};
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::Ordering::Acquire;
use std::time::Duration;

const MIB: u64 = 1 << 20;

fn daemon(gpu: &SimGpu, prefix: &str) -> Daemon {
    untrusting_daemon(gpu, prefix, &[])
}

#[test]
fn daemon_identity_comes_from_the_cgroup_not_the_environment() {
    let Some(cg) = Cgroups::create(&["A", "B"]) else {
        return;
    };
    let gpu = SimGpu::new().with_shim();
    // The machine's directory is open to every user, as a GPU's device files are (simgpu's
    // state file is 0666 like /dev/nvidia*); the daemon's state directory inside is its own.
    std::fs::set_permissions(gpu.state_dir(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let _d = daemon(&gpu, &cg.prefix);
    let set = Command::new(artifacts().bin("sharectl"))
        .args(["set", "A", "--memory", "256MiB", "--state-dir"])
        .arg(gpu.shim_state_dir())
        .output()
        .unwrap();
    assert!(
        set.status.success(),
        "{}",
        String::from_utf8_lossy(&set.stderr)
    );

    // A non-root job in cgroup A, claiming B (and a 4 GiB limit) in its environment.
    let mut job = holder_in(&gpu, &cg, "A", "B", 64);
    let a = State::open_existing(&gpu.container_state_path("A")).unwrap();
    assert_eq!(a.device(0).used.load(Acquire), 64 * MIB, "charged to A");
    assert_eq!(
        a.device(0).quota.load(Acquire),
        256 * MIB,
        "the daemon's quota, not the environment's"
    );
    assert!(
        !gpu.container_state_path("B").exists(),
        "B was never created: nothing of this job is B's"
    );

    // An NVML-only tool (no cuInit) of the same kind sees A's quota and usage: it registers
    // too (it could not open A's file by path), and its environment's B and 4 GiB count for
    // nothing.
    let nvml = spawn_in(
        &gpu,
        &cg,
        "A",
        "B",
        &libshare_tests::compile_driver_c("nvml_test.c"),
        "report",
    );
    let out = nvml.wait_with_output().unwrap();
    let v = libshare_tests::json_check(&out, "nvml");
    assert_eq!(v["total"], 256 * MIB, "A's quota as NVML total: {v}");
    assert_eq!(v["used"], 64 * MIB, "A's usage as NVML used: {v}");

    // A non-root user reaches no state file by path, and cannot list the state directory
    // (others may only pass through it to the registration socket).
    let nobody = |program: &str, arg: &Path| {
        let out = Command::new(program)
            .arg(arg)
            .uid(NOBODY)
            .gid(NOBODY)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            !out.status.success(),
            "nobody ran {program} {}",
            arg.display()
        );
        assert!(err.contains("Permission denied"), "{program}: {err}");
    };
    for c in ["A", "B"] {
        nobody("/bin/cat", &gpu.container_state_path(c));
    }
    nobody("/bin/ls", &gpu.shim_state_dir());
    let mode = std::fs::metadata(gpu.shim_state_dir()).unwrap();
    assert_eq!(mode.permissions().mode() & 0o7777, 0o711);

    job.kill().unwrap();
    job.wait().unwrap();
}

#[test]
fn daemon_identity_registration_survives_bad_clients_and_a_stale_socket_fails_closed() {
    let gpu = SimGpu::new().with_shim().quota("1GiB");
    {
        let _d = daemon(&gpu, "/nothing-maps-here");
        let sock = gpu.shim_state_dir().join("register.sock");
        let answer = |bytes: &[u8], close: bool| -> Vec<u8> {
            let mut s = UnixStream::connect(&sock).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s.write_all(bytes).unwrap();
            if close {
                s.shutdown(std::net::Shutdown::Write).unwrap();
            }
            let mut out = Vec::new();
            let _ = s.read_to_end(&mut out);
            out
        };
        let refused = |b: Vec<u8>| match Welcome::decode(&b[4.min(b.len())..]) {
            Ok(Welcome::Refused { reason }) => reason,
            other => panic!("not refused: {other:?}"),
        };
        let _silent = UnixStream::connect(&sock).unwrap();
        println!(
            "garbage: {}",
            refused(answer(&libshare_abi::wire::frame(b"hello?"), false))
        );
        println!(
            "oversized: {}",
            refused(answer(&(1u32 << 30).to_le_bytes(), false))
        );
        println!("truncated: {}", refused(answer(&[40, 0, 0, 0, b'L'], true)));
        // A valid registration still works: unmapped and untrusted, it lands in `host`.
        let (body, fd) = libshare_abi::wire::call(
            &sock,
            &Hello {
                claimed: "B".into(),
            }
            .encode(),
            Duration::from_secs(2),
        )
        .unwrap();
        assert_eq!(
            Welcome::decode(&body),
            Ok(Welcome::Ok {
                container: "host".into(),
                env_trusted: false
            })
        );
        let st = State::from_fd(std::fs::File::from(fd.expect("a descriptor"))).unwrap();
        drop(st);
    }
    // The daemon is gone (killed: its socket file remains, bound then closed here so that
    // nobody listens on it). A job does not run on its environment's word (container `default`,
    // its 1 GiB): it waits LIBSHARE_REGISTER_TIMEOUT for a daemon, then cuInit fails with one
    // line saying why and what to do.
    let sock = gpu.shim_state_dir().join("register.sock");
    if !sock.exists() {
        drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    }
    assert!(sock.exists(), "a stale socket file");
    let prog = compile_gcc("hold_memory.c", "hold_memory", &["-lcuda"]);
    let started = std::time::Instant::now();
    let mut cmd = gpu.command(&prog);
    cmd.args(["try", "64"])
        .env("LIBSHARE_REGISTER_TIMEOUT", "1s");
    let out = gpu.run_cmd(cmd);
    let took = started.elapsed();
    assert!(!out.status.success(), "the job ran: {out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(r#""ok":false"#),
        "cuInit must fail: {out:?}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("libshare:"))
        .collect();
    let last = lines.last().copied().unwrap_or_default();
    assert!(
        last.contains(&format!(
            "the daemon at {} did not register this process within 1s",
            sock.display()
        )) && last.contains("does not run outside its container's limits")
            && last.contains("Start the daemon"),
        "one line saying why and what to do: {stderr}"
    );
    assert!(
        lines.len() <= 2 && lines.iter().filter(|l| l.contains("waiting")).count() <= 1,
        "at most one waiting line, then the reason: {stderr}"
    );
    assert!(
        took >= Duration::from_secs(1),
        "gave up after {took:?}, before LIBSHARE_REGISTER_TIMEOUT"
    );
    println!("stale socket: cuInit failed after {took:?}: {last}");
    assert!(
        !gpu.container_state_path("default").exists(),
        "nothing ran as the environment's container"
    );

    // No socket file at all: no daemon; the job runs as without one (its environment's
    // container and limit).
    std::fs::remove_file(&sock).unwrap();
    let out = gpu.run_ok(&prog, &["try", "64"]);
    assert_eq!(libshare_tests::json_check(&out, "try")["result"], 0);
    let st = gpu.container_state("default");
    assert_eq!(
        st.device(0).quota.load(Acquire),
        1 << 30,
        "the environment's limit, as without a daemon"
    );
}
