//! What the latency scenarios (S3, S8, S9, S10) share: production's request latencies, its solo
//! baseline and the row of a run against it.

use super::exec::{Class, JobSpec, RunRecord};
use super::{
    metrics, num, opportunistic_in, opt, production_in, row, run_policy, window, Ctx, Policy,
};
use anyhow::{anyhow, Context};
use serde_json::{Map, Value};

/// The latencies (ms) of production's requests (container `prod`) that started in `[a, b]`.
pub(super) fn latencies(rec: &RunRecord, a: f64, b: f64) -> Vec<f64> {
    rec.job("prod")
        .spans("request")
        .filter(|(s, _, _)| *s >= a && *s <= b)
        .filter_map(|(_, _, v)| v["latency_ms"].as_f64())
        .collect()
}

/// The GPU side of production's requests that started in `[a, b]` (ms): from a request's input
/// on the GPU to its last kernel's end, timed by the job's events (`simjob-infer --trace`'s
/// `gpu_ms`): what it met on the GPU, without its host's part (a late wake-up, slow calls).
fn gpu_times(rec: &RunRecord, a: f64, b: f64) -> Vec<f64> {
    rec.job("prod")
        .spans("request")
        .filter(|(s, _, _)| *s >= a && *s <= b)
        .filter_map(|(_, _, v)| v["gpu_ms"].as_f64())
        .collect()
}

/// Production inference alone, the solo baseline of a latency scenario (S3, S8, S9, S10): the
/// run, its window (from `from` s in), its p99 (ms) and its requests/s.
pub(super) struct Solo {
    pub(super) rec: RunRecord,
    pub(super) window: (f64, f64),
    pub(super) p99: f64,
    pub(super) rate: f64,
}

pub(super) fn solo_latency(
    ctx: &Ctx<'_>,
    scenario: &str,
    prod: &JobSpec,
    from: f64,
) -> anyhow::Result<Solo> {
    let rec = run_policy(
        ctx,
        Policy::Exclusive,
        std::slice::from_ref(prod),
        &[],
        false,
    )
    .with_context(|| format!("{scenario}: production alone (the solo baseline)"))?;
    let (a, b) = window(&rec, from)?;
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
pub(super) fn latency_row(
    scenario: &str,
    p: Policy,
    rec: &RunRecord,
    solo: (f64, f64),
    extra: impl Iterator<Item = (&'static str, Value)>,
) -> anyhow::Result<Map<String, Value>> {
    let (a, b) = window(rec, 1.0)?;
    latency_row_in(scenario, p, rec, solo, extra, (a, b))
}

/// The p99 of `of`'s values for the requests due in each whole second of `[a, b)`, ms (issue
/// 31: a start that stalls production for one second hides in the run's p99). JSON only.
fn p99_by_second(
    rec: &RunRecord,
    a: f64,
    b: f64,
    of: fn(&RunRecord, f64, f64) -> Vec<f64>,
) -> Vec<f64> {
    let seconds = ((b - a) + 1e-9).floor().max(0.0) as usize;
    (0..seconds)
        .filter_map(|i| {
            let s = a + i as f64;
            metrics::percentile(&of(rec, s, s + 1.0), 99.0)
        })
        .collect()
}

/// A row's worst second: each whole second's p99 of the requests due in `[a, b)` against
/// `p99` (solo's; for a solo row, its own: the noise floor of `worst_second_p99_ratio`), and
/// each second's p99 of their GPU side ([`gpu_times`], `worst_second_gpu_p99_ms`: a second made
/// slow by the host waking production late, which the solo run has too, is slow in latency
/// only; compare it with the solo row's).
pub(super) fn seconds_of(
    m: &mut Map<String, Value>,
    rec: &RunRecord,
    (a, b): (f64, f64),
    p99: f64,
) {
    let by_second = p99_by_second(rec, a, b, latencies);
    let worst = by_second.iter().copied().reduce(f64::max);
    m.insert("worst_second_p99_ratio".into(), opt(worst.map(|x| x / p99)));
    m.insert(
        "p99_by_second_ms".into(),
        by_second.iter().map(|&x| num(x)).collect(),
    );
    let gpu = p99_by_second(rec, a, b, gpu_times);
    m.insert(
        "worst_second_gpu_p99_ms".into(),
        opt(gpu.iter().copied().reduce(f64::max)),
    );
    m.insert(
        "gpu_p99_by_second_ms".into(),
        gpu.iter().map(|&x| num(x)).collect(),
    );
}

/// [`latency_row`] over the window `(a, b)` of the run's axis.
pub(super) fn latency_row_in(
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
