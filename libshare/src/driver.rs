//! The real CUDA driver: opened by path (`LIBSHARE_REAL_LIBCUDA`, else the normal search for
//! `libcuda.so.1`, never the shim itself), with its entry points for every function of the hook
//! list (`Real`, expanded from `list.rs`).

use std::ffi::{c_char, c_uint, c_void, CStr};
use std::sync::OnceLock;

use crate::loader::{dlopen_local, object_base, real_dlsym};
use crate::types::*;

driver_hooks!(real_table);

/// The real driver, loaded once per process (a forked child keeps it: the mapping is inherited).
pub struct Driver {
    pub handle: *mut c_void,
    /// Load address of the real driver (to recognise its symbols in `dlsym`).
    pub base: usize,
    pub real: Real,
    /// Why the driver could not be loaded (every hook then answers CUDA_ERROR_NOT_SUPPORTED
    /// after saying this once).
    pub error: Option<String>,
}

// SAFETY: every field is immutable after loading (the driver lives in a OnceLock); the only
// non-Send/Sync fields are the `dlopen` handle, usable from any thread, and function pointers.
unsafe impl Send for Driver {}
// SAFETY: as for Send: shared access only reads immutable fields.
unsafe impl Sync for Driver {}

static DRIVER: OnceLock<Driver> = OnceLock::new();

thread_local! {
    /// Set while this thread loads the driver: `dlsym` calls made by the driver's own
    /// initialisation must not re-enter the loader.
    pub static LOADING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

pub fn driver() -> &'static Driver {
    DRIVER.get_or_init(|| {
        LOADING.with(|l| l.set(true));
        let d = load_driver();
        LOADING.with(|l| l.set(false));
        d
    })
}

/// The real entry points (all None if the driver could not be loaded).
#[inline]
pub fn real() -> &'static Real {
    &driver().real
}

fn load_driver() -> Driver {
    let path = std::env::var("LIBSHARE_REAL_LIBCUDA").unwrap_or_else(|_| "libcuda.so.1".into());
    let empty = |why: String| {
        eprintln!("libshare: {why}");
        Driver {
            handle: std::ptr::null_mut(),
            base: 0,
            // SAFETY: a lookup that always returns NULL: an all-None table, nothing transmuted.
            real: unsafe { Real::load(|_| std::ptr::null_mut()) },
            error: Some(why),
        }
    };
    let h = dlopen_local(&path);
    if h.is_null() {
        return empty(format!("cannot load the CUDA driver {path} (set LIBSHARE_REAL_LIBCUDA to NVIDIA's libcuda.so.1)"));
    }
    // SAFETY: `h` is a non-NULL handle from `dlopen`; `name` a NUL-terminated C string.
    let lookup = |name: &CStr| unsafe { real_dlsym(h, name.as_ptr()) };
    let init = lookup(c"cuInit");
    if init.is_null() {
        return empty(format!(
            "{path} is not a CUDA driver (it has no cuInit): set LIBSHARE_REAL_LIBCUDA to NVIDIA's libcuda.so.1"
        ));
    }
    let base = object_base(init);
    if base == object_base(load_driver as *const () as *const c_void) {
        return empty(format!(
            "{path} is libshare itself: set LIBSHARE_REAL_LIBCUDA to NVIDIA's libcuda.so.1"
        ));
    }
    // SAFETY: `h` is the real driver (not the shim, checked above), and `lookup` returns NULL or
    // its export of the name asked, which has the prototype of the declaration list (the CUDA
    // headers; checked by the `hooks` tests).
    let real = unsafe { Real::load(lookup) };
    Driver {
        handle: h,
        base,
        real,
        error: None,
    }
}
