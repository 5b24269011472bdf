//! What an unimplemented driver function does: log, record, return CUDA_ERROR_NOT_SUPPORTED.

use crate::types::{CUresult, CUDA_ERROR_NOT_SUPPORTED};

pub fn hit(name: &str) -> CUresult {
    crate::warn!("{name} is not implemented by simgpu (returns CUDA_ERROR_NOT_SUPPORTED)");
    crate::log::trace_line(&format!("stub {name}"));
    CUDA_ERROR_NOT_SUPPORTED
}
