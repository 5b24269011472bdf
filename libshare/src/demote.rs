//! The shim's side of the demotion protocol (`libshare_abi::demote` has the protocol and its
//! bound):
//! - production: [`make_room`], on the allocation path only when the daemon's `protect` word is
//!   fresh (one relaxed load otherwise, beside the class and flags already loaded);
//! - opportunistic, oversubscribing: [`track`]/[`untrack`] keep this process's managed
//!   allocations (a lock on that path only), and a thread started at the first one waits on the
//!   container's `gate_seq` (at most [`POLL_NS`]) and demotes or promotes them as the daemon's
//!   target says, with the driver API only (`cuMemAdvise`, `cuMemPrefetchAsync` on its own
//!   stream per context, `cuStreamSynchronize`, `cuMemGetInfo`).
//!
//! Nothing here fails a job: a driver call that fails drops the allocation from the list (it
//! was freed behind our back, or its context is gone) and the thread goes on.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::Mutex;

use libshare_abi::demote::{protected, WAIT_BOUND_NS};
use libshare_abi::rate::{futex_wait, now_ns};
use libshare_abi::{Class, MAX_DEVICES};

use crate::ops::{DriverOps, REAL};
use crate::per_process::PerProcess;
use crate::process::Shim;
use crate::types::*;

/// The demotion thread's longest wait between two looks at the daemon's target.
pub const POLL_NS: u64 = 20_000_000;
/// How often a waiting production allocation asks the driver for free memory.
const RECHECK_NS: u64 = 1_000_000;

const CU_MEM_ADVISE_SET_PREFERRED_LOCATION: u32 = 3;
const CU_DEVICE_CPU: CUdevice = -1;
const CU_STREAM_NON_BLOCKING: u32 = 1;

/// Production: before a device allocation of `size` bytes in the current context, while the
/// daemon protects this container, waits (at most [`WAIT_BOUND_NS`]) for the driver to report
/// `size` bytes free, having posted what is missing. Returns how long it waited, ns (0: it
/// fitted, or no protection).
#[inline]
pub fn make_room(sh: &Shim, size: u64) -> u64 {
    let protect = sh.account.state.header().protect();
    if protect == 0 {
        return 0;
    }
    wait_for_room(sh, size, protect)
}

#[cold]
fn wait_for_room(sh: &Shim, size: u64, protect: u32) -> u64 {
    let start = now_ns();
    let dev = match crate::context::current_device() {
        Some(d) if d < MAX_DEVICES => d,
        _ => return 0,
    };
    if sh.account.state.header().class() != Class::Production || !protected(protect, start) {
        return 0;
    }
    let Some(f) = free() else { return 0 };
    if f >= size {
        return 0;
    }
    sh.account.state.device(dev).post_want(size - f);
    loop {
        let now = now_ns();
        if now.saturating_sub(start) >= WAIT_BOUND_NS {
            return now - start;
        }
        std::thread::sleep(std::time::Duration::from_nanos(RECHECK_NS));
        if free().is_none_or(|f| f >= size) {
            return now_ns() - start;
        }
    }
}

/// The driver's free memory on the current context's device.
fn free() -> Option<u64> {
    REAL.mem_info().ok().map(|(f, _)| f)
}

/// One managed allocation of this process.
struct Tracked {
    ptr: CUdeviceptr,
    size: u64,
    dev: usize,
    ctx: usize,
    demoted: bool,
}

#[derive(Default)]
struct Tracker {
    /// In allocation order (oldest first).
    list: Mutex<Vec<Tracked>>,
    started: AtomicBool,
    /// Own stream per context (context → stream).
    streams: Mutex<Vec<(usize, usize)>>,
}

static TRACKER: PerProcess<Tracker> = PerProcess::new();
/// Bytes of this process's allocations demoted now (every device): launches look for them in
/// their parameters only while this is nonzero (see [`remote_bytes`]).
static DEMOTED: AtomicU64 = AtomicU64::new(0);
/// A kernel's parameters looked at for demoted pointers, at most.
const MAX_PARAMS: usize = 256;

/// Set once any process image of ours tracked an allocation: `untrack` does nothing before
/// (every free passes there; production's frees then pay one relaxed load).
static ANY: AtomicBool = AtomicBool::new(false);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Opportunistic, oversubscribing: `ptr` (managed, `size` bytes, made on `dev` in the current
/// context) may be demoted on the daemon's request. Starts the demotion thread once.
pub fn track(ptr: CUdeviceptr, size: u64, dev: usize) {
    let mut ctx: CUcontext = std::ptr::null_mut();
    let Some(get) = crate::driver::real().cuCtxGetCurrent else {
        return;
    };
    // SAFETY: the real driver's cuCtxGetCurrent with a live local out-pointer.
    if unsafe { get(&mut ctx) } != CUDA_SUCCESS || ctx.is_null() || dev >= MAX_DEVICES {
        return;
    }
    let t = TRACKER.get();
    lock(&t.list).push(Tracked {
        ptr,
        size,
        dev,
        ctx: ctx as usize,
        demoted: false,
    });
    ANY.store(true, Release);
    if !t.started.swap(true, AcqRel) {
        let spawned = std::thread::Builder::new()
            .name("libshare-demote".into())
            .spawn(run);
        if spawned.is_err() {
            t.started.store(false, Release);
        }
    }
}

/// A managed allocation freed (before the driver's free): forgotten, its demoted bytes too.
#[inline]
pub fn untrack(ptr: CUdeviceptr) {
    if ANY.load(Relaxed) {
        forget(ptr);
    }
}

#[cold]
fn forget(ptr: CUdeviceptr) {
    let mut l = lock(&TRACKER.get().list);
    if let Some(i) = l.iter().position(|t| t.ptr == ptr) {
        let t = l.remove(i);
        if t.demoted {
            DEMOTED.fetch_sub(t.size, AcqRel);
            if let Some(sh) = crate::process::get() {
                sh.account.state.device(t.dev).forget_demoted(t.size);
            }
        }
    }
}

/// The demotion thread: forever, look at each device's target and act, then wait.
fn run() {
    loop {
        let Some(sh) = crate::process::get() else {
            std::thread::sleep(std::time::Duration::from_nanos(POLL_NS));
            continue;
        };
        let devs: Vec<usize> = {
            let mut v: Vec<usize> = lock(&TRACKER.get().list).iter().map(|t| t.dev).collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        let first = devs.first().copied().unwrap_or(0);
        let seq = sh.account.state.device(first).gate_seq.load(Acquire);
        if sh.account.exited() {
            return;
        }
        if sh.account.state.oversubscribes() {
            for &d in &devs {
                step(sh, d);
            }
        }
        futex_wait(&sh.account.state.device(first).gate_seq, seq, POLL_NS);
    }
}

/// One look at device `dev`'s target.
fn step(sh: &Shim, dev: usize) {
    let ds = sh.account.state.device(dev);
    let (mine_resident, mine_demoted) = {
        let l = lock(&TRACKER.get().list);
        l.iter().filter(|t| t.dev == dev).fold((0, 0), |(r, d), t| {
            if t.demoted {
                (r, d + t.size)
            } else {
                (r + t.size, d)
            }
        })
    };
    let claim = ds.claim_demotion(mine_resident);
    if claim > 0 {
        let (done, moves) = move_some(dev, claim, true);
        ds.settle_demoted(true, claim, done);
        ds.migrations.fetch_add(moves, AcqRel);
        return;
    }
    // Promotion: `demoted` drops only once the bytes are back (their prefetches synchronised),
    // so the daemon sees when a container's memory is in (exclusive turns measure a switch so).
    // Each process promotes only its own allocations: no claim needed.
    if mine_demoted > 0 && ds.demote.load(Acquire) == 0 {
        let (done, moves) = move_some(dev, mine_demoted, false);
        ds.forget_demoted(done);
        ds.migrations.fetch_add(moves, AcqRel);
    }
}

/// Demotes (oldest first) or promotes (newest first, while the driver reports room) whole
/// allocations on `dev` until `bytes` are covered; returns the bytes moved and how many
/// allocations, once the moves are done (their streams synchronised).
fn move_some(dev: usize, bytes: u64, demote: bool) -> (u64, u32) {
    let r = crate::driver::real();
    let (Some(advise), Some(prefetch), Some(set_ctx), Some(sync)) = (
        r.cuMemAdvise,
        r.cuMemPrefetchAsync,
        r.cuCtxSetCurrent,
        r.cuStreamSynchronize,
    ) else {
        return (0, 0);
    };
    let t = TRACKER.get();
    let mut moved = 0u64;
    let mut moves = 0u32;
    let mut used_streams: Vec<usize> = Vec::new();
    {
        let mut l = lock(&t.list);
        let n = l.len();
        let order: Vec<usize> = if demote {
            (0..n).collect()
        } else {
            (0..n).rev().collect()
        };
        let mut dead = Vec::new();
        for i in order {
            if moved >= bytes {
                break;
            }
            let a = &mut l[i];
            if a.dev != dev || a.demoted == demote {
                continue;
            }
            // SAFETY: the real driver's calls on a context and a range this process made
            // (the driver checks both and returns an error for one gone).
            let ok = unsafe {
                set_ctx(a.ctx as CUcontext) == CUDA_SUCCESS && {
                    if !demote && REAL.mem_info().map_or(true, |(f, _)| f < a.size) {
                        break;
                    }
                    let Some(s) = stream_of(&t.streams, a.ctx) else {
                        break;
                    };
                    let to = if demote {
                        CU_DEVICE_CPU
                    } else {
                        // The node's GPU, named to the driver by its CUDA ordinal.
                        crate::devmap::ordinal_of(a.dev).unwrap_or(0)
                    };
                    let sz = a.size as usize;
                    advise(a.ptr, sz, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, to) == CUDA_SUCCESS
                        && prefetch(a.ptr, sz, to, s as CUstream) == CUDA_SUCCESS
                        && {
                            if !used_streams.contains(&s) {
                                used_streams.push(s);
                            }
                            true
                        }
                }
            };
            if ok {
                if demote {
                    DEMOTED.fetch_add(a.size, AcqRel);
                } else {
                    DEMOTED.fetch_sub(a.size, AcqRel);
                }
                a.demoted = demote;
                moved += a.size;
                moves += 1;
            } else {
                dead.push(i);
            }
        }
        dead.sort_unstable_by(|a, b| b.cmp(a));
        for i in dead {
            if l[i].demoted {
                DEMOTED.fetch_sub(l[i].size, AcqRel);
            }
            l.remove(i);
        }
    }
    for s in used_streams {
        // SAFETY: the real driver's cuStreamSynchronize on a stream this thread created.
        unsafe { sync(s as CUstream) };
    }
    (moved, moves)
}

/// This thread's stream in context `ctx` (current), made once.
fn stream_of(streams: &Mutex<Vec<(usize, usize)>>, ctx: usize) -> Option<usize> {
    let mut l = lock(streams);
    if let Some((_, s)) = l.iter().find(|(c, _)| *c == ctx) {
        return Some(*s);
    }
    let create = crate::driver::real().cuStreamCreate?;
    let mut s: CUstream = std::ptr::null_mut();
    // SAFETY: the real driver's cuStreamCreate with a live local out-pointer, in the current
    // context.
    if unsafe { create(&mut s, CU_STREAM_NON_BLOCKING) } != CUDA_SUCCESS {
        return None;
    }
    l.push((ctx, s as usize));
    Some(s as usize)
}

/// Opportunistic: the bytes of this process's demoted allocations on `dev` that a launch of `f`
/// with `params` (`cuLaunchKernel`'s `kernelParams`) references — what the kernel will read
/// over PCIe. 0 at the cost of one load while nothing is demoted. A parameter (or any 8-byte
/// word of a by-value struct) holding an address inside a demoted allocation references it,
/// as the driver's fault handler would find it used; the parameters' layout comes from
/// `cuFuncGetParamInfo` (CUDA 12.4+). A launch whose layout the driver does not give (an older
/// driver, a `CUkernel` handle, parameters passed through `extra`) counts as referencing none.
pub fn remote_bytes(dev: usize, f: CUfunction, params: *mut *mut std::ffi::c_void) -> u64 {
    if DEMOTED.load(Relaxed) == 0 || params.is_null() || f.is_null() {
        return 0;
    }
    scan(dev, f, params)
}

#[cold]
fn scan(dev: usize, f: CUfunction, params: *mut *mut std::ffi::c_void) -> u64 {
    let Some(info) = crate::driver::real().cuFuncGetParamInfo else {
        return 0;
    };
    let mut demoted: Vec<(u64, u64, bool)> = lock(&TRACKER.get().list)
        .iter()
        .filter(|t| t.dev == dev && t.demoted)
        .map(|t| (t.ptr, t.size, false))
        .collect();
    if demoted.is_empty() {
        return 0;
    }
    for i in 0..MAX_PARAMS {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: the real driver's call with live local out-pointers; it checks `f`.
        if unsafe { info(f, i, &mut offset, &mut size) } != CUDA_SUCCESS {
            break;
        }
        // SAFETY: `kernelParams` holds one pointer per parameter of `f` (the launch's
        // contract, which the driver checks the same way), each to `size` bytes.
        let p = unsafe { *params.add(i) } as *const u8;
        if p.is_null() {
            break;
        }
        for w in 0..size / 8 {
            // SAFETY: within the parameter's `size` bytes; unaligned read of plain bytes.
            let v = unsafe { std::ptr::read_unaligned(p.add(w * 8) as *const u64) };
            for (ptr, len, hit) in demoted.iter_mut() {
                *hit |= v >= *ptr && v < *ptr + *len;
            }
        }
    }
    demoted.iter().filter(|d| d.2).map(|d| d.1).sum()
}
