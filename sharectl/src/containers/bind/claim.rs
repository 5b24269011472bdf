//! A DRA claim bound to the containers that use it (their CDI device's `--claim UID`): the
//! hook reads the claim as `sharectl dra-plugin` recorded it (`<state dir>/k8s/dra/UID.json`,
//! root's) and sets, on the daemon, the claim's memory per GPU, its class (the DeviceClass's,
//! never the pod's annotations or environment), its compute cap and oversubscription. A
//! container using two claims gets both: their memory on a GPU adds up, the lower class and the
//! smaller cap win.

use super::{apply, container_name, release};
use crate::admin::ask;
use anyhow::{anyhow, Result};
use libshare_abi::admin::{Class, ContainerSettings, DeviceSettings, Request};
use libshare_abi::units::format_size;
use libshare_k8s::dra::claim::Prepared;
use libshare_k8s::dra::store;
use std::path::Path;

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
fn merged(p: &Prepared, prev: &ContainerSettings) -> ContainerSettings {
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
    let mut s = ContainerSettings {
        class: Some(class),
        oversubscribe: Some(oversubscribe),
        ..Default::default()
    };
    s.all.compute = compute;
    for (gpu, bytes) in &p.quota {
        let before = prev
            .device(*gpu as usize)
            .memory
            .filter(|_| !first)
            .unwrap_or(0);
        s.devices.insert(
            gpu.to_string(),
            DeviceSettings {
                memory: Some(bytes + before),
                ..Default::default()
            },
        );
    }
    s
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
    apply(
        state_dir,
        &container,
        &format!("claim {uid}"),
        merged(&p, &prev),
    )?;
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
        );
        assert_eq!(first.device(1).memory, Some(6 << 30));
        assert_eq!(first.class, Some(Class::Production));
        assert_eq!(
            first.oversubscribe,
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
        let second = merged(&prepared(Class::Production, 1, 6, Some(5000)), &prev);
        assert_eq!(second.device(1).memory, Some(9 << 30));
        assert_eq!(second.class, Some(Class::Opportunistic));
        assert_eq!(second.all.compute, Some(3000));
        assert_eq!(
            second.oversubscribe,
            Some(false),
            "the first did not allow it"
        );
    }
}
