//! `cuInit`: the shim initialises here, after the real driver did.

use crate::boundary::{rc, R};
use crate::types::*;

pub fn cu_init(call: impl FnOnce() -> CUresult, _flags: u32) -> R {
    if let Some(why) = &crate::driver::driver().error {
        // Said once when loading; every call says which way out there is.
        tracing::debug!("{why}");
    }
    rc(call())?;
    crate::process::init(&crate::ops::REAL).map(|_| ())
}
