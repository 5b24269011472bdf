//! The exported CUDA driver functions, one module per API group. Every `fn cuXxx` written with
//! the `driver!` / `driver_ptds!` macros here is exported under that exact name and takes the
//! place of the generated stub (see `build.rs`).

use std::cell::RefCell;
use std::sync::Arc;

use crate::engine::{Op, StreamId};
use crate::sim::{sim, Context, Sim};
use crate::types::*;

pub mod context;
pub mod device;
pub mod event;
pub mod export_tables;
pub mod graph;
pub mod init;
pub mod launch;
pub mod link;
pub mod memory;
pub mod module;
pub mod results;
pub mod stats;
pub mod stream;

pub use context::*;
pub use device::*;
pub use event::*;
pub use export_tables::cuGetExportTable;
pub use graph::*;
pub use init::*;
pub use launch::*;
pub use link::*;
pub use memory::*;
pub use module::*;
pub use stream::*;

pub type R = Result<(), CUresult>;

/// Runs a driver function body: panics become CUDA_ERROR_UNKNOWN (`shim_headers::guard`), never
/// an abort of the job.
pub fn run(name: &str, f: impl FnOnce() -> R) -> CUresult {
    crate::debug!("{name}");
    shim_headers::guard(name, CUDA_ERROR_UNKNOWN, || match f() {
        Ok(()) => CUDA_SUCCESS,
        Err(e) => {
            crate::debug!("{name} -> {e}");
            e
        }
    })
}

/// Defines exported driver functions whose body returns `R`.
///
/// # Safety
///
/// Every generated function is an `unsafe extern "C"` CUDA driver entry point: its caller must
/// keep the pointer contracts the CUDA driver API documents for that function (out-pointers
/// writable for the documented type or length unless the API allows NULL, in-pointers readable
/// and initialised for the documented size, C strings NUL-terminated).
///
/// The body runs inside one `unsafe` block, here in the macro, rather than one per raw-pointer
/// access in each of the ~400 bodies: nearly every unsafe operation in a body is exactly
/// "read or write through an argument under that documented contract" (`out(p, v)`,
/// `p.as_ref()`, `cstr(name)`), and a comment on each would repeat that sentence. Anything a
/// body relies on *beyond* the caller's contract (a handle looked up in a table, an address
/// checked against an allocation, a size computed here) belongs in a helper `unsafe fn` with its
/// own `# Safety` section, or in an inner `unsafe` block with its own `// SAFETY:` comment
/// naming that check. (Hence the `macro_metavars_in_unsafe` allowance: expanding `$body` inside
/// the `unsafe` block is the point, not an accident.)
#[macro_export]
macro_rules! driver {
    ($(fn $name:ident ($($a:ident : $t:ty),* $(,)?) $body:block)*) => {$(
        /// # Safety
        ///
        /// The CUDA driver API's documented pointer contract for this function.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> $crate::types::CUresult {
            $crate::driver::run(stringify!($name), || -> $crate::driver::R {
                // SAFETY: the arguments come from a CUDA driver API caller, which guarantees the
                // pointer contracts the API documents for this function (see the macro's doc).
                #[allow(unused_unsafe, clippy::macro_metavars_in_unsafe)]
                unsafe { $body }
            })
        }
    )*};
}

/// Defines a driver function and its per-thread-default-stream twin (`_ptds` / `_ptsz`); the
/// body sees `$p == true` in the twin.
///
/// # Safety
///
/// As for [`driver!`]: the caller keeps the CUDA driver API's pointer contracts, and the body
/// runs in one `unsafe` block covering exactly that (reasons in `driver!`'s doc).
#[macro_export]
macro_rules! driver_ptds {
    ($(fn $name:ident / $twin:ident ($($a:ident : $t:ty),* $(,)?) |$p:ident| $body:block)*) => {$(
        /// # Safety
        ///
        /// The CUDA driver API's documented pointer contract for this function.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> $crate::types::CUresult {
            let $p = false;
            $crate::driver::run(stringify!($name), || -> $crate::driver::R {
                // SAFETY: the arguments come from a CUDA driver API caller, which guarantees the
                // pointer contracts the API documents for this function (see `driver!`'s doc).
                #[allow(unused_unsafe, clippy::macro_metavars_in_unsafe)]
                unsafe { $body }
            })
        }
        /// # Safety
        ///
        /// The CUDA driver API's documented pointer contract for this function.
        #[no_mangle]
        pub unsafe extern "C" fn $twin($($a: $t),*) -> $crate::types::CUresult {
            let $p = true;
            $crate::driver::run(stringify!($twin), || -> $crate::driver::R {
                // SAFETY: as in the function above: the CUDA driver API caller's contract.
                #[allow(unused_unsafe, clippy::macro_metavars_in_unsafe)]
                unsafe { $body }
            })
        }
    )*};
}

/// Writes `v` through an out-pointer, or fails with CUDA_ERROR_INVALID_VALUE if it is NULL.
///
/// # Safety
///
/// `p` is NULL or valid for writing one properly aligned `T` (the old value is not dropped).
pub unsafe fn out<T>(p: *mut T, v: T) -> R {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: not NULL (checked), so writable and aligned by the caller's contract.
    unsafe { p.write(v) };
    Ok(())
}

thread_local! {
    /// This thread's context stack (top = current).
    static CTX_STACK: RefCell<Vec<Arc<Context>>> = const { RefCell::new(Vec::new()) };
    /// Per-thread default streams, by context id.
    static PER_THREAD: RefCell<Vec<(u64, StreamId)>> = const { RefCell::new(Vec::new()) };
}

pub fn current_ctx_opt() -> Option<Arc<Context>> {
    // A context made before a fork belongs to the parent's simulator: not current here. During
    // thread or process exit the stack may already be gone (libraries clean up from atexit).
    CTX_STACK
        .try_with(|s| s.borrow().last().cloned())
        .ok()
        .flatten()
        .filter(|c| c.sim_id == crate::sim::current_id())
}

/// The current context, or CUDA_ERROR_INVALID_CONTEXT.
pub fn current_ctx() -> Result<Arc<Context>, CUresult> {
    sim()?;
    current_ctx_opt().ok_or(CUDA_ERROR_INVALID_CONTEXT)
}

/// Runs `f` on this thread's context stack (an empty one if the thread is being torn down).
pub fn with_ctx_stack<T>(f: impl FnOnce(&mut Vec<Arc<Context>>) -> T) -> T {
    let mut f = Some(f);
    match CTX_STACK.try_with(|s| (f.take().expect("called once"))(&mut s.borrow_mut())) {
        Ok(v) => v,
        Err(_) => (f.take().expect("not called"))(&mut Vec::new()),
    }
}

/// Looks a context handle up (NULL = current).
pub fn ctx_from(h: CUcontext) -> Result<Arc<Context>, CUresult> {
    let s = sim()?;
    if h.is_null() {
        return current_ctx();
    }
    s.contexts.get(h as usize).ok_or(CUDA_ERROR_INVALID_CONTEXT)
}

/// A resolved stream: where to enqueue and how it orders against the legacy default stream.
pub struct StreamRef {
    pub id: StreamId,
    pub ctx: Arc<Context>,
    pub legacy: bool,
    pub blocking: bool,
}

/// Resolves a stream handle. 0 is the legacy default stream, or the per-thread default stream
/// in `_ptds`/`_ptsz` functions; 1 and 2 are CU_STREAM_LEGACY and CU_STREAM_PER_THREAD.
pub fn stream_ref(h: CUstream, ptds: bool) -> Result<StreamRef, CUresult> {
    let s = sim()?;
    let hv = h as usize;
    if hv == CU_STREAM_LEGACY || (hv == 0 && !ptds) {
        let ctx = current_ctx()?;
        return Ok(StreamRef {
            id: ctx.null_stream,
            ctx,
            legacy: true,
            blocking: true,
        });
    }
    if hv == CU_STREAM_PER_THREAD || hv == 0 {
        let ctx = current_ctx()?;
        let id = PER_THREAD
            .try_with(|p| {
                let mut p = p.borrow_mut();
                if let Some((_, id)) = p.iter().find(|(c, _)| *c == ctx.id) {
                    return *id;
                }
                let id = s.engine.create_stream();
                ctx.streams.lock().push((id, 0));
                p.push((ctx.id, id));
                id
            })
            // The thread is exiting: its per-thread stream is gone; use the legacy one.
            .unwrap_or(ctx.null_stream);
        return Ok(StreamRef {
            id,
            ctx,
            legacy: false,
            blocking: true,
        });
    }
    let st = s.streams.get(hv).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    Ok(StreamRef {
        id: st.id,
        ctx: st.ctx.clone(),
        legacy: false,
        blocking: st.flags & CU_STREAM_NON_BLOCKING == 0,
    })
}

/// Enqueues `op` on a stream with the legacy-default-stream ordering rules: work on the legacy
/// stream waits for all blocking streams of its context, and blocking streams wait for it.
pub fn submit(sim: &'static Sim, s: &StreamRef, mut op: Op) -> u64 {
    if s.legacy {
        for (id, flags) in s.ctx.streams.lock().iter() {
            if flags & CU_STREAM_NON_BLOCKING == 0 {
                op.deps.push((*id, sim.engine.tail(*id)));
            }
        }
    } else if s.blocking {
        op.deps
            .push((s.ctx.null_stream, sim.engine.tail(s.ctx.null_stream)));
    }
    sim.engine.enqueue(s.id, op)
}

/// Builds a stream operation; called again at every launch of a graph that captured it.
pub use crate::model::capture::Builder;

/// Submits the operation `build` makes, or, if the stream is capturing, records it as a node of
/// type `node_type` (a `CUgraphNodeType`) of the graph being captured.
pub fn submit_or_capture(
    sim: &'static Sim,
    s: &StreamRef,
    node_type: u32,
    build: impl Fn() -> Result<Op, CUresult> + Send + Sync + 'static,
) -> R {
    submit_or_capture_params(
        sim,
        s,
        node_type,
        crate::model::capture::Params::None,
        build,
    )
}

/// `submit_or_capture`, recording `params` with a captured node (what the node Get functions
/// report).
pub fn submit_or_capture_params(
    sim: &'static Sim,
    s: &StreamRef,
    node_type: u32,
    params: crate::model::capture::Params,
    build: impl Fn() -> Result<Op, CUresult> + Send + Sync + 'static,
) -> R {
    if let Some(g) = crate::model::capture::capturing(s.id) {
        build()?; // validate now, as the driver does at capture time
        g.add(node_type, std::sync::Arc::new(build), params);
        return Ok(());
    }
    submit(sim, s, build()?);
    Ok(())
}

/// Enqueues and waits for completion (synchronous API calls).
pub fn submit_sync(sim: &'static Sim, s: &StreamRef, op: Op) {
    let seq = submit(sim, s, op);
    sim.engine.wait(s.id, seq);
}

/// Reads a C string argument.
///
/// # Safety
///
/// `p` is NULL or points to a NUL-terminated string that stays alive and unmodified for `'a`.
pub unsafe fn cstr<'a>(p: *const std::ffi::c_char) -> Result<&'a str, CUresult> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: not NULL (checked); NUL-terminated and alive for 'a by the caller's contract.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| CUDA_ERROR_INVALID_VALUE)
}
