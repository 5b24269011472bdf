//! What the checks share ([`Ctx`]: the bundle, the environment of each side, the deadline, what
//! was measured) and the checks of [`super::PLAN`] that judge the shim against the driver: each
//! runs the bundle's programs and judges what they printed. Here: the platform, cudart, PyTorch and
//! the settings; the resolution check is in `resolution.rs`, the quota checks in `quota.rs`. The
//! measuring ones: `measures.rs`.

use super::calibrate::Measured;
use super::report::{CalibrationRow, Figure, Side, Status};
use super::runner::{self, Finished};
use super::{fresh, Bundle, Options, Outcome};
use crate::platform::StateDir;
use anyhow::bail;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

pub(super) const MIB: u64 = 1 << 20;
pub(super) const GIB: u64 = 1 << 30;
pub(super) const CUDA_ERROR_OUT_OF_MEMORY: i64 = 2;
pub(super) const CUDA_ERROR_NOT_SUPPORTED: i64 = 801;

/// A shim for a program: its state directory, container and quota.
pub(super) struct Shim<'a> {
    pub(super) state: &'a Path,
    pub(super) container: &'a str,
    pub(super) quota: &'a str,
}

/// Everything the checks share.
pub struct Ctx {
    pub opts: Options,
    pub bundle: Bundle,
    pub(super) out: PathBuf,
    pub(super) simgpu_lib: PathBuf,
    passthrough: Vec<(OsString, OsString)>,
    tmp: StateDir,
    deadline: Instant,
    pub step_deadline: Instant,
    pub platform: Value,
    pub sim_platform: Value,
    pub figures: Vec<Figure>,
    pub calibration: Vec<CalibrationRow>,
    pub calibration_file: Option<String>,
    pub processes_left: Option<usize>,
    /// `nvidia-smi -L`'s first GPU (how `sharectl bench` finds a GPU), asked once, time-boxed.
    pub(super) nvidia_smi: Option<String>,
    /// What the calibration measured on each side.
    pub(super) gpu: Measured,
    pub(super) sim: Measured,
}

impl Ctx {
    pub fn new(
        opts: Options,
        bundle: Bundle,
        out: PathBuf,
        simgpu_lib: PathBuf,
        deadline: Instant,
    ) -> anyhow::Result<Ctx> {
        Ok(Ctx {
            opts,
            bundle,
            out,
            simgpu_lib,
            passthrough: super::simgpu_vars(),
            tmp: StateDir::create()?,
            deadline,
            step_deadline: deadline,
            platform: Value::Null,
            sim_platform: Value::Null,
            figures: Vec::new(),
            calibration: Vec::new(),
            calibration_file: None,
            processes_left: None,
            nvidia_smi: None,
            gpu: Measured::default(),
            sim: Measured::default(),
        })
    }

    /// What is left of the whole budget.
    pub fn left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// `max_s`, or what is left of this check's time if less (at least a second).
    pub(super) fn limit(&self, max_s: u64) -> Duration {
        Duration::from_secs(max_s)
            .min(self.step_deadline.saturating_duration_since(Instant::now()))
            .max(Duration::from_secs(1))
    }

    pub(super) fn fresh(&self, name: &str) -> anyhow::Result<PathBuf> {
        fresh(&self.tmp, name)
    }

    pub(super) fn command(&self, program: &Path, side: Side, state: &Path) -> Command {
        let mut cmd = super::command(
            program,
            side,
            self.opts.sim,
            &self.simgpu_lib,
            &self.passthrough,
            state,
        );
        // A shim loaded by the program itself (`gpu_probe overhead`) keeps its state here too,
        // never in the node's default state directory.
        cmd.env("GPU_PROBE_SPIN_PTX", self.bundle.spin_ptx())
            .env("LIBSHARE_STATE_DIR", state.join("libshare"));
        cmd
    }

    pub(super) fn shim(&self, cmd: &mut Command, s: &Shim<'_>) {
        cmd.env("LD_PRELOAD", self.bundle.shim())
            .env("LIBSHARE_STATE_DIR", s.state.join("libshare"))
            .env("LIBSHARE_CONTAINER", s.container)
            .env("LIBSHARE_MEMORY_LIMIT", s.quota);
    }

    /// Keeps a program's output in `logs/NAME.txt` (its tail, for a long one).
    pub(super) fn log(&self, name: &str, f: &Finished) {
        let text = format!(
            "status: {:?} ({:.1} s)\n--- stdout\n{}\n--- stderr\n{}\n",
            f.status,
            f.secs,
            runner::truncate(&f.stdout, 200_000),
            runner::truncate(&f.stderr, 50_000)
        );
        let _ = std::fs::write(self.out.join("logs").join(format!("{name}.txt")), text);
    }

    /// Runs `program args` on `side`, under `shim` if given; logged as `name`.
    pub(super) fn run(
        &self,
        name: &str,
        program: &Path,
        args: &[&str],
        side: Side,
        state: &Path,
        shim: Option<&Shim<'_>>,
    ) -> anyhow::Result<Finished> {
        let mut cmd = self.command(program, side, state);
        cmd.args(args);
        if let Some(s) = shim {
            self.shim(&mut cmd, s);
        }
        // Bounded by what is left of the check's time.
        let f = runner::run(cmd, self.limit(3600))?;
        self.log(&format!("{name}-{}", side_name(side)), &f);
        if runner::stopped() {
            bail!("interrupted");
        }
        Ok(f)
    }

    pub(super) fn probe(
        &self,
        name: &str,
        args: &[&str],
        side: Side,
        state: &Path,
        shim: Option<&Shim<'_>>,
    ) -> anyhow::Result<Finished> {
        self.run(name, &self.bundle.bin("gpu_probe"), args, side, state, shim)
    }

    pub(super) fn has_unified_memory(&self) -> bool {
        self.platform["concurrent_managed_access"] == 1
    }
}

pub(super) fn side_name(side: Side) -> &'static str {
    match side {
        Side::Gpu => "gpu",
        Side::Simgpu => "simgpu",
    }
}

/// `key=value` lines.
pub(super) fn facts(stdout: &str) -> HashMap<String, String> {
    stdout
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

pub(super) fn first<'a>(lines: &'a [Value], check: &str) -> Option<&'a Value> {
    lines.iter().find(|v| v["check"] == check)
}

// ---- platform ----

pub fn platform(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let mut problems = Vec::new();
    for side in [Side::Gpu, Side::Simgpu] {
        let state = ctx.fresh("info")?;
        let f = ctx.probe("platform", &["info"], side, &state, None)?;
        match first(&f.json(), "info") {
            Some(v) if f.ok() => match side {
                Side::Gpu => ctx.platform = v.clone(),
                Side::Simgpu => ctx.sim_platform = v.clone(),
            },
            _ => problems.push(format!(
                "{}: the driver did not answer ({})",
                side_name(side),
                f.why()
            )),
        }
    }
    // What `sharectl bench` will find (it runs `nvidia-smi -L`): asked here under a deadline.
    let smi = if ctx.opts.sim {
        None
    } else {
        let state = ctx.fresh("nvidia-smi")?;
        let mut cmd = ctx.command(Path::new("nvidia-smi"), Side::Gpu, &state);
        cmd.arg("-L");
        runner::run(cmd, ctx.limit(20))
            .ok()
            .filter(Finished::ok)
            .and_then(|f| {
                f.stdout
                    .lines()
                    .map(str::trim)
                    .find(|l| l.starts_with("GPU "))
                    .map(str::to_string)
            })
    };
    ctx.nvidia_smi = smi.clone();
    let p = &ctx.platform;
    if !problems.is_empty() {
        return Ok(Outcome::new(
            Status::Failed,
            problems.join("; "),
            json!({"nvidia_smi": smi}),
        ));
    }
    let v = p["cuda_driver_version"].as_i64().unwrap_or(0);
    let detail = format!(
        "{}, driver {}, CUDA {}.{}, compute mode {}, MIG rc {} (current {}), MPS pipe {}, NVML limits {}, unified memory {}; nvidia-smi -L: {}",
        p["name"].as_str().unwrap_or("?"),
        p["driver_version"].as_str().unwrap_or("?"),
        v / 1000,
        (v % 1000) / 10,
        p["compute_mode"],
        p["mig_rc"],
        p["mig_current"],
        p["mps_control_pipe"],
        if p["memory_limits_set"] == true { "offered" } else { "not offered" },
        if ctx.has_unified_memory() { "with GPU page faults" } else { "none" },
        smi.as_deref().unwrap_or("(none)")
    );
    Ok(Outcome::new(
        Status::Measured,
        detail,
        json!({"gpu": p, "simgpu": ctx.sim_platform, "nvidia_smi": smi}),
    ))
}

// ---- cudart, PyTorch ----

pub fn cudart(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let mut p = Vec::new();
    let mut data = serde_json::Map::new();
    let mut ran = Vec::new();
    for tag in ["cu12", "cu13"] {
        let bin = ctx.bundle.bin(&format!("rt_test-{tag}"));
        if !bin.is_file() {
            p.push(format!("the bundle lacks {}", bin.display()));
            continue;
        }
        let state = ctx.fresh("cudart")?;
        let plain = ctx.run(
            &format!("cudart-{tag}-plain"),
            &bin,
            &[],
            Side::Gpu,
            &state,
            None,
        )?;
        let shim = Shim {
            state: &state,
            container: "cudart",
            quota: "1GiB",
        };
        let quota = GIB.to_string();
        let shimmed = ctx.run(
            &format!("cudart-{tag}-shim"),
            &bin,
            &[&quota],
            Side::Gpu,
            &state,
            Some(&shim),
        )?;
        for (what, f) in [("plainly", &plain), ("under the shim", &shimmed)] {
            if !f.ok() || !f.stdout.lines().any(|l| l == "OK") {
                p.push(format!("{tag} {what}: {}", f.why()));
            }
        }
        let facts = facts(&plain.stdout);
        ran.push(format!(
            "{tag} (runtime {})",
            facts.get("runtime_version").map_or("?", String::as_str)
        ));
        data.insert(
            tag.into(),
            json!({"plain": facts, "shim": self::facts(&shimmed.stdout)}),
        );
    }
    Ok(Outcome::judged(
        p,
        format!("{} against driver API {}: plainly and under the shim (totalGlobalMem = the 1 GiB quota)", ran.join(", "), ctx.platform["cuda_driver_version"]),
        Value::Object(data),
    ))
}

pub fn pytorch(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let python = ctx
        .opts
        .python
        .clone()
        .unwrap_or_else(|| PathBuf::from("python3"));
    let state = ctx.fresh("torch")?;
    let script = ctx.bundle.python("shim_quota.py");
    let shim = Shim {
        state: &state,
        container: "torch",
        quota: "1GiB",
    };
    let quota = GIB.to_string();
    let f = match ctx.run(
        "pytorch",
        &python,
        &[&script.display().to_string(), &quota],
        Side::Gpu,
        &state,
        Some(&shim),
    ) {
        Ok(f) => f,
        Err(e) if !runner::stopped() => {
            let why = format!(
                "cannot run {} ({e:#}); --python FILE names another",
                python.display()
            );
            return Ok(Outcome::new(Status::Unavailable, why, Value::Null));
        }
        Err(e) => return Err(e),
    };
    let steps: Vec<Value> = f.json();
    // The script's first step imports torch and says which.
    let which = steps
        .iter()
        .find(|v| v["step"] == "import")
        .cloned()
        .unwrap_or(Value::Null);
    if which["ok"] != true {
        let why = which["error"]
            .as_str()
            .map_or_else(|| f.why(), str::to_string);
        return Ok(Outcome::new(
            Status::Unavailable,
            format!(
                "no PyTorch in {} ({}); --python FILE names another",
                python.display(),
                runner::truncate(&why, 200)
            ),
            json!({"steps": steps}),
        ));
    }
    let label = format!(
        "PyTorch {} (CUDA {}) in {} (Python {})",
        which["version"].as_str().unwrap_or("?"),
        which["cuda"].as_str().unwrap_or("?"),
        which["python"].as_str().unwrap_or("?"),
        which["python_version"].as_str().unwrap_or("?")
    );
    let mut p = Vec::new();
    if !f.ok() || !f.stdout.lines().any(|l| l == "OK") {
        p.push(format!("{label}: {}", f.why()));
    }
    Ok(Outcome::judged(
        p,
        format!("{label}: {} steps under a 1 GiB quota, OOM as torch.OutOfMemoryError, the quota back after empty_cache", steps.len()),
        json!({"steps": steps}),
    ))
}

// ---- settings ----

pub fn settings(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let state = ctx.fresh("settings")?;
    let f = ctx.probe("settings", &["info"], Side::Gpu, &state, None)?;
    let now = first(&f.json(), "info").cloned().unwrap_or(Value::Null);
    let alive = runner::reap_all();
    let left = alive.len();
    ctx.processes_left = Some(left);
    let mut p = Vec::new();
    for k in [
        "compute_mode",
        "mig_current",
        "mig_pending",
        "nvml_compute_mode",
    ] {
        if now[k] != ctx.platform[k] {
            p.push(format!("{k} was {} and is now {}", ctx.platform[k], now[k]));
        }
    }
    if left > 0 {
        p.push(format!(
            "{left} process(es) of the run were still alive (killed now): {}",
            alive.join(", ")
        ));
    }
    Ok(Outcome::judged(
        p,
        "compute mode and MIG as at the start (gpu-check changes no setting); no process left behind",
        json!({"end": now, "processes_left": left}),
    ))
}
