//! `libshare.so` — preloaded into unmodified CUDA processes (`LD_PRELOAD` or `/etc/ld.so.preload`).
//!
//! Layers, each importing only from the ones below it (`tests/layers.rs` keeps it so; only
//! `hooks` ↔ `procaddr` are mutual: `cuGetProcAddress` hands out hooks):
//!
//! ```text
//! hooks (exports, from list.rs) · procaddr · interpose (dlsym) · nvml      the job's entry points
//! init · memory · graph_mem · launch · transfer · sync                     handlers (safe fns)
//! context · rate                                                           contexts, launch seam
//! ledger · gate                                                            quota ledger, the gate
//! pools · deferred · pin · host_mem                                        pools, frees, the pin bound
//! process (Shim, Account, init/exit/fork) · config                         this process
//! ops (DriverOps) · driver (Real, from list.rs) · per_process · boundary   driver, tables, FFI
//! loader · list · macros                                                   the bottom
//! ```
//! Rules (design §3.2): nothing runs until the first CUDA call; no allocation, lock, syscall or
//! logging on the launch path; fork-safe; a panic never crosses into the job.

#![allow(non_snake_case)]

#[macro_use]
mod macros;
#[macro_use]
mod list;

pub mod boundary;
pub mod config;
pub mod context;
pub mod deferred;
pub mod demote;
pub mod devmap;
pub mod driver;
pub mod gate;
pub mod graph_mem;
pub mod hooks;
pub mod host_mem;
pub mod init;
pub mod interpose;
pub mod launch;
pub mod ledger;
pub mod loader;
pub mod memory;
pub mod nvml;
pub mod nvml_real;
pub mod ops;
pub mod per_process;
pub mod pin;
pub mod pools;
pub mod procaddr;
pub mod process;
pub mod rate;
pub mod register;
pub mod slicing;
pub mod sync;
pub mod transfer;

pub use shim_headers::types;

/// Runs a hook body; a panic becomes CUDA_ERROR_UNKNOWN (one line on stderr) instead of
/// unwinding into the job.
#[inline(always)]
pub fn guard(name: &str, f: impl FnOnce() -> types::CUresult) -> types::CUresult {
    shim_headers::guard(name, types::CUDA_ERROR_UNKNOWN, f)
}
