//! A fake kubelet for `tests/tests/k8s_*.rs`: the kubelet's side of the device-plugin API
//! `v1beta1` (the plugin's own generated types), driving `sharectl device-plugin` as the kubelet
//! does: a `Registration` server on `<dir>/kubelet.sock` that checks what the kubelet checks
//! (API version, an extended resource name, the plugin's socket there) and records each
//! registration; then, as the kubelet, a client of the plugin's socket (`ListAndWatch` kept
//! open, `GetPreferredAllocation`, `Allocate`). [`check_allocate`] says whether a kubelet and a
//! CDI runtime would take an `Allocate` answer. A restart removes every socket of the directory
//! and serves a new `kubelet.sock`, as the kubelet does when it starts.

// tonic's service traits fix `Result<_, tonic::Status>` (a large error) as the answer type.
#![allow(clippy::result_large_err)]

use libshare_k8s::api::device_plugin_client::DevicePluginClient;
use libshare_k8s::api::registration_server::{Registration, RegistrationServer};
use libshare_k8s::api::*;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::transport::Channel;

/// Registrations the kubelet accepted, in order.
type Registrations = Arc<Mutex<Vec<RegisterRequest>>>;

struct Reg {
    dir: PathBuf,
    seen: Registrations,
}

#[tonic::async_trait]
impl Registration for Reg {
    async fn register(
        &self,
        req: tonic::Request<RegisterRequest>,
    ) -> Result<tonic::Response<Empty>, tonic::Status> {
        let r = req.into_inner();
        // What the kubelet's device manager checks before it dials the plugin back.
        if r.version != "v1beta1" {
            return Err(tonic::Status::invalid_argument(format!(
                "unsupported version {:?}",
                r.version
            )));
        }
        let ok_name = r.resource_name.split_once('/').is_some_and(|(d, n)| {
            d.contains('.') && !n.is_empty() && !d.ends_with("kubernetes.io")
        });
        if !ok_name {
            return Err(tonic::Status::invalid_argument(
                "not an extended resource name",
            ));
        }
        use std::os::unix::fs::FileTypeExt;
        if r.endpoint.contains('/')
            || !std::fs::metadata(self.dir.join(&r.endpoint))
                .is_ok_and(|m| m.file_type().is_socket())
        {
            return Err(tonic::Status::invalid_argument(
                "no plugin socket at the endpoint",
            ));
        }
        self.seen.lock().unwrap().push(r);
        Ok(tonic::Response::new(Empty {}))
    }
}

pub struct FakeKubelet {
    pub rt: tokio::runtime::Runtime,
    dir: tempfile::TempDir,
    seen: Registrations,
    server: Option<tokio::task::JoinHandle<()>>,
}

impl FakeKubelet {
    /// Serves `kubelet.sock` in a new temporary directory.
    pub fn start() -> FakeKubelet {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        // Short: a unix socket path has at most 108 bytes.
        let dir = tempfile::Builder::new().prefix("kl").tempdir().unwrap();
        let mut k = FakeKubelet {
            rt,
            dir,
            seen: Arc::default(),
            server: None,
        };
        k.serve();
        k
    }

    fn serve(&mut self) {
        let sock = self.dir().join("kubelet.sock");
        let _ = std::fs::remove_file(&sock);
        let _guard = self.rt.enter();
        let listener = tokio::net::UnixListener::bind(&sock).unwrap();
        let reg = Reg {
            dir: self.dir().to_path_buf(),
            seen: self.seen.clone(),
        };
        self.server = Some(self.rt.spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(reg))
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
                .await;
        }));
    }

    /// The device-plugin directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// What a kubelet restart does: stops, removes every socket in the directory (the plugins'
    /// too), serves a new `kubelet.sock`.
    pub fn restart(&mut self) {
        if let Some(s) = self.server.take() {
            s.abort();
        }
        for e in std::fs::read_dir(self.dir()).unwrap().flatten() {
            let _ = std::fs::remove_file(e.path());
        }
        self.serve();
    }

    /// The `n`th accepted registration (1-based), waiting up to `limit`.
    pub fn registration(&self, n: usize, limit: Duration) -> Option<RegisterRequest> {
        crate::until(limit, || self.seen.lock().unwrap().len() >= n)?;
        self.seen.lock().unwrap().get(n - 1).cloned()
    }

    pub fn registrations(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    /// Dials the plugin back at `endpoint` and opens its `ListAndWatch`, as the kubelet does
    /// after a registration.
    pub fn dial(&self, endpoint: &str) -> PluginConn {
        let sock = self.dir().join(endpoint);
        let channel = self
            .rt
            .block_on(libshare_k8s::plugin::connect(&sock))
            .unwrap();
        let mut client = DevicePluginClient::new(channel);
        let lists: Arc<Mutex<Vec<Vec<Device>>>> = Arc::default();
        let mut watch = client.clone();
        let l = lists.clone();
        self.rt.spawn(async move {
            let Ok(resp) = watch.list_and_watch(Empty {}).await else {
                return;
            };
            let mut stream = resp.into_inner();
            while let Ok(Some(list)) = stream.message().await {
                l.lock().unwrap().push(list.devices);
            }
        });
        let options = self
            .rt
            .block_on(client.get_device_plugin_options(Empty {}))
            .unwrap()
            .into_inner();
        PluginConn {
            client,
            lists,
            options,
        }
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            s.abort();
        }
    }
}

/// The kubelet's connection to the plugin.
pub struct PluginConn {
    client: DevicePluginClient<Channel>,
    lists: Arc<Mutex<Vec<Vec<Device>>>>,
    pub options: DevicePluginOptions,
}

impl PluginConn {
    /// The lists `ListAndWatch` sent so far.
    pub fn lists(&self) -> Vec<Vec<Device>> {
        self.lists.lock().unwrap().clone()
    }

    /// Waits for a list `want` accepts; its ids (healthy ones only).
    pub fn wait_list(
        &self,
        limit: Duration,
        want: impl Fn(&[String]) -> bool,
    ) -> Option<Vec<String>> {
        let mut found = None;
        crate::until(limit, || {
            let l = self.lists.lock().unwrap();
            found = l.last().map(|d| {
                d.iter()
                    .filter(|d| d.health == "Healthy")
                    .map(|d| d.id.clone())
                    .collect::<Vec<_>>()
            });
            found.as_deref().is_some_and(&want)
        })?;
        found
    }

    pub fn preferred(
        &mut self,
        kl: &FakeKubelet,
        available: &[String],
        must: &[String],
        size: i32,
    ) -> Vec<String> {
        let req = PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: available.to_vec(),
                must_include_device_i_ds: must.to_vec(),
                allocation_size: size,
            }],
        };
        let r = kl
            .rt
            .block_on(self.client.get_preferred_allocation(req))
            .unwrap()
            .into_inner();
        r.container_responses[0].device_i_ds.clone()
    }

    /// `Allocate` for one pod whose containers ask for `containers` (device ids each).
    pub fn allocate(
        &mut self,
        kl: &FakeKubelet,
        containers: &[Vec<String>],
    ) -> Result<AllocateResponse, tonic::Status> {
        let req = AllocateRequest {
            container_requests: containers
                .iter()
                .map(|ids| ContainerAllocateRequest {
                    devices_ids: ids.clone(),
                })
                .collect(),
        };
        kl.rt
            .block_on(self.client.allocate(req))
            .map(|r| r.into_inner())
    }
}

/// Whether a kubelet (one answer per container asked for) and a CDI runtime (every CDI device
/// fully qualified and resolvable from a spec in `cdi_dir` of a version it reads; env names
/// valid; annotation keys qualified names; mounts absolute host paths that exist) take `resp`.
pub fn check_allocate(resp: &AllocateResponse, containers: usize, cdi_dir: &Path) {
    assert_eq!(
        resp.container_responses.len(),
        containers,
        "one answer per container"
    );
    for c in &resp.container_responses {
        assert!(!c.cdi_devices.is_empty(), "a CDI device: {c:?}");
        for d in &c.cdi_devices {
            let (kind, name) = d.name.split_once('=').expect("kind=name");
            let (vendor, class) = kind.split_once('/').expect("vendor/class");
            assert!(
                vendor.contains('.') && !class.is_empty() && !name.is_empty(),
                "{}",
                d.name
            );
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b)),
                "{}",
                d.name
            );
            let found = std::fs::read_dir(cdi_dir).unwrap().flatten().any(|e| {
                let Ok(text) = std::fs::read_to_string(e.path()) else {
                    return false;
                };
                let Ok(spec) = serde_json::from_str::<serde_json::Value>(&text) else {
                    return false;
                };
                spec["kind"] == kind
                    && ["0.5.0", "0.6.0", "0.7.0", "0.8.0"]
                        .contains(&spec["cdiVersion"].as_str().unwrap_or(""))
                    && spec["devices"]
                        .as_array()
                        .is_some_and(|ds| ds.iter().any(|x| x["name"] == name))
            });
            assert!(
                found,
                "{} resolves to a spec in {}",
                d.name,
                cdi_dir.display()
            );
        }
        for k in c.envs.keys() {
            assert!(
                !k.is_empty()
                    && !k.starts_with(|c: char| c.is_ascii_digit())
                    && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'),
                "env {k}"
            );
        }
        for k in c.annotations.keys() {
            let (prefix, name) = k.split_once('/').unwrap_or(("", k));
            assert!(
                name.len() <= 63 && !name.is_empty() && prefix.len() <= 253,
                "annotation {k}"
            );
        }
        for m in &c.mounts {
            assert!(m.container_path.starts_with('/'), "{m:?}");
            assert!(Path::new(&m.host_path).exists(), "{m:?}");
        }
    }
}
