//! A kubelet stand-in for DRA (`tests/tests/k8s_dra*.rs`), speaking the plugin's own generated
//! types of the kubelet's protos: the plugin watcher (a registry directory scanned every 100 ms
//! for sockets, each new one asked `GetInfo` and checked as the kubelet checks a DRA plugin —
//! type `DRAPlugin`, a driver name, a service endpoint that is a socket, a supported version it
//! speaks — then told the outcome with `NotifyRegistrationStatus`), and the DRA client
//! (`NodePrepareResources`, `NodeUnprepareResources`, `v1` or `v1beta1`) on the endpoint of the
//! last registration. A restart forgets every registration and finds the sockets again, as a
//! kubelet does when it starts.

// tonic's service traits fix `Result<_, tonic::Status>` (a large error) as the answer type.
#![allow(clippy::result_large_err)]

use libshare_k8s::dra::api::registration::registration_client::RegistrationClient;
use libshare_k8s::dra::api::registration::{InfoRequest, PluginInfo, RegistrationStatus};
use libshare_k8s::dra::api::{v1, v1beta1};
use std::collections::HashSet;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A registration the stand-in accepted (or refused: `error`).
#[derive(Clone, Debug)]
pub struct Registered {
    pub info: PluginInfo,
    pub error: String,
    pub at: Instant,
}

type Seen = Arc<Mutex<Vec<Registered>>>;

pub struct DraKubelet {
    pub rt: tokio::runtime::Runtime,
    registry: tempfile::TempDir,
    plugins: tempfile::TempDir,
    seen: Seen,
    watcher: Option<tokio::task::JoinHandle<()>>,
}

/// What the kubelet checks before it uses a plugin; `Err` is what it tells the plugin.
fn validate(info: &PluginInfo) -> Result<(), String> {
    if info.r#type != "DRAPlugin" {
        return Err(format!("plugin type {:?} is not DRAPlugin", info.r#type));
    }
    if info.name.is_empty() || !info.name.contains('.') {
        return Err(format!("{:?} is not a DRA driver name", info.name));
    }
    if !info
        .supported_versions
        .iter()
        .any(|v| v == "v1.DRAPlugin" || v == "v1beta1.DRAPlugin")
    {
        return Err(format!(
            "none of the versions {:?} is supported",
            info.supported_versions
        ));
    }
    let ep = Path::new(&info.endpoint);
    if !ep.is_absolute() || !std::fs::metadata(ep).is_ok_and(|m| m.file_type().is_socket()) {
        return Err(format!("endpoint {:?} is not a socket", info.endpoint));
    }
    Ok(())
}

async fn register(sock: &Path) -> Option<Registered> {
    let channel = libshare_k8s::plugin::connect(sock).await.ok()?;
    let mut client = RegistrationClient::new(channel);
    let info = client.get_info(InfoRequest {}).await.ok()?.into_inner();
    let outcome = validate(&info);
    let status = RegistrationStatus {
        plugin_registered: outcome.is_ok(),
        error: outcome.clone().err().unwrap_or_default(),
    };
    client.notify_registration_status(status).await.ok()?;
    Some(Registered {
        info,
        error: outcome.err().unwrap_or_default(),
        at: Instant::now(),
    })
}

impl DraKubelet {
    /// A registry directory and a plugin directory (short paths: a unix socket path has at most
    /// 108 bytes), watched from now on.
    pub fn start() -> DraKubelet {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let mut k = DraKubelet {
            rt,
            registry: tempfile::Builder::new().prefix("kr").tempdir().unwrap(),
            plugins: tempfile::Builder::new().prefix("kp").tempdir().unwrap(),
            seen: Arc::default(),
            watcher: None,
        };
        k.watch();
        k
    }

    /// The plugin watcher: every new socket is registered (a path, inode and change time not
    /// seen yet: the kubelet watches for created files, and a socket made again at the same
    /// path may get the same inode number).
    fn watch(&mut self) {
        let dir = self.registry.path().to_path_buf();
        let seen = self.seen.clone();
        self.watcher = Some(self.rt.spawn(async move {
            let mut known: HashSet<(PathBuf, u64, i64, i64)> = HashSet::new();
            loop {
                for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                    let Ok(m) = e.metadata() else { continue };
                    let key = (e.path(), m.ino(), m.ctime(), m.ctime_nsec());
                    if !m.file_type().is_socket() || !known.insert(key.clone()) {
                        continue;
                    }
                    if let Some(r) = register(&e.path()).await {
                        seen.lock().unwrap().push(r);
                    } else {
                        // Not answering yet: asked again at the next scan.
                        known.remove(&key);
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }));
    }

    /// The plugin watcher's directory (`--registry-dir`).
    pub fn registry_dir(&self) -> &Path {
        self.registry.path()
    }

    /// A directory for the plugin's service socket (`--plugin-dir`).
    pub fn plugin_dir(&self) -> &Path {
        self.plugins.path()
    }

    /// A kubelet restart: every registration forgotten, the sockets found again.
    pub fn restart(&mut self) {
        if let Some(w) = self.watcher.take() {
            w.abort();
        }
        self.seen.lock().unwrap().clear();
        self.watch();
    }

    /// The `n`th registration since the last (re)start (1-based), waiting up to `limit`.
    pub fn registration(&self, n: usize, limit: Duration) -> Option<Registered> {
        crate::until(limit, || self.seen.lock().unwrap().len() >= n)?;
        self.seen.lock().unwrap().get(n - 1).cloned()
    }

    pub fn registrations(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    fn endpoint(&self) -> PathBuf {
        let seen = self.seen.lock().unwrap();
        let r = seen.last().expect("a plugin registered");
        assert!(r.error.is_empty(), "refused: {}", r.error);
        PathBuf::from(&r.info.endpoint)
    }

    fn channel(&self) -> tonic::transport::Channel {
        self.rt
            .block_on(libshare_k8s::plugin::connect(&self.endpoint()))
            .unwrap()
    }

    /// `NodePrepareResources` (v1) for `claims` (namespace, name, uid).
    pub fn prepare(
        &self,
        claims: &[(&str, &str, &str)],
    ) -> Result<v1::NodePrepareResourcesResponse, tonic::Status> {
        let mut c = v1::dra_plugin_client::DraPluginClient::new(self.channel());
        let req = v1::NodePrepareResourcesRequest {
            claims: claims.iter().map(|c| claim(*c)).collect(),
        };
        self.rt
            .block_on(c.node_prepare_resources(req))
            .map(|r| r.into_inner())
    }

    /// `NodePrepareResources` through the `v1beta1` service (a kubelet 1.32–1.33).
    pub fn prepare_v1beta1(
        &self,
        claims: &[(&str, &str, &str)],
    ) -> Result<v1beta1::NodePrepareResourcesResponse, tonic::Status> {
        let mut c = v1beta1::dra_plugin_client::DraPluginClient::new(self.channel());
        let req = v1beta1::NodePrepareResourcesRequest {
            claims: claims
                .iter()
                .map(|(namespace, name, uid)| v1beta1::Claim {
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                    uid: uid.to_string(),
                })
                .collect(),
        };
        self.rt
            .block_on(c.node_prepare_resources(req))
            .map(|r| r.into_inner())
    }

    /// `NodeUnprepareResources` (v1) for `claims`.
    pub fn unprepare(
        &self,
        claims: &[(&str, &str, &str)],
    ) -> Result<v1::NodeUnprepareResourcesResponse, tonic::Status> {
        let mut c = v1::dra_plugin_client::DraPluginClient::new(self.channel());
        let req = v1::NodeUnprepareResourcesRequest {
            claims: claims.iter().map(|c| claim(*c)).collect(),
        };
        self.rt
            .block_on(c.node_unprepare_resources(req))
            .map(|r| r.into_inner())
    }
}

fn claim((namespace, name, uid): (&str, &str, &str)) -> v1::Claim {
    v1::Claim {
        namespace: namespace.into(),
        name: name.into(),
        uid: uid.into(),
    }
}

impl Drop for DraKubelet {
    fn drop(&mut self) {
        if let Some(w) = self.watcher.take() {
            w.abort();
        }
    }
}

/// A `resource.k8s.io/v1` ResourceClaim as the API server returns it once the scheduler
/// allocated it on `node` with consumable capacity: one request `gpu` of DeviceClass `class`
/// asking for `memory`, allocated on `device` of `driver`'s pool `pool`, and opaque
/// `parameters` for `gpu.libshare.dev` from the claim (if any).
pub struct ClaimJson<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
    pub class: &'a str,
    pub memory: &'a str,
    pub driver: &'a str,
    pub pool: &'a str,
    pub device: &'a str,
    pub parameters: Option<serde_json::Value>,
}

impl<'a> ClaimJson<'a> {
    /// Claim `name` (uid `uid`) of namespace `team-a`: `memory` of DeviceClass `class` on
    /// `device` of driver `gpu.libshare.dev`'s pool `pool`, no parameters.
    pub fn new(
        name: &'a str,
        uid: &'a str,
        class: &'a str,
        memory: &'a str,
        pool: &'a str,
        device: &'a str,
    ) -> ClaimJson<'a> {
        ClaimJson {
            namespace: "team-a",
            name,
            uid,
            class,
            memory,
            driver: "gpu.libshare.dev",
            pool,
            device,
            parameters: None,
        }
    }

    pub fn json(&self) -> serde_json::Value {
        use serde_json::json;
        let config = match &self.parameters {
            None => json!([]),
            Some(p) => json!([{ "requests": ["gpu"],
                "opaque": { "driver": "gpu.libshare.dev", "parameters": p } }]),
        };
        let alloc_config = match &self.parameters {
            None => json!([]),
            Some(p) => json!([{ "source": "FromClaim", "requests": ["gpu"],
                "opaque": { "driver": "gpu.libshare.dev", "parameters": p } }]),
        };
        json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {
                "name": self.name, "namespace": self.namespace, "uid": self.uid,
                "resourceVersion": "1042", "creationTimestamp": "2026-11-28T04:00:00Z",
                "annotations": { "resource.kubernetes.io/pod-claim-name": "gpu" }
            },
            "spec": { "devices": {
                "requests": [{ "name": "gpu", "exactly": {
                    "deviceClassName": self.class, "allocationMode": "ExactCount", "count": 1,
                    "capacity": { "requests": { "memory": self.memory } } } }],
                "config": config
            } },
            "status": {
                "allocation": {
                    "devices": {
                        "results": [{ "request": "gpu", "driver": self.driver, "pool": self.pool,
                            "device": self.device, "shareID": "9f3e1c2a-0000-4000-8000-00000000000a",
                            "consumedCapacity": { "memory": self.memory, "compute": "0" } }],
                        "config": alloc_config
                    },
                    "nodeSelector": { "nodeSelectorTerms": [{ "matchFields": [{
                        "key": "metadata.name", "operator": "In", "values": [self.pool] }] }] },
                    "allocationTimestamp": "2026-11-28T04:00:01Z"
                },
                "reservedFor": [{ "resource": "pods", "name": "pod",
                    "uid": "0c1d2e3f-0000-4000-8000-000000000001" }]
            }
        })
    }
}

/// `sharectl dra-plugin` on `node` for `kl` (node name `node_name`, CDI specs of kind `kind` in
/// `cdi`, the API server of `kubeconfig`), its log lines collected (and echoed). SIGKILLed when
/// dropped (what it wrote stays, as for a plugin that crashed: see [`SpecsOfKind`]).
pub struct DraPlugin {
    pub child: std::process::Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl DraPlugin {
    pub fn start(
        node: &crate::containers::Node,
        kl: &DraKubelet,
        node_name: &str,
        cdi: &Path,
        kind: &str,
        kubeconfig: &Path,
    ) -> DraPlugin {
        use std::io::BufRead;
        use std::process::Stdio;
        let mut cmd = node.sharectl(&[
            "dra-plugin",
            "--node-name",
            node_name,
            "--rescan",
            "300ms",
            "--resync",
            "2s",
            "--kind",
            kind,
        ]);
        cmd.arg("--registry-dir")
            .arg(kl.registry_dir())
            .arg("--plugin-dir")
            .arg(kl.plugin_dir())
            .arg("--cdi-dir")
            .arg(cdi)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(node.inject_args())
            .env_remove("KUBECONFIG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("start sharectl dra-plugin");
        let lines: Arc<Mutex<Vec<String>>> = Arc::default();
        let l = lines.clone();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("dra-plugin: {line}");
                l.lock().unwrap().push(line);
            }
        });
        DraPlugin { child, lines }
    }

    /// The first log line containing `text`, waiting up to `limit`.
    pub fn line(&self, text: &str, limit: Duration) -> Option<String> {
        let find = || {
            self.lines
                .lock()
                .unwrap()
                .iter()
                .find(|l| l.contains(text))
                .cloned()
        };
        crate::until(limit, || find().is_some())?;
        find()
    }

    /// Kills it (SIGKILL: nothing cleaned up) and waits for it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for DraPlugin {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Removes, when dropped, the CDI specs of `kind` in a shared directory (`/etc/cdi`, which
/// podman reads) that a test's plugin left there.
pub struct SpecsOfKind(pub PathBuf, pub String);

impl Drop for SpecsOfKind {
    fn drop(&mut self) {
        let prefix = format!("{}-", self.1.replace('/', "_"));
        for e in std::fs::read_dir(&self.0).into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}
