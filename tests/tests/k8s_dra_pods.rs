//! Pods started by real podman from ResourceClaims prepared by `sharectl dra-plugin` (issue 32,
//! must-shows 2 and 3): the CDI device `NodePrepareResources` answered, as the kubelet passes it
//! to the runtime. The quota is the memory the claim consumes on the GPU and the class its
//! DeviceClass's, bound on the host to the container id by the CDI spec's hook — not what the
//! pod's annotations, environment or opaque parameters ask for.

use libshare_tests::apiserver::ApiServer;
use libshare_tests::containers::{quota_program, rootfs, unique, Held, Node, Podman, MIB};
use libshare_tests::dra_kubelet::{ClaimJson, DraKubelet, DraPlugin, SpecsOfKind};
use libshare_tests::{ok, until};
use serde_json::json;
use std::path::Path;
use std::time::Duration;

const NODE: &str = "node-a";
const GIB: u64 = 1 << 30;

/// A 16 GiB simulated GPU, podman with an image of the quota program, an API server and a
/// kubelet stand-in, and the plugin registered, writing its specs to /etc/cdi (where podman 4.3
/// reads them) under a kind private to this test. `None` after a SKIP.
struct Cluster {
    node: Node,
    podman: Podman,
    api: ApiServer,
    kl: DraKubelet,
    kind: String,
    _plugin: DraPlugin,
    _specs: SpecsOfKind,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
}

fn cluster(test: &str) -> Option<Cluster> {
    let node = Node::start("16GiB", &[]);
    let image = tempfile::tempdir().unwrap();
    rootfs(image.path(), &[&quota_program()]);
    let podman = Podman::new(image.path())?;
    let api = ApiServer::start();
    let kl = DraKubelet::start();
    let dir = tempfile::tempdir().unwrap();
    let kind = format!("k{}{test}.gpu.libshare.dev/claim", std::process::id());
    let specs = SpecsOfKind("/etc/cdi".into(), kind.clone());
    let plugin = DraPlugin::start(
        &node,
        &kl,
        NODE,
        Path::new("/etc/cdi"),
        &kind,
        &api.kubeconfig(dir.path()),
    );
    kl.registration(1, Duration::from_secs(20))
        .expect("the plugin registers");
    Some(Cluster {
        node,
        podman,
        api,
        kl,
        kind,
        _plugin: plugin,
        _specs: specs,
        _dirs: (image, dir),
    })
}

fn claim<'a>(name: &'a str, uid: &'a str, class: &'a str, memory: &'a str) -> ClaimJson<'a> {
    ClaimJson::new(name, uid, class, memory, NODE, "gpu-0")
}

impl Cluster {
    /// Prepares `c` through the kubelet stand-in; the CDI device the runtime gets.
    fn prepare(&self, c: &ClaimJson) -> String {
        self.api.add_claim(c.json());
        let r = self.kl.prepare(&[(c.namespace, c.name, c.uid)]).unwrap();
        let got = &r.claims[c.uid];
        assert_eq!(got.error, "", "{}", c.name);
        let ids = &got.devices[0].cdi_device_ids;
        assert_eq!(ids, &[format!("{}={}", self.kind, c.uid)]);
        ids[0].clone()
    }

    /// `podman create` of a pod container with the claim's CDI device and `extra` arguments
    /// running the quota program up to `quota` less 16 MiB; its 12-digit id.
    fn create(&self, name: &str, device: &str, extra: &[&str], quota: u64) -> String {
        let mib = (quota / MIB - 16).to_string();
        let out = self
            .podman
            .create(name, device, extra, &["/usr/bin/container_quota", &mib])
            .output()
            .unwrap();
        ok(&out).trim()[..12].to_string()
    }

    fn unprepare(&self, c: &ClaimJson) {
        let u = self.kl.unprepare(&[(c.namespace, c.name, c.uid)]).unwrap();
        assert_eq!(u.claims[c.uid].error, "");
    }
}

#[test]
fn two_pods_from_prepared_claims_share_the_gpu_with_their_quotas_and_classes() {
    let Some(c) = cluster("two") else {
        return;
    };
    // Inference: production, 6 GiB. Training: opportunistic, 3 GiB, capped at 30 % compute.
    let a = claim(
        "infer-gpu",
        "6b0d6a70-3c9e-4d0b-9e43-7c0c9f4a2f11",
        "production.gpu.libshare.dev",
        "6Gi",
    );
    let mut b = claim(
        "train-gpu",
        "1d2c3b4a-5e6f-4a0b-8c9d-0e1f2a3b4c5d",
        "opportunistic.gpu.libshare.dev",
        "3Gi",
    );
    b.parameters =
        Some(json!({ "apiVersion": "gpu.libshare.dev/v1", "kind": "GpuConfig", "compute": "30%" }));
    let (da, db) = (c.prepare(&a), c.prepare(&b));
    let (an, bn) = (unique("dra-infer"), unique("dra-train"));
    let _cleanup = c.podman.removing(&[&an, &bn]);
    let a_id = c.create(&an, &da, &[], 6 * GIB);
    let b_id = c.create(&bn, &db, &[], 3 * GIB);
    let pa = Held::start(c.podman.cmd(&["start", "-ai", &an]), 6 * GIB);
    let pb = Held::start(c.podman.cmd(&["start", "-ai", &bn]), 3 * GIB);
    c.node.assert_status(&[
        (&a_id, "production", 6 * GIB),
        (&b_id, "opportunistic", 3 * GIB),
    ]);
    assert_eq!(
        c.node.settings(&b_id)["all"]["compute"],
        3000,
        "the 30 % cap"
    );
    assert!(c.node.settings(&a_id)["all"].get("compute").is_none());
    pa.end();
    pb.end();
    // poststop released both; unprepare removes the claims' specs.
    for id in [&a_id, &b_id] {
        until(Duration::from_secs(10), || {
            c.node
                .settings(id)
                .as_object()
                .is_some_and(|o| o.is_empty())
        })
        .unwrap_or_else(|| panic!("{id}'s settings stay: {}", c.node.settings(id)));
    }
    c.unprepare(&a);
    c.unprepare(&b);
    eprintln!(
        "two pods from DRA claims: {a_id} production 6 GiB, {b_id} opportunistic 3 GiB (30 % cap)"
    );
}

#[test]
fn a_pod_whose_claim_names_the_opportunistic_class_stays_opportunistic_whatever_it_asks() {
    let Some(c) = cluster("esc") else {
        return;
    };
    // The DeviceClass is opportunistic; the claim's opaque parameters, the pod's annotations
    // and its environment all ask for production and 40 GiB.
    let mut e = claim(
        "greedy-gpu",
        "0a1b2c3d-4e5f-4a6b-8c7d-8e9f0a1b2c3d",
        "opportunistic.gpu.libshare.dev",
        "3Gi",
    );
    e.parameters = Some(
        json!({ "apiVersion": "gpu.libshare.dev/v1", "kind": "GpuConfig",
        "class": "production", "memory": "40Gi" }),
    );
    let de = c.prepare(&e);
    let name = unique("dra-greedy");
    let _cleanup = c.podman.removing(&[&name]);
    let id = c.create(
        &name,
        &de,
        &[
            "--annotation",
            "libshare.dev/class=production",
            "--annotation",
            "io.kubernetes.pod.namespace=inference",
            "--env",
            "LIBSHARE_CLASS=production",
            "--env",
            "LIBSHARE_MEMORY_LIMIT=40GiB",
            "--env",
            "CUDA_DEVICE_MEMORY_LIMIT=40g",
            "--env",
            "CUDA_TASK_PRIORITY=0",
        ],
        3 * GIB,
    );
    let p = Held::start(c.podman.cmd(&["start", "-ai", &name]), 3 * GIB);
    c.node.assert_status(&[(&id, "opportunistic", 3 * GIB)]);
    p.end();
    c.unprepare(&e);
    eprintln!("{id}: asked for production and 40 GiB everywhere, got opportunistic 3 GiB");
}
