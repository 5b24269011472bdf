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

#[cfg(feature = "admin")]
pub mod admin;
pub mod demote;
mod error;
pub mod fsafe;
pub mod hami;
mod lock;
pub mod names;
pub mod pin;
pub mod rate;
pub mod register;
mod sigbus;
pub mod slots;
pub mod units;
pub mod wire;

pub use error::StateError;
pub use slots::SlotTable;

// The state file, one concern per file: `layout` (what the bytes are), `open` (creating,
// validating and mapping it), `charge` (quotas and charging, by the proof above), `lifecycle`
// (slots under the lifecycle lock: claim, release, reclaim, repair), `paths` (state
// directories and `/proc`).
mod charge;
mod layout;
mod lifecycle;
mod open;
mod paths;

pub use layout::*;
pub use open::*;
pub use paths::*;

#[cfg(test)]
mod tests;
