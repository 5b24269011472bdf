//! The checks of [`super::PLAN`] that measure: the gate and the sharing scenarios (`sharectl
//! bench`, on the GPU and on simgpu beside it), simgpu's calibration, M1/M2.

use super::calibrate::{self, Measured, SliceRun};
use super::checks::{first, side_name, Ctx};
use super::report::{Figure, Side, Status};
use super::runner::{self, Finished};
use super::{figure, Outcome};
use anyhow::bail;
use serde_json::{json, Value};
use std::time::Instant;

impl Ctx {
    /// `sharectl bench SCENARIO --json` on `side`; None if `sharectl bench` cannot find the GPU
    /// (it looks for one with `nvidia-smi -L`).
    fn bench(
        &self,
        side: Side,
        scenario: &str,
        policies: &str,
        extra: &[&str],
        duration: f64,
        max_s: u64,
    ) -> anyhow::Result<Option<Finished>> {
        let on_simgpu = side == Side::Simgpu || self.opts.sim;
        if !on_simgpu && self.nvidia_smi.is_none() {
            return Ok(None);
        }
        let state = self.fresh(&format!("bench-{scenario}"))?;
        let mut cmd = self.command(&self.bundle.sharectl(), side, &state);
        cmd.args(["bench", scenario, "--json", "--policy", policies])
            .arg("--duration")
            .arg(duration.to_string())
            .arg("--shim")
            .arg(self.bundle.shim())
            .arg("--jobs-dir")
            .arg(self.bundle.jobs_dir());
        if on_simgpu {
            cmd.arg("--sim").arg("--simgpu-lib").arg(&self.simgpu_lib);
        }
        cmd.args(extra).env("TMPDIR", &state);
        let f = runner::run(cmd, self.limit(max_s))?;
        self.log(&format!("{scenario}-{}", side_name(side)), &f);
        if runner::stopped() {
            bail!("interrupted");
        }
        Ok(Some(f))
    }

    /// The bench's scenario on both sides: its rows, figures for `cols`, and a one-line
    /// outcome. The GPU side runs first; simgpu's only with time left.
    fn bench_both(
        &mut self,
        check: &'static str,
        policies: &str,
        extra: &[&str],
        duration: f64,
        cols: &[&str],
    ) -> anyhow::Result<(Vec<Value>, Outcome)> {
        let scenario = check;
        let half = self
            .step_deadline
            .saturating_duration_since(Instant::now())
            .as_secs()
            / 2;
        // --short (CI): only the gate's scenario runs on simgpu beside; the others once.
        let beside = !self.opts.short || check == "S1";
        let gpu_max = if beside { half.max(30) } else { 2 * half };
        let gpu = self.bench(Side::Gpu, scenario, policies, extra, duration, gpu_max)?;
        let rest = self
            .step_deadline
            .saturating_duration_since(Instant::now())
            .as_secs();
        let sim = if beside {
            self.bench(Side::Simgpu, scenario, policies, extra, duration, rest)?
        } else {
            None
        };
        let rows = |f: &Option<Finished>| -> Vec<Value> {
            f.as_ref()
                .map(|f| {
                    f.json()
                        .into_iter()
                        .filter(|v| v.get("scenario").is_some())
                        .collect()
                })
                .unwrap_or_default()
        };
        let (g, s) = (rows(&gpu), rows(&sim));
        self.figures.extend(bench_figures(check, &g, &s, cols));
        let errors: Vec<String> = g
            .iter()
            .chain(&s)
            .filter_map(|r| {
                r["error"]
                    .as_str()
                    .map(|e| format!("{} {}: {e}", r["policy"], r["scenario"]))
            })
            .collect();
        let describe = |f: &Option<Finished>, rows: &[Value], side: Side| match f {
            None if side == Side::Simgpu => "not run (--short)".to_string(),
            None => {
                "not run (sharectl bench finds a GPU through `nvidia-smi -L`, which listed none)"
                    .to_string()
            }
            Some(f) if f.status.is_none() => format!("{} rows before its deadline", rows.len()),
            Some(_) => format!("{} rows", rows.len()),
        };
        let detail = format!(
            "GPU: {}; simgpu: {}{}",
            describe(&gpu, &g, Side::Gpu),
            describe(&sim, &s, Side::Simgpu),
            if errors.is_empty() {
                String::new()
            } else {
                format!("; errors: {}", errors.join("; "))
            }
        );
        let status = if gpu.is_none() {
            Status::Unavailable
        } else if g.is_empty() || !errors.is_empty() {
            Status::Failed
        } else {
            Status::Measured
        };
        let data = json!({"gpu": g, "simgpu": s});
        Ok((g, Outcome::new(status, detail, data)))
    }

    /// A scenario's `--duration`: `long` seconds, 2 with --short.
    fn d(&self, long: f64) -> f64 {
        if self.opts.short {
            2.0
        } else {
            long
        }
    }
}

/// The rows of both sides as figures: one per row key (policy and part) and column.
fn bench_figures(check: &'static str, gpu: &[Value], sim: &[Value], cols: &[&str]) -> Vec<Figure> {
    let key = |r: &Value| {
        let mut k = r["policy"].as_str().unwrap_or("?").to_string();
        for part in ["op", "cpus", "processes", "containers"] {
            if let Some(v) = r.get(part).filter(|v| !v.is_null()) {
                k.push_str(&format!(" {part}={}", v.to_string().trim_matches('"')));
            }
        }
        k
    };
    let mut keys: Vec<String> = Vec::new();
    for r in gpu.iter().chain(sim) {
        let k = key(r);
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let find = |rows: &[Value], k: &str, col: &str| {
        rows.iter()
            .find(|r| key(r) == k)
            .and_then(|r| r[col].as_f64())
    };
    let mut out = Vec::new();
    for k in &keys {
        for &col in cols {
            let (g, s) = (find(gpu, k, col), find(sim, k, col));
            if g.is_some() || s.is_some() {
                out.push(figure(check, format!("{k}: {col}"), unit_of(col), g, s));
            }
        }
    }
    out
}

fn unit_of(col: &str) -> &'static str {
    if col.ends_with("_ms") {
        "ms"
    } else if col.ends_with("_pct") {
        "%"
    } else if col.ends_with("_per_s") {
        "/s"
    } else {
        "ratio"
    }
}

// ---- the gate and the benchmarks ----

/// The gate's bound: production's throughput beside the opportunistic job, of solo (the bound
/// `tests/tests/sharectl_bench.rs` holds S1 to on a loaded VM; BENCHMARKS.md has ~1.00 idle).
const GATE_BOUND: f64 = 0.85;

pub fn gate(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    // 3 s runs even with --short: the gate's bound is judged on them.
    let d = if ctx.opts.short { 3.0 } else { 4.0 };
    let (g, mut o) = ctx.bench_both(
        "S1",
        "exclusive,native,libshare",
        &[],
        d,
        &[
            "production_ratio",
            "opportunistic_harvest",
            "daemon_cpu_pct",
        ],
    )?;
    // The figures are S1's; the check is the gate's.
    for f in ctx.figures.iter_mut().filter(|f| f.check == "S1") {
        f.check = "gate";
    }
    if o.status != Status::Measured {
        return Ok(o);
    }
    let libshare = g.iter().find(|r| r["policy"] == "libshare");
    let (ratio, harvest) = (
        libshare.and_then(|r| r["production_ratio"].as_f64()),
        libshare.and_then(|r| r["opportunistic_harvest"].as_f64()),
    );
    let mut p = Vec::new();
    match ratio {
        Some(r) if r >= GATE_BOUND => {}
        r => p.push(format!(
            "production under libshare at {r:?} of solo (≥ {GATE_BOUND} expected)"
        )),
    }
    match harvest {
        Some(h) if h > 0.05 => {}
        h => p.push(format!(
            "the opportunistic job harvested {h:?} of the idle GPU (it did not progress)"
        )),
    }
    let detail = format!(
        "libshare: production {:.3} of solo, opportunistic harvest {:.3}; {}",
        ratio.unwrap_or(f64::NAN),
        harvest.unwrap_or(f64::NAN),
        o.detail
    );
    o = Outcome::judged(p, detail, o.data);
    Ok(o)
}

pub fn s3(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let d = ctx.d(3.0);
    let (_, o) = ctx.bench_both(
        "S3",
        "exclusive,native,libshare",
        &["--ops", "kernel"],
        d,
        &["p99_ratio", "p99_ms", "opportunistic_harvest"],
    )?;
    Ok(o)
}

pub fn s9(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    // 2 s: each of its 8-12 runs lasts twice that.
    let policies = if ctx.opts.short {
        "exclusive,libshare"
    } else {
        "exclusive,native,libshare"
    };
    let (_, o) = ctx.bench_both("S9", policies, &[], 2.0, &["p99_ratio", "p99_ms"])?;
    Ok(o)
}

pub fn s4(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    if !ctx.has_unified_memory() {
        return Ok(Outcome::new(
            Status::Unavailable,
            "no unified memory with GPU page faults on this GPU",
            Value::Null,
        ));
    }
    let policies = if ctx.opts.short {
        "exclusive,libshare"
    } else {
        "exclusive,native,hints-only,libshare"
    };
    let d = ctx.d(4.0);
    let (_, o) = ctx.bench_both(
        "S4",
        policies,
        &[],
        d,
        &[
            "production_ratio",
            "production_oom",
            "opportunistic_iters_per_s",
        ],
    )?;
    Ok(o)
}

pub fn s5(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    if !ctx.has_unified_memory() {
        return Ok(Outcome::new(
            Status::Unavailable,
            "no unified memory with GPU page faults on this GPU",
            Value::Null,
        ));
    }
    if ctx.opts.short {
        return Ok(Outcome::new(
            Status::NotRun,
            "--short: S5's jobs run ~10 s each under three policies; run without --short",
            Value::Null,
        ));
    }
    let policies = "native,fixed-quantum,libshare";
    let d = 3.0;
    let (_, o) = ctx.bench_both("S5", policies, &[], d, &["serial_ratio", "switch_cost_ms"])?;
    Ok(o)
}

// ---- calibration ----

/// Runs `gpu_probe ARGS` on both sides; returns their JSON lines (GPU, simgpu).
fn both(ctx: &Ctx, name: &str, args: &[&str]) -> anyhow::Result<(Vec<Value>, Vec<Value>)> {
    let mut out = Vec::new();
    for side in [Side::Gpu, Side::Simgpu] {
        let state = ctx.fresh(name)?;
        let f = ctx.probe(name, args, side, &state, None)?;
        if !f.ok() {
            bail!(
                "gpu_probe {} on {}: {}",
                args.join(" "),
                side_name(side),
                f.why()
            );
        }
        out.push(f.json());
    }
    let s = out.pop().unwrap_or_default();
    Ok((out.pop().unwrap_or_default(), s))
}

/// Which measurement a figure shows.
type Pick = fn(&Measured) -> Option<f64>;

/// `gpu_probe ARGS` on both sides, read into each side's measurements by `fill`; `figures`
/// (name, unit, which measurement) side by side, the first two in the one-line summary.
fn measure(
    ctx: &mut Ctx,
    name: &'static str,
    args: &[&str],
    fill: fn(&mut Measured, &[Value]),
    figures: &[(&str, &'static str, Pick)],
) -> anyhow::Result<Outcome> {
    let (g, s) = both(ctx, name, args)?;
    fill(&mut ctx.gpu, &g);
    fill(&mut ctx.sim, &s);
    for (what, unit, pick) in figures {
        let f = figure(name, *what, unit, pick(&ctx.gpu), pick(&ctx.sim));
        ctx.figures.push(f);
    }
    let show = |m: &Measured| {
        let shown: Vec<String> = figures
            .iter()
            .take(2)
            .map(|(what, unit, pick)| match pick(m) {
                Some(v) => format!("{what} {v:.2} {unit}"),
                None => format!("{what} ?"),
            })
            .collect();
        shown.join(", ")
    };
    let detail = format!("GPU: {}; simgpu: {}", show(&ctx.gpu), show(&ctx.sim));
    let data = json!({"gpu": g, "simgpu": s});
    Ok(Outcome::new(Status::Measured, detail, data))
}

pub fn cal_kernels(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    measure(
        ctx,
        "cal_kernels",
        &["kernels"],
        calibrate::kernels,
        &[
            ("empty kernel, fit: base", "us", |m| m.kernel_base_us),
            ("per wave", "us", |m| m.wave_us),
            ("empty kernel, one block", "us", |m| m.empty_us),
            ("empty kernels back to back, each", "us", |m| {
                m.back_to_back_us
            }),
            ("jobs' spin kernel: time over what it asked", "us", |m| {
                m.spin_overhead_us
            }),
        ],
    )
}

pub fn cal_copies(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    measure(
        ctx,
        "cal_copies",
        &["copies"],
        calibrate::copies,
        &[
            ("host to device, pinned", "GB/s", |m| m.h2d_gbs),
            ("device to device", "GB/s", |m| m.d2d_gbs),
            ("device to host, pinned", "GB/s", |m| m.d2h_gbs),
            ("host to device, pageable", "GB/s", |m| m.h2d_pageable_gbs),
            ("device to host, pageable", "GB/s", |m| m.d2h_pageable_gbs),
            ("memset", "GB/s", |m| m.memset_gbs),
            ("4 KiB pinned copy", "us", |m| m.copy_4k_us),
        ],
    )
}

/// Two `gpu_probe slices` processes started together on `side`.
fn two_slices(ctx: &Ctx, side: Side, secs: &str) -> anyhow::Result<Vec<Value>> {
    let state = ctx.fresh("slices")?;
    let mut procs = Vec::new();
    for _ in 0..2 {
        let mut cmd = ctx.command(&ctx.bundle.bin("gpu_probe"), side, &state);
        cmd.args(["slices", secs]);
        let mut r = runner::spawn(cmd)?;
        r.wait_line(ctx.limit(30), |l| l.contains("slices_ready"))?;
        procs.push(r);
    }
    for r in &mut procs {
        r.close_stdin();
    }
    let mut lines = Vec::new();
    for (i, r) in procs.into_iter().enumerate() {
        let f = r.finish(ctx.limit(30));
        ctx.log(&format!("cal_slices-{}-{i}", side_name(side)), &f);
        if !f.ok() {
            bail!("gpu_probe slices on {}: {}", side_name(side), f.why());
        }
        lines.extend(f.json().into_iter().filter(|v| v["check"] == "slices"));
    }
    Ok(lines)
}

pub fn cal_slices(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let secs = if ctx.opts.short { "0.6" } else { "1.5" };
    let mut data = serde_json::Map::new();
    for side in [Side::Gpu, Side::Simgpu] {
        let lines = two_slices(ctx, side, secs)?;
        let runs: Vec<SliceRun> = lines.iter().filter_map(SliceRun::parse).collect();
        let r = match runs.as_slice() {
            [a, b] => calibrate::slices(a, b),
            _ => None,
        };
        let m = match side {
            Side::Gpu => &mut ctx.gpu,
            Side::Simgpu => &mut ctx.sim,
        };
        m.slice_us = r.map(|r| r.0);
        m.switch_us = r.map(|r| r.1);
        let gaps: Vec<usize> = runs.iter().map(|r| r.gaps.len()).collect();
        data.insert(
            side_name(side).into(),
            json!({"gaps": gaps, "slice_us": m.slice_us, "switch_us": m.switch_us}),
        );
    }
    let (gm, sm) = (&ctx.gpu, &ctx.sim);
    ctx.figures.extend([
        figure(
            "cal_slices",
            "time one process holds the engine",
            "us",
            gm.slice_us,
            sm.slice_us,
        ),
        figure(
            "cal_slices",
            "switch between the two",
            "us",
            gm.switch_us,
            sm.switch_us,
        ),
    ]);
    let detail = match (gm.slice_us, gm.switch_us) {
        (Some(sl), Some(sw)) => format!(
            "slices of {sl:.0} us, switches of {sw:.1} us on the GPU; {:.0} / {:.1} on simgpu",
            sm.slice_us.unwrap_or(f64::NAN),
            sm.switch_us.unwrap_or(f64::NAN)
        ),
        _ => format!(
            "no alternation seen on the GPU (gaps {}): the two processes ran without time slices between them (MPS, or one finished first); nothing calibrated from it",
            data["gpu"]["gaps"]
        ),
    };
    Ok(Outcome::new(Status::Measured, detail, Value::Object(data)))
}

pub fn cal_managed(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    if !ctx.has_unified_memory() {
        return Ok(Outcome::new(
            Status::Unavailable,
            "no unified memory with GPU page faults on this GPU",
            Value::Null,
        ));
    }
    measure(
        ctx,
        "cal_managed",
        &["managed", "256"],
        calibrate::managed,
        &[
            (
                "fault-driven migration, per 2 MiB chunk of 256 MiB",
                "us",
                |m| m.fault_chunk_us,
            ),
            ("prefetch to the device", "GB/s", |m| m.prefetch_gbs),
            ("one 2 MiB chunk faulted in alone", "us", |m| m.fault_one_us),
            ("prefetch to the host", "GB/s", |m| m.prefetch_to_host_gbs),
        ],
    )
}

pub fn calibration(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let rows = calibrate::table(&ctx.gpu, &ctx.sim);
    let calibrated = rows.iter().filter(|r| r.calibrated.is_some()).count();
    ctx.calibration = rows.clone();
    if calibrated == 0 {
        return Ok(Outcome::new(
            Status::NotRun,
            "no measurement to calibrate with",
            Value::Null,
        ));
    }
    let header = format!(
        "simgpu calibrated by `sharectl gpu-check` against {} (driver {}, CUDA driver API {}){}.\nLoad it with SIMGPU_CONFIG=<this file>. Keys left out keep simgpu's defaults.",
        ctx.platform["name"].as_str().unwrap_or("?"),
        ctx.platform["driver_version"].as_str().unwrap_or("?"),
        ctx.platform["cuda_driver_version"],
        if ctx.opts.sim { " — a dry run: simgpu stood in for the GPU" } else { "" }
    );
    let text = calibrate::toml(&ctx.platform, &rows, &header);
    let file = ctx.out.join("simgpu-calibrated.toml");
    super::report::atomic_write(&file, text.as_bytes())?;
    ctx.calibration_file = Some("simgpu-calibrated.toml".into());
    // simgpu loads it: the device it then reports is the GPU.
    let state = ctx.fresh("calibrated")?;
    let mut cmd = ctx.command(&ctx.bundle.bin("gpu_probe"), Side::Simgpu, &state);
    cmd.arg("info").env("SIMGPU_CONFIG", &file);
    let f = runner::run(cmd, ctx.limit(20))?;
    ctx.log("calibration-load", &f);
    let name = first(&f.json(), "info").and_then(|v| v["name"].as_str().map(str::to_string));
    let mut p = Vec::new();
    if !f.ok() || name.as_deref() != ctx.platform["name"].as_str() {
        p.push(format!(
            "simgpu did not load the calibration file: {}",
            f.why()
        ));
    }
    Ok(Outcome::judged(
        p,
        format!(
            "{calibrated} of {} keys calibrated; simgpu loads the file and reports {}",
            rows.len(),
            name.unwrap_or_default()
        ),
        json!({"file": text}),
    ))
}

pub fn m1m2_driver(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let n = if ctx.opts.short { "12800" } else { "51200" };
    let shim = ctx.bundle.shim().display().to_string();
    let (g, s) = both(ctx, "m1m2_driver", &["overhead", &shim, n])?;
    let get = |l: &[Value], k: &str| first(l, "overhead").and_then(|v| v[k].as_f64());
    for (name, k) in [
        ("M1: cuLaunchKernel, direct", "launch_direct_ns"),
        ("M1: added by the shim", "launch_added_ns"),
        (
            "M2: cuMemAlloc + cuMemFree (1 MiB), direct",
            "alloc_free_direct_ns",
        ),
        ("M2: added by the shim", "alloc_free_added_ns"),
    ] {
        ctx.figures
            .push(figure("m1m2_driver", name, "ns", get(&g, k), get(&s, k)));
    }
    let detail = format!(
        "through the shim, a launch {:+.0} ns (of {:.0}), an allocation + free {:+.0} ns (of {:.0}) on the GPU's driver",
        get(&g, "launch_added_ns").unwrap_or(f64::NAN),
        get(&g, "launch_direct_ns").unwrap_or(f64::NAN),
        get(&g, "alloc_free_added_ns").unwrap_or(f64::NAN),
        get(&g, "alloc_free_direct_ns").unwrap_or(f64::NAN)
    );
    Ok(Outcome::new(
        Status::Measured,
        detail,
        json!({"gpu": g, "simgpu": s}),
    ))
}

pub fn m1m2_instant(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let bench = ctx.bundle.criterion();
    if !bench.is_file() {
        return Ok(Outcome::new(
            Status::NotRun,
            "the bundle carries no criterion bench (scripts/gpu-check.sh --bundle builds it with `cargo bench --no-run`; with SHARE_TESTS_SKIP_BUILD=1 only if already built)",
            Value::Null,
        ));
    }
    // The bench finds libshare.so and the instant driver in $CARGO_TARGET_DIR/release.
    let state = ctx.fresh("criterion")?;
    std::os::unix::fs::symlink(ctx.bundle.jobs_dir(), state.join("release"))?;
    let mut cmd = ctx.command(&bench, Side::Gpu, &state);
    cmd.env("CARGO_TARGET_DIR", &state)
        .env("SHARE_TESTS_SKIP_BUILD", "1")
        .arg("--bench");
    if ctx.opts.short {
        cmd.args(["--warm-up-time", "0.2", "--measurement-time", "0.5"]);
    }
    let f = runner::run(cmd, ctx.limit(55))?;
    ctx.log("m1m2_instant", &f);
    let Some(v) = f
        .json()
        .into_iter()
        .rfind(|v| v["scenario"] == "shim_overhead")
    else {
        bail!("the criterion bench printed no summary: {}", f.why());
    };
    for (name, k) in [
        ("M1 (instant driver): added ns per launch", "launch"),
        (
            "M2 (instant driver): added ns per allocation + free",
            "alloc_free",
        ),
    ] {
        ctx.figures.push(figure(
            "m1m2_instant",
            name,
            "ns",
            v[k]["added_ns"].as_f64(),
            None,
        ));
    }
    Ok(Outcome::new(
        Status::Measured,
        format!(
            "M1 {:+} ns, M2 {:+} ns on this machine's CPU (BENCHMARKS.md's method)",
            v["launch"]["added_ns"], v["alloc_free"]["added_ns"]
        ),
        v,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_rows_become_figures_side_by_side() {
        let g = vec![
            json!({"scenario": "S9", "policy": "libshare", "processes": 2, "containers": 1, "p99_ratio": 1.2}),
            json!({"scenario": "S9", "policy": "native", "processes": 2, "containers": null, "p99_ratio": 2.0}),
        ];
        let s = vec![
            json!({"scenario": "S9", "policy": "libshare", "processes": 2, "containers": 1, "p99_ratio": 1.0}),
        ];
        let f = bench_figures("S9", &g, &s, &["p99_ratio", "p99_ms"]);
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].name, "libshare processes=2 containers=1: p99_ratio");
        assert_eq!((f[0].gpu, f[0].simgpu), (Some(1.2), Some(1.0)));
        assert_eq!((f[1].gpu, f[1].simgpu), (Some(2.0), None));
    }
}
