//! What the plugin advertises and how it picks: each GPU is cut into memory shares of a fixed size
//! (1 GiB by default), each share one kubelet device `gpu<i>-share<k>`. A pod asking for
//! `libshare.dev/gpu-memory: 4` gets four shares and a 4 GiB quota. Pure: no I/O, unit-tested.
//!
//! One resource, memory, and not a second one for compute: the kubelet allocates each extended
//! resource on its own, so a pod's compute shares could land on another GPU than its memory
//! shares; compute follows the class (production first, opportunistic in the gaps) and an
//! optional per-pod cap (`libshare.dev/compute` annotation), as on a plain node.

use std::collections::BTreeMap;

/// One share's device id.
pub fn share_id(gpu: u32, share: u32) -> String {
    format!("gpu{gpu}-share{share}")
}

/// `gpu<i>-share<k>` → (i, k).
pub fn parse_id(id: &str) -> Option<(u32, u32)> {
    let rest = id.strip_prefix("gpu")?;
    let (g, s) = rest.split_once("-share")?;
    let digits = |t: &str| !t.is_empty() && t.len() <= 6 && t.bytes().all(|b| b.is_ascii_digit());
    if !digits(g) || !digits(s) || (g.len() > 1 && g.starts_with('0')) {
        return None;
    }
    if s.len() > 1 && s.starts_with('0') {
        return None;
    }
    Some((g.parse().ok()?, s.parse().ok()?))
}

/// The shares of every GPU, given each GPU's total memory (NVML) and the share size.
pub fn advertised(totals: &[u64], share_bytes: u64) -> Vec<String> {
    totals
        .iter()
        .enumerate()
        .flat_map(|(g, &t)| (0..(t / share_bytes) as u32).map(move |k| share_id(g as u32, k)))
        .collect()
}

/// What a container was given: shares per GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// GPU index → number of shares.
    pub per_gpu: BTreeMap<u32, u32>,
    /// The ids, sorted.
    pub ids: Vec<String>,
}

impl Grant {
    /// The allocation's name: stable for a set of shares, and unique among live allocations
    /// (a share belongs to one live allocation, and the name carries the first one).
    pub fn name(&self) -> String {
        let first = self.ids.first().map(String::as_str).unwrap_or("none");
        format!("k8s-{first}-x{}", self.ids.len())
    }

    /// `CUDA_VISIBLE_DEVICES` for it: the GPUs, in order.
    pub fn visible(&self) -> String {
        let v: Vec<String> = self.per_gpu.keys().map(|g| g.to_string()).collect();
        v.join(",")
    }
}

/// Why a kubelet's request cannot be granted (one line each, the request changes nothing).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GrantError {
    #[error("no device ids in the request: a container asks for at least one share")]
    Empty,
    #[error("device id {0:?} is not one this plugin advertises (shares are gpu<i>-share<k>; the kubelet's list may be stale: it gets the current one from ListAndWatch)")]
    Unknown(String),
    #[error("device id {0:?} is asked for twice in one request: each share is granted once")]
    Twice(String),
}

/// Checks `ids` against what is advertised now (`known`) and groups them by GPU.
pub fn grant(ids: &[String], known: &[String]) -> Result<Grant, GrantError> {
    if ids.is_empty() {
        return Err(GrantError::Empty);
    }
    let mut sorted: Vec<String> = Vec::with_capacity(ids.len());
    let mut per_gpu = BTreeMap::new();
    for id in ids {
        let Some((g, _)) = parse_id(id).filter(|_| known.contains(id)) else {
            return Err(GrantError::Unknown(id.clone()));
        };
        if sorted.contains(id) {
            return Err(GrantError::Twice(id.clone()));
        }
        sorted.push(id.clone());
        *per_gpu.entry(g).or_insert(0) += 1;
    }
    sorted.sort_by_key(|id| parse_id(id));
    Ok(Grant {
        per_gpu,
        ids: sorted,
    })
}

/// The shares to give a container of `size`, from `available`, keeping `must` (which the kubelet
/// requires): on one GPU whenever one can hold them all — the one already holding `must`, else
/// the fullest that fits (best fit, leaving whole GPUs for large pods); else over the fewest GPUs.
pub fn preferred(available: &[String], must: &[String], size: usize) -> Vec<String> {
    let mut out: Vec<String> = must.to_vec();
    let mut free: BTreeMap<u32, Vec<(u32, &String)>> = BTreeMap::new();
    for id in available {
        if let Some((g, k)) = parse_id(id) {
            if !must.contains(id) {
                free.entry(g).or_default().push((k, id));
            }
        }
    }
    for v in free.values_mut() {
        v.sort();
    }
    let mut need = size.saturating_sub(out.len());
    let must_gpus: Vec<u32> = must
        .iter()
        .filter_map(|m| parse_id(m))
        .map(|p| p.0)
        .collect();
    // GPUs in the order they are drawn from.
    let mut order: Vec<u32> = Vec::new();
    for g in &must_gpus {
        if !order.contains(g) {
            order.push(*g);
        }
    }
    let fits = free
        .iter()
        .filter(|(g, v)| !order.contains(g) && v.len() >= need)
        .min_by_key(|(g, v)| (v.len(), **g))
        .map(|(g, _)| *g);
    let room: usize = order.iter().map(|g| free.get(g).map_or(0, Vec::len)).sum();
    if room < need {
        match fits {
            Some(g) if order.is_empty() => order.push(g),
            _ => {
                let mut rest: Vec<(&u32, &Vec<(u32, &String)>)> =
                    free.iter().filter(|(g, _)| !order.contains(g)).collect();
                rest.sort_by_key(|(g, v)| (std::cmp::Reverse(v.len()), **g));
                order.extend(rest.into_iter().map(|(g, _)| *g));
            }
        }
    }
    for g in order {
        for (_, id) in free.get(&g).into_iter().flatten() {
            if need == 0 {
                break;
            }
            out.push((*id).clone());
            need -= 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[(u32, u32)]) -> Vec<String> {
        v.iter().map(|&(g, k)| share_id(g, k)).collect()
    }

    #[test]
    fn ids_round_trip_and_reject_lookalikes() {
        assert_eq!(parse_id(&share_id(3, 17)), Some((3, 17)));
        for bad in [
            "",
            "gpu",
            "gpu0",
            "gpu-share1",
            "gpu01-share1",
            "gpu0-share",
            "gpu0-share1x",
            "GPU0-share1",
            "gpu0-share01",
            "gpu1234567-share0",
        ] {
            assert_eq!(parse_id(bad), None, "{bad}");
        }
        let a = advertised(&[3 << 30, (2 << 30) + 5], 1 << 30);
        assert_eq!(a, ids(&[(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]));
    }

    #[test]
    fn grants_check_every_id() {
        let known = advertised(&[4 << 30, 4 << 30], 1 << 30);
        let g = grant(&ids(&[(1, 2), (0, 3), (1, 0)]), &known).unwrap();
        assert_eq!(g.per_gpu, BTreeMap::from([(0, 1), (1, 2)]));
        assert_eq!(g.ids, ids(&[(0, 3), (1, 0), (1, 2)]));
        assert_eq!(g.name(), "k8s-gpu0-share3-x3");
        assert_eq!(g.visible(), "0,1");
        assert_eq!(grant(&[], &known), Err(GrantError::Empty));
        assert_eq!(
            grant(&ids(&[(2, 0)]), &known),
            Err(GrantError::Unknown("gpu2-share0".into()))
        );
        assert_eq!(
            grant(&ids(&[(0, 1), (0, 1)]), &known),
            Err(GrantError::Twice("gpu0-share1".into()))
        );
        for e in [GrantError::Empty, GrantError::Unknown("x".into())] {
            assert!(!e.to_string().contains('\n'));
        }
    }

    #[test]
    fn preferred_keeps_a_pod_on_one_gpu() {
        // GPU 0 has 3 free, GPU 1 has 6 free: 2 shares go to GPU 0 (best fit), 5 to GPU 1.
        let avail = ids(&[
            (0, 5),
            (0, 6),
            (0, 7),
            (1, 0),
            (1, 1),
            (1, 2),
            (1, 3),
            (1, 4),
            (1, 5),
        ]);
        assert_eq!(preferred(&avail, &[], 2), ids(&[(0, 5), (0, 6)]));
        assert_eq!(
            preferred(&avail, &[], 5),
            ids(&[(1, 0), (1, 1), (1, 2), (1, 3), (1, 4)])
        );
        // What the kubelet requires stays, and the rest comes from its GPU.
        assert_eq!(
            preferred(&avail, &ids(&[(1, 3)]), 3),
            ids(&[(1, 3), (1, 0), (1, 1)])
        );
        // Too big for one GPU: the fewest GPUs, largest first.
        assert_eq!(preferred(&avail, &[], 8).len(), 8);
        let p = preferred(&avail, &[], 7);
        assert_eq!(
            p[..6],
            ids(&[(1, 0), (1, 1), (1, 2), (1, 3), (1, 4), (1, 5)])
        );
        assert_eq!(p[6], share_id(0, 5));
    }
}
