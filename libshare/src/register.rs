//! The shim's side of registration (`libshare_abi::register`): at initialisation, before the
//! container's state file is opened by path, ask the daemon for it. The daemon decides the
//! container from the process's cgroup and passes the file's descriptor; a process then needs
//! no path to (and no permission on) any state file.
//!
//! Which socket ([`target`]): first the daemon's socket directory as a container runtime
//! mounts it, read-only (`libshare_abi::socket_dir`: `/dev/libshare` from libshare's CDI spec,
//! hook or runc wrapper; HAMi's `/tmp/vgpulock/libshare`, wherever the container's `/tmp` went).
//! Such a mount means a daemon decides, whatever the container did to other paths, to modes, to
//! links or to `LIBSHARE_SOCKET`/`LIBSHARE_STATE_DIR`/`LIBSHARE_CONTAINER_DIR` (ignored then,
//! one line), and whether or not the socket is there at the moment (a daemon restarting: the
//! shim waits for it). A `/dev/libshare` that is not such a mount, and (in HAMi mode) a
//! socket in `/tmp/vgpulock/libshare` that is not on one, are refused with one line: the job
//! does not run. The peer must be the directory's owner (`SO_PEERCRED`), and the state file it
//! passes a regular file of that owner, mode 0600 (`State::from_daemon`).
//!
//! Without such a mount (a plain host): `LIBSHARE_SOCKET`, else `<state dir>/register.sock`.
//! No socket file there: no daemon, and the shim works as without one (its environment's
//! container and limits, the file by path). The peer must be root or this process's user.
//!
//! A socket file means a daemon decides: a process that cannot register **never** takes its
//! identity or limits from its environment (else filling the daemon's connection cap, or
//! stopping it, would let jobs escape their container's quota). It asks again, backing off
//! from 10 ms to 500 ms, while the daemon is busy (at its connection limit), does not answer
//! within 1 s (stopped, hung, its backlog full), or nobody listens on the file (a crashed daemon
//! being restarted), for at most `LIBSHARE_REGISTER_TIMEOUT` (default 10 s; one line on stderr
//! once it has waited 1 s). Then, or at once on a refusal or a broken answer, registration
//! fails with one line saying why and what to do: `cuInit` fails and the job does not run.
//! An NVML-only process (no `cuInit`: a monitoring tool, or the daemon itself where the shim is
//! preloaded everywhere) asks once ([`Patience::Once`]); if that fails it sees the devices as
//! they are, never its environment's limits.
//!
//! Init only, never on a hot path; holds no lock (a fork while a thread waits here leaves the
//! child nothing held); never panics.

use crate::config::Config;
use libshare_abi::register::{Hello, Welcome};
use libshare_abi::socket_dir::{self, Found, SocketDir};
use libshare_abi::wire::WireError;
use libshare_abi::State;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What registration gave.
pub enum Outcome {
    /// No registration socket: no daemon, work without one.
    NoDaemon,
    Registered {
        state: Box<State>,
        container: String,
        /// The daemon trusts the environment (`--trust-env`): its limits and class apply where
        /// the daemon has no settings.
        env_trusted: bool,
    },
}

/// Why this process could not register: each the one line for stderr, saying what to do. The
/// process must not run on its environment's word.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    #[error("libshare: the daemon at {} refused to register this process: {reason}; {then}", sock.display())]
    Refused {
        sock: PathBuf,
        reason: String,
        then: &'static str,
    },
    #[error(
        "libshare: registration with the daemon at {} failed ({error}); {then}. Check that this \
         process can reach the socket and that the daemon and the shim are the same version",
        sock.display()
    )]
    Failed {
        sock: PathBuf,
        error: String,
        then: &'static str,
    },
    /// A socket directory that is not what the runtime mounts (or, in HAMi mode, a socket
    /// containers could have replaced).
    #[error("libshare: {} {why}, so it may not be the daemon's: the job does not register there and does not run. {todo}", path.display())]
    Untrusted {
        path: PathBuf,
        why: String,
        todo: &'static str,
    },
    /// Something other than the daemon answered, or passed a file that is not the daemon's.
    #[error("libshare: {} is not answered by the daemon ({why}); {then}. The node's operator must check what serves it", sock.display())]
    NotTheDaemon {
        sock: PathBuf,
        why: String,
        then: &'static str,
    },
    /// Asked again until the deadline (`within`: " within 10s", or nothing when asked once).
    #[error("libshare: the daemon at {} did not register this process{within} ({why}); {then}. {todo}{raise}", sock.display())]
    NotRegistered {
        sock: PathBuf,
        within: String,
        why: String,
        then: &'static str,
        todo: &'static str,
        raise: &'static str,
    },
}

/// The longest one attempt waits for the daemon (to connect, and for its answer).
const ATTEMPT: Duration = Duration::from_secs(1);
/// The shortest one attempt waits, however little of the deadline is left.
const MIN_ATTEMPT: Duration = Duration::from_millis(50);
/// The first pause between attempts; each next one doubles, up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(10);
const MAX_PAUSE: Duration = Duration::from_millis(500);
/// How a busy daemon's answer starts in the lines.
const BUSY: &str = "busy: ";
/// After waiting this long, one line says so.
const ANNOUNCE_AFTER: Duration = Duration::from_secs(1);

/// What one attempt gave.
enum Attempt {
    Done(Outcome),
    /// Worth asking again (busy, no answer, nobody listening); why, for the final line.
    Again(String),
    /// Final: the reason for the one line.
    Refused(String),
    Failed(String),
    /// The peer or the file it passed is not the daemon's.
    NotTheDaemon(String),
}

/// Where a process asks.
pub(crate) enum Target {
    /// The daemon's socket directory as a runtime mounts it (read-only, root's): a daemon
    /// decides, and only the directory's owner may answer.
    Mounted(SocketDir),
    /// `LIBSHARE_SOCKET` or `<state dir>/register.sock` (a plain host): no socket file, no
    /// daemon; root or this process's user may answer.
    Configured(PathBuf),
}

impl Target {
    /// The socket's path, as messages name it.
    fn shown(&self) -> PathBuf {
        match self {
            Target::Mounted(d) => d.shown(),
            Target::Configured(p) => p.clone(),
        }
    }
}

const DEV_TODO: &str = "The container runtime mounts the daemon's socket directory read-only \
     there (sharectl cdi generate, sharectl hook, sharectl runtime): do not create or mount \
     anything else at /dev/libshare";
const HAMI_TODO: &str = "Any container could have replaced a socket there. The node's operator \
     must mount the daemon's socket directory read-only at /tmp/vgpulock/libshare before pods \
     start (sharectl daemon --hami does it when run as root) and restart this pod";

/// Which socket this process asks (module doc); None: no daemon.
pub(crate) fn target(cfg: &Config) -> Result<Option<Target>, RegisterError> {
    let dev = Path::new(socket_dir::IN_CONTAINER);
    match socket_dir::check(dev) {
        Found::Trusted(d) => return Ok(Some(Target::Mounted(d))),
        Found::Untrusted { why, .. } => {
            return Err(RegisterError::Untrusted {
                path: dev.to_path_buf(),
                why,
                todo: DEV_TODO,
            })
        }
        Found::Absent => {}
    }
    let hami = Path::new(socket_dir::HAMI_DIR);
    match socket_dir::check(hami) {
        Found::Trusted(d) => return Ok(Some(Target::Mounted(d))),
        Found::Untrusted {
            why,
            has_socket: true,
        } if cfg.hami => {
            return Err(RegisterError::Untrusted {
                path: hami.join(socket_dir::SOCKET_NAME),
                why: format!("is in a directory that {why}"),
                todo: HAMI_TODO,
            })
        }
        _ => {}
    }
    if let Some(d) = socket_dir::find_hami_mount() {
        return Ok(Some(Target::Mounted(d)));
    }
    Ok(cfg.socket.clone().map(Target::Configured))
}

/// One line for each variable that would have sent this process elsewhere, ignored because
/// the runtime mounted the daemon's socket at `dir`.
fn ignored(dir: &SocketDir) -> Vec<String> {
    let shown = dir.shown();
    [
        "LIBSHARE_SOCKET",
        "LIBSHARE_STATE_DIR",
        "LIBSHARE_CONTAINER_DIR",
    ]
    .into_iter()
    .filter_map(|k| {
        let v = std::env::var_os(k).filter(|v| !v.is_empty())?;
        (k != "LIBSHARE_SOCKET" || Path::new(&v) != shown).then(|| {
            format!(
                "libshare: warning: {k}={} ignored: the container's runtime mounted the \
                     daemon's socket at {}, and the daemon decides this process's container",
                v.to_string_lossy(),
                shown.display()
            )
        })
    })
    .collect()
}

/// The pause before the next attempt, after `failures` (≥ 1) attempts that may be retried and
/// `elapsed` since the first, with `limit` in all: 10 ms doubling to 500 ms, never past the
/// deadline; None once the deadline has passed (give up).
pub(crate) fn pause(elapsed: Duration, limit: Duration, failures: u32) -> Option<Duration> {
    let left = limit.checked_sub(elapsed).filter(|l| !l.is_zero())?;
    let backoff = FIRST_PAUSE
        .saturating_mul(1u32 << failures.saturating_sub(1).min(16))
        .min(MAX_PAUSE);
    Some(backoff.min(left))
}

/// How long an attempt started at `elapsed` may wait: 1 s, less near the deadline, never
/// under [`MIN_ATTEMPT`] (a daemon must have a chance to answer even a last attempt).
pub(crate) fn attempt_timeout(elapsed: Duration, limit: Duration) -> Duration {
    limit
        .saturating_sub(elapsed)
        .clamp(MIN_ATTEMPT, ATTEMPT.max(MIN_ATTEMPT))
}

/// `10s`, `1.5s`, `500ms`: a duration as the variable is written.
fn show(d: Duration) -> String {
    if d.subsec_millis() == 0 && d.as_secs() > 0 {
        format!("{}s", d.as_secs())
    } else if d.as_millis() >= 1000 {
        format!("{:.1}s", d.as_secs_f64())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// How long registration may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Patience {
    /// A CUDA job: ask again, backing off, for up to this long (`LIBSHARE_REGISTER_TIMEOUT`).
    Wait(Duration),
    /// An NVML-only view (a monitoring tool, the daemon itself when the shim is preloaded
    /// everywhere): one attempt of up to 1 s. Such a process holds no memory, and one that
    /// cannot register shows the devices as they are, so it has no quota to escape; it must
    /// not stall a memory query, nor the start of a daemon whose stale socket it would be
    /// waiting on.
    Once,
}

/// What a failure means for the process, for its one line.
fn consequence(patience: Patience) -> &'static str {
    match patience {
        Patience::Wait(_) => "the job does not run outside its container's limits",
        Patience::Once => {
            "NVML shows the devices' own memory, not this process's environment's limits"
        }
    }
}

/// Registers this process with the daemon at the configured socket. Err: the one line for
/// stderr (the daemon refused, did not register the process in time, or answered nonsense):
/// the process must not run on its environment's word.
pub fn register(cfg: &Config, patience: Patience) -> Result<Outcome, RegisterError> {
    let target = match target(cfg)? {
        Some(t) => t,
        None => return Ok(Outcome::NoDaemon),
    };
    if let (Target::Mounted(dir), Patience::Wait(_)) = (&target, patience) {
        for line in ignored(dir) {
            eprintln!("{line}");
        }
    }
    if let Target::Configured(sock) = &target {
        if !sock.exists() {
            return Ok(Outcome::NoDaemon);
        }
    }
    let sock = &target.shown();
    let hello = Hello {
        claimed: std::env::var("LIBSHARE_CONTAINER").unwrap_or_default(),
    }
    .encode();
    let limit = match patience {
        Patience::Wait(limit) => limit,
        Patience::Once => Duration::ZERO,
    };
    let then = consequence(patience);
    let t0 = Instant::now();
    let mut failures = 0u32;
    let mut announced = false;
    loop {
        let timeout = match patience {
            Patience::Wait(limit) => attempt_timeout(t0.elapsed(), limit),
            Patience::Once => ATTEMPT,
        };
        let why = match attempt(&target, &hello, timeout, failures == 0) {
            Attempt::Done(outcome) => {
                if let Outcome::Registered { container, .. } = &outcome {
                    if announced {
                        eprintln!(
                            "libshare: the daemon at {} took this process into container {container} after {}",
                            sock.display(),
                            show(t0.elapsed())
                        );
                    }
                    // What registration adds to cuInit (benchmarked: daemon_register_scale).
                    tracing::debug!(
                        container = %container,
                        us = t0.elapsed().as_micros() as u64,
                        attempts = failures + 1,
                        "registered with the daemon"
                    );
                }
                return Ok(outcome);
            }
            Attempt::Refused(reason) => {
                return Err(RegisterError::Refused {
                    sock: sock.clone(),
                    reason,
                    then,
                })
            }
            Attempt::Failed(error) => {
                return Err(RegisterError::Failed {
                    sock: sock.clone(),
                    error,
                    then,
                })
            }
            Attempt::NotTheDaemon(why) => {
                return Err(RegisterError::NotTheDaemon {
                    sock: sock.clone(),
                    why,
                    then,
                })
            }
            Attempt::Again(why) => why,
        };
        failures += 1;
        let Some(wait) = pause(t0.elapsed(), limit, failures) else {
            let within = match patience {
                Patience::Wait(limit) => format!(" within {}", show(limit)),
                Patience::Once => String::new(),
            };
            let raise = match patience {
                Patience::Wait(_) => ", or raise LIBSHARE_REGISTER_TIMEOUT",
                Patience::Once => "",
            };
            let todo = if why.starts_with(BUSY) {
                "Retry when the node is less loaded (the daemon is at its connection limit)"
            } else {
                "Start the daemon (or remove the stale socket if it is gone for good)"
            };
            return Err(RegisterError::NotRegistered {
                sock: sock.clone(),
                within,
                why,
                then,
                todo,
                raise,
            });
        };
        if !announced && t0.elapsed() + wait >= ANNOUNCE_AFTER {
            announced = true;
            eprintln!(
                "libshare: waiting up to {} for the daemon at {} to register this process ({why})",
                show(limit),
                sock.display()
            );
        }
        std::thread::sleep(wait);
    }
}

/// One request to the daemon. `first`: a configured socket file that vanishes before the
/// first attempt is a daemon that stopped (and removed it): no daemon; later, a daemon
/// restarting. A mounted socket directory without its socket is always a daemon restarting.
fn attempt(target: &Target, hello: &[u8], timeout: Duration, first: bool) -> Attempt {
    let (sock, mounted) = match target {
        Target::Mounted(d) => (d.socket_path(), true),
        Target::Configured(p) => (p.clone(), false),
    };
    let answer = match libshare_abi::wire::ask(&sock, hello, timeout) {
        Ok(r) => r,
        Err(WireError::Connect { err, .. }) => {
            return match err.kind() {
                ErrorKind::NotFound if mounted => Attempt::Again(
                    "its socket is not there: the daemon is stopped or restarting".into(),
                ),
                ErrorKind::NotFound if first => Attempt::Done(Outcome::NoDaemon),
                ErrorKind::NotFound => Attempt::Again("its socket file went away".into()),
                ErrorKind::ConnectionRefused => Attempt::Again("nobody listens on it".into()),
                ErrorKind::Interrupted => Attempt::Again("interrupted".into()),
                _ => Attempt::Failed(format!("cannot connect: {err}")),
            }
        }
        Err(WireError::Timeout) => return Attempt::Again("no answer".into()),
        Err(WireError::Closed) => {
            return Attempt::Again("it closed the connection without answering".into())
        }
        Err(WireError::Io(e))
            if matches!(
                e.kind(),
                ErrorKind::ConnectionReset | ErrorKind::BrokenPipe | ErrorKind::Interrupted
            ) =>
        {
            return Attempt::Again(format!("the connection broke: {e}"))
        }
        Err(e) => return Attempt::Failed(e.to_string()),
    };
    // Who answered: the socket directory's owner where the runtime mounted it; root or this
    // process's user for a configured socket.
    let peer = answer.peer_uid;
    let expected = match target {
        Target::Mounted(d) => peer == d.owner,
        Target::Configured(_) => peer == 0 || peer == euid(),
    };
    if !expected {
        let want = match target {
            Target::Mounted(d) => format!("uid {}, the owner of {}", d.owner, d.path.display()),
            Target::Configured(_) => format!("root or uid {}", euid()),
        };
        return Attempt::NotTheDaemon(format!("a process of uid {peer} answers, not {want}"));
    }
    match Welcome::decode(&answer.body) {
        Ok(Welcome::Ok {
            container,
            env_trusted,
        }) => {
            let Some(fd) = answer.fd else {
                return Attempt::Failed("no state file came with the answer".into());
            };
            match State::from_daemon(std::fs::File::from(fd), peer) {
                Ok(state) => Attempt::Done(Outcome::Registered {
                    state: Box::new(state),
                    container,
                    env_trusted,
                }),
                Err(e @ libshare_abi::StateError::NotTheDaemons { .. }) => {
                    Attempt::NotTheDaemon(e.to_string())
                }
                Err(e) => Attempt::Failed(e.to_string()),
            }
        }
        Ok(Welcome::Busy { reason }) => Attempt::Again(format!("{BUSY}{reason}")),
        Ok(Welcome::Refused { reason }) => Attempt::Refused(reason),
        Err(e) => Attempt::Failed(e),
    }
}

fn euid() -> u32 {
    // SAFETY: geteuid takes no arguments, touches no memory and cannot fail.
    unsafe { libc::geteuid() }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn pauses_double_from_10ms_to_500ms_and_stop_at_the_deadline() {
        let limit = Duration::from_secs(10);
        let pauses: Vec<_> = (1..=8)
            .map(|n| pause(Duration::ZERO, limit, n).unwrap())
            .collect();
        assert_eq!(pauses, [10, 20, 40, 80, 160, 320, 500, 500].map(|m| m * MS));
        assert_eq!(pause(Duration::ZERO, limit, u32::MAX), Some(500 * MS));
        // Never past the deadline; none once it has passed.
        assert_eq!(pause(9990 * MS, limit, 10), Some(10 * MS));
        assert_eq!(pause(limit, limit, 1), None);
        assert_eq!(pause(limit + MS, limit, 1), None);
        assert_eq!(
            pause(Duration::ZERO, Duration::ZERO, 1),
            None,
            "0s: one attempt"
        );
    }

    #[test]
    fn a_whole_wait_is_bounded_by_the_limit() {
        // Attempts that each time out, as against a stopped daemon: simulated time.
        for limit in [
            Duration::ZERO,
            700 * MS,
            Duration::from_secs(2),
            Duration::from_secs(10),
        ] {
            let mut now = Duration::ZERO;
            let mut failures = 0;
            loop {
                now += attempt_timeout(now, limit);
                failures += 1;
                match pause(now, limit, failures) {
                    Some(p) => now += p,
                    None => break,
                }
            }
            assert!(now >= limit, "gave up early: {now:?} < {limit:?}");
            assert!(now <= limit + MIN_ATTEMPT, "{now:?} for {limit:?}");
        }
        assert_eq!(
            attempt_timeout(Duration::ZERO, Duration::from_secs(10)),
            ATTEMPT
        );
        assert_eq!(
            attempt_timeout(9800 * MS, Duration::from_secs(10)),
            200 * MS
        );
        assert_eq!(
            attempt_timeout(Duration::from_secs(11), Duration::from_secs(10)),
            MIN_ATTEMPT
        );
    }

    #[test]
    fn durations_show_as_written() {
        assert_eq!(show(Duration::from_secs(10)), "10s");
        assert_eq!(show(500 * MS), "500ms");
        assert_eq!(show(1500 * MS), "1.5s");
        assert_eq!(show(Duration::ZERO), "0ms");
    }
}
