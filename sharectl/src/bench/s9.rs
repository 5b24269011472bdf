//! S9, a multi-process opportunistic container beside production inference.

use super::exec::{Class, Cpus, JobRecord, JobSpec};
use super::latency::{latency_row_in, seconds_of, solo_latency, Solo};
use super::{
    by_layout, num, production_infer, row, run_policy, window, CpuLayout, Ctx, Output, Policy,
};
use serde_json::{Map, Value};

/// S9's production inference: 40 requests/s of 4 ms of GPU time (2 kernels) for `secs`.
pub(super) fn infer40(secs: f64) -> JobSpec {
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

/// S9, a multi-process opportunistic container: production inference (40 req/s, 4 ms of GPU
/// each) for 2 D beside N = 1, 2, 4, 8 saturating processes (2 ms kernels) in ONE opportunistic
/// container, and the same N in N containers (`processes`, `--s9-processes`). One row per
/// policy, N and layout (`containers`);
/// `native` has no containers (one row per N). p99 ratio against production alone (one solo run).
pub(super) fn s9(ctx: &Ctx<'_>, out: &mut Output, processes: &[u16]) -> anyhow::Result<()> {
    by_layout(ctx, out, CpuLayout::Shared, |ctx, out, cpus, policies| {
        s9_with(
            &Ctx {
                pin: cpus,
                policies,
                ..*ctx
            },
            out,
            processes,
        )
    })
}

fn s9_with(ctx: &Ctx<'_>, out: &mut Output, processes: &[u16]) -> anyhow::Result<()> {
    let d = 2.0 * ctx.d;
    let Solo {
        rec: solo,
        window: (sa, sb),
        p99: solo_p99,
        rate: solo_rate,
    } = solo_latency(ctx, "S9", &infer40(d), 1.0)?;
    for &p in ctx.policies {
        let layouts: &[bool] = match p {
            Policy::Exclusive => &[],
            Policy::Native => &[true],
            _ => &[true, false],
        };
        if p == Policy::Exclusive {
            let mut m = row("S9", p);
            m.insert("cpus".into(), ctx.pin.tag().into());
            m.insert("production_ratio".into(), num(1.0));
            m.insert("p99_ratio".into(), num(1.0));
            seconds_of(&mut m, &solo, (sa, sb), solo_p99);
            m.insert("p99_ms".into(), num(solo_p99));
            m.insert("solo_requests_per_s".into(), num(solo_rate));
            out.plot("S9", p, &shared_part(ctx, ""), &solo);
            out.emit(m);
            continue;
        }
        // (processes, one container, stagger): at once in one container and in N, then one
        // by one in one container (issue 31: each start while production runs).
        let runs = processes.iter().map(|&n| usize::from(n)).flat_map(|n| {
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
                    ("cpus", ctx.pin.tag().into()),
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
                out.plot("S9", p, &shared_part(ctx, &part), &rec);
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

/// A plot's part name: `part`, with `-shared-cpus` in the `shared` control layout.
fn shared_part(ctx: &Ctx<'_>, part: &str) -> String {
    match (ctx.pin, part) {
        (Cpus::Shared, "") => "shared-cpus".into(),
        (Cpus::Shared, _) => format!("{part}-shared-cpus"),
        _ => part.into(),
    }
}
