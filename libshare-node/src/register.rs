//! The registration socket (`<state dir>/register.sock` by default, mode 0666: anyone local may
//! ask, the kernel says who asks). A shim sends a `Hello`; the daemon takes the peer's host pid
//! from `SO_PEERCRED`, its container from `/proc/<pid>/cgroup` ([`crate::identity`]), opens or
//! creates that container's state file (0700 directory, 0600 file, the daemon's), writes the
//! daemon's settings into it (the seed) and answers `Welcome` with the file's descriptor. One
//! open and one `sendmsg` per process: O(1), no lock held across clients.

use crate::authority::Authority;
use crate::identity::{container_of_cgroups, naming, unmapped, IdentityConfig};
use crate::server::{Peer, Refusal, Reply, Service};
use libshare_abi::register::{Hello, Welcome};
use libshare_abi::{container_dir, State};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering::{Acquire, Release};

pub struct RegisterService {
    state_dir: PathBuf,
    identity: IdentityConfig,
    authority: Option<Authority>,
    /// Containers' states opened so far (each file opened once; the descriptor passed is a dup).
    open: HashMap<String, State>,
    /// Registrations until the next sweep of `open`.
    until_sweep: u32,
    /// Driver-enforced caps: told each registering container's cgroup.
    caps: Option<std::sync::Arc<crate::caps::Caps>>,
    /// HAMi mode: a container's settings are adopted from HAMi's variables in the environment
    /// of its first registering process ([`RegisterService::with_hami`]).
    hami: bool,
    /// The book's count of forgotten containers when `open` was last swept.
    swept_at: u64,
    /// The control loop's live counters: the devices it holds a new container on, and where
    /// a registration tells it to rescan ([`crate::controller::hold_new`]).
    control: Option<std::sync::Arc<crate::controller::Health>>,
}

/// Every this many registrations, the states of containers whose file is gone (the container
/// was removed) are closed, so that a node with churn keeps only about its live containers
/// open. Entries are only added by registrations, so this bounds `open` to the containers that
/// exist plus this many.
const SWEEP_EVERY: u32 = 64;

impl RegisterService {
    pub fn new(state_dir: PathBuf, identity: IdentityConfig, authority: Option<Authority>) -> Self {
        RegisterService {
            state_dir,
            identity,
            authority,
            open: HashMap::new(),
            until_sweep: SWEEP_EVERY,
            caps: None,
            hami: false,
            swept_at: 0,
            control: None,
        }
    }

    /// Tells the control loop of each new container at once and holds it until the loop's
    /// policy decides (see [`crate::controller::hold_new`]).
    pub fn with_control(mut self, health: std::sync::Arc<crate::controller::Health>) -> Self {
        self.control = Some(health);
        self
    }

    /// HAMi mode: a container the daemon has no settings for adopts what HAMi's device plugin
    /// and webhook gave it (`CUDA_DEVICE_MEMORY_LIMIT[_i]`, `CUDA_DEVICE_SM_LIMIT[_i]`,
    /// `CUDA_TASK_PRIORITY`, `CUDA_OVERSUBSCRIBE`), read from the registering process's
    /// environment as the kernel holds it (`/proc/<pid>/environ`); an invalid value refuses the
    /// registration with the one line naming it.
    pub fn with_hami(mut self, on: bool) -> Self {
        self.hami = on;
        self
    }

    /// HAMi mode: adopts the HAMi settings of container `name` (first registration wins) from
    /// the environment of its first process (its farthest ancestor in the cgroup `cgroups` of
    /// the registering `pid`: the container's init as the runtime started it, with the
    /// variables HAMi's device plugin gave the container), not from whichever process
    /// registers first, which a tenant could start with variables of its choosing (audit 4,
    /// B5b); the registering process's own if that one is gone.
    fn adopt_hami(&self, name: &str, pid: u32, cgroups: &str) -> Result<(), String> {
        let Some(a) = self.authority.as_ref().filter(|_| self.hami) else {
            return Ok(());
        };
        let init = crate::peer::cgroup_init(pid, cgroups);
        let raw = std::fs::read(format!("/proc/{init}/environ"))
            .or_else(|_| std::fs::read(format!("/proc/{pid}/environ")))
            .map_err(|e| format!("the daemon cannot read the process's environment: {e}"))?;
        let vars: HashMap<String, String> = raw
            .split(|b| *b == 0)
            .filter_map(|kv| {
                let kv = String::from_utf8_lossy(kv);
                let (k, v) = kv.split_once('=')?;
                libshare_abi::hami::is_hami_var(k).then(|| (k.to_string(), v.to_string()))
            })
            .collect();
        let h = libshare_abi::hami::HamiEnv::from_vars(&vars)?;
        if h.any() && a.adopt(name, h.settings())? {
            tracing::info!(container = %name, pid, from = init, "HAMi settings adopted");
        }
        Ok(())
    }

    /// Tells `caps` the cgroup of every container a process registers from.
    pub fn with_caps(mut self, caps: Option<std::sync::Arc<crate::caps::Caps>>) -> Self {
        self.caps = caps;
        self
    }

    /// Containers whose state this service holds open.
    pub fn open_containers(&self) -> usize {
        self.open.len()
    }

    fn register(&mut self, peer: &Peer, hello: &Hello) -> Result<(String, std::fs::File), String> {
        // Read at accept with the process pinned (the server's `pin_identity`); never a guess
        // for a process that could not be read.
        let Some(cgroups) = peer.cgroups.as_deref() else {
            return Err(Refusal::Unidentified.message().into());
        };
        let named = naming(cgroups, &self.identity);
        let name = match &named {
            Some(n) => n.name.clone(),
            None => unmapped(&hello.claimed, &self.identity),
        };
        if let Some(book) = self.authority.as_ref().and_then(|a| a.book()) {
            // A container a cgroup names counts against the cgroup root made it in; a name the
            // process chose (trusted environment), against its uid and its own cgroup.
            let claimed = named.is_none() && self.identity.trust_env;
            let maker = crate::book::Maker {
                uid: (claimed && peer.uid != 0).then_some(peer.uid),
                cgroup: match &named {
                    Some(n) => n.parent().to_string(),
                    None => own_cgroup(cgroups),
                },
            };
            let state = container_dir(&self.state_dir, &name).join(libshare_abi::STATE_FILE);
            book.register(&name, maker, || state.exists())?;
        }
        self.adopt_hami(&name, peer.pid, cgroups)?;
        if let (Some(caps), Some(n)) = (&self.caps, &named) {
            caps.learn(&n.name, n.dir.clone());
        }
        self.until_sweep -= 1;
        if self.until_sweep == 0 {
            self.until_sweep = SWEEP_EVERY;
            self.open.retain(|_, st| st.check_path().is_ok());
        }
        // A cached file removed or replaced since (its container was re-created) is reopened.
        if self
            .open
            .get(&name)
            .is_some_and(|st| st.check_path().is_err())
        {
            self.open.remove(&name);
        }
        let new = !self.open.contains_key(&name);
        if new {
            let st = State::open_or_create(&container_dir(&self.state_dir, &name))
                .map_err(|e| format!("the daemon cannot open container {name}'s state: {e}"))?;
            self.open.insert(name.clone(), st);
        }
        let st = &self.open[&name];
        if let Some(a) = &self.authority {
            a.seed(&name, st);
        }
        if let Some(h) = &self.control {
            crate::controller::hold_new(st, h.devices.load(Acquire), libshare_abi::rate::now_ns());
            if new {
                h.registered.fetch_add(1, Release);
            }
        }
        let stamp = crate::demote::STAMP.load(Acquire);
        if stamp != 0 && st.header().class() == libshare_abi::Class::Production {
            st.header().set_protect(stamp);
        }
        let f = st
            .dup_file()
            .ok_or_else(|| format!("container {name}'s state has no descriptor to pass"))?;
        tracing::debug!(pid = peer.pid, uid = peer.uid, container = %name, claimed = %hello.claimed, "registered");
        Ok((name, f))
    }
}

/// A process's own cgroup, for counting what it makes: the first hierarchy that places it
/// below the root (cgroup v2's alone on a v2 host), else `/`.
fn own_cgroup(text: &str) -> String {
    text.lines()
        .filter_map(|l| l.splitn(3, ':').nth(2))
        .find(|p| *p != "/")
        .unwrap_or("/")
        .to_string()
}

impl Service for RegisterService {
    fn admit(&self, _: &Peer) -> bool {
        true
    }

    /// Held connections are limited per container (a process in no container's cgroup: per
    /// cgroup), so a flood from one container never delays another's registrations.
    fn group(&self, peer: &Peer) -> String {
        let text = peer.cgroups.as_deref().unwrap_or("");
        container_of_cgroups(text, &self.identity).unwrap_or_else(|| text.to_string())
    }

    fn handle(&mut self, peer: &Peer, request: &[u8]) -> Reply {
        let result = Hello::decode(request).and_then(|h| self.register(peer, &h));
        match result {
            Ok((container, f)) => Reply {
                body: Welcome::Ok {
                    container,
                    env_trusted: self.identity.trust_env,
                }
                .encode(),
                fd: Some(f.into()),
            },
            Err(reason) => {
                tracing::info!(pid = peer.pid, "registration refused: {reason}");
                Reply::body(Welcome::Refused { reason }.encode())
            }
        }
    }

    /// Containers the registry forgot are closed here too, within a turn of the loop.
    fn tick(&mut self) {
        let Some(n) = self
            .authority
            .as_ref()
            .and_then(|a| a.book())
            .map(|b| b.forgotten())
        else {
            return;
        };
        if n != self.swept_at {
            self.swept_at = n;
            self.open.retain(|_, st| st.check_path().is_ok());
        }
    }

    fn refusal(&self, why: Refusal) -> Vec<u8> {
        let reason = why.message().into();
        match why {
            // Nothing wrong with the request: a daemon at a limit, or a caller descheduled
            // between its connect and its write past the first-byte deadline (300 processes
            // starting at once on 2 cores): asking again succeeds.
            Refusal::Busy | Refusal::Timeout => Welcome::Busy { reason },
            _ => Welcome::Refused { reason },
        }
        .encode()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(name: &str) -> Hello {
        Hello {
            claimed: name.into(),
        }
    }

    #[test]
    fn a_removed_containers_state_is_closed_within_a_sweep() {
        let dir = tempfile::tempdir().unwrap();
        let identity = IdentityConfig {
            trust_env: true,
            ..Default::default()
        };
        let mut svc = RegisterService::new(dir.path().to_path_buf(), identity, None);
        // A cgroup no rule maps: the trusted claim names the container.
        let peer = Peer {
            pid: u32::MAX - 7,
            uid: 0,
            gid: 0,
            cgroups: Some("0::/user.slice/session-1.scope\n".into()),
        };
        for i in 0..8 {
            svc.register(&peer, &hello(&format!("gone{i}"))).unwrap();
        }
        svc.register(&peer, &hello("kept")).unwrap();
        assert_eq!(svc.open_containers(), 9);
        for i in 0..8 {
            std::fs::remove_dir_all(container_dir(dir.path(), &format!("gone{i}"))).unwrap();
        }
        for _ in 0..SWEEP_EVERY {
            svc.register(&peer, &hello("kept")).unwrap();
        }
        assert_eq!(
            svc.open_containers(),
            1,
            "only the live container stays open"
        );
        // A removed container that registers again gets a new state.
        let (name, _) = svc.register(&peer, &hello("gone0")).unwrap();
        assert_eq!(name, "gone0");
        // A peer whose cgroup could not be read at accept is refused, never resolved.
        let unread = Peer {
            cgroups: None,
            ..peer
        };
        assert!(svc.register(&unread, &hello("gone0")).is_err());
        assert!(container_dir(dir.path(), "gone0")
            .join("state.shm")
            .exists());
    }
}
