//! `sharectl daemon`: the node's control loop (`libshare_node::run`) until SIGTERM or SIGINT.

use anyhow::{anyhow, Result};
use clap::{Args, ValueEnum};
use libshare_node::server::ServerConfig;
use libshare_node::{ControllerConfig, PolicyKind};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PolicyArg {
    /// Production as if alone; opportunistic work in production's idle gaps, shares, weights.
    Libshare,
    /// Exclusive turns of --quantum among the jobs that want the GPU (nvshare-style baseline).
    TimeSlice,
}

#[derive(Args, Debug)]
pub struct DaemonArgs {
    /// State directory: containers are <DIR>/containers/<name>/state.shm (default:
    /// $LIBSHARE_STATE_DIR, else /run/libshare, else /tmp/libshare-<uid>).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Control period (100us..1s).
    #[arg(long, default_value = "5ms", value_parser = parse_duration)]
    pub period: u64,
    /// Sharing policy.
    #[arg(long, value_enum, default_value_t = PolicyArg::Libshare)]
    pub policy: PolicyArg,
    /// Time-slice quantum (policy time-slice).
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    pub quantum: u64,
    /// Serve Prometheus metrics at http://ADDR/metrics (a loopback address, e.g. 127.0.0.1:9400)
    /// to root, the daemon's user and --metrics-allow-uid; anyone else gets 403.
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// A user that may read --metrics-addr besides root and the daemon's user (repeatable; e.g.
    /// Prometheus' uid).
    #[arg(long, value_name = "UID")]
    pub metrics_allow_uid: Vec<u32>,
    /// Also write the metrics to this file every --metrics-interval (for node-exporter's
    /// textfile collector; written beside it and renamed over it).
    #[arg(long, value_name = "PATH")]
    pub metrics_textfile: Option<PathBuf>,
    /// How often the metrics textfile is rewritten (100ms..1h).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub metrics_interval: u64,
    /// Where `sharectl set` settings persist (default: <state dir>/settings.toml).
    #[arg(long, value_name = "PATH")]
    pub settings: Option<PathBuf>,
    /// The registration socket shims ask for their container's state (default:
    /// <state dir>/register/register.sock, in a directory of its own that containers get
    /// read-only, with <state dir>/register.sock a link to it; mode 0666, identity from the
    /// kernel).
    #[arg(long, value_name = "PATH")]
    pub register_socket: Option<PathBuf>,
    /// Trust the processes' environment: LIBSHARE_CONTAINER names the container of a process
    /// whose cgroup maps to none, and its limits and class apply where the daemon has no
    /// settings (plain hosts and tests, not multi-tenant nodes).
    #[arg(long)]
    pub trust_env: bool,
    /// A cgroup path prefix whose children are containers: PREFIX/<name>/... is container
    /// <name> (repeatable; docker, podman, containerd/CRI and CRI-O layouts are built in). Only
    /// root may be able to create cgroups in PREFIX (root-owned, not group/other-writable):
    /// a child someone else could make names nothing.
    #[arg(long, value_name = "PREFIX")]
    pub cgroup_prefix: Vec<String>,
    /// A parent cgroup a container runtime is configured to create its containers under
    /// (repeatable), besides the runtimes' defaults (/system.slice, /machine.slice,
    /// /kubepods.slice, /kubepods, /docker, /libpod_parent): a runtime's id names a container
    /// only under one of them, in a cgroup root made.
    #[arg(long, value_name = "CGROUP")]
    pub runtime_cgroup_parent: Vec<String>,
    /// New containers a non-root user's processes may name themselves (--trust-env) that
    /// exist at once; past it, a registration that would create one is refused.
    #[arg(long, value_name = "N", default_value_t = libshare_node::book::Limits::default().per_uid)]
    pub max_containers_per_uid: usize,
    /// New containers registrations may create from one cgroup (for a runtime's containers,
    /// the cgroup they are made in: /machine.slice, a pod's) that exist at once.
    #[arg(long, value_name = "N", default_value_t = libshare_node::book::Limits::default().per_cgroup)]
    pub max_containers_per_cgroup: usize,
    /// A container with no live process, nothing held and no settings is forgotten (its
    /// state removed) this long after its last registration (1s..1h).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub forget_after: u64,
    /// HAMi mode: a container with no settings adopts HAMi's variables from its first
    /// registering process (CUDA_DEVICE_MEMORY_LIMIT[_i], CUDA_DEVICE_SM_LIMIT[_i],
    /// CUDA_TASK_PRIORITY, CUDA_OVERSUBSCRIBE), and the registration socket's directory is
    /// mounted read-only at <--hami-dir>/libshare, which HAMi mounts into every container
    /// (the daemon does it when root; else mount it before starting the daemon).
    #[arg(long)]
    pub hami: bool,
    /// HAMi's lock directory, mounted read-write into every container by HAMi's device plugin.
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/tmp/vgpulock",
        requires = "hami"
    )]
    pub hami_dir: PathBuf,
    /// Defaults for every container (TOML: `[defaults] class = "opportunistic"`,
    /// `[defaults.all] memory = 8589934592`).
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Do not run the demotion protocol: production's allocations beside oversubscribing
    /// containers rely on the driver's eviction alone (the hints-only baseline of bench S4).
    #[arg(long)]
    pub no_demotion: bool,
    /// Exclusive turns between oversubscribing containers whose working sets do not fit
    /// together: a fixed quantum (e.g. 30s, nvshare-style) instead of the adaptive one (20 ×
    /// the measured cost of a switch).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, conflicts_with = "no_turns")]
    pub turn_quantum: Option<u64>,
    /// Never give oversubscribing containers exclusive turns (they co-run however much they
    /// thrash).
    #[arg(long)]
    pub no_turns: bool,
    /// What opportunistic work production may meet when it arrives on a GPU it has used, however
    /// wrong a prediction of its arrivals: a time (e.g. 2ms, 500us) or a share of production's
    /// measured service time (e.g. 10%). Smaller protects production's tail more and harvests
    /// less; a kernel longer than it runs alone.
    #[arg(long, value_name = "TIME|PCT", default_value_t = libshare_node::policy::LatencyBudget::DEFAULT)]
    pub latency_budget: libshare_node::policy::LatencyBudget,
}

pub fn parse_duration(s: &str) -> Result<u64, String> {
    libshare_abi::units::parse_duration_ns(s)
        .ok_or_else(|| format!("{s:?} is not a duration (e.g. 500us, 1ms, 2s)"))
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Release);
}

fn install_handlers() -> Result<()> {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: an all-zero sigaction is valid; we set the handler (async-signal-safe: one
        // atomic store) and no SA_RESTART, so the loop's sleep returns EINTR and sees STOP.
        let r = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut())
        };
        if r != 0 {
            return Err(anyhow!(
                "cannot install a signal handler: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}

/// The control loop and the registration socket must wake on time when the node's cores are busy
/// with jobs (or with 300 of them starting): the daemon asks for nice −10 (allowed to root, or
/// with CAP_SYS_NICE; a systemd unit can set `Nice=`). It keeps its niceness when that is
/// refused. Linux applies it to the calling thread only, so this runs before any thread is
/// spawned (they inherit it). Returns the niceness it runs at.
fn raise_priority() -> i32 {
    // SAFETY: plain syscalls on this process with valid arguments.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, -10);
        *libc::__errno_location() = 0;
        libc::getpriority(libc::PRIO_PROCESS, 0)
    }
}

/// Log lines on stderr (`LIBSHARE_LOG` filters; colour on a terminal only): the daemon's and the
/// device plugin's.
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LIBSHARE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// HAMi mode: the registration socket's directory mounted read-only at `<hami dir>/libshare`
/// (`libshare_abi::socket_dir`), made now or checked (an operator's mount); the directory and
/// the mount point.
fn hami_mount(
    register: &std::path::Path,
    hami_dir: &std::path::Path,
) -> Result<(PathBuf, PathBuf)> {
    use libshare_abi::socket_dir::{check, Found};
    let sock_dir = register
        .parent()
        .ok_or_else(|| anyhow!("--register-socket {}: no directory", register.display()))?
        .to_path_buf();
    let at = hami_dir.join("libshare");
    let canonical = |p: &std::path::Path| std::fs::canonicalize(p).unwrap_or(p.to_path_buf());
    if canonical(&sock_dir) == canonical(&at) {
        return Err(anyhow!(
            "--hami: the registration socket {} is in {}, which every container can write: \
             drop --register-socket (the daemon then mounts its socket's directory read-only there)",
            register.display(),
            at.display()
        ));
    }
    match libshare_node::sockdir::mount_read_only(&sock_dir, &at) {
        Ok(made) => {
            tracing::info!(
                socket_dir = %sock_dir.display(),
                at = %at.display(),
                "HAMi: the registration socket's directory is mounted read-only in HAMi's lock directory{}",
                if made { "" } else { " (it already was)" }
            );
            Ok((sock_dir, at))
        }
        Err(why) => match check(&at) {
            // Not root: an operator's mount of the same directory does.
            Found::Trusted(d)
                if libshare_abi::fd_dev_ino(&std::fs::File::open(&sock_dir)?.into())
                    .is_ok_and(|x| x == d.dev_ino) =>
            {
                Ok((sock_dir, at))
            }
            _ => Err(anyhow!(
                "--hami: cannot mount the registration socket's directory read-only at {} ({why}): \
                 run the daemon as root, or mount it before starting the daemon: mount --bind {} {} \
                 && mount -o remount,bind,ro {}",
                at.display(),
                sock_dir.display(),
                at.display(),
                at.display()
            )),
        },
    }
}

pub fn run(args: DaemonArgs) -> Result<()> {
    init_logging();
    install_handlers()?;
    let nice = raise_priority();
    let policy = match args.policy {
        PolicyArg::Libshare => PolicyKind::Libshare,
        PolicyArg::TimeSlice => PolicyKind::TimeSlice {
            quantum_ns: args.quantum,
        },
    };
    let dir = super::state_dir(args.state_dir);
    let cfg = ControllerConfig::new(dir.clone(), args.period, policy);
    cfg.check()?;
    if libshare_abi::claim_state_dir(&dir)? {
        tracing::info!(state_dir = %dir.display(), "state directory made private (0711: others may only reach the registration socket)");
    }
    let defaults = match &args.config {
        Some(p) => libshare_node::settings::Config::load(p)?.defaults,
        None => Default::default(),
    };
    let settings_path = args
        .settings
        .clone()
        .unwrap_or_else(|| dir.join("settings.toml"));
    let settings = Arc::new(Mutex::new(libshare_node::settings::Settings::load(
        settings_path,
        defaults,
    )?));
    let totals = match libshare_node::nvml::device_totals() {
        Ok(t) => Some(t),
        Err(why) => {
            tracing::warn!("quotas are not checked against the devices' memory: {why}");
            None
        }
    };
    let devices = libshare_node::settings::node_devices(totals.as_deref());
    let mut cfg = cfg;
    cfg.demotion = !args.no_demotion;
    cfg.latency_budget = args.latency_budget;
    cfg.turns = (!args.no_turns).then(|| libshare_node::turns::TurnConfig {
        fixed_quantum_ns: args.turn_quantum,
        ..Default::default()
    });
    cfg.device_totals = totals.clone();
    if cfg.turns.is_some() && totals.is_none() {
        tracing::info!("no exclusive turns between oversubscribing containers: the devices' memory is unknown (no NVML)");
    }
    if !(1_000_000_000..=3_600_000_000_000).contains(&args.forget_after) {
        return Err(anyhow!("--forget-after must be between 1s and 1h"));
    }
    if args.max_containers_per_uid == 0 || args.max_containers_per_cgroup == 0 {
        return Err(anyhow!(
            "--max-containers-per-uid and --max-containers-per-cgroup must be at least 1"
        ));
    }
    let book = libshare_node::book::Book::new(libshare_node::book::Limits {
        per_uid: args.max_containers_per_uid,
        per_cgroup: args.max_containers_per_cgroup,
        forget_after: std::time::Duration::from_nanos(args.forget_after),
    });
    cfg.authority = Some(
        libshare_node::authority::Authority::new(
            settings.clone(),
            devices,
            args.trust_env,
            cfg.health.restores.clone(),
        )
        .with_pin_bound(cfg.device_totals.is_some())
        .with_book(book),
    );
    let identity = libshare_node::identity::IdentityConfig {
        prefixes: args.cgroup_prefix.clone(),
        trust_env: args.trust_env,
        runtime_parents: args.runtime_cgroup_parent.clone(),
        fs: libshare_node::identity::CgroupFs::host(),
    };
    let caps = match libshare_node::caps::Driver::probe() {
        Ok(d) => {
            tracing::info!("driver memory caps on: each container's quota is also its cgroup's hard limit in the driver (nvmlDeviceSetMemoryLimits_v1)");
            let caps = libshare_node::caps::Caps::new(d);
            Some(Arc::new(if args.hami {
                caps.without_guarantees()
            } else {
                caps
            }))
        }
        Err(why) => {
            tracing::info!("driver memory caps off: {why}; the shim alone enforces quotas");
            None
        }
    };
    let admin =
        libshare_node::server::Server::bind(ServerConfig::new(dir.join("admin.sock"), 0o600))
            .map_err(|e| {
                anyhow!(
                    "cannot create the admin socket {}: {e}",
                    dir.join("admin.sock").display()
                )
            })?;
    let admin_thread = {
        let mut service = libshare_node::admin::AdminService::new(
            dir.clone(),
            settings.clone(),
            totals,
            args.trust_env,
        )
        .with_identity(identity.clone(), caps.clone());
        std::thread::Builder::new()
            .name("admin".into())
            .spawn(move || admin.serve(&mut service, &STOP))?
    };
    let register_path = libshare_node::sockdir::prepare(&dir, args.register_socket.as_deref())
        .map_err(|e| anyhow!("cannot prepare the registration socket's directory: {e}"))?;
    let hami_mount = if args.hami {
        Some(hami_mount(&register_path, &args.hami_dir)?)
    } else {
        None
    };
    let nofile = libshare_node::server::raise_nofile();
    let register = libshare_node::server::Server::bind(ServerConfig {
        pin_identity: true,
        ..ServerConfig::new(register_path.clone(), 0o666).fit_descriptors(nofile)
    })
    .map_err(|e| {
        anyhow!(
            "cannot create the registration socket {}: {e}",
            register_path.display()
        )
    })?;
    let caps_thread = match &caps {
        Some(c) => {
            let (c, dir) = (c.clone(), dir.clone());
            Some(
                std::thread::Builder::new()
                    .name("caps".into())
                    .spawn(move || c.run(&dir, std::time::Duration::from_millis(100), &STOP))?,
            )
        }
        None => None,
    };
    let register_thread = {
        let mut service = libshare_node::register::RegisterService::new(
            dir.clone(),
            identity,
            cfg.authority.clone(),
        )
        .with_caps(caps)
        .with_hami(args.hami)
        .with_control(cfg.health.clone());
        std::thread::Builder::new()
            .name("register".into())
            .spawn(move || register.serve(&mut service, &STOP))?
    };
    let mount_thread = match hami_mount {
        Some((sock_dir, at)) => Some(
            std::thread::Builder::new()
                .name("hami-mount".into())
                .spawn(move || {
                    libshare_node::sockdir::keep_mounted(
                        sock_dir,
                        at,
                        std::time::Duration::from_secs(1),
                        &STOP,
                    )
                })?,
        ),
        None => None,
    };
    if let Some(addr) = args.metrics_addr {
        libshare_node::metrics::serve_http(
            addr,
            dir.clone(),
            cfg.health.clone(),
            libshare_node::metrics::Access::new(&args.metrics_allow_uid),
            &STOP,
        )?;
    }
    if let Some(path) = &args.metrics_textfile {
        if !(100_000_000..=3_600_000_000_000).contains(&args.metrics_interval) {
            return Err(anyhow!("--metrics-interval must be between 100ms and 1h"));
        }
        libshare_node::metrics::write_textfile_every(
            path.clone(),
            std::time::Duration::from_nanos(args.metrics_interval),
            dir.clone(),
            cfg.health.clone(),
            &STOP,
        )?;
    }
    tracing::info!(
        nice,
        nofile,
        state_dir = %dir.display(),
        period_us = args.period / 1_000,
        policy = args.policy.to_possible_value().map_or_else(String::new, |v| v.get_name().to_string()),
        quantum_ms = args.quantum / 1_000_000,
        "daemon started"
    );
    let s = libshare_node::run(&cfg, &STOP);
    STOP.store(true, Ordering::Release);
    let _ = admin_thread.join();
    let _ = register_thread.join();
    if let Some(t) = caps_thread {
        let _ = t.join();
    }
    if let Some(t) = mount_thread {
        let _ = t.join();
    }
    let s = s?;
    tracing::info!(
        ticks = s.ticks,
        event_ticks = s.event_ticks,
        late_mean_us = s.late_mean_ns as f64 / 1e3,
        late_max_us = s.late_max_ns as f64 / 1e3,
        overruns = s.overruns,
        cpu_ms = s.cpu_ns as f64 / 1e6,
        cpu_pct = format!("{:.2}", s.cpu_pct()),
        containers = s.containers,
        "daemon stopped"
    );
    Ok(())
}
