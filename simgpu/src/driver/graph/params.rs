//! The graph API's parameter structs (`CUDA_*_NODE_PARAMS`, `CUgraphNodeParams`) and their
//! marshalling into a node's `Builder` and `Params`.

use super::*;

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
pub(super) unsafe fn read_kernel_params(
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
pub(super) unsafe fn add_kernel_node(
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
pub(super) unsafe fn kernel_params(
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

pub(super) fn memcpy_params(p: *const Memcpy3D) -> Result<(Builder, Params), CUresult> {
    let s = sim()?;
    // SAFETY: the caller's CUDA_MEMCPY3D (checked for NULL).
    let c = Copy3D(*unsafe { p.as_ref() }.ok_or(CUDA_ERROR_INVALID_VALUE)?);
    copy3d_op(s, c)?; // validate now
    Ok((Arc::new(move || copy3d_op(s, c)), Params::Memcpy(c)))
}

pub(super) fn memset_params(p: *const MemsetNodeParams) -> Result<(Builder, Params), CUresult> {
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

pub(super) fn host_params(p: *const HostNodeParams) -> Result<(Builder, Params), CUresult> {
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

pub(super) fn event_params(ev: *mut c_void, record: bool) -> Result<(Builder, Params), CUresult> {
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
pub(super) unsafe fn mem_alloc_params(p: *mut u8) -> Result<(Builder, Params, u64), CUresult> {
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
    let ctx = crate::driver::current_ctx()?;
    let ptr = crate::driver::memory::alloc_on(dev, Arc::as_ptr(&ctx) as usize, size as u64, 0)?;
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

/// A node from `CUgraphNodeParams` (`cuGraphAddNode`): the type at offset 0, its parameters at 16.
/// Safety: a non-NULL `p` points to the application's CUgraphNodeParams (256 bytes), whose union
/// holds the parameters of the type it names.
pub(super) unsafe fn generic_params(
    g: &Arc<Graph>,
    p: *mut u8,
) -> Result<(u32, Builder, Params), CUresult> {
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
pub(super) struct SendBox(#[allow(dead_code)] Box<[*mut c_void]>);
// SAFETY: graph handles (addresses of registry entries), never dereferenced through this box;
// the box only keeps the array alive, from any thread.
unsafe impl Send for SendBox {}
// SAFETY: as for Send: nothing reads through a shared SendBox.
unsafe impl Sync for SendBox {}

/// Safety: `p` is NULL or points to a writable CUDA_KERNEL_NODE_PARAMS (`_v2` when `v2`; v1 is
/// 16 bytes shorter).
pub(super) unsafe fn kernel_node_params(n: *mut c_void, p: *mut KernelNodeParams, v2: bool) -> R {
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
