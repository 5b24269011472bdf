//! The rate gate's seam on the shim side: every launch path calls [`launch`] with the launch's
//! key (its function or graph), stream and the real call; every memset and device-to-device
//! copy calls [`transfer`] with its kind and size. The protocol (who writes what, the
//! gate word, the admission rule) is defined once, next to the shared-memory layout, in
//! `libshare_abi::rate`.
//!
//! Every class: the container's `launches` and busy mark (`DeviceState::note_launch`) and this
//! process's slot counter. Production stops there: a TLS read, three atomic loads, two atomic
//! adds, no lock, allocation, syscall or extra driver call, and it never waits. An
//! opportunistic process (the container's class, read from the shared header on every launch so
//! a daemon's change applies at once) passes the gate (`gate.rs`).

use std::sync::atomic::Ordering::Relaxed;

use libshare_abi::{Class, DeviceState};

use crate::types::*;

/// A launch keyed `key` (its `CUfunction` or `CUgraphExec`) on `stream` (`ptsz`: the
/// per-thread default-stream variant of the call), with `params` (a kernel's `kernelParams`,
/// else NULL; read on the opportunistic path only, for demoted memory it references): counts
/// it, gates it if the process is opportunistic, and runs `call`.
#[inline(always)]
pub fn launch(
    key: usize,
    params: *mut *mut std::ffi::c_void,
    stream: CUstream,
    ptsz: bool,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    seam(key, params, call, |d, dev, remote, call| {
        crate::gate::launch(d, dev, key, remote, stream as usize, ptsz, call)
    })
}

/// [`launch`] of a `cuLaunchKernel` (`g`: its geometry; `extra` its `extra` argument): an
/// opportunistic one that reads no demoted memory and passes its arguments in `kernelParams`
/// may go as block ranges of its grid (`gate::launch_kernel`, `slicing.rs`), launched with
/// `real_launch(function, grid, kernelParams)`. Production's path is [`launch`]'s.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn launch_kernel(
    f: CUfunction,
    g: crate::gate::Geometry,
    extra: *mut *mut std::ffi::c_void,
    stream: CUstream,
    ptsz: bool,
    real_launch: impl Fn(usize, [u32; 3], *mut *mut std::ffi::c_void) -> CUresult,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let (key, stream) = (f as usize, stream as usize);
    seam(key, g.params, call, |d, dev, remote, call| {
        if remote == 0 && extra.is_null() {
            crate::gate::launch_kernel(d, dev, key, g, stream, ptsz, real_launch, call)
        } else {
            crate::gate::launch(d, dev, key, remote, stream, ptsz, call)
        }
    })
}

/// The seam itself: counts the launch (container and process), and hands an opportunistic
/// process's to `gated` with its device's state, the device and the demoted bytes its
/// parameters point into; production's runs `call` at once.
#[inline(always)]
fn seam<C: FnOnce() -> CUresult>(
    key: usize,
    params: *mut *mut std::ffi::c_void,
    call: C,
    gated: impl FnOnce(&'static DeviceState, usize, u64, C) -> CUresult,
) -> CUresult {
    let Some((s, dev, d, opportunistic)) = counted() else {
        return call();
    };
    s.launches()[dev].fetch_add(1, Relaxed);
    if opportunistic {
        let remote = crate::demote::remote_bytes(dev, key as CUfunction, params);
        return gated(d, dev, remote, call);
    }
    call()
}

/// The current device's work of this process's container, counted as one launch and marked
/// busy (`note_launch`: one add and one load): this shim, the device, its state and whether the
/// process is opportunistic. None before the shim is initialised.
#[inline(always)]
fn counted() -> Option<(
    &'static crate::process::Shim,
    usize,
    &'static DeviceState,
    bool,
)> {
    let s = crate::process::get()?;
    let dev = crate::context::device_fast();
    let state = &s.account.state;
    let d = state.device(dev);
    d.note_launch();
    Some((s, dev, d, state.header().class() == Class::Opportunistic))
}

pub use crate::gate::{COPY_D2D, MEMSET};

/// A memset or device-to-device copy of `kind` moving `bytes` on `stream` (`ptsz`: a
/// per-thread default-stream variant; a synchronous form passes the NULL stream): counted as a
/// launch of the container on the current device, marking it busy (`note_launch`; production:
/// that and nothing more, one add and one load), gated and timed as a launch if the process is
/// opportunistic, and run. The process's slot counter is left to kernels and graphs (it is
/// the driver's launch count, per process).
///
/// `gated` says whether the call is really one to gate; asked only on the opportunistic path
/// (`cuMemcpy`/`cuMemcpyAsync` ask the driver whether both pointers are device memory). Every
/// such call is counted whatever its answer: production never pays for the question, and a
/// copy through the unified call that turns out host-side still marks the container busy
/// (which errs towards protecting production).
#[inline(always)]
pub fn transfer(
    kind: usize,
    bytes: u64,
    stream: CUstream,
    ptsz: bool,
    gated: impl FnOnce() -> bool,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let Some((_, dev, d, opportunistic)) = counted() else {
        return call();
    };
    if opportunistic && gated() {
        // A copy reads and writes each byte; a memset writes it.
        let traffic = if kind == COPY_D2D {
            bytes.saturating_mul(2)
        } else {
            bytes
        };
        return crate::gate::transfer(d, dev, kind, bytes, traffic, stream as usize, ptsz, call);
    }
    call()
}

/// A launch on several devices at once (`cuLaunchCooperativeKernelMultiDevice`), one
/// (key, stream) per device: counted on each device (the device of its stream's context: a
/// primary context's device, else the current one) and, for an opportunistic process, admitted
/// by each device's gate before `call` runs. The part on the current device is timed as a
/// single launch is; the other devices' parts are not (the timing events belong to the current
/// context). A deprecated path, rarely taken: it asks the driver for each stream's context
/// (no lock, allocation or syscall in the shim).
pub fn launch_multi(launches: &[(usize, CUstream)], call: impl FnOnce() -> CUresult) -> CUresult {
    let Some(s) = crate::process::get() else {
        return call();
    };
    let ops: &dyn crate::ops::DriverOps = &crate::ops::REAL;
    let current = crate::context::device_fast();
    let device_of = |stream: CUstream| {
        ops.stream_ctx(stream as usize)
            .and_then(|c| s.primary.iter().position(|p| p.load(Relaxed) == c))
            .unwrap_or(current)
    };
    let state = &s.account.state;
    let opportunistic = state.header().class() == Class::Opportunistic;
    let mut timed = None;
    for &(key, stream) in launches {
        let dev = device_of(stream);
        let d = state.device(dev);
        d.note_launch();
        s.launches()[dev].fetch_add(1, Relaxed);
        if opportunistic {
            if dev == current && timed.is_none() {
                timed = Some((d, key, stream));
            } else {
                crate::gate::admit_untimed(d, dev, key);
            }
        }
    }
    match timed {
        Some((d, key, stream)) => {
            crate::gate::launch(d, current, key, 0, stream as usize, false, call)
        }
        None => call(),
    }
}

/// A synchronising call returned with its work done (`sync.rs`): the drain hint on `ctx`'s
/// device (None: the current context's).
pub fn drained(ctx: Option<usize>) {
    let Some(s) = crate::process::get() else {
        return;
    };
    let dev = ctx
        .and_then(|c| {
            s.primary
                .iter()
                .position(|p| p.load(Relaxed) == c && c != 0)
        })
        .unwrap_or_else(crate::context::device_fast);
    let d = s.account.state.device(dev);
    d.note_drained();
    if s.account.state.header().class() == Class::Opportunistic {
        crate::gate::settle(d, dev);
    }
}
