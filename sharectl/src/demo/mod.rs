//! `sharectl demo`: a production and an opportunistic job on one GPU (real, or simgpu).
//!
//! Today (no shim, no daemon yet) it shows native co-location, i.e. the problem libshare solves:
//! phase 1 runs the production job alone for its solo throughput, phase 2 runs it together with
//! a GPU-saturating opportunistic job. The jobs are the ordinary CUDA programs of the `jobs`
//! crate, started as child processes; the demo reads their JSON lines.

mod child;
mod platform;

use anyhow::{anyhow, bail};
use child::{Job, Msg, Role};
use platform::Gpu;
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
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
/// Phase 1 runs the production job (simjob-train) alone; phase 2 runs it together with an
/// opportunistic job (simjob-saturate) that keeps the GPU busy. Live numbers are printed once a
/// second, then a summary. libshare's shim is not in use yet: this shows native co-location.
#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Seconds per phase.
    #[arg(long, value_name = "SECS", default_value = "5", value_parser = parse_secs)]
    pub duration: f64,

    /// Use simgpu even if a real GPU is present.
    #[arg(long)]
    pub sim: bool,

    /// simgpu's library directory (holding libcuda.so.1) [default: <target>/simgpu/lib next to
    /// the sharectl binary, created if missing].
    #[arg(long, value_name = "DIR")]
    pub simgpu_lib: Option<PathBuf>,

    /// Directory holding simjob-train and simjob-saturate [default: next to the sharectl binary].
    #[arg(long, value_name = "DIR")]
    pub jobs_dir: Option<PathBuf>,

    /// Print JSON lines (progress, then a final summary with "final": true) instead of text.
    #[arg(long)]
    pub json: bool,
}

fn parse_secs(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .trim_end_matches('s')
        .parse()
        .map_err(|_| format!("invalid duration '{s}': expected seconds, e.g. 5 or 2.5"))?;
    if !v.is_finite() || !(0.5..=3600.0).contains(&v) {
        return Err(format!(
            "invalid duration '{s}': must be between 0.5 and 3600 seconds"
        ));
    }
    Ok(v)
}

/// The production job: training-like, 6 ms of GPU then 4 ms of CPU per iteration.
const PRODUCTION: (&str, &[&str]) = (
    "simjob-train",
    &[
        "--gpu-ms",
        "6",
        "--kernels",
        "4",
        "--cpu-ms",
        "4",
        "--mem",
        "256MiB",
    ],
);

/// GPU time per production iteration (the `--gpu-ms` above).
const PRODUCTION_GPU_MS: f64 = 6.0;

/// The opportunistic job: back-to-back 2 ms kernels, up to 4 in flight.
const OPPORTUNISTIC: (&str, &[&str]) = ("simjob-saturate", &["--kernel-ms", "2", "--depth", "4"]);

/// How long a job may take to start (CUDA initialisation) or to stop after its duration.
const GRACE: Duration = Duration::from_secs(60);

pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    let gpu = Gpu::select(args.sim, args.simgpu_lib.as_deref())?;
    let train_bin = platform::job_binary(args.jobs_dir.as_deref(), PRODUCTION.0)?;
    let sat_bin = platform::job_binary(args.jobs_dir.as_deref(), OPPORTUNISTIC.0)?;
    let out = Output { json: args.json };
    let demo = Demo {
        gpu: &gpu,
        train_bin: &train_bin,
        sat_bin: &sat_bin,
        secs: args.duration,
        out,
    };
    out.intro(&gpu, &args);

    out.phase_header(1, false, args.duration);
    let solo = demo.phase(None)?;
    let solo_rate = rate(&solo.production)?;
    out.phase_done(&solo);

    check_stdout()?;
    out.phase_header(2, true, args.duration);
    let co = demo.phase(Some(solo_rate))?;
    out.phase_done(&co);

    out.summary(&gpu, &solo, &co);
    Ok(())
}

/// What one phase measured.
struct PhaseResult {
    /// The production job's final line.
    production: Value,
    /// The opportunistic job's throughput while the production job ran, if it ran.
    opportunistic: Option<OppRate>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct OppRate {
    kernels_per_s: f64,
    gpu_ms_per_s: f64,
}

fn rate(final_line: &Value) -> anyhow::Result<f64> {
    final_line["iters_per_s"]
        .as_f64()
        .ok_or_else(|| anyhow!("{} reported no iters_per_s", PRODUCTION.0))
}

struct Demo<'a> {
    gpu: &'a Gpu,
    train_bin: &'a Path,
    sat_bin: &'a Path,
    secs: f64,
    out: Output,
}

impl Demo<'_> {
    fn args(&self, base: &[&str], secs: f64, interval: &str) -> Vec<String> {
        let mut v: Vec<String> = base.iter().map(|s| s.to_string()).collect();
        v.extend([
            "--duration".into(),
            format!("{secs}"),
            "--report-interval".into(),
            interval.into(),
        ]);
        v
    }

    /// Runs the production job for `secs`, alone (`solo == None`) or next to the opportunistic
    /// job (`solo == Some(solo rate)`, used for the live ratio).
    fn phase(&self, solo: Option<f64>) -> anyhow::Result<PhaseResult> {
        let (tx, rx) = mpsc::channel();
        let env = self.gpu.job_env();
        let mut sat = None;
        if solo.is_some() {
            // Start the opportunistic job first and let it run until the production job is done
            // (then stop it with SIGTERM), so the whole production run is co-located.
            let args = self.args(OPPORTUNISTIC.1, self.secs + GRACE.as_secs_f64(), "0.5s");
            let job = Job::spawn(Role::Opportunistic, self.sat_bin, &args, &env, tx.clone())?;
            match wait_for_start(&rx, Role::Opportunistic) {
                Ok(()) => sat = Some(job),
                Err(e) => return Err(fail(job, e)),
            }
        }
        let args = self.args(PRODUCTION.1, self.secs, "1s");
        let train = match Job::spawn(Role::Production, self.train_bin, &args, &env, tx.clone()) {
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
        let mut opportunistic = None;
        if let Some(s) = sat {
            s.request_stop();
            let final_line = wait_for_final(&rx, Role::Opportunistic);
            s.finish(GRACE)?;
            opportunistic = live.overlap_rate().or_else(|| {
                final_line.map(|v| OppRate {
                    kernels_per_s: v["kernels_per_s"].as_f64().unwrap_or(0.0),
                    gpu_ms_per_s: v["gpu_ms_per_s"].as_f64().unwrap_or(0.0),
                })
            });
        }
        Ok(PhaseResult {
            production,
            opportunistic,
        })
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
            let msg = match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(m) => m,
                Err(RecvTimeoutError::Timeout) => {
                    if Instant::now() > deadline {
                        bail!("{} did not finish in time", PRODUCTION.0);
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    bail!("{} stopped without a summary", PRODUCTION.0)
                }
            };
            match msg {
                Msg::Line(Role::Production, v) => match v["event"].as_str() {
                    Some("start") => live.production_started = Some(Instant::now()),
                    Some("progress") => {
                        let r = v["iters_per_s"].as_f64().unwrap_or(0.0);
                        let t = v["t"].as_f64().unwrap_or(0.0);
                        self.out.live(t, r, solo, live.latest);
                    }
                    Some("final") => {
                        live.production_finished = Some(Instant::now());
                        return Ok(v);
                    }
                    _ => {}
                },
                Msg::Line(Role::Opportunistic, v) => live.opportunistic(&v),
                Msg::Eof(Role::Production) => {
                    bail!("{} stopped without a summary", PRODUCTION.0)
                }
                Msg::Eof(Role::Opportunistic) => {
                    bail!("{} stopped early", OPPORTUNISTIC.0)
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

/// Live state of the opportunistic job.
#[derive(Default)]
struct Live {
    production_started: Option<Instant>,
    production_finished: Option<Instant>,
    /// Latest opportunistic window rate.
    latest: Option<OppRate>,
    /// (received at, job's t, cumulative kernels, kernel ms) for each opportunistic progress line.
    points: Vec<(Instant, f64, f64, f64)>,
}

impl Live {
    fn opportunistic(&mut self, v: &Value) {
        if v["event"] != "progress" {
            return;
        }
        let (Some(kps), Some(gms), Some(t), Some(k)) = (
            v["kernels_per_s"].as_f64(),
            v["gpu_ms_per_s"].as_f64(),
            v["t"].as_f64(),
            v["kernels"].as_f64(),
        ) else {
            return;
        };
        self.latest = Some(OppRate {
            kernels_per_s: kps,
            gpu_ms_per_s: gms,
        });
        let kernel_ms = if kps > 0.0 { gms / kps } else { 0.0 };
        self.points.push((Instant::now(), t, k, kernel_ms));
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
        let kps = (last.2 - first.2) / dt;
        Some(OppRate {
            kernels_per_s: kps,
            gpu_ms_per_s: kps * last.3,
        })
    }
}

/// Text or JSON-lines output.
#[derive(Clone, Copy)]
struct Output {
    json: bool,
}

fn cmdline(job: (&str, &[&str])) -> String {
    std::iter::once(job.0)
        .chain(job.1.iter().copied())
        .collect::<Vec<_>>()
        .join(" ")
}

fn r1(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

fn r3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

impl Output {
    fn emit(&self, v: Value) {
        say!("{v}");
    }

    fn intro(&self, gpu: &Gpu, args: &DemoArgs) {
        let gpu_json = match gpu {
            Gpu::Real { description } => json!({"kind": "real", "description": description}),
            Gpu::Sim { lib_dir, state } => json!({
                "kind": "simgpu",
                "lib_dir": lib_dir.display().to_string(),
                "state_dir": state.path().display().to_string(),
            }),
        };
        if self.json {
            self.emit(json!({
                "event": "start",
                "gpu": gpu_json,
                "libshare": false,
                "duration_s": args.duration,
                "production": cmdline(PRODUCTION),
                "opportunistic": cmdline(OPPORTUNISTIC),
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
        say!("  production     {}", cmdline(PRODUCTION));
        say!("                 training-like: 6 ms of GPU work + 4 ms of CPU per iteration");
        say!("  opportunistic  {}", cmdline(OPPORTUNISTIC));
        say!("                 back-to-back kernels: takes all the GPU time it can get");
        say!("  Both are ordinary, unmodified CUDA driver-API programs.");
        say!("");
        say!("libshare is NOT enforcing anything in this demo yet: there is no shim and no daemon, so the");
        say!("two jobs share the GPU natively, as they would without libshare. This shows the problem:");
        say!("how much the production job slows down next to an opportunistic one. Protecting it (and");
        say!("giving the opportunistic job only the GPU time production leaves idle) arrives with the");
        say!("libshare shim (issue 3).");
    }

    fn phase_header(&self, n: u32, colocated: bool, secs: f64) {
        if self.json {
            return;
        }
        say!("");
        if colocated {
            say!(
                "Phase {n}/2: production + opportunistic job together, natively co-located, {secs} s"
            );
        } else {
            say!("Phase {n}/2: production job alone (solo throughput), {secs} s");
        }
    }

    fn live(&self, t: f64, rate: f64, solo: Option<f64>, opp: Option<OppRate>) {
        if self.json {
            let mut v = json!({
                "event": "progress",
                "phase": if solo.is_some() { "colocated" } else { "solo" },
                "t": r3(t),
                "production_iters_per_s": r3(rate),
            });
            if let Some(s) = solo.filter(|s| *s > 0.0) {
                v["production_vs_solo"] = json!(r3(rate / s));
                v["opportunistic_kernels_per_s"] = json!(opp.map(|o| r3(o.kernels_per_s)));
                v["opportunistic_gpu_ms_per_s"] = json!(opp.map(|o| r3(o.gpu_ms_per_s)));
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
                        "   opportunistic {:>7.1} kernels/s ({:>5.0} GPU-ms/s)",
                        o.kernels_per_s, o.gpu_ms_per_s
                    )
                }
                None => line += "   opportunistic (starting)",
            }
        }
        say!("{line}");
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
                "; opportunistic: {:.1} kernels/s ({:.0} GPU-ms/s)",
                o.kernels_per_s, o.gpu_ms_per_s
            );
        }
        say!("{line}");
    }

    fn summary(&self, gpu: &Gpu, solo: &PhaseResult, co: &PhaseResult) {
        let s = solo.production["iters_per_s"].as_f64().unwrap_or(0.0);
        let c = co.production["iters_per_s"].as_f64().unwrap_or(0.0);
        let ratio = if s > 0.0 { c / s } else { 0.0 };
        let p99 = |r: &PhaseResult| r.production["iter_ms"]["p99"].as_f64();
        let p50 = |r: &PhaseResult| r.production["iter_ms"]["p50"].as_f64();
        if self.json {
            self.emit(json!({
                "event": "final",
                "final": true,
                "gpu": if gpu.is_sim() { "simgpu" } else { "real" },
                "libshare": false,
                "solo": {
                    "production_iters_per_s": s,
                    "production_gpu_ms_per_s": r3(s * PRODUCTION_GPU_MS),
                    "production_iter_ms_p50": p50(solo),
                    "production_iter_ms_p99": p99(solo),
                },
                "colocated": {
                    "production_iters_per_s": c,
                    "production_gpu_ms_per_s": r3(c * PRODUCTION_GPU_MS),
                    "production_iter_ms_p50": p50(co),
                    "production_iter_ms_p99": p99(co),
                    "opportunistic_kernels_per_s": co.opportunistic.map(|o| r3(o.kernels_per_s)),
                    "opportunistic_gpu_ms_per_s": co.opportunistic.map(|o| r3(o.gpu_ms_per_s)),
                },
                "production_vs_solo": r3(ratio),
            }));
            return;
        }
        let opt = |v: Option<f64>| v.map(|x| format!("{x:.1}")).unwrap_or_else(|| "-".into());
        say!("");
        say!(
            "Summary ({}, no libshare)",
            if gpu.is_sim() { "simgpu" } else { "real GPU" }
        );
        say!("                                     alone   co-located");
        say!(
            "  production iterations/s        {:>9.1}    {:>9.1}   ({:.0}% of solo)",
            s,
            c,
            100.0 * ratio
        );
        say!(
            "  production iteration p50 (ms)  {:>9}    {:>9}",
            opt(p50(solo)),
            opt(p50(co))
        );
        say!(
            "  production iteration p99 (ms)  {:>9}    {:>9}",
            opt(p99(solo)),
            opt(p99(co))
        );
        say!(
            "  production GPU-ms/s            {:>9.0}    {:>9.0}",
            s * PRODUCTION_GPU_MS,
            c * PRODUCTION_GPU_MS
        );
        say!(
            "  opportunistic kernels/s        {:>9}    {:>9}",
            "-",
            opt(co.opportunistic.map(|o| r1(o.kernels_per_s)))
        );
        say!(
            "  opportunistic GPU-ms/s         {:>9}    {:>9}",
            "-",
            opt(co.opportunistic.map(|o| r1(o.gpu_ms_per_s)))
        );
        say!("  (GPU-ms/s: kernel time completed per second; 1000 = the GPU always busy)");
        say!("");
        say!(
            "Natively co-located, the production job ran at {:.0}% of its solo throughput.",
            100.0 * ratio
        );
        say!("libshare's goal once the shim enforces it (design section 7, scenario S1): production at");
        say!(
            ">= 97% of solo while the opportunistic job uses the GPU time production leaves idle."
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secs() {
        assert_eq!(parse_secs("5"), Ok(5.0));
        assert_eq!(parse_secs("2.5s"), Ok(2.5));
        assert!(parse_secs("0").is_err());
        assert!(parse_secs("-3").is_err());
        assert!(parse_secs("nan").is_err());
        assert!(parse_secs("1h").is_err());
    }

    #[test]
    fn overlap_rate_uses_lines_inside_the_production_run() {
        let t0 = Instant::now();
        let mut live = Live {
            production_started: Some(t0),
            ..Live::default()
        };
        let at = |ms| t0 + Duration::from_millis(ms);
        live.points = vec![
            (t0 - Duration::from_millis(1), 0.0, 0.0, 2.0),
            (at(10), 1.0, 100.0, 2.0),
            (at(20), 2.0, 300.0, 2.0),
            (at(30), 3.0, 500.0, 2.0),
            (at(50), 4.0, 10_000.0, 2.0),
        ];
        live.production_finished = Some(at(40));
        let r = live.overlap_rate().unwrap();
        assert_eq!(r.kernels_per_s, 200.0);
        assert_eq!(r.gpu_ms_per_s, 400.0);
        live.points.truncate(2);
        assert_eq!(live.overlap_rate(), None);
    }

    #[test]
    fn job_cmdlines() {
        assert!(cmdline(PRODUCTION).starts_with("simjob-train --gpu-ms 6 "));
        assert_eq!(PRODUCTION.1[1].parse::<f64>().unwrap(), PRODUCTION_GPU_MS);
        assert!(cmdline(OPPORTUNISTIC).starts_with("simjob-saturate"));
    }
}
