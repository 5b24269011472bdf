//! S1, co-training: production training (~60 % of the GPU) beside a saturating opportunistic job.

use super::{
    for_policies, metrics, num, opportunistic_in, opt, production_in, row, run_policy, saturate,
    train, window, Ctx, Output, Policy,
};
use anyhow::Context;
use jobs::profiles::TRAIN;

/// S1, co-training: production training (~60 % of the GPU) + a saturating opportunistic job
/// started 1 s later.
pub(super) fn s1(ctx: &Ctx<'_>, out: &mut Output) -> anyhow::Result<()> {
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
