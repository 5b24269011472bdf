//! The device plugin: serves `DevicePlugin` on `<plugin dir>/<endpoint>`, registers with the
//! kubelet on `<plugin dir>/kubelet.sock`, and keeps both up:
//! - the devices (shares) come from the node's GPUs as NVML reports them ([`Node::devices`],
//!   asked every `rescan`); when the list changes (a GPU gone after a driver restart),
//!   `ListAndWatch` sends the new list;
//! - a kubelet restart removes the plugin's socket and makes a new `kubelet.sock`: the plugin
//!   notices either within a second, serves a new socket and registers again;
//! - `Allocate` checks every id against what it advertises now, records the allocation on the
//!   host (`allocation.rs`) and the CDI spec naming it (`Node::cdi_spec`), and answers with the
//!   CDI device (plus `CUDA_VISIBLE_DEVICES` and the allocation's annotation). A bad request is
//!   one gRPC error and writes nothing.

// tonic's service traits fix `Result<_, tonic::Status>` (a large error) as the answer type.
#![allow(clippy::result_large_err)]

use crate::allocation::{self, Allocation, ALLOCATION_ANNOTATION};
use crate::api::device_plugin_server::{DevicePlugin, DevicePluginServer};
use crate::api::registration_client::RegistrationClient;
use crate::api::*;
use crate::shares;
use libshare_abi::admin::Class;
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::watch;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

/// The API version this plugin speaks.
pub const VERSION: &str = "v1beta1";

/// What the plugin needs from the node (the CLI provides it).
pub trait Node: Send + Sync + 'static {
    /// Each GPU's total memory, from NVML (never from simgpu's files); `Err` says why none.
    fn devices(&self) -> Result<Vec<u64>, String>;
    /// The CDI spec (JSON) whose one device, `<kind>=<allocation name>`, injects libshare and
    /// names the allocation to the hook.
    fn cdi_spec(&self, a: &Allocation, visible: &str) -> serde_json::Value;
}

/// One mount the answer carries for a kubelet without CDI.
#[derive(Clone, Debug)]
pub struct LegacyMount {
    pub host: PathBuf,
    pub container: String,
    pub read_only: bool,
}

#[derive(Clone, Debug)]
pub struct Config {
    /// The kubelet's device-plugin directory (`/var/lib/kubelet/device-plugins`).
    pub plugin_dir: PathBuf,
    /// This plugin's socket file name in it.
    pub endpoint: String,
    /// The extended resource, e.g. `libshare.dev/gpu-memory`.
    pub resource: String,
    /// Bytes of one share.
    pub share_bytes: u64,
    /// How often NVML is asked for the GPUs.
    pub rescan: Duration,
    /// The daemon's state directory (allocations go to `<dir>/k8s/`).
    pub state_dir: PathBuf,
    /// Where the CDI specs of allocations are written (`/var/run/cdi`).
    pub cdi_dir: PathBuf,
    /// CDI kind (`libshare.dev/gpu`).
    pub cdi_kind: String,
    pub default_class: Class,
    /// Namespaces whose pods may be production (`*`: all), recorded with each allocation for
    /// the hook.
    pub production_namespaces: Vec<String>,
    /// Mounts for a kubelet without CDI (empty: CDI only).
    pub legacy_mounts: Vec<LegacyMount>,
}

/// Why the plugin stops.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("cannot serve {path}: {err}")]
    Serve { path: PathBuf, err: std::io::Error },
    #[error("{0}")]
    Config(String),
}

/// The advertised list: share ids and their health.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Devices {
    pub ids: Vec<String>,
    pub healthy: bool,
}

struct Plugin {
    cfg: Config,
    node: Arc<dyn Node>,
    devices: watch::Receiver<Devices>,
    /// Allocations are written one at a time (a share's old record is removed by the new one).
    write: tokio::sync::Mutex<()>,
}

type Stream2<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

fn to_list(d: &Devices) -> ListAndWatchResponse {
    let health = if d.healthy { "Healthy" } else { "Unhealthy" };
    ListAndWatchResponse {
        devices: d
            .ids
            .iter()
            .map(|id| Device {
                id: id.clone(),
                health: health.into(),
                topology: None,
            })
            .collect(),
    }
}

#[tonic::async_trait]
impl DevicePlugin for Plugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    type ListAndWatchStream = Stream2<ListAndWatchResponse>;

    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let s =
            tokio_stream::wrappers::WatchStream::new(self.devices.clone()).map(|d| Ok(to_list(&d)));
        Ok(Response::new(Box::pin(s)))
    }

    async fn get_preferred_allocation(
        &self,
        req: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let container_responses = req
            .into_inner()
            .container_requests
            .iter()
            .map(|c| ContainerPreferredAllocationResponse {
                device_i_ds: shares::preferred(
                    &c.available_device_i_ds,
                    &c.must_include_device_i_ds,
                    c.allocation_size.max(0) as usize,
                ),
            })
            .collect();
        Ok(Response::new(PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        req: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let known = self.devices.borrow().clone();
        let reqs = req.into_inner().container_requests;
        // Every container's ids checked (and disjoint) before anything is written.
        let mut grants = Vec::with_capacity(reqs.len());
        let mut seen: Vec<&String> = Vec::new();
        for c in &reqs {
            let g = shares::grant(&c.devices_ids, &known.ids)
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
            for id in &c.devices_ids {
                if seen.contains(&id) {
                    return Err(Status::invalid_argument(format!(
                        "device id {id:?} is asked for by two containers of one pod: each share is granted once"
                    )));
                }
                seen.push(id);
            }
            grants.push(g);
        }
        let _one = self.write.lock().await;
        let mut container_responses = Vec::with_capacity(grants.len());
        for g in grants {
            let a = Allocation {
                name: g.name(),
                ids: g.ids.clone(),
                quota: g
                    .per_gpu
                    .iter()
                    .map(|(gpu, n)| (*gpu, u64::from(*n) * self.cfg.share_bytes))
                    .collect(),
                default_class: self.cfg.default_class,
                production_namespaces: self.cfg.production_namespaces.clone(),
            };
            self.record(&a, &g.visible()).map_err(|e| {
                tracing::error!("{e}");
                Status::internal(e)
            })?;
            tracing::info!(
                "allocated {} ({} share(s), GPU {})",
                a.name,
                a.ids.len(),
                g.visible()
            );
            container_responses.push(self.answer(&a, &g.visible()));
        }
        Ok(Response::new(AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

fn options() -> DevicePluginOptions {
    DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

impl Plugin {
    /// `<cdi dir>/<kind, '/' as '_'>-<name>.json`: specs of other kinds (other nodes' tests,
    /// `cdi generate`'s) never share a file name with these.
    fn spec_path(&self, name: &str) -> PathBuf {
        spec_path(&self.cfg.cdi_dir, &self.cfg.cdi_kind, name)
    }

    /// Writes the allocation and its CDI spec (each atomically), after removing the records
    /// of earlier allocations sharing a share with it (the kubelet frees shares before it
    /// gives them again, so those are gone): a share is in at most one record.
    fn record(&self, a: &Allocation, visible: &str) -> Result<(), String> {
        let dir = allocation::dir(&self.cfg.state_dir);
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(old) = name.strip_suffix(".json") else {
                    continue;
                };
                if old == a.name {
                    continue;
                }
                if let Ok(o) = allocation::read(&self.cfg.state_dir, old) {
                    if o.ids.iter().any(|id| a.ids.contains(id)) {
                        let _ = std::fs::remove_file(self.spec_path(old));
                        let _ = std::fs::remove_file(e.path());
                    }
                }
            }
        }
        let spec = self.node.cdi_spec(a, visible);
        write_atomic(
            &dir.join(format!("{}.json", a.name)),
            &serde_json::to_vec_pretty(a).expect("an allocation serialises"),
        )?;
        write_atomic(
            &self.spec_path(&a.name),
            &serde_json::to_vec_pretty(&spec).expect("a spec serialises"),
        )
    }

    fn answer(&self, a: &Allocation, visible: &str) -> ContainerAllocateResponse {
        let envs = HashMap::from([("CUDA_VISIBLE_DEVICES".to_string(), visible.to_string())]);
        let annotations = HashMap::from([(ALLOCATION_ANNOTATION.to_string(), a.name.clone())]);
        ContainerAllocateResponse {
            envs,
            mounts: self
                .cfg
                .legacy_mounts
                .iter()
                .map(|m| Mount {
                    container_path: m.container.clone(),
                    host_path: m.host.display().to_string(),
                    read_only: m.read_only,
                })
                .collect(),
            devices: Vec::new(),
            annotations,
            cdi_devices: vec![CdiDevice {
                name: format!("{}={}", self.cfg.cdi_kind, a.name),
            }],
        }
    }
}

/// Where the CDI spec of allocation `name` is.
pub fn spec_path(cdi_dir: &Path, kind: &str, name: &str) -> PathBuf {
    cdi_dir.join(format!("{}-{name}.json", kind.replace('/', "_")))
}

/// An allocation's files: root's, replaced atomically (`libshare_abi::fsafe`).
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), String> {
    libshare_abi::fsafe::write_atomic(path, bytes, 0o644).map_err(|e| e.to_string())
}

/// The devices NVML reports now, as shares; unhealthy (the last list) when NVML fails.
fn scan(node: &dyn Node, cfg: &Config, last: &Devices, said: &mut Option<String>) -> Devices {
    match node.devices() {
        Ok(totals) => {
            if said.take().is_some() {
                tracing::info!("NVML answers again: {} GPU(s)", totals.len());
            }
            Devices {
                ids: shares::advertised(&totals, cfg.share_bytes),
                healthy: true,
            }
        }
        Err(e) => {
            if said.as_deref() != Some(e.as_str()) {
                tracing::warn!("cannot list the GPUs ({e}): their shares are reported unhealthy");
                *said = Some(e);
            }
            Devices {
                ids: last.ids.clone(),
                healthy: false,
            }
        }
    }
}

/// The identity of a file (to notice a new `kubelet.sock`).
fn inode(p: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

async fn register(cfg: &Config) -> Result<(), String> {
    let sock = cfg.plugin_dir.join("kubelet.sock");
    let channel = connect(&sock).await?;
    let mut client = RegistrationClient::new(channel);
    client
        .register(RegisterRequest {
            version: VERSION.into(),
            endpoint: cfg.endpoint.clone(),
            resource_name: cfg.resource.clone(),
            options: Some(options()),
        })
        .await
        .map_err(|e| format!("the kubelet refused the registration: {}", e.message()))?;
    Ok(())
}

/// A gRPC channel over a unix socket.
pub async fn connect(sock: &Path) -> Result<tonic::transport::Channel, String> {
    let path = sock.to_path_buf();
    tonic::transport::Endpoint::from_static("http://[::]:50051")
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
        .map_err(|e| format!("cannot connect to {}: {e}", sock.display()))
}

/// Checks what the plugin was given; one line saying what is wrong.
pub fn check(cfg: &Config) -> Result<(), PluginError> {
    let bad = |m: String| Err(PluginError::Config(m));
    let Some((domain, name)) = cfg.resource.split_once('/') else {
        return bad(format!(
            "--resource {}: expected domain/name, e.g. libshare.dev/gpu-memory",
            cfg.resource
        ));
    };
    if !domain.contains('.') || name.is_empty() || domain.ends_with("kubernetes.io") {
        return bad(format!(
            "--resource {}: expected an extended resource outside kubernetes.io, e.g. libshare.dev/gpu-memory",
            cfg.resource
        ));
    }
    if cfg.endpoint.is_empty() || cfg.endpoint.contains('/') || cfg.endpoint == "kubelet.sock" {
        return bad(format!(
            "--endpoint {}: expected a socket file name in the plugin directory",
            cfg.endpoint
        ));
    }
    if cfg.share_bytes < libshare_abi::admin::MIN_QUOTA {
        return bad("--share: a share below 16MiB holds no CUDA context".into());
    }
    Ok(())
}

/// SIGTERM's and SIGINT's streams (what stops a plugin).
pub(crate) fn signals() -> Result<(Signal, Signal), PluginError> {
    let on = |kind: SignalKind, name: &str| {
        signal(kind).map_err(|err| PluginError::Serve {
            path: name.into(),
            err,
        })
    };
    Ok((
        on(SignalKind::terminate(), "SIGTERM")?,
        on(SignalKind::interrupt(), "SIGINT")?,
    ))
}

/// Runs until SIGTERM or SIGINT: serves, registers, re-registers after a kubelet restart, and
/// rescans the GPUs.
pub async fn run(cfg: Config, node: Arc<dyn Node>) -> Result<(), PluginError> {
    check(&cfg)?;
    for d in [&cfg.plugin_dir, &cfg.cdi_dir] {
        std::fs::create_dir_all(d).map_err(|err| PluginError::Serve {
            path: d.clone(),
            err,
        })?;
    }
    let mut said = None;
    let first = scan(&*node, &cfg, &Devices::default(), &mut said);
    tracing::info!(
        "{} share(s) of {} MiB on this node's GPUs",
        first.ids.len(),
        cfg.share_bytes >> 20
    );
    let (tx, rx) = watch::channel(first);
    let (mut term, mut int) = signals()?;
    let sock = cfg.plugin_dir.join(&cfg.endpoint);
    let kubelet = cfg.plugin_dir.join("kubelet.sock");
    let mut rescan = tokio::time::interval(cfg.rescan);
    rescan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // Serve first: the kubelet dials back as soon as it accepts the registration.
        let _ = std::fs::remove_file(&sock);
        let listener = tokio::net::UnixListener::bind(&sock).map_err(|err| PluginError::Serve {
            path: sock.clone(),
            err,
        })?;
        let ours = inode(&sock);
        let plugin = Plugin {
            cfg: cfg.clone(),
            node: node.clone(),
            devices: rx.clone(),
            write: tokio::sync::Mutex::new(()),
        };
        // Stopped by abort: a ListAndWatch stream never ends by itself.
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(DevicePluginServer::new(plugin))
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
        );
        // Register (the kubelet may not be up yet: ask again every second, one line).
        let mut registered_with = None;
        let mut said_wait = false;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let why = loop {
            tokio::select! {
                _ = term.recv() => break None,
                _ = int.recv() => break None,
                _ = rescan.tick() => {
                    let now = scan(&*node, &cfg, &tx.borrow(), &mut said);
                    if *tx.borrow() != now {
                        tracing::info!("the node's GPUs changed: {} share(s) now", now.ids.len());
                        let _ = tx.send(now);
                    }
                }
                _ = tick.tick() => {
                    if inode(&sock) != ours {
                        break Some("the plugin's socket was removed (kubelet restart)");
                    }
                    let k = inode(&kubelet);
                    if registered_with.is_some() && k != registered_with {
                        break Some("the kubelet's socket changed (kubelet restart)");
                    }
                    if registered_with.is_none() && k.is_some() {
                        match register(&cfg).await {
                            Ok(()) => {
                                tracing::info!(
                                    "registered {} with the kubelet ({})",
                                    cfg.resource,
                                    kubelet.display()
                                );
                                registered_with = k;
                            }
                            Err(e) if !said_wait => {
                                tracing::warn!("{e}; asking again every second");
                                said_wait = true;
                            }
                            Err(_) => {}
                        }
                    }
                }
            }
        };
        server.abort();
        let _ = server.await;
        match why {
            None => {
                let _ = std::fs::remove_file(&sock);
                tracing::info!("stopped");
                return Ok(());
            }
            Some(why) => tracing::info!("{why}: serving again and registering anew"),
        }
    }
}
