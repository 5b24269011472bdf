//! `cuInit`: the shim initialises here, after the real driver did.

use std::ffi::c_uint;

use crate::types::*;

/// # Safety
///
/// The hook contract (`hook_fn!`): `real` is the driver's `cuInit`.
pub unsafe fn cu_init(real: unsafe extern "C" fn(c_uint) -> CUresult, flags: c_uint) -> CUresult {
    // SAFETY: `real` is the driver's `cuInit` (hook contract); `flags` is a plain value.
    let r = unsafe { real(flags) };
    if r != CUDA_SUCCESS {
        return r;
    }
    match crate::state::init() {
        Ok(_) => CUDA_SUCCESS,
        Err(e) => e,
    }
}
