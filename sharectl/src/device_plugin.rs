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

use crate::cdi::{bound_spec, valid_kind};
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
use serde_json::Value;
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
    let exe = crate::inject::sharectl_exe().map_err(|e| e.to_string())?;
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

/// The daemon's name for the container of runtime id `id` (its cgroup's: the first 12 hex
/// digits, `libshare_node::identity`).
pub(crate) fn container_name(id: &str) -> Result<String> {
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

/// The runtime's annotations naming the pod's namespace: CRI-O's and containerd's. The runtime
/// writes them from the pod's sandbox, not from the pod's annotations.
const NAMESPACE_ANNOTATIONS: [&str; 2] = [
    "io.kubernetes.pod.namespace",
    "io.kubernetes.cri.sandbox-namespace",
];

/// The pod's namespace as the runtime names it (`None`: none, or two that disagree).
fn pod_namespace(annotations: &serde_json::Map<String, Value>) -> Option<&str> {
    let mut found = NAMESPACE_ANNOTATIONS
        .iter()
        .filter_map(|k| annotations.get(*k).and_then(Value::as_str));
    let first = found.next()?;
    found.all(|n| n == first).then_some(first)
}

/// The class a pod gets: what it asks (its annotation, else the plugin's default), but production
/// only in a namespace the node's settings allow; else opportunistic, and why (for the log line).
fn class_in_namespace(
    asked: Class,
    namespace: Option<&str>,
    allowed: &[String],
) -> (Class, Option<String>) {
    let ok = allowed
        .iter()
        .any(|a| a == "*" || Some(a.as_str()) == namespace);
    if asked == Class::Opportunistic || ok {
        return (asked, None);
    }
    let ns = namespace.map_or("(none named by the runtime)".to_string(), |n| {
        format!("{n:?}")
    });
    (
        Class::Opportunistic,
        Some(format!(
            "; pod namespace {ns} may not be production (device plugin --production-namespaces), so opportunistic"
        )),
    )
}

/// Sends `reqs` (the settings binding `what` to `container`) to the daemon; on a refusal the
/// container's settings are reset, so nothing is half-set, and the container does not start.
pub(crate) fn apply_settings(
    state_dir: &Path,
    container: &str,
    what: &str,
    reqs: Vec<SetRequest>,
) -> Result<()> {
    for r in reqs {
        if let Err(e) = ask(state_dir, &Request::Set(r)) {
            let _ = ask(
                state_dir,
                &Request::Reset {
                    container: container.to_string(),
                },
            );
            return Err(e.context(format!("cannot bind {what} to {container}")));
        }
    }
    Ok(())
}

/// At createRuntime: sets the allocation's quota per GPU and the pod's class (annotation, else
/// the plugin's default; production only in a namespace the plugin allows) on the daemon for the
/// container `id`. `None` when the container names no allocation; a bad annotation or
/// allocation is one error and nothing is set.
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
    let (class, demoted) = class_in_namespace(
        class.unwrap_or(alloc.default_class),
        pod_namespace(annotations),
        &alloc.production_namespaces,
    );
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
    apply_settings(state_dir, &container, &format!("allocation {name}"), reqs)?;
    let quota: Vec<String> = alloc
        .quota
        .iter()
        .map(|(g, b)| format!("{} on GPU {g}", format_size(*b)))
        .collect();
    Ok(Some(format!(
        "container {container}: allocation {name} bound ({}, class {}{})",
        quota.join(", "),
        class.name(),
        demoted.unwrap_or_default()
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
    release(state_dir, id, &format!("allocation {name}"))
}

/// Forgets the daemon's settings of the container of runtime id `id`, which `what` (an
/// allocation, a claim) was bound to; the line saying so. `None` for an id that names no
/// container.
pub(crate) fn release(state_dir: &Path, id: &str, what: &str) -> Option<String> {
    let container = container_name(id).ok()?;
    Some(
        match ask(
            state_dir,
            &Request::Reset {
                container: container.clone(),
            },
        ) {
            Ok(_) => format!("container {container}: {what} released"),
            Err(e) => format!("container {container}: {what}: cannot reset ({e})"),
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
    fn production_only_in_the_namespaces_the_node_allows() {
        use Class::*;
        let allowed = vec!["inference".to_string()];
        let ns = |pairs: &[(&str, &str)]| pod_namespace(&ann(pairs)).map(str::to_string);
        assert_eq!(
            ns(&[("io.kubernetes.pod.namespace", "inference")]).as_deref(),
            Some("inference")
        );
        assert_eq!(
            ns(&[("io.kubernetes.cri.sandbox-namespace", "batch")]).as_deref(),
            Some("batch")
        );
        assert_eq!(
            ns(&[
                ("io.kubernetes.pod.namespace", "inference"),
                ("io.kubernetes.cri.sandbox-namespace", "batch")
            ]),
            None,
            "two that disagree name none"
        );
        assert_eq!(
            class_in_namespace(Production, Some("inference"), &allowed),
            (Production, None)
        );
        assert_eq!(
            class_in_namespace(Opportunistic, Some("inference"), &allowed),
            (Opportunistic, None)
        );
        for ns in [Some("batch"), None] {
            let (c, why) = class_in_namespace(Production, ns, &allowed);
            assert_eq!(c, Opportunistic);
            let why = why.unwrap();
            assert!(
                why.contains("may not be production") && !why.contains('\n'),
                "{why}"
            );
        }
        assert_eq!(
            class_in_namespace(Production, None, &[]).0,
            Opportunistic,
            "nobody by default"
        );
        assert_eq!(
            class_in_namespace(Production, Some("x"), &["*".into()]).0,
            Production
        );
    }

    #[test]
    fn quotas_go_to_the_nodes_gpus_whatever_ordinal_the_container_sees() {
        let a = Allocation {
            name: "k8s-gpu2-share0-x3".into(),
            ids: Vec::new(),
            quota: [("10".to_string(), 1u64), ("2".to_string(), 2)].into(),
            default_class: Class::Production,
            production_namespaces: Vec::new(),
        };
        // CUDA_VISIBLE_DEVICES=2,10: GPU 2 is the container's ordinal 0, still GPU 2 to libshare.
        assert_eq!(per_gpu(&a).unwrap(), [(2, 2), (10, 1)]);
    }
}
