//! A ResourceClaim's allocation on this node, as libshare enforces it: pure (no I/O), so every
//! rule is unit-tested on `resource.k8s.io/v1` JSON.
//!
//! - The devices are the claim's allocation results of driver `gpu.libshare.dev`; each must be
//!   in this node's pool and name one of its GPUs.
//! - The quota on each GPU is the memory the results consume there (`consumedCapacity.memory`,
//!   what the scheduler counted); a result without it was allocated the whole GPU (a cluster
//!   without consumable capacity) and gets all of its memory.
//! - The class comes from the DeviceClass each result's request names: production only for the
//!   DeviceClasses the plugin is told are production (`--production-class`, by default
//!   `production.gpu.libshare.dev`), opportunistic for any other. A claim with an opportunistic
//!   result is opportunistic. The cluster admin governs who may name a production DeviceClass
//!   (a ResourceQuota per namespace); nothing the pod writes (annotations, environment, opaque
//!   parameters) makes a claim production.
//! - Opaque parameters for this driver (`apiVersion: gpu.libshare.dev/v1, kind: GpuConfig`, from
//!   the DeviceClass or the claim) may only lower what the claim gets: `class: opportunistic`,
//!   `compute: "30%"` (a cap), `memory: 2Gi` (a smaller quota), `oversubscribe: true` (an
//!   opportunistic claim's memory may become managed memory). What would raise it is ignored,
//!   with a note the plugin logs; a parameter it does not know fails the claim.

use super::slice::{device_index, Inventory};
use super::{quantity, DRIVER};
use k8s_openapi::api::resource::v1::ResourceClaim;
use libshare_abi::admin::Class;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The claim the kubelet names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl std::fmt::Display for ClaimRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One allocated device, as the kubelet is answered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreparedDevice {
    pub request: String,
    pub pool: String,
    pub device: String,
    /// The node's GPU (NVML index).
    pub gpu: u32,
    /// Its UUID when the claim was prepared.
    pub uuid: String,
}

/// A prepared claim: what the runtime's hook binds to each container that uses it, and what
/// `NodeUnprepareResources` undoes. Kept on disk (`store.rs`) so both survive a restart.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prepared {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub devices: Vec<PreparedDevice>,
    /// Node GPU → memory quota, bytes.
    pub quota: BTreeMap<u32, u64>,
    pub class: Class,
    /// Compute cap, basis points (opportunistic claims; `None`: no cap).
    #[serde(default)]
    pub compute: Option<u32>,
    #[serde(default)]
    pub oversubscribe: bool,
    /// The CDI device id every container using the claim gets.
    pub cdi_device: String,
}

impl Prepared {
    /// `CUDA_VISIBLE_DEVICES` for a container using the claim: its GPUs, by node index.
    pub fn visible(&self) -> String {
        let v: Vec<String> = self.quota.keys().map(u32::to_string).collect();
        v.join(",")
    }
}

/// What the plugin is told about classes and memory.
#[derive(Clone, Debug)]
pub struct Policy {
    /// DeviceClasses whose claims are production.
    pub production_classes: Vec<String>,
}

/// The opaque parameters this driver reads.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct GpuConfig {
    api_version: String,
    kind: String,
    #[serde(default)]
    class: Option<String>,
    #[serde(default)]
    compute: Option<serde_json::Value>,
    #[serde(default)]
    memory: Option<String>,
    #[serde(default)]
    oversubscribe: Option<bool>,
}

pub const CONFIG_API_VERSION: &str = "gpu.libshare.dev/v1";
pub const CONFIG_KIND: &str = "GpuConfig";

/// `30%`, `30` or 30 → basis points (1..=10000); 0 and 100 % mean no cap (`None`).
fn compute_cap(v: &serde_json::Value) -> Result<Option<u32>, String> {
    let pct: Option<f64> = match v {
        serde_json::Value::Number(n) => n.as_f64(),
        serde_json::Value::String(s) => s.trim().trim_end_matches('%').trim().parse().ok(),
        _ => None,
    };
    match pct {
        Some(p) if (0.0..=100.0).contains(&p) => {
            let bp = (p * 100.0).round() as u32;
            Ok((bp != 0 && bp != 10_000).then_some(bp))
        }
        _ => Err(format!("compute {v}: expected a percentage, e.g. \"30%\"")),
    }
}

/// The claim's allocation on `node` as libshare enforces it, plus notes on what was asked and
/// ignored (each a line for the log); one line saying what is wrong otherwise.
pub fn prepare(
    want: &ClaimRef,
    claim: &ResourceClaim,
    node: &str,
    inv: &Inventory,
    policy: &Policy,
    cdi_device: String,
) -> Result<(Prepared, Vec<String>), String> {
    let uid = claim.metadata.uid.as_deref().unwrap_or("");
    if uid != want.uid {
        return Err(format!(
            "claim {want}: the API server has uid {uid:?}, the kubelet asked for {:?} (deleted and created again?)",
            want.uid
        ));
    }
    let Some(alloc) = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
    else {
        return Err(format!("claim {want} is not allocated"));
    };
    let results = alloc.results.as_deref().unwrap_or_default();
    let ours: Vec<_> = results.iter().filter(|r| r.driver == DRIVER).collect();
    if ours.is_empty() {
        let others: Vec<&str> = results.iter().map(|r| r.driver.as_str()).collect();
        return Err(format!(
            "claim {want} has no device of driver {DRIVER} (its devices are of {others:?}): not prepared on this node"
        ));
    }
    let requests = claim
        .spec
        .devices
        .as_ref()
        .and_then(|d| d.requests.as_deref())
        .unwrap_or_default();
    let class_of = |request: &str| -> Result<String, String> {
        let (main, sub) = match request.split_once('/') {
            Some((m, s)) => (m, Some(s)),
            None => (request, None),
        };
        let r = requests.iter().find(|r| r.name == main);
        let class = match (r, sub) {
            (Some(r), None) => r.exactly.as_ref().map(|e| e.device_class_name.clone()),
            (Some(r), Some(s)) => r
                .first_available
                .as_deref()
                .unwrap_or_default()
                .iter()
                .find(|x| x.name == s)
                .map(|x| x.device_class_name.clone()),
            (None, _) => None,
        };
        class.ok_or_else(|| {
            format!(
                "claim {want}: its request {request:?} names no DeviceClass in the claim's spec"
            )
        })
    };

    let mut devices = Vec::new();
    let mut quota: BTreeMap<u32, u64> = BTreeMap::new();
    let mut class = Class::Production;
    for r in &ours {
        if r.pool != node {
            return Err(format!(
                "claim {want}: device {}/{} is in pool {:?}, not this node's ({node:?}): not prepared here",
                r.pool, r.device, r.pool
            ));
        }
        let gpu = device_index(&r.device)
            .and_then(|i| inv.gpu(i))
            .ok_or_else(|| {
                let have: Vec<String> = inv
                    .gpus
                    .iter()
                    .map(|g| format!("gpu-{}", g.index))
                    .collect();
                format!(
                    "claim {want}: device {} is not a GPU of this node (it has {})",
                    r.device,
                    if have.is_empty() {
                        "none".into()
                    } else {
                        have.join(", ")
                    }
                )
            })?;
        let memory = match r.consumed_capacity.as_ref().and_then(|c| c.get("memory")) {
            None => gpu.memory,
            Some(q) => quantity::bytes(&q.0).ok_or_else(|| {
                format!(
                    "claim {want}: device {}'s consumed memory {:?} is not a quantity",
                    r.device, q.0
                )
            })?,
        };
        let total = quota.get(&gpu.index).copied().unwrap_or(0) + memory;
        if total > gpu.memory {
            return Err(format!(
                "claim {want}: it consumes {} of memory on {}, more than the GPU's {}",
                quantity::format(total),
                r.device,
                quantity::format(gpu.memory)
            ));
        }
        if let Err(e) = libshare_abi::admin::check_quota(total) {
            return Err(format!("claim {want} on {}: {e}", r.device));
        }
        quota.insert(gpu.index, total);
        let dc = class_of(&r.request)?;
        if !policy.production_classes.contains(&dc) {
            class = Class::Opportunistic;
        }
        devices.push(PreparedDevice {
            request: r.request.clone(),
            pool: r.pool.clone(),
            device: r.device.clone(),
            gpu: gpu.index,
            uuid: gpu.uuid.clone(),
        });
    }

    let mut p = Prepared {
        uid: want.uid.clone(),
        namespace: want.namespace.clone(),
        name: want.name.clone(),
        devices,
        quota,
        class,
        compute: None,
        oversubscribe: false,
        cdi_device,
    };
    let mut notes = Vec::new();
    let our_requests: Vec<&str> = ours.iter().map(|r| r.request.as_str()).collect();
    for c in alloc.config.as_deref().unwrap_or_default() {
        let Some(o) = c.opaque.as_ref().filter(|o| o.driver == DRIVER) else {
            continue;
        };
        let applies = c.requests.as_deref().unwrap_or_default();
        if !applies.is_empty() && !applies.iter().any(|r| our_requests.contains(&r.as_str())) {
            continue;
        }
        let cfg: GpuConfig = serde_json::from_value(o.parameters.0.clone()).map_err(|e| {
            format!(
                "claim {want}: opaque parameters for {DRIVER} ({}): {e}; expected {{apiVersion: {CONFIG_API_VERSION}, kind: {CONFIG_KIND}, class, compute, memory, oversubscribe}}",
                c.source
            )
        })?;
        if cfg.api_version != CONFIG_API_VERSION || cfg.kind != CONFIG_KIND {
            return Err(format!(
                "claim {want}: opaque parameters for {DRIVER} are {}/{}, expected apiVersion {CONFIG_API_VERSION}, kind {CONFIG_KIND}",
                cfg.api_version, cfg.kind
            ));
        }
        apply(&mut p, &cfg, &mut notes).map_err(|e| format!("claim {want}: {e}"))?;
    }
    if p.class == Class::Production && p.oversubscribe {
        p.oversubscribe = false;
    }
    Ok((p, notes))
}

/// Applies one `GpuConfig`: only what lowers the claim.
fn apply(p: &mut Prepared, cfg: &GpuConfig, notes: &mut Vec<String>) -> Result<(), String> {
    let asked = cfg.class.as_deref().map(|c| Class::from_name(c).ok_or(c));
    match asked {
        None => {}
        Some(Ok(Class::Opportunistic)) => p.class = Class::Opportunistic,
        Some(Ok(Class::Production)) if p.class == Class::Production => {}
        Some(Ok(Class::Production)) => notes.push(
            "its parameters ask for class production: ignored, the class comes from the DeviceClass (opportunistic)".into(),
        ),
        Some(Err(other)) => {
            return Err(format!(
                "class {other:?} in its parameters: expected production or opportunistic"
            ))
        }
    }
    if let Some(v) = &cfg.compute {
        if let Some(bp) = compute_cap(v)? {
            p.compute = Some(p.compute.map_or(bp, |c| c.min(bp)));
        }
    }
    if let Some(m) = &cfg.memory {
        let bytes = quantity::bytes(m)
            .ok_or_else(|| format!("memory {m:?}: expected a quantity, e.g. 2Gi"))?;
        libshare_abi::admin::check_quota(bytes)?;
        for (gpu, q) in p.quota.iter_mut() {
            if bytes <= *q {
                *q = bytes;
            } else {
                notes.push(format!(
                    "its parameters ask for {} of memory on GPU {gpu}: ignored, the claim consumes {} there",
                    quantity::format(bytes),
                    quantity::format(*q)
                ));
            }
        }
    }
    match cfg.oversubscribe {
        Some(true) if p.class == Class::Opportunistic => p.oversubscribe = true,
        Some(true) => notes.push(
            "its parameters ask to oversubscribe: ignored, a production claim keeps device memory"
                .into(),
        ),
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests;
