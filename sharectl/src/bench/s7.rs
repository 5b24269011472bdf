//! S7, static share: caps and weights of opportunistic containers.

use super::exec::{JobRecord, RunRecord, RunSpec, Setup};
use super::{
    for_policies, metrics, num, opportunistic_in, opt, row, saturate, window, Ctx, Output, Policy,
};
use anyhow::{bail, Context};

/// S7, static share: an opportunistic saturating container capped at 30 % alone; two weighted
/// 1:3 alone; and one uncapped alone under the shim and daemon vs without the shim.
pub(super) fn s7(ctx: &Ctx<'_>, out: &mut Output) -> anyhow::Result<()> {
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
