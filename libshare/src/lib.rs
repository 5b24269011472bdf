//! `libshare.so` — preloaded into unmodified CUDA processes (`LD_PRELOAD` or `/etc/ld.so.preload`).
//!
//! - `hooks.rs`: THE list of hooked driver functions (one line each); `macros.rs` expands it.
//! - `interpose.rs`: `dlsym` (how cudart/cuBLAS find the driver), `procaddr.rs`: `cuGetProcAddress`.
//! - `memory.rs`: the quota on every allocation path (`cuMemAlloc_v2` → `memory::alloc`);
//!   `deferred.rs`: stream-ordered frees return their charge when the stream reaches them;
//!   `graph_mem.rs`: CUDA-graph memory stays charged while a graph holds it;
//!   `pools.rs`: stream-ordered allocations are charged by what their pool reserves.
//! - `launch.rs`: launch accounting (the rate gate comes with the daemon).
//! - `state.rs`: lazy per-process state, the real driver, fork/exit handling; the shared-memory
//!   layout itself is `libshare-abi`.
//! - `config.rs`: `LIBSHARE_*` and HAMi-core variables.
//!
//! Rules (design §3.2): nothing runs until the first CUDA call; no allocation, lock, syscall or
//! logging on the launch path; fork-safe; a panic never crosses into the job.

#![allow(non_snake_case)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod config;
pub mod deferred;
pub mod graph_mem;
pub mod hooks;
pub mod init;
pub mod interpose;
pub mod launch;
mod macros;
pub mod memory;
pub mod nvml;
pub mod pools;
pub mod procaddr;
pub mod state;

pub use shim_headers::types;

/// Runs a hook body; a panic becomes CUDA_ERROR_UNKNOWN instead of unwinding into the job.
#[inline]
pub fn guard(name: &str, f: impl FnOnce() -> types::CUresult) -> types::CUresult {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => {
            eprintln!("libshare: internal error in {name}; returning CUDA_ERROR_UNKNOWN");
            999
        }
    }
}
