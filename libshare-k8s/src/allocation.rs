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
    /// The node's GPU index (NVML's) → memory quota in bytes (JSON writes the keys as strings;
    /// serde reads them back as indices, and refuses a key that is not one).
    pub quota: BTreeMap<u32, u64>,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotas_are_kept_by_gpu_index_and_read_back_as_indices() {
        let a = Allocation {
            name: "k8s-gpu2-share0-x3".into(),
            ids: vec!["gpu2-share0".into()],
            quota: [(10, 1u64), (2, 2)].into(),
            default_class: Class::Production,
            production_namespaces: Vec::new(),
        };
        let text = serde_json::to_string(&a).unwrap();
        // The file's format: JSON object keys, the GPU's index as a string.
        assert!(text.contains(r#""quota":{"2":2,"10":1}"#), "{text}");
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(super::dir(dir.path())).unwrap();
        let path = super::dir(dir.path()).join("k8s-gpu2-share0-x3.json");
        std::fs::write(&path, &text).unwrap();
        let back = read(dir.path(), "k8s-gpu2-share0-x3").unwrap();
        assert_eq!(back, a);
        assert_eq!(back.quota.keys().copied().collect::<Vec<_>>(), [2, 10]);
        // A key that is not a GPU index is a malformed file, not a quota of GPU 0.
        std::fs::write(&path, text.replace(r#""10":1"#, r#""ten":1"#)).unwrap();
        let e = read(dir.path(), "k8s-gpu2-share0-x3").unwrap_err();
        assert!(e.contains("is malformed") && !e.contains('\n'), "{e}");
    }
}
