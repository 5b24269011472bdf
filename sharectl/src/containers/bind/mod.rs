//! A Kubernetes allocation's or claim's settings bound to a container on the daemon, by
//! `sharectl hook` at createRuntime (released at poststop): neither plugin runs it, the
//! container's runtime does, once the container's id exists.
//!
//! The quota is bound on the host: the plugin records the allocation ([`allocation`]) or the
//! prepared claim ([`claim`]) under the daemon's state directory and writes a CDI spec whose one
//! device runs `sharectl hook --cdi --allocation NAME` (`--claim UID`); the hook sets the
//! container's settings on the daemon for the container's id from the runtime's state, in one
//! `bind` request ([`apply`]). The daemon names the container's processes from their cgroup,
//! so nothing the container says (`LIBSHARE_MEMORY_LIMIT`, `LIBSHARE_CLASS`) counts.

pub mod allocation;
pub mod claim;

use crate::admin::ask;
use anyhow::{anyhow, Result};
use libshare_abi::admin::{ContainerSettings, Request};
use std::path::Path;

/// The daemon's name for the container of runtime id `id` (its cgroup's:
/// `libshare_node::identity::short_id`).
pub fn container_name(id: &str) -> Result<String> {
    libshare_node::identity::short_id(id).ok_or_else(|| {
        anyhow!(
            "container id {id:?} is not a runtime's hex id (containerd, CRI-O, podman): the \
             daemon could not name its processes, so its allocation cannot be bound"
        )
    })
}

/// Sets `settings` (what binds `what` to `container`) on the daemon in one request: all of
/// them or, refused, none, and the container does not start.
pub fn apply(
    state_dir: &Path,
    container: &str,
    what: &str,
    settings: ContainerSettings,
) -> Result<()> {
    let req = Request::Bind {
        container: container.to_string(),
        settings,
    };
    ask(state_dir, &req)
        .map(drop)
        .map_err(|e| e.context(format!("cannot bind {what} to {container}")))
}

/// Forgets the daemon's settings of the container of runtime id `id`, which `what` (an
/// allocation, a claim) was bound to; the line saying so. `None` for an id that names no
/// container.
pub fn release(state_dir: &Path, id: &str, what: &str) -> Option<String> {
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

    #[test]
    fn a_runtimes_hex_id_names_the_container() {
        assert_eq!(container_name(&"AB".repeat(32)).unwrap(), "abababababab");
        assert!(container_name("my-container").is_err());
        assert!(
            container_name(&"a".repeat(129)).is_err(),
            "the library's bound"
        );
    }
}
