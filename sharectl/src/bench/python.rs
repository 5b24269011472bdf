//! The PyTorch jobs S8 runs (`jobs/python/*.py`), embedded in `sharectl` so an installed binary
//! has them, and the Python that runs them.

use crate::platform::StateDir;
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

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

/// How to get the PyTorch S8 needs: the venv [`interpreter`] looks for, or `--python`.
const TORCH_HINT: &str = "get it with `scripts/fetch-cuda.sh torch` (the pinned torch in a venv, \
     ~/.cache/libshare/torch-venv or $LIBSHARE_CACHE/torch-venv, where `sharectl bench` finds it) \
     or pass --python FILE";

/// Whether `python` can import torch: `Err` is one line saying why not (the last line Python
/// printed, never its traceback) and how to get it.
pub fn check_torch(python: &Path) -> Result<(), String> {
    let out = Command::new(python)
        .args(["-c", "import torch"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output();
    let why = match out {
        Ok(o) if o.status.success() => return Ok(()),
        Ok(o) => last_line(&String::from_utf8_lossy(&o.stderr))
            .unwrap_or_else(|| format!("import torch failed: {}", o.status)),
        Err(e) => format!("cannot run it: {e}"),
    };
    Err(format!(
        "{} cannot import torch ({why}); {TORCH_HINT}",
        python.display()
    ))
}

/// The last non-empty line of `text`, trimmed (a traceback's last line is the error itself).
fn last_line(text: &str) -> Option<String> {
    text.lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .map(String::from)
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

    /// A Python without torch: one line with the error and the way to get it, no traceback.
    #[test]
    fn no_torch_is_one_line_with_the_way_to_get_it() {
        let dir = StateDir::create().unwrap();
        let py = dir.path().join("python");
        std::fs::write(
            &py,
            "#!/bin/sh\n\
             echo 'Traceback (most recent call last):' >&2\n\
             echo '  File \"<string>\", line 1, in <module>' >&2\n\
             echo \"ModuleNotFoundError: No module named 'torch'\" >&2\n\
             exit 1\n",
        )
        .unwrap();
        std::fs::set_permissions(&py, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let e = check_torch(&py).unwrap_err();
        assert!(!e.contains('\n') && !e.contains("Traceback"), "{e}");
        assert!(
            e.contains("(ModuleNotFoundError: No module named 'torch')"),
            "{e}"
        );
        assert!(
            e.contains("scripts/fetch-cuda.sh torch") && e.contains("--python"),
            "{e}"
        );
        let e = check_torch(&dir.path().join("nowhere")).unwrap_err();
        assert!(
            e.contains("cannot run it") && e.contains("fetch-cuda.sh"),
            "{e}"
        );
        let ok = dir.path().join("python-with-torch");
        std::fs::write(&ok, "#!/bin/sh\nexit 0\n").unwrap();
        std::fs::set_permissions(&ok, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        assert_eq!(check_torch(&ok), Ok(()));
    }

    #[test]
    fn chosen_interpreter_wins() {
        assert_eq!(
            interpreter(Some(Path::new("/x/py"))),
            PathBuf::from("/x/py")
        );
    }
}
