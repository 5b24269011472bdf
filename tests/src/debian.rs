//! Debian root filesystems for tests, made once with `debootstrap --variant=minbase` and cached
//! under `$LIBSHARE_CACHE/<suite>-rootfs` (default `~/.cache/libshare`): Debian 11 (glibc 2.31)
//! for the shipped shim's baseline (`libshare/tests/glibc_baseline.rs`, the container edge
//! tests), Debian 12 for the package's install test. Needs root. `LIBSHARE_DEBIAN_MIRROR`
//! overrides the mirror.

use std::fs;
use std::io::Write as _;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// An exclusive `flock` on `path`, held until the returned file is dropped.
pub fn lock(path: &Path) -> fs::File {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    let f = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    // SAFETY: flock on a file descriptor we own.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(
        rc,
        0,
        "flock {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    f
}

/// A system tool, on PATH or in the usual directories.
pub fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn sh(cmd: &mut Command, what: &str) {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(out.status.success(), "{what}: {}", crate::describe(&out));
}

/// Unmounts whatever is mounted under `dir` (a debootstrap killed half-way can leave /proc or a
/// bind-mounted /dev there), so that removing it can never reach the host's files.
fn unmount_under(dir: &Path) {
    let prefix = format!("{}/", dir.display());
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<&str> = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(&prefix))
        .collect();
    points.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in points {
        let _ = Command::new("umount").arg("-l").arg(m).status();
    }
}

/// The cached root of Debian `suite` (made by debootstrap the first time).
pub fn root(suite: &str) -> PathBuf {
    let cache = crate::cuda_cache();
    let dir = cache.join(format!("{suite}-rootfs"));
    let done = dir.join(".libshare-rootfs-complete");
    let _guard = lock(&cache.join(format!("{suite}-rootfs.lock")));
    if done.exists() {
        return dir;
    }
    let debootstrap = find_tool("debootstrap").unwrap_or_else(|| {
        println!("installing debootstrap with apt-get");
        sh(
            Command::new("apt-get").args(["update", "-qq"]),
            "apt-get update",
        );
        sh(
            Command::new("apt-get")
                .args(["install", "-y", "-qq", "debootstrap"])
                .env("DEBIAN_FRONTEND", "noninteractive"),
            "apt-get install debootstrap",
        );
        find_tool("debootstrap").expect("debootstrap installed")
    });
    let mirror = std::env::var("LIBSHARE_DEBIAN_MIRROR")
        .unwrap_or_else(|_| "http://deb.debian.org/debian".to_string());
    let partial = cache.join(format!("{suite}-rootfs.partial"));
    for d in [&partial, &dir] {
        if d.exists() {
            unmount_under(d);
            sh(
                Command::new("rm")
                    .arg("-rf")
                    .arg("--one-file-system")
                    .arg(d),
                "remove an incomplete root",
            );
        }
    }
    println!(
        "creating a Debian {suite} root in {} (once; cached)",
        dir.display()
    );
    let t0 = Instant::now();
    let out = Command::new(&debootstrap)
        .args(["--variant=minbase", suite])
        .arg(&partial)
        .arg(&mirror)
        .stdin(Stdio::null())
        .output()
        .expect("run debootstrap");
    if !out.status.success() {
        unmount_under(&partial);
        panic!("debootstrap: {}", crate::describe(&out));
    }
    unmount_under(&partial);
    println!("debootstrap took {:.0} s", t0.elapsed().as_secs_f64());
    fs::rename(&partial, &dir).unwrap();
    fs::File::create(&done)
        .and_then(|mut f| {
            f.write_all(format!("debootstrap --variant=minbase {suite}\n").as_bytes())
        })
        .unwrap();
    dir
}
