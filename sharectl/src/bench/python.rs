//! The PyTorch jobs S8 runs (`jobs/python/*.py`), embedded in `sharectl` so an installed binary
//! has them, and the Python that runs them.

use crate::platform::StateDir;
use anyhow::Context;
use std::path::{Path, PathBuf};

/// (file name, source) of every embedded job.
const SCRIPTS: [(&str, &str); 2] = [
    (
        "torch_infer.py",
        include_str!("../../../jobs/python/torch_infer.py"),
    ),
    (
        "torch_train.py",
        include_str!("../../../jobs/python/torch_train.py"),
    ),
];

/// The embedded jobs written into a private temporary directory (removed on drop).
pub struct Scripts(StateDir);

impl Scripts {
    pub fn write() -> anyhow::Result<Scripts> {
        let dir = StateDir::create()?;
        for (name, src) in SCRIPTS {
            let p = dir.path().join(name);
            std::fs::write(&p, src).with_context(|| format!("cannot write {}", p.display()))?;
        }
        Ok(Scripts(dir))
    }

    /// The path of the embedded job `name` (one of [`SCRIPTS`]).
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }
}

/// The Python S8 runs its jobs with: `--python`, else the PyTorch venv `scripts/fetch-cuda.sh`
/// installs (`$LIBSHARE_CACHE` or `~/.cache/libshare`, `torch-venv/bin/python`) when present,
/// else `python3` from `PATH`.
pub fn interpreter(chosen: Option<&Path>) -> PathBuf {
    if let Some(p) = chosen {
        return p.to_path_buf();
    }
    let cache = std::env::var_os("LIBSHARE_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/libshare")));
    cache
        .map(|c| c.join("torch-venv/bin/python"))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("python3"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_are_written_and_removed() {
        let s = Scripts::write().unwrap();
        let p = s.path("torch_infer.py");
        assert!(std::fs::read_to_string(&p)
            .unwrap()
            .contains("inference_mode"));
        drop(s);
        assert!(!p.exists());
    }

    #[test]
    fn chosen_interpreter_wins() {
        assert_eq!(
            interpreter(Some(Path::new("/x/py"))),
            PathBuf::from("/x/py")
        );
    }
}
