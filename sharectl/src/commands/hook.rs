//! `sharectl hook`: the OCI hook ([`crate::containers::hook`]) run by a runtime with the
//! container's state on stdin, or, with `--print-hooks-d`, the podman/CRI-O entry that runs it.

use crate::containers::hook::{hooks_d, Hook};
use crate::containers::inject::InjectArgs;
use crate::containers::oci::{parse_state, MAX_INPUT};
use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use std::io::Read;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Stage {
    /// Make the edits (the container's mounts exist, its root is not pivoted yet).
    #[value(name = "createRuntime")]
    CreateRuntime,
    /// Remove the container's per-container files.
    #[value(name = "poststop")]
    Poststop,
}

#[derive(Args, Debug)]
pub struct HookArgs {
    #[command(flatten)]
    pub inject: InjectArgs,
    /// The OCI stage this hook is registered for (default: from the state's status: "stopped"
    /// is poststop, anything else createRuntime).
    #[arg(value_enum)]
    pub stage: Option<Stage>,
    /// The runtime applied a CDI spec's mounts: only merge an image's own preload list, or take
    /// the preload away from a musl/static image.
    #[arg(long)]
    pub cdi: bool,
    /// The device plugin's allocation this container was given (its CDI spec passes it; else
    /// the container's libshare.dev/allocation annotation): its quota and the pod's class are
    /// set on the daemon for the container's id before it starts, and reset at poststop.
    #[arg(long, value_name = "NAME")]
    pub allocation: Option<String>,
    /// The DRA claim (its uid) this container was given (its CDI spec passes it): the quota,
    /// class and cap `sharectl dra-plugin` prepared for it are set on the daemon for the
    /// container's id before it starts, and reset at poststop.
    #[arg(long, value_name = "UID", conflicts_with = "allocation")]
    pub claim: Option<String>,
    /// Print the podman/CRI-O hooks.d JSON that runs this hook for containers annotated
    /// libshare.dev/gpu=…, instead of running it.
    #[arg(long, conflicts_with = "stage")]
    pub print_hooks_d: bool,
}

pub fn run(a: HookArgs) -> Result<()> {
    if a.print_hooks_d {
        println!("{}", serde_json::to_string_pretty(&hooks_d(&a.inject)?)?);
        return Ok(());
    }
    let mut text = String::new();
    std::io::stdin()
        .take(MAX_INPUT)
        .read_to_string(&mut text)
        .context("cannot read the container's state on stdin")?;
    let st = parse_state(&text)?;
    let hook = Hook {
        inject: &a.inject,
        cdi: a.cdi,
        allocation: a.allocation.as_deref(),
        claim: a.claim.as_deref(),
    };
    let stage = a.stage.unwrap_or(if st.stopped {
        Stage::Poststop
    } else {
        Stage::CreateRuntime
    });
    match stage {
        Stage::Poststop => {
            hook.poststop(&st);
            Ok(())
        }
        Stage::CreateRuntime => hook.create_runtime(&st),
    }
}
