//! Managed (unified) memory, tracked per 2 MiB chunk, as NVIDIA's UVM driver tracks it
//! (`kernel-open/nvidia-uvm`: 2 MiB VA blocks backed by 2 MiB root chunks).
//!
//! The bytes always live in host memory (kernels do not run, so no data has to move); what is
//! modelled is *residency* and what moving it costs (`simgpu/README.md` § Managed memory says
//! where each rule comes from):
//! - memory is taken on the device at first touch, not at allocation;
//! - a kernel that references a chunk not resident faults it in: one fault batch (`cost.fault`)
//!   plus 2 MiB at the fault-driven migration rate (`cost.fault_bandwidth`, below the copy
//!   engine's); `cuMemPrefetchAsync` moves chunks on the copy engine at `cost.pcie_bandwidth`,
//!   with no fault cost;
//! - when the device is full, the chunk *migrated in* longest ago is evicted (written back at
//!   PCIe bandwidth): the driver's LRU list is ordered by when a chunk was allocated to a VA
//!   block, never by kernel accesses to resident pages, which the driver does not see. Chunks of
//!   processes that died are dropped first, with no write-back. `cuMemAlloc` evicts the same way
//!   and returns once the write-back is done (on the device-to-host copy engine);
//! - chunks advised to prefer the CPU are not migrated: a kernel reads them over PCIe;
//! - every migration, write-back and remote read is counted in the device's PCIe byte windows
//!   (NVML's `nvmlDeviceGetPcieThroughput`), resident chunks in its used memory.
//!
//! Residency lives in the shared state, so processes evict each other's chunks and
//! oversubscription thrashes as on a real GPU. A kernel references the managed allocations
//! passed as its pointer arguments (when its parameter layout is known), else all of its
//! process's.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::atomic::Ordering::*;

use super::{map_anon, Alloc, Kind};
use crate::driver::{current_ctx, out, stream_ref, submit, R};
use crate::engine::{Extra, Op, Resource};
use crate::shared::{owner_word, SlotTable, CHUNK};
use crate::sim::{sim, Sim};
use crate::types::*;
use crate::{driver, driver_ptds};

struct Managed {
    size: u64,
    dev: usize,
    prefer_cpu: bool,
    /// What `cuMemAdvise` and `cuMemPrefetchAsync` recorded, for `cuMemRangeGetAttribute`
    /// (device ordinals; CU_DEVICE_CPU = -1 for the host).
    read_mostly: bool,
    preferred: Option<i32>,
    accessed_by: Vec<i32>,
    last_prefetch: Option<i32>,
    /// Per chunk: (entry index in the shared table or u32::MAX, tag).
    chunks: Vec<(u32, u64)>,
}

static STATE: Mutex<BTreeMap<u64, Managed>> = Mutex::new(BTreeMap::new());
static NEXT_TAG: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn my_word(s: &Sim) -> u64 {
    owner_word(s.slot, s.generation)
}

fn transfer_ns(s: &Sim, bytes: u64) -> u64 {
    at_rate(bytes, s.cfg.cost.pcie_bytes_per_s)
}

fn at_rate(bytes: u64, per_s: u64) -> u64 {
    (bytes as u128 * 1_000_000_000 / per_s.max(1) as u128) as u64
}

fn is_resident(s: &Sim, dev: usize, entry: u32, tag: u64) -> bool {
    entry != u32::MAX && {
        let e = &s.shared.chunks(dev)[entry as usize];
        e.owner.load(Acquire) == my_word(s) && e.tag.load(Acquire) == tag
    }
}

/// Evicts resident chunks (any process) in the order they were migrated in, oldest first,
/// skipping the table entries in `keep` (sorted: the chunks the operation itself uses), until
/// `need` bytes are freed. Returns the bytes freed; they are written back to the host over PCIe
/// from `now` (counted in the device's PCIe throughput).
fn evict(s: &Sim, dev: usize, need: u64, keep: &[u32], now: u64) -> u64 {
    let table = s.shared.chunks(dev);
    let mut cands: Vec<(u64, usize, u64)> = table
        .iter()
        .enumerate()
        .filter_map(|(i, e)| {
            let o = e.owner.load(Acquire);
            let t = e.last_use.load(Acquire);
            (o != 0 && keep.binary_search(&(i as u32)).is_err()).then_some((t, i, o))
        })
        .collect();
    cands.sort_unstable();
    let mut freed = 0;
    for (_, i, o) in cands {
        if freed >= need {
            break;
        }
        if table[i]
            .owner
            .compare_exchange(o, 0, AcqRel, Acquire)
            .is_ok()
        {
            crate::shared::sub_saturating(&s.shared.dev(dev).mem_used, CHUNK);
            s.shared.dev(dev).evicted_bytes.fetch_add(CHUNK, AcqRel);
            freed += CHUNK;
        }
    }
    let d = s.shared.dev(dev);
    d.pcie_tx
        .add_spread(now, now + transfer_ns(s, freed), freed);
    freed
}

/// Frees device memory for an allocation by evicting managed chunks; returns bytes freed. As
/// with the driver (RM's allocation asks UVM, through PMA's eviction callback, to evict root
/// chunks, which it copies to the host before it returns them), the caller waits for the
/// write-back: it takes the device-to-host copy engine from now for its bytes at PCIe bandwidth.
pub fn evict_bytes(s: &Sim, dev: usize, need: u64) -> u64 {
    let now = crate::shared::now_ns();
    let freed = evict(s, dev, need, &[], now);
    if freed > 0 {
        let d = s.shared.dev(dev);
        let (_, end) =
            crate::shared::Shared::reserve(&d.d2h_busy_until, now, transfer_ns(s, freed));
        crate::shared::sleep_until(end);
    }
    freed
}

/// How chunks come to the device: a kernel's page faults or a prefetch on the copy engine.
#[derive(Clone, Copy, PartialEq)]
enum Migrate {
    Fault,
    Prefetch,
}

/// Makes the given chunks resident at modelled time `now`; returns the modelled cost in ns.
fn fault_in(s: &Sim, dev: usize, bases: &[u64], now: u64, how: Migrate) -> u64 {
    let mut st = STATE.lock();
    let d = s.shared.dev(dev);
    let total = d.mem_total.load(Acquire);
    let table = s.shared.chunks(dev);
    let c = &s.cfg.cost;
    let mut cost = 0u64;
    let mut remote = 0u64; // bytes read over PCIe without migrating
                           // Pass 1: what is resident (kept from eviction), what is missing. A resident chunk's place
                           // in the eviction order does not change: the driver never sees accesses to resident pages.
    let mut missing = 0u64;
    let mut keep = Vec::new();
    for base in bases {
        let Some(m) = st.get(base).filter(|m| m.dev == dev) else {
            continue;
        };
        if m.prefer_cpu {
            remote += m.size; // read remotely over PCIe, no migration
            continue;
        }
        for ch in &m.chunks {
            if is_resident(s, dev, ch.0, ch.1) {
                keep.push(ch.0);
            } else {
                missing += 1;
            }
        }
    }
    keep.sort_unstable();
    let mut migrated = 0u64;
    let mut evicted = 0u64;
    if missing > 0 {
        // Make room once for all of them: a dead process's chunks went with it (no write-back),
        // then the chunks migrated in longest ago, never this operation's own.
        let free = |d: &crate::shared::DevState| total.saturating_sub(d.mem_used.load(Acquire));
        if missing * CHUNK > free(d) {
            s.shared.reclaim_dead();
        }
        if missing * CHUNK > free(d) {
            evicted = evict(s, dev, missing * CHUNK - free(d), &keep, now);
            cost += transfer_ns(s, evicted);
        }
    }
    // Pass 2: claim a table entry per missing chunk while device memory lasts.
    let word = my_word(s);
    let mut hint = 0usize;
    for base in bases {
        if missing == 0 {
            break;
        }
        let Some(m) = st.get_mut(base).filter(|m| m.dev == dev && !m.prefer_cpu) else {
            continue;
        };
        for ch in m.chunks.iter_mut() {
            if is_resident(s, dev, ch.0, ch.1) {
                continue;
            }
            let charged = d
                .mem_used
                .fetch_update(AcqRel, Acquire, |u| {
                    (u + CHUNK <= total).then_some(u + CHUNK)
                })
                .is_ok();
            let slot = if charged {
                (0..table.len())
                    .map(|k| (hint + k) % table.len())
                    .find(|&i| {
                        table[i].owner.load(Acquire) == 0
                            && table[i]
                                .owner
                                .compare_exchange(0, word, AcqRel, Acquire)
                                .is_ok()
                    })
            } else {
                None
            };
            match slot {
                Some(i) => {
                    let tag = NEXT_TAG.fetch_add(1, Relaxed);
                    table[i].tag.store(tag, Release);
                    // The migration time orders the eviction list.
                    table[i].last_use.store(now, Release);
                    *ch = (i as u32, tag);
                    hint = i + 1;
                    migrated += CHUNK;
                }
                None => {
                    if charged {
                        crate::shared::sub_saturating(&d.mem_used, CHUNK);
                    }
                    // Working set larger than the device: this chunk is read remotely.
                    remote += CHUNK;
                }
            }
        }
    }
    d.migrated_bytes.fetch_add(migrated, AcqRel);
    cost += match how {
        Migrate::Fault => (migrated / CHUNK) * c.fault_ns + at_rate(migrated, c.fault_bytes_per_s),
        Migrate::Prefetch => at_rate(
            migrated,
            c.prefetch_bytes_per_s.unwrap_or(c.pcie_bytes_per_s),
        ),
    };
    cost += transfer_ns(s, remote);
    let start = now + transfer_ns(s, evicted);
    d.pcie_rx
        .add_spread(start, now + cost.max(1), migrated + remote);
    cost
}

/// Moves this process's chunks of [p, p+len) back to the host at modelled time `now`; returns
/// the modelled cost.
fn evict_range(s: &Sim, p: u64, len: u64, now: u64) -> u64 {
    let mut st = STATE.lock();
    let mut bytes = 0;
    let mut dev = None;
    for (base, m) in st.range_mut(..p + len) {
        if base + m.size <= p {
            continue;
        }
        for (k, c) in m.chunks.iter_mut().enumerate() {
            let cs = base + k as u64 * CHUNK;
            if cs + CHUNK <= p || cs >= p + len || !is_resident(s, m.dev, c.0, c.1) {
                continue;
            }
            let e = &s.shared.chunks(m.dev)[c.0 as usize];
            if e.owner
                .compare_exchange(my_word(s), 0, AcqRel, Acquire)
                .is_ok()
            {
                crate::shared::sub_saturating(&s.shared.dev(m.dev).mem_used, CHUNK);
                bytes += CHUNK;
                dev = Some(m.dev);
            }
            c.0 = u32::MAX;
        }
    }
    let cost = transfer_ns(s, bytes);
    if let Some(d) = dev {
        s.shared.dev(d).pcie_tx.add_spread(now, now + cost, bytes);
    }
    cost
}

/// The extra modelled time a kernel pays to fault in the managed memory it references.
pub fn touch_for_kernel(_s: &Sim, dev: usize, ptr_args: Option<Vec<u64>>) -> Option<Extra> {
    let st = STATE.lock();
    if st.is_empty() {
        return None;
    }
    let bases: Vec<u64> = match ptr_args {
        Some(args) => args
            .into_iter()
            .filter_map(|a| {
                st.range(..=a)
                    .next_back()
                    .filter(|(b, m)| a < *b + m.size)
                    .map(|(b, _)| *b)
            })
            .collect(),
        None => st
            .iter()
            .filter(|(_, m)| m.dev == dev)
            .map(|(b, _)| *b)
            .collect(),
    };
    drop(st);
    if bases.is_empty() {
        return None;
    }
    Some(Box::new(move |now| {
        crate::sim::get().map_or(0, |s| fault_in(s, dev, &bases, now, Migrate::Fault))
    }))
}

/// Called when a managed allocation is freed: releases its resident chunks.
pub fn forget(s: &Sim, base: u64, _a: &Alloc) {
    if let Some(m) = STATE.lock().remove(&base) {
        for c in m.chunks {
            if c.0 != u32::MAX {
                let e = &s.shared.chunks(m.dev)[c.0 as usize];
                if e.owner
                    .compare_exchange(my_word(s), 0, AcqRel, Acquire)
                    .is_ok()
                    && e.tag.load(Acquire) == c.1
                {
                    crate::shared::sub_saturating(&s.shared.dev(m.dev).mem_used, CHUNK);
                }
            }
        }
    }
}

/// A forked child starts without the parent's managed allocations.
pub fn forget_all() {
    STATE.lock().clear();
}

unsafe fn advise(p: CUdeviceptr, len: usize, advice: u32, loc_kind: u32, loc_id: i32) -> R {
    let _s = sim()?;
    let mut st = STATE.lock();
    let mut any = false;
    for (base, m) in st.range_mut(..p + len as u64) {
        if base + m.size <= p {
            continue;
        }
        any = true;
        let cpu = loc_kind == CU_MEM_LOCATION_TYPE_HOST || loc_id == CU_DEVICE_CPU;
        let loc = if cpu { CU_DEVICE_CPU } else { loc_id };
        // Read-mostly and accessed-by are recorded but do not change the cost model.
        match advice {
            1 => m.read_mostly = true,
            2 => m.read_mostly = false,
            3 => {
                m.prefer_cpu = cpu;
                m.preferred = Some(loc);
            }
            4 => {
                m.prefer_cpu = false;
                m.preferred = None;
            }
            5 if !m.accessed_by.contains(&loc) => m.accessed_by.push(loc),
            6 => m.accessed_by.retain(|&d| d != loc),
            _ => {}
        }
    }
    if any {
        Ok(())
    } else {
        Err(CUDA_ERROR_INVALID_VALUE)
    }
}

const CU_DEVICE_INVALID: i32 = -2;

/// `cuMemRangeGetAttribute` over the managed allocations that `[p, p + len)` covers: a value
/// common to all of them, else the documented "mixed" answer. Advice is kept per allocation, not
/// per page.
///
/// # Safety
/// `data` points to `size` writable bytes (the driver API's contract with its caller).
unsafe fn range_attribute(
    data: *mut c_void,
    size: usize,
    attr: u32,
    p: CUdeviceptr,
    len: usize,
) -> R {
    let _s = sim()?;
    if data.is_null() || len == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let st = STATE.lock();
    let ms: Vec<&Managed> = st
        .range(..p + len as u64)
        .filter(|(b, m)| *b + m.size > p)
        .map(|(_, m)| m)
        .collect();
    if ms.is_empty() {
        return Err(CUDA_ERROR_INVALID_VALUE); // not managed memory
    }
    // One value common to every allocation of the range, else `mixed`.
    let common = |f: &dyn Fn(&Managed) -> i32, mixed: i32| {
        let v = f(ms[0]);
        if ms.iter().all(|m| f(m) == v) {
            v
        } else {
            mixed
        }
    };
    let loc_type = |d: Option<i32>| match d {
        None => 0, // CU_MEM_LOCATION_TYPE_INVALID
        Some(CU_DEVICE_CPU) => CU_MEM_LOCATION_TYPE_HOST as i32,
        Some(_) => CU_MEM_LOCATION_TYPE_DEVICE as i32,
    };
    let int = |v: i32| -> R {
        if size != 4 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: `data` is not NULL (checked) and holds `size` == 4 writable bytes, an i32 slot
        // (this fn's contract).
        unsafe { *(data as *mut i32) = v };
        Ok(())
    };
    match attr {
        1 => int(ms.iter().all(|m| m.read_mostly) as i32), // READ_MOSTLY
        2 => int(common(
            &|m| m.preferred.unwrap_or(CU_DEVICE_INVALID),
            CU_DEVICE_INVALID,
        )),
        3 => {
            // ACCESSED_BY: the devices set on every allocation, then CU_DEVICE_INVALID.
            if !size.is_multiple_of(4) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            // SAFETY: `data` is not NULL (checked) and holds `size` writable bytes, i32-aligned
            // for this attribute (this fn's contract), and no Rust reference aliases it.
            let out = unsafe { std::slice::from_raw_parts_mut(data as *mut i32, size / 4) };
            out.fill(CU_DEVICE_INVALID);
            let all = ms[0]
                .accessed_by
                .iter()
                .filter(|d| ms.iter().all(|m| m.accessed_by.contains(d)));
            for (slot, d) in out.iter_mut().zip(all) {
                *slot = *d;
            }
            Ok(())
        }
        4 => int(common(
            &|m| m.last_prefetch.unwrap_or(CU_DEVICE_INVALID),
            CU_DEVICE_INVALID,
        )),
        5 => int(common(&|m| loc_type(m.preferred), 0)),
        6 => int(common(
            &|m| m.preferred.filter(|&d| d >= 0).unwrap_or(CU_DEVICE_INVALID),
            CU_DEVICE_INVALID,
        )),
        7 => int(common(&|m| loc_type(m.last_prefetch), 0)),
        8 => int(common(
            &|m| {
                m.last_prefetch
                    .filter(|&d| d >= 0)
                    .unwrap_or(CU_DEVICE_INVALID)
            },
            CU_DEVICE_INVALID,
        )),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

unsafe fn prefetch(
    p: CUdeviceptr,
    len: usize,
    to_cpu: bool,
    dev: i32,
    h: CUstream,
    ptds: bool,
) -> R {
    let s = sim()?;
    let r = stream_ref(h, ptds)?;
    let bases: Vec<u64> = {
        let st = STATE.lock();
        let v: Vec<u64> = st
            .range(..p + len as u64)
            .filter(|(b, m)| *b + m.size > p)
            .map(|(b, _)| *b)
            .collect();
        if v.is_empty() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        v
    };
    {
        let mut st = STATE.lock();
        for b in &bases {
            if let Some(m) = st.get_mut(b) {
                m.last_prefetch = Some(if to_cpu { CU_DEVICE_CPU } else { dev });
            }
        }
    }
    let (start, n) = (p, len as u64);
    let op = if to_cpu {
        let mut op = Op::new(Resource::D2H(r.ctx.device), 0);
        op.extra = Some(Box::new(move |now| {
            crate::sim::get().map_or(0, |s| evict_range(s, start, n, now))
        }));
        op
    } else {
        let d = s.device(dev)?;
        let mut op = Op::new(Resource::H2D(d), 0);
        op.extra = Some(Box::new(move |now| {
            crate::sim::get().map_or(0, |s| fault_in(s, d, &bases, now, Migrate::Prefetch))
        }));
        op
    };
    submit(s, &r, op);
    Ok(())
}

driver! {
    fn cuMemAllocManaged(dptr: *mut CUdeviceptr, size: usize, _flags: u32) {
        if dptr.is_null() || size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let s = sim()?;
        let ctx = current_ctx()?;
        s.api_allocs.fetch_add(1, AcqRel);
        let base = map_anon(size as u64)?;
        let chunks = vec![(u32::MAX, 0); (size as u64).div_ceil(CHUNK) as usize];
        STATE.lock().insert(base, Managed {
            size: size as u64, dev: ctx.device, prefer_cpu: false, read_mostly: false,
            preferred: None, accessed_by: Vec::new(), last_prefetch: None, chunks,
        });
        // Last, so that a context destroy that lists it finds its residency state too.
        let a = Alloc {
            size: size as u64, kind: Kind::Managed, device: ctx.device, charged: 0,
            ctx: std::sync::Arc::as_ptr(&ctx) as usize, pool: 0, id: 0, host_flags: 0,
        };
        if let Err(e) = super::insert_live(s, base, a) {
            STATE.lock().remove(&base);
            super::unmap(base, size as u64);
            return Err(e);
        }
        s.shared.slot(s.slot).dev[ctx.device].allocs.fetch_add(1, AcqRel);
        s.shared.dev(ctx.device).allocs.fetch_add(1, AcqRel);
        out(dptr, base)
    }
    fn cuMemAdvise(p: CUdeviceptr, len: usize, advice: u32, dev: CUdevice) {
        advise(p, len, advice, CU_MEM_LOCATION_TYPE_DEVICE, dev)
    }
    fn cuMemAdvise_v2(p: CUdeviceptr, len: usize, advice: u32, loc: MemLocation) {
        advise(p, len, advice, loc.kind, loc.id)
    }
    fn cuMemRangeGetAttribute(data: *mut c_void, size: usize, attr: u32, p: CUdeviceptr, len: usize) {
        range_attribute(data, size, attr, p, len)
    }
    fn cuMemRangeGetAttributes(data: *mut *mut c_void, sizes: *mut usize, attrs: *mut u32, n: usize, p: CUdeviceptr, len: usize) {
        if data.is_null() || sizes.is_null() || attrs.is_null() || n == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        for i in 0..n {
            range_attribute(*data.add(i), *sizes.add(i), *attrs.add(i), p, len)?;
        }
        Ok(())
    }
}

driver_ptds! {
    fn cuMemPrefetchAsync / cuMemPrefetchAsync_ptsz(p: CUdeviceptr, len: usize, dev: CUdevice, h: CUstream) |ptds| {
        prefetch(p, len, dev == CU_DEVICE_CPU, dev, h, ptds)
    }
    fn cuMemPrefetchAsync_v2 / cuMemPrefetchAsync_v2_ptsz(p: CUdeviceptr, len: usize, loc: MemLocation, _flags: u32, h: CUstream) |ptds| {
        prefetch(p, len, loc.kind == CU_MEM_LOCATION_TYPE_HOST, loc.id, h, ptds)
    }
}
