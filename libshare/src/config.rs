//! The shim's configuration, from the environment: `LIBSHARE_*` variables, plus HAMi-core's
//! `CUDA_DEVICE_MEMORY_LIMIT[_<i>]` and `CUDA_DEVICE_SM_LIMIT` so libshare can replace HAMi-core
//! under an existing scheduler. An invalid value is an error naming the variable: the job fails
//! at `cuInit`, never runs silently unlimited.

use libshare_abi::units::{parse_size, GIB, KIB, MIB};
use libshare_abi::{CLASS_OPPORTUNISTIC, CLASS_PRODUCTION, MAX_DEVICES};
use std::collections::HashMap;
use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Per-device memory limit in bytes (None = no limit from the environment).
    pub memory_limit: [Option<u64>; MAX_DEVICES],
    /// The variable each device's limit came from (for error messages).
    pub memory_limit_source: Vec<String>,
    pub class: u32,
    pub container: String,
    /// The container's directory holding `state.shm`.
    pub container_dir: PathBuf,
    /// Device memory charged once per process and device for its context (the driver's own use,
    /// invisible to allocation hooks; a few hundred MiB on a real GPU). Default 0.
    pub context_overhead: u64,
    /// Compute share in percent (HAMi's CUDA_DEVICE_SM_LIMIT; enforced by the rate controller).
    pub compute_percent: Option<u32>,
    pub log: Option<String>,
    /// One line each, printed once when the shim initialises.
    pub warnings: Vec<String>,
}

pub const KNOWN: &[&str] = &[
    "LIBSHARE_MEMORY_LIMIT",
    "LIBSHARE_CONTEXT_OVERHEAD",
    "LIBSHARE_CLASS",
    "LIBSHARE_CONTAINER",
    "LIBSHARE_CONTAINER_DIR",
    "LIBSHARE_STATE_DIR",
    "LIBSHARE_LOG",
    "LIBSHARE_REAL_LIBCUDA",
    "LIBSHARE_REAL_LIBNVML",
];

fn invalid(var: &str, value: &str, expected: &str) -> String {
    format!("libshare: invalid {var}={value:?}: {expected}")
}

/// HAMi-core sizes: a number with a `k`/`m`/`g` suffix (binary units) or a bare number of MiB, as
/// HAMi documents them (`1024m`, `4g`); libshare's own sizes (`4GiB`) are accepted too.
fn parse_hami_size(s: &str) -> Option<u64> {
    if let Some(v) = parse_size(s).filter(|_| s.trim().ends_with(|c: char| c.is_ascii_alphabetic()))
    {
        return Some(v);
    }
    let t = s.trim().to_ascii_lowercase();
    let (num, mult) = match t.chars().last()? {
        'k' => (&t[..t.len() - 1], KIB),
        'm' => (&t[..t.len() - 1], MIB),
        'g' => (&t[..t.len() - 1], GIB),
        c if c.is_ascii_digit() => (t.as_str(), MIB),
        _ => return None,
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}

/// `8GiB` (every device) or `0:8GiB,1:4GiB`.
fn parse_limits(
    var: &str,
    value: &str,
    out: &mut [Option<u64>; MAX_DEVICES],
    src: &mut [String],
) -> Result<(), String> {
    let expected = "expected a size like 8GiB, 8Gi or 512MiB (GB/MB = powers of 10), or per device 0:8GiB,1:4GiB";
    if !value.contains(':') {
        let v = parse_size(value)
            .filter(|v| *v > 0)
            .ok_or_else(|| invalid(var, value, expected))?;
        out.iter_mut().for_each(|x| *x = Some(v));
        src.iter_mut().for_each(|s| *s = format!("{var}={value}"));
        return Ok(());
    }
    for part in value.split(',') {
        let (dev, size) = part
            .split_once(':')
            .ok_or_else(|| invalid(var, value, expected))?;
        let dev: usize = dev
            .trim()
            .parse()
            .ok()
            .filter(|d| *d < MAX_DEVICES)
            .ok_or_else(|| invalid(var, value, expected))?;
        out[dev] = Some(
            parse_size(size)
                .filter(|v| *v > 0)
                .ok_or_else(|| invalid(var, value, expected))?,
        );
        src[dev] = format!("{var}={value}");
    }
    Ok(())
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && s != "."
        && s != ".."
}

/// `LIBSHARE_LOG` as a level (`error`, `warn`, `info`, `debug`, `trace`; anything else: `debug`).
pub fn log_level(s: &str) -> tracing::Level {
    match s.trim().to_ascii_lowercase().as_str() {
        "error" => tracing::Level::ERROR,
        "warn" | "warning" => tracing::Level::WARN,
        "info" => tracing::Level::INFO,
        "trace" => tracing::Level::TRACE,
        _ => tracing::Level::DEBUG,
    }
}

pub use libshare_abi::default_state_dir;

impl Config {
    pub fn from_env() -> Result<Config, String> {
        let vars: HashMap<String, String> = std::env::vars_os()
            .filter_map(|(k, v)| {
                Some((
                    k.into_string().ok()?,
                    v.into_string().unwrap_or_else(|_| "\u{fffd}".into()),
                ))
            })
            .filter(|(k, _)| k.starts_with("LIBSHARE_") || k.starts_with("CUDA_DEVICE_"))
            .collect();
        Self::from_vars(&vars)
    }

    pub fn from_vars(vars: &HashMap<String, String>) -> Result<Config, String> {
        let get = |k: &str| vars.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
        // An unknown LIBSHARE_* variable (a typo, or one meant for another tool) is reported, not
        // fatal: it must not stop a production job, and the warning keeps it from being silent.
        let mut unknown: Vec<&String> = vars
            .keys()
            .filter(|k| k.starts_with("LIBSHARE_") && !KNOWN.contains(&k.as_str()))
            .collect();
        unknown.sort();
        let warnings: Vec<String> = unknown
            .iter()
            .map(|k| {
                format!(
                    "libshare: warning: unknown variable {k} ignored; known: {}",
                    KNOWN.join(", ")
                )
            })
            .collect();
        let mut memory_limit = [None; MAX_DEVICES];
        let mut src = vec![String::new(); MAX_DEVICES];
        // HAMi-core names first, so libshare's own variable wins when both are set.
        if let Some(v) = get("CUDA_DEVICE_MEMORY_LIMIT") {
            let b = parse_hami_size(v).filter(|b| *b > 0).ok_or_else(|| {
                invalid(
                    "CUDA_DEVICE_MEMORY_LIMIT",
                    v,
                    "expected a size like 4g or 1024m",
                )
            })?;
            memory_limit.iter_mut().for_each(|x| *x = Some(b));
            src.iter_mut()
                .for_each(|s| *s = format!("CUDA_DEVICE_MEMORY_LIMIT={v}"));
        }
        for (i, slot) in memory_limit.iter_mut().enumerate() {
            let var = format!("CUDA_DEVICE_MEMORY_LIMIT_{i}");
            if let Some(v) = get(&var) {
                *slot = Some(
                    parse_hami_size(v)
                        .filter(|b| *b > 0)
                        .ok_or_else(|| invalid(&var, v, "expected a size like 4g or 1024m"))?,
                );
                src[i] = format!("{var}={v}");
            }
        }
        if let Some(v) = get("LIBSHARE_MEMORY_LIMIT") {
            parse_limits("LIBSHARE_MEMORY_LIMIT", v, &mut memory_limit, &mut src)?;
        }
        let class = match get("LIBSHARE_CLASS").map(|v| v.to_ascii_lowercase()) {
            None => CLASS_PRODUCTION,
            Some(c) if c == "production" => CLASS_PRODUCTION,
            Some(c) if c == "opportunistic" => CLASS_OPPORTUNISTIC,
            Some(_) => {
                return Err(invalid(
                    "LIBSHARE_CLASS",
                    get("LIBSHARE_CLASS").unwrap_or(""),
                    "expected production or opportunistic",
                ))
            }
        };
        let container = get("LIBSHARE_CONTAINER").unwrap_or("default").to_string();
        if !valid_name(&container) {
            return Err(invalid(
                "LIBSHARE_CONTAINER",
                &container,
                "expected 1-128 characters of A-Z a-z 0-9 - _ .",
            ));
        }
        let state_dir = match get("LIBSHARE_STATE_DIR") {
            Some(d) if d.starts_with('/') => PathBuf::from(d),
            Some(d) => {
                return Err(invalid(
                    "LIBSHARE_STATE_DIR",
                    d,
                    "expected an absolute path",
                ))
            }
            None => default_state_dir(),
        };
        let container_dir = match get("LIBSHARE_CONTAINER_DIR") {
            Some(d) if d.starts_with('/') => PathBuf::from(d),
            Some(d) => {
                return Err(invalid(
                    "LIBSHARE_CONTAINER_DIR",
                    d,
                    "expected an absolute path",
                ))
            }
            None => libshare_abi::container_dir(&state_dir, &container),
        };
        let context_overhead = match get("LIBSHARE_CONTEXT_OVERHEAD") {
            None => 0,
            Some(v) => parse_size(v).ok_or_else(|| {
                invalid(
                    "LIBSHARE_CONTEXT_OVERHEAD",
                    v,
                    "expected a size like 300MiB",
                )
            })?,
        };
        let compute_percent = match get("CUDA_DEVICE_SM_LIMIT") {
            None => None,
            Some(v) => Some(
                v.trim_end_matches('%')
                    .parse::<u32>()
                    .ok()
                    .filter(|p| (1..=100).contains(p))
                    .ok_or_else(|| {
                        invalid("CUDA_DEVICE_SM_LIMIT", v, "expected a percentage 1-100")
                    })?,
            ),
        };
        Ok(Config {
            memory_limit,
            memory_limit_source: src,
            context_overhead,
            class,
            container,
            container_dir,
            compute_percent,
            log: get("LIBSHARE_LOG").map(String::from),
            warnings,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(pairs: &[(&str, &str)]) -> Result<Config, String> {
        Config::from_vars(
            &pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn limits_everywhere_or_per_device() {
        let c = cfg(&[("LIBSHARE_MEMORY_LIMIT", "8GiB")]).unwrap();
        assert!(c.memory_limit.iter().all(|l| *l == Some(8 * GIB)));
        let c = cfg(&[("LIBSHARE_MEMORY_LIMIT", "0:8GiB,1:512MiB")]).unwrap();
        assert_eq!(
            &c.memory_limit[..3],
            &[Some(8 * GIB), Some(512 * MIB), None]
        );
        assert_eq!(cfg(&[]).unwrap().memory_limit, [None; MAX_DEVICES]);
    }

    #[test]
    fn hami_variables_are_accepted_and_ours_win() {
        let c = cfg(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", "4g"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "1024m"),
        ])
        .unwrap();
        assert_eq!(&c.memory_limit[..2], &[Some(4 * GIB), Some(GIB)]);
        let c = cfg(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", "4g"),
            ("LIBSHARE_MEMORY_LIMIT", "1GiB"),
        ])
        .unwrap();
        assert_eq!(c.memory_limit[0], Some(GIB));
        assert_eq!(
            cfg(&[("CUDA_DEVICE_SM_LIMIT", "30")])
                .unwrap()
                .compute_percent,
            Some(30)
        );
    }

    #[test]
    fn errors_name_the_variable() {
        for (k, v) in [
            ("LIBSHARE_MEMORY_LIMIT", "banana"),
            ("LIBSHARE_MEMORY_LIMIT", "0GiB"),
            ("LIBSHARE_MEMORY_LIMIT", "99:1GiB"),
            ("LIBSHARE_CLASS", "best-effort"),
            ("LIBSHARE_CONTAINER", "../etc"),
            ("LIBSHARE_STATE_DIR", "relative"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "lots"),
            ("CUDA_DEVICE_SM_LIMIT", "150"),
        ] {
            let e = cfg(&[(k, v)]).unwrap_err();
            assert!(e.starts_with(&format!("libshare: invalid {k}=")), "{e}");
            assert!(!e.contains('\n'), "one line: {e}");
        }
        let c = cfg(&[("LIBSHARE_MEMROY_LIMIT", "1GiB")]).unwrap();
        assert_eq!(c.warnings.len(), 1);
        assert!(
            c.warnings[0].contains("unknown variable LIBSHARE_MEMROY_LIMIT ignored"),
            "{:?}",
            c.warnings
        );
    }

    #[test]
    fn container_dir_defaults_under_the_state_dir() {
        let c = cfg(&[
            ("LIBSHARE_STATE_DIR", "/s"),
            ("LIBSHARE_CONTAINER", "web-1"),
            ("LIBSHARE_CLASS", "opportunistic"),
        ])
        .unwrap();
        assert_eq!(c.container_dir, PathBuf::from("/s/containers/web-1"));
        assert_eq!(c.class, CLASS_OPPORTUNISTIC);
    }
}
