//! The daemon's word on each container, kept in the daemon's memory: its class, and per device
//! its memory quota, compute share and weight. A container's state file is mapped read-write
//! by its jobs (they must update their usage counters), so any word in it can be overwritten by
//! a job of that container; the words below are the daemon's, never the file's:
//! - they are written into the state when the container is registered or found, and
//!   re-written at every rescan (100 ms) where a job changed them ([`Words::assert`], counted in
//!   [`Restores`], logged, and exported as `libshare_daemon_state_restores_total`);
//! - the policy reads them from here ([`Words::class_or`] and friends), not from the file, so a
//!   job that writes `class = production` into its own mapping between two rescans pauses
//!   nobody else.
//!
//! What the daemon has a word on: whatever the admin's settings (over the `[defaults]`) say,
//! and, when it does not trust the processes' environment, the class (production unless set),
//! compute share and weight (none unless set) of every container. With `--trust-env` a word the
//! settings leave unset is the job's (its environment's, as without a daemon) and is read from
//! the file. A quota the settings leave unset is never asserted (0, no quota, is what an unset
//! quota means; a job that writes one only limits itself).
//!
//! What a job can still change in its own mapping, and why that hurts no other tenant: its
//! usage counters (`used`, `peak`, its slot's charges), its launch and GPU-time counters, its
//! busy and phase words and its gate's tokens. Each only changes how the shim of that same
//! container limits or reports that container — the same as a job that does not load the shim
//! at all, which is outside what a preloaded shim can prevent (NVIDIA's driver-side limits are).
//! Busy and phase words move the policy only for a container the daemon holds as production,
//! which may run unthrottled anyway; the gate words are re-written by the daemon every tick.

use crate::settings::Settings;
use libshare_abi::admin::ContainerSettings;
use libshare_abi::{
    Class, State, FLAG_DAEMON_MANAGED, FLAG_OVERSUBSCRIBE, FLAG_PIN_BOUND, MAX_DEVICES,
};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::{Arc, Mutex};

/// The words the daemon holds for one container (None: it has no word, the file's counts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Words {
    pub class: Option<Class>,
    /// The container's class and quotas come from the daemon ([`FLAG_DAEMON_MANAGED`]).
    pub managed: bool,
    pub quota: [Option<u64>; MAX_DEVICES],
    pub compute: [Option<u32>; MAX_DEVICES],
    pub weight: [Option<u32>; MAX_DEVICES],
    /// The environment's compute limit (`CUDA_DEVICE_SM_LIMIT`) counts.
    pub env_trusted: bool,
    /// May oversubscribe ([`FLAG_OVERSUBSCRIBE`]); without trust in the environment, no unless
    /// set (a job's `CUDA_OVERSUBSCRIBE` counts only where the environment does).
    pub oversubscribe: Option<bool>,
    /// The daemon bounds the container's memory that cannot be demoted while it is
    /// opportunistic ([`FLAG_PIN_BOUND`], `libshare_abi::pin`): it knows the devices' memory.
    pub pin_bound: bool,
}

/// Which words [`Words::assert`] had to write back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Restored {
    pub class: bool,
    pub oversubscribe: bool,
    pub managed: bool,
    pub pin_bound: bool,
    pub quota: bool,
    pub compute: bool,
    pub weight: bool,
}

impl Restored {
    pub fn any(&self) -> bool {
        self.class
            || self.oversubscribe
            || self.managed
            || self.pin_bound
            || self.quota
            || self.compute
            || self.weight
    }

    /// The words restored, for the log (`class, quota`).
    pub fn names(&self) -> String {
        [
            (self.class, "class"),
            (self.oversubscribe, "oversubscribe flag"),
            (self.managed, "managed flag"),
            (self.pin_bound, "pin-bound flag"),
            (self.quota, "quota"),
            (self.compute, "compute share"),
            (self.weight, "weight"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, n)| *n)
        .collect::<Vec<_>>()
        .join(", ")
    }
}

/// Stores `want` into `word` if it differs; whether it did.
fn put32(word: &AtomicU32, want: Option<u32>) -> bool {
    match want {
        Some(w) if word.load(Acquire) != w => {
            word.store(w, Release);
            true
        }
        _ => false,
    }
}

impl Words {
    /// No word at all: everything is read from the file (a registry without an authority).
    pub const FILE: Words = Words {
        class: None,
        managed: false,
        quota: [None; MAX_DEVICES],
        compute: [None; MAX_DEVICES],
        weight: [None; MAX_DEVICES],
        env_trusted: true,
        oversubscribe: None,
        pin_bound: false,
    };

    /// The words of settings `s` on a node of `devices` devices.
    pub fn of(s: &ContainerSettings, devices: usize, env_trusted: bool) -> Words {
        let mut w = Words {
            class: s.class,
            env_trusted,
            ..Words::default()
        };
        w.oversubscribe = s.oversubscribe;
        if !env_trusted {
            w.class = w.class.or(Some(Class::Production));
            w.oversubscribe = w.oversubscribe.or(Some(false));
        }
        for d in 0..devices.min(MAX_DEVICES) {
            let ds = s.device(d);
            w.quota[d] = ds.memory;
            w.compute[d] = ds.compute.or((!env_trusted).then_some(0));
            w.weight[d] = ds.weight.or((!env_trusted).then_some(0));
            w.managed |= ds.memory.is_some();
        }
        w.managed |= s.class.is_some();
        w
    }

    /// Writes every word the daemon holds into `state` where it differs; which ones did.
    pub fn assert(&self, state: &State) -> Restored {
        let mut r = Restored {
            class: put32(&state.header().class, self.class.map(Class::word)),
            ..Restored::default()
        };
        if let Some(on) = self.oversubscribe {
            let flags = &state.header().flags;
            if (flags.load(Acquire) & FLAG_OVERSUBSCRIBE != 0) != on {
                if on {
                    flags.fetch_or(FLAG_OVERSUBSCRIBE, AcqRel);
                } else {
                    flags.fetch_and(!FLAG_OVERSUBSCRIBE, AcqRel);
                }
                r.oversubscribe = true;
            }
        }
        if self.managed && state.header().flags.load(Acquire) & FLAG_DAEMON_MANAGED == 0 {
            state.header().flags.fetch_or(FLAG_DAEMON_MANAGED, AcqRel);
            r.managed = true;
        }
        if self.pin_bound && state.header().flags.load(Acquire) & FLAG_PIN_BOUND == 0 {
            state.header().flags.fetch_or(FLAG_PIN_BOUND, AcqRel);
            r.pin_bound = true;
        }
        for d in 0..MAX_DEVICES {
            let dev = state.device(d);
            if let Some(q) = self.quota[d] {
                if dev.quota.load(Acquire) != q {
                    state.set_quota(d, q);
                    r.quota = true;
                }
            }
            r.compute |= put32(&dev.compute, self.compute[d]);
            r.weight |= put32(&dev.weight, self.weight[d]);
        }
        r
    }

    /// Writes `self` into `state` after the admin's settings for the container were forgotten
    /// (`sharectl reset`; `self` is then what the defaults still say): a word only those
    /// settings gave goes back to what a state nobody set holds — compute share and weight 0
    /// (no limit) on every device, not [`FLAG_DAEMON_MANAGED`], not [`FLAG_OVERSUBSCRIBE`] —
    /// and the rest is [`Words::assert`]ed. A quota stays unless `self` holds one (never lifted
    /// behind the operator's back: a job of the container that starts with its own limit sets
    /// it), and so does the class. Which words changed.
    pub fn reset(&self, state: &State) -> Restored {
        let cleared = Words {
            compute: self.compute.map(|c| Some(c.unwrap_or(0))),
            weight: self.weight.map(|w| Some(w.unwrap_or(0))),
            ..*self
        };
        let mut drop = 0;
        if !self.managed {
            drop |= FLAG_DAEMON_MANAGED;
        }
        if self.oversubscribe != Some(true) {
            drop |= FLAG_OVERSUBSCRIBE;
        }
        let flags = &state.header().flags;
        let was = flags.load(Acquire) & drop;
        if was != 0 {
            flags.fetch_and(!drop, AcqRel);
        }
        let mut r = cleared.assert(state);
        r.managed |= was & FLAG_DAEMON_MANAGED != 0;
        r.oversubscribe |= was & FLAG_OVERSUBSCRIBE != 0;
        r
    }

    /// The class the policy uses: the daemon's, else the file's.
    #[inline]
    pub fn class_or(&self, file: Class) -> Class {
        self.class.unwrap_or(file)
    }

    /// Device `d`'s compute share, weight and environment compute limit for the policy: the
    /// daemon's words, else the file's (`compute`, `weight`, `env_compute`).
    #[inline]
    pub fn shares_or(&self, d: usize, compute: u32, weight: u32, env_compute: u32) -> [u32; 3] {
        [
            self.compute[d].unwrap_or(compute),
            self.weight[d].unwrap_or(weight),
            if self.env_trusted { env_compute } else { 0 },
        ]
    }
}

/// How many times each container's words had to be restored since the daemon started.
#[derive(Debug, Default)]
pub struct Restores {
    by_container: Mutex<BTreeMap<String, u64>>,
    total: AtomicU64,
}

impl Restores {
    pub fn count(&self, container: &str) {
        let mut m = self.by_container.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry(container.to_string()).or_default() += 1;
        self.total.fetch_add(1, Relaxed);
    }

    pub fn total(&self) -> u64 {
        self.total.load(Relaxed)
    }

    /// (container, restores) of every container restored at least once.
    pub fn snapshot(&self) -> Vec<(String, u64)> {
        let m = self.by_container.lock().unwrap_or_else(|p| p.into_inner());
        m.iter().map(|(k, v)| (k.clone(), *v)).collect()
    }
}

/// The daemon's settings seen as words: shared by the registration service (seeds a
/// container's state before its first job runs), the registry (re-asserts at every rescan) and
/// the admin service (through the same [`Settings`]).
#[derive(Clone)]
pub struct Authority {
    settings: Arc<Mutex<Settings>>,
    devices: usize,
    env_trusted: bool,
    pin_bound: bool,
    pub restores: Arc<Restores>,
    /// Who made which container, and when each last registered ([`crate::book`]): the
    /// registration service limits new containers by it, the registry forgets idle ones.
    book: Option<Arc<crate::book::Book>>,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority")
            .field("devices", &self.devices)
            .field("env_trusted", &self.env_trusted)
            .finish()
    }
}

impl Authority {
    /// `devices`: the node's devices (NVML), or [`MAX_DEVICES`] when unknown; restores are
    /// counted in `restores` (the metrics').
    pub fn new(
        settings: Arc<Mutex<Settings>>,
        devices: usize,
        env_trusted: bool,
        restores: Arc<Restores>,
    ) -> Self {
        Authority {
            settings,
            devices,
            env_trusted,
            pin_bound: false,
            restores,
            book: None,
        }
    }

    /// The daemon bounds opportunistic containers' memory that cannot be demoted (it knows
    /// the devices' memory): every container's words carry [`FLAG_PIN_BOUND`].
    pub fn with_pin_bound(mut self, on: bool) -> Self {
        self.pin_bound = on;
        self
    }

    /// Limits new containers and forgets idle ones by `book`.
    pub fn with_book(mut self, book: crate::book::Book) -> Self {
        self.book = Some(Arc::new(book));
        self
    }

    pub fn book(&self) -> Option<&crate::book::Book> {
        self.book.as_deref()
    }

    /// Whether the operator has settings of `name`'s own (not only the defaults).
    pub fn has_settings(&self, name: &str) -> bool {
        self.lock().get(name).is_some()
    }

    /// The settings' generation (changes with every `set` and `reset`).
    pub fn generation(&self) -> u64 {
        self.lock().generation()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Settings> {
        self.settings.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The words the daemon holds for `name` now.
    pub fn words(&self, name: &str) -> Words {
        Words {
            pin_bound: self.pin_bound,
            ..Words::of(&self.lock().effective(name), self.devices, self.env_trusted)
        }
    }

    /// HAMi mode: makes `s` (what HAMi's variables said to the container's first registering
    /// process) `name`'s settings unless it has some; whether it did. Later processes do not
    /// change them (HAMi-core, too, keeps the limits its first process wrote into the region).
    pub fn adopt(&self, name: &str, s: ContainerSettings) -> Result<bool, String> {
        let mut g = self.lock();
        match g.get(name) {
            Some(have) => {
                if *have != s {
                    tracing::debug!(
                        container = name,
                        "a later process's HAMi settings differ; the container keeps its own"
                    );
                }
                Ok(false)
            }
            None => g.put(name, Some(s)).map(|()| true).map_err(|e| {
                format!("the daemon cannot record container {name}'s HAMi settings: {e}")
            }),
        }
    }

    /// Writes `name`'s words into `state` (a container just registered or found).
    pub fn seed(&self, name: &str, state: &State) -> Words {
        let w = self.words(name);
        w.assert(state);
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use libshare_abi::Class;

    fn opportunistic(quota: u64) -> ContainerSettings {
        let mut s = ContainerSettings {
            class: Some(Class::Opportunistic),
            ..Default::default()
        };
        s.all.memory = Some(quota);
        s.all.weight = Some(3);
        s
    }

    #[test]
    fn a_jobs_writes_are_undone_and_counted_and_unset_words_follow_trust() {
        let tmp = tempfile::tempdir().unwrap();
        let st = State::open_or_create(&tmp.path().join("c")).unwrap();
        let w = Words::of(&opportunistic(256 << 20), 1, false);
        assert!(w.assert(&st).any(), "the first write seeds the state");
        assert_eq!(w.assert(&st), Restored::default(), "nothing to restore");
        // A job writes its class, quota, weight and compute words and clears the flag.
        st.header().set_class(Class::Production);
        st.header().flags.store(0, Release);
        st.device(0).quota.store(0, Release);
        st.device(0).weight.store(100, Release);
        st.device(0).compute.store(5_000, Release);
        let r = w.assert(&st);
        assert_eq!(
            r,
            Restored {
                class: true,
                oversubscribe: false,
                managed: true,
                pin_bound: false,
                quota: true,
                compute: true,
                weight: true
            }
        );
        assert_eq!(
            r.names(),
            "class, managed flag, quota, compute share, weight"
        );
        assert_eq!(st.header().class(), Class::Opportunistic);
        assert_eq!(st.device(0).quota.load(Acquire), 256 << 20);
        assert_eq!(st.device(0).weight.load(Acquire), 3);
        assert_eq!(st.device(0).compute.load(Acquire), 0);
        // Only the node's devices are written.
        assert_eq!(st.device(1).quota.load(Acquire), 0);
        // The policy reads the daemon's words, whatever the file says.
        assert_eq!(w.class_or(Class::Production), Class::Opportunistic);
        assert_eq!(w.shares_or(0, 9_000, 50, 2_000), [0, 3, 0]);

        // Trusting the environment: what the settings leave unset is the job's.
        let trusting = Words::of(&ContainerSettings::default(), 1, true);
        assert_eq!(trusting.class, None);
        assert_eq!(
            trusting.class_or(Class::Opportunistic),
            Class::Opportunistic
        );
        assert_eq!(trusting.shares_or(0, 9_000, 50, 2_000), [9_000, 50, 2_000]);
        // Not trusting it: production, no share, no weight, and no quota asserted.
        let plain = Words::of(&ContainerSettings::default(), 1, false);
        assert_eq!(plain.class, Some(Class::Production));
        assert_eq!(plain.quota[0], None);
        assert!(!plain.managed);
        assert_eq!(plain.oversubscribe, Some(false));
        assert_eq!(trusting.oversubscribe, None);
    }

    #[test]
    fn the_oversubscribe_flag_is_the_daemons_word_where_it_has_one() {
        let tmp = tempfile::tempdir().unwrap();
        let st = State::open_or_create(&tmp.path().join("c")).unwrap();
        let mut s = opportunistic(64 << 30);
        s.oversubscribe = Some(true);
        let w = Words::of(&s, 1, false);
        w.assert(&st);
        assert!(st.oversubscribes());
        // A job clears it: restored, counted by name.
        st.header().flags.fetch_and(!FLAG_OVERSUBSCRIBE, AcqRel);
        let r = w.assert(&st);
        assert!(
            r.oversubscribe && r.names() == "oversubscribe flag",
            "{r:?}"
        );
        assert!(st.oversubscribes());
        // Untrusting daemon, no setting: a job's CUDA_OVERSUBSCRIBE does not count.
        let plain = Words::of(&opportunistic(1 << 30), 1, false);
        plain.assert(&st);
        assert!(!st.oversubscribes());
        // Trusting one, no setting: the job's word stands.
        st.header().flags.fetch_or(FLAG_OVERSUBSCRIBE, AcqRel);
        Words::of(&opportunistic(1 << 30), 1, true).assert(&st);
        assert!(st.oversubscribes());
    }

    /// A reset takes back what only the forgotten settings said, keeps the quota, and leaves
    /// what the defaults still say.
    #[test]
    fn a_reset_clears_what_only_the_settings_said() {
        let tmp = tempfile::tempdir().unwrap();
        let st = State::open_or_create(&tmp.path().join("c")).unwrap();
        let mut s = opportunistic(1 << 30);
        s.oversubscribe = Some(true);
        s.all.compute = Some(3_000);
        for trusted in [true, false] {
            Words::of(&s, 2, trusted).assert(&st);
            st.device(5).compute.store(7, Release); // a word outside the node's devices
            assert!(st.oversubscribes());
            let r = Words::of(&ContainerSettings::default(), 2, trusted).reset(&st);
            assert!(
                r.managed && r.oversubscribe && r.compute && r.weight,
                "{r:?}"
            );
            let flags = st.header().flags.load(Acquire);
            assert_eq!(flags & (FLAG_DAEMON_MANAGED | FLAG_OVERSUBSCRIBE), 0);
            for d in 0..MAX_DEVICES {
                assert_eq!(st.device(d).compute.load(Acquire), 0, "device {d}");
                assert_eq!(st.device(d).weight.load(Acquire), 0, "device {d}");
            }
            assert_eq!(st.device(0).quota.load(Acquire), 1 << 30, "the quota stays");
            let class = if trusted {
                Class::Opportunistic // the file's: nobody has a word on it now
            } else {
                Class::Production
            };
            assert_eq!(st.header().class(), class);
        }
        // Defaults that still say something: that stays.
        Words::of(&s, 2, false).assert(&st);
        let mut defaults = ContainerSettings::default();
        defaults.all.weight = Some(2);
        defaults.oversubscribe = Some(true);
        defaults.all.memory = Some(2 << 30);
        Words::of(&defaults, 2, false).reset(&st);
        let flags = st.header().flags.load(Acquire);
        assert_ne!(flags & FLAG_DAEMON_MANAGED, 0, "the defaults give a quota");
        assert_ne!(flags & FLAG_OVERSUBSCRIBE, 0);
        assert_eq!(st.device(1).weight.load(Acquire), 2);
        assert_eq!(st.device(1).compute.load(Acquire), 0);
        assert_eq!(st.device(0).quota.load(Acquire), 2 << 30);
        assert_eq!(
            st.device(2).weight.load(Acquire),
            0,
            "only the node's devices"
        );
    }

    #[test]
    fn restores_are_counted_per_container() {
        let r = Restores::default();
        r.count("a");
        r.count("a");
        r.count("b");
        assert_eq!(r.total(), 3);
        assert_eq!(r.snapshot(), vec![("a".into(), 2), ("b".into(), 1)]);
    }
}
