//! The DRA plugin's life with the kubelet and the API server:
//! - registration through the kubelet's plugin watcher: `Registration` served on
//!   `<registry dir>/gpu.libshare.dev-reg.sock` (`GetInfo`: type `DRAPlugin`, the service
//!   socket, versions `v1.DRAPlugin` and `v1beta1.DRAPlugin`; `NotifyRegistrationStatus` logged).
//!   The kubelet finds the socket when it starts, so a kubelet restart needs nothing; a socket
//!   removed is served again within a second.
//! - `DRAPlugin` (`v1`, and `v1beta1` through the same code) on `<plugin dir>/dra.sock`:
//!   `NodePrepareResources` reads each claim from the API server, turns its allocation on this
//!   node into a quota and a class (`claim.rs`), records it (`store.rs`) and writes its CDI spec,
//!   then answers its devices with the claim's CDI device; a claim already recorded is answered
//!   from the record (the kubelet retries). `NodeUnprepareResources` removes the spec and the
//!   record; a claim this node never prepared is success. Both work across a plugin restart.
//! - the node's GPUs, asked of NVML in a fresh process every `rescan`, published as the node's
//!   ResourceSlice (`slice.rs`); the pool's generation moves when they change. An API server
//!   that does not answer is asked again with back-off (1 s doubling to 30 s), and said so.

// tonic's service traits fix `Result<_, tonic::Status>` (a large error) as the answer type.
#![allow(clippy::result_large_err)]

use super::api::registration::registration_server::{Registration, RegistrationServer};
use super::api::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use super::api::{v1, v1beta1};
use super::claim::{self, ClaimRef, Policy, Prepared};
use super::slice::{self, Inventory, MemoryPolicy};
use super::{quantity, store, DRIVER};
pub use crate::plugin::PluginError;
use k8s_openapi::api::resource::v1::{Device as SliceDevice, ResourceClaim, ResourceSlice};
use kube::api::{Api, PostParams};
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

/// The plugin service versions this plugin serves, as the kubelet names them.
pub const SUPPORTED_VERSIONS: [&str; 2] = ["v1.DRAPlugin", "v1beta1.DRAPlugin"];
/// The service socket's name in `--plugin-dir`.
pub const SERVICE_SOCKET: &str = "dra.sock";

/// The registration socket's name in `--registry-dir`.
pub fn registration_socket() -> String {
    format!("{DRIVER}-reg.sock")
}

/// What the plugin needs from the node (the CLI provides it).
pub trait Node: Send + Sync + 'static {
    /// The node's GPUs, from NVML (never from simgpu's files); `Err` says why none. May block.
    fn inventory(&self) -> Result<Inventory, String>;
    /// The CDI spec (JSON) of a prepared claim: one device, named after the claim's uid, whose
    /// edits inject libshare, select the claim's GPUs and run the hook that binds the claim.
    fn cdi_spec(&self, p: &Prepared) -> serde_json::Value;
}

#[derive(Clone, Debug)]
pub struct Config {
    /// This node's name (the pool's, and the one allocations must name).
    pub node_name: String,
    /// The kubelet's plugin watcher directory (`/var/lib/kubelet/plugins_registry`).
    pub registry_dir: PathBuf,
    /// Where the service socket is (`/var/lib/kubelet/plugins/gpu.libshare.dev`).
    pub plugin_dir: PathBuf,
    /// The daemon's state directory (prepared claims go to `<dir>/k8s/dra/`).
    pub state_dir: PathBuf,
    /// Where the CDI spec of each prepared claim is written (`/var/run/cdi`).
    pub cdi_dir: PathBuf,
    /// CDI kind of the claims' devices (`gpu.libshare.dev/claim`).
    pub cdi_kind: String,
    /// How often NVML is asked for the GPUs.
    pub rescan: Duration,
    /// How often the slice is checked against the API server when nothing changed.
    pub resync: Duration,
    pub policy: Policy,
    pub memory: MemoryPolicy,
    /// A kubeconfig to use instead of the pod's service account (or `$KUBECONFIG`).
    pub kubeconfig: Option<PathBuf>,
}

struct Shared {
    cfg: Config,
    node: Arc<dyn Node>,
    client: kube::Client,
    inventory: watch::Receiver<Result<Inventory, String>>,
    /// Claims are prepared and unprepared one at a time.
    one: tokio::sync::Mutex<()>,
}

/// `<cdi dir>/<kind, '/' as '_'>-<uid>.json`.
pub fn spec_path(cdi_dir: &Path, kind: &str, uid: &str) -> PathBuf {
    cdi_dir.join(format!("{}-{uid}.json", kind.replace('/', "_")))
}

impl Shared {
    fn spec_path(&self, uid: &str) -> PathBuf {
        spec_path(&self.cfg.cdi_dir, &self.cfg.cdi_kind, uid)
    }

    fn write_spec(&self, p: &Prepared) -> Result<(), String> {
        let spec = self.node.cdi_spec(p);
        let bytes = serde_json::to_vec_pretty(&spec).expect("a spec serialises");
        libshare_abi::fsafe::write_atomic(&self.spec_path(&p.uid), &bytes, 0o644)
            .map_err(|e| e.to_string())
    }

    async fn get_claim(&self, want: &ClaimRef) -> Result<ResourceClaim, String> {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &want.namespace);
        match api.get_opt(&want.name).await {
            Ok(Some(c)) => Ok(c),
            Ok(None) => Err(format!(
                "claim {want}: the API server has no such ResourceClaim (deleted?)"
            )),
            Err(e) => Err(format!(
                "claim {want}: cannot read it from the API server ({e}); the kubelet will ask again"
            )),
        }
    }

    /// Prepares one claim; its devices, or one line saying why not (nothing written then).
    async fn prepare(&self, c: &v1::Claim) -> Result<Vec<v1::Device>, String> {
        let want = ClaimRef {
            namespace: c.namespace.clone(),
            name: c.name.clone(),
            uid: c.uid.clone(),
        };
        if !store::valid_uid(&want.uid) || want.namespace.is_empty() || want.name.is_empty() {
            return Err(format!(
                "claim {want} (uid {:?}): expected a namespace, a name and a uid",
                want.uid
            ));
        }
        let state = &self.cfg.state_dir;
        if let Some(p) = store::read(state, &want.uid)? {
            if p.namespace != want.namespace || p.name != want.name {
                return Err(format!(
                    "claim {want}: uid {} was prepared for claim {}/{}",
                    want.uid, p.namespace, p.name
                ));
            }
            // Prepared before (the kubelet retries, or asks again after a restart): the same
            // answer; the spec written again if it went missing.
            if !self.spec_path(&p.uid).exists() {
                self.write_spec(&p)?;
            }
            return Ok(answer(&p));
        }
        let inv = self
            .inventory
            .borrow()
            .clone()
            .map_err(|e| format!("claim {want}: this node's GPUs are unknown ({e})"))?;
        let claim = self.get_claim(&want).await?;
        let cdi_device = format!("{}={}", self.cfg.cdi_kind, want.uid);
        let (p, notes) = claim::prepare(
            &want,
            &claim,
            &self.cfg.node_name,
            &inv,
            &self.cfg.policy,
            cdi_device,
        )?;
        for n in notes {
            tracing::info!("claim {want}: {n}");
        }
        // The record first: a plugin stopped between the two leaves something unprepare finds.
        store::write(state, &p)?;
        if let Err(e) = self.write_spec(&p) {
            let _ = store::remove(state, &p.uid);
            return Err(format!("claim {want}: {e}"));
        }
        let quota: Vec<String> = p
            .quota
            .iter()
            .map(|(g, b)| format!("{} on GPU {g}", quantity::format(*b)))
            .collect();
        tracing::info!(
            "prepared claim {want} (uid {}): {}, class {}{}{}",
            p.uid,
            quota.join(", "),
            p.class.name(),
            p.compute
                .map_or(String::new(), |c| format!(", compute cap {}%", c / 100)),
            if p.oversubscribe {
                ", oversubscribes"
            } else {
                ""
            }
        );
        Ok(answer(&p))
    }

    /// Unprepares one claim: its spec and record removed; unknown is success.
    fn unprepare(&self, c: &v1::Claim) -> Result<(), String> {
        let state = &self.cfg.state_dir;
        let Some(p) = store::read(state, &c.uid)? else {
            tracing::info!(
                "unprepare claim {}/{} (uid {}): not prepared on this node, nothing to do",
                c.namespace,
                c.name,
                c.uid
            );
            return Ok(());
        };
        match std::fs::remove_file(self.spec_path(&p.uid)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(format!(
                    "claim {}/{}: cannot remove its CDI spec ({e})",
                    p.namespace, p.name
                ))
            }
            _ => {}
        }
        store::remove(state, &p.uid)?;
        tracing::info!(
            "unprepared claim {}/{} (uid {})",
            p.namespace,
            p.name,
            p.uid
        );
        Ok(())
    }
}

/// The kubelet's answer for a prepared claim: each device with the claim's CDI device (the
/// runtime applies a spec's edits once, whatever number of its devices a container names).
fn answer(p: &Prepared) -> Vec<v1::Device> {
    p.devices
        .iter()
        .map(|d| v1::Device {
            request_names: vec![d.request.clone()],
            pool_name: d.pool.clone(),
            device_name: d.device.clone(),
            cdi_device_ids: vec![p.cdi_device.clone()],
        })
        .collect()
}

#[derive(Clone)]
struct DraV1(Arc<Shared>);

#[tonic::async_trait]
impl v1::dra_plugin_server::DraPlugin for DraV1 {
    async fn node_prepare_resources(
        &self,
        req: Request<v1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1::NodePrepareResourcesResponse>, Status> {
        let s = &self.0;
        let _one = s.one.lock().await;
        let mut claims = HashMap::new();
        for c in req.into_inner().claims {
            let r = match s.prepare(&c).await {
                Ok(devices) => v1::NodePrepareResourceResponse {
                    devices,
                    error: String::new(),
                },
                Err(e) => {
                    tracing::warn!("{e}");
                    v1::NodePrepareResourceResponse {
                        devices: Vec::new(),
                        error: e,
                    }
                }
            };
            claims.insert(c.uid.clone(), r);
        }
        Ok(Response::new(v1::NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<v1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1::NodeUnprepareResourcesResponse>, Status> {
        let s = &self.0;
        let _one = s.one.lock().await;
        let mut claims = HashMap::new();
        for c in req.into_inner().claims {
            let error = s.unprepare(&c).err().unwrap_or_default();
            if !error.is_empty() {
                tracing::warn!("{error}");
            }
            claims.insert(c.uid.clone(), v1::NodeUnprepareResourceResponse { error });
        }
        Ok(Response::new(v1::NodeUnprepareResourcesResponse { claims }))
    }
}

/// `v1beta1` has `v1`'s messages field for field: converted and served by the same code.
#[derive(Clone)]
struct DraV1beta1(DraV1);

fn claims_v1(c: Vec<v1beta1::Claim>) -> Vec<v1::Claim> {
    c.into_iter()
        .map(|c| v1::Claim {
            namespace: c.namespace,
            uid: c.uid,
            name: c.name,
        })
        .collect()
}

#[tonic::async_trait]
impl v1beta1::dra_plugin_server::DraPlugin for DraV1beta1 {
    async fn node_prepare_resources(
        &self,
        req: Request<v1beta1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodePrepareResourcesResponse>, Status> {
        use v1::dra_plugin_server::DraPlugin;
        let claims = claims_v1(req.into_inner().claims);
        let r = self
            .0
            .node_prepare_resources(Request::new(v1::NodePrepareResourcesRequest { claims }))
            .await?
            .into_inner();
        let claims = r
            .claims
            .into_iter()
            .map(|(uid, c)| {
                let devices = c
                    .devices
                    .into_iter()
                    .map(|d| v1beta1::Device {
                        request_names: d.request_names,
                        pool_name: d.pool_name,
                        device_name: d.device_name,
                        cdi_device_ids: d.cdi_device_ids,
                    })
                    .collect();
                let error = c.error;
                (uid, v1beta1::NodePrepareResourceResponse { devices, error })
            })
            .collect();
        Ok(Response::new(v1beta1::NodePrepareResourcesResponse {
            claims,
        }))
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<v1beta1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodeUnprepareResourcesResponse>, Status> {
        use v1::dra_plugin_server::DraPlugin;
        let claims = claims_v1(req.into_inner().claims);
        let r = self
            .0
            .node_unprepare_resources(Request::new(v1::NodeUnprepareResourcesRequest { claims }))
            .await?
            .into_inner();
        let claims = r
            .claims
            .into_iter()
            .map(|(uid, c)| {
                let error = c.error;
                (uid, v1beta1::NodeUnprepareResourceResponse { error })
            })
            .collect();
        Ok(Response::new(v1beta1::NodeUnprepareResourcesResponse {
            claims,
        }))
    }
}

struct Reg {
    endpoint: String,
}

#[tonic::async_trait]
impl Registration for Reg {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: "DRAPlugin".into(),
            name: DRIVER.into(),
            endpoint: self.endpoint.clone(),
            supported_versions: SUPPORTED_VERSIONS.map(String::from).to_vec(),
        }))
    }

    async fn notify_registration_status(
        &self,
        req: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let r = req.into_inner();
        if r.plugin_registered {
            tracing::info!("registered with the kubelet as DRA driver {DRIVER}");
        } else {
            tracing::error!(
                "the kubelet refused the registration of DRA driver {DRIVER}: {}",
                r.error
            );
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// The identity of a file (to notice a socket removed or replaced).
fn inode(p: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

fn bind(path: &Path) -> Result<tokio::net::UnixListener, PluginError> {
    let _ = std::fs::remove_file(path);
    tokio::net::UnixListener::bind(path).map_err(|err| PluginError::Serve {
        path: path.into(),
        err,
    })
}

/// Checks what the plugin was given; one line saying what is wrong.
pub fn check(cfg: &Config) -> Result<(), PluginError> {
    let bad = |m: String| Err(PluginError::Config(m));
    let n = &cfg.node_name;
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if n.is_empty() || n.len() > 200 || !n.split('.').all(label_ok) {
        return bad(format!(
            "--node-name {n:?}: expected this node's name as Kubernetes has it (a DNS subdomain; \
             in a pod: env NODE_NAME from spec.nodeName)"
        ));
    }
    for (what, p) in [
        ("--registry-dir", &cfg.registry_dir),
        ("--plugin-dir", &cfg.plugin_dir),
        ("--cdi-dir", &cfg.cdi_dir),
        ("--state-dir", &cfg.state_dir),
    ] {
        if !p.is_absolute() {
            return bad(format!("{what} {}: expected an absolute path", p.display()));
        }
    }
    // A unix socket path has at most 107 bytes.
    let longest = [
        cfg.registry_dir.join(registration_socket()),
        cfg.plugin_dir.join(SERVICE_SOCKET),
    ]
    .into_iter()
    .find(|p| p.as_os_str().len() > 107);
    if let Some(p) = longest {
        return bad(format!(
            "{}: a unix socket path has at most 107 bytes",
            p.display()
        ));
    }
    if cfg.memory.step < libshare_abi::admin::MIN_QUOTA || cfg.memory.default < cfg.memory.step {
        return bad(
            "--memory-step must be at least 16MiB and --memory-default at least the step".into(),
        );
    }
    if cfg.memory.default % cfg.memory.step != 0 {
        return bad("--memory-default must be a multiple of --memory-step".into());
    }
    Ok(())
}

async fn client(cfg: &Config) -> Result<kube::Client, PluginError> {
    let bad = |e: String| PluginError::Config(e);
    let mut c = match &cfg.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| bad(format!("--kubeconfig {}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .map_err(|e| bad(format!("--kubeconfig {}: {e}", path.display())))?
        }
        None => kube::Config::infer().await.map_err(|e| {
            bad(format!(
                "no API server to talk to ({e}): run in a pod with a service account, or give --kubeconfig"
            ))
        })?,
    };
    c.connect_timeout = Some(Duration::from_secs(5));
    c.read_timeout = Some(Duration::from_secs(15));
    c.write_timeout = Some(Duration::from_secs(15));
    let url = c.cluster_url.to_string();
    let client = kube::Client::try_from(c).map_err(|e| {
        bad(format!(
            "cannot make a client for the API server {url}: {e}"
        ))
    })?;
    tracing::info!("API server: {url}");
    Ok(client)
}

/// What one reconciliation of the slice did.
#[derive(Debug, PartialEq, Eq)]
enum Published {
    Unchanged,
    Created(i64),
    Updated(i64),
}

/// Makes the node's slice say `devices`. `last` is what this plugin last wrote (devices and
/// generation): the slice is compared with it rather than with what the API server returns, so
/// a server that drops or normalises a field it does not serve does not make the plugin bump
/// the generation on every check.
async fn reconcile(
    api: &Api<ResourceSlice>,
    node: &str,
    devices: &[SliceDevice],
    last: &mut Option<(Vec<SliceDevice>, i64)>,
) -> Result<Published, kube::Error> {
    let name = slice::slice_name(node);
    let pp = PostParams {
        field_manager: Some("sharectl-dra-plugin".into()),
        ..Default::default()
    };
    match api.get_opt(&name).await? {
        None => {
            let generation = last.as_ref().map_or(1, |(_, g)| g + 1);
            api.create(&pp, &slice::slice(node, devices.to_vec(), generation))
                .await?;
            *last = Some((devices.to_vec(), generation));
            Ok(Published::Created(generation))
        }
        Some(existing) => {
            let theirs = existing.spec.pool.generation;
            let same = match last {
                Some((d, g)) => d.as_slice() == devices && *g == theirs,
                None => existing.spec.devices.as_deref().unwrap_or_default() == devices,
            };
            if same && existing.spec.pool.name == node {
                *last = Some((devices.to_vec(), theirs));
                return Ok(Published::Unchanged);
            }
            let generation = theirs.max(last.as_ref().map_or(0, |(_, g)| *g)) + 1;
            let mut s = slice::slice(node, devices.to_vec(), generation);
            s.metadata.resource_version = existing.metadata.resource_version;
            api.replace(&name, &pp, &s).await?;
            *last = Some((devices.to_vec(), generation));
            Ok(Published::Updated(generation))
        }
    }
}

/// Keeps the node's slice current: at each change of the GPUs and every `resync`, with back-off
/// while the API server does not answer.
async fn publish(shared: Arc<Shared>) {
    let cfg = &shared.cfg;
    let api: Api<ResourceSlice> = Api::all(shared.client.clone());
    let mut inv_rx = shared.inventory.clone();
    let mut last: Option<(Vec<SliceDevice>, i64)> = None;
    let mut backoff = Duration::from_secs(1);
    let mut failing = false;
    loop {
        let inv = inv_rx.borrow_and_update().clone();
        let wait = match inv {
            // No GPU list yet: nothing to publish (the scan says why).
            Err(_) => cfg.resync,
            Ok(inv) => {
                let devices = slice::devices(&inv, cfg.memory);
                match reconcile(&api, &cfg.node_name, &devices, &mut last).await {
                    Ok(done) => {
                        if failing {
                            tracing::info!("the API server answers again");
                            failing = false;
                        }
                        backoff = Duration::from_secs(1);
                        let n = devices.len();
                        match done {
                            Published::Created(g) => tracing::info!(
                                "published ResourceSlice {} ({n} GPU(s), pool generation {g})",
                                slice::slice_name(&cfg.node_name)
                            ),
                            Published::Updated(g) => tracing::info!(
                                "updated ResourceSlice {} ({n} GPU(s), pool generation {g})",
                                slice::slice_name(&cfg.node_name)
                            ),
                            Published::Unchanged => {}
                        }
                        cfg.resync
                    }
                    Err(e) => {
                        tracing::warn!(
                            "cannot publish the node's ResourceSlice ({e}): the API server is asked again in {} s (back-off to 30 s)",
                            backoff.as_secs()
                        );
                        failing = true;
                        let w = backoff;
                        backoff = (backoff * 2).min(Duration::from_secs(30));
                        w
                    }
                }
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            r = inv_rx.changed() => if r.is_err() { return },
        }
    }
}

fn log_inventory(inv: &Result<Inventory, String>) {
    match inv {
        Ok(inv) => {
            let gpus: Vec<String> = inv
                .gpus
                .iter()
                .map(|g| format!("gpu-{} ({})", g.index, quantity::format(g.memory)))
                .collect();
            tracing::info!("the node's GPUs: {}", gpus.join(", "));
        }
        Err(e) => {
            tracing::warn!("cannot list the node's GPUs ({e}): the slice keeps the last list")
        }
    }
}

/// The node's GPUs, asked in a blocking task (the node runs a probe process).
async fn inventory(node: &Arc<dyn Node>) -> Result<Inventory, String> {
    let n = node.clone();
    tokio::task::spawn_blocking(move || n.inventory())
        .await
        .unwrap_or_else(|e| Err(format!("the NVML probe panicked: {e}")))
}

/// Asks the node for its GPUs every `rescan`; a change goes to `tx` (and so to the slice).
async fn scan(node: Arc<dyn Node>, rescan: Duration, tx: watch::Sender<Result<Inventory, String>>) {
    let mut tick = tokio::time::interval(rescan);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = inventory(&node).await;
        if *tx.borrow() == now {
            continue;
        }
        log_inventory(&now);
        if tx.send(now).is_err() {
            return;
        }
    }
}

/// Runs until SIGTERM or SIGINT.
pub async fn run(cfg: Config, node: Arc<dyn Node>) -> Result<(), PluginError> {
    check(&cfg)?;
    for d in [&cfg.registry_dir, &cfg.plugin_dir, &cfg.cdi_dir] {
        std::fs::create_dir_all(d).map_err(|err| PluginError::Serve {
            path: d.clone(),
            err,
        })?;
    }
    let client = client(&cfg).await?;
    // The GPUs are known before the kubelet can ask for a claim.
    let first = inventory(&node).await;
    log_inventory(&first);
    let (tx, rx) = watch::channel(first);
    tokio::spawn(scan(node.clone(), cfg.rescan, tx));
    let shared = Arc::new(Shared {
        cfg: cfg.clone(),
        node,
        client,
        inventory: rx,
        one: tokio::sync::Mutex::new(()),
    });
    let (mut term, mut int) = crate::plugin::signals()?;

    let service = cfg.plugin_dir.join(SERVICE_SOCKET);
    let listener = bind(&service)?;
    let v1 = DraV1(shared.clone());
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(v1::dra_plugin_server::DraPluginServer::new(v1.clone()))
            .add_service(v1beta1::dra_plugin_server::DraPluginServer::new(
                DraV1beta1(v1),
            ))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let publisher = tokio::spawn(publish(shared.clone()));
    tracing::info!(
        "DRA driver {DRIVER} on node {}: serving {}",
        cfg.node_name,
        service.display()
    );

    /// Why the registration server stops.
    enum Why {
        Signal,
        RegistrationGone,
        ServiceGone,
    }
    let reg_path = cfg.registry_dir.join(registration_socket());
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let why = loop {
        // Served (again): the kubelet's plugin watcher dials a socket that appears.
        let listener = bind(&reg_path)?;
        let ours = inode(&reg_path);
        let reg = Reg {
            endpoint: service.display().to_string(),
        };
        let registration = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(reg))
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
        );
        let why = loop {
            tokio::select! {
                _ = term.recv() => break Why::Signal,
                _ = int.recv() => break Why::Signal,
                _ = tick.tick() => {
                    if inode(&reg_path) != ours {
                        break Why::RegistrationGone;
                    }
                    if inode(&service).is_none() {
                        break Why::ServiceGone;
                    }
                }
            }
        };
        registration.abort();
        let _ = registration.await;
        match why {
            Why::RegistrationGone => {
                tracing::info!("the registration socket was removed: serving it again")
            }
            w => break w,
        }
    };
    // The registration socket goes first: the kubelet deregisters the driver.
    let _ = std::fs::remove_file(&reg_path);
    publisher.abort();
    server.abort();
    let _ = server.await;
    let _ = std::fs::remove_file(&service);
    if let Why::Signal = why {
        tracing::info!("stopped");
        Ok(())
    } else {
        Err(PluginError::Serve {
            path: service,
            err: std::io::Error::other("removed while serving: restart the plugin"),
        })
    }
}
