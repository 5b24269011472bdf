//! A private `sharectl daemon` child (the benchmark's runs and the demo's third phase).

use anyhow::{anyhow, bail, Context};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A private `sharectl daemon` on the run's state dir; stopped when dropped.
pub struct Daemon {
    child: Child,
    started: Instant,
    cpu0: u64,
    reaped: bool,
}

impl Daemon {
    pub fn start(sharectl: &Path, dir: &Path, policy: &str) -> anyhow::Result<Daemon> {
        let mut cmd = Command::new(sharectl);
        cmd.arg("daemon")
            .arg("--state-dir")
            .arg(dir)
            .args(["--policy", policy, "--quantum", "100ms"])
            // The jobs run on this host, named by LIBSHARE_CONTAINER (no container runtime).
            .arg("--trust-env")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // The daemon reads only the containers' state files: unlike the jobs, it gets none of
        // the (simulated) GPU's environment.
        let mut child = cmd.spawn().context("cannot start sharectl daemon")?;
        // It must still be running a moment later (a bad flag or a missing subcommand exits).
        std::thread::sleep(Duration::from_millis(150));
        if let Some(st) = child.try_wait()? {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                use std::io::Read;
                let _ = e.read_to_string(&mut err);
            }
            let line = err
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            bail!("sharectl daemon --policy {policy} exited at once ({st}): {line}");
        }
        // Drain its stderr so it never blocks on a full pipe.
        if let Some(e) = child.stderr.take() {
            std::thread::spawn(move || {
                use std::io::Read;
                let mut sink = Vec::new();
                let _ = std::io::BufReader::new(e).read_to_end(&mut sink);
            });
        }
        // CPU use is counted from here (start-up excluded), over the jobs' run.
        let cpu0 = proc_cpu_ticks(child.id()).unwrap_or(0);
        let started = Instant::now();
        Ok(Daemon {
            child,
            started,
            cpu0,
            reaped: false,
        })
    }

    /// Reads its CPU time, stops it (SIGTERM) and returns its CPU use in percent of one core
    /// since it started.
    pub fn finish(mut self) -> anyhow::Result<f64> {
        let cpu1 = proc_cpu_ticks(self.child.id());
        let wall = self.started.elapsed().as_secs_f64();
        if !self.stop() {
            bail!("sharectl daemon did not stop within 5 s of SIGTERM");
        }
        let cpu1 = cpu1.ok_or_else(|| anyhow!("sharectl daemon exited during the run"))?;
        // SAFETY: sysconf reads a constant of the system.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        Ok((cpu1.saturating_sub(self.cpu0)) as f64 / hz / wall.max(1e-3) * 100.0)
    }
}

impl Daemon {
    /// SIGTERM, then up to 5 s for it to exit, then SIGKILL. Whether it stopped on SIGTERM.
    fn stop(&mut self) -> bool {
        if self.reaped {
            return true;
        }
        self.reaped = true;
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return true;
        }
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: kill touches no memory; the pid is our own child's, unreaped until the
            // wait below (`reaped` keeps this from running twice).
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => return true,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return false;
                }
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// utime + stime of `pid` (all its threads), clock ticks, from `/proc/<pid>/stat`.
fn proc_cpu_ticks(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat_cpu(&s)
}

/// Fields 14 and 15 (utime, stime) of a `/proc/<pid>/stat` line; the command name (field 2)
/// may hold spaces and parentheses, so fields are counted after its last `)`.
fn parse_stat_cpu(s: &str) -> Option<u64> {
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14, index 11.
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_cpu() {
        let line = "1234 (sharectl (x) y) S 1 2 3 4 5 6 7 8 9 10 170 30 0 0 20 0 3 0 100";
        assert_eq!(parse_stat_cpu(line), Some(200));
        assert_eq!(parse_stat_cpu("garbage"), None);
    }
}
