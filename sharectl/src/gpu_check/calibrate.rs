//! Calibrating simgpu (pure: no I/O): what `gpu_probe`'s calibration modes printed, on the GPU
//! and on simgpu beside it, turned into simgpu's cost-model keys.
//!
//! Each key is measured the same way on both sides, so the method's own bias cancels: a duration
//! becomes simgpu's assumption plus the difference of the two measurements, a rate simgpu's
//! assumption times their ratio. On simgpu standing in for the GPU (`--sim`) the calibration
//! therefore gives back the model it ran (what `tests/tests/gpu_check.rs` checks with a model
//! other than the default).

use super::report::CalibrationRow;
use serde_json::Value;

/// simgpu's default cost model (`simgpu/src/config/mod.rs`, `CostModel::default`), in the units
/// of the calibration table: µs and GB/s.
pub struct Assumed {
    pub kernel_base_us: f64,
    pub wave_us: f64,
    pub pcie_gbs: f64,
    pub hbm_gbs: f64,
    pub copy_base_us: f64,
    pub fault_us: f64,
    pub fault_gbs: f64,
    pub prefetch_gbs: f64,
    pub timeslice_us: f64,
    pub ctx_switch_us: f64,
}

pub const ASSUMED: Assumed = Assumed {
    kernel_base_us: 5.0,
    wave_us: 10.0,
    pcie_gbs: 25.0,
    hbm_gbs: 1500.0,
    copy_base_us: 2.0,
    fault_us: 20.0,
    fault_gbs: 12.0,
    prefetch_gbs: 25.0,
    timeslice_us: 2000.0,
    ctx_switch_us: 25.0,
};

const CHUNK_BYTES: f64 = 2.0 * 1024.0 * 1024.0;

/// One side's measurements, each None where its probe did not run or printed nothing usable.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Measured {
    /// Linear fit of an empty kernel's time against its waves (256-thread blocks): intercept
    /// and slope, µs.
    pub kernel_base_us: Option<f64>,
    pub wave_us: Option<f64>,
    /// An empty kernel of one block, and each of 1000 queued back to back, µs.
    pub empty_us: Option<f64>,
    pub back_to_back_us: Option<f64>,
    /// The jobs' spin kernel: measured minus asked, µs (median over the sizes asked).
    pub spin_overhead_us: Option<f64>,
    pub h2d_gbs: Option<f64>,
    pub d2h_gbs: Option<f64>,
    pub h2d_pageable_gbs: Option<f64>,
    pub d2h_pageable_gbs: Option<f64>,
    pub d2d_gbs: Option<f64>,
    pub memset_gbs: Option<f64>,
    /// A 4 KiB pinned copy, µs.
    pub copy_4k_us: Option<f64>,
    /// Faulting a large allocation in: per 2 MiB chunk, µs (the kernel's own time taken off).
    pub fault_chunk_us: Option<f64>,
    /// One 2 MiB chunk faulted in alone, µs.
    pub fault_one_us: Option<f64>,
    pub prefetch_gbs: Option<f64>,
    pub prefetch_to_host_gbs: Option<f64>,
    /// Two processes of back-to-back kernels: how long each holds the engine, and what a switch
    /// costs, µs.
    pub slice_us: Option<f64>,
    pub switch_us: Option<f64>,
}

/// Least-squares line through `points`: (intercept, slope).
pub fn fit_line(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let sxx: f64 = points.iter().map(|(x, _)| (x - mx) * (x - mx)).sum();
    if sxx == 0.0 {
        return None;
    }
    let sxy: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    let slope = sxy / sxx;
    Some((my - slope * mx, slope))
}

pub fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

fn lines<'a>(probe: &'a [Value], check: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    probe.iter().filter(move |v| v["check"] == check)
}

/// `gpu_probe kernels`' lines.
pub fn kernels(m: &mut Measured, probe: &[Value]) {
    let points: Vec<(f64, f64)> = lines(probe, "kernel_waves")
        .filter_map(|v| Some((v["waves"].as_f64()?, v["ms"].as_f64()? * 1e3)))
        .collect();
    if let Some((base, wave)) = fit_line(&points) {
        m.kernel_base_us = Some(base);
        m.wave_us = Some(wave);
    }
    let us = |check: &str, key: &str| {
        lines(probe, check)
            .find_map(|v| v[key].as_f64())
            .map(|ms| ms * 1e3)
    };
    m.empty_us = us("kernel_empty", "ms");
    m.back_to_back_us = us("kernel_back_to_back", "ms_each");
    m.spin_overhead_us = median(
        lines(probe, "kernel_spin")
            .filter_map(|v| Some((v["ms"].as_f64()? - v["asked_ms"].as_f64()?) * 1e3))
            .collect(),
    );
}

/// `gpu_probe copies`' lines.
pub fn copies(m: &mut Measured, probe: &[Value]) {
    for v in lines(probe, "copy") {
        let gbs = v["gb_per_s"].as_f64();
        match v["what"].as_str() {
            Some("h2d_pinned") => m.h2d_gbs = gbs,
            Some("d2h_pinned") => m.d2h_gbs = gbs,
            Some("h2d_pageable") => m.h2d_pageable_gbs = gbs,
            Some("d2h_pageable") => m.d2h_pageable_gbs = gbs,
            Some("d2d") => m.d2d_gbs = gbs,
            Some("memset") => m.memset_gbs = gbs,
            Some("h2d_4k") => m.copy_4k_us = v["ms"].as_f64().map(|ms| ms * 1e3),
            _ => {}
        }
    }
}

/// `gpu_probe managed MIB`'s line (nothing if unified memory is not available).
pub fn managed(m: &mut Measured, probe: &[Value]) {
    let Some(v) = lines(probe, "managed").find(|v| v["available"] == true) else {
        return;
    };
    let (Some(mib), Some(fault), Some(resident)) = (
        v["mib"].as_f64(),
        v["fault_ms"].as_f64(),
        v["resident_ms"].as_f64(),
    ) else {
        return;
    };
    let chunks = mib / 2.0;
    m.fault_chunk_us = Some((fault - resident) * 1e3 / chunks);
    m.fault_one_us = v["chunk_2mib_ms"].as_f64().map(|c| (c - resident) * 1e3);
    let bytes = mib * CHUNK_BYTES / 2.0;
    let gbs = |ms: Option<f64>| ms.filter(|ms| *ms > 0.0).map(|ms| bytes / (ms * 1e6));
    m.prefetch_gbs = gbs(v["prefetch_to_device_ms"].as_f64());
    m.prefetch_to_host_gbs = gbs(v["prefetch_to_host_ms"].as_f64());
}

/// One process's `gpu_probe slices` line: kernels of `kernel_us` back to back, and the gaps in
/// their completions (`[index of the completion after the gap, gap start, gap end]`, µs).
#[derive(Clone, Debug, PartialEq)]
pub struct SliceRun {
    pub kernel_us: f64,
    pub gaps: Vec<(u64, f64, f64)>,
}

impl SliceRun {
    pub fn parse(v: &Value) -> Option<SliceRun> {
        let gaps = v["gaps"]
            .as_array()?
            .iter()
            .map(|g| Some((g[0].as_u64()?, g[1].as_f64()?, g[2].as_f64()?)))
            .collect::<Option<Vec<_>>>()?;
        Some(SliceRun {
            kernel_us: v["kernel_us"].as_f64()?,
            gaps,
        })
    }

    /// (period, slice), µs: from one gap's end to the next is one period of the alternation;
    /// the kernels completed in it, times their length, the time this process held the engine
    /// in it. Averaged over blocks of `BLOCK` periods (one period's count is a whole number of
    /// kernels), then the median block (a period the host delayed — simgpu decides slices in
    /// real time — does not move it). None with fewer than two blocks (no alternation seen).
    pub fn period_and_slice(&self) -> Option<(f64, f64)> {
        const BLOCK: usize = 8;
        let w = &self.gaps;
        if w.len() < 2 * BLOCK + 1 {
            return None;
        }
        let blocks: Vec<(f64, f64)> = (0..(w.len() - 1) / BLOCK)
            .map(|b| {
                let (a, z) = (w[b * BLOCK], w[(b + 1) * BLOCK]);
                let n = BLOCK as f64;
                ((z.2 - a.2) / n, (z.0 - a.0) as f64 * self.kernel_us / n)
            })
            .collect();
        Some((
            median(blocks.iter().map(|b| b.0).collect())?,
            median(blocks.iter().map(|b| b.1).collect())?,
        ))
    }
}

/// Two processes that alternated: each holds the engine for its slice, and each period holds
/// both slices and two switches. Returns (slice, switch), µs.
pub fn slices(a: &SliceRun, b: &SliceRun) -> Option<(f64, f64)> {
    let (pa, sa) = a.period_and_slice()?;
    let (pb, sb) = b.period_and_slice()?;
    let period = (pa + pb) / 2.0;
    Some(((sa + sb) / 2.0, (period - sa - sb) / 2.0))
}

/// The calibration table: every key simgpu's model has that the probes measure.
pub fn table(gpu: &Measured, sim: &Measured) -> Vec<CalibrationRow> {
    let a = &ASSUMED;
    // A duration: the assumption moved by the GPU's difference from simgpu's measurement.
    let offset = |assumed: f64, g: Option<f64>, s: Option<f64>| match (g, s) {
        (Some(g), Some(s)) => Some((assumed + g - s).max(0.0)),
        _ => None,
    };
    // A rate or a per-unit cost: the assumption scaled by the ratio.
    let scale = |assumed: f64, g: Option<f64>, s: Option<f64>| match (g, s) {
        (Some(g), Some(s)) if g > 0.0 && s > 0.0 => Some(assumed * g / s),
        _ => None,
    };
    let mut rows = vec![
        row(
            "cost.kernel_base",
            "SIMGPU_KERNEL_BASE",
            "empty kernel: intercept of its time against its waves",
            "us",
            a.kernel_base_us,
            gpu.kernel_base_us,
            sim.kernel_base_us,
            offset(a.kernel_base_us, gpu.kernel_base_us, sim.kernel_base_us),
        ),
        row(
            "cost.wave",
            "SIMGPU_WAVE",
            "empty kernel: time per wave (8 blocks of 256 threads per SM)",
            "us",
            a.wave_us,
            gpu.wave_us,
            sim.wave_us,
            scale(a.wave_us, gpu.wave_us, sim.wave_us),
        ),
        row(
            "cost.pcie_bandwidth",
            "SIMGPU_PCIE_BW",
            "64 MiB pinned host-to-device copy (device-to-host beside it in the figures)",
            "GB/s",
            a.pcie_gbs,
            gpu.h2d_gbs,
            sim.h2d_gbs,
            scale(a.pcie_gbs, gpu.h2d_gbs, sim.h2d_gbs),
        ),
        row(
            "cost.hbm_bandwidth",
            "SIMGPU_HBM_BW",
            "256 MiB device-to-device copy (simgpu: reads and writes at half the bandwidth)",
            "GB/s",
            a.hbm_gbs,
            gpu.d2d_gbs,
            sim.d2d_gbs,
            scale(a.hbm_gbs, gpu.d2d_gbs, sim.d2d_gbs),
        ),
        row(
            "cost.copy_base",
            "(file only)",
            "4 KiB pinned copy",
            "us",
            a.copy_base_us,
            gpu.copy_4k_us,
            sim.copy_4k_us,
            offset(a.copy_base_us, gpu.copy_4k_us, sim.copy_4k_us),
        ),
        row(
            "cost.prefetch_bandwidth",
            "SIMGPU_PREFETCH_BW",
            "cuMemPrefetchAsync of 256 MiB managed memory to the device",
            "GB/s",
            a.prefetch_gbs,
            gpu.prefetch_gbs,
            sim.prefetch_gbs,
            scale(a.prefetch_gbs, gpu.prefetch_gbs, sim.prefetch_gbs),
        ),
    ];
    // Fault-driven migration: simgpu prices each 2 MiB chunk at fault + 2 MiB / fault_bandwidth,
    // which one measurement cannot split; the fault batch is kept and the bandwidth takes the rest
    // of the GPU's cost per chunk.
    let per_chunk = a.fault_us + CHUNK_BYTES / (a.fault_gbs * 1e3);
    let target = scale(per_chunk, gpu.fault_chunk_us, sim.fault_chunk_us);
    let fault_bw = target.map(|t| {
        let transfer = (t - a.fault_us).max(t / 2.0);
        CHUNK_BYTES / (transfer * 1e3)
    });
    let fault_us = target.map(|t| a.fault_us.min(t / 2.0));
    rows.push(row("cost.fault", "(file only)",
        "one 2 MiB chunk faulted in alone by the jobs' kernel (kept unless the GPU's cost per chunk is below twice it)",
        "us", a.fault_us, gpu.fault_one_us, sim.fault_one_us, fault_us));
    rows.push(row(
        "cost.fault_bandwidth",
        "SIMGPU_FAULT_BW",
        "256 MiB faulted in by the jobs' kernel: cost per 2 MiB chunk, less the fault batch",
        "GB/s",
        a.fault_gbs,
        gpu.fault_chunk_us.map(|c| CHUNK_BYTES / (c * 1e3)),
        sim.fault_chunk_us.map(|c| CHUNK_BYTES / (c * 1e3)),
        fault_bw,
    ));
    // Time slices: simgpu's slice includes the switch into it.
    let slice = |m: &Measured| Some(m.slice_us? + m.switch_us?);
    let switch = offset(a.ctx_switch_us, gpu.switch_us, sim.switch_us);
    let timeslice =
        offset(a.timeslice_us, slice(gpu), slice(sim)).map(|t| t.max(switch.unwrap_or(0.0) + 1.0));
    rows.push(row(
        "cost.timeslice",
        "SIMGPU_TIMESLICE",
        "two processes of 100 us kernels: how long one holds the engine, switch included",
        "us",
        a.timeslice_us,
        slice(gpu),
        slice(sim),
        timeslice,
    ));
    rows.push(row(
        "cost.ctx_switch",
        "SIMGPU_CTX_SWITCH",
        "the same: per period, what neither process's kernels used, per switch",
        "us",
        a.ctx_switch_us,
        gpu.switch_us,
        sim.switch_us,
        switch,
    ));
    rows
}

#[allow(clippy::too_many_arguments)]
fn row(
    key: &'static str,
    variable: &'static str,
    measure: &'static str,
    unit: &'static str,
    assumed: f64,
    gpu_measured: Option<f64>,
    simgpu_measured: Option<f64>,
    calibrated: Option<f64>,
) -> CalibrationRow {
    CalibrationRow {
        key,
        variable,
        measure,
        unit,
        assumed,
        simgpu_measured,
        gpu_measured,
        calibrated,
    }
}

/// The calibration file simgpu loads (`SIMGPU_CONFIG`): the GPU as the device, the calibrated
/// keys as its cost model (a key not calibrated is left out: simgpu keeps its default).
pub fn toml(platform: &Value, rows: &[CalibrationRow], header: &str) -> String {
    let mut s = String::new();
    for l in header.lines() {
        s.push_str(&format!("# {l}\n"));
    }
    if let Some(v) = platform["cuda_driver_version"]
        .as_i64()
        .filter(|v| *v >= 12000)
    {
        s.push_str(&format!("driver_version = {v}\n"));
    }
    s.push_str("\n[[device]]\n");
    if let Some(name) = platform["name"]
        .as_str()
        .filter(|n| !n.is_empty() && n.len() <= 255)
    {
        s.push_str(&format!("name = {}\n", serde_json::Value::from(name)));
    }
    if let Some(mem) = platform["memory_bytes"]
        .as_u64()
        .filter(|m| *m > 0 && *m <= 1 << 40)
    {
        s.push_str(&format!("memory = {mem}\n"));
    }
    if let Some(sms) = platform["sms"].as_u64().filter(|n| (1..=1024).contains(n)) {
        s.push_str(&format!("sms = {sms}\n"));
    }
    if let Some(cc) = platform["cc"].as_str() {
        s.push_str(&format!("compute_capability = \"{cc}\"\n"));
    }
    s.push_str("\n[cost]\n");
    for r in rows {
        let Some(v) = r.calibrated else { continue };
        let key = r.key.trim_start_matches("cost.");
        match r.unit {
            "us" => s.push_str(&format!("{key} = \"{}ns\"\n", (v * 1e3).round() as u64)),
            "GB/s" => s.push_str(&format!(
                "{key} = \"{}MB/s\"\n",
                ((v * 1e3).round() as u64).max(1)
            )),
            _ => {}
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_line_through_points() {
        let (b, m) = fit_line(&[(1.0, 7.0), (2.0, 9.0), (4.0, 13.0)]).unwrap();
        assert!((b - 5.0).abs() < 1e-9 && (m - 2.0).abs() < 1e-9);
        assert_eq!(fit_line(&[(1.0, 1.0)]), None);
        assert_eq!(fit_line(&[(1.0, 1.0), (1.0, 2.0)]), None);
    }

    /// A process that holds the engine for `slice` µs of 100 µs kernels, then waits `off`.
    fn alternating(slice: f64, off: f64, periods: usize) -> SliceRun {
        let per = (slice / 100.0) as u64;
        let mut gaps = Vec::new();
        let (mut t, mut i) = (0.0, 1u64);
        for _ in 0..periods {
            t += slice;
            i += per;
            gaps.push((i, t, t + off + 100.0));
            t += off;
        }
        SliceRun {
            kernel_us: 100.0,
            gaps,
        }
    }

    #[test]
    fn slices_and_switch_from_two_alternating_processes() {
        // Slices of 2000 µs, switches of 50 µs: each waits the other's slice and two switches.
        let a = alternating(2000.0, 2100.0, 50);
        let b = alternating(2000.0, 2100.0, 50);
        let (slice, switch) = slices(&a, &b).unwrap();
        assert!((slice - 2000.0).abs() < 1e-6, "{slice}");
        assert!((switch - 50.0).abs() < 1e-6, "{switch}");
        // Slices of 1975 µs (19 or 20 kernels of 100 µs each time) and one period the host
        // delayed by a whole slice: the blocks average the first, their median drops the second.
        let mut c = alternating(2000.0, 2100.0, 48);
        let mut shift = (0, 0.0);
        for (k, g) in c.gaps.iter_mut().enumerate() {
            if k % 4 == 0 {
                shift.0 += 1; // one kernel in four periods less: 19.75 kernels a period
            }
            if k == 20 {
                shift.1 += 2000.0;
            }
            g.0 -= shift.0;
            g.1 += shift.1;
            g.2 += shift.1;
        }
        let (period, slice) = c.period_and_slice().unwrap();
        assert!((period - 4100.0).abs() < 1e-6, "{period}");
        assert!((slice - 1975.0).abs() < 1e-6, "{slice}");
        // A process alone: no alternation, nothing to say.
        let alone = SliceRun {
            kernel_us: 100.0,
            gaps: vec![],
        };
        assert_eq!(slices(&alone, &b), None);
        let v = json!({"check": "slices", "kernel_us": 100, "gaps": [[21, 2000.0, 4100.5]]});
        assert_eq!(
            SliceRun::parse(&v).unwrap().gaps,
            vec![(21, 2000.0, 4100.5)]
        );
    }

    #[test]
    fn measurements_from_the_probe_lines() {
        let mut m = Measured::default();
        let k = [
            json!({"check": "kernel_waves", "waves": 1, "ms": 0.007}),
            json!({"check": "kernel_waves", "waves": 2, "ms": 0.009}),
            json!({"check": "kernel_waves", "waves": 4, "ms": 0.013}),
            json!({"check": "kernel_spin", "asked_ms": 0.05, "ms": 0.053}),
        ];
        kernels(&mut m, &k);
        assert!((m.kernel_base_us.unwrap() - 5.0).abs() < 1e-9);
        assert!((m.wave_us.unwrap() - 2.0).abs() < 1e-9);
        assert!((m.spin_overhead_us.unwrap() - 3.0).abs() < 1e-9);
        managed(
            &mut m,
            &[
                json!({"check": "managed", "available": true, "mib": 256, "fault_ms": 25.614,
                     "resident_ms": 0.014, "chunk_2mib_ms": 0.214,
                     "prefetch_to_device_ms": 10.737418, "prefetch_to_host_ms": 10.737418}),
            ],
        );
        assert!((m.fault_chunk_us.unwrap() - 200.0).abs() < 1e-6);
        assert!((m.fault_one_us.unwrap() - 200.0).abs() < 1e-6);
        assert!((m.prefetch_gbs.unwrap() - 25.0).abs() < 1e-3);
        // No unified memory: nothing measured.
        let mut n = Measured::default();
        managed(&mut n, &[json!({"check": "managed", "available": false})]);
        assert_eq!(n.fault_chunk_us, None);
    }

    #[test]
    fn calibration_moves_the_assumption_by_what_the_gpu_differs() {
        let sim = Measured {
            kernel_base_us: Some(8.0),
            wave_us: Some(10.0),
            h2d_gbs: Some(25.0),
            d2d_gbs: Some(750.0),
            copy_4k_us: Some(4.0),
            fault_chunk_us: Some(194.8),
            prefetch_gbs: Some(25.0),
            slice_us: Some(1975.0),
            switch_us: Some(37.0),
            ..Measured::default()
        };
        let gpu = Measured {
            kernel_base_us: Some(6.0),
            wave_us: Some(2.0),
            h2d_gbs: Some(50.0),
            d2d_gbs: Some(1500.0),
            copy_4k_us: Some(3.0),
            fault_chunk_us: Some(97.4),
            prefetch_gbs: Some(12.5),
            slice_us: Some(990.0),
            switch_us: Some(12.0),
            ..Measured::default()
        };
        let rows = table(&gpu, &sim);
        let get = |k: &str| {
            rows.iter()
                .find(|r| r.key == k)
                .unwrap()
                .calibrated
                .unwrap()
        };
        assert!((get("cost.kernel_base") - 3.0).abs() < 1e-9);
        assert!((get("cost.wave") - 2.0).abs() < 1e-9);
        assert!((get("cost.pcie_bandwidth") - 50.0).abs() < 1e-9);
        assert!((get("cost.hbm_bandwidth") - 3000.0).abs() < 1e-9);
        assert!((get("cost.copy_base") - 1.0).abs() < 1e-9);
        assert!((get("cost.prefetch_bandwidth") - 12.5).abs() < 1e-9);
        assert!((get("cost.ctx_switch") - 0.0).abs() < 1e-9, "25 + 12 - 37");
        assert!((get("cost.timeslice") - (2000.0 + 1002.0 - 2012.0)).abs() < 1e-9);
        // Half the cost per chunk: the fault batch kept, the bandwidth takes the rest.
        let per_chunk = 20.0 + CHUNK_BYTES / 12e3;
        let t = per_chunk * 97.4 / 194.8;
        assert!((get("cost.fault") - 20.0).abs() < 1e-9);
        assert!((get("cost.fault_bandwidth") - CHUNK_BYTES / ((t - 20.0) * 1e3)).abs() < 1e-6);
        // Measured on one side only: kept.
        let none = table(&Measured::default(), &sim);
        assert!(none.iter().all(|r| r.calibrated.is_none()));
        // simgpu against itself: the assumptions back.
        let same = table(&sim, &sim);
        for r in same.iter().filter(|r| r.key != "cost.fault") {
            if let Some(v) = r.calibrated {
                assert!(
                    (v - r.assumed).abs() < 1e-6 * r.assumed.max(1.0),
                    "{}: {v}",
                    r.key
                );
            }
        }
    }

    #[test]
    fn the_file_has_the_device_and_the_calibrated_keys_only() {
        let p = json!({"name": "NVIDIA H100 80GB HBM3", "memory_bytes": 85520809984u64,
                       "sms": 132, "cc": "9.0", "cuda_driver_version": 13000});
        let mut rows = table(&Measured::default(), &Measured::default());
        rows[0].calibrated = Some(3.25);
        rows[2].calibrated = Some(52.1);
        let t = toml(&p, &rows, "calibrated\nagainst an H100");
        assert!(t.starts_with("# calibrated\n# against an H100\ndriver_version = 13000\n"));
        assert!(t.contains("name = \"NVIDIA H100 80GB HBM3\"\nmemory = 85520809984\nsms = 132\ncompute_capability = \"9.0\"\n"));
        assert!(t.contains("[cost]\nkernel_base = \"3250ns\"\npcie_bandwidth = \"52100MB/s\"\n"));
        assert!(!t.contains("wave ="));
    }
}
