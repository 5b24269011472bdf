//! Prometheus metrics: every container's figures (read through [`crate::view`] at each scrape,
//! so they are those of the state files at that instant) and the control loop's health
//! ([`Health`]), encoded by the `prometheus-client` crate as OpenMetrics text (served to
//! Prometheus, which asks for it) and turned into Prometheus' text format 0.0.4 for everyone
//! else (`promtool`, node-exporter's textfile collector): [`to_prometheus_text`].
//!
//! Served by [`serve_http`] on a localhost address (`GET /metrics`) to the users [`Access`]
//! allows (root, the daemon's user, the uids an operator lists: the client's uid comes from the
//! kernel's socket table, `sockdiag.rs`); anyone else is answered 403 at once and holds
//! nothing. One thread polls every connection (non-blocking, a bounded request, read and write
//! deadlines, at most [`MAX_PER_UID`] per user and [`MAX_CONNECTIONS`] in all), so idle
//! connections cost a descriptor each, not a thread, and cannot starve the scraper. And/or
//! written by [`write_textfile_every`] to a file (mode 0640, written beside it, then renamed
//! over it: a reader never sees half a file; its group is the directory's where the directory
//! is setgid, e.g. node-exporter's).

use crate::controller::Health;
use crate::view::{self, gate_parts, NodeView};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The content type of what [`render`] returns.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The content type of [`to_prometheus_text`]'s output.
pub const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// Connections of allowed users held at once; more are answered 503 and closed.
pub const MAX_CONNECTIONS: usize = 64;
/// Connections one allowed user may hold at once; more are answered 503 and closed.
pub const MAX_PER_UID: usize = 8;
/// Longest request head read (request line and headers); longer is answered 431.
pub const MAX_REQUEST: usize = 8 * 1024;
/// How long a client may take to send its request.
pub const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a client may take to read the answer.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("cannot listen on {addr} for metrics: {err} (choose another --metrics-addr)")]
    Bind {
        addr: SocketAddr,
        err: std::io::Error,
    },
    #[error("metrics address {0} is not a loopback address: metrics are served on localhost only (e.g. 127.0.0.1:9400)")]
    NotLoopback(SocketAddr),
    #[error("cannot start the metrics thread: {0}")]
    Spawn(std::io::Error),
    #[error("cannot write the metrics textfile {}: {err}", path.display())]
    Textfile { path: PathBuf, err: String },
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Dev {
    container: String,
    device: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GateState {
    container: String,
    device: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Info {
    container: String,
    class: String,
    daemon_managed: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Container {
    container: String,
}

type GaugeF = Gauge<f64, AtomicU64>;
type CounterF = Counter<f64, AtomicU64>;

/// A per-(container, device) metric, registered and returned.
fn fam<M>(r: &mut Registry, name: &str, help: &str, unit: Option<Unit>) -> Family<Dev, M>
where
    M: prometheus_client::encoding::EncodeMetric
        + prometheus_client::metrics::TypedMetric
        + Clone
        + Default
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let f = Family::<Dev, M>::default();
    match unit {
        Some(u) => r.register_with_unit(name, help, u, f.clone()),
        None => r.register(name, help, f.clone()),
    }
    f
}

/// The metrics of `v` (and of the loop, when `health` is given) as OpenMetrics text.
pub fn encode(v: &NodeView, health: Option<&Health>) -> String {
    let mut r = Registry::with_prefix("libshare");
    let info = Family::<Info, Gauge>::default();
    r.register(
        "container_info",
        "A container (always 1): its class (production or opportunistic) and whether a daemon manages it",
        info.clone(),
    );
    let procs = Family::<Container, Gauge>::default();
    r.register(
        "container_processes",
        "Live processes of the container (holding a slot of its state file)",
        procs.clone(),
    );
    let used = fam::<Gauge>(
        &mut r,
        "memory_used",
        "Device memory the container holds",
        Some(Unit::Bytes),
    );
    let quota = fam::<Gauge>(
        &mut r,
        "memory_quota",
        "The container's device memory quota (0: no limit)",
        Some(Unit::Bytes),
    );
    let peak = fam::<Gauge>(
        &mut r,
        "memory_peak",
        "Highest device memory the container held, as its shims recorded it in its state file (since the file was created, not since the daemon started)",
        Some(Unit::Bytes),
    );
    let refused = fam::<Counter>(
        &mut r,
        "memory_refused",
        "Allocations refused because they would exceed the container's quota",
        None,
    );
    let demoted = fam::<Gauge>(
        &mut r,
        "memory_demoted",
        "Managed memory an oversubscribing container holds demoted to the host now (the demotion protocol)",
        Some(Unit::Bytes),
    );
    let demote_target = fam::<Gauge>(
        &mut r,
        "memory_demote_target",
        "Managed memory the daemon asks an oversubscribing container to hold demoted (0: none)",
        Some(Unit::Bytes),
    );
    let resident = fam::<Gauge>(
        &mut r,
        "memory_resident",
        "Memory a container holds on the device itself: its footprint less what is demoted to the host",
        Some(Unit::Bytes),
    );
    let migrations = fam::<Counter>(
        &mut r,
        "memory_migrations",
        "Whole allocations an oversubscribing container moved between the device and the host (demotions plus promotions)",
        None,
    );
    let waited_for = fam::<Counter>(
        &mut r,
        "memory_waited_for",
        "Bytes a protected production container's allocations waited to find free on the device",
        Some(Unit::Bytes),
    );
    let allocs = fam::<Counter>(&mut r, "memory_allocs", "Device memory allocations", None);
    let frees = fam::<Counter>(&mut r, "memory_frees", "Device memory frees", None);
    let launches = fam::<Counter>(
        &mut r,
        "launches",
        "Kernel and graph launches of the container (every process, alive or not)",
        None,
    );
    let gpu = fam::<CounterF>(
        &mut r,
        "gpu",
        "GPU time of the container's launches measured by its shims with events; opportunistic containers only (production launches are not timed, they stay at 0)",
        Some(Unit::Seconds),
    );
    let sliced = fam::<Counter>(
        &mut r,
        "sliced_launches",
        "Opportunistic launches that went as block ranges of their grid beside production (kernel slicing)",
        None,
    );
    let unsliced = fam::<Counter>(
        &mut r,
        "unsliced_launches",
        "Opportunistic launches longer than the latency budget that went whole: no PTX, a kernel the slicer refused or could not read, a slice module the driver did not load",
        None,
    );
    let throttled = fam::<CounterF>(
        &mut r,
        "throttled",
        "Time the container's launches were held at its compute gate (summed over waiting threads)",
        Some(Unit::Seconds),
    );
    let held = fam::<Gauge>(
        &mut r,
        "gate_held_threads",
        "Threads waiting at the gate now",
        None,
    );
    let in_flight = fam::<GaugeF>(
        &mut r,
        "gate_in_flight",
        "Estimated GPU time of the container's gated launches outstanding now",
        Some(Unit::Seconds),
    );
    let gate_state = Family::<GateState, Gauge>::default();
    r.register(
        "gate_state",
        "The compute gate the daemon wrote, one of open, paused, run (1 for the current state)",
        gate_state.clone(),
    );
    let bound = fam::<GaugeF>(
        &mut r,
        "gate_in_flight_bound",
        "In a run gate, the most GPU time the container may have outstanding (0: no bound)",
        Some(Unit::Seconds),
    );
    let window = fam::<Gauge>(
        &mut r,
        "gate_window",
        "1 if the gate bounds the container's work to a window (production's idle gap)",
        None,
    );
    let share = fam::<Gauge>(
        &mut r,
        "gate_share",
        "1 if the gate meters the container's work with its compute share (token bucket)",
        None,
    );
    let compute = fam::<GaugeF>(
        &mut r,
        "compute_share",
        "Compute share set by an admin (sharectl set --compute), fraction of the device (0: none)",
        Some(Unit::Other("ratio".into())),
    );
    let env_compute = fam::<GaugeF>(
        &mut r,
        "compute_env_share",
        "Compute share the container's environment asks for (CUDA_DEVICE_SM_LIMIT), fraction (0: none)",
        Some(Unit::Other("ratio".into())),
    );
    let weight = fam::<Gauge>(
        &mut r,
        "weight",
        "The container's weight among opportunistic containers",
        None,
    );
    let busy = fam::<Gauge>(
        &mut r,
        "busy",
        "1 while the container has launched work not yet seen drained",
        None,
    );
    for c in &v.containers {
        info.get_or_create(&Info {
            container: c.name.clone(),
            class: c.class.name().to_string(),
            daemon_managed: c.daemon_managed.to_string(),
        })
        .set(1);
        procs
            .get_or_create(&Container {
                container: c.name.clone(),
            })
            .set(c.processes.len() as i64);
        for d in &c.devices {
            let l = Dev {
                container: c.name.clone(),
                device: d.device.to_string(),
            };
            let i = |x: u64| i64::try_from(x).unwrap_or(i64::MAX);
            used.get_or_create(&l).set(i(d.used));
            quota.get_or_create(&l).set(i(d.quota));
            peak.get_or_create(&l).set(i(d.peak));
            refused.get_or_create(&l).inc_by(d.refused);
            demoted.get_or_create(&l).set(i(d.demoted));
            demote_target.get_or_create(&l).set(i(d.demote_target));
            migrations.get_or_create(&l).inc_by(d.migrations);
            resident.get_or_create(&l).set(i(d.resident()));
            waited_for.get_or_create(&l).inc_by(d.waited_for);
            allocs.get_or_create(&l).inc_by(d.allocs);
            frees.get_or_create(&l).inc_by(d.frees);
            launches.get_or_create(&l).inc_by(d.launches);
            gpu.get_or_create(&l).inc_by(d.gpu_ns as f64 / 1e9);
            throttled.get_or_create(&l).inc_by(d.held_ns as f64 / 1e9);
            sliced.get_or_create(&l).inc_by(d.sliced);
            unsliced.get_or_create(&l).inc_by(d.unsliced);
            held.get_or_create(&l).set(d.held_threads.into());
            in_flight.get_or_create(&l).set(d.in_flight_ns as f64 / 1e9);
            let (state, bound_us, win, sh) = gate_parts(d.gate);
            for s in ["open", "paused", "run"] {
                gate_state
                    .get_or_create(&GateState {
                        container: c.name.clone(),
                        device: l.device.clone(),
                        state: s.to_string(),
                    })
                    .set((s == state).into());
            }
            bound.get_or_create(&l).set(bound_us as f64 / 1e6);
            window.get_or_create(&l).set(win.into());
            share.get_or_create(&l).set(sh.into());
            compute.get_or_create(&l).set(d.compute_bp as f64 / 1e4);
            env_compute
                .get_or_create(&l)
                .set(d.env_compute_bp as f64 / 1e4);
            weight.get_or_create(&l).set(d.weight.max(1).into());
            busy.get_or_create(&l).set(d.busy.into());
        }
    }
    let errors = Gauge::<i64>::default();
    errors.set(v.errors.len() as i64);
    r.register(
        "state_read_errors",
        "Container state files that could not be read at this scrape (see sharectl status)",
        errors,
    );
    if let Some(h) = health {
        let g = |r: &mut Registry, name: &str, help: &str, v: i64| {
            let m = Gauge::<i64>::default();
            m.set(v);
            r.register(name, help, m);
        };
        let c = |r: &mut Registry, name: &str, help: &str, v: u64| {
            let m = Counter::<u64>::default();
            m.inc_by(v);
            r.register(name, help, m);
        };
        let sub = r.sub_registry_with_prefix("daemon");
        g(
            sub,
            "up",
            "1 while the daemon's control loop runs",
            h.running.load(Acquire).into(),
        );
        c(
            sub,
            "ticks",
            "Control-loop ticks at the period",
            h.ticks.load(Relaxed),
        );
        c(
            sub,
            "event_ticks",
            "Control-loop ticks run at once on a production container's phase change",
            h.event_ticks.load(Relaxed),
        );
        c(
            sub,
            "spurious_wakes",
            "Early wakes of the control loop by a phase word that did not change (no tick ran)",
            h.spurious_wakes.load(Relaxed),
        );
        c(
            sub,
            "overruns",
            "Period deadlines skipped because a tick ended past the next one",
            h.overruns.load(Relaxed),
        );
        let late = GaugeF::default();
        late.set(h.late_max_ns.load(Relaxed) as f64 / 1e9);
        sub.register_with_unit(
            "late_max",
            "Worst lateness of a periodic wake-up since the daemon started",
            Unit::Seconds,
            late,
        );
        let cpu = CounterF::default();
        cpu.inc_by(h.cpu_ns.load(Relaxed) as f64 / 1e9);
        sub.register_with_unit(
            "cpu",
            "CPU time of the control loop's thread (updated every 100 ms)",
            Unit::Seconds,
            cpu,
        );
        g(
            sub,
            "containers",
            "Containers the control loop steers",
            h.containers.load(Relaxed) as i64,
        );
        c(
            sub,
            "turn_switches",
            "Exclusive turns between oversubscribing containers whose working sets do not fit: switches (entering turns counts as one)",
            h.turn_switches.load(Relaxed),
        );
        g(
            sub,
            "turns_active",
            "Devices where oversubscribing containers take exclusive turns now",
            h.turns_active.load(Relaxed) as i64,
        );
        let q = GaugeF::default();
        q.set(h.turn_quantum_ns.load(Relaxed) as f64 / 1e9);
        sub.register_with_unit(
            "turn_quantum",
            "The turns' quantum in force (adaptive: 20 x the last switch's cost)",
            Unit::Seconds,
            q,
        );
        let cost = GaugeF::default();
        cost.set(h.turn_cost_ns.load(Relaxed) as f64 / 1e9);
        sub.register_with_unit(
            "turn_switch_cost",
            "The last switch's measured cost: demoting the outgoing working set, prefetching the incoming one",
            Unit::Seconds,
            cost,
        );
        let restores = Family::<Container, Counter>::default();
        sub.register(
            "state_restores",
            "Times the daemon rewrote a container's class, quota, share or weight that one of its jobs had overwritten in its state file",
            restores.clone(),
        );
        for (container, n) in h.restores.snapshot() {
            restores.get_or_create(&Container { container }).inc_by(n);
        }
    }
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &r);
    out
}

/// The same metrics in Prometheus' text format 0.0.4 (what `promtool check metrics`,
/// node-exporter's textfile collector and clients that do not ask for OpenMetrics read).
/// `prometheus-client` writes OpenMetrics only; the two formats differ in three points, fixed
/// here line by line: a counter family is named with its `_total` suffix in `# HELP` and
/// `# TYPE`, and there is no `# UNIT` nor `# EOF` line. Samples are left as they are (same
/// syntax; our HELP texts hold no quote, which OpenMetrics would escape and 0.0.4 would not).
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let lines: Vec<&str> = openmetrics.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if line == "# EOF" || line.starts_with("# UNIT ") {
            i += 1;
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            // The family's TYPE line follows its HELP line.
            let name = rest.split(' ').next().unwrap_or("");
            let counter = lines
                .get(i + 1)
                .is_some_and(|t| *t == format!("# TYPE {name} counter"));
            if counter {
                out.push_str(&format!("# HELP {name}_total{}\n", &rest[name.len()..]));
                out.push_str(&format!("# TYPE {name}_total counter\n"));
                i += 2;
                continue;
            }
        }
        out.push_str(line);
        out.push('\n');
        i += 1;
    }
    out
}

/// Reads the state directory and encodes its metrics. A directory that cannot be read gives
/// the health metrics alone and one read error.
pub fn render(state_dir: &Path, health: Option<&Health>) -> String {
    let v = view::read(state_dir).unwrap_or_else(|e| NodeView {
        containers: Vec::new(),
        errors: vec![e.to_string()],
    });
    encode(&v, health)
}

/// Who may read the metrics over HTTP: root, the daemon's own user, and the uids an operator
/// lists (`sharectl daemon --metrics-allow-uid`, e.g. Prometheus' user). Anyone else's
/// connection is answered 403 and closed at once: it holds nothing, and sees no container's
/// name or usage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    uids: Vec<u32>,
}

impl Access {
    /// Root, this process's effective uid, and `extra`.
    pub fn new(extra: &[u32]) -> Access {
        // SAFETY: geteuid cannot fail.
        let me = unsafe { libc::geteuid() };
        let mut uids = vec![0, me];
        uids.extend_from_slice(extra);
        uids.sort_unstable();
        uids.dedup();
        Access { uids }
    }

    pub fn allows(&self, uid: u32) -> bool {
        self.uids.contains(&uid)
    }
}

/// Serves `GET /metrics` on `addr` (a loopback address) to the users `access` allows, until
/// `stop` is set, on a thread of its own (returned). Bound before returning, so an address in
/// use is an error here.
pub fn serve_http(
    addr: SocketAddr,
    state_dir: PathBuf,
    health: Arc<Health>,
    access: Access,
    stop: &'static AtomicBool,
) -> Result<std::thread::JoinHandle<()>, MetricsError> {
    if !addr.ip().is_loopback() {
        return Err(MetricsError::NotLoopback(addr));
    }
    let listener = TcpListener::bind(addr).map_err(|err| MetricsError::Bind { addr, err })?;
    listener
        .set_nonblocking(true)
        .map_err(|err| MetricsError::Bind { addr, err })?;
    let bound = listener.local_addr().unwrap_or(addr);
    tracing::info!(addr = %bound, "metrics served at http://{bound}/metrics");
    std::thread::Builder::new()
        .name("metrics-http".into())
        .spawn(move || {
            Server {
                listener,
                state_dir,
                health,
                access,
                conns: Vec::new(),
            }
            .run(stop)
        })
        .map_err(MetricsError::Spawn)
}

/// One connection of an allowed user: reading its request head, then writing the answer.
struct Conn {
    stream: TcpStream,
    uid: u32,
    head: Vec<u8>,
    /// The answer, once the head is complete, and how much of it is written.
    out: Option<(Vec<u8>, usize)>,
    /// When it is dropped if not done: [`READ_TIMEOUT`] after accept, then [`WRITE_TIMEOUT`]
    /// after the answer was made.
    deadline: Instant,
}

/// The HTTP server: one thread, `poll` over the listener and the connections, non-blocking
/// sockets. A connection costs a descriptor and its buffers, never a thread, and lives at most
/// [`READ_TIMEOUT`] + [`WRITE_TIMEOUT`]; at most [`MAX_CONNECTIONS`] are held, and
/// [`MAX_PER_UID`] per user.
struct Server {
    listener: TcpListener,
    state_dir: PathBuf,
    health: Arc<Health>,
    access: Access,
    conns: Vec<Conn>,
}

impl Server {
    fn run(mut self, stop: &AtomicBool) {
        use nix::poll::{poll, PollFd, PollFlags};
        while !stop.load(Acquire) {
            let now = Instant::now();
            self.conns.retain(|c| c.deadline > now);
            // Wake every 200 ms to see `stop`, sooner for a deadline.
            let wait = self
                .conns
                .iter()
                .map(|c| c.deadline.saturating_duration_since(now))
                .min()
                .unwrap_or(Duration::from_millis(200))
                .min(Duration::from_millis(200));
            let ready: Vec<bool> = {
                let mut fds = Vec::with_capacity(self.conns.len() + 1);
                fds.push(PollFd::new(self.listener.as_fd(), PollFlags::POLLIN));
                for c in &self.conns {
                    let want = if c.out.is_some() {
                        PollFlags::POLLOUT
                    } else {
                        PollFlags::POLLIN
                    };
                    fds.push(PollFd::new(c.stream.as_fd(), want));
                }
                match poll(&mut fds, (wait.as_millis() as u16).max(1)) {
                    Ok(_) => fds.iter().map(|f| f.any().unwrap_or(false)).collect(),
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(e) => {
                        tracing::warn!("metrics: poll: {e}");
                        std::thread::sleep(Duration::from_millis(200));
                        continue;
                    }
                }
            };
            let mut done = vec![false; self.conns.len()];
            for (i, c) in self.conns.iter_mut().enumerate() {
                if ready[i + 1] {
                    done[i] = step(&self.state_dir, &self.health, c);
                }
            }
            let mut k = 0;
            self.conns.retain(|_| {
                k += 1;
                !done[k - 1]
            });
            if ready[0] {
                self.accept_all();
            }
        }
    }

    /// Takes every queued connection: a user `access` does not allow (or whose socket the
    /// kernel cannot name) is answered 403 and closed; past the caps, 503.
    fn accept_all(&mut self) {
        loop {
            let (stream, peer) = match self.listener.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    tracing::debug!("metrics: accept: {e}");
                    return;
                }
            };
            let _ = stream.set_nonblocking(true);
            let uid = stream
                .local_addr()
                .ok()
                .and_then(|local| crate::sockdiag::tcp_peer_uid(peer, local));
            let Some(uid) = uid.filter(|&u| self.access.allows(u)) else {
                let body = b"forbidden: this user may not read libshare's metrics (sharectl daemon --metrics-allow-uid)\n";
                let _ = (&stream).write(&response("403 Forbidden", "text/plain", body));
                continue;
            };
            let mine = self.conns.iter().filter(|c| c.uid == uid).count();
            if self.conns.len() >= MAX_CONNECTIONS || mine >= MAX_PER_UID {
                let _ = (&stream).write(&response(
                    "503 Service Unavailable",
                    "text/plain",
                    b"busy\n",
                ));
                continue;
            }
            self.conns.push(Conn {
                stream,
                uid,
                head: Vec::with_capacity(512),
                out: None,
                deadline: Instant::now() + READ_TIMEOUT,
            });
        }
    }
}

/// Reads or writes what `c` is ready for; true when it is done (answered, closed or broken).
fn step(state_dir: &Path, health: &Health, c: &mut Conn) -> bool {
    if let Some((out, sent)) = &mut c.out {
        return match (&c.stream).write(&out[*sent..]) {
            Ok(n) => {
                *sent += n;
                let finished = *sent >= out.len();
                if finished {
                    let _ = c.stream.shutdown(std::net::Shutdown::Write);
                }
                finished
            }
            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
        };
    }
    let mut buf = [0u8; 1024];
    match (&c.stream).read(&mut buf) {
        Ok(0) => return true,
        Ok(n) => c.head.extend_from_slice(&buf[..n]),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return false,
        Err(_) => return true,
    }
    let complete =
        c.head.windows(4).any(|w| w == b"\r\n\r\n") || c.head.windows(2).any(|w| w == b"\n\n");
    if c.head.len() > MAX_REQUEST {
        c.out = Some((
            response(
                "431 Request Header Fields Too Large",
                "text/plain",
                b"request too large\n",
            ),
            0,
        ));
    } else if complete {
        c.out = Some((answer(&c.head, state_dir, health), 0));
    } else {
        return false;
    }
    c.deadline = Instant::now() + WRITE_TIMEOUT;
    false
}

/// What to answer a request head: status, content type, body (None: the metrics).
fn route(head: &[u8]) -> (&'static str, Option<&'static str>) {
    let line = head.split(|&b| b == b'\n').next().unwrap_or(&[]);
    let line = std::str::from_utf8(line)
        .unwrap_or("")
        .trim_end_matches('\r');
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return ("400 Bad Request", Some("bad request\n"));
    };
    if !version.starts_with("HTTP/1.") {
        return ("400 Bad Request", Some("bad request\n"));
    }
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => ("200 OK", None),
        ("GET", _) => ("404 Not Found", Some("not found: try /metrics\n")),
        _ => ("405 Method Not Allowed", Some("only GET /metrics\n")),
    }
}

/// The whole answer to a complete request head.
fn answer(head: &[u8], state_dir: &Path, health: &Health) -> Vec<u8> {
    match route(head) {
        ("200 OK", None) => {
            // Prometheus asks for OpenMetrics in its Accept header; others get the 0.0.4 text.
            let head = String::from_utf8_lossy(head).to_ascii_lowercase();
            let body = render(state_dir, Some(health));
            if head.contains("application/openmetrics-text") {
                response("200 OK", CONTENT_TYPE, body.as_bytes())
            } else {
                let body = to_prometheus_text(&body);
                response("200 OK", PROMETHEUS_CONTENT_TYPE, body.as_bytes())
            }
        }
        (status, body) => response(status, "text/plain", body.unwrap_or("").as_bytes()),
    }
}

fn response(status: &str, ctype: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

/// Mode of the textfile: the metrics name every container, so others may not read them; the
/// group may (node-exporter's, where the directory is setgid to it).
pub const TEXTFILE_MODE: u32 = 0o640;

/// Writes the metrics to `path` once, through the one atomic writer
/// ([`libshare_abi::write_atomic_in`]: a new temporary file beside it, never an existing one nor
/// through a link, mode [`TEXTFILE_MODE`] whatever the umask, `fsync`, renamed over it). The
/// directory is node-exporter's or the operator's, not libshare's: it must exist, and its owner
/// and mode are not checked ([`libshare_abi::WriteDir::Unchecked`]).
pub fn write_textfile(path: &Path, text: &str) -> Result<(), MetricsError> {
    use libshare_abi::{StateError, WriteDir};
    libshare_abi::write_atomic_in(WriteDir::Unchecked, path, text.as_bytes(), TEXTFILE_MODE)
        .map_err(|e| MetricsError::Textfile {
            path: path.to_path_buf(),
            err: match e {
                // The file is named already: the system's reason alone.
                StateError::Io { err, .. } => err,
                e => e.to_string(),
            },
        })
}

/// Writes the textfile at once (an error here is returned: a wrong path is seen at start) and
/// then every `every` on a thread of its own until `stop` is set (later errors are logged).
pub fn write_textfile_every(
    path: PathBuf,
    every: Duration,
    state_dir: PathBuf,
    health: Arc<Health>,
    stop: &'static AtomicBool,
) -> Result<std::thread::JoinHandle<()>, MetricsError> {
    let text = |dir: &Path, h: &Health| to_prometheus_text(&render(dir, Some(h)));
    write_textfile(&path, &text(&state_dir, &health))?;
    std::thread::Builder::new()
        .name("metrics-textfile".into())
        .spawn(move || {
            let mut next = std::time::Instant::now() + every;
            while !stop.load(Acquire) {
                let now = std::time::Instant::now();
                if now < next {
                    std::thread::sleep((next - now).min(Duration::from_millis(100)));
                    continue;
                }
                next = now + every;
                if let Err(e) = write_textfile(&path, &text(&state_dir, &health)) {
                    tracing::warn!("{e}");
                }
            }
        })
        .map_err(MetricsError::Spawn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_is_root_the_daemons_user_and_the_listed_uids() {
        let a = Access::new(&[1234]);
        // SAFETY: geteuid cannot fail.
        let me = unsafe { libc::geteuid() };
        assert!(a.allows(0) && a.allows(me) && a.allows(1234));
        assert!(!a.allows(65534));
    }

    #[test]
    fn routes() {
        assert_eq!(route(b"GET /metrics HTTP/1.1\r\n\r\n").0, "200 OK");
        assert_eq!(route(b"GET /metrics?x=1 HTTP/1.0\r\n\r\n").0, "200 OK");
        assert_eq!(route(b"GET / HTTP/1.1\r\n\r\n").0, "404 Not Found");
        assert_eq!(
            route(b"POST /metrics HTTP/1.1\r\n\r\n").0,
            "405 Method Not Allowed"
        );
        assert_eq!(route(b"\x00\xff garbage\r\n\r\n").0, "400 Bad Request");
        assert_eq!(route(b"GET /metrics SMTP\r\n\r\n").0, "400 Bad Request");
    }

    #[test]
    fn encodes_a_container_and_the_health() {
        let dir = tempfile::tempdir().unwrap();
        let st = libshare_abi::State::open_or_create(&libshare_abi::container_dir(dir.path(), "a"))
            .unwrap();
        st.set_quota(0, 4096);
        st.device(0).used.store(100, Release);
        st.device(0).held_ns.store(1_500_000_000, Release);
        let h = Health::default();
        h.ticks.store(42, Relaxed);
        let text = render(dir.path(), Some(&h));
        for want in [
            "libshare_memory_quota_bytes{container=\"a\",device=\"0\"} 4096",
            "libshare_memory_used_bytes{container=\"a\",device=\"0\"} 100",
            "libshare_throttled_seconds_total{container=\"a\",device=\"0\"} 1.5",
            "libshare_container_info{container=\"a\",class=\"production\",daemon_managed=\"false\"} 1",
            "libshare_gate_state{container=\"a\",device=\"0\",state=\"open\"} 1",
            "libshare_daemon_ticks_total 42",
            "libshare_daemon_up 0",
        ] {
            assert!(text.contains(want), "{want} missing in:\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
        let p = to_prometheus_text(&text);
        assert!(p.contains(
            "# TYPE libshare_daemon_ticks_total counter\nlibshare_daemon_ticks_total 42\n"
        ));
        assert!(p.contains("# HELP libshare_daemon_ticks_total Control-loop ticks"));
        assert!(!p.contains("# EOF") && !p.contains("# UNIT"));
        assert!(p.contains("# TYPE libshare_memory_used_bytes gauge\n"));
    }

    #[test]
    fn textfile_is_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("libshare.prom");
        write_textfile(&p, "a 1\n").unwrap();
        write_textfile(&p, "a 2\n").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "a 2\n");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, TEXTFILE_MODE, "others may not read it");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        assert!(write_textfile(&dir.path().join("no/such/dir/x.prom"), "").is_err());
    }
}
