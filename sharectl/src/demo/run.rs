//! The demo's run: its phases, their jobs and the daemon, and what the jobs report.

use super::view::{check_stdout, Output};
use super::{
    Container, Grow, NoShim, OppRate, PhaseResult, Shim, BATCH, GROW, OPPORTUNISTIC, PROD,
    PRODUCTION,
};
use crate::child::{self, Job, Msg, Role};
use crate::daemon_child::Daemon;
use crate::node_view as status;
use crate::platform::{self, Gpu, StateDir};
use anyhow::{anyhow, bail};
use jobs::profiles::Train;
use serde_json::Value;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// What `sharectl demo` was asked: `commands::demo::DemoArgs`.
pub struct Options {
    pub duration: f64,
    pub platform: platform::PlatformArgs,
    pub shim: Option<PathBuf>,
    pub no_shim: bool,
    pub json: bool,
}

/// How long a job may take to start (CUDA initialisation) or to stop after its duration.
const GRACE: Duration = Duration::from_secs(60);

pub fn run(args: Options) -> anyhow::Result<()> {
    let gpu = args.platform.gpu()?;
    let train_bin = platform::job_binary(args.platform.jobs_dir.as_deref(), Train::BIN)?;
    let shim = if args.no_shim {
        Err(NoShim::Asked)
    } else {
        match platform::shim_library(args.shim.as_deref())? {
            Some(lib) => Ok(Shim {
                lib,
                state: StateDir::create()?,
            }),
            None => Err(NoShim::NotFound(platform::shim_candidates()?)),
        }
    };
    let out = Output { json: args.json };
    let demo = Demo {
        gpu: &gpu,
        train_bin: &train_bin,
        shim: shim.as_ref().ok(),
        secs: args.duration,
        out,
        daemon: std::cell::Cell::new(false),
    };
    out.intro(&gpu, &shim, args.duration);

    out.phase_header(1, if demo.shim.is_some() { 3 } else { 2 }, args.duration);
    let solo = demo.phase(None)?;
    let solo_rate = rate(&solo.production)?;
    out.phase_done(&solo);

    let phases = if demo.shim.is_some() { 3 } else { 2 };
    check_stdout()?;
    out.phase_header(2, phases, args.duration);
    let co = demo.phase(Some(solo_rate))?;
    out.phase_done(&co);

    // Phase 3: the same pair under the coordinator daemon (needs the shim).
    let shared = match demo.shim {
        Some(shim) => {
            check_stdout()?;
            out.phase_header(3, phases, args.duration);
            let sharectl = std::env::current_exe()?;
            let daemon = Daemon::start(&sharectl, shim.state.path(), "libshare")?;
            demo.daemon.set(true);
            let r = demo.phase(Some(solo_rate));
            demo.daemon.set(false);
            daemon.finish()?;
            let r = r?;
            out.phase_done(&r);
            Some(r)
        }
        None => None,
    };

    out.summary(&gpu, demo.shim, &solo, &co, shared.as_ref());
    Ok(())
}

fn rate(final_line: &Value) -> anyhow::Result<f64> {
    final_line["iters_per_s"]
        .as_f64()
        .ok_or_else(|| anyhow!("{} reported no iters_per_s", Train::BIN))
}

struct Demo<'a> {
    gpu: &'a Gpu,
    train_bin: &'a Path,
    shim: Option<&'a Shim>,
    secs: f64,
    out: Output,
    /// Whether the phase being run has the daemon.
    daemon: std::cell::Cell<bool>,
}

impl Demo<'_> {
    fn args(&self, profile: Train, secs: f64, interval: &str) -> Vec<String> {
        let mut v = profile.args();
        v.extend([
            "--duration".into(),
            format!("{secs}"),
            "--report-interval".into(),
            interval.into(),
        ]);
        v
    }

    /// Environment of a process of container `c`: the GPU's, plus the shim's if in use.
    fn env(&self, c: Container) -> Vec<(String, OsString)> {
        let mut env = self.gpu.job_env();
        if let Some(shim) = self.shim {
            env.extend(shim.env(c));
        }
        env
    }

    /// Every container's figures, read like `sharectl status` does; None without the shim. A
    /// state file being created at this instant is skipped (it shows on the next read).
    fn containers(&self) -> Option<Vec<Value>> {
        let shim = self.shim?;
        Some(
            status::read_containers(shim.state.path())
                .map(|(c, _errors)| c)
                .unwrap_or_default(),
        )
    }

    /// Runs the production job for `secs`, alone (`solo == None`) or next to the opportunistic
    /// job (`solo == Some(solo rate)`, used for the live ratio).
    fn phase(&self, solo: Option<f64>) -> anyhow::Result<PhaseResult> {
        let (tx, rx) = mpsc::channel();
        let mut sat = None;
        if solo.is_some() {
            // Start the opportunistic job first and let it run until the production job is done
            // (then stop it with SIGTERM), so the whole production run is co-located.
            let args = self.args(OPPORTUNISTIC, self.secs + GRACE.as_secs_f64(), "0.5s");
            let job = Job::spawn(
                Role::Opportunistic,
                self.train_bin,
                &args,
                &self.env(BATCH),
                tx.clone(),
            )?;
            match wait_for_start(&rx, Role::Opportunistic) {
                Ok(()) => sat = Some(job),
                Err(e) => return Err(fail(job, e)),
            }
        }
        let args = self.args(PRODUCTION, self.secs, "1s");
        let train = match Job::spawn(
            Role::Production,
            self.train_bin,
            &args,
            &self.env(PROD),
            tx.clone(),
        ) {
            Ok(j) => j,
            Err(e) => {
                if let Some(s) = sat {
                    s.abort();
                }
                return Err(e);
            }
        };
        drop(tx);

        let mut live = Live::default();
        let result = self.watch(&rx, solo, &mut live);
        let production = match result {
            Ok(v) => v,
            Err(e) => {
                if let Some(s) = sat {
                    s.abort();
                }
                return Err(fail(train, e));
            }
        };
        if let Err(e) = train.finish(GRACE) {
            if let Some(s) = sat {
                s.abort();
            }
            return Err(e);
        }
        // The second batch worker, if it has not reported yet (a very short phase).
        if let Some(grow_rx) = live.grow_rx.take() {
            let g = grow_rx.recv_timeout(GRACE).unwrap_or(Grow {
                refused: false,
                message: format!("{} did not report in time", GROW.0),
            });
            self.out.grow(&g);
            live.grow = Some(g);
            // Its refusal happened after production's last snapshot: read the containers again
            // (production has freed its memory by now; its peak still shows).
            live.snapshot = self.containers();
        }
        let mut opportunistic = None;
        if let Some(s) = sat {
            s.request_stop();
            let final_line = wait_for_final(&rx, Role::Opportunistic);
            s.finish(GRACE)?;
            opportunistic = live.overlap_rate().or_else(|| {
                final_line.map(|v| OppRate::from_iters(v["iters_per_s"].as_f64().unwrap_or(0.0)))
            });
        }
        Ok(PhaseResult {
            production,
            opportunistic,
            containers: live.snapshot.take().or_else(|| self.containers()),
            grow: live.grow,
        })
    }

    /// Starts the second batch worker on a thread; its outcome arrives on the returned channel.
    fn start_grow(&self) -> Receiver<Grow> {
        let (tx, rx) = mpsc::channel();
        let mut cmd = Command::new(self.train_bin);
        cmd.args(GROW.1)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in self.env(BATCH) {
            cmd.env(k, v);
        }
        std::thread::spawn(move || {
            let g = match cmd.output() {
                Err(e) => Grow {
                    refused: false,
                    message: format!("cannot start {}: {e}", GROW.0),
                },
                Ok(out) if out.status.success() => Grow {
                    refused: false,
                    message: format!("{} got its memory (not refused)", GROW.0),
                },
                Ok(out) => {
                    let err = String::from_utf8_lossy(&out.stderr);
                    let prefix = format!("{}: ", GROW.0);
                    let line = err
                        .lines()
                        .rev()
                        .find(|l| l.starts_with(&prefix))
                        .or_else(|| err.lines().last())
                        .unwrap_or("failed without a message")
                        .to_string();
                    Grow {
                        refused: line.contains("CUDA_ERROR_OUT_OF_MEMORY"),
                        message: line,
                    }
                }
            };
            let _ = tx.send(g);
        });
        rx
    }

    /// Follows both jobs until the production job's final line; prints live numbers on each
    /// production progress line (once a second).
    fn watch(
        &self,
        rx: &Receiver<Msg>,
        solo: Option<f64>,
        live: &mut Live,
    ) -> anyhow::Result<Value> {
        let deadline = Instant::now() + Duration::from_secs_f64(self.secs) + GRACE;
        loop {
            check_stdout()?;
            if let Some(g) = live.grow_rx.as_ref().and_then(|r| r.try_recv().ok()) {
                live.grow_rx = None;
                self.out.grow(&g);
                live.grow = Some(g);
                live.snapshot = self.containers();
            }
            let msg = match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(m) => m,
                Err(RecvTimeoutError::Timeout) => {
                    if Instant::now() > deadline {
                        bail!("{} did not finish in time", Train::BIN);
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    bail!("{} stopped without a summary", Train::BIN)
                }
            };
            match msg {
                Msg::Line(Role::Production, v) => match v["event"].as_str() {
                    Some("start") => {
                        live.production_started = Some(Instant::now());
                        // Both jobs hold their memory now: the batch container tries to grow.
                        if solo.is_some() && self.shim.is_some() && !self.daemon.get() {
                            live.grow_rx = Some(self.start_grow());
                        }
                    }
                    Some("progress") => {
                        let r = v["iters_per_s"].as_f64().unwrap_or(0.0);
                        let t = v["t"].as_f64().unwrap_or(0.0);
                        let containers = self.containers();
                        self.out.live(
                            t,
                            r,
                            solo,
                            live.latest,
                            containers.as_deref(),
                            self.daemon.get(),
                        );
                        live.snapshot = containers;
                    }
                    Some("final") => {
                        live.production_finished = Some(Instant::now());
                        return Ok(v);
                    }
                    _ => {}
                },
                Msg::Line(Role::Opportunistic, v) => live.opportunistic(&v),
                Msg::Eof(Role::Production) => {
                    bail!("{} stopped without a summary", Train::BIN)
                }
                Msg::Eof(Role::Opportunistic) => {
                    bail!("the opportunistic {} stopped early", Train::BIN)
                }
            }
        }
    }
}

/// Turns a failure while a job runs into the job's own error if it has one (e.g. no driver).
fn fail(job: Job, e: anyhow::Error) -> anyhow::Error {
    let name = job.name.clone();
    let mut job = job;
    // Give a job that is exiting on its own a moment, so its exit status and message are seen.
    for _ in 0..25 {
        if job.exited() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    match job.wait(Duration::ZERO) {
        Ok((status, tail)) if !status.success() && status.code().is_some() => {
            child::job_failed(&name, status, &tail)
        }
        _ => e,
    }
}

fn wait_for_start(rx: &Receiver<Msg>, role: Role) -> anyhow::Result<()> {
    let deadline = Instant::now() + GRACE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Msg::Line(r, v)) if r == role && v["event"] == "start" => return Ok(()),
            Ok(Msg::Eof(r)) if r == role => bail!("{:?} job stopped before starting", role),
            Ok(_) => {}
            Err(_) => bail!("{:?} job did not start within {}s", role, GRACE.as_secs()),
        }
    }
}

fn wait_for_final(rx: &Receiver<Msg>, role: Role) -> Option<Value> {
    let deadline = Instant::now() + GRACE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Msg::Line(r, v)) if r == role && v["event"] == "final" => return Some(v),
            Ok(Msg::Eof(r)) if r == role => return None,
            Ok(_) => {}
            Err(_) => return None,
        }
    }
}

/// Live state of a phase: the opportunistic job's progress, the second batch worker, the latest
/// container figures.
#[derive(Default)]
struct Live {
    production_started: Option<Instant>,
    production_finished: Option<Instant>,
    /// Latest opportunistic window rate.
    latest: Option<OppRate>,
    /// (received at, job's t, cumulative iterations) for each opportunistic progress line.
    points: Vec<(Instant, f64, f64)>,
    /// The second batch worker, while it runs.
    grow_rx: Option<Receiver<Grow>>,
    /// Its outcome.
    grow: Option<Grow>,
    /// The latest container figures.
    snapshot: Option<Vec<Value>>,
}

impl Live {
    fn opportunistic(&mut self, v: &Value) {
        if v["event"] != "progress" {
            return;
        }
        let (Some(ips), Some(t), Some(n)) = (
            v["iters_per_s"].as_f64(),
            v["t"].as_f64(),
            v["iters"].as_f64(),
        ) else {
            return;
        };
        self.latest = Some(OppRate::from_iters(ips));
        self.points.push((Instant::now(), t, n));
    }

    /// The opportunistic job's rate between the production job's start and end lines.
    fn overlap_rate(&self) -> Option<OppRate> {
        let (from, to) = (self.production_started?, self.production_finished?);
        let inside: Vec<_> = self
            .points
            .iter()
            .filter(|p| p.0 >= from && p.0 <= to)
            .collect();
        let (first, last) = (inside.first()?, inside.last()?);
        let dt = last.1 - first.1;
        if dt <= 0.0 {
            return None;
        }
        Some(OppRate::from_iters((last.2 - first.2) / dt))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::demo::OPPORTUNISTIC_GPU_MS;

    #[test]
    fn overlap_rate_uses_lines_inside_the_production_run() {
        let t0 = Instant::now();
        let mut live = Live {
            production_started: Some(t0),
            ..Live::default()
        };
        let at = |ms| t0 + Duration::from_millis(ms);
        live.points = vec![
            (t0 - Duration::from_millis(1), 0.0, 0.0),
            (at(10), 1.0, 100.0),
            (at(20), 2.0, 300.0),
            (at(30), 3.0, 500.0),
            (at(50), 4.0, 10_000.0),
        ];
        live.production_finished = Some(at(40));
        let r = live.overlap_rate().unwrap();
        assert_eq!(r.iters_per_s, 200.0);
        assert_eq!(r.gpu_ms_per_s, 200.0 * OPPORTUNISTIC_GPU_MS);
        live.points.truncate(2);
        assert_eq!(live.overlap_rate(), None);
    }
}
