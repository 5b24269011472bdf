//! Why a state file or directory cannot be used: each variant displays as one line saying what
//! is wrong and what to do.

use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    #[error("cannot {op} {}: {err} (check LIBSHARE_STATE_DIR and its permissions)", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        err: String,
    },
    #[error("{} is a symbolic link: refusing to follow it (remove it, or set LIBSHARE_STATE_DIR to a private directory)", path.display())]
    Symlink { path: PathBuf },
    #[error("{} is a {kind}, not a {expected}: remove it", path.display())]
    WrongType {
        path: PathBuf,
        kind: &'static str,
        expected: &'static str,
    },
    #[error("{} belongs to uid {owner}, not to uid {uid}: remove it, or set LIBSHARE_STATE_DIR to a directory only you can write", path.display())]
    ForeignOwner { path: PathBuf, owner: u32, uid: u32 },
    #[error("{} is writable by other users (mode {mode:o}): make it private (chmod go-w) or set LIBSHARE_STATE_DIR to a directory only you can write", path.display())]
    OpenToOthers { path: PathBuf, mode: u32 },
    #[error("{} is truncated ({len} bytes, expected {expected}): remove it or restart the daemon", path.display())]
    Truncated {
        path: PathBuf,
        len: u64,
        expected: u64,
    },
    #[error("{} is corrupt or from another libshare version ({why}; expected layout v{version}): remove it or restart the daemon", path.display())]
    Corrupt {
        path: PathBuf,
        why: &'static str,
        version: u32,
    },
    #[error("{} was removed or replaced while in use: processes started from now on do not share this one's quota (restart the container's jobs, or restore the file)", path.display())]
    Replaced { path: PathBuf },
    #[error("no safe default state directory ({why}): set LIBSHARE_STATE_DIR to a directory only you can write")]
    NoSafeDefault { why: String },
    #[error("the state file the daemon passed {why}: it is not the daemon's (check what serves the registration socket)")]
    NotTheDaemons { why: String },
    #[error("more than {max} processes in this container: stop some")]
    NoFreeSlot { max: usize },
}

impl StateError {
    pub(crate) fn io(op: &'static str, path: &std::path::Path, err: std::io::Error) -> Self {
        StateError::Io {
            op,
            path: path.to_path_buf(),
            err: err.to_string(),
        }
    }
}
