//! Modules and libraries (fatbin, cubin or PTX images), kernels/functions and `__device__`
//! globals. `CUlibrary` and `CUmodule` are the same object here, and so are `CUkernel` and
//! `CUfunction`: cudart launches a `CUkernel` as a `CUfunction` without converting it.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::{c_char, c_void};
use std::sync::Arc;

use super::{cstr, current_ctx, out, R};
use crate::driver;
use crate::image::{ImageInfo, ParamInfo};
pub use crate::model::module::{Function, Module};
use crate::sim::sim;
use crate::types::*;

/// Storage given to a global of an image simgpu could not parse.
const LENIENT_GLOBAL_BYTES: u64 = 64 << 10;

/// Safety: `pm` is NULL or writable; `image` is NULL or an image the driver API accepts
/// (fatbin wrapper, fatbin, cubin, PTX), readable as far as its own headers say.
unsafe fn load(pm: *mut *mut c_void, image: *const c_void) -> R {
    if pm.is_null() || image.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let sm = current_sm()?;
    // SAFETY: `image` is not NULL (checked) and an accepted image (this fn's contract); `pm` is
    // not NULL (checked), so writable.
    unsafe {
        register(
            pm,
            crate::image::parse_image_for_arch(image as *const u8, sm),
        )
    }
}

/// Safety: `pm` is writable (NOT NULL: unlike `load`, NULL is not checked here); `path` is NULL or
/// NUL-terminated.
unsafe fn load_file(pm: *mut *mut c_void, path: *const c_char) -> R {
    // SAFETY: `path` is NULL or NUL-terminated (this fn's contract).
    let path = unsafe { cstr(path)? };
    if pm.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let data = std::fs::read(path).map_err(|_| CUDA_ERROR_NOT_FOUND)?;
    // SAFETY: `pm` is not NULL (checked above), so writable (this fn's contract).
    unsafe { register(pm, crate::image::parse_bytes_for_arch(&data, current_sm()?)) }
}

/// Compute capability (major × 10 + minor) of the device whose cubins are used: the current
/// context's, else device 0 (libraries are context-independent).
fn current_sm() -> Result<u32, CUresult> {
    let s = sim()?;
    let dev = super::current_ctx_opt().map_or(0, |c| c.device);
    let (major, minor) = s.cfg.devices[dev].compute_capability;
    Ok(major * 10 + minor)
}

/// Registers a parsed module. Libraries are context-independent: no current context is needed
/// (cudart loads them from threads that never made a context current).
///
/// Safety: `pm` is writable (not NULL).
unsafe fn register(pm: *mut *mut c_void, parsed: Result<ImageInfo, crate::image::ImageError>) -> R {
    let s = sim()?;
    let (info, lenient) = match parsed {
        Ok(i) => (i, false),
        Err(e) => {
            crate::warn!("module image not understood ({e}); kernels will resolve by name with unknown parameters");
            (ImageInfo::default(), true)
        }
    };
    let m = Arc::new(Module {
        info,
        lenient,
        globals: Mutex::new(HashMap::new()),
        functions: Mutex::new(HashMap::new()),
    });
    let h = s.modules.insert(m);
    // SAFETY: `pm` is writable (this fn's contract).
    unsafe { *pm = h as *mut c_void };
    Ok(())
}

unsafe fn unload(h: *mut c_void) -> R {
    let s = sim()?;
    let m = s
        .modules
        .remove(h as usize)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    for (_, f) in m.functions.lock().drain() {
        s.functions.remove(f);
    }
    for (_, (p, _)) in m.globals.lock().drain() {
        let _ = super::memory::free_device(p);
    }
    Ok(())
}

/// The function named `name` in module `h` (created on first request).
///
/// Safety: `pf` is NULL or writable; `name` is NULL or NUL-terminated (cuModuleGetFunction's
/// contract).
unsafe fn get_function(pf: *mut *mut c_void, h: *mut c_void, name: *const c_char) -> R {
    let s = sim()?;
    let m = s.modules.get(h as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    // SAFETY: `name` is NULL or NUL-terminated (this fn's contract).
    let name = unsafe { cstr(name)? };
    if let Some(f) = m.functions.lock().get(name) {
        // SAFETY: `pf` is NULL or writable (this fn's contract).
        return unsafe { out(pf, *f as *mut c_void) };
    }
    let params = match m.info.kernels.iter().find(|k| k.name == name) {
        Some(k) => k.params.clone(),
        None if m.lenient => None,
        None => return Err(CUDA_ERROR_NOT_FOUND),
    };
    let f = function_handle(&m, h as usize, name, params)?;
    // SAFETY: `pf` is NULL or writable (this fn's contract).
    unsafe { out(pf, f as *mut c_void) }
}

/// The handle of function `name` of module `m` (handle `h`), registered on first request so
/// that every way of reaching a function yields the same handle.
fn function_handle(
    m: &Module,
    h: usize,
    name: &str,
    params: Option<Vec<ParamInfo>>,
) -> Result<usize, CUresult> {
    let s = sim()?;
    let mut functions = m.functions.lock();
    if let Some(f) = functions.get(name) {
        return Ok(*f);
    }
    let fh = s.functions.insert(Arc::new(Function {
        name: name.to_string(),
        params,
        module: h,
        attrs: Mutex::new(HashMap::new()),
        legacy: Mutex::new(Default::default()),
    }));
    functions.insert(name.to_string(), fh);
    Ok(fh)
}

/// Handles of every kernel of module `h`, in image order (registered as by
/// `cuModuleGetFunction`). A module whose image was not understood has no known kernels.
pub fn all_functions(h: usize) -> Result<Vec<usize>, CUresult> {
    let m = sim()?.modules.get(h).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    m.info
        .kernels
        .iter()
        .map(|k| function_handle(&m, h, &k.name, k.params.clone()))
        .collect()
}

/// Safety: `dptr` and `bytes` are NULL or writable; `name` is NULL or NUL-terminated
/// (cuModuleGetGlobal's contract).
unsafe fn get_global(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    h: *mut c_void,
    name: *const c_char,
) -> R {
    let s = sim()?;
    let m = s.modules.get(h as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    // SAFETY: `name` is NULL or NUL-terminated (this fn's contract).
    let name = unsafe { cstr(name)? };
    let mut globals = m.globals.lock();
    let (p, size) = match globals.get(name) {
        Some(g) => *g,
        None => {
            let g = m.info.globals.iter().find(|g| g.name == name);
            // An image we could not parse: give the name zeroed storage of a generous size.
            let (size, init) = match g {
                Some(g) => (g.size.max(1), g.init.as_deref()),
                None if m.lenient => (LENIENT_GLOBAL_BYTES, None),
                None => return Err(CUDA_ERROR_NOT_FOUND),
            };
            let ctx = super::current_ctx_opt();
            let dev = ctx.as_ref().map_or(0, |c| c.device);
            let p = super::memory::alloc_on(
                dev,
                ctx.as_ref()
                    .map_or(0, |c| std::sync::Arc::as_ptr(c) as usize),
                size,
                0,
            )?;
            if let Some(init) = init {
                // SAFETY: `p` is a fresh allocation of at least `size` bytes from `alloc_on`
                // (nothing else uses it yet) and at most `size` bytes are copied from `init`,
                // Rust memory of the parsed image.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        init.as_ptr(),
                        p as *mut u8,
                        init.len().min(size as usize),
                    )
                };
            }
            globals.insert(name.to_string(), (p, size));
            (p, size)
        }
    };
    // SAFETY: each out-pointer is written only when not NULL, and then it is writable (this
    // fn's contract).
    unsafe {
        if !dptr.is_null() {
            *dptr = p;
        }
        if !bytes.is_null() {
            *bytes = size as usize;
        }
    }
    Ok(())
}

pub fn function(h: *mut c_void) -> Result<Arc<Function>, CUresult> {
    sim()?
        .functions
        .get(h as usize)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)
}

/// `cuFuncGetAttribute` answers (CUfunction_attribute ids).
fn func_attr(f: &Function, attr: i32) -> Result<i32, CUresult> {
    if let Some(v) = f.attrs.lock().get(&attr) {
        return Ok(*v);
    }
    Ok(match attr {
        0 => 1024, // max threads per block
        1 => 0,    // static shared bytes
        2 => 0,    // const bytes
        3 => 0,    // local bytes
        4 => 32,   // registers
        5 => 80,   // PTX version
        6 => 80,   // binary version
        7 => 0,    // cache mode ca
        8 => 0,    // max dynamic shared bytes
        9 => -1,   // preferred shared carveout
        // Newer attributes (cluster sizes, scheduling policy, …): defaults.
        10..=63 => 0,
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    })
}

/// Runs a load that JIT options came with, then fills their outputs (wall time, logs) as the
/// JIT does (`link::JitOutputs`).
///
/// Safety: `JitOutputs::read`'s, for the call's duration.
unsafe fn with_jit_outputs(
    n: u32,
    opts: *mut u32,
    vals: *mut *mut c_void,
    load: impl FnOnce() -> R,
) -> R {
    // SAFETY: this fn's contract.
    let jit = unsafe { super::link::JitOutputs::read(n, opts, vals)? };
    let start = std::time::Instant::now();
    let r = load();
    let error = if r.is_err() {
        "error   : not a valid PTX, cubin or fatbin image\n"
    } else {
        ""
    };
    // SAFETY: as above; the options stay valid for the call.
    unsafe { jit.write(start.elapsed(), "", error) };
    r
}

driver! {
    fn cuModuleLoadData(pm: *mut *mut c_void, image: *const c_void) {
        load(pm, image)
    }
    fn cuModuleLoadDataEx(pm: *mut *mut c_void, image: *const c_void, n: u32, opts: *mut u32, vals: *mut *mut c_void) {
        with_jit_outputs(n, opts, vals, || load(pm, image))
    }
    fn cuModuleLoadFatBinary(pm: *mut *mut c_void, image: *const c_void) {
        load(pm, image)
    }
    fn cuModuleLoad(pm: *mut *mut c_void, path: *const c_char) {
        load_file(pm, path)
    }
    fn cuModuleUnload(h: *mut c_void) {
        unload(h)
    }
    fn cuModuleGetFunction(pf: *mut *mut c_void, h: *mut c_void, name: *const c_char) {
        get_function(pf, h, name)
    }
    fn cuModuleGetGlobal_v2(dptr: *mut CUdeviceptr, bytes: *mut usize, h: *mut c_void, name: *const c_char) {
        get_global(dptr, bytes, h, name)
    }
    fn cuModuleGetFunctionCount(count: *mut u32, h: *mut c_void) {
        let m = sim()?.modules.get(h as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        out(count, m.info.kernels.len() as u32)
    }
    fn cuLibraryLoadData(pl: *mut *mut c_void, code: *const c_void, jo: *mut u32, jv: *mut *mut c_void, nj: u32,
                         _lo: *mut u32, _lv: *mut *mut c_void, _nl: u32) {
        with_jit_outputs(nj, jo, jv, || load(pl, code))
    }
    fn cuLibraryLoadFromFile(pl: *mut *mut c_void, path: *const c_char, jo: *mut u32, jv: *mut *mut c_void, nj: u32,
                             _lo: *mut u32, _lv: *mut *mut c_void, _nl: u32) {
        with_jit_outputs(nj, jo, jv, || load_file(pl, path))
    }
    fn cuLibraryUnload(h: *mut c_void) {
        unload(h)
    }
    fn cuLibraryGetKernel(pk: *mut *mut c_void, h: *mut c_void, name: *const c_char) {
        get_function(pk, h, name)
    }
    fn cuLibraryGetModule(pm: *mut *mut c_void, h: *mut c_void) {
        sim()?.modules.get(h as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        out(pm, h)
    }
    fn cuLibraryGetGlobal(dptr: *mut CUdeviceptr, bytes: *mut usize, h: *mut c_void, name: *const c_char) {
        get_global(dptr, bytes, h, name)
    }
    fn cuLibraryGetManaged(dptr: *mut CUdeviceptr, bytes: *mut usize, h: *mut c_void, name: *const c_char) {
        get_global(dptr, bytes, h, name)
    }
    fn cuLibraryGetKernelCount(count: *mut u32, h: *mut c_void) {
        let m = sim()?.modules.get(h as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        out(count, m.info.kernels.len() as u32)
    }
    fn cuKernelGetFunction(pf: *mut *mut c_void, k: *mut c_void) {
        function(k)?;
        out(pf, k)
    }
    fn cuKernelGetLibrary(pl: *mut *mut c_void, k: *mut c_void) {
        out(pl, function(k)?.module as *mut c_void)
    }
    fn cuKernelGetName(name: *mut *const c_char, k: *mut c_void) {
        let f = function(k)?;
        // Leaked once per call site that asks; names are few.
        let c = std::ffi::CString::new(f.name.clone()).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        out(name, c.into_raw() as *const c_char)
    }
    fn cuKernelGetAttribute(v: *mut i32, attr: i32, k: *mut c_void, _dev: CUdevice) {
        out(v, func_attr(&*function(k)?, attr)?)
    }
    fn cuKernelSetAttribute(attr: i32, v: i32, k: *mut c_void, _dev: CUdevice) {
        function(k)?.attrs.lock().insert(attr, v);
        Ok(())
    }
    fn cuKernelSetCacheConfig(k: *mut c_void, _cfg: u32, _dev: CUdevice) {
        function(k)?;
        Ok(())
    }
    fn cuKernelGetParamInfo(k: *mut c_void, index: usize, offset: *mut usize, size: *mut usize) {
        let f = function(k)?;
        let p = f.params.as_ref().and_then(|p| p.get(index)).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        out(offset, p.offset as usize)?;
        out(size, p.size as usize)
    }
    fn cuFuncGetParamInfo(k: *mut c_void, index: usize, offset: *mut usize, size: *mut usize) {
        let f = function(k)?;
        let p = f.params.as_ref().and_then(|p| p.get(index)).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        out(offset, p.offset as usize)?;
        out(size, p.size as usize)
    }
    fn cuFuncGetAttribute(v: *mut i32, attr: i32, f: *mut c_void) {
        out(v, func_attr(&*function(f)?, attr)?)
    }
    fn cuFuncSetAttribute(f: *mut c_void, attr: i32, v: i32) {
        function(f)?.attrs.lock().insert(attr, v);
        Ok(())
    }
    fn cuFuncSetCacheConfig(f: *mut c_void, _cfg: u32) {
        function(f)?;
        Ok(())
    }
    fn cuFuncSetSharedMemConfig(f: *mut c_void, _cfg: u32) {
        function(f)?;
        Ok(())
    }
    fn cuFuncGetModule(pm: *mut *mut c_void, f: *mut c_void) {
        out(pm, function(f)?.module as *mut c_void)
    }
    fn cuFuncGetName(name: *mut *const c_char, f: *mut c_void) {
        let f = function(f)?;
        let c = std::ffi::CString::new(f.name.clone()).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        out(name, c.into_raw() as *const c_char)
    }
    fn cuFuncIsLoaded(state: *mut u32, f: *mut c_void) {
        function(f)?;
        out(state, 1)
    }
    fn cuFuncLoad(f: *mut c_void) {
        function(f).map(|_| ())
    }
    fn cuOccupancyMaxActiveBlocksPerMultiprocessor(n: *mut i32, f: *mut c_void, block: i32, _smem: usize) {
        function(f)?;
        out(n, blocks_per_sm(block.max(1) as u32) as i32)
    }
    fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(n: *mut i32, f: *mut c_void, block: i32, _smem: usize, _flags: u32) {
        function(f)?;
        out(n, blocks_per_sm(block.max(1) as u32) as i32)
    }
    fn cuOccupancyMaxPotentialBlockSize(min_grid: *mut i32, block: *mut i32, f: *mut c_void, _cb: *mut c_void, _smem: usize, limit: i32) {
        function(f)?;
        let s = sim()?;
        let sms = s.cfg.devices[current_ctx()?.device].sm_count as i32;
        let b = if limit > 0 { limit.min(1024) } else { 1024 };
        out(block, b)?;
        out(min_grid, sms * blocks_per_sm(b as u32) as i32)
    }
    fn cuOccupancyMaxPotentialBlockSizeWithFlags(min_grid: *mut i32, block: *mut i32, f: *mut c_void, _cb: *mut c_void, _smem: usize, limit: i32, _flags: u32) {
        function(f)?;
        let s = sim()?;
        let sms = s.cfg.devices[current_ctx()?.device].sm_count as i32;
        let b = if limit > 0 { limit.min(1024) } else { 1024 };
        out(block, b)?;
        out(min_grid, sms * blocks_per_sm(b as u32) as i32)
    }
    fn cuOccupancyAvailableDynamicSMemPerBlock(size: *mut usize, f: *mut c_void, _blocks: i32, _block: i32) {
        function(f)?;
        out(size, 166912)
    }
}

/// Resident blocks per SM for a block of `threads` threads (2048 threads, at most 32 blocks).
pub fn blocks_per_sm(threads: u32) -> u32 {
    (2048 / threads.max(1)).clamp(1, 32)
}
