//! The exported hooks, expanded from THE list (`list.rs`) by `hook_exports!`: one
//! `extern "C"` function per `wrap` line, `hook_ptr` (which `dlsym` and `cuGetProcAddress` return
//! instead of the real pointer) and `HOOKED` (checked against `shim-headers` by the tests
//! below). Everything not listed passes through untouched.

use std::ffi::{c_char, c_uint, c_void};

use crate::types::*;
use crate::{context, graph_mem, init, launch, memory, procaddr, slicing, sync, transfer};

driver_hooks!(hook_exports);

#[cfg(test)]
mod tests {
    use super::HOOKED;
    use shim_headers::{param_count, prototype, resolve, PROC_TABLE};

    #[test]
    fn every_hook_matches_a_prototype_of_the_declaration_list() {
        for (name, params, _, _) in HOOKED {
            let proto = prototype(name).unwrap_or_else(|| panic!("{name} is not a driver export"));
            assert_eq!(
                param_count(proto),
                *params,
                "{name}{proto}: parameter count differs"
            );
        }
    }

    #[test]
    fn every_proc_address_mapping_to_a_hook_is_an_abi_entry_of_that_hook() {
        // For each hooked export, every (name, version, flags) the driver would answer with it
        // must map back to it through the same rule the shim applies.
        let mut mapped = 0;
        for e in PROC_TABLE.iter().filter(|e| {
            HOOKED
                .iter()
                .any(|(n, _, exported, _)| *exported && *n == e.export)
        }) {
            assert_eq!(
                resolve(e.name, e.version, e.per_thread).map(|r| r.export),
                Ok(e.export),
                "{e:?}"
            );
            mapped += 1;
        }
        assert!(
            mapped >= 25,
            "only {mapped} cuGetProcAddress entries reach hooks"
        );
    }

    /// (name, requested version, per-thread flag) → the ABI symbol `cuGetProcAddress` answers
    /// with, for every hooked export: at the version that introduced it, just below it, and at
    /// 13.5. Literal data, written out once from the pinned headers' `PFN_<name>_v<version>`
    /// typedefs (via the declaration list) and reviewed — not computed by the rule under test.
    const EXPECTED: &[(&str, u32, bool, Option<&str>)] = &[
        ("cuInit", 2000, false, Some("cuInit")),
        ("cuInit", 1999, false, None),
        ("cuInit", 13050, false, Some("cuInit")),
        ("cuGetProcAddress", 11030, false, Some("cuGetProcAddress")),
        ("cuGetProcAddress", 11029, false, None),
        (
            "cuGetProcAddress",
            13050,
            false,
            Some("cuGetProcAddress_v2"),
        ),
        (
            "cuGetProcAddress",
            12000,
            false,
            Some("cuGetProcAddress_v2"),
        ),
        ("cuGetProcAddress", 11999, false, Some("cuGetProcAddress")),
        ("cuLaunchKernel", 4000, false, Some("cuLaunchKernel")),
        ("cuLaunchKernel", 3999, false, None),
        ("cuLaunchKernel", 13050, false, Some("cuLaunchKernel")),
        ("cuLaunchKernel", 7000, true, Some("cuLaunchKernel_ptsz")),
        ("cuLaunchKernel", 6999, true, Some("cuLaunchKernel")),
        ("cuLaunchKernel", 13050, true, Some("cuLaunchKernel_ptsz")),
        ("cuLaunchKernelEx", 11060, false, Some("cuLaunchKernelEx")),
        ("cuLaunchKernelEx", 11059, false, None),
        ("cuLaunchKernelEx", 13050, false, Some("cuLaunchKernelEx")),
        (
            "cuLaunchKernelEx",
            11060,
            true,
            Some("cuLaunchKernelEx_ptsz"),
        ),
        ("cuLaunchKernelEx", 11059, true, None),
        (
            "cuLaunchKernelEx",
            13050,
            true,
            Some("cuLaunchKernelEx_ptsz"),
        ),
        (
            "cuLaunchCooperativeKernel",
            9000,
            false,
            Some("cuLaunchCooperativeKernel"),
        ),
        ("cuLaunchCooperativeKernel", 8999, false, None),
        (
            "cuLaunchCooperativeKernel",
            13050,
            false,
            Some("cuLaunchCooperativeKernel"),
        ),
        (
            "cuLaunchCooperativeKernel",
            9000,
            true,
            Some("cuLaunchCooperativeKernel_ptsz"),
        ),
        ("cuLaunchCooperativeKernel", 8999, true, None),
        (
            "cuLaunchCooperativeKernel",
            13050,
            true,
            Some("cuLaunchCooperativeKernel_ptsz"),
        ),
        (
            "cuLaunchCooperativeKernelMultiDevice",
            9000,
            false,
            Some("cuLaunchCooperativeKernelMultiDevice"),
        ),
        ("cuLaunchCooperativeKernelMultiDevice", 8999, false, None),
        (
            "cuLaunchCooperativeKernelMultiDevice",
            13050,
            true,
            Some("cuLaunchCooperativeKernelMultiDevice"),
        ),
        ("cuLaunch", 2000, false, Some("cuLaunch")),
        ("cuLaunch", 1999, false, None),
        ("cuLaunch", 13050, true, Some("cuLaunch")),
        ("cuLaunchGrid", 2000, false, Some("cuLaunchGrid")),
        ("cuLaunchGrid", 1999, false, None),
        ("cuLaunchGrid", 13050, false, Some("cuLaunchGrid")),
        ("cuLaunchGrid", 13050, true, Some("cuLaunchGrid")),
        ("cuLaunchGridAsync", 2000, false, Some("cuLaunchGridAsync")),
        ("cuLaunchGridAsync", 13050, true, Some("cuLaunchGridAsync")),
        ("cuGraphLaunch", 10000, false, Some("cuGraphLaunch")),
        ("cuGraphLaunch", 9999, false, None),
        ("cuGraphLaunch", 13050, false, Some("cuGraphLaunch")),
        ("cuGraphLaunch", 10000, true, Some("cuGraphLaunch_ptsz")),
        ("cuGraphLaunch", 9999, true, None),
        ("cuGraphLaunch", 13050, true, Some("cuGraphLaunch_ptsz")),
        ("cuCtxSynchronize", 2000, false, Some("cuCtxSynchronize")),
        ("cuCtxSynchronize", 1999, false, None),
        ("cuCtxSynchronize", 12999, false, Some("cuCtxSynchronize")),
        (
            "cuCtxSynchronize",
            13000,
            false,
            Some("cuCtxSynchronize_v2"),
        ),
        (
            "cuCtxSynchronize",
            13050,
            false,
            Some("cuCtxSynchronize_v2"),
        ),
        (
            "cuStreamSynchronize",
            2000,
            false,
            Some("cuStreamSynchronize"),
        ),
        ("cuStreamSynchronize", 1999, false, None),
        (
            "cuStreamSynchronize",
            13050,
            false,
            Some("cuStreamSynchronize"),
        ),
        (
            "cuStreamSynchronize",
            7000,
            true,
            Some("cuStreamSynchronize_ptsz"),
        ),
        (
            "cuStreamSynchronize",
            6999,
            true,
            Some("cuStreamSynchronize"),
        ),
        (
            "cuStreamSynchronize",
            13050,
            true,
            Some("cuStreamSynchronize_ptsz"),
        ),
        ("cuStreamQuery", 2000, false, Some("cuStreamQuery")),
        ("cuStreamQuery", 1999, false, None),
        ("cuStreamQuery", 13050, false, Some("cuStreamQuery")),
        ("cuStreamQuery", 7000, true, Some("cuStreamQuery_ptsz")),
        ("cuStreamQuery", 6999, true, Some("cuStreamQuery")),
        ("cuStreamQuery", 13050, true, Some("cuStreamQuery_ptsz")),
        (
            "cuEventSynchronize",
            2000,
            false,
            Some("cuEventSynchronize"),
        ),
        ("cuEventSynchronize", 1999, false, None),
        (
            "cuEventSynchronize",
            13050,
            false,
            Some("cuEventSynchronize"),
        ),
        ("cuEventQuery", 2000, false, Some("cuEventQuery")),
        ("cuEventQuery", 1999, false, None),
        ("cuEventQuery", 13050, false, Some("cuEventQuery")),
        (
            "cuDevicePrimaryCtxRetain",
            7000,
            false,
            Some("cuDevicePrimaryCtxRetain"),
        ),
        ("cuDevicePrimaryCtxRetain", 6999, false, None),
        (
            "cuDevicePrimaryCtxRetain",
            13050,
            false,
            Some("cuDevicePrimaryCtxRetain"),
        ),
        (
            "cuDevicePrimaryCtxReset",
            7000,
            false,
            Some("cuDevicePrimaryCtxReset"),
        ),
        ("cuDevicePrimaryCtxReset", 6999, false, None),
        (
            "cuDevicePrimaryCtxReset",
            13050,
            false,
            Some("cuDevicePrimaryCtxReset_v2"),
        ),
        (
            "cuDevicePrimaryCtxReset",
            11000,
            false,
            Some("cuDevicePrimaryCtxReset_v2"),
        ),
        (
            "cuDevicePrimaryCtxReset",
            10999,
            false,
            Some("cuDevicePrimaryCtxReset"),
        ),
        (
            "cuDevicePrimaryCtxRelease",
            7000,
            false,
            Some("cuDevicePrimaryCtxRelease"),
        ),
        ("cuDevicePrimaryCtxRelease", 6999, false, None),
        (
            "cuDevicePrimaryCtxRelease",
            10999,
            false,
            Some("cuDevicePrimaryCtxRelease"),
        ),
        (
            "cuDevicePrimaryCtxRelease",
            11000,
            false,
            Some("cuDevicePrimaryCtxRelease_v2"),
        ),
        (
            "cuDevicePrimaryCtxRelease",
            13050,
            false,
            Some("cuDevicePrimaryCtxRelease_v2"),
        ),
        ("cuCtxCreate", 3020, false, Some("cuCtxCreate_v2")),
        ("cuCtxCreate", 3019, false, Some("cuCtxCreate")),
        ("cuCtxCreate", 13050, false, Some("cuCtxCreate_v4")),
        ("cuCtxCreate", 11040, false, Some("cuCtxCreate_v3")),
        ("cuCtxCreate", 11039, false, Some("cuCtxCreate_v2")),
        ("cuCtxDestroy", 2000, false, Some("cuCtxDestroy")),
        ("cuCtxDestroy", 1999, false, None),
        ("cuCtxDestroy", 13050, false, Some("cuCtxDestroy_v2")),
        ("cuCtxDestroy", 4000, false, Some("cuCtxDestroy_v2")),
        ("cuCtxDestroy", 3999, false, Some("cuCtxDestroy")),
        ("cuCtxCreate", 12050, false, Some("cuCtxCreate_v4")),
        ("cuCtxCreate", 12049, false, Some("cuCtxCreate_v3")),
        ("cuCtxSetCurrent", 4000, false, Some("cuCtxSetCurrent")),
        ("cuCtxSetCurrent", 3999, false, None),
        ("cuCtxSetCurrent", 13050, false, Some("cuCtxSetCurrent")),
        ("cuCtxPushCurrent", 2000, false, Some("cuCtxPushCurrent")),
        ("cuCtxPushCurrent", 1999, false, None),
        (
            "cuCtxPushCurrent",
            13050,
            false,
            Some("cuCtxPushCurrent_v2"),
        ),
        ("cuCtxPushCurrent", 4000, false, Some("cuCtxPushCurrent_v2")),
        ("cuCtxPushCurrent", 3999, false, Some("cuCtxPushCurrent")),
        ("cuCtxPopCurrent", 2000, false, Some("cuCtxPopCurrent")),
        ("cuCtxPopCurrent", 1999, false, None),
        ("cuCtxPopCurrent", 13050, false, Some("cuCtxPopCurrent_v2")),
        ("cuCtxPopCurrent", 4000, false, Some("cuCtxPopCurrent_v2")),
        ("cuCtxPopCurrent", 3999, false, Some("cuCtxPopCurrent")),
        ("cuMemAlloc", 3020, false, Some("cuMemAlloc_v2")),
        ("cuMemAlloc", 3019, false, Some("cuMemAlloc")),
        ("cuMemAlloc", 13050, false, Some("cuMemAlloc_v2")),
        ("cuMemAllocPitch", 3020, false, Some("cuMemAllocPitch_v2")),
        ("cuMemAllocPitch", 3019, false, Some("cuMemAllocPitch")),
        ("cuMemAllocPitch", 13050, false, Some("cuMemAllocPitch_v2")),
        ("cuMemAllocManaged", 6000, false, Some("cuMemAllocManaged")),
        ("cuMemAllocManaged", 5999, false, None),
        ("cuMemAllocManaged", 13050, false, Some("cuMemAllocManaged")),
        ("cuMemFree", 3020, false, Some("cuMemFree_v2")),
        ("cuMemFree", 3019, false, Some("cuMemFree")),
        ("cuMemFree", 13050, false, Some("cuMemFree_v2")),
        ("cuMemCreate", 10020, false, Some("cuMemCreate")),
        ("cuMemCreate", 10019, false, None),
        ("cuMemCreate", 13050, false, Some("cuMemCreate")),
        ("cuMemRelease", 10020, false, Some("cuMemRelease")),
        ("cuMemMap", 10020, false, Some("cuMemMap")),
        ("cuMemMap", 10019, false, None),
        ("cuMemMap", 13050, false, Some("cuMemMap")),
        ("cuMemUnmap", 10020, false, Some("cuMemUnmap")),
        ("cuMemUnmap", 10019, false, None),
        ("cuMemUnmap", 13050, false, Some("cuMemUnmap")),
        ("cuMemRelease", 10019, false, None),
        ("cuMemRelease", 13050, false, Some("cuMemRelease")),
        ("cuMemAllocAsync", 11020, false, Some("cuMemAllocAsync")),
        ("cuMemAllocAsync", 11019, false, None),
        ("cuMemAllocAsync", 13050, false, Some("cuMemAllocAsync")),
        ("cuMemAllocAsync", 11020, true, Some("cuMemAllocAsync_ptsz")),
        ("cuMemAllocAsync", 11019, true, None),
        ("cuMemAllocAsync", 13050, true, Some("cuMemAllocAsync_ptsz")),
        (
            "cuMemAllocFromPoolAsync",
            11020,
            false,
            Some("cuMemAllocFromPoolAsync"),
        ),
        ("cuMemAllocFromPoolAsync", 11019, false, None),
        (
            "cuMemAllocFromPoolAsync",
            13050,
            false,
            Some("cuMemAllocFromPoolAsync"),
        ),
        (
            "cuMemAllocFromPoolAsync",
            11020,
            true,
            Some("cuMemAllocFromPoolAsync_ptsz"),
        ),
        ("cuMemAllocFromPoolAsync", 11019, true, None),
        (
            "cuMemAllocFromPoolAsync",
            13050,
            true,
            Some("cuMemAllocFromPoolAsync_ptsz"),
        ),
        ("cuMemFreeAsync", 11020, false, Some("cuMemFreeAsync")),
        ("cuMemFreeAsync", 11019, false, None),
        ("cuMemFreeAsync", 13050, false, Some("cuMemFreeAsync")),
        ("cuMemFreeAsync", 11020, true, Some("cuMemFreeAsync_ptsz")),
        ("cuMemFreeAsync", 11019, true, None),
        ("cuMemFreeAsync", 13050, true, Some("cuMemFreeAsync_ptsz")),
        ("cuArrayCreate", 3020, false, Some("cuArrayCreate_v2")),
        ("cuArrayCreate", 3019, false, Some("cuArrayCreate")),
        ("cuArrayCreate", 13050, false, Some("cuArrayCreate_v2")),
        ("cuArray3DCreate", 3020, false, Some("cuArray3DCreate_v2")),
        ("cuArray3DCreate", 3019, false, Some("cuArray3DCreate")),
        ("cuArray3DCreate", 13050, false, Some("cuArray3DCreate_v2")),
        (
            "cuMipmappedArrayCreate",
            5000,
            false,
            Some("cuMipmappedArrayCreate"),
        ),
        ("cuMipmappedArrayCreate", 4999, false, None),
        (
            "cuMipmappedArrayCreate",
            13050,
            false,
            Some("cuMipmappedArrayCreate"),
        ),
        ("cuArrayDestroy", 2000, false, Some("cuArrayDestroy")),
        ("cuArrayDestroy", 1999, false, None),
        ("cuArrayDestroy", 13050, false, Some("cuArrayDestroy")),
        (
            "cuMipmappedArrayDestroy",
            5000,
            false,
            Some("cuMipmappedArrayDestroy"),
        ),
        ("cuMipmappedArrayDestroy", 4999, false, None),
        (
            "cuMipmappedArrayDestroy",
            13050,
            false,
            Some("cuMipmappedArrayDestroy"),
        ),
        (
            "cuGraphAddMemAllocNode",
            11040,
            false,
            Some("cuGraphAddMemAllocNode"),
        ),
        ("cuGraphAddMemAllocNode", 11039, false, None),
        (
            "cuGraphAddMemAllocNode",
            13050,
            false,
            Some("cuGraphAddMemAllocNode"),
        ),
        (
            "cuGraphAddMemFreeNode",
            11040,
            false,
            Some("cuGraphAddMemFreeNode"),
        ),
        ("cuGraphAddMemFreeNode", 11039, false, None),
        (
            "cuGraphAddMemFreeNode",
            13050,
            false,
            Some("cuGraphAddMemFreeNode"),
        ),
        ("cuGraphAddNode", 12020, false, Some("cuGraphAddNode")),
        ("cuGraphAddNode", 12019, false, None),
        ("cuGraphAddNode", 13050, false, Some("cuGraphAddNode_v3")),
        ("cuGraphAddNode", 12030, false, Some("cuGraphAddNode_v2")),
        ("cuGraphAddNode", 12029, false, Some("cuGraphAddNode")),
        ("cuGraphAddNode", 13040, false, Some("cuGraphAddNode_v3")),
        ("cuGraphAddNode", 13039, false, Some("cuGraphAddNode_v2")),
        (
            "cuGraphInstantiate",
            10000,
            false,
            Some("cuGraphInstantiate"),
        ),
        ("cuGraphInstantiate", 9999, false, None),
        (
            "cuGraphInstantiate",
            13050,
            false,
            Some("cuGraphInstantiate_v2"),
        ),
        (
            "cuGraphInstantiate",
            11000,
            false,
            Some("cuGraphInstantiate_v2"),
        ),
        (
            "cuGraphInstantiate",
            10999,
            false,
            Some("cuGraphInstantiate"),
        ),
        (
            "cuGraphInstantiateWithFlags",
            11040,
            false,
            Some("cuGraphInstantiateWithFlags"),
        ),
        ("cuGraphInstantiateWithFlags", 11039, false, None),
        (
            "cuGraphInstantiateWithFlags",
            13050,
            false,
            Some("cuGraphInstantiateWithFlags"),
        ),
        (
            "cuGraphInstantiateWithParams",
            12000,
            false,
            Some("cuGraphInstantiateWithParams"),
        ),
        ("cuGraphInstantiateWithParams", 11999, false, None),
        (
            "cuGraphInstantiateWithParams",
            13050,
            false,
            Some("cuGraphInstantiateWithParams"),
        ),
        (
            "cuGraphInstantiateWithParams",
            12000,
            true,
            Some("cuGraphInstantiateWithParams_ptsz"),
        ),
        ("cuGraphInstantiateWithParams", 11999, true, None),
        (
            "cuGraphInstantiateWithParams",
            13050,
            true,
            Some("cuGraphInstantiateWithParams_ptsz"),
        ),
        ("cuGraphClone", 10000, false, Some("cuGraphClone")),
        ("cuGraphClone", 9999, false, None),
        ("cuGraphClone", 13050, false, Some("cuGraphClone")),
        ("cuGraphDestroy", 10000, false, Some("cuGraphDestroy")),
        ("cuGraphDestroy", 9999, false, None),
        ("cuGraphDestroy", 13050, false, Some("cuGraphDestroy")),
        (
            "cuGraphExecDestroy",
            10000,
            false,
            Some("cuGraphExecDestroy"),
        ),
        ("cuGraphExecDestroy", 9999, false, None),
        (
            "cuGraphExecDestroy",
            13050,
            false,
            Some("cuGraphExecDestroy"),
        ),
        ("cuMemGetInfo", 3020, false, Some("cuMemGetInfo_v2")),
        ("cuMemGetInfo", 3019, false, Some("cuMemGetInfo")),
        ("cuMemGetInfo", 13050, false, Some("cuMemGetInfo_v2")),
        ("cuDeviceTotalMem", 3020, false, Some("cuDeviceTotalMem_v2")),
        ("cuDeviceTotalMem", 3019, false, Some("cuDeviceTotalMem")),
        (
            "cuDeviceTotalMem",
            13050,
            false,
            Some("cuDeviceTotalMem_v2"),
        ),
        ("cuMemsetD8", 2000, false, Some("cuMemsetD8")),
        ("cuMemsetD8", 1999, false, None),
        ("cuMemsetD8", 3020, false, Some("cuMemsetD8_v2")),
        ("cuMemsetD8", 7000, true, Some("cuMemsetD8_v2_ptds")),
        ("cuMemsetD8", 6999, true, Some("cuMemsetD8_v2")),
        ("cuMemsetD8", 13050, true, Some("cuMemsetD8_v2_ptds")),
        ("cuMemsetD8Async", 3020, false, Some("cuMemsetD8Async")),
        ("cuMemsetD8Async", 3019, false, None),
        ("cuMemsetD8Async", 7000, true, Some("cuMemsetD8Async_ptsz")),
        ("cuMemsetD8Async", 13050, false, Some("cuMemsetD8Async")),
        ("cuMemsetD2D8", 2000, false, Some("cuMemsetD2D8")),
        ("cuMemsetD2D8", 1999, false, None),
        ("cuMemsetD2D8", 3020, false, Some("cuMemsetD2D8_v2")),
        ("cuMemsetD2D8", 7000, true, Some("cuMemsetD2D8_v2_ptds")),
        ("cuMemsetD2D8", 6999, true, Some("cuMemsetD2D8_v2")),
        ("cuMemsetD2D8", 13050, true, Some("cuMemsetD2D8_v2_ptds")),
        ("cuMemsetD2D8Async", 3020, false, Some("cuMemsetD2D8Async")),
        ("cuMemsetD2D8Async", 3019, false, None),
        (
            "cuMemsetD2D8Async",
            7000,
            true,
            Some("cuMemsetD2D8Async_ptsz"),
        ),
        ("cuMemsetD2D8Async", 13050, false, Some("cuMemsetD2D8Async")),
        ("cuMemsetD16", 2000, false, Some("cuMemsetD16")),
        ("cuMemsetD16", 1999, false, None),
        ("cuMemsetD16", 3020, false, Some("cuMemsetD16_v2")),
        ("cuMemsetD16", 7000, true, Some("cuMemsetD16_v2_ptds")),
        ("cuMemsetD16", 6999, true, Some("cuMemsetD16_v2")),
        ("cuMemsetD16", 13050, true, Some("cuMemsetD16_v2_ptds")),
        ("cuMemsetD16Async", 3020, false, Some("cuMemsetD16Async")),
        ("cuMemsetD16Async", 3019, false, None),
        (
            "cuMemsetD16Async",
            7000,
            true,
            Some("cuMemsetD16Async_ptsz"),
        ),
        ("cuMemsetD16Async", 13050, false, Some("cuMemsetD16Async")),
        ("cuMemsetD2D16", 2000, false, Some("cuMemsetD2D16")),
        ("cuMemsetD2D16", 1999, false, None),
        ("cuMemsetD2D16", 3020, false, Some("cuMemsetD2D16_v2")),
        ("cuMemsetD2D16", 7000, true, Some("cuMemsetD2D16_v2_ptds")),
        ("cuMemsetD2D16", 6999, true, Some("cuMemsetD2D16_v2")),
        ("cuMemsetD2D16", 13050, true, Some("cuMemsetD2D16_v2_ptds")),
        (
            "cuMemsetD2D16Async",
            3020,
            false,
            Some("cuMemsetD2D16Async"),
        ),
        ("cuMemsetD2D16Async", 3019, false, None),
        (
            "cuMemsetD2D16Async",
            7000,
            true,
            Some("cuMemsetD2D16Async_ptsz"),
        ),
        (
            "cuMemsetD2D16Async",
            13050,
            false,
            Some("cuMemsetD2D16Async"),
        ),
        ("cuMemsetD32", 2000, false, Some("cuMemsetD32")),
        ("cuMemsetD32", 1999, false, None),
        ("cuMemsetD32", 3020, false, Some("cuMemsetD32_v2")),
        ("cuMemsetD32", 7000, true, Some("cuMemsetD32_v2_ptds")),
        ("cuMemsetD32", 6999, true, Some("cuMemsetD32_v2")),
        ("cuMemsetD32", 13050, true, Some("cuMemsetD32_v2_ptds")),
        ("cuMemsetD32Async", 3020, false, Some("cuMemsetD32Async")),
        ("cuMemsetD32Async", 3019, false, None),
        (
            "cuMemsetD32Async",
            7000,
            true,
            Some("cuMemsetD32Async_ptsz"),
        ),
        ("cuMemsetD32Async", 13050, false, Some("cuMemsetD32Async")),
        ("cuMemsetD2D32", 2000, false, Some("cuMemsetD2D32")),
        ("cuMemsetD2D32", 1999, false, None),
        ("cuMemsetD2D32", 3020, false, Some("cuMemsetD2D32_v2")),
        ("cuMemsetD2D32", 7000, true, Some("cuMemsetD2D32_v2_ptds")),
        ("cuMemsetD2D32", 6999, true, Some("cuMemsetD2D32_v2")),
        ("cuMemsetD2D32", 13050, true, Some("cuMemsetD2D32_v2_ptds")),
        (
            "cuMemsetD2D32Async",
            3020,
            false,
            Some("cuMemsetD2D32Async"),
        ),
        ("cuMemsetD2D32Async", 3019, false, None),
        (
            "cuMemsetD2D32Async",
            7000,
            true,
            Some("cuMemsetD2D32Async_ptsz"),
        ),
        (
            "cuMemsetD2D32Async",
            13050,
            false,
            Some("cuMemsetD2D32Async"),
        ),
        ("cuMemcpyDtoD", 2000, false, Some("cuMemcpyDtoD")),
        ("cuMemcpyDtoD", 3020, false, Some("cuMemcpyDtoD_v2")),
        ("cuMemcpyDtoD", 7000, true, Some("cuMemcpyDtoD_v2_ptds")),
        ("cuMemcpyDtoDAsync", 3000, false, Some("cuMemcpyDtoDAsync")),
        ("cuMemcpyDtoDAsync", 2999, false, None),
        (
            "cuMemcpyDtoDAsync",
            3020,
            false,
            Some("cuMemcpyDtoDAsync_v2"),
        ),
        (
            "cuMemcpyDtoDAsync",
            7000,
            true,
            Some("cuMemcpyDtoDAsync_v2_ptsz"),
        ),
        ("cuMemcpy", 4000, false, Some("cuMemcpy")),
        ("cuMemcpy", 3999, false, None),
        ("cuMemcpy", 7000, true, Some("cuMemcpy_ptds")),
        ("cuMemcpy", 13050, false, Some("cuMemcpy")),
        ("cuMemcpyAsync", 4000, false, Some("cuMemcpyAsync")),
        ("cuMemcpyAsync", 7000, true, Some("cuMemcpyAsync_ptsz")),
        ("cuMemcpyAsync", 6999, true, Some("cuMemcpyAsync")),
        ("cuModuleLoadData", 2000, false, Some("cuModuleLoadData")),
        ("cuModuleLoadData", 13050, true, Some("cuModuleLoadData")),
        (
            "cuModuleLoadDataEx",
            2010,
            false,
            Some("cuModuleLoadDataEx"),
        ),
        ("cuModuleLoadDataEx", 2000, false, None),
        ("cuModuleUnload", 2000, false, Some("cuModuleUnload")),
        (
            "cuModuleLoadFatBinary",
            2000,
            false,
            Some("cuModuleLoadFatBinary"),
        ),
        ("cuLibraryLoadData", 12000, false, Some("cuLibraryLoadData")),
        ("cuLibraryLoadData", 11080, false, None),
        ("cuLibraryUnload", 12000, false, Some("cuLibraryUnload")),
        (
            "cuLibraryGetKernel",
            12000,
            false,
            Some("cuLibraryGetKernel"),
        ),
        (
            "cuKernelGetFunction",
            12000,
            true,
            Some("cuKernelGetFunction"),
        ),
    ];

    #[test]
    fn every_hooked_export_resolves_as_the_headers_say() {
        for &(name, version, per_thread, expected) in EXPECTED {
            assert_eq!(
                resolve(name, version, per_thread).map(|e| e.export).ok(),
                expected,
                "cuGetProcAddress({name}, {version}, per_thread={per_thread})"
            );
        }
        for (export, _, exported, _) in HOOKED.iter().filter(|h| h.2) {
            assert!(
                *exported && EXPECTED.iter().any(|r| r.3 == Some(*export)),
                "{export} has no row in EXPECTED"
            );
        }
    }

    #[test]
    fn resolution_table_for_hooked_functions() {
        let e = |n, v, p| resolve(n, v, p).map(|e| e.export).ok();
        // The cases that broke other interposers: never "the highest _vN".
        assert_eq!(e("cuMemAlloc", 3020, false), Some("cuMemAlloc_v2"));
        assert_eq!(e("cuLaunchKernel", 4000, false), Some("cuLaunchKernel"));
        assert_eq!(e("cuLaunchKernel", 7000, true), Some("cuLaunchKernel_ptsz"));
        assert_eq!(e("cuGraphLaunch", 10000, true), Some("cuGraphLaunch_ptsz"));
        assert_eq!(
            e("cuMemAllocAsync", 11020, true),
            Some("cuMemAllocAsync_ptsz")
        );
        assert_eq!(
            e("cuGetProcAddress", 11030, false),
            Some("cuGetProcAddress")
        );
        assert_eq!(
            e("cuGetProcAddress", 12000, false),
            Some("cuGetProcAddress_v2")
        );
        assert_eq!(e("cuCtxCreate", 3020, false), Some("cuCtxCreate_v2"));
        assert_eq!(e("cuCtxCreate", 11040, false), Some("cuCtxCreate_v3"));
        assert_eq!(e("cuCtxCreate", 12050, false), Some("cuCtxCreate_v4"));
        assert_eq!(
            e("cuStreamGetCaptureInfo", 10010, false),
            Some("cuStreamGetCaptureInfo")
        );
        assert_eq!(
            e("cuStreamGetCaptureInfo", 11030, false),
            Some("cuStreamGetCaptureInfo_v2")
        );
        assert_eq!(
            e("cuStreamGetCaptureInfo", 12030, false),
            Some("cuStreamGetCaptureInfo_v3")
        );
        assert_eq!(e("cuCtxGetDevice", 13000, false), Some("cuCtxGetDevice_v2"));
        assert_eq!(
            e("cuCtxPushCurrent", 4000, false),
            Some("cuCtxPushCurrent_v2")
        );
    }
}
