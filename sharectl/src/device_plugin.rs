//! `sharectl device-plugin`: libshare's Kubernetes device plugin (logic in crate `libshare-k8s`),
//! and the host side of its allocations in `sharectl hook` ([`bind`], [`unbind`]).
//!
//! The quota is bound on the host: `Allocate` records the allocation under the daemon's state
//! directory and writes a CDI spec whose one device runs `sharectl hook --cdi --allocation NAME`;
//! the runtime runs that hook for the container it creates, with the container's id from its
//! own state, and the hook sets the allocation's quota (and the class of the pod's
//! `libshare.dev/class` annotation) on the daemon for that id. The daemon names the container's
//! processes from their cgroup, so nothing the container says (`LIBSHARE_MEMORY_LIMIT`,
//! `LIBSHARE_CLASS`) counts.

use crate::cdi::{spec_with, valid_kind};
use crate::commands::daemon::parse_duration;
use crate::commands::set::{ask, class_parser, parse_compute, parse_memory};
use crate::inject::InjectArgs;
use anyhow::{anyhow, bail, Result};
use clap::Args;
use libshare_abi::admin::{Class, Request, SetRequest};
use libshare_abi::units::format_size;
use libshare_k8s::allocation::{
    self, Allocation, ALLOCATION_ANNOTATION, CLASS_ANNOTATION, COMPUTE_ANNOTATION,
};
use libshare_k8s::plugin::{Config, LegacyMount, Node};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
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

impl Node for HostNode {
    fn devices(&self) -> Result<Vec<u64>, String> {
        // NVML reads the device list once per process (as NVIDIA's does): a fresh process each
        // time sees a GPU that is gone.
        let exe = crate::inject::sharectl_exe().map_err(|e| e.to_string())?;
        let out = std::process::Command::new(exe)
            .args(["device-plugin", "--probe"])
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("cannot run the NVML probe: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
        }
        serde_json::from_slice(&out.stdout).map_err(|e| format!("NVML probe: {e}"))
    }

    fn cdi_spec(&self, a: &Allocation, visible: &str) -> Value {
        let device = json!({
            "name": a.name,
            "containerEdits": {
                "env": [
                    format!("CUDA_VISIBLE_DEVICES={visible}"),
                    format!("LIBSHARE_VISIBLE_DEVICES={visible}"),
                ],
            },
        });
        spec_with(
            &self.inject,
            &self.kind,
            vec![device],
            &["--allocation".into(), a.name.clone()],
        )
        .unwrap_or_else(|e| json!({ "error": e.to_string() }))
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
    crate::inject::sharectl_exe()?;
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
        legacy_mounts,
    };
    let node = Arc::new(HostNode {
        inject: a.inject,
        kind: a.kind,
    });
    crate::commands::daemon::init_logging();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(libshare_k8s::plugin::run(cfg, node))?;
    Ok(())
}

/// The daemon's name for the container of runtime id `id` (its cgroup's: the first 12 hex
/// digits, `libshare_node::identity`).
fn container_name(id: &str) -> Result<String> {
    if id.len() >= 12 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(id[..12].to_ascii_lowercase())
    } else {
        bail!(
            "container id {id:?} is not a runtime's hex id (containerd, CRI-O, podman): the \
             daemon could not name its processes, so its allocation cannot be bound"
        )
    }
}

/// The allocation a container names: the hook's `--allocation` or its annotation.
fn allocation_of(
    annotations: &serde_json::Map<String, Value>,
    arg: Option<&str>,
) -> Result<Option<String>> {
    let ann = annotations
        .get(ALLOCATION_ANNOTATION)
        .and_then(Value::as_str);
    match (arg, ann) {
        (Some(a), Some(b)) if a != b => bail!(
            "the container names two allocations ({a} by its CDI device, {b} by its \
             {ALLOCATION_ANNOTATION} annotation): not started"
        ),
        (Some(a), _) | (None, Some(a)) => Ok(Some(a.to_string())),
        (None, None) => Ok(None),
    }
}

/// What the pod's annotations ask for: class and compute share; one line for a bad one.
fn pod_choices(
    annotations: &serde_json::Map<String, Value>,
) -> Result<(Option<Class>, Option<u32>)> {
    let class = match annotations.get(CLASS_ANNOTATION) {
        None => None,
        Some(Value::String(s)) if s == "production" => Some(Class::Production),
        Some(Value::String(s)) if s == "opportunistic" => Some(Class::Opportunistic),
        Some(v) => bail!(
            "pod annotation {CLASS_ANNOTATION}={v}: expected production or opportunistic; \
             the container is not started (fix the pod's annotation)"
        ),
    };
    let compute = match annotations.get(COMPUTE_ANNOTATION) {
        None => None,
        Some(v) => Some(
            v.as_str()
                .ok_or_else(|| anyhow!("expected a string"))
                .and_then(|s| parse_compute(s).map_err(|e| anyhow!(e)))
                .map_err(|e| {
                    anyhow!(
                        "pod annotation {COMPUTE_ANNOTATION}={v}: {e}; the container is not \
                         started (fix the pod's annotation)"
                    )
                })?,
        ),
    };
    Ok((class, compute))
}

/// The allocation's quotas by the node's GPU index (NVML's, as the allocation names its GPUs):
/// the daemon's and the shim's quotas are per node GPU, whatever ordinal the container's CUDA
/// gives it (GPU 3 alone is the container's CUDA device 0, still GPU 3 to libshare).
fn per_gpu(alloc: &Allocation) -> Result<Vec<(u32, u64)>> {
    let mut gpus: Vec<(u32, u64)> = alloc
        .quota
        .iter()
        .map(|(g, b)| {
            g.parse()
                .map(|g| (g, *b))
                .map_err(|_| anyhow!("allocation {}: GPU {g:?} is not an index", alloc.name))
        })
        .collect::<Result<_>>()?;
    gpus.sort();
    Ok(gpus)
}

/// At createRuntime: sets the allocation's quota per GPU and the pod's class (annotation, else
/// the plugin's default) on the daemon for the container `id`. `None` when the container names
/// no allocation; a bad annotation or allocation is one error and nothing is set.
pub fn bind(
    state_dir: &Path,
    id: &str,
    annotations: &serde_json::Map<String, Value>,
    arg: Option<&str>,
) -> Result<Option<String>> {
    let Some(name) = allocation_of(annotations, arg)? else {
        return Ok(None);
    };
    let (class, compute) = pod_choices(annotations)?;
    let alloc = allocation::read(state_dir, &name).map_err(|e| anyhow!(e))?;
    let container = container_name(id)?;
    let class = class.unwrap_or(alloc.default_class);
    let mut reqs: Vec<SetRequest> = Vec::new();
    for (gpu, bytes) in per_gpu(&alloc)? {
        reqs.push(SetRequest {
            container: container.clone(),
            device: Some(gpu),
            memory: Some(bytes),
            ..Default::default()
        });
    }
    reqs.push(SetRequest {
        container: container.clone(),
        class: Some(class),
        compute,
        ..Default::default()
    });
    for r in reqs {
        if let Err(e) = ask(state_dir, &Request::Set(r)) {
            // Nothing half-set: the container does not start.
            let _ = ask(
                state_dir,
                &Request::Reset {
                    container: container.clone(),
                },
            );
            return Err(e.context(format!("cannot bind allocation {name} to {container}")));
        }
    }
    let quota: Vec<String> = alloc
        .quota
        .iter()
        .map(|(g, b)| format!("{} on GPU {g}", format_size(*b)))
        .collect();
    Ok(Some(format!(
        "container {container}: allocation {name} bound ({}, class {})",
        quota.join(", "),
        class.name()
    )))
}

/// At poststop: forgets the daemon's settings of a container that had an allocation (its quota
/// goes with it). `None` for any other container.
pub fn unbind(
    state_dir: &Path,
    id: &str,
    annotations: &serde_json::Map<String, Value>,
    arg: Option<&str>,
) -> Option<String> {
    let name = allocation_of(annotations, arg).ok().flatten()?;
    let container = container_name(id).ok()?;
    Some(
        match ask(
            state_dir,
            &Request::Reset {
                container: container.clone(),
            },
        ) {
            Ok(_) => format!("container {container}: allocation {name} released"),
            Err(e) => format!("container {container}: allocation {name}: cannot reset ({e})"),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> serde_json::Map<String, Value> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), Value::from(*v)))
            .collect()
    }

    #[test]
    fn annotations_are_checked() {
        assert_eq!(pod_choices(&ann(&[])).unwrap(), (None, None));
        assert_eq!(
            pod_choices(&ann(&[
                (CLASS_ANNOTATION, "opportunistic"),
                (COMPUTE_ANNOTATION, "30%")
            ]))
            .unwrap(),
            (Some(Class::Opportunistic), Some(3000))
        );
        for bad in [
            ann(&[(CLASS_ANNOTATION, "Production ")]),
            ann(&[(COMPUTE_ANNOTATION, "130%")]),
        ] {
            let e = pod_choices(&bad).unwrap_err().to_string();
            assert!(!e.contains('\n') && e.contains("not started"), "{e}");
        }
        assert!(allocation_of(&ann(&[(ALLOCATION_ANNOTATION, "k8s-a")]), Some("k8s-b")).is_err());
        assert_eq!(
            allocation_of(&ann(&[]), Some("k8s-b")).unwrap().as_deref(),
            Some("k8s-b")
        );
        assert_eq!(container_name(&"AB".repeat(32)).unwrap(), "abababababab");
        assert!(container_name("my-container").is_err());
    }

    #[test]
    fn quotas_go_to_the_nodes_gpus_whatever_ordinal_the_container_sees() {
        let a = Allocation {
            name: "k8s-gpu2-share0-x3".into(),
            ids: Vec::new(),
            quota: [("10".to_string(), 1u64), ("2".to_string(), 2)].into(),
            default_class: Class::Production,
        };
        // CUDA_VISIBLE_DEVICES=2,10: GPU 2 is the container's ordinal 0, still GPU 2 to libshare.
        assert_eq!(per_gpu(&a).unwrap(), [(2, 2), (10, 1)]);
    }
}
