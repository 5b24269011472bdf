//! The shim's side of the bound on memory that cannot be demoted (`libshare_abi::pin` has the
//! protocol and why its figures are never low), and of the host-memory reservation of managed
//! memory (`host_mem.rs`):
//! - [`admit`]: after a non-managed charge of an opportunistic, bounded container, the check of
//!   its pinned memory against the daemon's cap, under the container's pin lock (at most one
//!   wait for the daemon to look again);
//! - [`managed_charged`] / [`managed_freed`]: a managed allocation's bytes recorded as managed
//!   in the process's slot (after its charge; before its uncharge), recorded under the pin lock
//!   where the container is bounded or the host's room is checked — so two processes reserving
//!   host room at once are decided one after the other, on a footprint that holds the first.
//!
//! Production never takes the lock: its allocation path loads the class it already loaded.

use std::sync::atomic::{AtomicBool, Ordering::*};

use libshare_abi::pin::WANT_WAIT_NS;
use libshare_abi::rate::{futex_wait, now_ns};
use libshare_abi::units::format_size;

use crate::process::Account;

/// What [`admit`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    Yes,
    /// Refused: the charge was returned (counted by the caller).
    No,
    /// The charge was returned while the daemon looked again: charge again, then ask with
    /// `retry` true.
    Again,
}

/// After `bytes` of non-managed memory were charged on `dev`: whether they stay within what
/// the daemon lets the container hold pinned there. On [`Admit::No`] and [`Admit::Again`] the
/// charge has been returned. `retry`: the second look, after the daemon's (no more waiting).
#[inline]
pub fn admit(acc: &Account, dev: usize, bytes: u64, retry: bool) -> Admit {
    if acc.exited() || !acc.state.pin_bounded() {
        return Admit::Yes;
    }
    check(acc, dev, bytes, retry)
}

#[cold]
fn check(acc: &Account, dev: usize, bytes: u64, retry: bool) -> Admit {
    let st = &acc.state;
    let d = st.device(dev);
    let Some(g) = st.pin_lock() else {
        acc.uncharge(dev, bytes);
        tracing::debug!(dev, "pin lock held too long by another process: refused");
        return Admit::No;
    };
    let (cap, pinned) = (d.pin_cap.load(Acquire), st.pinned(dev));
    if pinned <= cap {
        return Admit::Yes;
    }
    // Returned under the lock: the next reader does not see it.
    acc.uncharge(dev, bytes);
    let gen = d.pin_gen.load(Acquire);
    if !retry {
        st.post_pin_want(dev, bytes);
    }
    drop(g);
    if retry {
        say_once(bytes, dev, cap);
        return Admit::No;
    }
    let deadline = now_ns() + WANT_WAIT_NS;
    while d.pin_gen.load(Acquire) == gen {
        let now = now_ns();
        if now >= deadline {
            break;
        }
        futex_wait(&d.pin_gen, gen, (deadline - now).min(20_000_000));
    }
    Admit::Again
}

/// Whether the container holds more pinned memory on `dev` than its cap (a bounded,
/// opportunistic one: e.g. after a pool grew beyond what its allocation charged).
pub fn over(acc: &Account, dev: usize) -> bool {
    let st = &acc.state;
    if acc.exited() || !st.pin_bounded() {
        return false;
    }
    let _g = st.pin_lock();
    st.pinned(dev) > st.device(dev).pin_cap.load(Acquire)
}

fn say_once(bytes: u64, dev: usize, cap: u64) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, AcqRel) {
        eprintln!(
            "libshare: refused an allocation of {} on device {dev} (CUDA_ERROR_OUT_OF_MEMORY): \
             this opportunistic container's memory that cannot be demoted (VMM, stream-ordered \
             pools, arrays, graph memory, and device memory unless it oversubscribes) would \
             exceed the {} that production containers leave it on the GPU; lower production's \
             quotas or use memory that can be demoted (sharectl set --oversubscribe, cudaMalloc)",
            format_size(bytes),
            format_size(cap)
        );
    }
}

/// After `bytes` of managed memory were charged on `dev`: records them as managed. With
/// `host`, first checks that the container's whole managed footprint with them fits the host
/// memory its pages could be demoted to (`host_mem.rs`). False: refused, nothing recorded (the
/// caller returns the charge).
pub fn managed_charged(acc: &Account, dev: usize, bytes: u64, host: bool) -> bool {
    if acc.exited() {
        return true;
    }
    let st = &acc.state;
    if !host && !st.pin_bounded() {
        st.add_managed(acc.slot, dev, bytes);
        return true;
    }
    let Some(_g) = st.pin_lock() else {
        return false;
    };
    if host && !crate::host_mem::fits(st, bytes, dev) {
        return false;
    }
    st.add_managed(acc.slot, dev, bytes);
    true
}

/// Before `bytes` of managed memory charged on `dev` are uncharged (freed, or refused after
/// the charge). No lock: lowering `managed` before the net can only make a pinned reading
/// high (it reads the net first).
pub fn managed_freed(acc: &Account, dev: usize, bytes: u64) {
    if !acc.exited() {
        acc.state.sub_managed(acc.slot, dev, bytes);
    }
}
