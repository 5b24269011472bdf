//! Issue 10, metrics and `sharectl top`, with real jobs on simgpu under the shim:
//! - `/metrics` of a running daemon (a production job with a 1 GiB quota, an opportunistic job
//!   saturating the GPU) passes `promtool check metrics` and holds the expected series with the
//!   right values; the textfile is written and valid too;
//! - bad HTTP input (garbage, oversized, a wrong method or path, silent clients filling every
//!   connection) is answered or dropped and the server keeps serving;
//! - another user (uid nobody, as the audit drove it: B8b of issue 30) holding 32 idle
//!   connections blocks no scrape, and reads no metrics (403); the textfile is not readable by
//!   others either;
//! - `sharectl top` in a detached tmux session shows the containers' names, classes and memory,
//!   and `q` quits it with status 0.

use jobs::profiles::{Train, TRAIN};
use libshare_tests::{artifacts, Running, SimGpu};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// Polls `f` every 50 ms until it returns Some; panics with `what` after `limit`.
fn until<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A production job holding 256 MiB under a 1 GiB quota (container `web`) and an opportunistic
/// job saturating the GPU (container `batch`), both running for a minute.
fn start_jobs(gpu: &SimGpu) -> Vec<Running> {
    let mut train = gpu.command(artifacts().bin(Train::BIN));
    train
        .args(TRAIN.args())
        .args(["--duration", "60s"])
        .env("LIBSHARE_CONTAINER", "web")
        .env("LIBSHARE_CLASS", "production")
        .env("LIBSHARE_MEMORY_LIMIT", "1GiB");
    let mut sat = gpu.command(artifacts().bin("simjob-saturate"));
    sat.args(["--duration", "60s", "--kernel-ms", "1"])
        .env("LIBSHARE_CONTAINER", "batch")
        .env("LIBSHARE_CLASS", "opportunistic");
    let mut jobs = vec![gpu.spawn(train), gpu.spawn(sat)];
    for j in &mut jobs {
        until(Duration::from_secs(30), "a job's first line", || {
            (!j.poll_lines().is_empty()).then_some(())
        });
    }
    jobs
}

struct Daemon {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `sharectl daemon` on `state_dir` with metrics on a free loopback port (read back from its
/// log line) and, if given, a textfile rewritten every 200 ms.
fn start_daemon(state_dir: &Path, textfile: Option<&Path>) -> Daemon {
    let mut cmd = Command::new(artifacts().bin("sharectl"));
    cmd.args([
        "daemon",
        "--trust-env",
        "--metrics-addr",
        "127.0.0.1:0",
        "--state-dir",
    ])
    .arg(state_dir)
    .env("LIBSHARE_LOG", "info")
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    if let Some(t) = textfile {
        cmd.arg("--metrics-textfile")
            .arg(t)
            .args(["--metrics-interval", "200ms"]);
    }
    let mut child = cmd.spawn().expect("start sharectl daemon");
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let addr = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .expect("the daemon logs its metrics address");
        if let Some(rest) = line.split("metrics served at http://").nth(1) {
            let a = rest.split('/').next().unwrap();
            break a.parse::<SocketAddr>().expect("an address");
        }
    };
    // Keep draining its log.
    std::thread::spawn(move || while rx.recv().is_ok() {});
    Daemon { child, addr }
}

/// Sends `request` raw and returns (status line, body); None if the server closed without a
/// status line.
fn http(addr: SocketAddr, request: &[u8]) -> Option<(String, String)> {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(request);
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text.split_once("\r\n\r\n")?;
    Some((head.lines().next()?.to_string(), body.to_string()))
}

fn get_metrics(addr: SocketAddr) -> String {
    let (status, body) = http(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").expect("answer");
    assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
    body
}

/// The value of the series `name{labels}` (exactly as written) in Prometheus text.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn metrics_of_a_running_daemon_pass_promtool_and_hold_the_jobs_figures() {
    let gpu = SimGpu::new().with_shim().timeout(Duration::from_secs(120));
    let _jobs = start_jobs(&gpu);
    let tmp = tempfile::tempdir().unwrap();
    let textfile = tmp.path().join("libshare.prom");
    let d = start_daemon(&gpu.shim_state_dir(), Some(&textfile));

    let web = r#"{container="web",device="0"}"#;
    let batch = r#"{container="batch",device="0"}"#;
    // Wait until both jobs have memory and work on record and the loop has ticked.
    let m = until(Duration::from_secs(30), "both jobs in /metrics", || {
        let m = get_metrics(d.addr);
        let ok = value(&m, &format!("libshare_memory_used_bytes{web}")).unwrap_or(0.0) > 0.0
            && value(&m, &format!("libshare_gpu_seconds_total{batch}")).unwrap_or(0.0) > 0.0
            && value(&m, "libshare_daemon_ticks_total").unwrap_or(0.0) > 0.0
            && value(&m, "libshare_daemon_containers").unwrap_or(0.0) == 2.0;
        ok.then_some(m)
    });
    libshare_tests::promtool_check(&m, "/metrics");
    let v = |s: &str| value(&m, s).unwrap_or_else(|| panic!("no series {s} in:\n{m}"));
    assert_eq!(
        v(&format!("libshare_memory_quota_bytes{web}")),
        GIB as f64,
        "the job's LIBSHARE_MEMORY_LIMIT"
    );
    let used = v(&format!("libshare_memory_used_bytes{web}"));
    assert!(
        (256 * MIB) as f64 <= used && used <= GIB as f64,
        "web holds its 256 MiB: {used}"
    );
    assert!(v(&format!("libshare_memory_peak_bytes{web}")) >= used);
    assert_eq!(v(&format!("libshare_memory_quota_bytes{batch}")), 0.0);
    assert_eq!(v(&format!("libshare_memory_refused_total{web}")), 0.0);
    assert!(v(&format!("libshare_launches_total{web}")) > 0.0);
    assert!(v(&format!("libshare_launches_total{batch}")) > 0.0);
    assert_eq!(
        v(r#"libshare_container_info{container="web",class="production",daemon_managed="false"}"#),
        1.0
    );
    assert_eq!(
        v(
            r#"libshare_container_info{container="batch",class="opportunistic",daemon_managed="false"}"#
        ),
        1.0
    );
    assert_eq!(v(r#"libshare_container_processes{container="web"}"#), 1.0);
    // The production container is never gated; exactly one gate state holds for each.
    assert_eq!(
        v(r#"libshare_gate_state{container="web",device="0",state="open"}"#),
        1.0
    );
    let states: f64 = ["open", "paused", "run"]
        .iter()
        .map(|s| {
            v(&format!(
                r#"libshare_gate_state{{container="batch",device="0",state="{s}"}}"#
            ))
        })
        .sum();
    assert_eq!(states, 1.0);
    assert!(m.contains(&format!("libshare_throttled_seconds_total{batch} ")));
    assert_eq!(v("libshare_daemon_up"), 1.0);
    assert!(v("libshare_daemon_cpu_seconds_total") >= 0.0);
    assert!(v("libshare_daemon_late_max_seconds") >= 0.0);
    assert_eq!(v("libshare_state_read_errors"), 0.0);
    // Prometheus itself asks for OpenMetrics and gets it, ending in # EOF.
    let (status, om) = http(
        d.addr,
        b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text;version=1.0.0\r\n\r\n",
    )
    .unwrap();
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(om.ends_with("# EOF\n") && om.contains("# TYPE libshare_launches counter"));

    // The textfile: written, valid, the same figures.
    let t = until(Duration::from_secs(10), "the textfile", || {
        let t = std::fs::read_to_string(&textfile).ok()?;
        (value(&t, &format!("libshare_memory_used_bytes{web}")).unwrap_or(0.0) > 0.0).then_some(t)
    });
    libshare_tests::promtool_check(&t, "the textfile");
    assert_eq!(
        value(&t, &format!("libshare_memory_quota_bytes{web}")),
        Some(GIB as f64)
    );
    // Nothing but the file itself is left in its directory (written beside it, renamed).
    let names: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(names.len() <= 2, "{names:?}"); // a rename in progress may show its temporary
}

#[test]
fn bad_http_input_leaves_the_metrics_server_serving() {
    let tmp = tempfile::tempdir().unwrap();
    let d = start_daemon(tmp.path(), None);
    // A client that connects and never speaks.
    let silent = TcpStream::connect(d.addr).unwrap();
    let t = Instant::now();
    let _ = get_metrics(d.addr);
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "a silent client delayed a scrape by {:?}",
        t.elapsed()
    );
    let status = |req: &[u8]| http(d.addr, req).map(|(s, _)| s);
    assert_eq!(
        status(b"\x00\xff\xfe garbage\r\n\r\n").as_deref(),
        Some("HTTP/1.1 400 Bad Request")
    );
    assert_eq!(
        status(b"GET / HTTP/1.1\r\n\r\n").as_deref(),
        Some("HTTP/1.1 404 Not Found")
    );
    assert_eq!(
        status(b"DELETE /metrics HTTP/1.1\r\n\r\n").as_deref(),
        Some("HTTP/1.1 405 Method Not Allowed")
    );
    let mut big = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
    big.resize(64 * 1024, b'a');
    assert_eq!(
        status(&big).as_deref(),
        Some("HTTP/1.1 431 Request Header Fields Too Large")
    );
    // A half request and a hang-up.
    drop(TcpStream::connect(d.addr).unwrap().write_all(b"GET /met"));
    let _ = get_metrics(d.addr);

    // Fill every connection with silent clients: the next one is refused at once, and once
    // they time out (2 s) the server serves again.
    let mut hogs: Vec<TcpStream> = (0..20)
        .map(|_| TcpStream::connect(d.addr).unwrap())
        .collect();
    let t = Instant::now();
    let busy = until(Duration::from_secs(5), "a busy answer", || {
        status(b"GET /metrics HTTP/1.1\r\n\r\n").filter(|s| s.contains("503"))
    });
    assert_eq!(busy, "HTTP/1.1 503 Service Unavailable");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    until(
        Duration::from_secs(10),
        "serving after the silent clients",
        || status(b"GET /metrics HTTP/1.1\r\n\r\n").filter(|s| s.contains("200")),
    );
    hogs.clear();
    drop(silent);
    let m = get_metrics(d.addr);
    assert_eq!(value(&m, "libshare_daemon_up"), Some(1.0), "{m}");
}

/// Issue 30, B8b: 16 idle connections by any local user made the scraper get 503, and any
/// local user read every container's name and usage.
#[test]
fn another_user_neither_blocks_the_metrics_nor_reads_them() {
    let tmp = tempfile::tempdir().unwrap();
    let name = "tenant-secret-name";
    let st = libshare_abi::State::open_or_create(&libshare_abi::container_dir(tmp.path(), name))
        .unwrap();
    st.set_quota(0, GIB);
    let textfile = tmp.path().join("libshare.prom");
    let d = start_daemon(tmp.path(), Some(&textfile));
    // uid nobody opens 32 connections and keeps them idle, then asks for the metrics itself.
    let script = r#"
import socket, sys
port = int(sys.argv[1])
held = [socket.create_connection(("127.0.0.1", port)) for _ in range(32)]
print("held", flush=True)
s = socket.create_connection(("127.0.0.1", port))
try:
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    data = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        data += b
except OSError as e:
    data = repr(e).encode()
print("answer", data.decode(errors="replace").replace("\n", " "), flush=True)
sys.stdin.read()
"#;
    let mut nobody = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args(["/usr/bin/python3", "-c", script])
        .arg(d.addr.port().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run python3 as nobody");
    let mut lines = BufReader::new(nobody.stdout.take().unwrap()).lines();
    let mut next = || lines.next().and_then(Result::ok).unwrap_or_default();
    assert_eq!(next(), "held");
    let answer = next();
    // The scraper (root here) is served at once while nobody's connections are held.
    let t = Instant::now();
    let m = get_metrics(d.addr);
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    assert!(m.contains(name), "{m}");
    assert!(answer.starts_with("answer"), "{answer}");
    assert!(
        !answer.contains(name) && !answer.contains("200 OK"),
        "uid nobody read the metrics: {answer}"
    );
    drop(nobody.stdin.take());
    let _ = nobody.kill();
    let _ = nobody.wait();
    // The textfile names the containers too: not for others.
    until(Duration::from_secs(10), "the textfile", || {
        std::fs::read_to_string(&textfile)
            .ok()
            .filter(|t| t.contains(name))
    });
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&textfile).unwrap().permissions().mode();
    assert_eq!(
        mode & 0o007,
        0,
        "the textfile is readable by others: {mode:o}"
    );
}

/// A tmux server of our own (its socket name), killed when dropped.
struct Tmux(String);

impl Tmux {
    fn cmd(&self) -> Command {
        let mut c = Command::new("tmux");
        c.args(["-L", &self.0]);
        c
    }
    fn screen(&self) -> String {
        let out = self
            .cmd()
            .args(["capture-pane", "-p", "-t", "top"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd().arg("kill-server").output();
    }
}

#[test]
fn top_in_tmux_shows_the_containers_and_quits_on_q() {
    if Command::new("tmux").arg("-V").output().is_err() {
        libshare_tests::skip("tmux is not installed");
        return;
    }
    let gpu = SimGpu::new().with_shim().timeout(Duration::from_secs(120));
    let _jobs = start_jobs(&gpu);
    let tmp = tempfile::tempdir().unwrap();
    let done = tmp.path().join("exit-status");
    let tmux = Tmux(format!("libshare-top-{}", std::process::id()));
    let script = format!(
        "{} top --state-dir {}; echo $? > {}",
        artifacts().bin("sharectl").display(),
        gpu.shim_state_dir().display(),
        done.display()
    );
    let st = tmux
        .cmd()
        .args(["new-session", "-d", "-s", "top", "-x", "160", "-y", "30"])
        .arg(script)
        .status()
        .unwrap();
    assert!(st.success());
    let screen = until(Duration::from_secs(20), "top's screen", || {
        let s = tmux.screen();
        (s.contains("web") && s.contains("batch") && s.contains("1 GiB") && s.contains("256 MiB"))
            .then_some(s)
    });
    assert!(screen.contains("libshare top"), "{screen}");
    let web = screen
        .lines()
        .find(|l| l.contains("web"))
        .unwrap_or_else(|| panic!("{screen}"));
    assert!(
        web.contains("production") && web.contains("1 GiB") && web.contains("256 MiB"),
        "the web row shows its class, quota and memory: {web}\n{screen}"
    );
    let batch = screen.lines().find(|l| l.contains("batch")).unwrap();
    assert!(batch.contains("opportunistic"), "{batch}\n{screen}");
    // Later refreshes show rates: the saturating job's launches per second on GPU 0.
    until(Duration::from_secs(10), "a launch rate on GPU 0", || {
        let s = tmux.screen();
        let line = s.lines().find(|l| l.contains("GPU 0:"))?.to_string();
        let rate: f64 = line
            .split(" launches/s")
            .next()?
            .rsplit(' ')
            .next()?
            .parse()
            .ok()?;
        (rate > 0.0).then_some(())
    });
    tmux.cmd()
        .args(["send-keys", "-t", "top", "q"])
        .status()
        .unwrap();
    let status = until(Duration::from_secs(5), "top to quit on q", || {
        std::fs::read_to_string(&done).ok()
    });
    assert_eq!(status.trim(), "0", "sharectl top's exit status");
}
