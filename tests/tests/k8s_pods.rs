//! Pods allocated by libshare's device plugin through a fake kubelet, then started by real podman
//! with what `Allocate` returned (issue 22, must-shows 1 and 5): the CDI device, its env and
//! annotations, and the pod annotations a CRI runtime forwards. The quota is the allocation's,
//! bound on the host to the container id by the CDI device's hook — not what the pod's process
//! says — and the class is the pod's annotation, honoured only in the namespaces the plugin's
//! `--production-namespaces` allows (issue 32, must-show 3): elsewhere the pod is opportunistic
//! whatever it asks. A malformed annotation stops the container with one line and sets nothing.

use libshare_tests::containers::{quota_program, rootfs, unique, Held, Node, Podman, MIB};
use libshare_tests::kubelet::{check_allocate, FakeKubelet, PluginConn};
use libshare_tests::ok;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

/// `sharectl device-plugin` writing its CDI specs to /etc/cdi (podman 4.3 reads only there and
/// /var/run/cdi) under a kind private to this test; stopped, and its specs removed, when dropped.
struct Plugin {
    child: Child,
    kind: String,
}

impl Plugin {
    fn start(node: &Node, kl: &FakeKubelet) -> Plugin {
        let kind = format!("k{}.libshare.dev/gpu", std::process::id());
        let mut cmd = node.sharectl(&[
            "device-plugin",
            "--rescan",
            "1s",
            "--kind",
            &kind,
            "--production-namespaces",
            "inference",
        ]);
        cmd.arg("--plugin-dir")
            .arg(kl.dir())
            .args(["--cdi-dir", "/etc/cdi"])
            .args(node.inject_args())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        Plugin {
            child: cmd.spawn().expect("start sharectl device-plugin"),
            kind,
        }
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        // SAFETY: a signal to our own child, by its pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        let prefix = self.kind.replace('/', "_");
        for e in std::fs::read_dir("/etc/cdi")
            .into_iter()
            .flatten()
            .flatten()
        {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// `podman create` of one pod container with what `Allocate` answered (CDI devices, env,
/// annotations), the pod annotations the runtime forwards, and `extra` arguments.
fn create(
    podman: &Podman,
    name: &str,
    answer: &libshare_k8s::api::ContainerAllocateResponse,
    pod_annotations: &[(&str, &str)],
    extra: &[&str],
    cmd: &[&str],
) -> std::process::Output {
    let mut args: Vec<String> = Vec::new();
    for d in &answer.cdi_devices {
        args.extend(["--device".into(), d.name.clone()]);
    }
    for (k, v) in &answer.envs {
        args.extend(["--env".into(), format!("{k}={v}")]);
    }
    for (k, v) in answer
        .annotations
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .chain(pod_annotations.iter().copied())
    {
        args.extend(["--annotation".into(), format!("{k}={v}")]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut c = podman.cmd(&[
        "create",
        "-i",
        "--name",
        name,
        "--network",
        "none",
        "--pid",
        "host",
    ]);
    c.args(&a).arg(&podman.image).args(cmd);
    c.output().unwrap()
}

/// A node of `gib` GiB with podman (an image of `programs`), a fake kubelet and the plugin
/// registered with it; the kubelet's connection and the advertised shares. `None` after a SKIP.
struct Cluster {
    node: Node,
    podman: Podman,
    kl: FakeKubelet,
    _plugin: Plugin,
    _image: tempfile::TempDir,
}

fn cluster(gib: usize, programs: &[&Path]) -> Option<(Cluster, PluginConn, Vec<String>)> {
    let node = Node::start(&format!("{gib}GiB"), &[]);
    let image = tempfile::tempdir().unwrap();
    rootfs(image.path(), programs);
    let podman = Podman::new(image.path())?;
    let kl = FakeKubelet::start();
    let plugin = Plugin::start(&node, &kl);
    let reg = kl.registration(1, Duration::from_secs(20)).unwrap();
    let conn = kl.dial(&reg.endpoint);
    let all = conn
        .wait_list(Duration::from_secs(10), |l| l.len() == gib)
        .unwrap();
    let c = Cluster {
        node,
        podman,
        kl,
        _plugin: plugin,
        _image: image,
    };
    Some((c, conn, all))
}

#[test]
fn two_pods_allocated_by_the_plugin_share_the_gpu_with_their_quotas_and_classes() {
    let Some((c, mut conn, all)) = cluster(8, &[&quota_program()]) else {
        return;
    };
    let (node, podman, kl) = (&c.node, &c.podman, &c.kl);

    // Pod A (inference, production) asks for 2 shares, pod B (training, opportunistic) for 1.
    let a_ids = conn.preferred(kl, &all, &[], 2);
    let a = conn.allocate(kl, std::slice::from_ref(&a_ids)).unwrap();
    let rest: Vec<String> = all.iter().filter(|i| !a_ids.contains(i)).cloned().collect();
    let b_ids = conn.preferred(kl, &rest, &[], 1);
    let b = conn.allocate(kl, &[b_ids]).unwrap();
    check_allocate(&a, 1, Path::new("/etc/cdi"));
    check_allocate(&b, 1, Path::new("/etc/cdi"));

    let (a_name, b_name) = (unique("pod-a"), unique("pod-b"));
    let _cleanup = podman.removing(&[&a_name, &b_name]);
    // Pod A's process claims 40 GiB for itself: it still gets its allocation's 2 GiB.
    let a_id = ok(&create(
        podman,
        &a_name,
        &a.container_responses[0],
        &[
            ("libshare.dev/class", "production"),
            ("io.kubernetes.pod.namespace", "inference"),
        ],
        &[
            "--env",
            "LIBSHARE_MEMORY_LIMIT=40GiB",
            "--env",
            "LIBSHARE_CLASS=opportunistic",
        ],
        &["/usr/bin/container_quota", &(2048 - 16).to_string()],
    ))
    .trim()[..12]
        .to_string();
    let b_id = ok(&create(
        podman,
        &b_name,
        &b.container_responses[0],
        &[("libshare.dev/class", "opportunistic")],
        &[],
        &["/usr/bin/container_quota", &(1024 - 16).to_string()],
    ))
    .trim()[..12]
        .to_string();

    let pa = Held::start(podman.cmd(&["start", "-ai", &a_name]), 2048 * MIB);
    let pb = Held::start(podman.cmd(&["start", "-ai", &b_name]), 1024 * MIB);
    node.assert_status(&[
        (&a_id, "production", 2048 * MIB),
        (&b_id, "opportunistic", 1024 * MIB),
    ]);
    pa.end();
    pb.end();
    // poststop released both: the daemon keeps no settings for containers that are gone.
    for id in [&a_id, &b_id] {
        libshare_tests::until(Duration::from_secs(10), || {
            node.settings(id).as_object().is_some_and(|o| o.is_empty())
        })
        .unwrap_or_else(|| panic!("{id}'s settings stay: {}", node.settings(id)));
    }
    eprintln!(
        "two pods through the device plugin: {a_id} production 2 GiB (its LIBSHARE_MEMORY_LIMIT=40GiB ignored), {b_id} opportunistic 1 GiB"
    );
}

#[test]
fn a_malformed_pod_annotation_stops_the_container_with_one_line_and_sets_nothing() {
    let Some((c, mut conn, _)) = cluster(4, &[]) else {
        return;
    };
    let (node, podman, kl) = (&c.node, &c.podman, &c.kl);
    let resp = conn
        .allocate(kl, &[vec!["gpu0-share0".to_string()]])
        .unwrap();
    let name = unique("pod-bad");
    let _cleanup = podman.removing(&[&name]);
    let created = create(
        podman,
        &name,
        &resp.container_responses[0],
        &[("libshare.dev/class", "gold")],
        &[],
        &["/bin/sh", "-c", "echo RAN"],
    );
    let id = ok(&created).trim()[..12].to_string();
    let out = podman.cmd(&["start", "-a", &name]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && !stdout.contains("RAN"),
        "{stdout} {err}"
    );
    let line = err
        .lines()
        .find(|l| l.contains("libshare.dev/class"))
        .unwrap_or_else(|| panic!("one line naming the annotation: {err}"));
    assert!(
        line.contains("expected production or opportunistic"),
        "{line}"
    );
    eprintln!("malformed annotation: {line}");
    let s = node.settings(&id);
    assert!(
        s.as_object().is_some_and(|o| o.is_empty()),
        "nothing set: {s}"
    );
}

#[test]
fn a_pod_outside_the_production_namespaces_is_opportunistic_whatever_it_asks() {
    let Some((c, mut conn, all)) = cluster(4, &[&quota_program()]) else {
        return;
    };
    let (node, podman, kl) = (&c.node, &c.podman, &c.kl);
    let ids = conn.preferred(kl, &all, &[], 2);
    let resp = conn.allocate(kl, &[ids]).unwrap();
    let name = unique("pod-batch");
    let _cleanup = podman.removing(&[&name]);
    // Namespace "batch" is not in --production-namespaces; the pod asks for production by its
    // annotation and its environment.
    let id = ok(&create(
        podman,
        &name,
        &resp.container_responses[0],
        &[
            ("libshare.dev/class", "production"),
            ("io.kubernetes.pod.namespace", "batch"),
        ],
        &["--env", "LIBSHARE_CLASS=production"],
        &["/usr/bin/container_quota", &(2048 - 16).to_string()],
    ))
    .trim()[..12]
        .to_string();
    let p = Held::start(podman.cmd(&["start", "-ai", &name]), 2048 * MIB);
    node.assert_status(&[(&id, "opportunistic", 2048 * MIB)]);
    p.end();
    let log = std::fs::read_to_string(node.state_dir().join("inject/hook.log")).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains(&id) && l.contains("bound"))
        .unwrap_or_else(|| panic!("a line for {id}: {log}"));
    assert!(
        line.contains("class opportunistic") && line.contains("\"batch\" may not be production"),
        "{line}"
    );
    eprintln!("device plugin, namespace batch: {line}");
}
