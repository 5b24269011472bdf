//! Bind mounts made inside a container's root filesystem before `pivot_root`, as runc makes its
//! own (`sharectl hook` without CDI): every path resolved by the kernel inside the root
//! (`openat2` with `RESOLVE_IN_ROOT`, [`super::inject::open_in_root`]), a missing mount point
//! created relative to its parent's descriptor, the mount made on the opened mount point
//! (`/proc/self/fd/<n>`) and made read-only on the new mount's own root after checking it shows
//! the source; all of it in the container's mount namespace ([`in_mount_ns`]).

use super::inject::{in_root_error, open_in_root, Mount};
use anyhow::{anyhow, bail, Context, Result};
use nix::fcntl::OFlag;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;

/// `fd` as a path (`/proc/self/fd/<n>`).
fn proc_fd(fd: &OwnedFd) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

/// Where `fd` is, as this process sees it (`/proc/self/fd/<n>`).
fn where_is(fd: &OwnedFd) -> Result<PathBuf> {
    std::fs::read_link(proc_fd(fd)).context("cannot read /proc/self/fd")
}

/// Whether `fd` is `root` or under it.
fn inside(root: &OwnedFd, fd: &OwnedFd) -> Result<bool> {
    let (r, p) = (where_is(root)?, where_is(fd)?);
    Ok(p.starts_with(&r))
}

fn dev_ino(st: &libc::stat) -> (u64, u64) {
    (st.st_dev, st.st_ino)
}

/// The mount point for `container` (absolute, as the container sees it) under `root`: opened
/// (`O_PATH`) where it exists, else created (a directory where `dir`, else an empty file, and
/// the directories on the way, 0755/0644) each inside its parent's descriptor with
/// `O_CREAT|O_EXCL|O_NOFOLLOW` or `mkdirat`, the parent first checked to be under `root`, and
/// opened again resolved in the root. Its kind must be `dir`'s.
fn mount_point(root: &OwnedFd, container: &str, dir: bool) -> Result<OwnedFd> {
    use nix::errno::Errno;
    use nix::sys::stat::Mode;
    let comps: Vec<&str> = container
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    if comps.is_empty() || comps.contains(&"..") {
        bail!("{container}: not a mount point path");
    }
    let what = |e| in_root_error(e, &format!("cannot create the mount point {container}"));
    let mut parent = open_in_root(root, "/", OFlag::O_PATH | OFlag::O_DIRECTORY).map_err(what)?;
    for (i, name) in comps.iter().enumerate() {
        let prefix = comps[..=i].join("/");
        let is_dir = i + 1 < comps.len() || dir;
        match open_in_root(root, &prefix, OFlag::O_PATH) {
            Ok(fd) => {
                parent = fd;
                continue;
            }
            Err(Errno::ENOENT) => {}
            Err(e) => return Err(what(e)),
        }
        if !inside(root, &parent)? {
            bail!("{container}: a directory on the way left the container's root");
        }
        let made = if is_dir {
            nix::sys::stat::mkdirat(&parent, *name, Mode::from_bits_truncate(0o755))
        } else {
            nix::fcntl::openat(
                &parent,
                *name,
                OFlag::O_CREAT
                    | OFlag::O_EXCL
                    | OFlag::O_NOFOLLOW
                    | OFlag::O_WRONLY
                    | OFlag::O_CLOEXEC,
                Mode::from_bits_truncate(0o644),
            )
            .map(drop)
        };
        match made {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(what(e)),
        }
        parent = open_in_root(root, &prefix, OFlag::O_PATH).map_err(what)?;
    }
    let st = nix::sys::stat::fstat(&parent)?;
    if (st.st_mode & libc::S_IFMT == libc::S_IFDIR) != dir {
        bail!(
            "{container} in the image is a {}, the mount needs a {}",
            if dir { "file" } else { "directory" },
            if dir { "directory" } else { "file" }
        );
    }
    if !inside(root, &parent)? {
        bail!("{container}: the mount point left the container's root");
    }
    Ok(parent)
}

/// Bind-mounts `m` under `root` (the container's root before `pivot_root`), on a mount point
/// made inside it ([`mount_point`]), then nosuid, nodev and read-only where asked.
pub fn bind(root: &OwnedFd, m: &Mount) -> Result<()> {
    use nix::mount::{mount, MsFlags};
    let source = nix::sys::stat::stat(&m.host)
        .with_context(|| format!("cannot find {}", m.host.display()))?;
    let is_dir = source.st_mode & libc::S_IFMT == libc::S_IFDIR;
    let target = mount_point(root, &m.container, is_dir)?;
    mount(
        Some(&m.host),
        proc_fd(&target).as_str(),
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .with_context(|| format!("cannot mount {} at {}", m.host.display(), m.container))?;
    // The new mount's own root, reached again: it must show the source before its flags change.
    let top = open_in_root(root, &m.container, OFlag::O_PATH)
        .map_err(|e| in_root_error(e, &format!("cannot find the mount at {}", m.container)))?;
    if dev_ino(&nix::sys::stat::fstat(&top)?) != dev_ino(&source) {
        bail!(
            "{} changed while {} was mounted there",
            m.container,
            m.host.display()
        );
    }
    let mut flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    if m.readonly {
        flags |= MsFlags::MS_RDONLY;
    }
    mount(
        None::<&str>,
        proc_fd(&top).as_str(),
        None::<&str>,
        flags,
        None::<&str>,
    )
    .with_context(|| format!("cannot make {} read-only", m.container))?;
    Ok(())
}

/// Runs `f` in a child process that joined `pid`'s mount namespace; its error comes back as
/// this one's.
pub fn in_mount_ns(pid: i32, f: impl FnOnce() -> Result<()>) -> Result<()> {
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

/// Unmounts what is mounted at each of `paths` (absolute, as the container sees them) under
/// `root` (lazily: `MNT_DETACH`).
pub fn unmount(root: &OwnedFd, paths: &[&str]) -> Result<()> {
    for p in paths {
        let t = open_in_root(root, p, OFlag::O_PATH)
            .map_err(|e| in_root_error(e, &format!("cannot find {p}")))?;
        nix::mount::umount2(proc_fd(&t).as_str(), nix::mount::MntFlags::MNT_DETACH)
            .with_context(|| format!("cannot unmount {p}"))?;
    }
    Ok(())
}
