//! HAMi-core's contract (the variables HAMi's device plugin and webhook give a container), read
//! exactly as HAMi-core reads them, for the shim (`libshare/src/config.rs`) and for the daemon
//! that adopts them per container (`sharectl daemon --hami`). Facts:
//! `../shared/reference/anchors-hami-gemini.md` §3, §7 and `anchors-refresh-2026.md` §3.
//!
//! Where HAMi-core would silently ignore a value and leave a device unlimited (`_16`, `_00`,
//! an SM limit of 150, a priority of 7), this is an error naming the variable instead.

use crate::units::{parse_size, GIB, KIB, MIB};
use crate::MAX_DEVICES;
use std::collections::HashMap;

pub const MEMORY_LIMIT: &str = "CUDA_DEVICE_MEMORY_LIMIT";
pub const SM_LIMIT: &str = "CUDA_DEVICE_SM_LIMIT";
pub const TASK_PRIORITY: &str = "CUDA_TASK_PRIORITY";
pub const OVERSUBSCRIBE: &str = "CUDA_OVERSUBSCRIBE";
pub const SHARED_CACHE: &str = "CUDA_DEVICE_MEMORY_SHARED_CACHE";

/// Whether `k` is one of the variables of this contract (`_<i>` forms included).
pub fn is_hami_var(k: &str) -> bool {
    k.starts_with("CUDA_DEVICE_") || k == TASK_PRIORITY || k == OVERSUBSCRIBE
}

fn invalid(var: &str, value: &str, expected: &str) -> String {
    format!("libshare: invalid {var}={value:?}: {expected}")
}

/// HAMi-core sizes (`get_limit_from_env`): a whole number of bytes, or one with a `k`/`m`/`g`
/// suffix (either case; powers of 2): `1073741824`, `1024m`, `4g`. libshare's own sizes
/// (`4GiB`, `4Gi`, `4GB`) are accepted too.
pub fn parse_size_hami(s: &str) -> Option<u64> {
    let t = s.trim();
    let whole = |n: &str| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit());
    if whole(t) {
        return t.parse().ok();
    }
    let (num, suffix) = t.split_at(t.len() - t.chars().last()?.len_utf8());
    let mult = match suffix {
        "k" | "K" => KIB,
        "m" | "M" => MIB,
        "g" | "G" => GIB,
        _ => return parse_size(t),
    };
    whole(num).then_some(())?;
    num.parse::<u64>().ok()?.checked_mul(mult)
}

/// The device index of a `<VAR>_<i>` suffix as HAMi's device plugin writes it (`%d`: decimal,
/// no leading zero) and below [`MAX_DEVICES`].
pub fn device_suffix(s: &str) -> Option<usize> {
    let canonical = s == "0" || (!s.starts_with('0') && s.bytes().all(|b| b.is_ascii_digit()));
    canonical
        .then(|| s.parse().ok())
        .flatten()
        .filter(|d| *d < MAX_DEVICES)
}

/// The per-device variables `<base>_<i>` set in `vars`, sorted, each with its device; an error
/// for a suffix HAMi-core would ignore.
fn per_device<'a>(
    vars: &'a HashMap<String, String>,
    base: &str,
) -> Result<Vec<(usize, &'a str, &'a str)>, String> {
    let prefix = format!("{base}_");
    let mut keys: Vec<&String> = vars.keys().filter(|k| k.starts_with(&prefix)).collect();
    keys.sort();
    keys.into_iter()
        .map(|k| {
            let i = device_suffix(&k[prefix.len()..]).ok_or_else(|| {
                format!(
                    "libshare: invalid variable {k}: expected {base}_<i> with a device index \
                     0-{} written without leading zeros",
                    MAX_DEVICES - 1
                )
            })?;
            Ok((i, k.as_str(), vars[k].trim()))
        })
        .collect()
}

/// An SM limit in percent as HAMi-core reads it: 0 and 100 are no limit (None).
fn sm_limit(var: &str, v: &str) -> Result<Option<u32>, String> {
    match v.trim_end_matches('%').parse::<u32>() {
        Ok(0 | 100) => Ok(None),
        Ok(p @ 1..=99) => Ok(Some(p)),
        _ => Err(invalid(
            var,
            v,
            "expected a percentage 0-100 (0 and 100: no limit)",
        )),
    }
}

/// What HAMi's variables in an environment say. Memory limits are per device; `memory_source`
/// names the variable each came from.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HamiEnv {
    pub memory: [Option<u64>; MAX_DEVICES],
    pub memory_source: [Option<String>; MAX_DEVICES],
    /// Whether device `i`'s limit came from `CUDA_DEVICE_MEMORY_LIMIT_<i>`.
    pub memory_explicit: [bool; MAX_DEVICES],
    /// SM limit per device, percent (None: no limit).
    pub sm: [Option<u32>; MAX_DEVICES],
    /// `CUDA_TASK_PRIORITY`: 0 (high) → production, 1 (low) → opportunistic; unset under HAMi
    /// (the shared cache path set): HAMi-core's default, 1.
    pub opportunistic: Option<bool>,
    pub oversubscribe: Option<bool>,
    /// `CUDA_DEVICE_MEMORY_SHARED_CACHE`: the region file HAMi-core would create (its directory
    /// is HAMi's per-container directory).
    pub shared_cache: Option<std::path::PathBuf>,
    /// One line each, for a value that is valid but likely not what was meant.
    pub warnings: Vec<String>,
}

impl HamiEnv {
    /// Reads HAMi's variables from `vars` (other keys are ignored); the first invalid one is an
    /// error line naming it.
    pub fn from_vars(vars: &HashMap<String, String>) -> Result<HamiEnv, String> {
        let mut h = HamiEnv::default();
        let get = |k: &str| vars.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
        // A memory limit that is set must say something: empty is not "no limit".
        let limit = |k: &str, v: &str, warnings: &mut Vec<String>| {
            if v.is_empty() {
                return Err(invalid(
                    k,
                    "",
                    "empty; expected a size (unset the variable for no limit)",
                ));
            }
            let b = parse_size_hami(v)
                .filter(|b| *b > 0)
                .ok_or_else(|| invalid(k, v, "expected a size like 4g, 1024m or a byte count"))?;
            if v.bytes().all(|c| c.is_ascii_digit()) && b < MIB {
                warnings.push(format!(
                    "libshare: warning: {k}={v} is {b} bytes (a bare number is bytes, as in \
                     HAMi-core); for MiB write {v}m"
                ));
            }
            Ok(b)
        };
        if let Some(v) = vars.get(MEMORY_LIMIT).map(|v| v.trim()) {
            let b = limit(MEMORY_LIMIT, v, &mut h.warnings)?;
            h.memory = [Some(b); MAX_DEVICES];
            h.memory_source = std::array::from_fn(|_| Some(format!("{MEMORY_LIMIT}={v}")));
        }
        for (i, k, v) in per_device(vars, MEMORY_LIMIT)? {
            h.memory[i] = Some(limit(k, v, &mut h.warnings)?);
            h.memory_source[i] = Some(format!("{k}={v}"));
            h.memory_explicit[i] = true;
        }
        if let Some(v) = get(SM_LIMIT) {
            h.sm = [sm_limit(SM_LIMIT, v)?; MAX_DEVICES];
        }
        for (i, k, v) in per_device(vars, SM_LIMIT)? {
            if !v.is_empty() {
                h.sm[i] = sm_limit(k, v)?;
            }
        }
        h.opportunistic = match get(TASK_PRIORITY) {
            None => None,
            Some("0") => Some(false),
            Some("1") => Some(true),
            Some(v) => {
                return Err(invalid(
                    TASK_PRIORITY,
                    v,
                    "expected 0 (high: production) or 1 (low: opportunistic)",
                ))
            }
        };
        // HAMi-core compares with "true"; anything else set is a typo here, not a silent "no".
        h.oversubscribe = match get(OVERSUBSCRIBE).map(|v| v.to_ascii_lowercase()) {
            None => None,
            Some(v) if v == "true" || v == "1" => Some(true),
            Some(v) if v == "false" || v == "0" => Some(false),
            Some(_) => {
                return Err(invalid(
                    OVERSUBSCRIBE,
                    get(OVERSUBSCRIBE).unwrap_or(""),
                    "expected true or false",
                ))
            }
        };
        h.shared_cache = match get(SHARED_CACHE) {
            None => None,
            Some(p) if p.starts_with('/') && !p.ends_with('/') => Some(p.into()),
            Some(p) => return Err(invalid(SHARED_CACHE, p, "expected an absolute file path")),
        };
        // Under HAMi (its device plugin set the cache path) an unset priority is HAMi-core's
        // default, 1 (low); elsewhere it says nothing.
        if h.shared_cache.is_some() && h.opportunistic.is_none() {
            h.opportunistic = Some(true);
        }
        Ok(h)
    }

    /// The compute limit a process applies (libshare has one per process): the smallest of its
    /// devices' (`count` devices), None if none is limited.
    pub fn sm_for(&self, count: usize) -> Option<u32> {
        self.sm[..count.clamp(1, MAX_DEVICES)]
            .iter()
            .flatten()
            .min()
            .copied()
    }

    /// Whether any variable of the contract said anything.
    pub fn any(&self) -> bool {
        self.memory.iter().any(Option::is_some)
            || self.sm.iter().any(Option::is_some)
            || self.opportunistic.is_some()
            || self.oversubscribe.is_some()
    }

    /// The settings a daemon adopts for the container (`--hami`): class, per-device quotas and
    /// compute shares (basis points), oversubscription.
    #[cfg(feature = "admin")]
    pub fn settings(&self) -> crate::admin::ContainerSettings {
        use crate::admin::{Class, ContainerSettings, DeviceSettings};
        let mut s = ContainerSettings {
            class: self.opportunistic.map(|o| {
                if o {
                    Class::Opportunistic
                } else {
                    Class::Production
                }
            }),
            oversubscribe: self.oversubscribe,
            ..Default::default()
        };
        for d in 0..MAX_DEVICES {
            let ds = DeviceSettings {
                memory: self.memory[d],
                compute: self.sm[d].map(|p| p * 100),
                weight: None,
            };
            if !ds.is_empty() {
                s.devices.insert(d.to_string(), ds);
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Result<HamiEnv, String> {
        HamiEnv::from_vars(
            &pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn what_hamis_device_plugin_and_webhook_set_is_read_as_hami_core_reads_it() {
        let h = env(&[
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "1024m"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "2g"),
            ("CUDA_DEVICE_SM_LIMIT", "30"),
            ("CUDA_DEVICE_SM_LIMIT_1", "50"),
            ("CUDA_TASK_PRIORITY", "1"),
            ("CUDA_OVERSUBSCRIBE", "true"),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/usr/local/vgpu/x.cache"),
        ])
        .unwrap();
        assert_eq!(h.memory[0], Some(1 << 30));
        assert_eq!(h.memory[1], Some(2 << 30));
        assert_eq!(h.memory[2], None);
        assert_eq!((h.sm[0], h.sm[1], h.sm[2]), (Some(30), Some(50), Some(30)));
        assert_eq!(h.sm_for(1), Some(30));
        assert_eq!(h.opportunistic, Some(true));
        assert_eq!(h.oversubscribe, Some(true));
        #[cfg(feature = "admin")]
        {
            let s = h.settings();
            assert_eq!(s.class, Some(crate::admin::Class::Opportunistic));
            assert_eq!(s.device(1).memory, Some(2 << 30));
            assert_eq!(s.device(1).compute, Some(5000));
        }
        assert_eq!(
            env(&[("CUDA_TASK_PRIORITY", "0")]).unwrap().opportunistic,
            Some(false)
        );
        assert!(!env(&[]).unwrap().any());
    }

    #[test]
    fn values_hami_core_would_ignore_are_one_line_naming_the_variable() {
        for (k, v) in [
            ("CUDA_DEVICE_SM_LIMIT", "150"),
            ("CUDA_DEVICE_SM_LIMIT_0", "-1"),
            ("CUDA_DEVICE_SM_LIMIT_16", "30"),
            ("CUDA_TASK_PRIORITY", "7"),
            ("CUDA_OVERSUBSCRIBE", "yes"),
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "lots"),
            ("CUDA_DEVICE_MEMORY_LIMIT_00", "1g"),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "relative.cache"),
        ] {
            let e = env(&[(k, v)]).unwrap_err();
            assert!(e.contains(k) && !e.contains('\n'), "{k}={v}: {e}");
        }
    }
}
