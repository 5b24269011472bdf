//! Fatbins: the container nvcc embeds (entries for each architecture, PTX or cubin, plain or
//! zstd/LZ4-compressed), and the wrapper the runtime registers.

use super::*;

/// Total length of a fatbin from its 16-byte header.
pub(super) fn fatbin_len(d: &[u8]) -> Result<usize> {
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
pub(super) unsafe fn fatbin_from_ptr<'a>(ptr: *const u8) -> Result<&'a [u8]> {
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
pub(super) struct EntryHeader {
    pub(super) kind: u16,
    /// Header size for a top-level entry; offset in the decompressed blob for a sub-entry of a
    /// concatenated entry.
    pub(super) header_size_or_offset: u32,
    pub(super) payload_size: u64,
    pub(super) compressed_size: u32,
    pub(super) options_offset: u32,
    /// Architecture (major × 10 + minor).
    pub(super) arch: u32,
    pub(super) flags: u64,
    pub(super) uncompressed_size: u64,
}

pub(super) fn entry_header(d: &[u8], off: usize) -> Result<EntryHeader> {
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

/// A fatbin's entries: each one's header fields, its whole header and its (still compressed)
/// payload.
pub(super) type Entries<'a> = Vec<(EntryHeader, &'a [u8], &'a [u8])>;

pub(super) fn entries(fat: &[u8]) -> Result<Entries<'_>> {
    if le_u32(fat, 0)? != FATBIN_MAGIC {
        return Err(ImageError::UnknownFormat(le_u32(fat, 0)?));
    }
    let hs = usize::from(le_u16(fat, 6)?);
    let len = fatbin_len(fat)?;
    let body = fat
        .get(hs..len)
        .ok_or(ImageError::Truncated("fatbin shorter than its header says"))?;
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
    Ok(entries)
}

pub(super) fn parse_fatbin(fat: &[u8], c: &mut Collector) -> Result<()> {
    // Headers first (cheap), payloads after.
    let entries = entries(fat)?;
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
pub(super) fn entry(
    e: &EntryHeader,
    header: &[u8],
    payload: &[u8],
    c: &mut Collector,
) -> Result<bool> {
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

pub(super) fn parse_ptx_entry(content: &[u8], c: &mut Collector) -> Result<()> {
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
pub(super) fn concat_entry(
    e: &EntryHeader,
    header: &[u8],
    blob: &[u8],
    c: &mut Collector,
) -> Result<()> {
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

pub(super) fn decompress<'a>(e: &EntryHeader, payload: &'a [u8]) -> Result<Cow<'a, [u8]>> {
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

pub(super) fn zstd_decompress(input: &[u8], out_len: usize) -> Result<Vec<u8>> {
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
pub(super) fn lz4_block_decompress(src: &[u8], max_out: usize) -> Result<Vec<u8>> {
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
