//! Human units shared by every libshare component: sizes (`8GiB`, `512MiB`, `1.5GiB`, `4096`,
//! `2GB`) and durations (`5us`, `1.5ms`, `2s`).

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;
pub const TIB: u64 = 1 << 40;
pub const NS_PER_S: u64 = 1_000_000_000;

/// Parses a size in bytes: `1073741824`, `512MiB`, `1.5GiB`, `40GB`, `8Gi` (KiB/MiB/GiB/TiB and
/// Kubernetes' Ki/Mi/Gi/Ti are powers of 2, kB/MB/GB/TB powers of 10, `B` or no unit = bytes). Units are case-insensitive and may be
/// separated by a space. Fractions of a byte are truncated; a bare byte count must be whole.
pub fn parse_size(s: &str) -> Option<u64> {
    let (number, unit) = split_number(s.trim());
    let multiplier = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" if number.contains('.') => return None,
        "" | "b" => 1,
        "kib" | "ki" => KIB,
        "mib" | "mi" => MIB,
        "gib" | "gi" => GIB,
        "tib" | "ti" => TIB,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return None,
    };
    scale(number, multiplier)
}

/// Parses a duration into nanoseconds: `200ns`, `5us` (or `5µs`), `1.5ms`, `2s`. The unit is
/// required.
pub fn parse_duration_ns(s: &str) -> Option<u64> {
    let (number, unit) = split_number(s.trim());
    let multiplier = match unit.trim().to_lowercase().as_str() {
        "ns" => 1,
        "us" | "µs" | "μs" => 1_000,
        "ms" => 1_000_000,
        "s" => NS_PER_S,
        _ => return None,
    };
    scale(number, multiplier)
}

/// Splits `"1.5GiB"` into `("1.5", "GiB")`.
fn split_number(s: &str) -> (&str, &str) {
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    s.split_at(end)
}

/// `number × multiplier` for a decimal `number` like `12` or `1.25`, truncated to an integer;
/// None if it is malformed or does not fit in u64.
fn scale(number: &str, multiplier: u64) -> Option<u64> {
    let (whole, fraction) = match number.split_once('.') {
        Some((whole, fraction)) if !fraction.is_empty() => (whole, fraction),
        Some(_) => return None,
        None => (number, ""),
    };
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole: u128 = whole.parse().ok()?;
    let mut total = whole.checked_mul(u128::from(multiplier))?;
    // Digits past the 18th cannot change the truncated result of any u64 multiplier that matters.
    let fraction = &fraction[..fraction.len().min(18)];
    if !fraction.is_empty() {
        let numerator: u128 = fraction.parse().ok()?;
        let denominator = 10u128.pow(fraction.len() as u32);
        total += numerator * u128::from(multiplier) / denominator;
    }
    u64::try_from(total).ok()
}

/// Formats bytes for people: `8 GiB`, `1.5 GiB`, `512 MiB`, `4096 B`.
pub fn format_size(bytes: u64) -> String {
    for (unit, div) in [("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)] {
        if bytes >= div {
            let v = bytes as f64 / div as f64;
            return if bytes.is_multiple_of(div) {
                format!("{} {unit}", bytes / div)
            } else {
                format!("{v:.1} {unit}")
            };
        }
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("8GiB"), Some(8 * GIB));
        assert_eq!(parse_size("1.5GiB"), Some(GIB + GIB / 2));
        assert_eq!(parse_size("512 MiB"), Some(512 * MIB));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("2GB"), Some(2_000_000_000));
        assert_eq!(parse_size("8Gi"), Some(8 * GIB), "Kubernetes quantity");
        assert_eq!(parse_size("512Mi"), Some(512 * MIB));
        assert_eq!(
            parse_size("4g"),
            None,
            "single-letter units are ambiguous (GB or GiB?)"
        );
        for bad in [
            "banana",
            "",
            "-1GiB",
            "1.GiB",
            "GiB",
            "1.5",
            "99999999999999999999TiB",
        ] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
    }

    #[test]
    fn durations_and_formatting() {
        assert_eq!(parse_duration_ns("1.5ms"), Some(1_500_000));
        assert_eq!(parse_duration_ns("5"), None);
        assert_eq!(format_size(8 * GIB), "8 GiB");
        assert_eq!(format_size(GIB + GIB / 2), "1.5 GiB");
        assert_eq!(format_size(100), "100 B");
    }
}
