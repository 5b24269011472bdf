//! CUDA arrays, mipmapped arrays, texture and surface objects.
//!
//! An array is device memory with a descriptor: its elements are stored row after row (row pitch =
//! width × element size, no padding), slice after slice (layers and cube faces are slices), in one
//! anonymous mapping accounted like `cuMemAlloc`. Copies to and from arrays (`cuMemcpy2D/3D` with
//! `CU_MEMORYTYPE_ARRAY`, `cuMemcpy{HtoA,AtoH,AtoD,DtoA,AtoA}`) therefore move real bytes through
//! the same code as pitched copies. Texture and surface objects record their descriptors (kernels
//! do not compute on simgpu, so nothing samples them).

use parking_lot::Mutex;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::{Arc, OnceLock};

use super::{charge, map_anon, uncharge, unmap, Alloc, Kind};
use crate::driver;
use crate::driver::{current_ctx, out, R};
use crate::sim::{sim, Registry};
use crate::types::*;

/// `CUDA_ARRAY_MEMORY_REQUIREMENTS`.
#[repr(C)]
pub struct ArrayMemReq {
    pub size: usize,
    pub alignment: usize,
    pub reserved: [u32; 4],
}

/// Every CUDA_ARRAY3D_* flag of cuda.h (layered … video encode/decode).
const ARRAY3D_ALL_FLAGS: u32 = 0x1ff;

pub struct Array {
    pub desc: Array3DDesc,
    /// First byte of element (0, 0, 0).
    pub base: u64,
    /// Bytes per element.
    pub elem: u64,
    pub device: usize,
    /// A level of a mipmapped array (destroyed with it, not by cuArrayDestroy).
    pub mip_level: bool,
}

impl Array {
    /// Bytes per row.
    pub fn pitch(&self) -> u64 {
        self.desc.width as u64 * self.elem
    }
    /// Rows per slice (a 1D array has one).
    pub fn rows(&self) -> u64 {
        (self.desc.height as u64).max(1)
    }
    /// Slices (depth, layers or cube faces; at least one).
    pub fn slices(&self) -> u64 {
        (self.desc.depth as u64).max(1)
    }
    pub fn size(&self) -> u64 {
        self.pitch() * self.rows() * self.slices()
    }
}

pub struct Mipmap {
    pub desc: Array3DDesc,
    pub levels: Vec<usize>,
}

/// What a texture or surface object was created from (the application's descriptors, kept
/// byte for byte so the Get functions return them).
pub struct ResourceObject {
    pub res: [u8; RESOURCE_DESC_SIZE],
    pub tex: Option<[u8; TEXTURE_DESC_SIZE]>,
    pub view: Option<[u8; VIEW_DESC_SIZE]>,
}

/// sizeof(CUDA_RESOURCE_DESC), sizeof(CUDA_TEXTURE_DESC), sizeof(CUDA_RESOURCE_VIEW_DESC).
pub const RESOURCE_DESC_SIZE: usize = 144;
pub const TEXTURE_DESC_SIZE: usize = 104;
pub const VIEW_DESC_SIZE: usize = 112;

const RESOURCE_TYPE_ARRAY: u32 = 0;
const RESOURCE_TYPE_MIPMAPPED_ARRAY: u32 = 1;
const RESOURCE_TYPE_LINEAR: u32 = 2;
const RESOURCE_TYPE_PITCH2D: u32 = 3;

pub fn arrays() -> &'static Registry<Array> {
    static R: OnceLock<Registry<Array>> = OnceLock::new();
    R.get_or_init(Registry::default)
}
fn mipmaps() -> &'static Registry<Mipmap> {
    static R: OnceLock<Registry<Mipmap>> = OnceLock::new();
    R.get_or_init(Registry::default)
}

/// Texture objects and surface objects: handles are small non-zero integers (`CUtexObject` and
/// `CUsurfObject` are 64-bit values, not pointers).
struct Objects {
    map: Mutex<std::collections::HashMap<u64, Arc<ResourceObject>>>,
    next: AtomicU64,
}
fn objects(surface: bool) -> &'static Objects {
    static TEX: OnceLock<Objects> = OnceLock::new();
    static SURF: OnceLock<Objects> = OnceLock::new();
    let make = || Objects {
        map: Mutex::new(Default::default()),
        next: AtomicU64::new(1),
    };
    if surface {
        SURF.get_or_init(make)
    } else {
        TEX.get_or_init(make)
    }
}

/// The array behind a `CUarray` handle.
pub fn array(h: *mut c_void) -> Result<Arc<Array>, CUresult> {
    arrays().get(h as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)
}

/// Validates a descriptor the way `cuArray3DCreate` documents it.
fn check_desc(d: &Array3DDesc) -> Result<u64, CUresult> {
    if d.flags & !ARRAY3D_ALL_FLAGS != 0 || d.width == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let elem = array_element_size(d.format, d.channels).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let layered = d.flags & ARRAY3D_LAYERED != 0;
    if d.flags & ARRAY3D_CUBEMAP != 0 {
        // Cubemaps are square with 6 faces (a multiple of 6 when layered).
        let faces_ok = if layered {
            d.depth > 0 && d.depth.is_multiple_of(6)
        } else {
            d.depth == 6
        };
        if d.width != d.height || !faces_ok {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
    } else if layered && d.depth == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    } else if !layered && d.depth > 0 && d.height == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE); // a 3D array needs a height
    }
    if !within_limits(d) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(elem)
}

/// The extents `cuArray3DCreate` documents as valid for each kind of array, from the device's
/// maximum texture (and, with CUDA_ARRAY3D_SURFACE_LDST, surface) dimensions — the values
/// `cuDeviceGetAttribute` reports (`device.rs`). Larger extents are CUDA_ERROR_INVALID_VALUE.
fn within_limits(d: &Array3DDesc) -> bool {
    let (w, h, depth) = (d.width, d.height, d.depth);
    let surface = d.flags & ARRAY3D_SURFACE_LDST != 0;
    let layered = d.flags & ARRAY3D_LAYERED != 0;
    // (max width, max height, max depth or layers) for textures, then surfaces.
    let (tex, surf): ((usize, usize, usize), (usize, usize, usize)) =
        if d.flags & ARRAY3D_CUBEMAP != 0 {
            if layered {
                ((32768, 32768, 2046), (32768, 32768, 2046))
            } else {
                ((32768, 32768, 6), (32768, 32768, 6))
            }
        } else if layered && h == 0 {
            ((32768, 0, 2048), (32768, 0, 2048)) // 1D layered
        } else if layered {
            ((32768, 32768, 2048), (32768, 32768, 2048)) // 2D layered
        } else if depth > 0 {
            // 3D; a texture may also use the alternate 3D extents (8192 × 8192 × 32768).
            let alt = w <= 8192 && h <= 8192 && depth <= 32768;
            let t = if alt {
                (8192, 8192, 32768)
            } else {
                (16384, 16384, 16384)
            };
            (t, (16384, 16384, 16384))
        } else if h > 0 {
            ((131072, 65536, 0), (131072, 65536, 0)) // 2D
        } else {
            ((131072, 0, 0), (32768, 0, 0)) // 1D
        };
    let fits = |(mw, mh, md): (usize, usize, usize)| w <= mw && h <= mh && depth <= md;
    fits(tex) && (!surface || fits(surf))
}

/// The bytes of an array with this descriptor (elements stored densely), or None if the
/// product does not fit in 64 bits.
fn checked_size(d: &Array3DDesc, elem: u64) -> Option<u64> {
    (d.width as u64)
        .checked_mul(elem)?
        .checked_mul((d.height as u64).max(1))?
        .checked_mul((d.depth as u64).max(1))
}

/// Creates an array on the current context's device.
fn create(d: Array3DDesc, mip_level: bool) -> Result<usize, CUresult> {
    let s = sim()?;
    let ctx = current_ctx()?;
    let elem = check_desc(&d)?;
    let mut a = Array {
        desc: d,
        base: 0,
        elem,
        device: ctx.device,
        mip_level,
    };
    // Within the limits the size fits easily; checked all the same. More than the device has
    // is refused by `charge` with CUDA_ERROR_OUT_OF_MEMORY, as by the driver.
    let size = checked_size(&d, elem).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    debug_assert_eq!(size, a.size());
    charge(s, ctx.device, size)?;
    a.base = match map_anon(size) {
        Ok(b) => b,
        Err(e) => {
            uncharge(s, ctx.device, size);
            return Err(e);
        }
    };
    // Registered before it enters the allocation table, where a context destroy finds it.
    let base = a.base;
    let h = arrays().insert(Arc::new(a));
    // In the allocation table as array memory: copies see it as device memory; cuMemFree does
    // not free it, the destruction of its context does.
    let entry = Alloc {
        size,
        kind: Kind::Array,
        device: ctx.device,
        charged: size,
        ctx: Arc::as_ptr(&ctx) as usize,
        pool: 0,
        id: 0,
        host_flags: 0,
    };
    if let Err(e) = super::insert_live(s, base, entry) {
        arrays().remove(h);
        uncharge(s, ctx.device, size);
        unmap(base, size);
        return Err(e);
    }
    Ok(h)
}

/// Destroys array `h` once the work that may use it has completed (cuArrayDestroy
/// synchronises like cuMemFree).
fn destroy(h: usize) {
    let Some(s) = crate::sim::get() else { return };
    super::wait_for_users(s);
    let Some(a) = arrays().remove(h) else { return };
    if s.mem.lock().map.remove(&a.base).is_some() {
        uncharge(s, a.device, a.size());
        unmap(a.base, a.size());
    }
}

/// Destroys the array whose storage starts at `base` (context teardown). Returns whether there
/// was one.
pub fn destroy_at(base: u64) -> bool {
    let h = arrays()
        .values()
        .into_iter()
        .find(|a| a.base == base)
        .map(|a| Arc::as_ptr(&a) as usize);
    h.inspect(|h| destroy(*h)).is_some()
}

/// Reads a `T` at byte `off` of a descriptor.
fn field<T: Copy>(bytes: &[u8], off: usize) -> T {
    assert!(off + std::mem::size_of::<T>() <= bytes.len());
    // SAFETY: in bounds (checked above); read_unaligned has no alignment requirement.
    unsafe { std::ptr::read_unaligned(bytes.as_ptr().add(off) as *const T) }
}

/// Validates a `CUDA_RESOURCE_DESC`; `surface` requires an array with surface load/store.
fn check_resource(res: &[u8; RESOURCE_DESC_SIZE], surface: bool) -> R {
    let s = sim()?;
    // Layout: resType (u32) at 0, the union at 8, flags at 136.
    let kind: u32 = field(res, 0);
    if field::<u32>(res, 136) != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let handle: usize = field(res, 8);
    match kind {
        RESOURCE_TYPE_ARRAY => {
            let a = array(handle as *mut c_void)?;
            if surface && a.desc.flags & ARRAY3D_SURFACE_LDST == 0 {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
        }
        _ if surface => return Err(CUDA_ERROR_INVALID_VALUE),
        RESOURCE_TYPE_MIPMAPPED_ARRAY => {
            mipmaps().get(handle).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        }
        RESOURCE_TYPE_LINEAR | RESOURCE_TYPE_PITCH2D => {
            // linear: devPtr, format, numChannels, sizeInBytes;
            // pitch2D: devPtr, format, numChannels, width, height, pitchInBytes.
            let (format, channels): (u32, u32) = (field(res, 16), field(res, 20));
            array_element_size(format, channels).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            let len: usize = if kind == RESOURCE_TYPE_LINEAR {
                field(res, 24)
            } else {
                let (h, pitch): (usize, usize) = (field(res, 32), field(res, 40));
                pitch * h.saturating_sub(1)
                    + field::<usize>(res, 24)
                        * array_element_size(format, channels).unwrap_or(1) as usize
            };
            if handle == 0 || super::device_range(s, handle as u64, len.max(1) as u64).is_none() {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
        }
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    }
    Ok(())
}

/// Copies a descriptor of `N` bytes. Safety: a non-NULL `p` points to that descriptor (the
/// application's argument).
unsafe fn read_bytes<const N: usize>(p: *const c_void) -> Result<[u8; N], CUresult> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut b = [0u8; N];
    // SAFETY: `p` is not NULL (checked) and points to N readable bytes (this fn's contract); `b`
    // is a local array of N bytes, so the regions cannot overlap.
    unsafe { std::ptr::copy_nonoverlapping(p as *const u8, b.as_mut_ptr(), N) };
    Ok(b)
}

fn create_object(surface: bool, o: ResourceObject) -> u64 {
    let t = objects(surface);
    let h = t.next.fetch_add(1, AcqRel);
    t.map.lock().insert(h, Arc::new(o));
    h
}

fn object(surface: bool, h: u64) -> Result<Arc<ResourceObject>, CUresult> {
    objects(surface)
        .map
        .lock()
        .get(&h)
        .cloned()
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

/// Writes a descriptor of `N` bytes. Safety: a non-NULL `dst` has room for it (the application's
/// out-argument).
unsafe fn write_bytes<const N: usize>(dst: *mut c_void, b: &[u8; N]) -> R {
    if dst.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: `dst` is not NULL (checked) and has room for N bytes (this fn's contract); `b` is
    // a borrowed Rust array, distinct from the application's out-argument.
    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), dst as *mut u8, N) };
    Ok(())
}

driver! {
    fn cuArrayCreate_v2(ph: *mut *mut c_void, d: *const ArrayDesc) {
        let d = d.as_ref().ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let d3 = Array3DDesc::from(d);
        if ph.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(ph, create(d3, false)? as *mut c_void)
    }
    fn cuArray3DCreate_v2(ph: *mut *mut c_void, d: *const Array3DDesc) {
        let d = *d.as_ref().ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if ph.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(ph, create(d, false)? as *mut c_void)
    }
    fn cuArrayGetDescriptor_v2(d: *mut ArrayDesc, h: *mut c_void) {
        let a = array(h)?;
        if a.desc.depth != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE); // a 3D or layered array: use cuArray3DGetDescriptor
        }
        out(d, ArrayDesc { width: a.desc.width, height: a.desc.height, format: a.desc.format, channels: a.desc.channels })
    }
    fn cuArray3DGetDescriptor_v2(d: *mut Array3DDesc, h: *mut c_void) {
        out(d, array(h)?.desc)
    }
    fn cuArrayDestroy(h: *mut c_void) {
        let a = array(h)?;
        if a.mip_level {
            return Err(CUDA_ERROR_INVALID_VALUE); // owned by its mipmapped array
        }
        destroy(h as usize);
        Ok(())
    }
    fn cuArrayGetMemoryRequirements(r: *mut ArrayMemReq, h: *mut c_void, _dev: CUdevice) {
        let a = array(h)?;
        const ALIGN: u64 = 2 << 20;
        out(r, ArrayMemReq { size: a.size().div_ceil(ALIGN) as usize * ALIGN as usize, alignment: ALIGN as usize, reserved: [0; 4] })
    }
    fn cuMipmappedArrayCreate(ph: *mut *mut c_void, d: *const Array3DDesc, levels: u32) {
        let d = *d.as_ref().ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if ph.is_null() || levels == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        check_desc(&d)?;
        // At most as many levels as halvings of the largest dimension allow.
        let largest = d.width.max(d.height).max(if d.flags & (ARRAY3D_LAYERED | ARRAY3D_CUBEMAP) != 0 { 0 } else { d.depth });
        if levels > usize::BITS - largest.leading_zeros() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut list = Vec::new();
        for i in 0..levels {
            match create(d.mip_level(i), true) {
                Ok(h) => list.push(h),
                Err(e) => {
                    list.into_iter().for_each(destroy);
                    return Err(e);
                }
            }
        }
        let m = Arc::new(Mipmap { desc: d, levels: list });
        out(ph, mipmaps().insert(m) as *mut c_void)?;
        Ok(())
    }
    fn cuMipmappedArrayGetLevel(pa: *mut *mut c_void, h: *mut c_void, level: u32) {
        let m = mipmaps().get(h as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let l = *m.levels.get(level as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        out(pa, l as *mut c_void)
    }
    fn cuMipmappedArrayDestroy(h: *mut c_void) {
        let m = mipmaps().remove(h as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        m.levels.iter().copied().for_each(destroy);
        Ok(())
    }
    fn cuMipmappedArrayGetMemoryRequirements(r: *mut ArrayMemReq, h: *mut c_void, _dev: CUdevice) {
        let m = mipmaps().get(h as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        const ALIGN: u64 = 2 << 20;
        let total: u64 = m.levels.iter().filter_map(|l| arrays().get(*l)).map(|a| a.size().div_ceil(ALIGN) * ALIGN).sum();
        let _ = m.desc;
        out(r, ArrayMemReq { size: total as usize, alignment: ALIGN as usize, reserved: [0; 4] })
    }

    fn cuTexObjectCreate(ph: *mut u64, res: *const c_void, tex: *const c_void, view: *const c_void) {
        let res = read_bytes::<RESOURCE_DESC_SIZE>(res)?;
        let tex = read_bytes::<TEXTURE_DESC_SIZE>(tex)?;
        let view = if view.is_null() { None } else { Some(read_bytes::<VIEW_DESC_SIZE>(view)?) };
        if ph.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        check_resource(&res, false)?;
        out(ph, create_object(false, ResourceObject { res, tex: Some(tex), view }))
    }
    fn cuTexObjectDestroy(h: u64) {
        objects(false).map.lock().remove(&h).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        Ok(())
    }
    fn cuTexObjectGetResourceDesc(d: *mut c_void, h: u64) {
        write_bytes(d, &object(false, h)?.res)
    }
    fn cuTexObjectGetTextureDesc(d: *mut c_void, h: u64) {
        write_bytes(d, &object(false, h)?.tex.unwrap_or([0; TEXTURE_DESC_SIZE]))
    }
    fn cuTexObjectGetResourceViewDesc(d: *mut c_void, h: u64) {
        // No view was given: CUDA_ERROR_INVALID_VALUE, as documented.
        write_bytes(d, &object(false, h)?.view.ok_or(CUDA_ERROR_INVALID_VALUE)?)
    }
    fn cuSurfObjectCreate(ph: *mut u64, res: *const c_void) {
        let res = read_bytes::<RESOURCE_DESC_SIZE>(res)?;
        if ph.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        check_resource(&res, true)?;
        out(ph, create_object(true, ResourceObject { res, tex: None, view: None }))
    }
    fn cuSurfObjectDestroy(h: u64) {
        objects(true).map.lock().remove(&h).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        Ok(())
    }
    fn cuSurfObjectGetResourceDesc(d: *mut c_void, h: u64) {
        write_bytes(d, &object(true, h)?.res)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_sizes_match_cuda_h() {
        assert_eq!(std::mem::size_of::<ArrayDesc>(), 24);
        assert_eq!(std::mem::size_of::<Array3DDesc>(), 40);
        assert_eq!(std::mem::size_of::<ArrayMemReq>(), 32);
        // graph.rs reads CUDA_MEM_ALLOC_NODE_PARAMS past a CUmemPoolProps of this size.
        assert_eq!(std::mem::size_of::<crate::types::MemPoolProps>(), 88);
    }
}
