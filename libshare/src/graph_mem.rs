//! CUDA-graph memory. An allocation node (`cuGraphAddMemAllocNode`, `cuGraphAddNode` with a
//! MEM_ALLOC node, or `cuMemAllocAsync` during stream capture) is charged when it is added, and
//! the charge stays with the graph — and with every executable graph instantiated from it, and
//! every clone — until the last of them is destroyed: the driver backs a graph's allocations
//! from its graph memory pool for as long as the graph can run, whatever free nodes the graph
//! has. A tracked allocation freed by a free node or during capture passes to that graph the
//! same way. (Conservative: on a GPU the memory is physically allocated at the first launch,
//! and `cuDeviceGraphMemTrim` can release that of graphs that are not running.)

use std::collections::HashMap;
use std::ffi::{c_char, c_void};

use crate::memory::{charged_then, take_allocation};
use crate::state::{shim, PerProcess};
use crate::types::*;

#[derive(Default)]
struct GraphMem {
    /// Graph or executable-graph handle → the allocations it holds.
    owners: HashMap<usize, Vec<CUdeviceptr>>,
    /// Allocation → (device, bytes, holders, count a free when the last holder goes).
    allocs: HashMap<CUdeviceptr, (usize, u64, u32, bool)>,
}

static GRAPH_MEM: PerProcess<GraphMem> = PerProcess::new();

/// In a forked child: the parent's graphs are not the child's.
pub fn forget_all_after_fork() {
    GRAPH_MEM.reset();
}

/// The graph `stream` is capturing into, if it is capturing.
pub(crate) fn capturing(stream: CUstream, ptsz: bool) -> Option<CUgraph> {
    let r = crate::state::real();
    let info = if ptsz {
        r.cuStreamGetCaptureInfo_v2_ptsz
    } else {
        r.cuStreamGetCaptureInfo_v2
    }?;
    let (mut status, mut id, mut graph) = (0u32, 0u64, std::ptr::null_mut());
    let (mut deps, mut n) = (std::ptr::null(), 0usize);
    // SAFETY: the driver's `cuStreamGetCaptureInfo_v2(_ptsz)`; every out-pointer is a live
    // local of the written type; `stream` is the caller's, which it is about to pass to the
    // driver itself (a handle of this process or a default stream).
    let rc = unsafe { info(stream, &mut status, &mut id, &mut graph, &mut deps, &mut n) };
    const CU_STREAM_CAPTURE_STATUS_ACTIVE: u32 = 1;
    (rc == CUDA_SUCCESS && status == CU_STREAM_CAPTURE_STATUS_ACTIVE && !graph.is_null())
        .then_some(graph)
}

/// `graph` now holds `dptr`'s charge (already charged and counted as an allocation).
pub fn adopt(graph: CUgraph, dptr: CUdeviceptr, dev: usize, bytes: u64) {
    hold(graph, dptr, dev, bytes, true)
}

fn hold(graph: CUgraph, dptr: CUdeviceptr, dev: usize, bytes: u64, count_free: bool) {
    let mut g = GRAPH_MEM.lock();
    let e = g.allocs.entry(dptr).or_insert((dev, bytes, 0, count_free));
    e.2 += 1;
    g.owners.entry(graph as usize).or_default().push(dptr);
}

/// A tracked allocation freed inside `graph` (a free node): the graph holds its charge now.
fn freed_in(graph: CUgraph, dptr: CUdeviceptr) {
    if let Some((dev, bytes)) = take_allocation(dptr) {
        if let Some(sh) = crate::state::get() {
            sh.count_free(dev);
        }
        hold(graph, dptr, dev, bytes, false);
    }
}

/// `to` (an executable graph or a clone) holds everything `from` holds.
fn share(from: *mut c_void, to: *mut c_void) {
    let mut g = GRAPH_MEM.lock();
    let Some(list) = g.owners.get(&(from as usize)).cloned() else {
        return;
    };
    for p in &list {
        if let Some(e) = g.allocs.get_mut(p) {
            e.2 += 1;
        }
    }
    g.owners.entry(to as usize).or_default().extend(list);
}

/// `owner` is gone: allocations no other graph holds go back to the quota.
fn release(owner: *mut c_void) {
    let returned: Vec<(usize, u64, bool)> = {
        let mut g = GRAPH_MEM.lock();
        let Some(list) = g.owners.remove(&(owner as usize)) else {
            return;
        };
        list.into_iter()
            .filter_map(|p| {
                let e = g.allocs.get_mut(&p)?;
                e.2 -= 1;
                (e.2 == 0).then(|| g.allocs.remove(&p)).flatten()
            })
            .map(|(dev, bytes, _, count)| (dev, bytes, count))
            .collect()
    };
    if let Some(sh) = crate::state::get() {
        for (dev, bytes, count) in returned {
            sh.uncharge(dev, bytes);
            if count {
                sh.count_free(dev);
            }
        }
    }
}

/// Charges an allocation node of `params` added to `graph` by `call`.
///
/// # Safety
///
/// `params` is NULL or valid for reading a `CUDA_MEM_ALLOC_NODE_PARAMS` whose `dptr` `call`
/// has written when it returns CUDA_SUCCESS.
unsafe fn charged_node(
    graph: CUgraph,
    params: *mut MemAllocNodeParams,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let sh = match shim() {
        Ok(s) => s,
        Err(e) => return e,
    };
    // SAFETY: NULL or readable, by this function's contract.
    match unsafe { params.as_ref() } {
        Some(p)
            if p.pool_props.location.kind == CU_MEM_LOCATION_TYPE_DEVICE
                && p.pool_props.location.id >= 0
                && p.bytesize > 0 =>
        {
            let dev = p.pool_props.location.id as usize % libshare_abi::MAX_DEVICES;
            let bytes = p.bytesize as u64;
            charged_then(sh, dev, bytes, call, || {
                // SAFETY: not NULL (`as_ref` gave Some), so readable by this function's
                // contract; read after `call` succeeded and the driver wrote `dptr`.
                adopt(graph, unsafe { (*params).dptr }, dev, bytes)
            })
        }
        _ => call(),
    }
}

/// Runs `call` (adding a free node for `dptr` to `graph`); the graph then holds `dptr`.
fn free_node(graph: CUgraph, dptr: CUdeviceptr, call: impl FnOnce() -> CUresult) -> CUresult {
    let r = call();
    if r == CUDA_SUCCESS {
        freed_in(graph, dptr);
    }
    r
}

type AllocNodeFn = unsafe extern "C" fn(
    *mut CUgraphNode,
    CUgraph,
    *const CUgraphNode,
    usize,
    *mut MemAllocNodeParams,
) -> CUresult;
type FreeNodeFn = unsafe extern "C" fn(
    *mut CUgraphNode,
    CUgraph,
    *const CUgraphNode,
    usize,
    CUdeviceptr,
) -> CUresult;
type AddNodeFn = unsafe extern "C" fn(
    *mut CUgraphNode,
    CUgraph,
    *const CUgraphNode,
    usize,
    *mut GraphNodeParams,
) -> CUresult;
type AddNodeV2Fn = unsafe extern "C" fn(
    *mut CUgraphNode,
    CUgraph,
    *const CUgraphNode,
    *const c_void,
    usize,
    *mut GraphNodeParams,
) -> CUresult;

/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuGraphAddMemAllocNode`.
pub unsafe fn add_mem_alloc_node(
    real: AllocNodeFn,
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    n: usize,
    params: *mut MemAllocNodeParams,
) -> CUresult {
    // SAFETY: the hook contract: `params` is the caller's in/out CUDA_MEM_ALLOC_NODE_PARAMS
    // (NULL or valid), whose `dptr` the driver's function, called with the caller's arguments,
    // writes on success.
    unsafe { charged_node(graph, params, || real(node, graph, deps, n, params)) }
}

/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuGraphAddMemFreeNode`.
pub unsafe fn add_mem_free_node(
    real: FreeNodeFn,
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    n: usize,
    dptr: CUdeviceptr,
) -> CUresult {
    // SAFETY: the hook contract: the driver's function with the caller's arguments.
    free_node(graph, dptr, || unsafe { real(node, graph, deps, n, dptr) })
}

/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuGraphAddNode`.
pub unsafe fn add_node(
    real: AddNodeFn,
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    n: usize,
    params: *mut GraphNodeParams,
) -> CUresult {
    // SAFETY: the hook contract: `params` is the caller's in/out CUgraphNodeParams (NULL or
    // valid), passed on unchanged to the driver's function with the caller's arguments.
    unsafe { accounted_node(graph, params, || real(node, graph, deps, n, params)) }
}

/// cuGraphAddNode_v2 and _v3 (with edge data).
///
/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuGraphAddNode_v2 / _v3`.
pub unsafe fn add_node_v2(
    real: AddNodeV2Fn,
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    edges: *const c_void,
    n: usize,
    params: *mut GraphNodeParams,
) -> CUresult {
    // SAFETY: as in `add_node`.
    unsafe { accounted_node(graph, params, || real(node, graph, deps, edges, n, params)) }
}

/// `cuGraphAddNode`: memory allocation and free nodes are accounted as by the dedicated
/// functions; other nodes pass through.
///
/// # Safety
///
/// `params` is NULL or valid for reading a `CUgraphNodeParams`, and for a MEM_ALLOC node `call`
/// has written its `alloc.dptr` when it returns CUDA_SUCCESS.
unsafe fn accounted_node(
    graph: CUgraph,
    params: *mut GraphNodeParams,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    // SAFETY: NULL or readable, by this function's contract.
    match unsafe { params.as_ref() }.map(|p| p.kind) {
        // SAFETY: not NULL (checked above); the union read as the variant `kind` names,
        // CUDA_MEM_ALLOC_NODE_PARAMS, whose `dptr` `call` writes (this function's contract).
        // `&raw mut` derives the pointer without an intermediate reference, so the read after
        // the driver's write goes through the caller's pointer.
        Some(CU_GRAPH_NODE_TYPE_MEM_ALLOC) => unsafe {
            charged_node(graph, &raw mut (*params).alloc, call)
        },
        Some(CU_GRAPH_NODE_TYPE_MEM_FREE) => {
            // SAFETY: not NULL (checked above), readable by this function's contract; the
            // union read as the variant `kind` names, CUDA_MEM_FREE_NODE_PARAMS.
            let dptr = unsafe { (*params).free_dptr() };
            free_node(graph, dptr, call)
        }
        _ => call(),
    }
}

/// After a successful instantiation or clone, `*out` holds what `graph` holds.
///
/// # Safety
///
/// `out` is NULL or valid for reading a handle, which the driver wrote if `r` is CUDA_SUCCESS.
unsafe fn shared_with(out: *mut *mut c_void, graph: CUgraph, r: CUresult) -> CUresult {
    if r == CUDA_SUCCESS && !out.is_null() {
        // SAFETY: not NULL (checked), readable and written by the driver (this function's
        // contract).
        share(graph, unsafe { *out });
    }
    r
}

/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuGraphInstantiate(_v2)`.
pub unsafe fn instantiate(
    real: unsafe extern "C" fn(
        *mut CUgraphExec,
        CUgraph,
        *mut CUgraphNode,
        *mut c_char,
        usize,
    ) -> CUresult,
    exec: *mut CUgraphExec,
    graph: CUgraph,
    err: *mut CUgraphNode,
    log: *mut c_char,
    n: usize,
) -> CUresult {
    // SAFETY: the hook contract: the driver's function with the caller's arguments; `exec`
    // is the caller's out-pointer (NULL or writable), which the driver writes on success.
    unsafe { shared_with(exec, graph, real(exec, graph, err, log, n)) }
}

/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuGraphInstantiateWithFlags`.
pub unsafe fn instantiate_with_flags(
    real: unsafe extern "C" fn(*mut CUgraphExec, CUgraph, u64) -> CUresult,
    exec: *mut CUgraphExec,
    graph: CUgraph,
    flags: u64,
) -> CUresult {
    // SAFETY: the hook contract: the driver's function with the caller's arguments; `exec`
    // is the caller's out-pointer (NULL or writable), which the driver writes on success.
    unsafe { shared_with(exec, graph, real(exec, graph, flags)) }
}

/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuGraphInstantiateWithParams(_ptsz)`.
pub unsafe fn instantiate_with_params(
    real: unsafe extern "C" fn(*mut CUgraphExec, CUgraph, *mut c_void) -> CUresult,
    exec: *mut CUgraphExec,
    graph: CUgraph,
    params: *mut c_void,
) -> CUresult {
    // SAFETY: the hook contract: the driver's function with the caller's arguments; `exec`
    // is the caller's out-pointer (NULL or writable), which the driver writes on success.
    unsafe { shared_with(exec, graph, real(exec, graph, params)) }
}

/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuGraphClone`.
pub unsafe fn clone(
    real: unsafe extern "C" fn(*mut CUgraph, CUgraph) -> CUresult,
    out: *mut CUgraph,
    graph: CUgraph,
) -> CUresult {
    // SAFETY: the hook contract: the driver's function with the caller's arguments; `out`
    // is the caller's out-pointer (NULL or writable), which the driver writes on success.
    unsafe { shared_with(out, graph, real(out, graph)) }
}

/// cuGraphDestroy and cuGraphExecDestroy.
///
/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuGraphDestroy / cuGraphExecDestroy`.
pub unsafe fn destroy(
    real: unsafe extern "C" fn(*mut c_void) -> CUresult,
    h: *mut c_void,
) -> CUresult {
    // SAFETY: the hook contract: the driver's function with the caller's handle.
    let r = unsafe { real(h) };
    if r == CUDA_SUCCESS {
        release(h);
    }
    r
}
