//! S2, surge: production alternates busy and idle phases beside a saturating opportunistic job.

use super::exec::JobRecord;
use super::{
    for_policies, metrics, num, opportunistic_in, opt, row, run_policy, saturate, train, Ctx,
    Output, Policy,
};
use anyhow::{anyhow, Context};
use jobs::profiles::TRAIN;

/// S2, surge: production alternates busy and idle phases (BUSY:IDLE = P:P, five phases, starting
/// busy) next to a saturating opportunistic job.
pub(super) fn s2(ctx: &Ctx<'_>, out: &mut Output) -> anyhow::Result<()> {
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
