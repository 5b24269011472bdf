//! Host memory for demoted pages (issue 20, must-show 7): an oversubscribing container's
//! managed allocation may be demoted to the host at any time (the daemon asks when production
//! needs the device), so it is made only if the host could hold it. An allocation that would
//! take the container's managed memory past the host memory available to the job is refused with `CUDA_ERROR_OUT_OF_MEMORY` and one
//! warning line (the first such refusal of the process; each is counted under the container's
//! refusals) — rather than made and later demoted into a host that cannot take it, where the
//! kernel's OOM killer would end the job (or a neighbour) at an arbitrary point.
//!
//! "Available" is the smaller of the kernel's `MemAvailable` (`/proc/meminfo`) and the room
//! under the job's memory cgroup limit (v2: `memory.max` of its cgroup and every parent, less
//! `memory.current`; v1: `memory.stat`'s `hierarchical_memory_limit` less `memory.usage_in_bytes`;
//! reclaimable inactive file pages count as room in both). What cannot be read counts as
//! unlimited: the check never refuses on a guess. What is checked is the container's whole
//! managed footprint (issue 30, B6a): every process's managed memory as its slot records it,
//! plus the new allocation, against that room plus what the container holds demoted already,
//! decided under the container's pin lock so two racing processes cannot both pass. Memory
//! the job takes on the host later is not reserved, and two containers are each checked against
//! the node's `MemAvailable`, not together (a memory cgroup limit per container bounds each).
//! Opportunistic, oversubscribing allocations only (a few small file reads there); production
//! never comes here.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::*};

/// The host memory available to this process now, bytes (None: nothing could be read).
pub fn available() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    let mem = meminfo
        .as_deref()
        .and_then(|m| field(m, "MemAvailable:").map(|kb| kb * 1024));
    let cg = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|c| cgroup_room(&c, Path::new("/sys/fs/cgroup")));
    match (mem, cg) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The first number after `key` in a `key value` text (meminfo, memory.stat).
fn field(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

fn read_u64(p: &Path) -> Option<u64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

/// Room under the memory cgroup limit of a process whose `/proc/self/cgroup` reads `cgroups`,
/// the hierarchies mounted under `root` (None: no limit found).
fn cgroup_room(cgroups: &str, root: &Path) -> Option<u64> {
    for line in cgroups.lines() {
        let mut f = line.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        let rel = path.trim_start_matches('/');
        if controllers.split(',').any(|c| c == "memory") {
            // v1: the cgroup's directory, else the mount's root (a container without its own
            // cgroup namespace sees the host's path but its own cgroup at the root).
            let dirs = [root.join("memory").join(rel), root.join("memory")];
            if let Some(d) = dirs
                .iter()
                .find(|d| d.join("memory.usage_in_bytes").exists())
            {
                let stat = std::fs::read_to_string(d.join("memory.stat")).ok()?;
                let limit = field(&stat, "hierarchical_memory_limit ")?;
                let usage = read_u64(&d.join("memory.usage_in_bytes"))?;
                let cache = field(&stat, "total_inactive_file ").unwrap_or(0);
                return Some(limit.saturating_sub(usage.saturating_sub(cache)));
            }
        } else if controllers.is_empty() {
            // v2 (alone, or the unified hierarchy of a hybrid layout).
            for base in [root.to_path_buf(), root.join("unified")] {
                let d = base.join(rel);
                if let Some(room) = v2_room(&base, &d) {
                    return Some(room);
                }
            }
        }
    }
    None
}

/// The smallest room under `memory.max` from `dir` up to `base` (v2).
fn v2_room(base: &Path, dir: &Path) -> Option<u64> {
    let mut room: Option<u64> = None;
    let mut d: PathBuf = dir.to_path_buf();
    while d.starts_with(base) {
        let max = std::fs::read_to_string(d.join("memory.max")).ok();
        if let (Some(max), Some(cur)) = (
            max.as_deref().and_then(|m| m.trim().parse::<u64>().ok()),
            read_u64(&d.join("memory.current")),
        ) {
            let stat = std::fs::read_to_string(d.join("memory.stat")).unwrap_or_default();
            let cache = field(&stat, "inactive_file ").unwrap_or(0);
            let r = max.saturating_sub(cur.saturating_sub(cache));
            room = Some(room.map_or(r, |x| x.min(r)));
        }
        if !d.pop() {
            break;
        }
    }
    room
}

/// Whether an oversubscribing allocation of `size` bytes on `dev` may be made: the container's
/// managed footprint (every process, as its state records it) with it must fit the host memory
/// available to the job, plus what the container already holds demoted there (its pages are in
/// that memory's use already). False (after the line, the first time): refused. Called under
/// the container's pin lock (`pin.rs`), which also records the allocation when it fits: two
/// processes of the container asking at once are decided one after the other.
pub fn fits(st: &libshare_abi::State, size: u64, dev: usize) -> bool {
    let Some(avail) = available() else {
        return true;
    };
    let demoted = (0..libshare_abi::MAX_DEVICES).fold(0u64, |a, d| {
        a.saturating_add(st.device(d).demoted.load(Acquire))
    });
    let footprint = st.managed_footprint();
    let room = avail.saturating_add(demoted);
    if footprint.saturating_add(size) <= room {
        return true;
    }
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, AcqRel) {
        eprintln!(
            "libshare: refused an oversubscribing allocation of {} on device {dev} \
             (CUDA_ERROR_OUT_OF_MEMORY): its container's managed memory ({} with it) may be \
             demoted to the host, which has {} for it; raise the job's memory limit or lower \
             its quota (sharectl set --memory)",
            libshare_abi::units::format_size(size),
            libshare_abi::units::format_size(footprint.saturating_add(size)),
            libshare_abi::units::format_size(room)
        );
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(p: &Path, text: &str) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn the_room_is_under_the_tightest_limit_with_inactive_file_pages_counted_free() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        // v1: the hierarchy's limit, usage less inactive file pages.
        let d = r.join("memory/kubepods/pod1");
        write(
            &d.join("memory.stat"),
            "cache 1\nhierarchical_memory_limit 1073741824\ntotal_inactive_file 104857600\n",
        );
        write(&d.join("memory.usage_in_bytes"), "943718400\n");
        assert_eq!(
            cgroup_room("4:memory:/kubepods/pod1\n", r),
            Some((1024 - 900 + 100) << 20)
        );
        // v2: the parent's max is tighter than the job's own.
        let p = r.join("v2/parent");
        write(&p.join("memory.max"), "536870912\n");
        write(&p.join("memory.current"), "268435456\n");
        write(&p.join("job/memory.max"), "max\n");
        write(&p.join("job/memory.current"), "1\n");
        assert_eq!(
            cgroup_room("0::/parent/job\n", &r.join("v2")),
            Some(256 << 20)
        );
        // Nothing readable: no limit (never a refusal on a guess).
        assert_eq!(cgroup_room("0::/nowhere\n", &r.join("v2x")), None);
        assert_eq!(cgroup_room("garbage", r), None);
        assert_eq!(
            field("MemAvailable:   20472668 kB\n", "MemAvailable:"),
            Some(20472668)
        );
    }
}
