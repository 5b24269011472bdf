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
use std::sync::Mutex;

use crate::boundary::{rc, In, Out, R};
use crate::ledger::{self, Kind};
use crate::ops::Handle;
use crate::per_process::PerProcess;
use crate::process::shim;
use crate::types::*;

/// A charge a graph holds: (device, bytes, holders, count a free when the last holder goes).
type Held = (usize, u64, u32, bool);

/// Which graphs hold which allocations' charges (reference counts).
#[derive(Default)]
pub struct GraphMem(Mutex<Inner>);

#[derive(Default)]
struct Inner {
    /// Graph or executable-graph handle → the allocations it holds.
    owners: HashMap<Handle, Vec<CUdeviceptr>>,
    allocs: HashMap<CUdeviceptr, Held>,
}

static GRAPH_MEM: PerProcess<GraphMem> = PerProcess::new();

impl GraphMem {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `graph` holds `dptr`'s charge.
    pub fn hold(&self, graph: Handle, dptr: CUdeviceptr, dev: usize, bytes: u64, count_free: bool) {
        let mut g = self.lock();
        g.allocs
            .entry(dptr)
            .or_insert((dev, bytes, 0, count_free))
            .2 += 1;
        g.owners.entry(graph).or_default().push(dptr);
    }

    /// `to` (an executable graph or a clone) holds everything `from` holds.
    pub fn share(&self, from: Handle, to: Handle) {
        let mut g = self.lock();
        let Some(list) = g.owners.get(&from).cloned() else {
            return;
        };
        for p in &list {
            if let Some(e) = g.allocs.get_mut(p) {
                e.2 += 1;
            }
        }
        g.owners.entry(to).or_default().extend(list);
    }

    /// `owner` is gone: the charges no other graph holds, (device, bytes, count a free), to
    /// be returned.
    pub fn release(&self, owner: Handle) -> Vec<(usize, u64, bool)> {
        let mut g = self.lock();
        let Some(list) = g.owners.remove(&owner) else {
            return Vec::new();
        };
        list.into_iter()
            .filter_map(|p| {
                let e = g.allocs.get_mut(&p)?;
                e.2 -= 1;
                (e.2 == 0).then(|| g.allocs.remove(&p)).flatten()
            })
            .map(|(dev, bytes, _, count)| (dev, bytes, count))
            .collect()
    }
}

/// `graph` now holds `dptr`'s charge (already charged and counted as an allocation).
pub fn adopt(graph: Handle, dptr: CUdeviceptr, dev: usize, bytes: u64) {
    GRAPH_MEM.get().hold(graph, dptr, dev, bytes, true)
}

/// A tracked allocation freed inside `graph` (a free node): the graph holds its charge now.
fn freed_in(graph: Handle, dptr: CUdeviceptr) {
    let Some(sh) = crate::process::get() else {
        return;
    };
    if let Some(e) = ledger::of(sh).take(Kind::Alloc, dptr) {
        sh.account.count_free(e.dev);
        GRAPH_MEM.get().hold(graph, dptr, e.dev, e.bytes, false);
    }
}

/// Charges an allocation node of `params` added to `graph` by `call`.
fn charged_node(
    call: impl FnOnce() -> CUresult,
    graph: Handle,
    params: Option<MemAllocNodeParams>,
    dptr_after: impl FnOnce() -> CUdeviceptr,
) -> R {
    let l = ledger::of(shim()?);
    match params {
        Some(p)
            if p.pool_props.location.kind == CU_MEM_LOCATION_TYPE_DEVICE
                && p.pool_props.location.id >= 0
                && p.bytesize > 0 =>
        {
            let dev = crate::devmap::node_of(p.pool_props.location.id);
            let bytes = p.bytesize as u64;
            l.charged_then(dev, bytes, call, |_, _| {
                adopt(graph, dptr_after(), dev, bytes)
            })
        }
        _ => rc(call()),
    }
}

/// Runs `call` (adding a free node for `dptr` to `graph`); the graph then holds `dptr`.
fn free_node(call: impl FnOnce() -> CUresult, graph: Handle, dptr: CUdeviceptr) -> R {
    rc(call())?;
    freed_in(graph, dptr);
    Ok(())
}

pub fn add_mem_alloc_node(
    call: impl FnOnce() -> CUresult,
    _node: Out<CUgraphNode>,
    graph: CUgraph,
    _deps: In<CUgraphNode>,
    _n: usize,
    params: Out<MemAllocNodeParams>,
) -> R {
    charged_node(call, graph as Handle, params.get(), || {
        params.get().map_or(0, |p| p.dptr)
    })
}

pub fn add_mem_free_node(
    call: impl FnOnce() -> CUresult,
    _node: Out<CUgraphNode>,
    graph: CUgraph,
    _deps: In<CUgraphNode>,
    _n: usize,
    dptr: CUdeviceptr,
) -> R {
    free_node(call, graph as Handle, dptr)
}

/// `cuGraphAddNode`: memory allocation and free nodes are accounted as by the dedicated
/// functions; other nodes pass through.
fn accounted_node(
    call: impl FnOnce() -> CUresult,
    graph: Handle,
    params: &Out<GraphNodeParams>,
) -> R {
    match params.get() {
        Some(p) if p.kind == CU_GRAPH_NODE_TYPE_MEM_ALLOC => {
            charged_node(call, graph, Some(p.alloc), || {
                params.get().map_or(0, |p| p.alloc.dptr)
            })
        }
        Some(p) if p.kind == CU_GRAPH_NODE_TYPE_MEM_FREE => free_node(call, graph, p.free_dptr()),
        _ => rc(call()),
    }
}

pub fn add_node(
    call: impl FnOnce() -> CUresult,
    _node: Out<CUgraphNode>,
    graph: CUgraph,
    _deps: In<CUgraphNode>,
    _n: usize,
    params: Out<GraphNodeParams>,
) -> R {
    accounted_node(call, graph as Handle, &params)
}

/// cuGraphAddNode_v2 and _v3 (with edge data).
pub fn add_node_v2(
    call: impl FnOnce() -> CUresult,
    _node: Out<CUgraphNode>,
    graph: CUgraph,
    _deps: In<CUgraphNode>,
    _edges: *const c_void,
    _n: usize,
    params: Out<GraphNodeParams>,
) -> R {
    accounted_node(call, graph as Handle, &params)
}

/// After a successful instantiation or clone, `out` holds what `graph` holds.
fn shared_with(call: impl FnOnce() -> CUresult, out: &Out<*mut c_void>, graph: CUgraph) -> R {
    rc(call())?;
    if let Some(h) = out.get() {
        GRAPH_MEM.get().share(graph as Handle, h as Handle);
    }
    Ok(())
}

pub fn instantiate(
    call: impl FnOnce() -> CUresult,
    exec: Out<CUgraphExec>,
    graph: CUgraph,
    _err: Out<CUgraphNode>,
    _log: *mut c_char,
    _n: usize,
) -> R {
    shared_with(call, &exec, graph)
}

pub fn instantiate_with_flags(
    call: impl FnOnce() -> CUresult,
    exec: Out<CUgraphExec>,
    graph: CUgraph,
    _flags: u64,
) -> R {
    shared_with(call, &exec, graph)
}

pub fn instantiate_with_params(
    call: impl FnOnce() -> CUresult,
    exec: Out<CUgraphExec>,
    graph: CUgraph,
    _params: *mut c_void,
) -> R {
    shared_with(call, &exec, graph)
}

pub fn clone(call: impl FnOnce() -> CUresult, out: Out<CUgraph>, graph: CUgraph) -> R {
    shared_with(call, &out, graph)
}

/// cuGraphDestroy and cuGraphExecDestroy: what no other graph holds goes back to the quota.
pub fn destroy(call: impl FnOnce() -> CUresult, h: *mut c_void) -> R {
    rc(call())?;
    let returned = GRAPH_MEM.get().release(h as Handle);
    if let Some(sh) = crate::process::get() {
        for (dev, bytes, count) in returned {
            sh.account.uncharge(dev, bytes);
            if count {
                sh.account.count_free(dev);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_charge_stays_while_any_graph_instance_or_clone_holds_it() {
        let g = GraphMem::default();
        g.hold(1, 0x1000, 0, 64, true);
        g.hold(1, 0x2000, 1, 32, false);
        g.share(1, 2); // instantiate
        g.share(2, 3); // clone of the instance... and of what it holds
        assert!(
            g.release(1).is_empty(),
            "the instance and the clone still hold it"
        );
        assert!(g.release(2).is_empty());
        let mut back = g.release(3);
        back.sort();
        assert_eq!(back, [(0, 64, true), (1, 32, false)]);
        assert!(g.release(3).is_empty(), "returned once");
    }
}
