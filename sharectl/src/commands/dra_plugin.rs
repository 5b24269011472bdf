//! `sharectl dra-plugin`: libshare's DRA kubelet plugin, driver `gpu.libshare.dev` (logic in
//! `libshare_k8s::dra`). Each prepared claim's CDI spec runs `sharectl hook --cdi --claim UID`,
//! which binds the claim to the container on the daemon ([`crate::containers::bind::claim`]).

use crate::admin::parse_memory;
use crate::commands::daemon::parse_duration;
use crate::commands::device_plugin::{probe, serve};
use crate::containers::cdi::{bound_spec, valid_kind};
use crate::containers::inject::{sharectl_exe, InjectArgs};
use anyhow::{anyhow, bail, Result};
use clap::Args;
use libshare_k8s::dra::claim::{Policy, Prepared};
use libshare_k8s::dra::plugin::{Config, Node};
use libshare_k8s::dra::slice::{Gpu, Inventory, MemoryPolicy};
use libshare_k8s::dra::PRODUCTION_CLASS;
use serde_json::Value;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Args, Debug)]
pub struct DraPluginArgs {
    #[command(flatten)]
    pub inject: InjectArgs,
    /// This node's name, as the API server has it (default: $NODE_NAME; in a pod, from
    /// spec.nodeName through the downward API).
    #[arg(long)]
    pub node_name: Option<String>,
    /// The kubelet's plugin watcher directory (the registration socket goes there).
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/var/lib/kubelet/plugins_registry"
    )]
    pub registry_dir: PathBuf,
    /// Where the plugin's service socket (dra.sock) is.
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/var/lib/kubelet/plugins/gpu.libshare.dev"
    )]
    pub plugin_dir: PathBuf,
    /// Where the CDI spec of each prepared claim is written (the runtime reads it from there).
    #[arg(long, value_name = "DIR", default_value = "/var/run/cdi")]
    pub cdi_dir: PathBuf,
    /// The CDI kind of the claims' devices.
    #[arg(long, default_value = "gpu.libshare.dev/claim")]
    pub kind: String,
    /// A DeviceClass whose claims are production (repeatable); claims of any other class are
    /// opportunistic.
    #[arg(long = "production-class", value_name = "NAME", default_values_t = [PRODUCTION_CLASS.to_string()])]
    pub production_classes: Vec<String>,
    /// Memory a request that names none consumes on a GPU.
    #[arg(long, default_value = "1GiB", value_parser = parse_memory)]
    pub memory_default: u64,
    /// The granule of memory on a GPU (and the least a request may take).
    #[arg(long, default_value = "256MiB", value_parser = parse_memory)]
    pub memory_step: u64,
    /// How often NVML is asked for the node's GPUs (a change updates the ResourceSlice).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub rescan: u64,
    /// How often the ResourceSlice is checked against the API server when nothing changed.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub resync: u64,
    /// The API server's kubeconfig (default: the pod's service account, else $KUBECONFIG).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Print the node's GPUs as NVML reports them (JSON) and exit: what the plugin runs at
    /// every rescan, so that a driver restarted with other GPUs is seen.
    #[arg(long, hide = true)]
    pub probe: bool,
}

struct HostNode {
    inject: InjectArgs,
    kind: String,
}

impl Node for HostNode {
    fn inventory(&self) -> Result<Inventory, String> {
        // NVML reads the device list once per process (as NVIDIA's does): a fresh process each
        // time sees a GPU that is gone.
        let out = probe("dra-plugin")?;
        serde_json::from_slice(&out).map_err(|e| format!("NVML probe: {e}"))
    }

    fn cdi_spec(&self, p: &Prepared) -> Value {
        bound_spec(&self.inject, &self.kind, &p.uid, &p.visible(), "--claim")
    }
}

fn inventory() -> Result<Inventory> {
    let (gpus, driver_version) = libshare_node::nvml::gpus().map_err(|e| anyhow!(e))?;
    Ok(Inventory {
        driver_version,
        gpus: gpus
            .into_iter()
            .map(|g| Gpu {
                index: g.index,
                uuid: g.uuid,
                product: g.name,
                memory: g.memory,
            })
            .collect(),
    })
}

pub fn run(a: DraPluginArgs) -> Result<()> {
    if a.probe {
        println!("{}", serde_json::to_string(&inventory()?)?);
        return Ok(());
    }
    if !valid_kind(&a.kind) {
        bail!(
            "--kind {}: expected vendor.domain/class, e.g. gpu.libshare.dev/claim",
            a.kind
        );
    }
    for (what, v) in [("--rescan", a.rescan), ("--resync", a.resync)] {
        if !(100_000_000..=3_600_000_000_000).contains(&v) {
            bail!("{what} must be between 100ms and 1h");
        }
    }
    // The daemon may start after the plugin; a container needs its socket when it starts.
    a.inject.check(false)?;
    a.inject.ensure_preload_file()?;
    sharectl_exe()?;
    let node_name = a
        .node_name
        .or_else(|| std::env::var("NODE_NAME").ok())
        .unwrap_or_default();
    let cfg = Config {
        node_name,
        registry_dir: a.registry_dir,
        plugin_dir: a.plugin_dir,
        state_dir: a.inject.state_dir.clone(),
        cdi_dir: a.cdi_dir,
        cdi_kind: a.kind.clone(),
        rescan: Duration::from_nanos(a.rescan),
        resync: Duration::from_nanos(a.resync),
        policy: Policy {
            production_classes: a.production_classes,
        },
        memory: MemoryPolicy {
            default: a.memory_default,
            step: a.memory_step,
        },
        kubeconfig: a.kubeconfig,
    };
    let node = Arc::new(HostNode {
        inject: a.inject,
        kind: a.kind,
    });
    serve(libshare_k8s::dra::plugin::run(cfg, node))
}
