//! Which container a process belongs to, from its cgroup (`/proc/<pid>/cgroup`), never from
//! what it says about itself, and only from a cgroup the kernel shows that root made.
//!
//! Every line of the file is looked at (cgroup v2's `0::/path`, and each v1 hierarchy's
//! `N:controllers:/path`), in file order; the first path a rule recognises **and whose naming
//! cgroup only root could have made** wins:
//! 1. the operator's prefixes (`--cgroup-prefix P`): `P/<name>[/…]` is container `<name>`;
//! 2. container runtimes' layouts, **under the runtimes' own parent cgroups only**
//!    ([`RUNTIME_PARENTS`], plus the operator's `--runtime-cgroup-parent`): docker
//!    (`/docker/<id>` with the cgroupfs driver, `/system.slice/docker-<id>.scope` with
//!    systemd's), podman (`/libpod_parent/libpod-<id>`, `/machine.slice/libpod-<id>.scope`),
//!    containerd and CRI-O under the kubelet (`/kubepods/<qos>/pod<uid>/<id>`,
//!    `/kubepods/…/crio-<id>`, `/kubepods.slice/…/cri-containerd-<id>.scope`,
//!    `…/crio-<id>.scope`): the container is the first 12 hex digits of the id, as `docker ps`
//!    shows it. The outermost id in the path counts, so a child cgroup a container creates
//!    (named after another container) cannot change whose process it is; an id that is not
//!    under a runtime's parent (a user's own delegated subtree, `user@UID.service`, which
//!    systemd hands every user on cgroup v2) names nothing.
//!
//! **Made by root.** A cgroup names a container only if its parent directory (in the sysfs
//! mount of that line's hierarchy, found in `/proc/self/mountinfo`) is owned by root and
//! writable by no one else: only root can then have created (or, on v1, renamed) a directory
//! there. The naming directory itself may belong to another user: runc hands a user-namespaced
//! container its own cgroup (chowned to the container's root) when it has a private cgroup
//! namespace, and that container is still the one its runtime named. A delegated subtree
//! (systemd's `Delegate=yes`: `user@UID.service`, or a service under `/system.slice`) is its
//! user's, so nothing its user creates below it names a container, whatever the name.
//!
//! A process no rule maps is container `host`, unless the operator trusts the environment
//! (`--trust-env`: plain hosts, tests): then the name the process claims (`LIBSHARE_CONTAINER`,
//! else `default`, as without a daemon). Without trust, a process under a user's slice
//! (`/user.slice/user-<uid>.slice/…`, systemd's per-user cgroup, made by root) is container
//! `user-<uid>`: a rootless container (podman's `…/user@UID.service/…/libpod-<id>.scope`, owned
//! by its user) is its user's, never the id it carries. A process in a mapped cgroup gets that
//! cgroup's container whatever its environment says.

use libshare_abi::admin::valid_container_name;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The parent cgroups container runtimes create their containers' cgroups under, with the
/// systemd driver and the cgroupfs driver, on cgroup v1 and v2: `/system.slice` (docker,
/// systemd: `docker-<id>.scope`), `/machine.slice` (podman as root, systemd:
/// `libpod-<id>.scope`), `/kubepods.slice` and `/kubepods` (the kubelet's QoS and pod cgroups,
/// systemd and cgroupfs: containerd's, CRI-O's and cri-dockerd's containers), `/docker` (docker,
/// cgroupfs) and `/libpod_parent` (podman as root, cgroupfs). A runtime configured with another
/// parent (`--cgroup-parent`, the kubelet's `--cgroup-root`) is named with
/// `sharectl daemon --runtime-cgroup-parent`.
pub const RUNTIME_PARENTS: &[&str] = &[
    "/system.slice",
    "/machine.slice",
    "/kubepods.slice",
    "/kubepods",
    "/docker",
    "/libpod_parent",
];

#[derive(Clone, Debug, Default)]
pub struct IdentityConfig {
    /// Operator prefixes, e.g. `/kubepods.slice/tenants` (no trailing '/').
    pub prefixes: Vec<String>,
    pub trust_env: bool,
    /// Parent cgroups where runtime ids count, besides [`RUNTIME_PARENTS`].
    pub runtime_parents: Vec<String>,
    /// Where the hierarchies are mounted (the ownership checks).
    pub fs: CgroupFs,
}

/// The container of unmapped processes when the environment is not trusted.
pub const HOST: &str = "host";

/// A cgroup directory's owner and permission bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub mode: u32,
}

type Stat = dyn Fn(&Path) -> Option<Owner> + Send + Sync;

/// The cgroup hierarchies as this host mounts them: the sysfs directory of a path in a
/// `/proc/<pid>/cgroup` line's hierarchy, and who owns it.
#[derive(Clone)]
pub struct CgroupFs {
    /// cgroup v2's mount point.
    v2: Option<PathBuf>,
    /// Each v1 hierarchy: its controllers (and `name=…`), mount point, and the cgroup mounted
    /// there (`/` unless a bind mount of a subtree).
    v1: Vec<(Vec<String>, PathBuf, String)>,
    stat: Arc<Stat>,
}

impl std::fmt::Debug for CgroupFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CgroupFs")
            .field("v2", &self.v2)
            .field("v1", &self.v1)
            .finish()
    }
}

impl Default for CgroupFs {
    /// This host's ([`CgroupFs::host`]).
    fn default() -> Self {
        CgroupFs::host()
    }
}

/// The directory's owner, not following a link; None if it is not a directory.
fn stat_dir(p: &Path) -> Option<Owner> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(p).ok()?;
    m.is_dir().then(|| Owner {
        uid: m.uid(),
        mode: m.mode() & 0o7777,
    })
}

/// A mountinfo field with its octal escapes (`\040` for a space) decoded.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = b[i + 1..i + 4]
                .iter()
                .fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Mount options of a v1 cgroup mount that are not a controller.
const NOT_CONTROLLERS: &[&str] = &[
    "rw",
    "ro",
    "xattr",
    "noprefix",
    "clone_children",
    "cpuset_v2_mode",
    "nsdelegate",
];

impl CgroupFs {
    /// The hierarchies this process sees (`/proc/self/mountinfo`); where that cannot be read,
    /// the conventional layout (`/sys/fs/cgroup` for v2, or `/sys/fs/cgroup/unified` beside
    /// v1's `/sys/fs/cgroup/<controllers>`).
    pub fn host() -> CgroupFs {
        let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut fs = CgroupFs::parse(&text, Arc::new(stat_dir));
        if fs.v2.is_none() && fs.v1.is_empty() {
            let root = Path::new("/sys/fs/cgroup");
            fs.v2 = Some(if root.join("cgroup.controllers").exists() {
                root.to_path_buf()
            } else {
                root.join("unified")
            });
        }
        fs
    }

    /// The cgroup mounts of a mountinfo text (`proc(5)`), each hierarchy once.
    pub fn parse(mountinfo: &str, stat: Arc<Stat>) -> CgroupFs {
        let mut fs = CgroupFs {
            v2: None,
            v1: Vec::new(),
            stat,
        };
        for line in mountinfo.lines() {
            let Some((pre, post)) = line.split_once(" - ") else {
                continue;
            };
            let pre: Vec<&str> = pre.split(' ').collect();
            let post: Vec<&str> = post.split(' ').collect();
            let (Some(root), Some(point), Some(fstype), Some(opts)) =
                (pre.get(3), pre.get(4), post.first(), post.get(2))
            else {
                continue;
            };
            let (root, point) = (unescape(root), PathBuf::from(unescape(point)));
            match *fstype {
                "cgroup2" if fs.v2.is_none() && root == "/" => fs.v2 = Some(point),
                "cgroup" => {
                    let ctrls: Vec<String> = opts
                        .split(',')
                        .filter(|o| {
                            !NOT_CONTROLLERS.contains(o) && !o.starts_with("release_agent=")
                        })
                        .map(str::to_string)
                        .collect();
                    if !ctrls.is_empty() && !fs.v1.iter().any(|(c, _, _)| *c == ctrls) {
                        fs.v1.push((ctrls, point, root));
                    }
                }
                _ => {}
            }
        }
        fs
    }

    /// The sysfs directory of cgroup `path` (as `/proc/<pid>/cgroup` shows it) in the hierarchy
    /// of the line `id:ctrl:`; None where that hierarchy is not mounted here or the path
    /// climbs (`..`).
    pub fn dir(&self, id: &str, ctrl: &str, path: &str) -> Option<PathBuf> {
        let parts = components(path)?;
        let (mount, root) = if id == "0" && ctrl.is_empty() {
            (self.v2.as_ref()?, "/")
        } else {
            let want: Vec<&str> = ctrl.split(',').filter(|c| !c.is_empty()).collect();
            let (_, m, r) = self
                .v1
                .iter()
                .find(|(c, _, _)| want.iter().all(|w| c.iter().any(|x| x == w)))?;
            (m, r.as_str())
        };
        let root = components(root)?;
        let rest = parts.strip_prefix(root.as_slice())?;
        Some(rest.iter().fold(mount.clone(), |p, c| p.join(c)))
    }

    /// The sysfs directory of cgroup `path` if only root could have made it there: its parent
    /// directory is root's and writable by no one else (see the module doc).
    pub fn root_made(&self, id: &str, ctrl: &str, path: &str) -> Option<PathBuf> {
        let parts = components(path)?;
        let (_, above) = parts.split_last()?;
        let dir = self.dir(id, ctrl, path)?;
        let parent = self.dir(id, ctrl, &format!("/{}", above.join("/")))?;
        let p = (self.stat)(&parent)?;
        (p.uid == 0 && p.mode & 0o022 == 0 && (self.stat)(&dir).is_some()).then_some(dir)
    }
}

/// The components of an absolute cgroup path; None for one that climbs or is not absolute.
fn components(path: &str) -> Option<Vec<&str>> {
    let rest = path.strip_prefix('/')?;
    let parts: Vec<&str> = rest.split('/').filter(|c| !c.is_empty()).collect();
    parts
        .iter()
        .all(|c| *c != "." && *c != "..")
        .then_some(parts)
}

fn is_hex_id(s: &str) -> bool {
    s.len() >= 12 && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The one rule from a runtime's hex container id (12 to 128 hex digits: containerd's, CRI-O's,
/// podman's, Docker's) to the container's name here: its first 12 digits, lowercase, as the
/// runtimes' cgroup layouts name it. `None` for any other id.
pub fn short_id(id: &str) -> Option<String> {
    is_hex_id(id).then(|| id[..12].to_ascii_lowercase())
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
        ("crio-", ""),
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

/// What the layout of cgroup `path` names, before any ownership check: the container and how
/// many of the path's components name it (the naming cgroup is the path cut there).
fn layout(path: &str, cfg: &IdentityConfig) -> Option<(String, usize)> {
    let parts = components(path)?;
    for p in &cfg.prefixes {
        let Some(pre) = components(p.trim_end_matches('/')) else {
            continue;
        };
        if let Some(name) = parts.strip_prefix(pre.as_slice()).and_then(|r| r.first()) {
            if valid_container_name(name) {
                return Some((name.to_string(), pre.len() + 1));
            }
        }
    }
    // The outermost id wins: a container that may create cgroups under its own (delegated
    // cgroups, nested runtimes) can name a child `libpod-<another id>`, never its own parents.
    let (i, id) = parts.iter().enumerate().find_map(|(i, c)| {
        if let Some(id) = runtime_id(c) {
            return Some((i, id));
        }
        // `/docker/<id>`, and kubepods (cgroupfs driver): `/kubepods/<qos>/pod<uid>/<id>`.
        let under = parts[..i]
            .iter()
            .any(|p| *p == "docker" || p.starts_with("kubepods"));
        (under && is_hex_id(c) && c.len() == 64).then_some((i, *c))
    })?;
    let parents = RUNTIME_PARENTS
        .iter()
        .copied()
        .chain(cfg.runtime_parents.iter().map(String::as_str));
    let under_parent = parents
        .filter_map(components)
        .any(|pp| !pp.is_empty() && pp.len() <= i && parts.starts_with(&pp));
    if !under_parent {
        return None;
    }
    Some((short_id(id)?, i + 1))
}

/// A process under systemd's slice of user `<uid>` (`/user.slice/user-<uid>.slice/…`): its
/// container `user-<uid>`, named by 2 components.
fn user_slice(path: &str) -> Option<(String, usize)> {
    let parts = components(path)?;
    let uid = parts
        .get(1)?
        .strip_prefix("user-")?
        .strip_suffix(".slice")
        .filter(|u| !u.is_empty() && u.len() <= 10 && u.bytes().all(|b| b.is_ascii_digit()))?;
    (parts[0] == "user.slice").then(|| (format!("user-{uid}"), 2))
}

/// The container a cgroup path's layout maps to (no ownership check: see [`naming`]).
pub fn container_of_path(path: &str, cfg: &IdentityConfig) -> Option<String> {
    layout(path, cfg).map(|(n, _)| n)
}

/// A container, as a cgroup names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Naming {
    pub name: String,
    /// The cgroup that names it, as `/proc/<pid>/cgroup` shows it
    /// (`/machine.slice/libpod-<id>.scope`, `P/<name>`).
    pub cgroup: String,
    /// That cgroup's sysfs directory (what the driver's per-cgroup limits are set on,
    /// [`crate::caps`]).
    pub dir: PathBuf,
}

impl Naming {
    /// The cgroup the naming cgroup was created in (`/machine.slice`, `P`).
    pub fn parent(&self) -> &str {
        match self.cgroup.rfind('/') {
            Some(0) | None => "/",
            Some(i) => &self.cgroup[..i],
        }
    }
}

/// The container a `/proc/<pid>/cgroup` text names and the cgroup that names it: the first
/// line whose path a rule maps and whose naming cgroup root made; else, not trusting the
/// environment, the user slice a line shows.
pub fn naming(text: &str, cfg: &IdentityConfig) -> Option<Naming> {
    let lines = || {
        text.lines().filter_map(|l| {
            let mut it = l.splitn(3, ':');
            Some((it.next()?, it.next()?, it.next()?))
        })
    };
    let named = |(id, ctrl, path): (&str, &str, &str), (name, n): (String, usize)| {
        let parts = components(path)?;
        let cgroup = format!("/{}", parts[..n].join("/"));
        let dir = cfg.fs.root_made(id, ctrl, &cgroup)?;
        Some(Naming { name, cgroup, dir })
    };
    lines()
        .find_map(|l| named(l, layout(l.2, cfg)?))
        .or_else(|| {
            if cfg.trust_env {
                return None;
            }
            lines().find_map(|l| named(l, user_slice(l.2)?))
        })
}

/// The container named by a `/proc/<pid>/cgroup` file's text ([`naming`]).
pub fn container_of_cgroups(text: &str, cfg: &IdentityConfig) -> Option<String> {
    naming(text, cfg).map(|n| n.name)
}

/// Where a registering process belongs: its cgroup's container, else (trusted environment)
/// the name it claims or `default`, else [`HOST`]. `cgroups` is what was read of the process
/// itself: a process whose cgroup could not be read is refused, never resolved.
pub fn resolve(cgroups: &str, claimed: &str, cfg: &IdentityConfig) -> String {
    container_of_cgroups(cgroups, cfg).unwrap_or_else(|| unmapped(claimed, cfg))
}

/// Where a process no cgroup maps belongs ([`resolve`]).
pub fn unmapped(claimed: &str, cfg: &IdentityConfig) -> String {
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

/// The names a runtime's container id `id` may have here: a runtime's hex id's first 12 digits
/// (the runtimes' layouts), or the id itself (an operator prefix's `P/<id>`).
pub fn names_of_id(id: &str) -> Vec<String> {
    let mut v = Vec::new();
    v.extend(short_id(id));
    if valid_container_name(id) {
        v.push(id.to_string());
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    const ID: &str = "4f3c2a1b0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a";
    const OTHER: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    /// A host with v2 at /sys/fs/cgroup and v1 `pids` at /sys/fs/cgroup/pids, where every
    /// directory is root's (0755) unless `owners` says otherwise (`None`: missing).
    fn fs(owners: &[(&str, Option<Owner>)]) -> CgroupFs {
        let map: HashMap<PathBuf, Option<Owner>> =
            owners.iter().map(|(p, o)| (PathBuf::from(p), *o)).collect();
        let mountinfo = "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n\
                         39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n";
        CgroupFs::parse(
            mountinfo,
            Arc::new(move |p: &Path| {
                map.get(p).copied().unwrap_or(Some(Owner {
                    uid: 0,
                    mode: 0o755,
                }))
            }),
        )
    }

    fn cfg() -> IdentityConfig {
        IdentityConfig {
            prefixes: vec!["/libshare-test-1".into()],
            trust_env: false,
            runtime_parents: Vec::new(),
            fs: fs(&[]),
        }
    }

    const NOBODY: Option<Owner> = Some(Owner {
        uid: 65534,
        mode: 0o755,
    });

    #[test]
    fn the_cgroup_that_names_a_container_is_cut_at_its_name() {
        let c = cfg();
        let n = naming("0::/libshare-test-1/A/sub\n", &c).unwrap();
        assert_eq!(
            (n.name.as_str(), n.cgroup.as_str(), n.parent()),
            ("A", "/libshare-test-1/A", "/libshare-test-1")
        );
        assert_eq!(n.dir, Path::new("/sys/fs/cgroup/libshare-test-1/A"));
        let k = format!("/kubepods/burstable/pod1/{ID}");
        let n = naming(&format!("5:pids:{k}\n"), &c).unwrap();
        assert_eq!(
            (n.name.as_str(), n.cgroup.as_str()),
            (&ID[..12], k.as_str())
        );
        assert_eq!(n.dir, Path::new("/sys/fs/cgroup/pids").join(&k[1..]));
        let p = format!("0::/machine.slice/libpod-{ID}.scope/container\n");
        assert_eq!(
            naming(&p, &c).unwrap().cgroup,
            format!("/machine.slice/libpod-{ID}.scope")
        );
        assert_eq!(naming("0::/user.slice\n", &c), None);
    }

    #[test]
    fn runtimes_layouts_map_to_the_short_id() {
        let short = &ID[..12];
        for text in [
            format!("0::/system.slice/docker-{ID}.scope\n"),
            format!("12:pids:/docker/{ID}\n0::/\n"),
            format!("0::/machine.slice/libpod-{ID}.scope/container\n"),
            format!("0::/libpod_parent/libpod-{ID}\n"),
            format!("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234.slice/cri-containerd-{ID}.scope\n"),
            format!("0::/kubepods.slice/kubepods-pod99.slice/crio-{ID}.scope\n"),
            format!("5:pids:/kubepods/besteffort/pod0b1c2d/{ID}\n"),
            format!("5:pids:/kubepods/burstable/pod0b1c2d/crio-{ID}\n"),
        ] {
            assert_eq!(container_of_cgroups(&text, &cfg()).as_deref(), Some(short), "{text}");
        }
    }

    #[test]
    fn a_child_cgroup_named_after_another_container_is_still_its_parents() {
        for text in [
            format!("0::/libpod_parent/libpod-{ID}/libpod-{OTHER}\n"),
            format!("0::/system.slice/docker-{ID}.scope/docker-{OTHER}.scope\n"),
            format!("4:pids:/docker/{ID}/docker/{OTHER}\n"),
            format!("0::/kubepods.slice/crio-{ID}.scope/crio-{OTHER}.scope\n"),
        ] {
            assert_eq!(
                container_of_cgroups(&text, &cfg()).as_deref(),
                Some(&ID[..12]),
                "{text}"
            );
        }
    }

    #[test]
    fn an_id_outside_the_runtimes_parents_or_in_a_cgroup_root_did_not_make_names_nothing() {
        let c = cfg();
        // A user's own delegated subtree (systemd's user@UID.service), anywhere but under a
        // runtime's parent: nothing, whoever owns it.
        for path in [
            format!("/user.slice/user-1000.slice/user@1000.service/app.slice/libpod-{ID}.scope"),
            format!("/libshare-test-2/nobody/libpod-{ID}.scope"),
            format!("/evil/docker/{ID}"),
            format!("/scratch/kubepods/pod1/{ID}"),
        ] {
            assert_eq!(layout(&path, &c), None, "{path}");
            let named = container_of_cgroups(&format!("0::{path}\n"), &c);
            assert_ne!(named.as_deref(), Some(&ID[..12]), "{path}");
        }
        // Under a runtime's parent, in a subtree root delegated to nobody (a `Delegate=yes`
        // service): its layout names the victim, but nobody made the cgroup.
        let evil = format!("/system.slice/evil.service/docker-{ID}.scope");
        let delegated = IdentityConfig {
            fs: fs(&[("/sys/fs/cgroup/system.slice/evil.service", NOBODY)]),
            ..cfg()
        };
        assert_eq!(
            layout(&evil, &delegated).map(|l| l.0),
            Some(ID[..12].into())
        );
        assert_eq!(naming(&format!("0::{evil}\n"), &delegated), None);
        // The same under an operator's prefix someone else may write.
        let open = IdentityConfig {
            fs: fs(&[(
                "/sys/fs/cgroup/libshare-test-1",
                Some(Owner {
                    uid: 0,
                    mode: 0o777,
                }),
            )]),
            ..cfg()
        };
        assert_eq!(naming("0::/libshare-test-1/A\n", &open), None);
        // A missing directory (the cgroup is gone) names nothing either.
        let gone = IdentityConfig {
            fs: fs(&[(
                &format!("/sys/fs/cgroup/machine.slice/libpod-{ID}.scope"),
                None,
            )]),
            ..cfg()
        };
        assert_eq!(
            naming(&format!("0::/machine.slice/libpod-{ID}.scope\n"), &gone),
            None
        );
        // A runc container given its own cgroup (chowned to its user namespace's root) is
        // still the container its runtime named: the parent is root's.
        let runc_userns = IdentityConfig {
            fs: fs(&[(
                &format!("/sys/fs/cgroup/machine.slice/libpod-{ID}.scope"),
                NOBODY,
            )]),
            ..cfg()
        };
        assert_eq!(
            container_of_cgroups(
                &format!("0::/machine.slice/libpod-{ID}.scope\n"),
                &runc_userns
            )
            .as_deref(),
            Some(&ID[..12])
        );
        // A hierarchy that fails goes to the next line (v1: one per hierarchy).
        let text = format!("9:pids:/system.slice/evil.service/docker-{OTHER}.scope\n0::/machine.slice/libpod-{ID}.scope\n");
        let both = IdentityConfig {
            fs: fs(&[("/sys/fs/cgroup/pids/system.slice/evil.service", NOBODY)]),
            ..cfg()
        };
        assert_eq!(
            container_of_cgroups(&text, &both).as_deref(),
            Some(&ID[..12])
        );
        // An operator's parent counts like the built-in ones.
        let custom = format!("0::/runtimes/libpod-{ID}.scope\n");
        assert_eq!(naming(&custom, &cfg()), None);
        let with = IdentityConfig {
            runtime_parents: vec!["/runtimes".into()],
            ..cfg()
        };
        assert_eq!(
            container_of_cgroups(&custom, &with).as_deref(),
            Some(&ID[..12])
        );
    }

    #[test]
    fn a_users_slice_is_its_container_when_the_environment_is_not_trusted() {
        let rootless = format!(
            "0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope/container\n"
        );
        let owned = IdentityConfig {
            fs: fs(&[(
                "/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service",
                Some(Owner {
                    uid: 1000,
                    mode: 0o755,
                }),
            )]),
            ..cfg()
        };
        assert_eq!(resolve(&rootless, "victim", &owned), "user-1000");
        let trusting = IdentityConfig {
            trust_env: true,
            ..owned
        };
        assert_eq!(resolve(&rootless, "victim", &trusting), "victim");
        assert_eq!(resolve("0::/user.slice/user-x.slice\n", "", &cfg()), HOST);
    }

    #[test]
    fn mountinfo_finds_each_hierarchy() {
        let text = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
                    35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
                    32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n\
                    40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd\n\
                    41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n\
                    50 31 0:32 /sub /mnt/mem\\040x rw - cgroup cgroup rw,memory\n";
        let f = CgroupFs::parse(text, Arc::new(stat_dir));
        assert_eq!(
            f.dir("0", "", "/a/b"),
            Some(PathBuf::from("/sys/fs/cgroup/unified/a/b"))
        );
        assert_eq!(
            f.dir("4", "cpuacct,cpu", "/a"),
            Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/a"))
        );
        assert_eq!(
            f.dir("1", "name=systemd", "/user.slice"),
            Some(PathBuf::from("/sys/fs/cgroup/systemd/user.slice"))
        );
        assert_eq!(f.dir("7", "pids", "/a"), None, "not mounted");
        assert_eq!(f.dir("0", "", "/a/../b"), None, "climbs");
        let sub = CgroupFs::parse(
            "50 31 0:32 /sub /mnt/mem\\040x rw - cgroup cgroup rw,memory\n",
            Arc::new(stat_dir),
        );
        assert_eq!(
            sub.dir("3", "memory", "/sub/c"),
            Some(PathBuf::from("/mnt/mem x/c"))
        );
        assert_eq!(sub.dir("3", "memory", "/other"), None);
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
        let plain = "0::/session-1.scope\n";
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
        assert_eq!(
            names_of_id(&ID.to_uppercase()),
            [&ID[..12], &ID.to_uppercase()]
        );
        assert_eq!(names_of_id("web-1"), ["web-1"]);
        assert!(names_of_id("a/b").is_empty());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn any_cgroup_text_resolves_to_a_valid_name(text in "\\PC{0,300}", claimed in "\\PC{0,40}", trust in any::<bool>()) {
            let c = IdentityConfig { prefixes: vec!["/p".into()], trust_env: trust, runtime_parents: vec!["/r".into()], fs: fs(&[]) };
            let name = resolve(&text, &claimed, &c);
            prop_assert!(valid_container_name(&name), "{:?}", name);
        }
    }
}
