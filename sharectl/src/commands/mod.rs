//! The daemon and admin commands: each an `Args` struct and one `run` over `libshare-node` or
//! `libshare-abi`.

pub mod daemon;
pub mod health;
pub mod set;

use std::path::PathBuf;

/// The state directory a command uses: `--state-dir`, else `$LIBSHARE_STATE_DIR`, else the
/// shim's default (the same rule as the shim's, so both find the same files).
pub fn state_dir(arg: Option<PathBuf>) -> PathBuf {
    arg.or_else(|| std::env::var_os("LIBSHARE_STATE_DIR").map(PathBuf::from))
        .unwrap_or_else(libshare_abi::default_state_dir)
}
