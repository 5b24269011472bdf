//! `sharectl set`: a container's compute share, weight and class, written straight into its
//! state file (created if the container has not started yet, so the setting is in place before
//! its first launch). The admin socket of the node service will replace the direct write.

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use libshare_abi::{
    State, CLASS_OPPORTUNISTIC, CLASS_PRODUCTION, FLAG_DAEMON_MANAGED, MAX_DEVICES,
};
use std::path::PathBuf;
use std::sync::atomic::Ordering::{AcqRel, Release};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ClassArg {
    Production,
    Opportunistic,
}

/// Writes the state file directly (the admin socket comes with the node service).
#[derive(Args, Debug)]
pub struct SetArgs {
    /// The container's name (its directory under <state dir>/containers).
    pub container: String,
    /// State directory (default: $LIBSHARE_STATE_DIR, else /run/libshare, else
    /// /tmp/libshare-<uid>).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Only this GPU (default: every GPU).
    #[arg(long)]
    pub device: Option<usize>,
    /// Compute share of an opportunistic container: 30% or 30 (0 or 100% = no limit).
    #[arg(long, value_parser = parse_compute)]
    pub compute: Option<u32>,
    /// Weight among the opportunistic containers of a GPU (0 = 1).
    #[arg(long)]
    pub weight: Option<u32>,
    /// Class (overrides the container's LIBSHARE_CLASS from now on).
    #[arg(long, value_enum)]
    pub class: Option<ClassArg>,
}

/// `30%`, `30`, `12.5%` → basis points; 0 and 100 % mean no limit (0).
pub fn parse_compute(s: &str) -> Result<u32, String> {
    let v: f64 = s
        .trim()
        .trim_end_matches('%')
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a percentage (e.g. 30% or 30)"))?;
    if !(0.0..=100.0).contains(&v) {
        return Err(format!("{s:?}: a compute share is between 0% and 100%"));
    }
    let bp = (v * 100.0).round() as u32;
    Ok(if bp >= 10_000 { 0 } else { bp })
}

fn valid_name(n: &str) -> bool {
    !n.is_empty() && n != "." && n != ".." && !n.contains('/') && !n.contains('\0')
}

pub fn run(a: SetArgs) -> Result<()> {
    if !valid_name(&a.container) {
        bail!(
            "{:?} is not a container name (no '/', not '.' or '..')",
            a.container
        );
    }
    if a.compute.is_none() && a.weight.is_none() && a.class.is_none() {
        bail!("nothing to set: give --compute, --weight or --class");
    }
    let devices = match a.device {
        Some(d) if d >= MAX_DEVICES => bail!("--device {d}: devices are 0..{}", MAX_DEVICES - 1),
        Some(d) => d..d + 1,
        None => 0..MAX_DEVICES,
    };
    let dir = libshare_abi::container_dir(&super::state_dir(a.state_dir), &a.container);
    let st = State::open_or_create(&dir).with_context(|| format!("container {}", a.container))?;
    for d in devices {
        let dev = st.device(d);
        if let Some(bp) = a.compute {
            dev.compute.store(bp, Release);
        }
        if let Some(w) = a.weight {
            dev.weight.store(w, Release);
        }
    }
    if let Some(c) = a.class {
        let h = st.header();
        h.class.store(
            match c {
                ClassArg::Production => CLASS_PRODUCTION,
                ClassArg::Opportunistic => CLASS_OPPORTUNISTIC,
            },
            Release,
        );
        // The class comes from here now, not from the jobs' environment.
        h.flags.fetch_or(FLAG_DAEMON_MANAGED, AcqRel);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compute_takes_percent_and_maps_full_to_none() {
        assert_eq!(parse_compute("30%"), Ok(3_000));
        assert_eq!(parse_compute("30"), Ok(3_000));
        assert_eq!(parse_compute("12.5%"), Ok(1_250));
        assert_eq!(parse_compute("0"), Ok(0));
        assert_eq!(parse_compute("100%"), Ok(0));
        assert!(parse_compute("101%").is_err());
        assert!(parse_compute("-1").is_err());
        assert!(parse_compute("lots").is_err());
    }
}
