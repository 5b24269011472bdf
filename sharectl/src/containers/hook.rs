//! What `sharectl hook` does: an OCI `createRuntime` hook doing [`super::inject`]'s edits for runtimes without
//! CDI (runc's `config.json` hooks, podman/CRI-O `hooks.d`, and the hook `sharectl runtime`
//! adds), and, with `--cdi`, what a CDI spec cannot do by itself.
//!
//! The runtime runs it in the host's mount namespace once the container's mounts are made and
//! before `pivot_root`, with the container's state (`{id, pid, bundle, …}`) on stdin. It reads
//! `<bundle>/config.json` for the root filesystem and user, then:
//! - an image without glibc's loader (musl, static): injects nothing (a glibc shim is ignored
//!   by musl's loader at best, kills every program at worst); with `--cdi` it takes the spec's
//!   preload and shim mounts away again. One line in `<state dir>/inject/hook.log` and on stderr.
//! - an image with its own `/etc/ld.so.preload`: mounts a per-container file listing the shim
//!   and then the image's own entries (`<state dir>/inject/<id>.preload`, removed by the
//!   `poststop` stage), so both load.
//! - otherwise (without `--cdi`) the mounts ([`super::mount`]), made inside the container's mount
//!   namespace (`setns` into `/proc/<pid>/ns/mnt` in a forked child), as runc makes its own: every path
//!   resolved by the kernel inside the root filesystem (`openat2` with `RESOLVE_IN_ROOT`, from a
//!   descriptor of the root), a missing mount point created relative to its parent's descriptor
//!   (`O_CREAT|O_EXCL|O_NOFOLLOW`, `mkdirat`), the mount made on the opened mount point
//!   (`/proc/self/fd/<n>`) and made read-only on the new mount's own root after checking it
//!   shows the source. Neither an image's symbolic link nor someone renaming directories of the
//!   image while the hook runs (a volume shared with a running container) can point a mount or
//!   a new file outside the root.
//!
//! Bad input (state JSON, bundle, config) is one line on stderr and a non-zero exit, on which
//! the runtime does not start the container; nothing is written on the host before the input
//! is checked.
//!
//! Before anything is mounted, a Kubernetes allocation's or claim's settings are bound to the
//! container on the daemon ([`super::bind`]), and at poststop released.

use super::bind::{allocation, claim};
use super::inject::{
    has_glibc, open_in_root, open_root, sharectl_exe, write_atomic, InjectArgs, Mount, ANNOTATION,
    PRELOAD_IN_CONTAINER, SHIM_IN_CONTAINER,
};
use super::mount::{bind, in_mount_ns, unmount};
use super::oci::{parse_bundle, read_config, State};
use anyhow::{anyhow, bail, Context, Result};
use nix::fcntl::OFlag;
use serde_json::{json, Value};
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// One run of the hook: the node's layout and what the runtime's registration of it says.
#[derive(Debug, Clone, Copy)]
pub struct Hook<'a> {
    pub inject: &'a InjectArgs,
    /// The runtime applied a CDI spec's mounts.
    pub cdi: bool,
    /// The device plugin's allocation (`--allocation`; else the container's annotation).
    pub allocation: Option<&'a str>,
    /// The DRA claim's uid (`--claim`).
    pub claim: Option<&'a str>,
}

impl Hook<'_> {
    /// At poststop: the per-container files removed, the container's allocation or claim
    /// released on the daemon (never fails: the container is gone).
    pub fn poststop(&self, st: &State) {
        let inj = self.inject;
        let _ = std::fs::remove_file(merged_path(inj, &st.id));
        let annotations = read_config(&st.bundle)
            .map(|c| c.annotations())
            .unwrap_or_default();
        if let Some(line) =
            allocation::unbind(&inj.state_dir, &st.id, &annotations, self.allocation)
                .or_else(|| claim::unbind(&inj.state_dir, &st.id, self.claim))
        {
            log_line(inj, &line);
        }
    }

    /// At createRuntime: the settings bound, the daemon told the container's process, the
    /// edits made.
    pub fn create_runtime(&self, st: &State) -> Result<()> {
        let inj = self.inject;
        let pid = st.pid.ok_or_else(|| {
            anyhow!(
                "the container state has no \"pid\" of a process: expected the runtime's state \
                 JSON at createRuntime"
            )
        })?;
        inj.check(true)?;
        let b = parse_bundle(&st.bundle)?;
        // The allocation's (or claim's) quota and class, set for this container id before anything
        // else (a bad annotation or claim stops the container here, with nothing set or mounted).
        let bound = match self.claim {
            Some(_) => claim::bind(&inj.state_dir, &st.id, self.claim)?,
            None => allocation::bind(&inj.state_dir, &st.id, &b.annotations, self.allocation)?,
        };
        if let Some(line) = bound {
            log_line(inj, &line);
        }
        // The daemon sets the driver's limits on the container's cgroup now (never fails the start).
        if let Some(line) = crate::admin::started(&inj.state_dir, &st.id, pid) {
            log_line(inj, &line);
        }
        let ns = format!("/proc/{pid}/ns/mnt");
        if !Path::new(&ns).exists() {
            bail!("the container's process {pid} is gone ({ns})");
        }
        let root = open_root(&b.root)?;
        if !has_glibc(&root) {
            log_line(
                inj,
                &format!(
                    "container {}: no glibc loader in its image (musl or static): libshare not \
                     injected",
                    st.id
                ),
            );
            if self.cdi {
                let root = b.root.clone();
                in_mount_ns(pid, move || {
                    unmount(
                        &open_root(&root)?,
                        &[PRELOAD_IN_CONTAINER, SHIM_IN_CONTAINER],
                    )
                })?;
            }
            return Ok(());
        }
        let own = image_preload(&root)?;
        let preload = match &own {
            None => {
                inj.ensure_preload_file()?;
                inj.preload_file.clone()
            }
            Some(text) => {
                let path = merged_path(inj, &st.id);
                let text = format!("{SHIM_IN_CONTAINER}\n{text}\n");
                write_atomic(&path, text.as_bytes(), 0o644)?;
                path
            }
        };
        let mounts: Vec<Mount> = if self.cdi {
            // The spec mounted everything; only the merged list goes over its preload file.
            if own.is_none() {
                return Ok(());
            }
            vec![Mount {
                host: preload,
                container: PRELOAD_IN_CONTAINER.into(),
                readonly: true,
            }]
        } else {
            inj.mounts(&preload, b.uid)
        };
        let root = b.root.clone();
        in_mount_ns(pid, move || {
            // The root as this mount namespace shows it (before pivot_root: the bundle's path).
            let root = open_root(&root)?;
            for m in &mounts {
                bind(&root, m)?;
            }
            Ok(())
        })
    }
}

/// The per-container preload list (an image's own entries after the shim).
fn merged_path(inj: &InjectArgs, id: &str) -> PathBuf {
    inj.inject_dir().join(format!("{id}.preload"))
}

/// One line for the node's operator, in `<state dir>/inject/hook.log` and on stderr (which
/// runtimes often swallow for a hook that succeeds).
pub fn log_line(inj: &InjectArgs, line: &str) {
    use std::io::Write;
    eprintln!("sharectl hook: {line}");
    let path = inj.inject_dir().join("hook.log");
    if std::fs::metadata(&path).is_ok_and(|m| m.len() > 1 << 20) {
        let _ = std::fs::rename(&path, path.with_extension("log.1"));
    }
    let _ = std::fs::create_dir_all(inj.inject_dir());
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(&path)
    {
        let _ = writeln!(f, "{line}");
    }
}

/// The image's own `/etc/ld.so.preload`, verbatim, if it names anything but the shim (glibc
/// reads names separated by white space or ':', and '#' comments).
fn image_preload(root: &OwnedFd) -> Result<Option<String>> {
    let Ok(fd) = open_in_root(
        root,
        PRELOAD_IN_CONTAINER,
        OFlag::O_RDONLY | OFlag::O_NONBLOCK,
    ) else {
        return Ok(None);
    };
    let st = nix::sys::stat::fstat(&fd)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Ok(None);
    }
    let mut text = String::new();
    std::fs::File::from(fd)
        .take(64 << 10)
        .read_to_string(&mut text)
        .with_context(|| format!("cannot read the image's {PRELOAD_IN_CONTAINER}"))?;
    let names_other = text
        .lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .flat_map(|l| l.split(|c: char| c.is_whitespace() || c == ':'))
        .any(|w| !w.is_empty() && w != SHIM_IN_CONTAINER);
    Ok(names_other.then_some(text))
}

/// The podman/CRI-O `hooks.d` entry: this hook for every container annotated
/// `libshare.dev/gpu=<anything>`, at `createRuntime` and `poststop` (told apart by the state's
/// status).
pub fn hooks_d(inj: &InjectArgs) -> Result<Value> {
    let exe = sharectl_exe()?;
    let mut args: Vec<String> = vec!["sharectl".into(), "hook".into()];
    args.extend(
        inj.to_args()
            .into_iter()
            .map(|s| s.to_string_lossy().into_owned()),
    );
    let pattern = format!("^{}$", ANNOTATION.replace('.', "\\."));
    Ok(json!({
        "version": "1.0.0",
        "hook": { "path": exe, "args": args },
        "when": { "annotations": { pattern: ".+" } },
        "stages": ["createRuntime", "poststop"],
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_images_own_preload_is_kept() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("etc")).unwrap();
        let root = open_root(d.path()).unwrap();
        assert!(image_preload(&root).unwrap().is_none());
        let p = d.path().join("etc/ld.so.preload");
        std::fs::write(&p, format!("{SHIM_IN_CONTAINER} # ours\n\n")).unwrap();
        assert!(image_preload(&root).unwrap().is_none());
        let own = format!("/usr/lib/own.so:{SHIM_IN_CONTAINER}\n# x\n");
        std::fs::write(&p, &own).unwrap();
        assert_eq!(image_preload(&root).unwrap(), Some(own));
        // A link to a host file is read inside the image (here: nothing there).
        std::fs::remove_file(&p).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", &p).unwrap();
        assert!(image_preload(&root).unwrap().is_none());
    }
}
