//! The rate gate's home on the shim side. Every launch path calls [`admit`] with what the gate
//! needs (the device, the stream, the grid); today it only counts, per process and device, in
//! the container's shared state. The gate's semantics (open, paused, a GPU-time budget and an
//! in-flight window) are defined once, next to the shared-memory layout, in
//! `libshare_abi::rate`; the daemon writes them, and the opportunistic shims will wait here
//! (futex on the word or short sleeps, never a busy loop). Production launches never wait.
//!
//! Hot path: an atomic load, a TLS read, an atomic add. No lock, allocation or syscall.

use std::sync::atomic::Ordering::Relaxed;

use crate::types::*;

/// A launch of `blocks` blocks on `stream` is about to be issued.
#[inline(always)]
pub fn admit(_stream: CUstream, _blocks: u64) {
    if let Some(s) = crate::process::get() {
        s.launches()[crate::context::device_fast()].fetch_add(1, Relaxed);
    }
}
