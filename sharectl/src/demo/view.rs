//! The demo's output: its intro, live lines, phase results and summary, as text or JSON lines.

use super::{
    Container, Grow, NoShim, OppRate, PhaseResult, Shim, BATCH, GROW, GROW_BYTES, OPPORTUNISTIC,
    OPPORTUNISTIC_GPU_MS, OPPORTUNISTIC_KERNELS, PROD, PRODUCTION, PRODUCTION_GPU_MS,
};
use crate::node_view as status;
use crate::platform::Gpu;
use jobs::profiles::Train;
use libshare_abi::units::format_size;
use serde_json::{json, Value};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set when writing to stdout failed (e.g. `sharectl demo --json | head -1`).
static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// The demo stopped because its stdout went away; `main` exits quietly.
#[derive(Debug)]
pub struct StdoutClosed;

impl std::fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stdout closed")
    }
}

impl std::error::Error for StdoutClosed {}

fn say_line(args: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{args}").and_then(|()| out.flush()).is_err() {
        STDOUT_CLOSED.store(true, Ordering::Relaxed);
    }
}

/// `println!` that records a closed stdout instead of panicking.
macro_rules! say {
    ($($arg:tt)*) => { say_line(format_args!($($arg)*)) };
}

pub(super) fn check_stdout() -> anyhow::Result<()> {
    if STDOUT_CLOSED.load(Ordering::Relaxed) {
        return Err(StdoutClosed.into());
    }
    Ok(())
}

/// Text or JSON-lines output.
#[derive(Clone, Copy)]
pub(super) struct Output {
    pub(super) json: bool,
}

fn cmdline<S: AsRef<str>>(bin: &str, args: &[S]) -> String {
    std::iter::once(bin)
        .chain(args.iter().map(AsRef::as_ref))
        .collect::<Vec<_>>()
        .join(" ")
}

fn r1(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

fn r3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// Device 0's figures of container `name` in a `status::read_containers` list (the jobs run on
/// device 0).
fn device0<'a>(containers: &'a [Value], name: &str) -> Option<&'a Value> {
    containers
        .iter()
        .find(|c| c["container"] == name)?
        .get("devices")?
        .as_array()?
        .iter()
        .find(|d| d["device"] == 0)
}

/// One live line per container: memory used / quota / peak, launches, refused allocations.
fn container_lines(containers: &[Value]) -> Vec<String> {
    [PROD, BATCH]
        .iter()
        .filter_map(|c| {
            let d = device0(containers, c.name)?;
            let size = |k: &str| format_size(d[k].as_u64().unwrap_or(0));
            Some(format!(
                "           {:<6} {:>8} used of {:>7} quota, peak {:>8}, {:>6} launches, {} refused",
                c.name,
                size("used_bytes"),
                size("quota_bytes"),
                size("peak_bytes"),
                d["launches_live_processes"].as_u64().unwrap_or(0),
                d["refused_over_quota"].as_u64().unwrap_or(0),
            ))
        })
        .collect()
}

impl Output {
    fn emit(&self, v: Value) {
        say!("{v}");
    }

    pub(super) fn intro(&self, gpu: &Gpu, shim: &Result<Shim, NoShim>, secs: f64) {
        let gpu_json = match gpu {
            Gpu::Real { description } => json!({"kind": "real", "description": description}),
            Gpu::Sim { lib_dir, state } => json!({
                "kind": "simgpu",
                "lib_dir": lib_dir.display().to_string(),
                "state_dir": state.path().display().to_string(),
            }),
        };
        let container_json =
            |c: Container| json!({"name": c.name, "class": c.class, "quota": c.quota});
        if self.json {
            let libshare = match shim {
                Ok(s) => json!({
                    "shim": s.lib.display().to_string(),
                    "state_dir": s.state.path().display().to_string(),
                    "memory_quotas": true,
                    "kernel_rate_control": true,
                }),
                Err(why) => json!({
                    "shim": null,
                    "why": why.lines().join("; "),
                    "memory_quotas": false,
                    "kernel_rate_control": false,
                }),
            };
            self.emit(json!({
                "event": "start",
                "gpu": gpu_json,
                "libshare": libshare,
                "duration_s": secs,
                "production": cmdline(Train::BIN, &PRODUCTION.args()),
                "production_container": container_json(PROD),
                "opportunistic": cmdline(Train::BIN, &OPPORTUNISTIC.args()),
                "opportunistic_container": container_json(BATCH),
                "grow": cmdline(GROW.0, GROW.1),
            }));
            return;
        }
        say!("sharectl demo: one GPU shared by a production job and an opportunistic job");
        say!("");
        match gpu {
            Gpu::Real { description } => say!("  GPU            real: {description}"),
            Gpu::Sim { lib_dir, state } => {
                say!("  GPU            simulated by simgpu (no real GPU in use)");
                say!("                 libcuda.so.1 from {}", lib_dir.display());
                say!(
                    "                 fresh state dir {}",
                    state.path().display()
                );
            }
        }
        match shim {
            Ok(s) => {
                say!(
                    "  libshare       shim {} preloaded into every job",
                    s.lib.display()
                );
                say!(
                    "                 its state dir {} (private to this run; from another",
                    s.state.path().display()
                );
                say!(
                    "                 terminal: sharectl status --state-dir {})",
                    s.state.path().display()
                );
            }
            Err(why) => {
                for (i, l) in why.lines().iter().enumerate() {
                    let head = if i == 0 {
                        "libshare       not in use: "
                    } else {
                        "               "
                    };
                    say!("  {head}{l}");
                }
            }
        }
        let container = |c: Container| match shim {
            Ok(_) => format!(
                "container \"{}\", class {}, memory quota {}",
                c.name,
                c.class,
                c.quota_text()
            ),
            Err(_) => "no container (no shim)".into(),
        };
        say!("  production     {}", container(PROD));
        say!(
            "                 {}",
            cmdline(Train::BIN, &PRODUCTION.args())
        );
        say!("                 training-like: 6 ms of GPU work + 4 ms of CPU per iteration, holds 512 MiB");
        say!("  opportunistic  {}", container(BATCH));
        say!(
            "                 {}",
            cmdline(Train::BIN, &OPPORTUNISTIC.args())
        );
        say!("                 training with no host gap: takes all the GPU time it can get, holds 384 MiB");
        if shim.is_ok() {
            say!("                 in phase 2 a second batch worker asks for 256 MiB more: over the quota");
        }
        say!("  All are ordinary, unmodified CUDA driver-API programs.");
        say!("");
        if shim.is_ok() {
            say!(
                "What libshare enforces: per-container memory quotas (the shim), and GPU time: the"
            );
            say!("coordinator daemon keeps the production job running as if alone and gives the");
            say!("opportunistic one the GPU time production leaves idle. Phase 2 runs the pair without the");
            say!(
                "daemon (compute shared natively: the problem); phase 3 runs it under the daemon."
            );
        } else {
            say!("Without the shim nothing is enforced: the two jobs share the GPU natively, as they would");
            say!("without libshare. Phase 2 shows how much the production job slows down.");
        }
    }

    pub(super) fn phase_header(&self, n: u32, of: u32, secs: f64) {
        if self.json {
            return;
        }
        say!("");
        match n {
            1 => say!("Phase 1/{of}: production job alone (solo throughput), {secs} s"),
            2 => say!(
                "Phase 2/{of}: production + opportunistic job together, compute natively co-located, {secs} s"
            ),
            _ => say!(
                "Phase {n}/{of}: the same two jobs under libshare's daemon (production first, the opportunistic job in its idle time), {secs} s"
            ),
        }
    }

    pub(super) fn live(
        &self,
        t: f64,
        rate: f64,
        solo: Option<f64>,
        opp: Option<OppRate>,
        containers: Option<&[Value]>,
        daemon: bool,
    ) {
        if self.json {
            let mut v = json!({
                "event": "progress",
                "phase": match (solo.is_some(), daemon) {
                    (false, _) => "solo",
                    (true, false) => "colocated",
                    (true, true) => "libshare",
                },
                "t": r3(t),
                "production_iters_per_s": r3(rate),
            });
            if let Some(s) = solo.filter(|s| *s > 0.0) {
                v["production_vs_solo"] = json!(r3(rate / s));
                v["opportunistic_iters_per_s"] = json!(opp.map(|o| r3(o.iters_per_s)));
                v["opportunistic_gpu_ms_per_s"] = json!(opp.map(|o| r3(o.gpu_ms_per_s)));
            }
            if let Some(c) = containers {
                v["containers"] = json!(c);
            }
            self.emit(v);
            return;
        }
        let mut line = format!("  t={t:>4.1}s  production {rate:>7.1} it/s");
        if let Some(s) = solo.filter(|s| *s > 0.0) {
            line += &format!(" ({:>3.0}% of solo)", 100.0 * rate / s);
            match opp {
                Some(o) => {
                    line += &format!(
                        "   opportunistic {:>6.1} it/s ({:>4.0} GPU-ms/s)",
                        o.iters_per_s, o.gpu_ms_per_s
                    )
                }
                None => line += "   opportunistic (starting)",
            }
        }
        say!("{line}");
        for l in container_lines(containers.unwrap_or_default()) {
            say!("{l}");
        }
    }

    pub(super) fn grow(&self, g: &Grow) {
        if self.json {
            self.emit(json!({
                "event": "grow",
                "container": BATCH.name,
                "requested_bytes": GROW_BYTES,
                "refused": g.refused,
                "message": g.message,
            }));
            return;
        }
        let ask = format!(
            "  batch: a second worker asks for {} more ->",
            format_size(GROW_BYTES)
        );
        if g.refused {
            say!(
                "{ask} refused by the shim (over batch's {} quota):",
                BATCH.quota_text()
            );
            say!("         {}", g.message);
        } else {
            say!("{ask} not refused: {}", g.message);
        }
    }

    pub(super) fn phase_done(&self, r: &PhaseResult) {
        if self.json {
            return;
        }
        let rate = r.production["iters_per_s"].as_f64().unwrap_or(0.0);
        let iters = r.production["iters"].as_u64().unwrap_or(0);
        let secs = r.production["elapsed_s"].as_f64().unwrap_or(0.0);
        let mut line =
            format!("  -> production: {iters} iterations in {secs:.1} s = {rate:.1} it/s");
        if let Some(o) = r.opportunistic {
            line += &format!(
                "; opportunistic: {:.1} it/s ({:.0} GPU-ms/s)",
                o.iters_per_s, o.gpu_ms_per_s
            );
        }
        say!("{line}");
    }

    pub(super) fn summary(
        &self,
        gpu: &Gpu,
        shim: Option<&Shim>,
        solo: &PhaseResult,
        co: &PhaseResult,
        shared: Option<&PhaseResult>,
    ) {
        let s = solo.production["iters_per_s"].as_f64().unwrap_or(0.0);
        let c = co.production["iters_per_s"].as_f64().unwrap_or(0.0);
        let ratio = if s > 0.0 { c / s } else { 0.0 };
        let l = shared.map(|r| r.production["iters_per_s"].as_f64().unwrap_or(0.0));
        let l_ratio = l.map(|l| if s > 0.0 { l / s } else { 0.0 });
        // The GPU time production leaves idle under libshare, and the share of it the
        // opportunistic job used (GPU-ms per second of wall time).
        let idle_ms = l.map(|l| (1000.0 - l * PRODUCTION_GPU_MS).max(1.0));
        let harvest = shared
            .and_then(|r| r.opportunistic)
            .zip(idle_ms)
            .map(|(o, idle)| (o.gpu_ms_per_s / idle).min(1.0));
        let p99 = |r: &PhaseResult| r.production["iter_ms"]["p99"].as_f64();
        let p50 = |r: &PhaseResult| r.production["iter_ms"]["p50"].as_f64();
        if self.json {
            self.emit(json!({
                "event": "final",
                "final": true,
                "gpu": if gpu.is_sim() { "simgpu" } else { "real" },
                "libshare_enforced": {
                    "shim": shim.is_some(),
                    "memory_quotas": shim.is_some(),
                    "kernel_rate_control": shared.is_some(),
                },
                "solo": {
                    "production_iters_per_s": s,
                    "production_gpu_ms_per_s": r3(s * PRODUCTION_GPU_MS),
                    "production_iter_ms_p50": p50(solo),
                    "production_iter_ms_p99": p99(solo),
                    "containers": solo.containers,
                },
                "colocated": {
                    "production_iters_per_s": c,
                    "production_gpu_ms_per_s": r3(c * PRODUCTION_GPU_MS),
                    "production_iter_ms_p50": p50(co),
                    "production_iter_ms_p99": p99(co),
                    "opportunistic_iters_per_s": co.opportunistic.map(|o| r3(o.iters_per_s)),
                    "opportunistic_gpu_ms_per_s": co.opportunistic.map(|o| r3(o.gpu_ms_per_s)),
                    "containers": co.containers,
                    "grow": co.grow.as_ref().map(|g| json!({
                        "container": BATCH.name,
                        "requested_bytes": GROW_BYTES,
                        "refused": g.refused,
                        "message": g.message,
                    })),
                },
                "libshare": shared.map(|r| json!({
                    "production_iters_per_s": l,
                    "production_gpu_ms_per_s": l.map(|l| r3(l * PRODUCTION_GPU_MS)),
                    "production_iter_ms_p50": p50(r),
                    "production_iter_ms_p99": p99(r),
                    "opportunistic_iters_per_s": r.opportunistic.map(|o| r3(o.iters_per_s)),
                    "opportunistic_gpu_ms_per_s": r.opportunistic.map(|o| r3(o.gpu_ms_per_s)),
                    "containers": r.containers,
                })),
                "production_vs_solo": r3(ratio),
                "production_vs_solo_libshare": l_ratio.map(r3),
                "opportunistic_harvest": harvest.map(r3),
            }));
            return;
        }
        let opt = |v: Option<f64>| v.map(|x| format!("{x:.1}")).unwrap_or_else(|| "-".into());
        say!("");
        say!(
            "Summary ({}, {})",
            if gpu.is_sim() { "simgpu" } else { "real GPU" },
            if shim.is_some() {
                "libshare: shim with memory quotas; daemon in phase 3"
            } else {
                "no libshare"
            }
        );
        let third = |f: &dyn Fn(&PhaseResult) -> Option<f64>| opt(shared.and_then(f));
        say!("                                     alone   co-located     libshare");
        say!(
            "  production iterations/s        {:>9.1}    {:>9.1}    {:>9}",
            s,
            c,
            opt(l)
        );
        say!(
            "    of solo                                 {:>8.0}%    {:>8}%",
            100.0 * ratio,
            l_ratio.map_or_else(|| "-".into(), |r| format!("{:.0}", 100.0 * r))
        );
        say!(
            "  production iteration p50 (ms)  {:>9}    {:>9}    {:>9}",
            opt(p50(solo)),
            opt(p50(co)),
            third(&|r| p50(r))
        );
        say!(
            "  production iteration p99 (ms)  {:>9}    {:>9}    {:>9}",
            opt(p99(solo)),
            opt(p99(co)),
            third(&|r| p99(r))
        );
        say!(
            "  production GPU-ms/s            {:>9.0}    {:>9.0}    {:>9}",
            s * PRODUCTION_GPU_MS,
            c * PRODUCTION_GPU_MS,
            l.map_or_else(|| "-".into(), |l| format!("{:.0}", l * PRODUCTION_GPU_MS))
        );
        say!(
            "  opportunistic iterations/s     {:>9}    {:>9}    {:>9}",
            "-",
            opt(co.opportunistic.map(|o| r1(o.iters_per_s))),
            third(&|r| r.opportunistic.map(|o| r1(o.iters_per_s)))
        );
        say!(
            "  opportunistic GPU-ms/s         {:>9}    {:>9}    {:>9}",
            "-",
            opt(co.opportunistic.map(|o| r1(o.gpu_ms_per_s))),
            third(&|r| r.opportunistic.map(|o| r1(o.gpu_ms_per_s)))
        );
        say!("  (GPU-ms/s: kernel time completed per second; 1000 = the GPU always busy)");
        if let (Some(shim), Some(containers)) = (shim, co.containers.as_deref()) {
            say!("");
            say!("Memory per container in phase 2 (as `sharectl status` shows it):");
            for l in status::table(shim.state.path(), containers) {
                say!("  {l}");
            }
            say!("");
            match &co.grow {
                Some(g) if g.refused => {
                    let figure = |name: &str, key: &str| {
                        format_size(
                            device0(containers, name)
                                .and_then(|d| d[key].as_u64())
                                .unwrap_or(0),
                        )
                    };
                    say!(
                        "Memory: the shim held batch to its {} quota: with {} held, its second worker's {} was",
                        BATCH.quota_text(),
                        figure(BATCH.name, "peak_bytes"),
                        format_size(GROW_BYTES)
                    );
                    say!(
                        "refused (CUDA_ERROR_OUT_OF_MEMORY, counted under REFUSED); prod kept its {} (quota {}, nothing refused).",
                        figure(PROD.name, "peak_bytes"),
                        PROD.quota_text()
                    );
                }
                Some(g) => say!(
                    "Memory: the second batch worker was not refused: {}",
                    g.message
                ),
                None => {}
            }
        }
        say!(
            "Compute: natively co-located, the production job ran at {:.0}% of its solo throughput.",
            100.0 * ratio
        );
        if let (Some(lr), Some(h)) = (l_ratio, harvest) {
            say!(
                "Under libshare's daemon it ran at {:.0}% of solo, and the opportunistic job used {:.0}% of the",
                100.0 * lr,
                100.0 * h
            );
            say!(
                "GPU time production left idle: its {:.0} ms kernels go only where they end before production's",
                OPPORTUNISTIC_GPU_MS / OPPORTUNISTIC_KERNELS
            );
            say!("predicted return, so finer ones harvest more (0.5 ms: ~80 %, S1). `sharectl bench` measures this");
            say!("and more: BENCHMARKS.md.");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_cmdlines() {
        // The argv the two jobs ran when they were written out here by hand.
        assert_eq!(
            cmdline(Train::BIN, &PRODUCTION.args()),
            "simjob-train --gpu-ms 6 --kernels 4 --cpu-ms 4 --mem 512MiB"
        );
        assert_eq!(
            cmdline(Train::BIN, &OPPORTUNISTIC.args()),
            "simjob-train --gpu-ms 8 --kernels 4 --cpu-ms 0 --mem 384MiB"
        );
        // The second batch worker asks for more than the batch container has left of its quota.
        let i = GROW.1.iter().position(|a| *a == "--mem").unwrap();
        let grow = libshare_abi::units::parse_size(GROW.1[i + 1]).unwrap();
        let size = |t: Train| t.mem_mib << 20;
        let quota = |c: Container| libshare_abi::units::parse_size(c.quota).unwrap();
        assert_eq!(grow, GROW_BYTES);
        assert!(size(OPPORTUNISTIC) <= quota(BATCH));
        assert!(size(OPPORTUNISTIC) + grow > quota(BATCH));
        assert!(size(PRODUCTION) <= quota(PROD));
    }

    #[test]
    fn container_lines_read_status_figures() {
        let c = vec![json!({
            "container": "batch", "class": "opportunistic",
            "devices": [{"device": 0, "quota_bytes": 512u64 << 20, "used_bytes": 384u64 << 20,
                         "peak_bytes": 384u64 << 20, "refused_over_quota": 1,
                         "launches_live_processes": 42}],
            "processes": [],
        })];
        let l = container_lines(&c);
        assert_eq!(l.len(), 1, "{l:?}");
        assert!(
            l[0].contains("batch") && l[0].contains("384 MiB used of 512 MiB quota"),
            "{l:?}"
        );
        assert!(l[0].contains("42 launches, 1 refused"), "{l:?}");
        assert_eq!(device0(&c, "prod"), None);
    }
}
