//! S5, thrash (issue 20, design §7): two opportunistic training jobs, each with a working set of
//! 70 % of the device, which do not fit together. Policies: `serial` (one after the other, each
//! alone with device memory: the time to beat), `native` (both at once with managed memory, no
//! shim: demand paging thrashes), `fixed-quantum` (libshare's exclusive turns with nvshare's
//! fixed quantum, 30 s of a ~1400 s job scaled to this run's job) and `libshare` (turns whose
//! quantum adapts to the measured cost of a switch). The figure is `serial_ratio`: the time until
//! both completed against `serial`.
//!
//! The job (`simjob-train`): `--iters` iterations of a GPU phase (kernels over the whole working
//! set, in 4 buffers) and a CPU phase of the same length (a host sleep), as nvshare's `big_50`
//! (ResNet152 training spending ~50 % of its time on the CPU, thesis Table 12.2), which is what
//! lets two jobs co-run faster than serially: one computes while the other is on the CPU.

use super::exec::{Class, JobSpec, RunRecord, RunSpec, Setup};
use super::s4::mib;
use super::{num, opt, row, Ctx, Output, Policy};
use anyhow::Context;
use std::path::Path;

/// simgpu's device for S5.
const SIM_DEVICE: u64 = 2 << 30;
/// GPU and CPU phase of an iteration, ms.
const PHASE_MS: u64 = 1_000;
/// Kernels per GPU phase (10 ms each: the working set's 4 buffers touched 25 times each).
const KERNELS: u32 = 100;
/// nvshare's quantum and the length of the job it was measured with (thesis: big_50, 1383 s).
const NVSHARE_QUANTUM_S: f64 = 30.0;
const NVSHARE_JOB_S: f64 = 1400.0;

fn job(name: &str, mem: u64, iters: u64, managed: bool, barrier: Option<&Path>) -> JobSpec {
    let mut args: Vec<String> = vec![
        "--gpu-ms".into(),
        PHASE_MS.to_string(),
        "--kernels".into(),
        KERNELS.to_string(),
        "--cpu-ms".into(),
        PHASE_MS.to_string(),
        "--pieces".into(),
        "4".into(),
        "--mem".into(),
        mib(mem),
        "--iters".into(),
        iters.to_string(),
        "--trace".into(),
        "--report-interval".into(),
        "500ms".into(),
    ];
    if managed {
        args.push("--managed".into());
    }
    if let Some(dir) = barrier {
        args.extend(["--barrier".into(), dir.display().to_string()]);
        args.extend(["--parties".into(), "2".into()]);
    }
    JobSpec {
        container: name.into(),
        class: Class::Opportunistic,
        bin: "simjob-train",
        args,
        delay: 0.0,
    }
}

/// The policies S5 runs: serial always (the reference), the others as asked (all by default).
fn policies(ctx: &Ctx<'_>) -> Vec<Policy> {
    let default = ctx.policies.len() == 5;
    [Policy::Native, Policy::FixedQuantum, Policy::Libshare]
        .into_iter()
        .filter(|p| default || ctx.policies.contains(p))
        .collect()
}

/// One run: `jobs` under `p` on a fresh simulated device; with turns, the daemon's metrics
/// textfile (switches, quantum) is read back.
fn run(
    ctx: &Ctx<'_>,
    p: Policy,
    jobs: Vec<JobSpec>,
    device: u64,
    fixed_quantum_s: f64,
) -> anyhow::Result<(RunRecord, Option<String>)> {
    let (_sim, env) = super::s4::fresh_device(ctx, device)?;
    let metrics = crate::platform::StateDir::create()?;
    let textfile = metrics.path().join("metrics.prom");
    let (setup, daemon_args) = match p {
        Policy::Native | Policy::Serial => (Setup::Native, Vec::new()),
        _ => {
            let set = jobs
                .iter()
                .map(|j| {
                    let a = vec!["--oversubscribe".into(), "--memory".into(), mib(2 * device)];
                    (j.container.clone(), a)
                })
                .collect();
            let mut args = vec![
                "--metrics-textfile".into(),
                textfile.display().to_string(),
                "--metrics-interval".into(),
                "100ms".into(),
            ];
            if p == Policy::FixedQuantum {
                args.extend([
                    "--turn-quantum".into(),
                    format!("{}ms", (fixed_quantum_s * 1e3).round().max(1.0)),
                ]);
            }
            let setup = Setup::Shared {
                policy: "libshare",
                set,
                all_opportunistic: false,
            };
            (setup, args)
        }
    };
    // The daemon reads the device's memory through NVML, as on a GPU node.
    let mut daemon_env = ctx.bench.gpu.job_env();
    daemon_env.extend(env.iter().cloned());
    let rec = ctx.bench.run_daemon_env(
        &RunSpec {
            jobs,
            setup,
            idle_containers: Vec::new(),
            sample_gates: false,
            env,
            daemon_args,
            cpus: ctx.pin,
        },
        &daemon_env,
    )?;
    Ok((rec, std::fs::read_to_string(&textfile).ok()))
}

/// A metric's value in a Prometheus text exposition (the first sample of `name`).
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// From the first job's loop beginning (after its allocation: CUDA start-up is not the
/// scenario's subject) to the last one's end, seconds.
fn makespan(rec: &RunRecord) -> f64 {
    let end = rec.jobs.iter().map(|j| j.end()).fold(0.0, f64::max);
    let start = rec.jobs.iter().map(|j| j.start()).fold(f64::MAX, f64::min);
    end - start
}

pub(super) fn s5(ctx: &Ctx<'_>, out: &mut Output) -> anyhow::Result<()> {
    let device = if ctx.bench.gpu.is_sim() {
        SIM_DEVICE
    } else {
        libshare_node::nvml::device_totals()
            .map_err(|e| anyhow::anyhow!("S5: {e}"))?
            .first()
            .copied()
            .context("S5: no device")?
    };
    let mem = device / 10 * 7;
    // Iterations of 2 × PHASE_MS: a job alone takes about --duration.
    let iters = ((ctx.d * 1e3 / (2 * PHASE_MS) as f64).round() as u64).max(2);
    let names = ["a", "b"];
    // Serial: each job alone, with device memory (the stock job, no shim).
    let mut serial = 0.0;
    let mut solo = Vec::new();
    for n in names {
        let (rec, _) = run(
            ctx,
            Policy::Serial,
            vec![job(n, mem, iters, false, None)],
            device,
            0.0,
        )
        .with_context(|| format!("S5: job {n} alone (the serial baseline)"))?;
        serial += makespan(&rec);
        solo.push(rec);
    }
    let solo_s = serial / 2.0;
    let fixed_quantum_s = NVSHARE_QUANTUM_S / NVSHARE_JOB_S * solo_s;
    let mut m = row("S5", Policy::Serial);
    m.insert("serial_ratio".into(), num(1.0));
    m.insert("makespan_s".into(), num(serial));
    m.insert("serial_s".into(), num(serial));
    m.insert("solo_s".into(), num(solo_s));
    m.insert("device_mib".into(), (device >> 20).into());
    m.insert("working_set_mib".into(), (mem >> 20).into());
    m.insert("iters".into(), iters.into());
    out.plot("S5", Policy::Serial, "a", &solo[0]);
    out.emit(m);
    for p in policies(ctx) {
        let managed = p == Policy::Native;
        // Started together (the jobs' loops begin within a millisecond of each other, once both
        // have allocated, however long that took): the daemon sees both, and a co-run without
        // the shim is two GPU phases at once, not phases that happen to alternate.
        let barrier = crate::platform::StateDir::create()?;
        let jobs = names
            .iter()
            .map(|n| job(n, mem, iters, managed, Some(barrier.path())))
            .collect();
        let (rec, metrics) = match run(ctx, p, jobs, device, fixed_quantum_s) {
            Ok(r) => r,
            Err(e) => {
                out.error("S5", p, &e);
                continue;
            }
        };
        let mut m = row("S5", p);
        let span = makespan(&rec);
        m.insert("serial_ratio".into(), num(span / serial));
        m.insert("makespan_s".into(), num(span));
        m.insert("serial_s".into(), num(serial));
        let start = rec.jobs.iter().map(|j| j.start()).fold(f64::MAX, f64::min);
        for j in &rec.jobs {
            m.insert(format!("{}_s", j.container), num(j.end() - start));
        }
        if let Some(t) = metrics.as_deref() {
            let get = |k: &str| metric(t, &format!("libshare_daemon_{k}"));
            m.insert("switches".into(), opt(get("turn_switches_total")));
            m.insert(
                "quantum_ms".into(),
                opt(get("turn_quantum_seconds").map(|s| s * 1e3)),
            );
            m.insert(
                "switch_cost_ms".into(),
                opt(get("turn_switch_cost_seconds").map(|s| s * 1e3)),
            );
        }
        if p == Policy::FixedQuantum {
            m.insert("fixed_quantum_ms".into(), num(fixed_quantum_s * 1e3));
        }
        m.insert("daemon_cpu_pct".into(), opt(rec.daemon_cpu_pct()));
        out.plot("S5", p, "", &rec);
        out.emit(m);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_metric_from_the_textfile() {
        let t = "# HELP libshare_daemon_turn_switches Switches\n\
                 libshare_daemon_turn_switches_total 7\n\
                 libshare_daemon_turn_quantum_seconds 2.5\n";
        assert_eq!(metric(t, "libshare_daemon_turn_switches_total"), Some(7.0));
        assert_eq!(metric(t, "libshare_daemon_turn_quantum_seconds"), Some(2.5));
        assert_eq!(metric(t, "libshare_daemon_turn"), None);
    }
}
