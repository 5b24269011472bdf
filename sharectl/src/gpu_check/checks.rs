//! What the checks share ([`Ctx`]: the bundle, the environment of each side, the deadline, what
//! was measured) and the checks of [`super::PLAN`] that judge the shim against the driver: each
//! runs the bundle's programs and judges what they printed. The measuring ones: `measures.rs`.

use super::calibrate::Measured;
use super::report::{CalibrationRow, Figure, Side, Status};
use super::runner::{self, Finished};
use super::{fresh, Bundle, Options, Outcome};
use crate::platform::StateDir;
use anyhow::{bail, Context};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering::Acquire;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const CUDA_ERROR_OUT_OF_MEMORY: i64 = 2;
const CUDA_ERROR_NOT_SUPPORTED: i64 = 801;

/// A shim for a program: its state directory, container and quota.
pub(super) struct Shim<'a> {
    state: &'a Path,
    container: &'a str,
    quota: &'a str,
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

    fn shim(&self, cmd: &mut Command, s: &Shim<'_>) {
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
fn facts(stdout: &str) -> HashMap<String, String> {
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

// ---- resolution ----

/// A `P` line of `gpu_probe procaddr`: (status, query result, symbol, in the shim).
type Query = (i64, i64, String, bool);
/// Every `P` line by (name, version asked, per-thread flag).
type Queries = HashMap<(String, i64, i64), Query>;
/// Every `E` line by symbol: (the driver has it, default lookup in the shim, on the driver's
/// handle in the shim).
type Exports = HashMap<String, (bool, bool, bool)>;

fn parse_procaddr(stdout: &str) -> (Queries, Exports) {
    let mut p = HashMap::new();
    let mut e = HashMap::new();
    for l in stdout.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        match f.as_slice() {
            ["P", base, ver, pt, rc, st, sym, shim] => {
                let n = |s: &str| s.parse::<i64>().unwrap_or(-99);
                p.insert(
                    (base.to_string(), n(ver), n(pt)),
                    (n(rc), n(st), sym.to_string(), *shim == "1"),
                );
            }
            ["E", sym, found, default, handle] => {
                e.insert(
                    sym.to_string(),
                    (*found == "1", *default == "1", *handle == "1"),
                );
            }
            _ => {}
        }
    }
    (p, e)
}

/// What the shim must hook, whatever else it does: asked at CUDA 12.0 without flags.
const MUST_HOOK: [&str; 10] = [
    "cuGetProcAddress",
    "cuMemAlloc",
    "cuMemFree",
    "cuMemGetInfo",
    "cuMemAllocManaged",
    "cuMemAllocAsync",
    "cuMemCreate",
    "cuArrayCreate",
    "cuDeviceTotalMem",
    "cuLaunchKernel",
];

/// Compares the driver's answers (`plain`) with the shim's: returns the problems and counts.
pub fn compare_resolution(plain: &str, shimmed: &str) -> (Vec<String>, Value) {
    let (pp, pe) = parse_procaddr(plain);
    let (sp, se) = parse_procaddr(shimmed);
    let mut problems = Vec::new();
    let (mut resolved, mut hooked, mut through, mut unnamed) = (0, 0, 0, 0);
    let mut mismatches = Vec::new();
    let mut keys: Vec<&(String, i64, i64)> = pp.keys().collect();
    keys.sort();
    for k in keys {
        let (rc, st, sym, _) = &pp[k];
        let Some((src, sst, ssym, sin)) = sp.get(k) else {
            mismatches.push(format!("{} {} {}: not asked under the shim", k.0, k.1, k.2));
            continue;
        };
        if (rc, st) != (src, sst) {
            mismatches.push(format!(
                "{}@{}{}: driver rc {rc} status {st}, shim rc {src} status {sst}",
                k.0,
                k.1,
                if k.2 == 1 { " per-thread" } else { "" }
            ));
            continue;
        }
        if *rc != 0 || sym == "NULL" {
            continue;
        }
        resolved += 1;
        if ssym == sym {
            if *sin {
                hooked += 1;
            } else {
                through += 1;
            }
        } else if *sin && !sym.starts_with(k.0.as_str()) {
            // The driver's pointer lies in no export of that name: nothing to compare with.
            unnamed += 1;
        } else {
            mismatches.push(format!(
                "{}@{}{}: driver {sym}, shim {ssym}{}",
                k.0,
                k.1,
                if k.2 == 1 { " per-thread" } else { "" },
                if *sin { " (hook)" } else { "" }
            ));
        }
    }
    if !mismatches.is_empty() {
        problems.push(format!(
            "{} answers differ from the driver's, e.g. {}",
            mismatches.len(),
            mismatches
                .iter()
                .take(5)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    // Exports: the shim's dlsym answers as the default lookup does; a name hooked by
    // cuGetProcAddress is hooked as an export too.
    let mut inconsistent = Vec::new();
    let mut exports_hooked = 0;
    for (sym, (found, _, _)) in &pe {
        if !found {
            continue;
        }
        let Some((_, d, h)) = se.get(sym) else {
            continue;
        };
        if d != h {
            inconsistent.push(format!(
                "{sym}: default lookup in shim {d}, driver handle in shim {h}"
            ));
        }
        exports_hooked += usize::from(*d);
    }
    for ((base, _, _), (rc, _, ssym, sin)) in &sp {
        if *rc == 0 && *sin && se.get(ssym).is_some_and(|(_, d, _)| !d) {
            inconsistent.push(format!(
                "{base}: hooked by cuGetProcAddress ({ssym}) but not as an export"
            ));
        }
    }
    inconsistent.sort();
    inconsistent.dedup();
    if !inconsistent.is_empty() {
        problems.push(format!(
            "{} exports inconsistent, e.g. {}",
            inconsistent.len(),
            inconsistent
                .iter()
                .take(5)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let missing: Vec<&str> = MUST_HOOK
        .iter()
        .copied()
        .filter(|b| {
            !sp.get(&(b.to_string(), 12000, 0))
                .is_some_and(|(rc, _, _, sin)| *rc == 0 && *sin)
        })
        .collect();
    if !missing.is_empty() {
        problems.push(format!("not hooked at CUDA 12.0: {}", missing.join(", ")));
    }
    let data = json!({
        "queries": pp.len(), "resolved": resolved, "hooked": hooked, "passed_through": through,
        "hook_driver_pointer_unnamed": unnamed, "exports_hooked": exports_hooked,
        "mismatches": mismatches.iter().take(50).collect::<Vec<_>>(),
        "inconsistent_exports": inconsistent.iter().take(50).collect::<Vec<_>>(),
    });
    (problems, data)
}

pub fn resolution(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let list = ctx.bundle.api_list().display().to_string();
    let state = ctx.fresh("procaddr")?;
    let plain = ctx.probe(
        "resolution-plain",
        &["procaddr", &list],
        Side::Gpu,
        &state,
        None,
    )?;
    let shim = Shim {
        state: &state,
        container: "resolution",
        quota: "1GiB",
    };
    let shimmed = ctx.probe(
        "resolution-shim",
        &["procaddr", &list],
        Side::Gpu,
        &state,
        Some(&shim),
    )?;
    for (what, f) in [("without the shim", &plain), ("under the shim", &shimmed)] {
        if !f.ok() {
            bail!("gpu_probe procaddr {what}: {}", f.why());
        }
    }
    let self_in = |f: &Finished| first(&f.json(), "procaddr_self").map(|v| v["in_shim"] == 1);
    let (mut problems, mut data) = compare_resolution(&plain.stdout, &shimmed.stdout);
    if self_in(&shimmed) != Some(true) || self_in(&plain) != Some(false) {
        problems
            .push("cuGetProcAddress(\"cuGetProcAddress\") is not the shim's under the shim".into());
    }
    data["driver_version"] =
        first(&plain.json(), "procaddr_self").map_or(Value::Null, |v| v["driver_version"].clone());
    let passed = format!(
        "{} queries: {} resolved, {} to the shim's hook with the driver's symbol, {} passed through, {} hooks where the driver's pointer names no export; {} exports hooked",
        data["queries"], data["resolved"], data["hooked"], data["passed_through"],
        data["hook_driver_pointer_unnamed"], data["exports_hooked"]
    );
    Ok(Outcome::judged(problems, passed, data))
}

// ---- quota ----

/// What `shim_driver quota PATH` must print under a 1 GiB quota (as `shim_resolution` asserts).
pub fn judge_quota_path(path: &str, f: &HashMap<String, String>) -> Vec<String> {
    let want = [
        ("path", path.to_string()),
        ("total", GIB.to_string()),
        ("free_start", GIB.to_string()),
        ("alloc_600_rc", "0".into()),
        ("free_after_600", (GIB - 600 * MIB).to_string()),
        ("alloc_600_again_rc", CUDA_ERROR_OUT_OF_MEMORY.to_string()),
        ("alloc_300_rc", "0".into()),
        ("free_after_900", (GIB - 900 * MIB).to_string()),
        ("free_end", GIB.to_string()),
    ];
    let mut problems: Vec<String> = want
        .iter()
        .filter(|(k, v)| f.get(*k) != Some(v))
        .map(|(k, v)| {
            format!(
                "{path}: {k}={} (expected {v})",
                f.get(*k).map_or("missing", |s| s.as_str())
            )
        })
        .collect();
    let in_shim = match path {
        "dlsym" => Some("alloc_in_shim"),
        "gpa" | "gpa_v2" | "gpa_v2_ptds" => Some("gpa_self_in_shim"),
        _ => None,
    };
    if let Some(k) = in_shim {
        if f.get(k).map(String::as_str) != Some("1") {
            problems.push(format!("{path}: {k} is not 1"));
        }
    }
    problems
}

pub fn quota_paths(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let mut problems = Vec::new();
    let mut data = serde_json::Map::new();
    for path in ["export", "dlsym", "gpa", "gpa_v2", "gpa_v2_ptds"] {
        let bin = if path == "export" {
            "shim_driver_linked"
        } else {
            "shim_driver"
        };
        let state = ctx.fresh("quota-path")?;
        let shim = Shim {
            state: &state,
            container: "paths",
            quota: "1GiB",
        };
        let f = ctx.run(
            &format!("quota_paths-{path}"),
            &ctx.bundle.bin(bin),
            &["quota", path],
            Side::Gpu,
            &state,
            Some(&shim),
        )?;
        let facts = facts(&f.stdout);
        if !f.ok() || !f.stdout.lines().any(|l| l == "OK") {
            problems.push(format!("{path}: {}", f.why()));
        } else {
            problems.extend(judge_quota_path(path, &facts));
        }
        data.insert(path.into(), json!(facts));
    }
    Ok(Outcome::judged(
        problems,
        "exports, dlsym, cuGetProcAddress v1, v2 and v2 per-thread: 600 MiB granted, the next 600 MiB refused (CUDA_ERROR_OUT_OF_MEMORY), free memory as the quota says",
        Value::Object(data),
    ))
}

/// One `gpu_probe kinds` line under the shim (with `control`, the same kind without it).
pub fn judge_kind(
    v: &Value,
    control: Option<&Value>,
    quota: u64,
) -> Result<Option<String>, String> {
    let kind = v["kind"].as_str().unwrap_or("?");
    let n = |k: &str| v[k].as_i64().unwrap_or(-1);
    let u = |k: &str| v[k].as_u64().unwrap_or(0);
    if n("first_rc") == CUDA_ERROR_NOT_SUPPORTED {
        return Ok(Some(format!("{kind}: not supported by this driver")));
    }
    let first = u("first_mib") * MIB;
    let mut p = Vec::new();
    if n("first_rc") != 0 {
        p.push(format!(
            "the first {} MiB failed ({})",
            u("first_mib"),
            n("first_rc")
        ));
    }
    if kind == "host" {
        if n("second_rc") != 0 || u("free_after_second") != quota {
            p.push("pinned host memory was charged".into());
        }
    } else {
        let used = quota.saturating_sub(u("free_after_first"));
        // Charged what it asked, give or take the driver's rounding to 2 MiB pages.
        if used < first || used > first + 8 * MIB {
            p.push(format!(
                "{} MiB charged for {} MiB",
                used / MIB,
                first / MIB
            ));
        }
        if n("second_rc") != CUDA_ERROR_OUT_OF_MEMORY {
            p.push(format!(
                "past the quota: {} (expected CUDA_ERROR_OUT_OF_MEMORY)",
                n("second_rc")
            ));
        }
        if let Some(c) = control {
            if c["second_rc"].as_i64() != Some(0) {
                p.push(format!(
                    "without the shim the driver refused it too ({})",
                    c["second_rc"]
                ));
            }
        }
    }
    if n("free_rc") != 0 || u("free_end") != quota {
        p.push(format!(
            "after the frees {} MiB free of {} (rc {})",
            u("free_end") / MIB,
            quota / MIB,
            n("free_rc")
        ));
    }
    if p.is_empty() {
        Ok(None)
    } else {
        Err(format!("{kind}: {}", p.join(", ")))
    }
}

pub fn quota_kinds(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let state = ctx.fresh("kinds")?;
    let shim = Shim {
        state: &state,
        container: "kinds",
        quota: "256MiB",
    };
    let f = ctx.probe(
        "quota_kinds-shim",
        &["kinds", "256"],
        Side::Gpu,
        &state,
        Some(&shim),
    )?;
    let control_state = ctx.fresh("kinds-control")?;
    let c = ctx.probe(
        "quota_kinds-plain",
        &["kinds", "256"],
        Side::Gpu,
        &control_state,
        None,
    )?;
    if !f.ok() {
        bail!("gpu_probe kinds under the shim: {}", f.why());
    }
    let (lines, control) = (f.json(), c.json());
    let mut problems = Vec::new();
    let mut notes = Vec::new();
    for v in lines.iter().filter(|v| v["check"] == "kind") {
        let ctl = control
            .iter()
            .find(|c| c["check"] == "kind" && c["kind"] == v["kind"]);
        match judge_kind(v, ctl, 256 * MIB) {
            Ok(Some(note)) => notes.push(note),
            Ok(None) => {}
            Err(e) => problems.push(e),
        }
    }
    if lines.iter().filter(|v| v["check"] == "kind").count() < 7 {
        problems.push(format!("{} kinds reported of 7", lines.len()));
    }
    let passed = if notes.is_empty() {
        "all 7 kinds: charged, refused past 256 MiB, returned; pinned host memory not charged"
            .to_string()
    } else {
        format!(
            "the others charged, refused past 256 MiB, returned; {}",
            notes.join("; ")
        )
    };
    Ok(Outcome::judged(
        problems,
        passed,
        json!({"shim": lines, "control": control}),
    ))
}

pub fn views(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let state = ctx.fresh("views")?;
    let shim = Shim {
        state: &state,
        container: "views",
        quota: "1GiB",
    };
    let f = ctx.probe(
        "views-shim",
        &["views", "100"],
        Side::Gpu,
        &state,
        Some(&shim),
    )?;
    let plain = ctx.probe("views-plain", &["views", "100"], Side::Gpu, &state, None)?;
    let lines = f.json();
    let Some(v) = first(&lines, "views").filter(|_| f.ok()) else {
        bail!("gpu_probe views: {}", f.why());
    };
    let u = |k: &str| v[k].as_u64();
    let mut p = Vec::new();
    if v["nvml_rc"] != 0 {
        p.push(format!("NVML's memory query failed ({})", v["nvml_rc"]));
    }
    if u("cuda_total") != Some(GIB) || u("nvml_total") != Some(GIB) {
        p.push(format!(
            "totals: CUDA {:?}, NVML {:?}, quota {GIB}",
            u("cuda_total"),
            u("nvml_total")
        ));
    }
    if u("cuda_free") != u("nvml_free") {
        p.push(format!(
            "free: CUDA {:?}, NVML {:?}",
            u("cuda_free"),
            u("nvml_free")
        ));
    }
    if u("nvml_used") != Some(100 * MIB) {
        p.push(format!("NVML used {:?} for 100 MiB held", u("nvml_used")));
    }
    Ok(Outcome::judged(
        p,
        "CUDA and NVML both report the 1 GiB quota, the same free memory, and the 100 MiB held as used",
        json!({"shim": v, "plain": first(&plain.json(), "views")}),
    ))
}

pub fn kill9(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let state = ctx.fresh("kill9")?;
    let shim = Shim {
        state: &state,
        container: "victim",
        quota: "1GiB",
    };
    let before = ctx.probe(
        "kill9-nvml-before",
        &["views", "1"],
        Side::Gpu,
        &state,
        None,
    )?;
    let mut cmd = ctx.command(&ctx.bundle.bin("hold_memory"), Side::Gpu, &state);
    cmd.args(["hold", "300"]);
    ctx.shim(&mut cmd, &shim);
    let mut job = runner::spawn(cmd)?;
    job.wait_line(ctx.limit(30), |l| l.contains("\"held\""))
        .context("hold_memory hold 300 under the shim")?;
    let file = state
        .join("libshare/containers/victim")
        .join(libshare_abi::STATE_FILE);
    let held = libshare_abi::State::open_existing(&file)
        .map(|s| s.device(0).used.load(Acquire))
        .with_context(|| format!("the container's state {}", file.display()))?;
    let holding = ctx.probe(
        "kill9-nvml-holding",
        &["views", "1"],
        Side::Gpu,
        &state,
        None,
    )?;
    job.kill_group();
    let done = job.finish(Duration::from_secs(10));
    ctx.log("kill9-job", &done);
    let plain_after = ctx.probe("kill9-nvml-after", &["views", "1"], Side::Gpu, &state, None)?;
    let next = ctx.probe(
        "kill9-next",
        &["views", "100"],
        Side::Gpu,
        &state,
        Some(&shim),
    )?;
    let nvml_used = |f: &Finished| first(&f.json(), "views").and_then(|v| v["nvml_used"].as_u64());
    let next_v = first(&next.json(), "views").cloned().unwrap_or(Value::Null);
    let mut p = Vec::new();
    if held != 300 * MIB {
        p.push(format!("the container held {} MiB, not 300", held / MIB));
    }
    if next_v["cuda_free"].as_u64() != Some(GIB - 100 * MIB) {
        p.push(format!(
            "the container's next process saw {:?} free, not 924 MiB: the killed job's 300 MiB did not come back",
            next_v["cuda_free"].as_u64().map(|b| b / MIB)
        ));
    }
    let mib = |v: Option<u64>| v.map_or("?".to_string(), |b| (b / MIB).to_string());
    let detail = format!(
        "300 MiB charged while held, back in the quota for the container's next process; the device's used memory (NVML, no shim): {} MiB before, {} holding, {} after the kill",
        mib(nvml_used(&before)),
        mib(nvml_used(&holding)),
        mib(nvml_used(&plain_after)),
    );
    Ok(Outcome::judged(
        p,
        detail,
        json!({"held_bytes": held, "next": next_v,
               "nvml_used": [nvml_used(&before), nvml_used(&holding), nvml_used(&plain_after)]}),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolution_compares_the_shim_with_the_driver() {
        let plain = "P cuMemAlloc 12000 0 0 0 cuMemAlloc_v2 0\n\
                     P cuMemAlloc 2000 0 0 0 cuMemAlloc 0\n\
                     P cuCtxGetDevice 12000 0 0 0 cuCtxGetDevice 0\n\
                     P cuNew 12000 0 500 3 NULL 0\n\
                     E cuMemAlloc_v2 1 0 0\nE cuCtxGetDevice 1 0 0\n";
        let good = "P cuMemAlloc 12000 0 0 0 cuMemAlloc_v2 1\n\
                    P cuMemAlloc 2000 0 0 0 cuMemAlloc 1\n\
                    P cuCtxGetDevice 12000 0 0 0 cuCtxGetDevice 0\n\
                    P cuNew 12000 0 500 3 NULL 0\n\
                    E cuMemAlloc_v2 1 1 1\nE cuCtxGetDevice 1 0 0\n";
        let (p, data) = compare_resolution(plain, good);
        // Only the must-hook list is missing from this small table.
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].starts_with("not hooked at CUDA 12.0: cuGetProcAddress,"),
            "{p:?}"
        );
        assert!(!p[0].contains(" cuMemAlloc,"), "{p:?}");
        assert_eq!(
            (data["hooked"].as_u64(), data["passed_through"].as_u64()),
            (Some(2), Some(1))
        );
        // The shim answering with another version than the driver's, a status differing, and an
        // export hooked on one lookup only.
        let bad = "P cuMemAlloc 12000 0 0 0 cuMemAlloc 1\n\
                   P cuMemAlloc 2000 0 0 0 cuMemAlloc 1\n\
                   P cuCtxGetDevice 12000 0 0 0 cuCtxGetDevice 0\n\
                   P cuNew 12000 0 0 0 cuNew 1\n\
                   E cuMemAlloc_v2 1 1 0\nE cuCtxGetDevice 1 0 0\n";
        let (p, data) = compare_resolution(plain, bad);
        let all = p.join(" ");
        assert!(all.contains("2 answers differ"), "{all}");
        assert!(
            all.contains("cuMemAlloc@12000: driver cuMemAlloc_v2, shim cuMemAlloc (hook)"),
            "{all}"
        );
        assert!(
            all.contains("cuNew@12000: driver rc 500 status 3, shim rc 0 status 0"),
            "{all}"
        );
        assert!(
            all.contains("cuMemAlloc_v2: default lookup in shim true, driver handle in shim false"),
            "{all}"
        );
        assert_eq!(data["mismatches"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn quota_path_facts_are_judged_as_shim_resolution_does() {
        let good: HashMap<String, String> = [
            ("path", "gpa".to_string()),
            ("total", GIB.to_string()),
            ("free_start", GIB.to_string()),
            ("alloc_600_rc", "0".into()),
            ("free_after_600", (GIB - 600 * MIB).to_string()),
            ("alloc_600_again_rc", "2".into()),
            ("alloc_300_rc", "0".into()),
            ("free_after_900", (GIB - 900 * MIB).to_string()),
            ("free_end", GIB.to_string()),
            ("gpa_self_in_shim", "1".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert!(judge_quota_path("gpa", &good).is_empty());
        let mut bad = good.clone();
        bad.insert("alloc_600_again_rc".into(), "0".into());
        bad.insert("gpa_self_in_shim".into(), "0".into());
        let p = judge_quota_path("gpa", &bad);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].contains("alloc_600_again_rc=0 (expected 2)"));
    }

    #[test]
    fn kinds_are_charged_refused_and_returned() {
        let q = 256 * MIB;
        let line = |kind: &str, first_rc: i64, after_first: u64, second_rc: i64, end: u64| {
            json!({"kind": kind, "first_mib": 192, "second_mib": 128, "first_rc": first_rc,
                   "free_after_first": after_first, "second_rc": second_rc,
                   "free_after_second": after_first, "free_rc": 0, "free_end": end})
        };
        let control = json!({"second_rc": 0});
        assert_eq!(
            judge_kind(&line("vmm", 0, q - 192 * MIB, 2, q), Some(&control), q),
            Ok(None)
        );
        assert!(judge_kind(&line("vmm", 801, 0, 0, q), None, q)
            .unwrap()
            .unwrap()
            .contains("not supported"));
        // Not charged, or not refused, or not returned: each named.
        let e = judge_kind(&line("array", 0, q, 0, q - MIB), Some(&control), q).unwrap_err();
        assert!(
            e.contains("0 MiB charged for 192 MiB")
                && e.contains("past the quota: 0")
                && e.contains("255 MiB free"),
            "{e}"
        );
        // Pinned host memory is not device memory.
        assert_eq!(judge_kind(&line("host", 0, q, 0, q), None, q), Ok(None));
        assert!(judge_kind(&line("host", 0, q - 192 * MIB, 2, q), None, q).is_err());
    }
}
