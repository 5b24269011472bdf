//! `sharectl health`: whether the daemon answers on its admin socket (a Kubernetes liveness or
//! readiness probe: exit 0 when it answers within the deadline, 1 with one line otherwise). Any
//! answer counts, even an error about the container asked for: the daemon's socket loop is up.

use anyhow::{anyhow, Result};
use clap::Args;
use libshare_abi::admin::Request;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args, Debug)]
pub struct HealthArgs {
    /// State directory (default: $LIBSHARE_STATE_DIR, else /run/libshare, else
    /// /tmp/libshare-<uid>).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
}

pub fn run(a: HealthArgs) -> Result<()> {
    let sock = super::state_dir(a.state_dir).join("admin.sock");
    let req = Request::Get {
        container: "host".into(),
    };
    libshare_abi::wire::call(&sock, &req.encode(), Duration::from_secs(5))
        .map_err(|e| anyhow!("the daemon does not answer: {e}"))?;
    println!("ok");
    Ok(())
}
