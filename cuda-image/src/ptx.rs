//! PTX: the `.entry` and global declarations of a PTX module, and its target architecture.

use super::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Tok<'a> {
    /// `.name`
    Directive(&'a [u8]),
    Ident(&'a [u8]),
    Number(&'a [u8]),
    Punct(u8),
}

pub(super) fn is_ident_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || b == b'$' || b == b'%'
}

pub(super) fn is_ident_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'$'
}

/// Splits PTX into tokens, dropping comments, whitespace and string literals. Function bodies
/// (a `{` at module scope outside an initializer, up to its matching `}`) are reduced to their
/// two braces: nothing in them is needed, and they are nearly all of a large PTX.
pub(super) fn tokenize(text: &[u8]) -> Vec<Tok<'_>> {
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
pub(super) fn looks_like_ptx(text: &[u8]) -> bool {
    let head = &text[..text.len().min(64 * 1024)];
    let toks = tokenize(head);
    matches!(toks.first(), Some(Tok::Directive(d)) if *d == b"version")
}

/// Size and class of a PTX fundamental type.
pub(super) fn ptx_type(d: &[u8]) -> Option<(u32, PtxClass)> {
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
pub(super) enum PtxClass {
    Unsigned,
    Signed,
    Float,
}

pub(super) fn parse_uint(t: &[u8]) -> Option<u64> {
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
pub(super) fn encode_value(tok: &[u8], neg: bool, size: u32, class: PtxClass) -> Option<Vec<u8>> {
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
pub(super) struct Decl<'a> {
    name: &'a [u8],
    align: Option<u32>,
    elem_size: u32,
    class: PtxClass,
    /// Element count; `None` for an unsized `[]` dimension.
    count: Option<u64>,
}

/// Parses a declaration starting at `toks[i]` (just after `.param` / `.global` / `.const`).
/// Returns it and the index of the first token after the name and its dimensions.
pub(super) fn parse_decl<'a>(toks: &[Tok<'a>], mut i: usize) -> Option<(Decl<'a>, usize)> {
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
pub(super) fn parse_dims(toks: &[Tok<'_>], mut j: usize) -> Option<(Option<u64>, usize)> {
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
pub(super) fn parse_init(toks: &[Tok<'_>], mut i: usize, d: &Decl<'_>) -> (Option<Vec<u8>>, usize) {
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

pub(super) fn parse_ptx(text: &[u8], c: &mut Collector) -> Result<()> {
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
pub(super) fn ptx_entry_params(toks: &[Tok<'_>], i: usize) -> (Option<Vec<ParamInfo>>, usize) {
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
pub(super) fn ptx_globals(toks: &[Tok<'_>], i: usize, external: bool, c: &mut Collector) -> usize {
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
