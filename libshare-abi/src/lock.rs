//! Locks: POSIX record locks on bytes of a state file (slot ownership between processes, the
//! container's lifecycle lock) and the process-local pieces they need.
//!
//! POSIX record locks belong to the (process, inode) pair: the kernel drops them when the process
//! dies (also by `kill -9`), when it closes ANY descriptor of the file, and (our descriptors being
//! close-on-exec) at `exec`. They are not inherited by `fork`. A process never sees its own locks
//! with F_GETLK, and taking a lock it already holds succeeds: so each process remembers which
//! slots it owns ([`own_add`] …), and every slot/lifecycle operation of this process runs under
//! [`ProcessLock`], so two threads never lock and unlock the same byte at once.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};

fn flock_struct(kind: libc::c_int, off: u64) -> libc::flock {
    // SAFETY: an all-zero `flock` is a valid value of this plain C struct.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = off as libc::off_t;
    fl.l_len = 1;
    fl
}

/// Takes a write lock on byte `off` of `fd` without waiting. Ok(false): another process holds it.
pub(crate) fn try_lock_byte(fd: libc::c_int, off: u64) -> std::io::Result<bool> {
    let fl = flock_struct(libc::F_WRLCK, off);
    loop {
        // SAFETY: `fd` is an open descriptor of the caller; `fl` a live, initialised local.
        if unsafe { libc::fcntl(fd, libc::F_SETLK, &fl) } == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EACCES) => return Ok(false),
            Some(libc::EINTR) => continue,
            _ => return Err(e),
        }
    }
}

/// Takes a write lock on byte `off` of `fd`, waiting for it at most `limit`. Ok(false): still
/// held by another process after `limit` (a holder stopped with SIGSTOP or frozen must not hang
/// every other process of the container).
pub(crate) fn lock_byte_within(
    fd: libc::c_int,
    off: u64,
    limit: std::time::Duration,
) -> std::io::Result<bool> {
    let start = std::time::Instant::now();
    let mut pause = std::time::Duration::from_micros(20);
    loop {
        if try_lock_byte(fd, off)? {
            return Ok(true);
        }
        if start.elapsed() >= limit {
            return Ok(false);
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(std::time::Duration::from_millis(10));
    }
}

pub(crate) fn unlock_byte(fd: libc::c_int, off: u64) {
    let fl = flock_struct(libc::F_UNLCK, off);
    // SAFETY: as in `try_lock_byte`; unlocking cannot block.
    unsafe { libc::fcntl(fd, libc::F_SETLK, &fl) };
}

/// Whether another process holds a lock on byte `off` of `fd` (never reports our own locks).
/// Works on a read-only descriptor (asks about a read lock, which any write lock conflicts with).
pub(crate) fn locked_by_other(fd: libc::c_int, off: u64) -> bool {
    let mut fl = flock_struct(libc::F_RDLCK, off);
    // SAFETY: as in `try_lock_byte`; F_GETLK writes into the live local `fl`.
    let r = unsafe { libc::fcntl(fd, libc::F_GETLK, &mut fl) };
    r == 0 && fl.l_type != libc::F_UNLCK as libc::c_short
}

pub(crate) fn getpid() -> u32 {
    // SAFETY: getpid takes no arguments and cannot fail.
    unsafe { libc::getpid() as u32 }
}

/// The process-wide lock of slot and lifecycle operations (see [`WordLock`]). Cold paths only
/// (claim, release, reclaim).
static PLOCK: AtomicU32 = AtomicU32::new(0);

pub(crate) struct ProcessLock {
    _w: WordLock<'static>,
}

impl ProcessLock {
    pub(crate) fn take() -> ProcessLock {
        ProcessLock {
            _w: WordLock::take(&PLOCK),
        }
    }
}

/// A lock between the threads of one process on a word holding the pid of its holder: after
/// `fork`, the child finds its parent's pid there if a parent thread held it, and takes it over
/// (that thread does not exist in the child). Released on drop.
pub(crate) struct WordLock<'a>(&'a AtomicU32);

impl<'a> WordLock<'a> {
    pub(crate) fn take(word: &'a AtomicU32) -> WordLock<'a> {
        let me = getpid();
        loop {
            match word.compare_exchange(0, me, Acquire, Relaxed) {
                Ok(_) => return WordLock(word),
                Err(h) if h != me => {
                    if word.compare_exchange(h, me, Acquire, Relaxed).is_ok() {
                        return WordLock(word); // held by our parent at fork time
                    }
                }
                Err(_) => std::thread::yield_now(),
            }
        }
    }
}

impl Drop for WordLock<'_> {
    fn drop(&mut self) {
        self.0.store(0, Release);
    }
}

/// Slots this process owns: (pid, device, inode, slot). Entries of another pid (inherited by a
/// forked child) do not count. Changed only under [`ProcessLock`].
struct Own {
    pid: AtomicU32,
    slot: AtomicU32,
    dev: AtomicU64,
    ino: AtomicU64,
}

const OWN_MAX: usize = 64;
#[allow(clippy::declare_interior_mutable_const)]
const OWN_EMPTY: Own = Own {
    pid: AtomicU32::new(0),
    slot: AtomicU32::new(0),
    dev: AtomicU64::new(0),
    ino: AtomicU64::new(0),
};
static OWN: [Own; OWN_MAX] = [OWN_EMPTY; OWN_MAX];

fn own_find(key: (u64, u64), slot: usize) -> Option<&'static Own> {
    let me = getpid();
    OWN.iter().find(|o| {
        o.pid.load(Acquire) == me
            && o.slot.load(Acquire) as usize == slot
            && (o.dev.load(Acquire), o.ino.load(Acquire)) == key
    })
}

/// Does this process own `slot` of the file `key` (st_dev, st_ino)?
pub(crate) fn own_has(key: (u64, u64), slot: usize) -> bool {
    own_find(key, slot).is_some()
}

/// How many slots of file `key` this process owns.
pub(crate) fn own_count(key: (u64, u64)) -> usize {
    let me = getpid();
    OWN.iter()
        .filter(|o| o.pid.load(Acquire) == me && (o.dev.load(Acquire), o.ino.load(Acquire)) == key)
        .count()
}

pub(crate) fn own_add(key: (u64, u64), slot: usize) -> bool {
    let me = getpid();
    for o in OWN.iter() {
        let p = o.pid.load(Acquire);
        if p == me {
            continue;
        }
        // Free, or left by our parent before a fork.
        o.slot.store(slot as u32, Release);
        o.dev.store(key.0, Release);
        o.ino.store(key.1, Release);
        o.pid.store(me, Release);
        return true;
    }
    false
}

pub(crate) fn own_remove(key: (u64, u64), slot: usize) {
    if let Some(o) = own_find(key, slot) {
        o.pid.store(0, Release);
    }
}
