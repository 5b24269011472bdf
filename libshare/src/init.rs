//! `cuInit`: the shim initialises here, after the real driver did.

use crate::boundary::{rc, R};
use crate::types::*;

pub fn cu_init(call: impl FnOnce() -> CUresult, _flags: u32) -> R {
    rc(call())?;
    crate::process::init(&crate::ops::REAL).map(|_| ())
}
