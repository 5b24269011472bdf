//! Containers through the runtime wrapper with Debian's dockerd (issue 21, must-show 2):
//! `sharectl runtime` is dockerd's runtime `libshare`; a container asking with
//! `LIBSHARE_VISIBLE_DEVICES` gets the hook, the daemon names it from docker's cgroup
//! (`/docker/<id>`), and `sharectl set <container id>` sets its quota and class.

use libshare_tests::containers::{quota_program, rootfs, unique, Dockerd, Held, Node, MIB, PROBE};
use libshare_tests::ok;
use std::process::Stdio;

#[test]
fn two_docker_containers_through_the_wrapper_get_their_own_quota_and_class() {
    let node = Node::start("8GiB", &[]);
    let Some(docker) = Dockerd::start(&node.inject_args()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    rootfs(dir.path(), &[&quota_program()]);
    let image = format!("localhost/{}:latest", unique("image"));
    docker.import(dir.path(), &image);
    let run = [
        "--runtime",
        "libshare",
        "--network",
        "none",
        "--pid",
        "host",
    ];
    let mut held = Vec::new();
    let mut want = Vec::new();
    for (quota, class) in [(1024 * MIB, "production"), (512 * MIB, "opportunistic")] {
        let out = docker
            .cmd(&["create", "-i", "-e", "LIBSHARE_VISIBLE_DEVICES=0"])
            .args(run)
            .arg(&image)
            .args(["/usr/bin/container_quota", &(quota / MIB - 16).to_string()])
            .output()
            .unwrap();
        let id = ok(&out).trim()[..12].to_string();
        node.set(&id, &format!("{}MiB", quota / MIB), class);
        held.push(Held::start(docker.cmd(&["start", "-ai", &id]), quota));
        want.push((id, class, quota));
    }
    let want: Vec<(&str, &str, u64)> = want.iter().map(|(i, c, q)| (i.as_str(), *c, *q)).collect();
    node.assert_status(&want);
    for h in held {
        h.end();
    }
    // The same runtime, a container that does not ask: nothing injected.
    let out = docker
        .cmd(&["run", "--rm"])
        .args(run)
        .arg(&image)
        .args(["/bin/sh", "-c", PROBE])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(ok(&out).trim(), "NOT-INJECTED");
    let _ = docker.cmd(&["container", "prune", "-f"]).output();
}
