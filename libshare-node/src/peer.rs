//! Who is on the other end of a Unix socket, read so that neither a recycled pid nor an exiting
//! process can lie: the peer's process is pinned by a pidfd while its `/proc/<pid>/cgroup` is
//! read; the read counts only if `/proc/<pid>/stat`, read afterwards, shows a process that has
//! not begun to exit, and if that same process is still alive after both (a live process's pid
//! cannot have been reused, so the files read were its own).
//!
//! Why the exit matters: the kernel sets `PF_EXITING` (0x4, field 9 of `/proc/<pid>/stat`) at
//! the start of `do_exit` (`exit_signals`), before `cgroup_exit` and long before `exit_notify`
//! makes the process a zombie and its pidfd readable. From `PF_EXITING` on, cgroup v1 shows the
//! process in every hierarchy's root (`proc_cgroup_show`: "all zombie tasks show up as
//! belonging to the root cgroup" on traditional hierarchies), which a daemon would take for an
//! unmapped process (`host`). The flag is never cleared, so a `stat` read after the cgroup read
//! that shows no `PF_EXITING` (and a state that is neither `Z` nor `X`) proves the cgroup was
//! read before the exit began. A process that has begun to exit is refused on v1 and v2 alike
//! (v2 would still show its cgroup, but nothing it asks for can matter to it any more). A live
//! process whose main thread has exited (`pthread_exit`) is refused too: its `/proc/<pid>`
//! files are its exited leader's.
//!
//! The pidfd is the one the kernel took at `connect` (`SO_PEERPIDFD`, Linux ≥ 6.5). On older
//! kernels it is opened from `SO_PEERCRED`'s pid at accept (`pidfd_open`, Linux ≥ 5.3), and a
//! process that started after the connection was accepted is refused (its pid was recycled);
//! without pidfds at all (Linux < 5.3) the pid is read as it is, the liveness check being then
//! `/proc/<pid>`'s existence. [`cgroups_of_pid`] reads a process named by pid the same way (the
//! OCI hook's container process, [`crate::admin`]).

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{getsockopt, sockopt::PeerPidfd};
use std::io::ErrorKind;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PinError {
    #[error("process {0} exited before the daemon could tell which container it is in")]
    Gone(u32),
    #[error(
        "process {0} is exiting: the daemon does not tell which container an exiting process is in"
    )]
    Exiting(u32),
    #[error("cannot read /proc/{pid}/cgroup: {err}")]
    Unreadable { pid: u32, err: String },
}

/// The cgroups (`/proc/<pid>/cgroup`'s text) of the process connected on `stream`, whose
/// `SO_PEERCRED` pid is `pid`.
pub fn cgroups(stream: &UnixStream, pid: u32) -> Result<String, PinError> {
    let pidfd = match getsockopt(stream, PeerPidfd) {
        Ok(fd) => Some(fd),
        // No SO_PEERPIDFD on this kernel.
        Err(nix::errno::Errno::ENOPROTOOPT) => open_pidfd(pid, boot_ticks())?,
        // The kernel knows the peer but cannot give its process: it is gone (reaped).
        Err(_) => return Err(PinError::Gone(pid)),
    };
    read_pinned(pid, pidfd)
}

/// The cgroups of live process `pid`, read as [`cgroups`] reads a peer's.
pub fn cgroups_of_pid(pid: u32) -> Result<String, PinError> {
    read_pinned(pid, open_pidfd(pid, None)?)
}

/// Reads `pid`'s cgroups, then checks that it had not begun to exit, then that `pidfd`'s
/// process (the one `pid` named when the pidfd was taken) is still alive.
fn read_pinned(pid: u32, pidfd: Option<OwnedFd>) -> Result<String, PinError> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).map_err(|e| {
        match e.kind() {
            ErrorKind::NotFound => PinError::Gone(pid),
            // ESRCH: the process is exiting.
            _ if e.raw_os_error() == Some(libc::ESRCH) => PinError::Gone(pid),
            _ => PinError::Unreadable {
                pid,
                err: e.to_string(),
            },
        }
    })?;
    match stat(pid) {
        None => return Err(PinError::Gone(pid)),
        Some(s) if s.exiting() => return Err(PinError::Exiting(pid)),
        Some(_) => {}
    }
    let alive = match &pidfd {
        Some(fd) => !exited(fd),
        None => std::path::Path::new(&format!("/proc/{pid}")).exists(),
    };
    if !alive || text.is_empty() {
        return Err(PinError::Gone(pid));
    }
    Ok(text)
}

/// A pidfd for `pid` (on a kernel without `SO_PEERPIDFD`, of a process that started no later
/// than `accepted`); None where pidfds do not exist.
fn open_pidfd(pid: u32, accepted: Option<u64>) -> Result<Option<OwnedFd>, PinError> {
    // SAFETY: pidfd_open(pid, 0) takes no pointers; a non-negative result is a new descriptor
    // we own.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
    if fd < 0 {
        return match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::ESRCH) => Err(PinError::Gone(pid)),
            _ => Ok(None), // ENOSYS: no pidfds on this kernel
        };
    }
    // SAFETY: `fd` was just returned by the kernel and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) };
    // A process that started after the accept is not the one that connected.
    if let (Some(started), Some(accepted)) = (stat(pid).map(|s| s.start), accepted) {
        if started > accepted {
            return Err(PinError::Gone(pid));
        }
    }
    Ok(Some(fd))
}

/// Whether the process behind `pidfd` has exited (a pidfd polls readable then).
fn exited(pidfd: &OwnedFd) -> bool {
    let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(n) => n > 0,
        Err(_) => true,
    }
}

/// `CLOCK_BOOTTIME` in clock ticks (the unit of `/proc/<pid>/stat`'s start time).
fn boot_ticks() -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) } != 0 {
        return None;
    }
    // SAFETY: sysconf takes no pointers.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some(ts.tv_sec as u64 * hz + ts.tv_nsec as u64 * hz / 1_000_000_000)
}

/// What `/proc/<pid>/stat` says of a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stat {
    /// Field 3: `R`, `S`, `D`, `Z` (zombie), `X` (dead), …
    state: u8,
    /// Field 4: the parent's pid.
    ppid: u32,
    /// Field 9: the kernel's `PF_*` flags.
    flags: u64,
    /// Field 22: when the process started, in clock ticks since boot.
    start: u64,
}

/// `PF_EXITING`: set by `do_exit` before anything of the process is torn down.
const PF_EXITING: u64 = 0x4;

impl Stat {
    /// The process has begun to exit (or is a zombie, or dead).
    fn exiting(&self) -> bool {
        matches!(self.state, b'Z' | b'X' | b'x') || self.flags & PF_EXITING != 0
    }

    fn parse(text: &str) -> Option<Stat> {
        // The command name (field 2) may hold spaces and parentheses: fields resume after the
        // last ')'.
        let mut f = text[text.rfind(')')? + 1..].split_whitespace();
        let state = *f.next()?.as_bytes().first()?;
        let ppid = f.next()?.parse().ok()?;
        let flags = f.nth(4)?.parse().ok()?;
        let start = f.nth(12)?.parse().ok()?;
        Some(Stat {
            state,
            ppid,
            flags,
            start,
        })
    }
}

fn stat(pid: u32) -> Option<Stat> {
    Stat::parse(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The first process of `pid`'s container: its farthest ancestor whose `/proc/<pid>/cgroup`
/// reads `cgroups` (what was read for `pid`), e.g. the container's init, whose parent is the
/// runtime's shim in a cgroup of its own. `pid` itself when its parent is elsewhere or
/// cannot be read. What it names may have exited since; the caller reads it and falls back.
pub fn cgroup_init(pid: u32, cgroups: &str) -> u32 {
    let mut at = pid;
    // A chain of parents is finite; the bound only guards against a loop of recycled pids.
    for _ in 0..256 {
        let Some(parent) = stat(at).map(|s| s.ppid).filter(|&p| p > 1) else {
            break;
        };
        match std::fs::read_to_string(format!("/proc/{parent}/cgroup")) {
            Ok(c) if c == cgroups => at = parent,
            _ => break,
        }
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn a_live_peer_is_read_and_one_that_exited_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let l = UnixListener::bind(&path).unwrap();
        // This process: alive, its own cgroup.
        let _c = UnixStream::connect(&path).unwrap();
        let (s, _) = l.accept().unwrap();
        let me = std::process::id();
        assert_eq!(
            cgroups(&s, me).unwrap(),
            std::fs::read_to_string("/proc/self/cgroup").unwrap()
        );
        // A child that connects and exits before the daemon looks.
        let mut child = std::process::Command::new("python3")
            .args([
                "-c",
                "import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])",
            ])
            .arg(&path)
            .spawn()
            .unwrap();
        let pid = child.id();
        child.wait().unwrap();
        let (s, _) = l.accept().unwrap();
        assert_eq!(cgroups(&s, pid), Err(PinError::Gone(pid)));
        assert!(stat(me).unwrap().start <= boot_ticks().unwrap());
    }

    #[test]
    fn a_processs_cgroup_init_is_its_farthest_ancestor_in_the_same_cgroup() {
        let mine = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let me = std::process::id();
        // SAFETY: getppid takes nothing and cannot fail.
        assert_eq!(stat(me).unwrap().ppid, unsafe { libc::getppid() } as u32);
        let top = cgroup_init(me, &mine);
        // A grandchild (sh, then sleep) in this cgroup walks up to the same process.
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 5; true"])
            .spawn()
            .unwrap();
        let sh = child.id();
        let sleeper = (0..500)
            .find_map(|_| {
                std::thread::sleep(std::time::Duration::from_millis(10));
                let kids =
                    std::fs::read_to_string(format!("/proc/{sh}/task/{sh}/children")).ok()?;
                kids.split_whitespace().next()?.parse::<u32>().ok()
            })
            .expect("sh's child");
        assert_eq!(cgroup_init(sleeper, &mine), top);
        assert_eq!(cgroup_init(sh, &mine), top);
        // Named by another cgroup's text, a process is its own first.
        assert_eq!(cgroup_init(sleeper, "0::/elsewhere\n"), sleeper);
        // SAFETY: a signal to a pid this test started (the sleeper is ours until sh reaps it).
        unsafe { libc::kill(sleeper as i32, libc::SIGKILL) };
        child.wait().unwrap();
    }
}
