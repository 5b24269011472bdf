//! The quota ledger, top to bottom: how a charge is made (making room if it does not fit), how
//! an allocation holds it, how a free or a context's end returns it, and what the job is told of
//! the device's memory. Every hook that allocates or frees goes through here.
//!
//! Invariants, correct by construction (issue: the quota holds against threads, teardown,
//! `kill -9`, `exec`):
//! - a charge is made before the driver allocates and returned only after the driver freed:
//!   an allocation's entry leaves its table before the real free (so the address, which the
//!   driver may hand out again the moment it is free, never meets a stale entry), and its charge
//!   after the free returned;
//! - if the driver hands out an address that still has an entry, the old allocation is gone
//!   (freed behind the shim's back, e.g. with its context): its charge is returned then;
//! - every entry records its context; a context's end (destroy, primary reset or release to
//!   refcount 0) returns exactly that context's entries. An allocation racing a teardown (its
//!   driver call began before and its entry lands after) is checked against the driver once the
//!   teardown epoch moved, and returned if it is gone;
//! - the shared counters are charged slot first (`process::Account`), so a process killed at any
//!   instruction never leaves the container's figure below the truth (`libshare-abi`).

use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::Mutex;

use crate::boundary::{rc, R};
use crate::deferred::{Deferred, DEFERRED};
use crate::ops::{DriverOps, Handle, REAL};
use crate::per_process::PerProcess;
use crate::pools::{Pools, POOLS};
use crate::process::{Account, Shim};
use crate::types::*;

/// Who holds a charge: an allocation's device, bytes and context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub dev: usize,
    pub bytes: u64,
    /// The context current when it was made (0: unknown; such entries are never settled by a
    /// context's end, only by their free or the process's exit).
    pub ctx: Handle,
    /// Managed memory (recorded as such in the slot, `pin.rs`): the rest cannot be demoted.
    pub managed: bool,
}

/// Live allocations of one kind, by device pointer or handle.
#[derive(Default)]
pub struct Table(Mutex<FxHashMap<u64, Entry>>);

impl Table {
    fn lock(&self) -> std::sync::MutexGuard<'_, FxHashMap<u64, Entry>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// Records `key`; returns the entry it replaces (an allocation that is gone).
    pub fn insert(&self, key: u64, e: Entry) -> Option<Entry> {
        self.lock().insert(key, e)
    }
    pub fn take(&self, key: u64) -> Option<Entry> {
        self.lock().remove(&key)
    }
    pub fn get(&self, key: u64) -> Option<Entry> {
        self.lock().get(&key).copied()
    }
    /// Removes `key` only if it is still `e` (not replaced meanwhile).
    fn take_if(&self, key: u64, e: Entry) -> bool {
        let mut m = self.lock();
        if m.get(&key) == Some(&e) {
            m.remove(&key);
            true
        } else {
            false
        }
    }
    /// Every entry of context `ctx`, with its key.
    fn of_ctx(&self, ctx: Handle) -> Vec<(u64, Entry)> {
        self.lock()
            .iter()
            .filter(|(_, e)| e.ctx == ctx)
            .map(|(k, e)| (*k, *e))
            .collect()
    }
    /// Bytes held on `dev`.
    pub fn bytes(&self, dev: usize) -> u64 {
        self.lock()
            .values()
            .filter(|e| e.dev == dev)
            .map(|e| e.bytes)
            .sum()
    }
    pub fn len(&self) -> usize {
        self.lock().len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What an entry is: a device pointer, a VMM physical allocation, a CUDA array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Alloc,
    Handle,
    Array,
}

#[derive(Default)]
pub struct Tables {
    pub allocs: Table,
    pub handles: Table,
    pub arrays: Table,
}

impl Tables {
    pub fn of(&self, kind: Kind) -> &Table {
        match kind {
            Kind::Alloc => &self.allocs,
            Kind::Handle => &self.handles,
            Kind::Array => &self.arrays,
        }
    }
}

pub static TABLES: PerProcess<Tables> = PerProcess::new();

/// Odd while a context teardown is in progress; moves twice per teardown.
static TEARDOWN: AtomicU64 = AtomicU64::new(0);

/// The ledger of this process: its account in the container's state, the driver, and its
/// tables. `ledger::of(shim)` in the hooks; built from fakes in unit tests.
pub struct Ledger<'a> {
    pub acc: &'a Account,
    pub ops: &'a dyn DriverOps,
    pub tables: &'a Tables,
    pub pools: &'a Pools,
    pub deferred: &'a Deferred,
}

/// The ledger of this process, on the real driver.
pub fn of(sh: &'static Shim) -> Ledger<'static> {
    Ledger {
        acc: &sh.account,
        ops: &REAL,
        tables: TABLES.get(),
        pools: POOLS.get(),
        deferred: DEFERRED.get(),
    }
}

impl Ledger<'_> {
    // --- 1. Charging: fit, or make room, or refuse. ---------------------------------------

    /// Charges `bytes` of memory that cannot be demoted on `dev`. If they do not fit: the
    /// memory of dead processes of the container first, then what this process can give back
    /// without waiting (stream-ordered frees its streams have reached, what its pools keep
    /// beyond their use), then after waiting for its queued frees. An opportunistic container's
    /// charge must also fit what the daemon lets it hold pinned (`pin.rs`). False: refused,
    /// nothing changed (counted as a refusal).
    pub fn charge(&self, dev: usize, bytes: u64) -> bool {
        for retry in [false, true] {
            if !self.charge_quota(dev, bytes) {
                break;
            }
            match crate::pin::admit(self.acc, dev, bytes, retry) {
                crate::pin::Admit::Yes => return true,
                crate::pin::Admit::No => break,
                crate::pin::Admit::Again => {}
            }
        }
        self.acc.count_refusal(dev);
        tracing::debug!(dev, bytes, "allocation refused");
        false
    }

    /// The quota's part of a charge (see [`Ledger::charge`]; counts nothing).
    fn charge_quota(&self, dev: usize, bytes: u64) -> bool {
        let a = self.acc;
        a.charge(dev, bytes)
            || (a.reclaim_dead() > 0 && a.charge(dev, bytes))
            || {
                self.make_room(false);
                a.charge(dev, bytes)
            }
            || {
                self.make_room(true);
                a.charge(dev, bytes)
            }
    }

    /// Charges `bytes` of managed memory on `dev`, recorded as managed (`pin.rs`); with `host`
    /// (an oversubscribing allocation) only if the container's managed footprint with it fits
    /// the host memory its pages may be demoted to (`host_mem.rs`). False: refused (counted).
    pub fn charge_managed(&self, dev: usize, bytes: u64, host: bool) -> bool {
        let ok = self.charge_quota(dev, bytes);
        if ok && crate::pin::managed_charged(self.acc, dev, bytes, host) {
            return true;
        }
        if ok {
            self.acc.uncharge(dev, bytes);
        }
        self.acc.count_refusal(dev);
        false
    }

    /// Returns the charge of an allocation that is gone.
    fn release(&self, e: &Entry) {
        if e.managed {
            crate::pin::managed_freed(self.acc, e.dev, e.bytes);
        }
        self.acc.uncharge(e.dev, e.bytes);
        self.acc.count_free(e.dev);
    }

    /// Gives back what this process holds without use: reached stream-ordered frees (with
    /// `wait`, all of them), pools brought to what they reserve, then trimmed.
    pub fn make_room(&self, wait: bool) {
        self.deferred.settle(self.acc, self.ops, self.pools, wait);
        self.pools.reconcile_all(self.acc, self.ops);
        self.pools.trim_all(self.acc, self.ops);
    }

    /// Brings the figures up to date without giving anything back (before `cuMemGetInfo`).
    pub fn refresh(&self) {
        self.deferred.settle(self.acc, self.ops, self.pools, false);
        self.pools.reconcile_all(self.acc, self.ops);
    }

    // --- 2. Allocations: charged before the driver call, recorded after it. -----------------

    /// Charges `bytes` on `dev`, runs the driver's allocation `call`; on success `record`s who
    /// holds the charge (given the context it was made in and the teardown epoch it started
    /// in), else returns it.
    pub fn charged_then(
        &self,
        dev: usize,
        bytes: u64,
        call: impl FnOnce() -> CUresult,
        record: impl FnOnce(Handle, u64),
    ) -> R {
        if !self.charge(dev, bytes) {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        self.call_then(dev, bytes, false, call, record)
    }

    /// The driver's `call` for `bytes` charged on `dev` (`managed`: recorded as managed), then
    /// `record`, or the charge returned.
    fn call_then(
        &self,
        dev: usize,
        bytes: u64,
        managed: bool,
        call: impl FnOnce() -> CUresult,
        record: impl FnOnce(Handle, u64),
    ) -> R {
        let epoch = TEARDOWN.load(Acquire);
        let ctx = self.ops.current_ctx().unwrap_or(0);
        let r = call();
        if r != CUDA_SUCCESS {
            if managed {
                crate::pin::managed_freed(self.acc, dev, bytes);
            }
            self.acc.uncharge(dev, bytes);
            return Err(r);
        }
        record(ctx, epoch);
        self.acc.count_alloc(dev);
        Ok(())
    }

    /// An allocation of `kind` whose key (pointer or handle) `key` reads after `call` succeeded.
    pub fn charged(
        &self,
        kind: Kind,
        dev: usize,
        bytes: u64,
        call: impl FnOnce() -> CUresult,
        key: impl FnOnce() -> u64,
    ) -> R {
        self.charged_then(dev, bytes, call, |ctx, epoch| {
            let e = Entry {
                dev,
                bytes,
                ctx,
                managed: false,
            };
            self.record(kind, key(), e, epoch)
        })
    }

    /// A managed allocation (pointer `key` after `call` succeeded), charged by
    /// [`Ledger::charge_managed`] (`host`: the host-memory check of an oversubscribing one).
    pub fn charged_managed(
        &self,
        dev: usize,
        bytes: u64,
        host: bool,
        call: impl FnOnce() -> CUresult,
        key: impl FnOnce() -> u64,
    ) -> R {
        if !self.charge_managed(dev, bytes, host) {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        self.call_then(dev, bytes, true, call, |ctx, epoch| {
            let e = Entry {
                dev,
                bytes,
                ctx,
                managed: true,
            };
            self.record(Kind::Alloc, key(), e, epoch)
        })
    }

    /// Records a charged allocation. An entry it replaces is an allocation that is gone (the
    /// driver handed its address out again): its charge is returned. If a context teardown ran
    /// since `epoch`, the allocation is checked against the driver.
    pub fn record(&self, kind: Kind, key: u64, e: Entry, epoch: u64) {
        let torn = |since: u64| TEARDOWN.load(Acquire) != since || since % 2 == 1;
        // A teardown since the call began may have freed it, and the driver may even have
        // handed its address to another thread's allocation already: ask before recording.
        if torn(epoch) && !self.alive(kind, key, e.ctx) {
            self.release(&e);
            return;
        }
        let checked = TEARDOWN.load(Acquire);
        if let Some(old) = self.tables.of(kind).insert(key, e) {
            self.release(&old);
        }
        if torn(checked) && !self.alive(kind, key, e.ctx) && self.tables.of(kind).take_if(key, e) {
            self.release(&e);
        }
    }

    /// Whether the driver still has allocation `key` (made in `ctx`).
    fn alive(&self, kind: Kind, key: u64, ctx: Handle) -> bool {
        match kind {
            Kind::Alloc => match self.ops.pointer_ctx(key) {
                Some(c) => ctx == 0 || c == ctx,
                None => false,
            },
            Kind::Array => self.ops.array_alive(key as Handle),
            Kind::Handle => true, // physical allocations outlive contexts
        }
    }

    /// Removes a tracked allocation whose charge the caller takes over (a graph adopts it).
    pub fn take(&self, kind: Kind, key: u64) -> Option<Entry> {
        self.tables.of(kind).take(key)
    }

    // --- 3. Frees: out of the table before the driver frees, charge back after. ------------

    /// Runs the driver's free `call` of `key`; its charge is returned once the driver freed it.
    /// If the free fails the entry is put back, unless the allocation is gone after all.
    pub fn freed(&self, kind: Kind, key: u64, call: impl FnOnce() -> CUresult) -> R {
        let entry = self.tables.of(kind).take(key);
        let r = call();
        if let Some(e) = entry {
            if r == CUDA_SUCCESS || !self.alive(kind, key, e.ctx) {
                self.release(&e);
            } else {
                self.record(kind, key, e, TEARDOWN.load(Acquire));
            }
        }
        rc(r)
    }

    // --- 4. A context's end returns exactly its allocations. ------------------------------

    /// Runs `teardown` (a destroy, or a primary context's reset or last release) of `ctx`
    /// (0: unknown, nothing is returned); on success returns the charges of every allocation
    /// and array made in it, and brings the pools to what they still reserve.
    pub fn context_end(&self, ctx: Handle, teardown: impl FnOnce() -> CUresult) -> R {
        self.deferred.before_context_loss(
            self.acc,
            self.ops,
            self.pools,
            (ctx != 0).then_some(ctx),
        );
        TEARDOWN.fetch_add(1, AcqRel);
        let r = teardown();
        if r == CUDA_SUCCESS && ctx != 0 {
            self.settle_context(ctx);
        }
        TEARDOWN.fetch_add(1, AcqRel);
        rc(r)
    }

    /// Returns the charges of every allocation and array of `ctx` that the driver freed with
    /// it. One the driver still has (made by another thread while the teardown ran, and kept)
    /// stays charged: the charge follows what the device holds.
    pub fn settle_context(&self, ctx: Handle) {
        for kind in [Kind::Alloc, Kind::Array] {
            let table = self.tables.of(kind);
            for (key, e) in table.of_ctx(ctx) {
                if !self.alive(kind, key, e.ctx) && table.take_if(key, e) {
                    self.release(&e);
                }
            }
        }
        self.pools.reconcile_all(self.acc, self.ops);
    }
}

// --- 5. What the job sees of the device's memory. -----------------------------------------

/// Returns the memory of dead processes of the container to the quota, at most every 100 ms
/// (it looks at other processes), so what the job is told about free memory stays true
/// without a daemon.
fn reclaim_now_and_then(acc: &Account) {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let last = LAST.load(Relaxed);
    if now.saturating_sub(last) >= 100 && LAST.compare_exchange(last, now, AcqRel, Relaxed).is_ok()
    {
        acc.reclaim_dead();
        if let Err(e) = acc.state.check_path() {
            tracing::warn!("{e}");
        }
    }
}

/// (total, free) as the job must see them on `dev`: the quota as total, quota − used as free,
/// never more than the device really has. Without a quota, the driver's figures.
/// An oversubscribing container (its allocations are managed memory) sees a device of its
/// quota, which may exceed the real one, and free = quota − its footprint.
pub fn visible(dev: usize, real_free: u64, real_total: u64) -> (u64, u64) {
    let (quota, used) = match crate::process::get() {
        Some(sh) => {
            reclaim_now_and_then(&sh.account);
            let (quota, used) = sh.account.quota(dev);
            if quota > 0 && sh.account.state.oversubscribes() {
                return (quota.saturating_sub(used), quota);
            }
            (quota, used)
        }
        None => quota_without_cuda(dev),
    };
    if quota == 0 {
        return (real_free, real_total);
    }
    let total = quota.min(real_total);
    (total.saturating_sub(used).min(real_free), total)
}

/// (quota, used) on `dev` for a process that has not initialised CUDA (an NVML-only monitoring
/// tool in the container, `nvidia-smi`-like). Its container's state comes as for a CUDA process:
/// from the daemon (registration: the container from the process's cgroup, the file as a
/// descriptor, which a process may need because the daemon's files are not open to it by path),
/// else, without a daemon, through a read-only view of the file by path if a CUDA process made
/// it. The quota is the state's; where the environment applies (no daemon, or one that trusts
/// it) and the state has none, the environment's limit with nothing used. An invalid
/// configuration, or a daemon that does not register the process at its one attempt (one line
/// on stderr; never the environment's limits instead), shows the device as it is (the error is
/// reported to CUDA jobs at cuInit). No slot is claimed: the tool holds no memory.
fn quota_without_cuda(dev: usize) -> (u64, u64) {
    use std::sync::atomic::AtomicPtr;
    struct View {
        cfg: crate::config::Config,
        state: Option<libshare_abi::State>,
        env_applies: bool,
    }
    fn make() -> Option<View> {
        let cfg = crate::config::Config::from_env().ok()?;
        let (state, env_applies) =
            match crate::register::register(&cfg, crate::register::Patience::Once) {
                Ok(crate::register::Outcome::Registered {
                    state, env_trusted, ..
                }) => (Some(*state), env_trusted),
                Ok(crate::register::Outcome::NoDaemon) => {
                    let path = cfg.container_dir.join(libshare_abi::STATE_FILE);
                    (libshare_abi::State::open_view(&path).ok(), true)
                }
                Err(line) => {
                    eprintln!("{line}");
                    return None;
                }
            };
        Some(View {
            cfg,
            state,
            env_applies,
        })
    }
    // Made once, published with a compare-and-swap: no lock is held while registration waits
    // for the daemon, so a fork meanwhile leaves the child nothing held (two threads racing
    // both register; one view is kept).
    static VIEW: AtomicPtr<Option<View>> = AtomicPtr::new(std::ptr::null_mut());
    let mut p = VIEW.load(Acquire);
    if p.is_null() {
        let made = Box::into_raw(Box::new(make()));
        p = match VIEW.compare_exchange(std::ptr::null_mut(), made, AcqRel, Acquire) {
            Ok(_) => made,
            Err(theirs) => {
                // SAFETY: `made` came from Box::into_raw above and was never published.
                drop(unsafe { Box::from_raw(made) });
                theirs
            }
        };
    }
    // SAFETY: a published view is never freed (nor replaced).
    let Some(view) = (unsafe { &*p }).as_ref() else {
        return (0, 0);
    };
    if dev >= libshare_abi::MAX_DEVICES {
        return (0, 0);
    }
    let from_file = view.state.as_ref().map(|s| {
        (
            s.device(dev).quota.load(Acquire),
            s.device(dev).used.load(Acquire),
        )
    });
    match from_file {
        Some((q, used)) if q > 0 || !view.env_applies => (q, used),
        _ => (
            // The environment's limits are per CUDA ordinal: the one that is this GPU.
            crate::devmap::ordinal_of(dev)
                .and_then(|o| view.cfg.memory_limit[o as usize % libshare_abi::MAX_DEVICES])
                .unwrap_or(0),
            from_file.map_or(0, |f| f.1),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::fake::Fake;
    use libshare_abi::State;

    const MIB: u64 = 1 << 20;

    struct World {
        _dir: tempfile::TempDir,
        acc: Account,
        fake: Fake,
        tables: Tables,
        pools: Pools,
        deferred: Deferred,
    }

    impl World {
        fn new(quota: u64) -> World {
            // A real container state file and a slot this process owns, as the shim has.
            let dir = tempfile::tempdir().unwrap();
            let state = State::open_or_create(dir.path()).unwrap();
            state.set_quota(0, quota);
            let pid = std::process::id();
            let slot = libshare_abi::SlotTable::claim_slot(&state, pid).unwrap();
            World {
                _dir: dir,
                acc: Account::new(state, slot, pid),
                fake: Fake::new(0xc0),
                tables: Tables::default(),
                pools: Pools::default(),
                deferred: Deferred::default(),
            }
        }
        fn ledger(&self) -> Ledger<'_> {
            Ledger {
                acc: &self.acc,
                ops: &self.fake,
                tables: &self.tables,
                pools: &self.pools,
                deferred: &self.deferred,
            }
        }
        fn used(&self) -> u64 {
            self.acc.quota(0).1
        }
        /// A plain allocation of `bytes` at `ptr` in the fake driver's current context.
        fn alloc(&self, ptr: u64, bytes: u64) -> R {
            let ctx = self.fake.ctx.load(Relaxed);
            self.ledger().charged(
                Kind::Alloc,
                0,
                bytes,
                || {
                    self.fake.ptrs.lock().unwrap().insert(ptr, ctx);
                    CUDA_SUCCESS
                },
                || ptr,
            )
        }
        fn free(&self, ptr: u64) -> R {
            self.ledger().freed(Kind::Alloc, ptr, || {
                match self.fake.ptrs.lock().unwrap().remove(&ptr) {
                    Some(_) => CUDA_SUCCESS,
                    None => CUDA_ERROR_INVALID_VALUE,
                }
            })
        }
    }

    #[test]
    fn charges_fit_the_quota_or_change_nothing() {
        let w = World::new(100 * MIB);
        w.alloc(0x10, 60 * MIB).unwrap();
        assert_eq!(w.alloc(0x20, 60 * MIB), Err(CUDA_ERROR_OUT_OF_MEMORY));
        assert_eq!(w.used(), 60 * MIB, "a refusal charges nothing");
        assert_eq!(
            w.acc.held(0),
            60 * MIB,
            "the slot holds what the container holds"
        );
        assert_eq!(w.acc.state.device(0).oom.load(Acquire), 1);
        w.free(0x10).unwrap();
        assert_eq!(w.used(), 0);
        assert_eq!(
            w.free(0x10),
            Err(CUDA_ERROR_INVALID_VALUE),
            "a double free returns nothing twice"
        );
        assert_eq!(w.used(), 0);
    }

    #[test]
    fn a_failed_driver_call_returns_its_charge() {
        let w = World::new(0);
        let r = w
            .ledger()
            .charged(Kind::Alloc, 0, MIB, || CUDA_ERROR_OUT_OF_MEMORY, || 0x10);
        assert_eq!(r, Err(CUDA_ERROR_OUT_OF_MEMORY));
        assert_eq!(w.used(), 0);
        assert!(w.tables.allocs.is_empty());
    }

    #[test]
    fn an_address_handed_out_again_returns_the_charge_it_replaces() {
        // The old allocation went behind the shim's back (e.g. with a context it did not see
        // end): the driver reusing its address proves it gone.
        let w = World::new(0);
        w.alloc(0x10, 8 * MIB).unwrap();
        w.fake.ptrs.lock().unwrap().clear();
        w.alloc(0x10, 2 * MIB).unwrap();
        assert_eq!(w.used(), 2 * MIB);
        w.free(0x10).unwrap();
        assert_eq!(w.used(), 0);
    }

    #[test]
    fn a_free_leaves_the_table_before_the_driver_frees() {
        // Another thread gets the same address the moment the driver freed it: its entry must
        // survive the first free's bookkeeping.
        let w = World::new(0);
        w.alloc(0x10, 4 * MIB).unwrap();
        w.ledger()
            .freed(Kind::Alloc, 0x10, || {
                w.fake.ptrs.lock().unwrap().remove(&0x10);
                w.alloc(0x10, 6 * MIB).unwrap(); // the racing allocation
                CUDA_SUCCESS
            })
            .unwrap();
        assert_eq!(
            w.used(),
            6 * MIB,
            "the new allocation stays charged, the old is returned"
        );
        assert_eq!(w.tables.allocs.get(0x10).map(|e| e.bytes), Some(6 * MIB));
    }

    #[test]
    fn a_context_end_returns_exactly_its_allocations() {
        let w = World::new(0);
        w.alloc(0x10, MIB).unwrap(); // context 0xc0
        w.fake.ctx.store(0xc1, Relaxed);
        w.alloc(0x20, 3 * MIB).unwrap();
        w.ledger()
            .context_end(0xc0, || {
                w.fake.ptrs.lock().unwrap().retain(|_, c| *c != 0xc0);
                CUDA_SUCCESS
            })
            .unwrap();
        assert_eq!(
            w.used(),
            3 * MIB,
            "the other context's allocation stays charged"
        );
        let r = w.ledger().context_end(0xc1, || CUDA_ERROR_INVALID_CONTEXT);
        assert_eq!(r, Err(CUDA_ERROR_INVALID_CONTEXT));
        assert_eq!(w.used(), 3 * MIB, "a failed destroy returns nothing");
    }

    #[test]
    fn an_allocation_racing_a_teardown_is_returned_if_the_driver_dropped_it() {
        let w = World::new(0);
        let l = w.ledger();
        // The allocation's driver call starts before the teardown and records after it.
        let r = l.charged_then(
            0,
            5 * MIB,
            || {
                w.fake.ptrs.lock().unwrap().insert(0x30, 0xc0);
                // Another thread destroys the context now: the driver frees 0x30 with it.
                w.ledger()
                    .context_end(0xc0, || {
                        w.fake.ptrs.lock().unwrap().clear();
                        CUDA_SUCCESS
                    })
                    .unwrap();
                CUDA_SUCCESS
            },
            |ctx, epoch| {
                l.record(
                    Kind::Alloc,
                    0x30,
                    Entry {
                        dev: 0,
                        bytes: 5 * MIB,
                        ctx,
                        managed: false,
                    },
                    epoch,
                )
            },
        );
        r.unwrap();
        assert_eq!(
            w.used(),
            0,
            "nothing stays charged for memory the context took with it"
        );
        assert!(w.tables.allocs.is_empty());
    }

    #[test]
    fn a_late_record_never_takes_the_address_of_a_live_allocation() {
        // A's allocation is freed by a teardown before A records it, and the driver hands its
        // address to B: A's record must return A's charge, not B's.
        let w = World::new(0);
        let l = w.ledger();
        l.charged_then(
            0,
            5 * MIB,
            || {
                w.fake.ptrs.lock().unwrap().insert(0x30, 0xc0);
                w.ledger()
                    .context_end(0xc0, || {
                        w.fake.ptrs.lock().unwrap().clear();
                        CUDA_SUCCESS
                    })
                    .unwrap();
                w.fake.ctx.store(0xc1, Relaxed);
                w.alloc(0x30, 2 * MIB).unwrap(); // B, in another context
                CUDA_SUCCESS
            },
            |ctx, epoch| {
                l.record(
                    Kind::Alloc,
                    0x30,
                    Entry {
                        dev: 0,
                        bytes: 5 * MIB,
                        ctx,
                        managed: false,
                    },
                    epoch,
                )
            },
        )
        .unwrap();
        assert_eq!(w.used(), 2 * MIB, "B stays charged, A is returned");
        assert_eq!(w.tables.allocs.get(0x30).map(|e| e.bytes), Some(2 * MIB));
    }

    #[test]
    fn pools_are_charged_in_full_then_follow_what_they_reserve() {
        let w = World::new(64 * MIB);
        let (l, pool) = (w.ledger(), 0x900);
        // 10 MiB from an empty pool: charged rounded up, then what the pool reserves.
        assert!(l.charge(0, crate::pools::precharge(10 * MIB)));
        assert_eq!(w.used(), 10 * MIB);
        w.fake.set_reserved(pool, 10 * MIB);
        w.pools.allocated(&w.acc, &w.fake, pool, 0, 0x100, 10 * MIB);
        assert_eq!(w.used(), 10 * MIB);
        // Freed and kept by the pool: still charged.
        assert!(w.pools.freed(0x100).is_some());
        w.pools.reconcile(&w.acc, &w.fake, pool);
        assert_eq!(w.used(), 10 * MIB, "kept blocks stay the container's");
        // 60 MiB more does not fit beside the kept 10: making room trims the pool first.
        w.fake.pools.lock().unwrap().get_mut(&pool).unwrap().1 = 0; // nothing in use
        assert!(l.charge(0, 60 * MIB));
        assert!(w.fake.trims.load(Relaxed) > 0);
        assert_eq!(w.used(), 60 * MIB);
        // Two reconciles of one growth count it once.
        w.fake.set_reserved(pool, 70 * MIB);
        w.pools.reconcile(&w.acc, &w.fake, pool);
        w.pools.reconcile(&w.acc, &w.fake, pool);
        assert_eq!(w.pools.charged(0), 70 * MIB);
        assert_eq!(
            w.used(),
            130 * MIB,
            "the 60 MiB precharge is still held by its caller"
        );
    }

    #[test]
    fn a_stream_ordered_free_returns_its_charge_when_the_stream_reaches_it() {
        let w = World::new(0);
        w.alloc(0x10, 8 * MIB).unwrap();
        let e = w.tables.allocs.take(0x10).unwrap();
        assert!(w
            .deferred
            .defer(&w.acc, &w.fake, &w.pools, (0, e.bytes, None), 0, false));
        assert!(!w.deferred.settle(&w.acc, &w.fake, &w.pools, false));
        assert_eq!(w.used(), 8 * MIB, "not reached yet: still charged");
        w.fake.reach_all();
        assert!(w.deferred.settle(&w.acc, &w.fake, &w.pools, false));
        assert_eq!(w.used(), 0);
        // With wait, an outstanding free is settled at once.
        w.alloc(0x20, MIB).unwrap();
        let e = w.tables.allocs.take(0x20).unwrap();
        w.deferred
            .defer(&w.acc, &w.fake, &w.pools, (0, e.bytes, None), 0, false);
        w.ledger().make_room(true);
        assert_eq!(w.used(), 0);
        assert_eq!(w.deferred.outstanding(), 0);
    }

    #[test]
    fn quota_holds_under_threads_allocating_and_freeing_one_address_space() {
        let w = World::new(64 * MIB);
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let w = &w;
                s.spawn(move || {
                    for i in 0..2_000u64 {
                        let ptr = 0x1000 + (i % 16) * 8 + t; // addresses reused across threads
                        if w.alloc(ptr, MIB).is_ok() {
                            assert!(w.used() <= 64 * MIB);
                            let _ = w.free(ptr);
                        }
                    }
                });
            }
        });
        let held: u64 = w.tables.allocs.bytes(0);
        assert_eq!(
            w.used(),
            held,
            "what is charged is exactly what the tables hold"
        );
    }
}
