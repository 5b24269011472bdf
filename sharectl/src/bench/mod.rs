//! `sharectl bench`: issue 9's sharing scenarios, each under every policy in one run.
//!
//! Every scenario first runs its production job(s) alone (`exclusive`: the solo figures the
//! other policies are compared with, measured in the same run), then production and
//! opportunistic jobs together under `native` (no shim), `static-split` (both opportunistic,
//! capped to an equal share with `sharectl set --compute`, HAMi-style), `time-slice` (the daemon
//! gives exclusive quanta, nvshare-style) and `libshare`. The figures come from the jobs' own
//! output (`jobs/README.md`): production GPU time = iterations × `--gpu-ms`, opportunistic GPU
//! time = kernels × `--kernel-ms`. BENCHMARKS.md lists the parameters and the columns.
//!
//! One module per scenario (`s1` … `s10`); this one holds what they share (the arguments, the
//! policies, the rows and their output, the jobs' specs, the window), `latency` what the latency
//! scenarios share (S3, S8, S9, S10), `exec` the runs themselves.

mod exec;
mod latency;
mod metrics;
mod plot;
mod python;
mod s1;
mod s10;
mod s2;
mod s3;
mod s4;
mod s5;
mod s6;
mod s7;
mod s8;
mod s9;

use anyhow::{bail, Context};
use exec::{Bench, Class, Cpus, JobRecord, JobSpec, RunRecord, RunSpec, Setup};
use jobs::profiles::Train;
use serde_json::{Map, Value};
use std::path::PathBuf;

/// What `sharectl bench` was asked: `commands::bench::BenchArgs`.
pub struct Options {
    pub scenario: ScenarioArg,
    pub json: bool,
    pub markdown: bool,
    pub plot: Option<PathBuf>,
    pub duration: f64,
    pub platform: crate::platform::PlatformArgs,
    pub shim: Option<PathBuf>,
    pub python: Option<PathBuf>,
    /// `--cpus`, if given (S8 and S9 each have a default).
    pub cpus: Option<CpuLayout>,
    pub ops: Vec<S3Op>,
    pub policy: Vec<Policy>,
    /// libshare's daemon's `--latency-budget` (S10: its libshare rows run under this one only).
    pub latency_budget: Option<libshare_node::policy::LatencyBudget>,
    /// S10's opportunistic kernels.
    pub s10_kernels: Vec<S10Kernel>,
    /// S9's numbers of opportunistic processes.
    pub s9_processes: Vec<u16>,
    /// S8's training: batch and layer width.
    pub s8_training: (u32, u32),
}

/// `--cpus`: which CPU layouts S8 runs.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuLayout {
    ByClass,
    Shared,
    Both,
}

/// `--ops`: what S3's opportunistic job issues.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum S3Op {
    Kernel,
    Memset,
    Copy,
}

/// `--s10-kernels`: S10's opportunistic kernels (see `s10::S10_KERNELS`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum S10Kernel {
    /// 0.5 ms one-block kernels.
    #[value(name = "0.5ms")]
    Short,
    /// 2 ms one-block kernels.
    #[value(name = "2ms")]
    Medium,
    /// 10 ms one-block kernels (no slicing can cut them).
    #[value(name = "10ms")]
    Long,
    /// 10 ms kernels of waves of blocks loaded as PTX (cut into ranges).
    #[value(name = "10ms-blocks")]
    Blocks,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScenarioArg {
    #[value(name = "S1")]
    S1,
    #[value(name = "S2")]
    S2,
    #[value(name = "S3")]
    S3,
    #[value(name = "S4")]
    S4,
    #[value(name = "S5")]
    S5,
    #[value(name = "S6")]
    S6,
    #[value(name = "S7")]
    S7,
    #[value(name = "S8")]
    S8,
    #[value(name = "S9")]
    S9,
    #[value(name = "S10")]
    S10,
    All,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    Exclusive,
    Native,
    StaticSplit,
    TimeSlice,
    Libshare,
    /// S4's TGS-style baseline: managed memory and advice, no demotion protocol.
    HintsOnly,
    /// S5's baseline: the jobs one after the other, each alone.
    Serial,
    /// S5's nvshare-style baseline: exclusive turns of a fixed quantum (scaled to the run).
    FixedQuantum,
}

impl Policy {
    const ALL: [Policy; 5] = [
        Policy::Exclusive,
        Policy::Native,
        Policy::StaticSplit,
        Policy::TimeSlice,
        Policy::Libshare,
    ];

    fn name(self) -> &'static str {
        match self {
            Policy::Exclusive => "exclusive",
            Policy::Native => "native",
            Policy::StaticSplit => "static-split",
            Policy::TimeSlice => "time-slice",
            Policy::Libshare => "libshare",
            Policy::HintsOnly => "hints-only",
            Policy::Serial => "serial",
            Policy::FixedQuantum => "fixed-quantum",
        }
    }

    /// How `jobs` run under this policy (exclusive runs like native, production alone).
    fn setup(self, jobs: &[JobSpec]) -> Setup {
        match self {
            Policy::Exclusive | Policy::Native | Policy::Serial => Setup::Native,
            Policy::StaticSplit => {
                let share = format!("{}%", 100.0 / jobs.len().max(1) as f64);
                Setup::Shared {
                    policy: "libshare",
                    set: jobs
                        .iter()
                        .map(|j| (j.container.clone(), vec!["--compute".into(), share.clone()]))
                        .collect(),
                    all_opportunistic: true,
                }
            }
            // Every job gated (nvshare has no classes; a production shim never waits at its gate).
            Policy::TimeSlice => Setup::Shared {
                policy: "time-slice",
                set: Vec::new(),
                all_opportunistic: true,
            },
            Policy::Libshare | Policy::HintsOnly | Policy::FixedQuantum => Setup::Shared {
                policy: "libshare",
                set: Vec::new(),
                all_opportunistic: false,
            },
        }
    }
}

pub fn run(args: Options) -> anyhow::Result<()> {
    let gpu = args.platform.gpu()?;
    let shim = crate::platform::shim_library(args.shim.as_deref())?;
    let sharectl = std::env::current_exe().context("cannot locate the sharectl binary")?;
    let bench = Bench {
        gpu,
        shim,
        jobs_dir: args.platform.jobs_dir.clone(),
        sharectl,
        python: python::interpreter(args.python.as_deref()),
        scripts: python::Scripts::write()?,
    };
    if let Some(dir) = &args.plot {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let policies: Vec<Policy> = if args.policy.is_empty() {
        Policy::ALL.to_vec()
    } else {
        // The five in their order, then a scenario's own baselines as asked (S4's hints-only,
        // S5's fixed-quantum).
        let extra = args.policy.iter().filter(|p| !Policy::ALL.contains(p));
        Policy::ALL
            .into_iter()
            .filter(|p| args.policy.contains(p))
            .chain(extra.copied())
            .collect()
    };
    let scenarios: &[ScenarioArg] = match args.scenario {
        ScenarioArg::All => &[
            ScenarioArg::S1,
            ScenarioArg::S2,
            ScenarioArg::S3,
            ScenarioArg::S4,
            ScenarioArg::S5,
            ScenarioArg::S6,
            ScenarioArg::S7,
            ScenarioArg::S8,
            ScenarioArg::S9,
            ScenarioArg::S10,
        ],
        ref one => std::slice::from_ref(one),
    };
    let mut out = Output::new(&args);
    let daemon_args: Vec<String> = args
        .latency_budget
        .map(|b| vec!["--latency-budget".into(), b.to_string()])
        .unwrap_or_default();
    for &s in scenarios {
        let env = if s == ScenarioArg::S8 {
            s8::s8_env()
        } else if s == ScenarioArg::S3 {
            s3::s3_env()
        } else {
            Vec::new()
        };
        let ctx = Ctx {
            bench: &bench,
            d: args.duration,
            policies: &policies,
            cpus: args.cpus,
            env: &env,
            pin: Cpus::Shared,
            daemon_args: &daemon_args,
            s8_training: args.s8_training,
        };
        match s {
            ScenarioArg::S1 => s1::s1(&ctx, &mut out)?,
            ScenarioArg::S2 => s2::s2(&ctx, &mut out)?,
            ScenarioArg::S3 => s3::s3(&ctx, &mut out, &args.ops)?,
            ScenarioArg::S4 => s4::s4(&ctx, &mut out)?,
            ScenarioArg::S5 => s5::s5(&ctx, &mut out)?,
            ScenarioArg::S6 => s6::s6(&ctx, &mut out)?,
            ScenarioArg::S7 => s7::s7(&ctx, &mut out)?,
            ScenarioArg::S8 => s8::s8(&ctx, &mut out)?,
            ScenarioArg::S9 => s9::s9(&ctx, &mut out, &args.s9_processes)?,
            ScenarioArg::S10 => s10::s10(&ctx, &mut out, &args.s10_kernels, args.latency_budget)?,
            ScenarioArg::All => unreachable!(),
        }
    }
    if out.failed > 0 {
        bail!(
            "{} scenario/policy run(s) failed: see their \"error\" rows",
            out.failed
        );
    }
    if !out.skipped.is_empty() {
        bail!("{} skipped: see the line above", out.skipped.join(", "));
    }
    Ok(())
}

struct Ctx<'a> {
    bench: &'a Bench,
    d: f64,
    policies: &'a [Policy],
    cpus: Option<CpuLayout>,
    /// Extra environment of every job of the scenario's runs (S8: simgpu's cost model).
    env: &'a [(String, std::ffi::OsString)],
    /// Where the scenario's jobs run on the host's CPUs.
    pin: Cpus,
    /// libshare's daemon's arguments where a scenario gives none (`--latency-budget`).
    daemon_args: &'a [String],
    /// S8's training: batch and layer width.
    s8_training: (u32, u32),
}

/// Runs `with` under the CPU layouts `--cpus` asks (S8, S9; else `default`): `by-class` (each class on CPUs of
/// its own, as a node's cpusets give containers), `shared`, or `both` (`by-class` for every
/// policy, then `shared` for `native` and `libshare` as the control: CPU contention apart from
/// the GPU's).
fn by_layout(
    ctx: &Ctx<'_>,
    out: &mut Output,
    default: CpuLayout,
    with: impl Fn(&Ctx<'_>, &mut Output, Cpus, &[Policy]) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    match ctx.cpus.unwrap_or(default) {
        CpuLayout::ByClass => with(ctx, out, Cpus::ByClass, ctx.policies),
        CpuLayout::Shared => with(ctx, out, Cpus::Shared, ctx.policies),
        CpuLayout::Both => {
            with(ctx, out, Cpus::ByClass, ctx.policies)?;
            let control: Vec<Policy> = ctx
                .policies
                .iter()
                .copied()
                .filter(|p| matches!(p, Policy::Native | Policy::Libshare))
                .collect();
            if control.is_empty() {
                return Ok(());
            }
            with(ctx, out, Cpus::Shared, &control)
        }
    }
}

/// Rounds to 3 decimals; a non-finite value becomes null.
fn num(v: f64) -> Value {
    if v.is_finite() {
        Value::from((v * 1000.0).round() / 1000.0)
    } else {
        Value::Null
    }
}

fn opt(v: Option<f64>) -> Value {
    v.map_or(Value::Null, num)
}

/// The columns every row has, in order (null where a figure does not apply).
const COLUMNS: [&str; 7] = [
    "production_ratio",
    "opportunistic_harvest",
    "p99_ratio",
    "reaction_ms",
    "daemon_cpu_pct",
    "share_error_pct",
    "gate_refresh_ms_max",
];

fn row(scenario: &str, policy: Policy) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("scenario".into(), scenario.into());
    m.insert("policy".into(), policy.name().into());
    for c in COLUMNS {
        m.insert(c.into(), Value::Null);
    }
    m
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Format {
    Table,
    Json,
    Markdown,
}

struct Output {
    format: Format,
    plot: Option<PathBuf>,
    /// Rows that are errors.
    failed: usize,
    /// Scenarios that could not run here (S8 without PyTorch).
    skipped: Vec<&'static str>,
}

/// Prints a line; a closed stdout is ignored (the runs still clean up after themselves).
fn line(s: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{s}").and_then(|()| out.flush());
}

impl Output {
    fn new(args: &Options) -> Output {
        let format = if args.json {
            Format::Json
        } else if args.markdown {
            Format::Markdown
        } else {
            Format::Table
        };
        match format {
            Format::Table => line(&format!(
                "{:<4} {:<13} {:>7} {:>8} {:>7} {:>9} {:>8} {:>8} {:>8}  notes",
                "", "policy", "prod", "harvest", "p99", "react_ms", "cpu%", "share_e", "gate_ms"
            )),
            Format::Markdown => {
                line("| scenario | policy | production_ratio | opportunistic_harvest | p99_ratio | reaction_ms | daemon_cpu_pct | share_error_pct | gate_refresh_ms_max | other figures |");
                line("|---|---|---|---|---|---|---|---|---|---|");
            }
            Format::Json => {}
        }
        Output {
            format,
            plot: args.plot.clone(),
            failed: 0,
            skipped: Vec::new(),
        }
    }

    /// Prints a row now (runs are long: results appear as they come).
    fn emit(&mut self, m: Map<String, Value>) {
        if self.format == Format::Json {
            line(&Value::Object(m).to_string());
            return;
        }
        let f = |k: &str| match m.get(k).and_then(Value::as_f64) {
            Some(v) => format!("{v:.3}"),
            None => "-".into(),
        };
        let mut notes = Vec::new();
        for (k, v) in &m {
            if k == "scenario" || k == "policy" || COLUMNS.contains(&k.as_str()) {
                continue;
            }
            match v {
                Value::Number(n) => notes.push(format!("{k}={n}")),
                Value::String(s) => notes.push(format!("{k}: {s}")),
                Value::Bool(b) => notes.push(format!("{k}={b}")),
                _ => {}
            }
        }
        let (scenario, policy) = (
            m["scenario"].as_str().unwrap_or(""),
            m["policy"].as_str().unwrap_or(""),
        );
        let cols: Vec<String> = COLUMNS.iter().map(|c| f(c)).collect();
        if self.format == Format::Markdown {
            line(&format!(
                "| {scenario} | {policy} | {} | {} |",
                cols.join(" | "),
                notes.join(", ").replace('|', "/")
            ));
        } else {
            line(&format!(
                "{:<4} {:<13} {:>7} {:>8} {:>7} {:>9} {:>8} {:>8} {:>8}  {}",
                scenario,
                policy,
                cols[0],
                cols[1],
                cols[2],
                cols[3],
                cols[4],
                cols[5],
                cols[6],
                notes.join(", ")
            ));
        }
    }

    /// A scenario that cannot run here: one line on stderr instead of its rows (the others
    /// still run; the exit code is 1).
    fn skip(&mut self, scenario: &'static str, why: &str) {
        eprintln!("sharectl bench: {scenario} skipped: {why}");
        self.skipped.push(scenario);
    }

    fn error(&mut self, scenario: &str, policy: Policy, e: &anyhow::Error) {
        let mut m = row(scenario, policy);
        m.insert("error".into(), format!("{e:#}").into());
        self.failed += 1;
        self.emit(m);
    }

    /// Writes `<DIR>/<scenario>-<policy>[-<part>].svg` if plotting.
    fn plot(&self, scenario: &str, policy: Policy, part: &str, rec: &RunRecord) {
        let Some(dir) = &self.plot else { return };
        let name = if part.is_empty() {
            format!("{scenario}-{}.svg", policy.name())
        } else {
            format!("{scenario}-{}-{part}.svg", policy.name())
        };
        let title = format!("{scenario} {} {part}", policy.name());
        if let Err(e) = plot::timeline(&dir.join(name), title.trim(), &timelines(rec)) {
            eprintln!("sharectl bench: {e:#}");
        }
    }
}

/// GPU share per job over time (100 ms bins) from its trace and progress lines.
fn timelines(rec: &RunRecord) -> Vec<plot::Series> {
    const BIN: f64 = 0.1;
    let end = rec.jobs.iter().map(JobRecord::end).fold(0.0, f64::max);
    rec.jobs
        .iter()
        .map(|j| {
            let gpu_ms = j.config("gpu_ms").unwrap_or(0.0);
            let points = match j.bin {
                "simjob-saturate" => {
                    let k = j.config("kernel_ms").unwrap_or(0.0);
                    let measured = j.counter("gpu_ms");
                    let c: Vec<(f64, f64)> = if measured.len() > 1 {
                        measured
                    } else {
                        j.counter("kernels")
                            .iter()
                            .map(|&(t, n)| (t, n * k))
                            .collect()
                    };
                    metrics::counter_timeline(&c, end, BIN)
                }
                "simjob-infer" => {
                    let spans: Vec<(f64, f64, f64)> = j
                        .spans("request")
                        .map(|(_, e, v)| {
                            let began = v["began"].as_f64().map_or(e, |b| b + j.offset);
                            (began, e, gpu_ms)
                        })
                        .collect();
                    metrics::spans_timeline(&spans, end, BIN)
                }
                _ => {
                    let spans: Vec<(f64, f64, f64)> =
                        j.spans("iter").map(|(s, e, _)| (s, e, gpu_ms)).collect();
                    metrics::spans_timeline(&spans, end, BIN)
                }
            };
            (format!("{} ({})", j.container, j.class.name()), points)
        })
        .collect()
}

fn train(name: &str, profile: Train, secs: f64, extra: &[&str]) -> JobSpec {
    let mut a = profile.args();
    a.extend(["--duration".into(), format!("{secs:.3}")]);
    a.extend(["--trace".into(), "--report-interval".into(), "100ms".into()]);
    a.extend(extra.iter().map(|x| x.to_string()));
    JobSpec {
        container: name.into(),
        class: Class::Production,
        bin: Train::BIN,
        args: a,
        delay: 0.0,
    }
}

/// Production inference (`simjob-infer` with `args`) in container `prod` for `secs`, traced.
fn production_infer(args: &[&str], secs: f64) -> JobSpec {
    let mut a: Vec<String> = args.iter().map(|x| x.to_string()).collect();
    a.extend(["--trace".into(), "--report-interval".into(), "100ms".into()]);
    a.extend(["--duration".into(), format!("{secs:.3}")]);
    JobSpec {
        container: "prod".into(),
        class: Class::Production,
        bin: "simjob-infer",
        args: a,
        delay: 0.0,
    }
}

fn saturate(name: &str, depth: u32, secs: f64, delay: f64) -> JobSpec {
    saturate_ms(name, "0.5", depth, secs, delay)
}

/// A saturating job of `kernel_ms` kernels, `depth` in flight, in container `name`.
fn saturate_ms(name: &str, kernel_ms: &str, depth: u32, secs: f64, delay: f64) -> JobSpec {
    JobSpec {
        container: name.into(),
        class: Class::Opportunistic,
        bin: "simjob-saturate",
        args: vec![
            "--kernel-ms".into(),
            kernel_ms.into(),
            "--depth".into(),
            depth.to_string(),
            "--duration".into(),
            format!("{secs:.3}"),
            "--report-interval".into(),
            "100ms".into(),
        ],
        delay,
    }
}

/// Runs `jobs` under `policy` (production jobs only for exclusive).
fn run_policy(
    ctx: &Ctx<'_>,
    policy: Policy,
    jobs: &[JobSpec],
    idle: &[String],
    sample: bool,
) -> anyhow::Result<RunRecord> {
    run_policy_with(ctx, policy, jobs, idle, sample, &[])
}

/// [`run_policy`], the daemon (if the policy runs one) given `daemon_args`.
fn run_policy_with(
    ctx: &Ctx<'_>,
    policy: Policy,
    jobs: &[JobSpec],
    idle: &[String],
    sample: bool,
    daemon_args: &[String],
) -> anyhow::Result<RunRecord> {
    let jobs: Vec<JobSpec> = if policy == Policy::Exclusive {
        jobs.iter()
            .filter(|j| j.class == Class::Production)
            .cloned()
            .collect()
    } else {
        jobs.to_vec()
    };
    let shared = !matches!(policy, Policy::Exclusive | Policy::Native);
    ctx.bench.run(&RunSpec {
        setup: policy.setup(&jobs),
        jobs,
        idle_containers: if shared { idle.to_vec() } else { Vec::new() },
        sample_gates: sample && shared,
        env: ctx.env.to_vec(),
        daemon_args: if daemon_args.is_empty() {
            ctx.daemon_args.to_vec()
        } else {
            daemon_args.to_vec()
        },
        cpus: ctx.pin,
    })
}

/// Production's rate (iterations or requests per second ended in the window) and GPU time.
fn production_in(j: &JobRecord, event: &str, a: f64, b: f64) -> (f64, f64) {
    let spans: Vec<(f64, f64)> = j.spans(event).map(|(s, e, _)| (s, e)).collect();
    let n = metrics::ended_within(&spans, a, b) as f64;
    (n / (b - a), n * j.config("gpu_ms").unwrap_or(0.0))
}

/// An opportunistic saturating job's GPU time (ms) in [a, b].
/// Its cumulative `gpu_ms` (measured for memsets and copies); from `kernels` × `--kernel-ms`
/// for a job that does not report it.
fn opportunistic_in(j: &JobRecord, a: f64, b: f64) -> f64 {
    let gpu_ms = j.counter("gpu_ms");
    if gpu_ms.len() > 1 {
        return metrics::growth(&gpu_ms, a, b);
    }
    metrics::growth(&j.counter("kernels"), a, b) * j.config("kernel_ms").unwrap_or(0.0)
}

/// The window where every job of the run runs: [last start, first end], or for a solo run
/// [start + `skip`, end] (the co-located runs start the opportunistic job `skip` s late).
fn window(rec: &RunRecord, skip: f64) -> anyhow::Result<(f64, f64)> {
    let a = rec
        .jobs
        .iter()
        .map(JobRecord::start)
        .fold(f64::MIN, f64::max);
    let b = rec.jobs.iter().map(JobRecord::end).fold(f64::MAX, f64::min);
    let a = if rec.jobs.iter().all(|j| j.class == Class::Production) {
        a + skip
    } else {
        a
    };
    if b - a < 0.5 {
        bail!("the jobs overlapped for {:.2} s only", b - a);
    }
    Ok((a, b))
}

/// Runs `f` for each policy after exclusive (whose record is `solo`), emitting rows.
fn for_policies(
    ctx: &Ctx<'_>,
    out: &mut Output,
    scenario: &str,
    mut f: impl FnMut(Policy) -> anyhow::Result<(Map<String, Value>, Vec<(String, RunRecord)>)>,
) {
    for &p in ctx.policies {
        match f(p) {
            Ok((m, recs)) => {
                for (part, r) in &recs {
                    out.plot(scenario, p, part, r);
                }
                out.emit(m);
            }
            Err(e) => out.error(scenario, p, &e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jobs::profiles::TRAIN;

    /// The argv of S1's production job, S3's and S9's inference and S6's light trainers, as
    /// written by hand at each site before they came from `jobs::profiles` and one helper.
    #[test]
    fn production_jobs_run_the_argv_they_always_ran() {
        let job = train("prod", TRAIN, 1.0, &["--phases", "1s:1s"]);
        assert_eq!(job.bin, "simjob-train");
        assert_eq!(
            job.args.join(" "),
            "--gpu-ms 6 --kernels 4 --cpu-ms 4 --mem 256MiB --duration 1.000 --trace --report-interval 100ms --phases 1s:1s"
        );
        // S3's and S9's production inference.
        let (s3, s9) = (production_infer(s3::S3_INFER, 2.0), s9::infer40(1.5));
        assert_eq!(
            s3.args.join(" "),
            "--rate 20 --gpu-ms 5 --kernels 2 --trace --report-interval 100ms --duration 2.000"
        );
        assert_eq!(
            s9.args.join(" "),
            "--rate 40 --gpu-ms 4 --trace --report-interval 100ms --duration 1.500"
        );
        assert_eq!(
            (s3.bin, s3.delay, s9.container),
            ("simjob-infer", 0.0, "prod".into())
        );
        assert_eq!(
            s6::S6_LIGHT.args().join(" "),
            "--gpu-ms 3 --kernels 2 --cpu-ms 7 --mem 64MiB"
        );
    }

    #[test]
    fn static_split_caps_every_job_equally() {
        let jobs = [train("prod", TRAIN, 1.0, &[]), saturate("opp", 4, 1.0, 0.0)];
        let Setup::Shared {
            policy,
            set,
            all_opportunistic,
        } = Policy::StaticSplit.setup(&jobs)
        else {
            panic!("static-split runs under the shim")
        };
        assert_eq!(policy, "libshare");
        assert!(all_opportunistic);
        assert_eq!(set.len(), 2);
        assert!(set.iter().all(|(_, a)| a == &["--compute", "50%"]));
        assert!(matches!(Policy::Native.setup(&jobs), Setup::Native));
    }
}
