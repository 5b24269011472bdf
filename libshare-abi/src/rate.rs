//! Compute sharing's protocol between the shims and the daemon, defined once: the words of
//! [`DeviceState`] each side writes, the gate word's encoding, and the admission rule the
//! opportunistic shims apply.
//!
//! # Who writes what (per container and device)
//!
//! Every shim of the container (production and opportunistic alike):
//! - `launches`: +1 per kernel or graph launch;
//! - `busy_since`: [`now_ns`] of the first launch after the work was seen drained (one load per
//!   launch; a clock read once per busy phase), see [`DeviceState::note_launch`];
//! - `phase_seq` +1 at each of these two transitions, and a futex wake of the daemon when it
//!   listens (`daemon_listens`), so it reacts to production's arrivals and drains at once
//!   rather than at its next period;
//! - `drained_at`, `busy_since = 0`: when a synchronising call (`cuCtxSynchronize`,
//!   `cuStreamSynchronize`, `cuEventSynchronize`, or a query answering "done") returns with
//!   the work done, see [`DeviceState::note_drained`]. A drain seen on one stream of a process
//!   with work on several streams is a hint, not a proof: the daemon treats it as such.
//!
//! Opportunistic shims, at the gate: `held`, `held_ns` (time held), `in_flight_ns` (the sum of
//! their estimates of what they have outstanding, each process's part also kept in its slot's
//! `in_flight`, see [`add_in_flight`]), `drain_seq` +1 (and a futex wake when `drain_waiters`
//! says someone waits) whenever work leaves `in_flight_ns`, `gpu_ns` (GPU time measured with
//! events), and they take their launches' estimated time from `tokens` when the gate says so.
//! The in-flight bound and the window apply to the **container's** outstanding work
//! (`in_flight_ns`), whatever the number of its processes.
//!
//! Whoever clears a slot (its process at exit, or anyone reclaiming a dead process's slot: the
//! next process of the container, the daemon's rescan, or a gated launch that saw no work leave
//! for a while) takes the slot's `in_flight` out of `in_flight_ns` ([`release_in_flight`]): a
//! process killed with work accounted never holds its container at the bound.
//!
//! The daemon, every period: `budget` (the [`Gate`]), `window_end`, `tokens` (refilled), then
//! `refreshed` (its heartbeat), and `gate_seq` + a futex wake when the gate changed
//! ([`DeviceState::write_gate`]). The admin writes `compute` and `weight`; each process's shim
//! publishes its environment's compute limit in its slot (`ProcSlot::compute_limit`).
//!
//! # The gate word (`DeviceState::budget`)
//!
//! ```text
//! bits 62..63  mode: 0 open (no limit), 1 paused (launch nothing new), 2 run (bounded)
//! bit  61      (run) respect `window_end`
//! bit  60      (run) take estimated GPU time from `tokens`
//! bits  0..31  (run) GPU time the container may have in flight, µs (0 = no bound)
//! ```
//! 0 is "open", so a zeroed state (no daemon) never throttles anyone. Production containers are
//! never given another word by the libshare policy.
//!
//! # Clock
//!
//! All times are `CLOCK_MONOTONIC` nanoseconds ([`now_ns`]), one clock for every process of the
//! node (containers do not get their own monotonic clock unless a time namespace is set up,
//! which container runtimes do not do).

use crate::DeviceState;
use std::sync::atomic::Ordering::*;
use std::sync::atomic::{AtomicU32, AtomicU64};

/// What the gate says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Launch freely.
    Open,
    /// Launch nothing new until the word changes.
    Paused,
    /// Launch within bounds: at most `in_flight_us` of GPU time outstanding (0 = no bound),
    /// everything done by `window_end` if `window`, and only while `tokens` are left if `share`.
    Run {
        in_flight_us: u32,
        window: bool,
        share: bool,
    },
}

const MODE_SHIFT: u32 = 62;
const WINDOW_BIT: u64 = 1 << 61;
const SHARE_BIT: u64 = 1 << 60;

impl Gate {
    pub fn encode(self) -> u64 {
        match self {
            Gate::Open => 0,
            Gate::Paused => 1 << MODE_SHIFT,
            Gate::Run {
                in_flight_us,
                window,
                share,
            } => {
                (2 << MODE_SHIFT)
                    | if window { WINDOW_BIT } else { 0 }
                    | if share { SHARE_BIT } else { 0 }
                    | in_flight_us as u64
            }
        }
    }

    /// Any word decodes to some gate; an unknown mode is read as `Paused` (the safe side for
    /// an opportunistic job: a newer daemon's word never lets it run unbounded).
    pub fn decode(word: u64) -> Gate {
        match word >> MODE_SHIFT {
            0 => Gate::Open,
            2 => Gate::Run {
                in_flight_us: word as u32,
                window: word & WINDOW_BIT != 0,
                share: word & SHARE_BIT != 0,
            },
            _ => Gate::Paused,
        }
    }
}

/// How long the daemon's heartbeat (`refreshed`, written every period for every opportunistic
/// container) may be silent before the shims stop trusting its last word.
pub const DAEMON_SILENT_NS: u64 = 500_000_000;

/// [`FLOOR`]'s in-flight bound, µs (the daemon's default latency budget too).
pub const FLOOR_IN_FLIGHT_US: u32 = 2_000;

/// Where opportunistic work stands without a daemon that arbitrates (stopped, or silent for
/// [`DAEMON_SILENT_NS`]): at most 2 ms of GPU work in flight per process, no window, no tokens.
/// A production request then waits for at most that much opportunistic work, and nothing
/// stays paused waiting for a daemon that is gone.
pub const FLOOR: Gate = Gate::Run {
    in_flight_us: FLOOR_IN_FLIGHT_US,
    window: false,
    share: false,
};

/// What an opportunistic launch should do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Launch.
    Go,
    /// Wait until some of the container's outstanding work completes.
    WaitWork,
    /// Wait for the daemon to change the gate (or for `window_end`/`tokens` to move).
    WaitGate,
}

/// What the shim knows when it asks the gate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ask {
    /// [`now_ns`].
    pub now: u64,
    /// GPU time the container has outstanding on the device (estimated: `in_flight_ns`, every
    /// process's gated launches), ns.
    pub outstanding_ns: u64,
    /// The launch's estimated GPU time, ns.
    pub est_ns: u64,
    /// `DeviceState::window_end`.
    pub window_end: u64,
    /// `DeviceState::tokens`.
    pub tokens: i64,
}

/// The admission rule of an opportunistic launch, against the container's outstanding work. A
/// launch longer than the in-flight bound still goes when the container has nothing outstanding
/// (else it could never run); a window is honoured whole: the launch goes only if it and what
/// the container has outstanding fit before `window_end`.
pub fn admit(gate: Gate, a: Ask) -> Verdict {
    match gate {
        Gate::Open => Verdict::Go,
        Gate::Paused => Verdict::WaitGate,
        Gate::Run {
            in_flight_us,
            window,
            share,
        } => {
            if window && a.now.saturating_add(a.outstanding_ns + a.est_ns) > a.window_end {
                return if a.window_end > a.now && a.outstanding_ns > 0 {
                    Verdict::WaitWork
                } else {
                    Verdict::WaitGate
                };
            }
            if share && a.tokens <= 0 {
                return Verdict::WaitGate;
            }
            let bound = in_flight_us as u64 * 1_000;
            if bound > 0 && a.outstanding_ns > 0 && a.outstanding_ns + a.est_ns > bound {
                return Verdict::WaitWork;
            }
            Verdict::Go
        }
    }
}

/// A gated launch of `ns` (estimated) joins the container's `in_flight_ns`: the process's
/// slot word `mine` first (None: it has no slot now, e.g. after its exit handler), so that at
/// every instruction a slot holds at least its part of the sum and clearing the slot of a
/// process killed at any point never leaves any of it behind (it may take up to one launch
/// too much, which the next completions' saturating takes absorb).
pub fn add_in_flight(d: &DeviceState, mine: Option<&AtomicU64>, ns: u64) {
    if let Some(m) = mine {
        m.fetch_add(ns, AcqRel);
    }
    d.in_flight_ns.fetch_add(ns, AcqRel);
}

/// Adds `ns` to `in_flight_ns` only if it still reads `seen` (a bounded launch: the sum it was
/// admitted against must not have moved), this process's slot word `mine` first, taken back if
/// the sum moved. Whether it did.
pub fn reserve_in_flight(d: &DeviceState, mine: Option<&AtomicU64>, seen: u64, ns: u64) -> bool {
    if let Some(m) = mine {
        m.fetch_add(ns, AcqRel);
    }
    let ok = d
        .in_flight_ns
        .compare_exchange(seen, seen.saturating_add(ns), AcqRel, Acquire)
        .is_ok();
    if !ok {
        if let Some(m) = mine {
            sub_sat(m, ns);
        }
    }
    ok
}

/// `ns` of the process's work completed (or stopped counting): out of the sum first, then out
/// of its slot word, both never below 0 (the state may have been lost and re-made, or the slot
/// cleared meanwhile); then wakes the threads waiting for the container's work to drain.
pub fn take_in_flight(d: &DeviceState, mine: Option<&AtomicU64>, ns: u64) {
    if ns == 0 {
        return;
    }
    sub_sat(&d.in_flight_ns, ns);
    if let Some(m) = mine {
        sub_sat(m, ns);
    }
    d.drained_some();
}

/// A slot is cleared: what it still had in flight leaves the container's sum.
pub fn release_in_flight(d: &DeviceState, slot_word: &AtomicU64) {
    let ns = slot_word.swap(0, AcqRel);
    if ns > 0 {
        sub_sat(&d.in_flight_ns, ns);
        d.drained_some();
    }
}

fn sub_sat(w: &AtomicU64, ns: u64) {
    let _ = w.fetch_update(AcqRel, Acquire, |v| Some(v.saturating_sub(ns)));
}

/// `CLOCK_MONOTONIC` in ns (the vDSO: no syscall).
#[inline]
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// [`now_ns`] in seconds: the clock `Instant` uses on Linux, shared by every process of the
/// machine (the jobs' `mono_s`, the benchmarks' time axis).
#[inline]
pub fn now_s() -> f64 {
    now_ns() as f64 * 1e-9
}

impl DeviceState {
    /// An admitted launch under a share takes its estimated cost, `ns`, from `tokens` (which
    /// the daemon refills each period; they may go below 0).
    #[inline]
    pub fn take_tokens(&self, ns: u64) {
        self.tokens
            .fetch_sub(ns.min(i64::MAX as u64) as i64, AcqRel);
    }

    /// A launch was held at the gate for `ns`: counted in `held_ns`.
    #[inline]
    pub fn note_held(&self, ns: u64) {
        self.held_ns.fetch_add(ns, AcqRel);
    }

    /// `ns` of the container's GPU time measured with events: counted in `gpu_ns`.
    #[inline]
    pub fn note_gpu_time(&self, ns: u64) {
        self.gpu_ns.fetch_add(ns, AcqRel);
    }

    /// A launch of the container (every class): counts it and marks the device busy. Hot path
    /// of production launches: one atomic add and one load; the first launch of a busy phase
    /// also reads the clock and, when a daemon listens, wakes it ([`DeviceState::phase_changed`]).
    #[inline(always)]
    pub fn note_launch(&self) {
        self.launches.fetch_add(1, Relaxed);
        if self.busy_since.load(Relaxed) == 0 {
            self.busy_begins();
        }
    }

    #[cold]
    fn busy_begins(&self) {
        self.busy_since.store(now_ns().max(1), Relaxed);
        self.phase_changed();
    }

    /// A synchronising call returned with the container's work on the device done.
    /// Off the launch path (on the return of a call that waited or asked): a clock read, and a
    /// futex wake when a daemon listens, once per busy → drained transition.
    pub fn note_drained(&self) {
        if self.busy_since.load(Relaxed) != 0 {
            self.drained_at.store(now_ns(), Relaxed);
            self.busy_since.store(0, Release);
            self.phase_changed();
        }
    }

    /// A busy phase began or ended: `phase_seq` moves, and a listening daemon is woken (one
    /// futex wake, a syscall of about a microsecond, once per phase: never in a steady stream
    /// of launches, and nothing when no daemon listens).
    fn phase_changed(&self) {
        self.phase_seq.fetch_add(1, AcqRel);
        if self.daemon_listens.load(Acquire) != 0 {
            futex_wake(&self.phase_seq);
        }
    }

    /// The daemon's write of this device's gate: the window and the gate word, then the
    /// heartbeat; a changed gate bumps `gate_seq` and, unless it now pauses (a waiting thread
    /// would only wait again), wakes the threads waiting on it.
    pub fn write_gate(&self, gate: Gate, window_end: u64, now: u64) {
        self.window_end.store(window_end, Release);
        let old = self.budget.swap(gate.encode(), AcqRel);
        self.refreshed.store(now, Release);
        if old != gate.encode() {
            self.gate_seq.fetch_add(1, AcqRel);
            if gate != Gate::Paused && self.held.load(Acquire) > 0 {
                futex_wake(&self.gate_seq);
            }
        }
    }

    /// The gate as it stands.
    #[inline(always)]
    pub fn gate(&self) -> Gate {
        Gate::decode(self.budget.load(Acquire))
    }

    /// The gate an opportunistic launch obeys at `now`: the daemon's word while its heartbeat
    /// is fresh, [`FLOOR`] once a daemon that was there has been silent for
    /// [`DAEMON_SILENT_NS`] (killed, hung, or stopped), whatever it last wrote — a paused job
    /// resumes at the floor, an open one falls to it. A state no daemon ever wrote
    /// (`refreshed == 0`) keeps its word (open: no daemon, no gate).
    #[inline]
    pub fn gate_at(&self, now: u64) -> Gate {
        let gate = self.gate();
        let beat = self.refreshed.load(Acquire);
        if beat != 0 && now.saturating_sub(beat) > DAEMON_SILENT_NS {
            FLOOR
        } else {
            gate
        }
    }

    /// Adds `ns` to the GPU-time bucket, keeping it at most `cap` (the daemon's refill).
    pub fn refill(&self, ns: i64, cap: i64) {
        let _ = self
            .tokens
            .fetch_update(AcqRel, Acquire, |t| Some(t.saturating_add(ns).min(cap)));
    }

    /// Work left `in_flight_ns`: `drain_seq` moves, and the waiting threads (of any process)
    /// are woken, one futex wake only when some wait.
    fn drained_some(&self) {
        // SeqCst here and in `wait_drain`: either the waiter sees the new sequence or the
        // taker sees the waiter (no lost wake-up; the wait is bounded anyway).
        self.drain_seq.fetch_add(1, SeqCst);
        if self.drain_waiters.load(SeqCst) > 0 {
            futex_wake(&self.drain_seq);
        }
    }

    /// Waits (a futex on `drain_seq`) until some of the container's work leaves `in_flight_ns`
    /// after `seq` was read, or `timeout_ns` passes. Not counted in `held`: the container's
    /// work is progressing, the daemon has nothing to release.
    pub fn wait_drain(&self, seq: u32, timeout_ns: u64) {
        self.drain_waiters.fetch_add(1, SeqCst);
        if self.drain_seq.load(SeqCst) == seq {
            futex_wait(&self.drain_seq, seq, timeout_ns);
        }
        self.drain_waiters.fetch_sub(1, AcqRel);
    }

    /// Waits (a futex on `gate_seq`, no busy loop) until the gate changes from `seq` or
    /// `timeout_ns` passes, counting this thread in `held`.
    pub fn wait_gate(&self, seq: u32, timeout_ns: u64) {
        self.held.fetch_add(1, AcqRel);
        if self.gate_seq.load(Acquire) == seq {
            futex_wait(&self.gate_seq, seq, timeout_ns);
        }
        self.held.fetch_sub(1, AcqRel);
    }
}

/// Waits while `word == expected`, at most `timeout_ns` (a shared futex: the word may live in a
/// mapping shared between processes). Returns on a wake, a timeout, a signal or a changed word.
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (timeout_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (timeout_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: `word` is a valid, aligned u32 for the call's duration; FUTEX_WAIT only reads it
    // and `ts` (a relative timeout). Not FUTEX_PRIVATE: waker and waiter may be processes.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        )
    };
}

/// Wakes every thread (of any process) waiting on `word`.
pub fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE only uses the address as a key.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX) };
}

/// Waits until one of `words` differs from its expected value (a wake from another process,
/// see [`DeviceState::note_drained`]) or `CLOCK_MONOTONIC` reaches `deadline_ns`: Linux's
/// `futex_waitv` (5.16+) over at most 128 shared 32-bit futexes. Returns false when the kernel
/// has no `futex_waitv` (ENOSYS) or `words` is empty or too long: the caller then sleeps
/// plainly to its deadline.
pub fn wait_any(words: &[(&AtomicU32, u32)], deadline_ns: u64) -> bool {
    wait_which(words, deadline_ns) != Waited::NotWaited
}

/// What ended a [`wait_which`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waited {
    /// A futex wake on `words[i]` (whether or not its value changed: anyone may wake a word).
    Woken(usize),
    /// The deadline, a signal, or a word that already differed from its expected value.
    Other,
    /// Nothing was waited (no `futex_waitv`, or `words` empty or too long).
    NotWaited,
}

/// [`wait_any`], telling which word's wake ended the wait.
pub fn wait_which(words: &[(&AtomicU32, u32)], deadline_ns: u64) -> Waited {
    /// `struct futex_waitv` of linux/futex.h.
    #[repr(C)]
    struct FutexWaitv {
        val: u64,
        uaddr: u64,
        flags: u32,
        reserved: u32,
    }
    const FUTEX_32: u32 = 2;
    const MAX: usize = 128;
    if words.is_empty() || words.len() > MAX {
        return Waited::NotWaited;
    }
    let mut v: [FutexWaitv; MAX] = std::array::from_fn(|_| FutexWaitv {
        val: 0,
        uaddr: 0,
        flags: 0,
        reserved: 0,
    });
    for (slot, (w, expected)) in v.iter_mut().zip(words) {
        *slot = FutexWaitv {
            val: *expected as u64,
            uaddr: w.as_ptr() as u64,
            flags: FUTEX_32, // shared (no FUTEX_PRIVATE_FLAG): wakers are other processes
            reserved: 0,
        };
    }
    let ts = libc::timespec {
        tv_sec: (deadline_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (deadline_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: `v[..n]` are valid futex_waitv entries whose addresses are live, aligned u32s
    // borrowed for the call; `ts` is an absolute CLOCK_MONOTONIC timeout. The kernel only reads
    // both.
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex_waitv,
            v.as_ptr(),
            words.len() as libc::c_uint,
            0 as libc::c_uint,
            &ts as *const libc::timespec,
            libc::CLOCK_MONOTONIC,
        )
    };
    if r >= 0 {
        Waited::Woken(r as usize)
    } else if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
        Waited::NotWaited
    } else {
        Waited::Other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip_and_zero_is_open() {
        assert_eq!(Gate::decode(0), Gate::Open);
        for g in [
            Gate::Open,
            Gate::Paused,
            Gate::Run {
                in_flight_us: 4_000,
                window: true,
                share: false,
            },
            Gate::Run {
                in_flight_us: u32::MAX,
                window: false,
                share: true,
            },
        ] {
            assert_eq!(Gate::decode(g.encode()), g);
        }
        assert_eq!(Gate::decode(3 << 62), Gate::Paused, "unknown modes pause");
    }

    fn ask(outstanding_ns: u64, est_ns: u64) -> Ask {
        Ask {
            now: 1_000_000,
            outstanding_ns,
            est_ns,
            window_end: 0,
            tokens: 0,
        }
    }

    #[test]
    fn the_in_flight_bound_counts_gpu_time_and_never_blocks_an_idle_process() {
        let g = Gate::Run {
            in_flight_us: 1_000,
            window: false,
            share: false,
        };
        assert_eq!(admit(g, ask(0, 500_000)), Verdict::Go);
        assert_eq!(admit(g, ask(500_000, 500_000)), Verdict::Go);
        assert_eq!(admit(g, ask(600_000, 500_000)), Verdict::WaitWork);
        assert_eq!(
            admit(g, ask(0, 5_000_000)),
            Verdict::Go,
            "longer than the bound"
        );
        assert_eq!(admit(Gate::Paused, ask(0, 1)), Verdict::WaitGate);
        assert_eq!(admit(Gate::Open, ask(u64::MAX / 4, 1)), Verdict::Go);
    }

    #[test]
    fn a_window_admits_only_what_finishes_inside_it() {
        let g = Gate::Run {
            in_flight_us: 0,
            window: true,
            share: false,
        };
        let mut a = ask(0, 400_000);
        a.window_end = a.now + 500_000;
        assert_eq!(admit(g, a), Verdict::Go);
        a.outstanding_ns = 200_000;
        assert_eq!(admit(g, a), Verdict::WaitWork, "would end past the window");
        a.outstanding_ns = 0;
        a.window_end = a.now + 300_000;
        assert_eq!(
            admit(g, a),
            Verdict::WaitGate,
            "does not fit: wait for the next one"
        );
        a.window_end = a.now - 1;
        assert_eq!(admit(g, a), Verdict::WaitGate, "window over");
    }

    #[test]
    fn a_share_admits_while_tokens_last() {
        let g = Gate::Run {
            in_flight_us: 0,
            window: false,
            share: true,
        };
        let mut a = ask(0, 1_000);
        a.tokens = 1;
        assert_eq!(admit(g, a), Verdict::Go);
        a.tokens = 0;
        assert_eq!(admit(g, a), Verdict::WaitGate);
    }

    #[test]
    fn the_daemon_write_bumps_the_sequence_only_on_change() {
        let d = zeroed();
        d.write_gate(Gate::Open, 0, 5);
        assert_eq!(d.gate_seq.load(Acquire), 0, "open over open");
        assert_eq!(d.refreshed.load(Acquire), 5);
        d.write_gate(Gate::Paused, 0, 6);
        assert_eq!(d.gate_seq.load(Acquire), 1);
        assert_eq!(d.gate(), Gate::Paused);
        d.refill(10, 15);
        d.refill(10, 15);
        assert_eq!(d.tokens.load(Acquire), 15, "capped");
    }

    #[test]
    fn launches_mark_busy_and_a_drain_clears_it() {
        let d = zeroed();
        d.note_launch();
        let t = d.busy_since.load(Acquire);
        assert!(t > 0);
        d.note_launch();
        assert_eq!(
            d.busy_since.load(Acquire),
            t,
            "first launch of the phase only"
        );
        assert_eq!(d.launches.load(Acquire), 2);
        d.note_drained();
        assert_eq!(d.busy_since.load(Acquire), 0);
        assert!(d.drained_at.load(Acquire) >= t);
    }

    #[test]
    fn a_drain_wakes_a_listening_daemon_before_its_deadline() {
        let d: &'static DeviceState = Box::leak(zeroed());
        d.daemon_listens.store(1, Release);
        d.note_launch();
        let seq = d.phase_seq.load(Acquire);
        let shim = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            d.note_drained();
        });
        let start = std::time::Instant::now();
        assert!(wait_any(&[(&d.phase_seq, seq)], now_ns() + 10_000_000_000));
        assert!(
            start.elapsed() < std::time::Duration::from_secs(5),
            "woken by the drain"
        );
        assert_eq!(d.phase_seq.load(Acquire), seq + 1);
        shim.join().unwrap();
        let start = std::time::Instant::now();
        assert!(wait_any(&[(&d.phase_seq, seq + 1)], now_ns() + 30_000_000));
        assert!(
            start.elapsed() >= std::time::Duration::from_millis(25),
            "slept to the deadline"
        );
    }

    #[test]
    fn a_waiter_wakes_on_the_gate_change_not_the_timeout() {
        let d: &'static DeviceState = Box::leak(zeroed());
        let seq = d.gate_seq.load(Acquire);
        // The waiter counts itself in `held` before sleeping: the write sees it and wakes it.
        let writer = std::thread::spawn(move || {
            while d.held.load(Acquire) == 0 {
                std::thread::yield_now();
            }
            d.write_gate(
                Gate::Run {
                    in_flight_us: 1_000,
                    window: false,
                    share: false,
                },
                0,
                1,
            );
        });
        let start = std::time::Instant::now();
        d.wait_gate(seq, 10_000_000_000);
        assert!(
            start.elapsed() < std::time::Duration::from_secs(5),
            "woken, not timed out"
        );
        writer.join().unwrap();
    }

    #[test]
    fn a_silent_daemon_leaves_opportunistic_work_at_the_floor() {
        let d = zeroed();
        assert_eq!(d.gate_at(u64::MAX), Gate::Open, "no daemon ever: open");
        d.write_gate(Gate::Paused, 0, 1_000);
        assert_eq!(d.gate_at(1_000 + DAEMON_SILENT_NS), Gate::Paused);
        assert_eq!(
            d.gate_at(1_001 + DAEMON_SILENT_NS),
            FLOOR,
            "paused by a dead daemon"
        );
        d.write_gate(Gate::Open, 0, 5_000);
        assert_eq!(
            d.gate_at(5_001 + DAEMON_SILENT_NS),
            FLOOR,
            "open, then silent"
        );
        d.write_gate(Gate::Paused, 0, 9 * DAEMON_SILENT_NS);
        assert_eq!(d.gate_at(9 * DAEMON_SILENT_NS + 1), Gate::Paused, "back");
        assert_ne!(
            admit(
                FLOOR,
                Ask {
                    outstanding_ns: 1_500_000,
                    est_ns: 1_000_000,
                    ..Ask::default()
                }
            ),
            Verdict::Go
        );
    }

    fn zeroed() -> Box<DeviceState> {
        // SAFETY: every field of DeviceState is an atomic or an integer: all zeroes is valid.
        Box::new(unsafe { std::mem::zeroed() })
    }
}
