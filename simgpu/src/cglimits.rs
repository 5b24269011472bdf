//! Per-cgroup device-memory limits, as NVIDIA's drivers from r615 take them through NVML
//! (`nvmlDeviceSetMemoryLimits_v1` / `nvmlDeviceGetMemoryLimits_v1`; the structures are in
//! `nvml.rs`). A limit names a cgroup by the full path of its sysfs directory
//! (`/sys/fs/cgroup/...`); an allocation by a process in that cgroup (or one below it) fails with
//! `CUDA_ERROR_OUT_OF_MEMORY` when the device memory all of that cgroup's live processes hold
//! would exceed the hard limit. Removing the cgroup clears its limits.
//!
//! The table lives in its own file beside the state file (`<state dir>/simgpu.cglimits`, 0666
//! like the device files), so every process of the simulated machine sees the limits root set.
//! A process's cgroup is read from `/proc/<pid>/cgroup` when a limit exists: the cgroup v2 line
//! (`0::/p` → `/sys/fs/cgroup/p`) or, on a host without cgroup v2 (this test machine), a v1
//! hierarchy's line (`N:pids:/p` → `/sys/fs/cgroup/pids/p`). Nothing is read, and nothing costs
//! more than one relaxed load, while no limit is set.

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};
use std::sync::OnceLock;

use crate::shared::{Shared, MAX_DEVICES};
use libshare_abi::SlotTable;

const MAGIC: u64 = 0x5349_4d43_474c_0001; // "SIMCGL" v1
/// Cgroups that may have limits at once.
pub const MAX_ENTRIES: usize = 256;
/// Longest namespace path (bytes).
pub const MAX_PATH: usize = 512;
/// "No limit" for a hard limit (`NVML_DEVICE_MEMORY_LIMIT_MAX`: assumed to be ULLONG_MAX).
pub const NO_LIMIT: u64 = u64::MAX;

#[repr(C)]
struct Header {
    magic: AtomicU64,
    /// Entries in use (some may be free again): 0 = no limit anywhere.
    entries: AtomicU32,
    _pad: u32,
}

#[repr(C)]
struct Entry {
    /// Odd while being written; 0 = free.
    seq: AtomicU32,
    len: AtomicU32,
    path: [AtomicU64; MAX_PATH / 8],
    soft: [AtomicU64; MAX_DEVICES],
    hard: [AtomicU64; MAX_DEVICES],
}

const SIZE: usize = std::mem::size_of::<Header>() + std::mem::size_of::<Entry>() * MAX_ENTRIES;

pub struct Limits {
    base: *mut u8,
    fd: libc::c_int,
}

// SAFETY: the mapping is never unmapped and is accessed only through atomics.
unsafe impl Send for Limits {}
// SAFETY: as above.
unsafe impl Sync for Limits {}

/// The table of `dir`, mapped once per process (None while it does not exist and `create` is
/// false).
pub fn table(dir: &Path, create: bool) -> Option<&'static Limits> {
    static T: OnceLock<Limits> = OnceLock::new();
    if let Some(t) = T.get() {
        return Some(t);
    }
    let l = Limits::open(dir, create)?;
    Some(T.get_or_init(|| l))
}

impl Limits {
    fn open(dir: &Path, create: bool) -> Option<Limits> {
        let path = dir.join("simgpu.cglimits");
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .open(path)
            .ok()?;
        let fd = f.as_raw_fd();
        // SAFETY: advisory lock on `f`'s open descriptor, serialising initialisation.
        unsafe { libc::flock(fd, libc::LOCK_EX) };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        if len < SIZE as u64 {
            // SAFETY: fchmod on `f`'s open descriptor (every user reads the limits, as the
            // device files are 0666).
            unsafe { libc::fchmod(fd, 0o666) };
            if f.set_len(SIZE as u64).is_err() {
                // SAFETY: releases the lock above.
                unsafe { libc::flock(fd, libc::LOCK_UN) };
                return None;
            }
        }
        // SAFETY: a new shared mapping of SIZE bytes of `f` (sized above), checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            // SAFETY: releases the lock above.
            unsafe { libc::flock(fd, libc::LOCK_UN) };
            return None;
        }
        let l = Limits {
            base: base as *mut u8,
            fd: std::os::fd::IntoRawFd::into_raw_fd(f),
        };
        let h = l.header();
        if h.magic.load(Acquire) != MAGIC {
            h.magic.store(MAGIC, Release);
        }
        // SAFETY: releases the lock above (the descriptor stays open for the process's life).
        unsafe { libc::flock(l.fd, libc::LOCK_UN) };
        Some(l)
    }

    fn header(&self) -> &Header {
        // SAFETY: offset 0 of the page-aligned mapping of SIZE bytes; atomics only.
        unsafe { &*(self.base as *const Header) }
    }

    fn entry(&self, i: usize) -> &Entry {
        assert!(i < MAX_ENTRIES);
        // SAFETY: inside the mapping (SIZE covers MAX_ENTRIES entries), 8-aligned; atomics only.
        unsafe {
            &*(self
                .base
                .add(std::mem::size_of::<Header>() + i * std::mem::size_of::<Entry>())
                as *const Entry)
        }
    }

    /// Whether any limit was ever set (one relaxed load: the allocation path's fast exit).
    pub fn any(&self) -> bool {
        self.header().entries.load(Relaxed) > 0
    }

    /// A consistent copy of entry `i`: its path, soft and hard limits of `dev`.
    fn read(&self, i: usize, dev: usize) -> Option<(String, u64, u64)> {
        let e = self.entry(i);
        loop {
            let s = e.seq.load(Acquire);
            if s == 0 {
                return None;
            }
            if s % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let len = (e.len.load(Acquire) as usize).min(MAX_PATH);
            let bytes: Vec<u8> = e
                .path
                .iter()
                .flat_map(|w| w.load(Acquire).to_ne_bytes())
                .take(len)
                .collect();
            let (soft, hard) = (e.soft[dev].load(Acquire), e.hard[dev].load(Acquire));
            if e.seq.load(Acquire) == s {
                return Some((String::from_utf8_lossy(&bytes).into_owned(), soft, hard));
            }
        }
    }

    /// The limits of namespace `ns` on `dev`: (soft, hard); (0, NO_LIMIT) when none is set.
    pub fn get(&self, ns: &str, dev: usize) -> (u64, u64) {
        let n = (self.header().entries.load(Acquire) as usize).min(MAX_ENTRIES);
        (0..n)
            .filter_map(|i| self.read(i, dev))
            .find(|(p, ..)| p == ns)
            .map_or((0, NO_LIMIT), |(_, s, h)| (s, h))
    }

    /// Sets (or, with soft 0 and hard NO_LIMIT on every device, clears) the limits of `ns` on
    /// `dev`. Writers are serialised by a lock on the file.
    pub fn set(&self, ns: &str, dev: usize, soft: u64, hard: u64) -> bool {
        // SAFETY: advisory lock on our open descriptor.
        unsafe { libc::flock(self.fd, libc::LOCK_EX) };
        let n = (self.header().entries.load(Acquire) as usize).min(MAX_ENTRIES);
        // Entries of removed cgroups are cleared with them (as the driver does).
        for i in 0..n {
            if let Some((p, ..)) = self.read(i, 0) {
                if !Path::new(&p).is_dir() {
                    self.entry(i).seq.store(0, Release);
                }
            }
        }
        let found = (0..n).find(|&i| self.read(i, 0).is_some_and(|(p, ..)| p == ns));
        let slot =
            found.or_else(|| (0..MAX_ENTRIES).find(|&i| self.entry(i).seq.load(Acquire) == 0));
        let ok = if let Some(i) = slot {
            let e = self.entry(i);
            let fresh = found.is_none();
            let s = if fresh { 1 } else { e.seq.load(Acquire) + 1 };
            e.seq.store(s, Release);
            if fresh {
                let mut bytes = [0u8; MAX_PATH];
                bytes[..ns.len()].copy_from_slice(ns.as_bytes());
                for (w, chunk) in e.path.iter().zip(bytes.chunks(8)) {
                    w.store(u64::from_ne_bytes(chunk.try_into().unwrap()), Release);
                }
                e.len.store(ns.len() as u32, Release);
                for d in 0..MAX_DEVICES {
                    e.soft[d].store(0, Release);
                    e.hard[d].store(NO_LIMIT, Release);
                }
            }
            e.soft[dev].store(soft, Release);
            e.hard[dev].store(hard, Release);
            let cleared = (0..MAX_DEVICES)
                .all(|d| e.soft[d].load(Acquire) == 0 && e.hard[d].load(Acquire) == NO_LIMIT);
            e.seq.store(if cleared { 0 } else { s + 1 }, Release);
            self.header().entries.fetch_max(i as u32 + 1, AcqRel);
            true
        } else {
            false
        };
        // SAFETY: releases the lock above.
        unsafe { libc::flock(self.fd, libc::LOCK_UN) };
        ok
    }

    /// The hard limits on `dev` that apply to a process whose cgroup file reads `cgroups`:
    /// (namespace, hard limit) of every limited cgroup it is in or below.
    pub fn applying(&self, cgroups: &str, dev: usize) -> Vec<(String, u64)> {
        let mine = sysfs_paths(cgroups);
        let n = (self.header().entries.load(Acquire) as usize).min(MAX_ENTRIES);
        (0..n)
            .filter_map(|i| self.read(i, dev))
            .filter(|(p, _, h)| *h != NO_LIMIT && mine.iter().any(|m| within(m, p)))
            .map(|(p, _, h)| (p, h))
            .collect()
    }
}

/// Whether cgroup directory `path` is `ns` or below it.
fn within(path: &Path, ns: &str) -> bool {
    path.starts_with(ns)
}

/// The sysfs directories of the cgroups a `/proc/<pid>/cgroup` text names.
pub fn sysfs_paths(cgroups: &str) -> Vec<PathBuf> {
    cgroups
        .lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, ':');
            let (id, ctrl, path) = (it.next()?, it.next()?, it.next()?);
            let rel = path.trim_start_matches('/');
            Some(if id == "0" && ctrl.is_empty() {
                Path::new("/sys/fs/cgroup").join(rel)
            } else {
                let ctrl = ctrl.strip_prefix("name=").unwrap_or(ctrl);
                Path::new("/sys/fs/cgroup").join(ctrl).join(rel)
            })
        })
        .collect()
}

/// Device memory on `dev` held by the live processes whose cgroup is `ns` or below it.
pub fn used_in(shared: &Shared, ns: &str, dev: usize) -> u64 {
    shared
        .live_slots()
        .into_iter()
        .filter(|(_, pid)| {
            std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                .is_ok_and(|t| sysfs_paths(&t).iter().any(|p| within(p, ns)))
        })
        .map(|(slot, _)| shared.slot(slot).dev[dev].mem_used.load(Acquire))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_lines_map_to_their_sysfs_directories() {
        let p = sysfs_paths("0::/kubepods/pod1/c1\n8:pids:/t/a\n9:name=systemd:/\n");
        assert_eq!(
            p,
            [
                PathBuf::from("/sys/fs/cgroup/kubepods/pod1/c1"),
                PathBuf::from("/sys/fs/cgroup/pids/t/a"),
                PathBuf::from("/sys/fs/cgroup/systemd"),
            ]
        );
        assert!(within(&p[1], "/sys/fs/cgroup/pids/t"));
        assert!(within(&p[1], "/sys/fs/cgroup/pids/t/a"));
        assert!(!within(&p[1], "/sys/fs/cgroup/pids/t/ab"));
    }

    #[test]
    fn limits_are_set_read_back_and_cleared() {
        let dir = tempfile::tempdir().unwrap();
        let l = Limits::open(dir.path(), true).unwrap();
        assert!(!l.any());
        let ns = dir.path().to_str().unwrap(); // an existing directory
        assert!(l.set(ns, 1, 1 << 20, 4 << 20));
        assert_eq!(l.get(ns, 1), (1 << 20, 4 << 20));
        assert_eq!(l.get(ns, 0), (0, NO_LIMIT));
        assert!(l.any());
        assert!(l.set(ns, 1, 0, NO_LIMIT));
        assert_eq!(l.get(ns, 1), (0, NO_LIMIT));
    }
}
