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
use super::memory::{copy3d_op, memset_op, Copy3D};
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
pub const NODE_GRAPH: u32 = 4;
pub const NODE_EVENT_RECORD: u32 = 7;
pub const NODE_MEM_ALLOC: u32 = 10;
pub const NODE_MEM_FREE: u32 = 11;
pub const NODE_CONDITIONAL: u32 = 13;

/// What `cuGraphKernelNodeGetParams` reports about a kernel node.
#[derive(Clone, Copy)]
pub struct KernelNode {
    pub func: usize,
    /// Given as a `CUkernel` (the `kern` field of the v2 parameters) rather than a `CUfunction`.
    pub is_kernel: bool,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem: u32,
}

/// What a node was created with, for the Get/Set functions, clone and update.
#[derive(Clone)]
pub enum Params {
    None,
    Kernel(KernelNode),
    Memcpy(Copy3D),
    /// (dst, pitch, value, element size, width, height)
    Memset(MemsetArgs),
    Host(HostCall),
    /// The allocation (kept alive by the node) and the application's parameter block.
    MemAlloc(Arc<GraphMem>, [u8; MEM_ALLOC_PARAMS_SIZE]),
    MemFree(u64),
    /// The node's own copy of the child graph.
    Child(Arc<Graph>),
    EventRecord(usize),
    EventWait(usize),
    /// Handle, type (IF/WHILE/SWITCH) and the body graphs.
    Conditional(u64, u32, Vec<Arc<Graph>>),
}

pub struct Node {
    pub node_type: u32,
    pub build: Mutex<Builder>,
    pub params: Mutex<Params>,
    /// Nodes (handles) that must run first.
    pub deps: Mutex<Vec<usize>>,
    /// The graph (handle) the node belongs to.
    pub owner: usize,
}

impl Node {
    pub fn kernel(&self) -> Option<KernelNode> {
        match *self.params.lock() {
            Params::Kernel(k) => Some(k),
            _ => None,
        }
    }
}

#[derive(Clone, Copy)]
pub struct MemsetArgs {
    pub dst: u64,
    pub pitch: u64,
    pub value: u32,
    pub elem: u64,
    pub width: u64,
    pub height: u64,
}

/// Memory of a graph allocation node (or a captured cuMemAllocAsync): its address is fixed when
/// the node is made (as with the driver's reserved virtual range, fixed for the graph's lifetime),
/// and its backing stays reserved while a graph or executable graph refers to it (as the driver's
/// graph memory pool keeps physical memory until `cuDeviceGraphMemTrim`). Whether the allocation
/// is *live* follows CUDA's rules: a launch allocates it; a free node, `cuMemFree` or
/// `cuMemFreeAsync` frees it; a launch while it is live is `CUDA_ERROR_INVALID_VALUE` unless the
/// instance was made with `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`.
pub struct GraphMem {
    pub ptr: u64,
}

impl GraphMem {
    fn new(ptr: u64) -> Arc<GraphMem> {
        graph_mems().lock().insert(ptr, MemState::default());
        Arc::new(GraphMem { ptr })
    }
}

/// The host-side state of one graph allocation (changed when launches and frees are issued, as
/// the driver decides whether a launch may allocate again).
#[derive(Default)]
struct MemState {
    /// Allocated by a launch and not freed since.
    live: bool,
    /// Some graph has a free node for it, or the application freed it: when no graph refers to
    /// it any more, its memory goes. Otherwise it outlives its graph, as in CUDA: the application
    /// frees it (`cuMemFree(Async)`, e.g. PyTorch's `cudaMallocAsync` backend freeing a tensor
    /// made during capture after the graph is gone).
    freed_somewhere: bool,
}

fn graph_mems() -> &'static Mutex<HashMap<u64, MemState>> {
    static S: OnceLock<Mutex<HashMap<u64, MemState>>> = OnceLock::new();
    S.get_or_init(Default::default)
}

impl Drop for GraphMem {
    fn drop(&mut self) {
        let st = graph_mems().lock().remove(&self.ptr);
        // A live allocation stays the application's (it frees it); else its memory goes.
        if st.is_some_and(|st| !st.live && st.freed_somewhere) {
            let _ = super::memory::free_device(self.ptr);
        }
    }
}

/// `cuMemFree`/`cuMemFreeAsync` of `ptr`: None if it is not a graph allocation. A live one is
/// freed (its address and backing stay the graph's, for the next launch); freeing one that is not
/// live is `CUDA_ERROR_INVALID_VALUE`, as for any pointer that is not allocated.
pub fn free_graph_alloc(ptr: u64) -> Option<R> {
    let mut t = graph_mems().lock();
    let st = t.get_mut(&ptr)?;
    if !st.live {
        return Some(Err(CUDA_ERROR_INVALID_VALUE));
    }
    st.live = false;
    st.freed_somewhere = true;
    Some(Ok(()))
}

/// A launch of `list` allocates its allocation nodes' memory and frees what its free nodes name:
/// Err (nothing changed) if an allocation is still live from a previous launch and the instance
/// does not free it on launch.
fn launch_allocs(list: &[Arc<ExecNode>], auto_free: bool) -> R {
    let mut allocs = Vec::new();
    let mut frees = Vec::new();
    for n in list.iter().filter(|n| n.enabled.load(Acquire)) {
        match &*n.params.lock() {
            Params::MemAlloc(m, _) => allocs.push(m.ptr),
            Params::MemFree(p) => frees.push(*p),
            _ => {}
        }
    }
    if allocs.is_empty() && frees.is_empty() {
        return Ok(());
    }
    let mut t = graph_mems().lock();
    if !auto_free && allocs.iter().any(|p| t.get(p).is_some_and(|st| st.live)) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    for p in &allocs {
        if let Some(st) = t.get_mut(p) {
            st.live = true;
        }
    }
    for p in &frees {
        if let Some(st) = t.get_mut(p) {
            st.live = false;
        }
    }
    Ok(())
}

/// sizeof(CUDA_MEM_ALLOC_NODE_PARAMS): pool properties, access descriptors, count, size, dptr.
pub const MEM_ALLOC_PARAMS_SIZE: usize = 120;

#[derive(Default)]
pub struct Graph {
    /// Node handles, in capture/creation order (a topological order).
    pub nodes: Mutex<Vec<usize>>,
    pub capture_id: AtomicUsize,
}

impl Graph {
    pub fn add(&self, node_type: u32, build: Builder, params: Params) -> usize {
        self.add_after(node_type, build, params, Vec::new())
    }

    pub fn add_after(
        &self,
        node_type: u32,
        build: Builder,
        params: Params,
        deps: Vec<usize>,
    ) -> usize {
        let h = nodes().insert(Arc::new(Node {
            node_type,
            build: Mutex::new(build),
            params: Mutex::new(params),
            deps: Mutex::new(deps),
            owner: self as *const Graph as usize,
        }));
        self.nodes.lock().push(h);
        h
    }

    /// The nodes in an order that respects every dependency (creation order among the ready ones;
    /// captured nodes are created in stream order). Err if the edges form a cycle.
    pub fn ordered(&self) -> Result<Vec<(usize, Arc<Node>)>, CUresult> {
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
            out.push((handles[i], all[i].clone()));
        }
        Ok(out)
    }

    /// A copy with new node handles (dependencies remapped); conditional bodies and child graphs
    /// are copied too.
    pub fn deep_clone(&self) -> Result<Arc<Graph>, CUresult> {
        let clone: Arc<Graph> = Arc::default();
        let old = self.nodes.lock().clone();
        let mut map = HashMap::new();
        for h in &old {
            let n = nodes().get(*h).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            let params = match n.params.lock().clone() {
                Params::Child(g) => Params::Child(g.deep_clone()?),
                Params::Conditional(c, t, bodies) => Params::Conditional(
                    c,
                    t,
                    bodies
                        .iter()
                        .map(|b| b.deep_clone())
                        .collect::<Result<_, _>>()?,
                ),
                p => p,
            };
            let deps = n.deps.lock().clone();
            let build = n.build.lock().clone();
            let new = clone.add_after(n.node_type, build, params, deps);
            map.insert(*h, new);
        }
        for h in clone.nodes.lock().iter() {
            if let Some(n) = nodes().get(*h) {
                for x in n.deps.lock().iter_mut() {
                    *x = map.get(x).copied().unwrap_or(*x);
                }
            }
        }
        // Registered so its nodes can name it as their owner (child and body graphs too).
        graphs().insert(clone.clone());
        Ok(clone)
    }

    /// Every edge (from, to).
    pub fn edges(&self) -> Vec<(usize, usize)> {
        let mut v = Vec::new();
        for h in self.nodes.lock().iter() {
            if let Some(n) = nodes().get(*h) {
                v.extend(n.deps.lock().iter().map(|d| (*d, *h)));
            }
        }
        v
    }
}

/// Dependencies passed to a `cuGraphAdd*Node` call.
///
/// Safety: when `n > 0`, `deps` is NULL or points to `n` readable node handles.
unsafe fn dep_list(deps: *const *mut c_void, n: usize) -> Result<Vec<usize>, CUresult> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if deps.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: `n > 0` and `deps` is not NULL (checked), so it holds `n` readable handles (this
    // fn's contract); the slice is only read and dropped before returning.
    let v: Vec<usize> = unsafe { std::slice::from_raw_parts(deps, n) }
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

/// `CUgraphEdgeData`: simgpu's edges are all default ones (all zero).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct GraphEdgeData {
    pub from_port: u8,
    pub to_port: u8,
    pub kind: u8,
    pub reserved: [u8; 5],
}

/// `CUgraphExecUpdateResultInfo`.
#[repr(C)]
pub struct GraphExecUpdateResultInfo {
    pub result: u32,
    pub error_node: *mut c_void,
    pub error_from_node: *mut c_void,
}

/// `CUDA_GRAPH_INSTANTIATE_PARAMS`.
#[repr(C)]
pub struct GraphInstantiateParams {
    pub flags: u64,
    pub upload_stream: CUstream,
    pub err_node_out: *mut c_void,
    pub result_out: u32,
}

#[derive(Clone, Copy)]
pub struct HostCall(pub usize, pub usize);
// SAFETY: a function and its argument as addresses, given to us to call from whichever thread
// runs the node (as CUDA does); simgpu never dereferences the argument itself.
unsafe impl Send for HostCall {}
// SAFETY: as for Send: shared access only copies the two addresses.
unsafe impl Sync for HostCall {}

/// A node of an executable graph: its own copy of the operation (exec updates change it, not
/// the graph's node), the graph nodes it was made from, and whether it is enabled.
pub struct ExecNode {
    /// Handles of the graph nodes this node stands for (the instantiated one, then the nodes of
    /// graphs it was updated from).
    pub origin: Mutex<Vec<usize>>,
    pub node_type: u32,
    pub build: Mutex<Builder>,
    pub params: Mutex<Params>,
    pub enabled: std::sync::atomic::AtomicBool,
    /// Positions (in this list) of the nodes it depends on, for topology checks.
    pub deps: Vec<usize>,
    /// Conditional nodes: the instantiated bodies.
    pub bodies: Vec<Vec<Arc<ExecNode>>>,
}

pub struct GraphExec {
    pub nodes: Vec<Arc<ExecNode>>,
    /// CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH: a launch frees what the last one
    /// allocated and the application did not free.
    pub auto_free: bool,
}

/// CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH
const INSTANTIATE_AUTO_FREE_ON_LAUNCH: u64 = 1;

/// Instantiates a graph: nodes in dependency order; child graphs are inlined.
fn flatten(g: &Graph) -> Result<Vec<Arc<ExecNode>>, CUresult> {
    let mut list: Vec<Arc<ExecNode>> = Vec::new();
    for (h, n) in g.ordered()? {
        let params = n.params.lock().clone();
        if let Params::Child(child) = &params {
            list.extend(flatten(child)?);
            continue;
        }
        let bodies = match &params {
            Params::Conditional(_, _, b) => {
                b.iter().map(|g| flatten(g)).collect::<Result<_, _>>()?
            }
            _ => Vec::new(),
        };
        let deps = n
            .deps
            .lock()
            .iter()
            .filter_map(|d| list.iter().position(|e| e.origin.lock().contains(d)))
            .collect();
        list.push(Arc::new(ExecNode {
            origin: Mutex::new(vec![h]),
            node_type: n.node_type,
            build: Mutex::new(n.build.lock().clone()),
            params: Mutex::new(params),
            enabled: std::sync::atomic::AtomicBool::new(true),
            deps,
            bodies,
        }));
    }
    Ok(list)
}

/// Enqueues the enabled nodes of `list` on `r`; a conditional node runs the body its handle's
/// value selects. Kernels do not compute on simgpu, so a value is never changed by the device:
/// it is the handle's default, and a WHILE body with a non-zero value runs once.
fn enqueue(s: &'static crate::sim::Sim, r: &super::StreamRef, list: &[Arc<ExecNode>]) -> R {
    for n in list {
        if !n.enabled.load(Acquire) {
            continue;
        }
        if let Params::Conditional(handle, kind, _) = *n.params.lock() {
            let v = cond_value(handle);
            let body = match kind {
                COND_IF if v != 0 => n.bodies.first(),
                COND_IF => n.bodies.get(1),
                COND_WHILE if v != 0 => n.bodies.first(),
                COND_SWITCH => n.bodies.get(v as usize),
                _ => None,
            };
            if let Some(b) = body {
                enqueue(s, r, b)?;
            }
            continue;
        }
        let build = n.build.lock().clone();
        submit(s, r, build()?);
    }
    Ok(())
}

const COND_IF: u32 = 0;
const COND_WHILE: u32 = 1;
const COND_SWITCH: u32 = 2;

/// Conditional handles: (default launch value, flags).
fn conds() -> &'static Mutex<HashMap<u64, (u32, u32)>> {
    static C: OnceLock<Mutex<HashMap<u64, (u32, u32)>>> = OnceLock::new();
    C.get_or_init(Default::default)
}
fn cond_value(h: u64) -> u32 {
    conds().lock().get(&h).map_or(0, |c| c.0)
}

/// The node of `exec` made from graph node `node`.
fn exec_node(exec: *mut c_void, node: *mut c_void) -> Result<Arc<ExecNode>, CUresult> {
    let e = execs()
        .get(exec as usize)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    fn find(list: &[Arc<ExecNode>], h: usize) -> Option<Arc<ExecNode>> {
        list.iter().find_map(|n| {
            if n.origin.lock().contains(&h) {
                Some(n.clone())
            } else {
                n.bodies.iter().find_map(|b| find(b, h))
            }
        })
    }
    find(&e.nodes, node as usize).ok_or(CUDA_ERROR_INVALID_VALUE)
}

/// Checks that `new` has the topology and node types of `old` (cuGraphExecUpdate's rules),
/// as a CUgraphExecUpdateResult and the offending node of the new graph.
fn same_shape(old: &[Arc<ExecNode>], new: &[Arc<ExecNode>]) -> Result<(), (u32, usize)> {
    const TOPOLOGY_CHANGED: u32 = 2;
    const NODE_TYPE_CHANGED: u32 = 3;
    const PARAMETERS_CHANGED: u32 = 5;
    if old.len() != new.len() {
        let at = new
            .get(old.len())
            .or(new.last())
            .map_or(0, |n| n.origin.lock()[0]);
        return Err((TOPOLOGY_CHANGED, at));
    }
    for (a, b) in old.iter().zip(new) {
        let at = b.origin.lock()[0];
        if a.node_type != b.node_type {
            return Err((NODE_TYPE_CHANGED, at));
        }
        if a.deps != b.deps || a.bodies.len() != b.bodies.len() {
            return Err((TOPOLOGY_CHANGED, at));
        }
        match (&*a.params.lock(), &*b.params.lock()) {
            // An allocation node cannot change; a free node must free the same pointer.
            (Params::MemAlloc(x, _), Params::MemAlloc(y, _)) if x.ptr != y.ptr => {
                return Err((PARAMETERS_CHANGED, at))
            }
            (Params::MemFree(x), Params::MemFree(y)) if x != y => {
                return Err((PARAMETERS_CHANGED, at))
            }
            (Params::Conditional(_, x, _), Params::Conditional(_, y, _)) if x != y => {
                return Err((PARAMETERS_CHANGED, at))
            }
            _ => {}
        }
        for (x, y) in a.bodies.iter().zip(&b.bodies) {
            same_shape(x, y)?;
        }
    }
    Ok(())
}

/// Takes the operations of `new` into `old` (same shape), remembering the new graph's nodes.
fn take_update(old: &[Arc<ExecNode>], new: &[Arc<ExecNode>]) {
    for (a, b) in old.iter().zip(new) {
        *a.build.lock() = b.build.lock().clone();
        *a.params.lock() = b.params.lock().clone();
        let origin = b.origin.lock().clone();
        a.origin.lock().extend(origin);
        for (x, y) in a.bodies.iter().zip(&b.bodies) {
            take_update(x, y);
        }
    }
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
    /// Streams whose capture goes into the application's graph (cuStreamBeginCaptureToGraph).
    into_user_graph: std::collections::HashSet<StreamId>,
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
        into_user_graph: Default::default(),
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
    let user = into.is_some();
    let g = into.unwrap_or_default();
    g.capture_id
        .store(NEXT_CAPTURE_ID.fetch_add(1, Relaxed), Release);
    graphs().insert(g.clone());
    with_capture(|c| {
        c.streams.insert(r.id, g);
        if user {
            c.into_user_graph.insert(r.id);
        }
    });
    ACTIVE.fetch_add(1, AcqRel);
    Ok(())
}

/// Safety: `out_graph` is NULL or writable (cuStreamEndCapture's out-argument). NULL is accepted
/// when the capture went into the application's own graph (cuStreamBeginCaptureToGraph), which
/// it already holds; a capture into a new graph needs somewhere to return it.
unsafe fn end(h: CUstream, ptds: bool, out_graph: *mut *mut c_void) -> R {
    let r = stream_ref(h, ptds)?;
    let (g, user) = with_capture(|c| {
        let g = c.streams.remove(&r.id)?;
        // Streams that joined this capture stop capturing with it.
        c.streams.retain(|_, x| !Arc::ptr_eq(x, &g));
        c.events.retain(|_, x| !Arc::ptr_eq(x, &g));
        Some((g, c.into_user_graph.remove(&r.id)))
    })
    .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    ACTIVE.fetch_sub(1, AcqRel);
    if user && out_graph.is_null() {
        return Ok(());
    }
    // SAFETY: `out_graph` is NULL or writable (this fn's contract).
    unsafe { out(out_graph, Arc::as_ptr(&g) as *mut c_void) }
}

/// Safety: `status`, `id` and `graph` are NULL or writable (cuStreamGetCaptureInfo's
/// out-arguments).
unsafe fn capture_info(
    h: CUstream,
    ptds: bool,
    status: *mut u32,
    id: *mut u64,
    graph: *mut *mut c_void,
) -> R {
    let r = stream_ref(h, ptds)?;
    let g = capturing(r.id);
    // SAFETY: each out-pointer is NULL or writable (this fn's contract), and the optional ones
    // are written only when not NULL.
    unsafe {
        out(status, g.is_some() as u32)?; // CU_STREAM_CAPTURE_STATUS_NONE / _ACTIVE
        if !id.is_null() {
            *id = g.as_ref().map_or(0, |g| g.capture_id.load(Acquire) as u64);
        }
        if !graph.is_null() {
            *graph = g
                .as_ref()
                .map_or(std::ptr::null_mut(), |g| Arc::as_ptr(g) as *mut c_void);
        }
    }
    Ok(())
}

/// Safety: `deps`, `edges` and `n` are NULL or writable.
unsafe fn clear_deps(
    deps: *mut *const *mut c_void,
    edges: *mut *const GraphEdgeData,
    n: *mut usize,
) {
    // SAFETY: each pointer is written only when not NULL, and then it is writable (this fn's
    // contract).
    unsafe {
        if !deps.is_null() {
            *deps = std::ptr::null();
        }
        if !edges.is_null() {
            *edges = std::ptr::null();
        }
        if !n.is_null() {
            *n = 0;
        }
    }
}

fn graph(h: *mut c_void) -> Result<Arc<Graph>, CUresult> {
    graphs().get(h as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)
}

/// Safety: `pexec` is NULL or writable (cuGraphInstantiate's out-argument).
unsafe fn instantiate(pexec: *mut *mut c_void, g: *mut c_void, flags: u64) -> R {
    let g = graph(g)?;
    let list = flatten(&g)?;
    let h = execs().insert(Arc::new(GraphExec {
        nodes: list,
        auto_free: flags & INSTANTIATE_AUTO_FREE_ON_LAUNCH != 0,
    }));
    // SAFETY: `pexec` is NULL or writable (this fn's contract).
    unsafe { out(pexec, h as *mut c_void) }
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

/// Copies the application's CUDA_KERNEL_NODE_PARAMS (`_v2` when `v2`; v1 lacks the trailing
/// `kern` and `ctx`, which then read as NULL). Field by field through the raw pointer, so that no
/// reference ever spans the 16 bytes a v1 struct does not have.
///
/// Safety: `p` is NULL or points to a readable struct of that version.
unsafe fn read_kernel_params(
    p: *const KernelNodeParams,
    v2: bool,
) -> Result<KernelNodeParams, CUresult> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: `p` is not NULL (checked) and readable for its version (this fn's contract); the
    // v2-only fields are read only when `v2`.
    unsafe {
        Ok(KernelNodeParams {
            func: (*p).func,
            grid: (*p).grid,
            block: (*p).block,
            shared_mem: (*p).shared_mem,
            params: (*p).params,
            extra: (*p).extra,
            kern: if v2 { (*p).kern } else { std::ptr::null_mut() },
            ctx: if v2 { (*p).ctx } else { std::ptr::null_mut() },
        })
    }
}

/// Safety: `pn` is NULL or writable; `p` is NULL or a readable CUDA_KERNEL_NODE_PARAMS (`_v2`
/// when `v2`) whose `kernelParams` follows the cuLaunchKernel contract.
unsafe fn add_kernel_node(
    pn: *mut *mut c_void,
    g: *mut c_void,
    deps: Vec<usize>,
    p: *const KernelNodeParams,
    v2: bool,
) -> R {
    let g = graph(g)?;
    // SAFETY: `p` is as `kernel_params` requires (this fn's contract).
    let (build, params) = unsafe { kernel_params(p, v2)? };
    let node = g.add_after(NODE_KERNEL, build, params, deps);
    // SAFETY: `pn` is NULL or writable (this fn's contract).
    unsafe { out(pn, node as *mut c_void) }
}

/// The builder and recorded parameters of a kernel node from `CUDA_KERNEL_NODE_PARAMS(_v2)`.
///
/// Safety: `p` is NULL or a readable CUDA_KERNEL_NODE_PARAMS (`_v2` when `v2`) whose
/// `kernelParams` follows the cuLaunchKernel contract.
unsafe fn kernel_params(
    p: *const KernelNodeParams,
    v2: bool,
) -> Result<(Builder, Params), CUresult> {
    // SAFETY: `p` is NULL or a readable struct of its version (this fn's contract).
    let p = unsafe { read_kernel_params(p, v2)? };
    let f = if v2 && p.func.is_null() {
        p.kern
    } else {
        p.func
    };
    // SAFETY: `p.params` is the node's kernelParams array (this fn's contract).
    let build = unsafe { kernel_op(f, p.grid, p.block, p.params)? };
    let info = KernelNode {
        func: f as usize,
        is_kernel: v2 && p.func.is_null(),
        grid: p.grid,
        block: p.block,
        shared_mem: p.shared_mem,
    };
    Ok((build, Params::Kernel(info)))
}

fn memcpy_params(p: *const Memcpy3D) -> Result<(Builder, Params), CUresult> {
    let s = sim()?;
    // SAFETY: the caller's CUDA_MEMCPY3D (checked for NULL).
    let c = Copy3D(*unsafe { p.as_ref() }.ok_or(CUDA_ERROR_INVALID_VALUE)?);
    copy3d_op(s, c)?; // validate now
    Ok((Arc::new(move || copy3d_op(s, c)), Params::Memcpy(c)))
}

fn memset_params(p: *const MemsetNodeParams) -> Result<(Builder, Params), CUresult> {
    let s = sim()?;
    // SAFETY: the caller's CUDA_MEMSET_NODE_PARAMS (checked for NULL).
    let p = unsafe { p.as_ref() }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let a = MemsetArgs {
        dst: p.dst,
        pitch: p.pitch as u64,
        value: p.value,
        elem: p.element_size as u64,
        width: p.width as u64,
        height: p.height as u64,
    };
    if !matches!(a.elem, 1 | 2 | 4) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let op = move || memset_op(s, a.dst, a.pitch, a.value, a.elem, a.width, a.height);
    op()?;
    Ok((Arc::new(op), Params::Memset(a)))
}

fn host_params(p: *const HostNodeParams) -> Result<(Builder, Params), CUresult> {
    // SAFETY: the caller's CUDA_HOST_NODE_PARAMS (checked for NULL).
    let p = unsafe { p.as_ref() }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if p.func.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let call = HostCall(p.func as usize, p.user_data as usize);
    let build: Builder = Arc::new(move || {
        Ok(Op::marker().with_effect(move || {
            let call = call;
            // SAFETY: `call.0` is the application's non-NULL (checked) CUhostFn, `void (*)(void
            // *userData)`, called with its userData as CUDA would; the application keeps both
            // valid while the graph can run.
            unsafe {
                let f: unsafe extern "C" fn(*mut c_void) = std::mem::transmute(call.0);
                f(call.1 as *mut c_void)
            }
        }))
    });
    Ok((build, Params::Host(call)))
}

fn event_params(ev: *mut c_void, record: bool) -> Result<(Builder, Params), CUresult> {
    let s = sim()?;
    let e = s.events.get(ev as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let state = e.state.clone();
    if record {
        let build: Builder = Arc::new(move || {
            let mut op = Op::marker();
            op.event = Some(state.clone());
            Ok(op)
        });
        return Ok((build, Params::EventRecord(ev as usize)));
    }
    // A wait orders after the event's most recent record at the time the graph is launched.
    let build: Builder = Arc::new(move || {
        let rec = *state.inner.lock();
        let mut op = Op::marker();
        if rec.recorded {
            op.deps.push((rec.stream, rec.seq));
        }
        Ok(op)
    });
    Ok((build, Params::EventWait(ev as usize)))
}

/// A graph allocation of `size` bytes on the device of `params` (CUDA_MEM_ALLOC_NODE_PARAMS); its
/// address is written back to `dptr`. Safety: a non-NULL `p` points to the application's
/// CUDA_MEM_ALLOC_NODE_PARAMS (MEM_ALLOC_PARAMS_SIZE bytes, pool properties first).
unsafe fn mem_alloc_params(p: *mut u8) -> Result<(Builder, Params, u64), CUresult> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: `p` is not NULL (checked) and points to MEM_ALLOC_PARAMS_SIZE readable bytes of a
    // CUDA_MEM_ALLOC_NODE_PARAMS (this fn's contract): pool properties at 0, `bytesize` at 104.
    let (props, size) = unsafe { (&*(p as *const MemPoolProps), *(p.add(104) as *const usize)) };
    if size == 0 || props.location.kind != CU_MEM_LOCATION_TYPE_DEVICE {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let dev = sim()?.device(props.location.id)?;
    let ctx = super::current_ctx()?;
    let ptr = super::memory::alloc_on(dev, Arc::as_ptr(&ctx) as usize, size as u64, 0)?;
    let mut bytes = [0u8; MEM_ALLOC_PARAMS_SIZE];
    // SAFETY: as above: `dptr` at 112 is the struct's writable out-field, and the whole struct
    // (MEM_ALLOC_PARAMS_SIZE bytes) is readable; `bytes` is a distinct local buffer. `props` is
    // not used past this point, so the write does not alias a live reference.
    unsafe {
        *(p.add(112) as *mut u64) = ptr;
        std::ptr::copy_nonoverlapping(p, bytes.as_mut_ptr(), MEM_ALLOC_PARAMS_SIZE);
    }
    let mem = GraphMem::new(ptr);
    let keep = mem.clone();
    let build: Builder = Arc::new(move || {
        let _ = &keep;
        Ok(Op::marker())
    });
    Ok((build, Params::MemAlloc(mem, bytes), ptr))
}

/// A cuMemAllocAsync captured into `g`: an allocation node that owns `ptr`.
pub fn add_captured_alloc(g: &Graph, ptr: u64, size: usize, dev: usize) {
    let mut bytes = [0u8; MEM_ALLOC_PARAMS_SIZE];
    // CUDA_MEM_ALLOC_NODE_PARAMS: pinned allocation on the device; bytesize at 104, dptr at 112.
    bytes[0] = 1; // CU_MEM_ALLOCATION_TYPE_PINNED
    bytes[8] = CU_MEM_LOCATION_TYPE_DEVICE as u8;
    bytes[12..16].copy_from_slice(&(dev as i32).to_ne_bytes());
    bytes[104..112].copy_from_slice(&(size as u64).to_ne_bytes());
    bytes[112..120].copy_from_slice(&ptr.to_ne_bytes());
    let mem = GraphMem::new(ptr);
    let keep = mem.clone();
    let build: Builder = Arc::new(move || {
        let _ = &keep;
        Ok(Op::marker())
    });
    g.add(NODE_MEM_ALLOC, build, Params::MemAlloc(mem, bytes));
}

/// A cuMemFreeAsync captured into `g`.
pub fn add_captured_free(g: &Graph, ptr: u64) {
    let (b, p) = mem_free_params(ptr);
    g.add(NODE_MEM_FREE, b, p);
}

fn mem_free_params(ptr: u64) -> (Builder, Params) {
    if let Some(st) = graph_mems().lock().get_mut(&ptr) {
        st.freed_somewhere = true;
    }
    (Arc::new(|| Ok(Op::marker())), Params::MemFree(ptr))
}

/// A node from `CUgraphNodeParams` (`cuGraphAddNode`): the type at offset 0, its parameters at 16.
/// Safety: a non-NULL `p` points to the application's CUgraphNodeParams (256 bytes), whose union
/// holds the parameters of the type it names.
unsafe fn generic_params(g: &Arc<Graph>, p: *mut u8) -> Result<(u32, Builder, Params), CUresult> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: every access below stays inside the application's 256-byte CUgraphNodeParams at
    // `p` (not NULL, checked; this fn's contract): the type at 0, the union at 16, each member
    // read at its documented offset only for the type `kind` names, which is what the union holds.
    unsafe {
        let kind = *(p as *const u32);
        let u = p.add(16);
        let (b, params) = match kind {
            NODE_KERNEL => kernel_params(u as *const KernelNodeParams, true)?,
            // CUDA_MEMCPY_NODE_PARAMS: flags, reserved, copyCtx, then the CUDA_MEMCPY3D.
            NODE_MEMCPY => memcpy_params(u.add(16) as *const Memcpy3D)?,
            NODE_MEMSET => memset_params(u as *const MemsetNodeParams)?,
            NODE_HOST => host_params(u as *const HostNodeParams)?,
            NODE_EMPTY => (Arc::new(|| Ok(Op::marker())) as Builder, Params::None),
            NODE_GRAPH => {
                let child = graph(*(u as *const *mut c_void))?;
                (
                    Arc::new(|| Ok(Op::marker())) as Builder,
                    Params::Child(child.deep_clone()?),
                )
            }
            NODE_WAIT_EVENT => event_params(*(u as *const *mut c_void), false)?,
            NODE_EVENT_RECORD => event_params(*(u as *const *mut c_void), true)?,
            NODE_MEM_ALLOC => {
                let (b, params, _) = mem_alloc_params(u)?;
                (b, params)
            }
            NODE_MEM_FREE => mem_free_params(*(u as *const u64)),
            NODE_CONDITIONAL => {
                // CUDA_CONDITIONAL_NODE_PARAMS: handle, type, size, phGraph_out, ctx.
                let (handle, ty, size) = (
                    *(u as *const u64),
                    *(u.add(8) as *const u32),
                    *(u.add(12) as *const u32),
                );
                if !conds().lock().contains_key(&handle) {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                let ok = match ty {
                    COND_IF => matches!(size, 1 | 2),
                    COND_WHILE => size == 1,
                    COND_SWITCH => size > 0,
                    _ => false,
                };
                if !ok {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                let bodies: Vec<Arc<Graph>> = (0..size)
                    .map(|_| {
                        let b: Arc<Graph> = Arc::default();
                        graphs().insert(b.clone());
                        b
                    })
                    .collect();
                // The CUDA-owned array of body graphs lives as long as the node (kept below).
                let arr: Box<[*mut c_void]> = bodies
                    .iter()
                    .map(|b| Arc::as_ptr(b) as *mut c_void)
                    .collect();
                *(u.add(16) as *mut *mut c_void) = arr.as_ptr() as *mut c_void;
                let arr = SendBox(arr);
                let build: Builder = Arc::new(move || {
                    let _ = &arr;
                    Ok(Op::marker())
                });
                (build, Params::Conditional(handle, ty, bodies))
            }
            _ => return Err(CUDA_ERROR_NOT_SUPPORTED),
        };
        let _ = g;
        Ok((kind, b, params))
    }
}

/// The array of body-graph handles a conditional node hands out.
struct SendBox(#[allow(dead_code)] Box<[*mut c_void]>);
// SAFETY: graph handles (addresses of registry entries), never dereferenced through this box;
// the box only keeps the array alive, from any thread.
unsafe impl Send for SendBox {}
// SAFETY: as for Send: nothing reads through a shared SendBox.
unsafe impl Sync for SendBox {}

fn node(h: *mut c_void) -> Result<Arc<Node>, CUresult> {
    nodes().get(h as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)
}

/// Replaces a graph node's parameters (the type must match).
fn set_node(h: *mut c_void, node_type: u32, (b, p): (Builder, Params)) -> R {
    let n = node(h)?;
    if n.node_type != node_type {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    *n.build.lock() = b;
    *n.params.lock() = p;
    Ok(())
}

/// Replaces the parameters of an executable graph's node (the type must match).
fn set_exec_node(e: *mut c_void, h: *mut c_void, node_type: u32, (b, p): (Builder, Params)) -> R {
    let n = exec_node(e, h)?;
    if n.node_type != node_type {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    *n.build.lock() = b;
    *n.params.lock() = p;
    Ok(())
}

/// Writes a node list the way the Get functions do: the count when `list` is NULL, else up to
/// `*n` handles (and zeroed edge data), NULL-padded, and the count.
///
/// Safety: `n` is NULL or readable and writable; a non-NULL `list` (and `edges`) has room for
/// `*n` entries (the Get functions' contract).
unsafe fn write_nodes(
    v: &[usize],
    list: *mut *mut c_void,
    edges: *mut GraphEdgeData,
    n: *mut usize,
) -> R {
    if n.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: `n` is not NULL (checked); `list`/`edges` are written only when not NULL and only
    // at indices below the capacity `*n` the caller gave (this fn's contract).
    unsafe {
        if !list.is_null() {
            for i in 0..*n {
                *list.add(i) = v.get(i).map_or(std::ptr::null_mut(), |h| *h as *mut c_void);
                if !edges.is_null() {
                    *edges.add(i) = GraphEdgeData::default();
                }
            }
        }
        *n = v.len();
    }
    Ok(())
}

/// Safety: `n` is NULL or readable and writable; non-NULL `from`, `to` (and `edata`) have room
/// for `*n` entries (cuGraphGetEdges' contract).
unsafe fn get_edges(
    g: *mut c_void,
    from: *mut *mut c_void,
    to: *mut *mut c_void,
    edata: *mut GraphEdgeData,
    n: *mut usize,
) -> R {
    let e = graph(g)?.edges();
    if n.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: `n` is not NULL (checked); the arrays are written only when not NULL and only at
    // indices below the capacity `*n` the caller gave (this fn's contract).
    unsafe {
        if !from.is_null() && !to.is_null() {
            for i in 0..*n {
                let (f, t) = e.get(i).copied().unwrap_or((0, 0));
                *from.add(i) = f as *mut c_void;
                *to.add(i) = t as *mut c_void;
                if !edata.is_null() {
                    *edata.add(i) = GraphEdgeData::default();
                }
            }
        }
        *n = e.len();
    }
    Ok(())
}

fn dependents(h: *mut c_void) -> Result<Vec<usize>, CUresult> {
    let n = node(h)?;
    let g = graphs().get(n.owner).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    Ok(g.edges()
        .into_iter()
        .filter(|(f, _)| *f == h as usize)
        .map(|(_, t)| t)
        .collect())
}

/// Safety: `pn` is NULL or writable; `deps` as for `dep_list`; `p` as for `generic_params`
/// (cuGraphAddNode's contract).
unsafe fn add_node(
    pn: *mut *mut c_void,
    g: *mut c_void,
    deps: *const *mut c_void,
    n: usize,
    p: *mut u8,
) -> R {
    let g = graph(g)?;
    // SAFETY: the arguments are passed on under the contracts this fn requires of its caller.
    unsafe {
        let deps = dep_list(deps, n)?;
        let (kind, b, params) = generic_params(&g, p)?;
        out(pn, g.add_after(kind, b, params, deps) as *mut c_void)
    }
}

/// A driver result as `R`.
trait IntoR {
    fn result(self) -> R;
}
impl IntoR for CUresult {
    fn result(self) -> R {
        if self == CUDA_SUCCESS {
            Ok(())
        } else {
            Err(self)
        }
    }
}

fn exec_update(e: *mut c_void, g: *mut c_void) -> Result<(), (CUresult, u32, usize)> {
    let exec = execs()
        .get(e as usize)
        .ok_or((CUDA_ERROR_INVALID_HANDLE, 1, 0))?;
    let g = graph(g).map_err(|r| (r, 1, 0))?;
    let new = flatten(&g).map_err(|r| (r, 1, 0))?;
    same_shape(&exec.nodes, &new)
        .map_err(|(why, at)| (CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, why, at))?;
    take_update(&exec.nodes, &new);
    Ok(())
}

/// Safety: `p` is NULL or points to a writable CUDA_KERNEL_NODE_PARAMS (`_v2` when `v2`; v1 is
/// 16 bytes shorter).
unsafe fn kernel_node_params(n: *mut c_void, p: *mut KernelNodeParams, v2: bool) -> R {
    let node = nodes().get(n as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let k = node.kernel().ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: `p` is not NULL (checked) and writable for its version (this fn's contract). Fields
    // are written through the raw pointer (no `&mut` spanning a v1 struct's missing tail), and
    // the v2-only `kern`/`ctx` only when `v2`.
    unsafe {
        (*p).func = if v2 && k.is_kernel {
            std::ptr::null_mut()
        } else {
            k.func as *mut c_void
        };
        (*p).grid = k.grid;
        (*p).block = k.block;
        (*p).shared_mem = k.shared_mem;
        (*p).params = std::ptr::null_mut();
        (*p).extra = std::ptr::null_mut();
        if v2 {
            (*p).kern = if k.is_kernel {
                k.func as *mut c_void
            } else {
                std::ptr::null_mut()
            };
            (*p).ctx = std::ptr::null_mut();
        }
    }
    Ok(())
}

/// Safety: `from` and `to` as for `dep_list` (each NULL or `n` readable handles).
unsafe fn add_dependencies(
    g: *mut c_void,
    from: *const *mut c_void,
    to: *const *mut c_void,
    n: usize,
) -> R {
    graph(g)?;
    // SAFETY: `from` and `to` meet `dep_list`'s contract (this fn's contract).
    let (from, to) = unsafe { (dep_list(from, n)?, dep_list(to, n)?) };
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
        out(pn, g.add_after(NODE_EMPTY, Arc::new(|| Ok(Op::marker())), Params::None, dep_list(deps, n)?) as *mut c_void)
    }
    fn cuGraphAddKernelNode(pn: *mut *mut c_void, g: *mut c_void, deps: *const *mut c_void, n: usize, p: *const KernelNodeParams) {
        add_kernel_node(pn, g, dep_list(deps, n)?, p, false)
    }
    fn cuGraphAddKernelNode_v2(pn: *mut *mut c_void, g: *mut c_void, deps: *const *mut c_void, n: usize, p: *const KernelNodeParams) {
        add_kernel_node(pn, g, dep_list(deps, n)?, p, true)
    }
    fn cuGraphAddMemcpyNode(pn: *mut *mut c_void, g: *mut c_void, deps: *const *mut c_void, n: usize, p: *const Memcpy3D, _ctx: CUcontext) {
        let g = graph(g)?;
        let (b, params) = memcpy_params(p)?;
        out(pn, g.add_after(NODE_MEMCPY, b, params, dep_list(deps, n)?) as *mut c_void)
    }
    fn cuGraphAddMemsetNode(pn: *mut *mut c_void, g: *mut c_void, deps: *const *mut c_void, n: usize, p: *const MemsetNodeParams, _ctx: CUcontext) {
        let g = graph(g)?;
        let (b, params) = memset_params(p)?;
        out(pn, g.add_after(NODE_MEMSET, b, params, dep_list(deps, n)?) as *mut c_void)
    }
    fn cuGraphAddHostNode(pn: *mut *mut c_void, g: *mut c_void, deps: *const *mut c_void, n: usize, p: *const HostNodeParams) {
        let g = graph(g)?;
        let (b, params) = host_params(p)?;
        out(pn, g.add_after(NODE_HOST, b, params, dep_list(deps, n)?) as *mut c_void)
    }
    fn cuGraphAddDependencies(g: *mut c_void, from: *const *mut c_void, to: *const *mut c_void, n: usize) {
        add_dependencies(g, from, to, n)
    }
    fn cuGraphAddDependencies_v2(g: *mut c_void, from: *const *mut c_void, to: *const *mut c_void, _edges: *const c_void, n: usize) {
        add_dependencies(g, from, to, n)
    }
    fn cuGraphNodeGetDependencies(h: *mut c_void, deps: *mut *mut c_void, n: *mut usize) {
        let d = node(h)?.deps.lock().clone();
        write_nodes(&d, deps, std::ptr::null_mut(), n)
    }
    fn cuGraphNodeGetDependencies_v2(h: *mut c_void, deps: *mut *mut c_void, edges: *mut GraphEdgeData, n: *mut usize) {
        let d = node(h)?.deps.lock().clone();
        write_nodes(&d, deps, edges, n)
    }
    fn cuGraphNodeGetDependentNodes(h: *mut c_void, list: *mut *mut c_void, n: *mut usize) {
        write_nodes(&dependents(h)?, list, std::ptr::null_mut(), n)
    }
    fn cuGraphNodeGetDependentNodes_v2(h: *mut c_void, list: *mut *mut c_void, edges: *mut GraphEdgeData, n: *mut usize) {
        write_nodes(&dependents(h)?, list, edges, n)
    }
    fn cuGraphGetEdges(g: *mut c_void, from: *mut *mut c_void, to: *mut *mut c_void, n: *mut usize) {
        get_edges(g, from, to, std::ptr::null_mut(), n)
    }
    fn cuGraphGetEdges_v2(g: *mut c_void, from: *mut *mut c_void, to: *mut *mut c_void, edata: *mut GraphEdgeData, n: *mut usize) {
        get_edges(g, from, to, edata, n)
    }
    fn cuGraphGetRootNodes(g: *mut c_void, list: *mut *mut c_void, n: *mut usize) {
        let g = graph(g)?;
        let roots: Vec<usize> = g.nodes.lock().iter().copied()
            .filter(|h| nodes().get(*h).is_some_and(|x| x.deps.lock().is_empty())).collect();
        write_nodes(&roots, list, std::ptr::null_mut(), n)
    }
    fn cuGraphDestroyNode(h: *mut c_void) {
        let n = nodes().remove(h as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if let Some(g) = graphs().get(n.owner) {
            g.nodes.lock().retain(|x| *x != h as usize);
            for other in g.nodes.lock().iter().filter_map(|x| nodes().get(*x)) {
                other.deps.lock().retain(|d| *d != h as usize);
            }
        }
        Ok(())
    }
    fn cuGraphRemoveDependencies(g: *mut c_void, from: *const *mut c_void, to: *const *mut c_void, n: usize) {
        graph(g)?;
        let (from, to) = (dep_list(from, n)?, dep_list(to, n)?);
        for (f, t) in from.into_iter().zip(to) {
            let node = nodes().get(t).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            let mut d = node.deps.lock();
            let i = d.iter().position(|x| *x == f).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            d.remove(i);
        }
        Ok(())
    }
    fn cuGraphRemoveDependencies_v2(g: *mut c_void, from: *const *mut c_void, to: *const *mut c_void, _e: *const c_void, n: usize) {
        cuGraphRemoveDependencies(g, from, to, n).result()
    }
    fn cuGraphClone(pclone: *mut *mut c_void, g: *mut c_void) {
        let clone = graph(g)?.deep_clone()?;
        out(pclone, Arc::as_ptr(&clone) as *mut c_void)
    }
    fn cuGraphKernelNodeGetParams(n: *mut c_void, p: *mut KernelNodeParams) {
        kernel_node_params(n, p, false)
    }
    fn cuGraphKernelNodeGetParams_v2(n: *mut c_void, p: *mut KernelNodeParams) {
        kernel_node_params(n, p, true)
    }
    fn cuGraphInstantiate(pexec: *mut *mut c_void, g: *mut c_void, _err: *mut *mut c_void, _log: *mut i8, _len: usize) {
        instantiate(pexec, g, 0)
    }
    fn cuGraphInstantiate_v2(pexec: *mut *mut c_void, g: *mut c_void, _err: *mut *mut c_void, _log: *mut i8, _len: usize) {
        instantiate(pexec, g, 0)
    }
    fn cuGraphInstantiateWithFlags(pexec: *mut *mut c_void, g: *mut c_void, flags: u64) {
        instantiate(pexec, g, flags)
    }
    fn cuGraphKernelNodeSetParams(n: *mut c_void, p: *const KernelNodeParams) {
        set_node(n, NODE_KERNEL, kernel_params(p, false)?)
    }
    fn cuGraphKernelNodeSetParams_v2(n: *mut c_void, p: *const KernelNodeParams) {
        set_node(n, NODE_KERNEL, kernel_params(p, true)?)
    }
    fn cuGraphMemcpyNodeGetParams(n: *mut c_void, p: *mut Memcpy3D) {
        match *node(n)?.params.lock() {
            Params::Memcpy(c) => out(p, c.0),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }
    fn cuGraphMemcpyNodeSetParams(n: *mut c_void, p: *const Memcpy3D) {
        set_node(n, NODE_MEMCPY, memcpy_params(p)?)
    }
    fn cuGraphMemsetNodeGetParams(n: *mut c_void, p: *mut MemsetNodeParams) {
        match *node(n)?.params.lock() {
            Params::Memset(a) => out(p, MemsetNodeParams {
                dst: a.dst, pitch: a.pitch as usize, value: a.value, element_size: a.elem as u32,
                width: a.width as usize, height: a.height as usize,
            }),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }
    fn cuGraphMemsetNodeSetParams(n: *mut c_void, p: *const MemsetNodeParams) {
        set_node(n, NODE_MEMSET, memset_params(p)?)
    }
    fn cuGraphHostNodeGetParams(n: *mut c_void, p: *mut HostNodeParams) {
        match *node(n)?.params.lock() {
            Params::Host(c) => out(p, HostNodeParams { func: c.0 as *mut c_void, user_data: c.1 as *mut c_void }),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }
    fn cuGraphHostNodeSetParams(n: *mut c_void, p: *const HostNodeParams) {
        set_node(n, NODE_HOST, host_params(p)?)
    }
    fn cuGraphExecKernelNodeSetParams(e: *mut c_void, n: *mut c_void, p: *const KernelNodeParams) {
        set_exec_node(e, n, NODE_KERNEL, kernel_params(p, false)?)
    }
    fn cuGraphExecKernelNodeSetParams_v2(e: *mut c_void, n: *mut c_void, p: *const KernelNodeParams) {
        set_exec_node(e, n, NODE_KERNEL, kernel_params(p, true)?)
    }
    fn cuGraphExecMemcpyNodeSetParams(e: *mut c_void, n: *mut c_void, p: *const Memcpy3D, _ctx: CUcontext) {
        set_exec_node(e, n, NODE_MEMCPY, memcpy_params(p)?)
    }
    fn cuGraphExecMemsetNodeSetParams(e: *mut c_void, n: *mut c_void, p: *const MemsetNodeParams, _ctx: CUcontext) {
        set_exec_node(e, n, NODE_MEMSET, memset_params(p)?)
    }
    fn cuGraphExecHostNodeSetParams(e: *mut c_void, n: *mut c_void, p: *const HostNodeParams) {
        set_exec_node(e, n, NODE_HOST, host_params(p)?)
    }
    fn cuGraphExecEventRecordNodeSetEvent(e: *mut c_void, n: *mut c_void, ev: *mut c_void) {
        set_exec_node(e, n, NODE_EVENT_RECORD, event_params(ev, true)?)
    }
    fn cuGraphExecEventWaitNodeSetEvent(e: *mut c_void, n: *mut c_void, ev: *mut c_void) {
        set_exec_node(e, n, NODE_WAIT_EVENT, event_params(ev, false)?)
    }
    fn cuGraphNodeSetEnabled(e: *mut c_void, n: *mut c_void, on: u32) {
        exec_node(e, n)?.enabled.store(on != 0, Release);
        Ok(())
    }
    fn cuGraphNodeGetEnabled(e: *mut c_void, n: *mut c_void, on: *mut u32) {
        out(on, exec_node(e, n)?.enabled.load(Acquire) as u32)
    }
    fn cuGraphExecUpdate(e: *mut c_void, g: *mut c_void, err_node: *mut *mut c_void, result: *mut u32) {
        let r = exec_update(e, g);
        let (code, why, at) = match r { Ok(()) => (CUDA_SUCCESS, 0, 0), Err(x) => x };
        if !err_node.is_null() {
            *err_node = at as *mut c_void;
        }
        if !result.is_null() {
            *result = why;
        }
        if code == CUDA_SUCCESS { Ok(()) } else { Err(code) }
    }
    fn cuGraphExecUpdate_v2(e: *mut c_void, g: *mut c_void, info: *mut GraphExecUpdateResultInfo) {
        let r = exec_update(e, g);
        let (code, why, at) = match r { Ok(()) => (CUDA_SUCCESS, 0, 0), Err(x) => x };
        if !info.is_null() {
            *info = GraphExecUpdateResultInfo {
                result: why,
                error_node: at as *mut c_void,
                error_from_node: std::ptr::null_mut(),
            };
        }
        if code == CUDA_SUCCESS { Ok(()) } else { Err(code) }
    }
    fn cuGraphAddMemAllocNode(pn: *mut *mut c_void, g: *mut c_void, deps: *const *mut c_void, n: usize, p: *mut u8) {
        let g = graph(g)?;
        let deps = dep_list(deps, n)?;
        let (b, params, _) = mem_alloc_params(p)?;
        out(pn, g.add_after(NODE_MEM_ALLOC, b, params, deps) as *mut c_void)
    }
    fn cuGraphMemAllocNodeGetParams(n: *mut c_void, p: *mut u8) {
        match &*node(n)?.params.lock() {
            Params::MemAlloc(_, bytes) if !p.is_null() => {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, MEM_ALLOC_PARAMS_SIZE);
                Ok(())
            }
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }
    fn cuGraphAddMemFreeNode(pn: *mut *mut c_void, g: *mut c_void, deps: *const *mut c_void, n: usize, ptr: CUdeviceptr) {
        let g = graph(g)?;
        let deps = dep_list(deps, n)?;
        if !sim()?.mem.lock().map.contains_key(&ptr) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (b, params) = mem_free_params(ptr);
        out(pn, g.add_after(NODE_MEM_FREE, b, params, deps) as *mut c_void)
    }
    fn cuGraphMemFreeNodeGetParams(n: *mut c_void, ptr: *mut CUdeviceptr) {
        match *node(n)?.params.lock() {
            Params::MemFree(p) => out(ptr, p),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }
    fn cuGraphAddChildGraphNode(pn: *mut *mut c_void, g: *mut c_void, deps: *const *mut c_void, n: usize, child: *mut c_void) {
        let g = graph(g)?;
        let deps = dep_list(deps, n)?;
        let copy = graph(child)?.deep_clone()?;
        out(pn, g.add_after(NODE_GRAPH, Arc::new(|| Ok(Op::marker())), Params::Child(copy), deps) as *mut c_void)
    }
    fn cuGraphChildGraphNodeGetGraph(n: *mut c_void, pg: *mut *mut c_void) {
        match &*node(n)?.params.lock() {
            Params::Child(c) => out(pg, Arc::as_ptr(c) as *mut c_void),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }
    fn cuGraphAddEventRecordNode(pn: *mut *mut c_void, g: *mut c_void, deps: *const *mut c_void, n: usize, ev: *mut c_void) {
        let g = graph(g)?;
        let deps = dep_list(deps, n)?;
        let (b, params) = event_params(ev, true)?;
        out(pn, g.add_after(NODE_EVENT_RECORD, b, params, deps) as *mut c_void)
    }
    fn cuGraphAddEventWaitNode(pn: *mut *mut c_void, g: *mut c_void, deps: *const *mut c_void, n: usize, ev: *mut c_void) {
        let g = graph(g)?;
        let deps = dep_list(deps, n)?;
        let (b, params) = event_params(ev, false)?;
        out(pn, g.add_after(NODE_WAIT_EVENT, b, params, deps) as *mut c_void)
    }
    fn cuGraphEventRecordNodeGetEvent(n: *mut c_void, ev: *mut *mut c_void) {
        match *node(n)?.params.lock() {
            Params::EventRecord(e) => out(ev, e as *mut c_void),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }
    fn cuGraphEventWaitNodeGetEvent(n: *mut c_void, ev: *mut *mut c_void) {
        match *node(n)?.params.lock() {
            Params::EventWait(e) => out(ev, e as *mut c_void),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }
    fn cuGraphConditionalHandleCreate(ph: *mut u64, g: *mut c_void, _ctx: CUcontext, default: u32, flags: u32) {
        graph(g)?;
        if ph.is_null() || flags & !1 != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE); // CU_GRAPH_COND_ASSIGN_DEFAULT is the only flag
        }
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let h = NEXT.fetch_add(1, Relaxed);
        conds().lock().insert(h, (default, flags));
        out(ph, h)
    }
    fn cuGraphAddNode(pn: *mut *mut c_void, g: *mut c_void, deps: *const *mut c_void, n: usize, p: *mut u8) {
        add_node(pn, g, deps, n, p)
    }
    fn cuGraphAddNode_v2(pn: *mut *mut c_void, g: *mut c_void, deps: *const *mut c_void, _e: *const c_void, n: usize, p: *mut u8) {
        add_node(pn, g, deps, n, p)
    }
    fn cuGraphAddNode_v3(pn: *mut *mut c_void, g: *mut c_void, deps: *const *mut c_void, _e: *const c_void, n: usize, p: *mut u8) {
        add_node(pn, g, deps, n, p)
    }
    fn cuGraphExecNodeSetParams(e: *mut c_void, n: *mut c_void, p: *mut u8) {
        let g = graph(node(n)?.owner as *mut c_void)?;
        let (kind, b, params) = generic_params(&g, p)?;
        if matches!(kind, NODE_MEM_ALLOC | NODE_MEM_FREE | NODE_CONDITIONAL | NODE_GRAPH) {
            return Err(CUDA_ERROR_INVALID_VALUE); // not updatable in an executable graph
        }
        set_exec_node(e, n, kind, (b, params))
    }
    fn cuGraphNodeSetParams(n: *mut c_void, p: *mut u8) {
        let g = graph(node(n)?.owner as *mut c_void)?;
        let (kind, b, params) = generic_params(&g, p)?;
        set_node(n, kind, (b, params))
    }
    fn cuGraphNodeSetParams_v2(n: *mut c_void, p: *mut u8) {
        cuGraphNodeSetParams(n, p).result()
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
        graph: *mut *mut c_void, deps: *mut *const *mut c_void, n: *mut usize) |ptds| {
        capture_info(h, ptds, status, id, graph)?;
        clear_deps(deps, std::ptr::null_mut(), n);
        Ok(())
    }
    fn cuStreamGetCaptureInfo_v3 / cuStreamGetCaptureInfo_v3_ptsz(h: CUstream, status: *mut u32, id: *mut u64,
        graph: *mut *mut c_void, deps: *mut *const *mut c_void, edges: *mut *const GraphEdgeData, n: *mut usize) |ptds| {
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
        launch_allocs(&exec.nodes, exec.auto_free)?;
        s.launch_count.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        enqueue(s, &r, &exec.nodes)
    }
    fn cuGraphUpload / cuGraphUpload_ptsz(e: *mut c_void, h: CUstream) |ptds| {
        execs().get(e as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        stream_ref(h, ptds).map(|_| ())
    }
    fn cuGraphInstantiateWithParams / cuGraphInstantiateWithParams_ptsz(pexec: *mut *mut c_void, g: *mut c_void, p: *mut GraphInstantiateParams) |ptds| {
        let _ = ptds;
        instantiate(pexec, g, if p.is_null() { 0 } else { (*p).flags })?;
        if !p.is_null() {
            (*p).err_node_out = std::ptr::null_mut();
            (*p).result_out = 0; // CUDA_GRAPH_INSTANTIATE_SUCCESS
        }
        Ok(())
    }
}
