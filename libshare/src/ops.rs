//! The driver calls the accounting makes on its own behalf (pool attributes and trim, events,
//! capture state, the current context and device, pointer and context queries), behind a small
//! trait: the ledger, pools, deferred frees and graph memory take a `&dyn DriverOps`, the real
//! one ([`REAL`]) in the hooks and a fake in unit tests. Every raw call into the driver that is
//! not a hook's own call lives here.

use std::ffi::{c_uint, c_void};

use crate::driver::real;
use crate::types::*;

/// Handle values (contexts, streams, events, pools, graphs, arrays) are passed as `usize`: the
/// shim never dereferences them.
pub type Handle = usize;

/// What a query of an event said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventState {
    /// The stream reached it.
    Done,
    NotReady,
    /// Any other error: its context (and with it the memory it guarded) is gone.
    Gone,
}

/// Device indices (`usize`) here are the node's GPU indices (`devmap.rs`); the real driver's
/// implementation converts to and from CUDA ordinals.
pub trait DriverOps: Sync {
    /// The current context of this thread.
    fn current_ctx(&self) -> Option<Handle>;
    /// The device (node index) of this thread's current context.
    fn ctx_device(&self) -> Option<usize>;
    /// Whether `dev`'s primary context is active.
    fn primary_active(&self, dev: usize) -> Option<bool>;
    /// The context a device allocation belongs to (None: not a live allocation).
    fn pointer_ctx(&self, ptr: CUdeviceptr) -> Option<Handle>;
    /// Whether `ptr` is device memory (`CU_POINTER_ATTRIBUTE_MEMORY_TYPE` is DEVICE, as managed
    /// memory reads too; false for host memory, registered or not, and for anything the driver
    /// does not know).
    fn pointer_on_device(&self, ptr: CUdeviceptr) -> bool;
    /// Whether `h` is a live CUDA array.
    fn array_alive(&self, h: Handle) -> bool;
    /// The pool `cuMemAllocAsync` uses on `dev`.
    fn current_pool(&self, dev: usize) -> Option<Handle>;
    /// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT` (None: the pool is gone).
    fn pool_reserved(&self, pool: Handle) -> Option<u64>;
    fn pool_trim(&self, pool: Handle);
    /// A timing-free event in the current context.
    fn event_create(&self) -> Option<Handle>;
    fn event_record(&self, event: Handle, stream: Handle, ptsz: bool) -> bool;
    fn event_query(&self, event: Handle) -> EventState;
    /// Waits for the event with this thread's capture mode relaxed (so it never invalidates a
    /// capture another thread has in progress, as CUDA documents for libraries).
    fn event_wait(&self, event: Handle);
    fn event_destroy(&self, event: Handle);
    /// An event with timing in the current context (the gate measures launches with pairs).
    fn timed_event_create(&self) -> Option<Handle>;
    /// GPU time between two completed timed events, ns (None: not both completed, or gone).
    fn event_elapsed_ns(&self, start: Handle, end: Handle) -> Option<u64>;
    /// Sets this thread's capture mode to relaxed (so the shim's own queries never invalidate
    /// a capture in progress); returns the mode to restore.
    fn relax_capture(&self) -> Option<u32>;
    fn restore_capture(&self, mode: u32);
    /// The graph `stream` is capturing into, if it is capturing.
    fn capturing(&self, stream: Handle, ptsz: bool) -> Option<Handle>;
    /// The context `stream` belongs to (None: not a stream of a live context).
    fn stream_ctx(&self, stream: Handle) -> Option<Handle>;
    fn mem_free(&self, ptr: CUdeviceptr);
    fn mem_free_async(&self, ptr: CUdeviceptr, stream: Handle, ptsz: bool);
    /// `cuMemGetInfo`: (free, total) of the current context's device.
    fn mem_info(&self) -> Result<(u64, u64), CUresult>;
    /// Device `dev`'s memory bandwidth, bytes per second, from its attributes: the memory clock
    /// (kHz) × 2 (double data rate) × the bus width (bits) ÷ 8 (None: not reported).
    fn memory_bandwidth(&self, dev: usize) -> Option<u64>;
    /// (count of devices, total memory of each) for checking limits at init: by CUDA ordinal,
    /// as the environment's limits are.
    fn device_totals(&self) -> Option<Vec<u64>>;
}

/// The real driver.
pub struct RealDriver;

pub static REAL: RealDriver = RealDriver;

const CU_POINTER_ATTRIBUTE_CONTEXT: c_uint = 1;
const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: c_uint = 2;
const CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: c_uint = 36;
const CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: c_uint = 37;
const CU_MEMORYTYPE_DEVICE: c_uint = 2;

// Each `unsafe` call below is one of the real driver's functions (`Real`, resolved with the
// declaration list's prototype) called with live locals as out-pointers of the written type,
// and handles this process got from the driver (or a caller's stream it is about to use).
impl DriverOps for RealDriver {
    fn current_ctx(&self) -> Option<Handle> {
        let f = real().cuCtxGetCurrent?;
        let mut c: CUcontext = std::ptr::null_mut();
        // SAFETY: see the impl's comment.
        (unsafe { f(&mut c) } == CUDA_SUCCESS && !c.is_null()).then_some(c as Handle)
    }

    fn ctx_device(&self) -> Option<usize> {
        let f = real().cuCtxGetDevice?;
        let mut d: CUdevice = 0;
        // SAFETY: see the impl's comment.
        (unsafe { f(&mut d) } == CUDA_SUCCESS && d >= 0).then(|| crate::devmap::node_of(d))
    }

    fn primary_active(&self, dev: usize) -> Option<bool> {
        let f = real().cuDevicePrimaryCtxGetState?;
        let dev = crate::devmap::ordinal_of(dev)?;
        let (mut flags, mut active) = (0u32, 0i32);
        // SAFETY: see the impl's comment.
        (unsafe { f(dev, &mut flags, &mut active) } == CUDA_SUCCESS).then_some(active != 0)
    }

    fn pointer_ctx(&self, ptr: CUdeviceptr) -> Option<Handle> {
        let f = real().cuPointerGetAttribute?;
        let mut c: CUcontext = std::ptr::null_mut();
        // SAFETY: see the impl's comment; the CONTEXT attribute writes one CUcontext.
        let rc = unsafe {
            f(
                &mut c as *mut CUcontext as *mut c_void,
                CU_POINTER_ATTRIBUTE_CONTEXT,
                ptr,
            )
        };
        (rc == CUDA_SUCCESS).then_some(c as Handle)
    }

    fn pointer_on_device(&self, ptr: CUdeviceptr) -> bool {
        let Some(f) = real().cuPointerGetAttribute else {
            return false;
        };
        let mut t: c_uint = 0;
        // SAFETY: see the impl's comment; the MEMORY_TYPE attribute writes one CUmemorytype.
        let rc = unsafe {
            f(
                &mut t as *mut c_uint as *mut c_void,
                CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                ptr,
            )
        };
        rc == CUDA_SUCCESS && t == CU_MEMORYTYPE_DEVICE
    }

    fn memory_bandwidth(&self, dev: usize) -> Option<u64> {
        let f = real().cuDeviceGetAttribute?;
        let dev = crate::devmap::ordinal_of(dev)?;
        let attr = |a: c_uint| {
            let mut v = 0i32;
            // SAFETY: see the impl's comment; the attribute is an int.
            (unsafe { f(&mut v, a, dev) } == CUDA_SUCCESS && v > 0).then_some(v as u64)
        };
        let khz = attr(CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)?;
        let bits = attr(CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)?;
        Some(khz * 1_000 * 2 * bits / 8)
    }

    fn array_alive(&self, h: Handle) -> bool {
        let Some(f) = real().cuArrayGetDescriptor_v2 else {
            return true; // cannot tell: keep the charge (never a smaller count than the truth)
        };
        let mut d = ArrayDesc {
            width: 0,
            height: 0,
            format: 0,
            channels: 0,
        };
        // SAFETY: see the impl's comment; a CUDA_ARRAY_DESCRIPTOR local to write.
        unsafe { f(&mut d, h as *mut c_void) == CUDA_SUCCESS }
    }

    fn current_pool(&self, dev: usize) -> Option<Handle> {
        let f = real().cuDeviceGetMemPool?;
        let dev = crate::devmap::ordinal_of(dev)?;
        let mut p: CUmemoryPool = std::ptr::null_mut();
        // SAFETY: see the impl's comment.
        (unsafe { f(&mut p, dev) } == CUDA_SUCCESS && !p.is_null()).then_some(p as Handle)
    }

    fn pool_reserved(&self, pool: Handle) -> Option<u64> {
        let f = real().cuMemPoolGetAttribute?;
        let mut v = 0u64;
        // SAFETY: see the impl's comment; the attribute is a cuuint64_t.
        (unsafe {
            f(
                pool as CUmemoryPool,
                CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                &mut v as *mut u64 as *mut c_void,
            )
        } == CUDA_SUCCESS)
            .then_some(v)
    }

    fn pool_trim(&self, pool: Handle) {
        if let Some(f) = real().cuMemPoolTrimTo {
            // SAFETY: see the impl's comment.
            unsafe { f(pool as CUmemoryPool, 0) };
        }
    }

    fn event_create(&self) -> Option<Handle> {
        let f = real().cuEventCreate?;
        let mut e: CUevent = std::ptr::null_mut();
        // SAFETY: see the impl's comment.
        (unsafe { f(&mut e, CU_EVENT_DISABLE_TIMING) } == CUDA_SUCCESS && !e.is_null())
            .then_some(e as Handle)
    }

    fn event_record(&self, event: Handle, stream: Handle, ptsz: bool) -> bool {
        let r = real();
        let Some(f) = (if ptsz {
            r.cuEventRecord_ptsz
        } else {
            r.cuEventRecord
        }) else {
            return false;
        };
        // SAFETY: see the impl's comment.
        unsafe { f(event as CUevent, stream as CUstream) == CUDA_SUCCESS }
    }

    fn event_query(&self, event: Handle) -> EventState {
        let Some(f) = real().cuEventQuery else {
            return EventState::Gone;
        };
        // SAFETY: see the impl's comment.
        match unsafe { f(event as CUevent) } {
            CUDA_SUCCESS => EventState::Done,
            CUDA_ERROR_NOT_READY => EventState::NotReady,
            _ => EventState::Gone,
        }
    }

    fn event_wait(&self, event: Handle) {
        let r = real();
        let Some(sync) = r.cuEventSynchronize else {
            return;
        };
        let exchange = r.cuThreadExchangeStreamCaptureMode;
        let mut mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: see the impl's comment (reads and writes one CUstreamCaptureMode local).
        let swapped = exchange.is_some_and(|x| unsafe { x(&mut mode) } == CUDA_SUCCESS);
        // SAFETY: see the impl's comment; an error (e.g. its context is gone) ends the wait.
        unsafe { sync(event as CUevent) };
        if let (true, Some(x)) = (swapped, exchange) {
            // SAFETY: as above; restores the caller's mode.
            unsafe { x(&mut mode) };
        }
    }

    fn event_destroy(&self, event: Handle) {
        if let Some(f) = real().cuEventDestroy_v2 {
            // SAFETY: see the impl's comment; our event, destroyed once.
            unsafe { f(event as CUevent) };
        }
    }

    fn timed_event_create(&self) -> Option<Handle> {
        let f = real().cuEventCreate?;
        let mut e: CUevent = std::ptr::null_mut();
        // SAFETY: see the impl's comment.
        (unsafe { f(&mut e, CU_EVENT_DEFAULT) } == CUDA_SUCCESS && !e.is_null())
            .then_some(e as Handle)
    }

    fn event_elapsed_ns(&self, start: Handle, end: Handle) -> Option<u64> {
        let f = real().cuEventElapsedTime?;
        let mut ms = 0f32;
        // SAFETY: see the impl's comment (one float local to write).
        (unsafe { f(&mut ms, start as CUevent, end as CUevent) } == CUDA_SUCCESS && ms >= 0.0)
            .then_some((ms as f64 * 1e6) as u64)
    }

    fn relax_capture(&self) -> Option<u32> {
        let x = real().cuThreadExchangeStreamCaptureMode?;
        let mut mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: see the impl's comment (reads and writes one CUstreamCaptureMode local).
        (unsafe { x(&mut mode) } == CUDA_SUCCESS).then_some(mode)
    }

    fn restore_capture(&self, mut mode: u32) {
        if let Some(x) = real().cuThreadExchangeStreamCaptureMode {
            // SAFETY: as `relax_capture`.
            unsafe { x(&mut mode) };
        }
    }

    fn stream_ctx(&self, stream: Handle) -> Option<Handle> {
        let f = real().cuStreamGetCtx?;
        let mut c: CUcontext = std::ptr::null_mut();
        // SAFETY: see the impl's comment.
        (unsafe { f(stream as CUstream, &mut c) } == CUDA_SUCCESS && !c.is_null())
            .then_some(c as Handle)
    }

    fn capturing(&self, stream: Handle, ptsz: bool) -> Option<Handle> {
        let r = real();
        let info = if ptsz {
            r.cuStreamGetCaptureInfo_v2_ptsz
        } else {
            r.cuStreamGetCaptureInfo_v2
        }?;
        let (mut status, mut id, mut graph) = (0u32, 0u64, std::ptr::null_mut());
        let (mut deps, mut n) = (std::ptr::null(), 0usize);
        // SAFETY: see the impl's comment.
        let rc = unsafe {
            info(
                stream as CUstream,
                &mut status,
                &mut id,
                &mut graph,
                &mut deps,
                &mut n,
            )
        };
        (rc == CUDA_SUCCESS && status == CU_STREAM_CAPTURE_STATUS_ACTIVE && !graph.is_null())
            .then_some(graph as Handle)
    }

    fn mem_free(&self, ptr: CUdeviceptr) {
        if let Some(f) = real().cuMemFree_v2 {
            // SAFETY: see the impl's comment; an allocation the driver just made.
            unsafe { f(ptr) };
        }
    }

    fn mem_free_async(&self, ptr: CUdeviceptr, stream: Handle, ptsz: bool) {
        let r = real();
        if let Some(f) = if ptsz {
            r.cuMemFreeAsync_ptsz
        } else {
            r.cuMemFreeAsync
        } {
            // SAFETY: see the impl's comment; an allocation just made on that stream.
            unsafe { f(ptr, stream as CUstream) };
        }
    }

    fn mem_info(&self) -> Result<(u64, u64), CUresult> {
        let f = real().cuMemGetInfo_v2.ok_or(CUDA_ERROR_NOT_SUPPORTED)?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: see the impl's comment.
        match unsafe { f(&mut free, &mut total) } {
            CUDA_SUCCESS => Ok((free as u64, total as u64)),
            e => Err(e),
        }
    }

    fn device_totals(&self) -> Option<Vec<u64>> {
        let r = real();
        let (count, total) = (r.cuDeviceGetCount?, r.cuDeviceTotalMem_v2?);
        let mut n = 0;
        // SAFETY: see the impl's comment.
        if unsafe { count(&mut n) } != CUDA_SUCCESS {
            return None;
        }
        let n = (n.max(0) as usize).min(libshare_abi::MAX_DEVICES);
        (0..n)
            .map(|d| {
                let mut t = 0usize;
                // SAFETY: see the impl's comment; an ordinal below the device count.
                (unsafe { total(&mut t, d as CUdevice) } == CUDA_SUCCESS).then_some(t as u64)
            })
            .collect()
    }
}

/// A driver in memory for unit tests of the accounting: allocations with their contexts, pools
/// with reserved bytes, events the test completes by hand.
#[cfg(test)]
pub mod fake {
    use super::*;
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicUsize, Ordering::*};
    use std::sync::Mutex;

    #[derive(Default)]
    pub struct Fake {
        pub ctx: AtomicUsize,
        /// Live device allocations → their context.
        pub ptrs: Mutex<HashMap<CUdeviceptr, Handle>>,
        /// Pool → (reserved, used).
        pub pools: Mutex<HashMap<Handle, (u64, u64)>>,
        /// Event → reached.
        pub events: Mutex<HashMap<Handle, bool>>,
        next: AtomicUsize,
        pub trims: AtomicUsize,
    }

    impl Fake {
        pub fn new(ctx: Handle) -> Fake {
            let f = Fake::default();
            f.ctx.store(ctx, Relaxed);
            f.next.store(0x1000, Relaxed);
            f
        }
        pub fn reach_all(&self) {
            for v in self.events.lock().unwrap().values_mut() {
                *v = true;
            }
        }
        pub fn set_reserved(&self, pool: Handle, reserved: u64) {
            self.pools.lock().unwrap().entry(pool).or_default().0 = reserved;
        }
    }

    impl DriverOps for Fake {
        fn current_ctx(&self) -> Option<Handle> {
            Some(self.ctx.load(Relaxed)).filter(|c| *c != 0)
        }
        fn ctx_device(&self) -> Option<usize> {
            Some(0)
        }
        fn primary_active(&self, _dev: usize) -> Option<bool> {
            Some(false)
        }
        fn pointer_ctx(&self, ptr: CUdeviceptr) -> Option<Handle> {
            self.ptrs.lock().unwrap().get(&ptr).copied()
        }
        fn pointer_on_device(&self, ptr: CUdeviceptr) -> bool {
            self.ptrs.lock().unwrap().contains_key(&ptr)
        }
        fn memory_bandwidth(&self, _dev: usize) -> Option<u64> {
            None
        }
        fn array_alive(&self, _h: Handle) -> bool {
            true
        }
        fn current_pool(&self, _dev: usize) -> Option<Handle> {
            Some(0x900)
        }
        fn pool_reserved(&self, pool: Handle) -> Option<u64> {
            self.pools.lock().unwrap().get(&pool).map(|p| p.0)
        }
        fn pool_trim(&self, pool: Handle) {
            self.trims.fetch_add(1, Relaxed);
            if let Some(p) = self.pools.lock().unwrap().get_mut(&pool) {
                p.0 = p.1;
            }
        }
        fn event_create(&self) -> Option<Handle> {
            let e = self.next.fetch_add(1, Relaxed);
            self.events.lock().unwrap().insert(e, false);
            Some(e)
        }
        fn event_record(&self, event: Handle, _stream: Handle, _ptsz: bool) -> bool {
            self.events.lock().unwrap().insert(event, false);
            true
        }
        fn event_query(&self, event: Handle) -> EventState {
            match self.events.lock().unwrap().get(&event) {
                Some(true) => EventState::Done,
                Some(false) => EventState::NotReady,
                None => EventState::Gone,
            }
        }
        fn event_wait(&self, event: Handle) {
            if let Some(v) = self.events.lock().unwrap().get_mut(&event) {
                *v = true;
            }
        }
        fn event_destroy(&self, event: Handle) {
            self.events.lock().unwrap().remove(&event);
        }
        fn timed_event_create(&self) -> Option<Handle> {
            self.event_create()
        }
        fn event_elapsed_ns(&self, start: Handle, end: Handle) -> Option<u64> {
            let ev = self.events.lock().unwrap();
            (ev.get(&start) == Some(&true) && ev.get(&end) == Some(&true)).then_some(1_000)
        }
        fn relax_capture(&self) -> Option<u32> {
            None
        }
        fn restore_capture(&self, _mode: u32) {}
        fn capturing(&self, _stream: Handle, _ptsz: bool) -> Option<Handle> {
            None
        }
        fn stream_ctx(&self, _stream: Handle) -> Option<Handle> {
            self.current_ctx()
        }
        fn mem_free(&self, ptr: CUdeviceptr) {
            self.ptrs.lock().unwrap().remove(&ptr);
        }
        fn mem_free_async(&self, ptr: CUdeviceptr, _stream: Handle, _ptsz: bool) {
            self.ptrs.lock().unwrap().remove(&ptr);
        }
        fn mem_info(&self) -> Result<(u64, u64), CUresult> {
            Ok((1 << 40, 1 << 40))
        }
        fn device_totals(&self) -> Option<Vec<u64>> {
            Some(vec![1 << 40])
        }
    }
}
