//! One run of a scenario under one policy: the containers' settings (`sharectl set`), a private
//! `sharectl daemon`, the jobs (with or without the shim), and everything they printed, on one
//! time axis (seconds since the run started, `CLOCK_MONOTONIC`).

use crate::bench::python::Scripts;
use crate::child::{Job, Msg};
use crate::daemon_child::{CpuUse, Daemon};
use crate::platform::{Gpu, StateDir};
use anyhow::{anyhow, bail, Context};
use libshare_abi::State;
use serde_json::Value;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// A container's class (`LIBSHARE_CLASS`, `sharectl set --class`).
pub use libshare_abi::Class;

/// One job of a run.
#[derive(Clone, Debug)]
pub struct JobSpec {
    /// Its container (and the name in results and plots).
    pub container: String,
    /// The class the scenario gives it (a policy may run it as another, see [`Setup`]).
    pub class: Class,
    /// `simjob-train`, `simjob-infer`, `simjob-saturate`, or an embedded Python job
    /// (`torch_infer.py`, `torch_train.py`).
    pub bin: &'static str,
    pub args: Vec<String>,
    /// Seconds after the run's start.
    pub delay: f64,
}

/// How the jobs run.
#[derive(Clone, Debug)]
pub enum Setup {
    /// No shim, no daemon.
    Native,
    /// Under the shim with a private daemon of `policy` (`libshare` or `time-slice`); `set` are
    /// extra `sharectl set` arguments per container (e.g. `--compute 50%`); `classes` overrides
    /// the jobs' classes (static split runs everything as opportunistic).
    Shared {
        policy: &'static str,
        set: Vec<(String, Vec<String>)>,
        all_opportunistic: bool,
    },
}

/// A run: its jobs, how they run, idle containers registered beside them, and whether the gates'
/// heartbeats are sampled.
#[derive(Clone, Debug)]
pub struct RunSpec {
    pub jobs: Vec<JobSpec>,
    pub setup: Setup,
    /// Containers registered with `sharectl set` that run nothing (S6).
    pub idle_containers: Vec<String>,
    pub sample_gates: bool,
    /// Extra environment of every job (S4: its own simulated device).
    pub env: Vec<(String, OsString)>,
    /// Extra arguments of the private daemon (S4's hints-only: `--no-demotion`).
    pub daemon_args: Vec<String>,
    /// Where the jobs run on the host's CPUs.
    pub cpus: Cpus,
}

/// What one job printed.
#[derive(Clone, Debug)]
pub struct JobRecord {
    pub container: String,
    pub class: Class,
    pub bin: &'static str,
    /// Its start line's `mono_s` minus the run's start: add to a line's `t`.
    pub offset: f64,
    pub lines: Vec<Value>,
}

impl JobRecord {
    /// Lines with `event == name`.
    pub fn events<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.lines.iter().filter(move |v| v["event"] == name)
    }

    /// The start line's field `key` (the job's configuration).
    pub fn config(&self, key: &str) -> Option<f64> {
        self.events("start").next().and_then(|v| v[key].as_f64())
    }

    /// The job's start on the run's axis.
    pub fn start(&self) -> f64 {
        self.offset
    }

    /// The final line's `t` on the run's axis.
    pub fn end(&self) -> f64 {
        self.events("final")
            .next()
            .and_then(|v| v["t"].as_f64())
            .map(|t| t + self.offset)
            .unwrap_or(self.offset)
    }

    /// Traced work (`iter`, `request`, `idle` lines): (start, end, line) on the run's axis.
    pub fn spans<'a>(&'a self, event: &'a str) -> impl Iterator<Item = (f64, f64, &'a Value)> + 'a {
        self.events(event).filter_map(move |v| {
            Some((
                v["t"].as_f64()? + self.offset,
                v["end"].as_f64()? + self.offset,
                v,
            ))
        })
    }

    /// A cumulative counter over time from the progress lines and the final line, starting at
    /// (start, 0): (time on the run's axis, value).
    pub fn counter(&self, key: &str) -> Vec<(f64, f64)> {
        let mut v = vec![(self.offset, 0.0)];
        for l in self.lines.iter() {
            if l["event"] == "progress" || l["event"] == "final" {
                if let (Some(t), Some(x)) = (l["t"].as_f64(), l[key].as_f64()) {
                    v.push((t + self.offset, x));
                }
            }
        }
        v
    }
}

/// Everything a run measured.
#[derive(Clone, Debug)]
pub struct RunRecord {
    pub jobs: Vec<JobRecord>,
    /// The daemon's CPU use over the run, its samples on the run's axis.
    pub daemon_cpu: Option<CpuUse>,
    /// The longest gap between successive `refreshed` values of any container's gate, ms.
    pub gate_refresh_ms_max: Option<f64>,
}

impl RunRecord {
    /// The daemon's CPU time (utime + stime) over the whole run, percent of one core.
    pub fn daemon_cpu_pct(&self) -> Option<f64> {
        self.daemon_cpu.as_ref().map(|c| c.pct)
    }

    /// The daemon's CPU time between `a` and `b` on the run's axis, percent of one core.
    pub fn daemon_cpu_pct_in(&self, a: f64, b: f64) -> Option<f64> {
        self.daemon_cpu.as_ref()?.pct_between(a, b)
    }

    pub fn job(&self, container: &str) -> &JobRecord {
        self.jobs
            .iter()
            .find(|j| j.container == container)
            .expect("a job of the run")
    }
}

/// Where and with what the runs happen.
pub struct Bench {
    pub gpu: Gpu,
    pub shim: Option<PathBuf>,
    pub jobs_dir: Option<PathBuf>,
    pub sharectl: PathBuf,
    /// The Python that runs the `.py` jobs, and those jobs.
    pub python: PathBuf,
    pub scripts: Scripts,
}

/// Where a run's jobs run on the host's CPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cpus {
    /// Anywhere (the scheduler's choice).
    Shared,
    /// Production-class jobs (the scenario's class, whatever the policy runs them as) on the
    /// first CPU sharectl may use, the others and the private daemon on the rest, as a node
    /// gives a production container CPUs of its own (a Kubernetes `cpuset` under the static
    /// CPU manager) and runs everything else in the shared pool. With one CPU, anywhere.
    ByClass,
}

impl Cpus {
    /// The layout's name in a row's `cpus` (`--cpus`'s words).
    pub fn tag(self) -> &'static str {
        match self {
            Cpus::ByClass => "by-class",
            Cpus::Shared => "shared",
        }
    }

    /// Binds every thread of the process `pid` (and those they start afterwards) to the CPUs
    /// of `class`.
    fn bind_all(self, pid: u32, class: Class) -> anyhow::Result<()> {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
            .with_context(|| format!("cannot list the threads of process {pid}"))?;
        for t in tasks.flatten() {
            if let Some(tid) = t.file_name().to_str().and_then(|s| s.parse().ok()) {
                self.bind(tid, class)?;
            }
        }
        Ok(())
    }

    /// Binds the process (or thread) `pid` and the threads it starts afterwards to the CPUs of
    /// `class`.
    fn bind(self, pid: u32, class: Class) -> anyhow::Result<()> {
        use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
        use nix::unistd::Pid;
        if self == Cpus::Shared {
            return Ok(());
        }
        let mine = sched_getaffinity(Pid::from_raw(0)).context("cannot read sharectl's CPUs")?;
        let allowed: Vec<usize> = (0..CpuSet::count())
            .filter(|&c| mine.is_set(c).unwrap_or(false))
            .collect();
        if allowed.len() < 2 {
            return Ok(());
        }
        let cpus = match class {
            Class::Production => &allowed[..1],
            Class::Opportunistic => &allowed[1..],
        };
        let mut set = CpuSet::new();
        for &c in cpus {
            set.set(c)?;
        }
        sched_setaffinity(Pid::from_raw(pid as i32), &set)
            .context("cannot bind a job to its CPUs (sched_setaffinity)")
    }
}

/// How long a job may take beyond its planned end (CUDA start-up, a slow machine).
const GRACE: Duration = Duration::from_secs(60);

impl Bench {
    pub fn run(&self, spec: &RunSpec) -> anyhow::Result<RunRecord> {
        self.run_daemon_env(spec, &[])
    }

    /// [`Bench::run`] with the daemon given `daemon_env` too (S5: the GPU's environment, for
    /// NVML).
    pub fn run_daemon_env(
        &self,
        spec: &RunSpec,
        daemon_env: &[(String, OsString)],
    ) -> anyhow::Result<RunRecord> {
        match &spec.setup {
            Setup::Native => self.run_with(spec, None, daemon_env),
            Setup::Shared { .. } => {
                let state = StateDir::create()?;
                self.run_with(spec, Some(state.path()), daemon_env)
            }
        }
    }

    fn run_with(
        &self,
        spec: &RunSpec,
        state: Option<&Path>,
        daemon_env: &[(String, OsString)],
    ) -> anyhow::Result<RunRecord> {
        let mut daemon = None;
        let mut sampler = None;
        if let (Setup::Shared { policy, set, .. }, Some(dir)) = (&spec.setup, state) {
            if self.shim.is_none() {
                bail!("libshare.so not found: build it with `cargo build --release -p libshare`");
            }
            for j in &spec.jobs {
                let mut a = vec!["--class".to_string(), self.class_of(spec, j).into()];
                if let Some((_, extra)) = set.iter().find(|(c, _)| *c == j.container) {
                    a.extend(extra.iter().cloned());
                }
                self.set(dir, &j.container, &a)?;
            }
            for c in &spec.idle_containers {
                self.set(dir, c, &["--class".into(), "opportunistic".into()])?;
            }
            let d =
                Daemon::start_with_env(&self.sharectl, dir, policy, &spec.daemon_args, daemon_env)?;
            // A node service runs in the shared pool, off the CPUs a node gives production
            // containers for their own (Kubernetes' static CPU manager): by class, with the
            // opportunistic jobs.
            spec.cpus.bind_all(d.pid(), Class::Opportunistic)?;
            daemon = Some(d);
            if spec.sample_gates {
                let mut names: Vec<String> =
                    spec.jobs.iter().map(|j| j.container.clone()).collect();
                names.extend(spec.idle_containers.iter().cloned());
                sampler = Some(GateSampler::start(dir, &names)?);
            }
        }
        let t0 = libshare_abi::rate::now_s();
        let result = self.run_jobs(spec, state, t0);
        let gate_refresh_ms_max = sampler.map(GateSampler::finish);
        let daemon_cpu = match daemon {
            Some(d) => {
                let mut cpu = d.finish()?;
                for s in &mut cpu.samples {
                    s.0 -= t0;
                }
                Some(cpu)
            }
            None => None,
        };
        let jobs = result?;
        Ok(RunRecord {
            jobs,
            daemon_cpu,
            gate_refresh_ms_max: gate_refresh_ms_max.flatten(),
        })
    }

    /// What to execute for `j`: a `simjob-*` binary, or the Python with an embedded `.py` job.
    fn program(&self, j: &JobSpec) -> anyhow::Result<(PathBuf, Vec<String>)> {
        if j.bin.ends_with(".py") {
            let mut args = vec![self.scripts.path(j.bin).display().to_string()];
            args.extend(j.args.iter().cloned());
            return Ok((self.python.clone(), args));
        }
        let bin = crate::platform::job_binary(self.jobs_dir.as_deref(), j.bin)?;
        Ok((bin, j.args.clone()))
    }

    fn class_of(&self, spec: &RunSpec, j: &JobSpec) -> &'static str {
        match spec.setup {
            Setup::Shared {
                all_opportunistic: true,
                ..
            } => Class::Opportunistic.name(),
            _ => j.class.name(),
        }
    }

    /// `sharectl set NAME --offline --state-dir DIR ARGS...` (before the private daemon starts).
    fn set(&self, dir: &Path, name: &str, args: &[String]) -> anyhow::Result<()> {
        let out = Command::new(&self.sharectl)
            .arg("set")
            .arg(name)
            .arg("--offline")
            .arg("--state-dir")
            .arg(dir)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .context("cannot run sharectl set")?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            let line = err.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
            bail!("sharectl set {name} {} failed: {line}", args.join(" "));
        }
        Ok(())
    }

    fn env(&self, spec: &RunSpec, j: &JobSpec, state: Option<&Path>) -> Vec<(String, OsString)> {
        let mut env = self.gpu.job_env();
        if let (Some(dir), Some(shim)) = (state, self.shim.as_ref()) {
            env.extend([
                ("LD_PRELOAD".to_string(), shim.clone().into()),
                ("LIBSHARE_STATE_DIR".into(), dir.into()),
                ("LIBSHARE_CONTAINER".into(), j.container.clone().into()),
                ("LIBSHARE_CLASS".into(), self.class_of(spec, j).into()),
            ]);
        }
        env.extend(spec.env.iter().cloned());
        env
    }

    /// Starts the jobs as planned and collects their lines; `t0` (monotonic seconds) is the
    /// zero of the run's axis.
    fn run_jobs(
        &self,
        spec: &RunSpec,
        state: Option<&Path>,
        t0: f64,
    ) -> anyhow::Result<Vec<JobRecord>> {
        let start = Instant::now();
        let (tx, rx) = mpsc::channel::<Msg<usize>>();
        let mut order: Vec<usize> = (0..spec.jobs.len()).collect();
        order.sort_by(|a, b| spec.jobs[*a].delay.total_cmp(&spec.jobs[*b].delay));
        let mut running: Vec<Option<Job>> = (0..spec.jobs.len()).map(|_| None).collect();
        let mut lines: Vec<Vec<Value>> = vec![Vec::new(); spec.jobs.len()];
        let mut open = 0usize;
        let mut fail = None;
        for i in order {
            let j = &spec.jobs[i];
            let due = start + Duration::from_secs_f64(j.delay);
            // Collect lines while waiting so pipes never fill.
            while Instant::now() < due {
                if let Ok(m) = rx.recv_timeout(due.saturating_duration_since(Instant::now())) {
                    record(m, &mut lines, &mut open);
                }
            }
            let (bin, args) = self.program(j)?;
            match Job::spawn(i, &bin, &args, &self.env(spec, j, state), tx.clone()) {
                Ok(job) => {
                    let bound = spec.cpus.bind(job.pid(), j.class);
                    running[i] = Some(job);
                    open += 1;
                    if let Err(e) = bound {
                        fail = Some(e);
                        break;
                    }
                }
                Err(e) => {
                    fail = Some(e);
                    break;
                }
            }
        }
        drop(tx);
        let deadline = Instant::now() + GRACE;
        while fail.is_none() && open > 0 {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(m) => record(m, &mut lines, &mut open),
                Err(_) => {
                    fail = Some(anyhow!("the jobs did not finish in time"));
                }
            }
        }
        let mut out = Vec::new();
        for (i, job) in running.into_iter().enumerate() {
            let Some(job) = job else { continue };
            if fail.is_some() {
                job.abort();
                continue;
            }
            // A job that failed stops the run; the ones after it are aborted above.
            if let Err(e) = job.finish(GRACE) {
                fail = Some(e);
                continue;
            }
            let j = &spec.jobs[i];
            let l = std::mem::take(&mut lines[i]);
            match l
                .iter()
                .find(|v| v["event"] == "start")
                .and_then(|v| v["mono_s"].as_f64())
            {
                Some(mono) => out.push(JobRecord {
                    container: j.container.clone(),
                    class: j.class,
                    bin: j.bin,
                    offset: mono - t0,
                    lines: l,
                }),
                None => fail = Some(anyhow!("{} printed no start line with mono_s", j.bin)),
            }
        }
        if let Some(e) = fail {
            return Err(e);
        }
        Ok(out)
    }
}

fn record(m: Msg<usize>, lines: &mut [Vec<Value>], open: &mut usize) {
    match m {
        Msg::Line(i, v) => lines[i].push(v),
        Msg::Eof(_) => *open -= 1,
    }
}

/// Samples every container's gate heartbeat (`refreshed`, device 0) through libshare-abi.
struct GateSampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Option<f64>>,
}

impl GateSampler {
    fn start(dir: &Path, names: &[String]) -> anyhow::Result<GateSampler> {
        let mut states = Vec::new();
        for n in names {
            let d = libshare_abi::container_dir(dir, n);
            let p = d.join(libshare_abi::STATE_FILE);
            states
                .push(State::open_view(&p).with_context(|| format!("cannot map {}", p.display()))?);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut last = vec![0u64; states.len()];
            let mut max_gap: Option<u64> = None;
            while !s2.load(Ordering::Relaxed) {
                for (i, st) in states.iter().enumerate() {
                    let r = st.device(0).refreshed.load(Ordering::Acquire);
                    if r != last[i] {
                        if last[i] != 0 && r > last[i] {
                            let g = r - last[i];
                            max_gap = Some(max_gap.map_or(g, |m| m.max(g)));
                        }
                        last[i] = r;
                    }
                }
                std::thread::sleep(Duration::from_micros(250));
            }
            max_gap.map(|g| g as f64 / 1e6)
        });
        Ok(GateSampler { stop, thread })
    }

    fn finish(self) -> Option<f64> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().ok().flatten()
    }
}
