//! The per-container shared-memory state between `libshare.so` (in every CUDA process of the
//! container) and `sharectl daemon`, defined once here.
//!
//! One file per container, `<container dir>/state.shm`, mapped by every process of the container
//! (and by the daemon). Everything in it is an atomic, so readers need no lock. Layout (all
//! `#[repr(C)]`, little-endian, 64-byte aligned sections):
//!
//! ```text
//! Header                      magic, version, sizes, class, flags, epoch, slots in use
//! DeviceState × MAX_DEVICES   quota, used, peak, counters, rate-control budget
//! ProcSlot    × MAX_PROCS     pid + start time, per-device charged/uncharged bytes, counters,
//!                             GPU time in flight
//! Trailer                     a copy of the epoch (see "Loss of the file's content")
//! ```
//!
//! # Who owns a slot: a held lock
//!
//! A process that claims slot `i` holds a POSIX write lock on byte `FILE_SIZE + i` of the file
//! (past its end: allowed) on a descriptor the [`State`] keeps open, close-on-exec. The kernel
//! drops the lock when the process dies, `kill -9` included, and at `exec`: a slot whose byte
//! nobody holds belongs to nobody, whatever pid it shows (the pid stays for display). A process
//! never judges its own slots (`F_GETLK` does not report one's own locks; the process remembers
//! them, see `lock.rs`) but does reclaim another slot showing its pid: that is its image before
//! `exec`. Hazard: POSIX locks are also dropped when the process closes ANY descriptor of the
//! file. Nothing in this crate closes a descriptor of a file on which the process holds slots
//! (a State dropped while another State of the same process owns slots of the same file leaks
//! its descriptor instead); code outside must never open and close `state.shm` in a process
//! that holds a slot (use the State it has).
//!
//! Slot lifecycle operations (claim, release, reclaim, [`State::recompute_used`]) of all
//! processes are serialised by the lifecycle lock: a write lock on byte `FILE_SIZE + MAX_PROCS`
//! (plus a process-local lock between threads). Charges never take it. It is held for
//! microseconds; a process that cannot get it within 2 s (its holder was stopped or frozen in
//! the middle) skips the clearing and repair rather than hang, and a later call does them.
//!
//! # Charging: correct under `kill -9` at any instruction
//!
//! A slot records what its process charged as two monotonic counters per device, `charged` and
//! `uncharged`; its net is their difference. [`State::charge`] adds to the slot's `charged`
//! FIRST, then reserves in the container's `used` within the quota (one `fetch_update`), and on
//! refusal adds the bytes to `uncharged`. [`State::uncharge`] takes from the container's `used`
//! FIRST, then adds to `uncharged`. So at every instruction each slot's net is at least what it
//! contributed to `used` (`contrib`), and `used = Σ contrib` over all claimed slots, dead ones
//! included, as long as only charges and uncharges run.
//!
//! Repair ([`State::recompute_used`], run by every reclaim under the lifecycle lock) moves
//! `used` to a bound computed from the slots, with no compare-and-swap (so no ABA):
//! 1. read `uncharged` of every claimed slot (times `t_b`), then `u = used` (time `t0`), then
//!    `charged` of every claimed slot (times `t_c`);
//! 2. `Ū = Σ_slots (charged(t_c) − uncharged(t_b))`, then add `Ū − u` to `used` (one
//!    `fetch_add`, or a saturating `fetch_update` if negative).
//!
//! Why the result is never below the truth: let `E = used − Σ contrib` (the excess). Charges and
//! uncharges change `used` and `Σ contrib` by the same amount and a death changes neither, so
//! between `t0` and our update only our own update changes `E` (clearing slots and other repairs
//! wait for the lifecycle lock we hold; a process that gave up waiting for it can still claim or
//! release a slot, so the repair re-reads which slots are claimed after its scans and skips the
//! update if that changed). Counters are monotonic: `contrib(t0) ≤ net(t0) =
//! charged(t0) − uncharged(t0) ≤ charged(t_c) − uncharged(t_b)`, so `Σ contrib(t0) ≤ Ū`. After
//! the update `E' = E(t0) − (u − Ū) = Ū − Σ contrib(t0) ≥ 0`: `used` never drops below what
//! live and dead slots hold, so a dead slot, a half-done charge of a killed process or a garbage
//! slot can never turn into free quota. Convergence: when no charge runs during the scan,
//! `Ū = Σ net` exactly, so `used` becomes `Σ net`: what a killed process left (its slot's net
//! includes a half-done charge, and a half-done uncharge already left `used`) disappears when
//! its slot is cleared; an over-count from charges running during one repair is removed by the
//! next. A repair can also raise `used` (after a truncation lost it, or a garbage value):
//! never below the slots. Reclaiming a dead slot is just clearing it and repairing (no
//! subtraction: the slot's net may exceed what it contributed).
//!
//! # Files: owned, private, checked
//!
//! Directories are created 0700 and files 0600 whatever the umask, every directory on the way is
//! checked (owner root or us, not writable by others unless root's sticky `/tmp`), symlinks and
//! non-regular files are refused, see `fsafe.rs`. The header is fully validated; a wrong
//! version, a corrupt header, a file of another owner or open to others is an error with one
//! line ([`StateError`]); the shim must refuse to run rather than fall back to a private state.
//!
//! # Loss of the file's content
//!
//! - Truncation: the file ends with a copy of the header's `epoch` ([`Trailer`]), which any
//!   truncation removes. Every charge and uncharge loads it (one load): a truncation past it
//!   faults into a SIGBUS handler that restores the size through the held descriptor
//!   (`sigbus.rs`), a process that opens a short file with a valid header restores its size the
//!   same way, and either way the trailer then reads 0. Each process of the container thus
//!   notices the loss at its next charge or uncharge ([`State::recover`]): it rewrites the
//!   header if lost, restores the quotas, class and flags it last saw, re-publishes its own
//!   slots from a process-local copy of their nets, and repairs `used` from the slots. A charge
//!   decided while the quota was lost is refused if the container turns out over quota. Limits:
//!   until a process makes its next call, its memory is not counted (a process that holds memory
//!   and never allocates or frees again stays uncounted); an operation of another thread of the
//!   same process that runs during the re-publication can be counted twice or missed once.
//! - Removal: the file has a second name, `.state.shm.keep`; a process that finds `state.shm`
//!   missing links it back from there ([`State::open_or_create`], [`State::check_path`]), so
//!   live and new processes keep sharing one quota. If both names are removed, a new process
//!   creates a fresh file: [`State::check_path`] then tells a live process its file was replaced
//!   (it cannot rejoin: the old inode has no name left), and the two sets of processes have
//!   separate quotas until the old ones exit.
//! - The file is writable by the container's own processes (they must map it shared), so the
//!   container's own code can always rewrite it; this state defends against crashes, accidents
//!   and other users, not against the job itself (the daemon, with device-level figures, will).
//!   A daemon can hand out sealed memfds ([`State::create_sealed_memfd`]), which cannot be
//!   shrunk at all.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

#[cfg(feature = "admin")]
pub mod admin;
mod error;
mod fsafe;
pub mod hami;
mod lock;
pub mod names;
pub mod rate;
pub mod register;
mod sigbus;
pub mod slots;
pub mod units;
pub mod wire;

pub use error::StateError;
pub use slots::SlotTable;

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering::*};

pub const MAGIC: u64 = u64::from_le_bytes(*b"LSHARE\0\x01");
pub const VERSION: u32 = 5;
pub const MAX_DEVICES: usize = 16;
pub const MAX_PROCS: usize = 1024;
pub const STATE_FILE: &str = "state.shm";
/// The state file's second name (see the module doc: removal).
pub const KEEP_FILE: &str = ".state.shm.keep";

/// Job classes (design §1).
pub const CLASS_PRODUCTION: u32 = 0;
pub const CLASS_OPPORTUNISTIC: u32 = 1;

#[repr(C)]
pub struct Header {
    pub magic: AtomicU64,
    pub version: AtomicU32,
    pub header_size: AtomicU32,
    pub device_size: AtomicU32,
    pub proc_size: AtomicU32,
    pub max_devices: AtomicU32,
    pub max_procs: AtomicU32,
    pub file_size: AtomicU64,
    /// CLASS_PRODUCTION or CLASS_OPPORTUNISTIC (the daemon may change it).
    pub class: AtomicU32,
    /// FLAG_* bits.
    pub flags: AtomicU32,
    /// Changes when the content was lost or re-created (0: lost, not yet repaired); each process
    /// compares it with the value it last saw (see the module doc).
    pub epoch: AtomicU64,
    /// 1 + the highest slot ever claimed (raised before the slot's pid is stored): scans of the
    /// slots (reclaim, repair, listing) stop there, so a node's daemon rescanning every container
    /// reads a few slots of each, not [`MAX_PROCS`].
    pub slots_hwm: AtomicU32,
    pub _reserved: AtomicU32,
}

/// The daemon manages this container: quotas and class come from it, not from the environment.
pub const FLAG_DAEMON_MANAGED: u32 = 1;
/// The container may oversubscribe device memory (`sharectl set --oversubscribe`, or HAMi's
/// `CUDA_OVERSUBSCRIBE=true` where the environment applies): while it is opportunistic, its
/// jobs' device allocations become managed memory and its quota limits their footprint, which
/// may exceed the device ([`State::oversubscribes`]).
pub const FLAG_OVERSUBSCRIBE: u32 = 2;
const KNOWN_FLAGS: u32 = FLAG_DAEMON_MANAGED | FLAG_OVERSUBSCRIBE;

#[repr(C, align(64))]
pub struct DeviceState {
    /// Bytes the container may hold on this device; 0 = no limit.
    pub quota: AtomicU64,
    /// Bytes held now (charged before the driver is called, uncharged on failure and free).
    pub used: AtomicU64,
    pub peak: AtomicU64,
    /// Allocations refused because of the quota.
    pub oom: AtomicU64,
    /// Kernel and graph launches of the container (every process).
    pub launches: AtomicU64,
    pub allocs: AtomicU64,
    pub frees: AtomicU64,
    /// The rate gate (`rate::Gate`, written by the daemon; read by opportunistic shims): 0 = open.
    pub budget: AtomicU64,

    // What the container's shims publish for compute sharing (`rate.rs` has the protocol).
    /// `rate::now_ns()` of the first launch since the container's work was last seen drained;
    /// 0 while drained.
    pub busy_since: AtomicU64,
    /// `rate::now_ns()` when a synchronising call last returned with the container's work done.
    pub drained_at: AtomicU64,
    /// GPU time of the container's launches as its shims measured it (events), ns, cumulative.
    pub gpu_ns: AtomicU64,
    /// Time launches spent held at the gate, ns, cumulative (summed over waiting threads).
    pub held_ns: AtomicU64,
    /// GPU time the container's gated launches have outstanding now, ns (an estimate).
    pub in_flight_ns: AtomicU64,
    /// Threads of the container waiting at the gate now.
    pub held: AtomicU32,
    /// Unused: once the container's environment compute limit, which every process of the
    /// container overwrote (the last writer won). The limit is per process now
    /// ([`ProcSlot::compute_limit`]); nothing reads or writes this word.
    pub _retired_env_compute: AtomicU32,
    /// +1 at each phase change (drained → busy, busy → drained): a futex the daemon waits on.
    pub phase_seq: AtomicU32,
    /// Nonzero while a daemon waits on `phase_seq` (written by the daemon): a phase change then
    /// wakes it at once (one futex wake per phase, see `rate.rs`).
    pub daemon_listens: AtomicU32,
    /// +1 each time a shim takes completed (or reclaimed) work out of `in_flight_ns`: the futex
    /// an opportunistic launch waits on while the container's work is at its bound.
    pub drain_seq: AtomicU32,
    /// Threads of the container waiting on `drain_seq` now (a taker wakes them only if > 0).
    pub drain_waiters: AtomicU32,

    // What the daemon (and the admin) write.
    /// End of the window (`rate::now_ns()` clock) by which the container's gated work must be
    /// done; 0 = none. Read when the gate says so.
    pub window_end: AtomicU64,
    /// GPU-time bucket, ns (signed): the daemon adds the container's share each period, gated
    /// launches take their estimated time. Read when the gate says so.
    pub tokens: AtomicI64,
    /// `rate::now_ns()` of the daemon's last write of this device's gate (its heartbeat).
    pub refreshed: AtomicU64,
    /// Changes whenever the gate changes: the futex opportunistic shims wait on.
    pub gate_seq: AtomicU32,
    /// The container's weight among opportunistic containers (0 = 1).
    pub weight: AtomicU32,
    /// The compute share an admin set (`sharectl set --compute`), basis points; 0 = none.
    pub compute: AtomicU32,
    pub _pad: u32,
    pub _reserved_daemon: [AtomicU64; 3],
}

#[repr(C, align(64))]
pub struct ProcSlot {
    /// 0 = free; else the pid of its process as that process sees it (for display: ownership
    /// is the slot's lock, see the module doc).
    pub pid: AtomicU32,
    /// The compute limit this process's environment asks for (`CUDA_DEVICE_SM_LIMIT`), in basis
    /// points of a device (1..=10000), on every device of the container; 0 = none. Published
    /// by the process once its slot is claimed, zeroed when the slot is claimed or cleared. The
    /// container's limit is the smallest nonzero one over its claimed slots
    /// ([`State::compute_limit`]): a process without a limit lifts nobody's. (This word was
    /// padding, always zero, before.)
    pub compute_limit: AtomicU32,
    /// /proc/<pid>/stat start time (for display and simgpu-style pid checks).
    pub start_time: AtomicU64,
    pub launches: [AtomicU64; MAX_DEVICES],
    pub allocs: [AtomicU64; MAX_DEVICES],
    /// Bytes ever charged (monotonic while the slot is claimed).
    pub charged: [AtomicU64; MAX_DEVICES],
    /// Bytes ever uncharged or refused (monotonic while the slot is claimed).
    pub uncharged: [AtomicU64; MAX_DEVICES],
    /// This process's part of each device's `in_flight_ns` (added here first, taken here
    /// last, see `rate::add_in_flight`): what leaves `in_flight_ns` when the slot is cleared
    /// (its process exited or died).
    pub in_flight: [AtomicU64; MAX_DEVICES],
}

impl ProcSlot {
    /// What the slot holds on `dev`: charged − uncharged.
    pub fn net(&self, dev: usize) -> u64 {
        self.charged[dev]
            .load(Acquire)
            .saturating_sub(self.uncharged[dev].load(Acquire))
    }

    /// Σ over devices of [`ProcSlot::net`].
    pub fn net_total(&self) -> u64 {
        (0..MAX_DEVICES).fold(0u64, |a, d| a.saturating_add(self.net(d)))
    }
}

/// The last 64 bytes of the file: a copy of the header's epoch where any truncation removes it
/// (the header may survive a truncation to a few bytes, the end of the file cannot), so one
/// load on each charge notices a loss, and a truncation past it faults into the SIGBUS handler.
#[repr(C, align(64))]
pub struct Trailer {
    pub epoch: AtomicU64,
    pub _reserved: [AtomicU64; 7],
}

/// The smallest nonzero of `limits` (compute limits in basis points, 0 = none), 0 if none: a
/// process without a limit never lifts another's.
pub fn min_limit(limits: impl IntoIterator<Item = u32>) -> u32 {
    limits.into_iter().filter(|&l| l != 0).min().unwrap_or(0)
}

const fn align64(x: usize) -> usize {
    (x + 63) & !63
}

pub const HEADER_SIZE: usize = align64(std::mem::size_of::<Header>());
pub const DEVICES_OFFSET: usize = HEADER_SIZE;
pub const PROCS_OFFSET: usize = DEVICES_OFFSET + std::mem::size_of::<DeviceState>() * MAX_DEVICES;
pub const TRAILER_OFFSET: usize = PROCS_OFFSET + std::mem::size_of::<ProcSlot>() * MAX_PROCS;
pub const FILE_SIZE: usize = TRAILER_OFFSET + std::mem::size_of::<Trailer>();
/// The byte whose lock a process holds while it owns slot `i`: `SLOT_LOCK_BASE + i`.
pub const SLOT_LOCK_BASE: u64 = FILE_SIZE as u64;
/// The byte of the lifecycle lock.
pub const LIFECYCLE_LOCK: u64 = SLOT_LOCK_BASE + MAX_PROCS as u64;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// A shared read-write mapping of the file: slots can be claimed.
    Shared,
    /// A private mapping of the file, read-only descriptor (follows the file, writes stay local).
    View,
    /// A copy of the file taken once (never faults, never follows).
    Snapshot,
    /// A process-private state with no file.
    Anonymous,
}

/// A descriptor of a state file that is never closed while this process holds slot locks on
/// its inode (closing it would drop them): it is leaked instead.
struct HeldFile {
    file: std::mem::ManuallyDrop<File>,
    key: (u64, u64),
}

impl HeldFile {
    fn new(file: File, path: &Path) -> Result<HeldFile, StateError> {
        let st = fsafe::fstat(file.as_raw_fd(), path)?;
        Ok(HeldFile {
            file: std::mem::ManuallyDrop::new(file),
            key: (st.st_dev, st.st_ino),
        })
    }
    fn fd(&self) -> libc::c_int {
        self.file.as_raw_fd()
    }
}

impl Drop for HeldFile {
    fn drop(&mut self) {
        if lock::own_count(self.key) == 0 {
            // SAFETY: dropped once, here; never used again.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.file) };
        }
    }
}

/// A mapped container state. Dropping it unmaps it but does not release the slots claimed
/// through it (call [`SlotTable::release_slot`]); while this process owns slots of the file, the
/// descriptor is leaked rather than closed, so their locks stay.
pub struct State {
    base: *mut u8,
    file: Option<HeldFile>,
    path: PathBuf,
    key: (u64, u64),
    mode: Mode,
    /// The header epoch this State last saw.
    epoch: AtomicU64,
    /// The quotas, class and flags this State last saw (restored after a loss).
    quota_seen: [AtomicU64; MAX_DEVICES],
    class_seen: AtomicU32,
    flags_seen: AtomicU32,
    /// Slots claimed through this State.
    mine: Box<[AtomicBool]>,
    /// Process-local copy of the nets of `mine` slots ([slot * MAX_DEVICES + dev]).
    mirror: Box<[AtomicU64]>,
    /// Process-local copy of the compute limits of `mine` slots.
    limit_mirror: Box<[AtomicU32]>,
}

// SAFETY: `base` is a mapping owned by this State (unmapped only in Drop), not tied to the thread
// that created it; the other fields are Send.
unsafe impl Send for State {}
// SAFETY: shared access goes only through `&Header`/`&DeviceState`/`&ProcSlot`, whose fields
// are all atomics (or padding), and through the State's own atomics.
unsafe impl Sync for State {}

fn map(
    len: usize,
    prot_flags: libc::c_int,
    fd: libc::c_int,
    path: &Path,
) -> Result<*mut u8, StateError> {
    // SAFETY: a new mapping (null hint) of `len` bytes: of `fd` (which the callers sized or
    // checked to be at least `len` long; a later truncation is handled by `sigbus`) or anonymous
    // (fd -1 with MAP_ANONYMOUS). The result is checked against MAP_FAILED before use.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            prot_flags,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(StateError::io("map", path, std::io::Error::last_os_error()));
    }
    Ok(p as *mut u8)
}

fn new_epoch() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out pointer to a live local.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    let mut x = (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_007)
        .wrapping_add(ts.tv_nsec as u64)
        ^ ((lock::getpid() as u64) << 32)
        ^ COUNTER.fetch_add(0x9e37_79b9_7f4a_7c15, Relaxed);
    // splitmix64
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    x.max(1)
}

/// Reads the first `buf.len()` bytes of `f` without mapping it.
fn pread_all(f: &File, buf: &mut [u8], path: &Path) -> Result<usize, StateError> {
    use std::os::unix::fs::FileExt;
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(StateError::io("read", path, e)),
        }
    }
    Ok(n)
}

/// Validates a header read from a file (plain bytes, before mapping).
fn validate_header_bytes(b: &[u8], path: &Path) -> Result<(), StateError> {
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
    let corrupt = |why| StateError::Corrupt {
        path: path.into(),
        why,
        version: VERSION,
    };
    if u64_at(0) != MAGIC {
        return Err(corrupt("bad magic"));
    }
    if u32_at(8) != VERSION {
        return Err(corrupt("another layout version"));
    }
    let sizes = [
        u32_at(12) as usize == HEADER_SIZE,
        u32_at(16) as usize == std::mem::size_of::<DeviceState>(),
        u32_at(20) as usize == std::mem::size_of::<ProcSlot>(),
        u32_at(24) as usize == MAX_DEVICES,
        u32_at(28) as usize == MAX_PROCS,
        u64_at(32) as usize == FILE_SIZE,
    ];
    if sizes.iter().any(|ok| !ok) {
        return Err(corrupt("layout sizes differ"));
    }
    if u32_at(40) > CLASS_OPPORTUNISTIC {
        return Err(corrupt("unknown class"));
    }
    if u32_at(44) & !KNOWN_FLAGS != 0 {
        return Err(corrupt("unknown flags"));
    }
    Ok(())
}

/// The lifecycle lock (see the module doc), released on drop. `held` is false when another
/// process kept it longer than [`LIFECYCLE_WAIT`] (stopped or frozen while holding it): callers
/// then skip what needs it (clearing slots, repairing `used`) rather than hang.
struct Lifecycle {
    fd: Option<libc::c_int>,
    held: bool,
    _p: lock::ProcessLock,
}

/// How long a lifecycle operation waits for another process's (held for microseconds).
const LIFECYCLE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

impl Drop for Lifecycle {
    fn drop(&mut self) {
        if let Some(fd) = self.fd {
            lock::unlock_byte(fd, LIFECYCLE_LOCK);
        }
    }
}

impl State {
    fn new(base: *mut u8, file: Option<HeldFile>, path: PathBuf, mode: Mode) -> State {
        let key = file.as_ref().map_or((0, base as u64), |f: &HeldFile| f.key);
        let owner = matches!(mode, Mode::Shared | Mode::Anonymous);
        let n = if owner { MAX_PROCS } else { 0 };
        State {
            base,
            file,
            path,
            key,
            mode,
            epoch: AtomicU64::new(0),
            quota_seen: Default::default(),
            class_seen: AtomicU32::new(0),
            flags_seen: AtomicU32::new(0),
            mine: (0..n).map(|_| AtomicBool::new(false)).collect(),
            mirror: (0..n * MAX_DEVICES).map(|_| AtomicU64::new(0)).collect(),
            limit_mirror: (0..n).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    /// Maps `<dir>/state.shm`, creating `dir` (0700) and the file (0600) if they do not exist,
    /// after checking every directory on the way and the file itself (see the module doc). A
    /// short file with a valid header is restored to its size (its processes re-publish their
    /// part); a corrupt file, one of another version, of another owner, open to other users or
    /// not a regular file is an error.
    pub fn open_or_create(dir: &Path) -> Result<State, StateError> {
        let dirfd = fsafe::open_dir(dir, true)?;
        let path = dir.join(STATE_FILE);
        Self::relink_if_removed(&dirfd);
        let (f, created) = fsafe::open_file_rw(&dirfd, STATE_FILE, &path, true)?;
        let f = HeldFile::new(f, &path)?;
        if created {
            // The second name (see the module doc); best effort.
            let (from, to) = (c"state.shm", c".state.shm.keep");
            // SAFETY: `dirfd` is an open directory; both names are NUL-terminated.
            unsafe {
                libc::unlinkat(dirfd.as_raw_fd(), to.as_ptr(), 0);
                libc::linkat(
                    dirfd.as_raw_fd(),
                    from.as_ptr(),
                    dirfd.as_raw_fd(),
                    to.as_ptr(),
                    0,
                );
            }
        }
        // SAFETY: `f` is open; flock only takes an advisory lock on it (serialising
        // initialisation between processes; it does not interact with POSIX record locks).
        unsafe { libc::flock(f.fd(), libc::LOCK_EX) };
        let r = Self::init_locked(f, path);
        if let Ok(st) = &r {
            let fd = st.file.as_ref().expect("a file state").fd();
            // SAFETY: `fd` is held open by `st`; this releases the flock taken above (on an
            // error the descriptor was closed with the HeldFile, releasing it).
            unsafe { libc::flock(fd, libc::LOCK_UN) };
        }
        r
    }

    /// If `state.shm` is missing but its second name exists and is a valid file of ours, gives
    /// it its name back (so live processes and new ones keep one quota).
    fn relink_if_removed(dirfd: &OwnedFd) {
        let (name, keep) = (c"state.shm", c".state.shm.keep");
        // SAFETY: an all-zero stat is valid; `dirfd` is an open directory, names NUL-terminated.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above; `st` is a live local.
        let missing = unsafe {
            libc::fstatat(
                dirfd.as_raw_fd(),
                name.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOENT);
        if !missing {
            return;
        }
        // SAFETY: as above.
        let r = unsafe {
            libc::fstatat(
                dirfd.as_raw_fd(),
                keep.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if r == 0 && fsafe::check_file(&st, Path::new(KEEP_FILE)).is_ok() {
            // SAFETY: as above; linkat does not follow (flags 0) and fails if the name exists.
            unsafe {
                libc::linkat(
                    dirfd.as_raw_fd(),
                    keep.as_ptr(),
                    dirfd.as_raw_fd(),
                    name.as_ptr(),
                    0,
                )
            };
        }
    }

    fn init_locked(f: HeldFile, path: PathBuf) -> Result<State, StateError> {
        let len = fsafe::fstat(f.fd(), &path)?.st_size as u64;
        let fresh = len == 0;
        let mut restored = false;
        if fresh {
            f.file
                .set_len(FILE_SIZE as u64)
                .map_err(|e| StateError::io("size", &path, e))?;
        } else {
            let mut hdr = [0u8; HEADER_SIZE];
            let n = pread_all(&f.file, &mut hdr, &path)?;
            if n < HEADER_SIZE {
                return Err(StateError::Truncated {
                    path,
                    len,
                    expected: FILE_SIZE as u64,
                });
            }
            validate_header_bytes(&hdr, &path)?;
            if len > FILE_SIZE as u64 {
                return Err(StateError::Corrupt {
                    path,
                    why: "longer than its layout",
                    version: VERSION,
                });
            }
            if len < FILE_SIZE as u64 {
                f.file
                    .set_len(FILE_SIZE as u64)
                    .map_err(|e| StateError::io("restore the size of", &path, e))?;
                restored = true;
            }
        }
        let base = map(FILE_SIZE, libc::MAP_SHARED, f.fd(), &path)?;
        let fd = f.fd();
        let st = State::new(base, Some(f), path, Mode::Shared);
        sigbus::register(base as usize, FILE_SIZE, fd);
        let h = st.header();
        if fresh {
            st.write_layout();
            st.publish_epoch(new_epoch());
            h.magic.store(MAGIC, Release);
        } else if restored || st.trailer().epoch.load(Acquire) != h.epoch.load(Acquire) {
            st.publish_epoch(new_epoch()); // tells live processes to re-publish
        } else {
            st.epoch.store(h.epoch.load(Acquire), Release);
        }
        st.remember_config();
        Ok(st)
    }

    fn write_layout(&self) {
        let h = self.header();
        h.version.store(VERSION, Release);
        h.header_size.store(HEADER_SIZE as u32, Release);
        h.device_size
            .store(std::mem::size_of::<DeviceState>() as u32, Release);
        h.proc_size
            .store(std::mem::size_of::<ProcSlot>() as u32, Release);
        h.max_devices.store(MAX_DEVICES as u32, Release);
        h.max_procs.store(MAX_PROCS as u32, Release);
        h.file_size.store(FILE_SIZE as u64, Release);
    }

    fn layout_ok(&self) -> bool {
        let h = self.header();
        h.magic.load(Acquire) == MAGIC
            && h.version.load(Acquire) == VERSION
            && h.header_size.load(Acquire) as usize == HEADER_SIZE
            && h.device_size.load(Acquire) as usize == std::mem::size_of::<DeviceState>()
            && h.proc_size.load(Acquire) as usize == std::mem::size_of::<ProcSlot>()
            && h.max_devices.load(Acquire) as usize == MAX_DEVICES
            && h.max_procs.load(Acquire) as usize == MAX_PROCS
            && h.file_size.load(Acquire) as usize == FILE_SIZE
    }

    /// Records the quotas, class and flags now in the file (restored after a loss).
    fn remember_config(&self) {
        for d in 0..MAX_DEVICES {
            self.quota_seen[d].store(self.device(d).quota.load(Acquire), Release);
        }
        let h = self.header();
        self.class_seen.store(h.class.load(Acquire), Release);
        self.flags_seen.store(h.flags.load(Acquire), Release);
    }

    /// A private, process-local state (no file): quotas then apply to this process alone.
    /// Deprecated: a container's quota must not silently become per-process (the shim should
    /// refuse instead); kept until the shim stops using it.
    pub fn anonymous() -> Result<State, StateError> {
        let base = map(
            FILE_SIZE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            Path::new("(anonymous state)"),
        )?;
        let st = State::new(base, None, PathBuf::new(), Mode::Anonymous);
        st.write_layout();
        st.publish_epoch(1);
        st.header().magic.store(MAGIC, Release);
        Ok(st)
    }

    /// A state in a new memfd sealed against shrinking and growing (for the daemon: it hands
    /// the descriptor to the container's processes, who map it with [`State::from_fd`]; nobody
    /// can truncate it). Returns the State and a descriptor to pass on.
    pub fn create_sealed_memfd() -> Result<(State, OwnedFd), StateError> {
        let what = Path::new("(memfd)");
        // SAFETY: the raw memfd_create system call (the glibc wrapper is newer than the shim's
        // 2.17 baseline) with a NUL-terminated name and flags; the result is checked.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_memfd_create,
                c"libshare-state".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        } as libc::c_int;
        if fd < 0 {
            return Err(StateError::io(
                "create",
                what,
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: a fresh descriptor owned by nobody else.
        let f = unsafe { File::from_raw_fd(fd) };
        f.set_len(FILE_SIZE as u64)
            .map_err(|e| StateError::io("size", what, e))?;
        // SAFETY: fcntl on our open descriptor with an int argument.
        let r = unsafe {
            libc::fcntl(
                f.as_raw_fd(),
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
            )
        };
        if r != 0 {
            return Err(StateError::io(
                "seal",
                what,
                std::io::Error::last_os_error(),
            ));
        }
        let dup = f
            .try_clone()
            .map_err(|e| StateError::io("duplicate", what, e))?;
        let st = Self::from_fd(f)?;
        Ok((st, OwnedFd::from(dup)))
    }

    /// Maps a state handed over as a descriptor (a daemon's sealed memfd, or an initialised
    /// file): it must be at least FILE_SIZE long; a zero header is initialised.
    pub fn from_fd(f: File) -> Result<State, StateError> {
        let path = PathBuf::from(DESCRIPTOR_PATH);
        let f = HeldFile::new(f, &path)?;
        let len = fsafe::fstat(f.fd(), &path)?.st_size as u64;
        if len != FILE_SIZE as u64 {
            return Err(StateError::Truncated {
                path,
                len,
                expected: FILE_SIZE as u64,
            });
        }
        let base = map(FILE_SIZE, libc::MAP_SHARED, f.fd(), &path)?;
        let fd = f.fd();
        let st = State::new(base, Some(f), path, Mode::Shared);
        sigbus::register(base as usize, FILE_SIZE, fd);
        let h = st.header();
        if h.magic.load(Acquire) == 0 {
            st.write_layout();
            st.publish_epoch(new_epoch());
            h.magic.store(MAGIC, Release);
        } else if !st.layout_ok() {
            return Err(StateError::Corrupt {
                path: st.path.clone(),
                why: "bad header",
                version: VERSION,
            });
        }
        st.epoch.store(h.epoch.load(Acquire), Release);
        st.remember_config();
        Ok(st)
    }

    /// Maps an existing state file read-write (the daemon, tests); errors if it is not valid.
    /// Same checks as [`State::open_or_create`], nothing created or repaired.
    pub fn open_existing(path: &Path) -> Result<State, StateError> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| StateError::io("open", path, std::io::ErrorKind::InvalidInput.into()))?;
        let dirfd = fsafe::open_dir(dir, false)?;
        let (f, _) = fsafe::open_file_rw(&dirfd, name, path, false)?;
        let f = HeldFile::new(f, path)?;
        let len = fsafe::fstat(f.fd(), path)?.st_size as u64;
        if len != FILE_SIZE as u64 {
            return Err(StateError::Truncated {
                path: path.into(),
                len,
                expected: FILE_SIZE as u64,
            });
        }
        let mut hdr = [0u8; HEADER_SIZE];
        pread_all(&f.file, &mut hdr, path)?;
        validate_header_bytes(&hdr, path)?;
        let base = map(FILE_SIZE, libc::MAP_SHARED, f.fd(), path)?;
        let fd = f.fd();
        let st = State::new(base, Some(f), path.into(), Mode::Shared);
        sigbus::register(base as usize, FILE_SIZE, fd);
        st.epoch.store(st.header().epoch.load(Acquire), Release);
        st.remember_config();
        Ok(st)
    }

    /// A view of an existing state file that needs only read permission (a monitoring agent,
    /// an NVML-only process). The mapping is private: it follows the file as the shim and daemon
    /// update it, and anything written through it stays in this process. Never follows a
    /// symlink, never blocks (FIFO), must be a regular file; the owner is not checked (a view
    /// never writes). A truncation while mapped shows zeros instead of raising SIGBUS.
    pub fn open_view(path: &Path) -> Result<State, StateError> {
        let f = fsafe::open_file_ro(path)?;
        let f = HeldFile::new(f, path)?;
        Self::check_len_and_header(&f, path)?;
        let base = map(FILE_SIZE, libc::MAP_PRIVATE, f.fd(), path)?;
        let st = State::new(base, Some(f), path.into(), Mode::View);
        sigbus::register(base as usize, FILE_SIZE, -1);
        Ok(st)
    }

    /// A copy of a state file taken now (`sharectl status`): like [`State::open_view`] but
    /// read once into private memory, so nothing done to the file later can fault. Liveness of
    /// slots still asks the file's locks.
    pub fn snapshot(path: &Path) -> Result<State, StateError> {
        let f = fsafe::open_file_ro(path)?;
        let f = HeldFile::new(f, path)?;
        Self::check_len_and_header(&f, path)?;
        let base = map(FILE_SIZE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, path)?;
        // SAFETY: `base` is a fresh private FILE_SIZE mapping nobody else references yet.
        let buf = unsafe { std::slice::from_raw_parts_mut(base, FILE_SIZE) };
        let n = pread_all(&f.file, buf, path);
        let st = State::new(base, Some(f), path.into(), Mode::Snapshot);
        let n = n?;
        if n < FILE_SIZE {
            return Err(StateError::Truncated {
                path: path.into(),
                len: n as u64,
                expected: FILE_SIZE as u64,
            });
        }
        if !st.layout_ok() {
            return Err(StateError::Corrupt {
                path: path.into(),
                why: "bad header",
                version: VERSION,
            });
        }
        Ok(st)
    }

    fn check_len_and_header(f: &HeldFile, path: &Path) -> Result<(), StateError> {
        let len = fsafe::fstat(f.fd(), path)?.st_size as u64;
        let mut hdr = [0u8; HEADER_SIZE];
        let n = pread_all(&f.file, &mut hdr, path)?;
        if n < HEADER_SIZE || len < FILE_SIZE as u64 {
            return Err(StateError::Truncated {
                path: path.into(),
                len,
                expected: FILE_SIZE as u64,
            });
        }
        validate_header_bytes(&hdr, path)
    }

    #[inline]
    pub fn header(&self) -> &Header {
        // SAFETY: `base` is a live, page-aligned FILE_SIZE mapping owned by `self` (unmapped only
        // in Drop, so it outlives the borrow) and HEADER_SIZE <= FILE_SIZE; every field is an
        // atomic.
        unsafe { &*(self.base as *const Header) }
    }

    #[inline]
    pub fn device(&self, i: usize) -> &DeviceState {
        assert!(i < MAX_DEVICES);
        // SAFETY: `i < MAX_DEVICES` (asserted), so the element lies inside the FILE_SIZE mapping
        // owned by `self`; DEVICES_OFFSET is a multiple of 64 from a page-aligned base, so it is
        // aligned; all fields are atomics (any bit pattern is valid, shared mutation is fine).
        unsafe { &*(self.base.add(DEVICES_OFFSET) as *const DeviceState).add(i) }
    }

    #[inline]
    pub fn slot(&self, i: usize) -> &ProcSlot {
        assert!(i < MAX_PROCS);
        // SAFETY: as for `device()`: `i < MAX_PROCS` (asserted) keeps it inside the mapping,
        // PROCS_OFFSET is 64-aligned, and every field is an atomic or padding.
        unsafe { &*(self.base.add(PROCS_OFFSET) as *const ProcSlot).add(i) }
    }

    pub fn trailer(&self) -> &Trailer {
        // SAFETY: TRAILER_OFFSET + size_of::<Trailer>() == FILE_SIZE, inside the mapping owned
        // by `self`; 64-aligned; every field is an atomic.
        unsafe { &*(self.base.add(TRAILER_OFFSET) as *const Trailer) }
    }

    /// Publishes a new epoch in the header and the trailer.
    fn publish_epoch(&self, e: u64) {
        self.trailer().epoch.store(e, Release);
        self.header().epoch.store(e, Release);
        self.epoch.store(e, Release);
    }

    /// The path this State was opened from (empty for an anonymous one).
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn mirror(&self, slot: usize, dev: usize) -> Option<&AtomicU64> {
        self.mirror.get(slot * MAX_DEVICES + dev)
    }

    /// Publishes the compute limit of the process owning slot `i` (basis points, 0 = none; see
    /// [`ProcSlot::compute_limit`]), remembered to be restored after a loss.
    pub fn set_compute_limit(&self, i: usize, bp: u32) {
        if let Some(m) = self.limit_mirror.get(i) {
            m.store(bp, Release);
        }
        self.slot(i).compute_limit.store(bp, Release);
    }

    /// The container's compute limit from its processes' environments: the smallest nonzero
    /// [`ProcSlot::compute_limit`] over the claimed slots (up to [`SlotTable::slots_in_use`]), 0
    /// if none. A slot counts while it shows a pid: a dead process's until it is reclaimed.
    /// Loads only (a few per process of the container).
    pub fn compute_limit(&self) -> u32 {
        min_limit((0..self.slots_in_use()).map(|i| {
            let s = self.slot(i);
            match s.pid.load(Acquire) {
                0 | slots::RELEASING => 0,
                _ => s.compute_limit.load(Acquire),
            }
        }))
    }

    /// Whether the container's jobs allocate managed memory instead of device memory: it is
    /// opportunistic and allowed to oversubscribe (two relaxed loads).
    pub fn oversubscribes(&self) -> bool {
        let h = self.header();
        h.class.load(Relaxed) == CLASS_OPPORTUNISTIC
            && h.flags.load(Relaxed) & FLAG_OVERSUBSCRIBE != 0
    }

    /// Sets the quota on `dev` (0 = none), remembered to be restored after a loss.
    pub fn set_quota(&self, dev: usize, bytes: u64) {
        self.quota_seen[dev].store(bytes, Release);
        self.device(dev).quota.store(bytes, Release);
    }

    /// Charges `bytes` on `dev` to process slot `slot` and, within the quota (0 = unlimited),
    /// to the container. Slot first, container second (see the module doc). False: over quota,
    /// nothing charged.
    pub fn charge(&self, slot: usize, dev: usize, bytes: u64) -> bool {
        let s = self.slot(slot);
        let d = self.device(dev);
        let m = self.mirror(slot, dev);
        if let Some(m) = m {
            m.fetch_add(bytes, AcqRel);
        }
        s.charged[dev].fetch_add(bytes, AcqRel);
        let quota = d.quota.load(Acquire);
        let r = d.used.fetch_update(AcqRel, Acquire, |u| {
            let n = u.checked_add(bytes)?;
            (quota == 0 || n <= quota).then_some(n)
        });
        let ok = match r {
            Ok(prev) => {
                d.peak.fetch_max(prev + bytes, AcqRel);
                true
            }
            Err(_) => {
                s.uncharged[dev].fetch_add(bytes, AcqRel);
                if let Some(m) = m {
                    m.fetch_sub(bytes, AcqRel);
                }
                false
            }
        };
        if self.lost() {
            self.recover();
            let (q, u) = (d.quota.load(Acquire), d.used.load(Acquire));
            if ok && q > 0 && u > q {
                // Decided while the quota was lost: refused after all.
                self.uncharge(slot, dev, bytes);
                return false;
            }
        }
        ok
    }

    /// As [`State::charge`] whatever the quota: memory the driver already holds (e.g. blocks a
    /// pool reserved beyond what was charged), so the figures stay true.
    pub fn charge_held(&self, slot: usize, dev: usize, bytes: u64) {
        let s = self.slot(slot);
        let d = self.device(dev);
        if let Some(m) = self.mirror(slot, dev) {
            m.fetch_add(bytes, AcqRel);
        }
        s.charged[dev].fetch_add(bytes, AcqRel);
        let now = d.used.fetch_add(bytes, AcqRel).saturating_add(bytes);
        d.peak.fetch_max(now, AcqRel);
        if self.lost() {
            self.recover();
        }
    }

    /// Returns `bytes` charged on `dev` by slot `slot`: container first, slot second.
    pub fn uncharge(&self, slot: usize, dev: usize, bytes: u64) {
        let s = self.slot(slot);
        let d = self.device(dev);
        let _ = d
            .used
            .fetch_update(AcqRel, Acquire, |u| Some(u.saturating_sub(bytes)));
        s.uncharged[dev].fetch_add(bytes, AcqRel);
        if let Some(m) = self.mirror(slot, dev) {
            let _ = m.fetch_update(AcqRel, Acquire, |u| Some(u.saturating_sub(bytes)));
        }
        if self.lost() {
            self.recover();
        }
    }

    /// Whether the content changed under this State (truncated, re-created): see
    /// [`State::recover`]. One load.
    #[inline]
    pub fn lost(&self) -> bool {
        self.mode == Mode::Shared && self.trailer().epoch.load(Relaxed) != self.epoch.load(Relaxed)
    }

    /// Repairs after a loss of the file's content (see the module doc): rewrites the header if
    /// lost, restores the quotas, class and flags this State last saw where they read 0,
    /// re-publishes this State's slots from its process-local copy, and repairs `used`.
    /// Returns whether anything was to repair.
    pub fn recover(&self) -> bool {
        if self.mode != Mode::Shared {
            return false;
        }
        let g = self.lifecycle();
        if !g.held {
            return false; // tried again at the next charge
        }
        let h = self.header();
        let mine = self.epoch.load(Acquire);
        let (head, tail) = (h.epoch.load(Acquire), self.trailer().epoch.load(Acquire));
        if tail == mine && head == mine {
            return false; // another thread of this process repaired it
        }
        let wiped = !self.layout_ok();
        if wiped {
            self.write_layout();
            h.class.store(self.class_seen.load(Acquire), Release);
            h.flags.store(self.flags_seen.load(Acquire), Release);
        }
        for d in 0..MAX_DEVICES {
            let seen = self.quota_seen[d].load(Acquire);
            if seen != 0 {
                let _ = self
                    .device(d)
                    .quota
                    .compare_exchange(0, seen, AcqRel, Acquire);
            }
        }
        let pid = lock::getpid();
        for (i, mine) in self.mine.iter().enumerate() {
            if !mine.load(Acquire) {
                continue;
            }
            let s = self.slot(i);
            for d in 0..MAX_DEVICES {
                let m = self.mirror(i, d).map_or(0, |m| m.load(Acquire));
                s.uncharged[d].store(0, Release);
                s.charged[d].store(m, Release);
            }
            if let Some(l) = self.limit_mirror.get(i) {
                s.compute_limit.store(l.load(Acquire), Release);
            }
            // The mark may have been lost with the rest of the header.
            self.mark_in_use(i);
            if s.pid.load(Acquire) == 0 {
                s.start_time.store(proc_start_time(pid), Release);
                s.pid.store(pid, Release);
            }
        }
        if wiped {
            h.magic.store(MAGIC, Release);
        }
        if head != 0 && head != mine && head == tail {
            self.epoch.store(head, Release); // another process repaired: adopt its epoch
        } else {
            self.publish_epoch(new_epoch()); // the first to see this loss
        }
        self.recompute_locked();
        true
    }

    /// Whether `state.shm` at this State's path is still this State's file. If the name was
    /// removed but the second name (`.state.shm.keep`) is still this file, the name is linked
    /// back first. Err: the file was removed or replaced (see the module doc). Cold: a few
    /// system calls, never closes the State's descriptor.
    /// A new descriptor of this State's file (for the daemon to pass to a registering process).
    pub fn dup_file(&self) -> Option<File> {
        self.file.as_ref().and_then(|f| f.file.try_clone().ok())
    }

    pub fn check_path(&self) -> Result<(), StateError> {
        if self.mode != Mode::Shared
            || self.path.as_os_str().is_empty()
            || self.path == Path::new(DESCRIPTOR_PATH)
        {
            return Ok(());
        }
        let same = |p: &Path| {
            use std::os::unix::fs::MetadataExt;
            std::fs::symlink_metadata(p)
                .is_ok_and(|m| (m.dev(), m.ino()) == self.key && m.file_type().is_file())
        };
        if same(&self.path) {
            return Ok(());
        }
        if let Some(dir) = self.path.parent() {
            if same(&dir.join(KEEP_FILE)) && !self.path.exists() {
                if let Ok(dirfd) = fsafe::open_dir(dir, false) {
                    Self::relink_if_removed(&dirfd);
                }
                if same(&self.path) {
                    return Ok(());
                }
            }
        }
        Err(StateError::Replaced {
            path: self.path.clone(),
        })
    }

    fn rw_fd(&self) -> Option<libc::c_int> {
        match self.mode {
            Mode::Shared => self.file.as_ref().map(|f| f.fd()),
            _ => None,
        }
    }

    fn lifecycle(&self) -> Lifecycle {
        let p = lock::ProcessLock::take();
        let (fd, held) = match self.rw_fd() {
            None => (None, true), // anonymous: the process lock is enough
            Some(fd) => match lock::lock_byte_within(fd, LIFECYCLE_LOCK, LIFECYCLE_WAIT) {
                Ok(true) => (Some(fd), true),
                _ => (None, false),
            },
        };
        Lifecycle { fd, held, _p: p }
    }

    /// Whether process slot `i` is owned by a live process: this process (a slot it claimed) or
    /// another one holding the slot's lock.
    pub fn slot_owned(&self, i: usize) -> bool {
        let pid = self.slot(i).pid.load(Acquire);
        if pid == 0 {
            return false;
        }
        if lock::own_has(self.key, i) {
            return true;
        }
        match &self.file {
            Some(f) => lock::locked_by_other(f.fd(), SLOT_LOCK_BASE + i as u64),
            None => false,
        }
    }

    /// Clears slot `i`'s memory (under the lifecycle lock, its lock held or its owner gone).
    /// Its launch and allocation counters stay until the slot is claimed again (totals of
    /// processes that exited).
    fn clear_slot(&self, i: usize) {
        let s = self.slot(i);
        s.pid.store(slots::RELEASING, Release);
        for d in 0..MAX_DEVICES {
            s.charged[d].store(0, Release);
            s.uncharged[d].store(0, Release);
            // What its process still had in flight (a `kill -9`, or an exit with launches
            // pending) leaves the container's sum, so no other process waits for it.
            rate::release_in_flight(self.device(d), &s.in_flight[d]);
        }
        s.compute_limit.store(0, Release);
        s.start_time.store(0, Release);
        s.pid.store(0, Release);
    }

    /// No slot has a pid and every device's `used` is 0 (what a repair would leave).
    fn nothing_held(&self) -> bool {
        (0..self.slots_in_use()).all(|i| self.slot(i).pid.load(Acquire) == 0)
            && (0..MAX_DEVICES).all(|d| self.device(d).used.load(Acquire) == 0)
    }

    fn reclaim_locked(&self) -> usize {
        let mut n = 0;
        for i in 0..self.slots_in_use() {
            if self.slot(i).pid.load(Acquire) == 0 || lock::own_has(self.key, i) {
                continue;
            }
            let free = match self.rw_fd() {
                Some(fd) => lock::try_lock_byte(fd, SLOT_LOCK_BASE + i as u64).unwrap_or(false),
                None => true, // anonymous: no other process can own a slot
            };
            // A dying process (`kill -9`) drops its lock when its descriptors close, which may
            // be before the driver has freed its device memory (that descriptor may close
            // later in the same exit): its slot is left for a later reclaim until it is a
            // zombie or gone, so the container never allocates over memory still held.
            let slot = self.slot(i);
            let dying = free && proc_exiting(slot.pid.load(Acquire), slot.start_time.load(Acquire));
            if dying {
                if let Some(fd) = self.rw_fd() {
                    lock::unlock_byte(fd, SLOT_LOCK_BASE + i as u64);
                }
                continue;
            }
            if free {
                self.clear_slot(i);
                if let Some(fd) = self.rw_fd() {
                    lock::unlock_byte(fd, SLOT_LOCK_BASE + i as u64);
                }
                n += 1;
            }
        }
        if !self.lost() {
            self.remember_config();
        }
        self.recompute_locked();
        n
    }

    /// Sets each device's `used` from the claimed slots (see the module doc for why it is never
    /// below what they hold and converges to it). Takes the lifecycle lock.
    pub fn recompute_used(&self) {
        if !matches!(self.mode, Mode::Shared | Mode::Anonymous) {
            return;
        }
        let g = self.lifecycle();
        if g.held {
            self.recompute_locked();
        }
    }

    fn recompute_locked(&self) {
        let claimed: Vec<usize> = (0..self.slots_in_use())
            .filter(|&i| self.slot(i).pid.load(Acquire) != 0)
            .collect();
        // 1. uncharged, then used, then charged.
        let down: Vec<[u64; MAX_DEVICES]> = claimed
            .iter()
            .map(|&i| std::array::from_fn(|d| self.slot(i).uncharged[d].load(Acquire)))
            .collect();
        let u: Vec<u64> = (0..MAX_DEVICES)
            .map(|d| self.device(d).used.load(Acquire))
            .collect();
        let mut bound = [0u64; MAX_DEVICES];
        for (k, &i) in claimed.iter().enumerate() {
            let s = self.slot(i);
            for d in 0..MAX_DEVICES {
                let up = s.charged[d].load(Acquire);
                bound[d] = bound[d].saturating_add(up.saturating_sub(down[k][d]));
            }
        }
        // A slot claimed meanwhile (only possible by a process that gave up waiting for the
        // lifecycle lock, see `lifecycle`) may have charged before `u` was read: its bytes are
        // in `u` but not in the bound. Leave the repair to the next call then.
        let now: Vec<usize> = (0..self.slots_in_use())
            .filter(|&i| self.slot(i).pid.load(Acquire) != 0)
            .collect();
        if claimed.iter().any(|i| now.binary_search(i).is_err())
            || now.iter().any(|i| claimed.binary_search(i).is_err())
        {
            return;
        }
        // 2. used += bound − u.
        for d in 0..MAX_DEVICES {
            let used = &self.device(d).used;
            if bound[d] > u[d] {
                used.fetch_add(bound[d] - u[d], AcqRel);
            } else if bound[d] < u[d] {
                let cut = u[d] - bound[d];
                let _ = used.fetch_update(AcqRel, Acquire, |x| Some(x.saturating_sub(cut)));
            }
        }
    }
}

impl slots::SlotTable for State {
    /// [`Header::slots_hwm`], a garbage value clamped to [`MAX_PROCS`].
    fn slots_in_use(&self) -> usize {
        (self.header().slots_hwm.load(Acquire) as usize).min(MAX_PROCS)
    }
    fn mark_in_use(&self, i: usize) {
        self.header().slots_hwm.fetch_max(i as u32 + 1, AcqRel);
    }
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
        s.compute_limit.store(0, Release);
        for d in 0..MAX_DEVICES {
            s.charged[d].store(0, Release);
            s.uncharged[d].store(0, Release);
            s.launches[d].store(0, Release);
            s.allocs[d].store(0, Release);
            s.in_flight[d].store(0, Release);
        }
    }
    fn free_slot(&self, i: usize) {
        self.reset_slot(i);
    }

    /// Owned by this process or locked by another (the pid is not trusted).
    fn slot_alive(&self, i: usize) -> bool {
        self.slot_owned(i)
    }

    /// Claims a free slot for `pid` (this process), taking its lock, after reclaiming the slots
    /// nobody holds. None: every slot is taken, or this is a view.
    fn claim_slot(&self, pid: u32) -> Option<usize> {
        if !matches!(self.mode, Mode::Shared | Mode::Anonymous) {
            return None;
        }
        if self.lost() {
            self.recover();
        }
        let g = self.lifecycle();
        if g.held {
            self.reclaim_locked();
        }
        let start = proc_start_time(pid);
        for i in 0..MAX_PROCS {
            let s = self.slot(i);
            if s.pid.load(Acquire) != 0 || lock::own_has(self.key, i) {
                continue;
            }
            let fd = self.rw_fd();
            if let Some(fd) = fd {
                if !lock::try_lock_byte(fd, SLOT_LOCK_BASE + i as u64).unwrap_or(false) {
                    continue; // held by a process whose slot lost its pid (after a loss)
                }
            }
            if !lock::own_add(self.key, i) {
                if let Some(fd) = fd {
                    lock::unlock_byte(fd, SLOT_LOCK_BASE + i as u64);
                }
                return None;
            }
            s.pid.store(slots::RELEASING, Release);
            self.reset_slot(i);
            for d in 0..MAX_DEVICES {
                if let Some(m) = self.mirror(i, d) {
                    m.store(0, Release);
                }
            }
            if let Some(l) = self.limit_mirror.get(i) {
                l.store(0, Release);
            }
            s.start_time.store(start, Release);
            self.mark_in_use(i);
            s.pid.store(pid, Release);
            self.mine[i].store(true, Release);
            self.remember_config();
            return Some(i);
        }
        None
    }

    /// Releases slot `i`: this process's own (at exit), or another process's that is gone.
    /// Its charges leave the container's `used` (by a repair, not a subtraction).
    fn release_slot(&self, i: usize, pid: u32) -> bool {
        if !matches!(self.mode, Mode::Shared | Mode::Anonymous) {
            return false;
        }
        let g = self.lifecycle();
        if self.slot(i).pid.load(Acquire) != pid {
            return false;
        }
        let fd = self.rw_fd();
        if lock::own_has(self.key, i) {
            self.clear_slot(i);
            if g.held {
                self.recompute_locked();
            }
            if let Some(m) = self.mine.get(i) {
                m.store(false, Release);
            }
            lock::own_remove(self.key, i);
            if let Some(fd) = fd {
                lock::unlock_byte(fd, SLOT_LOCK_BASE + i as u64);
            }
            return true;
        }
        let free = g.held
            && match fd {
                Some(fd) => lock::try_lock_byte(fd, SLOT_LOCK_BASE + i as u64).unwrap_or(false),
                None => true,
            };
        if free {
            self.clear_slot(i);
            self.recompute_locked();
            if let Some(fd) = fd {
                lock::unlock_byte(fd, SLOT_LOCK_BASE + i as u64);
            }
        }
        free
    }

    /// Clears every slot nobody holds (dead, exec'd, or garbage) and repairs `used`. Returns
    /// how many. A view reclaims nothing.
    fn reclaim_dead(&self) -> usize {
        if !matches!(self.mode, Mode::Shared | Mode::Anonymous) {
            return 0;
        }
        if self.lost() {
            self.recover();
        } else if self.nothing_held() {
            // No slot claimed and nothing in use: nothing to reclaim or repair, so no lock to
            // take (the daemon's rescan looks at every container every 100 ms, most idle). A
            // process claiming meanwhile is seen at the next call.
            self.remember_config();
            return 0;
        }
        let g = self.lifecycle();
        if !g.held {
            return 0;
        }
        self.reclaim_locked()
    }

    fn live_slots(&self) -> Vec<(usize, u32)> {
        (0..self.slots_in_use())
            .filter_map(|i| {
                let pid = self.slot(i).pid.load(Acquire);
                (pid != 0 && pid != slots::RELEASING && self.slot_owned(i)).then_some((i, pid))
            })
            .collect()
    }
}

impl Drop for State {
    fn drop(&mut self) {
        sigbus::unregister(self.base as usize);
        // SAFETY: `base` is the FILE_SIZE mapping this State created and owns; `&mut self` means
        // no reference borrowed from it (header/device/slot) is still alive.
        unsafe { libc::munmap(self.base as *mut _, FILE_SIZE) };
        // `file` (a HeldFile) is closed after, unless this process holds slots on it.
    }
}

/// The default state directory, checked for a shared host: `/run/libshare` if it exists and is
/// root's and not writable by others (the daemon's); else `$XDG_RUNTIME_DIR/libshare` when
/// `XDG_RUNTIME_DIR` is set and is ours and private; else `/tmp/libshare-<uid>` if it does not
/// exist yet or is ours with mode 0700. Err (one line naming LIBSHARE_STATE_DIR) otherwise: a
/// directory another user created must never be used.
pub fn default_state_dir_checked() -> Result<PathBuf, StateError> {
    use std::os::unix::fs::MetadataExt;
    if let Ok(m) = std::fs::symlink_metadata("/run/libshare") {
        if m.is_dir() && m.uid() == 0 && m.mode() & 0o022 == 0 {
            return Ok(PathBuf::from("/run/libshare"));
        }
    }
    let uid = fsafe::euid();
    if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR").filter(|x| !x.is_empty()) {
        let x = PathBuf::from(x);
        if x.is_absolute() && fsafe::private_dir_of(&x, uid) == Ok(true) {
            return Ok(x.join("libshare"));
        }
    }
    let tmp = PathBuf::from(format!("/tmp/libshare-{uid}"));
    match fsafe::private_dir_of(&tmp, uid) {
        Ok(_) => Ok(tmp),
        Err(why) => Err(StateError::NoSafeDefault { why }),
    }
}

/// [`default_state_dir_checked`], or `/tmp/libshare-<uid>` when no default is safe (opening
/// under it then fails with the reason, see `fsafe.rs`). Kept for callers that want a path.
pub fn default_state_dir() -> PathBuf {
    default_state_dir_checked()
        .unwrap_or_else(|_| PathBuf::from(format!("/tmp/libshare-{}", fsafe::euid())))
}

/// Opens a file an operator gives the daemon (its settings, its `--config`) read-only, with the
/// checks state files get: no directory on the way writable by others (but root's sticky
/// `/tmp`) or owned by anyone but root or us, the file not a symbolic link, a regular file owned
/// by root or us and not writable by group or others. `Ok(None)` if it does not exist.
pub fn open_operator_file(path: &Path) -> Result<Option<File>, StateError> {
    fsafe::open_operator_file(path)
}

/// The daemon's claim on its state directory: created if missing, every component checked as
/// `fsafe` says; it must belong to us (the daemon's user). Its mode is made exactly 0711:
/// group and others may pass through it to the registration socket (0666: any local process,
/// root or not, must be able to register) but neither list nor create anything in it. What is
/// under it stays private: `containers/` and every container's directory 0700, files 0600, the
/// admin socket and the settings 0600; the containers' files reach processes through the daemon
/// (registration passes each process its container's file) or bind-mounted one by one. Returns
/// whether rights of group or others beyond search (an older shim's or an operator's `mkdir`)
/// were removed.
pub fn claim_state_dir(path: &Path) -> Result<bool, StateError> {
    use std::os::fd::AsRawFd;
    let dir = fsafe::open_dir(path, true)?;
    let st = fsafe::fstat(dir.as_raw_fd(), path)?;
    let uid = fsafe::euid();
    if st.st_uid != uid {
        return Err(StateError::ForeignOwner {
            path: path.to_path_buf(),
            owner: st.st_uid,
            uid,
        });
    }
    if st.st_mode & 0o7777 == STATE_DIR_MODE {
        return Ok(false);
    }
    // SAFETY: fchmod on the directory descriptor we just opened and own.
    if unsafe { libc::fchmod(dir.as_raw_fd(), STATE_DIR_MODE) } != 0 {
        return Err(StateError::io(
            "chmod",
            path,
            std::io::Error::last_os_error(),
        ));
    }
    Ok(st.st_mode & 0o066 != 0)
}

/// The mode of the daemon's state directory ([`claim_state_dir`]).
pub const STATE_DIR_MODE: libc::mode_t = 0o711;

/// The path a [`State::from_fd`] shows (a state passed by the daemon has no path of its own
/// for this process, and none to check).
pub const DESCRIPTOR_PATH: &str = "(descriptor)";

/// The directory of container `name` under a state directory.
pub fn container_dir(state_dir: &Path, name: &str) -> PathBuf {
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

/// Whether process `pid` (started at `start_time`, 0: any) is exiting but not yet a zombie:
/// the kernel sets `PF_EXITING` (0x4 in `/proc/<pid>/stat`'s flags) when it starts tearing a
/// process down, before it closes the process's descriptors and frees its memory. False for a
/// process that is gone, a zombie, a pid reused by another process, or a live process (one
/// that `exec`ed, for instance).
pub fn proc_exiting(pid: u32, start_time: u64) -> bool {
    const PF_EXITING: u64 = 0x4;
    let mut buf = [0u8; 512];
    let Some(s) = read_small(&format!("/proc/{pid}/stat"), &mut buf) else {
        return false;
    };
    let Some((_, rest)) = s.rsplit_once(')') else {
        return false;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let state = f.first().copied().unwrap_or("");
    let flags: u64 = f.get(6).and_then(|v| v.parse().ok()).unwrap_or(0);
    let st: u64 = f.get(19).and_then(|v| v.parse().ok()).unwrap_or(0);
    !matches!(state, "Z" | "X" | "x")
        && (start_time == 0 || st == start_time)
        && flags & PF_EXITING != 0
}

#[cfg(test)]
mod tests;
