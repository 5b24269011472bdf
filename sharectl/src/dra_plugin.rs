//! `sharectl dra-plugin`: libshare's DRA kubelet plugin, driver `gpu.libshare.dev` (logic in
//! `libshare_k8s::dra`), and the host side of its claims in `sharectl hook` ([`bind`],
//! [`unbind`]).
//!
//! A prepared claim's CDI spec runs `sharectl hook --cdi --claim UID` at createRuntime; the hook
//! reads the claim as the plugin recorded it (`<state dir>/k8s/dra/UID.json`, root's) and sets,
//! on the daemon, for the container id from the runtime's state: the claim's memory per GPU,
//! its class (the DeviceClass's, never the pod's annotations or environment), its compute cap
//! and oversubscription; at poststop it forgets them. A container using two claims gets both:
//! their memory on a GPU adds up, the lower class and the smaller cap win.

use crate::cdi::{bound_spec, valid_kind};
use crate::commands::daemon::parse_duration;
use crate::commands::set::{ask, parse_memory};
use crate::device_plugin::{apply_settings, container_name, release, serve};
use crate::inject::InjectArgs;
use anyhow::{anyhow, bail, Result};
use clap::Args;
use libshare_abi::admin::{Class, ContainerSettings, Request, SetRequest};
use libshare_abi::units::format_size;
use libshare_k8s::dra::claim::{Policy, Prepared};
use libshare_k8s::dra::plugin::{Config, Node};
use libshare_k8s::dra::slice::{Gpu, Inventory, MemoryPolicy};
use libshare_k8s::dra::{store, PRODUCTION_CLASS};
use serde_json::Value;
use std::path::{Path, PathBuf};
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
        let out = crate::device_plugin::probe("dra-plugin")?;
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
    crate::inject::sharectl_exe()?;
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

/// The daemon's settings for `container` now (none for a container it does not know).
fn current(state_dir: &Path, container: &str) -> ContainerSettings {
    match ask(
        state_dir,
        &Request::Get {
            container: container.into(),
        },
    ) {
        Ok(report) => report.settings,
        Err(_) => ContainerSettings::default(),
    }
}

/// The settings that bind claim `p` to a container that already has `prev` (another claim of
/// it bound first): memory per GPU adds up, the lower class and the smaller cap win, and it
/// oversubscribes only if every claim lets it.
fn merged(p: &Prepared, prev: &ContainerSettings, container: &str) -> Vec<SetRequest> {
    let first = prev.class.is_none();
    let class = match prev.class {
        Some(Class::Opportunistic) => Class::Opportunistic,
        _ => p.class,
    };
    let compute = match (prev.all.compute.filter(|c| *c != 0), p.compute) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let oversubscribe = class == Class::Opportunistic
        && p.oversubscribe
        && (first || prev.oversubscribe == Some(true));
    let mut reqs: Vec<SetRequest> = p
        .quota
        .iter()
        .map(|(gpu, bytes)| SetRequest {
            container: container.into(),
            device: Some(*gpu),
            memory: Some(
                bytes
                    + prev
                        .device(*gpu as usize)
                        .memory
                        .filter(|_| !first)
                        .unwrap_or(0),
            ),
            ..Default::default()
        })
        .collect();
    reqs.push(SetRequest {
        container: container.into(),
        class: Some(class),
        compute,
        oversubscribe: Some(oversubscribe),
        ..Default::default()
    });
    reqs
}

/// At createRuntime: sets claim `uid`'s quota per GPU, class, compute cap and oversubscription
/// on the daemon for the container `id`. `None` without `--claim`; a claim this node did not
/// prepare is one error, and nothing is set.
pub fn bind(state_dir: &Path, id: &str, claim: Option<&str>) -> Result<Option<String>> {
    let Some(uid) = claim else {
        return Ok(None);
    };
    let p = store::read(state_dir, uid)
        .map_err(|e| anyhow!("claim {uid}: {e}"))?
        .ok_or_else(|| {
            anyhow!(
                "claim {uid} is not prepared on this node (sharectl dra-plugin prepares it before \
                 the container is created): not started"
            )
        })?;
    let container = container_name(id)?;
    let prev = current(state_dir, &container);
    let reqs = merged(&p, &prev, &container);
    apply_settings(state_dir, &container, &format!("claim {uid}"), reqs)?;
    let quota: Vec<String> = p
        .quota
        .iter()
        .map(|(g, b)| format!("{} on GPU {g}", format_size(*b)))
        .collect();
    Ok(Some(format!(
        "container {container}: claim {}/{} bound ({}, class {}{})",
        p.namespace,
        p.name,
        quota.join(", "),
        p.class.name(),
        p.compute
            .map_or(String::new(), |c| format!(", compute cap {}%", c / 100)),
    )))
}

/// At poststop: forgets the daemon's settings of a container that used a claim. `None` for
/// any other container.
pub fn unbind(state_dir: &Path, id: &str, claim: Option<&str>) -> Option<String> {
    release(state_dir, id, &format!("claim {}", claim?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use libshare_abi::admin::DeviceSettings;

    fn prepared(class: Class, gpu: u32, gib: u64, compute: Option<u32>) -> Prepared {
        Prepared {
            uid: "u".into(),
            namespace: "ns".into(),
            name: "c".into(),
            devices: Vec::new(),
            quota: [(gpu, gib << 30)].into(),
            class,
            compute,
            oversubscribe: true,
            cdi_device: "k/c=u".into(),
        }
    }

    #[test]
    fn a_second_claim_adds_memory_and_never_raises_the_class() {
        let first = merged(
            &prepared(Class::Production, 1, 6, None),
            &ContainerSettings::default(),
            "c",
        );
        assert_eq!(first[0].device, Some(1));
        assert_eq!(first[0].memory, Some(6 << 30));
        assert_eq!(first[1].class, Some(Class::Production));
        assert_eq!(
            first[1].oversubscribe,
            Some(false),
            "production keeps device memory"
        );

        let mut prev = ContainerSettings {
            class: Some(Class::Opportunistic),
            ..Default::default()
        };
        prev.all.compute = Some(3000);
        prev.devices.insert(
            "1".into(),
            DeviceSettings {
                memory: Some(3 << 30),
                ..Default::default()
            },
        );
        let second = merged(&prepared(Class::Production, 1, 6, Some(5000)), &prev, "c");
        assert_eq!(second[0].memory, Some(9 << 30));
        assert_eq!(second[1].class, Some(Class::Opportunistic));
        assert_eq!(second[1].compute, Some(3000));
        assert_eq!(
            second[1].oversubscribe,
            Some(false),
            "the first did not allow it"
        );
    }
}
