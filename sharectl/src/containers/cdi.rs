//! Container Device Interface specs: `sharectl cdi generate`'s for the node's GPUs (podman,
//! containerd ≥ 1.7, CRI-O, Docker ≥ 25 read it from `/etc/cdi` or `/var/run/cdi`).
//!
//! The spec is JSON (which every CDI consumer reads, YAML being a superset) at `cdiVersion`
//! 0.5.0: the lowest version covering what it uses (mounts, hooks, env), which is also the
//! highest that podman 4.3 accepts. Its edits are [`super::inject`]'s mounts, applied once for any
//! device of the spec, and `sharectl hook --cdi` (createRuntime) that merges an image's own
//! `/etc/ld.so.preload` and undoes the preload in a musl or static image (poststop: removes the
//! merged list). A device
//! per GPU (`<kind>=0`, `=1`, … selecting it with `CUDA_VISIBLE_DEVICES`) and `<kind>=all`.

use super::inject::{sharectl_exe, sim_state_in_container, InjectArgs};
use anyhow::Result;
use serde_json::{json, Value};

/// The version written: what podman 4.3 (CDI ≤ 0.5.0) and current consumers accept.
pub const CDI_VERSION: &str = "0.5.0";

/// A CDI kind (`vendor.domain/class`: letters, digits, '.', '-', '_').
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

/// The node's spec (`cdi generate`): a device per GPU of `devices` and `<kind>=all`.
pub fn spec(inj: &InjectArgs, kind: &str, devices: &[u32]) -> Result<Value> {
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
    spec_with(inj, kind, devs, &[])
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

/// A spec of `kind` with `devices`, every one of them getting [`super::inject`]'s mounts and the hook
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
