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
            /// `lookup` must return addresses of functions with the listed prototypes.
            pub unsafe fn load(lookup: impl Fn(&std::ffi::CStr) -> *mut c_void) -> Real {
                Real {
                    $($name: {
                        let p = lookup(std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()).unwrap());
                        // SAFETY: the driver exports `$name` with exactly this prototype.
                        (!p.is_null()).then(|| std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($t),*) -> CUresult>(p))
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

#[macro_export]
macro_rules! hook_fn {
    (wrap $name:ident ($($a:ident : $t:ty),*) => $h:path) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> CUresult {
            match $crate::state::real().$name {
                Some(real) => $crate::guard(stringify!($name), || $h(real, $($a),*)),
                None => CUDA_ERROR_NOT_SUPPORTED,
            }
        }
    };
    (count $name:ident ($($a:ident : $t:ty),*) => $h:path) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> CUresult {
            match $crate::state::real().$name {
                Some(real) => {
                    $h();
                    real($($a),*)
                }
                None => CUDA_ERROR_NOT_SUPPORTED,
            }
        }
    };
    (call $name:ident ($($a:ident : $t:ty),*)) => {};
}
