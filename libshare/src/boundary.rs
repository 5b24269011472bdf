//! The boundary between the job's raw arguments and the shim's safe handlers, crossed once in
//! `hook_fn!` (as ZLUDA's `FromCuda`): a pointer to plain ABI data becomes a NULL-checked
//! [`Out`] (`*mut T`) or [`In`] (`*const T`) valid for the one call, a C string a [`CStrArg`]; handles and scalars stay
//! values (holding a handle is safe, only the driver dereferences it). Handlers return [`R`].

use std::ffi::{c_char, c_void, CStr};
use std::marker::PhantomData;

use crate::types::*;

/// A handler's result: `Err` carries a non-zero `CUresult`.
pub type R = Result<(), CUresult>;

/// `CUresult` → [`R`].
#[inline(always)]
pub fn rc(code: CUresult) -> R {
    if code == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(code)
    }
}

/// [`R`] → `CUresult`.
#[inline(always)]
pub fn code(r: R) -> CUresult {
    match r {
        Ok(()) => CUDA_SUCCESS,
        Err(e) => e,
    }
}

/// The lifetime of one hooked call: `Out`/`In` borrow it, so they cannot outlive the call.
pub struct Scope;

/// Plain data of the CUDA ABI that the shim may read and write through a caller's pointer.
///
/// # Safety
/// Every bit pattern the driver or the caller may leave in it is a valid value (integers,
/// raw pointers, `#[repr(C)]` structs of those).
pub unsafe trait Pod: Copy {}

// SAFETY: integers and raw pointers: every bit pattern is valid.
unsafe impl Pod for u32 {}
// SAFETY: as above.
unsafe impl Pod for i32 {}
// SAFETY: as above.
unsafe impl Pod for u64 {}
// SAFETY: as above.
unsafe impl Pod for usize {}
// SAFETY: as above (an opaque handle written by the driver).
unsafe impl Pod for *mut c_void {}
// SAFETY: `#[repr(C)]` structs of integers and raw pointers (shim-headers' ABI types).
unsafe impl Pod for ArrayDesc {}
// SAFETY: as above.
unsafe impl Pod for ArrayDescV1 {}
// SAFETY: as above.
unsafe impl Pod for Array3DDesc {}
// SAFETY: as above.
unsafe impl Pod for Array3DDescV1 {}
// SAFETY: as above.
unsafe impl Pod for MemAllocationProp {}
// SAFETY: as above.
unsafe impl Pod for MemAllocNodeParams {}
// SAFETY: as above (the union is read as bytes and integers only).
unsafe impl Pod for GraphNodeParams {}
// SAFETY: as above.
unsafe impl Pod for LaunchConfig {}
// SAFETY: as above.
unsafe impl Pod for LaunchParams {}

/// A caller's out (or in/out) pointer for one call: NULL-checked reads and writes.
pub struct Out<'a, T>(*mut T, PhantomData<&'a Scope>);

impl<T: Pod> Out<'_, T> {
    pub fn is_null(&self) -> bool {
        self.0.is_null()
    }
    /// The value behind the pointer (None if NULL).
    pub fn get(&self) -> Option<T> {
        // SAFETY: `Out` is made only by `hook_fn!` from the caller's pointer, which the API
        // documents as NULL or valid for this call (which `'a` outlives no further); `T: Pod`.
        (!self.0.is_null()).then(|| unsafe { self.0.read() })
    }
    /// The `n` values of an array at the pointer (None if NULL).
    ///
    /// # Safety
    /// The call's API documents the pointer as an array of (at least) `n` elements.
    pub unsafe fn array(&self, n: usize) -> Option<&[T]> {
        // SAFETY: not NULL (checked); `n` elements readable for this call (this fn's contract),
        // initialised by the caller; `T: Pod`. The slice borrows `self`, which lives no longer
        // than the call.
        (!self.0.is_null()).then(|| unsafe { std::slice::from_raw_parts(self.0, n) })
    }
    /// The pointer itself, for a reader within this call that follows the call's documented
    /// layout (a kernel's `kernelParams`: `demote::remote_bytes`).
    pub fn raw(&self) -> *mut T {
        self.0
    }
    /// Writes `v` (false if NULL).
    pub fn set(&self, v: T) -> bool {
        if self.0.is_null() {
            return false;
        }
        // SAFETY: as in `get`: a writable out-pointer for this call.
        unsafe { self.0.write(v) };
        true
    }
}

/// A caller's in-pointer for one call: NULL-checked reads.
pub struct In<'a, T>(*const T, PhantomData<&'a Scope>);

impl<T: Pod> In<'_, T> {
    pub fn is_null(&self) -> bool {
        self.0.is_null()
    }
    /// The value behind the pointer (None if NULL).
    pub fn get(&self) -> Option<T> {
        // SAFETY: as `Out::get`: readable and initialised for this call, or NULL.
        (!self.0.is_null()).then(|| unsafe { self.0.read() })
    }
}

/// A caller's C string (`*const c_char`: `cuGetProcAddress`'s symbol) for one call: read
/// NULL-checked as UTF-8; the caller's pointer stays available to hand back to the driver.
#[derive(Clone, Copy)]
pub struct CStrArg<'a>(*const c_char, PhantomData<&'a Scope>);

impl<'a> CStrArg<'a> {
    /// The string (None: NULL or not UTF-8).
    pub fn to_str(&self) -> Option<&'a str> {
        if self.0.is_null() {
            return None;
        }
        // SAFETY: `CStrArg` is made only by `hook_fn!` from the caller's argument, which the API
        // documents as a NUL-terminated string valid for this call (which `'a` outlives no
        // further); not NULL (checked).
        unsafe { CStr::from_ptr(self.0) }.to_str().ok()
    }

    /// The caller's pointer, unchanged (for the driver).
    pub fn as_ptr(&self) -> *const c_char {
        self.0
    }
}

/// The conversion `hook_fn!` applies to each argument.
pub trait FromCuda<'a> {
    type Safe;
    /// # Safety
    /// `self` is an argument of a hooked call, valid as the CUDA API documents for that call,
    /// and the result does not outlive `scope` (the call).
    unsafe fn at_boundary(self, scope: &'a Scope) -> Self::Safe;
}

impl<'a, T: Pod> FromCuda<'a> for *mut T {
    type Safe = Out<'a, T>;
    #[inline(always)]
    unsafe fn at_boundary(self, _: &'a Scope) -> Out<'a, T> {
        Out(self, PhantomData)
    }
}

impl<'a> FromCuda<'a> for *const c_char {
    type Safe = CStrArg<'a>;
    #[inline(always)]
    unsafe fn at_boundary(self, _: &'a Scope) -> CStrArg<'a> {
        CStrArg(self, PhantomData)
    }
}

impl<'a, T: Pod> FromCuda<'a> for *const T {
    type Safe = In<'a, T>;
    #[inline(always)]
    unsafe fn at_boundary(self, _: &'a Scope) -> In<'a, T> {
        In(self, PhantomData)
    }
}

macro_rules! as_value {
    ($($t:ty),*) => {$(
        impl<'a> FromCuda<'a> for $t {
            type Safe = $t;
            #[inline(always)]
            unsafe fn at_boundary(self, _: &'a Scope) -> $t {
                self
            }
        }
    )*};
}
// Scalars, handles (`*mut c_void`), opaque parameter blocks and the C string buffers the shim
// passes on without reading them (`cuGraphInstantiate`'s log).
as_value!(
    u8,
    u16,
    u32,
    i32,
    u64,
    usize,
    *mut c_void,
    *const c_void,
    *mut c_char
);

/// The integer widths the driver ABI reports sizes and addresses in (the CUDA 2.x `_v1`
/// functions use 32 bits).
pub trait Word: Pod {
    fn to_u64(self) -> u64;
    /// `v`, or the largest value of the type if it does not fit.
    fn saturating_from(v: u64) -> Self;
}

impl Word for u32 {
    fn to_u64(self) -> u64 {
        self as u64
    }
    fn saturating_from(v: u64) -> u32 {
        v.min(u32::MAX as u64) as u32
    }
}

impl Word for u64 {
    fn to_u64(self) -> u64 {
        self
    }
    fn saturating_from(v: u64) -> u64 {
        v
    }
}

impl Word for usize {
    fn to_u64(self) -> u64 {
        self as u64
    }
    fn saturating_from(v: u64) -> usize {
        v.min(usize::MAX as u64) as usize
    }
}
