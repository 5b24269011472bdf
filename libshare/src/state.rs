//! Process-wide shim state: the real driver (loaded on first use), and the per-process shim
//! (configuration, the container's shared state, this process's slot), created by the first
//! `cuInit` — never by a constructor, so a process that does not use CUDA sees no difference.
//! After `fork` the child starts uninitialised and registers anew on its first CUDA call.

use std::collections::HashMap;
use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicU8, Ordering::*};
use std::sync::{Mutex, Once, OnceLock};

use libshare_abi::{SlotTable, State, MAX_DEVICES};

use crate::config::Config;
use crate::hooks::Real;
use crate::types::*;

/// The real driver, opened by path (`LIBSHARE_REAL_LIBCUDA`, else the normal search for
/// `libcuda.so.1`), never the shim itself.
pub struct Driver {
    pub handle: *mut c_void,
    /// Load address of the real driver (to recognise its symbols in `dlsym`).
    pub base: usize,
    pub real: Real,
}

// SAFETY: every field is immutable after loading (the driver lives in a OnceLock); the only
// non-Send/Sync fields are the `dlopen` handle, usable from any thread, and function pointers.
unsafe impl Send for Driver {}
// SAFETY: as for Send: shared access only reads immutable fields.
unsafe impl Sync for Driver {}

static DRIVER: OnceLock<Driver> = OnceLock::new();

thread_local! {
    /// Set while this thread loads the driver: `dlsym` calls made by the driver's own
    /// initialisation must not re-enter the loader.
    pub static LOADING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

pub fn driver() -> &'static Driver {
    DRIVER.get_or_init(|| {
        LOADING.with(|l| l.set(true));
        let d = load_driver();
        LOADING.with(|l| l.set(false));
        d
    })
}

/// The real entry points (all None if the driver could not be loaded).
#[inline]
pub fn real() -> &'static Real {
    &driver().real
}

fn load_driver() -> Driver {
    let path = std::env::var("LIBSHARE_REAL_LIBCUDA").unwrap_or_else(|_| "libcuda.so.1".into());
    let h = crate::interpose::dlopen_local(&path);
    let empty = |why: String| {
        eprintln!("libshare: {why}");
        Driver {
            handle: std::ptr::null_mut(),
            base: 0,
            // SAFETY: a lookup that always returns NULL: an all-None table, nothing transmuted.
            real: unsafe { Real::load(|_| std::ptr::null_mut()) },
        }
    };
    if h.is_null() {
        return empty(format!("cannot load the CUDA driver {path} (set LIBSHARE_REAL_LIBCUDA to NVIDIA's libcuda.so.1)"));
    }
    // SAFETY: `h` is a non-NULL handle from `dlopen`; `name` a NUL-terminated C string.
    let lookup = |name: &CStr| unsafe { crate::interpose::real_dlsym(h, name.as_ptr()) };
    let base = crate::interpose::object_base(lookup(c"cuInit"));
    if base == crate::interpose::object_base(crate::hooks::cuInit as *const () as *mut c_void) {
        return empty(format!(
            "{path} is libshare itself: set LIBSHARE_REAL_LIBCUDA to NVIDIA's libcuda.so.1"
        ));
    }
    // SAFETY: `h` is the real driver (not the shim, checked above), and `lookup` returns NULL or
    // its export of the name asked, which has the prototype of the declaration list (the CUDA
    // headers; checked by the `hooks` tests).
    let real = unsafe { Real::load(lookup) };
    Driver {
        handle: h,
        base,
        real,
    }
}

/// The shim of this process, once `cuInit` has run.
pub struct Shim {
    pub cfg: Config,
    pub state: State,
    pub slot: usize,
    pub pid: u32,
    /// This process's per-device launch counters in the shared state (computed once: the launch
    /// path only adds to them); pointed at a private sink once the slot is released at exit.
    launch_counters: AtomicPtr<[AtomicU64; MAX_DEVICES]>,
}

impl Shim {
    /// This process's per-device launch counters.
    #[inline(always)]
    pub fn launches(&self) -> &[AtomicU64; MAX_DEVICES] {
        // SAFETY: always points at an aligned array of atomics that is never freed: in the
        // state's mapping (never unmapped: the Shim is leaked) or at the static SINK.
        unsafe { &*self.launch_counters.load(Relaxed) }
    }

    /// Charges `bytes` on `dev` to the container's quota (and to this process). If it does not
    /// fit: the memory of dead processes of the container first, then what this process can give
    /// back without waiting (stream-ordered frees its streams have reached, what its pools keep),
    /// then after waiting for its queued frees. False: over quota, nothing changed (counted as
    /// a refusal).
    pub fn charge(&self, dev: usize, bytes: u64) -> bool {
        self.charge_making_room(dev, bytes, true, true)
    }

    /// As [`Shim::charge`] but never trims this process's memory pools, and a refusal is not
    /// counted (the caller has another way to try).
    pub fn charge_keeping_pools(&self, dev: usize, bytes: u64) -> bool {
        self.charge_making_room(dev, bytes, false, false)
    }

    fn charge_making_room(&self, dev: usize, bytes: u64, trim: bool, count_refusal: bool) -> bool {
        if EXITED.load(Acquire) {
            return true; // exiting: the slot is gone, the memory is freed with the process
        }
        let st = &self.state;
        let ok = st.reserve(dev, bytes)
            || (st.reclaim_dead() > 0 && st.reserve(dev, bytes))
            || {
                crate::memory::make_room(false, trim);
                st.reserve(dev, bytes)
            }
            || {
                crate::memory::make_room(true, trim);
                st.reserve(dev, bytes)
            };
        if ok {
            st.slot(self.slot).used[dev].fetch_add(bytes, AcqRel);
        } else if count_refusal {
            st.device(dev).oom.fetch_add(1, AcqRel);
        }
        ok
    }

    /// Whether the container holds more than its quota on `dev` (possible only transiently, when
    /// a pool reserved more than was charged for an allocation).
    pub fn over_quota(&self, dev: usize) -> bool {
        let (quota, used) = self.quota(dev);
        quota > 0 && used > quota
    }

    /// Charges `bytes` the container already holds on `dev` (memory a pool reserved beyond what
    /// was charged): recorded whatever the quota, so the figures stay true.
    pub fn charge_held(&self, dev: usize, bytes: u64) {
        if EXITED.load(Acquire) || bytes == 0 {
            return;
        }
        self.state.force_reserve(dev, bytes);
        self.state.slot(self.slot).used[dev].fetch_add(bytes, AcqRel);
    }

    /// Returns `bytes` charged on `dev`.
    pub fn uncharge(&self, dev: usize, bytes: u64) {
        if EXITED.load(Acquire) {
            return; // already returned with the slot
        }
        self.state.release(dev, bytes);
        let _ = self.state.slot(self.slot).used[dev]
            .fetch_update(AcqRel, Acquire, |u| Some(u.saturating_sub(bytes)));
    }

    /// Counts an allocation refused for the quota.
    pub fn count_refusal(&self, dev: usize) {
        self.state.device(dev).oom.fetch_add(1, AcqRel);
    }

    /// Counts one allocation the application made (not charges such as the context overhead).
    pub fn count_alloc(&self, dev: usize) {
        if EXITED.load(Acquire) {
            return;
        }
        self.state.slot(self.slot).allocs[dev].fetch_add(1, AcqRel);
        self.state.device(dev).allocs.fetch_add(1, AcqRel);
    }

    /// Counts one free the application made.
    pub fn count_free(&self, dev: usize) {
        if EXITED.load(Acquire) {
            return;
        }
        self.state.device(dev).frees.fetch_add(1, AcqRel);
    }

    /// Returns the memory of dead processes of the container to the quota, at most every 100 ms
    /// (it reads /proc), so what the job is told about free memory stays true without a daemon.
    pub fn reclaim_now_and_then(&self) {
        static LAST: AtomicU64 = AtomicU64::new(0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let last = LAST.load(Relaxed);
        if now.saturating_sub(last) >= 100
            && LAST.compare_exchange(last, now, AcqRel, Relaxed).is_ok()
        {
            self.state.reclaim_dead();
        }
    }

    /// The quota on `dev` (0 = none) and what the container holds there.
    pub fn quota(&self, dev: usize) -> (u64, u64) {
        let d = self.state.device(dev);
        (d.quota.load(Acquire), d.used.load(Acquire))
    }
}

static SHIM: AtomicPtr<Shim> = AtomicPtr::new(std::ptr::null_mut());
/// Set by the exit handler once this process's slot is released: libraries that free memory in
/// exit handlers running after ours must not return it to the quota a second time.
static EXITED: AtomicBool = AtomicBool::new(false);
/// 0 = not initialised in this process, 1 = ready, 2 = failed (invalid configuration).
static STATUS: AtomicU8 = AtomicU8::new(0);
/// Serialises initialisation. Not a Mutex: a lock held by another thread when the process forks
/// would stay held forever in the child; the fork handler resets this one.
static INIT_LOCK: AtomicBool = AtomicBool::new(false);

struct InitGuard;

impl InitGuard {
    fn lock() -> InitGuard {
        while INIT_LOCK
            .compare_exchange_weak(false, true, Acquire, Relaxed)
            .is_err()
        {
            std::thread::yield_now(); // cold path, once per process
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
/// Err: the configuration is invalid (the job must not run unlimited).
pub fn shim() -> Result<&'static Shim, CUresult> {
    match get() {
        Some(s) => Ok(s),
        None => init(),
    }
}

/// Creates the shim (once per process; again in a forked child). Requires the real `cuInit` to
/// have succeeded.
pub fn init() -> Result<&'static Shim, CUresult> {
    let _g = InitGuard::lock();
    if let Some(s) = get() {
        return Ok(s);
    }
    if STATUS.load(Acquire) == 2 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    match build() {
        Ok(s) => {
            SHIM.store(Box::into_raw(Box::new(s)), Release);
            STATUS.store(1, Release);
            register_process_hooks();
            Ok(get().expect("just stored"))
        }
        Err(msg) => {
            eprintln!("{msg}");
            STATUS.store(2, Release);
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    }
}

fn build() -> Result<Shim, String> {
    let cfg = Config::from_env()?;
    for w in &cfg.warnings {
        eprintln!("{w}");
    }
    if let Some(level) = &cfg.log {
        let _ = tracing_subscriber::fmt()
            .with_max_level(crate::config::log_level(level))
            .with_writer(std::io::stderr)
            .with_target(false)
            .try_init();
    }
    let devices = check_limits(&cfg)?;
    let state = match State::open_or_create(&cfg.container_dir) {
        Ok(s) => s,
        Err(e) => {
            // The quota can still be enforced for this process alone; say so.
            eprintln!(
                "libshare: {e}; limits apply to this process only (check LIBSHARE_STATE_DIR)"
            );
            State::anonymous().map_err(|e| format!("libshare: {e}"))?
        }
    };
    let managed = state.header().flags.load(Acquire) & libshare_abi::FLAG_DAEMON_MANAGED != 0;
    if !managed {
        for (d, limit) in cfg.memory_limit.iter().enumerate().take(devices) {
            if let Some(l) = limit {
                state.device(d).quota.store(*l, Release);
            }
        }
        state.header().class.store(cfg.class, Release);
    }
    let pid = std::process::id();
    let slot = state.claim_slot(pid).ok_or_else(|| {
        format!(
            "libshare: more than {} processes in container {}",
            libshare_abi::MAX_PROCS,
            cfg.container
        )
    })?;
    tracing::info!(container = %cfg.container, class = cfg.class, slot, "libshare initialised");
    let launch_counters = AtomicPtr::new(&state.slot(slot).launches as *const _ as *mut _);
    Ok(Shim {
        cfg,
        state,
        slot,
        pid,
        launch_counters,
    })
}

/// A limit above what a device has is a configuration error. Returns how many devices this
/// process sees (limits are recorded for those only).
fn check_limits(cfg: &Config) -> Result<usize, String> {
    let r = real();
    let (Some(count_fn), Some(total_fn)) = (r.cuDeviceGetCount, r.cuDeviceTotalMem_v2) else {
        return Ok(MAX_DEVICES);
    };
    let mut n = 0;
    // SAFETY: the driver's `cuDeviceGetCount` with a live local; the driver is initialised.
    if unsafe { count_fn(&mut n) } != CUDA_SUCCESS {
        return Ok(MAX_DEVICES);
    }
    for d in 0..(n.max(0) as usize).min(MAX_DEVICES) {
        let mut total = 0usize;
        // SAFETY: the driver's `cuDeviceTotalMem_v2` with a live local and an ordinal below
        // the device count.
        if let (Some(l), CUDA_SUCCESS) = (cfg.memory_limit[d], unsafe {
            total_fn(&mut total, d as CUdevice)
        }) {
            if l > total as u64 {
                return Err(format!(
                    "libshare: invalid {}: {} is more than device {d}'s {} of memory",
                    cfg.memory_limit_source[d],
                    libshare_abi::units::format_size(l),
                    libshare_abi::units::format_size(total as u64)
                ));
            }
        }
    }
    Ok((n.max(0) as usize).min(MAX_DEVICES))
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
    EXITED.store(false, Release);
    SHIM.store(std::ptr::null_mut(), Release);
    STATUS.store(0, Release);
    crate::memory::forget_all_after_fork();
    crate::deferred::forget_all_after_fork();
    crate::graph_mem::forget_all_after_fork();
    crate::pools::forget_all_after_fork();
}

/// At exit: return this process's memory to the quota now rather than when someone notices.
extern "C" fn at_exit() {
    if let Some(s) = get() {
        if s.pid == std::process::id() && !EXITED.swap(true, AcqRel) {
            // Launches after this point must not land in a slot another process may claim.
            static SINK: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
            s.launch_counters
                .store(&SINK as *const _ as *mut _, Release);
            s.state.release_slot(s.slot, s.pid);
        }
    }
}

/// Per-process map of live allocations (pointer or VMM handle → (device, bytes)). Swapped for a
/// fresh one in a forked child, so a lock held by another thread at fork time cannot deadlock it.
pub struct Allocations(Mutex<HashMap<u64, (u32, u64)>>);

impl Allocations {
    pub fn new() -> &'static Allocations {
        Box::leak(Box::new(Allocations(Mutex::new(HashMap::new()))))
    }
    pub fn insert(&self, key: u64, dev: usize, bytes: u64) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, (dev as u32, bytes));
    }
    pub fn get(&self, key: u64) -> Option<(usize, u64)> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .map(|(d, b)| (*d as usize, *b))
    }
    /// Every key (allocations: device pointers).
    pub fn keys(&self) -> Vec<u64> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .copied()
            .collect()
    }

    /// Removes and returns every entry on device `dev`.
    pub fn drain_device(&self, dev: usize) -> Vec<(u64, (usize, u64))> {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let keys: Vec<u64> = m
            .iter()
            .filter(|(_, (d, _))| *d as usize == dev)
            .map(|(k, _)| *k)
            .collect();
        keys.into_iter()
            .filter_map(|k| m.remove(&k).map(|(d, b)| (k, (d as usize, b))))
            .collect()
    }

    pub fn remove(&self, key: u64) -> Option<(usize, u64)> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key)
            .map(|(d, b)| (d as usize, b))
    }
}

/// Process-local state behind a mutex, which a forked child must not inherit: a lock held by
/// another thread at fork time would never be released in the child. The fork handler calls
/// [`PerProcess::reset`], after which the child lazily gets a fresh value (the parent's leaks).
pub struct PerProcess<T: Default + 'static>(AtomicPtr<Mutex<T>>);

impl<T: Default + 'static> Default for PerProcess<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Default + 'static> PerProcess<T> {
    pub const fn new() -> Self {
        PerProcess(AtomicPtr::new(std::ptr::null_mut()))
    }

    pub fn get(&self) -> &'static Mutex<T> {
        let p = self.0.load(Acquire);
        if !p.is_null() {
            // SAFETY: only pointers from `Box::into_raw` (below) are stored, never freed.
            return unsafe { &*p };
        }
        let fresh = Box::into_raw(Box::new(Mutex::new(T::default())));
        match self
            .0
            .compare_exchange(std::ptr::null_mut(), fresh, AcqRel, Acquire)
        {
            // SAFETY: ours, from `Box::into_raw`, published and never freed from now on.
            Ok(_) => unsafe { &*fresh },
            // SAFETY: another thread installed one first, also from `Box::into_raw`, never freed
            // (ours leaks: rare, small).
            Err(other) => unsafe { &*other },
        }
    }

    /// Locks, ignoring poisoning (a panic in a hook never leaves the data inconsistent: every
    /// critical section is a few plain collection operations).
    pub fn lock(&self) -> std::sync::MutexGuard<'static, T> {
        self.get().lock().unwrap_or_else(|e| e.into_inner())
    }

    /// In a forked child: forget the parent's value. No allocation, no lock.
    pub fn reset(&self) {
        self.0.store(std::ptr::null_mut(), Release);
    }
}
