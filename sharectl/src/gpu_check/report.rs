//! What `sharectl gpu-check` writes: `report.json` (typed, serde) and `summary.md`, rewritten
//! after every step so that a run cut short still leaves both.

use serde::Serialize;
use serde_json::Value;
use std::fmt::Write as _;
use std::path::Path;

/// Where a check ran: the machine's driver ("the GPU"; simgpu standing in for it under `--sim`),
/// or simgpu with its default model beside it, on the same machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Side {
    Gpu,
    Simgpu,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Every assertion of the check held.
    Passed,
    /// One did not (the detail says which).
    Failed,
    /// Figures only: nothing to pass or fail.
    Measured,
    /// Not available on this machine (no unified memory, no PyTorch, no nvidia-smi).
    Unavailable,
    /// Not run: the time budget, an interruption, a step before it that it needs.
    NotRun,
}

impl Status {
    fn word(self) -> &'static str {
        match self {
            Status::Passed => "passed",
            Status::Failed => "**FAILED**",
            Status::Measured => "measured",
            Status::Unavailable => "unavailable",
            Status::NotRun => "not run",
        }
    }
}

/// One check of the plan, with its result.
#[derive(Clone, Debug, Serialize)]
pub struct CheckResult {
    pub name: &'static str,
    /// What it shows.
    pub what: &'static str,
    /// What only a GPU can show (on simgpu this check shows simgpu's answer instead).
    pub gpu_only: &'static str,
    pub status: Status,
    /// One line: why it failed, what it measured, why it did not run.
    pub detail: String,
    pub seconds: f64,
    /// The raw results it judged (probe lines, bench rows).
    pub data: Value,
}

/// One figure, on the GPU and on simgpu beside it.
#[derive(Clone, Debug, Serialize)]
pub struct Figure {
    /// The check that measured it.
    pub check: &'static str,
    pub name: String,
    pub unit: &'static str,
    pub gpu: Option<f64>,
    pub simgpu: Option<f64>,
}

/// One row of "simgpu's assumption vs the GPU's measurement".
#[derive(Clone, Debug, Serialize)]
pub struct CalibrationRow {
    /// simgpu's key (`cost.timeslice`) and variable.
    pub key: &'static str,
    pub variable: &'static str,
    /// What is measured, and how it maps onto the key.
    pub measure: &'static str,
    pub unit: &'static str,
    /// simgpu's value (its default model).
    pub assumed: f64,
    /// The measure on simgpu (default model) and on the GPU, in `unit`.
    pub simgpu_measured: Option<f64>,
    pub gpu_measured: Option<f64>,
    /// The value written to the calibration file, in `unit` (None: kept as assumed).
    pub calibrated: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// `gpu`, or `sim` (a dry run: simgpu stood in for the GPU).
    pub mode: &'static str,
    pub command: String,
    pub started_unix_s: u64,
    pub elapsed_s: f64,
    pub budget_s: u64,
    pub bundle: Value,
    /// `gpu_probe info` on each side.
    pub platform: Value,
    pub simgpu_platform: Value,
    pub checks: Vec<CheckResult>,
    pub figures: Vec<Figure>,
    pub calibration: Vec<CalibrationRow>,
    /// The calibration file (in the output directory), once written.
    pub calibration_file: Option<String>,
    /// Processes of the run still alive at the end (killed then): 0 is the only good answer.
    pub processes_left: Option<usize>,
    pub finished: bool,
}

impl Report {
    pub fn write(&self, out: &Path) -> std::io::Result<()> {
        let json = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        atomic_write(&out.join("report.json"), json.as_bytes())?;
        atomic_write(&out.join("summary.md"), self.markdown().as_bytes())
    }

    fn sim(&self) -> bool {
        self.mode == "sim"
    }

    fn gpu_label(&self) -> &'static str {
        if self.sim() {
            "GPU (simgpu standing in)"
        } else {
            "GPU"
        }
    }

    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let p = &self.platform;
        let name = p["name"].as_str().unwrap_or("(no GPU answered)");
        if self.sim() {
            let _ = writeln!(s, "# gpu-check: dry run on simgpu (no GPU)\n");
            let _ = writeln!(
                s,
                "> **Dry run.** `--sim`: simgpu's `libcuda.so.1` and NVML stood in for the driver. \
                 Every figure below is simgpu's; nothing here was measured on a GPU. What only a \
                 GPU can show is named under each check.\n"
            );
        } else {
            let _ = writeln!(s, "# gpu-check: {name}\n");
        }
        let _ = writeln!(
            s,
            "`{}` — {:.0} s of a {} s budget{}; bundle {}.\n",
            self.command,
            self.elapsed_s,
            self.budget_s,
            if self.finished {
                ""
            } else {
                " (**cut short**: the summary of what ran)"
            },
            self.bundle["commit"].as_str().unwrap_or("?")
        );
        self.platform_md(&mut s);
        self.checks_md(&mut s);
        self.figures_md(&mut s);
        self.calibration_md(&mut s);
        s
    }

    fn platform_md(&self, s: &mut String) {
        let p = &self.platform;
        if p.is_null() {
            let _ = writeln!(
                s,
                "## Platform\n\nThe driver did not answer (see the `platform` check).\n"
            );
            return;
        }
        let _ = writeln!(s, "## Platform\n\n| | |\n|---|---|");
        for (k, v) in platform_rows(p) {
            let _ = writeln!(s, "| {k} | {v} |");
        }
        let _ = writeln!(s);
    }

    fn checks_md(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "## Checks\n\n| check | result | what it shows | detail |\n|---|---|---|---|"
        );
        for c in &self.checks {
            let _ = writeln!(
                s,
                "| `{}` | {} | {} | {} |",
                c.name,
                c.status.word(),
                c.what,
                c.detail.replace('|', "/").replace('\n', " ")
            );
        }
        let _ = writeln!(
            s,
            "\nWhat only a GPU shows{}:\n",
            if self.sim() {
                " (in this dry run each check showed simgpu's answer instead)"
            } else {
                ""
            }
        );
        for c in &self.checks {
            let _ = writeln!(s, "- `{}`: {}", c.name, c.gpu_only);
        }
        let _ = writeln!(s);
    }

    fn figures_md(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "## Figures: {} beside simgpu (default model, same machine)\n\n| check | figure | {} | simgpu | ratio |\n|---|---|---|---|---|",
            self.gpu_label(),
            self.gpu_label()
        );
        for f in &self.figures {
            let ratio = match (f.gpu, f.simgpu) {
                (Some(g), Some(m)) if m != 0.0 => format!("{:.2}", g / m),
                _ => "-".into(),
            };
            let _ = writeln!(
                s,
                "| {} | {} ({}) | {} | {} | {} |",
                f.check,
                f.name,
                f.unit,
                fmt(f.gpu),
                fmt(f.simgpu),
                ratio
            );
        }
        let _ = writeln!(s);
    }

    fn calibration_md(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "## simgpu's assumption vs the {}'s measurement\n",
            if self.sim() { "stand-in" } else { "GPU" }
        );
        if self.calibration.is_empty() {
            let _ = writeln!(s, "No calibration: its measurements did not run.\n");
            return;
        }
        let _ = writeln!(
            s,
            "| simgpu key (variable) | measure | assumed | simgpu measured | {} measured | calibrated |\n|---|---|---|---|---|---|",
            self.gpu_label()
        );
        for r in &self.calibration {
            let _ = writeln!(
                s,
                "| `{}` (`{}`) | {} | {} {} | {} | {} | {} |",
                r.key,
                r.variable,
                r.measure,
                fmt(Some(r.assumed)),
                r.unit,
                fmt(r.simgpu_measured),
                fmt(r.gpu_measured),
                r.calibrated
                    .map_or("kept".into(), |v| format!("{} {}", fmt(Some(v)), r.unit))
            );
        }
        match &self.calibration_file {
            Some(f) => {
                let _ = writeln!(
                    s,
                    "\nCalibration file: `{f}` — `SIMGPU_CONFIG={f}` makes simgpu model this GPU \
                     (each value: simgpu's assumption moved by the difference, or the ratio for \
                     rates, between the GPU's measurement and simgpu's own by the same method)."
                );
            }
            None => {
                let _ = writeln!(s, "\nNo calibration file was written.");
            }
        }
    }
}

/// The platform table's rows from `gpu_probe info`'s line.
pub fn platform_rows(p: &Value) -> Vec<(&'static str, String)> {
    let text = |k: &str| p[k].as_str().unwrap_or("?").to_string();
    let int = |k: &str| p[k].as_i64();
    let mut rows = vec![
        (
            "GPU",
            format!(
                "{} ({} GiB, {} SMs, compute capability {}, {})",
                text("name"),
                p["memory_bytes"]
                    .as_f64()
                    .map_or("?".into(), |b| format!("{:.1}", b / (1u64 << 30) as f64)),
                int("sms").map_or("?".into(), |v| v.to_string()),
                text("cc"),
                text("uuid")
            ),
        ),
        (
            "devices",
            int("devices").map_or("?".into(), |v| v.to_string()),
        ),
        (
            "driver",
            format!("{} (`{}`)", text("driver_version"), text("libcuda")),
        ),
        (
            "CUDA version (cuDriverGetVersion)",
            int("cuda_driver_version")
                .map_or("?".into(), |v| format!("{}.{}", v / 1000, (v % 1000) / 10)),
        ),
    ];
    let mig = match (int("mig_rc"), int("mig_current")) {
        (Some(0), Some(1)) => "enabled".to_string(),
        (Some(0), _) => "disabled".to_string(),
        (Some(3), _) | (Some(-1), _) => "not supported".to_string(),
        (rc, _) => format!("unknown (nvmlDeviceGetMigMode returned {rc:?})"),
    };
    rows.push(("MIG", mig));
    rows.push((
        "MPS",
        if p["mps_control_pipe"] == true {
            format!(
                "a control daemon's pipe is at {}",
                text("mps_pipe_directory")
            )
        } else {
            format!(
                "no control daemon (no pipe in {})",
                text("mps_pipe_directory")
            )
        },
    ));
    rows.push((
        "compute mode",
        match int("compute_mode") {
            Some(0) => "default (shared)".into(),
            Some(1) => "exclusive thread".into(),
            Some(2) => "prohibited".into(),
            Some(3) => "exclusive process: one process at a time, no sharing".into(),
            v => format!("{v:?}"),
        },
    ));
    rows.push((
        "per-cgroup NVML memory limits (r615+)",
        if p["memory_limits_set"] == true {
            "offered (nvmlDeviceSetMemoryLimits_v1 exported)".into()
        } else {
            "not offered (no nvmlDeviceSetMemoryLimits_v1)".into()
        },
    ));
    rows.push((
        "unified memory",
        match (int("managed_memory"), int("concurrent_managed_access")) {
            (Some(1), Some(1)) => {
                "managed memory with GPU page faults (concurrent managed access)".into()
            }
            (Some(1), _) => "managed memory without concurrent access (no GPU page faults)".into(),
            _ => "no managed memory".into(),
        },
    ));
    rows
}

fn fmt(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(0.0) => "0".into(),
        Some(v) if v.abs() >= 100.0 => format!("{v:.0}"),
        Some(v) if v.abs() >= 1.0 => format!("{v:.2}"),
        Some(v) => format!("{v:.4}"),
    }
}

/// Writes `path` (0644) through the one atomic writer: a reader never sees half a report, a
/// crash leaves the old one.
///
/// OUT_DIR is the operator's own choice (a team's `2775` directory, another user's home under
/// `sudo`), so it is reached as an existing directory of another program's
/// (`WriteDir::Unchecked`), not walked with the checks of libshare's own host files.
pub fn atomic_write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    libshare_abi::fsafe::write_atomic_in(
        libshare_abi::fsafe::WriteDir::Unchecked,
        path,
        bytes,
        0o644,
    )
    .map_err(|e| std::io::Error::other(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn platform_rows_name_mig_mps_mode_and_limits() {
        let p = serde_json::json!({
            "name": "NVIDIA H100 80GB HBM3", "memory_bytes": 85520809984u64, "sms": 132,
            "cc": "9.0", "uuid": "GPU-1", "devices": 1, "driver_version": "580.159",
            "libcuda": "/usr/lib/libcuda.so.1", "cuda_driver_version": 13000,
            "mig_rc": 0, "mig_current": 0, "mps_control_pipe": false,
            "mps_pipe_directory": "/tmp/nvidia-mps", "compute_mode": 3,
            "memory_limits_set": false, "managed_memory": 1, "concurrent_managed_access": 1
        });
        let rows: std::collections::HashMap<_, _> = platform_rows(&p).into_iter().collect();
        assert!(rows["GPU"].starts_with("NVIDIA H100 80GB HBM3 (79.6 GiB, 132 SMs"));
        assert_eq!(rows["CUDA version (cuDriverGetVersion)"], "13.0");
        assert_eq!(rows["MIG"], "disabled");
        assert!(rows["MPS"].starts_with("no control daemon"));
        assert!(rows["compute mode"].starts_with("exclusive process"));
        assert!(rows["per-cgroup NVML memory limits (r615+)"].starts_with("not offered"));
    }
}
