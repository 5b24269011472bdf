//! Issue 30, B1c and B7: the daemon's registration socket, as the runtime gives it to a
//! container (podman with libshare's CDI spec, a real daemon that does not trust the
//! environment, the container's quota set before it starts).
//!
//! - B1c: whatever the container does to the paths on the way to the socket (the image's
//!   `/run/libshare` a link, `chmod 777` at run time, `/run/libshare` renamed) or to the shim's
//!   variables (`LIBSHARE_SOCKET`, `LIBSHARE_STATE_DIR`, `LIBSHARE_CONTAINER_DIR` elsewhere),
//!   its job registers with the daemon and gets its container's quota: never container
//!   `default`, production, unlimited.
//! - B7: after a daemon restart, a running container's new processes register with the new
//!   daemon (its socket's directory is mounted, not the dead socket file).

use libshare_tests::containers::{quota_program, rootfs, unique, Held, Node, Podman, MIB};
use libshare_tests::{json_check, ok};
use std::path::Path;
use std::process::Stdio;
use std::time::Instant;

#[test]
fn a_container_cannot_make_its_jobs_skip_the_mounted_daemon() {
    let node = Node::start("8GiB", &[]);
    let dir = tempfile::tempdir().unwrap();
    let tools = [
        quota_program(),
        "/bin/mv".into(),
        "/bin/chmod".into(),
        "/bin/mkdir".into(),
    ];
    let tools: Vec<&Path> = tools.iter().map(|p| p.as_path()).collect();
    rootfs(dir.path(), &tools);
    let Some(plain) = Podman::new(dir.path()) else {
        return;
    };
    // The same image with /run/libshare a link (to a directory of the image).
    std::fs::create_dir_all(dir.path().join("var/elsewhere")).unwrap();
    std::os::unix::fs::symlink("../var/elsewhere", dir.path().join("run/libshare")).unwrap();
    let Some(linked) = Podman::new(dir.path()) else {
        return;
    };
    let (_spec, kind) = node.cdi_spec("sock");
    let device = format!("{kind}=0");
    let job = "exec /usr/bin/container_quota 1008";
    let variants: [(&str, &Podman, &[&str], String); 5] = [
        ("link", &linked, &[], job.into()),
        (
            "chmod",
            &plain,
            &[],
            format!("chmod 777 /run /run/libshare /dev/libshare; {job}"),
        ),
        (
            "moved",
            &plain,
            &[],
            format!("mv /run/libshare /run/moved; mv /dev/libshare /dev/moved; {job}"),
        ),
        (
            "socket-env",
            &plain,
            &["-e", "LIBSHARE_SOCKET=/tmp/none.sock"],
            job.into(),
        ),
        (
            "dir-env",
            &plain,
            &[
                "-e",
                "LIBSHARE_STATE_DIR=/tmp/own",
                "-e",
                "LIBSHARE_CONTAINER_DIR=/tmp/own/c",
            ],
            job.into(),
        ),
    ];
    let names: Vec<String> = variants.iter().map(|v| unique(v.0)).collect();
    let _rm = plain.removing(&names.iter().map(|n| n.as_str()).collect::<Vec<_>>());
    let mut ids = Vec::new();
    for ((what, podman, env, cmd), name) in variants.iter().zip(&names) {
        let out = podman
            .create(name, &device, env, &["/bin/sh", "-c", cmd])
            .output()
            .unwrap();
        let id = ok(&out).trim()[..12].to_string();
        // The operator's quota, set before the container starts.
        node.set(&id, "1GiB", "opportunistic");
        let t = Instant::now();
        // Its job sees the 1 GiB quota as the device, allocates up to it, is refused past it.
        let held = Held::start(podman.cmd(&["start", "-ai", name]), 1024 * MIB);
        eprintln!(
            "{what}: registered as {id}, quota held ({:.1?})",
            t.elapsed()
        );
        held.end();
        ids.push(id);
    }
    // Each registered as its own container, none as `default` or with a quota of its own.
    let status = ok(&node.sharectl(&["status", "--json"]).output().unwrap());
    let doc: serde_json::Value = serde_json::from_str(&status).unwrap();
    let listed: Vec<&str> = doc["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["container"].as_str().unwrap())
        .collect();
    for id in &ids {
        assert!(
            listed.contains(&id.as_str()),
            "{id} not registered: {status}"
        );
    }
    assert_eq!(listed.len(), ids.len(), "nothing else registered: {status}");
}

#[test]
fn a_running_containers_new_processes_register_after_a_daemon_restart() {
    let mut node = Node::start("8GiB", &[]);
    let dir = tempfile::tempdir().unwrap();
    rootfs(dir.path(), &[&quota_program()]);
    let Some(podman) = Podman::new(dir.path()) else {
        return;
    };
    let (_spec, kind) = node.cdi_spec("restart");
    let name = unique("restart");
    let _rm = podman.removing(&[&name]);
    let out = podman
        .create(
            &name,
            &format!("{kind}=0"),
            &[],
            &["/usr/bin/container_quota", "496"],
        )
        .output()
        .unwrap();
    let id = ok(&out).trim()[..12].to_string();
    node.set(&id, "512MiB", "production");
    let held = Held::start(podman.cmd(&["start", "-ai", &name]), 512 * MIB);
    // A new process in the running container: it joins the container's state (16 MiB of the
    // 512 MiB quota left: 8 MiB fit, 32 MiB more do not). Its log says how long registering
    // took.
    let exec = |label: &str| {
        let t = Instant::now();
        let out = podman
            .cmd(&["exec", "-e", "LIBSHARE_LOG=debug", &name])
            .args(["/usr/bin/container_quota", "8"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let took = t.elapsed();
        let log = String::from_utf8_lossy(&out.stderr);
        let us = log
            .lines()
            .find(|l| l.contains("registered with the daemon"))
            .and_then(|l| l.split("us=").nth(1))
            .and_then(|v| v.split_whitespace().next().map(String::from))
            .unwrap_or_else(|| format!("? ({log})"));
        let mem = json_check(&out, "mem");
        assert_eq!(mem["result"], 0, "{label}: {mem}");
        assert_eq!(
            mem["total"],
            512 * MIB,
            "{label}: the container's quota: {mem}"
        );
        assert_eq!(
            mem["free"],
            16 * MIB,
            "{label}: the container's usage: {mem}"
        );
        assert_eq!(json_check(&out, "fill")["result"], 0, "{label}");
        assert_eq!(json_check(&out, "past")["result"], 2, "{label}");
        eprintln!("{label}: a new process registered in {us} us; podman exec took {took:.2?}");
    };
    exec("before a restart");
    for (how, signal) in [
        ("systemctl restart", libc::SIGTERM),
        ("crash", libc::SIGKILL),
    ] {
        let t = Instant::now();
        node.restart_daemon(signal);
        eprintln!("daemon restarted ({how}) in {:.2?}", t.elapsed());
        exec(&format!("after a restart ({how})"));
    }
    held.end();
}
