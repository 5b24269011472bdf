//! The admin socket (`<state dir>/admin.sock`, mode 0600, and only root or the daemon's own
//! user is served, by the kernel's peer credentials): `set`, `get`, `reset` of a container's
//! settings ([`crate::settings`]), each applied to the container's state file before the answer
//! goes back, so a running job sees it at its next allocation or launch; and `started`, from
//! the runtime's `createRuntime` hook: the daemon reads the container's process's cgroup itself
//! (pinned, [`crate::peer::cgroups_of_pid`]), checks that it names the container the hook says
//! ([`crate::identity::naming`]), and sets the driver's limits on it at once ([`crate::caps`]),
//! so they hold before the container's first process runs, whether or not it ever registers.

use crate::authority::Words;
use crate::server::{Peer, Refusal, Reply, Service};
use crate::settings::{node_devices, Settings, SettingsError};
use libshare_abi::admin::{
    ContainerReport, ContainerSettings, DeviceReport, Request, RequestError, Response, SetRequest,
};
use libshare_abi::names::NAME_RULE;
use libshare_abi::units::format_size;
use libshare_abi::{container_dir, State, MAX_DEVICES};
use std::path::PathBuf;
use std::sync::atomic::Ordering::Acquire;
use std::sync::{Arc, Mutex};

/// Why the daemon refused an admin request: each one line, sent back as the answer's message
/// (turned into it once, in [`AdminService::handle`](Service::handle)).
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("{0}")]
    BadRequest(String),
    /// The request as it stands ([`Request::validate`], the same check `sharectl` makes).
    #[error(transparent)]
    Invalid(#[from] RequestError),
    #[error(
        "a quota of {} is above device {device}'s memory ({}); an opportunistic container may exceed it with --oversubscribe",
        format_size(*.quota),
        format_size(*.memory)
    )]
    QuotaAboveDevice {
        quota: u64,
        device: usize,
        memory: u64,
    },
    #[error("unknown container {0}: nothing is set for it and it has not started")]
    UnknownContainer(String),
    #[error("container {id}: {why}")]
    NotTheContainer { id: String, why: String },
    #[error("container {name}: {err}")]
    State {
        name: String,
        err: libshare_abi::StateError,
    },
    #[error(transparent)]
    Settings(#[from] SettingsError),
}

pub struct AdminService {
    state_dir: PathBuf,
    settings: Arc<Mutex<Settings>>,
    /// Each device's memory (NVML), when known.
    totals: Option<Vec<u64>>,
    /// The daemon trusts the processes' environment (what the settings leave unset is theirs).
    env_trusted: bool,
    uid: u32,
    /// How cgroups name containers, and the driver's caps ([`AdminService::with_identity`]).
    identity: crate::identity::IdentityConfig,
    caps: Option<Arc<crate::caps::Caps>>,
}

impl AdminService {
    pub fn new(
        state_dir: PathBuf,
        settings: Arc<Mutex<Settings>>,
        totals: Option<Vec<u64>>,
        env_trusted: bool,
    ) -> Self {
        AdminService {
            state_dir,
            settings,
            totals,
            env_trusted,
            // SAFETY: geteuid cannot fail.
            uid: unsafe { libc::geteuid() },
            identity: Default::default(),
            caps: None,
        }
    }

    /// How the registration socket names containers, and the caps to set at `started`.
    pub fn with_identity(
        mut self,
        identity: crate::identity::IdentityConfig,
        caps: Option<Arc<crate::caps::Caps>>,
    ) -> Self {
        self.identity = identity;
        self.caps = caps;
        self
    }

    /// `started`: process `pid` is container `id`'s (the runtime says so at createRuntime).
    fn started(&self, id: &str, pid: u32) -> Result<ContainerReport, AdminError> {
        let wrong = |why: String| AdminError::NotTheContainer {
            id: libshare_abi::names::escape(id).into_owned(),
            why,
        };
        let names = crate::identity::names_of_id(id);
        if names.is_empty() {
            return Err(wrong(format!(
                "not a container id ({NAME_RULE}, or a runtime's hex id)"
            )));
        }
        let text = crate::peer::cgroups_of_pid(pid).map_err(|e| wrong(e.to_string()))?;
        let n = crate::identity::naming(&text, &self.identity).ok_or_else(|| {
            wrong(format!(
                "its process {pid} is in no cgroup that names a container (a runtime's layout under its parent cgroup, made by root, or --cgroup-prefix): its processes will be container host; no driver limit set"
            ))
        })?;
        if !names.contains(&n.name) {
            return Err(wrong(format!(
                "its process {pid} is in cgroup {}, which names container {}: no driver limit set",
                libshare_abi::names::escape(&n.cgroup),
                n.name
            )));
        }
        if let Some(caps) = &self.caps {
            caps.learn_and_apply(&self.state_dir, &n.name, n.dir.clone());
        }
        tracing::info!(container = %n.name, pid, cgroup = %n.cgroup, caps = self.caps.is_some(), "container's cgroup taken at createRuntime");
        let settings = self.settings.lock().unwrap_or_else(|p| p.into_inner());
        self.report(&n.name, &settings)
    }

    /// The devices a setting for every device is written to: the node's (NVML), else all.
    fn devices(&self) -> usize {
        node_devices(self.totals.as_deref())
    }

    /// Writes `name`'s words (its effective settings, as the registry re-asserts them) into
    /// its state.
    fn write(&self, settings: &Settings, name: &str, st: &State) {
        Words::of(&settings.effective(name), self.devices(), self.env_trusted).assert(st);
    }

    fn state(&self, name: &str, create: bool) -> Result<Option<State>, AdminError> {
        let dir = container_dir(&self.state_dir, name);
        if !create && !dir.join(libshare_abi::STATE_FILE).exists() {
            return Ok(None);
        }
        State::open_or_create(&dir)
            .map(Some)
            .map_err(|err| AdminError::State {
                name: name.to_string(),
                err,
            })
    }

    fn report(&self, name: &str, settings: &Settings) -> Result<ContainerReport, AdminError> {
        let mut r = ContainerReport {
            container: name.to_string(),
            settings: settings.get(name).cloned().unwrap_or_default(),
            ..Default::default()
        };
        if let Some(st) = self.state(name, false)? {
            r.present = true;
            r.class = Some(st.header().class());
            for d in 0..MAX_DEVICES {
                let dev = st.device(d);
                let rep = DeviceReport {
                    device: d as u32,
                    quota: dev.quota.load(Acquire),
                    used: dev.used.load(Acquire),
                    compute: dev.compute.load(Acquire),
                    weight: dev.weight.load(Acquire),
                };
                if rep.quota != 0 || rep.used != 0 || dev.launches.load(Acquire) != 0 {
                    r.devices.push(rep);
                }
            }
        }
        Ok(r)
    }

    /// `set` of a request [`Request::validate`] passed.
    fn set(&self, q: SetRequest) -> Result<ContainerReport, AdminError> {
        let mut settings = self.settings.lock().unwrap_or_else(|p| p.into_inner());
        let mut s = settings.get(&q.container).cloned().unwrap_or_default();
        self.layer(&mut s, &q)?;
        self.put(&mut settings, &q.container, s)
    }

    /// `bind` of a request [`Request::validate`] passed: the `set`s `new` stands for, layered
    /// in turn over a copy of the container's settings, then written once (a refused one
    /// changes nothing).
    fn bind(&self, name: &str, new: ContainerSettings) -> Result<ContainerReport, AdminError> {
        let reqs = new.requests(name)?;
        let mut settings = self.settings.lock().unwrap_or_else(|p| p.into_inner());
        let mut s = settings.get(name).cloned().unwrap_or_default();
        for q in &reqs {
            self.layer(&mut s, q)?;
        }
        self.put(&mut settings, name, s)
    }

    /// A valid `q` layered over `s` (a container's settings); what only the stored settings
    /// can tell is checked here (a quota above the device, unless it oversubscribes).
    fn layer(&self, s: &mut ContainerSettings, q: &SetRequest) -> Result<(), AdminError> {
        // A container that may oversubscribe limits a footprint of managed memory, which may
        // exceed the device (issue 20).
        let oversubscribes = q.oversubscribe.or(s.oversubscribe) == Some(true);
        if let (Some(m), Some(t), false) = (q.memory, &self.totals, oversubscribes) {
            let devices: Vec<usize> = match q.device {
                Some(d) => vec![d as usize],
                None => (0..t.len()).collect(),
            };
            if let Some(&d) = devices.iter().find(|&&d| m > t[d]) {
                return Err(AdminError::QuotaAboveDevice {
                    quota: m,
                    device: d,
                    memory: t[d],
                });
            }
        }
        if q.class.is_some() {
            s.class = q.class;
        }
        if q.oversubscribe.is_some() {
            s.oversubscribe = q.oversubscribe;
        }
        let target = match q.device {
            Some(d) => s.devices.entry(d.to_string()).or_default(),
            None => &mut s.all,
        };
        target.memory = q.memory.or(target.memory);
        target.compute = q.compute.or(target.compute);
        target.weight = q.weight.or(target.weight);
        if q.device.is_none() {
            // A setting for every device replaces what single devices had for the same field.
            for d in s.devices.values_mut() {
                d.memory = if q.memory.is_some() { None } else { d.memory };
                d.compute = if q.compute.is_some() { None } else { d.compute };
                d.weight = if q.weight.is_some() { None } else { d.weight };
            }
            s.devices.retain(|_, d| !d.is_empty());
        }
        Ok(())
    }

    /// Stores `s` as `name`'s settings and writes them into its state.
    fn put(
        &self,
        settings: &mut Settings,
        name: &str,
        s: ContainerSettings,
    ) -> Result<ContainerReport, AdminError> {
        // The state first (created if the container has not started, so the setting is in place
        // before its first allocation), then the file: a failed save changes neither.
        let st = self.state(name, true)?.expect("created");
        settings.put(name, Some(s))?;
        self.write(settings, name, &st);
        self.report(name, settings)
    }

    fn reset(&self, name: &str) -> Result<ContainerReport, AdminError> {
        let mut settings = self.settings.lock().unwrap_or_else(|p| p.into_inner());
        let st = self.state(name, false)?;
        if settings.get(name).is_none() && st.is_none() {
            return Err(AdminError::UnknownContainer(name.to_string()));
        }
        settings.put(name, None)?;
        if let Some(st) = st {
            // Back to the defaults, through the one writer (the quota stays: see Words::reset).
            Words::of(&settings.effective(name), self.devices(), self.env_trusted).reset(&st);
        }
        self.report(name, &settings)
    }

    fn answer(&self, req: Request) -> Result<ContainerReport, AdminError> {
        req.validate(self.totals.as_ref().map(Vec::len))?;
        match req {
            Request::Set(q) => self.set(q),
            Request::Get { container } => {
                let settings = self.settings.lock().unwrap_or_else(|p| p.into_inner());
                let r = self.report(&container, &settings)?;
                if !r.present && settings.get(&container).is_none() {
                    return Err(AdminError::UnknownContainer(container));
                }
                Ok(r)
            }
            Request::Reset { container } => self.reset(&container),
            Request::Bind {
                container,
                settings,
            } => self.bind(&container, settings),
            // A runtime's id (64 hex digits, or the name runc was given): checked there.
            Request::Started { container, pid } => self.started(&container, pid),
        }
    }
}

impl Service for AdminService {
    fn admit(&self, peer: &Peer) -> bool {
        peer.uid == 0 || peer.uid == self.uid
    }

    fn handle(&mut self, _peer: &Peer, request: &[u8]) -> Reply {
        let resp = match Request::decode(request)
            .map_err(AdminError::BadRequest)
            .and_then(|r| self.answer(r))
        {
            Ok(report) => Response::Ok { report },
            Err(e) => Response::error(e.to_string()),
        };
        Reply::body(resp.encode())
    }

    fn refusal(&self, why: Refusal) -> Vec<u8> {
        Response::error(why.message()).encode()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use libshare_abi::admin::{DeviceSettings, MIN_QUOTA};
    use libshare_abi::{Class, FLAG_DAEMON_MANAGED, FLAG_OVERSUBSCRIBE};

    fn service(dir: &std::path::Path, totals: Option<Vec<u64>>) -> AdminService {
        let settings = Settings::load(dir.join("settings.toml"), Default::default()).unwrap();
        AdminService::new(
            dir.to_path_buf(),
            Arc::new(Mutex::new(settings)),
            totals,
            false,
        )
    }

    fn set(f: impl FnOnce(&mut SetRequest)) -> Request {
        let mut q = SetRequest {
            container: "web".into(),
            ..Default::default()
        };
        f(&mut q);
        Request::Set(q)
    }

    /// The daemon refuses what `Request::validate` refuses, with its message, and changes
    /// nothing.
    #[test]
    fn invalid_requests_are_refused_with_the_requests_own_message() {
        let tmp = tempfile::tempdir().unwrap();
        let a = service(tmp.path(), Some(vec![8 << 30; 2]));
        for req in [
            set(|_| {}),
            set(|q| q.memory = Some(MIN_QUOTA - 1)),
            set(|q| (q.device, q.weight) = (Some(2), Some(1))),
            set(|q| q.compute = Some(10_001)),
            set(|q| (q.container, q.weight) = ("a/b".into(), Some(1))),
            Request::Reset {
                container: "..".into(),
            },
        ] {
            let want = req.validate(Some(2)).unwrap_err().to_string();
            let got = a.answer(req).unwrap_err().to_string();
            assert_eq!(got, want);
        }
        assert!(!container_dir(tmp.path(), "web").exists(), "nothing made");
        assert!(!tmp.path().join("settings.toml").exists(), "nothing saved");
    }

    /// `reset` goes through the one writer: the flags and shares the settings gave are taken
    /// back, the quota stays.
    #[test]
    fn reset_takes_back_the_settings_words_and_keeps_the_quota() {
        let tmp = tempfile::tempdir().unwrap();
        let a = service(tmp.path(), Some(vec![8 << 30]));
        a.answer(set(|q| {
            q.class = Some(Class::Opportunistic);
            q.memory = Some(1 << 30);
            q.compute = Some(2_500);
            q.weight = Some(4);
            q.oversubscribe = Some(true);
        }))
        .unwrap();
        let st = a.state("web", false).unwrap().unwrap();
        let mask = FLAG_DAEMON_MANAGED | FLAG_OVERSUBSCRIBE;
        assert_eq!(st.header().flags.load(Acquire) & mask, mask);
        assert_eq!(st.device(0).compute.load(Acquire), 2_500);
        let r = a
            .answer(Request::Reset {
                container: "web".into(),
            })
            .unwrap();
        assert_eq!(r.settings, Default::default());
        assert_eq!(st.header().flags.load(Acquire) & mask, 0);
        assert_eq!(
            st.header().class(),
            Class::Production,
            "the daemon's default"
        );
        assert_eq!(st.device(0).compute.load(Acquire), 0);
        assert_eq!(st.device(0).weight.load(Acquire), 0);
        assert_eq!(st.device(0).quota.load(Acquire), 1 << 30, "the quota stays");
        assert!(a
            .answer(Request::Reset {
                container: "none".into()
            })
            .is_err());
    }

    const GIB: u64 = 1 << 30;

    fn bind(container: &str, settings: &ContainerSettings) -> Request {
        Request::Bind {
            container: container.into(),
            settings: settings.clone(),
        }
    }

    #[test]
    fn a_bind_sets_a_whole_container_or_nothing() {
        let d = tempfile::tempdir().unwrap();
        let svc = service(d.path(), Some(vec![8 * GIB, 8 * GIB]));
        let mut s = ContainerSettings {
            class: Some(Class::Opportunistic),
            ..Default::default()
        };
        s.all.compute = Some(3000);
        s.devices.insert(
            "1".into(),
            DeviceSettings {
                memory: Some(2 * GIB),
                ..Default::default()
            },
        );
        let r = svc.answer(bind("abc", &s)).unwrap();
        assert_eq!(r.settings, s);
        assert!(
            r.present,
            "the state is created before the container starts"
        );
        // Refused (device 1's quota above its memory, device 5 absent): nothing changes.
        let mut big = s.clone();
        big.class = Some(Class::Production);
        big.devices.get_mut("1").unwrap().memory = Some(9 * GIB);
        let e = svc.answer(bind("abc", &big)).unwrap_err();
        assert!(
            matches!(e, AdminError::QuotaAboveDevice { device: 1, .. }),
            "{e}"
        );
        let mut absent = s.clone();
        absent.devices.insert("5".into(), DeviceSettings::default());
        absent.devices.get_mut("5").unwrap().weight = Some(2);
        assert!(matches!(
            svc.answer(bind("abc", &absent)).unwrap_err(),
            AdminError::Invalid(RequestError::NoSuchDevice(5, 2))
        ));
        let get = Request::Get {
            container: "abc".into(),
        };
        assert_eq!(svc.answer(get).unwrap().settings, s);
        assert!(matches!(
            svc.answer(bind("abc", &ContainerSettings::default())),
            Err(AdminError::Invalid(RequestError::NothingToSet))
        ));
        assert!(matches!(
            svc.answer(bind("../x", &s)),
            Err(AdminError::Invalid(RequestError::BadName(_)))
        ));
    }

    #[test]
    fn a_bind_layers_as_its_sets_would() {
        let d = tempfile::tempdir().unwrap();
        let svc = service(d.path(), Some(vec![8 * GIB, 8 * GIB]));
        let set = |q: SetRequest| svc.answer(Request::Set(q)).unwrap();
        // What the container had: a weight everywhere and a compute share on device 0.
        set(SetRequest {
            container: "c".into(),
            weight: Some(4),
            ..Default::default()
        });
        set(SetRequest {
            container: "c".into(),
            device: Some(0),
            compute: Some(1000),
            ..Default::default()
        });
        let mut s = ContainerSettings {
            class: Some(Class::Production),
            ..Default::default()
        };
        s.all.compute = Some(5000);
        s.devices.insert(
            "0".into(),
            DeviceSettings {
                memory: Some(GIB),
                ..Default::default()
            },
        );
        let got = svc.answer(bind("c", &s)).unwrap().settings;
        assert_eq!(got.class, Some(Class::Production));
        assert_eq!(got.all.weight, Some(4), "kept");
        assert_eq!(got.all.compute, Some(5000));
        assert_eq!(
            got.device(0).compute,
            Some(5000),
            "a share for every device replaces device 0's"
        );
        assert_eq!(got.device(0).memory, Some(GIB));
    }
}
