//! Which containers registrations created, who made them, and when each last registered: what
//! bounds the state any local user can make the daemon keep.
//!
//! - **Limits on new containers.** A registration that would create a container (no state file
//!   for its name yet) is counted against the cgroup it comes from (for a container a cgroup
//!   names, the cgroup that cgroup was made in: `/machine.slice`, a pod's cgroup, the operator's
//!   prefix; for a name a process claims under `--trust-env`, the process's own cgroup) and,
//!   for a claimed name, against the process's uid (root's are not). Past
//!   [`Limits::per_cgroup`] or [`Limits::per_uid`] containers that still exist, it is refused
//!   with one line. A container the operator set up (`sharectl set`, the device plugin's hook)
//!   is the operator's and counts nowhere.
//! - **Forgetting.** A container with no live process, nothing held and no settings of its own
//!   is forgotten [`Limits::forget_after`] after its last registration (or the daemon's start):
//!   its state directory is removed and unmapped ([`crate::registry`]), and it stops counting.
//!   A process registering again gets a new state, seeded from the settings as the first did.
//!   The grace covers a process between its registration and its first slot (the shim claims
//!   one at once); one that waits longer holds a state the daemon no longer steers, which gains
//!   it nothing a process that never loaded the shim does not have.
//!
//! Registrations and forgetting decide under one lock, so a container is never forgotten
//! between the check that it exists and its registration.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The bounds (`sharectl daemon --max-containers-per-uid`, `--max-containers-per-cgroup`,
/// `--forget-after`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub per_uid: usize,
    pub per_cgroup: usize,
    pub forget_after: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            per_uid: 64,
            per_cgroup: 256,
            forget_after: Duration::from_secs(30),
        }
    }
}

/// Who a new container counts against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Maker {
    /// The uid of the process that claimed its name (None: not a claimed name, or root).
    pub uid: Option<u32>,
    /// The cgroup it was made from, as `/proc/<pid>/cgroup` shows it.
    pub cgroup: String,
}

struct Entry {
    /// What it counts against (None: it existed before a registration saw it).
    maker: Option<Maker>,
    last: Instant,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    per_uid: HashMap<u32, usize>,
    per_cgroup: HashMap<String, usize>,
}

pub struct Book {
    limits: Limits,
    started: Instant,
    inner: Mutex<Inner>,
    /// Containers forgotten since the daemon started.
    forgotten: AtomicU64,
}

impl std::fmt::Debug for Book {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Book")
            .field("limits", &self.limits)
            .finish()
    }
}

fn dec<K: std::hash::Hash + Eq>(m: &mut HashMap<K, usize>, k: &K) {
    if let Some(n) = m.get_mut(k) {
        *n -= 1;
        if *n == 0 {
            m.remove(k);
        }
    }
}

impl Book {
    pub fn new(limits: Limits) -> Book {
        Book {
            limits,
            started: Instant::now(),
            inner: Mutex::new(Inner::default()),
            forgotten: AtomicU64::new(0),
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A registration for container `name`, made by `maker` if it creates it; `exists` says
    /// (under the book's lock) whether its state exists. Refused, with one line, when it
    /// would create a container past a limit.
    pub fn register(
        &self,
        name: &str,
        maker: Maker,
        exists: impl FnOnce() -> bool,
    ) -> Result<(), String> {
        let now = Instant::now();
        let mut g = self.lock();
        if let Some(e) = g.entries.get_mut(name) {
            e.last = now;
            return Ok(());
        }
        if exists() {
            g.entries.insert(
                name.to_string(),
                Entry {
                    maker: None,
                    last: now,
                },
            );
            return Ok(());
        }
        if let Some(uid) = maker.uid {
            let n = g.per_uid.get(&uid).copied().unwrap_or(0);
            if n >= self.limits.per_uid {
                return Err(format!(
                    "container {name} not created: uid {uid} already made {n} containers that still exist (sharectl daemon --max-containers-per-uid); a container is forgotten once none of its processes runs and it has no settings"
                ));
            }
        }
        let n = g.per_cgroup.get(&maker.cgroup).copied().unwrap_or(0);
        if n >= self.limits.per_cgroup {
            return Err(format!(
                "container {name} not created: cgroup {} already made {n} containers that still exist (sharectl daemon --max-containers-per-cgroup); a container is forgotten once none of its processes runs and it has no settings",
                libshare_abi::names::escape(&maker.cgroup)
            ));
        }
        if let Some(uid) = maker.uid {
            *g.per_uid.entry(uid).or_default() += 1;
        }
        *g.per_cgroup.entry(maker.cgroup.clone()).or_default() += 1;
        g.entries.insert(
            name.to_string(),
            Entry {
                maker: Some(maker),
                last: now,
            },
        );
        Ok(())
    }

    /// If container `name` last registered (or the daemon started) at least
    /// [`Limits::forget_after`] ago, runs `forget` under the book's lock and, if it did, stops
    /// counting it. Whether it was forgotten.
    pub fn forget_if(&self, name: &str, forget: impl FnOnce() -> bool) -> bool {
        let mut g = self.lock();
        let last = g.entries.get(name).map_or(self.started, |e| e.last);
        if last.elapsed() < self.limits.forget_after || !forget() {
            return false;
        }
        if let Some(Entry { maker: Some(m), .. }) = g.entries.remove(name) {
            if let Some(uid) = m.uid {
                dec(&mut g.per_uid, &uid);
            }
            dec(&mut g.per_cgroup, &m.cgroup);
        }
        self.forgotten.fetch_add(1, Relaxed);
        true
    }

    /// Containers forgotten since the daemon started (a holder of their states closes them
    /// when it changes).
    pub fn forgotten(&self) -> u64 {
        self.forgotten.load(Relaxed)
    }

    /// Containers counted against `uid` now.
    pub fn made_by_uid(&self, uid: u32) -> usize {
        self.lock().per_uid.get(&uid).copied().unwrap_or(0)
    }

    /// Containers the book knows (registered since the daemon started and not forgotten).
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claimed(uid: u32, cgroup: &str) -> Maker {
        Maker {
            uid: Some(uid),
            cgroup: cgroup.into(),
        }
    }

    #[test]
    fn new_containers_are_limited_per_uid_and_per_cgroup_until_forgotten() {
        let b = Book::new(Limits {
            per_uid: 2,
            per_cgroup: 3,
            forget_after: Duration::ZERO,
        });
        b.register("a", claimed(7, "/u/s1"), || false).unwrap();
        b.register("b", claimed(7, "/u/s2"), || false).unwrap();
        let e = b.register("c", claimed(7, "/u/s3"), || false).unwrap_err();
        assert!(
            e.contains("uid 7 already made 2") && !e.contains('\n'),
            "{e}"
        );
        // A registration of an existing container is always served, and counts nothing.
        b.register("a", claimed(7, "/u/s1"), || true).unwrap();
        b.register("old", claimed(7, "/u/s1"), || true).unwrap();
        assert_eq!(b.made_by_uid(7), 2);
        // Another uid of the same cgroup, then the cgroup's limit.
        b.register("d", claimed(8, "/u/s1"), || false).unwrap();
        b.register("e", claimed(9, "/u/s1"), || false).unwrap();
        let e = b.register("f", claimed(10, "/u/s1"), || false).unwrap_err();
        assert!(e.contains("cgroup /u/s1 already made 3"), "{e}");
        // Root's claims count per cgroup only; a runtime's container per cgroup only.
        let mapped = Maker {
            uid: None,
            cgroup: "/machine.slice".into(),
        };
        for n in ["m1", "m2", "m3"] {
            b.register(n, mapped.clone(), || false).unwrap();
        }
        assert!(b.register("m4", mapped.clone(), || false).is_err());
        // Forgetting one gives its room back; a forget that did not happen keeps it.
        assert!(!b.forget_if("a", || false));
        assert!(b.register("c", claimed(7, "/u/s3"), || false).is_err());
        assert!(b.forget_if("a", || true));
        assert_eq!(b.made_by_uid(7), 1);
        b.register("c", claimed(7, "/u/s3"), || false).unwrap();
        assert!(b.forget_if("m1", || true));
        b.register("m4", mapped, || false).unwrap();
    }

    #[test]
    fn a_container_is_kept_for_the_grace_after_its_last_registration() {
        let b = Book::new(Limits {
            forget_after: Duration::from_secs(3600),
            ..Limits::default()
        });
        assert!(
            !b.forget_if("never-seen", || true),
            "the daemon just started"
        );
        b.register("a", claimed(7, "/x"), || false).unwrap();
        assert!(!b.forget_if("a", || panic!("not asked within the grace")));
    }
}
