//! `sharectl gpu-check OUT_DIR` (issue 33): libshare on a real NVIDIA driver, and simgpu
//! calibrated against it, in one time-boxed run that needs nothing but the driver and the bundle
//! `scripts/gpu-check.sh --bundle` made (sharectl, the shipped shim, the jobs, the driver-API
//! programs, the jobs' PTX, simgpu, the pinned cudart).
//!
//! Every check of [`PLAN`] runs on "the GPU" — the machine's driver, or with `--sim` simgpu
//! standing in for it (its `libcuda.so.1` and NVML found first; the flag chooses the driver and
//! nothing else) — and every figure also on simgpu with its default model beside it, on the same
//! machine. Each check says what only a GPU can show. `report.json` and `summary.md` in OUT_DIR
//! are rewritten after every check, so a run cut short still leaves them, and the run never
//! leaves a process behind (process groups per program, a subreaper at the end) nor changes a GPU
//! setting (it changes none; the last check compares them with the first).

mod calibrate;
mod checks;
mod measures;
mod quota;
pub mod report;
mod resolution;
mod runner;

use crate::platform::StateDir;
use anyhow::{bail, Context};
use report::{CheckResult, Figure, Report, Side, Status};
use serde_json::Value;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// What `sharectl gpu-check` was asked.
pub struct Options {
    pub out: PathBuf,
    pub bundle: Option<PathBuf>,
    pub sim: bool,
    pub short: bool,
    pub budget_s: u64,
    pub python: Option<PathBuf>,
    pub command: String,
}

/// One check of the plan.
pub struct Plan {
    pub name: &'static str,
    pub what: &'static str,
    pub gpu_only: &'static str,
    /// The longest it may take on a GPU (both sides), seconds; it starts only with that much of
    /// the budget left (or `min_s`, for the long benches, which then run what fits).
    pub max_s: u64,
    run: fn(&mut checks::Ctx) -> anyhow::Result<Outcome>,
}

/// What a check found.
pub struct Outcome {
    pub status: Status,
    pub detail: String,
    pub data: Value,
}

impl Outcome {
    pub fn new(status: Status, detail: impl Into<String>, data: Value) -> Outcome {
        Outcome {
            status,
            detail: detail.into(),
            data,
        }
    }

    /// Passed if `problems` is empty, else failed with them.
    pub fn judged(problems: Vec<String>, passed: impl Into<String>, data: Value) -> Outcome {
        if problems.is_empty() {
            Outcome::new(Status::Passed, passed, data)
        } else {
            Outcome::new(Status::Failed, problems.join("; "), data)
        }
    }
}

/// Every check, in the order it runs: what libshare must do on a GPU first, then the
/// calibration, then the benchmarks (the longest last), then the settings and processes.
pub const PLAN: &[Plan] = &[
    Plan {
        name: "platform",
        what: "the GPU, driver and CUDA versions, MIG and MPS, compute mode, per-cgroup NVML memory limits, unified memory",
        gpu_only: "the real driver's answers (on simgpu: its A100 model, driver 605.00, no MIG, no MPS pipe, limits offered)",
        max_s: 90,
        run: checks::platform,
    },
    Plan {
        name: "resolution",
        what: "under the shim, every entry point of the CUDA 12.9/13.5 API list through cuGetProcAddress_v2 (8 versions, default and per-thread) and every export through dlsym gives the symbol the driver gives, as a hook or passed through",
        gpu_only: "which versions and symbols NVIDIA's driver hands out (simgpu's table is built from the same list the shim is checked against)",
        max_s: 120,
        run: resolution::resolution,
    },
    Plan {
        name: "quota_paths",
        what: "an allocation through each way of reaching the driver (exports, dlsym, cuGetProcAddress v1, v2, v2 per-thread) is charged: a second 600 MiB over a 1 GiB quota is refused",
        gpu_only: "that NVIDIA's driver returns what the shim wraps on every path",
        max_s: 90,
        run: quota::quota_paths,
    },
    Plan {
        name: "quota_kinds",
        what: "each allocation kind (cuMemAlloc, pitched, managed, stream-ordered, VMM, arrays) is charged, refused past a 256 MiB quota and returned on free; pinned host memory is not charged; without the shim the driver grants the same",
        gpu_only: "the driver's own sizes and pool behaviour for each kind (the shim charges what it asked)",
        max_s: 60,
        run: quota::quota_kinds,
    },
    Plan {
        name: "views",
        what: "under a 1 GiB quota, cuMemGetInfo and NVML's nvmlDeviceGetMemoryInfo report the same total, free and used",
        gpu_only: "NVML's view beside the real driver's (reserved memory, the context's own)",
        max_s: 45,
        run: quota::views,
    },
    Plan {
        name: "kill9",
        what: "kill -9 of a job holding 300 MiB returns it to its container's quota (the next process of the container sees it free)",
        gpu_only: "that the driver frees a killed process's memory at once (NVML's used, before and after); simgpu frees it when the next process registers",
        max_s: 60,
        run: quota::kill9,
    },
    Plan {
        name: "gate",
        what: "a production and an opportunistic simjob under sharectl daemon (`sharectl bench S1`, exclusive/native/libshare): production keeps ≥ 0.85 of its solo throughput, the opportunistic job progresses",
        gpu_only: "real time slicing between the two processes, and the jobs' spin kernels timing wall-clock (%globaltimer) rather than modelled device time",
        max_s: 120,
        run: measures::gate,
    },
    Plan {
        name: "cal_kernels",
        what: "an empty kernel's time by its waves, and the jobs' spin kernel against what it asked (calibrates cost.kernel_base, cost.wave)",
        gpu_only: "the GPU's launch and wave times (simgpu: 5 us + 10 us per wave)",
        max_s: 60,
        run: measures::cal_kernels,
    },
    Plan {
        name: "cal_copies",
        what: "pinned and pageable host-device copies, device-to-device copies, memsets, a 4 KiB copy (calibrates pcie_bandwidth, hbm_bandwidth, copy_base)",
        gpu_only: "the GPU's PCIe and HBM rates (simgpu: 25 GB/s, 1.5 TB/s; pageable copies as pinned, plus the host's own copy)",
        max_s: 60,
        run: measures::cal_copies,
    },
    Plan {
        name: "cal_slices",
        what: "two processes of 100 us kernels back to back: how long each holds the engine and what a switch costs (calibrates timeslice, ctx_switch)",
        gpu_only: "the GPU's time slice and context-switch cost (simgpu: 2 ms and 25 us, assumed)",
        max_s: 60,
        run: measures::cal_slices,
    },
    Plan {
        name: "cal_managed",
        what: "unified memory: 256 MiB faulted in by the jobs' kernel, one 2 MiB chunk, prefetches to the device and back (calibrates fault, fault_bandwidth, prefetch_bandwidth)",
        gpu_only: "the driver's fault batching and migration rates (simgpu: 20 us + 2 MiB at 12 GB/s per chunk, prefetch at 25 GB/s)",
        max_s: 60,
        run: measures::cal_managed,
    },
    Plan {
        name: "calibration",
        what: "simgpu's assumptions against the measurements; the calibration file written and loaded by simgpu",
        gpu_only: "a calibration worth keeping (on simgpu it gives back the model that ran)",
        max_s: 30,
        run: measures::calibration,
    },
    Plan {
        name: "m1m2_driver",
        what: "M1/M2 through this driver: cuLaunchKernel and cuMemAlloc + cuMemFree of 1 MiB, direct and through the shim, alternating batches",
        gpu_only: "what the shim adds to the real driver's calls (simgpu's own calls cost microseconds of host time)",
        max_s: 60,
        run: measures::m1m2_driver,
    },
    Plan {
        name: "cudart",
        what: "programs built against the pinned cudart 12.9 and 13.5 (carried in the bundle) run plainly and under the shim, which they see as a 1 GiB device",
        gpu_only: "NVIDIA's cudart against NVIDIA's driver through the shim",
        max_s: 60,
        run: checks::cudart,
    },
    Plan {
        name: "pytorch",
        what: "the PyTorch found (it says which) under a 1 GiB quota: OOM is torch.OutOfMemoryError, mem_get_info shows the quota, empty_cache gives it back",
        gpu_only: "PyTorch's own kernels and allocator on the GPU",
        max_s: 150,
        run: checks::pytorch,
    },
    Plan {
        name: "S3",
        what: "`sharectl bench S3` (kernels; exclusive, native, libshare): production inference p99 beside an opportunistic job",
        gpu_only: "the latency a real time slice gives production",
        max_s: 150,
        run: measures::s3,
    },
    Plan {
        name: "S9",
        what: "`sharectl bench S9` (exclusive, native, libshare; --short: exclusive, libshare): production p99 beside N = 1-8 opportunistic processes",
        gpu_only: "the real driver's scheduling between up to 9 processes",
        max_s: 240,
        run: measures::s9,
    },
    Plan {
        name: "S4",
        what: "`sharectl bench S4` (memory oversubscription; needs unified memory): production beside an oversubscribing opportunistic job",
        gpu_only: "the driver's eviction and fault costs under oversubscription",
        max_s: 150,
        run: measures::s4,
    },
    Plan {
        name: "S5",
        what: "`sharectl bench S5` (thrash; needs unified memory; not with --short): two managed jobs 140 % of the device taking turns",
        gpu_only: "the driver's thrashing against libshare's turns",
        max_s: 240,
        run: measures::s5,
    },
    Plan {
        name: "m1m2_instant",
        what: "M1/M2 as BENCHMARKS.md measures them (criterion, the instant driver) on this machine's CPU, if the bundle carries the bench",
        gpu_only: "nothing: no driver is involved; it shows this machine's CPU against the build machine's",
        max_s: 60,
        run: measures::m1m2_instant,
    },
    Plan {
        name: "settings",
        what: "no GPU setting changed (compute mode, MIG as at the start) and no process of the run left behind",
        gpu_only: "the real GPU's settings (on simgpu: its configuration)",
        max_s: 30,
        run: checks::settings,
    },
];

/// Seconds kept back for the last check and the summary.
const RESERVE_S: u64 = 25;

pub fn run(opts: Options) -> anyhow::Result<()> {
    runner::init();
    let started = Instant::now();
    std::fs::create_dir_all(opts.out.join("logs"))
        .with_context(|| format!("cannot create {}", opts.out.display()))?;
    let out = opts
        .out
        .canonicalize()
        .with_context(|| format!("cannot resolve {}", opts.out.display()))?;
    let bundle = Bundle::open(opts.bundle.clone())?;
    let simgpu_lib = crate::platform::ensure_simgpu_lib(&bundle.root)
        .context("the bundle's simgpu (release/libcuda.so)")?;
    let mut report = Report {
        mode: if opts.sim { "sim" } else { "gpu" },
        command: opts.command.clone(),
        started_unix_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        elapsed_s: 0.0,
        budget_s: opts.budget_s,
        bundle: bundle.manifest.clone(),
        platform: Value::Null,
        simgpu_platform: Value::Null,
        checks: Vec::new(),
        figures: Vec::new(),
        calibration: Vec::new(),
        calibration_file: None,
        processes_left: None,
        finished: false,
    };
    report.write(&out)?;
    let deadline = started + Duration::from_secs(opts.budget_s);
    let mut ctx = checks::Ctx::new(opts, bundle, out.clone(), simgpu_lib, deadline)?;
    for plan in PLAN {
        let left = ctx.left().as_secs();
        let reserve = if plan.name == "settings" {
            0
        } else {
            RESERVE_S
        };
        let t0 = Instant::now();
        let outcome = if runner::stopped() {
            Outcome::new(
                Status::NotRun,
                "interrupted (a signal stopped the run)",
                Value::Null,
            )
        } else if left < reserve + plan.max_s.min(if ctx.opts.short { 15 } else { 30 }) {
            Outcome::new(
                Status::NotRun,
                format!(
                    "the time budget ran out ({left} s left of {} s)",
                    ctx.opts.budget_s
                ),
                Value::Null,
            )
        } else {
            ctx.step_deadline =
                Instant::now() + Duration::from_secs((left - reserve).min(plan.max_s));
            (plan.run)(&mut ctx)
                .unwrap_or_else(|e| Outcome::new(Status::Failed, format!("{e:#}"), Value::Null))
        };
        report.checks.push(CheckResult {
            name: plan.name,
            what: plan.what,
            gpu_only: plan.gpu_only,
            status: outcome.status,
            // One line, whatever a program printed into it.
            detail: outcome
                .detail
                .split('\n')
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join(" / "),
            seconds: (t0.elapsed().as_secs_f64() * 10.0).round() / 10.0,
            data: outcome.data,
        });
        ctx.fill(&mut report);
        report.elapsed_s = started.elapsed().as_secs_f64();
        report.write(&out)?;
    }
    // Whatever is still alive now (an interrupted run skips `settings`) is killed and counted.
    let left = runner::reap_all().len();
    report.processes_left = Some(report.processes_left.unwrap_or(0) + left);
    report.finished = !runner::stopped();
    report.elapsed_s = started.elapsed().as_secs_f64();
    report.write(&out)?;
    drop(ctx);
    let failed: Vec<&str> = report
        .checks
        .iter()
        .filter(|c| c.status == Status::Failed)
        .map(|c| c.name)
        .collect();
    println!("{}", out.join("summary.md").display());
    if !failed.is_empty() {
        bail!(
            "failed: {} (see {})",
            failed.join(", "),
            out.join("summary.md").display()
        );
    }
    if runner::stopped() {
        bail!(
            "interrupted; the summary of what ran is in {}",
            out.join("summary.md").display()
        );
    }
    Ok(())
}

/// The bundle: `release/` (sharectl, the simjob-* programs, simgpu's libcuda.so), `dist/`
/// (the shipped shim), `bin/` (the driver-API programs), `cudart/`, `kernels/`, `python/`,
/// `bench/`, and `MANIFEST.json` — laid out like a target directory, so sharectl's defaults
/// (simgpu's lib dir, the jobs next to sharectl) work inside it.
pub struct Bundle {
    pub root: PathBuf,
    pub manifest: Value,
}

impl Bundle {
    /// `dir`, or the directory above the running sharectl's (`<bundle>/release/sharectl`).
    fn open(dir: Option<PathBuf>) -> anyhow::Result<Bundle> {
        let root = match dir {
            Some(d) => d,
            None => std::env::current_exe()
                .context("cannot locate the sharectl binary")?
                .parent()
                .and_then(Path::parent)
                .context("cannot locate the bundle above sharectl (pass --bundle DIR)")?
                .to_path_buf(),
        };
        let manifest_path = root.join("MANIFEST.json");
        let text = std::fs::read_to_string(&manifest_path).with_context(|| {
            format!(
                "{} is not a gpu-check bundle (no MANIFEST.json): make one with scripts/gpu-check.sh --bundle",
                root.display()
            )
        })?;
        let manifest: Value = serde_json::from_str(&text)
            .with_context(|| format!("{}: not JSON", manifest_path.display()))?;
        let root = root.canonicalize()?;
        let b = Bundle { root, manifest };
        for p in [
            b.sharectl(),
            b.shim(),
            b.bin("gpu_probe"),
            b.spin_ptx(),
            b.api_list(),
        ] {
            if !p.is_file() {
                bail!(
                    "the bundle lacks {} (make it again with scripts/gpu-check.sh --bundle)",
                    p.display()
                );
            }
        }
        Ok(b)
    }

    pub fn sharectl(&self) -> PathBuf {
        self.root.join("release/sharectl")
    }

    pub fn jobs_dir(&self) -> PathBuf {
        self.root.join("release")
    }

    pub fn shim(&self) -> PathBuf {
        self.root.join("dist/libshare.so")
    }

    pub fn bin(&self, name: &str) -> PathBuf {
        self.root.join("bin").join(name)
    }

    pub fn spin_ptx(&self) -> PathBuf {
        self.root.join("kernels/spin.ptx")
    }

    pub fn api_list(&self) -> PathBuf {
        self.root.join("cuda_driver_api.txt")
    }

    pub fn python(&self, name: &str) -> PathBuf {
        self.root.join("python").join(name)
    }

    pub fn criterion(&self) -> PathBuf {
        self.root.join("bench/shim_overhead")
    }
}

/// The environment variables a child of the check must not inherit: it gets the shim, its
/// limits and simgpu's model only where the check says so.
fn scrubbed(name: &std::ffi::OsStr) -> bool {
    let n = name.to_string_lossy();
    n == "LD_PRELOAD"
        || n.starts_with("LIBSHARE_")
        || n.starts_with("SIMGPU_")
        || n.starts_with("CUDA_DEVICE_")
        || n == "CUDA_OVERSUBSCRIBE"
        || n == "PYTORCH_CUDA_ALLOC_CONF"
}

/// The caller's `SIMGPU_*` variables (the model of simgpu standing in for the GPU under --sim).
fn simgpu_vars() -> Vec<(OsString, OsString)> {
    std::env::vars_os()
        .filter(|(k, _)| {
            let k = k.to_string_lossy();
            k.starts_with("SIMGPU_") && k != "SIMGPU_STATE_DIR"
        })
        .collect()
}

/// A command with the check's environment: scrubbed, and on simgpu (either side) its library
/// first and a machine of its own (`state`).
fn command(
    program: &Path,
    side: Side,
    sim_mode: bool,
    simgpu_lib: &Path,
    passthrough: &[(OsString, OsString)],
    state: &Path,
) -> Command {
    let mut cmd = Command::new(program);
    for (k, _) in std::env::vars_os() {
        if scrubbed(&k) {
            cmd.env_remove(&k);
        }
    }
    if side == Side::Simgpu || sim_mode {
        let mut ld = OsString::from(simgpu_lib.as_os_str());
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|v| !v.is_empty()) {
            ld.push(":");
            ld.push(old);
        }
        cmd.env("LD_LIBRARY_PATH", ld);
        cmd.env("SIMGPU_STATE_DIR", state.join("simgpu"));
        if side == Side::Gpu {
            cmd.envs(passthrough.iter().map(|(k, v)| (k, v)));
        }
    }
    cmd
}

/// A fresh directory for one program's state, removed with the run's temporary directory.
fn fresh(root: &StateDir, name: &str) -> anyhow::Result<PathBuf> {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let p = root.path().join(format!("{n:03}-{name}"));
    std::fs::create_dir_all(p.join("simgpu"))?;
    Ok(p)
}

impl checks::Ctx {
    /// Copies what the checks gathered into the report.
    fn fill(&self, r: &mut Report) {
        r.platform = self.platform.clone();
        r.simgpu_platform = self.sim_platform.clone();
        r.figures = self.figures.clone();
        r.calibration = self.calibration.clone();
        r.calibration_file = self.calibration_file.clone();
        r.processes_left = self.processes_left;
    }
}

/// `(check, name, unit, gpu, simgpu)` → a figure.
pub fn figure(
    check: &'static str,
    name: impl Into<String>,
    unit: &'static str,
    gpu: Option<f64>,
    simgpu: Option<f64>,
) -> Figure {
    Figure {
        check,
        name: name.into(),
        unit,
        gpu,
        simgpu,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_check_has_a_unique_name_and_says_what_only_a_gpu_shows() {
        let mut names: Vec<&str> = PLAN.iter().map(|p| p.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), PLAN.len());
        assert!(PLAN
            .iter()
            .all(|p| !p.what.is_empty() && !p.gpu_only.is_empty()));
        assert_eq!(PLAN.last().unwrap().name, "settings");
        // The budget (7 minutes by default) stops starting checks; a check started just before
        // it ends runs at most its own limit, which keeps the whole under the 10 minutes a
        // command gets on the lent machine.
        assert!(PLAN.iter().all(|p| p.max_s <= 240));
    }

    #[test]
    fn the_environment_is_scrubbed_and_simgpu_put_first() {
        let lib = Path::new("/b/simgpu/lib");
        let state = Path::new("/s");
        let pass = vec![(OsString::from("SIMGPU_TIMESLICE"), OsString::from("4ms"))];
        let cmd = command(Path::new("/bin/true"), Side::Gpu, true, lib, &pass, state);
        let envs: Vec<(String, Option<String>)> = cmd
            .get_envs()
            .map(|(k, v)| {
                (
                    k.to_string_lossy().into_owned(),
                    v.map(|v| v.to_string_lossy().into_owned()),
                )
            })
            .collect();
        let get = |k: &str| {
            envs.iter()
                .find(|(n, _)| n == k)
                .and_then(|(_, v)| v.clone())
        };
        assert!(get("LD_LIBRARY_PATH").unwrap().starts_with("/b/simgpu/lib"));
        assert_eq!(get("SIMGPU_STATE_DIR").unwrap(), "/s/simgpu");
        assert_eq!(get("SIMGPU_TIMESLICE").unwrap(), "4ms");
        // simgpu beside the GPU runs its default model.
        let cmd = command(
            Path::new("/bin/true"),
            Side::Simgpu,
            true,
            lib,
            &pass,
            state,
        );
        assert!(!cmd
            .get_envs()
            .any(|(k, v)| k == "SIMGPU_TIMESLICE" && v.is_some()));
        // On a GPU, the GPU side gets the system's driver.
        let cmd = command(Path::new("/bin/true"), Side::Gpu, false, lib, &pass, state);
        assert!(!cmd
            .get_envs()
            .any(|(k, v)| k == "LD_LIBRARY_PATH" && v.is_some()));
        assert!(scrubbed(std::ffi::OsStr::new("LD_PRELOAD")));
        assert!(scrubbed(std::ffi::OsStr::new("LIBSHARE_MEMORY_LIMIT")));
        assert!(!scrubbed(std::ffi::OsStr::new("PATH")));
    }
}
