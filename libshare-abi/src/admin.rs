//! The admin socket's protocol (`<state dir>/admin.sock`, root only): one JSON request per
//! connection in a [`crate::wire`] frame, one JSON answer. `sharectl set/get/reset` are its
//! clients, the daemon (`libshare_node::admin`) its server. A container's settings are the
//! daemon's word for it: they persist across daemon restarts and are written into the
//! container's state file (quota, class, compute share, weight) when it changes or appears.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The one rule for container names (see [`crate::names`]).
pub use crate::names::valid_container_name;

/// The job class (defined with the state file's layout).
pub use crate::Class;

/// The smallest memory quota `sharectl set` accepts (the daemon and `--offline` alike): below
/// it no CUDA context fits, so a smaller figure is a typo (`--memory 1` is one byte).
pub const MIN_QUOTA: u64 = 16 << 20;

/// A memory quota `sharectl set` accepts, or one line saying the floor
/// ([`RequestError::QuotaTooSmall`]).
pub fn check_quota(bytes: u64) -> Result<(), String> {
    if bytes < MIN_QUOTA {
        return Err(RequestError::QuotaTooSmall(bytes).to_string());
    }
    Ok(())
}

/// Why a request is refused as it stands, before anything is looked up: each one line, the
/// same from `sharectl` and from the daemon (both call [`Request::validate`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("\"{name}\" is not a container name ({rule})", name = crate::names::escape(.0), rule = crate::names::NAME_RULE)]
    BadName(String),
    #[error("nothing to set: give --memory, --compute, --weight, --class or --oversubscribe")]
    NothingToSet,
    #[error("device {0} does not exist: this node has {1} GPU(s)")]
    NoSuchDevice(u32, usize),
    #[error("device {0} does not exist (devices are 0..{max})", max = crate::MAX_DEVICES - 1)]
    DeviceOutOfRange(u32),
    #[error(
        "a memory quota below {floor} is refused ({0} bytes given): give at least --memory 16MiB",
        floor = crate::units::format_size(MIN_QUOTA)
    )]
    QuotaTooSmall(u64),
    #[error("a compute share is between 0% and 100%")]
    ComputeShare,
    #[error("device {0:?} is not a device index")]
    DeviceKey(String),
}

impl SetRequest {
    /// Whether this request can be applied as it stands: a container name, something to set,
    /// a device that exists (on a node of `gpus` GPUs, where that is known; always one of the
    /// state file's), a quota of at least [`MIN_QUOTA`], a compute share of at most 100 %.
    pub fn validate(&self, gpus: Option<usize>) -> Result<(), RequestError> {
        if !valid_container_name(&self.container) {
            return Err(RequestError::BadName(self.container.clone()));
        }
        if self.class.is_none()
            && self.memory.is_none()
            && self.compute.is_none()
            && self.weight.is_none()
            && self.oversubscribe.is_none()
        {
            return Err(RequestError::NothingToSet);
        }
        if let Some(d) = self.device {
            match gpus {
                Some(n) if d as usize >= n => return Err(RequestError::NoSuchDevice(d, n)),
                _ if d as usize >= crate::MAX_DEVICES => {
                    return Err(RequestError::DeviceOutOfRange(d))
                }
                _ => {}
            }
        }
        if let Some(m) = self.memory.filter(|&m| m < MIN_QUOTA) {
            return Err(RequestError::QuotaTooSmall(m));
        }
        if self.compute.is_some_and(|c| c > 10_000) {
            return Err(RequestError::ComputeShare);
        }
        Ok(())
    }
}

/// What the daemon sets on one device (or on every device: [`ContainerSettings::all`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceSettings {
    /// Memory quota, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<u64>,
    /// Compute share, basis points (0: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute: Option<u32>,
    /// Weight among the opportunistic containers of a device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
}

impl DeviceSettings {
    /// `self`, with what it leaves unset taken from `under`.
    pub fn over(self, under: DeviceSettings) -> DeviceSettings {
        DeviceSettings {
            memory: self.memory.or(under.memory),
            compute: self.compute.or(under.compute),
            weight: self.weight.or(under.weight),
        }
    }

    pub fn is_empty(&self) -> bool {
        *self == DeviceSettings::default()
    }
}

/// A container's settings: its class, what applies to every device, and per device (by index)
/// what differs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContainerSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<Class>,
    /// May oversubscribe device memory while opportunistic (`FLAG_OVERSUBSCRIBE`): its jobs'
    /// allocations become managed memory and its quota may exceed the device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oversubscribe: Option<bool>,
    #[serde(default, skip_serializing_if = "DeviceSettings::is_empty")]
    pub all: DeviceSettings,
    /// Keys are device indices ("0", "1", …: TOML keys are strings).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub devices: BTreeMap<String, DeviceSettings>,
}

impl ContainerSettings {
    /// What applies on device `d`.
    pub fn device(&self, d: usize) -> DeviceSettings {
        self.devices
            .get(&d.to_string())
            .copied()
            .unwrap_or_default()
            .over(self.all)
    }

    /// `self`, with what it leaves unset taken from `under` (the daemon's defaults).
    pub fn over(&self, under: &ContainerSettings) -> ContainerSettings {
        let mut devices = under.devices.clone();
        for (k, v) in &self.devices {
            let below = devices.get(k).copied().unwrap_or_default();
            devices.insert(k.clone(), v.over(below));
        }
        ContainerSettings {
            class: self.class.or(under.class),
            oversubscribe: self.oversubscribe.or(under.oversubscribe),
            all: self.all.over(under.all),
            devices,
        }
    }
}

impl ContainerSettings {
    /// The `set`s these settings stand for on `container`: the one for every device (class,
    /// oversubscription, [`ContainerSettings::all`]) first, then one per device; none for what
    /// is empty. Err: a device key that is not an index.
    pub fn requests(&self, container: &str) -> Result<Vec<SetRequest>, RequestError> {
        let one = |device: Option<u32>, d: &DeviceSettings| SetRequest {
            container: container.to_string(),
            device,
            class: None,
            memory: d.memory,
            compute: d.compute,
            weight: d.weight,
            oversubscribe: None,
        };
        let mut all = one(None, &self.all);
        all.class = self.class;
        all.oversubscribe = self.oversubscribe;
        let mut v: Vec<SetRequest> = Vec::new();
        if all != one(None, &DeviceSettings::default()) {
            v.push(all);
        }
        for (k, d) in &self.devices {
            let device: u32 = k.parse().map_err(|_| RequestError::DeviceKey(k.clone()))?;
            if !d.is_empty() {
                v.push(one(Some(device), d));
            }
        }
        Ok(v)
    }
}

/// `set`: the fields given change, the others stay.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetRequest {
    pub container: String,
    /// One device (default: every device).
    #[serde(default)]
    pub device: Option<u32>,
    #[serde(default)]
    pub class: Option<Class>,
    #[serde(default)]
    pub memory: Option<u64>,
    #[serde(default)]
    pub compute: Option<u32>,
    #[serde(default)]
    pub weight: Option<u32>,
    #[serde(default)]
    pub oversubscribe: Option<bool>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
pub enum Request {
    Set(SetRequest),
    Get {
        container: String,
    },
    Reset {
        container: String,
    },
    /// A Kubernetes bind (`sharectl hook` for a device plugin's allocation or a DRA claim): a
    /// container's settings in one request, layered over what it has as the `set`s they stand
    /// for would be ([`ContainerSettings::requests`]), all of them or none.
    Bind {
        container: String,
        settings: ContainerSettings,
    },
    /// The runtime's `createRuntime` hook (`sharectl hook`): the container whose runtime id is
    /// `container` has process `pid` (host pid namespace). The daemon reads that process's
    /// cgroup itself (pinned, as at a registration), checks that it names this container, and
    /// sets the driver's limits on that cgroup before the container's first process runs.
    Started {
        container: String,
        pid: u32,
    },
}

/// A container as the daemon sees it: its settings and what its state file holds now.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerReport {
    pub container: String,
    /// The daemon's settings for it (persisted).
    pub settings: ContainerSettings,
    /// Whether the container has a state file (it has started, or was set before it started).
    pub present: bool,
    /// Per device in use: quota and used bytes as the state file says.
    #[serde(default)]
    pub devices: Vec<DeviceReport>,
    #[serde(default)]
    pub class: Option<Class>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceReport {
    pub device: u32,
    pub quota: u64,
    pub used: u64,
    pub compute: u32,
    pub weight: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum Response {
    Ok {
        report: ContainerReport,
    },
    /// One line saying what is wrong and what to do.
    Error {
        message: String,
    },
}

impl Request {
    /// Whether this request can be answered as it stands ([`SetRequest::validate`]; `get` and
    /// `reset` name a container). `started` carries a runtime's id, not a name: the daemon
    /// checks it against the process's cgroup.
    pub fn validate(&self, gpus: Option<usize>) -> Result<(), RequestError> {
        match self {
            Request::Set(q) => q.validate(gpus),
            Request::Get { container } | Request::Reset { container } => {
                if valid_container_name(container) {
                    Ok(())
                } else {
                    Err(RequestError::BadName(container.clone()))
                }
            }
            // Every `set` the settings stand for, and at least one.
            Request::Bind {
                container,
                settings,
            } => {
                let reqs = settings.requests(container)?;
                if reqs.is_empty() {
                    return Err(RequestError::NothingToSet);
                }
                reqs.iter().try_for_each(|q| q.validate(gpus))
            }
            Request::Started { .. } => Ok(()),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a request serialises")
    }

    /// Any bytes: a request, or one line saying why not.
    pub fn decode(b: &[u8]) -> Result<Request, String> {
        serde_json::from_slice(b).map_err(|e| format!("malformed request: {e}"))
    }
}

impl Response {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a response serialises")
    }

    pub fn decode(b: &[u8]) -> Result<Response, String> {
        serde_json::from_slice(b).map_err(|e| format!("malformed answer from the daemon: {e}"))
    }

    pub fn error(message: impl Into<String>) -> Response {
        Response::Error {
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn requests_round_trip_and_device_settings_layer() {
        let r = Request::Set(SetRequest {
            container: "web".into(),
            device: Some(1),
            class: Some(Class::Production),
            memory: Some(8 << 30),
            compute: None,
            weight: Some(3),
            oversubscribe: Some(true),
        });
        assert_eq!(Request::decode(&r.encode()), Ok(r));
        assert!(Request::decode(br#"{"op":"set","container":"x","bogus":1}"#).is_err());
        let started = Request::Started {
            container: "4f3c2a1b0d9e".repeat(5),
            pid: 4242,
        };
        assert_eq!(Request::decode(&started.encode()), Ok(started));
        assert_eq!(
            Request::decode(br#"{"op":"started","container":"c","pid":7}"#),
            Ok(Request::Started {
                container: "c".into(),
                pid: 7
            })
        );
        assert!(Request::decode(br#"{"op":"started","container":"c","pid":-1}"#).is_err());
        assert!(Request::decode(br#"{"op":"set","container":"x","memory":-1}"#).is_err());
        let bind = Request::Bind {
            container: "c".into(),
            settings: ContainerSettings {
                class: Some(Class::Opportunistic),
                devices: [(
                    "2".to_string(),
                    DeviceSettings {
                        memory: Some(1 << 30),
                        ..Default::default()
                    },
                )]
                .into(),
                ..Default::default()
            },
        };
        assert_eq!(Request::decode(&bind.encode()), Ok(bind.clone()));
        let Request::Bind { settings, .. } = bind else {
            unreachable!()
        };
        let reqs = settings.requests("c").unwrap();
        assert_eq!(reqs.len(), 2);
        assert_eq!(
            (reqs[0].class, reqs[0].device),
            (Some(Class::Opportunistic), None)
        );
        assert_eq!((reqs[1].device, reqs[1].memory), (Some(2), Some(1 << 30)));
        assert!(ContainerSettings::default()
            .requests("c")
            .unwrap()
            .is_empty());
        let mut bad = ContainerSettings::default();
        bad.devices.insert("x".into(), DeviceSettings::default());
        assert!(bad.requests("c").is_err());
        let mut s = ContainerSettings::default();
        s.all.memory = Some(10);
        s.devices.insert(
            "1".into(),
            DeviceSettings {
                memory: Some(20),
                compute: Some(3000),
                weight: None,
            },
        );
        assert_eq!(s.device(0).memory, Some(10));
        assert_eq!(s.device(1).memory, Some(20));
        let mut d = ContainerSettings::default();
        d.all.weight = Some(2);
        d.class = Some(Class::Opportunistic);
        let e = s.over(&d);
        assert_eq!(e.device(1).weight, Some(2));
        assert_eq!(e.device(1).compute, Some(3000));
        assert_eq!(e.class, Some(Class::Opportunistic));
        assert!(check_quota(MIN_QUOTA).is_ok());
        for tiny in [0, 1, MIN_QUOTA - 1] {
            let e = check_quota(tiny).unwrap_err();
            assert!(e.contains("16 MiB") && !e.contains('\n'), "{e}");
        }
    }

    /// One refusal per fault, in the order the checks run, each one line.
    #[test]
    fn set_requests_are_validated_once() {
        let ok = SetRequest {
            container: "web".into(),
            memory: Some(MIN_QUOTA),
            ..Default::default()
        };
        assert_eq!(ok.validate(None), Ok(()));
        let with = |f: &dyn Fn(&mut SetRequest)| {
            let mut q = ok.clone();
            f(&mut q);
            q
        };
        let bad = with(&|q| q.container = "a b\x1b".into());
        let e = bad.validate(None).unwrap_err();
        assert_eq!(e, RequestError::BadName("a b\x1b".into()));
        assert!(e.to_string().contains(crate::names::NAME_RULE), "{e}");
        assert!(!e.to_string().chars().any(|c| c.is_control()), "{e:?}");
        let nothing = with(&|q| q.memory = None);
        assert_eq!(nothing.validate(None), Err(RequestError::NothingToSet));
        for f in [
            |q: &mut SetRequest| q.class = Some(Class::Production),
            |q: &mut SetRequest| q.compute = Some(0),
            |q: &mut SetRequest| q.weight = Some(1),
            |q: &mut SetRequest| q.oversubscribe = Some(false),
        ] {
            let mut q = nothing.clone();
            f(&mut q);
            assert_eq!(q.validate(None), Ok(()), "{q:?}");
        }
        let last = crate::MAX_DEVICES as u32 - 1;
        assert_eq!(with(&|q| q.device = Some(last)).validate(None), Ok(()));
        let far = with(&|q| q.device = Some(last + 1));
        assert_eq!(
            far.validate(None),
            Err(RequestError::DeviceOutOfRange(last + 1))
        );
        assert_eq!(
            far.validate(Some(2)),
            Err(RequestError::NoSuchDevice(last + 1, 2))
        );
        let two = with(&|q| q.device = Some(2));
        assert_eq!(two.validate(Some(2)), Err(RequestError::NoSuchDevice(2, 2)));
        assert_eq!(two.validate(Some(3)), Ok(()));
        let tiny = with(&|q| q.memory = Some(MIN_QUOTA - 1));
        assert_eq!(
            tiny.validate(None),
            Err(RequestError::QuotaTooSmall(MIN_QUOTA - 1))
        );
        assert_eq!(
            check_quota(MIN_QUOTA - 1),
            Err(tiny.validate(None).unwrap_err().to_string())
        );
        let full = with(&|q| q.compute = Some(10_000));
        assert_eq!(full.validate(None), Ok(()));
        let over = with(&|q| q.compute = Some(10_001));
        assert_eq!(over.validate(None), Err(RequestError::ComputeShare));
        for e in [
            RequestError::NothingToSet,
            RequestError::NoSuchDevice(2, 2),
            RequestError::DeviceOutOfRange(99),
            RequestError::QuotaTooSmall(1),
            RequestError::ComputeShare,
        ] {
            assert!(!e.to_string().contains('\n'), "{e}");
        }
        // get and reset name a container; started carries a runtime's id.
        let get = Request::Get {
            container: "x/y".into(),
        };
        assert_eq!(get.validate(None), Err(RequestError::BadName("x/y".into())));
        let reset = Request::Reset {
            container: "web".into(),
        };
        assert_eq!(reset.validate(None), Ok(()));
        let started = Request::Started {
            container: "a".repeat(64),
            pid: 1,
        };
        assert_eq!(started.validate(None), Ok(()));
        assert_eq!(
            Request::Set(tiny).validate(None),
            Err(RequestError::QuotaTooSmall(MIN_QUOTA - 1))
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn any_bytes_decode_to_a_request_or_an_error(b in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = Request::decode(&b);
            let _ = Response::decode(&b);
        }

        #[test]
        fn set_requests_round_trip(container in "[a-z0-9._-]{1,40}", device in proptest::option::of(0u32..16),
                                   memory in proptest::option::of(any::<u64>()), compute in proptest::option::of(0u32..=10_000),
                                   weight in proptest::option::of(any::<u32>())) {
            let r = Request::Set(SetRequest { container, device, class: None, memory, compute, weight, oversubscribe: None });
            prop_assert_eq!(Request::decode(&r.encode()), Ok(r));
        }
    }
}
