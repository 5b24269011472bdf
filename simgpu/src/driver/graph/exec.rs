//! Executable graphs: instantiation (flatten), launch (enqueue, conditionals, graph
//! allocations) and update.

use super::*;

/// A launch of `list` allocates its allocation nodes' memory and frees what its free nodes name:
/// Err (nothing changed) if an allocation is still live from a previous launch and the instance
/// does not free it on launch.
pub(super) fn launch_allocs(list: &[Arc<ExecNode>], auto_free: bool) -> R {
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
pub(super) const INSTANTIATE_AUTO_FREE_ON_LAUNCH: u64 = 1;

/// Instantiates a graph: nodes in dependency order; child graphs are inlined.
pub(super) fn flatten(g: &Graph) -> Result<Vec<Arc<ExecNode>>, CUresult> {
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
pub(super) fn enqueue(
    s: &'static crate::sim::Sim,
    r: &crate::driver::StreamRef,
    list: &[Arc<ExecNode>],
) -> R {
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

pub(super) const COND_IF: u32 = 0;
pub(super) const COND_WHILE: u32 = 1;
pub(super) const COND_SWITCH: u32 = 2;

/// Conditional handles: (default launch value, flags).
pub(super) fn conds() -> &'static Mutex<HashMap<u64, (u32, u32)>> {
    static C: OnceLock<Mutex<HashMap<u64, (u32, u32)>>> = OnceLock::new();
    C.get_or_init(Default::default)
}
pub(super) fn cond_value(h: u64) -> u32 {
    conds().lock().get(&h).map_or(0, |c| c.0)
}

/// The node of `exec` made from graph node `node`.
pub(super) fn exec_node(exec: *mut c_void, node: *mut c_void) -> Result<Arc<ExecNode>, CUresult> {
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
pub(super) fn same_shape(old: &[Arc<ExecNode>], new: &[Arc<ExecNode>]) -> Result<(), (u32, usize)> {
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
pub(super) fn take_update(old: &[Arc<ExecNode>], new: &[Arc<ExecNode>]) {
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

pub(super) fn execs() -> &'static Registry<GraphExec> {
    static R: OnceLock<Registry<GraphExec>> = OnceLock::new();
    R.get_or_init(Registry::default)
}

/// Safety: `pexec` is NULL or writable (cuGraphInstantiate's out-argument).
pub(super) unsafe fn instantiate(pexec: *mut *mut c_void, g: *mut c_void, flags: u64) -> R {
    let g = graph(g)?;
    let list = flatten(&g)?;
    let h = execs().insert(Arc::new(GraphExec {
        nodes: list,
        auto_free: flags & INSTANTIATE_AUTO_FREE_ON_LAUNCH != 0,
    }));
    // SAFETY: `pexec` is NULL or writable (this fn's contract).
    unsafe { out(pexec, h as *mut c_void) }
}

pub(super) fn exec_update(e: *mut c_void, g: *mut c_void) -> Result<(), (CUresult, u32, usize)> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn marker() -> Builder {
        Arc::new(|| Ok(Op::marker()))
    }

    fn origins(list: &[Arc<ExecNode>]) -> Vec<usize> {
        list.iter().map(|n| n.origin.lock()[0]).collect()
    }

    #[test]
    fn flatten_runs_dependencies_first_and_inlines_child_graphs() {
        let g = Graph::default();
        let x = g.add(NODE_EMPTY, marker(), Params::None);
        let y = g.add(NODE_EMPTY, marker(), Params::None);
        nodes().get(x).unwrap().deps.lock().push(y); // x after y, though made first
        let child = Arc::new(Graph::default());
        let inner = child.add(NODE_HOST, marker(), Params::None);
        let c = g.add_after(NODE_GRAPH, marker(), Params::Child(child), vec![x]);
        let list = flatten(&g).unwrap();
        assert_eq!(
            origins(&list),
            [y, x, inner],
            "child node {c} is replaced by its body"
        );
        assert_eq!(list[1].deps, [0], "x depends on y, by position");
        assert_eq!(list[2].node_type, NODE_HOST);
    }

    #[test]
    fn a_dependency_cycle_cannot_be_instantiated() {
        let g = Graph::default();
        let a = g.add(NODE_EMPTY, marker(), Params::None);
        let b = g.add_after(NODE_EMPTY, marker(), Params::None, vec![a]);
        nodes().get(a).unwrap().deps.lock().push(b);
        assert!(matches!(flatten(&g), Err(CUDA_ERROR_INVALID_VALUE)));
    }

    #[test]
    fn an_update_needs_the_same_shape_and_then_takes_the_new_parameters() {
        let (old, new, longer, retyped) = (
            Graph::default(),
            Graph::default(),
            Graph::default(),
            Graph::default(),
        );
        old.add(NODE_MEM_FREE, marker(), Params::MemFree(0x1000));
        let n = new.add(NODE_MEM_FREE, marker(), Params::MemFree(0x1000));
        longer.add(NODE_MEM_FREE, marker(), Params::MemFree(0x1000));
        let extra = longer.add(NODE_EMPTY, marker(), Params::None);
        let r = retyped.add(NODE_EMPTY, marker(), Params::None);
        let (old, new) = (flatten(&old).unwrap(), flatten(&new).unwrap());
        assert_eq!(
            same_shape(&old, &flatten(&longer).unwrap()),
            Err((2, extra)),
            "topology changed, at the new graph's extra node"
        );
        assert_eq!(
            same_shape(&old, &flatten(&retyped).unwrap()),
            Err((3, r)),
            "node type changed"
        );
        let moved = Graph::default();
        let m = moved.add(NODE_MEM_FREE, marker(), Params::MemFree(0x2000));
        assert_eq!(
            same_shape(&old, &flatten(&moved).unwrap()),
            Err((5, m)),
            "a free node must free the same pointer"
        );
        assert_eq!(same_shape(&old, &new), Ok(()));
        take_update(&old, &new);
        assert_eq!(
            old[0].origin.lock().last(),
            Some(&n),
            "remembers the new graph's node"
        );
    }

    #[test]
    fn a_graph_allocation_is_allocated_once_per_launch_unless_freed_or_auto_freed() {
        let ptr = 0x7e57_0000_0000;
        let mem = GraphMem::new(ptr);
        let list = vec![Arc::new(ExecNode {
            origin: Mutex::new(vec![1]),
            node_type: NODE_MEM_ALLOC,
            build: Mutex::new(marker()),
            params: Mutex::new(Params::MemAlloc(mem, [0; MEM_ALLOC_PARAMS_SIZE])),
            enabled: std::sync::atomic::AtomicBool::new(true),
            deps: Vec::new(),
            bodies: Vec::new(),
        })];
        assert_eq!(launch_allocs(&list, false), Ok(()));
        assert_eq!(
            launch_allocs(&list, false),
            Err(CUDA_ERROR_INVALID_VALUE),
            "still live from the last launch"
        );
        assert_eq!(launch_allocs(&list, true), Ok(()), "AUTO_FREE_ON_LAUNCH");
        assert_eq!(free_graph_alloc(ptr), Some(Ok(())));
        assert_eq!(
            free_graph_alloc(ptr),
            Some(Err(CUDA_ERROR_INVALID_VALUE)),
            "not live"
        );
        assert_eq!(
            launch_allocs(&list, false),
            Ok(()),
            "freed by the application"
        );
        assert_eq!(
            free_graph_alloc(0x7e58_0000_0000),
            None,
            "not a graph allocation"
        );
    }
}
