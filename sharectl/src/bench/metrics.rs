//! The figures, computed from what the jobs printed (no I/O here). Times are seconds on one axis,
//! GPU time in milliseconds.

/// The value at `t` of a cumulative counter sampled at `points` (sorted by time), interpolated
/// linearly; held constant before the first and after the last sample.
pub fn interp(points: &[(f64, f64)], t: f64) -> f64 {
    match points.iter().position(|&(pt, _)| pt >= t) {
        None => points.last().map_or(0.0, |p| p.1),
        Some(0) => points[0].1,
        Some(i) => {
            let (t0, v0) = points[i - 1];
            let (t1, v1) = points[i];
            if t1 <= t0 {
                v1
            } else {
                v0 + (v1 - v0) * (t - t0) / (t1 - t0)
            }
        }
    }
}

/// How much a cumulative counter grew between `a` and `b`.
pub fn growth(points: &[(f64, f64)], a: f64, b: f64) -> f64 {
    (interp(points, b) - interp(points, a)).max(0.0)
}

/// Number of spans (start, end) that ended within [a, b].
pub fn ended_within(spans: &[(f64, f64)], a: f64, b: f64) -> usize {
    spans.iter().filter(|s| s.1 >= a && s.1 <= b).count()
}

/// The nearest-rank `p`-th percentile (as the jobs compute theirs); None without samples.
pub fn percentile(v: &[f64], p: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
    Some(s[rank.clamp(1, s.len()) - 1])
}

pub fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// Opportunistic GPU time ÷ the GPU time production left idle, over a window of `window_ms`
/// in which production used `production_gpu_ms`. None when production left nothing idle.
pub fn harvest(opportunistic_gpu_ms: f64, window_ms: f64, production_gpu_ms: f64) -> Option<f64> {
    let idle = window_ms - production_gpu_ms;
    (idle > 0.0).then(|| opportunistic_gpu_ms / idle)
}

/// Reaction after production returns: `iters` are (start, end) of the iterations of one busy
/// phase, in order. The reaction is the time from the first iteration's start to the start of
/// the first run of `k` consecutive iterations whose mean duration is within `tol` (e.g. 0.03)
/// of `solo_iter` (the solo mean). None if production never got back within it in the phase.
pub fn reaction(iters: &[(f64, f64)], solo_iter: f64, k: usize, tol: f64) -> Option<f64> {
    let first = iters.first()?.0;
    let durs: Vec<f64> = iters.iter().map(|(s, e)| e - s).collect();
    (0..durs.len().saturating_sub(k - 1))
        .find(|&i| durs[i..i + k].iter().sum::<f64>() / k as f64 <= solo_iter * (1.0 + tol))
        .map(|i| iters[i].0 - first)
}

/// GPU share (percent of wall time) of a cumulative GPU-ms counter over consecutive windows of
/// `window` seconds from `a` to `b` (a last partial window is dropped).
pub fn share_windows(gpu_ms: &[(f64, f64)], a: f64, b: f64, window: f64) -> Vec<f64> {
    let mut v = Vec::new();
    let mut t = a;
    while t + window <= b + 1e-9 {
        v.push(growth(gpu_ms, t, t + window) / (window * 1e3) * 100.0);
        t += window;
    }
    v
}

/// Mean absolute error of `values` against `target`.
pub fn mean_abs_error(values: &[f64], target: f64) -> Option<f64> {
    mean(
        &values
            .iter()
            .map(|v| (v - target).abs())
            .collect::<Vec<_>>(),
    )
}

/// GPU share per bin of `bin` seconds over [0, end) of work spread evenly over spans
/// (start, end, gpu_ms): percent of each bin's wall time.
pub fn spans_timeline(spans: &[(f64, f64, f64)], end: f64, bin: f64) -> Vec<(f64, f64)> {
    let n = (end / bin).ceil().max(0.0) as usize;
    let mut acc = vec![0.0; n];
    for &(s, e, ms) in spans {
        let len = (e - s).max(1e-9);
        let (first, last) = ((s / bin).floor() as isize, (e / bin).floor() as isize);
        for b in first.max(0)..=last.min(n as isize - 1) {
            let (b0, b1) = (b as f64 * bin, (b + 1) as f64 * bin);
            let overlap = (e.min(b1) - s.max(b0)).max(0.0);
            acc[b as usize] += ms * overlap / len;
        }
    }
    acc.into_iter()
        .enumerate()
        .map(|(i, ms)| ((i as f64 + 0.5) * bin, ms / (bin * 1e3) * 100.0))
        .collect()
}

/// GPU share per bin of a cumulative GPU-ms counter over [0, end).
pub fn counter_timeline(gpu_ms: &[(f64, f64)], end: f64, bin: f64) -> Vec<(f64, f64)> {
    let n = (end / bin).ceil().max(0.0) as usize;
    let first = gpu_ms.first().map_or(0.0, |p| p.0);
    let last = gpu_ms.last().map_or(0.0, |p| p.0);
    (0..n)
        .map(|i| (i as f64 * bin, (i + 1) as f64 * bin))
        .filter(|&(a, b)| b > first && a < last)
        .map(|(a, b)| ((a + b) / 2.0, growth(gpu_ms, a, b) / (bin * 1e3) * 100.0))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpolation() {
        let p = [(1.0, 0.0), (2.0, 10.0), (4.0, 30.0)];
        assert_eq!(interp(&p, 0.0), 0.0);
        assert_eq!(interp(&p, 1.5), 5.0);
        assert_eq!(interp(&p, 3.0), 20.0);
        assert_eq!(interp(&p, 9.0), 30.0);
        assert_eq!(growth(&p, 1.5, 3.0), 15.0);
        assert_eq!(interp(&[], 1.0), 0.0);
    }

    #[test]
    fn percentiles_and_harvest() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&[], 50.0), None);
        // 1 s window, production used 600 ms, the other job 320 of the 400 left.
        assert_eq!(harvest(320.0, 1000.0, 600.0), Some(0.8));
        assert_eq!(harvest(1.0, 100.0, 100.0), None);
        assert_eq!(
            ended_within(&[(0.0, 1.0), (1.0, 2.0), (2.0, 3.5)], 1.0, 3.0),
            2
        );
    }

    #[test]
    fn reaction_time() {
        // Solo iterations take 10 ms; after the return three slow ones, then back to 10 ms.
        let mut it = Vec::new();
        let mut t = 5.0;
        for d in [0.030, 0.020, 0.015, 0.010, 0.010, 0.010, 0.010] {
            it.push((t, t + d));
            t += d;
        }
        let r = reaction(&it, 0.010, 3, 0.03).unwrap();
        assert!((r - 0.065).abs() < 1e-9, "{r}");
        // Back at once.
        assert_eq!(reaction(&it[3..], 0.010, 3, 0.03), Some(0.0));
        // Never back.
        assert_eq!(reaction(&it[..3], 0.010, 3, 0.03), None);
    }

    #[test]
    fn shares() {
        // 300 GPU-ms per second for 3 s.
        let p: Vec<(f64, f64)> = (0..=30)
            .map(|i| (i as f64 * 0.1, i as f64 * 30.0))
            .collect();
        let w = share_windows(&p, 0.0, 3.0, 1.0);
        assert_eq!(w.len(), 3);
        assert!(w.iter().all(|s| (s - 30.0).abs() < 1e-6), "{w:?}");
        assert!((mean_abs_error(&[27.0, 33.0, 30.0], 30.0).unwrap() - 2.0).abs() < 1e-9);
        // A 50 ms span of 6 ms GPU across two 100 ms bins.
        let tl = spans_timeline(&[(0.075, 0.125, 6.0)], 0.2, 0.1);
        assert!(
            (tl[0].1 - 3.0).abs() < 1e-9 && (tl[1].1 - 3.0).abs() < 1e-9,
            "{tl:?}"
        );
        let ct = counter_timeline(&p, 1.0, 0.5);
        assert!(ct.iter().all(|&(_, s)| (s - 30.0).abs() < 1e-6), "{ct:?}");
    }
}
