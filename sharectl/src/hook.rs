//! `sharectl hook`: an OCI `createRuntime` hook doing `inject.rs`'s edits for runtimes without
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
//! - otherwise (without `--cdi`) the mounts, made inside the container's mount namespace
//!   (`setns` into `/proc/<pid>/ns/mnt` in a forked child); mount points are created with every
//!   path resolved inside the root filesystem, so an image's symbolic link cannot point a mount
//!   or a new file at the host.
//!
//! Bad input (state JSON, bundle, config) is one line on stderr and a non-zero exit, on which
//! the runtime does not start the container; nothing is written on the host before the input
//! is checked.

use crate::inject::{
    has_glibc, resolve_in_root, write_atomic, InjectArgs, Mount, ANNOTATION, PRELOAD_IN_CONTAINER,
    SHIM_IN_CONTAINER,
};
use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, ValueEnum};
use serde_json::{json, Value};
use std::io::Read;
use std::path::{Path, PathBuf};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Stage {
    /// Make the edits (the container's mounts exist, its root is not pivoted yet).
    #[value(name = "createRuntime")]
    CreateRuntime,
    /// Remove the container's per-container files.
    #[value(name = "poststop")]
    Poststop,
}

#[derive(Args, Debug)]
pub struct HookArgs {
    #[command(flatten)]
    pub inject: InjectArgs,
    /// The OCI stage this hook is registered for (default: from the state's status: "stopped"
    /// is poststop, anything else createRuntime).
    #[arg(value_enum)]
    pub stage: Option<Stage>,
    /// The runtime applied a CDI spec's mounts: only merge an image's own preload list, or take
    /// the preload away from a musl/static image.
    #[arg(long)]
    pub cdi: bool,
    /// The device plugin's allocation this container was given (its CDI spec passes it; else
    /// the container's libshare.dev/allocation annotation): its quota and the pod's class are
    /// set on the daemon for the container's id before it starts, and reset at poststop.
    #[arg(long, value_name = "NAME")]
    pub allocation: Option<String>,
    /// The DRA claim (its uid) this container was given (its CDI spec passes it): the quota,
    /// class and cap `sharectl dra-plugin` prepared for it are set on the daemon for the
    /// container's id before it starts, and reset at poststop.
    #[arg(long, value_name = "UID", conflicts_with = "allocation")]
    pub claim: Option<String>,
    /// Print the podman/CRI-O hooks.d JSON that runs this hook for containers annotated
    /// libshare.dev/gpu=…, instead of running it.
    #[arg(long, conflicts_with = "stage")]
    pub print_hooks_d: bool,
}

/// The fields of the OCI state this hook uses.
#[derive(Debug)]
struct OciState {
    id: String,
    stopped: bool,
    /// None once the container stopped (poststop).
    pid: Option<i32>,
    bundle: PathBuf,
}

/// The fields of the bundle's `config.json` this hook uses.
#[derive(Debug)]
struct Bundle {
    root: PathBuf,
    uid: u32,
    annotations: serde_json::Map<String, Value>,
}

const MAX_INPUT: u64 = 1 << 20;

pub fn run(a: HookArgs) -> Result<()> {
    if a.print_hooks_d {
        println!("{}", serde_json::to_string_pretty(&hooks_d(&a.inject)?)?);
        return Ok(());
    }
    let mut text = String::new();
    std::io::stdin()
        .take(MAX_INPUT)
        .read_to_string(&mut text)
        .context("cannot read the container's state on stdin")?;
    let st = parse_state(&text)?;
    let stage = a.stage.unwrap_or(if st.stopped {
        Stage::Poststop
    } else {
        Stage::CreateRuntime
    });
    match stage {
        Stage::Poststop => {
            let _ = std::fs::remove_file(merged_path(&a.inject, &st.id));
            let annotations = read_config(&st.bundle)
                .ok()
                .and_then(|c| c["annotations"].as_object().cloned())
                .unwrap_or_default();
            if let Some(line) = crate::device_plugin::unbind(
                &a.inject.state_dir,
                &st.id,
                &annotations,
                a.allocation.as_deref(),
            )
            .or_else(|| crate::dra_plugin::unbind(&a.inject.state_dir, &st.id, a.claim.as_deref()))
            {
                log_line(&a.inject, &line);
            }
            Ok(())
        }
        Stage::CreateRuntime => create_runtime(&a, &st),
    }
}

fn parse_state(text: &str) -> Result<OciState> {
    const WANT: &str =
        "expected the runtime's state JSON {\"id\", \"pid\", \"bundle\", …} on stdin";
    let v: Value = serde_json::from_str(text)
        .map_err(|e| anyhow!("the container state on stdin is not JSON ({e}): {WANT}"))?;
    let id = v["id"].as_str().unwrap_or_default();
    if id.is_empty()
        || id.len() > 1024
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
    {
        bail!("the container state's \"id\" is missing or not a container id: {WANT}");
    }
    let pid = v["pid"]
        .as_i64()
        .filter(|&p| p > 0 && p <= i32::MAX as i64)
        .map(|p| p as i32);
    let bundle = v["bundle"]
        .as_str()
        .map(PathBuf::from)
        .filter(|b| b.is_absolute())
        .ok_or_else(|| anyhow!("the container state has no absolute \"bundle\": {WANT}"))?;
    Ok(OciState {
        id: id.into(),
        stopped: v["status"] == "stopped",
        pid,
        bundle,
    })
}

/// Reads `<bundle>/config.json`.
pub fn read_config(bundle: &Path) -> Result<Value> {
    let path = bundle.join("config.json");
    let f = std::fs::File::open(&path)
        .with_context(|| format!("cannot open the bundle's {}", path.display()))?;
    let mut text = String::new();
    f.take(16 * MAX_INPUT)
        .read_to_string(&mut text)
        .with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text)
        .map_err(|e| anyhow!("{} is not an OCI config ({e})", path.display()))
}

fn parse_bundle(bundle: &Path) -> Result<Bundle> {
    let cfg = read_config(bundle)?;
    let root = cfg["root"]["path"].as_str().ok_or_else(|| {
        anyhow!(
            "{}/config.json has no root.path: not an OCI bundle",
            bundle.display()
        )
    })?;
    let root = bundle.join(root);
    if !root.is_dir() {
        bail!(
            "the container's root filesystem {} is not a directory",
            root.display()
        );
    }
    let uid = cfg["process"]["user"]["uid"].as_u64().unwrap_or(0) as u32;
    let annotations = cfg["annotations"].as_object().cloned().unwrap_or_default();
    Ok(Bundle {
        root,
        uid,
        annotations,
    })
}

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
fn image_preload(root: &Path) -> Result<Option<String>> {
    let path = resolve_in_root(root, PRELOAD_IN_CONTAINER)?;
    let Ok(m) = std::fs::symlink_metadata(&path) else {
        return Ok(None);
    };
    if !m.is_file() {
        return Ok(None);
    }
    let mut text = String::new();
    std::fs::File::open(&path)?
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

fn create_runtime(a: &HookArgs, st: &OciState) -> Result<()> {
    let inj = &a.inject;
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
    let bound = match a.claim.as_deref() {
        Some(claim) => crate::dra_plugin::bind(&inj.state_dir, &st.id, Some(claim))?,
        None => crate::device_plugin::bind(
            &inj.state_dir,
            &st.id,
            &b.annotations,
            a.allocation.as_deref(),
        )?,
    };
    if let Some(line) = bound {
        log_line(inj, &line);
    }
    // The daemon sets the driver's limits on the container's cgroup now (never fails the start).
    if let Some(line) = crate::commands::set::started(&inj.state_dir, &st.id, pid) {
        log_line(inj, &line);
    }
    let ns = format!("/proc/{pid}/ns/mnt");
    if !Path::new(&ns).exists() {
        bail!("the container's process {pid} is gone ({ns})");
    }
    if !has_glibc(&b.root) {
        log_line(
            inj,
            &format!(
                "container {}: no glibc loader in its image (musl or static): libshare not \
                 injected",
                st.id
            ),
        );
        if a.cdi {
            let root = b.root.clone();
            in_mount_ns(pid, move || {
                for p in [PRELOAD_IN_CONTAINER, SHIM_IN_CONTAINER] {
                    let t = resolve_in_root(&root, p)?;
                    nix::mount::umount2(&t, nix::mount::MntFlags::MNT_DETACH)
                        .with_context(|| format!("cannot unmount {p}"))?;
                }
                Ok(())
            })?;
        }
        return Ok(());
    }
    let own = image_preload(&b.root)?;
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
    let mounts: Vec<Mount> = if a.cdi {
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
        for m in &mounts {
            bind(&root, m)?;
        }
        Ok(())
    })
}

/// Bind-mounts `m` under `root` (the container's root before `pivot_root`), creating the
/// mount point inside it.
fn bind(root: &Path, m: &Mount) -> Result<()> {
    use nix::mount::{mount, MsFlags};
    let target = resolve_in_root(root, &m.container)?;
    let is_dir = m.host.is_dir();
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}'s directory in the image", m.container))?;
    }
    if std::fs::symlink_metadata(&target).is_err() {
        if is_dir {
            std::fs::create_dir(&target)
        } else {
            std::fs::File::create(&target).map(drop)
        }
        .with_context(|| format!("cannot create the mount point {}", m.container))?;
    }
    mount(
        Some(&m.host),
        &target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .with_context(|| format!("cannot mount {} at {}", m.host.display(), m.container))?;
    let mut flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    if m.readonly {
        flags |= MsFlags::MS_RDONLY;
    }
    mount(None::<&str>, &target, None::<&str>, flags, None::<&str>)
        .with_context(|| format!("cannot make {} read-only", m.container))?;
    Ok(())
}

/// Runs `f` in a child process that joined `pid`'s mount namespace; its error comes back as
/// this one's.
fn in_mount_ns(pid: i32, f: impl FnOnce() -> Result<()>) -> Result<()> {
    use nix::sys::wait::{waitpid, WaitStatus};
    use nix::unistd::{fork, pipe, ForkResult};
    use std::io::Write;
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/mnt"))
        .with_context(|| format!("cannot open process {pid}'s mount namespace"))?;
    let (r, w) = pipe()?;
    // SAFETY: the hook is single-threaded (nothing in sharectl started a thread by now), so
    // the child may run arbitrary code; it ends with _exit.
    match unsafe { fork() }? {
        ForkResult::Child => {
            drop(r);
            let res = nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNS)
                .map_err(|e| anyhow!("cannot enter the container's mount namespace: {e}"))
                .and_then(|_| f());
            let code = match res {
                Ok(()) => 0,
                Err(e) => {
                    let _ = std::fs::File::from(w).write_all(format!("{e:#}").as_bytes());
                    1
                }
            };
            // SAFETY: ends the child without running the parent's exit handlers.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => {
            drop(w);
            let mut msg = String::new();
            let _ = std::fs::File::from(r).read_to_string(&mut msg);
            match waitpid(child, None)? {
                WaitStatus::Exited(_, 0) => Ok(()),
                _ if !msg.is_empty() => Err(anyhow!(msg)),
                s => Err(anyhow!("the mount helper ended with {s:?}")),
            }
        }
    }
}

/// The podman/CRI-O `hooks.d` entry: this hook for every container annotated
/// `libshare.dev/gpu=<anything>`, at `createRuntime` and `poststop` (told apart by the state's
/// status).
fn hooks_d(inj: &InjectArgs) -> Result<Value> {
    let exe = crate::inject::sharectl_exe()?;
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
    fn state_json_is_checked() {
        let ok =
            parse_state(r#"{"ociVersion":"1.0.2","id":"abc-1","pid":42,"bundle":"/b"}"#).unwrap();
        assert_eq!((ok.id.as_str(), ok.pid), ("abc-1", Some(42)));
        for bad in [
            "",
            "{",
            "[]",
            r#"{"id":"../x","pid":3,"bundle":"/b"}"#,
            r#"{"id":"x","pid":3,"bundle":"rel"}"#,
            r#"{"id":"x","pid":3}"#,
        ] {
            let e = parse_state(bad).unwrap_err().to_string();
            assert!(!e.contains('\n') && e.contains("expected"), "{bad}: {e}");
        }
    }

    #[test]
    fn an_images_own_preload_is_kept() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("etc")).unwrap();
        assert!(image_preload(d.path()).unwrap().is_none());
        let p = d.path().join("etc/ld.so.preload");
        std::fs::write(&p, format!("{SHIM_IN_CONTAINER} # ours\n\n")).unwrap();
        assert!(image_preload(d.path()).unwrap().is_none());
        let own = format!("/usr/lib/own.so:{SHIM_IN_CONTAINER}\n# x\n");
        std::fs::write(&p, &own).unwrap();
        assert_eq!(image_preload(d.path()).unwrap(), Some(own));
    }
}
