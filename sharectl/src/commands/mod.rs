//! Every subcommand: each an `Args` struct and one `run` over a library — `libshare-node` and
//! `libshare-abi` (the daemon, `set`/`get`/`reset`, `status`, `top`, `health`),
//! `crate::containers` and `libshare-k8s` (`cdi`, `hook`, `runtime`, `device-plugin`,
//! `dra-plugin`), or the command's own module (`bench`, `demo`, `gpu-check`).

pub mod bench;
pub mod cdi;
pub mod daemon;
pub mod demo;
pub mod device_plugin;
pub mod dra_plugin;
pub mod gpu_check;
pub mod health;
pub mod hook;
pub mod runtime;
pub mod set;
pub mod status;
pub mod top;

use std::path::PathBuf;

/// The state directory a command uses: `--state-dir`, else `$LIBSHARE_STATE_DIR`, else the
/// shim's default (the same rule as the shim's, so both find the same files).
pub fn state_dir(arg: Option<PathBuf>) -> PathBuf {
    arg.or_else(|| std::env::var_os("LIBSHARE_STATE_DIR").map(PathBuf::from))
        .unwrap_or_else(libshare_abi::default_state_dir)
}

/// A duration in seconds (`5`, `2.5`, `6s`) within `range` (each command's own: `demo`'s, `bench`'s).
pub fn parse_secs(s: &str, range: std::ops::RangeInclusive<f64>) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .trim_end_matches('s')
        .parse()
        .map_err(|_| format!("invalid duration '{s}': expected seconds, e.g. 5 or 2.5"))?;
    if !v.is_finite() || !range.contains(&v) {
        return Err(format!(
            "invalid duration '{s}': must be between {} and {} seconds",
            range.start(),
            range.end()
        ));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    #[test]
    fn secs_within_the_range() {
        let p = |s| super::parse_secs(s, 0.5..=3600.0);
        assert_eq!(p("5"), Ok(5.0));
        assert_eq!(p("2.5s"), Ok(2.5));
        assert!(p("0").is_err());
        assert!(p("-3").is_err());
        assert!(p("nan").is_err());
        assert!(p("1h").is_err());
        assert_eq!(
            super::parse_secs("1", 2.0..=600.0),
            Err("invalid duration '1': must be between 2 and 600 seconds".into())
        );
    }
}
