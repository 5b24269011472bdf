//! Which container a process belongs to, from its cgroup (`/proc/<pid>/cgroup`), never from
//! what it says about itself.
//!
//! Every line of the file is looked at (cgroup v2's `0::/path`, and each v1 hierarchy's
//! `N:controllers:/path`), in file order; the first path a rule recognises wins:
//! 1. the operator's prefixes (`--cgroup-prefix P`): `P/<name>[/…]` is container `<name>`;
//! 2. container runtimes' layouts: docker (`/docker/<id>`, `docker-<id>.scope`), podman
//!    (`libpod-<id>.scope`, `/libpod_parent/libpod-<id>`), containerd and CRI
//!    (`cri-containerd-<id>.scope`, kubepods paths ending in the container id), CRI-O
//!    (`crio-<id>.scope`): the container is the first 12 hex digits of the id, as `docker ps`
//!    shows it. The outermost id in the path counts, so a child cgroup a container creates
//!    (named after another container) cannot change whose process it is.
//!
//! A process no rule maps is container `host`, unless the operator trusts the environment
//! (`--trust-env`: plain hosts, tests): then the name the process claims (`LIBSHARE_CONTAINER`,
//! else `default`, as without a daemon). A process in a mapped cgroup gets that cgroup's
//! container whatever its environment says.

use libshare_abi::admin::valid_container_name;

#[derive(Clone, Debug, Default)]
pub struct IdentityConfig {
    /// Operator prefixes, e.g. `/kubepods.slice/tenants` (no trailing '/').
    pub prefixes: Vec<String>,
    pub trust_env: bool,
}

/// The container of unmapped processes when the environment is not trusted.
pub const HOST: &str = "host";

fn is_hex_id(s: &str) -> bool {
    s.len() >= 12 && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The container id a runtime put in one path component, if any.
fn runtime_id(component: &str) -> Option<&str> {
    for (pre, post) in [
        ("docker-", ".scope"),
        ("libpod-", ".scope"),
        ("cri-containerd-", ".scope"),
        ("crio-", ".scope"),
        ("libpod-", ""),
        ("docker-", ""),
    ] {
        if let Some(id) = component
            .strip_prefix(pre)
            .and_then(|r| r.strip_suffix(post))
            .filter(|id| is_hex_id(id))
        {
            return Some(id);
        }
    }
    None
}

/// The container a cgroup path maps to.
pub fn container_of_path(path: &str, cfg: &IdentityConfig) -> Option<String> {
    for p in &cfg.prefixes {
        let p = p.trim_end_matches('/');
        if let Some(rest) = path.strip_prefix(p).and_then(|r| r.strip_prefix('/')) {
            let name = rest.split('/').next().unwrap_or("");
            if valid_container_name(name) {
                return Some(name.to_string());
            }
        }
    }
    // The outermost id wins: a container that may create cgroups under its own (delegated
    // cgroups, nested runtimes) can name a child `libpod-<another id>`, never its own parents.
    let parts: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    for (i, c) in parts.iter().enumerate() {
        if let Some(id) = runtime_id(c) {
            return Some(id[..12].to_ascii_lowercase());
        }
        // `/docker/<id>`, and kubepods (cgroupfs driver): `/kubepods/<qos>/pod<uid>/<id>`.
        let under = parts[..i]
            .iter()
            .any(|p| *p == "docker" || p.starts_with("kubepods"));
        if under && is_hex_id(c) && c.len() == 64 {
            return Some(c[..12].to_ascii_lowercase());
        }
    }
    None
}

/// The container named by a `/proc/<pid>/cgroup` file's text.
pub fn container_of_cgroups(text: &str, cfg: &IdentityConfig) -> Option<String> {
    text.lines()
        .filter_map(|l| l.splitn(3, ':').nth(2))
        .find_map(|path| container_of_path(path, cfg))
}

/// The part of cgroup `path` that names its container (`P/<name>` for an operator prefix, the
/// path down to the runtime's id component otherwise), with the container.
fn container_path(path: &str, cfg: &IdentityConfig) -> Option<(String, String)> {
    let name = container_of_path(path, cfg)?;
    for p in &cfg.prefixes {
        let p = p.trim_end_matches('/');
        if path
            .strip_prefix(p)
            .and_then(|r| r.strip_prefix('/'))
            .is_some_and(|r| r.split('/').next() == Some(name.as_str()))
        {
            return Some((name.clone(), format!("{p}/{name}")));
        }
    }
    let parts: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    let end = parts
        .iter()
        .position(|c| c.to_ascii_lowercase().contains(&name))
        .map_or(parts.len(), |i| i + 1);
    Some((name, format!("/{}", parts[..end].join("/"))))
}

/// The container a `/proc/<pid>/cgroup` text names and the sysfs directory of the cgroup that
/// names it (`0::/p` → `/sys/fs/cgroup/p`; a v1 hierarchy's `N:ctrl:/p` →
/// `/sys/fs/cgroup/ctrl/p`), where that directory exists: what the driver's per-cgroup memory
/// limits are set on ([`crate::caps`]).
pub fn container_cgroup(text: &str, cfg: &IdentityConfig) -> Option<(String, std::path::PathBuf)> {
    text.lines().find_map(|l| {
        let mut it = l.splitn(3, ':');
        let (id, ctrl, path) = (it.next()?, it.next()?, it.next()?);
        let (name, cg) = container_path(path, cfg)?;
        let root = std::path::Path::new("/sys/fs/cgroup");
        let dir = if id == "0" && ctrl.is_empty() {
            root.join(cg.trim_start_matches('/'))
        } else {
            root.join(ctrl.strip_prefix("name=").unwrap_or(ctrl))
                .join(cg.trim_start_matches('/'))
        };
        dir.is_dir().then_some((name, dir))
    })
}

/// Where a registering process belongs: its cgroup's container, else (trusted environment)
/// the name it claims or `default`, else [`HOST`]. `cgroups` is what was read of the process
/// itself: a process whose cgroup could not be read is refused, never resolved.
pub fn resolve(cgroups: &str, claimed: &str, cfg: &IdentityConfig) -> String {
    if let Some(c) = container_of_cgroups(cgroups, cfg) {
        return c;
    }
    if cfg.trust_env {
        if claimed.is_empty() {
            return "default".into();
        }
        if valid_container_name(claimed) {
            return claimed.into();
        }
    }
    HOST.into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ID: &str = "4f3c2a1b0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a";

    fn cfg() -> IdentityConfig {
        IdentityConfig {
            prefixes: vec!["/libshare-test-1".into()],
            trust_env: false,
        }
    }

    #[test]
    fn the_cgroup_that_names_a_container_is_cut_at_its_name() {
        let c = cfg();
        assert_eq!(
            container_path("/libshare-test-1/A/sub", &c),
            Some(("A".into(), "/libshare-test-1/A".into()))
        );
        let k = format!("/kubepods/burstable/pod1/{ID}");
        assert_eq!(container_path(&k, &c), Some((ID[..12].into(), k.clone())));
        let p = format!("/machine.slice/libpod-{ID}.scope/container");
        assert_eq!(
            container_path(&p, &c),
            Some((ID[..12].into(), format!("/machine.slice/libpod-{ID}.scope")))
        );
        assert_eq!(container_path("/user.slice", &c), None);
    }

    #[test]
    fn runtimes_layouts_map_to_the_short_id() {
        let short = &ID[..12];
        for text in [
            format!("0::/system.slice/docker-{ID}.scope\n"),
            format!("12:pids:/docker/{ID}\n0::/\n"),
            format!("0::/machine.slice/libpod-{ID}.scope/container\n"),
            format!("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234.slice/cri-containerd-{ID}.scope\n"),
            format!("0::/kubepods.slice/kubepods-pod99.slice/crio-{ID}.scope\n"),
            format!("5:memory:/kubepods/besteffort/pod0b1c2d/{ID}\n"),
        ] {
            assert_eq!(container_of_cgroups(&text, &cfg()).as_deref(), Some(short), "{text}");
        }
    }

    #[test]
    fn a_child_cgroup_named_after_another_container_is_still_its_parents() {
        let other = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        for text in [
            format!("0::/libpod_parent/libpod-{ID}/libpod-{other}\n"),
            format!("0::/system.slice/docker-{ID}.scope/docker-{other}.scope\n"),
            format!("4:memory:/docker/{ID}/docker/{other}\n"),
            format!("0::/kubepods.slice/crio-{ID}.scope/crio-{other}.scope\n"),
        ] {
            assert_eq!(
                container_of_cgroups(&text, &cfg()).as_deref(),
                Some(&ID[..12]),
                "{text}"
            );
        }
    }

    #[test]
    fn prefixes_come_first_and_the_environment_counts_only_when_trusted_and_unmapped() {
        let text = "9:name=systemd:/\n8:pids:/libshare-test-1/A\n0::/\n";
        assert_eq!(resolve(text, "B", &cfg()), "A");
        let trusting = IdentityConfig {
            trust_env: true,
            ..cfg()
        };
        assert_eq!(
            resolve(text, "B", &trusting),
            "A",
            "mapped: the cgroup wins"
        );
        let plain = "0::/user.slice/session-1.scope\n";
        assert_eq!(resolve(plain, "B", &cfg()), HOST);
        assert_eq!(resolve(plain, "B", &trusting), "B");
        assert_eq!(resolve(plain, "", &trusting), "default");
        assert_eq!(resolve(plain, "../x", &trusting), HOST);
        // Only the safe alphabet (libshare_abi::names): a terminal sequence or a space is no name.
        assert_eq!(resolve(plain, "a\x1b[2Jb", &trusting), HOST);
        assert_eq!(resolve(plain, "web 1", &trusting), HOST);
        assert_eq!(resolve(plain, "ns.pod-7_x", &trusting), "ns.pod-7_x");
        assert_eq!(container_of_path("/libshare-test-1/../x", &cfg()), None);
        assert_eq!(
            container_of_path("/libshare-test-10/A", &cfg()),
            None,
            "a prefix is a whole component"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn any_cgroup_text_resolves_to_a_valid_name(text in "\\PC{0,300}", claimed in "\\PC{0,40}", trust in any::<bool>()) {
            let c = IdentityConfig { prefixes: vec!["/p".into()], trust_env: trust };
            let name = resolve(&text, &claimed, &c);
            prop_assert!(valid_container_name(&name), "{:?}", name);
        }
    }
}
