//! The OCI runtime's words, typed with `oci-spec` (youki's): the container's state a hook gets
//! on stdin ([`State`], from `oci_spec::runtime::State`) and what sharectl reads of a bundle's
//! `config.json` ([`Config`], from `oci_spec::runtime`'s `Root` and `User`).
//!
//! `config.json` is read through the parts used, not a whole `oci_spec::runtime::Spec`: the
//! spec's enums (capabilities, namespaces, seccomp actions) refuse a value newer than the crate
//! that runc accepts, and a hook must not stop such a container. Where `config.json` is edited
//! (`sharectl runtime`), it stays a `serde_json::Value`, so that fields unknown here survive.

use anyhow::{anyhow, bail, Context, Result};
use oci_spec::runtime::{ContainerState, Root, User};
use serde::Deserialize;
use serde_json::Value;
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The most a hook reads of its state on stdin (a config: 16 times as much).
pub const MAX_INPUT: u64 = 1 << 20;

/// The fields of the OCI state a hook uses.
#[derive(Debug)]
pub struct State {
    pub id: String,
    pub stopped: bool,
    /// None once the container stopped (poststop).
    pub pid: Option<i32>,
    pub bundle: PathBuf,
}

/// The container's state (the runtime's JSON on a hook's stdin), checked: an id that names a
/// file safely, an absolute bundle. A state without `status` is not stopped.
pub fn parse_state(text: &str) -> Result<State> {
    const WANT: &str =
        "expected the runtime's state JSON {\"id\", \"pid\", \"bundle\", …} on stdin";
    let v: Value = serde_json::from_str(text)
        .map_err(|e| anyhow!("the container state on stdin is not JSON ({e}): {WANT}"))?;
    // oci-spec's state says "stopped" for a missing status; the runtimes' hooks say "creating".
    let has_status = v.get("status").is_some();
    let st: oci_spec::runtime::State = serde_json::from_value(v)
        .map_err(|e| anyhow!("the container state on stdin is not an OCI state ({e}): {WANT}"))?;
    let id = st.id();
    if id.is_empty()
        || id.len() > 1024
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
    {
        bail!("the container state's \"id\" is missing or not a container id: {WANT}");
    }
    let bundle = st.bundle();
    if !bundle.is_absolute() {
        bail!("the container state has no absolute \"bundle\": {WANT}");
    }
    Ok(State {
        id: id.clone(),
        stopped: has_status && *st.status() == ContainerState::Stopped,
        pid: st.pid().filter(|&p| p > 0),
        bundle: bundle.clone(),
    })
}

/// What sharectl reads of a bundle's `config.json`.
#[derive(Debug, Default, Deserialize)]
pub struct Config {
    #[serde(default)]
    pub root: Option<Root>,
    #[serde(default)]
    pub process: Option<Process>,
    #[serde(default)]
    pub annotations: Option<HashMap<String, String>>,
}

/// What sharectl reads of the config's process.
#[derive(Debug, Default, Deserialize)]
pub struct Process {
    #[serde(default)]
    pub user: Option<User>,
    #[serde(default)]
    pub env: Option<Vec<String>>,
}

impl Config {
    /// The container's annotation `key`.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.as_ref()?.get(key).map(String::as_str)
    }

    /// The container's annotations (none: empty).
    pub fn annotations(&self) -> HashMap<String, String> {
        self.annotations.clone().unwrap_or_default()
    }

    /// The container's environment, `NAME=value` each.
    pub fn env(&self) -> &[String] {
        self.process
            .as_ref()
            .and_then(|p| p.env.as_deref())
            .unwrap_or_default()
    }

    /// The uid the container's process runs as (root when the config names none).
    pub fn uid(&self) -> u32 {
        self.process
            .as_ref()
            .and_then(|p| p.user.as_ref())
            .map_or(0, |u| u.uid())
    }

    /// The parts read of a config already parsed (`sharectl runtime` edits the JSON itself).
    pub fn of(value: &Value, bundle: &Path) -> Result<Config> {
        let not =
            |why: String| anyhow!("{}/config.json is not an OCI config{why}", bundle.display());
        if !value.is_object() {
            return Err(not(String::new()));
        }
        Config::deserialize(value).map_err(|e| not(format!(" ({e})")))
    }
}

/// `<bundle>/config.json`, as JSON (every field, for an edit that keeps what it does not know).
pub fn read_config_json(bundle: &Path) -> Result<Value> {
    let path = bundle.join("config.json");
    let f = std::fs::File::open(&path)
        .with_context(|| format!("cannot open the bundle's {}", path.display()))?;
    let mut text = String::new();
    f.take(16 * MAX_INPUT)
        .read_to_string(&mut text)
        .with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text)
        .map_err(|e| anyhow!("{} is not an OCI config ({e})", path.display()))
}

/// `<bundle>/config.json`, the parts sharectl reads.
pub fn read_config(bundle: &Path) -> Result<Config> {
    Config::of(&read_config_json(bundle)?, bundle)
}

/// The fields of the bundle's `config.json` the hook uses.
#[derive(Debug)]
pub struct Bundle {
    /// The root filesystem, `<bundle>/<root.path>`, a directory.
    pub root: PathBuf,
    pub uid: u32,
    pub annotations: HashMap<String, String>,
}

/// The bundle at `bundle`: its config read and its root filesystem there.
pub fn parse_bundle(bundle: &Path) -> Result<Bundle> {
    let cfg = read_config(bundle)?;
    let root = cfg
        .root
        .as_ref()
        .map(|r| r.path())
        .filter(|p| !p.as_os_str().is_empty())
        .ok_or_else(|| {
            anyhow!(
                "{}/config.json has no root.path: not an OCI bundle",
                bundle.display()
            )
        })?;
    let root = bundle.join(root);
    if !root.is_dir() {
        bail!(
            "the container's root filesystem {} is not a directory",
            root.display()
        );
    }
    Ok(Bundle {
        root,
        uid: cfg.uid(),
        annotations: cfg.annotations(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn state_json_is_checked() {
        let ok =
            parse_state(r#"{"ociVersion":"1.0.2","id":"abc-1","pid":42,"bundle":"/b"}"#).unwrap();
        assert_eq!(
            (ok.id.as_str(), ok.pid, ok.stopped),
            ("abc-1", Some(42), false)
        );
        let stopped = parse_state(r#"{"id":"abc-1","status":"stopped","bundle":"/b"}"#).unwrap();
        assert!(stopped.stopped && stopped.pid.is_none());
        for bad in [
            "",
            "{",
            "[]",
            r#"{"id":"../x","pid":3,"bundle":"/b"}"#,
            r#"{"id":"x","pid":3,"bundle":"rel"}"#,
            r#"{"id":"x","pid":3}"#,
            r#"{"id":7,"pid":3,"bundle":"/b"}"#,
        ] {
            let e = parse_state(bad).unwrap_err().to_string();
            assert!(!e.contains('\n') && e.contains("expected"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_config_is_read_through_the_parts_used() {
        let b = Path::new("/b");
        let c = Config::of(
            &json!({"root": {"path": "rootfs"}, "process": {"user": {"uid": 7},
                    "env": ["A=1"], "capabilities": {"bounding": ["CAP_NEWER_THAN_OCI_SPEC"]}},
                    "linux": {"namespaces": [{"type": "newer"}]},
                    "annotations": {"libshare.dev/gpu": "all"}}),
            b,
        )
        .unwrap();
        assert_eq!(c.uid(), 7);
        assert_eq!(c.env(), ["A=1"]);
        assert_eq!(c.annotation("libshare.dev/gpu"), Some("all"));
        assert_eq!(c.root.unwrap().path(), Path::new("rootfs"));
        let empty = Config::of(&json!({}), b).unwrap();
        assert_eq!((empty.uid(), empty.env().len()), (0, 0));
        for bad in [
            json!([]),
            json!({"root": 7}),
            json!({"annotations": {"a": 1}}),
        ] {
            let e = Config::of(&bad, b).unwrap_err().to_string();
            assert!(e.contains("not an OCI config"), "{e}");
        }
    }
}
