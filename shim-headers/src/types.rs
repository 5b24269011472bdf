//! Driver ABI types and constants used by simgpu and libshare (values from NVIDIA's `cuda.h`).
//! Enums are plain integers: an unknown value from a caller is an error, never UB.

use std::ffi::c_void;

pub type CUresult = u32;
pub type CUdevice = i32;
pub type CUdeviceptr = u64;
pub type CUcontext = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUevent = *mut c_void;
pub type CUmodule = *mut c_void;
pub type CUfunction = *mut c_void;
pub type CUlibrary = *mut c_void;
pub type CUkernel = *mut c_void;
pub type CUgraph = *mut c_void;
pub type CUgraphNode = *mut c_void;
pub type CUgraphExec = *mut c_void;
pub type CUmemoryPool = *mut c_void;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_DEINITIALIZED: CUresult = 4;
pub const CUDA_ERROR_NO_DEVICE: CUresult = 100;
pub const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
pub const CUDA_ERROR_INVALID_IMAGE: CUresult = 200;
pub const CUDA_ERROR_FILE_NOT_FOUND: CUresult = 301;
pub const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
pub const CUDA_ERROR_NOT_MAPPED: CUresult = 211;
pub const CUDA_ERROR_INVALID_HANDLE: CUresult = 400;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_NOT_READY: CUresult = 600;
pub const CUDA_ERROR_ILLEGAL_ADDRESS: CUresult = 700;
pub const CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: CUresult = 701;
pub const CUDA_ERROR_PEER_ACCESS_UNSUPPORTED: CUresult = 217;
pub const CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: CUresult = 704;
pub const CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE: CUresult = 708;
pub const CUDA_ERROR_CONTEXT_IS_DESTROYED: CUresult = 709;
pub const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;
pub const CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: CUresult = 900;
pub const CUDA_ERROR_ARRAY_IS_MAPPED: CUresult = 207;
pub const CUDA_ERROR_PEER_ACCESS_NOT_ENABLED: CUresult = 705;
pub const CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: CUresult = 712;
pub const CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED: CUresult = 713;
pub const CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE: CUresult = 910;
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;

/// `nvmlReturn_t` (values from NVIDIA's `nvml.h`).
pub type NvmlReturn = u32;
pub const NVML_SUCCESS: NvmlReturn = 0;
pub const NVML_ERROR_UNINITIALIZED: NvmlReturn = 1;
pub const NVML_ERROR_INVALID_ARGUMENT: NvmlReturn = 2;
pub const NVML_ERROR_NOT_SUPPORTED: NvmlReturn = 3;
pub const NVML_ERROR_NO_PERMISSION: NvmlReturn = 4;
pub const NVML_ERROR_ALREADY_INITIALIZED: NvmlReturn = 5;
pub const NVML_ERROR_NOT_FOUND: NvmlReturn = 6;
pub const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
pub const NVML_ERROR_DRIVER_NOT_LOADED: NvmlReturn = 9;
pub const NVML_ERROR_FUNCTION_NOT_FOUND: NvmlReturn = 13;
pub const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: NvmlReturn = 25;
pub const NVML_ERROR_UNKNOWN: NvmlReturn = 999;

/// Special stream handles.
pub const CU_STREAM_LEGACY: usize = 0x1;
pub const CU_STREAM_PER_THREAD: usize = 0x2;
pub const CU_STREAM_NON_BLOCKING: u32 = 0x1;

pub const CU_EVENT_DEFAULT: u32 = 0x0;
pub const CU_EVENT_DISABLE_TIMING: u32 = 0x2;

/// `CUstreamCaptureStatus` / `CUstreamCaptureMode`.
pub const CU_STREAM_CAPTURE_STATUS_ACTIVE: u32 = 1;
pub const CU_STREAM_CAPTURE_MODE_RELAXED: u32 = 2;

/// `CUmemPool_attribute`.
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: u32 = 5;
pub const CU_MEMPOOL_ATTR_USED_MEM_CURRENT: u32 = 7;

pub const CU_MEMORYTYPE_HOST: u32 = 1;
pub const CU_MEMORYTYPE_DEVICE: u32 = 2;
pub const CU_MEMORYTYPE_ARRAY: u32 = 3;
pub const CU_MEMORYTYPE_UNIFIED: u32 = 4;

pub const CU_DEVICE_CPU: i32 = -1;

/// `CUuuid`.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct CUuuid(pub [u8; 16]);

/// `CUDA_MEMCPY2D_v2`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Memcpy2D {
    pub src_x_in_bytes: usize,
    pub src_y: usize,
    pub src_memory_type: u32,
    pub src_host: *const c_void,
    pub src_device: CUdeviceptr,
    pub src_array: *mut c_void,
    pub src_pitch: usize,
    pub dst_x_in_bytes: usize,
    pub dst_y: usize,
    pub dst_memory_type: u32,
    pub dst_host: *mut c_void,
    pub dst_device: CUdeviceptr,
    pub dst_array: *mut c_void,
    pub dst_pitch: usize,
    pub width_in_bytes: usize,
    pub height: usize,
}

/// `CUDA_MEMCPY3D_v2`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Memcpy3D {
    pub src_x_in_bytes: usize,
    pub src_y: usize,
    pub src_z: usize,
    pub src_lod: usize,
    pub src_memory_type: u32,
    pub src_host: *const c_void,
    pub src_device: CUdeviceptr,
    pub src_array: *mut c_void,
    pub reserved0: *mut c_void,
    pub src_pitch: usize,
    pub src_height: usize,
    pub dst_x_in_bytes: usize,
    pub dst_y: usize,
    pub dst_z: usize,
    pub dst_lod: usize,
    pub dst_memory_type: u32,
    pub dst_host: *mut c_void,
    pub dst_device: CUdeviceptr,
    pub dst_array: *mut c_void,
    pub reserved1: *mut c_void,
    pub dst_pitch: usize,
    pub dst_height: usize,
    pub width_in_bytes: usize,
    pub height: usize,
    pub depth: usize,
}

/// `CUlaunchConfig` (attributes are read but only the grid/block/stream matter here).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct LaunchConfig {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
    pub stream: CUstream,
    pub attrs: *mut c_void,
    pub num_attrs: u32,
}

/// `CUDA_LAUNCH_PARAMS_v1`: one entry of `cuLaunchCooperativeKernelMultiDevice`'s list.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct LaunchParams {
    pub function: *mut c_void,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
    pub stream: CUstream,
    pub kernel_params: *mut *mut c_void,
}

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemLocation {
    pub kind: u32,
    pub id: i32,
}
pub const CU_MEM_LOCATION_TYPE_DEVICE: u32 = 1;
pub const CU_MEM_LOCATION_TYPE_HOST: u32 = 2;

/// `CUmemAllocationProp`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemAllocationProp {
    pub kind: u32,
    pub requested_handle_types: u32,
    pub location: MemLocation,
    pub win32_handle_meta_data: *mut c_void,
    pub alloc_flags: [u8; 8],
}

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemAccessDesc {
    pub location: MemLocation,
    pub flags: u32,
}

/// `CUmemPoolProps` (only the location matters here).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemPoolProps {
    pub alloc_type: u32,
    pub handle_types: u32,
    pub location: MemLocation,
    pub win32_security_attributes: *mut c_void,
    pub max_size: usize,
    pub usage: u16,
    pub reserved: [u8; 54],
}

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (v1 and v2 share this layout).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemAllocNodeParams {
    pub pool_props: MemPoolProps,
    pub access_descs: *const MemAccessDesc,
    pub access_desc_count: usize,
    pub bytesize: usize,
    /// Out: the allocation's address.
    pub dptr: CUdeviceptr,
}

pub const CU_GRAPH_NODE_TYPE_MEM_ALLOC: u32 = 10;
pub const CU_GRAPH_NODE_TYPE_MEM_FREE: u32 = 11;

/// `CUgraphNodeParams` (cuGraphAddNode): the node type, then a 232-byte union of which only the
/// memory-node members are named here.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct GraphNodeParams {
    pub kind: u32,
    pub reserved0: [i32; 3],
    /// The union, as `CUDA_MEM_ALLOC_NODE_PARAMS_v2` (valid when `kind` is MEM_ALLOC).
    pub alloc: MemAllocNodeParams,
    pub union_rest: [u8; 232 - std::mem::size_of::<MemAllocNodeParams>()],
    pub reserved2: i64,
}

impl GraphNodeParams {
    /// The union as `CUDA_MEM_FREE_NODE_PARAMS` (`{ CUdeviceptr dptr; }`; valid when `kind` is
    /// MEM_FREE): its first eight bytes.
    pub fn free_dptr(&self) -> CUdeviceptr {
        // SAFETY: the union starts at `alloc`, whose first eight bytes are two u32 fields
        // (`pool_props.alloc_type`, `handle_types`: no padding, so initialised); the read is
        // unaligned-safe and any bit pattern is a valid u64.
        unsafe { std::ptr::read_unaligned(&self.alloc as *const MemAllocNodeParams as *const u64) }
    }
}

/// `CUDA_ARRAY_DESCRIPTOR`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ArrayDesc {
    pub width: usize,
    pub height: usize,
    pub format: u32,
    pub channels: u32,
}

/// `CUDA_ARRAY_DESCRIPTOR_v1` (the CUDA 2.x ABI of `cuArrayCreate`: 32-bit sizes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ArrayDescV1 {
    pub width: u32,
    pub height: u32,
    pub format: u32,
    pub channels: u32,
}

/// `CUDA_ARRAY3D_DESCRIPTOR_v1` (the CUDA 2.x ABI of `cuArray3DCreate`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Array3DDescV1 {
    pub width: u32,
    pub height: u32,
    pub depth: u32,
    pub format: u32,
    pub channels: u32,
    pub flags: u32,
}

impl From<&Array3DDescV1> for Array3DDesc {
    fn from(d: &Array3DDescV1) -> Array3DDesc {
        Array3DDesc {
            width: d.width as usize,
            height: d.height as usize,
            depth: d.depth as usize,
            format: d.format,
            channels: d.channels,
            flags: d.flags,
        }
    }
}

impl From<&ArrayDescV1> for Array3DDesc {
    fn from(d: &ArrayDescV1) -> Array3DDesc {
        Array3DDesc {
            width: d.width as usize,
            height: d.height as usize,
            depth: 0,
            format: d.format,
            channels: d.channels,
            flags: 0,
        }
    }
}

/// `CUDA_ARRAY3D_DESCRIPTOR`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Array3DDesc {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: u32,
    pub channels: u32,
    pub flags: u32,
}

pub const ARRAY3D_LAYERED: u32 = 0x01;
pub const ARRAY3D_SURFACE_LDST: u32 = 0x02;
pub const ARRAY3D_CUBEMAP: u32 = 0x04;

impl From<&ArrayDesc> for Array3DDesc {
    /// A 1D or 2D array as the 3D descriptor with depth 0 and no flags.
    fn from(d: &ArrayDesc) -> Array3DDesc {
        Array3DDesc {
            width: d.width,
            height: d.height,
            depth: 0,
            format: d.format,
            channels: d.channels,
            flags: 0,
        }
    }
}

impl Array3DDesc {
    /// Level `i` of a mipmapped array of this descriptor: each dimension halves (at least 1);
    /// layers and cube faces do not.
    pub fn mip_level(&self, i: u32) -> Array3DDesc {
        let shrink = |v: usize| if v == 0 { 0 } else { (v >> i).max(1) };
        let layered = self.flags & (ARRAY3D_LAYERED | ARRAY3D_CUBEMAP) != 0;
        Array3DDesc {
            width: shrink(self.width),
            height: shrink(self.height),
            depth: if layered {
                self.depth
            } else {
                shrink(self.depth)
            },
            ..*self
        }
    }

    /// The array's elements laid out densely (rows × slices, no padding), or None for formats
    /// without a fixed element size (block-compressed, planar video) or a bad channel count.
    /// Drivers pad and tile, so on a GPU an array takes at least this much.
    pub fn dense_bytes(&self) -> Option<u64> {
        let elem = array_element_size(self.format, self.channels)?;
        let rows = (self.height as u64).max(1);
        let slices = (self.depth as u64).max(1);
        (self.width as u64)
            .checked_mul(elem)?
            .checked_mul(rows)?
            .checked_mul(slices)
    }
}

/// Bytes per element of array format `format` (`CUarray_format`) × `channels`, or None for
/// formats without a fixed element size (block-compressed and planar video formats).
pub fn array_element_size(format: u32, channels: u32) -> Option<u64> {
    let per_channel = match format {
        0x01 | 0x08 => 1,        // (un)signed int8
        0x02 | 0x09 | 0x10 => 2, // (un)signed int16, half
        0x03 | 0x0a | 0x20 => 4, // (un)signed int32, float
        // Formats with the channel count in the name: the descriptor's count must match.
        0x50 => return (channels == 1).then_some(4), // UNORM_INT_101010_2
        0xc0..=0xcb => {
            let i = format - 0xc0;
            let (bytes, n) = (
                if (i / 3).is_multiple_of(2) { 1 } else { 2 },
                [1, 2, 4][(i % 3) as usize],
            );
            return (channels == n).then_some(bytes * n as u64);
        }
        _ => return None,
    };
    matches!(channels, 1 | 2 | 4).then_some(per_channel * channels as u64)
}

#[cfg(test)]
mod array_tests {
    use super::*;

    #[test]
    fn graph_node_params_match_cuda_h() {
        assert_eq!(std::mem::size_of::<MemAllocNodeParams>(), 120);
        assert_eq!(std::mem::size_of::<GraphNodeParams>(), 256);
        assert_eq!(std::mem::offset_of!(GraphNodeParams, alloc), 16);
    }

    #[test]
    fn launch_params_match_cuda_h() {
        // CUDA_LAUNCH_PARAMS_v1: function, 7 unsigned ints, (pad), hStream, kernelParams.
        assert_eq!(std::mem::size_of::<LaunchParams>(), 56);
        assert_eq!(std::mem::offset_of!(LaunchParams, shared_mem_bytes), 32);
        assert_eq!(std::mem::offset_of!(LaunchParams, stream), 40);
        assert_eq!(std::mem::offset_of!(LaunchParams, kernel_params), 48);
    }

    #[test]
    fn element_sizes() {
        assert_eq!(array_element_size(0x20, 4), Some(16)); // float4
        assert_eq!(array_element_size(0x01, 4), Some(4)); // uchar4
        assert_eq!(array_element_size(0x10, 2), Some(4)); // half2
        assert_eq!(array_element_size(0x01, 3), None);
        assert_eq!(array_element_size(0xc2, 4), Some(4)); // UNORM_INT8X4
        assert_eq!(array_element_size(0xc5, 4), Some(8)); // UNORM_INT16X4
        assert_eq!(array_element_size(0xc9, 1), Some(2)); // SNORM_INT16X1
        assert_eq!(array_element_size(0x91, 4), None); // BC1: not laid out
    }

    #[test]
    fn mip_levels_halve_but_keep_layers_and_sizes_are_dense() {
        let d = Array3DDesc {
            width: 64,
            height: 20,
            depth: 3,
            format: 0x20,
            channels: 1,
            flags: ARRAY3D_LAYERED,
        };
        let l = d.mip_level(3);
        assert_eq!((l.width, l.height, l.depth), (8, 2, 3));
        let l = d.mip_level(6);
        assert_eq!((l.width, l.height), (1, 1));
        assert_eq!(d.dense_bytes(), Some(64 * 20 * 3 * 4));
        let flat = Array3DDesc::from(&ArrayDesc {
            width: 100,
            height: 0,
            format: 0x01,
            channels: 4,
        });
        assert_eq!(flat.dense_bytes(), Some(400));
    }
}
