//! Metadata of CUDA module images: which kernels (with their parameter layout) and which
//! `__device__` / `__constant__` globals an image defines, and the PTX a fatbin carries.
//!
//! simgpu loads modules with it (the simulated driver does not execute kernels, so it reads only
//! names and sizes), and the slicer's tools read the PTX of the libraries a job loads
//! ([`host_fatbins`], [`fatbin_ptx`]). It reads NVIDIA's formats as nvcc writes them; nothing in
//! it is simgpu's. Accepted
//! images are those `cuModuleLoadData`, `cuModuleLoadDataEx`, `cuModuleLoadFatBinary` and
//! `cuLibraryLoadData` accept:
//!
//! - a fatbin wrapper (`__fatBinC_Wrapper_t`, magic `0x466243b1`) whose `data` points to a fatbin;
//! - a fatbin container (magic `0xBA55ED50`): a 16-byte header then entries, each a PTX text
//!   (kind 1), an ELF cubin (kind 2) or a concatenation of several of those (kind 0x100, from
//!   `nvcc -concat`); payloads may be zstd (flag `0x8000`, the nvcc default for PTX and with
//!   `-compress-all`) or LZ4-block (flag `0x2000`, `-compress-mode=speed`) compressed;
//! - a 64-bit little-endian ELF cubin;
//! - a NUL-terminated PTX text.
//!
//! Kernels and globals are collected from every entry of a fatbin and deduplicated by name. In a
//! cubin, kernels are the functions flagged `STO_CUDA_ENTRY` (local binding included: kernels
//! with internal linkage are local), and their parameter layout comes from the
//! `EIATTR_KPARAM_INFO` / `EIATTR_KPARAM_INFO_V2` attributes of `.nv.info.<kernel>`; a kernel no
//! cubin describes gets its layout from the PTX `.entry` declaration. Layouts can differ between
//! the cubins of different architectures: [`parse_image`] keeps the first cubin's,
//! [`parse_image_for_arch`] the one the driver would run on a given device.
//!
//! Malformed input gives an [`ImageError`], never a panic, and nothing is read outside the bounds
//! that the image's own headers give.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;

mod elf;
mod fatbin;
mod ptx;
use elf::*;
use fatbin::*;
use ptx::*;

/// One kernel parameter: its byte offset in the parameter buffer and its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamInfo {
    pub offset: u32,
    pub size: u32,
}

/// A kernel (`__global__` function, PTX `.entry`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelInfo {
    pub name: String,
    /// Parameters ordered by ordinal; `None` if the image does not say.
    pub params: Option<Vec<ParamInfo>>,
}

impl KernelInfo {
    /// Size of the parameter buffer (end of the last parameter), if the layout is known.
    pub fn params_size(&self) -> Option<u32> {
        self.params.as_ref().map(|ps| {
            ps.iter()
                .map(|p| p.offset.saturating_add(p.size))
                .max()
                .unwrap_or(0)
        })
    }
}

/// A module-scope variable (`__device__`, `__constant__`, `__managed__`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GlobalInfo {
    pub name: String,
    pub size: u64,
    /// Initial bytes (`size` of them) when the image has them; `None` means zero-initialised or
    /// unknown.
    pub init: Option<Vec<u8>>,
}

/// Everything found in one image.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageInfo {
    pub kernels: Vec<KernelInfo>,
    pub globals: Vec<GlobalInfo>,
}

impl ImageInfo {
    pub fn kernel(&self, name: &str) -> Option<&KernelInfo> {
        self.kernels.iter().find(|k| k.name == name)
    }

    pub fn global(&self, name: &str) -> Option<&GlobalInfo> {
        self.globals.iter().find(|g| g.name == name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageError {
    /// The image pointer (or a fatbin wrapper's data pointer) is null.
    Null,
    /// Not a fatbin wrapper, fatbin, ELF or PTX; carries the first four bytes (little-endian).
    UnknownFormat(u32),
    /// A header or table points outside the image, or is inconsistent.
    Truncated(&'static str),
    /// Recognised but not handled (32-bit ELF, unknown compression, ...).
    Unsupported(String),
}

impl fmt::Display for ImageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImageError::Null => write!(f, "module image pointer is null"),
            ImageError::UnknownFormat(m) => write!(
                f,
                "module image is not a fatbin, cubin or PTX (first bytes {m:#010x})"
            ),
            ImageError::Truncated(what) => {
                write!(f, "module image is truncated or malformed: {what}")
            }
            ImageError::Unsupported(what) => write!(f, "module image is not supported: {what}"),
        }
    }
}

impl std::error::Error for ImageError {}

type Result<T> = std::result::Result<T, ImageError>;

const FATBIN_WRAPPER_MAGIC: u32 = 0x466243b1;
const FATBIN_MAGIC: u32 = 0xBA55ED50;
const ELF_MAGIC: u32 = 0x464c457f;

/// Largest image or fatbin accepted through a raw pointer (a sanity bound on header values).
const MAX_IMAGE: u64 = 4 << 30;
/// Largest decompressed fatbin entry.
const MAX_DECOMPRESSED: u64 = 1 << 30;

const FATBIN_HEADER_LEN: usize = 16;
const ENTRY_HEADER_LEN: usize = 64;
const ENTRY_KIND_PTX: u16 = 1;
const ENTRY_KIND_ELF: u16 = 2;
const ENTRY_KIND_CONCAT: u16 = 0x100;
const ENTRY_FLAG_LZ4: u64 = 0x2000;
const ENTRY_FLAG_ZSTD: u64 = 0x8000;

/// Parses the image a CUDA program hands to the driver.
///
/// # Safety
/// `ptr` points to a fatbin wrapper, a fatbin, an ELF cubin or a NUL-terminated PTX text, as
/// the CUDA driver API accepts. Reads stay within the length that the image's headers give (for
/// PTX, up to its NUL).
pub unsafe fn parse_image(ptr: *const u8) -> Result<ImageInfo> {
    // SAFETY: same contract.
    unsafe { parse_image_with(ptr, Collector::new(None)) }
}

/// Same as [`parse_image`] for a device of compute capability `sm` (major × 10 + minor, e.g. 80):
/// where the cubins for several architectures give a kernel different parameter layouts (they
/// can: ptxas aligns a parameter's address in the constant bank, whose base differs by
/// architecture), the layout is taken from the cubin the driver would run: the highest
/// architecture not above `sm`, else the lowest above it.
///
/// # Safety
/// As for [`parse_image`].
pub unsafe fn parse_image_for_arch(ptr: *const u8, sm: u32) -> Result<ImageInfo> {
    // SAFETY: same contract.
    unsafe { parse_image_with(ptr, Collector::new(Some(sm))) }
}

/// Same as [`parse_bytes`], choosing parameter layouts as [`parse_image_for_arch`] does.
pub fn parse_bytes_for_arch(data: &[u8], sm: u32) -> Result<ImageInfo> {
    parse_bytes_with(data, Collector::new(Some(sm)))
}

/// A PTX module a fatbin carries: the virtual architecture it was compiled for (major × 10 +
/// minor, as the entry's header gives it) and its text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PtxModule {
    pub arch: u32,
    pub text: String,
}

/// Every PTX module of the fatbin `fat` starts with, decompressed, in the fatbin's order. Cubins
/// are skipped, and so are concatenated entries (`nvcc -concat`, which no toolkit library uses).
pub fn fatbin_ptx(fat: &[u8]) -> Result<Vec<PtxModule>> {
    let mut out = Vec::new();
    for (e, _, payload) in entries(fat)? {
        if e.kind != ENTRY_KIND_PTX {
            continue;
        }
        let content = decompress(&e, payload)?;
        let end = content
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(content.len());
        let text = std::str::from_utf8(&content[..end])
            .map_err(|_| ImageError::Truncated("PTX entry is not UTF-8 text"))?;
        if !looks_like_ptx(text.as_bytes()) {
            return Err(ImageError::Truncated("PTX entry is not PTX text"));
        }
        out.push(PtxModule {
            arch: e.arch,
            text: text.to_owned(),
        });
    }
    Ok(out)
}

/// The PTX an image handed to the driver carries: a PTX text itself (architecture 0: it names
/// its own target); for a fatbin or its wrapper, every PTX entry ([`fatbin_ptx`]); none for an
/// ELF cubin or a text that is not PTX. Which one a device can use: [`PtxModule::best_for`].
///
/// # Safety
/// As for [`parse_image`].
pub unsafe fn image_ptx(ptr: *const u8) -> Result<Vec<PtxModule>> {
    if ptr.is_null() {
        return Err(ImageError::Null);
    }
    // SAFETY: caller contract.
    let fat = match unsafe { head(ptr) }.map(u32::from_le_bytes) {
        Some(FATBIN_WRAPPER_MAGIC) => {
            // SAFETY: as in `parse_image_with`.
            let data = unsafe { std::ptr::read_unaligned(ptr.add(8) as *const *const u8) };
            if data.is_null() {
                return Err(ImageError::Null);
            }
            // SAFETY: the wrapper's data points to a fatbin.
            unsafe { fatbin_from_ptr(data)? }
        }
        // SAFETY: caller contract.
        Some(FATBIN_MAGIC) => unsafe { fatbin_from_ptr(ptr)? },
        Some(ELF_MAGIC) => return Ok(Vec::new()),
        _ => {
            // SAFETY: not a binary image, so per the contract a NUL-terminated text.
            let text = unsafe { std::ffi::CStr::from_ptr(ptr as *const std::ffi::c_char) };
            let text = text.to_bytes();
            return Ok(match std::str::from_utf8(text) {
                Ok(t) if looks_like_ptx(text) => vec![PtxModule {
                    arch: 0,
                    text: t.to_owned(),
                }],
                _ => Vec::new(),
            });
        }
    };
    fatbin_ptx(fat)
}

impl PtxModule {
    /// Of `modules`, the one a device of compute capability `sm` (major × 10 + minor) would
    /// JIT: the highest virtual architecture not above `sm` (a PTX text, architecture 0,
    /// always fits).
    pub fn best_for(modules: &[PtxModule], sm: u32) -> Option<&PtxModule> {
        modules
            .iter()
            .filter(|m| m.arch <= sm)
            .max_by_key(|m| m.arch)
    }
}

/// The fatbins a host ELF (a program or shared library nvcc linked) embeds in its `.nv_fatbin`
/// section, in order (each starts with its header; the padding between them is skipped). A file
/// without that section has none.
pub fn host_fatbins(elf: &[u8]) -> Result<Vec<&[u8]>> {
    if elf.len() < 4 || le_u32(elf, 0)? != ELF_MAGIC {
        return Err(ImageError::UnknownFormat(if elf.len() >= 4 {
            le_u32(elf, 0)?
        } else {
            0
        }));
    }
    let secs = sections(elf)?;
    let Some(sec) = secs.iter().find(|s| s.name == b".nv_fatbin") else {
        return Ok(Vec::new());
    };
    let data = section_bytes(elf, sec, ".nv_fatbin section")?;
    let mut out = Vec::new();
    let mut off = 0usize;
    while off + FATBIN_HEADER_LEN <= data.len() {
        if le_u32(data, off)? != FATBIN_MAGIC {
            off += 1; // padding before the next fatbin
            continue;
        }
        let len = fatbin_len(&data[off..])?;
        out.push(slice(data, off as u64, len as u64, "fatbin in .nv_fatbin")?);
        off += len;
    }
    Ok(out)
}

/// The first four bytes of an image, or None when a NUL comes first (a short PTX text may be
/// shorter than four bytes, and none of the binary magics contains a zero byte).
///
/// # Safety
/// As for [`parse_image`].
unsafe fn head(ptr: *const u8) -> Option<[u8; 4]> {
    let mut head = [0u8; 4];
    for (n, byte) in head.iter_mut().enumerate() {
        // SAFETY: the bytes before this one were not NUL, so per the contract this one exists.
        let b = unsafe { *ptr.add(n) };
        if b == 0 {
            return None;
        }
        *byte = b;
    }
    Some(head)
}

/// # Safety
/// As for [`parse_image`].
unsafe fn parse_image_with(ptr: *const u8, mut c: Collector) -> Result<ImageInfo> {
    if ptr.is_null() {
        return Err(ImageError::Null);
    }
    // SAFETY: caller contract.
    if let Some(head) = unsafe { head(ptr) } {
        match u32::from_le_bytes(head) {
            FATBIN_WRAPPER_MAGIC => {
                // struct { u32 magic; u32 version; const void *data; void *filename_or_fatbins; }
                // SAFETY: a wrapper is at least 16 bytes; read_unaligned tolerates any alignment.
                let data = unsafe { std::ptr::read_unaligned(ptr.add(8) as *const *const u8) };
                if data.is_null() {
                    return Err(ImageError::Null);
                }
                // SAFETY: the wrapper's data points to a fatbin.
                let fat = unsafe { fatbin_from_ptr(data)? };
                parse_fatbin(fat, &mut c)?;
                return Ok(c.finish());
            }
            FATBIN_MAGIC => {
                // SAFETY: caller contract.
                let fat = unsafe { fatbin_from_ptr(ptr)? };
                parse_fatbin(fat, &mut c)?;
                return Ok(c.finish());
            }
            ELF_MAGIC => {
                // SAFETY: caller contract; `elf_from_ptr` reads only what the headers describe.
                let elf = unsafe { elf_from_ptr(ptr)? };
                parse_elf(elf, 0, &mut c)?;
                return Ok(c.finish());
            }
            _ => {}
        }
    }
    // SAFETY: not a binary image, so per the contract a NUL-terminated text.
    let text = unsafe { std::ffi::CStr::from_ptr(ptr as *const std::ffi::c_char) }.to_bytes();
    parse_text(text, c)
}

/// Same as [`parse_image`] for an image in a buffer of known length (a file, a test). A fatbin
/// wrapper cannot be followed here (its data is a pointer) and gives `Unsupported`.
pub fn parse_bytes(data: &[u8]) -> Result<ImageInfo> {
    parse_bytes_with(data, Collector::new(None))
}

fn parse_bytes_with(data: &[u8], mut c: Collector) -> Result<ImageInfo> {
    if data.len() >= 4 && !data[..4].contains(&0) {
        match le_u32(data, 0)? {
            FATBIN_WRAPPER_MAGIC => {
                return Err(ImageError::Unsupported(
                    "a fatbin wrapper holds a pointer; pass it to parse_image".into(),
                ))
            }
            FATBIN_MAGIC => {
                let len = fatbin_len(data)?;
                let fat = data
                    .get(..len)
                    .ok_or(ImageError::Truncated("fatbin shorter than its header says"))?;
                parse_fatbin(fat, &mut c)?;
                return Ok(c.finish());
            }
            ELF_MAGIC => {
                let len = elf_len(|off, len| slice(data, off, len, "ELF headers"))?;
                let elf = data
                    .get(..len as usize)
                    .ok_or(ImageError::Truncated("ELF shorter than its headers say"))?;
                parse_elf(elf, 0, &mut c)?;
                return Ok(c.finish());
            }
            _ => {}
        }
    }
    let end = data.iter().position(|&b| b == 0).unwrap_or(data.len());
    parse_text(&data[..end], c)
}

fn parse_text(text: &[u8], mut c: Collector) -> Result<ImageInfo> {
    if !looks_like_ptx(text) {
        let mut head = [0u8; 4];
        for (d, s) in head.iter_mut().zip(text) {
            *d = *s;
        }
        return Err(ImageError::UnknownFormat(u32::from_le_bytes(head)));
    }
    parse_ptx(text, &mut c)?;
    Ok(c.finish())
}

// ---------------------------------------------------------------------------------------------
// Byte helpers

fn slice<'a>(data: &'a [u8], off: u64, len: u64, what: &'static str) -> Result<&'a [u8]> {
    let end = off.checked_add(len).ok_or(ImageError::Truncated(what))?;
    let (off, end) = (
        usize::try_from(off).map_err(|_| ImageError::Truncated(what))?,
        usize::try_from(end).map_err(|_| ImageError::Truncated(what))?,
    );
    data.get(off..end).ok_or(ImageError::Truncated(what))
}

fn le_u16(d: &[u8], off: usize) -> Result<u16> {
    d.get(off..off.wrapping_add(2))
        .and_then(|b| b.try_into().ok())
        .map(u16::from_le_bytes)
        .ok_or(ImageError::Truncated("short read"))
}

fn le_u32(d: &[u8], off: usize) -> Result<u32> {
    d.get(off..off.wrapping_add(4))
        .and_then(|b| b.try_into().ok())
        .map(u32::from_le_bytes)
        .ok_or(ImageError::Truncated("short read"))
}

fn le_u64(d: &[u8], off: usize) -> Result<u64> {
    d.get(off..off.wrapping_add(8))
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
        .ok_or(ImageError::Truncated("short read"))
}

/// Builds a slice from a raw pointer after bounding the range by [`MAX_IMAGE`].
///
/// # Safety
/// `ptr..ptr+off+len` must be readable (the image's headers say it is part of the image).
unsafe fn raw_slice<'a>(
    ptr: *const u8,
    off: u64,
    len: u64,
    what: &'static str,
) -> Result<&'a [u8]> {
    match off.checked_add(len) {
        Some(end) if end <= MAX_IMAGE => {
            // SAFETY: bounded above; readability is the caller's contract.
            Ok(unsafe { std::slice::from_raw_parts(ptr.add(off as usize), len as usize) })
        }
        _ => Err(ImageError::Truncated(what)),
    }
}

// ---------------------------------------------------------------------------------------------
// Collecting and merging

/// Where a kernel's or global's description came from.
#[derive(Clone, Copy)]
enum Source {
    Ptx,
    /// A cubin for this architecture (major × 10 + minor; 0 if unknown).
    Elf(u32),
}

struct Collector {
    info: ImageInfo,
    /// Architecture whose cubin's parameter layouts are preferred.
    target_sm: Option<u32>,
    kernel_index: HashMap<String, usize>,
    /// Rank of the source of each kernel's params (see `rank`).
    kernel_rank: Vec<u64>,
    global_index: HashMap<String, usize>,
    global_from_elf: Vec<bool>,
}

impl Collector {
    fn new(target_sm: Option<u32>) -> Collector {
        Collector {
            info: ImageInfo::default(),
            target_sm,
            kernel_index: HashMap::new(),
            kernel_rank: Vec::new(),
            global_index: HashMap::new(),
            global_from_elf: Vec::new(),
        }
    }

    /// Higher is preferred: any cubin over PTX; with a target, the highest architecture not
    /// above it, then the lowest above it. Equal ranks keep the first seen.
    fn rank(&self, src: Source) -> u64 {
        match (src, self.target_sm) {
            (Source::Ptx, _) => 0,
            (Source::Elf(_), None) => 1,
            (Source::Elf(arch), Some(t)) if arch <= t => (2 << 32) + u64::from(arch),
            (Source::Elf(arch), Some(_)) => (1 << 32) + u64::from(u32::MAX - arch),
        }
    }

    fn add_kernel(&mut self, k: KernelInfo, src: Source) {
        let rank = self.rank(src);
        match self.kernel_index.get(&k.name) {
            Some(&i) => {
                let have = &mut self.info.kernels[i];
                if k.params.is_some() && (have.params.is_none() || rank > self.kernel_rank[i]) {
                    have.params = k.params;
                    self.kernel_rank[i] = rank;
                }
            }
            None => {
                self.kernel_index
                    .insert(k.name.clone(), self.info.kernels.len());
                self.info.kernels.push(k);
                self.kernel_rank.push(rank);
            }
        }
    }

    fn add_global(&mut self, g: GlobalInfo, src: Source) {
        let from_elf = matches!(src, Source::Elf(_));
        match self.global_index.get(&g.name) {
            Some(&i) => {
                let have_elf = self.global_from_elf[i];
                let have = &mut self.info.globals[i];
                if from_elf && !have_elf {
                    let old_init = have.init.take();
                    *have = g;
                    if have.init.is_none() {
                        have.init = old_init.filter(|b| b.len() as u64 == have.size);
                    }
                    self.global_from_elf[i] = true;
                } else if have.init.is_none() && g.size == have.size {
                    have.init = g.init;
                }
            }
            None => {
                self.global_index
                    .insert(g.name.clone(), self.info.globals.len());
                self.info.globals.push(g);
                self.global_from_elf.push(from_elf);
            }
        }
    }

    fn finish(self) -> ImageInfo {
        self.info
    }
}

#[cfg(test)]
mod tests;
