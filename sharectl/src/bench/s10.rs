//! S10, open-loop production (Poisson arrivals) beside kernels of several lengths.

use super::latency::{latency_row, seconds_of, solo_latency, Solo};
use super::{
    num, production_infer, row, run_policy_with, saturate_ms, Ctx, Output, Policy, S10Kernel,
};
use libshare_node::policy::LatencyBudget;
use serde_json::{Map, Value};

/// S10's production: 4 ms of GPU time per request (2 kernels), Poisson arrivals at these
/// fractions of what it can serve (1 request per 4 ms).
const S10_LOADS: [f64; 2] = [0.3, 0.6];
/// S10's opportunistic kernels: (ms, `simjob-saturate --op`): one-block spin kernels (`kernel`:
/// no slicing can cut them) and 10 ms kernels of waves of blocks loaded as PTX (`blocks`: the
/// shim cuts them into block ranges of about half the budget while production is present).
const S10_KERNELS: [(S10Kernel, &str, &str); 4] = [
    (S10Kernel::Short, "0.5", "kernel"),
    (S10Kernel::Medium, "2", "kernel"),
    (S10Kernel::Long, "10", "kernel"),
    (S10Kernel::Blocks, "10", "blocks"),
];
/// The latency budgets libshare's rows run under, the default first: every kernel under the
/// first two (a budget at or above the kernel, and one below it for the shorter kernels), the
/// 10 ms kernels under 10ms too (the budget at the kernel: it goes whole), the kernels that can
/// be cut under 250us and 200us too (the trade-off: kernels longer than the budget go only
/// alone, or cut into ranges of about half the budget).
const S10_BUDGETS: [&str; 5] = ["2ms", "500us", "10ms", "250us", "200us"];

/// S10, open-loop production (issue 31): requests arrive as users send them (a Poisson process,
/// seeded: every run replays the same times), which no arrival model predicts, at 30 % and 60 %
/// of production's capacity, beside one opportunistic saturating job of 0.5, 2 or 10 ms kernels
/// ([`S10_KERNELS`], 4 deep) started 1 s in; libshare's rows under [`S10_BUDGETS`]. p99 against
/// production alone at the same load (same seed), for 2 D. Only `kernels` run; with `budget`
/// (`--latency-budget`) libshare's rows run under it alone.
pub(super) fn s10(
    ctx: &Ctx<'_>,
    out: &mut Output,
    kernels: &[S10Kernel],
    budget: Option<LatencyBudget>,
) -> anyhow::Result<()> {
    let d = 2.0 * ctx.d;
    let given = budget.map(|b| b.to_string());
    let given: Vec<&str> = given.iter().map(String::as_str).collect();
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
        } = solo_latency(ctx, "S10", &prod, 1.0)?;
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
            for (_, k, op) in S10_KERNELS
                .into_iter()
                .filter(|(s, ..)| kernels.contains(s))
            {
                let budgets: &[&str] = match (p, k, op) {
                    (Policy::Libshare, ..) if !given.is_empty() => &given,
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
