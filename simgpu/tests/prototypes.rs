//! simgpu's exports against the declaration list by parameter count and type: the check
//! `build.rs` runs (so a mismatch fails the build), shown here passing on the real sources and
//! catching deliberate mismatches.

#[path = "../build_check.rs"]
mod build_check;

use std::collections::BTreeMap;
use std::path::Path;

use build_check::{check_prototypes, scan_impls};

#[test]
fn every_implemented_export_matches_its_prototype() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut implemented = BTreeMap::new();
    scan_impls(root, &root.join("src"), &mut implemented);
    let checked = implemented
        .keys()
        .filter(|n| shim_headers::prototype(n).is_some_and(|p| !p.is_empty()))
        .count();
    assert!(
        checked > 300,
        "only {checked} exports found: is the scan broken?"
    );
    assert_eq!(check_prototypes(&implemented), Vec::<String>::new());
}

#[test]
fn a_mismatched_export_fails_naming_export_parameter_and_types() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("bad.rs"),
        r#"
driver! {
    fn cuMemAlloc_v2(dptr: *mut u32, size: usize) { Ok(()) }
    fn cuMemFree_v2(p: CUdeviceptr, extra: u32) { Ok(()) }
    fn cuCtxGetDevice(d: *mut CUdevice) { Ok(()) }
}
driver_ptds! {
    fn cuStreamSynchronize / cuStreamSynchronize_ptsz(h: *const c_void) |ptds| { Ok(()) }
}
"#,
    )
    .unwrap();
    let mut implemented = BTreeMap::new();
    scan_impls(dir.path(), dir.path(), &mut implemented);
    assert_eq!(implemented.len(), 5);
    let errors = check_prototypes(&implemented);
    assert_eq!(
        errors,
        [
            "cuMemAlloc_v2 (bad.rs:3): parameter 1 `dptr` is `*mut u32` but `CUdeviceptr_v2 *` \
             in the declaration list",
            "cuMemFree_v2 (bad.rs:4): 2 parameters in Rust, 1 in cuda_driver_api.txt; declared \
             (CUdeviceptr_v2 dptr)",
            "cuStreamSynchronize (bad.rs:8): parameter 1 `h` is `*const c_void` but `CUstream` \
             in the declaration list",
            "cuStreamSynchronize_ptsz (bad.rs:8): parameter 1 `h` is `*const c_void` but \
             `CUstream` in the declaration list",
        ]
    );
}

#[test]
fn structs_added_for_typed_signatures_have_cuda_h_layouts() {
    use cuda::driver::graph::{GraphEdgeData, GraphExecUpdateResultInfo, GraphInstantiateParams};
    use std::mem::{offset_of, size_of};
    assert_eq!(size_of::<GraphEdgeData>(), 8);
    assert_eq!(size_of::<GraphExecUpdateResultInfo>(), 24);
    assert_eq!(offset_of!(GraphExecUpdateResultInfo, error_node), 8);
    assert_eq!(size_of::<GraphInstantiateParams>(), 32);
    assert_eq!(offset_of!(GraphInstantiateParams, result_out), 24);
}
