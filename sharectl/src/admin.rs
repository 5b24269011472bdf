//! The daemon's admin socket as a client (`<state dir>/admin.sock`, root only): one request and
//! its answer, and the words of a request on a command line (memory, compute share, class) that
//! `set`, the Kubernetes plugins and the containers' bind all read the same way.

use anyhow::{anyhow, Result};
use libshare_abi::admin::{ContainerReport, Request, Response};
use libshare_abi::Class;
use std::path::Path;
use std::time::Duration;

/// `--class`: the names of [`Class`] (clap lists them in `--help`).
pub(crate) fn class_parser() -> impl clap::builder::TypedValueParser<Value = Class> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(
        [Class::Production, Class::Opportunistic].map(Class::name),
    )
    .map(|name| Class::from_name(&name).expect("one of the possible values"))
}

/// `8GiB`, `512MiB`, `8Gi`, `1073741824` → bytes (above 0).
pub fn parse_memory(s: &str) -> Result<u64, String> {
    libshare_abi::units::parse_size(s)
        .filter(|v| *v > 0)
        .ok_or_else(|| format!("{s:?} is not a memory size (e.g. 8GiB, 512MiB)"))
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

/// One request to the daemon of `state_dir`; its report, or its one-line error.
pub(crate) fn ask(state_dir: &Path, req: &Request) -> Result<ContainerReport> {
    let sock = state_dir.join("admin.sock");
    let (body, _) = libshare_abi::wire::call(&sock, &req.encode(), Duration::from_secs(5))
        .map_err(|e| match e {
            libshare_abi::wire::WireError::Connect { err, .. }
                if err.kind() == std::io::ErrorKind::PermissionDenied =>
            {
                anyhow!("not allowed: {} is root's (run as root)", sock.display())
            }
            e => anyhow!("{e} (or pass --offline to write the state file directly)"),
        })?;
    match Response::decode(&body).map_err(|e| anyhow!(e))? {
        Response::Ok { report } => Ok(report),
        Response::Error { message } => Err(anyhow!(message)),
    }
}

/// At a container's createRuntime: tells the daemon of `state_dir` that process `pid` is
/// container `id`'s, so the driver's limits go on its cgroup before its first process runs.
/// The line to log when that did not happen (no daemon, or the daemon's reason); the container
/// starts either way (its limits then come with its first registration, as before).
pub(crate) fn started(state_dir: &Path, id: &str, pid: i32) -> Option<String> {
    let req = Request::Started {
        container: id.to_string(),
        pid: pid as u32,
    };
    ask(state_dir, &req).err().map(|e| {
        format!("container {id}: the daemon did not take its cgroup at createRuntime: {e}")
    })
}
