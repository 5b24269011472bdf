//! Issue 6 item 11: the shim charges a CUDA array never less than it takes, whatever its format.
//! simgpu refuses block-compressed and planar formats (so `shim_quota_regressions.rs` can only
//! show that a refused one leaves nothing charged); the sizing itself is checked here against
//! what those formats take: BC1/BC4 8 bytes and BC2/3/5/6H/7 16 bytes per 4×4 block, NV12 1.5 and
//! P010 3 bytes per pixel (a full-size luma plane and a half-size interleaved chroma plane).

use share::memory::array_bytes;
use share::types::Array3DDesc;

const BC1_UNORM: u32 = 0x91;
const BC4_SNORM: u32 = 0x98;
const BC3_UNORM: u32 = 0x95;
const BC6H_SF16: u32 = 0x9c;
const BC7_UNORM: u32 = 0x9d;
const BC7_UNORM_SRGB: u32 = 0x9e;
const P010: u32 = 0x9f;
const NV12: u32 = 0xb0;
const FLOAT: u32 = 0x20;

fn desc(format: u32, channels: u32, width: usize, height: usize, depth: usize) -> Array3DDesc {
    Array3DDesc {
        width,
        height,
        depth,
        format,
        channels,
        flags: 0,
    }
}

#[test]
fn block_compressed_arrays_are_charged_their_blocks() {
    for (format, block) in [
        (BC1_UNORM, 8),
        (BC4_SNORM, 8),
        (BC3_UNORM, 16),
        (BC6H_SF16, 16),
        (BC7_UNORM, 16),
        (BC7_UNORM_SRGB, 16),
    ] {
        // 4096² texels: 1024² blocks.
        assert_eq!(
            array_bytes(&desc(format, 4, 4096, 4096, 0)),
            Some(1024 * 1024 * block),
            "format {format:#x}"
        );
        // A partial block at the edge takes a whole block: 5×5 texels are 2×2 blocks.
        assert_eq!(
            array_bytes(&desc(format, 4, 5, 5, 0)),
            Some(4 * block),
            "format {format:#x}"
        );
        // 3D: per slice.
        assert_eq!(
            array_bytes(&desc(format, 4, 1024, 1024, 6)),
            Some(256 * 256 * 6 * block),
            "format {format:#x}"
        );
        // 1D (height 0): one row of blocks.
        assert_eq!(
            array_bytes(&desc(format, 4, 4096, 0, 0)),
            Some(1024 * block),
            "format {format:#x}"
        );
    }
}

#[test]
fn planar_arrays_are_charged_at_least_their_planes() {
    for (format, w, h) in [
        (NV12, 4096usize, 4096usize),
        (NV12, 1920, 1080),
        (P010, 3840, 2160),
    ] {
        let pixels = (w * h) as u64;
        let takes = match format {
            NV12 => pixels * 3 / 2,
            _ => pixels * 3,
        };
        let charged = array_bytes(&desc(format, 3, w, h, 0)).expect("no overflow");
        assert!(
            charged >= takes,
            "format {format:#x} {w}×{h}: charged {charged} < {takes} bytes it takes"
        );
    }
}

#[test]
fn dense_arrays_are_charged_exactly() {
    assert_eq!(
        array_bytes(&desc(FLOAT, 4, 1000, 300, 0)),
        Some(1000 * 300 * 16)
    );
    assert_eq!(
        array_bytes(&desc(FLOAT, 1, 64, 64, 64)),
        Some(64 * 64 * 64 * 4)
    );
}

#[test]
fn sizes_that_overflow_are_refused() {
    let big = 1usize << 40;
    for format in [BC1_UNORM, BC7_UNORM, NV12, P010, FLOAT] {
        assert_eq!(
            array_bytes(&desc(format, 4, big, big, 0)),
            None,
            "format {format:#x} 2^40 × 2^40"
        );
        assert_eq!(
            array_bytes(&desc(format, 4, usize::MAX, 1 << 20, 1 << 20)),
            None,
            "format {format:#x} usize::MAX wide"
        );
    }
}
