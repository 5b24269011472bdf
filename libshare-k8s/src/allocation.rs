//! An allocation as the plugin records it on the host, for the runtime's hook to bind to the
//! container it starts: `<state dir>/k8s/<name>.json`, root's, written before `Allocate` answers.
//! The container names the allocation only through what the kubelet passed to its runtime (the
//! CDI device's hook arguments, or the `libshare.dev/allocation` annotation); the quota comes from
//! this file, never from the container.

use libshare_abi::admin::Class;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The annotation naming the allocation in a container's OCI config (the `Allocate` answer's
/// annotations; the path without CDI).
pub const ALLOCATION_ANNOTATION: &str = "libshare.dev/allocation";
/// The pod annotation choosing the class (`production` or `opportunistic`).
pub const CLASS_ANNOTATION: &str = "libshare.dev/class";
/// The pod annotation capping an opportunistic pod's compute share (`30%`).
pub const COMPUTE_ANNOTATION: &str = "libshare.dev/compute";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Allocation {
    pub name: String,
    /// The kubelet's device ids (shares), sorted.
    pub ids: Vec<String>,
    /// GPU index (as a string: JSON keys) → memory quota in bytes.
    pub quota: BTreeMap<String, u64>,
    /// The class when the pod's annotation does not say.
    pub default_class: Class,
    /// The namespaces whose pods may be production (`*`: all; the plugin's
    /// `--production-namespaces`): a pod elsewhere is opportunistic whatever it asks.
    #[serde(default)]
    pub production_namespaces: Vec<String>,
}

/// Where allocations are recorded.
pub fn dir(state_dir: &Path) -> PathBuf {
    state_dir.join("k8s")
}

/// An allocation name the plugin makes (`k8s-gpu0-share3-x2`); anything else is refused before
/// it becomes a path.
pub fn valid_name(name: &str) -> bool {
    name.starts_with("k8s-")
        && name.len() <= 96
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// Reads `<state dir>/k8s/<name>.json`; one line saying what is wrong.
pub fn read(state_dir: &Path, name: &str) -> Result<Allocation, String> {
    if !valid_name(name) {
        return Err(format!(
            "{name:?} is not an allocation name of libshare's device plugin (k8s-gpu<i>-share<k>-x<n>)"
        ));
    }
    let path = dir(state_dir).join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).map_err(|e| {
        format!(
            "allocation {name}: cannot read {} ({e}): was it made by this node's device plugin?",
            path.display()
        )
    })?;
    let a: Allocation = serde_json::from_str(&text)
        .map_err(|e| format!("allocation {name}: {} is malformed ({e})", path.display()))?;
    if a.name != name {
        return Err(format!(
            "allocation {name}: {} names {}",
            path.display(),
            a.name
        ));
    }
    Ok(a)
}
