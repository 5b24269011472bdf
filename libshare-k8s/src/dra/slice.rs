//! What the plugin publishes: the node's GPUs as one ResourceSlice (`resource.k8s.io/v1`), pure.
//!
//! One pool per node (named after it), one slice in it, one device per GPU (`gpu-<index>`,
//! NVML's index) with `allowMultipleAllocations` (several claims share it) and two consumable
//! capacities: `memory` (the GPU's, taken in steps of `--memory-step`, `--memory-default` when a
//! request names none) and `compute` (percent: what production claims reserve; 0 unless a
//! request asks). Attributes: `uuid`, `productName`, `index`, `driverVersion`. The pool's
//! generation moves whenever what the slice says changes (a GPU appears or goes).

use super::{quantity, DRIVER};
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceAttribute, DeviceCapacity,
    ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One GPU as NVML reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    pub index: u32,
    pub uuid: String,
    pub product: String,
    /// Total memory, bytes.
    pub memory: u64,
}

/// The node's GPUs (what `sharectl dra-plugin --probe` prints, asked in a fresh process).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inventory {
    pub driver_version: String,
    pub gpus: Vec<Gpu>,
}

impl Inventory {
    pub fn gpu(&self, index: u32) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.index == index)
    }
}

/// How memory is taken from a GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryPolicy {
    /// What a request that names no memory consumes.
    pub default: u64,
    /// The granule (and the least a request may take).
    pub step: u64,
}

/// The device name of GPU `index`.
pub fn device_name(index: u32) -> String {
    format!("gpu-{index}")
}

/// The GPU index a device name of ours names.
pub fn device_index(name: &str) -> Option<u32> {
    let i = name.strip_prefix("gpu-")?;
    (!i.is_empty() && i.len() <= 5 && i.bytes().all(|b| b.is_ascii_digit()))
        .then(|| i.parse().ok())
        .flatten()
}

/// The slice's name: one per node (a node name is a DNS subdomain, so is this).
pub fn slice_name(node: &str) -> String {
    format!("{node}-{DRIVER}")
}

/// NVIDIA's `580.65.06` as a semantic version (`580.65.6`), which attributes of type `version`
/// must be; `None` if it is not numbers separated by dots.
fn semver(v: &str) -> Option<String> {
    let parts: Vec<u64> = v
        .split('.')
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    if parts.is_empty() || parts.len() > 3 {
        return None;
    }
    let mut p = parts.clone();
    p.resize(3, 0);
    Some(format!("{}.{}.{}", p[0], p[1], p[2]))
}

fn q(s: String) -> Quantity {
    Quantity(s)
}

/// The devices of `inv`.
pub fn devices(inv: &Inventory, mem: MemoryPolicy) -> Vec<Device> {
    let version = if let Some(v) = semver(&inv.driver_version) {
        DeviceAttribute {
            version: Some(v),
            ..Default::default()
        }
    } else {
        DeviceAttribute {
            string: Some(inv.driver_version.clone()),
            ..Default::default()
        }
    };
    inv.gpus
        .iter()
        .map(|g| {
            let attributes = BTreeMap::from([
                (
                    "uuid".to_string(),
                    DeviceAttribute {
                        string: Some(g.uuid.clone()),
                        ..Default::default()
                    },
                ),
                (
                    "productName".to_string(),
                    DeviceAttribute {
                        string: Some(g.product.clone()),
                        ..Default::default()
                    },
                ),
                (
                    "index".to_string(),
                    DeviceAttribute {
                        int: Some(g.index as i64),
                        ..Default::default()
                    },
                ),
                ("driverVersion".to_string(), version.clone()),
            ]);
            let memory = DeviceCapacity {
                value: q(quantity::format(g.memory)),
                request_policy: Some(CapacityRequestPolicy {
                    default: Some(q(quantity::format(mem.default.min(g.memory)))),
                    valid_range: Some(CapacityRequestPolicyRange {
                        min: q(quantity::format(mem.step)),
                        max: Some(q(quantity::format(g.memory))),
                        step: Some(q(quantity::format(mem.step))),
                    }),
                    valid_values: None,
                }),
            };
            let compute = DeviceCapacity {
                value: q("100".into()),
                request_policy: Some(CapacityRequestPolicy {
                    default: Some(q("0".into())),
                    valid_range: Some(CapacityRequestPolicyRange {
                        min: q("0".into()),
                        max: Some(q("100".into())),
                        step: Some(q("1".into())),
                    }),
                    valid_values: None,
                }),
            };
            Device {
                name: device_name(g.index),
                allow_multiple_allocations: Some(true),
                attributes: Some(attributes),
                capacity: Some(BTreeMap::from([
                    ("memory".to_string(), memory),
                    ("compute".to_string(), compute),
                ])),
                ..Default::default()
            }
        })
        .collect()
}

/// The node's slice at pool generation `generation`.
pub fn slice(node: &str, devices: Vec<Device>, generation: i64) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(slice_name(node)),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_string(),
                "sharectl-dra-plugin".to_string(),
            )])),
            ..Default::default()
        },
        spec: ResourceSliceSpec {
            driver: DRIVER.into(),
            node_name: Some(node.into()),
            pool: ResourcePool {
                name: node.into(),
                generation,
                resource_slice_count: 1,
            },
            devices: Some(devices),
            ..Default::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_is_one_shareable_device_with_memory_and_compute() {
        let inv = Inventory {
            driver_version: "580.65.06".into(),
            gpus: vec![Gpu {
                index: 0,
                uuid: "GPU-0a".into(),
                product: "NVIDIA H100".into(),
                memory: 16 << 30,
            }],
        };
        let mem = MemoryPolicy {
            default: 1 << 30,
            step: 256 << 20,
        };
        let s = slice("node-a", devices(&inv, mem), 3);
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["apiVersion"], "resource.k8s.io/v1");
        assert_eq!(v["kind"], "ResourceSlice");
        assert_eq!(v["metadata"]["name"], "node-a-gpu.libshare.dev");
        assert_eq!(v["spec"]["pool"]["generation"], 3);
        let d = &v["spec"]["devices"][0];
        assert_eq!(d["name"], "gpu-0");
        assert_eq!(d["allowMultipleAllocations"], true);
        assert_eq!(d["capacity"]["memory"]["value"], "16Gi");
        assert_eq!(d["capacity"]["memory"]["requestPolicy"]["default"], "1Gi");
        assert_eq!(
            d["capacity"]["memory"]["requestPolicy"]["validRange"]["step"],
            "256Mi"
        );
        assert_eq!(d["capacity"]["compute"]["value"], "100");
        assert_eq!(d["attributes"]["driverVersion"]["version"], "580.65.6");
        assert_eq!(d["attributes"]["index"]["int"], 0);
        assert_eq!(device_index("gpu-12"), Some(12));
        for bad in ["gpu-", "gpu-x", "gpu0", "gpu--1", "gpu-123456"] {
            assert_eq!(device_index(bad), None, "{bad}");
        }
        assert_eq!(semver("580.00").as_deref(), Some("580.0.0"));
        assert_eq!(semver("r580"), None);
    }
}
