//! The per-container shared-memory state between `libshare.so` (in every CUDA process of the
//! container) and `sharectl daemon`, defined once here.
//!
//! One file per container, `<container dir>/state.shm`, mapped by every process of the container
//! (and by the daemon). Everything in it is an atomic or written once before `magic` is
//! published, so readers need no lock. Layout (all `#[repr(C)]`, little-endian, 64-byte aligned
//! sections):
//!
//! ```text
//! Header                      magic, version, sizes, class
//! DeviceState × MAX_DEVICES   quota, used, peak, counters, rate-control budget
//! ProcSlot    × MAX_PROCS     pid + start time, per-device used bytes and counters
//! ```
//! A process that dies leaves its slot; the next process of the container that registers or runs
//! out of quota (or the daemon) returns the slot's memory to the quota.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod rate;
pub mod slots;
pub use slots::SlotTable;
pub mod units;

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};

pub const MAGIC: u64 = u64::from_le_bytes(*b"LSHARE\0\x01");
pub const VERSION: u32 = 1;
pub const MAX_DEVICES: usize = 16;
pub const MAX_PROCS: usize = 1024;
pub const STATE_FILE: &str = "state.shm";

/// Job classes (design §1).
pub const CLASS_PRODUCTION: u32 = 0;
pub const CLASS_OPPORTUNISTIC: u32 = 1;

#[repr(C)]
pub struct Header {
    pub magic: AtomicU64,
    pub version: u32,
    pub header_size: u32,
    pub device_size: u32,
    pub proc_size: u32,
    pub max_devices: u32,
    pub max_procs: u32,
    pub file_size: u64,
    /// CLASS_PRODUCTION or CLASS_OPPORTUNISTIC (the daemon may change it).
    pub class: AtomicU32,
    /// FLAG_* bits.
    pub flags: AtomicU32,
}

/// The daemon manages this container: quotas and class come from it, not from the environment.
pub const FLAG_DAEMON_MANAGED: u32 = 1;

#[repr(C, align(64))]
pub struct DeviceState {
    /// Bytes the container may hold on this device; 0 = no limit.
    pub quota: AtomicU64,
    /// Bytes held now (reserved before the driver is called, released on failure and free).
    pub used: AtomicU64,
    pub peak: AtomicU64,
    /// Allocations refused because of the quota.
    pub oom: AtomicU64,
    pub launches: AtomicU64,
    pub allocs: AtomicU64,
    pub frees: AtomicU64,
    /// The rate gate (`rate::Gate`, written by the daemon; read by opportunistic shims): 0 = open.
    pub budget: AtomicU64,
    pub _reserved: [AtomicU64; 8],
}

#[repr(C, align(64))]
pub struct ProcSlot {
    /// 0 = free; else the host pid as this process sees it (its own pid namespace).
    pub pid: AtomicU32,
    pub _pad: u32,
    /// /proc/<pid>/stat start time: a reused pid is not the same process.
    pub start_time: AtomicU64,
    pub used: [AtomicU64; MAX_DEVICES],
    pub launches: [AtomicU64; MAX_DEVICES],
    pub allocs: [AtomicU64; MAX_DEVICES],
}

/// Why a state file cannot be used: one line for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateError(pub String);

impl std::fmt::Display for StateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

const fn align64(x: usize) -> usize {
    (x + 63) & !63
}

pub const HEADER_SIZE: usize = align64(std::mem::size_of::<Header>());
pub const DEVICES_OFFSET: usize = HEADER_SIZE;
pub const PROCS_OFFSET: usize = DEVICES_OFFSET + std::mem::size_of::<DeviceState>() * MAX_DEVICES;
pub const FILE_SIZE: usize = PROCS_OFFSET + std::mem::size_of::<ProcSlot>() * MAX_PROCS;

/// A mapped container state file.
pub struct State {
    base: *mut u8,
}

// SAFETY: `base` is a mapping owned by this State (unmapped only in Drop), not tied to the thread
// that created it, so the State may move between threads.
unsafe impl Send for State {}
// SAFETY: shared access goes only through `&Header`/`&DeviceState`/`&ProcSlot`, whose mutable
// fields are atomics; the plain Header fields are written once in `init_locked` before the State
// is returned (and before MAGIC is published), then only read.
unsafe impl Sync for State {}

impl State {
    /// Maps `<dir>/state.shm`, creating and initialising it if it does not exist. An existing file
    /// that is truncated, corrupt or of another version is an error (never silently reset: the
    /// daemon or an operator decides).
    pub fn open_or_create(dir: &Path) -> Result<State, StateError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| StateError(format!("cannot create {}: {e}", dir.display())))?;
        let path = dir.join(STATE_FILE);
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| StateError(format!("cannot open {}: {e}", path.display())))?;
        let fd = f.as_raw_fd();
        // SAFETY: `fd` is the open descriptor of `f`, alive for this whole function; flock only
        // takes an advisory lock on it (serialising initialisation between processes).
        unsafe { libc::flock(fd, libc::LOCK_EX) };
        let r = Self::init_locked(&f, &path);
        // SAFETY: as above, `f` is still open; this releases the lock taken above.
        unsafe { libc::flock(fd, libc::LOCK_UN) };
        r
    }

    fn init_locked(f: &std::fs::File, path: &Path) -> Result<State, StateError> {
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let fresh = len == 0;
        if fresh {
            f.set_len(FILE_SIZE as u64)
                .map_err(|e| StateError(format!("cannot size {}: {e}", path.display())))?;
        } else if len < FILE_SIZE as u64 {
            return Err(StateError(format!(
                "{} is truncated ({len} bytes, expected {FILE_SIZE}): remove it or restart the daemon",
                path.display()
            )));
        }
        let st = Self::map(f, path)?;
        if fresh {
            // SAFETY: `st.base` is a fresh FILE_SIZE mapping, page-aligned, so a Header fits at
            // offset 0; we hold the init lock and MAGIC is not published yet, so no other process
            // reads these plain fields, and no `&Header` exists yet in this one.
            unsafe {
                let h = st.base as *mut Header;
                (*h).version = VERSION;
                (*h).header_size = HEADER_SIZE as u32;
                (*h).device_size = std::mem::size_of::<DeviceState>() as u32;
                (*h).proc_size = std::mem::size_of::<ProcSlot>() as u32;
                (*h).max_devices = MAX_DEVICES as u32;
                (*h).max_procs = MAX_PROCS as u32;
                (*h).file_size = FILE_SIZE as u64;
            }
            st.header().magic.store(MAGIC, Release);
        } else {
            st.validate(path)?;
        }
        Ok(st)
    }

    /// A private, process-local state (when the container's file cannot be used): quotas then
    /// apply to this process alone.
    pub fn anonymous() -> Result<State, StateError> {
        // SAFETY: a fresh anonymous mapping (null hint, no fd): it aliases no Rust memory; the
        // result is checked against MAP_FAILED before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                FILE_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(StateError("cannot map a private state".into()));
        }
        let st = State { base: p as *mut u8 };
        st.header().magic.store(MAGIC, Release);
        Ok(st)
    }

    /// Maps an existing state file read-write (the daemon); errors if it is not valid.
    pub fn open_existing(path: &Path) -> Result<State, StateError> {
        Self::open_existing_with(path, true)
    }

    /// A view of an existing state file that needs only read permission (`sharectl status`, a
    /// monitoring agent). The mapping is private: it shows the file as the shim and daemon
    /// update it, and anything written through the view (e.g. a reclaim) stays in this process,
    /// copy-on-write, never reaching the file.
    pub fn open_view(path: &Path) -> Result<State, StateError> {
        Self::open_existing_with(path, false)
    }

    fn open_existing_with(path: &Path, shared: bool) -> Result<State, StateError> {
        let f = OpenOptions::new()
            .read(true)
            .write(shared)
            .open(path)
            .map_err(|e| StateError(format!("cannot open {}: {e}", path.display())))?;
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        if len < FILE_SIZE as u64 {
            return Err(StateError(format!(
                "{} is truncated ({len} bytes)",
                path.display()
            )));
        }
        let flags = if shared {
            libc::MAP_SHARED
        } else {
            libc::MAP_PRIVATE
        };
        let st = Self::map_with(&f, path, flags)?;
        st.validate(path)?;
        Ok(st)
    }

    fn map(f: &std::fs::File, path: &Path) -> Result<State, StateError> {
        Self::map_with(f, path, libc::MAP_SHARED)
    }

    fn map_with(f: &std::fs::File, path: &Path, flags: libc::c_int) -> Result<State, StateError> {
        // SAFETY: a new mapping (null hint) of FILE_SIZE bytes of `f`, which the callers checked
        // or sized to be at least FILE_SIZE long (so no access past EOF can SIGBUS): MAP_SHARED
        // needs the fd opened for writing, MAP_PRIVATE (copy-on-write) only for reading. The result
        // is checked against MAP_FAILED before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                FILE_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                f.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(StateError(format!("cannot map {}", path.display())));
        }
        Ok(State { base: p as *mut u8 })
    }

    fn validate(&self, path: &Path) -> Result<(), StateError> {
        let h = self.header();
        let ok = h.magic.load(Acquire) == MAGIC
            && h.version == VERSION
            && h.header_size as usize == HEADER_SIZE
            && h.device_size as usize == std::mem::size_of::<DeviceState>()
            && h.proc_size as usize == std::mem::size_of::<ProcSlot>()
            && h.max_devices as usize == MAX_DEVICES
            && h.max_procs as usize == MAX_PROCS
            && h.file_size as usize == FILE_SIZE;
        if ok {
            Ok(())
        } else {
            Err(StateError(format!(
                "{} is corrupt or from another libshare version (expected layout v{VERSION}): remove it or restart the daemon",
                path.display()
            )))
        }
    }

    pub fn header(&self) -> &Header {
        // SAFETY: `base` is a live, page-aligned FILE_SIZE mapping owned by `self` (unmapped only
        // in Drop, so it outlives the borrow) and HEADER_SIZE <= FILE_SIZE; Header's plain fields
        // are only written before the State is handed out (see `init_locked`).
        unsafe { &*(self.base as *const Header) }
    }

    pub fn device(&self, i: usize) -> &DeviceState {
        assert!(i < MAX_DEVICES);
        // SAFETY: `i < MAX_DEVICES` (asserted), so the element lies inside the FILE_SIZE mapping
        // owned by `self`; DEVICES_OFFSET is a multiple of 64 from a page-aligned base, so it is
        // aligned; all fields are atomics (any bit pattern is valid, shared mutation is fine).
        unsafe { &*(self.base.add(DEVICES_OFFSET) as *const DeviceState).add(i) }
    }

    pub fn slot(&self, i: usize) -> &ProcSlot {
        assert!(i < MAX_PROCS);
        // SAFETY: as for `device()`: `i < MAX_PROCS` (asserted) keeps it inside the mapping,
        // PROCS_OFFSET is 64-aligned, and every field is an atomic or padding.
        unsafe { &*(self.base.add(PROCS_OFFSET) as *const ProcSlot).add(i) }
    }

    /// Reserves `bytes` on device `dev` within the quota, with one atomic (no lock). A quota of 0
    /// means unlimited. Returns false, changing nothing, if it does not fit.
    pub fn reserve(&self, dev: usize, bytes: u64) -> bool {
        let d = self.device(dev);
        let quota = d.quota.load(Acquire);
        let r = d.used.fetch_update(AcqRel, Acquire, |u| {
            let n = u.checked_add(bytes)?;
            (quota == 0 || n <= quota).then_some(n)
        });
        match r {
            Ok(prev) => {
                d.peak.fetch_max(prev + bytes, AcqRel);
                true
            }
            Err(_) => false,
        }
    }

    /// Records `bytes` on device `dev` whatever the quota (memory already held, e.g. by a
    /// driver memory pool).
    pub fn force_reserve(&self, dev: usize, bytes: u64) {
        let d = self.device(dev);
        let now = d.used.fetch_add(bytes, AcqRel) + bytes;
        d.peak.fetch_max(now, AcqRel);
    }

    /// Returns `bytes` reserved on `dev`.
    pub fn release(&self, dev: usize, bytes: u64) {
        let _ = self
            .device(dev)
            .used
            .fetch_update(AcqRel, Acquire, |u| Some(u.saturating_sub(bytes)));
    }
}

impl slots::SlotTable for State {
    fn slot_count(&self) -> usize {
        MAX_PROCS
    }
    fn slot_pid(&self, i: usize) -> &AtomicU32 {
        &self.slot(i).pid
    }
    fn slot_start_time(&self, i: usize) -> &AtomicU64 {
        &self.slot(i).start_time
    }
    fn reset_slot(&self, i: usize) {
        let s = self.slot(i);
        for d in 0..MAX_DEVICES {
            s.used[d].store(0, Release);
            s.launches[d].store(0, Release);
            s.allocs[d].store(0, Release);
        }
    }
    fn free_slot(&self, i: usize) {
        let s = self.slot(i);
        for d in 0..MAX_DEVICES {
            let used = s.used[d].swap(0, AcqRel);
            if used > 0 {
                self.release(d, used);
            }
        }
    }
}

impl Drop for State {
    fn drop(&mut self) {
        // SAFETY: `base` is the FILE_SIZE mapping this State created and owns; `&mut self` means
        // no reference borrowed from it (header/device/slot) is still alive.
        unsafe { libc::munmap(self.base as *mut _, FILE_SIZE) };
    }
}

/// The default state directory: /run/libshare when it exists (the daemon's), else a per-user one
/// (`LIBSHARE_STATE_DIR` overrides both, in the shim and in sharectl).
pub fn default_state_dir() -> std::path::PathBuf {
    let run = std::path::PathBuf::from("/run/libshare");
    if run.is_dir() {
        return run;
    }
    // SAFETY: getuid takes no arguments, touches no memory and cannot fail.
    let uid = unsafe { libc::getuid() };
    std::path::PathBuf::from(format!("/tmp/libshare-{uid}"))
}

/// The directory of container `name` under a state directory.
pub fn container_dir(state_dir: &Path, name: &str) -> std::path::PathBuf {
    state_dir.join("containers").join(name)
}

/// Field 22 of /proc/<pid>/stat (start time, clock ticks since boot), 0 if unreadable.
pub fn proc_start_time(pid: u32) -> u64 {
    let mut buf = [0u8; 512];
    let Some(s) = read_small(&format!("/proc/{pid}/stat"), &mut buf) else {
        return 0;
    };
    s.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(19))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn read_small<'a>(path: &str, buf: &'a mut [u8]) -> Option<&'a str> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).ok()?;
    let n = f.read(buf).ok()?;
    std::str::from_utf8(&buf[..n]).ok()
}

/// Is `pid` the same live (non-zombie) process that registered with `start_time`?
pub fn proc_alive(pid: u32, start_time: u64) -> bool {
    let mut buf = [0u8; 512];
    let Some(s) = read_small(&format!("/proc/{pid}/stat"), &mut buf) else {
        return false;
    };
    let Some((_, rest)) = s.rsplit_once(')') else {
        return false;
    };
    let mut fields = rest.split_whitespace();
    let zombie = fields.next() == Some("Z");
    let st: u64 = rest
        .split_whitespace()
        .nth(19)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    !zombie && (start_time == 0 || st == start_time)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_stable() {
        assert_eq!(HEADER_SIZE, 64);
        assert_eq!(std::mem::size_of::<DeviceState>(), 128);
        assert_eq!(FILE_SIZE % 64, 0);
    }

    #[test]
    fn a_view_follows_the_file_and_never_writes_it() {
        let dir = tempfile::tempdir().unwrap();
        let st = State::open_or_create(dir.path()).unwrap();
        let path = dir.path().join(STATE_FILE);
        let view = State::open_view(&path).unwrap();
        assert!(st.reserve(0, 100));
        assert_eq!(
            view.device(0).used.load(Acquire),
            100,
            "updates are visible"
        );
        view.device(1).used.store(7, Release);
        assert_eq!(
            st.device(1).used.load(Acquire),
            0,
            "the view's writes stay private"
        );
        assert_eq!(
            State::open_existing(&path)
                .unwrap()
                .device(1)
                .used
                .load(Acquire),
            0
        );
        let bad = dir.path().join("short");
        std::fs::write(&bad, b"x").unwrap();
        assert!(State::open_view(&bad).is_err());
    }

    #[test]
    fn quota_is_never_exceeded_under_contention() {
        let dir = tempfile::tempdir().unwrap();
        let st = std::sync::Arc::new(State::open_or_create(dir.path()).unwrap());
        st.device(0).quota.store(1000, Release);
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let st = st.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        if st.reserve(0, 7) {
                            assert!(st.device(0).used.load(Acquire) <= 1000);
                            st.release(0, 7);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(st.device(0).used.load(Acquire), 0);
        assert!(st.device(0).peak.load(Acquire) <= 1000);
        assert!(!st.reserve(0, 1001));
    }

    #[test]
    fn second_open_sees_the_same_state_and_bad_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let a = State::open_or_create(dir.path()).unwrap();
        a.device(1).quota.store(5, Release);
        let b = State::open_or_create(dir.path()).unwrap();
        assert_eq!(b.device(1).quota.load(Acquire), 5);
        // Wrong version.
        let p = dir.path().join(STATE_FILE);
        let mut bytes = std::fs::read(&p).unwrap();
        bytes[8] = 99;
        let bad = tempfile::tempdir().unwrap();
        std::fs::write(bad.path().join(STATE_FILE), &bytes).unwrap();
        let e = State::open_or_create(bad.path()).err().unwrap();
        assert!(e.0.contains("another libshare version"), "{e}");
        // Truncated.
        std::fs::write(bad.path().join(STATE_FILE), &bytes[..100]).unwrap();
        assert!(State::open_or_create(bad.path())
            .err()
            .unwrap()
            .0
            .contains("truncated"));
    }

    #[test]
    fn dead_process_memory_returns_to_the_quota() {
        let dir = tempfile::tempdir().unwrap();
        let st = State::open_or_create(dir.path()).unwrap();
        st.device(0).quota.store(100, Release);
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let slot = st.claim_slot(child.id()).unwrap();
        assert!(st.reserve(0, 60));
        st.slot(slot).used[0].store(60, Release);
        assert!(!st.reserve(0, 60), "quota is full");
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(st.reclaim_dead(), 1);
        assert_eq!(st.device(0).used.load(Acquire), 0);
        assert!(st.reserve(0, 60));
    }
}
