//! The containers the daemon steers: every `<state dir>/containers/<name>/state.shm` (the
//! layout the shim uses, `libshare_abi::container_dir`), mapped read-write with
//! `State::open_existing` (the same checks as the shim's: owner, mode, no symlink, valid
//! header). [`Registry::rescan`] runs at start and every 100 ms: a new file is opened, a
//! file whose inode changed is reopened (a new container id), a container whose file
//! disappeared is dropped. A file that cannot be opened (being created, corrupt, foreign) is
//! retried at each rescan and logged once when the same error persists.
//!
//! Each container carries the daemon's [`Words`] (its class and per-device quota, share and
//! weight, from [`Authority`]): written into the state when the container is found, re-asserted
//! at every rescan where a job of the container overwrote them (logged, counted), and what the
//! control loop reads instead of the file's words.

use crate::authority::{Authority, Words};
use crate::error::NodeError;
use crate::policy::ContainerId;
use libshare_abi::slots::SlotTable;
use libshare_abi::{State, STATE_FILE};
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// One registered container.
pub struct Container {
    pub id: ContainerId,
    pub name: String,
    pub state: State,
    /// The daemon's words on this container ([`Words::FILE`] without an authority).
    pub words: Words,
    /// (device, inode) of the file opened.
    key: (u64, u64),
}

/// The containers of one state directory.
pub struct Registry {
    dir: PathBuf,
    authority: Option<Authority>,
    /// The settings' generation the containers' words were read at.
    generation: u64,
    containers: Vec<Container>,
    next_id: ContainerId,
    /// The last open error per name (logged when it repeats).
    failing: HashMap<String, String>,
}

/// What a rescan changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanReport {
    /// Slots of dead processes released (their memory back in the quota).
    pub reclaimed: usize,
    pub added: usize,
    pub dropped: usize,
    pub failed: usize,
    /// Containers whose words a job had overwritten (restored).
    pub restored: usize,
    /// Idle containers forgotten ([`crate::book`]).
    pub forgotten: usize,
}

impl Registry {
    pub fn new(state_dir: &Path) -> Self {
        Registry {
            dir: state_dir.to_path_buf(),
            authority: None,
            generation: 0,
            containers: Vec::new(),
            next_id: 1,
            failing: HashMap::new(),
        }
    }

    /// Seeds each container found from now on with the daemon's words, and keeps them.
    pub fn with_authority(mut self, authority: Option<Authority>) -> Self {
        self.authority = authority;
        self
    }

    /// Re-reads every container's words if the settings changed since (an admin's `set` or
    /// `reset`, which also wrote them into the state). One uncontended lock: called every tick.
    pub fn refresh_words(&mut self) {
        let Some(a) = &self.authority else { return };
        let g = a.generation();
        if g != self.generation {
            self.generation = g;
            for c in &mut self.containers {
                c.words = a.words(&c.name);
            }
        }
    }

    /// Writes the daemon's words back where a job changed them; how many containers had to be.
    fn reassert(&mut self) -> usize {
        let Some(a) = &self.authority else { return 0 };
        self.generation = a.generation();
        let mut n = 0;
        for c in &mut self.containers {
            c.words = a.words(&c.name);
            let r = c.words.assert(&c.state);
            if r.any() {
                n += 1;
                a.restores.count(&c.name);
                tracing::warn!(
                    container = %c.name,
                    restored = %r.names(),
                    "a job of the container overwrote the daemon's words in its state; restored"
                );
            }
        }
        n
    }

    pub fn state_dir(&self) -> &Path {
        &self.dir
    }

    /// The registered containers, in id order.
    pub fn containers(&self) -> &[Container] {
        &self.containers
    }

    /// Brings the set of containers in line with the directory. A missing state directory (or
    /// `containers/` under it) means no containers yet; any other error reading it is returned.
    /// With a [`crate::book::Book`] (through the authority), a container with no live process,
    /// nothing held and no settings of its own is forgotten once its grace has passed: its
    /// directory is removed and it is dropped. The cost is one directory entry and one look at
    /// each container that exists, and containers exist only while they run or have settings.
    pub fn rescan(&mut self) -> Result<ScanReport, NodeError> {
        let root = self.dir.join("containers");
        let mut found: HashMap<String, (PathBuf, (u64, u64))> = HashMap::new();
        match std::fs::read_dir(&root) {
            Ok(rd) => {
                for ent in rd.flatten() {
                    let Ok(name) = ent.file_name().into_string() else {
                        continue;
                    };
                    let path = ent.path().join(STATE_FILE);
                    if let Ok(m) = std::fs::symlink_metadata(&path) {
                        found.insert(name, (path, (m.dev(), m.ino())));
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => return Err(NodeError::StateDir { path: root, err }),
        }
        self.failing.retain(|n, _| found.contains_key(n));
        let mut rep = ScanReport::default();
        let before = self.containers.len();
        self.containers.retain(|c| {
            let keep = found.get(&c.name).is_some_and(|(_, k)| *k == c.key);
            if !keep {
                tracing::info!(container = %c.name, id = c.id, "container dropped (its state file is gone or replaced)");
            }
            keep
        });
        rep.dropped = before - self.containers.len();
        rep.restored = self.reassert();
        let have: std::collections::HashSet<String> =
            self.containers.iter().map(|c| c.name.clone()).collect();
        let mut new: Vec<(String, PathBuf, (u64, u64))> = found
            .into_iter()
            .filter(|(n, _)| !have.contains(n))
            .map(|(n, (p, k))| (n, p, k))
            .collect();
        new.sort();
        for (name, path, key) in new {
            match State::open_existing(&path) {
                Ok(state) => {
                    let id = self.next_id;
                    self.next_id += 1;
                    tracing::info!(container = %name, id, "container registered");
                    let words = match &self.authority {
                        Some(a) => a.seed(&name, &state),
                        None => Words::FILE,
                    };
                    self.failing.remove(&name);
                    self.containers.push(Container {
                        id,
                        name,
                        state,
                        words,
                        key,
                    });
                    rep.added += 1;
                }
                Err(e) => {
                    let msg = e.to_string();
                    // A file being created fails once; one that keeps failing is worth a line.
                    if self.failing.get(&name) == Some(&msg) {
                        tracing::warn!(container = %name, "cannot steer this container: {msg}");
                        self.failing.insert(name, String::new());
                    } else if self.failing.get(&name).is_none_or(|m| !m.is_empty()) {
                        self.failing.insert(name, msg);
                    }
                    rep.failed += 1;
                }
            }
        }
        self.containers.sort_by_key(|c| c.id);
        // A process gone without its exit handler (`kill -9`, a crash) holds no slot lock: its
        // memory goes back to its container's quota here, whether or not another process of
        // the container ever starts.
        for c in &self.containers {
            let n = c.state.reclaim_dead();
            if n > 0 {
                tracing::info!(container = %c.name, processes = n, "memory of dead processes returned to the quota");
                rep.reclaimed += n;
            }
        }
        rep.forgotten = self.forget_idle();
        Ok(rep)
    }

    /// Forgets the containers nothing runs in, nothing is held by and no setting names, once
    /// the book's grace has passed; how many.
    fn forget_idle(&mut self) -> usize {
        let Some(a) = &self.authority else { return 0 };
        let Some(book) = a.book() else { return 0 };
        let mut gone = Vec::new();
        for c in &self.containers {
            if !idle(&c.state) || a.has_settings(&c.name) {
                continue;
            }
            let dir = libshare_abi::container_dir(&self.dir, &c.name);
            if book.forget_if(&c.name, || remove_state(&dir, c.key)) {
                tracing::info!(container = %c.name, id = c.id, "container forgotten (no process, nothing held, no settings)");
                gone.push(c.id);
            }
        }
        self.containers.retain(|c| !gone.contains(&c.id));
        gone.len()
    }
}

/// No process holds a slot and nothing is charged on any device.
fn idle(st: &State) -> bool {
    use libshare_abi::MAX_DEVICES;
    use std::sync::atomic::Ordering::Acquire;
    (0..st.slots_in_use()).all(|i| st.slot(i).pid.load(Acquire) == 0)
        && (0..MAX_DEVICES).all(|d| st.device(d).used.load(Acquire) == 0)
}

/// Removes a container's directory if its state file is still the one opened (`key`): the
/// file, its second name and the directory. Whether the state is gone.
fn remove_state(dir: &Path, key: (u64, u64)) -> bool {
    let path = dir.join(STATE_FILE);
    let same = std::fs::symlink_metadata(&path).is_ok_and(|m| (m.dev(), m.ino()) == key);
    if !same {
        return false;
    }
    let _ = std::fs::remove_file(dir.join(libshare_abi::KEEP_FILE));
    if std::fs::remove_file(&path).is_err() {
        return false;
    }
    let _ = std::fs::remove_dir(dir);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use libshare_abi::container_dir;

    fn ids(r: &Registry) -> Vec<(String, ContainerId)> {
        r.containers()
            .iter()
            .map(|c| (c.name.clone(), c.id))
            .collect()
    }

    fn remove(dir: &Path, name: &str) {
        let d = container_dir(dir, name);
        std::fs::remove_file(d.join(STATE_FILE)).unwrap();
        std::fs::remove_file(d.join(libshare_abi::KEEP_FILE)).unwrap();
    }

    #[test]
    fn containers_come_and_go_with_their_files() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let mut r = Registry::new(dir);
        assert_eq!(
            r.rescan().unwrap(),
            ScanReport::default(),
            "no containers/ yet"
        );
        let a = State::open_or_create(&container_dir(dir, "a")).unwrap();
        let _b = State::open_or_create(&container_dir(dir, "b")).unwrap();
        let rep = r.rescan().unwrap();
        assert_eq!(rep.added, 2);
        let first = ids(&r);
        assert_eq!(first.len(), 2);
        assert_eq!(
            r.rescan().unwrap(),
            ScanReport::default(),
            "nothing changed"
        );
        assert_eq!(ids(&r), first);

        // The daemon's mapping is the container's: a write through one shows in the other.
        a.device(3)
            .launches
            .store(7, std::sync::atomic::Ordering::Release);
        let mine = r.containers().iter().find(|c| c.name == "a").unwrap();
        assert_eq!(
            mine.state
                .device(3)
                .launches
                .load(std::sync::atomic::Ordering::Acquire),
            7
        );

        remove(dir, "b");
        assert_eq!(r.rescan().unwrap().dropped, 1);
        assert_eq!(ids(&r), first[..1].to_vec());

        // A replaced file is a new container (new id); a file that is not a state is skipped.
        remove(dir, "a");
        let _a2 = State::open_or_create(&container_dir(dir, "a")).unwrap();
        std::fs::create_dir_all(container_dir(dir, "junk")).unwrap();
        std::fs::write(container_dir(dir, "junk").join(STATE_FILE), b"x").unwrap();
        let rep = r.rescan().unwrap();
        assert_eq!((rep.added, rep.dropped, rep.failed), (1, 1, 1));
        let now = ids(&r);
        assert_eq!(now.len(), 1);
        assert_eq!(now[0].0, "a");
        assert!(now[0].1 > first[1].1, "a new id");
    }
}
