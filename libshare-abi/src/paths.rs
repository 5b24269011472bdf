//! Where state lives: the state directory, container directories, and `/proc` facts about
//! processes (alive, exiting, start time).

use crate::*;
use std::fs::File;
use std::path::{Path, PathBuf};

/// The default state directory, checked for a shared host: `/run/libshare` if it exists and is
/// root's and not writable by others (the daemon's); else `$XDG_RUNTIME_DIR/libshare` when
/// `XDG_RUNTIME_DIR` is set and is ours and private; else `/tmp/libshare-<uid>` if it does not
/// exist yet or is ours with mode 0700. Err (one line naming LIBSHARE_STATE_DIR) otherwise: a
/// directory another user created must never be used.
pub fn default_state_dir_checked() -> Result<PathBuf, StateError> {
    use std::os::unix::fs::MetadataExt;
    if let Ok(m) = std::fs::symlink_metadata("/run/libshare") {
        if m.is_dir() && m.uid() == 0 && m.mode() & 0o022 == 0 {
            return Ok(PathBuf::from("/run/libshare"));
        }
    }
    let uid = fsafe::euid();
    if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR").filter(|x| !x.is_empty()) {
        let x = PathBuf::from(x);
        if x.is_absolute() && fsafe::private_dir_of(&x, uid) == Ok(true) {
            return Ok(x.join("libshare"));
        }
    }
    let tmp = PathBuf::from(format!("/tmp/libshare-{uid}"));
    match fsafe::private_dir_of(&tmp, uid) {
        Ok(_) => Ok(tmp),
        Err(why) => Err(StateError::NoSafeDefault { why }),
    }
}

/// [`default_state_dir_checked`], or `/tmp/libshare-<uid>` when no default is safe (opening
/// under it then fails with the reason, see `fsafe.rs`). Kept for callers that want a path.
pub fn default_state_dir() -> PathBuf {
    default_state_dir_checked()
        .unwrap_or_else(|_| PathBuf::from(format!("/tmp/libshare-{}", fsafe::euid())))
}

/// Opens a file an operator gives the daemon (its settings, its `--config`) read-only, with the
/// checks state files get: no directory on the way writable by others (but root's sticky
/// `/tmp`) or owned by anyone but root or us, the file not a symbolic link, a regular file owned
/// by root or us and not writable by group or others. `Ok(None)` if it does not exist.
pub fn open_operator_file(path: &Path) -> Result<Option<File>, StateError> {
    fsafe::open_operator_file(path)
}

/// The daemon's claim on its state directory: created if missing, every component checked as
/// `fsafe` says; it must belong to us (the daemon's user). Its mode is made exactly 0711:
/// group and others may pass through it to the registration socket (0666: any local process,
/// root or not, must be able to register) but neither list nor create anything in it. What is
/// under it stays private: `containers/` and every container's directory 0700, files 0600, the
/// admin socket and the settings 0600; the containers' files reach processes through the daemon
/// (registration passes each process its container's file) or bind-mounted one by one. Returns
/// whether rights of group or others beyond search (an older shim's or an operator's `mkdir`)
/// were removed.
pub fn claim_state_dir(path: &Path) -> Result<bool, StateError> {
    claim_dir(path, STATE_DIR_MODE)
}

/// The directory that holds the daemon's registration socket alone (`<state dir>/register`,
/// `socket_dir::SOCKET_DIR`), claimed as [`claim_state_dir`] claims the state directory, with
/// mode 0755: any process, in any container it is mounted into, may reach the socket in it;
/// only the daemon writes it. Never removed: a restarted daemon binds its new socket in the
/// same directory, which containers have mounted.
pub fn claim_socket_dir(path: &Path) -> Result<(), StateError> {
    claim_dir(path, 0o755).map(drop)
}

/// A directory to mount the socket's directory on (`sharectl daemon --hami`:
/// `/tmp/vgpulock/libshare`): its parent opened with every component checked as state
/// directories are (never through a link someone else owns, nothing on the way writable by
/// others but root's sticky `/tmp`), missing ones created 0755; the directory itself created
/// (0755) if missing and opened without following a link of anyone's, root's included (a root
/// container that shares the parent could have put one there).
pub fn open_mount_point(path: &Path) -> Result<std::os::fd::OwnedFd, StateError> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(StateError::WrongType {
            path: path.into(),
            kind: "root directory",
            expected: "directory under it",
        });
    };
    let dir = fsafe::open_dir_with(parent, true, 0o755)?;
    fsafe::open_subdir_nofollow(&dir, name, path)
}

pub use fsafe::{fd_dev_ino, write_atomic, write_atomic_in, WriteDir};

/// Creates (`mode`) or opens `path` as the daemon's own directory and makes its mode exactly
/// `mode`; whether rights of group or others were removed.
fn claim_dir(path: &Path, mode: libc::mode_t) -> Result<bool, StateError> {
    use std::os::fd::AsRawFd;
    let dir = fsafe::open_dir_with(path, true, mode)?;
    let st = fsafe::fstat(dir.as_raw_fd(), path)?;
    let uid = fsafe::euid();
    if st.st_uid != uid {
        return Err(StateError::ForeignOwner {
            path: path.to_path_buf(),
            owner: st.st_uid,
            uid,
        });
    }
    if st.st_mode & 0o7777 == mode {
        return Ok(false);
    }
    // SAFETY: fchmod on the directory descriptor we just opened and own.
    if unsafe { libc::fchmod(dir.as_raw_fd(), mode) } != 0 {
        return Err(StateError::io(
            "chmod",
            path,
            std::io::Error::last_os_error(),
        ));
    }
    Ok(st.st_mode & !mode & 0o066 != 0)
}

/// The mode of the daemon's state directory ([`claim_state_dir`]).
pub const STATE_DIR_MODE: libc::mode_t = 0o711;

/// The path a [`State::from_fd`] shows (a state passed by the daemon has no path of its own
/// for this process, and none to check).
pub const DESCRIPTOR_PATH: &str = "(descriptor)";

/// The directory of container `name` under a state directory.
pub fn container_dir(state_dir: &Path, name: &str) -> PathBuf {
    state_dir.join("containers").join(name)
}

/// Field 22 of /proc/<pid>/stat (start time, clock ticks since boot), 0 if unreadable.
pub fn proc_start_time(pid: u32) -> u64 {
    let mut buf = [0u8; 512];
    let Some(s) = read_small(&format!("/proc/{pid}/stat"), &mut buf) else {
        return 0;
    };
    s.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(19))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

pub(crate) fn read_small<'a>(path: &str, buf: &'a mut [u8]) -> Option<&'a str> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).ok()?;
    let n = f.read(buf).ok()?;
    std::str::from_utf8(&buf[..n]).ok()
}

/// Is `pid` the same live (non-zombie) process that registered with `start_time`?
pub fn proc_alive(pid: u32, start_time: u64) -> bool {
    let mut buf = [0u8; 512];
    let Some(s) = read_small(&format!("/proc/{pid}/stat"), &mut buf) else {
        return false;
    };
    let Some((_, rest)) = s.rsplit_once(')') else {
        return false;
    };
    let mut fields = rest.split_whitespace();
    let zombie = fields.next() == Some("Z");
    let st: u64 = rest
        .split_whitespace()
        .nth(19)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    !zombie && (start_time == 0 || st == start_time)
}

/// Whether process `pid` (started at `start_time`, 0: any) is exiting but not yet a zombie:
/// the kernel sets `PF_EXITING` (0x4 in `/proc/<pid>/stat`'s flags) when it starts tearing a
/// process down, before it closes the process's descriptors and frees its memory. False for a
/// process that is gone, a zombie, a pid reused by another process, or a live process (one
/// that `exec`ed, for instance).
pub fn proc_exiting(pid: u32, start_time: u64) -> bool {
    pub(crate) const PF_EXITING: u64 = 0x4;
    let mut buf = [0u8; 512];
    let Some(s) = read_small(&format!("/proc/{pid}/stat"), &mut buf) else {
        return false;
    };
    let Some((_, rest)) = s.rsplit_once(')') else {
        return false;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let state = f.first().copied().unwrap_or("");
    let flags: u64 = f.get(6).and_then(|v| v.parse().ok()).unwrap_or(0);
    let st: u64 = f.get(19).and_then(|v| v.parse().ok()).unwrap_or(0);
    !matches!(state, "Z" | "X" | "x")
        && (start_time == 0 || st == start_time)
        && flags & PF_EXITING != 0
}
