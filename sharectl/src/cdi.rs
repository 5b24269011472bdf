//! `sharectl cdi generate`: a Container Device Interface spec for the node's GPUs (podman,
//! containerd ≥ 1.7, CRI-O, Docker ≥ 25 read it from `/etc/cdi` or `/var/run/cdi`).
//!
//! The spec is JSON (which every CDI consumer reads, YAML being a superset) at `cdiVersion`
//! 0.5.0: the lowest version covering what it uses (mounts, hooks, env), which is also the
//! highest that podman 4.3 accepts. Its edits are `inject.rs`'s mounts, applied once for any
//! device of the spec, and `sharectl hook --cdi` (createRuntime) that merges an image's own
//! `/etc/ld.so.preload` and undoes the preload in a musl or static image (poststop: removes the
//! merged list). A device
//! per GPU (`<kind>=0`, `=1`, … selecting it with `CUDA_VISIBLE_DEVICES`) and `<kind>=all`.

use crate::inject::{sharectl_exe, sim_state_in_container, write_atomic, InjectArgs};
use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use serde_json::{json, Value};
use std::path::PathBuf;

/// The version written: what podman 4.3 (CDI ≤ 0.5.0) and current consumers accept.
pub const CDI_VERSION: &str = "0.5.0";

#[derive(Subcommand, Debug)]
pub enum CdiCommand {
    /// Print (or write with --output) the CDI spec for this node's GPUs.
    Generate(GenerateArgs),
}

#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub inject: InjectArgs,
    /// The spec's kind (vendor/class): devices are requested as KIND=0, KIND=all.
    #[arg(long, default_value = "libshare.dev/gpu")]
    pub kind: String,
    /// Only these GPU indices (comma-separated; default: every GPU NVML reports).
    #[arg(long, value_delimiter = ',')]
    pub devices: Option<Vec<u32>>,
    /// Write the spec here (atomically; e.g. /etc/cdi/libshare.json) instead of stdout.
    #[arg(long, short, value_name = "PATH")]
    pub output: Option<PathBuf>,
}

pub fn run(cmd: CdiCommand) -> Result<()> {
    match cmd {
        CdiCommand::Generate(a) => generate(a),
    }
}

pub fn valid_kind(kind: &str) -> bool {
    let Some((vendor, class)) = kind.split_once('/') else {
        return false;
    };
    let label = |s: &str, extra: &[u8]| {
        !s.is_empty()
            && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || extra.contains(&b))
    };
    vendor.contains('.') && label(vendor, b".-") && label(class, b"_.-")
}

fn generate(a: GenerateArgs) -> Result<()> {
    if !valid_kind(&a.kind) {
        bail!(
            "--kind {}: expected vendor.domain/class (letters, digits, '.', '-', '_'), \
             e.g. libshare.dev/gpu",
            a.kind
        );
    }
    // The daemon may start later (package install): its socket is needed when a container
    // starts, where the runtime fails the mount without it.
    a.inject.check(false)?;
    let count = libshare_node::nvml::device_totals()
        .map_err(|e| anyhow::anyhow!("cannot count the node's GPUs: {e}"))?
        .len() as u32;
    let devices: Vec<u32> = match &a.devices {
        None => (0..count).collect(),
        Some(list) => {
            if let Some(bad) = list.iter().find(|&&i| i >= count) {
                bail!(
                    "GPU {bad} does not exist: this node has {count} GPU(s) (0..{}); nothing written",
                    count.saturating_sub(1)
                );
            }
            list.clone()
        }
    };
    if devices.is_empty() {
        bail!("this node has no GPU (NVML reports none): nothing to generate");
    }
    let spec = spec(&a, &devices)?;
    let text = serde_json::to_string_pretty(&spec)? + "\n";
    a.inject.ensure_preload_file()?;
    match &a.output {
        Some(path) => write_atomic(path, text.as_bytes(), 0o644),
        None => {
            print!("{text}");
            Ok(())
        }
    }
}

/// The spec's JSON.
pub fn spec(a: &GenerateArgs, devices: &[u32]) -> Result<Value> {
    let mut devs: Vec<Value> = devices
        .iter()
        .map(|i| {
            json!({
                "name": i.to_string(),
                "containerEdits": {
                    "env": [format!("CUDA_VISIBLE_DEVICES={i}"), format!("LIBSHARE_VISIBLE_DEVICES={i}")],
                },
            })
        })
        .collect();
    devs.push(json!({
        "name": "all",
        "containerEdits": { "env": ["LIBSHARE_VISIBLE_DEVICES=all"] },
    }));
    spec_with(&a.inject, &a.kind, devs, &[])
}

/// The spec of one Kubernetes allocation or claim: its one device `name` selects the node's GPUs
/// `visible` (`CUDA_VISIBLE_DEVICES`), and the hook gets `hook_flag name` (`--allocation`,
/// `--claim`) to bind it to the container; a spec that cannot be made is `{"error": …}`.
pub fn bound_spec(
    inj: &InjectArgs,
    kind: &str,
    name: &str,
    visible: &str,
    hook_flag: &str,
) -> Value {
    let device = json!({
        "name": name,
        "containerEdits": {
            "env": [
                format!("CUDA_VISIBLE_DEVICES={visible}"),
                format!("LIBSHARE_VISIBLE_DEVICES={visible}"),
            ],
        },
    });
    spec_with(inj, kind, vec![device], &[hook_flag.into(), name.into()])
        .unwrap_or_else(|e| json!({ "error": e.to_string() }))
}

/// A spec of `kind` with `devices`, every one of them getting `inject.rs`'s mounts and the hook
/// (`sharectl hook --cdi <inject args> <hook_args>`): `cdi generate`'s, and the device plugin's
/// one spec per allocation (`hook_args`: `--allocation NAME`).
pub fn spec_with(
    inj: &InjectArgs,
    kind: &str,
    devices: Vec<Value>,
    extra_hook_args: &[String],
) -> Result<Value> {
    let mounts: Vec<Value> = inj
        .mounts(&inj.preload_file, 0)
        .into_iter()
        .map(|m| {
            let mut options = vec!["bind", "nosuid", "nodev"];
            if m.readonly {
                options.push("ro");
            }
            json!({
                "hostPath": m.host,
                "containerPath": m.container,
                "options": options,
            })
        })
        .collect();
    let mut env: Vec<String> = Vec::new();
    if inj.simgpu_state.is_some() {
        // A container user other than root finds simgpu's state through this.
        env.push(format!("SIMGPU_STATE_DIR={}", sim_state_in_container(0)));
    }
    let exe = sharectl_exe()?;
    let mut hook_args: Vec<Value> = vec!["sharectl".into(), "hook".into(), "--cdi".into()];
    hook_args.extend(
        inj.to_args()
            .into_iter()
            .map(|s| Value::from(s.to_string_lossy().into_owned())),
    );
    hook_args.extend(extra_hook_args.iter().map(|s| Value::from(s.as_str())));
    let hooks: Vec<Value> = ["createRuntime", "poststop"]
        .iter()
        .map(|stage| json!({ "hookName": stage, "path": exe, "args": hook_args }))
        .collect();
    let mut edits = json!({
        "mounts": mounts,
        "hooks": hooks,
    });
    if !env.is_empty() {
        edits["env"] = json!(env);
    }
    Ok(json!({
        "cdiVersion": CDI_VERSION,
        "kind": kind,
        "devices": devices,
        "containerEdits": edits,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds() {
        assert!(valid_kind("libshare.dev/gpu"));
        assert!(valid_kind("t123.libshare.dev/gpu_x"));
        for bad in [
            "gpu",
            "libshare/gpu",
            "libshare.dev/",
            "/gpu",
            "a.b/c d",
            "-a.b/c",
        ] {
            assert!(!valid_kind(bad), "{bad}");
        }
    }
}
