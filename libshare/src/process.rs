//! This process's shim: created by the first `cuInit` (never by a constructor, so a process that
//! does not use CUDA sees no difference) with the configuration, the container's shared state
//! and this process's slot in it; the exit handler returns the slot; after `fork` the child
//! starts uninitialised (and every per-process table renews itself, `per_process.rs`).
//!
//! [`Account`] is the ground floor of the quota: charging and returning bytes in the shared
//! state, slot first (so a `kill -9` at any instruction leaves the slot's figure at least its
//! real share of the container's, see `libshare-abi`). Making room when a charge does not fit is
//! the ledger's (`ledger.rs`).

use std::sync::atomic::Ordering::*;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize};
use std::sync::Once;

use libshare_abi::{SlotTable, State, MAX_DEVICES};

use crate::config::Config;
use crate::ops::DriverOps;
use crate::types::*;

/// This process's share of the container's state: its slot, and the charging primitives.
pub struct Account {
    pub state: State,
    pub slot: usize,
    pub pid: u32,
    /// Set by the exit handler once the slot is released: libraries that free memory in exit
    /// handlers running after ours must not return it to the quota a second time.
    exited: AtomicBool,
}

impl Account {
    /// Whether the exit handler has released this process's slot.
    pub fn exited(&self) -> bool {
        self.exited.load(Acquire)
    }

    pub fn new(state: State, slot: usize, pid: u32) -> Account {
        Account {
            state,
            slot,
            pid,
            exited: AtomicBool::new(false),
        }
    }

    /// Charges `bytes` on `dev` if they fit the quota (false: nothing changed). Exiting: the slot
    /// is gone and the memory goes with the process, so anything fits.
    pub fn charge(&self, dev: usize, bytes: u64) -> bool {
        self.exited.load(Acquire) || self.state.charge(self.slot, dev, bytes)
    }

    /// Charges `bytes` the container already holds on `dev` (e.g. what a pool reserved beyond
    /// what was charged), whatever the quota, so the figures stay true.
    pub fn charge_held(&self, dev: usize, bytes: u64) {
        if !self.exited.load(Acquire) && bytes > 0 {
            self.state.charge_held(self.slot, dev, bytes);
        }
    }

    /// Returns `bytes` charged on `dev`.
    pub fn uncharge(&self, dev: usize, bytes: u64) {
        if !self.exited.load(Acquire) && bytes > 0 {
            self.state.uncharge(self.slot, dev, bytes);
        }
    }

    /// The quota on `dev` (0 = none) and what the container holds there.
    pub fn quota(&self, dev: usize) -> (u64, u64) {
        let d = self.state.device(dev);
        (d.quota.load(Acquire), d.used.load(Acquire))
    }

    /// Whether the container holds more than its quota on `dev`.
    pub fn over_quota(&self, dev: usize) -> bool {
        let (quota, used) = self.quota(dev);
        quota > 0 && used > quota
    }

    /// What this process holds on `dev`.
    pub fn held(&self, dev: usize) -> u64 {
        self.state.slot(self.slot).net(dev)
    }

    /// Returns the memory of dead processes of the container to the quota. How many.
    pub fn reclaim_dead(&self) -> usize {
        self.state.reclaim_dead()
    }

    pub fn count_refusal(&self, dev: usize) {
        self.state.device(dev).oom.fetch_add(1, AcqRel);
    }

    /// Counts one allocation the application made (not charges such as the context overhead).
    pub fn count_alloc(&self, dev: usize) {
        if self.exited.load(Acquire) {
            return;
        }
        self.state.slot(self.slot).allocs[dev].fetch_add(1, AcqRel);
        self.state.device(dev).allocs.fetch_add(1, AcqRel);
    }

    /// Counts one free the application made.
    pub fn count_free(&self, dev: usize) {
        if !self.exited.load(Acquire) {
            self.state.device(dev).frees.fetch_add(1, AcqRel);
        }
    }
}

/// The shim of this process, once `cuInit` has run.
pub struct Shim {
    pub cfg: Config,
    pub account: Account,
    /// This process's per-device launch counters in the shared state (computed once: the launch
    /// path only adds to them); pointed at a private sink once the slot is released at exit.
    launch_counters: AtomicPtr<[AtomicU64; MAX_DEVICES]>,
    /// Devices on which this process has been charged its context overhead (bit per device).
    pub ctx_charged: AtomicU32,
    /// Each device's primary context, as the driver handed it out (0 = not seen yet).
    pub primary: [AtomicUsize; MAX_DEVICES],
}

impl Shim {
    /// This process's per-device launch counters.
    #[inline(always)]
    pub fn launches(&self) -> &[AtomicU64; MAX_DEVICES] {
        // SAFETY: always points at an aligned array of atomics that is never freed: in the
        // state's mapping (never unmapped: the Shim is leaked) or at the static SINK.
        unsafe { &*self.launch_counters.load(Relaxed) }
    }
}

static SHIM: AtomicPtr<Shim> = AtomicPtr::new(std::ptr::null_mut());

/// Where this process's initialisation stands.
mod status {
    pub const NOT_YET: u8 = 0;
    pub const READY: u8 = 1;
    /// Refused (invalid configuration or state): the job must not run unlimited.
    pub const REFUSED: u8 = 2;
}
static STATUS: AtomicU8 = AtomicU8::new(status::NOT_YET);
/// Serialises initialisation. Not a Mutex: a lock held by another thread when the process forks
/// would stay held forever in the child; the fork handler resets this one.
static INIT_LOCK: AtomicBool = AtomicBool::new(false);

struct InitGuard;

impl InitGuard {
    fn lock() -> InitGuard {
        let mut spins = 0u32;
        while INIT_LOCK
            .compare_exchange_weak(false, true, Acquire, Relaxed)
            .is_err()
        {
            // Cold path, once per process; but the thread initialising may wait for the daemon
            // for seconds (LIBSHARE_REGISTER_TIMEOUT): sleep rather than spin then.
            spins = spins.saturating_add(1);
            if spins < 1000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        InitGuard
    }
}

impl Drop for InitGuard {
    fn drop(&mut self) {
        INIT_LOCK.store(false, Release);
    }
}

/// The shim, if initialised in this process. One atomic load: used on hot paths.
#[inline]
pub fn get() -> Option<&'static Shim> {
    // SAFETY: SHIM is NULL or a pointer from `Box::into_raw`, never freed (a forked child
    // only forgets it), published with Release after the Shim was built.
    unsafe { SHIM.load(Acquire).as_ref() }
}

/// The shim, initialising it if the driver was initialised without our `cuInit` hook seeing it.
/// Err: the configuration or the container's state is invalid (the job must not run unlimited).
pub fn shim() -> Result<&'static Shim, CUresult> {
    match get() {
        Some(s) => Ok(s),
        None => init(&crate::ops::REAL),
    }
}

/// Creates the shim (once per process; again in a forked child). Requires the real `cuInit` to
/// have succeeded.
pub fn init(ops: &dyn DriverOps) -> Result<&'static Shim, CUresult> {
    let _g = InitGuard::lock();
    if let Some(s) = get() {
        return Ok(s);
    }
    if STATUS.load(Acquire) == status::REFUSED {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    match build(ops) {
        Ok(s) => {
            SHIM.store(Box::into_raw(Box::new(s)), Release);
            STATUS.store(status::READY, Release);
            register_process_hooks();
            Ok(get().expect("just stored"))
        }
        Err(msg) => {
            eprintln!("{msg}");
            STATUS.store(status::REFUSED, Release);
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    }
}

fn build(ops: &dyn DriverOps) -> Result<Shim, String> {
    let cfg = Config::from_env()?;
    for w in &cfg.warnings {
        eprintln!("{w}");
    }
    if let Some(level) = &cfg.log {
        let _ = tracing_subscriber::fmt()
            .with_max_level(crate::config::log_level(level))
            .with_writer(std::io::stderr)
            .with_target(false)
            // Plain text whatever features other crates unify in: the job's stderr often
            // ends up in a log file, and tools parse these lines.
            .with_ansi(false)
            .try_init();
    }
    let devices = check_limits(&cfg, ops)?;
    // The daemon's word first (registration: the container from the process's cgroup, the
    // state file passed as a descriptor); a daemon that does not register this process in time
    // fails cuInit (never its environment's word instead). Without a daemon (no socket file),
    // the container's state by path or nothing: a private fallback would let every process
    // enforce the whole quota on its own.
    let (state, container, env_applies) = match crate::register::register(
        &cfg,
        crate::register::Patience::Wait(cfg.register_timeout),
    )
    .map_err(|e| e.to_string())?
    {
        crate::register::Outcome::Registered {
            state,
            container,
            env_trusted,
        } => (*state, container, env_trusted),
        crate::register::Outcome::NoDaemon => {
            let state = State::open_or_create(&cfg.container_dir).map_err(|e| {
                format!("libshare: {e} (the container's memory quota cannot be enforced; check LIBSHARE_STATE_DIR)")
            })?;
            (state, cfg.container.clone(), true)
        }
    };
    let managed = state.header().flags.load(Acquire) & libshare_abi::FLAG_DAEMON_MANAGED != 0;
    if !env_applies {
        // The daemon does not trust the environment: its settings are the only word.
        if let Some(src) = cfg.memory_limit_source.iter().find(|s| !s.is_empty()) {
            eprintln!(
                "libshare: container {container}'s quota comes from the daemon; {src} is ignored"
            );
        }
    }
    // The environment's limits are per CUDA ordinal (as HAMi documents them); the state's
    // quotas per node GPU (`devmap.rs`).
    for (o, limit) in cfg.memory_limit.iter().enumerate().take(devices) {
        let Some(l) = limit.filter(|_| env_applies) else {
            continue;
        };
        let d = crate::devmap::node_of(o as CUdevice);
        let cur = state.device(d).quota.load(Acquire);
        if !managed {
            state.set_quota(d, l);
        } else if cur == 0 || cur > l {
            // The daemon manages the container, but the environment's limit is still a
            // ceiling: never a larger quota than the one the job was started with.
            state.set_quota(d, l);
            eprintln!(
                "libshare: the container's quota on GPU {d} is set by the daemon, but {} is lower: {} applies",
                cfg.memory_limit_source[o],
                libshare_abi::units::format_size(l)
            );
        }
    }
    if !managed && env_applies {
        state.header().set_class(cfg.class);
        let flags = &state.header().flags;
        if cfg.oversubscribe {
            flags.fetch_or(libshare_abi::FLAG_OVERSUBSCRIBE, AcqRel);
        } else {
            flags.fetch_and(!libshare_abi::FLAG_OVERSUBSCRIBE, AcqRel);
        }
    }
    let pid = std::process::id();
    let slot = state.claim_slot(pid).ok_or_else(|| {
        format!(
            "libshare: more than {} processes in container {}",
            libshare_abi::MAX_PROCS,
            container
        )
    })?;
    // The environment's compute limit, published in this process's slot for the daemon (basis
    // points; 0 = none): the container's is the smallest over its processes, so a process
    // started without one lifts nobody's (an untrusting daemon ignores them all).
    state.set_compute_limit(slot, cfg.compute_percent.map_or(0, |p| p * 100));
    tracing::info!(container = %container, class = cfg.class.name(), slot, "libshare initialised");
    let mut cfg = cfg;
    cfg.container = container;
    let launch_counters = AtomicPtr::new(&state.slot(slot).launches as *const _ as *mut _);
    Ok(Shim {
        cfg,
        account: Account::new(state, slot, pid),
        launch_counters,
        ctx_charged: AtomicU32::new(0),
        primary: [const { AtomicUsize::new(0) }; MAX_DEVICES],
    })
}

/// A limit for a device this process does not have, or above what a device has, is a
/// configuration error. Returns how many devices this process sees (limits are recorded for
/// those only).
fn check_limits(cfg: &Config, ops: &dyn DriverOps) -> Result<usize, String> {
    let Some(totals) = ops.device_totals() else {
        return Ok(MAX_DEVICES);
    };
    cfg.check_devices(totals.len(), &totals)?;
    Ok(totals.len())
}

fn register_process_hooks() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: registering `extern "C"` functions that live as long as the process (the shim
        // is never unloaded: it is preloaded). The fork handler only stores atomics (allowed in
        // a forked child of a multithreaded process); the exit handler runs on normal exit.
        unsafe {
            libc::pthread_atfork(None, None, Some(after_fork_child));
            libc::atexit(at_exit);
        }
    });
}

/// In a forked child: forget the parent's shim (its slot and allocations are the parent's).
extern "C" fn after_fork_child() {
    INIT_LOCK.store(false, Release);
    SHIM.store(std::ptr::null_mut(), Release);
    STATUS.store(status::NOT_YET, Release);
    crate::per_process::new_generation();
}

/// At exit: return this process's memory to the quota now rather than when someone notices.
extern "C" fn at_exit() {
    if let Some(s) = get() {
        let a = &s.account;
        if a.pid == std::process::id() && !a.exited.swap(true, AcqRel) {
            // Launches after this point must not land in a slot another process may claim.
            static SINK: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
            s.launch_counters
                .store(&SINK as *const _ as *mut _, Release);
            a.state.release_slot(a.slot, a.pid);
        }
    }
}
