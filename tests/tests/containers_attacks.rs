//! What a container cannot do (issue 21, must-show 5) and bad input to the injection commands
//! (must-show 6).

use libshare_tests::containers::{
    hook_entry, quota_program, rootfs, unique, Held, Node, Podman, Removed, Runc, MIB,
};
use libshare_tests::{artifacts, ok};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Every path under `dir`, for a before/after comparison.
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        if let Ok(rd) = std::fs::read_dir(&d) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    todo.push(e.path());
                }
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}

/// Exactly one line on stderr, a failure, and nothing on stdout.
fn one_error_line(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert!(!out.status.success(), "succeeded: {err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(out.stdout.is_empty());
    err
}

#[test]
fn a_container_cannot_reach_the_admin_socket_other_state_or_another_identity() {
    let node = Node::start("8GiB", &[]);
    let dir = tempfile::tempdir().unwrap();
    rootfs(
        dir.path(),
        &[&quota_program(), Path::new("/usr/bin/unshare")],
    );
    let Some(podman) = Podman::new(dir.path()) else {
        return;
    };
    let (_spec, kind) = node.cdi_spec("a");
    let device = format!("{kind}=0");
    let names = [unique("victim"), unique("tenant")];
    let mut ids = Vec::new();
    for (name, claim) in names.iter().zip([None, Some(())]) {
        let prog = ["/usr/bin/container_quota", "496"];
        let c = match claim {
            None => podman.create(name, &device, &[], &prog),
            // The victim's name and a big limit in the environment, and its own user and cgroup
            // namespaces (where /proc/self/cgroup says "/").
            Some(()) => {
                let victim = format!("LIBSHARE_CONTAINER={}", ids[0]);
                let mut cmd = vec!["/usr/bin/unshare", "--user", "--map-root-user", "--cgroup"];
                cmd.extend(prog);
                podman.create(
                    name,
                    &device,
                    &[
                        "-e",
                        &victim,
                        "-e",
                        "LIBSHARE_MEMORY_LIMIT=4GiB",
                        "-e",
                        "CUDA_DEVICE_MEMORY_LIMIT=4g",
                    ],
                    &cmd,
                )
            }
        };
        let mut c = c;
        let id = ok(&c.output().unwrap()).trim()[..12].to_string();
        node.set(&id, "512MiB", "production");
        ids.push(id);
    }
    let guard = Removed(PathBuf::new());
    let victim = Held::start(podman.cmd(&["start", "-ai", &names[0]]), 512 * MIB);
    let tenant = Held::start(podman.cmd(&["start", "-ai", &names[1]]), 512 * MIB);
    node.assert_status(&[
        (&ids[0], "production", 512 * MIB),
        (&ids[1], "production", 512 * MIB),
    ]);
    victim.end();
    tenant.end();
    for n in &names {
        let _ = podman.cmd(&["rm", "-f", n]).output();
    }
    drop(guard);
    // What the container can see of the node: the registration socket only.
    let seen = podman.run(
        &["--device", &device],
        &[
            "/bin/sh",
            "-c",
            "for f in /run/* /run/*/* /run/*/*/* /dev/* /dev/*/* /dev/shm/*/* /usr/lib/libshare/*; do echo $f; done",
        ],
    );
    let seen = ok(&seen);
    for bad in ["admin.sock", "state.shm", "settings.toml", "containers"] {
        assert!(
            !seen.contains(bad),
            "{bad} visible in the container: {seen}"
        );
    }
    // The socket's directory holds the socket alone.
    let dir: Vec<&str> = seen
        .lines()
        .filter(|l| l.starts_with("/dev/libshare/"))
        .collect();
    assert_eq!(dir, ["/dev/libshare/register.sock"], "{seen}");
    let host_state = node.state_dir().display().to_string();
    let probe = format!("[ -e {host_state}/admin.sock ] && echo REACHED; echo done");
    assert_eq!(
        ok(&podman.run(&["--device", &device], &["/bin/sh", "-c", &probe])).trim(),
        "done"
    );
}

#[test]
fn bad_input_is_one_line_and_changes_nothing() {
    let Some(runc) = Runc::new() else {
        return;
    };
    let node = Node::start("8GiB", &["--cgroup-prefix", &runc.cgroup_prefix]);
    let before = tree(node.state.path());
    let sharectl = artifacts().bin("sharectl");
    let hook = |stdin: &str| {
        let mut c = Command::new(&sharectl)
            .arg("hook")
            .args(node.inject_args())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        c.wait_with_output().unwrap()
    };
    // Malformed state JSON, a state without pid, a bundle that is not one.
    let garbage = tempfile::tempdir().unwrap();
    std::fs::write(garbage.path().join("config.json"), "{\"root\": 7").unwrap();
    let me = std::process::id();
    for (stdin, says) in [
        ("{not json", "not JSON"),
        (r#"{"id":"x","status":"creating","bundle":"/tmp"}"#, "pid"),
        (
            &format!(r#"{{"id":"x","pid":{me},"bundle":"/nonexistent/bundle"}}"#),
            "cannot open the bundle",
        ),
        (
            &format!(
                r#"{{"id":"x","pid":{me},"bundle":"{}"}}"#,
                garbage.path().display()
            ),
            "not an OCI config",
        ),
    ] {
        let err = one_error_line(&hook(stdin));
        assert!(err.contains(says), "{stdin}: {err}");
    }
    // The wrapper: an unknown verb, a create without a bundle.
    let runtime = |args: &[&str]| {
        Command::new(&sharectl)
            .arg("runtime")
            .args(node.inject_args())
            .arg("--")
            .args(args)
            .output()
            .unwrap()
    };
    let err = one_error_line(&runtime(&["frobnicate", "x"]));
    assert!(err.contains("unknown runc command \"frobnicate\""), "{err}");
    let err = one_error_line(&runtime(&["create", "--bundle", "/nonexistent/b", "x"]));
    assert!(err.contains("cannot open the bundle"), "{err}");
    // Every other verb and flag goes to runc unchanged.
    let out = runtime(&["--version"]);
    assert!(ok(&out).contains("runc version"));
    let state = tempfile::tempdir().unwrap();
    let root = state.path().display().to_string();
    assert_eq!(
        ok(&runtime(&["--root", &root, "list", "-q"])).trim(),
        "",
        "list passes through"
    );
    assert_eq!(
        before,
        tree(node.state.path()),
        "nothing changed on the host"
    );

    // A hook that fails (here: no shim where it is told) stops the container: it never runs.
    let dir = tempfile::tempdir().unwrap();
    rootfs(dir.path(), &[]);
    let mut args = node.inject_args();
    args[1] = "/nonexistent/libshare.so".into();
    let b = runc.bundle("bad", dir.path(), |c| {
        c["process"]["args"] = serde_json::json!(["/bin/sh", "-c", "echo RAN"]);
        c["hooks"] = serde_json::json!({ "createRuntime": [hook_entry(&args)] });
    });
    let out = runc.run(&b, &unique("bad")).output().unwrap();
    assert!(!out.status.success());
    assert!(!String::from_utf8_lossy(&out.stdout).contains("RAN"));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("/nonexistent/libshare.so does not exist"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(ok(&runc.cmd(&["list", "-q"]).output().unwrap()).trim(), "");
    assert_eq!(
        before,
        tree(node.state.path()),
        "nothing changed on the host"
    );
}

/// A process of `pid`'s own in a private mount namespace (the hook's mounts land there and go
/// with it), ended when dropped.
struct MountNamespace(std::process::Child);

impl MountNamespace {
    fn new() -> MountNamespace {
        let child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sleep", "600"])
            .spawn()
            .unwrap();
        let ns = format!("/proc/{}/ns/mnt", child.id());
        let mine = std::fs::read_link("/proc/self/ns/mnt").unwrap();
        libshare_tests::until(std::time::Duration::from_secs(10), || {
            std::fs::read_link(&ns).is_ok_and(|l| l != mine)
        })
        .expect("unshare never entered its mount namespace");
        MountNamespace(child)
    }
}

impl Drop for MountNamespace {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Issue 30, B1a: the hook resolves a mount's path and creates its mount point inside the
/// container's root even while someone who can write the image (a volume shared with a running
/// container) swaps a directory on the path for a link to a host directory, as the audit did
/// (uid nobody, 40+ runs of `sharectl hook`): no file is ever created outside the root.
#[test]
fn the_hook_creates_nothing_outside_the_root_while_the_image_changes_under_it() {
    let node = Node::start("8GiB", &[]);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("rootfs");
    rootfs(&root, &[]);
    std::fs::write(
        dir.path().join("config.json"),
        serde_json::json!({"root": {"path": "rootfs"}, "process": {"user": {"uid": 0}}})
            .to_string(),
    )
    .unwrap();
    // The host directory the link aims at, and the image's /usr/lib, writable by nobody.
    let host = tempfile::tempdir().unwrap();
    let lib = root.join("usr/lib");
    std::fs::create_dir_all(lib.join("libshare")).unwrap();
    std::os::unix::fs::symlink(host.path(), lib.join("libshare.link")).unwrap();
    for p in [&lib, &lib.join("libshare"), &host.path().to_path_buf()] {
        ok(&Command::new("chown")
            .args(["-h", "nobody"])
            .arg(p)
            .output()
            .unwrap());
    }
    ok(&Command::new("chown")
        .args(["-h", "nobody"])
        .arg(lib.join("libshare.link"))
        .output()
        .unwrap());
    // uid nobody swaps /usr/lib/libshare (a directory) and a link to the host directory, as
    // fast as it can (renameat2 RENAME_EXCHANGE: one of them is always there).
    let flip = "import ctypes, os, sys\n\
                libc = ctypes.CDLL(None, use_errno=True)\n\
                a, b = sys.argv[1].encode(), sys.argv[2].encode()\n\
                while True:\n    libc.renameat2(-100, a, -100, b, 2)\n";
    let mut flipper = Command::new("setpriv")
        .args([
            "--reuid",
            "nobody",
            "--regid",
            "nogroup",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            flip,
        ])
        .arg(lib.join("libshare"))
        .arg(lib.join("libshare.link"))
        .spawn()
        .unwrap();
    let sharectl = artifacts().bin("sharectl");
    let (mut ran, mut refused) = (0, 0);
    // Runs that created something outside the root (removed after each, to count the next).
    let mut leaked = Vec::new();
    for i in 0..60 {
        let ns = MountNamespace::new();
        let state = serde_json::json!({
            "ociVersion": "1.0.2", "id": format!("flip{i}"), "status": "creating",
            "pid": ns.0.id(), "bundle": dir.path(),
        });
        let mut c = Command::new(&sharectl);
        c.arg("hook").args(node.inject_args());
        let out = libshare_tests::output_with_stdin(&mut c, state.to_string().as_bytes());
        ran += 1;
        if !out.status.success() {
            refused += 1;
        }
        let outside = tree(host.path());
        if !outside.is_empty() {
            leaked.push((i, outside.clone()));
            for p in outside {
                let _ = std::fs::remove_file(p);
            }
        }
    }
    assert!(
        flipper.try_wait().unwrap().is_none(),
        "the flipper stopped: the test did not test the race"
    );
    let _ = flipper.kill();
    let _ = flipper.wait();
    eprintln!(
        "{ran} hook runs, {refused} stopped the container, {} created files outside the root: {leaked:?}",
        leaked.len()
    );
    assert!(
        leaked.is_empty(),
        "{} of {ran} hook runs created files outside the container's root: {leaked:?}",
        leaked.len()
    );
    assert!(
        refused < ran,
        "the hook never succeeded: the test did not test it"
    );
}
