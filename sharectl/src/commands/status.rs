//! `sharectl status`: what every container on this node holds, read from the state files the shim
//! writes (`<state dir>/containers/<name>/state.shm`). Works with or without the daemon, needs only
//! read permission on those files, and only reads: each file is copied once
//! (`State::snapshot`: opened without following a symlink and without blocking, so a FIFO or a
//! link planted there is reported, never waited on or followed; a regular file only; a later
//! truncation cannot fault). A process is listed if it holds its slot's lock, the same rule the
//! shim uses; a dead process's memory is shown until a process of its container (or the daemon)
//! reclaims it.

use anyhow::{bail, Result};
use clap::Args;
use std::path::PathBuf;

use crate::node_view::{read_containers, render};

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// State directory (default: $LIBSHARE_STATE_DIR, else /run/libshare, else /tmp/libshare-<uid>).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// One JSON document instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: StatusArgs) -> Result<()> {
    let dir = super::state_dir(args.state_dir);
    let (containers, errors) = read_containers(&dir)?;
    let (out, err) = render(&dir, &containers, &errors, args.json);
    print!("{out}");
    for e in err {
        eprintln!("{e}");
    }
    if !errors.is_empty() {
        bail!("{} container state file(s) could not be read", errors.len());
    }
    Ok(())
}
