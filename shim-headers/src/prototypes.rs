//! Parameter types of the declaration list, and whether a Rust parameter type (as written in
//! source) stands for a C one at the ABI: how simgpu's exports and libshare's hooks are checked
//! against `cuda_driver_api.txt` by type, not only by name and count.
//!
//! The equivalences are an explicit table (kinds from NVIDIA's `cuda.h`):
//! - scalars: `int`/`CUdevice` ↔ `i32`/`c_int`/`CUdevice`; `unsigned int`/`cuuint32_t` ↔
//!   `u32`/`c_uint`; `size_t` ↔ `usize`/`size_t`; `unsigned long long`/`cuuint64_t` and the
//!   64-bit handles (`CUdeviceptr_v2`, `CUmemGenericAllocationHandle`, texture/surface objects)
//!   ↔ `u64`/`c_ulonglong` (`CUdeviceptr` for device pointers); `CUdeviceptr_v1` is 32-bit;
//! - enums (`CUresult`, `CUdevice_attribute`, …) are C `enum`s, passed as `int`: `u32`, `i32`,
//!   `c_uint` or `c_int`;
//! - opaque handles (`CUcontext`, `CUstream`, …: `struct X_st *`) ↔ their alias or `*mut c_void`;
//! - function pointers (`CUhostFn`, …) ↔ their alias, `*mut c_void`, `*const c_void` or an
//!   `Option<extern "C" fn(..)>`;
//! - a pointer to a struct or union may point to the Rust struct of [`RUST_STRUCTS`] or be
//!   type-erased (`c_void`, or `u8` for a body that reads it as bytes); `void *` ↔ `*mut c_void`, `const T *` ↔ `*const T`, `T *` ↔ `*mut T`
//!   (the direction is part of the contract, so `*const` for a C out-pointer is a mismatch).
//!
//! Any type is also accepted under its own C name (a Rust alias of the same name).

use std::fmt;

/// C scalar type names (typedefs included) and the Rust spellings of each group.
const SCALARS: &[(&[&str], &[&str])] = &[
    (
        &["int", "CUdevice", "CUdevice_v1"],
        &["i32", "c_int", "CUdevice"],
    ),
    (
        &[
            "unsigned int",
            "unsigned",
            "cuuint32_t",
            "CUlogicalEndpointId",
            "CUlogIterator",
            "CUdeviceptr_v1",
        ],
        &["u32", "c_uint"],
    ),
    (&["size_t"], &["usize", "size_t"]),
    (
        &["CUdeviceptr", "CUdeviceptr_v2"],
        &["u64", "c_ulonglong", "CUdeviceptr"],
    ),
    (
        &[
            "unsigned long long",
            "cuuint64_t",
            "CUmemGenericAllocationHandle",
            "CUmemGenericAllocationHandle_v1",
            "CUtexObject_v1",
            "CUsurfObject_v1",
            "CUgraphConditionalHandle",
        ],
        &["u64", "c_ulonglong"],
    ),
    (&["unsigned short"], &["u16", "c_ushort"]),
    (&["unsigned char"], &["u8", "c_uchar"]),
    (&["char"], &["c_char", "i8", "u8"]),
    (&["float"], &["f32", "c_float"]),
    (&["void"], &["c_void"]),
];

/// C enums (passed as `int`).
const ENUMS: &[&str] = &[
    "CUresult",
    "CUaddress_mode",
    "CUarray_format",
    "CUatomicOperation",
    "CUcoredumpSettings",
    "CUdevResourceType",
    "CUdevice_P2PAttribute",
    "CUdevice_attribute",
    "CUdriverProcAddressQueryResult",
    "CUexecAffinityType",
    "CUfilter_mode",
    "CUflushGPUDirectRDMAWritesScope",
    "CUflushGPUDirectRDMAWritesTarget",
    "CUfunc_cache",
    "CUfunctionLoadingState",
    "CUfunction_attribute",
    "CUgraphExecUpdateResult",
    "CUgraphMem_attribute",
    "CUgraphNodeType",
    "CUjitInputType",
    "CUjit_option",
    "CUkernelNodeAttrID",
    "CUlibraryOption",
    "CUlimit",
    "CUlogicalEndpointIpcHandleType",
    "CUmemAccess_flags",
    "CUmemAllocationGranularity_flags",
    "CUmemAllocationHandleType",
    "CUmemAllocationType",
    "CUmemPool_attribute",
    "CUmemRangeHandleType",
    "CUmem_advise",
    "CUmem_range_attribute",
    "CUmoduleLoadingMode",
    "CUmulticastGranularity_flags",
    "CUoutput_mode",
    "CUpointer_attribute",
    "CUprocessState",
    "CUsharedconfig",
    "CUstreamAttrID",
    "CUstreamCaptureMode",
    "CUstreamCaptureStatus",
    "CUtensorMapAllocClass",
    "CUtensorMapDataType",
    "CUtensorMapFloatOOBfill",
    "CUtensorMapIm2ColWideMode",
    "CUtensorMapInterleave",
    "CUtensorMapL2promotion",
    "CUtensorMapSwizzle",
];

/// Opaque handles: `typedef struct X_st *X`.
const HANDLES: &[&str] = &[
    "CUarray",
    "CUasyncCallbackHandle",
    "CUcheckpointOperationHandle",
    "CUcontext",
    "CUcoredumpCallbackHandle",
    "CUdevResourceDesc",
    "CUevent",
    "CUexternalMemory",
    "CUexternalSemaphore",
    "CUfunction",
    "CUgraph",
    "CUgraphExec",
    "CUgraphNode",
    "CUgraphicsResource",
    "CUgreenCtx",
    "CUkernel",
    "CUlibrary",
    "CUlinkState",
    "CUlogsCallbackHandle",
    "CUmemoryPool",
    "CUmipmappedArray",
    "CUmodule",
    "CUstream",
    "CUsurfref",
    "CUtexref",
    "CUuserObject",
];

/// Function pointer typedefs.
const FN_PTRS: &[&str] = &[
    "CUasyncCallback",
    "CUcoredumpStatusCallback",
    "CUgraphRecaptureCallback",
    "CUhostFn",
    "CUlogsCallback",
    "CUoccupancyB2DSize",
    "CUstreamCallback",
];

/// Structs and unions the list passes by pointer (or, for the IPC handles, by value).
const STRUCTS: &[&str] = &[
    "CUDA_ARRAY3D_DESCRIPTOR_v1",
    "CUDA_ARRAY3D_DESCRIPTOR_v2",
    "CUDA_ARRAY_DESCRIPTOR_v1",
    "CUDA_ARRAY_DESCRIPTOR_v2",
    "CUDA_ARRAY_MEMORY_REQUIREMENTS_v1",
    "CUDA_ARRAY_SPARSE_PROPERTIES_v1",
    "CUDA_BATCH_MEM_OP_NODE_PARAMS",
    "CUDA_EXTERNAL_MEMORY_BUFFER_DESC_v1",
    "CUDA_EXTERNAL_MEMORY_HANDLE_DESC_v1",
    "CUDA_EXTERNAL_MEMORY_MIPMAPPED_ARRAY_DESC_v1",
    "CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC_v1",
    "CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS_v1",
    "CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS_v1",
    "CUDA_EXT_SEM_SIGNAL_NODE_PARAMS_v1",
    "CUDA_EXT_SEM_WAIT_NODE_PARAMS_v1",
    "CUDA_FABRIC_COPY_BATCH_OP_v1",
    "CUDA_GRAPH_INSTANTIATE_PARAMS",
    "CUDA_HOST_NODE_PARAMS_v1",
    "CUDA_KERNEL_NODE_PARAMS_v1",
    "CUDA_KERNEL_NODE_PARAMS_v2",
    "CUDA_LAUNCH_PARAMS_v1",
    "CUDA_MEMCPY2D_v1",
    "CUDA_MEMCPY2D_v2",
    "CUDA_MEMCPY3D_BATCH_OP_v1",
    "CUDA_MEMCPY3D_PEER_v1",
    "CUDA_MEMCPY3D_v1",
    "CUDA_MEMCPY3D_v2",
    "CUDA_MEMSET_NODE_PARAMS_v1",
    "CUDA_MEM_ALLOC_NODE_PARAMS",
    "CUDA_RESOURCE_DESC_v1",
    "CUDA_RESOURCE_VIEW_DESC_v1",
    "CUDA_TEXTURE_DESC_v1",
    "CU_DEV_SM_RESOURCE_GROUP_PARAMS",
    "CUarrayMapInfo_v1",
    "CUcheckpointCheckpointArgs",
    "CUcheckpointLockArgs",
    "CUcheckpointRestoreArgs",
    "CUcheckpointUnlockArgs",
    "CUcliqueInfo",
    "CUctxCreateParams",
    "CUdevResource",
    "CUdevprop_v1",
    "CUexecAffinityParam",
    "CUgraphEdgeData",
    "CUgraphExecUpdateResultInfo",
    "CUgraphNodeParams",
    "CUipcEventHandle_v1",
    "CUipcMemHandle_v1",
    "CUkernelNodeAttrValue_v1",
    "CUlaunchConfig",
    "CUlogicalEndpointProp",
    "CUmemAccessDesc_v1",
    "CUmemAllocationProp_v1",
    "CUmemDecompressParams",
    "CUmemLocation",
    "CUmemLocation_v1",
    "CUmemPoolProps_v1",
    "CUmemPoolPtrExportData_v1",
    "CUmemcpyAttributes_v1",
    "CUmulticastObjectProp",
    "CUstreamAttrValue_v1",
    "CUstreamBatchMemOpParams",
    "CUstreamBatchMemOpParams_v1",
    "CUstreamCigCaptureParams",
    "CUtensorMap",
    "CUuuid",
];

/// C structs and the Rust `#[repr(C)]` structs that mirror them: in [`crate::types`], or local
/// to simgpu (marked). One table, so that a Rust struct stands only for the C struct it mirrors.
pub const RUST_STRUCTS: &[(&str, &str)] = &[
    ("CUDA_ARRAY_DESCRIPTOR_v1", "ArrayDescV1"),
    ("CUDA_ARRAY_DESCRIPTOR_v2", "ArrayDesc"),
    ("CUDA_ARRAY3D_DESCRIPTOR_v1", "Array3DDescV1"),
    ("CUDA_ARRAY3D_DESCRIPTOR_v2", "Array3DDesc"),
    ("CUDA_MEMCPY2D_v2", "Memcpy2D"),
    ("CUDA_MEMCPY3D_v2", "Memcpy3D"),
    ("CUDA_MEM_ALLOC_NODE_PARAMS", "MemAllocNodeParams"),
    ("CUlaunchConfig", "LaunchConfig"),
    ("CUDA_LAUNCH_PARAMS_v1", "LaunchParams"),
    ("CUgraphNodeParams", "GraphNodeParams"),
    ("CUmemAccessDesc_v1", "MemAccessDesc"),
    ("CUmemAllocationProp_v1", "MemAllocationProp"),
    ("CUmemLocation", "MemLocation"),
    ("CUmemLocation_v1", "MemLocation"),
    ("CUmemPoolProps_v1", "MemPoolProps"),
    ("CUuuid", "CUuuid"),
    // simgpu (`driver/memory/array.rs`, `graph/`, `memory/ipc.rs`):
    ("CUDA_ARRAY_MEMORY_REQUIREMENTS_v1", "ArrayMemReq"),
    ("CUDA_HOST_NODE_PARAMS_v1", "HostNodeParams"),
    ("CUDA_MEMSET_NODE_PARAMS_v1", "MemsetNodeParams"),
    ("CUDA_KERNEL_NODE_PARAMS_v2", "KernelNodeParams"),
    // The v2 layout, read field by field only up to v1's end (`graph.rs`'s `read_kernel_params`).
    ("CUDA_KERNEL_NODE_PARAMS_v1", "KernelNodeParams"),
    ("CUgraphEdgeData", "GraphEdgeData"),
    ("CUgraphExecUpdateResultInfo", "GraphExecUpdateResultInfo"),
    ("CUDA_GRAPH_INSTANTIATE_PARAMS", "GraphInstantiateParams"),
    ("CUipcMemHandle_v1", "IpcHandle"),
    ("CUipcEventHandle_v1", "IpcHandle"),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Scalar(&'static [&'static str]),
    Enum,
    Handle,
    FnPtr,
    Struct,
}

fn kind(c_name: &str) -> Option<Kind> {
    if let Some((_, rust)) = SCALARS.iter().find(|(c, _)| c.contains(&c_name)) {
        return Some(Kind::Scalar(rust));
    }
    let is = |list: &[&str]| list.contains(&c_name);
    Some(if is(ENUMS) {
        Kind::Enum
    } else if is(HANDLES) {
        Kind::Handle
    } else if is(FN_PTRS) {
        Kind::FnPtr
    } else if is(STRUCTS) {
        Kind::Struct
    } else {
        return None;
    })
}

/// A parsed type: a named base type under zero or more pointers. `const`s are per level, from
/// the outermost pointer inwards: `pointee_const[i]` says whether what the i-th pointer points
/// to is const (C `const T *` ↔ Rust `*const T`). A parameter's own top-level `const` is no
/// part of the ABI and is dropped.
#[derive(Debug, PartialEq, Eq)]
struct Parsed<'a> {
    base: &'a str,
    pointee_const: Vec<bool>,
}

/// `const CUdeviceptr_v2 *`, `const char * *`, `void * const *`, `unsigned long long`.
fn parse_c(ty: &str) -> Parsed<'_> {
    let (head, tail) = ty.split_at(ty.find('*').unwrap_or(ty.len()));
    let is_const = |s: &str| s.split_whitespace().any(|w| w == "const");
    let base = head
        .trim()
        .trim_start_matches("const")
        .trim_end_matches("const")
        .trim();
    // Innermost pointer first: it points to the base; each further pointer points to the
    // pointer before it, const if that `*` is followed by `const`.
    let stars: Vec<&str> = tail.split('*').skip(1).collect();
    let mut pointee_const: Vec<bool> = std::iter::once(is_const(head))
        .chain(stars.iter().map(|s| is_const(s)))
        .take(stars.len())
        .collect();
    pointee_const.reverse();
    Parsed {
        base,
        pointee_const,
    }
}

/// `*mut *const c_char`, `std::ffi::c_void`, `CUstream` (also as `stringify!` spells types
/// inside a macro: `* mut * const c_char`).
fn parse_rust(ty: &str) -> Parsed<'_> {
    let mut rest = ty.trim();
    let mut pointee_const = Vec::new();
    while let Some(r) = rest.strip_prefix('*') {
        let r = r.trim_start();
        if let Some(r) = r.strip_prefix("mut ") {
            pointee_const.push(false);
            rest = r.trim_start();
        } else if let Some(r) = r.strip_prefix("const ") {
            pointee_const.push(true);
            rest = r.trim_start();
        } else {
            break;
        }
    }
    let is_fn = rest.starts_with("Option<")
        || rest.starts_with("extern ")
        || rest.starts_with("unsafe extern ");
    let base = if is_fn {
        "fn"
    } else {
        rest.rsplit("::").next().unwrap_or(rest).trim()
    };
    Parsed {
        base,
        pointee_const,
    }
}

/// Whether `r` (the Rust type left once the pointers C has are matched) stands for the C base
/// type `c`; `behind_pointer`: C reaches `c` through a pointer (so a struct may be type-erased).
fn base_matches(c: &str, r: &Parsed<'_>, behind_pointer: bool) -> bool {
    let plain = r.pointee_const.is_empty();
    if plain && r.base == c {
        return true;
    }
    let Some(k) = kind(c) else {
        return false;
    };
    let void_ptr = |mutable_only: bool| {
        r.pointee_const.len() == 1 && r.base == "c_void" && (!mutable_only || !r.pointee_const[0])
    };
    match k {
        Kind::Scalar(names) => plain && names.contains(&r.base),
        Kind::Enum => plain && matches!(r.base, "u32" | "i32" | "c_uint" | "c_int"),
        Kind::Handle => void_ptr(true),
        Kind::FnPtr => (plain && r.base == "fn") || void_ptr(false),
        Kind::Struct => {
            plain
                && ((behind_pointer && matches!(r.base, "c_void" | "u8"))
                    || RUST_STRUCTS.contains(&(c, r.base)))
        }
    }
}

/// Whether a Rust parameter type as written in source (`*mut CUdeviceptr`, `c_uint`, `usize`,
/// `CUstream`, `*const c_void`) stands for the C parameter type `c` of the declaration list
/// (`CUdeviceptr *`, `unsigned int`, `size_t`, `CUstream`, `const void *`), by the table in this
/// module's documentation.
pub fn rust_type_matches(c: &str, rust: &str) -> bool {
    let (c, r) = (parse_c(c), parse_rust(rust));
    if r.pointee_const.len() < c.pointee_const.len() {
        return false;
    }
    // Pointer levels C has must agree in direction; any extra Rust levels stand for the base
    // (a handle as `*mut c_void`).
    if r.pointee_const[..c.pointee_const.len()] != c.pointee_const[..] {
        return false;
    }
    let inner = Parsed {
        base: r.base,
        pointee_const: r.pointee_const[c.pointee_const.len()..].to_vec(),
    };
    base_matches(c.base, &inner, !c.pointee_const.is_empty())
}

/// The C parameter types of a prototype such as `(CUdeviceptr_v2 *dptr, size_t bytesize)`, names
/// removed and pointers spaced: `["CUdeviceptr_v2 *", "size_t"]`; `()` and `(void)` give none.
pub fn param_types(proto: &str) -> Vec<String> {
    let inner = proto.trim();
    let inner = inner.strip_prefix('(').unwrap_or(inner);
    let inner = inner.strip_suffix(')').unwrap_or(inner).trim();
    if inner.is_empty() || inner == "void" {
        return Vec::new();
    }
    inner
        .split(',')
        .map(|p| {
            let spaced = p.replace('*', " * ");
            let mut words: Vec<&str> = spaced.split_whitespace().collect();
            // Every parameter in the list is named: drop the name.
            if words.len() > 1 && words.last().is_some_and(|w| *w != "*") {
                words.pop();
            }
            words.join(" ")
        })
        .collect()
}

/// Why a Rust signature does not match the declaration list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParamMismatch {
    /// The export is not in the declaration list, or is listed without a prototype.
    NotDeclared,
    /// The parameter counts differ.
    Count { declared: usize, rust: usize },
    /// Parameters whose types differ: (0-based index, C type, Rust type).
    Types(Vec<(usize, String, String)>),
}

impl fmt::Display for ParamMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamMismatch::NotDeclared => write!(f, "not in cuda_driver_api.txt with a prototype"),
            ParamMismatch::Count { declared, rust } => write!(
                f,
                "{rust} parameters in Rust, {declared} in cuda_driver_api.txt"
            ),
            ParamMismatch::Types(v) => {
                for (n, (i, c, r)) in v.iter().enumerate() {
                    if n > 0 {
                        f.write_str("; ")?;
                    }
                    write!(f, "parameter {} is `{r}` in Rust but `{c}` in C", i + 1)?;
                }
                Ok(())
            }
        }
    }
}

/// Checks a Rust parameter list (types as written in source) against the declaration list's
/// prototype of `export`: count, then each type with [`rust_type_matches`].
pub fn check_params(export: &str, rust: &[&str]) -> Result<(), ParamMismatch> {
    let proto = crate::prototype(export)
        .filter(|p| !p.is_empty())
        .ok_or(ParamMismatch::NotDeclared)?;
    let c = param_types(proto);
    if c.len() != rust.len() {
        return Err(ParamMismatch::Count {
            declared: c.len(),
            rust: rust.len(),
        });
    }
    let bad: Vec<_> = c
        .iter()
        .zip(rust)
        .enumerate()
        .filter(|(_, (c, r))| !rust_type_matches(c, r))
        .map(|(i, (c, r))| (i, c.clone(), r.to_string()))
        .collect();
    if bad.is_empty() {
        Ok(())
    } else {
        Err(ParamMismatch::Types(bad))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_types_parse() {
        assert_eq!(
            param_types("(CUdeviceptr_v2 *dptr, size_t bytesize)"),
            ["CUdeviceptr_v2 *", "size_t"]
        );
        assert_eq!(
            param_types("(const char **pStr, unsigned numChannels, unsigned long long x)"),
            ["const char * *", "unsigned", "unsigned long long"]
        );
        assert!(param_types("()").is_empty());
        assert!(param_types("(void)").is_empty());
        let p = parse_c("void * const *");
        assert_eq!((p.base, p.pointee_const), ("void", vec![true, false]));
        let p = parse_c("const char * *");
        assert_eq!((p.base, p.pointee_const), ("char", vec![false, true]));
        let p = parse_c("unsigned long long");
        assert_eq!((p.base, p.pointee_const), ("unsigned long long", vec![]));
    }

    #[test]
    fn equivalences_hold() {
        for (c, r) in [
            ("CUdeviceptr_v2 *", "*mut CUdeviceptr"),
            ("CUdeviceptr_v2 *", "*mut u64"),
            ("unsigned int", "c_uint"),
            ("unsigned int", "u32"),
            ("unsigned", "u32"),
            ("size_t", "usize"),
            ("int", "i32"),
            ("CUdevice_v1", "CUdevice"),
            ("CUstream", "CUstream"),
            ("CUstream", "*mut c_void"),
            ("CUstream", "*mut std::ffi::c_void"),
            ("CUcontext *", "*mut CUcontext"),
            ("CUcontext *", "*mut *mut c_void"),
            ("const void *", "*const c_void"),
            ("void *", "*mut c_void"),
            ("void * *", "*mut *mut c_void"),
            ("const char * *", "*mut *const c_char"),
            ("CUdevice_attribute", "u32"),
            ("CUdevice_attribute", "i32"),
            ("CUresult", "CUresult"),
            ("CUhostFn", "*mut c_void"),
            ("CUhostFn", "Option<unsafe extern \"C\" fn(*mut c_void)>"),
            ("const CUDA_MEMCPY2D_v2 *", "*const Memcpy2D"),
            ("const CUDA_MEMCPY2D_v2 *", "*const c_void"),
            ("CUuuid *", "*mut CUuuid"),
            ("CUipcMemHandle_v1", "CUipcMemHandle_v1"),
        ] {
            assert!(rust_type_matches(c, r), "{c} ↔ {r}");
        }
    }

    #[test]
    fn mismatches_are_caught() {
        for (c, r) in [
            ("CUdeviceptr_v2 *", "*mut u32"),                // width
            ("CUdeviceptr_v1 *", "*mut CUdeviceptr"),        // v1 is 32-bit
            ("size_t", "u32"),                               // width
            ("unsigned int", "usize"),                       // width
            ("int", "u64"),                                  // width
            ("CUdeviceptr_v2", "*mut c_void"),               // integer, not a pointer
            ("CUstream", "u64"),                             // pointer, not an integer
            ("CUstream", "CUcontext"),                       // another handle's alias
            ("CUcontext *", "*mut c_void"),                  // one level too few
            ("CUcontext", "*mut *mut c_void"),               // one level too many
            ("const void *", "*mut c_void"),                 // direction
            ("void *", "*const c_void"),                     // direction
            ("const char * *", "*mut *mut c_char"),          // inner direction
            ("CUdevice_attribute", "u64"),                   // enums are int
            ("CUdevice_attribute *", "*mut c_void"),         // an enum is not type-erased
            ("const CUDA_MEMCPY2D_v2 *", "*const Memcpy3D"), // another struct
            ("CUipcMemHandle_v1", "*const c_void"),          // by value, not by pointer
            ("CUnoSuchType", "u32"),                         // unknown C type
        ] {
            assert!(!rust_type_matches(c, r), "{c} ↔ {r} should not match");
        }
    }

    #[test]
    fn every_declared_type_is_in_the_table() {
        for (export, proto) in crate::EXPORTS {
            for t in param_types(proto) {
                let p = parse_c(&t);
                assert!(
                    kind(p.base).is_some(),
                    "{export}: C type `{t}` (base `{}`) missing from the equivalence table",
                    p.base
                );
            }
        }
    }

    #[test]
    fn whole_signatures() {
        assert_eq!(
            check_params("cuMemAlloc_v2", &["*mut CUdeviceptr", "usize"]),
            Ok(())
        );
        assert_eq!(
            check_params("cuMemAlloc_v2", &["*mut CUdeviceptr"]),
            Err(ParamMismatch::Count {
                declared: 2,
                rust: 1
            })
        );
        let e = check_params("cuMemAlloc_v2", &["*mut u32", "usize"]).unwrap_err();
        assert_eq!(
            e,
            ParamMismatch::Types(vec![(0, "CUdeviceptr_v2 *".into(), "*mut u32".into())])
        );
        assert_eq!(
            e.to_string(),
            "parameter 1 is `*mut u32` in Rust but `CUdeviceptr_v2 *` in C"
        );
        assert_eq!(
            check_params("cuNoSuchFunction", &[]),
            Err(ParamMismatch::NotDeclared)
        );
        assert_eq!(check_params("cuCtxSynchronize", &[]), Ok(()));
    }
}
