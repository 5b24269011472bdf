//! Driver ABI types and constants: shared with libshare (`shim_headers::types`).
pub use shim_headers::types::*;
