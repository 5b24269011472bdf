//! `dlsym` interposition. cudart `dlopen`s `libcuda.so.1` and resolves through that handle, and
//! cuBLAS/cuBLASLt `dlsym` ~90 driver names directly, so exporting the hooks alone would see none
//! of their calls. The shim's `dlsym` returns a hook instead of the real driver's function for
//! every hooked name; everything else, and every lookup in other libraries, is untouched.
//!
//! `dlsym(RTLD_NEXT, …)` resolves relative to its *caller*, so the shim must not be that caller:
//! `dlsym` is a naked function that *jumps* (never calls) into the real `dlsym` for RTLD_NEXT,
//! leaving the original return address in place. The real `dlsym` comes from
//! `dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34")` (glibc ≥ 2.34), else the baseline version
//! (`loader.rs`).

use std::ffi::{c_char, c_void, CStr};

use crate::loader::{object_base, real_dlsym};

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
#[cfg_attr(not(test), no_mangle)]
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
        real = sym crate::loader::REAL_DLSYM,
        resolve = sym crate::loader::resolve_real_dlsym,
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
#[cfg_attr(not(test), no_mangle)]
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
        real = sym crate::loader::REAL_DLSYM,
        resolve = sym crate::loader::resolve_real_dlsym,
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
    if !(cuda || name.starts_with(b"nvml")) || crate::driver::LOADING.with(|l| l.get()) {
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
        crate::driver::driver().base
    } else {
        crate::nvml::library_base()
    };
    if base != 0 && found_in == base {
        h
    } else {
        p
    }
}
