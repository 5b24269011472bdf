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
        Node::start_on(SimGpu::new().memory(memory), daemon_args)
    }

    /// [`Node::start`] on a simgpu configured by the caller.
    pub fn start_on(gpu: SimGpu, daemon_args: &[&str]) -> Node {
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
        let register = daemon_args
            .iter()
            .position(|a| *a == "--register-socket")
            .map_or_else(|| dir.join("register.sock"), |i| daemon_args[i + 1].into());
        until(Duration::from_secs(10), || {
            std::os::unix::net::UnixStream::connect(&register).is_ok()
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

pub const MIB: u64 = 1 << 20;

/// `container_quota` running in a container (its runtime's command attached to its stdio),
/// holding its memory.
pub struct Held {
    child: std::process::Child,
    pub lines: Vec<serde_json::Value>,
}

impl Held {
    /// Starts `cmd` (which runs `container_quota QUOTA-16MiB` attached) and checks what the
    /// program saw once it holds its memory: the device's size is `quota`, the allocation up to
    /// it succeeded, 32 MiB more failed with CUDA_ERROR_OUT_OF_MEMORY.
    pub fn start(mut cmd: Command, quota: u64) -> Held {
        use std::io::BufRead;
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut lines = Vec::new();
        let mut r = std::io::BufReader::new(child.stdout.take().unwrap());
        loop {
            let mut l = String::new();
            if r.read_line(&mut l).unwrap() == 0 {
                let _ = child.kill();
                panic!("{cmd:?} ended before holding its memory: {lines:?}");
            }
            let v: serde_json::Value =
                serde_json::from_str(l.trim()).unwrap_or_else(|_| panic!("{cmd:?}: {l}"));
            let held = v["check"] == "held";
            lines.push(v);
            if held {
                break;
            }
        }
        let h = Held { child, lines };
        let mem = h.check("mem");
        assert_eq!(mem["result"], 0, "{:?}", h.lines);
        assert_eq!(
            mem["total"], quota,
            "the device is the quota: {:?}",
            h.lines
        );
        assert_eq!(h.check("fill")["result"], 0, "{:?}", h.lines);
        // CUDA_ERROR_OUT_OF_MEMORY = 2
        assert_eq!(h.check("past")["result"], 2, "{:?}", h.lines);
        h
    }

    pub fn check(&self, what: &str) -> &serde_json::Value {
        self.lines
            .iter()
            .find(|v| v["check"] == what)
            .unwrap_or_else(|| panic!("no {what} line in {:?}", self.lines))
    }

    /// Closes its stdin: the program frees and exits 0, and so does its runtime's command.
    pub fn end(mut self) {
        drop(self.child.stdin.take());
        assert!(self.child.wait().unwrap().success());
    }
}

impl Node {
    /// The daemon's settings for container `id` (`{}` for one it does not know).
    pub fn settings(&self, id: &str) -> serde_json::Value {
        let out = self.sharectl(&["get", id, "--json"]).output().unwrap();
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("unknown container"), "{err}");
            return serde_json::json!({});
        }
        let text = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str::<serde_json::Value>(&text).unwrap()["settings"].clone()
    }

    /// `sharectl set ID --memory MEMORY --class CLASS` through the daemon.
    pub fn set(&self, id: &str, memory: &str, class: &str) {
        crate::ok(
            &self
                .sharectl(&["set", id, "--memory", memory, "--class", class])
                .output()
                .unwrap(),
        );
    }

    /// `sharectl status --json` lists exactly `want` (container id, class, quota), each with one
    /// process holding its quota less 16 MiB and one allocation refused.
    pub fn assert_status(&self, want: &[(&str, &str, u64)]) {
        let status = crate::ok(&self.sharectl(&["status", "--json"]).output().unwrap());
        let doc: serde_json::Value = serde_json::from_str(&status).unwrap();
        let containers = doc["containers"].as_array().unwrap();
        for &(id, class, quota) in want {
            let c = containers
                .iter()
                .find(|c| c["container"] == id)
                .unwrap_or_else(|| panic!("{id} not in sharectl status: {status}"));
            assert_eq!(c["class"], class, "{status}");
            let d = &c["devices"][0];
            assert_eq!(d["quota_bytes"], quota, "{status}");
            assert_eq!(d["used_bytes"], quota - 16 * MIB, "{status}");
            assert_eq!(d["refused_over_quota"], 1, "{status}");
            assert_eq!(c["processes"].as_array().unwrap().len(), 1, "{status}");
        }
        assert_eq!(
            containers.len(),
            want.len(),
            "nothing registered as another container: {status}"
        );
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

/// Packs a root filesystem into an image tarball.
fn pack(rootfs_dir: &Path, out: &Path) {
    let st = Command::new("tar")
        .arg("-C")
        .arg(rootfs_dir)
        .arg("-cf")
        .arg(out)
        .arg(".")
        .status()
        .unwrap();
    assert!(st.success());
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
        pack(rootfs_dir, &tar);
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

    /// `podman create -i --name NAME --network none --pid host --device DEVICE ARGS IMAGE CMD…`,
    /// not yet run (the container's full id on its stdout).
    pub fn create(&self, name: &str, device: &str, args: &[&str], cmd: &[&str]) -> Command {
        let mut c = self.cmd(&["create", "-i", "--name", name, "--network", "none"]);
        c.args(["--pid", "host", "--device", device])
            .args(args)
            .arg(&self.image)
            .args(cmd);
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

impl Podman {
    /// Removes the named containers when dropped.
    pub fn removing(&self, names: &[&str]) -> RemoveContainers<'_> {
        RemoveContainers(self, names.iter().map(|n| n.to_string()).collect())
    }
}

/// [`Podman::removing`]'s guard.
pub struct RemoveContainers<'a>(&'a Podman, Vec<String>);

impl Drop for RemoveContainers<'_> {
    fn drop(&mut self) {
        for n in &self.1 {
            let _ = self
                .0
                .cmd(&["rm", "-f", n])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
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

impl Node {
    /// `sharectl cdi generate` for this node into /etc/cdi (podman 4.3 reads only there and
    /// /var/run/cdi), with a kind private to this test process (`<tag><pid>.libshare.dev/gpu`);
    /// the spec (removed when dropped) and the kind.
    pub fn cdi_spec(&self, tag: &str) -> (Removed, String) {
        let kind = format!("{tag}{}.libshare.dev/gpu", std::process::id());
        std::fs::create_dir_all("/etc/cdi").unwrap();
        let spec = Removed(format!("/etc/cdi/{}.json", unique(tag)).into());
        let out = self
            .sharectl(&["cdi", "generate", "--kind", &kind, "--output"])
            .arg(&spec.0)
            .args(self.inject_args())
            .output()
            .unwrap();
        crate::ok(&out);
        (spec, kind)
    }
}

/// A file (a CDI spec under /etc/cdi) removed when dropped.
pub struct Removed(pub PathBuf);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// runc with its own state root and bundles made from one root filesystem (hard-linked copies,
/// so what a hook creates in one does not show in another); the cgroups under `cgroup_prefix`
/// are removed when dropped.
pub struct Runc {
    dir: tempfile::TempDir,
    pub cgroup_prefix: String,
}

impl Runc {
    /// `None` (after a SKIP line) when runc is missing.
    pub fn new() -> Option<Runc> {
        if !have("runc") {
            return None;
        }
        Some(Runc {
            dir: tempfile::tempdir().unwrap(),
            cgroup_prefix: format!("/{}", unique("runc")),
        })
    }

    /// A bundle `name` with a copy of `rootfs_dir`, `runc spec`'s config (no terminal; the
    /// host's pid namespace, see the module's doc; cgroup `<cgroup_prefix>/<name>`) changed by
    /// `edit`.
    pub fn bundle(
        &self,
        name: &str,
        rootfs_dir: &Path,
        edit: impl FnOnce(&mut serde_json::Value),
    ) -> PathBuf {
        let b = self.dir.path().join(name);
        std::fs::create_dir_all(&b).unwrap();
        let st = Command::new("cp")
            .arg("-al")
            .arg(rootfs_dir)
            .arg(b.join("rootfs"))
            .status()
            .unwrap();
        assert!(st.success());
        let st = Command::new("runc")
            .arg("spec")
            .current_dir(&b)
            .status()
            .unwrap();
        assert!(st.success());
        let path = b.join("config.json");
        let mut cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        cfg["process"]["terminal"] = false.into();
        cfg["linux"]["cgroupsPath"] = format!("{}/{name}", self.cgroup_prefix).into();
        cfg["linux"]["namespaces"]
            .as_array_mut()
            .unwrap()
            .retain(|n| n["type"] != "pid");
        edit(&mut cfg);
        std::fs::write(&path, serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
        b
    }

    /// `runc --root <private> ARGS`.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new("runc");
        c.arg("--root")
            .arg(self.dir.path().join("state"))
            .args(args);
        c
    }

    /// `runc run --bundle B ID` (the container is deleted when its process ends).
    pub fn run(&self, bundle: &Path, id: &str) -> Command {
        let mut c = self.cmd(&["run", "--bundle"]);
        c.arg(bundle).arg(id);
        c
    }
}

impl Drop for Runc {
    fn drop(&mut self) {
        if let Ok(dirs) = std::fs::read_dir("/sys/fs/cgroup") {
            for d in dirs.flatten() {
                let top = d.path().join(self.cgroup_prefix.trim_start_matches('/'));
                if let Ok(children) = std::fs::read_dir(&top) {
                    for c in children.flatten().filter(|c| c.path().is_dir()) {
                        let _ = std::fs::remove_dir(c.path());
                    }
                }
                let _ = std::fs::remove_dir(&top);
            }
        }
    }
}

/// The OCI hook entry running `sharectl hook ARGS` (a bundle's `hooks.createRuntime`).
pub fn hook_entry(args: &[String]) -> serde_json::Value {
    let mut a = vec!["sharectl".to_string(), "hook".to_string()];
    a.extend(args.iter().cloned());
    serde_json::json!({ "path": artifacts().bin("sharectl"), "args": a })
}

/// Debian's dockerd, started for one test with networking off, its own data root, exec root,
/// pid file and socket, and a runtime `libshare` (`sharectl runtime ARGS --`); stopped by pid.
pub struct Dockerd {
    child: std::process::Child,
    dir: tempfile::TempDir,
}

impl Dockerd {
    /// `None` (after a SKIP line) when dockerd or docker is missing or does not come up.
    pub fn start(runtime_args: &[String]) -> Option<Dockerd> {
        if !have("dockerd") || !have("docker") {
            return None;
        }
        // Short paths: the exec root holds unix sockets (108 bytes at most).
        let dir = tempfile::Builder::new().prefix("ls-dk").tempdir().unwrap();
        let d = dir.path();
        let mut args = vec!["runtime".to_string()];
        args.extend(runtime_args.iter().cloned());
        args.push("--".into());
        let cfg = serde_json::json!({
            "data-root": d.join("root"), "exec-root": d.join("exec"), "pidfile": d.join("pid"),
            "hosts": [format!("unix://{}", d.join("sock").display())],
            "iptables": false, "ip-masq": false, "bridge": "none",
            "runtimes": { "libshare": { "path": artifacts().bin("sharectl"), "runtimeArgs": args } },
        });
        std::fs::write(d.join("daemon.json"), cfg.to_string()).unwrap();
        let log = std::fs::File::create(d.join("log")).unwrap();
        let child = Command::new("dockerd")
            .arg("--config-file")
            .arg(d.join("daemon.json"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut dk = Dockerd { child, dir };
        let up = until(Duration::from_secs(30), || {
            dk.cmd(&["info"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
                || dk.child.try_wait().ok().flatten().is_some()
        });
        if up.is_none() || dk.child.try_wait().ok().flatten().is_some() {
            let log = std::fs::read_to_string(dk.dir.path().join("log")).unwrap_or_default();
            skip(&format!(
                "dockerd did not start here: {}",
                crate::tail(&log, 5)
            ));
            return None;
        }
        Some(dk)
    }

    /// `docker -H unix://<its socket> ARGS`.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new("docker");
        c.arg("-H")
            .arg(format!("unix://{}", self.dir.path().join("sock").display()))
            .args(args);
        c
    }

    /// Imports a root filesystem as image `name`.
    pub fn import(&self, rootfs_dir: &Path, name: &str) {
        let tar = self.dir.path().join("image.tar");
        pack(rootfs_dir, &tar);
        let out = self.cmd(&["import"]).arg(&tar).arg(name).output().unwrap();
        crate::ok(&out);
    }
}

impl Drop for Dockerd {
    fn drop(&mut self) {
        // By its pid (our child, not yet reaped), never by name.
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        if until(Duration::from_secs(15), || {
            self.child.try_wait().ok().flatten().is_some()
        })
        .is_none()
        {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}
