//! Driver ABI types and constants: shared with libshare (`shim_headers::types`).
pub use shim_headers::types::*;

/// Result codes simgpu returns beyond the ones the shim shares (values from `cuda.h`).
pub const CUDA_ERROR_ARRAY_IS_MAPPED: CUresult = 207;
pub const CUDA_ERROR_PEER_ACCESS_NOT_ENABLED: CUresult = 705;
pub const CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE: CUresult = 910;
pub const CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: CUresult = 712;
pub const CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED: CUresult = 713;
