//! The hook list's parameters are the declaration list's, by count and by type: a hook whose
//! Rust prototype differs from the CUDA headers' would corrupt the caller's arguments.

#[test]
fn every_hook_matches_its_prototype_by_type() {
    let errs: Vec<String> = share::hooks::HOOKED
        .iter()
        .filter_map(|(n, _, _, t)| {
            shim_headers::check_params(n, t)
                .err()
                .map(|e| format!("{n}: {e}"))
        })
        .collect();
    assert!(
        share::hooks::HOOKED.len() > 60,
        "read {} hooks",
        share::hooks::HOOKED.len()
    );
    assert!(errs.is_empty(), "{}", errs.join("\n"));
}

#[test]
fn a_hook_typed_differently_is_caught() {
    // cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) with the size as 32 bits.
    assert!(shim_headers::check_params("cuMemAlloc_v2", &["*mut CUdeviceptr", "c_uint"]).is_err());
    assert!(shim_headers::check_params("cuMemAlloc_v2", &["*mut CUdeviceptr", "usize"]).is_ok());
    // A const in-pointer declared mutable.
    assert!(shim_headers::check_params(
        "cuMemCreate",
        &["*mut u64", "usize", "*mut MemAllocationProp", "u64"]
    )
    .is_err());
}
