//! S8, PyTorch pair: production PyTorch inference beside opportunistic PyTorch training.

use super::exec::{Class, Cpus, JobSpec, RunRecord, RunSpec, Setup};
use super::latency::{latencies, solo_latency, Solo};
use super::python;
use super::{
    by_layout, for_policies, metrics, num, opt, production_in, row, run_policy, window, CpuLayout,
    Ctx, Output, Policy,
};
use anyhow::Context;
use serde_json::Value;

/// S8's simgpu cost model: one wave of thread blocks costs 200 µs, so PyTorch's jobs are
/// GPU-bound as on a real GPU (simgpu's default runs a GEMM ~100× faster than an A100).
/// `SIMGPU_WAVE` in sharectl's environment overrides it.
const S8_WAVE: &str = "200us";
/// Seconds S8's Python jobs get to import torch and warm up before the measured interval.
const S8_SETUP: f64 = 25.0;

/// S8's jobs: production PyTorch inference (an 8-layer MLP at 40 requests/s) and, with `opp`,
/// opportunistic PyTorch training of a similar MLP; both warm up until an agreed wall-clock
/// time, then run for `secs`.
fn s8_jobs(secs: f64, opp: bool, prod: bool, (batch, width): (u32, u32)) -> Vec<JobSpec> {
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
            args: common(&[
                "--layers",
                "4",
                "--batch",
                &batch.to_string(),
                "--width",
                &width.to_string(),
            ]),
            delay: 0.0,
        });
    }
    jobs
}

/// The environment S8's jobs add: simgpu's cost model.
pub(super) fn s8_env() -> Vec<(String, std::ffi::OsString)> {
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
pub(super) fn s8(ctx: &Ctx<'_>, out: &mut Output) -> anyhow::Result<()> {
    if let Err(why) = python::check_torch(&ctx.bench.python) {
        out.skip("S8", &why);
        return Ok(());
    }
    by_layout(ctx, out, CpuLayout::Both, s8_with)
}

fn s8_with(ctx: &Ctx<'_>, out: &mut Output, cpus: Cpus, policies: &[Policy]) -> anyhow::Result<()> {
    let ctx = &Ctx { pin: cpus, ..*ctx };
    let d = 2.0 * ctx.d;
    let tag = cpus.tag();
    let train_rate = |rec: &RunRecord, a: f64, b: f64| -> f64 {
        let spans: Vec<(f64, f64)> = rec
            .job("opp")
            .spans("iter")
            .map(|(s, e, _)| (s, e))
            .collect();
        metrics::ended_within(&spans, a, b) as f64 / (b - a)
    };
    let prod = s8_jobs(d, false, true, ctx.s8_training).remove(0);
    let Solo {
        rec: solo,
        p99: solo_p99,
        rate: solo_rate,
        ..
    } = solo_latency(ctx, &format!("S8 (cpus={tag})"), &prod, 0.0)?;
    let alone = ctx
        .bench
        .run(&RunSpec {
            jobs: s8_jobs(d, true, false, ctx.s8_training),
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
            run_policy(ctx, p, &s8_jobs(d, true, true, ctx.s8_training), &[], false)?
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
        let (batch, width) = ctx.s8_training;
        m.insert(
            "training".into(),
            format!("batch {batch} width {width}").into(),
        );
        if p == Policy::Libshare && ctx.daemon_args.len() == 2 {
            m.insert("latency_budget".into(), ctx.daemon_args[1].clone().into());
        }
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
