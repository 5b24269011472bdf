//! Containers through CDI with real podman (issue 21, must-show 1): `sharectl cdi generate`
//! writes the spec, `podman run --device <kind>=0` injects libshare, the daemon names each
//! container from its cgroup (podman's `libpod-<id>`), `sharectl set <container id>` sets its
//! quota and class, and the cudart program inside sees the quota as the device.

use libshare_tests::containers::{
    quota_program, rootfs, unique, Held, Node, Podman, Removed, MIB, PROBE,
};
use libshare_tests::ok;

/// A node with a CDI spec of a kind private to this test in /etc/cdi (removed at the end).
fn cdi_node(podman_dir: &std::path::Path) -> Option<(Node, Podman, Removed, String)> {
    let node = Node::start("8GiB", &[]);
    rootfs(podman_dir, &[&quota_program()]);
    let podman = Podman::new(podman_dir)?;
    let (spec, kind) = node.cdi_spec("t");
    Some((node, podman, spec, kind))
}

/// `podman create` of the quota program with `device`, its full id.
fn create(podman: &Podman, name: &str, device: &str, mib: u64) -> String {
    let cmd = ["/usr/bin/container_quota", &mib.to_string()];
    ok(&podman.create(name, device, &[], &cmd).output().unwrap())
        .trim()
        .to_string()
}

#[test]
fn two_cdi_containers_get_their_own_quota_and_class_by_container_id() {
    let dir = tempfile::tempdir().unwrap();
    let Some((node, podman, _spec, kind)) = cdi_node(dir.path()) else {
        return;
    };
    let device = format!("{kind}=0");
    let (prod_name, opp_name) = (unique("prod"), unique("opp"));
    let prod = create(&podman, &prod_name, &device, 1024 - 16);
    let opp = create(&podman, &opp_name, &device, 512 - 16);
    let _cleanup = podman.removing(&[&prod_name, &opp_name]);
    let (prod_id, opp_id) = (&prod[..12], &opp[..12]);
    node.set(prod_id, "1GiB", "production");
    node.set(opp_id, "512MiB", "opportunistic");

    let p = Held::start(podman.cmd(&["start", "-ai", &prod_name]), 1024 * MIB);
    let o = Held::start(podman.cmd(&["start", "-ai", &opp_name]), 512 * MIB);
    node.assert_status(&[
        (prod_id, "production", 1024 * MIB),
        (opp_id, "opportunistic", 512 * MIB),
    ]);
    p.end();
    o.end();
    // At createRuntime the CDI spec's hook told the daemon each container's process, and the
    // daemon found it in that container's cgroup (else one line in the hook's log says why).
    let log = std::fs::read_to_string(node.state_dir().join("inject/hook.log")).unwrap_or_default();
    assert!(!log.contains("did not take its cgroup"), "{log}");
    eprintln!(
        "two podman containers through CDI: {prod_id} production 1 GiB, {opp_id} opportunistic 512 MiB"
    );
}

#[test]
fn only_containers_with_the_cdi_device_are_injected_and_see_only_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let Some((node, podman, _spec, kind)) = cdi_node(dir.path()) else {
        return;
    };
    let device = format!("{kind}=all");
    let with = podman.run(&["--device", &device], &["/bin/sh", "-c", PROBE]);
    assert_eq!(ok(&with).trim(), "INJECTED");
    let without = podman.run(&[], &["/bin/sh", "-c", PROBE]);
    assert_eq!(ok(&without).trim(), "NOT-INJECTED");
    let without = podman.run(
        &[],
        &[
            "/bin/sh",
            "-c",
            "for f in /etc/ld.so.preload /run/libshare /usr/lib/libshare; do [ -e $f ] && echo $f; done; true",
        ],
    );
    assert_eq!(
        ok(&without).trim(),
        "",
        "nothing injected without the device"
    );
    // What the container sees of the node: the socket, never admin.sock or any state.
    let list = podman.run(
        &["--device", &device],
        &[
            "/bin/sh",
            "-c",
            "for f in /run/libshare/* /usr/lib/libshare/*; do echo $f; done; while read -r l; do echo \"$l\"; done < /etc/ld.so.preload",
        ],
    );
    assert_eq!(
        ok(&list).trim(),
        "/run/libshare/register.sock\n/usr/lib/libshare/libshare.so\n/usr/lib/libshare/libshare.so"
    );
    // A GPU the node does not have: podman refuses the device, nothing runs.
    let missing = podman.run(
        &["--device", &format!("{kind}=7")],
        &["/bin/sh", "-c", "echo RAN"],
    );
    assert!(!missing.status.success());
    assert!(!String::from_utf8_lossy(&missing.stdout).contains("RAN"));
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(err.contains("unresolvable CDI devices"), "{err}");
    // And generating a spec for it is one line, nothing written.
    let out = node
        .sharectl(&[
            "cdi",
            "generate",
            "--kind",
            &kind,
            "--devices",
            "0,7",
            "--output",
            "/etc/cdi/never.json",
        ])
        .args(node.inject_args())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.trim().lines().count() == 1,
        "{err}"
    );
    assert!(err.contains("GPU 7 does not exist"), "{err}");
    assert!(!std::path::Path::new("/etc/cdi/never.json").exists());
    let spec: serde_json::Value = serde_json::from_str(&ok(&node
        .sharectl(&["cdi", "generate", "--kind", &kind])
        .args(node.inject_args())
        .output()
        .unwrap()))
    .unwrap();
    assert_eq!(spec["cdiVersion"], "0.5.0");
    let names: Vec<&str> = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["0", "all"], "one device per GPU and all");
}

#[test]
fn the_hooks_d_entry_injects_containers_annotated_for_a_shared_gpu() {
    let node = Node::start("8GiB", &[]);
    let dir = tempfile::tempdir().unwrap();
    rootfs(dir.path(), &[]);
    let Some(podman) = Podman::new(dir.path()) else {
        return;
    };
    let hooks = tempfile::tempdir().unwrap();
    let json = ok(&node
        .sharectl(&["hook", "--print-hooks-d"])
        .args(node.inject_args())
        .output()
        .unwrap());
    std::fs::write(hooks.path().join("libshare.json"), json).unwrap();
    let hooks_dir = hooks.path().display().to_string();
    let run = |annotation: &[&str]| {
        let mut c = podman.cmd(&[
            "--hooks-dir",
            &hooks_dir,
            "run",
            "--rm",
            "--network",
            "none",
        ]);
        c.args(annotation)
            .arg(&podman.image)
            .args(["/bin/sh", "-c", PROBE]);
        ok(&c.output().unwrap()).trim().to_string()
    };
    assert_eq!(run(&["--annotation", "libshare.dev/gpu=all"]), "INJECTED");
    assert_eq!(run(&[]), "NOT-INJECTED");
}
