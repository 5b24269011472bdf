//! Kernel slicing (issue 31, build 3): while production runs on its GPU, an opportunistic
//! `cuLaunchKernel` longer than the latency budget goes as block ranges of its grid, each about
//! half the budget (one runs while the next waits), through the kernel's sliced entry
//! (`libshare_slice`): production, arriving, waits for what is left of the budget instead of the
//! whole kernel. The gate (`gate::launch_kernel`) decides when;
//! this module knows which kernels can and holds their sliced entries.
//!
//! Where the PTX comes from: the image of a `cuModuleLoadData`/`cuModuleLoadDataEx`/
//! `cuModuleLoadFatBinary` or a `cuLibraryLoadData` (cudart's path since CUDA 12: every fatbin
//! a program registers) that is PTX text (NVRTC's output, programs that embed PTX) or a fatbin
//! (or cudart's wrapper of one) with PTX entries (nvcc keeps the PTX of each `compute_XX` it
//! was asked for; its default keeps one), read by `cuda_image::image_ptx` and copied when the
//! process is opportunistic and slicing is on (`LIBSHARE_SLICING`, default on); the program
//! may free its buffer. The slice module is built from the PTX of the highest architecture the
//! device can JIT; where the driver runs a cubin of the same source for the whole kernel, the
//! ranges run that PTX's code (the same program, compiled again). Cubins alone are not read:
//! their kernels go whole and are counted `unsliced` when they would have been cut (PyTorch's
//! and cuBLAS's kernels are cubins only for A100/H100: BENCHMARKS.md, "Kernel slicing"). A
//! library's kernel is known by the handle `cuLibraryGetKernel` gave (cudart launches it as
//! the function) or `cuKernelGetFunction` made of it; `cuLibraryLoadFromFile` is not read.
//!
//! The slice module is built once per module, the first time one of its kernels is to be cut:
//! the PTX rewritten, loaded with the real `cuModuleLoadData` in the current context (the one the
//! kernel is launched in, so the module's), its sliced entries looked up. A module the rewrite
//! cannot read, or the driver does not load, is remembered as such: its kernels go whole. What a
//! function is (its module, its name) is asked of the driver (`cuFuncGetModule`,
//! `cuFuncGetName`) once per function; `cuModuleUnload` forgets the module, its slice module
//! and its functions (a handle the driver reuses is asked again).
//!
//! All of it is on the opportunistic path (a process that may wait anyway): a lock, the
//! driver's JIT once per module, allocations.

use std::collections::HashMap;
use std::ffi::{c_char, c_uint, c_void, CStr, CString};
use std::sync::Mutex;

use cuda_image::PtxModule;
use libshare_abi::Class;
use libshare_slice::{rewrite, Outcome};

use crate::boundary::{rc, CStrArg, Out, R};
use crate::driver::real;
use crate::per_process::PerProcess;
use crate::types::*;

/// A kernel's sliced entry: the function, and how many parameters the kernel itself has (the
/// six of the range follow them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sliced {
    pub f: usize,
    pub params: usize,
}

enum Module {
    /// The PTX its image carried (one text, or a fatbin's entries); no slice module yet.
    Ptx(Vec<PtxModule>),
    /// Its slice module (loaded) and each sliced kernel by name.
    Built {
        slices: usize,
        kernels: HashMap<String, Sliced>,
    },
    /// The rewrite could not read it, or the driver did not load its slice module.
    Whole,
}

#[derive(Default)]
struct Slicer {
    /// By module or library handle.
    modules: HashMap<usize, Module>,
    /// Each function asked about: its module or library, and its sliced entry (None: it goes
    /// whole).
    functions: HashMap<usize, (usize, Option<Sliced>)>,
    /// The kernels libraries handed out (`cuLibraryGetKernel`, and the functions
    /// `cuKernelGetFunction` made of them): their library and name.
    kernels: HashMap<usize, (usize, String)>,
}

static SLICER: PerProcess<Mutex<Slicer>> = PerProcess::new();

/// Whether this process's kernels may be sliced: it is opportunistic and slicing is on.
fn wanted() -> bool {
    crate::process::get()
        .is_some_and(|s| s.cfg.slicing && s.account.state.header().class() == Class::Opportunistic)
}

/// Records the PTX of a module or library just loaded, when this process's kernels may be
/// sliced.
///
/// # Safety
/// `image` is what `cuModuleLoadData` accepts (a fatbin, its wrapper, a cubin or a
/// NUL-terminated PTX text), readable: `cuda_image::image_ptx`'s contract.
unsafe fn note_load(module: Option<*mut c_void>, image: *const c_void) {
    let Some(module) = module.filter(|m| !m.is_null()) else {
        return;
    };
    if !wanted() {
        return;
    }
    // SAFETY: this fn's contract.
    let Ok(ptx) = (unsafe { cuda_image::image_ptx(image as *const u8) }) else {
        return;
    };
    if !ptx.is_empty() {
        let mut s = SLICER.lock();
        forget(&mut s, module as usize);
        s.modules.insert(module as usize, Module::Ptx(ptx));
    }
}

// `image` is the hooked call's argument, valid for the call as the driver API documents it
// (the hook contract, `boundary.rs`); a module image has no length to convert it with.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn load_data(
    call: impl FnOnce() -> CUresult,
    module: Out<CUmodule>,
    image: *const c_void,
) -> R {
    rc(call())?;
    // SAFETY: the driver accepted `image` as a module image (it just loaded it).
    unsafe { note_load(module.get(), image) };
    Ok(())
}

#[allow(clippy::not_unsafe_ptr_arg_deref)] // as for `load_data`
pub fn load_data_ex(
    call: impl FnOnce() -> CUresult,
    module: Out<CUmodule>,
    image: *const c_void,
    _n: c_uint,
    _options: Out<c_uint>,
    _values: Out<*mut c_void>,
) -> R {
    rc(call())?;
    // SAFETY: as in `load_data`.
    unsafe { note_load(module.get(), image) };
    Ok(())
}

#[allow(clippy::not_unsafe_ptr_arg_deref)] // as for `load_data`
#[allow(clippy::too_many_arguments)] // the driver's
pub fn library_load_data(
    call: impl FnOnce() -> CUresult,
    library: Out<CUlibrary>,
    code: *const c_void,
    _jit_options: Out<c_uint>,
    _jit_values: Out<*mut c_void>,
    _n_jit: c_uint,
    _library_options: Out<c_uint>,
    _library_values: Out<*mut c_void>,
    _n_library: c_uint,
) -> R {
    rc(call())?;
    // SAFETY: the driver accepted `code` as a library image (it just loaded it).
    unsafe { note_load(library.get(), code) };
    Ok(())
}

/// A kernel of a library this shim kept the PTX of: remembered with its name.
pub fn library_get_kernel(
    call: impl FnOnce() -> CUresult,
    kernel: Out<CUkernel>,
    library: CUlibrary,
    name: CStrArg,
) -> R {
    rc(call())?;
    if !wanted() {
        return Ok(());
    }
    if let (Some(k), Some(name)) = (kernel.get(), name.to_str()) {
        let mut s = SLICER.lock();
        if s.modules.contains_key(&(library as usize)) {
            s.kernels
                .insert(k as usize, (library as usize, name.to_owned()));
        }
    }
    Ok(())
}

/// The function made of a kernel the shim knows is that kernel.
pub fn kernel_get_function(
    call: impl FnOnce() -> CUresult,
    f: Out<CUfunction>,
    kernel: CUkernel,
) -> R {
    rc(call())?;
    if !wanted() {
        return Ok(());
    }
    if let Some(f) = f.get() {
        let mut s = SLICER.lock();
        if let Some(known) = s.kernels.get(&(kernel as usize)).cloned() {
            s.kernels.insert(f as usize, known);
        }
    }
    Ok(())
}

/// `cuModuleUnload` and `cuLibraryUnload`: the handle's PTX and slice module are forgotten.
pub fn unload(call: impl FnOnce() -> CUresult, module: *mut c_void) -> R {
    let r = rc(call());
    if r.is_ok() {
        forget(&mut SLICER.lock(), module as usize);
    }
    r
}

/// Drops what is known of `module`: its slice module (unloaded), its functions.
fn forget(s: &mut Slicer, module: usize) {
    if let Some(Module::Built { slices, .. }) = s.modules.remove(&module) {
        if let Some(unload) = real().cuModuleUnload {
            // SAFETY: `slices` is a module this shim loaded and has not unloaded.
            unsafe { unload(slices as CUmodule) };
        }
    }
    s.functions.retain(|_, (m, _)| *m != module);
    s.kernels.retain(|_, (m, _)| *m != module);
}

/// The sliced entry of function `f`, if it has one (building its module's slice module the
/// first time); None: it goes whole.
pub fn sliced(f: usize) -> Option<Sliced> {
    let mut s = SLICER.lock();
    if let Some((_, known)) = s.functions.get(&f) {
        return *known;
    }
    let (module, name) = match s.kernels.get(&f) {
        Some(known) => known.clone(),
        None => identify(f)?,
    };
    let found = match s.modules.get_mut(&module) {
        None => None,
        Some(m) => {
            let built = match m {
                Module::Ptx(ptx) => Some(build(ptx)),
                _ => None,
            };
            if let Some(b) = built {
                *m = b;
            }
            match m {
                Module::Built { kernels, .. } => kernels.get(&name).copied(),
                _ => None,
            }
        }
    };
    s.functions.insert(f, (module, found));
    found
}

/// Function `f` will not be sliced again (its first range failed to launch).
pub fn refuse(f: usize) {
    if let Some((_, known)) = SLICER.lock().functions.get_mut(&f) {
        *known = None;
    }
}

/// The module and name of function `f`, as the driver says.
fn identify(f: usize) -> Option<(usize, String)> {
    let (get_module, get_name) = (real().cuFuncGetModule?, real().cuFuncGetName?);
    let mut module: CUmodule = std::ptr::null_mut();
    let mut name: *const c_char = std::ptr::null();
    // SAFETY: `f` is a function the program is launching; the out-pointers are live locals of
    // the written types; the name the driver returns is a NUL-terminated string it keeps.
    unsafe {
        if get_module(&mut module, f as CUfunction) != CUDA_SUCCESS
            || get_name(&mut name, f as CUfunction) != CUDA_SUCCESS
            || name.is_null()
        {
            return None;
        }
        Some((
            module as usize,
            CStr::from_ptr(name).to_str().ok()?.to_owned(),
        ))
    }
}

/// The compute capability (major × 10 + minor) of the current context's device.
fn current_sm() -> Option<u32> {
    const MAJOR: c_uint = 75; // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
    const MINOR: c_uint = 76;
    let (ctx_device, attribute) = (real().cuCtxGetDevice?, real().cuDeviceGetAttribute?);
    let (mut dev, mut major, mut minor): (CUdevice, i32, i32) = (0, 0, 0);
    // SAFETY: live out-pointers of the written types.
    unsafe {
        (ctx_device(&mut dev) == CUDA_SUCCESS
            && attribute(&mut major, MAJOR, dev) == CUDA_SUCCESS
            && attribute(&mut minor, MINOR, dev) == CUDA_SUCCESS)
            .then(|| (major * 10 + minor) as u32)
    }
}

/// The slice module of the PTX the current context's device can JIT, loaded in that
/// context, or `Whole`.
fn build(ptx: &[PtxModule]) -> Module {
    let Some(ptx) = current_sm().and_then(|sm| PtxModule::best_for(ptx, sm)) else {
        return Module::Whole;
    };
    let Ok(r) = rewrite(&ptx.text) else {
        return Module::Whole;
    };
    let (Some(load), Some(get)) = (real().cuModuleLoadData, real().cuModuleGetFunction) else {
        return Module::Whole;
    };
    let Ok(text) = CString::new(r.ptx) else {
        return Module::Whole;
    };
    let mut slices: CUmodule = std::ptr::null_mut();
    // SAFETY: `text` is a NUL-terminated PTX image alive across the call; `slices` a live out.
    if unsafe { load(&mut slices, text.as_ptr() as *const c_void) } != CUDA_SUCCESS {
        return Module::Whole;
    }
    let mut kernels = HashMap::new();
    for k in r.kernels {
        let Outcome::Sliced { entry, params, .. } = k.outcome else {
            continue;
        };
        let Ok(entry) = CString::new(entry) else {
            continue;
        };
        let mut f: CUfunction = std::ptr::null_mut();
        // SAFETY: `slices` was just loaded; `entry` is NUL-terminated; `f` a live out.
        if unsafe { get(&mut f, slices, entry.as_ptr()) } == CUDA_SUCCESS {
            kernels.insert(
                k.name,
                Sliced {
                    f: f as usize,
                    params,
                },
            );
        }
    }
    Module::Built {
        slices: slices as usize,
        kernels,
    }
}
