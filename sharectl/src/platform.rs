//! Where `sharectl demo` and `sharectl bench` run: a real GPU, or simgpu (its library directory and a fresh state dir),
//! and where the job binaries are.

use anyhow::{bail, Context};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where the jobs run: the options `demo` and `bench` share.
#[derive(clap::Args, Debug, Clone)]
pub struct PlatformArgs {
    /// Use simgpu even if a real GPU is present.
    #[arg(long)]
    pub sim: bool,

    /// simgpu's library directory (holding libcuda.so.1) [default: <target>/simgpu/lib next to
    /// the sharectl binary, created if missing].
    #[arg(long, value_name = "DIR")]
    pub simgpu_lib: Option<PathBuf>,

    /// Directory holding the simjob-* binaries [default: next to the sharectl binary].
    #[arg(long, value_name = "DIR")]
    pub jobs_dir: Option<PathBuf>,
}

impl PlatformArgs {
    /// The GPU these options select.
    pub fn gpu(&self) -> anyhow::Result<Gpu> {
        Gpu::select(self.sim, self.simgpu_lib.as_deref())
    }
}

/// The GPU the demo uses.
pub enum Gpu {
    /// A real NVIDIA GPU (`nvidia-smi -L` worked): the jobs use the system driver.
    Real { description: String },
    /// simgpu: the jobs find `libcuda.so.1` in `lib_dir`; `state` is a fresh simulated machine.
    Sim { lib_dir: PathBuf, state: StateDir },
}

impl Gpu {
    /// Chooses the GPU: a real one unless `force_sim` or none is present, else simgpu.
    pub fn select(force_sim: bool, simgpu_lib: Option<&Path>) -> anyhow::Result<Gpu> {
        if !force_sim {
            if let Some(description) = real_gpu() {
                return Ok(Gpu::Real { description });
            }
        }
        let lib_dir = match simgpu_lib {
            Some(dir) => {
                if !dir.join("libcuda.so.1").exists() {
                    bail!(
                        "--simgpu-lib {}: no libcuda.so.1 there (expected simgpu's lib dir, e.g. target/simgpu/lib)",
                        dir.display()
                    );
                }
                dir.canonicalize()
                    .with_context(|| format!("--simgpu-lib {}", dir.display()))?
            }
            None => default_simgpu_lib()?,
        };
        Ok(Gpu::Sim {
            lib_dir,
            state: StateDir::create()?,
        })
    }

    /// Environment the jobs need on this GPU.
    pub fn job_env(&self) -> Vec<(String, OsString)> {
        match self {
            Gpu::Real { .. } => Vec::new(),
            Gpu::Sim { lib_dir, state } => {
                let mut ld = OsString::from(lib_dir.as_os_str());
                if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|v| !v.is_empty()) {
                    ld.push(":");
                    ld.push(old);
                }
                vec![
                    ("LD_LIBRARY_PATH".into(), ld),
                    ("SIMGPU_STATE_DIR".into(), state.path().into()),
                ]
            }
        }
    }

    pub fn is_sim(&self) -> bool {
        matches!(self, Gpu::Sim { .. })
    }
}

/// The first line of `nvidia-smi -L` if it runs and lists a GPU.
fn real_gpu() -> Option<String> {
    let out = Command::new("nvidia-smi").arg("-L").output().ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("GPU "))
        .map(str::to_string)
}

/// The symlinks simgpu's lib dir holds, all pointing at the built cdylib.
const SIMGPU_LINKS: [&str; 3] = ["libcuda.so.1", "libcuda.so", "libnvidia-ml.so.1"];

/// `<target>/simgpu/lib` next to the running sharectl (`<target>/<profile>/sharectl`), created
/// if missing, with symlinks to `<target>/release/libcuda.so`.
fn default_simgpu_lib() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot locate the sharectl binary")?;
    let target = exe.parent().and_then(Path::parent).context(
        "cannot locate the target dir next to the sharectl binary (pass --simgpu-lib DIR)",
    )?;
    ensure_simgpu_lib(target)
}

/// Creates `<target>/simgpu/lib` with relative symlinks `../../release/libcuda.so`, leaving
/// existing entries alone. Fails if simgpu has not been built.
pub fn ensure_simgpu_lib(target: &Path) -> anyhow::Result<PathBuf> {
    let cdylib = target.join("release").join("libcuda.so");
    if !cdylib.exists() {
        bail!(
            "simgpu is not built: {} is missing (build it with `cargo build --release -p simgpu -p jobs -p sharectl`, or pass --simgpu-lib DIR)",
            cdylib.display()
        );
    }
    let lib = target.join("simgpu").join("lib");
    std::fs::create_dir_all(&lib).with_context(|| format!("cannot create {}", lib.display()))?;
    for name in SIMGPU_LINKS {
        let link = lib.join(name);
        if link.symlink_metadata().is_ok() {
            if !link.exists() {
                bail!(
                    "{} is a broken link (remove it, or pass --simgpu-lib DIR)",
                    link.display()
                );
            }
            continue;
        }
        match std::os::unix::fs::symlink("../../release/libcuda.so", &link) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(e).with_context(|| format!("cannot create {}", link.display()));
            }
        }
    }
    lib.canonicalize()
        .with_context(|| format!("cannot resolve {}", lib.display()))
}

/// A fresh temporary directory (removed on drop): the demo's `SIMGPU_STATE_DIR` (a simulated
/// machine of its own) and its `LIBSHARE_STATE_DIR` (containers of its own).
pub struct StateDir(PathBuf);

impl StateDir {
    pub fn create() -> anyhow::Result<StateDir> {
        let base = std::env::temp_dir();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        for i in 0..100u32 {
            let p = base.join(format!(
                "sharectl-{}-{:08x}",
                std::process::id(),
                nanos.wrapping_add(i)
            ));
            match std::fs::create_dir(&p) {
                Ok(()) => return Ok(StateDir(p)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e).with_context(|| format!("cannot create {}", p.display())),
            }
        }
        bail!("cannot create a temporary state dir in {}", base.display())
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for StateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The job binaries: in `dir` if given, else next to the running sharectl.
pub fn job_binary(dir: Option<&Path>, name: &str) -> anyhow::Result<PathBuf> {
    let dir = match dir {
        Some(d) => d.to_path_buf(),
        None => std::env::current_exe()
            .context("cannot locate the sharectl binary")?
            .parent()
            .context("cannot locate the sharectl binary's directory")?
            .to_path_buf(),
    };
    let p = dir.join(name);
    if !p.is_file() {
        bail!(
            "{name} not found in {} (build them with `cargo build --release -p simgpu -p jobs -p sharectl`, or pass --jobs-dir DIR)",
            dir.display()
        );
    }
    Ok(p)
}

/// Where the demo looks for the shim when `--shim` is not given: the host build next to sharectl
/// (`<target>/release/libshare.so`), then the shipped glibc-2.17 build (`<target>/dist/libshare.so`,
/// from scripts/build-shim.sh).
pub fn shim_candidates() -> anyhow::Result<Vec<PathBuf>> {
    let exe = std::env::current_exe().context("cannot locate the sharectl binary")?;
    let dir = exe
        .parent()
        .context("cannot locate the sharectl binary's directory")?;
    let mut v = vec![dir.join("libshare.so")];
    if let Some(target) = dir.parent() {
        v.push(target.join("dist").join("libshare.so"));
    }
    Ok(v)
}

/// The shim to preload: `explicit` (which must exist), else the first of [`shim_candidates`]
/// that exists, else None.
pub fn shim_library(explicit: Option<&Path>) -> anyhow::Result<Option<PathBuf>> {
    if let Some(p) = explicit {
        if !p.is_file() {
            bail!(
                "--shim {}: no such file (expected libshare.so)",
                p.display()
            );
        }
        return p
            .canonicalize()
            .map(Some)
            .with_context(|| format!("--shim {}", p.display()));
    }
    Ok(shim_candidates()?.into_iter().find(|p| p.is_file()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simgpu_lib_links() {
        let state = StateDir::create().unwrap();
        let target = state.path();
        // Not built yet: a clear error.
        let e = ensure_simgpu_lib(target).unwrap_err().to_string();
        assert!(e.contains("cargo build --release -p simgpu"), "{e}");
        // Built: the dir and its links appear, and resolve to the cdylib.
        std::fs::create_dir_all(target.join("release")).unwrap();
        std::fs::write(target.join("release/libcuda.so"), b"elf").unwrap();
        let lib = ensure_simgpu_lib(target).unwrap();
        for name in SIMGPU_LINKS {
            assert_eq!(std::fs::read(lib.join(name)).unwrap(), b"elf");
            assert_eq!(
                std::fs::read_link(lib.join(name)).unwrap(),
                Path::new("../../release/libcuda.so")
            );
        }
        // Idempotent.
        ensure_simgpu_lib(target).unwrap();
        let p = state.path().to_path_buf();
        drop(state);
        assert!(!p.exists());
    }

    #[test]
    fn explicit_shim_must_exist() {
        let e = shim_library(Some(Path::new("/nonexistent/libshare.so")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--shim"), "{e}");
        let c = shim_candidates().unwrap();
        assert!(c[0].ends_with("libshare.so") && c[1].ends_with("dist/libshare.so"));
    }

    #[test]
    fn missing_job_binary() {
        let e = job_binary(Some(Path::new("/nonexistent")), "simjob-train")
            .unwrap_err()
            .to_string();
        assert!(e.contains("-p jobs"), "{e}");
    }
}
