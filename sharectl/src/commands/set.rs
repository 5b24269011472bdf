//! `sharectl set`, `get`, `reset`: a container's settings through the daemon's admin socket
//! (`<state dir>/admin.sock`, root only). The daemon applies a change to the container's state
//! file before it answers (a running job sees it at its next allocation or launch) and keeps it
//! across restarts. `set --offline` writes the state file directly, without a daemon (the
//! setting then does not persist, and a daemon started later overrides it with its own).

use anyhow::{Context, Result};
use clap::Args;
use libshare_abi::admin::{self, ContainerReport, Request, SetRequest};
use libshare_abi::names::escape;
use libshare_abi::units::format_size;
use libshare_abi::{Class, State};
use std::path::PathBuf;

use crate::admin::{ask, class_parser, parse_compute, parse_memory};

#[derive(Args, Debug)]
pub struct SetArgs {
    /// The container's name (its directory under <state dir>/containers).
    pub container: String,
    /// State directory (default: $LIBSHARE_STATE_DIR, else /run/libshare, else
    /// /tmp/libshare-<uid>).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Only this GPU (default: every GPU).
    #[arg(long)]
    pub device: Option<u32>,
    /// Memory quota: 8GiB, 512MiB, 8Gi (GB/MB are powers of 10).
    #[arg(long, value_parser = parse_memory)]
    pub memory: Option<u64>,
    /// Compute share of an opportunistic container: 30% or 30 (0 or 100% = no limit).
    #[arg(long, value_parser = parse_compute)]
    pub compute: Option<u32>,
    /// Weight among the opportunistic containers of a GPU (0 = 1).
    #[arg(long)]
    pub weight: Option<u32>,
    /// Class (overrides the container's LIBSHARE_CLASS from now on).
    #[arg(long, value_parser = class_parser())]
    pub class: Option<Class>,
    /// While opportunistic, the container's allocations become managed memory and its quota
    /// may exceed the GPU's memory (overrides its CUDA_OVERSUBSCRIBE from now on).
    #[arg(long)]
    pub oversubscribe: bool,
    /// The container's allocations stay device memory (the default).
    #[arg(long, conflicts_with = "oversubscribe")]
    pub no_oversubscribe: bool,
    /// Write the state file directly, without a daemon (not persisted).
    #[arg(long)]
    pub offline: bool,
}

/// `get` and `reset`.
#[derive(Args, Debug)]
pub struct NameArgs {
    /// The container's name.
    pub container: String,
    /// State directory (default: $LIBSHARE_STATE_DIR, else /run/libshare, else
    /// /tmp/libshare-<uid>).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Print the daemon's answer as JSON.
    #[arg(long)]
    pub json: bool,
}

fn print(r: &ContainerReport, json: bool) {
    if json {
        println!("{}", serde_json::to_string(r).expect("a report serialises"));
        return;
    }
    let class = r.class.map_or("-", Class::name);
    let set = toml_line(&r.settings);
    println!(
        "{}: class {class}{}; settings: {set}",
        escape(&r.container),
        if r.present { "" } else { " (not started)" }
    );
    for d in &r.devices {
        println!(
            "  gpu {}: {} used of {}{}{}",
            d.device,
            format_size(d.used),
            if d.quota == 0 {
                "no quota".to_string()
            } else {
                format_size(d.quota)
            },
            if d.compute == 0 {
                String::new()
            } else {
                format!(", compute {:.1}%", d.compute as f64 / 100.0)
            },
            if d.weight == 0 {
                String::new()
            } else {
                format!(", weight {}", d.weight)
            },
        );
    }
}

fn toml_line(s: &admin::ContainerSettings) -> String {
    let mut parts = Vec::new();
    if let Some(c) = s.class {
        parts.push(format!("class={}", c.name()));
    }
    if let Some(o) = s.oversubscribe {
        parts.push(format!("oversubscribe={o}"));
    }
    let dev = |p: &mut Vec<String>, at: &str, d: &admin::DeviceSettings| {
        if let Some(m) = d.memory {
            p.push(format!("memory{at}={}", format_size(m)));
        }
        if let Some(c) = d.compute {
            p.push(format!("compute{at}={:.1}%", c as f64 / 100.0));
        }
        if let Some(w) = d.weight {
            p.push(format!("weight{at}={w}"));
        }
    };
    dev(&mut parts, "", &s.all);
    for (k, d) in &s.devices {
        dev(&mut parts, &format!("[gpu {}]", escape(k)), d);
    }
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(" ")
    }
}

/// `get` (`reset: false`) or `reset` of one container, printed.
pub fn get_or_reset(a: NameArgs, reset: bool) -> Result<()> {
    let container = a.container;
    let req = if reset {
        Request::Reset { container }
    } else {
        Request::Get { container }
    };
    req.validate(None)?;
    print(&ask(&super::state_dir(a.state_dir), &req)?, a.json);
    Ok(())
}

pub fn run(a: SetArgs) -> Result<()> {
    let oversubscribe = match (a.oversubscribe, a.no_oversubscribe) {
        (true, _) => Some(true),
        (_, true) => Some(false),
        _ => None,
    };
    let q = SetRequest {
        container: a.container.clone(),
        device: a.device,
        class: a.class,
        memory: a.memory,
        compute: a.compute,
        weight: a.weight,
        oversubscribe,
    };
    if !a.offline {
        // The node's GPUs are the daemon's to know: it checks the device against them.
        q.validate(None)?;
        let r = ask(&super::state_dir(a.state_dir), &Request::Set(q))?;
        print(&r, false);
        return Ok(());
    }
    // The node's devices (NVML), as the daemon writes them; every slot when NVML is missing.
    let totals = libshare_node::nvml::device_totals().ok();
    let count = libshare_node::settings::node_devices(totals.as_deref());
    q.validate(totals.as_ref().map(Vec::len))?;
    let dir = libshare_abi::container_dir(&super::state_dir(a.state_dir), &a.container);
    let st = State::open_or_create(&dir).with_context(|| format!("container {}", a.container))?;
    // The same words the daemon writes for these settings (libshare_node::authority).
    let mut s = admin::ContainerSettings {
        class: a.class,
        oversubscribe,
        ..Default::default()
    };
    let one = admin::DeviceSettings {
        memory: a.memory,
        compute: a.compute,
        weight: a.weight,
    };
    match q.device {
        Some(d) => {
            s.devices.insert(d.to_string(), one);
        }
        None => s.all = one,
    }
    libshare_node::authority::Words::of(&s, count, true).assert(&st);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compute_takes_percent_and_maps_full_to_none() {
        assert_eq!(parse_compute("30%"), Ok(3_000));
        assert_eq!(parse_compute("30"), Ok(3_000));
        assert_eq!(parse_compute("12.5%"), Ok(1_250));
        assert_eq!(parse_compute("0"), Ok(0));
        assert_eq!(parse_compute("100%"), Ok(0));
        assert!(parse_compute("101%").is_err());
        assert!(parse_compute("-1").is_err());
        assert!(parse_compute("lots").is_err());
    }
}
