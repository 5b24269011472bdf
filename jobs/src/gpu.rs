//! A minimal wrapper over the CUDA driver API (through `cudarc`'s `result`/`sys` layers) with
//! exactly the calls the jobs need, each error naming the driver call that failed.
//!
//! Everything is single-threaded: the primary context is made current on the thread that calls
//! [`Gpu::open`], and all other calls must come from that thread.

use cudarc::driver::{result, sys, DriverError};
use std::ffi::{c_void, CString};
use std::fmt;

/// A failed driver call: which one, and what it returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaError {
    pub call: &'static str,
    pub code: sys::CUresult,
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The enum's name (e.g. CUDA_ERROR_OUT_OF_MEMORY) needs no further driver call.
        write!(
            f,
            "{} failed: {:?} ({})",
            self.call, self.code, self.code as u32
        )
    }
}

impl std::error::Error for CudaError {}

/// Why the GPU could not be opened.
#[derive(Debug)]
pub enum OpenError {
    /// `libcuda.so.1` could not be loaded at all.
    NoDriver(String),
    /// The driver loaded but a call failed.
    Cuda(CudaError),
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::NoDriver(why) => write!(f, "no CUDA driver: {why}"),
            OpenError::Cuda(e) => write!(f, "CUDA initialisation failed: {e}"),
        }
    }
}

impl std::error::Error for OpenError {}

impl From<CudaError> for OpenError {
    fn from(e: CudaError) -> Self {
        OpenError::Cuda(e)
    }
}

fn check<T>(call: &'static str, r: Result<T, DriverError>) -> Result<T, CudaError> {
    r.map_err(|e| CudaError { call, code: e.0 })
}

fn check_raw(call: &'static str, r: sys::CUresult) -> Result<(), CudaError> {
    check(call, r.result())
}

/// Makes sure `libcuda.so.1` can be loaded, with a useful message when it cannot. (cudarc
/// would panic on its first call instead.)
pub fn probe_driver() -> Result<(), OpenError> {
    // SAFETY: loading the CUDA driver runs its initialisers, as any CUDA program does.
    match unsafe { libloading::Library::new("libcuda.so.1") } {
        Ok(lib) => {
            // Keep it loaded: cudarc opens it again (same handle), and unloading a driver
            // (real or simulated) mid-process is asking for trouble.
            std::mem::forget(lib);
            Ok(())
        }
        Err(e) => {
            // libloading's Display is just "dlopen failed"; dlerror's text is the source.
            let msg = match std::error::Error::source(&e) {
                Some(src) => src.to_string(),
                None => e.to_string(),
            };
            if msg.contains("No such file") || msg.contains("cannot open shared object") {
                Err(OpenError::NoDriver(
                    "libcuda.so.1 not found (set LD_LIBRARY_PATH to simgpu's lib dir)".into(),
                ))
            } else {
                Err(OpenError::NoDriver(format!(
                    "cannot load libcuda.so.1: {msg}"
                )))
            }
        }
    }
}

/// Device facts reported by the jobs.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub total_mem: u64,
    pub driver_version: i32,
}

impl DeviceInfo {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "ordinal": self.ordinal,
            "name": self.name,
            "total_mem": self.total_mem,
            "driver_version": self.driver_version,
        })
    }
}

/// One device's primary context, one non-blocking stream and the spin kernel.
pub struct Gpu {
    dev: sys::CUdevice,
    stream: sys::CUstream,
    module: sys::CUmodule,
    spin: sys::CUfunction,
    spin_touch: sys::CUfunction,
    block_spin: sys::CUfunction,
    pub info: DeviceInfo,
}

impl Gpu {
    /// Initialises the driver, makes device `ordinal`'s primary context current on this thread,
    /// creates a stream and loads the spin kernel from the embedded PTX (`cuModuleLoadData`).
    pub fn open(ordinal: usize) -> Result<Gpu, OpenError> {
        probe_driver()?;
        check("cuInit", result::init())?;
        let mut driver_version = 0;
        // SAFETY: `driver_version` is a live, writable c_int local: the out-pointer the call needs.
        check_raw("cuDriverGetVersion", unsafe {
            sys::cuDriverGetVersion(&mut driver_version)
        })?;
        let count = check("cuDeviceGetCount", result::device::get_count())?;
        if ordinal >= count.max(0) as usize {
            return Err(OpenError::Cuda(CudaError {
                call: if count == 0 {
                    "cuDeviceGetCount (no devices)"
                } else {
                    "cuDeviceGet (ordinal out of range)"
                },
                code: if count == 0 {
                    sys::CUresult::CUDA_ERROR_NO_DEVICE
                } else {
                    sys::CUresult::CUDA_ERROR_INVALID_DEVICE
                },
            }));
        }
        let dev = check("cuDeviceGet", result::device::get(ordinal as i32))?;
        let name = check("cuDeviceGetName", result::device::get_name(dev))?;
        // SAFETY: `dev` is a valid device handle, just returned by cuDeviceGet.
        let total_mem = check("cuDeviceTotalMem_v2", unsafe {
            result::device::total_mem(dev)
        })? as u64;
        // SAFETY: `dev` is a valid device handle from cuDeviceGet; the retain is balanced by the
        // release in Gpu's Drop (the Gpu is built right below, before any early return).
        let ctx = check("cuDevicePrimaryCtxRetain", unsafe {
            result::primary_ctx::retain(dev)
        })?;
        let mut gpu = Gpu {
            dev,
            stream: std::ptr::null_mut(),
            module: std::ptr::null_mut(),
            spin: std::ptr::null_mut(),
            spin_touch: std::ptr::null_mut(),
            block_spin: std::ptr::null_mut(),
            info: DeviceInfo {
                ordinal,
                name,
                total_mem,
                driver_version,
            },
        };
        // SAFETY: `ctx` is the live primary context retained above (held until Drop).
        // From here on, Drop cleans up.
        check("cuCtxSetCurrent", unsafe { result::ctx::set_current(ctx) })?;
        gpu.stream = check(
            "cuStreamCreate",
            result::stream::create(result::stream::StreamKind::NonBlocking),
        )?;
        let ptx = CString::new(crate::SPIN_PTX).expect("PTX has no NUL bytes");
        // SAFETY: `ptx` is a NUL-terminated CString (PTX text, as cuModuleLoadData expects),
        // alive across the call; a context is current on this thread (set above).
        gpu.module = check("cuModuleLoadData", unsafe {
            result::module::load_data(ptx.as_ptr() as *const c_void)
        })?;
        let fname = CString::new(crate::SPIN_KERNEL).expect("no NUL");
        // SAFETY: `gpu.module` was just loaded successfully and stays loaded until Drop.
        gpu.spin = check("cuModuleGetFunction", unsafe {
            result::module::get_function(gpu.module, fname)
        })?;
        let fname = CString::new(crate::SPIN_TOUCH_KERNEL).expect("no NUL");
        // SAFETY: as above, `gpu.module` is loaded.
        gpu.spin_touch = check("cuModuleGetFunction", unsafe {
            result::module::get_function(gpu.module, fname)
        })?;
        let fname = CString::new(crate::BLOCK_SPIN_KERNEL).expect("no NUL");
        // SAFETY: as above, `gpu.module` is loaded.
        gpu.block_spin = check("cuModuleGetFunction", unsafe {
            result::module::get_function(gpu.module, fname)
        })?;
        Ok(gpu)
    }

    /// The device's multiprocessors (`CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`).
    pub fn sm_count(&self) -> Result<u32, CudaError> {
        // SAFETY: `self.dev` is the device handle `open` got from cuDeviceGet.
        let n = check("cuDeviceGetAttribute", unsafe {
            result::device::get_attribute(
                self.dev,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
        })?;
        Ok(n.max(1) as u32)
    }

    /// Launches `block_spin(ns)` with `blocks` blocks of [`crate::BLOCK_SPIN_THREADS`]: every
    /// block spins `ns`, the launch takes its waves of resident blocks × `ns`.
    pub fn block_spin(&self, ns: u64, blocks: u32) -> Result<(), CudaError> {
        let mut arg = ns;
        let mut params = [&mut arg as *mut u64 as *mut c_void];
        // SAFETY: the function takes exactly one u64 parameter; the driver copies the
        // parameter values before cuLaunchKernel returns.
        check("cuLaunchKernel", unsafe {
            result::launch_kernel(
                self.block_spin,
                (blocks.max(1), 1, 1),
                (crate::BLOCK_SPIN_THREADS, 1, 1),
                0,
                self.stream,
                &mut params,
            )
        })
    }

    /// Launches `simgpu_spin_touch(ns, buf, bytes)`: the kernel's working set is `buf`.
    pub fn spin_over(&self, ns: u64, buf: &DeviceBuffer<'_>) -> Result<(), CudaError> {
        let (mut a, mut b, mut c) = (ns, buf.ptr, buf.bytes);
        let mut params = [
            &mut a as *mut u64 as *mut c_void,
            &mut b as *mut u64 as *mut c_void,
            &mut c as *mut u64 as *mut c_void,
        ];
        // SAFETY: the function takes three u64 parameters; the driver copies the parameter
        // values before cuLaunchKernel returns; `buf` outlives the launch (freed on drop, after
        // the caller synchronises).
        check("cuLaunchKernel", unsafe {
            result::launch_kernel(
                self.spin_touch,
                (1, 1, 1),
                (32, 1, 1),
                0,
                self.stream,
                &mut params,
            )
        })
    }

    /// Launches `simgpu_spin(ns)` (grid 1×1×1, block 32) on the stream.
    pub fn spin(&self, ns: u64) -> Result<(), CudaError> {
        let mut arg = ns;
        let mut params = [&mut arg as *mut u64 as *mut c_void];
        // SAFETY: the function takes exactly one u64 parameter; the driver copies the
        // parameter values before cuLaunchKernel returns.
        check("cuLaunchKernel", unsafe {
            result::launch_kernel(
                self.spin,
                (1, 1, 1),
                (32, 1, 1),
                0,
                self.stream,
                &mut params,
            )
        })
    }

    /// Waits for everything queued on the stream.
    pub fn sync(&self) -> Result<(), CudaError> {
        // SAFETY: `self.stream` was created in `open` and is destroyed only in Drop.
        check("cuStreamSynchronize", unsafe {
            result::stream::synchronize(self.stream)
        })
    }

    /// Allocates device memory (`cuMemAlloc_v2`), or managed memory (`cuMemAllocManaged`,
    /// attached globally) when `managed`.
    pub fn alloc(&self, bytes: u64, managed: bool) -> Result<DeviceBuffer<'_>, CudaError> {
        let n = usize::try_from(bytes).expect("size fits in usize");
        let ptr = if managed {
            // SAFETY: a plain allocation in the current context (this Gpu's, current on this
            // thread); the pointer is owned by the DeviceBuffer and freed once in its Drop.
            check("cuMemAllocManaged", unsafe {
                result::malloc_managed(n, sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL)
            })?
        } else {
            // SAFETY: as above.
            check("cuMemAlloc_v2", unsafe { result::malloc_sync(n) })?
        };
        Ok(DeviceBuffer {
            _gpu: self,
            ptr,
            bytes,
        })
    }

    /// Queues a memset of the whole buffer (`cuMemsetD8Async`).
    pub fn memset(&self, buf: &DeviceBuffer<'_>, value: u8) -> Result<(), CudaError> {
        if buf.bytes == 0 {
            return Ok(());
        }
        // SAFETY: `buf` borrows a live allocation of `buf.bytes` bytes (freed only when it drops,
        // and cuMemFree waits for queued work on it); `self.stream` is live.
        check("cuMemsetD8Async", unsafe {
            result::memset_d8_async(buf.ptr, value, buf.bytes as usize, self.stream)
        })
    }

    /// Allocates host memory: page-locked (`cuMemHostAlloc`) unless `pageable`.
    pub fn host_alloc(&self, bytes: u64, pageable: bool) -> Result<HostBuffer<'_>, CudaError> {
        let n = usize::try_from(bytes).expect("size fits in usize");
        if pageable || n == 0 {
            return Ok(HostBuffer {
                _gpu: self,
                mem: HostMem::Pageable(vec![0u8; n]),
            });
        }
        // SAFETY: a plain page-locked allocation of `n` > 0 bytes, owned by the HostBuffer and
        // freed once with cuMemFreeHost in its Drop.
        let ptr = check("cuMemHostAlloc", unsafe { result::malloc_host(n, 0) })?;
        // SAFETY: cuMemHostAlloc succeeded, so `ptr` points to `n` writable bytes that nothing
        // else references yet.
        unsafe { std::ptr::write_bytes(ptr as *mut u8, 0, n) };
        Ok(HostBuffer {
            _gpu: self,
            mem: HostMem::Pinned { ptr, len: n },
        })
    }

    /// Queues a host→device copy of `src` to the start of `dst` (`cuMemcpyHtoDAsync_v2`).
    pub fn copy_to_device(
        &self,
        dst: &DeviceBuffer<'_>,
        src: &HostBuffer<'_>,
    ) -> Result<(), CudaError> {
        let n = src.len();
        assert!(n as u64 <= dst.bytes, "copy larger than the device buffer");
        if n == 0 {
            return Ok(());
        }
        // SAFETY: both buffers are live and large enough; the host buffer outlives the copy
        // because the callers synchronise the stream before dropping or rewriting it.
        check_raw("cuMemcpyHtoDAsync_v2", unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst.ptr, src.as_ptr() as *const c_void, n, self.stream)
        })
    }

    /// Queues a device→host copy of the start of `src` into `dst` (`cuMemcpyDtoHAsync_v2`).
    pub fn copy_to_host(
        &self,
        dst: &mut HostBuffer<'_>,
        src: &DeviceBuffer<'_>,
    ) -> Result<(), CudaError> {
        let n = dst.len();
        assert!(n as u64 <= src.bytes, "copy larger than the device buffer");
        if n == 0 {
            return Ok(());
        }
        // SAFETY: as in copy_to_device: `dst` holds at least `n` writable bytes and `src` at least
        // `n` device bytes (asserted); `dst` must not be read or freed before the caller
        // synchronises the stream (the documented contract of HostBuffer, not enforced).
        check_raw("cuMemcpyDtoHAsync_v2", unsafe {
            sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr() as *mut c_void, src.ptr, n, self.stream)
        })
    }

    /// Queues a device-to-device copy of the whole of `src` to the start of `dst`
    /// (`cuMemcpyDtoDAsync_v2`).
    pub fn copy_on_device(
        &self,
        dst: &DeviceBuffer<'_>,
        src: &DeviceBuffer<'_>,
    ) -> Result<(), CudaError> {
        assert!(src.bytes <= dst.bytes, "copy larger than the destination");
        if src.bytes == 0 {
            return Ok(());
        }
        // SAFETY: both buffers borrow live allocations at least `src.bytes` long (asserted);
        // cuMemFree waits for queued work on them; `self.stream` is live.
        check("cuMemcpyDtoDAsync_v2", unsafe {
            result::memcpy_dtod_async(dst.ptr, src.ptr, src.bytes as usize, self.stream)
        })
    }

    /// Creates an event that records its time (`cuEventCreate` with default flags), for
    /// [`Event::elapsed_ms`].
    pub fn timed_event(&self) -> Result<Event<'_>, CudaError> {
        let ev = check(
            "cuEventCreate",
            result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT),
        )?;
        Ok(Event { gpu: self, ev })
    }

    /// Creates an event without timing (`cuEventCreate`).
    pub fn event(&self) -> Result<Event<'_>, CudaError> {
        let ev = check(
            "cuEventCreate",
            result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING),
        )?;
        Ok(Event { gpu: self, ev })
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // Best effort: the process is usually about to exit anyway.
        // SAFETY: `stream` and `module` are null or were created in `open` and are destroyed only
        // here, once; `dev`'s primary context was retained in `open` (before the Gpu existed),
        // so this release balances it. The stream is synchronised before its module goes away.
        unsafe {
            if !self.stream.is_null() {
                let _ = result::stream::synchronize(self.stream);
            }
            if !self.module.is_null() {
                let _ = result::module::unload(self.module);
            }
            if !self.stream.is_null() {
                let _ = result::stream::destroy(self.stream);
            }
            let _ = result::primary_ctx::release(self.dev);
        }
    }
}

/// Device (or managed) memory, freed on drop.
pub struct DeviceBuffer<'g> {
    _gpu: &'g Gpu,
    ptr: sys::CUdeviceptr,
    bytes: u64,
}

impl DeviceBuffer<'_> {
    pub fn len(&self) -> u64 {
        self.bytes
    }
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
}

impl Drop for DeviceBuffer<'_> {
    fn drop(&mut self) {
        // SAFETY: `ptr` was returned by cuMemAlloc/cuMemAllocManaged and is owned by this buffer,
        // so it is freed exactly once; cuMemFree waits for outstanding work that uses it.
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

enum HostMem {
    Pinned { ptr: *mut c_void, len: usize },
    Pageable(Vec<u8>),
}

/// Host memory for copies: page-locked (`cuMemHostAlloc`) or ordinary.
pub struct HostBuffer<'g> {
    _gpu: &'g Gpu,
    mem: HostMem,
}

impl HostBuffer<'_> {
    pub fn len(&self) -> usize {
        match &self.mem {
            HostMem::Pinned { len, .. } => *len,
            HostMem::Pageable(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn is_pinned(&self) -> bool {
        matches!(self.mem, HostMem::Pinned { .. })
    }
    fn as_ptr(&self) -> *const u8 {
        match &self.mem {
            HostMem::Pinned { ptr, .. } => *ptr as *const u8,
            HostMem::Pageable(v) => v.as_ptr(),
        }
    }
    fn as_mut_ptr(&mut self) -> *mut u8 {
        match &mut self.mem {
            HostMem::Pinned { ptr, .. } => *ptr as *mut u8,
            HostMem::Pageable(v) => v.as_mut_ptr(),
        }
    }
    /// The bytes (do not read while a copy into the buffer is in flight).
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `as_ptr()` is valid for `len()` initialised bytes (a Vec, or a pinned block
        // zeroed in `host_alloc`) for as long as `self` is borrowed. A copy into the buffer
        // still in flight would race with this read: callers must synchronise first (see
        // `copy_to_host`; this is a documented contract the type does not enforce).
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len()) }
    }
    /// The bytes, writable (do not write while a copy from the buffer is in flight).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let n = self.len();
        // SAFETY: as in `as_slice`, and `&mut self` makes the slice the only Rust reference.
        unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr(), n) }
    }
}

impl Drop for HostBuffer<'_> {
    fn drop(&mut self) {
        if let HostMem::Pinned { ptr, .. } = self.mem {
            // SAFETY: `ptr` came from cuMemHostAlloc and is owned by this buffer: freed exactly once.
            let _ = unsafe { result::free_host(ptr) };
        }
    }
}

/// A CUDA event on the job's stream.
pub struct Event<'g> {
    gpu: &'g Gpu,
    ev: sys::CUevent,
}

impl Event<'_> {
    /// Records the event on the stream (`cuEventRecord`).
    pub fn record(&self) -> Result<(), CudaError> {
        // SAFETY: `self.ev` lives until this Event drops; the borrowed Gpu keeps its stream alive.
        check("cuEventRecord", unsafe {
            result::event::record(self.ev, self.gpu.stream)
        })
    }

    /// Waits until the work before the last record is done (`cuEventSynchronize`).
    pub fn synchronize(&self) -> Result<(), CudaError> {
        // SAFETY: `self.ev` was created by cuEventCreate and is destroyed only in Drop.
        check("cuEventSynchronize", unsafe {
            result::event::synchronize(self.ev)
        })
    }
}

impl Event<'_> {
    /// Whether the work before the last record is done (`cuEventQuery`: `CUDA_SUCCESS` or
    /// `CUDA_ERROR_NOT_READY`).
    pub fn done(&self) -> Result<bool, CudaError> {
        // SAFETY: `self.ev` was created by cuEventCreate and is destroyed only in Drop.
        match unsafe { result::event::query(self.ev) } {
            Ok(()) => Ok(true),
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            Err(e) => Err(CudaError {
                call: "cuEventQuery",
                code: e.0,
            }),
        }
    }

    /// GPU milliseconds from `start`'s completion to this event's (`cuEventElapsedTime`); both
    /// timed events ([`Gpu::timed_event`]), recorded and completed.
    pub fn elapsed_ms(&self, start: &Event<'_>) -> Result<f64, CudaError> {
        // SAFETY: both events were created by cuEventCreate and live until their Drop.
        check("cuEventElapsedTime", unsafe {
            result::event::elapsed(start.ev, self.ev)
        })
        .map(f64::from)
    }
}

impl Drop for Event<'_> {
    fn drop(&mut self) {
        // SAFETY: `self.ev` came from cuEventCreate and is owned by this Event: destroyed once.
        let _ = unsafe { result::event::destroy(self.ev) };
    }
}
