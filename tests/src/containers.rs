//! Real containers for `tests/tests/containers_*.rs`: a node (simgpu, a daemon that does not
//! trust the environment, its own state directory), tiny images built from this host's files
//! (no registry), and podman, runc and Debian's dockerd as `scripts/test.sh` installs them.
//!
//! Quirks of these machines (`shared/reference/container-injection.md`): podman runs with a
//! private `CONTAINERS_CONF` (runc, not crun; ulimits the VM can grant); containers run with
//! `--network none`. The containers share the host's pid namespace: simgpu (not a real GPU)
//! tells a live process from a dead one by pid, which another pid namespace would confuse; the
//! daemon's identity comes from the cgroup, which stays the container's.

use crate::{artifacts, cache_path, compile_gcc, shim_lib, skip, until, Cudart, Daemon, SimGpu};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// The dash loop that says whether the shim is mapped in a dynamic process (busybox is static).
pub const PROBE: &str = "while read -r l; do case \"$l\" in *libshare.so*) echo INJECTED; exit 0;; esac; done < /proc/self/maps; echo NOT-INJECTED";

/// Whether `prog` runs here; prints SKIP (fails under CI=true) if not.
pub fn have(prog: &str) -> bool {
    let ok = Command::new(prog)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        skip(&format!(
            "{prog} is not installed (scripts/test.sh installs it from Debian's packages)"
        ));
    }
    ok
}

/// A unique name for this test process's containers, images and files.
pub fn unique(what: &str) -> String {
    format!("libshare-test-{what}-{}", std::process::id())
}

/// The node: simgpu, a daemon with its own state directory (outside simgpu's, which containers
/// get), and the arguments every injection command takes.
pub struct Node {
    pub gpu: SimGpu,
    pub state: tempfile::TempDir,
    pub daemon: Option<Daemon>,
}

impl Node {
    /// simgpu with `memory`, and a daemon (no --trust-env) whose sockets answer; `daemon_args`
    /// are appended (e.g. --cgroup-prefix).
    pub fn start(memory: &str, daemon_args: &[&str]) -> Node {
        let gpu = SimGpu::new().memory(memory);
        let state = tempfile::Builder::new()
            .prefix("libshare-node-")
            .tempdir()
            .unwrap();
        let mut node = Node {
            gpu,
            state,
            daemon: None,
        };
        let mut cmd = node.sharectl(&["daemon"]);
        cmd.args(daemon_args)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let d = Daemon(cmd.spawn().expect("start sharectl daemon"));
        let dir = node.state_dir();
        until(Duration::from_secs(10), || {
            std::os::unix::net::UnixStream::connect(dir.join("register.sock")).is_ok()
                && std::os::unix::net::UnixStream::connect(dir.join("admin.sock")).is_ok()
        })
        .expect("the daemon's sockets never appeared");
        node.daemon = Some(d);
        node
    }

    /// The daemon's state directory.
    pub fn state_dir(&self) -> PathBuf {
        self.state.path().join("run")
    }

    /// Where the shim's preload file for containers is written.
    pub fn preload_file(&self) -> PathBuf {
        self.state.path().join("lib/ld.so.preload")
    }

    /// `--shim … --preload-file … --state-dir … --simgpu-lib … --simgpu-state …`.
    pub fn inject_args(&self) -> Vec<String> {
        [
            ("--shim", shim_lib()),
            ("--preload-file", self.preload_file()),
            ("--state-dir", self.state_dir()),
            ("--simgpu-lib", artifacts().lib_dir.clone()),
            ("--simgpu-state", self.gpu.state_dir().to_path_buf()),
        ]
        .into_iter()
        .flat_map(|(k, v)| [k.to_string(), v.display().to_string()])
        .collect()
    }

    /// `sharectl ARGS` on this node (simgpu's NVML; `--state-dir` appended for the daemon's
    /// commands), not yet run.
    pub fn sharectl(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(artifacts().bin("sharectl"));
        self.gpu.configure(&mut cmd);
        cmd.args(args).stdin(Stdio::null());
        if matches!(args[0], "daemon" | "set" | "get" | "reset" | "status") {
            cmd.arg("--state-dir").arg(self.state_dir());
        }
        cmd
    }
}

/// A root filesystem with `programs` (at `/usr/bin/<name>`), dash as `/bin/sh`, and every
/// library they, simgpu and the shim need from this host (glibc, libgcc); cudart 13 at
/// `/opt/cudart`. No libcuda: the runtime mounts the node's.
pub fn rootfs(dir: &Path, programs: &[&Path]) {
    let lib_dirs = format!(
        "{}:{}",
        artifacts().lib_dir.display(),
        Cudart::V13.lib_dir().display()
    );
    let mut files: Vec<PathBuf> = vec!["/bin/dash".into()];
    let mut needs: Vec<PathBuf> = programs.iter().map(|p| p.to_path_buf()).collect();
    needs.extend(["/bin/dash".into(), artifacts().libcuda.clone(), shim_lib()]);
    for p in &needs {
        let out = Command::new("ldd")
            .arg(p)
            .env("LD_LIBRARY_PATH", &lib_dirs)
            .output()
            .expect("ldd");
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let path = match line.split_once("=>") {
                Some((_, r)) => r.split_whitespace().next(),
                None => line.split_whitespace().next(),
            };
            if let Some(p) = path.filter(|p| p.starts_with('/')) {
                let name = Path::new(p).file_name().unwrap().to_string_lossy();
                if !name.starts_with("libcuda.so") && !name.starts_with("libnvidia-ml") {
                    files.push(p.into());
                }
            }
        }
    }
    for f in files {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        let dest = if name.starts_with("libcudart") {
            dir.join("opt/cudart").join(&name)
        } else {
            dir.join(f.strip_prefix("/").unwrap())
        };
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(&f, &dest).unwrap_or_else(|e| panic!("copy {}: {e}", f.display()));
    }
    for d in ["proc", "sys", "dev", "tmp", "run", "etc", "usr/bin"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    let _ = std::os::unix::fs::symlink("dash", dir.join("bin/sh"));
    // Debian's /lib64 holds the loader itself on this host; keep the same layout.
    std::fs::write(dir.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
    for p in programs {
        std::fs::copy(p, dir.join("usr/bin").join(p.file_name().unwrap())).unwrap();
    }
}

/// `tests/cuda/container_quota.c`, linked with cudart 13 (found at `/opt/cudart` in the
/// image) and the driver API.
pub fn quota_program() -> PathBuf {
    let cudart = Cudart::V13.lib_dir();
    cache_path("cu13/nvidia/cu13/lib/libcudart.so.13");
    compile_gcc(
        "container_quota.c",
        "container_quota",
        &[
            "-I",
            &cache_path("cu13/nvidia/cu13/include/cuda_runtime_api.h")
                .parent()
                .unwrap()
                .display()
                .to_string(),
            "-L",
            &cudart.display().to_string(),
            "-l:libcudart.so.13",
            "-lcuda",
            "-Wl,-rpath,/opt/cudart",
        ],
    )
}

/// podman with a private configuration, and an image imported from a root filesystem, removed
/// when dropped.
pub struct Podman {
    conf: PathBuf,
    pub image: String,
    _dir: tempfile::TempDir,
}

impl Podman {
    /// `None` (after a SKIP line) when podman or runc is missing or cannot run a container.
    pub fn new(rootfs_dir: &Path) -> Option<Podman> {
        if !have("podman") || !have("runc") {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("containers.conf");
        std::fs::write(
            &conf,
            "[containers]\ndefault_ulimits = [\"nofile=4096:4096\", \"nproc=4096:4096\"]\n\
             [engine]\nruntime = \"runc\"\n",
        )
        .unwrap();
        let image = format!("localhost/{}:latest", unique("image"));
        let tar = dir.path().join("image.tar");
        let st = Command::new("tar")
            .arg("-C")
            .arg(rootfs_dir)
            .arg("-cf")
            .arg(&tar)
            .arg(".")
            .status()
            .unwrap();
        assert!(st.success());
        let p = Podman {
            conf,
            image,
            _dir: dir,
        };
        let out = p
            .cmd(&["import", "-q"])
            .arg(&tar)
            .arg(&p.image)
            .output()
            .unwrap();
        if !out.status.success() {
            skip(&format!(
                "podman cannot import an image here: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
            return None;
        }
        Some(p)
    }

    /// `podman ARGS` with the private configuration.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new("podman");
        c.env("CONTAINERS_CONF", &self.conf).args(args);
        c
    }

    /// `podman run --rm --network none --pid host ARGS IMAGE CMD…`, run to completion.
    pub fn run(&self, args: &[&str], cmd: &[&str]) -> Output {
        self.cmd(&["run", "--rm", "--network", "none", "--pid", "host"])
            .args(args)
            .arg(&self.image)
            .args(cmd)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = self
            .cmd(&["rmi", "-f", &self.image])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// A file (a CDI spec under /etc/cdi) removed when dropped.
pub struct Removed(pub PathBuf);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
