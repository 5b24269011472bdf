//! Loaded modules and their functions as the simulator holds them (`Sim::modules`,
//! `Sim::functions`). `CUlibrary` and `CUmodule` are the same object, and so are `CUkernel` and
//! `CUfunction`; the exports are `driver/module.rs` and `driver/launch.rs`.

use parking_lot::Mutex;
use std::collections::HashMap;

use crate::image::{ImageInfo, ParamInfo};
use crate::types::*;

pub struct Module {
    pub info: ImageInfo,
    /// The image could not be parsed: any kernel name resolves (with unknown parameters).
    pub lenient: bool,
    /// Globals materialised in device memory: name -> (address, size).
    pub globals: Mutex<HashMap<String, (u64, u64)>>,
    pub functions: Mutex<HashMap<String, usize>>,
}

pub struct Function {
    pub name: String,
    pub params: Option<Vec<ParamInfo>>,
    pub module: usize,
    pub attrs: Mutex<HashMap<i32, i32>>,
    /// What the deprecated execution-control API set on the function (`launch.rs`).
    pub legacy: Mutex<Legacy>,
}

/// The parameter space of the deprecated execution-control API, bytes (CUDA's 4 KiB of kernel
/// parameters).
pub const PARAM_SPACE: usize = 4096;

/// What the deprecated execution-control API (CUDA 2.x/3.x) sets on a function for its next
/// `cuLaunch` / `cuLaunchGrid` / `cuLaunchGridAsync`: the block shape (`cuFuncSetBlockShape`;
/// none set is an invalid launch), the dynamic shared memory (`cuFuncSetSharedSize`) and the
/// parameter buffer (`cuParamSet*` write at byte offsets; `cuParamSetSize` says how many of its
/// bytes are the parameters: the kernel sees zeros after them).
#[derive(Default)]
pub struct Legacy {
    pub block: [u32; 3],
    pub shared: u32,
    pub size: usize,
    /// `PARAM_SPACE` bytes once anything was written (zero-filled), else empty.
    pub buf: Vec<u8>,
}

impl Legacy {
    /// Copies `bytes` into the parameter buffer at `offset`.
    pub fn write(&mut self, offset: i32, bytes: &[u8]) -> Result<(), CUresult> {
        let at = usize::try_from(offset).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        if at
            .checked_add(bytes.len())
            .is_none_or(|end| end > PARAM_SPACE)
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        self.buf.resize(PARAM_SPACE, 0);
        self.buf[at..at + bytes.len()].copy_from_slice(bytes);
        Ok(())
    }
}
