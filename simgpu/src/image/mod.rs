//! Metadata of CUDA module images: which kernels (with their parameter layout) and which
//! `__device__` / `__constant__` globals an image defines.
//!
//! The simulated driver does not execute kernels, so this only reads names and sizes. Accepted
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

// ---------------------------------------------------------------------------------------------
// Fatbin

/// Total length of a fatbin from its 16-byte header.
fn fatbin_len(d: &[u8]) -> Result<usize> {
    let hs = u64::from(le_u16(d, 6)?);
    let fs = le_u64(d, 8)?;
    if hs < FATBIN_HEADER_LEN as u64 {
        return Err(ImageError::Truncated("fatbin header size"));
    }
    match hs.checked_add(fs) {
        Some(len) if len <= MAX_IMAGE => Ok(len as usize),
        _ => Err(ImageError::Truncated("fatbin size")),
    }
}

/// # Safety
/// `ptr` points to a fatbin.
unsafe fn fatbin_from_ptr<'a>(ptr: *const u8) -> Result<&'a [u8]> {
    // SAFETY: a fatbin starts with a 16-byte header.
    let header = unsafe { std::slice::from_raw_parts(ptr, FATBIN_HEADER_LEN) };
    if le_u32(header, 0)? != FATBIN_MAGIC {
        return Err(ImageError::UnknownFormat(le_u32(header, 0)?));
    }
    let len = fatbin_len(header)?;
    // SAFETY: the header says the fatbin is `len` bytes long.
    unsafe { raw_slice(ptr, 0, len as u64, "fatbin size") }
}

/// One entry header of a fatbin (the fixed 64 bytes; options may follow up to its header size).
struct EntryHeader {
    kind: u16,
    /// Header size for a top-level entry; offset in the decompressed blob for a sub-entry of a
    /// concatenated entry.
    header_size_or_offset: u32,
    payload_size: u64,
    compressed_size: u32,
    options_offset: u32,
    /// Architecture (major × 10 + minor).
    arch: u32,
    flags: u64,
    uncompressed_size: u64,
}

fn entry_header(d: &[u8], off: usize) -> Result<EntryHeader> {
    let h = d
        .get(off..)
        .and_then(|r| r.get(..ENTRY_HEADER_LEN))
        .ok_or(ImageError::Truncated("fatbin entry header"))?;
    Ok(EntryHeader {
        kind: le_u16(h, 0)?,
        header_size_or_offset: le_u32(h, 4)?,
        payload_size: le_u64(h, 8)?,
        compressed_size: le_u32(h, 16)?,
        options_offset: le_u32(h, 20)?,
        arch: le_u32(h, 28)?,
        flags: le_u64(h, 40)?,
        uncompressed_size: le_u64(h, 56)?,
    })
}

fn parse_fatbin(fat: &[u8], c: &mut Collector) -> Result<()> {
    if le_u32(fat, 0)? != FATBIN_MAGIC {
        return Err(ImageError::UnknownFormat(le_u32(fat, 0)?));
    }
    let hs = usize::from(le_u16(fat, 6)?);
    let len = fatbin_len(fat)?;
    let body = fat
        .get(hs..len)
        .ok_or(ImageError::Truncated("fatbin shorter than its header says"))?;
    // Headers first (cheap), payloads after.
    let mut entries = Vec::new();
    let mut off = 0usize;
    while off < body.len() {
        let rest = &body[off..];
        if rest.len() < ENTRY_HEADER_LEN {
            if rest.iter().all(|&b| b == 0) {
                break; // padding
            }
            return Err(ImageError::Truncated("fatbin entry header"));
        }
        let e = entry_header(body, off)?;
        let ehs = e.header_size_or_offset as usize;
        if ehs < ENTRY_HEADER_LEN {
            return Err(ImageError::Truncated("fatbin entry header size"));
        }
        let header = rest
            .get(..ehs)
            .ok_or(ImageError::Truncated("fatbin entry header"))?;
        let payload = slice(rest, ehs as u64, e.payload_size, "fatbin entry payload")?;
        off += ehs + payload.len();
        entries.push((e, header, payload));
    }
    // With a target architecture, the cubin the driver would run describes the kernels alone:
    // the other architectures' cubins and the PTX declare the same ones, and decompressing them
    // all made loading PyTorch's libraries several times slower. Everything is read only when
    // that cubin is missing or unreadable, or the fatbin has concatenated entries.
    if c.target_sm.is_some() && entries.iter().all(|(e, ..)| e.kind != ENTRY_KIND_CONCAT) {
        let mut best: Option<&(EntryHeader, &[u8], &[u8])> = None;
        for candidate in entries.iter().filter(|(e, ..)| e.kind == ENTRY_KIND_ELF) {
            let rank = |x: &(EntryHeader, &[u8], &[u8])| c.rank(Source::Elf(x.0.arch));
            if best.is_none_or(|b| rank(candidate) > rank(b)) {
                best = Some(candidate); // equal ranks keep the first, as when merging
            }
        }
        if let Some((e, header, payload)) = best {
            let complete = entry(e, header, payload, c).is_ok()
                && c.info.kernels.iter().all(|k| k.params.is_some());
            if complete {
                return Ok(());
            }
        }
    }
    let mut parsed = 0usize;
    let mut unsupported = None;
    for (e, header, payload) in &entries {
        match entry(e, header, payload, c) {
            Ok(true) => parsed += 1,
            Ok(false) => {}
            Err(ImageError::Unsupported(why)) => {
                unsupported.get_or_insert(why);
            }
            Err(err) => return Err(err),
        }
    }
    match unsupported {
        Some(why) if parsed == 0 => Err(ImageError::Unsupported(why)),
        _ => Ok(()),
    }
}

/// Handles one top-level entry; `Ok(false)` for kinds that carry no kernels we read.
fn entry(e: &EntryHeader, header: &[u8], payload: &[u8], c: &mut Collector) -> Result<bool> {
    match e.kind {
        ENTRY_KIND_PTX | ENTRY_KIND_ELF | ENTRY_KIND_CONCAT => {}
        _ => return Ok(false),
    }
    let content = decompress(e, payload)?;
    match e.kind {
        ENTRY_KIND_PTX => parse_ptx_entry(&content, c)?,
        ENTRY_KIND_ELF => parse_elf(&content, e.arch, c)?,
        _ => concat_entry(e, header, &content, c)?,
    }
    Ok(true)
}

fn parse_ptx_entry(content: &[u8], c: &mut Collector) -> Result<()> {
    let end = content
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(content.len());
    let text = &content[..end];
    if !looks_like_ptx(text) {
        return Err(ImageError::Truncated("PTX entry is not PTX text"));
    }
    parse_ptx(text, c)
}

/// A concatenated entry (`nvcc -concat`): one compressed blob holding several images, described
/// by a table of 64-byte sub-headers (plus options) in the entry's header, at its options offset:
/// `u32 count, u32 table length`, then the sub-headers, whose header-size field is the image's
/// offset in the blob.
fn concat_entry(e: &EntryHeader, header: &[u8], blob: &[u8], c: &mut Collector) -> Result<()> {
    let base = e.options_offset as usize;
    let count = le_u32(header, base)?;
    let table_len = le_u32(header, base.wrapping_add(4))? as usize;
    let table_end = base
        .checked_add(table_len)
        .filter(|&end| end <= header.len())
        .ok_or(ImageError::Truncated("concatenated entry table"))?;
    let mut pos = base + 8;
    for _ in 0..count {
        let sub = entry_header(&header[..table_end], pos)?;
        let sub_len = if sub.options_offset == 0 {
            ENTRY_HEADER_LEN
        } else {
            // Options: u32 offset (from the sub-header), u32 length, NUL-terminated, padded to 8.
            let o = pos.wrapping_add(sub.options_offset as usize);
            let opt_off = le_u32(&header[..table_end], o)? as usize;
            let opt_len = le_u32(&header[..table_end], o.wrapping_add(4))? as usize;
            opt_off
                .checked_add(opt_len)
                .and_then(|n| n.checked_add(8))
                .map(|n| n & !7)
                .filter(|&n| n >= ENTRY_HEADER_LEN)
                .ok_or(ImageError::Truncated("concatenated entry options"))?
        };
        if sub.flags & (ENTRY_FLAG_LZ4 | ENTRY_FLAG_ZSTD) != 0 {
            return Err(ImageError::Unsupported(
                "compressed image inside a concatenated fatbin entry".into(),
            ));
        }
        let image = slice(
            blob,
            u64::from(sub.header_size_or_offset),
            sub.payload_size,
            "concatenated entry image",
        )?;
        match sub.kind {
            ENTRY_KIND_PTX => parse_ptx_entry(image, c)?,
            ENTRY_KIND_ELF => parse_elf(image, sub.arch, c)?,
            _ => {}
        }
        pos = pos
            .checked_add(sub_len)
            .ok_or(ImageError::Truncated("concatenated entry table"))?;
    }
    if pos != table_end {
        return Err(ImageError::Truncated("concatenated entry table length"));
    }
    Ok(())
}

fn decompress<'a>(e: &EntryHeader, payload: &'a [u8]) -> Result<Cow<'a, [u8]>> {
    let lz4 = e.flags & ENTRY_FLAG_LZ4 != 0;
    let zstd = e.flags & ENTRY_FLAG_ZSTD != 0;
    if !lz4 && !zstd {
        return Ok(Cow::Borrowed(payload));
    }
    if lz4 && zstd {
        return Err(ImageError::Unsupported(format!(
            "fatbin entry flags {:#x} name two compressions",
            e.flags
        )));
    }
    let clen = match e.compressed_size {
        0 => payload.len(),
        n => n as usize,
    };
    let input = payload
        .get(..clen)
        .ok_or(ImageError::Truncated("compressed size exceeds payload"))?;
    let out_len = e.uncompressed_size;
    if out_len == 0 || out_len > MAX_DECOMPRESSED {
        return Err(ImageError::Truncated("fatbin entry uncompressed size"));
    }
    let out = if lz4 {
        lz4_block_decompress(input, out_len as usize)?
    } else {
        zstd_decompress(input, out_len as usize)?
    };
    Ok(Cow::Owned(out))
}

fn zstd_decompress(input: &[u8], out_len: usize) -> Result<Vec<u8>> {
    let run = std::panic::AssertUnwindSafe(|| {
        let mut out = vec![0u8; out_len];
        let n = ruzstd::frame_decoder::FrameDecoder::new()
            .decode_all(input, &mut out)
            .map_err(|e| ImageError::Unsupported(format!("zstd payload: {e}")))?;
        out.truncate(n);
        Ok(out)
    });
    // The decoder should not panic on bad input; if it ever does, report an error rather than
    // unwinding into a C caller.
    let out = std::panic::catch_unwind(run).unwrap_or_else(|_| {
        Err(ImageError::Unsupported(
            "zstd payload: decoder panicked".into(),
        ))
    })?;
    if out.is_empty() {
        return Err(ImageError::Truncated("empty zstd payload"));
    }
    Ok(out)
}

/// Decodes one LZ4 block (the raw block format, no frame), producing at most `max_out` bytes.
fn lz4_block_decompress(src: &[u8], max_out: usize) -> Result<Vec<u8>> {
    const BAD: ImageError = ImageError::Truncated("LZ4 payload");
    let mut out: Vec<u8> = Vec::with_capacity(max_out.min(src.len().saturating_mul(8)));
    let mut i = 0usize;
    let read_len = |i: &mut usize, mut n: usize| -> Result<usize> {
        loop {
            let b = *src.get(*i).ok_or(BAD)?;
            *i += 1;
            n = n.checked_add(usize::from(b)).ok_or(BAD)?;
            if b != 255 {
                return Ok(n);
            }
        }
    };
    loop {
        let token = *src.get(i).ok_or(BAD)?;
        i += 1;
        let mut lit = usize::from(token >> 4);
        if lit == 15 {
            lit = read_len(&mut i, lit)?;
        }
        let lits = src.get(i..i.checked_add(lit).ok_or(BAD)?).ok_or(BAD)?;
        if out.len() + lit > max_out {
            return Err(BAD);
        }
        out.extend_from_slice(lits);
        i += lit;
        if i == src.len() {
            return Ok(out); // the last sequence has literals only
        }
        let offset = usize::from(le_u16(src, i).map_err(|_| BAD)?);
        i += 2;
        if offset == 0 || offset > out.len() {
            return Err(BAD);
        }
        let mut mlen = usize::from(token & 15);
        if mlen == 15 {
            mlen = read_len(&mut i, mlen)?;
        }
        mlen += 4;
        if out.len().checked_add(mlen).is_none_or(|n| n > max_out) {
            return Err(BAD);
        }
        let start = out.len() - offset;
        for k in 0..mlen {
            let b = out[start + k];
            out.push(b);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// ELF cubin

const SHT_SYMTAB: u32 = 2;
const SHT_NOBITS: u32 = 8;
/// CUDA section types without file contents (global, local, shared memory) in relocatable cubins.
const SHT_CUDA_NOBITS: [u32; 3] = [0x7000_0007, 0x7000_0009, 0x7000_000a];
const SHN_LORESERVE: u16 = 0xff00;
const STT_OBJECT: u8 = 1;
const STT_FUNC: u8 = 2;
/// `STT_LOPROC`: CUDA object symbols in relocatable cubins.
const STT_CUDA_OBJECT: u8 = 13;
const STO_CUDA_ENTRY: u8 = 0x10;

const EIFMT_NVAL: u8 = 1;
const EIFMT_BVAL: u8 = 2;
const EIFMT_HVAL: u8 = 3;
const EIFMT_SVAL: u8 = 4;
const EIATTR_PARAM_CBANK: u8 = 0x0a;
const EIATTR_KPARAM_INFO: u8 = 0x17;
const EIATTR_CBANK_PARAM_SIZE: u8 = 0x19;
/// Same payload layout as EIATTR_KPARAM_INFO but the last word's low 16 bits are the size
/// (used by nvcc for parameters over 16 KiB, where the old 14-bit field cannot hold it).
const EIATTR_KPARAM_INFO_V2: u8 = 0x45;

fn is_nobits(sh_type: u32) -> bool {
    sh_type == SHT_NOBITS || SHT_CUDA_NOBITS.contains(&sh_type)
}

/// Total length of an ELF image from its headers: the furthest of its header tables and of its
/// sections' contents. `get(off, len)` reads that range of the image.
fn elf_len<'a>(get: impl Fn(u64, u64) -> Result<&'a [u8]>) -> Result<u64> {
    let h = get(0, 64)?;
    if h[4] != 2 {
        return Err(ImageError::Unsupported(format!(
            "ELF class {} (only 64-bit cubins)",
            h[4]
        )));
    }
    if h[5] != 1 {
        return Err(ImageError::Unsupported("big-endian ELF".into()));
    }
    let phoff = le_u64(h, 0x20)?;
    let shoff = le_u64(h, 0x28)?;
    let phentsize = u64::from(le_u16(h, 0x36)?);
    let phnum = u64::from(le_u16(h, 0x38)?);
    let shentsize = u64::from(le_u16(h, 0x3a)?);
    let mut shnum = u64::from(le_u16(h, 0x3c)?);
    let mut end = 64u64;
    if phnum > 0 {
        if phentsize < 56 {
            return Err(ImageError::Truncated("ELF program header size"));
        }
        end = end.max(
            phoff
                .checked_add(phnum * phentsize)
                .ok_or(ImageError::Truncated("ELF program headers"))?,
        );
    }
    if shoff != 0 {
        if shentsize < 64 {
            return Err(ImageError::Truncated("ELF section header size"));
        }
        if shnum == 0 {
            // Extended numbering: the count is in section 0's sh_size.
            shnum = le_u64(get(shoff, shentsize)?, 0x20)?;
        }
        let table_len = shnum
            .checked_mul(shentsize)
            .filter(|&n| n <= MAX_IMAGE)
            .ok_or(ImageError::Truncated("ELF section headers"))?;
        let table = get(shoff, table_len)?;
        end = end.max(shoff + table_len);
        for i in 0..shnum as usize {
            let s = &table[i * shentsize as usize..];
            let sh_type = le_u32(s, 4)?;
            if sh_type == 0 || is_nobits(sh_type) {
                continue;
            }
            let sec_end = le_u64(s, 0x18)?
                .checked_add(le_u64(s, 0x20)?)
                .ok_or(ImageError::Truncated("ELF section extent"))?;
            end = end.max(sec_end);
        }
    }
    if end > MAX_IMAGE {
        return Err(ImageError::Truncated("ELF extent"));
    }
    Ok(end)
}

/// # Safety
/// `ptr` points to an ELF image.
unsafe fn elf_from_ptr<'a>(ptr: *const u8) -> Result<&'a [u8]> {
    // SAFETY: each range read is one the ELF headers describe, bounded by MAX_IMAGE.
    let len = elf_len(|off, len| unsafe { raw_slice(ptr, off, len, "ELF headers") })?;
    // SAFETY: as above.
    unsafe { raw_slice(ptr, 0, len, "ELF extent") }
}

struct Section<'a> {
    name: &'a [u8],
    sh_type: u32,
    offset: u64,
    size: u64,
    link: u32,
    info: u32,
    entsize: u64,
}

struct Symbol<'a> {
    name: &'a [u8],
    kind: u8,
    other: u8,
    shndx: u16,
    value: u64,
    size: u64,
}

fn cstr_at(table: &[u8], off: u64) -> Result<&[u8]> {
    let rest = usize::try_from(off)
        .ok()
        .and_then(|o| table.get(o..))
        .ok_or(ImageError::Truncated("ELF string offset"))?;
    let end = rest
        .iter()
        .position(|&b| b == 0)
        .ok_or(ImageError::Truncated("ELF string not terminated"))?;
    Ok(&rest[..end])
}

fn sections(elf: &[u8]) -> Result<Vec<Section<'_>>> {
    let shoff = le_u64(elf, 0x28)?;
    let shentsize = u64::from(le_u16(elf, 0x3a)?);
    let mut shnum = u64::from(le_u16(elf, 0x3c)?);
    let mut shstrndx = u64::from(le_u16(elf, 0x3e)?);
    if shoff == 0 {
        return Ok(Vec::new());
    }
    if shentsize < 64 {
        return Err(ImageError::Truncated("ELF section header size"));
    }
    let sh0 = slice(elf, shoff, shentsize, "ELF section headers")?;
    if shnum == 0 {
        shnum = le_u64(sh0, 0x20)?;
    }
    if shstrndx == 0xffff {
        shstrndx = u64::from(le_u32(sh0, 0x28)?);
    }
    let table = slice(
        elf,
        shoff,
        shnum.saturating_mul(shentsize),
        "ELF section headers",
    )?;
    let raw = |i: u64| -> &[u8] { &table[(i * shentsize) as usize..] };
    let strtab = if shstrndx < shnum && shstrndx != 0 {
        let s = raw(shstrndx);
        slice(elf, le_u64(s, 0x18)?, le_u64(s, 0x20)?, "ELF section names")?
    } else {
        &[]
    };
    let mut out = Vec::with_capacity(shnum as usize);
    for i in 0..shnum {
        let s = raw(i);
        let name_off = le_u32(s, 0)?;
        let name = if strtab.is_empty() {
            &[][..]
        } else {
            cstr_at(strtab, u64::from(name_off))?
        };
        out.push(Section {
            name,
            sh_type: le_u32(s, 4)?,
            offset: le_u64(s, 0x18)?,
            size: le_u64(s, 0x20)?,
            link: le_u32(s, 0x28)?,
            info: le_u32(s, 0x2c)?,
            entsize: le_u64(s, 0x38)?,
        });
    }
    Ok(out)
}

fn section_bytes<'a>(elf: &'a [u8], s: &Section<'_>, what: &'static str) -> Result<&'a [u8]> {
    if is_nobits(s.sh_type) {
        return Ok(&[]);
    }
    slice(elf, s.offset, s.size, what)
}

fn symbols<'a>(elf: &'a [u8], secs: &[Section<'a>]) -> Result<Vec<Symbol<'a>>> {
    let Some(symtab) = secs.iter().find(|s| s.sh_type == SHT_SYMTAB) else {
        return Ok(Vec::new());
    };
    if symtab.entsize != 0 && symtab.entsize != 24 {
        return Err(ImageError::Truncated("ELF symbol size"));
    }
    let data = section_bytes(elf, symtab, "ELF symbol table")?;
    let strsec = secs
        .get(symtab.link as usize)
        .ok_or(ImageError::Truncated("ELF symbol string table"))?;
    let strtab = section_bytes(elf, strsec, "ELF symbol string table")?;
    let mut out = Vec::with_capacity(data.len() / 24);
    for s in data.chunks_exact(24) {
        let info = s[4];
        out.push(Symbol {
            name: cstr_at(strtab, u64::from(le_u32(s, 0)?))?,
            kind: info & 0xf,
            other: s[5],
            shndx: le_u16(s, 6)?,
            value: le_u64(s, 8)?,
            size: le_u64(s, 16)?,
        });
    }
    Ok(out)
}

/// What a kernel's `.nv.info.<name>` section says about its parameters.
#[derive(Default)]
struct NvInfo {
    /// (ordinal, offset, size)
    params: Vec<(u16, u16, u32)>,
    /// Total parameter bytes, from EIATTR_PARAM_CBANK / EIATTR_CBANK_PARAM_SIZE.
    param_bytes: Option<u32>,
    has_param_attrs: bool,
}

fn parse_nv_info(data: &[u8]) -> Result<NvInfo> {
    let mut info = NvInfo::default();
    let mut i = 0usize;
    while i < data.len() {
        let fmt = data[i];
        let attr = *data
            .get(i + 1)
            .ok_or(ImageError::Truncated(".nv.info attribute"))?;
        match fmt {
            // NVAL carries no value but, like BVAL and HVAL, takes four bytes.
            EIFMT_NVAL | EIFMT_BVAL | EIFMT_HVAL => {
                if fmt == EIFMT_HVAL && attr == EIATTR_CBANK_PARAM_SIZE {
                    info.param_bytes = Some(u32::from(le_u16(data, i + 2)?));
                    info.has_param_attrs = true;
                }
                i += 4;
            }
            EIFMT_SVAL => {
                let len = usize::from(le_u16(data, i + 2)?);
                let payload = data
                    .get(i + 4..i + 4 + len)
                    .ok_or(ImageError::Truncated(".nv.info attribute payload"))?;
                match attr {
                    EIATTR_KPARAM_INFO => {
                        // u32 index, u16 ordinal, u16 offset, u32 (size in bits 18..31).
                        let ordinal = le_u16(payload, 4)?;
                        let offset = le_u16(payload, 6)?;
                        let size = (le_u32(payload, 8)? >> 18) & 0x3fff;
                        info.params.push((ordinal, offset, size));
                        info.has_param_attrs = true;
                    }
                    EIATTR_KPARAM_INFO_V2 => {
                        // u32 index, u16 ordinal, u16 offset, u32 (size in bits 0..15, flags above).
                        let ordinal = le_u16(payload, 4)?;
                        let offset = le_u16(payload, 6)?;
                        let size = le_u32(payload, 8)? & 0xffff;
                        info.params.push((ordinal, offset, size));
                        info.has_param_attrs = true;
                    }
                    EIATTR_PARAM_CBANK => {
                        // u32 symbol, u16 offset in the bank, u16 size.
                        info.param_bytes = Some(u32::from(le_u16(payload, 6)?));
                        info.has_param_attrs = true;
                    }
                    _ => {}
                }
                i += 4 + len;
            }
            _ => return Err(ImageError::Truncated(".nv.info attribute format")),
        }
    }
    Ok(info)
}

fn nv_info_params(info: &NvInfo) -> Option<Vec<ParamInfo>> {
    if info.params.is_empty() {
        // No per-parameter records: fine for a kernel without parameters, unknown otherwise.
        return match info.param_bytes {
            None | Some(0) => Some(Vec::new()),
            Some(_) => None,
        };
    }
    let mut ps = info.params.clone();
    ps.sort_by_key(|p| p.0);
    // Ordinals must be exactly 0..n.
    if ps.iter().enumerate().any(|(i, p)| usize::from(p.0) != i) {
        return None;
    }
    Some(
        ps.iter()
            .map(|&(_, offset, size)| ParamInfo {
                offset: u32::from(offset),
                size,
            })
            .collect(),
    )
}

/// Collects an ELF cubin's kernels and globals; `arch` is the cubin's architecture, from its
/// fatbin entry (0 if unknown).
fn parse_elf(elf: &[u8], arch: u32, c: &mut Collector) -> Result<()> {
    if le_u32(elf, 0)? != ELF_MAGIC {
        return Err(ImageError::Truncated("ELF entry is not an ELF image"));
    }
    // Validates class, byte order and that the headers lie within the buffer.
    elf_len(|off, len| slice(elf, off, len, "ELF headers"))?;
    let secs = sections(elf)?;
    let syms = symbols(elf, &secs)?;

    // `.nv.info.<kernel>` sections, by the index of the text section they describe (sh_info)
    // and by name.
    let mut info_by_text: HashMap<u32, usize> = HashMap::new();
    let mut info_by_name: HashMap<&[u8], usize> = HashMap::new();
    for (i, s) in secs.iter().enumerate() {
        if let Some(k) = s.name.strip_prefix(b".nv.info.") {
            info_by_text.insert(s.info, i);
            info_by_name.insert(k, i);
        }
    }
    let any_entry_flag = syms
        .iter()
        .any(|s| s.kind == STT_FUNC && s.other & STO_CUDA_ENTRY != 0);

    for sym in &syms {
        if sym.name.is_empty() || sym.shndx == 0 || sym.shndx >= SHN_LORESERVE {
            continue;
        }
        let Some(sec) = secs.get(usize::from(sym.shndx)) else {
            return Err(ImageError::Truncated("ELF symbol section index"));
        };
        let name = String::from_utf8_lossy(sym.name).into_owned();
        match sym.kind {
            // Kernels may have local binding (internal linkage, e.g. in an anonymous namespace).
            STT_FUNC => {
                let info_sec = info_by_text
                    .get(&u32::from(sym.shndx))
                    .filter(|&&i| secs[i].name.strip_prefix(b".nv.info.") == Some(sym.name))
                    .or_else(|| info_by_name.get(sym.name))
                    .map(|&i| &secs[i]);
                let info = match info_sec {
                    Some(s) => Some(parse_nv_info(section_bytes(elf, s, ".nv.info section")?)?),
                    None => None,
                };
                let is_entry = if any_entry_flag {
                    sym.other & STO_CUDA_ENTRY != 0
                } else {
                    // Toolchains without the entry flag: entries are the functions whose
                    // .nv.info describes parameters.
                    info.as_ref().is_some_and(|i| i.has_param_attrs)
                };
                if !is_entry {
                    continue;
                }
                let params = info.as_ref().and_then(nv_info_params);
                c.add_kernel(KernelInfo { name, params }, Source::Elf(arch));
            }
            STT_OBJECT | STT_CUDA_OBJECT => {
                let sname = sec.name;
                let is_global = sname.starts_with(b".nv.global");
                let is_constant = sname
                    .strip_prefix(b".nv.constant")
                    .is_some_and(|rest| !rest.is_empty() && !rest.starts_with(b"0"));
                if !is_global && !is_constant {
                    continue;
                }
                let init = if is_nobits(sec.sh_type) || sname == b".nv.global" {
                    None
                } else {
                    let bytes = section_bytes(elf, sec, "global's section")?;
                    Some(slice(bytes, sym.value, sym.size, "global's initial bytes")?.to_vec())
                };
                c.add_global(
                    GlobalInfo {
                        name,
                        size: sym.size,
                        init,
                    },
                    Source::Elf(arch),
                );
            }
            _ => {}
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// PTX

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tok<'a> {
    /// `.name`
    Directive(&'a [u8]),
    Ident(&'a [u8]),
    Number(&'a [u8]),
    Punct(u8),
}

fn is_ident_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || b == b'$' || b == b'%'
}

fn is_ident_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'$'
}

/// Splits PTX into tokens, dropping comments, whitespace and string literals. Function bodies
/// (a `{` at module scope outside an initializer, up to its matching `}`) are reduced to their
/// two braces: nothing in them is needed, and they are nearly all of a large PTX.
fn tokenize(text: &[u8]) -> Vec<Tok<'_>> {
    let mut toks = Vec::new();
    let mut i = 0usize;
    let n = text.len();
    let mut in_init = false;
    let mut body_depth = 0usize;
    while i < n {
        let b = text[i];
        if b.is_ascii_whitespace() {
            i += 1;
        } else if text[i..].starts_with(b"//") {
            i = text[i..]
                .iter()
                .position(|&c| c == b'\n')
                .map_or(n, |p| i + p);
        } else if text[i..].starts_with(b"/*") {
            i = text[i + 2..]
                .windows(2)
                .position(|w| w == b"*/")
                .map_or(n, |p| i + 2 + p + 2);
        } else if b == b'"' {
            let mut j = i + 1;
            while j < n && text[j] != b'"' {
                j += if text[j] == b'\\' { 2 } else { 1 };
            }
            i = (j + 1).min(n);
        } else if body_depth > 0 {
            if b == b'{' {
                body_depth += 1;
            } else if b == b'}' {
                body_depth -= 1;
                if body_depth == 0 {
                    toks.push(Tok::Punct(b'}'));
                }
            }
            i += 1;
        } else if b == b'.' && i + 1 < n && is_ident_char(text[i + 1]) {
            let mut j = i + 1;
            while j < n && is_ident_char(text[j]) {
                j += 1;
            }
            toks.push(Tok::Directive(&text[i + 1..j]));
            i = j;
        } else if is_ident_start(b) {
            let mut j = i + 1;
            while j < n && is_ident_char(text[j]) {
                j += 1;
            }
            toks.push(Tok::Ident(&text[i..j]));
            i = j;
        } else if b.is_ascii_digit() {
            let mut j = i + 1;
            while j < n && (text[j].is_ascii_alphanumeric() || text[j] == b'.') {
                j += 1;
            }
            toks.push(Tok::Number(&text[i..j]));
            i = j;
        } else {
            match b {
                b'=' => in_init = true,
                b';' => in_init = false,
                b'{' if !in_init => body_depth = 1,
                _ => {}
            }
            toks.push(Tok::Punct(b));
            i += 1;
        }
    }
    toks
}

/// A PTX text's first directive is `.version`.
fn looks_like_ptx(text: &[u8]) -> bool {
    let head = &text[..text.len().min(64 * 1024)];
    let toks = tokenize(head);
    matches!(toks.first(), Some(Tok::Directive(d)) if *d == b"version")
}

/// Size and class of a PTX fundamental type.
fn ptx_type(d: &[u8]) -> Option<(u32, PtxClass)> {
    use PtxClass::*;
    Some(match d {
        b"b8" | b"u8" => (1, Unsigned),
        b"s8" => (1, Signed),
        b"b16" | b"u16" => (2, Unsigned),
        b"s16" => (2, Signed),
        b"f16" | b"bf16" => (2, Unsigned),
        b"b32" | b"u32" | b"f16x2" | b"bf16x2" => (4, Unsigned),
        b"s32" => (4, Signed),
        b"f32" => (4, Float),
        b"b64" | b"u64" => (8, Unsigned),
        b"s64" => (8, Signed),
        b"f64" => (8, Float),
        b"b128" => (16, Unsigned),
        _ => return None,
    })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum PtxClass {
    Unsigned,
    Signed,
    Float,
}

fn parse_uint(t: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(t).ok()?;
    let s = s.strip_suffix('U').unwrap_or(s);
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u64::from_str_radix(h, 16).ok()
    } else if let Some(b) = s.strip_prefix("0b").or_else(|| s.strip_prefix("0B")) {
        u64::from_str_radix(b, 2).ok()
    } else if s.len() > 1 && s.starts_with('0') && s.bytes().all(|c| c.is_ascii_digit()) {
        u64::from_str_radix(&s[1..], 8).ok()
    } else {
        s.parse().ok()
    }
}

/// Encodes one PTX initializer value (`tok`, negated if `neg`) as `size` little-endian bytes.
fn encode_value(tok: &[u8], neg: bool, size: u32, class: PtxClass) -> Option<Vec<u8>> {
    let bits: u128 = if let Some(h) = tok.strip_prefix(b"0f").or_else(|| tok.strip_prefix(b"0F")) {
        // Hexadecimal single-precision bit pattern.
        let v = u32::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok()?;
        let f = f32::from_bits(v);
        let f = if neg { -f } else { f };
        match (class, size) {
            (PtxClass::Float, 8) => u128::from(f64::from(f).to_bits()),
            _ => u128::from(f.to_bits()),
        }
    } else if let Some(h) = tok.strip_prefix(b"0d").or_else(|| tok.strip_prefix(b"0D")) {
        let v = u64::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok()?;
        let f = f64::from_bits(v);
        let f = if neg { -f } else { f };
        match (class, size) {
            (PtxClass::Float, 4) => u128::from((f as f32).to_bits()),
            _ => u128::from(f.to_bits()),
        }
    } else if class == PtxClass::Float && tok.iter().any(|&c| c == b'.' || c == b'e') {
        let f: f64 = std::str::from_utf8(tok).ok()?.parse().ok()?;
        let f = if neg { -f } else { f };
        if size == 4 {
            u128::from((f as f32).to_bits())
        } else {
            u128::from(f.to_bits())
        }
    } else {
        let v = parse_uint(tok)?;
        match class {
            PtxClass::Float => {
                let f = if neg { -(v as f64) } else { v as f64 };
                if size == 4 {
                    u128::from((f as f32).to_bits())
                } else {
                    u128::from(f.to_bits())
                }
            }
            _ => {
                if neg {
                    (v as i128).wrapping_neg() as u128
                } else {
                    u128::from(v)
                }
            }
        }
    };
    Some(bits.to_le_bytes()[..size as usize].to_vec())
}

/// A declaration after its state space: `[.align A] [.vN] .type [.attrs] name[dims] [= init]`.
struct Decl<'a> {
    name: &'a [u8],
    align: Option<u32>,
    elem_size: u32,
    class: PtxClass,
    /// Element count; `None` for an unsized `[]` dimension.
    count: Option<u64>,
}

/// Parses a declaration starting at `toks[i]` (just after `.param` / `.global` / `.const`).
/// Returns it and the index of the first token after the name and its dimensions.
fn parse_decl<'a>(toks: &[Tok<'a>], mut i: usize) -> Option<(Decl<'a>, usize)> {
    let mut align = None;
    let mut vec = 1u32;
    let mut ty = None;
    let mut seen_ptr = false;
    loop {
        match *toks.get(i)? {
            Tok::Directive(b"align") => {
                let Tok::Number(n) = *toks.get(i + 1)? else {
                    return None;
                };
                let a = u32::try_from(parse_uint(n)?).ok()?;
                // `.ptr .align N` describes the pointee, not the parameter.
                if !seen_ptr && align.is_none() {
                    align = Some(a);
                }
                i += 2;
            }
            Tok::Directive(b"v2") => {
                vec = 2;
                i += 1;
            }
            Tok::Directive(b"v4") => {
                vec = 4;
                i += 1;
            }
            Tok::Directive(b"v8") => {
                vec = 8;
                i += 1;
            }
            Tok::Directive(b"ptr") => {
                seen_ptr = true;
                i += 1;
            }
            Tok::Directive(d) => {
                if let Some(t) = ptx_type(d) {
                    ty = Some(t);
                }
                // Other attributes (.global/.const/.shared/.local after .ptr, ...) are skipped.
                i += 1;
            }
            Tok::Ident(name) => {
                let (elem, class) = ty?;
                let (count, j) = parse_dims(toks, i + 1)?;
                return Some((
                    Decl {
                        name,
                        align,
                        elem_size: elem.checked_mul(vec)?,
                        class,
                        count,
                    },
                    j,
                ));
            }
            _ => return None,
        }
    }
}

/// Parses array dimensions (`[N]...`, `[]` for unsized) at `toks[j]`: the element count
/// (`None` if unsized) and the index after them; `None` if malformed.
fn parse_dims(toks: &[Tok<'_>], mut j: usize) -> Option<(Option<u64>, usize)> {
    let mut count = Some(1u64);
    while toks.get(j) == Some(&Tok::Punct(b'[')) {
        match (toks.get(j + 1), toks.get(j + 2)) {
            (Some(Tok::Number(n)), Some(Tok::Punct(b']'))) => {
                let dim = parse_uint(n)?;
                count = match count {
                    Some(c) => Some(c.checked_mul(dim)?),
                    None => None,
                };
                j += 3;
            }
            (Some(Tok::Punct(b']')), _) => {
                count = None;
                j += 2;
            }
            _ => return None,
        }
    }
    Some((count, j))
}

/// Parses an initializer starting at `toks[i]` (just after `=`); returns the bytes (if every
/// value is a plain number) and the index of the token ending it (`,` or `;`).
fn parse_init(toks: &[Tok<'_>], mut i: usize, d: &Decl<'_>) -> (Option<Vec<u8>>, usize) {
    let mut bytes = Some(Vec::new());
    let mut depth = 0i32;
    let mut neg = false;
    while let Some(&t) = toks.get(i) {
        match t {
            Tok::Punct(b'{') => depth += 1,
            Tok::Punct(b'}') => depth -= 1,
            Tok::Punct(b'-') => {
                neg = true;
                i += 1;
                continue;
            }
            Tok::Punct(b',') | Tok::Punct(b';') if depth <= 0 => break,
            Tok::Punct(b',') => {}
            Tok::Number(n) => {
                let v = encode_value(n, neg, d.elem_size.min(16), d.class);
                match (&mut bytes, v) {
                    (Some(b), Some(v)) if d.elem_size <= 16 => b.extend_from_slice(&v),
                    _ => bytes = None,
                }
            }
            // Addresses of symbols (`generic(sym)`, `sym`, `sym+4`) and anything else.
            _ => bytes = None,
        }
        neg = false;
        i += 1;
    }
    (bytes, i)
}

fn parse_ptx(text: &[u8], c: &mut Collector) -> Result<()> {
    let toks = tokenize(text);
    let mut depth = 0usize;
    let mut i = 0usize;
    let mut external = false;
    while i < toks.len() {
        match toks[i] {
            Tok::Punct(b'{') => depth += 1,
            Tok::Punct(b'}') => depth = depth.saturating_sub(1),
            Tok::Punct(b';') => external = false,
            Tok::Directive(b"extern") if depth == 0 => external = true,
            Tok::Directive(b"entry") if depth == 0 => {
                let Some(Tok::Ident(name)) = toks.get(i + 1) else {
                    return Err(ImageError::Truncated("PTX .entry without a name"));
                };
                let (params, next) = ptx_entry_params(&toks, i + 2);
                if !external {
                    c.add_kernel(
                        KernelInfo {
                            name: String::from_utf8_lossy(name).into_owned(),
                            params,
                        },
                        Source::Ptx,
                    );
                }
                external = false;
                i = next;
                continue;
            }
            Tok::Directive(b"global" | b"const") if depth == 0 => {
                i = ptx_globals(&toks, i + 1, external, c);
                external = false;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

/// Parses `( .param ..., .param ... )` at `toks[i]`; returns the layout (None if any parameter
/// was not understood) and the index after the list.
fn ptx_entry_params(toks: &[Tok<'_>], i: usize) -> (Option<Vec<ParamInfo>>, usize) {
    if toks.get(i) != Some(&Tok::Punct(b'(')) {
        return (Some(Vec::new()), i);
    }
    let close = toks[i..]
        .iter()
        .position(|t| *t == Tok::Punct(b')'))
        .map_or(toks.len(), |p| i + p);
    let list = &toks[i + 1..close];
    let mut params = Some(Vec::new());
    let mut offset = 0u64;
    let mut j = 0usize;
    while j < list.len() {
        if list[j] != Tok::Directive(b"param") {
            j += 1;
            continue;
        }
        let parsed = parse_decl(list, j + 1).and_then(|(d, next)| {
            let size = u64::from(d.elem_size).checked_mul(d.count?)?;
            let align = u64::from(d.align.unwrap_or(d.elem_size).max(1));
            let off = offset.checked_next_multiple_of(align)?;
            offset = off.checked_add(size)?;
            let p = ParamInfo {
                offset: u32::try_from(off).ok()?,
                size: u32::try_from(size).ok()?,
            };
            Some((p, next))
        });
        match parsed {
            Some((p, next)) => {
                if let Some(ps) = params.as_mut() {
                    ps.push(p);
                }
                j = next;
            }
            None => {
                params = None;
                j += 1;
            }
        }
    }
    (params, (close + 1).min(toks.len()))
}

/// Parses the declarators of a `.global` / `.const` statement starting at `toks[i]`; returns the
/// index after its `;`.
fn ptx_globals(toks: &[Tok<'_>], i: usize, external: bool, c: &mut Collector) -> usize {
    let end = toks[i..]
        .iter()
        .position(|t| *t == Tok::Punct(b';'))
        .map_or(toks.len(), |p| i + p);
    let stmt = &toks[i..end];
    let Some((first, mut j)) = parse_decl(stmt, 0) else {
        return end + 1;
    };
    // Further declarators (`.global .u32 a, b;`) share the first one's type.
    let mut decl = first;
    loop {
        let mut init = None;
        let mut count = decl.count;
        if stmt.get(j) == Some(&Tok::Punct(b'=')) {
            let (bytes, next) = parse_init(stmt, j + 1, &decl);
            init = bytes;
            j = next;
        }
        if count.is_none() {
            // `name[] = {...}`: the initializer gives the size.
            count = init
                .as_ref()
                .map(|b| b.len() as u64 / u64::from(decl.elem_size.max(1)));
        }
        if let (Some(n), false) = (count, external) {
            let size = n.saturating_mul(u64::from(decl.elem_size));
            let init = init.map(|mut b| {
                b.resize(size.min(MAX_DECOMPRESSED) as usize, 0);
                b
            });
            let init = init.filter(|b| b.len() as u64 == size);
            c.add_global(
                GlobalInfo {
                    name: String::from_utf8_lossy(decl.name).into_owned(),
                    size,
                    init,
                },
                Source::Ptx,
            );
        }
        // Next declarator?
        match (stmt.get(j), stmt.get(j + 1)) {
            (Some(Tok::Punct(b',')), Some(Tok::Ident(name))) => {
                let Some((count, k)) = parse_dims(stmt, j + 2) else {
                    return end + 1;
                };
                decl = Decl {
                    name,
                    count,
                    ..decl
                };
                j = k;
            }
            _ => break,
        }
    }
    end + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    const K_CUBIN_SM80: &[u8] = include_bytes!("../../tests/fixtures/k_sm80.cubin");
    const K_CUBIN_SM100: &[u8] = include_bytes!("../../tests/fixtures/k_sm100.cubin");
    const K_PTX: &[u8] = include_bytes!("../../tests/fixtures/k.ptx");
    const K_FATBIN: &[u8] = include_bytes!("../../tests/fixtures/k.fatbin");
    const K_FATBIN_ZSTD: &[u8] = include_bytes!("../../tests/fixtures/k_zstd.fatbin");
    const K_FATBIN_LZ4: &[u8] = include_bytes!("../../tests/fixtures/k_lz4.fatbin");
    const K_FATBIN_NONE: &[u8] = include_bytes!("../../tests/fixtures/k_none.fatbin");
    const K_FATBIN_CONCAT: &[u8] = include_bytes!("../../tests/fixtures/k_concat.fatbin");
    const RDC_CUBIN: &[u8] = include_bytes!("../../tests/fixtures/rdc_sm80.cubin");
    const ALIGN_FATBIN: &[u8] = include_bytes!("../../tests/fixtures/align.fatbin");

    fn p(offset: u32, size: u32) -> ParamInfo {
        ParamInfo { offset, size }
    }

    /// Checks what every image built from k.cu must contain. `with_init`: the image has
    /// initial bytes of `init` and `cst`.
    fn check_k(info: &ImageInfo, with_init: bool) {
        // `kanon` has internal linkage: its mangled name carries a per-file hash.
        let anon = info
            .kernels
            .iter()
            .find(|k| k.name.ends_with("5kanonEs"))
            .map(|k| k.name.as_str())
            .expect("kanon");
        let mut names: Vec<&str> = info.kernels.iter().map(|k| k.name.as_str()).collect();
        names.sort_unstable();
        let mut want = vec!["_Z5kgrid3S24Pi", "kmix", "knoparam", "kptr", anon];
        want.sort_unstable();
        assert_eq!(names, want);
        let params = |n: &str| info.kernel(n).and_then(|k| k.params.clone());
        assert_eq!(params(anon), Some(vec![p(0, 2)]));
        assert_eq!(params("kptr"), Some(vec![p(0, 8)]));
        assert_eq!(
            params("kmix"),
            Some(vec![
                p(0, 8),
                p(8, 4),
                p(12, 4),
                p(16, 24),
                p(40, 1),
                p(48, 8)
            ])
        );
        assert_eq!(params("_Z5kgrid3S24Pi"), Some(vec![p(0, 24), p(24, 8)]));
        assert_eq!(params("knoparam"), Some(vec![]));
        assert_eq!(info.kernel("kmix").and_then(|k| k.params_size()), Some(56));

        let g = info.global("g").expect("g");
        assert_eq!((g.size, &g.init), (64, &None));
        let init = info.global("init").expect("init");
        assert_eq!(init.size, 4);
        let cst = info.global("cst").expect("cst");
        assert_eq!(cst.size, 16);
        if with_init {
            assert_eq!(init.init.as_deref(), Some(&7i32.to_le_bytes()[..]));
            let want: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
                .iter()
                .flat_map(|f| f.to_le_bytes())
                .collect();
            assert_eq!(cst.init.as_deref(), Some(&want[..]));
        }
        // The device function `helper` is not a kernel.
        assert!(info.kernels.iter().all(|k| !k.name.contains("helper")));
    }

    #[test]
    fn cubin_sm80() {
        let info = parse_bytes(K_CUBIN_SM80).expect("parse");
        check_k(&info, true);
        assert_eq!(info.globals.len(), 3);
    }

    #[test]
    fn cubin_sm100_without_param_cbank() {
        check_k(&parse_bytes(K_CUBIN_SM100).expect("parse"), true);
    }

    #[test]
    fn elf_length_matches_file() {
        for f in [K_CUBIN_SM80, K_CUBIN_SM100, RDC_CUBIN] {
            let len = elf_len(|off, len| slice(f, off, len, "t")).expect("len");
            assert_eq!(len, f.len() as u64);
        }
    }

    #[test]
    fn ptx_text() {
        check_k(&parse_bytes(K_PTX).expect("parse"), true);
    }

    #[test]
    fn fatbins_all_compressions() {
        for (name, f) in [
            ("default", K_FATBIN),
            ("zstd", K_FATBIN_ZSTD),
            ("lz4", K_FATBIN_LZ4),
            ("none", K_FATBIN_NONE),
            ("concat", K_FATBIN_CONCAT),
        ] {
            let info = parse_bytes(f).unwrap_or_else(|e| panic!("{name}: {e}"));
            check_k(&info, true);
            assert_eq!(info.globals.len(), 3, "{name}");
        }
    }

    #[test]
    fn concatenated_entries() {
        // k_concat.fatbin: one entry with the compute_90 and compute_100 PTX, one with the
        // sm_75 and sm_90 cubins; each must give the whole module on its own.
        let body = &K_FATBIN_CONCAT[16..];
        let mut off = 0;
        let mut kinds = Vec::new();
        while off < body.len() {
            let e = entry_header(body, off).expect("entry");
            let hs = e.header_size_or_offset as usize;
            let header = &body[off..off + hs];
            let payload = &body[off + hs..off + hs + e.payload_size as usize];
            let mut c = Collector::new(None);
            assert!(entry(&e, header, payload, &mut c).expect("entry parses"));
            check_k(&c.finish(), true);
            kinds.push(e.kind);
            off += hs + payload.len();
        }
        assert_eq!(kinds, [ENTRY_KIND_CONCAT, ENTRY_KIND_CONCAT]);
    }

    #[test]
    fn param_layout_of_the_device_architecture() {
        let kal = |sm: Option<u32>| {
            let info = match sm {
                Some(sm) => parse_bytes_for_arch(ALIGN_FATBIN, sm),
                None => parse_bytes(ALIGN_FATBIN),
            };
            info.expect("parse")
                .kernel("kal")
                .and_then(|k| k.params.clone())
                .expect("kal params")
        };
        let at = |off: u32| vec![p(off, 256), p(off + 256, 8)];
        assert_eq!(kal(None), at(32)); // the first cubin (sm_75)
        assert_eq!(kal(Some(70)), at(32)); // none at or below: the lowest above
        assert_eq!(kal(Some(80)), at(32));
        assert_eq!(kal(Some(89)), at(32));
        assert_eq!(kal(Some(90)), at(112));
        assert_eq!(kal(Some(120)), at(0));
        // SAFETY: a complete fatbin.
        let info = unsafe { parse_image_for_arch(ALIGN_FATBIN.as_ptr(), 90) }.expect("parse");
        assert_eq!(
            info.kernel("kal").and_then(|k| k.params.clone()),
            Some(at(112))
        );
    }

    #[test]
    fn default_fatbin_compresses_ptx_only() {
        let first = entry_header(K_FATBIN, 16).expect("entry");
        assert_eq!(first.kind, ENTRY_KIND_ELF);
        assert_eq!(first.flags & (ENTRY_FLAG_ZSTD | ENTRY_FLAG_LZ4), 0);
        let second = entry_header(K_FATBIN, 16 + 64 + first.payload_size as usize).expect("e");
        assert_eq!(second.kind, ENTRY_KIND_PTX);
        assert_ne!(second.flags & ENTRY_FLAG_ZSTD, 0);
    }

    #[test]
    fn relocatable_cubin() {
        let info = parse_bytes(RDC_CUBIN).expect("parse");
        let names: Vec<&str> = info.kernels.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(names, ["rk"]);
        assert_eq!(
            info.kernel("rk").and_then(|k| k.params.clone()),
            Some(vec![p(0, 8), p(8, 8)])
        );
        let pub_var = info.global("pub_var").expect("pub_var");
        let want: Vec<u8> = [1i32, 2, 3].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(pub_var.init.as_deref(), Some(&want[..]));
        assert_eq!(
            info.global("ug").map(|g| (g.size, g.init.is_none())),
            Some((20, true))
        );
        assert_eq!(info.global("man").map(|g| g.size), Some(4));
        assert_eq!(
            info.global("cc").and_then(|g| g.init.clone()),
            Some([5i32, 6].iter().flat_map(|v| v.to_le_bytes()).collect())
        );
        // Undefined (extern) variables are not defined here.
        assert!(info.global("ext_var").is_none());
    }

    #[test]
    fn parse_image_all_formats() {
        // SAFETY: each pointer is to a complete image (PTX copied with a terminating NUL).
        unsafe {
            check_k(&parse_image(K_CUBIN_SM80.as_ptr()).expect("cubin"), true);
            check_k(&parse_image(K_FATBIN.as_ptr()).expect("fatbin"), true);
            let mut ptx = K_PTX.to_vec();
            ptx.push(0);
            check_k(&parse_image(ptx.as_ptr()).expect("ptx"), true);

            #[repr(C)]
            struct Wrapper {
                magic: u32,
                version: u32,
                data: *const u8,
                filename: *const u8,
            }
            let w = Wrapper {
                magic: FATBIN_WRAPPER_MAGIC,
                version: 1,
                data: K_FATBIN_ZSTD.as_ptr(),
                filename: std::ptr::null(),
            };
            let info = parse_image(&w as *const Wrapper as *const u8).expect("wrapper");
            check_k(&info, true);
            let w0 = Wrapper {
                data: std::ptr::null(),
                ..w
            };
            assert!(matches!(
                parse_image(&w0 as *const Wrapper as *const u8),
                Err(ImageError::Null)
            ));
            assert!(matches!(
                parse_image(std::ptr::null()),
                Err(ImageError::Null)
            ));
            assert!(matches!(
                parse_image(c"".as_ptr().cast()),
                Err(ImageError::UnknownFormat(0))
            ));
            assert!(matches!(
                parse_image(c"ab".as_ptr().cast()),
                Err(ImageError::UnknownFormat(_))
            ));
        }
    }

    #[test]
    fn wrapper_in_bytes_is_unsupported() {
        let mut w = FATBIN_WRAPPER_MAGIC.to_le_bytes().to_vec();
        w.extend_from_slice(&[1, 0, 0, 0]);
        w.extend_from_slice(&[0; 16]);
        assert!(matches!(parse_bytes(&w), Err(ImageError::Unsupported(_))));
    }

    #[test]
    fn handwritten_ptx() {
        let ptx = b"
            /* block comment .entry fake( */
            .version 8.0
            .target sm_80 // comment
            .address_size 64
            .file 1 \"a//b.cu\"
            .extern .global .align 4 .b8 ext[];
            .global .u32 a = 5, b, c[2] = {-1, 0x10};
            .visible .global .align 8 .f64 dd[2] = {0d3FF0000000000000, 2};
            .global .f32 ff = 0f40000000;
            .global .align 1 .b8 bytes[] = {1, 2, 3};
            .global .u64 addr = generic(a);
            .const .align 4 .v2 .u32 vv[3];
            .visible .entry k1(
                .param .u64 .ptr .global .align 16 k1_p0,
                .param .b8 k1_p1,
                .param .align 16 .b8 k1_p2[32],
                .param .v2 .f32 k1_p3
            )
            .maxntid 128, 1, 1
            {
                .reg .b32 %r<2>;
                .global .u32 not_module_scope;
                ret;
            }
            .entry k2
            {
                ret;
            }
            .extern .entry k3(.param .u32 x);
        ";
        let info = parse_bytes(ptx).expect("parse");
        let names: Vec<&str> = info.kernels.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(names, ["k1", "k2"]);
        assert_eq!(
            info.kernels[0].params,
            Some(vec![p(0, 8), p(8, 1), p(16, 32), p(48, 8)])
        );
        assert_eq!(info.kernels[1].params, Some(vec![]));
        let g = |n: &str| info.global(n).map(|g| (g.size, g.init.clone()));
        assert_eq!(g("a"), Some((4, Some(vec![5, 0, 0, 0]))));
        assert_eq!(g("b"), Some((4, None)));
        assert_eq!(
            g("c"),
            Some((8, Some(vec![0xff, 0xff, 0xff, 0xff, 0x10, 0, 0, 0])))
        );
        let dd: Vec<u8> = [1.0f64, 2.0].iter().flat_map(|f| f.to_le_bytes()).collect();
        assert_eq!(g("dd"), Some((16, Some(dd))));
        assert_eq!(g("ff"), Some((4, Some(2.0f32.to_le_bytes().to_vec()))));
        assert_eq!(g("bytes"), Some((3, Some(vec![1, 2, 3]))));
        assert_eq!(g("addr"), Some((8, None)));
        assert_eq!(g("vv"), Some((24, None)));
        assert!(info.global("ext").is_none());
        assert!(info.global("not_module_scope").is_none());
        assert_eq!(info.globals.len(), 8);
    }

    #[test]
    fn not_an_image() {
        assert!(matches!(
            parse_bytes(b""),
            Err(ImageError::UnknownFormat(0))
        ));
        assert!(matches!(
            parse_bytes(b"hello world"),
            Err(ImageError::UnknownFormat(_))
        ));
        assert!(matches!(
            parse_bytes(b".target sm_80\n"),
            Err(ImageError::UnknownFormat(_))
        ));
        let mut elf32 = K_CUBIN_SM80.to_vec();
        elf32[4] = 1;
        assert!(matches!(
            parse_bytes(&elf32),
            Err(ImageError::Unsupported(_))
        ));
        let e = parse_bytes(b"garbage").err().map(|e| e.to_string());
        assert_eq!(
            e.as_deref(),
            Some("module image is not a fatbin, cubin or PTX (first bytes 0x62726167)")
        );
    }

    #[test]
    fn lz4_rejects_bad_offsets() {
        // Literal "ab", then a match at offset 3 (before the start).
        assert!(lz4_block_decompress(&[0x20, b'a', b'b', 3, 0], 100).is_err());
        // Literal "ab", match offset 2 length 4, then literal "c": "ababab" + "c".
        let out = lz4_block_decompress(&[0x20, b'a', b'b', 2, 0, 0x10, b'c'], 100);
        assert_eq!(out.ok().as_deref(), Some(&b"abababc"[..]));
        assert!(lz4_block_decompress(&[0x20, b'a', b'b', 2, 0, 0x10, b'c'], 5).is_err());
    }

    /// Deterministic xorshift for the fuzz tests.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    fn all_fixtures() -> [&'static [u8]; 10] {
        [
            ALIGN_FATBIN,
            K_CUBIN_SM80,
            K_CUBIN_SM100,
            K_PTX,
            K_FATBIN,
            K_FATBIN_ZSTD,
            K_FATBIN_LZ4,
            K_FATBIN_NONE,
            K_FATBIN_CONCAT,
            RDC_CUBIN,
        ]
    }

    #[test]
    fn fuzz_truncated() {
        for f in all_fixtures() {
            let step = (f.len() / 400).max(1);
            for len in (0..f.len()).step_by(step) {
                let r = parse_bytes(&f[..len]);
                // A truncated binary image must fail; a truncated PTX may still parse.
                if f != K_PTX {
                    assert!(r.is_err(), "truncated to {len} parsed");
                }
            }
        }
    }

    #[test]
    fn fuzz_bit_flips() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for f in all_fixtures() {
            let mut buf = f.to_vec();
            for _ in 0..600 {
                buf.copy_from_slice(f);
                let flips = 1 + rng.next() % 4;
                for _ in 0..flips {
                    // Bias half of the flips to the headers, where they matter most.
                    let range = if rng.next() & 1 == 0 {
                        buf.len().min(256)
                    } else {
                        buf.len()
                    };
                    let pos = (rng.next() % range as u64) as usize;
                    buf[pos] ^= 1 << (rng.next() % 8);
                }
                let _ = parse_bytes(&buf);
            }
        }
    }

    #[test]
    fn fuzz_random_headers() {
        // Random values in the size fields of the first fatbin entry header and of the ELF header.
        let mut rng = Rng(12345);
        for _ in 0..2000 {
            let mut fat = K_FATBIN_ZSTD.to_vec();
            let field = [20usize, 24, 32, 36, 56, 72, 80, 88][(rng.next() % 8) as usize];
            let v = rng.next().to_le_bytes();
            let w = if rng.next() & 1 == 0 { 4 } else { 8 };
            fat[field..field + w].copy_from_slice(&v[..w]);
            let _ = parse_bytes(&fat);

            let mut elf = K_CUBIN_SM80.to_vec();
            let field = [0x20usize, 0x28, 0x36, 0x38, 0x3a, 0x3c, 0x3e][(rng.next() % 7) as usize];
            elf[field..field + 2].copy_from_slice(&v[..2]);
            let _ = parse_bytes(&elf);
        }
    }
}
