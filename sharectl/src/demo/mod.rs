//! `sharectl demo`: a production and an opportunistic job on one GPU (real, or simgpu).
//!
//! It shows what libshare enforces today and what it does not yet. Both jobs run under the shim
//! (`libshare.so`, preloaded) as two containers with memory quotas, "prod" (production) and
//! "batch" (opportunistic), in a state directory private to the run; the live numbers include
//! each container's memory, read from the shim's state files as `sharectl status` reads them.
//! Phase 1 runs the production job alone for its solo throughput; phase 2 runs it next to an
//! opportunistic job that keeps the GPU busy, and a second batch worker tries to grow the batch
//! container past its quota (the shim refuses it). Phase 2 shares compute natively (no daemon:
//! every gate is open), so it shows the harm; phase 3 runs the same pair under a private
//! `sharectl daemon` (policy `libshare`): production back to about its solo throughput, the
//! opportunistic job in the GPU time production leaves idle. The jobs are the ordinary CUDA
//! programs of the `jobs` crate, started as child processes; the demo reads their JSON lines.

use crate::child::{self, Job, Msg, Role};
use crate::commands::status;
use crate::daemon_child::Daemon;
use crate::platform::{self, Gpu, StateDir};
use anyhow::{anyhow, bail};
use jobs::profiles::{Train, TRAIN};
use libshare_abi::units::format_size;
use serde_json::{json, Value};
use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// Set when writing to stdout failed (e.g. `sharectl demo --json | head -1`).
static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// The demo stopped because its stdout went away; `main` exits quietly.
#[derive(Debug)]
pub struct StdoutClosed;

impl std::fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stdout closed")
    }
}

impl std::error::Error for StdoutClosed {}

fn say_line(args: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{args}").and_then(|()| out.flush()).is_err() {
        STDOUT_CLOSED.store(true, Ordering::Relaxed);
    }
}

/// `println!` that records a closed stdout instead of panicking.
macro_rules! say {
    ($($arg:tt)*) => { say_line(format_args!($($arg)*)) };
}

fn check_stdout() -> anyhow::Result<()> {
    if STDOUT_CLOSED.load(Ordering::Relaxed) {
        return Err(StdoutClosed.into());
    }
    Ok(())
}

/// Run a production and an opportunistic job on this machine's GPU, or on simgpu.
///
/// Both run under libshare's shim as two containers with memory quotas: "prod" (production) and
/// "batch" (opportunistic, smaller quota). Phase 1 runs the production job alone; phase 2 runs it
/// next to the opportunistic job, which keeps the GPU busy, and a second batch worker tries to
/// grow the batch container past its quota (the shim refuses it). Live throughput and
/// per-container memory are printed once a second, then a summary. Kernel-rate control (the
/// daemon that protects production's GPU time) is not running in phase 2; phase 3 runs the pair
/// again under `sharectl daemon`.
#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Seconds per phase.
    #[arg(long, value_name = "SECS", default_value = "5", value_parser = |s: &str| crate::commands::parse_secs(s, 0.5..=3600.0))]
    pub duration: f64,

    #[command(flatten)]
    pub platform: platform::PlatformArgs,

    /// The shim to preload [default: libshare.so next to the sharectl binary, else
    /// <target>/dist/libshare.so; without either the demo runs without the shim].
    #[arg(long, value_name = "FILE", conflicts_with = "no_shim")]
    pub shim: Option<PathBuf>,

    /// Run the jobs without the shim (native co-location only, no quotas).
    #[arg(long)]
    pub no_shim: bool,

    /// Print JSON lines (progress, then a final summary with "final": true) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// The production job: the shared training profile (6 ms of GPU then 4 ms of CPU per
/// iteration), holding 512 MiB instead of its 256 MiB.
const PRODUCTION: Train = TRAIN.with_mem_mib(512);

/// GPU time per production iteration.
const PRODUCTION_GPU_MS: f64 = PRODUCTION.gpu_ms;

/// The opportunistic job: best-effort training with no host gap, i.e. back-to-back kernels
/// (4 in flight, then a sync): it takes all the GPU time it can get.
const OPPORTUNISTIC: Train = Train {
    gpu_ms: 8.0,
    kernels: 4,
    cpu_ms: 0.0,
    mem_mib: 384,
};

/// GPU time per opportunistic iteration, and its kernels.
const OPPORTUNISTIC_GPU_MS: f64 = OPPORTUNISTIC.gpu_ms;
const OPPORTUNISTIC_KERNELS: f64 = OPPORTUNISTIC.kernels as f64;

/// A second worker of the batch container, started in phase 2: it asks for more memory than is
/// left of the container's quota (384 MiB held + 256 MiB > 512 MiB).
const GROW: (&str, &[&str]) = (
    "simjob-train",
    &[
        "--mem",
        "256MiB",
        "--iters",
        "1",
        "--gpu-ms",
        "1",
        "--kernels",
        "1",
        "--cpu-ms",
        "0",
        "--report-interval",
        "0",
    ],
);

/// What the second batch worker asks for (its `--mem`).
const GROW_BYTES: u64 = 256 << 20;

/// A libshare container of the demo: its name, class and memory quota (the shim's variables).
#[derive(Clone, Copy, Debug)]
struct Container {
    name: &'static str,
    class: &'static str,
    quota: &'static str,
}

impl Container {
    /// The quota as `sharectl status` prints sizes (`512 MiB`).
    fn quota_text(&self) -> String {
        libshare_abi::units::parse_size(self.quota)
            .map(format_size)
            .unwrap_or_else(|| self.quota.to_string())
    }
}

const PROD: Container = Container {
    name: "prod",
    class: "production",
    quota: "2GiB",
};

const BATCH: Container = Container {
    name: "batch",
    class: "opportunistic",
    quota: "512MiB",
};

/// How long a job may take to start (CUDA initialisation) or to stop after its duration.
const GRACE: Duration = Duration::from_secs(60);

/// The shim, preloaded into every job, with a state directory private to this demo run.
struct Shim {
    lib: PathBuf,
    state: StateDir,
}

impl Shim {
    /// The shim's variables for a process of container `c`.
    fn env(&self, c: Container) -> Vec<(String, OsString)> {
        vec![
            ("LD_PRELOAD".into(), self.lib.clone().into()),
            ("LIBSHARE_STATE_DIR".into(), self.state.path().into()),
            ("LIBSHARE_CONTAINER".into(), c.name.into()),
            ("LIBSHARE_CLASS".into(), c.class.into()),
            ("LIBSHARE_MEMORY_LIMIT".into(), c.quota.into()),
        ]
    }
}

/// Why the demo runs without the shim.
enum NoShim {
    /// `--no-shim`.
    Asked,
    /// Not built: where it was looked for.
    NotFound(Vec<PathBuf>),
}

impl NoShim {
    /// Why, and what to do about it, one line each.
    fn lines(&self) -> Vec<String> {
        match self {
            NoShim::Asked => vec!["--no-shim: the jobs run without libshare".into()],
            NoShim::NotFound(paths) => vec![
                format!(
                    "libshare.so not found (looked for {})",
                    paths
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                "build it: cargo build --release -p libshare (or scripts/build-shim.sh for target/dist/libshare.so)".into(),
                "running without the shim: no memory quotas, no per-container numbers".into(),
            ],
        }
    }
}

pub fn run(args: DemoArgs) -> anyhow::Result<()> {
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
    out.intro(&gpu, &shim, &args);

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

/// What one phase measured.
struct PhaseResult {
    /// The production job's final line.
    production: Value,
    /// The opportunistic job's throughput while the production job ran, if it ran.
    opportunistic: Option<OppRate>,
    /// The containers (as `sharectl status --json` shows them) late in the phase, while the jobs
    /// still held their memory; None without the shim.
    containers: Option<Vec<Value>>,
    /// What happened to the second batch worker (phase 2, with the shim).
    grow: Option<Grow>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct OppRate {
    iters_per_s: f64,
    gpu_ms_per_s: f64,
}

impl OppRate {
    fn from_iters(iters_per_s: f64) -> OppRate {
        OppRate {
            iters_per_s,
            gpu_ms_per_s: iters_per_s * OPPORTUNISTIC_GPU_MS,
        }
    }
}

/// The second batch worker's outcome.
#[derive(Clone, Debug)]
struct Grow {
    /// Its allocation failed with CUDA_ERROR_OUT_OF_MEMORY.
    refused: bool,
    /// Its error line, or what happened.
    message: String,
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

/// Text or JSON-lines output.
#[derive(Clone, Copy)]
struct Output {
    json: bool,
}

fn cmdline<S: AsRef<str>>(bin: &str, args: &[S]) -> String {
    std::iter::once(bin)
        .chain(args.iter().map(AsRef::as_ref))
        .collect::<Vec<_>>()
        .join(" ")
}

fn r1(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

fn r3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// Device 0's figures of container `name` in a `status::read_containers` list (the jobs run on
/// device 0).
fn device0<'a>(containers: &'a [Value], name: &str) -> Option<&'a Value> {
    containers
        .iter()
        .find(|c| c["container"] == name)?
        .get("devices")?
        .as_array()?
        .iter()
        .find(|d| d["device"] == 0)
}

/// One live line per container: memory used / quota / peak, launches, refused allocations.
fn container_lines(containers: &[Value]) -> Vec<String> {
    [PROD, BATCH]
        .iter()
        .filter_map(|c| {
            let d = device0(containers, c.name)?;
            let size = |k: &str| format_size(d[k].as_u64().unwrap_or(0));
            Some(format!(
                "           {:<6} {:>8} used of {:>7} quota, peak {:>8}, {:>6} launches, {} refused",
                c.name,
                size("used_bytes"),
                size("quota_bytes"),
                size("peak_bytes"),
                d["launches_live_processes"].as_u64().unwrap_or(0),
                d["refused_over_quota"].as_u64().unwrap_or(0),
            ))
        })
        .collect()
}

impl Output {
    fn emit(&self, v: Value) {
        say!("{v}");
    }

    fn intro(&self, gpu: &Gpu, shim: &Result<Shim, NoShim>, args: &DemoArgs) {
        let gpu_json = match gpu {
            Gpu::Real { description } => json!({"kind": "real", "description": description}),
            Gpu::Sim { lib_dir, state } => json!({
                "kind": "simgpu",
                "lib_dir": lib_dir.display().to_string(),
                "state_dir": state.path().display().to_string(),
            }),
        };
        let container_json =
            |c: Container| json!({"name": c.name, "class": c.class, "quota": c.quota});
        if self.json {
            let libshare = match shim {
                Ok(s) => json!({
                    "shim": s.lib.display().to_string(),
                    "state_dir": s.state.path().display().to_string(),
                    "memory_quotas": true,
                    "kernel_rate_control": true,
                }),
                Err(why) => json!({
                    "shim": null,
                    "why": why.lines().join("; "),
                    "memory_quotas": false,
                    "kernel_rate_control": false,
                }),
            };
            self.emit(json!({
                "event": "start",
                "gpu": gpu_json,
                "libshare": libshare,
                "duration_s": args.duration,
                "production": cmdline(Train::BIN, &PRODUCTION.args()),
                "production_container": container_json(PROD),
                "opportunistic": cmdline(Train::BIN, &OPPORTUNISTIC.args()),
                "opportunistic_container": container_json(BATCH),
                "grow": cmdline(GROW.0, GROW.1),
            }));
            return;
        }
        say!("sharectl demo: one GPU shared by a production job and an opportunistic job");
        say!("");
        match gpu {
            Gpu::Real { description } => say!("  GPU            real: {description}"),
            Gpu::Sim { lib_dir, state } => {
                say!("  GPU            simulated by simgpu (no real GPU in use)");
                say!("                 libcuda.so.1 from {}", lib_dir.display());
                say!(
                    "                 fresh state dir {}",
                    state.path().display()
                );
            }
        }
        match shim {
            Ok(s) => {
                say!(
                    "  libshare       shim {} preloaded into every job",
                    s.lib.display()
                );
                say!(
                    "                 its state dir {} (private to this run; from another",
                    s.state.path().display()
                );
                say!(
                    "                 terminal: sharectl status --state-dir {})",
                    s.state.path().display()
                );
            }
            Err(why) => {
                for (i, l) in why.lines().iter().enumerate() {
                    let head = if i == 0 {
                        "libshare       not in use: "
                    } else {
                        "               "
                    };
                    say!("  {head}{l}");
                }
            }
        }
        let container = |c: Container| match shim {
            Ok(_) => format!(
                "container \"{}\", class {}, memory quota {}",
                c.name,
                c.class,
                c.quota_text()
            ),
            Err(_) => "no container (no shim)".into(),
        };
        say!("  production     {}", container(PROD));
        say!(
            "                 {}",
            cmdline(Train::BIN, &PRODUCTION.args())
        );
        say!("                 training-like: 6 ms of GPU work + 4 ms of CPU per iteration, holds 512 MiB");
        say!("  opportunistic  {}", container(BATCH));
        say!(
            "                 {}",
            cmdline(Train::BIN, &OPPORTUNISTIC.args())
        );
        say!("                 training with no host gap: takes all the GPU time it can get, holds 384 MiB");
        if shim.is_ok() {
            say!("                 in phase 2 a second batch worker asks for 256 MiB more: over the quota");
        }
        say!("  All are ordinary, unmodified CUDA driver-API programs.");
        say!("");
        if shim.is_ok() {
            say!(
                "What libshare enforces: per-container memory quotas (the shim), and GPU time: the"
            );
            say!("coordinator daemon keeps the production job running as if alone and gives the");
            say!("opportunistic one the GPU time production leaves idle. Phase 2 runs the pair without the");
            say!(
                "daemon (compute shared natively: the problem); phase 3 runs it under the daemon."
            );
        } else {
            say!("Without the shim nothing is enforced: the two jobs share the GPU natively, as they would");
            say!("without libshare. Phase 2 shows how much the production job slows down.");
        }
    }

    fn phase_header(&self, n: u32, of: u32, secs: f64) {
        if self.json {
            return;
        }
        say!("");
        match n {
            1 => say!("Phase 1/{of}: production job alone (solo throughput), {secs} s"),
            2 => say!(
                "Phase 2/{of}: production + opportunistic job together, compute natively co-located, {secs} s"
            ),
            _ => say!(
                "Phase {n}/{of}: the same two jobs under libshare's daemon (production first, the opportunistic job in its idle time), {secs} s"
            ),
        }
    }

    fn live(
        &self,
        t: f64,
        rate: f64,
        solo: Option<f64>,
        opp: Option<OppRate>,
        containers: Option<&[Value]>,
        daemon: bool,
    ) {
        if self.json {
            let mut v = json!({
                "event": "progress",
                "phase": match (solo.is_some(), daemon) {
                    (false, _) => "solo",
                    (true, false) => "colocated",
                    (true, true) => "libshare",
                },
                "t": r3(t),
                "production_iters_per_s": r3(rate),
            });
            if let Some(s) = solo.filter(|s| *s > 0.0) {
                v["production_vs_solo"] = json!(r3(rate / s));
                v["opportunistic_iters_per_s"] = json!(opp.map(|o| r3(o.iters_per_s)));
                v["opportunistic_gpu_ms_per_s"] = json!(opp.map(|o| r3(o.gpu_ms_per_s)));
            }
            if let Some(c) = containers {
                v["containers"] = json!(c);
            }
            self.emit(v);
            return;
        }
        let mut line = format!("  t={t:>4.1}s  production {rate:>7.1} it/s");
        if let Some(s) = solo.filter(|s| *s > 0.0) {
            line += &format!(" ({:>3.0}% of solo)", 100.0 * rate / s);
            match opp {
                Some(o) => {
                    line += &format!(
                        "   opportunistic {:>6.1} it/s ({:>4.0} GPU-ms/s)",
                        o.iters_per_s, o.gpu_ms_per_s
                    )
                }
                None => line += "   opportunistic (starting)",
            }
        }
        say!("{line}");
        for l in container_lines(containers.unwrap_or_default()) {
            say!("{l}");
        }
    }

    fn grow(&self, g: &Grow) {
        if self.json {
            self.emit(json!({
                "event": "grow",
                "container": BATCH.name,
                "requested_bytes": GROW_BYTES,
                "refused": g.refused,
                "message": g.message,
            }));
            return;
        }
        let ask = format!(
            "  batch: a second worker asks for {} more ->",
            format_size(GROW_BYTES)
        );
        if g.refused {
            say!(
                "{ask} refused by the shim (over batch's {} quota):",
                BATCH.quota_text()
            );
            say!("         {}", g.message);
        } else {
            say!("{ask} not refused: {}", g.message);
        }
    }

    fn phase_done(&self, r: &PhaseResult) {
        if self.json {
            return;
        }
        let rate = r.production["iters_per_s"].as_f64().unwrap_or(0.0);
        let iters = r.production["iters"].as_u64().unwrap_or(0);
        let secs = r.production["elapsed_s"].as_f64().unwrap_or(0.0);
        let mut line =
            format!("  -> production: {iters} iterations in {secs:.1} s = {rate:.1} it/s");
        if let Some(o) = r.opportunistic {
            line += &format!(
                "; opportunistic: {:.1} it/s ({:.0} GPU-ms/s)",
                o.iters_per_s, o.gpu_ms_per_s
            );
        }
        say!("{line}");
    }

    fn summary(
        &self,
        gpu: &Gpu,
        shim: Option<&Shim>,
        solo: &PhaseResult,
        co: &PhaseResult,
        shared: Option<&PhaseResult>,
    ) {
        let s = solo.production["iters_per_s"].as_f64().unwrap_or(0.0);
        let c = co.production["iters_per_s"].as_f64().unwrap_or(0.0);
        let ratio = if s > 0.0 { c / s } else { 0.0 };
        let l = shared.map(|r| r.production["iters_per_s"].as_f64().unwrap_or(0.0));
        let l_ratio = l.map(|l| if s > 0.0 { l / s } else { 0.0 });
        // The GPU time production leaves idle under libshare, and the share of it the
        // opportunistic job used (GPU-ms per second of wall time).
        let idle_ms = l.map(|l| (1000.0 - l * PRODUCTION_GPU_MS).max(1.0));
        let harvest = shared
            .and_then(|r| r.opportunistic)
            .zip(idle_ms)
            .map(|(o, idle)| (o.gpu_ms_per_s / idle).min(1.0));
        let p99 = |r: &PhaseResult| r.production["iter_ms"]["p99"].as_f64();
        let p50 = |r: &PhaseResult| r.production["iter_ms"]["p50"].as_f64();
        if self.json {
            self.emit(json!({
                "event": "final",
                "final": true,
                "gpu": if gpu.is_sim() { "simgpu" } else { "real" },
                "libshare_enforced": {
                    "shim": shim.is_some(),
                    "memory_quotas": shim.is_some(),
                    "kernel_rate_control": shared.is_some(),
                },
                "solo": {
                    "production_iters_per_s": s,
                    "production_gpu_ms_per_s": r3(s * PRODUCTION_GPU_MS),
                    "production_iter_ms_p50": p50(solo),
                    "production_iter_ms_p99": p99(solo),
                    "containers": solo.containers,
                },
                "colocated": {
                    "production_iters_per_s": c,
                    "production_gpu_ms_per_s": r3(c * PRODUCTION_GPU_MS),
                    "production_iter_ms_p50": p50(co),
                    "production_iter_ms_p99": p99(co),
                    "opportunistic_iters_per_s": co.opportunistic.map(|o| r3(o.iters_per_s)),
                    "opportunistic_gpu_ms_per_s": co.opportunistic.map(|o| r3(o.gpu_ms_per_s)),
                    "containers": co.containers,
                    "grow": co.grow.as_ref().map(|g| json!({
                        "container": BATCH.name,
                        "requested_bytes": GROW_BYTES,
                        "refused": g.refused,
                        "message": g.message,
                    })),
                },
                "libshare": shared.map(|r| json!({
                    "production_iters_per_s": l,
                    "production_gpu_ms_per_s": l.map(|l| r3(l * PRODUCTION_GPU_MS)),
                    "production_iter_ms_p50": p50(r),
                    "production_iter_ms_p99": p99(r),
                    "opportunistic_iters_per_s": r.opportunistic.map(|o| r3(o.iters_per_s)),
                    "opportunistic_gpu_ms_per_s": r.opportunistic.map(|o| r3(o.gpu_ms_per_s)),
                    "containers": r.containers,
                })),
                "production_vs_solo": r3(ratio),
                "production_vs_solo_libshare": l_ratio.map(r3),
                "opportunistic_harvest": harvest.map(r3),
            }));
            return;
        }
        let opt = |v: Option<f64>| v.map(|x| format!("{x:.1}")).unwrap_or_else(|| "-".into());
        say!("");
        say!(
            "Summary ({}, {})",
            if gpu.is_sim() { "simgpu" } else { "real GPU" },
            if shim.is_some() {
                "libshare: shim with memory quotas; daemon in phase 3"
            } else {
                "no libshare"
            }
        );
        let third = |f: &dyn Fn(&PhaseResult) -> Option<f64>| opt(shared.and_then(f));
        say!("                                     alone   co-located     libshare");
        say!(
            "  production iterations/s        {:>9.1}    {:>9.1}    {:>9}",
            s,
            c,
            opt(l)
        );
        say!(
            "    of solo                                 {:>8.0}%    {:>8}%",
            100.0 * ratio,
            l_ratio.map_or_else(|| "-".into(), |r| format!("{:.0}", 100.0 * r))
        );
        say!(
            "  production iteration p50 (ms)  {:>9}    {:>9}    {:>9}",
            opt(p50(solo)),
            opt(p50(co)),
            third(&|r| p50(r))
        );
        say!(
            "  production iteration p99 (ms)  {:>9}    {:>9}    {:>9}",
            opt(p99(solo)),
            opt(p99(co)),
            third(&|r| p99(r))
        );
        say!(
            "  production GPU-ms/s            {:>9.0}    {:>9.0}    {:>9}",
            s * PRODUCTION_GPU_MS,
            c * PRODUCTION_GPU_MS,
            l.map_or_else(|| "-".into(), |l| format!("{:.0}", l * PRODUCTION_GPU_MS))
        );
        say!(
            "  opportunistic iterations/s     {:>9}    {:>9}    {:>9}",
            "-",
            opt(co.opportunistic.map(|o| r1(o.iters_per_s))),
            third(&|r| r.opportunistic.map(|o| r1(o.iters_per_s)))
        );
        say!(
            "  opportunistic GPU-ms/s         {:>9}    {:>9}    {:>9}",
            "-",
            opt(co.opportunistic.map(|o| r1(o.gpu_ms_per_s))),
            third(&|r| r.opportunistic.map(|o| r1(o.gpu_ms_per_s)))
        );
        say!("  (GPU-ms/s: kernel time completed per second; 1000 = the GPU always busy)");
        if let (Some(shim), Some(containers)) = (shim, co.containers.as_deref()) {
            say!("");
            say!("Memory per container in phase 2 (as `sharectl status` shows it):");
            for l in status::table(shim.state.path(), containers) {
                say!("  {l}");
            }
            say!("");
            match &co.grow {
                Some(g) if g.refused => {
                    let figure = |name: &str, key: &str| {
                        format_size(
                            device0(containers, name)
                                .and_then(|d| d[key].as_u64())
                                .unwrap_or(0),
                        )
                    };
                    say!(
                        "Memory: the shim held batch to its {} quota: with {} held, its second worker's {} was",
                        BATCH.quota_text(),
                        figure(BATCH.name, "peak_bytes"),
                        format_size(GROW_BYTES)
                    );
                    say!(
                        "refused (CUDA_ERROR_OUT_OF_MEMORY, counted under REFUSED); prod kept its {} (quota {}, nothing refused).",
                        figure(PROD.name, "peak_bytes"),
                        PROD.quota_text()
                    );
                }
                Some(g) => say!(
                    "Memory: the second batch worker was not refused: {}",
                    g.message
                ),
                None => {}
            }
        }
        say!(
            "Compute: natively co-located, the production job ran at {:.0}% of its solo throughput.",
            100.0 * ratio
        );
        if let (Some(lr), Some(h)) = (l_ratio, harvest) {
            say!(
                "Under libshare's daemon it ran at {:.0}% of solo, and the opportunistic job used {:.0}% of the",
                100.0 * lr,
                100.0 * h
            );
            say!(
                "GPU time production left idle: its {:.0} ms kernels go only where they end before production's",
                OPPORTUNISTIC_GPU_MS / OPPORTUNISTIC_KERNELS
            );
            say!("predicted return, so finer ones harvest more (0.5 ms: ~80 %, S1). `sharectl bench` measures this");
            say!("and more: BENCHMARKS.md.");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn job_cmdlines() {
        // The argv the two jobs ran when they were written out here by hand.
        assert_eq!(
            cmdline(Train::BIN, &PRODUCTION.args()),
            "simjob-train --gpu-ms 6 --kernels 4 --cpu-ms 4 --mem 512MiB"
        );
        assert_eq!(
            cmdline(Train::BIN, &OPPORTUNISTIC.args()),
            "simjob-train --gpu-ms 8 --kernels 4 --cpu-ms 0 --mem 384MiB"
        );
        // The second batch worker asks for more than the batch container has left of its quota.
        let i = GROW.1.iter().position(|a| *a == "--mem").unwrap();
        let grow = libshare_abi::units::parse_size(GROW.1[i + 1]).unwrap();
        let size = |t: Train| t.mem_mib << 20;
        let quota = |c: Container| libshare_abi::units::parse_size(c.quota).unwrap();
        assert_eq!(grow, GROW_BYTES);
        assert!(size(OPPORTUNISTIC) <= quota(BATCH));
        assert!(size(OPPORTUNISTIC) + grow > quota(BATCH));
        assert!(size(PRODUCTION) <= quota(PROD));
    }

    #[test]
    fn container_lines_read_status_figures() {
        let c = vec![json!({
            "container": "batch", "class": "opportunistic",
            "devices": [{"device": 0, "quota_bytes": 512u64 << 20, "used_bytes": 384u64 << 20,
                         "peak_bytes": 384u64 << 20, "refused_over_quota": 1,
                         "launches_live_processes": 42}],
            "processes": [],
        })];
        let l = container_lines(&c);
        assert_eq!(l.len(), 1, "{l:?}");
        assert!(
            l[0].contains("batch") && l[0].contains("384 MiB used of 512 MiB quota"),
            "{l:?}"
        );
        assert!(l[0].contains("42 launches, 1 refused"), "{l:?}");
        assert_eq!(device0(&c, "prod"), None);
    }
}
