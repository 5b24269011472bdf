//! THE list of hooked driver functions, one line each: how it is hooked, its exported name (the
//! exact ABI symbol, e.g. `cuMemAlloc_v2`), its parameters (as in the declaration list
//! `shim-headers/cuda_driver_api.txt`, checked by parameter count and type), and its handler.
//!
//! - `wrap`: exported; the handler gets the call to the real function (a safe closure running it
//!   with the caller's arguments), then the arguments converted once at the boundary
//!   (`boundary.rs`: pointers to plain data become NULL-checked `Out`/`In`, the rest stay values);
//! - `call`: not exported; only the real function is resolved, for the shim's own driver calls
//!   (`ops.rs`).
//!
//! `driver_hooks!(m)` calls macro `m!` with the whole list: `driver.rs` expands it into the
//! table of real entry points, `hooks.rs` into the exported hooks. The list is data: naming a
//! handler here imports nothing.

#[rustfmt::skip]
macro_rules! driver_hooks {
    ($m:ident) => { $m! {
    // Initialisation and entry-point lookup.
    wrap cuInit(flags: c_uint) => init::cu_init;
    wrap cuGetProcAddress(sym: *const c_char, pfn: *mut *mut c_void, version: i32, flags: u64) => procaddr::get_proc_address;
    wrap cuGetProcAddress_v2(sym: *const c_char, pfn: *mut *mut c_void, version: i32, flags: u64, status: *mut i32) => procaddr::get_proc_address_v2;

    // Launches: counted, and the opportunistic rate gate (`rate.rs`, `gate.rs`).
    wrap cuLaunchKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, smem: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) => launch::kernel::<false>;
    wrap cuLaunchKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, smem: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) => launch::kernel::<true>;
    wrap cuLaunchKernelEx(config: *const LaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) => launch::kernel_ex::<false>;
    wrap cuLaunchKernelEx_ptsz(config: *const LaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) => launch::kernel_ex::<true>;
    wrap cuLaunchCooperativeKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, smem: c_uint, stream: CUstream, params: *mut *mut c_void) => launch::cooperative::<false>;
    wrap cuLaunchCooperativeKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, smem: c_uint, stream: CUstream, params: *mut *mut c_void) => launch::cooperative::<true>;
    wrap cuLaunchCooperativeKernelMultiDevice(list: *mut LaunchParams, n: c_uint, flags: c_uint) => launch::multi_device;
    // The deprecated execution-control API (CUDA 2.x/3.x): configuration set on the function.
    wrap cuLaunch(f: CUfunction) => launch::legacy;
    wrap cuLaunchGrid(f: CUfunction, gw: i32, gh: i32) => launch::legacy_grid;
    wrap cuLaunchGridAsync(f: CUfunction, gw: i32, gh: i32, stream: CUstream) => launch::legacy_grid_async;
    wrap cuGraphLaunch(exec: CUgraphExec, stream: CUstream) => launch::graph::<false>;
    wrap cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream) => launch::graph::<true>;

    // Modules and libraries whose image carries PTX (PTX text, or a fatbin with a PTX entry):
    // kept for kernel slicing (`slicing.rs`), with the kernels a library hands out.
    wrap cuModuleLoadData(module: *mut CUmodule, image: *const c_void) => slicing::load_data;
    wrap cuModuleLoadDataEx(module: *mut CUmodule, image: *const c_void, n: c_uint, options: *mut c_uint, values: *mut *mut c_void) => slicing::load_data_ex;
    wrap cuModuleLoadFatBinary(module: *mut CUmodule, image: *const c_void) => slicing::load_data;
    wrap cuModuleUnload(module: CUmodule) => slicing::unload;
    wrap cuLibraryLoadData(library: *mut CUlibrary, code: *const c_void, jit_options: *mut c_uint, jit_values: *mut *mut c_void, n_jit: c_uint, library_options: *mut c_uint, library_values: *mut *mut c_void, n_library: c_uint) => slicing::library_load_data;
    wrap cuLibraryUnload(library: CUlibrary) => slicing::unload;
    wrap cuLibraryGetKernel(kernel: *mut CUkernel, library: CUlibrary, name: *const c_char) => slicing::library_get_kernel;
    wrap cuKernelGetFunction(f: *mut CUfunction, kernel: CUkernel) => slicing::kernel_get_function;

    // Memsets and device-to-device copies: counted and gated as launches (`transfer.rs`).
    wrap cuMemsetD8(d: u32, uc: u8, n: c_uint) => transfer::memset_v1::<1>;
    wrap cuMemsetD8_v2(d: CUdeviceptr, uc: u8, n: usize) => transfer::memset::<1, false>;
    wrap cuMemsetD8_v2_ptds(d: CUdeviceptr, uc: u8, n: usize) => transfer::memset::<1, true>;
    wrap cuMemsetD8Async(d: CUdeviceptr, uc: u8, n: usize, stream: CUstream) => transfer::memset_async::<1, false>;
    wrap cuMemsetD8Async_ptsz(d: CUdeviceptr, uc: u8, n: usize, stream: CUstream) => transfer::memset_async::<1, true>;
    wrap cuMemsetD2D8(d: u32, pitch: c_uint, uc: u8, w: c_uint, h: c_uint) => transfer::memset_2d_v1::<1>;
    wrap cuMemsetD2D8_v2(d: CUdeviceptr, pitch: usize, uc: u8, w: usize, h: usize) => transfer::memset_2d::<1, false>;
    wrap cuMemsetD2D8_v2_ptds(d: CUdeviceptr, pitch: usize, uc: u8, w: usize, h: usize) => transfer::memset_2d::<1, true>;
    wrap cuMemsetD2D8Async(d: CUdeviceptr, pitch: usize, uc: u8, w: usize, h: usize, stream: CUstream) => transfer::memset_2d_async::<1, false>;
    wrap cuMemsetD2D8Async_ptsz(d: CUdeviceptr, pitch: usize, uc: u8, w: usize, h: usize, stream: CUstream) => transfer::memset_2d_async::<1, true>;
    wrap cuMemsetD16(d: u32, us: u16, n: c_uint) => transfer::memset_v1::<2>;
    wrap cuMemsetD16_v2(d: CUdeviceptr, us: u16, n: usize) => transfer::memset::<2, false>;
    wrap cuMemsetD16_v2_ptds(d: CUdeviceptr, us: u16, n: usize) => transfer::memset::<2, true>;
    wrap cuMemsetD16Async(d: CUdeviceptr, us: u16, n: usize, stream: CUstream) => transfer::memset_async::<2, false>;
    wrap cuMemsetD16Async_ptsz(d: CUdeviceptr, us: u16, n: usize, stream: CUstream) => transfer::memset_async::<2, true>;
    wrap cuMemsetD2D16(d: u32, pitch: c_uint, us: u16, w: c_uint, h: c_uint) => transfer::memset_2d_v1::<2>;
    wrap cuMemsetD2D16_v2(d: CUdeviceptr, pitch: usize, us: u16, w: usize, h: usize) => transfer::memset_2d::<2, false>;
    wrap cuMemsetD2D16_v2_ptds(d: CUdeviceptr, pitch: usize, us: u16, w: usize, h: usize) => transfer::memset_2d::<2, true>;
    wrap cuMemsetD2D16Async(d: CUdeviceptr, pitch: usize, us: u16, w: usize, h: usize, stream: CUstream) => transfer::memset_2d_async::<2, false>;
    wrap cuMemsetD2D16Async_ptsz(d: CUdeviceptr, pitch: usize, us: u16, w: usize, h: usize, stream: CUstream) => transfer::memset_2d_async::<2, true>;
    wrap cuMemsetD32(d: u32, ui: c_uint, n: c_uint) => transfer::memset_v1::<4>;
    wrap cuMemsetD32_v2(d: CUdeviceptr, ui: c_uint, n: usize) => transfer::memset::<4, false>;
    wrap cuMemsetD32_v2_ptds(d: CUdeviceptr, ui: c_uint, n: usize) => transfer::memset::<4, true>;
    wrap cuMemsetD32Async(d: CUdeviceptr, ui: c_uint, n: usize, stream: CUstream) => transfer::memset_async::<4, false>;
    wrap cuMemsetD32Async_ptsz(d: CUdeviceptr, ui: c_uint, n: usize, stream: CUstream) => transfer::memset_async::<4, true>;
    wrap cuMemsetD2D32(d: u32, pitch: c_uint, ui: c_uint, w: c_uint, h: c_uint) => transfer::memset_2d_v1::<4>;
    wrap cuMemsetD2D32_v2(d: CUdeviceptr, pitch: usize, ui: c_uint, w: usize, h: usize) => transfer::memset_2d::<4, false>;
    wrap cuMemsetD2D32_v2_ptds(d: CUdeviceptr, pitch: usize, ui: c_uint, w: usize, h: usize) => transfer::memset_2d::<4, true>;
    wrap cuMemsetD2D32Async(d: CUdeviceptr, pitch: usize, ui: c_uint, w: usize, h: usize, stream: CUstream) => transfer::memset_2d_async::<4, false>;
    wrap cuMemsetD2D32Async_ptsz(d: CUdeviceptr, pitch: usize, ui: c_uint, w: usize, h: usize, stream: CUstream) => transfer::memset_2d_async::<4, true>;
    wrap cuMemcpyDtoD(dst: u32, src: u32, n: c_uint) => transfer::dtod_v1;
    wrap cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) => transfer::dtod::<false>;
    wrap cuMemcpyDtoD_v2_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize) => transfer::dtod::<true>;
    wrap cuMemcpyDtoDAsync(dst: u32, src: u32, n: c_uint, stream: CUstream) => transfer::dtod_async_v1;
    wrap cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream) => transfer::dtod_async::<false>;
    wrap cuMemcpyDtoDAsync_v2_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream) => transfer::dtod_async::<true>;
    // Unified addressing: gated when both pointers are device memory (asked when opportunistic).
    wrap cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) => transfer::copy::<false>;
    wrap cuMemcpy_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize) => transfer::copy::<true>;
    wrap cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream) => transfer::copy_async::<false>;
    wrap cuMemcpyAsync_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream) => transfer::copy_async::<true>;

    // Synchronising calls that return with work done: the drain signal (a hint, `sync.rs`).
    wrap cuCtxSynchronize() => sync::ctx;
    wrap cuCtxSynchronize_v2(ctx: CUcontext) => sync::ctx_v2;
    wrap cuStreamSynchronize(stream: CUstream) => sync::stream;
    wrap cuStreamSynchronize_ptsz(stream: CUstream) => sync::stream;
    wrap cuStreamQuery(stream: CUstream) => sync::stream;
    wrap cuStreamQuery_ptsz(stream: CUstream) => sync::stream;
    wrap cuEventSynchronize(event: CUevent) => sync::event;
    wrap cuEventQuery(event: CUevent) => sync::event;

    // Contexts: overhead charge, teardown settles the context's allocations, current device.
    wrap cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) => context::primary_retain;
    wrap cuDevicePrimaryCtxRelease(dev: CUdevice) => context::primary_release;
    wrap cuDevicePrimaryCtxRelease_v2(dev: CUdevice) => context::primary_release;
    wrap cuDevicePrimaryCtxReset(dev: CUdevice) => context::primary_reset;
    wrap cuDevicePrimaryCtxReset_v2(dev: CUdevice) => context::primary_reset;
    wrap cuCtxCreate(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) => context::create;
    wrap cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) => context::create;
    wrap cuCtxCreate_v3(pctx: *mut CUcontext, params: *mut c_void, n: i32, flags: c_uint, dev: CUdevice) => context::create_v3;
    wrap cuCtxCreate_v4(pctx: *mut CUcontext, params: *mut c_void, flags: c_uint, dev: CUdevice) => context::create_v4;
    wrap cuCtxDestroy(ctx: CUcontext) => context::destroy;
    wrap cuCtxDestroy_v2(ctx: CUcontext) => context::destroy;
    wrap cuCtxSetCurrent(ctx: CUcontext) => context::set_current;
    wrap cuCtxPushCurrent(ctx: CUcontext) => context::push;
    wrap cuCtxPushCurrent_v2(ctx: CUcontext) => context::push;
    wrap cuCtxPopCurrent(ctx: *mut CUcontext) => context::pop;
    wrap cuCtxPopCurrent_v2(ctx: *mut CUcontext) => context::pop;

    // Allocation paths, all charged to the container's quota (v1: 32-bit sizes of CUDA 2.x ABI).
    wrap cuMemAlloc(dptr: *mut u32, size: c_uint) => memory::alloc_v1;
    wrap cuMemAlloc_v2(dptr: *mut CUdeviceptr, size: usize) => memory::alloc;
    wrap cuMemAllocPitch(dptr: *mut u32, pitch: *mut c_uint, width: c_uint, height: c_uint, elem: c_uint) => memory::alloc_pitch_v1;
    wrap cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: c_uint) => memory::alloc_pitch;
    wrap cuMemAllocManaged(dptr: *mut CUdeviceptr, size: usize, flags: c_uint) => memory::alloc_managed;
    wrap cuMemFree(ptr: u32) => memory::free_v1;
    wrap cuMemFree_v2(ptr: CUdeviceptr) => memory::free;
    wrap cuMemCreate(handle: *mut u64, size: usize, prop: *const MemAllocationProp, flags: u64) => memory::create;
    wrap cuMemRelease(handle: u64) => memory::release;
    wrap cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: u64, flags: u64) => memory::map;
    wrap cuMemUnmap(ptr: CUdeviceptr, size: usize) => memory::unmap;
    wrap cuMemAllocAsync(dptr: *mut CUdeviceptr, size: usize, stream: CUstream) => memory::alloc_async;
    wrap cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, size: usize, stream: CUstream) => memory::alloc_async_ptsz;
    wrap cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, size: usize, pool: CUmemoryPool, stream: CUstream) => memory::alloc_from_pool;
    wrap cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, size: usize, pool: CUmemoryPool, stream: CUstream) => memory::alloc_from_pool_ptsz;
    wrap cuMemFreeAsync(ptr: CUdeviceptr, stream: CUstream) => memory::free_async;
    wrap cuMemFreeAsync_ptsz(ptr: CUdeviceptr, stream: CUstream) => memory::free_async_ptsz;

    // CUDA arrays (texture and surface storage), charged at least at their dense size.
    wrap cuArrayCreate(ph: *mut *mut c_void, desc: *const ArrayDescV1) => memory::array_create;
    wrap cuArrayCreate_v2(ph: *mut *mut c_void, desc: *const ArrayDesc) => memory::array_create;
    wrap cuArray3DCreate(ph: *mut *mut c_void, desc: *const Array3DDescV1) => memory::array_create;
    wrap cuArray3DCreate_v2(ph: *mut *mut c_void, desc: *const Array3DDesc) => memory::array_create;
    wrap cuMipmappedArrayCreate(ph: *mut *mut c_void, desc: *const Array3DDesc, levels: c_uint) => memory::mipmapped_array_create;
    wrap cuArrayDestroy(h: *mut c_void) => memory::array_destroy;
    wrap cuMipmappedArrayDestroy(h: *mut c_void) => memory::array_destroy;

    // CUDA-graph memory: charged from the allocation node until the last graph holding it goes.
    wrap cuGraphAddMemAllocNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, n: usize, params: *mut MemAllocNodeParams) => graph_mem::add_mem_alloc_node;
    wrap cuGraphAddMemFreeNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, n: usize, dptr: CUdeviceptr) => graph_mem::add_mem_free_node;
    wrap cuGraphAddNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, n: usize, params: *mut GraphNodeParams) => graph_mem::add_node;
    wrap cuGraphAddNode_v2(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, edges: *const c_void, n: usize, params: *mut GraphNodeParams) => graph_mem::add_node_v2;
    wrap cuGraphAddNode_v3(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, edges: *const c_void, n: usize, params: *mut GraphNodeParams) => graph_mem::add_node_v2;
    wrap cuGraphInstantiate(exec: *mut CUgraphExec, graph: CUgraph, err: *mut CUgraphNode, log: *mut c_char, n: usize) => graph_mem::instantiate;
    wrap cuGraphInstantiate_v2(exec: *mut CUgraphExec, graph: CUgraph, err: *mut CUgraphNode, log: *mut c_char, n: usize) => graph_mem::instantiate;
    wrap cuGraphInstantiateWithFlags(exec: *mut CUgraphExec, graph: CUgraph, flags: u64) => graph_mem::instantiate_with_flags;
    wrap cuGraphInstantiateWithParams(exec: *mut CUgraphExec, graph: CUgraph, params: *mut c_void) => graph_mem::instantiate_with_params;
    wrap cuGraphInstantiateWithParams_ptsz(exec: *mut CUgraphExec, graph: CUgraph, params: *mut c_void) => graph_mem::instantiate_with_params;
    wrap cuGraphClone(out: *mut CUgraph, graph: CUgraph) => graph_mem::clone;
    wrap cuGraphDestroy(graph: CUgraph) => graph_mem::destroy;
    wrap cuGraphExecDestroy(exec: CUgraphExec) => graph_mem::destroy;

    // What the job sees of the device's memory: the quota.
    wrap cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) => memory::get_info_v1;
    wrap cuMemGetInfo_v2(free: *mut usize, total: *mut usize) => memory::get_info;
    wrap cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice) => memory::total_mem_v1;
    wrap cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) => memory::total_mem;

    // Used by the shim itself (`ops.rs`).
    call cuCtxGetDevice(dev: *mut CUdevice);
    call cuDeviceGetCount(count: *mut i32);
    call cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice);
    call cuDeviceGetAttribute(value: *mut i32, attr: c_uint, dev: CUdevice);
    call cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut c_uint, active: *mut i32);
    call cuPointerGetAttribute(data: *mut c_void, attr: c_uint, ptr: CUdeviceptr);
    call cuMemAdvise(ptr: CUdeviceptr, size: usize, advice: c_uint, dev: CUdevice);
    call cuFuncGetParamInfo(f: CUfunction, index: usize, offset: *mut usize, size: *mut usize);
    call cuCtxGetCurrent(ctx: *mut CUcontext);
    call cuMemPrefetchAsync(ptr: CUdeviceptr, size: usize, dev: CUdevice, stream: CUstream);
    call cuStreamCreate(stream: *mut CUstream, flags: c_uint);
    call cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice);
    call cuMemPoolGetAttribute(pool: CUmemoryPool, attr: c_uint, value: *mut c_void);
    call cuMemPoolTrimTo(pool: CUmemoryPool, keep: usize);
    call cuEventCreate(event: *mut CUevent, flags: c_uint);
    call cuEventRecord(event: CUevent, stream: CUstream);
    call cuEventRecord_ptsz(event: CUevent, stream: CUstream);
    call cuEventElapsedTime(ms: *mut f32, start: CUevent, end: CUevent);
    call cuEventDestroy_v2(event: CUevent);
    call cuThreadExchangeStreamCaptureMode(mode: *mut c_uint);
    call cuStreamGetCtx(stream: CUstream, ctx: *mut CUcontext);
    call cuStreamGetCaptureInfo_v2(stream: CUstream, status: *mut c_uint, id: *mut u64, graph: *mut CUgraph, deps: *mut *const CUgraphNode, n: *mut usize);
    call cuStreamGetCaptureInfo_v2_ptsz(stream: CUstream, status: *mut c_uint, id: *mut u64, graph: *mut CUgraph, deps: *mut *const CUgraphNode, n: *mut usize);
    call cuArrayGetDescriptor_v2(desc: *mut ArrayDesc, h: *mut c_void);
    call cuModuleGetFunction(f: *mut CUfunction, module: CUmodule, name: *const c_char);
    call cuFuncGetModule(module: *mut CUmodule, f: CUfunction);
    call cuFuncGetName(name: *mut *const c_char, f: CUfunction);
    } };
}
