//! The one declaration list of the CUDA driver API, `cuda_driver_api.txt` (generated from the
//! pinned CUDA 12.9/13.5 headers by `tools/gen_driver_api.py`), as Rust tables:
//! - [`PROC_TABLE`]: every `cuGetProcAddress` entry (base name, ABI version, per-thread twin) and
//!   the export symbol it means;
//! - [`EXPORTS`]: every export symbol with its C parameter list;
//! - [`resolve`]: the driver's version-aware lookup rule, used by simgpu to answer
//!   `cuGetProcAddress` and by libshare to know which hook a returned pointer must become.

/// One `cuGetProcAddress` entry: `name` at ABI `version` (the per-thread-default-stream twin if
/// `per_thread`) is the export `export`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcEntry {
    pub name: &'static str,
    pub version: u32,
    pub per_thread: bool,
    pub export: &'static str,
}

include!(concat!(env!("OUT_DIR"), "/tables.rs"));

pub mod types;

mod prototypes;
pub use prototypes::{check_params, param_types, rust_type_matches, ParamMismatch, RUST_STRUCTS};

/// The newest CUDA version whose header the declaration list was generated from (13.5): for a
/// request up to this version [`resolve`] is authoritative; beyond it a newer driver may have
/// added an ABI version the list does not know.
pub const DECLARED_UP_TO: u32 = 13050;

/// `CUgetProcAddress_flags`: ask for the per-thread-default-stream variant.
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 2;

/// Why a lookup failed, as `CUdriverProcAddressQueryResult` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LookupError {
    /// CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
    NotFound = 1,
    /// CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
    VersionNotSufficient = 2,
}

/// The ABI entry for (name, requested version, per-thread flag): the highest ABI version not newer
/// than the request — never simply the newest `_vN` — and the per-thread twin when asked for and
/// at least as new as the plain entry it replaces.
pub fn resolve(
    name: &str,
    version: u32,
    per_thread: bool,
) -> Result<&'static ProcEntry, LookupError> {
    let entries = by_name(name);
    if entries.is_empty() {
        return Err(LookupError::NotFound);
    }
    let best = |pt: bool| {
        entries
            .iter()
            .filter(|e| e.per_thread == pt && e.version <= version)
            .max_by_key(|e| e.version)
    };
    let plain = best(false);
    let pick = if per_thread {
        match (best(true), plain) {
            (Some(t), Some(p)) if t.version >= p.version => Some(t),
            (Some(t), None) => Some(t),
            _ => plain,
        }
    } else {
        plain
    };
    pick.ok_or(LookupError::VersionNotSufficient)
}

/// All entries for a base name (PROC_TABLE is sorted by name).
pub fn by_name(name: &str) -> &'static [ProcEntry] {
    let lo = PROC_TABLE.partition_point(|e| e.name < name);
    let hi = lo + PROC_TABLE[lo..].partition_point(|e| e.name == name);
    &PROC_TABLE[lo..hi]
}

/// The C parameter list of an export, if the declaration list has it.
pub fn prototype(export: &str) -> Option<&'static str> {
    EXPORTS
        .binary_search_by(|(n, _)| n.cmp(&export))
        .ok()
        .map(|i| EXPORTS[i].1)
}

/// Runs `f`, the body of a function exported to C (a driver or NVML entry point, a hook): a panic
/// becomes `unknown` (`CUDA_ERROR_UNKNOWN`, `NVML_ERROR_UNKNOWN`) and one line on stderr naming
/// `name`, never an unwind into C. The line is written without panicking (stderr may be closed).
#[inline]
pub fn guard<T: Copy + std::fmt::Display>(name: &str, unknown: T, f: impl FnOnce() -> T) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => {
            use std::io::Write as _;
            let _ = writeln!(
                std::io::stderr(),
                "{name}: internal error (panic, above); returned error {unknown} — please report it"
            );
            unknown
        }
    }
}

/// A device UUID as NVML prints it: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn format_uuid(uuid: &[u8; 16]) -> String {
    let mut out = String::with_capacity(40);
    out.push_str("GPU-");
    for (i, byte) in uuid.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out.push('-');
        }
        out.push(char::from_digit(u32::from(byte >> 4), 16).unwrap_or('0'));
        out.push(char::from_digit(u32::from(byte & 0xf), 16).unwrap_or('0'));
    }
    out
}

/// Number of parameters in a C parameter list such as `(CUdeviceptr_v2 *dptr, size_t bytesize)`.
pub fn param_count(proto: &str) -> usize {
    param_types(proto).len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_sorted_for_binary_search() {
        assert!(PROC_TABLE.windows(2).all(|w| w[0].name <= w[1].name));
        assert!(EXPORTS.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn every_entry_names_a_known_export() {
        for e in PROC_TABLE {
            assert!(prototype(e.export).is_some(), "{e:?}");
        }
    }

    #[test]
    fn version_aware_resolution() {
        let e = |n, v, p| resolve(n, v, p).map(|e| e.export);
        assert_eq!(e("cuMemAlloc", 3020, false), Ok("cuMemAlloc_v2"));
        assert_eq!(e("cuMemAlloc", 2000, false), Ok("cuMemAlloc"));
        assert_eq!(e("cuCtxCreate", 3020, false), Ok("cuCtxCreate_v2"));
        assert_eq!(e("cuCtxCreate", 11040, false), Ok("cuCtxCreate_v3"));
        assert_eq!(e("cuCtxCreate", 12050, false), Ok("cuCtxCreate_v4"));
        assert_eq!(e("cuCtxCreate", 12000, false), Ok("cuCtxCreate_v3"));
        assert_eq!(
            e("cuStreamGetCaptureInfo", 10010, false),
            Ok("cuStreamGetCaptureInfo")
        );
        assert_eq!(
            e("cuStreamGetCaptureInfo", 11030, false),
            Ok("cuStreamGetCaptureInfo_v2")
        );
        assert_eq!(
            e("cuStreamGetCaptureInfo", 12030, false),
            Ok("cuStreamGetCaptureInfo_v3")
        );
        assert_eq!(
            e("cuStreamGetCaptureInfo", 12030, true),
            Ok("cuStreamGetCaptureInfo_v3_ptsz")
        );
        assert_eq!(e("cuCtxGetDevice", 13000, false), Ok("cuCtxGetDevice_v2"));
        assert_eq!(e("cuCtxGetDevice", 12090, false), Ok("cuCtxGetDevice"));
        assert_eq!(e("cuMemcpyHtoD", 7000, true), Ok("cuMemcpyHtoD_v2_ptds"));
        assert_eq!(e("cuMemcpyHtoD", 3020, true), Ok("cuMemcpyHtoD_v2"));
        assert_eq!(e("cuLaunchKernel", 12000, true), Ok("cuLaunchKernel_ptsz"));
        assert_eq!(e("cuInit", 12000, true), Ok("cuInit"));
        assert_eq!(
            resolve("cuNoSuchThing", 12000, false).err(),
            Some(LookupError::NotFound)
        );
        assert_eq!(
            resolve("cuMemAllocAsync", 11000, false).err(),
            Some(LookupError::VersionNotSufficient)
        );
        assert_eq!(resolve("", 0, false).err(), Some(LookupError::NotFound));
    }

    #[test]
    fn guard_turns_a_panic_into_the_error_code() {
        assert_eq!(guard("ok", 999u32, || 7), 7);
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let r = guard("boom", types::CUDA_ERROR_UNKNOWN, || panic!("inside"));
        std::panic::set_hook(prev);
        assert_eq!(r, 999);
    }

    #[test]
    fn uuid_format_matches_nvml() {
        let u = [
            0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0, 1, 2, 3, 4, 5, 6, 7,
        ];
        assert_eq!(format_uuid(&u), "GPU-12345678-9abc-def0-0001-020304050607");
    }

    #[test]
    fn prototypes_parse() {
        assert_eq!(param_count(prototype("cuMemAlloc_v2").unwrap()), 2);
        assert_eq!(param_count(prototype("cuCtxSynchronize").unwrap()), 0);
        assert_eq!(param_count(prototype("cuLaunchKernel").unwrap()), 11);
        assert_eq!(param_count(prototype("cuCtxCreate_v3").unwrap()), 5);
    }
}
