//! What fraction of a PyTorch training job's kernel time kernel slicing could cut (issue 31,
//! build 3): the job runs on simgpu with `SIMGPU_KERNEL_TRACE`, which names every kernel and the
//! intervals it held the GPU; every shared library of PyTorch's environment is read for the PTX
//! its fatbins carry (`cuda_image::host_fatbins`, `fatbin_ptx`), each PTX module is rewritten
//! (`libshare_slice::rewrite`), and each kernel's time is counted as *sliceable* (a PTX the driver
//! could compile for the device has it, and the rewrite slices it), *refused* (there is PTX, the
//! rewrite says why not) or *no PTX* (only cubins: nothing to rewrite), for sm_80 (A100, simgpu's
//! device), sm_90 (H100/H200) and sm_120 (a Blackwell RTX).
//!
//!     cargo run --release -p libshare-benches --bin sliceable [-- --seconds 8] [--batch 4096]
//!         [--width 2048] [--layers 4] [--wave 200us] [--python PATH] [--json]
//!
//! The job is `jobs/python/torch_train.py` (S8's opportunistic training) with a large batch, so
//! that its GEMMs are the 1–2 ms kernels of issue 31 under `SIMGPU_WAVE` (GPU-bound, as S8 runs
//! it). Which kernels a real GPU runs is the same (the libraries choose them by device and shape;
//! simgpu reports an A100), their times are simgpu's cost model. The PTX read is the files', not
//! what a process loaded: a kernel is matched by name. Builds simgpu first unless
//! `SHARE_TESTS_SKIP_BUILD=1`. Prints a table (or one JSON line with --json).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Parser;
use libshare_slice::{rewrite, Outcome};
use libshare_tests::{torch_python, workspace_root, SimGpu};
use serde_json::{json, Value};

#[derive(Parser)]
struct Args {
    /// Seconds of measured training (after its warm-up).
    #[arg(long, default_value_t = 8.0)]
    seconds: f64,
    #[arg(long, default_value_t = 4096)]
    batch: u32,
    #[arg(long, default_value_t = 2048)]
    width: u32,
    #[arg(long, default_value_t = 4)]
    layers: u32,
    /// simgpu's cost of one wave of blocks (`SIMGPU_WAVE`).
    #[arg(long, default_value = "200us")]
    wave: String,
    /// The Python with PyTorch [default: the venv scripts/fetch-cuda.sh installs].
    #[arg(long)]
    python: Option<PathBuf>,
    #[arg(long)]
    json: bool,
    /// Only list the PTX kernels whose name contains this (with their architectures), and how
    /// many kernel names the PTX declares in all; no job is run.
    #[arg(long, value_name = "TEXT")]
    find: Option<String>,
}

/// The devices reported: A100 (simgpu's), H100/H200, and a Blackwell RTX (sm_120: PyTorch's
/// wheels carry compute_120 PTX for devices newer than their cubins).
const DEVICES: [u32; 3] = [80, 90, 120];

/// What one kernel is on one device.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Status {
    Sliceable,
    Refused(String),
    NoPtx,
}

/// For each kernel name, the PTX modules that define it: (virtual architecture, what the rewrite
/// made of it). Architecture-specific PTX (`sm_90a`) counts only on its own device.
type Found = HashMap<String, Vec<(u32, bool, Status)>>;

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let python = a.python.clone().unwrap_or_else(torch_python);
    if let Some(text) = &a.find {
        let (found, archs) = ptx_of(&libraries(&python)?);
        println!("{} kernel names in PTX modules {archs:?}", found.len());
        let mut by: BTreeMap<String, u64> = BTreeMap::new();
        for defs in found.values() {
            for (_, _, st) in defs {
                *by.entry(format!("{st:?}")).or_default() += 1;
            }
        }
        println!("what the rewrite made of every (kernel, PTX module) pair: {by:?}");
        for (name, defs) in found
            .iter()
            .filter(|(n, _)| n.contains(text.as_str()))
            .take(20)
        {
            let archs: Vec<String> = defs
                .iter()
                .map(|(a, s, st)| format!("{a}{}:{st:?}", if *s { "a" } else { "" }))
                .collect();
            println!("{name}: {}", archs.join(" "));
        }
        return Ok(());
    }
    let times = run_job(&a, &python)?;
    let total: u64 = times.values().map(|t| t.0).sum();
    if total == 0 {
        anyhow::bail!("the job ran no kernel (see its output above)");
    }
    let libs = libraries(&python)?;
    let (found, archs) = ptx_of(&libs);

    let mut rows = Vec::new();
    let mut report = serde_json::Map::new();
    for sm in DEVICES {
        let mut by: BTreeMap<Status, u64> = BTreeMap::new();
        let mut kernels: Vec<(u64, u64, &String, Status)> = Vec::new();
        for (name, (ns, n)) in &times {
            let status = status_on(found.get(name), sm);
            *by.entry(status.clone()).or_default() += ns;
            kernels.push((*ns, *n, name, status));
        }
        kernels.sort_by_key(|k| std::cmp::Reverse(k.0));
        let frac = |s: &Status| by.get(s).copied().unwrap_or(0) as f64 / total as f64;
        let refused: u64 = by
            .iter()
            .filter(|(s, _)| matches!(s, Status::Refused(_)))
            .map(|(_, ns)| ns)
            .sum();
        rows.push(format!(
            "| sm_{sm} | {:.3} | {:.3} | {:.3} |",
            frac(&Status::Sliceable),
            refused as f64 / total as f64,
            frac(&Status::NoPtx)
        ));
        report.insert(
            format!("sm_{sm}"),
            json!({
                "sliceable": frac(&Status::Sliceable),
                "refused": refused as f64 / total as f64,
                "no_ptx": frac(&Status::NoPtx),
                "refusals": by.iter().filter_map(|(s, ns)| match s {
                    Status::Refused(why) => Some((why.clone(), json!(*ns as f64 / total as f64))),
                    _ => None,
                }).collect::<serde_json::Map<_, _>>(),
                "top": kernels.iter().take(12).map(|(ns, n, name, s)| json!({
                    "kernel": name, "share": *ns as f64 / total as f64, "status": format!("{s:?}"),
                    "mean_us": *ns as f64 / (*n).max(1) as f64 / 1e3,
                })).collect::<Vec<Value>>(),
            }),
        );
    }
    let launches: u64 = times.values().map(|t| t.1).sum();
    report.insert("kernel_ms".into(), json!(total as f64 / 1e6));
    report.insert("launches".into(), json!(launches));
    report.insert("kernels".into(), json!(times.len()));
    report.insert("libraries".into(), json!(libs.len()));
    report.insert(
        "ptx_modules_by_arch".into(),
        json!(archs
            .iter()
            .map(|(a, n)| (format!("compute_{a}"), json!(n)))
            .collect::<serde_json::Map<_, _>>()),
    );
    let with_any_ptx = times.keys().filter(|k| found.contains_key(*k)).count();
    report.insert("kernels_with_ptx_of_any_arch".into(), json!(with_any_ptx));
    if a.json {
        println!("{}", Value::Object(report));
        return Ok(());
    }
    println!(
        "{} kernels, {launches} launches, {:.1} ms of kernel time; {} libraries read, PTX modules by \
         architecture: {}; kernels of the job with PTX of any architecture: {}\n",
        times.len(),
        total as f64 / 1e6,
        libs.len(),
        report["ptx_modules_by_arch"],
        report["kernels_with_ptx_of_any_arch"],
    );
    println!("| device | sliceable | PTX, refused | no PTX |\n|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
    for sm in DEVICES {
        let sm = format!("sm_{sm}");
        println!("\n{sm}: refusals by reason, and the kernels with the most time");
        let r = &report[&sm];
        for (why, share) in r["refusals"].as_object().unwrap() {
            println!("  refused {share:.4}: {why}");
        }
        for k in r["top"].as_array().unwrap() {
            println!(
                "  {:.4} {:>8.0} us {} {}",
                k["share"].as_f64().unwrap(),
                k["mean_us"].as_f64().unwrap(),
                k["status"].as_str().unwrap(),
                k["kernel"].as_str().unwrap()
            );
        }
    }
    Ok(())
}

/// Runs the training job on simgpu and returns, per kernel name, the ns it held the GPU and its
/// launches.
fn run_job(a: &Args, python: &Path) -> anyhow::Result<HashMap<String, (u64, u64)>> {
    let trace = tempfile::NamedTempFile::new()?;
    let gpu = SimGpu::new()
        .env("SIMGPU_WAVE", &a.wave)
        .env("SIMGPU_KERNEL_TRACE", trace.path())
        .timeout(std::time::Duration::from_secs_f64(a.seconds * 4.0 + 300.0));
    let script = workspace_root().join("jobs/python/torch_train.py");
    let mut cmd = Command::new(python);
    cmd.arg(&script).args([
        "--duration",
        &a.seconds.to_string(),
        "--warmup",
        "1",
        "--batch",
        &a.batch.to_string(),
        "--width",
        &a.width.to_string(),
        "--layers",
        &a.layers.to_string(),
    ]);
    let out = gpu.run(cmd);
    if !out.status.success() {
        anyhow::bail!(
            "the training job failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut times: HashMap<String, (u64, u64)> = HashMap::new();
    for line in std::fs::read_to_string(trace.path())?.lines() {
        let v: Value = serde_json::from_str(line)?;
        let Some(name) = v["name"].as_str() else {
            continue; // not a kernel
        };
        let held: u64 = v["slices"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| Some(s[1].as_u64()? - s[0].as_u64()?))
            .sum();
        let t = times.entry(name.to_owned()).or_default();
        t.0 += held;
        t.1 += 1;
    }
    Ok(times)
}

/// Every shared library of the job's Python environment that may hold kernels: torch's own and
/// NVIDIA's wheels'.
fn libraries(python: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let out = Command::new(python)
        .args([
            "-c",
            "import site; print('\\n'.join(site.getsitepackages()))",
        ])
        .output()?;
    let mut libs = Vec::new();
    for site in String::from_utf8_lossy(&out.stdout).lines() {
        let site = Path::new(site);
        let mut dirs = vec![site.join("torch/lib")];
        if let Ok(rd) = std::fs::read_dir(site.join("nvidia")) {
            dirs.extend(rd.flatten().map(|e| e.path().join("lib")));
        }
        for d in dirs {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                let p = e.path();
                if p.file_name()
                    .is_some_and(|n| n.to_string_lossy().contains(".so"))
                {
                    libs.push(p);
                }
            }
        }
    }
    libs.sort();
    Ok(libs)
}

/// The PTX modules of every library, each rewritten; per kernel name, what each PTX made of it;
/// and how many PTX modules there are of each virtual architecture.
fn ptx_of(libs: &[PathBuf]) -> (Found, BTreeMap<u32, u64>) {
    let mut found = Found::new();
    let mut archs = BTreeMap::new();
    for lib in libs {
        let Ok(bytes) = std::fs::read(lib) else {
            continue;
        };
        let Ok(fatbins) = cuda_image::host_fatbins(&bytes) else {
            continue;
        };
        for fat in fatbins {
            let Ok(modules) = cuda_image::fatbin_ptx(fat) else {
                eprintln!("{}: a fatbin could not be read", lib.display());
                continue;
            };
            for m in modules {
                *archs.entry(m.arch).or_default() += 1;
                let specific = m
                    .text
                    .lines()
                    .find_map(|l| l.trim().strip_prefix(".target"))
                    .is_some_and(|t| t.split(',').next().unwrap_or("").trim().ends_with('a'));
                match rewrite(&m.text) {
                    Ok(r) => {
                        for k in r.kernels {
                            let s = match k.outcome {
                                Outcome::Sliced { .. } => Status::Sliceable,
                                Outcome::Whole(why) => {
                                    Status::Refused(refusal_kind(&why.to_string()))
                                }
                            };
                            found.entry(k.name).or_default().push((m.arch, specific, s));
                        }
                    }
                    Err(e) => {
                        for name in entry_names(&m.text) {
                            found.entry(name).or_default().push((
                                m.arch,
                                specific,
                                Status::Refused(format!(
                                    "module not read: {}",
                                    refusal_kind(&e.to_string())
                                )),
                            ));
                        }
                    }
                }
            }
        }
    }
    (found, archs)
}

/// A reason without the names in it (so refusals group).
fn refusal_kind(why: &str) -> String {
    why.split_whitespace()
        .map(|w| {
            if w.contains('_') || w.chars().any(|c| c.is_ascii_digit()) {
                "…"
            } else {
                w
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn entry_names(text: &str) -> Vec<String> {
    text.split(".entry")
        .skip(1)
        .filter_map(|rest| {
            let name: String = rest
                .trim_start()
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '$')
                .collect();
            (!name.is_empty()).then_some(name)
        })
        .collect()
}

/// What a kernel is on a device of compute capability `sm`: sliceable if any PTX the driver could
/// compile for it slices it; else refused if there is such PTX; else no PTX.
fn status_on(ptx: Option<&Vec<(u32, bool, Status)>>, sm: u32) -> Status {
    let usable: Vec<&Status> = ptx
        .into_iter()
        .flatten()
        .filter(|(arch, specific, _)| if *specific { *arch == sm } else { *arch <= sm })
        .map(|(_, _, s)| s)
        .collect();
    usable.iter().min().map_or(Status::NoPtx, |s| (*s).clone())
}
