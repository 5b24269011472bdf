//! `sharectl device-plugin`: libshare's Kubernetes device plugin (logic in crate `libshare-k8s`).
//! Each allocation's CDI spec runs `sharectl hook --cdi --allocation NAME`, which binds the
//! allocation to the container on the daemon ([`crate::containers::bind::allocation`]).

use crate::admin::{class_parser, parse_memory};
use crate::commands::daemon::parse_duration;
use crate::containers::cdi::{bound_spec, valid_kind};
use crate::containers::inject::{sharectl_exe, InjectArgs};
use anyhow::{anyhow, bail, Result};
use clap::Args;
use libshare_abi::admin::Class;
use libshare_k8s::allocation::Allocation;
use libshare_k8s::plugin::{Config, LegacyMount, Node};
use serde_json::Value;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Args, Debug)]
pub struct DevicePluginArgs {
    #[command(flatten)]
    pub inject: InjectArgs,
    /// The kubelet's device-plugin directory (its kubelet.sock; this plugin's socket goes there).
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/var/lib/kubelet/device-plugins"
    )]
    pub plugin_dir: PathBuf,
    /// This plugin's socket file name in --plugin-dir.
    #[arg(long, default_value = "libshare.sock")]
    pub endpoint: String,
    /// The extended resource pods ask for, in shares.
    #[arg(long, default_value = "libshare.dev/gpu-memory")]
    pub resource: String,
    /// Memory of one share (a pod asking for N shares gets an N-share quota).
    #[arg(long, default_value = "1GiB", value_parser = parse_memory)]
    pub share: u64,
    /// How often NVML is asked for the node's GPUs (a change goes to the kubelet).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub rescan: u64,
    /// Where the CDI spec of each allocation is written (the runtime reads it from there).
    #[arg(long, value_name = "DIR", default_value = "/var/run/cdi")]
    pub cdi_dir: PathBuf,
    /// The CDI kind of the allocations' devices.
    #[arg(long, default_value = "libshare.dev/gpu")]
    pub kind: String,
    /// The class of a pod without a libshare.dev/class annotation.
    #[arg(long, value_parser = class_parser(), default_value = "production")]
    pub default_class: Class,
    /// The namespaces whose pods may be production (comma-separated; `*`: every namespace, which
    /// trusts every pod's annotation). A pod elsewhere is opportunistic whatever it asks.
    #[arg(long, value_delimiter = ',', value_name = "NS,…")]
    pub production_namespaces: Vec<String>,
    /// Also answer with the mounts (shim, preload list, register.sock), for a kubelet or
    /// runtime without CDI (the quota then needs the hooks.d entry: sharectl hook --print-hooks-d).
    #[arg(long)]
    pub legacy_mounts: bool,
    /// Print each GPU's total memory as NVML reports it (JSON) and exit: what the plugin runs
    /// at every rescan, so that a driver restarted with other GPUs is seen.
    #[arg(long, hide = true)]
    pub probe: bool,
}

struct HostNode {
    inject: InjectArgs,
    kind: String,
}

/// `sharectl <subcommand> --probe` in a fresh process (NVML reads the device list once per
/// process, as NVIDIA's does: a fresh process each time sees a GPU that is gone); its stdout.
pub(crate) fn probe(subcommand: &str) -> Result<Vec<u8>, String> {
    let exe = sharectl_exe().map_err(|e| e.to_string())?;
    let out = std::process::Command::new(exe)
        .args([subcommand, "--probe"])
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run the NVML probe: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    Ok(out.stdout)
}

impl Node for HostNode {
    fn devices(&self) -> Result<Vec<u64>, String> {
        let out = probe("device-plugin")?;
        serde_json::from_slice(&out).map_err(|e| format!("NVML probe: {e}"))
    }

    fn cdi_spec(&self, a: &Allocation, visible: &str) -> Value {
        bound_spec(&self.inject, &self.kind, &a.name, visible, "--allocation")
    }
}

pub fn run(a: DevicePluginArgs) -> Result<()> {
    if a.probe {
        let totals = libshare_node::nvml::device_totals().map_err(|e| anyhow!(e))?;
        println!("{}", serde_json::to_string(&totals)?);
        return Ok(());
    }
    if !valid_kind(&a.kind) {
        bail!(
            "--kind {}: expected vendor.domain/class, e.g. libshare.dev/gpu",
            a.kind
        );
    }
    if !(100_000_000..=3_600_000_000_000).contains(&a.rescan) {
        bail!("--rescan must be between 100ms and 1h");
    }
    // The daemon may start after the plugin; a container needs its socket when it starts.
    a.inject.check(false)?;
    a.inject.ensure_preload_file()?;
    sharectl_exe()?;
    let legacy_mounts = if a.legacy_mounts {
        a.inject
            .mounts(&a.inject.preload_file, 0)
            .into_iter()
            .map(|m| LegacyMount {
                host: m.host,
                container: m.container,
                read_only: m.readonly,
            })
            .collect()
    } else {
        Vec::new()
    };
    let cfg = Config {
        plugin_dir: a.plugin_dir,
        endpoint: a.endpoint,
        resource: a.resource,
        share_bytes: a.share,
        rescan: Duration::from_nanos(a.rescan),
        state_dir: a.inject.state_dir.clone(),
        cdi_dir: a.cdi_dir,
        cdi_kind: a.kind.clone(),
        default_class: a.default_class,
        production_namespaces: a
            .production_namespaces
            .into_iter()
            .filter(|n| !n.is_empty())
            .collect(),
        legacy_mounts,
    };
    let node = Arc::new(HostNode {
        inject: a.inject,
        kind: a.kind,
    });
    serve(libshare_k8s::plugin::run(cfg, node))
}

/// Runs a plugin (the device plugin's or the DRA plugin's `run`) on a current-thread runtime,
/// logging as the daemon does.
pub(crate) fn serve(
    plugin: impl std::future::Future<Output = Result<(), libshare_k8s::plugin::PluginError>>,
) -> Result<()> {
    crate::commands::daemon::init_logging();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(plugin)?;
    Ok(())
}
