//! `dlsym` interposition. cudart `dlopen`s `libcuda.so.1` and resolves through that handle, and
//! cuBLAS/cuBLASLt `dlsym` ~90 driver names directly, so exporting the hooks alone would see none
//! of their calls. The shim's `dlsym` returns a hook instead of the real driver's function for
//! every hooked name; everything else, and every lookup in other libraries, is untouched.
//!
//! `dlsym(RTLD_NEXT, …)` resolves relative to its *caller*, so the shim must not be that caller:
//! `dlsym` is a naked function that *jumps* (never calls) into the real `dlsym` for RTLD_NEXT,
//! leaving the original return address in place. The real `dlsym` comes from
//! `dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34")` (glibc ≥ 2.34), else the baseline version.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering::*};

/// The real `dlsym`, resolved on first use (read by the naked `dlsym` below).
static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

extern "C" {
    fn dlvsym(handle: *mut c_void, symbol: *const c_char, version: *const c_char) -> *mut c_void;
}

/// Finds glibc's `dlsym` (never `_dl_sym` or other private symbols).
extern "C" fn resolve_real_dlsym() -> usize {
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

/// `dlsym`, exported. RTLD_NEXT → tail-jump to glibc (the caller's return address is preserved);
/// anything else → `dlsym_hooked`, also by a jump.
///
/// # Safety
/// Same contract as glibc's `dlsym`.
// SAFETY (naked): the body is the whole function and keeps the SysV ABI by hand. It leaves
// through a tail `jmp` with the entry state intact (rdi/rsi = the caller's arguments, rsp at
// the caller's return address, callee-saved registers untouched) into a function of the same
// prototype: glibc's `dlsym` (REAL_DLSYM, non-zero only once it holds that address; an aligned
// 8-byte load, atomic on x86_64) or `dlsym_hooked`. On the slow path it saves rdi/rsi, realigns
// rsp to 16 bytes (entry rsp ≡ 8 mod 16, two pushes and 8 more) for the call to the `extern "C"`
// `resolve_real_dlsym`, which clobbers only caller-saved registers, and restores them before
// the jump to the address it returned in rax.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "cmp rdi, -1",                          // RTLD_NEXT == (void *)-1
        "jne {hooked}",
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "jz 2f",
        "jmp rax",
        "2:",
        "push rdi",
        "push rsi",
        "sub rsp, 8",                           // keep the stack 16-byte aligned for the call
        "call {resolve}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "jmp rax",
        hooked = sym dlsym_hooked,
        real = sym REAL_DLSYM,
        resolve = sym resolve_real_dlsym,
    )
}

/// `dlsym`, exported (aarch64: the caller's return address is in x30, preserved across the jump).
///
/// # Safety
/// Same contract as glibc's `dlsym`.
// SAFETY (naked): the body is the whole function and keeps the AAPCS64 by hand. It leaves
// through a tail branch with the entry state intact (x0/x1 = the caller's arguments, x30 = the
// caller's return address, sp and callee-saved registers untouched) into a function of the same
// prototype: `dlsym_hooked`, or glibc's `dlsym` (REAL_DLSYM, non-zero only once it holds that
// address; an aligned 8-byte load is single-copy atomic). Only x16 (IP0, free for a branch
// target) is used as scratch. On the slow path it saves x0/x1 and x29/x30 in two 16-byte pushes
// (sp stays 16-byte aligned) around the call to the `extern "C"` `resolve_real_dlsym`, and
// restores them before the branch to the address it returned.
#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "cmn x0, #1",
        "b.eq 1f",
        "b {hooked}",
        "1:",
        "adrp x16, {real}",
        "ldr x16, [x16, :lo12:{real}]",
        "cbz x16, 2f",
        "br x16",
        "2:",
        "stp x0, x1, [sp, #-16]!",
        "stp x29, x30, [sp, #-16]!",
        "bl {resolve}",
        "mov x16, x0",
        "ldp x29, x30, [sp], #16",
        "ldp x0, x1, [sp], #16",
        "br x16",
        hooked = sym dlsym_hooked,
        real = sym REAL_DLSYM,
        resolve = sym resolve_real_dlsym,
    )
}

/// Lookups other than RTLD_NEXT: the real result, replaced by the shim's hook when it is a hooked
/// driver (or NVML) function of the real library.
///
/// # Safety
/// `dlsym`'s contract (entered only from the naked `dlsym`, with its caller's arguments).
unsafe extern "C" fn dlsym_hooked(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // SAFETY: the caller's arguments under `dlsym`'s contract, and not RTLD_NEXT (the naked
    // `dlsym` sends that to glibc), so resolving from the shim is the same as from the caller.
    let p = unsafe { real_dlsym(handle, symbol) };
    if p.is_null() || symbol.is_null() {
        return p;
    }
    // SAFETY: not NULL (checked), so a NUL-terminated C string by `dlsym`'s contract.
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    let cuda = name.starts_with(b"cu");
    if !(cuda || name.starts_with(b"nvml")) || crate::state::LOADING.with(|l| l.get()) {
        return p;
    }
    let Ok(name) = std::str::from_utf8(name) else {
        return p;
    };
    // Only a hooked name may touch the driver: `dlsym(h, "curl_easy_init")` must not load libcuda.
    let hook = if cuda {
        crate::hooks::hook_ptr(name)
    } else {
        crate::nvml::hook_ptr(name)
    };
    let Some(h) = hook else { return p };
    let found_in = object_base(p);
    if found_in == object_base(h) {
        return p; // resolved to the shim's own export (it is preloaded): already the hook
    }
    let base = if cuda {
        crate::state::driver().base
    } else {
        crate::nvml::library_base()
    };
    if base != 0 && found_in == base {
        h
    } else {
        p
    }
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
