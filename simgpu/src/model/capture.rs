//! Stream capture and the graphs it builds, as the simulator holds them: node types and what a
//! node was made with (`Params`), `Graph` and its nodes, graph-allocation state, and which streams
//! are capturing into which graph. Export modules that enqueue work ask `capturing` here; the
//! graph exports are `driver/graph/`.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::*};
use std::sync::{Arc, OnceLock};

use crate::engine::{EventState, Op, StreamId};
use crate::model::memory::Copy3D;
use crate::model::Registry;
use crate::types::*;

/// Makes the operation a node (or a captured call) stands for, each time it runs.
pub type Builder = Arc<dyn Fn() -> Result<Op, CUresult> + Send + Sync>;

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
    pub fn new(ptr: u64) -> Arc<GraphMem> {
        graph_mems().lock().insert(ptr, MemState::default());
        Arc::new(GraphMem { ptr })
    }
}

/// The host-side state of one graph allocation (changed when launches and frees are issued, as
/// the driver decides whether a launch may allocate again).
#[derive(Default)]
pub struct MemState {
    /// Allocated by a launch and not freed since.
    pub live: bool,
    /// Some graph has a free node for it, or the application freed it: when no graph refers to
    /// it any more, its memory goes. Otherwise it outlives its graph, as in CUDA: the application
    /// frees it (`cuMemFree(Async)`, e.g. PyTorch's `cudaMallocAsync` backend freeing a tensor
    /// made during capture after the graph is gone).
    pub freed_somewhere: bool,
}

pub fn graph_mems() -> &'static Mutex<HashMap<u64, MemState>> {
    static S: OnceLock<Mutex<HashMap<u64, MemState>>> = OnceLock::new();
    S.get_or_init(Default::default)
}

/// `cuMemFree`/`cuMemFreeAsync` of `ptr`: None if it is not a graph allocation. A live one is
/// freed (its address and backing stay the graph's, for the next launch); freeing one that is not
/// live is `CUDA_ERROR_INVALID_VALUE`, as for any pointer that is not allocated.
pub fn free_graph_alloc(ptr: u64) -> Option<Result<(), CUresult>> {
    let mut t = graph_mems().lock();
    let st = t.get_mut(&ptr)?;
    if !st.live {
        return Some(Err(CUDA_ERROR_INVALID_VALUE));
    }
    st.live = false;
    st.freed_somewhere = true;
    Some(Ok(()))
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

#[derive(Clone, Copy)]
pub struct HostCall(pub usize, pub usize);
// SAFETY: a function and its argument as addresses, given to us to call from whichever thread
// runs the node (as CUDA does); simgpu never dereferences the argument itself.
unsafe impl Send for HostCall {}
// SAFETY: as for Send: shared access only copies the two addresses.
unsafe impl Sync for HostCall {}

pub fn graphs() -> &'static Registry<Graph> {
    static R: OnceLock<Registry<Graph>> = OnceLock::new();
    R.get_or_init(Registry::default)
}
pub fn nodes() -> &'static Registry<Node> {
    static R: OnceLock<Registry<Node>> = OnceLock::new();
    R.get_or_init(Registry::default)
}
/// Streams being captured, and events recorded during a capture (by their state's address).
pub struct Capture {
    pub streams: HashMap<StreamId, Arc<Graph>>,
    pub events: HashMap<usize, Arc<Graph>>,
    /// Streams whose capture goes into the application's graph (cuStreamBeginCaptureToGraph).
    pub into_user_graph: std::collections::HashSet<StreamId>,
}
pub static CAPTURE: Mutex<Option<Capture>> = Mutex::new(None);
/// Number of captures in progress: lets `capturing` skip the lock when there are none.
pub static ACTIVE: AtomicUsize = AtomicUsize::new(0);
pub static NEXT_CAPTURE_ID: AtomicUsize = AtomicUsize::new(1);

/// The graph the stream is capturing into, if any.
pub fn capturing(id: StreamId) -> Option<Arc<Graph>> {
    if ACTIVE.load(Acquire) == 0 {
        return None;
    }
    CAPTURE.lock().as_ref()?.streams.get(&id).cloned()
}

pub fn with_capture<T>(f: impl FnOnce(&mut Capture) -> T) -> T {
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

pub fn mem_free_params(ptr: u64) -> (Builder, Params) {
    if let Some(st) = graph_mems().lock().get_mut(&ptr) {
        st.freed_somewhere = true;
    }
    (Arc::new(|| Ok(Op::marker())), Params::MemFree(ptr))
}
