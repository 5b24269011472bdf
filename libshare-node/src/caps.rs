//! Driver-enforced memory caps: where NVIDIA's driver takes per-cgroup memory limits (NVML's
//! `nvmlDeviceSetMemoryLimits_v1`, drivers r615+, root only, not on MIG devices), the daemon
//! also sets each container's quota there as the hard limit of the container's cgroup (and a
//! production container's quota as its soft limit, the memory guaranteed to it), so the quota
//! holds for a process that bypasses the preload (a static binary, a cleared
//! `/etc/ld.so.preload`). It clears them when the container goes (its state file removed); a
//! removed cgroup takes its limits with it. Where the call is absent (an older driver, no NVML,
//! not root) the daemon says so once and the shim alone enforces quotas, as before.
//!
//! The limits are keyed by cgroup: each cgroup that names a container (the cgroup root made,
//! [`crate::identity::naming`]) gets that container's quota, and no registration can move them
//! to another cgroup. A container's cgroup is learnt at the runtime's `createRuntime` hook
//! (`sharectl hook` tells the admin socket the container's process, [`crate::admin`]), where
//! its limits are set at once, before the container's first process runs; and again when one
//! of its processes registers (a container the hook did not start). [`Caps::reconcile`] (every
//! 100 ms, its own thread) writes the quotas the containers' state files hold into the driver
//! for every cgroup learnt while it exists.

use crate::view::NodeView;
use libshare_abi::{Class, State};
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CString};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// `nvmlSetMemoryLimits_v1_t` (NVML API reference): cgroup sysfs path, soft, hard (bytes).
#[repr(C)]
struct SetLimits {
    name_space: *const c_char,
    soft: c_ulonglong,
    hard: c_ulonglong,
}

/// `nvmlGetMemoryLimits_v1_t`.
#[repr(C)]
pub struct GetLimits {
    name_space: *const c_char,
    soft: c_ulonglong,
    hard: c_ulonglong,
    current_used: c_ulonglong,
}

/// `NVML_DEVICE_MEMORY_LIMIT_MAX` (assumed ULLONG_MAX): no hard limit.
pub const NO_LIMIT: u64 = u64::MAX;
const NVML_ERROR_NOT_SUPPORTED: c_int = 3;
const NVML_ERROR_FUNCTION_NOT_FOUND: c_int = 13;

type Init = unsafe extern "C" fn() -> c_int;
type Count = unsafe extern "C" fn(*mut c_uint) -> c_int;
type Handle = unsafe extern "C" fn(c_uint, *mut *mut c_void) -> c_int;
type Set = unsafe extern "C" fn(*mut c_void, *mut SetLimits) -> c_int;
type Get = unsafe extern "C" fn(*mut c_void, *mut GetLimits) -> c_int;
type MigMode = unsafe extern "C" fn(*mut c_void, *mut c_uint, *mut c_uint) -> c_int;

/// The NVML entry points, resolved once.
pub struct Driver {
    set: Set,
    get: Get,
    /// Device handles by index; None for a MIG-enabled device (no per-cgroup limits there).
    handles: Vec<Option<usize>>,
}

/// What one NVML call of this module returned, when not success.
#[derive(Debug, thiserror::Error)]
#[error("{call} for {namespace} on device {device} returned NVML error {code}")]
pub struct CapError {
    call: &'static str,
    namespace: String,
    device: usize,
    code: c_int,
}

impl Driver {
    /// Resolves the calls, or says why the driver cannot enforce caps here.
    pub fn probe() -> Result<Driver, String> {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Err(
                "the daemon is not root (the driver takes memory limits from root only)".into(),
            );
        }
        // SAFETY: dlopen with a constant NUL-terminated name; never closed (NVML keeps state).
        let lib = unsafe { libc::dlopen(c"libnvidia-ml.so.1".as_ptr(), libc::RTLD_NOW) };
        if lib.is_null() {
            return Err("libnvidia-ml.so.1 not found".into());
        }
        // SAFETY: NVML's documented prototypes (nvml.h) for each name; `sym` returns None for a
        // missing one.
        unsafe {
            let (Some(init), Some(count), Some(handle)) = (
                sym::<Init>(lib, c"nvmlInit_v2"),
                sym::<Count>(lib, c"nvmlDeviceGetCount_v2"),
                sym::<Handle>(lib, c"nvmlDeviceGetHandleByIndex_v2"),
            ) else {
                return Err("libnvidia-ml.so.1 lacks nvmlInit_v2 or the device calls".into());
            };
            let (Some(set), Some(get)) = (
                sym::<Set>(lib, c"nvmlDeviceSetMemoryLimits_v1"),
                sym::<Get>(lib, c"nvmlDeviceGetMemoryLimits_v1"),
            ) else {
                return Err(
                    "the driver has no nvmlDeviceSetMemoryLimits_v1 (drivers before r615)".into(),
                );
            };
            let mig = sym::<MigMode>(lib, c"nvmlDeviceGetMigMode");
            if init() != 0 {
                return Err("nvmlInit_v2 failed".into());
            }
            let mut n: c_uint = 0;
            if count(&mut n) != 0 {
                return Err("nvmlDeviceGetCount_v2 failed".into());
            }
            let mut handles = Vec::new();
            for i in 0..n {
                let mut h = std::ptr::null_mut();
                if handle(i, &mut h) != 0 {
                    return Err(format!("NVML has no handle for device {i}"));
                }
                let (mut cur, mut pending) = (0, 0);
                let is_mig = mig.is_some_and(|f| f(h, &mut cur, &mut pending) == 0 && cur == 1);
                handles.push((!is_mig).then_some(h as usize));
            }
            let d = Driver { set, get, handles };
            // A library that exports the call for a driver without it answers "not found" or
            // "not supported": ask once, for the root cgroup.
            if let Some(dev) = d.handles.iter().position(Option::is_some) {
                match d.get(dev, Path::new("/sys/fs/cgroup")) {
                    Err(e)
                        if matches!(
                            e.code,
                            NVML_ERROR_FUNCTION_NOT_FOUND | NVML_ERROR_NOT_SUPPORTED
                        ) =>
                    {
                        return Err(format!(
                            "the driver does not support nvmlDeviceSetMemoryLimits_v1 (NVML error {})",
                            e.code
                        ));
                    }
                    _ => {}
                }
            } else {
                return Err("no device without MIG".into());
            }
            Ok(d)
        }
    }

    fn handle(&self, dev: usize) -> Option<*mut c_void> {
        self.handles
            .get(dev)
            .copied()
            .flatten()
            .map(|h| h as *mut c_void)
    }

    /// Sets `ns`'s limits on `dev` (soft 0 and hard [`NO_LIMIT`] clear them). A device the
    /// node lacks or under MIG: nothing to do.
    pub fn set(&self, dev: usize, ns: &Path, soft: u64, hard: u64) -> Result<(), CapError> {
        let Some(h) = self.handle(dev) else {
            return Ok(());
        };
        let c = cstr(ns);
        let mut l = SetLimits {
            name_space: c.as_ptr(),
            soft,
            hard,
        };
        // SAFETY: a handle NVML gave; `l` and the string it points to live across the call.
        let code = unsafe { (self.set)(h, &mut l) };
        check("nvmlDeviceSetMemoryLimits_v1", ns, dev, code)
    }

    /// `ns`'s (soft, hard, current used) on `dev`.
    pub fn get(&self, dev: usize, ns: &Path) -> Result<(u64, u64, u64), CapError> {
        let h = self.handle(dev).ok_or(CapError {
            call: "nvmlDeviceGetMemoryLimits_v1",
            namespace: ns.display().to_string(),
            device: dev,
            code: NVML_ERROR_NOT_SUPPORTED,
        })?;
        let c = cstr(ns);
        let mut l = GetLimits {
            name_space: c.as_ptr(),
            soft: 0,
            hard: 0,
            current_used: 0,
        };
        // SAFETY: as in `set`.
        let code = unsafe { (self.get)(h, &mut l) };
        check("nvmlDeviceGetMemoryLimits_v1", ns, dev, code)?;
        Ok((l.soft, l.hard, l.current_used))
    }
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_encoded_bytes()).unwrap_or_default()
}

fn check(call: &'static str, ns: &Path, device: usize, code: c_int) -> Result<(), CapError> {
    if code == 0 {
        Ok(())
    } else {
        Err(CapError {
            call,
            namespace: ns.display().to_string(),
            device,
            code,
        })
    }
}

/// Looks up `name` in `lib`.
///
/// # Safety
/// `lib` is a live `dlopen` handle; `T` is the symbol's C function type.
unsafe fn sym<T>(lib: *mut c_void, name: &std::ffi::CStr) -> Option<T> {
    // SAFETY: per the contract; dlsym returns NULL or the symbol's address.
    let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
    // SAFETY: a non-NULL address of a function of type T (the contract), pointer-sized.
    (!p.is_null()).then(|| unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
}

/// The limits the daemon wants for a container on one device: (soft, hard). `guarantee`: a
/// production container's quota is also its soft limit (the memory the driver guarantees it);
/// off in HAMi mode, where the class and quota come from the tenant's environment.
pub fn wanted(class: Class, quota: u64, guarantee: bool) -> (u64, u64) {
    match (quota, class) {
        (0, _) => (0, NO_LIMIT),
        (q, Class::Production) if guarantee => (q, q),
        (q, _) => (0, q),
    }
}

/// The containers' cgroups and what the daemon set for each.
pub struct Caps {
    driver: Driver,
    inner: Mutex<Inner>,
    /// Production's quota is its soft limit too ([`wanted`]).
    guarantee: bool,
}

#[derive(Default)]
struct Inner {
    /// Cgroup sysfs directory → the container it names.
    cgroups: HashMap<PathBuf, String>,
    /// (cgroup, device) → (soft, hard) set.
    applied: HashMap<(PathBuf, usize), (u64, u64)>,
    /// Cgroups whose last call failed (logged once until one succeeds).
    failing: std::collections::HashSet<PathBuf>,
}

impl Caps {
    pub fn new(driver: Driver) -> Caps {
        Caps {
            driver,
            inner: Mutex::new(Inner::default()),
            guarantee: true,
        }
    }

    /// HAMi mode (issue 30, B5b): settings adopted from a tenant's environment never become a
    /// soft (guaranteed) limit in the driver; hard limits only.
    pub fn without_guarantees(mut self) -> Caps {
        self.guarantee = false;
        self
    }

    pub fn driver(&self) -> &Driver {
        &self.driver
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records that cgroup `dir` names `container` (at its createRuntime hook or a
    /// registration).
    pub fn learn(&self, container: &str, dir: PathBuf) {
        let mut g = self.lock();
        if g.cgroups.get(&dir).map(String::as_str) != Some(container) {
            tracing::debug!(container, cgroup = %dir.display(), "container cgroup learnt");
            g.cgroups.insert(dir, container.to_string());
        }
    }

    /// Learns `dir` and sets its limits now from `container`'s state in `state_dir` (the
    /// createRuntime hook: before any process of the container runs).
    pub fn learn_and_apply(&self, state_dir: &Path, container: &str, dir: PathBuf) {
        self.learn(container, dir.clone());
        let view = one_container(state_dir, container);
        self.lock()
            .bring(&self.driver, self.guarantee, &dir, container, view.as_ref());
    }

    /// Brings the driver's limits in line with the containers' quotas in `view`: set where they
    /// differ, cleared for a container that is gone; a removed cgroup is forgotten.
    pub fn reconcile(&self, view: &NodeView) {
        let mut g = self.lock();
        g.forget_removed();
        let learnt: Vec<(PathBuf, String)> = g
            .cgroups
            .iter()
            .map(|(d, n)| (d.clone(), n.clone()))
            .collect();
        for (dir, name) in learnt {
            let c = view.containers.iter().find(|c| c.name == name);
            g.bring(&self.driver, self.guarantee, &dir, &name, c);
        }
    }

    /// Reconciles with the states of the containers its cgroups name, in `state_dir`, every
    /// `every` until `stop`. Those states stay mapped between rounds (reopened when removed or
    /// replaced): a round's cost follows the cgroups learnt, not the containers on the node.
    pub fn run(
        &self,
        state_dir: &Path,
        every: std::time::Duration,
        stop: &std::sync::atomic::AtomicBool,
    ) {
        let mut open: HashMap<String, State> = HashMap::new();
        while !stop.load(std::sync::atomic::Ordering::Acquire) {
            let names: std::collections::BTreeSet<String> =
                self.lock().cgroups.values().cloned().collect();
            open.retain(|n, st| names.contains(n) && st.check_path().is_ok());
            for n in &names {
                if !open.contains_key(n) {
                    if let Ok(st) = State::open_existing(&state_path(state_dir, n)) {
                        open.insert(n.clone(), st);
                    }
                }
            }
            let view = NodeView {
                containers: open
                    .iter()
                    .map(|(n, st)| crate::view::container(n, st))
                    .collect(),
                errors: Vec::new(),
            };
            self.reconcile(&view);
            std::thread::sleep(every);
        }
    }
}

fn state_path(state_dir: &Path, name: &str) -> PathBuf {
    libshare_abi::container_dir(state_dir, name).join(libshare_abi::STATE_FILE)
}

/// Container `name`'s figures, if its state exists.
fn one_container(state_dir: &Path, name: &str) -> Option<crate::view::ContainerView> {
    let st = State::snapshot(&state_path(state_dir, name)).ok()?;
    Some(crate::view::container(name, &st))
}

impl Inner {
    /// Forgets the cgroups that were removed (their limits went with them).
    fn forget_removed(&mut self) {
        let Inner {
            cgroups,
            applied,
            failing,
        } = self;
        cgroups.retain(|dir, _| {
            let keep = dir.is_dir();
            if !keep {
                applied.retain(|(a, _), _| a != dir);
                failing.remove(dir);
            }
            keep
        });
    }

    /// Sets `dir`'s limits to what `c` (container `name`, None: gone) wants.
    fn bring(
        &mut self,
        driver: &Driver,
        guarantee: bool,
        dir: &Path,
        name: &str,
        c: Option<&crate::view::ContainerView>,
    ) {
        let mut want: HashMap<usize, (u64, u64)> = c
            .map(|c| {
                c.devices
                    .iter()
                    .map(|d| (d.device, wanted(c.class, d.quota, guarantee)))
                    .collect()
            })
            .unwrap_or_default();
        for ((a, dev), _) in self.applied.iter() {
            if a == dir {
                want.entry(*dev).or_insert((0, NO_LIMIT));
            }
        }
        let mut ok = true;
        for (dev, (soft, hard)) in want {
            let key = (dir.to_path_buf(), dev);
            let before = self.applied.get(&key).copied().unwrap_or((0, NO_LIMIT));
            if before == (soft, hard) {
                continue;
            }
            match driver.set(dev, dir, soft, hard) {
                Ok(()) => {
                    tracing::info!(container = %name, device = dev, cgroup = %dir.display(), soft, hard, "driver memory limit set");
                    if (soft, hard) == (0, NO_LIMIT) {
                        self.applied.remove(&key);
                    } else {
                        self.applied.insert(key, (soft, hard));
                    }
                }
                Err(e) => {
                    ok = false;
                    if self.failing.insert(dir.to_path_buf()) {
                        tracing::warn!(container = %name, cgroup = %dir.display(), "the driver refused the container's memory limit ({e}); the shim alone enforces its quota");
                    }
                }
            }
        }
        if ok {
            self.failing.remove(dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn production_is_guaranteed_its_quota_opportunistic_only_capped() {
        assert_eq!(wanted(Class::Production, 1 << 30, true), (1 << 30, 1 << 30));
        assert_eq!(wanted(Class::Opportunistic, 1 << 30, true), (0, 1 << 30));
        assert_eq!(wanted(Class::Production, 0, true), (0, NO_LIMIT));
        assert_eq!(
            wanted(Class::Production, 1 << 30, false),
            (0, 1 << 30),
            "HAMi mode: no guarantee from the tenant's environment"
        );
    }
}
