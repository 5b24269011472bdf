//! The loader, at the bottom of the shim: glibc's real `dlsym` (never the shim's own export),
//! `dlopen` of a library by path, and the object a symbol address belongs to.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering::*};

/// The real `dlsym`, resolved on first use (read by the naked `dlsym` below).
pub static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

extern "C" {
    fn dlvsym(handle: *mut c_void, symbol: *const c_char, version: *const c_char) -> *mut c_void;
}

/// Finds glibc's `dlsym` (never `_dl_sym` or other private symbols).
pub extern "C" fn resolve_real_dlsym() -> usize {
    let cur = REAL_DLSYM.load(Acquire);
    if cur != 0 {
        return cur;
    }
    #[cfg(target_arch = "x86_64")]
    const BASELINE: &CStr = c"GLIBC_2.2.5";
    #[cfg(target_arch = "aarch64")]
    const BASELINE: &CStr = c"GLIBC_2.17";
    let mut p = std::ptr::null_mut();
    for v in [c"GLIBC_2.34", BASELINE] {
        // SAFETY: `dlvsym` with RTLD_NEXT and NUL-terminated C string literals; it only reads
        // them and the loader's tables.
        p = unsafe { dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), v.as_ptr()) };
        if !p.is_null() {
            break;
        }
    }
    if p.is_null() {
        // No way to resolve anything: fail loudly rather than misbehave.
        eprintln!("libshare: cannot find glibc's dlsym; aborting");
        std::process::abort();
    }
    REAL_DLSYM.store(p as usize, Release);
    p as usize
}

/// Calls the real `dlsym` (from the shim itself: never use for RTLD_NEXT on behalf of others).
///
/// # Safety
/// `dlsym`'s contract: `name` is NULL or a NUL-terminated C string; `handle` is a handle `dlsym`
/// accepts (from `dlopen`, or RTLD_DEFAULT; RTLD_NEXT would resolve relative to the shim).
pub unsafe fn real_dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    // SAFETY: `resolve_real_dlsym` returns the non-zero address of glibc's `dlsym` (it aborts
    // rather than return 0), whose prototype `DlsymFn` is.
    let f: DlsymFn = unsafe { std::mem::transmute::<usize, DlsymFn>(resolve_real_dlsym()) };
    // SAFETY: glibc's `dlsym`, with arguments under its contract (this function's).
    unsafe { f(handle, name) }
}

/// Load address of the object containing `addr` (0 if none). Only asks the loader; never reads `addr`.
#[allow(clippy::not_unsafe_ptr_arg_deref)] // dladdr compares the address, never dereferences it
pub fn object_base(addr: *const c_void) -> usize {
    if addr.is_null() {
        return 0;
    }
    // SAFETY: `dladdr` only looks `addr` up in the loader's tables (never reads it); `info` is a
    // live local (all-zero is a valid Dl_info: integers and NULL pointers) it may write.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(addr, &mut info) == 0 {
            return 0;
        }
        info.dli_fbase as usize
    }
}

/// `dlopen(path, RTLD_NOW | RTLD_LOCAL)`.
pub fn dlopen_local(path: &str) -> *mut c_void {
    let Ok(c) = std::ffi::CString::new(path) else {
        return std::ptr::null_mut();
    };
    // SAFETY: `c` is a NUL-terminated path, alive for the call; the flags are valid.
    unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL as c_int) }
}
