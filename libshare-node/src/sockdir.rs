//! The registration socket's own directory (issue 30: B5c, B7; what a shim checks of it is
//! `libshare_abi::socket_dir`).
//!
//! Containers get the directory, never the socket file: a bind mount of a file keeps the inode
//! it was made with, so after a daemon restart (a new socket, a new inode) a running
//! container's mount showed a dead socket and its new processes failed closed. The directory is
//! never removed (a restarted daemon binds its new socket in it) and a mount of it shows
//! whatever socket is in it now.
//!
//! HAMi mode ([`mount_read_only`]): HAMi mounts `/tmp/vgpulock` read-write into every
//! container, so a socket there could be replaced by any of them. The daemon mounts its socket's
//! directory read-only at `/tmp/vgpulock/libshare` on the host (root, in the host's mount
//! namespace), which HAMi's recursive bind carries into every container started afterwards; no
//! container can change, rename or remove a read-only mount point it was started with.
//! [`keep_mounted`] makes it again if it goes away (a container started before it can remove
//! the directory under it: a mount point in another mount namespace does not stop that).

use libshare_abi::socket_dir::{check, mount_points, Found, SOCKET_DIR, SOCKET_NAME};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Where the daemon binds its registration socket: `given` (`--register-socket`), else
/// `<state dir>/register/register.sock` in a directory of its own (created, ours, 0755), with
/// `<state dir>/register.sock` (the shims' default on the host) a link to it, replacing the
/// socket an older daemon bound there.
pub fn prepare(state_dir: &Path, given: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(p) = given {
        return Ok(p.to_path_buf());
    }
    let dir = state_dir.join(SOCKET_DIR);
    libshare_abi::claim_socket_dir(&dir).map_err(|e| e.to_string())?;
    let link = state_dir.join(SOCKET_NAME);
    let target = Path::new(SOCKET_DIR).join(SOCKET_NAME);
    match std::fs::symlink_metadata(&link) {
        Ok(m)
            if m.file_type().is_symlink()
                && std::fs::read_link(&link).ok() == Some(target.clone()) => {}
        Ok(m)
            if m.file_type().is_symlink()
                || std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()) =>
        {
            std::fs::remove_file(&link)
                .map_err(|e| format!("cannot replace {}: {e}", link.display()))?;
            make_link(&target, &link)?;
        }
        Ok(_) => {
            return Err(format!(
                "{} exists and is neither a socket nor a link: remove it",
                link.display()
            ))
        }
        Err(_) => make_link(&target, &link)?,
    }
    Ok(dir.join(SOCKET_NAME))
}

fn make_link(target: &Path, link: &Path) -> Result<(), String> {
    std::os::unix::fs::symlink(target, link)
        .map_err(|e| format!("cannot create {}: {e}", link.display()))
}

fn dev_ino(p: &Path) -> Result<(u64, u64), String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(p).map_err(|e| format!("{}: {e}", p.display()))?;
    Ok((m.dev(), m.ino()))
}

fn proc_fd(fd: &OwnedFd) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

/// Whether something is mounted at `at` (an absolute path without links).
fn mounted_at(at: &Path) -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .is_ok_and(|t| mount_points(&t).iter().any(|(p, _)| p == at))
}

/// Mounts `dir` read-only (and nosuid, nodev, noexec) at `at`, creating `at` (0755) where
/// missing, never through a link, every directory on the way root's (or ours) and not
/// writable by others. Something else mounted at `at` (a previous state directory's) is
/// detached first. Ok(true): mounted now; Ok(false): it already was.
pub fn mount_read_only(dir: &Path, at: &Path) -> Result<bool, String> {
    use nix::mount::{mount, umount2, MntFlags, MsFlags};
    let want = dev_ino(dir)?;
    if let Found::Trusted(d) = check(at) {
        if d.dev_ino == want {
            return Ok(false);
        }
    }
    let open = || libshare_abi::open_mount_point(at).map_err(|e| e.to_string());
    let mut fd = open()?;
    for _ in 0..8 {
        if !mounted_at(at) {
            break;
        }
        umount2(proc_fd(&fd).as_str(), MntFlags::MNT_DETACH)
            .map_err(|e| format!("cannot unmount what is mounted at {}: {e}", at.display()))?;
        fd = open()?;
    }
    mount(
        Some(dir),
        proc_fd(&fd).as_str(),
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|e| format!("cannot mount {} at {}: {e}", dir.display(), at.display()))?;
    // The mount's own root, reached again: it must show `dir` before it is made read-only.
    let top = open()?;
    let seen = libshare_abi::fd_dev_ino(&top).map_err(|e| e.to_string())?;
    if seen != want {
        let _ = umount2(proc_fd(&fd).as_str(), MntFlags::MNT_DETACH);
        return Err(format!(
            "{} changed while it was being mounted",
            at.display()
        ));
    }
    let flags = MsFlags::MS_REMOUNT
        | MsFlags::MS_BIND
        | MsFlags::MS_RDONLY
        | MsFlags::MS_NOSUID
        | MsFlags::MS_NODEV
        | MsFlags::MS_NOEXEC;
    mount(
        None::<&str>,
        proc_fd(&top).as_str(),
        None::<&str>,
        flags,
        None::<&str>,
    )
    .map_err(|e| format!("cannot make {} read-only: {e}", at.display()))?;
    match check(at) {
        Found::Trusted(d) if d.dev_ino == want => Ok(true),
        Found::Trusted(_) => Err(format!("{} shows another directory", at.display())),
        Found::Untrusted { why, .. } => Err(format!("{} {why}", at.display())),
        Found::Absent => Err(format!("{} went away", at.display())),
    }
}

/// Checks every `every` that `dir` is still mounted read-only at `at` and mounts it again
/// (one line each time) if not, until `stop`.
pub fn keep_mounted(dir: PathBuf, at: PathBuf, every: Duration, stop: &AtomicBool) {
    while !stop.load(Ordering::Acquire) {
        std::thread::sleep(every);
        match mount_read_only(&dir, &at) {
            Ok(false) => {}
            Ok(true) => tracing::warn!(
                "the registration socket's read-only mount at {} was gone (removed from a container started before it?): mounted again",
                at.display()
            ),
            Err(e) => tracing::warn!("the registration socket's read-only mount at {} is gone and cannot be made again: {e}", at.display()),
        }
    }
}
