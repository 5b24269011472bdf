//! S6, scale: 32 registered containers, 8 of them active.

use super::exec::{Class, RunRecord};
use super::{
    for_policies, metrics, num, opportunistic_in, opt, production_in, row, run_policy, saturate,
    train, window, Ctx, Output, Policy,
};
use anyhow::Context;
use jobs::profiles::Train;
use serde_json::Value;

/// S6's production trainers: ~30 % of the GPU each.
pub(super) const S6_LIGHT: Train = Train {
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
pub(super) fn s6(ctx: &Ctx<'_>, out: &mut Output) -> anyhow::Result<()> {
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
