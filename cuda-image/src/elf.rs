//! ELF cubins: symbols, sections and the `.nv.info` attributes that give each kernel's parameters.

use super::*;

pub(super) const SHT_SYMTAB: u32 = 2;
pub(super) const SHT_NOBITS: u32 = 8;
/// CUDA section types without file contents (global, local, shared memory) in relocatable cubins.
pub(super) const SHT_CUDA_NOBITS: [u32; 3] = [0x7000_0007, 0x7000_0009, 0x7000_000a];
pub(super) const SHN_LORESERVE: u16 = 0xff00;
pub(super) const STT_OBJECT: u8 = 1;
pub(super) const STT_FUNC: u8 = 2;
/// `STT_LOPROC`: CUDA object symbols in relocatable cubins.
pub(super) const STT_CUDA_OBJECT: u8 = 13;
pub(super) const STO_CUDA_ENTRY: u8 = 0x10;

pub(super) const EIFMT_NVAL: u8 = 1;
pub(super) const EIFMT_BVAL: u8 = 2;
pub(super) const EIFMT_HVAL: u8 = 3;
pub(super) const EIFMT_SVAL: u8 = 4;
pub(super) const EIATTR_PARAM_CBANK: u8 = 0x0a;
pub(super) const EIATTR_KPARAM_INFO: u8 = 0x17;
pub(super) const EIATTR_CBANK_PARAM_SIZE: u8 = 0x19;
/// Same payload layout as EIATTR_KPARAM_INFO but the last word's low 16 bits are the size
/// (used by nvcc for parameters over 16 KiB, where the old 14-bit field cannot hold it).
pub(super) const EIATTR_KPARAM_INFO_V2: u8 = 0x45;

pub(super) fn is_nobits(sh_type: u32) -> bool {
    sh_type == SHT_NOBITS || SHT_CUDA_NOBITS.contains(&sh_type)
}

/// Total length of an ELF image from its headers: the furthest of its header tables and of its
/// sections' contents. `get(off, len)` reads that range of the image.
pub(super) fn elf_len<'a>(get: impl Fn(u64, u64) -> Result<&'a [u8]>) -> Result<u64> {
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
pub(super) unsafe fn elf_from_ptr<'a>(ptr: *const u8) -> Result<&'a [u8]> {
    // SAFETY: each range read is one the ELF headers describe, bounded by MAX_IMAGE.
    let len = elf_len(|off, len| unsafe { raw_slice(ptr, off, len, "ELF headers") })?;
    // SAFETY: as above.
    unsafe { raw_slice(ptr, 0, len, "ELF extent") }
}

pub(super) struct Section<'a> {
    pub(super) name: &'a [u8],
    sh_type: u32,
    offset: u64,
    size: u64,
    link: u32,
    info: u32,
    entsize: u64,
}

pub(super) struct Symbol<'a> {
    name: &'a [u8],
    kind: u8,
    other: u8,
    shndx: u16,
    value: u64,
    size: u64,
}

pub(super) fn cstr_at(table: &[u8], off: u64) -> Result<&[u8]> {
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

pub(super) fn sections(elf: &[u8]) -> Result<Vec<Section<'_>>> {
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

pub(super) fn section_bytes<'a>(
    elf: &'a [u8],
    s: &Section<'_>,
    what: &'static str,
) -> Result<&'a [u8]> {
    if is_nobits(s.sh_type) {
        return Ok(&[]);
    }
    slice(elf, s.offset, s.size, what)
}

pub(super) fn symbols<'a>(elf: &'a [u8], secs: &[Section<'a>]) -> Result<Vec<Symbol<'a>>> {
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
pub(super) struct NvInfo {
    /// (ordinal, offset, size)
    params: Vec<(u16, u16, u32)>,
    /// Total parameter bytes, from EIATTR_PARAM_CBANK / EIATTR_CBANK_PARAM_SIZE.
    param_bytes: Option<u32>,
    has_param_attrs: bool,
}

pub(super) fn parse_nv_info(data: &[u8]) -> Result<NvInfo> {
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

pub(super) fn nv_info_params(info: &NvInfo) -> Option<Vec<ParamInfo>> {
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
pub(super) fn parse_elf(elf: &[u8], arch: u32, c: &mut Collector) -> Result<()> {
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
