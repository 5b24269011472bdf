//! Driver-enforced memory caps: where NVIDIA's driver takes per-cgroup memory limits (NVML's
//! `nvmlDeviceSetMemoryLimits_v1`, drivers r615+, root only, not on MIG devices), the daemon
//! also sets each container's quota there as the hard limit of the container's cgroup (and a
//! production container's quota as its soft limit, the memory guaranteed to it), so the quota
//! holds for a process that bypasses the preload (a static binary, a cleared
//! `/etc/ld.so.preload`). It clears them when the container goes (its state file removed); a
//! removed cgroup takes its limits with it. Where the call is absent (an older driver, no NVML,
//! not root) the daemon says so once and the shim alone enforces quotas, as before.
//!
//! A container's cgroup is learnt when one of its processes registers (the cgroup that named
//! it, [`crate::identity::naming`]); [`Caps::reconcile`] (every 100 ms, its own
//! thread) writes the quotas the containers' state files hold into the driver.

use crate::view::NodeView;
use libshare_abi::Class;
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

/// The limits the daemon wants for a container on one device: (soft, hard).
pub fn wanted(class: Class, quota: u64) -> (u64, u64) {
    match (quota, class) {
        (0, _) => (0, NO_LIMIT),
        (q, Class::Production) => (q, q),
        (q, Class::Opportunistic) => (0, q),
    }
}

/// The containers' cgroups and what the daemon set for each.
pub struct Caps {
    driver: Driver,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Container → its cgroup's sysfs directory.
    cgroups: HashMap<String, PathBuf>,
    /// (container, device) → (soft, hard) set.
    applied: HashMap<(String, usize), (u64, u64)>,
    /// Containers whose last call failed (logged once until one succeeds).
    failing: std::collections::HashSet<String>,
}

impl Caps {
    pub fn new(driver: Driver) -> Caps {
        Caps {
            driver,
            inner: Mutex::new(Inner::default()),
        }
    }

    pub fn driver(&self) -> &Driver {
        &self.driver
    }

    /// Records that `container`'s cgroup is `dir` (at a registration).
    pub fn learn(&self, container: &str, dir: PathBuf) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if g.cgroups.get(container) != Some(&dir) {
            tracing::debug!(container, cgroup = %dir.display(), "container cgroup learnt");
            g.cgroups.insert(container.to_string(), dir);
        }
    }

    /// Brings the driver's limits in line with the containers' quotas in `view`: set where they
    /// differ, cleared for a container that is gone; a removed cgroup is forgotten.
    pub fn reconcile(&self, view: &NodeView) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Inner {
            cgroups,
            applied,
            failing,
        } = &mut *g;
        cgroups.retain(|c, dir| {
            let keep = dir.is_dir();
            if !keep {
                applied.retain(|(a, _), _| a != c);
            }
            keep
        });
        for (name, dir) in cgroups.iter() {
            let c = view.containers.iter().find(|c| &c.name == name);
            let mut want: HashMap<usize, (u64, u64)> = c
                .map(|c| {
                    c.devices
                        .iter()
                        .map(|d| (d.device, wanted(c.class, d.quota)))
                        .collect()
                })
                .unwrap_or_default();
            for ((a, dev), _) in applied.iter() {
                if a == name {
                    want.entry(*dev).or_insert((0, NO_LIMIT));
                }
            }
            let mut ok = true;
            for (dev, (soft, hard)) in want {
                let key = (name.clone(), dev);
                let before = applied.get(&key).copied().unwrap_or((0, NO_LIMIT));
                if before == (soft, hard) {
                    continue;
                }
                match self.driver.set(dev, dir, soft, hard) {
                    Ok(()) => {
                        tracing::info!(container = %name, device = dev, cgroup = %dir.display(), soft, hard, "driver memory limit set");
                        if (soft, hard) == (0, NO_LIMIT) {
                            applied.remove(&key);
                        } else {
                            applied.insert(key, (soft, hard));
                        }
                    }
                    Err(e) => {
                        ok = false;
                        if failing.insert(name.clone()) {
                            tracing::warn!(container = %name, "the driver refused the container's memory limit ({e}); the shim alone enforces its quota");
                        }
                    }
                }
            }
            if ok {
                failing.remove(name);
            }
        }
        // A container gone from the node: its limits went with the clears above; forget it.
        let gone: Vec<String> = cgroups
            .keys()
            .filter(|n| !view.containers.iter().any(|c| &c.name == *n))
            .filter(|n| !applied.keys().any(|(a, _)| a == *n))
            .cloned()
            .collect();
        for n in gone {
            cgroups.remove(&n);
        }
    }

    /// Reconciles with `state_dir`'s containers every `every` until `stop`.
    pub fn run(
        &self,
        state_dir: &Path,
        every: std::time::Duration,
        stop: &std::sync::atomic::AtomicBool,
    ) {
        while !stop.load(std::sync::atomic::Ordering::Acquire) {
            if let Ok(v) = crate::view::read(state_dir) {
                self.reconcile(&v);
            }
            std::thread::sleep(every);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn production_is_guaranteed_its_quota_opportunistic_only_capped() {
        assert_eq!(wanted(Class::Production, 1 << 30), (1 << 30, 1 << 30));
        assert_eq!(wanted(Class::Opportunistic, 1 << 30), (0, 1 << 30));
        assert_eq!(wanted(Class::Production, 0), (0, NO_LIMIT));
    }
}
