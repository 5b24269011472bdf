//! Which of the node's GPUs each CUDA ordinal of this process is.
//!
//! Everything shared per device (the container's quota and usage, its slot's launches, the
//! gate, what the daemon reads and writes) is indexed by the node's GPU index: NVML's index,
//! what `nvidia-smi`, `sharectl set --device` and the daemon number. A container's CUDA numbers
//! only the GPUs `CUDA_VISIBLE_DEVICES` shows it (CDI and the device plugin give a container its
//! GPUs that way: the node's GPU 3 is its ordinal 0), so the shim converts once, at the
//! boundary: a `CUdevice` (an `i32` the driver takes or returns) is a CUDA ordinal, a device
//! index (`usize`) inside the shim is the node's GPU index. `DriverOps` takes and returns
//! node indices; its real implementation converts.
//!
//! The table is made once, off the launch path (the first time a context's device is seen, or
//! at initialisation): each ordinal's UUID (`cuDeviceGetUuid`) matched against NVML's devices;
//! failing that (no NVML, or a MIG instance NVML does not list as a GPU), the ordinal's entry
//! of a numeric `CUDA_VISIBLE_DEVICES`; failing that, the ordinal itself (one log line says so).

use std::sync::OnceLock;

use libshare_abi::MAX_DEVICES;

use crate::types::{CUdevice, CUuuid, CUDA_SUCCESS};

/// Ordinal → node index, for the ordinals the driver reported (`len`); identity beyond.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DevMap {
    node: [u8; MAX_DEVICES],
    len: usize,
}

impl DevMap {
    /// The node index of `ordinal`.
    #[inline]
    pub fn node_of(&self, ordinal: usize) -> usize {
        self.node[ordinal % MAX_DEVICES] as usize
    }

    /// The ordinal that is the node's GPU `node`, if this process sees it.
    pub fn ordinal_of(&self, node: usize) -> Option<usize> {
        if self.len == 0 {
            return (node < MAX_DEVICES).then_some(node);
        }
        self.node[..self.len]
            .iter()
            .position(|&n| n as usize == node)
    }

    /// The table for `ordinals` devices: each ordinal's UUID (`cuda`, as `GPU-…`) found among
    /// the node's (`node_uuids`, NVML's order), else its entry of `visible` (a numeric
    /// `CUDA_VISIBLE_DEVICES`), else the ordinal. Whether any ordinal fell back.
    pub fn build(
        cuda: &[Option<String>],
        node_uuids: Option<&[String]>,
        visible: Option<&str>,
    ) -> (DevMap, bool) {
        let listed = visible.and_then(numeric_list);
        let mut m = DevMap {
            node: identity(),
            len: cuda.len().min(MAX_DEVICES),
        };
        let mut fell_back = false;
        for (o, uuid) in cuda.iter().enumerate().take(MAX_DEVICES) {
            let by_uuid = uuid.as_ref().and_then(|u| {
                node_uuids?
                    .iter()
                    .position(|n| !n.is_empty() && n.eq_ignore_ascii_case(u))
            });
            let n = by_uuid.or_else(|| {
                fell_back = true;
                listed.as_ref().and_then(|l| l.get(o).copied())
            });
            m.node[o] = n.filter(|&n| n < MAX_DEVICES).unwrap_or(o) as u8;
        }
        (m, fell_back)
    }
}

fn identity() -> [u8; MAX_DEVICES] {
    std::array::from_fn(|i| i as u8)
}

/// A `CUDA_VISIBLE_DEVICES` of node indices (`"3"`, `"1,0"`), or None if it names devices
/// otherwise (UUIDs, MIG instances: only NVML can place those). As CUDA reads it, the list ends
/// at its first invalid entry.
fn numeric_list(v: &str) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for e in v.split(',').map(str::trim) {
        if e.starts_with("GPU-") || e.starts_with("MIG-") {
            return None;
        }
        match e.parse::<usize>() {
            Ok(n) => out.push(n),
            Err(_) => break,
        }
    }
    Some(out)
}

/// This process's table, made once the driver can say how many devices it sees (before that,
/// a table from the environment alone, not kept). A driver that cannot name its devices' UUIDs
/// gets the fallbacks, kept as well: the allocation paths ask this table, and must not read the
/// environment or allocate each time.
fn map() -> DevMap {
    static MAP: OnceLock<DevMap> = OnceLock::new();
    if let Some(m) = MAP.get() {
        return *m;
    }
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let from_env = |visible: Option<&str>| {
        let n = visible.and_then(numeric_list).map_or(0, |l| l.len());
        vec![None; n]
    };
    match cuda_uuids() {
        Counted::NotYet => DevMap::build(&from_env(visible.as_deref()), None, visible.as_deref()).0,
        counted => *MAP.get_or_init(|| {
            let cuda = match counted {
                Counted::Devices(c) => c,
                _ => from_env(visible.as_deref()),
            };
            let node = crate::nvml_real::node_uuids();
            let (m, fell_back) = DevMap::build(&cuda, node.as_deref(), visible.as_deref());
            if fell_back {
                tracing::info!(
                    cuda_visible_devices = visible.as_deref().unwrap_or(""),
                    "libshare: some CUDA devices could not be matched to the node's GPUs by UUID \
                     (NVML missing?): numbered by CUDA_VISIBLE_DEVICES, else as CUDA numbers them"
                );
            }
            m
        }),
    }
}

/// What the driver says of its devices.
enum Counted {
    /// Each ordinal's UUID as NVML writes it (None for one the driver would not say).
    Devices(Vec<Option<String>>),
    /// Not initialised yet (`cuDeviceGetCount` failed): ask again later.
    NotYet,
    /// No driver, or one without `cuDeviceGetCount`: it never will say.
    Never,
}

fn cuda_uuids() -> Counted {
    let r = crate::driver::real();
    let Some(count) = r.cuDeviceGetCount else {
        return Counted::Never;
    };
    let mut n = 0;
    // SAFETY: the driver's `cuDeviceGetCount` with a live local.
    if unsafe { count(&mut n) } != CUDA_SUCCESS {
        return Counted::NotYet;
    }
    Counted::Devices(
        (0..n.clamp(0, MAX_DEVICES as i32))
            .map(|d| {
                let mut u = CUuuid([0; 16]);
                let uuid_of = r.cuDeviceGetUuid?;
                // SAFETY: the driver's `cuDeviceGetUuid` with a live local and an ordinal below
                // the device count.
                (unsafe { uuid_of(&mut u, d) } == CUDA_SUCCESS)
                    .then(|| shim_headers::format_uuid(&u.0))
            })
            .collect(),
    )
}

/// The node's GPU index of CUDA ordinal `dev` (a negative one: 0, as the shim always treated
/// an out-of-range device).
pub fn node_of(dev: CUdevice) -> usize {
    map().node_of(dev.max(0) as usize)
}

/// The CUDA ordinal of the node's GPU `node`, if this process sees it.
pub fn ordinal_of(node: usize) -> Option<CUdevice> {
    map().ordinal_of(node).map(|o| o as CUdevice)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uuids(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn ordinals_are_matched_to_the_nodes_gpus_by_uuid() {
        let node = uuids(&["GPU-a", "GPU-b", "GPU-c", "GPU-d"]);
        let cuda = [Some("GPU-d".into()), Some("gpu-B".into())];
        // The environment disagrees: the UUIDs win.
        let (m, fell_back) = DevMap::build(&cuda, Some(&node), Some("0,1"));
        assert!(!fell_back);
        assert_eq!((m.node_of(0), m.node_of(1)), (3, 1));
        assert_eq!((m.ordinal_of(3), m.ordinal_of(1)), (Some(0), Some(1)));
        assert_eq!(m.ordinal_of(0), None, "GPU 0 is not this process's");
    }

    #[test]
    fn without_nvml_a_numeric_visible_list_then_the_ordinal() {
        let cuda = [Some("GPU-x".into()), None];
        let (m, fell_back) = DevMap::build(&cuda, None, Some("2, 5"));
        assert!(fell_back);
        assert_eq!((m.node_of(0), m.node_of(1)), (2, 5));
        // A MIG instance NVML does not list, named by UUID in the environment: as CUDA numbers.
        let node = uuids(&["GPU-a"]);
        let (m, _) = DevMap::build(&[Some("MIG-q".into())], Some(&node), Some("MIG-q"));
        assert_eq!(m.node_of(0), 0);
        // Nothing set: as CUDA numbers them; the list ends at an invalid entry, as CUDA reads it.
        let (m, _) = DevMap::build(&cuda, None, None);
        assert_eq!((m.node_of(0), m.node_of(1)), (0, 1));
        let (m, _) = DevMap::build(&cuda, None, Some("3,x,1"));
        assert_eq!((m.node_of(0), m.node_of(1)), (3, 1));
    }

    #[test]
    fn identity_before_the_driver_answers() {
        // Before the driver counts its devices, the table is the environment's, here none.
        let (m, _) = DevMap::build(&[], None, None);
        assert_eq!(m.node_of(7), 7);
        assert_eq!(m.ordinal_of(7), Some(7));
        assert_eq!(m.ordinal_of(MAX_DEVICES), None);
    }
}
