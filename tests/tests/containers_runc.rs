//! Containers through the OCI hook with plain runc (issue 21, must-show 2): `sharectl hook` in
//! the bundle's `createRuntime` hooks injects libshare; the daemon names each container from its
//! cgroup under an operator prefix (`--cgroup-prefix`: plain runc has no layout of its own).

use libshare_tests::containers::{hook_entry, quota_program, rootfs, Held, Node, Runc, MIB, PROBE};
use libshare_tests::ok;

#[test]
fn two_runc_containers_with_the_hook_get_their_own_quota_and_class() {
    let Some(runc) = Runc::new() else {
        return;
    };
    let node = Node::start("8GiB", &["--cgroup-prefix", &runc.cgroup_prefix]);
    let dir = tempfile::tempdir().unwrap();
    rootfs(dir.path(), &[&quota_program()]);
    let hook = hook_entry(&node.inject_args());
    let mut held = Vec::new();
    for (name, quota, class) in [
        ("prod", 1024 * MIB, "production"),
        ("opp", 512 * MIB, "opportunistic"),
    ] {
        let b = runc.bundle(name, dir.path(), |c| {
            c["process"]["args"] =
                serde_json::json!(["/usr/bin/container_quota", (quota / MIB - 16).to_string()]);
            c["hooks"] = serde_json::json!({ "createRuntime": [hook.clone()] });
        });
        node.set(name, &format!("{}MiB", quota / MIB), class);
        held.push(Held::start(
            runc.run(&b, &format!("{name}-{}", std::process::id())),
            quota,
        ));
    }
    node.assert_status(&[
        ("prod", "production", 1024 * MIB),
        ("opp", "opportunistic", 512 * MIB),
    ]);
    for h in held {
        h.end();
    }
    // Without the hook: nothing injected.
    let b = runc.bundle("plain", dir.path(), |c| {
        c["process"]["args"] = serde_json::json!(["/bin/sh", "-c", PROBE]);
    });
    let out = runc
        .run(&b, &format!("plain-{}", std::process::id()))
        .output()
        .unwrap();
    assert_eq!(ok(&out).trim(), "NOT-INJECTED");
}
