//! CUDA graphs: stream capture, explicit kernel/empty nodes, instantiation and launch.
//!
//! A captured operation is recorded as a *builder* (see `submit_or_capture`) that makes a fresh
//! stream operation each time the graph is launched; a launch enqueues its nodes in capture order
//! on the launch stream. Nodes of one graph therefore run one after another (kernels never
//! overlap on simgpu anyway). Streams that wait on an event recorded during a capture join it.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering::*};
use std::sync::{Arc, OnceLock};

use super::launch::kernel_op;
use super::{out, stream_ref, submit, Builder, R};
use crate::engine::{EventState, Op, StreamId};
use crate::sim::{sim, Registry};
use crate::types::*;
use crate::{driver, driver_ptds};

pub const NODE_KERNEL: u32 = 0;
pub const NODE_MEMCPY: u32 = 1;
pub const NODE_MEMSET: u32 = 2;
pub const NODE_HOST: u32 = 3;
pub const NODE_EMPTY: u32 = 5;
pub const NODE_WAIT_EVENT: u32 = 6;
pub const NODE_EVENT_RECORD: u32 = 7;
pub const NODE_MEM_FREE: u32 = 11;

/// What `cuGraphKernelNodeGetParams` reports about a kernel node.
#[derive(Clone, Copy)]
pub struct KernelNode {
    pub func: usize,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem: u32,
}

pub struct Node {
    pub node_type: u32,
    pub build: Builder,
    pub kernel: Option<KernelNode>,
    /// Nodes (handles) that must run first.
    pub deps: Mutex<Vec<usize>>,
}

#[derive(Default)]
pub struct Graph {
    /// Node handles, in capture/creation order (a topological order).
    pub nodes: Mutex<Vec<usize>>,
    pub capture_id: AtomicUsize,
}

impl Graph {
    pub fn add(&self, node_type: u32, build: Builder, kernel: Option<KernelNode>) -> usize {
        self.add_after(node_type, build, kernel, Vec::new())
    }

    pub fn add_after(
        &self,
        node_type: u32,
        build: Builder,
        kernel: Option<KernelNode>,
        deps: Vec<usize>,
    ) -> usize {
        let h = nodes().insert(Arc::new(Node {
            node_type,
            build,
            kernel,
            deps: Mutex::new(deps),
        }));
        self.nodes.lock().push(h);
        h
    }

    /// The nodes in an order that respects every dependency (creation order among the ready ones;
    /// captured nodes are created in stream order). Err if the edges form a cycle.
    pub fn ordered(&self) -> Result<Vec<Arc<Node>>, CUresult> {
        let handles = self.nodes.lock().clone();
        let all: Vec<Arc<Node>> = handles.iter().filter_map(|h| nodes().get(*h)).collect();
        let mut done = vec![false; all.len()];
        let mut out = Vec::with_capacity(all.len());
        while out.len() < all.len() {
            let ready = (0..all.len()).find(|&i| {
                !done[i]
                    && all[i]
                        .deps
                        .lock()
                        .iter()
                        .all(|d| handles.iter().position(|h| h == d).is_none_or(|j| done[j]))
            });
            let i = ready.ok_or(CUDA_ERROR_INVALID_VALUE)?;
            done[i] = true;
            out.push(all[i].clone());
        }
        Ok(out)
    }
}

/// Dependencies passed to a `cuGraphAdd*Node` call.
unsafe fn dep_list(deps: *const *mut c_void, n: usize) -> Result<Vec<usize>, CUresult> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if deps.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let v: Vec<usize> = std::slice::from_raw_parts(deps, n)
        .iter()
        .map(|p| *p as usize)
        .collect();
    if v.iter().any(|h| nodes().get(*h).is_none()) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(v)
}

/// `CUDA_MEMSET_NODE_PARAMS`.
#[repr(C)]
pub struct MemsetNodeParams {
    pub dst: CUdeviceptr,
    pub pitch: usize,
    pub value: u32,
    pub element_size: u32,
    pub width: usize,
    pub height: usize,
}

/// `CUDA_HOST_NODE_PARAMS`.
#[repr(C)]
pub struct HostNodeParams {
    pub func: *mut c_void,
    pub user_data: *mut c_void,
}

#[derive(Clone, Copy)]
struct HostCall(usize, usize);
// SAFETY: a function and its argument, given to us to call; never dereferenced by simgpu.
unsafe impl Send for HostCall {}
unsafe impl Sync for HostCall {}

pub struct GraphExec {
    pub nodes: Vec<Arc<Node>>,
}

fn graphs() -> &'static Registry<Graph> {
    static R: OnceLock<Registry<Graph>> = OnceLock::new();
    R.get_or_init(Registry::default)
}
fn nodes() -> &'static Registry<Node> {
    static R: OnceLock<Registry<Node>> = OnceLock::new();
    R.get_or_init(Registry::default)
}
fn execs() -> &'static Registry<GraphExec> {
    static R: OnceLock<Registry<GraphExec>> = OnceLock::new();
    R.get_or_init(Registry::default)
}

/// Streams being captured, and events recorded during a capture (by their state's address).
struct Capture {
    streams: HashMap<StreamId, Arc<Graph>>,
    events: HashMap<usize, Arc<Graph>>,
}
static CAPTURE: Mutex<Option<Capture>> = Mutex::new(None);
/// Number of captures in progress: lets `capturing` skip the lock when there are none.
static ACTIVE: AtomicUsize = AtomicUsize::new(0);
static NEXT_CAPTURE_ID: AtomicUsize = AtomicUsize::new(1);

/// The graph the stream is capturing into, if any.
pub fn capturing(id: StreamId) -> Option<Arc<Graph>> {
    if ACTIVE.load(Acquire) == 0 {
        return None;
    }
    CAPTURE.lock().as_ref()?.streams.get(&id).cloned()
}

fn with_capture<T>(f: impl FnOnce(&mut Capture) -> T) -> T {
    let mut c = CAPTURE.lock();
    f(c.get_or_insert_with(|| Capture {
        streams: HashMap::new(),
        events: HashMap::new(),
    }))
}

/// An event record on a capturing stream: remember it so a waiting stream can join the capture.
pub fn note_event_record(stream: StreamId, ev: &Arc<EventState>) -> bool {
    let Some(g) = capturing(stream) else {
        return false;
    };
    with_capture(|c| c.events.insert(Arc::as_ptr(ev) as usize, g));
    true
}

/// A stream waits on `ev`: if the event was recorded inside a capture, the stream joins it.
pub fn join_if_captured(stream: StreamId, ev: &Arc<EventState>) -> bool {
    if ACTIVE.load(Acquire) == 0 {
        return false;
    }
    with_capture(
        |c| match c.events.get(&(Arc::as_ptr(ev) as usize)).cloned() {
            Some(g) => {
                c.streams.insert(stream, g);
                true
            }
            None => false,
        },
    )
}

unsafe fn begin(h: CUstream, ptds: bool, into: Option<Arc<Graph>>) -> R {
    let r = stream_ref(h, ptds)?;
    if r.legacy {
        return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    if capturing(r.id).is_some() {
        return Err(CUDA_ERROR_INVALID_VALUE); // already capturing (CUDA_ERROR_ILLEGAL_STATE)
    }
    let g = into.unwrap_or_default();
    g.capture_id
        .store(NEXT_CAPTURE_ID.fetch_add(1, Relaxed), Release);
    graphs().insert(g.clone());
    with_capture(|c| c.streams.insert(r.id, g));
    ACTIVE.fetch_add(1, AcqRel);
    Ok(())
}

unsafe fn end(h: CUstream, ptds: bool, out_graph: *mut *mut c_void) -> R {
    let r = stream_ref(h, ptds)?;
    let g = with_capture(|c| {
        let g = c.streams.remove(&r.id)?;
        // Streams that joined this capture stop capturing with it.
        c.streams.retain(|_, x| !Arc::ptr_eq(x, &g));
        c.events.retain(|_, x| !Arc::ptr_eq(x, &g));
        Some(g)
    })
    .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    ACTIVE.fetch_sub(1, AcqRel);
    out(out_graph, Arc::as_ptr(&g) as *mut c_void)
}

unsafe fn capture_info(
    h: CUstream,
    ptds: bool,
    status: *mut u32,
    id: *mut u64,
    graph: *mut *mut c_void,
) -> R {
    let r = stream_ref(h, ptds)?;
    let g = capturing(r.id);
    out(status, g.is_some() as u32)?; // CU_STREAM_CAPTURE_STATUS_NONE / _ACTIVE
    if !id.is_null() {
        *id = g.as_ref().map_or(0, |g| g.capture_id.load(Acquire) as u64);
    }
    if !graph.is_null() {
        *graph = g
            .as_ref()
            .map_or(std::ptr::null_mut(), |g| Arc::as_ptr(g) as *mut c_void);
    }
    Ok(())
}

unsafe fn clear_deps(deps: *mut *const c_void, edges: *mut *const c_void, n: *mut usize) {
    for p in [deps, edges] {
        if !p.is_null() {
            *p = std::ptr::null();
        }
    }
    if !n.is_null() {
        *n = 0;
    }
}

fn graph(h: *mut c_void) -> Result<Arc<Graph>, CUresult> {
    graphs().get(h as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)
}

unsafe fn instantiate(pexec: *mut *mut c_void, g: *mut c_void) -> R {
    let g = graph(g)?;
    let list = g.ordered()?;
    let h = execs().insert(Arc::new(GraphExec { nodes: list }));
    out(pexec, h as *mut c_void)
}

/// `CUDA_KERNEL_NODE_PARAMS` (v1 is the same without the trailing `kern` and `ctx`).
#[repr(C)]
pub struct KernelNodeParams {
    pub func: *mut c_void,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem: u32,
    pub params: *mut *mut c_void,
    pub extra: *mut *mut c_void,
    pub kern: *mut c_void,
    pub ctx: CUcontext,
}

unsafe fn add_kernel_node(
    pn: *mut *mut c_void,
    g: *mut c_void,
    deps: Vec<usize>,
    p: *const KernelNodeParams,
    v2: bool,
) -> R {
    let g = graph(g)?;
    let p = p.as_ref().ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let f = if v2 && p.func.is_null() {
        p.kern
    } else {
        p.func
    };
    let build = kernel_op(f, p.grid, p.block, p.params)?;
    let info = KernelNode {
        func: f as usize,
        grid: p.grid,
        block: p.block,
        shared_mem: p.shared_mem,
    };
    out(
        pn,
        g.add_after(NODE_KERNEL, build, Some(info), deps) as *mut c_void,
    )
}

unsafe fn kernel_node_params(n: *mut c_void, p: *mut KernelNodeParams, v2: bool) -> R {
    let node = nodes().get(n as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let k = node.kernel.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let w = &mut *p;
    w.func = k.func as *mut c_void;
    w.grid = k.grid;
    w.block = k.block;
    w.shared_mem = k.shared_mem;
    w.params = std::ptr::null_mut();
    w.extra = std::ptr::null_mut();
    if v2 {
        w.kern = std::ptr::null_mut();
        w.ctx = std::ptr::null_mut();
    }
    Ok(())
}

unsafe fn add_dependencies(
    g: *mut c_void,
    from: *const *mut c_void,
    to: *const *mut c_void,
    n: usize,
) -> R {
    graph(g)?;
    let (from, to) = (dep_list(from, n)?, dep_list(to, n)?);
    for (f, t) in from.into_iter().zip(to) {
        let node = nodes().get(t).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        node.deps.lock().push(f);
    }
    Ok(())
}

static CAPTURE_MODE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

driver! {
    fn cuThreadExchangeStreamCaptureMode(mode: *mut u32) {
        if mode.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        *mode = CAPTURE_MODE.swap(*mode, Relaxed);
        Ok(())
    }
    fn cuGraphCreate(pg: *mut *mut c_void, _flags: u32) {
        sim()?;
        out(pg, graphs().insert(Arc::default()) as *mut c_void)
    }
    fn cuGraphDestroy(g: *mut c_void) {
        let g = graphs().remove(g as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        for h in g.nodes.lock().drain(..) {
            nodes().remove(h);
        }
        Ok(())
    }
    fn cuGraphGetNodes(g: *mut c_void, list: *mut *mut c_void, n: *mut usize) {
        let g = graph(g)?;
        let v = g.nodes.lock();
        if n.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if !list.is_null() {
            for (i, h) in v.iter().take(*n).enumerate() {
                *list.add(i) = *h as *mut c_void;
            }
        }
        *n = v.len();
        Ok(())
    }
    fn cuGraphNodeGetType(n: *mut c_void, t: *mut u32) {
        out(t, nodes().get(n as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)?.node_type)
    }
    fn cuGraphAddEmptyNode(pn: *mut *mut c_void, g: *mut c_void, deps: *const *mut c_void, n: usize) {
        let g = graph(g)?;
        out(pn, g.add_after(NODE_EMPTY, Arc::new(|| Ok(Op::marker())), None, dep_list(deps, n)?) as *mut c_void)
    }
    fn cuGraphAddKernelNode(pn: *mut *mut c_void, g: *mut c_void, deps: *const *mut c_void, n: usize, p: *const KernelNodeParams) {
        add_kernel_node(pn, g, dep_list(deps, n)?, p, false)
    }
    fn cuGraphAddKernelNode_v2(pn: *mut *mut c_void, g: *mut c_void, deps: *const *mut c_void, n: usize, p: *const KernelNodeParams) {
        add_kernel_node(pn, g, dep_list(deps, n)?, p, true)
    }
    fn cuGraphAddMemcpyNode(pn: *mut *mut c_void, g: *mut c_void, deps: *const *mut c_void, n: usize, p: *const Memcpy3D, _ctx: CUcontext) {
        let s = sim()?;
        let g = graph(g)?;
        let c = super::memory::Copy3D(*p.as_ref().ok_or(CUDA_ERROR_INVALID_VALUE)?);
        super::memory::copy3d_op(s, c)?; // validate now
        let build: Builder = Arc::new(move || super::memory::copy3d_op(s, c));
        out(pn, g.add_after(NODE_MEMCPY, build, None, dep_list(deps, n)?) as *mut c_void)
    }
    fn cuGraphAddMemsetNode(pn: *mut *mut c_void, g: *mut c_void, deps: *const *mut c_void, n: usize, p: *const MemsetNodeParams, _ctx: CUcontext) {
        let s = sim()?;
        let g = graph(g)?;
        let p = p.as_ref().ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let (dst, pitch, value, elem, w, h) = (p.dst, p.pitch as u64, p.value, p.element_size as u64, p.width as u64, p.height as u64);
        if !matches!(elem, 1 | 2 | 4) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        super::memory::memset_op(s, dst, pitch, value, elem, w, h)?;
        let build: Builder = Arc::new(move || super::memory::memset_op(s, dst, pitch, value, elem, w, h));
        out(pn, g.add_after(NODE_MEMSET, build, None, dep_list(deps, n)?) as *mut c_void)
    }
    fn cuGraphAddHostNode(pn: *mut *mut c_void, g: *mut c_void, deps: *const *mut c_void, n: usize, p: *const HostNodeParams) {
        let g = graph(g)?;
        let p = p.as_ref().ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if p.func.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let call = HostCall(p.func as usize, p.user_data as usize);
        let build: Builder = Arc::new(move || {
            Ok(Op::marker().with_effect(move || {
                let call = call;
                // SAFETY: CUhostFn is `void (*)(void *userData)`.
                let f: unsafe extern "C" fn(*mut c_void) = unsafe { std::mem::transmute(call.0) };
                unsafe { f(call.1 as *mut c_void) }
            }))
        });
        out(pn, g.add_after(NODE_HOST, build, None, dep_list(deps, n)?) as *mut c_void)
    }
    fn cuGraphAddDependencies(g: *mut c_void, from: *const *mut c_void, to: *const *mut c_void, n: usize) {
        add_dependencies(g, from, to, n)
    }
    fn cuGraphAddDependencies_v2(g: *mut c_void, from: *const *mut c_void, to: *const *mut c_void, _edges: *const c_void, n: usize) {
        add_dependencies(g, from, to, n)
    }
    fn cuGraphNodeGetDependencies(node: *mut c_void, deps: *mut *mut c_void, n: *mut usize) {
        let node = nodes().get(node as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let d = node.deps.lock();
        if n.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if !deps.is_null() {
            for (i, h) in d.iter().take(*n).enumerate() {
                *deps.add(i) = *h as *mut c_void;
            }
        }
        *n = d.len();
        Ok(())
    }
    fn cuGraphClone(pclone: *mut *mut c_void, g: *mut c_void) {
        let g = graph(g)?;
        let clone: Arc<Graph> = Arc::default();
        let old = g.nodes.lock().clone();
        let mut map = HashMap::new();
        for h in &old {
            let n = nodes().get(*h).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            let deps = n.deps.lock().clone();
            let new = clone.add_after(n.node_type, n.build.clone(), n.kernel, deps);
            map.insert(*h, new);
        }
        // Dependencies point at the clone's own nodes.
        for h in clone.nodes.lock().iter() {
            if let Some(n) = nodes().get(*h) {
                let mut d = n.deps.lock();
                for x in d.iter_mut() {
                    *x = map.get(x).copied().unwrap_or(*x);
                }
            }
        }
        out(pclone, graphs().insert(clone) as *mut c_void)
    }
    fn cuGraphKernelNodeGetParams(n: *mut c_void, p: *mut KernelNodeParams) {
        kernel_node_params(n, p, false)
    }
    fn cuGraphKernelNodeGetParams_v2(n: *mut c_void, p: *mut KernelNodeParams) {
        kernel_node_params(n, p, true)
    }
    fn cuGraphInstantiate(pexec: *mut *mut c_void, g: *mut c_void, _err: *mut *mut c_void, _log: *mut i8, _len: usize) {
        instantiate(pexec, g)
    }
    fn cuGraphInstantiate_v2(pexec: *mut *mut c_void, g: *mut c_void, _err: *mut *mut c_void, _log: *mut i8, _len: usize) {
        instantiate(pexec, g)
    }
    fn cuGraphInstantiateWithFlags(pexec: *mut *mut c_void, g: *mut c_void, _flags: u64) {
        instantiate(pexec, g)
    }
    fn cuGraphExecDestroy(e: *mut c_void) {
        execs().remove(e as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        Ok(())
    }
}

driver_ptds! {
    fn cuStreamBeginCapture / cuStreamBeginCapture_ptsz(h: CUstream) |ptds| {
        begin(h, ptds, None)
    }
    fn cuStreamBeginCapture_v2 / cuStreamBeginCapture_v2_ptsz(h: CUstream, _mode: u32) |ptds| {
        begin(h, ptds, None)
    }
    fn cuStreamBeginCaptureToGraph / cuStreamBeginCaptureToGraph_ptsz(h: CUstream, g: *mut c_void, _deps: *const *mut c_void,
        _edges: *const c_void, _n: usize, _mode: u32) |ptds| {
        begin(h, ptds, Some(graph(g)?))
    }
    fn cuStreamEndCapture / cuStreamEndCapture_ptsz(h: CUstream, g: *mut *mut c_void) |ptds| {
        end(h, ptds, g)
    }
    fn cuStreamIsCapturing / cuStreamIsCapturing_ptsz(h: CUstream, status: *mut u32) |ptds| {
        capture_info(h, ptds, status, std::ptr::null_mut(), std::ptr::null_mut())
    }
    fn cuStreamGetCaptureInfo / cuStreamGetCaptureInfo_ptsz(h: CUstream, status: *mut u32, id: *mut u64) |ptds| {
        capture_info(h, ptds, status, id, std::ptr::null_mut())
    }
    fn cuStreamGetCaptureInfo_v2 / cuStreamGetCaptureInfo_v2_ptsz(h: CUstream, status: *mut u32, id: *mut u64,
        graph: *mut *mut c_void, deps: *mut *const c_void, n: *mut usize) |ptds| {
        capture_info(h, ptds, status, id, graph)?;
        clear_deps(deps, std::ptr::null_mut(), n);
        Ok(())
    }
    fn cuStreamGetCaptureInfo_v3 / cuStreamGetCaptureInfo_v3_ptsz(h: CUstream, status: *mut u32, id: *mut u64,
        graph: *mut *mut c_void, deps: *mut *const c_void, edges: *mut *const c_void, n: *mut usize) |ptds| {
        capture_info(h, ptds, status, id, graph)?;
        clear_deps(deps, edges, n);
        Ok(())
    }
    fn cuStreamUpdateCaptureDependencies / cuStreamUpdateCaptureDependencies_ptsz(h: CUstream, _d: *mut *mut c_void, _n: usize, _f: u32) |ptds| {
        stream_ref(h, ptds).map(|_| ())
    }
    fn cuStreamUpdateCaptureDependencies_v2 / cuStreamUpdateCaptureDependencies_v2_ptsz(h: CUstream, _d: *mut *mut c_void,
        _e: *const c_void, _n: usize, _f: u32) |ptds| {
        stream_ref(h, ptds).map(|_| ())
    }
    fn cuGraphLaunch / cuGraphLaunch_ptsz(e: *mut c_void, h: CUstream) |ptds| {
        let s = sim()?;
        let exec = execs().get(e as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let r = stream_ref(h, ptds)?;
        // One launch call, like cuLaunchKernel (what an interposer counts).
        s.launch_count.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        for n in &exec.nodes {
            submit(s, &r, (n.build)()?);
        }
        Ok(())
    }
    fn cuGraphUpload / cuGraphUpload_ptsz(e: *mut c_void, h: CUstream) |ptds| {
        execs().get(e as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        stream_ref(h, ptds).map(|_| ())
    }
    fn cuGraphInstantiateWithParams / cuGraphInstantiateWithParams_ptsz(pexec: *mut *mut c_void, g: *mut c_void, p: *mut u64) |ptds| {
        let _ = ptds;
        instantiate(pexec, g)?;
        // CUDA_GRAPH_INSTANTIATE_PARAMS: flags, hUploadStream, hErrNode_out, result_out.
        if !p.is_null() {
            *p.add(2) = 0;
            *(p.add(3) as *mut u32) = 0; // CUDA_GRAPH_INSTANTIATE_SUCCESS
        }
        Ok(())
    }
}
