//! The shipped shim needs no glibc newer than 2.17 and loads under an old glibc (issue 3, item 8).
//!
//! - `target/dist/libshare.so` is built by `scripts/build-shim.sh` (`cargo zigbuild`, glibc 2.17
//!   baseline); reused when newer than every input, rebuilt otherwise.
//! - `scripts/check-glibc.sh` must pass for 2.17.
//! - In a Debian 11 (bullseye, glibc 2.31) root made once with `debootstrap --variant=minbase` and
//!   cached under `$LIBSHARE_CACHE/bullseye-rootfs` (default `~/.cache/libshare`;
//!   `libshare_tests::debian`), the shim is
//!   preloaded into `/bin/true`, `/bin/sh` and `perl` (whose `dlsym` calls go through the shim's own
//!   `dlsym`, which finds the real one with `dlvsym` — `GLIBC_2.34` does not exist there).
//! - Negative control: the host build `target/release/libshare.so` (linked against the host's glibc)
//!   is checked the same way, and must fail to load there when it needs a newer glibc than 2.31.
//!
//! Needs root (debootstrap, chroot): without root the chroot test says SKIPPED and why.
//! `LIBSHARE_DEBIAN_MIRROR` overrides the Debian mirror.

use libshare_tests::debian::{self, find_tool, lock};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Instant, SystemTime};

const BASELINE: &str = "2.17";
const SUITE: &str = "bullseye";

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("libshare/ has a parent")
        .to_path_buf()
}

fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => workspace_root().join(dir),
        _ => workspace_root().join("target"),
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn describe(what: &str, out: &Output) -> String {
    format!(
        "{what}: {}\n--- stdout\n{}--- stderr\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    )
}

/// The newest modification time under `path` (directories walked, `target` skipped).
fn newest_mtime(path: &Path) -> SystemTime {
    let meta = fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut newest = meta.modified().unwrap();
    if meta.is_dir() {
        for e in fs::read_dir(path).unwrap() {
            let p = e.unwrap().path();
            if p.file_name().is_some_and(|n| n == "target") {
                continue;
            }
            newest = newest.max(newest_mtime(&p));
        }
    }
    newest
}

/// `target/dist/libshare.so`, rebuilt by `scripts/build-shim.sh` unless newer than all its inputs.
fn shipped_shim() -> PathBuf {
    let root = workspace_root();
    let dist = target_dir().join("dist/libshare.so");
    let _guard = lock(&target_dir().join("dist/.build-shim.lock"));
    let inputs = [
        "Cargo.toml",
        "Cargo.lock",
        "libshare",
        "libshare-abi",
        "shim-headers",
        "scripts/build-shim.sh",
        "scripts/check-glibc.sh",
    ];
    let newest_input = inputs
        .iter()
        .map(|p| root.join(p))
        .filter(|p| p.exists())
        .map(|p| newest_mtime(&p))
        .max()
        .unwrap();
    let fresh = fs::metadata(&dist)
        .and_then(|m| m.modified())
        .is_ok_and(|t| t > newest_input);
    if fresh {
        println!("using {} (newer than its sources)", dist.display());
    } else {
        println!(
            "{} is missing or older than its sources: running scripts/build-shim.sh",
            dist.display()
        );
        let t0 = Instant::now();
        let out = Command::new("bash")
            .arg(root.join("scripts/build-shim.sh"))
            .current_dir(&root)
            .stdin(Stdio::null())
            .output()
            .expect("run bash");
        print!("{}", text(&out.stdout));
        eprint!("{}", text(&out.stderr));
        assert!(
            out.status.success(),
            "scripts/build-shim.sh failed: {}",
            out.status
        );
        println!("build-shim.sh took {:.1} s", t0.elapsed().as_secs_f64());
    }
    assert!(dist.is_file(), "{} was not produced", dist.display());
    dist
}

/// "2.31" → [2, 31], for comparing versions.
fn version(v: &str) -> Vec<u32> {
    v.split('.').map(|p| p.parse().unwrap_or(0)).collect()
}

/// Runs `scripts/check-glibc.sh file max`: (passed, highest version needed, e.g. "2.17").
fn check_glibc(file: &Path, max: &str) -> (bool, String, Output) {
    let out = Command::new("bash")
        .arg(workspace_root().join("scripts/check-glibc.sh"))
        .arg(file)
        .arg(max)
        .stdin(Stdio::null())
        .output()
        .expect("run check-glibc.sh");
    let stdout = text(&out.stdout);
    let highest = stdout
        .split("highest GLIBC version needed: GLIBC_")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_else(|| panic!("{}", describe("check-glibc.sh printed no version", &out)))
        .to_string();
    match out.status.code() {
        Some(0) => (true, highest, out),
        Some(1) => (false, highest, out),
        _ => panic!("{}", describe("check-glibc.sh could not check", &out)),
    }
}

#[test]
fn shipped_shim_needs_no_glibc_newer_than_2_17() {
    let shim = shipped_shim();
    let (ok, highest, out) = check_glibc(&shim, BASELINE);
    print!("{}", text(&out.stdout));
    assert!(
        ok,
        "{}",
        describe("the shipped shim needs a glibc newer than 2.17", &out)
    );
    assert!(version(&highest) <= version(BASELINE));
}

/// Runs `argv` in `root` with a clean environment (as in a container) plus `env`.
fn in_chroot(root: &Path, env: &[&str], argv: &[&str]) -> Output {
    let chroot = find_tool("chroot").expect("chroot not found");
    Command::new(chroot)
        .arg(root)
        .args(["/usr/bin/env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"])
        .args(env)
        .args(argv)
        .stdin(Stdio::null())
        .output()
        .expect("run chroot")
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn shipped_shim_loads_under_debian_11_glibc_2_31() {
    if !is_root() {
        println!(
            "SKIPPED: shipped_shim_loads_under_debian_11_glibc_2_31 needs root (debootstrap and \
             chroot); run it as root, as CI does"
        );
        return;
    }
    let shim = shipped_shim();
    let root = debian::root(SUITE);

    let out = in_chroot(&root, &[], &["getconf", "GNU_LIBC_VERSION"]);
    assert!(
        out.status.success(),
        "{}",
        describe("getconf in the root", &out)
    );
    let old_glibc = text(&out.stdout)
        .trim()
        .trim_start_matches("glibc ")
        .to_string();
    println!("the {SUITE} root has glibc {old_glibc}");
    assert!(
        version(&old_glibc) < version("2.34"),
        "the root's glibc {old_glibc} is not older than the host's: the test would prove nothing"
    );

    fs::copy(&shim, root.join("libshare.so")).unwrap();
    let preload = ["LD_PRELOAD=/libshare.so"];

    // Loads, runs, prints nothing of its own.
    let out = in_chroot(&root, &preload, &["/bin/true"]);
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "{}",
        describe("LD_PRELOAD=/libshare.so /bin/true", &out)
    );
    let out = in_chroot(&root, &preload, &["/bin/sh", "-c", "echo ok"]);
    assert!(
        out.status.success() && out.stderr.is_empty() && out.stdout == b"ok\n",
        "{}",
        describe("LD_PRELOAD=/libshare.so /bin/sh -c 'echo ok'", &out)
    );
    println!(
        "LD_PRELOAD=/libshare.so /bin/true and /bin/sh -c 'echo ok' under glibc {old_glibc}: ok"
    );

    // Really loaded (ld.so only warns and goes on when a preload cannot be opened).
    let out = in_chroot(
        &root,
        &["LD_PRELOAD=/libshare.so", "LD_DEBUG=files"],
        &["/bin/true"],
    );
    let log = text(&out.stderr);
    assert!(
        out.status.success() && log.contains("calling init: /libshare.so"),
        "{}",
        describe("LD_DEBUG=files: the shim was not initialised", &out)
    );

    // dlsym through the shim: perl's DynaLoader binds to the shim's dlsym, which must reach the
    // real one although GLIBC_2.34's dlsym does not exist in this glibc.
    let out = in_chroot(
        &root,
        &["LD_PRELOAD=/libshare.so", "LD_DEBUG=bindings"],
        &["perl", "-MPOSIX", "-e", "print POSIX::floor(2.5), qq(\\n)"],
    );
    let log = text(&out.stderr);
    assert!(
        out.status.success() && out.stdout == b"2\n",
        "{}",
        describe("perl -MPOSIX under the shim", &out)
    );
    assert!(
        log.contains("to /libshare.so [0]: normal symbol `dlsym'"),
        "perl's dlsym did not bind to the shim:\n{}",
        log.lines()
            .filter(|l| l.contains("dlsym"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(!log.contains("not found"), "{log}");
    println!("perl -MPOSIX (dlsym through the shim's dlsym) under glibc {old_glibc}: ok");

    // Negative control: the host build.
    let host = target_dir().join("release/libshare.so");
    if !host.is_file() {
        println!(
            "negative control not run: no host build at {} (cargo build --release -p libshare)",
            host.display()
        );
        return;
    }
    let (host_ok, host_highest, _) = check_glibc(&host, BASELINE);
    fs::copy(&host, root.join("libshare-host.so")).unwrap();
    let out = in_chroot(&root, &["LD_PRELOAD=/libshare-host.so"], &["/bin/true"]);
    let err = text(&out.stderr);
    let loads = out.status.success() && err.is_empty();
    println!(
        "negative control: the host build {} needs GLIBC_{host_highest} (check-glibc {}); under glibc \
         {old_glibc} it {}",
        host.display(),
        if host_ok { "passes for 2.17" } else { "fails for 2.17" },
        if loads {
            "loads".to_string()
        } else {
            format!("fails: {}", err.trim().lines().collect::<Vec<_>>().join(" | "))
        }
    );
    if version(&host_highest) > version(&old_glibc) {
        assert!(
            !out.status.success() && err.contains("version `GLIBC_") && err.contains("not found"),
            "{}",
            describe(
                "the host build needs a newer glibc yet was not refused",
                &out
            )
        );
    } else {
        assert!(
            loads,
            "{}",
            describe("the host build should load here", &out)
        );
    }
}
