//! Safe steps to reach and create state files on a shared host.
//!
//! A directory is walked from `/` one component at a time with `openat(O_NOFOLLOW|O_DIRECTORY)`,
//! so no component can be swapped for a symlink between a check and its use. Each directory on
//! the way must be owned by root or by us (the effective uid), and must not be writable by other
//! users unless it is root's sticky directory (`/tmp`): there, a name can only be taken, not
//! replaced, and what we find under it is checked in turn. A symlink on the way is followed only
//! if root owns it (`/var/run` → `/run`); any other one is refused. Directories we create are
//! 0700 and files 0600 whatever the umask (`fchmod` after creation). A state file must be a
//! regular file owned by us and not writable by others; it is opened `O_NOFOLLOW` (refused if
//! it is a symlink) and `O_NONBLOCK` (a FIFO planted in its place cannot block the open), and
//! its type is checked on the open descriptor.

use crate::StateError;
use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid takes no arguments, touches no memory and cannot fail.
    unsafe { libc::geteuid() }
}

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

fn cstr(name: &std::ffi::OsStr, path: &Path) -> Result<CString, StateError> {
    CString::new(name.as_bytes()).map_err(|_| StateError::Io {
        op: "use",
        path: path.to_path_buf(),
        err: "the path contains a NUL byte".into(),
    })
}

pub(crate) fn fstat(fd: libc::c_int, path: &Path) -> Result<libc::stat, StateError> {
    // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is an open descriptor owned by the caller; `st` is a live local.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(StateError::io("stat", path, errno()));
    }
    Ok(st)
}

fn kind(mode: libc::mode_t) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFREG => "regular file",
        libc::S_IFDIR => "directory",
        libc::S_IFLNK => "symbolic link",
        libc::S_IFIFO => "FIFO",
        libc::S_IFSOCK => "socket",
        libc::S_IFCHR => "character device",
        libc::S_IFBLK => "block device",
        _ => "special file",
    }
}

/// Checks an open directory met on the way to a state file.
/// `st` is of type `ifmt` (`expected` names it) and owned by this user (or root, where
/// `root_too`).
fn check_kind_and_owner(
    st: &libc::stat,
    path: &Path,
    ifmt: libc::mode_t,
    expected: &'static str,
    root_too: bool,
) -> Result<(), StateError> {
    if st.st_mode & libc::S_IFMT != ifmt {
        return Err(StateError::WrongType {
            path: path.into(),
            kind: kind(st.st_mode),
            expected,
        });
    }
    let me = euid();
    if st.st_uid != me && !(root_too && st.st_uid == 0) {
        return Err(StateError::ForeignOwner {
            path: path.into(),
            owner: st.st_uid,
            uid: me,
        });
    }
    Ok(())
}

fn check_dir(st: &libc::stat, path: &Path) -> Result<(), StateError> {
    check_kind_and_owner(st, path, libc::S_IFDIR, "directory", true)?;
    let open_to_others = st.st_mode & 0o022 != 0;
    let root_sticky = st.st_uid == 0 && st.st_mode & libc::S_ISVTX != 0;
    if open_to_others && !root_sticky {
        return Err(StateError::OpenToOthers {
            path: path.into(),
            mode: st.st_mode & 0o7777,
        });
    }
    Ok(())
}

/// Checks an open state file.
pub(crate) fn check_file(st: &libc::stat, path: &Path) -> Result<(), StateError> {
    check_kind_and_owner(st, path, libc::S_IFREG, "regular file", false)?;
    if st.st_mode & 0o022 != 0 {
        return Err(StateError::OpenToOthers {
            path: path.into(),
            mode: st.st_mode & 0o7777,
        });
    }
    Ok(())
}

fn open_at(dir: libc::c_int, name: &CString, flags: libc::c_int, mode: libc::c_uint) -> i32 {
    // SAFETY: `dir` is an open directory descriptor (or AT_FDCWD) and `name` a NUL-terminated
    // string, both alive for the call; the returned descriptor is owned by the caller.
    unsafe { libc::openat(dir, name.as_ptr(), flags | libc::O_CLOEXEC, mode) }
}

/// Opens (creating if `create`, 0700) the directory `path`, checking every component as the
/// module doc says. Returns the open directory.
pub(crate) fn open_dir(path: &Path, create: bool) -> Result<OwnedFd, StateError> {
    open_dir_with(path, create, 0o700)
}

/// [`open_dir`], creating missing directories with `mode` (exactly, whatever the umask).
pub(crate) fn open_dir_with(
    path: &Path,
    create: bool,
    mode: libc::mode_t,
) -> Result<OwnedFd, StateError> {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|e| StateError::io("resolve", path, e))?
            .join(path)
    };
    let mut todo: Vec<std::ffi::OsString> = Vec::new();
    for c in abs.components().rev() {
        match c {
            Component::Normal(n) => todo.push(n.to_os_string()),
            Component::ParentDir => todo.push("..".into()),
            _ => {}
        }
    }
    let root = CString::new("/").expect("no NUL");
    let fd = open_at(libc::AT_FDCWD, &root, libc::O_RDONLY | libc::O_DIRECTORY, 0);
    if fd < 0 {
        return Err(StateError::io("open", Path::new("/"), errno()));
    }
    // SAFETY: `fd` was just returned by openat, is valid and owned by nobody else.
    let mut cur = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut shown = PathBuf::from("/");
    let mut hops = 0;
    while let Some(name) = todo.pop() {
        if name == ".." {
            // Lexical: only our own `..` components (a path given by the operator).
            shown.pop();
        } else {
            shown.push(&name);
        }
        let c = cstr(&name, &shown)?;
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
        let mut fd = open_at(cur.as_raw_fd(), &c, flags, 0);
        let mut created = false;
        if fd < 0 {
            let e = errno();
            match e.raw_os_error() {
                Some(libc::ENOENT) if create && todo.iter().all(|n| n != "..") => {
                    // SAFETY: `cur` is an open directory, `c` a NUL-terminated name.
                    let r = unsafe { libc::mkdirat(cur.as_raw_fd(), c.as_ptr(), 0o700) };
                    if r != 0 && errno().raw_os_error() != Some(libc::EEXIST) {
                        return Err(StateError::io("create", &shown, errno()));
                    }
                    created = r == 0;
                    fd = open_at(cur.as_raw_fd(), &c, flags, 0);
                    if fd < 0 {
                        return Err(StateError::io("open", &shown, errno()));
                    }
                }
                Some(libc::ELOOP) | Some(libc::ENOTDIR) => {
                    // A symlink (or not a directory): follow it only if root owns it.
                    // SAFETY: an all-zero `stat` is valid; `cur`/`c` as above.
                    let mut st: libc::stat = unsafe { std::mem::zeroed() };
                    // SAFETY: as above; `st` is a live local.
                    let r = unsafe {
                        libc::fstatat(
                            cur.as_raw_fd(),
                            c.as_ptr(),
                            &mut st,
                            libc::AT_SYMLINK_NOFOLLOW,
                        )
                    };
                    if r != 0 {
                        return Err(StateError::io("stat", &shown, errno()));
                    }
                    if st.st_mode & libc::S_IFMT != libc::S_IFLNK {
                        return Err(StateError::WrongType {
                            path: shown,
                            kind: kind(st.st_mode),
                            expected: "directory",
                        });
                    }
                    if st.st_uid != 0 || hops >= 16 {
                        return Err(StateError::Symlink { path: shown });
                    }
                    hops += 1;
                    let mut buf = [0u8; 4096];
                    // SAFETY: `buf` is a live local of the length passed.
                    let n = unsafe {
                        libc::readlinkat(
                            cur.as_raw_fd(),
                            c.as_ptr(),
                            buf.as_mut_ptr() as *mut libc::c_char,
                            buf.len(),
                        )
                    };
                    if n < 0 || n as usize >= buf.len() {
                        return Err(StateError::io("read the link", &shown, errno()));
                    }
                    let target = PathBuf::from(std::ffi::OsStr::from_bytes(&buf[..n as usize]));
                    shown.pop();
                    let mut comps: Vec<std::ffi::OsString> = Vec::new();
                    for c in target.components() {
                        match c {
                            Component::Normal(n) => comps.push(n.to_os_string()),
                            Component::ParentDir => comps.push("..".into()),
                            _ => {}
                        }
                    }
                    if target.is_absolute() {
                        let fd =
                            open_at(libc::AT_FDCWD, &root, libc::O_RDONLY | libc::O_DIRECTORY, 0);
                        if fd < 0 {
                            return Err(StateError::io("open", Path::new("/"), errno()));
                        }
                        // SAFETY: fresh descriptor from openat, owned by nobody else.
                        cur = unsafe { OwnedFd::from_raw_fd(fd) };
                        shown = PathBuf::from("/");
                    }
                    todo.extend(comps.into_iter().rev());
                    continue;
                }
                _ => return Err(StateError::io("open", &shown, e)),
            }
        }
        // SAFETY: `fd` is a fresh descriptor from openat, owned by nobody else.
        let next = unsafe { OwnedFd::from_raw_fd(fd) };
        if created {
            // The umask may have removed bits; make it exactly `mode`.
            // SAFETY: `next` is an open descriptor.
            unsafe { libc::fchmod(next.as_raw_fd(), mode) };
        }
        check_dir(&fstat(next.as_raw_fd(), &shown)?, &shown)?;
        cur = next;
    }
    Ok(cur)
}

/// Opens `name` in directory `dir` read-write, creating it (0600, exclusively) if `create`.
/// Returns the file and whether this call created it.
pub(crate) fn open_file_rw(
    dir: &OwnedFd,
    name: &str,
    path: &Path,
    create: bool,
) -> Result<(File, bool), StateError> {
    let c = cstr(name.as_ref(), path)?;
    let base = libc::O_RDWR | libc::O_NOFOLLOW | libc::O_NONBLOCK;
    loop {
        if create {
            let fd = open_at(
                dir.as_raw_fd(),
                &c,
                base | libc::O_CREAT | libc::O_EXCL,
                0o600,
            );
            if fd >= 0 {
                // SAFETY: a fresh descriptor from openat, owned by nobody else.
                let f = unsafe { File::from_raw_fd(fd) };
                // SAFETY: `f` is open; the umask may have removed bits: exactly 0600.
                unsafe { libc::fchmod(f.as_raw_fd(), 0o600) };
                check_file(&fstat(f.as_raw_fd(), path)?, path)?;
                return Ok((f, true));
            }
            if errno().raw_os_error() != Some(libc::EEXIST) {
                return Err(StateError::io("create", path, errno()));
            }
        }
        let fd = open_at(dir.as_raw_fd(), &c, base, 0);
        if fd < 0 {
            let e = errno();
            match e.raw_os_error() {
                Some(libc::ELOOP) => return Err(StateError::Symlink { path: path.into() }),
                Some(libc::ENOENT) if create => continue, // removed between the two opens
                _ => return Err(StateError::io("open", path, e)),
            }
        }
        // SAFETY: a fresh descriptor from openat, owned by nobody else.
        let f = unsafe { File::from_raw_fd(fd) };
        check_file(&fstat(f.as_raw_fd(), path)?, path)?;
        return Ok((f, false));
    }
}

/// Opens `path` read-only for a view: never follows a symlink in its last component, never
/// blocks (a FIFO), and must be a regular file. The owner is not checked (a monitoring agent
/// reads other users' files; a view never writes).
pub(crate) fn open_file_ro(path: &Path) -> Result<File, StateError> {
    let c = cstr(path.as_os_str(), path)?;
    let fd = open_at(
        libc::AT_FDCWD,
        &c,
        libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK,
        0,
    );
    if fd < 0 {
        let e = errno();
        return Err(match e.raw_os_error() {
            Some(libc::ELOOP) => StateError::Symlink { path: path.into() },
            _ => StateError::io("open", path, e),
        });
    }
    // SAFETY: a fresh descriptor from openat, owned by nobody else.
    let f = unsafe { File::from_raw_fd(fd) };
    let st = fstat(f.as_raw_fd(), path)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(StateError::WrongType {
            path: path.into(),
            kind: kind(st.st_mode),
            expected: "regular file",
        });
    }
    Ok(f)
}

/// Opens an operator's file read-only (the daemon's settings, its `--config`) with the checks a
/// state file gets: every directory on the way checked as [`open_dir`] does, the file itself
/// never followed if it is a symlink (`O_NOFOLLOW`), never blocked on (`O_NONBLOCK`), a regular
/// file owned by root or by us, not writable by group or others. `Ok(None)` if it does not exist.
pub(crate) fn open_operator_file(path: &Path) -> Result<Option<File>, StateError> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        _ => {}
    }
    let (Some(name), Some(parent)) = (path.file_name(), path.parent()) else {
        return Err(StateError::WrongType {
            path: path.into(),
            kind: "directory",
            expected: "regular file",
        });
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let dir = open_dir(parent, false)?;
    let c = cstr(name, path)?;
    let fd = open_at(
        dir.as_raw_fd(),
        &c,
        libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK,
        0,
    );
    if fd < 0 {
        let e = errno();
        return match e.raw_os_error() {
            Some(libc::ENOENT) => Ok(None), // removed since the check above
            Some(libc::ELOOP) => Err(StateError::Symlink { path: path.into() }),
            _ => Err(StateError::io("open", path, e)),
        };
    }
    // SAFETY: a fresh descriptor from openat, owned by nobody else.
    let f = unsafe { File::from_raw_fd(fd) };
    let st = fstat(f.as_raw_fd(), path)?;
    check_kind_and_owner(&st, path, libc::S_IFREG, "regular file", true)?;
    if st.st_mode & 0o022 != 0 {
        return Err(StateError::OpenToOthers {
            path: path.into(),
            mode: st.st_mode & 0o7777,
        });
    }
    Ok(Some(f))
}

/// lstat-like check of a directory that must be ours alone (the per-user default): Ok(true) if
/// it exists and is a directory owned by `uid` with no access for others, Ok(false) if absent.
pub(crate) fn private_dir_of(path: &Path, uid: u32) -> Result<bool, String> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(format!("{}: {e}", path.display())),
        Ok(m) => {
            use std::os::unix::fs::MetadataExt;
            if m.file_type().is_symlink() {
                Err(format!("{} is a symbolic link", path.display()))
            } else if !m.is_dir() {
                Err(format!("{} is not a directory", path.display()))
            } else if m.uid() != uid {
                Err(format!("{} belongs to uid {}", path.display(), m.uid()))
            } else if m.mode() & 0o077 != 0 {
                Err(format!(
                    "{} is open to other users (mode {:o})",
                    path.display(),
                    m.mode() & 0o7777
                ))
            } else {
                Ok(true)
            }
        }
    }
}

/// `name` in `dir`, created (0755) if missing, opened as a directory without following a link
/// (whoever owns it): a link is refused.
pub(crate) fn open_subdir_nofollow(
    dir: &OwnedFd,
    name: &std::ffi::OsStr,
    path: &Path,
) -> Result<OwnedFd, StateError> {
    let c = cstr(name, path)?;
    // SAFETY: `dir` is an open directory, `c` a NUL-terminated name.
    if unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), 0o755) } != 0
        && errno().raw_os_error() != Some(libc::EEXIST)
    {
        return Err(StateError::io("create", path, errno()));
    }
    let fd = open_at(
        dir.as_raw_fd(),
        &c,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        0,
    );
    if fd < 0 {
        let e = errno();
        // SAFETY: an all-zero `stat` is valid; `dir`/`c` as above, `st` a live local.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let r = unsafe {
            libc::fstatat(
                dir.as_raw_fd(),
                c.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        return Err(if r == 0 && st.st_mode & libc::S_IFMT == libc::S_IFLNK {
            StateError::Symlink { path: path.into() }
        } else if r == 0 {
            StateError::WrongType {
                path: path.into(),
                kind: kind(st.st_mode),
                expected: "directory",
            }
        } else {
            StateError::io("open", path, e)
        });
    }
    // SAFETY: a fresh descriptor from openat, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Device and inode of an open descriptor.
pub fn fd_dev_ino(fd: &OwnedFd) -> std::io::Result<(u64, u64)> {
    let st = fstat(fd.as_raw_fd(), Path::new("(descriptor)"))
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok((st.st_dev, st.st_ino))
}

/// Splits `path` into its directory (`.` when it has none) and its last component.
fn dir_and_name(path: &Path) -> Result<(&Path, &std::ffi::OsStr), StateError> {
    let name = path.file_name().ok_or_else(|| StateError::WrongType {
        path: path.into(),
        kind: "directory",
        expected: "regular file",
    })?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    Ok((dir, name))
}

/// How [`write_atomic_in`] reaches the directory it writes in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteDir {
    /// libshare's own files: the directory is walked with [`open_dir`]'s checks (every
    /// directory on the way root's or ours, none writable by others but root's sticky ones) and
    /// created (0700) where missing.
    Checked,
    /// Another program's directory that the operator names, e.g. node-exporter's textfile
    /// collector (its user's, group-writable, setgid): it must exist, and neither its owner nor
    /// its mode is checked. Only the file is ours, with every other guarantee of the writer.
    Unchecked,
}

/// Replaces `path` with `bytes`, atomically and durably: the one checked writer of the files
/// libshare keeps on the host (allocations and prepared claims, their CDI specs, the preload
/// list, the daemon's settings). The directory is reached (and created, 0700, if missing) with
/// [`open_dir`]'s checks; see [`write_atomic_in`] for the rest.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), StateError> {
    write_atomic_in(WriteDir::Checked, path, bytes, mode)
}

/// [`write_atomic`], with the directory reached as `dir` says. The bytes go to a new temporary
/// file beside `path` (`O_CREAT|O_EXCL|O_NOFOLLOW`, an unpredictable name, another one tried if
/// that name is taken: a planted file or link is never written through and cannot stop the
/// write), which gets `mode` whatever the umask, is written and `fsync`ed, then renamed over
/// `path`, and the directory is `fsync`ed so the rename survives a crash. A reader sees the old
/// file or the new one, never half of one. On any error the temporary file is removed and
/// `path` is unchanged.
pub fn write_atomic_in(
    dir: WriteDir,
    path: &Path,
    bytes: &[u8],
    mode: u32,
) -> Result<(), StateError> {
    use std::io::Write;
    let (dir_path, name) = dir_and_name(path)?;
    let dir = match dir {
        WriteDir::Checked => open_dir(dir_path, true)?,
        WriteDir::Unchecked => {
            let c = cstr(dir_path.as_os_str(), dir_path)?;
            let fd = open_at(libc::AT_FDCWD, &c, libc::O_RDONLY | libc::O_DIRECTORY, 0);
            if fd < 0 {
                return Err(StateError::io("open", dir_path, errno()));
            }
            // SAFETY: a fresh descriptor from openat, owned by nobody else.
            unsafe { OwnedFd::from_raw_fd(fd) }
        }
    };
    let final_name = cstr(name, path)?;
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let (mut f, tmp) = create_temp(&dir, path, || {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos() as u64);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!(
            ".{}.{}-{:x}.tmp",
            name.to_string_lossy(),
            std::process::id(),
            nanos ^ (seq << 32)
        )
    })?;
    let written = (|| {
        // SAFETY: `f` is an open descriptor; the umask may have removed bits.
        if unsafe { libc::fchmod(f.as_raw_fd(), mode & 0o7777) } != 0 {
            return Err(StateError::io("set the mode of", path, errno()));
        }
        f.write_all(bytes)
            .and_then(|_| f.sync_all())
            .map_err(|e| StateError::io("write", path, e))?;
        // SAFETY: both names are NUL-terminated and relative to the open directory `dir`.
        let r = unsafe {
            libc::renameat(
                dir.as_raw_fd(),
                tmp.as_ptr(),
                dir.as_raw_fd(),
                final_name.as_ptr(),
            )
        };
        if r != 0 {
            return Err(StateError::io("replace", path, errno()));
        }
        Ok(())
    })();
    if written.is_err() {
        // SAFETY: `tmp` is NUL-terminated and relative to the open directory `dir`.
        unsafe { libc::unlinkat(dir.as_raw_fd(), tmp.as_ptr(), 0) };
        return written;
    }
    // SAFETY: `dir` is an open directory descriptor; a failed fsync of it loses durability
    // only (the rename is done).
    unsafe { libc::fsync(dir.as_raw_fd()) };
    Ok(())
}

/// How many names [`create_temp`] tries before it gives up.
const TEMP_TRIES: usize = 16;

/// Creates a new file (0600) in `dir` under the first name `next_name` gives that nobody has
/// taken (`O_EXCL`: an existing file or link of that name is neither opened nor followed; the
/// next name is tried). Returns it and its name.
fn create_temp(
    dir: &OwnedFd,
    path: &Path,
    mut next_name: impl FnMut() -> String,
) -> Result<(File, CString), StateError> {
    for _ in 0..TEMP_TRIES {
        let tmp = cstr(next_name().as_ref(), path)?;
        let fd = open_at(
            dir.as_raw_fd(),
            &tmp,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
            0o600,
        );
        if fd >= 0 {
            // SAFETY: a fresh descriptor from openat, owned by nobody else.
            return Ok((unsafe { File::from_raw_fd(fd) }, tmp));
        }
        if errno().raw_os_error() != Some(libc::EEXIST) {
            return Err(StateError::io("create a temporary file for", path, errno()));
        }
    }
    Err(StateError::io(
        "create a temporary file for",
        path,
        std::io::Error::other(format!("{TEMP_TRIES} names tried were all taken")),
    ))
}

/// Reads a file libshare wrote on the host (see [`write_atomic`]) with the checks an operator's
/// file gets ([`open_operator_file`]: no symlink, no FIFO, a regular file of root or ours not
/// writable by others, every directory on the way checked), at most `limit` bytes (more is an
/// error). `Ok(None)` if it does not exist.
pub fn read_checked(path: &Path, limit: u64) -> Result<Option<Vec<u8>>, StateError> {
    use std::io::Read;
    let Some(f) = open_operator_file(path)? else {
        return Ok(None);
    };
    let mut out = Vec::new();
    f.take(limit + 1)
        .read_to_end(&mut out)
        .map_err(|e| StateError::io("read", path, e))?;
    if out.len() as u64 > limit {
        return Err(StateError::io(
            "read",
            path,
            std::io::Error::other(format!("larger than {limit} bytes")),
        ));
    }
    Ok(Some(out))
}

#[cfg(test)]
mod writer_tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn write_atomic_replaces_with_the_mode_and_never_writes_through_a_link() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("sub/rec.json");
        write_atomic(&p, b"one", 0o644).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"one");
        let m = std::fs::metadata(&p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(m, 0o644);
        let sub = std::fs::metadata(d.path().join("sub")).unwrap();
        assert_eq!(
            sub.permissions().mode() & 0o777,
            0o700,
            "a new directory is private"
        );
        write_atomic(&p, b"two", 0o600).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(read_checked(&p, 16).unwrap().unwrap(), b"two");
        assert!(read_checked(&p, 2).is_err(), "over the limit");
        assert_eq!(read_checked(&d.path().join("none"), 16).unwrap(), None);
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(d.path().join("sub"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["rec.json"]);

        // A link in the file's place is replaced, not written through.
        let victim = d.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        let l = d.path().join("sub/link.json");
        std::os::unix::fs::symlink(&victim, &l).unwrap();
        assert!(matches!(
            read_checked(&l, 16),
            Err(StateError::Symlink { .. })
        ));
        write_atomic(&l, b"new", 0o600).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        assert!(!std::fs::symlink_metadata(&l)
            .unwrap()
            .file_type()
            .is_symlink());

        // A directory others can write is refused, and nothing is written there.
        let open = d.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = write_atomic(&open.join("x"), b"x", 0o600).unwrap_err();
        assert!(matches!(e, StateError::OpenToOthers { .. }), "{e}");
        assert!(std::fs::read_dir(&open).unwrap().next().is_none());

        // Unchecked: that directory is written in as it is, but never created.
        write_atomic_in(WriteDir::Unchecked, &open.join("x"), b"x", 0o640).unwrap();
        assert_eq!(std::fs::read(open.join("x")).unwrap(), b"x");
        let m = std::fs::metadata(open.join("x"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(m & 0o7777, 0o640);
        assert!(write_atomic_in(WriteDir::Unchecked, &d.path().join("no/x"), b"", 0o600).is_err());
        assert!(!d.path().join("no").exists());
    }

    /// A name someone planted where the temporary file would go (a file, a link) is passed
    /// over for the next one: neither written through nor a reason to fail.
    #[test]
    fn a_planted_temporary_name_is_passed_over() {
        let d = tempfile::tempdir().unwrap();
        let dir = open_dir(d.path(), false).unwrap();
        let victim = d.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        std::os::unix::fs::symlink(&victim, d.path().join(".a.tmp")).unwrap();
        std::fs::write(d.path().join(".b.tmp"), b"theirs").unwrap();
        let mut names = [".a.tmp", ".b.tmp", ".c.tmp"].into_iter();
        let (mut f, name) =
            create_temp(&dir, &d.path().join("f"), || names.next().unwrap().into()).unwrap();
        assert_eq!(name.to_str().unwrap(), ".c.tmp");
        std::io::Write::write_all(&mut f, b"mine").unwrap();
        assert_eq!(std::fs::read(d.path().join(".c.tmp")).unwrap(), b"mine");
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        assert_eq!(std::fs::read(d.path().join(".b.tmp")).unwrap(), b"theirs");

        // Every name taken: an error that says so, nothing touched.
        let e = create_temp(&dir, &d.path().join("f"), || ".b.tmp".into()).unwrap_err();
        assert!(e.to_string().contains("all taken"), "{e}");
        assert_eq!(std::fs::read(d.path().join(".b.tmp")).unwrap(), b"theirs");
    }
}
