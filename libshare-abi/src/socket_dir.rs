//! The directory that holds the daemon's registration socket, as containers get it, and whether
//! a shim may trust what it finds there (issue 30: B1c, B5c, B7).
//!
//! The daemon's socket lives alone in a directory of its own (`<state dir>/register/`,
//! [`SOCKET_DIR`]), never removed (a restarted daemon binds a new socket in the same
//! directory), and containers get that directory, read-only:
//! - libshare's runtime edits (CDI spec, OCI hook, runc wrapper) mount it at [`IN_CONTAINER`]
//!   (`/dev/libshare`). `/dev` is the runtime's own tmpfs (nothing of the image, so no link, lies
//!   on the way) and a mount point: neither `/dev` nor `/dev/libshare` can be renamed or removed
//!   inside the container, and a read-only mount cannot be changed (no `chmod`, no other
//!   socket) without `CAP_SYS_ADMIN`.
//! - Under HAMi, `sharectl daemon --hami` mounts it read-only at [`HAMI_DIR`]
//!   (`/tmp/vgpulock/libshare`) on the host, and HAMi's recursive bind of `/tmp/vgpulock` carries
//!   that mount into every container started afterwards. `/tmp` is the image's and can be renamed
//!   (or be a link in the image), so a shim also looks for the mount wherever it ended up:
//!   a read-only mount point ending in [`HAMI_SUFFIX`] in `/proc/self/mountinfo`.
//!
//! [`check`] says whether a directory is such a mount ([`Found::Trusted`]): a directory (not a
//! link) on a read-only mount (`fstatvfs`: `ST_RDONLY`), owned by root (in a user namespace that
//! does not map the host's root: by the overflow uid, which no process of the namespace can
//! own files as), not writable by group or others, and whose `register.sock`, if there, is a
//! socket of the same owner. A container (no `CAP_SYS_ADMIN` in the host's user namespace) can
//! make no such mount, so it can neither forge one nor change the real one; what it does in a
//! user and mount namespace of its own (mount over the directory, over `/etc/ld.so.preload`)
//! is bypassing the preload, which no preloaded shim can prevent.
//!
//! The directory is opened once (`O_NOFOLLOW|O_DIRECTORY`) and the socket reached through the
//! open descriptor (`/proc/self/fd/<n>/register.sock`, [`SocketDir::socket_path`]), so no
//! rename on the way between the check and the connect can send the shim elsewhere.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The directory under the daemon's state directory that holds its registration socket alone.
pub const SOCKET_DIR: &str = "register";
/// The registration socket's name, in [`SOCKET_DIR`] and in every mount of it.
pub const SOCKET_NAME: &str = "register.sock";
/// Where libshare's runtime edits mount the socket's directory in a container (read-only).
pub const IN_CONTAINER: &str = "/dev/libshare";
/// Where `sharectl daemon --hami` mounts it (read-only) for HAMi's containers: in the directory
/// HAMi's device plugin mounts into every container.
pub const HAMI_DIR: &str = "/tmp/vgpulock/libshare";
/// How HAMi's mount point ends wherever `/tmp` went in the container.
pub const HAMI_SUFFIX: &str = "/vgpulock/libshare";

/// A trusted socket directory, open.
#[derive(Debug)]
pub struct SocketDir {
    fd: OwnedFd,
    /// Where it was found (for messages).
    pub path: PathBuf,
    /// Its owner as this process sees it: the daemon's uid (root, or the overflow uid).
    pub owner: u32,
    /// Whether `register.sock` is there now (absent: the daemon is stopped or restarting).
    pub has_socket: bool,
    /// Device and inode of the directory (the daemon checks its mount shows its own directory).
    pub dev_ino: (u64, u64),
}

/// What [`check`] found at a path.
#[derive(Debug)]
pub enum Found {
    /// Nothing there.
    Absent,
    Trusted(SocketDir),
    /// Something a runtime did not make (or made without the protections): why, for one line,
    /// and whether a `register.sock` is in it.
    Untrusted {
        why: String,
        has_socket: bool,
    },
}

impl SocketDir {
    /// The socket's address through the open directory (`/proc/self/fd/<n>/register.sock`),
    /// or by path where `/proc` is not mounted.
    pub fn socket_path(&self) -> PathBuf {
        let via_fd = PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()));
        if via_fd.is_dir() {
            via_fd.join(SOCKET_NAME)
        } else {
            self.path.join(SOCKET_NAME)
        }
    }

    /// The socket's path as an operator would name it (for messages).
    pub fn shown(&self) -> PathBuf {
        self.path.join(SOCKET_NAME)
    }
}

fn stat_of(fd: libc::c_int) -> std::io::Result<libc::stat> {
    // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is an open descriptor; `st` a live local.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st)
}

/// Whether this process is in a user namespace other than the initial one (whose map is the
/// identity over every uid).
fn in_user_namespace() -> bool {
    std::fs::read_to_string("/proc/self/uid_map").is_ok_and(|m| {
        let f: Vec<&str> = m.split_whitespace().collect();
        f != ["0", "0", "4294967295"]
    })
}

/// The uid files of unmapped owners show as (`/proc/sys/kernel/overflowuid`, 65534 by default).
fn overflow_uid() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/overflowuid")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(65534)
}

/// Whether `uid`, as this process sees it, may own the daemon's socket directory: root, or in
/// a user namespace that does not map the host's root, the overflow uid.
pub fn daemon_owner(uid: u32) -> bool {
    uid == 0 || (uid == overflow_uid() && in_user_namespace())
}

/// Checks `path` as the module doc says.
pub fn check(path: &Path) -> Found {
    let untrusted = |why: String, has_socket: bool| Found::Untrusted { why, has_socket };
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return Found::Absent;
    };
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: `c` is a NUL-terminated path alive for the call; the descriptor is ours.
    let fd = unsafe { libc::open(c.as_ptr(), flags) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        let link = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
        return match e.raw_os_error() {
            Some(libc::ENOENT) => Found::Absent,
            Some(libc::ELOOP | libc::ENOTDIR) if link => {
                untrusted("is a symbolic link".into(), false)
            }
            Some(libc::ENOTDIR) => untrusted("is not a directory".into(), false),
            _ => untrusted(format!("cannot be opened ({e})"), false),
        };
    }
    // SAFETY: a fresh descriptor from open, owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let sock = CString::new(SOCKET_NAME).expect("no NUL");
    // SAFETY: an all-zero `stat` is valid; `fd` is open, `sock` NUL-terminated, `st` a local.
    let mut sst: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let has = unsafe {
        libc::fstatat(
            fd.as_raw_fd(),
            sock.as_ptr(),
            &mut sst,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    } == 0;
    let st = match stat_of(fd.as_raw_fd()) {
        Ok(st) => st,
        Err(e) => return untrusted(format!("cannot be checked ({e})"), has),
    };
    // SAFETY: an all-zero `statvfs` is a valid value; `fd` is open, `vfs` a live local.
    let mut vfs: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstatvfs(fd.as_raw_fd(), &mut vfs) } != 0 {
        let e = std::io::Error::last_os_error();
        return untrusted(format!("cannot be checked ({e})"), has);
    }
    if vfs.f_flag & libc::ST_RDONLY == 0 {
        return untrusted("is not a read-only mount".into(), has);
    }
    if !daemon_owner(st.st_uid) {
        return untrusted(format!("belongs to uid {}, not root", st.st_uid), has);
    }
    if st.st_mode & 0o022 != 0 {
        return untrusted(
            format!("is writable by others (mode {:o})", st.st_mode & 0o7777),
            has,
        );
    }
    if has && (sst.st_mode & libc::S_IFMT != libc::S_IFSOCK || sst.st_uid != st.st_uid) {
        return untrusted(
            format!("holds a {SOCKET_NAME} that is not the daemon's socket"),
            has,
        );
    }
    Found::Trusted(SocketDir {
        fd,
        path: path.to_path_buf(),
        owner: st.st_uid,
        has_socket: has,
        dev_ino: (st.st_dev, st.st_ino),
    })
}

/// Every mount point in `mountinfo` (`/proc/self/mountinfo`'s text), in the order listed, and
/// whether it is read-only. Fields: id, parent, dev, root, mount point (octal escapes: `\040`
/// is a space), per-mount options, ...
pub fn mount_points(mountinfo: &str) -> Vec<(PathBuf, bool)> {
    mountinfo
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let (point, opts) = (f.get(4)?, f.get(5)?);
            Some((unescape(point), opts.split(',').any(|o| o == "ro")))
        })
        .collect()
}

/// The read-only mount points in `mountinfo` that end in `suffix`, in the order listed.
pub fn read_only_mount_points(mountinfo: &str, suffix: &str) -> Vec<PathBuf> {
    mount_points(mountinfo)
        .into_iter()
        .filter(|(p, ro)| *ro && p.as_os_str().as_bytes().ends_with(suffix.as_bytes()))
        .map(|(p, _)| p)
        .collect()
}

/// `\ooo` octal escapes of mountinfo (space, tab, newline, backslash) decoded.
fn unescape(s: &str) -> PathBuf {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match oct {
            Some(d) => {
                let v = d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
                out.push(v as u8);
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    PathBuf::from(std::ffi::OsStr::from_bytes(&out))
}

/// HAMi's socket directory wherever the container's `/tmp` went: the first read-only mount
/// point of this process ending in [`HAMI_SUFFIX`] that [`check`] trusts.
pub fn find_hami_mount() -> Option<SocketDir> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    read_only_mount_points(&text, HAMI_SUFFIX)
        .into_iter()
        .find_map(|p| match check(&p) {
            Found::Trusted(d) => Some(d),
            _ => None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_only_mounts_are_found_by_their_end() {
        let text = "\
22 1 0:21 / /proc rw,nosuid - proc proc rw
35 30 0:25 /libshare/register /dev/libshare ro,nosuid,nodev - tmpfs tmpfs rw
36 30 0:25 /libshare/register /tmp.moved/vgpulock/libshare ro,nosuid - tmpfs tmpfs rw
37 30 0:26 / /tmp/vgpulock rw - ext4 /dev/vda rw
38 30 0:27 /x /a\\040b/vgpulock/libshare ro - ext4 /dev/vda rw
39 30 0:27 /y /tmp/vgpulock/libshare rw - ext4 /dev/vda rw
";
        assert_eq!(
            read_only_mount_points(text, HAMI_SUFFIX),
            [
                PathBuf::from("/tmp.moved/vgpulock/libshare"),
                PathBuf::from("/a b/vgpulock/libshare")
            ]
        );
        assert_eq!(
            read_only_mount_points(text, IN_CONTAINER),
            [PathBuf::from(IN_CONTAINER)]
        );
        assert!(read_only_mount_points("garbage\n\n", HAMI_SUFFIX).is_empty());
    }

    #[test]
    fn a_directory_is_trusted_only_as_a_read_only_mount() {
        let d = tempfile::tempdir().unwrap();
        assert!(matches!(check(&d.path().join("none")), Found::Absent));
        // A directory of this host's writable file system: not a mount a runtime made.
        match check(d.path()) {
            Found::Untrusted { why, has_socket } => {
                assert!(
                    why.contains("read-only") || why.contains("writable"),
                    "{why}"
                );
                assert!(!has_socket);
            }
            other => panic!("{other:?}"),
        }
        std::os::unix::fs::symlink(d.path(), d.path().join("link")).unwrap();
        match check(&d.path().join("link")) {
            Found::Untrusted { why, .. } => assert!(why.contains("symbolic link"), "{why}"),
            other => panic!("{other:?}"),
        }
        // (A trusted one needs a read-only mount: tests/tests/containers_socket.rs.)
        std::fs::write(d.path().join("file"), b"").unwrap();
        assert!(matches!(
            check(&d.path().join("file")),
            Found::Untrusted { .. }
        ));
    }

    #[test]
    fn octal_escapes_decode() {
        assert_eq!(unescape("/a\\040b\\134c"), PathBuf::from("/a b\\c"));
        assert_eq!(unescape("/plain\\"), PathBuf::from("/plain\\"));
    }
}
