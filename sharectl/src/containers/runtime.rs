//! What `sharectl runtime` does: an OCI runtime wrapper in the manner of nvidia-container-runtime, for
//! engines without CDI (Docker < 25 through `--add-runtime` / daemon.json `runtimes`,
//! containerd 1.6 through `--runc-binary`).
//!
//! `sharectl runtime [OPTIONS] -- <runc arguments>`: for `create` and `run`, when the bundle's
//! container asks for a shared GPU (`LIBSHARE_VISIBLE_DEVICES=all|<i>[,<j>]` in its environment
//! or the annotation `libshare.dev/gpu`), it adds `sharectl hook` (createRuntime and poststop)
//! to `<bundle>/config.json`, and `CUDA_VISIBLE_DEVICES` for a list of GPUs; then it execs runc
//! with every argument unchanged. Every other command goes to runc untouched. Without `--`, all
//! arguments are runc's and the options take their defaults.
//!
//! Errors (an unknown runc command, a bundle that is not one, the daemon's socket missing) are
//! one line and exit 1 before runc runs: the container is not created, as with runc's own
//! errors, and the bundle is left as it was.

use super::inject::{sharectl_exe, write_atomic, InjectArgs, ANNOTATION, ENV_DEVICES};
use super::oci::{read_config_json, Config};
use anyhow::{anyhow, bail, Context, Result};
use serde_json::json;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// runc's global options that take a value.
pub const GLOBAL_WITH_VALUE: [&str; 5] =
    ["--log", "--log-format", "--root", "--criu", "--rootless"];
/// runc 1.1's commands.
pub const VERBS: [&str; 18] = [
    "checkpoint",
    "create",
    "delete",
    "events",
    "exec",
    "features",
    "help",
    "init",
    "kill",
    "list",
    "pause",
    "ps",
    "restore",
    "resume",
    "run",
    "spec",
    "start",
    "state",
];

/// Where runc's command is: the first argument that is not a global option or its value.
pub fn verb_index(args: &[OsString]) -> Option<usize> {
    let mut i = 0;
    while i < args.len() {
        let a = args[i].to_string_lossy();
        if !a.starts_with('-') {
            return Some(i);
        }
        i += if GLOBAL_WITH_VALUE.contains(&a.as_ref()) {
            2
        } else {
            1
        };
    }
    None
}

/// The `--bundle`/`-b` of a create or run (default: the working directory).
pub fn bundle_of(args: &[OsString]) -> Result<PathBuf> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let s = a.to_string_lossy();
        if s == "--bundle" || s == "-b" {
            let b = it
                .next()
                .ok_or_else(|| anyhow!("{s} without a directory: nothing was run"))?;
            return Ok(PathBuf::from(b));
        }
        for pre in ["--bundle=", "-b="] {
            if let Some(b) = s.strip_prefix(pre) {
                return Ok(PathBuf::from(b));
            }
        }
    }
    std::env::current_dir().context("no --bundle and no working directory")
}

/// What the container asks for: its `LIBSHARE_VISIBLE_DEVICES`, else its annotation.
fn wanted(cfg: &Config) -> Option<String> {
    let prefix = format!("{ENV_DEVICES}=");
    let from_env = cfg
        .env()
        .iter()
        .filter_map(|e| e.strip_prefix(&prefix))
        .next_back()
        .map(String::from);
    let v = from_env.or_else(|| cfg.annotation(ANNOTATION).map(String::from))?;
    let v = v.trim().to_string();
    (!v.is_empty() && v != "none" && v != "void").then_some(v)
}

/// For a `create` or `run` of `bundle`: the hook added to its `config.json` (and
/// `CUDA_VISIBLE_DEVICES` for a list of GPUs) when the container asks for a shared GPU; every
/// other field of the config kept as it was.
pub fn edit_bundle(inj: &InjectArgs, bundle: &Path) -> Result<()> {
    let mut cfg = read_config_json(bundle)?;
    let Some(want) = wanted(&Config::of(&cfg, bundle)?) else {
        return Ok(());
    };
    if want != "all"
        && !want
            .split(',')
            .all(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
    {
        bail!("{ENV_DEVICES}={want}: expected all or GPU indices like 0,1; nothing was run");
    }
    inj.check(true)?;
    let exe = sharectl_exe()?;
    let hook = |stage: &str| {
        let mut args: Vec<String> = vec!["sharectl".into(), "hook".into()];
        args.extend(
            inj.to_args()
                .into_iter()
                .map(|s| s.to_string_lossy().into_owned()),
        );
        args.push(stage.into());
        json!({ "path": exe, "args": args })
    };
    let hooks = cfg
        .as_object_mut()
        .unwrap()
        .entry("hooks")
        .or_insert_with(|| json!({}));
    if !hooks.is_object() {
        bail!("{}/config.json: hooks is not an object", bundle.display());
    }
    for stage in ["createRuntime", "poststop"] {
        let list = hooks
            .as_object_mut()
            .unwrap()
            .entry(stage)
            .or_insert_with(|| json!([]));
        let Some(list) = list.as_array_mut() else {
            bail!(
                "{}/config.json: hooks.{stage} is not a list",
                bundle.display()
            );
        };
        list.push(hook(stage));
    }
    if want != "all" {
        if let Some(env) = cfg["process"]["env"].as_array_mut() {
            env.push(json!(format!("CUDA_VISIBLE_DEVICES={want}")));
        }
    }
    let path = bundle.join("config.json");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&path)?.permissions().mode() & 0o777;
    write_atomic(&path, serde_json::to_string(&cfg)?.as_bytes(), mode)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn the_verb_is_found_past_global_options() {
        let a = os(&[
            "--root",
            "/run/x",
            "--log",
            "/l",
            "--log-format=json",
            "--systemd-cgroup",
            "create",
            "--bundle",
            "/b",
            "id",
        ]);
        assert_eq!(verb_index(&a), Some(6));
        assert_eq!(bundle_of(&a[7..]).unwrap(), PathBuf::from("/b"));
        assert_eq!(
            bundle_of(&os(&["-b=/c", "id"])).unwrap(),
            PathBuf::from("/c")
        );
        assert_eq!(verb_index(&os(&["--version"])), None);
    }

    fn wanted(v: &serde_json::Value) -> Option<String> {
        super::wanted(&Config::of(v, Path::new("/b")).unwrap())
    }

    #[test]
    fn a_container_asks_by_env_or_annotation() {
        let c = json!({"process": {"env": ["A=1", "LIBSHARE_VISIBLE_DEVICES=0"]}});
        assert_eq!(wanted(&c).as_deref(), Some("0"));
        let c = json!({"process": {"env": []}, "annotations": {"libshare.dev/gpu": "all"}});
        assert_eq!(wanted(&c).as_deref(), Some("all"));
        let c = json!({"process": {"env": ["LIBSHARE_VISIBLE_DEVICES=void"]}});
        assert_eq!(wanted(&c), None);
        assert_eq!(wanted(&json!({})), None);
    }
}
