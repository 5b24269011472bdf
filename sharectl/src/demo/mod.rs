//! `sharectl demo`: a production and an opportunistic job on one GPU (real, or simgpu).
//!
//! It shows what libshare enforces today and what it does not yet. Both jobs run under the shim
//! (`libshare.so`, preloaded) as two containers with memory quotas, "prod" (production) and
//! "batch" (opportunistic), in a state directory private to the run; the live numbers include
//! each container's memory, read from the shim's state files as `sharectl status` reads them.
//! Phase 1 runs the production job alone for its solo throughput; phase 2 runs it next to an
//! opportunistic job that keeps the GPU busy, and a second batch worker tries to grow the batch
//! container past its quota (the shim refuses it). Phase 2 shares compute natively (no daemon:
//! every gate is open), so it shows the harm; phase 3 runs the same pair under a private
//! `sharectl daemon` (policy `libshare`): production back to about its solo throughput, the
//! opportunistic job in the GPU time production leaves idle. The jobs are the ordinary CUDA
//! programs of the `jobs` crate, started as child processes; the demo reads their JSON lines.
//!
//! `run` runs the phases (the jobs, the daemon, the second batch worker), `view` prints them
//! (text or JSON lines); this module holds what both know: the jobs and containers the demo
//! runs and what a phase measured.

mod run;
mod view;

pub use run::{run, Options};
pub use view::StdoutClosed;

use crate::platform::StateDir;
use jobs::profiles::{Train, TRAIN};
use libshare_abi::units::format_size;
use serde_json::Value;
use std::ffi::OsString;
use std::path::PathBuf;

/// The production job: the shared training profile (6 ms of GPU then 4 ms of CPU per
/// iteration), holding 512 MiB instead of its 256 MiB.
const PRODUCTION: Train = TRAIN.with_mem_mib(512);

/// GPU time per production iteration.
const PRODUCTION_GPU_MS: f64 = PRODUCTION.gpu_ms;

/// The opportunistic job: best-effort training with no host gap, i.e. back-to-back kernels
/// (4 in flight, then a sync): it takes all the GPU time it can get.
const OPPORTUNISTIC: Train = Train {
    gpu_ms: 8.0,
    kernels: 4,
    cpu_ms: 0.0,
    mem_mib: 384,
};

/// GPU time per opportunistic iteration, and its kernels.
const OPPORTUNISTIC_GPU_MS: f64 = OPPORTUNISTIC.gpu_ms;
const OPPORTUNISTIC_KERNELS: f64 = OPPORTUNISTIC.kernels as f64;

/// A second worker of the batch container, started in phase 2: it asks for more memory than is
/// left of the container's quota (384 MiB held + 256 MiB > 512 MiB).
const GROW: (&str, &[&str]) = (
    "simjob-train",
    &[
        "--mem",
        "256MiB",
        "--iters",
        "1",
        "--gpu-ms",
        "1",
        "--kernels",
        "1",
        "--cpu-ms",
        "0",
        "--report-interval",
        "0",
    ],
);

/// What the second batch worker asks for (its `--mem`).
const GROW_BYTES: u64 = 256 << 20;

/// A libshare container of the demo: its name, class and memory quota (the shim's variables).
#[derive(Clone, Copy, Debug)]
struct Container {
    name: &'static str,
    class: &'static str,
    quota: &'static str,
}

impl Container {
    /// The quota as `sharectl status` prints sizes (`512 MiB`).
    fn quota_text(&self) -> String {
        libshare_abi::units::parse_size(self.quota)
            .map(format_size)
            .unwrap_or_else(|| self.quota.to_string())
    }
}

const PROD: Container = Container {
    name: "prod",
    class: "production",
    quota: "2GiB",
};

const BATCH: Container = Container {
    name: "batch",
    class: "opportunistic",
    quota: "512MiB",
};

/// The shim, preloaded into every job, with a state directory private to this demo run.
struct Shim {
    lib: PathBuf,
    state: StateDir,
}

impl Shim {
    /// The shim's variables for a process of container `c`.
    fn env(&self, c: Container) -> Vec<(String, OsString)> {
        vec![
            ("LD_PRELOAD".into(), self.lib.clone().into()),
            ("LIBSHARE_STATE_DIR".into(), self.state.path().into()),
            ("LIBSHARE_CONTAINER".into(), c.name.into()),
            ("LIBSHARE_CLASS".into(), c.class.into()),
            ("LIBSHARE_MEMORY_LIMIT".into(), c.quota.into()),
        ]
    }
}

/// Why the demo runs without the shim.
enum NoShim {
    /// `--no-shim`.
    Asked,
    /// Not built: where it was looked for.
    NotFound(Vec<PathBuf>),
}

impl NoShim {
    /// Why, and what to do about it, one line each.
    fn lines(&self) -> Vec<String> {
        match self {
            NoShim::Asked => vec!["--no-shim: the jobs run without libshare".into()],
            NoShim::NotFound(paths) => vec![
                format!(
                    "libshare.so not found (looked for {})",
                    paths
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                "build it: cargo build --release -p libshare (or scripts/build-shim.sh for target/dist/libshare.so)".into(),
                "running without the shim: no memory quotas, no per-container numbers".into(),
            ],
        }
    }
}

/// What one phase measured.
struct PhaseResult {
    /// The production job's final line.
    production: Value,
    /// The opportunistic job's throughput while the production job ran, if it ran.
    opportunistic: Option<OppRate>,
    /// The containers (as `sharectl status --json` shows them) late in the phase, while the jobs
    /// still held their memory; None without the shim.
    containers: Option<Vec<Value>>,
    /// What happened to the second batch worker (phase 2, with the shim).
    grow: Option<Grow>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct OppRate {
    iters_per_s: f64,
    gpu_ms_per_s: f64,
}

impl OppRate {
    fn from_iters(iters_per_s: f64) -> OppRate {
        OppRate {
            iters_per_s,
            gpu_ms_per_s: iters_per_s * OPPORTUNISTIC_GPU_MS,
        }
    }
}

/// The second batch worker's outcome.
#[derive(Clone, Debug)]
struct Grow {
    /// Its allocation failed with CUDA_ERROR_OUT_OF_MEMORY.
    refused: bool,
    /// Its error line, or what happened.
    message: String,
}
