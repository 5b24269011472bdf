//! Per-process counters, written as JSON to `SIMGPU_STATS_FILE` at exit (tests compare them
//! with what the shim counted).

use std::sync::atomic::Ordering::Acquire;

use crate::sim::Sim;

pub fn stats_json(s: &Sim) -> String {
    let slot = s.shared.slot(s.slot);
    let devs: Vec<String> = s
        .visible
        .iter()
        .map(|&d| {
            let p = &slot.dev[d];
            format!(
                "{{\"device\":{d},\"kernels\":{},\"allocs\":{},\"mem_used\":{},\"busy_ns\":{}}}",
                p.kernels.load(Acquire),
                p.allocs.load(Acquire),
                p.mem_used.load(Acquire),
                p.busy_ns.load(Acquire)
            )
        })
        .collect();
    format!(
        "{{\"pid\":{},\"launches\":{},\"alloc_calls\":{},\"api_allocs\":{},\"devices\":[{}]}}",
        s.pid,
        s.launch_count.load(Acquire),
        s.alloc_count.load(Acquire),
        s.api_allocs.load(Acquire),
        devs.join(",")
    )
}

/// Appends this process's counters as one JSON line to `SIMGPU_STATS_FILE`, if set.
pub fn write_stats_file(s: &Sim) {
    crate::log::append_line_to("SIMGPU_STATS_FILE", &stats_json(s));
}
