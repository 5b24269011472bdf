//! `sharectl status`: what every container on this node holds, read from the state files the shim
//! writes (`<state dir>/containers/<name>/state.shm`). Works with or without the daemon, needs only
//! read permission on those files (a private view, see `State::open_view`), and only
//! reads: a dead process's memory is shown until a process of its container (or the daemon)
//! reclaims it.

use anyhow::{bail, Context, Result};
use clap::Args;
use libshare_abi::units::format_size;
use libshare_abi::SlotTable;
use libshare_abi::{State, CLASS_OPPORTUNISTIC, MAX_DEVICES};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Acquire;

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// State directory (default: $LIBSHARE_STATE_DIR, else /run/libshare, else /tmp/libshare-<uid>).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// One JSON document instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One container's figures, as JSON.
fn container(name: &str, st: &State) -> Value {
    let class = if st.header().class.load(Acquire) == CLASS_OPPORTUNISTIC {
        "opportunistic"
    } else {
        "production"
    };
    let live = st.live_slots();
    let devices: Vec<Value> = (0..MAX_DEVICES)
        .filter_map(|d| {
            let dev = st.device(d);
            let (quota, used) = (dev.quota.load(Acquire), dev.used.load(Acquire));
            let launches: u64 = live
                .iter()
                .map(|(i, _)| st.slot(*i).launches[d].load(Acquire))
                .sum();
            (quota > 0 || used > 0 || launches > 0).then(|| {
                json!({
                    "device": d, "quota_bytes": quota, "used_bytes": used,
                    "peak_bytes": dev.peak.load(Acquire), "allocs": dev.allocs.load(Acquire),
                    "frees": dev.frees.load(Acquire), "refused_over_quota": dev.oom.load(Acquire),
                    "launches_live_processes": launches,
                })
            })
        })
        .collect();
    let processes: Vec<Value> = live
        .iter()
        .map(|(i, pid)| {
            let s = st.slot(*i);
            let used: u64 = s.used.iter().map(|u| u.load(Acquire)).sum();
            let launches: u64 = s.launches.iter().map(|u| u.load(Acquire)).sum();
            json!({ "pid": pid, "used_bytes": used, "launches": launches })
        })
        .collect();
    json!({ "container": name, "class": class, "devices": devices, "processes": processes })
}

/// The state directory `sharectl status` reads: `--state-dir`, else `$LIBSHARE_STATE_DIR`, else
/// the shim's default.
fn state_dir(arg: Option<PathBuf>) -> PathBuf {
    arg.or_else(|| std::env::var_os("LIBSHARE_STATE_DIR").map(PathBuf::from))
        .unwrap_or_else(libshare_abi::default_state_dir)
}

/// Every container's figures under the state directory `dir`, sorted by name (the JSON objects of
/// `sharectl status --json`), and one error line per state file that could not be read. Used by
/// `status` and by the demo's live numbers.
pub fn read_containers(dir: &Path) -> Result<(Vec<Value>, Vec<String>)> {
    let root = dir.join("containers");
    let mut names: Vec<String> = match std::fs::read_dir(&root) {
        Ok(rd) => rd
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", root.display())),
    };
    names.sort();
    let mut containers = Vec::new();
    let mut errors = Vec::new();
    for name in names {
        let path = libshare_abi::container_dir(dir, &name).join(libshare_abi::STATE_FILE);
        match State::open_view(&path) {
            Ok(st) => containers.push(container(&name, &st)),
            Err(e) => errors.push(format!("container {name}: {e}")),
        }
    }
    Ok((containers, errors))
}

pub fn run(args: StatusArgs) -> Result<()> {
    let dir = state_dir(args.state_dir);
    let (containers, errors) = read_containers(&dir)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &json!({ "state_dir": dir, "containers": containers, "errors": errors })
            )?
        );
    } else {
        for line in table(&dir, &containers) {
            println!("{line}");
        }
        for e in &errors {
            eprintln!("sharectl: {e}");
        }
    }
    if !errors.is_empty() {
        bail!("{} container state file(s) could not be read", errors.len());
    }
    Ok(())
}

/// The `sharectl status` table, one string per line.
pub fn table(dir: &Path, containers: &[Value]) -> Vec<String> {
    if containers.is_empty() {
        return vec![format!(
            "no containers under {} (none has used CUDA with libshare yet)",
            dir.display()
        )];
    }
    let mut lines = vec![format!(
        "{:<20} {:<14} {:>3} {:>10} {:>10} {:>10} {:>8} {:>6}",
        "CONTAINER", "CLASS", "GPU", "USED", "QUOTA", "PEAK", "REFUSED", "PROCS"
    )];
    for c in containers {
        let procs = c["processes"].as_array().map_or(0, |p| p.len());
        let devices = c["devices"].as_array().cloned().unwrap_or_default();
        if devices.is_empty() {
            lines.push(format!(
                "{:<20} {:<14} {:>3} {:>10} {:>10} {:>10} {:>8} {:>6}",
                c["container"].as_str().unwrap_or("?"),
                c["class"].as_str().unwrap_or("?"),
                "-",
                "-",
                "-",
                "-",
                "-",
                procs
            ));
        }
        for d in devices {
            let size = |k: &str| format_size(d[k].as_u64().unwrap_or(0));
            let quota = match d["quota_bytes"].as_u64() {
                Some(0) | None => "none".to_string(),
                Some(q) => format_size(q),
            };
            lines.push(format!(
                "{:<20} {:<14} {:>3} {:>10} {:>10} {:>10} {:>8} {:>6}",
                c["container"].as_str().unwrap_or("?"),
                c["class"].as_str().unwrap_or("?"),
                d["device"].as_u64().unwrap_or(0),
                size("used_bytes"),
                quota,
                size("peak_bytes"),
                d["refused_over_quota"].as_u64().unwrap_or(0),
                procs
            ));
        }
    }
    lines
}
