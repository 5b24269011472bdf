//! What the loop needs from the machine, behind a trait so tests and the node service can
//! substitute it: the monotonic clock, sleeping to an absolute deadline, and the CPU time the
//! loop's thread used.

use std::sync::atomic::AtomicU32;

/// The machine as the control loop sees it.
pub trait Host {
    /// `CLOCK_MONOTONIC`, ns (the shims' clock, `libshare_abi::rate::now_ns`).
    fn now(&self) -> u64;
    /// Sleeps until `deadline` (same clock) or a signal arrives, whichever is first.
    fn sleep_until(&self, deadline: u64);
    /// Sleeps until `deadline`, a signal, or one of `words` moving from its expected value
    /// (another process's futex wake), whichever is first. Returns the index of the word whose
    /// futex wake ended the wait, if one did (its value may not have changed: any process that
    /// maps the word can wake it).
    fn wait_until(&self, deadline: u64, words: &[(&AtomicU32, u32)]) -> Option<usize> {
        let _ = words;
        self.sleep_until(deadline);
        None
    }
    /// CPU time (user + system) of the calling thread so far, ns.
    fn thread_cpu_ns(&self) -> u64;
}

/// Linux: the vDSO clock, `clock_nanosleep(TIMER_ABSTIME)`, `getrusage(RUSAGE_THREAD)`.
#[derive(Clone, Copy, Debug, Default)]
pub struct LinuxHost;

impl Host for LinuxHost {
    fn now(&self) -> u64 {
        libshare_abi::rate::now_ns()
    }

    fn sleep_until(&self, deadline: u64) {
        let ts = libc::timespec {
            tv_sec: (deadline / 1_000_000_000) as libc::time_t,
            tv_nsec: (deadline % 1_000_000_000) as libc::c_long,
        };
        // SAFETY: `ts` is a valid timespec; the remainder pointer may be null with
        // TIMER_ABSTIME. An EINTR return (a signal) is what lets the caller check its stop flag.
        unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_MONOTONIC,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            )
        };
    }

    fn wait_until(&self, deadline: u64, words: &[(&AtomicU32, u32)]) -> Option<usize> {
        use libshare_abi::rate::{wait_which, Waited};
        match wait_which(words, deadline) {
            Waited::Woken(i) => Some(i),
            Waited::Other => None,
            Waited::NotWaited => {
                self.sleep_until(deadline);
                None
            }
        }
    }

    fn thread_cpu_ns(&self) -> u64 {
        // SAFETY: an all-zero rusage is a valid value to be overwritten.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `ru` is a live, writable rusage; RUSAGE_THREAD exists since Linux 2.6.26.
        unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
        let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1_000;
        tv(ru.ru_utime) + tv(ru.ru_stime)
    }
}
