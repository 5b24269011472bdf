//! The simulated machine's shared state: one file per state directory, mapped by every process
//! that uses the simulated GPU. It holds, per device, the timelines (compute and the two copy
//! engines), the compute engine's scheduler between processes (`crate::sched`), memory use,
//! counters, a utilisation window, one slot per process and the residency table of
//! managed-memory chunks. Everything in it is an atomic; a process that dies leaves its
//! slot behind, and the next process to register (or to run out of memory) reclaims it.

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};

pub const MAGIC: u64 = 0x5349_4d47_5055_0007; // "SIMGPU" v7
pub const MAX_DEVICES: usize = 16;
/// Processes that may use the simulated GPU at once. A real driver sets no such limit at
/// `cuInit` (hundreds of processes may initialise at once on a node), so it is generous; scans
/// over processes stop at `Header::slots_hwm`, so it costs nothing until used.
pub const MAX_PROCS: usize = 1024;
pub const CHUNK: u64 = 2 << 20;
/// Utilisation window: `BUCKETS` buckets of `BUCKET_NS`.
pub const BUCKETS: usize = 64;
pub const BUCKET_NS: u64 = 16_000_000;

#[repr(C)]
pub struct Header {
    pub magic: AtomicU64,
    pub ndev: u32,
    pub chunks_per_dev: u32,
    pub size: u64,
    /// One past the highest process slot ever claimed: slots at or above it were never used.
    pub slots_hwm: AtomicU32,
    _pad: u32,
}

/// Busy time per time bucket, for utilisation over the last second.
#[repr(C)]
pub struct BusyWindow {
    epoch: [AtomicU64; BUCKETS],
    busy: [AtomicU64; BUCKETS],
}

impl BusyWindow {
    /// Adds the busy interval [start, end) (ns, CLOCK_MONOTONIC).
    pub fn add(&self, start: u64, end: u64) {
        self.add_spread(start, end, end.saturating_sub(start));
    }

    /// Adds `amount` spread evenly over [start, end) (an instant if they are equal): bytes over
    /// the interval a transfer took, for a throughput.
    pub fn add_spread(&self, start: u64, end: u64, amount: u64) {
        let end = end.max(start + 1);
        let span = end - start;
        let (first, last) = (start / BUCKET_NS, (end - 1) / BUCKET_NS);
        for b in first.max(last.saturating_sub(BUCKETS as u64 - 1))..=last {
            let i = (b % BUCKETS as u64) as usize;
            let e = self.epoch[i].load(Acquire);
            if e != b {
                if e > b {
                    continue; // stale interval
                }
                if self.epoch[i]
                    .compare_exchange(e, b, AcqRel, Acquire)
                    .is_ok()
                {
                    self.busy[i].store(0, Release);
                }
            }
            let lo = start.max(b * BUCKET_NS);
            let hi = end.min((b + 1) * BUCKET_NS);
            let part = amount as u128 * hi.saturating_sub(lo) as u128 / span as u128;
            self.busy[i].fetch_add(part as u64, AcqRel);
        }
    }

    /// Amount per second over the buckets that cover [now - window, now], counted from the
    /// start of the first of them (so a window shorter than a bucket still averages over one).
    pub fn rate(&self, now: u64, window: u64) -> u64 {
        let first = now.saturating_sub(window) / BUCKET_NS;
        let mut sum = 0u128;
        for b in first..=now / BUCKET_NS {
            let i = (b % BUCKETS as u64) as usize;
            if self.epoch[i].load(Acquire) == b {
                sum += self.busy[i].load(Acquire) as u128;
            }
        }
        let span = now.saturating_sub(first * BUCKET_NS).max(1);
        (sum * 1_000_000_000 / span as u128) as u64
    }

    /// Fraction (0..=1) of [now - window, now) that was busy.
    pub fn utilisation(&self, now: u64, window: u64) -> f64 {
        let from = now.saturating_sub(window);
        let mut busy = 0u64;
        for b in from / BUCKET_NS..=now / BUCKET_NS {
            let i = (b % BUCKETS as u64) as usize;
            if self.epoch[i].load(Acquire) == b {
                busy += self.busy[i].load(Acquire);
            }
        }
        (busy as f64 / window.max(1) as f64).min(1.0)
    }
}

/// The compute engine's scheduler state (`crate::sched`), changed only under `lock`.
#[repr(C)]
pub struct SchedShared {
    /// Pid of the process that holds the lock, 0 = free. A dead holder's lock is taken over.
    pub lock: AtomicU32,
    /// Slot + 1 of the owning context, 0 = none.
    pub owner: AtomicU32,
    /// Slot + 1 of the context that owned the engine last, 0 = none.
    pub last: AtomicU32,
    pub slice_end: AtomicU64,
    pub free_at: AtomicU64,
}

#[repr(C)]
pub struct DevState {
    pub sched: SchedShared,
    /// Modelled time (ns) until which each copy engine is reserved.
    pub h2d_busy_until: AtomicU64,
    pub d2h_busy_until: AtomicU64,
    pub mem_total: AtomicU64,
    /// Device memory in use: allocations plus resident managed chunks.
    pub mem_used: AtomicU64,
    /// Highest `mem_used` seen.
    pub mem_peak: AtomicU64,
    pub kernels: AtomicU64,
    pub busy_ns: AtomicU64,
    pub allocs: AtomicU64,
    pub frees: AtomicU64,
    pub copies: AtomicU64,
    pub copy_bytes: AtomicU64,
    pub migrated_bytes: AtomicU64,
    pub evicted_bytes: AtomicU64,
    pub window: BusyWindow,
    /// Bytes over PCIe (copies, managed-memory migrations and remote reads), by the modelled
    /// interval they moved in: received by the device (host to device) and sent by it.
    pub pcie_rx: BusyWindow,
    pub pcie_tx: BusyWindow,
}

#[repr(C)]
pub struct ProcDev {
    /// Scheduler: 0, or the modelled time from which this process waits for the compute engine.
    pub waiting: AtomicU64,
    /// Scheduler: compute operations this process has enqueued and not completed (incremented
    /// by the enqueuing host thread before the operation is queued, so a slice-end decision
    /// that sees 0 knows the process has no unregistered work; see `sched::SchedState::quiet`).
    pub queued: AtomicU64,
    pub mem_used: AtomicU64,
    pub kernels: AtomicU64,
    pub busy_ns: AtomicU64,
    pub allocs: AtomicU64,
    pub window: BusyWindow,
}

/// Who holds a process slot. Kept in one dense table apart from the slots, so that the scans
/// over every slot (claiming one, reclaiming the dead) touch a few pages, not one per slot.
#[repr(C)]
pub struct ProcId {
    pub pid: AtomicU32,
    _pad: u32,
    /// Start time of the process (clock ticks since boot, /proc/<pid>/stat field 22), so a
    /// reused pid is not mistaken for the original owner.
    pub start_time: AtomicU64,
}

#[repr(C)]
pub struct ProcSlot {
    pub generation: AtomicU32,
    /// Futex word the process's engine thread sleeps on; bumped (and woken) by anyone who has
    /// work for it, including other processes' scheduling decisions.
    pub wake: AtomicU32,
    pub dev: [ProcDev; MAX_DEVICES],
}

/// One device-resident 2 MiB chunk of managed memory.
#[repr(C)]
pub struct ChunkEntry {
    /// 0 = free, else `owner_word(slot, generation)`.
    pub owner: AtomicU64,
    /// The owner's chunk id (process-local).
    pub tag: AtomicU64,
    pub last_use: AtomicU64,
}

pub fn owner_word(slot: usize, generation: u32) -> u64 {
    ((slot as u64 + 1) << 32) | generation as u64
}

pub struct Shared {
    base: *mut u8,
    len: usize,
    pub ndev: usize,
    pub chunks_per_dev: usize,
    /// The state file, kept open for the life of the process (never closed: closing any
    /// descriptor of the file would drop this process's slot locks); close-on-exec.
    fd: libc::c_int,
}

/// The slots this process holds the lock of (a process never sees its own locks with F_GETLK;
/// shared by every `Shared` of the process: the driver's and NVML's).
static OWNED: [AtomicU64; MAX_PROCS.div_ceil(64)] =
    [const { AtomicU64::new(0) }; MAX_PROCS.div_ceil(64)];

fn owned(i: usize) -> bool {
    OWNED[i / 64].load(Acquire) & (1 << (i % 64)) != 0
}

/// Slot `i` is owned by a POSIX record lock on byte `SLOT_LOCK_BASE + i` of the state file
/// (past its end, which POSIX allows), held by the slot's process. The kernel drops it when the
/// process dies and, the descriptor being close-on-exec, when it execs — as a GPU's driver frees
/// a process's memory when its device files close. A process never sees its own locks.
const SLOT_LOCK_BASE: i64 = 1 << 40;

fn slot_lock(kind: libc::c_int, i: usize) -> libc::flock {
    // SAFETY: `flock` is plain data; all-zero is a valid value of every field.
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = kind as libc::c_short;
    l.l_whence = libc::SEEK_SET as libc::c_short;
    l.l_start = SLOT_LOCK_BASE + i as i64;
    l.l_len = 1;
    l
}

// SAFETY: `base` is a mapping owned by this Shared (unmapped only in Drop), not tied to the
// creating thread.
unsafe impl Send for Shared {}
// SAFETY: shared access goes through `&Header`/`&DevState`/`&ProcSlot`/`&[ChunkEntry]`, whose
// mutable fields are atomics; Header's plain fields are written once in `open`, under the file
// lock and before MAGIC is published and before the Shared is returned.
unsafe impl Sync for Shared {}

const fn align(x: usize) -> usize {
    (x + 63) & !63
}

impl Shared {
    /// Offsets of the device states, the process ids, the process slots and the chunk tables,
    /// and the file's size.
    fn layout(ndev: usize, chunks: usize) -> (usize, usize, usize, usize, usize) {
        let dev_off = align(std::mem::size_of::<Header>());
        let id_off = dev_off + align(std::mem::size_of::<DevState>()) * MAX_DEVICES;
        let proc_off = id_off + align(std::mem::size_of::<ProcId>() * MAX_PROCS);
        let chunk_off = proc_off + align(std::mem::size_of::<ProcSlot>()) * MAX_PROCS;
        let size = chunk_off + std::mem::size_of::<ChunkEntry>() * chunks * ndev;
        (dev_off, id_off, proc_off, chunk_off, size)
    }

    /// Opens (creating and initialising if needed) the state file for `mem` (bytes per device).
    pub fn open(dir: &Path, mem: &[u64]) -> Result<Shared, String> {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create state dir {}: {e}", dir.display()))?;
        let path = dir.join("simgpu.state");
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        let fd = f.as_raw_fd();
        // SAFETY: `fd` belongs to `f`, open for this whole function; flock only takes an advisory
        // lock on it, which serialises initialisation between processes.
        unsafe { libc::flock(fd, libc::LOCK_EX) };
        let ndev = mem.len().min(MAX_DEVICES);
        let want_chunks = mem
            .iter()
            .map(|m| m.div_ceil(CHUNK) as usize)
            .max()
            .unwrap_or(1);
        let mut hdr = [0u8; std::mem::size_of::<Header>()];
        let existing = {
            use std::os::unix::fs::FileExt;
            f.read_exact_at(&mut hdr, 0).is_ok()
                && u64::from_ne_bytes(hdr[0..8].try_into().unwrap()) == MAGIC
        };
        let (ndev, chunks) = if existing {
            let n = u32::from_ne_bytes(hdr[8..12].try_into().unwrap()) as usize;
            let c = u32::from_ne_bytes(hdr[12..16].try_into().unwrap()) as usize;
            (n, c)
        } else {
            (ndev, want_chunks)
        };
        let (.., size) = Self::layout(ndev.min(MAX_DEVICES), chunks);
        if existing {
            // Never map past the end of a truncated or foreign file (access would be SIGBUS).
            let len = f.metadata().map(|m| m.len()).unwrap_or(0);
            if ndev == 0 || ndev > MAX_DEVICES || len < size as u64 {
                // SAFETY: releases the lock taken above on `f`'s still-open descriptor.
                unsafe { libc::flock(fd, libc::LOCK_UN) };
                return Err(format!(
                    "{} is corrupt or truncated ({len} bytes, {ndev} devices): remove it (or use \
                     another SIMGPU_STATE_DIR)",
                    path.display()
                ));
            }
        }
        if !existing {
            // Every user may use the simulated GPU, as NVIDIA's device files are 0666 by default
            // (`NVreg_DeviceFileMode`), whatever the umask of the process that came first.
            // SAFETY: fchmod on `f`'s open descriptor.
            unsafe { libc::fchmod(fd, 0o666) };
            f.set_len(0).ok();
            f.set_len(size as u64)
                .map_err(|e| format!("cannot size {}: {e}", path.display()))?;
        }
        // SAFETY: a new shared mapping (null hint) of `size` bytes of `f`, checked against
        // MAP_FAILED. A fresh file was just sized to `size`; an existing one was checked above to
        // be at least that long.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            // SAFETY: releases the lock taken above on `f`'s still-open descriptor.
            unsafe { libc::flock(fd, libc::LOCK_UN) };
            return Err(format!("cannot map {}", path.display()));
        }
        let s = Shared {
            base: base as *mut u8,
            len: size,
            ndev,
            chunks_per_dev: chunks,
            fd,
        };
        if !existing {
            // SAFETY: `base` is the page-aligned mapping just made, at least a Header long; we
            // hold the init lock and MAGIC is not published, so no other process reads these plain
            // fields, and no `&Header` exists yet in this one (it is taken only below).
            unsafe {
                let hp = base as *mut Header;
                (*hp).ndev = ndev as u32;
                (*hp).chunks_per_dev = chunks as u32;
                (*hp).size = size as u64;
            }
            let h = s.header();
            for (i, m) in mem.iter().take(ndev).enumerate() {
                s.dev(i).mem_total.store(*m, Release);
            }
            h.magic.store(MAGIC, Release);
        }
        // SAFETY: releases the lock taken above on `f`'s still-open descriptor.
        unsafe { libc::flock(fd, libc::LOCK_UN) };
        // Kept open (see `fd`): the descriptor now belongs to `s`, for the life of the process.
        let _ = std::os::fd::IntoRawFd::into_raw_fd(f);
        Ok(s)
    }

    /// Device memory in use on `dev`, less what slots being released (their process gone) still
    /// count.
    pub fn mem_used_by_live(&self, dev: usize) -> u64 {
        let releasing: u64 = (0..self.slots_in_use())
            .filter(|&i| self.id(i).pid.load(Acquire) == slots::RELEASING)
            .map(|i| self.slot(i).dev[dev].mem_used.load(Acquire))
            .sum();
        self.dev(dev)
            .mem_used
            .load(Acquire)
            .saturating_sub(releasing)
    }

    /// Whether another process holds slot `i`'s lock.
    fn slot_locked_by_other(&self, i: usize) -> bool {
        let mut l = slot_lock(libc::F_WRLCK, i);
        // SAFETY: F_GETLK on our open descriptor with a live, initialised `flock` to update.
        let r = unsafe { libc::fcntl(self.fd, libc::F_GETLK, &mut l) };
        r == 0 && l.l_type != libc::F_UNLCK as libc::c_short
    }

    fn header(&self) -> &Header {
        // SAFETY: offset 0 of the page-aligned mapping owned by `self` (alive for the borrow),
        // at least size_of::<Header>() long; Header's plain fields are not written after `open`.
        unsafe { &*(self.base as *const Header) }
    }

    pub fn dev(&self, i: usize) -> &DevState {
        assert!(i < self.ndev);
        let (dev_off, ..) = Self::layout(self.ndev, self.chunks_per_dev);
        // SAFETY: `i < ndev` (asserted) and `layout` places MAX_DEVICES >= ndev 64-aligned DevStates
        // inside the mapping owned by `self`; all fields are atomics, valid for any bit pattern.
        unsafe {
            &*(self
                .base
                .add(dev_off + i * align(std::mem::size_of::<DevState>()))
                as *const DevState)
        }
    }

    /// Who holds slot `i`.
    pub fn id(&self, i: usize) -> &ProcId {
        assert!(i < MAX_PROCS);
        let (_, id_off, ..) = Self::layout(self.ndev, self.chunks_per_dev);
        // SAFETY: as for dev(): `i < MAX_PROCS` ProcIds (16 bytes, 8-aligned) from the 64-aligned
        // `id_off`, inside the mapping.
        unsafe { &*(self.base.add(id_off + i * std::mem::size_of::<ProcId>()) as *const ProcId) }
    }

    pub fn slot(&self, i: usize) -> &ProcSlot {
        assert!(i < MAX_PROCS);
        let (_, _, proc_off, ..) = Self::layout(self.ndev, self.chunks_per_dev);
        // SAFETY: as for dev().
        unsafe {
            &*(self
                .base
                .add(proc_off + i * align(std::mem::size_of::<ProcSlot>()))
                as *const ProcSlot)
        }
    }

    pub fn chunks(&self, dev: usize) -> &[ChunkEntry] {
        assert!(dev < self.ndev);
        let (.., chunk_off, _) = Self::layout(self.ndev, self.chunks_per_dev);
        // SAFETY: as for dev().
        unsafe {
            std::slice::from_raw_parts(
                self.base
                    .add(chunk_off + dev * self.chunks_per_dev * std::mem::size_of::<ChunkEntry>())
                    as *const ChunkEntry,
                self.chunks_per_dev,
            )
        }
    }

    /// Claims a process slot for `pid` (reclaiming slots of dead processes first); returns the
    /// slot and its new generation (which tags the slot's managed chunks).
    pub fn register(&self, pid: u32) -> Option<(usize, u32)> {
        // The claim raises the high-water mark before it publishes the pid, so a scan up to
        // the mark sees the process before it can queue any work.
        let i = self.claim_slot(pid)?;
        Some((i, self.slot(i).generation.load(Acquire)))
    }

    /// Reserves `dur` ns on an engine timeline no earlier than `earliest`; returns (start, end).
    pub fn reserve(timeline: &AtomicU64, earliest: u64, dur: u64) -> (u64, u64) {
        let mut cur = timeline.load(Acquire);
        loop {
            let start = cur.max(earliest);
            match timeline.compare_exchange_weak(cur, start + dur, AcqRel, Acquire) {
                Ok(_) => return (start, start + dur),
                Err(c) => cur = c,
            }
        }
    }
}

/// The scheduler state of one device, locked for one decision (`Shared::lock_sched`).
pub struct SchedGuard<'a> {
    shared: &'a Shared,
    dev: usize,
}

impl Shared {
    /// Takes device `dev`'s scheduler lock. Decisions are short (no sleeping under it); a holder
    /// that died is detected by its pid and the lock taken over.
    pub fn lock_sched(&self, dev: usize) -> SchedGuard<'_> {
        let lock = &self.dev(dev).sched.lock;
        let me = std::process::id();
        let mut tries = 0u32;
        loop {
            match lock.compare_exchange_weak(0, me, Acquire, Relaxed) {
                Ok(_) => break,
                Err(holder) => {
                    tries = tries.wrapping_add(1);
                    if tries < 64 {
                        std::hint::spin_loop();
                        continue;
                    }
                    // A dead holder's lock is taken over; so is a stopped one's (SIGSTOP, a
                    // debugger: a device does not stop with its host): the holder's release
                    // then frees nothing (see Drop), and its decision, if it resumes inside
                    // it, may be overwritten.
                    if tries.is_multiple_of(64)
                        && holder != 0
                        && (!proc_alive(holder, 0) || proc_stopped(holder))
                        && lock.compare_exchange(holder, me, Acquire, Relaxed).is_ok()
                    {
                        break;
                    }
                    if tries < 1024 {
                        // SAFETY: sched_yield takes no arguments and cannot fail.
                        unsafe { libc::sched_yield() };
                    } else {
                        sleep_until(now_ns() + 20_000);
                    }
                }
            }
        }
        SchedGuard { shared: self, dev }
    }

    /// Wakes the engine thread of the process in slot `i`, whichever process that is.
    pub fn wake_slot(&self, i: usize) {
        let w = &self.slot(i).wake;
        w.fetch_add(1, AcqRel);
        futex_wake(w);
    }
}

impl Drop for SchedGuard<'_> {
    fn drop(&mut self) {
        // Only our own lock: it may have been taken over while this process was stopped.
        let _ = self.shared.dev(self.dev).sched.lock.compare_exchange(
            std::process::id(),
            0,
            Release,
            Relaxed,
        );
    }
}

/// Whether process `pid` is stopped (state `T` in `/proc/<pid>/stat`: SIGSTOP, job control; `t`:
/// stopped by a debugger).
fn proc_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with(['T', 't']))
        })
        .unwrap_or(false)
}

fn slot_word(c: Option<usize>) -> u32 {
    c.map_or(0, |c| c as u32 + 1)
}

fn word_slot(w: u32) -> Option<usize> {
    w.checked_sub(1).map(|c| c as usize)
}

impl crate::sched::SchedState for SchedGuard<'_> {
    fn contexts(&self) -> usize {
        self.shared.slots_in_use()
    }
    fn owner(&self) -> Option<usize> {
        word_slot(self.shared.dev(self.dev).sched.owner.load(Acquire))
    }
    fn set_owner(&mut self, c: Option<usize>) {
        let w = slot_word(c);
        self.shared.dev(self.dev).sched.owner.store(w, Release);
    }
    fn last(&self) -> Option<usize> {
        word_slot(self.shared.dev(self.dev).sched.last.load(Acquire))
    }
    fn set_last(&mut self, c: Option<usize>) {
        let w = slot_word(c);
        self.shared.dev(self.dev).sched.last.store(w, Release);
    }
    fn slice_end(&self) -> u64 {
        self.shared.dev(self.dev).sched.slice_end.load(Acquire)
    }
    fn set_slice_end(&mut self, t: u64) {
        self.shared.dev(self.dev).sched.slice_end.store(t, Release);
    }
    fn free_at(&self) -> u64 {
        self.shared.dev(self.dev).sched.free_at.load(Acquire)
    }
    fn set_free_at(&mut self, t: u64) {
        self.shared.dev(self.dev).sched.free_at.store(t, Release);
    }
    fn waiting(&self, c: usize) -> u64 {
        self.shared.slot(c).dev[self.dev].waiting.load(Acquire)
    }
    fn set_waiting(&mut self, c: usize, ready: u64) {
        self.shared.slot(c).dev[self.dev]
            .waiting
            .store(ready, Release);
    }
    fn alive(&self, c: usize) -> bool {
        let s = self.shared.id(c);
        let pid = s.pid.load(Acquire);
        pid != 0 && proc_alive(pid, s.start_time.load(Acquire))
    }
    fn stopped(&self, c: usize) -> bool {
        let pid = self.shared.id(c).pid.load(Acquire);
        pid != 0 && proc_stopped(pid)
    }
    fn quiet(&self, c: usize) -> bool {
        self.shared.slot(c).dev[self.dev].queued.load(SeqCst) == 0
    }
    fn wake(&mut self, c: usize) {
        self.shared.wake_slot(c);
    }
}

impl slots::SlotTable for Shared {
    fn slot_count(&self) -> usize {
        MAX_PROCS
    }
    /// `Header::slots_hwm`, a garbage value clamped to `MAX_PROCS`.
    fn slots_in_use(&self) -> usize {
        (self.header().slots_hwm.load(SeqCst) as usize).min(MAX_PROCS)
    }
    fn mark_in_use(&self, i: usize) {
        self.header().slots_hwm.fetch_max(i as u32 + 1, SeqCst);
    }
    fn slot_pid(&self, i: usize) -> &AtomicU32 {
        &self.id(i).pid
    }
    fn slot_start_time(&self, i: usize) -> &AtomicU64 {
        &self.id(i).start_time
    }
    fn reset_slot(&self, i: usize) {
        // Claimed (its pid is still RELEASING, so nobody judges it): take its lock before the
        // pid is published.
        let l = slot_lock(libc::F_WRLCK, i);
        // SAFETY: F_SETLK on our open descriptor with a live, initialised `flock`.
        unsafe { libc::fcntl(self.fd, libc::F_SETLK, &l) };
        OWNED[i / 64].fetch_or(1 << (i % 64), AcqRel);
        let s = self.slot(i);
        s.generation.fetch_add(1, AcqRel);
        for d in &s.dev {
            d.waiting.store(0, Release);
            d.queued.store(0, Release);
            d.mem_used.store(0, Release);
            d.kernels.store(0, Release);
            d.busy_ns.store(0, Release);
            d.allocs.store(0, Release);
        }
    }
    /// Its pid is alive with its start time (a reused pid is not the same process), and its
    /// lock is held: by this process, or by another one (an exec'd image no longer holds it).
    fn slot_alive(&self, i: usize) -> bool {
        libshare_abi::proc_alive(
            self.id(i).pid.load(Acquire),
            self.id(i).start_time.load(Acquire),
        ) && (owned(i) || self.slot_locked_by_other(i))
    }
    fn free_slot(&self, i: usize) {
        if OWNED[i / 64].fetch_and(!(1 << (i % 64)), AcqRel) & (1 << (i % 64)) != 0 {
            let l = slot_lock(libc::F_UNLCK, i);
            // SAFETY: F_SETLK on our open descriptor with a live, initialised `flock`.
            unsafe { libc::fcntl(self.fd, libc::F_SETLK, &l) };
        }
        let s = self.slot(i);
        let word = owner_word(i, s.generation.load(Acquire));
        for d in 0..self.ndev {
            for c in self.chunks(d) {
                if c.owner.compare_exchange(word, 0, AcqRel, Acquire).is_ok() {
                    self.dev(d).mem_used.fetch_sub(CHUNK, AcqRel);
                }
            }
            let used = s.dev[d].mem_used.swap(0, AcqRel);
            sub_saturating(&self.dev(d).mem_used, used);
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are the mapping this Shared made and owns; `&mut self` means no
        // reference borrowed from it is alive.
        unsafe { libc::munmap(self.base as *mut _, self.len) };
    }
}

pub fn sub_saturating(a: &AtomicU64, v: u64) {
    let _ = a.fetch_update(AcqRel, Acquire, |x| Some(x.saturating_sub(v)));
}

use libshare_abi::slots;
pub use libshare_abi::slots::SlotTable;
pub use libshare_abi::{proc_alive, proc_start_time};

/// CLOCK_MONOTONIC in ns: the modelled clock, shared by all processes of the machine. The one
/// reader of the workspace (libshare-abi's, as the slots and `proc_alive` above).
pub use libshare_abi::rate::now_ns;

/// Sleeps until the absolute CLOCK_MONOTONIC deadline `t` (ns).
pub fn sleep_until(t: u64) {
    let ts = libc::timespec {
        tv_sec: (t / 1_000_000_000) as _,
        tv_nsec: (t % 1_000_000_000) as _,
    };
    // SAFETY: valid timespec; EINTR is retried.
    while unsafe {
        libc::clock_nanosleep(
            libc::CLOCK_MONOTONIC,
            libc::TIMER_ABSTIME,
            &ts,
            std::ptr::null_mut(),
        )
    } == libc::EINTR
    {}
}

/// Wakes every thread (of any process) sleeping in `futex_wait` on `w`.
pub fn futex_wake(w: &AtomicU32) {
    // SAFETY: FUTEX_WAKE only reads the address of `w`, a live u32 (shared futex: no
    // FUTEX_PRIVATE_FLAG, since waiters may be in other processes mapping the same file).
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            w.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
        )
    };
}

/// Sleeps while `w` holds `val`, until woken or until the absolute CLOCK_MONOTONIC `deadline`
/// (ns; None = no deadline). May return early (signals, spurious wake-ups): callers re-check.
pub fn futex_wait(w: &AtomicU32, val: u32, deadline: Option<u64>) {
    let ts = deadline.map(|t| libc::timespec {
        tv_sec: (t / 1_000_000_000) as _,
        tv_nsec: (t % 1_000_000_000) as _,
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: FUTEX_WAIT_BITSET reads the u32 behind `w` (live) and `tsp` (NULL or a timespec on
    // this stack frame), an absolute CLOCK_MONOTONIC time; the bitset matches every waker.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            w.as_ptr(),
            libc::FUTEX_WAIT_BITSET,
            val,
            tsp,
            std::ptr::null::<u32>(),
            libc::FUTEX_BITSET_MATCH_ANY,
        )
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `tests/src/lib.rs` (`SimGpu::sim_mem_peak`) reads the state file by these offsets.
    #[test]
    fn dev_state_layout() {
        assert_eq!(MAGIC, 0x5349_4d47_5055_0007);
        assert_eq!(align(std::mem::size_of::<Header>()), 64);
        assert_eq!(align(std::mem::size_of::<DevState>()), 3264);
        assert_eq!(std::mem::offset_of!(DevState, mem_total), 6 * 8);
        assert_eq!(std::mem::offset_of!(DevState, mem_used), 7 * 8);
        assert_eq!(std::mem::offset_of!(DevState, mem_peak), 8 * 8);
    }

    #[test]
    fn a_byte_window_spreads_bytes_over_their_interval_and_forgets_them() {
        // SAFETY: all-zero is a valid BusyWindow (atomics only).
        let w: BusyWindow = unsafe { std::mem::zeroed() };
        let t = 100 * BUCKET_NS;
        w.add_spread(t, t + BUCKET_NS, 1_000_000); // 1 MB over one bucket (16 ms)
        let rate = w.rate(t + BUCKET_NS - 1, BUCKET_NS / 2);
        assert!((62_000_000..=63_000_000).contains(&rate), "{rate} B/s");
        assert_eq!(w.rate(t + 10 * BUCKET_NS, 20_000_000), 0);
    }

    #[test]
    fn a_dead_lock_holder_is_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let s = Shared::open(dir.path(), &[1 << 30]).unwrap();
        // A pid that does not exist holds device 0's scheduler lock.
        s.dev(0).sched.lock.store(u32::MAX - 7, Release);
        let t = now_ns();
        drop(s.lock_sched(0));
        assert!(
            now_ns() - t < 1_000_000_000,
            "took the lock over too slowly"
        );
        assert_eq!(s.dev(0).sched.lock.load(Acquire), 0);
    }

    #[test]
    fn reserve_never_overlaps() {
        let t = AtomicU64::new(0);
        let (s1, e1) = Shared::reserve(&t, 100, 50);
        let (s2, e2) = Shared::reserve(&t, 90, 10);
        assert_eq!((s1, e1), (100, 150));
        assert_eq!((s2, e2), (150, 160));
        let (s3, _) = Shared::reserve(&t, 1000, 1);
        assert_eq!(s3, 1000);
    }

    #[test]
    fn state_file_shared_between_opens_and_dead_slots_reclaimed() {
        let dir = tempfile::tempdir().unwrap();
        let a = Shared::open(dir.path(), &[1 << 30]).unwrap();
        let b = Shared::open(dir.path(), &[8 << 30]).unwrap(); // existing file wins
        assert_eq!(b.dev(0).mem_total.load(Acquire), 1 << 30);
        a.dev(0).mem_used.fetch_add(4096, AcqRel);
        assert_eq!(b.dev(0).mem_used.load(Acquire), 4096);
        // A slot owned by a pid that does not exist is reclaimed with its memory.
        let (i, _) = a.register(std::process::id()).unwrap();
        a.mark_in_use(i + 1); // as its claim did
        a.id(i + 1).pid.store(u32::MAX - 7, Release);
        a.slot(i + 1).dev[0].mem_used.store(4096, Release);
        assert_eq!(b.reclaim_dead(), 1);
        assert_eq!(a.dev(0).mem_used.load(Acquire), 0);
        assert_eq!(b.live_slots(), vec![(i, std::process::id())]);
    }

    #[test]
    fn a_truncated_state_file_is_an_error_not_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        drop(Shared::open(dir.path(), &[1 << 30]).unwrap());
        let path = dir.path().join("simgpu.state");
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(4096).unwrap(); // keeps a valid header, loses the rest
        let err = Shared::open(dir.path(), &[1 << 30])
            .err()
            .expect("an error");
        assert!(err.contains("truncated"), "{err}");
    }

    #[test]
    fn busy_window_reports_utilisation() {
        // SAFETY: BusyWindow is made of atomics, for which all-zero bytes are a valid value.
        let w: BusyWindow = unsafe { std::mem::zeroed() };
        let now = 100 * BUCKET_NS;
        w.add(now - 500_000_000, now - 250_000_000);
        let u = w.utilisation(now, 1_000_000_000);
        assert!((u - 0.25).abs() < 0.02, "{u}");
    }
}
