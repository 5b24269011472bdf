//! Issue 17, `sharectl`'s output and input on simgpu with a real `sharectl daemon`:
//! - a reader that goes away (`sharectl get X | head -1`) ends every printing command quietly:
//!   exit status 0 or SIGPIPE, never a panic or a backtrace;
//! - `set` without `--device` writes the node's devices only (simgpu: one), through the daemon
//!   and `--offline`, so `status` lists one row per device the node has;
//! - a quota under 16 MiB and a name outside `A-Z a-z 0-9 . _ -` are refused with one line, by
//!   `sharectl` and by the daemon itself.

use libshare_tests::{artifacts, ok, Daemon, SimGpu};
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, ExitStatus, Output, Stdio};
use std::time::Duration;

fn daemon(gpu: &SimGpu) -> Daemon {
    // NVML (the node's devices) comes from simgpu.
    let mut cmd = gpu.sharectl_cmd(&["daemon", "--trust-env"]);
    cmd.stdout(Stdio::null()).stderr(Stdio::inherit());
    libshare_tests::cgroups::start_daemon(gpu, cmd)
}

/// The one line a refused command printed.
fn refused(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("sharectl: "), "{err}");
    err.trim_end().to_string()
}

/// A quiet end: success, or killed by SIGPIPE (what a shell reports as 141); nothing on stderr
/// about a panic.
fn assert_quiet(what: &str, status: ExitStatus, stderr: &str) {
    assert!(
        status.success() || status.signal() == Some(13) || status.code() == Some(141),
        "{what}: {status:?}\n{stderr}"
    );
    assert!(
        !stderr.contains("panicked")
            && !stderr.contains("backtrace")
            && !stderr.contains("Broken pipe"),
        "{what}: {stderr}"
    );
}

/// Runs `cmd` with its stdout a pipe nobody reads any more (closed before it writes): every
/// write fails with EPIPE.
fn into_closed_pipe(what: &str, mut cmd: Command) {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = cmd
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("run sharectl");
    assert_quiet(what, out.status, &String::from_utf8_lossy(&out.stderr));
}

/// Runs `cmd` into a reader that takes one line and closes (`| head -1`); returns that line.
fn first_line_then_close(what: &str, mut cmd: Command) -> String {
    let (reader, writer) = std::io::pipe().unwrap();
    let mut child = cmd
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .expect("run sharectl");
    drop(cmd); // our copy of the pipe's write end
    let mut line = String::new();
    BufReader::new(reader).read_line(&mut line).unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let status = child.wait().unwrap();
    assert_quiet(what, status, &err);
    line
}

#[test]
fn a_closed_stdout_ends_every_printing_command_quietly() {
    let gpu = SimGpu::new();
    let _d = daemon(&gpu);
    ok(&gpu.sharectl(&["set", "web", "--memory", "256MiB"]));
    for args in [
        &["status"][..],
        &["status", "--json"],
        &["get", "web"],
        &["get", "web", "--json"],
        &["set", "web", "--weight", "2"],
        &["reset", "web"],
        &["set", "web", "--memory", "128MiB", "--offline"],
        &["top", "--once", "--interval", "100ms"],
    ] {
        let what = args.join(" ");
        into_closed_pipe(&what, gpu.sharectl_cmd(args));
        let line = first_line_then_close(&what, gpu.sharectl_cmd(args));
        // `set --offline` prints nothing; the others print at least a line.
        assert!(
            !line.is_empty() || args.contains(&"--offline"),
            "{what}: no first line"
        );
    }
    // No --state-dir here: the help text.
    let mut help = Command::new(artifacts().bin("sharectl"));
    help.arg("--help");
    into_closed_pipe("--help", help);
}

/// L2: on a 1-GPU node a quota for every device is one device's, not sixteen.
#[test]
fn set_without_device_writes_the_node_devices_only() {
    let gpu = SimGpu::new();
    let rows = |name: &str| {
        let doc: serde_json::Value =
            serde_json::from_str(&ok(&gpu.sharectl(&["status", "--json"]))).unwrap();
        let c = doc["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["container"] == name)
            .unwrap_or_else(|| panic!("{name} not in {doc}"))
            .clone();
        c["devices"].as_array().unwrap().clone()
    };
    // Offline (no daemon): NVML says one device.
    ok(&gpu.sharectl(&["set", "offline", "--memory", "256MiB", "--offline"]));
    let r = rows("offline");
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0]["device"], 0);
    assert_eq!(r[0]["quota_bytes"], 256u64 << 20);
    let refused_device = refused(&gpu.sharectl(&[
        "set",
        "offline",
        "--memory",
        "256MiB",
        "--device",
        "1",
        "--offline",
    ]));
    assert!(refused_device.contains("1 GPU(s)"), "{refused_device}");

    let _d = daemon(&gpu);
    let out = ok(&gpu.sharectl(&["set", "c", "--memory", "256MiB"]));
    assert_eq!(
        out.lines().filter(|l| l.contains("gpu ")).count(),
        1,
        "{out}"
    );
    let r = rows("c");
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0]["device"], 0);
    assert_eq!(r[0]["quota_bytes"], 256u64 << 20);
    let get: serde_json::Value =
        serde_json::from_str(&ok(&gpu.sharectl(&["get", "c", "--json"]))).unwrap();
    assert_eq!(get["devices"].as_array().unwrap().len(), 1, "{get}");
}

#[test]
fn tiny_quotas_and_unsafe_names_are_refused_with_one_line() {
    let gpu = SimGpu::new();
    // Offline first (no daemon yet), then through the daemon.
    for offline in [true, false] {
        let _d = (!offline).then(|| daemon(&gpu));
        for m in ["1", "15MiB", "16777215"] {
            let mut args = vec!["set", "c", "--memory", m];
            if offline {
                args.push("--offline");
            }
            let line = refused(&gpu.sharectl(&args));
            assert!(line.contains("below 16 MiB"), "{line}");
            assert!(line.contains("16MiB"), "says what to give: {line}");
        }
        let mut args = vec!["set", "c", "--memory", "16MiB"];
        if offline {
            args.push("--offline");
        }
        ok(&gpu.sharectl(&args));
        for name in ["a b", "a\x1b[2Jb", "x\ny", "../etc", "caf\u{e9}"] {
            let mut args = vec!["set", name, "--memory", "1GiB"];
            if offline {
                args.push("--offline");
            }
            let line = refused(&gpu.sharectl(&args));
            assert!(line.contains("A-Z a-z 0-9 . _ -"), "{line}");
            assert!(!line.chars().any(|c| c.is_control()), "escaped: {line:?}");
        }
    }
    // The daemon checks for itself (a client other than sharectl).
    let _d = daemon(&gpu);
    let sock = gpu.shim_state_dir().join("admin.sock");
    let ask = |body: &str| -> serde_json::Value {
        let (answer, _) =
            libshare_abi::wire::call(&sock, body.as_bytes(), Duration::from_secs(5)).unwrap();
        serde_json::from_slice(&answer).unwrap()
    };
    let a = ask(r#"{"op":"set","container":"c","memory":1}"#);
    assert_eq!(a["status"], "error", "{a}");
    assert!(
        a["message"].as_str().unwrap().contains("below 16 MiB"),
        "{a}"
    );
    for name in ["a\u{1b}[31mb", "web 1", "x/y"] {
        let a = ask(&serde_json::json!({"op":"get","container":name}).to_string());
        assert_eq!(a["status"], "error", "{a}");
        let m = a["message"].as_str().unwrap();
        assert!(m.contains("not a container name"), "{m}");
        assert!(!m.chars().any(|c| c.is_control()), "{m:?}");
    }
    // The quota set above (16 MiB) is what the state holds: the refusals changed nothing.
    let get: serde_json::Value =
        serde_json::from_str(&ok(&gpu.sharectl(&["get", "c", "--json"]))).unwrap();
    assert_eq!(get["devices"][0]["quota"], 16u64 << 20, "{get}");
}
