//! Issue 17, must-show 4: a job fails closed, never to its environment. With real cgroups and
//! a real `sharectl daemon` that does not trust the environment (container A's quota set to
//! 256 MiB with `sharectl set`), the daemon is stopped (SIGSTOP: it accepts nothing, answers
//! nothing) and a non-root job starts in cgroup A whose environment claims container B and a
//! 4 GiB limit:
//! - (a) the daemon stays stopped: the job says once that it is waiting, and after
//!   `LIBSHARE_REGISTER_TIMEOUT` its `cuInit` fails with one line saying why and what to do; B's
//!   state never appears and nothing is charged anywhere;
//! - (b) the daemon is resumed (SIGCONT) once the job says it is waiting (~1 s after it
//!   starts): the job registers as A, under A's 256 MiB, and its 64 MiB are charged to A.
//!
//! And against a stand-in daemon: `Busy` (a daemon at its connection limit) is asked again,
//! backing off (about ten requests in 1.5 s), until `LIBSHARE_REGISTER_TIMEOUT`; a refusal is
//! final at once, with the daemon's reason.

use libshare_abi::register::{Hello, Welcome};
use libshare_abi::State;
use libshare_tests::cgroups::{spawn_in_with, untrusting_daemon, Cgroups};
use libshare_tests::{artifacts, compile_gcc, until, Daemon, SimGpu};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering::Acquire;
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// `kill -SIG pid` (the test crate links no libc).
fn signal(pid: u32, sig: &str) {
    let st = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(st.success(), "kill -{sig} {pid}");
}

/// The state letter of `/proc/<pid>/stat` (`T`: stopped).
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// The daemon, stopped with SIGSTOP until dropped (SIGCONT then, whatever the test did).
struct Stopped<'a>(&'a Daemon);

impl<'a> Stopped<'a> {
    fn new(d: &'a Daemon) -> Stopped<'a> {
        let pid = d.0.id();
        signal(pid, "STOP");
        until(Duration::from_secs(10), || proc_state(pid) == Some('T'))
            .expect("the daemon never stopped");
        Stopped(d)
    }
}

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        signal(self.0 .0.id(), "CONT");
    }
}

/// A daemon mapping the test's cgroups, with container A's quota set to 256 MiB.
fn daemon_with_a_quota(gpu: &SimGpu, cg: &Cgroups) -> Daemon {
    let d = untrusting_daemon(gpu, &cg.prefix, &[]);
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
    d
}

/// `hold_memory hold 64` as nobody in cgroup A, claiming B and 4 GiB in its environment; its
/// stderr lines arrive on the receiver as they are written.
fn job_in_a(gpu: &SimGpu, cg: &Cgroups) -> (Child, Receiver<String>) {
    let prog = compile_gcc("hold_memory.c", "hold_memory", &["-lcuda"]);
    let mut child = spawn_in_with(gpu, cg, "A", "B", &prog, "hold 64", Stdio::piped());
    let err = child.stderr.take().unwrap();
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            eprintln!("job: {line}");
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

/// The job's stderr lines until one contains `what` (panics after `limit`).
fn wait_for_line(rx: &Receiver<String>, what: &str, limit: Duration) -> Vec<String> {
    let t0 = Instant::now();
    let mut seen = Vec::new();
    loop {
        let left = limit.saturating_sub(t0.elapsed());
        match rx.recv_timeout(left) {
            Ok(l) => {
                let found = l.contains(what);
                seen.push(l);
                if found {
                    return seen;
                }
            }
            Err(_) => panic!("no stderr line with {what:?} within {limit:?}; saw {seen:?}"),
        }
    }
}

/// One registration, as a process in no mapped cgroup: answered once the daemon has worked
/// through the connections queued before it.
fn daemon_answers(gpu: &SimGpu) {
    let sock = gpu.shim_state_dir().join("register.sock");
    let hello = Hello {
        claimed: String::new(),
    }
    .encode();
    let (body, _) = libshare_abi::wire::call(&sock, &hello, Duration::from_secs(10))
        .expect("the resumed daemon answers");
    assert!(
        matches!(Welcome::decode(&body), Ok(Welcome::Ok { .. })),
        "{:?}",
        Welcome::decode(&body)
    );
}

#[test]
fn daemon_fail_closed_a_stopped_daemon_fails_cuinit_never_the_environment() {
    let Some(cg) = Cgroups::create(&["A", "B"]) else {
        return;
    };
    let gpu = SimGpu::new()
        .with_shim()
        .env("LIBSHARE_REGISTER_TIMEOUT", "2s");
    let d = daemon_with_a_quota(&gpu, &cg);
    let stopped = Stopped::new(&d);

    let t0 = Instant::now();
    let (mut job, stderr) = job_in_a(&gpu, &cg);
    let mut exit = None;
    until(Duration::from_secs(30), || {
        exit = job.try_wait().unwrap();
        exit.is_some()
    })
    .expect("the job neither registered nor gave up within 30 s");
    let took = t0.elapsed();
    let exit = exit.unwrap();
    let mut out = String::new();
    std::io::Read::read_to_string(&mut job.stdout.take().unwrap(), &mut out).unwrap();
    assert!(!exit.success(), "the job ran: {out}");
    assert!(out.contains(r#""ok":false"#), "cuInit must fail: {out}");
    let lines: Vec<String> = wait_for_line(&stderr, "did not register", Duration::from_secs(5))
        .into_iter()
        .filter(|l| l.starts_with("libshare:"))
        .collect();
    let sock = gpu.shim_state_dir().join("register.sock");
    assert_eq!(
        lines.len(),
        2,
        "one waiting line, then the reason: {lines:?}"
    );
    assert!(
        lines[0].contains("waiting up to 2s") && lines[0].contains(&sock.display().to_string()),
        "{lines:?}"
    );
    let why = &lines[1];
    assert!(
        why.contains(&format!(
            "the daemon at {} did not register this process within 2s (no answer)",
            sock.display()
        )) && why.contains("does not run outside its container's limits")
            && why.contains("Start the daemon"),
        "{why}"
    );
    assert!(took >= Duration::from_secs(2), "gave up after {took:?}");
    println!("stopped daemon: cuInit failed after {took:?}: {why}");

    // Nothing of the job is anyone's: B (its environment's container) never appears, nor the
    // default container, and A has nothing charged; not even once the daemon, resumed, has
    // worked through the connections the job left queued.
    let check = || {
        assert!(
            !gpu.container_state_path("B").exists(),
            "B's state appeared"
        );
        assert!(
            !gpu.container_state_path("default").exists(),
            "default's state appeared"
        );
        if let Ok(a) = State::open_existing(&gpu.container_state_path("A")) {
            assert_eq!(a.device(0).used.load(Acquire), 0, "charged to A");
        }
    };
    check();
    drop(stopped);
    daemon_answers(&gpu);
    check();
}

#[test]
fn daemon_fail_closed_a_job_waits_for_a_resumed_daemon_and_registers_in_its_cgroups_container() {
    let Some(cg) = Cgroups::create(&["A", "B"]) else {
        return;
    };
    // Longer than the ~1 s the daemon is stopped for, with room for a loaded machine.
    let gpu = SimGpu::new()
        .with_shim()
        .env("LIBSHARE_REGISTER_TIMEOUT", "10s");
    let d = daemon_with_a_quota(&gpu, &cg);
    let stopped = Stopped::new(&d);

    let t0 = Instant::now();
    let (mut job, stderr) = job_in_a(&gpu, &cg);
    // The job says it is waiting once it has waited ~1 s; then the daemon comes back.
    wait_for_line(&stderr, "waiting up to 10s", Duration::from_secs(10));
    let waited = t0.elapsed();
    drop(stopped);

    let mut line = String::new();
    BufReader::new(job.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let took = t0.elapsed();
    assert!(
        line.contains(r#""result":0"#),
        "the job did not hold its memory: {line}"
    );
    wait_for_line(
        &stderr,
        "took this process into container A",
        Duration::from_secs(5),
    );
    println!(
        "daemon resumed after {waited:?}: the job registered and held its memory after {took:?}"
    );
    let a = State::open_existing(&gpu.container_state_path("A")).unwrap();
    assert_eq!(a.device(0).used.load(Acquire), 64 * MIB, "charged to A");
    assert_eq!(
        a.device(0).quota.load(Acquire),
        256 * MIB,
        "the daemon's quota, not the environment's 4 GiB"
    );
    assert!(
        !gpu.container_state_path("B").exists(),
        "nothing of the job is B's"
    );
    job.kill().unwrap();
    job.wait().unwrap();
}

/// A stand-in daemon on `sock`: answers the first `busy` requests `Busy`, then `then` (None:
/// `Busy` forever). Counts the requests.
fn fake_daemon(
    sock: &std::path::Path,
    busy: usize,
    then: Option<Welcome>,
) -> std::sync::Arc<std::sync::atomic::AtomicUsize> {
    use std::io::Write;
    let listener = std::os::unix::net::UnixListener::bind(sock).unwrap();
    let n = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = n.clone();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { continue };
            if libshare_abi::wire::read_frame(&mut s, 4096).is_err() {
                continue;
            }
            let i = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let answer = match &then {
                Some(w) if i >= busy => w.clone(),
                _ => Welcome::Busy {
                    reason: "the daemon is busy; retry".into(),
                },
            };
            let _ = s.write_all(&libshare_abi::wire::frame(&answer.encode()));
        }
    });
    n
}

/// `hold_memory try 64` on `gpu` with its registration socket at `sock`: (exit success,
/// stdout, the `libshare:` lines of its stderr, how long it took).
fn try_job(
    gpu: &SimGpu,
    sock: &std::path::Path,
    timeout: &str,
) -> (bool, String, Vec<String>, Duration) {
    let prog = compile_gcc("hold_memory.c", "hold_memory", &["-lcuda"]);
    let mut cmd = gpu.command(&prog);
    cmd.args(["try", "64"])
        .env("LIBSHARE_SOCKET", sock)
        .env("LIBSHARE_REGISTER_TIMEOUT", timeout);
    let t0 = Instant::now();
    let out = gpu.run_cmd(cmd);
    let lines = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.starts_with("libshare:"))
        .map(String::from)
        .collect();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        lines,
        t0.elapsed(),
    )
}

#[test]
fn daemon_fail_closed_busy_is_asked_again_until_the_deadline_and_a_refusal_fails_at_once() {
    let gpu = SimGpu::new().with_shim().quota("1GiB");
    let dir = tempfile::tempdir().unwrap();

    // Busy every time: asked again, backing off, then cuInit fails at the deadline.
    let sock = dir.path().join("busy.sock");
    let asked = fake_daemon(&sock, 0, None);
    let (ok, out, lines, took) = try_job(&gpu, &sock, "1500ms");
    let asked = asked.load(std::sync::atomic::Ordering::SeqCst);
    println!("always busy: {asked} requests, cuInit failed after {took:?}: {lines:?}");
    assert!(
        !ok && out.contains(r#""ok":false"#),
        "cuInit must fail: {out}"
    );
    let last = lines.last().cloned().unwrap_or_default();
    assert!(
        last.contains(
            "did not register this process within 1.5s (busy: the daemon is busy; retry)"
        ) && last.contains("connection limit"),
        "{lines:?}"
    );
    assert_eq!(
        lines.len(),
        2,
        "one waiting line, then the reason: {lines:?}"
    );
    assert!(
        took >= Duration::from_millis(1500),
        "gave up after {took:?}"
    );
    // 10, 20, 40, … 500 ms apart: about ten requests in 1.5 s, not a busy loop.
    assert!((5..=20).contains(&asked), "{asked} requests in {took:?}");

    // Busy twice, then refused: the refusal is final, at once, with the daemon's reason.
    let sock = dir.path().join("refuses.sock");
    let asked = fake_daemon(
        &sock,
        2,
        Some(Welcome::Refused {
            reason: "this cgroup may not use the GPU".into(),
        }),
    );
    let (ok, out, lines, took) = try_job(&gpu, &sock, "10s");
    println!("busy twice, then refused: cuInit failed after {took:?}: {lines:?}");
    assert!(
        !ok && out.contains(r#""ok":false"#),
        "cuInit must fail: {out}"
    );
    assert_eq!(
        asked.load(std::sync::atomic::Ordering::SeqCst),
        3,
        "asked until refused, no more"
    );
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("refused to register this process: this cgroup may not use the GPU"),
        "{lines:?}"
    );
    assert!(
        took < Duration::from_secs(5),
        "a refusal is final: {took:?}"
    );
    assert!(
        !gpu.container_state_path("default").exists(),
        "nothing ran as the environment's container"
    );
}
