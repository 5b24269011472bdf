//! The shim's side of registration (`libshare_abi::register`): at initialisation, before the
//! container's state file is opened by path, ask the daemon for it. The daemon decides the
//! container from the process's cgroup and passes the file's descriptor; a process then needs
//! no path to (and no permission on) any state file.
//!
//! No socket, or nobody listening: no daemon, and the shim works as without one (its
//! environment's container and limits, the file by path). A daemon that refuses or does not
//! answer within 1 s: one line on stderr, then the same. Init only: never on a hot path.

use crate::config::Config;
use libshare_abi::register::{Hello, Welcome};
use libshare_abi::State;
use std::io::ErrorKind;
use std::time::Duration;

/// What registration gave.
pub enum Outcome {
    /// No daemon listens: work without one.
    NoDaemon,
    Registered {
        state: Box<State>,
        container: String,
        /// The daemon trusts the environment (`--trust-env`): its limits and class apply where
        /// the daemon has no settings.
        env_trusted: bool,
    },
}

pub fn register(cfg: &Config) -> Outcome {
    let Some(sock) = &cfg.socket else {
        return Outcome::NoDaemon;
    };
    if !sock.exists() {
        return Outcome::NoDaemon;
    }
    let hello = Hello {
        claimed: std::env::var("LIBSHARE_CONTAINER").unwrap_or_default(),
    };
    let fail = |why: String| {
        eprintln!(
            "libshare: registration with the daemon at {} failed ({why}); using LIBSHARE_CONTAINER={} and this process's limits",
            sock.display(),
            cfg.container
        );
        Outcome::NoDaemon
    };
    let t0 = std::time::Instant::now();
    let (body, fd) = match libshare_abi::wire::call(sock, &hello.encode(), Duration::from_secs(1)) {
        Ok(r) => r,
        Err(libshare_abi::wire::WireError::Connect { err, .. })
            if matches!(
                err.kind(),
                ErrorKind::ConnectionRefused | ErrorKind::NotFound
            ) =>
        {
            return Outcome::NoDaemon; // a socket file left by a daemon that is gone
        }
        Err(e) => return fail(e.to_string()),
    };
    match Welcome::decode(&body) {
        Ok(Welcome::Ok {
            container,
            env_trusted,
        }) => {
            let Some(fd) = fd else {
                return fail("no state file came with the answer".into());
            };
            match State::from_fd(std::fs::File::from(fd)) {
                Ok(state) => {
                    // What registration adds to cuInit (benchmarked: daemon_register_scale).
                    tracing::debug!(
                        container = %container,
                        us = t0.elapsed().as_micros() as u64,
                        "registered with the daemon"
                    );
                    Outcome::Registered {
                        state: Box::new(state),
                        container,
                        env_trusted,
                    }
                }
                Err(e) => fail(e.to_string()),
            }
        }
        Ok(Welcome::Refused { reason } | Welcome::Busy { reason }) => {
            fail(format!("refused: {reason}"))
        }
        Err(e) => fail(e),
    }
}
