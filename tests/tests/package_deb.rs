//! The Debian package (issue 21, must-show 4): `packaging/build-deb.sh` builds it with cargo-deb;
//! it installs into a clean Debian 12 root (debootstrap, cached; `dpkg -i` in a chroot), its
//! files are where the unit and the CDI spec expect them, `systemd-analyze verify` accepts the
//! unit, the installed daemon started as the unit starts it answers `sharectl status`, and a
//! purge leaves no preload line pointing at the removed shim.
//!
//! simgpu plays the node's driver in the root (its library as `libnvidia-ml.so.1`), so the
//! package's postinst writes a real CDI spec.

use libshare_tests::containers::have;
use libshare_tests::{artifacts, debian, ok, until, workspace_root};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// `chroot ROOT ARGS` with /proc mounted there, in a mount namespace of its own (the mount goes
/// with it).
fn chroot(root: &Path, args: &[&str]) -> Command {
    let mut c = Command::new("unshare");
    c.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg("mount -t proc proc \"$0/proc\" && exec chroot \"$0\" \"$@\"")
        .arg(root)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("SIMGPU_STATE_DIR", "/tmp/simgpu")
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null());
    c
}

#[test]
fn the_package_installs_into_debian_12_runs_its_daemon_and_purges_cleanly() {
    if !have("debootstrap") || !have("systemd-analyze") {
        return;
    }
    let out = Command::new(workspace_root().join("packaging/build-deb.sh"))
        .output()
        .unwrap();
    let deb = workspace_root().join(ok(&out).trim());
    let cached = debian::root("bookworm");
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let st = Command::new("cp")
        .arg("-a")
        .arg(&cached)
        .arg(&root)
        .status()
        .unwrap();
    assert!(st.success());
    std::fs::copy(&deb, root.join("tmp/libshare.deb")).unwrap();
    // The node's "driver": simgpu's NVML.
    std::fs::copy(
        &artifacts().libcuda,
        root.join("usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"),
    )
    .unwrap();
    std::fs::create_dir_all(root.join("tmp/simgpu")).unwrap();

    let out = chroot(&root, &["dpkg", "-i", "/tmp/libshare.deb"])
        .output()
        .unwrap();
    ok(&out);
    for f in [
        "usr/bin/sharectl",
        "usr/lib/libshare/libshare.so",
        "lib/systemd/system/libshare.service",
        "usr/share/containers/oci/hooks.d/libshare.json",
    ] {
        assert!(root.join(f).is_file(), "{f} not installed");
    }
    assert_eq!(
        std::fs::read_to_string(root.join("usr/lib/libshare/ld.so.preload")).unwrap(),
        "/usr/lib/libshare/libshare.so\n"
    );
    // postinst wrote the CDI spec the unit rewrites at each start, naming the installed files.
    let spec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("run/cdi/libshare.json")).unwrap())
            .unwrap();
    assert_eq!(spec["kind"], "libshare.dev/gpu");
    let mounts = spec["containerEdits"]["mounts"].to_string();
    for f in [
        "/usr/lib/libshare/libshare.so",
        "/usr/lib/libshare/ld.so.preload",
        "/run/libshare/register",
    ] {
        assert!(mounts.contains(f), "{f} not in the spec: {mounts}");
        let inside = root.join(f.trim_start_matches('/'));
        assert!(
            f.starts_with("/run/") || inside.is_file(),
            "{f} named by the spec but not installed"
        );
    }
    let hooks = serde_json::from_str::<serde_json::Value>(
        &std::fs::read_to_string(root.join("usr/share/containers/oci/hooks.d/libshare.json"))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(hooks["hook"]["path"], "/usr/bin/sharectl");

    // The unit: systemd's own check, then its ExecStart as systemd would run it.
    let unit = root.join("lib/systemd/system/libshare.service");
    // Verified on the host (the minimal root has no systemd), where /usr/bin shows the
    // installed binaries too: an overlay, in a mount namespace of its own.
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg("mount -t overlay overlay -o \"lowerdir=/usr/bin:$0/usr/bin\" /usr/bin && exec systemd-analyze verify \"$1\"")
        .arg(&root)
        .arg(&unit)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "systemd-analyze verify: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&unit).unwrap();
    let exec = text
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .unwrap();
    for (d, mode) in [("var/lib/libshare", 0o700), ("run/libshare", 0o711)] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(root.join(d)).unwrap();
        std::fs::set_permissions(root.join(d), std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let argv: Vec<&str> = exec.split_whitespace().collect();
    let mut daemon = chroot(&root, &argv)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    // Its registration socket alone in the directory the CDI spec mounts into containers.
    let up = until(Duration::from_secs(10), || {
        root.join("run/libshare/admin.sock").exists()
            && root.join("run/libshare/register/register.sock").exists()
    });
    let set = chroot(
        &root,
        &[
            "sharectl",
            "set",
            "web",
            "--memory",
            "1GiB",
            "--state-dir",
            "/run/libshare",
        ],
    )
    .output()
    .unwrap();
    let status = chroot(
        &root,
        &["sharectl", "status", "--state-dir", "/run/libshare"],
    )
    .output()
    .unwrap();
    let _ = Command::new("kill")
        .args(["-TERM", &daemon.id().to_string()])
        .status();
    let exit = daemon.wait().unwrap();
    assert!(
        up.is_some(),
        "the installed daemon never opened its sockets"
    );
    ok(&set);
    let status = ok(&status);
    assert!(
        status.contains("CONTAINER") && status.contains("web") && status.contains("1 GiB"),
        "{status}"
    );
    assert!(exit.success(), "the daemon ended with {exit} on SIGTERM");

    // A host preloading the shim by hand, beside another library: purge keeps only the other.
    std::fs::write(
        root.join("etc/ld.so.preload"),
        "/usr/lib/other.so\n/usr/lib/libshare/libshare.so\n",
    )
    .unwrap();
    ok(&chroot(&root, &["dpkg", "--purge", "libshare"])
        .output()
        .unwrap());
    assert_eq!(
        std::fs::read_to_string(root.join("etc/ld.so.preload")).unwrap(),
        "/usr/lib/other.so\n"
    );
    for gone in [
        "usr/lib/libshare/libshare.so",
        "var/lib/libshare",
        "run/cdi/libshare.json",
        "usr/bin/sharectl",
    ] {
        assert!(!root.join(gone).exists(), "{gone} left after purge");
    }
    // Only the shim there: the file goes with it.
    ok(&chroot(&root, &["dpkg", "-i", "/tmp/libshare.deb"])
        .output()
        .unwrap());
    std::fs::write(
        root.join("etc/ld.so.preload"),
        "/usr/lib/libshare/libshare.so\n",
    )
    .unwrap();
    ok(&chroot(&root, &["dpkg", "--purge", "libshare"])
        .output()
        .unwrap());
    assert!(!root.join("etc/ld.so.preload").exists());
}
