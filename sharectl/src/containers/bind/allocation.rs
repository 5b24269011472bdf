//! A device plugin's allocation bound to the container that names it (its CDI device's
//! `--allocation NAME`, or its `libshare.dev/allocation` annotation): the allocation's quota per
//! GPU, and the class and compute share of the pod's annotations (`libshare.dev/class`,
//! `libshare.dev/compute`), production only in a namespace the plugin allows.

use super::{apply, container_name, release};
use crate::admin::parse_compute;
use anyhow::{anyhow, bail, Result};
use libshare_abi::admin::{Class, ContainerSettings, DeviceSettings};
use libshare_abi::units::format_size;
use libshare_k8s::allocation::{self, ALLOCATION_ANNOTATION, CLASS_ANNOTATION, COMPUTE_ANNOTATION};
use std::collections::HashMap;
use std::path::Path;

/// A container's annotations (its config's).
pub type Annotations = HashMap<String, String>;

/// The allocation a container names: the hook's `--allocation` or its annotation.
fn allocation_of(annotations: &Annotations, arg: Option<&str>) -> Result<Option<String>> {
    let ann = annotations.get(ALLOCATION_ANNOTATION).map(String::as_str);
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
fn pod_choices(annotations: &Annotations) -> Result<(Option<Class>, Option<u32>)> {
    let class = match annotations.get(CLASS_ANNOTATION) {
        None => None,
        Some(v) => Some(Class::from_name(v).ok_or_else(|| {
            anyhow!(
                "pod annotation {CLASS_ANNOTATION}={v:?}: expected production or opportunistic; \
                 the container is not started (fix the pod's annotation)"
            )
        })?),
    };
    let compute = match annotations.get(COMPUTE_ANNOTATION) {
        None => None,
        Some(v) => Some(parse_compute(v).map_err(|e| {
            anyhow!(
                "pod annotation {COMPUTE_ANNOTATION}={v:?}: {e}; the container is not \
                 started (fix the pod's annotation)"
            )
        })?),
    };
    Ok((class, compute))
}

/// The runtime's annotations naming the pod's namespace: CRI-O's and containerd's. The runtime
/// writes them from the pod's sandbox, not from the pod's annotations.
const NAMESPACE_ANNOTATIONS: [&str; 2] = [
    "io.kubernetes.pod.namespace",
    "io.kubernetes.cri.sandbox-namespace",
];

/// The pod's namespace as the runtime names it (`None`: none, or two that disagree).
fn pod_namespace(annotations: &Annotations) -> Option<&str> {
    let mut found = NAMESPACE_ANNOTATIONS
        .iter()
        .filter_map(|k| annotations.get(*k).map(String::as_str));
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

/// At createRuntime: sets the allocation's quota per GPU and the pod's class (annotation, else
/// the plugin's default; production only in a namespace the plugin allows) on the daemon for the
/// container `id`. `None` when the container names no allocation; a bad annotation or
/// allocation is one error and nothing is set.
pub fn bind(
    state_dir: &Path,
    id: &str,
    annotations: &Annotations,
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
    let mut settings = ContainerSettings {
        class: Some(class),
        ..Default::default()
    };
    settings.all.compute = compute;
    // By the node's GPU index (NVML's, as the allocation names its GPUs): the daemon's and the
    // shim's quotas are per node GPU, whatever ordinal the container's CUDA gives it (GPU 3
    // alone is the container's CUDA device 0, still GPU 3 to libshare).
    for (&gpu, &bytes) in &alloc.quota {
        settings.devices.insert(
            gpu.to_string(),
            DeviceSettings {
                memory: Some(bytes),
                ..Default::default()
            },
        );
    }
    apply(
        state_dir,
        &container,
        &format!("allocation {name}"),
        settings,
    )?;
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
    annotations: &Annotations,
    arg: Option<&str>,
) -> Option<String> {
    let name = allocation_of(annotations, arg).ok().flatten()?;
    release(state_dir, id, &format!("allocation {name}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> Annotations {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
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
}
