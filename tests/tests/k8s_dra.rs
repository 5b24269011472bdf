//! libshare's DRA kubelet plugin (`sharectl dra-plugin`, driver `gpu.libshare.dev`; issue 32,
//! must-shows 1, 4 and 5) against a kubelet stand-in (`tests/src/dra_kubelet.rs`: the plugin
//! watcher on a registry directory, `NodePrepareResources`/`NodeUnprepareResources`) and an API
//! server stand-in (`tests/src/apiserver.rs`: serves ResourceClaims built as `resource.k8s.io/v1`
//! JSON, records ResourceSlice creates and updates): registration, the node's ResourceSlice,
//! prepare (idempotent, `v1` and `v1beta1`), a kubelet restart, the plugin killed between
//! prepare and unprepare, a GPU removed from simgpu leaving the slice, bad input refused in one
//! line with nothing written, and an API server that is not up at start.

use libshare_tests::apiserver::{free_port, kubeconfig, ApiServer};
use libshare_tests::containers::Node;
use libshare_tests::dra_kubelet::{ClaimJson, DraKubelet, DraPlugin};
use libshare_tests::{file_names, gpus_file, until, SimGpu};
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};

const GIB: u64 = 1 << 30;
const NODE: &str = "node-a";
const SLICE: &str = "node-a-gpu.libshare.dev";
const PROD: &str = "production.gpu.libshare.dev";
const OPP: &str = "opportunistic.gpu.libshare.dev";
const DRIVER: &str = "gpu.libshare.dev";
const UA: &str = "6b0d6a70-3c9e-4d0b-9e43-7c0c9f4a2f11";
const UB: &str = "1d2c3b4a-5e6f-4a0b-8c9d-0e1f2a3b4c5d";

fn read_json(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn claim<'a>(
    name: &'a str,
    uid: &'a str,
    class: &'a str,
    memory: &'a str,
    device: &'a str,
) -> ClaimJson<'a> {
    ClaimJson::new(name, uid, class, memory, NODE, device)
}

/// A node with two simulated 16 GiB GPUs (from a file the test rewrites), an API server
/// stand-in, a kubelet stand-in and the plugin registered.
struct Cluster {
    node: Node,
    api: ApiServer,
    kl: DraKubelet,
    cdi: tempfile::TempDir,
    dir: tempfile::TempDir,
    plugin: DraPlugin,
}

fn cluster() -> Cluster {
    let dir = tempfile::tempdir().unwrap();
    let cfg = gpus_file(dir.path(), &["16GiB", "16GiB"]);
    let node = Node::start_on(SimGpu::new().env("SIMGPU_CONFIG", &cfg), &[]);
    let api = ApiServer::start();
    let kl = DraKubelet::start();
    let cdi = tempfile::tempdir().unwrap();
    let plugin = start(&node, &kl, cdi.path(), &api.kubeconfig(dir.path()));
    Cluster {
        node,
        api,
        kl,
        cdi,
        dir,
        plugin,
    }
}

const KIND: &str = "test.libshare.dev/claim";

fn start(node: &Node, kl: &DraKubelet, cdi: &Path, kubeconfig: &Path) -> DraPlugin {
    DraPlugin::start(node, kl, NODE, cdi, KIND, kubeconfig)
}

fn records(node: &Node) -> Vec<String> {
    file_names(&node.state_dir().join("k8s/dra"))
}

#[test]
fn registers_publishes_prepares_and_survives_kubelet_and_plugin_restarts() {
    let t0 = Instant::now();
    let mut c = cluster();
    c.api
        .add_claim(claim("infer-gpu", UA, PROD, "6Gi", "gpu-0").json());
    let mut b = claim("train-gpu", UB, OPP, "3Gi", "gpu-1");
    b.parameters = Some(serde_json::json!({ "apiVersion": "gpu.libshare.dev/v1",
        "kind": "GpuConfig", "compute": "30%" }));
    c.api.add_claim(b.json());

    // Registration through the plugin watcher.
    let reg =
        c.kl.registration(1, Duration::from_secs(20))
            .expect("the plugin registers");
    eprintln!("registered {:?} after the plugin started", reg.at - t0);
    assert_eq!(reg.error, "", "the kubelet accepts it");
    assert_eq!(reg.info.r#type, "DRAPlugin");
    assert_eq!(reg.info.name, DRIVER);
    assert_eq!(
        reg.info.supported_versions,
        ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    );
    assert_eq!(
        Path::new(&reg.info.endpoint),
        c.kl.plugin_dir().join("dra.sock")
    );

    // The node's ResourceSlice: one shareable device per GPU, memory and compute capacity.
    until(Duration::from_secs(10), || c.api.slice(SLICE).is_some()).expect("a ResourceSlice");
    let s = c.api.slice(SLICE).unwrap();
    assert_eq!(s["apiVersion"], "resource.k8s.io/v1");
    let spec = &s["spec"];
    assert_eq!(
        (spec["driver"].as_str(), spec["nodeName"].as_str()),
        (Some(DRIVER), Some(NODE))
    );
    assert_eq!(spec["pool"]["name"], NODE);
    assert_eq!(spec["pool"]["generation"], 1);
    assert_eq!(spec["pool"]["resourceSliceCount"], 1);
    let devices = spec["devices"].as_array().unwrap();
    let names: Vec<&str> = devices
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["gpu-0", "gpu-1"]);
    for (i, d) in devices.iter().enumerate() {
        assert_eq!(d["allowMultipleAllocations"], true);
        assert_eq!(d["capacity"]["memory"]["value"], "16Gi");
        let policy = &d["capacity"]["memory"]["requestPolicy"];
        assert_eq!(policy["default"], "1Gi");
        assert_eq!(policy["validRange"]["step"], "256Mi");
        assert_eq!(d["capacity"]["compute"]["value"], "100");
        assert_eq!(d["attributes"]["index"]["int"], i);
        assert!(d["attributes"]["uuid"]["string"]
            .as_str()
            .unwrap()
            .starts_with("GPU-"));
        assert!(d["attributes"]["productName"]["string"].is_string());
        assert!(
            d["attributes"]["driverVersion"]["version"].is_string(),
            "{d}"
        );
    }
    assert_ne!(
        devices[0]["attributes"]["uuid"],
        devices[1]["attributes"]["uuid"]
    );

    // Prepare both claims: each device answered with the claim's CDI device, the spec written,
    // the claim recorded with its quota and class.
    let a = ("team-a", "infer-gpu", UA);
    let b = ("team-a", "train-gpu", UB);
    let r = c.kl.prepare(&[a, b]).expect("NodePrepareResources");
    assert_eq!(r.claims.len(), 2);
    for (uid, dev) in [(UA, "gpu-0"), (UB, "gpu-1")] {
        let got = &r.claims[uid];
        assert_eq!(got.error, "", "{uid}");
        assert_eq!(got.devices.len(), 1);
        let d = &got.devices[0];
        assert_eq!(d.request_names, ["gpu"]);
        assert_eq!((d.pool_name.as_str(), d.device_name.as_str()), (NODE, dev));
        assert_eq!(d.cdi_device_ids, [format!("test.libshare.dev/claim={uid}")]);
        let spec = read_json(
            &c.cdi
                .path()
                .join(format!("test.libshare.dev_claim-{uid}.json")),
        );
        assert_eq!(spec["kind"], "test.libshare.dev/claim");
        assert_eq!(spec["devices"][0]["name"], uid);
        let env = spec["devices"][0]["containerEdits"]["env"].to_string();
        assert!(
            env.contains(&format!("CUDA_VISIBLE_DEVICES={}", &dev[4..])),
            "{env}"
        );
        let hook = spec["containerEdits"]["hooks"][0]["args"].to_string();
        assert!(hook.contains(&format!("\"--claim\",\"{uid}\"")), "{hook}");
    }
    let rec = read_json(&c.node.state_dir().join(format!("k8s/dra/{UA}.json")));
    assert_eq!(rec["quota"]["0"], 6 * GIB);
    assert_eq!(rec["class"], "production");
    let rec = read_json(&c.node.state_dir().join(format!("k8s/dra/{UB}.json")));
    assert_eq!(rec["quota"]["1"], 3 * GIB);
    assert_eq!(rec["class"], "opportunistic");
    assert_eq!(rec["compute"], 3000);

    // The kubelet retries: the same answer, from the record (the API server is not asked).
    let asked = c.api.requests();
    let again = c.kl.prepare(&[a]).unwrap();
    assert_eq!(again.claims[UA], r.claims[UA]);
    let beta =
        c.kl.prepare_v1beta1(&[a])
            .expect("v1beta1 NodePrepareResources");
    let d = &beta.claims[UA].devices[0];
    assert_eq!(
        (d.device_name.as_str(), &d.cdi_device_ids),
        ("gpu-0", &r.claims[UA].devices[0].cdi_device_ids)
    );
    assert_eq!(
        c.api.requests(),
        asked,
        "a prepared claim is answered from its record"
    );

    // A kubelet restart: it finds the socket again and gets the same answers.
    c.kl.restart();
    let t1 = Instant::now();
    c.kl.registration(1, Duration::from_secs(10))
        .expect("registered again after the kubelet restarted");
    eprintln!(
        "registered again {:?} after the kubelet restarted",
        t1.elapsed()
    );
    assert_eq!(c.kl.prepare(&[a]).unwrap().claims[UA], r.claims[UA]);

    // The plugin killed between prepare and unprepare, and A's pod deleted meanwhile (so the API
    // server no longer has the claim): the restarted plugin registers and unprepares from its
    // records. Unpreparing a claim it never prepared is success.
    c.plugin.kill();
    c.api.delete_claim("team-a", "infer-gpu");
    let t2 = Instant::now();
    c.plugin = start(
        &c.node,
        &c.kl,
        c.cdi.path(),
        &c.api.kubeconfig(c.dir.path()),
    );
    c.kl.registration(2, Duration::from_secs(20))
        .expect("the restarted plugin registers");
    eprintln!("the restarted plugin registered in {:?}", t2.elapsed());
    let u =
        c.kl.unprepare(&[
            a,
            ("team-a", "never", "0f0f0f0f-0000-4000-8000-000000000000"),
        ])
        .unwrap();
    assert_eq!(u.claims.len(), 2);
    assert!(u.claims.values().all(|x| x.error.is_empty()), "{u:?}");
    assert_eq!(
        file_names(c.cdi.path()),
        [format!("test.libshare.dev_claim-{UB}.json")]
    );
    assert_eq!(records(&c.node), [format!("{UB}.json")]);
    // Unprepared, and gone from the API server: preparing it again fails and writes nothing.
    let e = c.kl.prepare(&[a]).unwrap().claims[UA].error.clone();
    assert!(
        e.contains("no such ResourceClaim") && !e.contains('\n'),
        "{e}"
    );
    assert_eq!(records(&c.node), [format!("{UB}.json")]);

    // simgpu restarts with GPU 1 gone: the slice is updated, generation bumped, within 10 s.
    gpus_file(c.dir.path(), &["16GiB"]);
    let t3 = Instant::now();
    let gone = until(Duration::from_secs(10), || {
        c.api.slice(SLICE).is_some_and(|s| {
            s["spec"]["devices"]
                .as_array()
                .is_some_and(|d| d.len() == 1)
        })
    })
    .expect("GPU 1 leaves the ResourceSlice within 10 s");
    eprintln!(
        "GPU 1 left the ResourceSlice {gone:?} after simgpu restarted without it ({:?} since)",
        t3.elapsed()
    );
    let s = c.api.slice(SLICE).unwrap();
    assert_eq!(s["spec"]["devices"][0]["name"], "gpu-0");
    let w = c.api.slice_writes();
    let last = w.last().unwrap();
    assert_eq!(last.verb, "update");
    assert!(
        last.slice["spec"]["pool"]["generation"].as_i64().unwrap() >= 2,
        "the pool's generation moved: {}",
        last.slice["spec"]["pool"]
    );
    let gens: Vec<i64> = w
        .iter()
        .map(|x| x.slice["spec"]["pool"]["generation"].as_i64().unwrap())
        .collect();
    assert!(
        gens.windows(2).all(|g| g[1] > g[0]),
        "every write moves the generation: {gens:?}"
    );
    assert!(w.len() <= 3, "a write per change, not per check: {gens:?}");

    let u = c.kl.unprepare(&[b]).unwrap();
    assert_eq!(u.claims[UB].error, "");
    assert!(file_names(c.cdi.path()).is_empty() && records(&c.node).is_empty());
}

#[test]
fn bad_input_is_one_line_each_and_writes_nothing() {
    let c = cluster();
    c.kl.registration(1, Duration::from_secs(20))
        .expect("the plugin registers");
    until(Duration::from_secs(10), || c.api.slice(SLICE).is_some()).expect("a ResourceSlice");
    let mut other_driver = claim(
        "nv",
        "00000000-0000-4000-8000-000000000001",
        PROD,
        "6Gi",
        "gpu-0",
    );
    other_driver.driver = "gpu.nvidia.com";
    let mut other_node = claim(
        "far",
        "00000000-0000-4000-8000-000000000002",
        PROD,
        "6Gi",
        "gpu-0",
    );
    other_node.pool = "node-b";
    let too_big = claim(
        "big",
        "00000000-0000-4000-8000-000000000003",
        PROD,
        "40Gi",
        "gpu-0",
    );
    let no_gpu = claim(
        "nogpu",
        "00000000-0000-4000-8000-000000000004",
        PROD,
        "1Gi",
        "gpu-7",
    );
    for cl in [&other_driver, &other_node, &too_big, &no_gpu] {
        c.api.add_claim(cl.json());
    }
    let cases = [
        (&other_driver, "no device of driver gpu.libshare.dev"),
        (&other_node, "not this node's"),
        (&too_big, "more than the GPU's 16Gi"),
        (&no_gpu, "not a GPU of this node"),
    ];
    for (cl, want) in cases {
        let r = c.kl.prepare(&[(cl.namespace, cl.name, cl.uid)]).unwrap();
        let got = &r.claims[cl.uid];
        assert!(got.devices.is_empty());
        assert!(
            got.error.contains(want) && !got.error.contains('\n'),
            "{want}: {}",
            got.error
        );
        eprintln!("refused: {}", got.error);
    }
    // A claim the API server does not have; a claim uid that is not one.
    let r =
        c.kl.prepare(&[
            ("team-a", "ghost", "00000000-0000-4000-8000-000000000005"),
            ("team-a", "x", "../../etc"),
        ])
        .unwrap();
    let ghost = &r.claims["00000000-0000-4000-8000-000000000005"].error;
    assert!(
        ghost.contains("no such ResourceClaim") && !ghost.contains('\n'),
        "{ghost}"
    );
    let bad = &r.claims["../../etc"].error;
    assert!(
        bad.contains("expected a namespace, a name and a uid"),
        "{bad}"
    );
    eprintln!("refused: {ghost}\nrefused: {bad}");
    // Unprepare of a claim never prepared: success, as the kubelet expects.
    let u =
        c.kl.unprepare(&[("team-a", "never", "00000000-0000-4000-8000-000000000006")])
            .unwrap();
    assert_eq!(u.claims["00000000-0000-4000-8000-000000000006"].error, "");
    assert!(c
        .plugin
        .line(
            "not prepared on this node, nothing to do",
            Duration::from_secs(5)
        )
        .is_some());
    // Nothing written by any of them.
    assert!(
        file_names(c.cdi.path()).is_empty(),
        "{:?}",
        file_names(c.cdi.path())
    );
    assert!(records(&c.node).is_empty(), "{:?}", records(&c.node));
}

#[test]
fn an_api_server_not_up_at_start_is_asked_again_with_back_off() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start("16GiB", &[]);
    let port = free_port();
    let kc = kubeconfig(dir.path(), port);
    let kl = DraKubelet::start();
    let cdi = tempfile::tempdir().unwrap();
    let t0 = Instant::now();
    let plugin = start(&node, &kl, cdi.path(), &kc);
    // It registers with the kubelet all the same, and says it retries, backing off.
    kl.registration(1, Duration::from_secs(20))
        .expect("the plugin registers without an API server");
    let first = plugin
        .line("asked again in 1 s", Duration::from_secs(20))
        .expect("one line saying the API server is asked again");
    assert!(
        first.contains("cannot publish the node's ResourceSlice"),
        "{first}"
    );
    plugin
        .line("asked again in 2 s", Duration::from_secs(10))
        .expect("the wait doubles");
    // A prepare meanwhile: one line, nothing written.
    let e = kl.prepare(&[("team-a", "c", UA)]).unwrap().claims[UA]
        .error
        .clone();
    assert!(
        e.contains("cannot read it from the API server") && !e.contains('\n'),
        "{e}"
    );
    assert!(file_names(cdi.path()).is_empty());
    // The API server comes up: the slice is published at the next try.
    let api = ApiServer::start_on(port);
    let up = Instant::now();
    until(Duration::from_secs(40), || api.slice(SLICE).is_some())
        .expect("the slice is published once the API server answers");
    eprintln!(
        "API server up {:?} after the plugin started; slice published {:?} later",
        up - t0,
        up.elapsed()
    );
    plugin
        .line("the API server answers again", Duration::from_secs(5))
        .expect("and says so");
    api.add_claim(claim("c", UA, PROD, "2Gi", "gpu-0").json());
    assert_eq!(
        kl.prepare(&[("team-a", "c", UA)]).unwrap().claims[UA].error,
        ""
    );
}
