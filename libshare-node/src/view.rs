//! A typed, read-only snapshot of every container on the node, read from the state files the
//! shim writes (`<state dir>/containers/<name>/state.shm`): what `sharectl status`, `sharectl
//! top` and the daemon's metrics show. Works with or without the daemon and needs only read
//! permission: each file is copied once (`State::snapshot`: opened without following a symlink
//! and without blocking, so a FIFO or a link planted there is reported, never waited on or
//! followed; a regular file only; a later truncation cannot fault). A process is listed if it
//! holds its slot's lock, the same rule the shim uses; a dead process's memory is shown until a
//! process of its container (or the daemon) reclaims it.

use libshare_abi::rate::Gate;
use libshare_abi::{Class, SlotTable, State, FLAG_DAEMON_MANAGED, MAX_DEVICES};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Acquire;

/// Why the state directory could not be read (a single container's failure is not an error:
/// it is one line of [`NodeView::errors`]).
#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    #[error("cannot read {}: {err}", path.display())]
    ReadDir { path: PathBuf, err: std::io::Error },
}

/// One device of one container: every counter the state file keeps for it.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceView {
    pub device: usize,
    /// Bytes the container may hold; 0 = no limit.
    pub quota: u64,
    pub used: u64,
    /// Highest `used` the shim recorded since the state file was created.
    pub peak: u64,
    /// Allocations refused because of the quota.
    pub refused: u64,
    pub allocs: u64,
    pub frees: u64,
    /// Kernel and graph launches of the container, every process ever (the container's counter).
    pub launches: u64,
    /// Launches of the processes alive now (their slots' counters).
    pub launches_live_processes: u64,
    /// GPU time the shims measured (events) for the container's launches, ns, cumulative: the
    /// opportunistic class only (production launches are not timed).
    pub gpu_ns: u64,
    /// Time launches spent held at the gate, ns, cumulative (summed over waiting threads).
    pub held_ns: u64,
    /// Launches that went as block ranges of their grid (kernel slicing), and launches that
    /// were to but went whole, cumulative.
    pub sliced: u64,
    pub unsliced: u64,
    /// Threads waiting at the gate now.
    pub held_threads: u32,
    /// Estimated GPU time of gated launches outstanding now, ns.
    pub in_flight_ns: u64,
    /// The gate the daemon last wrote (open when no daemon gates this container).
    pub gate: Gate,
    /// `rate::now_ns()` of the daemon's last gate write; 0 = never.
    pub gate_refreshed_ns: u64,
    /// Compute share set by an admin / asked by the environment, basis points; 0 = none.
    pub compute_bp: u32,
    /// The smallest compute limit of the live processes' environments (`CUDA_DEVICE_SM_LIMIT`,
    /// per process, the same on every device), basis points; 0 = none.
    pub env_compute_bp: u32,
    /// Weight among opportunistic containers (0 reads as 1).
    pub weight: u32,
    /// Whether the container is running work on the device now (first launch not yet drained).
    pub busy: bool,
    /// Oversubscribing containers: managed memory its shims hold demoted to the host now, and
    /// what the daemon asks them to (`libshare_abi::demote`).
    pub demoted: u64,
    pub demote_target: u64,
    /// Oversubscribing containers: whole allocations moved between the device and the host
    /// (demotions plus promotions), cumulative (a 32-bit count, wrapping).
    pub migrations: u64,
    /// Production containers: bytes their allocations waited to find free, cumulative.
    pub waited_for: u64,
}

impl DeviceView {
    /// Memory held on the device itself: the footprint (`used`) less what is demoted to the
    /// host.
    pub fn resident(&self) -> u64 {
        self.used.saturating_sub(self.demoted)
    }

    /// Whether the container has a quota, memory or launches on this device, or was gated or
    /// timed there. A compute share or weight alone does not count (`sharectl set` writes them
    /// on every device).
    pub fn in_use(&self) -> bool {
        self.quota > 0
            || self.used > 0
            || self.launches > 0
            || self.launches_live_processes > 0
            || self.gate != Gate::Open
            || self.gpu_ns > 0
            || self.held_ns > 0
    }
}

/// One live process of a container (a slot whose lock is held).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessView {
    pub slot: usize,
    /// The pid as the process sees itself (for display).
    pub pid: u32,
    /// Bytes it holds, all devices.
    pub used: u64,
    /// Its launches, all devices.
    pub launches: u64,
}

/// One container.
#[derive(Clone, Debug, PartialEq)]
pub struct ContainerView {
    pub name: String,
    pub class: Class,
    /// Whether a daemon manages the container (its quotas and class come from the daemon).
    pub daemon_managed: bool,
    /// The devices [`DeviceView::in_use`], by index.
    pub devices: Vec<DeviceView>,
    pub processes: Vec<ProcessView>,
}

/// Every container under a state directory, sorted by name, and one error line per state file
/// that could not be read (sorted).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeView {
    pub containers: Vec<ContainerView>,
    pub errors: Vec<String>,
}

/// One container's figures from its state.
pub fn container(name: &str, st: &State) -> ContainerView {
    let h = st.header();
    let class = h.class();
    let live = st.live_slots();
    // The environments' compute limit: the smallest of the live processes' (the daemon's rule).
    let env_compute = libshare_abi::min_limit(
        live.iter()
            .map(|(i, _)| st.slot(*i).compute_limit.load(Acquire)),
    );
    let devices = (0..MAX_DEVICES)
        .map(|d| {
            let dev = st.device(d);
            DeviceView {
                device: d,
                quota: dev.quota.load(Acquire),
                used: dev.used.load(Acquire),
                peak: dev.peak.load(Acquire),
                refused: dev.oom.load(Acquire),
                allocs: dev.allocs.load(Acquire),
                frees: dev.frees.load(Acquire),
                launches: dev.launches.load(Acquire),
                launches_live_processes: live
                    .iter()
                    .map(|(i, _)| st.slot(*i).launches[d].load(Acquire))
                    .sum(),
                gpu_ns: dev.gpu_ns.load(Acquire),
                held_ns: dev.held_ns.load(Acquire),
                sliced: dev.sliced.load(Acquire),
                unsliced: dev.unsliced.load(Acquire),
                held_threads: dev.held.load(Acquire),
                in_flight_ns: dev.in_flight_ns.load(Acquire),
                gate: dev.gate(),
                gate_refreshed_ns: dev.refreshed.load(Acquire),
                compute_bp: dev.compute.load(Acquire),
                env_compute_bp: env_compute,
                weight: dev.weight.load(Acquire),
                demoted: dev.demoted.load(Acquire),
                demote_target: dev.demote.load(Acquire),
                migrations: dev.migrations.load(Acquire) as u64,
                waited_for: dev.mem_want.load(Acquire),
                busy: dev.busy_since.load(Acquire) != 0,
            }
        })
        .filter(DeviceView::in_use)
        .collect();
    let processes = live
        .iter()
        .map(|(i, pid)| {
            let s = st.slot(*i);
            ProcessView {
                slot: *i,
                pid: *pid,
                used: s.net_total(),
                launches: s.launches.iter().map(|u| u.load(Acquire)).sum(),
            }
        })
        .collect();
    ContainerView {
        name: name.to_string(),
        class,
        daemon_managed: h.flags.load(Acquire) & FLAG_DAEMON_MANAGED != 0,
        devices,
        processes,
    }
}

/// Reads every container under the state directory `dir`. A missing `containers` directory is
/// an empty node; a container whose file cannot be read (or is a symlink) is an error line.
pub fn read(dir: &Path) -> Result<NodeView, ViewError> {
    let root = dir.join("containers");
    let mut errors = Vec::new();
    let mut names: Vec<String> = match std::fs::read_dir(&root) {
        Ok(rd) => rd
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                // Never follow a symlink (DirEntry::file_type does not).
                if e.file_type().is_ok_and(|t| t.is_symlink()) {
                    errors.push(format!(
                        "container {name}: {} is a symbolic link: not followed (remove it)",
                        e.path().display()
                    ));
                    return None;
                }
                Some(name)
            })
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(err) => return Err(ViewError::ReadDir { path: root, err }),
    };
    names.sort();
    let mut containers = Vec::new();
    for name in names {
        let path = libshare_abi::container_dir(dir, &name).join(libshare_abi::STATE_FILE);
        match State::snapshot(&path) {
            Ok(st) => containers.push(container(&name, &st)),
            Err(e) => errors.push(format!("container {name}: {e}")),
        }
    }
    errors.sort();
    Ok(NodeView { containers, errors })
}

/// The gate as a short word and its bounds, for display: `open`, `paused`, or `run` with the
/// in-flight bound in µs (0 = none) and whether a window / a share applies.
pub fn gate_parts(g: Gate) -> (&'static str, u32, bool, bool) {
    match g {
        Gate::Open => ("open", 0, false, false),
        Gate::Paused => ("paused", 0, false, false),
        Gate::Run {
            in_flight_us,
            window,
            share,
        } => ("run", in_flight_us, window, share),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Release;

    #[test]
    fn reads_every_counter_and_skips_unused_devices() {
        let dir = tempfile::tempdir().unwrap();
        let cdir = libshare_abi::container_dir(dir.path(), "b");
        let st = State::open_or_create(&cdir).unwrap();
        st.header().set_class(Class::Opportunistic);
        st.set_quota(1, 1 << 30);
        let d = st.device(1);
        d.used.store(5, Release);
        d.gpu_ns.store(7, Release);
        d.held_ns.store(9, Release);
        d.oom.store(2, Release);
        d.launches.store(11, Release);
        d.write_gate(
            Gate::Run {
                in_flight_us: 300,
                window: false,
                share: true,
            },
            0,
            1,
        );
        drop(State::open_or_create(&libshare_abi::container_dir(dir.path(), "a")).unwrap());
        let v = read(dir.path()).unwrap();
        assert!(v.errors.is_empty(), "{:?}", v.errors);
        assert_eq!(v.containers.len(), 2);
        assert_eq!(v.containers[0].name, "a");
        assert!(v.containers[0].devices.is_empty());
        let b = &v.containers[1];
        assert_eq!(b.class, Class::Opportunistic);
        assert_eq!(b.devices.len(), 1);
        let dv = &b.devices[0];
        assert_eq!(
            (dv.device, dv.quota, dv.used, dv.gpu_ns, dv.held_ns),
            (1, 1 << 30, 5, 7, 9)
        );
        assert_eq!((dv.refused, dv.launches), (2, 11));
        assert_eq!(gate_parts(dv.gate), ("run", 300, false, true));
    }

    #[test]
    fn a_missing_directory_is_an_empty_node() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(&dir.path().join("nope")).unwrap(), NodeView::default());
    }
}
