//! Driver ABI types and constants: one table, shared with libshare (`shim_headers::types`).
pub use shim_headers::types::*;
