//! The daemon's errors: each displays as one line saying what is wrong and what to do.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("cannot read the state directory {}: {err} (create it, or pass --state-dir)", path.display())]
    StateDir { path: PathBuf, err: std::io::Error },
    #[error("the period must be between 100us and 1s, not {0}ns")]
    Period(u64),
    #[error("the time-slice quantum must be at least the period ({period}ns), not {quantum}ns")]
    Quantum { quantum: u64, period: u64 },
    #[error(transparent)]
    State(#[from] libshare_abi::StateError),
}
