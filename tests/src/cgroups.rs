//! Real cgroups for the identity tests (the v1 `pids` hierarchy, created by the test, removed
//! when dropped; [`Tree`]: cgroups at chosen paths of the `pids` hierarchy or cgroup v2's, made
//! by root or by a user in a subtree delegated to it), a `sharectl daemon` that maps them to
//! containers and does not trust the environment, and jobs started inside them as a non-root
//! user (as a container's job usually is).

use crate::{until, Daemon, SimGpu};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::time::Duration;

/// The non-root user the jobs and the probes run as.
pub const NOBODY: u32 = 65534;

/// Cgroups `<root>/<name>` in the v1 `pids` hierarchy, removed when dropped.
pub struct Cgroups {
    root: PathBuf,
    names: Vec<String>,
    /// The prefix as `/proc/<pid>/cgroup` shows it (`--cgroup-prefix`).
    pub prefix: String,
}

impl Cgroups {
    /// Creates one cgroup per name; None (after a SKIP line) where cgroups cannot be created.
    pub fn create(names: &[&str]) -> Option<Cgroups> {
        let name = unique_name("libshare-test");
        let root = Path::new("/sys/fs/cgroup/pids").join(&name);
        for c in names {
            if let Err(e) = std::fs::create_dir_all(root.join(c)) {
                crate::skip(&format!(
                    "cannot create cgroups under /sys/fs/cgroup/pids: {e}"
                ));
                return None;
            }
        }
        Some(Cgroups {
            root,
            names: names.iter().map(|s| s.to_string()).collect(),
            prefix: format!("/{name}"),
        })
    }

    /// The `cgroup.procs` file of cgroup `c`.
    pub fn procs(&self, c: &str) -> PathBuf {
        self.root.join(c).join("cgroup.procs")
    }

    /// Moves process `pid` into cgroup `c`.
    pub fn enter(&self, c: &str, pid: u32) {
        std::fs::write(self.procs(c), pid.to_string()).expect("move the process into its cgroup");
    }
}

/// Where [`spawn_in`] can put a process: a cgroup by name.
pub trait Place {
    /// Moves process `pid` into cgroup `cg`.
    fn enter(&self, cg: &str, pid: u32);
}

impl Place for Cgroups {
    fn enter(&self, cg: &str, pid: u32) {
        Cgroups::enter(self, cg, pid)
    }
}

/// A name no other test (of this process or another) uses: `<what>-<pid>-<n>`.
pub fn unique_name(what: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!("{what}-{}-{}", std::process::id(), N.fetch_add(1, Relaxed))
}

/// Cgroups at chosen paths (as `/proc/<pid>/cgroup` shows them: `/libpod_parent/libpod-<id>`)
/// of one hierarchy, the v1 `pids` one or cgroup v2's, made by root or, as a user does in a
/// subtree delegated to it, by that user (`setpriv … mkdir`); the ones made are removed when
/// dropped (deepest first, their processes moved to the hierarchy's root).
pub struct Tree {
    mount: PathBuf,
    made: Vec<PathBuf>,
}

impl Tree {
    /// The v1 `pids` hierarchy; None (after a SKIP line) where it cannot be written.
    pub fn pids() -> Option<Tree> {
        Tree::at(Path::new("/sys/fs/cgroup/pids"))
    }

    /// cgroup v2's hierarchy (where `/proc/self/mountinfo` has it); None (after a SKIP line)
    /// where it is missing or cannot be written.
    pub fn unified() -> Option<Tree> {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mount = info.lines().find_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            (post.split(' ').next() == Some("cgroup2")).then(|| pre.split(' ').nth(4))?
        });
        let Some(mount) = mount else {
            crate::skip("no cgroup v2 hierarchy is mounted");
            return None;
        };
        Tree::at(Path::new(mount))
    }

    fn at(mount: &Path) -> Option<Tree> {
        let probe = mount.join(unique_name("libshare-probe"));
        if let Err(e) = std::fs::create_dir(&probe) {
            crate::skip(&format!(
                "cannot create cgroups under {}: {e}",
                mount.display()
            ));
            return None;
        }
        let _ = std::fs::remove_dir(&probe);
        Some(Tree {
            mount: mount.to_path_buf(),
            made: Vec::new(),
        })
    }

    /// The sysfs directory of cgroup `cg`.
    pub fn dir(&self, cg: &str) -> PathBuf {
        self.mount.join(cg.trim_start_matches('/'))
    }

    /// Makes `cg` and what is missing above it, as root.
    pub fn make(&mut self, cg: &str) {
        let mut p = self.mount.clone();
        for c in cg.split('/').filter(|c| !c.is_empty()) {
            p = p.join(c);
            if !p.exists() {
                std::fs::create_dir(&p).expect("make a cgroup");
                self.made.push(p.clone());
            }
        }
    }

    /// Makes `cg` as user `uid` would (`setpriv --reuid … mkdir`): it succeeds only where the
    /// user may write its parent.
    pub fn make_as(&mut self, cg: &str, uid: u32) {
        let dir = self.dir(cg);
        let out = Command::new("setpriv")
            .args([
                format!("--reuid={uid}"),
                format!("--regid={uid}"),
                "--clear-groups".into(),
                "mkdir".into(),
            ])
            .arg(&dir)
            .output()
            .expect("run setpriv");
        assert!(
            out.status.success(),
            "uid {uid} cannot make {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        self.made.push(dir);
    }

    /// Delegates `cg` to `uid` as systemd's `Delegate=yes` does: the directory and the files
    /// that move processes and enable controllers become the user's.
    pub fn delegate(&self, cg: &str, uid: u32) {
        let dir = self.dir(cg);
        for f in [
            "",
            "cgroup.procs",
            "tasks",
            "cgroup.threads",
            "cgroup.subtree_control",
        ] {
            let p = if f.is_empty() {
                dir.clone()
            } else {
                dir.join(f)
            };
            if p.exists() {
                std::os::unix::fs::chown(&p, Some(uid), Some(uid)).expect("chown a cgroup");
            }
        }
    }
}

impl Place for Tree {
    fn enter(&self, cg: &str, pid: u32) {
        std::fs::write(self.dir(cg).join("cgroup.procs"), pid.to_string())
            .expect("move the process into its cgroup");
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let root = self.mount.join("cgroup.procs");
        for dir in self.made.iter().rev() {
            if let Ok(pids) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                for p in pids.lines() {
                    let _ = std::fs::write(&root, p);
                }
            }
            let _ = std::fs::remove_dir(dir);
        }
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        for c in &self.names {
            // Move anything left back to the root, then remove.
            if let Ok(pids) = std::fs::read_to_string(self.procs(c)) {
                for p in pids.lines() {
                    let _ = std::fs::write("/sys/fs/cgroup/pids/cgroup.procs", p);
                }
            }
            let _ = std::fs::remove_dir(self.root.join(c));
        }
        let _ = std::fs::remove_dir(&self.root);
    }
}

/// `sharectl daemon` without --trust-env, mapping `<prefix>/<name>` to container `<name>`,
/// once both its sockets answer; `extra` arguments are appended.
pub fn untrusting_daemon(gpu: &SimGpu, prefix: &str, extra: &[&str]) -> Daemon {
    start_daemon(gpu, untrusting_daemon_cmd(gpu, prefix, extra))
}

/// The command [`untrusting_daemon`] runs (its stderr inherited), to adjust before
/// [`start_daemon`].
pub fn untrusting_daemon_cmd(gpu: &SimGpu, prefix: &str, extra: &[&str]) -> Command {
    let mut cmd = gpu.sharectl_cmd(&["daemon", "--cgroup-prefix", prefix]);
    cmd.args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    cmd
}

/// Spawns a daemon command for `gpu`'s state directory and waits until both its sockets answer.
pub fn start_daemon(gpu: &SimGpu, mut cmd: Command) -> Daemon {
    let dir = gpu.shim_state_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let d = Daemon(cmd.spawn().expect("start sharectl daemon"));
    until(Duration::from_secs(10), || {
        UnixStream::connect(dir.join("register.sock")).is_ok()
            && UnixStream::connect(dir.join("admin.sock")).is_ok()
    })
    .expect("the daemon's sockets never appeared");
    d
}

/// `prog args…` run as [`NOBODY`] in cgroup `cg` (moved there before it execs), claiming
/// `env_container` and a 4 GiB limit in its environment; its stdout piped, stderr inherited.
pub fn spawn_in(
    gpu: &SimGpu,
    cgroups: &impl Place,
    cg: &str,
    env_container: &str,
    prog: &Path,
    args: &str,
) -> Child {
    spawn_in_with(
        gpu,
        cgroups,
        cg,
        env_container,
        prog,
        args,
        Stdio::inherit(),
    )
}

/// [`spawn_in`] with the job's stderr going to `stderr`.
pub fn spawn_in_with(
    gpu: &SimGpu,
    cgroups: &impl Place,
    cg: &str,
    env_container: &str,
    prog: &Path,
    args: &str,
    stderr: Stdio,
) -> Child {
    let mut cmd = Command::new("/bin/sh");
    cmd.uid(NOBODY).gid(NOBODY);
    cmd.arg("-c")
        .arg(format!("read go; exec \"$0\" {args}"))
        .arg(prog)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(stderr);
    gpu.configure(&mut cmd);
    cmd.env("LIBSHARE_CONTAINER", env_container)
        .env("LIBSHARE_MEMORY_LIMIT", "4GiB");
    let mut child = cmd.spawn().unwrap();
    cgroups.enter(cg, child.id());
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    child
}

/// `hold_memory hold MIB` run as [`spawn_in`] runs it (claiming `env_container`), once it holds
/// the memory (panics if the allocation failed); it runs until killed.
pub fn holder_in(
    gpu: &SimGpu,
    cgroups: &impl Place,
    cg: &str,
    env_container: &str,
    mib: u32,
) -> Child {
    use std::io::BufRead;
    let prog = crate::compile_gcc("hold_memory.c", "hold_memory", &["-lcuda"]);
    let mut child = spawn_in(
        gpu,
        cgroups,
        cg,
        env_container,
        &prog,
        &format!("hold {mib}"),
    );
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    if !line.contains("\"result\":0") {
        // It waits to be killed either way: not left behind by the failed test.
        let _ = child.kill();
        let _ = child.wait();
        panic!("the job could not allocate: {line}");
    }
    child
}

/// simgpu's `cgroup_cap` program (driver caps: a process that bypasses the shim, and a reader of
/// the driver's per-cgroup limits).
fn cap_prog() -> PathBuf {
    crate::compile_gcc("cgroup_cap.c", "cgroup_cap", &["-lcuda"])
}

/// `cgroup_cap ARGS` as a non-root user in cgroup `cg` with NO preload (a process that bypasses
/// the shim: no LD_PRELOAD, no registration), its JSON line.
pub fn bypassing(gpu: &SimGpu, cgroups: &impl Place, cg: &str, args: &str) -> serde_json::Value {
    let mut cmd = Command::new("/bin/sh");
    cmd.uid(NOBODY).gid(NOBODY);
    cmd.arg("-c")
        .arg(format!("read go; exec \"$0\" {args}"))
        .arg(cap_prog())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    gpu.configure(&mut cmd);
    cmd.env_remove("LD_PRELOAD");
    let mut child = cmd.spawn().unwrap();
    cgroups.enter(cg, child.id());
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let out = child.wait_with_output().unwrap();
    let check = args.split(' ').next().unwrap();
    crate::json_check(&out, check)
}

/// The driver's limits for a cgroup directory, as root reads them
/// (`{"result", "soft", "hard", "used"}`).
pub fn driver_limits(gpu: &SimGpu, ns: &Path) -> serde_json::Value {
    let mut cmd = Command::new(cap_prog());
    cmd.arg("limits").arg(ns);
    gpu.configure(&mut cmd);
    cmd.env_remove("LD_PRELOAD");
    crate::json_check(&cmd.output().unwrap(), "limits")
}
