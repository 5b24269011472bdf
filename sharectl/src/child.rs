//! A job process whose stdout is read as JSON lines on a background thread (`sharectl demo` and
//! `sharectl bench`).

use anyhow::{anyhow, Context};
use serde_json::Value;
use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Which of the demo's jobs a message is from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Production,
    Opportunistic,
}

/// A message from a job's stdout reader, tagged with what the job was started with (the demo's
/// [`Role`], the bench's job index).
#[derive(Debug)]
pub enum Msg<T = Role> {
    /// One JSON line.
    Line(T, Value),
    /// Its stdout closed (the process is exiting).
    Eof(T),
}

/// How much of a job's stderr to keep for error messages.
const STDERR_TAIL: usize = 20;

pub struct Job {
    pub name: String,
    child: Child,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    threads: Vec<JoinHandle<()>>,
}

impl Job {
    /// The job's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Starts `bin args...` with extra environment `env`; every JSON line of its stdout is sent
    /// to `tx` (lines that are not JSON objects are ignored).
    pub fn spawn<T: Copy + Send + 'static>(
        role: T,
        bin: &Path,
        args: &[String],
        env: &[(String, OsString)],
        tx: Sender<Msg<T>>,
    ) -> anyhow::Result<Job> {
        let name = bin
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| bin.display().to_string());
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start {}", bin.display()))?;
        let stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        let stderr_tail = Arc::new(Mutex::new(VecDeque::new()));
        let tail = stderr_tail.clone();
        let t_err = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut t = tail.lock().unwrap();
                if t.len() == STDERR_TAIL {
                    t.pop_front();
                }
                t.push_back(line);
            }
        });
        let t_out = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(v @ Value::Object(_)) = serde_json::from_str::<Value>(&line) {
                    if tx.send(Msg::Line(role, v)).is_err() {
                        return;
                    }
                }
            }
            let _ = tx.send(Msg::Eof(role));
        });
        Ok(Job {
            name,
            child,
            stderr_tail,
            threads: vec![t_out, t_err],
        })
    }

    /// Asks the job to stop early (SIGTERM); it still prints its final line.
    pub fn request_stop(&self) {
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: kill touches no memory of ours. The pid is our own child's: it cannot have
            // been reused by another process as long as the child is unreaped, which holds here
            // because every reaping method (`wait`, `finish`, `abort`) consumes the Job, except
            // `exited()`, after which the demo never calls `request_stop`.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
    }

    /// Waits up to `timeout` for the job to exit, then kills it. Returns its exit status.
    pub fn wait(mut self, timeout: Duration) -> anyhow::Result<(ExitStatus, Vec<String>)> {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(st) = self.child.try_wait()? {
                break st;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                break self.child.wait()?;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let tail = self.stderr_tail.lock().unwrap().iter().cloned().collect();
        Ok((status, tail))
    }

    /// Waits (bounded) and turns a failed exit into an error quoting the job's stderr.
    pub fn finish(self, timeout: Duration) -> anyhow::Result<()> {
        let name = self.name.clone();
        let (status, tail) = self.wait(timeout)?;
        if status.success() {
            Ok(())
        } else {
            Err(job_failed(&name, status, &tail))
        }
    }

    /// Kills the job (used when the demo itself fails) and returns its stderr tail.
    pub fn abort(mut self) -> Vec<String> {
        let _ = self.child.kill();
        self.wait(Duration::from_secs(5))
            .map(|(_, t)| t)
            .unwrap_or_default()
    }

    /// Whether the process has exited (reaps it if so).
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }
}

/// An error for a job that exited badly: its last stderr line(s) (the jobs print one line).
pub fn job_failed(name: &str, status: ExitStatus, tail: &[String]) -> anyhow::Error {
    let how = match status.code() {
        Some(c) => format!("exit code {c}"),
        None => format!("{status}"),
    };
    // Prefer the job's own error line over driver log lines (e.g. with SIMGPU_LOG=debug).
    let prefix = format!("{name}: ");
    let line = tail
        .iter()
        .rev()
        .find(|l| l.starts_with(&prefix))
        .or_else(|| tail.last());
    match line {
        Some(last) => anyhow!("{name} failed ({how}): {last}"),
        None => anyhow!("{name} failed ({how}) without a message"),
    }
}
