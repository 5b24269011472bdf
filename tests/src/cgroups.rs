//! Real cgroups for the identity tests (the v1 `pids` hierarchy, created by the test, removed
//! when dropped), a `sharectl daemon` that maps them to containers and does not trust the
//! environment, and jobs started inside them as a non-root user (as a container's job usually
//! is).

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
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "libshare-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Relaxed)
        );
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
    cgroups: &Cgroups,
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
    cgroups: &Cgroups,
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
    cgroups: &Cgroups,
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
    assert!(
        line.contains("\"result\":0"),
        "the job could not allocate: {line}"
    );
    child
}
