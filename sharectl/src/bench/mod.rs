//! `sharectl bench`: issue 9's sharing scenarios, each under every policy in one run.
//!
//! Every scenario first runs its production job(s) alone (`exclusive`: the solo figures the
//! other policies are compared with, measured in the same run), then production and
//! opportunistic jobs together under `native` (no shim), `static-split` (both opportunistic,
//! capped to an equal share with `sharectl set --compute`, HAMi-style), `time-slice` (the daemon
//! gives exclusive quanta, nvshare-style) and `libshare`. The figures come from the jobs' own
//! output (`jobs/README.md`): production GPU time = iterations × `--gpu-ms`, opportunistic GPU
//! time = kernels × `--kernel-ms`. BENCHMARKS.md lists the parameters and the columns.

mod exec;
mod metrics;
mod plot;
mod python;
mod s4;
mod s5;

use anyhow::{anyhow, bail, Context};
use exec::{Bench, Class, Cpus, JobRecord, JobSpec, RunRecord, RunSpec, Setup};
use jobs::profiles::{Train, TRAIN};
use serde_json::{Map, Value};
use std::path::PathBuf;

/// Run issue 9's sharing scenarios under every policy and print one result per scenario and
/// policy.
///
/// Starts a private `sharectl daemon` per run on a temporary state dir and the `jobs/` programs
/// (on simgpu when there is no GPU). Policies: exclusive, native, static-split, time-slice,
/// libshare. A policy that cannot run (e.g. no daemon in this build) prints its error, the
/// others still run, and the exit code is 1.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Which scenario(s) to run.
    #[arg(value_enum)]
    pub scenario: ScenarioArg,

    /// Print JSON lines instead of a table.
    #[arg(long, conflicts_with = "markdown")]
    pub json: bool,

    /// Print a Markdown table (as in BENCHMARKS.md).
    #[arg(long)]
    pub markdown: bool,

    /// Write one SVG timeline per scenario, policy and run into DIR.
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,

    /// Seconds per co-located run (scenarios scale their phases with it).
    #[arg(long, value_name = "SECS", default_value_t = 6.0, value_parser = |s: &str| crate::commands::parse_secs(s, 2.0..=600.0))]
    pub duration: f64,

    #[command(flatten)]
    pub platform: crate::platform::PlatformArgs,

    /// The shim to preload [default: libshare.so next to sharectl, else <target>/dist/].
    #[arg(long, value_name = "FILE")]
    pub shim: Option<PathBuf>,

    /// The Python (with PyTorch) that runs S8's jobs [default: the venv scripts/fetch-cuda.sh
    /// installs in ~/.cache/libshare/torch-venv, else python3].
    #[arg(long, value_name = "FILE")]
    pub python: Option<PathBuf>,

    /// S8's CPU layout: `by-class` (production on a CPU of its own, the others and the daemon
    /// on the rest, as containers on a GPU node), `shared` (anywhere: CPU contention on top of the GPU's), or
    /// `both` (`shared` as a control for `native` and `libshare`).
    #[arg(long, value_enum, default_value = "both")]
    pub cpus: CpuLayout,

    /// S3's opportunistic operations (comma-separated), one part each: `kernel` (0.5 ms
    /// kernels), `memset` (2 MiB `cuMemsetD8Async`), `copy` (1 MiB `cuMemcpyDtoDAsync`).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "kernel,memset,copy"
    )]
    pub ops: Vec<S3Op>,

    /// Only these policies (comma-separated) [default: all five].
    #[arg(long, value_enum, value_delimiter = ',')]
    pub policy: Vec<Policy>,
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

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
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
    for &s in scenarios {
        let env = if s == ScenarioArg::S8 {
            s8_env()
        } else if s == ScenarioArg::S3 {
            s3_env()
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
        };
        match s {
            ScenarioArg::S1 => s1(&ctx, &mut out)?,
            ScenarioArg::S2 => s2(&ctx, &mut out)?,
            ScenarioArg::S3 => s3(&ctx, &mut out, &args.ops)?,
            ScenarioArg::S4 => s4::s4(&ctx, &mut out)?,
            ScenarioArg::S5 => s5::s5(&ctx, &mut out)?,
            ScenarioArg::S6 => s6(&ctx, &mut out)?,
            ScenarioArg::S7 => s7(&ctx, &mut out)?,
            ScenarioArg::S8 => s8(&ctx, &mut out)?,
            ScenarioArg::S9 => s9(&ctx, &mut out)?,
            ScenarioArg::S10 => s10(&ctx, &mut out)?,
            ScenarioArg::All => unreachable!(),
        }
    }
    if out.failed > 0 {
        bail!(
            "{} scenario/policy run(s) failed: see their \"error\" rows",
            out.failed
        );
    }
    Ok(())
}

struct Ctx<'a> {
    bench: &'a Bench,
    d: f64,
    policies: &'a [Policy],
    cpus: CpuLayout,
    /// Extra environment of every job of the scenario's runs (S8: simgpu's cost model).
    env: &'a [(String, std::ffi::OsString)],
    /// Where the scenario's jobs run on the host's CPUs.
    pin: Cpus,
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
}

/// Prints a line; a closed stdout is ignored (the runs still clean up after themselves).
fn line(s: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{s}").and_then(|()| out.flush());
}

impl Output {
    fn new(args: &BenchArgs) -> Output {
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
        daemon_args: daemon_args.to_vec(),
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

/// S1, co-training: production training (~60 % of the GPU) + a saturating opportunistic job
/// started 1 s later.
fn s1(ctx: &Ctx<'_>, out: &mut Output) -> anyhow::Result<()> {
    let d = ctx.d;
    let jobs = vec![train("prod", TRAIN, d, &[]), saturate("opp", 4, d, 1.0)];
    let solo = run_policy(ctx, Policy::Exclusive, &jobs, &[], false)
        .context("S1: production alone (the solo baseline)")?;
    let (sa, sb) = window(&solo, 1.0)?;
    let (solo_rate, _) = production_in(solo.job("prod"), "iter", sa, sb);
    for_policies(ctx, out, "S1", |p| {
        let rec = if p == Policy::Exclusive {
            solo.clone()
        } else {
            run_policy(ctx, p, &jobs, &[], false)?
        };
        let (a, b) = window(&rec, 1.0)?;
        let (rate, prod_gpu) = production_in(rec.job("prod"), "iter", a, b);
        let opp = rec.jobs.iter().find(|j| j.container == "opp");
        let opp_gpu = opp.map_or(0.0, |j| opportunistic_in(j, a, b));
        let mut m = row("S1", p);
        m.insert("production_ratio".into(), num(rate / solo_rate));
        m.insert(
            "opportunistic_harvest".into(),
            opt(metrics::harvest(opp_gpu, (b - a) * 1e3, prod_gpu)),
        );
        m.insert("daemon_cpu_pct".into(), opt(rec.daemon_cpu_pct()));
        m.insert("production_iters_per_s".into(), num(rate));
        m.insert("solo_iters_per_s".into(), num(solo_rate));
        m.insert("window_s".into(), num(b - a));
        Ok((m, vec![(String::new(), rec)]))
    });
    Ok(())
}

/// S2, surge: production alternates busy and idle phases (BUSY:IDLE = P:P, five phases, starting
/// busy) next to a saturating opportunistic job.
fn s2(ctx: &Ctx<'_>, out: &mut Output) -> anyhow::Result<()> {
    let p = (ctx.d / 3.0).clamp(0.5, 2.0);
    let phases = format!("{:.3}s:{:.3}s", p, p);
    let jobs = vec![
        train("prod", TRAIN, 5.0 * p, &["--phases", &phases]),
        saturate("opp", 4, 5.0 * p, p / 2.0),
    ];
    let solo = run_policy(ctx, Policy::Exclusive, &jobs, &[], false)
        .context("S2: production alone (the solo baseline)")?;
    let prod_solo = solo.job("prod");
    let solo_iters = iters_by_phase(prod_solo);
    // Solo iteration time: every iteration but each phase's first.
    let solo_durs: Vec<f64> = solo_iters
        .iter()
        .flat_map(|(_, v)| v.iter().skip(1).map(|(s, e)| e - s))
        .collect();
    let solo_iter = metrics::mean(&solo_durs).ok_or_else(|| anyhow!("S2: no solo iterations"))?;
    let solo_after: usize = solo_iters
        .iter()
        .filter(|(k, _)| *k >= 1)
        .map(|(_, v)| v.len())
        .sum();
    for_policies(ctx, out, "S2", |pol| {
        let rec = if pol == Policy::Exclusive {
            solo.clone()
        } else {
            run_policy(ctx, pol, &jobs, &[], false)?
        };
        let prod = rec.job("prod");
        let opp = rec.jobs.iter().find(|j| j.container == "opp");
        let by_phase = iters_by_phase(prod);
        let after: usize = by_phase
            .iter()
            .filter(|(k, _)| *k >= 1)
            .map(|(_, v)| v.len())
            .sum();
        let mut m = row("S2", pol);
        m.insert(
            "production_ratio".into(),
            num(after as f64 / solo_after.max(1) as f64),
        );
        if let Some(o) = opp {
            // Returns: busy phases that began while the opportunistic job ran.
            let mut worst: Option<f64> = None;
            let mut recovered = true;
            for (k, v) in &by_phase {
                if *k == 0 || v.first().is_none_or(|f| f.0 < o.start()) {
                    continue;
                }
                let r = match metrics::reaction(v, solo_iter, 3, 0.03) {
                    Some(r) => r,
                    None => {
                        recovered = false;
                        p
                    }
                };
                worst = Some(worst.map_or(r, |w: f64| w.max(r)));
            }
            m.insert("reaction_ms".into(), opt(worst.map(|w| w * 1e3)));
            m.insert("recovered".into(), recovered.into());
            let (mut idle, mut got) = (0.0, 0.0);
            for (s, e, _) in prod.spans("idle") {
                if s >= o.start() && e <= o.end() {
                    idle += e - s;
                    got += opportunistic_in(o, s, e);
                }
            }
            m.insert(
                "opportunistic_harvest".into(),
                opt((idle > 0.0).then(|| got / (idle * 1e3))),
            );
        } else {
            m.insert("opportunistic_harvest".into(), num(0.0));
        }
        m.insert("daemon_cpu_pct".into(), opt(rec.daemon_cpu_pct()));
        m.insert("solo_iter_ms".into(), num(solo_iter * 1e3));
        m.insert("phase_s".into(), num(p));
        Ok((m, vec![(String::new(), rec)]))
    });
    Ok(())
}

/// A train job's traced iterations grouped by phase: (phase, [(start, end)]), in order.
fn iters_by_phase(j: &JobRecord) -> Vec<(u64, Vec<(f64, f64)>)> {
    let mut v: Vec<(u64, Vec<(f64, f64)>)> = Vec::new();
    for (s, e, l) in j.spans("iter") {
        let k = l["phase"].as_u64().unwrap_or(0);
        match v.last_mut() {
            Some((pk, it)) if *pk == k => it.push((s, e)),
            _ => v.push((k, vec![(s, e)])),
        }
    }
    v
}

/// S3's simulated device memory bandwidth (`SIMGPU_HBM_BW`, unless set): 2 GB/s instead of an
/// A100's 1.5 TB/s. simgpu's device memory is host memory, so a memset or device-to-device copy
/// really moves its bytes on the host's CPU while it is priced at this bandwidth; at 1.5 TB/s a
/// 1 ms memset would write 1.5 GB (~0.2 s of one host core). At 2 GB/s the memset part's 2 MiB
/// memset and the copy part's 1 MiB copy (read + write: half the bandwidth) are ~1 ms of GPU
/// time each, as a 1.5 GB memset or a 750 MB copy on an A100, and move their bytes on the host
/// in < 0.1 ms. What is assumed: the gate sees only an operation's duration and its events, never
/// its bytes once timed, so a 1 ms memset of 2 MiB stands for a 1 ms memset of 1.5 GB. (The
/// shim prices a memset or copy it has not timed yet at the device's memory clock × bus width,
/// which simgpu reports for the configured bandwidth.) Production (kernels with explicit durations and host↔device copies) does not depend on it.
const S3_HBM_BW: &str = "2GB/s";
/// S3's memset part: bytes per `cuMemsetD8Async` (~1 ms at [`S3_HBM_BW`]).
const S3_MEMSET_BYTES: &str = "2MiB";
/// S3's copy part: bytes per `cuMemcpyDtoDAsync` (~1 ms at [`S3_HBM_BW`] / 2).
const S3_COPY_BYTES: &str = "1MiB";

/// The environment S3's jobs add: simgpu's device memory bandwidth.
fn s3_env() -> Vec<(String, std::ffi::OsString)> {
    let bw = std::env::var_os("SIMGPU_HBM_BW").unwrap_or_else(|| S3_HBM_BW.into());
    vec![("SIMGPU_HBM_BW".into(), bw)]
}

/// S3's opportunistic job, started 1 s late at depth 4: 0.5 ms kernels, or memsets or
/// device-to-device copies of ~1 ms each.
fn s3_opportunistic(op: S3Op, secs: f64) -> JobSpec {
    let mut j = saturate("opp", 4, secs, 1.0);
    let (name, bytes) = match op {
        S3Op::Kernel => return j,
        S3Op::Memset => ("memset", S3_MEMSET_BYTES),
        S3Op::Copy => ("copy", S3_COPY_BYTES),
    };
    j.args
        .extend(["--op", name, "--bytes", bytes].map(String::from));
    j
}

/// S3's production inference: 20 requests/s of 5 ms of GPU time in 2 kernels.
const S3_INFER: &[&str] = &["--rate", "20", "--gpu-ms", "5", "--kernels", "2"];

/// S3, latency: production inference at 20 req/s (5 ms of GPU each) for 2 D + a saturating
/// opportunistic job started 1 s later, one part per `--ops` entry: 0.5 ms kernels (no `op`
/// figure), memsets or device-to-device copies (`op`: `memset`, `copy`; see [`S3_HBM_BW`]).
/// Every part is compared with the same solo run; the harvest counts the opportunistic job's
/// `gpu_ms` (its memsets and copies timed by their events).
fn s3(ctx: &Ctx<'_>, out: &mut Output, ops: &[S3Op]) -> anyhow::Result<()> {
    // Twice as long as the others: at 20 requests/s a p99 needs a few hundred requests.
    let d = 2.0 * ctx.d;
    let infer = production_infer(S3_INFER, d);
    let Solo {
        rec: solo,
        p99: solo_p99,
        rate: solo_rate,
        ..
    } = solo_latency(ctx, "S3", &infer)?;
    for (i, &op) in ops.iter().enumerate() {
        // One solo row for all parts.
        let policies: Vec<Policy> = ctx
            .policies
            .iter()
            .copied()
            .filter(|&p| i == 0 || p != Policy::Exclusive)
            .collect();
        let sub = Ctx {
            policies: &policies,
            ..*ctx
        };
        let jobs = vec![infer.clone(), s3_opportunistic(op, d)];
        let part = match op {
            S3Op::Kernel => "",
            S3Op::Memset => "memset",
            S3Op::Copy => "copy",
        };
        for_policies(&sub, out, "S3", |p| {
            let rec = if p == Policy::Exclusive {
                solo.clone()
            } else {
                run_policy(ctx, p, &jobs, &[], false)?
            };
            let op = (p != Policy::Exclusive && !part.is_empty()).then(|| ("op", part.into()));
            let m = latency_row("S3", p, &rec, (solo_rate, solo_p99), op.into_iter())?;
            let part = if p == Policy::Exclusive { "" } else { part };
            Ok((m, vec![(part.to_string(), rec)]))
        });
    }
    Ok(())
}

/// The latencies (ms) of production's requests (container `prod`) that started in `[a, b]`.
fn latencies(rec: &RunRecord, a: f64, b: f64) -> Vec<f64> {
    rec.job("prod")
        .spans("request")
        .filter(|(s, _, _)| *s >= a && *s <= b)
        .filter_map(|(_, _, v)| v["latency_ms"].as_f64())
        .collect()
}

/// Production inference alone, the solo baseline of a latency scenario (S3, S9, S10): the run,
/// its window (from 1 s in), its p99 (ms) and its requests/s.
struct Solo {
    rec: RunRecord,
    window: (f64, f64),
    p99: f64,
    rate: f64,
}

fn solo_latency(ctx: &Ctx<'_>, scenario: &str, prod: &JobSpec) -> anyhow::Result<Solo> {
    let rec = run_policy(
        ctx,
        Policy::Exclusive,
        std::slice::from_ref(prod),
        &[],
        false,
    )
    .with_context(|| format!("{scenario}: production alone (the solo baseline)"))?;
    let (a, b) = window(&rec, 1.0)?;
    let p99 = metrics::percentile(&latencies(&rec, a, b), 99.0)
        .ok_or_else(|| anyhow!("{scenario}: no solo requests"))?;
    let (rate, _) = production_in(rec.job("prod"), "request", a, b);
    Ok(Solo {
        rec,
        window: (a, b),
        p99,
        rate,
    })
}

/// The row of a latency scenario's run (S3, S9): production inference in container `prod`
/// against its solo `(requests/s, p99 ms)`, every opportunistic job's harvest, then `extra`
/// figures, then the latencies.
fn latency_row(
    scenario: &str,
    p: Policy,
    rec: &RunRecord,
    solo: (f64, f64),
    extra: impl Iterator<Item = (&'static str, Value)>,
) -> anyhow::Result<Map<String, Value>> {
    let (a, b) = window(rec, 1.0)?;
    latency_row_in(scenario, p, rec, solo, extra, (a, b))
}

/// The p99 of production's requests due in each whole second of `[a, b)`, ms (issue 31: a
/// start that stalls production for one second hides in the run's p99). JSON only.
fn p99_by_second(rec: &RunRecord, a: f64, b: f64) -> Vec<f64> {
    let seconds = ((b - a) + 1e-9).floor().max(0.0) as usize;
    (0..seconds)
        .filter_map(|i| {
            let s = a + i as f64;
            metrics::percentile(&latencies(rec, s, s + 1.0), 99.0)
        })
        .collect()
}

/// A row's worst second: each whole second's p99 of the requests due in `[a, b)` against
/// `p99` (solo's; for a solo row, its own: the noise floor of `worst_second_p99_ratio`).
fn seconds_of(m: &mut Map<String, Value>, rec: &RunRecord, (a, b): (f64, f64), p99: f64) {
    let by_second = p99_by_second(rec, a, b);
    let worst = by_second.iter().copied().reduce(f64::max);
    m.insert("worst_second_p99_ratio".into(), opt(worst.map(|x| x / p99)));
    m.insert(
        "p99_by_second_ms".into(),
        by_second.iter().map(|&x| num(x)).collect(),
    );
}

/// [`latency_row`] over the window `(a, b)` of the run's axis.
fn latency_row_in(
    scenario: &str,
    p: Policy,
    rec: &RunRecord,
    (solo_rate, solo_p99): (f64, f64),
    extra: impl Iterator<Item = (&'static str, Value)>,
    (a, b): (f64, f64),
) -> anyhow::Result<Map<String, Value>> {
    let lat = latencies(rec, a, b);
    let p99 = metrics::percentile(&lat, 99.0);
    let (rate, prod_gpu) = production_in(rec.job("prod"), "request", a, b);
    // A fold from +0.0: an empty f64 `sum()` is -0.0, which the table would print as "-0.000".
    let opp_gpu = rec
        .jobs
        .iter()
        .filter(|j| j.class == Class::Opportunistic)
        .map(|j| opportunistic_in(j, a, b))
        .fold(0.0, |s, x| s + x);
    let mut m = row(scenario, p);
    m.extend(extra.map(|(k, v)| (k.to_string(), v)));
    m.insert("production_ratio".into(), num(rate / solo_rate));
    m.insert(
        "opportunistic_harvest".into(),
        opt(metrics::harvest(opp_gpu, (b - a) * 1e3, prod_gpu)),
    );
    m.insert("p99_ratio".into(), opt(p99.map(|x| x / solo_p99)));
    seconds_of(&mut m, rec, (a, b), solo_p99);
    m.insert("daemon_cpu_pct".into(), opt(rec.daemon_cpu_pct()));
    m.insert("p99_ms".into(), opt(p99));
    m.insert("solo_p99_ms".into(), num(solo_p99));
    m.insert("p50_ms".into(), opt(metrics::percentile(&lat, 50.0)));
    Ok(m)
}

/// S6's production trainers: ~30 % of the GPU each.
const S6_LIGHT: Train = Train {
    gpu_ms: 3.0,
    kernels: 2,
    cpu_ms: 7.0,
    mem_mib: 64,
};

/// S6, scale: 32 registered containers, 8 active (2 production trainers at ~30 % of the GPU each,
/// 6 opportunistic saturating jobs at depth 2), the daemon at its default period (5 ms).
/// `daemon_cpu_pct` is the daemon's CPU over the window where all 8 jobs run (the steady state
/// the scenario is about); `daemon_cpu_pct_run` over the whole run, the jobs' start and end
/// included.
fn s6(ctx: &Ctx<'_>, out: &mut Output) -> anyhow::Result<()> {
    let d = ctx.d;
    let mut jobs = vec![train("p0", S6_LIGHT, d, &[]), train("p1", S6_LIGHT, d, &[])];
    for i in 0..6 {
        jobs.push(saturate(&format!("o{i}"), 2, d, 1.0));
    }
    let idle: Vec<String> = (0..24).map(|i| format!("idle{i:02}")).collect();
    let prods = |rec: &RunRecord, a: f64, b: f64| -> (f64, f64) {
        rec.jobs
            .iter()
            .filter(|j| j.class == Class::Production)
            .map(|j| production_in(j, "iter", a, b))
            .fold((0.0, 0.0), |x, y| (x.0 + y.0, x.1 + y.1))
    };
    let solo = run_policy(ctx, Policy::Exclusive, &jobs, &idle, true)
        .context("S6: production alone (the solo baseline)")?;
    let (sa, sb) = window(&solo, 1.0)?;
    let (solo_rate, _) = prods(&solo, sa, sb);
    for_policies(ctx, out, "S6", |p| {
        let rec = if p == Policy::Exclusive {
            solo.clone()
        } else {
            run_policy(ctx, p, &jobs, &idle, true)?
        };
        let (a, b) = window(&rec, 1.0)?;
        let (rate, prod_gpu) = prods(&rec, a, b);
        let opp_gpu: f64 = rec
            .jobs
            .iter()
            .filter(|j| j.class == Class::Opportunistic)
            .map(|j| opportunistic_in(j, a, b))
            .fold(0.0, |x, y| x + y);
        let mut m = row("S6", p);
        m.insert("production_ratio".into(), num(rate / solo_rate));
        m.insert(
            "opportunistic_harvest".into(),
            opt(metrics::harvest(opp_gpu, (b - a) * 1e3, prod_gpu)),
        );
        m.insert("daemon_cpu_pct".into(), opt(rec.daemon_cpu_pct_in(a, b)));
        m.insert("daemon_cpu_pct_run".into(), opt(rec.daemon_cpu_pct()));
        m.insert("gate_refresh_ms_max".into(), opt(rec.gate_refresh_ms_max));
        m.insert(
            "containers".into(),
            if matches!(p, Policy::Exclusive | Policy::Native) {
                Value::Null
            } else {
                Value::from(rec.jobs.len() + idle.len())
            },
        );
        Ok((m, vec![(String::new(), rec)]))
    });
    Ok(())
}

/// S7, static share: an opportunistic saturating container capped at 30 % alone; two weighted
/// 1:3 alone; and one uncapped alone under the shim and daemon vs without the shim.
fn s7(ctx: &Ctx<'_>, out: &mut Output) -> anyhow::Result<()> {
    let d = ctx.d.max(3.0);
    let gpu_share = |j: &JobRecord| -> Vec<(f64, f64)> {
        let k = j.config("kernel_ms").unwrap_or(0.0);
        j.counter("kernels")
            .iter()
            .map(|&(t, n)| (t, n * k))
            .collect()
    };
    let rate = |rec: &RunRecord, name: &str| -> f64 {
        let j = rec.job(name);
        let (a, b) = (j.start() + 0.5, j.end());
        opportunistic_in(j, a, b) / ((b - a) * 1e3)
    };
    // The native reference: the job alone without the shim (its cap cannot be enforced).
    let alone = vec![saturate("opp", 4, d / 2.0, 0.0)];
    let native = ctx
        .bench
        .run(&RunSpec {
            jobs: alone.clone(),
            setup: Setup::Native,
            idle_containers: Vec::new(),
            sample_gates: false,
            env: Vec::new(),
            daemon_args: Vec::new(),
            cpus: ctx.pin,
        })
        .context("S7: the opportunistic job alone without the shim")?;
    let native_rate = rate(&native, "opp");
    for_policies(ctx, out, "S7", |p| {
        let mut m = row("S7", p);
        let policy = match p {
            Policy::Exclusive | Policy::StaticSplit => {
                m.insert(
                    "note".into(),
                    "n/a: S7 is about one policy's caps and weights (see libshare, time-slice)"
                        .into(),
                );
                return Ok((m, Vec::new()));
            }
            Policy::Native => {
                // What a 30 % cap gives without enforcement: the job alone.
                let j = native.job("opp");
                let w = metrics::share_windows(&gpu_share(j), j.start() + 0.5, j.end(), 1.0);
                m.insert(
                    "share_error_pct".into(),
                    opt(metrics::mean_abs_error(&w, 30.0)),
                );
                m.insert("share_pct".into(), opt(metrics::mean(&w)));
                m.insert("gpu_fraction_alone".into(), num(native_rate));
                return Ok((m, vec![("alone".into(), native.clone())]));
            }
            Policy::TimeSlice => "time-slice",
            Policy::Libshare | Policy::HintsOnly | Policy::FixedQuantum => "libshare",
            Policy::Serial => bail!("S7 has no serial baseline"),
        };
        let shared = |set: Vec<(String, Vec<String>)>| Setup::Shared {
            policy,
            set,
            all_opportunistic: false,
        };
        // (a) capped at 30 %, alone.
        let capped = ctx.bench.run(&RunSpec {
            jobs: vec![saturate("cap30", 4, d, 0.0)],
            setup: shared(vec![(
                "cap30".into(),
                vec!["--compute".into(), "30%".into()],
            )]),
            idle_containers: Vec::new(),
            sample_gates: false,
            env: Vec::new(),
            daemon_args: Vec::new(),
            cpus: ctx.pin,
        })?;
        let j = capped.job("cap30");
        let w = metrics::share_windows(&gpu_share(j), j.start() + 0.5, j.end(), 1.0);
        m.insert(
            "share_error_pct".into(),
            opt(metrics::mean_abs_error(&w, 30.0)),
        );
        m.insert("share_pct".into(), opt(metrics::mean(&w)));
        // (b) weights 1:3, alone together.
        let weighted = ctx.bench.run(&RunSpec {
            jobs: vec![saturate("w1", 4, d, 0.0), saturate("w3", 4, d, 0.0)],
            setup: shared(vec![
                ("w1".into(), vec!["--weight".into(), "1".into()]),
                ("w3".into(), vec!["--weight".into(), "3".into()]),
            ]),
            idle_containers: Vec::new(),
            sample_gates: false,
            env: Vec::new(),
            daemon_args: Vec::new(),
            cpus: ctx.pin,
        })?;
        let (a, b) = window(&weighted, 0.0)?;
        let g1 = opportunistic_in(weighted.job("w1"), a + 0.5, b);
        let g3 = opportunistic_in(weighted.job("w3"), a + 0.5, b);
        let ratio = g3 / g1;
        m.insert("weight_ratio".into(), num(ratio));
        m.insert(
            "weight_error_pct".into(),
            num((ratio / 3.0 - 1.0).abs() * 100.0),
        );
        // (c) uncapped, alone under the shim and the daemon vs alone without the shim.
        let under = ctx.bench.run(&RunSpec {
            jobs: alone.clone(),
            setup: shared(Vec::new()),
            idle_containers: Vec::new(),
            sample_gates: false,
            env: Vec::new(),
            daemon_args: Vec::new(),
            cpus: ctx.pin,
        })?;
        m.insert("alone_ratio".into(), num(rate(&under, "opp") / native_rate));
        m.insert("daemon_cpu_pct".into(), opt(capped.daemon_cpu_pct()));
        Ok((
            m,
            vec![
                ("cap30".into(), capped),
                ("weights".into(), weighted),
                ("alone".into(), under),
            ],
        ))
    });
    Ok(())
}

/// S8's simgpu cost model: one wave of thread blocks costs 200 µs, so PyTorch's jobs are
/// GPU-bound as on a real GPU (simgpu's default runs a GEMM ~100× faster than an A100).
/// `SIMGPU_WAVE` in sharectl's environment overrides it.
const S8_WAVE: &str = "200us";
/// Seconds S8's Python jobs get to import torch and warm up before the measured interval.
const S8_SETUP: f64 = 25.0;

/// S8's jobs: production PyTorch inference (an 8-layer MLP at 40 requests/s) and, with `opp`,
/// opportunistic PyTorch training of a similar MLP; both warm up until an agreed wall-clock
/// time, then run for `secs`.
fn s8_jobs(secs: f64, opp: bool, prod: bool) -> Vec<JobSpec> {
    let start_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |t| t.as_secs_f64())
        + S8_SETUP;
    let common = |extra: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = extra.iter().map(|x| x.to_string()).collect();
        a.extend([
            "--start-at".into(),
            format!("{start_at:.3}"),
            "--duration".into(),
            format!("{secs:.3}"),
            "--trace".into(),
        ]);
        a
    };
    let mut jobs = Vec::new();
    if prod {
        jobs.push(JobSpec {
            container: "prod".into(),
            class: Class::Production,
            bin: "torch_infer.py",
            args: common(&["--rate", "40", "--layers", "8", "--batch", "64"]),
            delay: 0.0,
        });
    }
    if opp {
        jobs.push(JobSpec {
            container: "opp".into(),
            class: Class::Opportunistic,
            bin: "torch_train.py",
            args: common(&["--layers", "4", "--batch", "512"]),
            delay: 0.0,
        });
    }
    jobs
}

/// The environment S8's jobs add: simgpu's cost model.
fn s8_env() -> Vec<(String, std::ffi::OsString)> {
    let wave = std::env::var_os("SIMGPU_WAVE").unwrap_or_else(|| S8_WAVE.into());
    vec![("SIMGPU_WAVE".into(), wave)]
}

/// S8, PyTorch pair: production PyTorch inference (40 requests/s) beside opportunistic PyTorch
/// training, GPU-bound ([`S8_WAVE`]). p99 against production alone; the training's progress
/// against the training alone without the shim (`opportunistic_progress`), both in this run and
/// with the same CPUs.
///
/// Each job gets CPUs of its own ([`Cpus::ByClass`]), as containers do on a GPU node (cpusets):
/// two Python processes and their CUDA threads sharing a 2-core host's CPUs delay production's
/// requests for reasons that are not the GPU's (on a loaded host, as much as the GPU does). The
/// `cpus=shared` rows (`native` and `libshare`, with their own solo run) show that contention
/// apart from the GPU's.
fn s8(ctx: &Ctx<'_>, out: &mut Output) -> anyhow::Result<()> {
    match ctx.cpus {
        CpuLayout::ByClass => s8_with(ctx, out, Cpus::ByClass, ctx.policies)?,
        CpuLayout::Shared => s8_with(ctx, out, Cpus::Shared, ctx.policies)?,
        CpuLayout::Both => {
            s8_with(ctx, out, Cpus::ByClass, ctx.policies)?;
            let control: Vec<Policy> = ctx
                .policies
                .iter()
                .copied()
                .filter(|p| matches!(p, Policy::Native | Policy::Libshare))
                .collect();
            if !control.is_empty() {
                s8_with(ctx, out, Cpus::Shared, &control)?;
            }
        }
    }
    Ok(())
}

fn s8_with(ctx: &Ctx<'_>, out: &mut Output, cpus: Cpus, policies: &[Policy]) -> anyhow::Result<()> {
    let ctx = &Ctx { pin: cpus, ..*ctx };
    let d = 2.0 * ctx.d;
    let tag = match cpus {
        Cpus::ByClass => "by-class",
        Cpus::Shared => "shared",
    };
    let train_rate = |rec: &RunRecord, a: f64, b: f64| -> f64 {
        let spans: Vec<(f64, f64)> = rec
            .job("opp")
            .spans("iter")
            .map(|(s, e, _)| (s, e))
            .collect();
        metrics::ended_within(&spans, a, b) as f64 / (b - a)
    };
    let solo = run_policy(ctx, Policy::Exclusive, &s8_jobs(d, false, true), &[], false)
        .with_context(|| format!("S8 (cpus={tag}): production alone (the solo baseline)"))?;
    let (sa, sb) = window(&solo, 0.0)?;
    let solo_p99 = metrics::percentile(&latencies(&solo, sa, sb), 99.0)
        .ok_or_else(|| anyhow!("S8: no solo requests"))?;
    let (solo_rate, _) = production_in(solo.job("prod"), "request", sa, sb);
    let alone = ctx
        .bench
        .run(&RunSpec {
            jobs: s8_jobs(d, true, false),
            setup: Setup::Native,
            idle_containers: Vec::new(),
            sample_gates: false,
            env: ctx.env.to_vec(),
            daemon_args: Vec::new(),
            cpus: ctx.pin,
        })
        .with_context(|| format!("S8 (cpus={tag}): the training alone without the shim"))?;
    let (ta, tb) = window(&alone, 0.0)?;
    let alone_rate = train_rate(&alone, ta, tb);
    let sub = Ctx { policies, ..*ctx };
    for_policies(&sub, out, "S8", |p| {
        let rec = if p == Policy::Exclusive {
            solo.clone()
        } else {
            run_policy(ctx, p, &s8_jobs(d, true, true), &[], false)?
        };
        let (a, b) = window(&rec, 0.0)?;
        let lat = latencies(&rec, a, b);
        let p99 = metrics::percentile(&lat, 99.0);
        let (rate, _) = production_in(rec.job("prod"), "request", a, b);
        let mut m = row("S8", p);
        m.insert("production_ratio".into(), num(rate / solo_rate));
        m.insert("p99_ratio".into(), opt(p99.map(|x| x / solo_p99)));
        m.insert("daemon_cpu_pct".into(), opt(rec.daemon_cpu_pct()));
        m.insert("cpus".into(), tag.into());
        m.insert("p99_ms".into(), opt(p99));
        m.insert("solo_p99_ms".into(), num(solo_p99));
        m.insert("p50_ms".into(), opt(metrics::percentile(&lat, 50.0)));
        m.insert(
            "opportunistic_progress".into(),
            if p == Policy::Exclusive {
                Value::Null
            } else {
                num(train_rate(&rec, a, b) / alone_rate)
            },
        );
        let part = if cpus == Cpus::Shared {
            "shared-cpus"
        } else {
            ""
        };
        Ok((m, vec![(part.to_string(), rec)]))
    });
    Ok(())
}

/// S9's production inference: 40 requests/s of 4 ms of GPU time (2 kernels) for `secs`.
fn infer40(secs: f64) -> JobSpec {
    production_infer(&["--rate", "40", "--gpu-ms", "4"], secs)
}

/// S9's opportunistic processes: `n` saturating jobs (2 ms kernels, depth 4), the `i`th
/// started `1 + i × stagger` s late, all in container `opp` (`one`) or each in its own
/// (`opp0`, `opp1`, ...).
fn s9_opportunistic(n: usize, one: bool, stagger: f64, secs: f64) -> Vec<JobSpec> {
    (0..n)
        .map(|i| JobSpec {
            container: if one { "opp".into() } else { format!("opp{i}") },
            class: Class::Opportunistic,
            bin: "simjob-saturate",
            args: [
                "--kernel-ms",
                "2",
                "--depth",
                "4",
                "--report-interval",
                "100ms",
                "--duration",
            ]
            .iter()
            .map(|x| x.to_string())
            .chain([format!("{:.3}", secs - 1.0 - i as f64 * stagger)])
            .collect(),
            delay: 1.0 + i as f64 * stagger,
        })
        .collect()
}

/// S9's one-by-one starts: this long between two processes' starts.
const S9_STAGGER: f64 = 0.3;

/// The numbers of opportunistic processes S9 runs.
const S9_PROCESSES: [usize; 4] = [1, 2, 4, 8];

/// S9, a multi-process opportunistic container: production inference (40 req/s, 4 ms of GPU
/// each) for 2 D beside N = 1, 2, 4, 8 saturating processes (2 ms kernels) in ONE opportunistic
/// container, and the same N in N containers. One row per policy, N and layout (`containers`);
/// `native` has no containers (one row per N). p99 ratio against production alone (one solo run).
fn s9(ctx: &Ctx<'_>, out: &mut Output) -> anyhow::Result<()> {
    let d = 2.0 * ctx.d;
    let Solo {
        rec: solo,
        window: (sa, sb),
        p99: solo_p99,
        rate: solo_rate,
    } = solo_latency(ctx, "S9", &infer40(d))?;
    for &p in ctx.policies {
        let layouts: &[bool] = match p {
            Policy::Exclusive => &[],
            Policy::Native => &[true],
            _ => &[true, false],
        };
        if p == Policy::Exclusive {
            let mut m = row("S9", p);
            m.insert("production_ratio".into(), num(1.0));
            m.insert("p99_ratio".into(), num(1.0));
            seconds_of(&mut m, &solo, (sa, sb), solo_p99);
            m.insert("p99_ms".into(), num(solo_p99));
            m.insert("solo_requests_per_s".into(), num(solo_rate));
            out.plot("S9", p, "", &solo);
            out.emit(m);
            continue;
        }
        // (processes, one container, stagger): at once in one container and in N, then one
        // by one in one container (issue 31: each start while production runs).
        let runs = S9_PROCESSES.iter().flat_map(|&n| {
            let at_once = layouts
                .iter()
                .filter(move |&&one| one || n > 1)
                .map(move |&one| (n, one, 0.0));
            let staggered = (n > 1 && layouts.contains(&true)).then_some((n, true, S9_STAGGER));
            at_once.chain(staggered)
        });
        for (n, one, stagger) in runs {
            let part = format!(
                "n{n}-{}{}",
                if one { "one" } else { "each" },
                if stagger > 0.0 { "-one-by-one" } else { "" }
            );
            let mut jobs = vec![infer40(d)];
            jobs.extend(s9_opportunistic(n, one, stagger, d));
            let res = (|| -> anyhow::Result<Map<String, Value>> {
                let rec = run_policy(ctx, p, &jobs, &[], false)?;
                let containers = if p == Policy::Native {
                    Value::Null
                } else {
                    Value::from(if one { 1 } else { n })
                };
                let extra = [
                    ("processes", n.into()),
                    ("containers", containers),
                    ("stagger_s", stagger.into()),
                ];
                // From the first opportunistic start: every start is in the window.
                let (_, b) = window(&rec, 1.0)?;
                let a = rec
                    .jobs
                    .iter()
                    .filter(|j| j.class == Class::Opportunistic)
                    .map(JobRecord::start)
                    .fold(f64::MAX, f64::min);
                let m = latency_row_in(
                    "S9",
                    p,
                    &rec,
                    (solo_rate, solo_p99),
                    extra.into_iter(),
                    (a, b),
                )?;
                out.plot("S9", p, &part, &rec);
                Ok(m)
            })();
            match res {
                Ok(m) => out.emit(m),
                Err(e) => out.error("S9", p, &e.context(part)),
            }
        }
    }
    Ok(())
}

/// S10's production: 4 ms of GPU time per request (2 kernels), Poisson arrivals at these
/// fractions of what it can serve (1 request per 4 ms).
const S10_LOADS: [f64; 2] = [0.3, 0.6];
/// S10's opportunistic kernels: (ms, `simjob-saturate --op`): one-block spin kernels (`kernel`:
/// no slicing can cut them) and 10 ms kernels of waves of blocks loaded as PTX (`blocks`: the
/// shim cuts them into block ranges of about the budget while production is present).
const S10_KERNELS: [(&str, &str); 4] = [
    ("0.5", "kernel"),
    ("2", "kernel"),
    ("10", "kernel"),
    ("10", "blocks"),
];
/// The latency budgets libshare's rows run under, the default first: every kernel under the
/// first two (a budget at or above the kernel, and one below it for the shorter kernels), the
/// 10 ms kernels under 10ms too (the budget at the kernel: it goes whole), the kernels that can
/// be cut under 250us too (the trade-off: kernels longer than the budget go only alone, or cut
/// into ranges of about the budget).
const S10_BUDGETS: [&str; 4] = ["2ms", "500us", "10ms", "250us"];

/// S10, open-loop production (issue 31): requests arrive as users send them (a Poisson process,
/// seeded: every run replays the same times), which no arrival model predicts, at 30 % and 60 %
/// of production's capacity, beside one opportunistic saturating job of 0.5, 2 or 10 ms kernels
/// ([`S10_KERNELS`], 4 deep) started 1 s in; libshare's rows under [`S10_BUDGETS`]. p99 against
/// production alone at the same load (same seed), for 2 D.
fn s10(ctx: &Ctx<'_>, out: &mut Output) -> anyhow::Result<()> {
    let d = 2.0 * ctx.d;
    for load in S10_LOADS {
        let rate = format!("{:.1}", load * 1_000.0 / 4.0);
        let prod = production_infer(
            &[
                "--rate",
                &rate,
                "--gpu-ms",
                "4",
                "--arrivals",
                "poisson",
                "--seed",
                "1",
            ],
            d,
        );
        let Solo {
            rec: solo,
            window: (sa, sb),
            p99: solo_p99,
            rate: solo_rate,
        } = solo_latency(ctx, "S10", &prod)?;
        for &p in ctx.policies {
            if p == Policy::Exclusive {
                let mut m = row("S10", p);
                m.insert("load".into(), num(load));
                m.insert("production_ratio".into(), num(1.0));
                m.insert("p99_ratio".into(), num(1.0));
                seconds_of(&mut m, &solo, (sa, sb), solo_p99);
                m.insert("p99_ms".into(), num(solo_p99));
                m.insert("solo_requests_per_s".into(), num(solo_rate));
                out.emit(m);
                continue;
            }
            for (k, op) in S10_KERNELS {
                let budgets: &[&str] = match (p, k, op) {
                    (Policy::Libshare, _, "blocks") => &S10_BUDGETS,
                    (Policy::Libshare, "10", _) => &S10_BUDGETS[..3],
                    (Policy::Libshare, ..) => &S10_BUDGETS[..2],
                    _ => &[""],
                };
                for &budget in budgets {
                    let mut opp = saturate_ms("opp", k, 4, d - 1.0, 1.0);
                    opp.args.extend(["--op".into(), op.into()]);
                    let jobs = [prod.clone(), opp];
                    let args: Vec<String> = if budget.is_empty() {
                        Vec::new()
                    } else {
                        vec!["--latency-budget".into(), budget.into()]
                    };
                    let part = format!("load{load}-k{k}ms{op}{budget}");
                    let res = (|| -> anyhow::Result<Map<String, Value>> {
                        let rec = run_policy_with(ctx, p, &jobs, &[], false, &args)?;
                        let mut extra = vec![
                            ("load", num(load)),
                            (
                                "kernel_ms",
                                k.parse::<f64>().map(num).unwrap_or(Value::Null),
                            ),
                            ("kernel", op.into()),
                        ];
                        if !budget.is_empty() {
                            extra.push(("latency_budget", budget.into()));
                        }
                        let m =
                            latency_row("S10", p, &rec, (solo_rate, solo_p99), extra.into_iter())?;
                        out.plot("S10", p, &part, &rec);
                        Ok(m)
                    })();
                    match res {
                        Ok(m) => out.emit(m),
                        Err(e) => out.error("S10", p, &e.context(part)),
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        a: BenchArgs,
    }

    fn parse(args: &[&str]) -> Result<BenchArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied())).map(|c| c.a)
    }

    #[test]
    fn args() {
        let a = parse(&["S1"]).unwrap();
        assert_eq!(a.scenario, ScenarioArg::S1);
        assert_eq!(a.duration, 6.0);
        assert!(!a.json && !a.markdown && a.policy.is_empty());
        let a = parse(&[
            "all",
            "--json",
            "--duration",
            "3",
            "--policy",
            "native,libshare",
        ])
        .unwrap();
        assert_eq!(a.scenario, ScenarioArg::All);
        assert_eq!(a.policy, vec![Policy::Native, Policy::Libshare]);
        assert_eq!(parse(&["S9"]).unwrap().scenario, ScenarioArg::S9);
        assert_eq!(parse(&["S4"]).unwrap().scenario, ScenarioArg::S4);
        assert_eq!(
            parse(&["S3"]).unwrap().ops,
            vec![S3Op::Kernel, S3Op::Memset, S3Op::Copy]
        );
        assert_eq!(
            parse(&["S3", "--ops", "memset"]).unwrap().ops,
            vec![S3Op::Memset]
        );
        assert!(parse(&["S3", "--ops", "fill"]).is_err());
        assert_eq!(parse(&["S5"]).unwrap().scenario, ScenarioArg::S5);
        assert_eq!(
            parse(&["S5", "--policy", "fixed-quantum"]).unwrap().policy,
            vec![Policy::FixedQuantum]
        );
        assert!(parse(&["S1", "--duration", "1"]).is_err());
        assert!(parse(&["S1", "--json", "--markdown"]).is_err());
        assert!(parse(&["S1", "--policy", "mps"]).is_err());
    }

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
        let (s3, s9) = (production_infer(S3_INFER, 2.0), infer40(1.5));
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
            S6_LIGHT.args().join(" "),
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
