//! S4, memory oversubscription (issue 20, design §7): production and opportunistic training
//! jobs whose working sets together are 125 % of the device (50 % + 75 %), the opportunistic one
//! holding the device when production starts. Policies: `exclusive` (production alone),
//! `native` (no shim: the opportunistic job's device memory leaves production short),
//! `hints-only` (the opportunistic job's allocations become managed memory with advice, as TGS
//! does, and production relies on the driver's eviction: the daemon runs `--no-demotion`) and
//! `libshare` (the demotion protocol). On simgpu each run has its own 2 GiB device.

use super::exec::{Class, JobSpec, RunRecord, RunSpec, Setup};
use super::{metrics, num, opt, production_in, row, window, Ctx, Output, Policy};
use anyhow::Context;
use jobs::profiles::{Train, TRAIN};
use std::ffi::OsString;

/// simgpu's device for S4 (small: simgpu backs device memory with host memory).
const SIM_DEVICE: u64 = 2 << 30;

/// Environment variables of a run's jobs.
pub(super) type JobEnv = Vec<(String, OsString)>;

pub(super) fn mib(bytes: u64) -> String {
    format!("{}MiB", bytes >> 20)
}

/// A fresh simulated device of `bytes` for one run (nothing left from the previous run): its
/// state directory (kept alive by the caller for the run) and the jobs' environment for it.
/// Nothing on a real GPU.
pub(super) fn fresh_device(
    ctx: &Ctx<'_>,
    bytes: u64,
) -> anyhow::Result<(Option<crate::platform::StateDir>, JobEnv)> {
    let sim = if ctx.bench.gpu.is_sim() {
        Some(crate::platform::StateDir::create()?)
    } else {
        None
    };
    let env = sim
        .as_ref()
        .map(|s| {
            vec![
                ("SIMGPU_STATE_DIR".into(), s.path().into()),
                ("SIMGPU_MEMORY".into(), mib(bytes).into()),
            ]
        })
        .unwrap_or_default();
    Ok((sim, env))
}

/// A `simjob-train` job of S4: 6 ms of GPU per iteration (4 kernels) over `mem` in 8 buffers
/// (as a framework's allocator holds several segments: the protocol demotes whole
/// allocations), 4 ms on the host.
fn job(name: &str, class: Class, mem: u64, secs: f64, delay: f64) -> JobSpec {
    // The TRAIN profile's iteration, with S4's own memory (`--mem` below, not the profile's).
    let mut args = TRAIN.loop_args();
    args.extend([
        "--trace".into(),
        "--pieces".into(),
        "8".into(),
        "--mem".into(),
        mib(mem),
        "--duration".into(),
        format!("{secs:.3}"),
        "--report-interval".into(),
        "100ms".into(),
    ]);
    JobSpec {
        container: name.into(),
        class,
        bin: Train::BIN,
        args,
        delay,
    }
}

/// The policies S4 runs: those asked for, `hints-only` included by default.
fn policies(ctx: &Ctx<'_>) -> Vec<Policy> {
    let default = !ctx.policies.contains(&Policy::HintsOnly) && ctx.policies.len() == 5;
    [
        Policy::Exclusive,
        Policy::Native,
        Policy::HintsOnly,
        Policy::Libshare,
    ]
    .into_iter()
    .filter(|p| ctx.policies.contains(p) || (default && *p == Policy::HintsOnly))
    .collect()
}

fn run(ctx: &Ctx<'_>, p: Policy, jobs: &[JobSpec], device: u64) -> anyhow::Result<RunRecord> {
    let jobs: Vec<JobSpec> = jobs
        .iter()
        .filter(|j| p != Policy::Exclusive || j.class == Class::Production)
        .cloned()
        .collect();
    let (_sim, env) = fresh_device(ctx, device)?;
    let setup = match p {
        Policy::Exclusive | Policy::Native => Setup::Native,
        _ => Setup::Shared {
            policy: "libshare",
            set: vec![(
                "opp".into(),
                vec!["--oversubscribe".into(), "--memory".into(), mib(2 * device)],
            )],
            all_opportunistic: false,
        },
    };
    ctx.bench.run(&RunSpec {
        jobs,
        setup,
        idle_containers: Vec::new(),
        sample_gates: false,
        env,
        daemon_args: if p == Policy::HintsOnly {
            vec!["--no-demotion".into()]
        } else {
            Vec::new()
        },
        cpus: ctx.pin,
    })
}

/// Whether a run's error is production's allocation refused (the job's one line). The
/// opportunistic job allocates first, on an idle device that holds it, so an out-of-memory
/// error can only be production's.
fn production_oom(e: &anyhow::Error) -> bool {
    format!("{e:#}").contains("CUDA_ERROR_OUT_OF_MEMORY")
}

pub(super) fn s4(ctx: &Ctx<'_>, out: &mut Output) -> anyhow::Result<()> {
    let d = ctx.d;
    let device = if ctx.bench.gpu.is_sim() {
        SIM_DEVICE
    } else {
        libshare_node::nvml::device_totals()
            .map_err(|e| anyhow::anyhow!("S4: {e}"))?
            .first()
            .copied()
            .context("S4: no device")?
    };
    let (prod_mem, opp_mem) = (device / 2, device / 4 * 3);
    let jobs = vec![
        job("prod", Class::Production, prod_mem, d, 1.0),
        job("opp", Class::Opportunistic, opp_mem, d + 2.0, 0.0),
    ];
    let solo = run(ctx, Policy::Exclusive, &jobs, device)
        .context("S4: production alone (the solo baseline)")?;
    let (sa, sb) = window(&solo, 0.0)?;
    let (solo_rate, _) = production_in(solo.job("prod"), "iter", sa, sb);
    for p in policies(ctx) {
        let mut m = row("S4", p);
        m.insert("production_oom".into(), 0.into());
        let rec = if p == Policy::Exclusive {
            Ok(solo.clone())
        } else {
            run(ctx, p, &jobs, device)
        };
        let rec = match rec {
            Ok(r) => r,
            Err(e) if production_oom(&e) => {
                m.insert("production_oom".into(), 1.into());
                m.insert("production_ratio".into(), num(0.0));
                m.insert("note".into(), format!("{e:#}").into());
                out.emit(m);
                continue;
            }
            Err(e) => {
                out.error("S4", p, &e);
                continue;
            }
        };
        let prod = rec.job("prod");
        // Production's whole run, its allocation included.
        let (a, b) = (prod.start(), prod.end());
        let (rate, _) = production_in(prod, "iter", a, b);
        m.insert("production_ratio".into(), num(rate / solo_rate));
        m.insert("production_iters_per_s".into(), num(rate));
        m.insert("solo_iters_per_s".into(), num(solo_rate));
        // Production's start line comes after its allocation and memset: the extra start-up
        // beside the opportunistic job, against alone (same planned start).
        m.insert(
            "production_startup_extra_ms".into(),
            num((prod.start() - solo.job("prod").start()) * 1e3),
        );
        if let Some(o) = rec.jobs.iter().find(|j| j.container == "opp") {
            let spans: Vec<(f64, f64)> = o.spans("iter").map(|(s, e, _)| (s, e)).collect();
            let n = metrics::ended_within(&spans, a, b) as f64;
            m.insert("opportunistic_iters_per_s".into(), num(n / (b - a)));
        }
        m.insert("daemon_cpu_pct".into(), opt(rec.daemon_cpu_pct()));
        m.insert("device_mib".into(), (device >> 20).into());
        m.insert("window_s".into(), num(b - a));
        out.plot("S4", p, "", &rec);
        out.emit(m);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// S4's job runs the argv written by hand before it came from `jobs::profiles`.
    #[test]
    fn job_runs_the_argv_it_always_ran() {
        let j = job("prod", Class::Production, 1 << 30, 2.0, 1.0);
        assert_eq!(j.bin, "simjob-train");
        assert_eq!(
            j.args.join(" "),
            "--gpu-ms 6 --kernels 4 --cpu-ms 4 --trace --pieces 8 --mem 1024MiB --duration 2.000 --report-interval 100ms"
        );
    }
}
