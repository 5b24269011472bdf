//! Expansions of the hook list (`list.rs`): `real_table!` (in `driver.rs`) and `hook_exports!`
//! (in `hooks.rs`).

/// The table of the real driver's entry points, one per listed function.
macro_rules! real_table {
    ($($kind:ident $name:ident ($($a:ident : $t:ty),* $(,)?) $(=> $h:path)?;)*) => {
        /// The real driver's entry point for every listed function (None if the driver lacks it).
        #[allow(non_snake_case)]
        pub struct Real {
            $(pub $name: Option<unsafe extern "C" fn($($t),*) -> CUresult>,)*
        }

        impl Real {
            /// Resolves every entry with `lookup` (the real driver's address of an export, or NULL).
            ///
            /// # Safety
            /// `lookup` returns, for each listed name, NULL or the address of a function with the
            /// listed prototype (the real driver's export of that name).
            pub unsafe fn load(lookup: impl Fn(&std::ffi::CStr) -> *mut c_void) -> Real {
                Real {
                    $($name: {
                        let p = lookup(std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()).unwrap());
                        // SAFETY: `p` is non-NULL, and by `load`'s contract it is the driver's
                        // `$name`, whose prototype is this one (the declaration list, checked
                        // against the CUDA headers by the `hooks` tests).
                        (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($t),*) -> CUresult>(p) })
                    },)*
                }
            }
        }
    };
}

/// The exported hooks, `hook_ptr` and `HOOKED`.
macro_rules! hook_exports {
    ($($kind:ident $name:ident ($($a:ident : $t:ty),* $(,)?) $(=> $h:path)?;)*) => {
        $(hook_fn!($kind $name ($($a: $t),*) $(=> $h)?);)*

        /// The shim's replacement for the export `export`, if it hooks it.
        pub fn hook_ptr(export: &str) -> Option<*mut c_void> {
            match export {
                $(stringify!($name) => hook_addr!($kind $name),)*
                _ => None,
            }
        }

        /// (export, number of parameters, exported by the shim, parameter types as written)
        /// for every listed function.
        pub static HOOKED: &[(&str, usize, bool, &[&str])] = &[
            $((stringify!($name), <[&str]>::len(&[$(stringify!($a)),*]), hook_addr!($kind $name).is_some(), &[$(stringify!($t)),*]),)*
        ];
    };
}

macro_rules! hook_addr {
    (call $name:ident) => {
        None::<*mut c_void>
    };
    (wrap $name:ident) => {
        Some($name as *const () as *mut c_void)
    };
}

/// Defines one exported hook: the one place where the caller's raw arguments meet the shim.
///
/// # Safety (the hook contract, stated once)
///
/// Every generated function is an `unsafe extern "C"` CUDA driver entry point: its caller keeps
/// the pointer contract the CUDA driver API documents for that function (out-pointers writable
/// unless the API allows NULL, in-pointers readable and initialised, C strings NUL-terminated,
/// handles ones the driver returned to this process), for the duration of the call. `real` is
/// the real driver's function of the same name, resolved by `Real::load` with the prototype of
/// the declaration list. Hence: `call` (the real function applied to the caller's unchanged
/// arguments) is safe to run, and the arguments converted by `FromCuda` (`Out`/`In` over the
/// caller's pointers, scoped to this call) are safe to read and write as the API allows.
/// Handlers are safe functions.
macro_rules! hook_fn {
    (wrap $name:ident ($($a:ident : $t:ty),*) => $h:path) => {
        /// The CUDA driver API function of this name, through the shim (see `list.rs`).
        ///
        /// # Safety
        ///
        /// The CUDA driver API's documented pointer contract for this function.
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name($($a: $t),*) -> CUresult {
            let Some(real) = $crate::driver::real().$name else {
                return CUDA_ERROR_NOT_SUPPORTED;
            };
            $crate::guard(stringify!($name), || {
                #[allow(unused_variables)] // a function without parameters (cuCtxSynchronize)
                let scope = $crate::boundary::Scope;
                // SAFETY: the hook contract (above): the driver's `$name` with the caller's
                // arguments, unchanged.
                #[allow(clippy::macro_metavars_in_unsafe)]
                let call = move || unsafe { real($($a),*) };
                // SAFETY: the hook contract: the caller's arguments, valid as the API documents
                // for this call, wrapped for its duration (`scope`).
                #[allow(clippy::macro_metavars_in_unsafe, clippy::unused_unit, unused_unsafe)]
                let ($($a,)*) = unsafe { ($($crate::boundary::FromCuda::at_boundary($a, &scope),)*) };
                $crate::boundary::code($h(call, $($a),*))
            })
        }
    };
    (call $name:ident ($($a:ident : $t:ty),*)) => {};
}
