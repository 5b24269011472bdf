//! The state file's layout: the header, one section per device, one slot per process, the
//! trailer, their offsets and the job class.

use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering::*};

pub const MAGIC: u64 = u64::from_le_bytes(*b"LSHARE\0\x01");
pub const VERSION: u32 = 6;
pub const MAX_DEVICES: usize = 16;
pub const MAX_PROCS: usize = 1024;
pub const STATE_FILE: &str = "state.shm";
/// The state file's second name (see the module doc: removal).
pub const KEEP_FILE: &str = ".state.shm.keep";

/// Job classes (design §1): the words of [`Header::class`].
pub const CLASS_PRODUCTION: u32 = 0;
pub const CLASS_OPPORTUNISTIC: u32 = 1;

/// A container's job class (design §1), the one type every crate uses for it. Decoded once from
/// the shared word by [`Header::class`]; an unknown word is read on the safe side, as
/// [`crate::rate::Gate::decode`] reads an unknown mode as paused: [`Class::Opportunistic`], gated and
/// never protected (a file that says so at open is refused as corrupt).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "admin",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "lowercase")
)]
pub enum Class {
    Production,
    Opportunistic,
}

impl Class {
    /// As `LIBSHARE_CLASS`, the CLI, the settings file and `sharectl status` spell it.
    pub fn name(self) -> &'static str {
        match self {
            Class::Production => "production",
            Class::Opportunistic => "opportunistic",
        }
    }

    /// The class a name spells (`production`, `opportunistic`), if any.
    pub fn from_name(name: &str) -> Option<Class> {
        [Class::Production, Class::Opportunistic]
            .into_iter()
            .find(|c| c.name() == name)
    }

    /// The shared word.
    pub fn word(self) -> u32 {
        match self {
            Class::Production => CLASS_PRODUCTION,
            Class::Opportunistic => CLASS_OPPORTUNISTIC,
        }
    }

    /// The class a shared word names, if it names one (the check at open: `None` is a corrupt
    /// file).
    pub fn from_word(word: u32) -> Option<Class> {
        match word {
            CLASS_PRODUCTION => Some(Class::Production),
            CLASS_OPPORTUNISTIC => Some(Class::Opportunistic),
            _ => None,
        }
    }

    /// The class of a shared word; an unknown word is [`Class::Opportunistic`] (the safe side).
    pub fn decode(word: u32) -> Class {
        Class::from_word(word).unwrap_or(Class::Opportunistic)
    }
}

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
    /// CLASS_PRODUCTION or CLASS_OPPORTUNISTIC (the daemon may change it); read and written
    /// through [`Header::class`] and [`Header::set_class`].
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
    /// Written by the daemon in production containers while an oversubscribing container shares
    /// their devices: its clock (`demote::stamp`) at its last look, 0 = no protection (see
    /// `demote.rs`). Was reserved (always 0) before.
    pub protect: AtomicU32,
    /// Opportunistic shims: a bit per device on which an allocation found too little room
    /// under [`DeviceState::pin_cap`] and waits for the daemon to look again (its
    /// [`DeviceState::pin_need`]; `pin.rs`); the daemon clears the bits it takes. (Version 6.)
    pub pin_want: AtomicU32,
}

impl Header {
    /// The container's class, decoded once ([`Class::decode`]: an unknown word is opportunistic).
    /// One relaxed load (the shim's launch path reads it): the word stands alone, nothing is
    /// published with it.
    #[inline(always)]
    pub fn class(&self) -> Class {
        Class::decode(self.class.load(Relaxed))
    }

    /// Sets the container's class (the daemon, or the first process when no daemon manages it).
    pub fn set_class(&self, class: Class) {
        self.class.store(class.word(), Release);
    }
}

/// The daemon manages this container: quotas and class come from it, not from the environment.
pub const FLAG_DAEMON_MANAGED: u32 = 1;
/// The container may oversubscribe device memory (`sharectl set --oversubscribe`, or HAMi's
/// `CUDA_OVERSUBSCRIBE=true` where the environment applies): while it is opportunistic, its
/// jobs' device allocations become managed memory and its quota limits their footprint, which
/// may exceed the device ([`State::oversubscribes`]).
pub const FLAG_OVERSUBSCRIBE: u32 = 2;
/// A daemon bounds the device memory this container may hold that cannot be demoted (everything
/// but managed memory) by [`DeviceState::pin_cap`] while it is opportunistic, so that it never
/// takes what production containers are guaranteed (`pin.rs`). The daemon's word.
pub const FLAG_PIN_BOUND: u32 = 4;
pub(crate) const KNOWN_FLAGS: u32 = FLAG_DAEMON_MANAGED | FLAG_OVERSUBSCRIBE | FLAG_PIN_BOUND;

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
    /// Opportunistic, oversubscribing: whole allocations its shims moved between the device and
    /// the host (demotions plus promotions, `demote.rs`), cumulative, wrapping; for display.
    /// (Once the container's environment compute limit, retired when it became per process:
    /// a shim of that time may have left a value here.)
    pub migrations: AtomicU32,
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
    // Memory oversubscription's demotion protocol (`demote.rs`); reserved (always 0) before.
    /// Production: bytes its allocations have waited to find free on the device, cumulative
    /// (its shims add; the daemon reads the growth).
    pub mem_want: AtomicU64,
    /// Opportunistic: bytes of managed memory the daemon asks the container to hold demoted to
    /// the host (its target; 0 = none: demoted memory may come back).
    pub demote: AtomicU64,
    /// Opportunistic: bytes of managed memory the container's shims hold demoted now.
    pub demoted: AtomicU64,
    // The bound on memory that cannot be demoted (`pin.rs`; version 6).
    /// The daemon's: the most device memory other than managed memory the container may hold
    /// on this device while it is opportunistic and [`FLAG_PIN_BOUND`] is set (0: none at all).
    /// Written under the container's pin lock only.
    pub pin_cap: AtomicU64,
    /// The daemon's: +1 each time it decided `pin_cap` after a want (the futex a waiting shim
    /// waits on).
    pub pin_gen: AtomicU32,
    /// Opportunistic shims: the most pinned memory beyond `pin_cap` an allocation waiting for
    /// the daemon needs (the daemon takes it with the want's bit).
    pub pin_need: AtomicU64,
    // Kernel slicing (issue 31; reserved, always 0, before).
    /// Opportunistic shims: launches that went as block ranges of their grid (`slicing.rs`).
    pub sliced: AtomicU64,
    /// Opportunistic shims: launches that were to go as block ranges but went whole (one block,
    /// no PTX the shim saw, a kernel the slicer refused or could not read, a slice module the
    /// driver did not load, a first range that failed).
    pub unsliced: AtomicU64,
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
    /// Of this slot's net on each device, the bytes of managed memory (demotable): the rest
    /// cannot be demoted (`pin.rs`). Written by the slot's process only; raised after its net,
    /// lowered before it, and changed only under the pin lock while the container is bounded.
    /// (Version 6.)
    pub managed: [AtomicU64; MAX_DEVICES],
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

pub(crate) const fn align64(x: usize) -> usize {
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
/// The byte of the pin lock (`pin.rs`).
pub const PIN_LOCK: u64 = LIFECYCLE_LOCK + 1;
