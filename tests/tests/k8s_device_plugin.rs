//! libshare's Kubernetes device plugin against a fake kubelet (issue 22, must-shows 1 and 5):
//! `sharectl device-plugin` registers on the kubelet's socket, advertises each simulated GPU
//! as 1 GiB shares, follows the GPUs NVML reports (a GPU gone after simgpu restarts with fewer
//! leaves `ListAndWatch`), prefers one GPU per pod, answers `Allocate` with what a kubelet and a
//! CDI runtime take, registers again after a kubelet restart, and refuses bad requests with one
//! error that writes nothing.

use libshare_tests::containers::Node;
use libshare_tests::kubelet::{check_allocate, FakeKubelet};
use libshare_tests::{file_names, gpus_file, SimGpu};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

const GIB: u64 = 1 << 30;

/// `sharectl device-plugin` on `node`, for `kl`, stopped with SIGTERM when dropped.
struct Plugin(Child);

impl Plugin {
    fn start(node: &Node, kl: &FakeKubelet, cdi_dir: &Path, kind: &str) -> Plugin {
        let mut cmd = node.sharectl(&["device-plugin", "--rescan", "200ms", "--kind", kind]);
        cmd.arg("--plugin-dir")
            .arg(kl.dir())
            .arg("--cdi-dir")
            .arg(cdi_dir)
            .args(node.inject_args())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        Plugin(cmd.spawn().expect("start sharectl device-plugin"))
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        // SAFETY: a signal to our own child, by its pid.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

fn ids(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn registers_advertises_shares_prefers_one_gpu_and_follows_the_gpus_nvml_reports() {
    let cfg_dir = tempfile::tempdir().unwrap();
    let cfg = gpus_file(cfg_dir.path(), &["4GiB", "3GiB"]);
    let node = Node::start_on(SimGpu::new().env("SIMGPU_CONFIG", &cfg), &[]);
    let kl = FakeKubelet::start();
    let cdi = tempfile::tempdir().unwrap();
    let t0 = Instant::now();
    let _plugin = Plugin::start(&node, &kl, cdi.path(), "libshare.dev/gpu");

    let reg = kl
        .registration(1, Duration::from_secs(20))
        .expect("the plugin registers");
    eprintln!("registered in {:?}", t0.elapsed());
    assert_eq!(reg.version, "v1beta1");
    assert_eq!(reg.resource_name, "libshare.dev/gpu-memory");
    assert_eq!(reg.endpoint, "libshare.sock");
    let o = reg.options.unwrap();
    assert!(o.get_preferred_allocation_available && !o.pre_start_required);

    let mut conn = kl.dial(&reg.endpoint);
    assert!(conn.options.get_preferred_allocation_available);
    // 4 GiB and 3 GiB: 4 + 3 shares of 1 GiB, all healthy.
    let all = conn
        .wait_list(Duration::from_secs(10), |l| !l.is_empty())
        .unwrap();
    let want: Vec<String> = ids(&[
        "gpu0-share0",
        "gpu0-share1",
        "gpu0-share2",
        "gpu0-share3",
        "gpu1-share0",
        "gpu1-share1",
        "gpu1-share2",
    ]);
    assert_eq!(all, want);

    // A pod's shares stay on one GPU: best fit, and with what the kubelet requires.
    let p = conn.preferred(&kl, &all, &[], 3);
    assert_eq!(p, ids(&["gpu1-share0", "gpu1-share1", "gpu1-share2"]));
    let p = conn.preferred(&kl, &all, &ids(&["gpu0-share2"]), 3);
    assert_eq!(p, ids(&["gpu0-share2", "gpu0-share0", "gpu0-share1"]));
    let avail = ids(&["gpu0-share3", "gpu1-share0", "gpu1-share1", "gpu0-share1"]);
    let p = conn.preferred(&kl, &avail, &[], 2);
    assert!(p[0][..4] == p[1][..4], "one GPU: {p:?}");

    // Allocate: one answer per container, each a CDI device resolvable in the spec directory,
    // and the allocation recorded on the host with its quota.
    let pod = vec![ids(&["gpu1-share0", "gpu1-share1"]), ids(&["gpu0-share0"])];
    let resp = conn.allocate(&kl, &pod).expect("Allocate");
    check_allocate(&resp, 2, cdi.path());
    let c0 = &resp.container_responses[0];
    assert_eq!(
        c0.cdi_devices[0].name,
        "libshare.dev/gpu=k8s-gpu1-share0-x2"
    );
    assert_eq!(c0.envs["CUDA_VISIBLE_DEVICES"], "1");
    assert_eq!(
        c0.annotations["libshare.dev/allocation"],
        "k8s-gpu1-share0-x2"
    );
    assert!(c0.mounts.is_empty(), "CDI only, unless --legacy-mounts");
    let rec: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(node.state_dir().join("k8s/k8s-gpu1-share0-x2.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(rec["quota"]["1"], 2 * GIB);
    let spec: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(cdi.path().join("libshare.dev_gpu-k8s-gpu1-share0-x2.json"))
            .unwrap(),
    )
    .unwrap();
    let hook = spec["containerEdits"]["hooks"][0]["args"].to_string();
    assert!(
        hook.contains("\"--allocation\",\"k8s-gpu1-share0-x2\""),
        "{hook}"
    );

    // simgpu restarts with GPU 1 gone: its shares leave ListAndWatch within a few rescans.
    let before = conn.lists().len();
    gpus_file(cfg_dir.path(), &["4GiB"]);
    let t1 = Instant::now();
    let now = conn
        .wait_list(Duration::from_secs(10), |l| l.len() == 4)
        .expect("GPU 1's shares leave the list");
    eprintln!(
        "GPU 1 left ListAndWatch {:?} after simgpu restarted without it",
        t1.elapsed()
    );
    assert_eq!(now, want[..4]);
    assert_eq!(conn.lists().len(), before + 1, "one new list, sent once");

    // Allocate for ids the plugin no longer (or never) advertises: one error line, nothing
    // written.
    let written = (
        file_names(cdi.path()),
        file_names(&node.state_dir().join("k8s")),
    );
    for bad in [
        vec![ids(&["gpu1-share2"])],
        vec![ids(&["gpu7-share0"])],
        vec![ids(&["gpu0-share1", "../../etc/passwd"])],
        vec![ids(&["gpu0-share1", "gpu0-share1"])],
        vec![ids(&["gpu0-share1"]), ids(&["gpu0-share1"])],
        vec![vec![]],
    ] {
        let e = conn.allocate(&kl, &bad).expect_err("refused");
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad:?}");
        assert!(
            !e.message().contains('\n') && !e.message().is_empty(),
            "{}",
            e.message()
        );
        eprintln!("Allocate {bad:?}: {}", e.message());
    }
    assert_eq!(
        (
            file_names(cdi.path()),
            file_names(&node.state_dir().join("k8s"))
        ),
        written,
        "a refused Allocate writes nothing"
    );
}

#[test]
fn a_kubelet_restart_makes_the_plugin_register_again_and_shares_are_never_granted_twice() {
    let node = Node::start("6GiB", &[]);
    let mut kl = FakeKubelet::start();
    let cdi = tempfile::tempdir().unwrap();
    let _plugin = Plugin::start(&node, &kl, cdi.path(), "libshare.dev/gpu");
    let reg = kl.registration(1, Duration::from_secs(20)).unwrap();
    let conn = kl.dial(&reg.endpoint);
    conn.wait_list(Duration::from_secs(10), |l| l.len() == 6)
        .unwrap();

    // The kubelet restarts: sockets removed, a new kubelet.sock. The plugin serves a new
    // socket and registers again.
    let t = Instant::now();
    kl.restart();
    let again = kl
        .registration(2, Duration::from_secs(10))
        .expect("the plugin registers again");
    eprintln!(
        "registered again {:?} after the kubelet restarted",
        t.elapsed()
    );
    assert_eq!(again, reg);
    let mut conn = kl.dial(&again.endpoint);
    let list = conn
        .wait_list(Duration::from_secs(10), |l| l.len() == 6)
        .unwrap();
    assert_eq!(list.len(), 6);
    // Once, not in a loop.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(kl.registrations(), 2);

    // The kubelet gives shares again only once they are free: a new allocation of a share
    // replaces the record and spec of the old one, so no share is in two allocations.
    let k8s = node.state_dir().join("k8s");
    conn.allocate(&kl, &[ids(&["gpu0-share0", "gpu0-share1"])])
        .unwrap();
    conn.allocate(&kl, &[ids(&["gpu0-share2"])]).unwrap();
    assert_eq!(
        file_names(&k8s),
        ["k8s-gpu0-share0-x2.json", "k8s-gpu0-share2-x1.json"]
    );
    conn.allocate(&kl, &[ids(&["gpu0-share1", "gpu0-share3"])])
        .unwrap();
    assert_eq!(
        file_names(&k8s),
        ["k8s-gpu0-share1-x2.json", "k8s-gpu0-share2-x1.json"]
    );
    assert_eq!(
        file_names(cdi.path()),
        [
            "libshare.dev_gpu-k8s-gpu0-share1-x2.json",
            "libshare.dev_gpu-k8s-gpu0-share2-x1.json"
        ]
    );
    // The same shares again (a restarted pod): the same allocation, rewritten.
    conn.allocate(&kl, &[ids(&["gpu0-share3", "gpu0-share1"])])
        .unwrap();
    assert_eq!(file_names(&k8s).len(), 2);
}
