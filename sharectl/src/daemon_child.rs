//! A private `sharectl daemon` child (the benchmark's runs and the demo's third phase).

use anyhow::{anyhow, bail, Context};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the daemon's CPU clock is sampled while it runs.
const CPU_SAMPLE: Duration = Duration::from_millis(50);

/// A private `sharectl daemon` on the run's state dir; stopped when dropped.
pub struct Daemon {
    child: Child,
    started: Instant,
    cpu0: u64,
    reaped: bool,
    sampler: Option<(Arc<AtomicBool>, JoinHandle<Vec<CpuSample>>)>,
}

/// The daemon's CPU clock at one moment: (`CLOCK_MONOTONIC` seconds, CPU ns of all its threads).
pub type CpuSample = (f64, u64);

/// What a daemon used: percent of one core over its whole run (start-up excluded), and its
/// CPU clock sampled every 50 ms, so a caller can take the figure over a window of its own.
#[derive(Clone, Debug, Default)]
pub struct CpuUse {
    pub pct: f64,
    pub samples: Vec<CpuSample>,
}

impl CpuUse {
    /// Percent of one core between the first sample at or after `a` and the last at or before
    /// `b` (monotonic seconds); None when they are less than 0.5 s apart.
    pub fn pct_between(&self, a: f64, b: f64) -> Option<f64> {
        let first = self.samples.iter().find(|s| s.0 >= a)?;
        let last = self.samples.iter().rev().find(|s| s.0 <= b)?;
        let wall = last.0 - first.0;
        (wall >= 0.5).then(|| last.1.saturating_sub(first.1) as f64 / 1e9 / wall * 100.0)
    }
}

impl Daemon {
    pub fn start(sharectl: &Path, dir: &Path, policy: &str) -> anyhow::Result<Daemon> {
        Daemon::start_with(sharectl, dir, policy, &[])
    }

    /// [`Daemon::start`] with `extra` daemon arguments (e.g. `--no-demotion`).
    pub fn start_with(
        sharectl: &Path,
        dir: &Path,
        policy: &str,
        extra: &[String],
    ) -> anyhow::Result<Daemon> {
        Self::start_with_env(sharectl, dir, policy, extra, &[])
    }

    /// [`Daemon::start_with`] with extra environment `env` (S5: the GPU's, so the daemon reads
    /// the device's memory through NVML as on a GPU node).
    pub fn start_with_env(
        sharectl: &Path,
        dir: &Path,
        policy: &str,
        extra: &[String],
        env: &[(String, std::ffi::OsString)],
    ) -> anyhow::Result<Daemon> {
        let mut cmd = Command::new(sharectl);
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        cmd.arg("daemon")
            .arg("--state-dir")
            .arg(dir)
            .args(["--policy", policy, "--quantum", "100ms"])
            // The jobs run on this host, named by LIBSHARE_CONTAINER (no container runtime).
            .arg("--trust-env")
            .args(extra)
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
        let cpu0 = proc_cpu_ns(child.id()).unwrap_or(0);
        let started = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let (pid, s2) = (child.id(), stop.clone());
        let sampler = std::thread::spawn(move || {
            let mut samples = Vec::new();
            while !s2.load(Ordering::Relaxed) {
                match proc_cpu_ns(pid) {
                    Some(ns) => samples.push((libshare_abi::rate::now_s(), ns)),
                    None => break,
                }
                std::thread::sleep(CPU_SAMPLE);
            }
            samples
        });
        Ok(Daemon {
            child,
            started,
            cpu0,
            reaped: false,
            sampler: Some((stop, sampler)),
        })
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Reads its CPU time, stops it (SIGTERM) and returns what it used since it started.
    pub fn finish(mut self) -> anyhow::Result<CpuUse> {
        let cpu1 = proc_cpu_ns(self.child.id());
        let wall = self.started.elapsed().as_secs_f64();
        let mut samples = self.stop_sampler();
        if !self.stop() {
            bail!("sharectl daemon did not stop within 5 s of SIGTERM");
        }
        let cpu1 = cpu1.ok_or_else(|| anyhow!("sharectl daemon exited during the run"))?;
        samples.push((libshare_abi::rate::now_s(), cpu1));
        Ok(CpuUse {
            pct: (cpu1.saturating_sub(self.cpu0)) as f64 / 1e9 / wall.max(1e-3) * 100.0,
            samples,
        })
    }

    fn stop_sampler(&mut self) -> Vec<CpuSample> {
        match self.sampler.take() {
            Some((stop, h)) => {
                stop.store(true, Ordering::Relaxed);
                h.join().unwrap_or_default()
            }
            None => Vec::new(),
        }
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
        self.stop_sampler();
        self.stop();
    }
}

/// CPU time of process `pid`, ns: all its threads, those that ended included, from the
/// kernel's scheduler accounting (`clock_getcpuclockid`). `/proc/<pid>/stat` counts in 10 ms
/// clock ticks: at ~2 % of a core over a 5 s run, steps of 0.2 points.
fn proc_cpu_ns(pid: u32) -> Option<u64> {
    let mut clk: libc::clockid_t = 0;
    // SAFETY: `clk` is a valid out-pointer.
    if unsafe { libc::clock_getcpuclockid(pid as libc::pid_t, &mut clk) } != 0 {
        return None;
    }
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    if unsafe { libc::clock_gettime(clk, &mut ts) } != 0 {
        return None;
    }
    Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_child_s_cpu_time_grows_and_a_gone_one_has_none() {
        let mut child = std::process::Command::new("/bin/sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .unwrap();
        let a = proc_cpu_ns(child.id()).unwrap();
        // It spins: its clock passes 30 ms of CPU however loaded the machine is, only later.
        let t = Instant::now();
        let mut b = a;
        while b < a + 30_000_000 && t.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(10));
            b = proc_cpu_ns(child.id()).unwrap();
        }
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(b >= a + 30_000_000, "{a} -> {b} in {:?}", t.elapsed());
        assert_eq!(proc_cpu_ns(child.id()), None, "reaped");
    }
}
