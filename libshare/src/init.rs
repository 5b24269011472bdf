//! `cuInit`: the shim initialises here, after the real driver did.

use std::ffi::c_uint;

use crate::types::*;

pub unsafe fn cu_init(real: unsafe extern "C" fn(c_uint) -> CUresult, flags: c_uint) -> CUresult {
    let r = real(flags);
    if r != CUDA_SUCCESS {
        return r;
    }
    match crate::state::init() {
        Ok(_) => CUDA_SUCCESS,
        Err(e) => e,
    }
}
