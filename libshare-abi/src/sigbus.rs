//! Surviving the truncation of a mapped state file.
//!
//! Touching a page of a shared file mapping beyond the file's end raises SIGBUS, which kills the
//! process by default: without this, `truncate -s 0 state.shm` would kill every job of the
//! container. A handler, installed once per process by the first State that maps a file,
//! recognises faults inside a registered mapping:
//! - a read-write mapping (a State that owns slots): `ftruncate` on its own descriptor restores
//!   the size (the lost pages come back as zeros, the trailer's epoch among them), so every
//!   process of the container notices the loss at its next charge and repairs the state from
//!   what it knows (see `State::recover`);
//! - a read-only view (`sharectl`, an NVML-only reader): anonymous zero pages are mapped over the
//!   rest of the view (the file is not ours to change);
//!
//! and returns, so the faulting instruction runs again on the restored page. A fault anywhere
//! else goes to the handler that was installed before ours (Rust's stack-overflow handler, a
//! JVM's, …), or to the default action. `ftruncate`, `mmap` and `sigaction` are plain system calls, safe in a signal handler.
//!
//! Limits: a handler installed later by the application that does not chain to ours takes the
//! signal; a process that loses its descriptor (it closed it) cannot restore the size (the
//! fault then goes to the previous handler); the content lost with the truncation is repaired
//! from the live processes' own records, as `State::recover` describes.

use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering::*};
use std::sync::Once;

struct Map {
    base: AtomicUsize,
    len: AtomicUsize,
    /// The descriptor to `ftruncate` (read-write mappings), or -1 (views).
    fd: AtomicI32,
}

/// Mappings protected per process: a job maps one state file, the daemon one per container of
/// the node (a mapping past this many is unprotected: its truncation is fatal to the process).
const MAPS_MAX: usize = 1024;
#[allow(clippy::declare_interior_mutable_const)]
const MAP_EMPTY: Map = Map {
    base: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    fd: AtomicI32::new(-1),
};
static MAPS: [Map; MAPS_MAX] = [MAP_EMPTY; MAPS_MAX];

struct OldAction(UnsafeCell<MaybeUninit<libc::sigaction>>);
// SAFETY: written once inside `INSTALL.call_once`, before our handler is installed (so before
// it can run); only read afterwards.
unsafe impl Sync for OldAction {}
static OLD: OldAction = OldAction(UnsafeCell::new(MaybeUninit::uninit()));
static INSTALL: Once = Once::new();
static INSTALLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Registers a mapping (installing the handler on first use). `fd` is -1 for a read-only view.
/// Returns false if the table is full (the mapping is then unprotected).
pub(crate) fn register(base: usize, len: usize, fd: i32) -> bool {
    install();
    for m in MAPS.iter() {
        if m.base
            .compare_exchange(0, usize::MAX, AcqRel, Acquire)
            .is_ok()
        {
            m.len.store(len, Release);
            m.fd.store(fd, Release);
            m.base.store(base, Release);
            return true;
        }
    }
    false
}

pub(crate) fn unregister(base: usize) {
    for m in MAPS.iter() {
        if m.base.load(Acquire) == base {
            m.base.store(0, Release);
        }
    }
}

fn install() {
    INSTALL.call_once(|| {
        // SAFETY: an all-zero sigaction is a valid value; we fill the fields we use.
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = handler as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER;
        // SAFETY: `sa.sa_mask` is a live sigset_t inside a local.
        unsafe { libc::sigemptyset(&mut sa.sa_mask) };
        // SAFETY: OLD is written here only, once, before the handler can run; `sa` is a live
        // local. sigaction stores the previous action into OLD.
        let r = unsafe { libc::sigaction(libc::SIGBUS, &sa, (*OLD.0.get()).as_mut_ptr()) };
        INSTALLED.store(r == 0, Release);
    });
}

extern "C" fn handler(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler; si_addr is the
    // faulting address for SIGBUS.
    let addr = unsafe { (*info).si_addr() } as usize;
    for m in MAPS.iter() {
        let base = m.base.load(Acquire);
        if base == 0 || base == usize::MAX {
            continue;
        }
        let len = m.len.load(Acquire);
        if addr < base || addr >= base + len {
            continue;
        }
        let fd = m.fd.load(Acquire);
        if fd >= 0 {
            // SAFETY: ftruncate on a descriptor the registering State keeps open; it only
            // changes the file's size.
            if unsafe { libc::ftruncate(fd, len as libc::off_t) } == 0 {
                // The trailer (end of the file) now reads 0: every process sees the loss.
                return;
            }
        } else {
            let page = addr & !(4095usize);
            // SAFETY: replaces the pages of our own view from the faulting page to its end
            // with anonymous zero pages (MAP_FIXED inside a range this process mapped and
            // still owns); nothing else lives there.
            let p = unsafe {
                libc::mmap(
                    page as *mut libc::c_void,
                    base + len - page,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                return;
            }
        }
        break;
    }
    // Not ours: the previous handler, or the default action.
    // SAFETY: OLD was initialised before our handler was installed (INSTALL.call_once).
    let old = unsafe { (*OLD.0.get()).assume_init_ref() };
    let h = old.sa_sigaction;
    if h == libc::SIG_DFL || h == libc::SIG_IGN {
        // SAFETY: restores the default action; returning re-executes the fault, which then
        // terminates the process as it would have without us.
        unsafe {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(sig, &dfl, std::ptr::null_mut());
        }
    } else if old.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous handler was installed with SA_SIGINFO, so it has this prototype;
        // we pass the kernel's own arguments through.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(h) };
        f(sig, info, ctx);
    } else {
        // SAFETY: a plain handler (no SA_SIGINFO) takes only the signal number.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(h) };
        f(sig);
    }
}
