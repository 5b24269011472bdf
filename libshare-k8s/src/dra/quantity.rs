//! Kubernetes quantities (`6Gi`, `1536Mi`, `3221225472`, `1.5G`, `3e9`) as bytes, and bytes as
//! the canonical quantity the API server would write. Hand-written: the grammar is a few lines
//! (`resource.Quantity` in k8s.io/apimachinery), and `k8s-openapi` keeps a quantity as its string.

/// The bytes `q` stands for, rounded up as the API server's `Value()` rounds; `None` if it is
/// not a non-negative quantity or does not fit in 64 bits.
pub fn bytes(q: &str) -> Option<u64> {
    let q = q.trim();
    let end = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(end);
    let number = number.strip_prefix('+').unwrap_or(number);
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && frac.is_empty()
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
        || whole.len() + frac.len() > 30
    {
        return None;
    }
    let mantissa: u128 = format!("{whole}{frac}").parse().ok()?;
    // value = mantissa × 2^bin × 10^dec
    let (bin, dec): (u32, i32) = match suffix {
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        "m" => (0, -3),
        "" => (0, 0),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        s if s.starts_with(['e', 'E']) => (0, s[1..].parse::<i32>().ok()?),
        _ => return None,
    };
    let dec = dec - frac.len() as i32;
    if !(-40..=30).contains(&dec) {
        return None;
    }
    let scaled = mantissa.checked_mul(1u128 << bin)?;
    let v = if dec >= 0 {
        scaled.checked_mul(10u128.pow(dec as u32))?
    } else {
        scaled.div_ceil(10u128.pow((-dec) as u32))
    };
    u64::try_from(v).ok()
}

/// `bytes` as the API server writes it: the largest binary suffix that divides it exactly.
pub fn format(bytes: u64) -> String {
    for (suffix, shift) in [
        ("Ei", 60),
        ("Pi", 50),
        ("Ti", 40),
        ("Gi", 30),
        ("Mi", 20),
        ("Ki", 10),
    ] {
        if bytes != 0 && bytes.trailing_zeros() >= shift {
            return format!("{}{suffix}", bytes >> shift);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        const GI: u64 = 1 << 30;
        for (q, want) in [
            ("6Gi", 6 * GI),
            ("1536Mi", 3 * GI / 2),
            ("3221225472", 3 * GI),
            ("1.5Gi", 3 * GI / 2),
            ("1.5G", 1_500_000_000),
            ("3e9", 3_000_000_000),
            ("3E9", 3_000_000_000),
            ("1500m", 2),
            ("0", 0),
            ("+4Ki", 4096),
            ("16Ei", u64::MAX),
        ] {
            assert_eq!(bytes(q), if q == "16Ei" { None } else { Some(want) }, "{q}");
        }
        for bad in [
            "", "-1Gi", "Gi", "1GiB", "1gi", "1.2.3", "1 Gi", "0x10", "1e99",
        ] {
            assert_eq!(bytes(bad), None, "{bad}");
        }
        assert_eq!(format(16 * GI), "16Gi");
        assert_eq!(format(256 << 20), "256Mi");
        assert_eq!(format(1000), "1000");
        assert_eq!(format(0), "0");
        for b in [0, 1, 1023, 4096, 6 * GI, 3 * GI / 2, 1 << 62] {
            assert_eq!(bytes(&format(b)), Some(b));
        }
    }
}
