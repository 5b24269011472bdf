//! `hooks!`: expands the declaration list in `hooks.rs`.

/// See `hooks.rs`.
#[macro_export]
macro_rules! hooks {
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
            /// `lookup` returns, for each listed name, NULL or the address of a function with the listed
            /// prototype (the real driver's export of that name).
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

        $($crate::hook_fn!($kind $name ($($a: $t),*) $(=> $h)?);)*

        /// The shim's replacement for the export `export`, if it hooks it.
        pub fn hook_ptr(export: &str) -> Option<*mut c_void> {
            match export {
                $(stringify!($name) => $crate::hook_addr!($kind $name),)*
                _ => None,
            }
        }

        /// (export, number of parameters, exported by the shim) for every listed function.
        pub static HOOKED: &[(&str, usize, bool)] = &[
            $((stringify!($name), <[&str]>::len(&[$(stringify!($a)),*]), $crate::hook_addr!($kind $name).is_some()),)*
        ];
    };
}

#[macro_export]
macro_rules! hook_addr {
    (call $name:ident) => {
        None::<*mut c_void>
    };
    ($kind:ident $name:ident) => {
        Some($name as *const () as *mut c_void)
    };
}

/// Defines one exported hook.
///
/// # Safety
///
/// Every generated function is an `unsafe extern "C"` CUDA driver entry point: its caller keeps
/// the pointer contract the CUDA driver API documents for that function (out-pointers writable
/// unless the API allows NULL, in-pointers readable and initialised, C strings NUL-terminated,
/// handles ones the driver returned to this process). `real` is the real driver's function of
/// the same name, resolved by `Real::load` with the prototype of the declaration list.
///
/// Together these are the *hook contract* every `wrap` handler's `# Safety` section refers to:
/// the handler receives that `real` and the caller's arguments unchanged, so it may pass them to
/// `real` and read or write through them as the API allows. Anything a handler relies on beyond
/// that (a pointer it checked non-NULL, a value the driver wrote on success) is stated at its
/// own `unsafe` block. (Hence the `macro_metavars_in_unsafe` allowance: `$h` and the arguments
/// expand inside the one `unsafe` block that passes the hook contract on.)
#[macro_export]
macro_rules! hook_fn {
    (wrap $name:ident ($($a:ident : $t:ty),*) => $h:path) => {
        /// # Safety
        ///
        /// The CUDA driver API's documented pointer contract for this function.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> CUresult {
            match $crate::state::real().$name {
                Some(real) => $crate::guard(stringify!($name), || {
                    // SAFETY: the hook contract (see `hook_fn!`): `real` is the driver's
                    // `$name`, the arguments are this function's caller's, passed on unchanged.
                    #[allow(clippy::macro_metavars_in_unsafe)]
                    unsafe { $h(real, $($a),*) }
                }),
                None => CUDA_ERROR_NOT_SUPPORTED,
            }
        }
    };
    (count $name:ident ($($a:ident : $t:ty),*) => $h:path) => {
        /// # Safety
        ///
        /// The CUDA driver API's documented pointer contract for this function.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> CUresult {
            match $crate::state::real().$name {
                Some(real) => {
                    $h();
                    // SAFETY: `real` is the driver's `$name` (prototype from the declaration
                    // list), called with this function's caller's arguments, unchanged.
                    #[allow(clippy::macro_metavars_in_unsafe)]
                    unsafe { real($($a),*) }
                }
                None => CUDA_ERROR_NOT_SUPPORTED,
            }
        }
    };
    (call $name:ident ($($a:ident : $t:ty),*)) => {};
}
