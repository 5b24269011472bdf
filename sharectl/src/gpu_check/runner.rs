//! Running the check's programs so that none outlives its step: each in a process group of its
//! own (killed whole at its deadline, and at its end, taking a bench's daemon and jobs with it),
//! the run a child subreaper (what escapes a group is reparented here and killed at the end), and
//! SIGTERM/SIGINT/SIGHUP turned into "stop now" for whatever is waiting.

use anyhow::{bail, Context};
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// Set by the signal handler: every wait gives up, kills its group and returns an error.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// Installs the stop handler and makes this process the reaper of its orphaned descendants.
pub fn init() {
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic (async-signal-safe).
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
    // SAFETY: prctl with integer arguments changes only this process's reaper attribute.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
}

pub fn stopped() -> bool {
    STOP.load(Ordering::Relaxed)
}

/// What a finished program left: its status (None: killed at its deadline), its output.
#[derive(Debug)]
pub struct Finished {
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
    pub secs: f64,
}

impl Finished {
    pub fn ok(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    /// Its JSON lines.
    pub fn json(&self) -> Vec<serde_json::Value> {
        self.stdout
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v.is_object())
            .collect()
    }

    /// One line on why it failed: timed out, its exit, the last lines of its output.
    pub fn why(&self) -> String {
        let how = match self.status {
            None => "killed at its deadline".to_string(),
            Some(s) => format!("{s}"),
        };
        let tail: Vec<&str> = self
            .stdout
            .lines()
            .chain(self.stderr.lines())
            .filter(|l| !l.trim().is_empty())
            .collect();
        let tail = tail[tail.len().saturating_sub(3)..].join(" / ");
        format!("{how}: {}", truncate(&tail, 400))
    }
}

pub fn truncate(s: &str, n: usize) -> String {
    if s.len() <= n {
        return s.to_string();
    }
    let mut end = n;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// A program started in its own process group, its output read on threads.
pub struct Running {
    child: Child,
    pgid: i32,
    started: Instant,
    lines: Receiver<String>,
    stdout: String,
    stderr: Option<std::thread::JoinHandle<String>>,
    out_thread: Option<std::thread::JoinHandle<()>>,
}

/// Starts `cmd` (stdin piped, so the caller can close it as a start signal) in a new process group.
pub fn spawn(mut cmd: Command) -> anyhow::Result<Running> {
    let what = format!("{:?}", cmd.get_program());
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start {what}"))?;
    let pgid = child.id() as i32;
    let out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    let (tx, rx) = channel();
    let out_thread = std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let stderr = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    Ok(Running {
        child,
        pgid,
        started: Instant::now(),
        lines: rx,
        stdout: String::new(),
        stderr: Some(stderr),
        out_thread: Some(out_thread),
    })
}

impl Running {
    fn take_line(&mut self, line: String) -> String {
        self.stdout.push_str(&line);
        self.stdout.push('\n');
        line
    }

    /// Waits until a line of its stdout satisfies `want` (returned), it exits, or `limit`.
    pub fn wait_line(
        &mut self,
        limit: Duration,
        want: impl Fn(&str) -> bool,
    ) -> anyhow::Result<String> {
        let end = Instant::now() + limit;
        loop {
            if stopped() {
                bail!("interrupted");
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!(
                    "no such line within {limit:?}; output so far: {}",
                    truncate(&self.stdout, 300)
                );
            }
            match self.lines.recv_timeout(left.min(Duration::from_millis(50))) {
                Ok(l) => {
                    let l = self.take_line(l);
                    if want(&l) {
                        return Ok(l);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    bail!("it exited first; output: {}", truncate(&self.stdout, 300))
                }
            }
        }
    }

    /// Closes its stdin (the start signal of `gpu_probe slices`, the end of a `hold`).
    pub fn close_stdin(&mut self) {
        drop(self.child.stdin.take());
    }

    /// SIGKILL to its whole group.
    pub fn kill_group(&self) {
        // SAFETY: killpg touches no memory; the group is the one this child leads (it has not
        // been reaped while we hold it, so the id cannot have been reused).
        unsafe { libc::killpg(self.pgid, libc::SIGKILL) };
    }

    /// Waits for it to exit (killing its group at `limit`), then kills what is left of its group.
    pub fn finish(mut self, limit: Duration) -> Finished {
        let end = Instant::now() + limit;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() < end && !stopped() => {
                    while let Ok(l) = self.lines.try_recv() {
                        self.take_line(l);
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                _ => {
                    self.kill_group();
                    let _ = self.child.wait();
                    break None;
                }
            }
        };
        // A daemon or job the program left behind in its group.
        self.kill_group();
        if let Some(t) = self.out_thread.take() {
            let _ = t.join();
        }
        while let Ok(l) = self.lines.try_recv() {
            self.take_line(l);
        }
        let stderr = self.stderr.take().map(|t| t.join().unwrap_or_default());
        Finished {
            status,
            stdout: std::mem::take(&mut self.stdout),
            stderr: stderr.unwrap_or_default(),
            secs: self.started.elapsed().as_secs_f64(),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.kill_group();
            let _ = self.child.wait();
        }
    }
}

/// Runs `cmd` to its end, or kills its group at `limit`.
pub fn run(cmd: Command, limit: Duration) -> anyhow::Result<Finished> {
    let mut r = spawn(cmd)?;
    r.close_stdin();
    Ok(r.finish(limit))
}

/// Every live descendant of this process (through /proc's children lists), deepest last.
fn descendants() -> Vec<i32> {
    let mut all = Vec::new();
    let mut todo = vec![std::process::id() as i32];
    while let Some(pid) = todo.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let path = t.path().join("children");
            let Ok(text) = std::fs::read_to_string(path) else {
                continue;
            };
            for c in text
                .split_whitespace()
                .filter_map(|c| c.parse::<i32>().ok())
            {
                if !all.contains(&c) {
                    all.push(c);
                    todo.push(c);
                }
            }
        }
    }
    all
}

/// Reaps every child that has exited: the descendants a step's group left, orphaned to this
/// subreaper, end as its zombies (exited, not alive) until it waits for them.
fn reap_exited() {
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes only the status integer we pass.
        if unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) } <= 0 {
            break;
        }
    }
}

/// `pid` and its command name, if it is alive (not a zombie): "1234 (simjob-train)".
fn alive(pid: i32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (head, rest) = stat.rsplit_once(')')?;
    let state = rest.trim_start().chars().next()?;
    (!matches!(state, 'Z' | 'X')).then(|| format!("{head})"))
}

/// Kills and reaps every descendant still alive (exited ones reaped first: they are not left
/// behind); returns them, "pid (name)" each, for the report.
pub fn reap_all() -> Vec<String> {
    reap_exited();
    let left: Vec<(i32, String)> = descendants()
        .into_iter()
        .filter_map(|pid| alive(pid).map(|d| (pid, d)))
        .collect();
    for (pid, _) in &left {
        // SAFETY: kill touches no memory; the pid is a descendant of ours, reparented to us (we
        // are its subreaper) and not reaped, so it cannot have been reused.
        unsafe { libc::kill(*pid, libc::SIGKILL) };
    }
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes only the status integer we pass.
        let r = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if r <= 0 {
            if r < 0 || descendants().is_empty() || Instant::now() > end {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    left.into_iter().map(|(_, d)| d).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_kills_the_whole_group() {
        let mut cmd = Command::new("sh");
        // The grandchild sleeps in the same group; both must be gone at the deadline.
        cmd.args(["-c", "sleep 30 & echo started; wait"]);
        let mut r = spawn(cmd).unwrap();
        r.wait_line(Duration::from_secs(10), |l| l == "started")
            .unwrap();
        let pgid = r.pgid;
        let f = r.finish(Duration::from_millis(200));
        assert!(f.status.is_none(), "{f:?}");
        assert!(f.why().starts_with("killed at its deadline"));
        // The killed grandchild is reaped by init, not by us: wait (bounded) for the group to go.
        let end = Instant::now() + Duration::from_secs(10);
        // SAFETY: signal 0 only checks whether the group has a member.
        while unsafe { libc::killpg(pgid, 0) } == 0 {
            assert!(Instant::now() < end, "the group outlived its deadline");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn an_orphan_that_exited_is_reaped_not_counted_and_a_live_one_is_named_and_killed() {
        init();
        let mut cmd = Command::new("sh");
        // Two orphans reparented to this subreaper: one exits at once, one lives.
        cmd.args(["-c", "true & sleep 30 & echo started"]);
        let f = run(cmd, Duration::from_secs(10)).unwrap();
        assert!(f.ok(), "{f:?}");
        // The group was killed at its end: wait (bounded) until both are zombies of ours.
        let end = Instant::now() + Duration::from_secs(10);
        while descendants().iter().any(|&p| alive(p).is_some()) {
            assert!(Instant::now() < end, "the group outlived its end");
            std::thread::sleep(Duration::from_millis(10));
        }
        // The killed `sleep` is a zombie of ours (this process is its subreaper): listed among
        // the descendants, which is what the settings check counted as "still alive".
        assert!(!descendants().is_empty(), "no zombie of ours to reap");
        assert_eq!(
            reap_all(),
            Vec::<String>::new(),
            "exited orphans are not left behind"
        );
        assert!(descendants().is_empty(), "reaped");

        // One that escaped its group (setsid) is alive: named, killed, reaped.
        let mut cmd = Command::new("sh");
        // `started` once the orphan is in a session of its own (field 6 of its stat), so the
        // end of the script's group cannot take it.
        cmd.args([
            "-c",
            "setsid sleep 30 </dev/null >/dev/null 2>&1 & p=$!; \
             while [ \"$(cut -d' ' -f6 /proc/$p/stat)\" = \"$(cut -d' ' -f6 /proc/$$/stat)\" ]; \
             do :; done; echo started",
        ]);
        let f = run(cmd, Duration::from_secs(10)).unwrap();
        assert!(f.ok(), "{f:?}");
        let end = Instant::now() + Duration::from_secs(10);
        while !descendants().iter().any(|&p| alive(p).is_some()) {
            assert!(Instant::now() < end, "the escaped orphan never showed");
            std::thread::sleep(Duration::from_millis(10));
        }
        let left = reap_all();
        assert_eq!(left.len(), 1, "{left:?}");
        assert!(
            left[0].ends_with("(sleep)") || left[0].ends_with("(setsid)"),
            "{left:?}"
        );
        assert!(descendants().is_empty(), "killed and reaped");
    }

    #[test]
    fn output_and_status_of_a_program_that_ends() {
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            "echo '{\"check\":\"x\",\"v\":1}'; echo not-json; echo oops >&2; exit 3",
        ]);
        let f = run(cmd, Duration::from_secs(10)).unwrap();
        assert_eq!(f.status.and_then(|s| s.code()), Some(3));
        assert!(!f.ok());
        assert_eq!(f.json().len(), 1);
        assert_eq!(f.stderr.trim(), "oops");
        assert!(f.why().contains("not-json / oops"), "{}", f.why());
    }
}
