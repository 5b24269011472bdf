//! What a container runtime puts into a container that asks for a shared GPU: one list of edits
//! for the three paths (`sharectl cdi generate`, `sharectl hook`, `sharectl runtime`).
//!
//! The edits are bind mounts only (no environment: an OCI hook cannot set any, and the shim needs
//! none):
//! - the shim, read-only, at [`SHIM_IN_CONTAINER`];
//! - a host file naming it, read-only, over `/etc/ld.so.preload` (the dynamic loader preloads it
//!   into every glibc program, beside a user's `LD_PRELOAD`; works with a read-only root). An
//!   image with its own `/etc/ld.so.preload` gets a per-container file holding both (see
//!   [`super::hook`]);
//! - the directory holding the daemon's registration socket alone (`<state dir>/register`),
//!   read-only, at [`SOCKET_DIR_IN_CONTAINER`] (`/dev/libshare`) — never its admin socket nor
//!   any state file. The directory, not the socket file: a daemon restarted later binds a new
//!   socket in the same directory, which a running container then sees (a file's bind mount
//!   would keep the dead socket). `/dev` is the runtime's tmpfs, so no link of the image is on
//!   the way, and a read-only mount point can be neither changed nor renamed inside the
//!   container: the shim trusts exactly that (`libshare_abi::socket_dir`), the daemon names the
//!   container from the caller's cgroup and passes it its own state file;
//! - on a simulated node (`--simgpu-lib`, `--simgpu-state`), simgpu's libraries where a driver's
//!   are (`/usr/lib/x86_64-linux-gnu/libcuda.so.1`, `libnvidia-ml.so.1`) and its state directory
//!   where simgpu looks by default (`/dev/shm/simgpu-<uid>`). On a GPU node the driver comes from
//!   NVIDIA's own CDI spec or hook, requested beside ours.

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use nix::fcntl::OFlag;
use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// Where the shim appears in a container.
pub const SHIM_IN_CONTAINER: &str = "/usr/lib/libshare/libshare.so";
/// The loader's preload list, which the injected file covers.
pub const PRELOAD_IN_CONTAINER: &str = "/etc/ld.so.preload";
/// Where the directory of the daemon's registration socket appears in a container.
pub const SOCKET_DIR_IN_CONTAINER: &str = libshare_abi::socket_dir::IN_CONTAINER;
/// Where a driver's libraries are on Debian-family images (simulated node only).
pub const SIM_LIB_DIR_IN_CONTAINER: &str = "/usr/lib/x86_64-linux-gnu";
/// simgpu's libraries mounted from `--simgpu-lib`.
pub const SIM_LIBS: [&str; 2] = ["libcuda.so.1", "libnvidia-ml.so.1"];
/// The annotation (or, as `LIBSHARE_VISIBLE_DEVICES`, the environment variable) by which a
/// container asks for a shared GPU through the hook or the runtime wrapper: `all` or an index.
pub const ANNOTATION: &str = "libshare.dev/gpu";
pub const ENV_DEVICES: &str = "LIBSHARE_VISIBLE_DEVICES";

/// The node's layout, as given to each of the three commands (and passed on by `cdi generate`
/// and `runtime` to the hook they install).
#[derive(Args, Debug, Clone)]
pub struct InjectArgs {
    /// The shipped shim on the host (glibc 2.17 baseline: scripts/build-shim.sh).
    #[arg(
        long,
        value_name = "PATH",
        default_value = "/usr/lib/libshare/libshare.so"
    )]
    pub shim: PathBuf,
    /// Host file naming the shim's path in the container, mounted over /etc/ld.so.preload
    /// (written if missing or different).
    #[arg(
        long,
        value_name = "PATH",
        default_value = "/usr/lib/libshare/ld.so.preload"
    )]
    pub preload_file: PathBuf,
    /// The daemon's state directory: the directory of its registration socket
    /// (<DIR>/register) is mounted read-only (never admin.sock), and per-container files go to
    /// <DIR>/inject/.
    #[arg(long, value_name = "DIR", default_value = "/run/libshare")]
    pub state_dir: PathBuf,
    /// Simulated node: the directory holding simgpu's libcuda.so.1 and libnvidia-ml.so.1.
    #[arg(long, value_name = "DIR", requires = "simgpu_state")]
    pub simgpu_lib: Option<PathBuf>,
    /// Simulated node: simgpu's state directory (SIMGPU_STATE_DIR of the node).
    #[arg(long, value_name = "DIR", requires = "simgpu_lib")]
    pub simgpu_state: Option<PathBuf>,
}

/// One bind mount into a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub host: PathBuf,
    pub container: String,
    pub readonly: bool,
}

impl InjectArgs {
    /// The directory of the host's registration socket (mounted into containers).
    pub fn socket_dir(&self) -> PathBuf {
        self.state_dir.join(libshare_abi::socket_dir::SOCKET_DIR)
    }

    /// The host's registration socket.
    pub fn socket(&self) -> PathBuf {
        self.socket_dir()
            .join(libshare_abi::socket_dir::SOCKET_NAME)
    }

    /// Where per-container files (merged preload lists, the hook's log) live.
    pub fn inject_dir(&self) -> PathBuf {
        self.state_dir.join("inject")
    }

    /// Every path absolute and there (the daemon's socket too when `socket`: a container must
    /// not start without it); one line saying which is not and what to do.
    pub fn check(&self, socket: bool) -> Result<()> {
        for (what, p) in [
            ("--shim", &self.shim),
            ("--preload-file", &self.preload_file),
            ("--state-dir", &self.state_dir),
        ] {
            if !p.is_absolute() {
                bail!("{what} {}: expected an absolute path", p.display());
            }
        }
        if !self.shim.is_file() {
            bail!(
                "the shim {} does not exist (build it: scripts/build-shim.sh, or give --shim)",
                self.shim.display()
            );
        }
        use std::os::unix::fs::FileTypeExt;
        match std::fs::metadata(self.socket()) {
            Ok(m) if m.file_type().is_socket() => {}
            _ if !socket => {}
            _ => bail!(
                "the daemon's registration socket {} does not exist: start the daemon \
                 (sharectl daemon --state-dir {}, or systemctl start libshare)",
                self.socket().display(),
                self.state_dir.display()
            ),
        }
        if let (Some(lib), Some(state)) = (&self.simgpu_lib, &self.simgpu_state) {
            for name in SIM_LIBS {
                if !lib.join(name).is_file() {
                    bail!("--simgpu-lib {}: no {name} there", lib.display());
                }
            }
            if !state.is_dir() || !state.is_absolute() {
                bail!(
                    "--simgpu-state {}: expected an existing absolute directory",
                    state.display()
                );
            }
        }
        Ok(())
    }

    /// The preload file's content: the shim's path in the container.
    pub fn preload_line() -> String {
        format!("{SHIM_IN_CONTAINER}\n")
    }

    /// Writes `--preload-file` if it is missing or says something else (temp file, rename).
    pub fn ensure_preload_file(&self) -> Result<()> {
        let want = Self::preload_line();
        if std::fs::read_to_string(&self.preload_file).ok().as_deref() == Some(want.as_str()) {
            return Ok(());
        }
        write_atomic(&self.preload_file, want.as_bytes(), 0o644)
    }

    /// The mounts every injected container gets; `sim_uid` picks simgpu's default state
    /// directory in the container (`/dev/shm/simgpu-<uid>`).
    pub fn mounts(&self, preload: &Path, sim_uid: u32) -> Vec<Mount> {
        let mut m = vec![
            Mount {
                host: self.shim.clone(),
                container: SHIM_IN_CONTAINER.into(),
                readonly: true,
            },
            Mount {
                host: preload.to_path_buf(),
                container: PRELOAD_IN_CONTAINER.into(),
                readonly: true,
            },
            Mount {
                host: self.socket_dir(),
                container: SOCKET_DIR_IN_CONTAINER.into(),
                readonly: true,
            },
        ];
        if let (Some(lib), Some(state)) = (&self.simgpu_lib, &self.simgpu_state) {
            for name in SIM_LIBS {
                let host = lib.join(name);
                m.push(Mount {
                    host: std::fs::canonicalize(&host).unwrap_or(host),
                    container: format!("{SIM_LIB_DIR_IN_CONTAINER}/{name}"),
                    readonly: true,
                });
            }
            m.push(Mount {
                host: state.clone(),
                container: sim_state_in_container(sim_uid),
                readonly: false,
            });
        }
        m
    }

    /// These options as command-line arguments, for the hook entry a spec or config carries.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        let mut push = |k: &str, v: &Path| {
            a.push(k.into());
            a.push(v.as_os_str().to_owned());
        };
        push("--shim", &self.shim);
        push("--preload-file", &self.preload_file);
        push("--state-dir", &self.state_dir);
        if let (Some(lib), Some(state)) = (&self.simgpu_lib, &self.simgpu_state) {
            push("--simgpu-lib", lib);
            push("--simgpu-state", state);
        }
        a
    }
}

/// simgpu's default state directory for a process of `uid` (simgpu's `config.rs`).
pub fn sim_state_in_container(uid: u32) -> String {
    format!("/dev/shm/simgpu-{uid}")
}

/// The running `sharectl`, for the hook entries it writes.
pub fn sharectl_exe() -> Result<PathBuf> {
    std::env::current_exe().context("cannot find the sharectl binary (/proc/self/exe)")
}

/// Writes `bytes` to `path` (its directory created if missing) with the one checked atomic
/// writer (`libshare_abi::write_atomic`: a new file of an unpredictable name, never through a
/// planted link, fsync, rename).
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| anyhow!("{}: no directory", path.display()))?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    libshare_abi::write_atomic(path, bytes, mode)
        .map_err(|e| anyhow!("cannot write {}: {e}", path.display()))
}

/// The container's root filesystem (`<bundle>/<root.path>`), opened: what [`open_in_root`]
/// resolves against.
pub fn open_root(root: &Path) -> Result<OwnedFd> {
    nix::fcntl::open(
        root,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .with_context(|| format!("cannot open the container's root {}", root.display()))
}

/// `path` (absolute, as the container will see it) opened under `root` the way the container's
/// own view resolves it, by the kernel (`openat2` with `RESOLVE_IN_ROOT |
/// RESOLVE_NO_MAGICLINKS`, as runc does): symbolic links followed with `root` as `/`, `..` never
/// above it, even while someone renames directories on the way. Linux ≥ 5.6.
pub fn open_in_root(root: &OwnedFd, path: &str, flags: OFlag) -> nix::Result<OwnedFd> {
    use nix::fcntl::{openat2, OpenHow, ResolveFlag};
    let rel = path.trim_start_matches('/');
    let rel = if rel.is_empty() { "." } else { rel };
    let how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    openat2(root, rel, how)
}

/// One line for an `openat2` error: ENOSYS is an old kernel.
pub fn in_root_error(e: nix::Error, what: &str) -> anyhow::Error {
    if e == nix::Error::ENOSYS {
        anyhow!("{what}: this kernel has no openat2 (Linux 5.6 or later is needed to resolve paths inside a container's root safely)")
    } else {
        anyhow!("{what}: {e}")
    }
}

/// The glibc dynamic loader's path on this architecture.
#[cfg(target_arch = "x86_64")]
pub const GLIBC_LOADER: &str = "/lib64/ld-linux-x86-64.so.2";
#[cfg(target_arch = "aarch64")]
pub const GLIBC_LOADER: &str = "/lib/ld-linux-aarch64.so.1";

/// Whether the image at `root` has glibc's loader (else: musl or static only, where a glibc
/// shim is either ignored or kills every program).
pub fn has_glibc(root: &OwnedFd) -> bool {
    open_in_root(root, GLIBC_LOADER, OFlag::O_PATH)
        .ok()
        .and_then(|fd| nix::sys::stat::fstat(&fd).ok())
        .is_some_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symlinks_resolve_inside_the_root() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        std::fs::create_dir_all(root.join("lib/x86_64-linux-gnu")).unwrap();
        std::fs::write(root.join("lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"), b"").unwrap();
        std::fs::write(root.join("lib/x86_64-linux-gnu/x"), b"x").unwrap();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::write(root.join("etc/passwd"), b"image").unwrap();
        std::os::unix::fs::symlink("/lib/x86_64-linux-gnu", root.join("lib64")).unwrap();
        std::os::unix::fs::symlink("../../../../etc", root.join("escape")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("abs")).unwrap();
        let fd = open_root(root).unwrap();
        let same = |path: &str, want: &Path| {
            let a = open_in_root(&fd, path, OFlag::O_PATH).unwrap();
            let (a, b) = (
                nix::sys::stat::fstat(&a).unwrap(),
                nix::sys::stat::stat(want).unwrap(),
            );
            assert_eq!((a.st_dev, a.st_ino), (b.st_dev, b.st_ino), "{path}");
        };
        same("/lib64/x", &root.join("lib/x86_64-linux-gnu/x"));
        same("/escape/passwd", &root.join("etc/passwd"));
        same("/abs", &root.join("etc/passwd"));
        std::os::unix::fs::symlink("loop", root.join("loop")).unwrap();
        assert!(open_in_root(&fd, "/loop/x", OFlag::O_PATH).is_err());
        #[cfg(target_arch = "x86_64")]
        assert!(has_glibc(&fd));
        assert!(!has_glibc(&open_root(&root.join("lib")).unwrap()));
    }
}
