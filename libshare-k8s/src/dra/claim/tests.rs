use super::*;
use crate::dra::slice::Gpu;
use serde_json::json;

const GI: u64 = 1 << 30;

/// A claim as the API server returns it once the scheduler allocated it (resource.k8s.io/v1,
/// consumable capacity on): `results` are (request, driver, pool, device, consumed memory).
fn claim(
    requests: serde_json::Value,
    results: &[(&str, &str, &str, &str, Option<&str>)],
    config: serde_json::Value,
) -> ResourceClaim {
    let results: Vec<serde_json::Value> = results
        .iter()
        .map(|(req, driver, pool, dev, mem)| {
            let mut r = json!({
                "request": req, "driver": driver, "pool": pool, "device": dev,
                "shareID": "3f1c2a9e-5b7d-4c1e-9a2b-0d4e6f8a1b2c",
            });
            if let Some(m) = mem {
                r["consumedCapacity"] = json!({ "memory": m, "compute": "0" });
            }
            r
        })
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": "train-gpu-x7k2p", "namespace": "team-a",
            "uid": "6b0d6a70-3c9e-4d0b-9e43-7c0c9f4a2f11",
            "resourceVersion": "48213", "creationTimestamp": "2026-11-28T04:00:00Z",
            "annotations": { "resource.kubernetes.io/pod-claim-name": "gpu" },
            "ownerReferences": [{ "apiVersion": "v1", "kind": "Pod", "name": "train",
                "uid": "0c1d2e3f-0000-4000-8000-000000000001", "controller": true,
                "blockOwnerDeletion": true }]
        },
        "spec": { "devices": { "requests": requests } },
        "status": {
            "allocation": {
                "devices": { "results": results, "config": config },
                "nodeSelector": { "nodeSelectorTerms": [{ "matchFields": [
                    { "key": "metadata.name", "operator": "In", "values": ["node-a"] }] }] },
                "allocationTimestamp": "2026-11-28T04:00:01Z"
            },
            "reservedFor": [{ "resource": "pods", "name": "train",
                "uid": "0c1d2e3f-0000-4000-8000-000000000001" }]
        }
    }))
    .expect("resource.k8s.io/v1 ResourceClaim JSON")
}

fn exactly(name: &str, class: &str, memory: &str) -> serde_json::Value {
    json!({ "name": name, "exactly": { "deviceClassName": class, "allocationMode": "ExactCount",
        "count": 1, "capacity": { "requests": { "memory": memory } } } })
}

fn opaque(source: &str, params: serde_json::Value) -> serde_json::Value {
    json!({ "source": source, "opaque": { "driver": DRIVER, "parameters": params } })
}

fn inv() -> Inventory {
    Inventory {
        driver_version: "580.00".into(),
        gpus: (0..2)
            .map(|i| Gpu {
                index: i,
                uuid: format!("GPU-{i}"),
                product: "simgpu".into(),
                memory: 16 * GI,
            })
            .collect(),
    }
}

fn want() -> ClaimRef {
    ClaimRef {
        namespace: "team-a".into(),
        name: "train-gpu-x7k2p".into(),
        uid: "6b0d6a70-3c9e-4d0b-9e43-7c0c9f4a2f11".into(),
    }
}

fn policy() -> Policy {
    Policy {
        production_classes: vec!["production.gpu.libshare.dev".into()],
    }
}

fn run(c: &ResourceClaim) -> Result<(Prepared, Vec<String>), String> {
    prepare(&want(), c, "node-a", &inv(), &policy(), "k/c=x".into())
}

#[test]
fn the_quota_is_the_consumed_memory_and_the_class_the_device_classs() {
    let c = claim(
        json!([exactly("gpu", "production.gpu.libshare.dev", "6Gi")]),
        &[("gpu", DRIVER, "node-a", "gpu-1", Some("6Gi"))],
        json!([]),
    );
    let (p, notes) = run(&c).unwrap();
    assert_eq!(p.quota, BTreeMap::from([(1, 6 * GI)]));
    assert_eq!(p.class, Class::Production);
    assert_eq!((p.compute, p.oversubscribe), (None, false));
    assert_eq!(p.visible(), "1");
    assert_eq!(p.devices[0].uuid, "GPU-1");
    assert!(notes.is_empty());
    // Round trip through the record.
    let back: Prepared = serde_json::from_slice(&serde_json::to_vec(&p).unwrap()).unwrap();
    assert_eq!(back, p);

    // Two requests on one GPU add up; a result without consumed capacity has the whole GPU.
    let c = claim(
        json!([
            exactly("a", "opportunistic.gpu.libshare.dev", "1Gi"),
            exactly("b", "opportunistic.gpu.libshare.dev", "2Gi"),
            exactly("c", "opportunistic.gpu.libshare.dev", "1Gi")
        ]),
        &[
            ("a", DRIVER, "node-a", "gpu-0", Some("1Gi")),
            ("b", DRIVER, "node-a", "gpu-0", Some("2Gi")),
            ("c", DRIVER, "node-a", "gpu-1", None),
        ],
        json!([]),
    );
    let (p, _) = run(&c).unwrap();
    assert_eq!(p.quota, BTreeMap::from([(0, 3 * GI), (1, 16 * GI)]));
    assert_eq!(p.class, Class::Opportunistic);
    assert_eq!(p.visible(), "0,1");
}

#[test]
fn nothing_the_pod_writes_raises_the_claim() {
    // The opportunistic DeviceClass, and parameters asking for production, 40 GiB, no cap.
    let c = claim(
        json!([exactly("gpu", "opportunistic.gpu.libshare.dev", "3Gi")]),
        &[("gpu", DRIVER, "node-a", "gpu-0", Some("3Gi"))],
        json!([opaque(
            "FromClaim",
            json!({ "apiVersion": "gpu.libshare.dev/v1",
            "kind": "GpuConfig", "class": "production", "memory": "40Gi", "compute": "30%" })
        )]),
    );
    let (p, notes) = run(&c).unwrap();
    assert_eq!(p.class, Class::Opportunistic);
    assert_eq!(p.quota[&0], 3 * GI);
    assert_eq!(p.compute, Some(3000), "a cap lowers");
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(notes
        .iter()
        .all(|n| n.contains("ignored") && !n.contains('\n')));

    // Parameters lower: a smaller quota, opportunistic, a cap, oversubscription.
    let c = claim(
        json!([exactly("gpu", "production.gpu.libshare.dev", "6Gi")]),
        &[("gpu", DRIVER, "node-a", "gpu-0", Some("6Gi"))],
        json!([
            opaque(
                "FromClass",
                json!({ "apiVersion": "gpu.libshare.dev/v1", "kind": "GpuConfig", "compute": 50 })
            ),
            opaque(
                "FromClaim",
                json!({ "apiVersion": "gpu.libshare.dev/v1", "kind": "GpuConfig",
                "class": "opportunistic", "memory": "2Gi", "compute": "30", "oversubscribe": true })
            )
        ]),
    );
    let (p, notes) = run(&c).unwrap();
    assert_eq!(p.class, Class::Opportunistic);
    assert_eq!(p.quota[&0], 2 * GI);
    assert_eq!(p.compute, Some(3000));
    assert!(p.oversubscribe && notes.is_empty(), "{notes:?}");

    // A production claim never oversubscribes; another driver's parameters are not ours.
    let c = claim(
        json!([exactly("gpu", "production.gpu.libshare.dev", "6Gi")]),
        &[("gpu", DRIVER, "node-a", "gpu-0", Some("6Gi"))],
        json!([
            { "source": "FromClaim", "opaque": { "driver": "gpu.nvidia.com", "parameters": { "x": 1 } } },
            opaque("FromClaim", json!({ "apiVersion": "gpu.libshare.dev/v1", "kind": "GpuConfig", "oversubscribe": true }))
        ]),
    );
    let (p, notes) = run(&c).unwrap();
    assert_eq!((p.class, p.oversubscribe), (Class::Production, false));
    assert_eq!(notes.len(), 1);
}

#[test]
fn bad_claims_are_one_line_each() {
    let ok_req = json!([exactly("gpu", "production.gpu.libshare.dev", "6Gi")]);
    let cases: Vec<(ResourceClaim, &str)> = vec![
        (
            claim(
                ok_req.clone(),
                &[("gpu", "gpu.nvidia.com", "node-a", "gpu-0", Some("6Gi"))],
                json!([]),
            ),
            "no device of driver gpu.libshare.dev",
        ),
        (
            claim(
                ok_req.clone(),
                &[("gpu", DRIVER, "node-b", "gpu-0", Some("6Gi"))],
                json!([]),
            ),
            "not this node's",
        ),
        (
            claim(
                ok_req.clone(),
                &[("gpu", DRIVER, "node-a", "gpu-7", Some("6Gi"))],
                json!([]),
            ),
            "not a GPU of this node",
        ),
        (
            claim(
                ok_req.clone(),
                &[("gpu", DRIVER, "node-a", "gpu-0", Some("40Gi"))],
                json!([]),
            ),
            "more than the GPU's 16Gi",
        ),
        (
            claim(
                ok_req.clone(),
                &[("gpu", DRIVER, "node-a", "gpu-0", Some("1Mi"))],
                json!([]),
            ),
            "below 16 MiB",
        ),
        (
            claim(
                ok_req.clone(),
                &[("other", DRIVER, "node-a", "gpu-0", Some("6Gi"))],
                json!([]),
            ),
            "names no DeviceClass",
        ),
        (
            claim(
                ok_req.clone(),
                &[("gpu", DRIVER, "node-a", "gpu-0", Some("6Gi"))],
                json!([opaque(
                    "FromClaim",
                    json!({ "apiVersion": "gpu.libshare.dev/v1", "kind": "GpuConfig", "priority": 0 })
                )]),
            ),
            "unknown field `priority`",
        ),
        (
            claim(
                ok_req.clone(),
                &[("gpu", DRIVER, "node-a", "gpu-0", Some("6Gi"))],
                json!([opaque(
                    "FromClaim",
                    json!({ "apiVersion": "v1", "kind": "GpuConfig" })
                )]),
            ),
            "expected apiVersion gpu.libshare.dev/v1",
        ),
        (
            claim(
                ok_req.clone(),
                &[("gpu", DRIVER, "node-a", "gpu-0", Some("6Gi"))],
                json!([opaque(
                    "FromClaim",
                    json!({ "apiVersion": "gpu.libshare.dev/v1", "kind": "GpuConfig", "compute": "130%" })
                )]),
            ),
            "expected a percentage",
        ),
    ];
    for (c, want_text) in cases {
        let e = run(&c).unwrap_err();
        assert!(
            e.contains(want_text) && !e.contains('\n'),
            "{want_text}: {e}"
        );
        assert!(e.starts_with("claim team-a/train-gpu-x7k2p"), "{e}");
    }
    // Not allocated; another uid (the claim was deleted and made again).
    let mut c = claim(ok_req.clone(), &[], json!([]));
    c.status = None;
    assert!(run(&c).unwrap_err().contains("not allocated"));
    let mut c = claim(
        ok_req,
        &[("gpu", DRIVER, "node-a", "gpu-0", Some("6Gi"))],
        json!([]),
    );
    c.metadata.uid = Some("other".into());
    assert!(run(&c).unwrap_err().contains("deleted and created again"));
}

#[test]
fn a_first_available_subrequest_names_its_own_class() {
    let c = claim(
        json!([{ "name": "gpu", "firstAvailable": [
            { "name": "big", "deviceClassName": "production.gpu.libshare.dev" },
            { "name": "small", "deviceClassName": "opportunistic.gpu.libshare.dev" }
        ] }]),
        &[("gpu/small", DRIVER, "node-a", "gpu-0", Some("2Gi"))],
        json!([]),
    );
    assert_eq!(run(&c).unwrap().0.class, Class::Opportunistic);
}
