//! Command-line helpers shared by the jobs: human sizes, durations, common options.

use std::time::Duration;

/// Options every job accepts.
#[derive(clap::Args, Debug, Clone)]
pub struct CommonArgs {
    /// CUDA device ordinal to run on.
    #[arg(long, default_value_t = 0)]
    pub device: usize,

    /// How often to print a progress line (e.g. 1s, 500ms; 0 = never).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    pub report_interval: Duration,
}

/// Parses a human byte size (`2GiB`, `512MiB`, `1.5GiB`, `4096`, `2GB`): libshare's one size
/// syntax (`libshare_abi::units::parse_size`), with a clap-friendly error.
pub fn parse_size(s: &str) -> Result<u64, String> {
    libshare_abi::units::parse_size(s).ok_or_else(|| {
        format!(
            "invalid size '{s}': expected a number with a unit, e.g. 512MiB, 2GiB, 1.5GiB or 4096"
        )
    })
}

/// Parses a duration: a number (fractions allowed) with an optional unit `ns`, `us`, `ms`, `s`
/// (the default), `m` or `h`. Examples: `5`, `2.5s`, `500ms`, `1m`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!(
            "invalid duration '{s}': expected a number with an optional unit, e.g. 5s or 500ms"
        ));
    }
    let value: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration '{s}': '{num}' is not a number"))?;
    let secs_per_unit = match unit.trim() {
        "" | "s" | "sec" => 1.0,
        "ms" => 1e-3,
        "us" | "µs" => 1e-6,
        "ns" => 1e-9,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        other => {
            return Err(format!(
                "invalid duration '{s}': unknown unit '{other}' (use ns, us, ms, s, m or h)"
            ))
        }
    };
    Duration::try_from_secs_f64(value * secs_per_unit)
        .map_err(|_| format!("invalid duration '{s}': out of range"))
}

/// Parses `BUSY:IDLE` phases, two durations (e.g. `2s:2s`, `500ms:1.5s`); BUSY must be > 0.
pub fn parse_phases(s: &str) -> Result<(Duration, Duration), String> {
    let (busy, idle) = s
        .split_once(':')
        .ok_or_else(|| format!("invalid phases '{s}': expected BUSY:IDLE, e.g. 2s:2s"))?;
    let busy = parse_duration(busy)?;
    let idle = parse_duration(idle)?;
    if busy.is_zero() {
        return Err(format!("invalid phases '{s}': the busy phase must be > 0"));
    }
    Ok((busy, idle))
}

/// Parses a non-negative, finite number of milliseconds.
pub fn parse_ms(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("invalid milliseconds '{s}': not a number"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!(
            "invalid milliseconds '{s}': must be a finite number >= 0"
        ));
    }
    Ok(v)
}

/// Parses a strictly positive, finite number (rates).
pub fn parse_positive(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("invalid value '{s}': not a number"))?;
    if !v.is_finite() || v <= 0.0 {
        return Err(format!("invalid value '{s}': must be a finite number > 0"));
    }
    Ok(v)
}

/// Formats a byte count for humans (binary units), e.g. `256 MiB`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[i])
    } else {
        format!("{v:.2} {}", UNITS[i])
    }
}

/// Splits `total_ms` of GPU time into `kernels` kernel durations in nanoseconds that add up
/// exactly to the total (the remainder goes to the first kernels).
pub fn split_ns(total_ms: f64, kernels: u32) -> Vec<u64> {
    if kernels == 0 {
        return Vec::new();
    }
    let total = (total_ms * 1e6).round() as u64;
    let k = kernels as u64;
    (0..k)
        .map(|i| total / k + u64::from(i < total % k))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4096B"), Ok(4096));
        assert_eq!(parse_size("1KiB"), Ok(1024));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("2gib"), Ok(2 << 30));
        assert!(
            parse_size("2G").is_err(),
            "GB or GiB? ambiguous units are refused"
        );
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("1TiB"), Ok(1 << 40));
        assert_eq!(parse_size("1GB"), Ok(1_000_000_000));
        assert_eq!(parse_size("10MB"), Ok(10_000_000));
        assert_eq!(parse_size(" 8 GiB "), Ok(8 << 30));
    }

    #[test]
    fn bad_sizes() {
        for bad in [
            "",
            "GiB",
            "-1",
            "1.2.3G",
            "12XB",
            "1.5",
            "99999999999TiB",
            "abc",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?} should be rejected");
        }
        assert!(parse_size("12XB")
            .unwrap_err()
            .contains("expected a number with a unit"));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("2.5s"), Ok(Duration::from_millis(2500)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        for bad in ["", "s", "-1s", "5 parsecs", "1e3"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn phases() {
        assert_eq!(
            parse_phases("2s:2s"),
            Ok((Duration::from_secs(2), Duration::from_secs(2)))
        );
        assert_eq!(
            parse_phases("500ms:0"),
            Ok((Duration::from_millis(500), Duration::ZERO))
        );
        for bad in ["2s", "0:1s", "2s:x", ":"] {
            assert!(parse_phases(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn numbers() {
        assert_eq!(parse_ms("1.5"), Ok(1.5));
        assert_eq!(parse_ms("0"), Ok(0.0));
        assert!(parse_ms("-1").is_err());
        assert!(parse_ms("inf").is_err());
        assert!(parse_ms("NaN").is_err());
        assert_eq!(parse_positive("20"), Ok(20.0));
        assert!(parse_positive("0").is_err());
    }

    #[test]
    fn formatting() {
        assert_eq!(format_size(12), "12 B");
        assert_eq!(format_size(256 << 20), "256 MiB");
        assert_eq!(format_size(3 << 29), "1.50 GiB");
    }

    #[test]
    fn split() {
        assert_eq!(split_ns(6.0, 4), vec![1_500_000; 4]);
        assert_eq!(split_ns(0.000_005, 2), vec![3, 2]);
        assert_eq!(split_ns(1.0, 3).iter().sum::<u64>(), 1_000_000);
        assert!(split_ns(1.0, 0).is_empty());
    }
}
