//! The shim's configuration, from the environment: `LIBSHARE_*` variables, plus HAMi-core's
//! `CUDA_DEVICE_MEMORY_LIMIT[_<i>]` and `CUDA_DEVICE_SM_LIMIT` so libshare can replace HAMi-core
//! under an existing scheduler. An invalid value is an error naming the variable: the job fails
//! at `cuInit`, never runs silently unlimited.

use libshare_abi::hami::HamiEnv;
use libshare_abi::units::{format_size, parse_size};
use libshare_abi::{Class, MAX_DEVICES};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

/// `LIBSHARE_REGISTER_TIMEOUT` when unset.
pub const DEFAULT_REGISTER_TIMEOUT: Duration = Duration::from_secs(10);

/// The daemon's registration socket a shim in HAMi mode (`CUDA_DEVICE_MEMORY_SHARED_CACHE` set)
/// asks first: in `/tmp/vgpulock`, which HAMi's device plugin mounts into every container.
pub const HAMI_SOCKET: &str = "/tmp/vgpulock/libshare/register.sock";

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Per-device memory limit in bytes (None = no limit from the environment).
    pub memory_limit: [Option<u64>; MAX_DEVICES],
    /// The variable each device's limit came from (for error messages).
    pub memory_limit_source: Vec<String>,
    /// Whether device `i`'s limit names that device (`0:8GiB`, `CUDA_DEVICE_MEMORY_LIMIT_0`)
    /// rather than every device: such a limit for a device the process does not have is an error
    /// ([`Config::check_devices`]).
    pub memory_limit_explicit: [bool; MAX_DEVICES],
    pub class: Class,
    pub container: String,
    /// The container's directory holding `state.shm`.
    pub container_dir: PathBuf,
    /// The daemon's registration socket to try first: `LIBSHARE_SOCKET`, else
    /// `<state dir>/register.sock` (none when `LIBSHARE_CONTAINER_DIR` names the file's place).
    pub socket: Option<PathBuf>,
    /// HAMi mode (`CUDA_DEVICE_MEMORY_SHARED_CACHE` set): a socket in `/tmp/vgpulock/libshare`
    /// that is not on a read-only mount is refused (`register.rs`).
    pub hami: bool,
    /// How long a process whose registration socket exists waits for the daemon to register it
    /// (`LIBSHARE_REGISTER_TIMEOUT`, default 10 s) before `cuInit` fails.
    pub register_timeout: Duration,
    /// Device memory charged once per process and device for its context (the driver's own use,
    /// invisible to allocation hooks; a few hundred MiB on a real GPU). Default 0.
    pub context_overhead: u64,
    /// Compute share in percent (HAMi's CUDA_DEVICE_SM_LIMIT; enforced by the rate controller).
    pub compute_percent: Option<u32>,
    /// HAMi's `CUDA_OVERSUBSCRIBE=true`: an opportunistic container may oversubscribe device
    /// memory (its allocations become managed memory; its limit may exceed the device).
    pub oversubscribe: bool,
    /// Kernel slicing of this process's launches while it is opportunistic (`slicing.rs`):
    /// `LIBSHARE_SLICING=on` (default) or `off`.
    pub slicing: bool,
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
    "LIBSHARE_SOCKET",
    "LIBSHARE_REGISTER_TIMEOUT",
    "LIBSHARE_SLICING",
    "LIBSHARE_LOG",
    "LIBSHARE_REAL_LIBCUDA",
    "LIBSHARE_REAL_LIBNVML",
    // Read by the container runtime (`sharectl runtime`, the CDI spec's devices), not the shim.
    "LIBSHARE_VISIBLE_DEVICES",
];

fn invalid(var: &str, value: &str, expected: &str) -> String {
    format!("libshare: invalid {var}={value:?}: {expected}")
}

/// `8GiB` (every device) or `0:8GiB,1:4GiB` (each device once).
fn parse_limits(
    var: &str,
    value: &str,
    out: &mut [Option<u64>; MAX_DEVICES],
    src: &mut [String],
    explicit: &mut [bool; MAX_DEVICES],
) -> Result<(), String> {
    let expected = "expected a size like 8GiB, 8Gi or 512MiB (GB/MB = powers of 10), or per device 0:8GiB,1:4GiB";
    if !value.contains(':') {
        let v = parse_size(value)
            .filter(|v| *v > 0)
            .ok_or_else(|| invalid(var, value, expected))?;
        out.iter_mut().for_each(|x| *x = Some(v));
        src.iter_mut().for_each(|s| *s = format!("{var}={value}"));
        explicit.iter_mut().for_each(|e| *e = false);
        return Ok(());
    }
    let mut seen = [false; MAX_DEVICES];
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
        if std::mem::replace(&mut seen[dev], true) {
            return Err(invalid(
                var,
                value,
                &format!("device {dev} is given twice; give each device once"),
            ));
        }
        out[dev] = Some(
            parse_size(size)
                .filter(|v| *v > 0)
                .ok_or_else(|| invalid(var, value, expected))?,
        );
        src[dev] = format!("{var}={value}");
        explicit[dev] = true;
    }
    Ok(())
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

/// The one line for a context overhead that leaves nothing of device `d`'s `limit` (`source`).
fn overhead_error(overhead: u64, d: usize, limit: u64, source: &str) -> String {
    format!(
        "libshare: invalid LIBSHARE_CONTEXT_OVERHEAD: {} is not below device {d}'s {} ({source}), \
         so every context would fail; lower the overhead or raise the limit",
        format_size(overhead),
        format_size(limit)
    )
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
            .filter(|(k, _)| k.starts_with("LIBSHARE_") || libshare_abi::hami::is_hami_var(k))
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
        // HAMi-core's variables first, so libshare's own win when both are set.
        let hami = HamiEnv::from_vars(vars)?;
        let mut warnings = warnings;
        warnings.extend(hami.warnings.iter().cloned());
        let mut memory_limit = hami.memory;
        let mut src: Vec<String> = hami
            .memory_source
            .iter()
            .map(|s| s.clone().unwrap_or_default())
            .collect();
        let mut explicit = hami.memory_explicit;
        // A memory limit variable that is set must say something: empty is not "no limit".
        let limit_var = |k: &str| match vars.get(k).map(|v| v.trim()) {
            Some("") => Err(invalid(
                k,
                "",
                "empty; expected a size (unset the variable for no limit)",
            )),
            v => Ok(v),
        };
        if let Some(v) = limit_var("LIBSHARE_MEMORY_LIMIT")? {
            parse_limits(
                "LIBSHARE_MEMORY_LIMIT",
                v,
                &mut memory_limit,
                &mut src,
                &mut explicit,
            )?;
        }
        let class = match get("LIBSHARE_CLASS").map(|v| Class::from_name(&v.to_ascii_lowercase())) {
            // HAMi's CUDA_TASK_PRIORITY: 0 (high) is production, 1 (low) opportunistic.
            None if hami.opportunistic == Some(true) => Class::Opportunistic,
            None => Class::Production,
            Some(Some(c)) => c,
            Some(None) => {
                return Err(invalid(
                    "LIBSHARE_CLASS",
                    get("LIBSHARE_CLASS").unwrap_or(""),
                    "expected production or opportunistic",
                ))
            }
        };
        let container = get("LIBSHARE_CONTAINER").unwrap_or("default").to_string();
        if !libshare_abi::names::valid_container_name(&container) {
            return Err(invalid(
                "LIBSHARE_CONTAINER",
                &container,
                &format!("expected {}", libshare_abi::names::NAME_RULE),
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
            // HAMi mode: the container's state beside the region file HAMi-core would use, in
            // the per-container directory HAMi's device plugin mounts (shared by every process
            // of the container, as HAMi-core's cache file is).
            None => match (&hami.shared_cache, get("LIBSHARE_STATE_DIR")) {
                (Some(cache), None) => cache.parent().unwrap_or(cache).join("libshare"),
                _ => libshare_abi::container_dir(&state_dir, &container),
            },
        };
        let socket = match get("LIBSHARE_SOCKET") {
            Some(d) if d.starts_with('/') => Some(PathBuf::from(d)),
            Some(d) => return Err(invalid("LIBSHARE_SOCKET", d, "expected an absolute path")),
            None if get("LIBSHARE_CONTAINER_DIR").is_some() => None,
            // HAMi mode: the daemon's socket in /tmp/vgpulock, which HAMi's device plugin mounts
            // into every container (`sharectl daemon --hami --register-socket ...`).
            None if hami.shared_cache.is_some() && get("LIBSHARE_STATE_DIR").is_none() => {
                Some(PathBuf::from(HAMI_SOCKET))
            }
            None => Some(state_dir.join("register.sock")),
        };
        let register_timeout = match get("LIBSHARE_REGISTER_TIMEOUT") {
            None => DEFAULT_REGISTER_TIMEOUT,
            Some(v) => libshare_abi::units::parse_duration_ns(v)
                .map(Duration::from_nanos)
                .ok_or_else(|| {
                    invalid(
                        "LIBSHARE_REGISTER_TIMEOUT",
                        v,
                        "expected a duration like 10s or 500ms (0s: one attempt, no waiting)",
                    )
                })?,
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
        // HAMi-core's SM limits (0 and 100: no limit); libshare applies one per process, the
        // smallest of its devices'.
        let compute_percent = hami.sm.iter().flatten().min().copied();
        let oversubscribe = hami.oversubscribe.unwrap_or(false);
        let slicing = match get("LIBSHARE_SLICING") {
            None | Some("on") => true,
            Some("off") => false,
            Some(v) => return Err(invalid("LIBSHARE_SLICING", v, "expected on or off")),
        };
        // The context overhead is charged before any allocation: at or above a limit, every
        // context would fail.
        if let Some((d, l)) = memory_limit.iter().enumerate().find_map(|(d, l)| {
            l.filter(|l| context_overhead > 0 && context_overhead >= *l)
                .map(|l| (d, l))
        }) {
            return Err(overhead_error(context_overhead, d, l, &src[d]));
        }
        Ok(Config {
            memory_limit,
            memory_limit_source: src,
            memory_limit_explicit: explicit,
            context_overhead,
            class,
            container,
            container_dir,
            socket,
            hami: hami.shared_cache.is_some(),
            register_timeout,
            compute_percent,
            oversubscribe,
            slicing,
            log: get("LIBSHARE_LOG").map(String::from),
            warnings,
        })
    }

    /// The limits against the devices this process sees (`count` of them; `totals[d]`: device
    /// `d`'s memory, where known), checked at `cuInit`: a limit naming a device that does not
    /// exist (the device meant would run unlimited), a limit above a device's memory, and a
    /// context overhead that leaves nothing of a device are errors naming the variable.
    pub fn check_devices(&self, count: usize, totals: &[u64]) -> Result<(), String> {
        if let Some(d) = (count..MAX_DEVICES).find(|d| self.memory_limit_explicit[*d]) {
            return Err(format!(
                "libshare: invalid {}: this process has no CUDA device {d} ({count} device{}; \
                 CUDA numbers the devices CUDA_VISIBLE_DEVICES shows, from 0)",
                self.memory_limit_source[d],
                if count == 1 { "" } else { "s" }
            ));
        }
        // An opportunistic container that may oversubscribe limits a footprint of managed
        // memory, which may exceed the device.
        let footprint = self.oversubscribe && self.class == Class::Opportunistic;
        for (d, &total) in totals.iter().enumerate().take(count.min(MAX_DEVICES)) {
            if let Some(l) = self.memory_limit[d].filter(|l| *l > total && !footprint) {
                return Err(format!(
                    "libshare: invalid {}: {} is more than device {d}'s {} of memory (an \
                     opportunistic container may exceed it with CUDA_OVERSUBSCRIBE=true)",
                    self.memory_limit_source[d],
                    format_size(l),
                    format_size(total)
                ));
            }
            if self.context_overhead > 0 && self.context_overhead >= total {
                return Err(overhead_error(
                    self.context_overhead,
                    d,
                    total,
                    "the device's memory",
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use libshare_abi::units::{GIB, KIB, MIB};
    use std::path::Path;

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
    fn hami_priority_per_device_sm_limits_and_shared_cache_apply() {
        let c = cfg(&[
            ("CUDA_TASK_PRIORITY", "1"),
            ("CUDA_DEVICE_SM_LIMIT", "60"),
            ("CUDA_DEVICE_SM_LIMIT_1", "25"),
            (
                "CUDA_DEVICE_MEMORY_SHARED_CACHE",
                "/usr/local/vgpu/abc.cache",
            ),
        ])
        .unwrap();
        assert_eq!(
            c.class,
            Class::Opportunistic,
            "low priority is opportunistic"
        );
        assert_eq!(c.compute_percent, Some(25), "the smallest of the devices'");
        assert_eq!(c.container_dir, PathBuf::from("/usr/local/vgpu/libshare"));
        assert_eq!(c.socket, Some(PathBuf::from(HAMI_SOCKET)));
        assert!(c.hami);
        assert_eq!(
            PathBuf::from(HAMI_SOCKET),
            Path::new(libshare_abi::socket_dir::HAMI_DIR)
                .join(libshare_abi::socket_dir::SOCKET_NAME)
        );
        let c = cfg(&[
            ("CUDA_TASK_PRIORITY", "1"),
            ("LIBSHARE_CLASS", "production"),
        ])
        .unwrap();
        assert_eq!(c.class, Class::Production, "libshare's own variable wins");
        assert_eq!(
            cfg(&[("CUDA_TASK_PRIORITY", "0")]).unwrap().class,
            Class::Production
        );
        let e = cfg(&[("CUDA_TASK_PRIORITY", "2")]).unwrap_err();
        assert!(e.contains("CUDA_TASK_PRIORITY"), "{e}");
        let e = cfg(&[("CUDA_DEVICE_SM_LIMIT_0", "101")]).unwrap_err();
        assert!(e.contains("CUDA_DEVICE_SM_LIMIT_0"), "{e}");
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
        for none in ["0", "100", "100%"] {
            assert_eq!(
                cfg(&[("CUDA_DEVICE_SM_LIMIT", none)])
                    .unwrap()
                    .compute_percent,
                None,
                "{none} is no limit"
            );
        }
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
        assert_eq!(c.class, Class::Opportunistic);
    }

    /// `e` is one line starting `libshare: invalid {var}`.
    fn names(e: &str, var: &str) {
        assert!(e.starts_with(&format!("libshare: invalid {var}")), "{e}");
        assert!(!e.contains('\n'), "one line: {e}");
    }

    #[test]
    fn an_empty_limit_is_an_error_not_unlimited() {
        for var in [
            "LIBSHARE_MEMORY_LIMIT",
            "CUDA_DEVICE_MEMORY_LIMIT",
            "CUDA_DEVICE_MEMORY_LIMIT_0",
        ] {
            for v in ["", "  "] {
                let e = cfg(&[(var, v)]).unwrap_err();
                names(&e, var);
                assert!(e.contains("empty"), "{e}");
            }
        }
    }

    #[test]
    fn a_device_given_twice_is_an_error() {
        let e = cfg(&[("LIBSHARE_MEMORY_LIMIT", "0:1GiB,1:2GiB,0:2GiB")]).unwrap_err();
        names(&e, "LIBSHARE_MEMORY_LIMIT");
        assert!(e.contains("device 0 is given twice"), "{e}");
    }

    #[test]
    fn per_device_variables_hami_core_would_ignore_are_errors() {
        for var in [
            "CUDA_DEVICE_MEMORY_LIMIT_16",
            "CUDA_DEVICE_MEMORY_LIMIT_00",
            "CUDA_DEVICE_MEMORY_LIMIT_01",
            "CUDA_DEVICE_MEMORY_LIMIT_x",
            "CUDA_DEVICE_MEMORY_LIMIT_",
        ] {
            let e = cfg(&[(var, "1g")]).unwrap_err();
            assert!(
                e.starts_with(&format!("libshare: invalid variable {var}:")),
                "{e}"
            );
            assert!(!e.contains('\n'), "{e}");
        }
        let c = cfg(&[
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "1g"),
            ("CUDA_DEVICE_MEMORY_LIMIT_15", "2g"),
        ])
        .unwrap();
        assert_eq!(
            (c.memory_limit[0], c.memory_limit[15]),
            (Some(GIB), Some(2 * GIB))
        );
        assert_eq!(c.memory_limit[1], None);
    }

    #[test]
    fn hami_sizes_are_read_as_hami_core_reads_them() {
        let limit = |v: &str| cfg(&[("CUDA_DEVICE_MEMORY_LIMIT", v)]).map(|c| c.memory_limit[0]);
        // A bare number is bytes (HAMi-core's get_limit_from_env: no suffix, scalar 1).
        assert_eq!(limit("1073741824"), Ok(Some(GIB)));
        assert_eq!(limit("17179869184"), Ok(Some(16 * GIB)));
        // k/m/g in either case are powers of 2.
        assert_eq!(limit("1024m"), Ok(Some(GIB)));
        assert_eq!(limit("1024M"), Ok(Some(GIB)));
        assert_eq!(limit("4g"), Ok(Some(4 * GIB)));
        assert_eq!(limit("4G"), Ok(Some(4 * GIB)));
        assert_eq!(limit("512k"), Ok(Some(512 * KIB)));
        // libshare's own sizes too.
        assert_eq!(limit("4GiB"), Ok(Some(4 * GIB)));
        assert_eq!(limit("4Gi"), Ok(Some(4 * GIB)));
        for bad in [
            "0",
            "0m",
            "lots",
            "4 g",
            "-1",
            "1.5g",
            "99999999999999999999",
        ] {
            names(&limit(bad).unwrap_err(), "CUDA_DEVICE_MEMORY_LIMIT");
        }
        let per_device = cfg(&[("CUDA_DEVICE_MEMORY_LIMIT_1", "2147483648")]).unwrap();
        assert_eq!(per_device.memory_limit[1], Some(2 * GIB));
        // A bare number small enough to be a mistake for MiB is said once, not silent.
        let c = cfg(&[("CUDA_DEVICE_MEMORY_LIMIT", "1024")]).unwrap();
        assert_eq!(c.memory_limit[0], Some(1024));
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
        assert!(c.warnings[0].contains("1024 bytes"), "{:?}", c.warnings);
        assert!(cfg(&[("CUDA_DEVICE_MEMORY_LIMIT", "1073741824")])
            .unwrap()
            .warnings
            .is_empty());
    }

    #[test]
    fn libshare_memory_limit_keeps_its_documented_units() {
        let limit = |v: &str| cfg(&[("LIBSHARE_MEMORY_LIMIT", v)]).map(|c| c.memory_limit[0]);
        assert_eq!(limit("1073741824"), Ok(Some(GIB))); // bytes
        assert_eq!(limit("1GiB"), Ok(Some(GIB)));
        assert_eq!(limit("1GB"), Ok(Some(1_000_000_000)));
        names(&limit("1g").unwrap_err(), "LIBSHARE_MEMORY_LIMIT");
    }

    #[test]
    fn a_context_overhead_at_or_above_a_limit_is_an_error() {
        for (limit, overhead) in [("256MiB", "300MiB"), ("256MiB", "256MiB")] {
            let e = cfg(&[
                ("LIBSHARE_MEMORY_LIMIT", limit),
                ("LIBSHARE_CONTEXT_OVERHEAD", overhead),
            ])
            .unwrap_err();
            names(&e, "LIBSHARE_CONTEXT_OVERHEAD");
            assert!(e.contains("LIBSHARE_MEMORY_LIMIT=256MiB"), "{e}");
        }
        let c = cfg(&[
            ("LIBSHARE_MEMORY_LIMIT", "1GiB"),
            ("LIBSHARE_CONTEXT_OVERHEAD", "300MiB"),
        ])
        .unwrap();
        assert_eq!(c.context_overhead, 300 * MIB);
    }

    #[test]
    fn limits_are_checked_against_the_devices_the_process_has() {
        let totals = [8 * GIB];
        // A limit naming device 1 on a one-device process: device 0 would run unlimited.
        for vars in [
            &[("LIBSHARE_MEMORY_LIMIT", "1:4GiB")][..],
            &[("CUDA_DEVICE_MEMORY_LIMIT_1", "4g")][..],
            &[("LIBSHARE_MEMORY_LIMIT", "0:4GiB,1:4GiB")][..],
        ] {
            let e = cfg(vars).unwrap().check_devices(1, &totals).unwrap_err();
            names(&e, vars[0].0);
            assert!(e.contains("no CUDA device 1 (1 device;"), "{e}");
        }
        // A limit for every device, or overridden by one for every device, names none.
        for vars in [
            &[("LIBSHARE_MEMORY_LIMIT", "4GiB")][..],
            &[("CUDA_DEVICE_MEMORY_LIMIT", "4g")][..],
            &[
                ("CUDA_DEVICE_MEMORY_LIMIT_3", "1g"),
                ("LIBSHARE_MEMORY_LIMIT", "4GiB"),
            ][..],
        ] {
            assert_eq!(cfg(vars).unwrap().check_devices(1, &totals), Ok(()));
        }
        assert_eq!(
            cfg(&[("LIBSHARE_MEMORY_LIMIT", "1:4GiB")])
                .unwrap()
                .check_devices(2, &[8 * GIB, 8 * GIB]),
            Ok(())
        );
        // Above the device's memory.
        let e = cfg(&[("LIBSHARE_MEMORY_LIMIT", "16GiB")])
            .unwrap()
            .check_devices(1, &totals)
            .unwrap_err();
        names(&e, "LIBSHARE_MEMORY_LIMIT=16GiB");
        // Unless the container is opportunistic and may oversubscribe (a managed footprint).
        let over = |class: &str| {
            cfg(&[
                ("LIBSHARE_MEMORY_LIMIT", "16GiB"),
                ("LIBSHARE_CLASS", class),
                ("CUDA_OVERSUBSCRIBE", "true"),
            ])
            .unwrap()
            .check_devices(1, &totals)
        };
        assert_eq!(over("opportunistic"), Ok(()));
        names(
            &over("production").unwrap_err(),
            "LIBSHARE_MEMORY_LIMIT=16GiB",
        );
        // An overhead that leaves nothing of an unlimited device.
        let e = cfg(&[("LIBSHARE_CONTEXT_OVERHEAD", "8GiB")])
            .unwrap()
            .check_devices(1, &totals)
            .unwrap_err();
        names(&e, "LIBSHARE_CONTEXT_OVERHEAD");
    }

    #[test]
    fn cuda_oversubscribe_is_true_or_false() {
        let o = |v: &str| cfg(&[("CUDA_OVERSUBSCRIBE", v)]).map(|c| c.oversubscribe);
        assert!(!cfg(&[]).unwrap().oversubscribe);
        for (v, want) in [
            ("true", true),
            ("TRUE", true),
            ("1", true),
            ("false", false),
            ("0", false),
        ] {
            assert_eq!(o(v), Ok(want), "{v}");
        }
        names(&o("yes").unwrap_err(), "CUDA_OVERSUBSCRIBE");
    }

    #[test]
    fn the_register_timeout_is_a_duration_and_defaults_to_ten_seconds() {
        let t = |v: &str| cfg(&[("LIBSHARE_REGISTER_TIMEOUT", v)]).map(|c| c.register_timeout);
        assert_eq!(cfg(&[]).unwrap().register_timeout, Duration::from_secs(10));
        assert_eq!(t("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(t("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(t("0s"), Ok(Duration::ZERO));
        for bad in ["10", "ten seconds", "-1s", "1h"] {
            names(&t(bad).unwrap_err(), "LIBSHARE_REGISTER_TIMEOUT");
        }
        assert!(cfg(&[("LIBSHARE_REGISTER_TIMEOUT", "1s")])
            .unwrap()
            .warnings
            .is_empty());
    }
}
