//! CUDA graphs: stream capture, explicit kernel/empty nodes, instantiation and launch.
//!
//! A captured operation is recorded as a *builder* (see `submit_or_capture`) that makes a fresh
//! stream operation each time the graph is launched; a launch enqueues its nodes in capture order
//! on the launch stream. Nodes of one graph therefore run one after another (kernels never
//! overlap on simgpu anyway). Streams that wait on an event recorded during a capture join it.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::Ordering::*;
use std::sync::{Arc, OnceLock};

use super::launch::kernel_op;
use super::memory::{copy3d_op, memset_op, Copy3D};
use super::{out, stream_ref, submit, Builder, R};
use crate::engine::Op;
use crate::model::capture::*;
use crate::sim::{sim, Registry};
use crate::types::*;
use crate::{driver, driver_ptds};

mod exec;
mod params;
pub use exec::*;
pub use params::*;

impl Drop for GraphMem {
    fn drop(&mut self) {
        let st = graph_mems().lock().remove(&self.ptr);
        // A live allocation stays the application's (it frees it); else its memory goes.
        if st.is_some_and(|st| !st.live && st.freed_somewhere) {
            let _ = super::memory::free_device(self.ptr);
        }
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
