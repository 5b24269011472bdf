//! The daemon's settings per container (class; memory quota, compute share and weight, on every
//! device or one), persisted in a TOML file and written into each container's state file.
//!
//! - Persistence: the whole file is rewritten on every change by the one checked atomic writer
//!   ([`libshare_abi::write_atomic`]: a temporary file in the same directory, `fsync`, `rename`,
//!   `fsync` of the directory), so a crash leaves the old or the new settings, never half of
//!   them. A file that does not parse stops the daemon
//!   with one line rather than dropping quotas.
//! - Defaults (`--config`, `[defaults]`): what a container without its own value gets.
//! - What a container's effective settings write into its state (the quota per device, the
//!   class with `FLAG_DAEMON_MANAGED`, so its jobs' environment no longer sets it — an
//!   environment limit stays a ceiling, see the shim — compute share and weight) is
//!   [`crate::authority::Words`], the one writer: the admin socket, registration, the
//!   registry's rescans and `sharectl set --offline` all go through it.

use libshare_abi::admin::ContainerSettings;
use libshare_abi::MAX_DEVICES;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("cannot read {}: {err} (fix or remove it; the daemon will not start without its settings)", path.display())]
    Read { path: PathBuf, err: String },
    #[error("cannot save the settings to {}: {err} (is the directory writable?)", path.display())]
    Write { path: PathBuf, err: String },
    #[error("refusing to read {}: {why} (the daemon will not start until it is fixed)", path.display())]
    Unsafe { path: PathBuf, why: String },
}

/// Reads an operator's file (settings, `--config`) with the checks state files get
/// ([`libshare_abi::open_operator_file`]); None if it does not exist.
fn read_checked(path: &Path) -> Result<Option<String>, SettingsError> {
    use libshare_abi::StateError as E;
    let file = libshare_abi::open_operator_file(path).map_err(|e| {
        let why = match &e {
            E::Symlink { path: p } => format!(
                "{} is a symbolic link: put the file itself there (owned by root, mode 0600)",
                p.display()
            ),
            E::ForeignOwner { path: p, owner, uid } => format!(
                "{} belongs to uid {owner}: only root or the daemon's user (uid {uid}) may own it: chown root {}",
                p.display(),
                p.display()
            ),
            E::OpenToOthers { path: p, mode } => format!(
                "{} is writable by group or others (mode {mode:o}): chmod go-w {}",
                p.display(),
                p.display()
            ),
            E::WrongType {
                path: p,
                kind,
                expected,
            } => format!("{} is a {kind}, not a {expected}: replace it", p.display()),
            E::Io { op, path: p, err } => format!("cannot {op} {}: {err}", p.display()),
            e => e.to_string(),
        };
        SettingsError::Unsafe {
            path: path.into(),
            why,
        }
    })?;
    let Some(mut file) = file else {
        return Ok(None);
    };
    let mut text = String::new();
    std::io::Read::read_to_string(&mut file, &mut text).map_err(|e| SettingsError::Read {
        path: path.into(),
        err: e.to_string(),
    })?;
    Ok(Some(text))
}

#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    containers: BTreeMap<String, ContainerSettings>,
}

/// The daemon's configuration file (`--config`): defaults for every container.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub defaults: ContainerSettings,
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, SettingsError> {
        let text = read_checked(path)?.ok_or_else(|| SettingsError::Read {
            path: path.into(),
            err: "no such file".into(),
        })?;
        toml::from_str(&text).map_err(|e| SettingsError::Read {
            path: path.into(),
            err: one_line(&e.to_string()),
        })
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The settings of every container the admin named, and where they persist.
#[derive(Debug)]
pub struct Settings {
    path: PathBuf,
    file: File,
    defaults: ContainerSettings,
    /// Bumped by every change (the control loop re-reads its words when it moves).
    generation: u64,
}

impl Settings {
    /// Loads `path` (missing: no settings yet), refusing a file others could have written (see
    /// [`libshare_abi::open_operator_file`]).
    pub fn load(path: PathBuf, defaults: ContainerSettings) -> Result<Settings, SettingsError> {
        let file = match read_checked(&path)? {
            Some(text) => toml::from_str(&text).map_err(|e| SettingsError::Read {
                path: path.clone(),
                err: one_line(&e.to_string()),
            })?,
            None => File::default(),
        };
        Ok(Settings {
            path,
            file,
            defaults,
            generation: 0,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Changes with every [`Settings::put`].
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The admin's own settings for `name`, if any.
    pub fn get(&self, name: &str) -> Option<&ContainerSettings> {
        self.file.containers.get(name)
    }

    /// What applies to `name`: its settings over the defaults.
    pub fn effective(&self, name: &str) -> ContainerSettings {
        self.get(name)
            .cloned()
            .unwrap_or_default()
            .over(&self.defaults)
    }

    /// Replaces `name`'s settings (None: forgets them) and saves the file; on a failed save
    /// nothing changes.
    pub fn put(&mut self, name: &str, s: Option<ContainerSettings>) -> Result<(), SettingsError> {
        let mut next = self.file.clone();
        match s {
            Some(s) => next.containers.insert(name.to_string(), s),
            None => next.containers.remove(name),
        };
        save(&self.path, &next)?;
        self.file = next;
        self.generation += 1;
        Ok(())
    }
}

/// How many devices settings are written to: the node's (NVML's count), or every slot of the
/// state file when NVML is unavailable.
pub fn node_devices(totals: Option<&[u64]>) -> usize {
    totals.map_or(MAX_DEVICES, |t| t.len().min(MAX_DEVICES))
}

/// Replaces `path` with `f`'s TOML through the one checked writer
/// ([`libshare_abi::write_atomic`]: its directory checked as the file's reader checks it).
fn save(path: &Path, f: &File) -> Result<(), SettingsError> {
    let err = |err: String| SettingsError::Write {
        path: path.into(),
        err,
    };
    let text = toml::to_string(f).map_err(|e| err(e.to_string()))?;
    let mut bytes = b"# libshare daemon settings: written by `sharectl set`/`reset`; edit with the daemon stopped\n".to_vec();
    bytes.extend_from_slice(text.as_bytes());
    libshare_abi::write_atomic(path, &bytes, 0o600).map_err(|e| match e {
        // The file is named already: the system's reason alone.
        libshare_abi::StateError::Io { err: why, .. } => err(why),
        e => err(e.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authority::Words;
    use libshare_abi::admin::DeviceSettings;
    use libshare_abi::Class;
    use libshare_abi::{State, FLAG_DAEMON_MANAGED};
    use std::sync::atomic::Ordering::Acquire;

    #[test]
    fn settings_persist_layer_over_defaults_and_are_written_into_the_state() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("settings.toml");
        let defaults = ContainerSettings {
            class: Some(Class::Opportunistic),
            ..Default::default()
        };
        let mut s = Settings::load(path.clone(), defaults.clone()).unwrap();
        let mut web = ContainerSettings {
            class: Some(Class::Production),
            ..Default::default()
        };
        web.all.memory = Some(8 << 30);
        web.devices.insert(
            "1".into(),
            DeviceSettings {
                memory: Some(4 << 30),
                ..Default::default()
            },
        );
        s.put("web", Some(web.clone())).unwrap();
        let again = Settings::load(path.clone(), defaults).unwrap();
        assert_eq!(again.get("web"), Some(&web));
        assert_eq!(again.effective("batch").class, Some(Class::Opportunistic));

        let st = State::open_or_create(&tmp.path().join("c/web")).unwrap();
        Words::of(&again.effective("web"), MAX_DEVICES, true).assert(&st);
        assert_eq!(st.device(0).quota.load(Acquire), 8 << 30);
        assert_eq!(st.device(1).quota.load(Acquire), 4 << 30);
        assert_eq!(st.header().class(), Class::Production);
        assert_ne!(st.header().flags.load(Acquire) & FLAG_DAEMON_MANAGED, 0);

        // A corrupt file is an error, not an empty set of settings.
        std::fs::write(&path, "containers = 3").unwrap();
        let e = Settings::load(path, ContainerSettings::default()).unwrap_err();
        assert!(e.to_string().contains("will not start"), "{e}");
    }

    #[test]
    fn settings_are_written_to_the_node_devices_only() {
        let tmp = tempfile::tempdir().unwrap();
        let mut s = Settings::load(tmp.path().join("settings.toml"), Default::default()).unwrap();
        let mut c = ContainerSettings::default();
        c.all.memory = Some(256 << 20);
        c.all.weight = Some(2);
        s.put("c", Some(c)).unwrap();
        let st = State::open_or_create(&tmp.path().join("c")).unwrap();
        Words::of(&s.effective("c"), node_devices(Some(&[8 << 30])), true).assert(&st);
        assert_eq!(st.device(0).quota.load(Acquire), 256 << 20);
        assert_eq!(st.device(0).weight.load(Acquire), 2);
        for d in 1..MAX_DEVICES {
            assert_eq!(st.device(d).quota.load(Acquire), 0, "device {d}");
            assert_eq!(st.device(d).weight.load(Acquire), 0, "device {d}");
        }
        assert_eq!(node_devices(None), MAX_DEVICES, "no NVML: every slot");
        assert_eq!(node_devices(Some(&[1; 40])), MAX_DEVICES);
    }

    /// The settings and `--config` files get the state files' checks: a symlink, a file others
    /// can write or a foreign owner stop the daemon with one line naming the file and the fix.
    #[test]
    fn unsafe_settings_files_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let good = tmp.path().join("good.toml");
        std::fs::write(&good, "[defaults]\nclass = \"opportunistic\"\n").unwrap();
        std::fs::set_permissions(&good, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            Config::load(&good).unwrap().defaults.class,
            Some(Class::Opportunistic)
        );
        let settings = tmp.path().join("settings.toml");
        std::fs::write(&settings, "[containers.web.all]\nmemory = 1073741824\n").unwrap();
        std::fs::set_permissions(&settings, std::fs::Permissions::from_mode(0o600)).unwrap();
        let s = Settings::load(settings.clone(), Default::default()).unwrap();
        assert_eq!(s.get("web").unwrap().all.memory, Some(1 << 30));
        assert!(
            Settings::load(tmp.path().join("missing.toml"), Default::default())
                .unwrap()
                .get("web")
                .is_none()
        );

        let check = |e: SettingsError, path: &Path, fix: &str| {
            let m = e.to_string();
            assert!(matches!(e, SettingsError::Unsafe { .. }), "{m}");
            assert!(m.contains(&path.display().to_string()), "{m}");
            assert!(m.contains(fix), "{m}");
            assert!(!m.contains('\n'), "one line: {m}");
        };
        // A symlink to a good file.
        let link = tmp.path().join("link.toml");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        check(Config::load(&link).unwrap_err(), &link, "symbolic link");
        check(
            Settings::load(link.clone(), Default::default()).unwrap_err(),
            &link,
            "symbolic link",
        );
        // World- and group-writable.
        for mode in [0o666, 0o620] {
            std::fs::set_permissions(&settings, std::fs::Permissions::from_mode(mode)).unwrap();
            check(
                Settings::load(settings.clone(), Default::default()).unwrap_err(),
                &settings,
                "chmod go-w",
            );
            std::fs::set_permissions(&good, std::fs::Permissions::from_mode(mode)).unwrap();
            check(Config::load(&good).unwrap_err(), &good, "chmod go-w");
        }
        // In a directory others can write (not root's sticky /tmp): the file could be replaced.
        let open_dir = tmp.path().join("open");
        std::fs::create_dir(&open_dir).unwrap();
        let inner = open_dir.join("settings.toml");
        std::fs::write(&inner, "").unwrap();
        std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::set_permissions(&open_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        check(
            Settings::load(inner, Default::default()).unwrap_err(),
            &open_dir,
            "chmod go-w",
        );
        // Nor is a new one saved there (the writer checks the directory as the reader does).
        let mut fresh = Settings::load(open_dir.join("new.toml"), Default::default()).unwrap();
        let e = fresh.put("web", Some(Default::default())).unwrap_err();
        assert!(matches!(e, SettingsError::Write { .. }), "{e}");
        assert!(e.to_string().contains("chmod go-w"), "{e}");
        assert!(!open_dir.join("new.toml").exists());
        assert!(fresh.get("web").is_none(), "a failed save changes nothing");
        // Owned by another user (only root can make one: skipped otherwise).
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            let theirs = tmp.path().join("theirs.toml");
            std::fs::write(&theirs, "").unwrap();
            std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o600)).unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), None).unwrap();
            check(Config::load(&theirs).unwrap_err(), &theirs, "uid 65534");
        }
    }
}
